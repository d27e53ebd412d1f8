//! Atomics on the software NIC (docs/semantics.md, fact 41): fetch-and-add and
//! compare-and-swap operate on the remote 8 bytes as one atomic word, their value before
//! lands in the local 8 bytes; what each personality refuses, and how.

use std::sync::Arc;
use std::thread;

use selsig::{
    Access, AsyncEvent, Buffer, CompletionQueue, ConnectOptions, Device, Local, MemoryRegion,
    Opcode, Outcome, Policy, PostFailure, QpCaps, QpInit, QpState, QueuePair, SendWr,
    SignaledQueue, WcOpcode, WcStatus, Work, WorkCompletion, connect_pair,
};
use selsig_soft::{Personality, SoftConfig, SoftCq, SoftDevice, SoftMr, SoftPd, SoftQp};

const ATOMIC: Access = Access::LOCAL_WRITE
    .union(Access::REMOTE_WRITE)
    .union(Access::REMOTE_READ)
    .union(Access::REMOTE_ATOMIC);

fn init(depth: u32) -> QpInit {
    QpInit {
        caps: QpCaps {
            max_send_wr: depth,
            max_recv_wr: 1,
            ..QpCaps::default()
        },
        sq_sig_all: false,
    }
}

/// A requester QP on its own CQ, connected to a responder that allows `access`.
fn requester(dev: &SoftDevice, pd: &SoftPd, depth: u32, access: Access) -> (SoftQp, Arc<SoftCq>) {
    let cq = Arc::new(dev.create_cq(2 * depth + 2).unwrap());
    let cq_b = dev.create_cq(4).unwrap();
    let a = dev.create_qp(pd, &cq, &cq, &init(depth)).unwrap();
    let b = dev.create_qp(pd, &cq_b, &cq_b, &init(depth)).unwrap();
    let options = ConnectOptions {
        access,
        ..ConnectOptions::default()
    };
    connect_pair(&a, &b, &options).unwrap();
    // The responder and its CQ live as long as the test.
    std::mem::forget((b, cq_b));
    (a, cq)
}

fn counter(mr: &SoftMr, at: usize) -> u64 {
    let mut b = [0u8; 8];
    mr.read(at, &mut b).unwrap();
    u64::from_ne_bytes(b)
}

