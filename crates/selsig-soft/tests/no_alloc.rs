//! Zero heap allocations per work request in steady state, through the whole stack: a
//! million RDMA WRITEs posted in batches through `SignaledQueue` on the software NIC (its
//! NIC thread included), polled, every buffer handed back and posted again, allocate
//! nothing once the queue and its buffers are made. A global allocator counts, in every
//! thread. (One test in this binary: the count is process-wide.)

use selsig_testkit::alloc::{Counting, allocations};
use selsig_testkit::write_pair::write_pair;

use selsig::{Buffer, Completion, Policy, SignaledQueue, Work};
use selsig_soft::{SoftConfig, SoftDevice, SoftMr};

#[global_allocator]
static GLOBAL: Counting = Counting;

const DEPTH: u32 = 256;
const SIZE: usize = 64;

/// Streams `count` WRITEs: batches of up to 32 from the free buffers, polling after each.
fn stream(
    queue: &mut SignaledQueue<SoftDevice, ()>,
    free: &mut Vec<Buffer<SoftMr>>,
    done: &mut Vec<Completion<SoftMr, ()>>,
    target: selsig::RemoteAddr,
    count: u64,
) {
    let (mut posted, mut retired) = (0u64, 0u64);
    while retired < count {
        if posted < count && !free.is_empty() {
            let room = free.len().min(32).min(queue.available() as usize);
            let k = (room as u64).min(count - posted) as usize;
            let at = free.len() - k;
            let mut works = free.drain(at..).map(|buf| {
                let t = target.offset(buf.offset() as u64);
                Work::write(buf, t, ())
            });
            posted += queue.post_batch(&mut works).expect("room for the batch") as u64;
        }
        if posted == count {
            queue.confirm_all().expect("a confirm marker");
        }
        queue.poll(done).expect("poll");
        retired += done.len() as u64;
        free.extend(done.drain(..).filter_map(|c| c.buffer));
    }
}

#[test]
fn a_million_writes_through_the_queue_on_the_soft_nic_allocate_nothing() {
    let wrs = if cfg!(miri) { 1_000 } else { 1_000_000 };
    for every in [64, 1] {
        let pair = write_pair(
            SoftDevice::open(SoftConfig::default()).unwrap(),
            DEPTH,
            SIZE,
        );
        let (mut free, target) = (pair.free, pair.target);
        let mut queue: SignaledQueue<SoftDevice, ()> =
            SignaledQueue::new(pair.a, pair.cq, Policy::Every(every)).unwrap();
        let n = DEPTH as usize;
        let mut done = Vec::with_capacity(n);
        // Warm up: the histograms' buckets, every vector at its size.
        stream(&mut queue, &mut free, &mut done, target, wrs / 4);
        let before = allocations();
        stream(&mut queue, &mut free, &mut done, target, wrs);
        let allocations = allocations() - before;
        assert_eq!(free.len(), n, "every buffer back");
        assert_eq!(
            allocations, 0,
            "every {every}: {allocations} allocations for {wrs} WRITEs"
        );
        drop(queue);
        drop(pair.b);
    }
}
