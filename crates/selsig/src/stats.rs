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
    /// Completions refused as impossible (wrong QP, unknown or retired id, out of order).
    pub rejected_cqes: u64,
    /// Work requests retired as completed.
    pub completed: u64,
    /// Work requests retired as failed.
    pub failed: u64,
    /// Work requests retired as flushed.
    pub flushed: u64,
    /// Work requests retired by each completion.
    pub wrs_per_cqe: Histogram<u64>,
    /// Confirmation lag: nanoseconds from a work request's post to the completion that
    /// retired it.
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
            wrs_per_cqe: new_histogram(1 << 20),
            lag_ns: new_histogram(MAX_LAG_NS),
        }
    }

    /// Work requests retired, whatever their outcome.
    pub fn retired(&self) -> u64 {
        self.completed + self.failed + self.flushed
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
            (self.signaled + self.markers) as f64 * 1000.0 / self.posted as f64
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
