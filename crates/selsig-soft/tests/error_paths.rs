//! Error paths of the soft NIC and the driver off the beaten track: receive completions
//! on the send CQ, a QP waiting on RNR when it fails, CQ overruns, queues dropped with
//! completions still in a shared CQ.

use std::sync::Arc;
use std::time::{Duration, Instant};

use selsig::{
    Access, AsyncEvent, CompletionQueue, ConnectOptions, CqBudget, CqCredits, Device, Local,
    MemoryRegion, Opcode, Outcome, Policy, QpCaps, QpInit, QueueConfig, QueuePair, RecvWr, SendWr,
    SharedCq, SignaledQueue, WcStatus, Work, WorkCompletion, connect_pair,
};
use selsig_soft::{Personality, SoftConfig, SoftCq, SoftDevice, SoftPd, SoftQp};

const WAIT: Duration = Duration::from_secs(5);

/// QP `a`, its sends on `send` and receives on `recv`, connected to a peer whose
/// completions go to `peer_cq`; both created with `init`.
fn connected(
    dev: &SoftDevice,
    pd: &SoftPd,
    (send, recv, peer_cq): (&SoftCq, &SoftCq, &SoftCq),
    init: &QpInit,
) -> (SoftQp, SoftQp) {
    let a = dev.create_qp(pd, send, recv, init).unwrap();
    let b = dev.create_qp(pd, peer_cq, peer_cq, init).unwrap();
    connect_pair(&a, &b, &ConnectOptions::default()).unwrap();
    (a, b)
}

fn init(send_wr: u32) -> QpInit {
    QpInit {
        caps: QpCaps {
            max_send_wr: send_wr,
            max_recv_wr: 64,
            max_inline_data: 64,
            ..QpCaps::default()
        },
        sq_sig_all: false,
    }
}

/// QP `a` (send and receive on one CQ, as `ibv_rc_pingpong` does) runs a SignaledQueue.
/// Its SENDs stall on RNR (the peer has no receive); then the peer's SEND overflows `a`'s
/// receive (`LOC_LEN_ERR`), which moves `a` to the error state: `a`'s three SENDs never
/// executed, so each must end `Flushed`. The receive's error completion (opcode
/// meaningless, `ibv_poll_cq(3)`) carries `a`'s qp_num and a `wr_id` of the receive
/// queue's own numbering: the queue tells it from its sends by bit 63 of the `wr_id`
/// (it took it for a send completion, and retired SENDs that never ran as completed).
#[test]
fn a_receive_error_completion_is_not_a_send_completion() {
    let dev = SoftDevice::open(SoftConfig::default()).unwrap();
    let pd = dev.alloc_pd().unwrap();
    let cq_a = Arc::new(dev.create_cq(64).unwrap());
    let cq_b = dev.create_cq(64).unwrap();
    let (a, b) = connected(&dev, &pd, (&cq_a, &cq_a, &cq_b), &init(16));
    let small = dev.reg_mr(&pd, 8, Access::LOCAL_WRITE).unwrap();
    // Receive wr_ids counted from 1, as applications (and selsig's scenarios) do.
    a.post_recv(&[RecvWr {
        wr_id: 2,
        sge: Some(small.sge(0, 8)),
    }])
    .unwrap();
    let mut q: SignaledQueue<SoftDevice, u32> =
        SignaledQueue::new(a, Arc::clone(&cq_a), Policy::Every(4)).unwrap();
    for user in 1..=3 {
        q.post(Work::send_inline(&[1; 8], user)).unwrap();
    }
    std::thread::sleep(Duration::from_millis(50)); // a's first SEND waits for a receive
    let data = [9u8; 64];
    b.post_send(&[SendWr {
        wr_id: 77,
        opcode: Opcode::Send,
        local: Local::Inline(&data),
        remote: Default::default(),
        imm_data: 0,
        signaled: true,
    }])
    .unwrap();
    let mut done = Vec::new();
    let mut errors = Vec::new();
    let start = Instant::now();
    while done.len() < 3 && start.elapsed() < WAIT {
        if let Err(e) = q.poll(&mut done) {
            errors.push(e.to_string());
        }
    }
    let outcomes: Vec<(u32, Outcome)> = done.iter().map(|c| (c.user, c.outcome)).collect();
    assert_eq!(
        outcomes,
        [
            (1, Outcome::Flushed),
            (2, Outcome::Flushed),
            (3, Outcome::Flushed)
        ],
        "poll errors: {errors:?}"
    );
    assert!(errors.is_empty(), "{errors:?}");
    // The receive's error completion is handed back for the caller to route, and the
    // queue refuses it if handed it directly.
    let mut recv_done = q.take_unclaimed();
    while recv_done.is_empty() && start.elapsed() < WAIT {
        q.poll(&mut done).unwrap();
        recv_done.extend(q.take_unclaimed());
    }
    assert_eq!(recv_done[0].wr_id, 2);
    assert_eq!(recv_done[0].status, WcStatus::LocLenErr);
    assert_eq!(
        q.handle_completion(&recv_done[0]),
        Err(selsig::CompletionError::NotASend { wr_id: 2 })
    );
}

