//! The verbs provider on a real RDMA device: the first one rdma-core sees (in CI, the
//! kernel's Soft-RoCE `rxe0` in the VM of `scripts/verbs-tests.sh`).
//!
//! Every test needs a device, so every test is `#[ignore]`d with the reason: on a host
//! without one they are reported as ignored, never as passed. `scripts/verbs-tests.sh`
//! runs them with `--ignored` where there is a device.

use std::sync::Arc;
use std::time::{Duration, Instant};

use selsig::{
    Access, Buffer, CompletionQueue, ConnectOptions, CqError, Device, Local, MemoryRegion, Opcode,
    Outcome, Policy, PostFailure, ProviderError, QpCaps, QpInit, QpState, QueuePair, RecvWr,
    RemoteAddr, SendWr, SignaledQueue, WcOpcode, WcStatus, Work, WorkCompletion, connect_pair,
};
use selsig_verbs::{PostApi, VerbsCq, VerbsDevice, VerbsOptions, VerbsPd, VerbsQp};

const NEEDS_DEVICE: &str = "needs an RDMA device: run scripts/verbs-tests.sh (Soft-RoCE in a VM)";

fn device() -> VerbsDevice {
    let options = VerbsOptions {
        gid_index: std::env::var("SELSIG_GID_INDEX")
            .ok()
            .and_then(|g| g.parse().ok()),
        ..VerbsOptions::default()
    };
    VerbsDevice::open(&options).unwrap_or_else(|e| panic!("{NEEDS_DEVICE}: {e}"))
}

/// A QP that sends: `max_send_wr` as given, one receive, `sq_sig_all` off.
fn send_depth(max_send_wr: u32) -> QpInit {
    QpInit {
        caps: QpCaps {
            max_send_wr,
            max_recv_wr: 1,
            ..QpCaps::default()
        },
        sq_sig_all: false,
    }
}

struct Pair {
    dev: VerbsDevice,
    pd: VerbsPd,
    a: VerbsQp,
    b: VerbsQp,
    cq_a: Arc<VerbsCq>,
    cq_b: Arc<VerbsCq>,
}

fn pair(depth: u32) -> Pair {
    pair_with(depth, false, |o| o)
}

/// [`pair`], with `sq_sig_all` on both QPs and the connect options as `options` makes
/// them of the defaults.
fn pair_with(
    depth: u32,
    sq_sig_all: bool,
    options: impl FnOnce(ConnectOptions) -> ConnectOptions,
) -> Pair {
    let dev = device();
    let pd = dev.alloc_pd().unwrap();
    let cq_a = Arc::new(dev.create_cq(64).unwrap());
    let cq_b = Arc::new(dev.create_cq(64).unwrap());
    let init = QpInit {
        caps: QpCaps {
            max_send_wr: depth,
            max_recv_wr: 16,
            max_inline_data: 64,
            ..QpCaps::default()
        },
        sq_sig_all,
    };
    let a = dev.create_qp(&pd, &cq_a, &cq_a, &init).unwrap();
    let b = dev.create_qp(&pd, &cq_b, &cq_b, &init).unwrap();
    let options = options(ConnectOptions {
        gid_index: dev.gid_index(),
        ..ConnectOptions::default()
    });
    connect_pair(&a, &b, &options).unwrap();
    Pair {
        dev,
        pd,
        a,
        b,
        cq_a,
        cq_b,
    }
}

fn poll_n(cq: &VerbsCq, n: usize) -> Vec<WorkCompletion> {
    let mut got = Vec::new();
    let mut buf = [WorkCompletion::new(0, WcStatus::Success, 0); 16];
    let start = Instant::now();
    while got.len() < n {
        let k = cq.poll(&mut buf).unwrap();
        got.extend_from_slice(&buf[..k]);
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "only {} of {n}: {got:?}",
            got.len()
        );
    }
    got
}

fn quiet(cq: &VerbsCq) {
    std::thread::sleep(Duration::from_millis(50));
    let mut buf = [WorkCompletion::new(0, WcStatus::Success, 0); 4];
    assert_eq!(cq.poll(&mut buf).unwrap(), 0, "unexpected {:?}", buf[0]);
}

fn write(
    wr_id: u64,
    local: &impl MemoryRegion,
    off: usize,
    len: u32,
    remote: RemoteAddr,
    signaled: bool,
) -> SendWr<'static> {
    SendWr {
        wr_id,
        opcode: Opcode::RdmaWrite,
        local: Local::Sge(local.sge(off, len)),
        remote,
        imm_data: 0,
        signaled,
    }
}

const RW: Access = Access::LOCAL_WRITE
    .union(Access::REMOTE_WRITE)
    .union(Access::REMOTE_READ);

/// A queue given a CQ its QP's sends do not report to is refused (it would wait for ever).
#[test]
#[ignore = "needs an RDMA device: run scripts/verbs-tests.sh (Soft-RoCE in a VM)"]
fn a_queue_on_a_cq_its_sends_do_not_report_to_is_refused() {
    let p = pair(8);
    assert_eq!(p.a.send_cq_identity(), p.cq_a.identity());
    assert_ne!(p.cq_a.identity(), p.cq_b.identity());
    let refused = SignaledQueue::<VerbsDevice, ()>::new(p.a, Arc::clone(&p.cq_b), Policy::Every(4))
        .err()
        .expect("refused");
    assert_eq!(refused.error, selsig::ConfigError::NotTheSendCq);
    SignaledQueue::<VerbsDevice, ()>::new(refused.qp, Arc::clone(&p.cq_a), Policy::Every(4))
        .unwrap();
}

#[test]
#[ignore = "needs an RDMA device: run scripts/verbs-tests.sh (Soft-RoCE in a VM)"]
fn seed_example_only_cqe4_and_cqe8() {
    let p = pair(16);
    let local = p.dev.reg_mr(&p.pd, 8 * 64, Access::LOCAL_WRITE).unwrap();
    let remote = p.dev.reg_mr(&p.pd, 8 * 64, RW).unwrap();
    let wrs: Vec<_> = (1..=8u64)
        .map(|wr| {
            let off = (wr as usize - 1) * 64;
            local.write(off, &[wr as u8; 64]).unwrap();
            write(wr, &local, off, 64, remote.remote(off), wr % 4 == 0)
        })
        .collect();
    p.a.post_send(&wrs).unwrap();
    let wcs = poll_n(&p.cq_a, 2);
    assert_eq!(
        wcs.iter()
            .map(|w| (w.wr_id, w.status, w.opcode))
            .collect::<Vec<_>>(),
        [
            (4, WcStatus::Success, Some(WcOpcode::RdmaWrite)),
            (8, WcStatus::Success, Some(WcOpcode::RdmaWrite))
        ]
    );
    quiet(&p.cq_a);
    quiet(&p.cq_b);
    for wr in 1..=8u8 {
        let mut got = [0u8; 64];
        remote.read((wr as usize - 1) * 64, &mut got).unwrap();
        assert_eq!(got, [wr; 64]);
    }
}

#[test]
#[ignore = "needs an RDMA device: run scripts/verbs-tests.sh (Soft-RoCE in a VM)"]
fn seed_example_through_the_signaled_queue() {
    let p = pair(16);
    let remote = p.dev.reg_mr(&p.pd, 8 * 64, RW).unwrap();
    let (bufs, _) = Buffer::new(p.dev.reg_mr(&p.pd, 8 * 64, Access::LOCAL_WRITE).unwrap())
        .split_into(8, 64)
        .unwrap();
    let mut q: SignaledQueue<VerbsDevice, u32> =
        SignaledQueue::new(p.a, Arc::clone(&p.cq_a), Policy::Every(4)).unwrap();
    for (i, mut buf) in bufs.into_iter().enumerate() {
        buf.fill(i as u8 + 1).unwrap();
        q.post(Work::write(buf, remote.remote(i * 64), i as u32 + 1))
            .unwrap();
    }
    let mut done = Vec::new();
    q.drain(Duration::from_secs(20), &mut done).unwrap();
    assert_eq!(
        done.iter().map(|c| c.user).collect::<Vec<_>>(),
        (1..=8).collect::<Vec<_>>()
    );
    assert!(
        done.iter()
            .all(|c| c.outcome == Outcome::Completed && c.buffer.is_some())
    );
    assert_eq!(q.stats().cqes, 2);
}

#[test]
#[ignore = "needs an RDMA device: run scripts/verbs-tests.sh (Soft-RoCE in a VM)"]
fn bad_rkey_fails_one_and_flushes_every_later_wr() {
    let p = pair(16);
    let local = p.dev.reg_mr(&p.pd, 8 * 64, Access::LOCAL_WRITE).unwrap();
    let remote = p.dev.reg_mr(&p.pd, 8 * 64, RW).unwrap();
    let wrs: Vec<_> = (1..=8u64)
        .map(|wr| {
            let off = (wr as usize - 1) * 64;
            let mut target = remote.remote(off);
            if wr == 4 {
                target.rkey ^= 0x5a5a;
            }
            write(wr, &local, off, 64, target, false)
        })
        .collect();
    p.a.post_send(&wrs).unwrap();
    let wcs = poll_n(&p.cq_a, 5);
    let mut expected = vec![(4, WcStatus::RemAccessErr)];
    expected.extend((5..=8).map(|w| (w, WcStatus::WrFlushErr)));
    assert_eq!(
        wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        expected
    );
    assert_eq!(p.a.state(), QpState::Err);
    // Posting to a QP in the error state succeeds and flushes at once.
    p.a.post_send(&[write(9, &local, 0, 8, remote.remote(0), false)])
        .unwrap();
    assert_eq!(poll_n(&p.cq_a, 1)[0].status, WcStatus::WrFlushErr);
}

#[test]
#[ignore = "needs an RDMA device: run scripts/verbs-tests.sh (Soft-RoCE in a VM)"]
fn a_receive_posted_in_the_error_state_is_flushed() {
    let p = pair(8);
    let local = p.dev.reg_mr(&p.pd, 4096, Access::LOCAL_WRITE).unwrap();
    let recv = |wr_id| RecvWr {
        wr_id,
        sge: Some(local.sge(0, 64)),
    };
    // Moved to ERR by the application: the receive posted before is flushed with the
    // move, the one posted after it too.
    p.a.post_recv(&[recv(1)]).unwrap();
    p.a.to_error().unwrap();
    assert_eq!(poll_n(&p.cq_a, 1)[0].wr_id, 1);
    p.a.post_recv(&[recv(2), recv(3)]).unwrap();
    let wcs = poll_n(&p.cq_a, 2);
    assert_eq!(
        wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(2, WcStatus::WrFlushErr), (3, WcStatus::WrFlushErr)]
    );
    quiet(&p.cq_a);
    // Moved to ERR by the device: a WRITE with a bad key fails at the responder `b`.
    let p2 = pair(8);
    let local2 = p2.dev.reg_mr(&p2.pd, 4096, Access::LOCAL_WRITE).unwrap();
    let remote2 = p2.dev.reg_mr(&p2.pd, 4096, RW).unwrap();
    let mut bad = remote2.remote(0);
    bad.rkey ^= 0x5a5a;
    p2.a.post_send(&[write(1, &local2, 0, 64, bad, true)])
        .unwrap();
    assert_eq!(poll_n(&p2.cq_a, 1)[0].status, WcStatus::RemAccessErr);
    let start = Instant::now();
    while p2.b.state() != QpState::Err {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "b stays {:?}",
            p2.b.state()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    p2.b.post_recv(&[RecvWr {
        wr_id: 7,
        sge: Some(remote2.sge(0, 64)),
    }])
    .unwrap();
    let wcs = poll_n(&p2.cq_b, 1);
    assert_eq!((wcs[0].wr_id, wcs[0].status), (7, WcStatus::WrFlushErr));
    quiet(&p2.cq_b);
}

#[test]
#[ignore = "needs an RDMA device: run scripts/verbs-tests.sh (Soft-RoCE in a VM)"]
fn a_long_list_on_a_short_queue_fails_partly_with_full() {
    let p = pair(8);
    assert!(
        p.a.caps().max_send_wr >= 8,
        "real capacity read back: {:?}",
        p.a.caps()
    );
    let local = p.dev.reg_mr(&p.pd, 64, Access::LOCAL_WRITE).unwrap();
    let remote = p.dev.reg_mr(&p.pd, 64, RW).unwrap();
    let wrs: Vec<_> = (0..300)
        .map(|i| write(i, &local, 0, 8, remote.remote(0), false))
        .collect();
    let err = p.a.post_send(&wrs).unwrap_err();
    assert_eq!(err.failure, PostFailure::Full, "{err}");
    assert!(
        err.index >= 8 && err.index < 300,
        "the list was taken up to {}",
        err.index
    );
}

