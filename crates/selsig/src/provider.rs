//! The provider interface: the verbs objects selsig needs, and nothing more.
//!
//! A provider gives access to RDMA devices: a device (`ibv_context`) allocates protection
//! domains, registers memory regions, creates completion queues and RC queue pairs. Two
//! providers implement it: `selsig-soft` (a software NIC in the process) and
//! `selsig-verbs` (rdma-core's libibverbs).
//!
//! The interface mirrors verbs closely, so that code written against it behaves the same
//! on both: real capacities are read back after creation, `post_send` reports which work
//! request failed, a completion queue is polled into the caller's buffer.

use std::fmt;
use std::io;
use std::time::{Duration, Instant};

use crate::wc::WorkCompletion;

bitflags::bitflags! {
    /// Access flags of a memory region or queue pair (`enum ibv_access_flags`).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct Access: u32 {
        /// The NIC may write the region locally (RECV buffers, RDMA READ targets).
        const LOCAL_WRITE = 1;
        /// Remote peers may RDMA WRITE into the region.
        const REMOTE_WRITE = 1 << 1;
        /// Remote peers may RDMA READ the region.
        const REMOTE_READ = 1 << 2;
        /// Remote peers may perform atomics on the region.
        const REMOTE_ATOMIC = 1 << 3;
    }
}

impl fmt::Display for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            return f.write_str("none");
        }
        let mut first = true;
        for (name, _) in self.iter_names() {
            if !first {
                f.write_str("|")?;
            }
            first = false;
            f.write_str(&name.to_ascii_lowercase())?;
        }
        Ok(())
    }
}

/// The state of a queue pair (`enum ibv_qp_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum QpState {
    /// Just created.
    Reset = 0,
    /// Initialized: receives may be posted.
    Init = 1,
    /// Ready to receive.
    Rtr = 2,
    /// Ready to send.
    Rts = 3,
    /// Send queue drained.
    Sqd = 4,
    /// Send queue error.
    Sqe = 5,
    /// Error: every outstanding work request is flushed.
    Err = 6,
}

impl QpState {
    /// The lowercase name used in traces and messages.
    pub const fn as_str(self) -> &'static str {
        match self {
            QpState::Reset => "reset",
            QpState::Init => "init",
            QpState::Rtr => "rtr",
            QpState::Rts => "rts",
            QpState::Sqd => "sqd",
            QpState::Sqe => "sqe",
            QpState::Err => "err",
        }
    }
}

impl TryFrom<u32> for QpState {
    type Error = crate::wc::UnknownValue;
    fn try_from(v: u32) -> Result<Self, Self::Error> {
        Ok(match v {
            0 => QpState::Reset,
            1 => QpState::Init,
            2 => QpState::Rtr,
            3 => QpState::Rts,
            4 => QpState::Sqd,
            5 => QpState::Sqe,
            6 => QpState::Err,
            value => {
                return Err(crate::wc::UnknownValue {
                    what: "ibv_qp_state",
                    value,
                });
            }
        })
    }
}

impl fmt::Display for QpState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Queue-pair capacities: requested at creation, then the real values read back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct QpCaps {
    /// Send-queue slots (`cap.max_send_wr`).
    pub max_send_wr: u32,
    /// Receive-queue slots (`cap.max_recv_wr`).
    pub max_recv_wr: u32,
    /// Scatter/gather entries per send work request.
    pub max_send_sge: u32,
    /// Scatter/gather entries per receive work request.
    pub max_recv_sge: u32,
    /// Largest inline payload in bytes.
    pub max_inline_data: u32,
}

impl Default for QpCaps {
    fn default() -> Self {
        QpCaps {
            max_send_wr: 64,
            max_recv_wr: 64,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        }
    }
}

/// What to create a queue pair with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpInit {
    /// Requested capacities.
    pub caps: QpCaps,
    /// `sq_sig_all`: every work request produces a completion.
    pub sq_sig_all: bool,
}

/// Where a queue pair can be reached: what two peers exchange to connect (like perftest
/// and `ibv_rc_pingpong` do over TCP).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Endpoint {
    /// The QP number.
    pub qp_num: u32,
    /// The first packet sequence number (24 bits).
    pub psn: u32,
    /// The port's LID (InfiniBand; 0 on RoCE).
    pub lid: u16,
    /// The GID (RoCE, or global routing on InfiniBand).
    pub gid: [u8; 16],
    /// The largest path MTU this side takes, in bytes (its port's active MTU, or less if
    /// asked); 0 when not known. The peer uses at most this: a larger packet would be
    /// dropped.
    pub mtu: u32,
    /// How many RDMA READs and atomics this side's QP serves at once as the responder
    /// (its `max_dest_rd_atomic`); 0 when not known, which the peer reads as 1. The peer
    /// keeps at most this many in flight (its `max_rd_atomic`): more would be refused.
    pub rd_atomic: u8,
}

/// Connection parameters of the local side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectOptions {
    /// The port to use (1-based).
    pub port: u8,
    /// The GID index for RoCE v2 / global routing; `None` for a LID-routed InfiniBand path.
    pub gid_index: Option<u8>,
    /// What the peer may do to this QP's memory (`qp_access_flags`).
    pub access: Access,
    /// The path MTU in bytes (256 … 4096); providers use the smaller of this and the
    /// port's active MTU. Default 4096: the active MTU, as perftest uses it (a smaller
    /// MTU splits each message into more packets).
    pub mtu: u32,
    /// Transport retries before `IBV_WC_RETRY_EXC_ERR` (0–7). The kernel's rxe never
    /// counts 7 down: a work request to a peer that does not answer then waits until the
    /// QP is moved to the error state (the IB specification gives 7 that meaning only for
    /// `rnr_retry`).
    pub retry_cnt: u8,
    /// RNR retries before `IBV_WC_RNR_RETRY_EXC_ERR` (0–7; 7 retries forever).
    pub rnr_retry: u8,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        ConnectOptions {
            port: 1,
            gid_index: None,
            access: Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
            mtu: 4096,
            retry_cnt: 7,
            rnr_retry: 7,
        }
    }
}

