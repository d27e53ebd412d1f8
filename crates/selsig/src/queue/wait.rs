//! Waiting on a [`SignaledQueue`]: sleeping on the CQ's completion events while nothing
//! retires (`wait_with`), a lost device (`check_device`, `device_lost`), and the drain.

use std::cell::Cell;
use std::time::{Duration, Instant};

use super::SignaledQueue;
use crate::Completion;
use crate::credits::CqBudget;
use crate::provider::{CompletionQueue, Device, QpState, QueuePair};
use crate::queue_errors::{DrainError, DrainMarker, PollError, QueuePostError};
use crate::tracker::{PostError, QueueState};
#[cfg(doc)]
use crate::{QueueConfig, SharedCq};

/// At least how long a drain routed by hand (no [`SharedCq`]) whose marker finds no
/// credit waits for a completion of its own (a quarter of its timeout, if longer) before
/// it blames other queues' completions parked with it ([`DrainError::Unrouted`]): one of
/// its own may be held by another queue that polled it. (A slow work request, retried on
/// RNR or a large transfer, can take longer; on a [`SharedCq`] its completion always
/// reaches this queue, and the drain waits for it.)
const OWN_COMPLETION_WAIT: Duration = Duration::from_millis(100);

/// The longest a drain sleeps on the CQ's events before it looks again.
const DOZE: Duration = Duration::from_millis(10);

/// The longest [`SignaledQueue::wait_with`] sleeps before it asks whether the device was
/// lost (a lost device may make no completion event).
const DEVICE_CHECK: Duration = Duration::from_millis(100);

impl<D: Device, U> SignaledQueue<D, U> {
    /// Whether the device was lost ([`CompletionQueue::device_lost`]). When it was, the
    /// completions the device wrote before it failed are handled first (they are the truth
    /// about their work requests), then every work request still outstanding retires as
    /// [`Outcome::DeviceLost`](crate::Outcome::DeviceLost) (collect them with
    /// [`poll`](Self::poll) or [`collect`](Self::collect)), and the queue refuses every
    /// later post ([`PostError::DeviceLost`]).
    ///
    /// [`wait_with`](Self::wait_with) and [`drain`](Self::drain) ask before they sleep; a
    /// caller that polls in a loop asks when its polls have found nothing for a while (on
    /// verbs it reads the device's asynchronous events: a system call, not for every
    /// poll).
    pub fn check_device(&mut self) -> bool {
        if self.tracker.state() == QueueState::DeviceLost {
            return true;
        }
        if !self.cq.device_lost() {
            return false;
        }
        self.device_lost();
        true
    }

