//! State-machine property test of `SendTracker` against a simple reference model.
//!
//! The reference keeps every work request in a plain `Vec` and recomputes everything by
//! scanning; it also simulates the NIC: in-order execution, a success completion for each
//! signaled work request, an error completion for a failing one (signaled or not), then
//! one flush completion per later work request. Every transition's observable result
//! (signal decisions, errors, retired runs and outcomes, statistics) must be the same in
//! the tracker, and each retired work request's outcome must be what the simulated NIC
//! really did to it.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::test_runner::{Config, FileFailurePersistence};
use proptest_state_machine::{ReferenceStateMachine, StateMachineTest, prop_state_machine};
use selsig::{
    CompletionError, Outcome, Policy, PostError, QueueState, SendTracker, Seq, Signal,
    SignalReason, TrackerConfig, WcStatus, WorkCompletion,
};

const QP: u32 = 0x11;

prop_state_machine! {
    #![proptest_config(Config {
        cases: if cfg!(miri) { 8 } else { 512 },
        max_shrink_iters: 20_000,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("proptest-regressions"))),
        .. Config::default()
    })]

    #[test]
    fn tracker_matches_the_reference_model(sequential 1..80 => Sut);
}

// ----- the reference ----------------------------------------------------------------

#[derive(Clone, Debug)]
struct Cfg {
    sq: u32,
    cq: u32,
    policy: Policy,
    first: u64,
    sig_all: bool,
    /// Whether the tracker records confirmation lags (off: it skips the pass over the
    /// entries a success completion covers when no marker is among them).
    measure_lag: bool,
}

#[derive(Clone, Debug)]
struct Wr {
    /// `None` for markers.
    id: Option<u64>,
    signal: Option<SignalReason>,
    posted_ns: u64,
    /// Set when the tracker retires it.
    outcome: Option<Outcome>,
    /// What the simulated NIC did to it.
    truth: Option<Outcome>,
    delivered: bool,
}

#[derive(Clone, Debug, Default, PartialEq)]
struct Counts {
    posted: u64,
    signaled: u64,
    requested: u64,
    forced: u64,
    markers: u64,
    cqes: u64,
    success_cqes: u64,
    error_cqes: u64,
    flush_cqes: u64,
    rejected_cqes: u64,
    completed: u64,
    failed: u64,
    flushed: u64,
    lost: u64,
}

#[derive(Clone, Debug, PartialEq)]
enum PostErr {
    Full,
    CqFull,
    QueueError(u64),
    Draining,
    DeviceLost,
    Exhausted,
}

fn post_err<T>(e: &PostError<T>) -> PostErr {
    match e {
        PostError::Full { .. } => PostErr::Full,
        PostError::CqFull { .. } => PostErr::CqFull,
        PostError::QueueError { first, .. } => PostErr::QueueError(first.0),
        PostError::Draining { .. } => PostErr::Draining,
        PostError::SeqExhausted { .. } => PostErr::Exhausted,
        PostError::DeviceLost { .. } => PostErr::DeviceLost,
        _ => unreachable!("a new PostError variant needs a model"),
    }
}

/// The observable result of the last transition.
#[derive(Clone, Debug, PartialEq)]
enum Expect {
    Nothing,
    Posts {
        results: Vec<Result<(u64, Option<SignalReason>), PostErr>>,
        handed_back: Vec<u64>,
    },
    /// Per completion: (first, seq, retired, entered_error) of what it retired.
    Completions(Vec<Result<(u64, u64, u64, bool), CompletionError>>),
    Collected(Vec<(u64, u64, Outcome, bool)>),
    /// The payloads `poll_completed_with` handed back.
    Completed(Vec<u64>),
    Marker(Result<Option<u64>, PostErr>),
    /// How many work requests a lost device retired.
    Lost(u64),
}

