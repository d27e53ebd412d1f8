//! Queues that share one completion queue and each poll it ([`SharedCq`]), on a fake
//! device whose CQ the tests fill as a NIC would: every queue sees its completions in CQ
//! order whichever queue polled them, credits come back, and CQ budgets beyond the CQ are
//! refused. Also, on the same fake, what a queue hands back when the provider fails a
//! post part-way or after taking the whole batch, and what a queue of its own CQ reports.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use selsig::{
    CompletionQueue, ConfigError, ConnectOptions, CqBudget, CqCredits, CqError, DrainError,
    Endpoint, Opcode, Outcome, Policy, PostFailure, PostWrError, ProviderError, QpCaps, QpState,
    QueueConfig, QueuePair, QueueState, RecvWr, RemoteAddr, SendWr, Seq, SharedCq, SignaledQueue,
    WcOpcode, WcStatus, Work, WorkCompletion,
};
use selsig_testkit::null::{NullDevice, NullMr};

/// The `wr_id` a `SignaledQueue` posts work request `seq` with: bit 63 set.
fn send_wr_id(seq: Seq) -> u64 {
    seq.0 | selsig::SEND_WR_ID_BIT
}

/// A region of this many bytes (none of them held: reads and writes do nothing).
/// A CQ whose content the test writes directly (what the NIC would do).
struct FakeCq {
    capacity: u32,
    ring: Mutex<VecDeque<WorkCompletion>>,
    /// A poll that fills the buffer says it filled one more (a provider breaking its
    /// contract).
    overcounts: bool,
}

impl FakeCq {
    fn new(capacity: u32) -> Arc<Self> {
        Arc::new(FakeCq {
            capacity,
            ring: Mutex::new(VecDeque::new()),
            overcounts: false,
        })
    }
    fn push(&self, wc: WorkCompletion) {
        self.ring.lock().unwrap().push_back(wc);
    }
    /// The completion of the send `seq` of QP `qp_num`, as a `SignaledQueue` posted it.
    fn complete(&self, seq: u64, status: WcStatus, qp_num: u32) {
        self.push(WorkCompletion::new(send_wr_id(Seq(seq)), status, qp_num));
    }
}

impl CompletionQueue for FakeCq {
    fn capacity(&self) -> u32 {
        self.capacity
    }
    fn poll(&self, out: &mut [WorkCompletion]) -> Result<usize, CqError> {
        let mut ring = self.ring.lock().unwrap();
        let n = ring.len().min(out.len());
        for slot in out.iter_mut().take(n) {
            *slot = ring.pop_front().unwrap();
        }
        Ok(if self.overcounts && n == out.len() {
            n + 1
        } else {
            n
        })
    }
}

/// (wr_id, opcode, bytes, imm_data, signaled) of a work request posted.
type Posted = (u64, Opcode, usize, u32, bool);

/// A QP that accepts every post and logs what it took (the tests write its completions),
/// unless a test set a failure for the next post: that post logs nothing, whatever the
/// failure's index says the provider took.
struct FakeQp {
    num: u32,
    depth: u32,
    /// Receive slots, whose completions go to the send CQ.
    recvs: u32,
    /// Destroying the QP removes its completions from the CQ (mlx5).
    cleans: bool,
    /// The next post fails with (index, failure).
    fail_next: Mutex<Option<(usize, PostFailure)>>,
    /// Created with `sq_sig_all`: every work request makes a completion.
    sig_all: bool,
    /// What was posted.
    posted: Mutex<Vec<Posted>>,
    /// The QP is in the error state (`to_error`, or set by a test for an error completion).
    in_error: std::sync::atomic::AtomicBool,
    /// Posts in the error state are refused (bnxt_re and ionic take posts only in RTS and
    /// SQD), where mlx5 and rxe take them and flush them.
    refuses_in_error: bool,
}

