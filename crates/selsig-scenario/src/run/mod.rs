//! Runs a checked scenario on any provider and produces its canonical trace.
//!
//! The parts, in order: `side` (what is kept per queue pair and region), `runner` (the
//! run's state, what it waits for, the canonical order of events), `wait` (sleeping on
//! the CQs' completion events while a wait polls nothing), `poll` (poll steps and waits),
//! `work` (the steps that post), `setup` (what the scenario names, made on the
//! device), `expect` (the expectations checked against the trace), then here: the steps in
//! order, and the public entry point.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use anyhow::{Result, anyhow};
use selsig::{ConnectOptions, Device, MemoryRegion, QueuePair};

use crate::bytes::fnv1a64;
use crate::error::RunError;
use crate::model::{Action, Expect, Scenario};
use crate::remote::RemoteSide;
use crate::trace::Event;

mod expect;
mod poll;
mod post;
mod runner;
mod setup;
mod side;
mod wait;
mod work;

use expect::check;
use runner::{Runner, canonical};

/// What makes the device fail as at a fatal error, for a `device_fatal` step; it returns
/// once the device executes nothing more (the software NIC's
/// `SoftFaults::inject_fatal`).
pub type InjectFatal = Arc<dyn Fn() + Send + Sync>;

/// How to run a scenario: what the device is.
#[derive(Clone, Default)]
#[non_exhaustive]
pub struct RunOptions {
    /// The device behaves like the kernel's Soft-RoCE (verbs on an rxe device, or
    /// `selsig_soft` with its rxe personality): the scenario's `[expect.rxe]` apply, where
    /// it has them.
    pub rxe: bool,
    /// The GID index to connect the queue pairs with (RoCE; `None`: the provider's default,
    /// or none on InfiniBand and the software NIC).
    pub gid_index: Option<u8>,
    /// The device's port to connect through (`None`: 1).
    pub port: Option<u8>,
    /// What makes the device fail, for a `device_fatal` step (`None`: the step fails,
    /// naming the software NIC as the device that can).
    pub inject_fatal: Option<InjectFatal>,
    /// How long a step may wait without a completion before it fails (`None`: 20 s).
    pub wait: Option<std::time::Duration>,
}

impl fmt::Debug for RunOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RunOptions")
            .field("rxe", &self.rxe)
            .field("gid_index", &self.gid_index)
            .field("port", &self.port)
            .field("inject_fatal", &self.inject_fatal.as_ref().map(|_| "..."))
            .field("wait", &self.wait)
            .finish()
    }
}

impl RunOptions {
    /// The defaults: not rxe, no GID index.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets [`rxe`](Self::rxe).
    pub fn rxe(mut self, rxe: bool) -> Self {
        self.rxe = rxe;
        self
    }

    /// Sets [`gid_index`](Self::gid_index).
    pub fn gid_index(mut self, gid_index: Option<u8>) -> Self {
        self.gid_index = gid_index;
        self
    }

    /// Sets [`port`](Self::port).
    pub fn port(mut self, port: Option<u8>) -> Self {
        self.port = port;
        self
    }

    /// Sets [`wait`](Self::wait).
    pub fn wait(mut self, wait: Option<std::time::Duration>) -> Self {
        self.wait = wait;
        self
    }

    /// Sets [`inject_fatal`](Self::inject_fatal).
    pub fn inject_fatal(mut self, f: impl Fn() + Send + Sync + 'static) -> Self {
        self.inject_fatal = Some(Arc::new(f));
        self
    }
}

/// The trace and whether the expectations held.
#[derive(Debug)]
#[non_exhaustive]
pub struct RunResult {
    /// The canonical trace: every event of the run, or up to the step that failed.
    pub trace: Vec<Event>,
    /// Expectations that did not hold (empty: all met, or none given).
    pub failures: Vec<String>,
    /// What was checked, for the summary line.
    pub checked: Vec<String>,
    /// Why the expectations for rxe were used (the scenario's `differs.rxe`).
    pub differs: Option<String>,
    /// The step that failed (the trace ends there; expectations were not checked).
    pub error: Option<RunError>,
}

impl RunResult {
    /// Every step ran and every expectation held (or none was given).
    pub fn passed(&self) -> bool {
        self.error.is_none() && self.failures.is_empty()
    }

    /// The trace as `selsig run` prints it: one JSON line per event, each ending in a
    /// newline.
    pub fn trace_text(&self) -> String {
        let mut text = String::new();
        for event in &self.trace {
            text.push_str(&event.line());
            text.push('\n');
        }
        text
    }
}

