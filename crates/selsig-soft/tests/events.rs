//! Completion events on the software NIC, as verbs gives them (docs/semantics.md,
//! "Completion events"): one event per arm, made by a completion added after the arm; the
//! waiter that arms and polls again never sleeps through a completion; and
//! `SignaledQueue::wait_with` retires the seed story and the bad-rkey story without a
//! busy poll.

use std::sync::Arc;
use std::time::{Duration, Instant};

use selsig::{
    Access, Buffer, CompletionQueue, ConnectOptions, Device, Local, MemoryRegion, Opcode, Outcome,
    Policy, QpCaps, QpInit, QueuePair, RemoteAddr, SendWr, SignaledQueue, WcStatus, Work,
    WorkCompletion, connect_pair,
};
use selsig_soft::{SoftConfig, SoftCq, SoftDevice, SoftMr, SoftPd, SoftQp};

struct Pair {
    dev: SoftDevice,
    pd: SoftPd,
    a: SoftQp,
    _b: SoftQp,
    cq: Arc<SoftCq>,
}

fn pair() -> Pair {
    let dev = SoftDevice::open(SoftConfig::default()).unwrap();
    let pd = dev.alloc_pd().unwrap();
    let cq = Arc::new(dev.create_cq(64).unwrap());
    let cq_b = dev.create_cq(64).unwrap();
    let init = QpInit {
        caps: QpCaps {
            max_send_wr: 16,
            max_recv_wr: 1,
            ..QpCaps::default()
        },
        sq_sig_all: false,
    };
    let a = dev.create_qp(&pd, &cq, &cq, &init).unwrap();
    let b = dev.create_qp(&pd, &cq_b, &cq_b, &init).unwrap();
    connect_pair(&a, &b, &ConnectOptions::default()).unwrap();
    Pair {
        dev,
        pd,
        a,
        _b: b,
        cq,
    }
}

impl Pair {
    fn regions(&self) -> (SoftMr, SoftMr) {
        let local = self.dev.reg_mr(&self.pd, 512, Access::LOCAL_WRITE).unwrap();
        let remote = self
            .dev
            .reg_mr(&self.pd, 512, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
            .unwrap();
        (local, remote)
    }
}

fn signaled_write(wr_id: u64, local: &SoftMr, remote: RemoteAddr) -> SendWr<'static> {
    SendWr {
        wr_id,
        opcode: Opcode::RdmaWrite,
        local: Local::Sge(local.sge(0, 8)),
        remote,
        imm_data: 0,
        signaled: true,
    }
}

fn poll_all(cq: &SoftCq) -> Vec<WorkCompletion> {
    let mut buf = [WorkCompletion::new(0, WcStatus::Success, 0); 16];
    let n = cq.poll(&mut buf).unwrap();
    buf[..n].to_vec()
}

#[test]
fn an_armed_cq_wakes_its_waiter_for_a_completion() {
    let p = pair();
    let (local, remote) = p.regions();
    p.cq.req_notify().unwrap();
    let cq = Arc::clone(&p.cq);
    let waiter = std::thread::spawn(move || cq.wait_event(Some(Duration::from_secs(10))));
    std::thread::sleep(Duration::from_millis(20));
    p.a.post_send(&[signaled_write(1, &local, remote.remote(0))])
        .unwrap();
    assert_eq!(waiter.join().unwrap().unwrap(), 1, "one event");
    assert_eq!(poll_all(&p.cq).len(), 1, "and its completion");
}

/// The classic race: the completion lands after the arm and before the sleep. The event
/// is pending, so the wait returns at once.
#[test]
fn a_completion_between_the_arm_and_the_sleep_still_wakes() {
    let p = pair();
    let (local, remote) = p.regions();
    assert!(poll_all(&p.cq).is_empty());
    p.cq.req_notify().unwrap();
    p.a.post_send(&[signaled_write(1, &local, remote.remote(0))])
        .unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let start = Instant::now();
    assert_eq!(p.cq.wait_event(Some(Duration::from_secs(5))).unwrap(), 1);
    assert!(start.elapsed() < Duration::from_secs(1), "woke at once");
}

#[test]
fn one_event_per_arm_and_none_unarmed() {
    let p = pair();
    let (local, remote) = p.regions();
    // Not armed: a completion makes no event.
    p.a.post_send(&[signaled_write(1, &local, remote.remote(0))])
        .unwrap();
    std::thread::sleep(Duration::from_millis(30));
    assert_eq!(p.cq.take_events().unwrap(), 0);
    assert_eq!(poll_all(&p.cq).len(), 1);
    // Armed once, two completions: one event.
    p.cq.req_notify().unwrap();
    for wr in 2..=3 {
        p.a.post_send(&[signaled_write(wr, &local, remote.remote(0))])
            .unwrap();
        std::thread::sleep(Duration::from_millis(30));
    }
    assert_eq!(p.cq.take_events().unwrap(), 1);
    assert_eq!(p.cq.take_events().unwrap(), 0);
    assert_eq!(poll_all(&p.cq).len(), 2);
}