impl ConnectOptions {
    /// Checks the ranges documented on the fields: `retry_cnt` and `rnr_retry` 0–7 (a
    /// 3-bit field: mlx5 would take 8 as 0), `mtu` 256–4096 (the IB MTUs), `port` from 1.
    /// Providers call it before they change anything.
    pub fn check(&self) -> Result<(), ProviderError> {
        let invalid = |what, why: String| Err(ProviderError::Invalid { what, why });
        if self.retry_cnt > 7 {
            return invalid(
                "retry_cnt",
                format!("{}: the range is 0 to 7", self.retry_cnt),
            );
        }
        if self.rnr_retry > 7 {
            return invalid(
                "rnr_retry",
                format!(
                    "{}: the range is 0 to 7 (7 retries forever)",
                    self.rnr_retry
                ),
            );
        }
        if !(256..=4096).contains(&self.mtu) {
            return invalid(
                "MTU",
                format!("{} bytes: the range is 256 to 4096", self.mtu),
            );
        }
        if self.port == 0 {
            return invalid("port", "0: ports are numbered from 1".to_string());
        }
        Ok(())
    }
}

/// A local scatter/gather entry: bytes of a registered memory region.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Sge {
    /// The address (in the region's address space, as `ibv_sge.addr`).
    pub addr: u64,
    /// The length in bytes.
    pub length: u32,
    /// The region's local key.
    pub lkey: u32,
}

/// A remote address: what an RDMA WRITE or READ targets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RemoteAddr {
    /// The address in the remote region.
    pub addr: u64,
    /// The remote region's key.
    pub rkey: u32,
}

impl RemoteAddr {
    /// The address `offset` bytes further. It wraps around at 2^64 as a NIC's address
    /// arithmetic does: an address outside the region fails the remote access check.
    pub const fn offset(self, offset: u64) -> RemoteAddr {
        RemoteAddr {
            addr: self.addr.wrapping_add(offset),
            rkey: self.rkey,
        }
    }
}

/// The operation of a send work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Opcode {
    /// RDMA WRITE.
    RdmaWrite,
    /// RDMA WRITE with immediate data (consumes a receive at the peer).
    RdmaWriteWithImm,
    /// RDMA READ.
    RdmaRead,
    /// SEND (consumes a receive at the peer).
    Send,
    /// SEND with immediate data.
    SendWithImm,
    /// Atomic compare-and-swap (`IBV_WR_ATOMIC_CMP_AND_SWP`): the 8 bytes at the remote
    /// address (8-byte aligned, in a region registered with `REMOTE_ATOMIC`), when equal to
    /// `compare`, become `swap`; their value before lands in the local 8 bytes (a region
    /// with `LOCAL_WRITE`). Values in the host's byte order.
    AtomicCmpSwp {
        /// The value the remote 8 bytes are compared with.
        compare: u64,
        /// What they become when equal.
        swap: u64,
    },
    /// Atomic fetch-and-add (`IBV_WR_ATOMIC_FETCH_AND_ADD`): `add` is added to the 8 bytes
    /// at the remote address (wrapping), and their value before lands in the local 8 bytes;
    /// as [`AtomicCmpSwp`](Self::AtomicCmpSwp) otherwise.
    AtomicFetchAdd {
        /// What is added.
        add: u64,
    },
}

/// The length of an atomic operation's operand, remote and local: 8 bytes.
pub const ATOMIC_LEN: u32 = 8;

impl Opcode {
    /// The lowercase name used in traces.
    pub const fn as_str(self) -> &'static str {
        match self {
            Opcode::RdmaWrite => "rdma_write",
            Opcode::RdmaWriteWithImm => "rdma_write_with_imm",
            Opcode::RdmaRead => "rdma_read",
            Opcode::Send => "send",
            Opcode::SendWithImm => "send_with_imm",
            Opcode::AtomicCmpSwp { .. } => "atomic_cmp_and_swp",
            Opcode::AtomicFetchAdd { .. } => "atomic_fetch_and_add",
        }
    }

    /// `true` for operations that target a remote address (RDMA and atomics).
    pub const fn is_rdma(self) -> bool {
        matches!(
            self,
            Opcode::RdmaWrite
                | Opcode::RdmaWriteWithImm
                | Opcode::RdmaRead
                | Opcode::AtomicCmpSwp { .. }
                | Opcode::AtomicFetchAdd { .. }
        )
    }

    /// `true` for the atomics.
    pub const fn is_atomic(self) -> bool {
        matches!(
            self,
            Opcode::AtomicCmpSwp { .. } | Opcode::AtomicFetchAdd { .. }
        )
    }

    /// `true` for the operations whose responder writes into the local memory: RDMA READ
    /// and the atomics (their region needs `LOCAL_WRITE`).
    pub const fn writes_local(self) -> bool {
        matches!(self, Opcode::RdmaRead) || self.is_atomic()
    }

    /// `true` for operations that carry immediate data.
    pub const fn has_imm(self) -> bool {
        matches!(self, Opcode::RdmaWriteWithImm | Opcode::SendWithImm)
    }
}

