//! What the kernel's Soft-RoCE (rxe, Linux 6.1) does when a responder refuses a request,
//! a READ's destination cannot be written, a SEND overflows its receive, a message of
//! several packets meets a responder that cannot take all of it, or a CQ has no room: the
//! cases, and a runner generic over the provider. The soft NIC's rxe
//! personality runs them in `tests/soft.rs`; the verbs provider on the real rxe0 runs the
//! same cases in `selsig-verbs/tests/rxe.rs` (in the project's VM), so the two cannot drift.

use std::time::{Duration, Instant};

use selsig::{
    Access, CompletionQueue, ConnectOptions, Device, Local, MemoryRegion, Opcode, QpCaps, QpInit,
    QpState, QueuePair, RecvWr, SendWr, WcStatus, WorkCompletion, connect_pair,
};

/// One request from QP a to QP b, and what b allows.
#[derive(Debug, Clone, Copy)]
pub struct Case {
    pub name: &'static str,
    /// b's `qp_access_flags`.
    pub qp_access: Access,
    /// The access of a's local region.
    pub local_access: Access,
    pub opcode: Opcode,
    pub len: u32,
    /// The remote key is wrong.
    pub bad_rkey: bool,
    /// b has a receive of `recv_len` bytes posted.
    pub recv: bool,
    pub recv_len: u32,
    /// The size of the region b's receive points into (it may be less than the receive).
    pub inbox_len: u32,
    /// The access of the region b's receive points into.
    pub inbox_access: Access,
    /// The path MTU asked for (messages longer travel as several packets).
    pub mtu: u32,
    /// The access of b's region that RDMA and atomic operations target.
    pub remote_access: Access,
}

/// What came of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    /// a's completion, `None` if none came within 300 ms (the request waits).
    pub requester: Option<WcStatus>,
    pub a: QpState,
    pub b: QpState,
    /// b's completions.
    pub responder: Vec<WcStatus>,
    /// The device's asynchronous events, by name.
    pub events: Vec<&'static str>,
    /// How many bytes of the message reached their destination (the remote region of a
    /// WRITE, the receive of a SEND, the local region of a READ): the length of the
    /// destination's prefix that holds the source's bytes.
    pub placed: usize,
}

const ALL: Access = Access::LOCAL_WRITE
    .union(Access::REMOTE_WRITE)
    .union(Access::REMOTE_READ);
const NO_REMOTE_WRITE: Access = Access::LOCAL_WRITE.union(Access::REMOTE_READ);
const NO_REMOTE_READ: Access = Access::LOCAL_WRITE.union(Access::REMOTE_WRITE);
const ATOMIC: Access = ALL.union(Access::REMOTE_ATOMIC);
const FETCH_ADD: Opcode = Opcode::AtomicFetchAdd { add: 1 };
const CMP_SWP: Opcode = Opcode::AtomicCmpSwp {
    compare: u64::from_ne_bytes([1, 8, 15, 22, 29, 36, 43, 50]),
    swap: 7,
};

fn case(name: &'static str, qp_access: Access, opcode: Opcode, len: u32) -> Case {
    Case {
        name,
        qp_access,
        local_access: Access::LOCAL_WRITE,
        opcode,
        len,
        bad_rkey: false,
        recv: false,
        recv_len: 16,
        inbox_len: 16,
        inbox_access: Access::LOCAL_WRITE,
        mtu: 4096,
        remote_access: ALL,
    }
}

impl Case {
    /// The case with b's target region of `access`.
    const fn remote(self, access: Access) -> Case {
        Case {
            remote_access: access,
            ..self
        }
    }
}