impl QueuePair for FakeQp {
    fn qp_num(&self) -> u32 {
        self.num
    }
    fn caps(&self) -> QpCaps {
        QpCaps {
            max_send_wr: self.depth,
            max_recv_wr: self.recvs,
            ..QpCaps::default()
        }
    }
    fn sq_sig_all(&self) -> bool {
        self.sig_all
    }
    fn state(&self) -> QpState {
        match self.in_error.load(std::sync::atomic::Ordering::Relaxed) {
            true => QpState::Err,
            false => QpState::Rts,
        }
    }
    fn endpoint(&self, _: &ConnectOptions) -> Result<Endpoint, ProviderError> {
        unreachable!()
    }
    fn connect(&self, _: &Endpoint, _: &ConnectOptions) -> Result<(), ProviderError> {
        Ok(())
    }
    fn to_error(&self) -> Result<(), ProviderError> {
        self.in_error
            .store(true, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }
    fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<(), PostWrError> {
        if self.refuses_in_error && self.state() == QpState::Err {
            return Err(PostWrError {
                index: 0,
                failure: PostFailure::State(QpState::Err),
                source: None,
            });
        }
        match self.fail_next.lock().unwrap().take() {
            Some((index, failure)) => Err(PostWrError {
                index,
                failure,
                source: None,
            }),
            None => {
                let log = wrs
                    .iter()
                    .map(|w| (w.wr_id, w.opcode, w.local.len(), w.imm_data, w.signaled));
                self.posted.lock().unwrap().extend(log);
                Ok(())
            }
        }
    }
    fn post_recv(&self, _: &[RecvWr]) -> Result<(), PostWrError> {
        Ok(())
    }
    fn recv_cq_is_send_cq(&self) -> bool {
        self.recvs > 0
    }
    fn destroy_cleans_cq(&self) -> bool {
        self.cleans
    }
}

type FakeDevice = NullDevice<FakeCq, FakeQp>;

fn qp(num: u32, depth: u32) -> FakeQp {
    FakeQp {
        num,
        depth,
        recvs: 0,
        cleans: false,
        fail_next: Mutex::new(None),
        sig_all: false,
        posted: Mutex::new(Vec::new()),
        in_error: std::sync::atomic::AtomicBool::new(false),
        refuses_in_error: false,
    }
}

type Queue = SignaledQueue<FakeDevice, u32>;

/// Queues for QPs 1 (A) and 2 (B), send queues of 8, on one shared CQ, polling one
/// completion at a time.
fn shared_pair(cq: &Arc<FakeCq>, policy: Policy) -> (Queue, Queue, SharedCq<FakeDevice>) {
    let shared = SharedCq::new(Arc::clone(cq));
    let config = QueueConfig {
        poll_batch: 1,
        ..QueueConfig::with_policy(policy)
    };
    let qa = SignaledQueue::on_shared_cq(qp(1, 8), &shared, config.clone()).unwrap();
    let qb = SignaledQueue::on_shared_cq(qp(2, 8), &shared, config).unwrap();
    (qa, qb, shared)
}

fn outcomes(done: &[selsig::Completion<NullMr, u32>]) -> Vec<(u32, Outcome)> {
    done.iter().map(|c| (c.user, c.outcome)).collect()
}

/// Polls `q` while `more(q)` holds, at most 100 times: a queue that stops taking
/// completions fails the test instead of hanging it.
fn poll_while(
    q: &mut Queue,
    done: &mut Vec<selsig::Completion<NullMr, u32>>,
    mut more: impl FnMut(&Queue) -> bool,
) {
    for _ in 0..100 {
        if !more(q) {
            return;
        }
        q.poll(done).unwrap();
    }
    assert!(!more(q), "still more to poll after 100 polls");
}

/// B's WR2 fails, WR3 and WR4 are flushed. A polls first and takes B's error completion;
/// B then polls: it must see the error before the flushes behind it, or it would take the
/// first flush for a QP moved to the error state without an error, and report WR2
/// completed.
#[test]
fn an_error_polled_by_another_queue_reaches_its_queue_before_the_flushes_behind_it() {
    let cq = FakeCq::new(16);
    let (mut qa, mut qb, shared) = shared_pair(&cq, Policy::Never);
    let remote = RemoteAddr::default();
    for i in 1..=4 {
        assert!(!qb.post(Work::write_empty(remote, i)).unwrap().signaled());
    }
    cq.complete(2, WcStatus::RemAccessErr, 2);
    cq.complete(3, WcStatus::WrFlushErr, 2);
    cq.complete(4, WcStatus::WrFlushErr, 2);
    let (mut done_a, mut done_b) = (Vec::new(), Vec::new());
    assert_eq!(
        qa.poll(&mut done_a).unwrap(),
        0,
        "B's completion is not A's"
    );
    assert_eq!(shared.waiting(), 1);
    for polls in 0.. {
        if qb.poll(&mut done_b).unwrap() == 0 {
            break;
        }
        assert!(polls < 100, "still polling after 100 polls");
    }
    assert!(done_a.is_empty() && qa.take_unclaimed().is_empty());
    assert_eq!(
        outcomes(&done_b),
        [
            (1, Outcome::Completed),
            (2, Outcome::Failed(WcStatus::RemAccessErr)),
            (3, Outcome::Flushed),
            (4, Outcome::Flushed),
        ]
    );
    assert_eq!(shared.waiting(), 0);
    assert_eq!(shared.credits().available(), 16);
}

/// B signals WR2 and WR4. A takes B's completion for WR2, then B polls: it gets WR2's
/// before WR4's (routed late, WR4's would be refused as out of order and WR3 and WR4
/// never retired).
#[test]
fn completions_polled_by_another_queue_come_first_and_every_work_request_retires() {
    let cq = FakeCq::new(16);
    let (mut qa, mut qb, shared) = shared_pair(&cq, Policy::Every(2));
    let remote = RemoteAddr::default();
    for i in 1..=4 {
        qb.post(Work::write_empty(remote, i)).unwrap();
    }
    cq.complete(2, WcStatus::Success, 2);
    cq.complete(4, WcStatus::Success, 2);
    let (mut done_a, mut done_b) = (Vec::new(), Vec::new());
    qa.poll(&mut done_a).unwrap();
    qb.poll(&mut done_b).unwrap();
    assert_eq!(
        outcomes(&done_b),
        [(1, Outcome::Completed), (2, Outcome::Completed)]
    );
    qb.drain(Duration::from_secs(5), &mut done_b).unwrap();
    assert_eq!(
        done_b.iter().map(|c| c.user).collect::<Vec<_>>(),
        [1, 2, 3, 4]
    );
    assert_eq!(shared.credits().available(), 16);
}

/// A caller that gives back credits of its own too many (`CqCredits::release` is public)
/// fills the pool; the queue's completions then give back credits the pool has no room for.
/// The pool ignores the excess, and the poll hands back what it retired: the caller's
/// mistake does not fail it (it did, in a debug build).
#[test]
fn credits_given_back_twice_by_the_caller_do_not_fail_a_poll() {
    let cq = FakeCq::new(16);
    let (_qa, mut qb, shared) = shared_pair(&cq, Policy::Always);
    let remote = RemoteAddr::default();
    qb.post(Work::write_empty(remote, 1)).unwrap();
    qb.post(Work::write_empty(remote, 2)).unwrap();
    assert_eq!(shared.credits().available(), 14);
    assert!(
        shared.credits().release(2),
        "room for 2: the pool cannot tell"
    );
    cq.complete(1, WcStatus::Success, 2);
    cq.complete(2, WcStatus::Success, 2);
    let mut done = Vec::new();
    poll_while(&mut qb, &mut done, |q| q.outstanding() > 0);
    assert_eq!(
        outcomes(&done),
        [(1, Outcome::Completed), (2, Outcome::Completed)]
    );
    assert_eq!(
        shared.credits().available(),
        16,
        "never beyond the capacity"
    );
}

/// A queue of QP 1 on `cq` whose provider refuses posts in the error state.
fn refusing_posts_in_error(cq: &Arc<FakeCq>, policy: Policy) -> Queue {
    let qp = FakeQp {
        refuses_in_error: true,
        ..qp(1, 8)
    };
    Queue::new(qp, Arc::clone(cq), policy).unwrap()
}

/// A provider that takes no post in the error state (bnxt_re, ionic) refuses the drain's
/// marker; the NIC flushes every outstanding work request all the same, so the drain waits
/// for those flushes instead of failing: after an error completion, and after the caller
/// moved the QP to the error state with an unsignaled tail.
#[test]
fn a_drain_waits_for_the_flushes_where_the_provider_takes_no_post_in_the_error_state() {
    // WR3 of 4 fails.
    let cq = FakeCq::new(16);
    let mut q = refusing_posts_in_error(&cq, Policy::Every(2));
    let remote = RemoteAddr::default();
    for i in 1..=4 {
        q.post(Work::write_empty(remote, i)).unwrap();
    }
    cq.complete(2, WcStatus::Success, 1);
    cq.complete(3, WcStatus::RemAccessErr, 1);
    // (The NIC moved the QP to the error state with WR3's error.)
    q.qp().to_error().unwrap();
    let mut done = Vec::new();
    poll_while(&mut q, &mut done, |q| q.outstanding() > 1);
    assert!(matches!(q.state(), QueueState::Error { .. }));
    assert_eq!(
        q.post_drain_marker().unwrap(),
        selsig::DrainMarker::NotNeeded,
        "the provider refuses the marker: the flushes retire the rest"
    );
    cq.complete(4, WcStatus::WrFlushErr, 1);
    q.drain(Duration::from_secs(5), &mut done).unwrap();
    assert_eq!(
        outcomes(&done),
        [
            (1, Outcome::Completed),
            (2, Outcome::Completed),
            (3, Outcome::Failed(WcStatus::RemAccessErr)),
            (4, Outcome::Flushed),
        ]
    );
    // An unsignaled tail, the QP moved to the error state by the caller.
    let cq = FakeCq::new(16);
    let mut q = refusing_posts_in_error(&cq, Policy::Never);
    for i in 1..=3 {
        q.post(Work::write_empty(remote, i)).unwrap();
    }
    q.qp().to_error().unwrap();
    for seq in 1..=3 {
        cq.complete(seq, WcStatus::WrFlushErr, 1);
    }
    let mut done = Vec::new();
    q.drain(Duration::from_secs(5), &mut done).unwrap();
    assert_eq!(
        outcomes(&done),
        [
            (1, Outcome::Flushed),
            (2, Outcome::Flushed),
            (3, Outcome::Flushed)
        ]
    );
}

/// An error completion's opcode is undefined (`ibv_poll_cq(3)`): a provider that passes on
/// whatever the NIC left there (a receive's opcode, say) does not hide a send's error or
/// flushes from its queue, which tells them by the `wr_id`.
#[test]
fn an_error_completion_is_a_send_s_whatever_opcode_it_carries() {
    let cq = FakeCq::new(16);
    let mut q = Queue::new(qp(1, 8), Arc::clone(&cq), Policy::Every(4)).unwrap();
    let remote = RemoteAddr::default();
    for i in 1..=4 {
        q.post(Work::write_empty(remote, i)).unwrap();
    }
    let with_recv_opcode = |seq, status| {
        WorkCompletion::new(send_wr_id(Seq(seq)), status, 1).with_opcode(WcOpcode::Recv)
    };
    cq.push(with_recv_opcode(2, WcStatus::RemAccessErr));
    cq.push(with_recv_opcode(3, WcStatus::WrFlushErr));
    cq.push(with_recv_opcode(4, WcStatus::WrFlushErr));
    let mut done = Vec::new();
    poll_while(&mut q, &mut done, |q| q.outstanding() > 0);
    assert!(q.take_unclaimed().is_empty());
    assert_eq!(
        outcomes(&done),
        [
            (1, Outcome::Completed),
            (2, Outcome::Failed(WcStatus::RemAccessErr)),
            (3, Outcome::Flushed),
            (4, Outcome::Flushed),
        ]
    );
}

/// Completions of a QP with no queue on the shared CQ (a receive, say) go to the queue
/// that polled them, as before.
#[test]
fn completions_of_qps_without_a_queue_go_to_the_queue_that_polled_them() {
    let cq = FakeCq::new(16);
    let (mut qa, _qb, shared) = shared_pair(&cq, Policy::Always);
    cq.push(WorkCompletion::new(7, WcStatus::Success, 9));
    let mut done = Vec::new();
    assert_eq!(qa.poll(&mut done).unwrap(), 1);
    assert_eq!(qa.take_unclaimed()[0].qp_num, 9);
    assert_eq!(shared.waiting(), 0);
}

/// A's drain needs the credit B's completion holds, which A polled for B: it says so at
/// once, and ends once B has polled.
#[test]
fn a_drain_that_needs_a_credit_waiting_for_another_queue_says_so() {
    let cq = FakeCq::new(4);
    let (mut qa, mut qb, shared) = shared_pair(&cq, Policy::Never);
    let remote = RemoteAddr::default();
    for i in 1..=3 {
        assert!(!qa.post(Work::write_empty(remote, i)).unwrap().signaled());
    }
    assert!(qb.post(Work::write_empty(remote, 9)).unwrap().signaled());
    assert_eq!(shared.credits().available(), 0);
    // A receive of A's own QP holds no credit of the pool: not blamed. (A polls both
    // before the drain, one at a time.)
    let recv = WorkCompletion::new(5, WcStatus::Success, 1);
    cq.push(recv);
    cq.complete(1, WcStatus::Success, 2);
    let mut done = Vec::new();
    qa.poll(&mut done).unwrap();
    qa.poll(&mut done).unwrap();
    assert!(cq.ring.lock().unwrap().is_empty() && done.is_empty());
    assert_eq!(shared.waiting(), 1);
    match qa.drain(Duration::from_secs(5), &mut done) {
        Err(DrainError::Unrouted { completions: 1 }) => {}
        other => panic!("expected Unrouted, got {other:?}"),
    }
    assert_eq!(qa.take_unclaimed(), [recv]);
    let mut done_b = Vec::new();
    qb.poll(&mut done_b).unwrap();
    assert_eq!(outcomes(&done_b), [(9, Outcome::Completed)]);
    // A's marker: now there is a credit for it; the fake NIC completes it.
    let marker = match qa.post_drain_marker().unwrap() {
        selsig::DrainMarker::Posted(seq) => seq,
        other => panic!("expected a marker, got {other:?}"),
    };
    cq.complete(marker.0, WcStatus::Success, 1);
    qa.drain(Duration::from_secs(5), &mut done).unwrap();
    assert_eq!(done.iter().map(|c| c.user).collect::<Vec<_>>(), [1, 2, 3]);
    assert_eq!(shared.credits().available(), 4);
}

/// A queue dropped with completions another queue polled for it retires them: their
/// credits come back (they are out of the CQ, whatever the provider's destroy does).
#[test]
fn a_dropped_queue_retires_the_completions_polled_for_it() {
    let cq = FakeCq::new(8);
    let (mut qa, mut qb, shared) = shared_pair(&cq, Policy::Always);
    let remote = RemoteAddr::default();
    for i in 1..=3 {
        qb.post(Work::write_empty(remote, i)).unwrap();
    }
    for seq in 1..=3 {
        cq.complete(seq, WcStatus::Success, 2);
    }
    let mut done = Vec::new();
    poll_while(&mut qa, &mut done, |_| !cq.ring.lock().unwrap().is_empty());
    assert_eq!((shared.waiting(), shared.credits().available()), (3, 5));
    drop(qb);
    assert_eq!((shared.waiting(), shared.credits().available()), (0, 8));
    // QP 2's number is free again.
    SignaledQueue::<FakeDevice, u32>::on_shared_cq(qp(2, 8), &shared, QueueConfig::default())
        .unwrap();
}

#[test]
fn a_shared_cq_takes_one_queue_per_qp_and_its_own_pool() {
    let cq = FakeCq::new(8);
    let shared = SharedCq::<FakeDevice>::new(Arc::clone(&cq));
    let _a = Queue::on_shared_cq(qp(1, 8), &shared, QueueConfig::default()).unwrap();
    let again = Queue::on_shared_cq(qp(1, 8), &shared, QueueConfig::default()).map_err(|e| e.error);
    assert!(matches!(
        again,
        Err(ConfigError::SharedCqHasQp { qp_num: 1 })
    ));
    let other_pool = QueueConfig {
        cq: Some(CqBudget::Shared(CqCredits::new(8))),
        ..QueueConfig::default()
    };
    let refused = Queue::on_shared_cq(qp(2, 8), &shared, other_pool).map_err(|e| e.error);
    assert!(matches!(refused, Err(ConfigError::NotTheSharedPool)));
    // The refused queue left no inbox behind: QP 2 can have its queue.
    let own_pool = QueueConfig {
        cq: Some(CqBudget::Shared(shared.credits().clone())),
        ..QueueConfig::default()
    };
    Queue::on_shared_cq(qp(2, 8), &shared, own_pool).unwrap();
}

/// Every outstanding work request may make a completion (errors flush them all): a budget
/// beyond the CQ would let an error overrun it. (Room for receives that share the CQ is the
/// caller's to leave in a budget it gives.)
#[test]
fn a_cq_budget_beyond_the_cq_is_refused() {
    let cq = FakeCq::new(4);
    for budget in [CqBudget::Shared(CqCredits::new(5)), CqBudget::Exclusive(5)] {
        let config = QueueConfig {
            cq: Some(budget),
            ..QueueConfig::default()
        };
        let r = Queue::with_config(qp(1, 64), Arc::clone(&cq), config).map_err(|e| e.error);
        assert!(
            matches!(r, Err(ConfigError::CqBudgetTooLarge { budget: 5, room: 4 })),
            "{:?}",
            r.err()
        );
    }
    let fits = QueueConfig {
        cq: Some(CqBudget::Exclusive(4)),
        ..QueueConfig::default()
    };
    Queue::with_config(qp(1, 64), Arc::clone(&cq), fits).unwrap();
    // The same for a shared CQ whose pool is larger than the CQ (not taken for a lack of
    // room for receives: the QP has none).
    let shared = SharedCq::with_credits(Arc::clone(&cq), CqCredits::new(5));
    let r = Queue::on_shared_cq(qp(1, 64), &shared, QueueConfig::default()).map_err(|e| e.error);
    assert!(
        matches!(r, Err(ConfigError::CqBudgetTooLarge { budget: 5, room: 4 })),
        "{:?}",
        r.err()
    );
}

/// A QP whose destruction removes its completions from the CQ (mlx5) leaves none behind to
/// be taken for a later queue's: a queue on a new QP with the same number starts at 1.
#[test]
fn a_queue_replacing_one_whose_qp_cleaned_the_cq_starts_afresh() {
    let cq = FakeCq::new(16);
    let shared = SharedCq::new(Arc::clone(&cq));
    let remote = RemoteAddr::default();
    let cleaning = FakeQp {
        cleans: true,
        ..qp(2, 8)
    };
    let mut qb =
        Queue::on_shared_cq(cleaning, &shared, QueueConfig::with_policy(Policy::Never)).unwrap();
    for i in 1..=3 {
        qb.post(Work::write_empty(remote, i)).unwrap();
    }
    drop(qb);
    let mut qc =
        Queue::on_shared_cq(qp(2, 8), &shared, QueueConfig::with_policy(Policy::Always)).unwrap();
    assert_eq!(qc.post(Work::write_empty(remote, 100)).unwrap().seq, Seq(1));
}

/// A provider whose poll says it filled more of the buffer than there is is not trusted
/// beyond the buffer, on a CQ of its own or a shared one.
#[test]
fn a_poll_count_beyond_the_buffer_is_cut_to_it() {
    for shared in [false, true] {
        let cq = Arc::new(FakeCq {
            capacity: 16,
            ring: Mutex::new(VecDeque::new()),
            overcounts: true,
        });
        let config = QueueConfig {
            poll_batch: 1,
            ..QueueConfig::with_policy(Policy::Always)
        };
        let mut q = match shared {
            false => Queue::with_config(qp(1, 8), Arc::clone(&cq), config).unwrap(),
            true => {
                let shared = SharedCq::new(Arc::clone(&cq));
                Queue::on_shared_cq(qp(1, 8), &shared, config).unwrap()
            }
        };
        let remote = RemoteAddr::default();
        for i in 1..=2 {
            assert!(q.post(Work::write_empty(remote, i)).unwrap().signaled());
            cq.complete(i.into(), WcStatus::Success, 1);
        }
        let mut done = Vec::new();
        assert_eq!(q.poll(&mut done).unwrap(), 1, "shared: {shared}");
        assert_eq!(q.poll(&mut done).unwrap(), 1, "shared: {shared}");
        assert_eq!(
            outcomes(&done),
            [(1, Outcome::Completed), (2, Outcome::Completed)]
        );
    }
}

/// A provider that fails part-way hands back the work request it names and those after it;
/// one that took the whole batch and failed after (rxe, when its doorbell `write()` fails:
/// the error's index is the batch's length) hands back none. Those stay outstanding until
/// a completion covers them: their buffers must not be reused while the NIC may still read
/// them.
#[test]
fn work_requests_the_provider_took_before_failing_stay_outstanding() {
    let cq = FakeCq::new(16);
    let mut q = Queue::new(qp(1, 8), Arc::clone(&cq), Policy::Never).unwrap();
    let remote = RemoteAddr::default();
    let fail_next = |q: &Queue, index, failure| {
        *q.qp().fail_next.lock().unwrap() = Some((index, failure));
    };
    let returned_users =
        |r: Result<_, selsig::QueuePostError<selsig::Payload<NullMr, u32>>>| match r {
            Err(selsig::QueuePostError::Provider { returned, source }) => (
                returned.iter().map(|p| p.user).collect::<Vec<_>>(),
                source.index,
            ),
            other => panic!("expected a provider error, got {other:?}"),
        };

    fail_next(&q, 3, PostFailure::AfterPosting);
    let mut batch = (1..=3).map(|i| Work::write_empty(remote, i));
    assert_eq!(
        returned_users(q.post_batch(&mut batch).map(|_| ())),
        (vec![], 3)
    );
    assert_eq!(q.outstanding(), 3);

    fail_next(&q, 1, PostFailure::AfterPosting);
    assert_eq!(
        returned_users(q.post(Work::write_empty(remote, 4)).map(|_| ())),
        (vec![], 1)
    );
    assert_eq!(q.outstanding(), 4);

    fail_next(&q, 1, PostFailure::Other);
    let mut batch = (5..=7).map(|i| Work::write_empty(remote, i));
    assert_eq!(
        returned_users(q.post_batch(&mut batch).map(|_| ())),
        (vec![6, 7], 1)
    );
    assert_eq!(q.outstanding(), 5);

    // Nothing is retired until the NIC says so: the marker's completion covers all five.
    let mut done = Vec::new();
    assert_eq!(q.poll(&mut done).unwrap(), 0);
    assert!(done.is_empty());
    let marker = q
        .confirm_all()
        .unwrap()
        .expect("an unsignaled tail needs a marker");
    cq.complete(marker.0, WcStatus::Success, 1);
    q.poll(&mut done).unwrap();
    assert_eq!(
        outcomes(&done),
        (1..=5).map(|i| (i, Outcome::Completed)).collect::<Vec<_>>()
    );
    assert_eq!(q.outstanding(), 0);
}

/// Another queue's thread takes the pool's last credits while a batch is built (here the
/// batch's own iterator does it, deterministically): the inline work request that finds no
/// credit comes back refused, and the one before it is posted. (Its staged bytes once
/// pointed past the batch, and the post panicked.)
#[test]
fn an_inline_work_request_refused_part_way_through_a_batch_comes_back() {
    let cq = FakeCq::new(8);
    let shared = SharedCq::new(Arc::clone(&cq));
    let mut q =
        Queue::on_shared_cq(qp(1, 8), &shared, QueueConfig::with_policy(Policy::Never)).unwrap();
    let pool = shared.credits().clone();
    let bytes = [7u8; 8];
    let remote = RemoteAddr::default();
    let mut i = 0;
    let mut works = std::iter::from_fn(|| {
        i += 1;
        match i {
            1 => Some(Work::write_empty(remote, 1)),
            2 => {
                assert!(pool.try_acquire(pool.available()).is_some());
                Some(Work::write_inline(&bytes, remote, 2))
            }
            _ => None,
        }
    });
    match q.post_batch(&mut works) {
        Err(selsig::QueuePostError::Refused(e)) => {
            assert!(e.is_full(), "{e}");
            assert_eq!(e.into_payload().user, 2);
        }
        other => panic!("expected the inline work request refused, got {other:?}"),
    }
    assert_eq!(q.outstanding(), 1);
}

/// The same through the last sequence numbers: the third work request, inline, is refused.
#[test]
fn an_inline_work_request_past_the_last_sequence_number_comes_back() {
    let cq = FakeCq::new(64);
    let config = QueueConfig {
        first_seq: (1 << 63) - 2,
        ..QueueConfig::with_policy(Policy::Never)
    };
    let mut q = Queue::with_config(qp(1, 8), cq, config).unwrap();
    let bytes = [7u8; 8];
    let remote = RemoteAddr::default();
    let mut works = [
        Work::write_empty(remote, 1),
        Work::write_empty(remote, 2),
        Work::write_inline(&bytes, remote, 3),
    ]
    .into_iter();
    match q.post_batch(&mut works) {
        Err(selsig::QueuePostError::Refused(e)) => assert_eq!(e.into_payload().user, 3),
        other => panic!("expected the inline work request refused, got {other:?}"),
    }
    assert_eq!(q.outstanding(), 2);
}

/// Every receive completes (if only flushed): a queue whose QP's receive completions go to
/// the shared CQ needs its receive slots beside the pool's credits, with those of the
/// queues before it. A pool of the whole CQ (`SharedCq::new`) leaves none.
#[test]
fn a_shared_cq_keeps_room_for_the_receives_that_report_to_it() {
    let with_recvs = |num, recvs| FakeQp {
        recvs,
        ..qp(num, 8)
    };
    let config = || QueueConfig::with_policy(Policy::Never);
    let cq = FakeCq::new(8);
    let whole = SharedCq::new(Arc::clone(&cq));
    assert_eq!(
        Queue::on_shared_cq(with_recvs(1, 8), &whole, config())
            .err()
            .map(|e| e.error),
        Some(ConfigError::NoCqRoomForReceives {
            capacity: 8,
            credits: 8,
            receives: 8
        })
    );
    // Refused, it left nothing behind: the QP can join without receives here.
    Queue::on_shared_cq(qp(1, 8), &whole, config()).unwrap();

    let shared = SharedCq::with_credits(Arc::clone(&cq), CqCredits::new(4));
    let q1 = Queue::on_shared_cq(with_recvs(1, 2), &shared, config()).unwrap();
    // Destroying q2's QP removes its completions from the CQ (mlx5).
    let cleaning = FakeQp {
        cleans: true,
        ..with_recvs(2, 2)
    };
    let q2 = Queue::on_shared_cq(cleaning, &shared, config()).unwrap();
    assert_eq!(
        Queue::on_shared_cq(with_recvs(3, 1), &shared, config())
            .err()
            .map(|e| e.error),
        Some(ConfigError::NoCqRoomForReceives {
            capacity: 8,
            credits: 4,
            receives: 5
        })
    );
    let _q3 = Queue::on_shared_cq(qp(3, 8), &shared, config()).unwrap();
    // A dropped queue whose QP's destruction leaves its completions in the CQ (rxe)
    // keeps its receive slots: its receives' completions may still come.
    drop(q1);
    assert_eq!(
        Queue::on_shared_cq(with_recvs(4, 2), &shared, config())
            .err()
            .map(|e| e.error),
        Some(ConfigError::NoCqRoomForReceives {
            capacity: 8,
            credits: 4,
            receives: 6
        })
    );
    // Kept for the CQ's lifetime: a new QP with the same number does not free them.
    let same_number = FakeQp {
        cleans: true,
        ..qp(1, 8)
    };
    drop(Queue::on_shared_cq(same_number, &shared, config()).unwrap());
    assert!(Queue::on_shared_cq(with_recvs(4, 2), &shared, config()).is_err());
    // One whose destruction removes them gives them back.
    drop(q2);
    let _q4 = Queue::on_shared_cq(with_recvs(4, 2), &shared, config()).unwrap();
}

/// A's drain finds no credit for its marker while B's completion waits in B's inbox, but
/// A's own signaled WRITE is on its way and frees credits: the drain waits for it instead
/// of giving up.
#[test]
fn a_drain_waits_for_its_own_completion_before_blaming_another_queue() {
    let cq = FakeCq::new(4);
    let (mut qa, mut qb, _shared) = shared_pair(&cq, Policy::Never);
    let remote = RemoteAddr::default();
    assert!(!qa.post(Work::write_empty(remote, 1)).unwrap().signaled());
    let forced = Work::write_empty(remote, 2).signal(selsig::Signal::Force);
    assert!(qa.post(forced).unwrap().signaled());
    assert!(!qa.post(Work::write_empty(remote, 3)).unwrap().signaled());
    assert!(qb.post(Work::write_empty(remote, 9)).unwrap().signaled());
    cq.complete(1, WcStatus::Success, 2);
    let mut done = Vec::new();
    // A polls B's completion into B's inbox; its own is not written yet.
    qa.poll(&mut done).unwrap();
    cq.complete(2, WcStatus::Success, 1);
    // The marker of the drain: the fake NIC completes it when A posts it (seq 4).
    cq.complete(4, WcStatus::Success, 1);
    qa.drain(Duration::from_secs(5), &mut done).unwrap();
    assert_eq!(
        outcomes(&done),
        (1..=3).map(|i| (i, Outcome::Completed)).collect::<Vec<_>>()
    );
}

/// Queues routed by hand (a shared pool, no `SharedCq`) on a CQ of 3: B polled A's
/// completion, A polled B's, and no credit is left for A's drain marker. A's send queue
/// has `depth` slots, two of them taken. Returns A and B (B holds A's completion: keep
/// it).
fn a_queue_whose_completion_another_holds(depth: u32) -> (Queue, Queue) {
    let cq = FakeCq::new(3);
    let pool = CqCredits::new(3);
    let config = QueueConfig {
        poll_batch: 1,
        cq: Some(CqBudget::Shared(pool.clone())),
        ..QueueConfig::with_policy(Policy::Never)
    };
    let mut qa = Queue::with_config(qp(1, depth), Arc::clone(&cq), config.clone()).unwrap();
    let mut qb = Queue::with_config(qp(2, 8), Arc::clone(&cq), config).unwrap();
    let remote = RemoteAddr::default();
    let forced = Work::write_empty(remote, 1).signal(selsig::Signal::Force);
    assert!(qa.post(forced).unwrap().signaled());
    assert!(!qa.post(Work::write_empty(remote, 2)).unwrap().signaled());
    assert!(qb.post(Work::write_empty(remote, 9)).unwrap().signaled());
    cq.complete(1, WcStatus::Success, 1);
    cq.complete(1, WcStatus::Success, 2);
    let (mut done_a, mut done_b) = (Vec::new(), Vec::new());
    qb.poll(&mut done_b).unwrap();
    qa.poll(&mut done_a).unwrap();
    assert!(done_a.is_empty() && done_b.is_empty());
    assert_eq!(pool.available(), 0);
    (qa, qb)
}

/// How long a drain of [`a_queue_whose_completion_another_holds`]'s A with `timeout`
/// takes to say which completions wait (it must say so, not time out).
fn unrouted_after(timeout: Duration) -> Duration {
    let (mut qa, _qb) = a_queue_whose_completion_another_holds(8);
    let started = std::time::Instant::now();
    match qa.drain(timeout, &mut Vec::new()) {
        Err(DrainError::Unrouted { completions: 1 }) => {}
        other => panic!("expected Unrouted, got {other:?}"),
    }
    started.elapsed()
}

/// A drains with no credit and its own completion not coming (B holds it): after a while
/// without one, a quarter of the timeout, the drain says which completions wait, rather
/// than timing out.
#[test]
fn a_drain_whose_own_completion_another_queue_holds_says_so() {
    let waited = unrouted_after(Duration::from_secs(10));
    assert!(waited >= Duration::from_millis(2500), "{waited:?}");
    assert!(waited < Duration::from_secs(5), "{waited:?}");
}

/// Likewise with a short timeout: the drain waits at least 100 ms for its own completion
/// before it blames another queue, whatever a quarter of the timeout is.
#[test]
fn a_drain_waits_100_ms_for_its_own_completion_before_blaming_another_queue() {
    let waited = unrouted_after(Duration::from_millis(200));
    assert!(waited >= Duration::from_millis(100), "{waited:?}");
}

/// The same with A's send queue full: its marker waits for a slot, which only A's own
/// completion gives back, not for a credit that B's completion holds. The drain does not
/// blame B's completion (routing it would not help); it times out.
#[test]
fn a_drain_with_its_send_queue_full_does_not_blame_another_queue() {
    let (mut qa, _qb) = a_queue_whose_completion_another_holds(2);
    match qa.drain(Duration::from_millis(300), &mut Vec::new()) {
        Err(DrainError::Timeout { outstanding: 2, .. }) => {}
        other => panic!("expected a timeout, got {other:?}"),
    }
}

/// On a `SharedCq` a queue's own completion cannot be held by another queue (whoever
/// polls it files it for its queue): a drain with no credit for its marker and its own
/// signaled work request outstanding waits for it until the timeout, and does not blame
/// the queue whose completion it polled.
#[test]
fn a_drain_on_a_shared_cq_waits_for_its_own_completion_until_the_timeout() {
    let cq = FakeCq::new(3);
    let (mut qa, mut qb, shared) = shared_pair(&cq, Policy::Never);
    let remote = RemoteAddr::default();
    let forced = Work::write_empty(remote, 1).signal(selsig::Signal::Force);
    assert!(qa.post(forced).unwrap().signaled());
    // An unsignaled tail: the drain needs a marker, and a credit for it.
    assert!(!qa.post(Work::write_empty(remote, 2)).unwrap().signaled());
    // The pool's last credit: signaled.
    assert!(qb.post(Work::write_empty(remote, 9)).unwrap().signaled());
    assert_eq!(shared.credits().available(), 0);
    // A polls B's completion into B's inbox; its own never comes.
    cq.complete(1, WcStatus::Success, 2);
    let mut done = Vec::new();
    qa.poll(&mut done).unwrap();
    assert_eq!(shared.waiting(), 1);
    let started = std::time::Instant::now();
    match qa.drain(Duration::from_millis(300), &mut done) {
        Err(DrainError::Timeout { outstanding: 2, .. }) => {}
        other => panic!("expected a timeout, got {other:?}"),
    }
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(300), "{waited:?}");
}

