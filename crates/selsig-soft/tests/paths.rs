//! Paths of the software NIC that no other test reached (found by mutating the NIC and
//! seeing which changes every test let through): work after a completion rxe dropped, a
//! finite RNR retry count, mlx5's WRITE with immediate and its receive, execution times
//! around completions and RNR stalls, and a responder in the error state.

use std::time::{Duration, Instant};

use selsig::{
    Access, CompletionQueue, ConnectOptions, Device, Local, MemoryRegion, Opcode, QpCaps, QpInit,
    QpState, QueuePair, RecvWr, RemoteAddr, SendWr, WcOpcode, WcStatus, WorkCompletion,
    connect_pair,
};
use selsig_soft::{Personality, SoftConfig, SoftCq, SoftDevice, SoftMr, SoftPd, SoftQp};

const WAIT: Duration = Duration::from_secs(10);

struct Pair {
    dev: SoftDevice,
    pd: SoftPd,
    a: SoftQp,
    b: SoftQp,
    cq_a: SoftCq,
    cq_b: SoftCq,
}

fn pair(personality: Personality, cqe: u32, options: &ConnectOptions) -> Pair {
    let dev = SoftDevice::open(SoftConfig::with_personality(personality)).unwrap();
    let pd = dev.alloc_pd().unwrap();
    let cq_a = dev.create_cq(cqe).unwrap();
    let cq_b = dev.create_cq(64).unwrap();
    let init = QpInit {
        caps: QpCaps {
            max_send_wr: 16,
            max_recv_wr: 16,
            max_inline_data: 64,
            ..QpCaps::default()
        },
        sq_sig_all: false,
    };
    let a = dev.create_qp(&pd, &cq_a, &cq_a, &init).unwrap();
    let b = dev.create_qp(&pd, &cq_b, &cq_b, &init).unwrap();
    connect_pair(&a, &b, options).unwrap();
    Pair {
        dev,
        pd,
        a,
        b,
        cq_a,
        cq_b,
    }
}

impl Pair {
    fn mr(&self, len: usize, access: Access) -> SoftMr {
        self.dev.reg_mr(&self.pd, len, access).unwrap()
    }
}

fn rw() -> Access {
    Access::LOCAL_WRITE | Access::REMOTE_WRITE
}

fn wr(
    wr_id: u64,
    opcode: Opcode,
    local: Local<'static>,
    remote: RemoteAddr,
    signaled: bool,
) -> SendWr<'static> {
    SendWr {
        wr_id,
        opcode,
        local,
        remote,
        imm_data: 0x77,
        signaled,
    }
}

fn poll_n(cq: &SoftCq, n: usize) -> Vec<WorkCompletion> {
    let mut got = Vec::new();
    let mut buf = [WorkCompletion::new(0, WcStatus::Success, 0); 16];
    let start = Instant::now();
    while got.len() < n {
        let k = cq.poll(&mut buf).expect("poll");
        got.extend_from_slice(&buf[..k]);
        assert!(start.elapsed() < WAIT, "only {} of {n}: {got:?}", got.len());
    }
    got
}

/// True if a completion shows up within `d` (the caller expects none: a stall).
fn any_within(cq: &SoftCq, d: Duration) -> Option<WorkCompletion> {
    let mut buf = [WorkCompletion::new(0, WcStatus::Success, 0); 1];
    let start = Instant::now();
    while start.elapsed() < d {
        if cq.poll(&mut buf).unwrap() > 0 {
            return Some(buf[0]);
        }
        std::thread::yield_now();
    }
    None
}

fn st(w: &[WorkCompletion]) -> Vec<(u64, WcStatus)> {
    w.iter().map(|w| (w.wr_id, w.status)).collect()
}