#[test]
#[ignore = "needs an RDMA device: run scripts/verbs-tests.sh (Soft-RoCE in a VM)"]
fn a_zero_length_write_needs_no_valid_key() {
    let p = pair(8);
    p.a.post_send(&[SendWr {
        wr_id: 1,
        opcode: Opcode::RdmaWrite,
        local: Local::Empty,
        remote: RemoteAddr { addr: 0, rkey: 0 },
        imm_data: 0,
        signaled: true,
    }])
    .unwrap();
    assert_eq!(poll_n(&p.cq_a, 1)[0].status, WcStatus::Success);
}

#[test]
#[ignore = "needs an RDMA device: run scripts/verbs-tests.sh (Soft-RoCE in a VM)"]
fn read_send_recv_and_immediate_data() {
    let p = pair(16);
    let local = p.dev.reg_mr(&p.pd, 256, Access::LOCAL_WRITE).unwrap();
    let remote = p.dev.reg_mr(&p.pd, 256, RW).unwrap();
    let inbox = p.dev.reg_mr(&p.pd, 256, RW).unwrap();
    remote.write(0, b"bytes to read back").unwrap();
    local.write(100, b"a SEND").unwrap();
    p.b.post_recv(&[
        RecvWr {
            wr_id: 10,
            sge: Some(inbox.sge(0, 64)),
        },
        RecvWr {
            wr_id: 11,
            sge: None,
        },
        RecvWr {
            wr_id: 12,
            sge: Some(inbox.sge(192, 64)),
        },
    ])
    .unwrap();
    p.a.post_send(&[
        SendWr {
            wr_id: 1,
            opcode: Opcode::RdmaRead,
            local: Local::Sge(local.sge(0, 18)),
            remote: remote.remote(0),
            imm_data: 0,
            signaled: true,
        },
        SendWr {
            wr_id: 2,
            opcode: Opcode::Send,
            local: Local::Sge(local.sge(100, 6)),
            remote: RemoteAddr::default(),
            imm_data: 0,
            signaled: true,
        },
        SendWr {
            wr_id: 3,
            opcode: Opcode::RdmaWriteWithImm,
            local: Local::Inline(b"imm"),
            remote: inbox.remote(128),
            imm_data: 0xfeed,
            signaled: true,
        },
        SendWr {
            wr_id: 4,
            opcode: Opcode::SendWithImm,
            local: Local::Sge(local.sge(100, 6)),
            remote: RemoteAddr::default(),
            imm_data: 0xbeef,
            signaled: true,
        },
    ])
    .unwrap();
    let sends = poll_n(&p.cq_a, 4);
    assert!(
        sends.iter().all(|w| w.status == WcStatus::Success),
        "{sends:?}"
    );
    assert_eq!(
        (sends[0].opcode, sends[0].byte_len),
        (Some(WcOpcode::RdmaRead), 18)
    );
    let mut got = [0u8; 18];
    local.read(0, &mut got).unwrap();
    assert_eq!(&got, b"bytes to read back");
    let recvs = poll_n(&p.cq_b, 3);
    assert_eq!(
        (
            recvs[0].wr_id,
            recvs[0].opcode,
            recvs[0].byte_len,
            recvs[0].imm_data
        ),
        (10, Some(WcOpcode::Recv), 6, None)
    );
    assert_eq!(
        (
            recvs[2].wr_id,
            recvs[2].opcode,
            recvs[2].byte_len,
            recvs[2].imm_data
        ),
        (12, Some(WcOpcode::Recv), 6, Some(0xbeef))
    );
    let mut got = [0u8; 6];
    inbox.read(192, &mut got).unwrap();
    assert_eq!(&got, b"a SEND");
    assert_eq!(
        (recvs[1].wr_id, recvs[1].opcode, recvs[1].imm_data),
        (11, Some(WcOpcode::RecvRdmaWithImm), Some(0xfeed))
    );
    let mut got = [0u8; 3];
    inbox.read(128, &mut got).unwrap();
    assert_eq!(&got, b"imm");
}

#[test]
#[ignore = "needs an RDMA device: run scripts/verbs-tests.sh (Soft-RoCE in a VM)"]
fn requests_beyond_the_device_limits_name_the_limit() {
    let dev = device();
    let Err(e) = dev.create_cq(1 << 30) else {
        panic!("a CQ of 2^30 entries")
    };
    let e = e.to_string();
    assert!(
        e.contains("max_cqe") && e.contains("1073741824 entries"),
        "{e}"
    );
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(8).unwrap();
    for (caps, field) in [
        (
            QpCaps {
                max_send_wr: 1 << 30,
                ..QpCaps::default()
            },
            "max_qp_wr",
        ),
        (
            QpCaps {
                max_send_sge: 1 << 20,
                ..QpCaps::default()
            },
            "max_sge",
        ),
    ] {
        let init = QpInit {
            caps,
            sq_sig_all: false,
        };
        let Err(e) = dev.create_qp(&pd, &cq, &cq, &init) else {
            panic!("a QP beyond {field}")
        };
        assert!(e.to_string().contains(field), "{e}");
    }
    // Within the limits, it works, up to the limits themselves (named in the errors).
    let init = QpInit {
        caps: QpCaps::default(),
        sq_sig_all: false,
    };
    dev.create_qp(&pd, &cq, &cq, &init).unwrap();
    let limit = |caps| {
        let init = QpInit {
            caps,
            sq_sig_all: false,
        };
        let e = dev.create_qp(&pd, &cq, &cq, &init).err().expect("beyond");
        let e = e.to_string();
        let (_, after) = e.split_once("supports up to ").expect("the limit named");
        after.split(' ').next().unwrap().parse::<u32>().unwrap()
    };
    let max_wr = limit(QpCaps {
        max_send_wr: u32::MAX,
        ..QpCaps::default()
    });
    let max_sge = limit(QpCaps {
        max_send_sge: u32::MAX,
        ..QpCaps::default()
    });
    // Each on its own: both at once can be more memory than the device gives a queue
    // (rxe0 in the VM: ENOMEM).
    for caps in [
        QpCaps {
            max_send_wr: max_wr,
            ..QpCaps::default()
        },
        QpCaps {
            max_send_sge: max_sge,
            ..QpCaps::default()
        },
    ] {
        let init = QpInit {
            caps,
            sq_sig_all: false,
        };
        let qp = dev.create_qp(&pd, &cq, &cq, &init).unwrap();
        let got = qp.caps();
        assert!(
            got.max_send_wr >= caps.max_send_wr && got.max_send_sge >= caps.max_send_sge,
            "{got:?}"
        );
    }
}

/// The inline limit is what the device granted, which may be more than asked (rxe makes
/// room for its scatter list): a post of that many inline bytes is taken, one more is not.
#[test]
#[ignore = "needs an RDMA device: run scripts/verbs-tests.sh (Soft-RoCE in a VM)"]
fn the_inline_limit_is_what_the_device_granted() {
    let dev = device();
    let pd = dev.alloc_pd().unwrap();
    let cq = Arc::new(dev.create_cq(16).unwrap());
    let init = QpInit {
        caps: QpCaps {
            max_send_wr: 4,
            max_recv_wr: 1,
            max_inline_data: 1,
            ..QpCaps::default()
        },
        sq_sig_all: false,
    };
    let a = dev.create_qp(&pd, &cq, &cq, &init).unwrap();
    let b = dev.create_qp(&pd, &cq, &cq, &init).unwrap();
    let options = ConnectOptions {
        gid_index: dev.gid_index(),
        ..ConnectOptions::default()
    };
    connect_pair(&a, &b, &options).unwrap();
    let max = a.caps().max_inline_data as usize;
    assert!(max >= 1, "{:?}", a.caps());
    if dev.is_rxe() {
        assert!(
            max > 1,
            "rxe grants its scatter list's room: {:?}",
            a.caps()
        );
    }
    let remote = dev.reg_mr(&pd, 4096, RW).unwrap();
    let bytes = vec![0x5a; max + 1];
    let inline = |len: usize, wr_id| SendWr {
        wr_id,
        opcode: Opcode::RdmaWrite,
        local: Local::Inline(&bytes[..len]),
        remote: remote.remote(0),
        imm_data: 0,
        signaled: true,
    };
    let e = a
        .post_send(&[inline(max + 1, 1)])
        .expect_err("one byte more");
    assert!(
        matches!(e.failure, PostFailure::InlineTooLong { len, max: m } if len == max + 1 && m as usize == max),
        "{e:?}"
    );
    a.post_send(&[inline(max, 2)]).expect("the granted limit");
    let wc = poll_n(&cq, 1)[0];
    assert_eq!((wc.wr_id, wc.status), (2, WcStatus::Success));
    let mut got = vec![0u8; max];
    remote.read(0, &mut got).unwrap();
    assert!(got.iter().all(|&b| b == 0x5a));
}

/// A QP connected with an RNR retry count below 7 fails a SEND that finds no receive
/// after those retries, and soon: the responder asks for the shortest wait selsig sets
/// (`min_rnr_timer` 12, 0.64 ms), not 0, which encodes the longest (655 ms).
#[test]
#[ignore = "needs an RDMA device: run scripts/verbs-tests.sh (Soft-RoCE in a VM)"]
fn a_send_without_a_receive_fails_after_the_rnr_retries_asked_for() {
    let p = pair_with(4, false, |o| ConnectOptions { rnr_retry: 2, ..o });
    let local = p.dev.reg_mr(&p.pd, 64, Access::LOCAL_WRITE).unwrap();
    let start = Instant::now();
    p.a.post_send(&[SendWr {
        wr_id: 1,
        opcode: Opcode::Send,
        local: Local::Sge(local.sge(0, 8)),
        remote: RemoteAddr::default(),
        imm_data: 0,
        signaled: true,
    }])
    .unwrap();
    let wc = poll_n(&p.cq_a, 1)[0];
    let took = start.elapsed();
    assert_eq!((wc.wr_id, wc.status), (1, WcStatus::RnrRetryExcErr));
    assert!(took < Duration::from_millis(500), "{took:?}");
}

