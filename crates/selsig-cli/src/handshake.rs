//! The messages `selsig serve` and its clients exchange over TCP (JSON lines), what a
//! server admits before it creates anything for a client, and the challenge-response by
//! which a client proves it knows the server's secret. No I/O here: `remote.rs` moves the
//! lines; this module decides what they mean (and is what the handshake fuzz target
//! feeds).
//!
//! The exchange, version 2:
//! 1. client → server: [`Hello`] (its QP, the memory it will write, how long it runs);
//! 2. server → client: a [`Challenge`] (a fresh random nonce), unless the server runs
//!    `--insecure`;
//! 3. client → server: a [`Proof`]: HMAC-SHA-256, keyed with the secret, of the challenge
//!    and the exact bytes of its hello line. The secret never crosses the wire, a proof
//!    is good for one challenge only (a replayed exchange fails), and it binds the hello:
//!    nobody on the path can change what the client asked for;
//! 4. server → client: [`Welcome`] (its QP, the region's address and key) or a
//!    [`Refusal`]. Nothing is registered for a client before its proof checked out and
//!    its hello is within the server's [`Limits`];
//! 5. after the run, [`Check`] and [`Checked`], as in version 1.
//!
//! A client that connects its queue pair through rdma_cm (`--cm rdma`) says so in its
//! hello ([`Hello::rdma_cm`]); at step 4 the server then answers a [`Rendezvous`]
//! instead of a [`Welcome`]: the port its rdma_cm listener took for this session and a
//! one-time token, which the client's connection request must carry (see [`cm_data`]:
//! the region's address, key and length come back in the accept's private data). A server
//! of before rdma_cm ignores the field and welcomes the client, who then stops.
//!
//! [`cm_data`]: crate::cm_data

use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use hmac::{KeyInit, Mac};
use selsig::Endpoint;
use serde::{Deserialize, Serialize};

/// The exchange's version: both sides must speak the same (0: a selsig from before
/// versions; 1: before the secret).
pub const PROTOCOL: u32 = 2;

/// A QP's address, as exchanged.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Wire {
    pub qp_num: u32,
    pub psn: u32,
    pub lid: u16,
    /// The GID, 32 hex digits.
    pub gid: String,
    /// The largest path MTU the sender takes (0 or absent: not known).
    #[serde(default)]
    pub mtu: u32,
    /// How many RDMA READs the sender's QP serves at once (0 or absent: not known).
    #[serde(default)]
    pub rd_atomic: u8,
}

impl Wire {
    pub fn from_endpoint(e: &Endpoint) -> Wire {
        Wire {
            qp_num: e.qp_num,
            psn: e.psn,
            lid: e.lid,
            gid: hex(&e.gid),
            mtu: e.mtu,
            rd_atomic: e.rd_atomic,
        }
    }

    pub fn endpoint(&self) -> Result<Endpoint> {
        ensure!(
            self.qp_num <= 0x00ff_ffff,
            "the peer sent QP number {:#x}: QP numbers are 24 bits",
            self.qp_num
        );
        let gid = unhex::<16>(&self.gid).with_context(|| {
            format!(
                "the peer sent a malformed GID {:?}: not 32 hex digits",
                excerpt(&self.gid)
            )
        })?;
        Ok(Endpoint {
            qp_num: self.qp_num,
            psn: self.psn,
            lid: self.lid,
            gid,
            mtu: self.mtu,
            rd_atomic: self.rd_atomic,
        })
    }
}

/// client → server: who I am and how much memory I will write.
#[derive(Debug, Serialize, Deserialize)]
pub struct Hello {
    #[serde(default)]
    pub version: u32,
    pub qp: Wire,
    pub wrs: u32,
    pub size: u64,
    /// How many seconds the client's run takes at most, when it knows (a timed bench):
    /// the server waits that long, and its idle timeout more, for the outcomes.
    #[serde(default)]
    pub run_s: u64,
    /// The client connects its QP through rdma_cm: the server answers a [`Rendezvous`].
    /// (Left out when false, so that a TCP client's hello is as before.)
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub rdma_cm: bool,
}

/// server → client, after the hello: prove you know the secret, for this nonce.
#[derive(Debug, Serialize, Deserialize)]
pub struct Challenge {
    /// 32 random bytes, 64 hex digits.
    pub challenge: String,
}

/// client → server: the answer to a [`Challenge`] (see [`proof`]).
#[derive(Debug, Serialize, Deserialize)]
pub struct Proof {
    /// HMAC-SHA-256, 64 hex digits.
    pub proof: String,
}

