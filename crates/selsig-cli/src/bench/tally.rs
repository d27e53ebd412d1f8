//! What a point keeps of the WRITEs it gets back: their buffers, the confirmation lag, the
//! first failure.

use std::collections::VecDeque;
use std::time::Instant;

use hdrhistogram::Histogram;
use selsig::{Buffer, Outcome};

use crate::bench::report::new_histogram;

/// What the bench keeps of the WRITEs it gets back: their buffers for reuse, the
/// confirmation lag, and the first that did not complete.
///
/// Post times are kept per post (a batch shares one clock reading), by sequence number,
/// not with each WRITE: the queue's context is `()`, so nothing is carried per WRITE
/// beyond its buffer.
pub(crate) struct Tally<M> {
    pub(crate) free: Vec<Buffer<M>>,
    pub(crate) lag: Histogram<u64>,
    /// Whether lag is measured (not in perftest mode).
    timed: bool,
    /// Of each post not yet fully retired, oldest first: the sequence number after its
    /// last WRITE, and its time.
    posts: VecDeque<(u64, Instant)>,
    /// The post of the current run of retired WRITEs: where it ends, its time, how many
    /// of its WRITEs the run has, and when the poll that retired them saw them.
    run_end: u64,
    run_posted: Instant,
    run_len: u64,
    seen: Instant,
    pub(crate) retired: u64,
    pub(crate) failed: Option<(u64, Outcome)>,
}

impl<M> Tally<M> {
    pub(crate) fn new(timed: bool, free: Vec<Buffer<M>>, depth: usize) -> Self {
        let now = Instant::now();
        Tally {
            free,
            lag: new_histogram(),
            timed,
            posts: VecDeque::with_capacity(depth + 1),
            run_end: 0,
            run_posted: now,
            run_len: 0,
            seen: now,
            retired: 0,
            failed: None,
        }
    }

    /// WRITEs up to sequence number `end` (exclusive) were posted at `at`.
    pub(crate) fn posted(&mut self, end: u64, at: Instant) {
        if self.timed {
            self.posts.push_back((end, at));
        }
    }

    /// A WRITE retired by a poll that saw it at `now`; returns its post time (when timed).
    #[inline(always)]
    pub(crate) fn take(&mut self, c: selsig::Completion<M, ()>, now: Instant) -> Instant {
        if c.outcome != Outcome::Completed && self.failed.is_none() {
            self.failed = Some((c.seq.0, c.outcome));
        }
        if let Some(buf) = c.buffer {
            self.free.push(buf);
        }
        self.retired += 1;
        if !self.timed {
            return now;
        }
        // A post shares one time: record its lags as one run.
        if c.seq.0 < self.run_end {
            self.run_len += 1;
        } else {
            self.end_poll();
            // WRITEs retire in posting order: the posts before this one's are done.
            while let Some(&(end, at)) = self.posts.front() {
                if c.seq.0 < end {
                    (self.run_end, self.run_posted) = (end, at);
                    break;
                }
                self.posts.pop_front();
            }
            self.run_len = 1;
        }
        self.seen = now;
        self.run_posted
    }

    /// Records the lag of the last run.
    pub(crate) fn end_poll(&mut self) {
        if self.run_len > 0 && self.timed {
            let ns = self
                .seen
                .saturating_duration_since(self.run_posted)
                .as_nanos() as u64;
            self.lag.saturating_record_n(ns, self.run_len);
        }
        self.run_len = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// The first WRITE that did not complete is the one a point reports, not a later one
    /// flushed behind it.
    #[test]
    fn the_tally_keeps_the_first_failure() {
        let now = Instant::now();
        let mut tally: Tally<()> = Tally::new(true, Vec::new(), 8);
        tally.posted(7, now);
        let done = |seq, outcome| selsig::Completion {
            seq: selsig::Seq(seq),
            buffer: None,
            list: None,
            user: (),
            outcome,
            signaled: false,
        };
        tally.take(done(4, Outcome::Completed), now);
        tally.take(
            done(5, Outcome::Failed(selsig::WcStatus::RemAccessErr)),
            now,
        );
        tally.take(done(6, Outcome::Flushed), now);
        tally.end_poll();
        assert_eq!(
            tally.failed,
            Some((5, Outcome::Failed(selsig::WcStatus::RemAccessErr)))
        );
        assert_eq!(tally.retired, 3);
        assert_eq!(tally.lag.len(), 3);
    }

    /// Each WRITE's lag runs from the post it went out in, whichever poll retires it; a
    /// marker's sequence number between posts (never handed back) is skipped.
    #[test]
    fn the_tally_times_each_write_from_its_post() {
        let t0 = Instant::now();
        let (t1, seen) = (
            t0 + Duration::from_micros(10),
            t0 + Duration::from_micros(50),
        );
        let mut tally: Tally<()> = Tally::new(true, Vec::new(), 8);
        // WRITEs 0..3 at t0, a marker 3, WRITEs 4..6 at t1.
        tally.posted(3, t0);
        tally.posted(6, t1);
        let done = |seq| selsig::Completion {
            seq: selsig::Seq(seq),
            buffer: None,
            list: None,
            user: (),
            outcome: Outcome::Completed,
            signaled: false,
        };
        assert_eq!(tally.take(done(0), seen), t0);
        assert_eq!(tally.take(done(1), seen), t0);
        tally.end_poll();
        assert_eq!(tally.take(done(2), seen), t0);
        assert_eq!(tally.take(done(4), seen), t1);
        assert_eq!(tally.take(done(5), seen), t1);
        tally.end_poll();
        assert_eq!(tally.retired, 5);
        assert_eq!(tally.lag.len(), 5);
        assert_eq!(tally.lag.count_between(49_000, 50_999), 3, "posted at t0");
        assert_eq!(tally.lag.count_between(39_000, 40_999), 2, "posted at t1");
        assert!(tally.posts.len() <= 1, "retired posts are let go");
    }
}
