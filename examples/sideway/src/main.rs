//! The seed of selective signaling on a queue pair the program owns, made with `sideway`:
//! 8 RDMA WRITEs of 64 bytes, posted with sideway's `ibv_wr_*` API, selsig's tracker
//! deciding the signal flag and the `wr_id` of each (every 4th signaled: the CQ gets only
//! CQE4 and CQE8), sideway's CQ polled into the tracker, and every buffer handed back in
//! posting order with its outcome. `--fail-at K` gives WR K a bad rkey: it fails, the
//! later ones are flushed. The target memory is checked against the outcomes; the exit
//! code is 1 when anything differs.
//!
//! `selsig-sideway-seed [--device NAME] [--gid-index N] [--fail-at K]`

use std::sync::Arc;
use std::time::{Duration, Instant};

use selsig::{
    Outcome, Policy, SendTracker, Signal, TrackerConfig, WcOpcode, WcStatus, WorkCompletion,
};
use sideway::ibverbs::AccessFlags;
use sideway::ibverbs::address::AddressHandleAttribute;
use sideway::ibverbs::completion::{GenericCompletionQueue, GenericWorkCompletion};
use sideway::ibverbs::device::{DeviceInfo, DeviceList};
use sideway::ibverbs::queue_pair::{
    PostSendGuard, QueuePair, QueuePairAttribute, QueuePairAttributeMask, QueuePairState,
    SetScatterGatherEntry, WorkRequestFlags,
};

const WRS: usize = 8;
const SIZE: usize = 64;
const DEPTH: u32 = 16;

type Error = Box<dyn std::error::Error>;

/// A completion as selsig takes it, from sideway's. sideway gives no QP number: this
/// program's CQ serves one QP, so the tracker checks none.
fn work_completion(wc: &GenericWorkCompletion<'_>) -> WorkCompletion {
    let status = WcStatus::try_from(wc.status()).unwrap_or(WcStatus::GeneralErr);
    let opcode = match status.is_success() {
        true => WcOpcode::try_from(wc.opcode()).ok(),
        // An error's opcode is undefined (ibv_poll_cq(3)): not read.
        false => None,
    };
    WorkCompletion {
        opcode,
        ..WorkCompletion::new(wc.wr_id(), status, 0)
    }
}

struct Args {
    device: Option<String>,
    gid_index: u8,
    fail_at: Option<usize>,
}

fn args() -> Result<Args, Error> {
    let mut args = Args {
        device: None,
        gid_index: 1,
        fail_at: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--device" => args.device = Some(value()?),
            "--gid-index" => args.gid_index = value()?.parse()?,
            "--fail-at" => {
                let k: usize = value()?.parse()?;
                if !(1..=WRS).contains(&k) {
                    return Err(format!("--fail-at {k}: expected 1 to {WRS}").into());
                }
                args.fail_at = Some(k);
            }
            _ => {
                return Err(format!(
                    "unknown option {flag}: [--device NAME] [--gid-index N] [--fail-at K]"
                )
                .into());
            }
        }
    }
    Ok(args)
}

/// RESET -> INIT -> RTR -> RTS towards `dest` on port 1 of the same device.
fn connect(
    qp: &mut impl QueuePair,
    dest: u32,
    gid: &sideway::ibverbs::address::Gid,
    gid_index: u8,
    mtu: sideway::ibverbs::device_context::Mtu,
) -> Result<(), Error> {
    let mut attr = QueuePairAttribute::new();
    attr.setup_state(QueuePairState::Init)
        .setup_pkey_index(0)
        .setup_port(1)
        .setup_access_flags(AccessFlags::LocalWrite | AccessFlags::RemoteWrite);
    qp.modify(&attr)?;
    let mut ah = AddressHandleAttribute::new();
    ah.setup_dest_lid(1)
        .setup_port(1)
        .setup_service_level(0)
        .setup_grh_src_gid_index(gid_index)
        .setup_grh_dest_gid(gid)
        .setup_grh_hop_limit(64);
    let mut attr = QueuePairAttribute::new();
    attr.setup_state(QueuePairState::ReadyToReceive)
        .setup_path_mtu(mtu)
        .setup_dest_qp_num(dest)
        .setup_rq_psn(0)
        .setup_max_dest_read_atomic(1)
        .setup_min_rnr_timer(12)
        .setup_address_vector(&ah);
    qp.modify(&attr)?;
    let mut attr = QueuePairAttribute::new();
    attr.setup_state(QueuePairState::ReadyToSend)
        .setup_sq_psn(0)
        .setup_timeout(14)
        .setup_retry_cnt(7)
        .setup_rnr_retry(7)
        .setup_max_read_atomic(1);
    qp.modify(&attr)?;
    Ok(())
}

