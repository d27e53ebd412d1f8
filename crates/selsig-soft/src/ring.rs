//! The rings the application and the NIC thread share: send queue, receive queue and
//! completion queue.
//!
//! Slots are arrays of atomic words written with relaxed stores and read with relaxed
//! loads; what makes a slot's contents visible is the release store of an index and the
//! acquire load of it on the other side:
//!
//! - send queue: the application writes WQE slots, then publishes `producer` (the
//!   doorbell, release). The NIC loads `producer` (acquire), executes the WQEs, publishes
//!   `exec` (release). Slots are freed by `tail` (mlx5: written by the poller from the
//!   completion's WQE counter, after the completion was published by the NIC with release)
//!   or by `exec` (rxe). The application reuses a slot only after loading the index that
//!   freed it (acquire).
//! - completion queue: the NIC writes CQE slots, then publishes `producer` (release); the
//!   poller loads it (acquire), reads the slots, publishes `consumer` (release), which the
//!   NIC loads (acquire) before reusing a slot.
//! - receive queue: like the send queue, freed by the NIC's `consumer` (rxe) or by `tail`,
//!   which the poller advances by one per receive completion it polls (mlx5).
//!
//! Under loom, every slot also has a `loom::cell::UnsafeCell<()>` that each read and write
//! of the slot touches: loom checks those accesses against happens-before, so a slot
//! written again before the reader's access happens-before the write (a missing
//! release/acquire on a freeing index) fails the models. The slot words themselves are
//! atomics, checked only by the values read, and loom does not explore load buffering.
//!
//! Indices are `u64` counters that never wrap; the WQE counter in a CQE is 16 bits, as in
//! mlx5, and the poller maps it back to an index from the tail ([`SendRing::free_through`]).

use crate::sync::{AtomicU64, Ordering, Padded};

/// Inline data an rxe WQE holds (a separate line per slot, touched by inline WQEs only);
/// an mlx5 QP's WQEs hold what its `max_inline_data` reads back, in as many lines.
pub(crate) const MAX_INLINE: usize = 64;

/// One cache line of words: a WQE's inline data.
#[repr(align(64))]
struct Line([AtomicU64; 8]);

/// Half a cache line: a WQE or an RQE.
#[repr(align(32))]
struct Half([AtomicU64; 4]);

fn lines(n: usize) -> Box<[Line]> {
    (0..n)
        .map(|_| Line(std::array::from_fn(|_| AtomicU64::new(0))))
        .collect()
}

/// `lines` lines of 8 words for each of `slots` slots, and one more, so that they can
/// start on a cache line: the words and the index of the first.
fn line_words(slots: usize, lines: usize) -> (Box<[AtomicU64]>, usize) {
    let words: Box<[AtomicU64]> = (0..(slots * lines + 1) * 8)
        .map(|_| AtomicU64::new(0))
        .collect();
    // Words of 8 bytes (std's; loom's are larger and need no alignment) are 8-aligned, so
    // fewer than 8 of them reach the next line.
    let misaligned = words.as_ptr().addr() % 64;
    let skip = if std::mem::size_of::<AtomicU64>() == 8 && misaligned != 0 {
        (64 - misaligned) / 8
    } else {
        0
    };
    (words, skip)
}

fn halves(n: usize) -> Box<[Half]> {
    (0..n)
        .map(|_| Half(std::array::from_fn(|_| AtomicU64::new(0))))
        .collect()
}

impl std::fmt::Debug for Line {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Line")
    }
}

impl std::fmt::Debug for Half {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Half")
    }
}

/// Loom only: a causality tracker per slot. Slot words are atomics, so loom checks their
/// values, and loom does not explore load buffering; a `loom::cell::UnsafeCell` access
/// is checked against happens-before instead, which catches a slot written again before
/// the reader's access happens-before the write (a missing Release/Acquire on a "freed"
/// index).
#[cfg(loom)]
struct Shadow(Box<[loom::cell::UnsafeCell<()>]>);
#[cfg(loom)]
impl Shadow {
    fn new(n: usize) -> Self {
        Shadow((0..n).map(|_| loom::cell::UnsafeCell::new(())).collect())
    }
    fn read(&self, i: usize) {
        self.0[i].with(|_| ());
    }
    fn write(&self, i: usize) {
        self.0[i].with_mut(|_| ());
    }
}
#[cfg(not(loom))]
struct Shadow;
#[cfg(not(loom))]
impl Shadow {
    fn new(_: usize) -> Self {
        Shadow
    }
    #[inline(always)]
    fn read(&self, _: usize) {}
    #[inline(always)]
    fn write(&self, _: usize) {}
}
impl std::fmt::Debug for Shadow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Shadow")
    }
}

// ----- send queue --------------------------------------------------------------------

/// Opcodes as stored in a WQE.
pub(crate) mod op {
    pub(crate) const WRITE: u8 = 0;
    pub(crate) const WRITE_IMM: u8 = 1;
    pub(crate) const READ: u8 = 2;
    pub(crate) const SEND: u8 = 3;
    pub(crate) const SEND_IMM: u8 = 4;
    pub(crate) const CMP_SWP: u8 = 5;
    pub(crate) const FETCH_ADD: u8 = 6;
}

/// An atomic's two operands (compare and swap, or add and 0) as the bytes written into
/// its slot's inline words, where [`SendRing::atomic_operands`] reads them.
pub(crate) fn atomic_operands(first: u64, second: u64) -> [u8; 16] {
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&first.to_le_bytes());
    bytes[8..].copy_from_slice(&second.to_le_bytes());
    bytes
}

