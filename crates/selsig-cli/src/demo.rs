//! `selsig demo`: the seed example, run for real and shown the way the seed draws it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use clap::Args;
use selsig::{
    Access, Buffer, Completion, CompletionQueue, ConnectOptions, CqError, Device, MemoryRegion,
    Outcome, Policy, PostError, QpCaps, QpInit, QueueConfig, QueuePair, QueuePostError, RemoteAddr,
    SignaledQueue, WcStatus, Work, WorkCompletion,
};
use serde::Serialize;

use crate::common::{
    DeviceInfo, OnDevice, ProviderArgs, ProviderKind, parse_size, pattern, span, with_device,
};
use crate::limits::MAX_WRS;
use crate::remote::{Cm, Peer};

/// Largest memory the demo registers on each side.
const MAX_BYTES: u64 = 1 << 30;

/// Run the seed example: RDMA WRITEs on one RC queue pair, every N-th signaled, and show
/// which completions appeared and what each confirmed.
#[derive(Debug, Clone, Args)]
pub struct DemoArgs {
    /// Number of RDMA WRITEs.
    #[arg(
        allow_negative_numbers = true,
        long,
        short = 'n',
        default_value_t = 8,
        value_name = "N"
    )]
    pub wrs: u32,
    /// Signal every N-th WRITE. Default 4, as in the seed. (`-e`, as in `selsig bench`;
    /// perftest's `-Q`/`--cq-mod` belongs to `selsig bench`'s perftest mode only.)
    #[arg(allow_negative_numbers = true, long, short = 'e', value_name = "N")]
    pub every: Option<u32>,
    /// Bytes per WRITE: 64, 4K, 64KiB, ...
    #[arg(allow_hyphen_values = true, long, short = 's', default_value = "64", value_parser = parse_size, value_name = "BYTES")]
    pub size: u64,
    /// Signaling policy: every:N, always, never or adaptive:N,LAG (e.g. adaptive:16,50us).
    #[arg(long, conflicts_with = "every", value_name = "POLICY")]
    pub policy: Option<Policy>,
    /// Send queue depth asked for (the real one is read back from the QP).
    #[arg(
        allow_negative_numbers = true,
        long = "tx-depth",
        short = 't',
        default_value_t = 64,
        value_name = "N"
    )]
    pub tx_depth: u32,
    /// Make WRITE K fail with a bad remote key, to show the error completion, the flushes
    /// and every WRITE's outcome.
    #[arg(allow_negative_numbers = true, long, value_name = "K")]
    pub fail_at: Option<u32>,
    /// Print one JSON object instead of the drawing (see docs/demo-json.md).
    #[arg(long)]
    pub json: bool,
    /// Write into the memory of `selsig serve` on HOST or HOST:PORT (an IPv6 address bare,
    /// or in brackets before a port: [fe80::1%eth0]:18515; another process or host; verbs
    /// provider) instead of a peer QP in this process.
    #[arg(long, value_name = "HOST", value_parser = crate::common::parse_host)]
    pub connect: Option<String>,
    /// How --connect connects the queue pairs: tcp (their numbers, PSNs and GIDs over
    /// selsig's TCP exchange) or rdma (rdma_cm: librdmacm resolves the address and the
    /// route, the region comes in the connection's private data; see docs/verbs.md).
    #[arg(long, value_enum, default_value_t = Cm::Tcp, requires = "connect", value_name = "HOW")]
    pub cm: Cm,
    #[command(flatten)]
    pub provider: ProviderArgs,
}

/// What the demo did, as printed by `--json`.
#[derive(Debug, Serialize)]
pub struct Report {
    pub provider: &'static str,
    pub device: String,
    pub personality: Option<String>,
    pub wrs: u32,
    pub size: u64,
    pub policy: String,
    /// The interval of an `every:N` policy, else null.
    pub every: Option<u32>,
    pub sq_depth: u32,
    pub fail_at: Option<u32>,
    pub posts: Vec<PostView>,
    pub cqes: Vec<CqeView>,
    pub confirmed: Vec<Confirmed>,
    pub outcomes: Vec<OutcomeView>,
    pub remote_verified: bool,
    pub mismatches: Vec<u32>,
    /// The server's device and address with `--connect`; null for a peer in this process.
    pub target: Option<String>,
    pub summary: Summary,
    pub elapsed_us: u128,
}

#[derive(Debug, Serialize)]
pub struct PostView {
    /// 1-based WRITE number, as in the seed.
    pub wr: u32,
    pub wr_id: u64,
    pub signaled: bool,
    /// Why it was signaled: policy, requested, deadlock, ...
    pub reason: Option<&'static str>,
}

#[derive(Debug, Serialize)]
pub struct CqeView {
    /// The WRITE the completion names (1-based), or null for a confirm marker.
    pub wr: Option<u32>,
    pub wr_id: u64,
    pub status: &'static str,
    /// Null in error completions, whose opcode is meaningless.
    pub opcode: Option<&'static str>,
    /// `true` for the zero-length WRITE that confirms an unsignaled tail.
    pub marker: bool,
}

