//! The constructs whose trace depends on timing (docs/scenarios.md, "The trace"), found in
//! a checked scenario before it runs: where a step races the NIC, the trace (completions,
//! outcomes, digests) may legitimately differ between runs and between devices.
//!
//! Work is in flight from its post until a step that waits for it: `poll = "idle"`, a
//! `drain` of its queue pair, or `device_fatal`. Waits for room and `poll = { cqes = N }`
//! retire some of it, which ones depending on the NIC, so the analysis does not count on
//! them: it may flag a step that happened to be safe, never the reverse for these classes.

use serde::Serialize;

use crate::model::{Action, Op, Post, Scenario};

/// A step whose outcome depends on timing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Race {
    /// The step, from 1.
    pub step: usize,
    /// The race class: `to_error_in_flight`, `dereg_in_flight`, `shared_credits`,
    /// `two_cqs`, `rnr_before_recv` or `same_bytes`.
    pub class: &'static str,
    /// Why, in words.
    pub why: String,
}

/// A byte range a queue pair's work in flight writes: region, start, end.
type Range = (usize, u64, u64);

#[derive(Default, Clone)]
struct Pair {
    /// Work requests (or a marker) posted since the last wait for all of them.
    in_flight: bool,
    /// Receives of its peer posted since then.
    recvs: u64,
    /// Receives posted and not yet met by a SEND or WRITE with immediate.
    unmet: u64,
    /// Work requests posted since the last wait for all of them (at most the depth: what
    /// may be outstanding).
    posted: u64,
    /// A post that may find no receive (rnr_retry below 7): its step, and the words for
    /// it. A receive posted after it races it.
    short: Option<(usize, String)>,
    /// What its work in flight writes (receives included).
    writes: Vec<Range>,
    /// The regions its work in flight uses.
    uses: Vec<usize>,
}

impl Pair {
    fn busy(&self) -> bool {
        self.in_flight || self.recvs > 0
    }
}

impl Scenario {
    /// The steps whose trace depends on timing, in step order (empty for a race-free
    /// scenario). `selsig run` warns of each, and the trace begins with a `races` line.
    pub fn races(&self) -> Vec<Race> {
        let mut pairs = vec![Pair::default(); self.qps.len()];
        let mut credits_flagged = vec![false; self.cqs.len()];
        let mut races = Vec::new();
        for (n, action) in self.steps.iter().enumerate() {
            let mut race = |class, why: String| {
                races.push(Race {
                    step: n + 1,
                    class,
                    why,
                })
            };
            match action {
                Action::Post(p) => {
                    let q = p.qp;
                    let name = &self.qps[q].name;
                    let writes = written(p);
                    if let Some(other) = overlap(&pairs, q, &writes) {
                        race(
                            "same_bytes",
                            format!(
                                "qp {name} writes bytes that the work of qp {} in flight writes too: which lands last depends on timing",
                                self.qps[other].name
                            ),
                        );
                    }
                    let consumes = matches!(p.op, Op::Send | Op::SendImm | Op::WriteImm);
                    let pair = &mut pairs[q];
                    if consumes && self.qps[q].rnr_retry < 7 && pair.unmet < p.count {
                        pair.short.get_or_insert((
                            n + 1,
                            format!(
                                "qp {name} (rnr_retry {}) posts {} {} with {} receive(s) waiting on its peer, and a receive is posted after them: the NIC may or may not find it (one it finds no receive for fails at once)",
                                self.qps[q].rnr_retry,
                                p.count,
                                op_name(p.op),
                                pair.unmet
                            ),
                        ));
                    }
                    if consumes {
                        pair.unmet = pair.unmet.saturating_sub(p.count);
                    }
                    pair.posted = (pair.posted + p.count).min(u64::from(self.qps[q].depth));
                    pair.in_flight = true;
                    pair.writes.extend(writes);
                    pair.uses.extend(regions_of(p));
                    let cq = self.qps[q].send_cq;
                    if !credits_flagged[cq] && self.cqs[cq].senders > 1 {
                        let room = self.credits(cq);
                        let depths: u64 = (0..pairs.len())
                            .filter(|&o| self.qps[o].send_cq == cq)
                            .map(|o| pairs[o].posted)
                            .sum();
                        if room < depths {
                            credits_flagged[cq] = true;
                            race(
                                "shared_credits",
                                format!(
                                    "cq {} holds completions for {room} work requests, and its send queues may have {depths} outstanding: which queue takes the last credit (and is signaled) depends on timing",
                                    self.cqs[cq].name
                                ),
                            );
                        }
                    }
                }
                Action::Recv(r) => {
                    let q = r.qp.index;
                    let writes: Vec<Range> = r
                        .region
                        .map(|g| (g, r.offset, r.offset + r.count * r.size))
                        .into_iter()
                        .filter(|w| w.2 > w.1)
                        .collect();
                    if let Some(other) = overlap(&pairs, q, &writes) {
                        race(
                            "same_bytes",
                            format!(
                                "receives of {} take bytes that the work of qp {} in flight writes: which lands last depends on timing",
                                self.qp_name(r.qp),
                                self.qps[other].name
                            ),
                        );
                    }
                    let pair = &mut pairs[q];
                    if let Some((step, why)) = pair.short.take() {
                        races.push(Race {
                            step,
                            class: "rnr_before_recv",
                            why,
                        });
                    }
                    pair.recvs += r.count;
                    pair.unmet += r.count;
                    pair.writes.extend(writes);
                    pair.uses.extend(r.region);
                }
                Action::PollIdle | Action::DeviceFatal => {
                    pairs.iter_mut().for_each(|p| *p = Pair::default());
                }
                Action::PollCqes(k) => {
                    let mut cqs: Vec<usize> = Vec::new();
                    for (i, p) in pairs.iter().enumerate() {
                        if p.in_flight {
                            cqs.push(self.qps[i].send_cq);
                        }
                        if p.recvs > 0 {
                            cqs.push(self.qps[i].peer_cq);
                        }
                    }
                    cqs.sort_unstable();
                    cqs.dedup();
                    if cqs.len() > 1 {
                        let names: Vec<&str> =
                            cqs.iter().map(|&c| self.cqs[c].name.as_str()).collect();
                        race(
                            "two_cqs",
                            format!(
                                "poll = {{ cqes = {k} }} while completions may come to {} CQs ({}): which come first depends on timing",
                                cqs.len(),
                                names.join(", ")
                            ),
                        );
                    }
                }
                Action::Confirm(q) => {
                    let pair = &mut pairs[*q];
                    pair.in_flight = true;
                    pair.posted = (pair.posted + 1).min(u64::from(self.qps[*q].depth));
                }
                Action::Drain(q) => pairs[*q] = Pair::default(),
                Action::Dereg(g) => {
                    if let Some(q) =
                        (0..pairs.len()).find(|&q| pairs[q].busy() && pairs[q].uses.contains(g))
                    {
                        race(
                            "dereg_in_flight",
                            format!(
                                "region {} is deregistered while work of qp {} that uses it is in flight: how much of it completes depends on timing",
                                self.regions[*g].name, self.qps[q].name
                            ),
                        );
                    }
                }
                Action::ToError(r) => {
                    if pairs[r.index].busy() {
                        race(
                            "to_error_in_flight",
                            format!(
                                "{} moves to the error state while work of its pair is in flight: how much of it completes before the rest is flushed depends on timing",
                                self.qp_name(*r)
                            ),
                        );
                    }
                }
            }
        }
        races.sort_by_key(|r| r.step);
        races
    }

