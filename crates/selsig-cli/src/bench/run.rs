//! The sweep runner: the device's objects for each point, the point's loop of posts and polls
//! (perftest's loop), and its figures.

use std::io::IsTerminal as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use selsig::{
    Access, Buffer, ConnectOptions, Device, MemoryRegion, Opcode, Policy, QpCaps, QpInit,
    QueueConfig, QueuePair, RemoteAddr, SharedCq, SignaledQueue, Stats, Work,
};

use crate::bench::host::{memcpy_gbit, round_trip_ns, run_waits, thread_cpu, waited};
use crate::bench::options::BenchArgs;
use crate::bench::perftest::{
    QpWrites, Scratch, check_target, drive_qps, offsets_used, perftest_offset,
};
use crate::bench::plan::{Plan, Stop, buffers};
use crate::bench::report::{MemcpyRef, Percentiles, Point, Report, Settings, new_histogram};
use crate::bench::tally::Tally;
use crate::bench::units::{MIB, gbit};
use crate::common::{DeviceInfo, OnDevice, pattern, with_device};
use crate::remote::Peer;

/// Completions polled at once in perftest mode (perftest's `CTX_POLL_BATCH`).
const PERFTEST_POLL_BATCH: usize = 16;

/// The unmeasured run before the first point.
const WARM_UP: Duration = Duration::from_millis(100);

/// Points shorter than this have no [`Point::wait_share`]: the kernel adds a wait up when
/// it ends, so one begun before the point counts in it whole, and a few milliseconds of
/// that (a time slice or two) would swamp the figure of a short point.
const WAIT_SHARE_MIN_TIME: Duration = Duration::from_millis(100);
/// A point that makes no progress for this long has failed, or for longer where one
/// completion covers more bytes than a slow device moves in that time ([`stall_limit`]).
const STALL: Duration = Duration::from_secs(30);
/// How long a point goes without retiring a WRITE before it asks whether `selsig serve`
/// went away, and how often it asks again.
const PEER_CHECK: Duration = Duration::from_secs(1);
/// The slowest rate [`stall_limit`] allows a healthy device: Soft-RoCE under emulation
/// moves large WRITEs at 60 to 90 MB/s and small ones at 3 MB/s (where a completion
/// covers few bytes).
const STALL_RATE: f64 = 4.0 * (1u64 << 20) as f64;

/// A timed run reads the clock after every 64 post calls, or sooner once this many bytes
/// were posted since it last did (a post call of large WRITEs takes long).
const CLOCK_BYTES: u64 = 1 << 20;

/// Runs the sweep (call [`plan`](crate::bench::plan::plan) first), with a progress bar on
/// stderr when it is a terminal.
pub fn bench(args: &BenchArgs, plan: &Plan) -> Result<Report> {
    with_device(&args.provider, plan)
}

impl OnDevice for &Plan {
    type Output = Report;
    fn run<D: Device>(self, dev: &D, info: &DeviceInfo) -> Result<Report> {
        run_sweep(self, dev, info)
    }
}

