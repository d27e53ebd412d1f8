//! Arbitrary lines against what `selsig serve` makes of its clients' messages
//! (`selsig_cli::handshake`): a hello, then its proof, then outcomes. Whatever a peer
//! sends, the answer is a message or an error, never a panic; a hello is admitted only
//! within the limits; no proof the fuzzer makes passes for the secret. Each line is also
//! rdma_cm private data from a peer (`selsig_cli::cm_data`): a region or an error.
#![no_main]

use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use selsig_cli::cm_data::{self, Token};
use selsig_cli::handshake::{self, Check, Hello, Limits, Proof, Reply, Secret};

const LIMITS: Limits = Limits {
    max_bytes: 1 << 30,
    max_wrs: 1 << 20,
    max_run: Duration::from_secs(3600),
    idle: Duration::from_secs(300),
};

fuzz_target!(|data: &[u8]| {
    let mut lines = data.split(|&b| b == b'\n');
    let hello_line = lines.next().unwrap_or_default();
    if let Ok(hello) = handshake::parse::<Hello>(hello_line, "client's hello")
        && handshake::admit(&hello, &LIMITS).is_ok()
    {
        let bytes = u64::from(hello.wrs) * hello.size.max(1);
        assert!(hello.wrs >= 1 && hello.wrs <= LIMITS.max_wrs, "{hello:?}");
        assert!(bytes <= LIMITS.max_bytes, "{hello:?}");
        assert!(hello.run_s <= LIMITS.max_run.as_secs() + 1, "{hello:?}");
    }
    if let Some(line) = lines.next()
        && let Ok(proof) = handshake::parse::<Proof>(line, "client's proof")
    {
        let secret = Secret::parse(&"5e".repeat(32)).expect("a secret");
        let challenge = "00".repeat(32);
        assert!(
            !handshake::verify(&secret, &challenge, hello_line, &proof),
            "a forged proof passed: {proof:?}"
        );
    }
    for line in lines {
        if let Ok(mut check) = handshake::parse::<Check>(line, "client's outcomes") {
            check.completed.sort_unstable();
            if handshake::posted_once(&check.completed, 64).is_ok() {
                assert!(check.completed.iter().all(|&wr| (1..=64).contains(&wr)));
            }
        }
        let _ = handshake::parse::<Reply>(line, "server's reply");
        if let Ok(region) = cm_data::region(line) {
            assert_eq!(cm_data::region(&cm_data::accept(&region)).ok(), Some(region));
        }
        let token = Token::parse(&"ab".repeat(cm_data::TOKEN_LEN)).expect("a token");
        let _ = token.shown_in(line);
        let shown = handshake::printable(&String::from_utf8_lossy(line), 1000);
        assert!(!shown.chars().any(char::is_control), "{shown:?}");
    }
});
