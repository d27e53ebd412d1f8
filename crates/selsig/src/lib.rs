//! selsig: selective signaling for RDMA send queues, done right.
//!
//! On an RC queue pair created with `sq_sig_all = 0` only work requests posted with
//! `IBV_SEND_SIGNALED` produce a completion when they succeed, and a completion for work
//! request *k* confirms *k* and every earlier work request of that send queue. This crate's
//! [`SendTracker`] owns what makes that hard: which work requests to signal, send-queue and
//! completion-queue credits, handing every payload back in order when a later completion
//! covers it, and the exact outcome of every work request when errors strike.
//!
//! The tracker is *sans-IO*: no I/O, no threads, no clock. Time is an input.
//!
//! # Call order
//!
//! 1. Getters at any time: [`outstanding`](SendTracker::outstanding),
//!    [`available`](SendTracker::available), [`state`](SendTracker::state),
//!    [`next_deadline`](SendTracker::next_deadline), [`stats`](SendTracker::stats).
//! 2. Inputs:
//!    - [`post`](SendTracker::post) for each work request; post it to the provider with
//!      `wr_id = seq` and `IBV_SEND_SIGNALED` when told to. If the provider refuses part of
//!      a batch, [`rollback`](SendTracker::rollback) from the first refused one.
//!    - [`handle_completion`](SendTracker::handle_completion) for each completion polled for
//!      this QP (retire per QP: a CQ may be shared).
//!    - [`confirm_all`](SendTracker::confirm_all) when nothing more is to be posted (or at
//!      [`next_deadline`](SendTracker::next_deadline)); post the marker it returns as a
//!      signaled zero-length RDMA WRITE.
//!    - [`start_drain`](SendTracker::start_drain) and
//!      [`post_marker`](SendTracker::post_marker) to tear down, after an error too.
//! 3. Outputs: [`poll_retired`](SendTracker::poll_retired) until `None` after completions,
//!    giving back each payload, in posting order, with its [`Outcome`]
//!    ([`poll_retired_with`](SendTracker::poll_retired_with) hands them all to a closure in
//!    one pass).
//!
//! # The seed example
//!
//! Eight RDMA WRITEs, every fourth signaled: the CQ holds only CQE4 and CQE8, and CQE4
//! confirms WR1–WR4.
//!
//! ```
//! use std::time::Instant;
//! use selsig::{Outcome, Policy, SendTracker, Signal, TrackerConfig, WcStatus, WorkCompletion};
//!
//! let now = Instant::now();
//! let config = TrackerConfig::new(16, 16).policy(Policy::Every(4));
//! let mut tracker = SendTracker::new(config, now)?;
//! let mut signaled = Vec::new();
//! for wr in 1..=8u32 {
//!     let posted = tracker.post(wr, Signal::Auto, now)?;
//!     if posted.signaled() {
//!         signaled.push(posted.wr_id);
//!     }
//! }
//! assert_eq!(signaled, [4, 8]);
//!
//! tracker.handle_completion(&WorkCompletion::new(4, WcStatus::Success, 0), now)?;
//! let run: Vec<_> = std::iter::from_fn(|| tracker.poll_retired()).collect();
//! assert_eq!(run.iter().map(|r| r.payload).collect::<Vec<_>>(), [1, 2, 3, 4]);
//! assert!(run.iter().all(|r| r.outcome == Outcome::Completed));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod buffer;
mod claims;
pub mod credits;
mod errors;
pub mod mlx5_sizing;
pub mod policy;
pub mod provider;
pub mod queue;
mod queue_errors;
mod seq;
pub mod shared;
pub mod stats;
pub mod tracker;
pub mod wc;
mod work;

pub use buffer::Buffer;
pub use provider::{
    ATOMIC_LEN, Access, AsyncEvent, CompletionQueue, ConnectOptions, CqError, Device, Endpoint,
    Local, MAX_MESSAGE_LEN, MemoryRegion, Opcode, PostApi, PostFailure, PostWrError, ProviderError,
    QpCaps, QpInit, QpState, QueuePair, RecvWr, RemoteAddr, SendWr, Sge, connect_pair,
};
pub use queue::{
    Completion, CreateError, DrainError, DrainMarker, LIST_BATCH, Payload, PollError, QueueConfig,
    QueuePostError, SEND_WR_ID_BIT, SignaledQueue, TryPostError, Work,
};

pub use credits::{CqBudget, CqCredits};
/// The histogram crate of [`Stats`]' `lag_ns` and `wrs_per_cqe`, to name their type.
pub use hdrhistogram;
pub use policy::{Policy, PolicyError};
pub use shared::{Pumped, SharedCq};
pub use stats::{MAX_LAG_NS, Stats};
pub use tracker::{
    CompletionError, ConfigError, Handled, Outcome, PostError, Posted, QueueState, Retired,
    RollbackError, SendTracker, Seq, Signal, SignalReason, TrackerConfig,
};
pub use wc::{UnknownValue, WcOpcode, WcStatus, WorkCompletion};
