//! The errors of the tracker's operations: one enum per operation.

use crate::policy::PolicyError;
use crate::seq::Seq;
use crate::wc::WcStatus;

/// Why a [`TrackerConfig`](crate::TrackerConfig) is unusable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The send queue has no slot.
    #[error("the send queue capacity must be at least 1")]
    ZeroSqCapacity,
    /// The completion queue was created with `IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN`: an
    /// overrun there loses completions without a word (no error, no `IBV_EVENT_CQ_ERR`),
    /// and with them the outcome of work requests, which selsig must not lose. Its own
    /// queues never overrun a CQ; work outside its accounting on the same CQ could.
    #[error(
        "the completion queue ignores overruns (IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN): completions lost there would go unnoticed; give the queue a CQ created without it"
    )]
    CqIgnoresOverrun,
    /// The completion queue has no slot.
    #[error("the completion queue capacity must be at least 1")]
    ZeroCqCapacity,
    /// The first sequence number leaves no room to post: it must be below the end of the
    /// sequence numbers ([`TrackerConfig::seq_end`](crate::TrackerConfig::seq_end), default `u64::MAX`).
    #[error("the first sequence number must be below {end}")]
    FirstSeqTooHigh {
        /// The end of the sequence numbers.
        end: u64,
    },
    /// The policy is invalid.
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// The `Adaptive` policy decides by the clock, and the queue was told not to read it
    /// (`QueueConfig::measure_lag`).
    #[error("the adaptive policy needs the clock: keep measure_lag on")]
    AdaptiveNeedsClock,
    /// The `wr_id` tag is not a single bit.
    #[error("the wr_id tag {0:#x} is not a single bit")]
    WrIdTag(u64),
    /// The tracker's ring for a send queue of this capacity cannot be allocated.
    #[error("cannot allocate the tracker's ring for a send queue of {0} work requests")]
    TooLarge(u32),
    /// The QP's receive completions go to the same CQ, and its receive queue alone can
    /// fill it: no room is left for the completions of sends.
    #[error(
        "the completion queue ({capacity} entries) has no room for send completions beside the {receives} of the receive queue that shares it"
    )]
    NoCqRoomForSends {
        /// The CQ's capacity.
        capacity: u32,
        /// The QP's receive queue capacity.
        receives: u32,
    },
    /// The CQ budget is more than the completion queue holds: an error, which makes a
    /// completion for every outstanding work request, could overrun it.
    #[error("a CQ budget of {budget} completions is more than the completion queue holds ({room})")]
    CqBudgetTooLarge {
        /// The budget's capacity.
        budget: u32,
        /// The completion queue's capacity.
        room: u32,
    },
    /// A queue joins a shared CQ that its QP's receive completions go to as well, and the
    /// CQ cannot hold the pool's credits beside the receive slots of the queues on it
    /// (this one's included): an error would complete every send and every receive.
    #[error(
        "the completion queue ({capacity} entries) cannot hold the shared pool's {credits} credits beside the {receives} receive slots that report to it: give the pool fewer credits"
    )]
    NoCqRoomForReceives {
        /// The CQ's capacity.
        capacity: u32,
        /// The shared pool's credits.
        credits: u32,
        /// The receive slots of the queues' QPs that report to the CQ.
        receives: u32,
    },
    /// A queue on a shared CQ was given a budget other than the shared CQ's pool.
    #[error("a queue on a shared CQ takes its credits from the shared CQ's pool")]
    NotTheSharedPool,
    /// The shared CQ has a queue for this QP already.
    #[error("the shared CQ has a queue for QP {qp_num:#x} already")]
    SharedCqHasQp {
        /// The QP's number.
        qp_num: u32,
    },
    /// The CQ is another queue's whole (created without a budget), or has queues with
    /// budgets on it and cannot be one queue's whole: either way errors could complete
    /// more work requests than it holds.
    #[error(
        "the completion queue has another queue on it: a queue without a CQ budget takes its CQ whole; queues that share a CQ go on a SharedCq, or take a budget each (QueueConfig::cq)"
    )]
    CqInUse,
    /// The CQ given is not the one the QP's send queue reports to
    /// ([`QueuePair::send_cq_identity`](crate::QueuePair::send_cq_identity)): the queue
    /// would wait for completions that never come to it.
    #[error("the completion queue given is not the one the queue pair's send queue reports to")]
    NotTheSendCq,
    /// The completion queue is polled through a [`SharedCq`](crate::SharedCq) and a queue
    /// would poll it itself, or the other way round, or through another `SharedCq`: each
    /// poller would take completions the other's queues wait for.
    #[error(
        "the completion queue is polled through a SharedCq and would be polled otherwise too: queues that share a CQ all go on one SharedCq (SignaledQueue::on_shared_cq), or all poll it themselves"
    )]
    CqPolledTwoWays,
    /// The CQ budgets of the queues on one completion queue (each pool counted once) and
    /// the receive slots of their QPs that report to it add up to more than it holds:
    /// errors could complete more work requests than it holds.
    #[error(
        "the CQ budgets of the queues on the completion queue and the receive slots that report to it would add up to {total} completions, more than it holds ({capacity})"
    )]
    CqBudgetsTooLarge {
        /// The budgets and receive slots, this queue's included.
        total: u64,
        /// The completion queue's capacity.
        capacity: u32,
    },
    /// Queues dropped from the completion queue, their QPs destroyed with work outstanding
    /// (or receive slots reporting to it) by a provider that leaves a QP's completions in
    /// its CQ (rxe), may have left completions in it, which nothing says are gone: they
    /// stay counted while the CQ lives (drain a queue before dropping it). Beside them,
    /// and what the queues on it take, the CQ has no room for this queue.
    #[error(
        "the completion queue ({capacity} entries) may still hold {left} completions of queues dropped with work outstanding (their QPs destroyed without removing them); beside those and the {taken} taken by the queues and receives on it, it has no room for {wanted} more"
    )]
    CqHoldsDroppedWork {
        /// The completion queue's capacity.
        capacity: u32,
        /// Completions dropped queues may have left in it (with a pool's credits still
        /// taken for their work requests).
        left: u64,
        /// The budgets and receive slots of the queues on it.
        taken: u64,
        /// What this queue needs: its budget and receive slots (taking the CQ whole, its
        /// receive slots and one send).
        wanted: u64,
    },
}

