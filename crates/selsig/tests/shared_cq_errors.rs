//! Three send queues sharing one completion queue through a `CqCredits` pool, with what
//! goes wrong: error completions (of unsignaled work requests too), QPs moved to the error
//! state, flushes of every work request behind them, batches the provider refused
//! part-way (rolled back), confirm and drain markers, and every policy (`Adaptive` with
//! the clock moving).
//!
//! A simulated in-order NIC executes each send queue and writes the completions real NICs
//! write (docs/semantics.md: a success only for signaled work requests; an error, then a flush, for
//! every work request once the QP is in the error state). After every step: the CQ never
//! holds more than it can, no completion the NIC wrote is refused, every work request comes
//! back in posting order with the outcome the NIC gave it, a full send queue has a
//! signaled work request outstanding, an empty pool has a completion on its way, an
//! adaptive queue with an unsignaled tail has a deadline, and the pool's free credits are
//! its capacity less what is outstanding. At the end everything settles and the pool is
//! whole again.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use selsig::{
    CqBudget, CqCredits, Outcome, Policy, QueueState, SendTracker, Seq, Signal, TrackerConfig,
    WcStatus, WorkCompletion,
};

const QUEUES: usize = 3;

#[derive(Debug, Clone)]
enum Op {
    /// Post up to `n` work requests; bit `i` of `force` forces the `i`-th signaled; the
    /// provider refuses the one at `refuse` (it and those after it are rolled back).
    Post {
        queue: usize,
        n: u8,
        force: u8,
        refuse: Option<u8>,
    },
    /// The NIC executes up to `n` work requests of the queue.
    Execute { queue: usize, n: u8 },
    /// The next work request the NIC executes fails (remote access error).
    Fail { queue: usize },
    /// The QP is moved to the error state: what follows is flushed.
    ToError { queue: usize },
    /// Up to `n` completions are polled.
    Poll(u8),
    /// A confirm marker, or a drain marker in the error state.
    Marker { queue: usize },
    /// The clock moves.
    Wait(u32),
}

fn op() -> impl Strategy<Value = Op> {
    let queue = 0..QUEUES;
    prop_oneof![
        6 => (queue.clone(), 1u8..6, any::<u8>(), prop::option::weighted(0.2, 0u8..6))
            // Sparse forced signals: a few bits set.
            .prop_map(|(queue, n, force, refuse)| Op::Post {
                queue,
                n,
                force: force & force.rotate_left(3),
                refuse,
            }),
        5 => (queue.clone(), 1u8..6).prop_map(|(queue, n)| Op::Execute { queue, n }),
        1 => queue.clone().prop_map(|queue| Op::Fail { queue }),
        1 => queue.clone().prop_map(|queue| Op::ToError { queue }),
        5 => (1u8..6).prop_map(Op::Poll),
        1 => queue.prop_map(|queue| Op::Marker { queue }),
        1 => (0u32..3000).prop_map(Op::Wait),
    ]
}

fn policy() -> impl Strategy<Value = Policy> {
    prop_oneof![
        (1u32..12).prop_map(Policy::Every),
        Just(Policy::Never),
        (1u32..12, 0u64..3000).prop_map(|(n, ns)| Policy::Adaptive {
            max_unsignaled: n,
            max_lag: Duration::from_nanos(ns),
        }),
    ]
}

/// One send queue: its tracker and what the simulated NIC knows of it.
struct Queue {
    tracker: SendTracker<u64>,
    capacity: u32,
    /// Posted, not yet executed: (seq, signaled).
    sq: VecDeque<(u64, bool)>,
    /// The QP is in the error state: the NIC flushes what it executes.
    error: bool,
    /// The next work request executed fails.
    fail_next: bool,
    /// What the NIC did with each work request it executed.
    truth: HashMap<u64, Outcome>,
    /// The payloads posted and not rolled back, in posting order, not yet retired.
    expected: VecDeque<u64>,
}

impl Queue {
    /// The NIC executes the next work request; `Some` completion when it writes one.
    fn execute(&mut self, qp_num: u32) -> Option<Option<WorkCompletion>> {
        let (seq, signaled) = self.sq.pop_front()?;
        let (outcome, status) = if self.error {
            (Outcome::Flushed, Some(WcStatus::WrFlushErr))
        } else if self.fail_next {
            self.fail_next = false;
            self.error = true;
            let status = WcStatus::RemAccessErr;
            (Outcome::Failed(status), Some(status))
        } else {
            (Outcome::Completed, signaled.then_some(WcStatus::Success))
        };
        self.truth.insert(seq, outcome);
        Some(status.map(|status| WorkCompletion::new(seq, status, qp_num)))
    }

    /// A marker behind everything posted: a drain marker in the error state, else a
    /// confirm marker if the tail is unsignaled.
    fn marker(&mut self, now: Instant) {
        let seq = match self.tracker.state() {
            QueueState::Error { .. } => self.tracker.post_marker(now).ok(),
            _ => self.tracker.confirm_all(now).ok().flatten(),
        };
        if let Some(Seq(seq)) = seq {
            self.sq.push_back((seq, true));
        }
    }
}

