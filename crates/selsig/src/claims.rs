//! The process-wide registry of claims on completion queues: what the queues on each CQ
//! take of it (a budget, a shared pool, the CQ whole), the receive slots that report to
//! it, and what queues dropped from it left there. A [`SignaledQueue`](crate::SignaledQueue)
//! takes a claim when it is made and gives it up when dropped; the registry refuses claims
//! that could overrun the CQ.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError, Weak};

use crate::credits::{CqBudget, CqCredits};
use crate::provider::CompletionQueue;
use crate::tracker::ConfigError;

/// What the queues on one CQ take of it, and what queues dropped from it left there.
struct CqEntry {
    /// The CQ (a weak handle keeps its address from being reused while the entry lives;
    /// an entry whose CQ is gone is removed).
    cq: Weak<dyn CompletionQueue>,
    /// A queue took it whole (created without a budget).
    whole: bool,
    /// The exclusive budgets of the queues on it.
    exclusive: u64,
    /// The pools queues on it take credits from, each counted once: its capacity while a
    /// queue takes from it; once none does, the credits still taken (those of work
    /// requests of dropped queues, whose completions may still be in the CQ, until the
    /// caller gives them back).
    pools: Vec<PoolClaim>,
    /// The receive slots of the queues' QPs whose receive completions go to the CQ.
    receives: u64,
    /// Completions that queues dropped from it may have left in it: their QPs were
    /// destroyed by a provider that leaves a QP's completions in its CQ (rxe), with work
    /// outstanding (beside a pool's, whose credits count them) or receive slots reporting
    /// there. Nothing says when they are gone: they stay counted while the CQ lives.
    left: u64,
    /// Of each QP number whose queue was dropped while its completions could still come:
    /// the sequence number that queue would have used next. A new queue on a QP with that
    /// number starts there, so that the old completions retire none of its work requests.
    next_seq: HashMap<u32, u64>,
    /// The [`SharedCq`] that polls the CQ for the queues on it ([`SharedCq::id`]), and how
    /// many they are.
    polled_by: Option<(usize, u32)>,
    /// The queues with budgets that poll the CQ themselves.
    polling: u32,
}

struct PoolClaim {
    credits: CqCredits,
    queues: u32,
}

impl CqEntry {
    /// Taken by the queues on the CQ and the receives of their QPs.
    fn live(&self) -> u64 {
        let pools = self.pools.iter().filter(|p| p.queues > 0);
        self.exclusive + self.receives + pools.map(|p| u64::from(p.credits.capacity())).sum::<u64>()
    }

    /// Taken by what dropped queues may have left in the CQ.
    fn residue(&self) -> u64 {
        let pools = self.pools.iter().filter(|p| p.queues == 0);
        self.left
            + pools
                .map(|p| u64::from(p.credits.capacity() - p.credits.available()))
                .sum::<u64>()
    }

    fn has_queues(&self) -> bool {
        self.whole || self.exclusive > 0 || self.pools.iter().any(|p| p.queues > 0)
    }

    /// Nothing to remember: no queue on the CQ, nothing left in it.
    fn is_empty(&self) -> bool {
        !self.has_queues() && self.residue() == 0 && self.receives == 0 && self.next_seq.is_empty()
    }
}

/// The CQs queues report to, by address (while an entry holds its weak handle, the
/// address names that CQ).
static CQ_CLAIMS: Mutex<BTreeMap<usize, CqEntry>> = Mutex::new(BTreeMap::new());

/// What one queue's claim holds, to give back.
enum Share {
    Whole,
    Exclusive(u32),
    Pool(usize),
}

/// What a dropped queue may leave in its CQ (its QP destroyed with its completions left
/// there).
struct Leaving {
    qp_num: u32,
    /// The sequence number the queue would have used next.
    next_seq: u64,
    /// Completions its sends may still make (outside a pool's credits).
    sends: u64,
}

/// A queue's claim on its CQ, given up when dropped.
pub(crate) struct CqClaim {
    cq: usize,
    share: Share,
    /// The receive slots of its QP that report to the CQ.
    receives: u64,
    /// The queue is on a [`SharedCq`] (counted in [`CqEntry::polled_by`], else, with a
    /// budget, in [`CqEntry::polling`]).
    on_shared: bool,
    /// Set when the queue is dropped and its completions may stay in the CQ.
    leaving: Option<Leaving>,
}

/// A claim taken: the budget it gives the queue, and the lowest sequence number the queue
/// may use.
pub(crate) struct Taken {
    pub(crate) claim: CqClaim,
    pub(crate) budget: CqBudget,
    pub(crate) first_seq: u64,
}

