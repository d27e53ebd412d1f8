//! A lost device (docs/semantics.md, fact 38): after a fatal error a ConnectX makes no
//! completion for a user-space QP's outstanding work, not even a flush, and no completion
//! event; only `IBV_EVENT_DEVICE_FATAL` says so. The queue must hand every outstanding work
//! request back as `DeviceLost`, after what the CQ already held, and never hang.

use std::sync::Arc;
use std::time::{Duration, Instant};

use selsig::{
    AsyncEvent, Buffer, CompletionQueue, Device, Outcome, Policy, PostError, QueuePostError,
    QueueState, SignaledQueue, Work,
};
use selsig_soft::{SoftConfig, SoftCq, SoftDevice, SoftMr};
use selsig_testkit::write_pair::write_pair;

struct Story {
    dev: SoftDevice,
    cq: Arc<SoftCq>,
    queue: SignaledQueue<SoftDevice, u64>,
    spare: Buffer<SoftMr>,
}

/// WRITEs 1-4 (4 signaled: every 4th), then SENDs 5-8 that the peer, with no receive
/// posted, answers RNR for ever (`rnr_retry` 7): 5-8 stay outstanding until something
/// ends them. `armed`: the CQ is armed before the posts.
fn story(armed: bool) -> Story {
    let p = write_pair(SoftDevice::open(SoftConfig::default()).unwrap(), 16, 64);
    // The peer lives as long as the test.
    std::mem::forget((p.b, p.recv));
    let mut bufs = p.free.into_iter();
    if armed {
        p.cq.req_notify().unwrap();
    }
    let mut queue = SignaledQueue::new(p.a, Arc::clone(&p.cq), Policy::Every(4)).unwrap();
    for i in 0..4 {
        let buf = bufs.next().unwrap();
        queue
            .post(Work::write(buf, p.target.offset(i * 64), i + 1))
            .unwrap();
    }
    for i in 4..8 {
        queue.post(Work::send(bufs.next().unwrap(), i + 1)).unwrap();
    }
    std::mem::forget(p.remote);
    Story {
        dev: p.dev,
        cq: p.cq,
        queue,
        spare: bufs.next().unwrap(),
    }
}

fn lost(range: std::ops::RangeInclusive<u64>) -> Vec<(u64, Outcome)> {
    range.map(|u| (u, Outcome::DeviceLost)).collect()
}

/// `wait_with` sleeping on a CQ that will make no event wakes within its device check
/// (100 ms) and hands back the stalled SENDs as `DeviceLost`; then nothing more is taken,
/// a drain ends at once, and the device's asynchronous event says `device_fatal`.
#[test]
fn a_waiter_learns_of_a_lost_device_and_gets_every_work_request_back() {
    let mut s = story(false);
    let mut done = Vec::new();
    while done.len() < 4 {
        s.queue
            .wait_with(Duration::from_secs(5), |c| done.push((c.user, c.outcome)))
            .unwrap();
    }
    let completed: Vec<_> = (1..=4).map(|u| (u, Outcome::Completed)).collect();
    assert_eq!(done, completed);
    assert_eq!(s.queue.outstanding(), 4, "the SENDs wait for a receive");

    // The device fails while the waiter sleeps: no event wakes it, its device check does.
    let start = Instant::now();
    let mut after = Vec::new();
    let handed = std::thread::scope(|scope| {
        let dev = &s.dev;
        scope.spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            dev.inject_fatal();
        });
        s.queue
            .wait_with(Duration::from_secs(10), |c| {
                assert!(c.buffer.is_some(), "the buffer comes back");
                after.push((c.user, c.outcome));
            })
            .unwrap()
    });
    assert!(start.elapsed() >= Duration::from_millis(50));
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "the waiter slept {:?}",
        start.elapsed()
    );
    assert_eq!(handed, 4);
    assert_eq!(after, lost(5..=8));
    assert_eq!(s.queue.state(), QueueState::DeviceLost);
    assert_eq!(s.queue.stats().lost, 4);

    match s.queue.post(Work::send(s.spare, 9)) {
        Err(QueuePostError::Refused(PostError::DeviceLost { payload })) => {
            assert!(payload.buffer.is_some(), "the work comes back whole")
        }
        other => panic!("expected DeviceLost, got {other:?}"),
    }
    let mut out = Vec::new();
    s.queue.drain(Duration::from_secs(1), &mut out).unwrap();
    assert!(out.is_empty());
    assert_eq!(s.dev.poll_async_event(), Some(AsyncEvent::DeviceFatal));
    assert_eq!(s.dev.poll_async_event(), None, "raised once");
    s.dev.inject_fatal();
    assert_eq!(
        s.dev.poll_async_event(),
        None,
        "raised once, however often injected"
    );
}

/// The completion the device wrote before it failed (CQE4, unpolled) is the truth about
/// WRs 1-4: `check_device` hands it first, and only 5-8 are `DeviceLost`.
#[test]
fn what_the_cq_held_before_the_loss_comes_first() {
    let mut s = story(true);
    // The event says CQE4 is in the CQ; nothing polled it.
    assert_eq!(s.cq.wait_event(Some(Duration::from_secs(5))).unwrap(), 1);
    assert!(!s.queue.check_device(), "not lost yet");
    s.dev.inject_fatal();
    assert!(s.queue.check_device());
    let mut out = Vec::new();
    s.queue.poll(&mut out).unwrap();
    let got: Vec<_> = out.iter().map(|c| (c.user, c.outcome)).collect();
    let mut expected: Vec<_> = (1..=4).map(|u| (u, Outcome::Completed)).collect();
    expected.extend(lost(5..=8));
    assert_eq!(got, expected);
    assert_eq!(s.queue.stats().success_cqes, 1);
    assert!(s.queue.check_device(), "still lost");
}