/// With `sq_sig_all` every work request completes, whatever its own flag.
#[test]
#[ignore = "needs an RDMA device: run scripts/verbs-tests.sh (Soft-RoCE in a VM)"]
fn sq_sig_all_signals_every_work_request() {
    let p = pair_with(4, true, |o| o);
    assert!(p.a.sq_sig_all());
    let local = p.dev.reg_mr(&p.pd, 64, Access::LOCAL_WRITE).unwrap();
    let remote = p.dev.reg_mr(&p.pd, 64, RW).unwrap();
    p.a.post_send(&[
        write(1, &local, 0, 8, remote.remote(0), false),
        write(2, &local, 8, 8, remote.remote(8), false),
    ])
    .unwrap();
    let wcs = poll_n(&p.cq_a, 2);
    assert_eq!(
        wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    quiet(&p.cq_a);
}

#[test]
#[ignore = "needs an RDMA device: run scripts/verbs-tests.sh (Soft-RoCE in a VM)"]
fn open_errors_say_what_is_wrong() {
    // With no GID index, a RoCE port takes its RoCE v2 GID with an IPv4 address (index 1,
    // ::ffff:10.77.0.1, in the project's VM; index 0 is link-local), and rxe keeps the
    // completions of a destroyed QP.
    let dev = VerbsDevice::open(&VerbsOptions::default()).unwrap();
    if let Ok(want) = std::env::var("SELSIG_GID_INDEX") {
        assert_eq!(dev.gid_index(), want.parse().ok());
    }
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(4).unwrap();
    let init = QpInit {
        caps: QpCaps::default(),
        sq_sig_all: false,
    };
    let qp = dev.create_qp(&pd, &cq, &cq, &init).unwrap();
    assert!(dev.is_rxe() && !qp.destroy_cleans_cq());
    assert!(qp.recv_cq_is_send_cq());
    drop(qp);
    let e = VerbsDevice::open(&VerbsOptions {
        device: Some("no-such-device".into()),
        ..VerbsOptions::default()
    })
    .unwrap_err();
    assert!(
        matches!(e, ProviderError::Invalid { what: "device", .. })
            && e.to_string()
                .contains("no RDMA device named \"no-such-device\"; found: rxe0"),
        "{e}"
    );
    let e = VerbsDevice::open(&VerbsOptions {
        gid_index: Some(200),
        ..VerbsOptions::default()
    })
    .unwrap_err();
    assert!(e.to_string().contains("GID"), "{e}");
    let e = VerbsDevice::open(&VerbsOptions {
        port: Some(9),
        ..VerbsOptions::default()
    })
    .unwrap_err();
    assert!(e.to_string().contains("port 9"), "{e}");
    // A transition to an address nobody has fails and names the attributes.
    let dev = device();
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(8).unwrap();
    let qp = dev
        .create_qp(
            &pd,
            &cq,
            &cq,
            &QpInit {
                caps: QpCaps::default(),
                sq_sig_all: false,
            },
        )
        .unwrap();
    assert_eq!(qp.state(), QpState::Reset);
    let mut remote = qp
        .endpoint(&ConnectOptions {
            gid_index: dev.gid_index(),
            ..ConnectOptions::default()
        })
        .unwrap();
    remote.qp_num = 0;
    let options = ConnectOptions {
        mtu: 1024,
        gid_index: dev.gid_index(),
        ..ConnectOptions::default()
    };
    if let Err(e) = qp.connect(&remote, &options) {
        let text = e.to_string();
        assert!(text.contains("attributes set"), "{text}");
    }
}

#[test]
#[ignore = "needs an RDMA device: run scripts/verbs-tests.sh (Soft-RoCE in a VM)"]
fn registering_remote_write_without_local_write_fails_as_documented() {
    let dev = device();
    let pd = dev.alloc_pd().unwrap();
    assert!(
        dev.reg_mr(&pd, 64, Access::REMOTE_WRITE).is_err(),
        "ibv_reg_mr(3): EINVAL"
    );
    assert!(dev.reg_mr(&pd, 64, Access::REMOTE_READ).is_ok());
}

#[test]
#[ignore = "needs an RDMA device: run scripts/verbs-tests.sh (Soft-RoCE in a VM)"]
fn one_poll_returns_more_completions_than_a_provider_call_does() {
    // More completions than the provider is asked for at once (32): one `poll` hands them
    // all over, in order, through several `poll_cq` calls.
    const N: u64 = 100;
    let dev = device();
    let pd = dev.alloc_pd().unwrap();
    let cq_a = Arc::new(dev.create_cq(128).unwrap());
    let cq_b = Arc::new(dev.create_cq(4).unwrap());
    let a = dev
        .create_qp(&pd, &cq_a, &cq_a, &send_depth(N as u32))
        .unwrap();
    let b = dev.create_qp(&pd, &cq_b, &cq_b, &send_depth(1)).unwrap();
    let options = ConnectOptions {
        gid_index: dev.gid_index(),
        ..ConnectOptions::default()
    };
    connect_pair(&a, &b, &options).unwrap();
    let remote = dev.reg_mr(&pd, 64, RW).unwrap();
    let wrs: Vec<_> = (1..=N)
        .map(|wr_id| SendWr {
            wr_id,
            opcode: Opcode::RdmaWrite,
            local: Local::Empty,
            remote: remote.remote(0),
            imm_data: 0,
            signaled: true,
        })
        .collect();
    a.post_send(&wrs).unwrap();
    // Soft-RoCE under emulation takes tens of microseconds per WRITE: 2 s is ample.
    std::thread::sleep(Duration::from_secs(2));
    let mut buf = [WorkCompletion::new(0, WcStatus::Success, 0); 128];
    let n = cq_a.poll(&mut buf).unwrap();
    assert_eq!(n, N as usize, "{:?}", &buf[..n]);
    assert!(buf[..n].iter().all(|wc| wc.status == WcStatus::Success));
    assert_eq!(
        buf[..n].iter().map(|wc| wc.wr_id).collect::<Vec<_>>(),
        (1..=N).collect::<Vec<_>>()
    );
    quiet(&cq_a);
}

#[test]
#[ignore = "needs an RDMA device: run scripts/verbs-tests.sh (Soft-RoCE in a VM)"]
fn posts_the_provider_must_not_see_are_refused_up_front() {
    let p = pair(16);
    // Before RTS a send queue takes nothing (rxe would keep the work requests and run them
    // once connected, while reporting them refused).
    let init = send_depth(4);
    let cq_f = p.dev.create_cq(16).unwrap();
    let fresh = p.dev.create_qp(&p.pd, &cq_f, &cq_f, &init).unwrap();
    let marker = |wr_id| SendWr {
        wr_id,
        opcode: Opcode::RdmaWrite,
        local: Local::Empty,
        remote: RemoteAddr::default(),
        imm_data: 0,
        signaled: true,
    };
    let e = fresh.post_send(&[marker(1)]).unwrap_err();
    assert_eq!(
        (e.index, e.failure),
        (0, PostFailure::State(QpState::Reset))
    );
    // Once connected, only what is posted then runs.
    let peer = p.dev.create_qp(&p.pd, &cq_f, &cq_f, &init).unwrap();
    let options = ConnectOptions {
        gid_index: p.dev.gid_index(),
        ..ConnectOptions::default()
    };
    connect_pair(&fresh, &peer, &options).unwrap();
    fresh.post_send(&[marker(2)]).unwrap();
    let wcs = poll_n(&cq_f, 1);
    assert_eq!((wcs[0].wr_id, wcs[0].status), (2, WcStatus::Success));
    quiet(&cq_f);

    // Inline data beyond max_inline_data (mlx5 would say ENOMEM: "full") and an inline
    // READ are refused at their position; what comes before is posted.
    let remote = p.dev.reg_mr(&p.pd, 4096, RW).unwrap();
    let max = p.a.caps().max_inline_data as usize;
    let small = [7u8; 8];
    let big = vec![1u8; max + 1];
    let inline = |wr_id, opcode, data: &'static [u8]| SendWr {
        wr_id,
        opcode,
        local: Local::Inline(data),
        remote: remote.remote(0),
        imm_data: 0,
        signaled: true,
    };
    let big: &'static [u8] = Box::leak(big.into_boxed_slice());
    let small: &'static [u8] = Box::leak(Box::new(small));
    for (second, why) in [
        (
            inline(11, Opcode::RdmaWrite, big),
            PostFailure::InlineTooLong {
                len: max + 1,
                max: max as u32,
            },
        ),
        (
            inline(11, Opcode::RdmaRead, small),
            PostFailure::Invalid("an RDMA READ cannot be inline"),
        ),
    ] {
        let e =
            p.a.post_send(&[inline(10, Opcode::RdmaWrite, small), second])
                .unwrap_err();
        assert_eq!((e.index, e.failure), (1, why));
        let wcs = poll_n(&p.cq_a, 1);
        assert_eq!((wcs[0].wr_id, wcs[0].status), (10, WcStatus::Success));
        quiet(&p.cq_a);
    }
    assert_eq!(p.a.state(), QpState::Rts);

    // A connection from another GID index than the one the endpoint advertises.
    let c = p.dev.create_qp(&p.pd, &p.cq_a, &p.cq_a, &init).unwrap();
    let other = if p.dev.gid_index() == Some(0) { 1 } else { 0 };
    let options = ConnectOptions {
        gid_index: Some(other),
        ..ConnectOptions::default()
    };
    let e = c.endpoint(&options).unwrap_err();
    assert!(
        matches!(
            e,
            ProviderError::Invalid {
                what: "GID index",
                ..
            }
        ),
        "{e}"
    );

    // A receive whose wr_id is the mark of an unparsed completion, at its position.
    let recv = |wr_id| RecvWr { wr_id, sge: None };
    let e = p.b.post_recv(&[recv(5), recv(u64::MAX)]).unwrap_err();
    assert_eq!(e.index, 1);
    assert!(matches!(e.failure, PostFailure::Invalid(_)), "{e}");
}

/// Two QPs of `send_wr` slots, not yet connected, each with a CQ of its own, and the
/// options to connect them with: for tests that change an endpoint before connecting.
struct Unconnected {
    dev: VerbsDevice,
    pd: VerbsPd,
    a: VerbsQp,
    b: VerbsQp,
    cq_a: VerbsCq,
    options: ConnectOptions,
}

fn unconnected(send_wr: u32) -> Unconnected {
    let dev = device();
    let pd = dev.alloc_pd().unwrap();
    let cq_a = dev.create_cq(send_wr).unwrap();
    let cq_b = dev.create_cq(send_wr).unwrap();
    let init = send_depth(send_wr);
    let a = dev.create_qp(&pd, &cq_a, &cq_a, &init).unwrap();
    let b = dev.create_qp(&pd, &cq_b, &cq_b, &init).unwrap();
    let options = ConnectOptions {
        gid_index: dev.gid_index(),
        ..ConnectOptions::default()
    };
    Unconnected {
        dev,
        pd,
        a,
        b,
        cq_a,
        options,
    }
}

