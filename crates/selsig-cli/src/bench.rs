//! `selsig bench`: both sides of the trade-off selective signaling makes. Signaling less
//! often saves completions (the NIC's writes, the CPU's polling); the application learns
//! of completions later. For each signal interval and message size this streams RDMA
//! WRITEs on one RC queue pair through `SignaledQueue` and measures throughput,
//! completions per 1000 WRITEs, CPU time per WRITE, and the confirmation lag; on the soft
//! provider also how long after the NIC finished a WRITE the application learned of it.
//!
//! With `--cq-mod` it measures what perftest's `ib_write_bw --cq-mod N -s SIZE -n ITERS
//! -t DEPTH` measures: one WRITE per post, every N-th signaled and the last, at most DEPTH
//! outstanding, completions polled 16 at a time, bandwidth over the time from the first
//! post to the last completion, in perftest's units.

use std::collections::{HashMap, VecDeque};
use std::io::IsTerminal as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use clap::Args;
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use selsig::{
    Access, Buffer, ConnectOptions, Device, MemoryRegion, Opcode, Outcome, Policy, QpCaps, QpInit,
    QueueConfig, QueuePair, SignaledQueue, Work,
};
use serde::{Deserialize, Serialize};

use crate::common::{DeviceInfo, OnDevice, ProviderArgs, parse_size, pattern, with_device};
use crate::remote::Peer;

/// WRITEs per post in a sweep (one doorbell each), unless `--post-list` says otherwise.
pub const SWEEP_POST_LIST: u32 = 16;
/// perftest's default iterations (`-n`).
pub const PERFTEST_ITERS: u64 = 5000;
/// The iterations, send queue depths and CQ moderations ib_write_bw takes.
const PERFTEST_ITERS_RANGE: (u64, u64) = (5, 100_000_000);
const PERFTEST_TX_DEPTH: (u64, u64) = (1, 15_000);
const PERFTEST_CQ_MOD: (u64, u64) = (1, 1024);
/// perftest's default send queue depth (`-t`).
pub const DEFAULT_TX_DEPTH: u32 = 128;
/// Completions polled at once in perftest mode (perftest's `CTX_POLL_BATCH`).
const PERFTEST_POLL_BATCH: usize = 16;
/// Time per point of a sweep when neither `-n` nor `-D` is given.
const DEFAULT_DURATION: Duration = Duration::from_millis(500);
/// Time the memcpy reference copies, per size.
const MEMCPY_TIME: Duration = Duration::from_millis(200);
/// The thread-to-thread yardstick ([`round_trip_ns`]) times at most this many round trips
const ROUND_TRIPS: u64 = 20_000;
/// ... and for at most about this long.
const ROUND_TRIP_TIME: Duration = Duration::from_millis(20);
/// The pause before [`round_trip_ns`] measures: the soft NIC's thread spins for a while
/// after its last work before it sleeps, and would take a CPU from the two threads.
const ROUND_TRIP_IDLE: Duration = Duration::from_millis(5);
/// Round trips that vary over a run by more than this factor are flagged.
const ROUND_TRIP_WARN: f64 = 2.0;
/// The unmeasured run before the first point.
const WARM_UP: Duration = Duration::from_millis(100);
/// Below this CPU share of the posting thread a point's figures are flagged
/// ([`Point::cpu_share`]).
const CPU_SHARE_WARN: f64 = 0.9;
/// Above this share of a point's wall time spent by the bench's threads waiting for a CPU,
/// its figures are flagged ([`Point::wait_share`]).
const WAIT_SHARE_WARN: f64 = 0.1;
/// Points shorter than this have no [`Point::wait_share`]: the kernel adds a wait up when
/// it ends, so one begun before the point counts in it whole, and a few milliseconds of
/// that (a time slice or two) would swamp the figure of a short point.
const WAIT_SHARE_MIN_TIME: Duration = Duration::from_millis(100);
/// A point that makes no progress for this long has failed, or for longer where one
/// completion covers more bytes than a slow device moves in that time ([`stall_limit`]).
const STALL: Duration = Duration::from_secs(30);
/// The slowest rate [`stall_limit`] allows a healthy device: Soft-RoCE under emulation
/// moves large WRITEs at 60 to 90 MB/s and small ones at 3 MB/s (where a completion
/// covers few bytes).
const STALL_RATE: f64 = 4.0 * (1u64 << 20) as f64;
/// The largest WRITE: InfiniBand's largest message (perftest's own limit is one byte less).
const MAX_SIZE: u64 = selsig::MAX_MESSAGE_LEN;
/// A timed run reads the clock after every 64 post calls, or sooner once this many bytes
/// were posted since it last did (a post call of large WRITEs takes long).
const CLOCK_BYTES: u64 = 1 << 20;
/// The most memory `--region` registers on each side (the soft provider also copies as much
/// for its memcpy yardstick).
pub const MAX_REGION: u64 = 4 << 30;
/// `--region`'s default.
const DEFAULT_REGION: u64 = 256 << 20;
/// The host's memory as perftest sees it: the page (its cycle buffer, which addresses step
/// through) and the L1 data cache line (its smallest address step).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    pub page: u64,
    pub line: u64,
}

impl Geometry {
    /// What perftest reads: `sysconf(_SC_PAGESIZE)` (4096 if it has none), and
    /// `sysconf(_SC_LEVEL1_DCACHE_LINESIZE)`, else sysfs's `coherency_line_size` of cpu0,
    /// else 64.
    fn host() -> Self {
        // SAFETY: `sysconf` takes any name, reads no memory of ours, and answers -1 for
        // names it does not know.
        let (page, line) = unsafe {
            (
                libc::sysconf(libc::_SC_PAGESIZE),
                libc::sysconf(libc::_SC_LEVEL1_DCACHE_LINESIZE),
            )
        };
        let line = match line {
            0 => std::fs::read_to_string(
                "/sys/devices/system/cpu/cpu0/cache/index0/coherency_line_size",
            )
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0),
            n => n,
        };
        let positive =
            |n: libc::c_long, or: u64| u64::try_from(n).ok().filter(|&n| n > 0).unwrap_or(or);
        Geometry {
            page: positive(page, 4096),
            line: positive(line, 64),
        }
    }
}
/// perftest's MB: 2^20 bytes.
const MIB: f64 = 1_048_576.0;

/// Measure throughput, completions, CPU time and confirmation lag against the signal
/// interval and message size (RDMA WRITE streams on one RC queue pair).
#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// Signal intervals to sweep, comma-separated, and `adaptive` for the adaptive policy
    /// (default: the powers of two 1, 2, 4, ... up to the send queue depth, or the number
    /// of buffers if --region holds fewer, that limit itself if it is not a power of two,
    /// and adaptive).
    #[arg(
        allow_negative_numbers = true,
        long,
        short = 'e',
        value_delimiter = ',',
        value_name = "LIST"
    )]
    pub every: Vec<IntervalArg>,
    /// perftest-compatible mode: one interval (perftest's --cq-mod), one size, one WRITE
    /// per post, `-n` iterations (default 5000) with the last one signaled.
    #[arg(
        allow_negative_numbers = true,
        long,
        short = 'Q',
        conflicts_with = "every",
        value_name = "N"
    )]
    pub cq_mod: Option<u32>,
    /// Message sizes, comma-separated (default 64,4K,64K).
    #[arg(allow_hyphen_values = true, long = "size", short = 's', value_delimiter = ',', value_parser = parse_size, value_name = "LIST")]
    pub sizes: Vec<u64>,
    /// WRITEs per point (perftest's -n).
    #[arg(
        allow_negative_numbers = true,
        long,
        short = 'n',
        value_name = "N",
        conflicts_with = "duration"
    )]
    pub iters: Option<u64>,
    /// Time per point: 500ms, 2s, or seconds as a number; default 500ms (not with --cq-mod,
    /// which counts -n iterations).
    #[arg(allow_hyphen_values = true, long, short = 'D', value_parser = parse_duration, value_name = "TIME")]
    pub duration: Option<Duration>,
    /// Send queue depth: at most this many WRITEs outstanding (perftest's -t).
    #[arg(allow_negative_numbers = true, long = "tx-depth", short = 't', default_value_t = DEFAULT_TX_DEPTH, value_name = "N")]
    pub tx_depth: u32,
    /// WRITEs posted per doorbell (perftest's -l; default 16 in a sweep; --cq-mod posts one
    /// per call, as ib_write_bw without -l).
    #[arg(
        allow_negative_numbers = true,
        long = "post-list",
        short = 'l',
        value_name = "N"
    )]
    pub post_list: Option<u32>,
    /// Send the data inline in the work request (no local buffer; sizes up to the
    /// device's inline limit).
    #[arg(long)]
    pub inline: bool,
    /// The adaptive policy of the `adaptive` point (default adaptive:DEPTH/2,20us, with
    /// DEPTH the most WRITEs outstanding: --tx-depth, or fewer buffers).
    #[arg(long, value_name = "POLICY")]
    pub adaptive: Option<Policy>,
    /// The most memory registered on each side (default 256M); a WRITE larger is
    /// refused, and fewer buffers than the queue depth are used when they do not all fit.
    /// Not with --cq-mod, which uses the memory ib_write_bw does: max(SIZE, the page size).
    #[arg(
        allow_hyphen_values = true,
        long,
        value_parser = parse_size,
        value_name = "BYTES"
    )]
    pub region: Option<u64>,
    /// Do not record when the soft NIC finished each WRITE (it costs the NIC a clock
    /// reading per completion and per 16 KiB moved, and the application a lookup and two
    /// histogram records per WRITE).
    #[arg(long)]
    pub no_nic_times: bool,
    /// Write every figure and the settings as JSON to FILE, or to stdout with `-`
    /// (the table is then not printed).
    #[arg(long, value_name = "FILE")]
    pub json: Option<std::path::PathBuf>,
    /// Draw throughput and confirmation lag (and, on the soft provider, the
    /// NIC-to-application gap) against the signal interval into an SVG file, or to stdout
    /// with `-` (the table is then not printed).
    #[arg(long, value_name = "FILE")]
    pub svg: Option<std::path::PathBuf>,
    /// Write into the memory of `selsig serve` on HOST or HOST:PORT (an IPv6 address bare,
    /// or in brackets before a port: [fe80::1%eth0]:18515; another process or host; verbs
    /// provider) instead of a peer QP in this process, as ib_write_bw's client writes to its
    /// server. The server checks the bytes of a sweep's WRITEs.
    #[arg(long, value_name = "HOST", value_parser = crate::common::parse_host)]
    pub connect: Option<String>,
    /// Run nothing: read a report that --json wrote (FILE, or standard input with `-`)
    /// and print its table, or write it with --json and draw it with --svg, as after that
    /// run (a past run's chart, drawn again).
    #[arg(
        long,
        value_name = "FILE",
        conflicts_with_all = [
            "every", "cq_mod", "sizes", "iters", "duration", "tx_depth", "post_list",
            "inline", "adaptive", "region", "no_nic_times", "connect", "provider", "device",
            "personality", "gid_index",
        ]
    )]
    pub from_json: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub provider: ProviderArgs,
}

/// One entry of `--every`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IntervalArg {
    Every(u32),
    Adaptive,
}

impl std::str::FromStr for IntervalArg {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let s = s.trim();
        if s == "adaptive" {
            return Ok(IntervalArg::Adaptive);
        }
        match s.parse::<u32>() {
            Ok(n) => Ok(IntervalArg::Every(n)),
            Err(e) => Err(format!(
                "invalid signal interval {s:?}: {e} (expected a number or `adaptive`)"
            )),
        }
    }
}

