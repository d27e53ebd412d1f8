//! Completion queues: polling through the provider's `poll_cq`, a chunk at a time, the
//! decoding of work completions, and completion events through the CQ's completion
//! channel.

use std::ffi::{c_int, c_void};
use std::io;
use std::mem::MaybeUninit;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

use selsig::{CompletionQueue, CqError, ProviderError, WcOpcode, WcStatus, WorkCompletion};

use crate::device::{Context, VerbsDevice, set_nonblocking};
use crate::error::{destroy_error, errno_of, report};
use crate::sys;

#[cfg(doc)]
use selsig::AsyncEvent;

/// A CQ's completion channel (`ibv_comp_channel`), its descriptor made non-blocking. It
/// is the CQ's alone: made with it and destroyed after it ([`Device::create_cq`]), or the
/// program's ([`VerbsCq::from_raw_with_channel`]), as the CQ is.
///
/// [`Device::create_cq`]: selsig::Device::create_cq
pub(crate) struct Channel {
    pub(crate) channel: NonNull<sys::ibv_comp_channel>,
    /// The channel's descriptor, as it was when the CQ was wrapped (libibverbs never
    /// changes it).
    pub(crate) fd: c_int,
}

pub(crate) struct CqInner {
    pub(crate) cq: NonNull<sys::ibv_cq>,
    pub(crate) ctx: Arc<Context>,
    /// A failure of `poll_cq` after completions of the same call were handed over: the
    /// next poll reports it (0: none).
    pub(crate) failed: AtomicI32,
    /// The completion channel, where the CQ gives events.
    pub(crate) channel: Option<Channel>,
    /// Created here (with its channel), and destroyed on `Drop`; else the program's
    /// ([`VerbsCq::from_raw`], [`VerbsCq::from_raw_with_channel`]).
    pub(crate) owned: bool,
}

// SAFETY: `ibv_poll_cq` is thread-safe in rdma-core's providers (libmlx5
// unless `MLX5_SINGLE_THREADED=1`, which `VerbsDevice::open` refuses); so are
// `ibv_req_notify_cq`, and `ibv_get_cq_event` (one `read()` of the channel's descriptor)
// and `ibv_ack_cq_events` (under the CQ's mutex).
unsafe impl Send for CqInner {}
// SAFETY: as above.
unsafe impl Sync for CqInner {}

impl Drop for CqInner {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        // SAFETY: every QP using this CQ holds an `Arc<CqInner>`: none is left. Every
        // event taken from the channel was acknowledged by `take_events` before it
        // returned, so `ibv_destroy_cq`, which waits for those acknowledgements, does not
        // wait.
        let rc = unsafe { (self.ctx.v.fns.destroy_cq)(self.cq.as_ptr()) };
        if rc != 0 {
            report(format_args!(
                "ibv_destroy_cq failed: {}{}",
                destroy_error(rc),
                if self.channel.is_some() {
                    " (its completion channel is left, as the CQ still uses it)"
                } else {
                    ""
                }
            ));
            return;
        }
        if let Some(channel) = &self.channel {
            // SAFETY: the channel was made for this CQ alone, which is destroyed: nothing
            // uses it any more (libibverbs refuses with EBUSY while a CQ does).
            let rc = unsafe { (self.ctx.v.fns.destroy_comp_channel)(channel.channel.as_ptr()) };
            if rc != 0 {
                report(format_args!(
                    "ibv_destroy_comp_channel failed: {}",
                    destroy_error(rc)
                ));
            }
        }
    }
}

impl CqInner {
    fn channel(&self) -> Result<&Channel, CqError> {
        self.channel.as_ref().ok_or(CqError::NoEvents)
    }
}

/// A completion queue.
///
/// A CQ the provider made ([`Device::create_cq`](selsig::Device::create_cq)) has a
/// completion channel of its own, whose descriptor is non-blocking: it gives completion
/// events ([`CompletionQueue::req_notify`], [`event_fd`](CompletionQueue::event_fd),
/// [`take_events`](CompletionQueue::take_events),
/// [`wait_event`](CompletionQueue::wait_event)). A program's CQ wrapped with
/// [`from_raw`](Self::from_raw) gives none ([`CqError::NoEvents`]); one wrapped with
/// [`from_raw_with_channel`](Self::from_raw_with_channel) gives them through the
/// program's channel.
pub struct VerbsCq {
    pub(crate) inner: Arc<CqInner>,
}

