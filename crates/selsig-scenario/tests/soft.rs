//! The shipped scenarios on the software NIC, through the public API only: as a program
//! that tests its own provider runs them.

use std::path::{Path, PathBuf};

use selsig_scenario::{Event, Personality, RunOptions, fill_pattern, fnv1a64, load};
use selsig_soft::{SoftConfig, SoftDevice};

/// A scenario of the repository's scenarios/.
fn shipped(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../scenarios")
        .join(file)
}

/// A software device with `personality`, and the options that say what it is.
fn soft(personality: Personality) -> (SoftDevice, RunOptions) {
    let soft = match personality {
        Personality::Mlx5 => selsig_soft::Personality::Mlx5,
        Personality::Rxe => selsig_soft::Personality::Rxe,
    };
    let device = SoftDevice::open(SoftConfig::with_personality(soft)).expect("a soft device");
    let options = RunOptions::new().rxe(personality == Personality::Rxe);
    (device, options)
}

#[test]
fn the_seed_meets_its_expectations_and_traces_as_selsig_run_does() {
    let scenario = load(&shipped("seed.toml")).expect("scenarios/seed.toml");
    assert_eq!(scenario.name(), "seed");
    assert!(scenario.description().starts_with("The seed example"));
    // The seed names no personality: the soft NIC's default, mlx5.
    let (device, options) = soft(scenario.personality().unwrap_or(Personality::Mlx5));
    let result = selsig_scenario::run(&scenario, &device, &options).expect("a run");
    assert!(
        result.passed(),
        "failures {:?}, error {:?}",
        result.failures,
        result.error.as_ref().map(|e| format!("{e:#}"))
    );
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
            let (device, options) = soft(personality);
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
            let (device, options) = soft(personality);
            let again = selsig_scenario::run(&scenario, &device, &options).expect("a run");
            assert_eq!(result.trace, again.trace, "{}", file.display());
        }
    }
}
