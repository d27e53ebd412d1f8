//! The bare tracker over libibverbs: the program creates its queue pairs through
//! `selsig-verbs`, posts and polls them itself, and only asks `SendTracker` which work
//! requests to signal, with which `wr_id`, and what each completion retired. 8 RDMA
//! WRITEs of 64 bytes, every 4th signaled (only CQE4 and CQE8); `--fail-at K` gives WR K a
//! bad rkey (it fails, the later ones are flushed). The target memory is checked against
//! the outcomes; the exit code is 1 when anything differs.
//!
//! `tracker_seed [--device NAME] [--gid-index N] [--fail-at K]` (on a host with an RDMA
//! device; CI runs it on Soft-RoCE in the project's VM).

use std::time::{Duration, Instant};

use selsig::{
    Access, CompletionQueue, ConnectOptions, Device, Local, MemoryRegion, Opcode, Outcome, Policy,
    QpCaps, QpInit, QueuePair, SendTracker, SendWr, Signal, TrackerConfig, WcStatus,
    WorkCompletion, connect_pair,
};
use selsig_verbs::{VerbsDevice, VerbsOptions};

const WRS: usize = 8;
const SIZE: usize = 64;

type Error = Box<dyn std::error::Error>;

fn main() {
    if let Err(e) = run() {
        eprintln!("tracker_seed: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), Error> {
    let mut options = VerbsOptions::default();
    let mut fail_at = None;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or(format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--device" => options.device = Some(value),
            "--gid-index" => options.gid_index = Some(value.parse()?),
            "--fail-at" => {
                fail_at = Some(value.parse::<usize>()?).filter(|k| (1..=WRS).contains(k))
            }
            _ => return Err(format!("unknown option {flag}").into()),
        }
    }
    let dev = VerbsDevice::open(&options)?;
    let pd = dev.alloc_pd()?;
    let cq = dev.create_cq(16)?;
    let peer_cq = dev.create_cq(16)?;
    let init = QpInit {
        caps: QpCaps {
            max_send_wr: 16,
            max_recv_wr: 1,
            ..QpCaps::default()
        },
        sq_sig_all: false,
    };
    let qp = dev.create_qp(&pd, &cq, &peer_cq, &init)?;
    let peer = dev.create_qp(&pd, &peer_cq, &peer_cq, &init)?;
    let connect = ConnectOptions {
        gid_index: dev.gid_index(),
        ..ConnectOptions::default()
    };
    connect_pair(&qp, &peer, &connect)?;
    let src = dev.reg_mr(&pd, WRS * SIZE, Access::LOCAL_WRITE)?;
    let dst = dev.reg_mr(&pd, WRS * SIZE, Access::LOCAL_WRITE | Access::REMOTE_WRITE)?;
    let pattern: Vec<u8> = (0..WRS * SIZE).map(|i| (i / SIZE + 1) as u8).collect();
    src.write(0, &pattern)?;

    // The tracker, with the capacities the device read back.
    let config = TrackerConfig::new(qp.caps().max_send_wr, cq.capacity())
        .policy(Policy::Every(4))
        .qp_num(qp.qp_num());
    let mut tracker: SendTracker<usize> = SendTracker::new(config, Instant::now())?;
    let mut wrs = Vec::new();
    tracker.post_batch(0..WRS, Signal::Auto, Instant::now(), |p| {
        let i = wrs.len();
        let mut remote = dst.remote(i * SIZE);
        if fail_at == Some(i + 1) {
            remote.rkey ^= 0x5a5a5a;
        }
        wrs.push(SendWr {
            wr_id: p.wr_id,
            opcode: Opcode::RdmaWrite,
            local: Local::Sge(src.sge(i * SIZE, SIZE as u32)),
            remote,
            imm_data: 0,
            signaled: p.signaled(),
        });
    })?;
    if let Err(e) = qp.post_send(&wrs) {
        // Those from the first not posted on come back (none if all were).
        let from = wrs
            .get(e.index)
            .and_then(|w| tracker.seq_of(w.wr_id))
            .unwrap_or(tracker.next_seq());
        let back: Vec<usize> = tracker.rollback(from)?.collect();
        return Err(format!("post failed ({e}); WRITEs {back:?} handed back").into());
    }
    let line: Vec<String> = wrs
        .iter()
        .enumerate()
        .map(|(i, w)| format!("WR{}({})", i + 1, if w.signaled { "S" } else { "U" }))
        .collect();
    println!("Send queue: {}", line.join(" "));

    // Poll the CQ, hand each completion to the tracker, collect what it retired.
    let mut outcomes = Vec::new();
    let mut wcs = [WorkCompletion::new(0, WcStatus::Success, 0); 16];
    let start = Instant::now();
    while outcomes.len() < WRS {
        if start.elapsed() > Duration::from_secs(20) {
            return Err(format!("no completion for 20 s, {} retired", outcomes.len()).into());
        }
        let n = cq.poll(&mut wcs)?;
        for wc in &wcs[..n] {
            let handled = tracker.handle_completion(wc, Instant::now())?;
            let mut text = format!("CQE{}: {}:", handled.seq, wc.status);
            tracker.poll_retired_with(|r| {
                text += &format!(" WR{} {}", r.payload + 1, r.outcome);
                outcomes.push((r.payload, r.outcome));
            });
            println!("{text}");
        }
    }

    let mut landed = vec![0u8; WRS * SIZE];
    dst.read(0, &mut landed)?;
    let mut ok = true;
    for (i, &(index, outcome)) in outcomes.iter().enumerate() {
        let want = match fail_at {
            Some(k) if i + 1 == k => Outcome::Failed(WcStatus::RemAccessErr),
            Some(k) if i + 1 > k => Outcome::Flushed,
            _ => Outcome::Completed,
        };
        let same = landed[i * SIZE..(i + 1) * SIZE] == pattern[i * SIZE..(i + 1) * SIZE];
        if index != i || outcome != want || same != (want == Outcome::Completed) {
            eprintln!(
                "WR{}: {outcome} (landed: {same}), expected WR{} {want}",
                index + 1,
                i + 1
            );
            ok = false;
        }
    }
    let cqes = tracker.stats().cqes;
    if fail_at.is_none() && cqes != 2 {
        eprintln!("{cqes} CQEs, expected 2 (CQE4 and CQE8)");
        ok = false;
    }
    println!(
        "{cqes} CQEs for {WRS} WRs; {}",
        if ok { "verified" } else { "NOT verified" }
    );
    drop((qp, peer));
    match ok {
        true => Ok(()),
        false => Err("the outcomes or the memory differ from what the semantics say".into()),
    }
}
