//! Runs a checked scenario on any provider and produces its canonical trace.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail, ensure};
use selsig::{
    Access, AsyncEvent, CompletionQueue, ConnectOptions, CqBudget, CqCredits, Device, DrainMarker,
    MemoryRegion, Opcode, Outcome, PostError, QpCaps, QpInit, QueueConfig, QueuePair,
    QueuePostError, QueueState, RecvWr, RemoteAddr, Sge, Signal, SignaledQueue, WcOpcode, WcStatus,
    Work, WorkCompletion,
};

use crate::common::{DeviceInfo, OnDevice, fnv1a64, pattern};
use crate::scenario::{Action, Expect, Fault, Fill, Op, Post, QpRef, Recv, Scenario, SignalChoice};
use crate::trace::Event;

/// How long a poll step may wait for the NIC.
const WAIT: Duration = Duration::from_secs(20);

/// The trace and whether the expectations held.
#[derive(Debug)]
pub struct RunResult {
    pub trace: Vec<Event>,
    /// Expectations that did not hold (empty: all met, or none given).
    pub failures: Vec<String>,
    /// What was checked, for the summary line.
    pub checked: Vec<String>,
    /// Why the expectations for rxe were used (the scenario's `differs.rxe`).
    pub differs: Option<String>,
    /// The step that failed (the trace ends there; expectations were not checked).
    pub error: Option<anyhow::Error>,
}

/// What a queue keeps per work request: its number in the step order.
type Rec = u64;

struct Side<D: Device> {
    queue: SignaledQueue<D, Rec>,
    peer: D::Qp,
    /// Receives posted on the peer (its wr_ids count from 1).
    peer_recvs: u64,
    peer_recv_done: u64,
    /// SENDs and WRITEs with immediate posted on this queue: each uses a receive at most.
    consumers: u64,
    /// The peer may be in the error state (moved there, or a request of this queue with a
    /// bad remote key or address), which flushes its receives.
    peer_flushable: bool,
}

