//! `SignaledQueue`: the tracker driving a provider's queue pair.

use std::sync::Arc;
use std::time::Instant;

use crate::Stats;
use crate::buffer::Buffer;
use crate::claims::{CqClaim, Taken};
use crate::credits::CqBudget;
use crate::policy::Policy;
use crate::provider::{
    CompletionQueue, Device, Local, MemoryRegion, Opcode, QueuePair, RemoteAddr, SendWr, Sge,
};
pub use crate::queue_errors::{
    CreateError, DrainError, DrainMarker, PollError, QueuePostError, TryPostError,
};
use crate::shared::SharedCq;
use crate::tracker::{
    CompletionError, ConfigError, Handled, Outcome, Posted, QueueState, SendTracker, Seq,
    TrackerConfig,
};
use crate::wc::{WcStatus, WorkCompletion};
use crate::work::local_of;
pub use crate::work::{Payload, Work};

mod wait;

/// Registers `work` with the tracker (without its checks when `reserved`: one of the
/// [`SendTracker::reserved_room`] work requests): the work request to post, or `None`
/// with why it is refused, and its payload, in `refused`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn register<'a, M: MemoryRegion, U>(
    tracker: &mut SendTracker<Payload<M, U>>,
    work: Work<'a, M, U>,
    reserved: bool,
    (now, now_ns): (Instant, u64),
    (max_sge, arena): (u32, &mut &'a mut [Sge]),
    refused: &mut Option<QueuePostError<Payload<M, U>>>,
    registered: &mut impl FnMut(&Posted),
) -> Option<SendWr<'a>> {
    let Work {
        opcode,
        signal,
        imm_data,
        data,
        remote,
        user,
    } = work;
    let (local, (buffer, list)) = match local_of(data, max_sge, arena) {
        Ok(local) => local,
        Err(((buffer, list), source)) => {
            *refused = Some(QueuePostError::Invalid {
                work: Payload { buffer, list, user },
                source,
            });
            return None;
        }
    };
    let payload = Payload { buffer, list, user };
    let posted = if reserved {
        tracker.push_reserved(payload, signal, now_ns)
    } else {
        match tracker.post(payload, signal, now) {
            Ok(posted) => posted,
            Err(e) => {
                *refused = Some(QueuePostError::Refused(e));
                return None;
            }
        }
    };
    registered(&posted);
    Some(SendWr {
        wr_id: posted.wr_id,
        opcode,
        local,
        remote,
        imm_data,
        signaled: posted.signaled(),
    })
}

/// The most work requests one [`SignaledQueue::post_batch`] takes on a queue pair whose
/// `max_send_sge` is above 1 (a longer iterator keeps the rest for the next call).
pub const LIST_BATCH: u32 = 256;

/// A retired work request: its buffer and context back, with its outcome.
#[derive(Debug)]
pub struct Completion<M, U> {
    /// Its sequence number (it was posted with the `wr_id`
    /// [`SendTracker::wr_id`]`(seq)`: bit 63, [`SEND_WR_ID_BIT`], set).
    pub seq: Seq,
    /// The buffer, for work requests that had one: the NIC no longer uses it.
    pub buffer: Option<Buffer<M>>,
    /// The buffers of a work request on a list of them ([`Work::list`]), in its order:
    /// the NIC no longer uses them (`None` for any other work request).
    pub list: Option<Box<Vec<Buffer<M>>>>,
    /// The caller's context.
    pub user: U,
    /// What happened to it.
    pub outcome: Outcome,
    /// Whether it was posted signaled.
    pub signaled: bool,
}

/// Settings of a [`SignaledQueue`].
#[derive(Debug, Clone)]
pub struct QueueConfig {
    /// The signaling policy.
    pub policy: Policy,
    /// The CQ budget; `None` for a CQ of the queue's own, taken whole (no other queue may
    /// use it: [`ConfigError::CqInUse`]): its real capacity, less the receive queue's
    /// capacity when the QP's receive completions go to it too
    /// ([`QueuePair::recv_cq_is_send_cq`]), and less what queues dropped from it may have
    /// left in it. Beside a budget, the caller leaves room for the QP's receives in the CQ
    /// (it alone knows which it posts); the budgets of the queues on a CQ, the receive
    /// slots of a queue that takes it whole and those of the QPs of a [`SharedCq`]'s
    /// queues add up to no more than it holds ([`ConfigError::CqBudgetsTooLarge`]).
    pub cq: Option<CqBudget>,
    /// The first sequence number (below 2^63: see [`SEND_WR_ID_BIT`]).
    pub first_seq: u64,
    /// Where zero-length confirm and drain markers are written (the key is not checked for
    /// zero bytes, but a valid remote address is the safe choice). The peer QP must allow
    /// remote writes (`IBV_ACCESS_REMOTE_WRITE` in its `qp_access_flags`): rxe refuses a
    /// zero-length WRITE to a QP that does not as an invalid request, and both QPs go to
    /// the error state.
    pub marker_target: RemoteAddr,
    /// Completions polled per call to the provider (at least 1, at most the CQ's
    /// capacity: larger values are reduced to it).
    pub poll_batch: usize,
    /// Read the clock on every post and on every poll that finds completions (default
    /// `true`): it measures confirmation lag ([`Stats::lag_ns`]) and drives the `Adaptive`
    /// policy. Off saves those readings (a clock reading costs about as much as posting
    /// a work request on a fast path); `lag_ns` stays empty and the `Adaptive` policy is
    /// refused.
    pub measure_lag: bool,
}

