//! `post = { qp, op, local, remote, size, count, ... }`: the fields of a post step, its
//! fault, whether its bytes lie in its regions, and what it does to the peer's receives.

use selsig::Access;

use crate::error::ScenarioError;
use crate::format::{EntryDecl, PostStep};
use crate::model::{Action, Entry, Fault, INLINE_TOO_LONG, Op, Post, SignalChoice};

/// The bytes an atomic operates on.
const ATOMIC_LEN: u64 = selsig::ATOMIC_LEN as u64;

use super::bounds::unusable;
use super::checker::{MAX_REGION, MAX_SGE};
use super::steps::{Here, Steps};

impl Steps<'_> {
    /// A post step.
    pub fn post(&mut self, at: &Here, p: &PostStep) -> Result<Action, ScenarioError> {
        let qp = self.find_qp(&p.qp, at, false)?.index;
        let op = self.post_op(at, p)?;
        // An atomic's size is 8 (given or not).
        let sized;
        let p = if op.is_atomic() && p.size == 0 {
            sized = PostStep {
                size: ATOMIC_LEN,
                ..p.clone()
            };
            &sized
        } else {
            p
        };
        if op.is_atomic() {
            self.atomic_fields(at, p)?;
        }
        // A list's size is its entries' together.
        let listed;
        let (p, list) = match &p.list {
            Some(entries) => {
                let list = self.post_list(at, p, entries)?;
                listed = PostStep {
                    size: list.iter().map(|e| e.size).sum(),
                    ..p.clone()
                };
                (&listed, list)
            }
            None => (p, Vec::new()),
        };
        let (local_offset, remote_offset, stride) = self.post_sizes(at, p)?;
        let (local, remote) = self.post_regions(at, p, op)?;
        let signal = match p.signal.as_str() {
            "auto" => SignalChoice::Auto,
            "force" => SignalChoice::Force,
            "last" => SignalChoice::Last,
            o => {
                return Err(self.here(at, format!("signal {o:?} is not auto, force or last")));
            }
        };
        if p.inline && (op == Op::Read || op.is_atomic() || p.size > 64) {
            return Err(self.here(
                at,
                "inline data is for WRITEs and SENDs of at most 64 bytes".into(),
            ));
        }
        let has_local = local.is_some() || !list.is_empty();
        let fault = self.post_fault(at, p, has_local, remote.is_some())?;
        let fault_entry = self.fault_entry(at, p, list.len())?;
        let post = Post {
            qp,
            op,
            local,
            remote,
            size: p.size,
            count: p.count,
            local_offset,
            remote_offset,
            stride,
            signal,
            inline: p.inline,
            imm: p.imm.unwrap_or(0),
            fault,
            list,
            fault_entry,
            batch: p.batch,
        };
        self.post_batch(at, &post)?;
        self.post_extent(at, p, &post)?;
        self.post_receives(&post);
        Ok(Action::Post(post))
    }

    /// The operation of a post, with its operands (refused on the others).
    fn post_op(&self, at: &Here, p: &PostStep) -> Result<Op, ScenarioError> {
        let op = match p.op.as_str() {
            "write" => Op::Write,
            "write_imm" => Op::WriteImm,
            "read" => Op::Read,
            "send" => Op::Send,
            "send_imm" => Op::SendImm,
            "fetch_add" => Op::FetchAdd {
                add: p.add.unwrap_or(1),
            },
            "cmp_swap" => match (p.compare, p.swap) {
                (Some(compare), Some(swap)) => Op::CmpSwap { compare, swap },
                _ => return Err(self.here(at, "cmp_swap needs compare and swap".into())),
            },
            o => {
                return Err(self.here(
                    at,
                    format!(
                        "unknown op {o:?}: expected write, write_imm, read, send, send_imm, \
                         fetch_add or cmp_swap"
                    ),
                ));
            }
        };
        for (field, given, op_of_it) in [
            ("add", p.add.is_some(), "fetch_add"),
            ("compare", p.compare.is_some(), "cmp_swap"),
            ("swap", p.swap.is_some(), "cmp_swap"),
        ] {
            if given && p.op != op_of_it {
                return Err(self.here(at, format!("{field} is for {op_of_it}, not {}", p.op)));
            }
        }
        Ok(op)
    }

    /// An atomic's 8 bytes, at a remote address 8-byte aligned (rxe refuses another at the
    /// post, mlx5 fails it at the responder: semantics 41), and the faults it can take.
    fn atomic_fields(&self, at: &Here, p: &PostStep) -> Result<(), ScenarioError> {
        if p.size != ATOMIC_LEN {
            return Err(self.here(
                at,
                format!(
                    "a {} operates on 8 bytes: size {} (leave it out)",
                    p.op, p.size
                ),
            ));
        }
        let (offset, stride) = (p.remote_offset.unwrap_or(0), p.stride.unwrap_or(p.size));
        if !offset.is_multiple_of(8) || !stride.is_multiple_of(8) {
            return Err(self.here(
                at,
                format!(
                    "a {}'s remote address must be 8-byte aligned: remote_offset {offset} \
                     and stride {stride} must be multiples of 8",
                    p.op
                ),
            ));
        }
        if p.fault.as_deref() == Some("out_of_bounds") {
            return Err(self.here(
                at,
                format!(
                    "fault \"out_of_bounds\" on a {}: 8 bytes that start in the region and end \
                     beyond it are misaligned too (use bad_rkey or bad_lkey)",
                    p.op
                ),
            ));
        }
        Ok(())
    }

    /// The count, size, offsets and stride of a post, in range; returns the offsets and the
    /// stride, defaults applied.
    fn post_sizes(&mut self, at: &Here, p: &PostStep) -> Result<(u64, u64, u64), ScenarioError> {
        self.count(at, p.count)?;
        if p.size > MAX_REGION {
            return Err(self.here(
                at,
                format!("size {} is larger than any region ({MAX_REGION})", p.size),
            ));
        }
        let stride = p.stride.unwrap_or(p.size);
        let local_offset = p.local_offset.unwrap_or(0);
        let remote_offset = p.remote_offset.unwrap_or(0);
        // Bounded like sizes, region or not, so that no offset arithmetic overflows.
        for (field, value) in [
            ("local_offset", local_offset),
            ("remote_offset", remote_offset),
            ("stride", stride),
        ] {
            if value > MAX_REGION {
                return Err(self.here(
                    at,
                    format!("{field} {value} is larger than any region ({MAX_REGION})"),
                ));
            }
        }
        Ok((local_offset, remote_offset, stride))
    }

    /// The local and remote regions of a post, and the fields that need them (or would
    /// change nothing).
    fn post_regions(
        &self,
        at: &Here,
        p: &PostStep,
        op: Op,
    ) -> Result<(Option<usize>, Option<usize>), ScenarioError> {
        let local = match &p.local {
            Some(l) => Some(self.find_region(l, at)?),
            None if p.size > 0 && p.list.is_none() => {
                return Err(self.here(
                    at,
                    format!("a {} of {} bytes needs a local region", p.op, p.size),
                ));
            }
            None => None,
        };
        let needs_remote = matches!(op, Op::Write | Op::WriteImm | Op::Read) || op.is_atomic();
        let remote = match (&p.remote, needs_remote) {
            (Some(r), true) => Some(self.find_region(r, at)?),
            (Some(_), false) => {
                return Err(self.here(at, format!("a {} has no remote region", p.op)));
            }
            (None, true) => {
                return Err(self.here(at, format!("a {} needs a remote region", p.op)));
            }
            (None, false) => None,
        };
        // Fields that would change nothing are refused, not ignored.
        if p.local_offset.is_some() && local.is_none() {
            return Err(self.here(at, "local_offset needs a local region".into()));
        }
        if p.remote_offset.is_some() && remote.is_none() {
            return Err(self.here(
                at,
                format!("remote_offset: a {} has no remote region", p.op),
            ));
        }
        if p.stride.is_some() && local.is_none() && remote.is_none() {
            return Err(self.here(
                at,
                "stride needs a local or remote region (it moves their offsets)".into(),
            ));
        }
        if p.imm.is_some() && !matches!(op, Op::WriteImm | Op::SendImm) {
            return Err(self.here(
                at,
                format!(
                    "imm: a {} carries no immediate data (write_imm and send_imm do)",
                    p.op
                ),
            ));
        }
        if p.fault_at.is_some() && p.fault.is_none() {
            return Err(self.here(at, "fault_at needs a fault".into()));
        }
        if let Some(l) = local.filter(|_| p.inline)
            && let Some(k) = self.deregistered[l]
        {
            return Err(self.here(
                at,
                format!(
                    "inline data from region {:?}, which step {k} deregistered",
                    self.regions[l].name
                ),
            ));
        }
        Ok((local, remote))
    }

    /// The fault of a post, and the work request it breaks.
    fn post_fault(
        &self,
        at: &Here,
        p: &PostStep,
        has_local: bool,
        has_remote: bool,
    ) -> Result<Option<(Fault, u64)>, ScenarioError> {
        let Some(f) = p.fault.as_deref() else {
            return Ok(None);
        };
        let kind = match f {
            "bad_rkey" => Fault::BadRkey,
            "bad_lkey" => Fault::BadLkey,
            "out_of_bounds" => Fault::OutOfBounds,
            "misaligned" if !matches!(p.op.as_str(), "fetch_add" | "cmp_swap") => {
                return Err(self.here(
                    at,
                    format!("fault \"misaligned\" is for the atomics, not {}", p.op),
                ));
            }
            "misaligned" => Fault::Misaligned,
            "inline_too_long" if p.op != "write" || !p.inline || p.size > 32 => {
                return Err(self.here(
                    at,
                    "fault \"inline_too_long\" is for inline WRITEs of at most 32 bytes (the \
                     QP asks for their size, which no NIC reads back as 64 or more)"
                        .into(),
                ));
            }
            "inline_too_long" => Fault::InlineTooLong,
            o => {
                return Err(self.here(
                    at,
                    format!(
                        "unknown fault {o:?}: expected bad_rkey, bad_lkey, out_of_bounds, \
                         misaligned or inline_too_long"
                    ),
                ));
            }
        };
        if p.size == 0 {
            return Err(self.here(at, format!(
                "fault {f:?} needs a post of more than 0 bytes: a zero-length transfer uses no key and touches no memory"
            )));
        }
        if kind == Fault::OutOfBounds && p.size < 2 {
            return Err(self.here(at,
                "fault \"out_of_bounds\" needs a post of 2 bytes or more: one byte cannot start in the region and end beyond it".into(),
            ));
        }
        let fault_at = p.fault_at.unwrap_or(1);
        if fault_at == 0 || fault_at > p.count {
            return Err(self.here(
                at,
                format!(
                    "fault_at {fault_at} names no work request of the {}",
                    p.count
                ),
            ));
        }
        if !matches!(kind, Fault::BadLkey | Fault::InlineTooLong) && !has_remote {
            return Err(self.here(at, format!("fault {f:?} needs a remote region")));
        }
        if kind == Fault::BadLkey && (!has_local || p.inline) {
            return Err(self.here(
                at,
                "fault \"bad_lkey\" needs a local region, not inline data".into(),
            ));
        }
        Ok(Some((kind, fault_at)))
    }

    /// A post's scatter/gather list: its regions, each entry's bytes, and the fields it
    /// replaces (`local`, `local_offset`, `size`) or cannot take (inline data, atomics).
    fn post_list(
        &self,
        at: &Here,
        p: &PostStep,
        entries: &[EntryDecl],
    ) -> Result<Vec<Entry>, ScenarioError> {
        for (field, given) in [
            ("local", p.local.is_some()),
            ("local_offset", p.local_offset.is_some()),
            (
                "size",
                p.size > 0 && !matches!(p.op.as_str(), "fetch_add" | "cmp_swap"),
            ),
            ("inline", p.inline),
        ] {
            if given {
                return Err(self.here(
                    at,
                    format!("{field} with a list: the list's entries say where the local bytes are and how many"),
                ));
            }
        }
        if matches!(p.op.as_str(), "fetch_add" | "cmp_swap") {
            return Err(self.here(
                at,
                format!("a {} takes one local entry (local), not a list", p.op),
            ));
        }
        if entries.is_empty() || entries.len() > MAX_SGE as usize {
            return Err(self.here(
                at,
                format!(
                    "a list of {} entries: a list has 1 to {MAX_SGE}",
                    entries.len()
                ),
            ));
        }
        entries
            .iter()
            .map(|e| {
                let region = self.find_region(&e.local, at)?;
                if e.size == 0 || e.size > MAX_REGION || e.offset > MAX_REGION {
                    return Err(self.here(
                        at,
                        format!(
                            "an entry of {} bytes at offset {}: an entry has 1 to {MAX_REGION} \
                             bytes at an offset up to {MAX_REGION}",
                            e.size, e.offset
                        ),
                    ));
                }
                Ok(Entry {
                    region,
                    offset: e.offset,
                    size: e.size,
                })
            })
            .collect()
    }

    /// The entry of its list a post's bad_lkey breaks (0-based).
    fn fault_entry(&self, at: &Here, p: &PostStep, entries: usize) -> Result<usize, ScenarioError> {
        let Some(n) = p.fault_entry else {
            return Ok(0);
        };
        if p.fault.as_deref() != Some("bad_lkey") || entries == 0 {
            return Err(self.here(
                at,
                "fault_entry is for a bad_lkey on a post with a list".into(),
            ));
        }
        if n == 0 || n > entries as u64 {
            return Err(self.here(
                at,
                format!("fault_entry {n} names no entry of the list of {entries}"),
            ));
        }
        Ok(n as usize - 1)
    }

    /// A batch: at least 2 work requests, no more than the QP's depth (it is posted whole,
    /// once the send queue has room for all of it).
    fn post_batch(&self, at: &Here, post: &Post) -> Result<(), ScenarioError> {
        let depth = self.qps[post.qp].depth;
        if post.batch && (post.count < 2 || post.count > u64::from(depth)) {
            return Err(self.here(
                at,
                format!(
                    "a batch of {} work requests: a batch has 2 up to the QP's depth ({depth}), \
                     as it is posted whole",
                    post.count
                ),
            ));
        }
        Ok(())
    }

    /// Whether every work request's bytes lie in its regions (faults aside), and the fields
    /// that would change nothing for this count and size.
    fn post_extent(&self, at: &Here, p: &PostStep, post: &Post) -> Result<(), ScenarioError> {
        if p.stride.is_some() && p.count == 1 {
            return Err(self.here(at,
                "stride with count 1: it moves the offsets of later work requests, and there are none"
                    .into(),
            ));
        }
        if p.size == 0 && p.inline {
            return Err(self.here(
                at,
                "inline with size 0: a zero-length transfer carries no data".into(),
            ));
        }
        // Every work request's bytes must lie in its regions (faults aside).
        let regions = self.regions;
        let last = p.count - 1;
        if let Some(l) = post.local {
            let mut end = post.local_offset + last * post.stride + p.size;
            // The work request an inline_too_long fault breaks reads more.
            if let Some((Fault::InlineTooLong, k)) = post.fault {
                end = end.max(post.local_offset + (k - 1) * post.stride + INLINE_TOO_LONG);
            }
            if end > regions[l].size as u64 {
                return Err(self.here(
                    at,
                    format!(
                        "the local bytes end at {end}, beyond region {:?} ({} bytes)",
                        regions[l].name, regions[l].size
                    ),
                ));
            }
        }
        for e in &post.list {
            let end = e.offset + last * post.stride + e.size;
            if end > regions[e.region].size as u64 {
                return Err(self.here(
                    at,
                    format!(
                        "an entry of the list ends at {end}, beyond region {:?} ({} bytes)",
                        regions[e.region].name, regions[e.region].size
                    ),
                ));
            }
        }
        if let Some(r) = post.remote {
            let end = post.remote_offset + last * post.stride + p.size;
            if end > regions[r].size as u64 {
                return Err(self.here(
                    at,
                    format!(
                        "the remote bytes end at {end}, beyond region {:?} ({} bytes)",
                        regions[r].name, regions[r].size
                    ),
                ));
            }
        }
        Ok(())
    }

    /// What a post does to its peer's receive queue: the receives its SENDs and WRITEs with
    /// immediate use, and whether it may put the QP or the peer in the error state.
    fn post_receives(&mut self, p: &Post) {
        let (regions, deregistered) = (self.regions, &self.deregistered);
        let cannot_use = |i: usize, need: Access| unusable(&regions[i], deregistered[i], need);
        let (op, fault) = (p.op, p.fault);
        let bound = &mut self.recv_bounds[p.qp];
        // Without a fault, a request may still fail. At the peer, which goes to the
        // error state and flushes its receives: a remote region it may not touch, a
        // QP that does not allow it (at any length: rxe checks that first), or a
        // SEND longer than its receive or into one the NIC cannot write. Here: a
        // local region it cannot use. A zero-length transfer uses no key. Taken as
        // possible errors, they loosen the bounds.
        let remote_need = match op {
            Op::Write | Op::WriteImm => Some(Access::REMOTE_WRITE),
            Op::Read => Some(Access::REMOTE_READ),
            Op::FetchAdd { .. } | Op::CmpSwap { .. } => Some(Access::REMOTE_ATOMIC),
            Op::Send | Op::SendImm => None,
        };
        let fails_at_peer = remote_need.is_some_and(|need| {
            !self.qps[p.qp].peer_access.contains(need)
                || (p.size > 0 && p.remote.is_some_and(|r| cannot_use(r, need)))
        });
        let local_need = match op {
            Op::Read | Op::FetchAdd { .. } | Op::CmpSwap { .. } => Access::LOCAL_WRITE,
            _ => Access::empty(),
        };
        // A local region the NIC cannot use fails the first work request on this
        // side (every one uses the region): none reaches the peer.
        let fails_here = p.size > 0
            && !p.inline
            && (p.local.is_some_and(|l| cannot_use(l, local_need))
                || p.list.iter().any(|e| cannot_use(e.region, local_need)));
        // SENDs and WRITEs with immediate use the peer's receives, in order, unless
        // the QP is in the error state (they are flushed) or drained (they are
        // refused): up to a bad local key or a local region it cannot use, which
        // fail on this side; a bad remote key or address fails at the peer, which
        // goes to the error state too and flushes its receives.
        let takes_posts = !bound.requester_error && !bound.drained;
        if matches!(op, Op::Send | Op::SendImm | Op::WriteImm) && takes_posts {
            let n = match fault {
                _ if fails_here => 0,
                Some((Fault::BadLkey, at)) => at - 1,
                _ => p.count,
            };
            bound.consumers += n;
            let writes = match op {
                Op::Send | Op::SendImm => Some(p.size),
                _ => None,
            };
            if n > 0 {
                bound.waiting_sends.push_back((writes, n));
            }
        }
        // A drained queue refuses the posts: nothing of them reaches a NIC.
        match fault {
            _ if bound.drained => {}
            // Refused at the post: nothing fails on a NIC.
            Some((Fault::InlineTooLong, _)) => {}
            Some((Fault::BadLkey, _)) => bound.requester_error = true,
            Some(_) => {
                bound.requester_error = true;
                bound.flushed = true;
            }
            None => {
                if fails_at_peer {
                    bound.flushed = true;
                }
                if fails_at_peer || fails_here {
                    bound.requester_error = true;
                }
            }
        }
        bound.match_receives(|i| cannot_use(i, Access::LOCAL_WRITE));
    }
}