/// The cases and what rxe does, as seen on rxe0 (Linux 6.1, rdma-core 44). A table of
/// data, one entry of a few lines per case: long by its entries, not by its logic.
pub fn cases() -> Vec<(Case, Seen)> {
    use QpState::{Err, Rts};
    use WcStatus::*;
    let seen = |requester, a, b, responder: &[WcStatus]| Seen {
        requester,
        a,
        b,
        responder: responder.to_vec(),
        events: Vec::new(),
        placed: 0,
    };
    let placed = |placed, seen: Seen| Seen { placed, ..seen };
    // The responder checks that its QP allows the operation before anything else
    // (rxe_resp.c check_op_valid): an invalid request whatever the length or the key,
    // and both QPs in the error state.
    let refused = seen(Some(RemInvReqErr), Err, Err, &[]);
    vec![
        (
            case(
                "WRITE to a QP without remote write",
                NO_REMOTE_WRITE,
                Opcode::RdmaWrite,
                8,
            ),
            refused.clone(),
        ),
        (
            case(
                "zero-length WRITE to a QP without remote write",
                NO_REMOTE_WRITE,
                Opcode::RdmaWrite,
                0,
            ),
            refused.clone(),
        ),
        (
            Case {
                bad_rkey: true,
                ..case(
                    "WRITE with a bad key to a QP without remote write",
                    NO_REMOTE_WRITE,
                    Opcode::RdmaWrite,
                    8,
                )
            },
            refused.clone(),
        ),
        (
            case(
                "READ from a QP without remote read",
                NO_REMOTE_READ,
                Opcode::RdmaRead,
                8,
            ),
            refused.clone(),
        ),
        (
            case(
                "zero-length READ from a QP without remote read",
                NO_REMOTE_READ,
                Opcode::RdmaRead,
                0,
            ),
            refused.clone(),
        ),
        // A WRITE with immediate looks for a receive before its key is checked: without
        // one it waits (RNR, retried for ever); with one, the receive completes in error.
        (
            Case {
                bad_rkey: true,
                ..case(
                    "WRITE with immediate, bad key, no receive",
                    ALL,
                    Opcode::RdmaWriteWithImm,
                    8,
                )
            },
            seen(None, Rts, Rts, &[]),
        ),
        (
            Case {
                bad_rkey: true,
                recv: true,
                ..case(
                    "WRITE with immediate, bad key, a receive",
                    ALL,
                    Opcode::RdmaWriteWithImm,
                    8,
                )
            },
            seen(Some(RemAccessErr), Err, Err, &[RemAccessErr]),
        ),
        // A READ's destination is checked when the response comes back (rxe_comp.c):
        // after the responder checked its key, and as a local protection error.
        (
            Case {
                local_access: Access::empty(),
                ..case(
                    "READ into a region without local write",
                    ALL,
                    Opcode::RdmaRead,
                    8,
                )
            },
            seen(Some(LocProtErr), Err, Rts, &[]),
        ),
        (
            Case {
                local_access: Access::empty(),
                bad_rkey: true,
                ..case(
                    "READ with a bad key into a region without local write",
                    ALL,
                    Opcode::RdmaRead,
                    8,
                )
            },
            seen(Some(RemAccessErr), Err, Err, &[]),
        ),
        // A SEND longer than the receive: a malformed receive for b, a remote operation
        // error for a.
        (
            Case {
                recv: true,
                ..case(
                    "SEND of 100 bytes into a receive of 16",
                    ALL,
                    Opcode::Send,
                    100,
                )
            },
            seen(Some(RemOpErr), Err, Err, &[LocQpOpErr]),
        ),
        // A receive into a region without local write: as malformed as one too short.
        (
            Case {
                recv: true,
                inbox_access: Access::empty(),
                ..case(
                    "SEND into a receive without local write",
                    ALL,
                    Opcode::Send,
                    8,
                )
            },
            seen(Some(RemOpErr), Err, Err, &[LocQpOpErr]),
        ),
        // qp_access_flags do not apply to SENDs.
        (
            Case {
                recv: true,
                ..case(
                    "zero-length SEND to a QP without remote access",
                    Access::LOCAL_WRITE,
                    Opcode::Send,
                    0,
                )
            },
            seen(Some(Success), Rts, Rts, &[Success]),
        ),
        // A message longer than the path MTU travels as several packets, and the
        // responder takes them one at a time. A WRITE with immediate carries its key in
        // the first packet and needs a receive only at the last (rxe_resp.c: only the
        // last has RXE_RWR_MASK): the key fails it first, receive or not; the receive
        // b had is flushed, not completed in error.
        (
            Case {
                bad_rkey: true,
                ..case(
                    "WRITE with immediate of two packets, bad key, no receive",
                    ALL,
                    Opcode::RdmaWriteWithImm,
                    8192,
                )
            },
            seen(Some(RemAccessErr), Err, Err, &[]),
        ),
        (
            Case {
                bad_rkey: true,
                recv: true,
                ..case(
                    "WRITE with immediate of two packets, bad key, a receive",
                    ALL,
                    Opcode::RdmaWriteWithImm,
                    8192,
                )
            },
            seen(Some(RemAccessErr), Err, Err, &[WrFlushErr]),
        ),
        // Without a receive it waits (RNR, retried for ever), its first packet placed.
        (
            case(
                "WRITE with immediate of two packets, no receive",
                ALL,
                Opcode::RdmaWriteWithImm,
                8192,
            ),
            placed(4096, seen(None, Rts, Rts, &[])),
        ),
        (
            Case {
                mtu: 1024,
                ..case(
                    "WRITE with immediate of 3000 bytes, path MTU 1024, no receive",
                    ALL,
                    Opcode::RdmaWriteWithImm,
                    3000,
                )
            },
            placed(2048, seen(None, Rts, Rts, &[])),
        ),
        // A SEND's packets are placed as they come, until one does not fit the receive,
        // or its region.
        (
            Case {
                recv: true,
                recv_len: 5000,
                inbox_len: 5000,
                ..case(
                    "SEND of two packets into a receive of 5000 bytes",
                    ALL,
                    Opcode::Send,
                    8192,
                )
            },
            placed(4096, seen(Some(RemOpErr), Err, Err, &[LocQpOpErr])),
        ),
        (
            Case {
                recv: true,
                recv_len: 8192,
                inbox_len: 5000,
                ..case(
                    "SEND of two packets into a receive of 8192 bytes in a region of 5000",
                    ALL,
                    Opcode::Send,
                    8192,
                )
            },
            placed(4096, seen(Some(RemOpErr), Err, Err, &[LocQpOpErr])),
        ),
        (
            Case {
                recv: true,
                recv_len: 2100,
                inbox_len: 4096,
                mtu: 1024,
                ..case(
                    "SEND of 3000 bytes into a receive of 2100, path MTU 1024",
                    ALL,
                    Opcode::Send,
                    3000,
                )
            },
            placed(2048, seen(Some(RemOpErr), Err, Err, &[LocQpOpErr])),
        ),
        // What fits is all placed.
        (
            Case {
                recv: true,
                recv_len: 8192,
                inbox_len: 8192,
                ..case("SEND of two packets that fits", ALL, Opcode::Send, 8192)
            },
            placed(8192, seen(Some(Success), Rts, Rts, &[Success])),
        ),
        // Atomics (semantics 41): the value before lands in a's 8 local bytes (the
        // remote region holds the pattern: its first 8 bytes come back).
        (
            case("FETCH_AND_ADD", ATOMIC, FETCH_ADD, 8).remote(ATOMIC),
            placed(8, seen(Some(Success), Rts, Rts, &[])),
        ),
        (
            case("COMPARE_AND_SWAP that matches", ATOMIC, CMP_SWP, 8).remote(ATOMIC),
            placed(8, seen(Some(Success), Rts, Rts, &[])),
        ),
        // The responder QP must allow atomics (check_op_valid, as for READ and WRITE).
        (
            case(
                "FETCH_AND_ADD to a QP without remote atomic",
                ALL,
                FETCH_ADD,
                8,
            )
            .remote(ATOMIC),
            refused.clone(),
        ),
        // The region must too (check_rkey): a remote access error, b in the error state.
        (
            case(
                "FETCH_AND_ADD to a region without remote atomic",
                ATOMIC,
                FETCH_ADD,
                8,
            ),
            seen(Some(RemAccessErr), Err, Err, &[]),
        ),
        (
            Case {
                bad_rkey: true,
                ..case("FETCH_AND_ADD with a bad key", ATOMIC, FETCH_ADD, 8).remote(ATOMIC)
            },
            seen(Some(RemAccessErr), Err, Err, &[]),
        ),
        // The value before is written when the answer comes back (rxe_comp.c do_atomic):
        // the remote operation is done, then the local bytes fail it.
        (
            Case {
                local_access: Access::empty(),
                ..case(
                    "FETCH_AND_ADD into a region without local write",
                    ATOMIC,
                    FETCH_ADD,
                    8,
                )
                .remote(ATOMIC)
            },
            seen(Some(LocProtErr), Err, Rts, &[]),
        ),
    ]
}

