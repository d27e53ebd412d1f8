//! The `selsig` command, run as a user runs it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn selsig(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_selsig"))
        .args(args)
        .output()
        .expect("the selsig binary runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn scenarios() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios")
}

/// Writes `text` to `path` and runs it as a scenario, quietly.
fn run_scenario(path: &std::path::Path, text: &str) -> Output {
    std::fs::write(path, text).unwrap();
    selsig(&["run", path.to_str().unwrap(), "-q"])
}

/// A new directory for a test's files: `name`, this process's id and a count of the calls
/// (tests run in parallel: two that chose one name get two directories), under the temp dir.
fn scratch(name: &str) -> std::path::PathBuf {
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("{name}-{}-{call}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn demo_draws_the_seed() {
    let o = selsig(&["demo"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains("WR1(U) → WR2(U) → WR3(U) → WR4(S) → WR5(U) → WR6(U) → WR7(U) → WR8(S)"),
        "{out}"
    );
    assert!(out.contains("CQE4: WR1–WR4 confirmed"), "{out}");
    assert!(out.contains("CQE8: WR5–WR8 confirmed"), "{out}");
    let cqe_lines = out
        .lines()
        .filter(|l| l.trim_start().starts_with("CQE"))
        .count();
    assert_eq!(cqe_lines, 2, "only CQE4 and CQE8: {out}");
    assert!(out.contains("all 8 writes verified"), "{out}");
    assert!(out.contains("2 CQEs generated, 6 saved"), "{out}");
}

/// The demo prints exactly what README.md shows, with and without a failure.
#[test]
fn demo_prints_what_the_readme_shows() {
    let readme = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md"),
    )
    .unwrap();
    for (command, args) in [
        ("$ cargo run --release -q -- demo\n", &["demo"][..]),
        ("$ selsig demo --fail-at 3\n", &["demo", "--fail-at", "3"]),
    ] {
        let (_, block) = readme.split_once(command).expect("the README's block");
        let (shown, _) = block.split_once("```").unwrap();
        let o = selsig(args);
        assert!(o.status.success(), "{}", stderr(&o));
        assert_eq!(stdout(&o), shown, "{args:?}");
    }
}

#[test]
fn demo_counts_one_in_the_singular() {
    let o = selsig(&["demo", "--wrs", "1", "--fail-at", "1"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.starts_with("selsig demo: 1 RDMA WRITE of 64 B"),
        "{out}"
    );
    assert!(
        out.contains("Remote buffer: verified: the write did not land."),
        "{out}"
    );
    assert!(
        out.contains("0 WRs executed, 1 failed; 2 CQEs generated"),
        "{out}"
    );

    let o = selsig(&["demo", "--every", "8"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains("8 WRs executed; 1 CQE generated, 7 saved"),
        "{out}"
    );

    let o = selsig(&["demo", "--personality", "rxe", "--fail-at", "8"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains("the 7 completed writes landed (448 bytes), the other did not."),
        "{out}"
    );

    let o = selsig(&["demo", "--wrs", "2", "--fail-at", "1"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains("Remote buffer: verified: none of the 2 writes landed."),
        "{out}"
    );
    let o = selsig(&["demo", "--wrs", "1"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains("Remote buffer: the write verified (64 bytes)."),
        "{out}"
    );
    let o = selsig(&["demo", "--wrs", "2", "--size", "1", "--fail-at", "2"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains("the completed write landed (1 byte), the other did not."),
        "{out}"
    );
    // A queue of one slot: every WRITE signaled.
    let o = selsig(&["demo", "--tx-depth", "1"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("8 WRs executed; 8 CQEs generated, 0 saved"),
        "{}",
        stdout(&o)
    );
    // WRITEs never posted after a failure: no completion saved for them.
    let o = selsig(&["demo", "--wrs", "20", "-t", "4", "--fail-at", "2"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("16 not posted; 3 CQEs generated, 1 saved"),
        "{}",
        stdout(&o)
    );
}

#[test]
fn demo_json_reports_what_the_nic_did() {
    let o = selsig(&["demo", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_slice(&o.stdout).expect("one JSON object");
    assert_eq!(v["provider"], "soft");
    assert_eq!(v["wrs"], 8);
    assert_eq!(v["every"], 4);
    let cqes: Vec<(u64, String)> = v["cqes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["wr"].as_u64().unwrap(),
                c["status"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        cqes,
        [(4, "success".to_string()), (8, "success".to_string())]
    );
    assert_eq!(v["confirmed"][0]["cqe"], 4);
    assert_eq!(v["confirmed"][0]["wrs"], serde_json::json!([1, 2, 3, 4]));
    assert_eq!(v["confirmed"][1]["wrs"], serde_json::json!([5, 6, 7, 8]));
    assert!(
        v["outcomes"]
            .as_array()
            .unwrap()
            .iter()
            .all(|o| o["outcome"] == "completed")
    );
    assert_eq!(v["remote_verified"], true);
    // Each post as docs/demo-json.md says: selsig's wr_id, and why it was signaled.
    assert_eq!(v["posts"][0]["wr_id"], 9223372036854775809u64);
    assert_eq!(v["posts"][3]["reason"], "policy");
    // The interval of every policy, and a size of 0 as given.
    let json = |args: &[&str]| -> Value {
        let mut all = vec!["demo", "--json"];
        all.extend_from_slice(args);
        let o = selsig(&all);
        assert!(o.status.success(), "{}", stderr(&o));
        serde_json::from_slice(&o.stdout).unwrap()
    };
    assert_eq!(json(&["--policy", "always"])["every"], 1);
    assert_eq!(json(&["-e", "2"])["every"], 2);
    assert_eq!(json(&["--size", "0"])["size"], 0);
    // A tail confirmed by a marker: the completion is the marker's, of no WRITE.
    let v = json(&["--wrs", "1", "--policy", "never"]);
    assert_eq!(v["cqes"][0]["marker"], true, "{v}");
    assert!(v["cqes"][0]["wr"].is_null(), "{v}");
}

#[test]
fn demo_fail_at_shows_the_error_and_the_flushes() {
    let o = selsig(&["demo", "--fail-at", "3", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let cqes: Vec<(u64, &str)> = v["cqes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["wr"].as_u64().unwrap(), c["status"].as_str().unwrap()))
        .collect();
    let mut expected = vec![(3, "rem_access_err")];
    expected.extend((4..=8).map(|w| (w, "wr_flush_err")));
    assert_eq!(cqes, expected);
    let outcomes: Vec<&str> = v["outcomes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(
        outcomes,
        [
            "completed",
            "completed",
            "failed",
            "flushed",
            "flushed",
            "flushed",
            "flushed",
            "flushed"
        ]
    );
    assert_eq!(v["outcomes"][2]["status"], "rem_access_err");
    assert_eq!(v["remote_verified"], true, "WR1-WR2 landed, nothing else");
    let text = stdout(&selsig(&["demo", "--fail-at", "3"]));
    assert!(
        text.contains("CQE3: WR1–WR2 completed, WR3 failed"),
        "{text}"
    );
    assert!(text.contains("CQE8: WR8 flushed"), "{text}");
}

#[test]
fn demo_options_size_every_policy_personality() {
    let o = selsig(&[
        "demo",
        "-e",
        "2",
        "--size",
        "4K",
        "--wrs",
        "6",
        "--personality",
        "rxe",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["size"], 4096);
    assert_eq!(v["personality"], "rxe");
    assert_eq!(v["cqes"].as_array().unwrap().len(), 3);
    let o = selsig(&[
        "demo",
        "--policy",
        "never",
        "--tx-depth",
        "8",
        "--wrs",
        "20",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("WR8(S)") && out.contains("WR16(S)"), "{out}");
    assert!(out.contains("CQE(marker): WR17–WR20 confirmed"), "{out}");
}

/// The last WRITE fills the send queue unsignaled: the confirm marker waits for room
/// (it was refused as an error, exit 1, though every WRITE completed); zero-length WRITEs
/// too.
#[test]
fn demo_confirms_a_tail_that_filled_the_queue() {
    for (args, wrs, cqes) in [
        (&["--wrs", "64", "--every", "3"][..], 64, 22),
        (&["--wrs", "7", "-t", "4", "--every", "3"], 7, 3),
        (
            &["--wrs", "127", "--every", "7", "--personality", "rxe"],
            127,
            19,
        ),
        (&["--wrs", "64", "--policy", "adaptive:40,1s"], 64, 2),
        (
            &["--wrs", "5", "--size", "0", "-t", "4", "--every", "3"],
            5,
            2,
        ),
    ] {
        let mut all = vec!["demo", "--json"];
        all.extend_from_slice(args);
        let o = selsig(&all);
        assert_eq!(o.status.code(), Some(0), "{args:?}: {}", stderr(&o));
        let v: Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(v["summary"]["completed"], wrs, "{args:?}");
        assert_eq!(v["cqes"].as_array().unwrap().len(), cqes, "{args:?}");
        assert_eq!(v["remote_verified"], true, "{args:?}");
    }
}

#[test]
fn demo_bad_input_is_an_error_not_a_panic() {
    let seed = scenarios().join("seed.toml");
    let seed = seed.to_str().unwrap();
    for (args, text) in [
        (vec!["demo", "--wrs", "0"], "--wrs must be at least 1"),
        (vec!["demo", "--every", "0"], "--every must be at least 1"),
        (vec!["demo", "--fail-at", "9"], "--fail-at 9 names no WRITE"),
        (
            vec!["demo", "--size", "0", "--fail-at", "2"],
            "--fail-at 2 with --size 0: the remote key of a zero-length WRITE is not checked",
        ),
        (vec!["demo", "--size", "4Q"], "invalid size \"4Q\""),
        (vec!["demo", "--policy", "sometimes"], "unknown policy"),
        (vec!["demo", "--size", "2G"], "needs"),
        (vec!["demo", "--provider", "tcp"], "invalid value 'tcp'"),
        (
            vec!["demo", "--tx-depth", "4294967295"],
            "--tx-depth 4294967295 is too large",
        ),
        (
            vec!["demo", "--wrs", "1073741824", "--size", "0"],
            "--wrs 1073741824: the demo runs at most 1048576 WRITEs",
        ),
        // Options of the other provider.
        (
            vec!["demo", "--connect", "127.0.0.1"],
            "--connect 127.0.0.1: needs --provider verbs",
        ),
        (
            vec!["serve", "--once"],
            "selsig serve needs --provider verbs",
        ),
        (
            vec!["serve", "--provider", "verbs", "--bind", "0.0.0.0:9"],
            "--bind 0.0.0.0:9: not an address of this host (a name or an IP address, no port",
        ),
        (
            vec!["serve", "--provider", "verbs", "--bind", ""],
            "--bind '': no address given",
        ),
        (
            vec!["serve", "--provider", "verbs", "--max-memory", "0"],
            "--max-memory 0: 1 byte to 4294967296 (4GiB)",
        ),
        (
            vec!["serve", "--provider", "verbs", "--max-memory", "5GiB"],
            "--max-memory 5368709120: 1 byte to 4294967296 (4GiB)",
        ),
        (
            vec!["serve", "--provider", "verbs", "--max-run", "2days"],
            "--max-run 2days: at most a day",
        ),
        (
            vec!["serve", "--provider", "verbs", "--idle-timeout", "0s"],
            "--idle-timeout 0s: more than 0, at most a day",
        ),
        (
            vec![
                "serve",
                "--provider",
                "verbs",
                "--insecure",
                "--secret-file",
                "s",
            ],
            "the argument '--insecure' cannot be used with '--secret-file <FILE>'",
        ),
        (
            vec![
                "serve",
                "--provider",
                "verbs",
                "--secret-file",
                "/no/such/file",
            ],
            "cannot read the secret file /no/such/file",
        ),
        (
            vec![
                "serve",
                "--provider",
                "verbs",
                "--secret-file",
                "Cargo.toml",
            ],
            "Cargo.toml holds no secret: a secret is 64 hex digits (32 bytes)",
        ),
        (
            vec!["demo", "--provider", "verbs", "--personality", "rxe"],
            "--personality is for the soft provider",
        ),
        (
            vec!["run", &seed, "--post-api", "batched"],
            "unknown post API \"batched\": legacy (ibv_post_send) or extended",
        ),
        (
            vec!["demo", "-x", "3"],
            "--gid-index is for the verbs provider",
        ),
        (
            vec!["demo", "-d", ""],
            "invalid value '' for '--device <DEVICE>': a device name cannot be empty",
        ),
        (
            vec!["bench", "-d", "a\u{1}b"],
            "for '--device <DEVICE>': a device name cannot hold control characters",
        ),
        (
            vec!["run", seed, "-q", "-x", "1"],
            "--gid-index is for the verbs provider",
        ),
        (
            vec!["demo", "-i", "2"],
            "--ib-port: the soft NIC has port 1 only",
        ),
        (
            vec!["bench", "--ib-port", "2", "-e", "4", "-n", "8"],
            "--ib-port: the soft NIC has port 1 only",
        ),
        (
            vec!["run", seed, "-q", "-i", "3"],
            "--ib-port: the soft NIC has port 1 only",
        ),
        (
            vec!["demo", "-i", "0"],
            "invalid value '0' for '--ib-port <PORT>': 0 is not in 1..=255",
        ),
        // Negative numbers are values, named with their option.
        (
            vec!["demo", "--wrs", "-1"],
            "invalid value '-1' for '--wrs <N>'",
        ),
        (
            vec!["demo", "-e", "-2"],
            "invalid value '-2' for '--every <N>'",
        ),
        (
            vec!["demo", "--tx-depth", "-1"],
            "invalid value '-1' for '--tx-depth <N>'",
        ),
        (
            vec!["demo", "--fail-at", "-3"],
            "invalid value '-3' for '--fail-at <K>'",
        ),
        (vec!["demo", "--size", "-1"], "invalid size \"-1\""),
        (
            vec!["demo", "-x", "-1"],
            "invalid value '-1' for '--gid-index <GID_INDEX>'",
        ),
        (
            vec!["serve", "-p", "-1"],
            "invalid value '-1' for '--port <PORT>'",
        ),
        // An empty server address, before any device is opened.
        (
            vec!["demo", "--connect", ""],
            "invalid value '' for '--connect <HOST>': no host given",
        ),
        (
            vec!["bench", "--connect", " "],
            "invalid value ' ' for '--connect <HOST>': no host given",
        ),
        // A port that is not one, before anything is resolved.
        (
            vec!["bench", "--connect", "target:port"],
            "invalid value 'target:port' for '--connect <HOST>': \"port\" is not a port (1 to 65535)",
        ),
        (
            vec!["demo", "--connect", "[::1]9000"],
            "invalid value '[::1]9000' for '--connect <HOST>': ':PORT' or nothing may follow the ']'",
        ),
    ] {
        let o = selsig(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        let err = stderr(&o);
        assert!(err.starts_with("error: "), "{args:?}: {err}");
        assert!(err.contains(text), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}

#[test]
fn messages_to_a_closed_or_full_stderr_are_lost_not_a_panic() {
    // A bad option still exits 2.
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .expect("Linux has /dev/full");
    let o = Command::new(env!("CARGO_BIN_EXE_selsig"))
        .args(["demo", "--wrs", "0"])
        .stderr(full)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    // A scenario that passes exits 0 with nobody reading its summary.
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let seed = scenarios().join("seed.toml");
    let o = Command::new(env!("CARGO_BIN_EXE_selsig"))
        .args(["run", seed.to_str().unwrap()])
        .stderr(writer)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0));
    assert!(stdout(&o).contains("\"event\":\"cqe\""), "{}", stdout(&o));
    // Nor does it fail when nobody reads its trace.
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let o = Command::new(env!("CARGO_BIN_EXE_selsig"))
        .args(["run", seed.to_str().unwrap()])
        .stdout(writer)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stderr(&o).contains("expectations met"), "{}", stderr(&o));
}

/// An output file written over keeps its permissions (its new content is staged in a file
/// beside it, which is created for the owner alone).
#[test]
fn an_output_file_written_over_keeps_its_permissions() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = scratch("selsig-json-mode");
    let path = dir.join("it.json");
    std::fs::write(&path, "old").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
    let json = path.to_str().unwrap();
    let o = selsig(&["bench", "-n", "100", "-s", "64", "-e", "1", "--json", json]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    assert_eq!(v["points"][0]["wrs"], 100);
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o640);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Where the folder cannot take a temporary file (the user may write the file, not the
/// folder), the file is written over in place: last, once every other output is staged, and
/// put back as it was when that write fails part-way (a full disk, a quota; here a file-size
/// limit), so a failed run leaves it as it was. (Run as `nobody` when the tests run as root,
/// whom no folder's mode stops.)
#[test]
fn a_file_written_over_in_place_is_left_as_it_was_when_the_run_fails() {
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
    use std::os::unix::process::CommandExt as _;
    let dir = scratch("selsig-in-place");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let root = std::fs::metadata(&dir).unwrap().uid() == 0;
    // A copy of the binary that nobody may run (the build may sit in a folder only its
    // owner enters, as a clone in /root does).
    let bin = dir.join("selsig");
    std::fs::copy(env!("CARGO_BIN_EXE_selsig"), &bin).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let locked = dir.join("locked");
    std::fs::create_dir(&locked).unwrap();
    let json = locked.join("out.json");
    let old_json = "{\"old\": true}\n";
    // The bench's JSON is about 1.5 kB and its SVG about 17 kB: a limit of 512 bytes fails
    // the JSON, one of 4 kB the SVG only (staged beside it, or written over in place after
    // the JSON was).
    let beside = dir.join("out.svg");
    let in_place = locked.join("out.svg");
    for (limit_blocks, svg) in [(1, None), (8, Some(&beside)), (8, Some(&in_place))] {
        std::fs::write(&json, old_json).unwrap();
        for path in [&beside, &in_place] {
            std::fs::write(path, "<old/>").unwrap();
        }
        if root {
            for path in [&json, &beside, &in_place] {
                std::os::unix::fs::chown(path, Some(65534), Some(65534)).unwrap();
            }
        }
        std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o555)).unwrap();
        // SIGXFSZ ignored: a write past the limit fails with EFBIG instead of killing.
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(format!(
                "trap '' XFSZ; ulimit -f {limit_blocks}; exec \"$0\" \"$@\""
            ))
            .arg(&bin)
            .args([
                "bench", "-s", "64", "-e", "1", "-t", "8", "-n", "8", "--json",
            ])
            .arg(&json);
        if let Some(svg) = svg {
            cmd.arg("--svg").arg(svg);
        }
        if root {
            cmd.uid(65534).gid(65534);
        }
        let o = cmd.output().unwrap();
        std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o755)).unwrap();
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{err}");
        let failed = svg.unwrap_or(&json);
        assert!(
            err.contains(&format!("{}: cannot write the file", failed.display())),
            "{err}"
        );
        assert_eq!(
            std::fs::read_to_string(&json).unwrap(),
            old_json,
            "limit {limit_blocks} blocks, --svg {svg:?}: the JSON as it was"
        );
        for path in [&beside, &in_place] {
            assert_eq!(std::fs::read_to_string(path).unwrap(), "<old/>", "{svg:?}");
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The table is written before the files: where standard output cannot be written, the
/// run fails and the files named by `--json` and `--svg` are left as they were.
#[test]
fn bench_files_are_left_as_they_were_when_standard_output_fails() {
    let dir = scratch("selsig-full-stdout");
    let json = dir.join("it.json");
    let svg = dir.join("it.svg");
    for (json_arg, svg_arg) in [("FILE", "FILE"), ("-", "FILE"), ("FILE", "-")] {
        std::fs::write(&json, "old").unwrap();
        std::fs::write(&svg, "old").unwrap();
        let pick = |arg: &str, path: &Path| match arg {
            "-" => "-".to_string(),
            _ => path.to_str().unwrap().to_string(),
        };
        let o = Command::new(env!("CARGO_BIN_EXE_selsig"))
            .args(["bench", "-s", "64", "-e", "1", "-t", "8", "-n", "8"])
            .args([
                "--json",
                &pick(json_arg, &json),
                "--svg",
                &pick(svg_arg, &svg),
            ])
            .stdout(std::fs::File::create("/dev/full").unwrap())
            .output()
            .unwrap();
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{json_arg} {svg_arg}: {err}");
        assert!(err.contains("cannot write to standard output"), "{err}");
        assert_eq!(
            std::fs::read_to_string(&json).unwrap(),
            "old",
            "{json_arg} {svg_arg}"
        );
        assert_eq!(
            std::fs::read_to_string(&svg).unwrap(),
            "old",
            "{json_arg} {svg_arg}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bench_writes_json_to_a_file_name_that_is_not_utf8() {
    use std::os::unix::ffi::OsStrExt as _;
    let dir = scratch("selsig-json-name");
    let path = dir.join(std::ffi::OsStr::from_bytes(b"\xff.json"));
    let o = Command::new(env!("CARGO_BIN_EXE_selsig"))
        .args(["bench", "-n", "100", "-s", "64", "-e", "1", "--json"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    assert_eq!(v["points"][0]["wrs"], 100);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_device_limit_names_the_option_that_crossed_it() {
    let o = selsig(&["demo", "--tx-depth", "100000"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("cannot create the queue pair of --tx-depth 100000"),
        "{}",
        stderr(&o)
    );
}

/// A flag means the same in every subcommand: `-e` is the signal interval in `demo` and
/// `bench`; `-Q`/`--cq-mod`, perftest's, exists only as `bench`'s perftest mode.
#[test]
fn flags_mean_the_same_in_every_subcommand() {
    let demo = stdout(&selsig(&["demo", "--help"]));
    let bench = stdout(&selsig(&["bench", "--help"]));
    assert!(demo.contains("-e, --every <N>"), "{demo}");
    assert!(bench.contains("-e, --every <LIST>"), "{bench}");
    assert!(bench.contains("-Q, --cq-mod <N>"), "{bench}");
    for flag in ["-Q", "--cq-mod"] {
        let o = selsig(&["demo", flag, "2"]);
        assert_eq!(o.status.code(), Some(2), "{flag}: {}", stdout(&o));
        assert!(
            stderr(&o).contains(&format!("unexpected argument '{flag}'")),
            "{}",
            stderr(&o)
        );
    }
}

#[test]
fn help_reads_well() {
    let o = selsig(&["--help"]);
    assert!(o.status.success());
    let out = stdout(&o);
    assert!(out.contains("demo") && out.contains("run"), "{out}");
    let out = stdout(&selsig(&["demo", "--help"]));
    assert!(
        out.contains("--every") && out.contains("--fail-at") && out.contains("--personality"),
        "{out}"
    );
    let out = stdout(&selsig(&["run", "--help"]));
    assert!(out.contains("SCENARIO") && out.contains("--trace"), "{out}");
}

#[test]
fn every_shipped_scenario_meets_its_expectations_with_a_stable_trace() {
    let mut files: Vec<PathBuf> = std::fs::read_dir(scenarios())
        .expect("scenarios/")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    files.sort();
    assert!(files.len() >= 9, "the shipped scenarios: {files:?}");
    for f in &files {
        let path = f.to_str().unwrap();
        let first = selsig(&["run", path]);
        assert!(first.status.success(), "{path}: {}", stderr(&first));
        assert!(
            stderr(&first).contains("expectations met"),
            "{path}: {}",
            stderr(&first)
        );
        let again = selsig(&["run", path]);
        assert_eq!(
            stdout(&first),
            stdout(&again),
            "{path}: the trace changed between runs"
        );
        for line in stdout(&first).lines() {
            let v: Value = serde_json::from_str(line).expect("JSON lines");
            assert!(v["event"].is_string(), "{line}");
            assert!(!line.contains("0x7f"), "no addresses in the trace: {line}");
            // Fields a line does not define are left out, not written empty.
            assert!(
                !line.contains(":null") && !line.contains("\"marker\":false"),
                "{path}: {line}"
            );
        }
        // The rxe personality gives the same trace (it frees slots earlier, which the
        // tracker's own accounting does not depend on), except where the scenario says
        // why rxe differs; then it meets its rxe expectations.
        let rxe = selsig(&["run", path, "--personality", "rxe"]);
        assert!(rxe.status.success(), "{path} on rxe: {}", stderr(&rxe));
        let declared = std::fs::read_to_string(f).unwrap().contains("[differs]");
        if declared {
            assert!(
                stderr(&rxe).contains("the rxe expectations apply"),
                "{path}: {}",
                stderr(&rxe)
            );
        } else {
            assert_eq!(
                stdout(&first),
                stdout(&rxe),
                "{path}: mlx5 and rxe personalities differ"
            );
        }
    }
}

#[test]
fn failed_expectations_fail_the_run() {
    let dir = scratch("selsig-cli-test");
    let seed = std::fs::read_to_string(scenarios().join("seed.toml")).unwrap();
    let wrong = seed.replace(
        "wr_id = 8, status = \"success\"",
        "wr_id = 7, status = \"success\"",
    );
    let path = dir.join("wrong.toml");
    std::fs::write(&path, wrong).unwrap();
    let o = selsig(&["run", path.to_str().unwrap(), "-q"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("completion 2: expected a wr_id 7"),
        "{}",
        stderr(&o)
    );
    // Immediate data is compared where given.
    let mixed = std::fs::read_to_string(scenarios().join("mixed-ops.toml")).unwrap();
    std::fs::write(
        &path,
        mixed.replace("byte_len = 64, imm = 42", "byte_len = 64, imm = 43"),
    )
    .unwrap();
    let o = selsig(&["run", path.to_str().unwrap(), "-q"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(
            "completion 6: expected a.peer wr_id 2 success recv_rdma_with_imm byte_len 64 imm \
             43, got a.peer wr_id 2 success recv_rdma_with_imm byte_len 64 imm 42"
        ),
        "{}",
        stderr(&o)
    );
    // Outcomes expected for work requests never posted fail the run, however many the
    // range names (it is not expanded to the end).
    for (items, first_missing) in [
        ("\"1-18446744073709551615 completed\"", 9),
        ("\"9-12 completed\"", 9),
        // A range that starts beyond the first work request not posted.
        ("\"1-8 completed\", \"20-30 completed\"", 20),
    ] {
        let path = dir.join("beyond.toml");
        let text = seed.replace("\"1-8 completed\"", items);
        std::fs::write(&path, text).unwrap();
        let o = selsig(&["run", path.to_str().unwrap(), "-q"]);
        assert_eq!(o.status.code(), Some(1), "{items}: {}", stderr(&o));
        let err = stderr(&o);
        assert!(
            err.contains(&format!("{first_missing}: expected completed got nothing")),
            "{items}: {err}"
        );
    }
    // Waiting for more completions than the outstanding work can give fails at once
    // (it waited out the 20 s limit), with what is outstanding.
    let path = dir.join("too-many.toml");
    let text = seed.replace("poll = \"idle\"", "poll = { cqes = 3 }");
    std::fs::write(&path, text).unwrap();
    let started = std::time::Instant::now();
    let o = selsig(&["run", path.to_str().unwrap(), "-q"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("2 of 3 completions arrived and no more can: nothing is outstanding"),
        "{}",
        stderr(&o)
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
    // A receive that no SEND or WRITE with immediate can use, and no error flushes, gives
    // no completion either: the same at once, naming it.
    let path = dir.join("unused-receive.toml");
    let text = seed.replace(
        "poll = \"idle\"",
        "recv = { qp = \"a.peer\" }\n\n[[step]]\npoll = { cqes = 3 }",
    );
    std::fs::write(&path, text).unwrap();
    let started = std::time::Instant::now();
    let o = selsig(&["run", path.to_str().unwrap(), "-q"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(
            "2 of 3 completions arrived and no more can: at most 0 more (a: 0 work requests, 1 \
             receives outstanding (1 of them used by no SEND or WRITE with immediate posted, \
             and not flushed))"
        ),
        "{}",
        stderr(&o)
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
    std::fs::remove_dir_all(&dir).ok();
}

/// A step that fails ends the run with its error; the trace up to it goes to stdout, not
/// with `-q`, and not to a `--trace` file (written only by a complete run).
#[test]
fn a_failed_step_prints_the_trace_up_to_it_unless_quiet_or_to_a_file() {
    let dir = scratch("selsig-cli-failed-step");
    let seed = scenarios().join("seed.toml");
    let whole = selsig(&["run", seed.to_str().unwrap()]);
    assert!(whole.status.success(), "{}", stderr(&whole));
    // The seed's trace without its digests, which come after the last step.
    let expected: String = stdout(&whole)
        .lines()
        .filter(|l| !l.contains("\"event\":\"digest\""))
        .map(|l| format!("{l}\n"))
        .collect();
    assert!(expected.contains("\"wr_id\":8"), "{expected}");
    let path = dir.join("too-many.toml");
    let text = std::fs::read_to_string(&seed)
        .unwrap()
        .replace("poll = \"idle\"", "poll = { cqes = 3 }");
    std::fs::write(&path, text).unwrap();
    let path = path.to_str().unwrap();
    let error = "step 2 (poll): only 2 of 3 completions arrived";
    let o = selsig(&["run", path]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains(error), "{}", stderr(&o));
    assert!(!stderr(&o).contains("expectations"), "{}", stderr(&o));
    assert_eq!(stdout(&o), expected);
    let o = selsig(&["run", "-q", path]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains(error), "{}", stderr(&o));
    assert!(o.stdout.is_empty(), "{}", stdout(&o));
    let trace = dir.join("trace.jsonl");
    std::fs::write(&trace, "old\n").unwrap();
    let o = selsig(&["run", path, "--trace", trace.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains(error), "{}", stderr(&o));
    assert!(o.stdout.is_empty(), "{}", stdout(&o));
    assert_eq!(std::fs::read_to_string(&trace).unwrap(), "old\n");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A request that fails at the peer without a fault (here a WRITE to a region without
/// remote write) moves the peer to the error state, which flushes its receives: a
/// `poll = { cqes = N }` counting on those flushes waits for them, and a poll until idle
/// is accepted.
#[test]
fn receives_a_failed_request_flushes_count_for_a_poll() {
    let dir = scratch("selsig-cli-flushed-recvs");
    let path = dir.join("flushed.toml");
    std::fs::write(
        &path,
        r#"description = "two receives, then a WRITE the peer refuses"
[[qp]]
name = "a"
[[region]]
name = "src"
size = 64
access = ["local_write"]
[[region]]
name = "buf"
size = 64
access = ["local_write"]
[[region]]
name = "dst"
size = 64
access = ["remote_read"]
[[step]]
recv = { qp = "a.peer", region = "buf", size = 32, count = 2 }
[[step]]
post = { qp = "a", op = "write", local = "src", remote = "dst", size = 64 }
[[step]]
poll = { cqes = 3 }
[expect]
outcomes = { a = ["1 failed:rem_access_err"] }
"#,
    )
    .unwrap();
    for _ in 0..3 {
        let o = selsig(&["run", path.to_str().unwrap(), "-q"]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    }
    // The checker knows such failures flush the receives: a poll until idle is no wait
    // for ever. Nor is it after a SEND longer than its receive.
    let text = std::fs::read_to_string(&path).unwrap();
    let o = run_scenario(
        &path,
        &text.replace("poll = { cqes = 3 }", "poll = \"idle\""),
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = run_scenario(
        &path,
        r#"description = "a SEND of 64 bytes into receives of 8"
[[qp]]
name = "a"
policy = "always"
[[region]]
name = "src"
size = 128
access = ["local_write"]
[[region]]
name = "dst"
size = 64
access = ["local_write"]
[[step]]
recv = { qp = "a.peer", region = "dst", size = 8, count = 2 }
[[step]]
post = { qp = "a", op = "send", local = "src", size = 64, count = 1 }
[[step]]
poll = "idle"
[expect]
outcomes = { a = ["1 failed:rem_inv_req_err"] }
"#,
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    // The checker matches SENDs with receives in order, as the NIC does: a SEND posted
    // before a receive too short for it fails when that receive comes (and the peer's
    // error flushes the other); a zero-length SEND uses no key, so a deregistered
    // region does not fail it. Both run to idle.
    let head = "[[qp]]\nname = \"a\"\n[[region]]\nname = \"src\"\nsize = 128\n\
                [[region]]\nname = \"rbuf\"\nsize = 256\naccess = [\"local_write\"]\n";
    let send = |size: u64| {
        format!(
            "[[step]]\npost = {{ qp = \"a\", op = \"send\", local = \"src\", size = {size}, signal = \"force\" }}\n"
        )
    };
    let recv = |size: u64, count: u64, offset: u64| {
        format!(
            "[[step]]\nrecv = {{ qp = \"a.peer\", region = \"rbuf\", size = {size}, count = {count}, offset = {offset} }}\n"
        )
    };
    let idle = "[[step]]\npoll = \"idle\"\n";
    for (name, steps, code) in [
        (
            "send-before-short-receives",
            format!("{}{}{idle}", send(64), recv(8, 2, 0)),
            0,
        ),
        (
            "zero-length-send-from-a-deregistered-region",
            format!(
                "[[step]]\ndereg = \"src\"\n{}{}{}{idle}",
                send(0),
                recv(0, 2, 0),
                send(0)
            ),
            0,
        ),
        // A SEND into the first, long enough receive does not fail: the second, shorter
        // one waits for ever.
        (
            "send-into-the-first-receive",
            format!("{}{}{}{idle}", recv(128, 1, 0), recv(8, 1, 128), send(64)),
            2,
        ),
    ] {
        let o = run_scenario(&path, &format!("description = \"{name}\"\n{head}{steps}"));
        assert_eq!(o.status.code(), Some(code), "{name}: {}", stderr(&o));
        if code == 2 {
            assert!(
                stderr(&o).contains("used by no SEND"),
                "{name}: {}",
                stderr(&o)
            );
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// The file in docs/scenarios.md that shows every field runs, and its expectations hold.
/// The example trace in docs/scenarios.md is what `selsig run scenarios/seed.toml` prints,
/// line for line (where it is not abridged); `-q` prints no trace.
#[test]
fn the_documented_trace_is_what_a_run_prints() {
    let doc = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/scenarios.md"),
    )
    .unwrap();
    let (_, example) = doc
        .split_once("Example, `selsig run scenarios/seed.toml`")
        .unwrap();
    let (_, example) = example.split_once("```\n").unwrap();
    let (example, _) = example.split_once("```").unwrap();
    let seed = scenarios().join("seed.toml");
    let o = selsig(&["run", seed.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    let printed: Vec<&str> = out.lines().collect();
    let documented: Vec<&str> = example.lines().filter(|l| l.starts_with('{')).collect();
    assert!(documented.len() >= 8, "{example}");
    for line in documented {
        assert!(
            printed.contains(&line),
            "documented, not printed: {line}\n{out}"
        );
    }
    let quiet = selsig(&["run", "-q", seed.to_str().unwrap()]);
    assert_eq!(quiet.status.code(), Some(0), "{}", stderr(&quiet));
    assert!(quiet.stdout.is_empty(), "{}", stdout(&quiet));
    assert!(
        stderr(&quiet).contains("expectations met"),
        "{}",
        stderr(&quiet)
    );
    // An asynchronous event's line, as the table gives its fields.
    let fault = scenarios().join("fault-no-access.toml");
    let out = stdout(&selsig(&["run", fault.to_str().unwrap()]));
    assert!(
        out.lines()
            .any(|l| l == "{\"event\":\"async\",\"type\":\"qp_access_err\",\"qp\":\"a.peer\"}"),
        "{out}"
    );
}

#[test]
fn the_documented_scenario_file_runs() {
    let doc = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/scenarios.md"),
    )
    .unwrap();
    let (_, file) = doc.split_once("## The file").unwrap();
    let (_, file) = file.split_once("```toml\n").unwrap();
    let (file, _) = file.split_once("```").unwrap();
    let dir = scratch("selsig-cli-doc-file");
    let path = dir.join("every-field.toml");
    std::fs::write(&path, file).unwrap();
    for personality in ["mlx5", "rxe"] {
        let o = selsig(&[
            "run",
            "-q",
            path.to_str().unwrap(),
            "--personality",
            personality,
        ]);
        assert_eq!(o.status.code(), Some(0), "{personality}: {}", stderr(&o));
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// Fields given in `[expect.rxe]` replace those of `[expect]` on rxe, an empty table too:
/// nothing of it is checked there.
#[test]
fn empty_rxe_expectations_replace_the_main_ones() {
    let dir = scratch("selsig-cli-rxe-empty");
    let seed = std::fs::read_to_string(scenarios().join("seed.toml")).unwrap();
    let text = seed
        .replace("\"1-8 completed\"", "\"1-7 completed\"")
        .replace("1fb4b57231ed8584", "0000000000000000")
        + "[expect.rxe]\noutcomes = {}\ndigests = {}\n[differs]\nrxe = \"nothing checked\"\n";
    let path = dir.join("rxe-empty.toml");
    std::fs::write(&path, text).unwrap();
    let run = |personality| {
        selsig(&[
            "run",
            "-q",
            path.to_str().unwrap(),
            "--personality",
            personality,
        ])
    };
    let o = run("rxe");
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = run("mlx5");
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("outcomes of a differ") && err.contains("digest of dst"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// A `recv` step that waits for room on a peer whose receives nothing uses (no SEND is
/// posted, and the peer is not in the error state) fails after 20 s saying why.
#[test]
fn a_recv_step_that_waits_for_nothing_says_why() {
    let dir = scratch("selsig-cli-recv-stuck");
    let path = dir.join("stuck.toml");
    let o = run_scenario(
        &path,
        r#"description = "receives past peer_depth that nothing uses"
[[qp]]
name = "a"
peer_access = []
peer_depth = 4
policy = "always"
[[region]]
name = "inbox"
size = 1024
access = ["local_write"]
[[region]]
name = "dst"
size = 64
access = ["local_write", "remote_write"]
[[step]]
post = { qp = "a", op = "write", remote = "dst", size = 0 }
[[step]]
poll = "idle"
[[step]]
recv = { qp = "a.peer", region = "inbox", size = 64, count = 6 }
[[step]]
to_error = "a.peer"
[[step]]
poll = "idle"
"#,
    );
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(
            "\"a.peer\" stayed full: its 4 receives are used by no SEND or WRITE with \
             immediate posted, and not flushed (post those first, or move the peer to the \
             error state: to_error = \"a.peer\")"
        ),
        "{}",
        stderr(&o)
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// SENDs beyond the receives posted wait for one for ever (rnr_retry 7): the step that
/// waits for them fails after 20 s saying so.
#[test]
fn sends_beyond_the_receives_are_named_as_waiting_for_one() {
    let dir = scratch("selsig-cli-rnr");
    let path = dir.join("rnr.toml");
    let o = run_scenario(
        &path,
        r#"description = "two SENDs, one receive"
[[qp]]
name = "a"
policy = "always"
[[step]]
recv = { qp = "a.peer" }
[[step]]
post = { qp = "a", op = "send", count = 2 }
[[step]]
poll = "idle"
"#,
    );
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(
            "(1 SENDs and WRITEs with immediate beyond the 1 receives posted on \"a.peer\" \
             wait for one: the peer answers RNR, which rnr_retry 7 retries for ever)"
        ),
        "{}",
        stderr(&o)
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// One QP `a` (with `qp` lines), a 256-byte `src` and `dst`, then `steps`.
fn one_qp_scenario(qp: &str, steps: &str) -> String {
    format!(
        r#"description = "one QP"
[[qp]]
name = "a"
{qp}
[[region]]
name = "src"
size = 256
access = ["local_write"]
[[region]]
name = "dst"
size = 256
access = ["local_write", "remote_write"]
{steps}"#
    )
}

/// Runs `text` (as `name`.toml in a scratch folder) and returns the output.
fn run_text(name: &str, text: &str, quiet: bool) -> Output {
    let dir = scratch(&format!("selsig-cli-{name}"));
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, text).unwrap();
    let path = path.to_str().unwrap();
    let o = match quiet {
        true => selsig(&["run", path, "-q"]),
        false => selsig(&["run", path]),
    };
    std::fs::remove_dir_all(&dir).ok();
    o
}

/// The trace of `text`, which must run and meet its expectations.
fn trace_of(name: &str, text: &str) -> String {
    let o = run_text(name, text, false);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    stdout(&o)
}

/// A confirm with nothing unsignaled outstanding posts no marker and says so; a drain
/// whose send queue is full (an unsignaled WRITE behind the signaled one) polls for room,
/// then posts its marker, which confirms the WRITE.
#[test]
fn a_confirm_not_needed_is_traced_and_a_drain_of_a_full_queue_makes_room_for_its_marker() {
    let write = |count| {
        format!(
            "[[step]]\npost = {{ qp = \"a\", op = \"write\", local = \"src\", remote = \"dst\", \
             size = 64, count = {count} }}\n"
        )
    };
    let steps = format!(
        "{}[[step]]\npoll = \"idle\"\n[[step]]\nconfirm = \"a\"\n{}[[step]]\ndrain = \"a\"\n",
        write(3),
        write(4)
    );
    let out = trace_of(
        "confirm-drain",
        &one_qp_scenario("depth = 4\npolicy = \"every:3\"", &steps),
    );
    assert!(
        out.contains(
            "{\"event\":\"step\",\"n\":3,\"kind\":\"confirm\"}\n\
             {\"event\":\"confirm_not_needed\",\"qp\":\"a\"}\n"
        ),
        "{out}"
    );
    assert!(
        out.contains(
            "{\"event\":\"post\",\"qp\":\"a\",\"seq\":7,\"op\":\"rdma_write\",\"len\":64,\"signaled\":false}\n\
             {\"event\":\"step\",\"n\":5,\"kind\":\"drain\"}\n\
             {\"event\":\"cqe\",\"qp\":\"a\",\"wr_id\":6,\"status\":\"success\",\"opcode\":\"rdma_write\"}\n"
        ),
        "{out}"
    );
    assert!(
        out.contains(
            "{\"event\":\"post\",\"qp\":\"a\",\"seq\":8,\"op\":\"rdma_write\",\"len\":0,\"signaled\":true,\"reason\":\"marker\",\"marker\":true}\n\
             {\"event\":\"cqe\",\"qp\":\"a\",\"wr_id\":8,\"status\":\"success\",\"opcode\":\"rdma_write\"}\n\
             {\"event\":\"retire\",\"qp\":\"a\",\"seq\":7,\"outcome\":\"completed\"}\n"
        ),
        "{out}"
    );
}

/// What a run that ends with work outstanding says of each queue: no hint of a peer that
/// answers nothing once the queue itself failed (its work requests are flushed), none of
/// SENDs waiting for a receive when there are as many receives as SENDs, and WRITEs with
/// immediate use receives as SENDs do.
#[test]
fn work_left_at_the_end_gets_only_the_hints_that_apply() {
    let bad_key = r#"[[step]]
post = { qp = "a", op = "write", local = "src", remote = "dst", size = 64, count = 3, fault = "bad_rkey" }
[[step]]
poll = { cqes = 1 }
"#;
    let cases = [
        (
            // A bad key: the peer goes to the error state, and so does a once its
            // completion is polled; two flushes are left.
            "policy = \"always\"",
            bad_key,
            "a: 2 work requests, 0 receives outstanding",
        ),
        (
            "policy = \"always\"",
            r#"[[step]]
recv = { qp = "a.peer" }
[[step]]
post = { qp = "a", op = "send", count = 1 }
"#,
            "a: 1 work requests, 1 receives outstanding",
        ),
        (
            "policy = \"always\"",
            r#"[[step]]
recv = { qp = "a.peer" }
[[step]]
post = { qp = "a", op = "write_imm", remote = "dst", count = 2 }
"#,
            "a: 2 work requests, 1 receives outstanding (1 SENDs and WRITEs with immediate \
             beyond the 1 receives posted on \"a.peer\" wait for one: the peer answers RNR, \
             which rnr_retry 7 retries for ever)",
        ),
        (
            // Every fourth signaled: the two WRITEs left of the failed queue are flushed,
            // not an unsignaled tail that no completion confirms.
            "policy = \"every:4\"",
            bad_key,
            "a: 2 work requests, 0 receives outstanding",
        ),
        (
            // Below retry_cnt 7 the retries run out: nothing is retransmitted for ever.
            "policy = \"always\"\nretry_cnt = 6",
            r#"[[step]]
to_error = "a.peer"
[[step]]
post = { qp = "a", op = "write", remote = "dst", size = 0 }
"#,
            "a: 1 work requests, 0 receives outstanding",
        ),
        (
            // Nothing posted: nothing to retransmit, whatever the peer's state.
            "policy = \"always\"",
            r#"[[step]]
recv = { qp = "a.peer" }
[[step]]
to_error = "a.peer"
"#,
            "a: 0 work requests, 1 receives outstanding",
        ),
    ];
    for (qp, steps, says) in cases {
        let o = run_text("hints", &one_qp_scenario(qp, steps), true);
        assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
        let err = stderr(&o);
        let expected = format!(
            "the run ended with work outstanding (end it with `poll = \"idle\"` or `drain`): \
             {says}\n"
        );
        assert!(err.ends_with(&expected), "{err}");
    }
}

/// A receive that no SEND posted uses is not waited for: a poll step that wants its
/// completion fails at once, naming it, instead of after the 20 s wait.
#[test]
fn a_poll_for_a_receive_no_send_uses_fails_at_once() {
    let text = one_qp_scenario(
        "policy = \"always\"",
        r#"[[step]]
recv = { qp = "a.peer" }
[[step]]
post = { qp = "a", op = "send", count = 1 }
[[step]]
poll = "idle"
[[step]]
recv = { qp = "a.peer" }
[[step]]
poll = { cqes = 1 }
"#,
    );
    let started = std::time::Instant::now();
    let o = run_text("unused-recv", &text, true);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(
            "step 5 (poll): only 0 of 1 completions arrived and no more can: at most 0 more \
             (a: 0 work requests, 1 receives outstanding (1 of them used by no SEND or WRITE \
             with immediate posted, and not flushed))"
        ),
        "{}",
        stderr(&o)
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(15));
}

/// `signal = "last"` signals the last work request of the post, and only it.
#[test]
fn signal_last_signals_the_last_of_the_post() {
    let text = one_qp_scenario(
        "policy = \"manual\"",
        r#"[[step]]
post = { qp = "a", op = "write", local = "src", remote = "dst", size = 64, count = 3, signal = "last" }
[[step]]
poll = "idle"
[expect]
cqes = [{ qp = "a", wr_id = 3, status = "success", opcode = "rdma_write" }]
outcomes = { a = ["1-3 completed"] }
"#,
    );
    let out = trace_of("signal-last", &text);
    for (seq, signaled) in [(1, "false"), (2, "false"), (3, "true")] {
        let post = format!(
            "{{\"event\":\"post\",\"qp\":\"a\",\"seq\":{seq},\"op\":\"rdma_write\",\"len\":64,\
             \"signaled\":{signaled}"
        );
        assert!(out.contains(&post), "{post}: {out}");
    }
}

/// The work requests a queue refuses are counted from the one refused first: a queue of 2
/// whose first WRITE fails takes the second, then refuses the last two.
#[test]
fn a_refusal_counts_the_work_requests_left_in_the_post() {
    let text = one_qp_scenario(
        "depth = 2\npolicy = \"always\"",
        r#"[[step]]
post = { qp = "a", op = "write", local = "src", remote = "dst", size = 64, count = 4, fault = "bad_rkey" }
[[step]]
poll = "idle"
[expect]
outcomes = { a = ["1 failed:rem_access_err", "2 flushed"] }
"#,
    );
    let out = trace_of("refused-count", &text);
    assert!(
        out.contains(
            "{\"event\":\"refused\",\"qp\":\"a\",\"count\":2,\"why\":\"the queue is in the \
             error state: work request 1 completed with rem_access_err\"}"
        ),
        "{out}"
    );
}

/// A drained queue accepts no more work requests: a later post is refused, whole.
#[test]
fn a_post_after_a_drain_is_refused() {
    let text = one_qp_scenario(
        "",
        r#"[[step]]
post = { qp = "a", op = "write", local = "src", remote = "dst", size = 64, count = 3 }
[[step]]
drain = "a"
[[step]]
post = { qp = "a", op = "write", local = "src", remote = "dst", size = 64, count = 1 }
[[step]]
poll = "idle"
[expect]
outcomes = { a = ["1-3 completed"] }
"#,
    );
    let out = trace_of("drained", &text);
    assert!(
        out.contains(
            "{\"event\":\"step\",\"n\":3,\"kind\":\"post\"}\n{\"event\":\"refused\",\"qp\":\"a\",\
             \"count\":1,\"why\":\"the queue is draining and accepts no more work requests\"}\n"
        ),
        "{out}"
    );
}

/// A drain waits for its own queue pair only: another queue's unsignaled tail, which no
/// completion confirms until that queue's own drain, does not hold it up, and the drain's
/// step shows only the drained queue's events (with the two send queues on their own CQs
/// and on one shared CQ, where the other queue's completion waits for the next step).
#[test]
fn a_drain_waits_for_its_own_queue_pair_only() {
    for shared in [false, true] {
        let cq = match shared {
            true => "[[cq]]\nname = \"shared\"\nsize = 32\n",
            false => "",
        };
        let send_cq = match shared {
            true => "send_cq = \"shared\"\n",
            false => "",
        };
        let text = format!(
            r#"description = "two tails"
{cq}[[qp]]
name = "a"
depth = 8
policy = "every:4"
{send_cq}[[qp]]
name = "b"
depth = 8
policy = "every:4"
{send_cq}[[region]]
name = "src"
size = 512
access = ["local_write"]
[[region]]
name = "dst"
size = 512
access = ["local_write", "remote_write"]
[[step]]
post = {{ qp = "a", op = "write", local = "src", remote = "dst", size = 64, count = 3 }}
[[step]]
post = {{ qp = "b", op = "write", local = "src", remote = "dst", size = 64, count = 5 }}
[[step]]
drain = "a"
[[step]]
drain = "b"
[expect]
outcomes = {{ a = ["1-3 completed"], b = ["1-5 completed"] }}
"#
        );
        let out = trace_of("drain-own", &text);
        let (_, rest) = out
            .split_once("{\"event\":\"step\",\"n\":3,\"kind\":\"drain\"}\n")
            .expect("the first drain's step");
        let (first, second) = rest
            .split_once("{\"event\":\"step\",\"n\":4,\"kind\":\"drain\"}\n")
            .expect("the second drain's step");
        assert!(first.contains("\"qp\":\"a\""), "shared {shared}: {out}");
        assert!(!first.contains("\"qp\":\"b\""), "shared {shared}: {out}");
        // b's signaled fourth WRITE and its drain marker: both shown with b's drain.
        assert!(
            second.contains("\"event\":\"cqe\",\"qp\":\"b\",\"wr_id\":4"),
            "{out}"
        );
        assert!(!second.contains("\"qp\":\"a\""), "shared {shared}: {out}");
    }
}

/// In a poll step a QP's completions come before its peer's, whatever the CQ's order
/// (one CQ for both: the soft NIC writes the receive's completion first).
#[test]
fn a_qps_completions_come_before_its_peers_in_a_step() {
    let text = r#"description = "a SEND on one CQ"
[[cq]]
name = "one"
size = 64
[[qp]]
name = "a"
policy = "always"
send_cq = "one"
peer_cq = "one"
[[step]]
recv = { qp = "a.peer" }
[[step]]
post = { qp = "a", op = "send", count = 1 }
[[step]]
poll = "idle"
"#;
    let out = trace_of("peer-order", text);
    assert!(
        out.contains(
            "{\"event\":\"step\",\"n\":3,\"kind\":\"poll\"}\n\
             {\"event\":\"cqe\",\"qp\":\"a\",\"wr_id\":1,\"status\":\"success\",\"opcode\":\"send\"}\n\
             {\"event\":\"retire\",\"qp\":\"a\",\"seq\":1,\"outcome\":\"completed\"}\n\
             {\"event\":\"cqe\",\"qp\":\"a.peer\",\"wr_id\":1,\"status\":\"success\",\"opcode\":\"recv\",\"byte_len\":0}\n"
        ),
        "{out}"
    );
}

/// On rxe a WRITE to a peer in the error state is retransmitted for ever at `retry_cnt`
/// 7 (the default): the step that waits for it fails after 20 s saying so. Below 7 the
/// retries run out and the run ends.
#[test]
fn writes_to_a_peer_that_answers_nothing_are_named_on_rxe() {
    let dir = scratch("selsig-cli-retry");
    let path = dir.join("retry.toml");
    let text = r#"description = "a WRITE to a peer in the error state"
[[qp]]
name = "a"
policy = "always"
[[region]]
name = "dst"
size = 64
access = ["local_write", "remote_write"]
[[step]]
to_error = "a.peer"
[[step]]
post = { qp = "a", op = "write", remote = "dst", size = 0 }
[[step]]
poll = "idle"
"#;
    let run = |text: &str| {
        std::fs::write(&path, text).unwrap();
        selsig(&["run", path.to_str().unwrap(), "--personality", "rxe"])
    };
    let o = run(text);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(
            "a: 1 work requests, 0 receives outstanding (\"a.peer\" may be in the error \
             state, where it answers nothing: rxe retransmits for ever at retry_cnt 7; move \
             \"a\" to the error state to flush its work requests, or set retry_cnt below 7)"
        ),
        "{}",
        stderr(&o)
    );
    let o = run(&text.replace("name = \"a\"", "name = \"a\"\nretry_cnt = 6"));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).contains("retry_exc_err"), "{}", stdout(&o));
    std::fs::remove_dir_all(&dir).ok();
}

/// The CPU time a process used so far, user and system, all its threads
/// (`/proc/PID/stat`: utime and stime, in clock ticks).
#[cfg(target_os = "linux")]
fn cpu_time(pid: u32) -> std::time::Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // After the command's name in parentheses (which may hold spaces) come the state, the
    // 3rd field, and so utime and stime, the 14th and 15th, at 11 and 12.
    let rest = &stat[stat.rfind(')').unwrap() + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    std::time::Duration::from_secs_f64(
        ticks as f64 / rustix::param::clock_ticks_per_second() as f64,
    )
}

/// A poll step that waits for a completion that never comes (an unsignaled tail: nothing
/// signaled outstanding) sleeps on the CQ's completion events: over 3 s of the wait the
/// process, the soft NIC's thread included, uses under 5 % of a core (a loop of
/// `yield_now` used all of one). The run would wait out its 20 s: it is stopped.
#[cfg(target_os = "linux")]
#[test]
fn a_wait_for_a_completion_that_never_comes_uses_no_cpu() {
    use std::process::Stdio;
    use std::time::{Duration, Instant};

    let dir = scratch("selsig-cli-idle-wait");
    let path = dir.join("idle-wait.toml");
    std::fs::write(
        &path,
        one_qp_scenario(
            "",
            r#"[[step]]
post = { qp = "a", op = "write", local = "src", remote = "dst", size = 64 }
[[step]]
poll = "idle"
"#,
        ),
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_selsig"))
        .args(["run", path.to_str().unwrap(), "-q"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // The device made, the WRITE posted (unsignaled: every:4) and the poll begun.
    std::thread::sleep(Duration::from_secs(1));
    let (before, start) = (cpu_time(child.id()), Instant::now());
    std::thread::sleep(Duration::from_secs(3));
    let (used, window) = (cpu_time(child.id()) - before, start.elapsed());
    let waiting = child.try_wait().unwrap().is_none();
    child.kill().ok();
    child.wait().unwrap();
    std::fs::remove_dir_all(&dir).ok();
    assert!(waiting, "the run ended before the 20 s of its wait");
    assert!(
        used < window / 20,
        "the wait used {used:?} of CPU in {window:?}"
    );
}

#[test]
fn a_step_that_fails_shows_the_trace_so_far_and_an_unsignaled_tail_is_named() {
    let dir = scratch("selsig-cli-tail");
    // Six WRITEs every fourth signaled: WR5 and WR6 are an unsignaled tail that no
    // completion confirms, so `poll = "idle"` waits out its 20 s.
    let seed = std::fs::read_to_string(scenarios().join("seed.toml")).unwrap();
    let path = dir.join("tail.toml");
    std::fs::write(&path, seed.replace("count = 8", "count = 6")).unwrap();
    let o = selsig(&["run", path.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains(
            "step 2 (poll): not idle (no completion for 20s): a: 2 work requests (all of them \
             an unsignaled tail, which no completion confirms: `confirm = \"a\"` or \
             `drain = \"a\"` before polling), 0 receives outstanding"
        ),
        "{err}"
    );
    // The trace up to the failure: six posts, the completion of WR4, four retirements.
    let out = stdout(&o);
    assert_eq!(out.matches("\"event\":\"post\"").count(), 6, "{out}");
    assert_eq!(out.matches("\"event\":\"cqe\"").count(), 1, "{out}");
    assert_eq!(out.matches("\"event\":\"retire\"").count(), 4, "{out}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn bad_scenarios_name_file_line_and_problem() {
    let dir = scratch("selsig-cli-bad");
    let seed = std::fs::read_to_string(scenarios().join("seed.toml")).unwrap();
    // A receive, then a SEND (`fields` added) from `src` moved to the other protection
    // domain: the SEND fails on the QP's side.
    let other_pd_send = |fields: &str| {
        seed.replace("fill = \"pattern\"", "fill = \"pattern\"\npd = \"other\"")
            .replace(
                "[[step]]\npost = { qp = \"a\", op = \"write\", local = \"src\", remote = \"dst\", size = 64, count = 8 }",
                &format!(
                    "[[step]]\nrecv = {{ qp = \"a.peer\", region = \"dst\", size = 64 }}\n\n\
                     [[step]]\npost = {{ qp = \"a\", op = \"send\", local = \"src\", size = 8{fields} }}"
                ),
            )
    };
    for (name, text, line, problem) in [
        (
            "syntax",
            seed.replace("size = 512\naccess = [\"local_write\"]", "size = = 512"),
            10,
            "expected",
        ),
        (
            "unknown-field",
            seed.replace("depth = 16", "depht = 16"),
            5,
            "unknown field `depht`",
        ),
        (
            "missing-region",
            seed.replace("remote = \"dst\"", "remote = \"dts\""),
            19,
            "step 1: no region named \"dts\"",
        ),
        (
            "too-big",
            seed.replace("count = 8", "count = 9"),
            19,
            "beyond region \"src\"",
        ),
        (
            "bad-policy",
            seed.replace("policy = \"every:4\"", "policy = \"every:0\""),
            3,
            "at least 1",
        ),
        (
            "stride-overflow",
            seed.replace("count = 8", "count = 3, stride = 9223372036854775807"),
            19,
            "stride 9223372036854775807 is larger than any region",
        ),
        (
            "offset-without-region",
            seed.replace(
                "op = \"write\", local = \"src\", remote = \"dst\", size = 64, count = 8",
                "op = \"send\", size = 0, count = 3, local_offset = 9223372036854775807",
            ),
            19,
            "local_offset 9223372036854775807 is larger than any region",
        ),
        (
            "recv-size-overflow",
            seed.replace(
                "poll = \"idle\"",
                "recv = { qp = \"a.peer\", region = \"dst\", size = 4611686018427387904, count = 4 }",
            ),
            22,
            "size 4611686018427387904 is larger than any region",
        ),
        (
            "digest-of-a-deregistered-region",
            std::fs::read_to_string(scenarios().join("fault-deregistered.toml"))
                .unwrap()
                .replace(
                    "events = [\"qp_access_err:a.peer\"]",
                    "events = [\"qp_access_err:a.peer\"]\ndigests = { dst = \"0000000000000000\" }",
                ),
            // The entry's line, not the [expect] header's (34).
            41,
            "expect.digests.dst: step 3 deregisters the region, so nothing is left to read at \
             the end",
        ),
        (
            "poll-for-nothing",
            seed.replace("poll = \"idle\"", "poll = { cqes = 0 }"),
            22,
            "poll = { cqes = 0 }: waits for nothing (N is at least 1)",
        ),
        (
            "fault-on-nothing",
            seed.replace(
                "size = 64, count = 8",
                "size = 0, count = 8, fault = \"bad_rkey\", fault_at = 2",
            ),
            19,
            "needs a post of more than 0 bytes",
        ),
        (
            "unused-receives",
            seed.replace(
                "[[step]]\npoll = \"idle\"",
                "[[step]]\nrecv = { qp = \"a.peer\", count = 2 }\n\n[[step]]\npoll = \"idle\"",
            ),
            25,
            "2 of the 2 receives posted on \"a.peer\" are used by no SEND or WRITE with \
             immediate posted before: this poll would wait for them for ever",
        ),
        (
            // Moving the QP (not its peer) to the error state flushes its later SENDs, not
            // the peer's receives: they still wait.
            "receives-after-the-requester-failed",
            seed.replace(
                "[[step]]\npoll = \"idle\"",
                "[[step]]\nto_error = \"a\"\n\n[[step]]\nrecv = { qp = \"a.peer\" }\n\n\
                 [[step]]\npoll = \"idle\"",
            ),
            28,
            "1 of the 1 receives posted on \"a.peer\" are used by no SEND",
        ),
        (
            // A bad local key fails on the QP's side: the peer's receives still wait.
            "receives-after-a-bad-local-key",
            seed.replace(
                "[[step]]\npost",
                "[[step]]\nrecv = { qp = \"a.peer\" }\n\n[[step]]\npost",
            )
            .replace("count = 8 }", "count = 8, fault = \"bad_lkey\" }"),
            25,
            "1 of the 1 receives posted on \"a.peer\" are used by no SEND",
        ),
        (
            // A SEND from a region on the other protection domain fails on the QP's side:
            // it uses no receive.
            "receives-and-a-send-that-fails-locally",
            other_pd_send(""),
            26,
            "1 of the 1 receives posted on \"a.peer\" are used by no SEND",
        ),
        (
            // The same, with a bad local key on the second: the first fails already.
            "receives-and-a-send-that-fails-locally-before-its-fault",
            other_pd_send(", count = 2, fault = \"bad_lkey\", fault_at = 2"),
            26,
            "1 of the 1 receives posted on \"a.peer\" are used by no SEND",
        ),
        (
            // A drained queue refuses the SEND: it uses no receive.
            "receives-and-a-send-after-a-drain",
            seed.replace(
                "[[step]]\npoll = \"idle\"",
                "[[step]]\ndrain = \"a\"\n\n[[step]]\n\
                 post = { qp = \"a\", op = \"send\", local = \"src\", size = 8 }\n\n\
                 [[step]]\nrecv = { qp = \"a.peer\", region = \"dst\", size = 64 }\n\n\
                 [[step]]\npoll = \"idle\"",
            ),
            31,
            "1 of the 1 receives posted on \"a.peer\" are used by no SEND",
        ),
        (
            "cq-smaller-than-its-receives",
            format!(
                "{}\n[[cq]]\nname = \"s\"\nsize = 16\n",
                seed.replace("depth = 16", "depth = 16\nsend_cq = \"s\"\npeer_cq = \"s\"")
            ),
            seed.lines().count() + 4,
            "cq \"s\": size 16 holds less than the 16 receive slots (peer_depth) of the \
             peers that report to it and a send completion",
        ),
        (
            "one-byte-out-of-bounds",
            seed.replace(
                "size = 64, count = 8",
                "size = 1, count = 8, fault = \"out_of_bounds\"",
            ),
            19,
            "needs a post of 2 bytes or more",
        ),
        (
            "empty-differs",
            format!("{seed}\n[differs]\n"),
            seed.lines().count() + 2,
            "[differs] is empty",
        ),
        (
            "empty-reason",
            format!("{seed}\n[differs]\nrxe = \" \"\n"),
            seed.lines().count() + 3,
            "differs.rxe is empty: it must say why rxe differs",
        ),
        (
            "signed-digest",
            seed.replace("1fb4b57231ed8584", "+000000000000000"),
            32,
            "is not 16 hex digits",
        ),
        (
            "another-qps-own-cq",
            seed.replace(
                "policy = \"every:4\"\n",
                "policy = \"every:4\"\n\n[[qp]]\nname = \"b\"\nsend_cq = \"a.cq\"\n",
            ),
            8,
            "qp \"b\": no [[cq]] named \"a.cq\" (a QP's own CQ is not shared: declare a [[cq]] to share one)",
        ),
        (
            "byte-len-of-a-write",
            seed.replace(
                "wr_id = 4, status = \"success\", opcode = \"rdma_write\" }",
                "wr_id = 4, status = \"success\", opcode = \"rdma_write\", byte_len = 64 }",
            ),
            27,
            "expect.cqes: byte_len of a wr_id 4 success rdma_write completion: byte_len is defined only in successful completions of receives and READs",
        ),
        (
            "opcode-of-an-error",
            seed.replace(
                "wr_id = 4, status = \"success\"",
                "wr_id = 4, status = \"rem_access_err\"",
            ),
            27,
            "expect.cqes: opcode of a wr_id 4 rem_access_err rdma_write completion: a completion that is not a success has no opcode",
        ),
        (
            "policy-unknown",
            seed.replace("policy = \"every:4\"", "policy = \"manually\""),
            3,
            "qp \"a\": unknown policy \"manually\": expected every:N, always, never or manual",
        ),
        (
            "empty-description",
            seed.replacen(
                &seed[..seed.find('\n').unwrap()],
                "description = \" \"",
                1,
            ),
            1,
            "description is empty: say what the scenario shows",
        ),
    ] {
        let path = dir.join(format!("{name}.toml"));
        std::fs::write(&path, text).unwrap();
        let o = selsig(&["run", path.to_str().unwrap()]);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{name}: {err}");
        let at = format!("{}:{line}:", path.display());
        assert!(
            err.starts_with(&format!("error: {at}")),
            "{name}: expected {at} in {err}"
        );
        assert!(err.contains(problem), "{name}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    // A file larger than any scenario is refused, not read to the end: /dev/zero ends
    // never.
    let o = selsig(&["run", "/dev/zero"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).starts_with("error: /dev/zero: larger than 4 MiB"),
        "{}",
        stderr(&o)
    );
    let o = selsig(&["run", "/nonexistent/x.toml"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).starts_with("error: /nonexistent/x.toml: cannot read the scenario"),
        "{}",
        stderr(&o)
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn scenarios_are_bounded_in_memory_and_queue_pairs() {
    let dir = scratch("selsig-cli-big");
    let seed = std::fs::read_to_string(scenarios().join("seed.toml")).unwrap();
    let lines = seed.lines().count();
    // With the seed's two small regions, fifteen of 64 MiB fit in 1 GiB; the sixteenth is
    // refused at its line.
    let mut regions = seed.clone();
    for i in 0..17 {
        regions.push_str(&format!(
            "\n[[region]]\nname = \"big{i}\"\nsize = 67108864\naccess = [\"local_write\"]\n"
        ));
    }
    // Two more steps of 2^20 work requests: with the seed's 8, the second crosses the
    // scenario's 2^21 (the trace keeps every one).
    let mut many = seed.clone();
    for _ in 0..2 {
        many.push_str(
            "\n[[step]]\npost = { qp = \"a\", op = \"write\", remote = \"dst\", count = 1048576 }\n",
        );
    }
    // Sixty-four more queue pairs than the seed's one: the sixty-fifth is refused.
    let mut qps = seed.clone();
    for i in 0..64 {
        qps.push_str(&format!("\n[[qp]]\nname = \"q{i}\"\n"));
    }
    for (name, text, line, problem) in [
        (
            "regions",
            regions,
            lines + 1 + 15 * 5 + 1,
            "region \"big15\": the regions take more than 1073741824 bytes together",
        ),
        (
            "many",
            many,
            lines + 5,
            "step 4: the steps so far post 2097160 work requests and receives: a scenario posts at most 2097152",
        ),
        (
            "qps",
            qps,
            lines + 1 + 63 * 3 + 1,
            "65 queue pairs: a scenario creates at most 64",
        ),
    ] {
        let path = dir.join(format!("{name}.toml"));
        std::fs::write(&path, text).unwrap();
        let o = selsig(&["run", path.to_str().unwrap()]);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{name}: {err}");
        let at = format!("{}:{line}:", path.display());
        assert!(
            err.starts_with(&format!("error: {at}")),
            "{name}: {at} in {err}"
        );
        assert!(err.contains(problem), "{name}: {err}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

fn bench_json(args: &[&str]) -> Value {
    let mut all = vec!["bench", "--json", "-"];
    all.extend_from_slice(args);
    let o = selsig(&all);
    assert!(o.status.success(), "{}", stderr(&o));
    serde_json::from_slice(&o.stdout).expect("one JSON object")
}

/// `--no-nic-times`: the settings say so, and no point has the NIC's side of the lag.
#[test]
fn bench_without_nic_times_reports_none() {
    let v = bench_json(&["--no-nic-times", "-n", "100", "-s", "64", "-e", "1,4"]);
    assert_eq!(v["settings"]["nic_times"], false);
    for p in v["points"].as_array().unwrap() {
        assert_eq!(p["lag"]["count"], 100, "{p}");
        assert!(
            p["nic_to_app"].is_null() && p["post_to_nic"].is_null(),
            "{p}"
        );
    }
}

/// A timed run stops wherever the clock says: an unsignaled tail is confirmed by one
/// marker, whose completion is counted with the rest.
#[test]
fn a_timed_bench_point_counts_the_marker_that_confirms_its_tail() {
    let v = bench_json(&["-D", "0.05", "-s", "64", "-e", "7", "-t", "8", "-l", "1"]);
    let p = &v["points"][0];
    let (wrs, cqes, markers) = (
        p["wrs"].as_u64().unwrap(),
        p["cqes"].as_u64().unwrap(),
        p["markers"].as_u64().unwrap(),
    );
    assert_eq!(markers, u64::from(wrs % 7 != 0), "{p}");
    assert_eq!(cqes, wrs / 7 + markers, "{p}");
    // A marker is not a forced signal (the last WRITE of a counted run is).
    assert_eq!(p["forced"], 0, "{p}");
    assert_eq!(v["settings"]["duration_s"], 0.05);
    assert!(v["settings"]["iters"].is_null(), "{v}");
}

/// The table and the JSON of one run give the same figures, and the figures agree with
/// one another: the rate in millions, WRITEs per completion, the interval asked for, and
/// lags (a queue of WRITEs long at most) far below the point's duration.
#[test]
fn bench_figures_agree_between_the_table_and_the_json() {
    let dir = scratch("selsig-bench-figures");
    let json = dir.join("figures.json");
    // The table on standard output, the JSON in a file.
    let run = |args: &[&str]| {
        let mut all = vec!["bench", "--json", json.to_str().unwrap()];
        all.extend_from_slice(args);
        let o = selsig(&all);
        assert!(o.status.success(), "{}", stderr(&o));
        let v: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
        (stdout(&o), v)
    };
    let (out, v) = run(&["-n", "20000", "-s", "64", "-e", "1,128", "-t", "128"]);
    assert!(v["settings"]["duration_s"].is_null(), "{v}");
    let points = v["points"].as_array().unwrap();
    assert_eq!(points.len(), 2);
    for p in points {
        let policy = p["policy"].as_str().unwrap();
        let n: u64 = policy.strip_prefix("every:").unwrap().parse().unwrap();
        assert_eq!(p["interval"].as_u64(), Some(n), "{p}");
        let (wrs, cqes) = (p["wrs"].as_f64().unwrap(), p["cqes"].as_f64().unwrap());
        assert!(
            (p["wrs_per_cqe"].as_f64().unwrap() - wrs / cqes).abs() < 1e-9,
            "{p}"
        );
        let rate = p["wr_per_sec"].as_f64().unwrap() / 1e6;
        assert!(
            (p["mpps"].as_f64().unwrap() - rate).abs() < 1e-9 * rate,
            "{p}"
        );
        let row = out
            .lines()
            .find(|l| l.split_whitespace().take(2).eq(["64B", policy]))
            .unwrap_or_else(|| panic!("a row for {policy}: {out}"));
        let shown: f64 = row.split_whitespace().nth(2).unwrap().parse().unwrap();
        assert!((shown - rate).abs() <= 0.005 + 1e-9, "{row} vs {rate}");
        let seconds = p["seconds"].as_f64().unwrap();
        let p50 = p["lag"]["p50_ns"].as_f64().unwrap();
        assert!(
            p50 > 0.0 && p50 < seconds * 1e9 / 10.0,
            "{policy}: p50 {p50} ns in {seconds} s"
        );
    }
    // perftest mode: its columns are the JSON's figures; the soft NIC's memcpy yardstick
    // is a sweep's only.
    let (out, v) = run(&["--cq-mod", "100", "-s", "64", "-n", "1000"]);
    assert_eq!(v["memcpy"].as_array().map(Vec::len), Some(0), "{v}");
    let p = &v["points"][0];
    let row: Vec<f64> = out
        .lines()
        .find(|l| l.split_whitespace().take(2).eq(["64", "1000"]))
        .unwrap_or_else(|| panic!("a perftest row: {out}"))
        .split_whitespace()
        .map(|f| f.parse().unwrap())
        .collect();
    let (mib, mpps) = (
        p["mib_per_sec"].as_f64().unwrap(),
        p["mpps"].as_f64().unwrap(),
    );
    // #bytes, #iterations, BW peak (0.00: not measured), BW average, MsgRate.
    assert_eq!(row[2], 0.0, "{row:?}");
    assert!((row[3] - mib).abs() <= 0.005 + 1e-9, "{row:?} vs {mib}");
    assert!(
        (row[4] - mpps).abs() <= 0.000_000_5 + 1e-12,
        "{row:?} vs {mpps}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn bench_counts_exactly_the_completions_each_interval_implies() {
    let v = bench_json(&["-n", "2000", "-s", "64,4K", "-e", "1,3,64,adaptive"]);
    assert_eq!(v["provider"], "soft");
    assert_eq!(v["settings"]["iters"], 2000);
    assert_eq!(
        v["settings"]["nic_times"], true,
        "on the soft NIC by default"
    );
    assert_eq!(v["settings"]["tx_depth"], 128);
    let points = v["points"].as_array().unwrap();
    assert_eq!(points.len(), 8, "2 sizes x 4 policies");
    let memcpy = v["memcpy"].as_array().unwrap();
    assert_eq!(
        memcpy.len(),
        2,
        "the soft NIC's yardstick for each size: {memcpy:?}"
    );
    assert!(
        memcpy
            .iter()
            .all(|m| m["gbit_per_sec"].as_f64() > Some(0.0))
    );
    for p in points {
        let policy = p["policy"].as_str().unwrap();
        assert_eq!(p["wrs"], 2000, "{policy}");
        assert_eq!(p["forced"], 0, "{policy}");
        // The thread-to-thread yardstick, before and after the point.
        let trips = p["round_trip_ns"].as_array().expect("two round trips");
        assert!(
            trips.len() == 2 && trips.iter().all(|t| t.as_f64() > Some(0.0)),
            "{policy}: {trips:?}"
        );
        let cqes = p["cqes"].as_u64().unwrap();
        let markers = p["markers"].as_u64().unwrap();
        match p["interval"].as_u64() {
            // Every N-th, and the last of the run (perftest's accounting): no marker.
            Some(n) => {
                assert_eq!(cqes, 2000 / n + u64::from(2000 % n != 0), "{policy}");
                assert_eq!(markers, 0, "{policy}");
            }
            None => {
                assert!((2000 / 64..=2000).contains(&cqes), "{policy}: {cqes}");
                assert!(markers <= cqes, "{policy}: {markers} markers");
            }
        }
        let per_1000 = p["cqes_per_1000"].as_f64().unwrap();
        assert!((per_1000 - cqes as f64 / 2.0).abs() < 1e-9, "{policy}");
        // Every WRITE's lag is measured, and the NIC's time for every WRITE is known.
        assert_eq!(p["lag"]["count"], 2000, "{policy}");
        assert_eq!(p["nic_to_app"]["count"], 2000, "{policy}");
        assert_eq!(p["post_to_nic"]["count"], 2000, "{policy}");
        // Learning of a WRITE later than the NIC finished it, but never before it was posted.
        let lag = &p["lag"];
        let gap = &p["nic_to_app"];
        for q in ["p50_ns", "p99_ns", "max_ns"] {
            assert!(
                gap[q].as_u64() <= lag[q].as_u64(),
                "{policy} {q}: {gap} vs {lag}"
            );
        }
        // Each WRITE's lag is its post-to-NIC time plus its NIC-to-application gap, all
        // three from the same readings: so are the means (within the histograms'
        // precision, three significant digits).
        let mean = |h: &Value| h["mean_ns"].as_f64().unwrap();
        let (lag_mean, parts) = (mean(lag), mean(&p["post_to_nic"]) + mean(gap));
        assert!(
            (parts - lag_mean).abs() <= 0.005 * lag_mean,
            "{policy}: post to NIC + NIC to app = {parts} ns, lag {lag_mean} ns"
        );
        let wr_per_sec = p["wr_per_sec"].as_f64().unwrap();
        let gbit = p["gbit_per_sec"].as_f64().unwrap();
        let size = p["size"].as_f64().unwrap();
        assert!(wr_per_sec > 0.0);
        assert!((gbit - wr_per_sec * size * 8.0 / 1e9).abs() < 1e-6 * gbit.max(1.0));
        let mib = p["mib_per_sec"].as_f64().unwrap();
        assert!((mib - wr_per_sec * size / 1_048_576.0).abs() < 1e-6 * mib.max(1.0));
        // A thread's CPU time within the wall time it ran (plus the clocks' granularity).
        let share = p["cpu_share"].as_f64().unwrap();
        let seconds = p["seconds"].as_f64().unwrap();
        assert!(
            share > 0.0 && share <= 1.0 + 1e-3 / seconds,
            "{policy}: {share}"
        );
        let cpu = p["cpu_ns_per_wr"].as_f64().unwrap();
        assert!(
            (cpu * 2000.0 / 1e9 / seconds - share).abs() < 1e-6,
            "{policy}: {cpu} ns per WRITE, share {share}"
        );
    }
}

#[test]
fn bench_flags_points_whose_posting_thread_lost_its_core() {
    use rustix::thread::{CpuSet, sched_getaffinity, sched_setaffinity};
    // This test's thread, the threads it starts and the processes they start share one
    // CPU (the affinity of a thread is inherited), where threads spin: the bench's posting
    // thread gets a fraction of that CPU, and its figures would measure them too. The
    // other tests keep the other CPUs.
    let allowed = sched_getaffinity(None).unwrap();
    let cpu = (0..CpuSet::MAX_CPU).find(|&c| allowed.is_set(c)).unwrap();
    let mut one = CpuSet::new();
    one.set(cpu);
    sched_setaffinity(None, &one).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let spinners: Vec<_> = (0..4)
        .map(|_| {
            let stop = std::sync::Arc::clone(&stop);
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            })
        })
        .collect();
    let dir = scratch("bench-load");
    let json = dir.join("load.json");
    let table = selsig(&[
        "bench",
        "-D",
        "0.3",
        "-s",
        "64",
        "-e",
        "64",
        "--json",
        json.to_str().unwrap(),
    ]);
    let to_stdout = selsig(&["bench", "-D", "0.3", "-s", "64", "-e", "64", "--json", "-"]);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for s in spinners {
        s.join().unwrap();
    }
    sched_setaffinity(None, &allowed).unwrap();

    assert!(table.status.success(), "{}", stderr(&table));
    let v: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let share = v["points"][0]["cpu_share"].as_f64().unwrap();
    assert!(share < 0.9, "{share}");
    let out = stdout(&table);
    assert!(
        out.contains("warning: the posting thread busy-polls")
            && out.contains(&format!(
                "only {}% of the time at 64B every:64",
                (share * 100.0).floor()
            )),
        "{out}"
    );
    // With the JSON on standard output the table is not printed: the warning goes to stderr.
    assert!(to_stdout.status.success(), "{}", stderr(&to_stdout));
    let v: Value = serde_json::from_slice(&to_stdout.stdout).unwrap();
    assert!(v["points"][0]["cpu_share"].as_f64() < Some(0.9), "{v}");
    assert!(
        stderr(&to_stdout).contains("selsig bench: warning: the posting thread busy-polls"),
        "{}",
        stderr(&to_stdout)
    );
    std::fs::remove_dir_all(dir).unwrap();
}

/// The soft NIC's thread and the posting thread on one CPU: the posting thread, which
/// never yields, runs nearly all the time (its share alone would not flag the point), and
/// the NIC thread waits for it to use up its time slice, so the figures measure that wait.
/// The time the threads waited for a CPU flags the point.
#[test]
fn bench_flags_points_whose_threads_waited_for_a_cpu() {
    use rustix::thread::{CpuSet, sched_getaffinity, sched_setaffinity};
    assert!(
        Path::new("/proc/self/task").exists(),
        "needs Linux's /proc/self/task, which the bench reads the waiting from"
    );
    // This test's thread and the process it starts get one CPU (inherited); the other
    // tests keep the other CPUs.
    let allowed = sched_getaffinity(None).unwrap();
    let cpu = (0..CpuSet::MAX_CPU).find(|&c| allowed.is_set(c)).unwrap();
    let mut one = CpuSet::new();
    one.set(cpu);
    sched_setaffinity(None, &one).unwrap();
    // Long enough for the share to be taken (100 ms at least).
    let o = selsig(&["bench", "-D", "0.3", "-s", "64", "-e", "4", "--json", "-"]);
    sched_setaffinity(None, &allowed).unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let wait = v["points"][0]["wait_share"].as_f64().expect("a share");
    assert!(wait > 0.1, "{v}");
    assert!(
        stderr(&o).contains(&format!(
            "selsig bench: warning: the bench's threads (the posting thread, and the soft \
             NIC's) waited for a CPU {}% of the time at 64B every:4 (above 10%)",
            (wait * 100.0).ceil()
        )),
        "{}",
        stderr(&o)
    );
}

/// A counted run's points shorter than their interval signal only the last WRITE, and the
/// table says so; points that short have no share of waiting for a CPU (a wait begun
/// before the point is counted in it whole), so they are never flagged for it.
#[test]
fn bench_notes_the_points_shorter_than_their_interval() {
    let o = selsig(&[
        "bench", "-n", "100", "-s", "64,4K", "-e", "1,64,128", "--json", "-",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    for p in v["points"].as_array().unwrap() {
        let policy = p["policy"].as_str().unwrap();
        let cqes = if policy == "every:1" {
            100
        } else {
            100_u64.div_ceil(p["interval"].as_u64().unwrap())
        };
        assert_eq!(p["cqes"], cqes, "{policy}: {p}");
        assert!(p["seconds"].as_f64() < Some(0.1), "{p}");
        assert!(p["wait_share"].is_null(), "{policy}: {p}");
    }
    let err = stderr(&o);
    assert!(
        err.contains(
            "selsig bench: note: 64B every:128, 4KiB every:128: -n 100 is fewer WRITEs than \
             the interval, which is never reached: the one completion is the last WRITE's"
        ),
        "{err}"
    );
    assert!(!err.contains("waited for a CPU"), "{err}");
    // 128 WRITEs reach the interval: no note.
    let o = selsig(&["bench", "-n", "128", "-s", "64", "-e", "128"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!stdout(&o).contains("note:"), "{}", stdout(&o));
}

#[test]
fn bench_perftest_mode_prints_perftest_figures() {
    let o = selsig(&[
        "bench", "--cq-mod", "100", "-s", "64", "-n", "1000", "-t", "128",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    // ib_write_bw's table, as scripts written for it parse it: its header, between lines of
    // 87 dashes, and its columns (the peak 0.00: this mode measures none, as perftest
    // with -N).
    let dashes = "-".repeat(87);
    assert!(
        out.contains(&format!(
            "{dashes}\n #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]\n"
        )),
        "{out}"
    );
    let row = out
        .lines()
        .find(|l| l.split_whitespace().take(2).eq(["64", "1000"]))
        .unwrap_or_else(|| panic!("a perftest row for 64 B x 1000: {out}"));
    assert!(
        row.starts_with(" 64         1000             0.00  "),
        "{row:?}"
    );
    // Two tabs and three spaces before the message rate, as Debian 12's perftest 4.5+0.17
    // prints it (upstream prints five since 2024's 24.07).
    // The rate itself is whatever this machine reaches: a digit, a point and six places.
    let rate = row
        .split("\t\t   ")
        .nth(1)
        .unwrap_or_else(|| panic!("{row:?}"));
    assert!(
        rate.chars().next().is_some_and(|c| c.is_ascii_digit())
            && rate
                .split_once('.')
                .is_some_and(|(_, f)| f.trim_end().len() == 6),
        "{row:?}"
    );
    let mib: f64 = row.split_whitespace().nth(3).unwrap().parse().unwrap();
    assert!(mib > 0.0, "{row}");
    // -a: every size ib_write_bw -a runs, 2 to 2^23 bytes; --report_gbits: in Gb/sec.
    let o = selsig(&["bench", "-Q", "4", "-a", "-n", "8", "--report_gbits"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains("BW peak[Gb/sec]    BW average[Gb/sec]"),
        "{out}"
    );
    let sizes: Vec<u64> = out
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() == 5 && f[1] == "8").then(|| f[0].parse().unwrap())
        })
        .collect();
    assert_eq!(sizes, (1..24).map(|i| 1u64 << i).collect::<Vec<_>>());
    let o = selsig(&["bench", "-e", "4", "-n", "8", "--report_gbits"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--report_gbits changes perftest mode's table"));
    let o = selsig(&["bench", "-Q", "4", "-a", "-s", "64"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let v = bench_json(&["--cq-mod", "100", "-s", "64", "-n", "1000"]);
    let p = &v["points"][0];
    assert_eq!(
        (p["cqes"].as_u64(), p["wrs"].as_u64()),
        (Some(10), Some(1000))
    );
    assert_eq!(v["settings"]["post_list"], 1);
    assert_eq!(v["settings"]["perftest_mode"], true);
    assert_eq!(
        v["settings"]["nic_times"], false,
        "perftest mode reads no clock"
    );
    // perftest's memory, as ib_write_bw registers it: max(size, a page) on each side.
    assert_eq!(v["settings"]["region"], 4096);
    assert!(
        p["round_trip_ns"].is_null(),
        "no yardstick between perftest's figures: {p}"
    );
    assert!(
        p["lag"].is_null(),
        "perftest mode reads no clock while it runs: {p}"
    );
}

/// `--qp N` (ib_write_bw's -q): N queue pairs on one completion queue, `-n` WRITEs on each;
/// perftest's row has N × `-n` iterations, and every queue pair's WRITEs completed, landed
/// in its own peer's memory (the bench checks each peer's bytes after the run: a run that
/// succeeds passed that check) and were signaled as each one's `--cq-mod` says.
#[test]
fn bench_perftest_mode_runs_several_queue_pairs() {
    let o = selsig(&[
        "bench", "--cq-mod", "10", "-s", "64", "-n", "200", "-q", "3",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.starts_with(
            "selsig bench: soft provider, soft0 (mlx5); RDMA WRITE, 3 RC QPs round robin on one CQ,"
        ),
        "{out}"
    );
    assert!(out.contains("200 WRITEs per QP per point"), "{out}");
    let row = out
        .lines()
        .find(|l| l.starts_with(" 64 "))
        .unwrap_or_else(|| panic!("a perftest row for 64 B: {out}"));
    assert!(
        row.starts_with(" 64         600              0.00  "),
        "{row:?}"
    );
    let mib: f64 = row.split_whitespace().nth(3).unwrap().parse().unwrap();
    assert!(mib > 0.0, "{row}");

    let v = bench_json(&["--cq-mod", "10", "-s", "64", "-n", "200", "-q", "3"]);
    let p = &v["points"][0];
    assert_eq!(p["wrs"], 600, "{p}");
    assert_eq!(p["wrs_per_qp"], serde_json::json!([200, 200, 200]), "{p}");
    // Every 10th WRITE of each queue pair signaled, none forced, no marker.
    assert_eq!(
        (p["cqes"].as_u64(), p["forced"].as_u64()),
        (Some(60), Some(0))
    );
    assert_eq!(p["markers"], 0, "{p}");
    assert_eq!(v["settings"]["qps"], 3);
    assert_eq!(v["settings"]["iters"], 200);
    // perftest's memory: a page (max(size, page)) per queue pair on each side.
    assert_eq!(v["settings"]["region"], 3 * 4096);

    // The last WRITE of each queue pair is signaled (-n not a multiple of --cq-mod); large
    // WRITEs (all at offset 0), inline WRITEs, the rxe personality, a queue of one.
    for (args, wrs, cqes) in [
        (
            &["-Q", "16", "-s", "64", "-n", "100", "-q", "2"][..],
            200,
            14,
        ),
        (&["-Q", "4", "-s", "8K", "-n", "10", "-q", "2"], 20, 6),
        (
            &["-Q", "8", "-s", "64", "-n", "100", "-q", "4", "--inline"],
            400,
            52,
        ),
        (
            &[
                "-Q",
                "8",
                "-s",
                "4K",
                "-n",
                "64",
                "-q",
                "2",
                "--personality",
                "rxe",
            ],
            128,
            16,
        ),
        (
            &["-Q", "1", "-t", "1", "-s", "2", "-n", "5", "-q", "5"],
            25,
            25,
        ),
    ] {
        let v = bench_json(args);
        let p = &v["points"][0];
        let qps: u64 = args[args.iter().position(|&a| a == "-q").unwrap() + 1]
            .parse()
            .unwrap();
        assert_eq!(p["wrs"], wrs, "{args:?}: {p}");
        assert_eq!(p["cqes"], cqes, "{args:?}: {p}");
        let per_qp = p["wrs_per_qp"].as_array().unwrap();
        assert_eq!(per_qp.len() as u64, qps, "{args:?}: {p}");
        assert!(
            per_qp.iter().all(|n| n.as_u64() == Some(wrs / qps)),
            "{args:?}: {p}"
        );
    }

    // One queue pair: the report is as before, with neither field.
    let v = bench_json(&["--cq-mod", "10", "-s", "64", "-n", "20"]);
    assert!(v["settings"].get("qps").is_none(), "{v}");
    assert!(v["points"][0].get("wrs_per_qp").is_none(), "{v}");

    // -a: a row per size, each of -n × QPs.
    let o = selsig(&["bench", "-Q", "4", "-a", "-n", "8", "-q", "2"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let rows = stdout(&o)
        .lines()
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() == 5 && f[1] == "16"
        })
        .count();
    assert_eq!(rows, 23, "{}", stdout(&o));

    // More queue pairs than the device's completion queue takes (rxe's: 32767 entries) is
    // the device's refusal, with --qp named (exit code 1).
    let o = selsig(&[
        "bench",
        "-Q",
        "4",
        "-n",
        "5",
        "-q",
        "256",
        "--personality",
        "rxe",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(
            "cannot create the completion queue of 32769 entries for --qp 256 with --tx-depth 128"
        ),
        "{}",
        stderr(&o)
    );
}

/// A short sweep of two sizes and three policies (the adaptive one too), its report and
/// chart written to files.
fn small_sweep(json: &Path, svg: &Path) -> Output {
    let (json, svg) = (json.to_str().unwrap(), svg.to_str().unwrap());
    selsig(&[
        "bench",
        "-n",
        "500",
        "-s",
        "64,4K",
        "-e",
        "1,8,adaptive",
        "--json",
        json,
        "--svg",
        svg,
    ])
}

#[test]
fn bench_draws_an_svg_and_writes_json_to_a_file() {
    let dir = scratch("selsig-bench");
    let svg = dir.join("bench.svg");
    let json = dir.join("bench.json");
    let o = small_sweep(&json, &svg);
    assert!(o.status.success(), "{}", stderr(&o));
    let table = stdout(&o);
    assert!(
        table.contains("every:8") && table.contains("lag p50"),
        "{table}"
    );
    let rows = |size: &str| {
        table
            .lines()
            .filter(|l| l.trim_start().starts_with(size))
            .count()
    };
    assert_eq!((rows("64B "), rows("4KiB ")), (3, 3), "{table}");
    assert!(table.contains("memcpy of the same buffers"), "{table}");
    let drawing = std::fs::read_to_string(&svg).unwrap();
    assert!(
        drawing.starts_with("<svg") && drawing.contains("Throughput"),
        "{drawing:.200}"
    );
    assert!(drawing.contains("Confirmation lag") && drawing.contains("Learned later"));
    assert!(drawing.contains("64B") && drawing.contains("4KiB"));
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(v["points"].as_array().unwrap().len(), 6);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The texts of an SVG document, in order.
fn svg_texts(svg: &str) -> Vec<String> {
    svg.split("<text")
        .skip(1)
        .filter_map(|t| Some(t[t.find('>')? + 1..t.find("</text>")?].trim().to_string()))
        .collect()
}

/// The numbers among `texts` from the one starting with `from` to the next panel's title.
/// The y labels of the panel titled `from`. A panel's numbers are its y labels, then its
/// x labels, the intervals 1, 2, 4, … (the y labels may hold a 1 too: the x labels are the
/// run of powers of two from 1 that ends the list).
fn axis_numbers(texts: &[String], from: &str) -> Vec<f64> {
    let at = texts.iter().position(|t| t.starts_with(from)).unwrap();
    let mut numbers: Vec<f64> = texts[at + 1..]
        .iter()
        .take_while(|t| {
            !["Throughput", "Confirmation lag", "Learned later"]
                .iter()
                .any(|title| t.starts_with(title))
        })
        .filter_map(|t| t.parse().ok())
        .collect();
    let x_from = (0..numbers.len())
        .find(|&i| {
            numbers[i..]
                .iter()
                .enumerate()
                .all(|(k, &v)| v == f64::from(1u32 << k))
        })
        .unwrap_or(numbers.len());
    numbers.truncate(x_from);
    numbers
}

#[test]
fn bench_svg_tells_more_sizes_than_colors_apart() {
    // Eight sizes, seven colors: the eighth size takes the first size's color, with squares
    // for its points (in the plots and in the legends) where the first has circles.
    let o = selsig(&[
        "bench",
        "-n",
        "50",
        "-s",
        "1,2,3,4,5,6,7,8",
        "-e",
        "1",
        "--svg",
        "-",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let svg = stdout(&o);
    let first = r##"fill="#0072B2""##;
    let count = |tag: &str| {
        svg.split(tag)
            .skip(1)
            .filter(|e| e[..e.find('>').unwrap()].contains(first))
            .count()
    };
    // A point and a legend entry in each of the three panels.
    assert_eq!(count("<circle"), 6, "the first size's circles");
    assert_eq!(count("<rect"), 6, "the eighth size's squares");
}

#[test]
fn bench_svg_lines_follow_the_interval_axis_and_every_axis_has_numbers() {
    // Intervals named out of order: the line still goes left to right.
    let o = selsig(&[
        "bench", "-n", "300", "-s", "64", "-e", "16,1,4", "--svg", "-",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let svg = stdout(&o);
    let line = svg
        .split(r##"stroke="#0072B2" stroke-width="2" points=""##)
        .nth(1)
        .expect("the throughput line");
    let xs: Vec<i64> = line[..line.find('"').unwrap()]
        .split_whitespace()
        .map(|p| p.split(',').next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(xs.len(), 3, "{xs:?}");
    assert!(xs.windows(2).all(|w| w[0] < w[1]), "x = {xs:?}");
    // Each panel's legend stands right of its plot, where it hides no line.
    let legend_xs: Vec<i64> = svg
        .split("<text x=\"")
        .skip(1)
        .filter(|t| {
            t[t.find('>').unwrap() + 1..]
                .trim_start()
                .starts_with("64B")
        })
        .map(|t| t[..t.find('"').unwrap()].parse().unwrap())
        .collect();
    assert_eq!(legend_xs.len(), 3, "a legend per panel");
    assert!(
        legend_xs.iter().all(|&x| x > xs[2] + 20),
        "legends at {legend_xs:?}, the line ends at {}",
        xs[2]
    );
    let texts = svg_texts(&svg);
    for panel in ["Throughput", "Confirmation lag", "Learned later"] {
        assert!(axis_numbers(&texts, panel).len() >= 2, "{panel}: {texts:?}");
    }
    // perftest mode measures no lag: no lag panel; one point, within one decade, still
    // gets numbers on its axis.
    let o = selsig(&[
        "bench", "--cq-mod", "16", "-n", "2000", "-s", "4K", "--svg", "-",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let texts = svg_texts(&stdout(&o));
    assert!(
        !texts.iter().any(|t| t.starts_with("Confirmation lag")),
        "{texts:?}"
    );
    assert!(axis_numbers(&texts, "Throughput").len() >= 2, "{texts:?}");
}

#[test]
fn bench_duration_stops_posting_soon_after_it_for_large_writes_too() {
    // The clock is read every 64 post calls, or after every MiB posted: 16 MiB WRITEs for
    // 10 ms are a few, not 64 (the old clock check let 64 post calls through).
    let o = selsig(&[
        "bench", "-D", "0.01", "-s", "16M", "-e", "1", "-t", "16", "--json", "-",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let wrs = v["points"][0]["wrs"].as_u64().unwrap();
    assert!((1..64).contains(&wrs), "{wrs} WRITEs of 16 MiB in -D 0.01");
}

#[test]
fn bench_refuses_bad_settings_with_exit_code_2() {
    for (args, says) in [
        (
            &["bench", "-e", "256"][..],
            "--every 256 is more than --tx-depth 128, the most WRITEs outstanding",
        ),
        (&["bench", "--cq-mod", "200", "-t", "64"], "--cq-mod 200"),
        (&["bench", "-n", "0"], "zero iterations"),
        (&["bench", "-l", "0"], "--post-list must be at least 1"),
        (
            &["bench", "-s", "1G", "--region", "64M"],
            "larger than the registered region",
        ),
        (&["bench", "-D", "0s"], "-D 0"),
        (
            &["bench", "-D", "86400.5"],
            "-D 86400.5s: at most a day (86400s) per point",
        ),
        (
            &["bench", "--connect", "127.0.0.1"],
            "--connect 127.0.0.1: needs --provider verbs",
        ),
        (
            &["bench", "--region", "64G", "-s", "1G"],
            "--region 68719476736: the bench registers at most 4294967296 bytes",
        ),
        // The adaptive point's unsignaled run is an interval like any other: within the
        // buffers (16 of 64 B in 1 KiB), not only within the queue.
        (
            &[
                "bench",
                "-s",
                "64",
                "--region",
                "1K",
                "-e",
                "adaptive",
                "--adaptive",
                "adaptive:64,1ms",
            ],
            "--adaptive adaptive:64,1ms: 64 with --size 64: only 16 WRITEs",
        ),
        (
            &["bench", "-e", "1,2", "--adaptive", "adaptive:4,1us"],
            "--adaptive adaptive:4,1us: no `adaptive` point",
        ),
        (
            &["bench", "--cq-mod", "4", "--adaptive", "adaptive:4,1us"],
            "no `adaptive` point",
        ),
        (
            &["bench", "-s", "1.3"],
            "1.3 is not a whole number of bytes",
        ),
        (&["bench", "-D", "-1"], "invalid duration \"-1\""),
        (&["bench", "-D", "-1s"], "invalid duration \"-1s\""),
        (&["bench", "-s", "-1K"], "-1K"),
        (&["bench", "--region", "-1"], "-1"),
        // What perftest mode does not reproduce of ib_write_bw.
        (&["bench", "--cq-mod", "4", "-l", "4"], "--post-list 4"),
        // ib_write_bw's own limits.
        (
            &["bench", "--cq-mod", "1025"],
            "--cq-mod 1025: ib_write_bw takes 1 to 1024",
        ),
        (
            &["bench", "--cq-mod", "4", "-t", "15001"],
            "--tx-depth 15001 with --cq-mod: ib_write_bw takes 1 to 15000",
        ),
        (
            &["bench", "--cq-mod", "4", "-n", "4"],
            "-n 4 with --cq-mod: ib_write_bw takes 5 to 100000000",
        ),
        (
            &["bench", "--cq-mod", "4", "-n", "100000001"],
            "-n 100000001 with --cq-mod: ib_write_bw takes 5 to 100000000",
        ),
        (&["bench", "--cq-mod", "4", "-D", "1s"], "--cq-mod with -D"),
        (
            &["bench", "--cq-mod", "4", "-s", "64", "--region", "64"],
            "--region 64 with --cq-mod",
        ),
        (&["bench", "-e", "-1"], "invalid signal interval \"-1\""),
        // --qp: at least one, several only in perftest mode, within ib_write_bw's bound,
        // not to selsig serve, and their memory within the bench's.
        (
            &["bench", "--cq-mod", "4", "-q", "0"],
            "--qp 0: at least one queue pair",
        ),
        (
            &["bench", "-q", "2"],
            "--qp 2: several queue pairs are perftest mode's (--cq-mod)",
        ),
        (
            &["bench", "--cq-mod", "4", "--qp", "16385"],
            "--qp 16385: ib_write_bw -q takes 1 to 16384 queue pairs",
        ),
        (
            &[
                "bench",
                "--cq-mod",
                "4",
                "-q",
                "2",
                "--provider",
                "verbs",
                "--connect",
                "127.0.0.1",
            ],
            "--qp 2 with --connect 127.0.0.1",
        ),
        (
            &["bench", "--cq-mod", "4", "-a", "-q", "513"],
            "--qp 513: 513 queue pairs of 8388608 bytes each",
        ),
        (
            &["bench", "--json", "-", "--svg", "-"],
            "both to standard output",
        ),
    ] {
        let o = selsig(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(says), "{args:?}: {}", stderr(&o));
        assert!(o.stdout.is_empty(), "{args:?}");
    }
    let o = selsig(&["bench", "--inline", "-s", "64K", "-n", "10"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("inline"), "{}", stderr(&o));
}

/// With `--inline`, a size the device cannot take inline is refused before any point runs
/// (the soft NIC's mlx5 takes 316 bytes, as libmlx5 does on a ConnectX of 512-byte WQEs):
/// a long sweep does not run its small sizes only to fail at the first large one.
#[test]
fn bench_inline_checks_every_size_before_the_first_point() {
    let dir = scratch("inline-sizes");
    let json = dir.join("out.json");
    let start = std::time::Instant::now();
    let o = selsig(&[
        "bench",
        "--inline",
        "-s",
        "64,4K",
        "-e",
        "1",
        "-D",
        "30s",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("4096-byte inline WRITEs") && stderr(&o).contains("up to 316 bytes"),
        "{}",
        stderr(&o)
    );
    // The 64-byte point would have taken 30 s (and its failure would name the point).
    assert!(start.elapsed().as_secs() < 25, "a point ran first");
    assert!(!stderr(&o).contains("every:1"), "{}", stderr(&o));
    assert!(o.stdout.is_empty(), "no point ran: {}", stdout(&o));
    assert!(!json.exists(), "no report");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bench_refuses_a_send_queue_whose_completion_queue_cannot_be_sized() {
    // The CQ holds two completions per send-queue slot, plus two: 2 * 4294967295 + 2
    // does not fit in a CQ size at all.
    let o = selsig(&["bench", "-t", "4294967295", "-n", "10"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("--tx-depth 4294967295"),
        "{}",
        stderr(&o)
    );
    // Representable, but more than the soft NIC's CQs hold: the device says no, and the
    // error says which option asked for it.
    let o = selsig(&["bench", "-t", "3000000", "-s", "64", "-e", "1", "-n", "10"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("6000002 entries") && err.contains("--tx-depth 3000000"),
        "{err}"
    );
}

#[test]
fn output_files_are_checked_before_the_run_and_kept_when_it_fails() {
    let dir = scratch("selsig-cli-out");
    let missing = dir.join("no-such-folder").join("out");
    let missing = missing.to_str().unwrap();
    let quick = ["bench", "-n", "100", "-s", "64", "-e", "1"];
    // A file that cannot be written is bad input, refused before anything runs.
    for (option, mut args) in [
        ("--json", quick.to_vec()),
        ("--svg", quick.to_vec()),
        ("--trace", vec!["run", "-q"]),
    ] {
        let seed = scenarios().join("seed.toml");
        if option == "--trace" {
            args.push(seed.to_str().unwrap());
        }
        args.extend([option, missing]);
        let o = selsig(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        let err = stderr(&o);
        assert!(err.contains(option) && err.contains(missing), "{err}");
        assert!(o.stdout.is_empty(), "{args:?}: {}", stdout(&o));
    }
    // A run that fails leaves an existing file as it was and creates none.
    let old = dir.join("old.json");
    std::fs::write(&old, "old\n").unwrap();
    let new = dir.join("new.svg");
    let o = selsig(&[
        "bench",
        "--inline",
        "-s",
        "64K",
        "-n",
        "10",
        "--json",
        old.to_str().unwrap(),
        "--svg",
        new.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert_eq!(std::fs::read_to_string(&old).unwrap(), "old\n");
    assert!(!new.exists(), "{} was left behind", new.display());
    // A run that succeeds replaces all of a longer file.
    std::fs::write(&old, "x".repeat(100_000)).unwrap();
    let o = selsig(&[quick.as_slice(), &["--json", old.to_str().unwrap()]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&old).unwrap()).unwrap();
    assert_eq!(v["points"].as_array().unwrap().len(), 1);
    // A FIFO is opened once and gets the trace (a reader sees it whole).
    let fifo = dir.join("trace.fifo");
    let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || std::fs::read_to_string(fifo).unwrap())
    };
    let seed = scenarios().join("seed.toml");
    let o = selsig(&[
        "run",
        "-q",
        seed.to_str().unwrap(),
        "--trace",
        fifo.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let trace = reader.join().unwrap();
    assert!(
        trace.lines().count() > 8 && trace.contains("\"wr_id\":4"),
        "{trace}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The outputs of a command are written all or nothing: rendered first, written to
/// temporary files, which replace the named files once every output is written.
#[test]
fn bench_outputs_are_written_all_or_nothing() {
    let dir = scratch("selsig-cli-outputs");
    let quick = ["bench", "-n", "100", "-s", "64", "-e", "1"];
    // The SVG cannot be written: the JSON file it created is gone again.
    let json = dir.join("new.json");
    let args = [
        &quick[..],
        &["--json", json.to_str().unwrap(), "--svg", "/dev/full"],
    ]
    .concat();
    let o = selsig(&args);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("/dev/full"), "{}", stderr(&o));
    assert!(!json.exists(), "{} was left behind", json.display());
    // A write that fails part-way (a 1 KiB file size limit) leaves the old contents.
    let old = dir.join("old.json");
    std::fs::write(&old, "OLD\n").unwrap();
    let script = format!(
        "trap '' XFSZ; ulimit -f 1; exec {} {} --json {}",
        env!("CARGO_BIN_EXE_selsig"),
        quick.join(" "),
        old.display()
    );
    let o = Command::new("bash").args(["-c", &script]).output().unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert_eq!(std::fs::read_to_string(&old).unwrap(), "OLD\n");
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, ["old.json"], "temporary files left behind");
    // One new file named two ways (a relative and an absolute path, or a link): refused
    // before the run, and not left behind.
    let out = dir.join("out");
    let link = dir.join("link");
    std::os::unix::fs::symlink(&out, &link).unwrap();
    for svg in [out.clone(), link.clone()] {
        let o = Command::new(env!("CARGO_BIN_EXE_selsig"))
            .current_dir(&dir)
            .args(quick)
            .args(["--json", "out", "--svg"])
            .arg(&svg)
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2), "{svg:?}: {}", stderr(&o));
        assert!(stderr(&o).contains("the same file"), "{}", stderr(&o));
        assert!(!out.exists(), "{svg:?}: {} was left behind", out.display());
    }
    // Through a link, the file linked to is replaced and the link stays.
    std::fs::write(&out, "old\n").unwrap();
    let o = selsig(&[&quick[..], &["--json", link.to_str().unwrap()]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(std::fs::symlink_metadata(&link).unwrap().is_symlink());
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(v["points"].as_array().unwrap().len(), 1);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A file the command created is removed when the command fails: also when it is stopped
/// by a signal (Ctrl-C on a long sweep), and when it was created through a link that
/// pointed nowhere. A file that cannot take its text at the end is named with its option.
#[test]
fn output_files_created_are_removed_when_stopped_or_failed() {
    let dir = scratch("selsig-cli-stopped");
    let (json, svg) = (dir.join("out.json"), dir.join("out.svg"));
    for name in ["INT", "TERM"] {
        let mut child = interruptible(&mut Command::new(env!("CARGO_BIN_EXE_selsig")))
            .args(["bench", "-s", "64", "-e", "1", "-D", "60s", "--json"])
            .arg(&json)
            .arg("--svg")
            .arg(&svg)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        // The files are created before the run starts.
        let start = std::time::Instant::now();
        while !(json.exists() && svg.exists()) {
            assert!(
                start.elapsed().as_secs() < 30,
                "the outputs were never created"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        std::thread::sleep(std::time::Duration::from_millis(300));
        signal(&child, name);
        let status = wait_for(&mut child).expect("the signal ends it");
        use std::os::unix::process::ExitStatusExt as _;
        let number = if name == "INT" { 2 } else { 15 };
        // Stopped by the signal, as without the clean-up.
        assert_eq!(status.signal(), Some(number), "{name}: {status:?}");
        assert!(
            !json.exists() && !svg.exists(),
            "{name}: outputs left behind"
        );
    }
    // Through a link to a file that does not exist yet: the run fails (an inline WRITE
    // beyond the limit), and the file the link made is removed.
    let target = dir.join("target.json");
    let link = dir.join("link.json");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let o = selsig(&[
        "bench",
        "--inline",
        "-s",
        "64K",
        "-n",
        "10",
        "--json",
        link.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(!target.exists(), "{} was left behind", target.display());
    assert!(std::fs::symlink_metadata(&link).unwrap().is_symlink());
    // Refused as one file named two ways: neither is left behind.
    let o = selsig(&[
        "bench",
        "-n",
        "10",
        "--json",
        link.to_str().unwrap(),
        "--svg",
        target.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(!target.exists(), "{} was left behind", target.display());
    // A file that fails at the end is named with its option.
    let o = selsig(&[
        "bench",
        "-n",
        "10",
        "-s",
        "64",
        "-e",
        "1",
        "--json",
        "/dev/full",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("--json /dev/full: cannot write"),
        "{}",
        stderr(&o)
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `cmd` with SIGINT at its default action in the child, as a command started from a
/// terminal has it. The tests may run as a shell's background job, which inherits SIGINT
/// ignored, and the command then rightly leaves it ignored (as under `nohup`).
fn interruptible(cmd: &mut Command) -> &mut Command {
    use std::os::unix::process::CommandExt as _;
    // SAFETY: between fork and exec the hook only calls `signal`, which is
    // async-signal-safe, and allocates nothing.
    unsafe {
        cmd.pre_exec(|| {
            libc::signal(libc::SIGINT, libc::SIG_DFL);
            Ok(())
        })
    }
}

/// Waits up to 30 s for `child` to end; kills it if it does not.
fn wait_for(child: &mut std::process::Child) -> Option<std::process::ExitStatus> {
    let start = std::time::Instant::now();
    while start.elapsed().as_secs() < 30 {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.kill().ok();
    child.wait().ok();
    None
}

fn signal(child: &std::process::Child, signal: &str) {
    let sent = Command::new("kill")
        .args([format!("-{signal}"), child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
}

/// The clean-up leaves signals alone where they were ignored (`nohup`), stops a command
/// waiting to open a FIFO no one reads, and removes the temporary file of a text staged
/// when a signal stops the command.
#[test]
fn signals_stop_the_command_as_before_and_leave_no_temporary_file() {
    use std::os::unix::process::ExitStatusExt as _;
    let dir = scratch("selsig-cli-signals");
    let json = dir.join("out.json");
    // Under nohup, SIGHUP is ignored: the run goes on and writes its output.
    let mut child = Command::new("nohup")
        .arg(env!("CARGO_BIN_EXE_selsig"))
        .args(["bench", "-s", "64", "-e", "1", "-D", "1s", "--json"])
        .arg(&json)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let start = std::time::Instant::now();
    while !json.exists() {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(30),
            "no JSON file came"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    std::thread::sleep(std::time::Duration::from_millis(200));
    signal(&child, "HUP");
    let status = wait_for(&mut child).expect("the run ends");
    assert!(status.success(), "{status:?}");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(v["points"].as_array().unwrap().len(), 1);
    std::fs::remove_file(&json).unwrap();
    // Opening a FIFO that no one reads waits; SIGTERM still ends it.
    let fifo = dir.join("out.fifo");
    assert!(
        Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    let mut child = Command::new(env!("CARGO_BIN_EXE_selsig"))
        .args(["bench", "-n", "100", "--json"])
        .arg(&fifo)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Until one of its threads waits in the FIFO's open (the kernel's `wait_for_partner`).
    let start = std::time::Instant::now();
    let in_open = || {
        std::fs::read_dir(format!("/proc/{}/task", child.id()))
            .into_iter()
            .flatten()
            .flatten()
            .any(|t| {
                std::fs::read_to_string(t.path().join("wchan"))
                    .is_ok_and(|w| w.contains("wait_for_partner"))
            })
    };
    while !in_open() {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(30),
            "the bench never waited in the FIFO's open"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    signal(&child, "TERM");
    let status = wait_for(&mut child).expect("SIGTERM ends it");
    assert_eq!(status.signal(), Some(15), "{status:?}");
    // The JSON is staged in a temporary file, then the SVG blocks on a full FIFO: SIGINT
    // removes both the new JSON file and the temporary one.
    let reader = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&fifo)
        .unwrap();
    rustix::pipe::fcntl_setpipe_size(&reader, 4096).unwrap();
    let mut child = interruptible(&mut Command::new(env!("CARGO_BIN_EXE_selsig")))
        .args(["bench", "-n", "100", "-s", "64", "-e", "1", "--json"])
        .arg(&json)
        .arg("--svg")
        .arg(&fifo)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let staged = || {
        std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(".selsig-"))
            .count()
    };
    let start = std::time::Instant::now();
    while staged() == 0 {
        assert!(start.elapsed().as_secs() < 30, "nothing was staged");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    std::thread::sleep(std::time::Duration::from_millis(200));
    signal(&child, "INT");
    let status = wait_for(&mut child).expect("SIGINT ends it");
    assert_eq!(status.signal(), Some(2), "{status:?}");
    assert_eq!(staged(), 0, "a temporary file was left behind");
    assert!(!json.exists(), "{} was left behind", json.display());
    drop(reader);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Standard output takes the table, or the JSON or SVG sent there with `-`: a file that is
/// standard output (`/dev/stdout`, or the file it was redirected to) would mix with it or,
/// replaced, lose it. Refused before the run; `/dev/null` is no such file.
#[test]
fn bench_refuses_an_output_file_that_is_standard_output() {
    let quick = ["bench", "-n", "100", "-s", "64", "-e", "1"];
    let dir = std::env::temp_dir().join(format!("selsig-stdout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("out");
    for (args, taken_by) in [
        (vec!["--json", "-", "--svg", "/dev/stdout"], "--json -"),
        (vec!["--svg", "-", "--json", "/dev/stdout"], "--svg -"),
        (vec!["--json", out.to_str().unwrap()], "the table"),
    ] {
        let o = Command::new(env!("CARGO_BIN_EXE_selsig"))
            .args(quick)
            .args(&args)
            .stdout(std::fs::File::create(&out).unwrap())
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(
            stderr(&o).contains(&format!("standard output, which {taken_by} takes too")),
            "{args:?}: {}",
            stderr(&o)
        );
        assert_eq!(
            std::fs::read_to_string(&out).unwrap(),
            "",
            "{args:?}: nothing written"
        );
    }
    let o = Command::new(env!("CARGO_BIN_EXE_selsig"))
        .args(quick)
        .args(["--json", "/dev/null"])
        .stdout(std::fs::File::create("/dev/null").unwrap())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bench_keeps_the_signal_interval_within_the_buffers_the_region_holds() {
    // 64 KiB WRITEs, a 1 MiB region: 16 buffers, so at most 16 WRITEs outstanding. An
    // interval of 32 would leave every buffer with an unconfirmed WRITE and nothing
    // signaled: refused up front, naming the options.
    let o = selsig(&[
        "bench", "-s", "64K", "--region", "1M", "-e", "32", "-n", "100",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("--every 32") && err.contains("16") && err.contains("--region"),
        "{err}"
    );
    // The default sweep stops at 16 for that size, and its adaptive point signals at
    // least every 8th.
    let v = bench_json(&["-s", "64K", "--region", "1M", "-n", "200"]);
    let policies: Vec<&str> = v["points"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["policy"].as_str().unwrap())
        .collect();
    assert_eq!(
        policies,
        [
            "every:1",
            "every:2",
            "every:4",
            "every:8",
            "every:16",
            "adaptive:8,20us"
        ]
    );
    for p in v["points"].as_array().unwrap() {
        assert_eq!(p["wrs"].as_u64(), Some(200), "{p}");
    }
}

#[test]
fn bench_output_options_and_small_queues() {
    let dir = scratch("selsig-cli-bench");
    // --json and --svg to one file: refused before the run, the file left as it was.
    let same = dir.join("same.out");
    std::fs::write(&same, "old\n").unwrap();
    let same = same.to_str().unwrap();
    let o = selsig(&[
        "bench", "-n", "100", "-s", "64", "-e", "1", "--json", same, "--svg", same,
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("the same file"), "{}", stderr(&o));
    assert_eq!(std::fs::read_to_string(same).unwrap(), "old\n");
    // A device takes both (a terminal shows them, /dev/null drops them).
    let o = selsig(&[
        "bench",
        "-n",
        "100",
        "-s",
        "64",
        "-e",
        "1",
        "--json",
        "/dev/null",
        "--svg",
        "/dev/null",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    // --svg - draws on stdout, without the table.
    let o = selsig(&["bench", "-n", "100", "-s", "64", "-e", "1", "--svg", "-"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.starts_with("<svg") && out.trim_end().ends_with("</svg>"),
        "{out}"
    );
    // A send queue shallower than the default post list takes its depth per post.
    let v = bench_json(&["-t", "8", "-s", "64", "-e", "1", "-n", "100"]);
    assert_eq!(v["settings"]["post_list"], 8);
    assert_eq!(v["points"][0]["wrs"], 100);
    // A size given twice runs once; the JSON has the region and the GID index.
    let v = bench_json(&["-s", "4K,4096", "-e", "1", "-n", "100"]);
    assert_eq!(v["points"].as_array().unwrap().len(), 1);
    assert_eq!(v["settings"]["region"], 256 << 20);
    assert!(v["settings"]["gid_index"].is_null());
    // Standard output that cannot be written is an error, not a panic.
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .expect("Linux has /dev/full");
    let o = Command::new(env!("CARGO_BIN_EXE_selsig"))
        .args(["bench", "-n", "100", "-s", "64", "-e", "1"])
        .stdout(full)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("cannot write to standard output"),
        "{}",
        stderr(&o)
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bench_inline_writes_need_no_buffers() {
    let v = bench_json(&["--inline", "-s", "64", "-e", "16", "-n", "1000"]);
    let p = &v["points"][0];
    assert_eq!(
        (p["wrs"].as_u64(), p["cqes"].as_u64()),
        (Some(1000), Some(63))
    );
    assert_eq!(v["settings"]["inline"], true);
}

/// A scenario whose QP's peer reports its `depth` receives to a CQ of `size` entries of
/// its own: each receive is used by a SEND.
fn receive_only(size: u32, depth: u32) -> String {
    format!(
        r#"description = "a receive-only CQ of {size} for {depth} receives"
[[cq]]
name = "r"
size = {size}
[[qp]]
name = "a"
peer_cq = "r"
peer_depth = {depth}
policy = "always"
[[step]]
recv = {{ qp = "a.peer", count = {depth} }}
[[step]]
post = {{ qp = "a", op = "send", count = {depth} }}
[[step]]
poll = "idle"
"#
    )
}

#[test]
fn a_cq_keeps_room_for_the_peer_receives_that_report_to_it() {
    let dir = scratch("selsig-cli-room");
    let scenario = |peer_cq: &str| {
        format!(
            r#"description = "A CQ of one entry, every WRITE signaled."
[[cq]]
name = "c"
size = 1
[[qp]]
name = "a"
depth = 4
policy = "always"
send_cq = "c"
{peer_cq}
peer_depth = 4
[[region]]
name = "src"
size = 64
access = ["local_write"]
[[region]]
name = "dst"
size = 64
access = ["local_write", "remote_write"]
[[step]]
post = {{ qp = "a", op = "write", local = "src", remote = "dst", size = 8, count = 3 }}
[[step]]
poll = "idle"
[expect]
outcomes = {{ a = ["1-3 completed"] }}
"#
        )
    };
    let path = dir.join("one.toml");
    // The requester's own receive queue is never posted to: all of a one-entry CQ is
    // the sends'.
    std::fs::write(&path, scenario("")).unwrap();
    let o = selsig(&["run", path.to_str().unwrap(), "-q"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    // The peer's four receive slots on the same CQ: nothing is left for the sends. The
    // file says so (with its line).
    std::fs::write(&path, scenario("peer_cq = \"c\"")).unwrap();
    let o = selsig(&["run", path.to_str().unwrap(), "-q"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(
            ":2:1: cq \"c\": size 1 holds less than the 4 receive slots (peer_depth) of the \
             peers that report to it and a send completion"
        ),
        "{}",
        stderr(&o)
    );
    // A CQ of receives only, as large as the receive queue asked for, but the device
    // rounds them differently (mlx5: 6 entries make 7, 5 receive slots make 8): the queue
    // could hold eight receives, whose completions would overrun it. Refused when the run
    // creates them.
    std::fs::write(&path, receive_only(6, 5)).unwrap();
    let o = selsig(&["run", path.to_str().unwrap(), "-q"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(
            "cq \"r\" holds 7 completions, fewer than the 8 receive slots of the peers that \
             report to it: their completions could overrun it"
        ),
        "{}",
        stderr(&o)
    );
    // The receive slots of every peer that reports to a CQ count: two queues of 3
    // receives (6, as the CQ) that mlx5 makes 4 each.
    let two_peers = r#"description = "two peers' receives in one CQ"
[[cq]]
name = "r"
size = 6
[[qp]]
name = "a"
peer_cq = "r"
peer_depth = 3
[[qp]]
name = "b"
peer_cq = "r"
peer_depth = 3
[[step]]
recv = { qp = "a.peer" }
[[step]]
post = { qp = "a", op = "send" }
[[step]]
poll = "idle"
"#;
    std::fs::write(&path, two_peers).unwrap();
    let o = selsig(&["run", path.to_str().unwrap(), "-q"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(
            "cq \"r\" holds 7 completions, fewer than the 8 receive slots of the peers that \
             report to it"
        ),
        "{}",
        stderr(&o)
    );
    // rxe's CQs and receive queues hold what was asked: a receive-only CQ exactly as large
    // as its peer's receive queue is enough.
    std::fs::write(&path, receive_only(7, 7)).unwrap();
    let o = selsig(&["run", path.to_str().unwrap(), "-q", "--personality", "rxe"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    std::fs::remove_dir_all(&dir).ok();
}

/// Asynchronous events are compared as a set: two from different steps, raised in the
/// reverse of their names' order, meet a list in either order.
#[test]
fn async_events_of_several_steps_are_compared_in_any_order() {
    let text = r#"description = "two access errors, b's first"
[[qp]]
name = "b"
policy = "always"
[[qp]]
name = "a"
policy = "always"
[[region]]
name = "src"
size = 64
access = ["local_write"]
[[region]]
name = "dst"
size = 64
access = ["local_write", "remote_write"]
[[step]]
post = { qp = "b", op = "write", local = "src", remote = "dst", size = 64, fault = "bad_rkey" }
[[step]]
poll = "idle"
[[step]]
post = { qp = "a", op = "write", local = "src", remote = "dst", size = 64, fault = "bad_rkey" }
[[step]]
poll = "idle"
[expect]
events = ["qp_access_err:a.peer", "qp_access_err:b.peer"]
"#;
    let dir = scratch("selsig-cli-async-order");
    let path = dir.join("async-order.toml");
    std::fs::write(&path, text).unwrap();
    let o = selsig(&["run", path.to_str().unwrap(), "--personality", "mlx5"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    // The trace has them in the order raised.
    let out = stdout(&o);
    let b = out.find("\"qp\":\"b.peer\"").expect("b's event");
    let a = out.find("\"qp\":\"a.peer\"").expect("a's event");
    assert!(b < a, "{out}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_run_that_ends_with_work_outstanding_fails_before_reading_the_regions() {
    let dir = scratch("selsig-cli-unretired");
    let seed = std::fs::read_to_string(scenarios().join("seed.toml")).unwrap();
    let (steps, _) = seed.split_once("[[step]]\npoll").unwrap();
    for (name, text, outstanding) in [
        // The seed without its poll step, expecting nothing: the WRITEs may still be
        // running, and none has an outcome.
        (
            "writes",
            format!("{steps}[expect]\ncqes = []\noutcomes = {{ a = [] }}\n"),
            "a: 8 work requests, 0 receives outstanding",
        ),
        // A receive that nothing consumes never completes.
        (
            "receive",
            seed.replace(
                "poll = \"idle\"\n",
                "poll = \"idle\"\n\n[[step]]\nrecv = { qp = \"a.peer\" }\n",
            ),
            "a: 0 work requests, 1 receives outstanding",
        ),
    ] {
        let path = dir.join(format!("{name}.toml"));
        std::fs::write(&path, text).unwrap();
        let o = selsig(&["run", path.to_str().unwrap()]);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{name}: {err}");
        assert!(
            err.contains("the run ended with work outstanding") && err.contains(outstanding),
            "{name}: {err}"
        );
        let out = stdout(&o);
        assert!(out.contains("\"event\":\"step\""), "{name}: {out}");
        assert!(!out.contains("\"event\":\"digest\""), "{name}: {out}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// Two send queues on one CQ of `size` entries: `a` (policy never, depth 16) posts
/// `a_count` WRITEs, `b` (every WRITE signaled, depth `b_depth`) posts `b_count`; then
/// `steps`.
fn shared_cq_scenario(size: u32, a: &str, b: &str, steps: &str) -> String {
    format!(
        r#"description = "Two send queues share one CQ."
[[cq]]
name = "shared"
size = {size}
[[qp]]
name = "a"
send_cq = "shared"
{a}
[[qp]]
name = "b"
send_cq = "shared"
{b}
[[region]]
name = "src"
size = 2048
access = ["local_write"]
fill = "pattern"
[[region]]
name = "dst"
size = 2048
access = ["local_write", "remote_write"]
{steps}"#
    )
}

/// A shared CQ of 8: a posts 3 WRITEs (policy never), b 12 (with `b`'s policy line), a
/// confirms its tail, then every queue is polled; every WRITE completes.
fn a_confirm_behind_b(b: &str) -> String {
    shared_cq_scenario(
        8,
        "policy = \"never\"",
        b,
        r#"[[step]]
post = { qp = "a", op = "write", local = "src", remote = "dst", size = 64, count = 3 }
[[step]]
post = { qp = "b", op = "write", local = "src", remote = "dst", size = 64, count = 12 }
[[step]]
confirm = "a"
[[step]]
poll = "idle"
[expect]
outcomes = { a = ["1-3 completed"], b = ["1-12 completed"] }
"#,
    )
}

/// As in `a_confirm_on_a_full_shared_cq_polls_for_room`, with b signaling every 4th
/// WRITE: the completions a's confirm polls for b (those of WRITEs 4, 8 and 12) go to b
/// in the order polled, and show in the next step that polls, not in the confirm step.
#[test]
fn completions_a_confirm_polled_for_another_queue_go_to_it_in_order() {
    let text = a_confirm_behind_b("policy = \"every:4\"");
    let out = trace_of("confirm-order", &text);
    let at = |what: &str| out.find(what).unwrap_or_else(|| panic!("no {what}: {out}"));
    let poll_step = at("{\"event\":\"step\",\"n\":4,\"kind\":\"poll\"}");
    let cqes: Vec<usize> = [4, 8, 12]
        .iter()
        .map(|n| at(&format!("{{\"event\":\"cqe\",\"qp\":\"b\",\"wr_id\":{n},")))
        .collect();
    assert!(poll_step < cqes[0], "{out}");
    assert!(cqes.is_sorted(), "{out}");
}

/// A queue that waits for room on a shared CQ keeps the completions of other queues it
/// polls for them, unhandled: a's completions, which b's wait polls, make a's room only
/// when a needs it, in a's own step, on every run. They used to go to a's tracker at once,
/// so that a's next post found room and they showed in the poll step; or, in the runs where
/// b's wait had not polled them, in a's post step.
#[test]
fn completions_another_queue_polled_show_where_their_queue_waits_for_them() {
    let dir = scratch("selsig-cli-stash");
    // a, the first QP, is the one the soft NIC serves first: a's completions come before
    // b's, and b's wait for room polls them.
    let text = shared_cq_scenario(
        63,
        "depth = 4\npolicy = \"always\"",
        "depth = 4\npolicy = \"every:16\"",
        r#"[[step]]
post = { qp = "a", op = "write", local = "src", remote = "dst", size = 64, count = 4 }
[[step]]
post = { qp = "b", op = "write", local = "src", remote = "dst", size = 64, count = 8 }
[[step]]
post = { qp = "a", op = "write", local = "src", remote = "dst", size = 64, count = 4 }
[[step]]
poll = "idle"
[expect]
outcomes = { a = ["1-8 completed"], b = ["1-8 completed"] }
"#,
    );
    let path = dir.join("stash.toml");
    std::fs::write(&path, text).unwrap();
    let first = selsig(&["run", path.to_str().unwrap()]);
    assert_eq!(first.status.code(), Some(0), "{}", stderr(&first));
    let trace = stdout(&first);
    let (_, step3) = trace.split_once("\"n\":3,").unwrap();
    let (step3, step4) = step3.split_once("\"n\":4,").unwrap();
    for wr in 1..=4 {
        let cqe = format!("{{\"event\":\"cqe\",\"qp\":\"a\",\"wr_id\":{wr},");
        assert!(step3.contains(&cqe), "a's WRITE {wr} in step 3: {trace}");
        assert!(!step4.contains(&cqe), "{trace}");
    }
    for _ in 0..10 {
        let again = selsig(&["run", path.to_str().unwrap()]);
        assert_eq!(again.status.code(), Some(0), "{}", stderr(&again));
        assert!(stdout(&again) == trace, "the trace changed between runs");
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_confirm_on_a_full_shared_cq_polls_for_room() {
    let dir = scratch("selsig-cli-confirm");
    // b's twelve WRITEs take the last of the shared CQ's credits (its 12th is signaled for
    // it): a's confirm marker waits for b's completion.
    let text = a_confirm_behind_b("policy = \"never\"");
    let path = dir.join("confirm.toml");
    std::fs::write(&path, text).unwrap();
    let started = std::time::Instant::now();
    let o = selsig(&["run", path.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
    let out = stdout(&o);
    assert!(!out.contains("\"event\":\"refused\""), "{out}");
    assert!(
        out.contains("{\"event\":\"post\",\"qp\":\"a\",\"seq\":4,\"op\":\"rdma_write\",\"len\":0,\"signaled\":true,\"reason\":\"marker\",\"marker\":true}"),
        "{out}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn traces_are_identical_when_a_post_waits_for_room_on_a_shared_cq() {
    let dir = scratch("selsig-cli-race");
    // While a (depth 4) waits for room, b's thousand completions arrive on the same CQ,
    // as many before each of a's as the timing gives.
    let text = shared_cq_scenario(
        4096,
        "depth = 4\npolicy = \"always\"",
        "depth = 1024\npolicy = \"always\"",
        r#"[[step]]
post = { qp = "b", op = "write", local = "src", remote = "dst", size = 64, count = 1000, stride = 0 }
[[step]]
post = { qp = "a", op = "write", local = "src", remote = "dst", size = 64, count = 32 }
[[step]]
poll = "idle"
[expect]
outcomes = { a = ["1-32 completed"], b = ["1-1000 completed"] }
"#,
    );
    let path = dir.join("race.toml");
    std::fs::write(&path, text).unwrap();
    let first = selsig(&["run", path.to_str().unwrap()]);
    assert_eq!(first.status.code(), Some(0), "{}", stderr(&first));
    let trace = stdout(&first);
    // Runs take milliseconds; the old interleaving differed in about one run of four.
    for _ in 0..20 {
        let again = selsig(&["run", path.to_str().unwrap()]);
        assert_eq!(again.status.code(), Some(0), "{}", stderr(&again));
        assert!(stdout(&again) == trace, "the trace changed between runs");
    }
    // The post step shows a's posts and the completions of a's that made room; b's show
    // with the poll step.
    let (_, step2) = trace.split_once("\"n\":2,").unwrap();
    let (step2, _) = step2.split_once("\"n\":3,").unwrap();
    assert!(!step2.contains("\"qp\":\"b\""), "{step2}");
    assert_eq!(step2.matches("\"event\":\"cqe\"").count(), 28, "{step2}");
    std::fs::remove_dir_all(&dir).ok();
}

/// The sequence numbers each QP's send completions and retirements show, in trace order.
fn send_order(trace: &str) -> std::collections::BTreeMap<String, Vec<(String, u64)>> {
    let mut order = std::collections::BTreeMap::<String, Vec<(String, u64)>>::new();
    for line in trace.lines() {
        let v: Value = serde_json::from_str(line).unwrap();
        let (event, qp) = (v["event"].as_str().unwrap(), v["qp"].as_str());
        let seq = match event {
            "cqe" => v["wr_id"].as_u64(),
            "retire" => v["seq"].as_u64(),
            _ => None,
        };
        if let (Some(qp), Some(seq)) = (qp, seq) {
            order
                .entry(format!("{qp} {event}"))
                .or_default()
                .push((line.to_string(), seq));
        }
    }
    order
}

/// a waits for room with nothing signaled: it hands b's completions it polled to b (their
/// events wait for the next step that polls). When b then waits for room itself, b's
/// later completions must not show before those earlier ones.
#[test]
fn a_qps_completions_show_in_order_when_another_qp_handed_some_over() {
    let dir = scratch("selsig-cli-handed");
    let text = r#"description = "b's completions, some handed over by a's wait"
[[cq]]
name = "s"
size = 4
[[qp]]
name = "a"
send_cq = "s"
policy = "always"
[[qp]]
name = "b"
depth = 32
send_cq = "s"
policy = "always"
[[region]]
name = "src"
size = 1024
fill = "pattern"
[[region]]
name = "dst"
size = 1024
access = ["local_write", "remote_write"]
[[step]]
post = { qp = "b", op = "write", local = "src", remote = "dst", size = 8, count = 20 }
[[step]]
post = { qp = "a", op = "write", local = "src", remote = "dst", size = 8, count = 1 }
[[step]]
post = { qp = "b", op = "write", local = "src", remote = "dst", size = 8, count = 1 }
[[step]]
poll = "idle"
[expect]
outcomes = { a = ["1 completed"], b = ["1-21 completed"] }
"#;
    let path = dir.join("handed.toml");
    std::fs::write(&path, text).unwrap();
    for personality in ["mlx5", "rxe"] {
        let o = selsig(&["run", path.to_str().unwrap(), "--personality", personality]);
        assert_eq!(o.status.code(), Some(0), "{personality}: {}", stderr(&o));
        let trace = stdout(&o);
        let order = send_order(&trace);
        assert_eq!(order.len(), 4, "{order:?}");
        for (what, seqs) in order {
            for pair in seqs.windows(2) {
                assert!(
                    pair[0].1 < pair[1].1,
                    "{personality}: {what} out of order:\n{}\n{}",
                    pair[0].0,
                    pair[1].0
                );
            }
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// Receives refilled right after the SENDs that use them: the checker counts those SENDs,
/// but a receive keeps its slot until its completion is polled (mlx5), so the `recv` step
/// waits for room as a post does, polling the peer's CQ one completion at a time. Also
/// after `to_error`, where each receive is flushed: a hundred of them through a queue of
/// sixteen, whose CQ holds 63.
#[test]
fn a_recv_step_waits_for_room_and_gives_the_same_trace_every_run() {
    let dir = scratch("selsig-cli-recv-room");
    let refill = r#"description = "receives refilled right after the SENDs that use them"
[[qp]]
name = "a"
policy = "every:4"
[[step]]
recv = { qp = "a.peer", count = 16 }
[[step]]
post = { qp = "a", op = "send", count = 16 }
[[step]]
recv = { qp = "a.peer", count = 16 }
[[step]]
post = { qp = "a", op = "send", count = 16 }
[[step]]
poll = "idle"
[expect]
outcomes = { a = ["1-32 completed"] }
"#;
    let flushed = r#"description = "receives posted on a peer in the error state"
[[qp]]
name = "a"
[[step]]
to_error = "a.peer"
[[step]]
recv = { qp = "a.peer", count = 100 }
[[step]]
poll = "idle"
"#;
    for (name, text, recvs) in [("refill", refill, 32), ("flushed", flushed, 100)] {
        let path = dir.join(format!("{name}.toml"));
        std::fs::write(&path, text).unwrap();
        for personality in ["mlx5", "rxe"] {
            let run = || selsig(&["run", path.to_str().unwrap(), "--personality", personality]);
            let first = run();
            assert_eq!(
                first.status.code(),
                Some(0),
                "{name} {personality}: {}",
                stderr(&first)
            );
            let trace = stdout(&first);
            assert_eq!(
                trace.matches("\"event\":\"recv_post\"").count(),
                recvs,
                "{trace}"
            );
            for _ in 0..10 {
                let again = run();
                assert_eq!(
                    again.status.code(),
                    Some(0),
                    "{name} {personality}: {}",
                    stderr(&again)
                );
                assert!(
                    stdout(&again) == trace,
                    "{name} {personality}: the trace changed"
                );
            }
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// A scenario's `[device] personality` is the soft NIC's: with `--provider verbs` it is
/// ignored, as documented, not refused as if `--personality` had been given.
#[test]
fn a_scenarios_personality_is_ignored_by_the_verbs_provider() {
    let dir = scratch("selsig-cli-personality");
    let path = dir.join("rxe.toml");
    std::fs::write(
        &path,
        "description = \"personality rxe\"\n[device]\npersonality = \"rxe\"\n[[qp]]\nname = \"a\"\n\
         [[step]]\nconfirm = \"a\"\n[[step]]\npoll = \"idle\"\n",
    )
    .unwrap();
    // Without an RDMA device the run fails opening it (exit 1); with one it runs.
    let o = selsig(&["run", path.to_str().unwrap(), "--provider", "verbs"]);
    let err = stderr(&o);
    assert_ne!(o.status.code(), Some(2), "{err}");
    assert!(!err.contains("--personality"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

/// On the soft NIC a scenario's `[device] personality` is the NIC's personality when the
/// command line names none: rxe's expectations apply, and are met.
#[test]
fn a_scenarios_personality_chooses_the_soft_nics() {
    let dir = scratch("selsig-cli-own-personality");
    let path = dir.join("error-mid-own.toml");
    let text = std::fs::read_to_string(scenarios().join("error-mid.toml")).unwrap();
    assert!(!text.contains("[device]"));
    let text = text.replacen("[[qp]]", "[device]\npersonality = \"rxe\"\n\n[[qp]]", 1);
    std::fs::write(&path, text).unwrap();
    let o = selsig(&["run", "-q", path.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("the rxe expectations apply"),
        "{}",
        stderr(&o)
    );
    // The command line's personality wins.
    let o = selsig(&["run", "-q", path.to_str().unwrap(), "--personality", "mlx5"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(!stderr(&o).contains("rxe"), "{}", stderr(&o));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn the_trace_file_may_not_be_the_scenario() {
    let dir = scratch("selsig-cli-self");
    let seed = std::fs::read_to_string(scenarios().join("seed.toml")).unwrap();
    let path = dir.join("self.toml");
    std::fs::write(&path, &seed).unwrap();
    let link = dir.join("link.toml");
    std::os::unix::fs::symlink(&path, &link).unwrap();
    // A hard link: another path, the same file (written over in place where its folder
    // cannot take a temporary file).
    let hard = dir.join("hard.toml");
    std::fs::hard_link(&path, &hard).unwrap();
    let same = path.to_str().unwrap();
    let dotted = format!("{}/./self.toml", dir.display());
    for trace in [
        same,
        dotted.as_str(),
        link.to_str().unwrap(),
        hard.to_str().unwrap(),
    ] {
        let o = selsig(&["run", "-q", same, "--trace", trace]);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{trace}: {err}");
        assert!(
            err.contains(&format!("--trace {trace} names the scenario file {same}")),
            "{err}"
        );
        assert_eq!(std::fs::read_to_string(&path).unwrap(), seed, "{trace}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// `selsig run -` reads the scenario from standard input: the same trace as from the file,
/// errors named `<stdin>`, and a `--trace` naming the file fed to it refused.
#[test]
fn a_scenario_is_read_from_standard_input() {
    use std::process::Stdio;
    let dir = scratch("selsig-cli-stdin");
    let path = scenarios().join("seed.toml");
    let piped = |stdin: Stdio, extra: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_selsig"))
            .args(["run", "-"])
            .args(extra)
            .stdin(stdin)
            .output()
            .expect("the selsig binary runs")
    };
    let from_file = selsig(&["run", path.to_str().unwrap()]);
    assert_eq!(from_file.status.code(), Some(0), "{}", stderr(&from_file));
    let o = piped(std::fs::File::open(&path).unwrap().into(), &[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(stdout(&o), stdout(&from_file));
    assert!(stderr(&o).contains("scenario stdin: "), "{}", stderr(&o));
    // Through a pipe, as `generate | selsig run -`.
    let mut child = Command::new(env!("CARGO_BIN_EXE_selsig"))
        .args(["run", "-", "-q", "--trace", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(
        &mut child.stdin.take().unwrap(),
        std::fs::read_to_string(&path).unwrap().as_bytes(),
    )
    .unwrap();
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(stdout(&o), stdout(&from_file));
    // A malformed scenario: the error names standard input, with the line.
    let bad = dir.join("bad.toml");
    std::fs::write(&bad, "description = \"x\"\nbogus = 1\n").unwrap();
    let o = piped(std::fs::File::open(&bad).unwrap().into(), &[]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("<stdin>:2:"), "{}", stderr(&o));
    // `--trace` naming the file standard input comes from would overwrite it.
    let copy = dir.join("copy.toml");
    let seed = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&copy, &seed).unwrap();
    let o = piped(
        std::fs::File::open(&copy).unwrap().into(),
        &["-q", "--trace", copy.to_str().unwrap()],
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("names the scenario file <stdin>"),
        "{}",
        stderr(&o)
    );
    assert_eq!(std::fs::read_to_string(&copy).unwrap(), seed);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn fields_that_would_be_ignored_contradict_or_fail_later_are_refused() {
    let dir = scratch("selsig-cli-refused");
    let seed = std::fs::read_to_string(scenarios().join("seed.toml")).unwrap();
    let lines = seed.lines().count();
    let post = "op = \"write\", local = \"src\", remote = \"dst\", size = 64, count = 8";
    let then = |step: &str| {
        seed.replace(
            "poll = \"idle\"\n",
            &format!("poll = \"idle\"\n\n[[step]]\n{step}\n"),
        )
    };
    let mut wrong = Vec::new();
    for (name, text, line, problem) in [
        (
            "adaptive",
            seed.replace("policy = \"every:4\"", "policy = \"adaptive:100,2us\""),
            3,
            "an adaptive policy signals by the time work requests wait",
        ),
        (
            "overlapping-outcomes",
            seed.replace(
                "[\"1-8 completed\"]",
                "[\"1-8 flushed\", \"1-8 completed\"]",
            ),
            30,
            "\"1-8 completed\" and \"1-8 flushed\" overlap (work request 1 is in both)",
        ),
        (
            "poll-field",
            seed.replace("poll = \"idle\"", "poll = { cqes = 2, timeout = 5 }"),
            23,
            "unknown field `timeout`, expected `cqes`",
        ),
        (
            "poll-number",
            seed.replace("poll = \"idle\"", "poll = 2"),
            23,
            "expected \"idle\" or { cqes = N }",
        ),
        (
            "fault_at-alone",
            seed.replace(post, &format!("{post}, fault_at = 2")),
            19,
            "fault_at needs a fault",
        ),
        (
            "imm-on-write",
            seed.replace(post, &format!("{post}, imm = 5")),
            19,
            "imm: a write carries no immediate data",
        ),
        (
            "local_offset-without-region",
            seed.replace(post, "op = \"send\", count = 2, local_offset = 8"),
            19,
            "local_offset needs a local region",
        ),
        (
            "stride-without-region",
            seed.replace(post, "op = \"send\", count = 2, stride = 8"),
            19,
            "stride needs a local or remote region",
        ),
        (
            "remote_offset-on-send",
            seed.replace(
                post,
                "op = \"send\", local = \"src\", size = 8, remote_offset = 8",
            ),
            19,
            "remote_offset: a send has no remote region",
        ),
        (
            "recv-offset-without-region",
            then("recv = { qp = \"a.peer\", offset = 8 }"),
            25,
            "offset needs a region",
        ),
        (
            "differs-alone",
            format!("{seed}\n[differs]\nrxe = \"why\"\n"),
            lines + 2,
            "differs.rxe says why [expect.rxe] differs, but there is no [expect.rxe]",
        ),
        (
            "dereg-twice",
            then("dereg = \"dst\"\n\n[[step]]\ndereg = \"dst\""),
            28,
            "step 4: region \"dst\" was deregistered by step 3",
        ),
        (
            "inline-from-deregistered",
            then(
                "dereg = \"src\"\n\n[[step]]\npost = { qp = \"a\", op = \"write\", local = \"src\", \
                 remote = \"dst\", size = 8, inline = true }",
            ),
            28,
            "inline data from region \"src\", which step 3 deregistered",
        ),
        (
            "unknown-opcode",
            seed.replacen("opcode = \"rdma_write\"", "opcode = \"rdma_wirte\"", 1),
            27,
            "expect.cqes: unknown opcode \"rdma_wirte\"",
        ),
        (
            "unknown-event",
            format!("{seed}events = [\"qp_acess_err:a.peer\"]\n"),
            33,
            "unknown event type \"qp_acess_err\"",
        ),
        (
            "event-of-no-qp",
            format!("{seed}events = [\"qp_access_err:b\"]\n"),
            33,
            "no qp named \"b\"",
        ),
        (
            "receives-beyond-peer_depth",
            then("recv = { qp = \"a.peer\", count = 17 }"),
            25,
            "more would wait than its peer_depth of 16",
        ),
        (
            "personality",
            seed.replace("[[qp]]", "[device]\npersonality = \"bogus\"\n\n[[qp]]"),
            4,
            "unknown personality \"bogus\"",
        ),
    ] {
        let path = dir.join(format!("{name}.toml"));
        std::fs::write(&path, text).unwrap();
        let o = selsig(&["run", path.to_str().unwrap()]);
        let err = stderr(&o);
        let at = format!("error: {}:{line}:", path.display());
        let refused = o.status.code() == Some(2) && o.stdout.is_empty();
        if !refused || !err.starts_with(&at) || !err.contains(problem) {
            wrong.push(format!(
                "{name}: expected exit code 2, no trace and {at} ... {problem}, got {:?}: {err}",
                o.status.code()
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    std::fs::remove_dir_all(&dir).ok();
}

/// A legend holds as many sizes as its panel has room for, and says how many more there
/// are: it never runs into the next panel.
#[test]
fn bench_svg_legends_that_do_not_fit_say_how_many_more() {
    let sizes = "8,16,32,64,128,256,512,1K,2K,4K,8K,16K,32K,64K,128K,256K,512K,1M";
    let o = selsig(&["bench", "-n", "20", "-s", sizes, "-e", "1", "--svg", "-"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let texts = svg_texts(&stdout(&o));
    assert_eq!(
        texts.iter().filter(|t| *t == "+4 more").count(),
        3,
        "{texts:?}"
    );
    assert!(!texts.iter().any(|t| t == "128KiB"), "{texts:?}");
}

/// An edit of a scenario's text.
type Edit = fn(String) -> String;

/// Runs a variant of a shipped scenario (`edit` applied to its text) and returns the output.
fn run_variant(
    dir: &std::path::Path,
    base: &str,
    name: &str,
    edit: impl Fn(String) -> String,
    extra: &[&str],
) -> Output {
    let text = std::fs::read_to_string(scenarios().join(base)).unwrap();
    let changed = edit(text.clone());
    assert_ne!(changed, text, "{name}: the edit changed nothing");
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, changed).unwrap();
    let mut args = vec!["run", "-q", path.to_str().unwrap()];
    args.extend_from_slice(extra);
    selsig(&args)
}

/// Every field of every expected completion counts, and so do completions the list leaves
/// out: each mismatch fails the run with exit code 1, naming it.
#[test]
fn each_mismatch_of_an_expectation_fails_the_run() {
    let dir = scratch("selsig-cli-mismatch");
    let cases: [(&str, &str, Edit, &[&str], &str); 7] = [
        (
            // An extra completion, not in the list.
            "extra-cqe",
            "seed.toml",
            |t| {
                t.replace(
                    "  { qp = \"a\", wr_id = 8, status = \"success\", opcode = \"rdma_write\" },\n",
                    "",
                )
            },
            &[],
            "expected 1 completions, got 2",
        ),
        (
            // Outcomes of the right work requests, but not the right outcome.
            "wrong-outcome",
            "seed.toml",
            |t| t.replace("\"1-8 completed\"", "\"1-4 completed\", \"5-8 flushed\""),
            &[],
            "outcomes of a differ: 5: expected flushed got completed, 6: expected flushed \
             got completed, 7: expected flushed got completed, 8: expected flushed got \
             completed\n",
        ),
        (
            // Eight differences: the first five are listed.
            "eight-wrong-outcomes",
            "seed.toml",
            |t| t.replace("\"1-8 completed\"", "\"1-8 flushed\""),
            &[],
            "outcomes of a differ: 1: expected flushed got completed, 2: expected flushed \
             got completed, 3: expected flushed got completed, 4: expected flushed got \
             completed, 5: expected flushed got completed\n",
        ),
        (
            // An async event the run raised but the list does not name.
            "extra-event",
            "fault-no-access.toml",
            |t| t.replace("events = [\"qp_access_err:a.peer\"]", "events = []"),
            &["--personality", "mlx5"],
            "async events: expected [], got [\"qp_access_err:a.peer\"]",
        ),
        (
            // The right completion on the wrong QP (the peer's receive, named as the requester's).
            "wrong-qp",
            "mixed-ops.toml",
            |t| {
                t.replace(
                "{ qp = \"a.peer\", wr_id = 1, status = \"success\", opcode = \"recv\", byte_len = 32 }",
                "{ qp = \"a\", wr_id = 1, status = \"success\", opcode = \"recv\", byte_len = 32 }",
            )
            },
            &[],
            "completion 5: expected a wr_id 1 success recv byte_len 32, got a.peer wr_id 1",
        ),
        (
            "wrong-opcode",
            "seed.toml",
            |t| {
                t.replace(
                    "wr_id = 8, status = \"success\", opcode = \"rdma_write\"",
                    "wr_id = 8, status = \"success\", opcode = \"send\"",
                )
            },
            &[],
            "completion 2: expected a wr_id 8 success send, got a wr_id 8 success rdma_write",
        ),
        (
            "wrong-byte-len",
            "mixed-ops.toml",
            |t| {
                t.replace(
                    "opcode = \"recv\", byte_len = 32",
                    "opcode = \"recv\", byte_len = 33",
                )
            },
            &[],
            "completion 5: expected a.peer wr_id 1 success recv byte_len 33",
        ),
    ];
    for (name, base, edit, extra, problem) in cases {
        let o = run_variant(&dir, base, name, edit, extra);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{name}: {err}");
        assert!(
            err.contains(problem),
            "{name}: expected {problem:?} in {err}"
        );
    }
    // The status too (the opcode dropped: an error has none).
    let o = run_variant(
        &dir,
        "seed.toml",
        "wrong-status",
        |t| {
            t.replace(
                "wr_id = 8, status = \"success\", opcode = \"rdma_write\"",
                "wr_id = 8, status = \"wr_flush_err\"",
            )
        },
        &[],
    );
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("completion 2: expected a wr_id 8 wr_flush_err, got a wr_id 8 success"),
        "{}",
        stderr(&o)
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// A digest is compared in either case (it is hex); the trace gives it in lower case.
#[test]
fn an_upper_case_digest_is_met() {
    let dir = scratch("selsig-cli-digest-case");
    let o = run_variant(
        &dir,
        "seed.toml",
        "upper",
        |t| t.replace("1fb4b57231ed8584", "1FB4B57231ED8584"),
        &[],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    std::fs::remove_dir_all(&dir).ok();
}

/// [expect.rxe] replaces only the fields it gives: on rxe the others of [expect] still apply.
#[test]
fn rxe_expectations_keep_the_fields_they_do_not_replace() {
    let dir = scratch("selsig-cli-rxe-inherit");
    // fault-no-access.toml's [expect.rxe] gives only events.
    let o = run_variant(
        &dir,
        "fault-no-access.toml",
        "rxe-cqes",
        |t| {
            t.replace(
                "cqes = [{ qp = \"a\", wr_id = 1, status = \"rem_access_err\" }]",
                "cqes = [{ qp = \"a\", wr_id = 1, status = \"wr_flush_err\" }]",
            )
        },
        &["--personality", "rxe"],
    );
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("the rxe expectations apply"), "{err}");
    assert!(
        err.contains("completion 1: expected a wr_id 1 wr_flush_err, got a wr_id 1 rem_access_err"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// Canonical order: each completion is followed by the work requests it retired, and QPs
/// come in the order of the file, whichever CQ is polled first.
#[test]
fn traces_follow_the_documented_canonical_order() {
    let o = selsig(&["run", scenarios().join("seed.toml").to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let lines: Vec<serde_json::Value> = stdout(&o)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let at = |event: &str, key: &str, n: u64| {
        lines
            .iter()
            .position(|v| v["event"] == event && v[key] == n)
            .unwrap_or_else(|| panic!("no {event} {key} {n}: {}", stdout(&o)))
    };
    // CQE 4, retire 1-4, CQE 8, retire 5-8.
    assert!(
        at("cqe", "wr_id", 4) < at("retire", "seq", 1),
        "{}",
        stdout(&o)
    );
    assert!(
        at("retire", "seq", 4) < at("cqe", "wr_id", 8),
        "{}",
        stdout(&o)
    );
    assert!(
        at("cqe", "wr_id", 8) < at("retire", "seq", 5),
        "{}",
        stdout(&o)
    );

    // "b" reports to the first CQ declared, polled before "a"'s own: "a" still comes first.
    let dir = scratch("selsig-cli-qp-order");
    let text = r#"description = "b's CQ is polled first; the trace shows a first"
[[cq]]
name = "s"
size = 64
[[qp]]
name = "a"
policy = "always"
[[qp]]
name = "b"
policy = "always"
send_cq = "s"
[[region]]
name = "src"
size = 128
access = ["local_write"]
fill = "pattern"
[[region]]
name = "dst"
size = 128
access = ["local_write", "remote_write"]
[[step]]
post = { qp = "b", op = "write", local = "src", remote = "dst", size = 64 }
[[step]]
post = { qp = "a", op = "write", local = "src", remote = "dst", size = 64, local_offset = 64, remote_offset = 64 }
[[step]]
poll = "idle"
[expect]
cqes = [
  { qp = "a", wr_id = 1, status = "success" },
  { qp = "b", wr_id = 1, status = "success" },
]
"#;
    let path = dir.join("order.toml");
    std::fs::write(&path, text).unwrap();
    for _ in 0..3 {
        let o = selsig(&["run", "-q", path.to_str().unwrap()]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// Expectations and steps that name what the scenario lacks, or ask the impossible, are
/// bad input (exit code 2, naming the problem), refused before anything runs, not a failed
/// run (exit code 1) or a run that passes without checking them.
#[test]
fn expectations_and_steps_the_checker_refuses() {
    let dir = scratch("selsig-cli-refused");
    let cases: [(&str, Edit, &str); 8] = [
        (
            "remote-beyond-region",
            |t| {
                t.replace(
                    "size = 64, count = 8",
                    "size = 64, count = 8, remote_offset = 64",
                )
            },
            "the remote bytes end at 576, beyond region \"dst\" (512 bytes)",
        ),
        (
            "receives-beyond-region",
            |t| {
                t.replace(
                "[[step]]\npoll = \"idle\"",
                "[[step]]\nto_error = \"a.peer\"\n\n[[step]]\nrecv = { qp = \"a.peer\", region = \"dst\", size = 64, count = 9 }\n\n[[step]]\npoll = \"idle\"",
            )
            },
            "the receives end at 576, beyond region \"dst\" (512 bytes)",
        ),
        (
            "cqe-of-an-unknown-qp",
            |t| t.replace("{ qp = \"a\", wr_id = 8,", "{ qp = \"b\", wr_id = 8,"),
            "expect.cqes: no qp named \"b\"",
        ),
        (
            "outcomes-of-an-unknown-qp",
            |t| t.replace("outcomes = { a = [", "outcomes = { b = ["),
            "expect.outcomes: no qp named \"b\"",
        ),
        (
            "overlapping-outcomes",
            |t| t.replace("\"1-8 completed\"", "\"1-4 completed\", \"4-8 completed\""),
            "\"1-4 completed\" and \"4-8 completed\" overlap (work request 4 is in both)",
        ),
        (
            "outcome-of-work-request-0",
            |t| t.replace("\"1-8 completed\"", "\"0-8 completed\""),
            "\"0-8 completed\" is not like",
        ),
        (
            "expect-rxe-without-differs",
            |t| t + "\n[expect.rxe]\noutcomes = {}\n",
            "[expect.rxe] needs differs.rxe to say why rxe differs",
        ),
        (
            "fault-at-beyond-the-count",
            |t| {
                t.replace(
                    "size = 64, count = 8",
                    "size = 64, count = 8, fault = \"bad_rkey\", fault_at = 9",
                )
            },
            "fault_at 9 names no work request of the 8",
        ),
    ];
    let seed = std::fs::read_to_string(scenarios().join("seed.toml")).unwrap();
    for (name, edit, problem) in cases {
        let text = edit(seed.clone());
        assert_ne!(text, seed, "{name}: the edit changed nothing");
        let path = dir.join(format!("{name}.toml"));
        std::fs::write(&path, text).unwrap();
        let o = selsig(&["run", "-q", path.to_str().unwrap()]);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{name}: {err}");
        assert!(
            err.contains(problem),
            "{name}: expected {problem:?} in {err}"
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// A SEND that fails on a bad local key uses no receive (nor do the SENDs after it): a poll
/// until idle that would wait for the receive it left is refused (exit code 2) at once.
#[test]
fn a_send_with_a_bad_local_key_uses_no_receive() {
    let dir = scratch("selsig-cli-bad-lkey-send");
    let text = r#"description = "two receives, two SENDs, the second with a bad local key"
[[qp]]
name = "a"
[[region]]
name = "src"
size = 128
access = ["local_write"]
fill = "pattern"
[[region]]
name = "inbox"
size = 128
access = ["local_write"]
[[step]]
recv = { qp = "a.peer", region = "inbox", size = 64, count = 2 }
[[step]]
post = { qp = "a", op = "send", local = "src", size = 64, count = 2, fault = "bad_lkey", fault_at = 2 }
[[step]]
poll = "idle"
"#;
    let path = dir.join("bad-lkey-send.toml");
    std::fs::write(&path, text).unwrap();
    let started = std::time::Instant::now();
    let o = selsig(&["run", "-q", path.to_str().unwrap()]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("1 of the 2 receives posted on \"a.peer\" are used by no SEND"),
        "{err}"
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
    std::fs::remove_dir_all(&dir).ok();
}

/// A `--trace` (or bench output) file that is where standard output or error was sent
/// (`--trace /dev/stdout >> log`) gets its text where that stream writes, appended after
/// what the file held: replacing the file would lose its content, and the stream would go
/// on writing to a file with no name. `--trace -` is standard output, even with `-q`.
#[test]
fn an_output_file_that_is_standard_output_or_error_is_appended_to_not_replaced() {
    let dir = scratch("selsig-cli-std-stream");
    let seed = scenarios().join("seed.toml");
    let seed = seed.to_str().unwrap();
    let whole = selsig(&["run", seed]);
    assert!(whole.status.success(), "{}", stderr(&whole));
    let trace = stdout(&whole);
    assert!(trace.contains("\"wr_id\":8"), "{trace}");
    let log = dir.join("app.log");
    let appending = || {
        std::fs::write(&log, "earlier line\n").unwrap();
        std::fs::OpenOptions::new().append(true).open(&log).unwrap()
    };
    let summary = "scenario seed: expectations met";
    for (stream, to_stdout) in [("/dev/stdout", true), ("/dev/stderr", false)] {
        let mut command = Command::new(env!("CARGO_BIN_EXE_selsig"));
        command.args(["run", "-q", seed, "--trace", stream]);
        let o = match to_stdout {
            true => command.stdout(appending()).output().unwrap(),
            false => command.stderr(appending()).output().unwrap(),
        };
        assert!(o.status.success(), "{stream}: {}", stderr(&o));
        let got = std::fs::read_to_string(&log).unwrap();
        let want = match to_stdout {
            true => format!("earlier line\n{trace}"),
            false => format!("earlier line\n{trace}{summary}"),
        };
        assert!(got.starts_with(&want), "{stream}: {got}");
        assert!(got.contains(summary) != to_stdout, "{stream}: {got}");
    }
    // bench: its JSON to the file standard error was sent to.
    let o = Command::new(env!("CARGO_BIN_EXE_selsig"))
        .args([
            "bench",
            "-s",
            "64",
            "-e",
            "8",
            "-n",
            "2000",
            "--json",
            "/dev/stderr",
        ])
        .stderr(appending())
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{}",
        std::fs::read_to_string(&log).unwrap()
    );
    let got = std::fs::read_to_string(&log).unwrap();
    assert!(got.starts_with("earlier line\n{"), "{got}");
    assert!(got.contains("\"points\""), "{got}");
    // `--trace -`: standard output, also when quiet; no file named `-`.
    let o = Command::new(env!("CARGO_BIN_EXE_selsig"))
        .args(["run", "-q", seed, "--trace", "-"])
        .current_dir(&dir)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), trace);
    assert!(stderr(&o).contains(summary), "{}", stderr(&o));
    assert!(!dir.join("-").exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `--from-json` runs nothing: it prints the table a run printed, draws the chart it drew,
/// and writes its report again, from the report alone (standard input too).
#[test]
fn bench_from_json_shows_a_past_run_as_the_run_did() {
    let dir = scratch("bench-from-json");
    let (json, svg) = (dir.join("run.json"), dir.join("run.svg"));
    let run = small_sweep(&json, &svg);
    assert!(run.status.success(), "{}", stderr(&run));
    let table = stdout(&run);
    assert!(table.contains("adaptive:"), "{table}");

    let again = selsig(&["bench", "--from-json", json.to_str().unwrap()]);
    assert!(again.status.success(), "{}", stderr(&again));
    assert_eq!(stdout(&again), table);

    let redrawn = dir.join("again.svg");
    let o = selsig(&[
        "bench",
        "--from-json",
        json.to_str().unwrap(),
        "--svg",
        redrawn.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        std::fs::read_to_string(&redrawn).unwrap(),
        std::fs::read_to_string(&svg).unwrap()
    );

    let report = std::fs::read_to_string(&json).unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_selsig"))
        .args(["bench", "--from-json", "-", "--json", "-"])
        .stdin(std::fs::File::open(&json).unwrap())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        stdout(&o),
        report,
        "the report, written again byte for byte"
    );
}

/// A report that cannot be shown is refused with the file and what is wrong, and no
/// output file is created; `--from-json` with an option of a run is refused too.
#[test]
fn bench_from_json_refuses_what_is_not_a_report() {
    let dir = scratch("bench-from-json-bad");
    let good = bench_json(&["-n", "100", "-s", "64", "-e", "1"]);
    let cases: Vec<(&str, String, &str)> = vec![
        ("missing.json", String::new(), "cannot read the report"),
        (
            "text.json",
            "size,signal\n64,every:1\n".into(),
            "not a report of `selsig bench --json`",
        ),
        (
            "nopoints.json",
            {
                let mut v = good.clone();
                v["points"] = Value::Array(vec![]);
                v.to_string()
            },
            "the report has no points",
        ),
        (
            "negative.json",
            {
                let mut v = good.clone();
                v["points"][0]["wr_per_sec"] = Value::from(-1.5);
                v.to_string()
            },
            "points[0].wr_per_sec (64, every:1) is -1.5",
        ),
        (
            "nolag.json",
            {
                let mut v = good.clone();
                v["points"][0].as_object_mut().unwrap().remove("wrs");
                v.to_string()
            },
            "missing field `wrs`",
        ),
    ];
    for (name, text, why) in cases {
        let path = dir.join(name);
        if !text.is_empty() {
            std::fs::write(&path, text).unwrap();
        }
        let svg = dir.join(format!("{name}.svg"));
        let o = selsig(&[
            "bench",
            "--from-json",
            path.to_str().unwrap(),
            "--svg",
            svg.to_str().unwrap(),
        ]);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{name}: {err}");
        assert!(
            err.contains(&format!("--from-json {}: ", path.display())) && err.contains(why),
            "{name}: {err}"
        );
        assert!(!err.contains("panicked"), "{name}: {err}");
        assert!(!svg.exists(), "{name}: no chart is drawn");
    }
    let path = dir.join("good.json");
    std::fs::write(&path, good.to_string()).unwrap();
    for run_option in [&["-e", "4"][..], &["-n", "10"], &["--provider", "verbs"]] {
        let mut args = vec!["bench", "--from-json", path.to_str().unwrap()];
        args.extend_from_slice(run_option);
        let o = selsig(&args);
        assert_eq!(o.status.code(), Some(2), "{run_option:?}");
        assert!(
            stderr(&o).contains("cannot be used with"),
            "{run_option:?}: {}",
            stderr(&o)
        );
    }
}

/// `selsig run --connect` refuses, before it opens a device or connects, a provider that
/// cannot reach another process and a scenario a remote side cannot hold, naming why.
#[test]
fn run_connect_refuses_what_a_remote_side_cannot_run() {
    let root = scenarios();
    let seed = root.join("seed.toml");
    let o = selsig(&["run", seed.to_str().unwrap(), "--connect", "127.0.0.1:9"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("--connect 127.0.0.1:9: needs --provider verbs"),
        "{}",
        stderr(&o)
    );
    for (file, why) in [
        ("atomics.toml", "it has 2 queue pairs"),
        ("fault-wrong-pd.toml", "protection domain"),
    ] {
        let path = root.join(file);
        let o = selsig(&[
            "run",
            path.to_str().unwrap(),
            "--provider",
            "verbs",
            "--connect",
            "127.0.0.1:9",
        ]);
        assert_eq!(o.status.code(), Some(2), "{file}: {}", stderr(&o));
        let err = stderr(&o);
        assert!(
            err.contains("cannot run with a remote side") && err.contains(why),
            "{file}: {err}"
        );
        // Refused before anything: no trace, no device opened.
        assert!(
            stdout(&o).is_empty() && !err.contains("libibverbs"),
            "{err}"
        );
    }
    // --cm without --connect is a usage error.
    let o = selsig(&["run", seed.to_str().unwrap(), "--cm", "rdma"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
}