    /// A CQ's credits for send completions: its size less the receive slots of the peers
    /// that report to it.
    fn credits(&self, cq: usize) -> u64 {
        let recvs: u64 = self
            .qps
            .iter()
            .filter(|q| q.peer_cq == cq)
            .map(|q| u64::from(q.peer_depth))
            .sum();
        u64::from(self.cqs[cq].size).saturating_sub(recvs)
    }
}

/// The bytes a post's work requests write: the remote ones of WRITEs and atomics, the
/// local ones of READs and atomics (the receives a SEND fills are its peer's, counted at
/// the `recv`).
fn written(p: &Post) -> Vec<Range> {
    let span = |off: u64, size: u64| (off, off + (p.count - 1) * p.stride + size);
    let mut w = Vec::new();
    if (matches!(p.op, Op::Write | Op::WriteImm) || p.op.is_atomic())
        && let Some(r) = p.remote
    {
        let (a, b) = span(p.remote_offset, p.size);
        w.push((r, a, b));
    }
    if p.op == Op::Read || p.op.is_atomic() {
        if let Some(l) = p.local {
            let (a, b) = span(p.local_offset, p.size);
            w.push((l, a, b));
        }
        for e in &p.list {
            let (a, b) = span(e.offset, e.size);
            w.push((e.region, a, b));
        }
    }
    w.retain(|r| r.2 > r.1);
    w
}

fn regions_of(p: &Post) -> Vec<usize> {
    let mut r: Vec<usize> = [p.local, p.remote].into_iter().flatten().collect();
    r.extend(p.list.iter().map(|e| e.region));
    r
}

/// Another queue pair whose work in flight writes some of `writes`.
fn overlap(pairs: &[Pair], q: usize, writes: &[Range]) -> Option<usize> {
    (0..pairs.len()).find(|&o| {
        o != q
            && pairs[o].busy()
            && pairs[o]
                .writes
                .iter()
                .any(|a| writes.iter().any(|b| a.0 == b.0 && a.1 < b.2 && b.1 < a.2))
    })
}

fn op_name(op: Op) -> &'static str {
    match op {
        Op::Send => "SENDs",
        Op::SendImm => "SENDs with immediate",
        _ => "WRITEs with immediate",
    }
}