impl Default for QueueConfig {
    fn default() -> Self {
        QueueConfig {
            policy: Policy::default(),
            cq: None,
            first_seq: 1,
            marker_target: RemoteAddr::default(),
            poll_batch: 32,
            measure_lag: true,
        }
    }
}

impl QueueConfig {
    /// The default settings with `policy`.
    pub fn with_policy(policy: Policy) -> Self {
        QueueConfig {
            policy,
            ..QueueConfig::default()
        }
    }
}

/// Whether `qp`'s send queue reports to `cq`, as far as the provider tells.
fn sends_to(qp: &impl QueuePair, cq: &impl CompletionQueue) -> Result<(), ConfigError> {
    match (qp.send_cq_identity(), cq.identity()) {
        (Some(sends_to), Some(given)) if sends_to != given => Err(ConfigError::NotTheSendCq),
        _ => Ok(()),
    }
}

/// A queue pair of a [`Device`] with selective signaling done right: a [`SendTracker`]
/// decides what to signal and keeps every work request's buffer and context until a
/// completion covers it.
///
/// Buffers move into the queue when posted and come back when retired, so a buffer of an
/// unsignaled work request cannot be reused too early:
///
/// ```compile_fail
/// # use selsig::{Buffer, Device, RemoteAddr, SignaledQueue, Work};
/// # fn f<D: Device>(queue: &mut SignaledQueue<D, ()>, mut buf: Buffer<D::Mr>, remote: RemoteAddr) {
/// queue.post(Work::write(buf, remote, ())).ok();
/// buf.fill(0); // error: the buffer moved into the queue
/// # }
/// ```
///
/// It comes back with the completion that retires its work request:
///
/// ```
/// # use selsig::{Buffer, Device, RemoteAddr, SignaledQueue, Work};
/// # fn f<D: Device>(queue: &mut SignaledQueue<D, ()>, buf: Buffer<D::Mr>, remote: RemoteAddr) -> Option<()> {
/// queue.post(Work::write(buf, remote, ())).ok()?;
/// let mut done = Vec::new();
/// queue.poll(&mut done).ok()?;
/// for completion in done {
///     let mut buf = completion.buffer?;
///     buf.fill(0).ok()?; // the NIC is done with it
/// }
/// # Some(())
/// # }
/// ```
///
/// (`crates/selsig-soft/tests/compile_fail.rs` checks the exact compiler error.)
///
/// Dropping the queue destroys its QP. [`drain`](Self::drain) it first, so that every work
/// request is retired and every CQ credit of a shared pool comes back: a queue dropped
/// with work outstanding gives their room in the CQ back only where the provider removes
/// the destroyed QP's completions from the CQ ([`QueuePair::destroy_cleans_cq`], mlx5).
/// Elsewhere (rxe) its completions, and those of the receive slots that report to the CQ,
/// may still be in the CQ, and nothing says when they are gone: a shared pool's credits
/// stay taken (a caller that polls such a completion may give its credit back,
/// [`CqCredits::release`](crate::CqCredits::release)), and otherwise their room stays
/// taken while the CQ lives: a later queue that takes the CQ whole gets the rest, and a
/// budget beyond it is refused ([`ConfigError::CqHoldsDroppedWork`]). A later queue on a
/// QP that got the old QP's number starts its sequence numbers past the old queue's, so
/// the old completions retire none of its work requests (they go to
/// [`take_unclaimed`](Self::take_unclaimed)).
pub struct SignaledQueue<D: Device, U> {
    qp: D::Qp,
    /// Given up before `cq` goes (while the CQ lives, its address is its own).
    _claim: CqClaim,
    cq: Arc<D::Cq>,
    tracker: SendTracker<Payload<D::Mr, U>>,
    /// A short batch being posted; inline work requests are staged as `Local::Empty` and
    /// patched with their bytes for the post.
    staged: Vec<SendWr<'static>>,
    /// Where the entries of lists of buffers are written for the post: `max_send_sge`
    /// entries for each work request a batch may take (`list_batch`), so a batch never runs
    /// short.
    sge_arena: Vec<Sge>,
    /// The most work requests one `post_batch` takes: every slot on a queue pair of one
    /// entry per work request, [`LIST_BATCH`] on one that takes lists (whose arena would
    /// otherwise be `max_send_sge` entries for every slot).
    list_batch: u32,
    /// The queue pair's `max_send_sge`.
    max_sge: u32,
    wcs: Vec<WorkCompletion>,
    unclaimed: Vec<WorkCompletion>,
    /// The CQ shared with other queues that poll it, when created with
    /// [`on_shared_cq`](Self::on_shared_cq).
    shared: Option<SharedCq<D>>,
    /// Sends of this QP's number below this sequence number are a dropped queue's (on a
    /// shared CQ): not this queue's.
    stale_below: u64,
    marker_target: RemoteAddr,
    /// Whether to read the clock ([`QueueConfig::measure_lag`]).
    clock: bool,
    epoch: Instant,
}

