//! The async driver's stories, written once for any device: `soft.rs` runs them on the
//! software NIC, `rxe.rs` on the kernel's Soft-RoCE in the project's VM.

use std::sync::Arc;
use std::time::Duration;

use selsig::{
    Access, Buffer, ConnectOptions, Device, MemoryRegion, Outcome, Policy, QpCaps, QpInit,
    QueueConfig, QueuePair, RecvWr, WcStatus, Work,
};
use selsig_tokio::{AsyncCq, AsyncQueue};

/// How long a story waits for anything before it fails.
pub const WAIT: Duration = Duration::from_secs(20);

/// A device, the connect options that reach its own QPs (loopback), and a name.
pub trait Rig: Device + Sized + 'static {
    fn options(&self) -> ConnectOptions;
}

/// A sending QP on `cq` and its peer on a CQ of its own, connected.
pub struct Pair<D: Device> {
    pub pd: D::Pd,
    pub a: D::Qp,
    pub b: D::Qp,
    pub cq_b: D::Cq,
    /// `a`'s receive CQ: the shared CQ's credits are all for sends.
    pub _recv_a: D::Cq,
}

pub fn qp_init(max_send_wr: u32) -> QpInit {
    QpInit {
        caps: QpCaps {
            max_send_wr,
            max_recv_wr: 4,
            ..QpCaps::default()
        },
        sq_sig_all: false,
    }
}

pub fn pair<D: Rig>(
    dev: &D,
    pd: D::Pd,
    cq: &D::Cq,
    depth: u32,
    options: ConnectOptions,
) -> Pair<D> {
    let cq_b = dev.create_cq(16).unwrap();
    let recv_a = dev.create_cq(16).unwrap();
    let a = dev.create_qp(&pd, cq, &recv_a, &qp_init(depth)).unwrap();
    let b = dev.create_qp(&pd, &cq_b, &cq_b, &qp_init(depth)).unwrap();
    selsig::connect_pair(&a, &b, &options).unwrap();
    Pair {
        pd,
        a,
        b,
        cq_b,
        _recv_a: recv_a,
    }
}