const FLAG_SIGNALED: u64 = 1;
const FLAG_INLINE: u64 = 2;

/// Bytes a scatter/gather entry takes in a slot's inline words ([`Posting::write_list`],
/// [`list_entry`]): its address, then its length and `lkey`, as mlx5's 16-byte data
/// segments (`struct mlx5_wqe_data_seg`) and rxe's `struct ib_sge` take.
pub(crate) const SGE_BYTES: usize = 16;

/// Entry `i` of a scatter/gather list in a slot's inline `words` (written by
/// [`Posting::write_list`]); `None` beyond the words.
#[inline]
pub(crate) fn list_entry(words: &[AtomicU64], i: usize) -> Option<selsig::Sge> {
    let at = i.checked_mul(2)?;
    let [addr, key_len] = words.get(at..at.checked_add(2)?)? else {
        return None;
    };
    let key_len = key_len.load(Ordering::Relaxed);
    Some(selsig::Sge {
        addr: addr.load(Ordering::Relaxed),
        length: key_len as u32,
        lkey: (key_len >> 32) as u32,
    })
}

fn write_sges(dst: &[AtomicU64], list: &[selsig::Sge]) {
    for (words, sge) in dst.chunks_exact(2).zip(list) {
        words[0].store(sge.addr, Ordering::Relaxed);
        words[1].store(
            u64::from(sge.length) | u64::from(sge.lkey) << 32,
            Ordering::Relaxed,
        );
    }
}

/// A decoded work queue entry: what the NIC reads for every work request. Its `wr_id`
/// and immediate data live in arrays of their own ([`SendRing::wr_id`],
/// [`SendRing::imm`]), read only when needed (a completion, a `*_WITH_IMM` operation), as
/// mlx5 keeps `wr_id`s in the host's `wrid` array rather than in the WQE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Wqe {
    pub(crate) opcode: u8,
    pub(crate) signaled: bool,
    /// The local data is in the slot's inline words: inline data (`lkey` 0), or the
    /// entries of a scatter/gather list (`lkey` of them). One flag for both, so that the
    /// path of a single entry tests one flag, as before lists.
    pub(crate) inline: bool,
    /// The message's length (a list's: the sum of its entries').
    pub(crate) len: u32,
    pub(crate) local_addr: u64,
    /// The single entry's key; with `inline`, the entries of the scatter/gather list in the
    /// slot's inline words ([`Posting::write_list`]; 0: inline data, or an empty list).
    pub(crate) lkey: u32,
    pub(crate) rkey: u32,
    pub(crate) remote_addr: u64,
}

/// The send queue: slots, the `wr_id` and immediate data of each, and the three indices.
///
/// A WQE takes half a cache line (4 words), so that the lines the application writes and
/// the NIC thread reads, which move between their cores, are half as many as with a line
/// per WQE; `wr_id`s and immediate data are kept apart.
#[derive(Debug)]
pub(crate) struct SendRing {
    shadow: Shadow,
    slots: Box<[Half]>,
    /// Each slot's inline data: `inline_stride` words from `inline_start`, line-aligned.
    inline: Box<[AtomicU64]>,
    inline_start: usize,
    inline_stride: usize,
    wr_ids: Box<[AtomicU64]>,
    imms: Box<[AtomicU64]>,
    mask: u64,
    /// Slots the producer may use at once.
    limit: u64,
    /// WQEs published by the application (the doorbell).
    producer: Padded<AtomicU64>,
    /// WQEs executed (or flushed) by the NIC.
    exec: Padded<AtomicU64>,
    /// WQEs whose slots the application freed by polling completions (mlx5).
    tail: Padded<AtomicU64>,
}

impl SendRing {
    /// A ring where the producer may hold `limit` slots (rounded up to a power of two
    /// internally), each with room for [`MAX_INLINE`] bytes of inline data.
    #[cfg(any(test, loom))]
    pub(crate) fn new(limit: u32) -> Self {
        Self::with_inline(limit, MAX_INLINE)
    }

    /// A ring where the producer may hold `limit` slots (rounded up to a power of two
    /// internally), each with room for `inline` bytes of inline data (in whole cache lines,
    /// at least one).
    pub(crate) fn with_inline(limit: u32, inline: usize) -> Self {
        let size = (limit as usize).next_power_of_two().max(1);
        let lines = inline.div_ceil(64).max(1);
        let (inline, inline_start) = line_words(size, lines);
        SendRing {
            shadow: Shadow::new(size),
            slots: halves(size),
            inline,
            inline_start,
            inline_stride: lines * 8,
            wr_ids: (0..size).map(|_| AtomicU64::new(0)).collect(),
            imms: (0..size).map(|_| AtomicU64::new(0)).collect(),
            mask: size as u64 - 1,
            limit: u64::from(limit),
            producer: Padded(AtomicU64::new(0)),
            exec: Padded(AtomicU64::new(0)),
            tail: Padded(AtomicU64::new(0)),
        }
    }

    /// Slots the producer may use at once (the poster reads it through its [`Posting`]).
    #[cfg(any(test, loom))]
    pub(crate) fn limit(&self) -> u64 {
        self.limit
    }

    /// The number of slots (a power of two).
    pub(crate) fn slots(&self) -> usize {
        self.slots.len()
    }

    fn slot(&self, index: u64) -> &[AtomicU64; 4] {
        &self.slots[(index & self.mask) as usize].0
    }