/// server → client: my QP and the region to write into.
#[derive(Debug, Serialize, Deserialize)]
pub struct Welcome {
    #[serde(default)]
    pub version: u32,
    pub qp: Wire,
    pub addr: u64,
    pub rkey: u32,
    pub device: String,
}

/// server → client, to a client whose hello asked for rdma_cm: where to connect, and the
/// token to show.
#[derive(Debug, Serialize, Deserialize)]
pub struct Rendezvous {
    #[serde(default)]
    pub version: u32,
    /// The port of the server's rdma_cm listener, at the address the client reached.
    pub cm_port: u16,
    /// The session's one-time token, 32 hex digits ([`crate::cm_data::Token`]).
    pub token: String,
    pub device: String,
}

/// server → client when it cannot serve.
#[derive(Debug, Serialize, Deserialize)]
pub struct Refusal {
    pub error: String,
}

/// What the server answers a hello (or a proof).
#[derive(Debug, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Reply {
    Challenge(Challenge),
    Welcome(Welcome),
    Rendezvous(Rendezvous),
    Refusal(Refusal),
}

/// client → server: which WRITEs completed (1-based), after the run.
#[derive(Debug, Serialize, Deserialize)]
pub struct Check {
    pub completed: Vec<u32>,
    /// Whether slot `k` holds the pattern of WRITE `k` exactly when `k` is in `completed`
    /// (the demo, a bench sweep); `false` where the client wrote other bytes (perftest
    /// mode, inline data): nothing is checked.
    #[serde(default = "yes")]
    pub verify: bool,
    /// The client asks for its region's digest ([`selsig_scenario::fnv1a64`]), to compare
    /// with a scenario's (`selsig run --connect`). (Left out when false.)
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub digest: bool,
}

fn yes() -> bool {
    true
}

/// server → client: the WRITEs whose bytes are not as the outcomes say.
#[derive(Debug, Serialize, Deserialize)]
pub struct Checked {
    pub mismatches: Vec<u32>,
    /// The region's digest, 16 hex digits, when the client asked for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
}

/// What the server answers the outcomes.
#[derive(Debug, Serialize, Deserialize)]
#[serde(untagged)]
pub enum CheckReply {
    Checked(Checked),
    Refusal(Refusal),
}

/// One message from a line a peer sent (its end of line trimmed).
pub fn parse<T: for<'de> Deserialize<'de>>(line: &[u8], what: &str) -> Result<T> {
    let line = line.trim_ascii();
    serde_json::from_slice(line).with_context(|| {
        format!(
            "the peer sent a malformed {what}: {:?}",
            excerpt(&String::from_utf8_lossy(line))
        )
    })
}

/// What a server lets one client make it spend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The most target memory it registers for a client, in bytes.
    pub max_bytes: u64,
    /// The most WRITEs (slots) a client may announce.
    pub max_wrs: u32,
    /// The longest run a client may announce.
    pub max_run: Duration,
    /// How long a session may stay silent beyond the run its client announced (for a
    /// client that announced none, its whole run).
    pub idle: Duration,
}

/// Whether a server may serve `hello` within `limits`, before anything is created for it:
/// the client's QP address, read.
pub fn admit(hello: &Hello, limits: &Limits) -> Result<Endpoint> {
    version(hello)?;
    ensure!(
        hello.run_s <= limits.max_run.as_secs() + 1,
        "the client said its run takes {} s: this server allows at most {} s (its --max-run)",
        hello.run_s,
        limits.max_run.as_secs()
    );
    let bytes = u64::from(hello.wrs).saturating_mul(hello.size.max(1));
    if hello.wrs == 0 || hello.wrs > limits.max_wrs || bytes > limits.max_bytes {
        bail!(
            "the client asked for {} slots of {} bytes: this server registers at most {} slots \
             and {} bytes in all (its --max-memory)",
            hello.wrs,
            hello.size,
            limits.max_wrs,
            limits.max_bytes
        );
    }
    hello.qp.endpoint()
}

/// Whether the client speaks this server's version of the exchange.
pub fn version(hello: &Hello) -> Result<()> {
    ensure!(
        hello.version == PROTOCOL,
        "the client speaks version {} of the exchange, this server {PROTOCOL}: run the same \
         selsig on both sides",
        hello.version
    );
    Ok(())
}