/// Two connected QPs of `dev` (fields drop in order: the QPs before their CQs and PD).
struct Pair<D: Device> {
    a: D::Qp,
    b: D::Qp,
    cq_a: D::Cq,
    cq_b: D::Cq,
    pd: D::Pd,
}

/// QPs `a` (its CQ of `cq_a` entries) and `b` (16), each of `depths` (send, receive)
/// slots, connected with `options`.
fn pair<D: Device>(dev: &D, cq_a: u32, depths: (u32, u32), options: &ConnectOptions) -> Pair<D> {
    let pd = dev.alloc_pd().unwrap();
    let cq_a = dev.create_cq(cq_a).unwrap();
    let cq_b = dev.create_cq(16).unwrap();
    let init = QpInit {
        caps: QpCaps {
            max_send_wr: depths.0,
            max_recv_wr: depths.1,
            ..QpCaps::default()
        },
        sq_sig_all: false,
    };
    let a = dev.create_qp(&pd, &cq_a, &cq_a, &init).unwrap();
    let b = dev.create_qp(&pd, &cq_b, &cq_b, &init).unwrap();
    connect_pair(&a, &b, options).unwrap();
    Pair {
        a,
        b,
        cq_a,
        cq_b,
        pd,
    }
}

/// Runs `case` on fresh QPs of `dev`.
pub fn run<D: Device>(dev: &D, gid_index: Option<u8>, case: &Case) -> Seen {
    let options = ConnectOptions {
        gid_index,
        access: case.qp_access,
        mtu: case.mtu,
        ..ConnectOptions::default()
    };
    let Pair {
        a,
        b,
        cq_a,
        cq_b,
        pd,
    } = pair(dev, 16, (8, 4), &options);
    let size = (case.len as usize).max(4096);
    let local = dev.reg_mr(&pd, size, case.local_access).unwrap();
    let remote = dev.reg_mr(&pd, size, case.remote_access).unwrap();
    let inbox = dev
        .reg_mr(&pd, case.inbox_len as usize, case.inbox_access)
        .unwrap();
    // The source holds a pattern with no zero byte, the destinations zeros.
    let pattern: Vec<u8> = (0..size).map(|i| (i * 7 % 251) as u8 + 1).collect();
    let (src, dst): (&dyn MemoryRegion, &dyn MemoryRegion) = match case.opcode {
        // An atomic's value before lands in the local bytes.
        Opcode::RdmaRead | Opcode::AtomicCmpSwp { .. } | Opcode::AtomicFetchAdd { .. } => {
            (&remote, &local)
        }
        Opcode::Send | Opcode::SendWithImm => (&local, &inbox),
        _ => (&local, &remote),
    };
    src.write(0, &pattern).unwrap();
    dst.fill(0, dst.len(), 0).unwrap();
    if case.recv {
        b.post_recv(&[RecvWr {
            wr_id: 77,
            sge: Some(inbox.sge(0, case.recv_len)),
        }])
        .unwrap();
    }
    let mut target = remote.remote(0);
    if case.bad_rkey {
        target.rkey ^= 0x5a5;
    }
    a.post_send(&[SendWr {
        wr_id: 1,
        opcode: case.opcode,
        local: if case.len == 0 {
            Local::Empty
        } else {
            Local::Sge(local.sge(0, case.len))
        },
        remote: target,
        imm_data: 5,
        signaled: true,
    }])
    .unwrap();
    let mut buf = [WorkCompletion::new(0, WcStatus::Success, 0); 4];
    let start = Instant::now();
    let mut requester = None;
    while start.elapsed() < Duration::from_millis(300) {
        if cq_a.poll(&mut buf).unwrap() > 0 {
            requester = Some(buf[0].status);
            break;
        }
    }
    // Whatever b's side does, it has done it by now.
    std::thread::sleep(Duration::from_millis(50));
    let n = cq_b.poll(&mut buf).unwrap();
    let mut events = Vec::new();
    while let Some(e) = dev.poll_async_event() {
        events.push(e.as_str());
    }
    let mut landed = vec![0; dst.len()];
    dst.read(0, &mut landed).unwrap();
    Seen {
        requester,
        a: a.state(),
        b: b.state(),
        responder: buf[..n].iter().map(|w| w.status).collect(),
        events,
        placed: landed
            .iter()
            .zip(&pattern)
            .take_while(|(d, p)| d == p)
            .count(),
    }
}

