//! What the tracker hands out: a post's decision ([`Posted`], [`Signal`],
//! [`SignalReason`]), a work request's [`Outcome`] and its [`Retired`] record, and the
//! queue's [`QueueState`].

use std::fmt;

use super::Seq;
#[cfg(doc)]
use super::{SendTracker, TrackerConfig};
use crate::wc::WcStatus;

/// What the caller asks of one post.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Signal {
    /// Let the policy decide (the tracker may still force a signal).
    #[default]
    Auto,
    /// Signal this work request, e.g. the last of a batch.
    Force,
}

/// Why a work request was signaled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SignalReason {
    /// The policy asked for it.
    Policy,
    /// The caller asked for it ([`Signal::Force`]).
    Requested,
    /// The queue was created with `sq_sig_all`: every work request is signaled.
    SqSigAll,
    /// One more unsignaled work request would have made a run as long as the queue (or as
    /// the queue's CQ budget, if smaller): with no signaled work request in a full queue,
    /// no slot would ever be freed (mlx5). Also
    /// the work request with the last sequence number, which no marker could follow.
    Deadlock,
    /// This work request took the last credit of a shared completion-queue pool; it is
    /// signaled so that some completion is always on its way while the pool is empty.
    CqCredit,
    /// A zero-length marker (`confirm_all`, drain): always signaled.
    Marker,
}

impl SignalReason {
    /// A short lowercase name for traces.
    pub const fn as_str(self) -> &'static str {
        match self {
            SignalReason::Policy => "policy",
            SignalReason::Requested => "requested",
            SignalReason::SqSigAll => "sq_sig_all",
            SignalReason::Deadlock => "deadlock",
            SignalReason::CqCredit => "cq_credit",
            SignalReason::Marker => "marker",
        }
    }
}

/// The decision for one posted work request: the `wr_id` to post it with, its sequence
/// number and whether to set `IBV_SEND_SIGNALED`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Posted {
    /// The `wr_id` to post: the sequence number, with the tracker's
    /// [`wr_id_tag`](TrackerConfig::wr_id_tag) set.
    pub wr_id: u64,
    /// The sequence number.
    pub seq: Seq,
    /// `Some(why)` when the work request must be posted signaled.
    pub signal: Option<SignalReason>,
}

impl Posted {
    /// `true` when the work request must be posted with `IBV_SEND_SIGNALED`.
    pub const fn signaled(&self) -> bool {
        self.signal.is_some()
    }
}

/// The outcome of one work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// It completed: a later (or its own) successful completion covered it, or the error
    /// completion of a later work request proved it done.
    Completed,
    /// It failed with this status; the queue went to the error state.
    Failed(WcStatus),
    /// It was flushed: the queue was in the error state before it executed.
    Flushed,
    /// Unknown: the device was lost (a fatal error, `IBV_EVENT_DEVICE_FATAL`) before a
    /// completion said what happened to it. It may have executed, in part or whole, or
    /// not at all; no completion will come for it (libmlx5 does not flush a user-space
    /// QP of a lost device). The device executes nothing more, so its buffer is the
    /// caller's again.
    DeviceLost,
}

impl Outcome {
    /// A short lowercase name for traces (`completed`, `failed`, `flushed`,
    /// `device_lost`).
    pub const fn as_str(&self) -> &'static str {
        match self {
            Outcome::Completed => "completed",
            Outcome::Failed(_) => "failed",
            Outcome::Flushed => "flushed",
            Outcome::DeviceLost => "device_lost",
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Failed(status) => write!(f, "failed ({status})"),
            other => f.write_str(other.as_str()),
        }
    }
}

/// A retired work request handed back to the caller, in posting order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retired<T> {
    /// Its sequence number.
    pub seq: Seq,
    /// The payload given to [`SendTracker::post`]; the provider no longer uses it.
    pub payload: T,
    /// What happened to it.
    pub outcome: Outcome,
    /// Whether it was posted signaled.
    pub signaled: bool,
}

/// The state of the queue as the tracker knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueueState {
    /// Accepting posts.
    Ready,
    /// [`SendTracker::start_drain`] was called: no more posts, only markers.
    Draining,
    /// A completion reported an error: no more posts; outstanding work requests await
    /// their flush completions.
    Error {
        /// The work request whose completion first reported the error.
        first: Seq,
        /// Its status.
        status: WcStatus,
    },
    /// The device was lost ([`SendTracker::device_lost`]): no more posts, nothing
    /// outstanding.
    DeviceLost,
}