fn run_sweep<D: Device>(plan: &Plan, dev: &D, info: &DeviceInfo) -> Result<Report> {
    let total = (plan.policies.len() * plan.sizes.len()) as u64;
    let bar = if std::io::stderr().is_terminal() {
        let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
        // The spinner turns during a long point; twice a second takes next to nothing
        // from the measured threads.
        bar.enable_steady_tick(Duration::from_millis(500));
        bar
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{bar:30}] {pos}/{len} {msg}")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    let pd = dev
        .alloc_pd()
        .context("cannot allocate a protection domain")?;
    let mut points = Vec::new();
    let mut sq_capacity = 0;
    // Whether the NIC's times were recorded (the soft provider only).
    let mut nic_times = false;
    let mut buffers_per_size = Vec::new();
    // Every size's inline data must fit before any point runs: a size the device does not
    // take inline would otherwise end the sweep after the points before it.
    if plan.inline {
        for &size in &plan.sizes {
            create_qp(plan, dev, &pd, size)?;
        }
    }
    // Warm up the device (and, on the soft provider, the NIC thread) unmeasured.
    if !plan.perftest {
        bar.set_message("warming up");
        let warm = Stop::Duration(WARM_UP);
        run_point(plan, dev, info, &pd, plan.sizes[0], plan.policies[0], warm)
            .context("warm-up run")?;
    }
    // The soft NIC's round-trip yardstick, around each point of a sweep: measured once
    // between two points, the one after a point is the one before the next.
    let yardstick = info.personality.is_some() && !plan.perftest;
    let mut round_trip = yardstick.then(round_trip_ns).flatten();
    for &size in &plan.sizes {
        for &policy in &plan.policies {
            bar.set_message(format!("{size} B, {policy}"));
            let (mut point, cap, buffers, recorded) =
                run_point(plan, dev, info, &pd, size, policy, plan.stop)
                    .with_context(|| format!("{size}-byte WRITEs, {policy}"))?;
            let before = round_trip;
            round_trip = before.and_then(|_| round_trip_ns());
            point.round_trip_ns = before.zip(round_trip).map(|(b, a)| [b, a]);
            sq_capacity = cap;
            nic_times |= recorded;
            if !buffers_per_size.iter().any(|&(s, _)| s == size) {
                buffers_per_size.push((size, buffers));
            }
            points.push(point);
            bar.inc(1);
        }
    }
    let mut memcpy = Vec::new();
    if info.personality.is_some() && !plan.perftest {
        bar.set_message("memcpy reference");
        for &(size, buffers) in &buffers_per_size {
            memcpy.push(MemcpyRef {
                size,
                gbit_per_sec: memcpy_gbit(size as usize, buffers as usize),
            });
        }
    }
    bar.finish_and_clear();
    Ok(Report {
        memcpy,
        provider: info.provider.as_str().to_string(),
        device: info.device.clone(),
        personality: info.personality.map(|p| p.to_string()),
        settings: Settings {
            opcode: "RDMA_WRITE".to_string(),
            tx_depth: plan.tx_depth,
            sq_capacity,
            post_list: plan.post_list,
            inline: plan.inline,
            iters: match plan.stop {
                Stop::Iters(n) => Some(n),
                Stop::Duration(_) => None,
            },
            duration_s: match plan.stop {
                Stop::Duration(d) => Some(d.as_secs_f64()),
                Stop::Iters(_) => None,
            },
            perftest_mode: plan.perftest,
            nic_times,
            buffers_per_size,
            remote: plan.connect.clone(),
            // Each queue pair has a region of its own (a slice of one, locally).
            region: plan.region * u64::from(plan.qps),
            gid_index: info.gid_index,
            qps: plan.qps,
        },
        points,
    })
}

/// How long a point may go without retiring a WRITE: [`STALL`], or as long as a device
/// moving [`STALL_RATE`] takes for the WRITEs one completion covers (a queue of
/// `sq_capacity` forces a signal at the latest once per queue).
fn stall_limit(policy: Policy, sq_capacity: u32, size: u64) -> Duration {
    let interval = policy
        .interval()
        .unwrap_or(sq_capacity)
        .clamp(1, sq_capacity.max(1));
    let bytes = f64::from(interval) * size as f64;
    STALL.max(Duration::from_secs_f64(bytes / STALL_RATE))
}

/// The completion queue and queue pair of a point of `size`-byte WRITEs; with `--inline`,
/// refused unless the device takes `size` bytes inline.
fn create_qp<D: Device>(
    plan: &Plan,
    dev: &D,
    pd: &D::Pd,
    size: u64,
) -> Result<(Arc<D::Cq>, D::Qp)> {
    let depth = plan.tx_depth;
    let cq = Arc::new(dev.create_cq(plan.cq_entries).with_context(|| {
        format!(
            "cannot create the completion queue of {} entries for --tx-depth {depth}",
            plan.cq_entries
        )
    })?);
    let qp = create_qp_on(plan, dev, pd, &cq, &cq, size)?;
    Ok((cq, qp))
}

/// A queue pair for `size`-byte WRITEs whose sends complete to `send_cq`, its receives to
/// `recv_cq`.
fn create_qp_on<D: Device>(
    plan: &Plan,
    dev: &D,
    pd: &D::Pd,
    send_cq: &D::Cq,
    recv_cq: &D::Cq,
    size: u64,
) -> Result<D::Qp> {
    let depth = plan.tx_depth;
    let init = QpInit {
        caps: QpCaps {
            max_send_wr: depth,
            max_recv_wr: 1,
            max_inline_data: if plan.inline { size as u32 } else { 0 },
            ..QpCaps::default()
        },
        sq_sig_all: false,
    };
    let qp = dev
        .create_qp(pd, send_cq, recv_cq, &init)
        .with_context(|| {
            if plan.inline {
                format!("cannot create a queue pair for {size}-byte inline WRITEs (--inline)")
            } else {
                format!(
                    "cannot create the queue pair of --tx-depth {}",
                    plan.tx_depth
                )
            }
        })?;
    if plan.inline && qp.caps().max_inline_data < size as u32 {
        bail!(
            "--inline: {size}-byte WRITEs exceed the device's inline limit of {} bytes",
            qp.caps().max_inline_data
        );
    }
    Ok(qp)
}

