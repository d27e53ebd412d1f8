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
//! - receive queue: like the send queue, freed by the NIC's `consumer`.
//!
//! Indices are `u64` counters that never wrap; the WQE counter in a CQE is 16 bits, as in
//! mlx5, and the poller maps it back through `wqe_head`.

use crate::sync::{AtomicU64, Ordering, Padded};

/// Words per send-queue slot: 6 of header, 8 of inline data, 2 spare (128 bytes).
pub(crate) const WQE_WORDS: usize = 16;
/// Inline data a WQE slot holds.
pub(crate) const MAX_INLINE: usize = 64;
const INLINE_WORD: usize = 6;
/// Words per completion-queue slot (32 bytes).
pub(crate) const CQE_WORDS: usize = 4;
/// Words per receive-queue slot.
pub(crate) const RQE_WORDS: usize = 3;

fn words(n: usize) -> Box<[AtomicU64]> {
    (0..n).map(|_| AtomicU64::new(0)).collect()
}

// ----- send queue --------------------------------------------------------------------

/// Opcodes as stored in a WQE.
pub(crate) mod op {
    pub(crate) const WRITE: u8 = 0;
    pub(crate) const WRITE_IMM: u8 = 1;
    pub(crate) const READ: u8 = 2;
    pub(crate) const SEND: u8 = 3;
    pub(crate) const SEND_IMM: u8 = 4;
}

const FLAG_SIGNALED: u64 = 1;
const FLAG_INLINE: u64 = 2;

/// A decoded work queue entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Wqe {
    pub(crate) wr_id: u64,
    pub(crate) opcode: u8,
    pub(crate) signaled: bool,
    pub(crate) inline: bool,
    pub(crate) len: u32,
    pub(crate) local_addr: u64,
    pub(crate) lkey: u32,
    pub(crate) rkey: u32,
    pub(crate) remote_addr: u64,
    pub(crate) imm: u32,
}

/// The send queue: slots, `wqe_head` (mlx5's map from slot to the index after it) and the
/// three indices.
#[derive(Debug)]
pub(crate) struct SendRing {
    slots: Box<[AtomicU64]>,
    wqe_head: Box<[AtomicU64]>,
    mask: u64,
    /// Slots the producer may use at once.
    limit: u64,
    /// WQEs published by the application (the doorbell).
    pub(crate) producer: Padded<AtomicU64>,
    /// WQEs executed (or flushed) by the NIC.
    pub(crate) exec: Padded<AtomicU64>,
    /// WQEs whose slots the application freed by polling completions (mlx5).
    pub(crate) tail: Padded<AtomicU64>,
}

impl SendRing {
    /// A ring where the producer may hold `limit` slots (rounded up to a power of two
    /// internally).
    pub(crate) fn new(limit: u32) -> Self {
        let size = (limit as usize).next_power_of_two().max(1);
        SendRing {
            slots: words(size * WQE_WORDS),
            wqe_head: words(size),
            mask: size as u64 - 1,
            limit: u64::from(limit),
            producer: Padded(AtomicU64::new(0)),
            exec: Padded(AtomicU64::new(0)),
            tail: Padded(AtomicU64::new(0)),
        }
    }

    pub(crate) fn limit(&self) -> u64 {
        self.limit
    }

    fn slot(&self, index: u64) -> &[AtomicU64] {
        let i = (index & self.mask) as usize * WQE_WORDS;
        &self.slots[i..i + WQE_WORDS]
    }

    /// Producer: writes WQE `index` (the caller owns the slot: `index - freed < limit`).
    pub(crate) fn write(&self, index: u64, wqe: &Wqe, inline: &[u8]) {
        let s = self.slot(index);
        let flags =
            (u64::from(wqe.signaled) * FLAG_SIGNALED) | (u64::from(wqe.inline) * FLAG_INLINE);
        s[0].store(wqe.wr_id, Ordering::Relaxed);
        s[1].store(
            u64::from(wqe.opcode) | flags << 8 | u64::from(wqe.len) << 32,
            Ordering::Relaxed,
        );
        s[2].store(wqe.local_addr, Ordering::Relaxed);
        s[3].store(
            u64::from(wqe.lkey) | u64::from(wqe.rkey) << 32,
            Ordering::Relaxed,
        );
        s[4].store(wqe.remote_addr, Ordering::Relaxed);
        s[5].store(u64::from(wqe.imm), Ordering::Relaxed);
        if !inline.is_empty() {
            write_words(&s[INLINE_WORD..INLINE_WORD + MAX_INLINE / 8], inline);
        }
        self.wqe_head[(index & self.mask) as usize].store(index + 1, Ordering::Relaxed);
    }

