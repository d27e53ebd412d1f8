//! The sans-IO send-queue tracker.
//!
//! See the [crate documentation](crate) for the call order.

use std::time::{Duration, Instant};

use crate::credits::CqBudget;
pub use crate::errors::{CompletionError, ConfigError, PostError, RollbackError};
use crate::policy::{Policy, PolicyError};
pub use crate::seq::Seq;
use crate::stats::{MAX_LAG_NS, Stats};
use crate::wc::{WcStatus, WorkCompletion};

mod types;
mod wrs;
pub use types::{Outcome, Posted, QueueState, Retired, Signal, SignalReason};
use wrs::Wrs;

/// The settings of one tracker.
#[derive(Debug, Clone)]
pub struct TrackerConfig {
    sq_capacity: u32,
    cq: CqBudget,
    policy: Policy,
    sq_sig_all: bool,
    first_seq: u64,
    seq_end: u64,
    wr_id_tag: u64,
    qp_num: Option<u32>,
    measure_lag: bool,
}

impl TrackerConfig {
    /// A send queue of `sq_capacity` slots (the `cap.max_send_wr` read back from QP
    /// creation, never the requested value) reporting to a CQ of its own with
    /// `cq_capacity` slots. Policy `Every(4)`, first sequence number 1.
    pub fn new(sq_capacity: u32, cq_capacity: u32) -> Self {
        TrackerConfig {
            sq_capacity,
            cq: CqBudget::Exclusive(cq_capacity),
            policy: Policy::default(),
            sq_sig_all: false,
            first_seq: 1,
            seq_end: u64::MAX,
            wr_id_tag: 0,
            qp_num: None,
            measure_lag: true,
        }
    }

    /// Sets the signaling policy.
    pub fn policy(mut self, policy: Policy) -> Self {
        self.policy = policy;
        self
    }

    /// Sets the completion-queue budget (e.g. a shared pool).
    pub fn cq(mut self, cq: CqBudget) -> Self {
        self.cq = cq;
        self
    }

    /// The QP was created with `sq_sig_all = 1`: every work request is signaled.
    pub fn sq_sig_all(mut self, yes: bool) -> Self {
        self.sq_sig_all = yes;
        self
    }

    /// The sequence number of the first work request (default 1).
    pub fn first_seq(mut self, seq: u64) -> Self {
        self.first_seq = seq;
        self
    }

    /// Sequence numbers stay below `end` (default `u64::MAX`): posts beyond are refused
    /// with [`PostError::SeqExhausted`]. For a caller that keeps some bits of the `wr_id`
    /// for itself.
    pub fn seq_end(mut self, end: u64) -> Self {
        self.seq_end = end;
        self
    }

    /// Every send's `wr_id` carries this bit (one bit, e.g.
    /// [`SEND_WR_ID_BIT`](crate::SEND_WR_ID_BIT); default none): [`Posted::wr_id`] has it
    /// set, sequence numbers stay below it, and a completion whose `wr_id` lacks it is not
    /// a send of this tracker ([`SendTracker::send_seq`]). It tells sends from receives
    /// on a CQ they share: an error completion's opcode is undefined, its `wr_id` is not.
    pub fn wr_id_tag(mut self, bit: u64) -> Self {
        self.wr_id_tag = bit;
        self
    }

    /// Completions must carry this QP number; others are refused.
    pub fn qp_num(mut self, qp_num: u32) -> Self {
        self.qp_num = Some(qp_num);
        self
    }

    /// Whether to record confirmation lag in [`Stats::lag_ns`] (default `true`). Turn it
    /// off when the `now` given to the tracker is not read from a clock (a caller saving
    /// the clock readings); the `Adaptive` policy still needs a real `now`.
    pub fn measure_lag(mut self, yes: bool) -> Self {
        self.measure_lag = yes;
        self
    }
}

/// What one accepted completion did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Handled {
    /// The first sequence number it retired (markers included): it retired
    /// `first..=seq`.
    pub first: Seq,
    /// The completion's sequence number.
    pub seq: Seq,
    /// Work requests (the caller's, not markers) it retired; [`SendTracker::poll_retired`]
    /// hands them back.
    pub retired: u64,
    /// `true` when this completion moved the queue to the error state.
    pub entered_error: bool,
}

/// Why a slot could not be reserved; turned into a [`PostError`] with the payload.
enum Refusal {
    Full(u32),
    CqFull(u32),
    SeqExhausted,
}

impl Refusal {
    fn with<T>(self, payload: T) -> PostError<T> {
        match self {
            Refusal::Full(capacity) => PostError::Full { payload, capacity },
            Refusal::CqFull(capacity) => PostError::CqFull { payload, capacity },
            Refusal::SeqExhausted => PostError::SeqExhausted { payload },
        }
    }
}

/// Tracks every work request of one RC send queue with selective signaling.
///
/// `T` is the caller's payload (a buffer, an id); the tracker holds it from
/// [`post`](Self::post) until the work request is retired and hands it back through
/// [`poll_retired`](Self::poll_retired).
///
/// The tracker guarantees:
/// - every posted work request gets exactly one [`Outcome`], handed back in posting order;
/// - never more outstanding work requests than the send queue's capacity, and never more
///   than the completion queue can report (every outstanding work request holds a CQ
///   credit, since errors and flushes produce a completion for each);
/// - no deadlock: of any `min(sq_capacity, cq_capacity)` consecutive work requests at least
///   one is signaled, so a full queue always has a signaled work request outstanding; with a
///   shared CQ pool, the work request that takes the pool's last credit is signaled;
/// - impossible completions are refused with a [`CompletionError`] and change nothing.
///
/// No allocation per work request in steady state: the store is sized at creation and
/// only grows if retired work requests are not collected with `poll_retired`.
#[derive(Debug)]
pub struct SendTracker<T> {
    wrs: Wrs<T>,
    first_seq: u64,
    /// Sequence numbers stay below this.
    seq_end: u64,
    /// Set in every send's `wr_id` (0: none).
    wr_id_tag: u64,
    /// Outstanding credits stay taken when dropped ([`Self::keep_credits_on_drop`]).
    keep_credits: bool,
    /// Unsignaled work requests posted since the last signaled one.
    run: u32,
    /// When the first work request of the run was posted (when `run > 0`).
    run_start_ns: u64,
    sq_capacity: u32,
    cq: CqBudget,
    /// Longest unsignaled run allowed by the deadlock rule, plus one.
    run_limit: u32,
    /// The run length (counting the next work request) below which an `Auto` work request
    /// is surely left unsignaled by the policy and the run limit: [`auto_limit`]. 0 where
    /// only the full rule of `decide` can tell (`Adaptive`, `sq_sig_all`).
    auto_limit: u32,
    policy: Policy,
    sq_sig_all: bool,
    qp_num: Option<u32>,
    draining: bool,
    /// The device was lost (`draining` is set too).
    lost: bool,
    error: Option<(Seq, WcStatus)>,
    measure_lag: bool,
    /// Whether `now` is read at all: to measure lag, or for the `Adaptive` policy.
    clocked: bool,
    epoch: Instant,
    /// The last `now` seen and its offset from `epoch` in nanoseconds.
    last_now: Instant,
    last_ns: u64,
    stats: Stats,
}

/// [`SendTracker::auto_limit`] for `policy`: `Every(n)` signals at a run of `n`, the run
/// limit at `run_limit`, whichever comes first; `Always` signals every work request, so
/// none is surely unsignaled (1); `Never` only at the run limit.
fn auto_limit(policy: Policy, run_limit: u32, sq_sig_all: bool) -> u32 {
    match policy {
        _ if sq_sig_all => 0,
        Policy::Every(n) => n.min(run_limit),
        Policy::Always => 1,
        Policy::Never => run_limit,
        Policy::Adaptive { .. } => 0,
    }
}

impl<T> SendTracker<T> {
    /// A tracker for a send queue described by `config`; `now` starts its clock.
    pub fn new(config: TrackerConfig, now: Instant) -> Result<Self, ConfigError> {
        if config.sq_capacity == 0 {
            return Err(ConfigError::ZeroSqCapacity);
        }
        if config.cq.capacity() == 0 {
            return Err(ConfigError::ZeroCqCapacity);
        }
        if config.wr_id_tag != 0 && !config.wr_id_tag.is_power_of_two() {
            return Err(ConfigError::WrIdTag(config.wr_id_tag));
        }
        let seq_end = match config.wr_id_tag {
            0 => config.seq_end,
            tag => config.seq_end.min(tag),
        };
        if config.first_seq >= seq_end {
            return Err(ConfigError::FirstSeqTooHigh { end: seq_end });
        }
        config.policy.validate()?;
        let run_limit = match &config.cq {
            CqBudget::Exclusive(n) => config.sq_capacity.min(*n),
            CqBudget::Shared(_) => config.sq_capacity,
        };
        let Some(wrs) = Wrs::new(config.sq_capacity as usize, config.first_seq) else {
            return Err(ConfigError::TooLarge(config.sq_capacity));
        };
        Ok(SendTracker {
            wrs,
            first_seq: config.first_seq,
            seq_end,
            wr_id_tag: config.wr_id_tag,
            keep_credits: false,
            run: 0,
            run_start_ns: 0,
            sq_capacity: config.sq_capacity,
            cq: config.cq,
            run_limit,
            auto_limit: auto_limit(config.policy, run_limit, config.sq_sig_all),
            policy: config.policy,
            sq_sig_all: config.sq_sig_all,
            qp_num: config.qp_num,
            draining: false,
            lost: false,
            error: None,
            measure_lag: config.measure_lag,
            clocked: config.measure_lag || matches!(config.policy, Policy::Adaptive { .. }),
            epoch: now,
            last_now: now,
            last_ns: 0,
            stats: Stats::new(),
        })
    }

    // ----- getters -------------------------------------------------------------------

    /// The `wr_id` to post work request `seq` with (a marker of
    /// [`confirm_all`](Self::confirm_all) or [`post_marker`](Self::post_marker) too): the
    /// sequence number, with the [`wr_id_tag`](TrackerConfig::wr_id_tag) set.
    #[inline]
    pub const fn wr_id(&self, seq: Seq) -> u64 {
        seq.0 | self.wr_id_tag
    }

    /// The sequence number of the work request `wc` completes, if `wc` can be a
    /// completion of this tracker's sends: its QP (where [`TrackerConfig::qp_num`] is
    /// set), the [`wr_id_tag`](TrackerConfig::wr_id_tag) set in its `wr_id` (where there is
    /// one), and, for a successful completion, not a receive opcode. `None` for anything
    /// else: another QP's completion, a receive's, a send posted around the tracker with
    /// the tag clear. Whether the work request is outstanding is
    /// [`handle_completion`](Self::handle_completion)'s to check.
    ///
    /// An error completion's opcode is undefined (`ibv_poll_cq(3)`: only `wr_id`,
    /// `status`, `qp_num` and `vendor_err` are), so it is not read: where a QP's receive
    /// completions share the CQ of its sends, only the tag tells a send's error or flush
    /// from a receive's, and receives must be posted with the tag clear.
    #[inline]
    pub fn send_seq(&self, wc: &WorkCompletion) -> Option<Seq> {
        if self.qp_num.is_some_and(|q| q != wc.qp_num)
            || wc.status.is_success() && wc.opcode.is_some_and(|o| o.is_recv())
        {
            return None;
        }
        self.seq_of(wc.wr_id)
    }

