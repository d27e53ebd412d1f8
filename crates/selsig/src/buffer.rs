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

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::provider::Access;

    /// A region in a vector, at address 0x1000, keys 7 (local) and 9 (remote).
    #[derive(Debug)]
    struct Mem(Mutex<Vec<u8>>);

    impl Mem {
        fn buffer(len: usize) -> Buffer<Mem> {
            Buffer::new(Mem(Mutex::new(vec![0; len])))
        }
    }

    impl MemoryRegion for Mem {
        fn addr(&self) -> u64 {
            0x1000
        }
        fn len(&self) -> usize {
            self.0.lock().unwrap().len()
        }
        fn lkey(&self) -> u32 {
            7
        }
        fn rkey(&self) -> u32 {
            9
        }
        fn access(&self) -> Access {
            Access::LOCAL_WRITE
        }
        fn write(&self, offset: usize, data: &[u8]) -> Result<(), ProviderError> {
            let mut m = self.0.lock().unwrap();
            let range = bounds(offset, data.len(), m.len())?;
            m[range].copy_from_slice(data);
            Ok(())
        }
        fn read(&self, offset: usize, buf: &mut [u8]) -> Result<(), ProviderError> {
            let m = self.0.lock().unwrap();
            buf.copy_from_slice(&m[bounds(offset, buf.len(), m.len())?]);
            Ok(())
        }
    }

    fn bounds(
        offset: usize,
        len: usize,
        region_len: usize,
    ) -> Result<std::ops::Range<usize>, ProviderError> {
        match offset.checked_add(len) {
            Some(end) if end <= region_len => Ok(offset..end),
            _ => Err(ProviderError::OutOfBounds {
                offset,
                len,
                region_len,
            }),
        }
    }

    fn place(b: &Buffer<Mem>) -> (usize, usize) {
        (b.offset(), b.len())
    }

    #[test]
    fn a_part_addresses_its_own_bytes() {
        let (head, mut tail) = Mem::buffer(16).split_at(10).unwrap();
        assert_eq!((tail.addr(), tail.lkey()), (0x100a, 7));
        assert_eq!(
            tail.remote(),
            RemoteAddr {
                addr: 0x100a,
                rkey: 9
            }
        );
        let sge = tail.sge().unwrap();
        assert_eq!((sge.addr, sge.length, sge.lkey), (0x100a, 6, 7));
        tail.write(1, &[1, 2]).unwrap();
        assert_eq!(tail.to_vec(), [0, 1, 2, 0, 0, 0]);
        tail.fill(5).unwrap();
        assert_eq!(tail.to_vec(), [5; 6]);
        let mut two = [0; 2];
        tail.read(4, &mut two).unwrap();
        assert_eq!(two, [5, 5]);
        // The head is untouched, and whole again with its tail.
        assert_eq!(head.to_vec(), [0; 10]);
        let whole = head.join(tail).unwrap();
        assert_eq!(whole.to_vec()[9..], [0, 5, 5, 5, 5, 5, 5]);
    }

    #[test]
    fn reads_and_writes_stay_inside_the_buffer() {
        let (_, mut tail) = Mem::buffer(16).split_at(10).unwrap();
        tail.write(6, &[]).unwrap();
        tail.write(5, &[1]).unwrap();
        let e = tail.write(5, &[1, 2]).unwrap_err();
        assert!(
            matches!(
                e,
                ProviderError::OutOfBounds {
                    offset: 5,
                    len: 2,
                    region_len: 6
                }
            ),
            "{e}"
        );
        assert!(tail.read(7, &mut []).is_err());
        assert!(tail.write(usize::MAX, &[1]).is_err());
    }

    #[test]
    fn splits_take_their_bounds_exactly() {
        let b = Mem::buffer(90);
        let b = b.split_at(91).unwrap_err();
        let (whole, empty) = b.split_at(90).unwrap();
        assert_eq!((place(&whole), place(&empty)), ((0, 90), (90, 0)));
        let (parts, rest) = whole.split_into(3, 30).unwrap();
        let places: Vec<_> = parts.iter().map(place).collect();
        assert_eq!(places, [(0, 30), (30, 30), (60, 30)]);
        assert_eq!(place(&rest), (90, 0));
        let ten = Mem::buffer(10);
        let ten = ten.split_into(2, 6).unwrap_err();
        assert_eq!(place(&ten), (0, 10));
        let (parts, rest) = ten.split_into(2, 4).unwrap();
        assert_eq!(parts.len(), 2);
        assert_eq!(place(&rest), (8, 2));
        assert!(rest.split_into(usize::MAX, 2).is_err());
    }

    #[test]
    fn only_adjacent_parts_of_one_region_join() {
        let (mut parts, _) = Mem::buffer(90).split_into(3, 30).unwrap();
        let c = parts.pop().unwrap();
        let b = parts.pop().unwrap();
        let a = parts.pop().unwrap();
        let (a, c) = a.join(c).unwrap_err();
        let (c, b) = c.join(b).unwrap_err();
        let ab = a.join(b).unwrap();
        assert_eq!(place(&ab), (0, 60));
        assert_eq!(place(&ab.join(c).unwrap()), (0, 90));
        // The same offsets in another region are not adjacent.
        let (head, _) = Mem::buffer(20).split_at(10).unwrap();
        let (_, other_tail) = Mem::buffer(20).split_at(10).unwrap();
        assert!(head.join(other_tail).is_err());
    }
}
