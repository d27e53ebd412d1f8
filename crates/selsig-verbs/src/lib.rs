//! selsig's libibverbs provider: real RDMA devices (mlx5 and every other RNIC rdma-core
//! supports) and the kernel's Soft-RoCE (rxe), through rdma-core's `libibverbs.so.1`,
//! loaded at run time. A program using it builds and runs everywhere; where rdma-core is
//! missing, [`VerbsDevice::open`] says what to install.
//!
//! Each verbs object is a handle holding its parent (a QP holds its PD and CQs, everything
//! holds the device context), so they are destroyed in the right order whatever order the
//! program drops them in. A failed destroy is reported on stderr; `Drop` never panics.
//!
//! Send work requests are posted with `ibv_post_send` by default; a device handle made with
//! [`VerbsDevice::with_post_api`]`(`[`PostApi::Extended`]`)` creates its queue pairs with
//! `ibv_create_qp_ex` and posts through `ibv_wr_start` ... `ibv_wr_complete`, which posts a
//! batch whole or not at all (a refused batch is refused at index 0, and a
//! [`SignaledQueue`](selsig::SignaledQueue) hands every buffer of it back).
//!
//! Registered memory is allocated by the provider (whole pages, zeroed) and accessed only
//! through [`MemoryRegion::read`] and [`MemoryRegion::write`], which copy through raw
//! pointers: the NIC may write it at any time.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks, missing_docs)]

pub mod sys;

// Connections through rdma_cm (librdmacm), for the QPs of this crate.
pub mod cm;

// One module per verbs object. Each uses only modules below it, in this order from the
// bottom: sys, error, device, pd, then mr and cq (each on pd or device), qp, and provider
// (`impl selsig::Device for VerbsDevice`, which creates every object).
mod cq;
mod device;
mod error;
mod mr;
mod pd;
mod provider;
mod qp;

pub use cq::VerbsCq;
pub use device::{PostApi, VerbsDevice, VerbsOptions, device_names};
pub use mr::VerbsMr;
pub use pd::VerbsPd;
pub use qp::VerbsQp;

#[cfg(doc)]
use selsig::MemoryRegion;