impl<D: Device> Side<D> {
    /// What this queue's work requests may wait for: when the peer may be in the error
    /// state (it answers nothing) and this queue is not, rxe retransmitting them for ever
    /// at `retry_cnt` 7; when this queue posted more SENDs and WRITEs with immediate than
    /// receives were posted on its peer, and nothing failed, a receive.
    fn wait_hint(&self, qp: &crate::scenario::Qp) -> String {
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
    fn recv_hint(&self, qp: &crate::scenario::Qp) -> String {
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
    fn usable_receives(&self) -> u64 {
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

struct KeyedRegion<M> {
    mr: Option<M>,
    addr: u64,
    len: usize,
    key_l: u32,
    key_r: u32,
}

impl OnDevice for &Scenario {
    type Output = RunResult;

    fn run<D: Device>(self, dev: &D, info: &DeviceInfo) -> Result<RunResult> {
        let (expect, differs) = match (&self.expect_rxe, info.rxe) {
            (Some(rxe), true) => (rxe, self.differs.get("rxe").cloned()),
            _ => (&self.expect, None),
        };
        let mut result = Runner::<D>::new(self, dev, info)?.run(expect)?;
        result.differs = differs;
        Ok(result)
    }
}

struct Runner<'a, D: Device> {
    sc: &'a Scenario,
    dev: &'a D,
    cqs: Vec<Arc<D::Cq>>,
    sides: Vec<Side<D>>,
    regions: Vec<KeyedRegion<D::Mr>>,
    trace: Vec<Event>,
    /// QP number → endpoint.
    qpns: BTreeMap<u32, QpRef>,
    wcs: Vec<WorkCompletion>,
    /// Completions of other endpoints a wait for room polled (how many depends on
    /// timing), in the order polled, not handled yet: their endpoint takes them first when
    /// it waits for room itself, or the next step that polls does.
    stash: Vec<WorkCompletion>,
    /// The events of stashed completions that a wait had to hand over before then (a
    /// shared CQ's credits held by other queues): shown with the next step that polls, in
    /// canonical order, or, when their endpoint waits for room itself, before the events
    /// of its later completions.
    deferred: Vec<Event>,
    _pds: (D::Pd, Option<D::Pd>),
}

impl<'a, D: Device> Runner<'a, D> {
    fn new(sc: &'a Scenario, dev: &'a D, info: &DeviceInfo) -> Result<Self> {
        let pd = dev
            .alloc_pd()
            .context("cannot allocate a protection domain")?;
        let other = if sc.regions.iter().any(|r| r.other_pd) {
            Some(
                dev.alloc_pd()
                    .context("cannot allocate the second protection domain")?,
            )
        } else {
            None
        };
        let mut cqs = Vec::new();
        for c in &sc.cqs {
            cqs.push(Arc::new(
                dev.create_cq(c.size)
                    .with_context(|| format!("cannot create cq {:?}", c.name))?,
            ));
        }
        // Every queue pair and its peer, connected.
        let mut pairs = Vec::new();
        let mut qpns = BTreeMap::new();
        // Receive slots of the peers reporting to each CQ: every receive completes there
        // (if only flushed), so their entries are not the senders'.
        let mut recv_slots = vec![0u32; cqs.len()];
        for (index, q) in sc.qps.iter().enumerate() {
            // The requester posts no receives: one slot, whose completions never come.
            let init = QpInit {
                caps: QpCaps {
                    max_send_wr: q.depth,
                    max_recv_wr: 1,
                    max_inline_data: 64,
                    ..QpCaps::default()
                },
                sq_sig_all: q.sq_sig_all,
            };
            let peer_init = QpInit {
                caps: QpCaps {
                    max_send_wr: 1,
                    max_recv_wr: q.peer_depth,
                    max_inline_data: 64,
                    ..QpCaps::default()
                },
                sq_sig_all: false,
            };
            let send_cq = &cqs[q.send_cq];
            let peer_cq = &cqs[q.peer_cq];
            let qp = dev
                .create_qp(&pd, send_cq, send_cq, &init)
                .with_context(|| format!("cannot create qp {:?}", q.name))?;
            let peer = dev
                .create_qp(&pd, peer_cq, peer_cq, &peer_init)
                .with_context(|| format!("cannot create qp {:?}.peer", q.name))?;
            let options = ConnectOptions {
                gid_index: info.gid_index,
                rnr_retry: q.rnr_retry,
                retry_cnt: q.retry_cnt,
                ..ConnectOptions::default()
            };
            let peer_options = ConnectOptions {
                access: q.peer_access | Access::LOCAL_WRITE,
                ..options
            };
            let a = qp.endpoint(&options)?;
            let b = peer.endpoint(&peer_options)?;
            qp.connect(&b, &options)
                .with_context(|| format!("cannot connect qp {:?}", q.name))?;
            peer.connect(&a, &peer_options)
                .with_context(|| format!("cannot connect qp {:?}.peer", q.name))?;
            qpns.insert(qp.qp_num(), QpRef { index, peer: false });
            qpns.insert(peer.qp_num(), QpRef { index, peer: true });
            recv_slots[q.peer_cq] = recv_slots[q.peer_cq].saturating_add(peer.caps().max_recv_wr);
            pairs.push((qp, peer));
        }
        // What each CQ leaves for send completions.
        let mut room = Vec::new();
        for ((c, cq), recvs) in sc.cqs.iter().zip(&cqs).zip(&recv_slots) {
            let capacity = cq.capacity();
            ensure!(
                c.senders == 0 || capacity > *recvs,
                "cq {:?} holds {capacity} completions, no more than the {recvs} receive slots of \
                 the peers that report to it: none is left for send completions",
                c.name
            );
            // The runner keeps at most a receive queue's depth of receives uncompleted, so
            // their completions fit in a CQ that holds one for each slot.
            ensure!(
                capacity >= *recvs,
                "cq {:?} holds {capacity} completions, fewer than the {recvs} receive slots of \
                 the peers that report to it: their completions could overrun it",
                c.name
            );
            room.push(capacity.saturating_sub(*recvs));
        }
        // A CQ several send queues report to gets one pool of credits.
        let pools: Vec<Option<CqCredits>> = sc
            .cqs
            .iter()
            .zip(&room)
            .map(|(c, room)| (c.senders > 1).then(|| CqCredits::new(*room)))
            .collect();
        let mut sides = Vec::new();
        for (q, (qp, peer)) in sc.qps.iter().zip(pairs) {
            let send_cq = &cqs[q.send_cq];
            let config = QueueConfig {
                policy: q.policy,
                cq: Some(match &pools[q.send_cq] {
                    Some(pool) => CqBudget::Shared(pool.clone()),
                    None => CqBudget::Exclusive(room[q.send_cq]),
                }),
                ..QueueConfig::default()
            };
            let queue = SignaledQueue::with_config(qp, Arc::clone(send_cq), config)
                .with_context(|| format!("qp {:?}", q.name))?;
            sides.push(Side {
                queue,
                peer,
                peer_recvs: 0,
                peer_recv_done: 0,
                consumers: 0,
                peer_flushable: false,
            });
        }
        let mut regions = Vec::new();
        for r in &sc.regions {
            let on = if r.other_pd {
                other.as_ref().unwrap_or(&pd)
            } else {
                &pd
            };
            let mr = dev
                .reg_mr(on, r.size, r.access)
                .with_context(|| format!("cannot register region {:?}", r.name))?;
            match r.fill {
                Fill::Zero => {}
                Fill::Pattern => {
                    // The pattern of "work request" 0: distinct from any WRITE's bytes.
                    mr.write(0, &pattern(0, r.size))?
                }
                Fill::Byte(b) => mr.fill(0, r.size, b)?,
            }
            regions.push(KeyedRegion {
                addr: mr.addr(),
                len: mr.len(),
                key_l: mr.lkey(),
                key_r: mr.rkey(),
                mr: Some(mr),
            });
        }
        Ok(Runner {
            sc,
            dev,
            cqs,
            sides,
            regions,
            trace: Vec::new(),
            qpns,
            wcs: vec![WorkCompletion::new(0, WcStatus::Success, 0); 64],
            stash: Vec::new(),
            deferred: Vec::new(),
            _pds: (pd, other),
        })
    }

    fn run(mut self, expect: &Expect) -> Result<RunResult> {
        for (n, action) in self.sc.steps.iter().enumerate() {
            self.trace.push(Event::Step {
                n: n + 1,
                kind: action.kind(),
            });
            if let Err(e) = self.step(action) {
                let e = e.context(format!("step {} ({})", n + 1, action.kind()));
                return Ok(self.stopped(e));
            }
        }
        // Completions a last wait for room polled for others, and events that arrived
        // since the last poll.
        let mut events = std::mem::take(&mut self.deferred);
        if let Err(e) = self.handle_stash(&mut events) {
            let e = self.failed(events, e);
            return Ok(self.stopped(e));
        }
        self.async_events(&mut events);
        canonical(&mut events, self.sc);
        self.trace.extend(events);
        // Regions are read only once the NIC is done with them, and every work request
        // must have its outcome.
        if !self.idle() {
            let e = anyhow!(
                "the run ended with work outstanding (end it with `poll = \"idle\"` or \
                 `drain`): {}",
                self.outstanding(None).join("; ")
            );
            return Ok(self.stopped(e));
        }
        for (r, k) in self.sc.regions.iter().zip(&self.regions) {
            if let Some(mr) = &k.mr {
                let mut bytes = vec![0u8; k.len];
                mr.read(0, &mut bytes)?;
                self.trace.push(Event::Digest {
                    region: r.name.clone(),
                    fnv1a64: format!("{:016x}", fnv1a64(&bytes)),
                });
            }
        }
        let (failures, checked) = check(expect, &self.trace);
        Ok(RunResult {
            trace: self.trace,
            failures,
            checked,
            differs: None,
            error: None,
        })
    }

    /// A run that failed: the trace so far (with what it polled last, in canonical order)
    /// shows what led there.
    fn stopped(mut self, error: anyhow::Error) -> RunResult {
        let mut events = std::mem::take(&mut self.deferred);
        // Best effort: the step's error is the one to report.
        let _ = self.handle_stash(&mut events);
        canonical(&mut events, self.sc);
        self.trace.extend(events);
        RunResult {
            trace: self.trace,
            failures: Vec::new(),
            checked: Vec::new(),
            differs: None,
            error: Some(error),
        }
    }

    fn step(&mut self, action: &Action) -> Result<()> {
        match action {
            Action::Post(p) => self.post(p),
            Action::Recv(r) => self.recv(r),
            Action::PollIdle => self.poll_until(None),
            Action::PollCqes(n) => self.poll_until(Some(*n)),
            Action::Confirm(q) => self.confirm(*q),
            Action::Drain(q) => self.drain(*q),
            Action::Dereg(r) => {
                self.regions[*r].mr = None;
                self.trace.push(Event::Dereg {
                    region: self.sc.regions[*r].name.clone(),
                });
                Ok(())
            }
            Action::ToError(r) => {
                let side = &mut self.sides[r.index];
                if r.peer {
                    side.peer.to_error()?;
                    side.peer_flushable = true;
                } else {
                    side.queue.qp().to_error()?;
                }
                self.trace.push(Event::ToError {
                    qp: self.sc.qp_name(*r),
                });
                Ok(())
            }
        }
    }

    fn post(&mut self, p: &Post) -> Result<()> {
        let name = self.sc.qps[p.qp].name.clone();
        let (opcode, op_name) = match p.op {
            Op::Write => (Opcode::RdmaWrite, "rdma_write"),
            Op::WriteImm => (Opcode::RdmaWriteWithImm, "rdma_write_with_imm"),
            Op::Read => (Opcode::RdmaRead, "rdma_read"),
            Op::Send => (Opcode::Send, "send"),
            Op::SendImm => (Opcode::SendWithImm, "send_with_imm"),
        };
        let mut k = 0;
        while k < p.count {
            let fault = p.fault.filter(|(_, at)| *at == k + 1).map(|(f, _)| f);
            let loff = p.local_offset + k * p.stride;
            let roff = p.remote_offset + k * p.stride;
            let local = p.local.map(|l| &self.regions[l]);
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
                    let addr = if fault == Some(Fault::OutOfBounds) {
                        // Starts inside the region (size/2 >= 1 bytes before its end), ends
                        // beyond it (the checker refuses sizes below 2).
                        r.addr + r.len as u64 - p.size / 2
                    } else {
                        r.addr + roff
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
                    if matches!(fault, Some(Fault::BadRkey | Fault::OutOfBounds)) {
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
                Err(e) => bail!("cannot post work request {} on qp {name:?}: {e}", k + 1),
            }
        }
        Ok(())
    }

    fn confirm(&mut self, q: usize) -> Result<()> {
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

    /// Polls the CQ of queue `qp` one completion at a time until the queue has room. The
    /// queue's own completions go into the trace in place (they made the room); those of
    /// other endpoints sharing the CQ, how many of which come first depends on timing,
    /// wait unhandled until their endpoint needs room or a step polls.
    fn poll_one_for_room(&mut self, qp: usize) -> Result<()> {
        let cq = self.sc.qps[qp].send_cq;
        let own = QpRef {
            index: qp,
            peer: false,
        };
        self.poll_one_until(cq, own, |r| r.sides[qp].queue.available() > 0)
    }

    /// The endpoint a completion belongs to.
    fn owner(&self, wc: &WorkCompletion) -> Option<QpRef> {
        self.qpns.get(&wc.qp_num).copied()
    }

    /// Polls `cq` one completion at a time until `room` holds (see
    /// [`poll_one_for_room`](Self::poll_one_for_room)): first the completions of `own`
    /// an earlier wait kept for it, then the CQ's. Only a send queue that has no signaled
    /// work request outstanding, and so waits for a shared CQ's credits that other queues'
    /// completions hold, hands those kept completions to their queues (their events go to
    /// the next step that polls): which of them it finds first depends on timing, as
    /// documented.
    fn poll_one_until(
        &mut self,
        cq: usize,
        own: QpRef,
        room: impl Fn(&Self) -> bool,
    ) -> Result<()> {
        let start = Instant::now();
        while !room(self) {
            let mut events = Vec::new();
            if let Some(i) = self.stash.iter().position(|wc| self.owner(wc) == Some(own)) {
                let wc = self.stash.remove(i);
                self.handle(wc, &mut events)?;
                self.show_in_place(own, events);
                continue;
            }
            let k = self.cqs[cq]
                .poll(&mut self.wcs[..1])
                .with_context(|| format!("cannot poll cq {:?}", self.sc.cqs[cq].name))?;
            if k == 1 {
                let wc = self.wcs[0];
                if self.owner(&wc) == Some(own) {
                    self.handle(wc, &mut events)?;
                    self.show_in_place(own, events);
                } else {
                    self.stash.push(wc);
                }
                continue;
            }
            let waits_for_others =
                !own.peer && self.sides[own.index].queue.tracker().signaled_outstanding() == 0;
            if waits_for_others && !self.stash.is_empty() {
                let wc = self.stash.remove(0);
                self.handle(wc, &mut events)?;
                self.deferred.extend(events);
                continue;
            }
            ensure!(
                start.elapsed() < WAIT,
                "{:?} stayed full{}",
                self.sc.qp_name(own),
                match own.peer {
                    false => self.sides[own.index].wait_hint(&self.sc.qps[own.index]),
                    true => self.sides[own.index].recv_hint(&self.sc.qps[own.index]),
                }
            );
            std::thread::yield_now();
        }
        Ok(())
    }

    /// Shows `events`, of `own`'s completions, in the trace now: after the events of
    /// `own`'s earlier completions that another wait handed over, which would otherwise
    /// show later, with the next step that polls.
    fn show_in_place(&mut self, own: QpRef, events: Vec<Event>) {
        if self.deferred.is_empty() {
            self.trace.extend(events);
            return;
        }
        let name = self.sc.qp_name(own);
        let (earlier, others): (Vec<Event>, Vec<Event>) =
            std::mem::take(&mut self.deferred).into_iter().partition(
                |e| matches!(e, Event::Cqe { qp, .. } | Event::Retire { qp, .. } if *qp == name),
            );
        self.deferred = others;
        self.trace.extend(earlier);
        self.trace.extend(events);
    }

    /// Hands the completions waits kept for others to their endpoints, in the order
    /// polled; their events go to `events`.
    fn handle_stash(&mut self, events: &mut Vec<Event>) -> Result<()> {
        for wc in std::mem::take(&mut self.stash) {
            self.handle(wc, events)?;
        }
        Ok(())
    }

    fn recv(&mut self, r: &Recv) -> Result<()> {
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

    fn drain(&mut self, q: usize) -> Result<()> {
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

    /// Polls the CQs of queue `q` (its send CQ and its peer's) until `q` is idle: every
    /// work request retired and every receive of its peer completed. Other queues' work,
    /// an unsignaled tail among it, is no concern of the drain: their completions found on
    /// a shared CQ wait, unhandled, for the next step that polls them (as a wait for room
    /// keeps them). The step's events are put in canonical order.
    fn poll_until_drained(&mut self, q: usize) -> Result<()> {
        let mut start = Instant::now();
        let mut events = std::mem::take(&mut self.deferred);
        let own = |r: Option<QpRef>| r.is_some_and(|r| r.index == q);
        let (mine, others): (Vec<_>, Vec<_>) = std::mem::take(&mut self.stash)
            .into_iter()
            .partition(|wc| own(self.owner(wc)));
        self.stash = others;
        for wc in mine {
            if let Err(e) = self.handle(wc, &mut events) {
                return Err(self.failed(events, e));
            }
        }
        let qp = &self.sc.qps[q];
        let mut cqs = vec![qp.send_cq, qp.peer_cq];
        cqs.dedup();
        cqs.sort_unstable();
        while !self.side_idle(q) {
            let mut progress = 0;
            for &cq in &cqs {
                let k = match self.cqs[cq].poll(&mut self.wcs) {
                    Ok(k) => k,
                    Err(e) => {
                        let e = anyhow!(e)
                            .context(format!("cannot poll cq {:?}", self.sc.cqs[cq].name));
                        return Err(self.failed(events, e));
                    }
                };
                for i in 0..k {
                    let wc = self.wcs[i];
                    if !own(self.owner(&wc)) {
                        self.stash.push(wc);
                    } else if let Err(e) = self.handle(wc, &mut events) {
                        return Err(self.failed(events, e));
                    }
                }
                progress += k;
            }
            if progress > 0 {
                start = Instant::now();
            } else if start.elapsed() > WAIT {
                let e = anyhow!(
                    "not drained (no completion for {WAIT:?}): {}",
                    self.outstanding(Some(q)).join("; ")
                );
                return Err(self.failed(events, e));
            } else {
                std::thread::yield_now();
            }
        }
        self.async_events(&mut events);
        canonical(&mut events, self.sc);
        self.trace.extend(events);
        Ok(())
    }

    /// Polls every CQ until nothing is outstanding (`None`) or `n` completions arrived;
    /// the step's events are put in canonical order: completions by QP, then
    /// retirements by QP, then asynchronous events.
    fn poll_until(&mut self, n: Option<u64>) -> Result<()> {
        // The time of the last completion: the step fails after WAIT without one.
        let mut start = Instant::now();
        let mut events = std::mem::take(&mut self.deferred);
        if let Err(e) = self.handle_stash(&mut events) {
            return Err(self.failed(events, e));
        }
        let mut got = 0u64;
        loop {
            let done = match n {
                Some(n) => got >= n,
                None => self.idle(),
            };
            if done {
                break;
            }
            let mut progress = 0;
            for cq in 0..self.cqs.len() {
                let max = n.map_or(self.wcs.len(), |n| (n - got) as usize);
                if max == 0 {
                    break;
                }
                let k = match self.poll_cq(cq, max, &mut events) {
                    Ok(k) => k,
                    Err(e) => return Err(self.failed(events, e)),
                };
                got += k as u64;
                progress += k;
            }
            if progress == 0 {
                if let Some(n) = n {
                    // Every outstanding work request and receive gives at most one
                    // completion (an error or a flush gives one even to an unsignaled one).
                    let possible = self.completions_possible();
                    if got + possible < n {
                        let e = anyhow!(
                            "only {got} of {n} completions arrived and no more can: {}",
                            if self.idle() {
                                "nothing is outstanding".to_string()
                            } else {
                                format!(
                                    "at most {possible} more ({})",
                                    self.outstanding(None).join("; ")
                                )
                            }
                        );
                        return Err(self.failed(events, e));
                    }
                }
                if start.elapsed() > WAIT {
                    let e = anyhow!("{}", self.stuck(n, got));
                    return Err(self.failed(events, e));
                }
                std::thread::yield_now();
            } else {
                start = Instant::now();
            }
        }
        self.async_events(&mut events);
        canonical(&mut events, self.sc);
        self.trace.extend(events);
        Ok(())
    }

    /// A poll step failed: what it saw so far goes into the trace, in canonical order.
    fn failed(&mut self, mut events: Vec<Event>, e: anyhow::Error) -> anyhow::Error {
        self.async_events(&mut events);
        canonical(&mut events, self.sc);
        self.trace.extend(events);
        e
    }

    fn stuck(&self, n: Option<u64>, got: u64) -> String {
        match n {
            Some(n) => {
                let waiting = self.outstanding(None);
                match waiting.is_empty() {
                    true => format!("only {got} of {n} completions arrived (none for {WAIT:?})"),
                    false => format!(
                        "only {got} of {n} completions arrived (none for {WAIT:?}): {}",
                        waiting.join("; ")
                    ),
                }
            }
            None => format!(
                "not idle (no completion for {WAIT:?}): {}",
                self.outstanding(None).join("; ")
            ),
        }
    }

    /// What each queue pair (or only queue `only`) still waits for.
    fn outstanding(&self, only: Option<usize>) -> Vec<String> {
        self.sc
            .qps
            .iter()
            .zip(&self.sides)
            .enumerate()
            .filter(|(i, _)| only.is_none_or(|q| q == *i))
            .map(|(_, pair)| pair)
            .filter(|(_, s)| !s.queue.tracker().is_idle() || s.peer_recvs > s.peer_recv_done)
            .map(|(q, s)| {
                let outstanding = s.queue.outstanding();
                // Unsignaled work requests after the last signaled one complete silently:
                // only a later signaled one (or an error) can confirm them.
                let tail = if outstanding > 0
                    && s.queue.tracker().unsignaled_run() == outstanding
                    && s.queue.state() == QueueState::Ready
                {
                    format!(
                        " (all of them an unsignaled tail, which no completion confirms: \
                         `confirm = {0:?}` or `drain = {0:?}` before polling)",
                        q.name
                    )
                } else {
                    String::new()
                };
                let waiting = s.peer_recvs - s.peer_recv_done;
                let unused = waiting - s.usable_receives();
                let unused = if unused > 0 {
                    format!(
                        " ({unused} of them used by no SEND or WRITE with immediate posted, \
                         and not flushed)"
                    )
                } else {
                    String::new()
                };
                format!(
                    "{}: {outstanding} work requests{tail}, {waiting} receives \
                     outstanding{unused}{}",
                    q.name,
                    s.wait_hint(q),
                )
            })
            .collect()
    }

    /// The most completions that can still arrive: one per outstanding work request, and
    /// one per outstanding receive that a SEND or WRITE with immediate posted may still use
    /// (every one, once the peer may be in the error state and flush them).
    fn completions_possible(&self) -> u64 {
        self.sides
            .iter()
            .map(|s| u64::from(s.queue.outstanding()) + s.usable_receives())
            .sum()
    }

    fn idle(&self) -> bool {
        (0..self.sides.len()).all(|q| self.side_idle(q))
    }

    /// Queue `q` has every work request retired and its peer every receive completed.
    fn side_idle(&self, q: usize) -> bool {
        let s = &self.sides[q];
        s.queue.tracker().is_idle() && s.peer_recv_done >= s.peer_recvs
    }

    /// Polls up to `max` completions of one CQ, routes them, records the events.
    fn poll_cq(&mut self, cq: usize, max: usize, events: &mut Vec<Event>) -> Result<usize> {
        let max = max.min(self.wcs.len());
        let k = self.cqs[cq]
            .poll(&mut self.wcs[..max])
            .with_context(|| format!("cannot poll cq {:?}", self.sc.cqs[cq].name))?;
        for i in 0..k {
            let wc = self.wcs[i];
            self.handle(wc, events)?;
        }
        Ok(k)
    }

    /// Hands a completion to its endpoint: its events go to `events`.
    fn handle(&mut self, wc: WorkCompletion, events: &mut Vec<Event>) -> Result<()> {
        let Some(r) = self.owner(&wc) else {
            bail!("a completion of an unknown QP {:#x}: {wc:?}", wc.qp_num);
        };
        let name = self.sc.qp_name(r);
        // byte_len and immediate data are defined for receives (and byte_len for
        // READs); elsewhere providers leave what they like (rxe flags immediate data
        // on the sender's completion of a *_WITH_IMM).
        let recv = matches!(wc.opcode, Some(WcOpcode::Recv | WcOpcode::RecvRdmaWithImm));
        let defined = recv || wc.opcode == Some(WcOpcode::RdmaRead);
        // A send of the QP's queue is shown by its sequence number (its wr_id without
        // the queue's bit 63), as posts and retirements are.
        let wr_id = match r.peer {
            false => self.sides[r.index]
                .queue
                .send_seq(&wc)
                .map_or(wc.wr_id, |s| s.0),
            true => wc.wr_id,
        };
        events.push(Event::Cqe {
            qp: name.clone(),
            wr_id,
            status: wc.status.short_name(),
            opcode: wc.opcode.map(|o| o.short_name()),
            byte_len: defined.then_some(wc.byte_len),
            imm: if recv { wc.imm_data } else { None },
        });
        let side = &mut self.sides[r.index];
        if r.peer {
            side.peer_recv_done += 1;
            return Ok(());
        }
        side.queue
            .handle_completion(&wc)
            .map_err(|e| anyhow!("qp {name:?}: {e}"))?;
        let mut done = Vec::new();
        side.queue.collect(&mut done);
        for c in done {
            events.push(Event::Retire {
                qp: name.clone(),
                seq: c.seq.0,
                outcome: c.outcome.as_str(),
                status: match c.outcome {
                    Outcome::Failed(s) => Some(s.short_name()),
                    _ => None,
                },
            });
        }
        Ok(())
    }

    fn async_events(&mut self, events: &mut Vec<Event>) {
        while let Some(e) = self.dev.poll_async_event() {
            let qp = match e {
                AsyncEvent::QpFatal { qp_num }
                | AsyncEvent::QpAccessErr { qp_num }
                | AsyncEvent::QpReqErr { qp_num } => Some(
                    self.qpns
                        .get(&qp_num)
                        .map_or(format!("{qp_num:#x}"), |r| self.sc.qp_name(*r)),
                ),
                _ => None,
            };
            events.push(Event::Async {
                kind: e.as_str(),
                qp,
            });
        }
    }
}

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

/// Puts one poll step's events in canonical order: each QP's completions, each followed by
/// the work requests it retired, QP after QP; then asynchronous events by name. Each QP's
/// own events are in a fixed order; only how QPs interleave varies between runs.
fn canonical(events: &mut [Event], sc: &Scenario) {
    let order = |qp: &str| -> usize {
        let (base, peer) = match qp.strip_suffix(".peer") {
            Some(b) => (b, 1),
            None => (qp, 0),
        };
        sc.qps
            .iter()
            .position(|q| q.name == base)
            .unwrap_or(usize::MAX / 2)
            * 2
            + peer
    };
    let rank = |e: &Event| -> (u8, usize, String) {
        match e {
            Event::Cqe { qp, .. } | Event::Retire { qp, .. } => (0, order(qp), String::new()),
            Event::Async { kind, qp } => {
                (1, 0, format!("{kind}:{}", qp.clone().unwrap_or_default()))
            }
            _ => (2, 0, String::new()),
        }
    };
    // A stable sort keeps each QP's events in their order.
    events.sort_by_key(|e| rank(e));
}

/// A completion as the trace shows it (and as an expectation gives it).
struct SeenCqe<'t> {
    qp: &'t str,
    wr_id: u64,
    status: &'t str,
    opcode: Option<&'t str>,
    byte_len: Option<u32>,
    imm: Option<u32>,
}

impl std::fmt::Display for SeenCqe<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} wr_id {} {}", self.qp, self.wr_id, self.status)?;
        if let Some(o) = self.opcode {
            write!(f, " {o}")?;
        }
        if let Some(b) = self.byte_len {
            write!(f, " byte_len {b}")?;
        }
        if let Some(m) = self.imm {
            write!(f, " imm {m}")?;
        }
        Ok(())
    }
}

/// Checks the expectations against the trace.
fn check(e: &Expect, trace: &[Event]) -> (Vec<String>, Vec<String>) {
    let mut failures = Vec::new();
    let mut checked = Vec::new();
    if let Some(expected) = &e.cqes {
        let actual: Vec<SeenCqe<'_>> = trace
            .iter()
            .filter_map(|ev| match ev {
                Event::Cqe {
                    qp,
                    wr_id,
                    status,
                    opcode,
                    byte_len,
                    imm,
                } => Some(SeenCqe {
                    qp,
                    wr_id: *wr_id,
                    status,
                    opcode: *opcode,
                    byte_len: *byte_len,
                    imm: *imm,
                }),
                _ => None,
            })
            .collect();
        checked.push(format!("{} completions", expected.len()));
        if actual.len() != expected.len() {
            failures.push(format!(
                "expected {} completions, got {}: {:?}",
                expected.len(),
                actual.len(),
                actual
                    .iter()
                    .map(|a| format!("{}#{} {}", a.qp, a.wr_id, a.status))
                    .collect::<Vec<_>>()
            ));
        }
        for (i, (x, a)) in expected.iter().zip(&actual).enumerate() {
            let ok = x.qp == a.qp
                && x.wr_id == a.wr_id
                && x.status == a.status
                && x.opcode.as_deref().is_none_or(|o| Some(o) == a.opcode)
                && x.byte_len.is_none_or(|b| Some(b) == a.byte_len)
                && x.imm.is_none_or(|m| Some(m) == a.imm);
            if !ok {
                let x = SeenCqe {
                    qp: &x.qp,
                    wr_id: x.wr_id,
                    status: &x.status,
                    opcode: x.opcode.as_deref(),
                    byte_len: x.byte_len,
                    imm: x.imm,
                };
                failures.push(format!("completion {}: expected {x}, got {a}", i + 1));
                break;
            }
        }
    }
    for (qp, items) in e.outcomes.iter().flatten() {
        let markers: Vec<u64> = trace
            .iter()
            .filter_map(|ev| match ev {
                Event::Post {
                    qp: q,
                    seq,
                    marker: true,
                    ..
                } if q == qp => Some(*seq),
                _ => None,
            })
            .collect();
        let got: BTreeMap<u64, (String, Option<String>)> = trace
            .iter()
            .filter_map(|ev| match ev {
                Event::Retire {
                    qp: q,
                    seq,
                    outcome,
                    status,
                } if q == qp && !markers.contains(seq) => {
                    Some((*seq, (outcome.to_string(), status.map(str::to_string))))
                }
                _ => None,
            })
            .collect();
        // Ranges are expanded only up to the first sequence number beyond what the run
        // posted: one missing work request is enough to fail, and a range like
        // "1-18446744073709551615" must not be expanded.
        let beyond = got
            .keys()
            .chain(&markers)
            .max()
            .map_or(1, |&s| s.saturating_add(1));
        let mut want: BTreeMap<u64, (String, Option<String>)> = BTreeMap::new();
        for item in items {
            if let Ok((first, last, outcome, status)) = crate::scenario::parse_outcome_range(item) {
                for s in first..=last.min(beyond.max(first)) {
                    want.insert(s, (outcome.clone(), status.clone()));
                }
            }
        }
        checked.push(format!("{} outcomes of {qp}", want.len()));
        if got != want {
            let diff: Vec<String> = want
                .iter()
                .filter(|(s, w)| got.get(s) != Some(w))
                .map(|(s, w)| {
                    let show = |o: &(String, Option<String>)| match &o.1 {
                        Some(st) => format!("{}:{st}", o.0),
                        None => o.0.clone(),
                    };
                    format!(
                        "{s}: expected {} got {}",
                        show(w),
                        got.get(s).map_or("nothing".to_string(), show)
                    )
                })
                .chain(
                    got.keys()
                        .filter(|s| !want.contains_key(s))
                        .map(|s| format!("{s}: not expected")),
                )
                .take(5)
                .collect();
            failures.push(format!("outcomes of {qp} differ: {}", diff.join(", ")));
        }
    }
    for (region, digest) in e.digests.iter().flatten() {
        checked.push(format!("digest of {region}"));
        let got = trace.iter().find_map(|ev| match ev {
            Event::Digest { region: r, fnv1a64 } if r == region => Some(fnv1a64.clone()),
            _ => None,
        });
        if got.as_deref() != Some(digest.to_ascii_lowercase().as_str()) {
            failures.push(format!(
                "digest of {region}: expected {digest}, got {}",
                got.unwrap_or_else(|| "none (deregistered)".into())
            ));
        }
    }
    if let Some(expected) = &e.events {
        checked.push(format!("{} async events", expected.len()));
        let mut got: Vec<String> = trace
            .iter()
            .filter_map(|ev| match ev {
                Event::Async { kind, qp } => Some(match qp {
                    Some(q) => format!("{kind}:{q}"),
                    None => kind.to_string(),
                }),
                _ => None,
            })
            .collect();
        let mut want = expected.clone();
        got.sort();
        want.sort();
        if got != want {
            failures.push(format!("async events: expected {want:?}, got {got:?}"));
        }
    }
    (failures, checked)
}