/// rxe's CQ overrun: the completion that finds no room is dropped with an
/// `IBV_EVENT_CQ_ERR` of its own, and the CQ and the QP go on (rxe_cq_post). Posts
/// `capacity + 3` signaled WRITEs on a CQ of 2 entries without polling, then one more after
/// polling; returns the completions polled (wr_id, status) after each, a's state at the
/// end and the events.
pub fn overrun<D: Device>(
    dev: &D,
    gid_index: Option<u8>,
) -> (Vec<(u64, WcStatus)>, QpState, Vec<&'static str>) {
    let options = ConnectOptions {
        gid_index,
        ..ConnectOptions::default()
    };
    // b, the responder, must live as long as the run (`..` would drop it here).
    let Pair {
        a,
        b: _b,
        cq_a,
        cq_b: _cq_b,
        pd,
    } = pair(dev, 2, (16, 1), &options);
    let local = dev.reg_mr(&pd, 64, Access::LOCAL_WRITE).unwrap();
    let remote = dev.reg_mr(&pd, 64, ALL).unwrap();
    let write = |wr_id| SendWr {
        wr_id,
        opcode: Opcode::RdmaWrite,
        local: Local::Sge(local.sge(0, 8)),
        remote: remote.remote(0),
        imm_data: 0,
        signaled: true,
    };
    let n = u64::from(cq_a.capacity()) + 3;
    let wrs: Vec<_> = (1..=n).map(write).collect();
    a.post_send(&wrs).unwrap();
    // Each completion beyond the CQ's room raises its own event: once the three came, the
    // device ran every WRITE (waited for, not slept on: a loaded machine runs late).
    let mut events = Vec::new();
    let start = Instant::now();
    while events.len() < 3 && start.elapsed() < Duration::from_secs(10) {
        match dev.poll_async_event() {
            Some(e) => events.push(e.as_str()),
            None => std::thread::sleep(Duration::from_millis(1)),
        }
    }
    // Time for a completion or an event too many.
    std::thread::sleep(Duration::from_millis(50));
    let mut got = Vec::new();
    let mut buf = [WorkCompletion::new(0, WcStatus::Success, 0); 16];
    let k = cq_a.poll(&mut buf).unwrap();
    got.extend(buf[..k].iter().map(|w| (w.wr_id, w.status)));
    a.post_send(&[write(100)]).unwrap();
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(10) {
        let k = cq_a.poll(&mut buf).unwrap();
        got.extend(buf[..k].iter().map(|w| (w.wr_id, w.status)));
        if k > 0 {
            break;
        }
    }
    while let Some(e) = dev.poll_async_event() {
        events.push(e.as_str());
    }
    (got, a.state(), events)
}

