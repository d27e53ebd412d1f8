//! Arbitrary operation sequences against `SendTracker`: posts, batch rollbacks, markers,
//! completions the simulated NIC really produced, and arbitrary (often impossible)
//! completions. The tracker must never panic, never hand a work request back twice or out
//! of order, and never exceed its send-queue and CQ capacities.
#![no_main]

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use selsig::{Policy, SendTracker, Seq, Signal, TrackerConfig, WcStatus, WorkCompletion};

#[derive(Debug, Arbitrary)]
struct Input {
    sq: u8,
    cq: u8,
    policy: u8,
    interval: u8,
    lag_ns: u16,
    first_seq: u64,
    ops: Vec<Op>,
}

#[derive(Debug, Arbitrary)]
enum Op {
    Post {
        force: bool,
    },
    Rollback {
        back: u8,
    },
    Tick(u16),
    /// The NIC executes the next work request; `fail` makes it fail with that status.
    Execute {
        fail: Option<u8>,
    },
    /// The NIC enters the error state (the QP was moved to ERR).
    NicError,
    /// Deliver the next completion the NIC produced.
    Deliver,
    /// Deliver an arbitrary completion.
    Arbitrary {
        wr_id_offset: i16,
        status: u8,
        qp: bool,
    },
    /// Collect the retired work requests: one by one, or in one pass (`poll_retired_with`).
    Collect {
        one_pass: bool,
    },
    Confirm,
    Drain,
}

const QP: u32 = 3;

fuzz_target!(|input: Input| {
    let epoch = Instant::now();
    let mut now = epoch;
    let policy = match input.policy % 4 {
        0 => Policy::Every(u32::from(input.interval).max(1)),
        1 => Policy::Always,
        2 => Policy::Never,
        _ => Policy::Adaptive {
            max_unsignaled: u32::from(input.interval).max(1),
            max_lag: Duration::from_nanos(u64::from(input.lag_ns)),
        },
    };
    let sq = u32::from(input.sq).max(1);
    let cq = u32::from(input.cq).max(1);
    // A spare bit of the policy byte turns lag measurement off.
    let measure_lag = input.policy & 4 == 0;
    let config = TrackerConfig::new(sq, cq)
        .policy(policy)
        .first_seq(input.first_seq)
        .qp_num(QP)
        .measure_lag(measure_lag);
    let Ok(mut t) = SendTracker::<u64>::new(config, epoch) else {
        return;
    };
    // The simulated NIC: posted (seq, signaled) not yet executed, and its CQ.
    let mut nic: VecDeque<(u64, bool)> = VecDeque::new();
    let mut nic_error = false;
    let mut cq_ring: VecDeque<WorkCompletion> = VecDeque::new();
    let mut last_retired: Option<u64> = None;
    let mut retired = 0u64;

    for op in input.ops {
        match op {
            Op::Post { force } => {
                let signal = if force { Signal::Force } else { Signal::Auto };
                let id = t.next_seq().0;
                match t.post(id, signal, now) {
                    Ok(p) => nic.push_back((p.seq.0, p.signaled())),
                    Err(e) => assert_eq!(e.into_payload(), id),
                }
            }
            Op::Rollback { back } => {
                let back = u64::from(back).min(nic.len() as u64);
                let from = Seq(t.next_seq().0.saturating_sub(back));
                if let Ok(items) = t.rollback(from) {
                    let items: Vec<u64> = items.collect();
                    assert!(
                        items.windows(2).all(|w| w[0] < w[1]),
                        "handed back in order"
                    );
                    assert!(items.iter().all(|id| *id >= from.0));
                    nic.retain(|(s, _)| *s < from.0);
                }
            }
            Op::Tick(ns) => now += Duration::from_nanos(u64::from(ns)),
            Op::Execute { fail } => {
                if let Some((seq, signaled)) = nic.pop_front() {
                    let status = if nic_error {
                        Some(WcStatus::WrFlushErr)
                    } else if let Some(code) = fail {
                        let status = WcStatus::try_from(u32::from(code % 24))
                            .unwrap_or(WcStatus::GeneralErr);
                        if status.is_success() {
                            signaled.then_some(status)
                        } else {
                            nic_error = true;
                            Some(status)
                        }
                    } else {
                        signaled.then_some(WcStatus::Success)
                    };
                    if let Some(status) = status {
                        cq_ring.push_back(WorkCompletion::new(seq, status, QP));
                    }
                }
            }
            Op::NicError => nic_error = true,
            Op::Deliver => {
                if let Some(wc) = cq_ring.pop_front() {
                    let _ = t.handle_completion(&wc, now);
                }
            }
            Op::Arbitrary {
                wr_id_offset,
                status,
                qp,
            } => {
                let wr_id = t
                    .first_outstanding()
                    .0
                    .wrapping_add_signed(i64::from(wr_id_offset));
                let status =
                    WcStatus::try_from(u32::from(status % 24)).unwrap_or(WcStatus::GeneralErr);
                let wc = WorkCompletion::new(wr_id, status, if qp { QP } else { QP + 1 });
                let before = t.outstanding();
                if t.handle_completion(&wc, now).is_err() {
                    assert_eq!(
                        t.outstanding(),
                        before,
                        "a refused completion changes nothing"
                    );
                }
            }
            Op::Collect { one_pass } => {
                let mut check = |r: selsig::Retired<u64>| {
                    assert_eq!(r.payload, r.seq.0);
                    if let Some(last) = last_retired {
                        assert!(r.seq.0 > last, "retired in posting order, once");
                    }
                    last_retired = Some(r.seq.0);
                    retired += 1;
                };
                if one_pass {
                    t.poll_retired_with(check);
                } else {
                    while let Some(r) = t.poll_retired() {
                        check(r);
                    }
                }
                assert_eq!(t.pending_retired(), 0);
            }
            Op::Confirm => {
                if let Ok(Some(seq)) = t.confirm_all(now) {
                    nic.push_back((seq.0, true));
                }
            }
            Op::Drain => {
                t.start_drain();
                if let Ok(seq) = t.post_marker(now) {
                    nic.push_back((seq.0, true));
                }
            }
        }
        assert!(t.outstanding() <= sq && t.outstanding() <= cq);
        assert!(t.unsignaled_run() < sq.min(cq));
        if t.outstanding() == sq.min(cq) && matches!(t.state(), selsig::QueueState::Ready) {
            assert!(t.signaled_outstanding() > 0);
        }
        let s = t.stats();
        assert!(s.retired() <= s.posted);
        // The caller's outstanding work requests (markers are outstanding too, not posted).
        assert!(s.posted - s.retired() <= u64::from(t.outstanding()));
        assert!(retired <= s.retired(), "handed back more than retired");
        assert!(
            measure_lag || s.lag_ns.is_empty(),
            "lag recorded while turned off"
        );
    }
});
