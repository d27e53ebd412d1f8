//! The NIC thread: executes every send queue's work requests in order, moves the bytes,
//! writes completions, and flushes queues in the error state.
//!
//! One thread per device serves all its queue pairs, round robin, at most [`BUDGET`] work
//! requests of one queue per turn. Loopback is the only fabric: a work request's
//! responder is the peer QP on the same device, handled by the same thread, so there is
//! one producer for every completion queue. When idle the thread spins briefly, yields,
//! then parks until a doorbell wakes it.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::Mutex;
use selsig::{ATOMIC_LEN, Access, AsyncEvent, QpState, WcOpcode, WcStatus};

use crate::config::Personality;
use crate::mem;
use crate::mr::{MrInner, MrTable};
use crate::ring::{Cqe, Wqe, op};
use crate::state::{CqInner, DeviceInner, Pushed, QpInner};

mod data;
mod qps;
use data::{List, Source, copy, copy_part, source};
use qps::{Served, Wait, has_work, listens, signal_armed, take_changes, waits_on_another_device};

/// Stops and joins the NIC thread when the last handle of the device goes.
#[derive(Debug)]
pub(crate) struct Engine {
    pub(crate) dev: Arc<DeviceInner>,
    pub(crate) thread: Mutex<Option<JoinHandle<()>>>,
}

impl Engine {
    /// Whether the NIC thread still turns (it ends when the device is dropped or lost).
    pub(crate) fn running(&self) -> bool {
        self.thread
            .lock()
            .as_ref()
            .is_some_and(|t| !t.is_finished())
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.dev.stop.store(true, Ordering::Release);
        if let Some(t) = self.dev.engine_thread.get() {
            t.unpark();
        }
        if let Some(handle) = self.thread.lock().take()
            && handle.join().is_err()
        {
            // Not `eprintln!`, which panics (here, in a `Drop`) when stderr is closed.
            use std::io::Write as _;
            let _ = writeln!(
                std::io::stderr(),
                "selsig-soft: the NIC thread of {} panicked",
                self.dev.name
            );
        }
    }
}

/// QPs served between two looks at whether the device's QPs changed.
const CHANGE_CHECK: usize = 64;

/// Work requests of one send queue executed per turn.
pub(crate) const BUDGET: u64 = 256;
/// WQEs taken as one group: once a group, the responder's state is read, execution times
/// are stamped at the latest, and the next group's lines are loaded.
const FETCH: usize = 16;

/// While recording execution times, a work request is stamped when it finishes once this
/// many bytes were moved since the last stamp; smaller ones share the stamp of the next
/// (at the latest the end of their fetch group). A stamp is then late by at most the time
/// to move this much and a fetch group's overhead, and costs one clock read per this many
/// bytes at most.
const STAMP_BYTES: u64 = 16 << 10;
const SPIN: u32 = 2_000;
const YIELD: u32 = 50;
/// The longest sleep while a QP waits on a peer of another device (whose receive or
/// state change rings that device's doorbell): a safety net, the doorbell wakes the thread.
const PARK: Duration = Duration::from_millis(5);
/// The longest sleep with nothing waiting on a peer: every change the NIC acts on rings
/// its doorbell, so this only bounds how long a missed wake could cost, while an idle
/// device wakes 20 times a second (docs/soft-nic.md: an idle process uses well under 1 %
/// of a core).
const IDLE_PARK: Duration = Duration::from_millis(50);

pub(crate) fn run(dev: Arc<DeviceInner>) {
    let mut served: Vec<Served> = Vec::new();
    // Where the next turn starts in `served` (a turn cut short by a change goes on there).
    let mut resume = 0usize;
    let mut version = u64::MAX;
    let mut idle = 0u32;
    loop {
        // A lost device executes nothing more and makes no event: the thread ends.
        if dev.stop.load(Ordering::Acquire) || dev.fatal.load(Ordering::Acquire) {
            return;
        }
        if dev.qps_version.load(Ordering::Acquire) != version {
            version = take_changes(&dev, &mut served, &mut resume, version == u64::MAX);
            // No QP removed before `version` is served from here on (`SoftQp`'s drop
            // waits for this before it cleans the QP's completions away).
            dev.served_version.store(version, Ordering::Release);
        }
        let mut progress = false;
        dev.step();
        let mut cut = false;
        {
            let mrs = dev.mrs.read();
            let n = served.len();
            let mut at = resume;
            for k in 1..=n {
                progress |= serve(&dev, &mut served[at], &mrs);
                at = if at + 1 == n { 0 } else { at + 1 };
                // A change to the QPs (which a destroy waits for) is taken without finishing
                // the turn: with thousands of QPs a turn is long. The next goes on from here.
                if k % CHANGE_CHECK == 0
                    && k < n
                    && dev.qps_version.load(Ordering::Relaxed) != version
                {
                    resume = at;
                    cut = true;
                    break;
                }
            }
        }
        // A turn cut short with nothing done is followed at once by the next: only
        // another device's NIC can have added completions meanwhile, and the next full
        // turn (or the idle path) makes their events.
        if progress || !cut {
            signal_armed(&served);
        }
        if progress {
            idle = 0;
            continue;
        }
        idle = idle.saturating_add(1);
        if idle < SPIN {
            std::hint::spin_loop();
        } else if idle < SPIN + YIELD {
            std::thread::yield_now();
        } else {
            dev.sleeping.store(true, Ordering::Relaxed);
            // Pairs with the fence of `ring_doorbell`.
            crate::sync::fence(Ordering::SeqCst);
            // Behind the fence: an arm this turn missed is seen here (`CqEvents`).
            signal_armed(&served);
            let pending = served.iter().any(has_work)
                || dev.qps_version.load(Ordering::Acquire) != version
                || dev.stop.load(Ordering::Acquire);
            if !pending {
                std::thread::park_timeout(if waits_on_another_device(&served) {
                    PARK
                } else {
                    IDLE_PARK
                });
            }
            dev.sleeping.store(false, Ordering::Relaxed);
        }
    }
}