/// One point: a fresh queue pair and completion queue, `stop`'s worth of WRITEs of `size`
/// bytes under `policy`. Returns the point, the send queue's capacity, the number of
/// buffers and whether the NIC's times were recorded.
fn run_point<D: Device>(
    plan: &Plan,
    dev: &D,
    info: &DeviceInfo,
    pd: &D::Pd,
    size: u64,
    policy: Policy,
    stop: Stop,
) -> Result<(Point, u32, u32, bool)> {
    if plan.qps > 1 {
        return run_qps_point(plan, dev, info, pd, size, policy, stop);
    }
    let depth = plan.tx_depth;
    let len = size as usize;
    let (cq, qp) = create_qp(plan, dev, pd, size)?;
    // Sweep: one buffer per slot, as many as fit in the region; a WRITE owns its buffer
    // until a completion confirms it. perftest mode: perftest's memory, one region of
    // max(size, page) bytes on each side, the same bytes written again and again.
    let buffers = if plan.perftest {
        1
    } else {
        buffers(plan.region, depth, size)
    };
    let bytes = if plan.perftest {
        // At most --size (below 4 GiB) or the page.
        len.max(plan.geometry.page as usize)
    } else {
        buffers as usize * len
    };
    let options = ConnectOptions {
        gid_index: info.gid_index,
        port: info.port,
        ..ConnectOptions::default()
    };
    // A sweep's target has a slot per buffer; otherwise one slot of all the bytes.
    let (slots, slot) = if plan.sweep_with_buffers() {
        (buffers, len as u64)
    } else {
        (1, bytes as u64)
    };
    // A timed point tells a server how long it runs (a counted one cannot know).
    let run = match stop {
        Stop::Duration(d) => Some(d),
        Stop::Iters(_) => None,
    };
    let peer = Peer::open(
        dev,
        pd,
        &qp,
        &options,
        plan.connect.as_deref().map(|host| (host, plan.cm)),
        slots,
        slot,
        run,
    )?;
    let (free, fixed) = local_memory(plan, dev, pd, len, buffers, bytes)?;
    let inline_data = pattern(1, if plan.inline { len } else { 0 });
    let target = peer.target();
    let sq_capacity = qp.caps().max_send_wr;
    let nic_times = plan.nic_times && qp.record_execution_times(true);
    let config = queue_config(plan, policy, target);
    let timed = !plan.perftest;
    let first_seq = config.first_seq;
    let mut queue: SignaledQueue<D, ()> = SignaledQueue::with_config(qp, Arc::clone(&cq), config)?;
    let adaptive = matches!(policy, Policy::Adaptive { .. });
    let writes = Writes {
        plan,
        stop,
        size,
        buffers,
        cap: if plan.inline || plan.perftest {
            depth
        } else {
            depth.min(buffers)
        },
        target,
        fixed: &fixed,
        inline_data: &inline_data,
        timed,
    };
    let mut nic = NicTimes {
        recorded: nic_times,
        first_seq,
        done: Vec::with_capacity(depth as usize),
        gap: new_histogram(),
        to_nic: new_histogram(),
    };
    let mut tally = Tally::new(timed, free, depth as usize);
    let stall = stall_limit(policy, sq_capacity, len as u64);
    let (p, elapsed) = drive(
        &mut queue, &mut tally, &writes, &mut nic, &peer, adaptive, stall,
    )?;
    queue.qp().record_execution_times(false);

    let stats = queue.stats();
    let posted = p.posted;
    ensure!(
        stats.completed == posted && tally.retired == posted,
        "{posted} WRITEs posted, {} completed",
        stats.completed
    );
    let point = point_of(size, policy, posted, &elapsed, stats, &tally, &nic);
    drop(queue);
    // In a sweep, buffer k (from 0) holds the pattern of WRITE k + 1 and is written to slot
    // k; the free list is a stack, so the slots below its lowest height were never used.
    let written = plan
        .sweep_with_buffers()
        .then(|| (p.lowest_free as u32 + 1..=buffers).collect());
    finish(peer, written)?;
    Ok((point, sq_capacity, buffers, nic_times))
}

