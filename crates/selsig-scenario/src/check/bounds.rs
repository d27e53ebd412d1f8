//! What the checker knows of each peer's receive queue as the steps go: how many receives
//! may wait at most, and whether the peer may be in the error state and flush them. A step
//! that would wait for ever on receives nothing uses is refused with the file.

use std::collections::VecDeque;

use selsig::Access;

use crate::model::{Qp, Region};

/// What a peer's receive queue holds at most, as far as the file tells: the receives posted
/// on it less the SENDs and WRITEs with immediate posted to it (each uses one at most; those
/// posted once the QP may be in the error state are flushed and use none). Once the peer
/// may be in the error state, its receives may be flushed: no bound.
#[derive(Debug, Clone, Default)]
pub(super) struct RecvBound {
    pub posted: u64,
    pub consumers: u64,
    /// The peer may be in the error state (its receives flushed).
    pub flushed: bool,
    /// The QP may be in the error state (its later SENDs flushed).
    pub requester_error: bool,
    /// The QP's queue was drained: it refuses every later post.
    pub drained: bool,
    /// SENDs and WRITEs with immediate no receive was matched with yet, in order: (the
    /// bytes a SEND writes, `None` for a WRITE with immediate, which writes none into
    /// its receive; how many).
    pub waiting_sends: VecDeque<(Option<u64>, u64)>,
    /// Receives no SEND was matched with yet, in order: (size, region, how many).
    pub waiting_recvs: VecDeque<(u64, Option<usize>, u64)>,
}

/// Whether the NIC cannot use `region` for `need`: its access, the other protection
/// domain, or deregistered (by the step `deregistered`).
pub(super) fn unusable(region: &Region, deregistered: Option<usize>, need: Access) -> bool {
    !region.access.contains(need) || region.other_pd || deregistered.is_some()
}

impl RecvBound {
    /// Matches waiting SENDs with waiting receives, in order, as the NIC will: a SEND
    /// longer than its receive, or writing into a region the NIC cannot write
    /// (`unwritable`), fails at the peer, which goes to the error state and flushes the
    /// rest.
    pub fn match_receives(&mut self, unwritable: impl Fn(usize) -> bool) {
        while !self.flushed {
            let (Some(send), Some(recv)) = (
                self.waiting_sends.front_mut(),
                self.waiting_recvs.front_mut(),
            ) else {
                return;
            };
            let fails = send
                .0
                .is_some_and(|len| len > 0 && (len > recv.0 || recv.1.is_some_and(&unwritable)));
            if fails {
                self.flushed = true;
                self.requester_error = true;
                return;
            }
            let n = send.1.min(recv.2);
            send.1 -= n;
            recv.2 -= n;
            if send.1 == 0 {
                self.waiting_sends.pop_front();
            }
            if recv.2 == 0 {
                self.waiting_recvs.pop_front();
            }
        }
    }
}

/// A poll until idle (`poll = "idle"`, or `drain` for its queue pair's peer) waits for
/// every receive to complete: one that no SEND or WRITE with immediate posted before uses,
/// and no error flushes, never does. The error names the first such peer.
pub(super) fn unused_receives(bounds: &[RecvBound], qps: &[Qp]) -> Result<(), String> {
    for (b, q) in bounds.iter().zip(qps) {
        if !b.flushed && b.posted > b.consumers {
            return Err(format!(
                "{} of the {} receives posted on \"{}.peer\" are used by no SEND or WRITE \
                 with immediate posted before: this poll would wait for them for ever (post \
                 the SENDs first, or move the peer to the error state, to_error = \
                 \"{}.peer\", which flushes them)",
                b.posted - b.consumers,
                b.posted,
                q.name,
                q.name
            ));
        }
    }
    Ok(())
}