impl CqClaim {
    /// Claims `cq` for the queue of QP `qp_num` with `budget`, or whole, for sends beside
    /// `receives` receive slots of the QP that report to it. A CQ taken whole takes no
    /// other queue, one with queues on it cannot be taken whole, and the budgets and
    /// receive slots on a CQ, with what dropped queues may have left in it, add up to no
    /// more than it holds. A queue taking it whole gets what is left of it.
    pub(crate) fn take(
        cq: &Arc<impl CompletionQueue>,
        qp_num: u32,
        receives: u32,
        budget: Option<&CqBudget>,
        on_shared: Option<usize>,
    ) -> Result<Taken, ConfigError> {
        let mut claims = CQ_CLAIMS.lock().unwrap_or_else(PoisonError::into_inner);
        claims.retain(|_, entry| entry.cq.strong_count() > 0);
        let addr = Arc::as_ptr(cq).cast::<()>() as usize;
        let weak: Weak<dyn CompletionQueue> = Arc::downgrade(cq) as Weak<dyn CompletionQueue>;
        let entry = claims.entry(addr).or_insert_with(|| CqEntry {
            cq: weak,
            whole: false,
            exclusive: 0,
            pools: Vec::new(),
            receives: 0,
            left: 0,
            next_seq: HashMap::new(),
            polled_by: None,
            polling: 0,
        });
        // (An entry made here is left empty by a refusal below: the next take removes it
        // once its CQ is gone, and a later claim on the same CQ finds it empty.)
        let capacity = cq.capacity();
        let first_seq = entry.next_seq.get(&qp_num).copied().unwrap_or(0);
        let (live, residue) = (entry.live(), entry.residue());
        let no_room = |wanted: u64| {
            if residue == 0 {
                ConfigError::CqBudgetsTooLarge {
                    total: live + wanted,
                    capacity,
                }
            } else {
                ConfigError::CqHoldsDroppedWork {
                    capacity,
                    left: residue,
                    taken: live,
                    wanted,
                }
            }
        };
        let Some(budget) = budget else {
            if entry.has_queues() {
                return Err(ConfigError::CqInUse);
            }
            // Every receive completes (if only flushed): where they share the CQ, their
            // slots are not the sends'.
            let room = u64::from(capacity).saturating_sub(residue);
            if room <= u64::from(receives) {
                return Err(match residue {
                    0 => ConfigError::NoCqRoomForSends { capacity, receives },
                    _ => ConfigError::CqHoldsDroppedWork {
                        capacity,
                        left: residue,
                        taken: 0,
                        wanted: u64::from(receives) + 1,
                    },
                });
            }
            entry.whole = true;
            entry.receives += u64::from(receives);
            let sends = u32::try_from(room - u64::from(receives)).unwrap_or(u32::MAX);
            return Ok(Taken {
                claim: CqClaim::new(addr, Share::Whole, receives, false),
                budget: CqBudget::Exclusive(sends),
                first_seq,
            });
        };
        if entry.whole {
            return Err(ConfigError::CqInUse);
        }
        // One poller: the queues on a CQ all poll it through one SharedCq, or all poll it
        // themselves (and route by hand); mixed, either takes completions the other waits
        // for.
        let mixed = match on_shared {
            Some(id) => entry.polling > 0 || entry.polled_by.is_some_and(|(by, _)| by != id),
            None => entry.polled_by.is_some(),
        };
        if mixed {
            return Err(ConfigError::CqPolledTwoWays);
        }
        let share = match budget {
            CqBudget::Exclusive(n) => {
                let wanted = u64::from(*n) + u64::from(receives);
                if live + wanted + residue > u64::from(capacity) {
                    return Err(no_room(wanted));
                }
                entry.exclusive += u64::from(*n);
                Share::Exclusive(*n)
            }
            CqBudget::Shared(pool) => {
                let id = pool.id();
                let found = entry.pools.iter().position(|p| p.credits.id() == id);
                // A pool counts once, at its capacity while a queue takes from it (its
                // credits of dropped queues' work requests among them).
                let (joined, pool_residue) = match found {
                    Some(i) if entry.pools[i].queues > 0 => (0, 0),
                    Some(i) => {
                        let p = &entry.pools[i].credits;
                        (p.capacity(), u64::from(p.capacity() - p.available()))
                    }
                    None => (pool.capacity(), 0),
                };
                let wanted = u64::from(joined) + u64::from(receives);
                if live + wanted + residue - pool_residue > u64::from(capacity) {
                    return Err(no_room(wanted));
                }
                match found {
                    Some(i) => entry.pools[i].queues += 1,
                    None => entry.pools.push(PoolClaim {
                        credits: pool.clone(),
                        queues: 1,
                    }),
                }
                Share::Pool(id)
            }
        };
        entry.receives += u64::from(receives);
        match on_shared {
            Some(id) => {
                let queues = entry.polled_by.map_or(0, |(_, n)| n);
                entry.polled_by = Some((id, queues + 1));
            }
            None => entry.polling += 1,
        }
        Ok(Taken {
            claim: CqClaim::new(addr, share, receives, on_shared.is_some()),
            budget: budget.clone(),
            first_seq,
        })
    }

