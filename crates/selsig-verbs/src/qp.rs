//! RC queue pairs: state transitions (connect, to the error state), queries, and posting
//! of send and receive work requests.

use std::ffi::c_int;
use std::io;
use std::mem::MaybeUninit;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use selsig::{
    ConnectOptions, Device, Endpoint, Local, Opcode, PostFailure, PostWrError, ProviderError,
    QpCaps, QpState, QueuePair, RecvWr, SendWr,
};

use crate::cq::{CqInner, NO_WR_ID, VerbsCq};
use crate::device::{Limits, PostApi, VerbsDevice, mtu_bytes, mtu_enum};
use crate::error::{Queue, batch_error, destroy_error, errno_of, post_result, report};
use crate::pd::PdInner;
use crate::sys;

/// Work requests of one post kept on the stack (more spill to the heap).
const POST_INLINE: usize = 16;
/// Scatter/gather entries of one post kept on the stack: a batch of [`POST_INLINE`] work
/// requests of one entry each, or fewer on lists, up to this many in all (more spill to the
/// heap with the work requests).
const POST_INLINE_SGES: usize = 64;

/// The `ibv_sge` entries work request `wr` takes in the post list: its list's, one for
/// data in a single entry or inline, none without data.
fn sge_count(wr: &SendWr<'_>) -> usize {
    match wr.local {
        Local::Empty => 0,
        Local::Sge(_) | Local::Inline(_) => 1,
        Local::Sges(list) => list.len(),
    }
}

/// The first work request that is refused before the provider sees it, and why: inline
/// data longer than the QP's `max_inline_data` (mlx5 answers `ENOMEM`, `set_data_inl_seg`,
/// which reads as a full queue; rxe `EINVAL`; and data of 4 GiB or more would be cut short
/// by the 32-bit `ibv_sge` length), an inline RDMA READ (`IBV_SEND_INLINE` is for SEND and
/// RDMA WRITE only, `ibv_post_send(3)`), or a scatter/gather entry (data, inline or not,
/// is passed as one) on a QP of `max_send_sge` 0, a QP the program made (mlx5 answers
/// `ENOMEM` for more entries than `max_send_sge`, `_mlx5_post_send`: semantics 33), and a
/// scatter/gather list longer than the QP's `max_send_sge` as read back at its creation
/// (libmlx5: `ENOMEM`, `wr->num_sge > qp->sq.qp_state_max_gs` in `_mlx5_post_send`, which
/// reads as a full queue; rxe: `EINVAL`, `validate_send_wr`) or whose entries add up to
/// 4 GiB or more (rxe sums them in 32 bits, `post_one_send`).
fn refused_up_front(
    wrs: &[SendWr<'_>],
    max_inline: u32,
    max_sge: u32,
    rxe: bool,
) -> Option<(usize, PostFailure)> {
    wrs.iter()
        .enumerate()
        .find_map(|(i, w)| match (w.local, w.atomic_refusal(rxe)) {
            (Local::Sge(_) | Local::Inline(_), _) if max_sge == 0 => Some((
                i,
                PostFailure::Invalid("a scatter/gather entry on a queue pair of max_send_sge 0"),
            )),
            (Local::Sges(list), _) if list.len() > max_sge as usize => Some((
                i,
                PostFailure::TooManySges {
                    count: list.len(),
                    max: max_sge,
                },
            )),
            (Local::Sges(list), _)
                if too_long_for_an_sge(list.iter().map(|s| s.length as usize).sum()) =>
            {
                Some((
                    i,
                    PostFailure::Invalid("a scatter/gather list of 4 GiB or more"),
                ))
            }
            (Local::Inline(_), _) if w.opcode == Opcode::RdmaRead => {
                Some((i, PostFailure::Invalid("an RDMA READ cannot be inline")))
            }
            (_, Some(why)) => Some((i, PostFailure::Invalid(why))),
            (Local::Inline(d), _) if too_long_for_an_sge(d.len()) => {
                Some((i, PostFailure::Invalid("inline data of 4 GiB or more")))
            }
            (Local::Inline(d), _) if d.len() > max_inline as usize => Some((
                i,
                PostFailure::InlineTooLong {
                    len: d.len(),
                    max: max_inline,
                },
            )),
            _ => None,
        })
}

/// Whether `wr` has a scatter/gather list whose entries are not all of one length.
fn uneven_list(wr: &SendWr<'_>) -> bool {
    match wr.local {
        Local::Sges([first, rest @ ..]) => rest.iter().any(|s| s.length != first.length),
        _ => false,
    }
}

/// The functions of an `ibv_qp_ex` selsig calls, copied out of it.
#[derive(Clone, Copy)]
struct ExFns {
    wr_start: Option<sys::WrStart>,
    wr_complete: Option<sys::WrComplete>,
    wr_set_sge: Option<sys::WrSetSge>,
    wr_set_sge_list: Option<sys::WrSetSgeList>,
    wr_set_inline_data: Option<sys::WrSetInlineData>,
    wr_rdma_write: Option<sys::WrRdma>,
    wr_rdma_write_imm: Option<sys::WrRdmaImm>,
    wr_rdma_read: Option<sys::WrRdma>,
    wr_send: Option<sys::WrSend>,
    wr_send_imm: Option<sys::WrSendImm>,
    wr_atomic_cmp_swp: Option<sys::WrCmpSwp>,
    wr_atomic_fetch_add: Option<sys::WrFetchAdd>,
}

/// Entries of a list converted for `ibv_wr_set_sge_list` on the stack (longer lists take
/// a vector, once per post).
const EX_SGES: usize = 32;

/// Whether `len` bytes are more than an `ibv_sge` length (32 bits) can say.
fn too_long_for_an_sge(len: usize) -> bool {
    u32::try_from(len).is_err()
}

/// The RDMA READs and atomics a QP serves at once as the responder (`max_dest_rd_atomic`,
/// what its endpoint advertises): the device's `max_qp_rd_atom`, at most 255 (the
/// attribute's width), at least 1; 1 when the device does not say.
fn responder_depth(limits: Option<&Limits>) -> u8 {
    limits.map_or(1, |l| l.max_qp_rd_atom.clamp(1, 255) as u8)
}

/// The RDMA READs and atomics a QP keeps in flight (`max_rd_atomic`): the device's
/// `max_qp_init_rd_atom`, and no more than the peer serves (`remote`; 0, not known, reads
/// as 1), at least 1.
fn initiator_depth(limits: Option<&Limits>, remote: u8) -> u8 {
    let local = limits.map_or(1, |l| l.max_qp_init_rd_atom.clamp(1, 255) as u8);
    local.min(remote.max(1))
}

/// An RC queue pair.
pub struct VerbsQp {
    pub(crate) qp: NonNull<sys::ibv_qp>,
    pub(crate) _pd: Arc<PdInner>,
    pub(crate) _send_cq: Arc<CqInner>,
    pub(crate) _recv_cq: Arc<CqInner>,
    pub(crate) caps: QpCaps,
    pub(crate) sq_sig_all: bool,
    pub(crate) dev: VerbsDevice,
    pub(crate) psn: AtomicU32,
    /// The state as this QP's modifies and queries last found it (libibverbs caches it in
    /// `ibv_qp.state` too, which its calls write without a lock: this is read instead).
    pub(crate) state: AtomicU32,
    /// Whether the QP ever reached RTS (mlx5 takes no work request in the error state
    /// before it has: `ENOMEM` for ever).
    pub(crate) reached_rts: AtomicBool,
    /// Held across `ibv_modify_qp` and `ibv_query_qp`, which write `ibv_qp.state` unlocked.
    pub(crate) attr_calls: Mutex<()>,
    /// Created here, and destroyed on `Drop`; else the program's ([`VerbsQp::from_raw`]).
    pub(crate) owned: bool,
    /// Its `ibv_qp_ex`, through which it posts sends ([`PostApi::Extended`]); `None`: with
    /// `ibv_post_send`.
    pub(crate) qp_ex: Option<NonNull<sys::ibv_qp_ex>>,
}

// SAFETY: `ibv_post_send` and `ibv_post_recv` are thread-safe (libmlx5 unless
// `MLX5_SINGLE_THREADED=1`, which `VerbsDevice::open` refuses); `ibv_modify_qp` and
// `ibv_query_qp`, which write the QP's cached state (`ibv_qp.state`) without a lock, are
// called under `attr_calls`, and selsig never reads that field; the handle is owned until
// `Drop`. Some providers' post calls read that field without a lock (rxe's `post_recv`,
// irdma's posts), so a post on one thread and a modify or query on another race inside
// rdma-core, as they do in any program that posts while another thread changes or
// queries the QP: the post sees the state just before or just after the change (at worst
// a stale `EINVAL`, which `post_error` re-checks against the queried state). selsig cannot
// close that without serializing every post with those calls. A program's QP made in a
// thread domain (`from_raw`) has no post or doorbell lock in libmlx5 (semantics 37): a
// `SignaledQueue` posts with `&mut self`, one thread at a time per QP, and the doorbell
// shared by the thread domain's QPs is the program's to serialize (docs/verbs.md,
// "Thread domains", which `from_raw` names among its conditions).
unsafe impl Send for VerbsQp {}
// SAFETY: as above.
unsafe impl Sync for VerbsQp {}

impl Drop for VerbsQp {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        // SAFETY: the QP was created by `ibv_create_qp`; its PD and CQs are still alive
        // (this struct holds them), as the destroy requires.
        let rc = unsafe { (self.dev.v().fns.destroy_qp)(self.qp.as_ptr()) };
        if rc != 0 {
            report(format_args!("ibv_destroy_qp failed: {}", destroy_error(rc)));
        }
    }
}

