//! The scenario generator: the same seed gives the same file, and every file is one the
//! checker accepts, covering every construct of the format over a thousand seeds.

use selsig_scenario::{GenOptions, generate, parse};

#[test]
fn the_same_seed_gives_the_same_file() {
    let o = GenOptions::new();
    for seed in [0, 1, 42, u64::MAX] {
        assert_eq!(generate(seed, &o).text, generate(seed, &o).text);
    }
    assert_ne!(generate(1, &o).text, generate(2, &o).text);
}

#[test]
fn every_generated_file_is_accepted() {
    let o = GenOptions::new();
    let mut bad = Vec::new();
    for seed in 0..3000 {
        let g = generate(seed, &o);
        if let Err(e) = parse(&g.name, &g.name, &g.text) {
            bad.push(format!("seed {seed}: {e}\n{}", g.text));
        }
    }
    assert!(
        bad.is_empty(),
        "{} refused; the first:\n{}",
        bad.len(),
        bad[0]
    );
}

/// The generator's word on races and the runner's analysis agree: a race-free scenario is
/// not flagged, and a racy one is flagged for the construct it was given.
#[test]
fn the_analysis_flags_exactly_the_racy_scenarios() {
    let o = GenOptions::new().racy_percent(30);
    let mut racy = 0;
    for seed in 0..3000 {
        let g = generate(seed, &o);
        let sc = parse(&g.name, &g.name, &g.text).expect("a generated scenario parses");
        let found: Vec<&str> = sc.races().iter().map(|r| r.class).collect();
        for class in &g.racy {
            assert!(
                found.contains(class),
                "seed {seed}: {class} not flagged, found {found:?}\n{}",
                g.text
            );
        }
        for class in &found {
            assert!(
                g.racy.contains(class),
                "seed {seed}: {class} flagged, not planned ({:?})\n{}",
                g.racy,
                g.text
            );
        }
        if g.racy.is_empty() {
            assert!(
                found.is_empty(),
                "seed {seed}: race-free, flagged {:?}\n{}",
                sc.races(),
                g.text
            );
        } else {
            racy += 1;
        }
    }
    assert!(racy > 300, "only {racy} racy scenarios in 3000");
}

#[test]
fn every_construct_appears_over_a_thousand_seeds() {
    let o = GenOptions::new();
    let all: String = (0..1000).map(|s| generate(s, &o).text).collect();
    for construct in [
        "op = \"write\"",
        "op = \"write_imm\"",
        "op = \"read\"",
        "op = \"send\"",
        "op = \"send_imm\"",
        "op = \"fetch_add\"",
        "op = \"cmp_swap\"",
        "fault = \"bad_rkey\"",
        "fault = \"bad_lkey\"",
        "fault = \"out_of_bounds\"",
        "fault = \"misaligned\"",
        "fault = \"inline_too_long\"",
        "fault_at =",
        "signal = \"force\"",
        "signal = \"last\"",
        "inline = true",
        "imm =",
        "list = [",
        "batch = true",
        "local_offset =",
        "remote_offset =",
        "recv = {",
        "poll = \"idle\"",
        "poll = { cqes = 1 }",
        "confirm =",
        "drain =",
        "dereg =",
        "to_error = \"q0\"",
        "to_error = \"q0.peer\"",
        "device_fatal = true",
        "[[cq]]",
        "send_cq =",
        "peer_cq =",
        "sq_sig_all = true",
        "rnr_retry =",
        "retry_cnt =",
        "max_send_sge =",
        "peer_access =",
        "policy = \"always\"",
        "policy = \"never\"",
        "policy = \"manual\"",
        "policy = \"every:",
        "remote = \"x",
        "remote = \"l",
        "remote = \"s",
        "add =",
        "compare =",
    ] {
        assert!(all.contains(construct), "{construct} never generated");
    }
}

#[test]
fn the_shipped_scenarios_races_are_the_documented_ones() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scenarios");
    let mut flagged = Vec::new();
    for entry in std::fs::read_dir(dir).expect("scenarios/") {
        let path = entry.expect("an entry").path();
        let sc = selsig_scenario::load(&path).expect("a shipped scenario parses");
        for r in sc.races() {
            flagged.push(format!(
                "{} step {} {}: {}",
                sc.name(),
                r.step,
                r.class,
                r.why
            ));
        }
    }
    flagged.sort();
    assert!(flagged.is_empty(), "{flagged:#?}");
}