/// In the error state a drain posts a marker behind the outstanding work requests; with
/// the sequence numbers used up there is none to give it, and none is needed: the NIC
/// flushes every outstanding work request (the last sequence number is always signaled).
#[test]
fn a_drain_in_the_error_state_at_the_last_sequence_number_waits_for_the_flushes() {
    const LAST: u64 = (1 << 63) - 1;
    let cq = FakeCq::new(64);
    let config = QueueConfig {
        first_seq: LAST - 2,
        ..QueueConfig::with_policy(Policy::Never)
    };
    let mut q = Queue::with_config(qp(1, 8), Arc::clone(&cq), config).unwrap();
    let remote = RemoteAddr::default();
    let signaled: Vec<bool> = (1..=3)
        .map(|i| q.post(Work::write_empty(remote, i)).unwrap().signaled())
        .collect();
    assert_eq!(signaled, [false, false, true]);
    cq.complete(LAST - 2, WcStatus::RemAccessErr, 1);
    let mut done = Vec::new();
    q.poll(&mut done).unwrap();
    assert!(matches!(q.state(), QueueState::Error { .. }));
    // No marker can follow the last sequence number, and none is needed: it is signaled.
    assert_eq!(
        q.post_drain_marker().unwrap(),
        selsig::DrainMarker::NotNeeded
    );
    cq.complete(LAST - 1, WcStatus::WrFlushErr, 1);
    cq.complete(LAST, WcStatus::WrFlushErr, 1);
    q.drain(Duration::from_secs(5), &mut done).unwrap();
    assert_eq!(
        outcomes(&done),
        [
            (1, Outcome::Failed(WcStatus::RemAccessErr)),
            (2, Outcome::Flushed),
            (3, Outcome::Flushed)
        ]
    );
}

