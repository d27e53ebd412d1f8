//! A stream of RDMA WRITEs through `SignaledQueue` on the software NIC, for profiling.
//!
//! Usage: `stream [SIZE] [EVERY] [COUNT] [DEPTH]` (defaults 64 64 10000000 1024).
//! Build with `--profile profiling` (optimized, with symbols) for `perf`.

use std::sync::Arc;
use std::time::Instant;

use selsig::{
    Access, Buffer, ConnectOptions, Device, MemoryRegion, Policy, QpCaps, QpInit, SignaledQueue,
    Work, connect_pair,
};
use selsig_soft::{SoftConfig, SoftDevice};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let size: usize = args.next().map_or(Ok(64), |a| a.parse())?;
    let every: u32 = args.next().map_or(Ok(64), |a| a.parse())?;
    let count: u64 = args.next().map_or(Ok(10_000_000), |a| a.parse())?;
    let depth: u32 = args.next().map_or(Ok(1024), |a| a.parse())?;

    let dev = SoftDevice::open(SoftConfig::default())?;
    let pd = dev.alloc_pd()?;
    let cq = Arc::new(dev.create_cq(2 * depth)?);
    let init = QpInit {
        caps: QpCaps {
            max_send_wr: depth,
            // RDMA WRITEs only: one receive slot (every receive would complete on this CQ).
            max_recv_wr: 1,
            ..QpCaps::default()
        },
        sq_sig_all: false,
    };
    let a = dev.create_qp(&pd, &cq, &cq, &init)?;
    let b = dev.create_qp(&pd, &cq, &cq, &init)?;
    connect_pair(&a, &b, &ConnectOptions::default())?;
    let n = depth as usize;
    let local = dev.reg_mr(&pd, n * size, Access::LOCAL_WRITE)?;
    let remote = dev.reg_mr(&pd, n * size, Access::LOCAL_WRITE | Access::REMOTE_WRITE)?;
    let (mut free, _) = Buffer::new(local)
        .split_into(n, size)
        .map_err(|_| "the region holds the buffers")?;
    let mut queue: SignaledQueue<SoftDevice, ()> = SignaledQueue::new(a, cq, Policy::Every(every))?;
    let target = remote.remote(0);
    let mut done = Vec::with_capacity(n);
    let (mut posted, mut retired) = (0u64, 0u64);
    let start = Instant::now();
    while retired < count {
        if posted < count && !free.is_empty() {
            // No more than the queue takes now: the drain drops what it does not yield.
            let room = free.len().min(32).min(queue.available() as usize);
            let k = (room as u64).min(count - posted) as usize;
            let at = free.len() - k;
            let mut works = free.drain(at..).map(|buf| {
                let t = target.offset(buf.offset() as u64);
                Work::write(buf, t, ())
            });
            posted += queue.post_batch(&mut works)? as u64;
        }
        if posted == count {
            queue.confirm_all()?;
        }
        queue.poll(&mut done)?;
        retired += done.len() as u64;
        free.extend(done.drain(..).filter_map(|c| c.buffer));
    }
    let elapsed = start.elapsed();
    println!(
        "{count} WRITEs of {size} B, signaled every {every}, depth {depth}: {:.1} ns/WR, {:.2} M WR/s",
        elapsed.as_nanos() as f64 / count as f64,
        count as f64 / elapsed.as_secs_f64() / 1e6
    );
    drop(b);
    Ok(())
}
