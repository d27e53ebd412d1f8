//! The async driver beside the sync one, in one run on the software NIC: 64-byte RDMA
//! WRITEs on one RC queue pair (depth 128, 128 buffers), signaling every 64 and every
//! WRITE. For each: WRITEs per second, CPU time of the posting thread per WRITE (the
//! thread that posts and polls: the sync loop's, or the current-thread runtime's, which
//! also runs the poller task), and the confirmation lag (post to retirement).
//!
//! `cargo bench -p selsig-tokio --bench async_vs_sync [-- SECONDS]`

use std::sync::Arc;
use std::time::{Duration, Instant};

use selsig::{Buffer, Completion, Policy, QueueConfig, RemoteAddr, SignaledQueue, Stats, Work};
use selsig_soft::{SoftConfig, SoftDevice, SoftMr};
use selsig_testkit::write_pair::{WritePair, write_pair};
use selsig_tokio::{AsyncCq, AsyncQueue};

const DEPTH: u32 = 128;
const SIZE: usize = 64;

/// A connected pair on a soft device, `DEPTH` buffers of `SIZE` bytes.
fn setup() -> WritePair<SoftDevice> {
    write_pair(
        SoftDevice::open(SoftConfig::default()).unwrap(),
        DEPTH,
        SIZE,
    )
}

/// What one point measured.
struct Point {
    writes: u64,
    elapsed: Duration,
    cpu: Duration,
    stats: Stats,
}

/// Up to 32 WRITEs from the free buffers, as many as the queue takes now.
fn batch<'a>(
    free: &'a mut Vec<Buffer<SoftMr>>,
    room: u32,
    target: RemoteAddr,
) -> impl Iterator<Item = Work<'static, SoftMr, ()>> + 'a {
    let k = free.len().min(32).min(room as usize);
    let at = free.len() - k;
    free.drain(at..).map(move |buf| {
        let t = target.offset(buf.offset() as u64);
        Work::write(buf, t, ())
    })
}

fn sync_point(every: u32, time: Duration) -> Point {
    let mut s = setup();
    let mut q: SignaledQueue<SoftDevice, ()> =
        SignaledQueue::new(s.a, Arc::clone(&s.cq), Policy::Every(every)).unwrap();
    let (start, cpu) = (Instant::now(), selsig_testkit::cpu::thread_cpu());
    let mut retired = 0u64;
    let free = &mut s.free;
    while start.elapsed() < time {
        if !free.is_empty() && q.available() > 0 {
            let room = q.available();
            let mut works = batch(free, room, s.target);
            q.post_batch(&mut works).unwrap();
        }
        q.poll_with(|c: Completion<SoftMr, ()>| {
            retired += 1;
            free.extend(c.buffer);
        })
        .unwrap();
    }
    let (elapsed, cpu) = (start.elapsed(), selsig_testkit::cpu::thread_cpu() - cpu);
    Point {
        writes: retired,
        elapsed,
        cpu,
        stats: q.stats().clone(),
    }
}

fn async_point(every: u32, time: Duration) -> Point {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut s = setup();
        let acq = AsyncCq::<SoftDevice>::new(Arc::clone(&s.cq)).unwrap();
        let config = QueueConfig::with_policy(Policy::Every(every));
        let mut q: AsyncQueue<SoftDevice, ()> = AsyncQueue::new(&acq, s.a, config).unwrap();
        let (start, cpu) = (Instant::now(), selsig_testkit::cpu::thread_cpu());
        let mut retired = 0u64;
        let free = &mut s.free;
        while start.elapsed() < time {
            // Post what the free buffers and the room allow, as the sync loop does (a wait
            // with nothing signaled outstanding would confirm the tail at once).
            while !free.is_empty() && q.queue().available() > 0 {
                let room = q.queue().available();
                let mut works = batch(free, room, s.target);
                q.queue_mut().post_batch(&mut works).unwrap();
            }
            // The retired WRITEs (asleep until there is one).
            q.retire_with(|c| {
                retired += 1;
                free.extend(c.buffer);
            })
            .await
            .unwrap();
        }
        let (elapsed, cpu) = (start.elapsed(), selsig_testkit::cpu::thread_cpu() - cpu);
        Point {
            writes: retired,
            elapsed,
            cpu,
            stats: q.queue().stats().clone(),
        }
    })
}

fn row(driver: &str, every: u32, p: &Point, base: Option<&Point>) {
    let rate = p.writes as f64 / p.elapsed.as_secs_f64() / 1e6;
    let ratio = base.map_or(String::new(), |b| {
        format!(
            "{:.2}x",
            rate / (b.writes as f64 / b.elapsed.as_secs_f64() / 1e6)
        )
    });
    let lag = |q: f64| Duration::from_nanos(p.stats.lag_ns.value_at_quantile(q));
    println!(
        "{driver:>6} {:>9} {rate:>8.2} {ratio:>7} {:>8.1} {:>9.1?} {:>9.1?}",
        format!("every:{every}"),
        p.cpu.as_nanos() as f64 / p.writes as f64,
        lag(0.5),
        lag(0.99),
    );
}

fn main() {
    // `cargo bench` passes `--bench`; a number is the seconds per point.
    let secs = std::env::args()
        .skip(1)
        .find_map(|a| a.parse::<f64>().ok())
        .unwrap_or(2.0);
    let time = Duration::from_secs_f64(secs);
    println!("64 B RDMA WRITEs on the soft NIC, one QP, depth {DEPTH}, {secs} s per point");
    println!("driver    signal    MWR/s   async  CPU ns/WR  lag p50   lag p99");
    for every in [64, 1] {
        let sync = sync_point(every, time);
        row("sync", every, &sync, None);
        let asynchronous = async_point(every, time);
        row("async", every, &asynchronous, Some(&sync));
    }
}