/// Two queue pairs, one thread each, add 1 to one counter 2000 times each: the counter
/// ends at 4000, and the values handed back are 0 to 3999, each once.
#[test]
fn fetch_and_add_from_two_queue_pairs_counts_every_increment_once() {
    const EACH: u64 = 2000;
    let dev = SoftDevice::open(SoftConfig::default()).unwrap();
    let pd = dev.alloc_pd().unwrap();
    let target = dev.reg_mr(&pd, 64, ATOMIC).unwrap();
    let remote = target.remote(8);
    let mut seen: Vec<u64> = thread::scope(|s| {
        let workers: Vec<_> = (0..2)
            .map(|_| {
                let (qp, cq) = requester(&dev, &pd, 64, ATOMIC);
                let results = dev.reg_mr(&pd, 8 * 64, Access::LOCAL_WRITE).unwrap();
                s.spawn(move || {
                    let mut q: SignaledQueue<SoftDevice, u64> =
                        SignaledQueue::new(qp, cq, Policy::Every(16)).unwrap();
                    let (bufs, _) = Buffer::new(results).split_into(64, 8).ok().unwrap();
                    let mut free = bufs;
                    let mut got = Vec::new();
                    let mut posted = 0;
                    while got.len() < EACH as usize {
                        while posted < EACH {
                            let Some(buf) = free.pop() else { break };
                            q.post(Work::fetch_add(buf, remote, 1, posted)).unwrap();
                            posted += 1;
                        }
                        if posted == EACH {
                            q.confirm_all().unwrap();
                        }
                        q.poll_with(|c| {
                            assert_eq!(c.outcome, Outcome::Completed);
                            let buf = c.buffer.expect("the buffer comes back");
                            let mut b = [0u8; 8];
                            buf.read(0, &mut b).unwrap();
                            got.push(u64::from_ne_bytes(b));
                            free.push(buf);
                        })
                        .unwrap();
                    }
                    got
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().unwrap())
            .collect()
    });
    assert_eq!(counter(&target, 8), 2 * EACH);
    seen.sort_unstable();
    assert_eq!(seen, (0..2 * EACH).collect::<Vec<_>>());
    assert_eq!(counter(&target, 0), 0, "the bytes around are untouched");
    assert_eq!(counter(&target, 16), 0, "the bytes around are untouched");
}

/// A signaled atomic of `a`, polled: its completion.
fn one(
    qp: &SoftQp,
    cq: &SoftCq,
    opcode: Opcode,
    local: Local<'_>,
    remote: selsig::RemoteAddr,
) -> WorkCompletion {
    qp.post_send(&[SendWr {
        wr_id: 9,
        opcode,
        local,
        remote,
        imm_data: 0,
        signaled: true,
    }])
    .unwrap();
    let mut buf = [WorkCompletion::new(0, WcStatus::Success, 0); 2];
    let start = std::time::Instant::now();
    loop {
        if cq.poll(&mut buf).unwrap() == 1 {
            return buf[0];
        }
        assert!(start.elapsed() < std::time::Duration::from_secs(10));
        thread::yield_now();
    }
}

/// Compare-and-swap swaps only when the remote value matches, and hands the value before
/// back either way, with the completion's opcode.
#[test]
fn compare_and_swap_swaps_only_on_a_match() {
    for personality in [Personality::Mlx5, Personality::Rxe] {
        let dev = SoftDevice::with_personality(personality).unwrap();
        let pd = dev.alloc_pd().unwrap();
        let (a, cq) = requester(&dev, &pd, 8, ATOMIC);
        let target = dev.reg_mr(&pd, 8, ATOMIC).unwrap();
        target.write(0, &5u64.to_ne_bytes()).unwrap();
        let local = dev.reg_mr(&pd, 8, Access::LOCAL_WRITE).unwrap();
        let swap = |compare| Opcode::AtomicCmpSwp { compare, swap: 9 };
        let wc = one(
            &a,
            &cq,
            swap(4),
            Local::Sge(local.sge(0, 8)),
            target.remote(0),
        );
        assert_eq!(
            (wc.status, wc.opcode),
            (WcStatus::Success, Some(WcOpcode::CompSwap))
        );
        assert_eq!(
            (counter(&local, 0), counter(&target, 0)),
            (5, 5),
            "no match"
        );
        let wc = one(
            &a,
            &cq,
            swap(5),
            Local::Sge(local.sge(0, 8)),
            target.remote(0),
        );
        assert_eq!(wc.status, WcStatus::Success);
        assert_eq!((counter(&local, 0), counter(&target, 0)), (5, 9), "a match");
        let add = Opcode::AtomicFetchAdd { add: u64::MAX };
        let wc = one(&a, &cq, add, Local::Sge(local.sge(0, 8)), target.remote(0));
        assert_eq!(wc.opcode, Some(WcOpcode::FetchAdd));
        assert_eq!(
            (counter(&local, 0), counter(&target, 0)),
            (9, 8),
            "wrapping add"
        );
    }
}

/// What both personalities refuse at the post, and what rxe alone refuses there (its
/// provider's `validate_send_wr`): a misaligned remote address, which mlx5 leaves to the
/// responder (an invalid request: IBTA 9.4.5).
#[test]
fn atomics_are_refused_at_the_post_as_each_provider_refuses_them() {
    for personality in [Personality::Mlx5, Personality::Rxe] {
        let dev = SoftDevice::with_personality(personality).unwrap();
        let pd = dev.alloc_pd().unwrap();
        let (a, cq) = requester(&dev, &pd, 8, ATOMIC);
        let target = dev.reg_mr(&pd, 16, ATOMIC).unwrap();
        let local = dev.reg_mr(&pd, 8, Access::LOCAL_WRITE).unwrap();
        let add = Opcode::AtomicFetchAdd { add: 1 };
        let post = |local, remote| {
            a.post_send(&[SendWr {
                wr_id: 1,
                opcode: add,
                local,
                remote,
                imm_data: 0,
                signaled: true,
            }])
            .map_err(|e| e.failure)
        };
        assert_eq!(
            post(Local::Inline(&[0; 8]), target.remote(0)),
            Err(PostFailure::Invalid("an atomic operation cannot be inline"))
        );
        assert_eq!(
            post(Local::Sge(local.sge(0, 4)), target.remote(0)),
            Err(PostFailure::Invalid(
                "an atomic operation needs 8 bytes of local memory"
            ))
        );
        let misaligned = post(Local::Sge(local.sge(0, 8)), target.remote(4));
        if personality == Personality::Rxe {
            assert_eq!(
                misaligned,
                Err(PostFailure::Invalid(
                    "an atomic operation's remote address must be 8-byte aligned (rxe)"
                ))
            );
            continue;
        }
        misaligned.unwrap();
        let mut buf = [WorkCompletion::new(0, WcStatus::Success, 0); 2];
        while cq.poll(&mut buf).unwrap() == 0 {
            thread::yield_now();
        }
        assert_eq!(
            buf[0].status,
            WcStatus::RemInvReqErr,
            "mlx5: the responder's"
        );
        assert_eq!(counter(&target, 0), 0);
    }
}

/// mlx5: a responder QP without remote atomic is a remote access error with
/// `IBV_EVENT_QP_ACCESS_ERR` (as for a READ); local bytes that cannot be written fail the
/// atomic before it is sent, the remote value untouched (rxe does the remote operation
/// first: `selsig_testkit::rxe_errors`).
#[test]
fn mlx5_fails_atomics_as_it_fails_reads() {
    let dev = SoftDevice::open(SoftConfig::default()).unwrap();
    let pd = dev.alloc_pd().unwrap();
    let target = dev.reg_mr(&pd, 8, ATOMIC).unwrap();
    let add = Opcode::AtomicFetchAdd { add: 1 };
    let no_atomic = ATOMIC.difference(Access::REMOTE_ATOMIC);
    let (a, cq) = requester(&dev, &pd, 8, no_atomic);
    let local = dev.reg_mr(&pd, 8, Access::LOCAL_WRITE).unwrap();
    let wc = one(&a, &cq, add, Local::Sge(local.sge(0, 8)), target.remote(0));
    assert_eq!(wc.status, WcStatus::RemAccessErr);
    assert_eq!(a.state(), QpState::Err);
    assert!(matches!(
        dev.poll_async_event(),
        Some(AsyncEvent::QpAccessErr { .. })
    ));
    let (a, cq) = requester(&dev, &pd, 8, ATOMIC);
    let read_only = dev.reg_mr(&pd, 8, Access::empty()).unwrap();
    let wc = one(
        &a,
        &cq,
        add,
        Local::Sge(read_only.sge(0, 8)),
        target.remote(0),
    );
    assert_eq!(wc.status, WcStatus::LocProtErr);
    assert_eq!(counter(&target, 0), 0, "mlx5 checks the local bytes first");
}
