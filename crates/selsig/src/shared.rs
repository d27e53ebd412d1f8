//! A completion queue shared by several [`SignaledQueue`](crate::SignaledQueue)s, each
//! of which polls it.
//!
//! The tracker of a queue needs its QP's completions in the order the CQ holds them
//! (docs/semantics.md: an error completion comes before the flushes behind it; a completion
//! confirms every earlier work request). When several queues poll one CQ, each sees
//! completions of the others; were those handed over later, a queue could meanwhile poll
//! its own later completions first, and take a flush for an error it has not seen. A
//! [`SharedCq`] files every completion a queue polls for another queue in that queue's
//! inbox, and a queue empties its inbox before it polls the CQ again, under one lock: each
//! queue sees its completions in CQ order whoever polled them.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::Waker;

use crate::credits::CqCredits;
use crate::provider::{CompletionQueue, CqError, Device};
use crate::tracker::ConfigError;
use crate::wc::WorkCompletion;

/// A completion queue shared by several queues, with its pool of credits and the
/// completions polled for queues that have not polled them yet.
///
/// Create the queues with [`SignaledQueue::on_shared_cq`](crate::SignaledQueue::on_shared_cq).
/// Cloning gives another handle to the same CQ.
///
/// ```
/// # use std::sync::Arc;
/// # use selsig::{Device, Policy, QueueConfig, SharedCq, SignaledQueue};
/// # fn f<D: Device>(cq: Arc<D::Cq>, a: D::Qp, b: D::Qp) -> Result<(), selsig::ConfigError> {
/// let shared = SharedCq::<D>::new(cq);
/// let config = QueueConfig::with_policy(Policy::Every(16));
/// let qa: SignaledQueue<D, u64> = SignaledQueue::on_shared_cq(a, &shared, config.clone())?;
/// let qb: SignaledQueue<D, u64> = SignaledQueue::on_shared_cq(b, &shared, config)?;
/// // Each queue polls: completions of the other go to its inbox, in CQ order.
/// # Ok(())
/// # }
/// ```
pub struct SharedCq<D: Device> {
    inner: Arc<Inner<D>>,
}

impl<D: Device> SharedCq<D> {
    /// This shared CQ's identity (its clones share it).
    pub(crate) fn id(&self) -> usize {
        Arc::as_ptr(&self.inner).cast::<()>() as usize
    }
}

struct Inner<D: Device> {
    cq: Arc<D::Cq>,
    credits: CqCredits,
    /// Completions polled for each registered QP (by number) and not yet taken by it.
    inboxes: Mutex<HashMap<u32, Inbox>>,
    /// The receive slots of registered QPs whose receive completions go to this CQ.
    receives: Mutex<Receives>,
}

/// The completions polled for one queue, and who to wake when one comes.
#[derive(Default)]
struct Inbox {
    wcs: VecDeque<WorkCompletion>,
    waker: Option<Waker>,
}

impl Inbox {
    /// Files `wc`, waking the queue's task if it waits.
    fn file(&mut self, wc: WorkCompletion) {
        self.wcs.push_back(wc);
        if let Some(waker) = self.waker.take() {
            waker.wake();
        }
    }
}

/// What [`SharedCq::pump`] polled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Pumped {
    /// Completions polled from the CQ.
    pub polled: usize,
    /// Of those, completions of QPs with no queue here, left at the front of the buffer.
    pub unclaimed: usize,
}

/// Receive slots reserved beside the pool.
#[derive(Default)]
struct Receives {
    /// Of each registered QP, by number.
    by_qp: HashMap<u32, u32>,
    /// Of QPs whose queues were dropped while their completions may still come: kept for
    /// the CQ's lifetime (a new QP may get the same number).
    kept: u32,
}