#[derive(Debug, Serialize)]
pub struct Confirmed {
    /// The WRITE whose completion it is (null for a marker).
    pub cqe: Option<u32>,
    pub wr_id: u64,
    /// The WRITEs it retired, with their outcome.
    pub wrs: Vec<u32>,
}

#[derive(Debug, Serialize)]
pub struct OutcomeView {
    pub wr: u32,
    /// completed, failed, flushed, or not_posted.
    pub outcome: &'static str,
    /// The status of a failed WRITE.
    pub status: Option<&'static str>,
}

#[derive(Debug, Serialize)]
pub struct Summary {
    pub completed: u32,
    pub failed: u32,
    pub flushed: u32,
    pub not_posted: u32,
    pub cqes: u32,
    /// Completions that signaling every WRITE would have produced beyond these.
    pub cqes_saved: u32,
}

impl OnDevice for &DemoArgs {
    type Output = Report;

    fn run<D: Device>(self, dev: &D, info: &DeviceInfo) -> Result<Report> {
        run_demo(self, dev, info)
    }
}

/// Runs the demo; returns its report (printing is the caller's). Call [`validate`] first.
pub fn demo(args: &DemoArgs) -> Result<Report> {
    with_device(&args.provider, args)
}

/// Checks the options (errors here are the user's input).
pub fn validate(args: &DemoArgs) -> Result<()> {
    ensure!(args.wrs >= 1, "--wrs must be at least 1");
    if let Some(host) = &args.connect {
        ensure!(
            args.provider.provider == ProviderKind::Verbs,
            "--connect {host}: needs --provider verbs (the soft NIC connects queue pairs of one process only)"
        );
    }
    ensure!(
        args.wrs <= MAX_WRS,
        "--wrs {}: the demo runs at most {MAX_WRS} WRITEs",
        args.wrs
    );
    ensure!(
        args.size <= u64::from(u32::MAX),
        "--size {} is more than one WRITE carries",
        args.size
    );
    let total = u64::from(args.wrs) * args.size.max(1);
    ensure!(
        total <= MAX_BYTES,
        "--wrs {} × --size {} needs {total} bytes on each side; the demo registers at most {MAX_BYTES}",
        args.wrs,
        args.size
    );
    if let Some(k) = args.fail_at {
        ensure!(
            (1..=args.wrs).contains(&k),
            "--fail-at {k} names no WRITE: there are {} (1 to {})",
            args.wrs,
            args.wrs
        );
        ensure!(
            args.size > 0,
            "--fail-at {k} with --size 0: the remote key of a zero-length WRITE is not \
             checked, so a bad one cannot fail it; give --size 1 or more"
        );
    }
    ensure!(args.tx_depth >= 1, "--tx-depth must be at least 1");
    crate::common::cq_entries(args.tx_depth)?;
    if let Some(0) = args.every {
        bail!("--every must be at least 1");
    }
    Ok(())
}

/// A wait for completions of one CQ, at a poll that found nothing. The waiter's order: the
/// first idle poll arms the CQ and returns, for the caller to poll again (a completion that
/// came before the arm need not make an event: that poll finds it); the next sleeps until
/// the CQ's event or `left` passes. Polls that find completions in between leave the arm as
/// it is: it still waits for the CQ's next completion, or a completion since used it and
/// its event is pending (only the sleep takes events), which ends the sleep at once. A CQ
/// without events ([`CqError::NoEvents`]) makes it yield instead, as the waits did before
/// there were events.
#[derive(Debug)]
struct Idle {
    armed: bool,
    events: bool,
}

impl Idle {
    fn new() -> Self {
        Idle {
            armed: false,
            events: true,
        }
    }

    fn wait<C: CompletionQueue>(&mut self, cq: &C, left: Duration) -> Result<()> {
        if !self.events {
            std::thread::yield_now();
            return Ok(());
        }
        if !self.armed {
            match cq.req_notify() {
                Ok(()) => self.armed = true,
                Err(CqError::NoEvents) => {
                    self.events = false;
                    std::thread::yield_now();
                }
                Err(e) => return Err(e).context("cannot arm the completion queue for an event"),
            }
            return Ok(());
        }
        self.armed = false;
        cq.wait_event(Some(left))
            .context("cannot wait for the completion queue's event")?;
        Ok(())
    }
}

fn policy_of(args: &DemoArgs) -> Policy {
    args.policy
        .unwrap_or(Policy::Every(args.every.unwrap_or(4)))
}

