//! The report of a sweep: what `--json` writes and `--from-json` reads back (checked), and
//! the histograms its percentiles come from.

use anyhow::{Context, Result, ensure};
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

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
    pub(crate) fn of(h: &Histogram<u64>) -> Option<Self> {
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
    /// ([`round_trip_ns`](crate::bench::host::round_trip_ns)). A completion crosses from the
    /// NIC's core to the application's, and the slot it frees goes back, so the points that
    /// signal often go at this speed; a virtual machine's host can move its CPUs meanwhile
    /// and change it several-fold. Null on other providers and in perftest mode.
    pub round_trip_ns: Option<[f64; 2]>,
    /// With several queue pairs (`--qp`): the WRITEs each completed, in order; left out
    /// with one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub wrs_per_qp: Vec<u64>,
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
    /// Queue pairs (`--qp`, perftest mode), each running `iters` WRITEs; left out when 1.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub qps: u32,
}

impl Settings {
    /// "one RC QP", or how many, round robin on one completion queue (`--qp`).
    pub(crate) fn queue_pairs(&self) -> String {
        match self.qps {
            1 => "one RC QP".to_string(),
            n => format!("{n} RC QPs round robin on one CQ"),
        }
    }
}

fn one() -> u32 {
    1
}

fn is_one(n: &u32) -> bool {
    *n == 1
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

pub(crate) fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, selsig::MAX_LAG_NS, 3).expect("valid bounds")
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

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

    /// `--qp`'s fields are written only with several queue pairs, and read back.
    #[test]
    fn several_queue_pairs_are_written_and_read_back() {
        let one = report_of(&[1.0]);
        let text = serde_json::to_string(&one).unwrap();
        assert!(
            !text.contains("qps") && !text.contains("wrs_per_qp"),
            "{text}"
        );
        let mut two = report_of(&[1.0]);
        two.settings.qps = 2;
        two.points[0].wrs_per_qp = vec![500, 500];
        let text = serde_json::to_string(&two).unwrap();
        assert!(text.contains(r#""qps":2"#), "{text}");
        assert!(text.contains(r#""wrs_per_qp":[500,500]"#), "{text}");
        let back: Report = serde_json::from_str(&text).unwrap();
        assert_eq!(back, two);
        let back: Report = serde_json::from_str(&serde_json::to_string(&one).unwrap()).unwrap();
        assert_eq!(back, one);
    }

    pub(crate) fn report_of(shares: &[f64]) -> Report {
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
            wrs_per_qp: vec![],
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
                qps: 1,
            },
            points: shares
                .iter()
                .enumerate()
                .map(|(i, &s)| point(i, s))
                .collect(),
            memcpy: vec![],
        }
    }

    /// Percentiles of 1000 samples whose mean is their p50.
    pub(crate) fn percentiles(p50_ns: u64, p99_ns: u64, max_ns: u64) -> Percentiles {
        Percentiles {
            count: 1000,
            p50_ns,
            p99_ns,
            max_ns,
            mean_ns: p50_ns as f64,
        }
    }
}
