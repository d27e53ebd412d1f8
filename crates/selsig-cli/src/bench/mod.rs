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
//!
//! With `--qp N` (perftest's -q) perftest mode runs N queue pairs on one completion queue,
//! posted round robin from one thread, and reports them as one.
//!
//! Files depend one way, each on files before it only: `units`; `options`; `host` (units);
//! `report` (host, in a doc link); `plan` (options, host); `table` and `chart` (report,
//! units); `tally` (report); `perftest` (host); `run` (all the others but table and
//! chart). This file only
//! names them, and re-exports what `main.rs` calls.

pub mod chart;
mod host;
mod options;
mod perftest;
mod plan;
mod report;
mod run;
mod table;
mod tally;
mod units;

pub use options::BenchArgs;
pub use plan::plan;
pub use report::load_report;
pub use run::bench;
pub use table::{render, render_perftest, warnings};