impl<D: Device, U> Drop for SignaledQueue<D, U> {
    fn drop(&mut self) {
        // Completions another queue polled for this one are out of the CQ: they retire
        // their work requests (and give their credits back) as if this queue had polled
        // them.
        // Its receive slots beside the pool stay taken if its receives' completions may
        // stay in the CQ, as the credits below.
        let left_in_cq = !self.qp.destroy_cleans_cq();
        if let Some(shared) = self.shared.take() {
            let now = self.now();
            for wc in shared.unregister(self.qp.qp_num(), left_in_cq) {
                let _ = self.handle(&wc, now);
            }
        }
        // The QP is destroyed next (its field drops first), then the claim on the CQ is
        // given up, and the tracker gives the outstanding work requests' credits of a
        // shared pool back: only if the provider removes the QP's completions from the CQ.
        // Otherwise they may still be there: the pool's credits stay taken, and the claim
        // leaves room in the CQ for the completions of its other work requests and its
        // receives (semantics 8: every one may complete, if only flushed).
        if left_in_cq {
            self.tracker.keep_credits_on_drop();
            let next = self.tracker.next_seq().0;
            let outstanding = u64::from(self.tracker.outstanding());
            self._claim.leave(self.qp.qp_num(), next, outstanding);
        }
    }
}

/// The receive slots of `qp` whose completions go to its send CQ (every receive completes,
/// if only flushed); none where its receives report elsewhere.
fn receive_slots(qp: &impl QueuePair) -> u32 {
    match qp.recv_cq_is_send_cq() {
        true => qp.caps().max_recv_wr,
        false => 0,
    }
}

/// Bit 63 of the `wr_id` of every work request a [`SignaledQueue`] posts: its tracker's
/// [`wr_id_tag`](TrackerConfig::wr_id_tag), so its `wr_id` is the sequence number with
/// this bit set.
///
/// An error or flush completion has no defined opcode (`ibv_poll_cq(3)`), so when a QP's
/// receive completions share the CQ of its sends, the `wr_id` alone tells a send's
/// completion from a receive's (as rdma-core's rsocket flags its receives' `wr_id`s):
/// post receives with this bit clear. Sequence numbers stay below it.
pub const SEND_WR_ID_BIT: u64 = 1 << 63;

/// The tracker while `post_batch` registers work requests it has not handed to the
/// provider yet. If the caller's iterator panics part-way, dropping this forgets them again
/// (their payloads are dropped: the NIC never saw them), so that no completion can cover a
/// work request that was never posted. Disarmed before the provider is called.
struct Staging<'a, T> {
    tracker: &'a mut SendTracker<T>,
    from: Seq,
    armed: bool,
}

impl<T> Drop for Staging<'_, T> {
    fn drop(&mut self) {
        if self.armed
            && let Ok(items) = self.tracker.rollback(self.from)
        {
            items.for_each(drop);
        }
    }
}

impl<D: Device, U> SignaledQueue<D, U> {
    /// A queue over `qp`, whose send completions go to `cq`, with default settings and
    /// `policy`.
    ///
    /// The queue takes `cq` whole (its budget is the CQ's capacity, less its QP's receive
    /// slots if they report to it, and less what queues dropped from it may have left in
    /// it, see [`SignaledQueue`]): `cq` must be the CQ the QP's send queue reports to
    /// (another is refused, [`ConfigError::NotTheSendCq`], where the provider can tell, as
    /// both of selsig's can), and no other queue's; a CQ with another queue on it is refused
    /// ([`ConfigError::CqInUse`]). Queues that share a CQ go on a [`SharedCq`]
    /// ([`on_shared_cq`](Self::on_shared_cq)), or take a budget each
    /// ([`QueueConfig::cq`]). A queue refused hands its QP back in the error.
    pub fn new(qp: D::Qp, cq: Arc<D::Cq>, policy: Policy) -> Result<Self, CreateError<D::Qp>> {
        Self::with_config(qp, cq, QueueConfig::with_policy(policy))
    }

    /// A queue with explicit settings. The send-queue capacity and `sq_sig_all` are read
    /// from the QP, the CQ capacity from the CQ. Without a budget (`config.cq`), the queue
    /// takes `cq` whole, as [`new`](Self::new) does; with one, it shares `cq` with other
    /// queues with budgets, none of which takes it whole, and which, with the receive
    /// slots of the QPs of a [`SharedCq`]'s queues on it, add up to no more than it holds
    /// ([`ConfigError::CqBudgetsTooLarge`]; a shared pool counts once; room for this
    /// QP's receives beside its budget is the caller's to leave). Such a queue polls `cq`
    /// itself: not beside queues on a [`SharedCq`] of the same CQ
    /// ([`ConfigError::CqPolledTwoWays`]). A queue refused hands its QP back in the error.
    pub fn with_config(
        qp: D::Qp,
        cq: Arc<D::Cq>,
        config: QueueConfig,
    ) -> Result<Self, CreateError<D::Qp>> {
        Self::create(qp, cq, config, None)
    }

