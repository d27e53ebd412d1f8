//! `selsig campaign` and the race warnings of `selsig run`, run as a user runs them.

use std::process::{Command, Output};

use serde_json::Value;

fn selsig(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_selsig"))
        .args(args)
        .output()
        .expect("the selsig binary runs")
}

fn json(o: &Output) -> Value {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).expect("--json - prints JSON")
}

#[test]
fn a_campaign_checks_every_generated_scenario_and_says_what_it_ran() {
    let o = selsig(&["campaign", "-n", "200", "--seed", "7", "--json", "-"]);
    let s = json(&o);
    assert_eq!(s["count"], 200);
    assert_eq!(s["seed"], 7);
    let free = s["race_free"].as_u64().expect("race_free");
    let racy = s["racy"].as_u64().expect("racy");
    assert_eq!(free + racy, 200);
    assert!(racy > 0 && free > 150, "{s}");
    assert_eq!(s["memory_checked"].as_u64(), Some(free));
    assert!(
        s["work_requests"].as_u64().expect("work_requests") > 2000,
        "{s}"
    );
    assert_eq!(s["failures"], Value::Array(Vec::new()));
    assert!(s["races"].as_object().is_some_and(|r| !r.is_empty()), "{s}");
    // The same seeds give the same scenarios: the same counts.
    let again = json(&selsig(&[
        "campaign", "-n", "200", "--seed", "7", "--json", "-",
    ]));
    assert_eq!(again["work_requests"], s["work_requests"]);
    assert_eq!(again["races"], s["races"]);
}

#[test]
fn against_the_software_nic_compares_every_race_free_trace() {
    let o = selsig(&[
        "campaign",
        "-n",
        "100",
        "--personality",
        "rxe",
        "--against",
        "soft:rxe",
        "--json",
        "-",
    ]);
    let s = json(&o);
    assert_eq!(s["traces_compared"], s["race_free"]);
    assert_eq!(s["against"], "soft:rxe");
    assert_eq!(s["failures"], Value::Array(Vec::new()));
}

#[test]
fn the_summary_table_names_the_seeds_and_the_checks() {
    let o = selsig(&["campaign", "-n", "30", "--seed", "100"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{out}");
    assert!(
        out.starts_with("campaign: seeds 100 to 129 on soft soft0 (mlx5)"),
        "{out}"
    );
    assert!(out.contains("race-free") && out.contains("each checked for exactly one outcome"));
}

#[test]
fn bad_options_are_refused_with_exit_code_2() {
    for args in [
        &["campaign", "--against", "verbs"][..],
        &["campaign", "-n", "0"],
        &["campaign", "--qps", "5"],
        &["campaign", "--racy", "101"],
    ] {
        let o = selsig(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("error"),
            "{args:?}"
        );
    }
    let o = selsig(&["campaign", "--against", "soft:foo"]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("soft:mlx5 or soft:rxe"));
}

#[test]
fn selsig_run_warns_of_a_racy_step_and_its_trace_says_so() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("racy.toml");
    std::fs::write(
        &path,
        r#"description = "a to_error while WRITEs are in flight"
[[qp]]
name = "a"
[[region]]
name = "src"
size = 256
[[region]]
name = "dst"
size = 256
access = ["local_write", "remote_write"]
[[step]]
post = { qp = "a", op = "write", local = "src", remote = "dst", size = 64, count = 4 }
[[step]]
to_error = "a"
[[step]]
poll = "idle"
"#,
    )
    .expect("the scenario is written");
    let o = selsig(&["run", path.to_str().expect("a UTF-8 path")]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("warning: scenario racy: step 2 races the NIC (to_error_in_flight)"),
        "{err}"
    );
    let first = String::from_utf8_lossy(&o.stdout)
        .lines()
        .next()
        .map(str::to_string);
    let first: Value = serde_json::from_str(&first.expect("a trace")).expect("a JSON line");
    assert_eq!(first["event"], "races");
    assert_eq!(first["races"][0]["step"], 2);
    assert_eq!(first["races"][0]["class"], "to_error_in_flight");
    // A race-free scenario: no warning, no races line.
    let seed = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scenarios/seed.toml");
    let o = selsig(&["run", seed]);
    assert!(!String::from_utf8_lossy(&o.stderr).contains("warning"));
    assert!(String::from_utf8_lossy(&o.stdout).starts_with("{\"event\":\"step\""));
}