/// `n` buffers of `size` bytes, and a remote region of as many.
fn buffers<D: Device>(dev: &D, pd: &D::Pd, n: usize, size: usize) -> (Vec<Buffer<D::Mr>>, D::Mr) {
    let local = dev.reg_mr(pd, n * size, Access::LOCAL_WRITE).unwrap();
    let remote = dev
        .reg_mr(pd, n * size, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    let (bufs, _) = Buffer::new(local).split_into(n, size).ok().unwrap();
    (bufs, remote)
}

/// Every retired work request of `q` until none is outstanding: (user, outcome), each
/// with its buffer back.
async fn retire_all<D: Device>(q: &mut AsyncQueue<D, u64>) -> Vec<(u64, Outcome)> {
    let mut done = Vec::new();
    let all = async {
        while let Some(c) = q.next().await {
            let c = c.unwrap();
            assert!(c.buffer.is_some(), "the buffer of {} comes back", c.user);
            done.push((c.user, c.outcome));
        }
    };
    tokio::time::timeout(WAIT, all)
        .await
        .expect("everything retires");
    done
}

/// The seed story: 8 WRITEs, every 4th signaled: 2 completions, 8 work requests retired
/// in order.
pub async fn seed<D: Rig>(dev: D) {
    let cq = Arc::new(dev.create_cq(64).unwrap());
    let acq = AsyncCq::<D>::new(Arc::clone(&cq)).unwrap();
    let p = pair(&dev, dev.alloc_pd().unwrap(), &cq, 16, dev.options());
    let (bufs, remote) = buffers(&dev, &p.pd, 8, 64);
    let mut q: AsyncQueue<D, u64> =
        AsyncQueue::new(&acq, p.a, QueueConfig::with_policy(Policy::Every(4))).unwrap();
    for (i, mut buf) in bufs.into_iter().enumerate() {
        buf.fill(i as u8 + 1).unwrap();
        q.post(Work::write(buf, remote.remote(i * 64), i as u64 + 1))
            .await
            .unwrap();
    }
    let expected: Vec<_> = (1..=8).map(|u| (u, Outcome::Completed)).collect();
    assert_eq!(retire_all(&mut q).await, expected);
    assert_eq!(q.queue().stats().success_cqes, 2, "CQE4 and CQE8 only");
    let mut landed = vec![0; 8 * 64];
    remote.read(0, &mut landed).unwrap();
    for (i, chunk) in landed.chunks(64).enumerate() {
        assert!(
            chunk.iter().all(|&b| b == i as u8 + 1),
            "WRITE {} landed",
            i + 1
        );
    }
}

/// A bad rkey on WR3 of 8 (one signaled, the last): WR1-2 completed, WR3 failed, WR4-8
/// flushed, each with its buffer.
pub async fn error_and_flushes<D: Rig>(dev: D) {
    let cq = Arc::new(dev.create_cq(64).unwrap());
    let acq = AsyncCq::<D>::new(Arc::clone(&cq)).unwrap();
    let p = pair(&dev, dev.alloc_pd().unwrap(), &cq, 16, dev.options());
    let (bufs, remote) = buffers(&dev, &p.pd, 8, 64);
    let mut q: AsyncQueue<D, u64> =
        AsyncQueue::new(&acq, p.a, QueueConfig::with_policy(Policy::Every(8))).unwrap();
    for (i, buf) in bufs.into_iter().enumerate() {
        let mut target = remote.remote(i * 64);
        if i == 2 {
            target.rkey = target.rkey.wrapping_add(1);
        }
        q.post(Work::write(buf, target, i as u64 + 1))
            .await
            .unwrap();
    }
    let mut expected = vec![
        (1, Outcome::Completed),
        (2, Outcome::Completed),
        (3, Outcome::Failed(WcStatus::RemAccessErr)),
    ];
    expected.extend((4..=8).map(|u| (u, Outcome::Flushed)));
    assert_eq!(retire_all(&mut q).await, expected);
    drop(p.b);
}

/// 64 queue pairs on one CQ, each in a task of its own, streaming `per_qp` WRITEs
/// through a shared pool of CQ credits smaller than their queues: each sees its own
/// work requests retire in posting order, all completed, every byte where it belongs.
pub async fn many_qps_on_one_cq<D: Rig>(dev: D, per_qp: u64) {
    const QPS: usize = 64;
    const DEPTH: u32 = 16;
    const SIZE: usize = 32;
    let dev = Arc::new(dev);
    // 64 x 16 work requests could be outstanding; the CQ holds 255 completions.
    let cq = Arc::new(dev.create_cq(255).unwrap());
    let acq = AsyncCq::<D>::new(Arc::clone(&cq)).unwrap();
    let pd = dev.alloc_pd().unwrap();
    let remote = dev
        .reg_mr(&pd, QPS * SIZE, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    let mut tasks = Vec::new();
    let mut peers = Vec::new();
    for k in 0..QPS {
        let cq_b = dev.create_cq(16).unwrap();
        let recv_a = dev.create_cq(16).unwrap();
        let a = dev.create_qp(&pd, &cq, &recv_a, &qp_init(DEPTH)).unwrap();
        let b = dev.create_qp(&pd, &cq_b, &cq_b, &qp_init(DEPTH)).unwrap();
        selsig::connect_pair(&a, &b, &dev.options()).unwrap();
        peers.push((b, cq_b, recv_a));
        let local = dev.reg_mr(&pd, 4 * SIZE, Access::LOCAL_WRITE).unwrap();
        let (mut free, _) = Buffer::new(local).split_into(4, SIZE).ok().unwrap();
        let target = remote.remote(k * SIZE);
        let mut q: AsyncQueue<D, u64> =
            AsyncQueue::new(&acq, a, QueueConfig::with_policy(Policy::Every(8))).unwrap();
        tasks.push(tokio::spawn(async move {
            let (mut posted, mut next) = (0u64, 0u64);
            while next < per_qp {
                while posted < per_qp && !free.is_empty() {
                    let mut buf = free.pop().unwrap();
                    buf.fill((posted % 251) as u8).unwrap();
                    q.post(Work::write(buf, target, posted)).await.unwrap();
                    posted += 1;
                }
                if posted == per_qp {
                    q.confirm_all().await.unwrap();
                }
                let c = q.next().await.expect("outstanding").unwrap();
                assert_eq!(c.user, next, "QP {k}: retired in posting order");
                assert_eq!(c.outcome, Outcome::Completed, "QP {k}: WRITE {next}");
                free.push(c.buffer.expect("the buffer comes back"));
                next += 1;
                while let Some(c) = q.try_next() {
                    assert_eq!((c.user, c.outcome), (next, Outcome::Completed), "QP {k}");
                    free.push(c.buffer.expect("the buffer comes back"));
                    next += 1;
                }
            }
            q.drain(WAIT).await.unwrap();
            assert!(q.try_next().is_none() || per_qp == 0);
            q.queue().stats().success_cqes
        }));
    }
    let mut cqes = 0;
    for t in tasks {
        cqes += tokio::time::timeout(WAIT * 3, t)
            .await
            .expect("in time")
            .unwrap();
    }
    assert!(cqes < QPS as u64 * per_qp, "selective: {cqes} CQEs");
    let mut landed = vec![0; QPS * SIZE];
    remote.read(0, &mut landed).unwrap();
    let last = ((per_qp - 1) % 251) as u8;
    assert!(
        landed.iter().all(|&b| b == last),
        "each QP's last WRITE landed"
    );
    assert!(acq.take_unclaimed().is_empty());
    drop(peers);
}

/// Cancellation: a `next` and a `post` dropped while they wait lose nothing. The peer
/// has no receive posted and RNR retries for ever, so a SEND waits; the queue (depth 4)
/// fills; a post of a fifth, and a `next`, time out; then a receive lets everything
/// through, and every work request retires, in order, with its buffer.
pub async fn cancellation<D: Rig>(dev: D) {
    let cq = Arc::new(dev.create_cq(64).unwrap());
    let acq = AsyncCq::<D>::new(Arc::clone(&cq)).unwrap();
    let options = ConnectOptions {
        rnr_retry: 7,
        ..dev.options()
    };
    let p = pair(&dev, dev.alloc_pd().unwrap(), &cq, 4, options);
    let (mut bufs, remote) = buffers(&dev, &p.pd, 6, 64);
    let mut q: AsyncQueue<D, u64> =
        AsyncQueue::new(&acq, p.a, QueueConfig::with_policy(Policy::Every(2))).unwrap();
    let send = bufs.remove(0);
    q.post(Work::send(send, 1)).await.unwrap();
    for (i, buf) in bufs.drain(..3).enumerate() {
        q.post(Work::write(buf, remote.remote(i * 64), i as u64 + 2))
            .await
            .unwrap();
    }
    assert_eq!(q.queue().available(), 0, "full");
    let short = Duration::from_millis(200);
    let fifth = Work::write(bufs.remove(0), remote.remote(4 * 64), 5);
    assert!(
        tokio::time::timeout(short, q.post(fifth)).await.is_err(),
        "the post waits for room"
    );
    assert!(
        tokio::time::timeout(short, q.next()).await.is_err(),
        "nothing retires while the SEND waits"
    );
    assert_eq!(q.outstanding(), 4, "the cancelled post posted nothing");
    // The receive the SEND waits for.
    let rbuf = dev.reg_mr(&p.pd, 64, Access::LOCAL_WRITE).unwrap();
    p.b.post_recv(&[RecvWr {
        wr_id: 99,
        sge: Some(rbuf.sge(0, 64)),
    }])
    .unwrap();
    let expected: Vec<_> = (1..=4).map(|u| (u, Outcome::Completed)).collect();
    assert_eq!(retire_all(&mut q).await, expected);
    // And the queue goes on: `ready`, then a post through the queue itself.
    assert!(q.ready().await.unwrap() > 0);
    q.queue_mut()
        .post(Work::write(bufs.remove(0), remote.remote(0), 6))
        .unwrap();
    q.confirm_all().await.unwrap();
    assert_eq!(retire_all(&mut q).await, [(6, Outcome::Completed)]);
    drop(p.cq_b);
}

/// The `Adaptive` policy under `next`: an unsignaled tail is confirmed at its deadline (a
/// tick), not at once and not never.
pub async fn adaptive_deadline<D: Rig>(dev: D) {
    let cq = Arc::new(dev.create_cq(64).unwrap());
    let acq = AsyncCq::<D>::new(Arc::clone(&cq)).unwrap();
    let p = pair(&dev, dev.alloc_pd().unwrap(), &cq, 16, dev.options());
    let (bufs, remote) = buffers(&dev, &p.pd, 3, 64);
    let policy = Policy::Adaptive {
        max_unsignaled: 64,
        max_lag: Duration::from_millis(30),
    };
    let mut q: AsyncQueue<D, u64> =
        AsyncQueue::new(&acq, p.a, QueueConfig::with_policy(policy)).unwrap();
    for (i, buf) in bufs.into_iter().enumerate() {
        q.post(Work::write(buf, remote.remote(i * 64), i as u64 + 1))
            .await
            .unwrap();
    }
    let start = tokio::time::Instant::now();
    let mut users = Vec::new();
    let n = tokio::time::timeout(WAIT, q.retire_with(|c| users.push(c.user)))
        .await
        .expect("the deadline confirms the tail")
        .unwrap();
    let waited = start.elapsed();
    assert!(
        n >= 1 && waited >= Duration::from_millis(25),
        "after {waited:?}"
    );
    assert_eq!(retire_all(&mut q).await.len() + users.len(), 3);
    assert_eq!(q.queue().stats().markers, 1, "one marker, at the deadline");
}