/// A perftest-mode point over `--qp` queue pairs (ib_write_bw -q): each with a peer queue
/// pair and region of its own on the device, their sends completing to one completion
/// queue, shared through a [`SharedCq`] (their receive queues, empty, to another); the local memory one region, a slice of
/// `max(SIZE, PAGE)` bytes per queue pair, as perftest's. `stop`'s WRITEs on each, posted
/// round robin ([`drive_qps`]); the figures are of all of them, over the time from the first
/// post to the last completion. Then each peer's memory is checked: it holds what its queue
/// pair's WRITEs carried (each queue pair's bytes are its own), where they went.
fn run_qps_point<D: Device>(
    plan: &Plan,
    dev: &D,
    info: &DeviceInfo,
    pd: &D::Pd,
    size: u64,
    policy: Policy,
    stop: Stop,
) -> Result<(Point, u32, u32, bool)> {
    let (n, depth, len) = (plan.qps, plan.tx_depth, size as usize);
    let Stop::Iters(iters) = stop else {
        bail!("--qp {n}: perftest mode counts -n WRITEs on each queue pair");
    };
    let entries = crate::bench::perftest::cq_entries(depth, n)?;
    let cq = Arc::new(dev.create_cq(entries).with_context(|| {
        format!(
            "cannot create the completion queue of {entries} entries for --qp {n} with \
             --tx-depth {depth}"
        )
    })?);
    // The receive queues' (nothing is received: one entry per queue pair).
    let recv_cq = dev.create_cq(n).with_context(|| {
        format!("cannot create the receive queues' completion queue of --qp {n}")
    })?;
    let options = ConnectOptions {
        gid_index: info.gid_index,
        port: info.port,
        ..ConnectOptions::default()
    };
    // Each queue pair's slice: max(size, page) bytes, as perftest's BUFF_SIZE.
    let bytes = len.max(plan.geometry.page as usize);
    let mut qps = Vec::with_capacity(n as usize);
    let mut peers = Vec::with_capacity(n as usize);
    for i in 1..=n {
        let qp = create_qp_on(plan, dev, pd, &cq, &recv_cq, size)
            .with_context(|| format!("queue pair {i} of --qp {n}"))?;
        let peer = Peer::open(dev, pd, &qp, &options, None, 1, bytes as u64, None)
            .with_context(|| format!("the peer of queue pair {i} of --qp {n}"))?;
        qps.push(qp);
        peers.push(peer);
    }
    let shared = SharedCq::<D>::new(Arc::clone(&cq));
    let sq_capacity = qps.first().map_or(0, |qp| qp.caps().max_send_wr);
    let mut queues: Vec<SignaledQueue<D, ()>> = Vec::with_capacity(n as usize);
    for (qp, peer) in qps.into_iter().zip(&peers) {
        let config = queue_config(plan, policy, peer.target());
        queues.push(SignaledQueue::on_shared_cq(qp, &shared, config)?);
    }
    // Each queue pair's bytes: the pattern of its number, in its slice or inline.
    let local_bytes: Vec<Vec<u8>> = (1..=u64::from(n))
        .map(|i| pattern(i, if plan.inline { len } else { bytes }))
        .collect();
    let local = if plan.inline {
        None
    } else {
        let total = bytes * n as usize;
        let mr = dev
            .reg_mr(pd, total, Access::LOCAL_WRITE)
            .with_context(|| format!("cannot register the {total}-byte local region"))?;
        for (i, data) in local_bytes.iter().enumerate() {
            mr.write(i * bytes, data)?;
        }
        Some(mr)
    };
    let writes: Vec<QpWrites<'_, D::Mr>> = peers
        .iter()
        .zip(&local_bytes)
        .enumerate()
        .map(|(i, (peer, data))| QpWrites {
            local: local.as_ref().map(|mr| (mr, i * bytes)),
            inline: data,
            target: peer.target(),
        })
        .collect();
    let stall = stall_limit(policy, sq_capacity, size);
    let mut scratch = Scratch::new(&queues, PERFTEST_POLL_BATCH);

    let waits0 = run_waits();
    let cpu0 = thread_cpu();
    let start = Instant::now();
    drive_qps(
        &mut queues,
        &shared,
        &writes,
        iters,
        size,
        plan.geometry,
        depth,
        stall,
        &mut scratch,
    )?;
    let elapsed = Elapsed {
        seconds: start.elapsed().as_secs_f64(),
        cpu: thread_cpu().saturating_sub(cpu0),
        waited: match (waits0, run_waits()) {
            (Some(before), Some(after)) => Some(waited(&before, &after)),
            _ => None,
        },
    };

    let mut stats = Stats::default();
    for queue in &queues {
        stats.merge(queue.stats());
    }
    let posted: u64 = scratch.posted.iter().sum();
    ensure!(
        stats.completed == posted,
        "{posted} WRITEs posted on {n} queue pairs, {} completed",
        stats.completed
    );
    // Nothing of a point's tally: perftest mode reads no clock while it runs.
    let tally: Tally<D::Mr> = Tally::new(false, Vec::new(), 0);
    let nic = NicTimes {
        recorded: false,
        first_seq: 0,
        done: Vec::new(),
        gap: new_histogram(),
        to_nic: new_histogram(),
    };
    let mut point = point_of(size, policy, posted, &elapsed, &stats, &tally, &nic);
    point.wrs_per_qp = scratch.retired.clone();
    drop(queues);
    // Each peer holds its own queue pair's bytes where they went, and zeros elsewhere.
    let offsets = offsets_used(iters, size, plan.geometry);
    for (i, (peer, data)) in peers.iter().zip(&local_bytes).enumerate() {
        if let Peer::Local { region, .. } = peer {
            let mut got = vec![0u8; bytes];
            region.read(0, &mut got)?;
            check_target(i as u32 + 1, &got, data, plan.inline, &offsets, size)?;
        }
    }
    Ok((point, sq_capacity, 1, false))
}