#[derive(Clone, Debug)]
struct Model {
    cfg: Cfg,
    now_ns: u64,
    wrs: Vec<Wr>,
    next_id: u64,
    draining: bool,
    /// The device was lost: the NIC executes nothing more.
    lost: bool,
    error: Option<(u64, WcStatus)>,
    nic_next: usize,
    nic_error: bool,
    nic_fail_next: Option<WcStatus>,
    cq: VecDeque<WorkCompletion>,
    /// The completions the last `Poll` delivered.
    delivered: Vec<WorkCompletion>,
    counts: Counts,
    last: Expect,
}

#[derive(Clone, Debug)]
enum Transition {
    /// Post `n` work requests in one batch; bit i of `force` forces a signal on the i-th;
    /// the provider refuses the batch from index `refuse_from` on. A `whole` provider posts
    /// all or nothing (`ibv_wr_complete`): its refusal at any index hands back the whole
    /// batch; another (`ibv_post_send`) posted those before the index.
    Post {
        n: u8,
        force: u8,
        refuse_from: Option<u8>,
        whole: bool,
    },
    Tick(u32),
    Execute(u8),
    FailNext(WcStatus),
    ModifyToError,
    Poll(u8),
    /// Collect up to `n` retired work requests one by one; `COLLECT_ALL`: all of them in
    /// one pass (`poll_retired_with`).
    Collect(u8),
    /// Collect the payloads of up to `n` retired work requests that completed, stopping
    /// before the first that did not (`poll_completed_with`).
    CollectCompleted(u8),
    Confirm,
    Drain,
    /// The device is lost (the driver polled the CQ dry first).
    DeviceLost,
    Bogus(WorkCompletion),
}

/// `Transition::Collect(COLLECT_ALL)` collects every retired work request.
const COLLECT_ALL: u8 = 12;

impl Model {
    fn seq(&self, idx: usize) -> u64 {
        self.cfg.first + idx as u64
    }
    fn next_seq(&self) -> u64 {
        self.seq(self.wrs.len())
    }
    fn idx(&self, seq: u64) -> usize {
        (seq - self.cfg.first) as usize
    }
    fn first_outstanding(&self) -> usize {
        self.wrs
            .iter()
            .position(|w| w.outcome.is_none())
            .unwrap_or(self.wrs.len())
    }
    fn outstanding(&self) -> u32 {
        self.wrs.iter().filter(|w| w.outcome.is_none()).count() as u32
    }
    fn signaled_outstanding(&self) -> u32 {
        self.wrs
            .iter()
            .filter(|w| w.outcome.is_none() && w.signal.is_some())
            .count() as u32
    }
    /// Trailing unsignaled, unretired work requests.
    fn run(&self) -> usize {
        self.wrs
            .iter()
            .rev()
            .take_while(|w| w.signal.is_none() && w.outcome.is_none())
            .count()
    }
    fn run_limit(&self) -> u32 {
        self.cfg.sq.min(self.cfg.cq)
    }

    fn reserve(&self) -> Result<(), PostErr> {
        let out = self.outstanding();
        if out >= self.cfg.sq {
            Err(PostErr::Full)
        } else if self.next_seq() == u64::MAX {
            Err(PostErr::Exhausted)
        } else if out >= self.cfg.cq {
            Err(PostErr::CqFull)
        } else {
            Ok(())
        }
    }

    fn post(&mut self, force: bool) -> Result<(u64, Option<SignalReason>), PostErr> {
        if let Some((first, _)) = self.error {
            return Err(PostErr::QueueError(first));
        }
        if self.draining {
            return Err(match self.lost {
                true => PostErr::DeviceLost,
                false => PostErr::Draining,
            });
        }
        self.reserve()?;
        let run = self.run();
        let run_after = run as u32 + 1;
        let by_policy = match self.cfg.policy {
            Policy::Every(n) => run_after >= n,
            Policy::Always => true,
            Policy::Never => false,
            Policy::Adaptive {
                max_unsignaled,
                max_lag,
            } => {
                run_after >= max_unsignaled
                    || (run > 0
                        && u128::from(self.now_ns - self.wrs[self.wrs.len() - run].posted_ns)
                            >= max_lag.as_nanos())
            }
        };
        let signal = if self.cfg.sig_all {
            Some(SignalReason::SqSigAll)
        } else if force {
            Some(SignalReason::Requested)
        } else if by_policy {
            Some(SignalReason::Policy)
        } else if run_after >= self.run_limit() || self.next_seq() == u64::MAX - 1 {
            Some(SignalReason::Deadlock)
        } else {
            None
        };
        let seq = self.next_seq();
        let id = self.next_id;
        self.next_id += 1;
        self.wrs.push(Wr {
            id: Some(id),
            signal,
            posted_ns: self.now_ns,
            outcome: None,
            truth: None,
            delivered: false,
        });
        self.counts.posted += 1;
        if let Some(reason) = signal {
            self.counts.signaled += 1;
            match reason {
                SignalReason::Requested => self.counts.requested += 1,
                SignalReason::Deadlock | SignalReason::CqCredit => self.counts.forced += 1,
                _ => {}
            }
        }
        Ok((seq, signal))
    }