fn parse_duration(text: &str) -> std::result::Result<Duration, String> {
    let text = text.trim();
    if let Ok(secs) = text.parse::<f64>() {
        let d = Duration::try_from_secs_f64(secs)
            .map_err(|e| format!("invalid duration {text:?}: {e}"))?;
        if d.is_zero() && secs != 0.0 {
            return Err(format!(
                "invalid duration {text:?}: shorter than a nanosecond"
            ));
        }
        return Ok(d);
    }
    humantime::parse_duration(text)
        .map_err(|e| format!("invalid duration {text:?}: {e} (examples: 500ms, 2s, 1.5)"))
}

/// When a point ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// After this many WRITEs; the last is signaled.
    Iters(u64),
    /// Posting stops after this long; the tail is confirmed with a marker.
    Duration(Duration),
}

/// The checked settings.
#[derive(Debug, Clone)]
pub struct Plan {
    pub policies: Vec<Policy>,
    pub sizes: Vec<u64>,
    pub stop: Stop,
    pub tx_depth: u32,
    /// The size of the CQ the send queue completes to.
    pub cq_entries: u32,
    pub post_list: u32,
    pub inline: bool,
    pub region: u64,
    /// The page and cache line perftest mode's addresses step by.
    pub geometry: Geometry,
    pub nic_times: bool,
    /// perftest-compatible mode.
    pub perftest: bool,
    /// `selsig serve`'s `HOST[:PORT]`, with `--connect`.
    pub connect: Option<String>,
}

/// Checks the options (errors here are the user's input) and plans the sweep.
pub fn plan(args: &BenchArgs) -> Result<Plan> {
    let depth = args.tx_depth;
    ensure!(depth >= 1, "--tx-depth must be at least 1");
    let cq_entries = crate::common::cq_entries(depth)?;
    let perftest = args.cq_mod.is_some();
    let geometry = Geometry::host();
    if perftest {
        // What ib_write_bw does with these, selsig's perftest mode does not reproduce.
        ensure!(
            args.duration.is_none(),
            "--cq-mod with -D: perftest mode measures -n iterations as ib_write_bw does (its -D \
             counts only the completions of a sample taken after a warm-up margin, which \
             selsig does not reproduce); use -n, or -D without --cq-mod"
        );
        // ib_write_bw's own bounds: it runs nothing outside them, so there is nothing to
        // compare with (perftest_parameters.h: MIN_ITER, MAX_ITER, MIN_TX, MAX_TX,
        // MIN_CQ_MOD, MAX_CQ_MOD).
        let within = |given: String, value: u64, (low, high): (u64, u64)| {
            ensure!(
                (low..=high).contains(&value),
                "{given}: ib_write_bw takes {low} to {high}, and so does perftest mode (a sweep, \
                 -e, is not bound by perftest's limits)"
            );
            Ok(())
        };
        if let Some(n) = args.cq_mod {
            within(format!("--cq-mod {n}"), n.into(), PERFTEST_CQ_MOD)?;
        }
        within(
            format!("--tx-depth {depth} with --cq-mod"),
            depth.into(),
            PERFTEST_TX_DEPTH,
        )?;
        if let Some(n) = args.iters {
            within(format!("-n {n} with --cq-mod"), n, PERFTEST_ITERS_RANGE)?;
        }
        if let Some(l) = args.post_list.filter(|&l| l != 1) {
            bail!(
                "--cq-mod with --post-list {l}: perftest mode posts one WRITE per call, as \
                 ib_write_bw without -l (whose post lists chain fixed WRITEs, their addresses \
                 repeating every list); use a sweep (-e) for post lists"
            );
        }
    }
    if let Some(host) = &args.connect {
        ensure!(
            args.provider.provider == crate::common::ProviderKind::Verbs,
            "--connect {host}: needs --provider verbs (the soft NIC connects queue pairs of one process only)"
        );
    }
    let sizes = if args.sizes.is_empty() {
        if perftest {
            vec![65536]
        } else {
            vec![64, 4096, 65536]
        }
    } else {
        // Each size once, in the order given (4K and 4096 are one size).
        let mut v: Vec<u64> = Vec::new();
        for &size in &args.sizes {
            if !v.contains(&size) {
                v.push(size);
            }
        }
        v
    };
    if perftest {
        ensure!(
            sizes.len() == 1,
            "--cq-mod measures one size as perftest does; -s names {}",
            sizes.len()
        );
    }
    // Before the region: perftest mode makes its region of the size.
    for &size in &sizes {
        ensure!(
            size >= 1,
            "--size 0: a WRITE of no bytes moves nothing to measure"
        );
        ensure!(
            size <= MAX_SIZE,
            "--size {size} is more than one WRITE carries (2 GiB, InfiniBand's largest message)"
        );
        ensure!(
            !perftest || size < MAX_SIZE,
            "--size {size} with --cq-mod: ib_write_bw takes 1 to {} bytes",
            MAX_SIZE - 1
        );
    }
    let region = match (args.region, perftest) {
        (Some(region), true) => bail!(
            "--region {region} with --cq-mod: perftest mode uses the memory ib_write_bw does, max(SIZE, {}) bytes (the page size) on each side",
            geometry.page
        ),
        (Some(region), false) => region,
        (None, true) => sizes[0].max(geometry.page),
        (None, false) => DEFAULT_REGION,
    };
    ensure!(
        region <= MAX_REGION,
        "--region {region}: the bench registers at most {MAX_REGION} bytes on each side"
    );
    for &size in &sizes {
        ensure!(
            size <= region,
            "--size {size} is larger than the registered region (--region {region})"
        );
    }
    // The most WRITEs outstanding at once, per size: in a sweep each owns a buffer, and
    // fewer buffers than the queue depth fit when the region is small. No signal interval
    // may exceed it: every buffer would wait for a completion that nothing asks for.
    let outstanding = sizes
        .iter()
        .map(|&size| (outstanding(args, perftest, region, size), size))
        .min()
        .unwrap_or((depth, 0));
    let limit = outstanding.0;
    let adaptive = match args.adaptive {
        Some(p @ Policy::Adaptive { .. }) => p,
        Some(other) => bail!("--adaptive {other} is not an adaptive policy (adaptive:N,LAG)"),
        None => Policy::Adaptive {
            max_unsignaled: (limit / 2).max(1),
            max_lag: Duration::from_micros(20),
        },
    };
    let adaptive_point =
        !perftest && (args.every.is_empty() || args.every.contains(&IntervalArg::Adaptive));
    if let Some(given) = args.adaptive {
        ensure!(
            adaptive_point,
            "--adaptive {given}: no `adaptive` point to apply it to (add `adaptive` to --every; --cq-mod has none)"
        );
    }
    if let Policy::Adaptive { max_unsignaled, .. } = adaptive {
        // As an interval of `every:N`: at most the queue depth, and at most the buffers.
        check_interval(
            &format!("--adaptive {adaptive}:"),
            max_unsignaled,
            depth,
            outstanding,
        )?;
    }
    adaptive
        .validate()
        .map_err(|e| anyhow::anyhow!("--adaptive {adaptive}: {e}"))?;
    let policies = if let Some(n) = args.cq_mod {
        vec![Policy::Every(check_interval(
            "--cq-mod",
            n,
            depth,
            outstanding,
        )?)]
    } else if args.every.is_empty() {
        let mut v: Vec<Policy> = std::iter::successors(Some(1u32), |n| n.checked_mul(2))
            .take_while(|&n| n <= limit)
            .map(Policy::Every)
            .collect();
        if !limit.is_power_of_two() {
            v.push(Policy::Every(limit));
        }
        v.push(adaptive);
        v
    } else {
        let mut v = Vec::new();
        for e in &args.every {
            let p = match *e {
                IntervalArg::Every(n) => {
                    Policy::Every(check_interval("--every", n, depth, outstanding)?)
                }
                IntervalArg::Adaptive => adaptive,
            };
            if !v.contains(&p) {
                v.push(p);
            }
        }
        v
    };
    let stop = match (args.iters, args.duration) {
        (Some(0), _) => bail!("-n 0: zero iterations measure nothing"),
        (Some(n), _) => Stop::Iters(n),
        (None, Some(d)) if d.is_zero() => bail!("-D 0: a duration of zero measures nothing"),
        (None, Some(d)) if d > crate::remote::MAX_RUN => bail!(
            "-D {d:?}: at most a day ({:?}) per point",
            crate::remote::MAX_RUN
        ),
        (None, Some(d)) => Stop::Duration(d),
        (None, None) if perftest => Stop::Iters(PERFTEST_ITERS),
        (None, None) => Stop::Duration(DEFAULT_DURATION),
    };
    // The default fits any queue: 16 (1 with --cq-mod), or the depth if smaller.
    let post_list = args.post_list.unwrap_or(if perftest {
        1
    } else {
        SWEEP_POST_LIST.min(depth)
    });
    ensure!(post_list >= 1, "--post-list must be at least 1");
    ensure!(
        post_list <= depth,
        "--post-list {post_list} is more than --tx-depth {depth}, the most WRITEs outstanding"
    );
    Ok(Plan {
        policies,
        sizes,
        stop,
        tx_depth: depth,
        cq_entries,
        post_list,
        inline: args.inline,
        region,
        geometry,
        // perftest mode reads no clock in its loop, as perftest.
        nic_times: !args.no_nic_times && !perftest,
        perftest,
        connect: args.connect.clone(),
    })
}

/// `(outstanding, size)`: the fewest WRITEs the sweep keeps outstanding, and the size
/// that has that few.
fn check_interval(option: &str, n: u32, depth: u32, outstanding: (u32, u64)) -> Result<u32> {
    ensure!(n >= 1, "{option} 0: the signal interval must be at least 1");
    ensure!(
        n <= depth,
        "{option} {n} is more than --tx-depth {depth}, the most WRITEs outstanding at once: that many unsignaled WRITEs in a row cannot all be outstanding"
    );
    let (most, size) = outstanding;
    ensure!(
        n <= most,
        "{option} {n} with --size {size}: only {most} WRITEs can be outstanding, one per buffer that fits in --region; that many unsignaled WRITEs in a row would leave no buffer free and none signaled (raise --region or lower the interval)"
    );
    Ok(n)
}

/// The most WRITEs of `size` bytes outstanding at once: the queue depth, or in a sweep
/// with buffers the number of buffers that fit in the region, if fewer.
fn outstanding(args: &BenchArgs, perftest: bool, region: u64, size: u64) -> u32 {
    let depth = args.tx_depth;
    if perftest || args.inline {
        depth
    } else {
        buffers(region, depth, size)
    }
}

/// One buffer per send-queue slot, as many as fit in `region`.
fn buffers(region: u64, depth: u32, size: u64) -> u32 {
    (region / size.max(1)).min(u64::from(depth)) as u32
}

/// Percentiles of a histogram of nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Percentiles {
    pub count: u64,
    pub p50_ns: u64,
    pub p99_ns: u64,
    pub max_ns: u64,
    pub mean_ns: f64,
}

impl Percentiles {
    fn of(h: &Histogram<u64>) -> Option<Self> {
        (!h.is_empty()).then(|| Percentiles {
            count: h.len(),
            p50_ns: h.value_at_quantile(0.5),
            p99_ns: h.value_at_quantile(0.99),
            max_ns: h.max(),
            mean_ns: h.mean(),
        })
    }
}

