//! Connections through rdma_cm (`librdmacm.so.1`, loaded at run time as libibverbs is):
//! address and route resolution, the connection request and its answer with their private
//! data, and the disconnection, for a [`VerbsQp`] that selsig created itself.
//!
//! The queue pair is not librdmacm's (`rdma_create_qp` would make it on librdmacm's own
//! device context, and the QP selsig's driver posts to is made on the [`VerbsDevice`](crate::VerbsDevice)'s):
//! it is moved through INIT, RTR and RTS with the attributes `rdma_init_qp_attr` gives,
//! which is what librdmacm does to a QP of its own (`ucma_modify_qp_rtr`/`_rts` in
//! rdma-core's `librdmacm/cma.c`), and the active side completes the connection with
//! `rdma_establish`. So the QP must be on the device the route goes through: checked by
//! name, [`CmError::OtherDevice`] otherwise.
//!
//! Every id lives with its event channel, whose descriptor is read without blocking, under
//! a deadline: each wait ends with the event awaited, a named error, or
//! [`CmError::TimedOut`]. Each event is copied and acknowledged at once, so destroying an
//! id never waits.

use std::ffi::{CStr, c_int, c_void};
use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::ptr::NonNull;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use selsig::{ProviderError, QpState, QueuePair as _};

use crate::device::set_nonblocking;
use crate::error::report;
use crate::{VerbsQp, sys as verbs_sys};

pub mod sys;

/// librdmacm, loaded once per process.
fn cm() -> Result<&'static sys::Cm, CmError> {
    static CM: OnceLock<Result<sys::Cm, String>> = OnceLock::new();
    CM.get_or_init(sys::Cm::load).as_ref().map_err(|e| {
        CmError::Unavailable(format!(
            "cannot load {}: {e}. Install rdma-core's connection manager library \
             (Debian/Ubuntu: apt-get install librdmacm1; Fedora/RHEL: dnf install librdmacm)",
            sys::LIBRARY
        ))
    })
}

/// What went wrong on an rdma_cm connection. `to` is the peer's address, `source` the
/// errno of the call or of the event's status, `waiting` the step that was waiting.
#[derive(Debug)]
#[non_exhaustive]
#[allow(missing_docs)] // (the fields, told above)
pub enum CmError {
    /// librdmacm cannot be loaded, or lacks a function.
    Unavailable(String),
    /// A librdmacm call failed.
    Os {
        call: &'static str,
        source: io::Error,
    },
    /// The address could not be resolved to an RDMA device and a destination
    /// (`RDMA_CM_EVENT_ADDR_ERROR`): no route, or no RDMA device on it.
    NoAddress { to: SocketAddr, source: io::Error },
    /// No path to the destination (`RDMA_CM_EVENT_ROUTE_ERROR`).
    NoRoute { to: SocketAddr, source: io::Error },
    /// The peer refused the connection (`RDMA_CM_EVENT_REJECTED`): `reason` is the CM's
    /// reject reason (8, invalid service ID: nobody listens there; 28, consumer defined:
    /// the peer said no), `message` what the peer gave as private data, printable.
    Rejected {
        to: SocketAddr,
        reason: i32,
        message: String,
    },
    /// The peer did not answer the CM (`RDMA_CM_EVENT_UNREACHABLE`), or the connection
    /// could not be set up (`RDMA_CM_EVENT_CONNECT_ERROR`): `event` names which.
    Unreachable {
        to: SocketAddr,
        event: String,
        source: io::Error,
    },
    /// Nothing came within `wait`.
    TimedOut {
        waiting: &'static str,
        wait: Duration,
    },
    /// The peer disconnected (or went away) while something else was awaited.
    Disconnected { waiting: &'static str },
    /// An event (`event`, with its `status`) that has no place at this step.
    Unexpected {
        waiting: &'static str,
        event: String,
        status: i32,
    },
    /// The route goes through another device (`route`) than the queue pair's (`qp`).
    OtherDevice { route: String, qp: String },
    /// The queue pair could not be moved to the state the connection needs.
    Qp(ProviderError),
}

impl fmt::Display for CmError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CmError::Unavailable(why) => write!(f, "{why}"),
            CmError::Os { call, source } => write!(f, "{call} failed: {source}"),
            CmError::NoAddress { to, source } => write!(
                f,
                "rdma_cm cannot resolve {to} to an RDMA device (RDMA_CM_EVENT_ADDR_ERROR: \
                 {source}): no route to it through an RDMA device, or no host answers there"
            ),
            CmError::NoRoute { to, source } => write!(
                f,
                "rdma_cm found no route to {to} (RDMA_CM_EVENT_ROUTE_ERROR: {source})"
            ),
            CmError::Rejected {
                to,
                reason,
                message,
            } => {
                write!(
                    f,
                    "{to} rejected the rdma_cm connection (reject reason {reason}"
                )?;
                match (*reason, message.is_empty()) {
                    (8, _) => write!(f, ", invalid service ID: nobody listens on that port)"),
                    (_, true) => write!(f, ")"),
                    (_, false) => write!(f, "): {message}"),
                }
            }
            CmError::Unreachable { to, event, source } => {
                write!(
                    f,
                    "the rdma_cm connection to {to} failed ({event}: {source})"
                )
            }
            CmError::TimedOut { waiting, wait } => {
                write!(f, "rdma_cm: no {waiting} within {wait:?}")
            }
            CmError::Disconnected { waiting } => write!(
                f,
                "the peer disconnected (RDMA_CM_EVENT_DISCONNECTED) while this side waited \
                 for {waiting}"
            ),
            CmError::Unexpected {
                waiting,
                event,
                status,
            } => write!(
                f,
                "rdma_cm: {event} (status {status}) while this side waited for {waiting}"
            ),
            CmError::OtherDevice { route, qp } => write!(
                f,
                "the route goes through RDMA device {route}, and the queue pair is on {qp}: \
                 give -d {route}"
            ),
            CmError::Qp(e) => write!(f, "{e}"),
        }
    }
}

