//! The C test (tests/c/tracker_test.c: a loop that plays the NIC, no device needed),
//! compiled with the system C compiler against include/selsig.h and the static library
//! (built here by cargo), then run.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Where cargo put this package's libraries: the profile's directory, above `deps/`.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's path");
    exe.parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps/<test>")
        .to_path_buf()
}

/// Builds the static library (`cargo test` builds the crate's rlib only) into this test's
/// target directory and profile, and returns its path.
fn static_library() -> PathBuf {
    let profile = profile_dir();
    let target = profile.parent().expect("target/<profile>");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    let mut build = Command::new(&cargo);
    build
        .args(["build", "-q", "-p", "selsig-capi", "--lib", "--target-dir"])
        .arg(target);
    if profile.file_name().is_some_and(|p| p == "release") {
        build.arg("--release");
    }
    let status = build
        .status()
        .unwrap_or_else(|e| panic!("cannot run {cargo:?}: {e}"));
    assert!(status.success(), "cargo build -p selsig-capi failed");
    let lib = profile.join("libselsig_capi.a");
    assert!(lib.exists(), "cargo built no {}", lib.display());
    lib
}

#[test]
fn the_c_test_passes() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let lib = static_library();
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("tracker_test");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let built = Command::new(&cc)
        .args(["-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(dir.join("include"))
        .arg(dir.join("tests/c/tracker_test.c"))
        .arg(&lib)
        .args(["-lpthread", "-ldl", "-lm", "-o"])
        .arg(&out)
        .output()
        .unwrap_or_else(|e| panic!("cannot run the C compiler {cc:?}: {e}"));
    assert!(
        built.status.success(),
        "the C test does not compile (the setup script installs the compiler and \
         libibverbs-dev, whose <infiniband/verbs.h> selsig.h includes):\n{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let ran = Command::new(&out).output().expect("run the C test");
    let stdout = String::from_utf8_lossy(&ran.stdout);
    assert!(
        ran.status.success(),
        "the C test failed:\n{stdout}{}",
        String::from_utf8_lossy(&ran.stderr)
    );
    assert!(stdout.contains("checks passed"), "{stdout}");
}
