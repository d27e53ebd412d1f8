//! [`Work`], the builder of one work request for a [`SignaledQueue`](crate::SignaledQueue),
//! and [`Payload`], what the queue keeps of it until it is retired.

use crate::buffer::Buffer;
use crate::provider::{Local, MemoryRegion, Opcode, ProviderError, RemoteAddr, Sge};
use crate::tracker::Signal;

/// One work request to post: an operation, its data, and the caller's context `U`, which
/// comes back with the buffer when the work request is retired.
#[derive(Debug)]
pub struct Work<'a, M, U> {
    pub(crate) opcode: Opcode,
    pub(crate) signal: Signal,
    pub(crate) imm_data: u32,
    pub(crate) data: Data<'a, M>,
    pub(crate) remote: RemoteAddr,
    pub(crate) user: U,
}

/// The local data of a [`Work`].
#[derive(Debug)]
pub(crate) enum Data<'a, M> {
    /// Zero bytes.
    Empty,
    /// A buffer, held by the queue until the work request is retired.
    Buffer(Buffer<M>),
    /// Inline bytes, copied into the work request when it is posted.
    Inline(&'a [u8]),
    /// Memory the queue does not hold ([`Work::raw`]).
    Raw(Sge),
}

impl<'a, M: crate::provider::MemoryRegion, U> Work<'a, M, U> {
    fn new(opcode: Opcode, data: Data<'a, M>, remote: RemoteAddr, user: U) -> Self {
        Work {
            opcode,
            signal: Signal::Auto,
            imm_data: 0,
            data,
            remote,
            user,
        }
    }

    /// An RDMA WRITE of `buffer` to `remote`.
    pub fn write(buffer: Buffer<M>, remote: RemoteAddr, user: U) -> Self {
        Self::new(Opcode::RdmaWrite, Data::Buffer(buffer), remote, user)
    }

    /// An RDMA WRITE of inline bytes to `remote`.
    pub fn write_inline(data: &'a [u8], remote: RemoteAddr, user: U) -> Self {
        Self::new(Opcode::RdmaWrite, Data::Inline(data), remote, user)
    }

    /// A zero-length RDMA WRITE (the remote key is not checked for zero bytes).
    pub fn write_empty(remote: RemoteAddr, user: U) -> Self {
        Self::new(Opcode::RdmaWrite, Data::Empty, remote, user)
    }

    /// An RDMA WRITE with immediate data: the peer's receive completes with `imm`.
    pub fn write_with_imm(buffer: Buffer<M>, remote: RemoteAddr, imm: u32, user: U) -> Self {
        let mut w = Self::new(Opcode::RdmaWriteWithImm, Data::Buffer(buffer), remote, user);
        w.imm_data = imm;
        w
    }

    /// An RDMA READ of `remote` into `buffer` (its region needs `LOCAL_WRITE`).
    pub fn read(buffer: Buffer<M>, remote: RemoteAddr, user: U) -> Self {
        Self::new(Opcode::RdmaRead, Data::Buffer(buffer), remote, user)
    }

    /// An atomic compare-and-swap of the 8 bytes at `remote` (8-byte aligned, a region
    /// registered with `REMOTE_ATOMIC`): when they equal `compare` they become `swap`. Their
    /// value before lands in `buffer` (8 bytes of a region with `LOCAL_WRITE`).
    pub fn compare_swap(
        buffer: Buffer<M>,
        remote: RemoteAddr,
        compare: u64,
        swap: u64,
        user: U,
    ) -> Self {
        let opcode = Opcode::AtomicCmpSwp { compare, swap };
        Self::new(opcode, Data::Buffer(buffer), remote, user)
    }

    /// An atomic fetch-and-add of `add` to the 8 bytes at `remote` (wrapping), their value
    /// before landing in `buffer`; as [`compare_swap`](Self::compare_swap) otherwise.
    pub fn fetch_add(buffer: Buffer<M>, remote: RemoteAddr, add: u64, user: U) -> Self {
        let opcode = Opcode::AtomicFetchAdd { add };
        Self::new(opcode, Data::Buffer(buffer), remote, user)
    }

    /// A SEND of `buffer` (the peer needs a receive posted).
    pub fn send(buffer: Buffer<M>, user: U) -> Self {
        Self::new(
            Opcode::Send,
            Data::Buffer(buffer),
            RemoteAddr::default(),
            user,
        )
    }

    /// A SEND of inline bytes.
    pub fn send_inline(data: &'a [u8], user: U) -> Self {
        Self::new(
            Opcode::Send,
            Data::Inline(data),
            RemoteAddr::default(),
            user,
        )
    }