// The message tells the errno and the provider's error: no `source`, so that a chain of
// errors printed whole does not tell them twice.
impl std::error::Error for CmError {}

/// The error of a librdmacm call that returned -1 with `errno` set.
fn failed(call: &'static str) -> CmError {
    CmError::Os {
        call,
        source: io::Error::last_os_error(),
    }
}

/// A [`CmError::TimedOut`] of [`Channel::next`] told with the whole `wait`.
fn within(wait: Duration) -> impl Fn(CmError) -> CmError + Copy {
    move |e| match e {
        CmError::TimedOut { waiting, .. } => CmError::TimedOut { waiting, wait },
        e => e,
    }
}

/// An event's `status`, a negated errno, as an error.
fn status_error(status: i32) -> io::Error {
    io::Error::from_raw_os_error(status.saturating_abs())
}

/// An event channel: its descriptor does not block.
struct Channel {
    cm: &'static sys::Cm,
    ch: NonNull<sys::rdma_event_channel>,
}

// SAFETY: a channel is a file descriptor and librdmacm's bookkeeping of it, which its calls
// lock; it is owned here until `Drop`.
unsafe impl Send for Channel {}
// SAFETY: as above; `next` reads it from one thread at a time (`&mut`-free reads of a
// descriptor are thread-safe, and each event is owned by the reader that got it).
unsafe impl Sync for Channel {}

impl Drop for Channel {
    fn drop(&mut self) {
        // SAFETY: made by `rdma_create_event_channel`; every id on it was destroyed before
        // (each `Id` is dropped before the channel it was made on).
        unsafe { (self.cm.fns.destroy_event_channel)(self.ch.as_ptr()) }
    }
}

/// One event, copied out of librdmacm's (which is acknowledged at once).
struct Event {
    kind: c_int,
    status: i32,
    id: *mut sys::rdma_cm_id,
    private: Vec<u8>,
    responder_resources: u8,
    initiator_depth: u8,
}

