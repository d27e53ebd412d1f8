//! `selsig::Device` for [`VerbsDevice`]: the creation of every verbs object (PD, MR, CQ
//! with its completion channel, QP) and the reading of asynchronous events. It builds them
//! all, so it sits above every other module.

use std::ffi::{c_int, c_void};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32};
use std::sync::{Arc, Mutex};

use selsig::mlx5_sizing::{self, Mlx5Limits, Mlx5Request, SendOps};
use selsig::{Access, AsyncEvent, Device, ProviderError, QpCaps, QpInit};

use crate::cq::{Channel, CqInner, VerbsCq};
use crate::device::{PostApi, VerbsDevice, set_nonblocking};
use crate::error::{destroy_error, os, report};
use crate::mr::{VerbsMr, region_layout};
use crate::pd::{PdInner, VerbsPd};
use crate::qp::VerbsQp;
use crate::sys;

/// A QP libmlx5 refused (`failed`): with `EINVAL`, the reason libmlx5's sizing gives for
/// `caps` on a ConnectX reporting `max_qp_wr` (semantics 13: a send queue of 256-byte WQEs
/// holds at most a quarter of `max_qp_wr`, fewer with more inline data), named as the
/// checks before `ibv_create_qp` name theirs; `failed` itself otherwise. The rule only
/// explains a refusal, it never refuses: a kernel may report a `max_qp_wr` smaller than its
/// send rings' blocks (see [`Mlx5Limits::connectx`]).
fn mlx5_refusal(
    caps: &QpCaps,
    send_ops: SendOps,
    max_qp_wr: u32,
    failed: ProviderError,
) -> ProviderError {
    let ProviderError::Os { source, .. } = &failed else {
        return failed;
    };
    if source.raw_os_error() != Some(libc::EINVAL) {
        return failed;
    }
    // What `create_qp` passes: at least one entry of each kind.
    let request = Mlx5Request {
        max_send_wr: caps.max_send_wr,
        max_recv_wr: caps.max_recv_wr,
        max_send_sge: caps.max_send_sge.max(1),
        max_recv_sge: caps.max_recv_sge.max(1),
        max_inline_data: caps.max_inline_data,
        send_ops,
    };
    match mlx5_sizing::size_rc_qp(&Mlx5Limits::connectx(max_qp_wr), &request) {
        Err(e) => ProviderError::Invalid {
            what: e.what(),
            why: format!("{e} (ibv_create_qp: {source})"),
        },
        Ok(_) => failed,
    }
}

/// The send operations an extended QP is made for: those selsig posts.
const SEND_OPS: u64 = sys::IBV_QP_EX_WITH_RDMA_WRITE
    | sys::IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM
    | sys::IBV_QP_EX_WITH_RDMA_READ
    | sys::IBV_QP_EX_WITH_SEND
    | sys::IBV_QP_EX_WITH_SEND_WITH_IMM
    | sys::IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP
    | sys::IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD;

/// [`SEND_OPS`] as libmlx5's sizing counts them: RDMA and atomics, no memory windows.
const MLX5_SEND_OPS: SendOps = SendOps::Named {
    rdma: true,
    atomics: true,
    memory_windows: false,
};

impl VerbsDevice {
    /// A QP refused by the provider (`failed`, of `verb`), with libmlx5's reason where it
    /// has one.
    fn refused_qp(&self, init: &QpInit, ops: SendOps, verb: &'static str) -> ProviderError {
        let failed = os(verb);
        match self.limits.filter(|_| self.mlx5) {
            Some(l) => mlx5_refusal(&init.caps, ops, l.max_qp_wr, failed),
            None => failed,
        }
    }

    /// An RC QP made with `ibv_create_qp`, and the capacities it was given.
    fn create_rc_qp(
        &self,
        pd: &VerbsPd,
        send_cq: &VerbsCq,
        recv_cq: &VerbsCq,
        init: &QpInit,
        cap: sys::ibv_qp_cap,
    ) -> Result<(NonNull<sys::ibv_qp>, sys::ibv_qp_cap), ProviderError> {
        let mut attr = sys::ibv_qp_init_attr {
            qp_context: std::ptr::null_mut(),
            send_cq: send_cq.inner.cq.as_ptr(),
            recv_cq: recv_cq.inner.cq.as_ptr(),
            srq: std::ptr::null_mut(),
            cap,
            qp_type: sys::IBV_QPT_RC,
            sq_sig_all: c_int::from(init.sq_sig_all),
        };
        // SAFETY: `attr` is valid; the CQs and the PD belong to this context and the QP
        // keeps them alive. On success the real capacities are written back into `attr.cap`.
        let qp = unsafe { (self.v().fns.create_qp)(pd.inner.pd.as_ptr(), &mut attr) };
        let qp = NonNull::new(qp)
            .ok_or_else(|| self.refused_qp(init, SendOps::Default, "ibv_create_qp"))?;
        Ok((qp, attr.cap))
    }

