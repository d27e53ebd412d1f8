//! Owned ranges of registered memory.

use std::fmt;
use std::sync::Arc;

use crate::provider::{MemoryRegion, ProviderError, RemoteAddr, Sge};

/// The result of [`Buffer::split_into`]: the parts and what is left, or the buffer back.
pub type SplitInto<M> = Result<(Vec<Buffer<M>>, Buffer<M>), Buffer<M>>;

/// An owned range of a registered memory region: the unit of memory a work request uses.
///
/// Buffers of one region are disjoint by construction: a buffer is the whole region
/// ([`Buffer::new`]) or a part split off another buffer. Posting a work request moves its
/// buffer into the queue, and the buffer comes back only when the work request is
/// retired, so a buffer can never be written while the NIC may still read it. The region
/// is deregistered when its last buffer is dropped.
pub struct Buffer<M> {
    mr: Arc<M>,
    offset: usize,
    len: usize,
}

impl<M: MemoryRegion> Buffer<M> {
    /// The whole region as one buffer.
    pub fn new(mr: M) -> Self {
        let len = mr.len();
        Buffer {
            mr: Arc::new(mr),
            offset: 0,
            len,
        }
    }

    /// The address of the buffer's first byte.
    ///
    /// The region itself is not reachable through a buffer: through it any part of the
    /// region could be written, a posted sibling's among them.
    pub fn addr(&self) -> u64 {
        self.mr.addr().wrapping_add(self.offset as u64)
    }

    /// The local key of the buffer's region.
    pub fn lkey(&self) -> u32 {
        self.mr.lkey()
    }

    /// The buffer as the target of a peer's RDMA: its first byte, its region's remote key.
    pub fn remote(&self) -> RemoteAddr {
        self.mr.remote(self.offset)
    }

    /// The buffer's offset in its region.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// The buffer's length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// `true` for an empty buffer.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The scatter/gather entry covering the whole buffer.
    ///
    /// Fails when the buffer is longer than one work request can carry (`u32::MAX`).
    pub fn sge(&self) -> Result<Sge, ProviderError> {
        let len = u32::try_from(self.len).map_err(|_| ProviderError::Invalid {
            what: "buffer length",
            why: format!("{} bytes do not fit one work request", self.len),
        })?;
        Ok(self.mr.sge(self.offset, len))
    }

    /// Copies `data` into the buffer at `offset`.
    pub fn write(&mut self, offset: usize, data: &[u8]) -> Result<(), ProviderError> {
        self.check(offset, data.len())?;
        self.mr.write(self.offset + offset, data)
    }

    /// Copies the buffer's bytes at `offset` into `out`.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<(), ProviderError> {
        self.check(offset, out.len())?;
        self.mr.read(self.offset + offset, out)
    }

    /// The buffer's bytes.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0; self.len];
        // The range is the buffer itself, which lies inside its region.
        self.mr
            .read(self.offset, &mut v)
            .expect("a buffer lies inside its region");
        v
    }

    /// Fills the whole buffer with `byte`.
    pub fn fill(&mut self, byte: u8) -> Result<(), ProviderError> {
        self.mr.fill(self.offset, self.len, byte)
    }

    /// Splits the buffer in two at `mid`; `Err(self)` when `mid` is beyond its end.
    pub fn split_at(self, mid: usize) -> Result<(Buffer<M>, Buffer<M>), Buffer<M>> {
        if mid > self.len {
            return Err(self);
        }
        let tail = Buffer {
            mr: Arc::clone(&self.mr),
            offset: self.offset + mid,
            len: self.len - mid,
        };
        let head = Buffer {
            mr: self.mr,
            offset: self.offset,
            len: mid,
        };
        Ok((head, tail))
    }

    /// Splits the buffer into `count` consecutive buffers of `size` bytes; what is left
    /// over stays in the last element of the returned pair. `Err(self)` when they do not
    /// fit, or when the list of `count` buffers cannot be allocated (zero-length buffers
    /// fit any number of times).
    pub fn split_into(self, count: usize, size: usize) -> SplitInto<M> {
        match count.checked_mul(size) {
            Some(total) if total <= self.len => {}
            _ => return Err(self),
        }
        let mut parts = Vec::new();
        if parts.try_reserve_exact(count).is_err() {
            return Err(self);
        }
        let mut rest = self;
        for _ in 0..count {
            // Each split is within bounds: count * size <= len was checked above.
            let (head, tail) = match rest.split_at(size) {
                Ok(pair) => pair,
                Err(_) => unreachable!("checked above"),
            };
            parts.push(head);
            rest = tail;
        }
        Ok((parts, rest))
    }

    /// Joins two adjacent buffers of the same region back into one; `Err` gives both back
    /// when they are not adjacent (`self` directly before `next`).
    pub fn join(self, next: Buffer<M>) -> Result<Buffer<M>, (Buffer<M>, Buffer<M>)> {
        if Arc::ptr_eq(&self.mr, &next.mr) && self.offset + self.len == next.offset {
            Ok(Buffer {
                mr: self.mr,
                offset: self.offset,
                len: self.len + next.len,
            })
        } else {
            Err((self, next))
        }
    }

    fn check(&self, offset: usize, len: usize) -> Result<(), ProviderError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(ProviderError::OutOfBounds {
                offset,
                len,
                region_len: self.len,
            }),
        }
    }
}

impl<M> fmt::Debug for Buffer<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Buffer")
            .field("offset", &self.offset)
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}
