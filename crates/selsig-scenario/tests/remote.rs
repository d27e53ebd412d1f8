//! Scenarios with a remote side (`run_remote`), through the public API: a remote side made
//! of a queue pair and a region of their own on the same software NIC (as `selsig serve`
//! makes them on its device) gives the trace a loopback peer gives.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Result, bail};
use selsig::{Access, ConnectOptions, Device, MemoryRegion, QpCaps, QpInit, QueuePair, RemoteAddr};
use selsig_scenario::{
    Event, Personality, RemoteSide, RunOptions, RunResult, Scenario, fnv1a64, load,
};
use selsig_soft::{SoftConfig, SoftDevice};

fn shipped(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../scenarios")
        .join(file)
}

/// What the remote side made for its one client.
struct Held<D: Device> {
    _qp: D::Qp,
    region: D::Mr,
    _cq: Arc<D::Cq>,
    _pd: D::Pd,
}

/// A remote side on `dev`: a protection domain, CQ, queue pair and region of its own, as a
/// server makes them.
struct Loopback<'a, D: Device> {
    dev: &'a D,
    held: Option<Held<D>>,
    /// How many times the runner asked to connect.
    connects: usize,
    /// Make the digest fail, as a server that went away does.
    gone: bool,
}

impl<'a, D: Device> Loopback<'a, D> {
    fn new(dev: &'a D) -> Self {
        Loopback {
            dev,
            held: None,
            connects: 0,
            gone: false,
        }
    }
}

impl<D: Device> RemoteSide<D> for Loopback<'_, D> {
    fn connect(&mut self, qp: &D::Qp, options: &ConnectOptions, len: u64) -> Result<RemoteAddr> {
        self.connects += 1;
        let pd = self.dev.alloc_pd()?;
        let cq = Arc::new(self.dev.create_cq(16)?);
        let init = QpInit {
            caps: QpCaps {
                max_send_wr: 1,
                max_recv_wr: 1,
                ..QpCaps::default()
            },
            sq_sig_all: false,
        };
        let theirs = self.dev.create_qp(&pd, &cq, &cq, &init)?;
        let region = self.dev.reg_mr(
            &pd,
            len as usize,
            Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        )?;
        let server = ConnectOptions {
            access: Access::REMOTE_WRITE,
            ..ConnectOptions::default()
        };
        let mine = qp.endpoint(options)?;
        let other = theirs.endpoint(&server)?;
        qp.connect(&other, options)?;
        theirs.connect(&mine, &server)?;
        let at = region.remote(0);
        self.held = Some(Held {
            _qp: theirs,
            region,
            _cq: cq,
            _pd: pd,
        });
        Ok(at)
    }

    fn digest(&mut self) -> Result<u64> {
        let Some(held) = self.held.as_ref().filter(|_| !self.gone) else {
            bail!("the remote side is gone");
        };
        let mut bytes = vec![0u8; held.region.len()];
        held.region.read(0, &mut bytes)?;
        Ok(fnv1a64(&bytes))
    }
}

/// A software NIC with `personality`, posting as `scenario` says.
fn device(personality: Personality, scenario: &Scenario) -> (SoftDevice, RunOptions) {
    let config = SoftConfig {
        post_api: scenario.post_api().unwrap_or_default(),
        ..SoftConfig::with_personality(personality)
    };
    let device = SoftDevice::open(config).expect("a device");
    let options = RunOptions::new().rxe(personality == Personality::Rxe);
    (device, options)
}

/// The trace without the asynchronous events of the peer (on the remote side, another
/// host's, with a remote side; here, as the remote side shares the device, the runner sees
/// them for a queue pair it does not know, and names it by its number).
fn here(result: &RunResult, peer: &str) -> Vec<String> {
    result
        .trace
        .iter()
        .filter(
            |e| !matches!(e, Event::Async { qp: Some(q), .. } if q == peer || q.starts_with("0x")),
        )
        .map(Event::line)
        .collect()
}

fn assert_passed(result: &RunResult, what: &str) {
    assert!(
        result.passed(),
        "{what}: failures {:?}, error {:?}",
        result.failures,
        result.error.as_ref().map(|e| format!("{e:#}"))
    );
}