    fn marker(&mut self) -> Result<u64, PostErr> {
        if self.lost {
            return Err(PostErr::DeviceLost);
        }
        self.reserve()?;
        let seq = self.next_seq();
        self.wrs.push(Wr {
            id: None,
            signal: Some(SignalReason::Marker),
            posted_ns: self.now_ns,
            outcome: None,
            truth: None,
            delivered: false,
        });
        self.counts.markers += 1;
        Ok(seq)
    }

    fn rollback(&mut self, from_idx: usize) -> Vec<u64> {
        let gone: Vec<Wr> = self.wrs.drain(from_idx..).collect();
        for w in &gone {
            if w.id.is_some() {
                self.counts.posted -= 1;
                if let Some(reason) = w.signal {
                    self.counts.signaled -= 1;
                    match reason {
                        SignalReason::Requested => self.counts.requested -= 1,
                        SignalReason::Deadlock | SignalReason::CqCredit => self.counts.forced -= 1,
                        _ => {}
                    }
                }
            } else {
                self.counts.markers -= 1;
            }
        }
        let ids: Vec<u64> = gone.into_iter().filter_map(|w| w.id).collect();
        self.next_id -= ids.len() as u64;
        ids
    }

    /// The reference semantics of one completion.
    fn check(&self, wc: &WorkCompletion) -> Result<usize, CompletionError> {
        if wc.qp_num != QP {
            return Err(CompletionError::WrongQueue {
                expected: QP,
                got: wc.qp_num,
            });
        }
        let wr_id = wc.wr_id;
        if wr_id >= self.next_seq() || wr_id < self.cfg.first {
            return Err(CompletionError::Unknown {
                wr_id,
                next: Seq(self.next_seq()),
            });
        }
        let idx = self.idx(wr_id);
        let first = self.first_outstanding();
        if idx < first {
            return Err(CompletionError::AlreadyRetired { wr_id });
        }
        let earliest = self.wrs[first..]
            .iter()
            .position(|w| w.signal.is_some())
            .map(|i| first + i);
        match (wc.status, self.error) {
            (WcStatus::Success, Some((first, _))) => Err(CompletionError::SuccessAfterError {
                wr_id,
                first: Seq(first),
            }),
            (WcStatus::Success, None) if self.wrs[idx].signal.is_none() => {
                Err(CompletionError::Unsignaled { wr_id })
            }
            (_, None) => match earliest {
                Some(e) if e < idx => Err(CompletionError::OutOfOrder {
                    wr_id,
                    expected: Seq(self.seq(e)),
                }),
                _ => Ok(idx),
            },
            (_, Some(_)) => Ok(idx),
        }
    }

