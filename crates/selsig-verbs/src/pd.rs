//! Protection domains.

use std::ptr::NonNull;
use std::sync::Arc;

use crate::device::Context;
use crate::error::{destroy_error, report};
use crate::sys;

pub(crate) struct PdInner {
    pub(crate) pd: NonNull<sys::ibv_pd>,
    pub(crate) ctx: Arc<Context>,
    /// Allocated here, and deallocated on `Drop`; else the program's.
    pub(crate) owned: bool,
}

// SAFETY: a protection domain is a handle the thread-safe verbs take; owned until `Drop`.
unsafe impl Send for PdInner {}
// SAFETY: as above.
unsafe impl Sync for PdInner {}

impl Drop for PdInner {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        // SAFETY: every MR and QP of this PD holds an `Arc<PdInner>`: none is left.
        let rc = unsafe { (self.ctx.v.fns.dealloc_pd)(self.pd.as_ptr()) };
        if rc != 0 {
            report(format_args!("ibv_dealloc_pd failed: {}", destroy_error(rc)));
        }
    }
}

/// A protection domain.
pub struct VerbsPd {
    pub(crate) inner: Arc<PdInner>,
}
