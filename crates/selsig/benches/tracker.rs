//! Cost of the tracker per work request: post, then handle the completions of the
//! signaled ones and collect every retired work request, for several signal intervals.
//!
//! The provider is not involved: this is the bookkeeping selsig adds to each work request.
//! `post_and_retire` reads the clock once per round (fill the queue, then handle the
//! completions), as a driver does; `distinct_timestamps` gives every work request its own
//! instant, the worst case for the lag histogram.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use selsig::{Policy, SendTracker, Signal, TrackerConfig, WcStatus, WorkCompletion};

/// Work requests per measured iteration.
const BATCH: u64 = 4096;
/// Send-queue depth (a typical `max_send_wr`).
const DEPTH: u32 = 256;

fn post_and_retire(c: &mut Criterion) {
    bench(c, "post_and_retire", false);
}

fn distinct_timestamps(c: &mut Criterion) {
    bench(c, "distinct_timestamps", true);
}

fn bench(c: &mut Criterion, name: &str, per_wr_instant: bool) {
    let mut group = c.benchmark_group(name);
    group.throughput(Throughput::Elements(BATCH));
    let start = Instant::now();
    let instants: Vec<Instant> = (0..BATCH)
        .map(|i| start + Duration::from_nanos(i * 7))
        .collect();
    for every in [1u32, 16, 64] {
        group.bench_with_input(BenchmarkId::new("every", every), &every, |b, &every| {
            let now = Instant::now();
            let config = TrackerConfig::new(DEPTH, DEPTH).policy(Policy::Every(every));
            let mut tracker: SendTracker<u64> =
                SendTracker::new(config, now).expect("valid config");
            let mut signaled: Vec<u64> = Vec::with_capacity(DEPTH as usize);
            b.iter(|| {
                let mut sum = 0u64;
                let mut posted = 0u64;
                while posted < BATCH {
                    // Fill the queue like an application that posts until full, then polls.
                    let now = Instant::now();
                    while posted < BATCH {
                        let at = if per_wr_instant {
                            instants[posted as usize]
                        } else {
                            now
                        };
                        match tracker.post(posted, Signal::Auto, at) {
                            Ok(p) => {
                                posted += 1;
                                if p.signaled() {
                                    signaled.push(p.wr_id);
                                }
                            }
                            Err(_) => break,
                        }
                    }
                    for &seq in &signaled {
                        let wc = WorkCompletion::new(seq, WcStatus::Success, 0);
                        if tracker.handle_completion(&wc, now).is_ok() {
                            while let Some(r) = tracker.poll_retired() {
                                sum = sum.wrapping_add(r.payload);
                            }
                        }
                    }
                    signaled.clear();
                }
                black_box(sum)
            });
        });
    }
    group.finish();
}

/// The stream of `post_and_retire` in batch calls, as libselsig's C benchmark makes them
/// (`crates/selsig-capi/benches/post_retire.c`): `post_batch` of up to 256 until the queue
/// is full, every completion of the batch handed over, the retired ones collected in one
/// pass. The C benchmark's figure less this one is what crossing the C boundary costs.
fn post_batch_and_retire(c: &mut Criterion) {
    batch_stream(c, "post_batch_and_retire", true, |tracker, sum| {
        tracker.poll_retired_with(|r| *sum = sum.wrapping_add(r.payload))
    });
}

/// [`post_batch_and_retire`] with the confirmation-lag histogram off
/// (`TrackerConfig::measure_lag(false)`): the clock is not read, no lag is recorded. The
/// difference is what the histogram costs.
fn post_batch_no_lag(c: &mut Criterion) {
    batch_stream(c, "post_batch_no_lag", false, |tracker, sum| {
        tracker.poll_retired_with(|r| *sum = sum.wrapping_add(r.payload))
    });
}

/// [`post_batch_and_retire`] collecting with `poll_completed_with`, the payloads of the
/// work requests that completed (all of them here), as the C benchmark's
/// `selsig_tracker_poll_completed` does.
fn post_batch_and_complete(c: &mut Criterion) {
    batch_stream(c, "post_batch_and_complete", true, |tracker, sum| {
        tracker.poll_completed_with(usize::MAX, |p| *sum = sum.wrapping_add(p));
    });
}

/// The stream of [`post_batch_and_retire`], the lag measured or not (`lag`), its retired
/// work requests collected by `collect` (which adds their payloads to the sum).
fn batch_stream(
    c: &mut Criterion,
    name: &str,
    lag: bool,
    collect: fn(&mut SendTracker<u64>, &mut u64),
) {
    let mut group = c.benchmark_group(name);
    group.throughput(Throughput::Elements(BATCH));
    for every in [1u32, 16, 64] {
        group.bench_with_input(BenchmarkId::new("every", every), &every, |b, &every| {
            let config = TrackerConfig::new(DEPTH, DEPTH)
                .policy(Policy::Every(every))
                .measure_lag(lag);
            let mut tracker: SendTracker<u64> =
                SendTracker::new(config, Instant::now()).expect("valid config");
            let mut signaled: Vec<u64> = Vec::with_capacity(DEPTH as usize);
            b.iter(|| {
                let mut sum = 0u64;
                let mut done = 0u64;
                while done < BATCH {
                    let want = (BATCH - done).min(u64::from(DEPTH)) as usize;
                    let first = done;
                    let now = Instant::now();
                    let payloads = (0..want).map(|i| first + i as u64);
                    let _ = tracker.post_batch(payloads, Signal::Auto, now, |p| {
                        done += 1;
                        if p.signaled() {
                            signaled.push(p.wr_id);
                        }
                    });
                    for &wr_id in &signaled {
                        let wc = WorkCompletion::new(wr_id, WcStatus::Success, 0);
                        let _ = tracker.handle_completion(&wc, now);
                    }
                    signaled.clear();
                    collect(&mut tracker, &mut sum);
                }
                black_box(sum)
            });
        });
    }
    group.finish();
}

criterion_group!(
    benches,
    post_and_retire,
    distinct_timestamps,
    post_batch_and_retire,
    post_batch_and_complete,
    post_batch_no_lag
);
criterion_main!(benches);
