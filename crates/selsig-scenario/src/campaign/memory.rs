//! The regions a race-free run must leave: each region's fill, changed by every work
//! request the trace shows completed (a WRITE places its bytes, a READ brings them back,
//! a SEND fills the receive it met, an atomic changes its 8 bytes and brings back the old
//! value), in the order the trace retires them; a work request failed, flushed or refused
//! places nothing. A failed one longer than the smallest MTU may have placed its first
//! packets (semantics 42), a failed atomic may have changed its remote 8 bytes (rxe writes
//! the value before only when the answer comes: semantics 41), and a `device_lost` one may have run or
//! not: the regions they could touch are not checked.

use std::collections::{BTreeMap, VecDeque};

use crate::bytes::{fill_pattern, fnv1a64};
use crate::model::{Action, Fill, Op, Post, Scenario};
use crate::trace::Event;

/// The smallest path MTU: a failed work request no longer than this sent one packet.
const MIN_MTU: u64 = 256;

struct Model<'a> {
    sc: &'a Scenario,
    mem: Vec<Vec<u8>>,
    unsure: Vec<bool>,
    /// The receives posted, by endpoint and `wr_id`: region, offset.
    recvs: BTreeMap<(String, u64), (Option<usize>, u64)>,
    /// The receives that completed successfully, by endpoint, in `wr_id` order: the ones
    /// the endpoint's SENDs and WRITEs with immediate met, in their order.
    met: BTreeMap<String, VecDeque<u64>>,
}

/// The regions whose digest is not what the outcomes make it, one line each.
pub(super) fn check(sc: &Scenario, trace: &[Event]) -> Vec<String> {
    let mut m = Model {
        sc,
        mem: sc
            .regions
            .iter()
            .map(|r| match r.fill {
                Fill::Zero => vec![0; r.size],
                Fill::Pattern => fill_pattern(r.size),
                Fill::Byte(b) => vec![b; r.size],
            })
            .collect(),
        unsure: vec![false; sc.regions.len()],
        recvs: BTreeMap::new(),
        met: BTreeMap::new(),
    };
    for e in trace {
        if let Event::Cqe {
            qp,
            wr_id,
            status: "success",
            opcode: Some("recv" | "recv_rdma_with_imm"),
            ..
        } = e
        {
            m.met.entry(qp.clone()).or_default().push_back(*wr_id);
        }
    }
    for ids in m.met.values_mut() {
        ids.make_contiguous().sort_unstable();
    }
    let mut problems = Vec::new();
    // The work request behind each (qp, seq): its post step and its index in it.
    let mut wrs: BTreeMap<(String, u64), (&Post, u64)> = BTreeMap::new();
    let mut action: Option<&Action> = None;
    let mut k = 0;
    for e in trace {
        match e {
            Event::Step { n, .. } => {
                action = sc.steps.get(n - 1);
                k = 0;
            }
            Event::Post {
                qp,
                seq,
                marker: false,
                ..
            } => {
                if let Some(Action::Post(p)) = action {
                    wrs.insert((qp.clone(), *seq), (p, k));
                    k += 1;
                }
            }
            Event::RecvPost { qp, wr_id, .. } => {
                if let Some(Action::Recv(r)) = action {
                    m.recvs
                        .insert((qp.clone(), *wr_id), (r.region, r.offset + k * r.size));
                    k += 1;
                }
            }
            Event::Retire {
                qp, seq, outcome, ..
            } => {
                if let Some(&(p, k)) = wrs.get(&(qp.clone(), *seq)) {
                    match *outcome {
                        "completed" => m.apply(p, k),
                        // An atomic may have run at the responder before the requester
                        // failed it (rxe checks the local key when the answer comes).
                        "failed" if p.size <= MIN_MTU && !p.op.is_atomic() => {}
                        "flushed" => {}
                        _ => m.touched(p),
                    }
                }
            }
            Event::Digest { region, fnv1a64: d } => {
                let Some(i) = sc.regions.iter().position(|r| &r.name == region) else {
                    continue;
                };
                let want = format!("{:016x}", fnv1a64(&m.mem[i]));
                if !m.unsure[i] && &want != d {
                    problems.push(format!(
                        "region {region}: digest {d}, where the outcomes make it {want}"
                    ));
                }
            }
            _ => {}
        }
    }
    problems
}

