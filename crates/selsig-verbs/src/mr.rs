//! Memory regions: whole zeroed pages registered with the NIC, read and written by copies
//! through raw pointers.

use std::alloc::Layout;
use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

use selsig::{Access, MemoryRegion, ProviderError};

use crate::error::{destroy_error, report};
use crate::pd::PdInner;
use crate::sys;

/// A memory region: zeroed whole pages owned by the region, registered with the
/// NIC. Deregistered, then freed, when dropped.
pub struct VerbsMr {
    pub(crate) mr: NonNull<sys::ibv_mr>,
    pub(crate) mem: NonNull<u8>,
    pub(crate) layout: Layout,
    pub(crate) len: usize,
    pub(crate) access: Access,
    pub(crate) pd: Arc<PdInner>,
    /// Held by `read` and `write`: two threads copying to or from the same bytes at once
    /// would be a data race (the NIC's own accesses are DMA, outside the program). It
    /// serializes CPU copies into one region, disjoint ones too (buffers split from one
    /// region); posting and polling never take it.
    pub(crate) cpu: std::sync::Mutex<()>,
}

// SAFETY: the region's memory is only accessed through raw-pointer copies (`read`,
// `write`, one at a time under `cpu`), never through references, and the MR handle
// through thread-safe verbs.
unsafe impl Send for VerbsMr {}
// SAFETY: as above.
unsafe impl Sync for VerbsMr {}

impl fmt::Debug for VerbsMr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VerbsMr")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len)
            .field("lkey", &format_args!("{:#x}", self.lkey()))
            .field("access", &self.access)
            .finish()
    }
}

impl Drop for VerbsMr {
    fn drop(&mut self) {
        // SAFETY: the MR was registered on this PD (kept alive by `self.pd`); after the
        // deregistration the NIC no longer reaches the memory, which is then freed with
        // the layout it was allocated with.
        unsafe {
            let rc = (self.pd.ctx.v.fns.dereg_mr)(self.mr.as_ptr());
            if rc != 0 {
                // Freeing memory the NIC may still write would be unsound: leak it.
                report(format_args!(
                    "ibv_dereg_mr failed ({}); its {} bytes are leaked",
                    destroy_error(rc),
                    self.len
                ));
                return;
            }
            std::alloc::dealloc(self.mem.as_ptr(), self.layout);
        }
    }
}

impl VerbsMr {
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

impl MemoryRegion for VerbsMr {
    fn addr(&self) -> u64 {
        self.mem.as_ptr() as u64
    }
    fn len(&self) -> usize {
        self.len
    }
    fn lkey(&self) -> u32 {
        // SAFETY: the MR handle is valid until `Drop`; `lkey` is set at registration.
        unsafe { (*self.mr.as_ptr()).lkey }
    }
    fn rkey(&self) -> u32 {
        // SAFETY: as for `lkey`.
        unsafe { (*self.mr.as_ptr()).rkey }
    }
    fn access(&self) -> Access {
        self.access
    }
    fn write(&self, offset: usize, data: &[u8]) -> Result<(), ProviderError> {
        self.check(offset, data.len())?;
        let _one_at_a_time = self.cpu.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: the range is inside the allocation (checked); no Rust reference to the
        // region's memory exists, the copy goes through raw pointers, and no other copy
        // runs meanwhile (`cpu`).
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.mem.as_ptr().add(offset), data.len());
        }
        Ok(())
    }
    fn read(&self, offset: usize, buf: &mut [u8]) -> Result<(), ProviderError> {
        self.check(offset, buf.len())?;
        let _one_at_a_time = self.cpu.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: as in `write`.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.mem.as_ptr().add(offset),
                buf.as_mut_ptr(),
                buf.len(),
            );
        }
        Ok(())
    }
}

/// The memory of a region of `len` bytes: whole pages of `page` bytes, aligned to a page.
/// `ibv_reg_mr` pins (and, with fork protection, marks "don't copy on fork") the whole
/// pages the region touches: no other object may share them.
pub(crate) fn region_layout(len: usize, page: usize) -> Result<Layout, std::alloc::LayoutError> {
    Layout::from_size_align(len.max(1), page).map(|l| l.pad_to_align())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A region's memory is whole pages of the host's size, whatever its length.
    #[test]
    fn a_region_takes_whole_pages() {
        for page in [4096, 65536] {
            for (len, size) in [(0, page), (1, page), (page, page), (page + 1, 2 * page)] {
                let layout = region_layout(len, page).unwrap();
                assert_eq!((layout.size(), layout.align()), (size, page), "{len}");
            }
        }
        assert!(region_layout(usize::MAX - 10, 4096).is_err());
    }
}
