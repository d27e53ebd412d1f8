//! What a campaign checks: the race analysis of each documented race class, the checks
//! of a run (one outcome per work request, memory as the outcomes say), the comparison of
//! two traces, the shrinker; and generated race-free scenarios run twice, identical.

use selsig_scenario::{
    Event, GenOptions, RunOptions, check_run, compare_traces, generate, parse, shrink,
};
use selsig_soft::{Personality, SoftConfig, SoftDevice};

const HEAD: &str = r#"
description = "races"
[[cq]]
name = "shared"
size = 9
[[qp]]
name = "a"
depth = 8
send_cq = "shared"
[[qp]]
name = "b"
depth = 8
send_cq = "shared"
rnr_retry = 3
[[region]]
name = "src"
size = 1024
fill = "pattern"
[[region]]
name = "dst"
size = 1024
access = ["local_write", "remote_write"]
"#;

fn races(steps: &str) -> Vec<(usize, &'static str)> {
    let text = format!("{HEAD}{steps}");
    let sc = parse("races.toml", "races", &text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    sc.races().iter().map(|r| (r.step, r.class)).collect()
}

const WRITE_A: &str = "[[step]]\npost = { qp = \"a\", op = \"write\", local = \"src\", remote = \"dst\", size = 64, count = 2 }\n";
const WRITE_B: &str = "[[step]]\npost = { qp = \"b\", op = \"write\", local = \"src\", remote = \"dst\", size = 64, count = 2, remote_offset = 512 }\n";
const IDLE: &str =
    "[[step]]\nconfirm = \"a\"\n[[step]]\nconfirm = \"b\"\n[[step]]\npoll = \"idle\"\n";

#[test]
fn each_documented_race_class_is_flagged_at_its_step() {
    // A to_error and a dereg while work is in flight.
    assert_eq!(
        races(&format!(
            "{WRITE_A}[[step]]\nto_error = \"a\"\n[[step]]\npoll = \"idle\"\n"
        )),
        [(2, "to_error_in_flight")]
    );
    assert_eq!(
        races(&format!("{WRITE_A}[[step]]\ndereg = \"dst\"\n{IDLE}")),
        [(2, "dereg_in_flight")]
    );
    // Two queue pairs writing the same bytes.
    let same = WRITE_B.replace(", remote_offset = 512", "");
    assert_eq!(
        races(&format!("{WRITE_A}{same}{IDLE}")),
        [(2, "same_bytes")]
    );
    // poll = { cqes = N } while two CQs can complete.
    let two = format!(
        "{}[[step]]\nrecv = {{ qp = \"a.peer\" }}\n[[step]]\npost = {{ qp = \"a\", op = \"send\" }}\n[[step]]\npoll = {{ cqes = 1 }}\n{IDLE}",
        WRITE_A.replace(", count = 2", ", signal = \"force\"")
    );
    assert_eq!(races(&two), [(4, "two_cqs")]);
    // A SEND on rnr_retry 3 posted before the receive meant for it.
    let rnr =
        "[[step]]\npost = { qp = \"b\", op = \"send\" }\n[[step]]\nrecv = { qp = \"b.peer\" }\n";
    assert_eq!(races(&format!("{rnr}{IDLE}")), [(1, "rnr_before_recv")]);
    // More work on a shared CQ's queues than it has credits for (9 for 8 + 8).
    let many = |q: &str, off: u32| {
        format!(
            "[[step]]\npost = {{ qp = \"{q}\", op = \"write\", local = \"src\", remote = \"dst\", size = 8, count = 8, remote_offset = {off} }}\n"
        )
    };
    assert_eq!(
        races(&format!("{}{}{IDLE}", many("a", 0), many("b", 512))),
        [(2, "shared_credits")]
    );
}

#[test]
fn the_same_steps_with_the_work_retired_first_are_race_free() {
    let idle_a = "[[step]]\nconfirm = \"a\"\n[[step]]\npoll = \"idle\"\n";
    assert!(races(&format!("{WRITE_A}{idle_a}[[step]]\nto_error = \"a\"\n")).is_empty());
    assert!(races(&format!("{WRITE_A}{idle_a}[[step]]\ndereg = \"dst\"\n")).is_empty());
    let same = WRITE_B.replace(", remote_offset = 512", "");
    assert!(races(&format!("{WRITE_A}{idle_a}{same}{IDLE}")).is_empty());
    assert!(races(&format!("{WRITE_A}{WRITE_B}{IDLE}")).is_empty());
    // The receive first, then the SEND; a SEND that no receive is ever posted for fails
    // the same way every time.
    let ok =
        "[[step]]\nrecv = { qp = \"b.peer\" }\n[[step]]\npost = { qp = \"b\", op = \"send\" }\n";
    assert!(races(&format!("{ok}{IDLE}")).is_empty());
}

fn soft(p: Personality) -> SoftDevice {
    SoftDevice::open(SoftConfig::with_personality(p)).expect("the software NIC opens")
}

#[test]
fn race_free_generated_scenarios_give_the_same_trace_twice() {
    for p in [Personality::Mlx5, Personality::Rxe] {
        let dev = soft(p);
        let options = RunOptions::new().rxe(p == Personality::Rxe);
        let o = GenOptions::new().racy_percent(0).device_fatal(false);
        for seed in 0..150 {
            let g = generate(seed, &o);
            let sc = parse(&g.name, &g.name, &g.text).expect("it parses");
            let a = selsig_scenario::run(&sc, &dev, &options).expect("it runs");
            let b = selsig_scenario::run(&sc, &dev, &options).expect("it runs");
            assert!(
                a.error.is_none(),
                "seed {seed} on {p}: {:?}\n{}",
                a.error,
                g.text
            );
            assert_eq!(
                compare_traces(&a.trace, &b.trace),
                None,
                "seed {seed} on {p}\n{}",
                g.text
            );
            assert_eq!(check_run(&sc, &a), [], "seed {seed} on {p}\n{}", g.text);
        }
    }
}

#[test]
fn a_digest_that_is_not_what_the_outcomes_make_it_is_found() {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../scenarios/seed.toml"
    ))
    .expect("the seed scenario");
    let sc = parse("seed.toml", "seed", &text).expect("it parses");
    let dev = soft(Personality::Mlx5);
    let mut result = selsig_scenario::run(&sc, &dev, &RunOptions::new()).expect("it runs");
    assert_eq!(check_run(&sc, &result), []);
    for e in &mut result.trace {
        if let Event::Digest { fnv1a64, .. } = e {
            *fnv1a64 = "0000000000000000".to_string();
        }
    }
    let v = check_run(&sc, &result);
    assert!(
        !v.is_empty() && v.iter().all(|v| v.check == "memory"),
        "{v:?}"
    );
}

