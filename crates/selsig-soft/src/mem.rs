//! Memory shared by the application and the NIC thread.
//!
//! Registered memory is a slice of `AtomicU64` words, and every access, by the application
//! or by the NIC, goes through the functions of this module: whole words with relaxed
//! atomic loads and stores, partial words with compare-and-swap. So concurrent access is
//! never a data race, whatever the application does (writing a buffer the NIC is reading
//! gives torn data, as on real hardware, but no undefined behaviour), and there is no
//! `unsafe` code. Ordering between the application and the NIC comes from the queues:
//! the doorbell (a release store of the producer index) and each completion (a release
//! store of the CQ's producer index), which the other side loads with acquire.
//!
//! Byte `i` of a memory is bits `8 * (i % 8)` up of word `i / 8` (little-endian order
//! within a word, whatever the host's order: the bytes are only ever seen through these
//! functions).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Words needed for `len` bytes.
pub(crate) const fn words_for(len: usize) -> usize {
    len.div_ceil(8)
}

/// A zeroed memory of `len` bytes; `None` when it cannot be allocated.
pub(crate) fn zeroed(len: usize) -> Option<Box<[AtomicU64]>> {
    let words = words_for(len);
    let mut v = Vec::new();
    v.try_reserve_exact(words).ok()?;
    v.extend((0..words).map(|_| AtomicU64::new(0)));
    Some(v.into_boxed_slice())
}

/// Mask of the low `n` bytes (`n` in 0..=8).
#[inline]
fn low_bytes(n: usize) -> u64 {
    if n >= 8 {
        u64::MAX
    } else {
        (1u64 << (8 * n)) - 1
    }
}

/// Reads `n` (1..=8) bytes at byte offset `off`, as the low bytes of the result.
#[inline]
fn gather(src: &[AtomicU64], off: usize, n: usize) -> u64 {
    let w = off / 8;
    let sh = off % 8;
    let mut v = src[w].load(Relaxed) >> (8 * sh);
    if sh + n > 8 {
        v |= src[w + 1].load(Relaxed) << (8 * (8 - sh));
    }
    v & low_bytes(n)
}

/// Writes the low `n` bytes of `v` at byte offset `off`, all within one word.
#[inline]
fn merge(dst: &AtomicU64, sh: usize, n: usize, v: u64) {
    debug_assert!(sh + n <= 8 && n > 0);
    if n == 8 {
        dst.store(v, Relaxed);
        return;
    }
    let mask = low_bytes(n) << (8 * sh);
    let bits = (v << (8 * sh)) & mask;
    // Other bytes of the word may be written concurrently: update ours only.
    let _ = dst.fetch_update(Relaxed, Relaxed, |old| Some((old & !mask) | bits));
}

/// Copies `len` bytes from `src` at byte `src_off` to `dst` at byte `dst_off`.
///
/// The caller has checked both ranges. Copies forward, word by word. Whole words at
/// word offsets (the buffers of the bench, and of most applications) take a short path
/// without the head and tail handling of any other offset: a 64-byte copy runs about 56
/// instructions there, 90 through the general path (callgrind, NIC thread of `cargo
/// bench -p selsig-soft --bench soft`, 64-byte WRITEs). Out of line: inlined into the
/// NIC thread's loop, the copy made that loop run more instructions per WRITE, not fewer
/// (the loop then keeps fewer of its values in registers).
#[inline(never)]
pub(crate) fn copy(
    src: &[AtomicU64],
    src_off: usize,
    dst: &[AtomicU64],
    dst_off: usize,
    len: usize,
) {
    if (src_off | dst_off | len).is_multiple_of(8) {
        let words = len / 8;
        copy_words(&src[src_off / 8..][..words], &dst[dst_off / 8..][..words]);
    } else {
        copy_unaligned(src, src_off, dst, dst_off, len);
    }
}

