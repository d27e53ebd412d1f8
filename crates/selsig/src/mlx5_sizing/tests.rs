//! The sizing checked against a table worked out by hand from rdma-core's
//! `providers/mlx5/verbs.c` (`_sq_overhead`, `mlx5_calc_send_wqe`, `mlx5_calc_sq_size`,
//! `mlx5_calc_rq_size`, `mlx5_calc_rcv_wqe`) and the segment sizes of `mlx5dv.h`: ctrl 16,
//! raddr 16, atomic 16, umr_ctrl 48, mkey_context 64, klm space 64, data 16, inline header 4.

use super::*;

/// A ConnectX as the kernel describes it to libmlx5: `log_max_qp_sz` 15 (`max_qp_wr`
/// 32768) and 512-byte send and receive WQEs (what a device that reports `max_sge` 30 has:
/// `mlx5_ib_query_device` gives `(min(max_wqe_sz_sq, 512) - 32) / 16`).
const CX: Mlx5Limits = Mlx5Limits {
    max_send_wqebb: 32768,
    max_recv_wr: 32768,
    max_sq_desc_sz: 512,
    max_rq_desc_sz: 512,
};

#[test]
fn connectx_limits_are_max_qp_wr_blocks_and_512_byte_wqes() {
    assert_eq!(Mlx5Limits::connectx(32768), CX);
}

/// Created with `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS` naming SEND, RDMA WRITE (with immediate)
/// and RDMA READ: `_sq_overhead` = max(ctrl 16, ctrl + raddr 32) = 32.
const NAMED: SendOps = SendOps::SELSIG;
/// `ibv_create_qp`: every RC operation, so `_sq_overhead` = max(16, 32, ctrl + raddr +
/// atomic 48, ctrl + umr_ctrl + mkey_context + 64 = 192) = 192.
const PLAIN: SendOps = SendOps::Default;

/// (operations, max_send_sge, max_inline_data) → (WQE bytes, max_inline_data read back).
///
/// `mlx5_calc_send_wqe`: `size = overhead + sge * 16`; `inl_size = overhead + align(4 +
/// inline, 16)` when inline > 0, else 0; WQE = align(max(size, inl_size), 64).
/// `mlx5_calc_sq_size`: read back `wqe - overhead - 4`.
#[rustfmt::skip]
const WQES: [(SendOps, u32, u32, u32, u32); 30] = [
    // Plain, 1 SGE: size 192 + 16 = 208.
    (PLAIN, 1, 0, 256, 60),    // inl 0: align(208, 64) = 256; 256 - 196 = 60
    (PLAIN, 1, 28, 256, 60),   // inl 192 + align(32, 16) = 224 → 256
    (PLAIN, 1, 60, 256, 60),   // inl 192 + 64 = 256 → 256
    (PLAIN, 1, 64, 320, 124),  // inl 192 + align(68, 16) = 272 → 320; 320 - 196 = 124
    (PLAIN, 1, 128, 384, 188), // inl 192 + align(132, 16) = 336 → 384; 384 - 196 = 188
    // Plain, 2 SGEs: size 192 + 32 = 224.
    (PLAIN, 2, 0, 256, 60),
    (PLAIN, 2, 28, 256, 60),
    (PLAIN, 2, 60, 256, 60),
    (PLAIN, 2, 64, 320, 124),
    (PLAIN, 2, 128, 384, 188),
    // Plain, 4 SGEs: size 192 + 64 = 256.
    (PLAIN, 4, 0, 256, 60),
    (PLAIN, 4, 28, 256, 60),
    (PLAIN, 4, 60, 256, 60),
    (PLAIN, 4, 64, 320, 124),
    (PLAIN, 4, 128, 384, 188),
    // Named, 1 SGE: size 32 + 16 = 48.
    (NAMED, 1, 0, 64, 28),     // align(48, 64) = 64; 64 - 36 = 28
    (NAMED, 1, 28, 64, 28),    // inl 32 + 32 = 64 → 64
    (NAMED, 1, 60, 128, 92),   // inl 32 + 64 = 96 → 128; 128 - 36 = 92
    (NAMED, 1, 64, 128, 92),   // inl 32 + 80 = 112 → 128
    (NAMED, 1, 128, 192, 156), // inl 32 + 144 = 176 → 192; 192 - 36 = 156
    // Named, 2 SGEs: size 32 + 32 = 64.
    (NAMED, 2, 0, 64, 28),
    (NAMED, 2, 28, 64, 28),
    (NAMED, 2, 60, 128, 92),
    (NAMED, 2, 64, 128, 92),
    (NAMED, 2, 128, 192, 156),
    // Named, 4 SGEs: size 32 + 64 = 96, so never below 128.
    (NAMED, 4, 0, 128, 92),
    (NAMED, 4, 28, 128, 92),
    (NAMED, 4, 60, 128, 92),
    (NAMED, 4, 64, 128, 92),
    (NAMED, 4, 128, 192, 156),
];