    fn complete(&mut self, wc: &WorkCompletion) -> Result<(u64, u64, u64, bool), CompletionError> {
        let idx = match self.check(wc) {
            Ok(idx) => idx,
            Err(e) => {
                self.counts.rejected_cqes += 1;
                return Err(e);
            }
        };
        self.counts.cqes += 1;
        let in_error = self.error.is_some();
        let (before, this) = match wc.status {
            WcStatus::Success => {
                self.counts.success_cqes += 1;
                (Outcome::Completed, Outcome::Completed)
            }
            WcStatus::WrFlushErr => {
                self.counts.flush_cqes += 1;
                let before = if in_error {
                    Outcome::Flushed
                } else {
                    Outcome::Completed
                };
                (before, Outcome::Flushed)
            }
            status => {
                self.counts.error_cqes += 1;
                let before = if in_error {
                    Outcome::Flushed
                } else {
                    Outcome::Completed
                };
                (before, Outcome::Failed(status))
            }
        };
        let entered_error = !wc.status.is_success() && !in_error;
        if entered_error {
            self.error = Some((wc.wr_id, wc.status));
        }
        let first = self.first_outstanding();
        let mut user = 0;
        for i in first..=idx {
            let outcome = if i == idx { this } else { before };
            self.wrs[i].outcome = Some(outcome);
            if self.wrs[i].id.is_some() {
                user += 1;
                match outcome {
                    Outcome::Completed => self.counts.completed += 1,
                    Outcome::Failed(_) => self.counts.failed += 1,
                    Outcome::Flushed => self.counts.flushed += 1,
                    Outcome::DeviceLost => unreachable!("no completion says the device was lost"),
                }
            }
        }
        Ok((self.seq(first), self.seq(idx), user, entered_error))
    }

    /// The device is lost: every outstanding work request's outcome, and the truth the
    /// tracker can know of it, is `DeviceLost` (it may have executed, unsignaled).
    fn lose_device(&mut self) -> u64 {
        if self.lost {
            return 0;
        }
        self.lost = true;
        self.draining = true;
        let mut user = 0;
        for w in self.wrs.iter_mut().filter(|w| w.outcome.is_none()) {
            w.outcome = Some(Outcome::DeviceLost);
            w.truth = Some(Outcome::DeviceLost);
            user += u64::from(w.id.is_some());
        }
        self.counts.lost += user;
        user
    }

    fn execute(&mut self, n: usize) {
        if self.lost {
            return;
        }
        for _ in 0..n {
            let Some(w) = self.wrs.get(self.nic_next) else {
                return;
            };
            let seq = self.seq(self.nic_next);
            let signaled = w.signal.is_some();
            let (truth, cqe) = if self.nic_error {
                (Outcome::Flushed, Some(WcStatus::WrFlushErr))
            } else if let Some(status) = self.nic_fail_next.take() {
                self.nic_error = true;
                (Outcome::Failed(status), Some(status))
            } else {
                (Outcome::Completed, signaled.then_some(WcStatus::Success))
            };
            self.wrs[self.nic_next].truth = Some(truth);
            if let Some(status) = cqe {
                self.cq.push_back(WorkCompletion::new(seq, status, QP));
            }
            self.nic_next += 1;
        }
    }

    fn collect(&mut self, max: usize) -> Vec<(u64, u64, Outcome, bool)> {
        let mut out = Vec::new();
        for i in 0..self.wrs.len() {
            if out.len() == max {
                break;
            }
            let seq = self.seq(i);
            let w = &mut self.wrs[i];
            if w.delivered {
                continue;
            }
            let Some(outcome) = w.outcome else { break };
            w.delivered = true;
            if let Some(id) = w.id {
                out.push((seq, id, outcome, w.signal.is_some()));
            }
        }
        out
    }

    /// The payloads of up to `max` retired work requests that completed, up to the first
    /// retired one that did not.
    fn collect_completed(&mut self, max: usize) -> Vec<u64> {
        let mut out = Vec::new();
        for w in &mut self.wrs {
            if w.delivered {
                continue;
            }
            let Some(outcome) = w.outcome else { break };
            if let Some(id) = w.id {
                if out.len() == max || outcome != Outcome::Completed {
                    break;
                }
                out.push(id);
            }
            w.delivered = true;
        }
        out
    }