    /// The device was lost, as the caller learned (it reads the device's asynchronous
    /// events itself and got `IBV_EVENT_DEVICE_FATAL`): what [`check_device`](
    /// Self::check_device) does when the CQ says so. The completions still in the CQ are
    /// handled first, then every outstanding work request retires as
    /// [`Outcome::DeviceLost`](crate::Outcome::DeviceLost); collect them with
    /// [`poll`](Self::poll) or [`collect`](Self::collect). Returns how many of the
    /// caller's work requests it retired as lost (0 when called again).
    pub fn device_lost(&mut self) -> u64 {
        if self.tracker.state() == QueueState::DeviceLost {
            return 0;
        }
        // The device writes nothing more: the CQ empties within its capacity. An
        // impossible completion among these is counted (`Stats::rejected_cqes`) and
        // dropped: the loss is what the caller must hear of.
        let polls = self.cq.capacity() as usize / self.wcs.len().max(1) + 2;
        for _ in 0..polls {
            let n = match self.poll_cq() {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let now = self.now();
            for i in 0..n {
                let wc = self.wcs[i];
                let _ = self.handle(&wc, now);
            }
        }
        self.tracker.device_lost()
    }

    /// Like [`poll_with`](Self::poll_with), but sleeps while nothing retires: on the CQ's
    /// completion events ([`CompletionQueue::req_notify`], then
    /// [`wait_event`](CompletionQueue::wait_event)), using no CPU, until a completion
    /// retires work requests, `timeout` passes or the `Adaptive` policy's
    /// [`next_deadline`](Self::next_deadline) comes (then [`tick`](Self::tick)). Returns
    /// how many work requests it handed to `f`: 0 when it woke for the time.
    ///
    /// It polls, arms, and polls again before it sleeps, so a completion that came
    /// between the two polls is never slept through. A CQ without events answers
    /// [`CqError::NoEvents`](crate::CqError::NoEvents) (poll it instead). On a [`SharedCq`] this wakes on any
    /// completion of the CQ and finds its own in its inbox; one thread should wait on a
    /// CQ at a time (an event taken by another waiter wakes only that one: several
    /// waiters on one CQ want one poller, as `selsig-tokio` has).
    ///
    /// When the device is lost ([`check_device`](Self::check_device), asked before each
    /// sleep and at least every 100 ms) it hands back every outstanding work request as
    /// [`Outcome::DeviceLost`](crate::Outcome::DeviceLost) instead of sleeping for ever.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use selsig::{Device, SignaledQueue};
    /// # fn f<D: Device>(queue: &mut SignaledQueue<D, u64>) -> Result<(), selsig::PollError> {
    /// while queue.outstanding() > 0 {
    ///     queue.wait_with(Duration::from_secs(1), |done| drop(done.buffer))?;
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn wait_with<F>(&mut self, timeout: Duration, mut f: F) -> Result<usize, PollError>
    where
        F: FnMut(Completion<D::Mr, U>),
    {
        let start = Instant::now();
        let end = start.checked_add(timeout);
        let handed = Cell::new(0);
        let mut hand = |c| {
            handed.set(handed.get() + 1);
            f(c)
        };
        loop {
            self.poll_with(&mut hand)?;
            if handed.get() > 0 {
                return Ok(handed.get());
            }
            if self.check_device() {
                self.collect_with(&mut hand);
                return Ok(handed.get());
            }
            let until = match (end, self.next_deadline()) {
                (Some(end), Some(due)) => Some(end.min(due)),
                (end, due) => end.or(due),
            };
            let now = Instant::now();
            if until.is_some_and(|until| now >= until) {
                return Ok(0);
            }
            self.cq.req_notify()?;
            self.poll_with(&mut hand)?;
            if handed.get() > 0 {
                return Ok(handed.get());
            }
            // At most DEVICE_CHECK at a time: a device lost while this sleeps may make no
            // event (it is asked again above).
            let sleep = until.map_or(DEVICE_CHECK, |until| {
                until.saturating_duration_since(now).min(DEVICE_CHECK)
            });
            self.cq.wait_event(Some(sleep))?;
        }
    }

    /// Polls until every posted work request is retired (or `timeout` passes), appending
    /// them to `out`. Healthy queue: the tail is confirmed with a marker. Queue in the
    /// error state: every outstanding work request is flushed by the NIC; a signaled marker
    /// is posted behind them as well (like the kernel's `ib_drain_sq`), so that the drain
    /// ends even if flush completions were lost. The queue accepts no more posts. `Ok`
    /// says everything retired, not how: the outcomes say that (a marker is a WRITE to
    /// [`QueueConfig::marker_target`], as [`confirm_all`](Self::confirm_all) posts).
    ///
    /// To give up on work a peer will never answer (a peer gone, on rxe, which retries for
    /// ever at a retry count of 7), move the QP to the error state first
    /// (`queue.qp().to_error()`): the drain then retires everything as flushed at once.
    /// Where the provider takes no post in the error state (bnxt_re, ionic), the marker is
    /// refused and the drain waits for the flushes alone.
    ///
    /// On a CQ shared with other queues, completions of theirs that this drain polls wait
    /// for them (in [`take_unclaimed`](Self::take_unclaimed), or on a [`SharedCq`] until
    /// they poll); when the marker needs a credit of a shared pool that those completions
    /// hold, and no completion of this queue's own is on its way to free one (or, routed
    /// by hand, none came for a quarter of `timeout`, at least 100 ms: another queue may
    /// have polled it), the drain ends with [`DrainError::Unrouted`]: route them (or poll
    /// those queues), and drain again.
    pub fn drain(
        &mut self,
        timeout: Duration,
        out: &mut Vec<Completion<D::Mr, U>>,
    ) -> Result<(), DrainError> {
        let start = Instant::now();
        self.start_drain();
        let mut marker_posted = false;
        // When this queue's own completions last came (or the drain began).
        let mut own_progress = start;
        loop {
            if !marker_posted {
                marker_posted = !matches!(
                    self.post_drain_marker().map_err(DrainError::Marker)?,
                    DrainMarker::NoRoom
                );
                // No credit of a shared pool (with a slot free: a slot only this queue's
                // own completions give back), no completion of this queue on its way to
                // give a credit back (a signaled work request outstanding, or in the error
                // state any; or none came for a while: another queue may hold it, routed
                // by hand), and completions of other queues that hold credits of the pool
                // parked here: only their queues can give those credits back.
                let short_of_pool_credit = matches!(self.tracker.cq_budget(), CqBudget::Shared(_))
                    && self.tracker.free_slots() > 0;
                let own = self.qp.qp_num();
                let own_coming = match self.tracker.state() {
                    QueueState::Error { .. } => self.tracker.outstanding() > 0,
                    _ => self.tracker.signaled_outstanding() > 0,
                } && (self.shared.is_some()
                    || own_progress.elapsed() < (timeout / 4).max(OWN_COMPLETION_WAIT));
                let foreign = self.unclaimed.iter().filter(|wc| wc.qp_num != own).count()
                    + self
                        .shared
                        .as_ref()
                        .map_or(0, |shared| shared.waiting_for_others(own));
                if !marker_posted && short_of_pool_credit && !own_coming && foreign > 0 {
                    return Err(DrainError::Unrouted {
                        completions: foreign,
                    });
                }
            }
            let before = self.tracker.outstanding();
            self.poll(out)?;
            if self.tracker.outstanding() < before {
                own_progress = Instant::now();
            }
            if self.tracker.is_idle() {
                return Ok(());
            }
            let waited = start.elapsed();
            if waited >= timeout {
                return Err(DrainError::Timeout {
                    outstanding: self.tracker.outstanding(),
                    waited,
                });
            }
            if self.doze(out, timeout - waited)? {
                own_progress = Instant::now();
            }
        }
    }

    /// A drain's wait for what comes next: on the CQ's completion events where it has
    /// them (arm, poll again, sleep at most [`DOZE`] of `left`: a completion another
    /// queue polls for this one, or credits it gives back, make no event here), else a
    /// spin. Whether the poll after the arm retired work requests of this queue.
    fn doze(
        &mut self,
        out: &mut Vec<Completion<D::Mr, U>>,
        left: Duration,
    ) -> Result<bool, PollError> {
        if self.cq.req_notify().is_err() {
            if self.check_device() {
                self.collect(out);
                return Ok(true);
            }
            std::hint::spin_loop();
            return Ok(false);
        }
        let before = self.tracker.outstanding();
        if self.poll(out)? == 0 {
            if self.check_device() {
                self.collect(out);
                return Ok(true);
            }
            // An event's failure is no drain's: it goes on polling.
            let _ = self.cq.wait_event(Some(left.min(DOZE)));
        }
        Ok(self.tracker.outstanding() < before)
    }

    /// The first half of [`drain`](Self::drain), for callers that poll themselves: no
    /// more posts are accepted.
    pub fn start_drain(&mut self) {
        self.tracker.start_drain();
    }

    /// The marker of a drain: in the error state a signaled zero-length WRITE behind
    /// every outstanding work request (its flush retires everything before it, like
    /// `ib_drain_sq`), otherwise a confirm marker if the tail is unsignaled. On
    /// [`DrainMarker::NoRoom`], poll and call again.
    ///
    /// A provider that takes no post in the error state (bnxt_re and ionic take posts only
    /// in RTS and SQD) refuses the marker: that is [`DrainMarker::NotNeeded`], as the NIC
    /// flushes every outstanding work request all the same.
    pub fn post_drain_marker(&mut self) -> Result<DrainMarker, QueuePostError<()>> {
        match self.try_drain_marker() {
            // The marker was rolled back (index 0): it is not outstanding.
            Err(QueuePostError::Provider { source, .. })
                if source.index == 0 && self.qp.state() == QpState::Err =>
            {
                Ok(DrainMarker::NotNeeded)
            }
            other => other,
        }
    }

    fn try_drain_marker(&mut self) -> Result<DrainMarker, QueuePostError<()>> {
        if self.tracker.is_idle() {
            return Ok(DrainMarker::NotNeeded);
        }
        if matches!(self.tracker.state(), QueueState::Error { .. }) {
            let now = self.now();
            match self.tracker.post_marker(now) {
                Ok(seq) => self.post_marker(seq).map(|()| DrainMarker::Posted(seq)),
                Err(e) if e.is_full() => Ok(DrainMarker::NoRoom),
                // The last sequence number is taken, and signaled: the NIC flushes it and
                // everything before it.
                Err(PostError::SeqExhausted { .. }) => Ok(DrainMarker::NotNeeded),
                Err(e) => Err(QueuePostError::Refused(e)),
            }
        } else {
            match self.confirm_all() {
                Ok(Some(seq)) => Ok(DrainMarker::Posted(seq)),
                Ok(None) => Ok(DrainMarker::NotNeeded),
                Err(QueuePostError::Refused(e)) if e.is_full() => Ok(DrainMarker::NoRoom),
                Err(e) => Err(e),
            }
        }
    }
}
