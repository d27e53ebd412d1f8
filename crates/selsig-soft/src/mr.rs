//! Memory regions and their keys.

use std::collections::VecDeque;
use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use selsig::Access;

/// Bits of a key that select the table entry; the rest are tag bits, so that a guessed key
/// does not match (an entry's first tag is random), nor a stale one, of a deregistered
/// region whose entry was reused: each reuse of an entry advances its tag by one, and
/// entries are reused oldest first, so a key comes back only after 4096 reuses of its entry
/// (mlx5's keys carry an 8-bit variant: a stale one can match again after 256).
const TAG_BITS: u32 = 12;
const TAG_MASK: u32 = (1 << TAG_BITS) - 1;
/// Most regions a device holds at once.
pub(crate) const MAX_REGIONS: usize = 1 << (32 - TAG_BITS);

/// A registered region: its memory, keys, access and protection domain.
///
/// On lines of its own: the application reads the key and address for every work request
/// it builds and the NIC thread for every one it executes, so no neighbouring allocation
/// that either side writes may share its lines.
#[derive(Debug)]
#[repr(align(128))]
pub(crate) struct MrInner {
    pub(crate) words: Box<[AtomicU64]>,
    pub(crate) len: usize,
    pub(crate) addr: u64,
    pub(crate) key: u32,
    pub(crate) access: Access,
    pub(crate) pd: u64,
}

impl MrInner {
    /// A region of `len` bytes in `words` (from [`crate::mem::zeroed`]).
    pub(crate) fn new(
        words: Box<[AtomicU64]>,
        len: usize,
        access: Access,
        pd: u64,
        key: u32,
    ) -> Self {
        debug_assert_eq!(words.len(), crate::mem::words_for(len));
        // The address space of a region is its real address, as with verbs (iova = VA).
        let addr = words.as_ptr() as u64;
        MrInner {
            words,
            len,
            addr,
            key,
            access,
            pd,
        }
    }

    /// The byte offset of `[addr, addr + len)` in the region, if it lies inside it.
    #[inline]
    pub(crate) fn offset_of(&self, addr: u64, len: u32) -> Option<usize> {
        let off = addr.checked_sub(self.addr)?;
        let end = off.checked_add(u64::from(len))?;
        (end <= self.len as u64).then_some(off as usize)
    }
}

/// The device's regions by key.
#[derive(Debug, Default)]
pub(crate) struct MrTable {
    entries: Vec<Option<Arc<MrInner>>>,
    /// The last tag used for each entry, so that a reused entry gets another key.
    tags: Vec<u32>,
    /// Entries free for reuse, the longest free first.
    free: VecDeque<usize>,
}

impl MrTable {
    /// Whether no key is left for a new region.
    pub(crate) fn is_full(&self) -> bool {
        self.free.is_empty() && self.entries.len() >= MAX_REGIONS
    }

    /// Picks an entry and a fresh key for a new region.
    pub(crate) fn allocate_key(&mut self) -> Option<u32> {
        let (index, tag) = match self.free.pop_front() {
            Some(i) => (i, (self.tags[i] + 1) & TAG_MASK),
            None if self.entries.len() < MAX_REGIONS => {
                self.entries.push(None);
                self.tags.push(0);
                (self.entries.len() - 1, random_u32() & TAG_MASK)
            }
            None => return None,
        };
        self.tags[index] = tag;
        Some(((index as u32) << TAG_BITS) | tag)
    }

    pub(crate) fn insert(&mut self, mr: Arc<MrInner>) {
        let index = (mr.key >> TAG_BITS) as usize;
        self.entries[index] = Some(mr);
    }

    /// Removes a region; the NIC cannot reach it once this returns.
    pub(crate) fn remove(&mut self, key: u32) {
        let index = (key >> TAG_BITS) as usize;
        if let Some(entry) = self.entries.get_mut(index)
            && entry.as_ref().is_some_and(|mr| mr.key == key)
        {
            *entry = None;
            self.free.push_back(index);
        }
    }

    /// The region of `key`, if the key is current.
    #[inline]
    pub(crate) fn get(&self, key: u32) -> Option<&MrInner> {
        let mr = self.entries.get((key >> TAG_BITS) as usize)?.as_deref()?;
        (mr.key == key).then_some(mr)
    }
}

