//! Scatter/gather lists on the software NIC: gathered WRITEs and SENDs, scattered READs,
//! the limit of `max_send_sge` at the post, a bad entry, empty lists, and lists of buffers
//! through `SignaledQueue` (`Work::list`), on both personalities.

use std::sync::Arc;
use std::time::{Duration, Instant};

use selsig::{
    Access, Buffer, CompletionQueue, ConnectOptions, Device, Local, MemoryRegion, Opcode, Outcome,
    Policy, PostFailure, QpCaps, QpInit, QueuePair, RecvWr, RemoteAddr, SendWr, Sge, SignaledQueue,
    WcOpcode, WcStatus, Work, WorkCompletion, connect_pair,
};
use selsig_soft::{Personality, SoftConfig, SoftCq, SoftDevice, SoftMr, SoftPd, SoftQp};

const WAIT: Duration = Duration::from_secs(10);
const BOTH: [Personality; 2] = [Personality::Mlx5, Personality::Rxe];
const ENOMEM: i32 = 12;
const EINVAL: i32 = 22;

/// Two connected QPs of one device, `a` sending to `b`, each asked for `max_send_sge`
/// entries; `local` is `a`'s region, `remote` `b`'s (both zeroed).
struct Pair {
    dev: SoftDevice,
    pd: SoftPd,
    a: SoftQp,
    b: SoftQp,
    cq_a: Arc<SoftCq>,
    cq_b: Arc<SoftCq>,
    local: SoftMr,
    remote: SoftMr,
}

const REGION: usize = 8192;

fn pair(personality: Personality, max_send_sge: u32) -> Pair {
    pair_with(personality, max_send_sge, 64, &ConnectOptions::default())
}

fn pair_with(
    personality: Personality,
    max_send_sge: u32,
    send_wr: u32,
    options: &ConnectOptions,
) -> Pair {
    let dev = SoftDevice::open(SoftConfig::with_personality(personality)).unwrap();
    let pd = dev.alloc_pd().unwrap();
    let cq_a = Arc::new(dev.create_cq(256).unwrap());
    let cq_b = Arc::new(dev.create_cq(256).unwrap());
    let init = QpInit {
        caps: QpCaps {
            max_send_wr: send_wr,
            max_recv_wr: 16,
            max_send_sge,
            ..QpCaps::default()
        },
        sq_sig_all: false,
    };
    let a = dev.create_qp(&pd, &cq_a, &cq_a, &init).unwrap();
    let b = dev.create_qp(&pd, &cq_b, &cq_b, &init).unwrap();
    connect_pair(&a, &b, options).unwrap();
    let local = dev.reg_mr(&pd, REGION, Access::LOCAL_WRITE).unwrap();
    let remote = dev
        .reg_mr(
            &pd,
            REGION,
            Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
        )
        .unwrap();
    Pair {
        dev,
        pd,
        a,
        b,
        cq_a,
        cq_b,
        local,
        remote,
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

fn assert_no_more(cq: &SoftCq) {
    std::thread::sleep(Duration::from_millis(30));
    let mut buf = [WorkCompletion::new(0, WcStatus::Success, 0); 4];
    assert_eq!(cq.poll(&mut buf).unwrap(), 0, "unexpected {:?}", buf[0]);
}

fn statuses(wcs: &[WorkCompletion]) -> Vec<(u64, WcStatus)> {
    wcs.iter().map(|w| (w.wr_id, w.status)).collect()
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed) | 1)
        .collect()
}

fn bytes(mr: &SoftMr, off: usize, len: usize) -> Vec<u8> {
    let mut out = vec![0; len];
    mr.read(off, &mut out).unwrap();
    out
}

fn wr<'a>(wr_id: u64, opcode: Opcode, local: Local<'a>, remote: RemoteAddr) -> SendWr<'a> {
    SendWr {
        wr_id,
        opcode,
        local,
        remote,
        imm_data: 0,
        signaled: true,
    }
}

/// Three entries of `a`'s region, of 5, 7 and 11 bytes at offsets 0, 100 and 300, filled
/// with patterns (the other bytes stay 0): the list, and the message they make.
fn three_entries(p: &Pair) -> ([Sge; 3], Vec<u8>) {
    let mut message = Vec::new();
    let mut list = [Sge::default(); 3];
    for (k, (off, len)) in [(0usize, 5usize), (100, 7), (300, 11)]
        .into_iter()
        .enumerate()
    {
        let data = pattern(k as u8 * 50, len);
        p.local.write(off, &data).unwrap();
        message.extend_from_slice(&data);
        list[k] = p.local.sge(off, len as u32);
    }
    (list, message)
}

