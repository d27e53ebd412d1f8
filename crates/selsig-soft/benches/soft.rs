//! Throughput of RDMA WRITE streams on the software NIC: the raw provider interface (the
//! loop of perftest's `ib_write_bw`: post batches, poll, count) and the same stream
//! through `SignaledQueue` (buffers handed back, outcomes, statistics), for 64-byte
//! WRITEs signaled every 64 and every 1, and 4 KiB WRITEs next to a plain copy of the
//! same bytes.
//!
//! Two threads: the application posts batches (one doorbell each) and polls; the device's
//! NIC thread executes. One buffer per send queue slot. Two shapes: send queue depth
//! 1024 with batches of 32, and depth 8192 with batches of 512 (a deep queue keeps the NIC
//! thread busy far behind the poster: 64-byte WRITEs run faster).

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use selsig::{
    Access, Buffer, CompletionQueue, ConnectOptions, Device, Local, MemoryRegion, Opcode, Policy,
    QpCaps, QpInit, QueuePair, SendWr, SignaledQueue, WcStatus, Work, WorkCompletion, connect_pair,
};
use selsig_soft::{SoftConfig, SoftCq, SoftDevice, SoftMr, SoftQp};

/// The send queue depth and the batch posted per doorbell.
#[derive(Debug, Clone, Copy)]
struct Shape {
    depth: usize,
    batch: usize,
}

const SHALLOW: Shape = Shape {
    depth: 1024,
    batch: 32,
};
const DEEP: Shape = Shape {
    depth: 8192,
    batch: 512,
};

/// A connected pair, a local region of `depth` buffers and a remote region as large.
struct Setup {
    dev: SoftDevice,
    a: SoftQp,
    b: SoftQp,
    cq: Arc<SoftCq>,
    local: SoftMr,
    remote: SoftMr,
}

fn setup(size: usize, depth: usize) -> Setup {
    let dev = SoftDevice::open(SoftConfig::default()).expect("device");
    let pd = dev.alloc_pd().expect("pd");
    let cq = Arc::new(dev.create_cq(2 * depth as u32).expect("cq"));
    let init = QpInit {
        caps: QpCaps {
            max_send_wr: depth as u32,
            ..QpCaps::default()
        },
        sq_sig_all: false,
    };
    let a = dev.create_qp(&pd, &cq, &cq, &init).expect("qp");
    let b = dev.create_qp(&pd, &cq, &cq, &init).expect("qp");
    connect_pair(&a, &b, &ConnectOptions::default()).expect("connect");
    let local = dev
        .reg_mr(&pd, depth * size, Access::LOCAL_WRITE)
        .expect("mr");
    let remote = dev
        .reg_mr(
            &pd,
            depth * size,
            Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        )
        .expect("mr");
    Setup {
        dev,
        a,
        b,
        cq,
        local,
        remote,
    }
}

/// The raw provider loop: `count` WRITEs, every `every`-th signaled (and the last).
fn raw(s: &Setup, shape: Shape, size: usize, every: u64, count: u64) -> Duration {
    let mut wrs: Vec<SendWr<'static>> = Vec::with_capacity(shape.batch);
    let mut wc = [WorkCompletion::new(0, WcStatus::Success, 0); 32];
    let depth = shape.depth as u64;
    let (mut posted, mut completed) = (0u64, 0u64);
    let base = s.a.qp_num();
    // The next WRITE's slot, and how many WRITEs until the next signaled one: counted, not
    // divided, so that the loop's own work stays small next to the provider's (an integer
    // division costs tens of cycles on some hosts).
    let (mut slot, mut to_signal) = (0u64, every);
    let start = Instant::now();
    while completed < count {
        let room = (depth - (posted - completed))
            .min(shape.batch as u64)
            .min(count - posted);
        if room > 0 {
            wrs.clear();
            for i in posted..posted + room {
                let off = slot as usize * size;
                slot = if slot + 1 == depth { 0 } else { slot + 1 };
                to_signal -= 1;
                let signaled = to_signal == 0 || i + 1 == count;
                if to_signal == 0 {
                    to_signal = every;
                }
                wrs.push(SendWr {
                    wr_id: i + 1,
                    opcode: Opcode::RdmaWrite,
                    local: Local::Sge(s.local.sge(off, size as u32)),
                    remote: s.remote.remote(off),
                    imm_data: 0,
                    signaled,
                });
            }
            s.a.post_send(&wrs).expect("post");
            posted += room;
        }
        let n = s.cq.poll(&mut wc).expect("poll");
        for w in &wc[..n] {
            debug_assert!(w.status == WcStatus::Success && w.qp_num == base);
            completed = w.wr_id;
        }
    }
    start.elapsed()
}

