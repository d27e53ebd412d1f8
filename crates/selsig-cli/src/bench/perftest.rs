//! Perftest mode's own parts: ib_write_bw's addresses, and its loop over several queue pairs
//! (`--qp`, ib_write_bw's -q): round robin posting from one thread, each queue pair filled
//! up to the queue depth in turn, then one poll of the completion queue they share, whose
//! completions go to their queues by QP number (perftest's `run_iter_bw`).

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use selsig::{
    Completion, CompletionQueue as _, Device, MemoryRegion, Opcode, Outcome, QueuePair as _,
    RemoteAddr, SharedCq, Signal, SignaledQueue, WcStatus, Work, WorkCompletion,
};

use crate::bench::host::Geometry;

/// Where perftest's WRITE `index` (from 0) reads and writes: messages up to half a page
/// step through one page in cache-line multiples; larger ones all use offset 0.
pub(crate) fn perftest_offset(index: u64, size: u64, memory: Geometry) -> u64 {
    let Geometry { page, line } = memory;
    if size > page / 2 {
        return 0;
    }
    let step = size.div_ceil(line).max(1) * line;
    (index % (page / step)) * step
}

/// The offsets `iters` WRITEs of `size` bytes use, each once, in order.
pub(crate) fn offsets_used(iters: u64, size: u64, memory: Geometry) -> Vec<u64> {
    let mut offsets = Vec::new();
    for index in 0..iters {
        let at = perftest_offset(index, size, memory);
        if index > 0 && at == 0 {
            break;
        }
        offsets.push(at);
    }
    offsets
}

/// The completion queue the sends of `qps` queue pairs of `depth` WRITEs share: `depth ×
/// qps` entries, as ib_write_bw's, and one more, so that the pool of credits the queues
/// share never runs out and signals a WRITE the policy would not. (Their receive queues
/// report to a CQ of their own: ib_write_bw's report to the one CQ, and receive nothing.)
pub(crate) fn cq_entries(depth: u32, qps: u32) -> Result<u32> {
    depth
        .checked_mul(qps)
        .and_then(|n| n.checked_add(1))
        .with_context(|| {
            format!(
                "--qp {qps} with --tx-depth {depth}: their completion queue would need more \
                 than {} entries",
                u32::MAX
            )
        })
}

/// The WRITEs of one queue pair: from its slice of the local region (or inline data) to its
/// peer's memory.
pub(crate) struct QpWrites<'a, M> {
    /// The local region and where this QP's slice of it starts (none with inline data).
    pub(crate) local: Option<(&'a M, usize)>,
    /// The inline data (with `--inline`).
    pub(crate) inline: &'a [u8],
    pub(crate) target: RemoteAddr,
}

/// Buffers the loop uses, made before it runs (outside the measured time).
pub(crate) struct Scratch<M> {
    wcs: Vec<WorkCompletion>,
    done: Vec<Completion<M, ()>>,
    /// The queues the last poll had completions for.
    touched: Vec<usize>,
    /// The QP numbers, sorted, with each one's queue.
    by_qp_num: Vec<(u32, usize)>,
    pub(crate) posted: Vec<u64>,
    pub(crate) retired: Vec<u64>,
}

impl<M: MemoryRegion> Scratch<M> {
    /// For `queues` (perftest's poll batch: `batch` completions at once).
    pub(crate) fn new<D: Device<Mr = M>>(queues: &[SignaledQueue<D, ()>], batch: usize) -> Self {
        let mut by_qp_num: Vec<(u32, usize)> = queues
            .iter()
            .enumerate()
            .map(|(i, q)| (q.qp().qp_num(), i))
            .collect();
        by_qp_num.sort_unstable();
        Scratch {
            wcs: vec![WorkCompletion::new(0, WcStatus::Success, 0); batch],
            done: Vec::with_capacity(batch),
            touched: Vec::with_capacity(batch),
            by_qp_num,
            posted: vec![0; queues.len()],
            retired: vec![0; queues.len()],
        }
    }
}