const DEPTHS: [u32; 11] = [1, 2, 3, 4, 5, 8, 63, 64, 100, 1000, 32768];

/// WQE bytes → `max_send_wr` read back for each of [`DEPTHS`], `None` for `EINVAL`.
///
/// `mlx5_calc_sq_size`: ring = roundup_pow_of_two(depth * wqe); refused when ring / 64 >
/// 32768 (a ring above 2 MiB); else read back ring / wqe (integer division).
#[rustfmt::skip]
const RINGS: [(u32, [Option<u32>; 11]); 6] = [
    // 64 · depth is a power of two times 64 exactly when depth is: the power of two ≥ depth.
    // 32768 · 64 = 2 MiB = 32768 blocks: just fits.
    (64, [Some(1), Some(2), Some(4), Some(4), Some(8), Some(8), Some(64), Some(64), Some(128),
          Some(1024), Some(32768)]),
    // 128 and 256 alike; 32768 · 128 = 4 MiB, 65536 blocks: refused (256: 131072).
    (128, [Some(1), Some(2), Some(4), Some(4), Some(8), Some(8), Some(64), Some(64), Some(128),
           Some(1024), None]),
    // 192: 1 → 256/192 = 1; 2 → 384 → 512/192 = 2; 3 → 576 → 1024/192 = 5; 4 → 768 → 5;
    // 5 → 960 → 5; 8 → 1536 → 2048/192 = 10; 63 → 12096 → 16384/192 = 85; 64 → 12288 → 85;
    // 100 → 19200 → 32768/192 = 170; 1000 → 192000 → 262144/192 = 1365;
    // 32768 → 6291456 → 8 MiB: refused.
    (192, [Some(1), Some(2), Some(5), Some(5), Some(5), Some(10), Some(85), Some(85), Some(170),
           Some(1365), None]),
    (256, [Some(1), Some(2), Some(4), Some(4), Some(8), Some(8), Some(64), Some(64), Some(128),
           Some(1024), None]),
    // 320: 1 → 512/320 = 1; 2 → 640 → 1024/320 = 3; 3 → 960 → 3; 4 → 1280 → 2048/320 = 6;
    // 5 → 1600 → 6; 8 → 2560 → 4096/320 = 12; 63 → 20160 → 32768/320 = 102; 64 → 20480 →
    // 102; 100 → 32000 → 102; 1000 → 320000 → 524288/320 = 1638; 32768: refused.
    (320, [Some(1), Some(3), Some(3), Some(6), Some(6), Some(12), Some(102), Some(102), Some(102),
           Some(1638), None]),
    // 384: 1 → 512/384 = 1; 2 → 768 → 1024/384 = 2; 3 → 1152 → 2048/384 = 5; 4 → 1536 → 5;
    // 5 → 1920 → 5; 8 → 3072 → 4096/384 = 10; 63 → 24192 → 32768/384 = 85; 64 → 24576 → 85;
    // 100 → 38400 → 65536/384 = 170; 1000 → 384000 → 524288/384 = 1365; 32768: refused.
    (384, [Some(1), Some(2), Some(5), Some(5), Some(5), Some(10), Some(85), Some(85), Some(170),
           Some(1365), None]),
];

fn request(max_send_wr: u32, sge: u32, inline: u32, send_ops: SendOps) -> Mlx5Request {
    Mlx5Request {
        max_send_wr,
        max_recv_wr: 1,
        max_send_sge: sge,
        max_recv_sge: 1,
        max_inline_data: inline,
        send_ops,
    }
}

#[test]
fn the_table_covers_every_operations_sge_and_inline_combination_once() {
    let mut seen = std::collections::HashSet::new();
    for &(ops, sge, inline, ..) in &WQES {
        assert!(
            seen.insert((ops, sge, inline)),
            "{ops:?} {sge} {inline} twice"
        );
    }
    for ops in [PLAIN, NAMED] {
        for sge in [1, 2, 4] {
            for inline in [0, 28, 60, 64, 128] {
                assert!(seen.contains(&(ops, sge, inline)), "{ops:?} {sge} {inline}");
            }
        }
    }
}