/// Hands the completion to its queue and checks what comes back.
fn poll_one(
    queues: &mut [Queue],
    cq: &mut VecDeque<WorkCompletion>,
    now: Instant,
) -> Result<(), TestCaseError> {
    let Some(wc) = cq.pop_front() else {
        return Ok(());
    };
    let queue = &mut queues[wc.qp_num as usize];
    let handled = queue.tracker.handle_completion(&wc, now);
    prop_assert!(handled.is_ok(), "{wc:?} refused: {handled:?}");
    while let Some(r) = queue.tracker.poll_retired() {
        prop_assert_eq!(Some(r.payload), queue.expected.pop_front(), "posting order");
        prop_assert_eq!(
            Some(r.outcome),
            queue.truth.get(&r.seq.0).copied(),
            "the outcome of seq {} on QP {}",
            r.seq.0,
            wc.qp_num
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: if cfg!(miri) { 4 } else { 512 },
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("proptest-regressions"))),
        .. ProptestConfig::default()
    })]

    #[test]
    fn every_work_request_gets_the_nics_outcome_on_a_shared_pool(
        cq_size in 1u32..14,
        sq_sizes in prop::collection::vec(1u32..10, QUEUES),
        policies in prop::collection::vec(policy(), QUEUES),
        ops in prop::collection::vec(op(), 1..150),
    ) {
        let epoch = Instant::now();
        let mut now = epoch;
        let pool = CqCredits::new(cq_size);
        let mut queues: Vec<Queue> = (0..QUEUES)
            .map(|i| {
                let config = TrackerConfig::new(sq_sizes[i], 0)
                    .cq(CqBudget::Shared(pool.clone()))
                    .policy(policies[i])
                    .qp_num(i as u32);
                Queue {
                    tracker: SendTracker::new(config, epoch).expect("valid config"),
                    capacity: sq_sizes[i],
                    sq: VecDeque::new(),
                    error: false,
                    fail_next: false,
                    truth: HashMap::new(),
                    expected: VecDeque::new(),
                }
            })
            .collect();
        let mut cq: VecDeque<WorkCompletion> = VecDeque::new();
        let mut payload = 0u64;

        for op in ops {
            match op {
                Op::Post { queue, n, force, refuse } => {
                    let q = &mut queues[queue];
                    let mut batch = Vec::new();
                    for i in 0..n {
                        let signal = match force & (1 << i) {
                            0 => Signal::Auto,
                            _ => Signal::Force,
                        };
                        payload += 1;
                        match q.tracker.post(payload, signal, now) {
                            Ok(posted) => batch.push((posted.seq.0, posted.signaled(), payload)),
                            // No room (the queue's or the pool's), or no more posts (an
                            // error, a drain): nothing else refuses a post here.
                            Err(e) => {
                                let state = q.tracker.state();
                                prop_assert!(
                                    e.is_full() || state != QueueState::Ready,
                                    "{:?} in the state {:?}",
                                    e,
                                    state
                                );
                                break;
                            }
                        }
                    }
                    let kept = match refuse.map(usize::from) {
                        Some(at) if at < batch.len() => {
                            let back: Vec<u64> =
                                q.tracker.rollback(Seq(batch[at].0)).expect("rollback").collect();
                            let refused: Vec<u64> = batch[at..].iter().map(|b| b.2).collect();
                            prop_assert_eq!(back, refused, "the rolled-back payloads");
                            at
                        }
                        _ => batch.len(),
                    };
                    for &(seq, signaled, payload) in &batch[..kept] {
                        q.sq.push_back((seq, signaled));
                        q.expected.push_back(payload);
                    }
                }
                Op::Execute { queue, n } => {
                    for _ in 0..n {
                        match queues[queue].execute(queue as u32) {
                            Some(Some(wc)) => cq.push_back(wc),
                            Some(None) => {}
                            None => break,
                        }
                        prop_assert!(cq.len() as u32 <= cq_size, "the CQ overran");
                    }
                }
                Op::Fail { queue } => queues[queue].fail_next = true,
                Op::ToError { queue } => queues[queue].error = true,
                Op::Poll(n) => {
                    for _ in 0..n {
                        poll_one(&mut queues, &mut cq, now)?;
                    }
                }
                Op::Marker { queue } => queues[queue].marker(now),
                Op::Wait(ns) => now += Duration::from_nanos(u64::from(ns)),
            }

            let outstanding: u32 = queues.iter().map(|q| q.tracker.outstanding()).sum();
            prop_assert_eq!(pool.available(), cq_size - outstanding);
            for (i, q) in queues.iter().enumerate() {
                let healthy = !q.error && !matches!(q.tracker.state(), QueueState::Error { .. });
                if healthy && q.tracker.outstanding() == q.capacity {
                    prop_assert!(q.tracker.signaled_outstanding() > 0, "queue {i} full, nothing signaled");
                }
                if matches!(q.tracker.policy(), Policy::Adaptive { .. }) && q.tracker.unsignaled_run() > 0 {
                    prop_assert!(q.tracker.next_deadline().is_some(), "queue {i}: a tail without a deadline");
                }
            }
            if pool.available() == 0 && queues.iter().all(|q| !q.error && !q.fail_next) {
                prop_assert!(
                    queues.iter().any(|q| q.tracker.signaled_outstanding() > 0),
                    "the pool is empty and no completion is coming"
                );
            }
        }

        // Settle: the NIC executes everything, every completion is polled, and markers
        // confirm unsignaled tails or drain queues in the error state (waiting for credits).
        for _ in 0..50 {
            for (i, q) in queues.iter_mut().enumerate() {
                while let Some(wc) = q.execute(i as u32) {
                    cq.extend(wc);
                    prop_assert!(cq.len() as u32 <= cq_size, "the CQ overran while settling");
                }
            }
            while !cq.is_empty() {
                poll_one(&mut queues, &mut cq, now)?;
            }
            for q in queues.iter_mut().filter(|q| q.tracker.outstanding() > 0) {
                q.marker(now);
            }
        }
        for (i, q) in queues.iter().enumerate() {
            prop_assert_eq!(q.tracker.outstanding(), 0, "queue {} never settled", i);
            prop_assert!(q.expected.is_empty(), "queue {}: {:?} never came back", i, q.expected);
        }
        prop_assert_eq!(pool.available(), cq_size);
    }
}
