//! The `selsig` command on a real RDMA device (in CI: the kernel's Soft-RoCE `rxe0` in the
//! VM of `scripts/verbs-tests.sh`): the demo, two processes through `serve`/`--connect`,
//! every shipped scenario, whose canonical trace must be the same as on the software
//! NIC's rxe personality, and `bench` (its accounting, and its perftest mode).
//!
//! Every test needs a device, so every test is `#[ignore]`d with the reason; the script
//! runs them with `--ignored`.

use std::io::{BufRead as _, BufReader, Read as _};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStderr, Command, Output, Stdio};

use serde_json::Value;

fn selsig(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_selsig"))
        .args(args)
        .env("SELSIG_SECRET", SECRET)
        .output()
        .expect("the selsig binary runs")
}

/// The secret every `selsig serve` of these tests takes, and every client proves it
/// knows (both from `SELSIG_SECRET`).
const SECRET: &str = "5e15e15e15e15e15e15e15e15e15e15e15e15e15e15e15e15e15e15e15e15e15";

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// `-x N` when `SELSIG_GID_INDEX` names a GID index.
fn gid() -> Vec<String> {
    std::env::var("SELSIG_GID_INDEX").map_or_else(|_| Vec::new(), |g| vec!["-x".to_string(), g])
}

fn verbs(args: &[&str]) -> Output {
    let mut all: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    all.extend(["--provider".to_string(), "verbs".to_string()]);
    all.extend(gid());
    let refs: Vec<&str> = all.iter().map(String::as_str).collect();
    selsig(&refs)
}