    /// Consumer (NIC): reads WQE `index` (published by `producer`).
    pub(crate) fn read(&self, index: u64) -> Wqe {
        let s = self.slot(index);
        let w1 = s[1].load(Ordering::Relaxed);
        let keys = s[3].load(Ordering::Relaxed);
        let flags = (w1 >> 8) & 0xff;
        Wqe {
            wr_id: s[0].load(Ordering::Relaxed),
            opcode: (w1 & 0xff) as u8,
            signaled: flags & FLAG_SIGNALED != 0,
            inline: flags & FLAG_INLINE != 0,
            len: (w1 >> 32) as u32,
            local_addr: s[2].load(Ordering::Relaxed),
            lkey: keys as u32,
            rkey: (keys >> 32) as u32,
            remote_addr: s[4].load(Ordering::Relaxed),
            imm: s[5].load(Ordering::Relaxed) as u32,
        }
    }

    /// The inline data words of slot `index`.
    pub(crate) fn inline_words(&self, index: u64) -> &[AtomicU64] {
        &self.slot(index)[INLINE_WORD..INLINE_WORD + MAX_INLINE / 8]
    }

    /// Poller (mlx5): the index after the WQE a completion's 16-bit counter names.
    pub(crate) fn head_after(&self, wqe_counter: u16) -> u64 {
        self.wqe_head[(u64::from(wqe_counter) & self.mask) as usize].load(Ordering::Relaxed)
    }
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

/// The receive queue: slots freed as the NIC consumes them.
#[derive(Debug)]
pub(crate) struct RecvRing {
    slots: Box<[AtomicU64]>,
    mask: u64,
    limit: u64,
    /// RQEs published by the application.
    pub(crate) producer: Padded<AtomicU64>,
    /// RQEs consumed by the NIC.
    pub(crate) consumer: Padded<AtomicU64>,
}

impl RecvRing {
    pub(crate) fn new(limit: u32) -> Self {
        let size = (limit as usize).next_power_of_two().max(1);
        RecvRing {
            slots: words(size * RQE_WORDS),
            mask: size as u64 - 1,
            limit: u64::from(limit),
            producer: Padded(AtomicU64::new(0)),
            consumer: Padded(AtomicU64::new(0)),
        }
    }

    pub(crate) fn limit(&self) -> u64 {
        self.limit
    }

    fn slot(&self, index: u64) -> &[AtomicU64] {
        let i = (index & self.mask) as usize * RQE_WORDS;
        &self.slots[i..i + RQE_WORDS]
    }

    pub(crate) fn write(&self, index: u64, rqe: &Rqe) {
        let s = self.slot(index);
        s[0].store(rqe.wr_id, Ordering::Relaxed);
        s[1].store(rqe.addr, Ordering::Relaxed);
        s[2].store(
            u64::from(rqe.len) | u64::from(rqe.lkey) << 32,
            Ordering::Relaxed,
        );
    }

    pub(crate) fn read(&self, index: u64) -> Rqe {
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
#[derive(Debug)]
pub(crate) struct CompletionRing {
    slots: Box<[AtomicU64]>,
    mask: u64,
    capacity: u64,
    /// CQEs published by the NIC.
    pub(crate) producer: Padded<AtomicU64>,
    /// CQEs consumed by the poller.
    pub(crate) consumer: Padded<AtomicU64>,
}

impl CompletionRing {
    /// A ring holding `capacity` completions (one slot stays empty, as in mlx5).
    pub(crate) fn new(capacity: u32) -> Self {
        let size = (capacity as usize + 1).next_power_of_two();
        CompletionRing {
            slots: words(size * CQE_WORDS),
            mask: size as u64 - 1,
            capacity: u64::from(capacity),
            producer: Padded(AtomicU64::new(0)),
            consumer: Padded(AtomicU64::new(0)),
        }
    }

    pub(crate) fn capacity(&self) -> u64 {
        self.capacity
    }

    fn slot(&self, index: u64) -> &[AtomicU64] {
        let i = (index & self.mask) as usize * CQE_WORDS;
        &self.slots[i..i + CQE_WORDS]
    }

    /// Producer: writes CQE `index` (the caller checked there is room).
    pub(crate) fn write(&self, index: u64, c: &Cqe) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wqe_round_trips_through_a_slot() {
        let ring = SendRing::new(4);
        let wqe = Wqe {
            wr_id: u64::MAX - 3,
            opcode: op::WRITE_IMM,
            signaled: true,
            inline: true,
            len: 13,
            local_addr: 0xdead_beef_0000,
            lkey: 0x1234_5678,
            rkey: 0x9abc_def0,
            remote_addr: 0x7fff_0000_1000,
            imm: 0xfeed_f00d,
        };
        ring.write(5, &wqe, b"hello, world!");
        assert_eq!(ring.read(5), wqe);
        assert_eq!(ring.head_after(5), 6);
        let mut out = [0u8; 13];
        crate::mem::read(ring.inline_words(5), 0, &mut out);
        assert_eq!(&out, b"hello, world!");
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
            byte_len: 4096,
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
            wr_id: 0,
            opcode: op::WRITE,
            signaled: false,
            inline: false,
            len: 0,
            local_addr: 0,
            lkey: 0,
            rkey: 0,
            remote_addr: 0,
            imm: 0,
        };
        for index in (1u64 << 16) - 4..(1u64 << 16) + 4 {
            ring.write(index, &wqe, &[]);
            assert_eq!(ring.head_after(index as u16), index + 1);
        }
    }
}