/// The loop of a perftest-mode point over several queue pairs, sharing `shared`'s CQ:
/// `iters` WRITEs of `size` bytes on each, at most `depth` outstanding on each, the last of
/// each signaled (and every `--cq-mod`-th, by each queue's policy). Ends when every WRITE
/// retired; an error for one that did not complete, or when none retired for `stall`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn drive_qps<D: Device>(
    queues: &mut [SignaledQueue<D, ()>],
    shared: &SharedCq<D>,
    writes: &[QpWrites<'_, D::Mr>],
    iters: u64,
    size: u64,
    geometry: Geometry,
    depth: u32,
    stall: Duration,
    s: &mut Scratch<D::Mr>,
) -> Result<()> {
    let total = iters.saturating_mul(queues.len() as u64);
    let (mut posted_all, mut retired_all) = (0u64, 0u64);
    let mut loops = 0u32;
    let mut last_progress = Instant::now();
    let mut retired_at_check = 0u64;
    while posted_all < total || retired_all < total {
        loops = loops.wrapping_add(1);
        // Each queue pair in turn, filled up to the depth (perftest's loop over its QPs).
        for (i, (queue, w)) in queues.iter_mut().zip(writes).enumerate() {
            while s.posted[i] < iters && queue.outstanding() < depth {
                let index = s.posted[i];
                let at = perftest_offset(index, size, geometry);
                let work = match w.local {
                    Some((mr, base)) => Work::raw(
                        Opcode::RdmaWrite,
                        Some(mr.sge(base + at as usize, size as u32)),
                        w.target.offset(at),
                        (),
                    ),
                    None => Work::write_inline(w.inline, w.target.offset(at), ()),
                };
                // The last WRITE of each queue pair is signaled, as perftest's.
                let work = if index + 1 == iters {
                    work.signal(Signal::Force)
                } else {
                    work
                };
                queue.post(work).with_context(|| {
                    format!(
                        "cannot post on queue pair {} of {} (after {index} of its WRITEs)",
                        i + 1,
                        writes.len()
                    )
                })?;
                s.posted[i] += 1;
                posted_all += 1;
            }
        }
        if retired_all < total {
            // One poll of the shared CQ (perftest's), each completion to its queue.
            let polled = shared
                .cq()
                .poll(&mut s.wcs)
                .context("cannot poll the completion queue")?
                .min(s.wcs.len());
            for wc in &s.wcs[..polled] {
                let Ok(at) = s.by_qp_num.binary_search_by_key(&wc.qp_num, |&(n, _)| n) else {
                    bail!(
                        "a completion of QP number {}, none of the bench's queue pairs: {wc:?}",
                        wc.qp_num
                    );
                };
                let i = s.by_qp_num[at].1;
                queues[i]
                    .handle_completion(wc)
                    .with_context(|| format!("queue pair {}'s completion {wc:?}", i + 1))?;
                if !s.touched.contains(&i) {
                    s.touched.push(i);
                }
            }
            for i in s.touched.drain(..) {
                queues[i].collect(&mut s.done);
                for c in s.done.drain(..) {
                    if c.outcome != Outcome::Completed {
                        bail!(
                            "WRITE {} of queue pair {} ended {:?}",
                            c.seq.0,
                            i + 1,
                            c.outcome
                        );
                    }
                    s.retired[i] += 1;
                    retired_all += 1;
                }
            }
        }
        if loops.is_multiple_of(4096) {
            // A stall check that reads the clock rarely.
            if retired_all != retired_at_check {
                (retired_at_check, last_progress) = (retired_all, Instant::now());
            } else if last_progress.elapsed() > stall {
                bail!(
                    "no completion for {} s ({retired_all} of {posted_all} WRITEs retired, on \
                     {} queue pairs)",
                    stall.as_secs(),
                    queues.len()
                );
            }
        }
    }
    ensure!(
        s.retired.iter().all(|&r| r == iters),
        "WRITEs retired per queue pair: {:?}, not {iters} each",
        s.retired
    );
    Ok(())
}