    /// A SEND with immediate data.
    pub fn send_with_imm(buffer: Buffer<M>, imm: u32, user: U) -> Self {
        let mut w = Self::new(
            Opcode::SendWithImm,
            Data::Buffer(buffer),
            RemoteAddr::default(),
            user,
        );
        w.imm_data = imm;
        w
    }

    /// Any operation on inline bytes (e.g. an RDMA WRITE with immediate).
    pub fn inline(opcode: Opcode, data: &'a [u8], remote: RemoteAddr, user: U) -> Self {
        Self::new(opcode, Data::Inline(data), remote, user)
    }

    /// A work request on memory the queue does not hold: `local` is a scatter/gather entry
    /// of a registered region (or `None` for zero bytes). The caller must not reuse that
    /// memory before the work request is retired; the queue cannot enforce it. For
    /// programs that manage their own registered rings.
    pub fn raw(opcode: Opcode, local: Option<Sge>, remote: RemoteAddr, user: U) -> Self {
        let data = local.map_or(Data::Empty, Data::Raw);
        Self::new(opcode, data, remote, user)
    }

    /// Sets the immediate data (for the `*_WITH_IMM` operations).
    pub fn imm(mut self, imm: u32) -> Self {
        self.imm_data = imm;
        self
    }

    /// Asks for this work request to be signaled (or leaves it to the policy).
    pub fn signal(mut self, signal: Signal) -> Self {
        self.signal = signal;
        self
    }

    /// The operation.
    pub fn opcode(&self) -> Opcode {
        self.opcode
    }
}

/// What a [`Work`] is without its payload (buffer and context): enough to put it back
/// together when the tracker refuses it for want of room and hands the payload back.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Shape<'a> {
    opcode: Opcode,
    signal: Signal,
    imm_data: u32,
    remote: RemoteAddr,
    /// The data, unless it is a buffer (`None`).
    data: Option<Local<'a>>,
}

impl<'a, M, U> Work<'a, M, U> {
    /// Its shape, to [`reassemble`](Self::reassemble) it from.
    pub(crate) fn shape(&self) -> Shape<'a> {
        let data = match &self.data {
            Data::Buffer(_) => None,
            Data::Empty => Some(Local::Empty),
            Data::Inline(bytes) => Some(Local::Inline(bytes)),
            Data::Raw(sge) => Some(Local::Sge(*sge)),
        };
        Shape {
            opcode: self.opcode,
            signal: self.signal,
            imm_data: self.imm_data,
            remote: self.remote,
            data,
        }
    }

    /// The work request of `shape` with its payload back (a buffer's shape takes the
    /// payload's buffer; a payload without one, which a buffer's never is, gives `Empty`).
    pub(crate) fn reassemble(shape: Shape<'a>, payload: Payload<M, U>) -> Self {
        let data = match (shape.data, payload.buffer) {
            (None, Some(buffer)) => Data::Buffer(buffer),
            (Some(Local::Inline(bytes)), _) => Data::Inline(bytes),
            (Some(Local::Sge(sge)), _) => Data::Raw(sge),
            _ => Data::Empty,
        };
        Work {
            opcode: shape.opcode,
            signal: shape.signal,
            imm_data: shape.imm_data,
            data,
            remote: shape.remote,
            user: payload.user,
        }
    }
}

/// The local data of a work request as a provider takes it, with the buffer the queue keeps;
/// a buffer longer than one work request carries comes back with the error.
#[inline(always)]
#[allow(clippy::type_complexity)]
pub(crate) fn local_of<M: MemoryRegion>(
    data: Data<'_, M>,
) -> Result<(Local<'_>, Option<Buffer<M>>), (Option<Buffer<M>>, ProviderError)> {
    Ok(match data {
        // Built from scalars rather than through `Buffer::sge`'s `Result`: this is the hot
        // path of every post.
        Data::Buffer(b) => match u32::try_from(b.len()) {
            Ok(length) => (
                Local::Sge(Sge {
                    addr: b.addr(),
                    length,
                    lkey: b.lkey(),
                }),
                Some(b),
            ),
            Err(_) => {
                let why = format!("{} bytes do not fit one work request", b.len());
                let source = ProviderError::Invalid {
                    what: "buffer length",
                    why,
                };
                return Err((Some(b), source));
            }
        },
        Data::Inline(bytes) => (Local::Inline(bytes), None),
        Data::Raw(sge) => (Local::Sge(sge), None),
        Data::Empty => (Local::Empty, None),
    })
}

/// What a queue keeps of a work request until it is retired.
#[derive(Debug)]
pub struct Payload<M, U> {
    /// The buffer, for work requests that had one.
    pub buffer: Option<Buffer<M>>,
    /// The caller's context.
    pub user: U,
}