/// Whether a send queue in `state` takes no work request: below RTS, and in the error
/// state before it ever reached RTS (mlx5 refuses every post there with `ENOMEM`, for
/// ever, which would read as a full queue; rxe takes them and flushes them).
fn takes_no_sends(state: QpState, reached_rts: bool) -> bool {
    match state {
        QpState::Reset | QpState::Init | QpState::Rtr => true,
        QpState::Err | QpState::Sqe => !reached_rts,
        _ => false,
    }
}

fn state_name(s: u32) -> QpState {
    QpState::try_from(s).unwrap_or(QpState::Err)
}

impl VerbsQp {
    /// An RC queue pair the program created itself (`ibv_create_qp`) on `dev`'s context,
    /// whose send and receive completions go to `send_cq` and `recv_cq` (wrapped with
    /// [`VerbsCq::from_raw`](crate::VerbsCq::from_raw)), so that a
    /// [`SignaledQueue`](selsig::SignaledQueue) drives it. Its capacities, state and
    /// `sq_sig_all` are read with `ibv_query_qp`; it may be connected already (in RTS), or
    /// be connected through [`QueuePair::connect`]. It is never destroyed here. On a device
    /// handle that posts through the extended API ([`VerbsDevice::with_post_api`]), the QP
    /// must have been made with `ibv_create_qp_ex` and `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`
    /// (for the operations posted to it).
    ///
    /// # Safety
    ///
    /// `qp` is a live QP of `dev`'s context, and stays so until the returned queue pair is
    /// dropped; while it lives, nothing else posts to its send queue or modifies it (its
    /// work requests and state are the tracker's to account for). A QP made in a thread
    /// domain (no locks in libmlx5) must also meet the conditions of docs/verbs.md,
    /// "Thread domains": no two QPs of one thread domain posted to at once. On a device
    /// handle that posts through the extended API, `qp` was made by `ibv_create_qp_ex` (a
    /// `struct verbs_qp`, which `ibv_qp_to_qp_ex` reads beyond the `ibv_qp`): selsig checks
    /// what that call answers, but cannot check what it reads.
    pub unsafe fn from_raw(
        dev: &VerbsDevice,
        qp: *mut sys::ibv_qp,
        send_cq: &VerbsCq,
        recv_cq: &VerbsCq,
    ) -> Result<VerbsQp, ProviderError> {
        let invalid = |why: String| ProviderError::Invalid {
            what: "queue pair",
            why,
        };
        let qp = NonNull::new(qp).ok_or_else(|| invalid("it is NULL".to_string()))?;
        // SAFETY: a live QP (the caller's contract); these fields are set at its creation.
        let (context, pd, sends, receives, qp_type) = unsafe {
            let q = &*qp.as_ptr();
            (q.context, q.pd, q.send_cq, q.recv_cq, q.qp_type)
        };
        if context != dev.ctx.ctx.as_ptr() {
            return Err(invalid(format!(
                "it belongs to another device context than {}'s",
                dev.ctx.name
            )));
        }
        if qp_type != sys::IBV_QPT_RC {
            return Err(invalid(format!(
                "its type is {qp_type}, not RC ({})",
                sys::IBV_QPT_RC
            )));
        }
        if sends != send_cq.inner.cq.as_ptr() || receives != recv_cq.inner.cq.as_ptr() {
            return Err(invalid(
                "its send or receive CQ is not the one given".to_string(),
            ));
        }
        let pd = NonNull::new(pd).ok_or_else(|| invalid("it has no PD".to_string()))?;
        let mut attr = sys::ibv_qp_attr::default();
        // SAFETY: `init` is zeroed plain data; `attr` and `init` are valid to fill.
        let mut init: sys::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        // SAFETY: a live QP; `attr` and `init` are valid to fill.
        let rc = unsafe {
            (dev.v().fns.query_qp)(
                qp.as_ptr(),
                &mut attr,
                sys::IBV_QP_STATE | sys::IBV_QP_CAP,
                &mut init,
            )
        };
        if rc != 0 {
            return Err(ProviderError::Os {
                verb: "ibv_query_qp",
                source: io::Error::from_raw_os_error(rc.abs()),
            });
        }
        // The extended API (`dev`'s choice) needs the QP's `ibv_qp_ex`: a QP made with
        // `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS` has one.
        let qp_ex = match (dev.post_api, dev.v().fns.qp_to_qp_ex) {
            (PostApi::Legacy, _) => None,
            (PostApi::Extended, to_ex) => {
                // SAFETY: a live QP of this libibverbs, made by `ibv_create_qp_ex` (the
                // caller's contract: `ibv_qp_to_qp_ex` reads its `verbs_qp`).
                let ex = to_ex.and_then(|f| NonNull::new(unsafe { f(qp.as_ptr()) }));
                if ex.is_none() {
                    return Err(invalid(
                        "the device posts through the extended API, and it was not made with \
                         IBV_QP_INIT_ATTR_SEND_OPS_FLAGS (ibv_qp_to_qp_ex gives NULL)"
                            .to_string(),
                    ));
                }
                ex
            }
        };
        let c = attr.cap;
        let state = attr.qp_state;
        Ok(VerbsQp {
            qp_ex,
            qp,
            _pd: Arc::new(PdInner {
                pd,
                ctx: Arc::clone(&dev.ctx),
                owned: false,
            }),
            _send_cq: Arc::clone(&send_cq.inner),
            _recv_cq: Arc::clone(&recv_cq.inner),
            caps: QpCaps {
                max_send_wr: c.max_send_wr,
                max_recv_wr: c.max_recv_wr,
                max_send_sge: c.max_send_sge,
                max_recv_sge: c.max_recv_sge,
                max_inline_data: c.max_inline_data,
            },
            sq_sig_all: init.sq_sig_all != 0,
            dev: dev.clone(),
            psn: AtomicU32::new(u32::MAX),
            state: AtomicU32::new(state),
            // RTS, SQD and SQE come after RTS; in the error state, whether it was reached
            // cannot be told, and posts are taken as refused.
            reached_rts: AtomicBool::new((sys::IBV_QPS_RTS..sys::IBV_QPS_ERR).contains(&state)),
            attr_calls: Mutex::new(()),
            owned: false,
        })
    }