    /// Completions that the tracker must refuse in this state.
    fn bogus_candidates(&self) -> Vec<WorkCompletion> {
        let next = self.next_seq();
        let mut c = vec![
            WorkCompletion::new(next, WcStatus::Success, QP),
            WorkCompletion::new(next.saturating_add(1000), WcStatus::RemAccessErr, QP),
            WorkCompletion::new(self.cfg.first.wrapping_sub(1), WcStatus::WrFlushErr, QP),
        ];
        let first = self.first_outstanding();
        if first > 0 {
            c.push(WorkCompletion::new(
                self.seq(first - 1),
                WcStatus::Success,
                QP,
            ));
        }
        for (i, w) in self.wrs.iter().enumerate().skip(first) {
            let seq = self.seq(i);
            c.push(WorkCompletion::new(seq, WcStatus::Success, QP + 1));
            if w.signal.is_none() || self.error.is_some() {
                c.push(WorkCompletion::new(seq, WcStatus::Success, QP));
            }
        }
        if self.error.is_none() {
            // Something after the earliest outstanding signaled work request.
            if let Some(e) = self.wrs[first..].iter().position(|w| w.signal.is_some()) {
                for i in first + e + 1..self.wrs.len() {
                    for status in [WcStatus::Success, WcStatus::WrFlushErr, WcStatus::LocLenErr] {
                        c.push(WorkCompletion::new(self.seq(i), status, QP));
                    }
                }
            }
        }
        c.retain(|wc| self.check(wc).is_err());
        c
    }
}

fn policy_strategy() -> impl Strategy<Value = Policy> {
    prop_oneof![
        (1u32..=10).prop_map(Policy::Every),
        Just(Policy::Always),
        Just(Policy::Never),
        (1u32..=10, 1u64..=5_000).prop_map(|(n, ns)| Policy::Adaptive {
            max_unsignaled: n,
            max_lag: Duration::from_nanos(ns),
        }),
    ]
}

fn status_strategy() -> impl Strategy<Value = WcStatus> {
    prop::sample::select(
        WcStatus::ALL
            .iter()
            .copied()
            .filter(|s| !s.is_success() && !s.is_flush())
            .collect::<Vec<_>>(),
    )
}

struct Reference;

impl ReferenceStateMachine for Reference {
    type State = Model;
    type Transition = Transition;

    fn init_state() -> BoxedStrategy<Model> {
        (
            1u32..=12,
            1u32..=16,
            policy_strategy(),
            prop::sample::select(vec![1u64, (1 << 16) - 4, (1 << 32) - 4, u64::MAX - 24]),
            prop::bool::weighted(0.1),
            prop::bool::ANY,
        )
            .prop_map(|(sq, cq, policy, first, sig_all, measure_lag)| Model {
                cfg: Cfg {
                    sq,
                    cq,
                    policy,
                    first,
                    sig_all,
                    measure_lag,
                },
                now_ns: 0,
                wrs: Vec::new(),
                next_id: 1000,
                draining: false,
                lost: false,
                error: None,
                nic_next: 0,
                nic_error: false,
                nic_fail_next: None,
                cq: VecDeque::new(),
                delivered: Vec::new(),
                counts: Counts::default(),
                last: Expect::Nothing,
            })
            .boxed()
    }

    fn transitions(state: &Model) -> BoxedStrategy<Transition> {
        let bogus = state.bogus_candidates();
        let base = prop_oneof![
            6 => (1u8..=6, any::<u8>(), prop::option::weighted(0.15, 0u8..6), any::<bool>()).prop_map(
                |(n, force, refuse_from, whole)| Transition::Post { n, force: force & force.rotate_left(3), refuse_from, whole }
            ),
            2 => (0u32..3_000).prop_map(Transition::Tick),
            5 => (1u8..=8).prop_map(Transition::Execute),
            1 => status_strategy().prop_map(Transition::FailNext),
            5 => (1u8..=8).prop_map(Transition::Poll),
            4 => (1u8..=COLLECT_ALL).prop_map(Transition::Collect),
            2 => (0u8..=8).prop_map(Transition::CollectCompleted),
            1 => Just(Transition::Confirm),
        ];
        let rare = prop_oneof![
            Just(Transition::ModifyToError),
            Just(Transition::Drain),
            Just(Transition::DeviceLost),
        ];
        if bogus.is_empty() {
            prop_oneof![20 => base, 1 => rare].boxed()
        } else {
            prop_oneof![
                20 => base,
                1 => rare,
                2 => prop::sample::select(bogus).prop_map(Transition::Bogus),
            ]
            .boxed()
        }
    }

