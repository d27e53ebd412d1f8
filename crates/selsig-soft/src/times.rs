//! When the NIC finished each send work request: what a real NIC never tells (an
//! unsignaled work request produces nothing), recorded so that benchmarks can measure how
//! much later the application learns of a completion than the NIC knew it.
//!
//! One record per send-queue slot, written by the NIC thread: the clock is read before
//! each completion is written, after a work request that brings the bytes moved since the
//! last reading to 16 KiB, and at the end of each fetch group; every work request executed
//! since the last reading gets the new one (an upper bound of its own finish, never later
//! than the completion that covers it). A record is kept until the slot's next work
//! request executes, and carries the work request's index, so a reader never takes a
//! newer work request's time for an older one's.

use std::time::{Duration, Instant};

use crate::sync::{AtomicBool, AtomicU64, Ordering, fence};

#[derive(Debug)]
struct Record {
    /// The work request's index + 1; 0 for none.
    tag: AtomicU64,
    /// Nanoseconds from the epoch to the end of its execution.
    ns: AtomicU64,
}

/// The execution times of one send queue.
#[derive(Debug)]
pub(crate) struct ExecTimes {
    on: AtomicBool,
    epoch: Instant,
    records: Box<[Record]>,
    mask: u64,
}

impl ExecTimes {
    /// Records for a ring of `slots` slots (a power of two).
    pub(crate) fn new(slots: usize) -> Self {
        debug_assert!(slots.is_power_of_two());
        ExecTimes {
            on: AtomicBool::new(false),
            epoch: Instant::now(),
            records: (0..slots)
                .map(|_| Record {
                    tag: AtomicU64::new(0),
                    ns: AtomicU64::new(0),
                })
                .collect(),
            mask: slots as u64 - 1,
        }
    }

    #[cfg_attr(loom, allow(dead_code))]
    pub(crate) fn set(&self, on: bool) {
        self.on.store(on, Ordering::Relaxed);
    }

    /// Whether the NIC records (one relaxed load per fetch group).
    #[inline]
    #[cfg_attr(loom, allow(dead_code))]
    pub(crate) fn on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    /// NIC: the work requests `from..to` finished now.
    #[cfg_attr(loom, allow(dead_code))]
    pub(crate) fn stamp(&self, from: u64, to: u64) {
        self.stamp_at(from, to, self.epoch.elapsed().as_nanos() as u64);
    }

    /// NIC: the work requests `from..to` finished `ns` nanoseconds after the epoch.
    fn stamp_at(&self, from: u64, to: u64, ns: u64) {
        for index in from..to {
            let r = &self.records[(index & self.mask) as usize];
            // Invalidate, write, publish: a reader that sees the tag before and after its
            // read of `ns` read this work request's time (a seqlock of one writer).
            r.tag.store(0, Ordering::Relaxed);
            fence(Ordering::Release);
            r.ns.store(ns, Ordering::Relaxed);
            r.tag.store(index + 1, Ordering::Release);
        }
    }

    /// When work request `index` finished, if its record is still held.
    pub(crate) fn get(&self, index: u64) -> Option<Instant> {
        let r = &self.records[(index & self.mask) as usize];
        let want = index.checked_add(1)?;
        if r.tag.load(Ordering::Acquire) != want {
            return None;
        }
        let ns = r.ns.load(Ordering::Relaxed);
        fence(Ordering::Acquire);
        if r.tag.load(Ordering::Relaxed) != want {
            return None;
        }
        Some(self.epoch + Duration::from_nanos(ns))
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_record_answers_for_its_own_work_request_only() {
        let t = ExecTimes::new(4);
        assert_eq!(t.get(0), None, "nothing executed yet");
        // No record answers for the last index (its tag, index + 1, would be the empty
        // record's 0), nor is anything stamped by an empty range.
        assert_eq!(t.get(u64::MAX), None);
        t.stamp(0, 0);
        assert_eq!(t.get(0), None, "an empty range stamped 0");
        let before = Instant::now();
        t.stamp(0, 3);
        let after = Instant::now();
        for i in 0..3 {
            let at = t.get(i).expect("recorded");
            assert!(before <= at && at <= after, "{i}: {at:?}");
        }
        assert_eq!(t.get(3), None, "not executed");
        t.stamp(3, 6); // slots 3, 0, 1 reused by 3, 4, 5
        assert_eq!(t.get(0), None, "slot reused by 4");
        assert_eq!(t.get(1), None, "slot reused by 5");
        assert!(t.get(2).is_some(), "slot 2 still holds 2");
        assert!(t.get(4).is_some() && t.get(5).is_some());
        assert!(t.get(2).unwrap() <= t.get(5).unwrap());
        assert_eq!(t.get(u64::MAX), None);
    }
}

/// The seqlock under every interleaving `loom` finds: the NIC thread stamps a work request
/// and then the next one that uses its slot, while the application reads both records.
/// `RUSTFLAGS="--cfg loom" cargo test -p selsig-soft --release --lib loom`.
#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::Arc;
    use loom::thread;

    /// A reader gets a work request's own time or nothing: never the time of the work
    /// request that reused its slot, never a time of a record being rewritten.
    #[test]
    fn loom_a_reader_never_takes_another_work_requests_time() {
        loom::model(|| {
            // Two slots: work requests 0 and 2 share slot 0.
            let t = Arc::new(ExecTimes::new(2));
            let nic = {
                let t = Arc::clone(&t);
                thread::spawn(move || {
                    t.stamp_at(0, 1, 10);
                    t.stamp_at(2, 3, 20);
                })
            };
            let at = |ns| Some(t.epoch + Duration::from_nanos(ns));
            let first = t.get(0);
            assert!(
                first.is_none() || first == at(10),
                "work request 0: {first:?}"
            );
            let second = t.get(2);
            assert!(
                second.is_none() || second == at(20),
                "work request 2: {second:?}"
            );
            nic.join().expect("the NIC thread");
            assert_eq!(t.get(0), None, "slot 0 holds work request 2 now");
            assert_eq!(t.get(2), at(20));
        });
    }
}