impl fmt::Display for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The local data of a send work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Local<'a> {
    /// No local data: a zero-length operation.
    Empty,
    /// One scatter/gather entry.
    Sge(Sge),
    /// A scatter/gather list: its entries are gathered in order into the message (WRITE,
    /// SEND) or the message is scattered over them in order (READ). At most the queue
    /// pair's `max_send_sge` entries.
    Sges(&'a [Sge]),
    /// Inline data (`IBV_SEND_INLINE`): copied into the work request when posted, so the
    /// caller may reuse it as soon as the post returns.
    Inline(&'a [u8]),
}

impl Local<'_> {
    /// The number of bytes.
    pub fn len(&self) -> usize {
        match self {
            Local::Empty => 0,
            Local::Sge(sge) => sge.length as usize,
            Local::Sges(list) => list.iter().map(|s| s.length as usize).sum(),
            Local::Inline(data) => data.len(),
        }
    }

    /// `true` for zero bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The longest message InfiniBand carries, 2^31 bytes (a device's own limit,
/// `ibv_port_attr.max_msg_sz`, may be lower).
pub const MAX_MESSAGE_LEN: u64 = 1 << 31;

/// A send work request (`struct ibv_send_wr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendWr<'a> {
    /// Returned in the completion.
    pub wr_id: u64,
    /// The operation.
    pub opcode: Opcode,
    /// The local data.
    pub local: Local<'a>,
    /// The remote address (RDMA operations only).
    pub remote: RemoteAddr,
    /// Immediate data, host order (`*_WITH_IMM` only).
    pub imm_data: u32,
    /// `IBV_SEND_SIGNALED`.
    pub signaled: bool,
}

impl SendWr<'_> {
    /// Why an atomic work request is refused before it is posted, by every provider alike
    /// (semantics 41): inline, or with fewer than 8 local bytes (the value before lands in
    /// the first 8: rxe's provider refuses fewer, libmlx5 writes 8 whatever the entry says,
    /// `set_data_ptr_seg_atomic`, which selsig refuses rather than let the NIC write past
    /// the entry); with `rxe`, also a remote address not 8-byte aligned (rxe's provider,
    /// `validate_send_wr`, `EINVAL`; mlx5 leaves it to the responder). `None` for any
    /// other work request.
    pub fn atomic_refusal(&self, rxe: bool) -> Option<&'static str> {
        if !self.opcode.is_atomic() {
            return None;
        }
        if matches!(self.local, Local::Inline(_)) {
            Some("an atomic operation cannot be inline")
        } else if matches!(self.local, Local::Sges(_)) {
            Some("an atomic operation takes one scatter/gather entry, not a list")
        } else if self.local.len() < ATOMIC_LEN as usize {
            Some("an atomic operation needs 8 bytes of local memory")
        } else if rxe && !self.remote.addr.is_multiple_of(8) {
            Some("an atomic operation's remote address must be 8-byte aligned (rxe)")
        } else {
            None
        }
    }
}

/// How a provider's queue pairs take a batch of send work requests: libibverbs' two
/// posting APIs, which differ in what a refused batch leaves posted. Chosen per device
/// (`selsig_verbs::VerbsDevice::with_post_api`, `selsig_soft::SoftConfig::post_api`);
/// [`Legacy`](PostApi::Legacy) by default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum PostApi {
    /// `ibv_create_qp` and `ibv_post_send`: a list of `ibv_send_wr`. A provider that refuses
    /// a work request has posted those before it (`PostWrError::index`).
    #[default]
    Legacy,
    /// `ibv_create_qp_ex` with `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS` (the operations selsig
    /// posts: RDMA WRITE with and without immediate, RDMA READ, SEND with and without
    /// immediate, the two atomics), posted with `ibv_wr_start`, a builder and a setter per
    /// work request, and `ibv_wr_complete`, which posts the whole batch or none of it: a
    /// refused batch is refused at index 0, and a `SignaledQueue` hands every buffer of it
    /// back. Work requests refused before the post (inline data beyond `max_inline_data`,
    /// a list beyond `max_send_sge`, ...) refuse the whole batch too. Two exceptions on
    /// rxe (semantics 43, 44): a doorbell that fails after the work requests were queued
    /// (`AfterPosting`), and a batch holding a list of entries of unequal lengths, which
    /// the verbs provider posts through `ibv_post_send` (rdma-core before 64 measures such
    /// a list wrongly).
    Extended,
}

impl std::str::FromStr for PostApi {
    type Err = String;

    /// `legacy` or `extended` (what a `--post-api` option would take).
    fn from_str(s: &str) -> Result<PostApi, String> {
        match s {
            "legacy" => Ok(PostApi::Legacy),
            "extended" => Ok(PostApi::Extended),
            other => Err(format!(
                "unknown post API {other:?}: legacy (ibv_post_send) or extended \
                 (ibv_wr_start ... ibv_wr_complete)"
            )),
        }
    }
}

impl std::fmt::Display for PostApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PostApi::Legacy => "legacy",
            PostApi::Extended => "extended",
        })
    }
}

/// A receive work request (`struct ibv_recv_wr`, one scatter/gather entry).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecvWr {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Where the incoming SEND lands; `None` for a zero-length receive (enough for
    /// RDMA WRITE with immediate).
    pub sge: Option<Sge>,
}

/// Why `post_send` or `post_recv` refused a work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum PostFailure {
    /// The queue is full (`ENOMEM` from `ibv_post_send`, `ENOSPC` from `ibv_wr_complete`).
    Full,
    /// The QP's state does not allow posting.
    State(QpState),
    /// The work request itself is invalid (an inline RDMA READ, too many bytes, ...).
    Invalid(&'static str),
    /// Inline data longer than the QP's `max_inline_data`.
    InlineTooLong {
        /// The bytes of inline data.
        len: usize,
        /// The QP's `max_inline_data`.
        max: u32,
    },
    /// A scatter/gather list longer than the QP's `max_send_sge` (libmlx5 answers
    /// `ENOMEM`, rxe's provider `EINVAL`).
    TooManySges {
        /// The entries of the list.
        count: usize,
        /// The QP's `max_send_sge`.
        max: u32,
    },
    /// Any other error of the provider.
    Other,
    /// The provider took every work request of the batch and failed after, without
    /// saying whether the NIC was told of them (rxe: its doorbell `write()` failed). They
    /// are posted: they run with the next doorbell, or are flushed in the error state.
    AfterPosting,
}