fn main() {
    if let Err(e) = run() {
        eprintln!("selsig-sideway-seed: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), Error> {
    let args = args()?;
    let list = DeviceList::new()?;
    let device = match &args.device {
        Some(name) => list
            .iter()
            .find(|d| d.name() == *name)
            .ok_or(format!("no device {name}"))?,
        None => list.iter().next().ok_or("no RDMA device")?,
    };
    let ctx = device.open()?;
    let mtu = ctx.query_port(1)?.active_mtu();
    let gid = ctx.query_gid(1, args.gid_index.into())?;
    let pd = ctx.alloc_pd()?;
    // The buffers: each WRITE's source is one 64-byte slice of `src`, its target the same
    // slice of `dst`.
    let src: Vec<u8> = (0..WRS * SIZE).map(|i| (i / SIZE + 1) as u8).collect();
    let dst = vec![0u8; WRS * SIZE];
    // SAFETY: both vectors outlive the regions (dropped at the end of this function, after
    // the QPs and regions), and nothing else writes `dst` while the NIC may.
    let (src_mr, dst_mr) = unsafe {
        (
            pd.reg_mr(src.as_ptr() as usize, src.len(), AccessFlags::LocalWrite)?,
            pd.reg_mr(
                dst.as_ptr() as usize,
                dst.len(),
                AccessFlags::LocalWrite | AccessFlags::RemoteWrite,
            )?,
        )
    };
    let cq = ctx.create_cq_builder().setup_cqe(DEPTH).build_ex()?;
    let peer_cq = ctx.create_cq_builder().setup_cqe(DEPTH).build_ex()?;
    let mut qp = pd
        .create_qp_builder()
        .setup_send_cq(GenericCompletionQueue::from(Arc::clone(&cq)))
        .setup_recv_cq(GenericCompletionQueue::from(Arc::clone(&peer_cq)))
        .setup_max_send_wr(DEPTH)
        .setup_max_recv_wr(1)
        .build_ex()?;
    let mut peer = pd
        .create_qp_builder()
        .setup_send_cq(GenericCompletionQueue::from(Arc::clone(&peer_cq)))
        .setup_recv_cq(GenericCompletionQueue::from(Arc::clone(&peer_cq)))
        .setup_max_send_wr(DEPTH)
        .setup_max_recv_wr(1)
        .build_ex()?;
    connect(&mut qp, peer.qp_number(), &gid, args.gid_index, mtu)?;
    connect(&mut peer, qp.qp_number(), &gid, args.gid_index, mtu)?;

    // The tracker, with the send queue's capacity as the device read it back, and the CQ's
    // as asked (a CQ is made at least that large).
    let (_, init) = qp.query(QueuePairAttributeMask::Capabilities)?;
    let config = TrackerConfig::new(init.max_send_wr(), DEPTH).policy(Policy::Every(4));
    let mut tracker: SendTracker<usize> = SendTracker::new(config, Instant::now())?;
    println!(
        "selsig-sideway-seed: {WRS} RDMA WRITEs of {SIZE} B on {}, every 4th signaled, send queue depth {}",
        device.name(),
        init.max_send_wr()
    );

    // Post all 8 with one ibv_wr_complete: each WRITE's payload in the tracker is its index.
    let mut decisions = Vec::new();
    tracker.post_batch(0..WRS, Signal::Auto, Instant::now(), |p| decisions.push(p))?;
    let mut guard = qp.start_post_send();
    let mut line = String::from("Send queue:");
    for (i, p) in decisions.iter().enumerate() {
        let flags = match p.signaled() {
            true => WorkRequestFlags::Signaled,
            false => WorkRequestFlags::none(),
        };
        let rkey = dst_mr.rkey()
            ^ if args.fail_at == Some(i + 1) {
                0x5a5a5a
            } else {
                0
            };
        let remote = dst.as_ptr() as u64 + (i * SIZE) as u64;
        let write = guard.construct_wr(p.wr_id, flags).setup_write(rkey, remote);
        // SAFETY: the source slice lies in `src_mr` and outlives the WRITE.
        unsafe {
            write.setup_sge(
                src_mr.lkey(),
                src.as_ptr() as u64 + (i * SIZE) as u64,
                SIZE as u32,
            )
        };
        line += &format!(" WR{}({})", i + 1, if p.signaled() { "S" } else { "U" });
    }
    println!("{line}");
    if let Err(e) = guard.post() {
        // ibv_wr_complete posts all or nothing: every WRITE comes back.
        let back: Vec<usize> = tracker.rollback(decisions[0].seq)?.collect();
        return Err(format!("the post failed ({e}); WRITEs {back:?} handed back").into());
    }

    // Poll sideway's CQ into the tracker until every WRITE is retired.
    let (mut outcomes, start) = (Vec::new(), Instant::now());
    while outcomes.len() < WRS {
        if start.elapsed() > Duration::from_secs(20) {
            return Err(format!(
                "no completion for 20 s, {} of {WRS} retired",
                outcomes.len()
            )
            .into());
        }
        let Ok(poller) = cq.start_poll() else {
            continue;
        };
        for wc in poller {
            let wc = work_completion(&GenericWorkCompletion::Extended(wc));
            let handled = tracker.handle_completion(&wc, Instant::now())?;
            let mut text = format!("CQE{}: {}:", handled.seq, wc.status);
            while let Some(r) = tracker.poll_retired() {
                text += &format!(" WR{} {}", r.payload + 1, r.outcome);
                outcomes.push((r.payload, r.outcome));
            }
            println!("{text}");
        }
    }

    // Every outcome as the semantics say, in posting order, and the memory to match.
    let mut ok = true;
    let mut landed = 0;
    for (i, &(index, outcome)) in outcomes.iter().enumerate() {
        let want = match args.fail_at {
            Some(k) if i + 1 == k => Outcome::Failed(WcStatus::RemAccessErr),
            Some(k) if i + 1 > k => Outcome::Flushed,
            _ => Outcome::Completed,
        };
        let same = dst[i * SIZE..(i + 1) * SIZE] == src[i * SIZE..(i + 1) * SIZE];
        landed += usize::from(same);
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
    println!("Remote buffer: {landed} of {WRS} writes landed; {cqes} CQEs for {WRS} WRs.");
    if args.fail_at.is_none() && cqes != 2 {
        eprintln!("{cqes} CQEs, expected 2 (CQE4 and CQE8)");
        ok = false;
    }
    drop((qp, peer));
    println!("{}", if ok { "verified" } else { "NOT verified" });
    match ok {
        true => Ok(()),
        false => Err("the outcomes or the memory differ from what the semantics say".into()),
    }
}