impl VerbsCq {
    /// A completion queue the program created itself (`ibv_create_cq`) on `dev`'s context,
    /// for [`VerbsQp::from_raw`](crate::VerbsQp::from_raw): polled as any other, and never
    /// destroyed here. It gives no completion events ([`CqError::NoEvents`]), whether or
    /// not it was made with a channel: see
    /// [`from_raw_with_channel`](Self::from_raw_with_channel).
    ///
    /// # Safety
    ///
    /// `cq` is a live CQ of `dev`'s context, and stays so until the returned CQ and every
    /// queue pair wrapped with it are dropped. Whoever polls it through this handle polls it
    /// alone (a completion polled elsewhere is lost to selsig).
    pub unsafe fn from_raw(
        dev: &VerbsDevice,
        cq: *mut sys::ibv_cq,
    ) -> Result<VerbsCq, ProviderError> {
        // SAFETY: the caller's contract.
        unsafe { Self::wrap(dev, cq, None) }
    }

    /// A completion queue the program created itself with its own completion channel
    /// (`ibv_create_cq(ctx, cqe, cq_context, channel, comp_vector)`), as
    /// [`from_raw`](Self::from_raw), that also gives completion events through `channel`:
    /// [`req_notify`](CompletionQueue::req_notify) arms the CQ,
    /// [`take_events`](CompletionQueue::take_events) and
    /// [`wait_event`](CompletionQueue::wait_event) read the channel (and acknowledge every
    /// event they read, `ibv_ack_cq_events`), [`event_fd`](CompletionQueue::event_fd) is
    /// its descriptor. Neither the CQ nor the channel is destroyed here.
    ///
    /// **The channel's descriptor is made non-blocking** (`O_NONBLOCK`): from here a
    /// program's own `ibv_get_cq_event` on it fails with `EAGAIN` instead of waiting when no
    /// event is pending. A CQ made with another channel than `channel`, or with none, is
    /// refused.
    ///
    /// The channel must serve this CQ alone. `ibv_get_cq_event` names the CQ of each event
    /// it reads: an event of another CQ on the same channel is a breach of this contract
    /// that is still handled without harm: it is acknowledged (so that the other CQ can be
    /// destroyed), lost to the program, and the call that read it fails with
    /// [`CqError::Event`].
    ///
    /// # Safety
    ///
    /// As [`from_raw`](Self::from_raw) for `cq`; and `channel` is the live completion
    /// channel `cq` was made with, and stays so until the returned CQ and every queue pair
    /// wrapped with it are dropped. Every event the program reads from the channel itself
    /// it acknowledges itself (an event read is then lost to this handle).
    pub unsafe fn from_raw_with_channel(
        dev: &VerbsDevice,
        cq: *mut sys::ibv_cq,
        channel: *mut sys::ibv_comp_channel,
    ) -> Result<VerbsCq, ProviderError> {
        let channel = NonNull::new(channel).ok_or(ProviderError::Invalid {
            what: "completion channel",
            why: "it is NULL".to_string(),
        })?;
        if let Some(c) = NonNull::new(cq) {
            // SAFETY: a live CQ (the caller's contract).
            let made_with = unsafe { (*c.as_ptr()).channel };
            if made_with != channel.as_ptr() {
                return Err(ProviderError::Invalid {
                    what: "completion channel",
                    why: if made_with.is_null() {
                        "the CQ was made without a completion channel".to_string()
                    } else {
                        "the CQ was made with another completion channel".to_string()
                    },
                });
            }
        }
        // SAFETY: a live channel (the caller's contract), whose `fd` libibverbs set when it
        // made it and never changes.
        let fd = unsafe { (*channel.as_ptr()).fd };
        // SAFETY: the caller's contract, for `cq` and `channel`; the channel is `cq`'s
        // (checked above; `wrap` refuses a NULL `cq`).
        let wrapped = unsafe { Self::wrap(dev, cq, Some(Channel { channel, fd })) }?;
        set_nonblocking(fd).map_err(|source| ProviderError::Os {
            verb: "fcntl(completion channel fd, O_NONBLOCK)",
            source,
        })?;
        Ok(wrapped)
    }

