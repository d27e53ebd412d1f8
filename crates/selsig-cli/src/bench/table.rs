//! The report as text: the table, its warnings and notes, and perftest's report lines.

use crate::bench::report::{Percentiles, Point, Report};
use crate::bench::units::{human_ns, human_size, per_1000, rate};

/// Round trips that vary over a run by more than this factor are flagged.
const ROUND_TRIP_WARN: f64 = 2.0;

/// Below this CPU share of the posting thread a point's figures are flagged
/// ([`Point::cpu_share`]).
const CPU_SHARE_WARN: f64 = 0.9;
/// Above this share of a point's wall time spent by the bench's threads waiting for a CPU,
/// its figures are flagged ([`Point::wait_share`]).
const WAIT_SHARE_WARN: f64 = 0.1;

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
        (Some(n), _) if s.qps > 1 => format!("{n} WRITEs per QP per point"),
        (Some(n), _) => format!("{n} WRITEs per point"),
        (None, Some(d)) => format!("{d} s per point"),
        _ => String::new(),
    };
    let _ = writeln!(
        out,
        "selsig bench: {} provider, {device}{}; RDMA WRITE, {}, send queue depth {} (capacity {}), up to {} per post{}, {run}",
        report.provider,
        s.remote
            .as_ref()
            .map_or(String::new(), |r| format!(" -> selsig serve at {r}")),
        s.queue_pairs(),
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

/// perftest's report lines, for scripts written for `ib_write_bw` (perftest_parameters.h:
/// `RESULT_LINE`, `RESULT_FMT` or `RESULT_FMT_G`, `REPORT_FMT`, and `REPORT_FMT_EXT` for
/// an average below 0.1 Gb/sec): MB = 2^20 bytes, or with `gbits` Gb = 10^9 bits. The
/// peak column is 0.00, as ib_write_bw prints it when it measures no peak (`-N`, or more
/// than 20000 iterations): this mode reads no clock per WRITE. The spacing is Debian 12's
/// perftest's, 4.5+0.17 (two tabs and three spaces before the message rate; upstream prints
/// five spaces since 24.07).
pub fn render_perftest(report: &Report, gbits: bool) -> String {
    use std::fmt::Write as _;
    const LINE: &str =
        "---------------------------------------------------------------------------------------";
    let unit = if gbits { "Gb/sec" } else { "MB/sec" };
    let mut out = String::new();
    let _ = writeln!(out, "{LINE}");
    let _ = writeln!(
        out,
        " #bytes     #iterations    BW peak[{unit}]    BW average[{unit}]   MsgRate[Mpps]"
    );
    for p in &report.points {
        let (size, wrs, peak) = (p.size, p.wrs, 0.0);
        let average = if gbits { p.gbit_per_sec } else { p.mib_per_sec };
        let _ = if gbits && average < 0.1 {
            writeln!(
                out,
                " {size:<7}    {wrs}           {peak:<7.6}            {average:<7.6}            {:<7.6}",
                p.mpps
            )
        } else {
            writeln!(
                out,
                " {size:<7}    {wrs:<10}       {peak:<7.2}            {average:<7.2}\t\t   {:<7.6}",
                p.mpps
            )
        };
    }
    let _ = writeln!(out, "{LINE}");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::report::MemcpyRef;
    use crate::bench::report::tests::{percentiles, report_of};

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