/// What rxe does in [`overrun`]: the first three WRITEs and the one after polling
/// complete, the three between are dropped with an `IBV_EVENT_CQ_ERR` each, and a stays in
/// RTS.
pub fn overrun_on_rxe() -> (Vec<(u64, WcStatus)>, QpState, Vec<&'static str>) {
    use WcStatus::Success;
    (
        vec![(1, Success), (2, Success), (3, Success), (100, Success)],
        QpState::Rts,
        vec!["cq_err"; 3],
    )
}

/// What came of work requests to a responder that does not answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unanswered {
    /// a's completions (wr_id, status) within the patience given.
    pub waiting: Vec<(u64, WcStatus)>,
    /// a's state then.
    pub state: QpState,
    /// a's completions after the application moved it to the error state.
    pub flushed: Vec<(u64, WcStatus)>,
}

impl Unanswered {
    /// What rxe does in [`unanswered`] with a `retry_cnt` of 7: it retries for ever, a stays
    /// in RTS with nothing completed, and both WRITEs are flushed when a is moved to the
    /// error state.
    pub fn retrying_forever() -> Self {
        Unanswered {
            waiting: vec![],
            state: QpState::Rts,
            flushed: vec![(1, WcStatus::WrFlushErr), (2, WcStatus::WrFlushErr)],
        }
    }