/// A QP's `max_send_sge`: mlx5 as asked (at least 1), up to what fits a 512-byte WQE (20);
/// rxe `max(16 × asked, max_inline_data) / 16`, its `max_inline_data` that many bytes
/// (Linux 6.1's `rxe_qp_init_req`), up to `RXE_MAX_SGE` (32).
#[test]
fn max_send_sge_reads_back_as_each_driver_sizes_it() {
    let caps = |personality, max_send_sge| {
        let dev = SoftDevice::open(SoftConfig::with_personality(personality)).unwrap();
        let pd = dev.alloc_pd().unwrap();
        let cq = dev.create_cq(64).unwrap();
        let init = QpInit {
            caps: QpCaps {
                max_send_wr: 8,
                max_recv_wr: 1,
                max_send_sge,
                ..QpCaps::default()
            },
            sq_sig_all: false,
        };
        dev.create_qp(&pd, &cq, &cq, &init)
            .map(|qp| (qp.caps().max_send_sge, qp.caps().max_inline_data))
            .map_err(|e| e.to_string())
    };
    // 192 bytes of overhead (`SendOps::Default`): up to 4 entries, 256-byte WQEs and
    // 60 bytes of inline data; 5 make 320-byte WQEs (124 bytes inline); 20, 512 bytes.
    assert_eq!(caps(Personality::Mlx5, 0), Ok((1, 60)));
    assert_eq!(caps(Personality::Mlx5, 3), Ok((3, 60)));
    assert_eq!(caps(Personality::Mlx5, 5), Ok((5, 124)));
    assert_eq!(caps(Personality::Mlx5, 20), Ok((20, 316)));
    let e = caps(Personality::Mlx5, 21).unwrap_err();
    assert!(e.contains("max_send_sge"), "{e}");
    assert_eq!(caps(Personality::Rxe, 0), Ok((1, 16)));
    assert_eq!(caps(Personality::Rxe, 3), Ok((3, 48)));
    assert_eq!(caps(Personality::Rxe, 5), Ok((5, 80)));
    assert_eq!(caps(Personality::Rxe, 32), Ok((32, 512)));
    let e = caps(Personality::Rxe, 33).unwrap_err();
    assert!(e.contains("max_send_sge") && e.contains("32"), "{e}");
}

/// A WRITE of three entries places their concatenation, and not a byte around it; so
/// does a WRITE with immediate data whose entries cross the packets of a 256-byte path
/// MTU, with the receive its last packet takes.
#[test]
fn a_gather_write_places_the_concatenation() {
    for personality in BOTH {
        let p = pair(personality, 3);
        let (list, message) = three_entries(&p);
        p.a.post_send(&[wr(
            1,
            Opcode::RdmaWrite,
            Local::Sges(&list),
            p.remote.remote(64),
        )])
        .unwrap();
        let wc = poll_n(&p.cq_a, 1)[0];
        // (`byte_len` is not a WRITE's.)
        assert_eq!(
            (wc.wr_id, wc.status, wc.opcode),
            (1, WcStatus::Success, Some(WcOpcode::RdmaWrite)),
            "{personality:?}"
        );
        let mut expected = vec![0u8; 64];
        expected.extend_from_slice(&message);
        expected.resize(128, 0);
        assert_eq!(bytes(&p.remote, 0, 128), expected, "{personality:?}");
    }
    for personality in BOTH {
        let options = ConnectOptions {
            mtu: 256,
            ..ConnectOptions::default()
        };
        let p = pair_with(personality, 3, 64, &options);
        let (lens, offs) = ([300usize, 1, 400], [1000usize, 3000, 5000]);
        let mut message = Vec::new();
        let mut list = [Sge::default(); 3];
        for k in 0..3 {
            let data = pattern(k as u8 + 7, lens[k]);
            p.local.write(offs[k], &data).unwrap();
            message.extend_from_slice(&data);
            list[k] = p.local.sge(offs[k], lens[k] as u32);
        }
        p.b.post_recv(&[RecvWr {
            wr_id: 40,
            sge: None,
        }])
        .unwrap();
        let mut w = wr(
            2,
            Opcode::RdmaWriteWithImm,
            Local::Sges(&list),
            p.remote.remote(3),
        );
        w.imm_data = 0xabcd;
        p.a.post_send(&[w]).unwrap();
        assert_eq!(
            statuses(&poll_n(&p.cq_a, 1)),
            [(2, WcStatus::Success)],
            "{personality:?}"
        );
        let rc = poll_n(&p.cq_b, 1)[0];
        assert_eq!(
            (rc.wr_id, rc.status, rc.byte_len, rc.imm_data),
            (40, WcStatus::Success, 701, Some(0xabcd)),
            "{personality:?}"
        );
        let mut expected = vec![0u8; 3];
        expected.extend_from_slice(&message);
        expected.resize(1024, 0);
        assert_eq!(bytes(&p.remote, 0, 1024), expected, "{personality:?}");
    }
}

