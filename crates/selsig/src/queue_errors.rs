//! The errors of [`SignaledQueue`](crate::SignaledQueue)'s operations, one per operation.

use std::fmt;
use std::time::Duration;

use crate::provider::{CqError, PostWrError, ProviderError};
use crate::tracker::{CompletionError, ConfigError, PostError, Seq};
use crate::work::{Payload, Work};

/// Why a post failed. Every work request not posted comes back in the error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum QueuePostError<T> {
    /// The tracker refused the work request (queue full, error state, draining).
    #[error(transparent)]
    Refused(PostError<T>),
    /// The provider refused a work request: those before it were posted, it and all after
    /// it come back (in posting order) in `returned`. When the provider failed after
    /// taking every work request (`source.index` at the end of the batch: rxe's doorbell
    /// `write()` failed), `returned` holds only a work request the tracker refused, if
    /// any: the others stay outstanding and their completions retire them (the caller
    /// may drain: the marker's doorbell runs them, or the error state flushes them).
    #[error("the provider refused a work request")]
    Provider {
        /// The payloads of the work requests that were not posted, in posting order.
        returned: Vec<T>,
        /// The provider's error.
        #[source]
        source: PostWrError,
    },
    /// The work request is invalid (e.g. a buffer larger than one work request carries).
    #[error("invalid work request")]
    Invalid {
        /// The work request.
        work: T,
        /// What is wrong.
        #[source]
        source: ProviderError,
    },
}

/// Why [`SignaledQueue::try_post`](crate::SignaledQueue::try_post) did not post.
#[derive(Debug, thiserror::Error)]
pub enum TryPostError<'a, M, U> {
    /// No room now (the send queue, the CQ budget, or a shared pool's credits, which other
    /// queues may have taken): the work request comes back as it was given. Poll, and post
    /// it again.
    #[error("no room for the work request now")]
    NoRoom(Work<'a, M, U>),
    /// The post failed for another reason (see [`QueuePostError`]).
    #[error(transparent)]
    Failed(QueuePostError<Payload<M, U>>),
}

/// Why polling failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PollError {
    /// The completion queue failed. After [`CqError::Overrun`] completions were lost:
    /// outstanding work requests may never get an outcome (a drain ends with this error,
    /// or, where the overrun shows only as an event, in [`DrainError::Timeout`]), and only
    /// dropping the queue (destroying its QP) ends them.
    /// A queue's budget never lets its own completions overrun a CQ; one shared with work
    /// outside selsig's accounting can. Some NICs report an overrun only as an
    /// asynchronous event ([`AsyncEvent::CqErr`](crate::AsyncEvent::CqErr), through
    /// [`Device::poll_async_event`](crate::Device::poll_async_event)).
    #[error(transparent)]
    Cq(#[from] CqError),
    /// A completion of this queue's QP was impossible; the others of the same poll were
    /// handled.
    #[error(transparent)]
    Completion(#[from] CompletionError),
}

/// What [`SignaledQueue::post_drain_marker`](crate::SignaledQueue::post_drain_marker) did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DrainMarker {
    /// A marker with this sequence number was posted.
    Posted(Seq),
    /// Nothing is outstanding, or the last outstanding work request is signaled (in the
    /// error state: it is the last sequence number, so no marker can follow it), or, in the
    /// error state, the provider takes no post (the flushes retire everything).
    NotNeeded,
    /// No slot or CQ credit yet: poll and try again.
    NoRoom,
}

/// Why a [`SignaledQueue`](crate::SignaledQueue) was not created, with its queue pair back as it was given
/// (dropping it would destroy a QP that may be connected, its peer left connected to
/// nothing).
pub struct CreateError<Q> {
    /// Why.
    pub error: ConfigError,
    /// The queue pair.
    pub qp: Q,
}

impl<Q> CreateError<Q> {
    /// The queue pair, to use again.
    pub fn into_qp(self) -> Q {
        self.qp
    }
}

impl<Q> fmt::Debug for CreateError<Q> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CreateError")
            .field("error", &self.error)
            .finish_non_exhaustive()
    }
}

impl<Q> fmt::Display for CreateError<Q> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.error.fmt(f)
    }
}

impl<Q> std::error::Error for CreateError<Q> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        std::error::Error::source(&self.error)
    }
}

/// The error alone, the queue pair dropped (destroyed).
impl<Q> From<CreateError<Q>> for ConfigError {
    fn from(e: CreateError<Q>) -> Self {
        e.error
    }
}

/// Why a drain did not finish.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DrainError {
    /// Work requests were still outstanding when the time was up.
    #[error("{outstanding} work requests still outstanding after {waited:?}")]
    Timeout {
        /// How many, markers included (the drain's own, when it posted one).
        outstanding: u32,
        /// How long the drain waited.
        waited: Duration,
    },
    /// Polling failed.
    #[error(transparent)]
    Poll(#[from] PollError),
    /// The marker could not be posted.
    #[error("the drain marker could not be posted")]
    Marker(#[source] QueuePostError<()>),
    /// The marker needs a credit of the shared completion-queue pool that completions of
    /// other queues hold: they were polled from the shared CQ and wait for their queues,
    /// in [`take_unclaimed`](crate::SignaledQueue::take_unclaimed) (hand them to their queues
    /// with [`handle_completion`](crate::SignaledQueue::handle_completion)) or, on a
    /// [`SharedCq`](crate::SharedCq), in those queues' inboxes (poll those queues). Then drain again.
    #[error(
        "the drain marker needs a completion-queue credit held by other queues: {completions} of their completions, polled from the shared CQ, wait for their queues (in take_unclaimed, or until those queues poll)"
    )]
    Unrouted {
        /// How many completions of other queue pairs wait.
        completions: usize,
    },
}
