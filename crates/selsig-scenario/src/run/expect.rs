//! The expectations of a scenario, checked against the trace of its run.

use std::collections::BTreeMap;

use crate::model::{Expect, ExpectCqe, parse_outcome_range};
use crate::trace::Event;

/// A completion as the trace shows it (and as an expectation gives it).
struct SeenCqe<'t> {
    qp: &'t str,
    wr_id: u64,
    status: &'t str,
    opcode: Option<&'t str>,
    byte_len: Option<u32>,
    imm: Option<u32>,
}

impl std::fmt::Display for SeenCqe<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} wr_id {} {}", self.qp, self.wr_id, self.status)?;
        if let Some(o) = self.opcode {
            write!(f, " {o}")?;
        }
        if let Some(b) = self.byte_len {
            write!(f, " byte_len {b}")?;
        }
        if let Some(m) = self.imm {
            write!(f, " imm {m}")?;
        }
        Ok(())
    }
}

/// Checks the expectations against the trace: returns those that did not hold, and what
/// was checked.
pub(super) fn check(e: &Expect, trace: &[Event]) -> (Vec<String>, Vec<String>) {
    let mut failures = Vec::new();
    let mut checked = Vec::new();
    if let Some(expected) = &e.cqes {
        check_cqes(expected, trace, &mut failures, &mut checked);
    }
    for (qp, items) in e.outcomes.iter().flatten() {
        check_outcomes(qp, items, trace, &mut failures, &mut checked);
    }
    for (region, digest) in e.digests.iter().flatten() {
        checked.push(format!("digest of {region}"));
        let got = trace.iter().find_map(|ev| match ev {
            Event::Digest { region: r, fnv1a64 } if r == region => Some(fnv1a64.clone()),
            _ => None,
        });
        if got.as_deref() != Some(digest.to_ascii_lowercase().as_str()) {
            failures.push(format!(
                "digest of {region}: expected {digest}, got {}",
                got.unwrap_or_else(|| "none (deregistered)".into())
            ));
        }
    }
    if let Some(expected) = &e.events {
        check_events(expected, trace, &mut failures, &mut checked);
    }
    (failures, checked)
}

/// `expect.cqes`: every completion of the run, in trace order.
fn check_cqes(
    expected: &[ExpectCqe],
    trace: &[Event],
    failures: &mut Vec<String>,
    checked: &mut Vec<String>,
) {
    let actual: Vec<SeenCqe<'_>> = trace
        .iter()
        .filter_map(|ev| match ev {
            Event::Cqe {
                qp,
                wr_id,
                status,
                opcode,
                byte_len,
                imm,
            } => Some(SeenCqe {
                qp,
                wr_id: *wr_id,
                status,
                opcode: *opcode,
                byte_len: *byte_len,
                imm: *imm,
            }),
            _ => None,
        })
        .collect();
    checked.push(format!("{} completions", expected.len()));
    if actual.len() != expected.len() {
        failures.push(format!(
            "expected {} completions, got {}: {:?}",
            expected.len(),
            actual.len(),
            actual
                .iter()
                .map(|a| format!("{}#{} {}", a.qp, a.wr_id, a.status))
                .collect::<Vec<_>>()
        ));
    }
    for (i, (x, a)) in expected.iter().zip(&actual).enumerate() {
        let ok = x.qp == a.qp
            && x.wr_id == a.wr_id
            && x.status == a.status
            && x.opcode.as_deref().is_none_or(|o| Some(o) == a.opcode)
            && x.byte_len.is_none_or(|b| Some(b) == a.byte_len)
            && x.imm.is_none_or(|m| Some(m) == a.imm);
        if !ok {
            let x = SeenCqe {
                qp: &x.qp,
                wr_id: x.wr_id,
                status: &x.status,
                opcode: x.opcode.as_deref(),
                byte_len: x.byte_len,
                imm: x.imm,
            };
            failures.push(format!("completion {}: expected {x}, got {a}", i + 1));
            break;
        }
    }
}

/// `expect.outcomes` of QP `qp`: the outcome of each work request but markers.
fn check_outcomes(
    qp: &str,
    items: &[String],
    trace: &[Event],
    failures: &mut Vec<String>,
    checked: &mut Vec<String>,
) {
    let markers: Vec<u64> = trace
        .iter()
        .filter_map(|ev| match ev {
            Event::Post {
                qp: q,
                seq,
                marker: true,
                ..
            } if q == qp => Some(*seq),
            _ => None,
        })
        .collect();
    let got: BTreeMap<u64, (String, Option<String>)> = trace
        .iter()
        .filter_map(|ev| match ev {
            Event::Retire {
                qp: q,
                seq,
                outcome,
                status,
            } if q == qp && !markers.contains(seq) => {
                Some((*seq, (outcome.to_string(), status.map(str::to_string))))
            }
            _ => None,
        })
        .collect();
    // Ranges are expanded only up to the first sequence number beyond what the run
    // posted: one missing work request is enough to fail, and a range like
    // "1-18446744073709551615" must not be expanded.
    let beyond = got
        .keys()
        .chain(&markers)
        .max()
        .map_or(1, |&s| s.saturating_add(1));
    let mut want: BTreeMap<u64, (String, Option<String>)> = BTreeMap::new();
    for item in items {
        if let Ok((first, last, outcome, status)) = parse_outcome_range(item) {
            for s in first..=last.min(beyond.max(first)) {
                want.insert(s, (outcome.clone(), status.clone()));
            }
        }
    }
    checked.push(format!("{} outcomes of {qp}", want.len()));
    if got != want {
        let diff: Vec<String> = want
            .iter()
            .filter(|(s, w)| got.get(s) != Some(w))
            .map(|(s, w)| {
                let show = |o: &(String, Option<String>)| match &o.1 {
                    Some(st) => format!("{}:{st}", o.0),
                    None => o.0.clone(),
                };
                format!(
                    "{s}: expected {} got {}",
                    show(w),
                    got.get(s).map_or("nothing".to_string(), show)
                )
            })
            .chain(
                got.keys()
                    .filter(|s| !want.contains_key(s))
                    .map(|s| format!("{s}: not expected")),
            )
            .take(5)
            .collect();
        failures.push(format!("outcomes of {qp} differ: {}", diff.join(", ")));
    }
}

/// `expect.events`: the asynchronous events, in any order.
fn check_events(
    expected: &[String],
    trace: &[Event],
    failures: &mut Vec<String>,
    checked: &mut Vec<String>,
) {
    checked.push(format!("{} async events", expected.len()));
    let mut got: Vec<String> = trace
        .iter()
        .filter_map(|ev| match ev {
            Event::Async { kind, qp } => Some(match qp {
                Some(q) => format!("{kind}:{q}"),
                None => kind.to_string(),
            }),
            _ => None,
        })
        .collect();
    let mut want = expected.to_vec();
    got.sort();
    want.sort();
    if got != want {
        failures.push(format!("async events: expected {want:?}, got {got:?}"));
    }
}