    /// What comes when the retries run out (rxe below a `retry_cnt` of 7, mlx5 at any):
    /// the first WRITE fails with `IBV_WC_RETRY_EXC_ERR`, the second is flushed, and a is in
    /// the error state.
    pub fn retries_run_out() -> Self {
        Unanswered {
            waiting: vec![(1, WcStatus::RetryExcErr), (2, WcStatus::WrFlushErr)],
            state: QpState::Err,
            flushed: vec![],
        }
    }
}

/// A responder in the error state does not answer: rxe drops the requests it gets
/// (rxe_resp.c drains them), so the requester retransmits on its timer (timeout 14,
/// 67 ms). rxe's completer never counts down a `retry_cnt` of 7 (rxe_comp.c,
/// `COMPST_ERROR_RETRY`), so then it retries forever. Posts an unsignaled WRITE and a
/// signaled one from a (connected with `retry_cnt`), collects a's completions for
/// `patience` (or until both came), then moves a to the error state and collects the rest.
pub fn unanswered<D: Device>(
    dev: &D,
    gid_index: Option<u8>,
    retry_cnt: u8,
    patience: Duration,
) -> Unanswered {
    let options = ConnectOptions {
        gid_index,
        retry_cnt,
        ..ConnectOptions::default()
    };
    let Pair {
        a,
        b,
        cq_a,
        cq_b: _cq_b,
        pd,
    } = pair(dev, 16, (8, 1), &options);
    let local = dev.reg_mr(&pd, 64, Access::LOCAL_WRITE).unwrap();
    let remote = dev.reg_mr(&pd, 64, ALL).unwrap();
    b.to_error().unwrap();
    let write = |wr_id, signaled| SendWr {
        wr_id,
        opcode: Opcode::RdmaWrite,
        local: Local::Sge(local.sge(0, 8)),
        remote: remote.remote(0),
        imm_data: 0,
        signaled,
    };
    a.post_send(&[write(1, false), write(2, true)]).unwrap();
    let collect = |got: &mut Vec<(u64, WcStatus)>, until: Duration| {
        let mut buf = [WorkCompletion::new(0, WcStatus::Success, 0); 4];
        let start = Instant::now();
        while got.len() < 2 && start.elapsed() < until {
            let k = cq_a.poll(&mut buf).unwrap();
            got.extend(buf[..k].iter().map(|w| (w.wr_id, w.status)));
        }
    };
    let mut waiting = Vec::new();
    collect(&mut waiting, patience);
    let state = a.state();
    a.to_error().unwrap();
    let mut flushed = waiting.clone();
    collect(&mut flushed, Duration::from_secs(10));
    flushed.drain(..waiting.len());
    Unanswered {
        waiting,
        state,
        flushed,
    }
}

/// What came of SENDs whose last receive completion found the responder's CQ full.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceiveOverrun {
    /// The requester's completions (wr_id, status) within the patience given.
    pub sends: Vec<(u64, WcStatus)>,
    /// The responder's state then.
    pub responder: QpState,
    /// The responder's completions (wr_id, status): the receives whose completions found
    /// room.
    pub receives: Vec<(u64, WcStatus)>,
    /// The asynchronous events.
    pub events: Vec<&'static str>,
}