/// One turn of one QP; `true` when anything was done.
fn serve(dev: &DeviceInner, s: &mut Served, mrs: &MrTable) -> bool {
    let qp = &*s.qp;
    let mut progress = false;
    if let Some(wait) = s.wait {
        if wait.holds(qp, s.peer.as_deref()) {
            return flush_rq_if_error(dev, qp);
        }
        s.wait = None;
    }
    let producer = qp.sq.published();
    let mut exec = qp.sq.executed();
    if s.peer.is_none() && producer != exec {
        // Connected after this thread took its list of QPs (a connect does not wait for
        // the next pass): its peer is set before the QP is ready to send, so before any
        // work request it posts is published.
        s.peer = qp.peer.lock().as_ref().and_then(Weak::upgrade);
    }
    let end = producer.min(exec + BUDGET);
    let peer = s.peer.as_deref();
    let mut state = qp.state();
    // WQEs are taken a group at a time. The lines of each group are loaded one group
    // ahead: those loads are independent, so their cache misses (the lines come from the
    // poster's core) overlap with each other and with the work on the group before.
    let mut found = Found::default();
    qp.sq.touch(exec, (exec + FETCH as u64).min(end));
    'fetch: while exec < end {
        let n = (end - exec).min(FETCH as u64) as usize;
        qp.sq.touch(exec + n as u64, (exec + 2 * n as u64).min(end));
        dev.step();
        // The responder's state is read once a group: the NIC's own moves of it to the
        // error state come with the requester's, which flushes the rest of the group.
        let answering = peer.filter(|p| listens(p));
        let recording = qp.times.on();
        let mut stamped = exec;
        let mut unstamped_bytes = 0u64;
        for _ in 0..n {
            let wqe = &qp.sq.read(exec);
            // Most WQEs of a stream are unsignaled WRITEs between regions the pass already
            // found: they take a short path, the same checks and copy as `execute`'s.
            if state != QpState::Err
                && let Some(peer) = answering
                && !qp.sq_sig_all
                && plain_write(peer, wqe, &found)
            {
                exec += 1;
                progress = true;
                if recording {
                    stamp_unsignaled(qp, exec, wqe.len, &mut stamped, &mut unstamped_bytes);
                }
                continue;
            }
            let counter = exec as u16;
            let cqe = if state == QpState::Err {
                Some(error_cqe(qp, exec, WcStatus::WrFlushErr))
            } else {
                match execute(dev, qp, answering, wqe, exec, mrs, &mut found) {
                    Exec::Done { opcode, byte_len } => {
                        (wqe.signaled || qp.sq_sig_all).then(|| Cqe {
                            wr_id: qp.sq.wr_id(exec),
                            status: WcStatus::Success as u8,
                            opcode: opcode as u8,
                            send_queue: true,
                            has_imm: false,
                            wqe_counter: counter,
                            byte_len,
                            qp_num: qp.qpn,
                            imm: 0,
                            vendor_err: 0,
                        })
                    }
                    Exec::Stall(why) => {
                        if recording {
                            qp.times.stamp(stamped, exec);
                        }
                        s.wait = Some(match why {
                            // Wait for the producer to pass what the peek saw: the
                            // consumer index (the queue was empty), which only this thread
                            // moves. The producer read again could already count a
                            // receive posted since the peek, which would then never wake
                            // this QP.
                            Stall::Receive => Wait::Receive(peer.map_or(0, |p| p.rq.consumed())),
                            Stall::Responder => Wait::Responder,
                        });
                        break 'fetch;
                    }
                    Exec::Fail { status, responder } => {
                        qp.set_error();
                        state = QpState::Err;
                        let rxe = dev.config.personality == Personality::Rxe;
                        if let (Some(event), Some(peer)) = (responder, peer) {
                            peer.set_error();
                            // mlx5 raises the responder's affiliated event (IBV_EVENT_QP_ACCESS_ERR);
                            // rxe (Linux 6.1) raises none.
                            if !rxe {
                                dev.push_event(event(peer.qpn));
                            }
                        }
                        Some(error_cqe(qp, exec, status))
                    }
                }
            };
            exec += 1;
            progress = true;
            if let Some(cqe) = cqe {
                // Recorded before the completion can be seen: the application never
                // learns of a work request before the time recorded for it.
                if recording {
                    qp.times.stamp(stamped, exec);
                    stamped = exec;
                    unstamped_bytes = 0;
                }
                // rxe frees a WQE's slot before it posts the completion (`rxe_comp.c`,
                // `do_complete`): who polls it finds the slot free. (mlx5 frees slots
                // when completions are polled; the pass publishes its progress at its end.)
                if !qp.free_on_poll {
                    qp.sq.set_executed(exec);
                }
                if !push(dev, qp, &qp.send_cq, &cqe) {
                    state = QpState::Err;
                }
            } else if recording {
                stamp_unsignaled(qp, exec, wqe.len, &mut stamped, &mut unstamped_bytes);
            }
        }
        if recording && stamped < exec {
            qp.times.stamp(stamped, exec);
        }
        // The application may have moved the QP to the error state meanwhile.
        state = qp.state();
    }
    if progress {
        qp.sq.set_executed(exec);
    }
    flush_rq_if_error(dev, qp) || progress
}

