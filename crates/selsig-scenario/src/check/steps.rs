//! The `[[step]]` tables: what the steps before a step did (regions deregistered, receives
//! posted, queues that may be in the error state), the names a step gives, and every kind
//! of step but `post` (in `post.rs`).

use crate::error::ScenarioError;
use crate::format::{PollStep, RecvStep};
use crate::model::{Action, Qp, QpRef, Recv, Region};

use super::bounds::{RecvBound, unusable, unused_receives};
use super::checker::{Checker, MAX_COUNT, MAX_REGION, MAX_TOTAL, Span};

use selsig::Access;

/// The step being checked: its number (from 0) and its place in the file.
pub(super) struct Here {
    pub n: usize,
    pub span: Span,
}

/// The steps checked so far, in the file's order.
pub(super) struct Steps<'s> {
    pub c: &'s Checker<'s>,
    pub qps: &'s [Qp],
    pub regions: &'s [Region],
    /// The step that deregistered each region (from 1), if one did.
    pub deregistered: Vec<Option<usize>>,
    /// What each peer's receive queue may hold at most.
    pub recv_bounds: Vec<RecvBound>,
    /// The work requests and receives posted so far.
    pub total: u64,
    /// The `device_fatal` step (from 1), if one came.
    pub lost: Option<usize>,
}

impl<'s> Steps<'s> {
    pub fn new(c: &'s Checker<'s>, qps: &'s [Qp], regions: &'s [Region]) -> Self {
        Steps {
            c,
            qps,
            regions,
            deregistered: vec![None; regions.len()],
            recv_bounds: vec![RecvBound::default(); qps.len()],
            total: 0,
            lost: None,
        }
    }

    /// An error of the step `at`.
    pub fn here(&self, at: &Here, m: String) -> ScenarioError {
        self.c
            .err(at.span.clone(), format!("step {}: {m}", at.n + 1))
    }

    /// The `count` of a post or receive step `at`, in range, added to the scenario's total
    /// (which is bounded too).
    pub fn count(&mut self, at: &Here, count: u64) -> Result<(), ScenarioError> {
        if count == 0 || count > MAX_COUNT {
            return Err(self.here(at, format!("count {count} is out of range 1..={MAX_COUNT}")));
        }
        self.total += count;
        if self.total > MAX_TOTAL {
            return Err(self.here(
                at,
                format!(
                    "the steps so far post {} work requests and receives: a scenario \
                     posts at most {MAX_TOTAL}",
                    self.total
                ),
            ));
        }
        Ok(())
    }

    /// The endpoint a step names (a peer only where `allow_peer`).
    pub fn find_qp(&self, name: &str, at: &Here, allow_peer: bool) -> Result<QpRef, ScenarioError> {
        let (span, step) = (at.span.clone(), at.n);
        let (base, peer) = match name.strip_suffix(".peer") {
            Some(b) => (b, true),
            None => (name, false),
        };
        if peer && !allow_peer {
            return Err(self.c.err(
                span,
                format!(
                    "step {}: {name:?}: this step needs a requester QP, not a peer",
                    step + 1
                ),
            ));
        }
        self.qps
            .iter()
            .position(|q| q.name == base)
            .map(|index| QpRef { index, peer })
            .ok_or_else(|| {
                self.c
                    .err(span, format!("step {}: no qp named {name:?}", step + 1))
            })
    }

    /// The region a step names.
    pub fn find_region(&self, name: &str, at: &Here) -> Result<usize, ScenarioError> {
        let (span, step) = (at.span.clone(), at.n);
        self.regions
            .iter()
            .position(|r| r.name == name)
            .ok_or_else(|| {
                self.c
                    .err(span, format!("step {}: no region named {name:?}", step + 1))
            })
    }

    /// `recv = { qp, region, size, count, offset }`.
    pub fn recv(&mut self, at: &Here, r: &RecvStep) -> Result<Action, ScenarioError> {
        let qp = self.find_qp(&r.qp, at, true)?;
        if !qp.peer {
            return Err(self.here(
                at,
                format!(
                    "receives are posted on a peer (\"{}.peer\"), not on {:?}",
                    r.qp, r.qp
                ),
            ));
        }
        self.count(at, r.count)?;
        let offset = r.offset.unwrap_or(0);
        for (field, value) in [("size", r.size), ("offset", offset)] {
            if value > MAX_REGION {
                return Err(self.here(
                    at,
                    format!("{field} {value} is larger than any region ({MAX_REGION})"),
                ));
            }
        }
        let region = match &r.region {
            Some(name) => {
                let i = self.find_region(name, at)?;
                let end = offset + r.count * r.size;
                if end > self.regions[i].size as u64 {
                    return Err(self.here(
                        at,
                        format!(
                            "the receives end at {end}, beyond region {name:?} ({} bytes)",
                            self.regions[i].size
                        ),
                    ));
                }
                Some(i)
            }
            None if r.size > 0 => {
                return Err(self.here(at, "receives of more than 0 bytes need a region".into()));
            }
            None if r.offset.is_some() => {
                return Err(self.here(at, "offset needs a region".into()));
            }
            None => None,
        };
        let (regions, deregistered) = (self.regions, &self.deregistered);
        let bound = &mut self.recv_bounds[qp.index];
        bound.posted += r.count;
        bound.waiting_recvs.push_back((r.size, region, r.count));
        bound.match_receives(|i| unusable(&regions[i], deregistered[i], Access::LOCAL_WRITE));
        let depth = self.qps[qp.index].peer_depth;
        if !bound.flushed && bound.posted.saturating_sub(bound.consumers) > u64::from(depth) {
            let (posted, consumers) = (bound.posted, bound.consumers);
            return Err(self.here(
                at,
                format!(
                    "{posted} receives posted on {:?}, at most {consumers} of them used by \
                     earlier SENDs and WRITEs with immediate: more would wait than its \
                     peer_depth of {depth}",
                    r.qp
                ),
            ));
        }
        Ok(Action::Recv(Recv {
            qp,
            region,
            size: r.size,
            count: r.count,
            offset,
        }))
    }

