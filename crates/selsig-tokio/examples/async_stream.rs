//! An async program streaming RDMA WRITEs from 8 queue pairs over one completion queue:
//! one task per queue pair, each with its own buffers, signaling every 16th WRITE; one
//! poller task sleeps on the CQ's completion events and routes each completion to its
//! queue. Every task checks that its WRITEs retire in posting order, each completed, its
//! buffer back; the program then checks every byte that landed.
//!
//! ```text
//! cargo run -p selsig-tokio --example async_stream                 # the soft NIC
//! async_stream --device rxe0 --gid-index 1 --writes 2000           # a verbs device
//! ```

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use clap::Parser;
use selsig::{
    Access, Buffer, ConnectOptions, Device, MemoryRegion, Outcome, Policy, QpCaps, QpInit,
    QueueConfig, connect_pair,
};
use selsig_soft::{SoftConfig, SoftDevice};
use selsig_tokio::{AsyncCq, AsyncQueue};
use selsig_verbs::{VerbsDevice, VerbsOptions};

const QPS: usize = 8;
const SIZE: usize = 256;
const BUFFERS: usize = 32;

#[derive(Parser)]
struct Args {
    /// `soft` (the software NIC in this process), or the name of a verbs device.
    #[arg(long, default_value = "soft")]
    device: String,
    /// The GID index, for a RoCE device.
    #[arg(long)]
    gid_index: Option<u8>,
    /// WRITEs per queue pair.
    #[arg(long, default_value_t = 10_000)]
    writes: u64,
    /// Signal every N-th WRITE.
    #[arg(long, default_value_t = 16)]
    every: u32,
}

type Error = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let args = Args::parse();
    let result = if args.device == "soft" {
        match SoftDevice::open(SoftConfig::default()) {
            Ok(dev) => stream(dev, ConnectOptions::default(), &args).await,
            Err(e) => Err(e.into()),
        }
    } else {
        let options = VerbsOptions {
            device: Some(args.device.clone()),
            gid_index: args.gid_index,
            ..VerbsOptions::default()
        };
        match VerbsDevice::open(&options) {
            Ok(dev) => {
                let connect = ConnectOptions {
                    gid_index: dev.gid_index(),
                    ..ConnectOptions::default()
                };
                stream(dev, connect, &args).await
            }
            Err(e) => Err(e.into()),
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("async_stream: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn stream<D: Device + 'static>(
    dev: D,
    options: ConnectOptions,
    args: &Args,
) -> Result<(), Error> {
    let pd = dev.alloc_pd()?;
    // One CQ for the sends of all 8 queue pairs: fewer entries than they could have
    // outstanding (8 x 64); the queues share its credits.
    let cq = Arc::new(dev.create_cq(255)?);
    let acq = AsyncCq::<D>::new(Arc::clone(&cq))?;
    let remote = dev.reg_mr(&pd, QPS * SIZE, Access::LOCAL_WRITE | Access::REMOTE_WRITE)?;
    let init = QpInit {
        caps: QpCaps {
            max_send_wr: 64,
            max_recv_wr: 1,
            ..QpCaps::default()
        },
        sq_sig_all: false,
    };
    let start = Instant::now();
    let mut tasks = Vec::new();
    let mut keep = Vec::new();
    for k in 0..QPS {
        // The receive side's CQs are apart: the shared CQ's credits are all for sends.
        let (recv_cq, cq_b) = (dev.create_cq(1)?, dev.create_cq(1)?);
        let a = dev.create_qp(&pd, &cq, &recv_cq, &init)?;
        let b = dev.create_qp(&pd, &cq_b, &cq_b, &init)?;
        connect_pair(&a, &b, &options)?;
        let local = dev.reg_mr(&pd, BUFFERS * SIZE, Access::LOCAL_WRITE)?;
        let free = Buffer::new(local)
            .split_into(BUFFERS, SIZE)
            .map_err(|_| "cannot split the buffers")?
            .0;
        let config = QueueConfig::with_policy(Policy::Every(args.every));
        let queue: AsyncQueue<D, u64> = AsyncQueue::new(&acq, a, config).map_err(|e| e.error)?;
        let target = remote.remote(k * SIZE);
        tasks.push(tokio::spawn(writer(k, queue, free, target, args.writes)));
        keep.push((b, recv_cq, cq_b));
    }
    let mut cqes = 0;
    for task in tasks {
        cqes += task.await??;
    }
    let elapsed = start.elapsed();
    let total = QPS as u64 * args.writes;
    let mut landed = vec![0u8; QPS * SIZE];
    remote.read(0, &mut landed)?;
    let last = last_byte(args.writes);
    if landed.iter().any(|&b| b != last) {
        return Err("a queue pair's last WRITE did not land".into());
    }
    println!(
        "{QPS} queue pairs, one CQ: {total} WRITEs of {SIZE} B retired in order, {cqes} completions \
         ({:.1} per 1000), in {elapsed:.2?} ({:.2} M WRITEs/s)",
        cqes as f64 * 1000.0 / total as f64,
        total as f64 / elapsed.as_secs_f64() / 1e6,
    );
    drop(keep);
    Ok(())
}

/// The byte WRITE `n` of a queue pair carries.
fn last_byte(writes: u64) -> u8 {
    (writes.saturating_sub(1) % 251) as u8
}

/// One queue pair's task: streams `writes` WRITEs to `target` from its buffers, taking
/// each buffer back as its WRITE retires. Returns the completions it needed.
async fn writer<D: Device>(
    k: usize,
    mut queue: AsyncQueue<D, u64>,
    mut free: Vec<Buffer<D::Mr>>,
    target: selsig::RemoteAddr,
    writes: u64,
) -> Result<u64, Error> {
    let (mut posted, mut next) = (0u64, 0u64);
    while next < writes {
        while posted < writes {
            let Some(mut buf) = free.pop() else { break };
            buf.fill((posted % 251) as u8)?;
            queue
                .post(selsig::Work::write(buf, target, posted))
                .await
                .map_err(|e| format!("QP {k}: {e}"))?;
            posted += 1;
        }
        // Waits for the next retired WRITE (a tail left unsignaled is confirmed).
        let done = queue.next().await.ok_or("nothing outstanding")??;
        if done.user != next || done.outcome != Outcome::Completed {
            return Err(format!(
                "QP {k}: WRITE {} {:?}, expected {next}",
                done.user, done.outcome
            )
            .into());
        }
        free.push(done.buffer.ok_or("a WRITE's buffer did not come back")?);
        next += 1;
    }
    queue.drain(std::time::Duration::from_secs(10)).await?;
    Ok(queue.queue().stats().cqes)
}