    /// The sequence number a `wr_id` of this tracker's encoding carries: `None` when the
    /// [`wr_id_tag`](TrackerConfig::wr_id_tag) is not set in it. (For a post the provider
    /// refused: [`rollback`](Self::rollback) from `bad_wr`'s sequence number.)
    #[inline]
    pub const fn seq_of(&self, wr_id: u64) -> Option<Seq> {
        match wr_id & self.wr_id_tag == self.wr_id_tag {
            true => Some(Seq(wr_id & !self.wr_id_tag)),
            false => None,
        }
    }

    /// Work requests posted and not yet retired (each holds a send-queue slot and a CQ
    /// credit).
    #[inline]
    pub fn outstanding(&self) -> u32 {
        // At most sq_capacity entries are outstanding, so this fits.
        self.wrs.outstanding() as u32
    }

    /// Outstanding work requests that were posted signaled.
    pub fn signaled_outstanding(&self) -> u32 {
        self.wrs.signaled_outstanding() as u32
    }

    /// Free send-queue slots.
    #[inline]
    pub fn free_slots(&self) -> u32 {
        self.sq_capacity - self.outstanding()
    }

    /// How many more work requests could be posted now (slots and CQ credits).
    #[inline]
    pub fn available(&self) -> u32 {
        let cq_free = match &self.cq {
            CqBudget::Exclusive(n) => n.saturating_sub(self.outstanding()),
            CqBudget::Shared(pool) => pool.available(),
        };
        self.free_slots().min(cq_free)
    }

    /// The send queue's capacity.
    pub fn sq_capacity(&self) -> u32 {
        self.sq_capacity
    }

    /// `true` when no work request is outstanding.
    pub fn is_idle(&self) -> bool {
        self.outstanding() == 0
    }

    /// Retired work requests not yet collected with [`poll_retired`](Self::poll_retired)
    /// (markers included).
    pub fn pending_retired(&self) -> usize {
        self.wrs.pending() as usize
    }

    /// The sequence number the next post will get.
    pub fn next_seq(&self) -> Seq {
        Seq(self.wrs.next())
    }

    /// The first outstanding sequence number (equal to `next_seq` when idle).
    pub fn first_outstanding(&self) -> Seq {
        Seq(self.wrs.retired_end())
    }

    /// Unsignaled work requests posted since the last signaled one: the tail a
    /// [`confirm_all`](Self::confirm_all) would confirm. Zero in the error state, where
    /// nothing can be confirmed any more.
    pub fn unsignaled_run(&self) -> u32 {
        if self.error.is_some() { 0 } else { self.run }
    }

    /// The queue's state.
    pub fn state(&self) -> QueueState {
        match (self.error, self.draining) {
            _ if self.lost => QueueState::DeviceLost,
            (Some((first, status)), _) => QueueState::Error { first, status },
            (None, true) => QueueState::Draining,
            (None, false) => QueueState::Ready,
        }
    }

    /// The signaling policy.
    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// The completion-queue budget: a CQ (or part of one) of its own, or a pool shared
    /// with other queues.
    pub fn cq_budget(&self) -> &CqBudget {
        &self.cq
    }

    /// Statistics so far.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// The QP number completions must carry, if set.
    pub fn qp_num(&self) -> Option<u32> {
        self.qp_num
    }

    /// When the unsignaled run must be confirmed to keep the `Adaptive` policy's lag
    /// bound: a caller calls [`confirm_all`](Self::confirm_all) at this instant unless it
    /// posts before (the policy checks the lag only when a work request is posted, so a
    /// caller that waits past the deadline for its next post gets the wait added to the
    /// lag). `None` when there is no unsignaled run, the policy has no
    /// deadline, or the queue is in the error state (a draining queue still confirms its
    /// tail).
    pub fn next_deadline(&self) -> Option<Instant> {
        match self.policy {
            Policy::Adaptive { max_lag, .. } if self.run > 0 && self.error.is_none() => {
                // (`None` when it lies beyond what an `Instant` holds: never.)
                self.epoch
                    .checked_add(Duration::from_nanos(self.run_start_ns))?
                    .checked_add(max_lag)
            }
            _ => None,
        }
    }

    // ----- inputs --------------------------------------------------------------------

    /// Changes the signaling policy from the next post on.
    ///
    /// A tracker that measures no lag reads `now` only for the `Adaptive` policy: switched
    /// to it, an unsignaled run already posted counts as started when the tracker was
    /// created (it is confirmed at the next chance).
    pub fn set_policy(&mut self, policy: Policy) -> Result<(), PolicyError> {
        policy.validate()?;
        self.policy = policy;
        self.auto_limit = auto_limit(policy, self.run_limit, self.sq_sig_all);
        self.clocked = self.measure_lag || matches!(policy, Policy::Adaptive { .. });
        Ok(())
    }

    /// Sets the QP number completions must carry.
    pub fn set_qp_num(&mut self, qp_num: u32) {
        self.qp_num = Some(qp_num);
    }

    /// Registers one work request about to be posted and decides whether it is signaled.
    ///
    /// Post it with `wr_id = posted.wr_id` and `IBV_SEND_SIGNALED` when
    /// `posted.signaled()`. If the provider refuses it (or a later one of the same batch),
    /// hand it back with [`rollback`](Self::rollback).
    #[inline]
    pub fn post(
        &mut self,
        payload: T,
        signal: Signal,
        now: Instant,
    ) -> Result<Posted, PostError<T>> {
        if let Some((first, status)) = self.error {
            return Err(PostError::QueueError {
                payload,
                first,
                status,
            });
        }
        if self.draining {
            return Err(match self.lost {
                true => PostError::DeviceLost { payload },
                false => PostError::Draining { payload },
            });
        }
        self.push(payload, signal, now)
    }

    /// [`post`](Self::post) for each payload of a batch, in order, with the clock read
    /// once: `signal` applies to the last of them, the others are [`Signal::Auto`]. Each
    /// decision goes to `f` as it is made; post those work requests in that order. Stops
    /// at the first one `post` would refuse and returns its error with its payload: the
    /// payloads after it are not taken from the iterator. Where nothing can refuse one
    /// part-way (room for them all, no shared CQ pool), the checks are made once for the
    /// batch.
    #[inline]
    pub fn post_batch<I>(
        &mut self,
        payloads: I,
        signal: Signal,
        now: Instant,
        mut f: impl FnMut(Posted),
    ) -> Result<(), PostError<T>>
    where
        I: IntoIterator<Item = T>,
        I::IntoIter: ExactSizeIterator,
    {
        let mut payloads = payloads.into_iter();
        let n = payloads.len();
        let signal_of = |i: usize| match i + 1 == n {
            true => signal,
            false => Signal::Auto,
        };
        let room = (self.reserved_room() as usize).min(n);
        let now_ns = self.nanos(now);
        let mut i = 0;
        while i < room {
            // Those surely unsignaled in one go (not the last: `signal` is its), then one.
            let quiet = self.quiet_room((n - 1 - i).min(room - i));
            if quiet > 0 {
                let pushed = self.push_quiet(&mut payloads, quiet, now_ns, &mut f);
                i += pushed;
                if pushed < quiet {
                    return Ok(());
                }
                continue;
            }
            let Some(payload) = payloads.next() else {
                return Ok(());
            };
            f(self.push_reserved(payload, signal_of(i), now_ns));
            i += 1;
        }
        for (i, payload) in payloads.enumerate() {
            f(self.post(payload, signal_of(room + i), now)?);
        }
        Ok(())
    }

    /// Posts a zero-length signaled marker if the unsignaled run is not empty; its
    /// completion confirms every earlier work request. Post it as a signaled zero-length
    /// RDMA WRITE with `wr_id = seq`. `Ok(None)`: nothing to confirm beyond what is
    /// already signaled; poll until [`is_idle`](Self::is_idle).
    pub fn confirm_all(&mut self, now: Instant) -> Result<Option<Seq>, PostError<()>> {
        if let Some((first, status)) = self.error {
            return Err(PostError::QueueError {
                payload: (),
                first,
                status,
            });
        }
        if self.run == 0 {
            return Ok(None);
        }
        self.post_marker(now).map(Some)
    }

    /// Posts a zero-length signaled marker, in any state: its completion (success, or a
    /// flush in the error state) retires every earlier work request. Used to drain a queue
    /// in the error state: move the QP to the error state, post the marker, wait for its
    /// completion (like the kernel's `ib_drain_sq`). Needs one slot and one CQ credit.
    pub fn post_marker(&mut self, now: Instant) -> Result<Seq, PostError<()>> {
        if self.lost {
            return Err(PostError::DeviceLost { payload: () });
        }
        self.reserve().map_err(|refusal| refusal.with(()))?;
        let now_ns = self.nanos(now);
        self.wrs.stamp(now_ns);
        self.wrs.push_marker();
        self.run = 0;
        self.stats.markers += 1;
        Ok(Seq(self.wrs.next() - 1))
    }

    /// Stops accepting posts; markers are still accepted. Outstanding work requests retire
    /// as their completions arrive.
    pub fn start_drain(&mut self) {
        self.draining = true;
    }

    /// The device was lost (a fatal error: `IBV_EVENT_DEVICE_FATAL`, or the provider's
    /// [`device_lost`](crate::CompletionQueue::device_lost)): every outstanding work
    /// request retires as [`Outcome::DeviceLost`], in posting order, and the queue
    /// refuses every later post ([`PostError::DeviceLost`]). Returns how many of the
    /// caller's work requests it retired (markers are not counted); 0 when called again.
    ///
    /// Handle the completions already polled first: a completion the device wrote before
    /// it failed is the truth about its work requests. None can come after this: one that
    /// does is refused ([`CompletionError::AlreadyRetired`]).
    pub fn device_lost(&mut self) -> u64 {
        if self.lost {
            return 0;
        }
        self.lost = true;
        self.draining = true;
        let count = self.outstanding();
        let user = self.wrs.retire_all(Outcome::DeviceLost);
        self.stats.lost += user;
        self.run = 0;
        self.release_credits(count);
        user
    }