    fn preconditions(state: &Model, t: &Transition) -> bool {
        match t {
            Transition::Bogus(wc) => state.check(wc).is_err(),
            Transition::DeviceLost => state.cq.is_empty(),
            _ => true,
        }
    }

    fn apply(mut s: Model, t: &Transition) -> Model {
        s.last = match *t {
            Transition::Post {
                n,
                force,
                refuse_from,
                whole,
            } => {
                let start = s.wrs.len();
                let mut results = Vec::new();
                for i in 0..n {
                    let r = s.post(force & (1 << i) != 0);
                    let stop = r.is_err();
                    results.push(r);
                    if stop {
                        break;
                    }
                }
                let posted = s.wrs.len() - start;
                let handed_back = match refuse_from {
                    Some(_) if whole && posted > 0 => s.rollback(start),
                    Some(k) if (k as usize) < posted => s.rollback(start + k as usize),
                    _ => Vec::new(),
                };
                Expect::Posts {
                    results,
                    handed_back,
                }
            }
            Transition::Tick(ns) => {
                s.now_ns += u64::from(ns);
                Expect::Nothing
            }
            Transition::Execute(n) => {
                s.execute(n as usize);
                Expect::Nothing
            }
            Transition::FailNext(status) => {
                s.nic_fail_next = Some(status);
                Expect::Nothing
            }
            Transition::ModifyToError => {
                s.nic_error = true;
                Expect::Nothing
            }
            Transition::Poll(n) => {
                let mut results = Vec::new();
                s.delivered.clear();
                for _ in 0..n {
                    let Some(wc) = s.cq.pop_front() else { break };
                    s.delivered.push(wc);
                    results.push(s.complete(&wc));
                }
                Expect::Completions(results)
            }
            Transition::Collect(COLLECT_ALL) => Expect::Collected(s.collect(usize::MAX)),
            Transition::Collect(n) => Expect::Collected(s.collect(n as usize)),
            Transition::CollectCompleted(n) => Expect::Completed(s.collect_completed(n as usize)),
            Transition::Confirm => {
                let r = match s.error {
                    Some((first, _)) => Err(PostErr::QueueError(first)),
                    None if s.run() == 0 => Ok(None),
                    None => s.marker().map(Some),
                };
                Expect::Marker(r)
            }
            Transition::Drain => {
                s.draining = true;
                Expect::Marker(s.marker().map(Some))
            }
            Transition::DeviceLost => Expect::Lost(s.lose_device()),
            Transition::Bogus(wc) => Expect::Completions(vec![s.complete(&wc)]),
        };
        s
    }
}

// ----- the system under test ------------------------------------------------------------

struct Sut {
    tracker: SendTracker<u64>,
    epoch: Instant,
    now: Instant,
    next_id: u64,
}

impl Sut {
    fn now(&self, ns: u64) -> Instant {
        self.epoch + Duration::from_nanos(ns)
    }
}

impl StateMachineTest for Sut {
    type SystemUnderTest = Self;
    type Reference = Reference;

    fn init_test(m: &Model) -> Self {
        let epoch = Instant::now();
        let config = TrackerConfig::new(m.cfg.sq, m.cfg.cq)
            .policy(m.cfg.policy)
            .first_seq(m.cfg.first)
            .sq_sig_all(m.cfg.sig_all)
            .measure_lag(m.cfg.measure_lag)
            .qp_num(QP);
        Sut {
            tracker: SendTracker::new(config, epoch).expect("valid config"),
            epoch,
            now: epoch,
            next_id: 1000,
        }
    }

