//! Several send queues sharing one completion queue through a `CqCredits` pool.
//!
//! Random posts, NIC executions and polls of one shared CQ; after every step: the pool's
//! free credits are its capacity minus every queue's outstanding work requests, the CQ
//! never holds more completions than it can, and an empty pool always has a signaled work
//! request on its way (so polling always makes progress). At the end everything settles.

use std::collections::VecDeque;
use std::time::Instant;

use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use selsig::{
    CqBudget, CqCredits, Policy, SendTracker, Signal, TrackerConfig, WcStatus, WorkCompletion,
};

#[derive(Debug, Clone)]
enum Op {
    Post { queue: usize, n: u8 },
    Execute { queue: usize, n: u8 },
    Poll(u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0usize..3, 1u8..6).prop_map(|(queue, n)| Op::Post { queue, n }),
        (0usize..3, 1u8..6).prop_map(|(queue, n)| Op::Execute { queue, n }),
        (1u8..6).prop_map(Op::Poll),
    ]
}

struct Queue {
    tracker: SendTracker<u64>,
    /// Posted work requests not yet executed by the NIC: (seq, signaled).
    sq: VecDeque<(u64, bool)>,
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: if cfg!(miri) { 4 } else { 256 },
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("proptest-regressions"))),
        .. ProptestConfig::default()
    })]

    #[test]
    fn a_shared_pool_never_overruns_and_never_starves(
        cq_size in 1u32..12,
        sq_sizes in prop::collection::vec(1u32..10, 3),
        every in prop::collection::vec(1u32..12, 3),
        ops in prop::collection::vec(op(), 1..120),
    ) {
        let now = Instant::now();
        let pool = CqCredits::new(cq_size);
        let mut queues: Vec<Queue> = (0..3)
            .map(|i| {
                let config = TrackerConfig::new(sq_sizes[i], 0)
                    .cq(CqBudget::Shared(pool.clone()))
                    .policy(Policy::Every(every[i]))
                    .qp_num(i as u32);
                Queue {
                    tracker: SendTracker::new(config, now).expect("valid config"),
                    sq: VecDeque::new(),
                }
            })
            .collect();
        let mut cq: VecDeque<WorkCompletion> = VecDeque::new();
        let mut retired = [0u64; 3];
        let mut posted = [0u64; 3];

        let poll = |queues: &mut Vec<Queue>, cq: &mut VecDeque<WorkCompletion>, retired: &mut [u64; 3]| {
            if let Some(wc) = cq.pop_front() {
                let q = &mut queues[wc.qp_num as usize];
                q.tracker.handle_completion(&wc, now).expect("a NIC completion is accepted");
                while let Some(r) = q.tracker.poll_retired() {
                    prop_assert_eq!(r.payload, retired[wc.qp_num as usize]);
                    retired[wc.qp_num as usize] += 1;
                }
            }
            Ok(())
        };

        for op in ops {
            match op {
                Op::Post { queue, n } => {
                    for _ in 0..n {
                        let q = &mut queues[queue];
                        match q.tracker.post(posted[queue], Signal::Auto, now) {
                            Ok(p) => {
                                posted[queue] += 1;
                                q.sq.push_back((p.seq.0, p.signaled()));
                            }
                            Err(e) => {
                                prop_assert!(e.is_full(), "unexpected post error {:?}", e);
                                break;
                            }
                        }
                    }
                }
                Op::Execute { queue, n } => {
                    for _ in 0..n {
                        if let Some((seq, signaled)) = queues[queue].sq.pop_front()
                            && signaled {
                                cq.push_back(WorkCompletion::new(seq, WcStatus::Success, queue as u32));
                            }
                    }
                }
                Op::Poll(n) => {
                    for _ in 0..n {
                        poll(&mut queues, &mut cq, &mut retired)?;
                    }
                }
            }
            let outstanding: u32 = queues.iter().map(|q| q.tracker.outstanding()).sum();
            prop_assert_eq!(pool.available(), cq_size - outstanding);
            prop_assert!(cq.len() as u32 <= cq_size, "the CQ would overrun");
            if pool.available() == 0 {
                let signaled: u32 = queues.iter().map(|q| q.tracker.signaled_outstanding()).sum();
                prop_assert!(signaled > 0, "the pool is empty and no completion is coming");
            }
        }

        // Settle: the NIC executes everything, every completion is polled; unsignaled tails
        // are confirmed with markers, which may have to wait for credits.
        for _ in 0..4 {
            for (i, q) in queues.iter_mut().enumerate() {
                while let Some((seq, signaled)) = q.sq.pop_front() {
                    if signaled {
                        cq.push_back(WorkCompletion::new(seq, WcStatus::Success, i as u32));
                    }
                }
            }
            while !cq.is_empty() {
                poll(&mut queues, &mut cq, &mut retired)?;
            }
            for q in queues.iter_mut() {
                if let Ok(Some(seq)) = q.tracker.confirm_all(now) {
                    q.sq.push_back((seq.0, true));
                }
            }
        }
        for (i, q) in queues.iter().enumerate() {
            prop_assert!(q.tracker.is_idle());
            prop_assert_eq!(retired[i], posted[i]);
        }
        prop_assert_eq!(pool.available(), cq_size);
    }
}