/// A point's loop (perftest's: post while there is room, then poll), from the first post to
/// the last WRITE retired: an error for a WRITE that did not complete, or when none retires
/// for `stall`. Returns where the posting ended, and how long it all took.
fn drive<D: Device>(
    queue: &mut SignaledQueue<D, ()>,
    tally: &mut Tally<D::Mr>,
    writes: &Writes<'_, D::Mr>,
    nic: &mut NicTimes<D::Mr>,
    peer: &Peer<D>,
    adaptive: bool,
    stall: Duration,
) -> Result<(Posting, Elapsed)> {
    let mut p = Posting {
        posted: 0,
        posting: true,
        confirm: false,
        posts: 0,
        unclocked: 0,
        lowest_free: tally.free.len(),
    };
    let mut loops = 0u32;
    let mut last_progress = Instant::now();
    let mut retired_at_check = 0u64;
    let mut peer_checked = Instant::now();

    let waits0 = run_waits();
    let cpu0 = thread_cpu();
    let start = Instant::now();
    while p.posting || p.confirm || tally.retired < p.posted {
        loops = loops.wrapping_add(1);
        // Post while there is room, then poll (perftest's loop).
        post_writes(queue, tally, writes, &mut p, start)?;
        if p.confirm {
            // The tail of a timed run is confirmed with a marker, once there is room.
            match queue.confirm_all() {
                Ok(_) => p.confirm = false,
                Err(selsig::QueuePostError::Refused(e)) if e.is_full() => {}
                Err(e) => {
                    return Err(e).context("cannot post the marker that confirms the tail");
                }
            }
        }
        if adaptive {
            queue.tick().context("cannot confirm the adaptive tail")?;
        }
        poll_writes(queue, tally, nic, writes.timed, start)?;
        tally.end_poll();
        if let Some((seq, outcome)) = tally.failed {
            bail!("WRITE {seq} ended {outcome:?}{}", peer.closed_note());
        }
        if loops.is_multiple_of(4096) {
            // A stall check that reads the clock rarely, and once.
            let now = Instant::now();
            let idle = now.duration_since(last_progress);
            if tally.retired != retired_at_check {
                (retired_at_check, last_progress) = (tally.retired, now);
            } else if idle > stall {
                bail!(
                    "no completion for {} s ({} of {} WRITEs retired){}",
                    stall.as_secs(),
                    tally.retired,
                    p.posted,
                    peer.closed_note()
                );
            } else if idle > PEER_CHECK && now.duration_since(peer_checked) > PEER_CHECK {
                // A server that went away takes its queue pair with it: what is left
                // never completes (rxe retransmits it for ever), so say so now.
                peer_checked = now;
                let gone = peer.closed_note();
                if !gone.is_empty() {
                    bail!(
                        "no completion for {:.0} s ({} of {} WRITEs retired){gone}",
                        idle.as_secs_f64(),
                        tally.retired,
                        p.posted,
                    );
                }
            }
        }
    }
    let elapsed = Elapsed {
        seconds: start.elapsed().as_secs_f64(),
        cpu: thread_cpu().saturating_sub(cpu0),
        waited: match (waits0, run_waits()) {
            (Some(before), Some(after)) => Some(waited(&before, &after)),
            _ => None,
        },
    };
    Ok((p, elapsed))
}

/// A point's local memory: a sweep's free buffers, or perftest mode's one region.
type LocalMemory<M> = (Vec<Buffer<M>>, Option<M>);

