//! `IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN` (docs/semantics.md, "CQ overruns"): libmlx5 makes
//! such a CQ, whose overrun loses completions without a word; the kernel's rxe refuses the
//! flag; a `SignaledQueue` refuses such a CQ, since it would lose outcomes unnoticed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use selsig::{
    Access, CompletionQueue, ConfigError, ConnectOptions, Device, Local, MemoryRegion, Opcode,
    Policy, ProviderError, QpCaps, QpInit, QpState, QueuePair, SendWr, SignaledQueue, WcStatus,
    WorkCompletion, connect_pair,
};
use selsig_soft::{Personality, SoftConfig, SoftDevice, SoftMr, SoftQp};

fn init() -> QpInit {
    QpInit {
        caps: QpCaps {
            max_send_wr: 16,
            max_recv_wr: 1,
            ..QpCaps::default()
        },
        sq_sig_all: false,
    }
}

/// WRITE `i` (from 1): 8 bytes of value `i` at offset 8 × `i`, signaled.
fn write(i: u8, local: &SoftMr, remote: &SoftMr) -> SendWr<'static> {
    SendWr {
        wr_id: u64::from(i),
        opcode: Opcode::RdmaWrite,
        local: Local::Sge(local.sge(8 * usize::from(i), 8)),
        remote: remote.remote(8 * usize::from(i)),
        imm_data: 0,
        signaled: true,
    }
}

/// Waits until WRITE `i` landed in `remote` (its completion is written right after, and
/// before the next WRITE executes).
fn landed(i: u8, remote: &SoftMr) {
    let start = Instant::now();
    let mut bytes = [0u8; 8];
    loop {
        remote.read(8 * usize::from(i), &mut bytes).unwrap();
        if bytes == [i; 8] {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "WRITE {i} never landed"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn poll_all(cq: &impl CompletionQueue) -> Vec<u64> {
    let mut buf = [WorkCompletion::new(0, WcStatus::Success, 0); 16];
    let n = cq.poll(&mut buf).expect("no overrun error");
    buf[..n].iter().map(|wc| wc.wr_id).collect()
}

/// A full CQ that ignores overruns loses the completions that find no room, and nothing
/// says so: no error from the poll, no `IBV_EVENT_CQ_ERR`, the QP still in RTS.
#[test]
fn an_overrun_of_a_cq_that_ignores_it_loses_completions_silently() {
    let dev = SoftDevice::open(SoftConfig::default()).unwrap();
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq_ignore_overrun(3).unwrap();
    assert_eq!(cq.capacity(), 3);
    assert!(cq.ignores_overrun());
    let cq_b = dev.create_cq(4).unwrap();
    let a: SoftQp = dev.create_qp(&pd, &cq, &cq, &init()).unwrap();
    let b = dev.create_qp(&pd, &cq_b, &cq_b, &init()).unwrap();
    connect_pair(&a, &b, &ConnectOptions::default()).unwrap();
    let local = dev.reg_mr(&pd, 128, Access::LOCAL_WRITE).unwrap();
    for i in 1..=7u8 {
        local.write(8 * usize::from(i), &[i; 8]).unwrap();
    }
    let remote = dev
        .reg_mr(&pd, 128, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    let wrs: Vec<_> = (1..=6).map(|i| write(i, &local, &remote)).collect();
    a.post_send(&wrs).unwrap();
    // WRITE 6 landed: the completions of 4 and 5 found the CQ full (nothing was polled).
    landed(6, &remote);
    assert_eq!(poll_all(&cq), [1, 2, 3], "4, 5 and 6 are lost");
    assert_eq!(dev.poll_async_event(), None, "no IBV_EVENT_CQ_ERR");
    assert_eq!(a.state(), QpState::Rts);
    // The CQ goes on: the next completion is there.
    a.post_send(&[write(7, &local, &remote)]).unwrap();
    let start = Instant::now();
    let mut got = Vec::new();
    while got.is_empty() {
        assert!(start.elapsed() < Duration::from_secs(10));
        got = poll_all(&cq);
    }
    assert_eq!(got, [7]);
}

/// A queue refuses such a CQ, naming why, and hands the QP back.
#[test]
fn a_queue_refuses_a_cq_that_ignores_overruns() {
    let dev = SoftDevice::open(SoftConfig::default()).unwrap();
    let pd = dev.alloc_pd().unwrap();
    let cq = Arc::new(dev.create_cq_ignore_overrun(64).unwrap());
    let qp = dev.create_qp(&pd, &cq, &cq, &init()).unwrap();
    let Err(refused) = SignaledQueue::<SoftDevice, ()>::new(qp, cq, Policy::Every(4)) else {
        panic!("a queue on a CQ that ignores overruns");
    };
    assert_eq!(refused.error, ConfigError::CqIgnoresOverrun);
    assert!(
        refused
            .error
            .to_string()
            .contains("IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN")
    );
    assert_eq!(refused.qp.state(), QpState::Reset, "the QP comes back");
}

/// rxe refuses the flag (`rxe_create_cq`: any flag is `EOPNOTSUPP`).
#[test]
fn the_rxe_personality_refuses_the_flag() {
    let dev = SoftDevice::with_personality(Personality::Rxe).unwrap();
    match dev.create_cq_ignore_overrun(16) {
        Err(ProviderError::Os { verb, source }) => {
            assert_eq!(verb, "ibv_create_cq_ex");
            assert_eq!(source.raw_os_error(), Some(95), "EOPNOTSUPP");
        }
        other => panic!("expected EOPNOTSUPP, got {other:?}"),
    }
}