    /// The attributes `mask` names (`ibv_query_qp`); `None` if they cannot be read.
    fn query(&self, mask: c_int) -> Option<sys::ibv_qp_attr> {
        let _calls = self.attr_calls.lock().unwrap_or_else(|e| e.into_inner());
        self.query_locked(mask)
    }

    /// [`query`](Self::query), `attr_calls` held.
    fn query_locked(&self, mask: c_int) -> Option<sys::ibv_qp_attr> {
        let mut attr = sys::ibv_qp_attr::default();
        // SAFETY: `init` is a valid `ibv_qp_init_attr` to fill; `attr` likewise.
        let rc = unsafe {
            let mut init: sys::ibv_qp_init_attr = std::mem::zeroed();
            (self.dev.v().fns.query_qp)(self.qp.as_ptr(), &mut attr, mask, &mut init)
        };
        if rc == 0 && mask & sys::IBV_QP_STATE != 0 {
            self.state.store(attr.qp_state, Ordering::Release);
        }
        (rc == 0).then_some(attr)
    }

    /// The path MTU the QP uses, in bytes (`ibv_query_qp`), once connected (before, what
    /// the device reports for a QP with no path: 256 on rxe); `None` if it cannot be read.
    pub fn path_mtu(&self) -> Option<u32> {
        self.query(sys::IBV_QP_PATH_MTU)
            .map(|attr| mtu_bytes(attr.path_mtu))
    }

    /// How many RDMA READs and atomics the QP keeps in flight and serves at once
    /// (`max_rd_atomic`, `max_dest_rd_atomic`, from `ibv_query_qp`; a provider may round
    /// them up); `None` if they cannot be read.
    pub fn rd_atomic(&self) -> Option<(u8, u8)> {
        self.query(sys::IBV_QP_MAX_QP_RD_ATOMIC | sys::IBV_QP_MAX_DEST_RD_ATOMIC)
            .map(|attr| (attr.max_rd_atomic, attr.max_dest_rd_atomic))
    }

    /// How this QP posts sends: [`PostApi::Extended`] when it was made (or wrapped) by a
    /// device handle that posts through the extended API.
    pub fn post_api(&self) -> PostApi {
        if self.qp_ex.is_some() {
            PostApi::Extended
        } else {
            PostApi::Legacy
        }
    }

    pub(crate) fn modify(
        &self,
        attr: &mut sys::ibv_qp_attr,
        mask: c_int,
        to: QpState,
        what: &str,
    ) -> Result<(), ProviderError> {
        let _calls = self.attr_calls.lock().unwrap_or_else(|e| e.into_inner());
        let from = self
            .query_locked(sys::IBV_QP_STATE)
            .map_or_else(|| self.cached_state(), |a| state_name(a.qp_state));
        // SAFETY: `attr` is a valid `ibv_qp_attr` whose fields named by `mask` are set.
        let rc = unsafe { (self.dev.v().fns.modify_qp)(self.qp.as_ptr(), attr, mask) };
        if rc == 0 {
            self.state.store(attr.qp_state, Ordering::Release);
            if to == QpState::Rts {
                self.reached_rts.store(true, Ordering::Release);
            }
        }
        if rc != 0 {
            let code = errno_of(rc, io::Error::last_os_error().raw_os_error());
            return Err(ProviderError::Transition {
                qp_num: self.qp_num(),
                from,
                to,
                why: format!(
                    "ibv_modify_qp failed ({}); attributes set: {what}",
                    io::Error::from_raw_os_error(code)
                ),
            });
        }
        Ok(())
    }

    /// The state this QP's calls last found.
    fn cached_state(&self) -> QpState {
        state_name(self.state.load(Ordering::Acquire))
    }

    fn local_psn(&self) -> u32 {
        let psn = self.psn.load(Ordering::Relaxed);
        if psn != u32::MAX {
            return psn;
        }
        let fresh = random_psn();
        match self
            .psn
            .compare_exchange(u32::MAX, fresh, Ordering::Relaxed, Ordering::Relaxed)
        {
            Ok(_) => fresh,
            Err(existing) => existing,
        }
    }

    /// Refuses options out of range ([`ConnectOptions::check`]), a port other than the
    /// one the device was opened on, and a GID index other than the device's: the
    /// endpoint advertises the GID of the index the device was opened with, so the path
    /// must start from that one (the peer's `dgid` would name another address than the
    /// packets come from).
    fn check_options(&self, options: &ConnectOptions) -> Result<(), ProviderError> {
        options.check()?;
        if options.port != self.dev.port {
            return Err(ProviderError::Invalid {
                what: "port",
                why: format!(
                    "the device was opened on port {}, not {}",
                    self.dev.port, options.port
                ),
            });
        }
        match options.gid_index {
            Some(i) if Some(i) != self.dev.gid_index => Err(ProviderError::Invalid {
                what: "GID index",
                why: format!(
                    "{} was opened with GID index {}, whose GID the endpoint advertises; \
                     connect with that index (or open the device with {i})",
                    self.dev.name(),
                    self.dev
                        .gid_index
                        .map_or("none (LID routing)".to_string(), |g| g.to_string())
                ),
            }),
            _ => Ok(()),
        }
    }

