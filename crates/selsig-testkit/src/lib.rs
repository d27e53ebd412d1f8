//! What selsig's tests share across crates (not published):
//!
//! - [`rxe_errors`]: what the kernel's Soft-RoCE does when requests fail, as cases and a
//!   runner generic over the provider: the soft NIC's rxe personality and the verbs
//!   provider on the real rxe0 run the same cases, so the two cannot drift.
//! - [`alloc`]: a global allocator that counts, for the tests that prove no heap
//!   allocation per work request.
//! - [`cpu`]: CPU time from `getrusage`, of the process or the calling thread.
//! - [`null`]: a memory region that is no memory, for fake providers.
//! - [`write_pair`]: two connected QPs and their buffers, for streams of RDMA WRITEs.
#![forbid(unsafe_op_in_unsafe_fn)]

pub mod alloc;
pub mod cpu;
pub mod null;
pub mod rxe_errors;
pub mod write_pair;