impl Channel {
    fn new(cm: &'static sys::Cm) -> Result<Channel, CmError> {
        // SAFETY: no argument; NULL with errno set on failure.
        let ch = NonNull::new(unsafe { (cm.fns.create_event_channel)() })
            .ok_or_else(|| failed("rdma_create_event_channel"))?;
        let channel = Channel { cm, ch };
        // SAFETY: the channel is open; `fd` is its descriptor.
        let fd = unsafe { (*ch.as_ptr()).fd };
        set_nonblocking(fd).map_err(|source| CmError::Os {
            call: "fcntl(rdma_cm channel, O_NONBLOCK)",
            source,
        })?;
        Ok(channel)
    }

    /// The name librdmacm gives an event type.
    fn name(&self, kind: c_int) -> String {
        // SAFETY: `rdma_event_str` returns a static string for every value.
        unsafe { CStr::from_ptr((self.cm.fns.event_str)(kind)) }
            .to_string_lossy()
            .into_owned()
    }

    /// The next event, which must come before `deadline`.
    fn next(&self, deadline: Instant, waiting: &'static str) -> Result<Event, CmError> {
        // SAFETY: the channel is open while `self` lives.
        let fd = unsafe { (*self.ch.as_ptr()).fd };
        loop {
            let mut ev: *mut sys::rdma_cm_event = std::ptr::null_mut();
            // SAFETY: `ev` is filled with an event librdmacm allocated, which is copied and
            // then acknowledged (freed) before anything else reads it.
            let rc = unsafe { (self.cm.fns.get_cm_event)(self.ch.as_ptr(), &mut ev) };
            if rc == 0 && !ev.is_null() {
                // SAFETY: a valid event until acknowledged; its private data, when any, is
                // `private_data_len` bytes owned by the event.
                return Ok(unsafe {
                    let e = &*ev;
                    let conn = e.conn;
                    let private = if conn.private_data.is_null() {
                        Vec::new()
                    } else {
                        std::slice::from_raw_parts(
                            conn.private_data.cast::<u8>(),
                            usize::from(conn.private_data_len),
                        )
                        .to_vec()
                    };
                    let event = Event {
                        kind: e.event,
                        status: e.status,
                        id: e.id,
                        private,
                        responder_resources: conn.responder_resources,
                        initiator_depth: conn.initiator_depth,
                    };
                    (self.cm.fns.ack_cm_event)(ev);
                    event
                });
            }
            let e = io::Error::last_os_error();
            if !matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EINTR)) {
                return Err(CmError::Os {
                    call: "rdma_get_cm_event",
                    source: e,
                });
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(CmError::TimedOut {
                    waiting,
                    wait: Duration::ZERO,
                });
            }
            let mut pfd = libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            let ms = c_int::try_from(left.as_millis().saturating_add(1)).unwrap_or(c_int::MAX);
            // SAFETY: one valid `pollfd`.
            unsafe { libc::poll(&mut pfd, 1, ms) };
        }
    }
}

/// An rdma_cm id, destroyed on `Drop` (before its channel: see the owners' field order).
struct Id {
    cm: &'static sys::Cm,
    id: NonNull<sys::rdma_cm_id>,
}

// SAFETY: librdmacm's calls on an id lock what they share; the id is owned here until
// `Drop`.
unsafe impl Send for Id {}
// SAFETY: as above.
unsafe impl Sync for Id {}

impl Drop for Id {
    fn drop(&mut self) {
        // SAFETY: made by `rdma_create_id` or handed over by a connection request; every
        // event of it was acknowledged (`Channel::next`), so the destroy does not wait.
        if unsafe { (self.cm.fns.destroy_id)(self.id.as_ptr()) } != 0 {
            report(format_args!(
                "rdma_destroy_id failed: {}",
                io::Error::last_os_error()
            ));
        }
    }
}

impl Id {
    fn new(channel: &Channel) -> Result<Id, CmError> {
        let mut id = std::ptr::null_mut();
        // SAFETY: the channel is open; `id` is filled on success.
        let rc = unsafe {
            (channel.cm.fns.create_id)(
                channel.ch.as_ptr(),
                &mut id,
                std::ptr::null_mut(),
                sys::RDMA_PS_TCP,
            )
        };
        match NonNull::new(id) {
            Some(id) if rc == 0 => Ok(Id { cm: channel.cm, id }),
            _ => Err(failed("rdma_create_id")),
        }
    }