    /// [`with_config`](Self::with_config), for a queue on the [`SharedCq`] `on_shared`
    /// names ([`SharedCq::id`]), if any.
    fn create(
        qp: D::Qp,
        cq: Arc<D::Cq>,
        config: QueueConfig,
        on_shared: Option<usize>,
    ) -> Result<Self, CreateError<D::Qp>> {
        match Self::prepare(&qp, &cq, &config, on_shared) {
            Ok((claim, tracker, epoch, stale_below)) => {
                let poll_limit = (cq.capacity() as usize).max(1);
                let caps = qp.caps();
                let slots = caps.max_send_wr as usize;
                let list_batch = match caps.max_send_sge {
                    0 | 1 => caps.max_send_wr,
                    _ => caps.max_send_wr.min(LIST_BATCH),
                };
                Ok(SignaledQueue {
                    sge_arena: vec![
                        Sge::default();
                        list_batch as usize * caps.max_send_sge as usize
                    ],
                    list_batch: list_batch.max(1),
                    max_sge: caps.max_send_sge,
                    qp,
                    _claim: claim,
                    cq,
                    tracker,
                    staged: Vec::with_capacity(slots),
                    wcs: vec![
                        WorkCompletion::new(0, WcStatus::Success, 0);
                        config.poll_batch.clamp(1, poll_limit)
                    ],
                    unclaimed: Vec::new(),
                    shared: None,
                    stale_below,
                    marker_target: config.marker_target,
                    clock: config.measure_lag,
                    epoch,
                })
            }
            Err(error) => Err(CreateError { error, qp }),
        }
    }

    /// What a queue needs of `qp`, `cq` and `config`, checked: its claim on `cq`, its
    /// tracker, the tracker's epoch, and below which sequence number a send completion of
    /// its QP's number is a dropped queue's.
    #[allow(clippy::type_complexity)]
    fn prepare(
        qp: &D::Qp,
        cq: &Arc<D::Cq>,
        config: &QueueConfig,
        on_shared: Option<usize>,
    ) -> Result<(CqClaim, SendTracker<Payload<D::Mr, U>>, Instant, u64), ConfigError> {
        if cq.ignores_overrun() {
            return Err(ConfigError::CqIgnoresOverrun);
        }
        if let Some(budget) = &config.cq {
            // Every outstanding work request may make a completion: the budget cannot be
            // more than the CQ holds.
            if budget.capacity() > cq.capacity() {
                return Err(ConfigError::CqBudgetTooLarge {
                    budget: budget.capacity(),
                    room: cq.capacity(),
                });
            }
        }
        if !config.measure_lag && matches!(config.policy, Policy::Adaptive { .. }) {
            return Err(ConfigError::AdaptiveNeedsClock);
        }
        sends_to(qp, cq.as_ref())?;
        // Every receive completes (if only flushed): where they share the CQ, their slots
        // are not the sends'. A queue that takes the CQ whole, or joins a shared CQ, leaves
        // room for them; beside a budget of its own, the caller does, as it alone knows
        // which receives it posts.
        let receives = match config.cq.is_none() || on_shared.is_some() {
            true => receive_slots(qp),
            false => 0,
        };
        let Taken {
            claim,
            budget,
            first_seq,
        } = CqClaim::take(cq, qp.qp_num(), receives, config.cq.as_ref(), on_shared)?;
        let tracker_config = TrackerConfig::new(qp.caps().max_send_wr, 0)
            .cq(budget)
            .policy(config.policy)
            .sq_sig_all(qp.sq_sig_all())
            .first_seq(config.first_seq.max(first_seq))
            .wr_id_tag(SEND_WR_ID_BIT)
            .qp_num(qp.qp_num())
            .measure_lag(config.measure_lag);
        let epoch = Instant::now();
        let tracker = SendTracker::new(tracker_config, epoch)?;
        Ok((claim, tracker, epoch, first_seq))
    }

    /// A queue over `qp` whose send completions go to the CQ `shared`, which other queues
    /// poll too: each queue gets its QP's completions in CQ order, whichever queue polled
    /// them (see [`SharedCq`]). Its budget is the shared pool: `config.cq` must be `None`
    /// or that pool.
    ///
    /// A completion of a QP that has no queue on `shared` (receives of any QP among them)
    /// goes to the queue that polled it, for [`take_unclaimed`](Self::take_unclaimed).
    /// When the QP's receive completions go to `shared` too, its receive slots must fit
    /// in the CQ beside the pool's credits and the receive slots of the queues already on
    /// it ([`ConfigError::NoCqRoomForReceives`]). The CQ may have no queue that polls it
    /// otherwise: one with a budget of its own, or on another `SharedCq` of it
    /// ([`ConfigError::CqPolledTwoWays`]).
    ///
    /// A QP may get the number of a QP whose queue on `shared` was dropped while that
    /// queue's completions could still come (its provider's destroy leaves them in the CQ,
    /// as rxe's). The new queue's sequence numbers then start past the old queue's
    /// (`config.first_seq` is raised to them), and the old queue's completions go to
    /// [`take_unclaimed`](Self::take_unclaimed): they retire none of its work requests.
    pub fn on_shared_cq(
        qp: D::Qp,
        shared: &SharedCq<D>,
        mut config: QueueConfig,
    ) -> Result<Self, CreateError<D::Qp>> {
        match &config.cq {
            None => config.cq = Some(CqBudget::Shared(shared.credits().clone())),
            Some(CqBudget::Shared(pool)) if pool.same_pool(shared.credits()) => {}
            Some(_) => {
                return Err(CreateError {
                    error: ConfigError::NotTheSharedPool,
                    qp,
                });
            }
        }
        if let Err(error) = sends_to(&qp, shared.cq().as_ref()) {
            return Err(CreateError { error, qp });
        }
        let qp_num = qp.qp_num();
        if let Err(error) = shared.register(qp_num, receive_slots(&qp)) {
            return Err(CreateError { error, qp });
        }
        match Self::create(qp, Arc::clone(shared.cq()), config, Some(shared.id())) {
            Ok(mut queue) => {
                queue.shared = Some(shared.clone());
                Ok(queue)
            }
            Err(e) => {
                shared.unregister(qp_num, false);
                Err(e)
            }
        }
    }

