//! selsig's async driver for tokio: selective signaling on queue pairs whose owner sleeps
//! while it waits.
//!
//! An [`AsyncCq`] runs one poller task per completion queue: it sleeps on the CQ's
//! completion events (a verbs completion channel, or the soft NIC's eventfd) in tokio's
//! reactor, and routes each completion to its queue pair's [`AsyncQueue`], so that any
//! number of queues share one CQ and its pool of CQ credits, each seeing its own work
//! requests retire in posting order. An [`AsyncQueue`] is a
//! [`SignaledQueue`](selsig::SignaledQueue) whose posts wait for room, whose retired work
//! requests come as a stream ([`AsyncQueue::next`], or `futures_core::Stream`), and whose
//! confirm and drain are awaited. Every future is cancel-safe (see [`AsyncQueue`]).
//!
//! ```no_run
//! # use std::sync::Arc;
//! # use selsig::{Buffer, Device, Policy, QueueConfig, RemoteAddr, Work};
//! # use selsig_tokio::{AsyncCq, AsyncQueue};
//! # async fn f<D: Device + 'static>(cq: Arc<D::Cq>, qp: D::Qp, bufs: Vec<Buffer<D::Mr>>, to: RemoteAddr)
//! # -> Result<(), Box<dyn std::error::Error>> where D::Mr: Unpin {
//! let cq = AsyncCq::<D>::new(cq)?; // spawns its poller
//! let mut queue: AsyncQueue<D, u64> =
//!     AsyncQueue::new(&cq, qp, QueueConfig::with_policy(Policy::Every(16)))?;
//! for (i, buf) in bufs.into_iter().enumerate() {
//!     queue.post(Work::write(buf, to, i as u64)).await?; // sleeps while the queue is full
//! }
//! queue.confirm_all().await?;
//! while let Some(done) = queue.next().await {
//!     let done = done?; // in posting order, with its outcome and its buffer
//!     println!("WRITE {} {:?}", done.user, done.outcome);
//! }
//! # Ok(())
//! # }
//! ```
//!
//! The guide: docs/async.md in the repository.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]
#![warn(missing_docs)]

mod cq;
mod queue;

pub use cq::{AsyncCq, CqOptions};
pub use queue::{AsyncQueue, PostError, Retired};