/// One measured point.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Point {
    pub size: u64,
    /// The policy, e.g. `every:64` or `adaptive:64,20us`.
    pub policy: String,
    /// The interval of an `every:N` policy; null for adaptive.
    pub interval: Option<u32>,
    pub wrs: u64,
    pub seconds: f64,
    pub wr_per_sec: f64,
    /// Gigabits (10^9) per second of payload.
    pub gbit_per_sec: f64,
    /// perftest's `BW average[MB/sec]` (MB = 2^20 bytes).
    pub mib_per_sec: f64,
    /// perftest's `MsgRate[Mpps]`.
    pub mpps: f64,
    /// Completions polled (signaled WRITEs, and the markers).
    pub cqes: u64,
    pub cqes_per_1000: f64,
    /// WRITEs signaled against the policy (to keep the queue from deadlocking).
    pub forced: u64,
    /// Signaled zero-length WRITEs posted besides the stream, each with its completion
    /// among `cqes`: they confirm a tail with nothing posted behind it (a timed run's
    /// last; an adaptive point's when its lag bound comes due between posts).
    pub markers: u64,
    /// Mean WRITEs retired per completion.
    pub wrs_per_cqe: f64,
    /// CPU time of the posting thread (posting and polling) per WRITE.
    pub cpu_ns_per_wr: f64,
    /// The posting thread's CPU time over the point's wall time. The thread never sleeps
    /// (it busy-polls), so this is about 1 on a quiet machine; well below it, other threads
    /// had its core part of the time, and the point measured that competition too.
    pub cpu_share: f64,
    /// The time the bench's threads (the posting thread and, on the soft provider, the
    /// NIC's thread) spent ready to run but waiting for a CPU, added up, over the point's
    /// wall time (Linux's scheduler statistics, `/proc/self/task/*/schedstat`; null where
    /// the kernel keeps none). About 0 when each has a core of its own; well above it,
    /// they shared a core (the NIC thread then waits for the posting thread, which never
    /// yields, to use up its time slice) or other work took one, and the point measured
    /// that wait too. Also null for a point shorter than 100 ms: the kernel adds a wait up
    /// when it ends, so a wait begun before the point would count in it whole.
    pub wait_share: Option<f64>,
    /// Time from a WRITE's post to the application learning of its completion: from just
    /// before the post call to just after the poll that retired it (what the queue's
    /// `Stats::lag_ns` measures, taken from the caller's side). Null in perftest mode,
    /// which reads no clock while it runs.
    pub lag: Option<Percentiles>,
    /// Time from the NIC finishing a WRITE to the application learning of it (soft
    /// provider); null where not recorded (other providers, `--no-nic-times`, perftest
    /// mode).
    pub nic_to_app: Option<Percentiles>,
    /// Time from a WRITE's post to the NIC finishing it (soft provider); null where
    /// [`nic_to_app`](Self::nic_to_app) is.
    pub post_to_nic: Option<Percentiles>,
    /// The soft provider's second yardstick, just before and just after the point: the
    /// round trip of a cache line between two threads of the bench, in nanoseconds
    /// ([`round_trip_ns`]). A completion crosses from the NIC's core to the application's,
    /// and the slot it frees goes back, so the points that signal often go at this speed; a
    /// virtual machine's host can move its CPUs meanwhile and change it several-fold. Null
    /// on other providers and in perftest mode.
    pub round_trip_ns: Option<[f64; 2]>,
}

/// Everything `--json` writes (and `--from-json` reads).
#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub provider: String,
    pub device: String,
    pub personality: Option<String>,
    pub settings: Settings,
    pub points: Vec<Point>,
    /// The soft provider's yardstick: one core copying the same buffers with `memcpy`
    /// (the soft NIC moves every byte on a CPU core).
    pub memcpy: Vec<MemcpyRef>,
}

/// `memcpy` throughput for one message size.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemcpyRef {
    pub size: u64,
    pub gbit_per_sec: f64,
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub struct Settings {
    pub opcode: String,
    pub tx_depth: u32,
    /// The send queue capacity the device gave.
    pub sq_capacity: u32,
    pub post_list: u32,
    pub inline: bool,
    /// WRITEs per point, or null for a timed run.
    pub iters: Option<u64>,
    /// Seconds of posting per point, or null for a counted run.
    pub duration_s: Option<f64>,
    pub perftest_mode: bool,
    /// Whether the NIC's time of each WRITE was recorded (the soft provider, unless
    /// `--no-nic-times` or perftest mode).
    pub nic_times: bool,
    /// The number of buffers (each WRITE owns one until it is confirmed).
    pub buffers_per_size: Vec<(u64, u32)>,
    /// `selsig serve`'s address with `--connect`; null for a peer QP in this process.
    pub remote: Option<String>,
    /// The most memory registered on each side (`--region`), in bytes.
    pub region: u64,
    /// The GID index in use (verbs on RoCE or with global routing); null otherwise.
    pub gid_index: Option<u8>,
}

/// The largest report `--from-json` reads: a sweep's report is a kilobyte a point.
const MAX_REPORT: u64 = 64 << 20;

/// Reads a report that `--json` wrote (`-`: standard input) for `--from-json`, and checks
/// that its figures can be shown: the error names the file and what is wrong.
pub fn load_report(path: &std::path::Path) -> Result<Report> {
    use std::io::Read as _;
    let stdin = path == std::path::Path::new("-");
    let file = if stdin {
        "<stdin>".to_string()
    } else {
        path.display().to_string()
    };
    // One byte past the limit is read: a larger file (or a device that never ends) is
    // refused, not read until memory runs out.
    let mut text = String::new();
    let read = if stdin {
        std::io::stdin()
            .lock()
            .take(MAX_REPORT + 1)
            .read_to_string(&mut text)
    } else {
        std::fs::File::open(path).and_then(|f| f.take(MAX_REPORT + 1).read_to_string(&mut text))
    };
    read.with_context(|| format!("--from-json {file}: cannot read the report"))?;
    ensure!(
        text.len() as u64 <= MAX_REPORT,
        "--from-json {file}: larger than {} MiB: not a report of `selsig bench --json`",
        MAX_REPORT >> 20
    );
    let report: Report = serde_json::from_str(&text).map_err(|e| {
        anyhow::anyhow!("--from-json {file}: not a report of `selsig bench --json`: {e}")
    })?;
    report
        .check()
        .map_err(|why| anyhow::anyhow!("--from-json {file}: {why}"))?;
    Ok(report)
}

impl Report {
    /// What a report read back must hold for its table and chart: points, and figures
    /// that are finite and not negative (a hand-edited report may hold anything).
    fn check(&self) -> std::result::Result<(), String> {
        if self.points.is_empty() {
            return Err("the report has no points".into());
        }
        let check = |what: String, v: f64| {
            if v.is_finite() && v >= 0.0 {
                Ok(())
            } else {
                Err(format!(
                    "{what} is {v}: a run's figures are finite and not negative"
                ))
            }
        };
        if let Some(d) = self.settings.duration_s {
            check("settings.duration_s".into(), d)?;
        }
        for (i, m) in self.memcpy.iter().enumerate() {
            check(format!("memcpy[{i}].gbit_per_sec"), m.gbit_per_sec)?;
        }
        for (i, p) in self.points.iter().enumerate() {
            let at = |field: &str| format!("points[{i}].{field} ({}, {})", p.size, p.policy);
            for (field, v) in [
                ("seconds", p.seconds),
                ("wr_per_sec", p.wr_per_sec),
                ("gbit_per_sec", p.gbit_per_sec),
                ("mib_per_sec", p.mib_per_sec),
                ("mpps", p.mpps),
                ("cqes_per_1000", p.cqes_per_1000),
                ("wrs_per_cqe", p.wrs_per_cqe),
                ("cpu_ns_per_wr", p.cpu_ns_per_wr),
                ("cpu_share", p.cpu_share),
            ] {
                check(at(field), v)?;
            }
            if let Some(w) = p.wait_share {
                check(at("wait_share"), w)?;
            }
            for (field, pc) in [
                ("lag", &p.lag),
                ("nic_to_app", &p.nic_to_app),
                ("post_to_nic", &p.post_to_nic),
            ] {
                if let Some(pc) = pc {
                    check(at(&format!("{field}.mean_ns")), pc.mean_ns)?;
                }
            }
            for (k, &rt) in p.round_trip_ns.iter().flatten().enumerate() {
                check(at(&format!("round_trip_ns[{k}]")), rt)?;
            }
        }
        Ok(())
    }
}

/// Runs the sweep (call [`plan`] first), with a progress bar on stderr when it is a terminal.
pub fn bench(args: &BenchArgs, plan: &Plan) -> Result<Report> {
    with_device(&args.provider, plan)
}

impl Plan {
    /// Whether every WRITE owns a buffer of the pattern of its slot (not perftest mode,
    /// not inline data).
    fn sweep_with_buffers(&self) -> bool {
        !self.perftest && !self.inline
    }
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
            region: plan.region,
            gid_index: info.gid_index,
        },
        points,
    })
}

/// Gigabits per second one core copies `size`-byte messages between two arrays of
/// `buffers` slots, slot after slot (the soft NIC's work, without the NIC).
fn memcpy_gbit(size: usize, buffers: usize) -> f64 {
    let buffers = buffers.max(1);
    let src = pattern(1, size * buffers);
    let mut dst = vec![0u8; size * buffers];
    let mut copied = 0u64;
    let start = Instant::now();
    while start.elapsed() < MEMCPY_TIME {
        for i in 0..buffers {
            let at = i * size;
            dst[at..at + size].copy_from_slice(std::hint::black_box(&src[at..at + size]));
        }
        std::hint::black_box(&mut dst);
        copied += (size * buffers) as u64;
    }
    gbit(copied as f64, start.elapsed().as_secs_f64())
}

/// A value on a cache line of its own.
#[repr(align(128))]
struct Line(AtomicU64);

/// Nanoseconds a round trip of a cache line between this thread and another takes: this
/// thread stores a number, the other, spinning, stores it back on another line, and this
/// one waits for it ([`ROUND_TRIPS`] times, or for about [`ROUND_TRIP_TIME`], the first
/// trip untimed). That is the soft NIC's cost of a completion (or a doorbell) crossing
/// from one core to another, which the host's placement of the two CPUs sets. With one
/// CPU for both threads each trip waits for the scheduler, and the figure says so. It
/// first waits [`ROUND_TRIP_IDLE`], for the soft NIC's thread to go to sleep. `None` if the
/// other thread cannot be started.
fn round_trip_ns() -> Option<f64> {
    const STOP: u64 = u64::MAX;
    std::thread::sleep(ROUND_TRIP_IDLE);
    let (ping, pong) = (Line(AtomicU64::new(0)), Line(AtomicU64::new(0)));
    std::thread::scope(|scope| {
        let answer = std::thread::Builder::new().spawn_scoped(scope, || {
            let mut seen = 0;
            loop {
                let n = ping.0.load(Ordering::Acquire);
                if n == STOP {
                    return;
                }
                if n != seen {
                    seen = n;
                    pong.0.store(n, Ordering::Release);
                }
                std::hint::spin_loop();
            }
        });
        answer.ok()?;
        let trip = |n: u64| {
            ping.0.store(n, Ordering::Release);
            while pong.0.load(Ordering::Acquire) != n {
                std::hint::spin_loop();
            }
        };
        // Until the other thread runs.
        trip(1);
        let start = Instant::now();
        let mut trips = 0;
        while trips < ROUND_TRIPS && (trips % 16 != 0 || start.elapsed() < ROUND_TRIP_TIME) {
            trips += 1;
            trip(trips + 1);
        }
        let ns = start.elapsed().as_nanos() as f64 / trips as f64;
        ping.0.store(STOP, Ordering::Release);
        Some(ns)
    })
}

/// Gigabits (10^9 bits) per second of `bytes` moved in `seconds`.
fn gbit(bytes: f64, seconds: f64) -> f64 {
    bytes * 8.0 / seconds / 1e9
}

fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, selsig::MAX_LAG_NS, 3).expect("valid bounds")
}

