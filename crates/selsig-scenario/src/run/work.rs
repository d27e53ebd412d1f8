//! The steps that post, but for `post` itself (`post.rs`): receives (`recv`), a confirm's
//! marker and a drain's (then its wait).

use anyhow::{Context, Result, bail};
use selsig::{Device, DrainMarker, QueuePair, QueuePostError, RecvWr, Sge};

use crate::model::Recv;
use crate::trace::Event;

use super::runner::Runner;

impl<D: Device> Runner<'_, D> {
    /// A confirm step: a signaled marker behind an unsignaled tail, if there is one.
    pub fn confirm(&mut self, q: usize) -> Result<()> {
        let name = self.sc.qps[q].name.clone();
        let event = loop {
            match self.sides[q].queue.confirm_all() {
                Ok(Some(seq)) => break marker_event(name, seq.0),
                Ok(None) => break Event::ConfirmNotNeeded { qp: name },
                // A full queue or CQ: make room, as a post does.
                Err(QueuePostError::Refused(e)) if e.is_full() => self.poll_one_for_room(q, 1)?,
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
        let depth = u64::from(self.sides[q].local_peer()?.caps().max_recv_wr);
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
            side.local_peer()?
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
                Ok(DrainMarker::NoRoom) => self.poll_one_for_room(q, 1)?,
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