    /// An RC QP made with `ibv_create_qp_ex` for the extended posting API (`SEND_OPS`), the
    /// capacities it was given, and its `ibv_qp_ex`.
    #[allow(clippy::type_complexity)]
    fn create_rc_qp_ex(
        &self,
        pd: &VerbsPd,
        send_cq: &VerbsCq,
        recv_cq: &VerbsCq,
        init: &QpInit,
        cap: sys::ibv_qp_cap,
    ) -> Result<
        (
            NonNull<sys::ibv_qp>,
            sys::ibv_qp_cap,
            Option<NonNull<sys::ibv_qp_ex>>,
        ),
        ProviderError,
    > {
        let unavailable = |why: &str| {
            ProviderError::Unavailable(format!("the extended post API on {}: {why}", self.ctx.name))
        };
        let (Some(create), Some(to_ex)) = (self.create_qp_ex(), self.v().fns.qp_to_qp_ex) else {
            // `with_post_api` found them; a handle cannot lose them.
            return Err(unavailable("no ibv_create_qp_ex or ibv_qp_to_qp_ex"));
        };
        // SAFETY: all-zero bytes are a valid `ibv_qp_init_attr_ex` (pointers NULL, no
        // flags); the members `comp_mask` names are set below.
        let mut attr: sys::ibv_qp_init_attr_ex = unsafe { std::mem::zeroed() };
        attr.send_cq = send_cq.inner.cq.as_ptr();
        attr.recv_cq = recv_cq.inner.cq.as_ptr();
        attr.cap = cap;
        attr.qp_type = sys::IBV_QPT_RC;
        attr.sq_sig_all = c_int::from(init.sq_sig_all);
        attr.comp_mask = sys::IBV_QP_INIT_ATTR_PD | sys::IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
        attr.pd = pd.inner.pd.as_ptr();
        attr.send_ops_flags = SEND_OPS;
        // SAFETY: the provider's `create_qp_ex` of this open context (what the static inline
        // `ibv_create_qp_ex` calls for a `comp_mask` beyond the PD); `attr` is valid, the
        // CQs and the PD belong to this context and the QP keeps them alive. On success the
        // capacities given are written back into `attr.cap`.
        let qp = unsafe { create(self.ctx.ctx.as_ptr(), &mut attr) };
        let qp = NonNull::new(qp)
            .ok_or_else(|| self.refused_qp(init, MLX5_SEND_OPS, "ibv_create_qp_ex"))?;
        // SAFETY: a QP made just now by this libibverbs.
        let qp_ex = NonNull::new(unsafe { to_ex(qp.as_ptr()) });
        if qp_ex.is_none() {
            // SAFETY: the QP made above, which nothing else holds.
            let rc = unsafe { (self.v().fns.destroy_qp)(qp.as_ptr()) };
            if rc != 0 {
                report(format_args!("ibv_destroy_qp failed: {}", destroy_error(rc)));
            }
            return Err(unavailable(
                "ibv_create_qp_ex made a QP that has no ibv_qp_ex (ibv_qp_to_qp_ex: NULL)",
            ));
        }
        Ok((qp, attr.cap, qp_ex))
    }
}

impl Device for VerbsDevice {
    type Pd = VerbsPd;
    type Mr = VerbsMr;
    type Cq = VerbsCq;
    type Qp = VerbsQp;

    fn name(&self) -> &str {
        &self.ctx.name
    }

    fn alloc_pd(&self) -> Result<VerbsPd, ProviderError> {
        // SAFETY: the context is open.
        let pd = unsafe { (self.v().fns.alloc_pd)(self.ctx.ctx.as_ptr()) };
        let pd = NonNull::new(pd).ok_or_else(|| os("ibv_alloc_pd"))?;
        Ok(VerbsPd {
            inner: Arc::new(PdInner {
                pd,
                ctx: Arc::clone(&self.ctx),
                owned: true,
            }),
        })
    }

