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
    /// A scatter/gather list of buffers, held by the queue until the work request is
    /// retired ([`Work::list`]).
    List(Vec<Buffer<M>>),
    /// A scatter/gather list of memory the queue does not hold ([`Work::raw_list`]).
    RawList(&'a [Sge]),
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

    /// A work request on a scatter/gather list of buffers, in order: gathered into one
    /// message for a WRITE or SEND, or a READ's data scattered over them (their regions
    /// need `LOCAL_WRITE`). The queue holds every buffer until the work request is retired,
    /// then hands them back in [`Completion::list`](crate::Completion::list), in this order.
    ///
    /// At most the queue pair's `max_send_sge` entries (its
    /// [`caps`](crate::provider::QueuePair::caps), read back at creation): a longer list
    /// is refused before it is posted, with the limit named. Not for atomics, which take
    /// one entry. An empty list is a zero-length operation.
    pub fn list(opcode: Opcode, buffers: Vec<Buffer<M>>, remote: RemoteAddr, user: U) -> Self {
        Self::new(opcode, Data::List(buffers), remote, user)
    }

    /// A work request on a scatter/gather list of memory the queue does not hold: as
    /// [`list`](Self::list) for the entries, as [`raw`](Self::raw) for who owns them.
    pub fn raw_list(opcode: Opcode, local: &'a [Sge], remote: RemoteAddr, user: U) -> Self {
        Self::new(opcode, Data::RawList(local), remote, user)
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
    /// The data, unless it is held by the queue (`None`: a buffer, or a list of them).
    data: Option<Local<'a>>,
    /// Whether the data is a list of buffers.
    list: bool,
}

impl<'a, M, U> Work<'a, M, U> {
    /// Its shape, to [`reassemble`](Self::reassemble) it from.
    pub(crate) fn shape(&self) -> Shape<'a> {
        let data = match &self.data {
            Data::Buffer(_) | Data::List(_) => None,
            Data::Empty => Some(Local::Empty),
            Data::Inline(bytes) => Some(Local::Inline(bytes)),
            Data::Raw(sge) => Some(Local::Sge(*sge)),
            Data::RawList(list) => Some(Local::Sges(list)),
        };
        Shape {
            opcode: self.opcode,
            signal: self.signal,
            imm_data: self.imm_data,
            remote: self.remote,
            data,
            list: matches!(self.data, Data::List(_)),
        }
    }

    /// The work request of `shape` with its payload back (a buffer's shape takes the
    /// payload's buffer, a list's its list; a payload without one, which a buffer's never
    /// is, gives `Empty`).
    pub(crate) fn reassemble(shape: Shape<'a>, payload: Payload<M, U>) -> Self {
        let data = match (shape.data, payload.buffer) {
            (None, _) if shape.list => Data::List(payload.list.map_or_else(Vec::new, |l| *l)),
            (None, Some(buffer)) => Data::Buffer(buffer),
            (Some(Local::Inline(bytes)), _) => Data::Inline(bytes),
            (Some(Local::Sge(sge)), _) => Data::Raw(sge),
            (Some(Local::Sges(list)), _) => Data::RawList(list),
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

/// The local data of a work request as a provider takes it, with the memory the queue
/// keeps. A list's entries are written to the front of `arena`, which then holds the rest;
/// a buffer longer than one work request carries, or a list longer than `max_sge` (or than
/// `arena`), comes back with the error.
#[inline(always)]
pub(crate) fn local_of<'r, M: MemoryRegion>(
    data: Data<'r, M>,
    max_sge: u32,
    arena: &mut &'r mut [Sge],
) -> Result<(Local<'r>, Held<M>), (Held<M>, ProviderError)> {
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
                (Some(b), None),
            ),
            Err(_) => {
                let e = too_long(b.len());
                return Err(((Some(b), None), e));
            }
        },
        Data::Inline(bytes) => (Local::Inline(bytes), (None, None)),
        Data::Raw(sge) => (Local::Sge(sge), (None, None)),
        Data::Empty => (Local::Empty, (None, None)),
        Data::RawList(list) => match check_list(list.len(), max_sge) {
            Ok(()) => (Local::Sges(list), (None, None)),
            Err(e) => return Err(((None, None), e)),
        },
        Data::List(list) => {
            if let Err(e) = check_list(list.len(), max_sge) {
                return Err(((None, Some(Box::new(list))), e));
            }
            // Not met: a batch takes no more work requests than the arena holds lists for.
            if list.len() > arena.len() {
                let e = ProviderError::Invalid {
                    what: "scatter/gather list",
                    why: "no room left for its entries in this batch".to_string(),
                };
                return Err(((None, Some(Box::new(list))), e));
            }
            if let Some(b) = list.iter().find(|b| u32::try_from(b.len()).is_err()) {
                let e = too_long(b.len());
                return Err(((None, Some(Box::new(list))), e));
            }
            let (entries, rest) = std::mem::take(arena).split_at_mut(list.len());
            *arena = rest;
            for (entry, b) in entries.iter_mut().zip(&list) {
                *entry = Sge {
                    addr: b.addr(),
                    length: b.len() as u32,
                    lkey: b.lkey(),
                };
            }
            (Local::Sges(entries), (None, Some(Box::new(list))))
        }
    })
}

/// The memory a queue keeps of a work request: its buffer, or its list of buffers.
pub(crate) type Held<M> = (Option<Buffer<M>>, Option<Box<Vec<Buffer<M>>>>);

fn too_long(len: usize) -> ProviderError {
    ProviderError::Invalid {
        what: "buffer length",
        why: format!("{len} bytes do not fit one work request"),
    }
}

/// A scatter/gather list of `len` entries on a queue pair that takes `max_sge`.
fn check_list(len: usize, max_sge: u32) -> Result<(), ProviderError> {
    if len > max_sge as usize {
        return Err(ProviderError::Invalid {
            what: "scatter/gather list",
            why: format!("{len} entries, more than the queue pair's max_send_sge of {max_sge}"),
        });
    }
    Ok(())
}

/// What a queue keeps of a work request until it is retired.
#[derive(Debug)]
pub struct Payload<M, U> {
    /// The buffer, for work requests that had one.
    pub buffer: Option<Buffer<M>>,
    /// The buffers of a work request on a list of them ([`Work::list`]), in its order
    /// (`None` for any other). Boxed: a list costs one small allocation per work request,
    /// and what the queue keeps of every other work request stays as small as it was
    /// (a `Vec` here doubled the driver's cost per work request).
    pub list: Option<Box<Vec<Buffer<M>>>>,
    /// The caller's context.
    pub user: U,
}
