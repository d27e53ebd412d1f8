//! The `[[qp]]` tables: each queue pair (with its peer), its policy, and its CQs: a declared
//! one it names, or one of its own.

use selsig::{Access, Policy, PolicyError};

use crate::error::ScenarioError;
use crate::format::QpDecl;
use crate::model::{Cq, Qp};

use super::checker::{Checker, MAX_QPS, MAX_SGE, Span};

impl Checker<'_> {
    /// The QPs, in the file's order; `cqs` (the declared ones) gains the QPs' own CQs.
    pub fn qps(&self, cqs: &mut Vec<Cq>) -> Result<Vec<Qp>, ScenarioError> {
        let raw = self.raw;
        if raw.qp.is_empty() {
            return Err(self.err(None, "a scenario needs at least one [[qp]]".into()));
        }
        if raw.qp.len() > MAX_QPS {
            return Err(self.err(
                Some(raw.qp[MAX_QPS].span()),
                format!(
                    "{} queue pairs: a scenario creates at most {MAX_QPS}",
                    raw.qp.len()
                ),
            ));
        }
        let mut qps: Vec<Qp> = Vec::new();
        for q in &raw.qp {
            let span = Some(q.span());
            let q = q.get_ref();
            let qp = self.qp(q, span, &qps, cqs)?;
            qps.push(qp);
        }
        Ok(qps)
    }

    /// One QP; `qps` are those before it.
    fn qp(
        &self,
        q: &QpDecl,
        span: Span,
        qps: &[Qp],
        cqs: &mut Vec<Cq>,
    ) -> Result<Qp, ScenarioError> {
        self.name_ok(&q.name, span.clone(), "qp")?;
        if qps.iter().any(|x| x.name == q.name) {
            return Err(self.err(span, format!("a second qp named {:?}", q.name)));
        }
        if q.depth == 0 || q.depth > 32768 {
            return Err(self.err(
                span,
                format!(
                    "qp {:?}: depth {} is out of range 1..=32768",
                    q.name, q.depth
                ),
            ));
        }
        if q.peer_depth == 0 || q.peer_depth > 32768 {
            return Err(self.err(
                span,
                format!(
                    "qp {:?}: peer_depth {} is out of range 1..=32768",
                    q.name, q.peer_depth
                ),
            ));
        }
        if let Some(n) = q.max_send_sge.filter(|n| !(1..=MAX_SGE).contains(n)) {
            return Err(self.err(
                span,
                format!(
                    "qp {:?}: max_send_sge {n} is out of range 1..={MAX_SGE}",
                    q.name
                ),
            ));
        }
        for (field, value) in [("rnr_retry", q.rnr_retry), ("retry_cnt", q.retry_cnt)] {
            if value > 7 {
                return Err(self.err(
                    span,
                    format!("qp {:?}: {field} {value} is out of range 0..=7", q.name),
                ));
            }
        }
        let policy = self.policy(q, &span)?;
        let send_cq = self.cq_for(
            cqs,
            q,
            &span,
            &q.send_cq,
            format!("{}.cq", q.name),
            2 * q.depth + 2,
        )?;
        let peer_cq = self.cq_for(
            cqs,
            q,
            &span,
            &q.peer_cq,
            format!("{}.peer.cq", q.name),
            2 * q.peer_depth + 2,
        )?;
        cqs[send_cq].senders += 1;
        let peer_access = self.access(
            &q.peer_access,
            span.clone(),
            &format!("qp {:?}: peer_access", q.name),
        )?;
        // A QP's access flags are remote ones: the NIC always writes a receive's bytes.
        if peer_access.contains(Access::LOCAL_WRITE) {
            return Err(self.err(
                span,
                format!(
                    "qp {:?}: peer_access: local_write is a region's flag, not a queue \
                     pair's (its receives are written whatever the QP allows)",
                    q.name
                ),
            ));
        }
        Ok(Qp {
            name: q.name.clone(),
            depth: q.depth,
            sq_sig_all: q.sq_sig_all,
            policy,
            send_cq,
            peer_cq,
            peer_access,
            rnr_retry: q.rnr_retry,
            retry_cnt: q.retry_cnt,
            peer_depth: q.peer_depth,
            max_send_sge: q.max_send_sge,
        })
    }

    /// The QP's signaling policy: the library's names, and `manual`; not an adaptive one.
    fn policy(&self, q: &QpDecl, span: &Span) -> Result<Policy, ScenarioError> {
        // As the other policies' names: spaces around and case aside.
        let manual = q.policy.trim().eq_ignore_ascii_case("manual");
        let policy = if manual {
            Policy::Never
        } else {
            q.policy.parse().map_err(|e| {
                // The forms a scenario takes: not the adaptive policy, and manual too.
                let e = match e {
                    PolicyError::Unknown(text) => format!(
                        "unknown policy {text:?}: expected every:N, always, never or manual"
                    ),
                    e => e.to_string(),
                };
                self.err(span.clone(), format!("qp {:?}: {e}", q.name))
            })?
        };
        if matches!(policy, Policy::Adaptive { .. }) {
            return Err(self.err(
                span.clone(),
                format!(
                    "qp {:?}: policy {:?}: an adaptive policy signals by the time work \
                     requests wait, which a trace must not depend on: use every:N, always, \
                     never or manual",
                    q.name, q.policy
                ),
            ));
        }
        Ok(policy)
    }

    /// The CQ a side of QP `q` reports to: the declared CQ it names, or (`named` is `None`)
    /// a new one of its own, called `own`, of `size` entries.
    fn cq_for(
        &self,
        cqs: &mut Vec<Cq>,
        q: &QpDecl,
        span: &Span,
        named: &Option<String>,
        own: String,
        size: u32,
    ) -> Result<usize, ScenarioError> {
        // A QP names a declared CQ (they come first); a QP's own is its alone.
        let declared = self.raw.cq.len();
        match named {
            Some(n) => cqs[..declared]
                .iter()
                .position(|c| &c.name == n)
                .ok_or_else(|| {
                    let own = match n.ends_with(".cq") {
                        true => " (a QP's own CQ is not shared: declare a [[cq]] to share one)",
                        false => "",
                    };
                    self.err(
                        span.clone(),
                        format!("qp {:?}: no [[cq]] named {n:?}{own}", q.name),
                    )
                }),
            None => {
                cqs.push(Cq {
                    name: own,
                    size,
                    senders: 0,
                });
                Ok(cqs.len() - 1)
            }
        }
    }
}
