//! The challenge-response and what a server admits.

use super::*;

fn hello(wrs: u32, size: u64, run_s: u64) -> Hello {
    Hello {
        version: PROTOCOL,
        qp: Wire {
            qp_num: 17,
            psn: 1,
            lid: 0,
            gid: "fe800000000000000000000000000001".into(),
            mtu: 0,
            rd_atomic: 0,
        },
        wrs,
        size,
        run_s,
        rdma_cm: false,
    }
}

const LIMITS: Limits = Limits {
    max_bytes: 1 << 20,
    max_wrs: 1000,
    max_run: Duration::from_secs(60),
    idle: Duration::from_secs(30),
};

#[test]
fn a_secret_is_64_hex_digits_and_never_printed() {
    let s = Secret::generate().unwrap();
    assert_eq!(Secret::parse(&format!(" {}\n", s.to_hex())).unwrap(), s);
    assert_ne!(Secret::generate().unwrap(), s, "fresh randomness each time");
    assert_eq!(format!("{s:?}"), "Secret(..)");
    for bad in ["", "abc", &"g".repeat(64), &"a".repeat(63), &"a".repeat(66)] {
        let e = Secret::parse(bad).unwrap_err().to_string();
        assert!(e.contains("a secret is 64 hex digits"), "{bad:?}: {e}");
    }
}

#[test]
fn a_proof_holds_for_its_secret_challenge_and_hello_only() {
    let secret = Secret::generate().unwrap();
    let line = serde_json::to_vec(&hello(4, 64, 0)).unwrap();
    let c = challenge().unwrap();
    let p = proof(&secret, &c.challenge, &line).unwrap();
    assert_eq!(p.proof.len(), 64);
    assert!(verify(&secret, &c.challenge, &line, &p));
    // The line as read, with its end: the same hello.
    let mut read = line.clone();
    read.extend_from_slice(b"\r\n");
    assert!(verify(&secret, &c.challenge, &read, &p));
    // Another secret, another challenge (a replay), another hello, a proof altered.
    assert!(!verify(
        &Secret::generate().unwrap(),
        &c.challenge,
        &line,
        &p
    ));
    let again = challenge().unwrap();
    assert_ne!(again.challenge, c.challenge);
    assert!(
        !verify(&secret, &again.challenge, &line, &p),
        "a replayed proof"
    );
    let bigger = serde_json::to_vec(&hello(4, 1 << 20, 0)).unwrap();
    assert!(!verify(&secret, &c.challenge, &bigger, &p), "another hello");
    let mut flipped = p.proof.clone().into_bytes();
    flipped[10] = if flipped[10] == b'0' { b'1' } else { b'0' };
    let flipped = Proof {
        proof: String::from_utf8(flipped).unwrap(),
    };
    assert!(!verify(&secret, &c.challenge, &line, &flipped));
    for malformed in ["", "zz", &p.proof[..62], &format!("{}00", p.proof)] {
        let m = Proof {
            proof: malformed.to_string(),
        };
        assert!(!verify(&secret, &c.challenge, &line, &m), "{malformed:?}");
    }
}

#[test]
fn a_hello_beyond_a_limit_is_refused_with_the_limit_named() {
    assert_eq!(admit(&hello(1000, 1024, 60), &LIMITS).unwrap().qp_num, 17);
    for (h, want) in [
        (
            hello(1001, 1, 0),
            "at most 1000 slots and 1048576 bytes in all (its --max-memory)",
        ),
        (hello(1000, 1049, 0), "at most 1000 slots and 1048576 bytes"),
        (hello(0, 64, 0), "asked for 0 slots"),
        (
            hello(1, 64, 62),
            "its run takes 62 s: this server allows at most 60 s (its --max-run)",
        ),
    ] {
        let e = admit(&h, &LIMITS).unwrap_err().to_string();
        assert!(e.contains(want), "{e}\nshould say: {want}");
    }
    let mut old = hello(1, 64, 0);
    old.version = 1;
    let e = admit(&old, &LIMITS).unwrap_err().to_string();
    assert!(
        e.contains("the client speaks version 1 of the exchange, this server 2"),
        "{e}"
    );
}

#[test]
fn messages_are_told_apart_and_malformed_ones_named() {
    let c: Reply = parse(br#"{"challenge":"00"}"#, "reply").unwrap();
    assert!(matches!(c, Reply::Challenge(_)));
    let r: Reply = parse(b"{\"error\":\"no\"}\n", "reply").unwrap();
    assert!(matches!(r, Reply::Refusal(_)));
    let e = parse::<Hello>(b"{\"wrs\": 1}", "client's hello").unwrap_err();
    assert!(
        format!("{e:#}").contains("the peer sent a malformed client's hello"),
        "{e:#}"
    );
}