#[test]
fn a_work_request_without_its_one_outcome_is_found() {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../scenarios/error-mid.toml"
    ))
    .expect("a shipped scenario");
    let sc = parse("error-mid.toml", "error-mid", &text).expect("it parses");
    let dev = soft(Personality::Mlx5);
    let result = selsig_scenario::run(&sc, &dev, &RunOptions::new()).expect("it runs");
    assert_eq!(check_run(&sc, &result), []);
    // One retirement dropped, then one repeated, then two swapped.
    let retire = |t: &Vec<Event>| {
        t.iter()
            .position(|e| matches!(e, Event::Retire { .. }))
            .expect("a retire line")
    };
    let mut dropped = result.trace.clone();
    dropped.remove(retire(&dropped));
    let mut twice = result.trace.clone();
    let i = retire(&twice);
    twice.insert(i, twice[i].clone());
    let mut swapped = result.trace.clone();
    swapped.swap(i, i + 1);
    for (what, trace) in [("dropped", dropped), ("twice", twice), ("swapped", swapped)] {
        let mut r = selsig_scenario::run(&sc, &dev, &RunOptions::new()).expect("it runs");
        r.trace = trace;
        let v = check_run(&sc, &r);
        assert!(v.iter().any(|v| v.check == "outcomes"), "{what}: {v:?}");
    }
}

#[test]
fn traces_compare_line_by_line_with_events_apart() {
    let dev = soft(Personality::Mlx5);
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../scenarios/fault-no-access.toml"
    ))
    .expect("a shipped scenario");
    let sc = parse("f.toml", "f", &text).expect("it parses");
    let a = selsig_scenario::run(&sc, &dev, &RunOptions::new())
        .expect("it runs")
        .trace;
    assert_eq!(compare_traces(&a, &a), None);
    // An asynchronous event a step later is the same trace.
    let at = a
        .iter()
        .position(|e| matches!(e, Event::Async { .. }))
        .expect("an async event");
    let mut later = a.clone();
    let e = later.remove(at);
    later.insert(later.len() - 1, e);
    assert_eq!(compare_traces(&a, &later), None);
    let mut other = a.clone();
    other.pop();
    assert!(compare_traces(&a, &other).is_some_and(|d| d.contains("the trace ends")));
}

#[test]
fn the_shrinker_keeps_only_the_steps_the_failure_needs() {
    let text = format!("{HEAD}{WRITE_A}{WRITE_B}[[step]]\ndereg = \"dst\"\n{IDLE}");
    // "Fails" while it still deregisters: everything else can go but what the file
    // needs to stay valid.
    let calls = std::cell::Cell::new(0);
    let min = shrink(&text, 500, |t| {
        calls.set(calls.get() + 1);
        t.contains("dereg")
    });
    parse("min.toml", "min", &min).expect("the shrunk file is a scenario");
    assert!(min.contains("dereg"));
    assert!(
        !min.contains("qp = \"a\"") && !min.contains("qp = \"b\""),
        "{min}"
    );
    assert!(calls.get() > 0 && calls.get() <= 500);
    assert_eq!(min.matches("[[step]]").count(), 1, "{min}");
    // A budget of none changes nothing.
    assert_eq!(shrink(&text, 0, |_| true), text);
}