/// A queue with a CQ budget of its own: completions of another QP in its CQ (that QP's
/// receives) hold none of its credits, so a drain whose marker waits for a slow completion
/// of its own waits for it, rather than blaming other queues.
#[test]
fn a_drain_on_a_budget_of_its_own_waits_for_a_slow_completion() {
    let cq = FakeCq::new(16);
    let config = QueueConfig::with_policy(Policy::Every(2));
    let mut q = Queue::with_config(qp(1, 3), Arc::clone(&cq), config).unwrap();
    let remote = RemoteAddr::default();
    let signaled: Vec<bool> = (1..=3)
        .map(|i| q.post(Work::write_empty(remote, i)).unwrap().signaled())
        .collect();
    assert_eq!(signaled, [false, true, false]);
    // A receive completion of QP 9, whose receive CQ this is.
    cq.push(WorkCompletion::new(77, WcStatus::Success, 9));
    let nic = {
        let cq = Arc::clone(&cq);
        std::thread::spawn(move || {
            // Longer than a quarter of the drain's timeout.
            std::thread::sleep(Duration::from_millis(400));
            cq.complete(2, WcStatus::Success, 1);
            // The drain's marker (seq 4), once it had a slot: the drain posts it after the
            // poll that took completion 2 and before it polls again.
            let start = std::time::Instant::now();
            while !cq.ring.lock().unwrap().is_empty() {
                assert!(start.elapsed() < Duration::from_secs(10), "never polled");
                std::thread::yield_now();
            }
            cq.complete(4, WcStatus::Success, 1);
        })
    };
    let mut done = Vec::new();
    let drained = q.drain(Duration::from_secs(1), &mut done);
    nic.join().unwrap();
    drained.unwrap();
    assert_eq!(
        outcomes(&done),
        (1..=3).map(|i| (i, Outcome::Completed)).collect::<Vec<_>>()
    );
    assert_eq!(q.take_unclaimed().len(), 1);
}