/// A READ of 23 remote bytes into three entries splits them 5, 7 and 11, in order.
#[test]
fn a_scatter_read_splits_the_remote_bytes_over_the_entries() {
    for personality in BOTH {
        let p = pair(personality, 3);
        let source = pattern(9, 23);
        p.remote.write(40, &source).unwrap();
        let list = [p.local.sge(0, 5), p.local.sge(100, 7), p.local.sge(300, 11)];
        p.a.post_send(&[wr(
            1,
            Opcode::RdmaRead,
            Local::Sges(&list),
            p.remote.remote(40),
        )])
        .unwrap();
        let wc = poll_n(&p.cq_a, 1)[0];
        assert_eq!(
            (wc.status, wc.opcode, wc.byte_len),
            (WcStatus::Success, Some(WcOpcode::RdmaRead), 23),
            "{personality:?}"
        );
        let all = bytes(&p.local, 0, 400);
        let mut expected = vec![0u8; 400];
        expected[..5].copy_from_slice(&source[..5]);
        expected[100..107].copy_from_slice(&source[5..12]);
        expected[300..311].copy_from_slice(&source[12..]);
        assert_eq!(all, expected, "{personality:?}");
    }
}

/// A SEND (and a SEND with immediate data) of three entries lands whole in the receive.
#[test]
fn a_gather_send_lands_in_a_receive() {
    for personality in BOTH {
        for opcode in [Opcode::Send, Opcode::SendWithImm] {
            let p = pair(personality, 3);
            let (list, message) = three_entries(&p);
            p.b.post_recv(&[RecvWr {
                wr_id: 77,
                sge: Some(p.remote.sge(10, 64)),
            }])
            .unwrap();
            let mut w = wr(1, opcode, Local::Sges(&list), RemoteAddr::default());
            w.imm_data = 5;
            p.a.post_send(&[w]).unwrap();
            assert_eq!(
                statuses(&poll_n(&p.cq_a, 1)),
                [(1, WcStatus::Success)],
                "{personality:?} {opcode:?}"
            );
            let rc = poll_n(&p.cq_b, 1)[0];
            assert_eq!(
                (rc.wr_id, rc.status, rc.byte_len),
                (77, WcStatus::Success, 23),
                "{personality:?} {opcode:?}"
            );
            assert_eq!(
                rc.imm_data,
                (opcode == Opcode::SendWithImm).then_some(5),
                "{personality:?}"
            );
            let mut expected = vec![0u8; 10];
            expected.extend_from_slice(&message);
            expected.resize(128, 0);
            assert_eq!(
                bytes(&p.remote, 0, 128),
                expected,
                "{personality:?} {opcode:?}"
            );
        }
    }
}