/// A QP in the reset state moves only to the init state (the kernel's
/// `ib_modify_qp_is_ok`): moving it to the error state is refused, and it stays usable.
#[test]
#[ignore = "needs an RDMA device: run scripts/verbs-tests.sh (Soft-RoCE in a VM)"]
fn a_qp_in_the_reset_state_does_not_move_to_the_error_state() {
    let Unconnected { a, b, options, .. } = unconnected(4);
    match a.to_error() {
        Err(ProviderError::Transition { from, to, .. }) => {
            assert_eq!((from, to), (QpState::Reset, QpState::Err));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(a.state(), QpState::Reset);
    connect_pair(&a, &b, &options).unwrap();
    assert_eq!(a.state(), QpState::Rts);
}

/// A QP that reached RTS takes work requests in the error state, and flushes them (the
/// provider refuses them up front only in the error state before RTS, where mlx5 would
/// answer ENOMEM for ever: a unit test covers that; rxe does not let a QP go from RESET
/// to ERR, and the API moves it past INIT and RTR in one connect).
#[test]
#[ignore = "needs an RDMA device: run scripts/verbs-tests.sh (Soft-RoCE in a VM)"]
fn a_qp_in_error_after_rts_takes_posts_and_flushes_them() {
    let Unconnected {
        a,
        b,
        cq_a,
        options,
        ..
    } = unconnected(4);
    let eb = b.endpoint(&options).unwrap();
    a.connect(&eb, &options).unwrap();
    a.to_error().unwrap();
    a.post_send(&[SendWr {
        wr_id: 2,
        opcode: Opcode::RdmaWrite,
        local: Local::Empty,
        remote: RemoteAddr::default(),
        imm_data: 0,
        signaled: true,
    }])
    .expect("flushed, not refused");
    let wc = poll_n(&cq_a, 1)[0];
    assert_eq!((wc.wr_id, wc.status), (2, WcStatus::WrFlushErr));
}

#[test]
#[ignore = "needs an RDMA device: run scripts/verbs-tests.sh (Soft-RoCE in a VM)"]
fn the_path_mtu_is_the_smallest_both_sides_take() {
    let Unconnected {
        dev, a, b, options, ..
    } = unconnected(4);
    let ea = a.endpoint(&options).unwrap();
    let mut eb = b.endpoint(&options).unwrap();
    assert_eq!(ea.mtu, dev.active_mtu());
    // b takes at most 256 bytes a packet: a sends no larger ones.
    eb.mtu = 256;
    a.connect(&eb, &options).unwrap();
    b.connect(&ea, &options).unwrap();
    assert_eq!(a.path_mtu(), Some(256));
    assert_eq!(b.path_mtu(), Some(dev.active_mtu()));
}

#[test]
#[ignore = "needs an RDMA device: run scripts/verbs-tests.sh (Soft-RoCE in a VM)"]
fn reads_in_flight_are_what_the_device_allows_and_the_peer_serves() {
    let Unconnected {
        dev,
        pd,
        a,
        b,
        cq_a,
        options,
    } = unconnected(32);
    let ea = a.endpoint(&options).unwrap();
    let mut eb = b.endpoint(&options).unwrap();
    // The device's own depth (rxe: 128, mlx5: 16), not the one READ of a QP's default.
    let depth = ea.rd_atomic;
    assert!(depth > 4, "max_qp_rd_atom {depth}");
    // b serves 4 at once: a keeps no more in flight.
    eb.rd_atomic = 4;
    a.connect(&eb, &options).unwrap();
    b.connect(&ea, &options).unwrap();
    assert_eq!(a.rd_atomic(), Some((4, depth)));
    assert_eq!(b.rd_atomic(), Some((depth, depth)));
    // Sixteen READs in one list, the last signaled: all land.
    let remote = dev.reg_mr(&pd, 16 * 64, RW).unwrap();
    let local = dev.reg_mr(&pd, 16 * 64, Access::LOCAL_WRITE).unwrap();
    let pattern: Vec<u8> = (0..16 * 64).map(|i| (i % 251) as u8).collect();
    remote.write(0, &pattern).unwrap();
    let reads: Vec<SendWr<'_>> = (0..16)
        .map(|i| SendWr {
            wr_id: i,
            opcode: Opcode::RdmaRead,
            local: Local::Sge(local.sge(i as usize * 64, 64)),
            remote: remote.remote(i as usize * 64),
            imm_data: 0,
            signaled: i == 15,
        })
        .collect();
    a.post_send(&reads).unwrap();
    let done = poll_n(&cq_a, 1);
    assert_eq!((done[0].wr_id, done[0].status), (15, WcStatus::Success));
    let mut got = vec![0u8; 16 * 64];
    local.read(0, &mut got).unwrap();
    assert_eq!(got, pattern);
    quiet(&cq_a);
}

#[test]
#[ignore = "needs an RDMA device: run scripts/verbs-tests.sh (Soft-RoCE in a VM)"]
fn bad_options_and_objects_of_another_opening_are_refused_before_anything_changes() {
    let Unconnected {
        dev,
        pd,
        a,
        b,
        cq_a,
        options,
    } = unconnected(4);
    let eb = b.endpoint(&options).unwrap();
    // Out of range (mlx5 would take an rnr_retry of 8 as 0), or another port than the
    // device's: refused, the QP still in RESET and ready to connect.
    for (bad, what) in [
        (
            ConnectOptions {
                rnr_retry: 8,
                ..options
            },
            "invalid rnr_retry",
        ),
        (ConnectOptions { mtu: 0, ..options }, "invalid MTU"),
        (ConnectOptions { port: 2, ..options }, "invalid port"),
    ] {
        let e = a.connect(&eb, &bad).unwrap_err().to_string();
        assert!(e.starts_with(what), "{e}");
        assert!(a.endpoint(&bad).is_err());
        assert_eq!(a.state(), QpState::Reset);
    }
    a.connect(&eb, &options).unwrap();
    assert_eq!(a.state(), QpState::Rts);
    // A second opening of the device is another context: its objects are not this one's.
    let other = device();
    let other_pd = other.alloc_pd().unwrap();
    let other_cq = other.create_cq(4).unwrap();
    let init = send_depth(4);
    for (result, what) in [
        (
            dev.create_qp(&other_pd, &cq_a, &cq_a, &init).err(),
            "protection domain",
        ),
        (dev.create_qp(&pd, &other_cq, &cq_a, &init).err(), "send CQ"),
        (
            dev.create_qp(&pd, &cq_a, &other_cq, &init).err(),
            "receive CQ",
        ),
        (
            dev.reg_mr(&other_pd, 64, Access::LOCAL_WRITE).err(),
            "protection domain",
        ),
    ] {
        let e = result
            .unwrap_or_else(|| panic!("the {what} of another opening was taken"))
            .to_string();
        assert!(
            e.starts_with(&format!("invalid {what}: it belongs to another")),
            "{e}"
        );
    }
}

use selsig_testkit::rxe_errors;

/// What the `rxe_` tests are about: on another device they print what it did, for the
/// record (docs/semantics.md), and fail, as they checked nothing (skip them there:
/// `--skip rxe_`).
fn not_rxe(dev: &VerbsDevice, seen: &str) -> ! {
    panic!(
        "{} is not an rxe device, which this test holds to rxe's source (run with --skip rxe_ \
         on other devices); it did: {seen}",
        dev.name()
    )
}

/// The cases the soft NIC's rxe personality is held to (`selsig-soft/tests/soft.rs`), on
/// the real device: rxe0 in CI.
#[test]
#[ignore = "needs an RDMA device: run scripts/verbs-tests.sh (Soft-RoCE in a VM)"]
fn rxe_fails_requests_as_the_soft_rxe_personality_does() {
    let dev = device();
    let mut others = Vec::new();
    for (case, expected) in rxe_errors::cases() {
        let seen = rxe_errors::run(&dev, dev.gid_index(), &case);
        if dev.is_rxe() {
            assert_eq!(seen, expected, "{}", case.name);
        } else {
            others.push(format!("{}: {seen:?}", case.name));
        }
    }
    if !dev.is_rxe() {
        not_rxe(&dev, &others.join("; "));
    }
}

#[test]
#[ignore = "needs an RDMA device: run scripts/verbs-tests.sh (Soft-RoCE in a VM)"]
fn rxe_drops_the_completions_an_overrun_cq_has_no_room_for() {
    let dev = device();
    let seen = rxe_errors::overrun(&dev, dev.gid_index());
    if !dev.is_rxe() {
        // mlx5 puts the CQ in the error state instead (docs/semantics.md, 8).
        let (got, state, events) = &seen;
        not_rxe(&dev, &format!("{got:?} {state:?} {events:?}"));
    }
    assert_eq!(seen, rxe_errors::overrun_on_rxe());
}

/// rxe retransmits forever with a transport retry count of 7 (its completer never counts
/// 7 down), and gives up with `IBV_WC_RETRY_EXC_ERR` below 7; the soft NIC's rxe
/// personality is held to the same (`selsig-soft/tests/soft.rs`). The wait is long enough
/// for 7 retries of 67 ms (timeout 14) to have run out several times over.
#[test]
#[ignore = "needs an RDMA device: run scripts/verbs-tests.sh (Soft-RoCE in a VM)"]
fn rxe_retries_forever_with_a_retry_count_of_7() {
    use rxe_errors::Unanswered;
    let dev = device();
    let patience = Duration::from_secs(3);
    let forever = rxe_errors::unanswered(&dev, dev.gid_index(), 7, patience);
    let counted = rxe_errors::unanswered(&dev, dev.gid_index(), 1, patience);
    if !dev.is_rxe() {
        not_rxe(
            &dev,
            &format!("retry_cnt 7: {forever:?}; retry_cnt 1: {counted:?}"),
        );
    }
    assert_eq!(forever, Unanswered::retrying_forever());
    assert_eq!(counted, Unanswered::retries_run_out());
}

/// rxe moves a responder whose receive completion finds its CQ full to the error state
/// before it acknowledges the request (`rxe_resp.c`, `RESPST_ERR_CQ_OVERFLOW`): the
/// requester hears nothing, and its retries run out (below 7) or go on for ever (7). The
/// soft NIC's rxe personality is held to the same (`selsig-soft/tests/soft.rs`).
#[test]
#[ignore = "needs an RDMA device: run scripts/verbs-tests.sh (Soft-RoCE in a VM)"]
fn rxe_stops_a_responder_whose_receive_completion_finds_no_room() {
    let dev = device();
    let counted = rxe_errors::receive_overrun(&dev, dev.gid_index(), 1, Duration::from_secs(10));
    let forever = rxe_errors::receive_overrun(&dev, dev.gid_index(), 7, Duration::from_secs(3));
    if !dev.is_rxe() {
        not_rxe(&dev, &format!("{counted:?}; {forever:?}"));
    }
    // The responder's CQ holds what rxe made of 1 entry: as many receives as completed.
    let capacity = counted.receives.len() as u64;
    assert_eq!(
        counted,
        rxe_errors::ReceiveOverrun::retries_run_out(capacity)
    );
    assert_eq!(forever.sends.len() as u64, capacity, "{forever:?}");
    assert_eq!(forever.responder, QpState::Err);
}

/// The device's counts of protection domains, CQs, QPs and memory regions, as the kernel
/// keeps them (`rdma res show`, iproute2); the test fails where the tool is missing or says
/// something else.
fn kernel_resources(dev: &str) -> Vec<(String, u64)> {
    let out = std::process::Command::new("rdma")
        .args(["res", "show"])
        .output()
        .unwrap_or_else(|e| {
            panic!("needs the `rdma` tool (iproute2) to read the kernel's counts: {e}")
        });
    let text = String::from_utf8_lossy(&out.stdout);
    let counts: Vec<(String, u64)> = text
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some(&format!("{dev}:")))
        .map(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            words
                .windows(2)
                .filter(|w| ["pd", "cq", "qp", "mr"].contains(&w[0]))
                .filter_map(|w| Some((w[0].to_string(), w[1].parse().ok()?)))
                .collect()
        })
        .unwrap_or_default();
    let names: Vec<&str> = counts.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        ["pd", "cq", "qp", "mr"],
        "`rdma res show` has no counts of {dev} as expected: {text}"
    );
    counts
}

/// Dropping what the provider created gives every object back to the kernel: its counts
/// of protection domains, CQs, QPs and regions return to what they were.
#[test]
#[ignore = "needs an RDMA device: run scripts/verbs-tests.sh (Soft-RoCE in a VM)"]
fn dropped_objects_are_destroyed_in_the_kernel() {
    let dev = device();
    let before = kernel_resources(dev.name());
    {
        let p = pair(4);
        let _mr = p.dev.reg_mr(&p.pd, 4096, RW).unwrap();
        let during = kernel_resources(dev.name());
        // One more PD, two more CQs and QPs, one more region.
        let more: Vec<u64> = during
            .iter()
            .zip(&before)
            .map(|((_, now), (_, then))| now - then)
            .collect();
        assert_eq!(more, [1, 2, 2, 1], "{before:?} → {during:?}");
    }
    assert_eq!(kernel_resources(dev.name()), before);
}

/// The verbs objects of a program that made them with libibverbs itself.
struct Foreign {
    v: selsig_verbs::sys::Verbs,
    ctx: *mut selsig_verbs::sys::ibv_context,
    pd: *mut selsig_verbs::sys::ibv_pd,
    /// The completion channel of both CQs, or NULL.
    channel: *mut selsig_verbs::sys::ibv_comp_channel,
    cqs: [*mut selsig_verbs::sys::ibv_cq; 2],
    qps: [*mut selsig_verbs::sys::ibv_qp; 2],
}

/// Opens the first device and makes a PD, two CQs and two RC QPs as a C program would.
fn foreign(depth: u32) -> Foreign {
    foreign_with(depth, false)
}

/// [`foreign`], both CQs made with one completion channel if `channel`.
fn foreign_with(depth: u32, channel: bool) -> Foreign {
    use selsig_verbs::sys;
    let v = sys::Verbs::load().unwrap_or_else(|e| panic!("{NEEDS_DEVICE}: {e}"));
    // SAFETY: libibverbs' documented calls, each result checked; the list is freed after
    // the device is opened, as the API allows.
    unsafe {
        let mut n = 0;
        let list = (v.fns.get_device_list)(&mut n);
        assert!(!list.is_null() && n > 0, "{NEEDS_DEVICE}");
        let ctx = (v.fns.open_device)(*list);
        (v.fns.free_device_list)(list);
        assert!(!ctx.is_null(), "ibv_open_device");
        let pd = (v.fns.alloc_pd)(ctx);
        assert!(!pd.is_null(), "ibv_alloc_pd");
        let channel = if channel {
            let c = (v.fns.create_comp_channel)(ctx);
            assert!(!c.is_null(), "ibv_create_comp_channel");
            c
        } else {
            std::ptr::null_mut()
        };
        let cq = || {
            let cq = (v.fns.create_cq)(ctx, 64, std::ptr::null_mut(), channel, 0);
            assert!(!cq.is_null(), "ibv_create_cq");
            cq
        };
        let cqs = [cq(), cq()];
        let qp = |cq| {
            let mut attr = sys::ibv_qp_init_attr {
                qp_context: std::ptr::null_mut(),
                send_cq: cq,
                recv_cq: cq,
                srq: std::ptr::null_mut(),
                cap: sys::ibv_qp_cap {
                    max_send_wr: depth,
                    max_recv_wr: 1,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                },
                qp_type: sys::IBV_QPT_RC,
                sq_sig_all: 0,
            };
            let qp = (v.fns.create_qp)(pd, &mut attr);
            assert!(!qp.is_null(), "ibv_create_qp");
            qp
        };
        let qps = [qp(cqs[0]), qp(cqs[1])];
        Foreign {
            v,
            ctx,
            pd,
            channel,
            cqs,
            qps,
        }
    }
}

