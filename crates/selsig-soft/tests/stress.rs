//! Multi-threaded stress of the software NIC through `SignaledQueue`: several application
//! threads, each with its own connected QP pair on one device (one NIC thread serves them
//! all), post millions of RDMA WRITEs of random sizes, buffered (one in eight a gather list
//! of three pieces of the buffer) and inline, one at a time
//! and in post lists of up to 127 (the long ones streamed into the send queue, see
//! `ring.rs`), under random signaling policies, and verify every byte that lands.
//!
//! The number of work requests per thread is `SELSIG_STRESS_WRS` (default 700 000, so
//! about two million in all); the valgrind run (`scripts/valgrind-stress.sh`) sets a
//! small one.

use std::sync::Arc;
use std::time::{Duration, Instant};

use selsig::{
    Access, Buffer, ConnectOptions, Device, MemoryRegion, Opcode, Outcome, Policy, QpCaps, QpInit,
    RemoteAddr, SignaledQueue, Work, connect_pair,
};
use selsig_soft::{Personality, SoftConfig, SoftDevice, SoftMr};

const THREADS: u64 = 3;
const SLOT: usize = 2048;
const BUFFERS: usize = 160;
/// The shortest post list the soft NIC streams (`ring::STREAM_MIN`).
const LONG_LIST: usize = 64;

/// xorshift64*: random enough for choosing sizes and policies, and reproducible.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn pattern(thread: u64, seq: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (seq.wrapping_mul(131) ^ thread.wrapping_mul(17)).wrapping_add(i as u64) as u8)
        .collect()
}

/// What travels with each work request: where it lands and what it wrote.
#[derive(Debug)]
struct Sent {
    slot: usize,
    seq: u64,
    len: usize,
}

/// The WRITE of `head`: one time in eight (when it has 3 bytes or more), a gather list of
/// it cut in three pieces of random lengths.
fn write(
    rng: &mut Rng,
    head: Buffer<SoftMr>,
    target: RemoteAddr,
    sent: Sent,
) -> Work<'static, SoftMr, Sent> {
    let len = head.len();
    if len < 3 || rng.below(8) != 0 {
        return Work::write(head, target, sent);
    }
    let first = 1 + rng.below(len as u64 - 2) as usize;
    let (a, rest) = head.split_at(first).expect("first < len");
    let second = 1 + rng.below((len - first - 1) as u64) as usize;
    let (b, c) = rest.split_at(second).expect("second < len - first");
    Work::list(Opcode::RdmaWrite, vec![a, b, c], target, sent)
}