    /// The program's CQ `cq`, checked to be of `dev`'s context, with `channel` if any.
    ///
    /// # Safety
    ///
    /// As [`from_raw`](Self::from_raw) (and
    /// [`from_raw_with_channel`](Self::from_raw_with_channel) for a channel).
    unsafe fn wrap(
        dev: &VerbsDevice,
        cq: *mut sys::ibv_cq,
        channel: Option<Channel>,
    ) -> Result<VerbsCq, ProviderError> {
        let cq = NonNull::new(cq).ok_or(ProviderError::Invalid {
            what: "completion queue",
            why: "it is NULL".to_string(),
        })?;
        // SAFETY: a live CQ (the caller's contract).
        let context = unsafe { (*cq.as_ptr()).context };
        if context != dev.ctx.ctx.as_ptr() {
            return Err(ProviderError::Invalid {
                what: "completion queue",
                why: format!(
                    "it belongs to another device context than {}'s",
                    dev.ctx.name
                ),
            });
        }
        Ok(VerbsCq {
            inner: Arc::new(CqInner {
                cq,
                ctx: Arc::clone(&dev.ctx),
                failed: AtomicI32::new(0),
                channel,
                owned: false,
            }),
        })
    }

    /// The CQ's handle, as in [`AsyncEvent::CqErr`].
    pub fn handle(&self) -> u32 {
        // SAFETY: the CQ is valid until `Drop`.
        unsafe { (*self.inner.cq.as_ptr()).handle }
    }
}

/// A completion as `ibv_poll_cq` wrote it, for a program that polls its CQ itself (the C
/// library, a QP created elsewhere). Only the fields `ibv_poll_cq(3)` defines for it are
/// kept, the others are 0 (`None`); a status this crate does not know becomes
/// `IBV_WC_GENERAL_ERR`, an opcode it does not know `None`.
impl From<&sys::ibv_wc> for WorkCompletion {
    #[inline]
    fn from(wc: &sys::ibv_wc) -> WorkCompletion {
        decode(wc)
    }
}

/// The fields of a completion that `ibv_poll_cq(3)` defines for it; the others are 0
/// (`None`): providers leave them unwritten (mlx5 writes no `byte_len` for a WRITE, no
/// `imm_data` for a send with immediate though it sets `IBV_WC_WITH_IMM`, semantics 35, no
/// `vendor_err` on success). A status this crate
/// does not know becomes `IBV_WC_GENERAL_ERR`, an opcode it does not know `None`.
fn decode(wc: &sys::ibv_wc) -> WorkCompletion {
    let status = WcStatus::try_from(wc.status).unwrap_or(WcStatus::GeneralErr);
    let opcode = if status.is_success() {
        WcOpcode::try_from(wc.opcode).ok()
    } else {
        None
    };
    let recv = opcode.is_some_and(WcOpcode::is_recv);
    WorkCompletion {
        wr_id: wc.wr_id,
        status,
        opcode,
        byte_len: if opcode.is_some_and(WcOpcode::has_byte_len) {
            wc.byte_len
        } else {
            0
        },
        qp_num: wc.qp_num,
        imm_data: (recv && wc.wc_flags & sys::IBV_WC_WITH_IMM != 0)
            .then(|| u32::from_be(wc.imm_data)),
        vendor_err: if status.is_success() {
            0
        } else {
            wc.vendor_err
        },
    }
}

impl CompletionQueue for VerbsCq {
    fn capacity(&self) -> u32 {
        // SAFETY: the CQ is valid until `Drop`; `cqe` is the real size, set at creation.
        unsafe { (*self.inner.cq.as_ptr()).cqe.max(0) as u32 }
    }

    fn identity(&self) -> Option<usize> {
        Some(Arc::as_ptr(&self.inner) as usize)
    }