/// The local memory of a point: in a sweep, `buffers` buffers of `len` bytes, each holding
/// the pattern of its WRITE; in perftest mode, one region of `bytes` bytes; none with inline
/// data.
fn local_memory<D: Device>(
    plan: &Plan,
    dev: &D,
    pd: &D::Pd,
    len: usize,
    buffers: u32,
    bytes: usize,
) -> Result<LocalMemory<D::Mr>> {
    let mut free: Vec<Buffer<D::Mr>> = Vec::new();
    let mut fixed: Option<D::Mr> = None;
    if !plan.inline {
        let local = dev
            .reg_mr(pd, bytes, Access::LOCAL_WRITE)
            .with_context(|| format!("cannot register the {bytes}-byte local region"))?;
        if plan.perftest {
            local.write(0, &pattern(1, bytes))?;
            fixed = Some(local);
        } else {
            for i in 0..buffers as usize {
                local.write(i * len, &pattern(i as u64 + 1, len))?;
            }
            free = Buffer::new(local)
                .split_into(buffers as usize, len)
                .map_err(|_| anyhow::anyhow!("the local region holds the buffers"))?
                .0;
        }
    }
    Ok((free, fixed))
}

/// The queue of a point: `policy`, markers to `target`, perftest's poll batch in perftest
/// mode.
fn queue_config(plan: &Plan, policy: Policy, target: RemoteAddr) -> QueueConfig {
    QueueConfig {
        policy,
        marker_target: target,
        poll_batch: if plan.perftest {
            PERFTEST_POLL_BATCH
        } else {
            QueueConfig::default().poll_batch
        },
        // The queue reads the clock only for the adaptive policy: the bench measures lag
        // itself (one clock reading per post, one per poll that finds completions), and
        // perftest mode reads no clock inside the loop at all, as perftest (whose cycle
        // counter costs nothing where clock readings are slow, as in an emulated VM).
        measure_lag: matches!(policy, Policy::Adaptive { .. }),
        ..QueueConfig::default()
    }
}

/// What a point's WRITEs are: how many, of what size, from which memory, to where.
struct Writes<'a, M> {
    plan: &'a Plan,
    stop: Stop,
    size: u64,
    buffers: u32,
    /// The most WRITEs outstanding: the queue depth, or the buffers if fewer.
    cap: u32,
    target: RemoteAddr,
    /// perftest mode's one local region (none with inline data).
    fixed: &'a Option<M>,
    inline_data: &'a [u8],
    /// Whether the clock is read at each post (not in perftest mode).
    timed: bool,
}

/// Where the posting of a point stands.
struct Posting {
    posted: u64,
    /// Whether WRITEs remain to be posted.
    posting: bool,
    /// Whether the tail of a timed run still waits for its marker.
    confirm: bool,
    posts: u32,
    /// Bytes posted since a timed run last read the clock.
    unclocked: u64,
    /// The lowest the free list got (the buffers below it were never written).
    lowest_free: usize,
}