/// Checks that `target`, a queue pair's peer memory, holds what its WRITEs of `size` bytes
/// carried where they went (`offsets`), and zeros elsewhere: each of its WRITEs landed there,
/// and no other queue pair's. A WRITE carried `local` at its offset, or with `inline` all of
/// `local` (its inline data). `qp` (from 1) names it.
pub(crate) fn check_target(
    qp: u32,
    target: &[u8],
    local: &[u8],
    inline: bool,
    offsets: &[u64],
    size: u64,
) -> Result<()> {
    let mut expected = vec![0u8; target.len()];
    for &at in offsets {
        let (from, to) = (at as usize, (at + size) as usize);
        let sent = if inline {
            local.get(..size as usize)
        } else {
            local.get(from..to)
        };
        match (expected.get_mut(from..to), sent) {
            (Some(slot), Some(sent)) => slot.copy_from_slice(sent),
            _ => bail!(
                "queue pair {qp}: a WRITE at {from}..{to} beyond its {} bytes",
                expected.len()
            ),
        }
    }
    if let Some(first) = target.iter().zip(&expected).position(|(a, b)| a != b) {
        bail!(
            "queue pair {qp}: its peer's memory differs from what its WRITEs carried at byte \
             {first} (of {}; {} WRITE offsets of {size} bytes)",
            target.len(),
            offsets.len()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn perftest_addresses_step_through_one_page() {
        let x86 = Geometry {
            page: 4096,
            line: 64,
        };
        let at = |i, size| perftest_offset(i, size, x86);
        assert_eq!(
            (at(0, 64), at(1, 64), at(63, 64), at(64, 64)),
            (0, 64, 4032, 0)
        );
        assert_eq!((at(1, 100), at(31, 100), at(32, 100)), (128, 3968, 0));
        assert_eq!((at(1, 2048), at(2, 2048)), (2048, 0));
        assert_eq!((at(1, 2049), at(7, 65536)), (0, 0));
        assert_eq!((at(1, 1), at(64, 1)), (64, 0));
        // 64 KiB pages and 128-byte lines (some aarch64 and POWER hosts).
        let large = Geometry {
            page: 65536,
            line: 128,
        };
        let at = |i, size| perftest_offset(i, size, large);
        assert_eq!((at(1, 64), at(511, 64), at(512, 64)), (128, 65408, 0));
        assert_eq!((at(1, 32768), at(2, 32768), at(1, 32769)), (32768, 0, 0));
    }

    #[test]
    fn the_offsets_used_are_each_once() {
        let x86 = Geometry {
            page: 4096,
            line: 64,
        };
        assert_eq!(offsets_used(5, 64, x86), [0, 64, 128, 192, 256]);
        assert_eq!(offsets_used(1000, 64, x86).len(), 64);
        assert_eq!(offsets_used(1000, 2048, x86), [0, 2048]);
        assert_eq!(offsets_used(1000, 65536, x86), [0]);
    }

    #[test]
    fn the_shared_cq_has_room_for_every_queue_pair() {
        assert_eq!(cq_entries(128, 2).unwrap(), 257);
        assert_eq!(cq_entries(15000, 16384).unwrap(), 15000 * 16384 + 1);
        let e = format!("{:#}", cq_entries(u32::MAX - 1, 2).unwrap_err());
        assert!(e.starts_with("--qp 2 with --tx-depth"), "{e}");
    }

    #[test]
    fn a_target_is_checked_where_its_writes_went_and_elsewhere() {
        let local: Vec<u8> = (1..=16).collect();
        let mut target = vec![0u8; 16];
        target[4..8].copy_from_slice(&local[4..8]);
        check_target(1, &target, &local, false, &[4], 4).unwrap();
        let e = format!(
            "{:#}",
            check_target(2, &target, &local, false, &[0, 4], 4).unwrap_err()
        );
        assert!(
            e.starts_with("queue pair 2: its peer's memory differs"),
            "{e}"
        );
        // Inline: the same data at every offset.
        let mut inline = vec![0u8; 16];
        inline[0..4].copy_from_slice(&local[0..4]);
        inline[8..12].copy_from_slice(&local[0..4]);
        check_target(1, &inline, &local[..4], true, &[0, 8], 4).unwrap();
        assert!(check_target(1, &inline, &local[..4], true, &[0], 4).is_err());
        target[12] = 9;
        assert!(check_target(1, &target, &local, false, &[4], 4).is_err());
    }
}