    fn poll(&self, out: &mut [WorkCompletion]) -> Result<usize, CqError> {
        let cq = self.inner.cq.as_ptr();
        // SAFETY: the CQ is valid until `Drop`; `context` and its ops table live as long.
        let Some(poll) = (unsafe { (*(*cq).context).ops.poll_cq }) else {
            return Err(CqError::Os(io::Error::other("the provider has no poll_cq")));
        };
        // SAFETY: `poll_cq` is the provider's function from the context's ops table (what
        // the static inline `ibv_poll_cq` calls), and `cq` is its CQ.
        unsafe { poll_chunks(poll, cq, &self.inner.failed, out) }
    }

    fn req_notify(&self) -> Result<(), CqError> {
        self.inner.channel()?;
        let cq = self.inner.cq.as_ptr();
        // SAFETY: the CQ is valid until `Drop`; `context` and its ops table live as long.
        let Some(arm) = (unsafe { (*(*cq).context).ops.req_notify_cq }) else {
            return Err(CqError::Event(io::Error::other(
                "the provider has no req_notify_cq",
            )));
        };
        // SAFETY: `req_notify_cq` is the provider's function from the context's ops table
        // (what the static inline `ibv_req_notify_cq` calls), and `cq` is its CQ.
        let rc = unsafe { arm(cq, 0) };
        if rc != 0 {
            // `ibv_req_notify_cq(3)`: "the value of errno on failure"; a provider that
            // returns -1 sets `errno` (read right after the call).
            let errno = io::Error::last_os_error().raw_os_error();
            return Err(CqError::Event(io::Error::from_raw_os_error(errno_of(
                rc, errno,
            ))));
        }
        Ok(())
    }

    #[cfg(unix)]
    fn event_fd(&self) -> Option<std::os::fd::RawFd> {
        self.inner.channel.as_ref().map(|c| c.fd)
    }

    fn take_events(&self) -> Result<u32, CqError> {
        let channel = self.inner.channel()?;
        let fns = &self.inner.ctx.v.fns;
        let mine = self.inner.cq.as_ptr();
        let mut taken: u32 = 0;
        let mut failure = None;
        loop {
            let mut cq: *mut sys::ibv_cq = std::ptr::null_mut();
            let mut cq_context: *mut c_void = std::ptr::null_mut();
            // SAFETY: the channel is alive while this CQ is (made with it, or the caller's
            // contract of `from_raw_with_channel`), and its descriptor is non-blocking: the
            // call reads one event, or fails at once (EAGAIN when none is pending).
            let rc =
                unsafe { (fns.get_cq_event)(channel.channel.as_ptr(), &mut cq, &mut cq_context) };
            if rc != 0 {
                let e = io::Error::last_os_error();
                match e.kind() {
                    io::ErrorKind::WouldBlock => {}
                    io::ErrorKind::Interrupted => continue,
                    _ => failure = Some(e),
                }
                break;
            }
            if cq == mine {
                taken = taken.saturating_add(1);
            } else if !cq.is_null() {
                // An event of another CQ on this channel: a breach of
                // `from_raw_with_channel`'s contract. Acknowledged, so that the other CQ
                // can still be destroyed (its destroy waits for it).
                // SAFETY: `cq` is the CQ the kernel named for an event it queued on this
                // channel: a live CQ of this context (libibverbs has just read its
                // `cq_context` and called its provider's `cq_event`), which stays alive
                // until the event is acknowledged.
                unsafe { (fns.ack_cq_events)(cq, 1) };
                failure.get_or_insert_with(|| {
                    io::Error::other(
                        "an event of another CQ came through this CQ's completion channel \
                         (a channel given to VerbsCq::from_raw_with_channel must serve that \
                         CQ alone): it was acknowledged, and is lost to its CQ",
                    )
                });
            }
        }
        if taken > 0 {
            // SAFETY: this CQ, valid until `Drop`; `taken` events of it were read above.
            unsafe { (fns.ack_cq_events)(mine, taken) };
        }
        match failure {
            Some(e) => Err(CqError::Event(e)),
            None => Ok(taken),
        }
    }