    /// The name of the RDMA device the id is bound to, if it is.
    fn device_name(&self) -> Option<String> {
        // SAFETY: `verbs` is NULL or a context librdmacm keeps open while the id lives;
        // its `device` is valid with it.
        unsafe {
            let ctx = (*self.id.as_ptr()).verbs;
            if ctx.is_null() {
                return None;
            }
            let v = crate::device::verbs().ok()?;
            let p = (v.fns.get_device_name)((*ctx).device);
            (!p.is_null()).then(|| CStr::from_ptr(p).to_string_lossy().into_owned())
        }
    }

    /// Moves `qp` through INIT, RTR and RTS with the attributes the CM gives for this
    /// connection (`rdma_init_qp_attr`), as librdmacm does to its own QPs
    /// (`ucma_modify_qp_rtr`, `ucma_modify_qp_rts`): `responder` and `initiator`, when
    /// given, replace `max_dest_rd_atomic` and `max_rd_atomic`.
    fn ready(
        &self,
        qp: &VerbsQp,
        responder: Option<u8>,
        initiator: Option<u8>,
    ) -> Result<(), CmError> {
        for (state, to) in [
            (verbs_sys::IBV_QPS_INIT, QpState::Init),
            (verbs_sys::IBV_QPS_RTR, QpState::Rtr),
            (verbs_sys::IBV_QPS_RTS, QpState::Rts),
        ] {
            let mut attr = verbs_sys::ibv_qp_attr {
                qp_state: state,
                ..Default::default()
            };
            let mut mask: c_int = 0;
            // SAFETY: the id is live; `attr` and `mask` are valid to fill.
            if unsafe { (self.cm.fns.init_qp_attr)(self.id.as_ptr(), &mut attr, &mut mask) } != 0 {
                return Err(failed("rdma_init_qp_attr"));
            }
            if to == QpState::Rtr {
                // librdmacm masks bits 21 to 24 off on InfiniBand (a kernel bug sets them
                // for RoCE): `ucma_modify_qp_rtr`.
                if !qp.dev.ethernet {
                    mask &= !0x00e0_0000;
                }
                if let Some(r) = responder {
                    attr.max_dest_rd_atomic = r;
                }
            }
            if let (QpState::Rts, Some(i)) = (to, initiator) {
                attr.max_rd_atomic = i;
            }
            let what = format!(
                "as rdma_init_qp_attr gives them (mask {mask:#x}; dest_qp_num {:#x}, \
                 max_dest_rd_atomic {}, max_rd_atomic {})",
                attr.dest_qp_num, attr.max_dest_rd_atomic, attr.max_rd_atomic
            );
            qp.modify(&mut attr, mask, to, &what).map_err(CmError::Qp)?;
        }
        Ok(())
    }
}

/// The RDMA device of the route must be the queue pair's.
fn same_device(id: &Id, qp: &VerbsQp) -> Result<(), CmError> {
    let theirs = qp.dev.ctx.name.clone();
    match id.device_name() {
        Some(route) if route != theirs => Err(CmError::OtherDevice { route, qp: theirs }),
        _ => Ok(()),
    }
}

/// A `sockaddr` for `addr`.
fn sockaddr(addr: &SocketAddr) -> libc::sockaddr_storage {
    // SAFETY: plain data, all zeros is a valid value.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: `sockaddr_storage` is larger than, and aligned for, `sockaddr_in`.
            unsafe { std::ptr::write((&raw mut storage).cast(), sin) };
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: as above, for `sockaddr_in6`.
            unsafe { std::ptr::write((&raw mut storage).cast(), sin6) };
        }
    }
    storage
}

/// How long the CM takes to resolve an address and a route, each.
const RESOLVE_MS: c_int = 2000;

/// An established connection: the id, on its own channel. Dropping it destroys the id
/// (the kernel then disconnects, if [`disconnect`](Self::disconnect) did not).
pub struct CmConnection {
    // Field order: the id is destroyed before its channel.
    id: Id,
    channel: Channel,
    /// `RDMA_CM_EVENT_DISCONNECTED` was read.
    disconnected: AtomicBool,
}

