//! The runner's state: the device's objects a scenario made, the trace so far, the
//! completions polled and not handled yet; what it still waits for; and the canonical
//! order of a step's events.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use selsig::{Device, QueueState, WorkCompletion};

use crate::model::{QpRef, Scenario};
use crate::trace::Event;

use super::side::{KeyedRegion, Side};

/// How long a step may wait for the NIC without a completion, unless
/// [`RunOptions::wait`](crate::RunOptions::wait) says otherwise.
pub(super) const WAIT: Duration = Duration::from_secs(20);

/// A scenario's run on a device: what it made there, and what it saw so far.
pub(super) struct Runner<'a, D: Device> {
    pub sc: &'a Scenario,
    pub dev: &'a D,
    pub cqs: Vec<Arc<D::Cq>>,
    pub sides: Vec<Side<D>>,
    pub regions: Vec<KeyedRegion<D::Mr>>,
    pub trace: Vec<Event>,
    /// QP number → endpoint.
    pub qpns: BTreeMap<u32, QpRef>,
    pub wcs: Vec<WorkCompletion>,
    /// Completions of other endpoints a wait for room polled (how many depends on
    /// timing), in the order polled, not handled yet: their endpoint takes them first when
    /// it waits for room itself, or the next step that polls does.
    pub stash: Vec<WorkCompletion>,
    /// The events of stashed completions that a wait had to hand over before then (a
    /// shared CQ's credits held by other queues): shown with the next step that polls, in
    /// canonical order, or, when their endpoint waits for room itself, before the events
    /// of its later completions.
    pub deferred: Vec<Event>,
    /// What makes the device fail, for a `device_fatal` step ([`RunOptions::inject_fatal`](
    /// crate::RunOptions::inject_fatal)).
    pub inject_fatal: Option<super::InjectFatal>,
    /// A `device_fatal` step came: receives still outstanding get nothing.
    pub lost: bool,
    /// How long a step may wait without a completion.
    pub wait: Duration,
    /// The remote side and the region it holds, when the queue pair's peer is there.
    pub remote: Option<super::setup::Remote<'a, D>>,
    pub _pds: (D::Pd, Option<D::Pd>),
}

impl<D: Device> Runner<'_, D> {
    /// The endpoint a completion belongs to.
    pub fn owner(&self, wc: &WorkCompletion) -> Option<QpRef> {
        self.qpns.get(&wc.qp_num).copied()
    }

    /// Why a poll step that waited for `n` completions (or for idle) and got `got` gave up.
    pub fn stuck(&self, n: Option<u64>, got: u64) -> String {
        match n {
            Some(n) => {
                let waiting = self.outstanding(None);
                match waiting.is_empty() {
                    true => format!(
                        "only {got} of {n} completions arrived (none for {:?})",
                        self.wait
                    ),
                    false => format!(
                        "only {got} of {n} completions arrived (none for {:?}): {}",
                        self.wait,
                        waiting.join("; ")
                    ),
                }
            }
            None => format!(
                "not idle (no completion for {:?}): {}",
                self.wait,
                self.outstanding(None).join("; ")
            ),
        }
    }

    /// What each queue pair (or only queue `only`) still waits for.
    pub fn outstanding(&self, only: Option<usize>) -> Vec<String> {
        self.sc
            .qps
            .iter()
            .zip(&self.sides)
            .enumerate()
            .filter(|(i, _)| only.is_none_or(|q| q == *i))
            .map(|(_, pair)| pair)
            .filter(|(_, s)| !s.queue.tracker().is_idle() || s.peer_recvs > s.peer_recv_done)
            .map(|(q, s)| {
                let outstanding = s.queue.outstanding();
                // Unsignaled work requests after the last signaled one complete silently:
                // only a later signaled one (or an error) can confirm them.
                let tail = if outstanding > 0
                    && s.queue.tracker().unsignaled_run() == outstanding
                    && s.queue.state() == QueueState::Ready
                {
                    format!(
                        " (all of them an unsignaled tail, which no completion confirms: \
                         `confirm = {0:?}` or `drain = {0:?}` before polling)",
                        q.name
                    )
                } else {
                    String::new()
                };
                let waiting = s.peer_recvs - s.peer_recv_done;
                let unused = waiting - s.usable_receives();
                let unused = if unused > 0 {
                    format!(
                        " ({unused} of them used by no SEND or WRITE with immediate posted, \
                         and not flushed)"
                    )
                } else {
                    String::new()
                };
                format!(
                    "{}: {outstanding} work requests{tail}, {waiting} receives \
                     outstanding{unused}{}",
                    q.name,
                    s.wait_hint(q),
                )
            })
            .collect()
    }

    /// The most completions that can still arrive: one per outstanding work request, and
    /// one per outstanding receive that a SEND or WRITE with immediate posted may still use
    /// (every one, once the peer may be in the error state and flush them).
    pub fn completions_possible(&self) -> u64 {
        self.sides
            .iter()
            .map(|s| u64::from(s.queue.outstanding()) + s.usable_receives())
            .sum()
    }

    /// The CQs a completion can still come to, for queue `only` or for every queue, as
    /// [`completions_possible`](Self::completions_possible) counts them: the send CQ of
    /// each queue with work requests outstanding, then its peer's CQ if receives there may
    /// still complete; each CQ once, in the order of the queues. A wait sleeps on these
    /// (when none, on `otherwise`).
    pub fn live_cqs(&self, only: Option<usize>, otherwise: &[usize]) -> Vec<usize> {
        let mut live = Vec::new();
        for (q, s) in self.sides.iter().enumerate() {
            if only.is_some_and(|only| only != q) {
                continue;
            }
            let qp = &self.sc.qps[q];
            if s.queue.outstanding() > 0 && !live.contains(&qp.send_cq) {
                live.push(qp.send_cq);
            }
            if s.usable_receives() > 0 && !live.contains(&qp.peer_cq) {
                live.push(qp.peer_cq);
            }
        }
        if live.is_empty() {
            live.extend_from_slice(otherwise);
        }
        live
    }

    /// Every queue is idle.
    pub fn idle(&self) -> bool {
        (0..self.sides.len()).all(|q| self.side_idle(q))
    }

    /// Queue `q` has every work request retired and its peer every receive completed.
    pub fn side_idle(&self, q: usize) -> bool {
        let s = &self.sides[q];
        s.queue.tracker().is_idle() && (self.lost || s.peer_recv_done >= s.peer_recvs)
    }
}

/// Puts one poll step's events in canonical order: each QP's completions, each followed by
/// the work requests it retired, QP after QP; then asynchronous events by name. Each QP's
/// own events are in a fixed order; only how QPs interleave varies between runs.
pub(super) fn canonical(events: &mut [Event], sc: &Scenario) {
    let order = |qp: &str| -> usize {
        let (base, peer) = match qp.strip_suffix(".peer") {
            Some(b) => (b, 1),
            None => (qp, 0),
        };
        sc.qps
            .iter()
            .position(|q| q.name == base)
            .unwrap_or(usize::MAX / 2)
            * 2
            + peer
    };
    let rank = |e: &Event| -> (u8, usize, String) {
        match e {
            Event::Cqe { qp, .. } | Event::Retire { qp, .. } => (0, order(qp), String::new()),
            Event::Async { kind, qp } => {
                (1, 0, format!("{kind}:{}", qp.clone().unwrap_or_default()))
            }
            _ => (2, 0, String::new()),
        }
    };
    // A stable sort keeps each QP's events in their order.
    events.sort_by_key(|e| rank(e));
}