/// A list longer than the QP's `max_send_sge` is refused at the post, naming the count and
/// the limit, with libmlx5's `ENOMEM` (`_mlx5_post_send`) or rxe's `EINVAL`
/// (`validate_send_wr`); not a full queue. The work request before it is posted, it and
/// those after are not.
#[test]
fn a_list_longer_than_max_send_sge_is_refused_at_the_post() {
    let errno = |e: &selsig::PostWrError| e.source.as_ref().and_then(|s| s.raw_os_error());
    for (personality, max, code) in [
        (Personality::Mlx5, 3, ENOMEM),
        (Personality::Rxe, 3, EINVAL),
    ] {
        let p = pair(personality, 3);
        assert_eq!(p.a.caps().max_send_sge, max, "{personality:?}");
        p.local.write(0, &pattern(1, 64)).unwrap();
        let long: Vec<Sge> = (0..max as usize + 1)
            .map(|k| p.local.sge(k * 8, 8))
            .collect();
        let just: Vec<Sge> = long[..max as usize].to_vec();
        let err =
            p.a.post_send(&[
                wr(1, Opcode::RdmaWrite, Local::Sges(&just), p.remote.remote(0)),
                wr(
                    2,
                    Opcode::RdmaWrite,
                    Local::Sges(&long),
                    p.remote.remote(1000),
                ),
                wr(
                    3,
                    Opcode::RdmaWrite,
                    Local::Sge(p.local.sge(0, 8)),
                    p.remote.remote(2000),
                ),
            ])
            .unwrap_err();
        assert_eq!(
            (err.index, err.failure, errno(&err)),
            (
                1,
                PostFailure::TooManySges {
                    count: max as usize + 1,
                    max
                },
                Some(code)
            ),
            "{personality:?}"
        );
        assert!(!err.is_full(), "{personality:?}");
        assert!(err.to_string().contains("max_send_sge"), "{err}");
        assert_eq!(
            statuses(&poll_n(&p.cq_a, 1)),
            [(1, WcStatus::Success)],
            "{personality:?}"
        );
        assert_no_more(&p.cq_a);
        assert_eq!(
            bytes(&p.remote, 0, 8 * max as usize),
            pattern(1, 64)[..8 * max as usize],
            "{personality:?}"
        );
        assert_eq!(
            bytes(&p.remote, 1000, 1100),
            vec![0; 1100],
            "{personality:?}"
        );
        // The queue goes on: the slot was not taken.
        p.a.post_send(&[wr(
            4,
            Opcode::RdmaWrite,
            Local::Sges(&just),
            p.remote.remote(3000),
        )])
        .unwrap();
        assert_eq!(statuses(&poll_n(&p.cq_a, 1)), [(4, WcStatus::Success)]);
    }
}

/// What a bad third entry gives, by personality: the status a bad single entry gets
/// (`local_checks_give_local_protection_errors` and the rxe conformance cases): a source
/// that cannot be read is `LOC_PROT_ERR` on mlx5 and `LOC_QP_OP_ERR` on rxe, a READ's
/// destination that cannot be written `LOC_PROT_ERR` on both.
fn bad_entry_status(personality: Personality, opcode: Opcode) -> WcStatus {
    match (personality, opcode) {
        (Personality::Rxe, Opcode::RdmaWrite | Opcode::Send) => WcStatus::LocQpOpErr,
        _ => WcStatus::LocProtErr,
    }
}

