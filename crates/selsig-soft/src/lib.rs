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
//! - A completion queue that overruns goes to the error state (mlx5) or drops that
//!   completion (rxe, as the kernel's rxe), and raises an asynchronous event: nothing is
//!   dropped silently.
//!
//! # Memory and soundness
//!
//! Registered memory is shared by the application and the NIC thread, which may touch it
//! at any time, as a real NIC may. It is therefore made of atomic words, and every access
//! goes through atomic operations (see `mem.rs`): racing accesses give torn data, never
//! undefined behaviour. The crate has no `unsafe` code.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub(crate) mod ring;
pub(crate) mod sync;

#[cfg(not(loom))]
mod device;
#[cfg(not(loom))]
mod engine;
#[cfg(not(loom))]
mod mem;
#[cfg(not(loom))]
mod mr;
#[cfg(not(loom))]
mod times;

#[cfg(not(loom))]
pub use device::{
    MAX_CQE, MAX_QP_WR, Personality, SoftConfig, SoftCq, SoftDevice, SoftMr, SoftPd, SoftQp,
};
