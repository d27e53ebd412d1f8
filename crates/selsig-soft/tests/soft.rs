//! The software NIC against the semantics of real NICs (docs/semantics.md), through the raw
//! provider interface and through `SignaledQueue`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use selsig::{
    Access, AsyncEvent, Buffer, CompletionQueue, ConfigError, ConnectOptions, CqError, Device,
    Local, MemoryRegion, Opcode, Outcome, Policy, PostFailure, QpCaps, QpInit, QpState,
    QueueConfig, QueuePair, RecvWr, RemoteAddr, SendWr, SignaledQueue, WcOpcode, WcStatus, Work,
    WorkCompletion, connect_pair,
};
use selsig_soft::{Personality, SoftConfig, SoftCq, SoftDevice, SoftMr, SoftQp};

use selsig_testkit as support;

const WAIT: Duration = Duration::from_secs(10);

/// Two connected QPs of one device: `a` sends, `b` is the responder.
struct Pair {
    dev: SoftDevice,
    pd: selsig_soft::SoftPd,
    a: SoftQp,
    b: SoftQp,
    cq_a: Arc<SoftCq>,
    cq_b: Arc<SoftCq>,
}

fn pair_with(personality: Personality, send_wr: u32, cqe: u32, sq_sig_all: bool) -> Pair {
    pair_connected(
        personality,
        send_wr,
        cqe,
        sq_sig_all,
        &ConnectOptions::default(),
    )
}

/// [`pair_with`], connected with `options`.
fn pair_connected(
    personality: Personality,
    send_wr: u32,
    cqe: u32,
    sq_sig_all: bool,
    options: &ConnectOptions,
) -> Pair {
    let dev = SoftDevice::open(SoftConfig::with_personality(personality)).unwrap();
    let pd = dev.alloc_pd().unwrap();
    let cq_a = Arc::new(dev.create_cq(cqe).unwrap());
    let cq_b = Arc::new(dev.create_cq(cqe).unwrap());
    let init = QpInit {
        caps: QpCaps {
            max_send_wr: send_wr,
            max_recv_wr: 64,
            // The most inline data of 256-byte WQEs on mlx5 (semantics 13), whose depths
            // read back as the powers of two these tests count on; 61 bytes or more make
            // 320-byte WQEs, and other depths (`mlx5_sizes_queues_as_libmlx5_does`).
            max_inline_data: 60,
            ..QpCaps::default()
        },
        sq_sig_all,
    };
    let a = dev.create_qp(&pd, &cq_a, &cq_a, &init).unwrap();
    let b = dev.create_qp(&pd, &cq_b, &cq_b, &init).unwrap();
    connect_pair(&a, &b, options).unwrap();
    Pair {
        dev,
        pd,
        a,
        b,
        cq_a,
        cq_b,
    }
}

/// A QP's queue depths (one scatter/gather entry each, `sq_sig_all` off).
fn depths(max_send_wr: u32, max_recv_wr: u32) -> QpInit {
    QpInit {
        caps: QpCaps {
            max_send_wr,
            max_recv_wr,
            ..QpCaps::default()
        },
        sq_sig_all: false,
    }
}

fn pair() -> Pair {
    pair_with(Personality::Mlx5, 64, 256, false)
}

impl Pair {
    fn mr(&self, len: usize, access: Access) -> SoftMr {
        self.dev.reg_mr(&self.pd, len, access).unwrap()
    }
}

/// Polls `cq` until `n` completions arrived (or fails after a while).
fn poll_n(cq: &SoftCq, n: usize) -> Vec<WorkCompletion> {
    let mut got = Vec::new();
    let mut buf = [WorkCompletion::new(0, WcStatus::Success, 0); 16];
    let start = Instant::now();
    while got.len() < n {
        let k = cq.poll(&mut buf).expect("poll");
        got.extend_from_slice(&buf[..k]);
        assert!(
            start.elapsed() < WAIT,
            "only {} of {n} completions: {got:?}",
            got.len()
        );
    }
    got
}

/// Waits until the NIC is surely done, then asserts the CQ stays empty.
fn assert_no_more(cq: &SoftCq) {
    std::thread::sleep(Duration::from_millis(30));
    let mut buf = [WorkCompletion::new(0, WcStatus::Success, 0); 4];
    assert_eq!(
        cq.poll(&mut buf).unwrap(),
        0,
        "unexpected completion {:?}",
        buf[0]
    );
}

fn write(
    wr_id: u64,
    local: &SoftMr,
    off: usize,
    len: u32,
    remote: RemoteAddr,
    signaled: bool,
) -> SendWr<'static> {
    SendWr {
        wr_id,
        opcode: Opcode::RdmaWrite,
        local: Local::Sge(local.sge(off, len)),
        remote,
        imm_data: 0,
        signaled,
    }
}

/// A signaled SEND of no bytes.
fn empty_send(wr_id: u64) -> SendWr<'static> {
    SendWr {
        wr_id,
        opcode: Opcode::Send,
        local: Local::Empty,
        remote: RemoteAddr::default(),
        imm_data: 0,
        signaled: true,
    }
}

fn pattern(wr: u64, len: usize) -> Vec<u8> {
    (0..len).map(|i| (wr as usize * 31 + i) as u8).collect()
}

fn statuses(wcs: &[WorkCompletion]) -> Vec<(u64, WcStatus)> {
    wcs.iter().map(|w| (w.wr_id, w.status)).collect()
}

