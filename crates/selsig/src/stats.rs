//! Counters and histograms of one send queue.

use hdrhistogram::Histogram;

/// Highest confirmation lag the histogram resolves (one hour, in nanoseconds); longer lags
/// are counted at this value.
pub const MAX_LAG_NS: u64 = 3_600_000_000_000;

/// What a [`SendTracker`](crate::SendTracker) has seen: counts of work requests and
/// completions, work requests retired per completion and confirmation lag.
///
/// Counts are of the caller's work requests; the zero-length markers the tracker asks for
/// (`confirm_all`, drain) are counted in [`markers`](Self::markers) only.
#[derive(Debug, Clone)]
pub struct Stats {
    /// Work requests posted (and not handed back by a rollback).
    pub posted: u64,
    /// Of those, signaled, for any reason.
    pub signaled: u64,
    /// Signaled because the caller asked for it.
    pub requested: u64,
    /// Signaled against the policy to keep the queue from deadlocking (a run as long as the
    /// queue) or to keep a shared CQ pool from running dry.
    pub forced: u64,
    /// Zero-length signaled markers posted by `confirm_all` and drains.
    pub markers: u64,
    /// Completions handled (accepted), of every kind.
    pub cqes: u64,
    /// Successful completions handled.
    pub success_cqes: u64,
    /// Error completions handled (not counting flushes).
    pub error_cqes: u64,
    /// Flush completions (`IBV_WC_WR_FLUSH_ERR`) handled.
    pub flush_cqes: u64,
    /// Completions refused as impossible (wrong QP, unknown or retired id, out of order,
    /// a success for an unsignaled work request or after an error).
    pub rejected_cqes: u64,
    /// Work requests retired as completed.
    pub completed: u64,
    /// Work requests retired as failed.
    pub failed: u64,
    /// Work requests retired as flushed.
    pub flushed: u64,
    /// Work requests retired with an unknown outcome: the device was lost
    /// ([`Outcome::DeviceLost`](crate::Outcome::DeviceLost)).
    pub lost: u64,
    /// Work requests retired by each completion (a completion that retires more than
    /// 2^20, which no NIC's queue holds, is recorded as 2^20: [`retired`](Self::retired)
    /// counts them all).
    pub wrs_per_cqe: Histogram<u64>,
    /// Confirmation lag: nanoseconds from a work request's post to the completion that
    /// retired it (a lag beyond an hour is recorded as an hour).
    pub lag_ns: Histogram<u64>,
}

impl Stats {
    pub(crate) fn new() -> Self {
        Stats {
            posted: 0,
            signaled: 0,
            requested: 0,
            forced: 0,
            markers: 0,
            cqes: 0,
            success_cqes: 0,
            error_cqes: 0,
            flush_cqes: 0,
            rejected_cqes: 0,
            completed: 0,
            failed: 0,
            flushed: 0,
            lost: 0,
            wrs_per_cqe: new_histogram(1 << 20),
            lag_ns: new_histogram(MAX_LAG_NS),
        }
    }

    /// Work requests retired, whatever their outcome (saturating, as [`merge`](Self::merge)
    /// does).
    pub fn retired(&self) -> u64 {
        self.completed
            .saturating_add(self.failed)
            .saturating_add(self.flushed)
            .saturating_add(self.lost)
    }

    /// Mean work requests retired per completion handled.
    pub fn mean_wrs_per_cqe(&self) -> f64 {
        if self.cqes == 0 {
            0.0
        } else {
            self.retired() as f64 / self.cqes as f64
        }
    }

    /// Completions per 1000 work requests posted (signaled ones and markers; errors and
    /// flushes add to the completions actually seen, see [`cqes`](Self::cqes)).
    pub fn signaled_per_1000(&self) -> f64 {
        if self.posted == 0 {
            0.0
        } else {
            (self.signaled as f64 + self.markers as f64) * 1000.0 / self.posted as f64
        }
    }

