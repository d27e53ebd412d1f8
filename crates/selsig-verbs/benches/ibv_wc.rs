//! The Rust tracker's batch calls fed the way a program on raw libibverbs feeds them: the
//! completions as `ibv_wc` entries, as `ibv_poll_cq` writes them, each decoded with
//! `WorkCompletion::from(&ibv_wc)`, the retired work requests collected with
//! `poll_completed_with`. The stream is `crates/selsig/benches/tracker.rs`'s
//! `post_batch_and_retire` (a send queue of 256, 4096 work requests per iteration); the C
//! benchmark (`crates/selsig-capi/benches/post_retire.c`) makes the same calls through
//! libselsig, so its figure less this one is what the C boundary alone costs.

use std::hint::black_box;
use std::time::Instant;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use selsig::{Policy, SendTracker, Signal, TrackerConfig, WorkCompletion};
use selsig_verbs::sys::ibv_wc;

/// Work requests per measured iteration.
const BATCH: u64 = 4096;
/// Send-queue depth (a typical `max_send_wr`).
const DEPTH: u32 = 256;

fn batch_from_ibv_wc(c: &mut Criterion) {
    let mut group = c.benchmark_group("batch_from_ibv_wc");
    group.throughput(Throughput::Elements(BATCH));
    for every in [1u32, 16, 64] {
        group.bench_with_input(BenchmarkId::new("every", every), &every, |b, &every| {
            let config = TrackerConfig::new(DEPTH, DEPTH).policy(Policy::Every(every));
            let mut tracker: SendTracker<u64> =
                SendTracker::new(config, Instant::now()).expect("valid config");
            let mut wcs = vec![ibv_wc::default(); DEPTH as usize];
            b.iter(|| {
                let mut sum = 0u64;
                let mut done = 0u64;
                while done < BATCH {
                    let want = (BATCH - done).min(u64::from(DEPTH)) as usize;
                    let first = done;
                    let now = Instant::now();
                    let mut k = 0;
                    let payloads = (0..want).map(|i| first + i as u64);
                    let _ = tracker.post_batch(payloads, Signal::Auto, now, |p| {
                        done += 1;
                        if p.signaled() {
                            wcs[k] = ibv_wc {
                                wr_id: p.wr_id,
                                ..ibv_wc::default()
                            };
                            k += 1;
                        }
                    });
                    for wc in &wcs[..k] {
                        let _ = tracker.handle_completion(&WorkCompletion::from(wc), now);
                    }
                    tracker.poll_completed_with(usize::MAX, |p| sum = sum.wrapping_add(p));
                }
                black_box(sum)
            });
        });
    }
    group.finish();
}

criterion_group!(benches, batch_from_ibv_wc);
criterion_main!(benches);