/// Copies `src` into `dst`, of the same length: four words a step up to [`LONG`] words,
/// eight a step from there.
///
/// Four loads, then four stores, let the CPU overlap them and need no register that a
/// function must save; a 64-byte copy then runs 56 instructions, against 61 at eight a
/// step, which saves and restores four registers on every call. Long copies keep going
/// eight a step, out of line, where the saves are paid once for many words (on 4 KiB
/// WRITEs, criterion `write_4KiB/raw`, four a step and eight measured the same within
/// this host's noise).
#[inline(always)]
fn copy_words(src: &[AtomicU64], dst: &[AtomicU64]) {
    debug_assert_eq!(src.len(), dst.len());
    if src.len() >= LONG {
        copy_long_words(src, dst);
        return;
    }
    let mut d = dst.chunks_exact(4);
    let mut s = src.chunks_exact(4);
    for (d4, s4) in (&mut d).zip(&mut s) {
        let v = [
            s4[0].load(Relaxed),
            s4[1].load(Relaxed),
            s4[2].load(Relaxed),
            s4[3].load(Relaxed),
        ];
        for (w, x) in d4.iter().zip(v) {
            w.store(x, Relaxed);
        }
    }
    for (w, x) in d.remainder().iter().zip(s.remainder()) {
        w.store(x.load(Relaxed), Relaxed);
    }
}

/// Words from which [`copy_words`] goes eight a step.
const LONG: usize = 32;

/// [`copy_words`] of [`LONG`] words or more.
#[inline(never)]
fn copy_long_words(src: &[AtomicU64], dst: &[AtomicU64]) {
    let mut d = dst.chunks_exact(8);
    let mut s = src.chunks_exact(8);
    for (d8, s8) in (&mut d).zip(&mut s) {
        let v = [
            s8[0].load(Relaxed),
            s8[1].load(Relaxed),
            s8[2].load(Relaxed),
            s8[3].load(Relaxed),
            s8[4].load(Relaxed),
            s8[5].load(Relaxed),
            s8[6].load(Relaxed),
            s8[7].load(Relaxed),
        ];
        for (w, x) in d8.iter().zip(v) {
            w.store(x, Relaxed);
        }
    }
    for (w, x) in d.remainder().iter().zip(s.remainder()) {
        w.store(x.load(Relaxed), Relaxed);
    }
}

/// [`copy`] of any offsets and length.
#[inline(never)]
fn copy_unaligned(
    src: &[AtomicU64],
    mut src_off: usize,
    dst: &[AtomicU64],
    mut dst_off: usize,
    mut len: usize,
) {
    if len == 0 {
        return;
    }
    // Head: bring the destination to a word boundary.
    let head = ((8 - dst_off % 8) % 8).min(len);
    if head > 0 {
        merge(
            &dst[dst_off / 8],
            dst_off % 8,
            head,
            gather(src, src_off, head),
        );
        src_off += head;
        dst_off += head;
        len -= head;
    }
    let words = len / 8;
    if words > 0 {
        let dw = dst_off / 8;
        let sw = src_off / 8;
        let shift = src_off % 8;
        let dst_words = &dst[dw..dw + words];
        if shift == 0 {
            copy_words(&src[sw..sw + words], dst_words);
        } else {
            // Each destination word takes the high bytes of one source word and the low
            // bytes of the next; the last one needed is still inside the source range.
            let lo_shift = 8 * shift as u32;
            let hi_shift = 64 - lo_shift;
            let mut lo = src[sw].load(Relaxed);
            for (k, w) in dst_words.iter().enumerate() {
                let hi = src[sw + k + 1].load(Relaxed);
                w.store((lo >> lo_shift) | (hi << hi_shift), Relaxed);
                lo = hi;
            }
        }
        src_off += words * 8;
        dst_off += words * 8;
        len -= words * 8;
    }
    if len > 0 {
        merge(&dst[dst_off / 8], 0, len, gather(src, src_off, len));
    }
}

/// Copies bytes of `src` at byte `off` into `out`. The caller has checked the range.
pub(crate) fn read(src: &[AtomicU64], off: usize, out: &mut [u8]) {
    let head = ((8 - off % 8) % 8).min(out.len());
    if head > 0 {
        let v = gather(src, off, head).to_le_bytes();
        out[..head].copy_from_slice(&v[..head]);
    }
    let first_word = (off + head) / 8;
    let mut chunks = out[head..].chunks_exact_mut(8);
    let mut words = src[first_word..].iter();
    for (chunk, word) in (&mut chunks).zip(&mut words) {
        chunk.copy_from_slice(&word.load(Relaxed).to_le_bytes());
    }
    let rest = chunks.into_remainder();
    if let (false, Some(word)) = (rest.is_empty(), words.next()) {
        let n = rest.len();
        rest.copy_from_slice(&word.load(Relaxed).to_le_bytes()[..n]);
    }
}

