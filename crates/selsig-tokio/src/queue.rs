//! `AsyncQueue`: a `SignaledQueue` whose waits are futures.

use std::collections::VecDeque;
use std::future::poll_fn;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use selsig::{
    Completion, CreateError, Device, DrainError, DrainMarker, Payload, PollError, QueueConfig,
    QueuePair, QueuePostError, QueueState, Seq, SignaledQueue, TryPostError, Work,
};
use tokio::time::{Instant, Sleep};

use crate::cq::AsyncCq;

/// An item of an [`AsyncQueue`]'s stream: a retired work request, or why polling failed.
pub type Retired<M, U> = Result<Completion<M, U>, PollError>;

/// What [`AsyncQueue::idle`] did.
enum Idle {
    /// Within the spin time: the task is woken at once, to poll again.
    Spin,
    /// Completions were filed for the queue meanwhile: poll again now.
    Filed,
    /// The task sleeps until a completion is filed for its queue.
    Asleep,
}

/// What [`AsyncQueue::confirm_lone_tail`] did.
enum Tail {
    /// A marker went out behind the tail.
    Confirmed,
    /// The tail needs one, and there is no room for it.
    NoRoom,
    /// Nothing to do: something signaled (or the error state's flushes) will retire it.
    Covered,
}

/// Why [`AsyncQueue::post`] failed.
#[derive(Debug, thiserror::Error)]
pub enum PostError<'a, M, U> {
    /// The queue refused the work request (see [`QueuePostError`]).
    #[error(transparent)]
    Queue(QueuePostError<Payload<M, U>>),
    /// Polling failed while the post waited for room: the work request comes back.
    #[error("polling failed while the post waited for room")]
    Wait {
        /// The work request, not posted.
        work: Box<Work<'a, M, U>>,
        /// Why.
        #[source]
        source: PollError,
    },
}

/// A [`SignaledQueue`] on an [`AsyncCq`]: posts wait (asleep) for room in the send queue
/// and the CQ credits, retired work requests come as a stream in posting order, and
/// confirm and drain are awaited. Nothing spins: a queue with nothing to do costs no CPU.
///
/// # Cancellation
///
/// Every future of this queue may be dropped at any await point without losing a work
/// request or a buffer:
/// - [`ready`](Self::ready), [`next`](Self::next), [`confirm_all`](Self::confirm_all),
///   [`drain`](Self::drain) take nothing from the caller; what retired while they waited
///   stays in the queue for the next [`next`](Self::next) or [`try_next`](Self::try_next).
/// - [`post`](Self::post) posts at one point, synchronously, when there is room: dropped
///   before that, it has posted nothing, and the work request (its buffer) is dropped with
///   it, never seen by the NIC. To keep the buffer of a post that may be cancelled, await
///   [`ready`](Self::ready) and then post with [`queue_mut`](Self::queue_mut)`().post`.
pub struct AsyncQueue<D: Device, U> {
    queue: SignaledQueue<D, U>,
    cq: AsyncCq<D>,
    qp_num: u32,
    /// Retired work requests not handed out yet, in posting order.
    retired: VecDeque<Completion<D::Mr, U>>,
    /// The `Adaptive` policy's deadline timer (made once, reset).
    deadline: Pin<Box<Sleep>>,
    /// Since when this queue's waits found nothing (for [`CqOptions::spin`](crate::CqOptions::spin)).
    idle_since: Option<std::time::Instant>,
}

impl<D: Device, U> AsyncQueue<D, U> {
    /// A queue on `qp`, whose send queue reports to `cq` (see
    /// [`SignaledQueue::on_shared_cq`]).
    pub fn new(
        cq: &AsyncCq<D>,
        qp: D::Qp,
        config: QueueConfig,
    ) -> Result<Self, CreateError<D::Qp>> {
        let qp_num = qp.qp_num();
        let queue = SignaledQueue::on_shared_cq(qp, cq.shared(), config)?;
        Ok(AsyncQueue {
            queue,
            cq: cq.clone(),
            qp_num,
            retired: VecDeque::new(),
            deadline: Box::pin(tokio::time::sleep(Duration::ZERO)),
            idle_since: None,
        })
    }

