//! The steps that post: work requests (`post`), receives (`recv`), a confirm's marker and a
//! drain's (then its wait).

use anyhow::{Context, Result, anyhow, bail};
use selsig::{
    Device, DrainMarker, MemoryRegion, Opcode, PostError, PostFailure, PostWrError, QueuePair,
    QueuePostError, RecvWr, RemoteAddr, Sge, Signal, Work,
};

use crate::model::{Fault, Op, Post, Recv, SignalChoice};
use crate::trace::Event;

use super::runner::Runner;

impl<D: Device> Runner<'_, D> {
    /// A post step: its work requests, polling for room when the queue or its CQ is full.
    pub fn post(&mut self, p: &Post) -> Result<()> {
        let name = self.sc.qps[p.qp].name.clone();
        let (opcode, op_name) = match p.op {
            Op::Write => (Opcode::RdmaWrite, "rdma_write"),
            Op::WriteImm => (Opcode::RdmaWriteWithImm, "rdma_write_with_imm"),
            Op::Read => (Opcode::RdmaRead, "rdma_read"),
            Op::Send => (Opcode::Send, "send"),
            Op::SendImm => (Opcode::SendWithImm, "send_with_imm"),
            Op::FetchAdd { add } => (Opcode::AtomicFetchAdd { add }, "atomic_fetch_and_add"),
            Op::CmpSwap { compare, swap } => {
                (Opcode::AtomicCmpSwp { compare, swap }, "atomic_cmp_and_swp")
            }
        };
        let mut k = 0;
        while k < p.count {
            let fault = p.fault.filter(|(_, at)| *at == k + 1).map(|(f, _)| f);
            let loff = p.local_offset + k * p.stride;
            let roff = p.remote_offset + k * p.stride;
            let local = p.local.map(|l| &self.regions[l]);
            let list: Vec<Sge> = p
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
                    inline = vec![0u8; p.size as usize];
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
            let work = if p.inline {
                Work::inline(opcode, &inline, remote, k + 1)
            } else if !p.list.is_empty() {
                Work::raw_list(opcode, &list, remote, k + 1)
            } else {
                Work::raw(opcode, sge, remote, k + 1)
            }
            .imm(p.imm)
            .signal(signal);
            match self.sides[p.qp].queue.post(work) {
                Ok(posted) => {
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
                        qp: name.clone(),
                        seq: posted.seq.0,
                        op: op_name,
                        len: p.size,
                        signaled: posted.signaled(),
                        reason: posted.signal.map(|r| r.as_str()),
                        marker: false,
                    });
                    k += 1;
                }
                Err(QueuePostError::Refused(e)) if e.is_full() => {
                    // Poll one completion of this queue's CQ at a time until there is room:
                    // the same completions, in the same order, on every run.
                    self.poll_one_for_room(p.qp)?;
                }
                Err(QueuePostError::Refused(
                    e @ (PostError::QueueError { .. } | PostError::Draining { .. }),
                )) => {
                    self.trace.push(Event::Refused {
                        qp: name.clone(),
                        count: p.count - k,
                        why: e.to_string(),
                    });
                    return Ok(());
                }
                // selsig refused it before posting (a list longer than the QP's
                // max_send_sge): it and the rest of the step are not posted.
                Err(QueuePostError::Invalid { source, .. }) => {
                    self.trace.push(Event::Refused {
                        qp: name.clone(),
                        count: p.count - k,
                        why: source.to_string(),
                    });
                    return Ok(());
                }
                // The provider refused the work request itself (rxe's provider refuses a
                // misaligned atomic): it and the rest of the step are not posted.
                Err(QueuePostError::Provider {
                    source:
                        PostWrError {
                            failure: PostFailure::Invalid(why),
                            ..
                        },
                    ..
                }) => {
                    self.trace.push(Event::Refused {
                        qp: name.clone(),
                        count: p.count - k,
                        why: format!("the provider refused it: {why}"),
                    });
                    return Ok(());
                }
                Err(e) => bail!("cannot post work request {} on qp {name:?}: {e}", k + 1),
            }
        }
        Ok(())
    }

    /// A confirm step: a signaled marker behind an unsignaled tail, if there is one.
    pub fn confirm(&mut self, q: usize) -> Result<()> {
        let name = self.sc.qps[q].name.clone();
        let event = loop {
            match self.sides[q].queue.confirm_all() {
                Ok(Some(seq)) => break marker_event(name, seq.0),
                Ok(None) => break Event::ConfirmNotNeeded { qp: name },
                // A full queue or CQ: make room, as a post does.
                Err(QueuePostError::Refused(e)) if e.is_full() => self.poll_one_for_room(q)?,
                Err(QueuePostError::Refused(e)) => {
                    break Event::Refused {
                        qp: name,
                        count: 1,
                        why: e.to_string(),
                    };
                }
                Err(e) => bail!("cannot post the confirm marker of qp {name:?}: {e}"),
            }
        };
        self.trace.push(event);
        Ok(())
    }

    /// A recv step: receives on a peer, polling for room when its receive queue is full.
    pub fn recv(&mut self, r: &Recv) -> Result<()> {
        let name = self.sc.qp_name(r.qp);
        let q = r.qp.index;
        let own = r.qp;
        let depth = u64::from(self.sides[q].peer.caps().max_recv_wr);
        for k in 0..r.count {
            // A receive holds its slot until its completion is polled (mlx5 frees it only
            // then; rxe sooner): with the queue full, poll the peer's CQ one completion at
            // a time until one of its receives completed, so that every run polls the
            // same completions here, whatever the NIC's timing.
            if self.sides[q].peer_recvs - self.sides[q].peer_recv_done >= depth {
                let cq = self.sc.qps[q].peer_cq;
                self.poll_one_until(cq, own, |run| {
                    let s = &run.sides[q];
                    s.peer_recvs - s.peer_recv_done < depth
                })?;
            }
            let side = &mut self.sides[q];
            let sge = r.region.map(|g| {
                let region = &self.regions[g];
                Sge {
                    addr: region.addr + r.offset + k * r.size,
                    length: r.size as u32,
                    lkey: region.key_l,
                }
            });
            let wr_id = side.peer_recvs + 1;
            side.peer
                .post_recv(&[RecvWr { wr_id, sge }])
                .with_context(|| format!("cannot post a receive on {name:?}"))?;
            side.peer_recvs += 1;
            self.trace.push(Event::RecvPost {
                qp: name.clone(),
                wr_id,
                len: r.size,
            });
        }
        Ok(())
    }

    /// A drain step: no more posts, a marker if one is needed, then the wait until idle.
    pub fn drain(&mut self, q: usize) -> Result<()> {
        let name = self.sc.qps[q].name.clone();
        self.sides[q].queue.start_drain();
        loop {
            match self.sides[q].queue.post_drain_marker() {
                Ok(DrainMarker::Posted(seq)) => {
                    self.trace.push(marker_event(name.clone(), seq.0));
                    break;
                }
                Ok(DrainMarker::NotNeeded) => break,
                Ok(DrainMarker::NoRoom) => self.poll_one_for_room(q)?,
                Err(e) => bail!("cannot post the drain marker of qp {name:?}: {e}"),
            }
        }
        self.poll_until_drained(q)
    }
}

/// The trace's line for a confirm's or a drain's marker.
fn marker_event(qp: String, seq: u64) -> Event {
    Event::Post {
        qp,
        seq,
        op: "rdma_write",
        len: 0,
        signaled: true,
        reason: Some("marker"),
        marker: true,
    }
}
