//! A work request's local data as the NIC thread executes it: where its bytes come from
//! (none, one region or its inline words, or a scatter/gather list, whose entries are all
//! checked before a byte moves) and how they are copied, gathered or scattered.

use selsig::Access;

use super::{Found, local, region, remembered};
use crate::mem;
use crate::mr::MrTable;
use crate::ring::Wqe;
use crate::state::QpInner;

/// A WQE's scatter/gather list (in its slot's inline words) whose entries were all found
/// good ([`List::checked`]) before any byte of the message moved.
#[derive(Clone, Copy)]
pub(super) struct List<'a> {
    words: &'a [std::sync::atomic::AtomicU64],
    count: usize,
    mrs: &'a MrTable,
}

impl<'a> List<'a> {
    /// The list of WQE `index` of `qp` (`wqe`, its `lkey` entries in the slot's inline
    /// words), if every entry is good: each non-empty one as [`local`] checks a single
    /// entry (the key is current, the region of protection domain `pd` grants `need`, the
    /// range is inside). An empty entry checks no key, as
    /// an empty single entry does: libmlx5 leaves entries of length 0 out of the WQE
    /// (`_mlx5_post_send`), rxe's `copy_data` looks up no region for them.
    ///
    /// All entries are checked first, so a bad one places nothing of the message (IBTA
    /// leaves the responder's memory undefined after a failed request; rxe copies entry by
    /// entry into each packet, so what it places before a bad entry is only the packets
    /// before the one that holds it: none, when the list is within the first packet).
    #[cold]
    pub(super) fn checked(
        qp: &'a QpInner,
        wqe: &Wqe,
        index: u64,
        mrs: &'a MrTable,
        pd: u64,
        need: Access,
    ) -> Option<Self> {
        let words = qp.sq.inline_words(index);
        let count = wqe.lkey as usize;
        for i in 0..count {
            let sge = crate::ring::list_entry(words, i)?;
            if sge.length > 0 {
                local(mrs, pd, sge.lkey, sge.addr, sge.length, need)?;
            }
        }
        Some(List { words, count, mrs })
    }

    /// Its non-empty entries in order: each one's region's words, offset and length.
    fn segments(
        self,
    ) -> impl Iterator<Item = (&'a [std::sync::atomic::AtomicU64], usize, u32)> + 'a {
        let List { words, count, mrs } = self;
        (0..count).filter_map(move |i| {
            let sge = crate::ring::list_entry(words, i).filter(|s| s.length > 0)?;
            // Found good by `checked`, in the pass's table, which does not change.
            let mr = mrs.get(sge.lkey)?;
            Some((
                &mr.words[..],
                mr.offset_of(sge.addr, sge.length)?,
                sge.length,
            ))
        })
    }

    /// Copies bytes `[from, from + len)` of the gathered message to `dst` at
    /// `dst_off + from`.
    pub(super) fn gather(
        self,
        from: u32,
        dst: &[std::sync::atomic::AtomicU64],
        dst_off: usize,
        len: u32,
    ) {
        let (from, end) = (u64::from(from), u64::from(from) + u64::from(len));
        let mut pos = 0u64;
        for (words, off, l) in self.segments() {
            let (start, stop) = (pos.max(from), (pos + u64::from(l)).min(end));
            if start < stop {
                mem::copy(
                    words,
                    off + (start - pos) as usize,
                    dst,
                    dst_off + start as usize,
                    (stop - start) as usize,
                );
            }
            pos += u64::from(l);
            if pos >= end {
                break;
            }
        }
    }

    /// Scatters the message at `src_off` of `src` over the entries, in order.
    pub(super) fn scatter(self, src: &[std::sync::atomic::AtomicU64], src_off: usize) {
        let mut pos = 0usize;
        for (words, off, l) in self.segments() {
            mem::copy(src, src_off + pos, words, off, l as usize);
            pos += l as usize;
        }
    }
}

/// Where the bytes of a work request come from.
pub(super) enum Source<'a> {
    Empty,
    Memory(&'a [std::sync::atomic::AtomicU64], usize),
    /// A scatter/gather list, gathered in order.
    Gather(List<'a>),
}

pub(super) fn source<'a>(
    qp: &'a QpInner,
    wqe: &Wqe,
    index: u64,
    mrs: &'a MrTable,
    found: &mut Found<'a>,
) -> Option<Source<'a>> {
    if wqe.inline {
        // Inline data has no key; a list has the number of its entries there.
        if wqe.lkey != 0 {
            return List::checked(qp, wqe, index, mrs, qp.pd, Access::empty()).map(Source::Gather);
        }
        return Some(Source::Memory(qp.sq.inline_words(index), 0));
    }
    if wqe.len == 0 {
        return Some(Source::Empty);
    }
    let mr = remembered(&mut found.source, wqe.lkey, || {
        region(mrs, qp.pd, wqe.lkey, Access::empty())
    })?;
    Some(Source::Memory(
        &mr.words,
        mr.offset_of(wqe.local_addr, wqe.len)?,
    ))
}

pub(super) fn copy(
    src: &Source<'_>,
    dst: &[std::sync::atomic::AtomicU64],
    dst_off: usize,
    len: u32,
) {
    copy_part(src, 0, dst, dst_off, len);
}

/// Copies bytes `[from, from + len)` of a message to the destination at `dst_off`, the
/// start of the message there.
pub(super) fn copy_part(
    src: &Source<'_>,
    from: u32,
    dst: &[std::sync::atomic::AtomicU64],
    dst_off: usize,
    len: u32,
) {
    match src {
        Source::Memory(words, off) if len > 0 => {
            let from = from as usize;
            mem::copy(words, *off + from, dst, dst_off + from, len as usize);
        }
        Source::Gather(list) => list.gather(from, dst, dst_off, len),
        _ => {}
    }
}