fn run_demo<D: Device>(args: &DemoArgs, dev: &D, info: &DeviceInfo) -> Result<Report> {
    let start = Instant::now();
    let policy = policy_of(args);
    let size = args.size as usize;
    let n = args.wrs as usize;
    let pd = dev
        .alloc_pd()
        .context("cannot allocate a protection domain")?;
    let entries = crate::common::cq_entries(args.tx_depth)?;
    let cq = Arc::new(dev.create_cq(entries).with_context(|| {
        format!(
            "cannot create the completion queue of {entries} entries for --tx-depth {}",
            args.tx_depth
        )
    })?);
    let init = QpInit {
        caps: QpCaps {
            max_send_wr: args.tx_depth,
            max_recv_wr: 1,
            ..QpCaps::default()
        },
        sq_sig_all: false,
    };
    let qp = dev.create_qp(&pd, &cq, &cq, &init).with_context(|| {
        format!(
            "cannot create the queue pair of --tx-depth {}",
            args.tx_depth
        )
    })?;
    let options = ConnectOptions {
        gid_index: info.gid_index,
        port: info.port,
        ..ConnectOptions::default()
    };
    let slot = size.max(1);
    // The target: a peer QP and a region in this process, or a `selsig serve`.
    let peer = Peer::open(
        dev,
        &pd,
        &qp,
        &options,
        args.connect.as_deref().map(|host| (host, args.cm)),
        args.wrs,
        args.size,
        None,
    )?;
    let target = peer.target();
    let local = dev
        .reg_mr(&pd, n * slot, Access::LOCAL_WRITE)
        .context("cannot register the local buffer")?;
    for wr in 1..=n {
        local.write((wr - 1) * slot, &pattern(wr as u64, size))?;
    }
    let (buffers, _) = Buffer::new(local)
        .split_into(n, slot)
        .map_err(|_| anyhow::anyhow!("the local region holds the buffers"))?;
    let config = QueueConfig {
        policy,
        marker_target: target,
        ..QueueConfig::default()
    };
    let sq_depth = qp.caps().max_send_wr;
    let mut queue: SignaledQueue<D, u32> = SignaledQueue::with_config(qp, Arc::clone(&cq), config)?;

    let mut cqes = Cqes::new(&*cq);
    let mut done = Vec::new();
    let posts = post_all(
        args, &mut queue, buffers, target, slot, &mut cqes, &mut done,
    )?;
    confirm_tail(&mut queue, &mut cqes)?;
    while !queue.tracker().is_idle() {
        cqes.wait(&mut queue, Waiting::Outstanding)?;
    }
    queue.collect(&mut done);
    let mut outcomes: Vec<Option<Outcome>> = vec![None; n];
    for c in &done {
        outcomes[(c.user - 1) as usize] = Some(c.outcome);
    }
    let (mismatches, target_device) = verify(peer, &outcomes, size, slot)?;
    let run = Run {
        posts,
        cqes: cqes.views,
        confirmed: cqes.confirmed,
        outcomes,
        mismatches,
        target_device,
    };
    Ok(run.report(args, info, policy, sq_depth, start))
}

/// The run fails when no completion arrives for this long (a stalled NIC or peer).
const STALL: Duration = Duration::from_secs(30);

/// What waits for a completion, for the message when none comes.
#[derive(Clone, Copy)]
enum Waiting {
    /// A post or the confirm marker, for room.
    Room,
    /// The end, for the outstanding WRITEs.
    Outstanding,
}

/// The completions of the demo's CQ as they come, with what each confirmed; its waits
/// end only with a completion of the CQ (or after [`STALL`]), asleep on the CQ's events
/// while a poll finds nothing.
struct Cqes<'a, C: CompletionQueue> {
    cq: &'a C,
    wcs: Vec<WorkCompletion>,
    views: Vec<CqeView>,
    confirmed: Vec<Confirmed>,
    /// The sequence numbers of the confirm markers.
    markers: Vec<u64>,
    last_completion: Instant,
    idle: Idle,
}

impl<'a, C: CompletionQueue> Cqes<'a, C> {
    fn new(cq: &'a C) -> Self {
        Cqes {
            cq,
            wcs: vec![WorkCompletion::new(0, WcStatus::Success, 0); 32],
            views: Vec::new(),
            confirmed: Vec::new(),
            markers: Vec::new(),
            last_completion: Instant::now(),
            idle: Idle::new(),
        }
    }

    /// Polls the CQ once; records each completion and what it confirmed. Returns how many.
    fn poll<D: Device>(&mut self, queue: &mut SignaledQueue<D, u32>) -> Result<usize> {
        let k = self
            .cq
            .poll(&mut self.wcs)
            .context("cannot poll the completion queue")?;
        for wc in &self.wcs[..k] {
            let handled = queue
                .handle_completion(wc)
                .with_context(|| format!("an impossible completion: {wc:?}"))?;
            // The sequence number the wr_id carries (handled: so it is one of the queue's).
            let seq = queue.send_seq(wc).map_or(wc.wr_id, |s| s.0);
            let marker = self.markers.contains(&seq);
            let wr = (!marker).then_some(seq as u32);
            self.views.push(CqeView {
                wr,
                wr_id: wc.wr_id,
                status: wc.status.short_name(),
                opcode: wc.opcode.map(|o| o.short_name()),
                marker,
            });
            let markers = &self.markers;
            self.confirmed.push(Confirmed {
                cqe: wr,
                wr_id: wc.wr_id,
                wrs: (handled.first.0..=handled.seq.0)
                    .filter(|s| !markers.contains(s))
                    .map(|s| s as u32)
                    .collect(),
            });
        }
        Ok(k)
    }

