//! Turning the options into a plan: the checks (errors here are the user's input) and the
//! sweep's policies, sizes, stop, post list and region.

use std::time::Duration;

use anyhow::{Result, bail, ensure};
use selsig::Policy;

use crate::bench::host::Geometry;
use crate::bench::options::{BenchArgs, IntervalArg};
use crate::limits::{MAX_REGION, MAX_RUN};

/// WRITEs per post in a sweep (one doorbell each), unless `--post-list` says otherwise.
pub const SWEEP_POST_LIST: u32 = 16;
/// perftest's default iterations (`-n`).
pub const PERFTEST_ITERS: u64 = 5000;
/// The iterations, send queue depths and CQ moderations ib_write_bw takes.
const PERFTEST_ITERS_RANGE: (u64, u64) = (5, 100_000_000);
const PERFTEST_TX_DEPTH: (u64, u64) = (1, 15_000);
const PERFTEST_CQ_MOD: (u64, u64) = (1, 1024);
/// The queue pairs ib_write_bw -q takes (perftest_parameters.h: MIN_QP_NUM, MAX_QP_NUM).
const PERFTEST_QPS: (u64, u64) = (1, 16_384);

/// Time per point of a sweep when neither `-n` nor `-D` is given.
const DEFAULT_DURATION: Duration = Duration::from_millis(500);

/// The largest WRITE: InfiniBand's largest message (perftest's own limit is one byte less).
const MAX_SIZE: u64 = selsig::MAX_MESSAGE_LEN;

/// `--region`'s default.
const DEFAULT_REGION: u64 = 256 << 20;

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
    /// The size of the CQ the send queue completes to (of one queue pair).
    pub cq_entries: u32,
    /// Queue pairs (`--qp`; more than one in perftest mode only), each with `stop`'s
    /// WRITEs.
    pub qps: u32,
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
    /// How `connect` connects the queue pairs.
    pub cm: crate::remote::Cm,
}

/// Checks the options (errors here are the user's input) and plans the sweep.
pub fn plan(args: &BenchArgs) -> Result<Plan> {
    let depth = args.tx_depth;
    ensure!(depth >= 1, "--tx-depth must be at least 1");
    let cq_entries = crate::common::cq_entries(depth)?;
    let perftest = args.cq_mod.is_some();
    let geometry = Geometry::host();
    if perftest {
        check_perftest(args)?;
    }
    ensure!(
        perftest || !args.report_gbits,
        "--report_gbits changes perftest mode's table (--cq-mod); a sweep's table shows Gb/s \
         already"
    );
    if let Some(host) = &args.connect {
        ensure!(
            args.provider.provider == crate::common::ProviderKind::Verbs,
            "--connect {host}: needs --provider verbs (the soft NIC connects queue pairs of one process only)"
        );
    }
    let qps = qps(args, perftest)?;
    let sizes = sizes(args, perftest)?;
    let region = region(args, perftest, geometry, &sizes)?;
    ensure!(
        u64::from(qps).saturating_mul(region) <= MAX_REGION,
        "--qp {qps}: {qps} queue pairs of {region} bytes each register more than the bench \
         registers on each side ({MAX_REGION} bytes)"
    );
    // The most WRITEs outstanding at once, per size: in a sweep each owns a buffer, and
    // fewer buffers than the queue depth fit when the region is small. No signal interval
    // may exceed it: every buffer would wait for a completion that nothing asks for.
    let outstanding = sizes
        .iter()
        .map(|&size| (outstanding(args, perftest, region, size), size))
        .min()
        .unwrap_or((depth, 0));
    let adaptive = adaptive(args, perftest, outstanding)?;
    let policies = policies(args, outstanding, adaptive)?;
    let stop = stop(args, perftest)?;
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
        qps,
        post_list,
        inline: args.inline,
        region,
        geometry,
        // perftest mode reads no clock in its loop, as perftest.
        nic_times: !args.no_nic_times && !perftest,
        perftest,
        connect: args.connect.clone(),
        cm: args.cm,
    })
}

/// perftest mode's checks (`--cq-mod`): ib_write_bw's bounds, and the options whose meaning
/// there selsig does not reproduce.
fn check_perftest(args: &BenchArgs) -> Result<()> {
    let depth = args.tx_depth;
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
    Ok(())
}

