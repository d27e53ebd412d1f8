//! The state that the device's handles share with its NIC thread: the device's, with its
//! registry of queue pairs, each completion queue's and each queue pair's.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::thread::Thread;

use parking_lot::{Mutex, RwLock};

use selsig::{AsyncEvent, QpCaps, QpState};

use crate::config::SoftConfig;
use crate::events::CqEvents;
use crate::mr::MrTable;
use crate::ring::{CompletionRing, Cqe, RecvRing, SendRing};
use crate::sync::Padded;
use crate::times::ExecTimes;

/// The device's state, shared by its handles and its NIC thread.
#[derive(Debug)]
pub(crate) struct DeviceInner {
    pub(crate) name: String,
    pub(crate) gid: [u8; 16],
    pub(crate) config: SoftConfig,
    /// Read-locked by the NIC thread for each pass: a line of its own.
    pub(crate) mrs: Padded<RwLock<MrTable>>,
    pub(crate) qps: Mutex<Registry>,
    /// Bumped whenever the QP list or a QP's connection changes.
    pub(crate) qps_version: AtomicU64,
    /// The `qps_version` the NIC thread last took its list of QPs from: once it reaches a
    /// version, no turn of the NIC serves a QP removed before it.
    pub(crate) served_version: AtomicU64,
    /// Counts the NIC thread's steps (a group of work requests fetched, a pass): a
    /// destroy that waits for the thread to pass a QP by sees it move. Written by the NIC
    /// thread only: a line of its own.
    pub(crate) steps: Padded<AtomicU64>,
    pub(crate) events: Mutex<VecDeque<AsyncEvent>>,
    pub(crate) stop: AtomicBool,
    /// The device was lost ([`SoftDevice::inject_fatal`](crate::SoftDevice::inject_fatal)):
    /// the NIC executes nothing more.
    pub(crate) fatal: AtomicBool,
    /// Read by every doorbell: a line of its own.
    pub(crate) sleeping: Padded<AtomicBool>,
    pub(crate) engine_thread: OnceLock<Thread>,
    pub(crate) next_id: AtomicU32,
    /// Protection domains' ids: 64 bits, which never wrap, so that no two PDs ever share
    /// one (CQ ids and QP numbers come from `next_id`, which wraps).
    pub(crate) next_pd: AtomicU64,
}

#[derive(Debug, Default)]
pub(crate) struct Registry {
    pub(crate) list: Vec<Arc<QpInner>>,
    pub(crate) by_num: HashMap<u32, Weak<QpInner>>,
    /// What changed in `list` and the QPs' connections since the NIC thread last looked,
    /// in order: it applies them to its own list instead of taking the whole list again.
    pub(crate) changes: Vec<QpChange>,
    /// Too many changes piled up (no NIC thread took them): it takes the whole list.
    pub(crate) changes_lost: bool,
}

/// A change to the device's QPs, for the NIC thread.
#[derive(Debug)]
pub(crate) enum QpChange {
    Created(Arc<QpInner>),
    Destroyed(Arc<QpInner>),
    /// Connected: its peer is set.
    Connected(Arc<QpInner>),
}

impl Registry {
    /// Records `change` for the NIC thread (bump the version after, as for any change).
    pub(crate) fn record(&mut self, change: QpChange) {
        // A thread that runs takes them at its next turn; past this, none does (the device
        // was lost): it would take the whole list.
        if self.changes.len() > self.list.len() + 1024 {
            self.changes.clear();
            self.changes_lost = true;
        }
        if !self.changes_lost {
            self.changes.push(change);
        }
    }
}

impl DeviceInner {
    /// Wakes the NIC thread if it sleeps (after a doorbell, a receive, a state change).
    pub(crate) fn ring_doorbell(&self) {
        // Pairs with the NIC's fence between setting `sleeping` and checking the queues:
        // either it sees our new index, or we see it sleeping.
        crate::sync::fence(Ordering::SeqCst);
        if self.sleeping.load(Ordering::Relaxed)
            && let Some(t) = self.engine_thread.get()
        {
            t.unpark();
        }
    }

    pub(crate) fn push_event(&self, event: AsyncEvent) {
        self.events.lock().push_back(event);
    }

    /// The NIC thread took a step (its only writer: no read-modify-write needed).
    pub(crate) fn step(&self) {
        let n = self.steps.load(Ordering::Relaxed);
        self.steps.store(n.wrapping_add(1), Ordering::Relaxed);
    }

    /// Bumps `qps_version`; returns the new version.
    pub(crate) fn bump(&self) -> u64 {
        self.qps_version.fetch_add(1, Ordering::AcqRel) + 1
    }
}

/// The completion queue's state, shared with the NIC thread.
#[derive(Debug)]
pub(crate) struct CqInner {
    pub(crate) id: u32,
    pub(crate) ring: CompletionRing,
    pub(crate) error: AtomicBool,
    /// The NIC's last view of `consumer` (only the NIC thread uses it).
    pub(crate) seen_consumer: crate::sync::AtomicU64,
    pub(crate) free_on_poll: bool,
    /// mlx5: an overrun puts the CQ in the error state for good. rxe (Linux 6.1) drops
    /// the completion that finds no room, raises `IBV_EVENT_CQ_ERR` for it and goes on.
    pub(crate) overrun_is_fatal: bool,
    /// Created with `IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN` (mlx5): a completion that finds no
    /// room is lost without a word.
    pub(crate) ignore_overrun: bool,
    /// Its completion events (`ibv_req_notify_cq`).
    pub(crate) events: CqEvents,
    /// Written by the poller: on a line of its own, away from the NIC's fields.
    pub(crate) poll: Padded<Mutex<PollState>>,
    pub(crate) send_queues: RwLock<HashMap<u32, Arc<SendRing>>>,
    /// The receive queues completing here (mlx5 frees their slots as it polls).
    pub(crate) recv_queues: RwLock<HashMap<u32, Arc<RecvRing>>>,
}