/// A failed `post_send` or `post_recv`: the work requests before `index` were posted
/// (and the doorbell rung), the one at `index` and all after it were not. An `index` equal
/// to the batch's length means the provider took every work request and failed after (rxe
/// queues them all, then returns the errno of its doorbell `write()`): none comes back,
/// and whether they run before the next doorbell is unknown. `index` is never beyond the
/// batch's length, and [`PostFailure::AfterPosting`] comes only with `index` equal to it.
#[derive(Debug, thiserror::Error)]
#[error("{}", describe_post_error(*.index, .failure))]
pub struct PostWrError {
    /// The position of the first work request that was not posted (`bad_wr`); the
    /// batch's length when all were.
    pub index: usize,
    /// Why.
    pub failure: PostFailure,
    /// The errno, where the provider reported one.
    #[source]
    pub source: Option<io::Error>,
}

fn describe_post_error(index: usize, f: &PostFailure) -> String {
    match f {
        PostFailure::AfterPosting => {
            format!("the provider failed after taking all {index} work requests of the batch")
        }
        f => format!(
            "work request {index} of the batch was not posted: {}",
            describe_failure(f)
        ),
    }
}

fn describe_failure(f: &PostFailure) -> String {
    match f {
        PostFailure::AfterPosting => "the provider failed after posting".to_string(),
        PostFailure::Full => "the queue is full".to_string(),
        PostFailure::State(s) => format!("the queue pair is in state {s}"),
        PostFailure::Invalid(why) => format!("invalid work request: {why}"),
        PostFailure::InlineTooLong { len, max } => format!(
            "invalid work request: {len} bytes of inline data, more than the queue pair's \
             max_inline_data of {max}"
        ),
        PostFailure::TooManySges { count, max } => format!(
            "invalid work request: a scatter/gather list of {count} entries, more than the \
             queue pair's max_send_sge of {max}"
        ),
        PostFailure::Other => "provider error".to_string(),
    }
}

impl PostWrError {
    /// `true` when the queue was full: polling completions makes room.
    pub fn is_full(&self) -> bool {
        self.failure == PostFailure::Full
    }
}

/// Why a completion queue could not be polled.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CqError {
    /// The CQ overran: a completion found no room, the CQ is in the error state and
    /// completions were lost (`IBV_EVENT_CQ_ERR`).
    #[error("the completion queue overran ({capacity} entries) and is in the error state")]
    Overrun {
        /// The CQ's capacity.
        capacity: u32,
    },
    /// The provider reported an error.
    #[error("polling the completion queue failed")]
    Os(#[source] io::Error),
    /// The CQ gives no completion events: it was made without a completion channel, or
    /// its provider has none.
    #[error("the completion queue gives no completion events (made without a completion channel)")]
    NoEvents,
    /// Waiting for, arming or taking a completion event failed.
    #[error("the completion queue's event channel failed")]
    Event(#[source] io::Error),
}

/// An asynchronous event of a device (`struct ibv_async_event`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AsyncEvent {
    /// A completion queue overran (`IBV_EVENT_CQ_ERR`); `cq` is the provider's CQ id.
    CqErr {
        /// The CQ's id.
        cq: u32,
    },
    /// A QP hit an error that no completion reports (`IBV_EVENT_QP_FATAL`).
    QpFatal {
        /// The QP number.
        qp_num: u32,
    },
    /// A remote peer violated this QP's access rights (`IBV_EVENT_QP_ACCESS_ERR`).
    QpAccessErr {
        /// The QP number.
        qp_num: u32,
    },
    /// An invalid request arrived at this QP (`IBV_EVENT_QP_REQ_ERR`).
    QpReqErr {
        /// The QP number.
        qp_num: u32,
    },
    /// The port went active.
    PortActive {
        /// The port number.
        port: u8,
    },
    /// The port went down.
    PortErr {
        /// The port number.
        port: u8,
    },
    /// The device hit a fatal error (`IBV_EVENT_DEVICE_FATAL`): it executes nothing more
    /// and makes no more completions; close it.
    DeviceFatal,
    /// Any other event, by its `ibv_event_type` value.
    Other {
        /// The raw event type.
        event_type: u32,
    },
}

impl AsyncEvent {
    /// The lowercase name used in traces.
    pub fn as_str(&self) -> &'static str {
        match self {
            AsyncEvent::CqErr { .. } => "cq_err",
            AsyncEvent::QpFatal { .. } => "qp_fatal",
            AsyncEvent::QpAccessErr { .. } => "qp_access_err",
            AsyncEvent::QpReqErr { .. } => "qp_req_err",
            AsyncEvent::PortActive { .. } => "port_active",
            AsyncEvent::PortErr { .. } => "port_err",
            AsyncEvent::DeviceFatal => "device_fatal",
            AsyncEvent::Other { .. } => "other",
        }
    }
}

/// A provider error that is not about one work request.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProviderError {
    /// The provider cannot be used on this host (e.g. libibverbs is not installed).
    #[error("{0}")]
    Unavailable(String),
    /// The host has no device at all (a device name that is not among the host's
    /// devices is [`ProviderError::Invalid`], `what` = `"device"`).
    #[error("{0}")]
    NoDevice(String),
    /// A parameter is out of range, or names something the device does not have.
    #[error("invalid {what}: {why}")]
    Invalid {
        /// The parameter.
        what: &'static str,
        /// What is wrong with it.
        why: String,
    },
    /// A queue-pair state transition failed.
    #[error("cannot move QP {qp_num} from {from} to {to}: {why}")]
    Transition {
        /// The QP number.
        qp_num: u32,
        /// Its state before.
        from: QpState,
        /// The state asked for.
        to: QpState,
        /// What failed (the attribute, for verbs).
        why: String,
    },
    /// A memory access through a region's or a buffer's own accessors was out of its
    /// bounds.
    #[error(
        "{len} bytes at offset {offset} are outside the {region_len} bytes of the region or buffer accessed"
    )]
    OutOfBounds {
        /// The offset asked for (in the region, or in the buffer).
        offset: usize,
        /// The length asked for.
        len: usize,
        /// The length of the region, or of the buffer.
        region_len: usize,
    },
    /// A verb failed with an errno.
    #[error("{verb} failed")]
    Os {
        /// The verb (`ibv_create_qp`, ...).
        verb: &'static str,
        /// The errno.
        #[source]
        source: io::Error,
    },
}