    fn apply(mut sut: Self, m: &Model, t: Transition) -> Self {
        let actual = match t {
            Transition::Post {
                n,
                force,
                refuse_from,
                whole,
            } => {
                let start = sut.tracker.next_seq();
                let mut results = Vec::new();
                for i in 0..n {
                    let id = sut.next_id;
                    let signal = if force & (1 << i) != 0 {
                        Signal::Force
                    } else {
                        Signal::Auto
                    };
                    match sut.tracker.post(id, signal, sut.now) {
                        Ok(p) => {
                            sut.next_id += 1;
                            results.push(Ok((p.seq.0, p.signal)));
                        }
                        Err(e) => {
                            results.push(Err(post_err(&e)));
                            assert_eq!(e.into_payload(), id, "the payload comes back");
                            break;
                        }
                    }
                }
                let posted = sut.tracker.next_seq().0 - start.0;
                // An all-or-nothing provider's refusal takes the whole batch back, whichever
                // work request it names.
                let from = match refuse_from {
                    Some(_) if whole => Some(0),
                    k => k.map(u64::from),
                };
                let handed_back = match from {
                    Some(k) if k < posted => {
                        let back: Vec<u64> = sut
                            .tracker
                            .rollback(Seq(start.0 + k))
                            .expect("rollback of a fresh batch")
                            .collect();
                        sut.next_id -= back.len() as u64;
                        back
                    }
                    _ => Vec::new(),
                };
                Expect::Posts {
                    results,
                    handed_back,
                }
            }
            Transition::Tick(_) => {
                sut.now = sut.now(m.now_ns);
                Expect::Nothing
            }
            Transition::Execute(_) | Transition::FailNext(_) | Transition::ModifyToError => {
                Expect::Nothing
            }
            Transition::Poll(_) => {
                let results = m
                    .delivered
                    .iter()
                    .map(|wc| {
                        let r = sut
                            .tracker
                            .handle_completion(wc, sut.now)
                            .map(|h| (h.first.0, h.seq.0, h.retired, h.entered_error));
                        assert!(
                            r.is_ok(),
                            "a completion the NIC produced was refused: {r:?}"
                        );
                        r
                    })
                    .collect();
                Expect::Completions(results)
            }
            Transition::Collect(n) => {
                let mut out = Vec::new();
                if n == COLLECT_ALL {
                    sut.tracker.poll_retired_with(|r| {
                        out.push((r.seq.0, r.payload, r.outcome, r.signaled))
                    });
                }
                while out.len() < n as usize && n != COLLECT_ALL {
                    let Some(r) = sut.tracker.poll_retired() else {
                        break;
                    };
                    out.push((r.seq.0, r.payload, r.outcome, r.signaled));
                }
                for (seq, _, outcome, _) in &out {
                    let truth = m.wrs[m.idx(*seq)].truth;
                    assert_eq!(
                        Some(*outcome),
                        truth,
                        "WR {seq}: the tracker's outcome differs from what the NIC did"
                    );
                }
                Expect::Collected(out)
            }
            Transition::CollectCompleted(n) => {
                let mut out = Vec::new();
                let handed = sut.tracker.poll_completed_with(n as usize, |p| out.push(p));
                assert_eq!(handed, out.len());
                Expect::Completed(out)
            }
            Transition::Confirm => Expect::Marker(
                sut.tracker
                    .confirm_all(sut.now)
                    .map(|o| o.map(|s| s.0))
                    .map_err(|e| post_err(&e)),
            ),
            Transition::Drain => {
                sut.tracker.start_drain();
                Expect::Marker(
                    sut.tracker
                        .post_marker(sut.now)
                        .map(|s| Some(s.0))
                        .map_err(|e| post_err(&e)),
                )
            }
            Transition::DeviceLost => Expect::Lost(sut.tracker.device_lost()),
            Transition::Bogus(wc) => Expect::Completions(vec![
                sut.tracker
                    .handle_completion(&wc, sut.now)
                    .map(|h| (h.first.0, h.seq.0, h.retired, h.entered_error)),
            ]),
        };
        assert_eq!(actual, m.last, "after {t:?}");
        sut
    }

