//! The `[[cq]]` tables: each declared CQ, and, once the QPs say which report to it, whether
//! it holds their completions.

use crate::error::ScenarioError;
use crate::model::{Cq, Qp};

use super::checker::Checker;

impl Checker<'_> {
    /// The declared CQs, in the file's order (the QPs' own come after them).
    pub fn declared_cqs(&self) -> Result<Vec<Cq>, ScenarioError> {
        let raw = self.raw;
        // CQs: declared ones, then one per QP side that names none.
        let mut cqs: Vec<Cq> = Vec::new();
        for c in &raw.cq {
            let span = Some(c.span());
            let c = c.get_ref();
            self.name_ok(&c.name, span.clone(), "cq")?;
            if cqs.iter().any(|x| x.name == c.name) {
                return Err(self.err(span, format!("a second cq named {:?}", c.name)));
            }
            if c.size == 0 || c.size > 1 << 20 {
                return Err(self.err(
                    span,
                    format!(
                        "cq {:?}: size {} is out of range 1..=1048576",
                        c.name, c.size
                    ),
                ));
            }
            cqs.push(Cq {
                name: c.name.clone(),
                size: c.size,
                senders: 0,
            });
        }
        Ok(cqs)
    }

    /// Whether each declared CQ holds the completions of the QPs that report to it, and has
    /// one at least.
    pub fn cqs_used(&self, cqs: &[Cq], qps: &[Qp]) -> Result<(), ScenarioError> {
        let raw = self.raw;
        // Every receive completes (if only flushed): a CQ holds those of the peers that
        // report to it, and room for a send completion when a send queue reports to it too.
        // (The providers may round sizes up; the run checks what they made.)
        for (i, c) in raw.cq.iter().enumerate() {
            let receives: u64 = qps
                .iter()
                .filter(|q| q.peer_cq == i)
                .map(|q| u64::from(q.peer_depth))
                .sum();
            let needed = receives + u64::from(cqs[i].senders > 0);
            if u64::from(cqs[i].size) < needed {
                return Err(self.err(
                    Some(c.span()),
                    format!(
                        "cq {:?}: size {} holds less than the {receives} receive slots \
                         (peer_depth) of the peers that report to it{}",
                        cqs[i].name,
                        cqs[i].size,
                        if cqs[i].senders > 0 {
                            " and a send completion"
                        } else {
                            ""
                        }
                    ),
                ));
            }
        }
        // A declared CQ no QP names would only be created.
        for (i, c) in raw.cq.iter().enumerate() {
            if cqs[i].senders == 0 && !qps.iter().any(|q| q.peer_cq == i) {
                return Err(self.err(
                    Some(c.span()),
                    format!(
                        "cq {:?}: no QP reports to it (name it in a QP's send_cq or peer_cq)",
                        cqs[i].name
                    ),
                ));
            }
        }
        Ok(())
    }
}