    /// `poll = "idle"` or `poll = { cqes = N }`.
    pub fn poll(&self, at: &Here, p: &PollStep) -> Result<Action, ScenarioError> {
        Ok(match p {
            PollStep::Word(w) if w == "idle" => {
                // After a device_fatal step nothing is waited for: receives get nothing.
                if self.lost.is_none() {
                    unused_receives(&self.recv_bounds, self.qps).map_err(|m| self.here(at, m))?;
                }
                Action::PollIdle
            }
            PollStep::Word(w) => {
                return Err(self.here(
                    at,
                    format!("poll = {w:?}: expected \"idle\" or {{ cqes = N }}"),
                ));
            }
            PollStep::Count { cqes: 0 } => {
                return Err(self.here(
                    at,
                    "poll = { cqes = 0 }: waits for nothing (N is at least 1)".to_string(),
                ));
            }
            PollStep::Count { cqes } => Action::PollCqes(*cqes),
        })
    }

    /// `confirm = "qp"`.
    pub fn confirm(&self, at: &Here, q: &str) -> Result<Action, ScenarioError> {
        Ok(Action::Confirm(self.find_qp(q, at, false)?.index))
    }

    /// `drain = "qp"`.
    pub fn drain(&mut self, at: &Here, q: &str) -> Result<Action, ScenarioError> {
        let qp = self.find_qp(q, at, false)?.index;
        // A drain waits for its own queue pair only (after a device_fatal step, for
        // nothing).
        if self.lost.is_none() {
            unused_receives(&self.recv_bounds[qp..=qp], &self.qps[qp..=qp])
                .map_err(|m| self.here(at, m))?;
        }
        self.recv_bounds[qp].drained = true;
        Ok(Action::Drain(qp))
    }

    /// `dereg = "region"`.
    pub fn dereg(&mut self, at: &Here, r: &str) -> Result<Action, ScenarioError> {
        let i = self.find_region(r, at)?;
        if let Some(k) = self.deregistered[i] {
            return Err(self.here(at, format!("region {r:?} was deregistered by step {k}")));
        }
        self.deregistered[i] = Some(at.n + 1);
        Ok(Action::Dereg(i))
    }

    /// `device_fatal = true`: once, and only `poll = "idle"` and `drain` after it.
    pub fn device_fatal(&mut self, at: &Here, yes: bool) -> Result<Action, ScenarioError> {
        if !yes {
            return Err(self.here(
                at,
                "device_fatal = false would change nothing: leave the step out".to_string(),
            ));
        }
        self.lost = Some(at.n + 1);
        Ok(Action::DeviceFatal)
    }

    /// After a `device_fatal` step, a step that is not `poll = "idle"` or `drain` is
    /// refused: the device executes nothing more, and its queues take no work.
    pub fn after_loss(&self, at: &Here, kind: &str) -> Result<(), ScenarioError> {
        match self.lost {
            Some(n) if !matches!(kind, "poll_idle" | "drain") => Err(self.here(
                at,
                format!(
                    "a {kind} step after the device_fatal of step {n}: only poll = \"idle\" \
                     and drain may follow (the device executes nothing more and makes no \
                     completion)"
                ),
            )),
            _ => Ok(()),
        }
    }

    /// `to_error = "qp"` or `"qp.peer"`.
    pub fn error_state(&mut self, at: &Here, q: &str) -> Result<Action, ScenarioError> {
        let qp = self.find_qp(q, at, true)?;
        // The peer in the error state flushes its receives; the QP in the error state
        // flushes the SENDs it posts after, which use none. (Either one in the error
        // state also ends, with an error, a SEND waiting for a receive.)
        let bound = &mut self.recv_bounds[qp.index];
        match qp.peer {
            true => bound.flushed = true,
            false => bound.requester_error = true,
        }
        Ok(Action::ToError(qp))
    }
}