/// rxe drops the completion an
/// overrun CQ has no room for, and the QP goes on: the WRs after it still execute.
#[test]
fn rxe_work_after_a_dropped_completion_still_executes() {
    let p = pair(Personality::Rxe, 2, &ConnectOptions::default()); // CQ holds 3
    assert_eq!(p.cq_a.capacity(), 3);
    let local = p.mr(8 * 8, Access::LOCAL_WRITE);
    let remote = p.mr(8 * 8, rw());
    local.fill(0, 64, 0xcd).unwrap();
    let wrs: Vec<_> = (0..8u64)
        .map(|i| {
            let off = i as usize * 8;
            wr(
                i,
                Opcode::RdmaWrite,
                Local::Sge(local.sge(off, 8)),
                remote.remote(off),
                true,
            )
        })
        .collect();
    p.a.post_send(&wrs).unwrap();
    let start = Instant::now();
    let landed = || {
        let mut got = [0u8; 64];
        remote.read(0, &mut got).unwrap();
        got.chunks(8)
            .filter(|c| c.iter().all(|&b| b == 0xcd))
            .count()
    };
    while landed() < 8 {
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "only {} of 8 WRITEs landed",
            landed()
        );
        std::thread::yield_now();
    }
    assert_eq!(
        st(&poll_n(&p.cq_a, 3)),
        (0..3).map(|i| (i, WcStatus::Success)).collect::<Vec<_>>()
    );
    assert_eq!(p.a.state(), QpState::Rts);
}

/// With rnr_retry < 7 a SEND that finds no
/// receive fails with IBV_WC_RNR_RETRY_EXC_ERR and the QP goes to the error state.
#[test]
fn a_send_without_a_receive_exhausts_a_finite_rnr_retry() {
    for personality in [Personality::Mlx5, Personality::Rxe] {
        let options = ConnectOptions {
            rnr_retry: 0,
            ..ConnectOptions::default()
        };
        let p = pair(personality, 16, &options);
        p.a.post_send(&[wr(
            1,
            Opcode::Send,
            Local::Empty,
            RemoteAddr::default(),
            true,
        )])
        .unwrap();
        assert_eq!(
            st(&poll_n(&p.cq_a, 1)),
            [(1, WcStatus::RnrRetryExcErr)],
            "{personality}"
        );
        assert_eq!(p.a.state(), QpState::Err, "{personality}");
    }
}

/// A WRITE with immediate needs
/// a receive on the responder: without one it waits (rnr_retry 7), and then consumes it.
#[test]
fn mlx5_write_with_imm_waits_for_a_receive_and_consumes_it() {
    let p = pair(Personality::Mlx5, 16, &ConnectOptions::default());
    let remote = p.mr(64, rw());
    p.a.post_send(&[wr(
        1,
        Opcode::RdmaWriteWithImm,
        Local::Inline(b"abcd"),
        remote.remote(0),
        true,
    )])
    .unwrap();
    assert_eq!(
        any_within(&p.cq_a, Duration::from_millis(200)),
        None,
        "ran without a receive"
    );
    let mut got = [0u8; 4];
    remote.read(0, &mut got).unwrap();
    assert_eq!(got, [0; 4], "landed without a receive");
    p.b.post_recv(&[RecvWr {
        wr_id: 9,
        sge: None,
    }])
    .unwrap();
    assert_eq!(st(&poll_n(&p.cq_a, 1)), [(1, WcStatus::Success)]);
    let r = poll_n(&p.cq_b, 1)[0];
    assert_eq!(
        (r.wr_id, r.status, r.opcode, r.imm_data),
        (
            9,
            WcStatus::Success,
            Some(WcOpcode::RecvRdmaWithImm),
            Some(0x77)
        )
    );
}

/// mlx5 checks the
/// rkey first: a bad key fails at once even with no receive posted, and a posted receive
/// is not consumed by the failed WRITE: it is flushed when the responder goes to error.
#[test]
fn mlx5_write_with_imm_and_a_bad_key_fails_before_taking_a_receive() {
    let p = pair(Personality::Mlx5, 16, &ConnectOptions::default());
    let remote = p.mr(64, rw());
    let mut bad = remote.remote(0);
    bad.rkey ^= 0x5a5;
    p.a.post_send(&[wr(
        1,
        Opcode::RdmaWriteWithImm,
        Local::Inline(b"abcd"),
        bad,
        true,
    )])
    .unwrap();
    assert_eq!(
        st(&poll_n(&p.cq_a, 1)),
        [(1, WcStatus::RemAccessErr)],
        "no receive needed"
    );
    let p = pair(Personality::Mlx5, 16, &ConnectOptions::default());
    let remote = p.mr(64, rw());
    let mut bad = remote.remote(0);
    bad.rkey ^= 0x5a5;
    p.b.post_recv(&[RecvWr {
        wr_id: 9,
        sge: None,
    }])
    .unwrap();
    p.a.post_send(&[wr(
        1,
        Opcode::RdmaWriteWithImm,
        Local::Inline(b"abcd"),
        bad,
        true,
    )])
    .unwrap();
    assert_eq!(st(&poll_n(&p.cq_a, 1)), [(1, WcStatus::RemAccessErr)]);
    assert_eq!(
        st(&poll_n(&p.cq_b, 1)),
        [(9, WcStatus::WrFlushErr)],
        "the receive is flushed, not failed"
    );
}