/// A third entry with a bad key (or out of its region, or of another protection domain,
/// or, for a READ, without `LOCAL_WRITE`) fails its work request with the status a bad
/// single entry gets; nothing of the message is placed (the first two entries lie in the
/// first packet, where rxe too places nothing), no receive is taken, and the work requests
/// after it are flushed.
#[test]
fn a_bad_third_entry_fails_the_work_request_and_places_nothing() {
    for personality in BOTH {
        for opcode in [Opcode::RdmaWrite, Opcode::Send, Opcode::RdmaRead] {
            for fault in ["bad lkey", "out of bounds", "other pd", "no local write"] {
                if fault == "no local write" && opcode != Opcode::RdmaRead {
                    continue;
                }
                let what = format!("{personality:?} {opcode:?} {fault}");
                let p = pair(personality, 3);
                let (mut list, _) = three_entries(&p);
                let other_pd = p.dev.alloc_pd().unwrap();
                let elsewhere = match fault {
                    "other pd" => Some(p.dev.reg_mr(&other_pd, 64, Access::LOCAL_WRITE)),
                    "no local write" => Some(p.dev.reg_mr(&p.pd, 64, Access::REMOTE_READ)),
                    _ => None,
                }
                .map(Result::unwrap);
                list[2] = match (fault, &elsewhere) {
                    ("bad lkey", _) => Sge {
                        lkey: list[2].lkey ^ 1,
                        ..list[2]
                    },
                    ("out of bounds", _) => p.local.sge(REGION - 4, 11),
                    (_, Some(mr)) => mr.sge(0, 11),
                    _ => unreachable!(),
                };
                let remote_bytes = pattern(200, 64);
                p.remote.write(0, &remote_bytes).unwrap();
                let local_before = bytes(&p.local, 0, REGION);
                p.b.post_recv(&[RecvWr {
                    wr_id: 77,
                    sge: Some(p.remote.sge(1000, 64)),
                }])
                .unwrap();
                let target = match opcode {
                    Opcode::Send => RemoteAddr::default(),
                    _ => p.remote.remote(0),
                };
                let mut first = wr(1, opcode, Local::Sges(&list), target);
                first.signaled = false;
                let follow = |wr_id, off| {
                    wr(
                        wr_id,
                        Opcode::RdmaWrite,
                        Local::Sge(p.local.sge(0, 5)),
                        p.remote.remote(off),
                    )
                };
                p.a.post_send(&[first, follow(2, 2000), follow(3, 3000)])
                    .unwrap();
                assert_eq!(
                    statuses(&poll_n(&p.cq_a, 3)),
                    [
                        (1, bad_entry_status(personality, opcode)),
                        (2, WcStatus::WrFlushErr),
                        (3, WcStatus::WrFlushErr)
                    ],
                    "{what}"
                );
                assert_no_more(&p.cq_a);
                // The receive was not taken (nor flushed: the responder is fine).
                assert_no_more(&p.cq_b);
                let mut expected = remote_bytes.clone();
                expected.resize(REGION, 0);
                assert_eq!(bytes(&p.remote, 0, REGION), expected, "{what}");
                assert_eq!(bytes(&p.local, 0, REGION), local_before, "{what}");
            }
        }
    }
}

/// An empty list is a zero-length operation: no key is checked (the remote key here is
/// none), nothing moves, a SEND's receive completes with 0 bytes. So is a list of empty
/// entries, whatever their keys (libmlx5 leaves empty entries out of the WQE, rxe looks up
/// no region for them).
#[test]
fn an_empty_list_is_a_zero_length_operation() {
    for personality in BOTH {
        let p = pair(personality, 3);
        let nowhere = RemoteAddr {
            addr: 0x1234,
            rkey: 0xdead_beef,
        };
        let empties = [
            Sge {
                addr: 1,
                length: 0,
                lkey: 0xdead_beef,
            },
            Sge {
                addr: 2,
                length: 0,
                lkey: 7,
            },
        ];
        p.b.post_recv(&[
            RecvWr {
                wr_id: 70,
                sge: Some(p.remote.sge(0, 8)),
            },
            RecvWr {
                wr_id: 71,
                sge: Some(p.remote.sge(0, 8)),
            },
        ])
        .unwrap();
        p.a.post_send(&[
            wr(1, Opcode::RdmaWrite, Local::Sges(&[]), nowhere),
            wr(2, Opcode::RdmaRead, Local::Sges(&[]), nowhere),
            wr(3, Opcode::Send, Local::Sges(&[]), nowhere),
            wr(4, Opcode::RdmaWrite, Local::Sges(&empties), nowhere),
            wr(5, Opcode::RdmaRead, Local::Sges(&empties), nowhere),
            wr(6, Opcode::Send, Local::Sges(&empties), nowhere),
        ])
        .unwrap();
        let wcs = poll_n(&p.cq_a, 6);
        assert_eq!(
            wcs.iter()
                .map(|w| (w.wr_id, w.status, w.byte_len))
                .collect::<Vec<_>>(),
            (1..=6)
                .map(|id| (id, WcStatus::Success, 0))
                .collect::<Vec<_>>(),
            "{personality:?}"
        );
        let rcs = poll_n(&p.cq_b, 2);
        assert_eq!(
            rcs.iter()
                .map(|w| (w.wr_id, w.status, w.byte_len))
                .collect::<Vec<_>>(),
            [(70, WcStatus::Success, 0), (71, WcStatus::Success, 0)],
            "{personality:?}"
        );
        assert_eq!(bytes(&p.remote, 0, 64), vec![0; 64], "{personality:?}");
    }
}