    /// Posts `wrs` through the extended API of the QP's `ibv_qp_ex` (`qpx`): between
    /// `ibv_wr_start` and `ibv_wr_complete`, each work request's builder (`ibv_wr_rdma_write`,
    /// ...) after its `wr_id` and `wr_flags`, then its setter (`ibv_wr_set_sge`,
    /// `ibv_wr_set_sge_list`, `ibv_wr_set_inline_data`). `ibv_wr_complete` posts them all
    /// or none (`ibv_wr_post(3)`: "the entire posting will be aborted"), so a failure is
    /// reported at index 0 and the caller takes every work request back. What makes it
    /// fail, in rdma-core 44's providers:
    ///
    /// - rxe (`providers/rxe/rxe.c`): the batch error `qp->err`, cleared by `wr_start`, is
    ///   only ever `ENOSPC`: a full send queue (`check_qp_queue_full`, in every builder),
    ///   inline data beyond `max_inline` (`wr_set_inline_data`, `wr_set_inline_data_list`)
    ///   and more entries than `max_sge` (`wr_set_sge_list`); `wr_complete` then returns it
    ///   and leaves the producer index where it was. Otherwise it stores the producer index
    ///   and rings the doorbell (`post_send_db`, a `write()` of `IB_USER_VERBS_CMD_POST_SEND`
    ///   to the command fd), whose errno it returns (the kernel's `EINVAL` for a QP below
    ///   RTS): the batch is then posted, as `ibv_post_send`'s failed doorbell leaves it,
    ///   and is reported taken whole (`PostFailure::AfterPosting`).
    /// - mlx5 (`providers/mlx5/qp.c`): `mlx5_send_wr_complete` returns `mqp->err` (cleared
    ///   by `mlx5_send_wr_start`) after rolling `sq.cur_post` back: `ENOMEM` for a full queue
    ///   (`mlx5_wq_overflow` in `_common_wqe_init_op`), more entries than `sq.max_gs`
    ///   (`_mlx5_send_wr_set_sge_list`) and inline data beyond `max_inline_data`
    ///   (`_mlx5_send_wr_set_inline_data`, `_mlx5_send_wr_set_inline_data_list`); `EINVAL`,
    ///   `EOPNOTSUPP` and others from builders selsig does not call (raw Ethernet checksums,
    ///   TSO, memory windows, mlx5dv's MR and MMO operations). Before the QP first reaches
    ///   RTS (and after a move to RESET) `wr_complete` is `mlx5_send_wr_complete_error`,
    ///   which rolls back and answers `EINVAL` (`set_qp_operational_state` in `verbs.c`).
    ///   The doorbell itself cannot fail.
    ///
    /// The refusals selsig can see coming (the state, inline data, lists) are made before
    /// `ibv_wr_start` by the caller.
    fn post_send_ex(
        &self,
        qpx: NonNull<sys::ibv_qp_ex>,
        wrs: &[SendWr<'_>],
    ) -> Result<(), PostWrError> {
        let q = qpx.as_ptr();
        let refused = |why: &'static str| PostWrError {
            index: 0,
            failure: PostFailure::Invalid(why),
            source: None,
        };
        // SAFETY: the QP's `ibv_qp_ex`, alive as long as the QP; the provider set its
        // function pointers when it made the QP (libmlx5 swaps `wr_complete` on a move to
        // RESET or RTS, inside `ibv_modify_qp`: a post racing a modify is the program's
        // race, see `VerbsQp`'s `Sync`). They are read once here, each by value through
        // the raw pointer: no reference to the struct, whose `wr_id` and `wr_flags` posts
        // on other threads write (under the provider's lock, as below).
        let x = unsafe {
            ExFns {
                wr_start: (*q).wr_start,
                wr_complete: (*q).wr_complete,
                wr_set_sge: (*q).wr_set_sge,
                wr_set_sge_list: (*q).wr_set_sge_list,
                wr_set_inline_data: (*q).wr_set_inline_data,
                wr_rdma_write: (*q).wr_rdma_write,
                wr_rdma_write_imm: (*q).wr_rdma_write_imm,
                wr_rdma_read: (*q).wr_rdma_read,
                wr_send: (*q).wr_send,
                wr_send_imm: (*q).wr_send_imm,
                wr_atomic_cmp_swp: (*q).wr_atomic_cmp_swp,
                wr_atomic_fetch_add: (*q).wr_atomic_fetch_add,
            }
        };
        let (Some(start), Some(complete), Some(set_sge), Some(set_list), Some(set_inline)) = (
            x.wr_start,
            x.wr_complete,
            x.wr_set_sge,
            x.wr_set_sge_list,
            x.wr_set_inline_data,
        ) else {
            return Err(refused(
                "the provider's ibv_qp_ex lacks wr_start, wr_complete or a setter",
            ));
        };
        // Every builder the batch needs, before the batch is started: nothing between
        // `ibv_wr_start` and `ibv_wr_complete` may fail or return early (the provider holds
        // the send queue's lock in between).
        let has_builder = |wr: &SendWr<'_>| match wr.opcode {
            Opcode::RdmaWrite => x.wr_rdma_write.is_some(),
            Opcode::RdmaWriteWithImm => x.wr_rdma_write_imm.is_some(),
            Opcode::RdmaRead => x.wr_rdma_read.is_some(),
            Opcode::Send => x.wr_send.is_some(),
            Opcode::SendWithImm => x.wr_send_imm.is_some(),
            Opcode::AtomicCmpSwp { .. } => x.wr_atomic_cmp_swp.is_some(),
            Opcode::AtomicFetchAdd { .. } => x.wr_atomic_fetch_add.is_some(),
        };
        if !wrs.iter().all(has_builder) {
            return Err(refused(
                "the queue pair's ibv_qp_ex has no builder for an operation of the batch \
                 (made without it in its send_ops_flags)",
            ));
        }
        // Lists are handed over as `ibv_sge`s: converted into `scratch`, which the setter
        // copies from before it returns.
        let longest = wrs
            .iter()
            .map(|w| match w.local {
                Local::Sges(list) => list.len(),
                _ => 0,
            })
            .max()
            .unwrap_or(0);
        let mut stack = [sys::ibv_sge::default(); EX_SGES];
        let mut heap = Vec::new();
        let scratch: &mut [sys::ibv_sge] = if longest <= EX_SGES {
            &mut stack
        } else {
            heap.resize(longest, sys::ibv_sge::default());
            &mut heap
        };
        // SAFETY: from `ibv_wr_start` to `ibv_wr_complete` the calls are the provider's
        // builders and setters of this QP's `ibv_qp_ex` (checked present above), in the
        // order `ibv_wr_post(3)` asks: `wr_id` and `wr_flags` set, then one builder, then
        // one setter per work request; nothing in between can panic or return, so the
        // provider's send-queue lock taken by `wr_start` is always released by
        // `wr_complete`. The data the setters read (inline bytes, `scratch`) lives
        // through each call, and the providers copy it before returning (rxe's `memcpy`
        // into the WQE, libmlx5's data segments or inline copy).
        let rc = unsafe {
            start(q);
            for wr in wrs {
                let mut flags = 0;
                if wr.signaled {
                    flags |= sys::IBV_SEND_SIGNALED;
                }
                // rxe's kernel reads inline data from its WQE only with IBV_SEND_INLINE in
                // the flags, which its `wr_set_inline_data` does not set; libmlx5 ignores
                // it there (`_common_wqe_init_op` reads FENCE, SIGNALED, SOLICITED).
                if matches!(wr.local, Local::Inline(_)) {
                    flags |= sys::IBV_SEND_INLINE;
                }
                (*q).wr_id = wr.wr_id;
                (*q).wr_flags = flags;
                let (rkey, addr) = (wr.remote.rkey, wr.remote.addr);
                let imm = wr.imm_data.to_be();
                match wr.opcode {
                    Opcode::RdmaWrite => {
                        if let Some(f) = x.wr_rdma_write {
                            f(q, rkey, addr)
                        }
                    }
                    Opcode::RdmaWriteWithImm => {
                        if let Some(f) = x.wr_rdma_write_imm {
                            f(q, rkey, addr, imm)
                        }
                    }
                    Opcode::RdmaRead => {
                        if let Some(f) = x.wr_rdma_read {
                            f(q, rkey, addr)
                        }
                    }
                    Opcode::Send => {
                        if let Some(f) = x.wr_send {
                            f(q)
                        }
                    }
                    Opcode::SendWithImm => {
                        if let Some(f) = x.wr_send_imm {
                            f(q, imm)
                        }
                    }
                    Opcode::AtomicCmpSwp { compare, swap } => {
                        if let Some(f) = x.wr_atomic_cmp_swp {
                            f(q, rkey, addr, compare, swap)
                        }
                    }
                    Opcode::AtomicFetchAdd { add } => {
                        if let Some(f) = x.wr_atomic_fetch_add {
                            f(q, rkey, addr, add)
                        }
                    }
                }
                // Every work request gets a setter: libmlx5 finishes the WQE in it
                // (`_common_wqe_finalize`); one of no bytes adds no data segment (libmlx5)
                // and leaves the WQE's length 0 (rxe).
                match wr.local {
                    Local::Empty | Local::Sges([]) => set_sge(q, 0, 0, 0),
                    Local::Sge(s) => set_sge(q, s.lkey, s.addr, s.length),
                    Local::Sges(list) => {
                        let mut n = 0;
                        for (slot, s) in scratch.iter_mut().zip(list) {
                            *slot = sys::ibv_sge {
                                addr: s.addr,
                                length: s.length,
                                lkey: s.lkey,
                            };
                            n += 1;
                        }
                        set_list(q, n, scratch.as_ptr());
                    }
                    Local::Inline(data) => {
                        set_inline(q, data.as_ptr().cast_mut().cast(), data.len())
                    }
                }
            }
            complete(q)
        };
        if rc == 0 {
            return Ok(());
        }
        if self.dev.is_rxe() && rc != libc::ENOSPC {
            // rxe's doorbell failed after the producer index was stored: posted.
            return Err(PostWrError {
                index: wrs.len(),
                failure: PostFailure::AfterPosting,
                source: Some(io::Error::from_raw_os_error(errno_of(rc, None))),
            });
        }
        Err(batch_error(rc, wrs.len(), || self.state()))
    }

    /// Posts `wrs` as one `ibv_post_send` list built in `sges` (at least the entries of
    /// every work request, [`sge_count`]) and `raw` (at least `wrs.len()`).
    fn post_send_in(
        &self,
        wrs: &[SendWr<'_>],
        sges: &mut [MaybeUninit<sys::ibv_sge>],
        raw: &mut [MaybeUninit<sys::ibv_send_wr>],
    ) -> Result<(), PostWrError> {
        let base = raw.as_mut_ptr().cast::<sys::ibv_send_wr>();
        let sge_base = sges.as_mut_ptr().cast::<sys::ibv_sge>();
        let sge_room = sges.len();
        // The next free entry of `sges`.
        let mut next = 0usize;
        for (i, wr) in wrs.iter().enumerate() {
            let count = sge_count(wr);
            if next + count > sge_room {
                // The caller sized `sges` from the same count: never taken.
                return Err(PostWrError {
                    index: i,
                    failure: PostFailure::Other,
                    source: Some(io::Error::other(
                        "selsig-verbs: the post list's scatter/gather entries ran short",
                    )),
                });
            }
            let first = sge_base.wrapping_add(next);
            let put = |k: usize, sge: sys::ibv_sge| {
                // SAFETY: `next + k < next + count <= sges.len()` (checked above): the
                // entry is in `sges`, written through the pointer the list keeps (not
                // through the slice, which would retag the memory the list points at).
                unsafe { first.wrapping_add(k).write(sge) };
            };
            let inline = match wr.local {
                Local::Empty | Local::Sges(_) => false,
                Local::Sge(s) => {
                    put(
                        0,
                        sys::ibv_sge {
                            addr: s.addr,
                            length: s.length,
                            lkey: s.lkey,
                        },
                    );
                    false
                }
                Local::Inline(data) => {
                    put(
                        0,
                        sys::ibv_sge {
                            addr: data.as_ptr() as u64,
                            length: data.len() as u32,
                            lkey: 0,
                        },
                    );
                    true
                }
            };
            if let Local::Sges(list) = wr.local {
                for (k, s) in list.iter().enumerate() {
                    put(
                        k,
                        sys::ibv_sge {
                            addr: s.addr,
                            length: s.length,
                            lkey: s.lkey,
                        },
                    );
                }
            }
            let sg_list = if count > 0 {
                first
            } else {
                std::ptr::null_mut()
            };
            next += count;
            let rdma = sys::ibv_send_wr_wr {
                rdma: sys::ibv_rdma_info {
                    remote_addr: wr.remote.addr,
                    rkey: wr.remote.rkey,
                },
            };
            // `wr.atomic`: its rkey is not where `wr.rdma` keeps it.
            let atomic = |compare_add: u64, swap: u64| sys::ibv_send_wr_wr {
                atomic: sys::ibv_atomic_info {
                    remote_addr: wr.remote.addr,
                    compare_add,
                    swap,
                    rkey: wr.remote.rkey,
                },
            };
            let (opcode, info) = match wr.opcode {
                Opcode::RdmaWrite => (sys::IBV_WR_RDMA_WRITE, rdma),
                Opcode::RdmaWriteWithImm => (sys::IBV_WR_RDMA_WRITE_WITH_IMM, rdma),
                Opcode::RdmaRead => (sys::IBV_WR_RDMA_READ, rdma),
                Opcode::Send => (sys::IBV_WR_SEND, rdma),
                Opcode::SendWithImm => (sys::IBV_WR_SEND_WITH_IMM, rdma),
                Opcode::AtomicCmpSwp { compare, swap } => {
                    (sys::IBV_WR_ATOMIC_CMP_AND_SWP, atomic(compare, swap))
                }
                Opcode::AtomicFetchAdd { add } => {
                    (sys::IBV_WR_ATOMIC_FETCH_AND_ADD, atomic(add, 0))
                }
            };
            let mut flags = 0;
            if wr.signaled {
                flags |= sys::IBV_SEND_SIGNALED;
            }
            if inline {
                flags |= sys::IBV_SEND_INLINE;
            }
            // SAFETY: `i < wrs.len() <= raw.len()`, written through the list's base pointer
            // as the sges above.
            unsafe {
                base.wrapping_add(i).write(sys::ibv_send_wr {
                    wr_id: wr.wr_id,
                    next: if i + 1 < wrs.len() {
                        base.wrapping_add(i + 1)
                    } else {
                        std::ptr::null_mut()
                    },
                    sg_list,
                    // At most `max_send_sge` (a `u32` the provider gave from an `int`).
                    num_sge: i32::try_from(count).unwrap_or(i32::MAX),
                    opcode,
                    send_flags: flags,
                    imm_data: wr.imm_data.to_be(),
                    wr: info,
                    _qp_type: 0,
                    _bind_mw_or_tso: [0; 6],
                });
            }
        }
        let mut bad: *mut sys::ibv_send_wr = std::ptr::null_mut();
        let qp = self.qp.as_ptr();
        // SAFETY: `post_send` is the provider's function from the context's ops table (what
        // the static inline `ibv_post_send` calls). The first `wrs.len()` entries of `raw`
        // and the entries of `sges` they point at were written above and form the list;
        // they and the inline bytes they point at live until it returns (inline data is
        // copied during the call).
        let rc = unsafe {
            let Some(post) = (*(*qp).context).ops.post_send else {
                return Err(PostWrError {
                    index: 0,
                    failure: PostFailure::Other,
                    source: Some(io::Error::other("the provider has no post_send")),
                });
            };
            post(qp, base, &mut bad)
        };
        post_result(rc, bad, base, wrs.len(), Queue::Send, || self.state())
            .map_err(|e| provider_list_refusal(e, wrs))
    }
}

