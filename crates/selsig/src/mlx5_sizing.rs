//! How libmlx5 sizes an RC queue pair: the capacities `ibv_create_qp` writes back on a
//! ConnectX (mlx5) device, and the requests it refuses with `EINVAL`.
//!
//! A transcription of rdma-core's `providers/mlx5/verbs.c` for RC queue pairs without a
//! shared receive queue: `mlx5_calc_sq_size`, `mlx5_calc_send_wqe`, `sq_overhead` and
//! `_sq_overhead` for the send queue, `mlx5_calc_rq_size`, `mlx5_get_max_recv_wr` and
//! `mlx5_calc_rcv_wqe` for the receive queue (semantics 13). Pure arithmetic, here so that
//! the software NIC's mlx5 personality (which sizes its queues with it) and the verbs
//! provider (which names with it what libmlx5 refused) share one copy.
//!
//! The send queue is a ring of 64-byte blocks (`MLX5_SEND_WQE_BB`). Every work request
//! takes a WQE of the same size, set at creation by the largest request the QP may be given:
//! a control segment, the segments of the largest operation it may post (`_sq_overhead`),
//! then its scatter/gather entries or its inline data, whichever is larger, rounded up to
//! 64 bytes. The ring is `max_send_wr` such WQEs rounded up to a power of two bytes, and
//! holds as many whole WQEs as fit: with 256-byte WQEs that is a power of two, with 320-byte
//! ones it is not (a depth of 4 holds 6).
//!
//! Not modelled: QP types other than RC, shared receive queues, TSO headers, the
//! `MLX5_QP_SIG` environment variable (a 16-byte signature in every receive WQE),
//! out-of-order receive queues (`MLX5DV_QP_CREATE_OOO_DP`), and mlx5dv's own send
//! operations beyond naming memory-window ones.

use std::fmt;

/// A send WQE basic block, the unit of the send ring (`MLX5_SEND_WQE_BB`, `mlx5dv.h`).
pub const SEND_WQE_BB: u32 = 64;

// The segments' sizes, `providers/mlx5/mlx5dv.h`.
/// `struct mlx5_wqe_ctrl_seg`.
const CTRL_SEG: u32 = 16;
/// `struct mlx5_wqe_raddr_seg`.
const RADDR_SEG: u32 = 16;
/// `struct mlx5_wqe_atomic_seg`.
const ATOMIC_SEG: u32 = 16;
/// `struct mlx5_wqe_umr_ctrl_seg`.
const UMR_CTRL_SEG: u32 = 48;
/// `struct mlx5_wqe_mkey_context_seg`.
const MKEY_CONTEXT_SEG: u32 = 64;
/// `max_t(size_t, sizeof(struct mlx5_wqe_umr_klm_seg), 64)`: the KLM segment is 16 bytes.
const UMR_KLM_SPACE: u32 = 64;
/// `struct mlx5_wqe_data_seg`: one scatter/gather entry.
const DATA_SEG: u32 = 16;
/// `struct mlx5_wqe_inl_data_seg`: the byte count in front of inline data.
const INL_DATA_SEG: u32 = 4;

/// The `errno` of every refusal here: libmlx5 refuses a QP it cannot size with `EINVAL`.
pub const EINVAL: i32 = 22;

/// The operations a QP was created for, which set the space reserved in every send WQE.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum SendOps {
    /// `ibv_create_qp`, or `ibv_create_qp_ex` without `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`:
    /// `sq_overhead` assumes every RC operation, memory-window binds and local
    /// invalidations included, whose UMR segments make a 192-byte overhead. selsig's verbs
    /// provider creates its QPs this way.
    #[default]
    Default,
    /// `ibv_create_qp_ex` with `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`: only the operations
    /// named (SENDs need nothing beyond the control segment).
    Named {
        /// `IBV_QP_EX_WITH_RDMA_WRITE`, `_WITH_RDMA_WRITE_WITH_IMM` or `_WITH_RDMA_READ`.
        rdma: bool,
        /// `IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP` or `_WITH_ATOMIC_FETCH_AND_ADD`.
        atomics: bool,
        /// `IBV_QP_EX_WITH_BIND_MW` or `_WITH_LOCAL_INV` (or mlx5dv's MR operations).
        memory_windows: bool,
    },
}

impl SendOps {
    /// What selsig posts: SENDs, RDMA WRITEs and READs, no atomics, no memory windows.
    pub const SELSIG: SendOps = SendOps::Named {
        rdma: true,
        atomics: false,
        memory_windows: false,
    };

