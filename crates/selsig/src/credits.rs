//! Completion-queue credits: room for every completion that may still arrive.
//!
//! A work request can produce at most one completion, but it *may* produce one even when
//! unsignaled (errors and flushes always do). So every outstanding work request holds one
//! credit of the completion queue it reports to, from its post until it is retired. A
//! completion queue shared by several send queues (or with receive queues) shares one
//! pool: [`CqCredits`].

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

/// A pool of completion-queue slots shared by every queue that reports to one CQ.
///
/// Cloning gives another handle to the same pool. The pool is thread-safe; taking or
/// returning credits is one atomic operation.
#[derive(Debug, Clone)]
pub struct CqCredits {
    inner: Arc<Pool>,
}

#[derive(Debug)]
struct Pool {
    capacity: u32,
    free: AtomicU32,
}

impl CqCredits {
    /// A pool of `capacity` credits: at most the completions the completion queue holds
    /// (the real size read back from its creation), less the room receive completions
    /// that go to it need (see [`SharedCq::with_credits`](crate::SharedCq::with_credits)).
    pub fn new(capacity: u32) -> Self {
        CqCredits {
            inner: Arc::new(Pool {
                capacity,
                free: AtomicU32::new(capacity),
            }),
        }
    }

    /// The pool's credits in all.
    pub fn capacity(&self) -> u32 {
        self.inner.capacity
    }

    /// The pool's identity: the same for every handle to it, while one lives.
    pub(crate) fn id(&self) -> usize {
        Arc::as_ptr(&self.inner) as usize
    }

    /// Credits not held by anyone now.
    pub fn available(&self) -> u32 {
        self.inner.free.load(Ordering::Acquire)
    }

    /// Takes `n` credits if that many are free; returns how many stay free afterwards.
    pub fn try_acquire(&self, n: u32) -> Option<u32> {
        self.inner
            .free
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |free| {
                free.checked_sub(n)
            })
            .ok()
            .map(|before| before - n)
    }

    /// Returns `n` credits taken with [`try_acquire`](Self::try_acquire).
    ///
    /// Returning more than was taken is a bug of the caller; the pool never grows past its
    /// capacity (the excess is ignored, and `false` is returned).
    pub fn release(&self, n: u32) -> bool {
        let capacity = self.inner.capacity;
        let result = self
            .inner
            .free
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |free| {
                Some(free.saturating_add(n).min(capacity))
            });
        // fetch_update with a closure that always returns Some cannot fail.
        matches!(result, Ok(before) if before.checked_add(n).is_some_and(|after| after <= capacity))
    }

    /// `true` when both handles belong to the same pool.
    pub fn same_pool(&self, other: &CqCredits) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

/// The completion-queue budget of one send queue.
#[derive(Debug, Clone)]
pub enum CqBudget {
    /// The send queue reports to a CQ of its own with this many slots.
    Exclusive(u32),
    /// The send queue shares its CQ through a pool of credits.
    Shared(CqCredits),
}

impl CqBudget {
    /// The size of the completion queue behind the budget.
    pub fn capacity(&self) -> u32 {
        match self {
            CqBudget::Exclusive(n) => *n,
            CqBudget::Shared(pool) => pool.capacity(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acquire_and_release() {
        let pool = CqCredits::new(4);
        let other = pool.clone();
        assert!(pool.same_pool(&other));
        assert_eq!(pool.try_acquire(3), Some(1));
        assert_eq!(other.try_acquire(2), None);
        assert_eq!(other.try_acquire(1), Some(0));
        assert_eq!(pool.available(), 0);
        assert!(pool.release(4));
        assert_eq!(other.available(), 4);
        assert!(!pool.release(1), "over-release is reported");
        assert_eq!(pool.available(), 4, "and never grows the pool");
    }

    #[test]
    fn pools_are_told_apart_and_a_budget_is_the_cq_size() {
        let (a, b) = (CqCredits::new(4), CqCredits::new(4));
        assert!(!a.same_pool(&b));
        assert_ne!(a.id(), b.id(), "two pools of one size");
        assert_eq!(a.id(), a.clone().id());
        assert_eq!(a.try_acquire(3), Some(1));
        assert_eq!(
            CqBudget::Shared(a.clone()).capacity(),
            4,
            "the CQ's size, not what is free"
        );
        assert_eq!(CqBudget::Exclusive(6).capacity(), 6);
        // Returning far more than was taken neither wraps nor grows the pool.
        assert!(!a.release(u32::MAX));
        assert_eq!(a.available(), 4);
    }

    #[test]
    fn concurrent_use_never_loses_credits() {
        let pool = CqCredits::new(8);
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let pool = pool.clone();
                std::thread::spawn(move || {
                    for _ in 0..10_000 {
                        if pool.try_acquire(1).is_some() {
                            assert!(pool.release(1));
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("thread panicked");
        }
        assert_eq!(pool.available(), 8);
    }
}