/// A queue dropped on a provider whose destroy leaves its completions in the CQ (rxe):
/// a new queue on a QP that got the same number starts its sequence numbers past the old
/// queue's, so the old completions cannot retire its work requests; they go to the new
/// queue's unclaimed completions, as those of a QP without a queue.
#[test]
fn completions_left_by_a_dropped_queue_do_not_retire_a_new_queue_on_its_qp_number() {
    let cq = FakeCq::new(16);
    let (mut qa, mut qb, shared) = shared_pair(&cq, Policy::Never);
    let remote = RemoteAddr::default();
    for i in 1..=3 {
        qb.post(Work::write_empty(remote, i)).unwrap();
    }
    drop(qb);
    // The destroyed QP's flushes, left in the CQ.
    for seq in 1..=3 {
        cq.complete(seq, WcStatus::WrFlushErr, 2);
    }
    let config = QueueConfig {
        poll_batch: 1,
        ..QueueConfig::with_policy(Policy::Never)
    };
    let mut qc = Queue::on_shared_cq(qp(2, 8), &shared, config).unwrap();
    let seqs: Vec<u64> = (101..=103)
        .map(|i| qc.post(Work::write_empty(remote, i)).unwrap().seq.0)
        .collect();
    assert_eq!(seqs, [4, 5, 6]);
    let mut done_a = Vec::new();
    poll_while(&mut qa, &mut done_a, |_| {
        !cq.ring.lock().unwrap().is_empty()
    });
    let mut done_c = Vec::new();
    poll_while(&mut qc, &mut done_c, |_| shared.waiting() > 0);
    assert!(done_a.is_empty() && done_c.is_empty());
    assert_eq!(qc.state(), QueueState::Ready);
    assert_eq!(qc.outstanding(), 3);
    assert_eq!(qc.take_unclaimed().len(), 3);
    // Its own completion retires its work requests.
    let marker = qc.confirm_all().unwrap().unwrap();
    cq.complete(marker.0, WcStatus::Success, 2);
    qc.poll(&mut done_c).unwrap();
    assert_eq!(
        outcomes(&done_c),
        (101..=103)
            .map(|i| (i, Outcome::Completed))
            .collect::<Vec<_>>()
    );
}

/// A queue that cannot be created hands its QP back, untouched (a connected QP would
/// otherwise be destroyed, its peer left connected to nothing).
#[test]
fn a_queue_refused_at_creation_gives_its_qp_back() {
    let cq = FakeCq::new(16);
    let refused = Queue::new(qp(7, 8), Arc::clone(&cq), Policy::Every(0))
        .err()
        .expect("refused");
    assert!(matches!(refused.error, ConfigError::Policy(_)), "{refused}");
    assert_eq!(refused.to_string(), refused.error.to_string());
    let qp = refused.into_qp();
    assert_eq!(qp.qp_num(), 7);
    // The same QP, given again with a good policy.
    Queue::new(qp, cq, Policy::Every(4)).unwrap();
}

/// A queue created without a CQ budget takes the whole CQ: a second queue on it (its own,
/// or on a shared CQ, or with a budget) would let errors overrun the CQ, and is refused,
/// QP back; once the first queue is gone, the CQ takes a queue again.
#[test]
fn a_cq_of_a_queues_own_takes_no_other_queue() {
    let cq = FakeCq::new(15);
    // A queue that takes the CQ whole is refused: another queue uses it.
    let in_use = |num| {
        let whole = Queue::new(qp(num, 8), Arc::clone(&cq), Policy::Every(4))
            .err()
            .expect("refused");
        assert_eq!(whole.error, ConfigError::CqInUse);
    };
    let first = Queue::new(qp(1, 8), Arc::clone(&cq), Policy::Every(4)).unwrap();
    let second = Queue::new(qp(2, 8), Arc::clone(&cq), Policy::Every(4))
        .err()
        .expect("refused");
    assert_eq!(second.error, ConfigError::CqInUse);
    assert_eq!(second.qp.qp_num(), 2);
    let budget = QueueConfig {
        cq: Some(CqBudget::Exclusive(4)),
        ..QueueConfig::default()
    };
    let second = Queue::with_config(qp(2, 8), Arc::clone(&cq), budget.clone())
        .err()
        .expect("refused");
    assert_eq!(second.error, ConfigError::CqInUse);
    drop(first);
    // Queues with budgets of their own share it; none may then take it whole.
    let a = Queue::with_config(qp(1, 8), Arc::clone(&cq), budget.clone()).unwrap();
    let b = Queue::with_config(qp(2, 8), Arc::clone(&cq), budget).unwrap();
    in_use(3);
    drop((a, b));
    // A shared CQ's queues, likewise.
    let shared = SharedCq::new(Arc::clone(&cq));
    let on_shared = Queue::on_shared_cq(qp(1, 8), &shared, QueueConfig::default()).unwrap();
    in_use(3);
    drop(on_shared);
    Queue::new(qp(3, 8), Arc::clone(&cq), Policy::Every(4)).unwrap();
    // Budgets on one CQ add up to no more than it holds: a pool counts once, whatever
    // number of queues takes from it.
    let eight = QueueConfig {
        cq: Some(CqBudget::Exclusive(8)),
        ..QueueConfig::default()
    };
    let a = Queue::with_config(qp(1, 8), Arc::clone(&cq), eight.clone()).unwrap();
    let too_large = |budget: CqBudget, num: u32| {
        let config = QueueConfig {
            cq: Some(budget),
            ..QueueConfig::default()
        };
        let refused = Queue::with_config(qp(num, 8), Arc::clone(&cq), config)
            .err()
            .expect("refused");
        assert_eq!(
            refused.error,
            ConfigError::CqBudgetsTooLarge {
                total: 16,
                capacity: 15
            }
        );
    };
    too_large(CqBudget::Exclusive(8), 2);
    let pool = QueueConfig {
        cq: Some(CqBudget::Shared(CqCredits::new(7))),
        ..QueueConfig::default()
    };
    let b = Queue::with_config(qp(2, 8), Arc::clone(&cq), pool.clone()).unwrap();
    let c = Queue::with_config(qp(3, 8), Arc::clone(&cq), pool).unwrap();
    // 8 + 7 taken: another pool, however small, is one too many, and so is a budget of
    // one while either queue of the pool is left.
    too_large(CqBudget::Shared(CqCredits::new(1)), 4);
    drop(b);
    too_large(CqBudget::Exclusive(1), 4);
    // While the pool has a queue, the CQ is not free for a queue that takes it whole.
    drop(a);
    in_use(5);
    drop(c);
    Queue::new(qp(5, 8), Arc::clone(&cq), Policy::Every(4)).unwrap();
}

/// A marker the provider refuses outright (index 0) is forgotten: it holds no slot, and
/// the unsignaled tail it was to confirm still needs one, which the next `confirm_all`
/// posts. (A marker left registered would stay outstanding for ever, signaled, and the
/// next `confirm_all` would see no tail to confirm.)
#[test]
fn a_marker_the_provider_refuses_is_forgotten_and_the_tail_still_confirmed() {
    let cq = FakeCq::new(16);
    let mut q = Queue::new(qp(1, 8), Arc::clone(&cq), Policy::Never).unwrap();
    let remote = RemoteAddr::default();
    let p = q.post(Work::write_empty(remote, 1)).unwrap();
    assert!(!p.signaled());
    *q.qp().fail_next.lock().unwrap() = Some((0, PostFailure::Other));
    match q.confirm_all() {
        Err(selsig::QueuePostError::Provider { returned, source }) => {
            assert!(returned.is_empty());
            assert_eq!(source.index, 0);
        }
        other => panic!("expected a provider error, got {other:?}"),
    }
    assert_eq!(q.outstanding(), 1, "the refused marker holds no slot");
    assert_eq!(q.tracker().signaled_outstanding(), 0);
    assert_eq!(q.tracker().unsignaled_run(), 1);
    let marker = q
        .confirm_all()
        .unwrap()
        .expect("the tail is still unconfirmed");
    assert_eq!(
        marker,
        Seq(2),
        "the refused marker's sequence number is reused"
    );
    cq.complete(marker.0, WcStatus::Success, 1);
    let mut done = Vec::new();
    q.poll(&mut done).unwrap();
    assert_eq!(outcomes(&done), [(1, Outcome::Completed)]);
    assert_eq!(q.outstanding(), 0);
}