/// Buffers of three sizes over one region: `count` lists of three, filled with patterns.
fn lists(p: &Pair, count: usize) -> Vec<Vec<Buffer<SoftMr>>> {
    let region = p
        .dev
        .reg_mr(&p.pd, count * 3 * 32, Access::LOCAL_WRITE)
        .unwrap();
    let (parts, _) = Buffer::new(region).split_into(count * 3, 32).ok().unwrap();
    let mut parts = parts.into_iter();
    (0..count)
        .map(|n| {
            [5usize, 7, 11]
                .iter()
                .enumerate()
                .map(|(k, &len)| {
                    let (mut b, _) = parts.next().unwrap().split_at(len).ok().unwrap();
                    b.write(0, &pattern((n * 3 + k) as u8, len)).unwrap();
                    b
                })
                .collect()
        })
        .collect()
}

/// Through a `SignaledQueue`, lists of buffers (`Work::list`) are gathered into WRITEs
/// and come back in `Completion::list`, in their order, on `post` and on both paths of
/// `post_batch` (a short batch staged for `post_send`, one of `post_send_iter_min` or more
/// handed to `post_send_iter`); each WRITE placed its concatenation.
#[test]
fn lists_of_buffers_come_back_in_order_through_the_queue() {
    for personality in BOTH {
        let p = pair_with(personality, 3, 128, &ConnectOptions::default());
        let iter_min = p.a.post_send_iter_min();
        assert!(iter_min > 4 && iter_min <= 100, "{iter_min}");
        let total = 1 + 4 + iter_min;
        let all = lists(&p, total);
        // Each list's addresses, and the message it makes.
        let shapes: Vec<(Vec<u64>, Vec<u8>)> = all
            .iter()
            .map(|l| {
                (
                    l.iter().map(Buffer::addr).collect(),
                    l.iter().flat_map(Buffer::to_vec).collect(),
                )
            })
            .collect();
        let Pair {
            a, cq_a, remote, ..
        } = p;
        let mut q: SignaledQueue<SoftDevice, usize> =
            SignaledQueue::new(a, cq_a, Policy::Every(4)).unwrap();
        let work = |n: usize, list: Vec<Buffer<SoftMr>>| {
            Work::list(Opcode::RdmaWrite, list, remote.remote(n * 32), n)
        };
        let mut all = all.into_iter().enumerate();
        // `post`.
        let (n, list) = all.next().unwrap();
        q.post(work(n, list)).unwrap();
        // A short batch, then a long one.
        for len in [4, iter_min] {
            let mut batch = all.by_ref().take(len).map(|(n, l)| work(n, l));
            assert_eq!(q.post_batch(&mut batch).unwrap(), len, "{personality:?}");
            assert!(batch.next().is_none());
        }
        q.confirm_all().unwrap();
        let mut done = Vec::new();
        let start = Instant::now();
        while done.len() < total {
            q.poll(&mut done).unwrap();
            assert!(start.elapsed() < WAIT, "{} of {total}", done.len());
        }
        for (n, c) in done.iter().enumerate() {
            assert_eq!(
                (c.user, c.outcome),
                (n, Outcome::Completed),
                "{personality:?}"
            );
            assert!(c.buffer.is_none());
            let addrs: Vec<u64> = c
                .list
                .iter()
                .flat_map(|l| l.iter())
                .map(Buffer::addr)
                .collect();
            assert_eq!(addrs, shapes[n].0, "{personality:?}: list {n} in order");
            assert_eq!(
                bytes(&remote, n * 32, 32),
                [shapes[n].1.clone(), vec![0; 9]].concat(),
                "{personality:?}: WRITE {n}"
            );
        }
    }
}

