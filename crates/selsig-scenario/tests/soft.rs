//! The shipped scenarios on the software NIC, through the public API only: as a program
//! that tests its own provider runs them.

use std::path::{Path, PathBuf};

use selsig::PostApi;
use selsig_scenario::{Event, Personality, RunOptions, Scenario, fill_pattern, fnv1a64, load};
use selsig_soft::{SoftConfig, SoftDevice};

/// A scenario of the repository's scenarios/.
fn shipped(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../scenarios")
        .join(file)
}

/// A software device with `personality`, and the options that say what it is and how it
/// fails on purpose.
fn soft(personality: Personality) -> (SoftDevice, RunOptions) {
    soft_with(personality, PostApi::Legacy)
}

/// [`soft`] for `scenario`: with the post API it names.
fn soft_for(personality: Personality, scenario: &Scenario) -> (SoftDevice, RunOptions) {
    soft_with(personality, scenario.post_api().unwrap_or_default())
}

fn soft_with(personality: Personality, post_api: PostApi) -> (SoftDevice, RunOptions) {
    let config = SoftConfig {
        post_api,
        ..SoftConfig::with_personality(personality)
    };
    let device = SoftDevice::open(config).expect("a soft device");
    let faults = device.faults();
    let options = RunOptions::new()
        .rxe(personality == Personality::Rxe)
        .inject_fatal(move || faults.inject_fatal());
    (device, options)
}

/// Asserts that `result` met its expectations, naming what failed if not.
fn assert_passed(result: &selsig_scenario::RunResult) {
    assert!(
        result.passed(),
        "failures {:?}, error {:?}",
        result.failures,
        result.error.as_ref().map(|e| format!("{e:#}"))
    );
}

#[test]
fn the_seed_meets_its_expectations_and_traces_as_selsig_run_does() {
    let scenario = load(&shipped("seed.toml")).expect("scenarios/seed.toml");
    assert_eq!(scenario.name(), "seed");
    assert!(scenario.description().starts_with("The seed example"));
    // The seed names no personality: the soft NIC's default, mlx5.
    let (device, options) = soft(scenario.personality().unwrap_or(Personality::Mlx5));
    let result = selsig_scenario::run(&scenario, &device, &options).expect("a run");
    assert_passed(&result);
    assert_eq!(
        result.checked,
        ["2 completions", "8 outcomes of a", "digest of dst"]
    );
    assert_eq!(result.differs, None);
    assert_eq!(result.trace[0], Event::Step { n: 1, kind: "post" });
    // What `selsig run scenarios/seed.toml` prints first: step 1, then eight WRITEs, every
    // fourth signaled by the policy.
    let text = result.trace_text();
    let head: Vec<&str> = text.lines().take(5).collect();
    assert_eq!(
        head,
        [
            r#"{"event":"step","n":1,"kind":"post"}"#,
            r#"{"event":"post","qp":"a","seq":1,"op":"rdma_write","len":64,"signaled":false}"#,
            r#"{"event":"post","qp":"a","seq":2,"op":"rdma_write","len":64,"signaled":false}"#,
            r#"{"event":"post","qp":"a","seq":3,"op":"rdma_write","len":64,"signaled":false}"#,
            r#"{"event":"post","qp":"a","seq":4,"op":"rdma_write","len":64,"signaled":true,"reason":"policy"}"#,
        ]
    );
    // Last, the regions' digests: `src` as its fill left it, and `dst` the same (the eight
    // WRITEs copied all 512 bytes of it).
    let src = format!("{:016x}", fnv1a64(&fill_pattern(512)));
    assert_eq!(src, "1fb4b57231ed8584");
    assert!(
        text.ends_with(&format!(
            "{{\"event\":\"digest\",\"region\":\"src\",\"fnv1a64\":\"{src}\"}}\n\
             {{\"event\":\"digest\",\"region\":\"dst\",\"fnv1a64\":\"{src}\"}}\n"
        )),
        "{text}"
    );
}