/// The same stream through `SignaledQueue`: buffers move in and come back.
struct Driven {
    queue: SignaledQueue<SoftDevice, ()>,
    batch: usize,
    free: Vec<Buffer<SoftMr>>,
    remote: SoftMr,
    _b: SoftQp,
    _dev: SoftDevice,
}

fn driven(shape: Shape, size: usize, every: u32) -> Driven {
    let s = setup(size, shape.depth);
    let (free, _) = Buffer::new(s.local)
        .split_into(shape.depth, size)
        .expect("split");
    let queue = SignaledQueue::new(s.a, s.cq, Policy::Every(every)).expect("queue");
    Driven {
        queue,
        batch: shape.batch,
        free,
        remote: s.remote,
        _b: s.b,
        _dev: s.dev,
    }
}

impl Driven {
    fn run(&mut self, count: u64) -> Duration {
        let remote = self.remote.remote(0);
        let (mut posted, mut retired) = (0u64, 0u64);
        let start = Instant::now();
        while retired < count {
            if posted < count && !self.free.is_empty() {
                let n = (self.free.len().min(self.batch) as u64).min(count - posted) as usize;
                let at = self.free.len() - n;
                let mut works = self.free.drain(at..).map(|buf| {
                    let target = remote.offset(buf.offset() as u64);
                    Work::write(buf, target, ())
                });
                posted += self.queue.post_batch(&mut works).expect("post") as u64;
            }
            if posted == count {
                self.queue.confirm_all().expect("confirm");
            }
            let free = &mut self.free;
            self.queue
                .poll_with(|c| {
                    retired += 1;
                    free.extend(c.buffer);
                })
                .expect("poll");
        }
        start.elapsed()
    }
}

fn write_64(c: &mut Criterion) {
    let mut group = c.benchmark_group("write_64B");
    group.throughput(Throughput::Elements(1));
    group.measurement_time(Duration::from_secs(4));
    for shape in [SHALLOW, DEEP] {
        for every in [64u32, 1] {
            let id = format!("every_{every}/depth_{}", shape.depth);
            group.bench_with_input(BenchmarkId::new("raw", &id), &every, |b, &every| {
                let s = setup(64, shape.depth);
                b.iter_custom(|iters| raw(&s, shape, 64, u64::from(every), iters));
            });
            group.bench_with_input(BenchmarkId::new("queue", &id), &every, |b, &every| {
                let mut d = driven(shape, 64, every);
                b.iter_custom(|iters| d.run(iters));
            });
        }
    }
    group.finish();
}

fn write_4k(c: &mut Criterion) {
    let size = 4096;
    let mut group = c.benchmark_group("write_4KiB");
    group.throughput(Throughput::Bytes(size as u64));
    group.measurement_time(Duration::from_secs(4));
    let shape = SHALLOW;
    group.bench_function("raw/every_64", |b| {
        let s = setup(size, shape.depth);
        b.iter_custom(|iters| raw(&s, shape, size, 64, iters));
    });
    group.bench_function("queue/every_64", |b| {
        let mut d = driven(shape, size, 64);
        b.iter_custom(|iters| d.run(iters));
    });
    // The bytes of the same working set, copied by one core: `depth` 4 KiB sources to
    // `depth` 4 KiB targets, in turn.
    let depth = shape.depth;
    let src = vec![7u8; depth * size];
    let mut dst = vec![0u8; depth * size];
    let mut i = 0;
    group.bench_function("memcpy", |b| {
        b.iter(|| {
            let k = (i % depth) * size;
            dst[k..k + size].copy_from_slice(&src[k..k + size]);
            i += 1;
            black_box(&dst);
        });
    });
    group.finish();
}

criterion_group!(benches, write_64, write_4k);
criterion_main!(benches);