    /// Producer: starts writing `count` WQEs, to be published with [`Posting::publish`].
    /// One poster at a time (the device holds the QP's post lock).
    #[inline(always)]
    pub(crate) fn posting(&self, count: usize) -> Posting<'_> {
        Posting {
            ring: self,
            slots: &self.slots,
            wr_ids: &self.wr_ids,
            mask: self.mask,
            limit: self.limit,
            stream: count >= STREAM_MIN,
        }
    }

    /// NIC: how many WQEs were published.
    pub(crate) fn published(&self) -> u64 {
        self.producer.load(Ordering::Acquire)
    }

    /// NIC: how many WQEs it executed (only the NIC writes this index).
    pub(crate) fn executed(&self) -> u64 {
        self.exec.load(Ordering::Relaxed)
    }

    /// NIC: the WQEs before `exec` are executed; their slots are not read any more.
    pub(crate) fn set_executed(&self, exec: u64) {
        self.exec.store(exec, Ordering::Release);
    }

    /// Poller (mlx5): a completion for the WQE with this counter was polled: its slot and
    /// every earlier one are free (mlx5's `wq->tail = wq->wqe_head[idx] + 1`).
    ///
    /// Every WQE here takes one slot, so the index is found from the counter without
    /// mlx5's `wqe_head` array (a store per WQE saved on the posting path): the WQE lies
    /// in `[tail, tail + slots)`, and slots are at most 2^16, so its index is the first
    /// one from `tail` on whose low 16 bits are the counter. Only the poller writes
    /// `tail` (the pollers of a CQ take turns under its lock).
    pub(crate) fn free_through(&self, wqe_counter: u16) {
        let tail = self.tail.load(Ordering::Relaxed);
        self.tail
            .store(head_after(tail, wqe_counter), Ordering::Release);
    }

    /// Producer: the index before which slots are free again: freed by polling (mlx5) or
    /// by execution (rxe).
    pub(crate) fn freed(&self, on_poll: bool) -> u64 {
        if on_poll {
            self.tail.load(Ordering::Acquire)
        } else {
            self.exec.load(Ordering::Acquire)
        }
    }

    /// Consumer (NIC): starts loading the lines of published WQEs `from..to`, so that
    /// their cache misses overlap with other work. A line holds two WQEs, so a load of
    /// every other one reaches every line of the range (but, depending on where the
    /// slots start in their lines, the last WQE's).
    pub(crate) fn touch(&self, from: u64, to: u64) {
        for index in (from..to).step_by(2) {
            std::hint::black_box(self.slot(index)[0].load(Ordering::Relaxed));
        }
    }

    /// Consumer (NIC): reads WQE `index` (published by `producer`).
    #[inline(always)]
    pub(crate) fn read(&self, index: u64) -> Wqe {
        self.shadow.read((index & self.mask) as usize);
        let s = self.slot(index);
        let w0 = s[0].load(Ordering::Relaxed);
        let keys = s[2].load(Ordering::Relaxed);
        let flags = (w0 >> 8) & 0xff;
        Wqe {
            opcode: (w0 & 0xff) as u8,
            signaled: flags & FLAG_SIGNALED != 0,
            inline: flags & FLAG_INLINE != 0,
            len: (w0 >> 32) as u32,
            local_addr: s[1].load(Ordering::Relaxed),
            lkey: keys as u32,
            rkey: (keys >> 32) as u32,
            remote_addr: s[3].load(Ordering::Relaxed),
        }
    }

    /// Consumer (NIC): the `wr_id` of WQE `index` (published by `producer`), for its
    /// completion.
    #[inline(always)]
    pub(crate) fn wr_id(&self, index: u64) -> u64 {
        self.shadow.read((index & self.mask) as usize);
        self.wr_ids[(index & self.mask) as usize].load(Ordering::Relaxed)
    }

    /// Consumer (NIC): the immediate data of WQE `index`, a `*_WITH_IMM` operation.
    pub(crate) fn imm(&self, index: u64) -> u32 {
        self.shadow.read((index & self.mask) as usize);
        self.imms[(index & self.mask) as usize].load(Ordering::Relaxed) as u32
    }

    /// Consumer (NIC): the two operands of atomic WQE `index` ([`atomic_operands`]).
    pub(crate) fn atomic_operands(&self, index: u64) -> (u64, u64) {
        let words = self.inline_words(index);
        (
            words[0].load(Ordering::Relaxed),
            words[1].load(Ordering::Relaxed),
        )
    }

    /// The inline data words of slot `index` (read by the NIC for WQE `index`).
    pub(crate) fn inline_words(&self, index: u64) -> &[AtomicU64] {
        let at = (index & self.mask) as usize;
        self.shadow.read(at);
        let start = self.inline_start + at * self.inline_stride;
        &self.inline[start..start + self.inline_stride]
    }
}

/// The index after the WQE that a completion's 16-bit counter names, the first WQE from
/// `tail` on with those low bits.
fn head_after(tail: u64, wqe_counter: u16) -> u64 {
    tail + u64::from(wqe_counter.wrapping_sub(tail as u16)) + 1
}

#[cfg(not(loom))]
fn write_words(dst: &[AtomicU64], data: &[u8]) {
    crate::mem::write(dst, 0, data);
}

#[cfg(loom)]
fn write_words(dst: &[AtomicU64], data: &[u8]) {
    for (w, chunk) in dst.iter().zip(data.chunks(8)) {
        let mut b = [0u8; 8];
        b[..chunk.len()].copy_from_slice(chunk);
        w.store(u64::from_le_bytes(b), Ordering::Relaxed);
    }
}

// ----- receive queue -----------------------------------------------------------------