/// Unsignaled WRs after the last
/// completion of a fetch group get a time too.
#[test]
fn unsignaled_wrs_after_the_last_completion_of_a_group_are_stamped() {
    let p = pair(Personality::Mlx5, 16, &ConnectOptions::default());
    let local = p.mr(64, Access::LOCAL_WRITE);
    let remote = p.mr(64, rw());
    assert!(p.a.record_execution_times(true));
    let wrs: Vec<_> = (0..4u64)
        .map(|i| {
            wr(
                i,
                Opcode::RdmaWrite,
                Local::Sge(local.sge(0, 8)),
                remote.remote(0),
                i == 0,
            )
        })
        .collect();
    p.a.post_send(&wrs).unwrap();
    assert_eq!(st(&poll_n(&p.cq_a, 1)), [(0, WcStatus::Success)]);
    // A later signaled WR: once it completes, WRs 1..3 have executed.
    p.a.post_send(&[wr(
        4,
        Opcode::RdmaWrite,
        Local::Empty,
        RemoteAddr::default(),
        true,
    )])
    .unwrap();
    assert_eq!(st(&poll_n(&p.cq_a, 1)), [(4, WcStatus::Success)]);
    for i in 0..5 {
        assert!(p.a.executed_at(i).is_some(), "WR{i} has no execution time");
    }
}

/// WRs executed before a SEND that
/// waits for a receive get their time when the NIC stops at the SEND.
#[test]
fn wrs_executed_before_an_rnr_stall_are_stamped() {
    let p = pair(Personality::Mlx5, 16, &ConnectOptions::default());
    let local = p.mr(64, Access::LOCAL_WRITE);
    let remote = p.mr(64, rw());
    assert!(p.a.record_execution_times(true));
    p.a.post_send(&[
        wr(
            0,
            Opcode::RdmaWrite,
            Local::Sge(local.sge(0, 8)),
            remote.remote(0),
            false,
        ),
        wr(
            1,
            Opcode::RdmaWrite,
            Local::Sge(local.sge(8, 8)),
            remote.remote(8),
            false,
        ),
        wr(2, Opcode::Send, Local::Empty, RemoteAddr::default(), true),
    ])
    .unwrap();
    assert_eq!(
        any_within(&p.cq_a, Duration::from_millis(50)),
        None,
        "the SEND waits"
    );
    p.b.post_recv(&[RecvWr {
        wr_id: 9,
        sge: None,
    }])
    .unwrap();
    assert_eq!(st(&poll_n(&p.cq_a, 1)), [(2, WcStatus::Success)]);
    for i in 0..3 {
        assert!(p.a.executed_at(i).is_some(), "WR{i} has no execution time");
    }
    assert!(p.a.executed_at(0).unwrap() <= p.a.executed_at(2).unwrap());
}

/// A responder in
/// the error state does not answer: the requester's retries run out and nothing lands.
#[test]
fn a_responder_in_the_error_state_does_not_answer() {
    let p = pair(Personality::Mlx5, 16, &ConnectOptions::default());
    let local = p.mr(64, Access::LOCAL_WRITE);
    let remote = p.mr(64, rw());
    local.fill(0, 8, 0xee).unwrap();
    p.b.to_error().unwrap();
    p.a.post_send(&[wr(
        1,
        Opcode::RdmaWrite,
        Local::Sge(local.sge(0, 8)),
        remote.remote(0),
        true,
    )])
    .unwrap();
    assert_eq!(st(&poll_n(&p.cq_a, 1)), [(1, WcStatus::RetryExcErr)]);
    let mut got = [0u8; 8];
    remote.read(0, &mut got).unwrap();
    assert_eq!(got, [0; 8]);
}