/// A provider's refusal of a scatter/gather list, named. The lists it would refuse for
/// their length are refused before the post ([`refused_up_front`], against the
/// `max_send_sge` read back at creation or, for a QP the program made, from
/// `ibv_query_qp`), so this is the provider disagreeing with what it reported: rxe answers
/// `EINVAL` for more entries than its `max_send_sge` (`validate_send_wr`), which is said;
/// libmlx5's `ENOMEM` (`wr->num_sge > qp->sq.qp_state_max_gs`, semantics 33) cannot be told
/// from a full queue and stays one.
fn provider_list_refusal(mut e: PostWrError, wrs: &[SendWr<'_>]) -> PostWrError {
    let list = wrs.get(e.index).is_some_and(|w| sge_count(w) > 1);
    if list && matches!(e.failure, PostFailure::Invalid(_)) {
        e.failure = PostFailure::Invalid(
            "a scatter/gather list rejected by the provider (EINVAL; rxe answers so for more \
             entries than its max_send_sge)",
        );
    }
    e
}

fn random_psn() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    (h.finish() as u32) & 0x00ff_ffff
}

impl QueuePair for VerbsQp {
    fn qp_num(&self) -> u32 {
        // SAFETY: the QP is valid until `Drop`; `qp_num` is set at creation.
        unsafe { (*self.qp.as_ptr()).qp_num }
    }