impl Model<'_> {
    /// The bytes work request `k` of `p` sends: its list's entries in order, or its local
    /// bytes (`None` where the model cannot tell).
    fn gather(&self, p: &Post, k: u64) -> Option<Vec<u8>> {
        if !p.list.is_empty() {
            let mut data = Vec::new();
            for e in &p.list {
                let at = (e.offset + k * p.stride) as usize;
                data.extend_from_slice(self.mem[e.region].get(at..at + e.size as usize)?);
            }
            return Some(data);
        }
        if p.size == 0 {
            return Some(Vec::new());
        }
        let at = (p.local_offset + k * p.stride) as usize;
        Some(self.mem[p.local?].get(at..at + p.size as usize)?.to_vec())
    }

    /// Writes `data` at `at` in region `r`, or marks `r` unknown where it does not fit.
    fn place(&mut self, r: usize, at: u64, data: &[u8]) {
        let at = at as usize;
        match self.mem[r].get_mut(at..at + data.len()) {
            Some(dst) => dst.copy_from_slice(data),
            None => self.unsure[r] = true,
        }
    }

    /// What completed work request `k` of `p` did to memory.
    fn apply(&mut self, p: &Post, k: u64) {
        let roff = p.remote_offset + k * p.stride;
        let peer = format!("{}.peer", self.sc.qps[p.qp].name);
        match p.op {
            Op::Write | Op::WriteImm => {
                if p.op == Op::WriteImm {
                    self.meet(&peer);
                }
                match (self.gather(p, k), p.remote) {
                    (Some(data), Some(r)) => self.place(r, roff, &data),
                    _ => self.touched(p),
                }
            }
            Op::Send | Op::SendImm => {
                let data = self.gather(p, k);
                match (data, self.meet(&peer)) {
                    (Some(data), Some((Some(r), at))) => self.place(r, at, &data),
                    (Some(data), Some((None, _))) if data.is_empty() => {}
                    _ => self.touched(p),
                }
            }
            Op::Read => {
                let Some(r) = p.remote else {
                    return self.touched(p);
                };
                let at = roff as usize;
                let Some(data) = self.mem[r]
                    .get(at..at + p.size as usize)
                    .map(<[u8]>::to_vec)
                else {
                    return self.touched(p);
                };
                self.scatter(p, k, &data);
            }
            Op::FetchAdd { .. } | Op::CmpSwap { .. } => {
                let (Some(r), at) = (p.remote, roff as usize) else {
                    return self.touched(p);
                };
                let Some(bytes) = self.mem[r].get(at..at + 8) else {
                    return self.touched(p);
                };
                let old = u64::from_ne_bytes(bytes.try_into().unwrap_or([0; 8]));
                let new = match p.op {
                    Op::FetchAdd { add } => old.wrapping_add(add),
                    Op::CmpSwap { compare, swap } if old == compare => swap,
                    _ => old,
                };
                self.place(r, roff, &new.to_ne_bytes());
                self.scatter(p, k, &old.to_ne_bytes());
            }
        }
    }

    /// Places what a READ or an atomic brought back: over the list's entries, or at the
    /// local offset.
    fn scatter(&mut self, p: &Post, k: u64, data: &[u8]) {
        if p.list.is_empty() {
            match p.local {
                Some(l) => self.place(l, p.local_offset + k * p.stride, data),
                None if data.is_empty() => {}
                None => self.touched(p),
            }
            return;
        }
        let mut rest = data;
        for e in p.list.clone() {
            let n = (e.size as usize).min(rest.len());
            self.place(e.region, e.offset + k * p.stride, &rest[..n]);
            rest = &rest[n..];
        }
    }

    /// The receive the next SEND or WRITE with immediate of `peer`'s requester met.
    fn meet(&mut self, peer: &str) -> Option<(Option<usize>, u64)> {
        let wr_id = self.met.get_mut(peer)?.pop_front()?;
        self.recvs.get(&(peer.to_string(), wr_id)).copied()
    }

    /// `p` may have changed any region it names, and its peer's receives: none of them
    /// is checked.
    fn touched(&mut self, p: &Post) {
        for r in [p.local, p.remote].into_iter().flatten() {
            self.unsure[r] = true;
        }
        for e in &p.list {
            self.unsure[e.region] = true;
        }
        if matches!(p.op, Op::Send | Op::SendImm) {
            let peer = format!("{}.peer", self.sc.qps[p.qp].name);
            for ((qp, _), (r, _)) in &self.recvs {
                if *qp == peer
                    && let Some(r) = r
                {
                    self.unsure[*r] = true;
                }
            }
        }
    }
}