    /// Reads the device's asynchronous events (keeping them for
    /// [`poll_async_event`](selsig::Device::poll_async_event)) for `IBV_EVENT_DEVICE_FATAL`.
    /// On a program's own context ([`VerbsDevice::from_raw`](crate::VerbsDevice::from_raw))
    /// the events are the program's: this says `false`, and the program that reads
    /// `IBV_EVENT_DEVICE_FATAL` tells its queues
    /// ([`SignaledQueue::device_lost`](selsig::SignaledQueue::device_lost)).
    fn device_lost(&self) -> bool {
        self.inner.ctx.lost()
    }

    fn wait_event(&self, timeout: Option<Duration>) -> Result<u32, CqError> {
        let fd = self.inner.channel()?.fd;
        // No deadline: no limit (a timeout too long for the clock is none either).
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        loop {
            let ms = match deadline {
                Some(d) => poll_ms(d.saturating_duration_since(Instant::now())),
                None => -1,
            };
            let mut pfd = libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one `pollfd`, valid for the call.
            let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
            if rc < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue; // with the time left
                }
                return Err(CqError::Event(e));
            }
            if rc > 0 {
                if pfd.revents & libc::POLLNVAL != 0 {
                    return Err(CqError::Event(io::Error::other(
                        "the completion channel's descriptor is not open (POLLNVAL)",
                    )));
                }
                let n = self.take_events()?;
                if n > 0 {
                    return Ok(n);
                }
                if pfd.revents & (libc::POLLERR | libc::POLLHUP) != 0 {
                    return Err(CqError::Event(io::Error::other(
                        "the completion channel's descriptor reports an error or hang-up",
                    )));
                }
                // Readable, yet nothing to take: another thread took the event first.
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(0);
            }
        }
    }
}

/// `poll(2)`'s timeout for `left`: whole milliseconds, rounded up (a wait never ends
/// before the time is out), at most `c_int::MAX` (the caller waits again for the rest).
fn poll_ms(left: Duration) -> c_int {
    c_int::try_from(left.as_nanos().div_ceil(1_000_000)).unwrap_or(c_int::MAX)
}

/// Polls `out.len()` completions at most through `poll`, a chunk at a time through a
/// buffer on the stack: no lock, no allocation. A failure after completions of the same
/// call (earlier chunks, or entries of the failing provider call that carry a status) is
/// kept in `failed` for the next call, and those completions are handed over.
///
/// # Safety
///
/// `poll(cq, n, wc)` must behave as a provider's `poll_cq`: write at most `n` entries at
/// `wc` and return how many completions it polled, or a negative value.
unsafe fn poll_chunks(
    poll: sys::PollCq,
    cq: *mut sys::ibv_cq,
    failed: &AtomicI32,
    out: &mut [WorkCompletion],
) -> Result<usize, CqError> {
    let was = failed.swap(0, Ordering::Relaxed);
    if was != 0 {
        return Err(poll_failure(was));
    }
    let mut raw = [const { MaybeUninit::<sys::ibv_wc>::uninit() }; POLL_CHUNK];
    let mut polled = 0;
    while polled < out.len() {
        let want = (out.len() - polled).min(POLL_CHUNK);
        // Providers write only the fields a completion defines (mlx5: not `byte_len` for a
        // WRITE, not `vendor_err` on success): the others must read as 0, not as whatever
        // the stack or an earlier chunk left there. The status, which every completion
        // has, starts as no status at all: a failed call's completions are those that
        // have one.
        raw[..want].fill(MaybeUninit::new(sys::ibv_wc {
            wr_id: NO_WR_ID,
            status: NO_STATUS,
            ..sys::ibv_wc::default()
        }));
        // SAFETY: `poll` writes at most `want` entries at the start of `raw`, which has
        // room for them (the caller's contract; `MaybeUninit<T>` has `T`'s layout).
        let rc = unsafe { poll(cq, want as c_int, raw.as_mut_ptr().cast()) };
        let n = match usize::try_from(rc) {
            Ok(n) => n.min(want),
            // mlx5 returns -2 for a completion it cannot parse after consuming those before
            // it in the same call (and the one it failed on): they are in `raw`, each with
            // its status written. The failing one has no status, or (an error completion of
            // a QP it does not know) a status but no wr_id.
            Err(_) => {
                // SAFETY: every entry was initialized above.
                let entry = |i: usize| unsafe { raw[i].assume_init_ref() };
                let written = (0..want)
                    .take_while(|&i| entry(i).status != NO_STATUS)
                    .count();
                match written.checked_sub(1) {
                    Some(last) if entry(last).wr_id == NO_WR_ID => last,
                    _ => written,
                }
            }
        };
        for (o, w) in out[polled..].iter_mut().zip(&raw[..n]) {
            // SAFETY: the first `want` entries were initialized above (integers only); the
            // provider then wrote some of their fields.
            *o = decode(unsafe { w.assume_init_ref() });
        }
        polled += n;
        if rc < 0 {
            if polled > 0 {
                // Hand over what was polled; the next call reports the failure (mlx5
                // consumed the completion it could not parse: it would not fail again).
                failed.store(rc, Ordering::Relaxed);
                break;
            }
            return Err(poll_failure(rc));
        }
        if n < want {
            break;
        }
    }
    Ok(polled)
}