/// A registered memory region. Its memory belongs to the region: the application reads
/// and writes it through these accessors (never through references, since the NIC may
/// access it at any time).
pub trait MemoryRegion: Send + Sync + fmt::Debug + 'static {
    /// The start address, as used in scatter/gather entries and remote addresses.
    fn addr(&self) -> u64;
    /// The length in bytes.
    fn len(&self) -> usize;
    /// `true` for an empty region.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The local key.
    fn lkey(&self) -> u32;
    /// The remote key.
    fn rkey(&self) -> u32;
    /// The access flags it was registered with.
    fn access(&self) -> Access;
    /// Copies `data` into the region at `offset`.
    fn write(&self, offset: usize, data: &[u8]) -> Result<(), ProviderError>;
    /// Copies bytes of the region at `offset` into `buf`.
    fn read(&self, offset: usize, buf: &mut [u8]) -> Result<(), ProviderError>;

    /// A scatter/gather entry for `len` bytes at `offset`.
    fn sge(&self, offset: usize, len: u32) -> Sge {
        Sge {
            addr: self.addr().wrapping_add(offset as u64),
            length: len,
            lkey: self.lkey(),
        }
    }

    /// The remote address of `offset`, for a peer's RDMA operations.
    fn remote(&self, offset: usize) -> RemoteAddr {
        RemoteAddr {
            addr: self.addr().wrapping_add(offset as u64),
            rkey: self.rkey(),
        }
    }

    /// Fills `len` bytes at `offset` with `byte`.
    fn fill(&self, offset: usize, len: usize, byte: u8) -> Result<(), ProviderError> {
        let chunk = [byte; 4096];
        let mut done = 0;
        while done < len {
            let n = (len - done).min(chunk.len());
            self.write(offset + done, &chunk[..n])?;
            done += n;
        }
        Ok(())
    }
}

/// A completion queue.
///
/// The type is the CQ itself, not a handle that can be cloned: the driver tells CQs apart
/// by the `Arc` it is given ([`SignaledQueue`](crate::SignaledQueue) refuses a second queue
/// on the same `Arc`, not on a clone of a handle wrapped in another one).
///
/// What the driver relies on the completions for (as every verbs provider does them,
/// docs/semantics.md): a successful work request makes a completion only when signaled (or
/// `sq_sig_all`); a failed one makes one, signaled or not, and moves the QP to the error
/// state; in the error state every outstanding work request, signaled or not, gets its own
/// flush completion ([`WcStatus::WrFlushErr`](crate::WcStatus::WrFlushErr)); and the
/// completions of one send queue come in posting order.
pub trait CompletionQueue: Send + Sync + 'static {
    /// The real number of entries (read back at creation).
    fn capacity(&self) -> u32;
    /// Moves up to `out.len()` completions into `out`, oldest first; returns how many.
    /// Never waits: 0 when none is there. An error is reported once per cause where it
    /// passes (a poll after it goes on), or on every poll where it lasts
    /// ([`CqError::Overrun`]); completions polled before it are not lost (they come first,
    /// or with the next poll). Fields a completion does not define are given as 0 or
    /// `None` (see [`WorkCompletion`]).
    fn poll(&self, out: &mut [WorkCompletion]) -> Result<usize, CqError>;

    /// What tells this CQ from the others while it lives: the value
    /// [`QueuePair::send_cq_identity`] gives for the QPs whose send queues report to it
    /// (distinct among the device's live CQs). The default, `None`, cannot tell.
    fn identity(&self) -> Option<usize> {
        None
    }

    /// Arms the CQ for one completion event (`ibv_req_notify_cq` with `solicited_only`
    /// 0): the next completion added to it makes one event, which
    /// [`event_fd`](Self::event_fd) turns readable and
    /// [`take_events`](Self::take_events) or [`wait_event`](Self::wait_event) take. One
    /// event per arm: arm again after each. Completions already in the CQ need not make
    /// one, so the waiter's order is: poll until empty, arm, poll again (a completion that
    /// came between the two polls is found there), and only then sleep.
    ///
    /// The default, and a CQ made without events: [`CqError::NoEvents`].
    fn req_notify(&self) -> Result<(), CqError> {
        Err(CqError::NoEvents)
    }

    /// The descriptor that is readable while an event is pending (a verbs completion
    /// channel's fd, made non-blocking), for a reactor such as tokio's `AsyncFd`. It lives
    /// as long as the CQ. `None` without events.
    #[cfg(unix)]
    fn event_fd(&self) -> Option<std::os::fd::RawFd> {
        None
    }

    /// Takes (and acknowledges, `ibv_ack_cq_events`) the events that are pending, without
    /// waiting; returns how many. [`CqError::NoEvents`] without events.
    fn take_events(&self) -> Result<u32, CqError> {
        Err(CqError::NoEvents)
    }

    /// Sleeps until an event is pending or `timeout` (`None`: no limit) passes, then takes
    /// the pending events like [`take_events`](Self::take_events): 0 when the time ran
    /// out. [`CqError::NoEvents`] without events.
    fn wait_event(&self, timeout: Option<Duration>) -> Result<u32, CqError> {
        let _ = timeout;
        Err(CqError::NoEvents)
    }

    /// Whether the CQ was created with `IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN`: an overrun does
    /// not move it to the error state nor raise `IBV_EVENT_CQ_ERR`, and completions are
    /// lost without a word. A [`SignaledQueue`](crate::SignaledQueue) refuses such a CQ
    /// ([`ConfigError::CqIgnoresOverrun`](crate::ConfigError::CqIgnoresOverrun)). The
    /// default: `false` (a CQ a program made itself and wraps may not know: do not give
    /// selsig one made with the flag).
    fn ignores_overrun(&self) -> bool {
        false
    }

    /// Whether the device this CQ belongs to was lost: a fatal error
    /// (`IBV_EVENT_DEVICE_FATAL`, [`AsyncEvent::DeviceFatal`]) after which no completion
    /// comes any more (libmlx5 does not flush a user-space QP of a lost device). The
    /// completions the device wrote before it failed can still be polled.
    ///
    /// It may make a system call (verbs reads the device's asynchronous events, keeping
    /// them for [`Device::poll_async_event`]): the driver asks when a poll found nothing
    /// and it is about to sleep or give up, not on every poll. A provider whose
    /// [`wait_event`](Self::wait_event) may sleep through the loss should wake for it. The
    /// default: never lost.
    fn device_lost(&self) -> bool {
        false
    }
}