/// A decoded receive queue entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Rqe {
    pub(crate) wr_id: u64,
    pub(crate) addr: u64,
    pub(crate) len: u32,
    pub(crate) lkey: u32,
}

/// Post lists of at least this many WQEs are streamed (see [`Posting`]).
pub(crate) const STREAM_MIN: usize = 64;

/// The poster's writes of WQEs, from [`SendRing::posting`] to [`Posting::publish`] (the
/// doorbell).
///
/// On x86-64 the four words of each WQE of a post list of [`STREAM_MIN`] or more are
/// written with non-temporal stores (`movnti`): they go to memory through the
/// write-combining buffers instead of waiting for the slot's line to come back from the
/// NIC thread's core, which read it on its last lap. Plain stores wait for that line's
/// ownership, and the store buffer fills with them: a long post list then runs at the
/// speed of cache lines crossing between cores (the application thread's bottleneck at 64
/// bytes). The NIC thread reads the slots from memory, as a real NIC fetches a list's
/// WQEs by DMA. A short list keeps plain stores: the NIC, idle or close behind, reads its
/// lines at once, from the poster's cache, sooner than from memory (a streamed slot read
/// right after its doorbell waits for its write to reach memory and come back), as mlx5
/// writes a single WQE straight to the device (BlueFlame) rather than have it fetched.
/// Non-temporal stores are ordered for other threads only by a store fence, which
/// `publish` issues before the release store of the producer index (and a `Posting`
/// dropped without publishing, on every way out). Elsewhere (other architectures, loom,
/// Miri) the words are plain relaxed stores.
#[derive(Debug)]
#[cfg_attr(
    not(all(target_arch = "x86_64", not(loom), not(miri))),
    allow(dead_code, reason = "plain stores only")
)]
pub(crate) struct Posting<'a> {
    ring: &'a SendRing,
    /// The ring's slots, `wr_id`s, mask and limit, copied here so that the stores to
    /// slots do not make the compiler load them again for every WQE.
    slots: &'a [Half],
    wr_ids: &'a [AtomicU64],
    mask: u64,
    limit: u64,
    /// WQE words are stored non-temporally (a long post list), until the fence.
    stream: bool,
}

impl Posting<'_> {
    /// Writes WQE `index` with its `wr_id`, and `imm` for the operations that carry
    /// immediate data (the caller owns the slot: `index - freed < limit`).
    #[inline(always)]
    pub(crate) fn write(&mut self, index: u64, wqe: &Wqe, wr_id: u64, imm: u32, inline: &[u8]) {
        let ring = self.ring;
        let at = (index & self.mask) as usize;
        let s = &self.slots[at].0;
        ring.shadow.write(at);
        let flags =
            (u64::from(wqe.signaled) * FLAG_SIGNALED) | (u64::from(wqe.inline) * FLAG_INLINE);
        let words = [
            u64::from(wqe.opcode) | flags << 8 | u64::from(wqe.len) << 32,
            wqe.local_addr,
            u64::from(wqe.lkey) | u64::from(wqe.rkey) << 32,
            wqe.remote_addr,
        ];
        for (slot, word) in s.iter().zip(words) {
            self.store_wqe_word(slot, word);
        }
        self.wr_ids[at].store(wr_id, Ordering::Relaxed);
        if matches!(wqe.opcode, op::WRITE_IMM | op::SEND_IMM) {
            ring.imms[at].store(u64::from(imm), Ordering::Relaxed);
        }
        if !inline.is_empty() {
            write_words(ring.inline_words(index), inline);
        }
    }

    /// Writes the entries of WQE `index`'s scatter/gather list to its slot's inline words,
    /// [`SGE_BYTES`] each (the caller owns the slot, as for [`write`](Self::write), and
    /// the list fits the ring's inline room); its WQE has `inline` set and `lkey` the
    /// number of entries.
    #[cold]
    pub(crate) fn write_list(&mut self, index: u64, list: &[selsig::Sge]) {
        self.ring.shadow.write((index & self.mask) as usize);
        write_sges(self.ring.inline_words(index), list);
    }

    /// Slots the producer may use at once.
    #[inline(always)]
    pub(crate) fn limit(&self) -> u64 {
        self.limit
    }

    /// Publishes the WQEs before `head` (the doorbell): what was written becomes visible
    /// to the NIC thread.
    #[inline(always)]
    pub(crate) fn publish(mut self, head: u64) {
        self.fence();
        self.ring.producer.store(head, Ordering::Release);
    }

    /// One word of a WQE slot the poster owns.
    #[cfg(all(target_arch = "x86_64", not(loom), not(miri)))]
    #[inline(always)]
    #[allow(unsafe_code)]
    fn store_wqe_word(&mut self, slot: &AtomicU64, word: u64) {
        if !self.stream {
            slot.store(word, Ordering::Relaxed);
            return;
        }
        // SAFETY: `as_ptr` of a live atomic is valid and 8-byte aligned for a write. No
        // other access to the word can race with the store until the fence: the NIC thread
        // reads a slot only after loading (acquire) a producer index that publishes it, and
        // no longer once it stored (release) the index that frees it, which the poster
        // loaded (acquire) before taking the slot (`write`'s contract); the poster itself
        // never reads slots. `fence` (in `publish`, or `drop` on any other way out) issues
        // `sfence` after these stores and before the release store of the producer index,
        // as the intrinsic requires before any other access to the memory it wrote.
        unsafe { std::arch::x86_64::_mm_stream_si64(slot.as_ptr().cast::<i64>(), word as i64) };
    }

    #[cfg(not(all(target_arch = "x86_64", not(loom), not(miri))))]
    #[inline(always)]
    fn store_wqe_word(&mut self, slot: &AtomicU64, word: u64) {
        slot.store(word, Ordering::Relaxed);
    }

    /// Orders the non-temporal stores made so far before every later store and load of
    /// this thread (the producer index's release store among them); once, from `publish`
    /// or the drop, whichever comes first (no write follows either).
    #[inline(always)]
    fn fence(&mut self) {
        #[cfg(all(target_arch = "x86_64", not(loom), not(miri)))]
        if std::mem::take(&mut self.stream) {
            // SAFETY: `sfence` has no preconditions; SSE is part of x86-64's baseline.
            #[allow(unsafe_code)]
            unsafe {
                std::arch::x86_64::_mm_sfence()
            };
        }
    }
}

