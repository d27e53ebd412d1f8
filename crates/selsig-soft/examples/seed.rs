//! The seed example on the software NIC: 8 RDMA WRITEs of 64 bytes, every 4th signaled.
//! The CQ holds only CQE4 and CQE8; each hands back its four buffers, in order.

use std::sync::Arc;
use std::time::Duration;

use selsig::{
    Access, Buffer, ConnectOptions, Device, MemoryRegion, Policy, QpCaps, QpInit, SignaledQueue,
    Work, connect_pair,
};
use selsig_soft::{SoftConfig, SoftDevice};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dev = SoftDevice::open(SoftConfig::default())?;
    let pd = dev.alloc_pd()?;
    let cq = Arc::new(dev.create_cq(16)?);
    // RDMA WRITEs only: one receive slot (every receive would complete on this CQ too).
    let init = QpInit {
        caps: QpCaps {
            max_send_wr: 16,
            max_recv_wr: 1,
            ..QpCaps::default()
        },
        sq_sig_all: false,
    };
    let qp = dev.create_qp(&pd, &cq, &cq, &init)?;
    let peer = dev.create_qp(&pd, &cq, &cq, &init)?;
    connect_pair(&qp, &peer, &ConnectOptions::default())?;
    let remote = dev.reg_mr(&pd, 8 * 64, Access::LOCAL_WRITE | Access::REMOTE_WRITE)?;
    let local = Buffer::new(dev.reg_mr(&pd, 8 * 64, Access::LOCAL_WRITE)?);
    let (buffers, _) = local.split_into(8, 64).map_err(|_| "8 buffers fit")?;

    let mut queue: SignaledQueue<SoftDevice, u32> = SignaledQueue::new(qp, cq, Policy::Every(4))?;
    for (i, mut buf) in buffers.into_iter().enumerate() {
        let wr = i as u32 + 1;
        buf.fill(wr as u8)?;
        // The buffer moves into the queue: it cannot be touched until it comes back.
        let posted = queue.post(Work::write(buf, remote.remote(i * 64), wr))?;
        println!(
            "WR{wr}: seq {}, wr_id {:#x}, {}",
            posted.seq,
            posted.wr_id,
            if posted.signaled() {
                "signaled"
            } else {
                "unsignaled"
            }
        );
    }
    let mut done = Vec::new();
    queue.drain(Duration::from_secs(5), &mut done)?;
    for c in &done {
        println!(
            "WR{} {} (buffer back: {})",
            c.user,
            c.outcome,
            c.buffer.is_some()
        );
    }
    let s = queue.stats();
    println!("{} WRs, {} CQEs", s.posted, s.cqes);
    for wr in 1..=8u8 {
        let mut landed = [0u8; 64];
        remote.read((wr as usize - 1) * 64, &mut landed)?;
        assert!(landed.iter().all(|&b| b == wr), "WR{wr} landed");
    }
    println!("remote memory holds all 8 writes");
    drop(peer);
    Ok(())
}