#[test]
fn every_shipped_scenario_meets_its_expectations_on_both_personalities() {
    let mut files: Vec<PathBuf> = std::fs::read_dir(shipped(""))
        .expect("scenarios/")
        .map(|e| e.expect("an entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    files.sort();
    assert!(files.len() >= 10, "{files:?}");
    for file in &files {
        let scenario = load(file).unwrap_or_else(|e| panic!("{e}"));
        for personality in [Personality::Mlx5, Personality::Rxe] {
            let (device, options) = soft_for(personality, &scenario);
            let result = selsig_scenario::run(&scenario, &device, &options)
                .unwrap_or_else(|e| panic!("{}: {e:#}", file.display()));
            assert!(
                result.passed(),
                "{} on {personality:?}: failures {:?}, error {:?}",
                file.display(),
                result.failures,
                result.error.as_ref().map(|e| format!("{e:#}"))
            );
            // The same scenario, run again, traces the same.
            let (device, options) = soft_for(personality, &scenario);
            let again = selsig_scenario::run(&scenario, &device, &options).expect("a run");
            assert_eq!(result.trace, again.trace, "{}", file.display());
        }
    }
}

/// The software NIC with completion queues that give no completion events (the trait's
/// defaults: `CqError::NoEvents`), as a provider without them has.
struct Eventless(SoftDevice);

/// A soft CQ that polls, and gives no events.
struct EventlessCq(selsig_soft::SoftCq);

impl selsig::CompletionQueue for EventlessCq {
    fn capacity(&self) -> u32 {
        self.0.capacity()
    }
    fn poll(&self, out: &mut [selsig::WorkCompletion]) -> Result<usize, selsig::CqError> {
        self.0.poll(out)
    }
    fn identity(&self) -> Option<usize> {
        self.0.identity()
    }
}

impl selsig::Device for Eventless {
    type Pd = <SoftDevice as selsig::Device>::Pd;
    type Mr = <SoftDevice as selsig::Device>::Mr;
    type Cq = EventlessCq;
    type Qp = <SoftDevice as selsig::Device>::Qp;

    fn name(&self) -> &str {
        self.0.name()
    }
    fn alloc_pd(&self) -> Result<Self::Pd, selsig::ProviderError> {
        self.0.alloc_pd()
    }
    fn reg_mr(
        &self,
        pd: &Self::Pd,
        len: usize,
        access: selsig::Access,
    ) -> Result<Self::Mr, selsig::ProviderError> {
        self.0.reg_mr(pd, len, access)
    }
    fn create_cq(&self, min_entries: u32) -> Result<EventlessCq, selsig::ProviderError> {
        self.0.create_cq(min_entries).map(EventlessCq)
    }
    fn create_qp(
        &self,
        pd: &Self::Pd,
        send_cq: &EventlessCq,
        recv_cq: &EventlessCq,
        init: &selsig::QpInit,
    ) -> Result<Self::Qp, selsig::ProviderError> {
        self.0.create_qp(pd, &send_cq.0, &recv_cq.0, init)
    }
    fn poll_async_event(&self) -> Option<selsig::AsyncEvent> {
        self.0.poll_async_event()
    }
}

/// The runner sleeps on completion events where the CQs give them, and polls where they do
/// not: either way every shipped scenario traces the same.
#[test]
fn without_completion_events_the_runner_polls_and_traces_the_same() {
    let mut files: Vec<PathBuf> = std::fs::read_dir(shipped(""))
        .expect("scenarios/")
        .map(|e| e.expect("an entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    files.sort();
    for file in &files {
        let scenario = load(file).unwrap_or_else(|e| panic!("{e}"));
        let (device, options) = soft_for(Personality::Mlx5, &scenario);
        let with_events = selsig_scenario::run(&scenario, &device, &options).expect("a run");
        let (device, options) = soft_for(Personality::Mlx5, &scenario);
        let device = Eventless(device);
        let without = selsig_scenario::run(&scenario, &device, &options).expect("a run");
        assert!(
            without.passed(),
            "{}: failures {:?}, error {:?}",
            file.display(),
            without.failures,
            without.error.as_ref().map(|e| format!("{e:#}"))
        );
        assert_eq!(with_events.trace, without.trace, "{}", file.display());
    }
}

/// Traces hold nothing the hardware leaves undefined: error completions on the mlx5
/// personality carry a vendor syndrome (0x88, 0xf9, ...) where rxe's carry 0, and no trace
/// shows it, so a scenario's errors trace alike on both (semantics 34).
#[test]
fn traces_show_no_vendor_syndrome() {
    let scenario = load(&shipped("error-mid.toml")).expect("scenarios/error-mid.toml");
    for personality in [Personality::Mlx5, Personality::Rxe] {
        let (device, options) = soft(personality);
        let result = selsig_scenario::run(&scenario, &device, &options).expect("a run");
        assert!(result.passed(), "{personality:?}: {:?}", result.failures);
        let text = result.trace_text();
        assert!(text.contains("\"rem_access_err\""), "{text}");
        assert!(text.contains("\"wr_flush_err\""), "{text}");
        assert!(!text.contains("vendor"), "{personality:?}: {text}");
    }
}

/// The device-loss scenario through the library: the program hands the runner what makes
/// its device fail; without it the `device_fatal` step fails, naming the software NIC.
#[test]
fn a_lost_device_retires_the_outstanding_work_as_device_lost() {
    let scenario = load(&shipped("device-loss.toml")).expect("scenarios/device-loss.toml");
    let (device, options) = soft(Personality::Mlx5);
    let result = selsig_scenario::run(&scenario, &device, &options).expect("a run");
    assert_passed(&result);
    let lost = result
        .trace_text()
        .matches("\"outcome\":\"device_lost\"")
        .count();
    assert_eq!(lost, 4, "{}", result.trace_text());

    let device = SoftDevice::open(SoftConfig::default()).expect("a soft device");
    let result = selsig_scenario::run(&scenario, &device, &RunOptions::new()).expect("a run");
    let error = format!("{:#}", result.error.expect("the step fails"));
    assert!(
        error.contains("step 4 (device_fatal)") && error.contains("needs the software NIC"),
        "{error}"
    );
}

/// A batch waits for room for all of it: behind a signaled work request it polls until
/// the batch fits, and behind an unsignaled tail only, which no completion will retire, it
/// fails at once, saying to confirm first (it used to spin for ever, past the 20 s bound).
#[test]
fn a_batch_waits_for_room_for_the_whole_batch() {
    let file = |policy: &str, count: u32| {
        r#"description = "a batch after a long post"
[[qp]]
name = "q"
depth = 16
policy = "POLICY"
[[region]]
name = "src"
size = 4096
fill = "pattern"
[[region]]
name = "dst"
size = 4096
access = ["local_write", "remote_write"]
[[step]]
post = { qp = "q", op = "write", local = "src", remote = "dst", size = 8, count = COUNT }
[[step]]
post = { qp = "q", op = "write", local = "src", remote = "dst", size = 8, count = 6, batch = true }
[[step]]
confirm = "q"
[[step]]
poll = "idle"
"#
        .replace("POLICY", policy)
        .replace("COUNT", &count.to_string())
    };
    for personality in [Personality::Mlx5, Personality::Rxe] {
        // 38 WRITEs: WR32 signaled and WR33-38 unsignaled may be outstanding, 2 slots
        // free: the batch of 6 polls CQE32, then fits.
        let (device, options) = soft(personality);
        let text = file("every:8", 38);
        let sc = selsig_scenario::parse("b.toml", "b", &text).expect("it parses");
        let start = std::time::Instant::now();
        let result = selsig_scenario::run(&sc, &device, &options).expect("it runs");
        assert_passed(&result);
        assert!(start.elapsed() < std::time::Duration::from_secs(10));
        // 12 WRITEs signaled by hand, none of them: a tail of 12 of 16 slots, which no
        // completion will give back, and the batch of 6 never fits.
        let text = file("manual", 12);
        let sc = selsig_scenario::parse("b.toml", "b", &text).expect("it parses");
        let start = std::time::Instant::now();
        let result = selsig_scenario::run(&sc, &device, &options).expect("it runs");
        let error = format!("{:#}", result.error.as_ref().expect("the batch fails"));
        assert!(
            error.contains("unsignaled tail") && error.contains("confirm"),
            "{error}"
        );
        assert!(
            start.elapsed() < std::time::Duration::from_secs(10),
            "{:?}",
            start.elapsed()
        );
    }
}