/// The simpler form: the application moves the QP to the error state and drains, as the
/// docs prescribe; `a` has a receive posted on its (single) CQ. The drain ends (it failed
/// on the receive's flush).
#[test]
fn drain_after_to_error_with_a_receive_posted() {
    let dev = SoftDevice::open(SoftConfig::default()).unwrap();
    let pd = dev.alloc_pd().unwrap();
    let cq_a = Arc::new(dev.create_cq(64).unwrap());
    let cq_b = dev.create_cq(64).unwrap();
    let (a, _b) = connected(&dev, &pd, (&cq_a, &cq_a, &cq_b), &init(16));
    let remote = dev
        .reg_mr(&pd, 64, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    a.post_recv(&[RecvWr {
        wr_id: 1000,
        sge: None,
    }])
    .unwrap();
    let mut q: SignaledQueue<SoftDevice, u32> =
        SignaledQueue::new(a, Arc::clone(&cq_a), Policy::Every(4)).unwrap();
    q.post(Work::write_inline(&[1; 8], remote.remote(0), 1))
        .unwrap();
    q.qp().to_error().unwrap();
    let mut done = Vec::new();
    let r = q.drain(WAIT, &mut done);
    assert!(r.is_ok(), "drain: {r:?}");
}

/// A receive flush that finds the CQ full overruns it (semantics 8: `IBV_EVENT_CQ_ERR`),
/// like a send completion does (the soft NIC raised no event for it).
#[test]
fn a_receive_flush_overrun_raises_cq_err() {
    let dev = SoftDevice::open(SoftConfig::default()).unwrap();
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(2).unwrap(); // 3 entries
    let other = dev.create_cq(64).unwrap();
    let (a, _b) = connected(&dev, &pd, (&other, &cq, &other), &init(8));
    let recvs: Vec<RecvWr> = (0..8)
        .map(|i| RecvWr {
            wr_id: i,
            sge: None,
        })
        .collect();
    a.post_recv(&recvs).unwrap();
    a.to_error().unwrap();
    let events = events_until(&dev, AsyncEvent::CqErr { cq: cq.id() });
    let mut buf = [selsig::WorkCompletion::new(0, WcStatus::Success, 0); 16];
    let polled = cq.poll(&mut buf);
    let polled2 = cq.poll(&mut buf);
    assert!(
        events.contains(&AsyncEvent::CqErr { cq: cq.id() }),
        "events {events:?}; polls {polled:?} then {polled2:?}"
    );
}

/// The device's asynchronous events, until `want` is among them (or the test fails).
fn events_until(dev: &SoftDevice, want: AsyncEvent) -> Vec<AsyncEvent> {
    let start = Instant::now();
    let mut events = Vec::new();
    while !events.contains(&want) {
        assert!(start.elapsed() < WAIT, "no {want:?} came: {events:?}");
        events.extend(std::iter::from_fn(|| dev.poll_async_event()));
        std::thread::yield_now();
    }
    events
}

/// One overrun, one `IBV_EVENT_CQ_ERR`, however many flushes the CQ then loses (it was
/// raised once per lost completion).
#[test]
fn one_overrun_raises_one_cq_err() {
    let dev = SoftDevice::open(SoftConfig::default()).unwrap();
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(2).unwrap(); // 3 entries
    let other = dev.create_cq(64).unwrap();
    let (a, _b) = connected(&dev, &pd, (&cq, &other, &other), &init(64));
    let data = [0u8; 8];
    let wrs: Vec<SendWr> = (0..20)
        .map(|i| SendWr {
            wr_id: i,
            opcode: Opcode::RdmaWrite,
            local: Local::Inline(&data),
            remote: selsig::RemoteAddr { addr: 0, rkey: 1 }, // bad rkey on every WR
            imm_data: 0,
            signaled: false,
        })
        .collect();
    a.post_send(&wrs).unwrap();
    let mut events = events_until(&dev, AsyncEvent::CqErr { cq: cq.id() });
    // The first came; the flushes of the other 19 could only add more.
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(200) {
        events.extend(std::iter::from_fn(|| dev.poll_async_event()));
        std::thread::yield_now();
    }
    let cq_errs = events
        .iter()
        .filter(|e| matches!(e, AsyncEvent::CqErr { .. }))
        .count();
    assert_eq!(cq_errs, 1, "{events:?}");
}

/// A QP whose send queue waits on RNR (the peer has no receive, `rnr_retry = 7`) goes to
/// the error state when its receive CQ overruns (semantics 8: fatal; the QP goes to error,
/// `QP_FATAL`). Its outstanding send work request must then be flushed (semantics 6), on
/// its send CQ, which is healthy (the soft NIC never flushed it, and the drain hung).
#[test]
fn a_qp_waiting_on_rnr_is_flushed_when_it_goes_to_error() {
    let dev = SoftDevice::open(SoftConfig::default()).unwrap();
    let pd = dev.alloc_pd().unwrap();
    let send_cq = Arc::new(dev.create_cq(64).unwrap());
    let recv_cq = dev.create_cq(1).unwrap(); // 1 entry
    let cq_b = dev.create_cq(64).unwrap();
    let (a, b) = connected(&dev, &pd, (&send_cq, &recv_cq, &cq_b), &init(16));
    a.post_recv(&[
        RecvWr {
            wr_id: 1,
            sge: None,
        },
        RecvWr {
            wr_id: 2,
            sge: None,
        },
    ])
    .unwrap();
    let mut q: SignaledQueue<SoftDevice, u32> =
        SignaledQueue::new(a, Arc::clone(&send_cq), Policy::Every(1)).unwrap();
    q.post(Work::send_inline(&[1; 8], 1)).unwrap(); // waits: b has no receive
    std::thread::sleep(Duration::from_millis(50));
    // b's two zero-length SENDs complete a's two receives: the second overruns a's
    // receive CQ, and a goes to the error state.
    let sends: Vec<SendWr> = (0..2)
        .map(|i| SendWr {
            wr_id: i,
            opcode: Opcode::Send,
            local: Local::Empty,
            remote: Default::default(),
            imm_data: 0,
            signaled: true,
        })
        .collect();
    b.post_send(&sends).unwrap();
    let start = Instant::now();
    while q.qp().state() != selsig::QpState::Err {
        assert!(start.elapsed() < WAIT, "a never went to the error state");
        std::thread::yield_now();
    }
    let mut done = Vec::new();
    let r = q.drain(Duration::from_secs(2), &mut done);
    let outcomes: Vec<(u32, Outcome)> = done.iter().map(|c| (c.user, c.outcome)).collect();
    assert!(r.is_ok(), "drain: {r:?}; outcomes {outcomes:?}");
    assert_eq!(outcomes, [(1, Outcome::Flushed)]);
}

/// rxe leaves a destroyed QP's unpolled completions in its CQ: a queue dropped with work
/// outstanding keeps those credits of the shared pool taken, so another queue cannot post
/// more than the CQ can hold (it overran when they were given back). mlx5 removes them
/// from the CQ, and the credits come back.
#[test]
fn a_queue_dropped_with_work_outstanding_keeps_its_credits_where_its_completions_stay() {
    for personality in [Personality::Rxe, Personality::Mlx5] {
        dropped_queue_credits(personality);
    }
}

fn dropped_queue_credits(personality: Personality) {
    let rxe = personality == Personality::Rxe;
    let dev = SoftDevice::open(SoftConfig::with_personality(personality)).unwrap();
    let pd = dev.alloc_pd().unwrap();
    let shared = Arc::new(dev.create_cq(if rxe { 4 } else { 7 }).unwrap());
    let other = dev.create_cq(64).unwrap();
    assert_eq!(shared.capacity(), 7);
    let (a, _b) = connected(&dev, &pd, (&shared, &other, &other), &init(8));
    let (c, _d) = connected(&dev, &pd, (&shared, &other, &other), &init(8));
    let remote = dev
        .reg_mr(&pd, 64, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    let pool = CqCredits::new(shared.capacity());
    let config = || QueueConfig {
        cq: Some(CqBudget::Shared(pool.clone())),
        ..QueueConfig::with_policy(Policy::Always)
    };
    let mut qa: SignaledQueue<SoftDevice, u32> =
        SignaledQueue::with_config(a, Arc::clone(&shared), config()).unwrap();
    assert!(qa.qp().record_execution_times(true));
    for user in 0..4 {
        qa.post(Work::write_inline(&[1; 8], remote.remote(0), user))
            .unwrap();
    }
    // The 4 completions sit in the CQ (a WRITE is stamped just before its completion).
    let start = Instant::now();
    while qa.qp().executed_at(3).is_none() {
        assert!(start.elapsed() < WAIT, "the 4 WRITEs never ran");
        std::thread::yield_now();
    }
    std::thread::sleep(Duration::from_millis(20));
    drop(qa); // destroys QP a; rxe leaves its 4 completions, mlx5 removes them
    assert_eq!(pool.available(), if rxe { 3 } else { 7 });
    let mut qc: SignaledQueue<SoftDevice, u32> =
        SignaledQueue::with_config(c, Arc::clone(&shared), config()).unwrap();
    let mut accepted = 0;
    for user in 0..7 {
        if qc
            .post(Work::write_inline(&[2; 8], remote.remote(0), user))
            .is_ok()
        {
            accepted += 1;
        }
    }
    let mut done = Vec::new();
    let r = qc.drain(WAIT, &mut done);
    // Every completion of c's WRITEs came (or the drain says why): an overrun would have
    // raised its event by now.
    let events: Vec<AsyncEvent> = std::iter::from_fn(|| dev.poll_async_event()).collect();
    assert_eq!(accepted, if rxe { 3 } else { 7 });
    assert!(
        !events.contains(&AsyncEvent::CqErr { cq: shared.id() }),
        "{personality:?}: accepted {accepted} posts: {events:?}, drain: {r:?}"
    );
    assert!(r.is_ok(), "{r:?}");
    assert_eq!(done.len(), accepted);
    // rxe: QP a's four completions are polled as another QP's.
    assert_eq!(qc.take_unclaimed().len(), if rxe { 4 } else { 0 });
}

/// Every receive completes (if only flushed), so where a QP's receive completions share
/// the CQ of its sends, a queue with a CQ of its own leaves their slots free: with the
/// receive queue full and the send queue as full as the queue allows, moving the QP to the
/// error state flushes everything into the CQ without overrunning it (semantics 8).
#[test]
fn receives_on_the_send_cq_keep_their_room_in_it() {
    let dev = SoftDevice::open(SoftConfig::default()).unwrap();
    let pd = dev.alloc_pd().unwrap();
    let cq = Arc::new(dev.create_cq(15).unwrap());
    let other = dev.create_cq(64).unwrap();
    let mut init = init(16);
    init.caps.max_recv_wr = 8;
    let (a, _b) = connected(&dev, &pd, (&cq, &cq, &other), &init);
    let receives = a.caps().max_recv_wr;
    let recvs: Vec<RecvWr> = (0..u64::from(receives))
        .map(|i| RecvWr {
            wr_id: i,
            sge: None,
        })
        .collect();
    a.post_recv(&recvs).unwrap();
    let remote = dev
        .reg_mr(&pd, 64, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    let mut q: SignaledQueue<SoftDevice, u32> =
        SignaledQueue::new(a, Arc::clone(&cq), Policy::Never).unwrap();
    let mut accepted = 0;
    while q
        .post(Work::write_inline(&[1; 8], remote.remote(0), accepted))
        .is_ok()
    {
        accepted += 1;
    }
    assert_eq!(accepted, cq.capacity() - receives);
    q.qp().to_error().unwrap();
    let mut done = Vec::new();
    q.drain(WAIT, &mut done).unwrap();
    assert_eq!(done.len() as u32, accepted);
    // The drain ends with the sends; the NIC may flush the receives after them (neither
    // order is promised): those the drain did not poll are still in the CQ.
    let mut flushed_recvs = q.take_unclaimed();
    let mut buf = [WorkCompletion::new(0, WcStatus::Success, 0); 16];
    let start = Instant::now();
    while (flushed_recvs.len() as u32) < receives && start.elapsed() < WAIT {
        let k = cq.poll(&mut buf).unwrap();
        flushed_recvs.extend_from_slice(&buf[..k]);
    }
    let events: Vec<AsyncEvent> = std::iter::from_fn(|| dev.poll_async_event()).collect();
    assert!(
        !events.contains(&AsyncEvent::CqErr { cq: cq.id() }),
        "{events:?}"
    );
    assert_eq!(flushed_recvs.len() as u32, receives);
    assert!(
        flushed_recvs
            .iter()
            .all(|wc| wc.status == WcStatus::WrFlushErr)
    );

    // A receive queue that alone fills the CQ leaves no room for sends.
    let small = Arc::new(dev.create_cq(7).unwrap());
    assert!(small.capacity() <= receives);
    let c = dev.create_qp(&pd, &small, &small, &init).unwrap();
    let qpn = c.qp_num();
    let e = SignaledQueue::<SoftDevice, u32>::new(c, Arc::clone(&small), Policy::Never)
        .err()
        .unwrap();
    assert_eq!(
        e.error,
        selsig::ConfigError::NoCqRoomForSends {
            capacity: small.capacity(),
            receives
        }
    );
    // The QP comes back, for its owner to destroy or to use otherwise (its sends report
    // to `small`: a queue on another CQ is refused).
    let c = e.into_qp();
    assert_eq!(c.qp_num(), qpn);
    let roomy = Arc::new(dev.create_cq(2 * receives).unwrap());
    let e = SignaledQueue::<SoftDevice, u32>::new(c, roomy, Policy::Never)
        .err()
        .unwrap();
    assert_eq!(e.error, selsig::ConfigError::NotTheSendCq);
}

/// A completion the queue refuses is named by the `wr_id` it carried (the sequence number
/// with bit 63), not by the sequence number.
#[test]
fn a_refused_completion_names_the_wr_id_it_carried() {
    let dev = SoftDevice::open(SoftConfig::default()).unwrap();
    let pd = dev.alloc_pd().unwrap();
    let cq = Arc::new(dev.create_cq(256).unwrap());
    let (a, _b) = connected(&dev, &pd, (&cq, &cq, &cq), &init(16));
    let remote = dev
        .reg_mr(&pd, 64, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    let mut q: SignaledQueue<SoftDevice, u32> =
        SignaledQueue::new(a, Arc::clone(&cq), Policy::Always).unwrap();
    q.post(Work::write_inline(&[1; 8], remote.remote(0), 1))
        .unwrap();
    let mut wcs = [selsig::WorkCompletion::new(0, WcStatus::Success, 0); 4];
    let start = Instant::now();
    let mut n = 0;
    while n == 0 && start.elapsed() < WAIT {
        n = cq.poll(&mut wcs).unwrap();
    }
    let wc = wcs[0];
    assert_eq!(wc.wr_id, 1 | selsig::SEND_WR_ID_BIT);
    q.handle_completion(&wc).unwrap();
    assert_eq!(
        q.handle_completion(&wc),
        Err(selsig::CompletionError::AlreadyRetired { wr_id: wc.wr_id })
    );
}

/// A batch whose second work request the tracker refuses (no sequence number left) and
/// whose first the provider refuses (the QP is not connected): both payloads come back,
/// in posting order; none is dropped.
#[test]
fn a_batch_refused_twice_gives_every_payload_back() {
    let dev = SoftDevice::open(SoftConfig::default()).unwrap();
    let pd = dev.alloc_pd().unwrap();
    let cq = Arc::new(dev.create_cq(64).unwrap());
    let qp = dev.create_qp(&pd, &cq, &cq, &init(16)).unwrap();
    let config = QueueConfig {
        first_seq: selsig::SEND_WR_ID_BIT - 1,
        ..QueueConfig::with_policy(Policy::Every(4))
    };
    let mut queue: SignaledQueue<SoftDevice, u32> =
        SignaledQueue::with_config(qp, cq, config).unwrap();
    let remote = selsig::RemoteAddr::default();
    let mut works = vec![
        Work::write_empty(remote, 1),
        Work::write_empty(remote, 2),
        Work::write_empty(remote, 3),
    ]
    .into_iter();
    match queue.post_batch(&mut works) {
        Err(selsig::QueuePostError::Provider { returned, .. }) => {
            let users: Vec<u32> = returned.iter().map(|p| p.user).collect();
            assert_eq!(users, [1, 2]);
        }
        other => panic!("expected the provider's refusal, got {other:?}"),
    }
    // The third was never taken from the iterator.
    assert_eq!(works.count(), 1);
    assert_eq!(queue.outstanding(), 0);
}

/// A list long enough for the soft NIC to take as the tracker registers it
/// (`post_send_iter`): the provider refuses WRITE 70 (inline data longer than the QP
/// takes: asked for 64 bytes, it reads back 124, as libmlx5 sizes it, semantics 13). The 70 before it run and complete; WRITE 70 comes back; the rest were never
/// taken from the iterator.
#[test]
fn a_long_batch_refused_part_way_posts_what_came_before_and_leaves_the_rest() {
    let dev = SoftDevice::open(SoftConfig::default()).unwrap();
    let pd = dev.alloc_pd().unwrap();
    let cq = Arc::new(dev.create_cq(256).unwrap());
    let peer_cq = dev.create_cq(16).unwrap();
    let (a, _b) = connected(&dev, &pd, (&cq, &cq, &peer_cq), &init(128));
    assert!(
        a.post_send_iter_min() <= 100,
        "the list is long for the soft NIC"
    );
    let remote = dev
        .reg_mr(&pd, 100 * 8, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    let max_inline = a.caps().max_inline_data as usize;
    assert_eq!(max_inline, 124);
    let mut queue: SignaledQueue<SoftDevice, u32> =
        SignaledQueue::new(a, Arc::clone(&cq), Policy::Every(8)).unwrap();
    let bytes: Vec<[u8; 8]> = (0..100u64).map(u64::to_le_bytes).collect();
    let long = vec![7u8; max_inline + 1];
    let mut works = (0..100u32).map(|i| {
        let data: &[u8] = if i == 70 { &long } else { &bytes[i as usize] };
        Work::write_inline(data, remote.remote(i as usize * 8), i)
    });
    match queue.post_batch(&mut works) {
        Err(selsig::QueuePostError::Provider { returned, source }) => {
            assert_eq!(source.index, 70);
            let users: Vec<u32> = returned.iter().map(|p| p.user).collect();
            assert_eq!(
                users,
                [70],
                "only the refused WRITE was taken and comes back"
            );
        }
        other => panic!("expected the provider's refusal, got {other:?}"),
    }
    assert_eq!(works.next().map(|w| w.opcode()), Some(Opcode::RdmaWrite));
    assert_eq!(
        works.count(),
        28,
        "WRITEs 72 to 99 are still in the iterator"
    );
    assert_eq!(queue.outstanding(), 70);
    let mut done = Vec::new();
    queue.drain(WAIT, &mut done).unwrap();
    let got: Vec<(u32, Outcome)> = done.iter().map(|c| (c.user, c.outcome)).collect();
    let expected: Vec<(u32, Outcome)> = (0..70).map(|i| (i, Outcome::Completed)).collect();
    assert_eq!(got, expected);
    for (i, written) in bytes.iter().enumerate() {
        let mut word = [0u8; 8];
        remote.read(i * 8, &mut word).unwrap();
        let want = if i < 70 { *written } else { [0; 8] };
        assert_eq!(word, want, "word {i} of the target");
    }
}

/// A long list on a queue pair that was never connected: the soft NIC refuses it before
/// taking a work request, so all stay in the iterator and nothing is outstanding. A short
/// one is taken whole, and every payload comes back in the error.
#[test]
fn a_batch_to_a_queue_pair_not_ready_loses_nothing_long_or_short() {
    for (len, in_error, left) in [(100u32, 0usize, 100usize), (3, 3, 0)] {
        let dev = SoftDevice::open(SoftConfig::default()).unwrap();
        let pd = dev.alloc_pd().unwrap();
        let cq = Arc::new(dev.create_cq(256).unwrap());
        let qp = dev.create_qp(&pd, &cq, &cq, &init(128)).unwrap();
        let mut queue: SignaledQueue<SoftDevice, u32> =
            SignaledQueue::new(qp, cq, Policy::Every(4)).unwrap();
        let remote = selsig::RemoteAddr::default();
        let mut works = (0..len).map(|i| Work::write_empty(remote, i));
        match queue.post_batch(&mut works) {
            Err(selsig::QueuePostError::Provider { returned, source }) => {
                assert_eq!(source.index, 0, "{len} WRITEs");
                let users: Vec<u32> = returned.iter().map(|p| p.user).collect();
                let expected: Vec<u32> = (0..in_error as u32).collect();
                assert_eq!(users, expected, "{len} WRITEs");
            }
            other => panic!("expected the provider's refusal, got {other:?}"),
        }
        assert_eq!(works.count(), left, "{len} WRITEs");
        assert_eq!(queue.outstanding(), 0, "{len} WRITEs");
        assert_eq!(queue.stats().posted, 0, "{len} WRITEs");
    }
}

/// Two queues share a CQ and its pool of credits. B's completion holds the last credit;
/// A's drain polls it (it is B's to handle) and needs a credit for its marker: it says so
/// at once instead of waiting out its time, and drains once the completion is routed.
#[test]
fn a_drain_that_needs_a_credit_held_by_another_queue_says_so() {
    let dev = SoftDevice::open(SoftConfig::default()).unwrap();
    let pd = dev.alloc_pd().unwrap();
    let cq = Arc::new(dev.create_cq(2).unwrap());
    let (recv_cq, peer_cq) = (dev.create_cq(64).unwrap(), dev.create_cq(64).unwrap());
    let (a, _pa) = connected(&dev, &pd, (&cq, &recv_cq, &peer_cq), &init(8));
    let (b, _pb) = connected(&dev, &pd, (&cq, &recv_cq, &peer_cq), &init(8));
    let pool = CqCredits::new(cq.capacity());
    let config = QueueConfig {
        cq: Some(CqBudget::Shared(pool.clone())),
        ..QueueConfig::with_policy(Policy::Never)
    };
    let mut qa: SignaledQueue<SoftDevice, u32> =
        SignaledQueue::with_config(a, Arc::clone(&cq), config.clone()).unwrap();
    let mut qb: SignaledQueue<SoftDevice, u32> =
        SignaledQueue::with_config(b, Arc::clone(&cq), config).unwrap();
    let remote = selsig::RemoteAddr::default();
    for i in 1..cq.capacity() {
        assert!(!qa.post(Work::write_empty(remote, i)).unwrap().signaled());
    }
    // The last credit: signaled, so that a completion is on its way.
    assert!(qb.post(Work::write_empty(remote, 100)).unwrap().signaled());
    assert_eq!(pool.available(), 0);
    let mut done = Vec::new();
    let start = Instant::now();
    match qa.drain(WAIT, &mut done) {
        Err(selsig::DrainError::Unrouted { completions: 1 }) => {}
        other => panic!("expected Unrouted, got {other:?}"),
    }
    assert!(start.elapsed() < WAIT, "it waited out its time");
    for wc in qa.take_unclaimed() {
        assert_eq!(qb.handle_completion(&wc).unwrap().retired, 1);
    }
    qa.drain(WAIT, &mut done).unwrap();
    let users: Vec<u32> = done.iter().map(|c| c.user).collect();
    assert_eq!(users, (1..cq.capacity()).collect::<Vec<_>>());
    assert!(done.iter().all(|c| c.outcome == Outcome::Completed));
}

/// One queue's thread on a shared CQ: posts `n` 8-byte inline WRITEs (the one numbered
/// `bad` with a bad remote key) until done or refused, polling as it goes, then drains.
/// Returns the outcomes, in the order handed back.
fn post_and_poll(
    mut q: SignaledQueue<SoftDevice, u32>,
    target: selsig::RemoteAddr,
    n: u32,
    bad: Option<u32>,
) -> Vec<(u32, Outcome)> {
    let mut done = Vec::new();
    let mut next = 1;
    let start = Instant::now();
    while next <= n {
        assert!(start.elapsed() < WAIT, "stuck at WRITE {next}");
        let mut to = target;
        if bad == Some(next) {
            to.rkey ^= 0x5a5a;
        }
        match q.post(Work::write_inline(&[next as u8; 8], to, next)) {
            Ok(_) => next += 1,
            Err(selsig::QueuePostError::Refused(e)) if e.is_full() => {}
            // The queue saw the error: it takes no more.
            Err(selsig::QueuePostError::Refused(_)) => break,
            Err(e) => panic!("WRITE {next}: {e:?}"),
        }
        q.poll(&mut done).unwrap();
    }
    loop {
        match q.drain(WAIT, &mut done) {
            Ok(()) => break,
            // A credit it needs waits for the other queue, which polls on its thread.
            Err(selsig::DrainError::Unrouted { .. }) => std::thread::yield_now(),
            Err(e) => panic!("{e}"),
        }
        assert!(start.elapsed() < 2 * WAIT, "the drain never got its credit");
    }
    done.iter().map(|c| (c.user, c.outcome)).collect()
}

/// Two threads post to and poll their own queues on one CQ at once, each polling the
/// other's completions now and then; B's WRITE 50 has a bad remote key. Each queue gets
/// its completions in CQ order whoever polled them (docs/semantics.md: the error before the
/// flushes behind it), so every WRITE gets its exact outcome.
#[test]
fn queues_polling_one_shared_cq_from_two_threads_get_exact_outcomes() {
    let dev = SoftDevice::open(SoftConfig::default()).unwrap();
    let pd = dev.alloc_pd().unwrap();
    for round in 0..10 {
        let cq = Arc::new(dev.create_cq(32).unwrap());
        let (recv_cq, peer_cq) = (dev.create_cq(64).unwrap(), dev.create_cq(64).unwrap());
        let (a, _pa) = connected(&dev, &pd, (&cq, &recv_cq, &peer_cq), &init(16));
        let (b, _pb) = connected(&dev, &pd, (&cq, &recv_cq, &peer_cq), &init(16));
        let remote = dev
            .reg_mr(&pd, 64, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
            .unwrap();
        let shared = SharedCq::new(Arc::clone(&cq));
        let config = QueueConfig {
            poll_batch: 2,
            ..QueueConfig::with_policy(Policy::Every(4))
        };
        let qa = SignaledQueue::on_shared_cq(a, &shared, config.clone()).unwrap();
        let qb = SignaledQueue::on_shared_cq(b, &shared, config).unwrap();
        let target = remote.remote(0);
        let (got_a, got_b) = std::thread::scope(|s| {
            let a = s.spawn(|| post_and_poll(qa, target, 200, None));
            let b = s.spawn(|| post_and_poll(qb, target, 200, Some(50)));
            (a.join().unwrap(), b.join().unwrap())
        });
        let all_done: Vec<(u32, Outcome)> = (1..=200).map(|i| (i, Outcome::Completed)).collect();
        assert_eq!(got_a, all_done, "round {round}");
        let posted = got_b.len() as u32;
        assert!(posted >= 50, "round {round}: {got_b:?}");
        let expected: Vec<(u32, Outcome)> = (1..=posted)
            .map(|i| match i {
                ..50 => (i, Outcome::Completed),
                50 => (i, Outcome::Failed(WcStatus::RemAccessErr)),
                _ => (i, Outcome::Flushed),
            })
            .collect();
        assert_eq!(got_b, expected, "round {round}");
        let all = cq.capacity();
        assert_eq!((shared.waiting(), shared.credits().available()), (0, all));
    }
}

/// The same long batch on a device that takes batches as `ibv_wr_complete` does
/// (`PostApi::Extended`), through `post_send_iter` and through `post_send`: the refusal of
/// WRITE 70 is the whole batch's, at index 0; every WRITE taken comes back, none runs, and
/// the queue goes on.
#[test]
fn an_all_or_nothing_device_takes_a_refused_batch_back_whole_on_either_path() {
    for n in [100u32, 8] {
        let config = SoftConfig {
            post_api: selsig::PostApi::Extended,
            ..SoftConfig::default()
        };
        let dev = SoftDevice::open(config).unwrap();
        let pd = dev.alloc_pd().unwrap();
        let cq = Arc::new(dev.create_cq(256).unwrap());
        let peer_cq = dev.create_cq(16).unwrap();
        let (a, _b) = connected(&dev, &pd, (&cq, &cq, &peer_cq), &init(128));
        // 100 WRITEs go to post_send_iter, 8 are staged for post_send.
        assert_eq!(a.post_send_iter_min() <= n as usize, n == 100);
        let remote = dev
            .reg_mr(&pd, 100 * 8, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
            .unwrap();
        let max_inline = a.caps().max_inline_data as usize;
        let mut queue: SignaledQueue<SoftDevice, u32> =
            SignaledQueue::new(a, Arc::clone(&cq), Policy::Every(8)).unwrap();
        let bad = n - 2;
        let bytes: Vec<[u8; 8]> = (0..u64::from(n)).map(u64::to_le_bytes).collect();
        let long = vec![7u8; max_inline + 1];
        let mut works = (0..n).map(|i| {
            let data: &[u8] = if i == bad { &long } else { &bytes[i as usize] };
            Work::write_inline(data, remote.remote(i as usize * 8), i)
        });
        match queue.post_batch(&mut works) {
            Err(selsig::QueuePostError::Provider { returned, source }) => {
                assert_eq!(source.index, 0, "{n}");
                let users: Vec<u32> = returned.iter().map(|p| p.user).collect();
                // post_send_iter took them up to the refused one; post_send all, staged.
                let taken = if n == 100 { bad + 1 } else { n };
                assert_eq!(
                    users,
                    (0..taken).collect::<Vec<_>>(),
                    "{n}: all taken, back"
                );
            }
            other => panic!("{n}: expected the provider's refusal, got {other:?}"),
        }
        assert_eq!(queue.outstanding(), 0, "{n}");
        assert_eq!(
            works.count() as u32,
            if n == 100 { n - bad - 1 } else { 0 },
            "{n}: the rest still in the iterator"
        );
        // Nothing of it ran; a WRITE posted now runs, with the first sequence number.
        let posted = queue
            .post(Work::write_inline(&bytes[1], remote.remote(8), 1000))
            .unwrap();
        assert_eq!(
            posted.seq.0, 1,
            "{n}: the batch's sequence numbers were taken back"
        );
        let mut done = Vec::new();
        queue.drain(WAIT, &mut done).unwrap();
        let got: Vec<(u32, Outcome)> = done.iter().map(|c| (c.user, c.outcome)).collect();
        assert_eq!(got, [(1000, Outcome::Completed)], "{n}");
        for i in 0..n as usize {
            let mut word = [0u8; 8];
            remote.read(i * 8, &mut word).unwrap();
            let want = if i == 1 { bytes[1] } else { [0; 8] };
            assert_eq!(word, want, "{n}: word {i} of the target");
        }
    }
}