#[test]
fn a_wait_with_nothing_coming_ends_at_its_timeout() {
    let p = pair();
    p.cq.req_notify().unwrap();
    let start = Instant::now();
    assert_eq!(p.cq.wait_event(Some(Duration::from_millis(50))).unwrap(), 0);
    assert!(start.elapsed() >= Duration::from_millis(50));
}

fn eight_buffers(p: &Pair) -> (Vec<Buffer<SoftMr>>, SoftMr) {
    let (local, remote) = p.regions();
    let (bufs, _) = Buffer::new(local).split_into(8, 64).ok().unwrap();
    (bufs, remote)
}

/// Waits with `wait_with` until everything posted is retired.
fn wait_all(q: &mut SignaledQueue<SoftDevice, u64>) -> Vec<(u64, Outcome)> {
    let mut done = Vec::new();
    let start = Instant::now();
    while q.outstanding() > 0 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "retired {done:?}"
        );
        q.wait_with(Duration::from_secs(5), |c| {
            assert!(c.buffer.is_some(), "the buffer comes back");
            done.push((c.user, c.outcome));
        })
        .unwrap();
    }
    done
}

/// The seed story: 8 WRITEs, every 4th signaled; `wait_with` hands back all 8, in order.
#[test]
fn the_seed_story_retires_through_wait_with() {
    let p = pair();
    let (bufs, remote) = eight_buffers(&p);
    let mut q = SignaledQueue::new(p.a, Arc::clone(&p.cq), Policy::Every(4)).unwrap();
    for (i, buf) in bufs.into_iter().enumerate() {
        q.post(Work::write(buf, remote.remote(i * 64), i as u64 + 1))
            .unwrap();
    }
    let expected: Vec<_> = (1..=8).map(|u| (u, Outcome::Completed)).collect();
    assert_eq!(wait_all(&mut q), expected);
    assert_eq!(q.stats().success_cqes, 2, "CQE4 and CQE8 only");
}

/// The bad-rkey story: WR3 fails, 4 to 8 are flushed, each with its own outcome.
#[test]
fn an_error_and_its_flushes_retire_through_wait_with() {
    let p = pair();
    let (bufs, remote) = eight_buffers(&p);
    let mut q = SignaledQueue::new(p.a, Arc::clone(&p.cq), Policy::Every(8)).unwrap();
    for (i, buf) in bufs.into_iter().enumerate() {
        let mut target = remote.remote(i * 64);
        if i == 2 {
            target.rkey = target.rkey.wrapping_add(1);
        }
        q.post(Work::write(buf, target, i as u64 + 1)).unwrap();
    }
    let mut expected = vec![
        (1, Outcome::Completed),
        (2, Outcome::Completed),
        (3, Outcome::Failed(WcStatus::RemAccessErr)),
    ];
    expected.extend((4..=8).map(|u| (u, Outcome::Flushed)));
    assert_eq!(wait_all(&mut q), expected);
}

/// An unsignaled tail: `wait_with` wakes at the `Adaptive` deadline (returning 0) for the
/// caller to `tick`, rather than sleeping through it.
#[test]
fn wait_with_wakes_for_the_adaptive_deadline() {
    let p = pair();
    let (bufs, remote) = eight_buffers(&p);
    let policy = Policy::Adaptive {
        max_unsignaled: 64,
        max_lag: Duration::from_millis(40),
    };
    let mut q: SignaledQueue<SoftDevice, u64> =
        SignaledQueue::new(p.a, Arc::clone(&p.cq), policy).unwrap();
    let mut bufs = bufs.into_iter();
    q.post(Work::write(bufs.next().unwrap(), remote.remote(0), 1))
        .unwrap();
    let start = Instant::now();
    assert_eq!(q.wait_with(Duration::from_secs(5), drop).unwrap(), 0);
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_millis(35) && waited < Duration::from_secs(4),
        "woke at the deadline, after {waited:?}"
    );
    assert!(q.tick().unwrap(), "the tick confirms the tail");
    let mut done = Vec::new();
    q.wait_with(Duration::from_secs(5), |c| done.push(c.user))
        .unwrap();
    assert_eq!(done, [1]);
}