/// An `ibv_wc.status` no provider writes (the statuses run from 0 to 21).
const NO_STATUS: std::ffi::c_uint = std::ffi::c_uint::MAX;

/// The `wr_id` a polled entry starts with: a completion that fails to parse has none
/// written. (A queue's sends reach it only at sequence number 2^63 - 1, and a receive with
/// it is refused; a real completion with it, last in a failed call, would be taken for the
/// failing one.)
pub(crate) const NO_WR_ID: u64 = u64::MAX;

/// A negative return of `poll_cq`: `ibv_poll_cq(3)` promises only "negative", not an
/// errno (mlx5 returns -2 for a completion it cannot parse).
fn poll_failure(n: c_int) -> CqError {
    CqError::Os(io::Error::other(format!(
        "ibv_poll_cq failed (returned {n})"
    )))
}

/// Completions polled per call to the provider's `poll_cq`.
const POLL_CHUNK: usize = 32;

#[cfg(test)]
mod tests {
    use super::*;

    use std::ffi::c_uint;

    #[test]
    fn poll_waits_whole_milliseconds_rounded_up() {
        assert_eq!(poll_ms(Duration::ZERO), 0);
        assert_eq!(poll_ms(Duration::from_nanos(1)), 1);
        assert_eq!(poll_ms(Duration::from_millis(100)), 100);
        assert_eq!(poll_ms(Duration::from_micros(100_001)), 101);
        // Beyond what poll(2) takes: the most it takes (the waiter waits again).
        assert_eq!(poll_ms(Duration::from_secs(u64::MAX)), c_int::MAX);
    }

    #[test]
    fn completions_decode_without_panics() {
        let mut wc = sys::ibv_wc {
            wr_id: 7,
            status: 0,
            opcode: 129,
            byte_len: 12,
            imm_data: 42u32.to_be(),
            wc_flags: sys::IBV_WC_WITH_IMM,
            qp_num: 3,
            ..Default::default()
        };
        let d = decode(&wc);
        assert_eq!(
            (d.wr_id, d.status, d.opcode, d.imm_data),
            (
                7,
                WcStatus::Success,
                Some(WcOpcode::RecvRdmaWithImm),
                Some(42)
            )
        );
        wc.status = 999;
        assert_eq!(decode(&wc).status, WcStatus::GeneralErr);
        wc.status = 10;
        assert_eq!(
            decode(&wc).opcode,
            None,
            "an error completion's opcode is meaningless"
        );
    }

    /// Writes `n` receive completions of 64 bytes (wr_id 1000, 1001, ...) and only their
    /// `wr_id`, `status`, `opcode` and `byte_len`: `wc_flags`, `imm_data`, `qp_num` are
    /// left as they were (as mlx5 leaves a WRITE's `byte_len` and a success's `vendor_err`).
    unsafe extern "C" fn writes_some_fields(
        _cq: *mut sys::ibv_cq,
        n: c_int,
        wc: *mut sys::ibv_wc,
    ) -> c_int {
        for i in 0..n as usize {
            // SAFETY: the poll loop passes room for `n` entries.
            unsafe {
                let w = wc.add(i);
                (&raw mut (*w).wr_id).write(1000 + i as u64);
                (&raw mut (*w).status).write(WcStatus::Success as c_uint);
                (&raw mut (*w).opcode).write(WcOpcode::Recv as c_uint);
                (&raw mut (*w).byte_len).write(64);
            }
        }
        n
    }