    /// Now, or the creation time when the queue does without the clock.
    #[inline(always)]
    fn now(&self) -> Instant {
        if self.clock {
            Instant::now()
        } else {
            self.epoch
        }
    }

    /// The queue pair.
    pub fn qp(&self) -> &D::Qp {
        &self.qp
    }

    /// The completion queue. Polling it directly takes completions the queue waits for:
    /// hand each of this queue's to [`handle_completion`](Self::handle_completion).
    pub fn cq(&self) -> &Arc<D::Cq> {
        &self.cq
    }

    /// The tracker (read-only).
    pub fn tracker(&self) -> &SendTracker<Payload<D::Mr, U>> {
        &self.tracker
    }

    /// Statistics.
    pub fn stats(&self) -> &Stats {
        self.tracker.stats()
    }

    /// Work requests posted and not yet retired.
    pub fn outstanding(&self) -> u32 {
        self.tracker.outstanding()
    }

    /// How many more work requests fit now.
    pub fn available(&self) -> u32 {
        self.tracker.available()
    }

    /// The queue's state.
    pub fn state(&self) -> QueueState {
        self.tracker.state()
    }

    /// Completions polled that are not this queue's sends ([`send_seq`](Self::send_seq) is
    /// `None`: another QP's on a shared CQ, this QP's receives, a send posted around the
    /// queue), for the caller to route. Another queue's completion keeps its credit of a
    /// shared pool taken until that queue handles it
    /// ([`handle_completion`](Self::handle_completion)), so route them promptly.
    ///
    /// Where several queues poll one CQ, create them with
    /// [`on_shared_cq`](Self::on_shared_cq) instead: routing by hand, a queue that polls
    /// again before its completions polled by another queue are handed to it sees its
    /// later completions first (a flush before the error it follows). Their completions
    /// then never come here; those of QPs without a queue on the CQ still do.
    pub fn take_unclaimed(&mut self) -> Vec<WorkCompletion> {
        std::mem::take(&mut self.unclaimed)
    }

    /// Posts one work request (its own doorbell). The shortest path for a single work
    /// request: nothing is staged.
    pub fn post(
        &mut self,
        work: Work<'_, D::Mr, U>,
    ) -> Result<Posted, QueuePostError<Payload<D::Mr, U>>> {
        let now = self.now();
        let Work {
            opcode,
            signal,
            imm_data,
            data,
            remote,
            user,
        } = work;
        let mut arena = &mut self.sge_arena[..];
        let (local, (buffer, list)) = match local_of(data, self.max_sge, &mut arena) {
            Ok(local) => local,
            Err(((buffer, list), source)) => {
                return Err(QueuePostError::Invalid {
                    work: Payload { buffer, list, user },
                    source,
                });
            }
        };
        let posted = self
            .tracker
            .post(Payload { buffer, list, user }, signal, now)
            .map_err(QueuePostError::Refused)?;
        let wr = SendWr {
            wr_id: posted.wr_id,
            opcode,
            local,
            remote,
            imm_data,
            signaled: posted.signaled(),
        };
        if let Err(source) = self.qp.post_send(std::slice::from_ref(&wr)) {
            // Index 1 (or beyond): the provider took it and failed after; it stays
            // outstanding. Index 0: it was just registered and is the last one, so the
            // rollback is accepted.
            let returned: Vec<_> = match source.index {
                0 => match self.tracker.rollback(posted.seq) {
                    Ok(items) => items.collect(),
                    Err(_) => Vec::new(),
                },
                _ => Vec::new(),
            };
            return Err(QueuePostError::Provider { returned, source });
        }
        Ok(posted)
    }