impl<D: Device> Clone for SharedCq<D> {
    fn clone(&self) -> Self {
        SharedCq {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<D: Device> std::fmt::Debug for SharedCq<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedCq")
            .field("capacity", &self.inner.cq.capacity())
            .field("credits", &self.inner.credits)
            .field("waiting", &self.waiting())
            .finish()
    }
}

impl<D: Device> SharedCq<D> {
    /// `cq`, shared, with a pool of credits for its whole capacity: for CQs that only
    /// send completions go to (a queue whose QP's receive completions go to it too is
    /// refused: give the pool fewer credits with [`with_credits`](Self::with_credits)).
    pub fn new(cq: Arc<D::Cq>) -> Self {
        let credits = CqCredits::new(cq.capacity());
        Self::with_credits(cq, credits)
    }

    /// `cq`, shared, with a pool of `credits`: receive completions that go to the same CQ
    /// need room of their own (every receive completes, if only flushed), so give the
    /// senders a pool of the capacity less the receive queues' capacities. A queue whose
    /// QP's receive queue reports here is refused when its slots and those of the queues
    /// before it do not fit beside the pool.
    pub fn with_credits(cq: Arc<D::Cq>, credits: CqCredits) -> Self {
        SharedCq {
            inner: Arc::new(Inner {
                cq,
                credits,
                inboxes: Mutex::new(HashMap::new()),
                receives: Mutex::new(Receives::default()),
            }),
        }
    }

    /// The completion queue. Polling it directly takes completions its queues wait for:
    /// hand each one to its queue's
    /// [`handle_completion`](crate::SignaledQueue::handle_completion).
    pub fn cq(&self) -> &Arc<D::Cq> {
        &self.inner.cq
    }

    /// The pool of credits of the queues that share it.
    pub fn credits(&self) -> &CqCredits {
        &self.inner.credits
    }

    /// Completions polled for queues that have not polled them yet.
    pub fn waiting(&self) -> usize {
        self.inboxes().values().map(|inbox| inbox.wcs.len()).sum()
    }

    /// The inboxes. A poisoned lock is taken as it is: every change to them is one
    /// `VecDeque` or `HashMap` operation, complete or not begun.
    fn inboxes(&self) -> MutexGuard<'_, HashMap<u32, Inbox>> {
        self.inner
            .inboxes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Gives the QP `qp_num` an inbox, and `receives` slots of the CQ beside the pool's
    /// credits (its receive queue's capacity when its receive completions go to this CQ:
    /// every receive completes, if only flushed).
    pub(crate) fn register(&self, qp_num: u32, receives: u32) -> Result<(), ConfigError> {
        let mut inboxes = self.inboxes();
        if inboxes.contains_key(&qp_num) {
            return Err(ConfigError::SharedCqHasQp { qp_num });
        }
        let mut reserved = self.receives();
        let total = reserved
            .by_qp
            .values()
            .fold(receives.saturating_add(reserved.kept), |sum, &r| {
                sum.saturating_add(r)
            });
        let (capacity, credits) = (self.inner.cq.capacity(), self.inner.credits.capacity());
        if receives > 0 && credits.saturating_add(total) > capacity {
            return Err(ConfigError::NoCqRoomForReceives {
                capacity,
                credits,
                receives: total,
            });
        }
        inboxes.insert(qp_num, Inbox::default());
        if receives > 0 {
            reserved.by_qp.insert(qp_num, receives);
        }
        Ok(())
    }

    /// Removes the inbox of `qp_num`, returning what it held, and frees its receive
    /// slots unless `left_in_cq` (its QP is destroyed without its completions being
    /// removed from the CQ, as on rxe: its receives' completions may still come; the
    /// slots stay taken for the CQ's lifetime). (A later queue on a QP with the same
    /// number starts past this one's sequence numbers: the queue's claim on the CQ sees to
    /// it.)
    pub(crate) fn unregister(&self, qp_num: u32, left_in_cq: bool) -> VecDeque<WorkCompletion> {
        let mut inboxes = self.inboxes();
        let mut reserved = self.receives();
        if let Some(slots) = reserved.by_qp.remove(&qp_num)
            && left_in_cq
        {
            reserved.kept = reserved.kept.saturating_add(slots);
        }
        inboxes
            .remove(&qp_num)
            .map(|inbox| inbox.wcs)
            .unwrap_or_default()
    }

