//! What a campaign checks on each run, whatever the scenario: every work request has
//! exactly one outcome, handed back in posting order; the regions hold what the outcomes
//! say (for a race-free scenario); two devices give the same trace (for a race-free
//! scenario). And the shrinker, which drops steps from a failing scenario while it still
//! fails the same way.

use std::collections::BTreeMap;

use crate::model::Scenario;
use crate::run::RunResult;
use crate::trace::Event;

mod memory;
mod shrink;

pub use shrink::shrink;

/// A campaign check that failed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Violation {
    /// Which check: `outcomes` (not exactly one outcome per work request in posting
    /// order) or `memory` (a region's digest is not what the outcomes make it).
    pub check: &'static str,
    /// What was wrong.
    pub detail: String,
}

/// Checks a complete run of `scenario`: one outcome per work request, in posting order;
/// and, when the scenario is race-free (no [`Scenario::races`]), every region's digest is
/// what the completed work requests make it, those failed, flushed or refused having
/// placed nothing.
pub fn check_run(scenario: &Scenario, result: &RunResult) -> Vec<Violation> {
    let mut v: Vec<Violation> = check_outcomes(&result.trace)
        .into_iter()
        .map(|detail| Violation {
            check: "outcomes",
            detail,
        })
        .collect();
    if result.error.is_none() && v.is_empty() && scenario.races().is_empty() {
        v.extend(
            memory::check(scenario, &result.trace)
                .into_iter()
                .map(|detail| Violation {
                    check: "memory",
                    detail,
                }),
        );
    }
    v
}

/// Every work request posted (markers aside) retired exactly once, in the order of its
/// sequence number, on each queue pair; nothing retired that was not posted.
fn check_outcomes(trace: &[Event]) -> Vec<String> {
    #[derive(Default)]
    struct Q {
        posted: Vec<u64>,
        retired: Vec<u64>,
    }
    let mut qps: BTreeMap<&str, Q> = BTreeMap::new();
    for e in trace {
        match e {
            Event::Post {
                qp,
                seq,
                marker: false,
                ..
            } => qps.entry(qp).or_default().posted.push(*seq),
            Event::Retire { qp, seq, .. } => qps.entry(qp).or_default().retired.push(*seq),
            _ => {}
        }
    }
    let mut problems = Vec::new();
    for (qp, q) in &qps {
        if let Some(w) = q.retired.windows(2).find(|w| w[1] <= w[0]) {
            problems.push(format!(
                "qp {qp}: work request {} was retired after {}",
                w[1], w[0]
            ));
        }
        let mut posted = q.posted.clone();
        posted.sort_unstable();
        let mut retired = q.retired.clone();
        retired.sort_unstable();
        if posted != retired {
            let missing: Vec<u64> = posted
                .iter()
                .filter(|s| retired.binary_search(s).is_err())
                .copied()
                .collect();
            let extra: Vec<u64> = retired
                .iter()
                .filter(|s| posted.binary_search(s).is_err())
                .copied()
                .collect();
            let twice = retired.windows(2).filter(|w| w[0] == w[1]).count();
            problems.push(format!(
                "qp {qp}: {} posted, {} retired (no outcome: {missing:?}; never posted: \
                 {extra:?}; retired twice: {twice})",
                posted.len(),
                retired.len()
            ));
        }
    }
    problems
}

/// Where two traces of one scenario differ, if they do: the first line that differs, by
/// number (from 1), with both lines. Asynchronous events are compared apart, as a set of
/// lines: on a real NIC an event may come a step later than on the software NIC
/// (docs/scenarios.md, "The trace").
pub fn compare_traces(a: &[Event], b: &[Event]) -> Option<String> {
    let (ra, ea) = split(a);
    let (rb, eb) = split(b);
    let n = ra.len().max(rb.len());
    for i in 0..n {
        let la = ra
            .get(i)
            .map_or("(the trace ends)".to_string(), |e| e.line());
        let lb = rb
            .get(i)
            .map_or("(the trace ends)".to_string(), |e| e.line());
        if la != lb {
            return Some(format!(
                "line {} (asynchronous events aside) differs:\n  {la}\n  {lb}",
                i + 1
            ));
        }
    }
    (ea != eb).then(|| format!("asynchronous events differ: {ea:?} and {eb:?}"))
}

/// A trace's lines but its asynchronous events, and those apart, sorted.
fn split(t: &[Event]) -> (Vec<&Event>, Vec<String>) {
    let (events, rest): (Vec<&Event>, Vec<&Event>) =
        t.iter().partition(|e| matches!(e, Event::Async { .. }));
    let mut events: Vec<String> = events.iter().map(|e| e.line()).collect();
    events.sort();
    (rest, events)
}