    fn new(cq: usize, share: Share, receives: u32, on_shared: bool) -> CqClaim {
        CqClaim {
            cq,
            share,
            receives: u64::from(receives),
            on_shared,
            leaving: None,
        }
    }

    /// The queue is dropped and its QP destroyed without its completions being removed
    /// from the CQ: its receive slots, and `sends` completions of its work requests, stay
    /// taken, and a new queue on a QP numbered `qp_num` starts at `next_seq`.
    /// (A pool's credits count its work requests: `sends` is ignored for a pool's share.)
    pub(crate) fn leave(&mut self, qp_num: u32, next_seq: u64, sends: u64) {
        let sends = match self.share {
            Share::Pool(_) => 0,
            Share::Whole | Share::Exclusive(_) => sends,
        };
        self.leaving = Some(Leaving {
            qp_num,
            next_seq,
            sends,
        });
    }
}

impl Drop for CqClaim {
    fn drop(&mut self) {
        let mut claims = CQ_CLAIMS.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(entry) = claims.get_mut(&self.cq) else {
            return;
        };
        match (&self.share, self.on_shared) {
            (Share::Whole, _) => {}
            (_, true) => {
                entry.polled_by = match entry.polled_by {
                    Some((id, n)) if n > 1 => Some((id, n - 1)),
                    _ => None,
                }
            }
            (_, false) => entry.polling -= 1,
        }
        match self.share {
            Share::Whole => entry.whole = false,
            Share::Exclusive(n) => entry.exclusive -= u64::from(n),
            Share::Pool(id) => {
                if let Some(p) = entry.pools.iter_mut().find(|p| p.credits.id() == id) {
                    p.queues -= 1;
                }
            }
        }
        entry.receives -= self.receives;
        if let Some(leaving) = &self.leaving {
            entry.left += self.receives + leaving.sends;
            let next = entry.next_seq.entry(leaving.qp_num).or_insert(0);
            *next = (*next).max(leaving.next_seq);
        }
        entry
            .pools
            .retain(|p| p.queues > 0 || p.credits.available() < p.credits.capacity());
        if entry.is_empty() {
            claims.remove(&self.cq);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::CqError;
    use crate::wc::WorkCompletion;

    struct Cq(u32);

    impl CompletionQueue for Cq {
        fn capacity(&self) -> u32 {
            self.0
        }
        fn poll(&self, _: &mut [WorkCompletion]) -> Result<usize, CqError> {
            Ok(0)
        }
    }

    /// What dropped queues left in a CQ is remembered while the CQ lives, and forgotten
    /// once it is gone (at the next claim, on any CQ): its entry, and the weak handle that
    /// kept the CQ's memory (and so its address) from being reused, go.
    #[test]
    fn what_dropped_queues_left_in_a_cq_goes_with_the_cq() {
        let cq = Arc::new(Cq(8));
        let addr = Arc::as_ptr(&cq).cast::<()>() as usize;
        let mut taken = CqClaim::take(&cq, 1, 0, None, None).unwrap();
        assert!(matches!(taken.budget, CqBudget::Exclusive(8)));
        taken.claim.leave(1, 5, 3);
        drop(taken.claim);
        let left = |addr| {
            CQ_CLAIMS
                .lock()
                .unwrap()
                .get(&addr)
                .map(|e| (e.left, e.cq.strong_count()))
        };
        assert_eq!(left(addr), Some((3, 1)));
        let again = CqClaim::take(&cq, 1, 0, None, None).unwrap();
        assert!(matches!(again.budget, CqBudget::Exclusive(5)));
        assert_eq!(again.first_seq, 5);
        drop(again);
        drop(cq);
        let other = Arc::new(Cq(8));
        drop(CqClaim::take(&other, 1, 0, None, None).unwrap());
        // Gone, or (its memory reused at once) another CQ's.
        assert!(left(addr).is_none_or(|(_, strong)| strong > 0));
    }
}
