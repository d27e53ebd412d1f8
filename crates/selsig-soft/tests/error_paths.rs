//! Error paths of the soft NIC and the driver off the beaten track: receive completions
//! on the send CQ, a QP waiting on RNR when it fails, CQ overruns, queues dropped with
//! completions still in a shared CQ.

use std::sync::Arc;
use std::time::{Duration, Instant};

use selsig::{
    Access, ConnectOptions, Device, Local, MemoryRegion, Opcode, Outcome, Policy, QpCaps, QpInit,
    QueuePair, RecvWr, SendWr, SignaledQueue, WcStatus, Work, connect_pair,
};
use selsig_soft::{SoftConfig, SoftDevice};

const WAIT: Duration = Duration::from_secs(5);

fn init(send_wr: u32) -> QpInit {
    QpInit {
        caps: QpCaps {
            max_send_wr: send_wr,
            max_recv_wr: 64,
            max_inline_data: 64,
            ..QpCaps::default()
        },
        sq_sig_all: false,
    }
}

/// QP `a` (send and receive on one CQ, as `ibv_rc_pingpong` does) runs a SignaledQueue.
/// Its SENDs stall on RNR (the peer has no receive); then the peer's SEND overflows `a`'s
/// receive (`LOC_LEN_ERR`), which moves `a` to the error state: `a`'s three SENDs never
/// executed, so each must end `Flushed`. The receive's error completion (opcode
/// meaningless, `ibv_poll_cq(3)`) carries `a`'s qp_num and a `wr_id` of the receive
/// queue's own numbering; the driver takes it for a send completion.
#[test]
fn a_receive_error_completion_is_not_a_send_completion() {
    let dev = SoftDevice::open(SoftConfig::default()).unwrap();
    let pd = dev.alloc_pd().unwrap();
    let cq_a = Arc::new(dev.create_cq(64).unwrap());
    let cq_b = dev.create_cq(64).unwrap();
    let a = dev.create_qp(&pd, &cq_a, &cq_a, &init(16)).unwrap();
    let b = dev.create_qp(&pd, &cq_b, &cq_b, &init(16)).unwrap();
    connect_pair(&a, &b, &ConnectOptions::default()).unwrap();
    let small = dev.reg_mr(&pd, 8, Access::LOCAL_WRITE).unwrap();
    // Receive wr_ids counted from 1, as applications (and selsig's scenarios) do.
    a.post_recv(&[RecvWr {
        wr_id: 2,
        sge: Some(small.sge(0, 8)),
    }])
    .unwrap();
    let mut q: SignaledQueue<SoftDevice, u32> =
        SignaledQueue::new(a, Arc::clone(&cq_a), Policy::Every(4)).unwrap();
    for user in 1..=3 {
        q.post(Work::send_inline(&[1; 8], user)).unwrap();
    }
    std::thread::sleep(Duration::from_millis(50)); // a's first SEND waits for a receive
    let data = [9u8; 64];
    b.post_send(&[SendWr {
        wr_id: 77,
        opcode: Opcode::Send,
        local: Local::Inline(&data),
        remote: Default::default(),
        imm_data: 0,
        signaled: true,
    }])
    .unwrap();
    let mut done = Vec::new();
    let mut errors = Vec::new();
    let start = Instant::now();
    while done.len() < 3 && start.elapsed() < WAIT {
        if let Err(e) = q.poll(&mut done) {
            errors.push(e.to_string());
        }
    }
    let outcomes: Vec<(u32, Outcome)> = done.iter().map(|c| (c.user, c.outcome)).collect();
    assert_eq!(
        outcomes,
        [
            (1, Outcome::Flushed),
            (2, Outcome::Flushed),
            (3, Outcome::Flushed)
        ],
        "poll errors: {errors:?}"
    );
    assert!(errors.is_empty(), "{errors:?}");
    // The receive's error completion is handed back for the caller to route, and the
    // queue refuses it if handed it directly.
    let mut recv_done = q.take_unclaimed();
    while recv_done.is_empty() && start.elapsed() < WAIT {
        q.poll(&mut done).unwrap();
        recv_done.extend(q.take_unclaimed());
    }
    assert_eq!(recv_done[0].wr_id, 2);
    assert_eq!(recv_done[0].status, WcStatus::LocLenErr);
    assert_eq!(
        q.handle_completion(&recv_done[0]),
        Err(selsig::CompletionError::NotASend { wr_id: 2 })
    );
}

/// The simpler form: the application moves the QP to the error state and drains, as the
/// docs prescribe; `a` has a receive posted on its (single) CQ. The drain fails.
#[test]
fn drain_after_to_error_with_a_receive_posted() {
    let dev = SoftDevice::open(SoftConfig::default()).unwrap();
    let pd = dev.alloc_pd().unwrap();
    let cq_a = Arc::new(dev.create_cq(64).unwrap());
    let cq_b = dev.create_cq(64).unwrap();
    let a = dev.create_qp(&pd, &cq_a, &cq_a, &init(16)).unwrap();
    let b = dev.create_qp(&pd, &cq_b, &cq_b, &init(16)).unwrap();
    connect_pair(&a, &b, &ConnectOptions::default()).unwrap();
    let remote = dev
        .reg_mr(&pd, 64, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    a.post_recv(&[RecvWr {
        wr_id: 1000,
        sge: None,
    }])
    .unwrap();
    let mut q: SignaledQueue<SoftDevice, u32> =
        SignaledQueue::new(a, Arc::clone(&cq_a), Policy::Every(4)).unwrap();
    q.post(Work::write_inline(&[1; 8], remote.remote(0), 1))
        .unwrap();
    q.qp().to_error().unwrap();
    let mut done = Vec::new();
    let r = q.drain(WAIT, &mut done);
    assert!(r.is_ok(), "drain: {r:?}");
}