/// A new queue on the QP number of a dropped one starts at the sequence number after the
/// old queue's; the completion of its very first work request is its own, not a stale one.
#[test]
fn the_first_work_request_of_a_queue_replacing_a_dropped_one_retires() {
    let cq = FakeCq::new(16);
    let (_qa, mut qb, shared) = shared_pair(&cq, Policy::Never);
    let remote = RemoteAddr::default();
    for i in 1..=3 {
        qb.post(Work::write_empty(remote, i)).unwrap();
    }
    drop(qb);
    let mut qc =
        Queue::on_shared_cq(qp(2, 8), &shared, QueueConfig::with_policy(Policy::Always)).unwrap();
    let p = qc.post(Work::write_empty(remote, 100)).unwrap();
    assert_eq!(p.seq, Seq(4));
    assert!(p.signaled());
    cq.complete(4, WcStatus::Success, 2);
    let mut done = Vec::new();
    poll_while(&mut qc, &mut done, |q| {
        q.outstanding() > 0 && !cq.ring.lock().unwrap().is_empty()
    });
    assert_eq!(outcomes(&done), [(100, Outcome::Completed)]);
    assert_eq!(qc.outstanding(), 0);
    assert!(qc.take_unclaimed().is_empty());
}

/// A successful receive completion is never taken for a send, even when its `wr_id` has
/// bit 63 set: its opcode says it is a receive, and it goes to `take_unclaimed`. (Taken for
/// a send, it would retire the send whose sequence number its low bits spell, before the
/// NIC executed it.)
#[test]
fn a_receive_completion_with_bit_63_set_is_not_a_send_completion() {
    let cq = FakeCq::new(16);
    let with_recvs = FakeQp {
        recvs: 4,
        ..qp(1, 8)
    };
    let mut q = Queue::with_config(
        with_recvs,
        Arc::clone(&cq),
        QueueConfig::with_policy(Policy::Always),
    )
    .unwrap();
    let remote = RemoteAddr::default();
    let p = q.post(Work::write_empty(remote, 7)).unwrap();
    assert!(p.signaled());
    let recv = WorkCompletion {
        opcode: Some(selsig::WcOpcode::Recv),
        byte_len: 8,
        ..WorkCompletion::new(send_wr_id(p.seq), WcStatus::Success, 1)
    };
    assert_eq!(q.send_seq(&recv), None);
    cq.push(recv);
    let mut done = Vec::new();
    q.poll(&mut done).unwrap();
    assert!(
        done.is_empty(),
        "a receive retired a send: {:?}",
        outcomes(&done)
    );
    assert_eq!(q.outstanding(), 1);
    assert_eq!(q.take_unclaimed(), [recv]);
}

/// Queues A (QP 1) and B (QP 2) on a shared CQ with a pool of 4 credits: B posts 2
/// unsignaled work requests, A takes the other 2 (the last one signaled for the credit).
fn pool_of_four_taken() -> (Arc<FakeCq>, Queue, Queue, SharedCq<FakeDevice>) {
    let cq = FakeCq::new(16);
    let shared = SharedCq::with_credits(Arc::clone(&cq), CqCredits::new(4));
    // (B takes what waits in its inbox in one poll: here no completion comes for a
    // marker it would post once a credit came back.)
    let config = QueueConfig::with_policy(Policy::Never);
    let mut qa = Queue::on_shared_cq(qp(1, 8), &shared, config.clone()).unwrap();
    let mut qb = Queue::on_shared_cq(qp(2, 8), &shared, config).unwrap();
    let remote = RemoteAddr::default();
    for i in 1..=2 {
        assert!(!qb.post(Work::write_empty(remote, i)).unwrap().signaled());
    }
    assert!(!qa.post(Work::write_empty(remote, 11)).unwrap().signaled());
    assert!(qa.post(Work::write_empty(remote, 12)).unwrap().signaled());
    assert_eq!(shared.credits().available(), 0);
    (cq, qa, qb, shared)
}

/// B's error and flush completions were polled by A and wait in B's inbox; B's drain
/// finds no credit for its marker, and no signaled work request of its own outstanding.
/// Its own completions, waiting for it, are no other queue's: the drain polls them and
/// ends, rather than blaming other queues ([`DrainError::Unrouted`]).
#[test]
fn a_drain_whose_own_completions_wait_in_its_inbox_polls_them_instead_of_blaming_others() {
    let (cq, mut qa, mut qb, shared) = pool_of_four_taken();
    cq.complete(1, WcStatus::RemAccessErr, 2);
    cq.complete(2, WcStatus::WrFlushErr, 2);
    let mut done_a = Vec::new();
    poll_while(&mut qa, &mut done_a, |_| {
        !cq.ring.lock().unwrap().is_empty()
    });
    assert!(done_a.is_empty());
    assert_eq!(shared.waiting(), 2);
    let mut done = Vec::new();
    qb.drain(Duration::from_secs(5), &mut done).unwrap();
    assert_eq!(
        outcomes(&done),
        [
            (1, Outcome::Failed(WcStatus::RemAccessErr)),
            (2, Outcome::Flushed)
        ]
    );
}

/// In the error state every outstanding work request gets a flush completion, signaled or
/// not: a drain with only unsignaled work requests outstanding (and no credit for its
/// marker) waits for their flushes, even while another queue's completion waits for it.
#[test]
fn a_drain_in_the_error_state_waits_for_the_flushes_of_unsignaled_work_requests() {
    let (cq, mut qa, mut qb, shared) = pool_of_four_taken();
    let remote = RemoteAddr::default();
    // A's signaled work request completes, then B's first fails; B polls both: A's waits
    // in A's inbox, B enters the error state.
    cq.complete(2, WcStatus::Success, 1);
    cq.complete(1, WcStatus::RemAccessErr, 2);
    let mut done = Vec::new();
    poll_while(&mut qb, &mut done, |_| !cq.ring.lock().unwrap().is_empty());
    assert!(matches!(qb.state(), QueueState::Error { .. }));
    assert_eq!(shared.waiting(), 1);
    // The credit B's failed work request gave back goes to A.
    assert!(qa.post(Work::write_empty(remote, 13)).unwrap().signaled());
    assert_eq!(shared.credits().available(), 0);
    assert_eq!(qb.tracker().signaled_outstanding(), 0);
    // The NIC flushes B's second work request.
    cq.complete(2, WcStatus::WrFlushErr, 2);
    qb.drain(Duration::from_secs(5), &mut done).unwrap();
    assert_eq!(
        outcomes(&done),
        [
            (1, Outcome::Failed(WcStatus::RemAccessErr)),
            (2, Outcome::Flushed)
        ]
    );
}

/// Polls `q` once, expecting the error of an impossible completion.
fn poll_error(q: &mut Queue) -> selsig::CompletionError {
    match q.poll(&mut Vec::new()) {
        Err(selsig::PollError::Completion(e)) => e,
        other => panic!("expected an impossible completion, got {other:?}"),
    }
}

/// An impossible completion polled is reported with the `wr_id` the queue posted (bit 63
/// set, as the provider returned it), the first of a poll's if it has several.
#[test]
fn impossible_completions_polled_name_the_wr_id_posted() {
    use selsig::CompletionError as E;
    let remote = RemoteAddr::default();
    let queue = |policy, n| {
        let cq = FakeCq::new(16);
        let mut q = Queue::new(qp(1, 8), Arc::clone(&cq), policy).unwrap();
        for i in 0..n {
            q.post(Work::write_empty(remote, i)).unwrap();
        }
        (cq, q)
    };
    let (cq, mut q) = queue(Policy::Every(1), 1);
    cq.complete(99, WcStatus::Success, 1);
    cq.complete(98, WcStatus::Success, 1);
    let wr_id = send_wr_id(Seq(99));
    assert!(matches!(poll_error(&mut q), E::Unknown { wr_id: w, .. } if w == wr_id));
    let (cq, mut q) = queue(Policy::Every(1), 2);
    cq.complete(2, WcStatus::Success, 1);
    let wr_id = send_wr_id(Seq(2));
    assert_eq!(
        poll_error(&mut q),
        E::OutOfOrder {
            wr_id,
            expected: Seq(1)
        }
    );
    let (cq, mut q) = queue(Policy::Every(2), 2);
    cq.complete(1, WcStatus::Success, 1);
    let wr_id = send_wr_id(Seq(1));
    assert_eq!(poll_error(&mut q), E::Unsignaled { wr_id });
    let (cq, mut q) = queue(Policy::Every(1), 2);
    cq.complete(1, WcStatus::RemAccessErr, 1);
    cq.complete(2, WcStatus::Success, 1);
    let wr_id = send_wr_id(Seq(2));
    assert_eq!(
        poll_error(&mut q),
        E::SuccessAfterError {
            wr_id,
            first: Seq(1)
        }
    );
}

/// Each work request handed back says whether it was posted signaled; on a QP created
/// with `sq_sig_all` every one is, whatever the policy, and each completion retires its
/// own.
#[test]
fn completions_say_which_work_requests_were_signaled() {
    let remote = RemoteAddr::default();
    let cq = FakeCq::new(16);
    let mut q = Queue::new(qp(1, 8), Arc::clone(&cq), Policy::Every(2)).unwrap();
    for i in 1..=2 {
        q.post(Work::write_empty(remote, i)).unwrap();
    }
    cq.complete(2, WcStatus::Success, 1);
    let mut done = Vec::new();
    q.poll(&mut done).unwrap();
    let signaled: Vec<_> = done.iter().map(|c| (c.user, c.signaled)).collect();
    assert_eq!(signaled, [(1, false), (2, true)]);
    drop(q);
    let all = FakeQp {
        sig_all: true,
        ..qp(2, 8)
    };
    let mut q = Queue::new(all, Arc::clone(&cq), Policy::Never).unwrap();
    for i in 1..=3 {
        assert!(
            q.post(Work::write_empty(remote, i)).unwrap().signaled(),
            "{i}"
        );
    }
    cq.complete(1, WcStatus::Success, 2);
    let mut done = Vec::new();
    q.poll(&mut done).unwrap();
    assert_eq!(outcomes(&done), [(1, Outcome::Completed)]);
    assert!(done[0].signaled);
    assert_eq!(q.outstanding(), 2);
}