/// Posts while the queue has room, up to `--post-list` WRITEs a call, until the run's
/// WRITEs are all posted or its time is up (then `confirm` is set for a timed run).
#[inline(always)]
fn post_writes<D: Device>(
    queue: &mut SignaledQueue<D, ()>,
    tally: &mut Tally<D::Mr>,
    writes: &Writes<'_, D::Mr>,
    p: &mut Posting,
    start: Instant,
) -> Result<()> {
    let (plan, stop, size, buffers, target) = (
        writes.plan,
        writes.stop,
        writes.size,
        writes.buffers,
        writes.target,
    );
    while p.posting {
        let room = writes
            .cap
            .saturating_sub(queue.outstanding())
            .min(plan.post_list);
        let room = match stop {
            Stop::Iters(n) => u64::from(room).min(n - p.posted),
            Stop::Duration(_) => u64::from(room),
        };
        if room == 0 {
            break;
        }
        let now = if writes.timed { Instant::now() } else { start };
        let last = match stop {
            Stop::Iters(n) => n,
            Stop::Duration(_) => u64::MAX,
        };
        let count = {
            let free = &mut tally.free;
            let data = writes.inline_data;
            let posted = p.posted;
            let result = if !plan.perftest && !plan.inline && room > 1 {
                // A sweep's list: the top `room` buffers of the free list (there are
                // as many as the queue has room for), taken in one drain.
                let at = free.len().saturating_sub(room as usize);
                let first = posted;
                let mut works = free.drain(at..).enumerate().map(|(k, buf)| {
                    let at = buf.offset() as u64;
                    signal_last(
                        Work::write(buf, target.offset(at), ()),
                        first + k as u64,
                        last,
                    )
                });
                queue.post_batch(&mut works)
            } else {
                // WRITE `index` (from 0) of the run.
                let mut work = |index: u64| {
                    let work = if plan.perftest {
                        let at = perftest_offset(index, size, plan.geometry);
                        match writes.fixed {
                            Some(mr) => Work::raw(
                                Opcode::RdmaWrite,
                                Some(mr.sge(at as usize, size as u32)),
                                target.offset(at),
                                (),
                            ),
                            None => Work::write_inline(data, target.offset(at), ()),
                        }
                    } else if plan.inline {
                        let at = (index % u64::from(buffers)) * size;
                        Work::write_inline(data, target.offset(at), ())
                    } else {
                        let buf = free.pop()?;
                        let at = buf.offset() as u64;
                        Work::write(buf, target.offset(at), ())
                    };
                    Some(signal_last(work, index, last))
                };
                if room == 1 {
                    // One at a time (perftest's default): the queue's single-post path.
                    match work(posted) {
                        Some(w) => queue.post(w).map(|_| 1),
                        None => Ok(0),
                    }
                } else {
                    let mut k = 0u64;
                    let mut works = std::iter::from_fn(|| {
                        if k == room {
                            return None;
                        }
                        k += 1;
                        work(posted + k - 1)
                    });
                    queue.post_batch(&mut works)
                }
            };
            match result {
                Ok(n) => n as u64,
                Err(e) => {
                    return Err(anyhow::Error::new(e)
                        .context(format!("cannot post (after {posted} WRITEs)")));
                }
            }
        };
        // Work requests the queue had no room for stay in `works`; with room
        // computed from `outstanding` that cannot happen.
        ensure!(count == room, "posted {count} of {room} WRITEs");
        tally.posted(queue.tracker().next_seq().0, now);
        p.lowest_free = p.lowest_free.min(tally.free.len());
        p.posted += count;
        p.posts = p.posts.wrapping_add(1);
        p.posting = match stop {
            Stop::Iters(n) => p.posted < n,
            Stop::Duration(d) => {
                p.unclocked += count * size;
                if !p.posts.is_multiple_of(64) && p.unclocked < CLOCK_BYTES {
                    true
                } else {
                    p.unclocked = 0;
                    start.elapsed() < d
                }
            }
        };
        p.confirm = !p.posting && matches!(stop, Stop::Duration(_));
    }
    Ok(())
}

/// The NIC's time of each WRITE, where recorded (the soft provider), and the gaps it gives.
struct NicTimes<M> {
    /// Whether the NIC records them: the completions are then polled into `done`.
    recorded: bool,
    /// The queue's first sequence number (the NIC numbers WRITEs from 0).
    first_seq: u64,
    done: Vec<selsig::Completion<M, ()>>,
    /// From the NIC finishing a WRITE to the application learning of it.
    gap: Histogram<u64>,
    /// From a WRITE's post to the NIC finishing it.
    to_nic: Histogram<u64>,
}

/// Polls once and hands what retired to `tally`.
#[inline(always)]
fn poll_writes<D: Device>(
    queue: &mut SignaledQueue<D, ()>,
    tally: &mut Tally<D::Mr>,
    nic: &mut NicTimes<D::Mr>,
    timed: bool,
    start: Instant,
) -> Result<()> {
    if nic.recorded {
        // The NIC's time of each WRITE is looked up through the queue pair, which
        // `poll_with` holds while it hands completions over: poll into a list.
        queue.poll(&mut nic.done).context("cannot poll")?;
        if !nic.done.is_empty() {
            let now = Instant::now();
            for c in nic.done.drain(..) {
                let seq = c.seq.0;
                let posted_at = tally.take(c, now);
                if let Some(at) = queue.qp().executed_at(seq - nic.first_seq) {
                    nic.gap
                        .saturating_record(now.saturating_duration_since(at).as_nanos() as u64);
                    nic.to_nic.saturating_record(
                        at.saturating_duration_since(posted_at).as_nanos() as u64,
                    );
                }
            }
        }
    } else {
        // One clock reading per poll that retires anything.
        let mut now = None;
        queue
            .poll_with(|c| {
                let at = *now.get_or_insert_with(|| if timed { Instant::now() } else { start });
                tally.take(c, at);
            })
            .context("cannot poll")?;
    }
    Ok(())
}

