//! The checked-in C header is what cbindgen makes of the source now: a change to the API
//! that forgot the header fails here. `SELSIG_BLESS=1` writes it anew.

use std::path::Path;

#[test]
fn the_header_is_up_to_date() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let mut made = Vec::new();
    cbindgen::Builder::new()
        .with_crate(dir)
        .with_config(config)
        .generate()
        .expect("cbindgen generates the header")
        .write(&mut made);
    let made = String::from_utf8(made).expect("the header is UTF-8");
    let path = dir.join("include/selsig.h");
    if std::env::var_os("SELSIG_BLESS").is_some() {
        std::fs::write(&path, &made).expect("write include/selsig.h");
        return;
    }
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        checked_in == made,
        "include/selsig.h is stale: run `SELSIG_BLESS=1 cargo test -p selsig-capi --test header` \
         and commit it"
    );
}