/// An RC queue pair: the QP itself, not a handle that can be cloned (dropping it destroys
/// the QP, and a queue that owns it relies on that).
pub trait QueuePair: Send + Sync + 'static {
    /// The QP number.
    fn qp_num(&self) -> u32;
    /// The real capacities (read back at creation).
    fn caps(&self) -> QpCaps;
    /// Whether the QP was created with `sq_sig_all`.
    fn sq_sig_all(&self) -> bool;
    /// The current state.
    fn state(&self) -> QpState;
    /// This side's endpoint, for the peer to connect to.
    fn endpoint(&self, options: &ConnectOptions) -> Result<Endpoint, ProviderError>;
    /// Moves the QP through INIT, RTR and RTS, connected to `remote`.
    fn connect(&self, remote: &Endpoint, options: &ConnectOptions) -> Result<(), ProviderError>;
    /// Moves the QP to the error state: every outstanding work request, signaled or not,
    /// is flushed with a completion of its own.
    fn to_error(&self) -> Result<(), ProviderError>;
    /// Posts send work requests; on failure, reports the first one not posted: the
    /// error's [`index`](PostWrError::index) is what the driver goes by (those before it
    /// are posted, whatever the failure's kind says). In the error state a provider may
    /// take work requests and flush them (mlx5, rxe) or refuse them (bnxt_re, ionic, which
    /// take posts only in RTS and SQD): a drain then waits for the flushes without its
    /// marker.
    fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<(), PostWrError>;
    /// Posts the send work requests `wrs` yields as one post list (one doorbell), at most
    /// `max` of them; returns how many were posted. Nothing is posted until `wrs` ends:
    /// if it panics, none of what it yielded is. On failure the error's
    /// [`index`](PostWrError::index) counts the work requests `wrs` yielded, as
    /// [`post_send`](Self::post_send)'s counts its slice: those before it are posted, the
    /// one at it and any yielded after it are not.
    ///
    /// A provider that writes each work request to its send queue as it comes saves the
    /// copy of the list, and says from which length on in
    /// [`post_send_iter_min`](Self::post_send_iter_min); the default collects them and
    /// calls `post_send`. A provider may refuse the list before taking a work request
    /// from `wrs` (index 0, a queue pair not ready to send). `wrs` may run while the
    /// provider holds its send queue: it must not post to the same queue pair.
    fn post_send_iter<'a, I>(&self, max: usize, wrs: I) -> Result<usize, PostWrError>
    where
        Self: Sized,
        I: Iterator<Item = SendWr<'a>>,
    {
        let wrs: Vec<SendWr<'a>> = wrs.take(max).collect();
        self.post_send(&wrs).map(|()| wrs.len())
    }
    /// The shortest post list (by its bound, `post_send_iter`'s `max`) that
    /// [`post_send_iter`](Self::post_send_iter) takes faster than `post_send` takes it
    /// staged. A [`SignaledQueue`](crate::SignaledQueue) hands such lists to
    /// `post_send_iter`, with the tracker registering each work request as the provider
    /// takes it, and stages shorter ones for `post_send`. The default, `usize::MAX`:
    /// always staged.
    fn post_send_iter_min(&self) -> usize {
        usize::MAX
    }
    /// Posts receive work requests; on failure, reports the first one not posted.
    fn post_recv(&self, wrs: &[RecvWr]) -> Result<(), PostWrError>;

    /// The [`identity`](CompletionQueue::identity) of the CQ the QP's send queue reports
    /// to, so that a [`SignaledQueue`](crate::SignaledQueue) given another CQ is refused
    /// (it would wait for completions that never come to it). The default, `None`, cannot
    /// tell.
    fn send_cq_identity(&self) -> Option<usize> {
        None
    }

    /// Whether the QP's receive completions go to the CQ of its sends (one CQ for both).
    /// The default is `true`, the safe answer: a
    /// [`SignaledQueue`](crate::SignaledQueue) with a CQ of its own then leaves room in it
    /// for a completion per receive slot (every receive completes, if only flushed).
    fn recv_cq_is_send_cq(&self) -> bool {
        true
    }

    /// Whether destroying (dropping) this QP removes its completions that were not polled
    /// yet from its CQs, as mlx5 does (`mlx5_destroy_qp` → `__mlx5_cq_clean`); rxe leaves
    /// them to be polled (as completions of an unknown QP). The default is `false`, the
    /// safe answer: a [`SignaledQueue`](crate::SignaledQueue) dropped with work requests
    /// outstanding then keeps their CQ credits of a shared pool taken, as its completions
    /// may still be in the CQ.
    fn destroy_cleans_cq(&self) -> bool {
        false
    }

    /// Starts (`true`) or stops recording when the NIC finishes each send work request,
    /// signaled or not, for [`executed_at`](Self::executed_at). Returns whether the
    /// provider can: the default cannot, as a real NIC reports nothing for an unsignaled
    /// work request (the soft NIC can).
    fn record_execution_times(&self, on: bool) -> bool {
        let _ = on;
        false
    }

    /// When the NIC finished send work request `index` (counting every work request
    /// posted to this QP, from 0), while recording; `None` when not recorded, not
    /// executed yet, or no longer held (the record of a slot is kept until the slot is
    /// reused).
    fn executed_at(&self, index: u64) -> Option<Instant> {
        let _ = index;
        None
    }
}