/// While recording: an unsignaled work request of `len` bytes finished before `exec`.
/// The ones since `stamped` are stamped once `STAMP_BYTES` were moved since the last stamp.
#[inline(always)]
fn stamp_unsignaled(qp: &QpInner, exec: u64, len: u32, stamped: &mut u64, unstamped: &mut u64) {
    *unstamped += u64::from(len);
    if *unstamped >= STAMP_BYTES {
        qp.times.stamp(*stamped, exec);
        *stamped = exec;
        *unstamped = 0;
    }
}

/// The completion in error of WQE `index`.
fn error_cqe(qp: &QpInner, index: u64, status: WcStatus) -> Cqe {
    // Only wr_id, status, qp_num and vendor_err are valid in an error completion; the
    // opcode is left 0, as rxe leaves it.
    Cqe {
        wr_id: qp.sq.wr_id(index),
        status: status as u8,
        opcode: 0,
        send_queue: true,
        has_imm: false,
        wqe_counter: index as u16,
        byte_len: 0,
        qp_num: qp.qpn,
        imm: 0,
        vendor_err: 0,
    }
}

/// Appends a completion of `qp` to `cq`; `false` when it is lost and `qp` went to the
/// error state. mlx5: a CQ that finds no room goes to the error state with
/// `IBV_EVENT_CQ_ERR`, once; a QP whose completion is lost goes to the error state with
/// `IBV_EVENT_QP_FATAL`, once. rxe (Linux 6.1, `rxe_cq_post`): the completion is dropped
/// with an `IBV_EVENT_CQ_ERR` of its own, and the CQ and the QP go on as before.
fn push(dev: &DeviceInner, qp: &QpInner, cq: &CqInner, cqe: &Cqe) -> bool {
    matches!(
        push_with(dev, qp, cq, cqe),
        Pushed::Done | Pushed::Dropped | Pushed::Ignored
    )
}

/// [`push`], saying what became of the completion. On mlx5 an error completion carries a
/// vendor syndrome ([`mlx5_vendor_err`]); rxe leaves it 0.
fn push_with(dev: &DeviceInner, qp: &QpInner, cq: &CqInner, cqe: &Cqe) -> Pushed {
    let with_syndrome;
    let cqe =
        if cqe.status != WcStatus::Success as u8 && dev.config.personality == Personality::Mlx5 {
            with_syndrome = Cqe {
                vendor_err: mlx5_vendor_err(cqe.status),
                ..*cqe
            };
            &with_syndrome
        } else {
            cqe
        };
    let pushed = cq.push(cqe);
    match pushed {
        Pushed::Done | Pushed::Ignored => return pushed,
        Pushed::Dropped => {
            dev.push_event(AsyncEvent::CqErr { cq: cq.id });
            return pushed;
        }
        Pushed::Overrun => dev.push_event(AsyncEvent::CqErr { cq: cq.id }),
        Pushed::Lost => {}
    }
    if qp.state() != QpState::Err {
        qp.set_error();
        dev.push_event(AsyncEvent::QpFatal { qp_num: qp.qpn });
    }
    pushed
}

/// The vendor syndrome of an mlx5 error completion with `status` (an `ibv_wc_status`):
/// libmlx5 hands the CQE's `vendor_err_synd` byte to `wc.vendor_err`
/// (`providers/mlx5/cq.c`, `mlx5_parse_cqe`), a value the hardware sets and no source
/// defines (semantics 34). These are values reported with each status in public logs of
/// ConnectX devices; where none was found, 0x01, a stand-in that is at least not 0.
pub(crate) fn mlx5_vendor_err(status: u8) -> u32 {
    match WcStatus::try_from(u32::from(status)) {
        // openucx/ucx#7774 ("local protection error ... vendor_err 0x51"),
        // linux-rdma/perftest#173 ("Failed status 4 ... syndrom 0x51").
        Ok(WcStatus::LocProtErr) => 0x51,
        // openucx/ucx#1569 ("remote access error syndrome 0x88", CQE dump 00008813),
        // ofiwg/libfabric#4283 (the same dump).
        Ok(WcStatus::RemAccessErr) => 0x88,
        // openucx/ucx#3851 ("Work Request Flushed Error, vendor_err 0xf9", mlx5).
        Ok(WcStatus::WrFlushErr) => 0xf9,
        // openucx/ucx#2973, #6000 ("Transport retry count exceeded (synd 0x15 vend 0x81)").
        Ok(WcStatus::RetryExcErr) => 0x81,
        // charmplusplus/charm#2532 (IBV_WC_REM_INV_REQ_ERR with vendor_err 0x8a).
        Ok(WcStatus::RemInvReqErr) => 0x8a,
        // openucx/ucx#857 (CQE dump 01006102: syndrome 0x02, vendor 0x61).
        Ok(WcStatus::LocQpOpErr) => 0x61,
        _ => 0x01,
    }
}

