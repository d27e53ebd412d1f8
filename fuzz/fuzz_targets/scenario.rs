//! Arbitrary text against the scenario parser and checker (`selsig_scenario::parse`, which
//! `selsig run` reads its file with): whatever the file says, the answer is a scenario or
//! an error naming a place in the file, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // `selsig run` reads the file as UTF-8 and refuses anything else before parsing.
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Err(e) = selsig_scenario::parse("fuzz.toml", "fuzz", text) {
        assert!(!e.message.is_empty(), "an error without a message");
        // A position, when given, lies in the text: lines from 1, columns (characters)
        // from 1, at most one past the line's end; line 0 is about the whole file.
        if e.line == 0 {
            assert_eq!(e.column, 0, "a column without a line");
        } else {
            let line = text.split('\n').nth(e.line - 1);
            let Some(line) = line else {
                panic!("line {} beyond the text", e.line);
            };
            assert!(
                (1..=line.chars().count() + 1).contains(&e.column),
                "column {} outside line {} ({line:?})",
                e.column,
                e.line
            );
        }
    }
});