    /// Polls once, and sleeps on the CQ's events when nothing came; fails when no
    /// completion came for [`STALL`].
    fn wait<D: Device>(&mut self, queue: &mut SignaledQueue<D, u32>, what: Waiting) -> Result<()> {
        let k = self.poll(queue)?;
        if k > 0 {
            self.last_completion = Instant::now();
        }
        if self.last_completion.elapsed() >= STALL {
            match what {
                Waiting::Room => bail!(
                    "the queue stayed full: no completion for {} s",
                    STALL.as_secs()
                ),
                Waiting::Outstanding => bail!(
                    "{} WRITEs still outstanding: no completion for {} s",
                    queue.outstanding(),
                    STALL.as_secs()
                ),
            }
        }
        if k == 0 {
            let left = STALL.saturating_sub(self.last_completion.elapsed());
            self.idle.wait(self.cq, left)?;
        }
        Ok(())
    }
}

/// Posts the WRITEs (the one of `--fail-at` with a bad key), waiting for room when the
/// queue is full; stops at the first refusal of a queue that failed. What was posted.
fn post_all<D: Device>(
    args: &DemoArgs,
    queue: &mut SignaledQueue<D, u32>,
    buffers: Vec<Buffer<D::Mr>>,
    target: RemoteAddr,
    slot: usize,
    cqes: &mut Cqes<'_, D::Cq>,
    done: &mut Vec<Completion<D::Mr, u32>>,
) -> Result<Vec<PostView>> {
    let mut posts = Vec::new();
    // Zero-length WRITEs carry no buffer.
    let mut pending: std::collections::VecDeque<(u32, Option<Buffer<D::Mr>>)> = buffers
        .into_iter()
        .enumerate()
        .map(|(i, b)| (i as u32 + 1, (args.size > 0).then_some(b)))
        .collect();
    while let Some((wr, buf)) = pending.pop_front() {
        let mut target = target.offset((i_of(wr) * slot) as u64);
        if args.fail_at == Some(wr) {
            // A key the responder does not know: the WRITE fails with a remote access error.
            target.rkey ^= 0x0005_a5a5;
        }
        let work = match buf {
            Some(buf) => Work::write(buf, target, wr),
            None => Work::write_empty(target, wr),
        };
        match queue.post(work) {
            Ok(posted) => posts.push(PostView {
                wr,
                wr_id: posted.wr_id,
                signaled: posted.signaled(),
                reason: posted.signal.map(|r| r.as_str()),
            }),
            Err(QueuePostError::Refused(e)) if e.is_full() => {
                // No room until completions are polled: put it back and poll.
                pending.push_front((wr, e.into_payload().buffer));
                cqes.wait(queue, Waiting::Room)?;
                queue.collect(done);
            }
            // The queue failed: nothing more can be posted.
            Err(QueuePostError::Refused(PostError::QueueError { .. })) => break,
            Err(e) => return Err(e).context(format!("cannot post WRITE {wr}")),
        }
    }
    Ok(posts)
}

/// Confirms an unsignaled tail; a queue the last WRITE filled makes room first.
fn confirm_tail<D: Device>(
    queue: &mut SignaledQueue<D, u32>,
    cqes: &mut Cqes<'_, D::Cq>,
) -> Result<()> {
    while matches!(queue.state(), selsig::QueueState::Ready) {
        match queue.confirm_all() {
            Ok(Some(seq)) => {
                cqes.markers.push(seq.0);
                break;
            }
            Ok(None) => break,
            Err(QueuePostError::Refused(e)) if e.is_full() => cqes.wait(queue, Waiting::Room)?,
            Err(e) => return Err(e).context("cannot post the confirm marker"),
        }
    }
    Ok(())
}

/// Checks the remote buffer: every completed WRITE landed, nothing else did. The WRITEs
/// that differ, and the serving device when the target is a `selsig serve`.
fn verify<D: Device>(
    peer: Peer<D>,
    outcomes: &[Option<Outcome>],
    size: usize,
    slot: usize,
) -> Result<(Vec<u32>, Option<String>)> {
    // (`completed` is in ascending order.)
    let completed: Vec<u32> = outcomes
        .iter()
        .enumerate()
        .filter(|(_, o)| matches!(o, Some(Outcome::Completed)))
        .map(|(i, _)| i as u32 + 1)
        .collect();
    Ok(match peer {
        // (the local peer's region is a `D::Mr`)
        Peer::Local { region, .. } => {
            let mut mismatches = Vec::new();
            for i in 0..outcomes.len() {
                let mut got = vec![0u8; size];
                region.read(i * slot, &mut got)?;
                let expected = if completed.binary_search(&(i as u32 + 1)).is_ok() {
                    pattern(i as u64 + 1, size)
                } else {
                    vec![0; size]
                };
                if got != expected {
                    mismatches.push(i as u32 + 1);
                }
            }
            (mismatches, None)
        }
        Peer::Remote(remote) => {
            let where_ = format!("{} at {}", remote.device, remote.address);
            let mismatches = remote
                .check(completed)
                .context("cannot get the server's check of its memory")?;
            (mismatches, Some(where_))
        }
    })
}