/// The queue pairs (`--qp`): at least one; several in perftest mode only, as
/// ib_write_bw's -q takes them, and not with `--connect`.
fn qps(args: &BenchArgs, perftest: bool) -> Result<u32> {
    let n = args.qps;
    ensure!(n >= 1, "--qp 0: at least one queue pair carries the WRITEs");
    if n == 1 {
        return Ok(n);
    }
    ensure!(
        perftest,
        "--qp {n}: several queue pairs are perftest mode's (--cq-mod), as ib_write_bw -q; a \
         sweep (-e) runs one"
    );
    let (low, high) = PERFTEST_QPS;
    ensure!(
        (low..=high).contains(&u64::from(n)),
        "--qp {n}: ib_write_bw -q takes {low} to {high} queue pairs, and so does perftest mode"
    );
    if let Some(host) = &args.connect {
        bail!(
            "--qp {n} with --connect {host}: selsig serve connects one queue pair per session \
             and serves one client at a time; run several queue pairs without --connect (their \
             peers in this process)"
        );
    }
    Ok(n)
}

/// The sizes to measure (each once, in the order given), checked: one in perftest mode,
/// none empty or larger than one WRITE carries.
fn sizes(args: &BenchArgs, perftest: bool) -> Result<Vec<u64>> {
    let sizes = if args.all {
        // ib_write_bw -a: 1 << i for i in 1..24 (write_bw.c).
        (1..24).map(|i| 1u64 << i).collect()
    } else if args.sizes.is_empty() {
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
    if perftest && !args.all {
        ensure!(
            sizes.len() == 1,
            "--cq-mod measures one size as perftest does (or every size of -a); -s names {}",
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
    Ok(sizes)
}

/// The memory registered on each side: `--region`, perftest's (max(SIZE, page)) in perftest
/// mode, checked against [`MAX_REGION`] and the sizes.
fn region(args: &BenchArgs, perftest: bool, geometry: Geometry, sizes: &[u64]) -> Result<u64> {
    let region = match (args.region, perftest) {
        (Some(region), true) => bail!(
            "--region {region} with --cq-mod: perftest mode uses the memory ib_write_bw does, max(SIZE, {}) bytes (the page size) on each side",
            geometry.page
        ),
        (Some(region), false) => region,
        // ib_write_bw sizes its buffers for the largest message (-a: 2^23).
        (None, true) => sizes.iter().copied().max().unwrap_or(0).max(geometry.page),
        (None, false) => DEFAULT_REGION,
    };
    ensure!(
        region <= MAX_REGION,
        "--region {region}: the bench registers at most {MAX_REGION} bytes on each side"
    );
    for &size in sizes {
        ensure!(
            size <= region,
            "--size {size} is larger than the registered region (--region {region})"
        );
    }
    Ok(region)
}

/// The policy of the `adaptive` point (`--adaptive`, or one of half the most WRITEs
/// outstanding), checked as an interval is; `outstanding` is as for [`check_interval`].
fn adaptive(args: &BenchArgs, perftest: bool, outstanding: (u32, u64)) -> Result<Policy> {
    let depth = args.tx_depth;
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
    Ok(adaptive)
}

/// The policies of the sweep (`--cq-mod`'s one, `--every`'s, or the default powers of two up
/// to the most WRITEs outstanding, and `adaptive`), each once.
fn policies(args: &BenchArgs, outstanding: (u32, u64), adaptive: Policy) -> Result<Vec<Policy>> {
    let depth = args.tx_depth;
    let limit = outstanding.0;
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
    Ok(policies)
}

/// When each point ends: `-n`, `-D` (at most [`MAX_RUN`]), or the default of the mode.
fn stop(args: &BenchArgs, perftest: bool) -> Result<Stop> {
    let stop = match (args.iters, args.duration) {
        (Some(0), _) => bail!("-n 0: zero iterations measure nothing"),
        (Some(n), _) => Stop::Iters(n),
        (None, Some(d)) if d.is_zero() => bail!("-D 0: a duration of zero measures nothing"),
        (None, Some(d)) if d > MAX_RUN => {
            bail!("-D {d:?}: at most a day ({:?}) per point", MAX_RUN)
        }
        (None, Some(d)) => Stop::Duration(d),
        (None, None) if perftest => Stop::Iters(PERFTEST_ITERS),
        (None, None) => Stop::Duration(DEFAULT_DURATION),
    };
    Ok(stop)
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
pub(crate) fn buffers(region: u64, depth: u32, size: u64) -> u32 {
    (region / size.max(1)).min(u64::from(depth)) as u32
}

impl Plan {
    /// Whether every WRITE owns a buffer of the pattern of its slot (not perftest mode,
    /// not inline data).
    pub(crate) fn sweep_with_buffers(&self) -> bool {
        !self.perftest && !self.inline
    }
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
}
