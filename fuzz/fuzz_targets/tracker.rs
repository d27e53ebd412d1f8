//! Arbitrary operation sequences against `SendTracker`: posts, batch rollbacks, markers,
//! completions the simulated NIC really produced, and arbitrary (often impossible)
//! completions. The tracker must never panic, never hand a work request back twice or out
//! of order, and never exceed its send-queue and CQ capacities.
//!
//! Until an arbitrary completion is accepted (it may be one no NIC would write, and then
//! nothing can be expected of what follows), the simulated NIC is the oracle: every
//! completion it wrote is accepted, its CQ never holds more than the CQ capacity, a refused
//! operation changes nothing, each work request handed back has the outcome the NIC gave it
//! (completed, failed with its status, or flushed), and at the end, when the NIC has run
//! everything and the queue is confirmed, every work request posted has been handed back.
#![no_main]

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use selsig::{
    Outcome, Policy, PostError, QueueState, SendTracker, Seq, Signal, TrackerConfig, WcStatus,
    WorkCompletion,
};

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

/// The simulated NIC: posted work requests it has not executed, its CQ, and the outcome it
/// gave each work request it executed.
#[derive(Default)]
struct Nic {
    /// Posted, not executed: (seq, signaled).
    queue: VecDeque<(u64, bool)>,
    /// The QP is in the error state: whatever executes next is flushed.
    error: bool,
    cq: VecDeque<WorkCompletion>,
    fate: HashMap<u64, Outcome>,
}

impl Nic {
    /// Executes the next work request; `fail` makes it fail with that status (a success
    /// status executes it normally).
    fn execute(&mut self, fail: Option<WcStatus>) {
        let Some((seq, signaled)) = self.queue.pop_front() else {
            return;
        };
        let (outcome, status) = if self.error {
            (Outcome::Flushed, Some(WcStatus::WrFlushErr))
        } else {
            match fail.filter(|s| !s.is_success()) {
                // A flush as the first error: the QP was moved to the error state.
                Some(WcStatus::WrFlushErr) => {
                    self.error = true;
                    (Outcome::Flushed, Some(WcStatus::WrFlushErr))
                }
                Some(status) => {
                    self.error = true;
                    (Outcome::Failed(status), Some(status))
                }
                None => (Outcome::Completed, signaled.then_some(WcStatus::Success)),
            }
        };
        self.fate.insert(seq, outcome);
        if let Some(status) = status {
            self.cq.push_back(WorkCompletion::new(seq, status, QP));
        }
    }
}

/// What the test has seen handed back.
struct Seen {
    last: Option<u64>,
    count: u64,
}

