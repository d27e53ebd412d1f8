//! `[differs]`, `[expect]` and `[expect.rxe]`: why a provider differs, and what a run must
//! show, each entry checked against the QPs and regions it names.

use std::collections::{BTreeMap, HashSet};

use selsig::{WcOpcode, WcStatus};
use toml::Spanned;

use crate::error::ScenarioError;
use crate::format::ExpectDecl;
use crate::model::{Expect, Qp, Region, parse_outcome_range};

use super::checker::Checker;

impl Checker<'_> {
    /// `[differs]`: why a provider differs, by provider (rxe only, with `[expect.rxe]`).
    pub fn differs(&self) -> Result<BTreeMap<String, String>, ScenarioError> {
        let raw = self.raw;
        let differs_span = raw.differs.as_ref().map(Spanned::span);
        let differs_decl = raw.differs.as_ref().map(Spanned::get_ref);
        if differs_decl.is_some_and(BTreeMap::is_empty) {
            return Err(self.err(
                differs_span,
                "[differs] is empty: give differs.rxe, why rxe differs, with [expect.rxe]".into(),
            ));
        }
        let mut differs = BTreeMap::new();
        for (key, why) in differs_decl.into_iter().flatten() {
            let span = Some(why.span());
            if key != "rxe" {
                return Err(self.err(
                    span,
                    format!("differs.{key}: the only provider that may differ is rxe"),
                ));
            }
            if why.get_ref().trim().is_empty() {
                return Err(self.err(
                    span,
                    format!("differs.{key} is empty: it must say why {key} differs"),
                ));
            }
            differs.insert(key.clone(), why.get_ref().clone());
        }
        let has_expect_rxe = raw
            .expect
            .as_ref()
            .is_some_and(|e| e.get_ref().rxe.is_some());
        if differs.contains_key("rxe") && !has_expect_rxe {
            return Err(self.err(
                differs_span,
                "differs.rxe says why [expect.rxe] differs, but there is no [expect.rxe]".into(),
            ));
        }
        Ok(differs)
    }

    /// `[expect]`, and `[expect.rxe]` (its fields replacing `[expect]`'s) where `differs`
    /// says why; `deregistered` is the step that deregistered each region, if one did.
    pub fn expect(
        &self,
        qps: &[Qp],
        regions: &[Region],
        deregistered: &[Option<usize>],
        differs: &BTreeMap<String, String>,
    ) -> Result<(Expect, Option<Expect>), ScenarioError> {
        let raw = self.raw;
        let mut expect = Expect::default();
        let mut expect_rxe = None;
        if let Some(e) = &raw.expect {
            let e = e.get_ref();
            self.expectations(e, qps, regions, deregistered, "expect")?;
            if let Some(r) = &e.rxe {
                let span = Some(r.span());
                let r = r.get_ref();
                if let Some(inner) = &r.rxe {
                    return Err(
                        self.err(Some(inner.span()), "expect.rxe.rxe: one level only".into())
                    );
                }
                if !differs.contains_key("rxe") {
                    return Err(self.err(
                        span,
                        "[expect.rxe] needs differs.rxe to say why rxe differs".into(),
                    ));
                }
                self.expectations(r, qps, regions, deregistered, "expect.rxe")?;
                // The fields `[expect.rxe]` gives replace `[expect]`'s.
                let (r, e) = (r.plain(), e.plain());
                expect_rxe = Some(Expect {
                    cqes: r.cqes.or(e.cqes),
                    outcomes: r.outcomes.or(e.outcomes),
                    digests: r.digests.or(e.digests),
                    events: r.events.or(e.events),
                });
            }
            expect = e.plain();
        }
        Ok((expect, expect_rxe))
    }

    fn expectations(
        &self,
        e: &ExpectDecl,
        qps: &[Qp],
        regions: &[Region],
        // The step that deregistered each region, if one did.
        deregistered: &[Option<usize>],
        what: &str,
    ) -> Result<(), ScenarioError> {
        let names: HashSet<String> = qps
            .iter()
            .flat_map(|q| [q.name.clone(), format!("{}.peer", q.name)])
            .collect();
        self.expect_cqes(e, &names, what)?;
        self.expect_outcomes(e, qps, what)?;
        self.expect_digests(e, regions, deregistered, what)?;
        self.expect_events(e, &names, what)
    }

    /// `cqes`: each completion's endpoint, status, opcode, and the fields it may have.
    fn expect_cqes(
        &self,
        e: &ExpectDecl,
        names: &HashSet<String>,
        what: &str,
    ) -> Result<(), ScenarioError> {
        for c in e.cqes.iter().flatten() {
            let span = Some(c.span());
            let c = c.get_ref();
            if !names.contains(&c.qp) {
                return Err(self.err(span, format!("{what}.cqes: no qp named {:?}", c.qp)));
            }
            if !WcStatus::ALL.iter().any(|s| s.short_name() == c.status) {
                return Err(self.err(
                    span.clone(),
                    format!("{what}.cqes: unknown status {:?}", c.status),
                ));
            }
            if let Some(o) = &c.opcode
                && !WcOpcode::ALL.iter().any(|x| x.short_name() == o)
            {
                let known: Vec<&str> = WcOpcode::ALL.iter().map(|x| x.short_name()).collect();
                return Err(self.err(
                    span.clone(),
                    format!(
                        "{what}.cqes: unknown opcode {o:?}: expected one of {}",
                        known.join(", ")
                    ),
                ));
            }
            // What the trace shows of a completion: an opcode only in a success (elsewhere
            // it is undefined), a byte_len only where it is defined.
            let this = || {
                let opcode = c
                    .opcode
                    .as_deref()
                    .map(|o| format!(" {o}"))
                    .unwrap_or_default();
                format!("a wr_id {} {}{opcode} completion", c.wr_id, c.status)
            };
            if c.opcode.is_some() && c.status != "success" {
                return Err(self.err(
                    span.clone(),
                    format!(
                        "{what}.cqes: opcode of {}: a completion that is not a success has no \
                         opcode (ibv_poll_cq(3)), and the trace shows none",
                        this()
                    ),
                ));
            }
            let measured = [
                WcOpcode::Recv,
                WcOpcode::RecvRdmaWithImm,
                WcOpcode::RdmaRead,
            ]
            .map(|o| o.short_name());
            let defined =
                c.status == "success" && c.opcode.as_deref().is_some_and(|o| measured.contains(&o));
            if c.byte_len.is_some() && !defined {
                return Err(self.err(
                    span.clone(),
                    format!(
                        "{what}.cqes: byte_len of {}: byte_len is defined only in successful \
                         completions of receives and READs (give status = \"success\" and \
                         opcode = \"recv\", \"recv_rdma_with_imm\" or \"rdma_read\")",
                        this()
                    ),
                ));
            }
            // (An opcode comes only with a success: checked above.)
            let receive = ["recv", "recv_rdma_with_imm"];
            let carries_imm = c.opcode.as_deref().is_some_and(|o| receive.contains(&o));
            if c.imm.is_some() && !carries_imm {
                return Err(self.err(
                    span.clone(),
                    format!(
                        "{what}.cqes: imm of {}: immediate data comes only in successful \
                         completions of receives (give status = \"success\" and opcode = \
                         \"recv\" or \"recv_rdma_with_imm\")",
                        this()
                    ),
                ));
            }
        }
        Ok(())
    }

    /// `outcomes`: ranges of sequence numbers of a QP, one outcome each.
    fn expect_outcomes(&self, e: &ExpectDecl, qps: &[Qp], what: &str) -> Result<(), ScenarioError> {
        for (q, list) in e.outcomes.iter().flatten() {
            if !qps.iter().any(|x| &x.name == q) {
                return Err(self.err(
                    Some(list.span()),
                    format!("{what}.outcomes: no qp named {q:?}"),
                ));
            }
            let mut ranges = Vec::new();
            for item in list.get_ref() {
                let span = item.span();
                let item = item.get_ref();
                let (first, last, ..) = parse_outcome_range(item).map_err(|m| {
                    self.err(Some(span.clone()), format!("{what}.outcomes.{q}: {m}"))
                })?;
                ranges.push((first, last, item, span));
            }
            // Each work request has one outcome: ranges must not overlap. Of two that do,
            // the later in the file is at fault.
            ranges.sort_by(|x, y| (x.0, x.1, x.2).cmp(&(y.0, y.1, y.2)));
            for pair in ranges.windows(2) {
                let ((_, last, a, a_at), (first, _, b, b_at)) = (&pair[0], &pair[1]);
                if first <= last {
                    let later = if a_at.start > b_at.start { a_at } else { b_at };
                    return Err(self.err(
                        Some(later.clone()),
                        format!(
                            "{what}.outcomes.{q}: {a:?} and {b:?} overlap (work request {first} \
                             is in both)"
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// `digests`: of regions left registered at the end, 16 hex digits each.
    fn expect_digests(
        &self,
        e: &ExpectDecl,
        regions: &[Region],
        deregistered: &[Option<usize>],
        what: &str,
    ) -> Result<(), ScenarioError> {
        for (r, d) in e.digests.iter().flatten() {
            let span = Some(d.span());
            let d = d.get_ref();
            let Some(i) = regions.iter().position(|x| &x.name == r) else {
                return Err(self.err(
                    span.clone(),
                    format!("{what}.digests: no region named {r:?}"),
                ));
            };
            if let Some(k) = deregistered[i] {
                return Err(self.err(
                    span.clone(),
                    format!(
                        "{what}.digests.{r}: step {k} deregisters the region, so nothing is left \
                         to read at the end"
                    ),
                ));
            }
            if d.len() != 16 || !d.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(self.err(
                    span.clone(),
                    format!("{what}.digests.{r}: {d:?} is not 16 hex digits"),
                ));
            }
        }
        Ok(())
    }

    /// `events`: asynchronous event types, with the endpoint where they name one.
    fn expect_events(
        &self,
        e: &ExpectDecl,
        names: &HashSet<String>,
        what: &str,
    ) -> Result<(), ScenarioError> {
        for event in e.events.iter().flatten() {
            let span = Some(event.span());
            let event = event.get_ref();
            let (kind, qp) = match event.split_once(':') {
                Some((k, q)) => (k, Some(q)),
                None => (event.as_str(), None),
            };
            let needs_qp = match kind {
                "qp_fatal" | "qp_access_err" | "qp_req_err" => true,
                "cq_err" | "port_active" | "port_err" | "device_fatal" | "other" => false,
                _ => {
                    return Err(self.err(
                        span.clone(),
                        format!(
                            "{what}.events: {event:?}: unknown event type {kind:?}: expected \
                             qp_fatal, qp_access_err or qp_req_err (as \"type:qp\"), cq_err, \
                             port_active, port_err, device_fatal or other"
                        ),
                    ));
                }
            };
            match qp {
                Some(q) if !needs_qp => {
                    return Err(self.err(
                        span.clone(),
                        format!("{what}.events: {event:?}: {kind} names no qp (drop \":{q}\")"),
                    ));
                }
                Some(q) if !names.contains(q) => {
                    return Err(self.err(
                        span.clone(),
                        format!("{what}.events: {event:?}: no qp named {q:?}"),
                    ));
                }
                None if needs_qp => {
                    return Err(self.err(
                        span.clone(),
                        format!("{what}.events: {event:?}: name the qp, as \"{kind}:a\""),
                    ));
                }
                _ => {}
            }
        }
        Ok(())
    }
}