/// Every shipped scenario a remote side can hold gives, on both personalities, the trace
/// and the outcome a loopback peer gives, the region's digest read from the remote side.
#[test]
fn shipped_scenarios_with_a_remote_side_trace_as_with_a_loopback_peer() {
    let mut taken = Vec::new();
    let mut files: Vec<_> = std::fs::read_dir(shipped(""))
        .expect("scenarios/")
        .map(|e| e.expect("an entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    files.sort();
    for path in files {
        let scenario = load(&path).expect("a shipped scenario");
        let Ok(region) = scenario.remote_region() else {
            continue;
        };
        let region = region.to_string();
        taken.push(scenario.name().to_string());
        for personality in [Personality::Mlx5, Personality::Rxe] {
            let what = format!("{} on {personality:?}", scenario.name());
            let (dev, options) = device(personality, &scenario);
            let local = selsig_scenario::run(&scenario, &dev, &options).expect("a run");
            assert_passed(&local, &what);
            let mut remote = Loopback::new(&dev);
            let far = selsig_scenario::run_remote(&scenario, &dev, &options, &mut remote)
                .expect("a run with a remote side");
            // The one failure a shared device makes: the remote queue pair's event, which
            // a remote side on another host keeps there.
            let shared = |f: &String| {
                f.starts_with("async events: expected [], got [\"qp_access_err:0x")
                    && f.matches("\"").count() == 2
            };
            assert!(
                far.error.is_none() && far.failures.iter().all(shared),
                "{what}: failures {:?}, error {:?}",
                far.failures,
                far.error.as_ref().map(|e| format!("{e:#}"))
            );
            assert_eq!(remote.connects, 1, "{what}");
            let peer = format!("{}.peer", qp_of(&local));
            assert_eq!(here(&far, &peer), here(&local, &peer), "{what}");
            // The remote side's region is in the trace, read from there.
            assert!(
                far.trace
                    .iter()
                    .any(|e| matches!(e, Event::Digest { region: r, .. } if *r == region)),
                "{what}"
            );
        }
    }
    for name in [
        "seed",
        "signal-all",
        "sq-full",
        "sq-full-inline",
        "confirm-marker",
        "error-mid",
        "error-first",
        "error-last",
        "drain-after-error",
        "fault-out-of-bounds",
    ] {
        assert!(taken.iter().any(|t| t == name), "{name} not in {taken:?}");
    }
}

/// The name of the queue pair of a one-QP run, from its first post.
fn qp_of(result: &RunResult) -> String {
    result
        .trace
        .iter()
        .find_map(|e| match e {
            Event::Post { qp, .. } => Some(qp.clone()),
            _ => None,
        })
        .expect("a post")
}

/// A scenario that depends on its peer being in this process is refused, naming why,
/// before anything is made or connected.
#[test]
fn scenarios_a_remote_side_cannot_hold_are_refused_before_anything_is_made() {
    for (file, why) in [
        ("atomics.toml", "2 queue pairs"),
        ("mixed-ops.toml", "step 1: a receive on the peer"),
        ("fault-no-access.toml", "remote write access"),
        ("fault-wrong-pd.toml", "protection domain"),
        (
            "fault-deregistered.toml",
            "uses region \"dst\" on this side",
        ),
        ("device-loss.toml", "step 2: posts a send"),
    ] {
        let scenario = load(&shipped(file)).expect("a shipped scenario");
        let (dev, options) = device(Personality::Mlx5, &scenario);
        let mut remote = Loopback::new(&dev);
        let e =
            selsig_scenario::run_remote(&scenario, &dev, &options, &mut remote).expect_err(file);
        let text = format!("{e:#}");
        assert!(
            text.contains("cannot run with a remote side") && text.contains(why),
            "{file}: {text}"
        );
        assert_eq!(remote.connects, 0, "{file}");
        assert!(
            scenario.remote_region().unwrap_err().contains(why),
            "{file}"
        );
    }
}

/// A remote side that cannot give the region's digest ends the run there, with the
/// trace up to it and the region named.
#[test]
fn a_remote_side_gone_before_the_digest_fails_the_run_naming_the_region() {
    let scenario = load(&shipped("seed.toml")).expect("seed");
    let (dev, options) = device(Personality::Mlx5, &scenario);
    let mut remote = Loopback::new(&dev);
    remote.gone = true;
    let result = selsig_scenario::run_remote(&scenario, &dev, &options, &mut remote)
        .expect("a run that fails at its end");
    let e = format!("{:#}", result.error.expect("the digest's error"));
    assert!(
        e.contains("cannot read region \"dst\"") && e.contains("the remote side is gone"),
        "{e}"
    );
    assert!(
        result
            .trace
            .iter()
            .any(|e| matches!(e, Event::Cqe { wr_id: 8, .. })),
        "{:?}",
        result.trace
    );
}