    /// The receive slots of registered QPs (taken after the inboxes' lock). A poisoned
    /// lock is taken as it is: every change is one `HashMap` operation.
    fn receives(&self) -> MutexGuard<'_, Receives> {
        self.inner
            .receives
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Completions waiting for queues other than that of `qp_num`.
    pub(crate) fn waiting_for_others(&self, qp_num: u32) -> usize {
        self.inboxes()
            .iter()
            .filter(|&(&qp, _)| qp != qp_num)
            .map(|(_, inbox)| inbox.wcs.len())
            .sum()
    }

    /// Polls for the queue of `own` into `out`: what its inbox holds if anything (in the
    /// order polled), else the CQ, filing the completions of other registered QPs in
    /// their inboxes. Returns how many of `out` are the caller's: its QP's completions and
    /// those of QPs with no inbox.
    pub(crate) fn poll(&self, own: u32, out: &mut [WorkCompletion]) -> Result<usize, CqError> {
        let mut inboxes = self.inboxes();
        if let Some(inbox) = inboxes.get_mut(&own).filter(|i| !i.wcs.is_empty()) {
            let n = inbox.wcs.len().min(out.len());
            for (slot, wc) in out.iter_mut().zip(inbox.wcs.drain(..n)) {
                *slot = wc;
            }
            return Ok(n);
        }
        // A count beyond the buffer (a provider breaking its contract) is cut to it.
        let k = self.inner.cq.poll(out)?.min(out.len());
        let mut kept = 0;
        for i in 0..k {
            let wc = out[i];
            match inboxes.get_mut(&wc.qp_num) {
                Some(inbox) if wc.qp_num != own => inbox.file(wc),
                _ => {
                    out[kept] = wc;
                    kept += 1;
                }
            }
        }
        Ok(kept)
    }

    /// Polls the CQ once (up to `out.len()` completions) for all its queues: files each
    /// completion of a queue's QP in that queue's inbox, waking the task that waits on it
    /// ([`set_waker`](Self::set_waker)), and leaves the others (QPs with no queue here:
    /// receives of QPs made around selsig, a dropped queue's) at the front of `out`. The
    /// loop of a task that polls a CQ for its queues, so that they need not poll it.
    pub fn pump(&self, out: &mut [WorkCompletion]) -> Result<Pumped, CqError> {
        let mut inboxes = self.inboxes();
        // A count beyond the buffer (a provider breaking its contract) is cut to it.
        let polled = self.inner.cq.poll(out)?.min(out.len());
        let mut unclaimed = 0;
        for i in 0..polled {
            let wc = out[i];
            match inboxes.get_mut(&wc.qp_num) {
                Some(inbox) => inbox.file(wc),
                None => {
                    out[unclaimed] = wc;
                    unclaimed += 1;
                }
            }
        }
        Ok(Pumped { polled, unclaimed })
    }

    /// Wakes every queue's task that waits ([`set_waker`](Self::set_waker)): for a poller
    /// that stops (its CQ failed), so that they poll the CQ themselves and see why.
    pub fn wake_all(&self) {
        for inbox in self.inboxes().values_mut() {
            if let Some(waker) = inbox.waker.take() {
                waker.wake();
            }
        }
    }

    /// Wakes `waker` when a completion is filed in the inbox of the queue of `qp_num`
    /// (by [`pump`](Self::pump) or another queue's poll), once; returns how many
    /// completions its inbox holds now (when not 0, poll the queue rather than wait).
    /// `None` when that QP has no queue here.
    pub fn set_waker(&self, qp_num: u32, waker: &Waker) -> Option<usize> {
        let mut inboxes = self.inboxes();
        let inbox = inboxes.get_mut(&qp_num)?;
        match &mut inbox.waker {
            Some(old) => old.clone_from(waker),
            none => *none = Some(waker.clone()),
        }
        Some(inbox.wcs.len())
    }
}