    /// Hands back the work requests from `from` on, which the provider did not post (a
    /// partly failed batch: `bad_wr` and everything after it). They are forgotten as if
    /// never posted, and their payloads come back in posting order, markers left out.
    pub fn rollback(&mut self, from: Seq) -> Result<impl Iterator<Item = T> + '_, RollbackError> {
        let (first, next) = (self.wrs.retired_end(), self.wrs.next());
        if from.0 < first || from.0 > next {
            return Err(RollbackError::NotOutstanding {
                from,
                first: Seq(first),
                next: Seq(next),
            });
        }
        let stats = &mut self.stats;
        let user = self.wrs.truncate(from.0, |reason| match reason {
            SignalReason::Marker => stats.markers -= 1,
            reason => {
                stats.signaled -= 1;
                match reason {
                    SignalReason::Requested => stats.requested -= 1,
                    SignalReason::Deadlock | SignalReason::CqCredit => stats.forced -= 1,
                    _ => {}
                }
            }
        });
        self.stats.posted -= user as u64;
        self.release_credits((next - from.0) as u32);
        // The new run: the unsignaled outstanding work requests at the end of what stays.
        let run_start = self
            .wrs
            .last_signaled()
            .map_or(first, |s| (s + 1).max(first));
        self.run = (from.0 - run_start) as u32;
        if self.run > 0 {
            self.run_start_ns = self.wrs.posted_ns(run_start);
        }
        Ok(self.wrs.take_back(user))
    }

    /// Handles one completion of this send queue, retiring every work request it covers.
    /// Collect them with [`poll_retired`](Self::poll_retired).
    ///
    /// - success for `k` (signaled): retires everything up to `k` as completed;
    /// - error for `k`: everything before `k` completed, `k` failed, the queue enters the
    ///   error state; already in it (a second error), everything before `k` flushed and
    ///   `k` failed;
    /// - flush for `k`: in the error state, everything up to `k` flushed; otherwise (the QP
    ///   was moved to the error state without an error completion) everything before `k`
    ///   completed and `k` flushed, and the queue enters the error state.
    ///
    /// A completion that is not one of this tracker's sends (see
    /// [`send_seq`](Self::send_seq)) is refused: another QP's with
    /// [`CompletionError::WrongQueue`], any other with [`CompletionError::NotASend`].
    pub fn handle_completion(
        &mut self,
        wc: &WorkCompletion,
        now: Instant,
    ) -> Result<Handled, CompletionError> {
        let seq = match self.send_seq(wc) {
            Some(seq) => seq,
            None => {
                self.stats.rejected_cqes += 1;
                return Err(match self.qp_num {
                    Some(expected) if expected != wc.qp_num => CompletionError::WrongQueue {
                        expected,
                        got: wc.qp_num,
                    },
                    _ => CompletionError::NotASend { wr_id: wc.wr_id },
                });
            }
        };
        self.handle_send(seq, wc, now)
    }

    /// [`handle_completion`](Self::handle_completion) of a completion whose sequence
    /// number [`send_seq`](Self::send_seq) found.
    #[inline]
    pub(crate) fn handle_send(
        &mut self,
        seq: Seq,
        wc: &WorkCompletion,
        now: Instant,
    ) -> Result<Handled, CompletionError> {
        // The common completion: a success for the earliest outstanding signaled work
        // request (which `check_completion` would accept).
        if wc.status == WcStatus::Success
            && self.error.is_none()
            && self.wrs.earliest_signaled() == Some(seq.0)
        {
            return Ok(self.handle_success(seq.0, now));
        }
        let seq = match self.check_completion(seq.0, wc) {
            Ok(seq) => seq,
            Err(e) => {
                self.stats.rejected_cqes += 1;
                return Err(e);
            }
        };
        let now_ns = self.nanos(now);
        let (before, this, entered_error) = match (wc.status, self.error) {
            (WcStatus::Success, _) => {
                self.stats.success_cqes += 1;
                (Outcome::Completed, Outcome::Completed, false)
            }
            (WcStatus::WrFlushErr, None) => {
                self.stats.flush_cqes += 1;
                (Outcome::Completed, Outcome::Flushed, true)
            }
            (WcStatus::WrFlushErr, Some(_)) => {
                self.stats.flush_cqes += 1;
                (Outcome::Flushed, Outcome::Flushed, false)
            }
            (status, None) => {
                self.stats.error_cqes += 1;
                (Outcome::Completed, Outcome::Failed(status), true)
            }
            (status, Some(_)) => {
                self.stats.error_cqes += 1;
                (Outcome::Flushed, Outcome::Failed(status), false)
            }
        };
        self.stats.cqes += 1;
        if entered_error {
            self.error = Some((Seq(seq), wc.status));
        }
        let first = self.wrs.retired_end();
        let count = seq + 1 - first;
        let (user, own_user) = self.retire(seq, (before, this), now_ns);
        let own_user = u64::from(own_user);
        for (outcome, n) in [(before, user - own_user), (this, own_user)] {
            match outcome {
                Outcome::Completed => self.stats.completed += n,
                Outcome::Failed(_) => self.stats.failed += n,
                Outcome::Flushed => self.stats.flushed += n,
                Outcome::DeviceLost => self.stats.lost += n,
            }
        }
        self.stats.wrs_per_cqe.saturating_record(user);
        self.release_credits(count as u32);
        Ok(Handled {
            first: Seq(first),
            seq: Seq(seq),
            retired: user,
            entered_error,
        })
    }

    /// Retires the outstanding work requests up to `seq` with `outcomes` (see
    /// [`Wrs::retire`]), recording their lags at `now_ns` where lags are measured: a run of
    /// work requests posted at one instant (a batch) at a time.
    #[inline(always)]
    fn retire(&mut self, seq: u64, outcomes: (Outcome, Outcome), now_ns: u64) -> (u64, bool) {
        let lag_ns = &mut self.stats.lag_ns;
        let record = |posted_ns: u64, n: u64| {
            let lag = now_ns.saturating_sub(posted_ns).min(MAX_LAG_NS);
            lag_ns.saturating_record_n(lag, n);
        };
        self.wrs.retire(seq, outcomes, self.measure_lag, record)
    }

    /// [`handle_send`](Self::handle_send) of a success for `seq`, the earliest
    /// outstanding signaled work request.
    #[inline]
    fn handle_success(&mut self, seq: u64, now: Instant) -> Handled {
        let now_ns = self.nanos(now);
        let first = self.wrs.retired_end();
        let completed = (Outcome::Completed, Outcome::Completed);
        let (user, _) = self.retire(seq, completed, now_ns);
        self.stats.cqes += 1;
        self.stats.success_cqes += 1;
        self.stats.completed += user;
        self.stats.wrs_per_cqe.saturating_record(user);
        self.release_credits((seq + 1 - first) as u32);
        Handled {
            first: Seq(first),
            seq: Seq(seq),
            retired: user,
            entered_error: false,
        }
    }

    // ----- outputs -------------------------------------------------------------------

    /// The next retired work request, in posting order, with its payload and outcome.
    /// Call until `None` after handling completions.
    #[inline]
    pub fn poll_retired(&mut self) -> Option<Retired<T>> {
        loop {
            let taken = self.wrs.take()?;
            if let Some(payload) = taken.payload {
                return Some(Retired {
                    seq: Seq(taken.seq),
                    payload,
                    outcome: taken.outcome,
                    signaled: taken.signaled,
                });
            }
        }
    }

    /// Hands every retired work request to `f`, in posting order: what calling
    /// [`poll_retired`](Self::poll_retired) until `None` hands back, in one call (the
    /// faster way to collect many). If `f` panics, the work request it was handed is its
    /// own, and the ones after it stay retired for the next poll: none is dropped.
    #[inline]
    pub fn poll_retired_with(&mut self, mut f: impl FnMut(Retired<T>)) {
        loop {
            let (plain, outcome) = self.wrs.plain();
            self.wrs.take_plain(plain, |seq, payload, signaled| {
                f(Retired {
                    seq: Seq(seq),
                    payload,
                    outcome,
                    signaled,
                })
            });
            let Some(taken) = self.wrs.take() else {
                return;
            };
            if let Some(payload) = taken.payload {
                f(Retired {
                    seq: Seq(taken.seq),
                    payload,
                    outcome: taken.outcome,
                    signaled: taken.signaled,
                });
            }
        }
    }

    /// Hands `f` the payloads of the retired work requests that completed, in posting
    /// order, at most `max`, stopping before the first retired one that did not (failed,
    /// flushed, lost), which [`poll_retired`](Self::poll_retired) then hands back with its
    /// outcome; how many it handed. The fast path where only the payloads matter: a work
    /// request handed here completed. If `f` panics, the work request it was handed is its
    /// own, and the ones after it stay retired: none is dropped.
    #[inline]
    pub fn poll_completed_with(&mut self, max: usize, mut f: impl FnMut(T)) -> usize {
        let mut handed = 0;
        while handed < max {
            let (plain, outcome) = self.wrs.plain();
            if plain > 0 {
                if outcome != Outcome::Completed {
                    return handed;
                }
                // At least one work request, and no more payloads than `max` allows (a
                // marker among them has none: the loop goes on).
                let n = plain.min((max - handed) as u64);
                self.wrs.take_plain(n, |_, payload, _| {
                    handed += 1;
                    f(payload);
                });
                continue;
            }
            match self.wrs.peek() {
                None => return handed,
                Some((_, true)) => {}
                Some((Outcome::Completed, false)) => {}
                Some(_) => return handed,
            }
            if let Some(payload) = self.wrs.take().and_then(|t| t.payload) {
                handed += 1;
                f(payload);
            }
        }
        handed
    }

    // ----- internals -----------------------------------------------------------------

    #[inline]
    fn nanos(&mut self, now: Instant) -> u64 {
        if !self.clocked {
            return 0;
        }
        // Callers pass one `now` for a whole batch: convert it once.
        if now != self.last_now {
            // u64 nanoseconds last 584 years; saturate rather than wrap beyond.
            let since = now.saturating_duration_since(self.epoch);
            self.last_ns = since
                .as_secs()
                .saturating_mul(1_000_000_000)
                .saturating_add(u64::from(since.subsec_nanos()));
            self.last_now = now;
        }
        self.last_ns
    }

    /// Whether the completion `wc` of send `seq` is possible now (its errors name the
    /// completion's `wr_id`, as polled).
    fn check_completion(&self, seq: u64, wc: &WorkCompletion) -> Result<u64, CompletionError> {
        let wr_id = wc.wr_id;
        if seq >= self.wrs.next() || seq < self.first_seq {
            return Err(CompletionError::Unknown {
                wr_id,
                next: Seq(self.wrs.next()),
            });
        }
        if seq < self.wrs.retired_end() {
            return Err(CompletionError::AlreadyRetired { wr_id });
        }
        let earliest_signaled = self.wrs.earliest_signaled();
        match (wc.status, self.error) {
            (WcStatus::Success, Some((first, _))) => {
                Err(CompletionError::SuccessAfterError { wr_id, first })
            }
            (WcStatus::Success, None) if earliest_signaled == Some(seq) => Ok(seq),
            (WcStatus::Success, None) => match self.wrs.is_signaled(seq) {
                false => Err(CompletionError::Unsignaled { wr_id }),
                // `seq` is signaled and outstanding, and something earlier is signaled.
                true => Err(CompletionError::OutOfOrder {
                    wr_id,
                    expected: Seq(earliest_signaled.unwrap_or(seq)),
                }),
            },
            // The first error (or flush) completion: every earlier signaled work request
            // must have completed before it.
            (_, None) => match earliest_signaled {
                Some(s) if s < seq => Err(CompletionError::OutOfOrder {
                    wr_id,
                    expected: Seq(s),
                }),
                _ => Ok(seq),
            },
            // In the error state every outstanding work request ends flushed (IBTA
            // 10.7.3.1): a completion for `k` retires everything up to it.
            (_, Some(_)) => Ok(seq),
        }
    }

    /// Takes a slot and a CQ credit for one more work request; `Ok(true)` when it took the
    /// last credit of a shared pool.
    #[inline]
    fn reserve(&mut self) -> Result<bool, Refusal> {
        let outstanding = self.outstanding();
        if outstanding >= self.sq_capacity {
            return Err(Refusal::Full(self.sq_capacity));
        }
        if self.wrs.next() == self.seq_end {
            return Err(Refusal::SeqExhausted);
        }
        match &self.cq {
            CqBudget::Exclusive(n) if outstanding >= *n => Err(Refusal::CqFull(*n)),
            CqBudget::Exclusive(_) => Ok(false),
            CqBudget::Shared(pool) => match pool.try_acquire(1) {
                Some(left) => Ok(left == 0),
                None => Err(Refusal::CqFull(pool.capacity())),
            },
        }
    }

    /// How many work requests [`push_reserved`](Self::push_reserved) may register now, all
    /// of them taken without a refusal: the free slots, CQ credits and sequence numbers,
    /// when nothing can refuse one part-way. 0 in the error state, while draining, and on
    /// a shared CQ pool (other queues take credits meanwhile, and the last credit forces
    /// a signal): post one at a time with [`post`](Self::post) there.
    #[inline]
    pub(crate) fn reserved_room(&self) -> u32 {
        if self.error.is_some() || self.draining {
            return 0;
        }
        match &self.cq {
            CqBudget::Exclusive(n) => {
                let outstanding = self.outstanding();
                let seqs = u32::try_from(self.seq_end - self.wrs.next()).unwrap_or(u32::MAX);
                self.sq_capacity
                    .min(*n)
                    .saturating_sub(outstanding)
                    .min(seqs)
            }
            CqBudget::Shared(_) => 0,
        }
    }

    /// `now` in the tracker's nanoseconds, for [`push_reserved`](Self::push_reserved): read
    /// once for a batch.
    #[inline]
    pub(crate) fn nanos_of(&mut self, now: Instant) -> u64 {
        self.nanos(now)
    }

    /// [`post`](Self::post) without its checks, for one of the
    /// [`reserved_room`](Self::reserved_room) work requests the caller was told it may
    /// register (with no other call to the tracker since but `push_reserved`, and fewer of
    /// them than the room).
    #[inline(always)]
    pub(crate) fn push_reserved(&mut self, payload: T, signal: Signal, now_ns: u64) -> Posted {
        debug_assert!(self.error.is_none() && !self.draining);
        debug_assert!(matches!(self.reserve(), Ok(false)), "no room reserved");
        let reason = self.decide(signal, false, now_ns);
        self.record_post(payload, reason, now_ns);
        let seq = self.wrs.next() - 1;
        Posted {
            wr_id: seq | self.wr_id_tag,
            seq: Seq(seq),
            signal: reason,
        }
    }

    /// How many of the next `limit` work requests [`push_reserved`](Self::push_reserved)
    /// would surely leave unsignaled, with [`Signal::Auto`]: what `decide` finds without
    /// its full rule, for each of them.
    #[inline]
    fn quiet_room(&self, limit: usize) -> usize {
        let by_policy = self.auto_limit.saturating_sub(self.run + 1) as u64;
        let by_seq = self.seq_end - self.wrs.next() - 1;
        (limit as u64).min(by_policy).min(by_seq) as usize
    }

    /// [`push_reserved`](Self::push_reserved) with [`Signal::Auto`] for up to `k` payloads
    /// of `payloads`, which [`quiet_room`](Self::quiet_room) allowed, each decision handed
    /// to `f`; how many it took.
    #[inline(always)]
    fn push_quiet(
        &mut self,
        payloads: &mut impl Iterator<Item = T>,
        k: usize,
        now_ns: u64,
        f: &mut impl FnMut(Posted),
    ) -> usize {
        /// Counts the work requests taken, also when `f` unwinds.
        struct Counts<'a> {
            run: &'a mut u32,
            posted: &'a mut u64,
            n: u32,
        }
        impl Drop for Counts<'_> {
            fn drop(&mut self) {
                *self.run += self.n;
                *self.posted += u64::from(self.n);
            }
        }
        self.wrs.stamp(now_ns);
        if self.run == 0 {
            self.run_start_ns = now_ns;
        }
        let tag = self.wr_id_tag;
        let mut counts = Counts {
            run: &mut self.run,
            posted: &mut self.stats.posted,
            n: 0,
        };
        self.wrs.push_run(payloads, k, |seq| {
            counts.n += 1;
            f(Posted {
                wr_id: seq | tag,
                seq: Seq(seq),
                signal: None,
            })
        })
    }

    #[inline(always)]
    fn push(&mut self, payload: T, signal: Signal, now: Instant) -> Result<Posted, PostError<T>> {
        let last_credit = match self.reserve() {
            Ok(last_credit) => last_credit,
            Err(refusal) => return Err(refusal.with(payload)),
        };
        let now_ns = self.nanos(now);
        let reason = self.decide(signal, last_credit, now_ns);
        self.record_post(payload, reason, now_ns);
        let seq = self.wrs.next() - 1;
        Ok(Posted {
            wr_id: seq | self.wr_id_tag,
            seq: Seq(seq),
            signal: reason,
        })
    }

    /// Whether the next work request is signaled, and why.
    #[inline]
    fn decide(&self, signal: Signal, last_credit: bool, now_ns: u64) -> Option<SignalReason> {
        let run_after = self.run + 1;
        // Most work requests: no policy signal and no run limit due, nor the last sequence
        // number; what follows would find the same, with more checks.
        if signal == Signal::Auto
            && run_after < self.auto_limit
            && self.wrs.next() + 1 != self.seq_end
        {
            return last_credit.then_some(SignalReason::CqCredit);
        }
        let by_policy = match self.policy {
            Policy::Every(n) => run_after >= n,
            Policy::Always => true,
            Policy::Never => false,
            Policy::Adaptive {
                max_unsignaled,
                max_lag,
            } => {
                // A lag bound of zero: a work request posted unsignaled would already be
                // past it.
                run_after >= max_unsignaled
                    || max_lag.is_zero()
                    || (self.run > 0
                        && u128::from(now_ns.saturating_sub(self.run_start_ns))
                            >= max_lag.as_nanos())
            }
        };
        if self.sq_sig_all {
            Some(SignalReason::SqSigAll)
        } else if signal == Signal::Force {
            Some(SignalReason::Requested)
        } else if by_policy {
            Some(SignalReason::Policy)
        } else if run_after >= self.run_limit || self.wrs.next() == self.seq_end - 1 {
            // The run limit, or the last sequence number: no later marker could confirm an
            // unsignaled run.
            Some(SignalReason::Deadlock)
        } else if last_credit {
            Some(SignalReason::CqCredit)
        } else {
            None
        }
    }

    /// Registers one of the caller's work requests, signaled for `signal` or not.
    #[inline(always)]
    fn record_post(&mut self, payload: T, signal: Option<SignalReason>, now_ns: u64) {
        self.wrs.stamp(now_ns);
        self.wrs.push(payload, signal);
        self.stats.posted += 1;
        match signal {
            Some(reason) => {
                self.run = 0;
                self.stats.signaled += 1;
                match reason {
                    SignalReason::Requested => self.stats.requested += 1,
                    SignalReason::Deadlock | SignalReason::CqCredit => self.stats.forced += 1,
                    _ => {}
                }
            }
            None => {
                if self.run == 0 {
                    self.run_start_ns = now_ns;
                }
                self.run += 1;
            }
        }
    }

    /// When the tracker is dropped, its outstanding work requests keep their credits of a
    /// shared pool taken, instead of giving them back: for a QP whose completions may still
    /// reach (or stay in) the CQ, such as a QP not destroyed, or destroyed on a provider
    /// that leaves its completions in the CQ (rxe).
    pub fn keep_credits_on_drop(&mut self) {
        self.keep_credits = true;
    }

    fn release_credits(&mut self, n: u32) {
        if let CqBudget::Shared(pool) = &self.cq {
            // Every credit given back was taken for a work request. The pool may still be
            // full already, where its caller gave back credits of its own too many
            // (`CqCredits::release` is public): it ignores the excess, and so does this,
            // rather than fail a poll for the caller's mistake.
            pool.release(n);
        }
    }
}