    /// The queue, for what needs no waiting (its tracker, stats, a batch post).
    pub fn queue(&self) -> &SignaledQueue<D, U> {
        &self.queue
    }

    /// The queue, mutable: posts made through it are this queue's as any other; what
    /// [`poll`](SignaledQueue::poll) retires through it is not handed out here.
    pub fn queue_mut(&mut self) -> &mut SignaledQueue<D, U> {
        &mut self.queue
    }

    /// Work requests posted and not retired yet.
    pub fn outstanding(&self) -> u32 {
        self.queue.outstanding()
    }

    /// A wait found nothing: within the CQ's spin time it asks to be polled again at once
    /// ([`Idle::Spin`]: the task yields, and polls the CQ itself next turn); after it,
    /// registers to be woken when a completion is filed for this queue
    /// ([`Idle::Asleep`]), unless one was filed meanwhile ([`Idle::Filed`]: poll again).
    fn idle(&mut self, cx: &mut Context<'_>) -> Idle {
        let now = std::time::Instant::now();
        if now.duration_since(*self.idle_since.get_or_insert(now)) < self.cq.spin() {
            cx.waker().wake_by_ref();
            return Idle::Spin;
        }
        match self.cq.shared().set_waker(self.qp_num, cx.waker()) {
            Some(filed) if filed > 0 => Idle::Filed,
            _ => Idle::Asleep,
        }
    }

    /// Takes the completions the CQ holds for this queue, retiring work requests into the
    /// stream; ready when any came (or the poller failed), else registers to be woken.
    fn poll_progress(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), PollError>> {
        loop {
            let retired = &mut self.retired;
            let polled = self.queue.poll_with(|c| retired.push_back(c))?;
            if polled > 0 {
                // Credits of the shared pool may have come back: queues waiting for them
                // look again.
                self.cq.state().credits_back();
                self.idle_since = None;
                return Poll::Ready(Ok(()));
            }
            if let Some(e) = self.cq.state().failure() {
                return Poll::Ready(Err(PollError::Cq(e)));
            }
            if self.cq.state().lost() && self.queue.device_lost() > 0 {
                // Every outstanding work request retired as lost: into the stream.
                let mut lost = Vec::new();
                self.queue.collect(&mut lost);
                self.retired.extend(lost);
                return Poll::Ready(Ok(()));
            }
            match self.idle(cx) {
                // Filed since the poll: take them.
                Idle::Filed => continue,
                Idle::Spin | Idle::Asleep => return Poll::Pending,
            }
        }
    }

    /// Waits until the send queue and the CQ credits take a work request; how many they
    /// take. Cancel-safe.
    pub async fn ready(&mut self) -> Result<u32, PollError> {
        poll_fn(|cx| {
            loop {
                let room = self.queue.available();
                if room > 0 {
                    return Poll::Ready(Ok(room));
                }
                match self.poll_progress(cx) {
                    Poll::Ready(Ok(())) => continue,
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                    Poll::Pending => {}
                }
                // Room may also come from other queues giving shared credits back.
                self.cq.state().wait_for_credits(cx.waker());
                if self.queue.available() == 0 {
                    return Poll::Pending;
                }
            }
        })
        .await
    }