    fn reg_mr(&self, pd: &VerbsPd, len: usize, access: Access) -> Result<VerbsMr, ProviderError> {
        self.own("protection domain", &pd.inner.ctx)?;
        if let Some(max) = self.limits.map(|l| l.max_mr_size)
            && len as u64 > max
        {
            return Err(ProviderError::Invalid {
                what: "region length",
                why: format!(
                    "{len} bytes: {} registers at most {max} (max_mr_size)",
                    self.ctx.name
                ),
            });
        }
        let layout =
            region_layout(len, rustix::param::page_size()).map_err(|e| ProviderError::Invalid {
                what: "region length",
                why: format!("{len} bytes: {e}"),
            })?;
        // SAFETY: the layout has a non-zero size.
        let mem = NonNull::new(unsafe { std::alloc::alloc_zeroed(layout) }).ok_or_else(|| {
            ProviderError::Invalid {
                what: "region length",
                why: format!("cannot allocate {len} bytes"),
            }
        })?;
        // SAFETY: `mem` is `len` bytes of memory owned by the region, registered for as long
        // as the region lives.
        let mr = unsafe {
            (self.v().fns.reg_mr)(
                pd.inner.pd.as_ptr(),
                mem.as_ptr().cast::<c_void>(),
                len,
                access.bits() as c_int,
            )
        };
        let Some(mr) = NonNull::new(mr) else {
            let err = os("ibv_reg_mr");
            // SAFETY: the registration failed: the memory is ours to free.
            unsafe { std::alloc::dealloc(mem.as_ptr(), layout) };
            return Err(err);
        };
        Ok(VerbsMr {
            mr,
            mem,
            layout,
            len,
            access,
            pd: Arc::clone(&pd.inner),
            cpu: std::sync::Mutex::new(()),
        })
    }

    fn create_cq(&self, min_entries: u32) -> Result<VerbsCq, ProviderError> {
        if let Some(max) = self.limits.map(|l| l.max_cqe)
            && (min_entries == 0 || min_entries > max)
        {
            return Err(ProviderError::Invalid {
                what: "CQ size",
                why: format!(
                    "{min_entries} entries: {} supports 1 to {max} (max_cqe)",
                    self.ctx.name
                ),
            });
        }
        let cqe = c_int::try_from(min_entries).map_err(|_| ProviderError::Invalid {
            what: "CQ size",
            why: format!("{min_entries} entries"),
        })?;
        // One completion channel per CQ, its descriptor non-blocking (`take_events` reads
        // it until EAGAIN, `wait_event` polls it).
        // SAFETY: the context is open.
        let channel = unsafe { (self.v().fns.create_comp_channel)(self.ctx.ctx.as_ptr()) };
        let channel = NonNull::new(channel).ok_or_else(|| os("ibv_create_comp_channel"))?;
        let destroy_channel = || {
            // SAFETY: the channel made above, which no CQ uses.
            let rc = unsafe { (self.v().fns.destroy_comp_channel)(channel.as_ptr()) };
            if rc != 0 {
                report(format_args!(
                    "ibv_destroy_comp_channel failed: {}",
                    destroy_error(rc)
                ));
            }
        };
        // SAFETY: the channel is live; libibverbs set its `fd` and never changes it.
        let fd = unsafe { (*channel.as_ptr()).fd };
        if let Err(source) = set_nonblocking(fd) {
            destroy_channel();
            return Err(ProviderError::Os {
                verb: "fcntl(completion channel fd, O_NONBLOCK)",
                source,
            });
        }
        // SAFETY: the context is open and the channel is of it; no CQ context. The CQ
        // keeps the channel (`CqInner` destroys it after the CQ).
        let cq = unsafe {
            (self.v().fns.create_cq)(
                self.ctx.ctx.as_ptr(),
                cqe,
                std::ptr::null_mut(),
                channel.as_ptr(),
                0,
            )
        };
        let Some(cq) = NonNull::new(cq) else {
            let err = os("ibv_create_cq");
            destroy_channel();
            return Err(err);
        };
        Ok(VerbsCq {
            inner: Arc::new(CqInner {
                cq,
                ctx: Arc::clone(&self.ctx),
                failed: AtomicI32::new(0),
                channel: Some(Channel { channel, fd }),
                owned: true,
            }),
        })
    }