    /// Adds another queue's statistics to these (counts saturate).
    pub fn merge(&mut self, other: &Stats) {
        self.posted = self.posted.saturating_add(other.posted);
        self.signaled = self.signaled.saturating_add(other.signaled);
        self.requested = self.requested.saturating_add(other.requested);
        self.forced = self.forced.saturating_add(other.forced);
        self.markers = self.markers.saturating_add(other.markers);
        self.cqes = self.cqes.saturating_add(other.cqes);
        self.success_cqes = self.success_cqes.saturating_add(other.success_cqes);
        self.error_cqes = self.error_cqes.saturating_add(other.error_cqes);
        self.flush_cqes = self.flush_cqes.saturating_add(other.flush_cqes);
        self.rejected_cqes = self.rejected_cqes.saturating_add(other.rejected_cqes);
        self.completed = self.completed.saturating_add(other.completed);
        self.failed = self.failed.saturating_add(other.failed);
        self.flushed = self.flushed.saturating_add(other.flushed);
        self.lost = self.lost.saturating_add(other.lost);
        // Both histograms have the same bounds, so adding cannot fail.
        let _ = self.wrs_per_cqe.add(&other.wrs_per_cqe);
        let _ = self.lag_ns.add(&other.lag_ns);
    }
}

impl Default for Stats {
    fn default() -> Self {
        Stats::new()
    }
}

fn new_histogram(max: u64) -> Histogram<u64> {
    // Two significant digits: 1% resolution, a few tens of KiB per histogram. The bounds
    // are constants above 2 and the precision is in 0..=5, which hdrhistogram accepts.
    Histogram::new_with_max(max, 2).expect("constant histogram bounds are valid")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_figures_count_every_outcome_and_marker() {
        let mut s = Stats::new();
        (s.completed, s.failed, s.flushed, s.cqes) = (1, 2, 4, 2);
        assert_eq!(s.retired(), 7);
        assert_eq!(s.mean_wrs_per_cqe(), 3.5);
        (s.posted, s.signaled, s.markers) = (1000, 10, 2);
        assert_eq!(s.signaled_per_1000(), 12.0);
        assert_eq!(Stats::new().mean_wrs_per_cqe(), 0.0);
        assert_eq!(Stats::new().signaled_per_1000(), 0.0);
        // Merged counts saturate; what is derived from them does too, without overflow.
        (s.completed, s.signaled, s.markers) = (u64::MAX, u64::MAX, u64::MAX);
        assert_eq!(s.retired(), u64::MAX);
        assert!(s.signaled_per_1000() > 1e16);
    }

    #[test]
    fn the_histograms_hold_what_they_promise() {
        let mut s = Stats::new();
        assert_eq!(s.lag_ns.sigfig(), 2);
        // A lag of an hour is resolved, not clamped below it.
        let hour = 3_600_000_000_000;
        s.lag_ns.saturating_record(hour);
        assert!(s.lag_ns.equivalent(s.lag_ns.max(), hour));
        // A completion may retire a million work requests.
        s.wrs_per_cqe.saturating_record(1 << 20);
        assert!(s.wrs_per_cqe.equivalent(s.wrs_per_cqe.max(), 1 << 20));
    }

    #[test]
    fn merging_adds_every_field() {
        let mut b = Stats::new();
        (b.posted, b.signaled, b.requested, b.forced, b.markers) = (1, 2, 3, 4, 5);
        (b.cqes, b.success_cqes, b.error_cqes, b.flush_cqes) = (6, 7, 8, 9);
        (b.rejected_cqes, b.completed, b.failed, b.flushed) = (10, 11, 12, 13);
        b.lag_ns.saturating_record(1000);
        b.wrs_per_cqe.saturating_record(3);
        let mut a = Stats::new();
        a.merge(&b);
        a.merge(&b);
        let counts = |s: &Stats| {
            [
                s.posted,
                s.signaled,
                s.requested,
                s.forced,
                s.markers,
                s.cqes,
                s.success_cqes,
                s.error_cqes,
                s.flush_cqes,
                s.rejected_cqes,
                s.completed,
                s.failed,
                s.flushed,
            ]
        };
        assert_eq!(counts(&a), counts(&b).map(|n| 2 * n));
        assert_eq!((a.lag_ns.len(), a.wrs_per_cqe.len()), (2, 2));
        assert!(a.lag_ns.equivalent(a.lag_ns.max(), 1000));
    }

    #[test]
    fn merging_adds_and_saturates() {
        let mut a = Stats::new();
        let mut b = Stats::new();
        (a.posted, a.cqes) = (u64::MAX, 2);
        (b.posted, b.cqes) = (1, 3);
        b.wrs_per_cqe.saturating_record(4);
        a.merge(&b);
        assert_eq!((a.posted, a.cqes), (u64::MAX, 5));
        assert_eq!(a.wrs_per_cqe.len(), 1);
    }
}