    /// The bytes of every send WQE before its data (`_sq_overhead` for `IBV_QPT_RC`, which
    /// adds no transport segment): the largest of the control segment alone and the
    /// segments of each kind of operation named.
    pub const fn overhead(self) -> u32 {
        let (rdma, atomics, memory_windows) = match self {
            SendOps::Default => (true, true, true),
            SendOps::Named {
                rdma,
                atomics,
                memory_windows,
            } => (rdma, atomics, memory_windows),
        };
        let mut size = CTRL_SEG;
        if rdma && CTRL_SEG + RADDR_SEG > size {
            size = CTRL_SEG + RADDR_SEG;
        }
        if atomics && CTRL_SEG + RADDR_SEG + ATOMIC_SEG > size {
            size = CTRL_SEG + RADDR_SEG + ATOMIC_SEG;
        }
        if memory_windows && CTRL_SEG + UMR_CTRL_SEG + MKEY_CONTEXT_SEG + UMR_KLM_SPACE > size {
            size = CTRL_SEG + UMR_CTRL_SEG + MKEY_CONTEXT_SEG + UMR_KLM_SPACE;
        }
        size
    }
}

/// The device's limits as the kernel hands them to libmlx5 (`mlx5_ib_alloc_ucontext`,
/// `drivers/infiniband/hw/mlx5/main.c`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Mlx5Limits {
    /// 64-byte blocks a send ring may have: `1 << log_max_qp_sz`, the same number
    /// `mlx5_ib_query_device` reports as `max_qp_wr`.
    pub max_send_wqebb: u32,
    /// Receive WRs a receive queue may be asked for: `1 << log_max_qp_sz` too.
    pub max_recv_wr: u32,
    /// The largest send WQE in bytes (the `max_wqe_sz_sq` capability).
    pub max_sq_desc_sz: u32,
    /// The largest receive WQE in bytes (the `max_wqe_sz_rq` capability).
    pub max_rq_desc_sz: u32,
}

/// The largest send and receive WQE, in bytes, of [`Mlx5Limits::connectx`]: what a ConnectX
/// that reports `max_sge` 30 has at least (`mlx5_ib_query_device` reports
/// `(min(max_wqe_sz_sq, 512) - 32) / 16` send entries). It allows up to 316 bytes of inline
/// data on a plain QP, and 20 send scatter/gather entries.
pub const CONNECTX_WQE_SZ: u32 = 512;

impl Mlx5Limits {
    /// A ConnectX that reports `max_qp_wr` (`ibv_query_device`): `max_qp_wr` blocks and
    /// receive WRs, as `mlx5_ib_query_device` and `mlx5_ib_alloc_ucontext` both derive them
    /// from `log_max_qp_sz`, and [`CONNECTX_WQE_SZ`]-byte WQEs.
    ///
    /// A kernel that reports a smaller `max_qp_wr` than its send rings' blocks (a change
    /// proposed in 2025, "RDMA/mlx5: Better estimate max_qp_wr to reflect WQE count", makes
    /// it the blocks over the largest WQE's) sizes larger queues than these limits say.
    pub const fn connectx(max_qp_wr: u32) -> Mlx5Limits {
        Mlx5Limits {
            max_send_wqebb: max_qp_wr,
            max_recv_wr: max_qp_wr,
            max_sq_desc_sz: CONNECTX_WQE_SZ,
            max_rq_desc_sz: CONNECTX_WQE_SZ,
        }
    }
}

/// What a QP is asked for: `ibv_qp_init_attr.cap`, and how it is created.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Mlx5Request {
    /// `cap.max_send_wr`.
    pub max_send_wr: u32,
    /// `cap.max_recv_wr`.
    pub max_recv_wr: u32,
    /// `cap.max_send_sge`.
    pub max_send_sge: u32,
    /// `cap.max_recv_sge`.
    pub max_recv_sge: u32,
    /// `cap.max_inline_data`.
    pub max_inline_data: u32,
    /// The operations named at creation.
    pub send_ops: SendOps,
}

