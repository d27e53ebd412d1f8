//! The settings of a software device: its personality (mlx5 or rxe) and its limits.

use std::fmt;

use selsig::PostApi;

/// How the software NIC frees send-queue slots, and sizes its queues.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Personality {
    /// Like mlx5 (rdma-core `providers/mlx5`): queues sized as libmlx5 sizes them
    /// ([`selsig::mlx5_sizing`], with the limits of
    /// [`Mlx5Limits::connectx`](selsig::mlx5_sizing::Mlx5Limits::connectx)): a send queue
    /// holds as many WQEs as fit a power of two of bytes, so `max_send_wr` reads back a
    /// power of two for a QP asked for at most 60 bytes of inline data and often another
    /// number beyond (64 bytes: a depth of 4 reads back 6), at most
    /// [`SoftConfig::max_qp_wr`] / 4; a receive queue holds a power of two, at least 4. A
    /// slot is freed only when the application polls a completion that covers it, so a
    /// queue full of unsignaled work requests never drains. A receive's slot too is freed
    /// only when its completion is polled.
    #[default]
    Mlx5,
    /// Like the kernel's Soft-RoCE (`rxe`): `max_send_wr` reads back as requested but the
    /// ring holds `2^k - 1 >= max_send_wr` work requests, and a slot is freed as soon as its
    /// work request has executed, polled or not (a receive's when the NIC completes it).
    Rxe,
}

impl Personality {
    /// The lowercase name.
    pub const fn as_str(self) -> &'static str {
        match self {
            Personality::Mlx5 => "mlx5",
            Personality::Rxe => "rxe",
        }
    }
}

impl fmt::Display for Personality {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Personality {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "mlx5" => Ok(Personality::Mlx5),
            "rxe" => Ok(Personality::Rxe),
            other => Err(format!(
                "unknown personality {other:?}: expected mlx5 or rxe"
            )),
        }
    }
}

/// The largest [`SoftConfig::max_qp_wr`]: the slots a completion's 16-bit WQE counter
/// can name (mlx5 devices report 32768).
pub const MAX_QP_WR: u32 = 1 << 16;
/// The largest `max_cqe` a device may have, what a ConnectX reports (2^22 - 1): a CQ of
/// that size fills a ring of 2^22 64-byte entries (one kept empty), 256 MiB.
pub const MAX_CQE: u32 = (1 << 22) - 1;

/// Settings of a software device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SoftConfig {
    /// The device's name.
    pub name: String,
    /// Queue semantics.
    pub personality: Personality,
    /// Largest `max_send_wr` / `max_recv_wr` (rxe); on mlx5 the largest `max_recv_wr` and
    /// the 64-byte blocks a send queue may take (each WQE takes at least 4). At most
    /// [`MAX_QP_WR`].
    pub max_qp_wr: u32,
    /// Largest CQ: at most [`MAX_CQE`].
    pub max_cqe: u32,
    /// Largest region in bytes.
    pub max_mr_size: usize,
    /// How a batch of send work requests is taken: as `ibv_post_send` takes it (those
    /// before a refused one are posted) or as `ibv_wr_complete` does (all or none: a refused
    /// batch is refused at index 0).
    pub post_api: PostApi,
}

impl Default for SoftConfig {
    fn default() -> Self {
        SoftConfig {
            name: "soft0".to_string(),
            personality: Personality::Mlx5,
            max_qp_wr: 32768,
            max_cqe: MAX_CQE,
            max_mr_size: 1 << 34,
            post_api: PostApi::Legacy,
        }
    }
}

/// The largest CQ rxe takes: `max_cqe` of the kernel's rxe (Linux 6.1's rxe0 reports
/// 32767 and refuses a CQ of more).
pub const RXE_MAX_CQE: u32 = 32767;

impl SoftConfig {
    /// The defaults with another personality (and its largest CQ: [`RXE_MAX_CQE`] for rxe).
    pub fn with_personality(personality: Personality) -> Self {
        SoftConfig {
            personality,
            max_cqe: match personality {
                Personality::Mlx5 => MAX_CQE,
                Personality::Rxe => RXE_MAX_CQE,
            },
            ..SoftConfig::default()
        }
    }
}