    /// As mlx5 when the third completion names no QP it knows: writes two completions
    /// (wr_id 1, 2), the third's `qp_num` but no status, and returns -2, then on the next
    /// call one completion (wr_id 4), as the failing one was consumed.
    unsafe extern "C" fn fails_on_the_third(
        _cq: *mut sys::ibv_cq,
        n: c_int,
        wc: *mut sys::ibv_wc,
    ) -> c_int {
        static CALLS: AtomicI32 = AtomicI32::new(0);
        let write = |i: usize, wr_id: u64| {
            // SAFETY: the poll loop passes room for `n` entries; `i < n` below.
            unsafe {
                let w = wc.add(i);
                (&raw mut (*w).wr_id).write(wr_id);
                (&raw mut (*w).status).write(WcStatus::Success as c_uint);
                (&raw mut (*w).opcode).write(WcOpcode::RdmaWrite as c_uint);
                (&raw mut (*w).qp_num).write(7);
            }
        };
        assert!(n >= 3);
        if CALLS.fetch_add(1, Ordering::Relaxed) == 0 {
            write(0, 1);
            write(1, 2);
            // SAFETY: as above.
            unsafe { (&raw mut (*wc.add(2)).qp_num).write(0x99) };
            -2
        } else {
            write(0, 4);
            1
        }
    }

    /// Writes `n` RDMA READ completions of 4096 bytes with a value in every field, those a
    /// successful READ does not define included (a provider that copies whole entries, as
    /// rxe does, may leave any there).
    unsafe extern "C" fn reads(_cq: *mut sys::ibv_cq, n: c_int, wc: *mut sys::ibv_wc) -> c_int {
        for i in 0..n as usize {
            // SAFETY: the poll loop passes room for `n` entries.
            unsafe {
                wc.add(i).write(sys::ibv_wc {
                    wr_id: i as u64,
                    status: WcStatus::Success as c_uint,
                    opcode: WcOpcode::RdmaRead as c_uint,
                    vendor_err: 0x55,
                    byte_len: 4096,
                    imm_data: 0xabab_abab,
                    qp_num: 7,
                    src_qp: 0xabab,
                    wc_flags: sys::IBV_WC_WITH_IMM,
                    pkey_index: 0xabab,
                    slid: 0xabab,
                    sl: 0xab,
                    dlid_path_bits: 0xab,
                })
            };
        }
        n
    }

    /// Fills the stack below the caller with a pattern, where a later call's buffer lies.
    #[inline(never)]
    fn smear_stack() {
        let mut junk = [0xabu8; 16 << 10];
        std::hint::black_box(&mut junk);
    }

    fn poll_with(poll: sys::PollCq, n: usize) -> Vec<WorkCompletion> {
        let mut out = vec![WorkCompletion::new(0, WcStatus::GeneralErr, 0); n];
        smear_stack();
        // SAFETY: the fake `poll` functions write at most the entries asked for and ignore
        // the CQ.
        let k = unsafe { poll_chunks(poll, std::ptr::null_mut(), &AtomicI32::new(0), &mut out) }
            .unwrap();
        out.truncate(k);
        out
    }

    /// As mlx5 when the third completion is an error completion of a QP it does not know:
    /// its status and `qp_num` are written, not its `wr_id`.
    unsafe extern "C" fn fails_on_an_error_completion(
        _cq: *mut sys::ibv_cq,
        n: c_int,
        wc: *mut sys::ibv_wc,
    ) -> c_int {
        assert!(n >= 3);
        for i in 0..3 {
            // SAFETY: the poll loop passes room for `n` entries; `i < 3 <= n`.
            unsafe {
                let w = wc.add(i);
                if i < 2 {
                    (&raw mut (*w).wr_id).write(i as u64 + 1);
                }
                let status = if i < 2 {
                    WcStatus::Success
                } else {
                    WcStatus::WrFlushErr
                };
                (&raw mut (*w).status).write(status as c_uint);
                (&raw mut (*w).qp_num).write(if i < 2 { 7 } else { 0x99 });
            }
        }
        -2
    }