/// Why a post was refused. The payload is handed back untouched.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PostError<T> {
    /// Every slot of the send queue is held by an outstanding work request.
    #[error("the send queue is full: {capacity} work requests outstanding")]
    Full {
        /// The caller's payload.
        payload: T,
        /// The send queue's capacity.
        capacity: u32,
    },
    /// The completion queue could not hold one more completion: the queue's CQ budget (its
    /// own, or a pool shared with other queues) is taken by outstanding work requests.
    #[error(
        "the completion queue has no room for one more completion: the CQ budget of {capacity} is taken (a shared pool's credits come back as its queues poll)"
    )]
    CqFull {
        /// The caller's payload.
        payload: T,
        /// The CQ budget's capacity (its own, or the shared pool's).
        capacity: u32,
    },
    /// The queue is in the error state.
    #[error("the queue is in the error state: work request {first} completed with {status}")]
    QueueError {
        /// The caller's payload.
        payload: T,
        /// The work request that failed first.
        first: Seq,
        /// Its status.
        status: WcStatus,
    },
    /// The queue is draining.
    #[error("the queue is draining and accepts no more work requests")]
    Draining {
        /// The caller's payload.
        payload: T,
    },
    /// The device was lost ([`SendTracker::device_lost`](crate::SendTracker::device_lost)):
    /// nothing more can be posted on it.
    #[error("the device was lost (a fatal error): nothing more can be posted")]
    DeviceLost {
        /// The caller's payload.
        payload: T,
    },
    /// No sequence number is left (only reachable with a first sequence number near the
    /// end of the sequence numbers, [`TrackerConfig::seq_end`](crate::TrackerConfig::seq_end)).
    #[error("no sequence number left")]
    SeqExhausted {
        /// The caller's payload.
        payload: T,
    },
}

