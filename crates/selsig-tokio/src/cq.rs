//! `AsyncCq`: a completion queue with one poller task, which sleeps on the CQ's
//! completion events and files every completion in its queue's inbox.

use std::io;
use std::os::fd::{BorrowedFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::Waker;
use std::time::{Duration, Instant};

use selsig::{CompletionQueue, CqCredits, CqError, Device, SharedCq, WcStatus, WorkCompletion};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::task::JoinHandle;

/// How an [`AsyncCq`] is made.
#[derive(Debug, Clone)]
pub struct CqOptions {
    /// The pool of CQ credits its queues share; `None`: the CQ's whole capacity (a CQ
    /// that only send completions go to).
    pub credits: Option<CqCredits>,
    /// How long the poller keeps polling an empty CQ, and a queue's task its inbox and
    /// the CQ, (letting the other tasks of its thread run between polls) before it sleeps:
    /// a completion that comes within it costs no wake-up from the kernel and no hand-over
    /// between tasks, at the price of this much CPU after each burst of completions. Zero:
    /// sleep at once. Default 50 µs.
    pub spin: Duration,
}

impl Default for CqOptions {
    fn default() -> Self {
        CqOptions {
            credits: None,
            spin: Duration::from_micros(50),
        }
    }
}

/// Completions one pump takes from the CQ at most.
const PUMP_BATCH: usize = 64;
/// Pumps in a row before the poller lets other tasks of its thread run.
const PUMPS_PER_TURN: u32 = 16;

/// The longest the poller sleeps before it asks whether the device was lost (a lost
/// device makes no completion event).
const DEVICE_CHECK: Duration = Duration::from_millis(100);

/// A completion queue shared by any number of [`AsyncQueue`](crate::AsyncQueue)s, with
/// its pool of CQ credits and one poller task.
///
/// The poller polls the CQ until it is empty, arms it
/// ([`CompletionQueue::req_notify`]), polls again (a completion that came in between is
/// never slept through) and sleeps on the CQ's event descriptor in tokio's reactor. Each
/// completion goes to the inbox of its queue's QP, and wakes that queue's task; a queue's
/// completions reach it in CQ order whoever polled them (the queues may poll too, through
/// the same [`SharedCq`]). Completions of QPs with no queue here (receives of QPs made
/// around selsig, a dropped queue's) are kept for [`take_unclaimed`](Self::take_unclaimed).
///
/// Cloning gives another handle; the poller stops when the last handle and every queue
/// made on it are dropped.
pub struct AsyncCq<D: Device> {
    inner: Arc<Inner<D>>,
}

struct Inner<D: Device> {
    shared: SharedCq<D>,
    poller: JoinHandle<()>,
    state: Arc<PollerState>,
    spin: Duration,
}

impl<D: Device> Drop for Inner<D> {
    fn drop(&mut self) {
        self.poller.abort();
    }
}

/// What the poller keeps for the queues and their owner.
#[derive(Default)]
pub(crate) struct PollerState {
    unclaimed: Mutex<Vec<WorkCompletion>>,
    /// Why the poller stopped, if it did.
    failed: Mutex<Option<Failure>>,
    /// The tasks of queues waiting for credits of the shared pool, which other queues
    /// give back as they retire work requests.
    credit_waiters: Mutex<Vec<Waker>>,
    /// The device was lost ([`CompletionQueue::device_lost`]): the poller stopped, and
    /// the queues retire their outstanding work requests as lost.
    lost: AtomicBool,
}

/// A poller's failure, kept to be reported to every queue (a `CqError` is not `Clone`).
#[derive(Debug, Clone)]
enum Failure {
    Overrun {
        capacity: u32,
    },
    Other {
        kind: io::ErrorKind,
        message: String,
    },
}

impl PollerState {
    fn fail(&self, e: &CqError) {
        let failure = match e {
            CqError::Overrun { capacity } => Failure::Overrun {
                capacity: *capacity,
            },
            other => Failure::Other {
                kind: match other {
                    CqError::Os(e) | CqError::Event(e) => e.kind(),
                    _ => io::ErrorKind::Other,
                },
                message: error_chain(other),
            },
        };
        *self.failed.lock().unwrap_or_else(PoisonError::into_inner) = Some(failure);
    }

    /// Wakes `waker` when a queue of this CQ next retires work requests (and gives
    /// credits back). Register, then look at the credits again: a queue that gave them
    /// back meanwhile has woken the registered tasks or is seen to have given them.
    pub(crate) fn wait_for_credits(&self, waker: &Waker) {
        let mut waiters = self
            .credit_waiters
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if !waiters.iter().any(|w| w.will_wake(waker)) {
            waiters.push(waker.clone());
        }
    }

    /// A queue retired work requests: the tasks waiting for credits look again.
    pub(crate) fn credits_back(&self) {
        let mut waiters = self
            .credit_waiters
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for waker in waiters.drain(..) {
            waker.wake();
        }
    }

    /// Whether the device was lost (the poller found it so and stopped).
    pub(crate) fn lost(&self) -> bool {
        self.lost.load(Ordering::Acquire)
    }

    /// Why the poller stopped, as a `CqError`.
    pub(crate) fn failure(&self) -> Option<CqError> {
        let failed = self.failed.lock().unwrap_or_else(PoisonError::into_inner);
        failed.as_ref().map(|f| match f {
            Failure::Overrun { capacity } => CqError::Overrun {
                capacity: *capacity,
            },
            Failure::Other { kind, message } => CqError::Event(io::Error::new(
                *kind,
                format!("the poller stopped: {message}"),
            )),
        })
    }
}

/// `e` and its sources, one line.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// The poller's own duplicate of the CQ's event descriptor (the same open file, so the
/// same readiness), registered with tokio's reactor.
fn register(fd: RawFd) -> io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: `fd` is the CQ's event descriptor, open while the CQ lives
    // (`CompletionQueue::event_fd`), and the caller holds the CQ.
    let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
    let own = borrowed.try_clone_to_owned()?;
    // SAFETY: `own` is an open descriptor that the `AsyncFd` owns: it stays open, the same
    // file, until the `AsyncFd` drops it.
    unsafe { AsyncFd::register_with_interest(own, Interest::READABLE) }.map_err(io::Error::from)
}