/// Runs `scenario` on `device` and checks its expectations (`[expect]`, or `[expect.rxe]`
/// where `options` say the device is rxe).
///
/// Every object the scenario names is created on `device` first; a device that refuses
/// one is an `Err`. From then on the run always returns its [`RunResult`]: a step that
/// fails ends the trace there and is the result's [`error`](RunResult::error). Neither
/// stops anything else the device does; the objects are destroyed before this returns.
pub fn run<D: Device>(
    scenario: &Scenario,
    device: &D,
    options: &RunOptions,
) -> Result<RunResult, RunError> {
    run_with(scenario, device, options, None)
}

/// Runs `scenario` as [`run`] does, with its queue pair's peer and the region its WRITEs go
/// to on `remote`, another host: the region's digest in the trace is the remote side's.
///
/// The scenario must be one that [`Scenario::remote_region`] takes; one it refuses is an
/// `Err` saying why, before anything is made. The peer's asynchronous events happen on
/// the remote side: `[expect] events` items that name the peer are not checked (the
/// result's [`checked`](RunResult::checked) says so).
pub fn run_remote<D: Device>(
    scenario: &Scenario,
    device: &D,
    options: &RunOptions,
    remote: &mut dyn RemoteSide<D>,
) -> Result<RunResult, RunError> {
    let region = scenario.remote_index().map_err(|why| {
        RunError::new(anyhow!(
            "scenario {} cannot run with a remote side: {why}",
            scenario.name()
        ))
    })?;
    run_with(scenario, device, options, Some((region, remote)))
}

/// [`run`], or [`run_remote`] with `remote`.
fn run_with<'a, D: Device>(
    scenario: &'a Scenario,
    device: &'a D,
    options: &RunOptions,
    remote: Option<setup::Remote<'a, D>>,
) -> Result<RunResult, RunError> {
    let (expect, differs) = match (&scenario.expect_rxe, options.rxe) {
        (Some(rxe), true) => (rxe, scenario.differs.get("rxe").cloned()),
        _ => (&scenario.expect, None),
    };
    // With a remote side, the peer's events are the remote side's.
    let (here, not_here) = match (&remote, &expect.events) {
        (Some(_), Some(_)) => {
            let (here, not_here) = without_peer_events(expect, &scenario.qps[0].name);
            (Cow::Owned(here), not_here)
        }
        _ => (Cow::Borrowed(expect), Vec::new()),
    };
    let connect = ConnectOptions {
        gid_index: options.gid_index,
        port: options.port.unwrap_or(1),
        ..ConnectOptions::default()
    };
    let mut result = Runner::new(scenario, device, &connect, remote)
        .and_then(|mut runner| {
            runner.inject_fatal = options.inject_fatal.clone();
            if let Some(wait) = options.wait {
                runner.wait = wait;
            }
            runner.run(&here)
        })
        .map_err(RunError::new)?;
    result.differs = differs;
    if !not_here.is_empty() && result.error.is_none() {
        result.checked.push(format!(
            "not the peer's events {not_here:?}: on the remote side"
        ));
    }
    Ok(result)
}

/// `expect` without the events of `qp`'s peer, and those events.
fn without_peer_events(expect: &Expect, qp: &str) -> (Expect, Vec<String>) {
    let peer = format!(":{qp}.peer");
    let mut here = expect.clone();
    let events = here.events.take().unwrap_or_default();
    let (theirs, ours) = events.into_iter().partition(|e| e.ends_with(&peer));
    here.events = Some(ours);
    (here, theirs)
}

impl<D: Device> Runner<'_, D> {
    /// Runs the steps in order, then reads the regions' digests and checks `expect`.
    fn run(mut self, expect: &Expect) -> Result<RunResult> {
        let races = self.sc.races();
        if !races.is_empty() {
            self.trace.push(Event::Races { races });
        }
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
        for (i, (r, k)) in self.sc.regions.iter().zip(&self.regions).enumerate() {
            let digest = match (&k.mr, &mut self.remote) {
                (_, Some((held, remote))) if *held == i => match remote.digest() {
                    Ok(digest) => digest,
                    Err(e) => {
                        let e = e.context(format!("cannot read region {:?}", r.name));
                        return Ok(self.stopped(e));
                    }
                },
                (Some(mr), _) => {
                    let mut bytes = vec![0u8; k.len];
                    mr.read(0, &mut bytes)?;
                    fnv1a64(&bytes)
                }
                (None, _) => continue,
            };
            self.trace.push(Event::Digest {
                region: r.name.clone(),
                fnv1a64: format!("{digest:016x}"),
            });
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
            error: Some(RunError::new(error)),
        }
    }

    /// Runs one step.
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
            Action::DeviceFatal => self.device_fatal(),
            Action::ToError(r) => {
                let side = &mut self.sides[r.index];
                if r.peer {
                    side.local_peer()?.to_error()?;
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
}