impl<T> PostError<T> {
    /// The caller's payload.
    pub fn into_payload(self) -> T {
        match self {
            PostError::Full { payload, .. }
            | PostError::CqFull { payload, .. }
            | PostError::QueueError { payload, .. }
            | PostError::Draining { payload }
            | PostError::DeviceLost { payload }
            | PostError::SeqExhausted { payload } => payload,
        }
    }

    /// The same error with the payload replaced.
    pub fn map_payload<U>(self, f: impl FnOnce(T) -> U) -> PostError<U> {
        match self {
            PostError::Full { payload, capacity } => PostError::Full {
                payload: f(payload),
                capacity,
            },
            PostError::CqFull { payload, capacity } => PostError::CqFull {
                payload: f(payload),
                capacity,
            },
            PostError::QueueError {
                payload,
                first,
                status,
            } => PostError::QueueError {
                payload: f(payload),
                first,
                status,
            },
            PostError::Draining { payload } => PostError::Draining {
                payload: f(payload),
            },
            PostError::DeviceLost { payload } => PostError::DeviceLost {
                payload: f(payload),
            },
            PostError::SeqExhausted { payload } => PostError::SeqExhausted {
                payload: f(payload),
            },
        }
    }

    /// `true` for the errors that go away once completions are polled (`Full`, `CqFull`).
    pub fn is_full(&self) -> bool {
        matches!(self, PostError::Full { .. } | PostError::CqFull { .. })
    }
}

/// Why a completion was refused. A refused completion changes nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CompletionError {
    /// The completion belongs to another QP (retire per QP, never per CQ).
    #[error("completion for QP {got}, but this send queue is QP {expected}")]
    WrongQueue {
        /// This queue's QP number.
        expected: u32,
        /// The completion's QP number.
        got: u32,
    },
    /// No work request with this id was ever posted.
    #[error("completion for wr_id {wr_id}, which was never posted (next is {next})")]
    Unknown {
        /// The completion's `wr_id`.
        wr_id: u64,
        /// The next sequence number to be posted.
        next: Seq,
    },
    /// A completion of the queue's QP that is not one of the queue's sends (a receive, or
    /// a work request posted on the QP around the queue): see
    /// [`SendTracker::send_seq`](crate::SendTracker::send_seq).
    #[error(
        "completion for wr_id {wr_id} is not a send of this queue (a receive, or a work request posted around it)"
    )]
    NotASend {
        /// The completion's `wr_id`.
        wr_id: u64,
    },
    /// The work request was already retired by an earlier completion.
    #[error("completion for wr_id {wr_id}, which is already retired")]
    AlreadyRetired {
        /// The completion's `wr_id`.
        wr_id: u64,
    },
    /// A successful completion for a work request posted unsignaled.
    #[error("successful completion for wr_id {wr_id}, which was posted unsignaled")]
    Unsignaled {
        /// The completion's `wr_id`.
        wr_id: u64,
    },
    /// An earlier signaled work request has not completed yet: completions of one send
    /// queue arrive in order, so this one cannot come first.
    #[error(
        "completion for wr_id {wr_id} out of order: signaled work request {expected} must complete first"
    )]
    OutOfOrder {
        /// The completion's `wr_id`.
        wr_id: u64,
        /// The earliest signaled work request still outstanding.
        expected: Seq,
    },
    /// A successful completion after the queue went to the error state.
    #[error(
        "successful completion for wr_id {wr_id} after work request {first} failed: the queue is in the error state"
    )]
    SuccessAfterError {
        /// The completion's `wr_id`.
        wr_id: u64,
        /// The work request that failed first.
        first: Seq,
    },
}

/// Why [`SendTracker::rollback`](crate::SendTracker::rollback) was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RollbackError {
    /// The sequence number is not an outstanding work request: it was retired, or never
    /// posted.
    #[error(
        "cannot roll back from {from}: only outstanding work requests {first}..{next} can be handed back"
    )]
    NotOutstanding {
        /// The requested start.
        from: Seq,
        /// The first outstanding sequence number.
        first: Seq,
        /// The next sequence number to be posted.
        next: Seq,
    },
}
