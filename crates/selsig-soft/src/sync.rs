//! The atomics of the rings and the execution-time records: `std`'s, or `loom`'s when
//! built with `--cfg loom` to check their protocols under every interleaving (tokio's
//! `loom/mod.rs` idea).

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU64, Ordering, fence};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicU64, Ordering, fence};

/// Keeps a value on a cache line of its own, so that indices written by different threads
/// do not share a line (false sharing).
#[derive(Debug, Default)]
#[repr(align(128))]
pub(crate) struct Padded<T>(pub(crate) T);

impl<T> std::ops::Deref for Padded<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}
