//! A memory region that is no memory: fake providers' `MemoryRegion`, for tests and
//! benches of the driver that move no bytes.

use selsig::{Access, MemoryRegion, ProviderError};

/// A region of `.0` bytes at address 0x1000, keys 1, whose reads and writes do nothing.
#[derive(Debug)]
pub struct NullMr(pub usize);

impl MemoryRegion for NullMr {
    fn addr(&self) -> u64 {
        0x1000
    }
    fn len(&self) -> usize {
        self.0
    }
    fn lkey(&self) -> u32 {
        1
    }
    fn rkey(&self) -> u32 {
        1
    }
    fn access(&self) -> Access {
        Access::LOCAL_WRITE
    }
    fn write(&self, _: usize, _: &[u8]) -> Result<(), ProviderError> {
        Ok(())
    }
    fn read(&self, _: usize, _: &mut [u8]) -> Result<(), ProviderError> {
        Ok(())
    }
}
