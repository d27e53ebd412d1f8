//! A `post` step: its work requests, one at a time (polling for room when the queue or its
//! CQ is full) or as one batch.

use anyhow::{Result, anyhow, bail};
use selsig::{
    Device, MemoryRegion, Opcode, PostError, PostFailure, Posted, QueuePostError, RemoteAddr, Sge,
    Signal, Work,
};

use crate::model::{Fault, INLINE_TOO_LONG, Op, Post, SignalChoice};
use crate::trace::Event;

use super::runner::Runner;
use super::side::Rec;

/// What work request `k` of a post step is made of; its `Work` borrows the data.
struct Parts {
    sge: Option<Sge>,
    list: Vec<Sge>,
    inline: Vec<u8>,
    remote: RemoteAddr,
    signal: Signal,
}

impl Parts {
    fn work<M: MemoryRegion>(&self, opcode: Opcode, p: &Post, k: u64) -> Work<'_, M, Rec> {
        let work = if p.inline {
            Work::inline(opcode, &self.inline, self.remote, k + 1)
        } else if !p.list.is_empty() {
            Work::raw_list(opcode, &self.list, self.remote, k + 1)
        } else {
            Work::raw(opcode, self.sge, self.remote, k + 1)
        };
        work.imm(p.imm).signal(self.signal)
    }
}

/// The operation of a post step, and its name in the trace.
fn opcode(op: Op) -> (Opcode, &'static str) {
    match op {
        Op::Write => (Opcode::RdmaWrite, "rdma_write"),
        Op::WriteImm => (Opcode::RdmaWriteWithImm, "rdma_write_with_imm"),
        Op::Read => (Opcode::RdmaRead, "rdma_read"),
        Op::Send => (Opcode::Send, "send"),
        Op::SendImm => (Opcode::SendWithImm, "send_with_imm"),
        Op::FetchAdd { add } => (Opcode::AtomicFetchAdd { add }, "atomic_fetch_and_add"),
        Op::CmpSwap { compare, swap } => {
            (Opcode::AtomicCmpSwp { compare, swap }, "atomic_cmp_and_swp")
        }
    }
}

/// Why a provider refused a work request for what it is, as the trace says it: the same
/// words on every provider (the limits, which differ, are left out). `None` for the
/// refusals a scenario does not make on purpose (a full queue, a QP not ready): errors of
/// the run.
fn refusal(failure: &PostFailure) -> Option<String> {
    Some(match failure {
        PostFailure::Invalid(why) => (*why).to_string(),
        PostFailure::InlineTooLong { .. } => {
            "inline data longer than the queue pair's max_inline_data".to_string()
        }
        PostFailure::TooManySges { .. } => {
            "a list longer than the queue pair's max_send_sge".to_string()
        }
        _ => return None,
    })
}