/// A random number from the standard library's per-process random hash keys.
pub(crate) fn random_u32() -> u32 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(0x5e_1516);
    h.finish() as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_and_guessed_keys_do_not_match() {
        let mut t = MrTable::default();
        let k1 = t.allocate_key().unwrap();
        t.insert(Arc::new(MrInner::new(
            crate::mem::zeroed(64).expect("memory"),
            64,
            Access::REMOTE_WRITE,
            1,
            k1,
        )));
        assert!(t.get(k1).is_some());
        assert!(t.get(k1 ^ 1).is_none(), "a neighbouring key");
        t.remove(k1);
        assert!(t.get(k1).is_none());
        let k2 = t.allocate_key().unwrap();
        assert_eq!(k1 >> TAG_BITS, k2 >> TAG_BITS, "the entry is reused");
        assert_ne!(k1, k2, "with another key");
        t.insert(Arc::new(MrInner::new(
            crate::mem::zeroed(64).expect("memory"),
            64,
            Access::REMOTE_WRITE,
            1,
            k2,
        )));
        assert!(
            t.get(k1).is_none(),
            "the stale key does not reach the new region"
        );
        assert!(t.get(u32::MAX).is_none());
    }

    #[test]
    fn a_stale_key_comes_back_only_after_4096_reuses_of_its_entry() {
        let mut t = MrTable::default();
        let mr = |key| {
            Arc::new(MrInner::new(
                crate::mem::zeroed(64).expect("memory"),
                64,
                Access::REMOTE_WRITE,
                1,
                key,
            ))
        };
        // Two entries, each reused in turn: keys of one entry never repeat within 4096
        // of its reuses.
        let keys: Vec<u32> = (0..2).map(|_| t.allocate_key().unwrap()).collect();
        keys.iter().for_each(|&k| t.insert(mr(k)));
        let mut seen = std::collections::HashMap::new();
        for &k in &keys {
            seen.insert(k, 0);
            t.remove(k);
        }
        for n in 1..=2 * (TAG_MASK as usize) {
            let k = t.allocate_key().unwrap();
            t.insert(mr(k));
            assert!(
                seen.insert(k, n).is_none(),
                "key {k:#x} came back after {n} registrations"
            );
            t.remove(k);
        }
        // Then the first key, 4096 reuses of its entry later.
        let k = t.allocate_key().unwrap();
        assert_eq!(k, keys[0]);
    }

    /// A region of no bytes with `key`.
    fn empty(key: u32) -> Arc<MrInner> {
        Arc::new(MrInner::new(Box::new([]), 0, Access::empty(), 1, key))
    }

    #[test]
    fn a_stale_key_removes_nothing() {
        let mut t = MrTable::default();
        let k1 = t.allocate_key().unwrap();
        t.insert(empty(k1));
        t.remove(k1);
        let k2 = t.allocate_key().unwrap();
        t.insert(empty(k2));
        assert_eq!(k1 >> TAG_BITS, k2 >> TAG_BITS, "the entry is reused");
        t.remove(k1);
        assert!(t.get(k2).is_some(), "the stale key removed the new region");
        // Nor is the entry freed for another region.
        let k3 = t.allocate_key().unwrap();
        assert_ne!(k3 >> TAG_BITS, k2 >> TAG_BITS);
    }

    #[test]
    fn the_table_holds_max_regions_then_reuses_a_freed_entry() {
        let mut t = MrTable::default();
        for n in 0..MAX_REGIONS {
            assert!(!t.is_full(), "full after {n} keys");
            assert!(t.allocate_key().is_some(), "no key after {n}");
        }
        assert!(t.is_full());
        assert_eq!(t.allocate_key(), None);
        let key = (7 << TAG_BITS) | t.tags[7];
        t.insert(empty(key));
        t.remove(key);
        assert!(!t.is_full());
        assert_eq!(t.allocate_key().map(|k| k >> TAG_BITS), Some(7));
        assert!(t.is_full());
        assert_eq!(t.allocate_key(), None);
    }

    #[test]
    fn offsets_are_bounded_by_the_region() {
        let mr = MrInner::new(
            crate::mem::zeroed(100).expect("memory"),
            100,
            Access::empty(),
            1,
            0,
        );
        assert_eq!(mr.offset_of(mr.addr, 100), Some(0));
        assert_eq!(mr.offset_of(mr.addr + 99, 1), Some(99));
        assert_eq!(mr.offset_of(mr.addr + 99, 2), None);
        assert_eq!(mr.offset_of(mr.addr - 1, 1), None);
        assert_eq!(mr.offset_of(u64::MAX, 1), None);
        assert_eq!(mr.offset_of(mr.addr + 100, 0), Some(100));
        assert_eq!(mr.offset_of(mr.addr + 101, 0), None);
        assert_eq!(mr.offset_of(mr.addr + 1, u32::MAX), None);
    }

    proptest::proptest! {
        /// Any address and length, near the region or far from it: inside exactly when
        /// the whole range is, in exact arithmetic.
        #[test]
        fn an_offset_is_found_exactly_for_the_ranges_inside(
            delta in -300i128..300,
            far in proptest::bool::weighted(0.1),
            len in proptest::prop_oneof![0..=200u32, proptest::num::u32::ANY],
        ) {
            let mr = MrInner::new(
                crate::mem::zeroed(100).expect("memory"),
                100,
                Access::empty(),
                1,
                0,
            );
            let delta = if far { delta * (1i128 << 60) } else { delta };
            let addr = i128::from(mr.addr) + delta;
            proptest::prop_assume!((0..=i128::from(u64::MAX)).contains(&addr));
            let inside = delta >= 0 && delta + i128::from(len) <= 100;
            proptest::prop_assert_eq!(
                mr.offset_of(addr as u64, len),
                inside.then_some(delta as usize)
            );
        }
    }
}