/// A queue's own CQ: all of it for the sends, less the receives that complete to it,
/// which must leave room for one send at least.
#[test]
fn a_queue_s_own_cq_holds_its_sends_beside_the_receives() {
    let q = Queue::new(qp(1, 8), FakeCq::new(4), Policy::Never).unwrap();
    assert_eq!(q.available(), 4, "a CQ of 4 below a send queue of 8");
    // The room for sends of a queue whose QP has 8 receives, or why there is none.
    let with_recvs = |recvs, capacity| {
        let qp = FakeQp { recvs, ..qp(2, 8) };
        Queue::new(qp, FakeCq::new(capacity), Policy::Never)
            .map(|q| q.available())
            .map_err(|e| e.error)
    };
    assert_eq!(with_recvs(8, 12), Ok(4));
    assert_eq!(with_recvs(8, 9), Ok(1));
    assert_eq!(
        with_recvs(8, 8),
        Err(ConfigError::NoCqRoomForSends {
            capacity: 8,
            receives: 8
        })
    );
}

/// A queue refused on a shared CQ leaves no trace of its QP there: the QP, given back,
/// makes a queue on it.
#[test]
fn a_queue_refused_on_a_shared_cq_can_be_made_again() {
    let shared = SharedCq::new(FakeCq::new(16));
    let adaptive = QueueConfig {
        measure_lag: false,
        ..QueueConfig::with_policy(Policy::Adaptive {
            max_unsignaled: 4,
            max_lag: Duration::from_micros(10),
        })
    };
    let refused = Queue::on_shared_cq(qp(1, 8), &shared, adaptive)
        .err()
        .expect("adaptive needs the clock");
    assert_eq!(refused.error, ConfigError::AdaptiveNeedsClock);
    Queue::on_shared_cq(refused.into_qp(), &shared, QueueConfig::default()).unwrap();
}

/// After an error, once every work request is retired, no drain marker is needed.
#[test]
fn no_drain_marker_is_needed_once_an_error_retired_everything() {
    let cq = FakeCq::new(16);
    let mut q = Queue::new(qp(1, 8), Arc::clone(&cq), Policy::Never).unwrap();
    q.post(Work::write_empty(RemoteAddr::default(), 1).signal(selsig::Signal::Force))
        .unwrap();
    cq.complete(1, WcStatus::RemAccessErr, 1);
    let mut done = Vec::new();
    q.poll(&mut done).unwrap();
    assert_eq!(
        outcomes(&done),
        [(1, Outcome::Failed(WcStatus::RemAccessErr))]
    );
    assert_eq!(q.outstanding(), 0);
    assert_eq!(
        q.post_drain_marker().unwrap(),
        selsig::DrainMarker::NotNeeded
    );
    assert_eq!(q.outstanding(), 0);
}

/// A queue measures the lag from a post to the completion being polled, on the clock
/// (at least the time the test waited between them).
#[test]
fn the_lag_measured_is_at_least_the_wait_between_post_and_poll() {
    let cq = FakeCq::new(16);
    let mut q = Queue::new(qp(1, 8), Arc::clone(&cq), Policy::Always).unwrap();
    q.post(Work::write_empty(RemoteAddr::default(), 1)).unwrap();
    std::thread::sleep(Duration::from_millis(2));
    cq.complete(1, WcStatus::Success, 1);
    q.poll(&mut Vec::new()).unwrap();
    let lag = &q.stats().lag_ns;
    assert_eq!(lag.len(), 1);
    assert!(lag.max() >= 2_000_000, "{} ns", lag.max());
}

/// What a queue posts is what it was asked to post: each work request's operation,
/// bytes and immediate data, with `wr_id` its sequence number with bit 63 set, signaled
/// as the policy says; a drain marker is a signaled zero-length WRITE.
#[test]
fn a_queue_posts_what_it_was_asked() {
    let cq = FakeCq::new(16);
    let mut q = Queue::new(qp(1, 8), Arc::clone(&cq), Policy::Every(2)).unwrap();
    let remote = RemoteAddr::default();
    let buffer = || selsig::Buffer::new(NullMr(100));
    q.post(Work::write_with_imm(buffer(), remote, 0xdead_beef, 1))
        .unwrap();
    q.post(Work::send_with_imm(buffer(), 0xfeed, 2)).unwrap();
    q.post(Work::write_inline(b"abc", remote, 3)).unwrap();
    assert_eq!(q.confirm_all().unwrap(), Some(Seq(4)));
    // A batch, likewise.
    let batch = [
        Work::write_with_imm(buffer(), remote, 7, 5),
        Work::write_inline(b"de", remote, 6),
    ];
    assert_eq!(q.post_batch(&mut batch.into_iter()).unwrap(), 2);
    let id = |seq| send_wr_id(Seq(seq));
    assert_eq!(
        *q.qp().posted.lock().unwrap(),
        [
            (id(1), Opcode::RdmaWriteWithImm, 100, 0xdead_beef, false),
            (id(2), Opcode::SendWithImm, 100, 0xfeed, true),
            (id(3), Opcode::RdmaWrite, 3, 0, false),
            (id(4), Opcode::RdmaWrite, 0, 0, true),
            (id(5), Opcode::RdmaWriteWithImm, 100, 7, false),
            (id(6), Opcode::RdmaWrite, 2, 0, true),
        ]
    );
}

/// A buffer longer than one work request carries (2^32 bytes or more) is refused and
/// handed back: alone; in a batch after the work requests before it were posted; and
/// after them when the provider refused those too.
#[test]
fn a_buffer_too_long_for_a_work_request_is_handed_back() {
    let cq = FakeCq::new(16);
    let mut q = Queue::new(qp(1, 8), Arc::clone(&cq), Policy::Always).unwrap();
    let remote = RemoteAddr::default();
    let big = || selsig::Buffer::new(NullMr((1 << 32) + 1));
    match q.post(Work::write(big(), remote, 1)) {
        Err(selsig::QueuePostError::Invalid { work, source }) => {
            assert_eq!(work.user, 1);
            assert_eq!(work.buffer.map(|b| b.len()), Some((1 << 32) + 1));
            let what =
                matches!(source, ProviderError::Invalid { what, .. } if what == "buffer length");
            assert!(what, "{source}");
        }
        other => panic!("expected the buffer refused, got {other:?}"),
    }
    assert_eq!(q.outstanding(), 0);
    let small_then_big = || {
        [
            Work::write(selsig::Buffer::new(NullMr(8)), remote, 2),
            Work::write(big(), remote, 3),
        ]
    };
    match q.post_batch(&mut small_then_big().into_iter()) {
        Err(selsig::QueuePostError::Invalid { work, .. }) => assert_eq!(work.user, 3),
        other => panic!("expected the buffer refused, got {other:?}"),
    }
    assert_eq!(
        q.qp().posted.lock().unwrap().len(),
        1,
        "the first was posted"
    );
    assert_eq!(q.outstanding(), 1);
    *q.qp().fail_next.lock().unwrap() = Some((0, PostFailure::Full));
    match q.post_batch(&mut small_then_big().into_iter()) {
        Err(selsig::QueuePostError::Provider { returned, .. }) => {
            let users: Vec<u32> = returned.iter().map(|p| p.user).collect();
            assert_eq!(users, [2, 3]);
        }
        other => panic!("expected both handed back, got {other:?}"),
    }
    assert_eq!(q.outstanding(), 1);
}

/// A batch the tracker cannot take is refused from its first work request, which comes
/// back, and nothing reaches the provider: on a full send queue, at a CQ budget smaller
/// than the send queue, in the error state and while draining (a batch takes the work
/// requests it has room for without checking each: the room must be right).
#[test]
fn a_batch_without_room_is_refused_whole() {
    let remote = RemoteAddr::default();
    let batch = |first: u32| {
        (first..first + 2)
            .map(move |user| Work::write(selsig::Buffer::new(NullMr(8)), remote, user))
    };
    let refused = |q: &mut Queue, first: u32| -> selsig::PostError<selsig::Payload<NullMr, u32>> {
        let posted = q.qp().posted.lock().unwrap().len();
        let outstanding = q.outstanding();
        let mut works = batch(first);
        let e = match q.post_batch(&mut works) {
            Err(selsig::QueuePostError::Refused(e)) => e,
            other => panic!("expected the batch refused, got {other:?}"),
        };
        assert_eq!(works.count(), 1, "only the first was taken from the batch");
        assert_eq!(
            q.qp().posted.lock().unwrap().len(),
            posted,
            "nothing posted"
        );
        assert_eq!(q.outstanding(), outstanding);
        e
    };
    let user = |e: selsig::PostError<selsig::Payload<NullMr, u32>>| e.into_payload().user;

    // A queue of `depth` on a CQ of `cq` that takes `fits` of four, then refuses the next
    // batch.
    let full = |depth, cq, fits| {
        let mut q = Queue::new(qp(1, depth), FakeCq::new(cq), Policy::Every(2)).unwrap();
        assert_eq!(q.post_batch(&mut batch(1).chain(batch(3))).unwrap(), fits);
        refused(&mut q, 5)
    };
    // A send queue of 4, a CQ of 16: the send queue fills first.
    let e = full(4, 16, 4);
    assert!(
        matches!(e, selsig::PostError::Full { capacity: 4, .. }),
        "{e:?}"
    );
    assert_eq!(user(e), 5);
    // A send queue of 8, a CQ of 3: the CQ budget is full first.
    let e = full(8, 3, 3);
    assert!(
        matches!(e, selsig::PostError::CqFull { capacity: 3, .. }),
        "{e:?}"
    );
    assert_eq!(user(e), 5);

    // The error state, with room left.
    let cq = FakeCq::new(16);
    let mut q = Queue::new(qp(1, 8), Arc::clone(&cq), Policy::Every(2)).unwrap();
    assert_eq!(q.post_batch(&mut batch(1)).unwrap(), 2);
    cq.complete(1, WcStatus::RemAccessErr, 1);
    let mut done = Vec::new();
    q.poll(&mut done).unwrap();
    assert!(matches!(q.state(), QueueState::Error { .. }));
    let e = refused(&mut q, 3);
    assert!(
        matches!(e, selsig::PostError::QueueError { first: Seq(1), .. }),
        "{e:?}"
    );
    assert_eq!(user(e), 3);

    // Draining, with room left.
    let mut q = Queue::new(qp(1, 8), FakeCq::new(16), Policy::Every(2)).unwrap();
    assert_eq!(q.post_batch(&mut batch(1)).unwrap(), 2);
    q.start_drain();
    let e = refused(&mut q, 3);
    assert!(matches!(e, selsig::PostError::Draining { .. }), "{e:?}");
    assert_eq!(user(e), 3);
}