    /// Like [`post`](Self::post), but a work request that finds no room (a full send
    /// queue or CQ budget, or a shared pool whose credits other queues took) comes back
    /// whole, in [`TryPostError::NoRoom`], to be posted again once completions made room:
    /// for callers that wait for room and then post, where another queue may take a
    /// shared credit in between (`selsig-tokio`'s async post).
    pub fn try_post<'a>(
        &mut self,
        work: Work<'a, D::Mr, U>,
    ) -> Result<Posted, TryPostError<'a, D::Mr, U>> {
        if self.tracker.available() == 0 {
            return Err(TryPostError::NoRoom(work));
        }
        let shape = work.shape();
        match self.post(work) {
            Ok(posted) => Ok(posted),
            Err(QueuePostError::Refused(e)) if e.is_full() => Err(TryPostError::NoRoom(
                Work::reassemble(shape, e.into_payload()),
            )),
            Err(e) => Err(TryPostError::Failed(e)),
        }
    }

    /// Posts work requests from `works` with one doorbell, as many as fit now (at most
    /// [`LIST_BATCH`] on a queue pair that takes scatter/gather lists); the rest
    /// stay in the iterator. Returns how many were posted. An iterator that owns what it
    /// has not yielded (`Vec::drain`, `into_iter`) drops it, buffers included, when it is
    /// dropped: keep it and post the rest later, or offer no more than
    /// [`available`](Self::available).
    ///
    /// A work request the tracker refuses (error state, draining, or a full CQ budget:
    /// with a shared pool, other queues may take its credits while the batch is built;
    /// poll and post the rest again) comes back in the error (those before it are
    /// posted). If the provider refuses one, the tracker forgets it and every later one
    /// taken from `works`, and their payloads come back in the error's `returned`,
    /// followed by the one the tracker refused, if any. A provider that took every work
    /// request and failed after (the error's `index` is the number taken) hands none
    /// back: they stay outstanding.
    ///
    /// Short lists are taken from `works` whole and handed to the provider's
    /// [`post_send`](QueuePair::post_send); lists that may be as long as the provider's
    /// [`post_send_iter_min`](QueuePair::post_send_iter_min) (by `works`' size hint and the
    /// room) go to its [`post_send_iter`](QueuePair::post_send_iter), which takes each
    /// work request as the tracker registers it. There a provider that refuses the list
    /// before taking any (a queue pair not ready to send) leaves every work request in
    /// `works`, and `returned` is empty.
    ///
    /// If `works` panics, the work requests it yielded before are forgotten (none was
    /// posted; their payloads are dropped) and the queue is as it was. A provider whose
    /// `post_send` panics leaves the queue not knowing what was posted: drop it.
    pub fn post_batch<'a, I>(
        &mut self,
        works: &mut I,
    ) -> Result<usize, QueuePostError<Payload<D::Mr, U>>>
    where
        I: Iterator<Item = Work<'a, D::Mr, U>>,
    {
        self.post_batch_with(works, |_| {})
    }

    /// [`post_batch`](Self::post_batch), telling `registered` of each work request the
    /// tracker registers, in order, before the provider is asked to post them: on success
    /// all were posted; on a provider's refusal those before its error's `index` were (none
    /// from a provider that posts all or nothing, `ibv_wr_complete`), the rest came back.
    /// For callers that record what was posted and how it was signaled (the scenario
    /// runner's trace).
    pub fn post_batch_with<'a, I>(
        &mut self,
        works: &mut I,
        mut registered: impl FnMut(&Posted),
    ) -> Result<usize, QueuePostError<Payload<D::Mr, U>>>
    where
        I: Iterator<Item = Work<'a, D::Mr, U>>,
    {
        let now = self.now();
        // Room is read up front: slots only shrink by our own posts. A shared pool's
        // credits can also go to other queues meanwhile (the tracker then refuses with
        // `CqFull` part-way) or come back. With no room, the first work request is still
        // offered: the tracker says why it is refused, or takes it if credits came back.
        let room = self.tracker.available().max(1).min(self.list_batch);
        // The most this list can hold, by which the provider's way of taking it is chosen.
        let max = works
            .size_hint()
            .1
            .map_or(room as usize, |n| n.min(room as usize));
        // Work requests the tracker takes without a check (see `reserved_room`); the rest
        // go through `post`, which may refuse them.
        let reserved = self.tracker.reserved_room();
        let now_ns = self.tracker.nanos_of(now);
        let from = self.tracker.next_seq();
        let mut refused = None;
        // The caller's iterator runs between the tracker's registrations (and, with
        // `post_send_iter`, between the provider's writes): if it panics, the guard
        // forgets the work requests registered so far.
        let mut staging = Staging {
            from,
            tracker: &mut self.tracker,
            armed: true,
        };
        let mut taken = 0u32;
        // Lists of buffers take their entries from here, `max_sge` at most each.
        let max_sge = self.max_sge;
        let mut arena = &mut self.sge_arena[..];
        let result = if max >= self.qp.post_send_iter_min() {
            let wrs = std::iter::from_fn(|| {
                if taken == room || refused.is_some() {
                    return None;
                }
                let wr = register(
                    staging.tracker,
                    works.next()?,
                    taken < reserved,
                    (now, now_ns),
                    (max_sge, &mut arena),
                    &mut refused,
                    &mut registered,
                );
                taken += 1;
                wr
            });
            self.qp.post_send_iter(max, wrs)
        } else {
            // Staged whole, then posted: inline bytes and lists apart (`staged` outlives
            // the caller's bytes and the arena's borrow), put back for the post.
            self.staged.clear();
            let mut apart: Vec<(usize, Local<'_>)> = Vec::new();
            while taken < room {
                let Some(work) = works.next() else {
                    break;
                };
                let unchecked = taken < reserved;
                let Some(wr) = register(
                    staging.tracker,
                    work,
                    unchecked,
                    (now, now_ns),
                    (max_sge, &mut arena),
                    &mut refused,
                    &mut registered,
                ) else {
                    break;
                };
                taken += 1;
                let local = match wr.local {
                    Local::Empty => Local::Empty,
                    Local::Sge(sge) => Local::Sge(sge),
                    borrowed @ (Local::Inline(_) | Local::Sges(_)) => {
                        apart.push((self.staged.len(), borrowed));
                        Local::Empty
                    }
                };
                self.staged.push(SendWr {
                    wr_id: wr.wr_id,
                    opcode: wr.opcode,
                    local,
                    remote: wr.remote,
                    imm_data: wr.imm_data,
                    signaled: wr.signaled,
                });
            }
            match self.staged.len() {
                0 => Ok(0),
                n if apart.is_empty() => self.qp.post_send(&self.staged).map(|()| n),
                n => {
                    // A batch with inline data or lists borrows them for the post.
                    let mut wrs: Vec<SendWr<'_>> = self.staged.clone();
                    for &(i, local) in &apart {
                        wrs[i].local = local;
                    }
                    self.qp.post_send(&wrs).map(|()| n)
                }
            }
        };
        staging.armed = false;
        let count = staging.tracker.next_seq().0 - from.0;
        drop(staging);
        if let Ok(posted) = result {
            debug_assert_eq!(posted as u64, count, "the provider posted what it took");
        }
        if let Err(e) = result {
            // An index at or beyond the work requests registered: the provider took every
            // one and failed after (rxe's doorbell). They stay outstanding: their
            // completions (or the flushes of a drain) retire them.
            let mut returned: Vec<_> = if (e.index as u64) < count {
                // The work requests from there on were registered by this call and are
                // outstanding, so the rollback is accepted.
                match self.tracker.rollback(Seq(from.0 + e.index as u64)) {
                    Ok(items) => items.collect(),
                    Err(_) => Vec::new(),
                }
            } else {
                Vec::new()
            };
            // The work request refused before the post comes after them.
            match refused {
                Some(QueuePostError::Refused(e)) => returned.push(e.into_payload()),
                Some(QueuePostError::Invalid { work, .. }) => returned.push(work),
                Some(QueuePostError::Provider { returned: r, .. }) => returned.extend(r),
                None => {}
            }
            return Err(QueuePostError::Provider {
                returned,
                source: e,
            });
        }
        match refused {
            Some(e) => Err(e),
            None => Ok(count as usize),
        }
    }

    /// Polls the CQ once (up to the poll batch), retires what the completions cover and
    /// appends the retired work requests to `out`, in posting order. Returns how many
    /// completions were polled.
    ///
    /// On a [`SharedCq`] the count is of the completions this queue took: from its inbox,
    /// or from the CQ less those filed for other queues. So 0 does not mean the CQ is
    /// empty: the poll may have taken only other queues' completions. To wait for this
    /// queue's work requests, confirm an unsignaled tail first ([`confirm_all`](Self::confirm_all):
    /// no completion ever retires it otherwise) and poll while
    /// [`outstanding`](Self::outstanding) is not 0, rather than while polls return
    /// completions; or [`drain`](Self::drain).
    ///
    /// Completions that are not this queue's sends (another QP's on a shared CQ, this QP's
    /// receives) are kept for
    /// [`take_unclaimed`](Self::take_unclaimed) (on a [`SharedCq`], those of other queues
    /// go to them). An impossible completion of this QP is reported after the rest of the
    /// batch was handled.
    pub fn poll(&mut self, out: &mut Vec<Completion<D::Mr, U>>) -> Result<usize, PollError> {
        self.poll_with(|c| out.push(c))
    }

    /// Like [`poll`](Self::poll), handing each retired work request to `f`, in posting
    /// order, instead of appending it to a vector: buffers go straight back to wherever
    /// the caller keeps them. The fastest way to poll (about 2 ns per work request less
    /// than [`poll`](Self::poll) and a drained vector in `cargo bench -p selsig --bench
    /// queue`).
    ///
    /// ```
    /// # use selsig::{Buffer, Device, Outcome, SignaledQueue};
    /// # fn f<D: Device>(queue: &mut SignaledQueue<D, u64>, free: &mut Vec<Buffer<D::Mr>>) -> Result<(), selsig::PollError> {
    /// let mut failed = Vec::new();
    /// queue.poll_with(|done| {
    ///     if done.outcome != Outcome::Completed {
    ///         failed.push((done.seq, done.outcome));
    ///     }
    ///     free.extend(done.buffer); // reusable: the NIC no longer reads it
    /// })?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// If `f` panics, the poll ends there: the work request it was handed is its own, and
    /// the next poll hands back the ones after it (their completions were handled; an
    /// impossible completion among them, counted in [`Stats::rejected_cqes`], goes
    /// unreported).
    pub fn poll_with<F>(&mut self, f: F) -> Result<usize, PollError>
    where
        F: FnMut(Completion<D::Mr, U>),
    {
        let n = self.poll_cq()?;
        let mut first_error = None;
        if n > 0 {
            let now = self.now();
            for i in 0..n {
                let wc = self.wcs[i];
                if let Err(e) = self.handle(&wc, now) {
                    first_error.get_or_insert(e);
                }
            }
        }
        self.collect_with(f);
        match first_error {
            Some(e) => Err(e.into()),
            None => Ok(n),
        }
    }

    /// Polls the CQ (or the queue's inbox on a [`SharedCq`]) into `self.wcs`.
    #[inline]
    fn poll_cq(&mut self) -> Result<usize, PollError> {
        Ok(match &self.shared {
            Some(shared) => shared.poll(self.qp.qp_num(), &mut self.wcs)?,
            // A count beyond the buffer (a provider breaking its contract) is cut to it.
            None => self.cq.poll(&mut self.wcs)?.min(self.wcs.len()),
        })
    }

    /// Handles one completion polled elsewhere (a CQ shared by several queues, or a caller
    /// that wants to see every completion): it must belong to this queue's QP. Returns what
    /// it retired; collect those work requests with [`collect`](Self::collect).
    ///
    /// A completion of another QP is refused with [`CompletionError::WrongQueue`], one of
    /// this QP that is not a send of this queue (see [`send_seq`](Self::send_seq)) with
    /// [`CompletionError::NotASend`].
    pub fn handle_completion(&mut self, wc: &WorkCompletion) -> Result<Handled, CompletionError> {
        let now = self.now();
        self.tracker.handle_completion(wc, now)
    }

    /// The sequence number of the work request `wc` completes, if it is a completion of
    /// one of this queue's sends: this QP's number, bit 63 of the `wr_id` set
    /// ([`SEND_WR_ID_BIT`]) and, for a successful completion, not a receive opcode (an
    /// error's opcode is undefined and not read). Everything else (another QP's
    /// completion, a receive's, a send posted on the QP around the queue with bit 63 of its
    /// `wr_id` clear) is `None`. The tracker decodes it: [`SendTracker::send_seq`].
    ///
    /// On a QP whose receive completions go to the same CQ, the `wr_id` alone tells a
    /// send's error or flush from a receive's: receives must be posted with bit 63 of the
    /// `wr_id` clear (indices are, and x86-64's user-space pointers; arm64's tagged
    /// pointers, such as Android's heap pointers, may not be).
    #[inline]
    pub fn send_seq(&self, wc: &WorkCompletion) -> Option<Seq> {
        self.tracker.send_seq(wc)
    }

    fn handle(&mut self, wc: &WorkCompletion, now: Instant) -> Result<(), CompletionError> {
        match self.send_seq(wc) {
            Some(seq) if seq.0 >= self.stale_below => {
                self.tracker.handle_send(seq, wc, now).map(|_| ())
            }
            // Not a send of this queue: another QP's, a receive's, or one of a dropped
            // queue of a QP with the same number.
            _ => {
                self.unclaimed.push(*wc);
                Ok(())
            }
        }
    }

    /// Appends every retired work request not yet handed back to `out`, in posting order.
    pub fn collect(&mut self, out: &mut Vec<Completion<D::Mr, U>>) {
        self.collect_with(|c| out.push(c));
    }

    /// Hands every retired work request not yet handed back to `f`, in posting order.
    fn collect_with(&mut self, mut f: impl FnMut(Completion<D::Mr, U>)) {
        self.tracker.poll_retired_with(|r| {
            f(Completion {
                seq: r.seq,
                buffer: r.payload.buffer,
                list: r.payload.list,
                user: r.payload.user,
                outcome: r.outcome,
                signaled: r.signaled,
            })
        });
    }

    /// Makes sure everything posted so far will be confirmed: if the last work requests
    /// are unsignaled, posts a signaled zero-length WRITE behind them. Returns the marker's
    /// sequence number, or `None` when no marker was needed. Keep polling to learn the
    /// outcomes. The marker is a WRITE to [`QueueConfig::marker_target`], whose QP must
    /// allow remote writes (on rxe a marker to a QP that does not fails, and both QPs go
    /// to the error state: the queue's error then names the marker's sequence number).
    pub fn confirm_all(&mut self) -> Result<Option<Seq>, QueuePostError<()>> {
        let now = self.now();
        let seq = match self.tracker.confirm_all(now) {
            Ok(Some(seq)) => seq,
            Ok(None) => return Ok(None),
            Err(e) => return Err(QueuePostError::Refused(e)),
        };
        self.post_marker(seq).map(|()| Some(seq))
    }

    fn post_marker(&mut self, seq: Seq) -> Result<(), QueuePostError<()>> {
        let wr = SendWr {
            wr_id: self.tracker.wr_id(seq),
            opcode: Opcode::RdmaWrite,
            local: Local::Empty,
            remote: self.marker_target,
            imm_data: 0,
            signaled: true,
        };
        if let Err(source) = self.qp.post_send(&[wr]) {
            // The marker was just registered and is the last work request: rolling it back
            // is always accepted. At index 1 (or beyond) the provider took it and failed
            // after: it stays outstanding.
            if source.index == 0 {
                let _ = self.tracker.rollback(seq).map(|it| it.count());
            }
            return Err(QueuePostError::Provider {
                returned: Vec::new(),
                source,
            });
        }
        Ok(())
    }

    /// When the `Adaptive` policy's lag bound requires confirming the unsignaled tail
    /// (`None`: nothing is due).
    pub fn next_deadline(&self) -> Option<Instant> {
        self.tracker.next_deadline()
    }

    /// For a caller with nothing more to post: confirms the unsignaled tail if its
    /// deadline has passed. Returns `true` when a marker was posted (a WRITE to
    /// [`QueueConfig::marker_target`], as [`confirm_all`](Self::confirm_all) posts).
    ///
    /// A full queue (or CQ) is no error: a full queue always holds a signaled work request
    /// before the tail (the tracker never lets an unsignaled run fill it), so room comes
    /// with the next completions; the deadline stays, and a later `tick` posts the marker.
    /// With a pool of credits shared with other queues, the credits may all be held by
    /// those queues' work requests: room comes when those queues retire them (they must
    /// poll, or be handed their completions).
    pub fn tick(&mut self) -> Result<bool, QueuePostError<()>> {
        match self.tracker.next_deadline() {
            Some(deadline) if Instant::now() >= deadline => match self.confirm_all() {
                Ok(marker) => Ok(marker.is_some()),
                Err(QueuePostError::Refused(e)) if e.is_full() => Ok(false),
                Err(e) => Err(e),
            },
            _ => Ok(false),
        }
    }
}