impl<D: Device> Runner<'_, D> {
    /// Work request `k` of `p`: its local data, remote address, signal and fault.
    fn parts(&self, p: &Post, k: u64) -> Result<Parts> {
        let fault = p.fault.filter(|(_, at)| *at == k + 1).map(|(f, _)| f);
        let loff = p.local_offset + k * p.stride;
        let roff = p.remote_offset + k * p.stride;
        let local = p.local.map(|l| &self.regions[l]);
        let list = p
            .list
            .iter()
            .enumerate()
            .map(|(j, e)| {
                let region = &self.regions[e.region];
                let bad = fault == Some(Fault::BadLkey) && j == p.fault_entry;
                Sge {
                    addr: region.addr + e.offset + k * p.stride,
                    length: e.size as u32,
                    lkey: if bad {
                        region.key_l ^ 0x0005_a5a5
                    } else {
                        region.key_l
                    },
                }
            })
            .collect();
        let mut inline = Vec::new();
        let sge = match local {
            Some(l) if p.size > 0 && !p.inline => Some(Sge {
                addr: l.addr + loff,
                length: p.size as u32,
                lkey: if fault == Some(Fault::BadLkey) {
                    l.key_l ^ 0x0005_a5a5
                } else {
                    l.key_l
                },
            }),
            Some(l) if p.inline => {
                let len = match fault {
                    Some(Fault::InlineTooLong) => INLINE_TOO_LONG,
                    _ => p.size,
                };
                inline = vec![0u8; len as usize];
                let mr =
                    l.mr.as_ref()
                        .ok_or_else(|| anyhow!("the local region was deregistered"))?;
                mr.read(loff as usize, &mut inline)?;
                None
            }
            _ => None,
        };
        let remote = match p.remote.map(|r| &self.regions[r]) {
            Some(r) => {
                let addr = match fault {
                    // Starts inside the region (size/2 >= 1 bytes before its end), ends
                    // beyond it (the checker refuses sizes below 2).
                    Some(Fault::OutOfBounds) => r.addr + r.len as u64 - p.size / 2,
                    // An atomic's 8 bytes, 4 bytes off their alignment.
                    Some(Fault::Misaligned) => r.addr + roff + 4,
                    _ => r.addr + roff,
                };
                let rkey = if fault == Some(Fault::BadRkey) {
                    r.key_r ^ 0x0005_a5a5
                } else {
                    r.key_r
                };
                RemoteAddr { addr, rkey }
            }
            None => RemoteAddr::default(),
        };
        let signal = match p.signal {
            SignalChoice::Force => Signal::Force,
            SignalChoice::Last if k + 1 == p.count => Signal::Force,
            _ => Signal::Auto,
        };
        Ok(Parts {
            sge,
            list,
            inline,
            remote,
            signal,
        })
    }

    /// Work request `k` of `p` was posted: its line in the trace, and what it does to the
    /// peer.
    fn posted(&mut self, p: &Post, k: u64, posted: &Posted) {
        let name = self.sc.qps[p.qp].name.clone();
        let fault = p.fault.filter(|(_, at)| *at == k + 1).map(|(f, _)| f);
        let side = &mut self.sides[p.qp];
        if matches!(p.op, Op::Send | Op::SendImm | Op::WriteImm) {
            side.consumers += 1;
        }
        if matches!(
            fault,
            Some(Fault::BadRkey | Fault::OutOfBounds | Fault::Misaligned)
        ) {
            side.peer_flushable = true;
        }
        self.trace.push(Event::Post {
            qp: name,
            seq: posted.seq.0,
            op: opcode(p.op).1,
            len: p.size,
            signaled: posted.signaled(),
            reason: posted.signal.map(|r| r.as_str()),
            marker: false,
        });
    }

    /// The rest of a step, `count` work requests from one on, not posted: why.
    fn refused(&mut self, p: &Post, count: u64, why: String) {
        let qp = self.sc.qps[p.qp].name.clone();
        self.trace.push(Event::Refused { qp, count, why });
    }

    /// A post step: its work requests, polling for room when the queue or its CQ is full.
    pub fn post(&mut self, p: &Post) -> Result<()> {
        if p.batch {
            return self.post_batch(p);
        }
        let name = self.sc.qps[p.qp].name.clone();
        let opcode = opcode(p.op).0;
        let mut k = 0;
        while k < p.count {
            let parts = self.parts(p, k)?;
            match self.sides[p.qp].queue.post(parts.work(opcode, p, k)) {
                Ok(posted) => {
                    self.posted(p, k, &posted);
                    k += 1;
                }
                Err(QueuePostError::Refused(e)) if e.is_full() => {
                    // Poll one completion of this queue's CQ at a time until there is room:
                    // the same completions, in the same order, on every run.
                    self.poll_one_for_room(p.qp, 1)?;
                }
                Err(QueuePostError::Refused(
                    e @ (PostError::QueueError { .. } | PostError::Draining { .. }),
                )) => {
                    self.refused(p, p.count - k, e.to_string());
                    return Ok(());
                }
                // selsig refused it before posting (a list longer than the QP's
                // max_send_sge): it and the rest of the step are not posted.
                Err(QueuePostError::Invalid { source, .. }) => {
                    self.refused(p, p.count - k, source.to_string());
                    return Ok(());
                }
                // The provider refused the work request itself (rxe's provider refuses a
                // misaligned atomic; inline data beyond max_inline_data): it and the rest
                // of the step are not posted.
                Err(QueuePostError::Provider { source, .. })
                    if source.index == 0 && refusal(&source.failure).is_some() =>
                {
                    let why = refusal(&source.failure).unwrap_or_default();
                    self.refused(p, p.count - k, format!("the provider refused it: {why}"));
                    return Ok(());
                }
                Err(e) => bail!("cannot post work request {} on qp {name:?}: {e}", k + 1),
            }
        }
        Ok(())
    }

    /// A post step as one batch (`post_batch`, one doorbell), once the queue has room for
    /// all of it: what the provider took is traced as posted, the rest as refused (with
    /// `[device] post_api = "extended"`, a refused batch is refused whole).
    fn post_batch(&mut self, p: &Post) -> Result<()> {
        let name = self.sc.qps[p.qp].name.clone();
        let count = p.count as usize;
        loop {
            let queue = &self.sides[p.qp].queue;
            if queue.available() as usize >= count {
                break;
            }
            if queue.outstanding() == 0 {
                bail!(
                    "a batch of {count} does not fit qp {name:?}'s send queue and CQ ({} work \
                     requests fit, with none outstanding)",
                    queue.available()
                );
            }
            // Room comes only from completions: an unsignaled tail that holds the slots
            // the batch needs never completes.
            let tracker = queue.tracker();
            let slots = tracker.sq_capacity() - tracker.outstanding();
            if slots < count as u32 && tracker.signaled_outstanding() == 0 {
                bail!(
                    "a batch of {count} waits for room on qp {name:?} that no completion will \
                     make: its {} outstanding work requests are an unsignaled tail (`confirm` \
                     it first)",
                    tracker.outstanding()
                );
            }
            self.poll_one_for_room(p.qp, count as u32)?;
        }
        let parts = (0..p.count)
            .map(|k| self.parts(p, k))
            .collect::<Result<Vec<_>>>()?;
        let opcode = opcode(p.op).0;
        let mut works = parts
            .iter()
            .zip(0..)
            .map(|(parts, k)| parts.work(opcode, p, k));
        let mut registered = Vec::with_capacity(count);
        let result = self.sides[p.qp]
            .queue
            .post_batch_with(&mut works, |posted| registered.push(*posted));
        drop(works);
        // How many the provider took, and why the rest were not posted.
        let (taken, why) = match result {
            Ok(n) => (n, None),
            Err(QueuePostError::Provider { source, .. })
                if source.index < registered.len() && refusal(&source.failure).is_some() =>
            {
                let why = format!(
                    "the provider refused the batch from its work request {} on: {}",
                    source.index + 1,
                    refusal(&source.failure).unwrap_or_default()
                );
                (source.index, Some(why))
            }
            Err(QueuePostError::Refused(e)) => (registered.len(), Some(e.to_string())),
            Err(QueuePostError::Invalid { source, .. }) => {
                (registered.len(), Some(source.to_string()))
            }
            Err(e) => bail!("cannot post the batch on qp {name:?}: {e}"),
        };
        for (k, posted) in registered.iter().take(taken).enumerate() {
            self.posted(p, k as u64, posted);
        }
        if let Some(why) = why {
            self.refused(p, p.count - taken as u64, why);
        }
        Ok(())
    }
}