#[test]
fn capacities_equal_the_hand_table_for_every_depth_inline_and_sge() {
    let mut checked = 0;
    for &(ops, sge, inline, wqe, read_inline) in &WQES {
        let ring = &RINGS.iter().find(|r| r.0 == wqe).expect("a ring row").1;
        for (&depth, &expected) in DEPTHS.iter().zip(ring) {
            let got = size_rc_qp(&CX, &request(depth, sge, inline, ops));
            let at = format!("{ops:?}, sge {sge}, inline {inline}, depth {depth}");
            match expected {
                Some(max_send_wr) => {
                    let caps = got.unwrap_or_else(|e| panic!("{at}: {e}"));
                    assert_eq!(
                        (caps.send_wqe_size, caps.max_inline_data, caps.max_send_wr),
                        (wqe, read_inline, max_send_wr),
                        "{at}"
                    );
                    // The ring is a power of two blocks, and holds what was asked.
                    assert!(caps.send_wqebbs.is_power_of_two(), "{at}");
                    assert!(caps.max_send_wr >= depth, "{at}");
                    assert_eq!(caps.max_send_sge, sge, "{at}");
                }
                None => {
                    let e = got.expect_err(&at);
                    assert!(
                        matches!(e, Mlx5SizeError::SendQueueTooLarge { max: 32768, .. }),
                        "{at}: {e:?}"
                    );
                    assert_eq!(e.errno(), EINVAL);
                }
            }
            checked += 1;
        }
    }
    assert_eq!(checked, 30 * 11);
}

/// The examples of issue 47: inline 64 on a plain QP makes 320-byte WQEs.
#[test]
fn inline_64_reads_back_124_and_depths_4_8_64_read_back_6_12_102() {
    for (depth, cap) in [(4, 6), (8, 12), (64, 102)] {
        let caps = size_rc_qp(&CX, &request(depth, 1, 64, PLAIN)).unwrap();
        assert_eq!((caps.max_send_wr, caps.max_inline_data), (cap, 124));
    }
    // Up to 60 bytes the WQEs are 256 bytes: powers of two, as before.
    let caps = size_rc_qp(&CX, &request(4, 1, 60, PLAIN)).unwrap();
    assert_eq!((caps.max_send_wr, caps.max_inline_data), (4, 60));
}

#[test]
fn overheads_follow_the_operations_named() {
    let named = |rdma, atomics, memory_windows| SendOps::Named {
        rdma,
        atomics,
        memory_windows,
    };
    assert_eq!(SendOps::Default.overhead(), 192);
    assert_eq!(named(false, false, false).overhead(), 16);
    assert_eq!(named(true, false, false).overhead(), 32);
    assert_eq!(named(true, true, false).overhead(), 48);
    assert_eq!(named(false, false, true).overhead(), 192);
}

/// The largest plain send queue of 256-byte WQEs is `max_qp_wr / 4`; one more is refused.
#[test]
fn a_plain_send_queue_holds_at_most_a_quarter_of_max_qp_wr() {
    let caps = size_rc_qp(&CX, &request(8192, 1, 0, PLAIN)).unwrap();
    assert_eq!((caps.max_send_wr, caps.send_wqebbs), (8192, 32768));
    assert_eq!(
        size_rc_qp(&CX, &request(8193, 1, 0, PLAIN)),
        Err(Mlx5SizeError::SendQueueTooLarge {
            asked: 8193,
            wqe_size: 256,
            wqebbs: 65536,
            max: 32768
        })
    );
    // With inline 64 (320 bytes): 2 MiB / 320 = 6553.
    let caps = size_rc_qp(&CX, &request(6553, 1, 64, PLAIN)).unwrap();
    assert_eq!(caps.max_send_wr, 6553);
    assert!(size_rc_qp(&CX, &request(6554, 1, 64, PLAIN)).is_err());
}