impl fmt::Debug for CmConnection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CmConnection")
            .field("disconnected", &self.disconnected.load(Ordering::Relaxed))
            .finish()
    }
}

impl CmConnection {
    /// Whether the peer disconnected (or went away: its kernel disconnects when the
    /// process ends), from the events pending now; reads without waiting.
    pub fn disconnected(&self) -> bool {
        while !self.disconnected.load(Ordering::Acquire) {
            match self.channel.next(Instant::now(), "an event") {
                Ok(e) if e.kind == sys::RDMA_CM_EVENT_DISCONNECTED => {
                    self.disconnected.store(true, Ordering::Release)
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
        self.disconnected.load(Ordering::Acquire)
    }

    /// Disconnects (`rdma_disconnect`) and waits up to `wait` for
    /// `RDMA_CM_EVENT_DISCONNECTED`, which comes when the peer answers (or disconnected
    /// first). The queue pair is the caller's: librdmacm moves only its own to the error
    /// state.
    pub fn disconnect(self, wait: Duration) -> Result<(), CmError> {
        let deadline = Instant::now() + wait;
        // SAFETY: the id is live and connected (or disconnected by the peer: then the call
        // answers its request, or fails, which the wait below tells apart).
        let rc = unsafe { (self.id.cm.fns.disconnect)(self.id.id.as_ptr()) };
        let error = (rc != 0).then(|| failed("rdma_disconnect"));
        while !self.disconnected.load(Ordering::Acquire) {
            let e = match self.channel.next(deadline, "RDMA_CM_EVENT_DISCONNECTED") {
                Ok(e) => e,
                Err(CmError::TimedOut { waiting, .. }) => {
                    return Err(error.unwrap_or(CmError::TimedOut { waiting, wait }));
                }
                Err(e) => return Err(e),
            };
            if e.kind == sys::RDMA_CM_EVENT_DISCONNECTED {
                self.disconnected.store(true, Ordering::Release);
            }
        }
        Ok(())
    }
}

/// The passive side: an id listening on an address, on its own channel.
pub struct CmListener {
    // Field order: the id is destroyed before its channel.
    id: Id,
    channel: Channel,
}

impl fmt::Debug for CmListener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CmListener")
            .field("port", &self.port())
            .finish()
    }
}

/// A connection request, not yet answered: [`CmListener::accept`] or
/// [`reject`](Self::reject) it. Dropped unanswered, its id is destroyed, and the kernel
/// rejects it.
pub struct CmRequest {
    id: Id,
    private: Vec<u8>,
    responder_resources: u8,
    initiator_depth: u8,
}

impl fmt::Debug for CmRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CmRequest")
            .field("private_data_len", &self.private.len())
            .field("responder_resources", &self.responder_resources)
            .field("initiator_depth", &self.initiator_depth)
            .finish()
    }
}

impl CmRequest {
    /// The private data of the request, as the kernel hands it over: the connecting side's
    /// bytes, then zeros up to the size the CM carries (56 bytes on InfiniBand and RoCE:
    /// docs/semantics.md).
    pub fn private_data(&self) -> &[u8] {
        &self.private
    }

    /// Rejects the request (`rdma_reject`) with `message` as private data (cut at 148
    /// bytes, what a REJ carries).
    pub fn reject(self, message: &[u8]) -> Result<(), CmError> {
        let len = message.len().min(REJECT_PRIVATE_DATA);
        // SAFETY: the id is a live connection request; `message` holds `len` bytes.
        let rc = unsafe {
            (self.id.cm.fns.reject)(self.id.id.as_ptr(), message.as_ptr().cast(), len as u8)
        };
        if rc != 0 {
            return Err(failed("rdma_reject"));
        }
        Ok(())
    }
}

/// The most private data an InfiniBand/RoCE REJ carries (`IB_CM_REJ_PRIVATE_DATA_SIZE`).
const REJECT_PRIVATE_DATA: usize = 148;