/// In the error state, every posted receive is flushed: one completion each.
fn flush_rq_if_error(dev: &DeviceInner, qp: &QpInner) -> bool {
    if qp.state() != QpState::Err {
        return false;
    }
    let producer = qp.rq.published();
    let mut consumer = qp.rq.consumed();
    if producer == consumer {
        return false;
    }
    while consumer < producer {
        let rqe = qp.rq.read(consumer);
        let cqe = Cqe {
            wr_id: rqe.wr_id,
            status: WcStatus::WrFlushErr as u8,
            opcode: WcOpcode::Recv as u8,
            send_queue: false,
            has_imm: false,
            wqe_counter: 0,
            byte_len: 0,
            qp_num: qp.qpn,
            imm: 0,
            vendor_err: 0,
        };
        consumer += 1;
        if !push(dev, qp, &qp.recv_cq, &cqe) {
            // The CQ is in the error state: the other flushes are lost as well.
            consumer = producer;
        }
    }
    qp.rq.set_consumed(consumer);
    true
}

enum Exec {
    Done {
        opcode: WcOpcode,
        byte_len: u32,
    },
    /// The requester retries forever, and the work request waits (not executed).
    Stall(Stall),
    Fail {
        status: WcStatus,
        /// The responder moves to the error state with this event.
        responder: Option<fn(u32) -> AsyncEvent>,
    },
}

/// Why a work request waits.
enum Stall {
    /// The responder has no receive posted (RNR retry 7).
    Receive,
    /// The responder does not answer (rxe, transport retry count 7).
    Responder,
}

fn fail(status: WcStatus) -> Exec {
    Exec::Fail {
        status,
        responder: None,
    }
}

fn remote_access_error() -> Exec {
    Exec::Fail {
        status: WcStatus::RemAccessErr,
        responder: Some(|qp_num| AsyncEvent::QpAccessErr { qp_num }),
    }
}

/// rxe: the responder QP does not allow the operation (its `qp_access_flags`): an
/// invalid request, whatever the length and the key (`check_op_valid` comes first in
/// `rxe_resp.c`); the responder goes to the error state (with no event, as rxe raises
/// none for a responder).
fn invalid_request() -> Exec {
    Exec::Fail {
        status: WcStatus::RemInvReqErr,
        responder: Some(|qp_num| AsyncEvent::QpReqErr { qp_num }),
    }
}

/// Whether the responder QP allows `need` (`qp_access_flags`).
fn qp_allows(responder: &QpInner, need: Access) -> bool {
    Access::from_bits_truncate(responder.access.load(Ordering::Relaxed)).contains(need)
}

/// A requester's local data cannot be read (bad lkey, other PD, out of bounds): a local
/// protection error on mlx5; rxe reports it as a local QP operation error.
fn local_source_error(rxe: bool) -> Exec {
    fail(if rxe {
        WcStatus::LocQpOpErr
    } else {
        WcStatus::LocProtErr
    })
}