/// A queue pair the program made with libibverbs itself, wrapped (`VerbsDevice::from_raw`,
/// `VerbsCq::from_raw`, `VerbsQp::from_raw`), is driven by a `SignaledQueue`: the seed (8
/// WRITEs, every 4th signaled, only two completions) and a bad rkey on WR3 (1-2 completed,
/// 3 failed, 4-8 flushed), the memory checked. Dropping the wrappers destroys nothing: the
/// program destroys every object after them, each destroy succeeding.
#[test]
#[ignore = "needs an RDMA device: run scripts/verbs-tests.sh (Soft-RoCE in a VM)"]
fn a_queue_pair_the_program_made_is_driven_by_a_signaled_queue() {
    for fail_at in [None, Some(3usize)] {
        let f = foreign(16);
        let options = VerbsOptions {
            gid_index: std::env::var("SELSIG_GID_INDEX")
                .ok()
                .and_then(|g| g.parse().ok()),
            ..VerbsOptions::default()
        };
        // The program's memory, registered by the program.
        let src: Vec<u8> = (0..8 * 64).map(|i| (i / 64 + 1) as u8).collect();
        let mut dst = vec![0u8; 8 * 64];
        // SAFETY: both vectors outlive the regions (deregistered below, before they drop).
        let (src_mr, dst_mr) = unsafe {
            // (selsig's access bits are ibv_access_flags'.)
            let access = Access::LOCAL_WRITE.bits() as i32;
            let remote = (Access::LOCAL_WRITE | Access::REMOTE_WRITE).bits() as i32;
            let s = (f.v.fns.reg_mr)(f.pd, src.as_ptr() as *mut _, src.len(), access);
            let d = (f.v.fns.reg_mr)(f.pd, dst.as_mut_ptr().cast(), dst.len(), remote);
            assert!(!s.is_null() && !d.is_null(), "ibv_reg_mr");
            (s, d)
        };
        {
            // SAFETY: the program's objects stay alive until the wrappers are dropped at the
            // end of this block; nothing else posts to the QPs meanwhile.
            let (dev, a, b, cq_a) = unsafe {
                let dev = VerbsDevice::from_raw(f.ctx, &options).unwrap();
                let cq_a = Arc::new(VerbsCq::from_raw(&dev, f.cqs[0]).unwrap());
                let cq_b = Arc::new(VerbsCq::from_raw(&dev, f.cqs[1]).unwrap());
                let a = VerbsQp::from_raw(&dev, f.qps[0], &cq_a, &cq_a).unwrap();
                let b = VerbsQp::from_raw(&dev, f.qps[1], &cq_b, &cq_b).unwrap();
                // A QP with another CQ than its own is refused.
                assert!(VerbsQp::from_raw(&dev, f.qps[0], &cq_b, &cq_b).is_err());
                (dev, a, b, cq_a)
            };
            assert!(a.caps().max_send_wr >= 16, "{:?}", a.caps());
            assert!(!a.sq_sig_all());
            let connect = ConnectOptions {
                gid_index: dev.gid_index(),
                ..ConnectOptions::default()
            };
            connect_pair(&a, &b, &connect).unwrap();
            // SAFETY: the regions are live until deregistered below.
            let (lkey, rkey) = unsafe { ((*src_mr).lkey, (*dst_mr).rkey) };
            let mut queue: SignaledQueue<VerbsDevice, usize> =
                SignaledQueue::new(a, cq_a, Policy::Every(4)).unwrap();
            for i in 0..8 {
                let local = selsig::Sge {
                    addr: src.as_ptr() as u64 + i as u64 * 64,
                    length: 64,
                    lkey,
                };
                let remote = RemoteAddr {
                    addr: dst.as_ptr() as u64 + i as u64 * 64,
                    rkey: rkey ^ if fail_at == Some(i + 1) { 0x5a5a5a } else { 0 },
                };
                queue
                    .post(Work::raw(Opcode::RdmaWrite, Some(local), remote, i))
                    .unwrap();
            }
            let mut done = Vec::new();
            queue.drain(Duration::from_secs(20), &mut done).unwrap();
            let outcomes: Vec<(usize, Outcome)> =
                done.iter().map(|c| (c.user, c.outcome)).collect();
            let want: Vec<(usize, Outcome)> = (0..8)
                .map(|i| match fail_at {
                    Some(k) if i + 1 == k => (i, Outcome::Failed(WcStatus::RemAccessErr)),
                    Some(k) if i + 1 > k => (i, Outcome::Flushed),
                    _ => (i, Outcome::Completed),
                })
                .collect();
            assert_eq!(outcomes, want, "fail at {fail_at:?}");
            if fail_at.is_none() {
                assert_eq!(queue.stats().cqes, 2, "CQE4 and CQE8 only");
            }
            drop(queue);
            drop(b);
        }
        for (i, landed) in dst.chunks(64).enumerate() {
            let completed = fail_at.is_none_or(|k| i + 1 < k);
            assert_eq!(
                landed == &src[i * 64..(i + 1) * 64],
                completed,
                "WR{}",
                i + 1
            );
        }
        // The wrappers destroyed nothing: every destroy of the program's succeeds.
        // SAFETY: the program's objects, destroyed once, children first.
        unsafe {
            for qp in f.qps {
                assert_eq!((f.v.fns.destroy_qp)(qp), 0);
            }
            for cq in f.cqs {
                assert_eq!((f.v.fns.destroy_cq)(cq), 0);
            }
            assert_eq!((f.v.fns.dereg_mr)(src_mr), 0);
            assert_eq!((f.v.fns.dereg_mr)(dst_mr), 0);
            assert_eq!((f.v.fns.dealloc_pd)(f.pd), 0);
            assert_eq!((f.v.fns.close_device)(f.ctx), 0);
        }
    }
}

// Completion events (a completion channel per CQ).

/// Whether `fd` is non-blocking.
fn non_blocking(fd: std::os::fd::RawFd) -> bool {
    // SAFETY: fcntl reading the flags of a descriptor; no memory is passed.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    assert!(flags >= 0, "fcntl: {}", std::io::Error::last_os_error());
    flags & libc::O_NONBLOCK != 0
}

/// A signaled zero-length WRITE (no key needed: the confirm marker).
fn marker(wr_id: u64) -> SendWr<'static> {
    SendWr {
        wr_id,
        opcode: Opcode::RdmaWrite,
        local: Local::Empty,
        remote: RemoteAddr { addr: 0, rkey: 0 },
        imm_data: 0,
        signaled: true,
    }
}

/// A signaled WRITE on an armed CQ wakes a waiter (one event for the arm), after which
/// the completion is there to poll; a second completion without arming again makes no
/// event: one event per arm.
#[test]
#[ignore = "needs an RDMA device: run scripts/verbs-tests.sh (Soft-RoCE in a VM)"]
fn a_completion_on_an_armed_cq_wakes_the_waiter_once_per_arm() {
    let p = pair(8);
    let local = p.dev.reg_mr(&p.pd, 128, Access::LOCAL_WRITE).unwrap();
    let remote = p.dev.reg_mr(&p.pd, 128, RW).unwrap();
    local.write(0, &[0x5a; 128]).unwrap();
    let cq = &p.cq_a;
    let fd = cq.event_fd().expect("a CQ the provider made has a channel");
    assert!(non_blocking(fd));
    assert_eq!(cq.take_events().unwrap(), 0, "no event before an arm");
    // The waiter's order: arm, poll again (nothing yet), sleep.
    cq.req_notify().unwrap();
    quiet(cq);
    p.a.post_send(&[write(1, &local, 0, 64, remote.remote(0), true)])
        .unwrap();
    let start = Instant::now();
    let n = cq.wait_event(Some(Duration::from_secs(5))).unwrap();
    assert_eq!(n, 1, "one arm, one event (after {:?})", start.elapsed());
    let wcs = poll_n(cq, 1);
    assert_eq!(
        (wcs[0].wr_id, wcs[0].status),
        (1, WcStatus::Success),
        "{wcs:?}"
    );
    let mut got = [0u8; 64];
    remote.read(0, &mut got).unwrap();
    assert_eq!(got, [0x5a; 64]);
    // Not armed again: the next completion makes no event.
    p.a.post_send(&[write(2, &local, 64, 64, remote.remote(64), true)])
        .unwrap();
    assert_eq!(poll_n(cq, 1)[0].wr_id, 2);
    assert_eq!(
        cq.wait_event(Some(Duration::from_millis(300))).unwrap(),
        0,
        "an event without an arm"
    );
}

/// The race the waiter's order closes: a completion that lands after the arm and before
/// the waiter sleeps has made its event already, so the wait returns at once.
#[test]
#[ignore = "needs an RDMA device: run scripts/verbs-tests.sh (Soft-RoCE in a VM)"]
fn an_event_made_before_the_wait_is_not_lost() {
    let p = pair(8);
    let cq = &p.cq_a;
    cq.req_notify().unwrap();
    p.a.post_send(&[marker(1)]).unwrap();
    // The completion lands (and its event is made) while nobody waits.
    std::thread::sleep(Duration::from_millis(50));
    let start = Instant::now();
    let n = cq.wait_event(Some(Duration::from_secs(2))).unwrap();
    let took = start.elapsed();
    assert!(n >= 1, "no event after {took:?}");
    assert!(
        took < Duration::from_millis(500),
        "the pending event took {took:?} to be seen"
    );
    assert_eq!(poll_n(cq, 1)[0].wr_id, 1);
}

/// Arming a CQ that already holds a completion makes no event for it (`ibv_req_notify_cq`
/// waits for the *next* completion): hence the waiter's poll after the arm.
#[test]
#[ignore = "needs an RDMA device: run scripts/verbs-tests.sh (Soft-RoCE in a VM)"]
fn an_arm_makes_no_event_for_a_completion_already_in_the_cq() {
    let p = pair(8);
    let cq = &p.cq_a;
    p.a.post_send(&[marker(1)]).unwrap();
    // The completion lands, unpolled (it takes well under a millisecond on rxe).
    std::thread::sleep(Duration::from_millis(300));
    cq.req_notify().unwrap();
    assert_eq!(
        cq.wait_event(Some(Duration::from_millis(300))).unwrap(),
        0,
        "an event for a completion that was in the CQ before the arm"
    );
    let mut buf = [WorkCompletion::new(0, WcStatus::Success, 0); 4];
    assert_eq!(cq.poll(&mut buf).unwrap(), 1, "the completion is there");
    assert_eq!(buf[0].wr_id, 1);
}

/// With nothing armed nor outstanding, a wait returns 0 once its time is out, not before
/// (and at once for a zero timeout).
#[test]
#[ignore = "needs an RDMA device: run scripts/verbs-tests.sh (Soft-RoCE in a VM)"]
fn a_wait_with_nothing_to_wait_for_times_out() {
    let dev = device();
    let cq = dev.create_cq(4).unwrap();
    let start = Instant::now();
    assert_eq!(cq.wait_event(Some(Duration::from_millis(100))).unwrap(), 0);
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(100) && took < Duration::from_secs(1),
        "{took:?}"
    );
    let start = Instant::now();
    assert_eq!(cq.wait_event(Some(Duration::ZERO)).unwrap(), 0);
    assert!(start.elapsed() < Duration::from_millis(100));
    assert_eq!(cq.take_events().unwrap(), 0);
}

/// A thread waiting on an armed, idle CQ sleeps: under 1 % of a core (user + system time
/// of the thread, `getrusage(RUSAGE_THREAD)`) over a wait of 5 s.
#[test]
#[ignore = "needs an RDMA device: run scripts/verbs-tests.sh (Soft-RoCE in a VM)"]
fn a_waiter_on_an_idle_cq_costs_no_cpu() {
    fn thread_cpu() -> Duration {
        // SAFETY: all zero bytes are a valid `rusage`, which getrusage fills.
        let mut r: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: `r` is valid for writing.
        assert_eq!(unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut r) }, 0);
        let tv = |t: libc::timeval| {
            Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
        };
        tv(r.ru_utime) + tv(r.ru_stime)
    }
    let dev = device();
    let cq = dev.create_cq(4).unwrap();
    cq.req_notify().unwrap();
    let wait = Duration::from_secs(5);
    let (n, took, cpu) = std::thread::scope(|s| {
        s.spawn(|| {
            let before = thread_cpu();
            let start = Instant::now();
            let n = cq.wait_event(Some(wait)).unwrap();
            (n, start.elapsed(), thread_cpu() - before)
        })
        .join()
        .unwrap()
    });
    assert_eq!(n, 0, "an event on an idle CQ");
    assert!(took >= wait, "{took:?}");
    assert!(
        cpu < wait / 100,
        "the waiter used {cpu:?} of CPU time in {took:?}"
    );
    eprintln!("a waiter of {took:?} on an idle CQ used {cpu:?} of CPU time");
}

