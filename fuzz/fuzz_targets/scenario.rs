//! Arbitrary text against the scenario parser and checker of `selsig run`: whatever the
//! file says, the answer is a scenario or an error naming a place in the file, never a
//! panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

// The parser is a module of the `selsig` binary, with no dependency on the rest of it.
#[allow(dead_code)]
#[path = "../../crates/selsig-cli/src/scenario.rs"]
mod scenario;

fuzz_target!(|data: &[u8]| {
    // `selsig run` reads the file as UTF-8 and refuses anything else before parsing.
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Err(e) = scenario::parse("fuzz.toml", "fuzz", text) {
        // A position, when given, lies in the text: lines from 1, columns from 1.
        assert!(e.line <= text.lines().count() + 1, "line {} beyond the text", e.line);
        assert!(!e.message.is_empty(), "an error without a message");
    }
});