impl CmListener {
    /// Listens with rdma_cm on `addr` (port 0: a port of the kernel's choosing,
    /// [`port`](Self::port)).
    pub fn bind(addr: SocketAddr) -> Result<CmListener, CmError> {
        let cm = cm()?;
        let channel = Channel::new(cm)?;
        let id = Id::new(&channel)?;
        let mut sa = sockaddr(&addr);
        // SAFETY: the id is live; `sa` is a valid address of its family.
        if unsafe { (cm.fns.bind_addr)(id.id.as_ptr(), (&raw mut sa).cast()) } != 0 {
            return Err(failed("rdma_bind_addr"));
        }
        // SAFETY: the id is bound.
        if unsafe { (cm.fns.listen)(id.id.as_ptr(), 4) } != 0 {
            return Err(failed("rdma_listen"));
        }
        Ok(CmListener { id, channel })
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        // SAFETY: the id is live.
        u16::from_be(unsafe { (self.id.cm.fns.get_src_port)(self.id.id.as_ptr()) })
    }

    /// The next connection request, which must come within `wait`.
    pub fn request(&self, wait: Duration) -> Result<CmRequest, CmError> {
        let deadline = Instant::now() + wait;
        loop {
            let e = self
                .channel
                .next(deadline, "connection request")
                .map_err(within(wait))?;
            if e.kind != sys::RDMA_CM_EVENT_CONNECT_REQUEST {
                continue;
            }
            let Some(id) = NonNull::new(e.id) else {
                continue;
            };
            return Ok(CmRequest {
                id: Id { cm: self.id.cm, id },
                private: e.private,
                responder_resources: e.responder_resources,
                initiator_depth: e.initiator_depth,
            });
        }
    }

    /// Accepts `request` for `qp` (which must be on the route's device, in the RESET or
    /// INIT state), with `private` as the accept's private data (at most 196 bytes), and
    /// waits up to `wait` for the connection to be established. The responder resources
    /// and initiator depth are negotiated as librdmacm's `rdma_accept` does: the request's,
    /// at most what the device allows (`max_qp_rd_atom`, `max_qp_init_rd_atom`). The QP is
    /// in RTS before the accept leaves. The listener ends here: no other request is taken.
    pub fn accept(
        self,
        request: CmRequest,
        qp: &VerbsQp,
        private: &[u8],
        wait: Duration,
    ) -> Result<CmConnection, CmError> {
        let deadline = Instant::now() + wait;
        // (Until the accept is sent, an early return drops `request`, then `self`: every
        // id before the channel it is on.)
        let CmRequest {
            ref id,
            responder_resources,
            initiator_depth,
            ..
        } = request;
        same_device(id, qp)?;
        let cap = |max: Option<u32>, asked: u8| {
            max.map_or(asked, |m| asked.min(u8::try_from(m).unwrap_or(u8::MAX)))
        };
        let limits = qp.dev.limits.as_ref();
        let responder = cap(limits.map(|l| l.max_qp_rd_atom), responder_resources);
        let initiator = cap(limits.map(|l| l.max_qp_init_rd_atom), initiator_depth);
        id.ready(qp, Some(responder), Some(initiator))?;
        let len = u8::try_from(private.len()).map_err(|_| CmError::Os {
            call: "rdma_accept",
            source: io::Error::from_raw_os_error(libc::EINVAL),
        })?;
        let mut param = sys::rdma_conn_param {
            private_data: private.as_ptr().cast::<c_void>(),
            private_data_len: len,
            responder_resources: responder,
            initiator_depth: initiator,
            flow_control: 1,
            retry_count: 0,
            rnr_retry_count: 7,
            srq: 0,
            qp_num: qp.qp_num(),
        };
        // SAFETY: the id is a live connection request; `param` and its private data are
        // valid for the call.
        if unsafe { (id.cm.fns.accept)(id.id.as_ptr(), &mut param) } != 0 {
            return Err(failed("rdma_accept"));
        }
        // No other request is taken from here: the listening id is destroyed, its channel
        // becomes the connection's.
        let CmListener {
            id: listen,
            channel,
        } = self;
        drop(listen);
        let conn = CmConnection {
            id: request.id,
            channel,
            disconnected: AtomicBool::new(false),
        };
        loop {
            let e = conn
                .channel
                .next(deadline, "RDMA_CM_EVENT_ESTABLISHED")
                .map_err(within(wait))?;
            if e.id != conn.id.id.as_ptr() {
                // A request that came meanwhile: its id is destroyed (the kernel rejects
                // it).
                if e.kind == sys::RDMA_CM_EVENT_CONNECT_REQUEST
                    && let Some(other) = NonNull::new(e.id)
                {
                    drop(Id {
                        cm: conn.id.cm,
                        id: other,
                    });
                }
                continue;
            }
            match e.kind {
                sys::RDMA_CM_EVENT_ESTABLISHED => return Ok(conn),
                sys::RDMA_CM_EVENT_DISCONNECTED => {
                    return Err(CmError::Disconnected {
                        waiting: "RDMA_CM_EVENT_ESTABLISHED",
                    });
                }
                kind => {
                    return Err(CmError::Unexpected {
                        waiting: "RDMA_CM_EVENT_ESTABLISHED",
                        event: conn.channel.name(kind),
                        status: e.status,
                    });
                }
            }
        }
    }
}