    fn check_invariants(sut: &Self, m: &Model) {
        let t = &sut.tracker;
        assert_eq!(t.outstanding(), m.outstanding());
        assert!(t.outstanding() <= m.cfg.sq, "outstanding exceeds the SQ");
        assert!(
            t.outstanding() <= m.cfg.cq,
            "outstanding exceeds the CQ credits"
        );
        assert!(m.cq.len() <= m.cfg.cq as usize, "the CQ would have overrun");
        assert_eq!(t.signaled_outstanding(), m.signaled_outstanding());
        assert_eq!(t.next_seq().0, m.next_seq());
        if m.error.is_none() {
            assert_eq!(t.unsignaled_run() as usize, m.run());
            assert!(
                t.unsignaled_run() < m.run_limit(),
                "an unsignaled run as long as the queue"
            );
            if t.outstanding() == m.run_limit() {
                assert!(
                    t.signaled_outstanding() > 0,
                    "a full queue with nothing signaled"
                );
            }
        }
        match (t.state(), m.error) {
            (QueueState::DeviceLost, _) => assert!(m.lost),
            (_, _) if m.lost => panic!("the device was lost, the tracker says {:?}", t.state()),
            (QueueState::Error { first, status }, Some((f, s))) => {
                assert_eq!((first.0, status), (f, s))
            }
            (QueueState::Ready, None) => assert!(!m.draining),
            (QueueState::Draining, None) => assert!(m.draining),
            (state, error) => panic!("state {state:?}, model error {error:?}"),
        }
        let s = t.stats();
        let c = &m.counts;
        let actual = Counts {
            posted: s.posted,
            signaled: s.signaled,
            requested: s.requested,
            forced: s.forced,
            markers: s.markers,
            cqes: s.cqes,
            success_cqes: s.success_cqes,
            error_cqes: s.error_cqes,
            flush_cqes: s.flush_cqes,
            rejected_cqes: s.rejected_cqes,
            completed: s.completed,
            failed: s.failed,
            flushed: s.flushed,
            lost: s.lost,
        };
        assert_eq!(&actual, c);
        let lags = if m.cfg.measure_lag {
            c.completed + c.failed + c.flushed
        } else {
            0
        };
        assert_eq!(s.lag_ns.len(), lags);
        assert_eq!(s.wrs_per_cqe.len(), c.cqes);
    }

    fn teardown(mut sut: Self, mut m: Model) {
        // Settle: the NIC executes everything, every completion is handled, the tail is
        // confirmed; then every work request ever posted has been handed back exactly once,
        // in order, with the outcome the NIC gave it.
        let mut collected: Vec<(u64, u64, Outcome, bool)> = Vec::new();
        for w in &m.wrs {
            if w.delivered
                && let Some(id) = w.id
            {
                collected.push((0, id, w.outcome.unwrap(), false));
            }
        }
        for round in 0..3 {
            m.execute(usize::MAX);
            while let Some(wc) = m.cq.pop_front() {
                m.complete(&wc).expect("model accepts NIC completions");
                sut.tracker
                    .handle_completion(&wc, sut.now)
                    .expect("tracker accepts NIC completions");
            }
            while let Some(r) = sut.tracker.poll_retired() {
                assert_eq!(Some(r.outcome), m.wrs[m.idx(r.seq.0)].truth);
                collected.push((r.seq.0, r.payload, r.outcome, r.signaled));
            }
            if round == 0 && m.error.is_none() {
                let marker = sut
                    .tracker
                    .confirm_all(sut.now)
                    .expect("confirm")
                    .map(|s| s.0);
                let expected = if m.run() == 0 {
                    None
                } else {
                    Some(m.marker().expect("a confirm marker fits"))
                };
                assert_eq!(marker, expected);
            } else if round == 0 && !sut.tracker.is_idle() {
                // A NIC error state that came with no completion left to tell: drain.
                m.marker().expect("drain marker fits");
                sut.tracker.post_marker(sut.now).expect("drain marker fits");
            }
        }
        assert!(
            sut.tracker.is_idle(),
            "not settled: {:?}",
            sut.tracker.state()
        );
        let ids: Vec<u64> = collected.iter().map(|c| c.1).collect();
        let expected: Vec<u64> = m.wrs.iter().filter_map(|w| w.id).collect();
        assert_eq!(ids, expected, "every WR handed back once, in posting order");
    }
}
