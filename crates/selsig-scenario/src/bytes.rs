//! The bytes of a region filled with `fill = "pattern"`, and the digest of a region's
//! contents that the trace and `expect.digests` give.

/// The bytes of a region of `len` bytes with `fill = "pattern"`: byte `i` is
/// `(7i mod 251) + 1` (never 0).
///
/// ```
/// assert_eq!(selsig_scenario::fill_pattern(3), [1, 8, 15]);
/// ```
pub fn fill_pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (7 * (i % 251) % 251) as u8 + 1).collect()
}

/// FNV-1a, 64 bits: the digest of a region's contents at the end of a run (the trace's
/// `digest` events, and `expect.digests`, print it as 16 hex digits). Stable, with no
/// dependency.
///
/// ```
/// // A region of 128 bytes with fill = "pattern", unchanged by the run:
/// use selsig_scenario::{fill_pattern, fnv1a64};
/// let digest = format!("{:016x}", fnv1a64(&fill_pattern(128)));
/// assert_eq!(digest.len(), 16);
/// ```
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h = Fnv1a64::default();
    h.update(bytes);
    h.finish()
}

/// [`fnv1a64`] of bytes given a piece at a time (a large region, read in chunks).
///
/// ```
/// use selsig_scenario::{Fnv1a64, fnv1a64};
/// let mut h = Fnv1a64::default();
/// h.update(b"sel");
/// h.update(b"sig");
/// assert_eq!(h.finish(), fnv1a64(b"selsig"));
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Fnv1a64(u64);

impl Default for Fnv1a64 {
    fn default() -> Self {
        Fnv1a64(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv1a64 {
    /// Takes in the next bytes.
    pub fn update(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }

    /// The digest of every byte taken in.
    pub fn finish(self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fill_pattern_and_the_digest_are_the_documented_ones() {
        assert!(
            fill_pattern(600)
                .iter()
                .enumerate()
                .all(|(i, &b)| b == (7 * i % 251) as u8 + 1)
        );
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}
