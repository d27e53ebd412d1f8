//! A memory region that is no memory and a device that makes nothing: fake providers'
//! `MemoryRegion` and `Device`, for tests and benches of the driver that move no bytes.

use selsig::{
    Access, AsyncEvent, CompletionQueue, Device, MemoryRegion, ProviderError, QpInit, QueuePair,
};

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

/// A device that makes nothing: the `Device` of fake providers whose CQs `C` and queue
/// pairs `Q` a test builds itself (a `SignaledQueue` names its types through it).
pub struct NullDevice<C, Q>(std::marker::PhantomData<fn() -> (C, Q)>);

impl<C: CompletionQueue, Q: QueuePair> Device for NullDevice<C, Q> {
    type Pd = ();
    type Mr = NullMr;
    type Cq = C;
    type Qp = Q;
    fn name(&self) -> &str {
        "null"
    }
    fn alloc_pd(&self) -> Result<(), ProviderError> {
        Ok(())
    }
    fn reg_mr(&self, _: &(), len: usize, _: Access) -> Result<NullMr, ProviderError> {
        Ok(NullMr(len))
    }
    fn create_cq(&self, _: u32) -> Result<C, ProviderError> {
        Err(ProviderError::Unavailable(
            "a null device makes no CQ: the test builds its own".into(),
        ))
    }
    fn create_qp(&self, _: &(), _: &C, _: &C, _: &QpInit) -> Result<Q, ProviderError> {
        Err(ProviderError::Unavailable(
            "a null device makes no queue pair: the test builds its own".into(),
        ))
    }
    fn poll_async_event(&self) -> Option<AsyncEvent> {
        None
    }
}