impl<T> Drop for SendTracker<T> {
    fn drop(&mut self) {
        // Outstanding work requests of a shared pool give their credits back, unless
        // their completions may still come.
        if !self.keep_credits {
            let outstanding = self.outstanding();
            self.release_credits(outstanding);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::credits::CqCredits;
    use crate::wc::WcOpcode;

    fn tracker(sq: u32, cq: u32, policy: Policy) -> (SendTracker<u64>, Instant) {
        let now = Instant::now();
        let t = SendTracker::new(TrackerConfig::new(sq, cq).policy(policy).qp_num(7), now)
            .expect("valid config");
        (t, now)
    }

    fn wc(seq: u64, status: WcStatus) -> WorkCompletion {
        WorkCompletion::new(seq, status, 7)
    }

    fn post_n(t: &mut SendTracker<u64>, now: Instant, n: u64) -> Vec<Posted> {
        (0..n)
            .map(|_| {
                let id = t.next_seq().0;
                t.post(id, Signal::Auto, now).expect("room to post")
            })
            .collect()
    }

    fn drain(t: &mut SendTracker<u64>) -> Vec<(u64, Outcome)> {
        std::iter::from_fn(|| t.poll_retired())
            .map(|r| {
                assert_eq!(r.seq.0, r.payload, "payload travels with its seq");
                (r.payload, r.outcome)
            })
            .collect()
    }

    /// A lost device retires everything outstanding, signaled or not, markers silently, as
    /// `DeviceLost`, after what completions already said; nothing more is accepted.
    #[test]
    fn a_lost_device_retires_every_outstanding_work_request_as_device_lost() {
        let (mut t, now) = tracker(16, 16, Policy::Every(4));
        post_n(&mut t, now, 6); // 4 signaled
        t.handle_completion(&wc(4, WcStatus::Success), now).unwrap();
        t.confirm_all(now).unwrap(); // marker 7 behind 5 and 6
        assert_eq!(t.device_lost(), 2, "5 and 6; the marker is not counted");
        assert_eq!(t.state(), QueueState::DeviceLost);
        assert!(t.is_idle());
        let outcomes = drain(&mut t);
        let expected: Vec<_> = (1..=4)
            .map(|s| (s, Outcome::Completed))
            .chain((5..=6).map(|s| (s, Outcome::DeviceLost)))
            .collect();
        assert_eq!(outcomes, expected);
        assert_eq!((t.stats().completed, t.stats().lost), (4, 2));
        assert_eq!(t.stats().retired(), 6);
        // Nothing is accepted any more, and the payload comes back.
        match t.post(9, Signal::Auto, now) {
            Err(PostError::DeviceLost { payload: 9 }) => {}
            other => panic!("expected DeviceLost, got {other:?}"),
        }
        assert!(matches!(
            t.post_marker(now),
            Err(PostError::DeviceLost { .. })
        ));
        assert_eq!(t.confirm_all(now).unwrap(), None);
        // A completion the device wrote before it failed, handled late, is refused.
        assert_eq!(
            t.handle_completion(&wc(7, WcStatus::Success), now),
            Err(CompletionError::AlreadyRetired { wr_id: 7 })
        );
        assert_eq!(t.device_lost(), 0, "once only");
        assert_eq!(Outcome::DeviceLost.to_string(), "device_lost");
    }

    /// A lost device gives back the shared pool's credits of its outstanding work
    /// requests: no completion will come to take them, and the pool's other queues go on.
    #[test]
    fn a_lost_device_gives_the_pool_its_credits_back() {
        let pool = CqCredits::new(8);
        let now = Instant::now();
        let config = TrackerConfig::new(16, 8)
            .cq(CqBudget::Shared(pool.clone()))
            .policy(Policy::Every(4));
        let mut t = SendTracker::new(config, now).expect("valid config");
        post_n(&mut t, now, 5);
        assert_eq!(pool.available(), 3);
        assert_eq!(t.device_lost(), 5);
        assert_eq!(pool.available(), 8);
        drop(t);
        assert_eq!(pool.available(), 8, "not given back twice");
    }

    /// A panic in the caller's closure ends that pass: the work request it was handed is
    /// the closure's, and every later one is handed back by the next poll, none lost.
    #[test]
    fn a_panic_in_poll_retired_with_leaves_the_rest_for_the_next_poll() {
        let (mut t, now) = tracker(16, 16, Policy::Every(8));
        post_n(&mut t, now, 8);
        t.handle_completion(&wc(8, WcStatus::Success), now).unwrap();
        let mut handed = Vec::new();
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            t.poll_retired_with(|r| {
                assert!(r.payload != 3, "the caller's closure fails on 3");
                handed.push(r.payload);
            })
        }))
        .is_err();
        assert!(panicked);
        assert_eq!(handed, [1, 2]);
        let mut rest = Vec::new();
        t.poll_retired_with(|r| rest.push((r.seq.0, r.payload, r.outcome)));
        let expected: Vec<_> = (4..=8).map(|s| (s, s, Outcome::Completed)).collect();
        assert_eq!(rest, expected);
        assert_eq!(t.pending_retired(), 0);
        assert!(t.poll_retired().is_none());
        // The tracker goes on: the next work request is 9, and its completion retires it.
        let posted = t.post(9, Signal::Force, now).unwrap();
        assert_eq!(posted.seq, Seq(9));
        t.handle_completion(&wc(9, WcStatus::Success), now).unwrap();
        assert_eq!(drain(&mut t), [(9, Outcome::Completed)]);
    }

    /// What the tracker's store holds (docs/performance.md states it): a slot per work
    /// request (its payload and whether it was signaled, or a marker), and beside the slots
    /// an entry per outstanding signaled work request and one per post instant.
    #[test]
    fn an_outstanding_work_request_takes_16_bytes_with_a_u64_payload() {
        assert_eq!(wrs::SLOT_BYTES_U64, 16);
        assert_eq!(wrs::PER_SIGNALED_BYTES, 16);
        assert_eq!(wrs::PER_INSTANT_BYTES, 16);
    }

    /// A rollback's payloads that the caller does not take from the iterator are dropped
    /// with it, not kept until their slots are used again.
    #[test]
    fn a_rollback_drops_the_payloads_not_taken_with_its_iterator() {
        let now = Instant::now();
        let mut t: SendTracker<std::rc::Rc<()>> =
            SendTracker::new(TrackerConfig::new(8, 8), now).unwrap();
        let payload = std::rc::Rc::new(());
        for _ in 0..4 {
            t.post(std::rc::Rc::clone(&payload), Signal::Auto, now)
                .unwrap();
        }
        assert_eq!(std::rc::Rc::strong_count(&payload), 5);
        let mut back = t.rollback(Seq(1)).unwrap();
        assert!(back.next().is_some());
        drop(back);
        assert_eq!(std::rc::Rc::strong_count(&payload), 1);
        assert_eq!(t.outstanding(), 0);
    }

    /// `poll_completed_with`'s `max` counts payloads handed, not work requests passed: a
    /// marker among the completed ones takes none of it.
    #[test]
    fn poll_completed_with_hands_max_payloads_past_a_marker() {
        let (mut t, now) = tracker(8, 8, Policy::Never);
        post_n(&mut t, now, 2);
        let marker = t.confirm_all(now).unwrap().unwrap();
        assert_eq!(marker, Seq(3));
        post_n(&mut t, now, 1);
        let last = t.post(5, Signal::Force, now).unwrap();
        t.handle_completion(&wc(3, WcStatus::Success), now).unwrap();
        t.handle_completion(&wc(last.wr_id, WcStatus::Success), now)
            .unwrap();
        let mut handed = Vec::new();
        assert_eq!(t.poll_completed_with(3, |p| handed.push(p)), 3);
        assert_eq!(handed, [1, 2, 4]);
        assert_eq!(t.poll_completed_with(3, |p| handed.push(p)), 1);
        assert_eq!(handed, [1, 2, 4, 5]);
        assert_eq!(t.pending_retired(), 0);
    }

    /// The same for `poll_completed_with`: the payload the closure failed on is its own,
    /// the rest come back from the next poll, with their sequence numbers.
    #[test]
    fn a_panic_in_poll_completed_with_leaves_the_rest_for_the_next_poll() {
        let (mut t, now) = tracker(16, 16, Policy::Every(8));
        post_n(&mut t, now, 8);
        t.handle_completion(&wc(8, WcStatus::Success), now).unwrap();
        let mut handed = Vec::new();
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            t.poll_completed_with(usize::MAX, |p| {
                assert!(p != 3, "the caller's closure fails on 3");
                handed.push(p);
            })
        }))
        .is_err();
        assert!(panicked);
        assert_eq!(handed, [1, 2]);
        assert_eq!(t.poll_completed_with(2, |p| handed.push(p)), 2);
        assert_eq!(handed, [1, 2, 4, 5]);
        let rest: Vec<_> = std::iter::from_fn(|| t.poll_retired())
            .map(|r| (r.seq.0, r.payload, r.outcome))
            .collect();
        let expected: Vec<_> = (6..=8).map(|s| (s, s, Outcome::Completed)).collect();
        assert_eq!(rest, expected);
        assert_eq!(t.pending_retired(), 0);
        assert_eq!(t.poll_completed_with(usize::MAX, |_| unreachable!()), 0);
    }

    #[test]
    fn handled_names_only_the_work_requests_this_completion_retired() {
        let (mut t, now) = tracker(16, 16, Policy::Every(4));
        post_n(&mut t, now, 8); // 4 and 8 signaled
        let h = t.handle_completion(&wc(4, WcStatus::Success), now).unwrap();
        assert_eq!((h.first, h.seq, h.retired), (Seq(1), Seq(4), 4));
        // WRs 1..=4 are not collected yet: the next completion still names only 5..=8.
        let h = t.handle_completion(&wc(8, WcStatus::Success), now).unwrap();
        assert_eq!(
            (h.first, h.seq, h.retired, h.entered_error),
            (Seq(5), Seq(8), 4, false)
        );
        assert_eq!(
            drain(&mut t),
            (1..=8).map(|s| (s, Outcome::Completed)).collect::<Vec<_>>()
        );
    }

    #[test]
    fn seed_example_every_4_signals_wr4_and_wr8() {
        let (mut t, now) = tracker(16, 16, Policy::Every(4));
        let posted = post_n(&mut t, now, 8);
        let signaled: Vec<u64> = posted
            .iter()
            .filter(|p| p.signaled())
            .map(|p| p.seq.0)
            .collect();
        assert_eq!(signaled, [4, 8]);
        assert_eq!(t.outstanding(), 8);

        let h = t.handle_completion(&wc(4, WcStatus::Success), now).unwrap();
        assert_eq!(h.retired, 4);
        assert_eq!(
            drain(&mut t),
            (1..=4).map(|s| (s, Outcome::Completed)).collect::<Vec<_>>()
        );
        assert_eq!(t.outstanding(), 4);
        t.handle_completion(&wc(8, WcStatus::Success), now).unwrap();
        assert_eq!(
            drain(&mut t),
            (5..=8).map(|s| (s, Outcome::Completed)).collect::<Vec<_>>()
        );
        assert!(t.is_idle());
        let s = t.stats();
        assert_eq!((s.posted, s.signaled, s.cqes, s.completed), (8, 2, 2, 8));
        assert_eq!(s.mean_wrs_per_cqe(), 4.0);
        assert_eq!(s.wrs_per_cqe.len(), 2);
        assert_eq!(s.wrs_per_cqe.max(), 4);
        assert_eq!(s.lag_ns.len(), 8);
    }

    #[test]
    fn lag_is_not_recorded_when_turned_off() {
        let now = Instant::now();
        let config = TrackerConfig::new(16, 16)
            .policy(Policy::Every(4))
            .measure_lag(false);
        let mut t: SendTracker<u64> = SendTracker::new(config, now).unwrap();
        post_n(&mut t, now, 8);
        for seq in [4, 8] {
            t.handle_completion(&wc(seq, WcStatus::Success), now + Duration::from_micros(5))
                .unwrap();
        }
        let s = t.stats();
        assert_eq!((s.completed, s.cqes), (8, 2));
        assert!(s.lag_ns.is_empty(), "no lag recorded");
        assert_eq!(s.wrs_per_cqe.len(), 2, "the rest is still counted");
    }

    #[test]
    fn error_then_flushes_give_every_wr_one_outcome() {
        // Bad rkey on WR3 of 8 (WR8 signaled): CQE3 error, then one flush per later WR.
        let (mut t, now) = tracker(16, 16, Policy::Every(8));
        post_n(&mut t, now, 8);
        let h = t
            .handle_completion(&wc(3, WcStatus::RemAccessErr), now)
            .unwrap();
        assert!(h.entered_error);
        assert_eq!(
            t.state(),
            QueueState::Error {
                first: Seq(3),
                status: WcStatus::RemAccessErr
            }
        );
        for seq in 4..=8 {
            t.handle_completion(&wc(seq, WcStatus::WrFlushErr), now)
                .unwrap();
        }
        let outcomes = drain(&mut t);
        assert_eq!(
            outcomes,
            vec![
                (1, Outcome::Completed),
                (2, Outcome::Completed),
                (3, Outcome::Failed(WcStatus::RemAccessErr)),
                (4, Outcome::Flushed),
                (5, Outcome::Flushed),
                (6, Outcome::Flushed),
                (7, Outcome::Flushed),
                (8, Outcome::Flushed),
            ]
        );
        assert!(t.is_idle());
        let err = t.post(9, Signal::Auto, now).unwrap_err();
        assert!(matches!(err, PostError::QueueError { first: Seq(3), .. }));
        assert!(err.to_string().contains("rem_access_err"), "{err}");
        assert_eq!(err.into_payload(), 9);
        let s = t.stats();
        assert_eq!((s.completed, s.failed, s.flushed), (2, 1, 5));
        assert_eq!((s.error_cqes, s.flush_cqes, s.success_cqes), (1, 5, 0));
    }

    #[test]
    fn signaled_before_error_then_error_on_unsignaled() {
        // docs/semantics.md: WR4, WR8 signaled, bad rkey on WR6 -> 4 ok, 6 error, 7, 8 flush.
        let (mut t, now) = tracker(16, 16, Policy::Every(4));
        post_n(&mut t, now, 8);
        t.handle_completion(&wc(4, WcStatus::Success), now).unwrap();
        t.handle_completion(&wc(6, WcStatus::RemAccessErr), now)
            .unwrap();
        t.handle_completion(&wc(7, WcStatus::WrFlushErr), now)
            .unwrap();
        t.handle_completion(&wc(8, WcStatus::WrFlushErr), now)
            .unwrap();
        let outcomes = drain(&mut t);
        assert_eq!(outcomes[4], (5, Outcome::Completed));
        assert_eq!(outcomes[5], (6, Outcome::Failed(WcStatus::RemAccessErr)));
        assert_eq!(
            outcomes[6..],
            [(7, Outcome::Flushed), (8, Outcome::Flushed)]
        );
    }

    #[test]
    fn flush_without_error_completion_means_earlier_wrs_completed() {
        // The QP was moved to the error state by the application: the first flush names
        // the first work request that did not execute.
        let (mut t, now) = tracker(16, 16, Policy::Never);
        post_n(&mut t, now, 5);
        t.handle_completion(&wc(3, WcStatus::WrFlushErr), now)
            .unwrap();
        t.handle_completion(&wc(4, WcStatus::WrFlushErr), now)
            .unwrap();
        t.handle_completion(&wc(5, WcStatus::WrFlushErr), now)
            .unwrap();
        assert_eq!(
            drain(&mut t),
            vec![
                (1, Outcome::Completed),
                (2, Outcome::Completed),
                (3, Outcome::Flushed),
                (4, Outcome::Flushed),
                (5, Outcome::Flushed)
            ]
        );
    }

    #[test]
    fn drain_marker_flush_finishes_an_errored_queue() {
        let (mut t, now) = tracker(16, 16, Policy::Never);
        post_n(&mut t, now, 6);
        t.handle_completion(&wc(2, WcStatus::LocProtErr), now)
            .unwrap();
        t.start_drain();
        let marker = t.post_marker(now).unwrap();
        assert_eq!(marker, Seq(7));
        // Only the marker's flush arrives (e.g. the others were lost to a full CQ).
        t.handle_completion(&wc(7, WcStatus::WrFlushErr), now)
            .unwrap();
        assert!(t.is_idle());
        let outcomes = drain(&mut t);
        assert_eq!(outcomes.len(), 6, "the marker is not handed back");
        assert_eq!(outcomes[1], (2, Outcome::Failed(WcStatus::LocProtErr)));
        assert!(outcomes[2..].iter().all(|(_, o)| *o == Outcome::Flushed));
        assert_eq!(t.stats().markers, 1);
    }

    #[test]
    fn never_policy_still_signals_before_the_queue_fills() {
        let (mut t, now) = tracker(8, 64, Policy::Never);
        let posted = post_n(&mut t, now, 8);
        assert!(posted[..7].iter().all(|p| !p.signaled()));
        assert_eq!(posted[7].signal, Some(SignalReason::Deadlock));
        assert!(matches!(
            t.post(99, Signal::Auto, now),
            Err(PostError::Full {
                payload: 99,
                capacity: 8
            })
        ));
        assert_eq!(
            t.signaled_outstanding(),
            1,
            "a full queue has a signaled WR"
        );
        assert_eq!(t.stats().forced, 1);
    }

    #[test]
    fn small_cq_bounds_outstanding_and_the_unsignaled_run() {
        let (mut t, now) = tracker(64, 4, Policy::Every(16));
        let posted = post_n(&mut t, now, 4);
        assert_eq!(posted[3].signal, Some(SignalReason::Deadlock));
        let err = t.post(5, Signal::Auto, now).unwrap_err();
        assert!(
            matches!(err, PostError::CqFull { capacity: 4, .. }),
            "{err:?}"
        );
        assert!(err.is_full());
        t.handle_completion(&wc(4, WcStatus::Success), now).unwrap();
        assert_eq!(t.available(), 4);
    }

    #[test]
    fn shared_cq_pool_signals_the_wr_taking_the_last_credit() {
        let now = Instant::now();
        let pool = CqCredits::new(6);
        let config = |qp| {
            TrackerConfig::new(16, 0)
                .cq(CqBudget::Shared(pool.clone()))
                .policy(Policy::Never)
                .qp_num(qp)
        };
        let mut a: SendTracker<u64> = SendTracker::new(config(1), now).unwrap();
        let mut b: SendTracker<u64> = SendTracker::new(config(2), now).unwrap();
        for i in 0..3 {
            assert!(!a.post(i, Signal::Auto, now).unwrap().signaled());
        }
        for i in 0..2 {
            assert!(!b.post(i, Signal::Auto, now).unwrap().signaled());
        }
        let last = b.post(2, Signal::Auto, now).unwrap();
        assert_eq!(last.signal, Some(SignalReason::CqCredit));
        assert_eq!(pool.available(), 0);
        assert!(matches!(
            a.post(9, Signal::Auto, now),
            Err(PostError::CqFull { capacity: 6, .. })
        ));
        // A completion of another QP is refused by this tracker.
        let other = WorkCompletion::new(3, WcStatus::Success, 2);
        assert!(matches!(
            a.handle_completion(&other, now),
            Err(CompletionError::WrongQueue {
                expected: 1,
                got: 2
            })
        ));
        b.handle_completion(&other, now).unwrap();
        assert_eq!(pool.available(), 3);
        drop(a);
        assert_eq!(pool.available(), 6, "a dropped tracker returns its credits");
    }

    #[test]
    fn forced_signal_resets_the_every_n_count() {
        let (mut t, now) = tracker(64, 64, Policy::Every(4));
        post_n(&mut t, now, 2);
        let p = t.post(3, Signal::Force, now).unwrap();
        assert_eq!(p.signal, Some(SignalReason::Requested));
        let posted = post_n(&mut t, now, 4);
        let signaled: Vec<bool> = posted.iter().map(Posted::signaled).collect();
        assert_eq!(signaled, [false, false, false, true]);
        assert_eq!(t.stats().requested, 1);
    }

    #[test]
    fn a_new_policy_applies_from_the_next_post_on() {
        let signaled = |t: &mut SendTracker<u64>, now, n| -> Vec<bool> {
            post_n(t, now, n).iter().map(Posted::signaled).collect()
        };
        let (mut t, now) = tracker(64, 64, Policy::Every(8));
        assert_eq!(signaled(&mut t, now, 2), [false, false]);
        // A run of 2 is posted: every 3 signals the next one.
        t.set_policy(Policy::Every(3)).unwrap();
        assert_eq!(signaled(&mut t, now, 4), [true, false, false, true]);
        t.set_policy(Policy::Always).unwrap();
        assert_eq!(signaled(&mut t, now, 2), [true, true]);
        t.set_policy(Policy::Never).unwrap();
        assert_eq!(signaled(&mut t, now, 3), [false, false, false]);
        t.set_policy(Policy::Every(2)).unwrap();
        assert_eq!(signaled(&mut t, now, 1), [true], "a run of 3 is past 2");
    }

    #[test]
    fn confirm_all_posts_a_marker_only_for_an_unsignaled_tail() {
        let (mut t, now) = tracker(16, 16, Policy::Every(4));
        post_n(&mut t, now, 4);
        assert_eq!(t.confirm_all(now).unwrap(), None, "the tail is signaled");
        post_n(&mut t, now, 2);
        assert_eq!(t.unsignaled_run(), 2);
        let marker = t.confirm_all(now).unwrap().expect("a marker");
        assert_eq!(marker, Seq(7));
        assert_eq!(t.unsignaled_run(), 0);
        t.handle_completion(&wc(4, WcStatus::Success), now).unwrap();
        t.handle_completion(&wc(7, WcStatus::Success), now).unwrap();
        assert!(t.is_idle());
        assert_eq!(drain(&mut t).len(), 6);
    }

    #[test]
    fn a_ring_that_cannot_be_allocated_is_a_config_error() {
        // 2^32 payloads of 2 GiB: more bytes than an allocation may ask for.
        let config = TrackerConfig::new(u32::MAX, u32::MAX);
        let t = SendTracker::<[u8; 1 << 31]>::new(config, Instant::now());
        assert_eq!(t.err(), Some(ConfigError::TooLarge(u32::MAX)));
    }

    #[test]
    fn the_longest_lag_gives_a_far_deadline_and_never_signals_by_time() {
        let lag = Duration::from_nanos(u64::MAX);
        let (mut t, t0) = tracker(
            64,
            64,
            Policy::Adaptive {
                max_unsignaled: 8,
                max_lag: lag,
            },
        );
        assert!(!t.post(1, Signal::Auto, t0).unwrap().signaled());
        assert_eq!(t.next_deadline(), t0.checked_add(lag));
        let later = t0 + Duration::from_secs(3600);
        assert!(!t.post(2, Signal::Auto, later).unwrap().signaled());
        let e = t.set_policy(Policy::Adaptive {
            max_unsignaled: 8,
            max_lag: Duration::MAX,
        });
        assert_eq!(e, Err(PolicyError::LagTooLong(Duration::MAX)));
    }

    #[test]
    fn adaptive_signals_on_budget_or_deadline() {
        let lag = Duration::from_micros(50);
        let (mut t, t0) = tracker(
            64,
            64,
            Policy::Adaptive {
                max_unsignaled: 8,
                max_lag: lag,
            },
        );
        assert_eq!(t.next_deadline(), None);
        assert!(!t.post(1, Signal::Auto, t0).unwrap().signaled());
        assert_eq!(t.next_deadline(), Some(t0 + lag));
        let t1 = t0 + Duration::from_micros(49);
        assert!(!t.post(2, Signal::Auto, t1).unwrap().signaled());
        let t2 = t0 + lag;
        assert!(t.post(3, Signal::Auto, t2).unwrap().signaled(), "deadline");
        assert_eq!(t.next_deadline(), None);
        let posted = post_n(&mut t, t2, 8);
        assert!(
            posted[7].signaled() && posted[..7].iter().all(|p| !p.signaled()),
            "budget"
        );
    }

    #[test]
    fn adaptive_with_no_lag_allowed_signals_every_work_request() {
        let (mut t, t0) = tracker(
            64,
            64,
            Policy::Adaptive {
                max_unsignaled: 8,
                max_lag: Duration::ZERO,
            },
        );
        let posted = post_n(&mut t, t0, 4);
        assert!(posted.iter().all(|p| p.signaled()), "{posted:?}");
        assert_eq!(t.next_deadline(), None);
    }

    #[test]
    fn rollback_hands_back_the_unposted_part_of_a_batch() {
        let (mut t, now) = tracker(16, 16, Policy::Every(4));
        post_n(&mut t, now, 6); // 4 signaled, run = 2
        let back: Vec<u64> = t.rollback(Seq(5)).unwrap().collect();
        assert_eq!(back, [5, 6]);
        assert_eq!(t.next_seq(), Seq(5));
        assert_eq!(t.outstanding(), 4);
        assert_eq!(t.unsignaled_run(), 0);
        assert_eq!(t.stats().posted, 4);
        let p = post_n(&mut t, now, 4);
        assert_eq!(p[3].seq, Seq(8));
        assert!(
            p[3].signaled(),
            "the count resumes after the last signaled WR"
        );
        // Rolling back a signaled WR and a retired one.
        assert!(matches!(
            t.rollback(Seq(20)),
            Err(RollbackError::NotOutstanding { .. })
        ));
        t.handle_completion(&wc(4, WcStatus::Success), now).unwrap();
        assert!(
            t.rollback(Seq(3)).is_err(),
            "retired WRs cannot be rolled back"
        );
        let back: Vec<u64> = t.rollback(Seq(6)).unwrap().collect();
        assert_eq!(back, [6, 7, 8]);
        assert_eq!(t.signaled_outstanding(), 0);
        assert_eq!(t.unsignaled_run(), 1);
        assert_eq!(t.stats().signaled, 1);
        let nothing: Vec<u64> = t.rollback(Seq(6)).unwrap().collect();
        assert!(nothing.is_empty());
    }

    #[test]
    fn a_rolled_back_forced_signal_is_not_counted() {
        let (mut t, now) = tracker(4, 4, Policy::Never);
        let posted = post_n(&mut t, now, 4);
        assert_eq!(posted[3].signal, Some(SignalReason::Deadlock));
        assert_eq!((t.stats().forced, t.stats().signaled), (1, 1));
        let back: Vec<u64> = t.rollback(Seq(4)).unwrap().collect();
        assert_eq!(back, [4]);
        assert_eq!((t.stats().forced, t.stats().signaled), (0, 0));
    }

    #[test]
    fn an_error_ends_the_adaptive_deadline() {
        let (mut t, now) = tracker(
            64,
            64,
            Policy::Adaptive {
                max_unsignaled: 100,
                max_lag: Duration::from_secs(1),
            },
        );
        assert!(t.post(1, Signal::Force, now).unwrap().signaled());
        assert!(!t.post(2, Signal::Auto, now).unwrap().signaled());
        assert!(t.next_deadline().is_some());
        t.handle_completion(&wc(1, WcStatus::RemAccessErr), now)
            .unwrap();
        assert_eq!(t.next_deadline(), None, "nothing to confirm in time now");
    }

    #[test]
    fn a_tracker_told_to_keep_its_credits_keeps_them_when_dropped() {
        let now = Instant::now();
        let pool = CqCredits::new(4);
        let config = TrackerConfig::new(16, 0)
            .cq(CqBudget::Shared(pool.clone()))
            .policy(Policy::Never);
        let mut t: SendTracker<u64> = SendTracker::new(config, now).unwrap();
        t.post(1, Signal::Auto, now).unwrap();
        t.post(2, Signal::Auto, now).unwrap();
        assert_eq!(pool.available(), 2);
        t.keep_credits_on_drop();
        drop(t);
        assert_eq!(pool.available(), 2, "their completions may still come");
    }

    #[test]
    fn impossible_completions_are_refused_and_change_nothing() {
        let (mut t, now) = tracker(16, 16, Policy::Every(2));
        post_n(&mut t, now, 6); // 2, 4, 6 signaled
        let cases = [
            (wc(7, WcStatus::Success), "never posted"),
            (wc(3, WcStatus::Success), "posted unsignaled"),
            (wc(4, WcStatus::Success), "out of order"),
            (wc(5, WcStatus::RemAccessErr), "out of order"),
            (WorkCompletion::new(2, WcStatus::Success, 8), "QP 8"),
        ];
        for (c, text) in cases {
            let err = t.handle_completion(&c, now).unwrap_err();
            assert!(err.to_string().contains(text), "{err}");
            assert_eq!(t.outstanding(), 6);
        }
        t.handle_completion(&wc(2, WcStatus::Success), now).unwrap();
        let err = t
            .handle_completion(&wc(2, WcStatus::Success), now)
            .unwrap_err();
        assert_eq!(err, CompletionError::AlreadyRetired { wr_id: 2 });
        assert_eq!(t.stats().rejected_cqes, 6);
        t.handle_completion(&wc(5, WcStatus::RetryExcErr), now)
            .unwrap_err();
        t.handle_completion(&wc(3, WcStatus::RetryExcErr), now)
            .unwrap();
        let err = t
            .handle_completion(&wc(4, WcStatus::Success), now)
            .unwrap_err();
        assert!(matches!(err, CompletionError::SuccessAfterError { .. }));
    }

    #[test]
    fn sequence_numbers_cross_2_16_and_2_32() {
        for start in [(1u64 << 16) - 3, (1u64 << 32) - 3] {
            let now = Instant::now();
            let config = TrackerConfig::new(4, 4)
                .policy(Policy::Every(2))
                .first_seq(start);
            let mut t: SendTracker<u64> = SendTracker::new(config, now).unwrap();
            let mut expected = start;
            for _ in 0..10 {
                let mut last_signaled = None;
                for _ in 0..4 {
                    let p = t.post(expected, Signal::Auto, now).unwrap();
                    assert_eq!(p.seq.0, expected);
                    expected += 1;
                    if p.signaled() {
                        last_signaled = Some(p.seq.0);
                    }
                }
                let first = t.first_outstanding().0;
                for s in first..expected {
                    if t.handle_completion(&WorkCompletion::new(s, WcStatus::Success, 0), now)
                        .is_ok()
                    {
                        assert!(s <= last_signaled.unwrap());
                    }
                }
                let retired = drain(&mut t);
                assert_eq!(retired.len(), 4);
                assert!(t.is_idle());
            }
            assert!(expected > start + 6);
        }
    }

    #[test]
    fn sequence_exhaustion_is_an_error_not_a_wrap() {
        let now = Instant::now();
        let config = TrackerConfig::new(4, 4).first_seq(u64::MAX - 2);
        let mut t: SendTracker<u8> = SendTracker::new(config, now).unwrap();
        t.post(1, Signal::Auto, now).unwrap();
        t.post(2, Signal::Auto, now).unwrap();
        assert!(matches!(
            t.post(3, Signal::Auto, now),
            Err(PostError::SeqExhausted { payload: 3 })
        ));
        let config = TrackerConfig::new(4, 4).first_seq(u64::MAX);
        assert_eq!(
            SendTracker::<u8>::new(config, now).unwrap_err(),
            ConfigError::FirstSeqTooHigh { end: u64::MAX }
        );
        // A lower end (a caller keeping bit 63 of the wr_id): the last sequence number
        // before it is signaled, and nothing is posted beyond.
        let end = 1 << 63;
        let config = TrackerConfig::new(4, 4).first_seq(end - 2).seq_end(end);
        let mut t: SendTracker<u8> = SendTracker::new(config, now).unwrap();
        assert!(!t.post(1, Signal::Auto, now).unwrap().signaled());
        let last = t.post(2, Signal::Auto, now).unwrap();
        assert_eq!(
            (last.seq, last.signal),
            (Seq(end - 1), Some(SignalReason::Deadlock))
        );
        assert!(matches!(
            t.post(3, Signal::Auto, now),
            Err(PostError::SeqExhausted { payload: 3 })
        ));
        let config = TrackerConfig::new(4, 4).first_seq(end).seq_end(end);
        assert_eq!(
            SendTracker::<u8>::new(config, now).unwrap_err(),
            ConfigError::FirstSeqTooHigh { end }
        );
    }

    #[test]
    fn switching_an_unclocked_tracker_to_adaptive_confirms_the_old_run_early() {
        let start = Instant::now();
        let ms = Duration::from_millis;
        let config = TrackerConfig::new(64, 64)
            .policy(Policy::Every(32))
            .measure_lag(false);
        let mut t: SendTracker<u32> = SendTracker::new(config, start).unwrap();
        // Nothing reads the clock: the run's start is not known.
        for i in 0..3 {
            assert!(!t.post(i, Signal::Auto, start + ms(5)).unwrap().signaled());
        }
        t.set_policy(Policy::Adaptive {
            max_unsignaled: 32,
            max_lag: ms(10),
        })
        .unwrap();
        // The run counts as started at creation, so its deadline is creation + 10 ms ...
        assert_eq!(t.next_deadline(), Some(start + ms(10)));
        let p = t.post(3, Signal::Auto, start + ms(10)).unwrap();
        assert_eq!(p.signal, Some(SignalReason::Policy));
        // ... and from now on the clock is read: a new run's deadline counts from its
        // first post.
        assert!(!t.post(4, Signal::Auto, start + ms(12)).unwrap().signaled());
        assert_eq!(t.next_deadline(), Some(start + ms(22)));
    }

    #[test]
    fn the_last_sequence_numbers_retire_both_ways() {
        let now = Instant::now();
        for one_pass in [false, true] {
            let config = TrackerConfig::new(4, 4).first_seq(u64::MAX - 2);
            let mut t: SendTracker<u8> = SendTracker::new(config, now).unwrap();
            t.post(1, Signal::Auto, now).unwrap();
            let last = t.post(2, Signal::Auto, now).unwrap();
            assert_eq!(last.seq, Seq(u64::MAX - 1));
            assert_eq!(last.signal, Some(SignalReason::Deadlock));
            t.handle_completion(&WorkCompletion::new(last.seq.0, WcStatus::Success, 0), now)
                .unwrap();
            let mut got = Vec::new();
            if one_pass {
                t.poll_retired_with(|r| got.push((r.seq.0, r.payload)));
            } else {
                got.extend(std::iter::from_fn(|| t.poll_retired()).map(|r| (r.seq.0, r.payload)));
            }
            assert_eq!(got, [(u64::MAX - 2, 1), (u64::MAX - 1, 2)]);
            assert!(t.is_idle());
        }
    }

    #[test]
    fn sq_sig_all_signals_everything() {
        let now = Instant::now();
        let config = TrackerConfig::new(8, 8)
            .policy(Policy::Never)
            .sq_sig_all(true);
        let mut t: SendTracker<u64> = SendTracker::new(config, now).unwrap();
        let posted = post_n(&mut t, now, 3);
        assert!(
            posted
                .iter()
                .all(|p| p.signal == Some(SignalReason::SqSigAll))
        );
    }

    #[test]
    fn bad_configs_are_refused() {
        let now = Instant::now();
        let new = |c| SendTracker::<u8>::new(c, now).unwrap_err();
        assert_eq!(new(TrackerConfig::new(0, 4)), ConfigError::ZeroSqCapacity);
        assert_eq!(new(TrackerConfig::new(4, 0)), ConfigError::ZeroCqCapacity);
        assert_eq!(
            new(TrackerConfig::new(4, 4).policy(Policy::Every(0))),
            ConfigError::Policy(PolicyError::ZeroInterval)
        );
    }

    #[test]
    fn draining_refuses_posts_but_accepts_markers() {
        let (mut t, now) = tracker(8, 8, Policy::Every(4));
        post_n(&mut t, now, 2);
        t.start_drain();
        assert_eq!(t.state(), QueueState::Draining);
        assert!(matches!(
            t.post(3, Signal::Auto, now),
            Err(PostError::Draining { payload: 3 })
        ));
        let m = t.confirm_all(now).unwrap().unwrap();
        t.handle_completion(&wc(m.0, WcStatus::Success), now)
            .unwrap();
        assert_eq!(drain(&mut t).len(), 2);
        assert!(t.is_idle());
    }

    #[test]
    fn rollback_restores_the_start_of_the_unsignaled_run() {
        // An adaptive deadline counts from the first WR of the run, also after a rollback
        // removed the signaled WR that had ended that run.
        let lag = Duration::from_micros(10);
        let policy = Policy::Adaptive {
            max_unsignaled: 100,
            max_lag: lag,
        };
        let (mut t, t0) = tracker(64, 64, policy);
        t.post(1, Signal::Auto, t0).unwrap();
        let t1 = t0 + Duration::from_micros(5);
        t.post(2, Signal::Force, t1).unwrap();
        t.post(3, Signal::Auto, t1).unwrap();
        assert_eq!(t.next_deadline(), Some(t1 + lag));
        assert_eq!(t.rollback(Seq(2)).unwrap().collect::<Vec<_>>(), [2, 3]);
        assert_eq!(t.unsignaled_run(), 1);
        assert_eq!(t.next_deadline(), Some(t0 + lag));
        let p = t.post(2, Signal::Auto, t0 + lag).unwrap();
        assert_eq!(
            p.signal,
            Some(SignalReason::Policy),
            "WR1's deadline has passed"
        );
    }

    #[test]
    fn an_error_completion_in_the_error_state_fails_its_wr_and_flushes_the_earlier_ones() {
        // Not seen on mlx5 or rxe (after the first error they report flushes only), but if a
        // NIC reports a second error, no work request may be lost or called completed.
        let (mut t, now) = tracker(16, 16, Policy::Never);
        post_n(&mut t, now, 5);
        t.handle_completion(&wc(1, WcStatus::RemAccessErr), now)
            .unwrap();
        t.handle_completion(&wc(3, WcStatus::RemOpErr), now)
            .unwrap();
        assert_eq!(
            t.unsignaled_run(),
            0,
            "nothing to confirm in the error state"
        );
        assert_eq!(
            drain(&mut t),
            vec![
                (1, Outcome::Failed(WcStatus::RemAccessErr)),
                (2, Outcome::Flushed),
                (3, Outcome::Failed(WcStatus::RemOpErr)),
            ]
        );
        assert!(matches!(
            t.state(),
            QueueState::Error {
                first: Seq(1),
                status: WcStatus::RemAccessErr
            }
        ));
    }

    #[test]
    fn lag_is_measured_from_post_to_retirement() {
        let (mut t, t0) = tracker(8, 8, Policy::Every(2));
        t.post(1, Signal::Auto, t0).unwrap();
        t.post(2, Signal::Auto, t0 + Duration::from_micros(10))
            .unwrap();
        t.handle_completion(&wc(2, WcStatus::Success), t0 + Duration::from_micros(30))
            .unwrap();
        let lag = &t.stats().lag_ns;
        assert_eq!(lag.len(), 2);
        assert!(lag.equivalent(lag.max(), 30_000), "{}", lag.max());
        assert!(lag.equivalent(lag.min(), 20_000), "{}", lag.min());
    }

    /// The `wr_id` encoding has one home: with a tag, every `wr_id` handed out carries it,
    /// completions are decoded by it (one without it, or a successful receive, is not a
    /// send and changes nothing), errors name the `wr_id` as polled, and sequence numbers
    /// stay below the tag.
    #[test]
    fn a_wr_id_tag_is_set_on_every_wr_id_handed_out_and_decoded_from_every_completion() {
        let now = Instant::now();
        let tag = 1 << 63;
        let config = TrackerConfig::new(8, 8)
            .policy(Policy::Every(2))
            .wr_id_tag(tag)
            .qp_num(7);
        let mut t: SendTracker<u8> = SendTracker::new(config, now).unwrap();
        let p1 = t.post(1, Signal::Auto, now).unwrap();
        let p2 = t.post(2, Signal::Auto, now).unwrap();
        assert_eq!((p1.seq, p1.wr_id), (Seq(1), tag | 1));
        assert_eq!((p2.seq, p2.wr_id, p2.signaled()), (Seq(2), tag | 2, true));
        assert_eq!(t.wr_id(Seq(5)), tag | 5);
        assert_eq!((t.seq_of(tag | 5), t.seq_of(5)), (Some(Seq(5)), None));

        let done = |wr_id| WorkCompletion::new(wr_id, WcStatus::Success, 7);
        // Without the tag: a receive's completion, or a send posted around the tracker.
        assert_eq!(t.send_seq(&done(2)), None);
        assert_eq!(
            t.handle_completion(&done(2), now),
            Err(CompletionError::NotASend { wr_id: 2 })
        );
        // A successful receive with the tag set is no send either; an error's opcode is
        // undefined and not read.
        let recv = done(tag | 2).with_opcode(WcOpcode::Recv);
        assert_eq!(t.send_seq(&recv), None);
        let failed =
            WorkCompletion::new(tag | 2, WcStatus::RemAccessErr, 7).with_opcode(WcOpcode::Recv);
        assert_eq!(t.send_seq(&failed), Some(Seq(2)));
        // Another QP's.
        let other = WorkCompletion::new(tag | 2, WcStatus::Success, 8);
        assert_eq!(t.send_seq(&other), None);
        assert_eq!(
            t.handle_completion(&other, now),
            Err(CompletionError::WrongQueue {
                expected: 7,
                got: 8
            })
        );
        // An error names the wr_id as polled.
        assert_eq!(
            t.handle_completion(&done(tag | 1), now),
            Err(CompletionError::Unsignaled { wr_id: tag | 1 })
        );
        assert_eq!(t.stats().rejected_cqes, 3);
        assert_eq!(t.outstanding(), 2);

        let handled = t.handle_completion(&done(tag | 2), now).unwrap();
        assert_eq!(
            (handled.first, handled.seq, handled.retired),
            (Seq(1), Seq(2), 2)
        );
        let payloads: Vec<u8> = std::iter::from_fn(|| t.poll_retired())
            .map(|r| r.payload)
            .collect();
        assert_eq!(payloads, [1, 2]);

        // Sequence numbers stay below the tag; a tag of more than one bit is refused.
        let config = TrackerConfig::new(4, 4).wr_id_tag(tag).first_seq(tag);
        assert_eq!(
            SendTracker::<u8>::new(config, now).unwrap_err(),
            ConfigError::FirstSeqTooHigh { end: tag }
        );
        let config = TrackerConfig::new(4, 4).wr_id_tag(tag).first_seq(tag - 1);
        let mut t: SendTracker<u8> = SendTracker::new(config, now).unwrap();
        let last = t.post(1, Signal::Auto, now).unwrap();
        assert_eq!(
            (last.wr_id, last.signal),
            (u64::MAX, Some(SignalReason::Deadlock))
        );
        assert!(matches!(
            t.post(2, Signal::Auto, now),
            Err(PostError::SeqExhausted { payload: 2 })
        ));
        let config = TrackerConfig::new(4, 4).wr_id_tag(3 << 62);
        assert_eq!(
            SendTracker::<u8>::new(config, now).unwrap_err(),
            ConfigError::WrIdTag(3 << 62)
        );
    }

    /// A batch decides as posts one by one would, stops at the first refusal with its
    /// payload, leaves the rest of the iterator alone, and signals the last one when asked.
    #[test]
    fn a_batch_posts_as_one_post_after_another_would() {
        let now = Instant::now();
        let config = || TrackerConfig::new(8, 8).policy(Policy::Every(3));
        let mut one: SendTracker<u32> = SendTracker::new(config(), now).unwrap();
        let mut batch: SendTracker<u32> = SendTracker::new(config(), now).unwrap();
        let singles: Vec<Posted> = (0..5)
            .map(|i| one.post(i, Signal::Auto, now).unwrap())
            .collect();
        let mut got = Vec::new();
        batch
            .post_batch(0..5, Signal::Auto, now, |p| got.push(p))
            .unwrap();
        assert_eq!(got, singles);

        // Three slots left: three registered, the fourth refused with its payload, and the
        // last two never taken from the iterator.
        let mut rest = 5..11u32;
        got.clear();
        let e = batch
            .post_batch(rest.by_ref(), Signal::Auto, now, |p| got.push(p))
            .unwrap_err();
        assert!(
            matches!(
                e,
                PostError::Full {
                    payload: 8,
                    capacity: 8
                }
            ),
            "{e:?}"
        );
        assert_eq!(got.len(), 3);
        assert_eq!(rest.collect::<Vec<_>>(), [9, 10]);
        for (i, p) in got.iter().enumerate() {
            assert_eq!(*p, one.post(5 + i as u32, Signal::Auto, now).unwrap());
        }

        // The last of a batch signaled when asked; the others as the policy says.
        let mut t: SendTracker<u32> = SendTracker::new(config(), now).unwrap();
        got.clear();
        t.post_batch([1, 2], Signal::Force, now, |p| got.push(p))
            .unwrap();
        assert_eq!(
            got.iter().map(|p| p.signal).collect::<Vec<_>>(),
            [None, Some(SignalReason::Requested)]
        );
        // In the error state, or on a shared pool, each one is checked: the same answers.
        let pool = CqCredits::new(2);
        let mut shared: SendTracker<u32> =
            SendTracker::new(TrackerConfig::new(8, 0).cq(CqBudget::Shared(pool)), now).unwrap();
        got.clear();
        let e = shared
            .post_batch(1..4, Signal::Auto, now, |p| got.push(p))
            .unwrap_err();
        assert!(matches!(e, PostError::CqFull { payload: 3, .. }), "{e:?}");
        assert_eq!(got[1].signal, Some(SignalReason::CqCredit));
    }
}