impl<D: Device> Clone for AsyncCq<D> {
    fn clone(&self) -> Self {
        AsyncCq {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<D: Device> std::fmt::Debug for AsyncCq<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncCq")
            .field("shared", &self.inner.shared)
            .finish_non_exhaustive()
    }
}

impl<D: Device + 'static> AsyncCq<D> {
    /// `cq` with a pool of credits for its whole capacity (a CQ that only send
    /// completions go to; see [`SharedCq::new`]), and its poller spawned on the current
    /// tokio runtime. Fails with [`CqError::NoEvents`] for a CQ without completion events.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime (as `tokio::spawn` does).
    pub fn new(cq: Arc<D::Cq>) -> Result<Self, CqError> {
        Self::with_options(cq, CqOptions::default())
    }

    /// `cq` with a pool of `credits` (leave room for the receive completions that go to
    /// it; see [`SharedCq::with_credits`]).
    pub fn with_credits(cq: Arc<D::Cq>, credits: CqCredits) -> Result<Self, CqError> {
        let options = CqOptions {
            credits: Some(credits),
            ..CqOptions::default()
        };
        Self::with_options(cq, options)
    }

    /// `cq` with `options`.
    pub fn with_options(cq: Arc<D::Cq>, options: CqOptions) -> Result<Self, CqError> {
        let shared: SharedCq<D> = match options.credits {
            Some(credits) => SharedCq::with_credits(cq, credits),
            None => SharedCq::new(cq),
        };
        let fd = shared.cq().event_fd().ok_or(CqError::NoEvents)?;
        let fd = register(fd).map_err(CqError::Event)?;
        let state = Arc::new(PollerState::default());
        let poller = tokio::spawn(poll_for_ever(
            shared.clone(),
            fd,
            Arc::clone(&state),
            options.spin,
        ));
        Ok(AsyncCq {
            inner: Arc::new(Inner {
                shared,
                poller,
                state,
                spin: options.spin,
            }),
        })
    }
}