fn wrs_per_thread() -> u64 {
    std::env::var("SELSIG_STRESS_WRS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if cfg!(miri) { 1_000 } else { 700_000 })
}

fn run_thread(dev: SoftDevice, thread: u64, total: u64) -> (u64, u64) {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (thread + 1).wrapping_mul(0x1234_5678_9abc));
    let pd = dev.alloc_pd().expect("pd");
    let cq = Arc::new(dev.create_cq(256).expect("cq"));
    let depth = [8u32, 32, 128][thread as usize % 3];
    let init = QpInit {
        caps: QpCaps {
            max_send_wr: depth,
            max_inline_data: 64,
            // Gather lists of three (the WQE is as large as 64 bytes of inline data make it).
            max_send_sge: 3,
            ..QpCaps::default()
        },
        sq_sig_all: false,
    };
    let a = dev.create_qp(&pd, &cq, &cq, &init).expect("qp");
    let b = dev.create_qp(&pd, &cq, &cq, &init).expect("qp");
    connect_pair(&a, &b, &ConnectOptions::default()).expect("connect");
    let local = dev
        .reg_mr(&pd, BUFFERS * SLOT, Access::LOCAL_WRITE)
        .expect("mr");
    // Buffered WRITEs land in slots 0..BUFFERS, inline ones in the slots after them.
    let inline_slots = 2 * depth as usize;
    let remote: SoftMr = dev
        .reg_mr(
            &pd,
            (BUFFERS + inline_slots) * SLOT,
            Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        )
        .expect("mr");
    let (mut free, _) = Buffer::new(local).split_into(BUFFERS, SLOT).expect("split");
    let policies = [
        Policy::Every(1 + rng.below(64) as u32),
        Policy::Never,
        Policy::Always,
        Policy::Adaptive {
            max_unsignaled: 1 + rng.below(32) as u32,
            max_lag: Duration::from_micros(rng.below(50)),
        },
    ];
    let policy = policies[thread as usize % policies.len()];
    let mut queue: SignaledQueue<SoftDevice, Sent> =
        SignaledQueue::new(a, cq, policy).expect("queue");
    let mut done = Vec::new();
    // The unsent tails of buffers in flight, until their heads come back.
    let mut rests: Vec<Buffer<SoftMr>> = Vec::new();
    let (mut posted, mut retired, mut bytes) = (0u64, 0u64, 0u64);
    let mut inline_seq = 0usize;
    let start = Instant::now();
    while retired < total {
        while posted < total && queue.available() > 0 {
            // A queue deep enough for long lists alternates phases of 4096 work requests
            // posted one at a time and in lists, for which it waits for room.
            let lists = depth as usize >= 2 * LONG_LIST
                && (posted / 4096) % 2 == 1
                && total - posted >= LONG_LIST as u64;
            if lists {
                let room = (queue.available() as usize).min(free.len());
                if room < LONG_LIST {
                    break;
                }
                // A post list of buffered WRITEs, long enough to be streamed.
                let n = room
                    .min(LONG_LIST + rng.below(LONG_LIST as u64) as usize)
                    .min((total - posted) as usize);
                let mut works = Vec::with_capacity(n);
                for seq in posted..posted + n as u64 {
                    let len = 1 + rng.below(SLOT as u64) as usize;
                    let mut buf = free.pop().expect("room counts the free buffers");
                    let slot = buf.offset() / SLOT;
                    buf.write(0, &pattern(thread, seq, len)).expect("fill");
                    let (head, rest) = buf.split_at(len).expect("len <= SLOT");
                    rests.push(rest);
                    let target = remote.remote(slot * SLOT);
                    works.push(write(&mut rng, head, target, Sent { slot, seq, len }));
                }
                let mut works = works.into_iter();
                let count = queue.post_batch(&mut works).expect("post list");
                assert_eq!(count, n, "thread {thread}: the whole list is posted");
                posted += n as u64;
                continue;
            }
            let seq = posted;
            let max = if rng.below(4) == 0 { SLOT as u64 } else { 256 };
            let len = 1 + rng.below(max) as usize;
            let data = pattern(thread, seq, len);
            if len <= 64 && rng.below(3) == 0 {
                let slot = BUFFERS + inline_seq % inline_slots;
                inline_seq += 1;
                let target = remote.remote(slot * SLOT);
                queue
                    .post(Work::write_inline(&data, target, Sent { slot, seq, len }))
                    .expect("post inline");
            } else {
                let Some(mut buf) = free.pop() else { break };
                let slot = buf.offset() / SLOT;
                buf.write(0, &data).expect("fill");
                let (head, rest) = buf.split_at(len).expect("len <= SLOT");
                // Only `head` is sent; `rest` rejoins it when it comes back.
                let target = remote.remote(slot * SLOT);
                queue
                    .post(write(&mut rng, head, target, Sent { slot, seq, len }))
                    .expect("post");
                rests.push(rest);
            }
            posted += 1;
        }
        if posted == total {
            queue.confirm_all().expect("confirm");
        }
        queue.tick().expect("tick");
        queue.poll(&mut done).expect("poll");
        for c in done.drain(..) {
            assert_eq!(
                c.outcome,
                Outcome::Completed,
                "thread {thread} WR {}",
                c.user.seq
            );
            assert_eq!(c.user.seq, retired, "thread {thread}: handed back in order");
            let mut landed = vec![0; c.user.len];
            remote.read(c.user.slot * SLOT, &mut landed).expect("read");
            assert!(
                landed == pattern(thread, c.user.seq, c.user.len),
                "thread {thread} WR {}: the remote bytes differ",
                c.user.seq
            );
            bytes += c.user.len as u64;
            retired += 1;
            // A list's pieces, adjacent and in order, make the head again.
            let head = c.buffer.or_else(|| {
                c.list
                    .into_iter()
                    .flat_map(|l| *l)
                    .reduce(|a, b| a.join(b).expect("adjacent pieces"))
            });
            if let Some(head) = head {
                // Find the tail split off this buffer and join them again.
                let at = rests
                    .iter()
                    .position(|r| r.offset() == head.offset() + head.len())
                    .expect("the rest of the buffer");
                let rest = rests.swap_remove(at);
                free.push(head.join(rest).expect("adjacent"));
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(600),
            "thread {thread} stuck at {retired}"
        );
    }
    let stats = queue.stats();
    assert_eq!(stats.completed, total);
    assert_eq!(stats.posted, total);
    (retired, bytes)
}

/// [`THREADS`] threads of `total` work requests each on one NIC.
fn stress(personality: Personality, total: u64) {
    let dev = SoftDevice::open(SoftConfig::with_personality(personality)).expect("device");
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let dev = dev.clone();
            std::thread::spawn(move || run_thread(dev, t, total))
        })
        .collect();
    let mut wrs = 0;
    for t in threads {
        let (n, _) = t.join().expect("a stress thread failed");
        wrs += n;
    }
    assert_eq!(wrs, THREADS * total);
}

#[test]
fn stress_mlx5() {
    stress(Personality::Mlx5, wrs_per_thread());
}

#[test]
fn stress_rxe() {
    // Fewer by default: the rxe personality frees slots differently, the rest is the same.
    let total = match std::env::var_os("SELSIG_STRESS_WRS") {
        None => wrs_per_thread() / 7,
        Some(_) => wrs_per_thread(),
    };
    stress(Personality::Rxe, total);
}