/// Where an RDMA READ's data lands.
enum Destination<'m> {
    /// Nowhere: a zero-length READ.
    None,
    One(&'m MrInner, usize),
    /// Over a scatter/gather list.
    Scatter(List<'m>),
}

/// Executes `wqe` if it is an unsignaled RDMA WRITE, neither inline nor empty, from the
/// region last found as the pass's local source to the one last found written at
/// `responder`, both ranges inside, the responder allowing remote writes; `false`, having
/// done nothing, for any other WQE (for [`execute`], which then checks it in full). What
/// it does is what `execute` does with such a WQE: the keys were checked when their
/// regions were found, and hold for the pass (see [`Found`]).
#[inline(always)]
fn plain_write(responder: &QpInner, wqe: &Wqe, found: &Found<'_>) -> bool {
    if wqe.opcode != op::WRITE || wqe.signaled || wqe.inline || wqe.len == 0 {
        return false;
    }
    let (Some(src), Some(dst)) = (found.source, found.written) else {
        return false;
    };
    if src.key != wqe.lkey || dst.key != wqe.rkey || !qp_allows(responder, Access::REMOTE_WRITE) {
        return false;
    }
    let (Some(from), Some(to)) = (
        src.offset_of(wqe.local_addr, wqe.len),
        dst.offset_of(wqe.remote_addr, wqe.len),
    ) else {
        return false;
    };
    mem::copy(&src.words, from, &dst.words, to, wqe.len as usize);
    true
}

/// The local region of `[addr, addr + len)` under `lkey`, checked like hardware: the key
/// is current, the region belongs to the QP's protection domain, the range is inside it,
/// and the access is granted.
fn local(
    mrs: &MrTable,
    pd: u64,
    lkey: u32,
    addr: u64,
    len: u32,
    need: Access,
) -> Option<(&MrInner, usize)> {
    let mr = region(mrs, pd, lkey, need)?;
    Some((mr, mr.offset_of(addr, len)?))
}

/// The region of `key`, if current, of protection domain `pd` and granting `need`.
fn region(mrs: &MrTable, pd: u64, key: u32, need: Access) -> Option<&MrInner> {
    mrs.get(key)
        .filter(|mr| mr.pd == pd && mr.access.contains(need))
}

/// The responder's region of `[addr, addr + len)` under `rkey`: the key is current, the
/// region is of the responder QP's protection domain, both the region and the QP grant
/// `need`, the range is inside the region.
///
/// `slot` is the [`Found`] role of `need` at this responder.
fn remote<'m>(
    mrs: &'m MrTable,
    slot: &mut Option<&'m MrInner>,
    responder: &QpInner,
    rkey: u32,
    addr: u64,
    len: u32,
    need: Access,
) -> Option<(&'m MrInner, usize)> {
    if !qp_allows(responder, need) {
        return None;
    }
    let mr = remembered(slot, rkey, || region(mrs, responder.pd, rkey, need))?;
    Some((mr, mr.offset_of(addr, len)?))
}

/// The regions a pass over one QP's WQEs found, by role, with the checks of the role
/// passed: the WQEs of a stream mostly name the same few regions, and a key equal to the
/// last one found for its role skips the table and those checks. The table does not
/// change during a pass (it is read-locked), nor does a region's PD or access, nor the
/// pass's QP and peer: what was checked once holds for the whole pass.
#[derive(Default)]
struct Found<'m> {
    /// The last region read as the QP's local source (of its PD; any access reads).
    source: Option<&'m MrInner>,
    /// The last region an RDMA WRITE wrote at the responder (of the peer's PD, granting
    /// remote write).
    written: Option<&'m MrInner>,
    /// The last region an RDMA READ read at the responder (of the peer's PD, granting
    /// remote read).
    read: Option<&'m MrInner>,
}

/// The region in `slot` if its key is `key`, else the one `find` checks (then kept in
/// `slot`).
#[inline(always)]
fn remembered<'m>(
    slot: &mut Option<&'m MrInner>,
    key: u32,
    find: impl FnOnce() -> Option<&'m MrInner>,
) -> Option<&'m MrInner> {
    if let Some(mr) = *slot
        && mr.key == key
    {
        return Some(mr);
    }
    let mr = find()?;
    *slot = Some(mr);
    Some(mr)
}

/// Where the last packet of a message of `len` bytes starts, with packets of `mtu` bytes
/// (0 for a message of one packet, an empty one included).
fn last_packet(len: u32, mtu: u32) -> u32 {
    len.saturating_sub(1) / mtu * mtu
}

/// A message that does not fit the receive `rqe` (too long, or beyond its region, or
/// under a key the responder cannot write with): its packets arrive one after the other,
/// and those that fit whole in both the receive and its region are placed before the one
/// that fails. A SEND's length is known only at its last packet, so any responder places
/// the first ones as they come (seen on rxe0: 4096 of 8192 bytes into a receive of 5000).
fn place_packets_that_fit(
    mrs: &MrTable,
    responder: &QpInner,
    rqe: &crate::ring::Rqe,
    src: &Source<'_>,
    mtu: u32,
) {
    let Some(mr) = mrs
        .get(rqe.lkey)
        .filter(|mr| mr.pd == responder.pd && mr.access.contains(Access::LOCAL_WRITE))
    else {
        return;
    };
    let Some(off) = rqe.addr.checked_sub(mr.addr) else {
        return;
    };
    let room = (mr.len as u64).saturating_sub(off).min(u64::from(rqe.len));
    // Less than the message: it did not fit.
    let fits = (room / u64::from(mtu) * u64::from(mtu)) as u32;
    if fits > 0 {
        copy(src, &mr.words, off as usize, fits);
    }
}

/// The next receive of `qp`, without consuming it.
fn peek_recv(qp: &QpInner) -> Option<crate::ring::Rqe> {
    let consumer = qp.rq.consumed();
    (qp.rq.published() > consumer).then(|| qp.rq.read(consumer))
}

fn consume_recv(qp: &QpInner) {
    qp.rq.set_consumed(qp.rq.consumed() + 1);
}

fn recv_cqe(
    responder: &QpInner,
    wr_id: u64,
    status: WcStatus,
    opcode: WcOpcode,
    byte_len: u32,
    imm: Option<u32>,
) -> Cqe {
    Cqe {
        wr_id,
        status: status as u8,
        opcode: opcode as u8,
        send_queue: false,
        has_imm: imm.is_some(),
        wqe_counter: 0,
        byte_len,
        qp_num: responder.qpn,
        imm: imm.unwrap_or(0),
        vendor_err: 0,
    }
}