/// Hands back every retired work request, checking order, payload and (while the NIC is
/// still the oracle) outcome.
fn collect(t: &mut SendTracker<u64>, one_pass: bool, nic: &Nic, oracle: bool, seen: &mut Seen) {
    let mut check = |r: selsig::Retired<u64>| {
        assert_eq!(r.payload, r.seq.0);
        if let Some(last) = seen.last {
            assert!(r.seq.0 > last, "retired in posting order, once");
        }
        seen.last = Some(r.seq.0);
        seen.count += 1;
        if oracle {
            assert_eq!(
                Some(&r.outcome),
                nic.fate.get(&r.seq.0),
                "work request {} handed back with another outcome than the NIC gave it",
                r.seq.0
            );
        }
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

fn deliver(t: &mut SendTracker<u64>, nic: &mut Nic, oracle: bool, now: Instant) {
    if let Some(wc) = nic.cq.pop_front() {
        let result = t.handle_completion(&wc, now);
        if oracle {
            assert!(
                result.is_ok(),
                "a completion the NIC wrote ({wc:?}) was refused: {result:?}"
            );
        }
    }
}

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
    let mut nic = Nic::default();
    let mut seen = Seen {
        last: None,
        count: 0,
    };
    // The NIC stays the oracle until an arbitrary completion is accepted.
    let mut oracle = true;

    for op in input.ops {
        let before = t.outstanding();
        match op {
            Op::Post { force } => {
                let signal = if force { Signal::Force } else { Signal::Auto };
                let id = t.next_seq().0;
                match t.post(id, signal, now) {
                    Ok(p) => nic.queue.push_back((p.seq.0, p.signaled())),
                    Err(e) => {
                        assert_eq!(e.into_payload(), id);
                        assert_eq!(t.outstanding(), before, "a refused post changes nothing");
                    }
                }
            }
            Op::Rollback { back } => {
                // Only what the NIC has not executed can be rolled back (a partly failed
                // batch: the provider did not post it).
                let back = u64::from(back).min(nic.queue.len() as u64);
                let from = Seq(t.next_seq().0.saturating_sub(back));
                let items: Option<Vec<u64>> = t.rollback(from).ok().map(Iterator::collect);
                match items {
                    Some(items) => {
                        assert!(
                            items.windows(2).all(|w| w[0] < w[1]),
                            "handed back in order"
                        );
                        assert!(items.iter().all(|id| *id >= from.0));
                        nic.queue.retain(|(s, _)| *s < from.0);
                        assert!(!oracle || t.next_seq() == from);
                    }
                    None => {
                        assert!(!oracle, "rolling back what the NIC did not run was refused");
                        assert_eq!(t.outstanding(), before, "a refused rollback changes nothing");
                    }
                }
            }
            Op::Tick(ns) => now += Duration::from_nanos(u64::from(ns)),
            Op::Execute { fail } => nic.execute(fail.map(|code| {
                WcStatus::try_from(u32::from(code % 24)).unwrap_or(WcStatus::GeneralErr)
            })),
            Op::NicError => nic.error = true,
            Op::Deliver => deliver(&mut t, &mut nic, oracle, now),
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
                if t.handle_completion(&wc, now).is_ok() {
                    oracle = false;
                } else {
                    assert_eq!(t.outstanding(), before, "a refused completion changes nothing");
                }
            }
            Op::Collect { one_pass } => collect(&mut t, one_pass, &nic, oracle, &mut seen),
            Op::Confirm => match t.confirm_all(now) {
                Ok(Some(seq)) => nic.queue.push_back((seq.0, true)),
                Ok(None) => assert_eq!(t.outstanding(), before),
                Err(e) => {
                    assert_eq!(t.outstanding(), before, "a refused confirm changes nothing");
                    // Refused only in the error state or for want of room.
                    assert!(
                        e.is_full()
                            || matches!(e, PostError::SeqExhausted { .. })
                            || matches!(t.state(), QueueState::Error { .. }),
                        "confirm refused: {e:?}"
                    );
                }
            },
            Op::Drain => {
                t.start_drain();
                match t.post_marker(now) {
                    Ok(seq) => nic.queue.push_back((seq.0, true)),
                    Err(e) => {
                        assert_eq!(t.outstanding(), before, "a refused marker changes nothing");
                        assert!(
                            e.is_full() || matches!(e, PostError::SeqExhausted { .. }),
                            "marker refused: {e:?}"
                        );
                    }
                }
            }
        }
        assert!(t.outstanding() <= sq && t.outstanding() <= cq);
        assert!(t.unsignaled_run() < sq.min(cq));
        if t.outstanding() == sq.min(cq) && matches!(t.state(), QueueState::Ready) {
            assert!(t.signaled_outstanding() > 0);
        }
        if oracle {
            assert!(nic.cq.len() <= cq as usize, "the CQ overran");
        }
        let s = t.stats();
        assert!(s.retired() <= s.posted);
        // The caller's outstanding work requests (markers are outstanding too, not posted).
        assert!(s.posted - s.retired() <= u64::from(t.outstanding()));
        assert!(seen.count <= s.retired(), "handed back more than retired");
        assert!(
            measure_lag || s.lag_ns.is_empty(),
            "lag recorded while turned off"
        );
    }

    if !oracle {
        return;
    }
    // The end: the NIC runs everything, the queue confirms its unsignaled tail, and every
    // work request posted comes back with its outcome.
    for _ in 0..3 {
        while !nic.queue.is_empty() {
            nic.execute(None);
        }
        while !nic.cq.is_empty() {
            deliver(&mut t, &mut nic, oracle, now);
        }
        collect(&mut t, true, &nic, oracle, &mut seen);
        if t.outstanding() == 0 {
            break;
        }
        let marker = match t.state() {
            QueueState::Ready => t.confirm_all(now).map(|seq| seq.map(|s| s.0)),
            _ => t.post_marker(now).map(|seq| Some(seq.0)),
        };
        match marker {
            Ok(Some(seq)) => nic.queue.push_back((seq, true)),
            other => panic!("{} outstanding and no marker: {other:?}", t.outstanding()),
        }
    }
    assert_eq!(t.outstanding(), 0, "work requests left outstanding");
    assert_eq!(seen.count, t.stats().posted, "every work request posted is handed back");
    assert!(t.is_idle());
});