/// A program's CQ: wrapped with `from_raw` it gives no events, even made with a channel;
/// with `from_raw_with_channel` it gives them through that channel (made non-blocking);
/// a channel it was not made with is refused; and an event of another CQ on the channel
/// (a breach of the contract) is reported and acknowledged, so that the program can still
/// destroy that CQ.
#[test]
#[ignore = "needs an RDMA device: run scripts/verbs-tests.sh (Soft-RoCE in a VM)"]
fn a_program_s_cq_gives_events_through_its_own_channel_only() {
    let f = foreign_with(8, true);
    let options = VerbsOptions {
        gid_index: std::env::var("SELSIG_GID_INDEX")
            .ok()
            .and_then(|g| g.parse().ok()),
        ..VerbsOptions::default()
    };
    // SAFETY: the channel is live until destroyed at the end.
    let fd = unsafe { (*f.channel).fd };
    assert!(!non_blocking(fd), "libibverbs makes a blocking channel");
    // A CQ of the program made without a channel.
    // SAFETY: the context is open; the CQ is destroyed below.
    let bare =
        unsafe { (f.v.fns.create_cq)(f.ctx, 4, std::ptr::null_mut(), std::ptr::null_mut(), 0) };
    assert!(!bare.is_null(), "ibv_create_cq");
    {
        // SAFETY: the program's objects stay alive until the wrappers are dropped at the
        // end of this block.
        let dev = unsafe { VerbsDevice::from_raw(f.ctx, &options) }.unwrap();
        // SAFETY: as above.
        let plain = unsafe { VerbsCq::from_raw(&dev, f.cqs[0]) }.unwrap();
        assert!(plain.event_fd().is_none());
        assert!(matches!(plain.req_notify(), Err(CqError::NoEvents)));
        assert!(matches!(plain.take_events(), Err(CqError::NoEvents)));
        assert!(matches!(
            plain.wait_event(Some(Duration::from_millis(10))),
            Err(CqError::NoEvents)
        ));
        drop(plain);
        // SAFETY: as above.
        let refused = unsafe { VerbsCq::from_raw_with_channel(&dev, bare, f.channel) };
        assert!(
            matches!(refused, Err(ProviderError::Invalid { .. })),
            "a CQ made without the channel: {:?}",
            refused.err()
        );
        // SAFETY: as above.
        let refused =
            unsafe { VerbsCq::from_raw_with_channel(&dev, f.cqs[0], std::ptr::null_mut()) };
        assert!(matches!(refused, Err(ProviderError::Invalid { .. })));
        assert!(!non_blocking(fd), "nothing changed by a refusal");

        // SAFETY: as above; the channel serves cqs[0] and, in breach of the contract,
        // cqs[1], whose event is the point of the end of this test.
        let (cq_a, cq_b) = unsafe {
            (
                Arc::new(VerbsCq::from_raw_with_channel(&dev, f.cqs[0], f.channel).unwrap()),
                Arc::new(VerbsCq::from_raw(&dev, f.cqs[1]).unwrap()),
            )
        };
        assert_eq!(cq_a.event_fd(), Some(fd));
        assert!(
            non_blocking(fd),
            "from_raw_with_channel makes the fd non-blocking"
        );
        // SAFETY: as above.
        let (a, b) = unsafe {
            (
                VerbsQp::from_raw(&dev, f.qps[0], &cq_a, &cq_a).unwrap(),
                VerbsQp::from_raw(&dev, f.qps[1], &cq_b, &cq_b).unwrap(),
            )
        };
        let connect = ConnectOptions {
            gid_index: dev.gid_index(),
            ..ConnectOptions::default()
        };
        connect_pair(&a, &b, &connect).unwrap();
        cq_a.req_notify().unwrap();
        quiet(&cq_a);
        a.post_send(&[marker(1)]).unwrap();
        assert_eq!(cq_a.wait_event(Some(Duration::from_secs(5))).unwrap(), 1);
        assert_eq!(poll_n(&cq_a, 1)[0].wr_id, 1);

        // The breach: the other CQ of the channel armed by the program, and a completion
        // there.
        // SAFETY: the program's live CQ; its provider's `req_notify_cq`, as the static
        // inline `ibv_req_notify_cq` calls it.
        let rc = unsafe {
            let arm = (*(*f.cqs[1]).context).ops.req_notify_cq.unwrap();
            arm(f.cqs[1], 0)
        };
        assert_eq!(rc, 0, "ibv_req_notify_cq");
        b.post_send(&[marker(2)]).unwrap();
        assert_eq!(poll_n(&cq_b, 1)[0].wr_id, 2);
        match cq_a.wait_event(Some(Duration::from_secs(5))) {
            Err(CqError::Event(e)) => {
                assert!(e.to_string().contains("another CQ"), "{e}")
            }
            other => panic!("another CQ's event: {other:?}"),
        }
        assert_eq!(cq_a.take_events().unwrap(), 0, "the channel is empty");
        // SAFETY: the program's live CQ (a plain read of a counter libibverbs updated
        // under the CQ's mutex on this thread).
        let acked = unsafe { (*f.cqs[1]).comp_events_completed };
        assert_eq!(acked, 1, "the other CQ's event was acknowledged");
        drop((a, b));
    }
    // The program destroys everything; the CQ whose event was read by the wrapper does not
    // wait (it was acknowledged), and the channel is free once its CQs are gone.
    // SAFETY: the program's objects, destroyed once, children first.
    unsafe {
        for qp in f.qps {
            assert_eq!((f.v.fns.destroy_qp)(qp), 0);
        }
        for cq in f.cqs.into_iter().chain([bare]) {
            assert_eq!((f.v.fns.destroy_cq)(cq), 0);
        }
        assert_eq!((f.v.fns.destroy_comp_channel)(f.channel), 0);
        assert_eq!((f.v.fns.dealloc_pd)(f.pd), 0);
        assert_eq!((f.v.fns.close_device)(f.ctx), 0);
    }
}

/// Dropping a CQ the provider made destroys it, then its completion channel, without
/// waiting, even with an event left unread: the kernel's count of CQs goes back and the
/// channels' descriptors are closed.
#[test]
#[ignore = "needs an RDMA device: run scripts/verbs-tests.sh (Soft-RoCE in a VM)"]
fn a_cq_is_destroyed_with_its_channel_an_unread_event_left() {
    let p = pair(8);
    p.cq_a.req_notify().unwrap();
    p.a.post_send(&[marker(1)]).unwrap();
    assert_eq!(p.cq_a.wait_event(Some(Duration::from_secs(5))).unwrap(), 1);
    // Armed again: the next completion's event is left unread.
    p.cq_a.req_notify().unwrap();
    p.a.post_send(&[marker(2)]).unwrap();
    assert_eq!(poll_n(&p.cq_a, 2).len(), 2);
    let link = |fd: std::os::fd::RawFd| std::fs::read_link(format!("/proc/self/fd/{fd}")).ok();
    let fds = [p.cq_a.event_fd().unwrap(), p.cq_b.event_fd().unwrap()];
    let links = fds.map(link);
    assert!(
        links.iter().all(|l| l
            .as_ref()
            .is_some_and(|l| l.to_string_lossy().contains("infiniband"))),
        "{links:?}"
    );
    let dev = p.dev.clone();
    let before = kernel_resources(dev.name());
    // (On a thread: were the destroy to wait for the unread event, the test fails rather
    // than hangs.)
    let (done, dropped) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        drop(p);
        let _ = done.send(());
    });
    dropped
        .recv_timeout(Duration::from_secs(20))
        .expect("dropping the CQs did not return");
    let after = kernel_resources(dev.name());
    let fewer: Vec<i64> = before
        .iter()
        .zip(&after)
        .map(|((_, b), (_, a))| *b as i64 - *a as i64)
        .collect();
    assert_eq!(fewer, [1, 2, 2, 0], "{before:?} → {after:?}");
    // (A number closed may be taken again at once by another test's thread: its link
    // then differs.)
    for (fd, was) in fds.into_iter().zip(&links) {
        assert_ne!(
            &link(fd),
            was,
            "the channel's descriptor {fd} is still open"
        );
    }
}

/// Asking a CQ whether its device was lost reads the device's asynchronous events, and
/// keeps them for `poll_async_event`: rxe's overrun events, raised while a CQ of 2 entries
/// gets 5 completions, come out of `poll_async_event` after `device_lost` read them, and
/// the device is not lost (rxe never raises `IBV_EVENT_DEVICE_FATAL`: semantics 39).
#[test]
#[ignore = "needs an RDMA device: run scripts/verbs-tests.sh (Soft-RoCE in a VM)"]
fn looking_for_a_lost_device_keeps_the_other_events() {
    let dev = device();
    let pd = dev.alloc_pd().unwrap();
    let cq_a = dev.create_cq(2).unwrap();
    let cq_b = dev.create_cq(4).unwrap();
    let a = dev.create_qp(&pd, &cq_a, &cq_a, &send_depth(16)).unwrap();
    let b = dev.create_qp(&pd, &cq_b, &cq_b, &send_depth(16)).unwrap();
    let options = ConnectOptions {
        gid_index: dev.gid_index(),
        ..ConnectOptions::default()
    };
    connect_pair(&a, &b, &options).unwrap();
    let n = u64::from(cq_a.capacity()) + 3;
    let len = 8 * (n as usize + 1);
    let local = dev.reg_mr(&pd, len, Access::LOCAL_WRITE).unwrap();
    let pattern: Vec<u8> = (0..len).map(|i| i as u8 | 1).collect();
    local.write(0, &pattern).unwrap();
    let remote = dev.reg_mr(&pd, len, RW).unwrap();
    let wrs: Vec<_> = (1..=n)
        .map(|i| {
            let at = 8 * i as usize;
            write(i, &local, at, 8, remote.remote(at), true)
        })
        .collect();
    a.post_send(&wrs).unwrap();
    // The last WRITE landed, then its completion found no room: the three completions
    // beyond the CQ's room each raise CQ_ERR (rxe_cq_post).
    let last = 8 * n as usize;
    let start = Instant::now();
    let mut landed = [0u8; 8];
    while landed[..] != pattern[last..last + 8] {
        assert!(start.elapsed() < Duration::from_secs(20), "the WRITEs ran");
        std::thread::sleep(Duration::from_millis(5));
        remote.read(last, &mut landed).unwrap();
    }
    std::thread::sleep(Duration::from_millis(200));
    assert!(!cq_a.device_lost(), "rxe0 is not lost");
    let events: Vec<_> = std::iter::from_fn(|| dev.poll_async_event()).collect();
    assert_eq!(
        events.iter().filter(|e| e.as_str() == "cq_err").count(),
        3,
        "{events:?}"
    );
    assert!(!cq_a.device_lost());
    drop((a, b));
}

// Scatter/gather lists (`Local::Sges`, `Work::list`) on `ibv_post_send`.

/// Two connected QPs of `max_send_sge` entries per send (the device may grant more: rxe
/// rounds the send WQE up to `max_inline_data`), with a local and a remote region of
/// 4096 bytes each.
struct ListPair {
    p: Pair,
    local: selsig_verbs::VerbsMr,
    remote: selsig_verbs::VerbsMr,
}

fn list_pair(max_send_sge: u32) -> ListPair {
    list_pair_on(device(), max_send_sge)
}

/// [`list_pair`] on `dev` (whose post API the QPs take), the remote region and the QPs
/// open to atomics too.
fn list_pair_on(dev: VerbsDevice, max_send_sge: u32) -> ListPair {
    let pd = dev.alloc_pd().unwrap();
    let cq_a = Arc::new(dev.create_cq(64).unwrap());
    let cq_b = Arc::new(dev.create_cq(64).unwrap());
    let init = QpInit {
        caps: QpCaps {
            max_send_wr: 16,
            max_recv_wr: 16,
            max_send_sge,
            max_inline_data: 64,
            ..QpCaps::default()
        },
        sq_sig_all: false,
    };
    let a = dev.create_qp(&pd, &cq_a, &cq_a, &init).unwrap();
    let b = dev.create_qp(&pd, &cq_b, &cq_b, &init).unwrap();
    assert!(
        a.caps().max_send_sge >= max_send_sge,
        "asked {max_send_sge}, granted {:?}",
        a.caps()
    );
    let options = ConnectOptions {
        gid_index: dev.gid_index(),
        access: RW.union(Access::REMOTE_ATOMIC),
        ..ConnectOptions::default()
    };
    connect_pair(&a, &b, &options).unwrap();
    let local = dev.reg_mr(&pd, 4096, Access::LOCAL_WRITE).unwrap();
    let remote = dev
        .reg_mr(&pd, 4096, RW.union(Access::REMOTE_ATOMIC))
        .unwrap();
    ListPair {
        p: Pair {
            dev,
            pd,
            a,
            b,
            cq_a,
            cq_b,
        },
        local,
        remote,
    }
}

/// Three pieces of unequal lengths at scattered offsets, each filled with its own byte:
/// `(offset, length, byte)`.
const PIECES: [(usize, u32, u8); 3] = [(0, 100, 0xa1), (1000, 37, 0xb2), (2000, 300, 0xc3)];

fn concatenation() -> Vec<u8> {
    PIECES
        .iter()
        .flat_map(|&(_, len, byte)| std::iter::repeat_n(byte, len as usize))
        .collect()
}

fn read_back(mr: &impl MemoryRegion, off: usize, len: usize) -> Vec<u8> {
    let mut got = vec![0u8; len];
    mr.read(off, &mut got).unwrap();
    got
}