impl<D: Device> AsyncCq<D> {
    /// The shared CQ: its credits, its inboxes.
    pub fn shared(&self) -> &SharedCq<D> {
        &self.inner.shared
    }

    /// The completions of QPs with no queue on this CQ, in the order polled.
    pub fn take_unclaimed(&self) -> Vec<WorkCompletion> {
        std::mem::take(
            &mut *self
                .inner
                .state
                .unclaimed
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        )
    }

    /// Why the poller stopped (the CQ failed), if it did. Its queues report it too.
    pub fn failure(&self) -> Option<CqError> {
        self.inner.state.failure()
    }

    pub(crate) fn state(&self) -> &PollerState {
        &self.inner.state
    }

    /// How long a poller, or a queue's task, keeps polling before it sleeps.
    pub(crate) fn spin(&self) -> Duration {
        self.inner.spin
    }
}

/// The poller: pump until the CQ is empty (and `spin` longer), arm, pump again, sleep on
/// the event fd.
async fn poll_for_ever<D: Device + 'static>(
    shared: SharedCq<D>,
    fd: AsyncFd<OwnedFd>,
    state: Arc<PollerState>,
    spin: Duration,
) {
    if let Err(e) = pump_for_ever(&shared, &fd, &state, spin).await {
        state.fail(&e);
        shared.wake_all();
    }
}

async fn pump_for_ever<D: Device>(
    shared: &SharedCq<D>,
    fd: &AsyncFd<OwnedFd>,
    state: &PollerState,
    spin: Duration,
) -> Result<(), CqError> {
    let mut wcs = [WorkCompletion::new(0, WcStatus::Success, 0); PUMP_BATCH];
    let mut pumps = 0u32;
    let mut empty_since = None;
    loop {
        if pump(shared, &mut wcs, state)? > 0 {
            empty_since = None;
            pumps += 1;
            if pumps >= PUMPS_PER_TURN {
                pumps = 0;
                tokio::task::yield_now().await;
            }
            continue;
        }
        if !spin.is_zero() {
            let now = Instant::now();
            if now.duration_since(*empty_since.get_or_insert(now)) < spin {
                tokio::task::yield_now().await;
                continue;
            }
            empty_since = None;
        }
        shared.cq().req_notify()?;
        if pump(shared, &mut wcs, state)? > 0 {
            continue;
        }
        // A lost device makes no completion event (mlx5): the sleep ends every
        // DEVICE_CHECK to ask.
        let mut ready = match tokio::time::timeout(DEVICE_CHECK, fd.readable()).await {
            Ok(ready) => ready.map_err(CqError::Event)?,
            Err(_) if shared.cq().device_lost() => {
                // What the device wrote before it failed goes to the queues first.
                while pump(shared, &mut wcs, state)? > 0 {}
                state.lost.store(true, Ordering::Release);
                shared.wake_all();
                state.credits_back();
                return Ok(());
            }
            Err(_) => continue,
        };
        shared.cq().take_events()?;
        // Kept ready if the fd turned readable again since `readable` said so (tokio
        // tracks it), so no event is lost.
        ready.clear_ready();
    }
}

/// One pump: the completions of queues to their inboxes, the others kept. How many.
fn pump<D: Device>(
    shared: &SharedCq<D>,
    wcs: &mut [WorkCompletion],
    state: &PollerState,
) -> Result<usize, CqError> {
    let pumped = shared.pump(wcs)?;
    if pumped.unclaimed > 0 {
        state
            .unclaimed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend_from_slice(&wcs[..pumped.unclaimed]);
    }
    Ok(pumped.polled)
}
