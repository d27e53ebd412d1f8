//! The driver's own cost per work request: `SignaledQueue` over a null provider that
//! executes nothing and completes every signaled work request at once. What is measured
//! is selsig's bookkeeping between the application and a provider: posting a batch,
//! polling, and handing every buffer back.

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use selsig::{
    Buffer, CompletionQueue, ConnectOptions, CqError, Endpoint, Policy, PostWrError, ProviderError,
    QpCaps, QpState, QueuePair, RecvWr, RemoteAddr, SendWr, SignaledQueue, WcOpcode, WcStatus,
    Work, WorkCompletion,
};
use selsig_testkit::null::NullMr;

const DEPTH: u32 = 1024;
const BATCH: usize = 32;

/// Completions of signaled work requests, ready at once.
#[derive(Default)]
struct NullCq {
    ready: Mutex<Vec<WorkCompletion>>,
}

impl CompletionQueue for NullCq {
    fn capacity(&self) -> u32 {
        2 * DEPTH
    }
    fn poll(&self, out: &mut [WorkCompletion]) -> Result<usize, CqError> {
        let mut ready = self.ready.lock().expect("lock");
        let n = ready.len().min(out.len());
        out[..n].copy_from_slice(&ready[..n]);
        ready.drain(..n);
        Ok(n)
    }
}

struct NullQp {
    cq: Arc<NullCq>,
    posted: AtomicU64,
}

impl QueuePair for NullQp {
    fn qp_num(&self) -> u32 {
        7
    }
    fn caps(&self) -> QpCaps {
        QpCaps {
            max_send_wr: DEPTH,
            ..QpCaps::default()
        }
    }
    fn sq_sig_all(&self) -> bool {
        false
    }
    fn state(&self) -> QpState {
        QpState::Rts
    }
    fn endpoint(&self, _: &ConnectOptions) -> Result<Endpoint, ProviderError> {
        unreachable!()
    }
    fn connect(&self, _: &Endpoint, _: &ConnectOptions) -> Result<(), ProviderError> {
        Ok(())
    }
    fn to_error(&self) -> Result<(), ProviderError> {
        Ok(())
    }
    fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<(), PostWrError> {
        let mut ready = self.cq.ready.lock().expect("lock");
        for wr in wrs {
            if wr.signaled {
                ready.push(
                    WorkCompletion::new(wr.wr_id, WcStatus::Success, 7)
                        .with_opcode(WcOpcode::RdmaWrite),
                );
            }
        }
        self.posted.fetch_add(wrs.len() as u64, Ordering::Relaxed);
        Ok(())
    }
    fn post_recv(&self, _: &[RecvWr]) -> Result<(), PostWrError> {
        Ok(())
    }
}

type NullDevice = selsig_testkit::null::NullDevice<NullCq, NullQp>;

fn driver(c: &mut Criterion) {
    let mut group = c.benchmark_group("driver");
    for (every, with) in [(1u32, false), (64, false), (1, true), (64, true)] {
        group.throughput(Throughput::Elements(1));
        // `poll` into a vector drained by the caller, or `poll_with` and a closure.
        let name = if with {
            "poll_with/every"
        } else {
            "poll/every"
        };
        group.bench_with_input(BenchmarkId::new(name, every), &every, |b, &every| {
            let cq = Arc::new(NullCq::default());
            let qp = NullQp {
                cq: Arc::clone(&cq),
                posted: AtomicU64::new(0),
            };
            let mut queue: SignaledQueue<NullDevice, u32> =
                SignaledQueue::new(qp, cq, Policy::Every(every)).expect("queue");
            let (mut free, _) = Buffer::new(NullMr(DEPTH as usize * 64))
                .split_into(DEPTH as usize, 64)
                .expect("split");
            let mut done = Vec::with_capacity(DEPTH as usize);
            let remote = RemoteAddr {
                addr: 0x2000,
                rkey: 2,
            };
            b.iter_custom(|iters| {
                let start = std::time::Instant::now();
                let (mut posted, mut retired) = (0u64, 0u64);
                while retired < iters {
                    if posted < iters && !free.is_empty() {
                        let n = (free.len().min(BATCH) as u64).min(iters - posted) as usize;
                        let at = free.len() - n;
                        let mut works = free.drain(at..).map(|buf| {
                            let target = remote.offset(buf.offset() as u64);
                            Work::write(buf, target, 0u32)
                        });
                        posted += queue.post_batch(&mut works).expect("post") as u64;
                    }
                    if posted == iters {
                        queue.confirm_all().expect("confirm");
                    }
                    if with {
                        queue
                            .poll_with(|c| {
                                retired += 1;
                                if let Some(b) = c.buffer {
                                    free.push(b);
                                }
                            })
                            .expect("poll");
                    } else {
                        queue.poll(&mut done).expect("poll");
                        retired += done.len() as u64;
                        free.extend(done.drain(..).filter_map(|c| c.buffer));
                    }
                }
                black_box(retired);
                start.elapsed()
            });
        });
    }
    group.finish();
}

criterion_group!(benches, driver);
criterion_main!(benches);