/// How long a point ran, the posting thread's CPU time in it, and the time the bench's
/// threads waited for a CPU (where the kernel says).
struct Elapsed {
    seconds: f64,
    cpu: Duration,
    waited: Option<Duration>,
}

/// The figures of a point that posted (and retired) `posted` WRITEs of `size` bytes.
fn point_of<M>(
    size: u64,
    policy: Policy,
    posted: u64,
    elapsed: &Elapsed,
    stats: &Stats,
    tally: &Tally<M>,
    nic: &NicTimes<M>,
) -> Point {
    let Elapsed {
        seconds,
        cpu,
        waited,
    } = *elapsed;
    let bytes = posted as f64 * size as f64;
    Point {
        size,
        policy: policy.to_string(),
        interval: match policy {
            Policy::Every(n) => Some(n),
            _ => None,
        },
        wrs: posted,
        seconds,
        wr_per_sec: posted as f64 / seconds,
        gbit_per_sec: gbit(bytes, seconds),
        mib_per_sec: bytes / seconds / MIB,
        mpps: posted as f64 / seconds / 1e6,
        cqes: stats.cqes,
        cqes_per_1000: stats.cqes as f64 * 1000.0 / posted as f64,
        forced: stats.forced,
        markers: stats.markers,
        wrs_per_cqe: stats.mean_wrs_per_cqe(),
        cpu_ns_per_wr: cpu.as_nanos() as f64 / posted as f64,
        cpu_share: cpu.as_secs_f64() / seconds,
        wait_share: waited
            .filter(|_| seconds >= WAIT_SHARE_MIN_TIME.as_secs_f64())
            .map(|w| w.as_secs_f64() / seconds),
        lag: Percentiles::of(&tally.lag),
        nic_to_app: Percentiles::of(&nic.gap),
        post_to_nic: Percentiles::of(&nic.to_nic),
        round_trip_ns: None,
        wrs_per_qp: Vec::new(),
    }
}

/// `work`, WRITE `index` (from 0) of a run that ends before WRITE `last`: signaled if it is
/// the last one, as perftest signals the last WRITE of a counted run.
#[inline(always)]
fn signal_last<'a, M: MemoryRegion>(
    work: Work<'a, M, ()>,
    index: u64,
    last: u64,
) -> Work<'a, M, ()> {
    if index + 1 == last {
        work.signal(selsig::Signal::Force)
    } else {
        work
    }
}

/// Ends a point; a server checks the slots `written` (1-based) hold their WRITE's pattern
/// and the others are untouched.
fn finish<D: Device>(peer: Peer<D>, written: Option<Vec<u32>>) -> Result<()> {
    let Peer::Remote(remote) = peer else {
        return Ok(());
    };
    let address = remote.address.clone();
    match written {
        Some(slots) => {
            let bad = remote
                .check(slots)
                .context("cannot get the server's check of its memory")?;
            ensure!(
                bad.is_empty(),
                "selsig serve at {address} found {} WRITEs whose bytes are not what was sent (slots {:?}{})",
                bad.len(),
                &bad[..bad.len().min(10)],
                if bad.len() > 10 { ", ..." } else { "" }
            );
            Ok(())
        }
        None => remote
            .finish_unchecked()
            .context("cannot end the session with the server"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A point fails after 30 s without a retired WRITE, or after as long as 4 MiB/s takes
    /// for the bytes one completion covers: one every interval, or every queue.
    #[test]
    fn the_stall_limit_grows_with_the_bytes_a_completion_covers() {
        let secs = |p, cap, size| stall_limit(p, cap, size).as_secs_f64();
        assert_eq!(secs(Policy::Every(1), 128, 64), 30.0);
        assert_eq!(secs(Policy::Every(1024), 1024, 64 << 10), 30.0);
        // 1024 WRITEs of 4 MiB: 4 GiB, 1024 s at 4 MiB/s (ib_write_bw --cq-mod 1024 -s 4M).
        assert_eq!(secs(Policy::Every(1024), 1024, 4 << 20), 1024.0);
        // The queue forces a signal once per queue: 128 WRITEs of 4 MiB, whatever the policy.
        assert_eq!(secs(Policy::Never, 128, 4 << 20), 128.0);
        assert_eq!(secs(Policy::Every(4096), 128, 4 << 20), 128.0);
        let adaptive = Policy::Adaptive {
            max_unsignaled: 64,
            max_lag: Duration::from_micros(20),
        };
        assert_eq!(secs(adaptive, 128, 4 << 20), 64.0);
        assert_eq!(secs(Policy::Always, 128, 1 << 30), 256.0);
    }
}