#[derive(Debug, Default)]
pub(crate) struct PollState {
    pub(crate) consumer: u64,
    pub(crate) last_sq: Option<(u32, Arc<SendRing>)>,
}

impl CqInner {
    /// Poller: removes the completions of QP `qpn` that were not polled yet, keeping the
    /// others in order (mlx5's `__mlx5_cq_clean`: from the newest completion back to the
    /// oldest, each kept one moves up by the number removed so far, then the consumer
    /// index skips the freed slots). The NIC must no longer complete work of that QP;
    /// it may go on appending others' completions meanwhile.
    pub(crate) fn clean(&self, qpn: u32) {
        let mut st = self.poll.lock();
        let consumer = st.consumer;
        let producer = consumer + self.ring.available(consumer);
        let mut removed = 0;
        for index in (consumer..producer).rev() {
            let c = self.ring.read(index);
            if c.qp_num == qpn {
                removed += 1;
            } else if removed > 0 {
                self.ring.overwrite(index + removed, &c);
            }
        }
        if st.last_sq.as_ref().is_some_and(|(n, _)| *n == qpn) {
            st.last_sq = None;
        }
        st.consumer += removed;
        self.ring.set_consumed(st.consumer);
    }

    /// NIC: appends a completion. A CQ with no room goes to the error state, and every
    /// later completion is lost (mlx5); or it drops only that completion (rxe).
    pub(crate) fn push(&self, cqe: &Cqe) -> Pushed {
        if self.error.load(Ordering::Relaxed) {
            return Pushed::Lost;
        }
        if !self.ring.push(cqe, &self.seen_consumer) {
            if self.ignore_overrun {
                return Pushed::Ignored;
            }
            if !self.overrun_is_fatal {
                return Pushed::Dropped;
            }
            self.error.store(true, Ordering::Release);
            return Pushed::Overrun;
        }
        Pushed::Done
    }
}

/// What became of a completion the NIC appended to a CQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pushed {
    Done,
    /// The CQ had no room: it went to the error state with this completion.
    Overrun,
    /// The CQ was in the error state already: the completion is lost.
    Lost,
    /// The CQ had no room and dropped this completion only (rxe): it stays usable.
    Dropped,
    /// The CQ had no room and ignores overruns: the completion is lost, and nothing says
    /// so.
    Ignored,
}

/// A queue pair's state, shared with the NIC thread.
#[derive(Debug)]
pub(crate) struct QpInner {
    pub(crate) qpn: u32,
    pub(crate) pd: u64,
    pub(crate) caps: QpCaps,
    pub(crate) sq_sig_all: bool,
    pub(crate) sq: Arc<SendRing>,
    /// When each send work request finished, while recording.
    pub(crate) times: ExecTimes,
    pub(crate) rq: Arc<RecvRing>,
    pub(crate) send_cq: Arc<CqInner>,
    pub(crate) recv_cq: Arc<CqInner>,
    pub(crate) state: AtomicU8,
    /// What peers may do to this QP's memory (`qp_access_flags`).
    pub(crate) access: AtomicU32,
    pub(crate) rnr_retry: AtomicU8,
    /// The transport retry count (rxe retries forever at 7).
    pub(crate) retry_cnt: AtomicU8,
    /// The path MTU in bytes: messages longer than this travel as several packets, which
    /// the responder handles one at a time (set when the QP connects).
    pub(crate) path_mtu: AtomicU32,
    pub(crate) peer: Mutex<Option<Weak<QpInner>>>,
    /// Slots are freed when completions are polled (mlx5), not when WQEs execute (rxe).
    pub(crate) free_on_poll: bool,
    /// Written by posters: on lines of their own, away from what the NIC reads.
    pub(crate) post: Padded<Mutex<Producer>>,
    pub(crate) recv_post: Padded<Mutex<u64>>,
}

#[derive(Debug, Default)]
pub(crate) struct Producer {
    pub(crate) head: u64,
    /// The last seen value of the index that frees slots.
    pub(crate) freed: u64,
}

impl QpInner {
    pub(crate) fn state(&self) -> QpState {
        QpState::try_from(u32::from(self.state.load(Ordering::Acquire))).unwrap_or(QpState::Err)
    }

    /// Moves to `to` if the state is still `from`.
    pub(crate) fn transition(&self, from: QpState, to: QpState) -> bool {
        self.state
            .compare_exchange(from as u8, to as u8, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// The QP was destroyed: it is back in the reset state, where it neither executes
    /// nor responds.
    pub(crate) fn destroy(&self) {
        self.state.store(QpState::Reset as u8, Ordering::Release);
    }

    /// Moves to the error state, whatever the state was.
    pub(crate) fn set_error(&self) {
        self.state.store(QpState::Err as u8, Ordering::Release);
    }

    pub(crate) fn freed(&self) -> u64 {
        self.sq.freed(self.free_on_poll)
    }
}
