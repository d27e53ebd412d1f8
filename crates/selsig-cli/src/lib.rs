//! The library half of the `selsig` command: what `selsig serve` and its clients say to
//! each other ([`handshake`], and [`cm_data`] over rdma_cm), apart from the command so that the handshake's fuzz target
//! (`fuzz/fuzz_targets/handshake.rs`) feeds the code the server runs.

pub mod cm_data;
pub mod handshake;
