//! What the runner keeps per queue pair (its queue, its peer, the receives posted there)
//! and per region, and what a queue that waits may be waiting for.

use anyhow::{Result, anyhow};
use selsig::{Device, QueueState, SignaledQueue};

use crate::model::Qp;

/// What a queue keeps per work request: its number in the step order.
pub(super) type Rec = u64;

/// A queue pair of the scenario: its queue, and its peer with the receives posted there.
pub(super) struct Side<D: Device> {
    pub queue: SignaledQueue<D, Rec>,
    /// Its peer (`None`: the remote side's, which this side cannot post to).
    pub peer: Option<D::Qp>,
    /// Receives posted on the peer (its wr_ids count from 1).
    pub peer_recvs: u64,
    pub peer_recv_done: u64,
    /// SENDs and WRITEs with immediate posted on this queue: each uses a receive at most.
    pub consumers: u64,
    /// The peer may be in the error state (moved there, or a request of this queue with a
    /// bad remote key or address), which flushes its receives.
    pub peer_flushable: bool,
}

impl<D: Device> Side<D> {
    /// Its peer, in this process.
    pub fn local_peer(&self) -> Result<&D::Qp> {
        self.peer
            .as_ref()
            .ok_or_else(|| anyhow!("the peer is on the remote side"))
    }

    /// What this queue's work requests may wait for: when the peer may be in the error
    /// state (it answers nothing) and this queue is not, rxe retransmitting them for ever
    /// at `retry_cnt` 7; when this queue posted more SENDs and WRITEs with immediate than
    /// receives were posted on its peer, and nothing failed, a receive.
    pub fn wait_hint(&self, qp: &Qp) -> String {
        let failed = matches!(self.queue.state(), QueueState::Error { .. });
        if self.peer_flushable && !failed && self.queue.outstanding() > 0 && qp.retry_cnt == 7 {
            return format!(
                " (\"{0}.peer\" may be in the error state, where it answers nothing: rxe \
                 retransmits for ever at retry_cnt 7; move \"{0}\" to the error state to \
                 flush its work requests, or set retry_cnt below 7)",
                qp.name
            );
        }
        if self.peer_flushable || failed || self.consumers <= self.peer_recvs {
            return String::new();
        }
        format!(
            " ({} SENDs and WRITEs with immediate beyond the {} receives posted on \"{}.peer\" \
             wait for one: the peer answers RNR, which rnr_retry {} {})",
            self.consumers - self.peer_recvs,
            self.peer_recvs,
            qp.name,
            qp.rnr_retry,
            if qp.rnr_retry == 7 {
                "retries for ever"
            } else {
                "retries a few times, then fails"
            }
        )
    }

    /// Why the peer's receive queue of `qp` stays full, when nothing may use or flush some
    /// of its receives.
    pub fn recv_hint(&self, qp: &Qp) -> String {
        let waiting = self.peer_recvs - self.peer_recv_done;
        let unused = waiting - self.usable_receives();
        let which = match unused {
            0 => return String::new(),
            n if n == waiting => format!("its {n} receives are"),
            n => format!("{n} of its {waiting} receives are"),
        };
        format!(
            ": {which} used by no SEND or WRITE with immediate posted, and not flushed (post \
             those first, or move the peer to the error state: to_error = \"{}.peer\")",
            qp.name
        )
    }

    /// The outstanding receives on the peer that can still complete: those a SEND or
    /// WRITE with immediate posted may still use, or every one once the peer may be in the
    /// error state and flush them: moved there, or while this queue has work outstanding
    /// or an error (a request can fail at the peer without a fault: a region without
    /// remote access, one deregistered, a receive too short).
    pub fn usable_receives(&self) -> u64 {
        let waiting = self.peer_recvs - self.peer_recv_done;
        let may_flush = self.peer_flushable
            || self.queue.outstanding() > 0
            || matches!(self.queue.state(), QueueState::Error { .. });
        match may_flush {
            true => waiting,
            // Every receive completed so far was used by one of them.
            false => waiting.min(self.consumers.saturating_sub(self.peer_recv_done)),
        }
    }
}

/// A region: registered (`None` once deregistered), with its address and keys.
pub(super) struct KeyedRegion<M> {
    pub mr: Option<M>,
    pub addr: u64,
    pub len: usize,
    pub key_l: u32,
    pub key_r: u32,
}
