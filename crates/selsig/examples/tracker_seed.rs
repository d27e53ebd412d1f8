//! The seed example on the bare tracker: 8 RDMA WRITEs, every 4th signaled. The NIC's
//! side is played by hand: only WR4 and WR8 produce a completion.

use std::time::Instant;

use selsig::{Policy, SendTracker, Signal, TrackerConfig, WcStatus, WorkCompletion};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let now = Instant::now();
    // Real capacities, as read back from QP and CQ creation.
    let config = TrackerConfig::new(16, 16).policy(Policy::Every(4));
    let mut tracker = SendTracker::new(config, now)?;

    let mut cqes = Vec::new();
    for wr in 1..=8u32 {
        let buffer = format!("payload of WR{wr}");
        let posted = tracker.post(buffer, Signal::Auto, now)?;
        let flag = if posted.signaled() { "S" } else { "U" };
        println!("post WR{wr} wr_id={} ({flag})", posted.seq);
        if posted.signaled() {
            // The NIC writes a CQE only for signaled work requests.
            cqes.push(WorkCompletion::new(posted.wr_id, WcStatus::Success, 0));
        }
    }
    for cqe in &cqes {
        let handled = tracker.handle_completion(cqe, now)?;
        print!("CQE{}: confirms", cqe.wr_id);
        while let Some(retired) = tracker.poll_retired() {
            print!(" WR{} ({})", retired.seq, retired.outcome);
        }
        println!("  [{} WRs]", handled.retired);
    }
    let stats = tracker.stats();
    println!(
        "{} WRs, {} CQEs, {:.1} WRs per CQE",
        stats.posted,
        stats.cqes,
        stats.mean_wrs_per_cqe()
    );
    Ok(())
}
