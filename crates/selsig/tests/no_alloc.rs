//! Zero heap allocations per work request in steady state: a million work requests through
//! the tracker (posted one by one and in batches, every completion handled, every payload
//! collected) allocate nothing once the tracker is made. A global allocator counts.
//! (One test in this binary: the count is process-wide.)

use selsig_testkit::alloc::{Counting, allocations};
use std::time::Instant;

use selsig::{Policy, SendTracker, Signal, TrackerConfig, WcStatus, WorkCompletion};

#[global_allocator]
static GLOBAL: Counting = Counting;

const DEPTH: u32 = 256;
const WRS: u64 = 1_000_000;

/// Posts `WRS` work requests (one by one, or in batches of up to 32), hands the tracker a
/// completion for each signaled one, and collects every payload.
fn stream(tracker: &mut SendTracker<u64>, batches: bool, signaled: &mut Vec<u64>) -> u64 {
    let (mut posted, mut sum) = (0u64, 0u64);
    while posted < WRS {
        let now = Instant::now();
        if batches {
            let n = (WRS - posted).min(32).min(u64::from(tracker.available()));
            let payloads = (0..n as usize).map(|i| posted + i as u64);
            let _ = tracker.post_batch(payloads, Signal::Auto, now, |p| {
                if p.signaled() {
                    signaled.push(p.wr_id);
                }
            });
            posted += n;
        } else {
            while posted < WRS {
                match tracker.post(posted, Signal::Auto, now) {
                    Ok(p) => {
                        posted += 1;
                        if p.signaled() {
                            signaled.push(p.wr_id);
                        }
                    }
                    Err(_) => break,
                }
            }
        }
        for wr_id in signaled.drain(..) {
            let wc = WorkCompletion::new(wr_id, WcStatus::Success, 0);
            tracker
                .handle_completion(&wc, now)
                .expect("a signaled work request's completion");
        }
        tracker.poll_retired_with(|r| sum = sum.wrapping_add(r.payload));
    }
    sum
}

#[test]
fn a_million_work_requests_through_the_tracker_allocate_nothing() {
    for (every, batches) in [(1, false), (64, false), (1, true), (64, true)] {
        let config = TrackerConfig::new(DEPTH, DEPTH).policy(Policy::Every(every));
        let mut tracker: SendTracker<u64> = SendTracker::new(config, Instant::now()).unwrap();
        let mut signaled = Vec::with_capacity(DEPTH as usize);
        // Warm up: the lag histogram's buckets, the rings at their size.
        stream(&mut tracker, batches, &mut signaled);
        let before = allocations();
        let sum = stream(&mut tracker, batches, &mut signaled);
        let allocations = allocations() - before;
        assert_eq!(sum, WRS * (WRS - 1) / 2, "every payload back once");
        assert_eq!(
            allocations, 0,
            "every {every}, batches {batches}: {allocations} allocations for {WRS} work requests"
        );
        assert_eq!(tracker.stats().posted, 2 * WRS);
    }
}