impl ReceiveOverrun {
    /// What rxe does in [`receive_overrun`] below a `retry_cnt` of 7, its responder's CQ
    /// holding `capacity` completions: the SENDs whose receive completions found room
    /// succeed, the next one's retries run out (`IBV_WC_RETRY_EXC_ERR`) and the last is
    /// flushed; the responder is in the error state, with one `IBV_EVENT_CQ_ERR`.
    pub fn retries_run_out(capacity: u64) -> Self {
        use WcStatus::{RetryExcErr, Success, WrFlushErr};
        let mut sends: Vec<_> = (1..=capacity).map(|i| (i, Success)).collect();
        sends.push((capacity + 1, RetryExcErr));
        sends.push((capacity + 2, WrFlushErr));
        ReceiveOverrun {
            sends,
            responder: QpState::Err,
            receives: (1..=capacity).map(|i| (i, Success)).collect(),
            events: vec!["cq_err"],
        }
    }
}

/// rxe's responder moves its QP to the error state when a receive completion finds its CQ
/// full, before it acknowledges the request (`rxe_resp.c`: a failed `rxe_cq_post` in
/// `do_complete` is `RESPST_ERR_CQ_OVERFLOW`, then `RESPST_ERROR` and `rxe_qp_error`), so
/// the requester hears nothing and retransmits until its retries run out (for ever at
/// `retry_cnt` 7). b's CQ (asked for 1 entry) takes its receives' completions; b posts one
/// receive more than it holds, a one zero-length SEND more than that (signaled) and
/// collects its completions for `patience` (or until all came).
pub fn receive_overrun<D: Device>(
    dev: &D,
    gid_index: Option<u8>,
    retry_cnt: u8,
    patience: Duration,
) -> ReceiveOverrun {
    let pd = dev.alloc_pd().unwrap();
    let cq_a = dev.create_cq(16).unwrap();
    let cq_b = dev.create_cq(1).unwrap();
    let capacity = u64::from(cq_b.capacity());
    let init = QpInit {
        caps: QpCaps {
            max_send_wr: 8,
            max_recv_wr: 8,
            ..QpCaps::default()
        },
        sq_sig_all: false,
    };
    let a = dev.create_qp(&pd, &cq_a, &cq_a, &init).unwrap();
    let b = dev.create_qp(&pd, &cq_b, &cq_b, &init).unwrap();
    let options = ConnectOptions {
        gid_index,
        retry_cnt,
        ..ConnectOptions::default()
    };
    connect_pair(&a, &b, &options).unwrap();
    let recvs: Vec<RecvWr> = (1..=capacity + 1)
        .map(|wr_id| RecvWr { wr_id, sge: None })
        .collect();
    b.post_recv(&recvs).unwrap();
    let sends: Vec<SendWr> = (1..=capacity + 2)
        .map(|wr_id| SendWr {
            wr_id,
            opcode: Opcode::Send,
            local: Local::Empty,
            remote: Default::default(),
            imm_data: 0,
            signaled: true,
        })
        .collect();
    a.post_send(&sends).unwrap();
    let mut got = Vec::new();
    let mut buf = [WorkCompletion::new(0, WcStatus::Success, 0); 16];
    let start = Instant::now();
    while got.len() < sends.len() && start.elapsed() < patience {
        let k = cq_a.poll(&mut buf).unwrap();
        got.extend(buf[..k].iter().map(|w| (w.wr_id, w.status)));
    }
    let responder = b.state();
    let k = cq_b.poll(&mut buf).unwrap();
    let receives = buf[..k].iter().map(|w| (w.wr_id, w.status)).collect();
    let events = std::iter::from_fn(|| dev.poll_async_event())
        .map(|e| e.as_str())
        .collect();
    // Nothing left waiting when the QPs go.
    a.to_error().unwrap();
    ReceiveOverrun {
        sends: got,
        responder,
        receives,
        events,
    }
}