/// Connects `qp` to the rdma_cm listener at `to`: resolves the address (which must lead
/// to `qp`'s device) and the route, sends the connection request with `private` as its
/// private data (at most 56 bytes on InfiniBand and RoCE), moves the QP to RTS with the
/// answer's attributes and completes the connection (`rdma_establish`). Returns the
/// connection and the private data of the peer's accept (zero-padded by the kernel to
/// 196 bytes). The responder resources and initiator depth asked are the device's
/// (`RDMA_MAX_RESP_RES`, `RDMA_MAX_INIT_DEPTH`: librdmacm fills them in); the QP takes
/// what the peer's accept gives. `retry` is the QP's `retry_cnt` and `rnr_retry`.
pub fn connect(
    qp: &VerbsQp,
    to: SocketAddr,
    private: &[u8],
    (retry_cnt, rnr_retry): (u8, u8),
    wait: Duration,
) -> Result<(CmConnection, Vec<u8>), CmError> {
    let cm = cm()?;
    let establish = cm.fns.establish.ok_or_else(|| {
        CmError::Unavailable(format!(
            "{} has no rdma_establish (rdma-core 28 or later has it)",
            sys::LIBRARY
        ))
    })?;
    let deadline = Instant::now() + wait;
    let channel = Channel::new(cm)?;
    let id = Id::new(&channel)?;
    let conn = CmConnection {
        id,
        channel,
        disconnected: AtomicBool::new(false),
    };
    let expect = |want: c_int, waiting: &'static str| -> Result<Event, CmError> {
        let e = conn.channel.next(deadline, waiting)?;
        if e.kind == want {
            return Ok(e);
        }
        let source = status_error(e.status);
        Err(match e.kind {
            sys::RDMA_CM_EVENT_ADDR_ERROR => CmError::NoAddress { to, source },
            sys::RDMA_CM_EVENT_ROUTE_ERROR => CmError::NoRoute { to, source },
            sys::RDMA_CM_EVENT_REJECTED => CmError::Rejected {
                to,
                reason: e.status,
                message: printable(&e.private),
            },
            sys::RDMA_CM_EVENT_UNREACHABLE | sys::RDMA_CM_EVENT_CONNECT_ERROR => {
                CmError::Unreachable {
                    to,
                    event: conn.channel.name(e.kind),
                    source,
                }
            }
            sys::RDMA_CM_EVENT_DISCONNECTED => CmError::Disconnected { waiting },
            kind => CmError::Unexpected {
                waiting,
                event: conn.channel.name(kind),
                status: e.status,
            },
        })
    };
    let timed = within(wait);
    let mut dst = sockaddr(&to);
    // SAFETY: the id is live; `dst` is a valid address of its family; no source address.
    let rc = unsafe {
        (cm.fns.resolve_addr)(
            conn.id.id.as_ptr(),
            std::ptr::null_mut(),
            (&raw mut dst).cast(),
            RESOLVE_MS,
        )
    };
    if rc != 0 {
        return Err(CmError::NoAddress {
            to,
            source: io::Error::last_os_error(),
        });
    }
    expect(
        sys::RDMA_CM_EVENT_ADDR_RESOLVED,
        "RDMA_CM_EVENT_ADDR_RESOLVED",
    )
    .map_err(timed)?;
    same_device(&conn.id, qp)?;
    // SAFETY: the id's address is resolved.
    if unsafe { (cm.fns.resolve_route)(conn.id.id.as_ptr(), RESOLVE_MS) } != 0 {
        return Err(CmError::NoRoute {
            to,
            source: io::Error::last_os_error(),
        });
    }
    expect(
        sys::RDMA_CM_EVENT_ROUTE_RESOLVED,
        "RDMA_CM_EVENT_ROUTE_RESOLVED",
    )
    .map_err(timed)?;
    let len = u8::try_from(private.len()).map_err(|_| CmError::Os {
        call: "rdma_connect",
        source: io::Error::from_raw_os_error(libc::EINVAL),
    })?;
    let mut param = sys::rdma_conn_param {
        private_data: private.as_ptr().cast::<c_void>(),
        private_data_len: len,
        responder_resources: sys::RDMA_MAX_RESP_RES,
        initiator_depth: sys::RDMA_MAX_INIT_DEPTH,
        flow_control: 1,
        retry_count: retry_cnt.min(7),
        rnr_retry_count: rnr_retry.min(7),
        srq: 0,
        qp_num: qp.qp_num(),
    };
    // SAFETY: the id's route is resolved; `param` and its private data are valid for the
    // call.
    if unsafe { (cm.fns.connect)(conn.id.id.as_ptr(), &mut param) } != 0 {
        return Err(failed("rdma_connect"));
    }
    let answer = expect(
        sys::RDMA_CM_EVENT_CONNECT_RESPONSE,
        "the answer to the connection request",
    )
    .map_err(timed)?;
    conn.id.ready(qp, None, None)?;
    // SAFETY: the id has just had its connection response, and no QP of librdmacm's.
    if unsafe { establish(conn.id.id.as_ptr()) } != 0 {
        return Err(failed("rdma_establish"));
    }
    Ok((conn, answer.private))
}