#[test]
fn seed_example_raw_only_cqe4_and_cqe8() {
    let p = pair();
    let local = p.mr(8 * 64, Access::LOCAL_WRITE);
    let remote = p.mr(8 * 64, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let mut wrs = Vec::new();
    for wr in 1..=8u64 {
        let off = (wr as usize - 1) * 64;
        local.write(off, &pattern(wr, 64)).unwrap();
        wrs.push(write(wr, &local, off, 64, remote.remote(off), wr % 4 == 0));
    }
    p.a.post_send(&wrs).unwrap();
    let wcs = poll_n(&p.cq_a, 2);
    assert_eq!(
        statuses(&wcs),
        [(4, WcStatus::Success), (8, WcStatus::Success)]
    );
    assert!(
        wcs.iter()
            .all(|w| w.opcode == Some(WcOpcode::RdmaWrite) && w.qp_num == p.a.qp_num())
    );
    assert_no_more(&p.cq_a);
    assert_no_more(&p.cq_b);
    for wr in 1..=8u64 {
        let mut got = vec![0; 64];
        remote.read((wr as usize - 1) * 64, &mut got).unwrap();
        assert_eq!(got, pattern(wr, 64), "WR{wr} landed");
    }
}

/// A queue given a CQ other than the one its QP's sends report to would wait for ever:
/// refused, with the QP handed back; so is a shared CQ of another CQ.
#[test]
fn a_queue_on_a_cq_its_sends_do_not_report_to_is_refused() {
    let p = pair();
    let refused = SignaledQueue::<SoftDevice, ()>::new(p.a, Arc::clone(&p.cq_b), Policy::Every(4))
        .err()
        .expect("refused");
    assert_eq!(refused.error, ConfigError::NotTheSendCq);
    let shared = selsig::SharedCq::new(Arc::clone(&p.cq_b));
    let refused =
        SignaledQueue::<SoftDevice, ()>::on_shared_cq(refused.qp, &shared, QueueConfig::default())
            .err()
            .expect("refused");
    assert_eq!(refused.error, ConfigError::NotTheSendCq);
    // Its own CQ: taken (the refusals left no claim behind).
    SignaledQueue::<SoftDevice, ()>::new(refused.qp, Arc::clone(&p.cq_a), Policy::Every(4))
        .unwrap();
}

/// Eight 64-byte buffers of one region of `p`'s device, and a remote region for them.
fn eight_buffers(p: &Pair) -> (Vec<Buffer<SoftMr>>, SoftMr) {
    let local = Buffer::new(p.mr(8 * 64, Access::LOCAL_WRITE));
    let remote = p.mr(8 * 64, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let (bufs, _) = local.split_into(8, 64).unwrap();
    (bufs, remote)
}

#[test]
fn seed_example_through_the_signaled_queue() {
    let p = pair();
    let local = Buffer::new(p.mr(8 * 64, Access::LOCAL_WRITE));
    let remote = p.mr(8 * 64, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let (mut bufs, _) = local.split_into(8, 64).unwrap();
    let mut q: SignaledQueue<SoftDevice, u64> =
        SignaledQueue::new(p.a, Arc::clone(&p.cq_a), Policy::Every(4)).unwrap();
    let mut signaled = Vec::new();
    for (i, mut buf) in bufs.drain(..).enumerate() {
        let wr = i as u64 + 1;
        buf.write(0, &pattern(wr, 64)).unwrap();
        let posted = q.post(Work::write(buf, remote.remote(i * 64), wr)).unwrap();
        if posted.signaled() {
            signaled.push(posted.seq.0);
        }
    }
    assert_eq!(signaled, [4, 8]);
    let mut done = Vec::new();
    let start = Instant::now();
    while done.len() < 8 {
        q.poll(&mut done).unwrap();
        assert!(start.elapsed() < WAIT);
    }
    let users: Vec<u64> = done.iter().map(|c| c.user).collect();
    assert_eq!(users, (1..=8).collect::<Vec<_>>(), "in posting order");
    assert!(
        done.iter()
            .all(|c| c.outcome == Outcome::Completed && c.buffer.is_some())
    );
    let stats = q.stats();
    assert_eq!((stats.cqes, stats.success_cqes, stats.completed), (2, 2, 8));
    for wr in 1..=8u64 {
        let mut got = vec![0; 64];
        remote.read((wr as usize - 1) * 64, &mut got).unwrap();
        assert_eq!(got, pattern(wr, 64));
    }
}

#[test]
fn a_poll_batch_beyond_the_cq_is_reduced_to_it() {
    let p = pair();
    let remote = p.mr(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let config = QueueConfig {
        poll_batch: usize::MAX,
        ..QueueConfig::with_policy(Policy::Every(1))
    };
    let mut q: SignaledQueue<SoftDevice, u32> =
        SignaledQueue::with_config(p.a, Arc::clone(&p.cq_a), config).unwrap();
    q.post(Work::write_inline(&[7; 8], remote.remote(0), 1))
        .unwrap();
    let mut done = Vec::new();
    let start = Instant::now();
    while done.is_empty() {
        q.poll(&mut done).unwrap();
        assert!(start.elapsed() < WAIT);
    }
    assert_eq!((done[0].user, done[0].outcome), (1, Outcome::Completed));
}

#[test]
fn buffers_split_as_asked_or_come_back_whole() {
    let p = pair();
    let whole = Buffer::new(p.mr(100, Access::LOCAL_WRITE));
    let (parts, rest) = whole.split_into(3, 30).unwrap();
    let sizes: Vec<(usize, usize)> = parts.iter().map(|b| (b.offset(), b.len())).collect();
    assert_eq!(sizes, [(0, 30), (30, 30), (60, 30)]);
    assert_eq!((rest.offset(), rest.len()), (90, 10));
    // Too many bytes, a count whose bytes overflow, and zero-length buffers in numbers no
    // list can hold: the buffer comes back whole, nothing panics or aborts.
    let whole = rest
        .join(Buffer::new(p.mr(8, Access::LOCAL_WRITE)))
        .unwrap_err()
        .0;
    let whole = whole.split_into(2, 6).unwrap_err();
    let whole = whole.split_into(usize::MAX, 2).unwrap_err();
    let whole = whole.split_into(usize::MAX, 0).unwrap_err();
    let whole = whole.split_into(1 << 60, 0).unwrap_err();
    assert_eq!((whole.offset(), whole.len()), (90, 10));
    let (empty, rest) = whole.split_into(4, 0).unwrap();
    assert!(empty.iter().all(|b| b.is_empty()));
    assert_eq!(rest.len(), 10);
}

#[test]
fn a_batch_begun_without_room_posts_if_shared_credits_come_back_meanwhile() {
    let p = pair();
    let remote = p.mr(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let pool = selsig::CqCredits::new(4);
    // Another queue holds the whole pool when the batch begins ...
    assert_eq!(pool.try_acquire(4), Some(0));
    let config = QueueConfig {
        cq: Some(selsig::CqBudget::Shared(pool.clone())),
        ..QueueConfig::with_policy(Policy::Every(1))
    };
    let mut q: SignaledQueue<SoftDevice, u32> =
        SignaledQueue::with_config(p.a, Arc::clone(&p.cq_a), config).unwrap();
    // ... and gives it back as the first work request is taken.
    let data = pattern(1, 16);
    let mut first = true;
    let mut works = std::iter::from_fn(|| {
        if !std::mem::take(&mut first) {
            return None;
        }
        assert!(pool.release(4));
        Some(Work::write_inline(&data, remote.remote(0), 1u32))
    });
    assert_eq!(q.post_batch(&mut works).unwrap(), 1);
    let mut done = Vec::new();
    let start = Instant::now();
    while done.is_empty() {
        q.poll(&mut done).unwrap();
        assert!(start.elapsed() < WAIT);
    }
    assert_eq!((done[0].user, done[0].outcome), (1, Outcome::Completed));
    let mut got = vec![0; 16];
    remote.read(0, &mut got).unwrap();
    assert_eq!(got, data);
    assert_eq!(
        pool.available(),
        4,
        "the credit came back with the completion"
    );
}

/// `try_post` without room (here, a shared pool another queue holds whole) gives the work
/// request back whole: its buffer, its context, its target; posted again once the
/// credits come back, it lands where it was meant to.
#[test]
fn try_post_without_room_gives_the_work_request_back_whole() {
    let p = pair();
    let (bufs, remote) = eight_buffers(&p);
    let pool = selsig::CqCredits::new(4);
    assert_eq!(pool.try_acquire(4), Some(0));
    let config = QueueConfig {
        cq: Some(selsig::CqBudget::Shared(pool.clone())),
        ..QueueConfig::with_policy(Policy::Every(1))
    };
    let mut q: SignaledQueue<SoftDevice, u32> =
        SignaledQueue::with_config(p.a, Arc::clone(&p.cq_a), config).unwrap();
    let mut buf = bufs.into_iter().next().unwrap();
    buf.fill(0x5a).unwrap();
    let work = Work::write(buf, remote.remote(64), 7);
    let Err(selsig::TryPostError::NoRoom(work)) = q.try_post(work) else {
        panic!("no room: the pool is taken");
    };
    assert_eq!(q.outstanding(), 0);
    assert!(pool.release(4));
    q.try_post(work).unwrap();
    let mut done = Vec::new();
    let start = Instant::now();
    while done.is_empty() {
        q.poll(&mut done).unwrap();
        assert!(start.elapsed() < WAIT);
    }
    assert_eq!((done[0].user, done[0].outcome), (7, Outcome::Completed));
    assert!(done[0].buffer.is_some());
    let mut got = vec![0; 64];
    remote.read(64, &mut got).unwrap();
    assert_eq!(got, vec![0x5a; 64], "the WRITE went where it was meant to");
}

/// A local and a remote region for [`post_unsignaled_until_full`], which must outlive the
/// WRITEs it posts (a WRITE the NIC runs after its region is gone fails, with a completion).
fn write_regions(p: &Pair) -> (SoftMr, SoftMr) {
    (
        p.mr(64, Access::LOCAL_WRITE),
        p.mr(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE),
    )
}

/// Posts unsignaled 8-byte WRITEs one at a time until the provider refuses one.
fn post_unsignaled_until_full(
    p: &Pair,
    (local, remote): &(SoftMr, SoftMr),
    n: u64,
) -> Result<u64, selsig::PostWrError> {
    for wr in 0..n {
        p.a.post_send(&[write(wr, local, 0, 8, remote.remote(0), false)])?;
        // Give the NIC time to execute what was posted: only slot freeing differs.
        if wr % 4 == 3 {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    Ok(n)
}

#[test]
fn mlx5_send_queue_full_of_unsignaled_wrs_never_drains() {
    let p = pair_with(Personality::Mlx5, 8, 64, false);
    assert_eq!(p.a.caps().max_send_wr, 8);
    let regions = write_regions(&p);
    assert!(p.a.record_execution_times(true));
    let err = post_unsignaled_until_full(&p, &regions, 100).unwrap_err();
    assert_eq!(err.index, 0);
    assert!(err.is_full(), "{err}");
    assert_eq!(
        err.source.as_ref().and_then(|e| e.raw_os_error()),
        Some(12),
        "ENOMEM"
    );
    // Still full once all 8 ran: executed, but no completion was polled.
    let start = Instant::now();
    while p.a.executed_at(7).is_none() {
        assert!(start.elapsed() < WAIT, "the 8 WRITEs never ran");
        std::thread::yield_now();
    }
    let err = post_unsignaled_until_full(&p, &regions, 1).unwrap_err();
    assert_eq!(err.failure, PostFailure::Full);
    assert_no_more(&p.cq_a);
}

#[test]
fn rxe_frees_slots_on_execution_and_holds_more_than_reported() {
    let p = pair_with(Personality::Rxe, 8, 64, false);
    assert_eq!(p.a.caps().max_send_wr, 8, "reads back as requested");
    let (local, remote) = write_regions(&p);
    // Never full for long: each slot comes back when the NIC has run its WRITE, with no
    // completion polled (waited for: a loaded machine runs the NIC late).
    for wr in 0..100 {
        let start = Instant::now();
        while let Err(e) =
            p.a.post_send(&[write(wr, &local, 0, 8, remote.remote(0), false)])
        {
            assert!(e.is_full(), "{e}");
            assert!(start.elapsed() < WAIT, "WRITE {wr}: the queue stayed full");
            std::thread::yield_now();
        }
    }
    assert_no_more(&p.cq_a);
    // One list of 36 unsignaled WRITEs on depth 8: the first 15 are accepted.
    let p = pair_with(Personality::Rxe, 8, 64, false);
    let local = p.mr(64, Access::LOCAL_WRITE);
    let remote = p.mr(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    // Keep the NIC busy-free: it may execute some while we post, so accept >= 15.
    let wrs: Vec<_> = (0..36)
        .map(|i| write(i, &local, 0, 8, remote.remote(0), false))
        .collect();
    let err = p.a.post_send(&wrs).unwrap_err();
    assert!(err.is_full());
    assert!(
        err.index >= 15,
        "rxe holds 15 on depth 8, refused at {}",
        err.index
    );
}

/// rxe frees a WQE's slot before it posts the WQE's completion (`rxe_comp.c`,
/// `do_complete`: the consumer index moves, then `rxe_cq_post`): who polls a completion
/// finds its slot free, even while the NIC is still busy with later WQEs. (The soft NIC
/// freed the slots of a pass over the queue at its end: a post right after a completion
/// could find the ring full, as a stress thread did under valgrind.)
#[test]
fn rxe_frees_a_slot_before_its_completion_can_be_polled() {
    let p = pair_with(Personality::Rxe, 2, 16, false); // a ring of 3
    const BIG: usize = 64 << 20;
    let local = p.mr(BIG, Access::LOCAL_WRITE);
    let remote = p.mr(BIG, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let at = remote.remote(0);
    // WRITE 1's completion comes while the NIC copies the 64 MiB of WRITE 2.
    p.a.post_send(&[
        write(1, &local, 0, 8, at, true),
        write(2, &local, 0, BIG as u32, at, false),
        write(3, &local, 0, 8, at, true),
    ])
    .unwrap();
    // (The NIC may be done with WRITE 3 as well by the time the CQ is polled: one poll
    // then returns both completions.)
    let mut seen: Vec<u64> = poll_n(&p.cq_a, 1).iter().map(|w| w.wr_id).collect();
    assert_eq!(seen[0], 1);
    p.a.post_send(&[write(4, &local, 0, 8, at, true)])
        .expect("WRITE 1's slot is free once its completion is seen");
    let rest = 3 - seen.len();
    seen.extend(poll_n(&p.cq_a, rest).iter().map(|w| w.wr_id));
    assert_eq!(seen, [1, 3, 4]);
    assert_no_more(&p.cq_a);
}

#[test]
fn the_driver_never_fills_an_mlx5_queue_with_unsignaled_wrs() {
    for policy in [Policy::Never, Policy::Every(1000)] {
        let p = pair_with(Personality::Mlx5, 8, 64, false);
        let local = Buffer::new(p.mr(64, Access::LOCAL_WRITE));
        let remote = p.mr(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
        let (bufs, _) = local.split_into(8, 8).unwrap();
        let mut free: Vec<_> = bufs;
        let mut q: SignaledQueue<SoftDevice, ()> =
            SignaledQueue::new(p.a, Arc::clone(&p.cq_a), policy).unwrap();
        let mut done = Vec::new();
        let mut posted = 0;
        let start = Instant::now();
        while posted < 1000 {
            if let Some(buf) = free.pop() {
                q.post(Work::write(buf, remote.remote(0), ()))
                    .expect("the driver never overfills");
                posted += 1;
            }
            q.poll(&mut done).unwrap();
            free.extend(done.drain(..).filter_map(|c| c.buffer));
            assert!(start.elapsed() < WAIT, "stuck at {posted}");
        }
        assert!(q.stats().forced > 0, "{policy}: signals were forced");
    }
}

#[test]
fn bad_rkey_on_wr3_fails_it_and_flushes_the_rest() {
    let p = pair();
    let local = p.mr(8 * 64, Access::LOCAL_WRITE);
    let remote = p.mr(8 * 64, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let mut wrs = Vec::new();
    for wr in 1..=8u64 {
        let off = (wr as usize - 1) * 64;
        local.write(off, &pattern(wr, 64)).unwrap();
        let mut target = remote.remote(off);
        if wr == 3 {
            target.rkey ^= 0x5a5;
        }
        wrs.push(write(wr, &local, off, 64, target, wr == 8));
    }
    p.a.post_send(&wrs).unwrap();
    let wcs = poll_n(&p.cq_a, 6);
    let mut expected = vec![(3, WcStatus::RemAccessErr)];
    expected.extend((4..=8).map(|wr| (wr, WcStatus::WrFlushErr)));
    assert_eq!(statuses(&wcs), expected);
    assert!(
        wcs.iter().all(|w| w.opcode.is_none()),
        "error completions carry no opcode"
    );
    assert_no_more(&p.cq_a);
    assert_eq!(p.a.state(), QpState::Err);
    assert_eq!(p.b.state(), QpState::Err, "the responder too");
    assert_eq!(
        p.dev.poll_async_event(),
        Some(AsyncEvent::QpAccessErr {
            qp_num: p.b.qp_num()
        })
    );
    for wr in 1..=8u64 {
        let mut got = vec![0; 64];
        remote.read((wr as usize - 1) * 64, &mut got).unwrap();
        if wr <= 2 {
            assert_eq!(got, pattern(wr, 64), "WR{wr} landed");
        } else {
            assert_eq!(got, vec![0; 64], "WR{wr} did not land");
        }
    }
    // Posting to a QP in the error state succeeds and flushes at once.
    p.a.post_send(&[write(9, &local, 0, 8, remote.remote(0), false)])
        .unwrap();
    assert_eq!(statuses(&poll_n(&p.cq_a, 1)), [(9, WcStatus::WrFlushErr)]);
}

/// Error completions carry a vendor syndrome on mlx5, as a ConnectX's do (libmlx5 copies
/// the CQE's `vendor_err_synd`), the values public logs show with each status: 0x88 with
/// `REM_ACCESS_ERR`, 0xf9 with `WR_FLUSH_ERR` (a receive's flush too), 0x51 with
/// `LOC_PROT_ERR` (semantics 34). rxe leaves it 0; a success has none on either.
#[test]
fn error_completions_carry_a_vendor_syndrome_on_mlx5_only() {
    for personality in [Personality::Mlx5, Personality::Rxe] {
        let syndrome = |v: u32| {
            if personality == Personality::Mlx5 {
                v
            } else {
                0
            }
        };
        let p = pair_with(personality, 64, 256, false);
        let local = p.mr(64, Access::LOCAL_WRITE);
        let remote = p.mr(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
        // A local protection error (beyond the local region; rxe reports it as a local
        // QP operation error).
        p.a.post_send(&[write(1, &local, 32, 64, remote.remote(0), true)])
            .unwrap();
        let wc = poll_n(&p.cq_a, 1)[0];
        let local_error = match personality {
            Personality::Mlx5 => WcStatus::LocProtErr,
            Personality::Rxe => WcStatus::LocQpOpErr,
        };
        assert_eq!(
            (wc.status, wc.vendor_err),
            (local_error, syndrome(0x51)),
            "{personality:?}"
        );
        // A success, then a bad rkey and a flush; the peer's receive is flushed too.
        let p = pair_with(personality, 64, 256, false);
        let local = p.mr(64, Access::LOCAL_WRITE);
        let remote = p.mr(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
        p.b.post_recv(&[RecvWr {
            wr_id: 7,
            sge: None,
        }])
        .unwrap();
        let mut bad = remote.remote(0);
        bad.rkey ^= 0x5a5;
        p.a.post_send(&[
            write(1, &local, 0, 8, remote.remote(0), true),
            write(2, &local, 0, 8, bad, false),
            write(3, &local, 0, 8, remote.remote(0), false),
        ])
        .unwrap();
        let got: Vec<(u64, WcStatus, u32)> = poll_n(&p.cq_a, 3)
            .iter()
            .map(|w| (w.wr_id, w.status, w.vendor_err))
            .collect();
        assert_eq!(
            got,
            [
                (1, WcStatus::Success, 0),
                (2, WcStatus::RemAccessErr, syndrome(0x88)),
                (3, WcStatus::WrFlushErr, syndrome(0xf9)),
            ],
            "{personality:?}"
        );
        let wc = poll_n(&p.cq_b, 1)[0];
        assert_eq!(
            (wc.wr_id, wc.status, wc.vendor_err),
            (7, WcStatus::WrFlushErr, syndrome(0xf9)),
            "{personality:?}"
        );
    }
}

#[test]
fn bad_rkey_outcomes_through_the_driver() {
    let p = pair();
    let (bufs, remote) = eight_buffers(&p);
    let mut q: SignaledQueue<SoftDevice, u64> =
        SignaledQueue::new(p.a, Arc::clone(&p.cq_a), Policy::Every(8)).unwrap();
    for (i, buf) in bufs.into_iter().enumerate() {
        let mut target = remote.remote(i * 64);
        if i == 2 {
            target.rkey = target.rkey.wrapping_add(1);
        }
        q.post(Work::write(buf, target, i as u64 + 1)).unwrap();
    }
    let mut done = Vec::new();
    q.drain(WAIT, &mut done).unwrap();
    let outcomes: Vec<(u64, Outcome)> = done.iter().map(|c| (c.user, c.outcome)).collect();
    let mut expected = vec![
        (1, Outcome::Completed),
        (2, Outcome::Completed),
        (3, Outcome::Failed(WcStatus::RemAccessErr)),
    ];
    expected.extend((4..=8).map(|wr| (wr, Outcome::Flushed)));
    assert_eq!(outcomes, expected);
    assert!(
        done.iter().all(|c| c.buffer.is_some()),
        "every buffer comes back"
    );
    assert!(
        q.post(Work::write_empty(remote.remote(0), 9)).is_err(),
        "refused after the error"
    );
}

/// `poll_with` hands back exactly what `poll` does: every WRITE once, in order, with its
/// buffer and outcome (here the bad-rkey story: 2 completed, 1 failed, 5 flushed).
#[test]
fn poll_with_hands_back_every_outcome_in_order() {
    let p = pair();
    let (bufs, remote) = eight_buffers(&p);
    let mut q: SignaledQueue<SoftDevice, u64> =
        SignaledQueue::new(p.a, Arc::clone(&p.cq_a), Policy::Every(4)).unwrap();
    for (i, buf) in bufs.into_iter().enumerate() {
        let mut target = remote.remote(i * 64);
        if i == 2 {
            target.rkey = target.rkey.wrapping_add(1);
        }
        q.post(Work::write(buf, target, i as u64 + 1)).unwrap();
    }
    let mut seen = Vec::new();
    let mut buffers = 0;
    let start = Instant::now();
    while seen.len() < 8 {
        q.poll_with(|c| {
            buffers += usize::from(c.buffer.is_some());
            seen.push((c.user, c.outcome));
        })
        .unwrap();
        assert!(start.elapsed() < WAIT, "only {seen:?}");
    }
    let mut expected = vec![
        (1, Outcome::Completed),
        (2, Outcome::Completed),
        (3, Outcome::Failed(WcStatus::RemAccessErr)),
    ];
    expected.extend((4..=8).map(|wr| (wr, Outcome::Flushed)));
    assert_eq!(seen, expected);
    assert_eq!(buffers, 8, "every buffer comes back");
    assert_eq!(q.outstanding(), 0);
    let mut more = 0;
    q.poll_with(|_| more += 1).unwrap();
    assert_eq!(more, 0, "nothing is handed back twice");
}

/// A panic in the caller's `poll_with` closure ends that poll: the buffer it was handed is
/// the closure's, and the next poll hands back every later one (none is dropped with the
/// unwinding).
#[test]
fn a_panic_in_poll_with_leaves_the_rest_for_the_next_poll() {
    let p = pair();
    let (bufs, remote) = eight_buffers(&p);
    let mut q: SignaledQueue<SoftDevice, u64> =
        SignaledQueue::new(p.a, Arc::clone(&p.cq_a), Policy::Every(8)).unwrap();
    for (i, buf) in bufs.into_iter().enumerate() {
        q.post(Work::write(buf, remote.remote(i * 64), i as u64 + 1))
            .unwrap();
    }
    // One completion covers all 8: poll until it comes and the closure fails.
    let mut handed = Vec::new();
    let start = Instant::now();
    loop {
        let polled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            q.poll_with(|c| {
                assert!(c.user != 2, "the caller's closure fails on 2");
                handed.push(c.user);
            })
        }));
        match polled {
            Err(_) => break,
            Ok(n) => assert_eq!(n.unwrap(), 0, "the closure was handed {handed:?}"),
        }
        assert!(start.elapsed() < WAIT, "no completion");
    }
    assert_eq!(handed, [1]);
    let mut rest = Vec::new();
    q.poll_with(|c| rest.push((c.user, c.outcome, c.buffer.is_some())))
        .unwrap();
    let expected: Vec<_> = (3..=8).map(|u| (u, Outcome::Completed, true)).collect();
    assert_eq!(rest, expected, "the rest come back, buffers included");
    assert_eq!(q.outstanding(), 0);
}

/// A panic in the iterator `post_batch` takes work requests from (the caller's code): the
/// work requests it took before were never handed to the NIC, so they are not left
/// outstanding, where the completions of later work requests would report them completed
/// (every 4: their WRITEs never ran) or be refused as out of order (every 2: the second was
/// to be signaled) and wedge the queue. Both ways of taking a list: one of up to 64 (the
/// queue's slots) is long for the soft NIC, whose slots take each work request as it comes
/// (those written must not be published); one of up to 3 is staged whole first.
#[test]
fn a_panic_in_post_batch_s_iterator_leaves_nothing_it_took_outstanding() {
    let cases = [Policy::Every(2), Policy::Every(4)]
        .into_iter()
        .flat_map(|p| [(p, 64), (p, 3)]);
    for (policy, bound) in cases {
        let p = pair();
        let remote = p.mr(4 * 64, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
        let (bufs, _) = Buffer::new(p.mr(4 * 64, Access::LOCAL_WRITE))
            .split_into(4, 64)
            .unwrap();
        let mut bufs = bufs.into_iter();
        let mut q: SignaledQueue<SoftDevice, u64> =
            SignaledQueue::new(p.a, Arc::clone(&p.cq_a), policy).unwrap();
        assert!(q.qp().post_send_iter_min() <= 64);
        let mut taken = 0u64;
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut works = std::iter::from_fn(|| {
                taken += 1;
                assert!(taken < 3, "the caller's iterator fails on its third item");
                let mut buf = bufs.next().unwrap();
                buf.write(0, &pattern(taken, 64)).unwrap();
                Some(Work::write(
                    buf,
                    remote.remote((taken as usize - 1) * 64),
                    taken,
                ))
            })
            .take(bound);
            q.post_batch(&mut works)
        }))
        .is_err();
        assert!(panicked);
        assert_eq!(q.outstanding(), 0, "{policy}, {bound}: nothing was posted");
        assert_eq!(q.stats().posted, 0, "{policy}, {bound}");
        // The queue goes on: two WRITEs to the first two places.
        for wr in [11u64, 12] {
            let mut buf = bufs.next().unwrap();
            buf.write(0, &pattern(wr, 64)).unwrap();
            let at = (wr as usize - 11) * 64;
            q.post(Work::write(buf, remote.remote(at), wr)).unwrap();
        }
        let mut done = Vec::new();
        q.drain(WAIT, &mut done).unwrap();
        let got: Vec<_> = done.iter().map(|c| (c.user, c.outcome)).collect();
        assert_eq!(
            got,
            [(11, Outcome::Completed), (12, Outcome::Completed)],
            "{policy}"
        );
        for (i, wr) in [11u64, 12].into_iter().enumerate() {
            let mut bytes = vec![0; 64];
            remote.read(i * 64, &mut bytes).unwrap();
            assert_eq!(bytes, pattern(wr, 64), "{policy}");
        }
    }
}

#[test]
fn rxe_personality_raises_no_access_event_and_reports_local_errors_as_qp_op_errors() {
    // As the kernel's Soft-RoCE (Linux 6.1) does, seen in scripts/rxe-vm.
    let p = pair_with(Personality::Rxe, 16, 64, false);
    let local = p.mr(64, Access::LOCAL_WRITE);
    let remote = p.mr(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let mut target = remote.remote(0);
    target.rkey ^= 0x5a5;
    assert_eq!(one_write(&p, &local, 8, target), WcStatus::RemAccessErr);
    assert_eq!(
        p.b.state(),
        QpState::Err,
        "the responder still goes to the error state"
    );
    assert_eq!(p.dev.poll_async_event(), None, "but rxe raises no event");
    let p = pair_with(Personality::Rxe, 16, 64, false);
    let local = p.mr(64, Access::LOCAL_WRITE);
    let remote = p.mr(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    p.a.post_send(&[write(1, &local, 32, 64, remote.remote(0), true)])
        .unwrap();
    assert_eq!(poll_n(&p.cq_a, 1)[0].status, WcStatus::LocQpOpErr);
}

#[test]
fn cq_overrun_puts_the_cq_and_qp_in_error_and_raises_events() {
    let p = pair_with(Personality::Mlx5, 64, 4, false);
    assert_eq!(p.cq_a.capacity(), 7, "like mlx5: 2^k - 1 >= requested");
    let local = p.mr(64, Access::LOCAL_WRITE);
    let remote = p.mr(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let wrs: Vec<_> = (0..10)
        .map(|i| write(i, &local, 0, 8, remote.remote(0), true))
        .collect();
    p.a.post_send(&wrs).unwrap();
    // The NIC raises one event after the other: wait for each.
    let next_event = || {
        let start = Instant::now();
        loop {
            if let Some(e) = p.dev.poll_async_event() {
                break e;
            }
            assert!(start.elapsed() < WAIT);
            std::thread::yield_now();
        }
    };
    assert_eq!(next_event(), AsyncEvent::CqErr { cq: p.cq_a.id() });
    assert_eq!(
        next_event(),
        AsyncEvent::QpFatal {
            qp_num: p.a.qp_num()
        }
    );
    assert_eq!(p.a.state(), QpState::Err);
    // The 7 completions that fit are still delivered, then the overrun is reported.
    let wcs = poll_n(&p.cq_a, 7);
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success));
    let mut buf = [WorkCompletion::new(0, WcStatus::Success, 0); 4];
    assert!(matches!(
        p.cq_a.poll(&mut buf),
        Err(CqError::Overrun { capacity: 7 })
    ));
}

/// Posts one signaled work request on `a` and returns its completion's status.
fn one(p: &Pair, wr: SendWr<'_>) -> WcStatus {
    p.a.post_send(&[wr]).unwrap();
    poll_n(&p.cq_a, 1)[0].status
}

/// Posts one signaled WRITE and returns its completion's status.
fn one_write(p: &Pair, local: &SoftMr, len: u32, remote: RemoteAddr) -> WcStatus {
    one(p, write(1, local, 0, len, remote, true))
}

#[test]
fn remote_checks_bounds_access_pd_and_deregistration() {
    // Out of bounds.
    let p = pair();
    let local = p.mr(128, Access::LOCAL_WRITE);
    let remote = p.mr(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    assert_eq!(
        one_write(&p, &local, 65, remote.remote(0)),
        WcStatus::RemAccessErr
    );
    let p = pair();
    let local = p.mr(128, Access::LOCAL_WRITE);
    let remote = p.mr(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    assert_eq!(
        one_write(&p, &local, 8, remote.remote(60)),
        WcStatus::RemAccessErr
    );
    // Missing REMOTE_WRITE on the region.
    let p = pair();
    let local = p.mr(64, Access::LOCAL_WRITE);
    let remote = p.mr(64, Access::REMOTE_READ);
    assert_eq!(
        one_write(&p, &local, 8, remote.remote(0)),
        WcStatus::RemAccessErr
    );
    // A region of another protection domain.
    let p = pair();
    let local = p.mr(64, Access::LOCAL_WRITE);
    let other_pd = p.dev.alloc_pd().unwrap();
    let remote = p
        .dev
        .reg_mr(&other_pd, 64, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    assert_eq!(
        one_write(&p, &local, 8, remote.remote(0)),
        WcStatus::RemAccessErr
    );
    // A deregistered region; and a new one reusing its table entry rejects the old key.
    let p = pair();
    let local = p.mr(64, Access::LOCAL_WRITE);
    let remote = p.mr(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let stale = remote.remote(0);
    drop(remote);
    let _new = p.mr(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    assert_eq!(one_write(&p, &local, 8, stale), WcStatus::RemAccessErr);
    // The responder QP's own access flags.
    let p = pair();
    let local = p.mr(64, Access::LOCAL_WRITE);
    let remote = p.mr(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    p.a.post_send(&[SendWr {
        opcode: Opcode::RdmaRead,
        ..write(1, &local, 0, 8, remote.remote(0), true)
    }])
    .unwrap();
    assert_eq!(
        poll_n(&p.cq_a, 1)[0].status,
        WcStatus::RemAccessErr,
        "READ of a region without REMOTE_READ"
    );
}

/// Posts `wrs` in one list (so one pass of the NIC thread executes them, with the
/// regions it found for the earlier ones in hand) and returns every completion's status.
fn one_list(p: &Pair, wrs: &[SendWr<'_>]) -> Vec<(u64, WcStatus)> {
    p.a.post_send(wrs).unwrap();
    let wcs = poll_n(&p.cq_a, wrs.len());
    assert_no_more(&p.cq_a);
    statuses(&wcs)
}

#[test]
fn every_key_and_range_is_checked_after_the_same_key_passed_in_the_same_pass() {
    use WcStatus::{LocProtErr, RemAccessErr, Success, WrFlushErr};
    let ok = |n: u64| (1..=n).map(|wr| (wr, Success));
    // A remote range out of bounds, under the key of the WRITEs before it; a region in
    // between, so that the two alternate.
    let p = pair();
    let local = p.mr(64, Access::LOCAL_WRITE);
    let (r1, r2) = (
        p.mr(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE),
        p.mr(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE),
    );
    local.write(0, &pattern(1, 64)).unwrap();
    let got = one_list(
        &p,
        &[
            write(1, &local, 0, 8, r1.remote(0), true),
            write(2, &local, 8, 8, r2.remote(8), true),
            write(3, &local, 16, 8, r1.remote(16), true),
            write(4, &local, 0, 8, r1.remote(60), true),
            write(5, &local, 0, 8, r1.remote(0), true),
        ],
    );
    let mut expected: Vec<_> = ok(3).collect();
    expected.extend([(4, RemAccessErr), (5, WrFlushErr)]);
    assert_eq!(got, expected);
    let (mut a, mut b, mut c) = (vec![0; 8], vec![0; 8], vec![0; 8]);
    r1.read(0, &mut a).unwrap();
    r2.read(8, &mut b).unwrap();
    r1.read(16, &mut c).unwrap();
    assert_eq!(
        [a, b, c],
        [0..8, 8..16, 16..24].map(|r| pattern(1, 64)[r].to_vec())
    );
    // A region of another protection domain after one of the responder's.
    let p = pair();
    let (local, remote) = write_regions(&p);
    let other_pd = p.dev.alloc_pd().unwrap();
    let foreign = p
        .dev
        .reg_mr(&other_pd, 64, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    let got = one_list(
        &p,
        &[
            write(1, &local, 0, 8, remote.remote(0), true),
            write(2, &local, 0, 8, foreign.remote(0), true),
        ],
    );
    assert_eq!(got, [(1, Success), (2, RemAccessErr)]);
    // After a good WRITE, under the same keys: a local range out of bounds; the local key
    // as the remote key (its region does not grant remote write).
    let good_then = |second: &dyn Fn(&SoftMr, &SoftMr) -> SendWr<'static>| {
        let p = pair();
        let (local, remote) = write_regions(&p);
        one_list(
            &p,
            &[
                write(1, &local, 0, 8, remote.remote(0), true),
                second(&local, &remote),
            ],
        )
    };
    let got = good_then(&|local, remote| write(2, local, 60, 8, remote.remote(8), true));
    assert_eq!(got, [(1, Success), (2, LocProtErr)]);
    let got = good_then(&|local, _| write(2, local, 0, 8, local.remote(8), true));
    assert_eq!(got, [(1, Success), (2, RemAccessErr)]);
}

/// One WRITE of [`a_list_of_writes_runs_as_a_byte_model_says`]: from local region
/// `local` (0 or 1) at `local_off`, or inline; to remote target `remote` (0 and 1 grant
/// remote write, 2 is local region 0, which does not) at `remote_off`.
#[derive(Debug, Clone)]
struct ModelWrite {
    local: usize,
    local_off: usize,
    len: u32,
    inline: bool,
    remote: usize,
    remote_off: usize,
    signaled: bool,
}

fn model_write() -> impl proptest::strategy::Strategy<Value = ModelWrite> {
    use proptest::prelude::*;
    // Mostly in range, at word offsets and lengths (the NIC's short path), sometimes
    // not; a few other targets and lengths, inline or empty.
    let off = prop_oneof![6 => (0..8usize).prop_map(|w| w * 8), 1 => 0..72usize];
    let len = prop_oneof![6 => (1..=2u32).prop_map(|w| w * 8), 1 => 0..=20u32];
    (
        prop_oneof![4 => Just(0usize), 1 => Just(1usize)],
        off.clone(),
        len,
        proptest::bool::weighted(0.1),
        prop_oneof![8 => Just(0usize), 2 => Just(1usize), 1 => Just(2usize)],
        off,
        proptest::bool::weighted(0.2),
    )
        .prop_map(
            |(local, local_off, len, inline, remote, remote_off, signaled)| ModelWrite {
                local,
                local_off,
                len,
                inline,
                remote,
                remote_off,
                signaled,
            },
        )
}

const MODEL_LEN: usize = 64;

/// Runs `list` in one post (one pass of the NIC thread, which keeps the regions it found
/// for the WRITEs before), then a signaled empty WRITE; returns every completion's status
/// and the bytes of the two remote regions.
fn run_model_list(
    personality: Personality,
    list: &[ModelWrite],
) -> (Vec<(u64, WcStatus)>, [Vec<u8>; 2]) {
    let p = pair_with(personality, 64, 256, false);
    let locals = [
        p.mr(MODEL_LEN, Access::LOCAL_WRITE),
        p.mr(MODEL_LEN, Access::LOCAL_WRITE),
    ];
    let remotes = [p.mr(MODEL_LEN, rw()), p.mr(MODEL_LEN, rw())];
    for (k, mr) in locals.iter().enumerate() {
        mr.write(0, &pattern(k as u64 + 1, MODEL_LEN)).unwrap();
    }
    let inline = pattern(9, 20);
    let mut wrs: Vec<SendWr<'_>> = list
        .iter()
        .enumerate()
        .map(|(i, w)| {
            let target = match w.remote {
                2 => &locals[0],
                r => &remotes[r],
            };
            SendWr {
                wr_id: i as u64 + 1,
                opcode: Opcode::RdmaWrite,
                local: if w.inline {
                    Local::Inline(&inline[..w.len as usize])
                } else {
                    Local::Sge(locals[w.local].sge(w.local_off, w.len))
                },
                remote: target.remote(w.remote_off),
                imm_data: 0,
                signaled: w.signaled,
            }
        })
        .collect();
    let last = list.len() as u64 + 1;
    wrs.push(write(last, &locals[0], 0, 0, remotes[0].remote(0), true));
    p.a.post_send(&wrs).unwrap();
    let mut got = Vec::new();
    while got.last().is_none_or(|&(wr, _)| wr != last) {
        got.extend(statuses(&poll_n(&p.cq_a, 1)));
    }
    assert_no_more(&p.cq_a);
    let bytes = remotes.map(|mr| {
        let mut b = vec![0; MODEL_LEN];
        mr.read(0, &mut b).unwrap();
        b
    });
    (got, bytes)
}

/// What [`run_model_list`] should return, by the rules of `docs/semantics.md`: the local
/// range is checked, then the remote one (a WRITE of no bytes checks neither); the first
/// WRITE that fails gets its error and every later one is flushed, each with a completion;
/// a WRITE that succeeds lands, with a completion if it is signaled.
fn model_outcome(
    personality: Personality,
    list: &[ModelWrite],
) -> (Vec<(u64, WcStatus)>, [Vec<u8>; 2]) {
    let locals = [pattern(1, MODEL_LEN), pattern(2, MODEL_LEN)];
    let inline = pattern(9, 20);
    let mut remotes = [vec![0u8; MODEL_LEN], vec![0u8; MODEL_LEN]];
    let mut got = Vec::new();
    let mut failed = false;
    let fits = |off: usize, len: u32| off + len as usize <= MODEL_LEN;
    for (i, w) in list.iter().enumerate() {
        let wr = i as u64 + 1;
        if failed {
            got.push((wr, WcStatus::WrFlushErr));
            continue;
        }
        let status = if w.len == 0 {
            None
        } else if !w.inline && !fits(w.local_off, w.len) {
            Some(match personality {
                Personality::Mlx5 => WcStatus::LocProtErr,
                Personality::Rxe => WcStatus::LocQpOpErr,
            })
        } else if w.remote == 2 || !fits(w.remote_off, w.len) {
            Some(WcStatus::RemAccessErr)
        } else {
            None
        };
        if let Some(status) = status {
            got.push((wr, status));
            failed = true;
            continue;
        }
        let len = w.len as usize;
        let src = if w.inline {
            &inline[..len]
        } else {
            &locals[w.local][w.local_off..w.local_off + len]
        };
        if len > 0 {
            remotes[w.remote][w.remote_off..w.remote_off + len].copy_from_slice(src);
        }
        if w.signaled {
            got.push((wr, WcStatus::Success));
        }
    }
    let last = list.len() as u64 + 1;
    got.push((
        last,
        if failed {
            WcStatus::WrFlushErr
        } else {
            WcStatus::Success
        },
    ));
    (got, remotes)
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]

    /// The NIC thread's short path for plain WRITEs, taken once a pass found their
    /// regions, does what the full checks do: every WRITE of a list, signaled or not,
    /// lands or fails as a byte model of the rules says, whatever came before it.
    #[test]
    fn a_list_of_writes_runs_as_a_byte_model_says(
        list in proptest::collection::vec(model_write(), 1..48),
        rxe in proptest::bool::ANY,
    ) {
        let personality = if rxe { Personality::Rxe } else { Personality::Mlx5 };
        let (got, bytes) = run_model_list(personality, &list);
        let (want, want_bytes) = model_outcome(personality, &list);
        proptest::prop_assert_eq!(got, want);
        proptest::prop_assert_eq!(bytes, want_bytes);
    }
}

#[test]
fn the_responder_qp_access_flags_are_checked() {
    let dev = SoftDevice::open(SoftConfig::default()).unwrap();
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(16).unwrap();
    let init = QpInit {
        caps: QpCaps::default(),
        sq_sig_all: false,
    };
    let a = dev.create_qp(&pd, &cq, &cq, &init).unwrap();
    let b = dev.create_qp(&pd, &cq, &cq, &init).unwrap();
    let read_only = ConnectOptions {
        access: Access::REMOTE_READ,
        ..ConnectOptions::default()
    };
    a.connect(&b.endpoint(&read_only).unwrap(), &read_only)
        .unwrap();
    b.connect(&a.endpoint(&read_only).unwrap(), &read_only)
        .unwrap();
    let local = dev.reg_mr(&pd, 64, Access::LOCAL_WRITE).unwrap();
    let remote = dev
        .reg_mr(
            &pd,
            64,
            Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
        )
        .unwrap();
    a.post_send(&[write(1, &local, 0, 8, remote.remote(0), true)])
        .unwrap();
    assert_eq!(
        statuses(&poll_n(&cq, 1)),
        [(1, WcStatus::RemAccessErr)],
        "b's QP does not allow REMOTE_WRITE"
    );
}

#[test]
fn local_checks_give_local_protection_errors() {
    // A local region of another protection domain.
    let p = pair();
    let other_pd = p.dev.alloc_pd().unwrap();
    let local = p.dev.reg_mr(&other_pd, 64, Access::LOCAL_WRITE).unwrap();
    let remote = p.mr(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    assert_eq!(
        one_write(&p, &local, 8, remote.remote(0)),
        WcStatus::LocProtErr
    );
    let p = pair();
    let local = p.mr(64, Access::LOCAL_WRITE);
    let remote = p.mr(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    p.a.post_send(&[write(1, &local, 32, 64, remote.remote(0), true)])
        .unwrap();
    assert_eq!(statuses(&poll_n(&p.cq_a, 1)), [(1, WcStatus::LocProtErr)]);
    assert_eq!(
        p.b.state(),
        QpState::Rts,
        "a local error leaves the responder alone"
    );
    // A READ into a region without LOCAL_WRITE.
    let p = pair();
    let local = p.mr(64, Access::empty());
    let remote = p.mr(64, Access::REMOTE_READ);
    p.a.post_send(&[SendWr {
        opcode: Opcode::RdmaRead,
        ..write(1, &local, 0, 8, remote.remote(0), true)
    }])
    .unwrap();
    assert_eq!(poll_n(&p.cq_a, 1)[0].status, WcStatus::LocProtErr);
}

#[test]
fn rdma_read_brings_remote_bytes() {
    let p = pair();
    let local = p.mr(4096, Access::LOCAL_WRITE);
    let remote = p.mr(4096, Access::REMOTE_READ);
    let data = pattern(7, 3000);
    remote.write(1000, &data).unwrap();
    p.a.post_send(&[SendWr {
        opcode: Opcode::RdmaRead,
        ..write(5, &local, 3, 3000, remote.remote(1000), true)
    }])
    .unwrap();
    let wc = poll_n(&p.cq_a, 1)[0];
    assert_eq!(
        (wc.status, wc.opcode, wc.byte_len),
        (WcStatus::Success, Some(WcOpcode::RdmaRead), 3000)
    );
    let mut got = vec![0; 3000];
    local.read(3, &mut got).unwrap();
    assert_eq!(got, data);
}

#[test]
fn send_recv_and_write_with_imm_complete_on_the_peer() {
    let p = pair();
    let local = p.mr(256, Access::LOCAL_WRITE);
    let inbox = p.mr(256, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    local.write(0, b"hello over SEND").unwrap();
    p.b.post_recv(&[
        RecvWr {
            wr_id: 100,
            sge: Some(inbox.sge(0, 128)),
        },
        RecvWr {
            wr_id: 101,
            sge: None,
        },
        RecvWr {
            wr_id: 102,
            sge: Some(inbox.sge(128, 128)),
        },
    ])
    .unwrap();
    let send = SendWr {
        wr_id: 1,
        opcode: Opcode::Send,
        local: Local::Sge(local.sge(0, 15)),
        remote: RemoteAddr::default(),
        imm_data: 0,
        signaled: true,
    };
    let imm = SendWr {
        wr_id: 2,
        opcode: Opcode::RdmaWriteWithImm,
        local: Local::Inline(b"imm!"),
        remote: inbox.remote(200),
        imm_data: 0xabcd,
        signaled: true,
    };
    let send_imm = SendWr {
        wr_id: 3,
        opcode: Opcode::SendWithImm,
        local: Local::Inline(b"inline send"),
        remote: RemoteAddr::default(),
        imm_data: 7,
        signaled: true,
    };
    p.a.post_send(&[send, imm, send_imm]).unwrap();
    let sends = poll_n(&p.cq_a, 3);
    // A send completion defines neither a length nor immediate data (mlx5 writes neither):
    // both read as empty.
    assert_eq!(
        sends
            .iter()
            .map(|w| (w.wr_id, w.opcode, w.byte_len, w.imm_data))
            .collect::<Vec<_>>(),
        [
            (1, Some(WcOpcode::Send), 0, None),
            (2, Some(WcOpcode::RdmaWrite), 0, None),
            (3, Some(WcOpcode::Send), 0, None)
        ]
    );
    let recvs = poll_n(&p.cq_b, 3);
    let summary: Vec<_> = recvs
        .iter()
        .map(|w| {
            (
                w.wr_id, w.status, w.opcode, w.byte_len, w.imm_data, w.qp_num,
            )
        })
        .collect();
    let b = p.b.qp_num();
    assert_eq!(
        summary,
        [
            (100, WcStatus::Success, Some(WcOpcode::Recv), 15, None, b),
            (
                101,
                WcStatus::Success,
                Some(WcOpcode::RecvRdmaWithImm),
                4,
                Some(0xabcd),
                b
            ),
            (102, WcStatus::Success, Some(WcOpcode::Recv), 11, Some(7), b),
        ]
    );
    let mut got = vec![0; 15];
    inbox.read(0, &mut got).unwrap();
    assert_eq!(&got, b"hello over SEND");
    let mut got = vec![0; 4];
    inbox.read(200, &mut got).unwrap();
    assert_eq!(&got, b"imm!");
    let mut got = vec![0; 11];
    inbox.read(128, &mut got).unwrap();
    assert_eq!(&got, b"inline send");
}

#[test]
fn a_send_longer_than_the_receive_fails_both_sides() {
    let p = pair();
    let local = p.mr(256, Access::LOCAL_WRITE);
    let inbox = p.mr(16, Access::LOCAL_WRITE);
    p.b.post_recv(&[RecvWr {
        wr_id: 9,
        sge: Some(inbox.sge(0, 16)),
    }])
    .unwrap();
    p.a.post_send(&[SendWr {
        wr_id: 1,
        opcode: Opcode::Send,
        local: Local::Sge(local.sge(0, 100)),
        remote: RemoteAddr::default(),
        imm_data: 0,
        signaled: false,
    }])
    .unwrap();
    assert_eq!(statuses(&poll_n(&p.cq_a, 1)), [(1, WcStatus::RemInvReqErr)]);
    assert_eq!(statuses(&poll_n(&p.cq_b, 1)), [(9, WcStatus::LocLenErr)]);
    assert_eq!(p.b.state(), QpState::Err);
}

/// A SEND that finds no receive waits (`rnr_retry = 7`) until the peer posts one, however
/// close the receive comes to the NIC's look at the empty queue: the receive is posted at
/// a different moment in each round, some of them between the NIC finding the queue empty
/// and deciding what to wait for.
#[test]
fn a_send_waiting_for_a_receive_runs_once_one_is_posted() {
    let p = pair();
    let mut buf = [WorkCompletion::new(0, WcStatus::Success, 0); 4];
    let start = Instant::now();
    let mut rounds = 0u64;
    // At most 3 s of rounds (the race showed within the first 60 000 in every run).
    while rounds < 300_000 && start.elapsed() < Duration::from_secs(3) {
        p.a.post_send(&[empty_send(rounds)]).unwrap();
        for _ in 0..rounds % 64 {
            std::hint::spin_loop();
        }
        p.b.post_recv(&[RecvWr {
            wr_id: rounds,
            sge: None,
        }])
        .unwrap();
        let posted = Instant::now();
        while p.cq_a.poll(&mut buf).unwrap() == 0 {
            assert!(
                posted.elapsed() < WAIT,
                "round {rounds}: the SEND did not run although a receive is posted"
            );
        }
        assert_eq!(statuses(&buf[..1]), [(rounds, WcStatus::Success)]);
        assert_eq!(statuses(&poll_n(&p.cq_b, 1)), [(rounds, WcStatus::Success)]);
        rounds += 1;
    }
}

/// A receive's slot comes back when the application polls its completion on mlx5
/// (libmlx5 advances the receive queue's tail in the poll, and `mlx5_post_recv` refuses
/// with ENOMEM while head - tail is the depth), and when the NIC completes it on rxe (the
/// responder advances the queue's consumer index as it writes the completion).
#[test]
fn a_receive_slot_is_free_again_when_mlx5_polls_its_completion_or_rxe_writes_it() {
    for personality in [Personality::Mlx5, Personality::Rxe] {
        let dev = SoftDevice::open(SoftConfig::with_personality(personality)).unwrap();
        let pd = dev.alloc_pd().unwrap();
        let (cq_a, cq_b) = (dev.create_cq(16).unwrap(), dev.create_cq(16).unwrap());
        let a = dev.create_qp(&pd, &cq_a, &cq_a, &depths(4, 1)).unwrap();
        let b = dev.create_qp(&pd, &cq_b, &cq_b, &depths(4, 1)).unwrap();
        connect_pair(&a, &b, &ConnectOptions::default()).unwrap();
        // mlx5's receive queue takes at least 64 bytes, four 16-byte WQEs
        // (`mlx5_calc_rq_size`, semantics 13); rxe's holds what was asked.
        let depth = b.caps().max_recv_wr;
        let expected = match personality {
            Personality::Mlx5 => 4,
            Personality::Rxe => 1,
        };
        assert_eq!(depth, expected, "{personality:?}");
        let recv = |wr_id| b.post_recv(&[RecvWr { wr_id, sge: None }]);
        for wr_id in 0..u64::from(depth) {
            recv(wr_id).unwrap();
        }
        assert!(recv(9).unwrap_err().is_full(), "{personality:?}");
        let send = empty_send(1);
        a.post_send(&[send]).unwrap();
        // The SEND completed, so the receive did: its completion waits in b's CQ.
        assert_eq!(statuses(&poll_n(&cq_a, 1)), [(1, WcStatus::Success)]);
        let before_poll = recv(10);
        match personality {
            Personality::Mlx5 => {
                let err = before_poll.unwrap_err();
                assert!(err.is_full(), "{err}");
                assert_eq!(err.source.as_ref().and_then(|e| e.raw_os_error()), Some(12));
                assert_eq!(statuses(&poll_n(&cq_b, 1)), [(0, WcStatus::Success)]);
                recv(10).unwrap();
            }
            Personality::Rxe => {
                before_poll.unwrap();
                assert_eq!(statuses(&poll_n(&cq_b, 1)), [(0, WcStatus::Success)]);
            }
        }
        assert!(recv(11).unwrap_err().is_full(), "{personality:?}");
    }
}

#[test]
fn receives_are_flushed_when_the_qp_goes_to_error() {
    let p = pair();
    p.b.post_recv(&[
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
    p.b.to_error().unwrap();
    let wcs = poll_n(&p.cq_b, 2);
    assert_eq!(
        statuses(&wcs),
        [(1, WcStatus::WrFlushErr), (2, WcStatus::WrFlushErr)]
    );
    // (mlx5 finds the receive queue whose slots a poll frees by the QP number.)
    assert!(wcs.iter().all(|w| w.qp_num == p.b.qp_num()), "{wcs:?}");
    assert_no_more(&p.cq_b);
}

/// Posts a SEND of `len` bytes from `local` and waits for its completion's status.
fn send(p: &Pair, local: &SoftMr, len: u32) -> WcStatus {
    one(
        p,
        SendWr {
            opcode: Opcode::Send,
            ..write(1, local, 0, len, RemoteAddr::default(), true)
        },
    )
}

#[test]
fn a_send_of_one_byte_or_of_the_receive_s_whole_length_lands() {
    let p = pair();
    let local = p.mr(64, Access::LOCAL_WRITE);
    local.write(0, &pattern(5, 64)).unwrap();
    let inbox = p.mr(64, Access::LOCAL_WRITE);
    for len in [64u32, 1] {
        p.b.post_recv(&[RecvWr {
            wr_id: u64::from(len),
            sge: Some(inbox.sge(0, len)),
        }])
        .unwrap();
        assert_eq!(send(&p, &local, len), WcStatus::Success, "{len} bytes");
        let wc = poll_n(&p.cq_b, 1)[0];
        assert_eq!(
            (wc.wr_id, wc.status, wc.byte_len),
            (u64::from(len), WcStatus::Success, len)
        );
        let mut got = vec![0u8; len as usize];
        inbox.read(0, &mut got).unwrap();
        assert_eq!(got, pattern(5, len as usize), "{len} bytes");
        inbox.write(0, &[0; 64]).unwrap();
    }
    // One byte into a receive with a key of no region: checked, and it fails.
    let mut sge = inbox.sge(0, 1);
    sge.lkey ^= 0x00a5_a500;
    p.b.post_recv(&[RecvWr {
        wr_id: 3,
        sge: Some(sge),
    }])
    .unwrap();
    assert_eq!(send(&p, &local, 1), WcStatus::RemOpErr);
    assert_eq!(statuses(&poll_n(&p.cq_b, 1)), [(3, WcStatus::LocProtErr)]);
}

/// A receive's address and length are taken whole: a message of 64 KiB and more lands at
/// an unaligned address, and not a byte around it changes.
#[test]
fn a_send_of_more_than_64_kib_lands_at_a_receive_s_unaligned_address() {
    let p = pair();
    let len = 70_000;
    let local = p.mr(len, Access::LOCAL_WRITE);
    local.write(0, &pattern(3, len)).unwrap();
    let inbox = p.mr(len + 16, Access::LOCAL_WRITE);
    inbox.write(0, &vec![0xee; len + 16]).unwrap();
    p.b.post_recv(&[RecvWr {
        wr_id: 9,
        sge: Some(inbox.sge(3, len as u32)),
    }])
    .unwrap();
    assert_eq!(send(&p, &local, len as u32), WcStatus::Success);
    let wc = poll_n(&p.cq_b, 1)[0];
    assert_eq!(
        (wc.wr_id, wc.status, wc.byte_len),
        (9, WcStatus::Success, 70_000)
    );
    let mut got = vec![0u8; len + 16];
    inbox.read(0, &mut got).unwrap();
    assert_eq!(got[..3], [0xee; 3]);
    assert!(got[3..3 + len] == pattern(3, len)[..], "the message");
    assert_eq!(got[3 + len..], [0xee; 13]);
}

#[test]
fn a_write_of_one_byte_lands_and_its_key_is_checked() {
    let p = pair();
    let local = p.mr(8, Access::LOCAL_WRITE);
    local.write(0, &[0x5a]).unwrap();
    let remote = p.mr(8, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    assert_eq!(
        one_write(&p, &local, 1, remote.remote(3)),
        WcStatus::Success
    );
    let mut got = [0u8; 8];
    remote.read(0, &mut got).unwrap();
    assert_eq!(got, [0, 0, 0, 0x5a, 0, 0, 0, 0]);
    let mut bad = remote.remote(0);
    bad.rkey ^= 0x00a5_a500;
    assert_eq!(one_write(&p, &local, 1, bad), WcStatus::RemAccessErr);
}

/// A completion the CQ has no room for puts the QP in the error state at once (mlx5): the
/// WRITEs after it in the same post are flushed, not executed, and the QP's fatal event is
/// raised once.
#[test]
fn an_overrun_stops_the_queue_at_once_and_raises_one_fatal_event() {
    let p = pair_with(Personality::Mlx5, 64, 1, false);
    assert_eq!(p.cq_a.capacity(), 1);
    let local = p.mr(32, Access::LOCAL_WRITE);
    local.write(0, &[0xab; 32]).unwrap();
    let remote = p.mr(32, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let wrs: Vec<_> = (0..4)
        .map(|i| {
            write(
                i + 1,
                &local,
                8 * i as usize,
                8,
                remote.remote(8 * i as usize),
                true,
            )
        })
        .collect();
    p.a.post_send(&wrs).unwrap();
    let start = Instant::now();
    while p.a.state() != QpState::Err {
        assert!(start.elapsed() < WAIT, "the overrun did not stop the QP");
        std::thread::yield_now();
    }
    // Time for anything the NIC would still do.
    std::thread::sleep(Duration::from_millis(200));
    let mut got = [0u8; 32];
    remote.read(0, &mut got).unwrap();
    // WRITE 1 completed, WRITE 2 ran and its completion overran the CQ; 3 and 4 did not run.
    assert_eq!(got[..16], [0xab; 16]);
    assert_eq!(got[16..], [0; 16]);
    let mut events = Vec::new();
    while let Some(e) = p.dev.poll_async_event() {
        events.push(e);
    }
    assert_eq!(
        events,
        [
            AsyncEvent::CqErr { cq: p.cq_a.id() },
            AsyncEvent::QpFatal {
                qp_num: p.a.qp_num()
            }
        ]
    );
}

/// The work requests a post took before one it refused are executed without another post
/// (the doorbell rings for them, as mlx5's does).
#[test]
fn the_work_requests_before_a_refused_one_run_without_another_post() {
    let p = pair();
    let (local, remote) = write_regions(&p);
    let big = [0u8; 100];
    let err =
        p.a.post_send(&[
            write(1, &local, 0, 8, remote.remote(0), true),
            SendWr {
                local: Local::Inline(&big),
                ..write(2, &local, 0, 8, remote.remote(0), true)
            },
        ])
        .unwrap_err();
    assert_eq!(err.index, 1, "{err}");
    assert_eq!(statuses(&poll_n(&p.cq_a, 1)), [(1, WcStatus::Success)]);
    assert_no_more(&p.cq_a);
}

/// A SEND waiting for a receive (`rnr_retry = 7`) stops waiting when the responder goes to
/// the error state on its own (here: its CQ overran), not only on `to_error`: it fails with
/// a retry error, as no responder answers.
#[test]
fn a_send_waiting_for_a_receive_fails_once_the_responder_fails() {
    let dev = SoftDevice::open(SoftConfig::default()).unwrap();
    let pd = dev.alloc_pd().unwrap();
    let (cq_a, cq_b) = (dev.create_cq(16).unwrap(), dev.create_cq(1).unwrap());
    let a = dev.create_qp(&pd, &cq_a, &cq_a, &depths(4, 4)).unwrap();
    let b = dev.create_qp(&pd, &cq_b, &cq_b, &depths(4, 4)).unwrap();
    connect_pair(&a, &b, &ConnectOptions::default()).unwrap();
    a.post_send(&[empty_send(1)]).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    // Two zero-length WRITEs (no key checked), two completions.
    let local = dev.reg_mr(&pd, 8, Access::LOCAL_WRITE).unwrap();
    let marker = |wr_id| write(wr_id, &local, 0, 0, RemoteAddr::default(), true);
    b.post_send(&[marker(1), marker(2)]).unwrap();
    assert_eq!(statuses(&poll_n(&cq_a, 1)), [(1, WcStatus::RetryExcErr)]);
    assert_eq!(b.state(), QpState::Err);
}

/// rxe takes a CQ of at most 32767 entries (rxe0's `max_cqe`, Linux 6.1), mlx5 far more.
#[test]
fn rxe_refuses_a_cq_beyond_its_max_cqe() {
    let rxe = SoftDevice::open(SoftConfig::with_personality(Personality::Rxe)).unwrap();
    assert!(rxe.create_cq(selsig_soft::RXE_MAX_CQE).is_ok());
    let err = rxe.create_cq(selsig_soft::RXE_MAX_CQE + 1).unwrap_err();
    assert!(err.to_string().contains("supports 1 to 32767"), "{err}");
    let mlx5 = SoftDevice::open(SoftConfig::with_personality(Personality::Mlx5)).unwrap();
    assert!(mlx5.create_cq(selsig_soft::RXE_MAX_CQE + 1).is_ok());
}

/// rxe rounds a receive queue up to 2^k - 1 slots, as its send queue, and takes that many.
#[test]
fn rxe_takes_receives_up_to_its_rounded_queue() {
    let dev = SoftDevice::open(SoftConfig::with_personality(Personality::Rxe)).unwrap();
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(64).unwrap();
    let qp = dev.create_qp(&pd, &cq, &cq, &depths(4, 8)).unwrap();
    let peer = dev.create_qp(&pd, &cq, &cq, &depths(4, 8)).unwrap();
    connect_pair(&qp, &peer, &ConnectOptions::default()).unwrap();
    for wr_id in 0..15 {
        qp.post_recv(&[RecvWr { wr_id, sge: None }])
            .unwrap_or_else(|e| panic!("receive {wr_id}: {e}"));
    }
    let err = qp
        .post_recv(&[RecvWr {
            wr_id: 15,
            sge: None,
        }])
        .unwrap_err();
    assert!(err.is_full(), "{err}");
    assert_eq!(err.source.as_ref().and_then(|e| e.raw_os_error()), Some(12));
}

#[test]
fn posts_and_queues_the_device_cannot_take_are_refused() {
    let p = pair();
    let (local, remote) = write_regions(&p);
    // An RDMA READ has nowhere to put inline data.
    let bytes = [1u8; 8];
    let err =
        p.a.post_send(&[SendWr {
            opcode: Opcode::RdmaRead,
            local: Local::Inline(&bytes),
            ..write(1, &local, 0, 8, remote.remote(0), true)
        }])
        .unwrap_err();
    assert_eq!(err.index, 0);
    assert!(matches!(err.failure, PostFailure::Invalid(_)), "{err}");
    assert_no_more(&p.cq_a);
    // 2 GiB is the largest message: taken (and failing on the region's bounds), one byte
    // more refused.
    let sge = |length| {
        Local::Sge(selsig::Sge {
            length,
            ..local.sge(0, 1)
        })
    };
    p.a.post_send(&[SendWr {
        local: sge(1 << 31),
        ..write(2, &local, 0, 8, remote.remote(0), true)
    }])
    .unwrap();
    assert_eq!(statuses(&poll_n(&p.cq_a, 1)), [(2, WcStatus::LocProtErr)]);
    let err =
        p.a.post_send(&[SendWr {
            local: sge((1 << 31) + 1),
            ..write(3, &local, 0, 8, remote.remote(0), true)
        }])
        .unwrap_err();
    assert!(matches!(err.failure, PostFailure::Invalid(_)), "{err}");
    // Receives on a QP in the reset state, and a CQ of no entries.
    let dev = SoftDevice::open(SoftConfig::default()).unwrap();
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(4).unwrap();
    let qp = dev.create_qp(&pd, &cq, &cq, &depths(4, 4)).unwrap();
    let err = qp
        .post_recv(&[RecvWr {
            wr_id: 1,
            sge: None,
        }])
        .unwrap_err();
    assert_eq!(err.failure, PostFailure::State(QpState::Reset), "{err}");
    let e = dev.create_cq(0).unwrap_err();
    assert!(e.to_string().contains("0 entries"), "{e}");
}

#[test]
fn zero_length_write_confirms_an_unsignaled_tail() {
    let p = pair();
    let local = Buffer::new(p.mr(64, Access::LOCAL_WRITE));
    let remote = p.mr(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let (bufs, _) = local.split_into(3, 8).unwrap();
    let mut q: SignaledQueue<SoftDevice, usize> =
        SignaledQueue::new(p.a, Arc::clone(&p.cq_a), Policy::Every(16)).unwrap();
    for (i, buf) in bufs.into_iter().enumerate() {
        assert!(
            !q.post(Work::write(buf, remote.remote(i * 8), i))
                .unwrap()
                .signaled()
        );
    }
    let mut done = Vec::new();
    std::thread::sleep(Duration::from_millis(20));
    q.poll(&mut done).unwrap();
    assert!(done.is_empty(), "nothing signaled, nothing known");
    let marker = q
        .confirm_all()
        .unwrap()
        .expect("a marker for the unsignaled tail");
    assert_eq!(marker.0, 4);
    let start = Instant::now();
    while done.len() < 3 {
        q.poll(&mut done).unwrap();
        assert!(start.elapsed() < WAIT);
    }
    assert!(done.iter().all(|c| c.outcome == Outcome::Completed));
    assert_eq!(q.stats().markers, 1);
    assert_eq!(
        q.stats().error_cqes,
        0,
        "the marker (rkey 0, no region) succeeded"
    );
    assert_eq!(q.state(), selsig::QueueState::Ready);
    assert!(q.tracker().is_idle());
}

#[test]
fn invalid_work_requests_and_states_are_refused() {
    let dev = SoftDevice::open(SoftConfig::default()).unwrap();
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(16).unwrap();
    let init = QpInit {
        caps: QpCaps::default(),
        sq_sig_all: false,
    };
    let qp = dev.create_qp(&pd, &cq, &cq, &init).unwrap();
    let wr = SendWr {
        wr_id: 1,
        opcode: Opcode::RdmaWrite,
        local: Local::Empty,
        remote: RemoteAddr::default(),
        imm_data: 0,
        signaled: true,
    };
    let err = qp.post_send(&[wr]).unwrap_err();
    assert_eq!(err.failure, PostFailure::State(QpState::Reset));
    assert!(err.to_string().contains("reset"), "{err}");
    let e = dev
        .create_qp(
            &pd,
            &cq,
            &cq,
            &QpInit {
                caps: QpCaps {
                    max_send_wr: 1 << 20,
                    ..QpCaps::default()
                },
                sq_sig_all: false,
            },
        )
        .unwrap_err();
    assert!(e.to_string().contains("max_send_wr"), "{e}");
    let e = dev
        .create_qp(
            &pd,
            &cq,
            &cq,
            &QpInit {
                caps: QpCaps {
                    max_inline_data: 1000,
                    ..QpCaps::default()
                },
                sq_sig_all: false,
            },
        )
        .unwrap_err();
    assert!(e.to_string().contains("max_inline_data"), "{e}");
    // Connecting to a QP that does not exist names it.
    let mut ep = qp.endpoint(&ConnectOptions::default()).unwrap();
    ep.qp_num = 0xbad;
    let e = qp.connect(&ep, &ConnectOptions::default()).unwrap_err();
    assert!(e.to_string().contains("0xbad"), "{e}");
    // Another device's QP cannot be reached.
    let other = SoftDevice::open(SoftConfig::default()).unwrap();
    let opd = other.alloc_pd().unwrap();
    let ocq = other.create_cq(16).unwrap();
    let oqp = other.create_qp(&opd, &ocq, &ocq, &init).unwrap();
    let qp2 = dev.create_qp(&pd, &cq, &cq, &init).unwrap();
    let e = qp2
        .connect(
            &oqp.endpoint(&ConnectOptions::default()).unwrap(),
            &ConnectOptions::default(),
        )
        .unwrap_err();
    assert!(e.to_string().contains("within one device"), "{e}");
    // Inline data longer than the QP allows.
    let p = pair();
    let big = [0u8; 61];
    let err =
        p.a.post_send(&[SendWr {
            local: Local::Inline(&big),
            ..wr
        }])
        .unwrap_err();
    assert_eq!(
        err.failure,
        PostFailure::InlineTooLong { len: 61, max: 60 },
        "{err}"
    );
    assert_eq!(
        err.to_string(),
        "work request 0 of the batch was not posted: invalid work request: 61 bytes of inline \
         data, more than the queue pair's max_inline_data of 60"
    );
}

/// A refused connect changes nothing, as a failed `ibv_modify_qp`: a QP refused for a bad
/// endpoint stays in the reset state and connects on the next try, and a connected QP
/// refused a second connect keeps its access flags.
#[test]
fn a_refused_connect_leaves_the_qp_as_it_was() {
    let dev = SoftDevice::open(SoftConfig::default()).unwrap();
    let pd = dev.alloc_pd().unwrap();
    let (cq_a, cq_b) = (dev.create_cq(16).unwrap(), dev.create_cq(16).unwrap());
    let init = depths(16, 16);
    let a = dev.create_qp(&pd, &cq_a, &cq_a, &init).unwrap();
    let b = dev.create_qp(&pd, &cq_b, &cq_b, &init).unwrap();
    let options = ConnectOptions::default();
    let good = b.endpoint(&options).unwrap();
    let e = a
        .connect(
            &selsig::Endpoint {
                qp_num: 0xbad,
                ..good
            },
            &options,
        )
        .unwrap_err();
    assert!(e.to_string().contains("0xbad"), "{e}");
    assert_eq!(a.state(), QpState::Reset);
    // Options out of range are refused as well, before anything changes.
    for bad in [
        ConnectOptions {
            rnr_retry: 8,
            ..options
        },
        ConnectOptions { mtu: 0, ..options },
    ] {
        assert!(a.endpoint(&bad).is_err());
        let e = a.connect(&good, &bad).unwrap_err();
        assert!(e.to_string().contains("the range is"), "{e}");
        assert_eq!(a.state(), QpState::Reset);
    }
    a.connect(&good, &options).unwrap();
    b.connect(&a.endpoint(&options).unwrap(), &options).unwrap();
    // b is in RTS: a second connect, with no remote access, is refused ...
    let e = b
        .connect(
            &a.endpoint(&options).unwrap(),
            &ConnectOptions {
                access: Access::empty(),
                ..options
            },
        )
        .unwrap_err();
    assert!(e.to_string().contains("not in the reset state"), "{e}");
    // ... and b still takes a's WRITEs.
    let local = dev.reg_mr(&pd, 64, Access::LOCAL_WRITE).unwrap();
    let remote = dev
        .reg_mr(&pd, 64, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    a.post_send(&[write(1, &local, 0, 8, remote.remote(0), true)])
        .unwrap();
    assert_eq!(statuses(&poll_n(&cq_a, 1)), [(1, WcStatus::Success)]);
    assert_eq!((a.state(), b.state()), (QpState::Rts, QpState::Rts));
}

/// A destroyed QP executes nothing more: a drop while the NIC runs its WRITEs returns once
/// the NIC left them (those it did not run never land), on both personalities.
#[test]
fn a_dropped_qp_executes_nothing_after_the_drop() {
    const CHUNK: usize = 1 << 20;
    const N: usize = 64;
    for personality in [Personality::Mlx5, Personality::Rxe] {
        let p = pair_with(personality, 64, 256, false);
        let local = p.mr(CHUNK, Access::LOCAL_WRITE);
        local.fill(0, CHUNK, 0xab).unwrap();
        let remote = p.mr(CHUNK * N, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
        let wrs: Vec<_> = (0..N)
            .map(|k| {
                write(
                    k as u64,
                    &local,
                    0,
                    CHUNK as u32,
                    remote.remote(k * CHUNK),
                    false,
                )
            })
            .collect();
        let landed = || {
            (0..N)
                .filter(|k| {
                    let mut last = [0u8];
                    remote.read(k * CHUNK + CHUNK - 1, &mut last).unwrap();
                    last[0] == 0xab
                })
                .count()
        };
        p.a.post_send(&wrs).unwrap();
        // The NIC is at work on them when the QP goes.
        let start = Instant::now();
        while landed() == 0 {
            assert!(start.elapsed() < WAIT, "{personality}: no WRITE landed");
        }
        // Only `a` goes: its peer, CQs and regions stay.
        drop(p.a);
        let at_drop = landed();
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(
            landed(),
            at_drop,
            "{personality}: WRITEs landed after the QP was dropped"
        );
    }
}

/// A protection domain or CQ of another device is refused, as verbs refuses objects of
/// another context: the two NICs would both write to the CQ, and their ids collide (a QP
/// of one device's PD could reach regions of the other's).
#[test]
fn objects_of_another_device_are_refused() {
    let dev = SoftDevice::open(SoftConfig::default()).unwrap();
    let other = SoftDevice::open(SoftConfig::default()).unwrap();
    let (pd, cq) = (dev.alloc_pd().unwrap(), dev.create_cq(16).unwrap());
    let (other_pd, other_cq) = (other.alloc_pd().unwrap(), other.create_cq(16).unwrap());
    let init = depths(16, 16);
    let refused = |e: selsig::ProviderError, what: &str| {
        assert!(
            e.to_string()
                .starts_with(&format!("invalid {what}: it belongs to another device")),
            "{e}"
        );
    };
    refused(
        dev.create_qp(&other_pd, &cq, &cq, &init).unwrap_err(),
        "protection domain",
    );
    refused(
        dev.create_qp(&pd, &other_cq, &cq, &init).unwrap_err(),
        "send CQ",
    );
    refused(
        dev.create_qp(&pd, &cq, &other_cq, &init).unwrap_err(),
        "receive CQ",
    );
    refused(
        dev.reg_mr(&other_pd, 64, Access::LOCAL_WRITE).unwrap_err(),
        "protection domain",
    );
    // Its own objects still do.
    dev.create_qp(&pd, &cq, &cq, &init).unwrap();
    dev.reg_mr(&pd, 64, Access::LOCAL_WRITE).unwrap();
}

/// A queue pair may have no receive queue (it only sends: most WRITE streams) or no send
/// queue, as in verbs: the empty one takes nothing (ENOMEM), the other works.
#[test]
fn a_queue_pair_may_have_no_receive_or_no_send_queue() {
    for personality in [Personality::Mlx5, Personality::Rxe] {
        let dev = SoftDevice::open(SoftConfig::with_personality(personality)).unwrap();
        let pd = dev.alloc_pd().unwrap();
        let cq = dev.create_cq(16).unwrap();
        let qp = |max_send_wr, max_recv_wr| {
            let init = depths(max_send_wr, max_recv_wr);
            dev.create_qp(&pd, &cq, &cq, &init).unwrap()
        };
        let (writer, reader) = (qp(4, 0), qp(0, 4));
        assert_eq!(
            (writer.caps().max_recv_wr, reader.caps().max_send_wr),
            (0, 0),
            "{personality}"
        );
        connect_pair(&writer, &reader, &ConnectOptions::default()).unwrap();
        let local = dev.reg_mr(&pd, 64, Access::LOCAL_WRITE).unwrap();
        let remote = dev
            .reg_mr(&pd, 64, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
            .unwrap();
        let e = writer
            .post_recv(&[RecvWr {
                wr_id: 1,
                sge: None,
            }])
            .unwrap_err();
        assert_eq!(
            (e.index, e.failure),
            (0, PostFailure::Full),
            "{personality}"
        );
        let e = reader
            .post_send(&[write(2, &local, 0, 8, remote.remote(0), true)])
            .unwrap_err();
        assert_eq!(
            (e.index, e.failure),
            (0, PostFailure::Full),
            "{personality}"
        );
        writer
            .post_send(&[write(3, &local, 0, 8, remote.remote(0), true)])
            .unwrap();
        assert_eq!(statuses(&poll_n(&cq, 1)), [(3, WcStatus::Success)]);
    }
}

#[test]
fn remote_write_access_needs_local_write_as_in_verbs() {
    let p = pair();
    let e = p.dev.reg_mr(&p.pd, 64, Access::REMOTE_WRITE).unwrap_err();
    assert!(e.to_string().contains("LOCAL_WRITE"), "{e}");
    assert!(p.dev.reg_mr(&p.pd, 64, Access::REMOTE_ATOMIC).is_err());
    assert!(
        p.dev.reg_mr(&p.pd, 64, Access::REMOTE_READ).is_ok(),
        "REMOTE_READ alone is fine"
    );
}

/// A QP of `send` send and `recv` receive WRs with `inline` bytes of inline data.
fn sized(send: u32, recv: u32, inline: u32) -> QpInit {
    QpInit {
        caps: QpCaps {
            max_inline_data: inline,
            ..depths(send, recv).caps
        },
        sq_sig_all: false,
    }
}

/// The capacities the mlx5 personality reads back are libmlx5's (semantics 13): the
/// examples worked out from `providers/mlx5/verbs.c` by hand (the full table is
/// `selsig::mlx5_sizing`'s), and every depth and inline size of that table as the shared
/// arithmetic gives them, the same as the verbs provider gets from libmlx5 for the same
/// request.
#[test]
fn mlx5_sizes_queues_as_libmlx5_does() {
    let dev = SoftDevice::open(SoftConfig::default()).unwrap();
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(64).unwrap();
    let caps = |send, recv, inline| {
        dev.create_qp(&pd, &cq, &cq, &sized(send, recv, inline))
            .map(|qp| qp.caps())
    };
    let read = |c: QpCaps| (c.max_send_wr, c.max_inline_data);
    // Up to 60 bytes inline, 256-byte WQEs: powers of two.
    assert_eq!(read(caps(100, 1, 0).unwrap()), (128, 60));
    assert_eq!(read(caps(3, 1, 60).unwrap()), (4, 60));
    // 64 bytes inline, 320-byte WQEs.
    assert_eq!(read(caps(4, 1, 64).unwrap()), (6, 124));
    assert_eq!(read(caps(8, 1, 64).unwrap()), (12, 124));
    assert_eq!(read(caps(64, 1, 64).unwrap()), (102, 124));
    // 128 bytes inline, 384-byte WQEs.
    assert_eq!(read(caps(100, 1, 128).unwrap()), (170, 188));
    // Receive queues: a power of two, at least 4; none asked, none given.
    let c = caps(1, 1, 0).unwrap();
    assert_eq!((c.max_recv_wr, c.max_recv_sge), (4, 1));
    assert_eq!(caps(1, 5, 0).unwrap().max_recv_wr, 8);
    let c = caps(1, 0, 0).unwrap();
    assert_eq!((c.max_recv_wr, c.max_recv_sge), (0, 0));
    // The refusals: 8192 WQEs of 256 bytes fill the 32768 blocks of the default device.
    assert_eq!(caps(8192, 1, 0).unwrap().max_send_wr, 8192);
    let e = caps(8193, 1, 0).unwrap_err().to_string();
    assert!(e.contains("max_send_wr") && e.contains("max_qp_wr"), "{e}");
    assert_eq!(caps(1, 1, 316).unwrap().max_inline_data, 316);
    let e = caps(1, 1, 317).unwrap_err().to_string();
    assert!(e.contains("max_inline_data"), "{e}");
    let e = caps(1, 32769, 0).unwrap_err().to_string();
    assert!(e.contains("max_recv_wr"), "{e}");
    // Every depth and inline size of the table, against the shared arithmetic.
    let limits = selsig::mlx5_sizing::Mlx5Limits::connectx(SoftConfig::default().max_qp_wr);
    for depth in [1, 2, 3, 4, 5, 8, 63, 64, 100, 1000, 32768] {
        for inline in [0, 28, 60, 64, 128] {
            let request = selsig::mlx5_sizing::Mlx5Request {
                max_send_wr: depth,
                max_recv_wr: depth,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: inline,
                send_ops: selsig::mlx5_sizing::SendOps::Default,
            };
            let expected = selsig::mlx5_sizing::size_rc_qp(&limits, &request);
            match (caps(depth, depth, inline), expected) {
                (Ok(c), Ok(e)) => assert_eq!(
                    (
                        c.max_send_wr,
                        c.max_recv_wr,
                        c.max_inline_data,
                        c.max_recv_sge
                    ),
                    (
                        e.max_send_wr,
                        e.max_recv_wr,
                        e.max_inline_data,
                        e.max_recv_sge
                    ),
                    "depth {depth}, inline {inline}"
                ),
                (Err(_), Err(_)) => {}
                (got, expected) => panic!("depth {depth}, inline {inline}: {got:?}, {expected:?}"),
            }
        }
    }
    // CQs as before: room for one more than asked, a power of two, one kept empty.
    let p = pair_with(Personality::Mlx5, 100, 100, false);
    assert_eq!(p.cq_a.capacity(), 127);
}

/// The errnos of refused posts are those libmlx5 returns, and none of them reads as a
/// full queue (semantics 33): inline data beyond `max_inline_data` is `ENOMEM`
/// (`set_data_inl_seg`; rxe: `EINVAL`), a send before RTS `ENOMEM` (rdma-core 40 and later,
/// `qp_state_max_gs`; rxe: no errno, as before), a receive in the reset state `EINVAL`.
/// Too many scatter/gather entries (`ENOMEM` too, rxe `EINVAL`) are in `tests/sges.rs`.
#[test]
fn refused_posts_carry_libmlx5s_errno_and_say_what_they_are() {
    let errno = |e: &selsig::PostWrError| e.source.as_ref().and_then(|s| s.raw_os_error());
    for personality in [Personality::Mlx5, Personality::Rxe] {
        let mlx5 = personality == Personality::Mlx5;
        let p = pair_with(personality, 8, 64, false);
        let (local, remote) = write_regions(&p);
        // Before RTS: a QP never connected.
        let fresh = p
            .dev
            .create_qp(&p.pd, &p.cq_a, &p.cq_a, &depths(4, 4))
            .unwrap();
        let err = fresh
            .post_send(&[write(1, &local, 0, 8, remote.remote(0), true)])
            .unwrap_err();
        assert_eq!(
            (err.index, err.failure, errno(&err)),
            (0, PostFailure::State(QpState::Reset), mlx5.then_some(12)),
            "{personality:?}"
        );
        assert!(!err.is_full(), "{personality:?}");
        let err = fresh
            .post_recv(&[RecvWr {
                wr_id: 1,
                sge: None,
            }])
            .unwrap_err();
        assert_eq!(
            (err.failure, errno(&err)),
            (PostFailure::State(QpState::Reset), mlx5.then_some(22)),
            "{personality:?}"
        );
        // Inline data one byte beyond the QP's limit, behind a WRITE that is posted.
        let max = p.a.caps().max_inline_data;
        let long = vec![3u8; max as usize + 1];
        let err =
            p.a.post_send(&[
                write(1, &local, 0, 8, remote.remote(0), true),
                SendWr {
                    local: Local::Inline(&long),
                    ..write(2, &local, 0, 8, remote.remote(0), true)
                },
            ])
            .unwrap_err();
        assert_eq!(
            (err.index, err.failure, errno(&err)),
            (
                1,
                PostFailure::InlineTooLong {
                    len: long.len(),
                    max
                },
                Some(if mlx5 { 12 } else { 22 })
            ),
            "{personality:?}"
        );
        assert!(!err.is_full(), "{personality:?}");
        assert_eq!(statuses(&poll_n(&p.cq_a, 1)), [(1, WcStatus::Success)]);
        // A full queue is ENOMEM too, and full (mlx5: nothing frees the unsignaled ones).
        if mlx5 {
            let err = post_unsignaled_until_full(&p, &(local, remote), 100).unwrap_err();
            assert!(err.is_full(), "{err}");
            assert_eq!(errno(&err), Some(12));
        }
    }
}

/// A QP of 320-byte WQEs holds exactly the 6 WQEs it reads back for a depth of 4, and each
/// its 124 bytes of inline data, which land whole.
#[test]
fn an_mlx5_queue_holds_what_it_reads_back_and_the_inline_data_it_promises() {
    let dev = SoftDevice::open(SoftConfig::default()).unwrap();
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(64).unwrap();
    let a = dev.create_qp(&pd, &cq, &cq, &sized(4, 1, 64)).unwrap();
    let b = dev.create_qp(&pd, &cq, &cq, &sized(4, 1, 64)).unwrap();
    connect_pair(&a, &b, &ConnectOptions::default()).unwrap();
    assert_eq!((a.caps().max_send_wr, a.caps().max_inline_data), (6, 124));
    let remote = dev
        .reg_mr(&pd, 6 * 128, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    let data: Vec<Vec<u8>> = (0..6u8)
        .map(|k| (0..124u8).map(|i| i.wrapping_mul(7) ^ k).collect())
        .collect();
    fn inline_write(wr_id: u64, bytes: &[u8], remote: RemoteAddr, signaled: bool) -> SendWr<'_> {
        SendWr {
            wr_id,
            opcode: Opcode::RdmaWrite,
            local: Local::Inline(bytes),
            remote,
            imm_data: 0,
            signaled,
        }
    }
    // Six unsignaled WRITEs of 124 bytes fit, a seventh does not: nothing frees their
    // slots until a completion covering them is polled.
    for (k, bytes) in data.iter().enumerate() {
        a.post_send(&[inline_write(
            k as u64,
            bytes,
            remote.remote(k * 128),
            k == 5,
        )])
        .unwrap_or_else(|e| panic!("WRITE {k}: {e}"));
    }
    let err = a
        .post_send(&[inline_write(6, &data[0], remote.remote(0), true)])
        .unwrap_err();
    assert!(err.is_full(), "{err}");
    assert_eq!(statuses(&poll_n(&cq, 1)), [(5, WcStatus::Success)]);
    for (k, bytes) in data.iter().enumerate() {
        let mut landed = vec![0u8; 124];
        remote.read(k * 128, &mut landed).unwrap();
        assert_eq!(&landed, bytes, "WRITE {k}");
    }
    // One byte more than the QP reads back is refused.
    let long = [1u8; 125];
    let err = a
        .post_send(&[inline_write(7, &long, remote.remote(0), true)])
        .unwrap_err();
    assert_eq!(
        err.failure,
        PostFailure::InlineTooLong { len: 125, max: 124 }
    );
}

#[test]
fn sq_sig_all_signals_every_wr() {
    let p = pair_with(Personality::Mlx5, 16, 64, true);
    let local = p.mr(64, Access::LOCAL_WRITE);
    let remote = p.mr(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let wrs: Vec<_> = (1..=3)
        .map(|i| write(i, &local, 0, 8, remote.remote(0), false))
        .collect();
    p.a.post_send(&wrs).unwrap();
    assert_eq!(poll_n(&p.cq_a, 3).len(), 3);
}

#[test]
fn partial_post_reports_the_failing_wr_and_the_driver_rolls_back() {
    let p = pair_with(Personality::Mlx5, 8, 64, false);
    let local = Buffer::new(p.mr(64, Access::LOCAL_WRITE));
    let remote = p.mr(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let (bufs, _) = local.split_into(2, 8).unwrap();
    let mut q: SignaledQueue<SoftDevice, u32> =
        SignaledQueue::new(p.a, Arc::clone(&p.cq_a), Policy::Every(4)).unwrap();
    let big = [0u8; 100];
    let mut it = bufs
        .into_iter()
        .enumerate()
        .map(|(i, b)| Work::write(b, remote.remote(0), i as u32))
        .chain(std::iter::once(Work::write_inline(
            &big,
            remote.remote(0),
            2,
        )));
    let err = q.post_batch(&mut it).unwrap_err();
    match err {
        selsig::QueuePostError::Provider { returned, source } => {
            assert_eq!(source.index, 2);
            assert_eq!(returned.len(), 1);
            assert_eq!(returned[0].user, 2);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(q.outstanding(), 2, "the first two were posted");
    let mut done = Vec::new();
    q.drain(WAIT, &mut done).unwrap();
    assert_eq!(done.iter().map(|c| c.user).collect::<Vec<_>>(), [0, 1]);
}

#[test]
fn a_single_post_the_provider_refuses_comes_back_and_leaves_no_trace() {
    let p = pair_with(Personality::Mlx5, 8, 64, false);
    let remote = p.mr(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let mut q: SignaledQueue<SoftDevice, u32> =
        SignaledQueue::new(p.a, Arc::clone(&p.cq_a), Policy::Every(4)).unwrap();
    // Longer than the QP's inline limit: the provider refuses it.
    let big = [7u8; 100];
    match q
        .post(Work::write_inline(&big, remote.remote(0), 1))
        .unwrap_err()
    {
        selsig::QueuePostError::Provider { returned, source } => {
            assert_eq!(source.index, 0);
            assert!(
                matches!(
                    source.failure,
                    PostFailure::InlineTooLong { len: 100, max: 60 }
                ),
                "{source:?}"
            );
            assert_eq!(returned.iter().map(|p| p.user).collect::<Vec<_>>(), [1]);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!((q.outstanding(), q.stats().posted), (0, 0));
    // The next one takes the sequence number the refused one had, and lands.
    let posted = q
        .post(Work::write_inline(&big[..8], remote.remote(0), 2))
        .unwrap();
    assert_eq!(posted.seq.0, 1);
    let mut done = Vec::new();
    q.drain(WAIT, &mut done).unwrap();
    assert_eq!(done.iter().map(|c| c.user).collect::<Vec<_>>(), [2]);
    let mut got = [0u8; 8];
    remote.read(0, &mut got).unwrap();
    assert_eq!(got, [7u8; 8]);
}

#[test]
fn wqe_counter_wraps_past_2_16_on_mlx5() {
    // Slots are freed through the 16-bit WQE counter of each completion.
    let p = pair_with(Personality::Mlx5, 16, 64, false);
    let local = Buffer::new(p.mr(16 * 8, Access::LOCAL_WRITE));
    let remote = p.mr(8, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let (bufs, _) = local.split_into(16, 8).unwrap();
    let mut free = bufs;
    let mut q: SignaledQueue<SoftDevice, ()> =
        SignaledQueue::new(p.a, Arc::clone(&p.cq_a), Policy::Every(8)).unwrap();
    let mut done = Vec::new();
    let total = (1u64 << 16) + 1000;
    let mut posted = 0u64;
    let start = Instant::now();
    while posted < total || !q.tracker().is_idle() {
        while posted < total {
            let Some(buf) = free.pop() else { break };
            q.post(Work::write(buf, remote.remote(0), ())).unwrap();
            posted += 1;
        }
        if posted == total {
            q.confirm_all().unwrap();
        }
        q.poll(&mut done).unwrap();
        free.extend(done.drain(..).map(|c| {
            assert_eq!(c.outcome, Outcome::Completed);
            c.buffer.unwrap()
        }));
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "stuck at {posted}"
        );
    }
    assert_eq!(q.stats().completed, total);
}

#[test]
fn execution_times_are_recorded_for_unsignaled_work_requests_too() {
    let p = pair();
    let local = p.mr(16 * 64, Access::LOCAL_WRITE);
    let remote = p.mr(16 * 64, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let wrs = |from: u64| -> Vec<SendWr<'static>> {
        (from..from + 8)
            .map(|wr| {
                let off = (wr as usize - 1) * 64;
                write(wr, &local, off, 64, remote.remote(off), wr % 4 == 0)
            })
            .collect()
    };
    // Not recording: nothing to tell.
    p.a.post_send(&wrs(1)).unwrap();
    poll_n(&p.cq_a, 2);
    assert!((0..8).all(|i| p.a.executed_at(i).is_none()));

    assert!(p.a.record_execution_times(true), "the soft NIC records");
    let posted = Instant::now();
    p.a.post_send(&wrs(9)).unwrap();
    let wcs = poll_n(&p.cq_a, 2);
    let learned = Instant::now();
    assert_eq!(
        statuses(&wcs),
        [(12, WcStatus::Success), (16, WcStatus::Success)]
    );
    let times: Vec<Instant> = (8..16)
        .map(|i| {
            p.a.executed_at(i)
                .unwrap_or_else(|| panic!("WR{} recorded", i + 1))
        })
        .collect();
    assert!(
        times.windows(2).all(|w| w[0] <= w[1]),
        "in order: {times:?}"
    );
    assert!(times.iter().all(|&t| posted <= t && t <= learned));
    assert_eq!(p.a.executed_at(16), None, "not posted");
    assert_eq!(p.a.executed_at(0), None, "executed while not recording");
    p.a.record_execution_times(false);
    assert!(
        p.a.executed_at(8).is_some(),
        "records stay until the slot is reused"
    );
}

/// An unsignaled WRITE of a kilobyte or more is stamped when it finishes, not at the end
/// of the group of work requests the NIC fetched with it: each 64 KiB WRITE of a run with
/// one signal has a time of its own, later than the one before (copying 64 KiB takes
/// microseconds). With one time for the group, the "learned later" gap of the first ones
/// was hidden.
#[test]
fn large_unsignaled_writes_are_stamped_when_each_finishes() {
    const LEN: usize = 64 << 10;
    let p = pair();
    let local = p.mr(16 * LEN, Access::LOCAL_WRITE);
    let remote = p.mr(16 * LEN, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    assert!(p.a.record_execution_times(true));
    let wrs: Vec<SendWr<'static>> = (0..16u64)
        .map(|i| {
            let off = i as usize * LEN;
            write(i + 1, &local, off, LEN as u32, remote.remote(off), i == 15)
        })
        .collect();
    let posted = Instant::now();
    p.a.post_send(&wrs).unwrap();
    assert_eq!(statuses(&poll_n(&p.cq_a, 1)), [(16, WcStatus::Success)]);
    let learned = Instant::now();
    let times: Vec<Instant> = (0..16).map(|i| p.a.executed_at(i).unwrap()).collect();
    assert!(
        times.windows(2).all(|w| w[0] < w[1]),
        "each WRITE stamped when it finished: {:?}",
        times.iter().map(|&t| t - posted).collect::<Vec<_>>()
    );
    assert!(posted <= times[0] && times[15] <= learned);
}

#[test]
fn adaptive_tick_on_a_full_queue_waits_for_room_instead_of_failing() {
    let p = pair_with(Personality::Mlx5, 8, 64, false);
    let remote = p.mr(8 * 64, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let (bufs, _) = Buffer::new(p.mr(8 * 64, Access::LOCAL_WRITE))
        .split_into(8, 64)
        .unwrap();
    let policy = Policy::Adaptive {
        max_unsignaled: 5,
        max_lag: Duration::from_millis(5),
    };
    let mut q: SignaledQueue<SoftDevice, u64> =
        SignaledQueue::new(p.a, Arc::clone(&p.cq_a), policy).unwrap();
    let mut works = bufs
        .into_iter()
        .enumerate()
        .map(|(i, b)| Work::write(b, remote.remote(i * 64), i as u64 + 1));
    assert_eq!(q.post_batch(&mut works).unwrap(), 8);
    // WR5 is signaled; WR6-WR8 are the unsignaled run, and the queue is full.
    assert_eq!((q.outstanding(), q.available()), (8, 0));
    std::thread::sleep(Duration::from_millis(10));
    assert!(q.next_deadline().is_some_and(|d| d <= Instant::now()));
    assert!(!q.tick().expect("no room for the marker yet: not an error"));
    let mut done = Vec::new();
    let start = Instant::now();
    while done.len() < 5 {
        q.poll(&mut done).unwrap();
        assert!(start.elapsed() < WAIT);
    }
    assert!(q.tick().unwrap(), "room now: the marker confirms WR6-WR8");
    while done.len() < 8 {
        q.poll(&mut done).unwrap();
        assert!(start.elapsed() < WAIT);
    }
    assert_eq!(
        done.iter().map(|c| c.user).collect::<Vec<_>>(),
        (1..=8).collect::<Vec<_>>()
    );
    assert_eq!(q.stats().markers, 1);
}

#[test]
fn a_queue_without_the_clock_measures_no_lag_and_refuses_the_adaptive_policy() {
    let p = pair();
    let remote = p.mr(8 * 64, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let (bufs, _) = Buffer::new(p.mr(8 * 64, Access::LOCAL_WRITE))
        .split_into(8, 64)
        .unwrap();
    let adaptive = QueueConfig {
        policy: "adaptive:4,10us".parse().unwrap(),
        measure_lag: false,
        ..QueueConfig::default()
    };
    let init = QpInit {
        caps: QpCaps::default(),
        sq_sig_all: false,
    };
    let qp = p.dev.create_qp(&p.pd, &p.cq_a, &p.cq_a, &init).unwrap();
    let refused = SignaledQueue::<SoftDevice, u64>::with_config(qp, Arc::clone(&p.cq_a), adaptive);
    assert!(matches!(
        refused.map_err(|e| e.error),
        Err(ConfigError::AdaptiveNeedsClock)
    ));

    let config = QueueConfig {
        policy: Policy::Every(4),
        measure_lag: false,
        ..QueueConfig::default()
    };
    let mut q: SignaledQueue<SoftDevice, u64> =
        SignaledQueue::with_config(p.a, Arc::clone(&p.cq_a), config).unwrap();
    let mut works = bufs
        .into_iter()
        .enumerate()
        .map(|(i, b)| Work::write(b, remote.remote(i * 64), i as u64 + 1));
    assert_eq!(q.post_batch(&mut works).unwrap(), 8);
    let mut done = Vec::new();
    let start = Instant::now();
    while done.len() < 8 {
        q.poll(&mut done).unwrap();
        assert!(start.elapsed() < WAIT);
    }
    let s = q.stats();
    assert_eq!((s.completed, s.cqes, s.signaled), (8, 2, 2));
    assert!(s.lag_ns.is_empty());
}

#[test]
fn a_region_the_host_cannot_allocate_is_an_error_not_an_abort() {
    // A device that would register 2^60 bytes: no host has them, and the allocation is
    // refused at once (nothing is touched), so reg_mr fails as ibv_reg_mr does (ENOMEM).
    let dev = SoftDevice::open(SoftConfig {
        max_mr_size: 1 << 61,
        ..SoftConfig::default()
    })
    .unwrap();
    let pd = dev.alloc_pd().unwrap();
    let err = dev
        .reg_mr(&pd, 1 << 60, Access::LOCAL_WRITE)
        .unwrap_err()
        .to_string();
    assert!(err.contains("register a memory region"), "{err}");
    // The device still works: the table was not touched.
    let mr = dev.reg_mr(&pd, 4096, Access::LOCAL_WRITE).unwrap();
    assert_eq!(mr.len(), 4096);
}

#[test]
fn a_device_refuses_a_depth_its_16_bit_wqe_counter_cannot_name() {
    let config = SoftConfig {
        max_qp_wr: (1 << 16) + 1,
        ..SoftConfig::default()
    };
    let err = SoftDevice::open(config).unwrap_err().to_string();
    assert!(err.contains("max_qp_wr"), "{err}");
    assert!(err.contains("65537"), "{err}");
}

#[test]
fn a_device_refuses_cqs_larger_than_it_can_hold() {
    // `create_cq(u32::MAX)` would round up past u32 (and past any memory): the device's
    // limit is bounded, and every size up to it works out.
    let err = SoftDevice::open(SoftConfig {
        max_cqe: u32::MAX,
        ..SoftConfig::default()
    })
    .unwrap_err()
    .to_string();
    assert!(err.contains("max_cqe"), "{err}");
    let dev = SoftDevice::open(SoftConfig::default()).unwrap();
    let err = dev.create_cq(u32::MAX).unwrap_err().to_string();
    assert!(err.contains("supports 1 to 4194303"), "{err}");
    // The largest CQ needs no larger ring than ConnectX's: 2^22 entries, one kept empty.
    let cq = dev.create_cq(selsig_soft::MAX_CQE).unwrap();
    assert_eq!(cq.capacity(), selsig_soft::MAX_CQE);
}

/// The deepest send queue on mlx5: a device of 2^16 64-byte blocks (the most a 16-bit WQE
/// counter names) gives a QP of 256-byte WQEs 2^14 slots (semantics 13). Completions free
/// slots correctly for laps past the counter's wrap, with up to the whole depth
/// outstanding.
#[test]
fn the_deepest_send_queue_frees_slots_through_the_counter_wrap() {
    let depth: u32 = 1 << 14;
    let dev = SoftDevice::open(SoftConfig {
        max_qp_wr: selsig_soft::MAX_QP_WR,
        ..SoftConfig::default()
    })
    .unwrap();
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(1024).unwrap();
    let init = depths(depth, 1);
    let a = dev.create_qp(&pd, &cq, &cq, &init).unwrap();
    let b = dev.create_qp(&pd, &cq, &cq, &init).unwrap();
    connect_pair(&a, &b, &ConnectOptions::default()).unwrap();
    assert_eq!(a.caps().max_send_wr, depth);
    let local = dev.reg_mr(&pd, 64, Access::LOCAL_WRITE).unwrap();
    let remote = dev
        .reg_mr(&pd, 64, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    // One more is refused.
    let deeper = dev
        .create_qp(&pd, &cq, &cq, &depths(depth + 1, 1))
        .unwrap_err();
    assert!(deeper.to_string().contains("max_send_wr"), "{deeper}");
    // Fill the whole queue, the last WRITE signaled: one more is refused until its
    // completion is polled; then the whole depth fits again, five laps over (the counter
    // wraps in the fifth).
    let mut wr_id = 0u64;
    let mut buf = [WorkCompletion::new(0, WcStatus::Success, 0); 4];
    for lap in 0..5 {
        let wrs: Vec<_> = (0..u64::from(depth))
            .map(|i| {
                wr_id += 1;
                write(
                    wr_id,
                    &local,
                    0,
                    8,
                    remote.remote(0),
                    i + 1 == u64::from(depth),
                )
            })
            .collect();
        a.post_send(&wrs)
            .unwrap_or_else(|e| panic!("lap {lap}: {e}"));
        let more = write(0, &local, 0, 8, remote.remote(0), true);
        assert!(a.post_send(&[more]).unwrap_err().is_full(), "lap {lap}");
        let start = Instant::now();
        let n = loop {
            let n = cq.poll(&mut buf).unwrap();
            if n > 0 {
                break n;
            }
            assert!(start.elapsed() < WAIT, "lap {lap}: no completion");
        };
        assert_eq!(n, 1);
        assert_eq!((buf[0].wr_id, buf[0].status), (wr_id, WcStatus::Success));
    }
}

/// Destroying a QP: mlx5's `ibv_destroy_qp` removes the QP's completions that were not
/// polled yet from its CQs (libmlx5 `mlx5_destroy_qp` → `__mlx5_cq_clean`); rxe's leaves
/// them. Either way the QP is gone for its peer: a WRITE to it exhausts its retries
/// (a count below 7: see `rxe_retries_forever_with_a_retry_count_of_7`).
#[test]
fn destroying_a_qp_removes_its_unpolled_completions_on_mlx5() {
    for personality in [Personality::Mlx5, Personality::Rxe] {
        let dev = SoftDevice::open(SoftConfig::with_personality(personality)).unwrap();
        let pd = dev.alloc_pd().unwrap();
        let shared = dev.create_cq(64).unwrap();
        let other = dev.create_cq(64).unwrap();
        let init = depths(16, 4);
        let a = dev.create_qp(&pd, &shared, &shared, &init).unwrap();
        let c = dev.create_qp(&pd, &shared, &shared, &init).unwrap();
        let b = dev.create_qp(&pd, &other, &other, &init).unwrap();
        let d = dev.create_qp(&pd, &other, &other, &init).unwrap();
        // A retry count below 7: rxe retries 7 forever.
        let options = ConnectOptions {
            retry_cnt: 6,
            ..ConnectOptions::default()
        };
        connect_pair(&a, &b, &options).unwrap();
        connect_pair(&c, &d, &options).unwrap();
        let local = dev.reg_mr(&pd, 64, Access::LOCAL_WRITE).unwrap();
        let remote = dev
            .reg_mr(&pd, 64, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
            .unwrap();
        assert!(a.record_execution_times(true) && c.record_execution_times(true));
        // One at a time, each run before the next is posted (each is timed just before its
        // completion is written, and the NIC writes that before it takes the next): the
        // shared CQ holds the two QPs' completions interleaved, none polled, so that
        // removing a's moves c's up past them.
        let start = Instant::now();
        for (qp, wr_id, index) in [
            (&a, 1, 0),
            (&c, 101, 0),
            (&a, 2, 1),
            (&c, 102, 1),
            (&a, 3, 2),
        ] {
            qp.post_send(&[write(wr_id, &local, 0, 8, remote.remote(0), true)])
                .unwrap();
            while qp.executed_at(index).is_none() {
                assert!(
                    start.elapsed() < WAIT,
                    "{personality:?}: WRITE {wr_id} did not run"
                );
                std::thread::yield_now();
            }
        }
        drop(a);
        std::thread::sleep(Duration::from_millis(30));
        let mut got = Vec::new();
        let mut buf = [WorkCompletion::new(0, WcStatus::Success, 0); 16];
        loop {
            let n = shared.poll(&mut buf).unwrap();
            if n == 0 {
                break;
            }
            got.extend(buf[..n].iter().map(|w| (w.wr_id, w.status)));
        }
        if personality == Personality::Rxe {
            let order: Vec<_> = got.iter().map(|(id, _)| *id).collect();
            assert_eq!(order, [1, 101, 2, 102, 3], "the order they ran in");
        }
        let of_c: Vec<_> = got.iter().filter(|(id, _)| *id > 100).copied().collect();
        let of_a: Vec<_> = got.iter().filter(|(id, _)| *id < 100).copied().collect();
        assert_eq!(
            of_c,
            [(101, WcStatus::Success), (102, WcStatus::Success)],
            "{personality:?}: the other QP's completions stay, in order"
        );
        match personality {
            Personality::Mlx5 => assert_eq!(of_a, [], "mlx5 removes the destroyed QP's"),
            Personality::Rxe => assert_eq!(
                of_a,
                [1, 2, 3].map(|id| (id, WcStatus::Success)),
                "rxe leaves them"
            ),
        }
        // The shared CQ goes on working, and so do the other QP's slots.
        for wr_id in 103..103 + 20 {
            c.post_send(&[write(wr_id, &local, 0, 8, remote.remote(0), true)])
                .unwrap();
            let wc = poll_n(&shared, 1);
            assert_eq!(statuses(&wc), [(wr_id, WcStatus::Success)]);
        }
        // The destroyed QP's peer finds no one listening.
        b.post_send(&[write(7, &local, 0, 8, remote.remote(0), true)])
            .unwrap();
        let wc = poll_n(&other, 1);
        assert_eq!(
            statuses(&wc),
            [(7, WcStatus::RetryExcErr)],
            "{personality:?}"
        );
        drop(d);
    }
}

/// On the mlx5 personality too, a message longer than the path MTU is taken one packet
/// at a time (any RC responder does: a SEND's length is known only at its last packet,
/// and only the last packet of a WRITE with immediate needs a receive): the packets that
/// fit are placed before the one that fails, and a WRITE with immediate waiting for a
/// receive has placed all but its last. mlx5 checks the key of a WRITE with immediate
/// before it looks for a receive whatever the length.
#[test]
fn mlx5_personality_places_a_message_packet_by_packet() {
    use QpState::{Err, Rts};
    use WcStatus::*;
    use support::rxe_errors::{Case, Seen};
    let dev = SoftDevice::open(SoftConfig::default()).unwrap();
    let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let base = Case {
        name: "",
        qp_access: all,
        local_access: Access::LOCAL_WRITE,
        opcode: Opcode::RdmaWriteWithImm,
        len: 8192,
        bad_rkey: false,
        recv: false,
        recv_len: 16,
        inbox_len: 16,
        inbox_access: Access::LOCAL_WRITE,
        mtu: 4096,
        remote_access: all,
    };
    // mlx5 raises IBV_EVENT_QP_ACCESS_ERR for the responder of a remote access error.
    let seen = |requester, a, b, responder: &[WcStatus], placed| Seen {
        requester,
        a,
        b,
        responder: responder.to_vec(),
        events: if a == Err && b == Err && requester == Some(RemAccessErr) {
            vec!["qp_access_err"]
        } else {
            Vec::new()
        },
        placed,
    };
    let cases = [
        (
            Case {
                name: "WRITE with immediate of two packets, no receive",
                ..base
            },
            seen(None, Rts, Rts, &[], 4096),
        ),
        (
            Case {
                name: "WRITE with immediate of 3000 bytes, path MTU 1024, no receive",
                len: 3000,
                mtu: 1024,
                ..base
            },
            seen(None, Rts, Rts, &[], 2048),
        ),
        (
            Case {
                name: "WRITE with immediate of one packet, no receive",
                len: 4096,
                ..base
            },
            seen(None, Rts, Rts, &[], 0),
        ),
        (
            Case {
                name: "WRITE with immediate of one packet, bad key, no receive",
                len: 16,
                bad_rkey: true,
                ..base
            },
            seen(Some(RemAccessErr), Err, Err, &[], 0),
        ),
        (
            Case {
                name: "WRITE with immediate of two packets, bad key, a receive",
                bad_rkey: true,
                recv: true,
                ..base
            },
            seen(Some(RemAccessErr), Err, Err, &[WrFlushErr], 0),
        ),
        (
            Case {
                name: "SEND of two packets into a receive of 5000 bytes",
                opcode: Opcode::Send,
                recv: true,
                recv_len: 5000,
                inbox_len: 5000,
                ..base
            },
            seen(Some(RemInvReqErr), Err, Err, &[LocLenErr], 4096),
        ),
        (
            Case {
                name: "SEND of two packets into a receive of 8192 bytes in a region of 5000",
                opcode: Opcode::Send,
                recv: true,
                recv_len: 8192,
                inbox_len: 5000,
                ..base
            },
            seen(Some(RemOpErr), Err, Err, &[LocProtErr], 4096),
        ),
    ];
    for (case, expected) in cases {
        let seen = support::rxe_errors::run(&dev, None, &case);
        assert_eq!(seen, expected, "{}", case.name);
    }
}

/// The rxe personality refuses, fails and overruns as the kernel's rxe does (the same
/// cases run on rxe0 in `selsig-verbs/tests/rxe.rs`).
#[test]
fn rxe_personality_fails_requests_as_rxe_does() {
    let dev = SoftDevice::open(SoftConfig::with_personality(Personality::Rxe)).unwrap();
    for (case, expected) in support::rxe_errors::cases() {
        let seen = support::rxe_errors::run(&dev, None, &case);
        assert_eq!(seen, expected, "{}", case.name);
    }
}

#[test]
fn rxe_personality_drops_the_completions_an_overrun_cq_has_no_room_for() {
    let dev = SoftDevice::open(SoftConfig::with_personality(Personality::Rxe)).unwrap();
    let seen = support::rxe_errors::overrun(&dev, None);
    assert_eq!(seen, support::rxe_errors::overrun_on_rxe());
}

/// rxe: a receive completion that finds its CQ full moves the responder to the error state
/// before it acknowledges the request, so the requester's retries run out
/// (`RETRY_EXC_ERR`, the rest flushed), or, at a retry count of 7, it waits for ever; the
/// completion is dropped with an `IBV_EVENT_CQ_ERR` (the soft NIC dropped it and went on,
/// as rxe does only with send completions). The same runner holds the real rxe0 to this
/// (`selsig-verbs/tests/rxe.rs`).
#[test]
fn rxe_personality_stops_a_responder_whose_receive_completion_finds_no_room() {
    use support::rxe_errors::ReceiveOverrun;
    let dev = SoftDevice::open(SoftConfig::with_personality(Personality::Rxe)).unwrap();
    let seen = support::rxe_errors::receive_overrun(&dev, None, 1, WAIT);
    // The responder's CQ, asked for 1 entry, holds 1.
    assert_eq!(seen, ReceiveOverrun::retries_run_out(1));
    let seen = support::rxe_errors::receive_overrun(&dev, None, 7, Duration::from_millis(300));
    assert_eq!(seen.sends, [(1, WcStatus::Success)]);
    assert_eq!(seen.responder, QpState::Err);
}

#[test]
fn a_qp_connected_while_the_nic_is_busy_runs_its_first_work_request() {
    // The NIC thread keeps a list of the QPs it serves, with their peers: a QP connected
    // while the thread is in a long pass over another QP must still find its peer.
    let dev = SoftDevice::open(SoftConfig::default()).unwrap();
    let pd = dev.alloc_pd().unwrap();
    let (busy_cq, cq) = (dev.create_cq(64).unwrap(), dev.create_cq(64).unwrap());
    // Created first: the NIC serves them before `a` in each pass.
    let x = dev
        .create_qp(&pd, &busy_cq, &busy_cq, &depths(16, 0))
        .unwrap();
    let y = dev
        .create_qp(&pd, &busy_cq, &busy_cq, &depths(16, 0))
        .unwrap();
    let a = dev.create_qp(&pd, &cq, &cq, &depths(16, 0)).unwrap();
    let b = dev.create_qp(&pd, &cq, &cq, &depths(16, 0)).unwrap();
    connect_pair(&x, &y, &ConnectOptions::default()).unwrap();
    const LEN: usize = 64 << 20;
    let src = dev.reg_mr(&pd, LEN, Access::LOCAL_WRITE).unwrap();
    let dst = dev
        .reg_mr(&pd, LEN, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    // Half a GiB to copy keeps the NIC thread in one pass over `x` for a while.
    let wrs: Vec<SendWr<'_>> = (0..8)
        .map(|i| SendWr {
            wr_id: i,
            opcode: Opcode::RdmaWrite,
            local: Local::Sge(src.sge(0, LEN as u32)),
            remote: dst.remote(0),
            imm_data: 0,
            signaled: i == 7,
        })
        .collect();
    // The NIC thread has taken its list of QPs, then starts copying.
    std::thread::sleep(Duration::from_millis(50));
    x.post_send(&wrs).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    connect_pair(&a, &b, &ConnectOptions::default()).unwrap();
    a.post_send(&[SendWr {
        wr_id: 1,
        opcode: Opcode::RdmaWrite,
        local: Local::Empty,
        remote: RemoteAddr::default(),
        imm_data: 0,
        signaled: true,
    }])
    .unwrap();
    assert_eq!(statuses(&poll_n(&cq, 1)), [(1, WcStatus::Success)]);
    assert_eq!(statuses(&poll_n(&busy_cq, 1)), [(7, WcStatus::Success)]);
}

#[test]
fn a_qp_in_the_reset_state_does_not_move_to_the_error_state() {
    // As the kernel's `ib_modify_qp_is_ok` (for mlx5 and rxe alike): RESET goes to INIT.
    for personality in [Personality::Mlx5, Personality::Rxe] {
        let dev = SoftDevice::open(SoftConfig::with_personality(personality)).unwrap();
        let pd = dev.alloc_pd().unwrap();
        let cq = dev.create_cq(8).unwrap();
        let a = dev.create_qp(&pd, &cq, &cq, &depths(4, 0)).unwrap();
        let b = dev.create_qp(&pd, &cq, &cq, &depths(4, 0)).unwrap();
        match a.to_error() {
            Err(selsig::ProviderError::Transition { from, to, .. }) => {
                assert_eq!(
                    (from, to),
                    (QpState::Reset, QpState::Err),
                    "{personality:?}"
                );
            }
            other => panic!("{personality:?}: {other:?}"),
        }
        assert_eq!(a.state(), QpState::Reset);
        connect_pair(&a, &b, &ConnectOptions::default()).unwrap();
        assert_eq!(a.state(), QpState::Rts);
    }
}

/// An access beyond a buffer is refused naming the buffer's bytes, not the region's.
#[test]
fn an_access_beyond_a_buffer_names_the_buffer() {
    let p = pair_with(Personality::Mlx5, 16, 64, false);
    let whole = Buffer::new(p.mr(4096, Access::LOCAL_WRITE));
    let (_, mut tail) = whole.split_at(1024).unwrap();
    assert_eq!(tail.len(), 3072);
    let e = tail.write(3000, &[0; 100]).unwrap_err().to_string();
    assert_eq!(
        e,
        "100 bytes at offset 3000 are outside the 3072 bytes of the region or buffer accessed"
    );
    tail.write(2972, &[1; 100]).unwrap();
}

// Paths no other test reached (found by mutating the NIC and seeing which changes every
// test let through): work after a completion rxe dropped, a finite RNR retry count, mlx5's
// WRITE with immediate and its receive, execution times around completions and RNR
// stalls, a responder in the error state.

fn rw() -> Access {
    Access::LOCAL_WRITE | Access::REMOTE_WRITE
}

/// A work request of any opcode, immediate data 0x77.
fn raw_wr(
    wr_id: u64,
    opcode: Opcode,
    local: Local<'static>,
    remote: RemoteAddr,
    signaled: bool,
) -> SendWr<'static> {
    SendWr {
        wr_id,
        opcode,
        local,
        remote,
        imm_data: 0x77,
        signaled,
    }
}

/// True if a completion shows up within `d` (the caller expects none: a stall).
fn any_within(cq: &SoftCq, d: Duration) -> Option<WorkCompletion> {
    let mut buf = [WorkCompletion::new(0, WcStatus::Success, 0); 1];
    let start = Instant::now();
    while start.elapsed() < d {
        if cq.poll(&mut buf).unwrap() > 0 {
            return Some(buf[0]);
        }
        std::thread::yield_now();
    }
    None
}

/// rxe drops the completion an
/// overrun CQ has no room for, and the QP goes on: the WRs after it still execute.
#[test]
fn rxe_work_after_a_dropped_completion_still_executes() {
    let p = pair_with(Personality::Rxe, 16, 2, false); // CQ holds 3
    assert_eq!(p.cq_a.capacity(), 3);
    let local = p.mr(8 * 8, Access::LOCAL_WRITE);
    let remote = p.mr(8 * 8, rw());
    local.fill(0, 64, 0xcd).unwrap();
    let wrs: Vec<_> = (0..8u64)
        .map(|i| {
            let off = i as usize * 8;
            raw_wr(
                i,
                Opcode::RdmaWrite,
                Local::Sge(local.sge(off, 8)),
                remote.remote(off),
                true,
            )
        })
        .collect();
    p.a.post_send(&wrs).unwrap();
    let start = Instant::now();
    let landed = || {
        let mut got = [0u8; 64];
        remote.read(0, &mut got).unwrap();
        got.chunks(8)
            .filter(|c| c.iter().all(|&b| b == 0xcd))
            .count()
    };
    while landed() < 8 {
        assert!(
            start.elapsed() < WAIT,
            "only {} of 8 WRITEs landed",
            landed()
        );
        std::thread::yield_now();
    }
    assert_eq!(
        statuses(&poll_n(&p.cq_a, 3)),
        (0..3).map(|i| (i, WcStatus::Success)).collect::<Vec<_>>()
    );
    assert_eq!(p.a.state(), QpState::Rts);
}

/// With rnr_retry < 7 a SEND that finds no
/// receive fails with IBV_WC_RNR_RETRY_EXC_ERR and the QP goes to the error state.
#[test]
fn a_send_without_a_receive_exhausts_a_finite_rnr_retry() {
    for personality in [Personality::Mlx5, Personality::Rxe] {
        let options = ConnectOptions {
            rnr_retry: 0,
            ..ConnectOptions::default()
        };
        let p = pair_connected(personality, 16, 16, false, &options);
        p.a.post_send(&[raw_wr(
            1,
            Opcode::Send,
            Local::Empty,
            RemoteAddr::default(),
            true,
        )])
        .unwrap();
        assert_eq!(
            statuses(&poll_n(&p.cq_a, 1)),
            [(1, WcStatus::RnrRetryExcErr)],
            "{personality}"
        );
        assert_eq!(p.a.state(), QpState::Err, "{personality}");
    }
}

/// A WRITE with immediate needs
/// a receive on the responder: without one it waits (rnr_retry 7), and then consumes it.
#[test]
fn mlx5_write_with_imm_waits_for_a_receive_and_consumes_it() {
    let p = pair_with(Personality::Mlx5, 16, 16, false);
    let remote = p.mr(64, rw());
    p.a.post_send(&[raw_wr(
        1,
        Opcode::RdmaWriteWithImm,
        Local::Inline(b"abcd"),
        remote.remote(0),
        true,
    )])
    .unwrap();
    assert_eq!(
        any_within(&p.cq_a, Duration::from_millis(200)),
        None,
        "ran without a receive"
    );
    let mut got = [0u8; 4];
    remote.read(0, &mut got).unwrap();
    assert_eq!(got, [0; 4], "landed without a receive");
    p.b.post_recv(&[RecvWr {
        wr_id: 9,
        sge: None,
    }])
    .unwrap();
    assert_eq!(statuses(&poll_n(&p.cq_a, 1)), [(1, WcStatus::Success)]);
    let r = poll_n(&p.cq_b, 1)[0];
    assert_eq!(
        (r.wr_id, r.status, r.opcode, r.imm_data),
        (
            9,
            WcStatus::Success,
            Some(WcOpcode::RecvRdmaWithImm),
            Some(0x77)
        )
    );
}

/// mlx5 checks the
/// rkey first: a bad key fails at once even with no receive posted, and a posted receive
/// is not consumed by the failed WRITE: it is flushed when the responder goes to error.
#[test]
fn mlx5_write_with_imm_and_a_bad_key_fails_before_taking_a_receive() {
    for receive_posted in [false, true] {
        let p = pair_with(Personality::Mlx5, 16, 16, false);
        let remote = p.mr(64, rw());
        let mut bad = remote.remote(0);
        bad.rkey ^= 0x5a5;
        if receive_posted {
            p.b.post_recv(&[RecvWr {
                wr_id: 9,
                sge: None,
            }])
            .unwrap();
        }
        p.a.post_send(&[raw_wr(
            1,
            Opcode::RdmaWriteWithImm,
            Local::Inline(b"abcd"),
            bad,
            true,
        )])
        .unwrap();
        // No receive needed to fail.
        assert_eq!(
            statuses(&poll_n(&p.cq_a, 1)),
            [(1, WcStatus::RemAccessErr)],
            "a receive posted: {receive_posted}"
        );
        if receive_posted {
            assert_eq!(
                statuses(&poll_n(&p.cq_b, 1)),
                [(9, WcStatus::WrFlushErr)],
                "the receive is flushed, not failed"
            );
        }
    }
}

/// Unsignaled WRs after the last
/// completion of a fetch group get a time too.
#[test]
fn unsignaled_wrs_after_the_last_completion_of_a_group_are_stamped() {
    let p = pair_with(Personality::Mlx5, 16, 16, false);
    let local = p.mr(64, Access::LOCAL_WRITE);
    let remote = p.mr(64, rw());
    assert!(p.a.record_execution_times(true));
    let wrs: Vec<_> = (0..4u64)
        .map(|i| {
            raw_wr(
                i,
                Opcode::RdmaWrite,
                Local::Sge(local.sge(0, 8)),
                remote.remote(0),
                i == 0,
            )
        })
        .collect();
    p.a.post_send(&wrs).unwrap();
    assert_eq!(statuses(&poll_n(&p.cq_a, 1)), [(0, WcStatus::Success)]);
    // A later signaled WR: once it completes, WRs 1..3 have executed.
    p.a.post_send(&[raw_wr(
        4,
        Opcode::RdmaWrite,
        Local::Empty,
        RemoteAddr::default(),
        true,
    )])
    .unwrap();
    assert_eq!(statuses(&poll_n(&p.cq_a, 1)), [(4, WcStatus::Success)]);
    for i in 0..5 {
        assert!(p.a.executed_at(i).is_some(), "WR{i} has no execution time");
    }
}

/// WRs executed before a SEND that
/// waits for a receive get their time when the NIC stops at the SEND.
#[test]
fn wrs_executed_before_an_rnr_stall_are_stamped() {
    let p = pair_with(Personality::Mlx5, 16, 16, false);
    let local = p.mr(64, Access::LOCAL_WRITE);
    let remote = p.mr(64, rw());
    assert!(p.a.record_execution_times(true));
    p.a.post_send(&[
        raw_wr(
            0,
            Opcode::RdmaWrite,
            Local::Sge(local.sge(0, 8)),
            remote.remote(0),
            false,
        ),
        raw_wr(
            1,
            Opcode::RdmaWrite,
            Local::Sge(local.sge(8, 8)),
            remote.remote(8),
            false,
        ),
        raw_wr(2, Opcode::Send, Local::Empty, RemoteAddr::default(), true),
    ])
    .unwrap();
    assert_eq!(
        any_within(&p.cq_a, Duration::from_millis(50)),
        None,
        "the SEND waits"
    );
    p.b.post_recv(&[RecvWr {
        wr_id: 9,
        sge: None,
    }])
    .unwrap();
    assert_eq!(statuses(&poll_n(&p.cq_a, 1)), [(2, WcStatus::Success)]);
    for i in 0..3 {
        assert!(p.a.executed_at(i).is_some(), "WR{i} has no execution time");
    }
    assert!(p.a.executed_at(0).unwrap() <= p.a.executed_at(2).unwrap());
}

/// A responder in
/// the error state does not answer: the requester's retries run out and nothing lands.
#[test]
fn a_responder_in_the_error_state_does_not_answer() {
    let p = pair_with(Personality::Mlx5, 16, 16, false);
    let local = p.mr(64, Access::LOCAL_WRITE);
    let remote = p.mr(64, rw());
    local.fill(0, 8, 0xee).unwrap();
    p.b.to_error().unwrap();
    p.a.post_send(&[raw_wr(
        1,
        Opcode::RdmaWrite,
        Local::Sge(local.sge(0, 8)),
        remote.remote(0),
        true,
    )])
    .unwrap();
    assert_eq!(statuses(&poll_n(&p.cq_a, 1)), [(1, WcStatus::RetryExcErr)]);
    let mut got = [0u8; 8];
    remote.read(0, &mut got).unwrap();
    assert_eq!(got, [0; 8]);
}

/// rxe never counts down a transport retry count of 7 (`rxe_comp.c`): WRITEs to a
/// responder that does not answer wait, the QP in RTS, until the application moves it to
/// the error state, which flushes them. With a retry count below 7, and on mlx5 (where 7 is
/// a count), the retries run out. The same runner holds the real rxe0 to this
/// (`selsig-verbs/tests/rxe.rs`).
#[test]
fn rxe_retries_forever_with_a_retry_count_of_7() {
    use support::rxe_errors::Unanswered;
    let forever = Unanswered::retrying_forever();
    let run_out = Unanswered::retries_run_out();
    for (personality, retry_cnt, expected) in [
        (Personality::Rxe, 7, &forever),
        (Personality::Rxe, 6, &run_out),
        (Personality::Mlx5, 7, &run_out),
    ] {
        let dev = SoftDevice::open(SoftConfig::with_personality(personality)).unwrap();
        // Nothing may come in 300 ms when rxe retries forever; when the retries run out,
        // the completions are waited for (at most 10 s: a loaded machine runs late).
        let patience = match expected.waiting.is_empty() {
            true => Duration::from_millis(300),
            false => WAIT,
        };
        let seen = support::rxe_errors::unanswered(&dev, None, retry_cnt, patience);
        assert_eq!(&seen, expected, "{personality}, retry_cnt {retry_cnt}");
    }
}

/// The NIC thread takes QPs created and destroyed as they come (not the whole list again at
/// each change, nor only once a pass over all of them is done): among 150 connected pairs
/// whose every other pair is destroyed while the rest write, each pair left, and one
/// created after the destroys, is served, and its WRITE lands.
#[test]
fn qps_created_and_destroyed_among_many_are_served_as_they_come() {
    const PAIRS: usize = 150;
    let dev = SoftDevice::open(SoftConfig::default()).unwrap();
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(4096).unwrap();
    let other = dev.create_cq(4096).unwrap();
    let init = depths(4, 1);
    let local = dev
        .reg_mr(&pd, 8 * (PAIRS + 1), Access::LOCAL_WRITE)
        .unwrap();
    let remote = dev
        .reg_mr(
            &pd,
            8 * (PAIRS + 1),
            Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        )
        .unwrap();
    for i in 0..=PAIRS {
        local.write(8 * i, &pattern(i as u64, 8)).unwrap();
    }
    let pair = |i: usize| {
        let a = dev.create_qp(&pd, &cq, &other, &init).unwrap();
        let b = dev.create_qp(&pd, &other, &other, &init).unwrap();
        connect_pair(&a, &b, &ConnectOptions::default()).unwrap();
        (i, a, b)
    };
    let mut pairs: Vec<_> = (0..PAIRS).map(pair).collect();
    let mut posted = Vec::new();
    // Destroys among the posts: each destroy waits until the NIC no longer serves its QPs.
    pairs.retain(|(i, a, _)| {
        if i % 2 == 1 {
            return false;
        }
        let wr = write(*i as u64, &local, 8 * i, 8, remote.remote(8 * *i), true);
        a.post_send(&[wr]).unwrap();
        posted.push(*i as u64);
        true
    });
    let (last, a, b) = pair(PAIRS);
    let wr = write(
        last as u64,
        &local,
        8 * last,
        8,
        remote.remote(8 * last),
        true,
    );
    a.post_send(&[wr]).unwrap();
    posted.push(last as u64);
    pairs.push((last, a, b));
    let mut done: Vec<u64> = poll_n(&cq, posted.len())
        .iter()
        .map(|wc| {
            assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
            wc.wr_id
        })
        .collect();
    done.sort_unstable();
    assert_eq!(done, posted);
    for &i in &posted {
        let mut got = [0u8; 8];
        remote.read(8 * i as usize, &mut got).unwrap();
        assert_eq!(got.to_vec(), pattern(i, 8), "pair {i}");
    }
    assert_no_more(&cq);
}