/// Through a `SignaledQueue`, a READ scatters into a list of buffers, which come back
/// holding the remote bytes; a list with a bad entry fails its work request, whose buffers
/// come back too, and the queue's later work requests are flushed.
#[test]
fn a_queue_reads_into_a_list_and_hands_back_a_failed_list() {
    for personality in BOTH {
        let p = pair(personality, 3);
        let source = pattern(3, 23);
        p.remote.write(0, &source).unwrap();
        let mut all = lists(&p, 3).into_iter();
        let Pair {
            dev,
            pd,
            a,
            cq_a,
            remote,
            ..
        } = p;
        let mut q: SignaledQueue<SoftDevice, u32> =
            SignaledQueue::new(a, cq_a, Policy::Every(4)).unwrap();
        let list = all.next().unwrap();
        q.post(Work::list(Opcode::RdmaRead, list, remote.remote(0), 1))
            .unwrap();
        // A list whose last buffer's region cannot be written by a READ.
        let mut bad = all.next().unwrap();
        let read_only = dev.reg_mr(&pd, 16, Access::REMOTE_READ).unwrap();
        bad[2] = Buffer::new(read_only);
        q.post(Work::list(Opcode::RdmaRead, bad, remote.remote(0), 2))
            .unwrap();
        let list = all.next().unwrap();
        q.post(Work::list(Opcode::RdmaWrite, list, remote.remote(100), 3))
            .unwrap();
        q.confirm_all().ok();
        let mut done = Vec::new();
        let start = Instant::now();
        while done.len() < 3 {
            let _ = q.poll(&mut done);
            assert!(start.elapsed() < WAIT, "{} of 3", done.len());
        }
        let got: Vec<(u32, Outcome, usize)> = done
            .iter()
            .map(|c| (c.user, c.outcome, c.list.as_ref().map_or(0, |l| l.len())))
            .collect();
        assert_eq!(
            got,
            [
                (1, Outcome::Completed, 3),
                (2, Outcome::Failed(WcStatus::LocProtErr), 3),
                (3, Outcome::Flushed, 3)
            ],
            "{personality:?}"
        );
        let read: Vec<u8> = done[0]
            .list
            .iter()
            .flat_map(|l| l.iter())
            .flat_map(Buffer::to_vec)
            .collect();
        assert_eq!(read, source, "{personality:?}");
        assert_eq!(bytes(&remote, 100, 32), vec![0; 32], "{personality:?}");
    }
}

/// Through a `SignaledQueue`, a list longer than the QP's `max_send_sge` (read back at
/// creation: 3 asked, 3 on both) is refused before the post with the limit
/// named, its buffers handed back in order; a raw list (`Work::raw_list`) of memory the
/// queue does not hold is gathered as a list of buffers is.
#[test]
fn a_queue_refuses_a_list_beyond_max_send_sge_and_takes_raw_lists() {
    for (personality, max) in [(Personality::Mlx5, 3usize), (Personality::Rxe, 3)] {
        let p = pair(personality, 3);
        let mut long: Vec<Buffer<SoftMr>> = lists(&p, 2).into_iter().flatten().collect();
        long.truncate(max + 1);
        let addrs: Vec<u64> = long.iter().map(Buffer::addr).collect();
        let (list, message) = three_entries(&p);
        let Pair {
            a, cq_a, remote, ..
        } = p;
        let mut q: SignaledQueue<SoftDevice, u32> =
            SignaledQueue::new(a, cq_a, Policy::Every(4)).unwrap();
        let Err(selsig::QueuePostError::Invalid { work, source }) =
            q.post(Work::list(Opcode::RdmaWrite, long, remote.remote(0), 1))
        else {
            panic!("{personality:?}: a list of {} is refused", max + 1);
        };
        let why = source.to_string();
        assert!(
            why.contains(&format!("{} entries", max + 1))
                && why.contains(&format!("max_send_sge of {max}")),
            "{personality:?}: {why}"
        );
        let back: Vec<u64> = work
            .list
            .iter()
            .flat_map(|l| l.iter())
            .map(Buffer::addr)
            .collect();
        assert_eq!(
            back, addrs,
            "{personality:?}: the buffers come back in order"
        );
        assert_eq!(bytes(&remote, 0, 64), vec![0; 64], "{personality:?}");
        // A raw list.
        q.post(
            Work::raw_list(Opcode::RdmaWrite, &list, remote.remote(8), 2)
                .signal(selsig::Signal::Force),
        )
        .unwrap();
        let mut done = Vec::new();
        let start = Instant::now();
        while done.is_empty() {
            q.poll(&mut done).unwrap();
            assert!(start.elapsed() < WAIT, "{personality:?}");
        }
        assert_eq!(
            (
                done[0].user,
                done[0].outcome,
                done[0].list.as_ref().map_or(0, |l| l.len())
            ),
            (2, Outcome::Completed, 0),
            "{personality:?}"
        );
        let mut expected = vec![0u8; 8];
        expected.extend_from_slice(&message);
        expected.resize(64, 0);
        assert_eq!(bytes(&remote, 0, 64), expected, "{personality:?}");
    }
}