    fn caps(&self) -> QpCaps {
        self.caps
    }

    fn destroy_cleans_cq(&self) -> bool {
        self.dev.cleans_cq
    }

    fn send_cq_identity(&self) -> Option<usize> {
        Some(Arc::as_ptr(&self._send_cq) as usize)
    }

    fn recv_cq_is_send_cq(&self) -> bool {
        Arc::ptr_eq(&self._send_cq, &self._recv_cq)
    }

    fn sq_sig_all(&self) -> bool {
        self.sq_sig_all
    }

    fn state(&self) -> QpState {
        match self.query(sys::IBV_QP_STATE) {
            Some(attr) => state_name(attr.qp_state),
            // The state the last modify or query found.
            None => self.cached_state(),
        }
    }

    fn endpoint(&self, options: &ConnectOptions) -> Result<Endpoint, ProviderError> {
        self.check_options(options)?;
        Ok(Endpoint {
            qp_num: self.qp_num(),
            psn: self.local_psn(),
            lid: self.dev.lid,
            gid: self.dev.gid,
            mtu: options.mtu.min(self.dev.active_mtu),
            rd_atomic: responder_depth(self.dev.limits.as_ref()),
        })
    }

    fn connect(&self, remote: &Endpoint, options: &ConnectOptions) -> Result<(), ProviderError> {
        // Refused as bad input before anything changes.
        self.check_options(options)?;
        let port = self.dev.port;
        let mut a = sys::ibv_qp_attr {
            qp_state: sys::IBV_QPS_INIT,
            pkey_index: 0,
            port_num: port,
            qp_access_flags: options.access.bits(),
            ..Default::default()
        };
        self.modify(
            &mut a,
            sys::IBV_QP_STATE
                | sys::IBV_QP_PKEY_INDEX
                | sys::IBV_QP_PORT
                | sys::IBV_QP_ACCESS_FLAGS,
            QpState::Init,
            &format!("pkey_index 0, port {port}, access {}", options.access),
        )?;
        let gid_index = options.gid_index.or(self.dev.gid_index);
        let mtu = path_mtu(options.mtu, self.dev.active_mtu, remote.mtu);
        let responder = responder_depth(self.dev.limits.as_ref());
        let initiator = initiator_depth(self.dev.limits.as_ref(), remote.rd_atomic);
        let mut a = sys::ibv_qp_attr {
            qp_state: sys::IBV_QPS_RTR,
            path_mtu: mtu_enum(mtu),
            dest_qp_num: remote.qp_num,
            rq_psn: remote.psn & 0x00ff_ffff,
            max_dest_rd_atomic: responder,
            min_rnr_timer: 12,
            ah_attr: sys::ibv_ah_attr {
                grh: sys::ibv_global_route {
                    dgid: sys::ibv_gid { raw: remote.gid },
                    sgid_index: gid_index.unwrap_or(0),
                    hop_limit: 64,
                    ..Default::default()
                },
                dlid: remote.lid,
                is_global: u8::from(gid_index.is_some()),
                port_num: port,
                ..Default::default()
            },
            ..Default::default()
        };
        self.modify(
            &mut a,
            sys::IBV_QP_STATE
                | sys::IBV_QP_AV
                | sys::IBV_QP_PATH_MTU
                | sys::IBV_QP_DEST_QPN
                | sys::IBV_QP_RQ_PSN
                | sys::IBV_QP_MAX_DEST_RD_ATOMIC
                | sys::IBV_QP_MIN_RNR_TIMER,
            QpState::Rtr,
            &format!(
                "path_mtu {}, dest_qp_num {:#x}, rq_psn {:#x}, max_dest_rd_atomic {responder}, \
                 address vector (dlid {}, {})",
                mtu_bytes(mtu_enum(mtu)),
                remote.qp_num,
                remote.psn,
                remote.lid,
                match gid_index {
                    Some(i) => format!("sgid_index {i}, dgid {}", gid_text(&remote.gid)),
                    None => "no GRH".to_string(),
                }
            ),
        )?;
        let mut a = sys::ibv_qp_attr {
            qp_state: sys::IBV_QPS_RTS,
            timeout: 14,
            retry_cnt: options.retry_cnt,
            rnr_retry: options.rnr_retry,
            sq_psn: self.local_psn(),
            max_rd_atomic: initiator,
            ..Default::default()
        };
        self.modify(
            &mut a,
            sys::IBV_QP_STATE
                | sys::IBV_QP_TIMEOUT
                | sys::IBV_QP_RETRY_CNT
                | sys::IBV_QP_RNR_RETRY
                | sys::IBV_QP_SQ_PSN
                | sys::IBV_QP_MAX_QP_RD_ATOMIC,
            QpState::Rts,
            &format!(
                "timeout 14, retry_cnt {}, rnr_retry {}, sq_psn {:#x}, max_rd_atomic {initiator}",
                options.retry_cnt,
                options.rnr_retry,
                self.local_psn()
            ),
        )
    }

    fn to_error(&self) -> Result<(), ProviderError> {
        let mut a = sys::ibv_qp_attr {
            qp_state: sys::IBV_QPS_ERR,
            ..Default::default()
        };
        self.modify(&mut a, sys::IBV_QP_STATE, QpState::Err, "state ERR")
    }

    fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<(), PostWrError> {
        if wrs.is_empty() {
            return Ok(());
        }
        // The state the last modify or query found: below RTS a send queue takes nothing
        // (rxe would queue the work requests and run them after RTS while the post
        // reports them refused), nor in the error state before it ever reached RTS.
        let cached = self.cached_state();
        if takes_no_sends(cached, self.reached_rts.load(Ordering::Acquire)) {
            return Err(PostWrError {
                index: 0,
                failure: PostFailure::State(cached),
                source: None,
            });
        }
        if let Some((bad, failure)) = refused_up_front(
            wrs,
            self.caps.max_inline_data,
            self.caps.max_send_sge,
            self.dev.is_rxe(),
        ) {
            if self.qp_ex.is_some() {
                // The extended API posts a batch whole or not at all, as `ibv_wr_complete`
                // would have refused it for this work request (libmlx5 and rxe set their
                // batch error for an inline or a list too long).
                return Err(PostWrError {
                    index: 0,
                    failure,
                    source: Some(io::Error::other(format!(
                        "work request {bad} of a batch of {} (the extended post API posts a \
                         batch whole or not at all)",
                        wrs.len()
                    ))),
                });
            }
            // What comes before it is posted, as a provider's `bad_wr` would leave it. If
            // that post took them all and failed after (rxe's doorbell), they are posted
            // all the same: the refusal at `bad` is the error to report.
            if let Err(e) = self.post_send(&wrs[..bad])
                && e.index < bad
            {
                return Err(e);
            }
            return Err(PostWrError {
                index: bad,
                failure,
                source: None,
            });
        }
        if let Some(qpx) = self.qp_ex {
            // rxe's `wr_set_sge_list` before rdma-core 64 (fixed by 406cd2ad0, "rxe: Fix
            // dma.length computation in wr_set_sge_list") writes the first entry's length
            // times the entries as the message's length: a READ over entries of 40 and 60
            // bytes reads 80 and completes with byte_len 80 (seen on rxe0, rdma-core 44); a
            // message cut short so goes unnoticed, and one longer than its entries fails
            // in the kernel's `copy_data` (`IBV_WC_LOC_PROT_ERR`, as the fix's message
            // says; not seen here). A batch holding a list of unequal
            // entries goes through `ibv_post_send`, which sums them. (Not all-or-nothing
            // then, but nothing in it is refused after the checks above but a full queue,
            // which a tracker's accounting keeps from happening.)
            if !(self.dev.is_rxe() && wrs.iter().any(uneven_list)) {
                return self.post_send_ex(qpx, wrs);
            }
        }
        // Built in place, on the stack for the usual batch sizes (lists included, up to
        // `POST_INLINE_SGES` entries in all): no allocation, no copies.
        let entries: usize = wrs.iter().map(sge_count).sum();
        if wrs.len() <= POST_INLINE && entries <= POST_INLINE_SGES {
            let mut sges = [const { MaybeUninit::uninit() }; POST_INLINE_SGES];
            let mut raw = [const { MaybeUninit::uninit() }; POST_INLINE];
            self.post_send_in(wrs, &mut sges, &mut raw)
        } else {
            let mut sges = Vec::with_capacity(entries);
            sges.resize_with(entries, MaybeUninit::uninit);
            let mut raw = Vec::with_capacity(wrs.len());
            raw.resize_with(wrs.len(), MaybeUninit::uninit);
            self.post_send_in(wrs, &mut sges, &mut raw)
        }
    }

    fn post_recv(&self, wrs: &[RecvWr]) -> Result<(), PostWrError> {
        if wrs.is_empty() {
            return Ok(());
        }
        // A receive's completion with the `wr_id` a failed poll marks an unparsed
        // completion with could be lost (see `NO_WR_ID`): refused at its position, those
        // before it posted.
        if let Some(at) = wrs.iter().position(|w| w.wr_id == NO_WR_ID) {
            self.post_recv(&wrs[..at])?;
            return Err(PostWrError {
                index: at,
                failure: PostFailure::Invalid(
                    "a receive's wr_id cannot be u64::MAX (the verbs provider marks an \
                     unparsed completion with it)",
                ),
                source: None,
            });
        }
        let mut sges: Vec<sys::ibv_sge> = wrs
            .iter()
            .map(|w| {
                w.sge.map_or_else(sys::ibv_sge::default, |s| sys::ibv_sge {
                    addr: s.addr,
                    length: s.length,
                    lkey: s.lkey,
                })
            })
            .collect();
        let mut raw: Vec<sys::ibv_recv_wr> = wrs
            .iter()
            .map(|w| sys::ibv_recv_wr {
                wr_id: w.wr_id,
                next: std::ptr::null_mut(),
                sg_list: std::ptr::null_mut(),
                num_sge: i32::from(w.sge.is_some()),
            })
            .collect();
        let base = raw.as_mut_ptr();
        for i in 0..raw.len() {
            // SAFETY: as in `post_send`.
            unsafe {
                let w = base.add(i);
                if (*w).num_sge > 0 {
                    (*w).sg_list = sges.as_mut_ptr().add(i);
                }
                if i + 1 < wrs.len() {
                    (*w).next = base.add(i + 1);
                }
            }
        }
        let mut bad: *mut sys::ibv_recv_wr = std::ptr::null_mut();
        let qp = self.qp.as_ptr();
        // SAFETY: as in `post_send`, with the provider's `post_recv`.
        let rc = unsafe {
            let Some(post) = (*(*qp).context).ops.post_recv else {
                return Err(PostWrError {
                    index: 0,
                    failure: PostFailure::Other,
                    source: Some(io::Error::other("the provider has no post_recv")),
                });
            };
            post(qp, base, &mut bad)
        };
        let result = post_result(rc, bad, base, wrs.len(), Queue::Recv, || self.state());
        // A receive posted to a QP in the error state is flushed, as the error state does
        // with every work request; but rxe's kernel flushes a receive queue only when its
        // responder runs (the QP's move to ERR, a packet), and rxe's `post_recv` never
        // enters the kernel: the receive would never complete. Moving the QP to ERR again
        // runs the responder. (Should the NIC move the QP to ERR after this query, its own
        // flush takes the receive.)
        let posted = result.as_ref().map_or_else(|e| e.index, |()| wrs.len());
        if posted > 0 && self.dev.software && self.state() == QpState::Err {
            // Best effort: the receives are posted whatever this says.
            let _ = self.to_error();
        }
        result
    }
}

fn gid_text(gid: &[u8; 16]) -> String {
    gid.chunks(2)
        .map(|c| format!("{:02x}{:02x}", c[0], c[1]))
        .collect::<Vec<_>>()
        .join(":")
}