/// `-i` (perftest's `--ib-port`) picks the device's port: 1 runs, a port the device does
/// not have is bad input, named.
#[test]
#[ignore = "needs an RDMA device: run scripts/verbs-tests.sh (Soft-RoCE in a VM)"]
fn the_ib_port_is_the_devices_port() {
    let o = verbs(&["demo", "-i", "1", "--json"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let o = verbs(&["demo", "--ib-port", "2"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("has no port 2"),
        "{}",
        text(&o.stderr)
    );
}

#[test]
#[ignore = "needs an RDMA device: run scripts/verbs-tests.sh (Soft-RoCE in a VM)"]
fn demo_on_the_device_shows_only_cqe4_and_cqe8() {
    let o = verbs(&["demo", "--json"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["provider"], "verbs");
    let wrs: Vec<u64> = v["cqes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["wr"].as_u64().unwrap())
        .collect();
    assert_eq!(wrs, [4, 8]);
    assert_eq!(v["remote_verified"], true);
    let o = verbs(&["demo", "--fail-at", "3", "--json"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
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
    let mut expected = vec![(3, "rem_access_err".to_string())];
    expected.extend((4..=8).map(|w| (w, "wr_flush_err".to_string())));
    assert_eq!(cqes, expected, "one flush completion per remaining WRITE");
    assert_eq!(v["remote_verified"], true);
    // A GID index the port does not have is a bad option (exit code 2), named.
    let o = selsig(&["demo", "--provider", "verbs", "-x", "255"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains("GID"), "{}", text(&o.stderr));
    // So is a device name the host does not have; the message lists the ones it has.
    let o = selsig(&["demo", "--provider", "verbs", "-d", "no-such-device"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("no RDMA device named \"no-such-device\"; found: rxe0"),
        "{}",
        text(&o.stderr)
    );
}

/// Starts `selsig serve` on `port` (with `extra` options) and gives its HOST:PORT.
/// A `selsig serve` process, listening.
struct Server {
    child: Child,
    stderr: BufReader<ChildStderr>,
    /// What it printed before listening.
    log: String,
}

impl Server {
    /// Ends it (if it has not ended) and returns its exit status and everything it printed.
    fn finish(mut self, kill: bool) -> (std::process::ExitStatus, String) {
        if kill {
            let _ = self.child.kill();
        }
        let status = self.child.wait().expect("selsig serve ends");
        let mut log = self.log;
        self.stderr.read_to_string(&mut log).unwrap();
        (status, log)
    }
}

/// Starts `selsig serve` and waits until it listens (it can take seconds to start in an
/// emulated VM: a client started earlier finds nobody, and a `--once` server then waits
/// for ever).
fn serve(port: &str, extra: &[&str]) -> (Server, String) {
    let address = std::env::var("SELSIG_SERVE_ADDR").unwrap_or_else(|_| "127.0.0.1".to_string());
    let mut args = vec!["serve", "--port", port, "--provider", "verbs"];
    args.extend_from_slice(extra);
    let g = gid();
    args.extend(g.iter().map(String::as_str));
    let mut child = Command::new(env!("CARGO_BIN_EXE_selsig"))
        .args(&args)
        .env("SELSIG_SECRET", SECRET)
        .stderr(Stdio::piped())
        .spawn()
        .expect("selsig serve starts");
    let mut stderr = BufReader::new(child.stderr.take().expect("piped"));
    let mut log = String::new();
    // Ends at the listening line, or at the end of its output if it failed to start.
    while stderr.read_line(&mut log).unwrap() > 0 && !log.contains("listening") {}
    assert!(
        log.contains("listening"),
        "selsig serve did not start: {log}"
    );
    (Server { child, stderr, log }, format!("{address}:{port}"))
}

#[test]
#[ignore = "needs an RDMA device: run scripts/verbs-tests.sh (Soft-RoCE in a VM)"]
fn two_processes_serve_and_connect() {
    let (server, target) = serve("18631", &["--once"]);
    let o = verbs(&["demo", "--connect", &target, "--wrs", "12", "--json"]);
    // A client that failed leaves a `--once` server waiting: it is stopped.
    let (status, log) = server.finish(!o.status.success());
    assert!(o.status.success(), "client: {}", text(&o.stderr));
    assert!(status.success(), "the server's check failed: {log}");
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["remote_verified"], true);
    assert!(v["target"].as_str().unwrap().contains("18631"));
    assert_eq!(v["summary"]["completed"], 12);
}

/// A client that does not know the server's secret is refused, and says so; with
/// `--insecure`, a server lets it in.
#[test]
#[ignore = "needs an RDMA device: run scripts/verbs-tests.sh (Soft-RoCE in a VM)"]
fn a_client_without_the_secret_is_refused_and_an_insecure_server_lets_it_in() {
    let (server, target) = serve("18632", &["--once"]);
    let mut args = vec!["demo", "--connect", &target, "--provider", "verbs"];
    let g = gid();
    args.extend(g.iter().map(String::as_str));
    let o = Command::new(env!("CARGO_BIN_EXE_selsig"))
        .args(&args)
        .env_remove("SELSIG_SECRET")
        .output()
        .unwrap();
    let (status, log) = server.finish(false);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("lets in only clients that know its secret: give this client the secret"),
        "{err}"
    );
    assert!(
        !status.success(),
        "a --once server whose session failed: {log}"
    );
    assert!(
        log.contains("the peer closed the connection before the client's proof"),
        "{log}"
    );
    // With --insecure, no secret is asked for.
    let (server, target) = serve("18633", &["--once", "--insecure"]);
    let o = Command::new(env!("CARGO_BIN_EXE_selsig"))
        .args(&args[..1])
        .args(["--connect", &target, "--provider", "verbs"])
        .args(&g)
        .env_remove("SELSIG_SECRET")
        .output()
        .unwrap();
    let (status, log) = server.finish(!o.status.success());
    assert!(o.status.success(), "client: {}", text(&o.stderr));
    assert!(status.success(), "{log}");
    assert!(
        log.contains("--insecure: every client that reaches"),
        "{log}"
    );
}

/// `--bind` naming an address this host does not have is a bad option (exit 2), found
/// when the server, its device open, tries to listen.
#[test]
#[ignore = "needs an RDMA device: run scripts/verbs-tests.sh (Soft-RoCE in a VM)"]
fn serve_refuses_an_address_this_host_does_not_have() {
    let o = verbs(&["serve", "--bind", "10.255.255.1", "--once"]);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--bind names an address this host does not have"),
        "{err}"
    );
}

#[test]
#[ignore = "needs an RDMA device: run scripts/verbs-tests.sh (Soft-RoCE in a VM)"]
fn bench_writes_into_serve_and_the_server_checks_the_bytes() {
    let (server, target) = serve("18632", &[]);
    // A sweep (every slot written), a run shorter than the queue (only some slots written:
    // the others must stay untouched), and perftest mode (not checked: one page rewritten).
    let sweep = verbs(&[
        "bench",
        "--connect",
        &target,
        "-n",
        "2000",
        "-s",
        "64,4K",
        "-e",
        "1,16",
        "--json",
        "-",
    ]);
    let short = verbs(&[
        "bench",
        "--connect",
        &target,
        "-n",
        "50",
        "-s",
        "64",
        "-e",
        "1",
    ]);
    let perftest = verbs(&[
        "bench",
        "--connect",
        &target,
        "--cq-mod",
        "16",
        "-s",
        "64",
        "-n",
        "1000",
    ]);
    let (_, log) = server.finish(true);
    for (name, o) in [
        ("sweep", &sweep),
        ("short", &short),
        ("perftest", &perftest),
    ] {
        assert!(
            o.status.success(),
            "{name}: {}\nserver: {log}",
            text(&o.stderr)
        );
    }
    let v: Value = serde_json::from_slice(&sweep.stdout).unwrap();
    assert_eq!(v["points"].as_array().unwrap().len(), 4);
    assert_eq!(v["settings"]["remote"], target.as_str());
    // The verbs provider records no NIC times, and the settings say so.
    assert_eq!(v["settings"]["nic_times"], false);
    assert!(text(&short.stdout).contains("-> selsig serve at"));
    // Warm-up and four points, warm-up and one point: every one checked and found right;
    // perftest mode's session ends unchecked.
    assert_eq!(
        log.matches("slots checked (each holds the last WRITE to it), memory as the outcomes say")
            .count(),
        7,
        "{log}"
    );
    assert_eq!(log.matches("nothing to check").count(), 1, "{log}");
    assert!(
        !log.contains("mismatches") && !log.contains("error"),
        "{log}"
    );
}

fn scenarios() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios");
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    files.sort();
    files
}

#[test]
#[ignore = "needs an RDMA device: run scripts/verbs-tests.sh (Soft-RoCE in a VM)"]
fn every_scenario_gives_the_soft_rxe_trace_on_the_device() {
    let files = scenarios();
    assert!(files.len() >= 9);
    for f in &files {
        let path = f.to_str().unwrap();
        let hw = verbs(&["run", path]);
        // A device cannot be made to fail on purpose through verbs: the step says so.
        if std::fs::read_to_string(f)
            .unwrap()
            .contains("device_fatal = true")
        {
            assert_eq!(hw.status.code(), Some(1), "{path}: {}", text(&hw.stderr));
            assert!(
                text(&hw.stderr).contains("device_fatal needs the software NIC"),
                "{path}: {}",
                text(&hw.stderr)
            );
            continue;
        }
        assert!(hw.status.success(), "{path} on verbs: {}", text(&hw.stderr));
        let soft = selsig(&["run", path, "--personality", "rxe"]);
        assert!(
            soft.status.success(),
            "{path} on soft rxe: {}",
            text(&soft.stderr)
        );
        assert_eq!(
            text(&hw.stdout),
            text(&soft.stdout),
            "{path}: the trace on the device differs from the soft NIC's rxe personality"
        );
        // Posted through ibv_wr_* instead of ibv_post_send: the same trace (but where the
        // scenario posts batches, whose refusals differ by design, or names its API).
        let file = std::fs::read_to_string(f).unwrap();
        if file.contains("batch = true") || file.contains("post_api") {
            continue;
        }
        let extended = verbs(&["run", path, "--post-api", "extended"]);
        assert!(
            extended.status.success(),
            "{path} on verbs, extended: {}",
            text(&extended.stderr)
        );
        assert_eq!(
            text(&extended.stdout),
            text(&soft.stdout),
            "{path}: the trace through the extended post API differs"
        );
    }
}

/// Every shipped scenario a remote side can hold, run with `selsig serve` as its remote
/// side over both connection managers, gives the soft NIC's rxe trace (the region's
/// digest the server's); the server sent a digest for every session and saw no error.
#[test]
#[ignore = "needs an RDMA device: run scripts/verbs-tests.sh (Soft-RoCE in a VM)"]
fn scenarios_with_serve_as_their_remote_side_trace_as_on_one_host() {
    let (server, target) = serve("18651", &[]);
    let mut runs = 0;
    for f in scenarios() {
        let scenario = selsig_scenario::load(&f).unwrap();
        if scenario.remote_region().is_err() {
            continue;
        }
        let path = f.to_str().unwrap();
        let soft = selsig(&["run", path, "--personality", "rxe"]);
        assert!(soft.status.success(), "{path}: {}", text(&soft.stderr));
        for cm in ["tcp", "rdma"] {
            let far = verbs(&["run", path, "--connect", &target, "--cm", cm]);
            runs += 1;
            assert!(
                far.status.success(),
                "{path} --cm {cm}: {}",
                text(&far.stderr)
            );
            assert_eq!(
                text(&far.stdout),
                text(&soft.stdout),
                "{path} --cm {cm}: the trace with a remote side differs from one host's"
            );
            assert!(
                text(&far.stderr).contains(&format!("are selsig serve's, rxe0 at {target}")),
                "{path} --cm {cm}: {}",
                text(&far.stderr)
            );
        }
    }
    let (_, log) = server.finish(true);
    assert!(runs >= 20, "{runs} runs");
    assert_eq!(log.matches(": the digest of its ").count(), runs, "{log}");
    assert!(!log.contains("error"), "{log}");
}

#[test]
#[ignore = "needs an RDMA device: run scripts/verbs-tests.sh (Soft-RoCE in a VM)"]
fn bench_on_the_device_counts_completions_and_prints_perftest_figures() {
    let o = verbs(&[
        "bench",
        "-n",
        "1000",
        "-s",
        "64,4K",
        "-e",
        "1,64,adaptive",
        "--json",
        "-",
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["provider"], "verbs");
    let points = v["points"].as_array().unwrap();
    assert_eq!(points.len(), 6);
    for p in points {
        assert_eq!(p["wrs"], 1000, "{p}");
        if let Some(n) = p["interval"].as_u64() {
            assert_eq!(
                p["cqes"].as_u64(),
                Some(1000 / n + u64::from(1000 % n != 0)),
                "{p}"
            );
        }
        assert_eq!(p["lag"]["count"], 1000, "{p}");
        assert!(
            p["nic_to_app"].is_null(),
            "a real NIC tells nothing of unsignaled WRs: {p}"
        );
    }
    assert!(v["memcpy"].as_array().unwrap().is_empty());

    let o = verbs(&["bench", "--cq-mod", "100", "-s", "4096", "-n", "2000"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    let row = out
        .lines()
        .find(|l| l.split_whitespace().take(2).eq(["4096", "2000"]))
        .unwrap_or_else(|| panic!("a perftest row: {out}"));
    // ib_write_bw's columns: #bytes, #iterations, BW peak (0.00: not measured), BW average.
    let mib: f64 = row.split_whitespace().nth(3).unwrap().parse().unwrap();
    assert!(mib > 0.0, "{row}");
}

/// `--qp` on the device: three queue pairs on one CQ, `-n` WRITEs each, each completed and
/// in its own peer's memory (the bench checks each peer's bytes after the run), and the
/// perftest row of 3 × `-n` iterations.
#[test]
#[ignore = "needs an RDMA device: run scripts/verbs-tests.sh (Soft-RoCE in a VM)"]
fn bench_on_the_device_runs_several_queue_pairs() {
    let o = verbs(&[
        "bench", "--cq-mod", "10", "-s", "4096", "-n", "200", "-q", "3", "--json", "-",
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let p = &v["points"][0];
    assert_eq!(p["wrs"], 600, "{p}");
    assert_eq!(p["wrs_per_qp"], serde_json::json!([200, 200, 200]), "{p}");
    assert_eq!(
        (p["cqes"].as_u64(), p["forced"].as_u64()),
        (Some(60), Some(0))
    );
    assert_eq!(v["settings"]["qps"], 3);

    let o = verbs(&[
        "bench", "--cq-mod", "10", "-s", "64", "-n", "100", "-q", "2",
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    assert!(
        out.lines()
            .any(|l| l.starts_with(" 64         200              0.00  ")),
        "a perftest row of 2 x 100 iterations: {out}"
    );
}

/// `--cm rdma`: the same sessions, the queue pairs connected through rdma_cm (librdmacm,
/// on 10.77.0.1 in the VM: rdma_cm does not route 127.0.0.1). The seed demo, the bad rkey
/// on WRITE 3, then a short bench: every session checked by the server, which sees each
/// client disconnect.
#[test]
#[ignore = "needs an RDMA device: run scripts/verbs-tests.sh (Soft-RoCE in a VM)"]
fn cm_rdma_demo_bad_rkey_and_bench_through_serve() {
    let (server, target) = serve("18641", &[]);
    let seed = verbs(&["demo", "--connect", &target, "--cm", "rdma", "--json"]);
    let bad = verbs(&[
        "demo",
        "--connect",
        &target,
        "--cm",
        "rdma",
        "--fail-at",
        "3",
        "--json",
    ]);
    let bench = verbs(&[
        "bench",
        "--connect",
        &target,
        "--cm",
        "rdma",
        "-n",
        "200",
        "-s",
        "64",
        "-e",
        "4",
    ]);
    let (_, log) = server.finish(true);
    for (name, o) in [("seed", &seed), ("bad rkey", &bad), ("bench", &bench)] {
        assert!(
            o.status.success(),
            "{name}: {}\nserver: {log}",
            text(&o.stderr)
        );
    }
    let v: Value = serde_json::from_slice(&seed.stdout).unwrap();
    assert_eq!(v["remote_verified"], true);
    assert_eq!(v["summary"]["completed"], 8);
    assert_eq!(v["summary"]["cqes"], 2);
    let v: Value = serde_json::from_slice(&bad.stdout).unwrap();
    assert_eq!(v["remote_verified"], true);
    assert_eq!(
        (
            &v["summary"]["completed"],
            &v["summary"]["failed"],
            &v["summary"]["flushed"]
        ),
        (&Value::from(2), &Value::from(1), &Value::from(5)),
        "{v}"
    );
    assert!(text(&bench.stdout).contains("-> selsig serve at"));
    // Seed, bad rkey, the bench's warm-up and its point: each connected, checked and
    // disconnected through rdma_cm.
    assert_eq!(
        log.matches("rdma_cm connection established").count(),
        4,
        "{log}"
    );
    assert_eq!(
        log.matches("rdma_cm connection closed (RDMA_CM_EVENT_DISCONNECTED)")
            .count(),
        4,
        "{log}"
    );
    assert_eq!(
        log.matches("memory as the outcomes say").count(),
        4,
        "{log}"
    );
    assert!(!log.contains("error"), "{log}");
}

/// A `--cm rdma` client whose server's address rdma_cm cannot reach (127.0.0.1: no RDMA
/// device routes it in the VM) fails, named, exit code 1, and the server goes on serving.
#[test]
#[ignore = "needs an RDMA device: run scripts/verbs-tests.sh (Soft-RoCE in a VM)"]
fn cm_rdma_to_an_address_rdma_cm_cannot_reach_is_named() {
    let (server, target) = serve("18642", &[]);
    let o = verbs(&["demo", "--connect", "127.0.0.1:18642", "--cm", "rdma"]);
    let err = text(&o.stderr);
    // The same server, reached where rdma_cm routes: served, once it saw the first client
    // go (it looks every 200 ms while it waits for a connection request).
    let mut ok = verbs(&["demo", "--connect", &target, "--cm", "rdma", "--wrs", "2"]);
    for _ in 0..20 {
        if !text(&ok.stderr).contains("busy: this server serves one client at a time") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(250));
        ok = verbs(&["demo", "--connect", &target, "--cm", "rdma", "--wrs", "2"]);
    }
    let (_, log) = server.finish(true);
    assert_eq!(o.status.code(), Some(1), "{err}\nserver: {log}");
    // (Linux 6.1: the route's resolution fails, ENODEV.)
    assert!(
        err.contains("through rdma_cm (127.0.0.1:")
            && (err.contains("RDMA_CM_EVENT_ROUTE_ERROR")
                || err.contains("RDMA_CM_EVENT_ADDR_ERROR")),
        "{err}"
    );
    assert!(ok.status.success(), "{}\nserver: {log}", text(&ok.stderr));
    assert!(
        log.contains(
            "error: the client closed the connection before its rdma_cm connection request"
        ),
        "{log}"
    );
}

/// The TCP half of a `--cm rdma` session, as a client does it: hello, proof; the server's
/// rendezvous.
fn rendezvous(target: &str) -> (std::net::TcpStream, selsig_cli::handshake::Rendezvous) {
    use selsig_cli::handshake::{Hello, PROTOCOL, Reply, Secret, Wire, proof};
    use std::io::Write as _;
    let mut stream = std::net::TcpStream::connect(target).unwrap();
    let hello = serde_json::to_string(&Hello {
        version: PROTOCOL,
        qp: Wire {
            qp_num: 1,
            psn: 1,
            lid: 0,
            gid: "0".repeat(32),
            mtu: 0,
            rd_atomic: 0,
        },
        wrs: 1,
        size: 64,
        run_s: 0,
        rdma_cm: true,
    })
    .unwrap();
    writeln!(stream, "{hello}").unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    let Reply::Challenge(c) = serde_json::from_str(&line).unwrap() else {
        panic!("no challenge: {line}");
    };
    let secret = Secret::parse(SECRET).unwrap();
    let p = proof(&secret, &c.challenge, hello.as_bytes()).unwrap();
    writeln!(stream, "{}", serde_json::to_string(&p).unwrap()).unwrap();
    line.clear();
    reader.read_line(&mut line).unwrap();
    let Reply::Rendezvous(r) = serde_json::from_str(&line).unwrap() else {
        panic!("no rendezvous: {line}");
    };
    (stream, r)
}

/// A queue pair of its own on the VM's device, for a test that speaks rdma_cm itself.
fn own_qp() -> (
    selsig_verbs::VerbsDevice,
    selsig_verbs::VerbsPd,
    selsig_verbs::VerbsCq,
    selsig_verbs::VerbsQp,
) {
    use selsig::{Device as _, QpCaps, QpInit};
    let dev = selsig_verbs::VerbsDevice::open(&selsig_verbs::VerbsOptions::default()).unwrap();
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(16).unwrap();
    let init = QpInit {
        caps: QpCaps {
            max_send_wr: 4,
            max_recv_wr: 1,
            ..QpCaps::default()
        },
        sq_sig_all: false,
    };
    let qp = dev.create_qp(&pd, &cq, &cq, &init).unwrap();
    (dev, pd, cq, qp)
}

/// The rdma_cm errors a client meets, each named: a request without the session's token
/// is rejected by `selsig serve` (which says so, and created nothing for it); a port
/// where nobody listens is rejected by the CM; a listener that never answers is a timeout.
#[test]
#[ignore = "needs an RDMA device: run scripts/verbs-tests.sh (Soft-RoCE in a VM)"]
fn cm_rdma_rejections_and_timeouts_are_named() {
    use selsig_cli::cm_data::{Token, request};
    use selsig_verbs::cm::{CmError, CmListener, connect};
    use std::time::Duration;
    let address = std::env::var("SELSIG_SERVE_ADDR").unwrap_or_else(|_| "127.0.0.1".to_string());
    let ip: std::net::IpAddr = address.parse().unwrap();
    let (server, target) = serve("18643", &[]);
    let (stream, r) = rendezvous(&target);
    let (_dev, _pd, _cq, qp) = own_qp();
    let wrong = request(&Token::generate().unwrap());
    let to = std::net::SocketAddr::new(ip, r.cm_port);
    let e = connect(&qp, to, &wrong, (7, 7), Duration::from_secs(20)).unwrap_err();
    drop(stream);
    let (_, log) = server.finish(true);
    assert!(
        matches!(&e, CmError::Rejected { reason: 28, message, .. } if message.contains("no valid session token")),
        "{e}\nserver: {log}"
    );
    assert!(
        e.to_string().contains("rejected the rdma_cm connection"),
        "{e}"
    );
    assert!(
        log.contains(
            "rejected an rdma_cm connection request that does not carry this session's token"
        ),
        "{log}"
    );
    assert!(!log.contains("rdma_cm connection established"), "{log}");

    // Nobody listens on the port: the CM rejects (invalid service ID).
    let (_dev, _pd, _cq, qp) = own_qp();
    let nobody = std::net::SocketAddr::new(ip, 18649);
    let e = connect(&qp, nobody, &wrong, (7, 7), Duration::from_secs(20)).unwrap_err();
    assert!(matches!(&e, CmError::Rejected { reason: 8, .. }), "{e}");
    assert!(e.to_string().contains("nobody listens on that port"), "{e}");

    // A listener that never takes the request: the client's wait ends, named.
    let listener = CmListener::bind(std::net::SocketAddr::new(ip, 0)).unwrap();
    let (_dev, _pd, _cq, qp) = own_qp();
    let silent = std::net::SocketAddr::new(ip, listener.port());
    let e = connect(&qp, silent, &wrong, (7, 7), Duration::from_secs(3)).unwrap_err();
    assert!(matches!(&e, CmError::TimedOut { .. }), "{e}");
    assert!(e.to_string().contains("within 3s"), "{e}");
}

/// A `--cm rdma` client whose server is killed in the middle of the run fails, exit code
/// 1, within seconds, and says the server disconnected (its kernel disconnects the rdma_cm
/// connection of a process that ends).
#[test]
#[ignore = "needs an RDMA device: run scripts/verbs-tests.sh (Soft-RoCE in a VM)"]
fn cm_rdma_client_says_when_the_server_is_gone_mid_run() {
    use std::sync::mpsc;
    use std::time::Duration;
    let (server, target) = serve("18644", &[]);
    let mut args = vec![
        "bench",
        "--connect",
        &target,
        "--cm",
        "rdma",
        "-D",
        "120s",
        "-s",
        "64",
        "-e",
        "1",
        "--provider",
        "verbs",
    ];
    let g = gid();
    args.extend(g.iter().map(String::as_str));
    let client = Command::new(env!("CARGO_BIN_EXE_selsig"))
        .args(&args)
        .env("SELSIG_SECRET", SECRET)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The warm-up's session, then the point's: killed once the second is established.
    let (lines, seen) = mpsc::channel();
    let Server {
        mut child,
        mut stderr,
        ..
    } = server;
    std::thread::spawn(move || {
        let mut line = String::new();
        while stderr.read_line(&mut line).unwrap_or(0) > 0 {
            if lines.send(std::mem::take(&mut line)).is_err() {
                break;
            }
        }
    });
    let mut log = String::new();
    while log.matches("rdma_cm connection established").count() < 2 {
        match seen.recv_timeout(Duration::from_secs(120)) {
            Ok(line) => log.push_str(&line),
            Err(_) => break,
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    let killed = std::time::Instant::now();
    let o = client.wait_with_output().unwrap();
    let err = text(&o.stderr);
    // (Shown with --nocapture: how the run ended.)
    println!("{err}");
    // Told within seconds, not at the 30 s a point may go without a completion.
    assert!(
        killed.elapsed() < Duration::from_secs(20),
        "{:?}: {err}",
        killed.elapsed()
    );
    assert_eq!(
        log.matches("rdma_cm connection established").count(),
        2,
        "{log}\nclient: {err}"
    );
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("disconnected the rdma_cm connection, RDMA_CM_EVENT_DISCONNECTED"),
        "{err}"
    );
}