/// An opened RDMA device (`ibv_context`) and what it creates.
pub trait Device: Send + Sync {
    /// Protection domains.
    type Pd: Send + Sync + 'static;
    /// Memory regions.
    type Mr: MemoryRegion;
    /// Completion queues.
    type Cq: CompletionQueue;
    /// Queue pairs.
    type Qp: QueuePair;

    /// The device's name (`mlx5_0`, `rxe0`, `soft0`).
    fn name(&self) -> &str;
    /// Allocates a protection domain.
    fn alloc_pd(&self) -> Result<Self::Pd, ProviderError>;
    /// Allocates `len` bytes of zeroed memory and registers it with `access`.
    fn reg_mr(&self, pd: &Self::Pd, len: usize, access: Access) -> Result<Self::Mr, ProviderError>;
    /// Creates a completion queue of at least `min_entries` entries.
    fn create_cq(&self, min_entries: u32) -> Result<Self::Cq, ProviderError>;
    /// Creates an RC queue pair.
    fn create_qp(
        &self,
        pd: &Self::Pd,
        send_cq: &Self::Cq,
        recv_cq: &Self::Cq,
        init: &QpInit,
    ) -> Result<Self::Qp, ProviderError>;
    /// The next asynchronous event, if any (does not block).
    fn poll_async_event(&self) -> Option<AsyncEvent>;
}