#[test]
fn scatter_gather_entries_and_inline_data_beyond_the_wqe_are_refused() {
    // Plain: (512 - 192) / 16 = 20 entries.
    assert!(size_rc_qp(&CX, &request(1, 20, 0, PLAIN)).is_ok());
    assert_eq!(
        size_rc_qp(&CX, &request(1, 21, 0, PLAIN)),
        Err(Mlx5SizeError::TooManySendSge { asked: 21, max: 20 })
    );
    // Named: (512 - 32) / 16 = 30.
    assert!(size_rc_qp(&CX, &request(1, 30, 0, NAMED)).is_ok());
    assert!(matches!(
        size_rc_qp(&CX, &request(1, 31, 0, NAMED)),
        Err(Mlx5SizeError::TooManySendSge { max: 30, .. })
    ));
    // Plain inline: 192 + align(4 + 316, 16) = 512 fits and reads back 316; 317 needs 528.
    let caps = size_rc_qp(&CX, &request(1, 1, 316, PLAIN)).unwrap();
    assert_eq!((caps.send_wqe_size, caps.max_inline_data), (512, 316));
    assert_eq!(
        size_rc_qp(&CX, &request(1, 1, 317, PLAIN)),
        Err(Mlx5SizeError::TooMuchInline {
            asked: 317,
            wqe_size: 576,
            max_wqe_size: 512,
            max: 316
        })
    );
    // Named: 32 + align(4 + 476, 16) = 512; 477 needs 528.
    let caps = size_rc_qp(&CX, &request(1, 1, 476, NAMED)).unwrap();
    assert_eq!(caps.max_inline_data, 476);
    assert!(matches!(
        size_rc_qp(&CX, &request(1, 1, 477, NAMED)),
        Err(Mlx5SizeError::TooMuchInline { max: 476, .. })
    ));
    // Every refusal is EINVAL and names the capability.
    let e = size_rc_qp(&CX, &request(1, 1, 317, PLAIN)).unwrap_err();
    assert_eq!((e.errno(), e.what()), (EINVAL, "max_inline_data"));
}

/// `mlx5_calc_sq_size`'s guard against an `int` overflow, before the ring's size.
#[test]
fn a_send_depth_beyond_the_int_guard_is_refused_first() {
    let big = Mlx5Limits {
        max_send_wqebb: u32::MAX,
        ..CX
    };
    // 0x7fffffff / 512 = 4194303.
    assert_eq!(
        size_rc_qp(&big, &request(4_194_304, 1, 0, PLAIN)),
        Err(Mlx5SizeError::SendWrOverflow {
            asked: 4_194_304,
            max: 4_194_303
        })
    );
}

#[test]
fn a_queue_asked_for_nothing_gets_nothing() {
    let req = Mlx5Request {
        max_send_wr: 0,
        max_recv_wr: 0,
        max_send_sge: 1,
        max_recv_sge: 1,
        // Not sized without a send queue: read back as asked.
        max_inline_data: 1000,
        send_ops: PLAIN,
    };
    let caps = size_rc_qp(&CX, &req).unwrap();
    assert_eq!(
        (
            caps.max_send_wr,
            caps.max_recv_wr,
            caps.max_recv_sge,
            caps.max_inline_data
        ),
        (0, 0, 0, 1000)
    );
}

/// `mlx5_calc_rq_size`: roundup_pow_of_two(depth) WQEs of roundup_pow_of_two(16 · sge)
/// bytes, in at least 64 bytes: so at least 4 WRs with one entry, 2 with two, 1 with four.
#[test]
fn receive_queues_hold_a_power_of_two_and_at_least_64_bytes() {
    // (max_recv_wr, max_recv_sge) → (read back max_recv_wr, max_recv_sge).
    let table = [
        ((1, 1), (4, 1)),
        ((2, 1), (4, 1)),
        ((3, 1), (4, 1)),
        ((4, 1), (4, 1)),
        ((5, 1), (8, 1)),
        ((100, 1), (128, 1)),
        ((1, 0), (4, 1)), // max(sge, 1)
        ((1, 2), (2, 2)), // 32-byte WQEs: 64 / 32
        ((1, 3), (1, 4)), // 48 → 64: one per 64 bytes, and room for 4 entries
        ((3, 4), (4, 4)),
        ((32768, 1), (32768, 1)),
    ];
    for ((depth, sge), expected) in table {
        let req = Mlx5Request {
            max_recv_wr: depth,
            max_recv_sge: sge,
            ..request(1, 1, 0, PLAIN)
        };
        let caps = size_rc_qp(&CX, &req).unwrap();
        assert_eq!(
            (caps.max_recv_wr, caps.max_recv_sge),
            expected,
            "{depth} {sge}"
        );
    }
    let req = Mlx5Request {
        max_recv_wr: 32769,
        ..request(1, 1, 0, PLAIN)
    };
    assert_eq!(
        size_rc_qp(&CX, &req),
        Err(Mlx5SizeError::TooManyRecvWr {
            asked: 32769,
            max: 32768
        })
    );
    // 33 entries: 528 bytes > 512.
    let req = Mlx5Request {
        max_recv_sge: 33,
        ..request(1, 1, 0, PLAIN)
    };
    assert_eq!(
        size_rc_qp(&CX, &req),
        Err(Mlx5SizeError::RecvWqeTooLarge {
            size: 528,
            max: 512
        })
    );
    // 20 entries: 320 → 512, which fits.
    let req = Mlx5Request {
        max_recv_sge: 20,
        ..request(1, 1, 0, PLAIN)
    };
    assert_eq!(size_rc_qp(&CX, &req).unwrap().max_recv_sge, 32);
}