impl Drop for Posting<'_> {
    fn drop(&mut self) {
        self.fence();
    }
}

/// The receive queue: slots freed as the NIC completes them (rxe) or as the application
/// polls their completions (mlx5).
#[derive(Debug)]
pub(crate) struct RecvRing {
    shadow: Shadow,
    slots: Box<[Half]>,
    mask: u64,
    limit: u64,
    /// RQEs published by the application.
    producer: Padded<AtomicU64>,
    /// RQEs consumed by the NIC.
    consumer: Padded<AtomicU64>,
    /// RQEs whose completions were polled (written by the receive CQ's poller).
    tail: Padded<AtomicU64>,
}

impl RecvRing {
    pub(crate) fn new(limit: u32) -> Self {
        let size = (limit as usize).next_power_of_two().max(1);
        RecvRing {
            shadow: Shadow::new(size),
            slots: halves(size),
            mask: size as u64 - 1,
            limit: u64::from(limit),
            producer: Padded(AtomicU64::new(0)),
            consumer: Padded(AtomicU64::new(0)),
            tail: Padded(AtomicU64::new(0)),
        }
    }

    pub(crate) fn limit(&self) -> u64 {
        self.limit
    }

    fn slot(&self, index: u64) -> &[AtomicU64; 4] {
        &self.slots[(index & self.mask) as usize].0
    }

    /// Poller (the receive CQ's, one at a time): the completion of one more receive was
    /// polled (mlx5's `++wq->tail`).
    pub(crate) fn polled_one(&self) {
        self.tail
            .store(self.tail.load(Ordering::Relaxed) + 1, Ordering::Release);
    }

    /// Producer: publishes the RQEs before `head`.
    pub(crate) fn publish(&self, head: u64) {
        self.producer.store(head, Ordering::Release);
    }

    /// NIC: how many RQEs were published.
    pub(crate) fn published(&self) -> u64 {
        self.producer.load(Ordering::Acquire)
    }

    /// NIC: how many RQEs it consumed (only the NIC writes this index).
    pub(crate) fn consumed(&self) -> u64 {
        self.consumer.load(Ordering::Relaxed)
    }

    /// NIC: the RQEs before `consumer` are consumed, their slots free.
    pub(crate) fn set_consumed(&self, consumer: u64) {
        self.consumer.store(consumer, Ordering::Release);
    }

    /// Producer: the index before which slots are free again: freed by polling (mlx5) or
    /// by the NIC completing them (rxe).
    pub(crate) fn freed(&self, on_poll: bool) -> u64 {
        if on_poll {
            self.tail.load(Ordering::Acquire)
        } else {
            self.consumer.load(Ordering::Acquire)
        }
    }

    pub(crate) fn write(&self, index: u64, rqe: &Rqe) {
        self.shadow.write((index & self.mask) as usize);
        let s = self.slot(index);
        s[0].store(rqe.wr_id, Ordering::Relaxed);
        s[1].store(rqe.addr, Ordering::Relaxed);
        s[2].store(
            u64::from(rqe.len) | u64::from(rqe.lkey) << 32,
            Ordering::Relaxed,
        );
    }

    pub(crate) fn read(&self, index: u64) -> Rqe {
        self.shadow.read((index & self.mask) as usize);
        let s = self.slot(index);
        let w2 = s[2].load(Ordering::Relaxed);
        Rqe {
            wr_id: s[0].load(Ordering::Relaxed),
            addr: s[1].load(Ordering::Relaxed),
            len: w2 as u32,
            lkey: (w2 >> 32) as u32,
        }
    }
}

// ----- completion queue --------------------------------------------------------------

/// A completion as stored in a CQE slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Cqe {
    pub(crate) wr_id: u64,
    pub(crate) status: u8,
    pub(crate) opcode: u8,
    /// From the send queue (its slot must be freed when polled).
    pub(crate) send_queue: bool,
    pub(crate) has_imm: bool,
    pub(crate) wqe_counter: u16,
    pub(crate) byte_len: u32,
    pub(crate) qp_num: u32,
    pub(crate) imm: u32,
    pub(crate) vendor_err: u32,
}

/// The completion queue: one producer (the device's NIC thread), one consumer at a time.
///
/// A CQE takes a cache line of its own, like mlx5's default 64-byte CQEs: each completion
/// costs the NIC a line write and the poller a line read.
#[derive(Debug)]
pub(crate) struct CompletionRing {
    shadow: Shadow,
    slots: Box<[Line]>,
    mask: u64,
    capacity: u64,
    /// CQEs published by the NIC.
    producer: Padded<AtomicU64>,
    /// CQEs consumed by the poller.
    consumer: Padded<AtomicU64>,
}