    fn create_qp(
        &self,
        pd: &VerbsPd,
        send_cq: &VerbsCq,
        recv_cq: &VerbsCq,
        init: &QpInit,
    ) -> Result<VerbsQp, ProviderError> {
        self.own("protection domain", &pd.inner.ctx)?;
        self.own("send CQ", &send_cq.inner.ctx)?;
        self.own("receive CQ", &recv_cq.inner.ctx)?;
        if let Some(l) = self.limits {
            let caps = &init.caps;
            for (what, n, max, field) in [
                ("max_send_wr", caps.max_send_wr, l.max_qp_wr, "max_qp_wr"),
                ("max_recv_wr", caps.max_recv_wr, l.max_qp_wr, "max_qp_wr"),
                ("max_send_sge", caps.max_send_sge, l.max_sge, "max_sge"),
                ("max_recv_sge", caps.max_recv_sge, l.max_sge, "max_sge"),
            ] {
                if n > max {
                    return Err(ProviderError::Invalid {
                        what,
                        why: format!("{n}: {} supports up to {max} ({field})", self.ctx.name),
                    });
                }
            }
        }
        let cap = sys::ibv_qp_cap {
            max_send_wr: init.caps.max_send_wr,
            max_recv_wr: init.caps.max_recv_wr,
            // The entries asked for (`QpInit::caps`), at least one of each kind.
            max_send_sge: init.caps.max_send_sge.max(1),
            max_recv_sge: init.caps.max_recv_sge.max(1),
            max_inline_data: init.caps.max_inline_data,
        };
        let (qp, c, qp_ex) = match self.post_api {
            PostApi::Legacy => {
                let (qp, c) = self.create_rc_qp(pd, send_cq, recv_cq, init, cap)?;
                (qp, c, None)
            }
            PostApi::Extended => self.create_rc_qp_ex(pd, send_cq, recv_cq, init, cap)?,
        };
        Ok(VerbsQp {
            qp,
            _pd: Arc::clone(&pd.inner),
            _send_cq: Arc::clone(&send_cq.inner),
            _recv_cq: Arc::clone(&recv_cq.inner),
            caps: QpCaps {
                max_send_wr: c.max_send_wr,
                max_recv_wr: c.max_recv_wr,
                max_send_sge: c.max_send_sge,
                max_recv_sge: c.max_recv_sge,
                max_inline_data: c.max_inline_data,
            },
            sq_sig_all: init.sq_sig_all,
            dev: self.clone(),
            psn: AtomicU32::new(u32::MAX),
            state: AtomicU32::new(sys::IBV_QPS_RESET),
            reached_rts: AtomicBool::new(false),
            attr_calls: Mutex::new(()),
            owned: true,
            qp_ex,
        })
    }

    fn poll_async_event(&self) -> Option<AsyncEvent> {
        // A program's own context: its events are the program's to read (its descriptor
        // may block); nothing is read there.
        self.ctx.read_async_events();
        self.ctx
            .events
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .pop_front()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(errno: i32) -> ProviderError {
        ProviderError::Os {
            verb: "ibv_create_qp",
            source: std::io::Error::from_raw_os_error(errno),
        }
    }

    fn mlx5_refusal_default(caps: &QpCaps, max_qp_wr: u32, failed: ProviderError) -> ProviderError {
        mlx5_refusal(caps, SendOps::Default, max_qp_wr, failed)
    }

    fn caps(max_send_wr: u32, max_inline_data: u32) -> QpCaps {
        QpCaps {
            max_send_wr,
            max_recv_wr: 1,
            max_inline_data,
            ..QpCaps::default()
        }
    }

    /// libmlx5's bare EINVAL gets the reason its sizing gives (semantics 13).
    #[test]
    fn an_mlx5_einval_is_named_by_libmlx5s_sizing() {
        // 8193 WQEs of 256 bytes need 65536 blocks of a ConnectX's 32768.
        let e = mlx5_refusal_default(&caps(8193, 0), 32768, refused(libc::EINVAL));
        match &e {
            ProviderError::Invalid { what, why } => {
                assert_eq!(*what, "max_send_wr");
                assert!(why.contains("65536 64-byte blocks"), "{why}");
                assert!(why.contains("ibv_create_qp"), "{why}");
            }
            other => panic!("{other:?}"),
        }
        // 64 bytes inline: 320-byte WQEs, 6554 of them are too many.
        let e = mlx5_refusal_default(&caps(6554, 64), 32768, refused(libc::EINVAL));
        assert!(
            matches!(
                e,
                ProviderError::Invalid {
                    what: "max_send_wr",
                    ..
                }
            ),
            "{e:?}"
        );
        let e = mlx5_refusal_default(&caps(1, 317), 32768, refused(libc::EINVAL));
        assert!(
            matches!(
                e,
                ProviderError::Invalid {
                    what: "max_inline_data",
                    ..
                }
            ),
            "{e:?}"
        );
    }

    /// What the sizing accepts, and other errors, stay libmlx5's own.
    #[test]
    fn other_refusals_are_left_as_they_are() {
        let e = mlx5_refusal_default(&caps(8192, 0), 32768, refused(libc::EINVAL));
        assert!(matches!(e, ProviderError::Os { .. }), "{e:?}");
        let e = mlx5_refusal_default(&caps(8193, 0), 32768, refused(libc::ENOMEM));
        match e {
            ProviderError::Os { source, .. } => {
                assert_eq!(source.raw_os_error(), Some(libc::ENOMEM))
            }
            other => panic!("{other:?}"),
        }
    }
}