/// Whether sorted outcomes name only WRITEs the client posted (1 to `wrs`), each once: a
/// check of anything else would not be of the memory the outcomes describe.
pub fn posted_once(completed: &[u32], wrs: u32) -> Result<()> {
    if let Some(wr) = completed.iter().find(|&&wr| wr == 0 || wr > wrs) {
        bail!("the client's outcomes name WRITE {wr}, which it did not post (1 to {wrs})");
    }
    if let Some(pair) = completed.windows(2).find(|pair| pair[0] == pair[1]) {
        bail!("the client's outcomes name WRITE {} twice", pair[0]);
    }
    Ok(())
}

/// A server's secret: 32 bytes that its clients know too.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret([u8; 32]);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl Secret {
    /// A new secret from the operating system's randomness.
    pub fn generate() -> Result<Secret> {
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes)
            .map_err(|e| anyhow::anyhow!("no randomness for a secret: {e}"))?;
        Ok(Secret(bytes))
    }

    /// A secret as written: 64 hex digits, spaces and a line's end around them aside.
    pub fn parse(text: &str) -> Result<Secret> {
        let text = text.trim();
        unhex::<32>(text).map(Secret).with_context(|| {
            format!(
                "a secret is 64 hex digits (32 bytes); this is {} characters",
                text.chars().count()
            )
        })
    }

    /// The secret as written: 64 hex digits.
    pub fn to_hex(&self) -> String {
        hex(&self.0)
    }
}

/// A fresh challenge: 32 random bytes, 64 hex digits.
pub fn challenge() -> Result<Challenge> {
    let mut nonce = [0u8; 32];
    getrandom::fill(&mut nonce)
        .map_err(|e| anyhow::anyhow!("no randomness for a challenge: {e}"))?;
    Ok(Challenge {
        challenge: hex(&nonce),
    })
}

type HmacSha256 = hmac::Hmac<sha2::Sha256>;

/// The MAC of a challenge and a hello line under `secret`, with the exchange's name and
/// version first, so that a MAC made for anything else never passes for a proof.
fn mac(secret: &Secret, challenge: &str, hello_line: &[u8]) -> Result<HmacSha256> {
    // HMAC takes a key of any length: this does not fail.
    let mut mac = <HmacSha256 as KeyInit>::new_from_slice(&secret.0)
        .map_err(|e| anyhow::anyhow!("HMAC refused the key: {e}"))?;
    mac.update(b"selsig serve proof, exchange 2\n");
    mac.update(challenge.as_bytes());
    mac.update(b"\n");
    mac.update(hello_line.trim_ascii());
    Ok(mac)
}

/// The client's proof that it knows `secret`, for `challenge` and the hello line it sent.
pub fn proof(secret: &Secret, challenge: &str, hello_line: &[u8]) -> Result<Proof> {
    Ok(Proof {
        proof: hex(&mac(secret, challenge, hello_line)?.finalize().into_bytes()),
    })
}

/// Whether `proof` is the proof for `challenge` and `hello_line` under `secret`: compared
/// in constant time (a proof that is not 64 hex digits is simply wrong).
pub fn verify(secret: &Secret, challenge: &str, hello_line: &[u8], proof: &Proof) -> bool {
    match (
        unhex::<32>(&proof.proof),
        mac(secret, challenge, hello_line),
    ) {
        (Ok(tag), Ok(mac)) => mac.verify_slice(&tag).is_ok(),
        _ => false,
    }
}

/// Lower-case hex digits of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `N` bytes from exactly `2N` hex digits.
pub(crate) fn unhex<const N: usize>(text: &str) -> Result<[u8; N]> {
    ensure!(
        text.len() == 2 * N && text.bytes().all(|b| b.is_ascii_hexdigit()),
        "not {} hex digits",
        2 * N
    );
    let mut out = [0u8; N];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&text[2 * i..2 * i + 2], 16)?;
    }
    Ok(out)
}

/// The first 200 characters of what a peer sent, for an error message.
pub fn excerpt(text: &str) -> String {
    text.chars().take(200).collect()
}

/// Text a peer sent, for the terminal: at most `max` characters, those that do not print
/// escaped (control characters, and the format and separator characters that reorder or
/// break a line on screen, as U+202E and U+2028: what Rust's `escape_debug` escapes).
pub fn printable(text: &str, max: usize) -> String {
    let mut shown = String::new();
    for c in text.chars().take(max) {
        match c {
            // Printable, and escaped by `escape_debug` only in quoted text.
            '"' | '\'' | '\\' => shown.push(c),
            _ if c.is_control() || c.escape_debug().nth(1).is_some() => {
                shown.extend(c.escape_default())
            }
            _ => shown.push(c),
        }
    }
    shown
}

#[cfg(test)]
mod tests;