/// A WRITE of three entries places their bytes one after the other, and nothing around
/// them: on `ibv_post_send`, and through a `SignaledQueue` from a list of buffers, which
/// come back in their order.
#[test]
#[ignore = "needs an RDMA device: run scripts/verbs-tests.sh (Soft-RoCE in a VM)"]
fn a_gather_write_places_the_concatenation() {
    let l = list_pair(3);
    let sges: Vec<_> = PIECES
        .iter()
        .map(|&(off, len, byte)| {
            l.local.write(off, &vec![byte; len as usize]).unwrap();
            l.local.sge(off, len)
        })
        .collect();
    let total = concatenation().len();
    l.p.a
        .post_send(&[SendWr {
            wr_id: 1,
            opcode: Opcode::RdmaWrite,
            local: Local::Sges(&sges),
            remote: l.remote.remote(8),
            imm_data: 0,
            signaled: true,
        }])
        .unwrap();
    let wcs = poll_n(&l.p.cq_a, 1);
    assert_eq!((wcs[0].wr_id, wcs[0].status), (1, WcStatus::Success));
    quiet(&l.p.cq_a);
    let mut expected = vec![0u8; 8];
    expected.extend(concatenation());
    expected.extend([0u8; 8]);
    assert_eq!(read_back(&l.remote, 0, total + 16), expected);

    // The same through a queue: three buffers of one region, gathered at offset 2048.
    let ListPair { p, remote, .. } = l;
    let region = p.dev.reg_mr(&p.pd, 4096, Access::LOCAL_WRITE).unwrap();
    let rest = Buffer::new(region);
    let mut list = Vec::new();
    let mut rest = Some(rest);
    for &(_, len, byte) in &PIECES {
        let (mut b, r) = rest.take().unwrap().split_at(len as usize).unwrap();
        b.fill(byte).unwrap();
        list.push(b);
        rest = Some(r);
    }
    let mut q: SignaledQueue<VerbsDevice, u32> =
        SignaledQueue::new(p.a, Arc::clone(&p.cq_a), Policy::Every(4)).unwrap();
    q.post(Work::list(Opcode::RdmaWrite, list, remote.remote(2048), 7))
        .unwrap();
    let mut done = Vec::new();
    q.drain(Duration::from_secs(20), &mut done).unwrap();
    assert_eq!(done.len(), 1);
    assert_eq!((done[0].user, done[0].outcome), (7, Outcome::Completed));
    assert_eq!(
        done[0]
            .list
            .as_deref()
            .expect("the list back")
            .iter()
            .map(|b| b.len())
            .collect::<Vec<_>>(),
        PIECES.iter().map(|p| p.1 as usize).collect::<Vec<_>>(),
        "the buffers come back in their order"
    );
    assert_eq!(read_back(&remote, 2048, total), concatenation());
}

/// A READ of three entries scatters the remote bytes over them in order.
#[test]
#[ignore = "needs an RDMA device: run scripts/verbs-tests.sh (Soft-RoCE in a VM)"]
fn a_scatter_read_fills_three_buffers_in_order() {
    let l = list_pair(3);
    let source = concatenation();
    l.remote.write(64, &source).unwrap();
    let sges: Vec<_> = PIECES
        .iter()
        .map(|&(off, len, _)| l.local.sge(off, len))
        .collect();
    l.p.a
        .post_send(&[SendWr {
            wr_id: 2,
            opcode: Opcode::RdmaRead,
            local: Local::Sges(&sges),
            remote: l.remote.remote(64),
            imm_data: 0,
            signaled: true,
        }])
        .unwrap();
    let wcs = poll_n(&l.p.cq_a, 1);
    assert_eq!((wcs[0].wr_id, wcs[0].status), (2, WcStatus::Success));
    for &(off, len, byte) in &PIECES {
        assert_eq!(
            read_back(&l.local, off, len as usize),
            vec![byte; len as usize]
        );
        // Nothing past each piece.
        assert_eq!(read_back(&l.local, off + len as usize, 1), [0]);
    }
}