/// An atomic operation on the 8 bytes of `word`, read as an integer in the host's byte
/// order (as an application wrote it through these functions): compare-and-swap
/// (`cas`: becomes `second` if equal to `first`) or fetch-and-add (`first` added,
/// wrapping). Returns the value before.
pub(crate) fn atomic_op(word: &AtomicU64, cas: bool, first: u64, second: u64) -> u64 {
    // The word holds the bytes little-endian: the host's integer is read from them.
    let to_word = |v: u64| u64::from_le_bytes(v.to_ne_bytes());
    let of_word = |w: u64| u64::from_ne_bytes(w.to_le_bytes());
    let before = if cas {
        match word.compare_exchange(
            to_word(first),
            to_word(second),
            std::sync::atomic::Ordering::AcqRel,
            std::sync::atomic::Ordering::Acquire,
        ) {
            Ok(w) | Err(w) => w,
        }
    } else {
        word.fetch_update(
            std::sync::atomic::Ordering::AcqRel,
            std::sync::atomic::Ordering::Acquire,
            |w| Some(to_word(of_word(w).wrapping_add(first))),
        )
        .unwrap_or_else(|w| w)
    };
    of_word(before)
}

/// Copies `data` into `dst` at byte `off`. The caller has checked the range.
pub(crate) fn write(dst: &[AtomicU64], off: usize, data: &[u8]) {
    let head = ((8 - off % 8) % 8).min(data.len());
    if head > 0 {
        merge(&dst[off / 8], off % 8, head, le_word(&data[..head]));
    }
    let first_word = (off + head) / 8;
    let mut chunks = data[head..].chunks_exact(8);
    let mut words = dst[first_word..].iter();
    for (chunk, word) in (&mut chunks).zip(&mut words) {
        word.store(le_word(chunk), Relaxed);
    }
    let rest = chunks.remainder();
    if let (false, Some(word)) = (rest.is_empty(), words.next()) {
        merge(word, 0, rest.len(), le_word(rest));
    }
}