    #[test]
    fn a_failed_error_completion_is_not_handed_over() {
        let failed = AtomicI32::new(0);
        let mut out = vec![WorkCompletion::new(0, WcStatus::GeneralErr, 0); 8];
        // SAFETY: the fake writes at most the entries asked for and ignores the CQ.
        let n = unsafe {
            poll_chunks(
                fails_on_an_error_completion,
                std::ptr::null_mut(),
                &failed,
                &mut out,
            )
        }
        .unwrap();
        assert_eq!(
            out[..n]
                .iter()
                .map(|w| (w.wr_id, w.qp_num))
                .collect::<Vec<_>>(),
            [(1, 7), (2, 7)]
        );
        assert_eq!(
            failed.load(Ordering::Relaxed),
            -2,
            "reported with the next poll"
        );
    }

    /// mlx5 consumes the completions before one it cannot parse, and that one, and returns
    /// -2: the completions it wrote are handed over, the failure comes with the next call,
    /// and the call after goes on behind the one that failed.
    #[test]
    fn completions_before_a_failed_one_in_the_same_call_are_kept() {
        let failed = AtomicI32::new(0);
        let mut out = vec![WorkCompletion::new(0, WcStatus::GeneralErr, 0); 8];
        let mut poll = || {
            // SAFETY: the fake writes at most the entries asked for and ignores the CQ.
            unsafe { poll_chunks(fails_on_the_third, std::ptr::null_mut(), &failed, &mut out) }
        };
        assert_eq!(poll().unwrap(), 2);
        assert!(poll().is_err(), "the failure is reported once");
        assert_eq!(poll().unwrap(), 1);
        assert_eq!(out[0].wr_id, 4);
    }

    #[test]
    fn fields_a_provider_leaves_unwritten_read_as_zero() {
        // 40 completions: a chunk of 32 and one of 8 (wr_ids from 1000 again), on a stack
        // full of a pattern.
        let wcs = poll_with(writes_some_fields, 40);
        assert_eq!(wcs.len(), 40);
        for (i, wc) in wcs.iter().enumerate() {
            assert_eq!(
                *wc,
                WorkCompletion {
                    opcode: Some(WcOpcode::Recv),
                    byte_len: 64,
                    ..WorkCompletion::new(1000 + (i % 32) as u64, WcStatus::Success, 0)
                },
                "completion {i}"
            );
        }
    }

    #[test]
    fn only_the_fields_a_completion_defines_are_reported() {
        // A READ defines its length; a send completion never carries immediate data, and
        // a success no vendor syndrome.
        let wcs = poll_with(reads, 3);
        assert_eq!(
            wcs[2],
            WorkCompletion {
                opcode: Some(WcOpcode::RdmaRead),
                byte_len: 4096,
                ..WorkCompletion::new(2, WcStatus::Success, 7)
            }
        );
        let recv = sys::ibv_wc {
            wr_id: 9,
            opcode: WcOpcode::RecvRdmaWithImm as c_uint,
            byte_len: 64,
            imm_data: 0xfeed_u32.to_be(),
            qp_num: 7,
            wc_flags: sys::IBV_WC_WITH_IMM,
            vendor_err: 0x55,
            ..Default::default()
        };
        assert_eq!(
            decode(&recv),
            WorkCompletion {
                opcode: Some(WcOpcode::RecvRdmaWithImm),
                byte_len: 64,
                imm_data: Some(0xfeed),
                ..WorkCompletion::new(9, WcStatus::Success, 7)
            }
        );
        // An error completion: no opcode, no length, its syndrome.
        let failed = sys::ibv_wc {
            status: WcStatus::RemAccessErr as c_uint,
            ..recv
        };
        assert_eq!(
            decode(&failed),
            WorkCompletion {
                vendor_err: 0x55,
                ..WorkCompletion::new(9, WcStatus::RemAccessErr, 7)
            }
        );
    }
}