/// A list longer than the QP's `max_send_sge` (as granted) is refused before the post,
/// with the count and the limit; what comes before it in the batch is posted, it and
/// nothing after it. Through a queue it is refused before the tracker takes it.
#[test]
#[ignore = "needs an RDMA device: run scripts/verbs-tests.sh (Soft-RoCE in a VM)"]
fn a_list_longer_than_max_send_sge_is_refused_with_the_limit_named() {
    let l = list_pair(2);
    let max = l.p.a.caps().max_send_sge;
    let count = max as usize + 1;
    l.local.write(0, &[0x5a; 64]).unwrap();
    let sges: Vec<_> = (0..count).map(|i| l.local.sge(i * 8, 8)).collect();
    let list = |wr_id| SendWr {
        wr_id,
        opcode: Opcode::RdmaWrite,
        local: Local::Sges(&sges),
        remote: l.remote.remote(0),
        imm_data: 0,
        signaled: true,
    };
    let e = l.p.a.post_send(&[list(1)]).unwrap_err();
    assert_eq!(
        (e.index, e.failure),
        (0, PostFailure::TooManySges { count, max })
    );
    let text = e.to_string();
    assert!(
        text.contains(&format!("{count} entries")) && text.contains(&format!("{max}")),
        "{text}"
    );
    quiet(&l.p.cq_a);
    assert_eq!(read_back(&l.remote, 0, 64), [0u8; 64], "nothing was posted");
    // At its position: the one before is posted.
    let short = SendWr {
        local: Local::Sges(&sges[..max as usize]),
        remote: l.remote.remote(512),
        ..list(2)
    };
    let e = l.p.a.post_send(&[short, list(3), short]).unwrap_err();
    assert_eq!(
        (e.index, e.failure),
        (1, PostFailure::TooManySges { count, max })
    );
    let wcs = poll_n(&l.p.cq_a, 1);
    assert_eq!((wcs[0].wr_id, wcs[0].status), (2, WcStatus::Success));
    quiet(&l.p.cq_a);
    assert_eq!(read_back(&l.remote, 0, 64), [0u8; 64]);
    assert_eq!(read_back(&l.remote, 512, 8), [0x5a; 8]);
    assert_eq!(l.p.a.state(), QpState::Rts);

    // A queue refuses it before posting: it comes back with the reason.
    let ListPair { p, remote, local } = l;
    let mut q: SignaledQueue<VerbsDevice, u32> =
        SignaledQueue::new(p.a, Arc::clone(&p.cq_a), Policy::Every(4)).unwrap();
    let refused = q
        .post(Work::raw_list(
            Opcode::RdmaWrite,
            &sges,
            remote.remote(0),
            9,
        ))
        .unwrap_err();
    match &refused {
        selsig::QueuePostError::Invalid { source, .. } => {
            let why = source.to_string();
            assert!(why.contains(&format!("{count} entries")), "{why}");
            assert!(why.contains(&format!("max_send_sge of {max}")), "{why}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(q.stats().posted, 0);
    drop(local);
}

/// What rxe makes of a bad third entry, all three inside the first packet (3 x 64 bytes):
/// the requester fails the WRITE locally and places nothing at the responder. Kernel
/// rxe's `copy_data` (`rxe_mr.c`) cannot resolve an lkey that names no region (the
/// expectation from the source: `IBV_WC_LOC_QP_OP_ERR`), and checks an address outside
/// the region's range (`IBV_WC_LOC_PROT_ERR`).
#[test]
#[ignore = "needs an RDMA device: run scripts/verbs-tests.sh (Soft-RoCE in a VM)"]
fn rxe_fails_a_list_whose_third_entry_is_bad_and_places_nothing() {
    let mut seen = Vec::new();
    for bad in ["lkey", "address"] {
        let l = list_pair(3);
        l.local.write(0, &[0x77; 192]).unwrap();
        let mut sges: Vec<_> = (0..3).map(|i| l.local.sge(i * 64, 64)).collect();
        match bad {
            "lkey" => sges[2].lkey ^= 0x5a5a00,
            _ => sges[2].addr = l.local.addr() + 8192,
        }
        l.p.a
            .post_send(&[SendWr {
                wr_id: 3,
                opcode: Opcode::RdmaWrite,
                local: Local::Sges(&sges),
                remote: l.remote.remote(0),
                imm_data: 0,
                signaled: true,
            }])
            .unwrap();
        let wcs = poll_n(&l.p.cq_a, 1);
        assert_eq!(wcs[0].wr_id, 3);
        // The responder saw no packet of it: nothing placed.
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(read_back(&l.remote, 0, 192), [0u8; 192], "{bad}");
        quiet(&l.p.cq_b);
        seen.push((bad, wcs[0].status, l.p.a.state()));
    }
    println!("a bad third entry on {}: {seen:?}", device().name());
    let dev = device();
    if !dev.is_rxe() {
        not_rxe(&dev, &format!("{seen:?}"));
    }
    assert_eq!(
        seen,
        [
            ("lkey", WcStatus::LocQpOpErr, QpState::Err),
            ("address", WcStatus::LocProtErr, QpState::Err),
        ]
    );
}

// The extended posting API (`PostApi::Extended`: `ibv_wr_start` ... `ibv_wr_complete`).

/// A receive completion's `wr_id`, status, opcode, `byte_len` and immediate data.
type Received = (u64, WcStatus, Option<WcOpcode>, u32, Option<u32>);

fn extended() -> VerbsDevice {
    device()
        .with_post_api(PostApi::Extended)
        .unwrap_or_else(|e| panic!("the device takes no extended posts: {e}"))
}

/// What a batch of every operation and kind of data did: the sender's completions, the
/// receiver's, and the bytes of the local region, the remote one and the receives'.
#[derive(Debug, PartialEq)]
struct BatchOutcome {
    /// The capacities the QP was given.
    caps: QpCaps,
    sent: Vec<(u64, WcStatus, Option<WcOpcode>, u32)>,
    received: Vec<Received>,
    local: Vec<u8>,
    remote: Vec<u8>,
    inbox: Vec<u8>,
}

/// `uneven`: the lists of the third and eighth work requests have entries of different
/// lengths (on rxe such a batch goes through `ibv_post_send`: rxe's `wr_set_sge_list`
/// before rdma-core 64 writes the message length wrong); else their entries are of one
/// length, and the batch goes through the extended API on any device.
fn batch_of_everything(dev: VerbsDevice, uneven: bool) -> BatchOutcome {
    let api = dev.post_api();
    let l = list_pair_on(dev, 3);
    assert_eq!(l.p.a.post_api(), api);
    let inbox = l.p.dev.reg_mr(&l.p.pd, 256, Access::LOCAL_WRITE).unwrap();
    l.p.b
        .post_recv(&[
            RecvWr {
                wr_id: 100,
                sge: Some(inbox.sge(0, 64)),
            },
            RecvWr {
                wr_id: 101,
                sge: Some(inbox.sge(64, 64)),
            },
            RecvWr {
                wr_id: 102,
                sge: Some(inbox.sge(128, 64)),
            },
        ])
        .unwrap();
    let (local, remote) = (&l.local, &l.remote);
    local.write(0, &[0x11; 64]).unwrap();
    local.write(64, &[0x22; 96]).unwrap();
    local.write(200, &[0x33; 37]).unwrap();
    local.write(300, &[0x44; 100]).unwrap();
    let pattern: Vec<u8> = (0..100u8).collect();
    remote.write(1024, &pattern).unwrap();
    remote.write(2048, &5u64.to_ne_bytes()).unwrap();
    let even: Vec<_> = (0..3).map(|i| local.sge(64 + i * 32, 32)).collect();
    let third = if uneven {
        [local.sge(200, 37), local.sge(300, 100)]
    } else {
        [local.sge(200, 32), local.sge(300, 32)]
    };
    let scatter = if uneven {
        [local.sge(1024, 40), local.sge(1100, 60)]
    } else {
        [local.sge(1024, 50), local.sge(1100, 50)]
    };
    let inline: &[u8] = b"inline, 16 bytes";
    let wr = |wr_id, opcode, local, remote| SendWr {
        wr_id,
        opcode,
        local,
        remote,
        imm_data: 0,
        signaled: true,
    };
    let batch = [
        wr(
            1,
            Opcode::RdmaWrite,
            Local::Sge(local.sge(0, 64)),
            remote.remote(0),
        ),
        wr(2, Opcode::RdmaWrite, Local::Sges(&even), remote.remote(100)),
        wr(
            3,
            Opcode::RdmaWrite,
            Local::Sges(&third),
            remote.remote(300),
        ),
        wr(
            4,
            Opcode::RdmaWrite,
            Local::Inline(inline),
            remote.remote(500),
        ),
        SendWr {
            imm_data: 0xdead_beef,
            ..wr(
                5,
                Opcode::RdmaWriteWithImm,
                Local::Sge(local.sge(0, 8)),
                remote.remote(600),
            )
        },
        wr(
            6,
            Opcode::Send,
            Local::Sge(local.sge(64, 16)),
            RemoteAddr::default(),
        ),
        SendWr {
            imm_data: 7,
            ..wr(
                7,
                Opcode::SendWithImm,
                Local::Inline(inline),
                RemoteAddr::default(),
            )
        },
        wr(
            8,
            Opcode::RdmaRead,
            Local::Sges(&scatter),
            remote.remote(1024),
        ),
        wr(
            9,
            Opcode::AtomicFetchAdd { add: 3 },
            Local::Sge(local.sge(512, 8)),
            remote.remote(2048),
        ),
        wr(
            10,
            Opcode::AtomicCmpSwp {
                compare: 8,
                swap: 9,
            },
            Local::Sge(local.sge(520, 8)),
            remote.remote(2048),
        ),
        wr(11, Opcode::RdmaWrite, Local::Empty, RemoteAddr::default()),
        wr(
            12,
            Opcode::RdmaWrite,
            Local::Sges(&[]),
            RemoteAddr::default(),
        ),
    ];
    l.p.a.post_send(&batch).unwrap();
    let sent = poll_n(&l.p.cq_a, batch.len())
        .iter()
        .map(|w| (w.wr_id, w.status, w.opcode, w.byte_len))
        .collect();
    let received = poll_n(&l.p.cq_b, 3)
        .iter()
        .map(|w| (w.wr_id, w.status, w.opcode, w.byte_len, w.imm_data))
        .collect();
    quiet(&l.p.cq_a);
    quiet(&l.p.cq_b);
    BatchOutcome {
        caps: l.p.a.caps(),
        sent,
        received,
        local: read_back(local, 0, 4096),
        remote: read_back(remote, 0, 4096),
        inbox: read_back(&inbox, 0, 256),
    }
}

/// One batch of every operation selsig posts, with every kind of data (an entry, lists
/// even and uneven, inline bytes, none, an empty list), posted through the extended API,
/// completes and places exactly as through `ibv_post_send`.
#[test]
#[ignore = "needs an RDMA device: run scripts/verbs-tests.sh (Soft-RoCE in a VM)"]
fn the_extended_api_posts_what_the_legacy_one_does() {
    for uneven in [false, true] {
        let legacy = batch_of_everything(device(), uneven);
        assert!(
            legacy.sent.iter().all(|s| s.1 == WcStatus::Success),
            "{:?}",
            legacy.sent
        );
        assert_eq!(legacy.sent.len(), 12);
        let ext = batch_of_everything(extended(), uneven);
        assert_eq!(
            ext.caps, legacy.caps,
            "ibv_create_qp_ex gives what ibv_create_qp does"
        );
        assert_eq!(ext.sent, legacy.sent, "uneven: {uneven}");
        assert_eq!(ext.received, legacy.received, "uneven: {uneven}");
        assert_eq!(ext.inbox, legacy.inbox, "uneven: {uneven}");
        assert_eq!(ext.remote, legacy.remote, "uneven: {uneven}");
        assert_eq!(ext.local, legacy.local, "uneven: {uneven}");
        let (a, b) = if uneven { (37, 100) } else { (32, 32) };
        assert_eq!(ext.remote[300..300 + a], vec![0x33; a]);
        assert_eq!(ext.remote[300 + a..300 + a + b], vec![0x44; b]);
        assert_eq!(ext.remote[300 + a + b], 0);
        let pattern: Vec<u8> = (0..100u8).collect();
        let (c, d) = if uneven { (40, 60) } else { (50, 50) };
        assert_eq!(ext.local[1024..1024 + c], pattern[..c]);
        assert_eq!(ext.local[1100..1100 + d], pattern[c..]);
    }
    let ext = batch_of_everything(extended(), false);
    // And the bytes are the ones meant.
    assert_eq!(ext.remote[..64], [0x11; 64]);
    assert_eq!(ext.remote[100..196], [0x22; 96]);
    assert_eq!(&ext.remote[500..516], b"inline, 16 bytes");
    // The WRITE with immediate took the first receive, the SEND the second, the inline
    // SEND with immediate the third.
    assert_eq!(ext.inbox[64..80], [0x22; 16]);
    assert_eq!(&ext.inbox[128..144], b"inline, 16 bytes");
    assert_eq!(
        ext.remote[2048..2056],
        9u64.to_ne_bytes(),
        "5, plus 3, swapped for 9"
    );
}

/// A batch that `ibv_wr_complete` refuses is posted not at all: a send queue overfilled in
/// one batch (rxe's `check_qp_queue_full`: ENOSPC) is refused at index 0, a full queue, and
/// nothing of it runs; a list too long for the QP, third in a batch, refuses the whole
/// batch with the count and the limit.
#[test]
#[ignore = "needs an RDMA device: run scripts/verbs-tests.sh (Soft-RoCE in a VM)"]
fn a_batch_the_extended_api_refuses_posts_nothing() {
    let l = list_pair_on(extended(), 2);
    l.local.write(0, &[0x66; 64]).unwrap();
    let wrs: Vec<_> = (0..300)
        .map(|i| write(i, &l.local, 0, 8, l.remote.remote(8), true))
        .collect();
    let e = l.p.a.post_send(&wrs).unwrap_err();
    assert_eq!((e.index, e.failure), (0, PostFailure::Full), "{e}");
    quiet(&l.p.cq_a);
    assert_eq!(read_back(&l.remote, 0, 64), [0u8; 64], "nothing was posted");
    assert_eq!(l.p.a.state(), QpState::Rts);

    let max = l.p.a.caps().max_send_sge;
    let count = max as usize + 1;
    let sges: Vec<_> = (0..count).map(|i| l.local.sge(i * 8, 8)).collect();
    let batch = [
        write(1, &l.local, 0, 8, l.remote.remote(0), true),
        write(2, &l.local, 0, 8, l.remote.remote(16), true),
        SendWr {
            local: Local::Sges(&sges),
            ..write(3, &l.local, 0, 8, l.remote.remote(32), true)
        },
    ];
    let e = l.p.a.post_send(&batch).unwrap_err();
    assert_eq!(
        (e.index, e.failure),
        (0, PostFailure::TooManySges { count, max })
    );
    quiet(&l.p.cq_a);
    assert_eq!(read_back(&l.remote, 0, 64), [0u8; 64], "nothing was posted");
    // The QP is as it was: the next batch runs.
    l.p.a.post_send(&batch[..2]).unwrap();
    let wcs = poll_n(&l.p.cq_a, 2);
    assert_eq!(
        wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(1, WcStatus::Success), (2, WcStatus::Success)]
    );
}

/// Through a queue: a batch whose third work request is inline data beyond the QP's
/// `max_inline_data` is refused whole, and every work request comes back from
/// `post_batch` with its buffer, in order; the queue is as before and posts the next batch.
#[test]
#[ignore = "needs an RDMA device: run scripts/verbs-tests.sh (Soft-RoCE in a VM)"]
fn a_refused_extended_batch_hands_every_buffer_back() {
    let l = list_pair_on(extended(), 1);
    let ListPair { p, remote, .. } = l;
    let max_inline = p.a.caps().max_inline_data as usize;
    let (bufs, _) = Buffer::new(p.dev.reg_mr(&p.pd, 4 * 64, Access::LOCAL_WRITE).unwrap())
        .split_into(4, 64)
        .unwrap();
    let mut q: SignaledQueue<VerbsDevice, u32> =
        SignaledQueue::new(p.a, Arc::clone(&p.cq_a), Policy::Every(4)).unwrap();
    let big = vec![0x77u8; max_inline + 1];
    let mut bufs = bufs.into_iter();
    let mut works = Vec::new();
    for i in 0..4u32 {
        let target = remote.remote(i as usize * 64);
        works.push(if i == 2 {
            Work::write_inline(&big, target, i)
        } else {
            let mut b = bufs.next().unwrap();
            b.fill(0x40 + i as u8).unwrap();
            Work::write(b, target, i)
        });
    }
    let e = q.post_batch(&mut works.into_iter()).unwrap_err();
    match e {
        selsig::QueuePostError::Provider { returned, source } => {
            assert_eq!(source.index, 0, "{source}");
            assert_eq!(
                source.failure,
                PostFailure::InlineTooLong {
                    len: max_inline + 1,
                    max: max_inline as u32
                }
            );
            assert_eq!(
                returned.iter().map(|p| p.user).collect::<Vec<_>>(),
                [0, 1, 2, 3]
            );
            assert_eq!(
                returned
                    .iter()
                    .map(|p| p.buffer.is_some())
                    .collect::<Vec<_>>(),
                [true, true, false, true]
            );
            // The next batch, the same buffers, posts and completes.
            let again: Vec<_> = returned
                .into_iter()
                .filter_map(|p| p.buffer.map(|b| (b, p.user)))
                .map(|(b, u)| Work::write(b, remote.remote(u as usize * 64), u))
                .collect();
            assert_eq!(q.post_batch(&mut again.into_iter()).unwrap(), 3);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(q.stats().posted, 3);
    let mut done = Vec::new();
    q.drain(Duration::from_secs(20), &mut done).unwrap();
    assert_eq!(
        done.iter().map(|c| (c.user, c.outcome)).collect::<Vec<_>>(),
        [0, 1, 3].map(|u| (u, Outcome::Completed))
    );
    assert_eq!(read_back(&remote, 0, 64), [0x40; 64]);
    assert_eq!(read_back(&remote, 128, 64), [0u8; 64]);
    assert_eq!(read_back(&remote, 192, 64), [0x43; 64]);
}

/// A program's QP is posted to through the extended API only if it was made for it: one
/// made with `ibv_create_qp` is refused by a device handle that posts through it, with the
/// reason; one made with `ibv_create_qp_ex` and `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS` is taken
/// and posts.
#[test]
#[ignore = "needs an RDMA device: run scripts/verbs-tests.sh (Soft-RoCE in a VM)"]
fn a_program_s_qp_posts_through_the_extended_api_if_made_for_it() {
    use selsig_verbs::sys;
    let f = foreign(16);
    let options = VerbsOptions {
        gid_index: std::env::var("SELSIG_GID_INDEX")
            .ok()
            .and_then(|g| g.parse().ok()),
        ..VerbsOptions::default()
    };
    // SAFETY: libibverbs' documented calls on the program's open context, each result
    // checked (`ibv_create_qp_ex` as the static inline does it).
    let ex_qps = unsafe {
        let create = sys::create_qp_ex_op(f.ctx).expect("the provider has create_qp_ex");
        [f.cqs[0], f.cqs[1]].map(|cq| {
            let mut attr: sys::ibv_qp_init_attr_ex = std::mem::zeroed();
            attr.send_cq = cq;
            attr.recv_cq = cq;
            attr.cap = sys::ibv_qp_cap {
                max_send_wr: 8,
                max_recv_wr: 1,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            };
            attr.qp_type = sys::IBV_QPT_RC;
            attr.comp_mask = sys::IBV_QP_INIT_ATTR_PD | sys::IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
            attr.pd = f.pd;
            attr.send_ops_flags = sys::IBV_QP_EX_WITH_RDMA_WRITE;
            let qp = create(f.ctx, &mut attr);
            assert!(!qp.is_null(), "ibv_create_qp_ex");
            qp
        })
    };
    {
        // SAFETY: the program's objects stay alive until the wrappers are dropped at the end
        // of this block; nothing else posts to the QPs meanwhile.
        unsafe {
            let dev = VerbsDevice::from_raw(f.ctx, &options)
                .unwrap()
                .with_post_api(PostApi::Extended)
                .unwrap();
            let cq_a = Arc::new(VerbsCq::from_raw(&dev, f.cqs[0]).unwrap());
            let cq_b = Arc::new(VerbsCq::from_raw(&dev, f.cqs[1]).unwrap());
            let e = VerbsQp::from_raw(&dev, f.qps[0], &cq_a, &cq_a)
                .err()
                .expect("refused");
            assert!(
                e.to_string().contains("IBV_QP_INIT_ATTR_SEND_OPS_FLAGS"),
                "{e}"
            );
            let a = VerbsQp::from_raw(&dev, ex_qps[0], &cq_a, &cq_a).unwrap();
            let b = VerbsQp::from_raw(&dev, ex_qps[1], &cq_b, &cq_b).unwrap();
            assert_eq!(a.post_api(), PostApi::Extended);
            let connect = ConnectOptions {
                gid_index: dev.gid_index(),
                ..ConnectOptions::default()
            };
            connect_pair(&a, &b, &connect).unwrap();
            a.post_send(&[SendWr {
                wr_id: 5,
                opcode: Opcode::RdmaWrite,
                local: Local::Empty,
                remote: RemoteAddr::default(),
                imm_data: 0,
                signaled: true,
            }])
            .unwrap();
            let wcs = poll_n(&cq_a, 1);
            assert_eq!((wcs[0].wr_id, wcs[0].status), (5, WcStatus::Success));
            // The same legacy device handle wraps the program's legacy QP.
            let legacy = dev.clone().with_post_api(PostApi::Legacy).unwrap();
            let c = VerbsQp::from_raw(&legacy, f.qps[0], &cq_a, &cq_a).unwrap();
            assert_eq!(c.post_api(), PostApi::Legacy);
        }
    }
    // SAFETY: the program's objects, destroyed once, children first.
    unsafe {
        for qp in f.qps.into_iter().chain(ex_qps) {
            assert_eq!((f.v.fns.destroy_qp)(qp), 0);
        }
        for cq in f.cqs {
            assert_eq!((f.v.fns.destroy_cq)(cq), 0);
        }
        assert_eq!((f.v.fns.dealloc_pd)(f.pd), 0);
        assert_eq!((f.v.fns.close_device)(f.ctx), 0);
    }
}