/// The time each thread of this process (by thread id) has spent ready to run but waiting
/// for a CPU, in nanoseconds (the second field of `/proc/self/task/TID/schedstat`); `None`
/// where the kernel reports none: no such files, or files of zeros (a kernel that keeps
/// no scheduler statistics writes `0 0 0`, where the first field, the time on a CPU,
/// cannot be 0 for the thread reading it).
fn run_waits() -> Option<HashMap<u32, u64>> {
    let threads = std::fs::read_dir("/proc/self/task").ok()?.flatten();
    waits_of(threads.filter_map(|entry| {
        let tid = entry.file_name().to_str()?.parse().ok()?;
        // A thread that ended meanwhile has no file any more: it is left out.
        let text = std::fs::read_to_string(entry.path().join("schedstat")).ok()?;
        Some((tid, text))
    }))
}

/// [`run_waits`] of the threads' `schedstat` texts.
fn waits_of(threads: impl Iterator<Item = (u32, String)>) -> Option<HashMap<u32, u64>> {
    let mut waits = HashMap::new();
    let mut ran = false;
    for (tid, text) in threads {
        let mut fields = text.split_whitespace().map(|f| f.parse::<u64>().ok());
        if let (Some(Some(on_cpu)), Some(Some(wait))) = (fields.next(), fields.next()) {
            ran |= on_cpu > 0;
            waits.insert(tid, wait);
        }
    }
    ran.then_some(waits)
}

/// The waiting for a CPU between two readings of [`run_waits`], every thread's added up (a
/// thread started in between counts from 0, one that ended in between not at all).
fn waited(before: &HashMap<u32, u64>, after: &HashMap<u32, u64>) -> Duration {
    let since = |(tid, wait): (&u32, &u64)| wait.saturating_sub(*before.get(tid).unwrap_or(&0));
    Duration::from_nanos(after.iter().map(since).sum())
}

/// CPU time this thread has used.
fn thread_cpu() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// What the bench keeps of the WRITEs it gets back: their buffers for reuse, the
/// confirmation lag, and the first that did not complete.
///
/// Post times are kept per post (a batch shares one clock reading), by sequence number,
/// not with each WRITE: the queue's context is `()`, so nothing is carried per WRITE
/// beyond its buffer.
struct Tally<M> {
    free: Vec<Buffer<M>>,
    lag: Histogram<u64>,
    /// Whether lag is measured (not in perftest mode).
    timed: bool,
    /// Of each post not yet fully retired, oldest first: the sequence number after its
    /// last WRITE, and its time.
    posts: VecDeque<(u64, Instant)>,
    /// The post of the current run of retired WRITEs: where it ends, its time, how many
    /// of its WRITEs the run has, and when the poll that retired them saw them.
    run_end: u64,
    run_posted: Instant,
    run_len: u64,
    seen: Instant,
    retired: u64,
    failed: Option<(u64, Outcome)>,
}

impl<M> Tally<M> {
    fn new(timed: bool, free: Vec<Buffer<M>>, depth: usize) -> Self {
        let now = Instant::now();
        Tally {
            free,
            lag: new_histogram(),
            timed,
            posts: VecDeque::with_capacity(depth + 1),
            run_end: 0,
            run_posted: now,
            run_len: 0,
            seen: now,
            retired: 0,
            failed: None,
        }
    }

    /// WRITEs up to sequence number `end` (exclusive) were posted at `at`.
    fn posted(&mut self, end: u64, at: Instant) {
        if self.timed {
            self.posts.push_back((end, at));
        }
    }

    /// A WRITE retired by a poll that saw it at `now`; returns its post time (when timed).
    #[inline(always)]
    fn take(&mut self, c: selsig::Completion<M, ()>, now: Instant) -> Instant {
        if c.outcome != Outcome::Completed && self.failed.is_none() {
            self.failed = Some((c.seq.0, c.outcome));
        }
        if let Some(buf) = c.buffer {
            self.free.push(buf);
        }
        self.retired += 1;
        if !self.timed {
            return now;
        }
        // A post shares one time: record its lags as one run.
        if c.seq.0 < self.run_end {
            self.run_len += 1;
        } else {
            self.end_poll();
            // WRITEs retire in posting order: the posts before this one's are done.
            while let Some(&(end, at)) = self.posts.front() {
                if c.seq.0 < end {
                    (self.run_end, self.run_posted) = (end, at);
                    break;
                }
                self.posts.pop_front();
            }
            self.run_len = 1;
        }
        self.seen = now;
        self.run_posted
    }

    /// Records the lag of the last run.
    fn end_poll(&mut self) {
        if self.run_len > 0 && self.timed {
            let ns = self
                .seen
                .saturating_duration_since(self.run_posted)
                .as_nanos() as u64;
            self.lag.saturating_record_n(ns, self.run_len);
        }
        self.run_len = 0;
    }
}