/// What a demo run saw, before it is a [`Report`].
struct Run {
    posts: Vec<PostView>,
    cqes: Vec<CqeView>,
    confirmed: Vec<Confirmed>,
    outcomes: Vec<Option<Outcome>>,
    mismatches: Vec<u32>,
    target_device: Option<String>,
}

impl Run {
    fn report(
        self,
        args: &DemoArgs,
        info: &DeviceInfo,
        policy: Policy,
        sq_depth: u32,
        start: Instant,
    ) -> Report {
        let outcomes = &self.outcomes;
        let count =
            |f: fn(&Option<Outcome>) -> bool| outcomes.iter().filter(|o| f(o)).count() as u32;
        let summary = Summary {
            completed: count(|o| matches!(o, Some(Outcome::Completed))),
            failed: count(|o| matches!(o, Some(Outcome::Failed(_)))),
            flushed: count(|o| matches!(o, Some(Outcome::Flushed))),
            not_posted: count(Option::is_none),
            cqes: self.cqes.len() as u32,
            cqes_saved: (self.posts.len() as u32).saturating_sub(self.cqes.len() as u32),
        };
        Report {
            provider: info.provider.as_str(),
            device: info.device.clone(),
            personality: info.personality.map(|p| p.to_string()),
            wrs: args.wrs,
            size: args.size,
            policy: policy.to_string(),
            every: match policy {
                Policy::Every(n) => Some(n),
                Policy::Always => Some(1),
                _ => None,
            },
            sq_depth,
            fail_at: args.fail_at,
            outcomes: outcomes
                .iter()
                .enumerate()
                .map(|(i, o)| OutcomeView {
                    wr: i as u32 + 1,
                    outcome: o.map_or("not_posted", |o| o.as_str()),
                    status: match o {
                        Some(Outcome::Failed(s)) => Some(s.short_name()),
                        _ => None,
                    },
                })
                .collect(),
            posts: self.posts,
            cqes: self.cqes,
            confirmed: self.confirmed,
            remote_verified: self.mismatches.is_empty(),
            target: self.target_device,
            mismatches: self.mismatches,
            summary,
            elapsed_us: start.elapsed().as_micros(),
        }
    }
}

/// The index of WRITE `wr` (1-based).
fn i_of(wr: u32) -> usize {
    wr as usize - 1
}

