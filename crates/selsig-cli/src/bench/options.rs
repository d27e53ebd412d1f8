//! `selsig bench`'s options (clap): what the command line says, before any check.

use std::time::Duration;

use clap::Args;
use selsig::Policy;

use crate::common::{ProviderArgs, parse_size};

/// perftest's default send queue depth (`-t`).
pub const DEFAULT_TX_DEPTH: u32 = 128;

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
    /// Queue pairs, in perftest mode (perftest's -q): -n WRITEs on each, posted round robin
    /// from one thread, their completions on one completion queue; the table's
    /// #iterations is -n times this, the bandwidth theirs together.
    #[arg(
        allow_negative_numbers = true,
        long = "qp",
        short = 'q',
        default_value_t = 1,
        value_name = "N"
    )]
    pub qps: u32,
    /// Every size ib_write_bw's -a runs: 2, 4, ... 2^23 bytes (in perftest mode too).
    #[arg(long, short = 'a', conflicts_with = "sizes")]
    pub all: bool,
    /// perftest mode's table in Gb/sec (10^9 bits per second) instead of MB/sec (2^20
    /// bytes), as ib_write_bw --report_gbits prints it.
    #[arg(long = "report_gbits", alias = "report-gbits")]
    pub report_gbits: bool,
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
    /// How --connect connects the queue pairs: tcp (their numbers, PSNs and GIDs over
    /// selsig's TCP exchange) or rdma (rdma_cm: librdmacm resolves the address and the
    /// route, the region comes in the connection's private data; see docs/verbs.md).
    #[arg(long, value_enum, default_value_t = crate::remote::Cm::Tcp, requires = "connect", value_name = "HOW")]
    pub cm: crate::remote::Cm,
    /// Run nothing: read a report that --json wrote (FILE, or standard input with `-`)
    /// and print its table, or write it with --json and draw it with --svg, as after that
    /// run (a past run's chart, drawn again).
    #[arg(
        long,
        value_name = "FILE",
        conflicts_with_all = [
            "every", "cq_mod", "qps", "sizes", "all", "iters", "duration", "tx_depth", "post_list",
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
