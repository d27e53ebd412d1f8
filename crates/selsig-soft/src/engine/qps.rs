//! The NIC thread's list of the QPs it serves: what each waits for, the changes to the
//! device's QPs taken as they come, and what the list as a whole tells the thread (armed
//! CQs to signal, work to do, a wait on another device).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use selsig::QpState;

use crate::state::{DeviceInner, QpChange, QpInner};

/// The NIC thread's view of one QP: itself, its peer, and what its send queue waits for.
pub(super) struct Served {
    pub(super) qp: Arc<QpInner>,
    pub(super) peer: Option<Arc<QpInner>>,
    pub(super) wait: Option<Wait>,
}

/// Why a send queue stalled, and so what lets it go on (or either side's error state).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Wait {
    /// RNR with retries forever: the peer's receive consumer index when its receive queue
    /// was found empty (waits for the producer to pass it).
    Receive(u64),
    /// rxe with a transport retry count of 7 retransmits forever: waits for the responder
    /// to listen (be in RTR or RTS) again.
    Responder,
}

impl Wait {
    /// Whether the wait still holds.
    pub(super) fn holds(self, qp: &QpInner, peer: Option<&QpInner>) -> bool {
        if qp.state() == QpState::Err {
            return false;
        }
        match (self, peer) {
            (Wait::Receive(seen), Some(peer)) => {
                peer.rq.published() == seen && peer.state() != QpState::Err
            }
            (Wait::Receive(_), None) => false,
            (Wait::Responder, peer) => !peer.is_some_and(listens),
        }
    }
}

/// Whether a QP answers requests (RTR or RTS).
pub(super) fn listens(qp: &QpInner) -> bool {
    matches!(qp.state(), QpState::Rtr | QpState::Rts)
}

/// The NIC thread's view of `qp`, waiting for nothing.
pub(super) fn served(qp: &Arc<QpInner>) -> Served {
    Served {
        qp: Arc::clone(qp),
        peer: qp.peer.lock().as_ref().and_then(|w| w.upgrade()),
        wait: None,
    }
}

/// Brings `served` up to date with the device's QPs: the changes since the last look, or
/// (`whole`, or where changes were lost) the whole list. Every wait is looked at again,
/// as after any change; `resume` keeps pointing at the same QP (or the next). Returns the
/// version it is up to date with.
pub(super) fn take_changes(
    dev: &DeviceInner,
    served: &mut Vec<Served>,
    resume: &mut usize,
    whole: bool,
) -> u64 {
    let mut reg = dev.qps.lock();
    if whole || reg.changes_lost {
        *served = reg.list.iter().map(self::served).collect();
        reg.changes.clear();
        reg.changes_lost = false;
    } else {
        let at = |served: &[Served], qp: &Arc<QpInner>| {
            served.iter().position(|s| Arc::ptr_eq(&s.qp, qp))
        };
        for change in reg.changes.drain(..) {
            match change {
                QpChange::Created(qp) => served.push(self::served(&qp)),
                // Removed in place: the others keep their order of service.
                QpChange::Destroyed(qp) => {
                    if let Some(i) = at(served, &qp) {
                        served.remove(i);
                        if i < *resume {
                            *resume -= 1;
                        }
                    }
                }
                QpChange::Connected(qp) => {
                    if let Some(i) = at(served, &qp) {
                        served[i] = self::served(&qp);
                    }
                }
            }
        }
        for s in served.iter_mut() {
            s.wait = None;
        }
    }
    if *resume >= served.len() {
        *resume = 0;
    }
    // Read under the lock: every change recorded before the version it reads is taken.
    dev.qps_version.load(Ordering::Acquire)
}

/// An event for each armed CQ that got completions past its arm (`CqEvents`).
pub(super) fn signal_armed(served: &[Served]) {
    for s in served {
        for cq in [&s.qp.send_cq, &s.qp.recv_cq] {
            if cq.events.due(cq.ring.produced()) {
                cq.events.signal();
            }
        }
    }
}

/// Whether a QP waits on a peer of another device, whose receive or state change rings
/// that device's doorbell, not this one's.
pub(super) fn waits_on_another_device(served: &[Served]) -> bool {
    served.iter().any(|s| {
        s.wait.is_some()
            && s.peer
                .as_ref()
                .is_none_or(|peer| !served.iter().any(|t| Arc::ptr_eq(&t.qp, peer)))
    })
}

/// Whether a QP has work the NIC can do now.
pub(super) fn has_work(s: &Served) -> bool {
    let qp = &s.qp;
    let sq_pending = qp.sq.published() != qp.sq.executed();
    let blocked = s.wait.is_some_and(|w| w.holds(qp, s.peer.as_deref()));
    let rq_flush = qp.state() == QpState::Err && qp.rq.published() != qp.rq.consumed();
    (sq_pending && !blocked) || rq_flush
}