fn no_receive(qp: &QpInner) -> Exec {
    if qp.rnr_retry.load(Ordering::Relaxed) >= 7 {
        Exec::Stall(Stall::Receive)
    } else {
        fail(WcStatus::RnrRetryExcErr)
    }
}

/// Appends a receive completion of `responder` (see [`push`]). `false` when, on rxe, it
/// found no room: rxe's responder then moves its QP to the error state before it
/// acknowledges the request (`rxe_resp.c`: a failed `rxe_cq_post` in `do_complete` is
/// `RESPST_ERR_CQ_OVERFLOW`, which goes to `RESPST_ERROR` and `rxe_qp_error`, with no
/// event of its own), so the requester hears nothing: see [`no_answer`].
#[must_use]
fn push_recv(dev: &DeviceInner, responder: &QpInner, cqe: &Cqe) -> bool {
    if push_with(dev, responder, &responder.recv_cq, cqe) != Pushed::Dropped {
        return true;
    }
    responder.set_error();
    false
}

/// The requester's outcome when its responder does not answer: its retries run out, except
/// on rxe with a retry count of 7, which its completer never counts down (`rxe_comp.c`).
fn no_answer(qp: &QpInner, rxe: bool) -> Exec {
    if rxe && qp.retry_cnt.load(Ordering::Relaxed) >= 7 {
        Exec::Stall(Stall::Responder)
    } else {
        fail(WcStatus::RetryExcErr)
    }
}

/// Executes WQE `index` of `qp`. `peer` is the responder if it answers (in RTR or RTS).
fn execute<'m>(
    dev: &DeviceInner,
    qp: &'m QpInner,
    peer: Option<&QpInner>,
    wqe: &Wqe,
    index: u64,
    mrs: &'m MrTable,
    found: &mut Found<'m>,
) -> Exec {
    let rxe = dev.config.personality == Personality::Rxe;
    let Some(peer) = peer else {
        return no_answer(qp, rxe);
    };
    let request = Request {
        dev,
        qp,
        peer,
        wqe,
        index,
        rxe,
    };
    match wqe.opcode {
        op::WRITE | op::WRITE_IMM => request.write(mrs, found),
        op::READ => request.read(mrs, found),
        op::SEND | op::SEND_IMM => request.send(mrs, found),
        op::CMP_SWP | op::FETCH_ADD => request.atomic(mrs),
        _ => fail(WcStatus::LocQpOpErr),
    }
}

/// A work request [`execute`] has for an answering responder, for the method of its
/// opcode.
#[derive(Clone, Copy)]
struct Request<'r, 'm> {
    dev: &'r DeviceInner,
    /// The requester.
    qp: &'m QpInner,
    /// The responder, answering (in RTR or RTS).
    peer: &'r QpInner,
    /// WQE `index` of `qp`'s send queue.
    wqe: &'r Wqe,
    index: u64,
    /// Whether the device has the rxe personality.
    rxe: bool,
}