/// A queue with a CQ budget of `n` completions.
fn budget(n: u32) -> QueueConfig {
    QueueConfig {
        cq: Some(CqBudget::Exclusive(n)),
        ..QueueConfig::default()
    }
}

/// A queue dropped with work outstanding, on a provider whose destroy leaves a QP's
/// completions in its CQ (rxe), may have left a completion in the CQ for each of its work
/// requests (an error or a flush completes every one). Nothing says when they are gone, so
/// their room stays taken while the CQ lives: a later queue that takes the CQ whole gets
/// what is left, and budgets beyond it are refused. On a provider that removes them (mlx5)
/// nothing is left.
#[test]
fn a_queue_dropped_with_work_outstanding_leaves_room_for_its_completions() {
    let remote = RemoteAddr::default();
    let cq = FakeCq::new(8);
    let mut a = Queue::new(qp(1, 8), Arc::clone(&cq), Policy::Never).unwrap();
    for i in 0..7 {
        a.post(Work::write_empty(remote, i)).unwrap();
    }
    drop(a);
    let b = Queue::new(qp(2, 8), Arc::clone(&cq), Policy::Every(4)).unwrap();
    assert_eq!(b.available(), 1);
    drop(b);
    let holds = |left, wanted| ConfigError::CqHoldsDroppedWork {
        capacity: 8,
        left,
        taken: 0,
        wanted,
    };
    let refused = Queue::with_config(qp(2, 8), Arc::clone(&cq), budget(2))
        .err()
        .expect("refused");
    assert_eq!(refused.error, holds(7, 2));
    // A budget of the one left, dropped with its work request outstanding: nothing is left.
    let mut c = Queue::with_config(qp(3, 8), Arc::clone(&cq), budget(1)).unwrap();
    c.post(Work::write_empty(remote, 8)).unwrap();
    drop(c);
    let refused = Queue::new(qp(4, 8), Arc::clone(&cq), Policy::Every(4))
        .err()
        .expect("refused");
    assert_eq!(refused.error, holds(8, 1));
    // Every receive completes, if only flushed: a dropped queue's receive slots that
    // report to the CQ stay taken too, its work requests retired or not.
    let cq = FakeCq::new(8);
    drop(
        Queue::new(
            FakeQp {
                recvs: 3,
                ..qp(1, 8)
            },
            Arc::clone(&cq),
            Policy::Every(4),
        )
        .unwrap(),
    );
    let b = Queue::new(qp(2, 8), Arc::clone(&cq), Policy::Every(4)).unwrap();
    assert_eq!(b.available(), 5);
    // mlx5: the destroy removes them.
    let cq = FakeCq::new(8);
    let cleaning = |num| FakeQp {
        cleans: true,
        ..qp(num, 8)
    };
    let mut a = Queue::new(cleaning(1), Arc::clone(&cq), Policy::Never).unwrap();
    for i in 0..7 {
        a.post(Work::write_empty(remote, i)).unwrap();
    }
    drop(a);
    assert_eq!(
        Queue::new(cleaning(2), Arc::clone(&cq), Policy::Every(4))
            .unwrap()
            .available(),
        8
    );
}

/// A queue on a shared CQ dropped with work outstanding keeps its credits of the pool
/// taken (rxe); while they are, the CQ taken whole by a queue of its own has room only
/// for the rest, and once the caller gives them back (having polled the completions they
/// stood for), it has all of it again.
#[test]
fn a_pool_s_credits_kept_by_a_dropped_queue_keep_their_room_in_the_cq() {
    let remote = RemoteAddr::default();
    let cq = FakeCq::new(8);
    let shared = SharedCq::new(Arc::clone(&cq));
    let config = QueueConfig::with_policy(Policy::Never);
    let mut a = Queue::on_shared_cq(qp(1, 8), &shared, config).unwrap();
    for i in 0..7 {
        a.post(Work::write_empty(remote, i)).unwrap();
    }
    drop(a);
    assert_eq!(shared.credits().available(), 1);
    // The pool counts once, its kept credits among its capacity, for a queue that joins it.
    let config = QueueConfig::with_policy(Policy::Every(4));
    let joined = Queue::on_shared_cq(qp(2, 8), &shared, config).unwrap();
    assert_eq!(joined.available(), 1);
    drop(joined);
    let b = Queue::new(qp(2, 8), Arc::clone(&cq), Policy::Every(4)).unwrap();
    assert_eq!(b.available(), 1);
    drop(b);
    assert!(shared.credits().release(7));
    let c = Queue::new(qp(3, 8), Arc::clone(&cq), Policy::Every(4)).unwrap();
    assert_eq!(c.available(), 8);
}

/// A QP whose queue was dropped on a provider that leaves its completions in the CQ
/// (rxe) may give its number to a new QP on the same CQ. On a CQ of its own, as on a
/// shared one, the new queue starts its sequence numbers past the old queue's: the old
/// completion retires none of its work requests (it is handed over as unclaimed), and its
/// own does.
#[test]
fn a_completion_of_a_dropped_queue_retires_nothing_of_a_new_queue_on_its_qp_number() {
    let remote = RemoteAddr::default();
    let cq = FakeCq::new(16);
    let mut a = Queue::new(qp(5, 8), Arc::clone(&cq), Policy::Every(4)).unwrap();
    for i in 0..4 {
        a.post(Work::write_empty(remote, i)).unwrap();
    }
    cq.complete(4, WcStatus::Success, 5);
    drop(a);
    let mut b = Queue::new(qp(5, 8), Arc::clone(&cq), Policy::Every(4)).unwrap();
    let seqs: Vec<u64> = (100..104)
        .map(|i| b.post(Work::write_empty(remote, i)).unwrap().seq.0)
        .collect();
    assert_eq!(seqs, [5, 6, 7, 8]);
    let mut done = Vec::new();
    b.poll(&mut done).unwrap();
    assert!(done.is_empty(), "{:?}", outcomes(&done));
    assert_eq!(b.outstanding(), 4);
    let unclaimed = b.take_unclaimed();
    assert_eq!(
        unclaimed.iter().map(|wc| wc.wr_id).collect::<Vec<_>>(),
        [send_wr_id(Seq(4))]
    );
    cq.complete(8, WcStatus::Success, 5);
    b.poll(&mut done).unwrap();
    assert_eq!(
        outcomes(&done),
        (100..104)
            .map(|i| (i, Outcome::Completed))
            .collect::<Vec<_>>()
    );
}

/// A CQ has one poller: the queues on it all poll it through one shared CQ, or all poll
/// it themselves. A queue with a budget of its own beside a shared CQ's queues (or the
/// other way round, or a second shared CQ's queue) would take completions the others wait
/// for: refused, whichever comes first, and allowed again once the other kind is gone.
#[test]
fn a_cq_is_polled_through_one_shared_cq_or_by_its_queues_not_both() {
    let cq = FakeCq::new(64);
    let shared = SharedCq::with_credits(Arc::clone(&cq), CqCredits::new(8));
    let on_shared = Queue::on_shared_cq(qp(1, 8), &shared, QueueConfig::default()).unwrap();
    // Its own budget, or the shared CQ's pool without the shared CQ: refused.
    for config in [
        budget(8),
        QueueConfig {
            cq: Some(CqBudget::Shared(shared.credits().clone())),
            ..QueueConfig::default()
        },
    ] {
        let refused = Queue::with_config(qp(2, 8), Arc::clone(&cq), config)
            .err()
            .expect("refused");
        assert_eq!(refused.error, ConfigError::CqPolledTwoWays);
        assert_eq!(refused.qp.qp_num(), 2, "the QP comes back");
    }
    // A second shared CQ on the same CQ polls it too.
    let other = SharedCq::with_credits(Arc::clone(&cq), CqCredits::new(8));
    let refused = Queue::on_shared_cq(qp(3, 8), &other, QueueConfig::default())
        .err()
        .expect("refused");
    assert_eq!(refused.error, ConfigError::CqPolledTwoWays);
    // More queues through the same shared CQ are welcome.
    let second = Queue::on_shared_cq(qp(4, 8), &shared, QueueConfig::default()).unwrap();
    drop((on_shared, second));
    // The other way round: a queue that polls the CQ itself, then a shared CQ's queue.
    let budgeted = Queue::with_config(qp(2, 8), Arc::clone(&cq), budget(8)).unwrap();
    let refused = Queue::on_shared_cq(qp(1, 8), &shared, QueueConfig::default())
        .err()
        .expect("refused");
    assert_eq!(refused.error, ConfigError::CqPolledTwoWays);
    let also_budgeted = Queue::with_config(qp(5, 8), Arc::clone(&cq), budget(8)).unwrap();
    drop((budgeted, also_budgeted));
    Queue::on_shared_cq(qp(1, 8), &other, QueueConfig::default()).unwrap();
}