/// Up to 8 bytes as the low bytes of a word.
#[inline]
fn le_word(bytes: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    b[..bytes.len()].copy_from_slice(bytes);
    u64::from_le_bytes(b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn memory(bytes: &[u8]) -> Box<[AtomicU64]> {
        let m = zeroed(bytes.len()).expect("memory");
        write(&m, 0, bytes);
        m
    }

    fn contents(m: &[AtomicU64], len: usize) -> Vec<u8> {
        let mut v = vec![0; len];
        read(m, 0, &mut v);
        v
    }

    #[test]
    fn byte_order_within_a_word_is_little_endian() {
        let m = memory(&[1, 2, 3, 4, 5, 6, 7, 8, 9]);
        assert_eq!(m[0].load(Relaxed), 0x0807_0605_0403_0201);
        assert_eq!(m[1].load(Relaxed), 9);
    }

    #[test]
    fn an_aligned_copy_moves_whole_64_byte_blocks_and_the_rest() {
        // Word-aligned at both ends: two blocks of eight words, two more words and 6 bytes.
        let src: Vec<u8> = (0..200).map(|i| i as u8 ^ 0x5a).collect();
        let s = memory(&src);
        let d = memory(&[0; 200]);
        copy(&s, 8, &d, 16, 150);
        let mut expected = vec![0; 200];
        expected[16..166].copy_from_slice(&src[8..158]);
        assert_eq!(contents(&d, 200), expected);
    }

    /// Runs `copy` on memories of `src` and `dst` and compares them with the same copy of
    /// plain bytes.
    fn copy_like_bytes(
        src: &[u8],
        so: usize,
        dst: &[u8],
        d_o: usize,
        len: usize,
    ) -> Result<(), proptest::test_runner::TestCaseError> {
        let s = memory(src);
        let d = memory(dst);
        copy(&s, so, &d, d_o, len);
        let mut expected = dst.to_vec();
        expected[d_o..d_o + len].copy_from_slice(&src[so..so + len]);
        prop_assert_eq!(contents(&d, dst.len()), expected);
        prop_assert_eq!(contents(&s, src.len()), src, "the source is untouched");
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(if cfg!(miri) { 16 } else { 2048 }))]

        /// `copy` equals `copy_within`/slice copies on plain bytes, for every alignment
        /// (and lengths on both sides of `LONG` words).
        #[test]
        fn copy_matches_a_byte_model(
            src in prop::collection::vec(any::<u8>(), 0..600),
            dst in prop::collection::vec(any::<u8>(), 1..600),
            a in any::<prop::sample::Index>(),
            b in any::<prop::sample::Index>(),
            l in any::<prop::sample::Index>(),
        ) {
            let so = if src.is_empty() { 0 } else { a.index(src.len() + 1) };
            let d_o = b.index(dst.len() + 1);
            let max = (src.len() - so).min(dst.len() - d_o);
            let len = if max == 0 { 0 } else { l.index(max + 1) };
            copy_like_bytes(&src, so, &dst, d_o, len)?;
        }

        /// The same for whole words at word offsets, the path taken without head or tail
        /// (rare among the cases above), lengths of more and fewer than eight words
        /// included.
        #[test]
        fn a_copy_of_whole_words_matches_a_byte_model(
            src in prop::collection::vec(any::<u8>(), 8..600),
            dst in prop::collection::vec(any::<u8>(), 8..600),
            a in any::<prop::sample::Index>(),
            b in any::<prop::sample::Index>(),
            l in any::<prop::sample::Index>(),
        ) {
            let (sw, dw) = (src.len() / 8, dst.len() / 8);
            let so = 8 * a.index(sw + 1);
            let d_o = 8 * b.index(dw + 1);
            let max = (sw - so / 8).min(dw - d_o / 8);
            let len = 8 * l.index(max + 1);
            copy_like_bytes(&src, so, &dst, d_o, len)?;
        }

        #[test]
        fn write_and_read_match_a_byte_model(
            init in prop::collection::vec(any::<u8>(), 1..70),
            data in prop::collection::vec(any::<u8>(), 0..70),
            at in any::<prop::sample::Index>(),
        ) {
            let m = memory(&init);
            let off = at.index(init.len() + 1);
            let data = &data[..data.len().min(init.len() - off)];
            write(&m, off, data);
            let mut expected = init.clone();
            expected[off..off + data.len()].copy_from_slice(data);
            prop_assert_eq!(contents(&m, init.len()), expected.clone());
            let mut part = vec![0; data.len()];
            read(&m, off, &mut part);
            prop_assert_eq!(&part[..], &expected[off..off + data.len()]);
        }
    }

    #[test]
    fn partial_word_writes_from_two_threads_never_lose_bytes() {
        // Two writers own alternating bytes of the same words.
        let m = zeroed(64).expect("memory");
        std::thread::scope(|s| {
            for parity in 0..2u8 {
                let m = &m;
                s.spawn(move || {
                    for round in 0..2000u32 {
                        for i in (parity as usize..64).step_by(2) {
                            write(m, i, &[(round % 251) as u8 + parity]);
                        }
                    }
                });
            }
        });
        let bytes = contents(&m, 64);
        for (i, b) in bytes.iter().enumerate() {
            assert_eq!(*b, (1999 % 251) as u8 + (i % 2) as u8, "byte {i}");
        }
    }

    #[test]
    fn a_byte_written_keeps_its_value_while_the_word_s_other_bytes_change() {
        // Eight writers, one byte of one word each: only its owner writes a byte, so a
        // byte that is not what its owner wrote last lost an update (an unlocked
        // read-modify-write of the word by another writer put back the old value).
        let m = zeroed(8).expect("memory");
        std::thread::scope(|s| {
            for lane in 0..8usize {
                let m = &m;
                s.spawn(move || {
                    let mut last = 0u8;
                    for round in 0..100_000u32 {
                        let mut now = [0u8];
                        read(m, lane, &mut now);
                        assert_eq!(now[0], last, "byte {lane} lost round {round}'s write");
                        last = (round % 255) as u8 + 1;
                        write(m, lane, &[last]);
                    }
                });
            }
        });
    }
}