/// Bytes a peer sent, as printable text: control characters dropped, trailing NULs (the
/// kernel's padding) cut, at most 148 characters.
fn printable(bytes: &[u8]) -> String {
    let end = bytes.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
    String::from_utf8_lossy(&bytes[..end])
        .chars()
        .filter(|c| !c.is_control())
        .take(REJECT_PRIVATE_DATA)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peers_reject_message_is_printable_and_bounded() {
        assert_eq!(printable(b"bad token\0\0\0"), "bad token");
        assert_eq!(printable(b"\x1b[31mred\x07\0"), "[31mred");
        assert_eq!(printable(&[0; 148]), "");
        assert_eq!(printable(&[b'a'; 300]).len(), 148);
    }

    #[test]
    fn an_ipv4_address_is_a_sockaddr_in_in_network_order() {
        let s = sockaddr(&"10.77.0.1:18700".parse().unwrap());
        // SAFETY: `sockaddr` wrote a `sockaddr_in` there.
        let sin: libc::sockaddr_in = unsafe { std::ptr::read((&raw const s).cast()) };
        assert_eq!(sin.sin_family, libc::AF_INET as libc::sa_family_t);
        assert_eq!(u16::from_be(sin.sin_port), 18700);
        assert_eq!(sin.sin_addr.s_addr.to_ne_bytes(), [10, 77, 0, 1]);
    }

    #[test]
    fn errors_name_what_failed() {
        let to: SocketAddr = "10.77.0.2:7000".parse().unwrap();
        let e = CmError::Rejected {
            to,
            reason: 8,
            message: String::new(),
        };
        assert!(e.to_string().contains("nobody listens on that port"), "{e}");
        let e = CmError::Rejected {
            to,
            reason: 28,
            message: "bad token".into(),
        };
        assert!(
            e.to_string().ends_with("(reject reason 28): bad token"),
            "{e}"
        );
        let e = CmError::NoAddress {
            to,
            source: io::Error::from_raw_os_error(libc::ETIMEDOUT),
        };
        assert!(
            e.to_string().contains("cannot resolve 10.77.0.2:7000"),
            "{e}"
        );
    }
}
