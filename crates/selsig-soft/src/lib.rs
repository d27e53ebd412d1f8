//! selsig's software RDMA NIC: RC queue pairs, completion queues and registered memory
//! in the process, with the semantics of real hardware (mlx5 by default).
//!
//! - Work requests execute strictly in order per send queue, on one NIC thread per
//!   device, and really move bytes between registered regions.
//! - A successful work request produces a completion only when signaled (or with
//!   `sq_sig_all`); a failed one always does, then every later one is flushed with a
//!   completion of its own, signaled or not.
//! - Keys, bounds, access flags, protection domains and QP states are checked like
//!   hardware; remote access errors move the responder QP to the error state too.
//! - Send- and receive-queue slots are freed when a completion covering them is polled
//!   (mlx5) or when they execute (rxe), see [`Personality`].
//! - A send work request takes a scatter/gather list of up to the QP's `max_send_sge`
//!   entries (mlx5: as asked, up to 20; rxe: as Linux 6.1's rxe sizes it, with its inline data, and
//!   up to 32), gathered in order into a WRITE's or SEND's message or a READ's data
//!   scattered over them; every entry is checked before any byte moves.
//! - A completion queue that overruns goes to the error state (mlx5) or drops that
//!   completion (rxe, as the kernel's rxe), and raises an asynchronous event: nothing is
//!   dropped silently.
//!
//! # Example
//!
//! The seed's stream: 8 RDMA WRITEs of 64 bytes through a [`selsig::SignaledQueue`], every
//! 4th signaled; the CQ gets two completions, and each hands back four buffers, in order.
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use selsig::{Access, Buffer, ConnectOptions, Device, MemoryRegion, Outcome, Policy};
//! use selsig::{QpCaps, QpInit};
//! use selsig::{SignaledQueue, Work, connect_pair};
//! use selsig_soft::{SoftConfig, SoftDevice};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dev = SoftDevice::open(SoftConfig::default())?;
//! let pd = dev.alloc_pd()?;
//! let cq = Arc::new(dev.create_cq(16)?);
//! // RDMA WRITEs only: one receive slot (every receive would complete on this CQ too).
//! let caps = QpCaps { max_send_wr: 16, max_recv_wr: 1, ..QpCaps::default() };
//! let init = QpInit { caps, sq_sig_all: false };
//! let qp = dev.create_qp(&pd, &cq, &cq, &init)?;
//! let peer = dev.create_qp(&pd, &cq, &cq, &init)?;
//! connect_pair(&qp, &peer, &ConnectOptions::default())?;
//! let target = dev.reg_mr(&pd, 512, Access::LOCAL_WRITE | Access::REMOTE_WRITE)?;
//! let local = Buffer::new(dev.reg_mr(&pd, 512, Access::LOCAL_WRITE)?);
//! let (buffers, _) = local.split_into(8, 64).map_err(|_| "8 buffers of 64 bytes fit")?;
//!
//! let mut queue: SignaledQueue<SoftDevice, usize> =
//!     SignaledQueue::new(qp, cq, Policy::Every(4))?;
//! for (i, buf) in buffers.into_iter().enumerate() {
//!     // The buffer moves into the queue until a completion covers its WRITE.
//!     queue.post(Work::write(buf, target.remote(i * 64), i + 1))?;
//! }
//! let mut done = Vec::new();
//! queue.drain(Duration::from_secs(5), &mut done)?;
//! let users: Vec<usize> = done.iter().map(|c| c.user).collect();
//! assert_eq!(users, (1..=8).collect::<Vec<_>>());
//! assert!(done.iter().all(|c| c.outcome == Outcome::Completed && c.buffer.is_some()));
//! assert_eq!(queue.stats().cqes, 2);
//! # drop(peer);
//! # Ok(())
//! # }
//! ```
//!
//! # Memory and soundness
//!
//! Registered memory is shared by the application and the NIC thread, which may touch it
//! at any time, as a real NIC may. It is therefore made of atomic words, and every access
//! goes through atomic operations (see `mem.rs`): racing accesses give torn data, never
//! undefined behaviour. The crate's only `unsafe` code is the poster's non-temporal
//! stores of send-queue entries on x86-64 and their store fence (`ring.rs`, `Posting`):
//! `unsafe_code` is denied everywhere else.
#![deny(unsafe_code)]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]
#![warn(missing_docs)]

pub(crate) mod events;
pub(crate) mod ring;
pub(crate) mod sync;

#[cfg(not(loom))]
mod config;
#[cfg(not(loom))]
mod cq;
#[cfg(not(loom))]
mod device;
#[cfg(not(loom))]
mod engine;
#[cfg(not(loom))]
mod mem;
#[cfg(not(loom))]
mod mr;
#[cfg(not(loom))]
mod state;
mod times;

#[cfg(not(loom))]
pub use config::{MAX_CQE, MAX_QP_WR, Personality, RXE_MAX_CQE, SoftConfig};
#[cfg(not(loom))]
pub use cq::SoftCq;
#[cfg(not(loom))]
pub use device::{SoftDevice, SoftFaults, SoftMr, SoftPd, SoftQp};