/// What `ibv_create_qp` writes back into `cap`, with the sizes behind it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Mlx5Caps {
    /// `sq.max_post`: the WQEs the send ring holds (0 for a QP asked for none).
    pub max_send_wr: u32,
    /// `rq.max_post`: a power of two, at least 4 with one scatter/gather entry (0 for a QP
    /// asked for none).
    pub max_recv_wr: u32,
    /// As asked: libmlx5 leaves it to the kernel, which answers what it was sent.
    pub max_send_sge: u32,
    /// `rq.max_gs`: the entries the receive WQE holds (0 for a QP asked for no receives).
    pub max_recv_sge: u32,
    /// The inline data a send WQE holds (`mlx5_calc_sq_size`); as asked when the QP was
    /// asked for no send WRs (the send queue is not sized then).
    pub max_inline_data: u32,
    /// Bytes of every send WQE, a multiple of 64 (0 without a send queue).
    pub send_wqe_size: u32,
    /// 64-byte blocks of the send ring, a power of two (0 without a send queue).
    pub send_wqebbs: u32,
    /// Bytes of every receive WQE, a power of two (0 without a receive queue).
    pub recv_wqe_size: u32,
}

/// Why libmlx5 refuses to size a QP: always `EINVAL` ([`Mlx5SizeError::errno`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mlx5SizeError {
    /// More send scatter/gather entries than fit a send WQE behind its overhead
    /// (`mlx5_calc_send_wqe`, `max_gather`).
    TooManySendSge {
        /// Asked for.
        asked: u32,
        /// `(max_sq_desc_sz - overhead) / 16`.
        max: u32,
    },
    /// Inline data that makes a send WQE larger than the device's largest
    /// (`mlx5_calc_send_wqe`, `mlx5_calc_sq_size`; scatter/gather entries that fit
    /// `max_gather` never do).
    TooMuchInline {
        /// `max_inline_data` asked for.
        asked: u32,
        /// Bytes the WQE would need.
        wqe_size: u32,
        /// `max_sq_desc_sz`.
        max_wqe_size: u32,
        /// The most inline data a WQE of the device holds behind this QP's overhead.
        max: u32,
    },
    /// `max_send_wr` beyond `0x7fffffff / max_sq_desc_sz` (`mlx5_calc_sq_size`, which
    /// keeps its products in an `int`).
    SendWrOverflow {
        /// Asked for.
        asked: u32,
        /// The bound.
        max: u32,
    },
    /// A send ring of more 64-byte blocks than the device has (`mlx5_calc_sq_size`,
    /// `sq.wqe_cnt > max_send_wqebb`).
    SendQueueTooLarge {
        /// `max_send_wr` asked for.
        asked: u32,
        /// Bytes of every WQE.
        wqe_size: u32,
        /// Blocks the ring would need: `max_send_wr * wqe_size` rounded up to a power of
        /// two, over 64.
        wqebbs: u64,
        /// `max_send_wqebb`.
        max: u32,
    },
    /// More receive WRs than the device takes (`mlx5_get_max_recv_wr`).
    TooManyRecvWr {
        /// Asked for.
        asked: u32,
        /// The device's `max_recv_wr`.
        max: u32,
    },
    /// A receive WQE larger than the device's largest (`mlx5_calc_rcv_wqe`,
    /// `mlx5_calc_rq_size`): too many receive scatter/gather entries.
    RecvWqeTooLarge {
        /// Bytes the WQE would need, after rounding up to a power of two.
        size: u32,
        /// `max_rq_desc_sz`.
        max: u32,
    },
}

impl Mlx5SizeError {
    /// The `errno` libmlx5 sets: [`EINVAL`] for every one.
    pub const fn errno(&self) -> i32 {
        EINVAL
    }

    /// The capability the refusal is about.
    pub const fn what(&self) -> &'static str {
        match self {
            Mlx5SizeError::TooManySendSge { .. } => "max_send_sge",
            Mlx5SizeError::TooMuchInline { .. } => "max_inline_data",
            Mlx5SizeError::SendWrOverflow { .. } | Mlx5SizeError::SendQueueTooLarge { .. } => {
                "max_send_wr"
            }
            Mlx5SizeError::TooManyRecvWr { .. } => "max_recv_wr",
            Mlx5SizeError::RecvWqeTooLarge { .. } => "max_recv_sge",
        }
    }
}

