//! Polling: a poll step (until idle, or until N completions), a drain's wait, and a full
//! queue's wait for room; each completion handed to its endpoint, with its events.

use std::time::Instant;

use anyhow::{Context, Result, anyhow, bail, ensure};
use selsig::{AsyncEvent, CompletionQueue, Device, Outcome, WcOpcode, WorkCompletion};

use crate::model::QpRef;
use crate::trace::Event;

use super::runner::{Runner, canonical};
use super::wait::Sleeper;

impl<D: Device> Runner<'_, D> {
    /// Polls the CQ of queue `qp` one completion at a time until the queue has room for
    /// `need` work requests. The
    /// queue's own completions go into the trace in place (they made the room); those of
    /// other endpoints sharing the CQ, how many of which come first depends on timing,
    /// wait unhandled until their endpoint needs room or a step polls.
    pub fn poll_one_for_room(&mut self, qp: usize, need: u32) -> Result<()> {
        let cq = self.sc.qps[qp].send_cq;
        let own = QpRef {
            index: qp,
            peer: false,
        };
        self.poll_one_until(cq, own, |r| r.sides[qp].queue.available() >= need)
    }

    /// Polls `cq` one completion at a time until `room` holds (see
    /// [`poll_one_for_room`](Self::poll_one_for_room)): first the completions of `own`
    /// an earlier wait kept for it, then the CQ's. Only a send queue that has no signaled
    /// work request outstanding, and so waits for a shared CQ's credits that other queues'
    /// completions hold, hands those kept completions to their queues (their events go to
    /// the next step that polls): which of them it finds first depends on timing, as
    /// documented.
    pub fn poll_one_until(
        &mut self,
        cq: usize,
        own: QpRef,
        room: impl Fn(&Self) -> bool,
    ) -> Result<()> {
        let start = Instant::now();
        let mut sleeper = Sleeper::new();
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
                start.elapsed() < self.wait,
                "{:?} stayed full{}",
                self.sc.qp_name(own),
                match own.peer {
                    false => self.sides[own.index].wait_hint(&self.sc.qps[own.index]),
                    true => self.sides[own.index].recv_hint(&self.sc.qps[own.index]),
                }
            );
            // Only a completion of this CQ makes room.
            self.sleep_idle(
                &mut sleeper,
                &[cq],
                self.wait.saturating_sub(start.elapsed()),
            )?;
        }
        Ok(())
    }

    /// Shows `events`, of `own`'s completions, in the trace now: after the events of
    /// `own`'s earlier completions that another wait handed over, which would otherwise
    /// show later, with the next step that polls.
    pub fn show_in_place(&mut self, own: QpRef, events: Vec<Event>) {
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
    pub fn handle_stash(&mut self, events: &mut Vec<Event>) -> Result<()> {
        for wc in std::mem::take(&mut self.stash) {
            self.handle(wc, events)?;
        }
        Ok(())
    }

    /// Polls the CQs of queue `q` (its send CQ and its peer's) until `q` is idle: every
    /// work request retired and every receive of its peer completed. Other queues' work,
    /// an unsignaled tail among it, is no concern of the drain: their completions found on
    /// a shared CQ wait, unhandled, for the next step that polls them (as a wait for room
    /// keeps them). The step's events are put in canonical order.
    pub fn poll_until_drained(&mut self, q: usize) -> Result<()> {
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
        let mut sleeper = Sleeper::new();
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
            } else if start.elapsed() > self.wait {
                let e = anyhow!(
                    "not drained (no completion for {:?}): {}",
                    self.wait,
                    self.outstanding(Some(q)).join("; ")
                );
                return Err(self.failed(events, e));
            } else {
                // Only completions of the queue's CQs make it idle.
                let left = self.wait.saturating_sub(start.elapsed());
                let live = self.live_cqs(Some(q), &cqs);
                if let Err(e) = self.sleep_idle(&mut sleeper, &live, left) {
                    return Err(self.failed(events, e));
                }
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
    pub fn poll_until(&mut self, n: Option<u64>) -> Result<()> {
        // The time of the last completion: the step fails after `wait` without one.
        let mut start = Instant::now();
        let mut events = std::mem::take(&mut self.deferred);
        if let Err(e) = self.handle_stash(&mut events) {
            return Err(self.failed(events, e));
        }
        let mut got = 0u64;
        let all: Vec<usize> = (0..self.cqs.len()).collect();
        let mut sleeper = Sleeper::new();
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
                if start.elapsed() > self.wait {
                    let e = anyhow!("{}", self.stuck(n, got));
                    return Err(self.failed(events, e));
                }
                // Only completions end the step (asynchronous events are read at its end).
                let left = self.wait.saturating_sub(start.elapsed());
                let live = self.live_cqs(None, &all);
                if let Err(e) = self.sleep_idle(&mut sleeper, &live, left) {
                    return Err(self.failed(events, e));
                }
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
    pub fn failed(&mut self, mut events: Vec<Event>, e: anyhow::Error) -> anyhow::Error {
        self.async_events(&mut events);
        canonical(&mut events, self.sc);
        self.trace.extend(events);
        e
    }

    /// Polls up to `max` completions of one CQ, routes them, records the events.
    pub fn poll_cq(&mut self, cq: usize, max: usize, events: &mut Vec<Event>) -> Result<usize> {
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
    pub fn handle(&mut self, wc: WorkCompletion, events: &mut Vec<Event>) -> Result<()> {
        let Some(r) = self.owner(&wc) else {
            bail!("a completion of an unknown QP {:#x}: {wc:?}", wc.qp_num);
        };
        let name = self.sc.qp_name(r);
        // byte_len and immediate data are defined for receives (and byte_len for
        // READs); elsewhere providers leave what they like (mlx5 and rxe flag immediate
        // data on the sender's completion of a *_WITH_IMM, mlx5 with none behind the
        // flag: semantics 35).
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
        self.retired(r.index, events);
        Ok(())
    }

    /// The work requests queue `q` retired and did not hand back yet, into `events`.
    fn retired(&mut self, q: usize, events: &mut Vec<Event>) {
        let name = self.sc.qps[q].name.clone();
        let mut done = Vec::new();
        self.sides[q].queue.collect(&mut done);
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
    }

    /// A `device_fatal` step: the device fails (the hook returns once it executes nothing
    /// more); the completions it wrote before go to their endpoints, then every queue's
    /// outstanding work requests retire as `device_lost` (no completion will come for
    /// them, not even a flush), and receives still outstanding get nothing. The step's
    /// events in canonical order, the asynchronous `device_fatal` among them.
    pub fn device_fatal(&mut self) -> Result<()> {
        let Some(inject) = self.inject_fatal.clone() else {
            bail!(
                "this device cannot be made to fail on purpose: device_fatal needs the \
                 software NIC (--provider soft)"
            );
        };
        inject();
        let mut events = std::mem::take(&mut self.deferred);
        if let Err(e) = self.handle_stash(&mut events) {
            return Err(self.failed(events, e));
        }
        for cq in 0..self.cqs.len() {
            loop {
                match self.poll_cq(cq, usize::MAX, &mut events) {
                    Ok(0) => break,
                    Ok(_) => {}
                    Err(e) => return Err(self.failed(events, e)),
                }
            }
        }
        for q in 0..self.sides.len() {
            self.sides[q].queue.device_lost();
            self.retired(q, &mut events);
        }
        self.lost = true;
        self.async_events(&mut events);
        canonical(&mut events, self.sc);
        self.trace.extend(events);
        Ok(())
    }

    /// The device's asynchronous events since the last look, into `events`.
    pub fn async_events(&mut self, events: &mut Vec<Event>) {
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