/// The drawing of the seed: the send queue, the completions, what each confirmed.
pub fn render(r: &Report) -> String {
    use std::fmt::Write as _;
    let mut o = String::new();
    let where_ = match &r.personality {
        Some(p) => format!("{} ({} provider, {p} personality)", r.device, r.provider),
        None => format!("{} ({} provider)", r.device, r.provider),
    };
    let _ = writeln!(
        o,
        "selsig demo: {} of {} B on {where_}, policy {}, send queue depth {}",
        count(u64::from(r.wrs), "RDMA WRITE", "RDMA WRITEs"),
        r.size,
        r.policy,
        r.sq_depth
    );
    if let Some(t) = &r.target {
        let _ = writeln!(o, "The WRITEs go to the memory of selsig serve on {t}.");
    }
    if let Some(k) = r.fail_at {
        let _ = writeln!(o, "WR{k} is posted with a bad remote key.");
    }
    let _ = writeln!(o, "\nSend queue (S = signaled, U = unsignaled):");
    let items: Vec<String> = r
        .posts
        .iter()
        .map(|p| format!("WR{}({})", p.wr, if p.signaled { "S" } else { "U" }))
        .collect();
    for line in wrap_chain(&items, 96) {
        let _ = writeln!(o, "  {line}");
    }
    let forced: Vec<String> = r
        .posts
        .iter()
        .filter(|p| matches!(p.reason, Some("deadlock" | "cq_credit")))
        .map(|p| format!("WR{}", p.wr))
        .collect();
    if !forced.is_empty() {
        let _ = writeln!(
            o,
            "  (signaled by selsig so that the queue cannot fill with unsignaled WRs: {})",
            forced.join(", ")
        );
    }
    let _ = writeln!(o, "\nCompletion queue (what the NIC wrote):");
    if r.cqes.is_empty() {
        let _ = writeln!(o, "  (nothing)");
    }
    let lines: Vec<(String, String)> = r
        .cqes
        .iter()
        .zip(&r.confirmed)
        .map(|(cqe, conf)| {
            let name = match cqe.wr {
                Some(wr) => format!("CQE{wr}"),
                None => "CQE(marker)".to_string(),
            };
            let detail = match cqe.opcode {
                Some(op) => format!("wr_id {:#x}, {}, {op}", cqe.wr_id, cqe.status),
                None => format!("wr_id {:#x}, {}", cqe.wr_id, cqe.status),
            };
            (format!("{name}: {}", confirmation(cqe, conf, r)), detail)
        })
        .collect();
    let width = lines
        .iter()
        .map(|(l, _)| l.chars().count())
        .max()
        .unwrap_or(0);
    for (line, detail) in lines {
        let pad = width - line.chars().count();
        let _ = writeln!(o, "  {line}{}   ({detail})", " ".repeat(pad));
    }
    if r.cqes.iter().any(|c| c.marker) {
        let _ = writeln!(
            o,
            "  (the marker is a signaled zero-length WRITE selsig posted to confirm an unsignaled tail)"
        );
    }
    if r.fail_at.is_some() || r.summary.not_posted > 0 {
        let _ = writeln!(o, "\nOutcomes:");
        let mut line = Vec::new();
        for v in &r.outcomes {
            line.push(match v.status {
                Some(s) => format!("WR{} failed ({s})", v.wr),
                None => format!("WR{} {}", v.wr, v.outcome.replace('_', " ")),
            });
        }
        for l in wrap_list(&line, 96) {
            let _ = writeln!(o, "  {l}");
        }
    }
    let bytes = u64::from(r.summary.completed) * r.size;
    let bytes = match bytes {
        1 => "1 byte".to_string(),
        n => format!("{n} bytes"),
    };
    let _ = writeln!(o);
    if r.remote_verified {
        let (done, rest) = (r.summary.completed, r.wrs - r.summary.completed);
        let what = match (done, rest) {
            (1, 0) => format!("the write verified ({bytes})"),
            (_, 0) => format!("all {done} writes verified ({bytes})"),
            (0, 1) => "verified: the write did not land".to_string(),
            (0, _) => format!("verified: none of the {rest} writes landed"),
            _ => format!(
                "verified: {} landed ({bytes}), {} did not",
                match done {
                    1 => "the completed write".to_string(),
                    _ => format!("the {done} completed writes"),
                },
                match rest {
                    1 => "the other".to_string(),
                    _ => format!("the {rest} others"),
                }
            ),
        };
        let _ = writeln!(o, "Remote buffer: {what}.");
    } else {
        let list: Vec<String> = r.mismatches.iter().map(|w| format!("WR{w}")).collect();
        let _ = writeln!(
            o,
            "Remote buffer: VERIFICATION FAILED for {}.",
            list.join(", ")
        );
    }
    let s = &r.summary;
    let mut parts = vec![format!(
        "{} executed",
        count(u64::from(s.completed), "WR", "WRs")
    )];
    if s.failed > 0 {
        parts.push(format!("{} failed", s.failed));
    }
    if s.flushed > 0 {
        parts.push(format!("{} flushed", s.flushed));
    }
    if s.not_posted > 0 {
        parts.push(format!("{} not posted", s.not_posted));
    }
    let _ = writeln!(
        o,
        "Summary: {}; {} generated, {} saved vs signaling every WR.",
        parts.join(", "),
        count(u64::from(s.cqes), "CQE", "CQEs"),
        s.cqes_saved
    );
    o
}