/// Connects two queue pairs of one device to each other (loopback).
pub fn connect_pair<Q: QueuePair>(
    a: &Q,
    b: &Q,
    options: &ConnectOptions,
) -> Result<(), ProviderError> {
    let ea = a.endpoint(options)?;
    let eb = b.endpoint(options)?;
    a.connect(&eb, options)?;
    b.connect(&ea, options)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_options_out_of_range_are_named() {
        assert!(ConnectOptions::default().check().is_ok());
        let refused = |o: ConnectOptions, what: &str| {
            let e = o.check().unwrap_err().to_string();
            assert!(e.starts_with(&format!("invalid {what}: ")), "{e}");
        };
        let o = ConnectOptions::default();
        refused(ConnectOptions { retry_cnt: 8, ..o }, "retry_cnt");
        refused(ConnectOptions { rnr_retry: 8, ..o }, "rnr_retry");
        refused(ConnectOptions { mtu: 0, ..o }, "MTU");
        refused(ConnectOptions { mtu: 255, ..o }, "MTU");
        refused(ConnectOptions { mtu: 4097, ..o }, "MTU");
        refused(ConnectOptions { port: 0, ..o }, "port");
        for mtu in [256, 1500, 4096] {
            assert!(ConnectOptions { mtu, ..o }.check().is_ok());
        }
    }

    #[test]
    fn access_names_its_flags_or_none() {
        assert_eq!(Access::empty().to_string(), "none");
        assert_eq!(Access::LOCAL_WRITE.to_string(), "local_write");
        let two = Access::LOCAL_WRITE | Access::REMOTE_READ;
        assert_eq!(two.to_string(), "local_write|remote_read");
        assert_eq!(
            Access::all().to_string(),
            "local_write|remote_write|remote_read|remote_atomic"
        );
    }

    #[test]
    fn qp_states_are_the_ibv_qp_state_values() {
        let states = [
            (QpState::Reset, "reset"),
            (QpState::Init, "init"),
            (QpState::Rtr, "rtr"),
            (QpState::Rts, "rts"),
            (QpState::Sqd, "sqd"),
            (QpState::Sqe, "sqe"),
            (QpState::Err, "err"),
        ];
        for (value, (state, name)) in states.into_iter().enumerate() {
            assert_eq!(QpState::try_from(value as u32).unwrap(), state);
            assert_eq!(
                (state.as_str(), state.to_string()),
                (name, name.to_string())
            );
        }
        let e = QpState::try_from(7).unwrap_err();
        assert_eq!((e.what, e.value), ("ibv_qp_state", 7));
    }

    #[test]
    fn opcodes_say_what_they_carry() {
        use Opcode as O;
        // (opcode, name, targets a remote address, carries immediate data)
        let table = [
            (O::RdmaWrite, "rdma_write", true, false),
            (O::RdmaWriteWithImm, "rdma_write_with_imm", true, true),
            (O::RdmaRead, "rdma_read", true, false),
            (O::Send, "send", false, false),
            (O::SendWithImm, "send_with_imm", false, true),
        ];
        for (op, name, rdma, imm) in table {
            assert_eq!(
                (op.to_string(), op.is_rdma(), op.has_imm()),
                (name.to_string(), rdma, imm)
            );
        }
    }

    #[test]
    fn local_data_and_remote_addresses_measure_and_move() {
        let sge = Sge {
            addr: 0x1000,
            length: 5,
            lkey: 1,
        };
        assert_eq!(
            (Local::Sge(sge).len(), Local::Sge(sge).is_empty()),
            (5, false)
        );
        assert_eq!((Local::Empty.len(), Local::Empty.is_empty()), (0, true));
        let inline = Local::Inline(b"abc");
        assert_eq!((inline.len(), inline.is_empty()), (3, false));
        let r = RemoteAddr {
            addr: 0x1000,
            rkey: 7,
        };
        assert_eq!(
            r.offset(0x10),
            RemoteAddr {
                addr: 0x1010,
                rkey: 7
            }
        );
        let top = RemoteAddr {
            addr: u64::MAX,
            rkey: 7,
        };
        assert_eq!(top.offset(2), RemoteAddr { addr: 1, rkey: 7 }, "wraps");
    }

    /// A provider that implements only what it must. Its `post_send` keeps the `wr_id`s of
    /// each list posted and refuses the work request whose `wr_id` is 99 (those before it
    /// posted, as `bad_wr` says).
    #[derive(Debug, Default)]
    struct Bare(std::sync::Mutex<Vec<Vec<u64>>>);

    impl MemoryRegion for Bare {
        fn addr(&self) -> u64 {
            0x2000
        }
        fn len(&self) -> usize {
            0
        }
        fn lkey(&self) -> u32 {
            3
        }
        fn rkey(&self) -> u32 {
            4
        }
        fn access(&self) -> Access {
            Access::empty()
        }
        fn write(&self, _: usize, _: &[u8]) -> Result<(), ProviderError> {
            Ok(())
        }
        fn read(&self, _: usize, _: &mut [u8]) -> Result<(), ProviderError> {
            Ok(())
        }
    }

    /// Only the defaults are under test: what a provider must write is never called, but
    /// for `post_send`, which the default `post_send_iter` calls.
    impl QueuePair for Bare {
        fn qp_num(&self) -> u32 {
            unreachable!()
        }
        fn caps(&self) -> QpCaps {
            unreachable!()
        }
        fn sq_sig_all(&self) -> bool {
            unreachable!()
        }
        fn state(&self) -> QpState {
            unreachable!()
        }
        fn endpoint(&self, _: &ConnectOptions) -> Result<Endpoint, ProviderError> {
            unreachable!()
        }
        fn connect(&self, _: &Endpoint, _: &ConnectOptions) -> Result<(), ProviderError> {
            unreachable!()
        }
        fn to_error(&self) -> Result<(), ProviderError> {
            unreachable!()
        }
        fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<(), PostWrError> {
            let bad = wrs.iter().position(|w| w.wr_id == 99);
            let posted = &wrs[..bad.unwrap_or(wrs.len())];
            let ids = posted.iter().map(|w| w.wr_id).collect();
            self.0.lock().unwrap().push(ids);
            match bad {
                Some(index) => Err(PostWrError {
                    index,
                    failure: PostFailure::Invalid("wr_id 99"),
                    source: None,
                }),
                None => Ok(()),
            }
        }
        fn post_recv(&self, _: &[RecvWr]) -> Result<(), PostWrError> {
            unreachable!()
        }
    }

    #[test]
    fn the_defaults_are_the_safe_answers() {
        let bare = Bare::default();
        assert!(bare.is_empty(), "a region of no bytes");
        assert_eq!((bare.sge(8, 16).addr, bare.sge(8, 16).lkey), (0x2008, 3));
        assert_eq!(
            bare.remote(8),
            RemoteAddr {
                addr: 0x2008,
                rkey: 4
            }
        );
        assert!(bare.recv_cq_is_send_cq(), "receives may share the CQ");
        assert!(!bare.destroy_cleans_cq(), "completions may outlive the QP");
        assert!(!bare.record_execution_times(true), "a real NIC cannot");
        assert_eq!(bare.executed_at(0), None);
        assert_eq!(QpCaps::default().max_send_wr, 64);
        assert_eq!(ConnectOptions::default().mtu, 4096);
    }

    #[test]
    fn the_default_iterator_post_is_one_list_of_at_most_max() {
        let wr = |wr_id| SendWr {
            wr_id,
            opcode: Opcode::RdmaWrite,
            local: Local::Empty,
            remote: RemoteAddr::default(),
            imm_data: 0,
            signaled: false,
        };
        let qp = Bare::default();
        assert_eq!(qp.post_send_iter_min(), usize::MAX, "always staged");
        let mut wrs = (1..=5).map(wr);
        assert_eq!(qp.post_send_iter(3, &mut wrs).unwrap(), 3);
        assert_eq!(wrs.next().map(|w| w.wr_id), Some(4), "no more than 3 taken");
        let e = qp
            .post_send_iter(8, [7, 99, 8].into_iter().map(wr))
            .unwrap_err();
        assert_eq!(e.index, 1, "the index counts what the iterator yielded");
        assert_eq!(*qp.0.lock().unwrap(), [vec![1, 2, 3], vec![7]]);
    }

    #[test]
    fn post_errors_and_events_are_named() {
        let e = PostWrError {
            index: 2,
            failure: PostFailure::Full,
            source: None,
        };
        assert_eq!(
            e.to_string(),
            "work request 2 of the batch was not posted: the queue is full"
        );
        assert!(e.is_full());
        let names = [
            (AsyncEvent::CqErr { cq: 1 }, "cq_err"),
            (AsyncEvent::QpFatal { qp_num: 1 }, "qp_fatal"),
            (AsyncEvent::QpAccessErr { qp_num: 1 }, "qp_access_err"),
            (AsyncEvent::QpReqErr { qp_num: 1 }, "qp_req_err"),
            (AsyncEvent::PortActive { port: 1 }, "port_active"),
            (AsyncEvent::PortErr { port: 1 }, "port_err"),
            (AsyncEvent::Other { event_type: 99 }, "other"),
        ];
        for (event, name) in names {
            assert_eq!(event.as_str(), name);
        }
    }
}