/// The path MTU: the smallest of what is asked, this port's active MTU and the peer's
/// (0: not known).
fn path_mtu(asked: u32, active: u32, remote: u32) -> u32 {
    let remote = if remote == 0 { u32::MAX } else { remote };
    asked.min(active).min(remote)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A peer that did not say its MTU leaves the smaller of what was asked and this
    /// port's: never more than the port takes.
    #[test]
    fn the_path_mtu_is_the_smallest_known() {
        assert_eq!(path_mtu(4096, 1024, 0), 1024);
        assert_eq!(path_mtu(1024, 4096, 0), 1024);
        assert_eq!(path_mtu(4096, 4096, 2048), 2048);
        assert_eq!(path_mtu(4096, 1024, 4096), 1024);
        assert_eq!(path_mtu(512, 1024, 2048), 512);
    }

    #[test]
    fn a_send_queue_takes_work_from_rts_on_and_in_the_error_state_only_after_rts() {
        for (state, reached_rts, refused) in [
            (QpState::Reset, false, true),
            (QpState::Init, false, true),
            (QpState::Rtr, false, true),
            (QpState::Rts, true, false),
            // mlx5 would answer ENOMEM for ever (its qp_state_max_gs is -1 until RTS).
            (QpState::Err, false, true),
            (QpState::Err, true, false),
            (QpState::Sqe, true, false),
        ] {
            assert_eq!(
                takes_no_sends(state, reached_rts),
                refused,
                "{state:?}, reached RTS: {reached_rts}"
            );
        }
    }

    #[test]
    fn reads_in_flight_are_what_the_device_allows_and_the_peer_serves() {
        let limits = |rd: u32, init: u32| Limits {
            max_qp_wr: 1,
            max_sge: 1,
            max_cqe: 1,
            max_mr_size: 1,
            max_qp_rd_atom: rd,
            max_qp_init_rd_atom: init,
        };
        // mlx5 reports 16 and 16, rxe 128 and 128.
        let mlx5 = limits(16, 16);
        assert_eq!(responder_depth(Some(&mlx5)), 16);
        assert_eq!(initiator_depth(Some(&mlx5), 128), 16);
        assert_eq!(initiator_depth(Some(&mlx5), 4), 4);
        // A peer that does not say serves one.
        assert_eq!(initiator_depth(Some(&mlx5), 0), 1);
        // The attributes are a byte wide; a device that does not say, or says 0, gets 1.
        assert_eq!(responder_depth(Some(&limits(1000, 1000))), 255);
        assert_eq!(initiator_depth(Some(&limits(1000, 1000)), 255), 255);
        assert_eq!(responder_depth(None), 1);
        assert_eq!(initiator_depth(None, 16), 1);
        assert_eq!(responder_depth(Some(&limits(0, 0))), 1);
        assert_eq!(initiator_depth(Some(&limits(0, 0)), 16), 1);
    }

    #[test]
    fn inline_work_requests_the_provider_must_not_see_are_found() {
        assert!(!too_long_for_an_sge(u32::MAX as usize));
        assert!(too_long_for_an_sge(u32::MAX as usize + 1));
        let small = [1u8; 8];
        let wr = SendWr {
            wr_id: 1,
            opcode: selsig::Opcode::RdmaWrite,
            local: Local::Inline(&small),
            remote: selsig::RemoteAddr { addr: 0, rkey: 0 },
            imm_data: 0,
            signaled: false,
        };
        assert_eq!(refused_up_front(&[wr, wr], 8, 1, false), None);
        assert_eq!(
            refused_up_front(&[wr, wr], 7, 1, false),
            Some((0, PostFailure::InlineTooLong { len: 8, max: 7 }))
        );
        let read = SendWr {
            opcode: selsig::Opcode::RdmaRead,
            ..wr
        };
        assert_eq!(
            refused_up_front(&[wr, read], 64, 1, false),
            Some((1, PostFailure::Invalid("an RDMA READ cannot be inline")))
        );
        // A QP of max_send_sge 0 takes work requests without data only (libmlx5 would
        // answer ENOMEM, a full queue to the caller, for ever).
        let empty = SendWr {
            local: Local::Empty,
            ..wr
        };
        let sge = SendWr {
            local: Local::Sge(selsig::Sge {
                addr: 0,
                length: 8,
                lkey: 1,
            }),
            ..wr
        };
        assert_eq!(refused_up_front(&[empty, empty], 0, 0, false), None);
        for data in [wr, sge] {
            assert_eq!(
                refused_up_front(&[empty, data], 64, 0, false),
                Some((
                    1,
                    PostFailure::Invalid(
                        "a scatter/gather entry on a queue pair of max_send_sge 0"
                    )
                ))
            );
        }
        // Atomics: never inline, at least 8 local bytes, and on rxe an aligned remote
        // address (its provider refuses the rest with EINVAL).
        let atomic = SendWr {
            opcode: selsig::Opcode::AtomicFetchAdd { add: 1 },
            remote: selsig::RemoteAddr { addr: 8, rkey: 2 },
            ..sge
        };
        assert_eq!(refused_up_front(&[atomic], 64, 1, true), None);
        let refused = |w: SendWr<'_>, rxe: bool| refused_up_front(&[atomic, w], 64, 1, rxe);
        assert_eq!(
            refused(
                SendWr {
                    local: Local::Inline(&small),
                    ..atomic
                },
                false
            ),
            Some((
                1,
                PostFailure::Invalid("an atomic operation cannot be inline")
            ))
        );
        let short = Local::Sge(selsig::Sge {
            addr: 0,
            length: 4,
            lkey: 1,
        });
        assert_eq!(
            refused(
                SendWr {
                    local: short,
                    ..atomic
                },
                false
            ),
            Some((
                1,
                PostFailure::Invalid("an atomic operation needs 8 bytes of local memory")
            ))
        );
        let misaligned = SendWr {
            remote: selsig::RemoteAddr { addr: 12, rkey: 2 },
            ..atomic
        };
        assert_eq!(
            refused(misaligned, false),
            None,
            "mlx5: the responder's to refuse"
        );
        assert_eq!(
            refused(misaligned, true),
            Some((
                1,
                PostFailure::Invalid(
                    "an atomic operation's remote address must be 8-byte aligned (rxe)"
                )
            ))
        );
    }

    /// A list longer than `max_send_sge` is refused at its position with the count and the
    /// limit (libmlx5 would answer ENOMEM, a full queue, rxe EINVAL); one that fits, an
    /// empty one included, is the provider's.
    #[test]
    fn lists_beyond_max_send_sge_are_refused_with_the_limit_named() {
        let e = |length| selsig::Sge {
            addr: 0x1000,
            length,
            lkey: 3,
        };
        let three = [e(64), e(128), e(32)];
        let list = |l: &'static [selsig::Sge]| SendWr {
            wr_id: 1,
            opcode: selsig::Opcode::RdmaWrite,
            local: Local::Sges(l),
            remote: selsig::RemoteAddr { addr: 0, rkey: 0 },
            imm_data: 0,
            signaled: false,
        };
        let three: &'static [selsig::Sge] = Box::leak(Box::new(three));
        assert_eq!(refused_up_front(&[list(three)], 0, 3, false), None);
        assert_eq!(refused_up_front(&[list(&[])], 0, 0, false), None);
        assert_eq!(
            refused_up_front(&[list(&three[..1]), list(three)], 0, 2, true),
            Some((1, PostFailure::TooManySges { count: 3, max: 2 }))
        );
        assert_eq!(
            refused_up_front(&[list(three)], 0, 0, false),
            Some((0, PostFailure::TooManySges { count: 3, max: 0 }))
        );
        let huge: &'static [selsig::Sge] = Box::leak(Box::new([e(u32::MAX), e(1)]));
        assert_eq!(
            refused_up_front(&[list(huge)], 0, 4, false),
            Some((
                0,
                PostFailure::Invalid("a scatter/gather list of 4 GiB or more")
            ))
        );
        // rxe's `wr_set_sge_list` before rdma-core 64 is right for lists of one length.
        assert!(uneven_list(&list(three)));
        assert!(!uneven_list(&list(&three[..1])));
        assert!(!uneven_list(&list(&[])));
        let even: &'static [selsig::Sge] = Box::leak(Box::new([e(8), e(8)]));
        assert!(!uneven_list(&list(even)));
        // Entries in the post list: a list's, one for data, none without.
        assert_eq!(sge_count(&list(three)), 3);
        assert_eq!(sge_count(&list(&[])), 0);
        let empty = SendWr {
            local: Local::Empty,
            ..list(three)
        };
        assert_eq!(sge_count(&empty), 0);
        assert_eq!(
            sge_count(&SendWr {
                local: Local::Inline(b"x"),
                ..empty
            }),
            1
        );
        // The provider's EINVAL at a list is said to be about the list; its ENOMEM stays a
        // full queue, as libmlx5's cannot be told apart.
        let refusal = |index, failure| PostWrError {
            index,
            failure,
            source: None,
        };
        let wrs = [empty, list(three)];
        let named = provider_list_refusal(refusal(1, PostFailure::Invalid("x")), &wrs);
        assert!(
            matches!(named.failure, PostFailure::Invalid(why) if why.contains("max_send_sge")),
            "{named:?}"
        );
        let full = provider_list_refusal(refusal(1, PostFailure::Full), &wrs);
        assert_eq!(full.failure, PostFailure::Full);
        let other = provider_list_refusal(refusal(0, PostFailure::Invalid("x")), &wrs);
        assert_eq!(other.failure, PostFailure::Invalid("x"));
    }

    #[test]
    fn gids_print_like_ibv_devinfo() {
        let mut g = [0u8; 16];
        g[10] = 0xff;
        g[11] = 0xff;
        g[12..].copy_from_slice(&[10, 77, 0, 1]);
        assert_eq!(gid_text(&g), "0000:0000:0000:0000:0000:ffff:0a4d:0001");
    }
}