impl CompletionRing {
    /// A ring holding `capacity` completions (one slot stays empty, as in mlx5).
    pub(crate) fn new(capacity: u32) -> Self {
        let size = (capacity as usize + 1).next_power_of_two();
        CompletionRing {
            shadow: Shadow::new(size),
            slots: lines(size),
            mask: size as u64 - 1,
            capacity: u64::from(capacity),
            producer: Padded(AtomicU64::new(0)),
            consumer: Padded(AtomicU64::new(0)),
        }
    }

    pub(crate) fn capacity(&self) -> u64 {
        self.capacity
    }

    fn slot(&self, index: u64) -> &[AtomicU64; 8] {
        &self.slots[(index & self.mask) as usize].0
    }

    /// Poller: how many completions the NIC appended so far, as far as it sees.
    pub(crate) fn published(&self) -> u64 {
        self.producer.load(Ordering::Acquire)
    }

    /// NIC (the only producer): how many completions it appended so far.
    pub(crate) fn produced(&self) -> u64 {
        self.producer.load(Ordering::Relaxed)
    }

    /// NIC (the only producer): appends `cqe`; `false` when the ring is full. `seen`
    /// caches the consumer index, so the poller's line is read only when the ring looks
    /// full.
    pub(crate) fn push(&self, cqe: &Cqe, seen: &AtomicU64) -> bool {
        let p = self.producer.load(Ordering::Relaxed);
        if p - seen.load(Ordering::Relaxed) >= self.capacity {
            let c = self.consumer.load(Ordering::Acquire);
            seen.store(c, Ordering::Relaxed);
            if p - c >= self.capacity {
                return false;
            }
        }
        self.write(p, cqe);
        self.producer.store(p + 1, Ordering::Release);
        true
    }

    /// Poller: completions published beyond `consumer`.
    pub(crate) fn available(&self, consumer: u64) -> u64 {
        self.producer.load(Ordering::Acquire) - consumer
    }

    /// Poller: the CQEs before `consumer` are read; their slots are free.
    pub(crate) fn set_consumed(&self, consumer: u64) {
        self.consumer.store(consumer, Ordering::Release);
    }

    /// Poller: rewrites CQE `index`, published and not consumed yet (a CQ clean moves the
    /// completions it keeps; the NIC does not touch those slots until `consumer` passes
    /// them).
    pub(crate) fn overwrite(&self, index: u64, c: &Cqe) {
        self.write(index, c);
    }

    /// Producer: writes CQE `index` (the caller checked there is room).
    fn write(&self, index: u64, c: &Cqe) {
        self.shadow.write((index & self.mask) as usize);
        let s = self.slot(index);
        let flags = u64::from(c.send_queue) | u64::from(c.has_imm) << 1;
        s[0].store(c.wr_id, Ordering::Relaxed);
        s[1].store(
            u64::from(c.status)
                | u64::from(c.opcode) << 8
                | flags << 16
                | u64::from(c.wqe_counter) << 32,
            Ordering::Relaxed,
        );
        s[2].store(
            u64::from(c.byte_len) | u64::from(c.qp_num) << 32,
            Ordering::Relaxed,
        );
        s[3].store(
            u64::from(c.imm) | u64::from(c.vendor_err) << 32,
            Ordering::Relaxed,
        );
    }