    /// Posts `work`, waiting (asleep) for room first. See the cancellation note of
    /// [`AsyncQueue`].
    pub async fn post<'a>(
        &mut self,
        work: Work<'a, D::Mr, U>,
    ) -> Result<Seq, PostError<'a, D::Mr, U>> {
        let mut work = work;
        loop {
            if let Err(source) = self.ready().await {
                return Err(PostError::Wait {
                    work: Box::new(work),
                    source,
                });
            }
            match self.queue.try_post(work) {
                Ok(posted) => return Ok(posted.seq),
                // Another queue took the shared credit since `ready`: wait again.
                Err(TryPostError::NoRoom(back)) => work = back,
                Err(TryPostError::Failed(e)) => return Err(PostError::Queue(e)),
            }
        }
    }

    /// The next retired work request, in posting order; `None` when none is outstanding
    /// and none waits to be handed out. Waits (asleep) for completions; under the
    /// `Adaptive` policy it confirms the unsignaled tail at its deadline (`tick`); under
    /// another, a tail with nothing signaled behind it, which no completion would ever
    /// retire, is confirmed at once (a marker, as [`confirm_all`](Self::confirm_all)
    /// posts). Cancel-safe.
    pub async fn next(&mut self) -> Option<Retired<D::Mr, U>> {
        poll_fn(|cx| self.poll_next_retired(cx)).await
    }

    /// The next retired work request if one is ready now (without polling).
    pub fn try_next(&mut self) -> Option<Completion<D::Mr, U>> {
        self.retired.pop_front()
    }

    /// [`next`](Self::next), as a poll function (the queue is a `Stream` through it).
    pub fn poll_next_retired(&mut self, cx: &mut Context<'_>) -> Poll<Option<Retired<D::Mr, U>>> {
        if let Some(c) = self.retired.pop_front() {
            return Poll::Ready(Some(Ok(c)));
        }
        let mut retired = std::mem::take(&mut self.retired);
        let polled = self.poll_retire(cx, &mut |c| retired.push_back(c));
        self.retired = retired;
        match polled {
            Poll::Ready(Ok(_)) => Poll::Ready(self.retired.pop_front().map(Ok)),
            Poll::Ready(Err(e)) => Poll::Ready(Some(Err(e))),
            Poll::Pending => Poll::Pending,
        }
    }

    /// Hands every retired work request to `f`, in posting order, waiting (asleep) until
    /// there is at least one, like [`next`](Self::next) (the tail and the deadline
    /// included), without a queue in between: the async [`poll_with`](SignaledQueue::poll_with),
    /// the fastest way to take them. Returns how many; 0 when nothing is outstanding.
    /// Cancel-safe: `f` has what it was handed.
    pub async fn retire_with<F>(&mut self, mut f: F) -> Result<usize, PollError>
    where
        F: FnMut(Completion<D::Mr, U>),
    {
        let mut n = 0;
        while let Some(c) = self.retired.pop_front() {
            f(c);
            n += 1;
        }
        if n > 0 {
            return Ok(n);
        }
        poll_fn(|cx| self.poll_retire(cx, &mut f)).await
    }

    /// Retires work requests into `f`: ready with how many when any (0 when nothing is
    /// outstanding, or an error); meanwhile confirms a lone tail and meets the deadline.
    fn poll_retire(
        &mut self,
        cx: &mut Context<'_>,
        f: &mut dyn FnMut(Completion<D::Mr, U>),
    ) -> Poll<Result<usize, PollError>> {
        let mut looked_again = false;
        loop {
            let mut n = 0;
            let polled = self.queue.poll_with(|c| {
                n += 1;
                f(c);
            })?;
            if polled > 0 {
                // Credits of the shared pool may have come back: queues waiting for them
                // look again.
                self.cq.state().credits_back();
                self.idle_since = None;
            }
            if n > 0 {
                return Poll::Ready(Ok(n));
            }
            if polled > 0 {
                continue;
            }
            if self.queue.outstanding() == 0 {
                return Poll::Ready(Ok(0));
            }
            if let Some(e) = self.cq.state().failure() {
                return Poll::Ready(Err(PollError::Cq(e)));
            }
            if self.cq.state().lost() {
                // Every outstanding work request retires as lost; the next poll hands
                // them out.
                self.queue.device_lost();
                continue;
            }
            let Some(due) = self.queue.next_deadline() else {
                match self.confirm_lone_tail() {
                    Tail::Confirmed => continue,
                    Tail::NoRoom => {
                        // The marker needs a credit that other queues hold.
                        self.cq.state().wait_for_credits(cx.waker());
                        if self.queue.available() > 0 {
                            continue;
                        }
                    }
                    Tail::Covered => {}
                }
                match self.idle(cx) {
                    Idle::Spin => return Poll::Pending,
                    Idle::Filed => continue,
                    Idle::Asleep => return Poll::Pending,
                }
            };
            self.deadline.as_mut().reset(Instant::from_std(due));
            if self.deadline.as_mut().poll(cx).is_pending() {
                match self.idle(cx) {
                    Idle::Filed => continue,
                    Idle::Spin | Idle::Asleep => return Poll::Pending,
                }
            }
            match self.queue.tick() {
                // A marker went out: look again.
                Ok(true) => {}
                // No room for it: this queue's completions, or credits other queues give
                // back, make some (look once more if they came meanwhile).
                Ok(false) => {
                    self.cq.state().wait_for_credits(cx.waker());
                    if std::mem::replace(&mut looked_again, true) || self.queue.available() == 0 {
                        return Poll::Pending;
                    }
                }
                // Refused by the provider: the next poll tells why.
                Err(_) => return Poll::Pending,
            }
        }
    }

    /// A caller waits for work requests that nothing would ever retire (all unsignaled,
    /// none signaled behind them, no deadline to confirm them, the queue healthy): confirms
    /// them as [`confirm_all`](Self::confirm_all) does.
    fn confirm_lone_tail(&mut self) -> Tail {
        let tracker = self.queue.tracker();
        let lone = tracker.outstanding() > 0
            && tracker.signaled_outstanding() == 0
            && !matches!(tracker.state(), QueueState::Error { .. });
        if !lone {
            return Tail::Covered;
        }
        match self.queue.confirm_all() {
            Ok(_) => Tail::Confirmed,
            Err(QueuePostError::Refused(e)) if e.is_full() => Tail::NoRoom,
            // Refused otherwise (the provider): the next poll tells why, or flushes come.
            Err(_) => Tail::Covered,
        }
    }

    /// Confirms the unsignaled tail (a signaled zero-length WRITE behind it, see
    /// [`SignaledQueue::confirm_all`]), waiting for room first. `None` when nothing needed
    /// it. Cancel-safe.
    pub async fn confirm_all(&mut self) -> Result<Option<Seq>, DrainError> {
        self.ready().await?;
        self.queue.confirm_all().map_err(DrainError::Marker)
    }

    /// Retires every posted work request (a marker confirms the tail; in the error state
    /// one goes behind the flushes), or fails after `timeout`; they wait for
    /// [`next`](Self::next) / [`try_next`](Self::try_next). No more posts are taken.
    /// Cancel-safe (the drain stays begun).
    pub async fn drain(&mut self, timeout: Duration) -> Result<(), DrainError> {
        let start = Instant::now();
        self.queue.start_drain();
        let wait = async {
            let mut marker = false;
            while !self.queue.tracker().is_idle() {
                if !marker {
                    marker = !matches!(
                        self.queue.post_drain_marker().map_err(DrainError::Marker)?,
                        DrainMarker::NoRoom
                    );
                }
                poll_fn(|cx| match self.poll_progress(cx) {
                    // A marker that found no room also waits for credits other queues
                    // give back.
                    Poll::Pending if !marker => {
                        self.cq.state().wait_for_credits(cx.waker());
                        match self.queue.available() {
                            0 => Poll::Pending,
                            _ => Poll::Ready(Ok(())),
                        }
                    }
                    polled => polled,
                })
                .await?;
            }
            Ok(())
        };
        match tokio::time::timeout(timeout, wait).await {
            Ok(done) => done,
            Err(_) => Err(DrainError::Timeout {
                outstanding: self.queue.outstanding(),
                waited: start.elapsed(),
            }),
        }
    }
}

impl<D: Device, U> futures_core::Stream for AsyncQueue<D, U>
where
    AsyncQueue<D, U>: Unpin,
{
    type Item = Retired<D::Mr, U>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.get_mut().poll_next_retired(cx)
    }
}