/// `n` and the noun for it: "1 CQE", "2 CQEs".
fn count(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

fn confirmation(cqe: &CqeView, conf: &Confirmed, r: &Report) -> String {
    let outcome_of = |wr: u32| r.outcomes.get(wr as usize - 1).map(|o| o.outcome);
    if conf.wrs.is_empty() {
        return "nothing new confirmed".to_string();
    }
    let first = u64::from(conf.wrs[0]);
    let last = u64::from(*conf.wrs.last().unwrap_or(&conf.wrs[0]));
    match cqe.status {
        "success" => format!("{} confirmed", span(first, last)),
        "wr_flush_err" if conf.wrs.len() == 1 => format!("{} flushed", span(first, last)),
        "wr_flush_err" => {
            let done: Vec<u32> = conf
                .wrs
                .iter()
                .copied()
                .filter(|w| outcome_of(*w) == Some("completed"))
                .collect();
            match done.last() {
                Some(&l) => format!(
                    "{} completed, {} flushed",
                    span(first, u64::from(l)),
                    span(u64::from(l) + 1, last)
                ),
                None => format!("{} flushed", span(first, last)),
            }
        }
        _ if conf.wrs.len() == 1 => format!("{} failed", span(first, last)),
        _ => format!("{} completed, WR{last} failed", span(first, last - 1)),
    }
}

/// `a → b → c` wrapped at `width` columns.
fn wrap_chain(items: &[String], width: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let mut line = String::new();
    for (i, item) in items.iter().enumerate() {
        let piece = if i + 1 < items.len() {
            format!("{item} → ")
        } else {
            item.clone()
        };
        if line.chars().count() + piece.chars().count() > width && !line.is_empty() {
            lines.push(line.trim_end().to_string());
            line.clear();
        }
        line.push_str(&piece);
    }
    if !line.is_empty() {
        lines.push(line);
    }
    lines
}

fn wrap_list(items: &[String], width: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let mut line = String::new();
    for item in items {
        if line.len() + item.len() + 2 > width && !line.is_empty() {
            lines.push(line.clone());
            line.clear();
        }
        if !line.is_empty() {
            line.push_str(", ");
        }
        line.push_str(item);
    }
    if !line.is_empty() {
        lines.push(line);
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::remote::tests::open_gate;
    use crate::remote::tests::{hello_from, local_listener, soft_device, soft_info};
    use crate::remote::{RemotePeer, serve_on};
    use clap::Parser;
    use std::net::TcpStream;

    #[derive(Debug, Parser)]
    struct Options {
        #[command(flatten)]
        demo: DemoArgs,
    }

    /// `validate` on `selsig demo ARGS`.
    fn validated(args: &[&str]) -> Result<()> {
        let options = Options::try_parse_from(std::iter::once("demo").chain(args.iter().copied()))
            .unwrap_or_else(|e| panic!("{args:?} do not parse: {e}"));
        validate(&options.demo)
    }

    #[test]
    fn validate_takes_each_limit_and_refuses_one_beyond() {
        for args in [
            // MAX_WRS WRITEs of 1 KiB: exactly the 1 GiB registered on each side.
            &["--wrs", "1048576", "--size", "1024"][..],
            &["--wrs", "1048576", "--size", "0"],
            &["--wrs", "1", "--size", "1073741824"],
            &["--wrs", "5", "--fail-at", "1"],
            &["--wrs", "5", "--fail-at", "5"],
            &["--wrs", "1", "--fail-at", "1", "--size", "1"],
            // Its completion queue needs 2 × 2147483646 + 2 = u32::MAX - 1 entries.
            &["--tx-depth", "2147483646"],
            &["--tx-depth", "1", "--every", "1"],
        ] {
            if let Err(e) = validated(args) {
                panic!("{args:?} refused: {e:#}");
            }
        }
        for (args, text) in [
            (
                &["--wrs", "1048577", "--size", "1"][..],
                "--wrs 1048577: the demo runs at most 1048576 WRITEs",
            ),
            (
                &["--wrs", "1048576", "--size", "1025"],
                "--wrs 1048576 × --size 1025 needs 1074790400 bytes on each side; \
                 the demo registers at most 1073741824",
            ),
            (
                &["--wrs", "1", "--size", "1073741825"],
                "--wrs 1 × --size 1073741825 needs 1073741825 bytes on each side; \
                 the demo registers at most 1073741824",
            ),
            (
                &["--wrs", "1", "--size", "4294967296"],
                "--size 4294967296 is more than one WRITE carries",
            ),
            (
                &["--wrs", "5", "--fail-at", "6"],
                "--fail-at 6 names no WRITE: there are 5 (1 to 5)",
            ),
            (
                &["--wrs", "5", "--fail-at", "0"],
                "--fail-at 0 names no WRITE: there are 5 (1 to 5)",
            ),
            (&["--tx-depth", "0"], "--tx-depth must be at least 1"),
            (
                &["--tx-depth", "2147483647"],
                "--tx-depth 2147483647 is too large: its completion queue would need more \
                 than 4294967295 entries",
            ),
        ] {
            match validated(args) {
                Ok(()) => panic!("{args:?} taken"),
                Err(e) => assert_eq!(format!("{e:#}"), text, "{args:?}"),
            }
        }
    }

    /// A report of three WRITEs to a server, the third signaled, whose one completion is
    /// a flush with these outcomes (what the soft NIC never produces: a flush covering
    /// unsignaled WRITEs, and a server that finds a completed WRITE missing).
    fn flushed_report(outcomes: [&'static str; 3]) -> Report {
        let count = |what: &str| outcomes.iter().filter(|o| **o == what).count() as u32;
        Report {
            provider: "verbs",
            device: "rxe0".to_string(),
            personality: None,
            wrs: 3,
            size: 64,
            policy: "every:4".to_string(),
            every: Some(4),
            sq_depth: 64,
            fail_at: None,
            posts: (1..=3)
                .map(|wr| PostView {
                    wr,
                    wr_id: u64::from(wr),
                    signaled: wr == 3,
                    reason: (wr == 3).then_some("policy"),
                })
                .collect(),
            cqes: vec![CqeView {
                wr: Some(3),
                wr_id: 3,
                status: "wr_flush_err",
                opcode: None,
                marker: false,
            }],
            confirmed: vec![Confirmed {
                cqe: Some(3),
                wr_id: 3,
                wrs: vec![1, 2, 3],
            }],
            outcomes: (1..=3)
                .map(|wr| OutcomeView {
                    wr,
                    outcome: outcomes[wr as usize - 1],
                    status: None,
                })
                .collect(),
            remote_verified: false,
            mismatches: vec![2],
            target: Some("rxe0 at 10.0.0.2:18515".to_string()),
            summary: Summary {
                completed: count("completed"),
                failed: 0,
                flushed: count("flushed"),
                not_posted: 0,
                cqes: 1,
                cqes_saved: 2,
            },
            elapsed_us: 0,
        }
    }

    #[test]
    fn render_draws_a_flush_covering_several_writes_and_a_failed_check() {
        let text = render(&flushed_report(["completed", "completed", "flushed"]));
        assert_eq!(
            text,
            "selsig demo: 3 RDMA WRITEs of 64 B on rxe0 (verbs provider), policy every:4, send queue depth 64\n\
             The WRITEs go to the memory of selsig serve on rxe0 at 10.0.0.2:18515.\n\
             \n\
             Send queue (S = signaled, U = unsignaled):\n\
             \x20 WR1(U) → WR2(U) → WR3(S)\n\
             \n\
             Completion queue (what the NIC wrote):\n\
             \x20 CQE3: WR1–WR2 completed, WR3 flushed   (wr_id 0x3, wr_flush_err)\n\
             \n\
             Remote buffer: VERIFICATION FAILED for WR2.\n\
             Summary: 2 WRs executed, 1 flushed; 1 CQE generated, 2 saved vs signaling every WR.\n"
        );
        let text = render(&flushed_report(["flushed", "flushed", "flushed"]));
        assert!(
            text.contains("\n  CQE3: WR1–WR3 flushed   (wr_id 0x3, wr_flush_err)\n"),
            "{text}"
        );
        assert!(
            text.contains("\nSummary: 0 WRs executed, 3 flushed; 1 CQE generated"),
            "{text}"
        );
    }

    /// `selsig serve` and `selsig demo --connect` on one soft NIC in this process: the
    /// demo's WRITEs land in the server's region, the server checks them against the
    /// outcomes and passes the session; a client whose outcomes lie fails it, as does one
    /// that says nothing; one that ends unchecked passes.
    #[test]
    fn serve_passes_a_demo_and_fails_a_client_whose_outcomes_are_not_its_memory() {
        use clap::Parser;
        use std::io::Write as _;
        #[derive(Debug, Parser)]
        struct Options {
            #[command(flatten)]
            demo: DemoArgs,
        }
        let (dev, pd, cq) = soft_device();
        let info = soft_info();
        let (listener, at) = local_listener();
        std::thread::scope(|s| {
            // WRITE 6 fails, 7 and 8 are flushed: the server finds 1 to 5 and zeros.
            let server = s.spawn(|| serve_on(&listener, &dev, &info, &open_gate(), true));
            let args = Options::parse_from(["demo", "--connect", &at, "--fail-at", "6"]);
            let report = (&args.demo).run(&dev, &info).unwrap();
            assert_eq!((report.summary.completed, report.summary.failed), (5, 1));
            assert!(report.remote_verified);
            assert_eq!(report.mismatches, [0u32; 0]);
            assert_eq!(report.target, Some(format!("soft0 at {at}")));
            assert!(server.join().unwrap().unwrap(), "the server's check");
            // WRITE 1 said to have completed, never posted.
            let server = s.spawn(|| serve_on(&listener, &dev, &info, &open_gate(), true));
            let (qp, _) = hello_from(&dev, &pd, &cq, 2, 64, 0);
            let mine = qp.endpoint(&ConnectOptions::default()).unwrap();
            let peer = RemotePeer::connect(&at, &mine, 2, 64, None, Cm::Tcp).unwrap();
            assert_eq!(peer.check(vec![1]).unwrap(), [1]);
            assert!(!server.join().unwrap().unwrap(), "the server's check");
            // A session ended unchecked passes (nothing to check).
            let server = s.spawn(|| serve_on(&listener, &dev, &info, &open_gate(), true));
            let peer = RemotePeer::connect(&at, &mine, 2, 64, None, Cm::Tcp).unwrap();
            peer.finish_unchecked().unwrap();
            assert!(server.join().unwrap().unwrap(), "a session ended unchecked");
            // Connections that break off before a hello, or say one that is not the
            // exchange's (a port scan), decide nothing: the client after them does.
            let server = s.spawn(|| serve_on(&listener, &dev, &info, &open_gate(), true));
            drop(TcpStream::connect(&at).unwrap());
            let mut garbled = TcpStream::connect(&at).unwrap();
            garbled.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
            drop(garbled);
            let peer = RemotePeer::connect(&at, &mine, 2, 64, None, Cm::Tcp).unwrap();
            peer.finish_unchecked().unwrap();
            assert!(server.join().unwrap().unwrap(), "the client after a scan");
            // A client that says hello and breaks off: the session fails.
            let server = s.spawn(|| serve_on(&listener, &dev, &info, &open_gate(), true));
            let mut quits = TcpStream::connect(&at).unwrap();
            let (_, hello) = hello_from(&dev, &pd, &cq, 2, 64, 0);
            quits.write_all(hello.as_bytes()).unwrap();
            drop(quits);
            assert!(!server.join().unwrap().unwrap(), "a session broken off");
        });
    }
}