    /// Consumer: reads CQE `index` (published by `producer`).
    pub(crate) fn read(&self, index: u64) -> Cqe {
        self.shadow.read((index & self.mask) as usize);
        let s = self.slot(index);
        let w1 = s[1].load(Ordering::Relaxed);
        let w2 = s[2].load(Ordering::Relaxed);
        let w3 = s[3].load(Ordering::Relaxed);
        let flags = (w1 >> 16) & 0xff;
        Cqe {
            wr_id: s[0].load(Ordering::Relaxed),
            status: w1 as u8,
            opcode: (w1 >> 8) as u8,
            send_queue: flags & 1 != 0,
            has_imm: flags & 2 != 0,
            wqe_counter: (w1 >> 32) as u16,
            byte_len: w2 as u32,
            qp_num: (w2 >> 32) as u32,
            imm: w3 as u32,
            vendor_err: (w3 >> 32) as u32,
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn wqe_round_trips_through_a_slot() {
        let ring = SendRing::new(4);
        let wqe = Wqe {
            opcode: op::WRITE_IMM,
            signaled: true,
            inline: true,
            len: 13,
            local_addr: 0xdead_beef_0000,
            lkey: 0x1234_5678,
            rkey: 0x9abc_def0,
            remote_addr: 0x7fff_0000_1000,
        };
        let mut posting = ring.posting(1);
        posting.write(5, &wqe, u64::MAX - 3, 0xfeed_f00d, b"hello, world!");
        posting.publish(6);
        assert_eq!(ring.published(), 6);
        assert_eq!(ring.read(5), wqe);
        assert_eq!(ring.wr_id(5), u64::MAX - 3);
        assert_eq!(ring.imm(5), 0xfeed_f00d);
        let mut out = [0u8; 13];
        crate::mem::read(ring.inline_words(5), 0, &mut out);
        assert_eq!(&out, b"hello, world!");
    }

    /// A list's entries land in the slot's inline words, 16 bytes each, and its count in
    /// the WQE's `lkey`; a slot reused for a single entry reads back its key.
    #[test]
    fn a_scatter_gather_list_round_trips_through_a_slot() {
        let ring = SendRing::with_inline(4, 3 * SGE_BYTES);
        let list = [
            selsig::Sge {
                addr: 0x1000_0000_0001,
                length: 7,
                lkey: 0xffff_fffe,
            },
            selsig::Sge {
                addr: u64::MAX,
                length: u32::MAX,
                lkey: 1,
            },
            selsig::Sge {
                addr: 0,
                length: 0,
                lkey: 0x8000_0000,
            },
        ];
        let wqe = Wqe {
            opcode: op::SEND_IMM,
            signaled: false,
            inline: true,
            len: 6,
            local_addr: 0,
            lkey: 3,
            rkey: 0x9abc_def0,
            remote_addr: 0x7fff_0000_1000,
        };
        let mut posting = ring.posting(1);
        posting.write_list(6, &list);
        posting.write(6, &wqe, 9, 0, &[]);
        posting.publish(7);
        assert_eq!(ring.read(6), wqe);
        let words = ring.inline_words(6);
        let read: Vec<_> = (0..3).map(|i| list_entry(words, i)).collect();
        assert_eq!(read, list.map(Some));
        assert_eq!(list_entry(words, words.len() / 2), None, "beyond the words");
        let single = Wqe {
            inline: false,
            lkey: 0x1234,
            ..wqe
        };
        let mut posting = ring.posting(1);
        posting.write(10, &single, 9, 0, &[]);
        posting.publish(11);
        assert_eq!(ring.read(10), single);
    }

    /// The poster's stores are seen by another thread once it loads the producer index
    /// that publishes them, lap after lap of a small ring whose slots are freed by the
    /// reader's index: the reader reads slots just written. Lists declared as long as
    /// [`STREAM_MIN`] (streamed on x86-64: this fails without the store fence) or short.
    fn wqes_cross_threads(stream: bool) {
        const N: u64 = 200_000;
        let ring = SendRing::new(8);
        let wqe = |i: u64| Wqe {
            opcode: (i % 5) as u8,
            signaled: i.is_multiple_of(3),
            inline: false,
            len: (i * 7) as u32,
            local_addr: i.wrapping_mul(0x9e37_79b9_7f4a_7c15),
            lkey: i as u32 ^ 0x5555_5555,
            rkey: !(i as u32),
            remote_addr: u64::MAX - i,
        };
        std::thread::scope(|scope| {
            let reader = scope.spawn(|| {
                let mut exec = 0;
                while exec < N {
                    let published = ring.published();
                    while exec < published {
                        assert_eq!(ring.read(exec), wqe(exec), "WQE {exec}");
                        assert_eq!(ring.wr_id(exec), exec + 1, "wr_id of WQE {exec}");
                        exec += 1;
                    }
                    ring.set_executed(exec);
                    std::hint::spin_loop();
                }
            });
            let mut head = 0;
            while head < N {
                let room = (ring.limit() - (head - ring.freed(false))).min(N - head);
                if room == 0 {
                    // A reader that failed frees nothing more: its panic fails the test.
                    assert!(!reader.is_finished(), "the reader stopped at WQE {head}");
                    std::hint::spin_loop();
                    continue;
                }
                let mut posting = ring.posting(if stream { STREAM_MIN } else { 1 });
                for i in head..head + room {
                    posting.write(i, &wqe(i), i + 1, 0, &[]);
                }
                head += room;
                posting.publish(head);
            }
        });
        assert_eq!(ring.executed(), N);
    }

    #[test]
    fn streamed_wqes_are_read_as_written_on_another_thread() {
        wqes_cross_threads(true);
    }

    #[test]
    fn short_lists_are_read_as_written_on_another_thread() {
        wqes_cross_threads(false);
    }

    #[test]
    fn rqe_round_trips_through_a_slot() {
        let ring = RecvRing::new(4);
        let rqe = Rqe {
            wr_id: u64::MAX - 1,
            addr: 0x7fff_dead_beef,
            len: 0x8001_2345,
            lkey: 0xfedc_ba98,
        };
        ring.write(6, &rqe);
        assert_eq!(ring.read(6), rqe);
        assert_eq!(ring.read(2), rqe, "slot 2 is slot 6 of a ring of 4");
    }

    #[test]
    fn cqe_round_trips_through_a_slot() {
        let ring = CompletionRing::new(3);
        assert_eq!(ring.capacity(), 3);
        let cqe = Cqe {
            wr_id: 42,
            status: 10,
            opcode: 129,
            send_queue: false,
            has_imm: true,
            wqe_counter: 0xffff,
            byte_len: 0x8001_2345,
            qp_num: 0x00ab_cdef,
            imm: 7,
            vendor_err: 0x99,
        };
        ring.write(9, &cqe);
        assert_eq!(ring.read(9), cqe);
    }

    #[test]
    fn the_16_bit_wqe_counter_maps_back_past_the_wrap() {
        let ring = SendRing::new(8);
        let wqe = Wqe {
            opcode: op::WRITE,
            signaled: false,
            inline: false,
            len: 0,
            local_addr: 0,
            lkey: 0,
            rkey: 0,
            remote_addr: 0,
        };
        for index in 0..(1u64 << 16) + 16 {
            // (A posting dropped without publishing still fences its stores.)
            ring.posting(STREAM_MIN).write(index, &wqe, index, 0, &[]);
            // A completion for every third WQE.
            if index % 3 == 2 {
                ring.free_through(index as u16);
                assert_eq!(ring.freed(true), index + 1);
            }
        }
        // The WQE a counter names lies within 2^16 of the tail, on either side of a wrap.
        assert_eq!(head_after(0xfff0, 0x0005), 0x1_0006);
        assert_eq!(head_after(0x1_0000, 0xffff), 0x2_0000);
        assert_eq!(head_after(7, 7), 8);
    }
}

/// The rings' protocols under every interleaving `loom` finds (tiny rings, few entries):
/// `RUSTFLAGS="--cfg loom" cargo test -p selsig-soft --release --lib loom`.
#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::Arc;
    use loom::thread;

    const N: u64 = 4;

    /// WQE `i`: odd ones carry a scatter/gather list of two entries ([`list`]).
    fn wqe(i: u64) -> Wqe {
        let odd = i % 2 == 1;
        Wqe {
            opcode: op::WRITE,
            signaled: true,
            inline: odd,
            len: i as u32,
            local_addr: 1000 + i,
            lkey: if odd { 2 } else { i as u32 },
            rkey: 7 * i as u32,
            remote_addr: 2000 + i,
        }
    }

    /// The list of WQE `i` (odd), in its slot's inline words.
    fn list(i: u64) -> [selsig::Sge; 2] {
        [0, 1].map(|k| selsig::Sge {
            addr: 3000 + 10 * i + k,
            length: 40 + i as u32,
            lkey: 50 + i as u32 + k as u32,
        })
    }

    fn cqe(wr_id: u64, counter: u16) -> Cqe {
        Cqe {
            wr_id,
            status: 0,
            opcode: 1,
            send_queue: true,
            has_imm: false,
            wqe_counter: counter,
            byte_len: 0,
            qp_num: 1,
            imm: 0,
            vendor_err: 0,
        }
    }

    /// The application posts N WQEs into 2 slots, waiting for slots to be freed; the NIC
    /// executes each WQE and completes it; the application polls and frees slots through
    /// the WQE counter (mlx5) or the NIC's index (rxe). Every WQE the NIC reads (with the
    /// scatter/gather list in the slot's inline words of every other one) and every CQE the
    /// application reads is the one written, in order.
    fn send_and_complete(free_on_poll: bool) {
        let mut builder = loom::model::Builder::new();
        builder.preemption_bound = Some(3);
        builder.check(move || {
            let sq = Arc::new(SendRing::new(2));
            let cq = Arc::new(CompletionRing::new(1));
            let nic = {
                let (sq, cq) = (Arc::clone(&sq), Arc::clone(&cq));
                thread::spawn(move || {
                    let seen = AtomicU64::new(0);
                    let mut exec = 0;
                    while exec < N {
                        if sq.published() == exec {
                            thread::yield_now();
                            continue;
                        }
                        let w = sq.read(exec);
                        assert_eq!(w, wqe(exec), "the NIC reads what was written");
                        if w.inline {
                            let words = sq.inline_words(exec);
                            let entries = [0, 1].map(|k| list_entry(words, k));
                            assert_eq!(entries, list(exec).map(Some), "and its list");
                        }
                        let wr_id = sq.wr_id(exec);
                        exec += 1;
                        sq.set_executed(exec);
                        while !cq.push(&cqe(wr_id, (exec - 1) as u16), &seen) {
                            thread::yield_now();
                        }
                    }
                })
            };
            let (mut head, mut consumer) = (0u64, 0u64);
            while consumer < N {
                if head < N && head - sq.freed(free_on_poll) < sq.limit() {
                    let mut posting = sq.posting(1);
                    if head % 2 == 1 {
                        posting.write_list(head, &list(head));
                    }
                    posting.write(head, &wqe(head), 100 + head, 0, &[]);
                    head += 1;
                    posting.publish(head);
                } else if cq.available(consumer) > 0 {
                    let c = cq.read(consumer);
                    assert_eq!(c.wr_id, 100 + consumer, "completions in order");
                    if free_on_poll {
                        sq.free_through(c.wqe_counter);
                    }
                    consumer += 1;
                    cq.set_consumed(consumer);
                } else {
                    thread::yield_now();
                }
            }
            nic.join().expect("the NIC thread");
        });
    }

    #[test]
    fn loom_send_queue_mlx5() {
        send_and_complete(true);
    }

    #[test]
    fn loom_send_queue_rxe() {
        send_and_complete(false);
    }

    /// Receives: the application posts N RQEs into 2 slots; the NIC consumes them, and
    /// their slots come back as it consumes them (rxe) or as their completions are polled
    /// (mlx5: here the NIC thread stands for the poller too, right after each receive).
    fn receive_queue(on_poll: bool) {
        let mut builder = loom::model::Builder::new();
        builder.preemption_bound = Some(3);
        builder.check(move || {
            let rq = Arc::new(RecvRing::new(2));
            let nic = {
                let rq = Arc::clone(&rq);
                thread::spawn(move || {
                    let mut consumer = 0;
                    while consumer < N {
                        if rq.published() == consumer {
                            thread::yield_now();
                            continue;
                        }
                        let r = rq.read(consumer);
                        assert_eq!(
                            (r.wr_id, r.addr, r.len, r.lkey),
                            (consumer, 10 * consumer, 1, 2)
                        );
                        consumer += 1;
                        rq.set_consumed(consumer);
                        if on_poll {
                            rq.polled_one();
                        }
                    }
                })
            };
            let mut head = 0;
            while head < N {
                if head - rq.freed(on_poll) < rq.limit() {
                    rq.write(
                        head,
                        &Rqe {
                            wr_id: head,
                            addr: 10 * head,
                            len: 1,
                            lkey: 2,
                        },
                    );
                    head += 1;
                    rq.publish(head);
                } else {
                    thread::yield_now();
                }
            }
            nic.join().expect("the NIC thread");
        });
    }

    #[test]
    fn loom_receive_queue_rxe() {
        receive_queue(false);
    }

    #[test]
    fn loom_receive_queue_mlx5() {
        receive_queue(true);
    }
}