/// One point: a fresh queue pair and completion queue, `stop`'s worth of WRITEs of `size`
/// bytes under `policy`. Returns the point, the send queue's capacity and the number of
/// buffers.
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
    let init = QpInit {
        caps: QpCaps {
            max_send_wr: depth,
            max_recv_wr: 1,
            max_inline_data: if plan.inline { size as u32 } else { 0 },
            ..QpCaps::default()
        },
        sq_sig_all: false,
    };
    let qp = dev.create_qp(pd, &cq, &cq, &init).with_context(|| {
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
    Ok((cq, qp))
}

fn run_point<D: Device>(
    plan: &Plan,
    dev: &D,
    info: &DeviceInfo,
    pd: &D::Pd,
    size: u64,
    policy: Policy,
    stop: Stop,
) -> Result<(Point, u32, u32, bool)> {
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
        plan.connect.as_deref(),
        slots,
        slot,
        run,
    )?;
    let mut free: Vec<Buffer<D::Mr>> = Vec::new();
    let mut fixed: Option<D::Mr> = None;
    let inline_data = pattern(1, if plan.inline { len } else { 0 });
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
    let target = peer.target();
    let sq_capacity = qp.caps().max_send_wr;
    let nic_times = plan.nic_times && qp.record_execution_times(true);
    let config = QueueConfig {
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
    };
    let timed = !plan.perftest;
    let first_seq = config.first_seq;
    let mut queue: SignaledQueue<D, ()> = SignaledQueue::with_config(qp, Arc::clone(&cq), config)?;
    let adaptive = matches!(policy, Policy::Adaptive { .. });
    let cap = if plan.inline || plan.perftest {
        depth
    } else {
        depth.min(buffers)
    };
    let mut done = Vec::with_capacity(depth as usize);
    let mut gap = new_histogram();
    let mut tally = Tally::new(timed, free, depth as usize);
    // The lowest the free list got (the buffers below it were never written).
    let mut lowest_free = tally.free.len();
    let mut to_nic = new_histogram();
    let mut posted = 0u64;
    let mut posting = true;
    let mut confirm = false;
    let mut loops = 0u32;
    let mut posts = 0u32;
    // Bytes posted since a timed run last read the clock.
    let mut unclocked = 0u64;
    let mut last_progress = Instant::now();
    let mut retired_at_check = 0u64;
    let stall = stall_limit(policy, sq_capacity, len as u64);

    let waits0 = run_waits();
    let cpu0 = thread_cpu();
    let start = Instant::now();
    while posting || confirm || tally.retired < posted {
        loops = loops.wrapping_add(1);
        // Post while there is room, then poll (perftest's loop).
        while posting {
            let room = cap.saturating_sub(queue.outstanding()).min(plan.post_list);
            let room = match stop {
                Stop::Iters(n) => u64::from(room).min(n - posted),
                Stop::Duration(_) => u64::from(room),
            };
            if room == 0 {
                break;
            }
            let now = if timed { Instant::now() } else { start };
            let last = match stop {
                Stop::Iters(n) => n,
                Stop::Duration(_) => u64::MAX,
            };
            let count = {
                let free = &mut tally.free;
                let data = inline_data.as_slice();
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
                            match &fixed {
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
            lowest_free = lowest_free.min(tally.free.len());
            posted += count;
            posts = posts.wrapping_add(1);
            posting = match stop {
                Stop::Iters(n) => posted < n,
                Stop::Duration(d) => {
                    unclocked += count * size;
                    if !posts.is_multiple_of(64) && unclocked < CLOCK_BYTES {
                        true
                    } else {
                        unclocked = 0;
                        start.elapsed() < d
                    }
                }
            };
            confirm = !posting && matches!(stop, Stop::Duration(_));
        }
        if confirm {
            // The tail of a timed run is confirmed with a marker, once there is room.
            match queue.confirm_all() {
                Ok(_) => confirm = false,
                Err(selsig::QueuePostError::Refused(e)) if e.is_full() => {}
                Err(e) => {
                    return Err(e).context("cannot post the marker that confirms the tail");
                }
            }
        }
        if adaptive {
            queue.tick().context("cannot confirm the adaptive tail")?;
        }
        if nic_times {
            // The NIC's time of each WRITE is looked up through the queue pair, which
            // `poll_with` holds while it hands completions over: poll into a list.
            queue.poll(&mut done).context("cannot poll")?;
            if !done.is_empty() {
                let now = Instant::now();
                for c in done.drain(..) {
                    let seq = c.seq.0;
                    let posted_at = tally.take(c, now);
                    if let Some(at) = queue.qp().executed_at(seq - first_seq) {
                        gap.saturating_record(now.saturating_duration_since(at).as_nanos() as u64);
                        to_nic.saturating_record(
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
        tally.end_poll();
        if let Some((seq, outcome)) = tally.failed {
            bail!("WRITE {seq} ended {outcome:?}{}", peer.closed_note());
        }
        if loops.is_multiple_of(4096) {
            // A stall check that reads the clock rarely.
            if tally.retired != retired_at_check {
                (retired_at_check, last_progress) = (tally.retired, Instant::now());
            } else if last_progress.elapsed() > stall {
                bail!(
                    "no completion for {} s ({} of {posted} WRITEs retired){}",
                    stall.as_secs(),
                    tally.retired,
                    peer.closed_note()
                );
            }
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    let cpu = thread_cpu().saturating_sub(cpu0);
    let waited = match (waits0, run_waits()) {
        (Some(before), Some(after)) => Some(waited(&before, &after)),
        _ => None,
    };
    queue.qp().record_execution_times(false);

    let stats = queue.stats();
    ensure!(
        stats.completed == posted && tally.retired == posted,
        "{posted} WRITEs posted, {} completed",
        stats.completed
    );
    let bytes = posted as f64 * size as f64;
    let point = Point {
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
        nic_to_app: Percentiles::of(&gap),
        post_to_nic: Percentiles::of(&to_nic),
        round_trip_ns: None,
    };
    drop(queue);
    // In a sweep, buffer k (from 0) holds the pattern of WRITE k + 1 and is written to slot
    // k; the free list is a stack, so the slots below its lowest height were never used.
    let written = plan
        .sweep_with_buffers()
        .then(|| (lowest_free as u32 + 1..=buffers).collect());
    finish(peer, written)?;
    Ok((point, sq_capacity, buffers, nic_times))
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

/// Where perftest's WRITE `index` (from 0) reads and writes: messages up to half a page
/// step through one page in cache-line multiples; larger ones all use offset 0.
fn perftest_offset(index: u64, size: u64, memory: Geometry) -> u64 {
    let Geometry { page, line } = memory;
    if size > page / 2 {
        return 0;
    }
    let step = size.div_ceil(line).max(1) * line;
    (index % (page / step)) * step
}

/// Nanoseconds as a short human figure: 850ns, 12.3us, 4.56ms; the unit is the one the
/// figure, rounded, is below 1000 of.
fn human_ns(ns: f64) -> String {
    if ns.round() < 1e3 {
        format!("{ns:.0}ns")
    } else if (ns / 1e2).round() < 1e4 {
        format!("{:.1}us", ns / 1e3)
    } else if (ns / 1e4).round() < 1e5 {
        format!("{:.2}ms", ns / 1e6)
    } else {
        format!("{:.2}s", ns / 1e9)
    }
}

pub(crate) fn human_size(size: u64) -> String {
    if size >= 1 << 30 && size.is_multiple_of(1 << 30) {
        format!("{}GiB", size >> 30)
    } else if size >= 1 << 20 && size.is_multiple_of(1 << 20) {
        format!("{}MiB", size >> 20)
    } else if size >= 1 << 10 && size.is_multiple_of(1 << 10) {
        format!("{}KiB", size >> 10)
    } else {
        format!("{size}B")
    }
}

/// The table.
pub fn render(report: &Report) -> String {
    use std::fmt::Write as _;
    let s = &report.settings;
    let mut out = String::new();
    let device = match &report.personality {
        Some(p) => format!("{} ({p})", report.device),
        None => report.device.clone(),
    };
    let run = match (s.iters, s.duration_s) {
        (Some(n), _) => format!("{n} WRITEs per point"),
        (None, Some(d)) => format!("{d} s per point"),
        _ => String::new(),
    };
    let _ = writeln!(
        out,
        "selsig bench: {} provider, {device}{}; RDMA WRITE, one RC QP, send queue depth {} (capacity {}), up to {} per post{}, {run}",
        report.provider,
        s.remote
            .as_ref()
            .map_or(String::new(), |r| format!(" -> selsig serve at {r}")),
        s.tx_depth,
        s.sq_capacity,
        s.post_list,
        if s.inline { ", inline" } else { "" },
    );
    let nic = report.points.iter().any(|p| p.nic_to_app.is_some());
    let mut rows: Vec<Vec<String>> = vec![
        [
            "size",
            "signal",
            "MWR/s",
            "Gb/s",
            "CQE/1000",
            "CPU/WR",
            "lag p50 / p99 / max",
            "NIC->app p50 / p99 / max",
        ]
        .map(String::from)
        .to_vec(),
    ];
    for p in &report.points {
        let trio = |q: &Percentiles| {
            format!(
                "{} / {} / {}",
                human_ns(q.p50_ns as f64),
                human_ns(q.p99_ns as f64),
                human_ns(q.max_ns as f64)
            )
        };
        rows.push(vec![
            human_size(p.size),
            p.policy.clone(),
            rate(p.wr_per_sec / 1e6),
            rate(p.gbit_per_sec),
            per_1000(p.cqes_per_1000),
            human_ns(p.cpu_ns_per_wr),
            p.lag.as_ref().map_or("-".to_string(), trio),
            p.nic_to_app.as_ref().map_or("-".to_string(), trio),
        ]);
    }
    let columns = if nic { 8 } else { 7 };
    // Each column as wide as its widest cell, at least the width of the figures of a
    // usual run (so that tables of different runs line up), right-aligned.
    let least = [6, 18, 8, 7, 8, 6, 25, 25];
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            rows.iter()
                .map(|r| r[c].chars().count())
                .max()
                .unwrap_or(0)
                .max(least[c])
        })
        .collect();
    out.push('\n');
    for row in &rows {
        let cells: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, &w)| format!("{cell:>w$}"))
            .collect();
        out.push_str(&cells.join(" "));
        out.push('\n');
    }
    if !report.memcpy.is_empty() {
        let refs: Vec<String> = report
            .memcpy
            .iter()
            .map(|m| format!("{} {:.1} Gb/s", human_size(m.size), m.gbit_per_sec))
            .collect();
        let _ = writeln!(
            out,
            "\nmemcpy of the same buffers on one core (the soft NIC's yardstick): {}",
            refs.join(", ")
        );
    }
    if let Some((min, max)) = round_trips(report) {
        let range = if format!("{min:.0}") == format!("{max:.0}") {
            format!("{min:.0} ns")
        } else {
            format!("{min:.0} to {max:.0} ns")
        };
        let _ = writeln!(
            out,
            "{}round trip of a cache line between two threads, before and after each point \
             (what a completion crossing cores costs): {range}",
            if report.memcpy.is_empty() { "\n" } else { "" }
        );
    }
    out.push_str(
        "\nMWR/s: million WRITEs per second; CQE/1000: completions per 1000 WRITEs; CPU/WR: CPU time \
         of the posting thread (posting and polling) per WRITE; lag: post to the application \
         learning of the completion",
    );
    if nic {
        out.push_str("; NIC->app: the NIC finishing a WRITE to the application learning of it");
    }
    out.push('\n');
    if let Some(warning) = warnings(report) {
        let _ = writeln!(out, "\n{warning}");
    }
    out
}

/// Warnings, one a line, when the posting thread, which never sleeps, was off its core for
/// a good part of some points, or the bench's threads waited for a CPU a good part of the
/// time: those figures measure other work on the machine (or the threads' competition for
/// one core) as well as selsig. And a note for the points of a counted run shorter than
/// their interval, which signal only the last WRITE.
pub fn warnings(report: &Report) -> Option<String> {
    let mut lines = Vec::new();
    if let Some(n) = report.settings.iters {
        let short: Vec<String> = report
            .points
            .iter()
            .filter(|p| p.interval.is_some_and(|every| u64::from(every) > p.wrs))
            .map(|p| format!("{} {}", human_size(p.size), p.policy))
            .collect();
        if !short.is_empty() {
            lines.push(format!(
                "note: {}: -n {n} is fewer WRITEs than the interval, which is never reached: \
                 the one completion is the last WRITE's, which a counted run signals (as \
                 perftest does)",
                short.join(", ")
            ));
        }
    }
    // Rounded away from the threshold: a flagged share never reads as the threshold.
    let below = |share: f64| format!("{}%", (share * 100.0).floor());
    let cpu = flagged(report, below, |p| {
        (p.cpu_share < CPU_SHARE_WARN).then_some(p.cpu_share)
    });
    if let Some(which) = cpu {
        lines.push(format!(
            "warning: the posting thread busy-polls and so should run all the time, but it ran \
             only {which} (below {}): other work took its core, and those figures measure \
             the wait too; run again on a quiet machine",
            below(CPU_SHARE_WARN)
        ));
    }
    let above = |share: f64| format!("{}%", (share * 100.0).ceil());
    let wait = flagged(report, above, |p| {
        p.wait_share.filter(|&w| w > WAIT_SHARE_WARN)
    });
    if let Some(which) = wait {
        lines.push(format!(
            "warning: the bench's threads (the posting thread, and the soft NIC's) waited for \
             a CPU {which} (above {}): they shared a core, or other work took one, and those \
             figures measure the wait too; run again with a core free for each thread",
            above(WAIT_SHARE_WARN)
        ));
    }
    if let Some((min, max)) = round_trips(report)
        && max > min * ROUND_TRIP_WARN
    {
        lines.push(format!(
            "warning: the round trip of a cache line between two threads ranged from {min:.0} to \
             {max:.0} ns over the run ({:.1}x): the threads or their CPUs were moved meanwhile (by \
             the scheduler, or a virtual machine's host), and the points that signal often ran \
             at the speed of the round trip of their time; compare points with like round trips \
             (`round_trip_ns` in the JSON), or run again",
            max / min
        ));
    }
    (!lines.is_empty()).then(|| lines.join("\n"))
}

/// The fastest and the slowest round trip between two threads over the run, where measured
/// ([`Point::round_trip_ns`]).
fn round_trips(report: &Report) -> Option<(f64, f64)> {
    report
        .points
        .iter()
        .filter_map(|p| p.round_trip_ns)
        .flatten()
        .fold(None, |range, ns| match range {
            None => Some((ns, ns)),
            Some((lo, hi)) => Some((f64::min(lo, ns), f64::max(hi, ns))),
        })
}

/// The points `value` flags (its share, where it does), shown as "42% of the time at 4KiB
/// every:2", or "30% to 89% of the time at 3 of the 4 points".
fn flagged(
    report: &Report,
    percent: impl Fn(f64) -> String,
    value: impl Fn(&Point) -> Option<f64>,
) -> Option<String> {
    let low: Vec<(&Point, f64)> = report
        .points
        .iter()
        .filter_map(|p| value(p).map(|v| (p, v)))
        .collect();
    match low.as_slice() {
        [] => None,
        [(p, v)] => Some(format!(
            "{} of the time at {} {}",
            percent(*v),
            human_size(p.size),
            p.policy
        )),
        _ => {
            let (min, max) = low.iter().fold((f64::MAX, f64::MIN), |(lo, hi), (_, v)| {
                (lo.min(*v), hi.max(*v))
            });
            let range = if percent(min) == percent(max) {
                percent(min)
            } else {
                format!("{} to {}", percent(min), percent(max))
            };
            Some(format!(
                "{range} of the time at {} of the {} points",
                low.len(),
                report.points.len()
            ))
        }
    }
}

/// Completions per 1000 WRITEs: one decimal, or three significant digits below 0.1 (an
/// interval of thousands completes a few hundredths of a completion per 1000).
fn per_1000(x: f64) -> String {
    fixed_or_significant(x, 1)
}

/// Two decimals, or three significant digits below 0.01 (large WRITEs: 16 MiB ones run at
/// about 0.0002 M WR/s).
fn rate(x: f64) -> String {
    fixed_or_significant(x, 2)
}

/// `x` with `decimals` decimals, or three significant digits below `10^-decimals`.
fn fixed_or_significant(x: f64, decimals: usize) -> String {
    let three = |x: f64| (2.0 - x.log10().floor()) as usize;
    let least = 10f64.powi(decimals as i32).recip();
    if x >= least || x <= 0.0 || !x.is_finite() {
        return format!("{x:.decimals$}");
    }
    // Rounded to three significant digits, the figure may reach the next power of ten
    // (0.0009996 is 0.00100): the digits are counted from the rounded figure.
    let digits = three(x);
    let rounded: f64 = format!("{x:.digits$}").parse().unwrap_or(x);
    if rounded >= least {
        format!("{x:.decimals$}")
    } else {
        let digits = three(rounded);
        format!("{x:.digits$}")
    }
}

/// perftest's report lines, for comparing with `ib_write_bw`.
pub fn render_perftest(report: &Report) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        " {:<10} {:<14} {:<20} {:<14}",
        "#bytes", "#iterations", "BW average[MB/sec]", "MsgRate[Mpps]"
    );
    for p in &report.points {
        let _ = writeln!(
            out,
            " {:<10} {:<14} {:<20.2} {:<14.6}",
            p.size, p.wrs, p.mib_per_sec, p.mpps
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        bench: BenchArgs,
    }

    fn plan_of(args: &[&str]) -> Result<Plan> {
        let mut argv = vec!["bench"];
        argv.extend_from_slice(args);
        plan(&Cli::try_parse_from(argv).expect("parses").bench)
    }

    #[test]
    fn the_default_sweep_doubles_up_to_the_depth_and_adds_adaptive() {
        let p = plan_of(&[]).unwrap();
        let names: Vec<String> = p.policies.iter().map(|p| p.to_string()).collect();
        assert_eq!(
            names,
            [
                "every:1",
                "every:2",
                "every:4",
                "every:8",
                "every:16",
                "every:32",
                "every:64",
                "every:128",
                "adaptive:64,20us"
            ]
        );
        assert_eq!(p.sizes, [64, 4096, 65536]);
        assert_eq!(p.stop, Stop::Duration(DEFAULT_DURATION));
        assert_eq!(p.post_list, SWEEP_POST_LIST);
        assert!(!p.perftest);

        let p = plan_of(&["-t", "100", "-D", "1.5"]).unwrap();
        assert_eq!(p.policies.len(), 9, "1..64, 100, adaptive");
        assert_eq!(p.policies[7], Policy::Every(100));
        assert_eq!(p.stop, Stop::Duration(Duration::from_millis(1500)));
    }

    #[test]
    fn perftest_mode_takes_perftest_defaults() {
        let p = plan_of(&["--cq-mod", "100", "-s", "64"]).unwrap();
        assert_eq!(p.policies, [Policy::Every(100)]);
        assert_eq!(p.sizes, [64]);
        assert_eq!(p.stop, Stop::Iters(PERFTEST_ITERS));
        assert_eq!(p.post_list, 1);
        assert!(p.perftest);
    }

    #[test]
    fn every_list_takes_numbers_and_adaptive() {
        let p = plan_of(&["-e", "1,64,adaptive", "--adaptive", "adaptive:32,5us"]).unwrap();
        let names: Vec<String> = p.policies.iter().map(|p| p.to_string()).collect();
        assert_eq!(names, ["every:1", "every:64", "adaptive:32,5us"]);
    }

    #[test]
    fn bad_settings_are_refused_with_the_option_named() {
        let err = |args: &[&str]| format!("{:#}", plan_of(args).unwrap_err());
        let e = err(&["-e", "256"]);
        assert!(
            e.contains("--every 256") && e.contains("--tx-depth 128"),
            "{e}"
        );
        let e = err(&["--cq-mod", "129"]);
        assert!(e.contains("--cq-mod 129"), "{e}");
        let e = err(&["-e", "0"]);
        assert!(e.contains("at least 1"), "{e}");
        let e = err(&["-s", "1G", "--region", "64M"]);
        assert!(
            e.contains("--size 1073741824") && e.contains("--region"),
            "{e}"
        );
        let e = err(&["-n", "0"]);
        assert!(e.contains("-n 0"), "{e}");
        let e = err(&["-D", "0"]);
        assert!(e.contains("-D 0"), "{e}");
        let e = err(&["-s", "0"]);
        assert!(e.contains("--size 0"), "{e}");
        let e = err(&["--cq-mod", "4", "-s", "64,128"]);
        assert!(e.contains("one size"), "{e}");
        let e = err(&["--adaptive", "every:4"]);
        assert!(e.contains("not an adaptive policy"), "{e}");
        let e = err(&["--adaptive", "adaptive:200,1us"]);
        assert!(e.contains("200 is more than --tx-depth 128"), "{e}");
        let e = err(&["-t", "8", "-l", "16"]);
        assert!(
            e.contains("--post-list 16 is more than --tx-depth 8, the most WRITEs outstanding"),
            "{e}"
        );
        assert!(Cli::try_parse_from(["bench", "-e", "often"]).is_err());
        assert!(Cli::try_parse_from(["bench", "-D", "soon"]).is_err());
        let e = Cli::try_parse_from(["bench", "-D", "1e-10"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("shorter than a nanosecond"), "{e}");
    }

    /// The bounds themselves are taken: ib_write_bw's, a day, 4 GiB, 2 GiB, a queue of one.
    #[test]
    fn settings_at_their_limits_are_taken() {
        let p = plan_of(&["--cq-mod", "1024", "-t", "15000", "-n", "100000000"]).unwrap();
        assert_eq!(
            (p.policies[0], p.tx_depth, p.stop),
            (Policy::Every(1024), 15000, Stop::Iters(100_000_000))
        );
        let p = plan_of(&["--cq-mod", "1", "-t", "1", "-n", "5", "-l", "1"]).unwrap();
        assert_eq!(
            (p.policies[0], p.tx_depth, p.stop),
            (Policy::Every(1), 1, Stop::Iters(5))
        );
        // perftest's default size, and its region.
        let p = plan_of(&["--cq-mod", "4"]).unwrap();
        assert_eq!((p.sizes.as_slice(), p.region), (&[65536][..], 65536));
        let p = plan_of(&["-s", "64", "--region", "4G", "-e", "1"]).unwrap();
        assert_eq!(p.region, 4 << 30);
        let p = plan_of(&["-s", "2G", "--region", "4G", "-e", "1"]).unwrap();
        assert_eq!(p.sizes, [1 << 31]);
        let p = plan_of(&["--cq-mod", "4", "-s", "2147483647", "-n", "5"]).unwrap();
        assert_eq!(p.sizes, [(1 << 31) - 1]);
        let p = plan_of(&["-D", "86400"]).unwrap();
        assert_eq!(p.stop, Stop::Duration(Duration::from_secs(86400)));
        // A queue of one: every WRITE signaled, adaptive included.
        let p = plan_of(&["-t", "1", "-e", "1,adaptive"]).unwrap();
        let names: Vec<String> = p.policies.iter().map(|p| p.to_string()).collect();
        assert_eq!(names, ["every:1", "adaptive:1,20us"]);
        // Inline WRITEs need no buffers: a region of one WRITE takes any interval.
        let p = plan_of(&["--inline", "-s", "64", "--region", "64", "-e", "16"]).unwrap();
        assert_eq!(p.policies, [Policy::Every(16)]);
        // Each interval once.
        let p = plan_of(&["-e", "1,1,adaptive,adaptive"]).unwrap();
        assert_eq!(p.policies.len(), 2, "{:?}", p.policies);
        // NIC times: on in a sweep unless turned off, never in perftest mode.
        assert!(plan_of(&[]).unwrap().nic_times);
        assert!(!plan_of(&["--no-nic-times"]).unwrap().nic_times);
        assert!(!plan_of(&["--cq-mod", "4"]).unwrap().nic_times);
    }

    /// Two sizes: the interval is checked against the size with the fewest buffers.
    #[test]
    fn an_interval_is_checked_against_every_size() {
        let e = format!(
            "{:#}",
            plan_of(&["-s", "64,64K", "--region", "1M", "-e", "32"]).unwrap_err()
        );
        assert!(
            e.contains("--every 32 with --size 65536: only 16 WRITEs can be outstanding"),
            "{e}"
        );
        let e = format!("{:#}", plan_of(&["-t", "0"]).unwrap_err());
        assert_eq!(e, "--tx-depth must be at least 1");
        // A size too large for one WRITE is named as such in perftest mode too (whose
        // region is made of the size).
        let e = format!(
            "{:#}",
            plan_of(&["--cq-mod", "4", "-s", "5G", "-n", "10"]).unwrap_err()
        );
        assert_eq!(
            e,
            "--size 5368709120 is more than one WRITE carries (2 GiB, InfiniBand's largest message)"
        );
        let e = format!(
            "{:#}",
            plan_of(&["-s", "2147483649", "--region", "4G", "-e", "1"]).unwrap_err()
        );
        assert!(e.starts_with("--size 2147483649 is more than"), "{e}");
        // perftest's own bound is one byte less.
        let e = format!(
            "{:#}",
            plan_of(&["--cq-mod", "4", "-s", "2G", "-n", "10"]).unwrap_err()
        );
        assert_eq!(
            e,
            "--size 2147483648 with --cq-mod: ib_write_bw takes 1 to 2147483647 bytes"
        );
    }

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

    /// Scheduler statistics: the second field of each thread's file; none where the kernel
    /// keeps none (files of zeros) or writes something else.
    #[test]
    fn waits_are_read_where_the_kernel_keeps_them() {
        let of = |files: &[(u32, &str)]| {
            waits_of(files.iter().map(|&(tid, text)| (tid, text.to_string())))
        };
        let w = of(&[(7, "5000 300 2\n"), (8, "0 0 0\n")]).unwrap();
        assert_eq!((w[&7], w[&8]), (300, 0));
        assert_eq!(of(&[(7, "0 0 0\n"), (8, "0 0 0\n")]), None);
        assert_eq!(of(&[(7, "garbage\n")]), None);
        assert_eq!(of(&[]), None);
    }

    #[test]
    fn percentiles_are_read_at_their_quantiles() {
        let mut h = new_histogram();
        for v in 1..=1000u64 {
            h.record(v * 1000).unwrap();
        }
        let p = Percentiles::of(&h).unwrap();
        let near = |got: u64, want: u64| got.abs_diff(want) <= want / 100;
        assert_eq!(p.count, 1000);
        assert!(near(p.p50_ns, 500_000), "{p:?}");
        assert!(near(p.p99_ns, 990_000), "{p:?}");
        assert!(near(p.max_ns, 1_000_000), "{p:?}");
        assert!((p.mean_ns - 500_500.0).abs() < 5_000.0, "{p:?}");
        assert!(Percentiles::of(&new_histogram()).is_none());
    }

    #[test]
    fn perftest_addresses_step_through_one_page() {
        let x86 = Geometry {
            page: 4096,
            line: 64,
        };
        let at = |i, size| perftest_offset(i, size, x86);
        assert_eq!(
            (at(0, 64), at(1, 64), at(63, 64), at(64, 64)),
            (0, 64, 4032, 0)
        );
        assert_eq!((at(1, 100), at(31, 100), at(32, 100)), (128, 3968, 0));
        assert_eq!((at(1, 2048), at(2, 2048)), (2048, 0));
        assert_eq!((at(1, 2049), at(7, 65536)), (0, 0));
        assert_eq!((at(1, 1), at(64, 1)), (64, 0));
        // 64 KiB pages and 128-byte lines (some aarch64 and POWER hosts).
        let large = Geometry {
            page: 65536,
            line: 128,
        };
        let at = |i, size| perftest_offset(i, size, large);
        assert_eq!((at(1, 64), at(511, 64), at(512, 64)), (128, 65408, 0));
        assert_eq!((at(1, 32768), at(2, 32768), at(1, 32769)), (32768, 0, 0));
    }

    /// perftest mode takes the host's page and cache line, as perftest does; a page is a
    /// power of two, a line too, smaller than the page.
    #[test]
    fn the_host_geometry_is_read() {
        let g = Geometry::host();
        assert!(g.page.is_power_of_two() && g.page >= 4096, "{g:?}");
        assert!(g.line.is_power_of_two() && g.line < g.page, "{g:?}");
    }

    fn report_of(shares: &[f64]) -> Report {
        let point = |i: usize, share: f64| Point {
            size: 64 << (i % 2 * 6),
            policy: format!("every:{}", 1 << i),
            interval: Some(1 << i),
            wrs: 1000,
            seconds: 0.5,
            wr_per_sec: 2000.0,
            gbit_per_sec: 0.001,
            mib_per_sec: 0.1,
            mpps: 0.002,
            cqes: 1000,
            cqes_per_1000: 1000.0,
            forced: 0,
            markers: 0,
            wrs_per_cqe: 1.0,
            cpu_ns_per_wr: share * 500_000.0,
            cpu_share: share,
            wait_share: Some(0.0),
            lag: None,
            nic_to_app: None,
            post_to_nic: None,
            round_trip_ns: None,
        };
        Report {
            provider: "soft".into(),
            device: "soft0".into(),
            personality: None,
            settings: Settings {
                opcode: "RDMA_WRITE".into(),
                tx_depth: 128,
                sq_capacity: 128,
                post_list: 16,
                inline: false,
                iters: None,
                duration_s: Some(0.5),
                perftest_mode: false,
                nic_times: false,
                buffers_per_size: vec![],
                remote: None,
                region: 1 << 20,
                gid_index: None,
            },
            points: shares
                .iter()
                .enumerate()
                .map(|(i, &s)| point(i, s))
                .collect(),
            memcpy: vec![],
        }
    }

    #[test]
    fn every_log_axis_has_two_labels_or_more() {
        // Throughput within one decade, below 1 Gb/s too (a loaded machine's 64 B points):
        // the powers of ten at the ends of the axis were left out by rounding.
        for (lo, hi) in [
            (0.2, 0.5),
            (0.12, 0.9),
            (2.0, 9.0),
            (0.012, 0.05),
            (20.0, 30.0),
        ] {
            let mut report = report_of(&[1.0, 1.0]);
            report.points[0].gbit_per_sec = lo;
            report.points[1].gbit_per_sec = hi;
            report.points[1].size = 64;
            let svg = crate::chart::render(&report).unwrap();
            let texts = svg_texts(&svg);
            let from = texts
                .iter()
                .position(|t| t.starts_with("Throughput"))
                .unwrap();
            let y: Vec<f64> = texts[from..]
                .iter()
                .skip_while(|t| !t.starts_with("signal interval"))
                .skip(1)
                .map_while(|t| t.parse::<f64>().ok())
                .collect();
            // The y labels, then the x labels 1 and 2 (intervals of the two points).
            let (y, x) = y.split_at(y.len() - 2);
            assert_eq!(x, [1.0, 2.0], "{lo}..{hi}: {texts:?}");
            // Powers of ten, from below the lowest value to above the highest.
            assert!(y.len() >= 2, "{lo}..{hi}: {y:?}");
            assert!(y[0] <= lo && y[y.len() - 1] >= hi, "{lo}..{hi}: {y:?}");
            assert!(
                y.windows(2).all(|w| (w[1] / w[0] - 10.0).abs() < 1e-9),
                "{y:?}"
            );
        }
    }

    #[test]
    fn the_chart_draws_each_figure_against_the_interval_it_names() {
        // One size, every 1, 4 and 16, and adaptive at 4: throughput 1, 2 and 4 Gb/s (3
        // adaptive), lag p50 100, 200 and 400 µs with p99 eight times as long.
        let mut report = report_of(&[1.0; 4]);
        for (i, p) in report.points.iter_mut().enumerate() {
            let interval = [1u32, 4, 16, 4][i];
            p.size = 64;
            p.interval = (i < 3).then_some(interval);
            p.policy = match i {
                3 => "adaptive:4,50us".to_string(),
                _ => format!("every:{interval}"),
            };
            p.gbit_per_sec = [1.0, 2.0, 4.0, 3.0][i];
            let p50 = [100_000, 200_000, 400_000, 150_000][i];
            p.lag = Some(Percentiles {
                count: 1000,
                p50_ns: p50,
                p99_ns: 8 * p50,
                max_ns: 8 * p50,
                mean_ns: p50 as f64,
            });
        }
        let svg = crate::chart::render(&report).unwrap();
        let texts = svg_texts(&svg);
        let at = |title: &str| texts.iter().position(|t| t.starts_with(title)).unwrap();
        let (throughput, lag) = (at("Throughput"), at("Confirmation lag"));
        let numbers =
            |panel: &[&str]| -> Vec<f64> { panel.iter().filter_map(|t| t.parse().ok()).collect() };
        // Each panel's axes: its unit, the intervals 1 to 16 (not their logarithms, and
        // the largest not cut off), below y labels that span the figures.
        for (panel, unit, lo, hi) in [
            (&texts[throughput..lag], "Gb/s", 1.0, 4.0),
            (&texts[lag..], "microseconds (log scale)", 100.0, 3200.0),
        ] {
            assert!(panel.contains(&unit), "{unit}: {panel:?}");
            let numbers = numbers(panel);
            let (y, x) = numbers.split_at(numbers.len() - 5);
            assert_eq!(x, [1.0, 2.0, 4.0, 8.0, 16.0], "{unit}: {panel:?}");
            let (min, max) = (y[0], y[y.len() - 1]);
            assert!(min <= lo && max >= hi && max < 100.0 * hi, "{unit}: {y:?}");
        }
        // The lines join the every:N points only (the adaptive one is a triangle), left
        // to right; p99 (dashed) above p50 (solid).
        let points = |style: &str| -> Vec<Vec<(i64, i64)>> {
            svg.split("<polyline")
                .skip(1)
                // The element itself, not the ones drawn after it.
                .map(|e| &e[..e.find("/>").unwrap()])
                .filter(|e| e.contains(style))
                .map(svg_points)
                .collect()
        };
        let lines: Vec<_> = points(r##"stroke="#0072B2" stroke-width="2""##)
            .into_iter()
            .filter(|l| l.len() > 2)
            .collect();
        assert_eq!(lines.len(), 2, "throughput and lag p50: {lines:?}");
        for line in &lines {
            assert_eq!(line.len(), 3, "{line:?}");
            assert!(line.windows(2).all(|w| w[0].0 < w[1].0), "{line:?}");
        }
        let p50_top = lines[1].iter().map(|p| p.1).min().unwrap();
        let dashes = points(r##"stroke="#0072B2" stroke-width="1""##);
        assert!(!dashes.is_empty());
        assert!(
            dashes.iter().flatten().all(|p| p.1 < p50_top),
            "p99 {dashes:?} not above p50 {:?}",
            lines[1]
        );
        assert_eq!(
            svg.matches("<polygon").count(),
            2,
            "an adaptive triangle a panel"
        );
    }

    /// The interval axis runs from the smallest interval drawn to the largest, a label per
    /// power of two: a sweep of long intervals does not leave most of the plot empty.
    #[test]
    fn the_interval_axis_starts_at_the_smallest_interval() {
        for (intervals, labels) in [
            (&[64u32, 128][..], &["64", "128"][..]),
            (&[16, 32, 64, 128], &["16", "32", "64", "128"]),
            (&[1, 4], &["1", "2", "4"]),
            (&[64], &["32", "64"]),
        ] {
            let mut report = report_of(&vec![1.0; intervals.len()]);
            for (p, &n) in report.points.iter_mut().zip(intervals) {
                p.size = 64;
                p.interval = Some(n);
                p.policy = format!("every:{n}");
            }
            let svg = crate::chart::render(&report).unwrap();
            let texts = svg_texts(&svg);
            // The throughput panel's x labels: its whole numbers (its y labels have a
            // decimal), up to the next panel's title.
            let x: Vec<&str> = texts
                .iter()
                .skip_while(|t| !t.starts_with("Throughput"))
                .take_while(|t| !t.starts_with("Confirmation lag"))
                .copied()
                .filter(|t| t.parse::<u32>().is_ok())
                .collect();
            assert_eq!(x, labels, "{intervals:?}: {texts:?}");
        }
    }

    /// A size swept at one interval has no line to dash: its p99 still gets a mark, above
    /// its p50, in every panel of percentiles; so does an adaptive point's.
    #[test]
    fn a_lone_point_and_an_adaptive_one_show_their_p99() {
        let mut report = report_of(&[1.0, 1.0]);
        for (i, p) in report.points.iter_mut().enumerate() {
            p.size = 64;
            p.interval = (i == 0).then_some(1);
            p.policy = ["every:1", "adaptive:4,50us"][i].to_string();
            p.lag = Some(percentiles(100_000, 800_000, 900_000));
        }
        let svg = crate::chart::render(&report).unwrap();
        let lag = &svg[svg.find("Confirmation lag").unwrap()..];
        // (cx, cy) of the panel's filled or hollow circles (the legend's is filled).
        let circles = |filled: bool| -> Vec<(f64, f64)> {
            lag.split("<circle")
                .skip(1)
                .map(|e| &e[..e.find("/>").unwrap()])
                .filter(|e| e.contains(r#"fill="none""#) != filled)
                .map(|e| {
                    let attr = |name: &str| -> f64 {
                        let v = e.split(&format!("{name}=\"")).nth(1).unwrap();
                        v[..v.find('"').unwrap()].parse().unwrap()
                    };
                    (attr("cx"), attr("cy"))
                })
                .collect()
        };
        let (filled, p99) = (circles(true), circles(false));
        assert_eq!(p99.len(), 1, "{lag}");
        let p50 = filled
            .iter()
            .find(|c| c.0 == p99[0].0)
            .expect("p50 below p99");
        assert!(p99[0].1 < p50.1, "p99 at {:?} above p50 at {p50:?}", p99[0]);
        // The adaptive point: a filled triangle at p50, an outline (a closed path of
        // four points, the first one again) above it at p99.
        let filled: Vec<Vec<(i64, i64)>> = lag.split("<polygon").skip(1).map(svg_points).collect();
        assert_eq!(filled.len(), 1, "adaptive p50: {lag}");
        let outline: Vec<Vec<(i64, i64)>> = lag
            .split("<polyline")
            .skip(1)
            .map(svg_points)
            .filter(|p| p.len() == 4 && p[0] == p[3])
            .collect();
        assert_eq!(outline.len(), 1, "adaptive p99: {lag}");
        let top = |p: &[(i64, i64)]| p.iter().map(|q| q.1).min().unwrap();
        assert!(
            top(&outline[0]) < top(&filled[0]),
            "{outline:?} above {filled:?}"
        );
    }

    /// Percentiles of 1000 samples whose mean is their p50.
    fn percentiles(p50_ns: u64, p99_ns: u64, max_ns: u64) -> Percentiles {
        Percentiles {
            count: 1000,
            p50_ns,
            p99_ns,
            max_ns,
            mean_ns: p50_ns as f64,
        }
    }

    /// The pixels of the `points` attribute of an SVG element (from its text on).
    fn svg_points(element: &str) -> Vec<(i64, i64)> {
        let list = element.split("points=\"").nth(1).unwrap();
        list[..list.find('"').unwrap()]
            .split_whitespace()
            .map(|p| {
                let (x, y) = p.split_once(',').unwrap();
                (x.parse().unwrap(), y.parse().unwrap())
            })
            .collect()
    }

    /// The texts of an SVG document, in order.
    fn svg_texts(svg: &str) -> Vec<&str> {
        svg.split("<text")
            .skip(1)
            .filter_map(|t| t.split_once('>').map(|(_, rest)| rest))
            .filter_map(|t| t.split_once("</text>").map(|(text, _)| text.trim()))
            .collect()
    }

    #[test]
    fn points_whose_posting_thread_lost_its_core_are_flagged() {
        assert_eq!(warnings(&report_of(&[1.0, 0.97, 0.9])), None);
        assert!(!render(&report_of(&[1.0, 0.95])).contains("warning"));

        let one = warnings(&report_of(&[1.0, 0.42, 0.99])).expect("flagged");
        assert!(
            one.contains("only 42% of the time at 4KiB every:2"),
            "{one}"
        );
        assert!(one.contains("below 90%"), "{one}");
        let table = render(&report_of(&[1.0, 0.42, 0.99]));
        assert!(table.trim_end().ends_with(&one), "{table}");

        let some = warnings(&report_of(&[0.3, 1.0, 0.61, 0.895])).expect("flagged");
        assert!(
            some.contains("only 30% to 89% of the time at 3 of the 4 points"),
            "{some}"
        );
        let alike = warnings(&report_of(&[0.324, 0.321])).expect("flagged");
        assert!(
            alike.contains("only 32% of the time at 2 of the 2 points"),
            "{alike}"
        );
    }

    #[test]
    fn counted_points_shorter_than_their_interval_get_a_note() {
        // Intervals 1 to 2048, 1000 WRITEs each.
        let mut report = report_of(&[1.0; 12]);
        assert_eq!(warnings(&report), None, "a timed run reaches its intervals");
        report.settings.iters = Some(1000);
        let note = warnings(&report).expect("a note");
        assert!(
            note.starts_with(
                "note: 64B every:1024, 4KiB every:2048: -n 1000 is fewer WRITEs than the interval"
            ),
            "{note}"
        );
        assert_eq!(note.lines().count(), 1, "{note}");
        report.points.truncate(11);
        report.points[10].wrs = 1024;
        assert_eq!(warnings(&report), None, "1024 WRITEs reach every:1024");
    }

    /// A report whose points' threads waited for a CPU these shares of the time (their
    /// posting threads ran all the time).
    fn report_of_waits(waits: &[Option<f64>]) -> Report {
        let mut report = report_of(&vec![1.0; waits.len()]);
        for (p, w) in report.points.iter_mut().zip(waits) {
            p.wait_share = *w;
        }
        report
    }

    #[test]
    fn points_whose_threads_waited_for_a_cpu_are_flagged() {
        let quiet = [Some(0.0), Some(0.1), None, Some(0.02)];
        assert_eq!(warnings(&report_of_waits(&quiet)), None);
        let one = warnings(&report_of_waits(&[Some(0.0), Some(0.101)])).expect("flagged");
        assert!(
            one.contains("waited for a CPU 11% of the time at 4KiB every:2 (above 10%)"),
            "{one}"
        );
        assert!(!one.contains("posting thread busy-polls"), "{one}");
        let some = warnings(&report_of_waits(&[Some(0.5), None, Some(1.7)])).expect("flagged");
        assert!(
            some.contains("waited for a CPU 50% to 170% of the time at 2 of the 3 points"),
            "{some}"
        );
        // Both kinds: one line each, under the table.
        let mut both = report_of_waits(&[Some(0.3), Some(0.0)]);
        both.points[1].cpu_share = 0.5;
        let lines = warnings(&both).expect("flagged");
        let lines: Vec<&str> = lines.lines().collect();
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(
            lines[0].contains("only 50% of the time at 4KiB every:2"),
            "{lines:?}"
        );
        assert!(
            lines[1].contains("30% of the time at 64B every:1"),
            "{lines:?}"
        );
        assert!(render(&both).trim_end().ends_with(lines[1]));
    }

    #[test]
    fn figures_are_printed_in_human_units() {
        assert_eq!(human_ns(850.0), "850ns");
        assert_eq!(human_ns(12_345.0), "12.3us");
        assert_eq!(human_ns(4_560_000.0), "4.56ms");
        // The unit is chosen after rounding: never "1000ns" or "1000.0us".
        assert_eq!(human_ns(999.4), "999ns");
        assert_eq!(human_ns(999.7), "1.0us");
        assert_eq!(human_ns(999_940.0), "999.9us");
        assert_eq!(human_ns(999_960.0), "1.00ms");
        assert_eq!(human_ns(999_996_000.0), "1.00s");
        assert_eq!(human_size(64), "64B");
        assert_eq!(human_size(4096), "4KiB");
        assert_eq!(human_size(1 << 20), "1MiB");
        assert_eq!(human_size(1000), "1000B");
        // M WR/s: two decimals, three significant digits for large WRITEs' small rates.
        assert_eq!(rate(54.104), "54.10");
        assert_eq!(rate(0.2), "0.20");
        assert_eq!(rate(0.01), "0.01");
        assert_eq!(rate(0.00234), "0.00234");
        assert_eq!(rate(0.000_2), "0.000200");
        assert_eq!(rate(0.0), "0.00");
        // Rounding up to the next power of ten keeps three significant digits.
        assert_eq!(rate(0.009996), "0.01");
        assert_eq!(rate(0.0009996), "0.00100");
        assert_eq!(human_size(3 << 19), "1536KiB");
        assert_eq!(human_size(3 << 20), "3MiB");
        assert_eq!(gbit(125e6, 1.0), 1.0);
        assert_eq!(gbit(1e9, 2.0), 4.0);
    }

    /// Each figure of a point lands in its column, the memcpy yardstick in its line, and
    /// the send queue's capacity in the header when it differs from the depth asked for.
    #[test]
    fn the_table_shows_every_figure_of_a_point() {
        let mut report = report_of(&[1.0]);
        report.settings.sq_capacity = 256;
        report.memcpy = vec![MemcpyRef {
            size: 65536,
            gbit_per_sec: 12.34,
        }];
        let p = &mut report.points[0];
        p.size = 3 << 19;
        p.wr_per_sec = 2.5e6;
        p.gbit_per_sec = 30.72;
        p.cqes_per_1000 = 15.625;
        p.cpu_ns_per_wr = 1234.0;
        p.lag = Some(percentiles(1000, 5000, 9000));
        p.nic_to_app = Some(percentiles(2000, 6000, 8000));
        let table = render(&report);
        assert!(
            table.contains("send queue depth 128 (capacity 256)"),
            "{table}"
        );
        let row = table
            .lines()
            .find(|l| l.contains("every:1"))
            .expect("a row");
        let cells: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(
            cells,
            [
                "1536KiB", "every:1", "2.50", "30.72", "15.6", "1.2us", "1.0us", "/", "5.0us", "/",
                "9.0us", "2.0us", "/", "6.0us", "/", "8.0us"
            ],
            "{table}"
        );
        assert!(
            table.contains("(the soft NIC's yardstick): 64KiB 12.3 Gb/s"),
            "{table}"
        );
    }

    /// A cell wider than its column's usual width widens the column for every row: the
    /// columns after it stay in line (64 KiB lags of three figures in microseconds, a CPU
    /// time in milliseconds).
    #[test]
    fn wide_cells_widen_their_column_and_keep_the_rest_in_line() {
        let mut report = report_of(&[1.0, 1.0]);
        report.points[0].lag = Some(percentiles(444_700, 757_800, 849_400));
        report.points[0].nic_to_app = Some(percentiles(1000, 2000, 3000));
        report.points[0].cpu_ns_per_wr = 131_860_000.0;
        report.points[1].lag = Some(percentiles(1000, 2000, 3000));
        report.points[1].nic_to_app = Some(percentiles(444_700, 757_800, 849_400));
        let table = render(&report);
        let lines: Vec<&str> = table
            .lines()
            .filter(|l| l.contains("every:") || l.trim_start().starts_with("size "))
            .collect();
        assert_eq!(lines.len(), 3, "{table}");
        assert!(lines[1].contains("131.86ms") && lines[1].contains("444.7us / 757.8us / 849.4us"));
        // Right-aligned columns: every row ends where the header ends, and each column's
        // last character stands where the header's does.
        let ends = |l: &str| -> Vec<usize> {
            let b = l.as_bytes();
            (0..b.len())
                .filter(|&i| b[i] != b' ' && (i + 1 == b.len() || b[i + 1] == b' '))
                .collect()
        };
        let header = ends(lines[0]);
        for row in &lines[1..] {
            assert_eq!(row.len(), lines[0].len(), "{table}");
            let cells = ends(row);
            for (c, &at) in [0, 1, 2, 3, 4, 5].iter().zip(&header) {
                assert!(cells.contains(&at), "column {c} ends at {at}: {table}");
            }
        }
    }

    /// Completions per 1000 WRITEs keep three significant digits below 0.1: an interval of
    /// thousands does not read as no completions at all.
    #[test]
    fn few_completions_per_1000_are_not_shown_as_zero() {
        assert_eq!(per_1000(1000.0), "1000.0");
        assert_eq!(per_1000(15.625), "15.6");
        assert_eq!(per_1000(0.1), "0.1");
        assert_eq!(per_1000(0.0305), "0.0305");
        assert_eq!(per_1000(0.0), "0.0");
        let mut report = report_of(&[1.0]);
        report.points[0].cqes_per_1000 = 0.0305;
        assert!(render(&report).contains(" 0.0305 "), "{}", render(&report));
    }

    /// The round trips before and after each point give one line under the table, their
    /// range over the run; a range wider than twofold is flagged, and a steady one is not.
    #[test]
    fn round_trips_are_shown_and_a_wide_range_is_flagged() {
        let mut report = report_of(&[1.0, 1.0, 1.0]);
        assert!(!render(&report).contains("round trip"), "none measured");
        let line = "round trip of a cache line between two threads, before and after each point";
        report.points[0].round_trip_ns = Some([120.4, 119.6]);
        report.points[2].round_trip_ns = Some([120.2, 120.0]);
        let table = render(&report);
        assert!(
            table.contains(&format!(
                "\n\n{line} (what a completion crossing cores costs): 120 ns\n"
            )),
            "a line of its own after the table: {table}"
        );
        assert_eq!(warnings(&report), None);
        report.points[1].round_trip_ns = Some([131.0, 239.0]);
        assert_eq!(warnings(&report), None, "2.0x is not flagged");
        report.points[2].round_trip_ns = Some([520.7, 119.6]);
        let table = render(&report);
        assert!(table.contains("costs): 120 to 521 ns\n"), "{table}");
        let warning = warnings(&report).expect("a warning");
        assert!(
            warning.contains("ranged from 120 to 521 ns over the run (4.4x)"),
            "{warning}"
        );
        assert!(table.trim_end().ends_with(&warning), "{table}");
    }

    /// The yardstick measures a time, and stops soon after its time limit, even where the
    /// other thread waits for a CPU (tests run side by side).
    #[test]
    fn a_round_trip_between_threads_is_timed() {
        let start = Instant::now();
        let ns = round_trip_ns().expect("a thread");
        let took = start.elapsed();
        assert!(ns.is_finite() && ns > 0.0, "{ns}");
        assert!(took < Duration::from_secs(5), "{took:?}");
    }

    /// The first WRITE that did not complete is the one a point reports, not a later one
    /// flushed behind it.
    #[test]
    fn the_tally_keeps_the_first_failure() {
        let now = Instant::now();
        let mut tally: Tally<()> = Tally::new(true, Vec::new(), 8);
        tally.posted(7, now);
        let done = |seq, outcome| selsig::Completion {
            seq: selsig::Seq(seq),
            buffer: None,
            user: (),
            outcome,
            signaled: false,
        };
        tally.take(done(4, Outcome::Completed), now);
        tally.take(
            done(5, Outcome::Failed(selsig::WcStatus::RemAccessErr)),
            now,
        );
        tally.take(done(6, Outcome::Flushed), now);
        tally.end_poll();
        assert_eq!(
            tally.failed,
            Some((5, Outcome::Failed(selsig::WcStatus::RemAccessErr)))
        );
        assert_eq!(tally.retired, 3);
        assert_eq!(tally.lag.len(), 3);
    }

    /// Each WRITE's lag runs from the post it went out in, whichever poll retires it; a
    /// marker's sequence number between posts (never handed back) is skipped.
    #[test]
    fn the_tally_times_each_write_from_its_post() {
        let t0 = Instant::now();
        let (t1, seen) = (
            t0 + Duration::from_micros(10),
            t0 + Duration::from_micros(50),
        );
        let mut tally: Tally<()> = Tally::new(true, Vec::new(), 8);
        // WRITEs 0..3 at t0, a marker 3, WRITEs 4..6 at t1.
        tally.posted(3, t0);
        tally.posted(6, t1);
        let done = |seq| selsig::Completion {
            seq: selsig::Seq(seq),
            buffer: None,
            user: (),
            outcome: Outcome::Completed,
            signaled: false,
        };
        assert_eq!(tally.take(done(0), seen), t0);
        assert_eq!(tally.take(done(1), seen), t0);
        tally.end_poll();
        assert_eq!(tally.take(done(2), seen), t0);
        assert_eq!(tally.take(done(4), seen), t1);
        assert_eq!(tally.take(done(5), seen), t1);
        tally.end_poll();
        assert_eq!(tally.retired, 5);
        assert_eq!(tally.lag.len(), 5);
        assert_eq!(tally.lag.count_between(49_000, 50_999), 3, "posted at t0");
        assert_eq!(tally.lag.count_between(39_000, 40_999), 2, "posted at t1");
        assert!(tally.posts.len() <= 1, "retired posts are let go");
    }

    /// A point slow enough to show its Gb/s with three significant digits, as its rate.
    #[test]
    fn a_small_throughput_is_not_printed_as_zero() {
        let mut report = report_of(&[0.9]);
        report.points[0].gbit_per_sec = 0.000_6;
        let table = render(&report);
        let row = table
            .lines()
            .find(|l| l.contains("every:1"))
            .expect("a row");
        assert!(row.contains(" 0.000600 "), "{row}");
    }
}
