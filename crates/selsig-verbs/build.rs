//! Compiles the layout probe (`csrc/layout.c`) when the system has `<infiniband/verbs.h>`
//! (Debian: libibverbs-dev), for the tests that compare the hand-written FFI declarations
//! with the C header. Without the header the crate still builds; those tests are then
//! reported as ignored, with the reason.

use std::path::Path;

fn main() {
    println!("cargo::rerun-if-changed=csrc/layout.c");
    println!("cargo::rerun-if-changed=/usr/include/infiniband/verbs.h");
    let header = [
        "/usr/include/infiniband/verbs.h",
        "/usr/local/include/infiniband/verbs.h",
    ]
    .iter()
    .any(|h| Path::new(h).exists());
    if header {
        cc::Build::new()
            .file("csrc/layout.c")
            .warnings(true)
            .compile("selsig_verbs_layout");
        println!("cargo::rustc-cfg=verbs_h");
    } else {
        println!(
            "cargo::warning=<infiniband/verbs.h> not found (install libibverbs-dev): the FFI layout tests will be ignored"
        );
    }
}