impl<'m> Request<'_, 'm> {
    /// Executes an RDMA WRITE, with immediate data or without.
    fn write(&self, mrs: &'m MrTable, found: &mut Found<'m>) -> Exec {
        let len = self.wqe.len;
        let Some(src) = source(self.qp, self.wqe, self.index, mrs, found) else {
            return local_source_error(self.rxe);
        };
        if self.rxe && !qp_allows(self.peer, Access::REMOTE_WRITE) {
            return invalid_request();
        }
        let imm = self.wqe.opcode == op::WRITE_IMM;
        // Where the last packet starts: a message longer than the path MTU travels as
        // several packets. The first carries the key and the length, which the
        // responder checks for the whole message; only the last, with the immediate
        // data, needs a receive. (Not computed for a WRITE without immediate, whose
        // packets all go the same way.)
        let last = if imm {
            last_packet(len, self.qp.path_mtu.load(Ordering::Relaxed))
        } else {
            0
        };
        // rxe looks for the receive of a WRITE with immediate of one packet before it
        // checks the key (`rxe_resp.c`: `check_resource` comes before `check_rkey`).
        let mut rqe = None;
        if self.rxe && imm && last == 0 {
            match peek_recv(self.peer) {
                Some(r) => rqe = Some(r),
                None => return no_receive(self.qp),
            }
        }
        // The remote key of a zero-length RDMA WRITE is not checked: there is no memory
        // to protect (IBTA; this is what makes it usable as a confirm marker).
        let Some(dst) = self.remote_range(mrs, &mut found.written, Access::REMOTE_WRITE) else {
            if let Some(rqe) = rqe {
                // rxe completes the receive it took with the error.
                let status = WcStatus::RemAccessErr;
                if !complete_write_recv(self.dev, self.peer, &rqe, status, 0, None) {
                    return no_answer(self.qp, self.rxe);
                }
            }
            return remote_access_error();
        };
        // The packets before the last are placed as they arrive, whether a receive
        // waits or not.
        let mut placed = 0;
        if imm && rqe.is_none() {
            if let Some((mr, off)) = dst {
                copy_part(&src, 0, &mr.words, off, last);
                placed = last;
            }
            match peek_recv(self.peer) {
                Some(r) => rqe = Some(r),
                None => return no_receive(self.qp),
            }
        }
        if let Some((mr, off)) = dst {
            copy_part(&src, placed, &mr.words, off, len - placed);
        }
        if let Some(rqe) = rqe {
            let imm = Some(self.qp.sq.imm(self.index));
            if !complete_write_recv(self.dev, self.peer, &rqe, WcStatus::Success, len, imm) {
                return no_answer(self.qp, self.rxe);
            }
        }
        Exec::Done {
            opcode: WcOpcode::RdmaWrite,
            byte_len: len,
        }
    }

    /// Executes an RDMA READ.
    fn read(&self, mrs: &'m MrTable, found: &mut Found<'m>) -> Exec {
        let len = self.wqe.len;
        if self.rxe && !qp_allows(self.peer, Access::REMOTE_READ) {
            return invalid_request();
        }
        // The destination; `None` if it cannot be written (a list: any of its entries).
        let destination = || {
            if len == 0 {
                return Some(Destination::None);
            }
            // A READ's data is in its slot only as a list (an inline READ is refused).
            if self.wqe.inline {
                let list = List::checked(
                    self.qp,
                    self.wqe,
                    self.index,
                    mrs,
                    self.qp.pd,
                    Access::LOCAL_WRITE,
                );
                return list.map(Destination::Scatter);
            }
            local(
                mrs,
                self.qp.pd,
                self.wqe.lkey,
                self.wqe.local_addr,
                len,
                Access::LOCAL_WRITE,
            )
            .map(|(mr, off)| Destination::One(mr, off))
        };
        // mlx5 checks the destination before it sends the request; rxe when the
        // response comes back (`rxe_comp.c`), after the responder checked its key.
        let mut dst = Destination::None;
        if !self.rxe {
            let Some(d) = destination() else {
                return fail(WcStatus::LocProtErr);
            };
            dst = d;
        }
        let Some(src) = self.remote_range(mrs, &mut found.read, Access::REMOTE_READ) else {
            return remote_access_error();
        };
        if self.rxe {
            let Some(d) = destination() else {
                return fail(WcStatus::LocProtErr);
            };
            dst = d;
        }
        if let Some((smr, soff)) = src {
            match dst {
                Destination::One(dmr, doff) => {
                    mem::copy(&smr.words, soff, &dmr.words, doff, len as usize);
                }
                Destination::Scatter(list) => list.scatter(&smr.words, soff),
                Destination::None => {}
            }
        }
        Exec::Done {
            opcode: WcOpcode::RdmaRead,
            byte_len: len,
        }
    }

    /// Executes a SEND, with immediate data or without, into the responder's next receive.
    fn send(&self, mrs: &'m MrTable, found: &mut Found<'m>) -> Exec {
        let len = self.wqe.len;
        let Some(src) = source(self.qp, self.wqe, self.index, mrs, found) else {
            return local_source_error(self.rxe);
        };
        let Some(rqe) = peek_recv(self.peer) else {
            return no_receive(self.qp);
        };
        consume_recv(self.peer);
        let imm = (self.wqe.opcode == op::SEND_IMM).then(|| self.qp.sq.imm(self.index));
        let mtu = self.qp.path_mtu.load(Ordering::Relaxed);
        if len > rqe.len {
            // The receive is too small: the responder's receive fails and it goes to
            // the error state; the requester learns of an invalid request (mlx5), or
            // of a remote operation error after a malformed receive (rxe). The
            // packets that fit were placed before the one that does not.
            let (theirs, ours) = if self.rxe {
                (WcStatus::LocQpOpErr, WcStatus::RemOpErr)
            } else {
                (WcStatus::LocLenErr, WcStatus::RemInvReqErr)
            };
            if !fail_receive(self.dev, self.peer, &rqe, &src, mrs, mtu, theirs) {
                return no_answer(self.qp, self.rxe);
            }
            return fail(ours);
        }
        if len > 0 {
            match local(
                mrs,
                self.peer.pd,
                rqe.lkey,
                rqe.addr,
                len,
                Access::LOCAL_WRITE,
            ) {
                Some((mr, off)) => copy(&src, &mr.words, off, len),
                None => {
                    // A receive the NIC cannot write into: a local protection error on
                    // mlx5; rxe finds the receive malformed, as one too short. The
                    // packets before the first it cannot place were placed.
                    let theirs = if self.rxe {
                        WcStatus::LocQpOpErr
                    } else {
                        WcStatus::LocProtErr
                    };
                    if !fail_receive(self.dev, self.peer, &rqe, &src, mrs, mtu, theirs) {
                        return no_answer(self.qp, self.rxe);
                    }
                    return fail(WcStatus::RemOpErr);
                }
            }
        }
        if !push_recv(
            self.dev,
            self.peer,
            &recv_cqe(
                self.peer,
                rqe.wr_id,
                WcStatus::Success,
                WcOpcode::Recv,
                len,
                imm,
            ),
        ) {
            return no_answer(self.qp, self.rxe);
        }
        Exec::Done {
            opcode: WcOpcode::Send,
            byte_len: len,
        }
    }

    /// Executes an atomic WQE (`CMP_SWP`, its operands `compare` and `swap`, or
    /// `FETCH_ADD`, `add` and 0) at the responder (semantics 41): the responder checks its
    /// QP's access (rxe: an invalid request; mlx5: a remote access error, as for a READ),
    /// the key, the bounds and the region's `REMOTE_ATOMIC`, then the 8-byte alignment (an
    /// invalid request: IBTA 9.4.5; the responder goes to the error state), and operates on
    /// the 8 bytes as one atomic word; their value before lands in the first 8 local bytes.
    /// mlx5 checks the local bytes before it sends the request, rxe when the answer comes
    /// back (`rxe_comp.c`, `do_atomic`), after the remote operation.
    fn atomic(&self, mrs: &MrTable) -> Exec {
        let (first, second) = self.qp.sq.atomic_operands(self.index);
        if self.rxe && !qp_allows(self.peer, Access::REMOTE_ATOMIC) {
            return invalid_request();
        }
        let destination = || {
            local(
                mrs,
                self.qp.pd,
                self.wqe.lkey,
                self.wqe.local_addr,
                ATOMIC_LEN,
                Access::LOCAL_WRITE,
            )
        };
        let mut dst = None;
        if !self.rxe {
            let Some(d) = destination() else {
                return fail(WcStatus::LocProtErr);
            };
            dst = Some(d);
        }
        let mut slot = None;
        let Some((mr, off)) = remote(
            mrs,
            &mut slot,
            self.peer,
            self.wqe.rkey,
            self.wqe.remote_addr,
            ATOMIC_LEN,
            Access::REMOTE_ATOMIC,
        ) else {
            return remote_access_error();
        };
        if !self.wqe.remote_addr.is_multiple_of(8) || !off.is_multiple_of(8) {
            return invalid_request();
        }
        let before = mem::atomic_op(
            &mr.words[off / 8],
            self.wqe.opcode == op::CMP_SWP,
            first,
            second,
        );
        // rxe: the remote operation is done when the local bytes are found wanting.
        let dst = match dst {
            Some(d) => d,
            None => match destination() {
                Some(d) => d,
                None => return fail(WcStatus::LocProtErr),
            },
        };
        mem::write(&dst.0.words, dst.1, &before.to_ne_bytes());
        Exec::Done {
            opcode: match self.wqe.opcode == op::CMP_SWP {
                true => WcOpcode::CompSwap,
                false => WcOpcode::FetchAdd,
            },
            // rxe: the local entry's length (`wqe->dma.length`); mlx5: 8 (`cq.c`).
            byte_len: if self.rxe { self.wqe.len } else { ATOMIC_LEN },
        }
    }

    /// The responder's region of the WQE's remote range and the range's offset in it, for
    /// `need` (see [`remote`]; `slot` is the [`Found`] role of `need`): `Some(None)` for an
    /// empty range, whose key is not checked, `None` where the responder refuses it.
    #[inline]
    fn remote_range(
        &self,
        mrs: &'m MrTable,
        slot: &mut Option<&'m MrInner>,
        need: Access,
    ) -> Option<Option<(&'m MrInner, usize)>> {
        let wqe = self.wqe;
        if wqe.len == 0 {
            return Some(None);
        }
        remote(
            mrs,
            slot,
            self.peer,
            wqe.rkey,
            wqe.remote_addr,
            wqe.len,
            need,
        )
        .map(Some)
    }
}