impl fmt::Display for Mlx5SizeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Mlx5SizeError::TooManySendSge { asked, max } => write!(
                f,
                "{asked} send scatter/gather entries: a send WQE holds {max} behind its \
                 overhead (libmlx5: EINVAL)"
            ),
            Mlx5SizeError::TooMuchInline {
                asked,
                wqe_size,
                max_wqe_size,
                max,
            } => write!(
                f,
                "{asked} bytes of inline data make a send WQE of {wqe_size} bytes, the \
                 device's largest is {max_wqe_size}: up to {max} bytes (libmlx5: EINVAL)"
            ),
            Mlx5SizeError::SendWrOverflow { asked, max } => write!(
                f,
                "{asked} send work requests: libmlx5 takes at most {max} (EINVAL)"
            ),
            Mlx5SizeError::SendQueueTooLarge {
                asked,
                wqe_size,
                wqebbs,
                max,
            } => write!(
                f,
                "{asked} send work requests of {wqe_size}-byte WQEs need a ring of {wqebbs} \
                 64-byte blocks: the device has {max} (max_qp_wr; libmlx5: EINVAL)"
            ),
            Mlx5SizeError::TooManyRecvWr { asked, max } => write!(
                f,
                "{asked} receive work requests: the device takes {max} (libmlx5: EINVAL)"
            ),
            Mlx5SizeError::RecvWqeTooLarge { size, max } => write!(
                f,
                "a receive WQE of {size} bytes: the device's largest is {max} (libmlx5: EINVAL)"
            ),
        }
    }
}

impl std::error::Error for Mlx5SizeError {}

/// `align(val, a)` of rdma-core's `util/util.h`, for a power of two `a`.
const fn align(val: u64, a: u64) -> u64 {
    (val + a - 1) & !(a - 1)
}

/// The bytes of every send WQE (`mlx5_calc_send_wqe`, and the check of its result in
/// `mlx5_calc_sq_size`), with the overhead it starts with.
pub fn send_wqe_size(
    limits: &Mlx5Limits,
    max_send_sge: u32,
    max_inline_data: u32,
    send_ops: SendOps,
) -> Result<u32, Mlx5SizeError> {
    let overhead = u64::from(send_ops.overhead());
    let desc = u64::from(limits.max_sq_desc_sz);
    // `if (attr->cap.max_inline_data) inl_size = size + align(sizeof(inl seg) + inline, 16)`
    let inl_size = if max_inline_data > 0 {
        overhead + align(u64::from(INL_DATA_SEG) + u64::from(max_inline_data), 16)
    } else {
        0
    };
    // `max_gather = (max_sq_desc_sz - size) / sizeof(struct mlx5_wqe_data_seg)`, in an `int`.
    let max_gather = (i64::from(limits.max_sq_desc_sz) - overhead as i64) / i64::from(DATA_SEG);
    if i64::from(max_send_sge) > max_gather {
        return Err(Mlx5SizeError::TooManySendSge {
            asked: max_send_sge,
            max: max_gather.max(0) as u32,
        });
    }
    let size = overhead + u64::from(max_send_sge) * u64::from(DATA_SEG);
    let tot_size = size.max(inl_size);
    let wqe_size = align(tot_size, u64::from(SEND_WQE_BB));
    // `if (tot_size > ctx->max_sq_desc_sz) return -EINVAL`, then in `mlx5_calc_sq_size`
    // `if (wqe_size > ctx->max_sq_desc_sz) return -EINVAL`. `size` fits (`max_gather`), so
    // the inline data is what does not.
    if tot_size > desc || wqe_size > desc {
        let room = (desc & !u64::from(SEND_WQE_BB - 1)).saturating_sub(overhead + 4);
        return Err(Mlx5SizeError::TooMuchInline {
            asked: max_inline_data,
            wqe_size: tot_size.max(wqe_size).min(u64::from(u32::MAX)) as u32,
            max_wqe_size: limits.max_sq_desc_sz,
            max: room as u32,
        });
    }
    // At most `max_sq_desc_sz`, a `u32`.
    Ok(wqe_size as u32)
}

/// The send ring of `max_send_wr` WQEs of `wqe_size` bytes (`mlx5_calc_sq_size`): the WQEs
/// it holds (`sq.max_post`) and its 64-byte blocks (`sq.wqe_cnt`).
pub fn send_ring(
    limits: &Mlx5Limits,
    max_send_wr: u32,
    wqe_size: u32,
) -> Result<(u32, u32), Mlx5SizeError> {
    // `if (attr->cap.max_send_wr > 0x7fffffff / ctx->max_sq_desc_sz) return -EINVAL`.
    let bound = 0x7fff_ffff / limits.max_sq_desc_sz.max(1);
    if max_send_wr > bound {
        return Err(Mlx5SizeError::SendWrOverflow {
            asked: max_send_wr,
            max: bound,
        });
    }
    // `wq_size = roundup_pow_of_two(attr->cap.max_send_wr * wqe_size)`, in 64 bits here: the
    // bound above keeps the product below 2^31.
    let wq_size = (u64::from(max_send_wr) * u64::from(wqe_size)).next_power_of_two();
    // `qp->sq.wqe_cnt = wq_size / MLX5_SEND_WQE_BB; if (wqe_cnt > max_send_wqebb) EINVAL`.
    let wqebbs = wq_size / u64::from(SEND_WQE_BB);
    if wqebbs > u64::from(limits.max_send_wqebb) {
        return Err(Mlx5SizeError::SendQueueTooLarge {
            asked: max_send_wr,
            wqe_size,
            wqebbs,
            max: limits.max_send_wqebb,
        });
    }
    // `qp->sq.max_post = wq_size / wqe_size`; both fit a `u32` (wqebbs <= max_send_wqebb).
    Ok(((wq_size / u64::from(wqe_size)) as u32, wqebbs as u32))
}

