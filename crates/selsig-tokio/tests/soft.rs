//! The async driver's stories on the software NIC (`stories/mod.rs`).

mod stories;

use selsig::ConnectOptions;
use selsig_soft::{SoftConfig, SoftDevice};

impl stories::Rig for SoftDevice {
    fn options(&self) -> ConnectOptions {
        ConnectOptions::default()
    }
}

fn soft() -> SoftDevice {
    SoftDevice::open(SoftConfig::default()).unwrap()
}

#[tokio::test]
async fn the_seed_story_retires_in_order_with_two_completions() {
    stories::seed(soft()).await;
}

#[tokio::test]
async fn an_error_and_its_flushes_give_every_work_request_its_outcome() {
    stories::error_and_flushes(soft()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_queue_pairs_on_one_cq_each_retire_in_order() {
    stories::many_qps_on_one_cq(soft(), 500).await;
}

#[tokio::test(flavor = "current_thread")]
async fn sixty_four_queue_pairs_on_one_cq_in_one_thread() {
    stories::many_qps_on_one_cq(soft(), 100).await;
}

#[tokio::test]
async fn a_cancelled_post_or_next_loses_nothing() {
    stories::cancellation(soft()).await;
}

#[tokio::test]
async fn an_adaptive_tail_is_confirmed_at_its_deadline() {
    stories::adaptive_deadline(soft()).await;
}

/// A lost device (soft only: rxe never raises a fatal error): the poller, asleep on a CQ
/// that makes no event, finds the loss within its device check, and the stream hands the
/// outstanding work requests back as `DeviceLost`, then ends; a post is refused.
#[tokio::test]
async fn a_lost_device_ends_the_stream_with_every_work_request_lost() {
    use std::sync::Arc;
    use std::time::Duration;

    use selsig::{
        Access, Buffer, Device, MemoryRegion, Outcome, Policy, PostError, QueueConfig,
        QueuePostError, Work,
    };
    use selsig_tokio::{AsyncCq, AsyncQueue};

    let dev = soft();
    let cq = Arc::new(dev.create_cq(64).unwrap());
    let acq = AsyncCq::<SoftDevice>::new(Arc::clone(&cq)).unwrap();
    let options = stories::Rig::options(&dev);
    let p = stories::pair(&dev, dev.alloc_pd().unwrap(), &cq, 16, options);
    let local = dev.reg_mr(&p.pd, 9 * 64, Access::LOCAL_WRITE).unwrap();
    let remote = dev
        .reg_mr(&p.pd, 4 * 64, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    let (bufs, _) = Buffer::new(local).split_into(9, 64).ok().unwrap();
    let mut bufs = bufs.into_iter();
    let mut q: AsyncQueue<SoftDevice, u64> =
        AsyncQueue::new(&acq, p.a, QueueConfig::with_policy(Policy::Every(4))).unwrap();
    for i in 0..4 {
        let buf = bufs.next().unwrap();
        q.post(Work::write(buf, remote.remote(i * 64), i as u64 + 1))
            .await
            .unwrap();
    }
    // The peer has no receive posted: these SENDs wait (RNR, retried for ever).
    for i in 4..8 {
        q.post(Work::send(bufs.next().unwrap(), i + 1))
            .await
            .unwrap();
    }
    let mut done = Vec::new();
    for _ in 0..4 {
        let c = q.next().await.unwrap().unwrap();
        done.push((c.user, c.outcome));
    }
    let faults = dev.faults();
    tokio::task::spawn_blocking(move || {
        std::thread::sleep(Duration::from_millis(50));
        faults.inject_fatal();
    });
    let rest = async {
        while let Some(c) = q.next().await {
            let c = c.unwrap();
            assert!(c.buffer.is_some(), "the buffer of {} comes back", c.user);
            done.push((c.user, c.outcome));
        }
    };
    tokio::time::timeout(Duration::from_secs(5), rest)
        .await
        .expect("the stream ends");
    let mut expected: Vec<_> = (1..=4).map(|u| (u, Outcome::Completed)).collect();
    expected.extend((5..=8).map(|u| (u, Outcome::DeviceLost)));
    assert_eq!(done, expected);
    match q.post(Work::send(bufs.next().unwrap(), 9)).await {
        Err(selsig_tokio::PostError::Queue(QueuePostError::Refused(PostError::DeviceLost {
            ..
        }))) => {}
        other => panic!("expected DeviceLost, got {:?}", other.map(|s| s.0)),
    }
    drop(p.b);
}