/// Consumes the receive `rqe` of `responder`, taken by an RDMA WRITE with immediate data,
/// and appends its completion (see [`push_recv`], whose `false` it returns).
#[inline]
#[must_use]
fn complete_write_recv(
    dev: &DeviceInner,
    responder: &QpInner,
    rqe: &crate::ring::Rqe,
    status: WcStatus,
    byte_len: u32,
    imm: Option<u32>,
) -> bool {
    consume_recv(responder);
    let cqe = recv_cqe(
        responder,
        rqe.wr_id,
        status,
        WcOpcode::RecvRdmaWithImm,
        byte_len,
        imm,
    );
    push_recv(dev, responder, &cqe)
}

/// The responder's side of a SEND that its consumed receive `rqe` cannot take (too
/// small, or not writable): the packets that fit are placed, the receive completes with
/// `status` and the responder goes to the error state. `false`, the responder left as
/// [`push_recv`] leaves it, when the completion found no room (rxe): the requester then
/// hears nothing.
#[cold]
#[must_use]
fn fail_receive(
    dev: &DeviceInner,
    responder: &QpInner,
    rqe: &crate::ring::Rqe,
    src: &Source<'_>,
    mrs: &MrTable,
    mtu: u32,
    status: WcStatus,
) -> bool {
    place_packets_that_fit(mrs, responder, rqe, src, mtu);
    if !push_recv(
        dev,
        responder,
        &recv_cqe(responder, rqe.wr_id, status, WcOpcode::Recv, 0, None),
    ) {
        return false;
    }
    responder.set_error();
    true
}