/// The capacities `ibv_create_qp` writes back for an RC QP asked for `req` on a device with
/// `limits`, or the refusal (`mlx5_calc_wq_size`: the send queue, then the receive queue).
pub fn size_rc_qp(limits: &Mlx5Limits, req: &Mlx5Request) -> Result<Mlx5Caps, Mlx5SizeError> {
    // `mlx5_calc_sq_size`: `if (!attr->cap.max_send_wr) return 0;`, leaving
    // `cap.max_inline_data` as asked and `sq.max_post` 0.
    let (max_send_wr, max_inline_data, send_wqe_size, send_wqebbs) = if req.max_send_wr == 0 {
        (0, req.max_inline_data, 0, 0)
    } else {
        let wqe_size = send_wqe_size(limits, req.max_send_sge, req.max_inline_data, req.send_ops)?;
        // `qp->max_inline_data = wqe_size - sq_overhead(...) - sizeof(inl seg)`.
        let inline = wqe_size - req.send_ops.overhead() - INL_DATA_SEG;
        let (max_post, wqebbs) = send_ring(limits, req.max_send_wr, wqe_size)?;
        (max_post, inline, wqe_size, wqebbs)
    };
    // `mlx5_calc_rq_size`: `if (!attr->cap.max_recv_wr) return 0;`, `rq.max_post` and
    // `rq.max_gs` 0.
    let (max_recv_wr, max_recv_sge, recv_wqe_size) = if req.max_recv_wr == 0 {
        (0, 0, 0)
    } else {
        // `mlx5_get_max_recv_wr`.
        if req.max_recv_wr > limits.max_recv_wr {
            return Err(Mlx5SizeError::TooManyRecvWr {
                asked: req.max_recv_wr,
                max: limits.max_recv_wr,
            });
        }
        // `mlx5_calc_rcv_wqe`: `num_scatter = max(max_recv_sge, 1)`, 16 bytes each, at most
        // `max_rq_desc_sz`, rounded up to a power of two.
        let size = u64::from(req.max_recv_sge.max(1)) * u64::from(DATA_SEG);
        let rq_desc = u64::from(limits.max_rq_desc_sz);
        if size > rq_desc {
            return Err(Mlx5SizeError::RecvWqeTooLarge {
                size: size.min(u64::from(u32::MAX)) as u32,
                max: limits.max_rq_desc_sz,
            });
        }
        let wqe_size = size.next_power_of_two();
        // `mlx5_calc_rq_size`: `if (wqe_size < 0 || wqe_size > ctx->max_rq_desc_sz)`.
        if wqe_size > rq_desc {
            return Err(Mlx5SizeError::RecvWqeTooLarge {
                size: wqe_size as u32,
                max: limits.max_rq_desc_sz,
            });
        }
        // `wq_size = roundup_pow_of_two(max_recv_wr) * wqe_size; max(wq_size, 64)`;
        // `rq.wqe_cnt = wq_size / wqe_size`, and `rq.max_post = 1 << ilog32(wqe_cnt - 1)`,
        // which is `wqe_cnt` itself, a power of two.
        let wq_size =
            (u64::from(req.max_recv_wr).next_power_of_two() * wqe_size).max(u64::from(SEND_WQE_BB));
        let wqe_cnt = wq_size / wqe_size;
        // `rq.max_gs = wqe_size / sizeof(struct mlx5_wqe_data_seg)`.
        (
            wqe_cnt as u32,
            (wqe_size / u64::from(DATA_SEG)) as u32,
            wqe_size as u32,
        )
    };
    Ok(Mlx5Caps {
        max_send_wr,
        max_recv_wr,
        max_send_sge: req.max_send_sge,
        max_recv_sge,
        max_inline_data,
        send_wqe_size,
        send_wqebbs,
        recv_wqe_size,
    })
}

#[cfg(test)]
mod tests;
