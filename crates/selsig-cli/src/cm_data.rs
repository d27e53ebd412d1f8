//! The private data of a `--cm rdma` connection: what the client's connection request
//! carries (the session's one-time [`Token`]) and what the server's accept carries (the
//! target [`Region`]: address, key, length). Binary, big-endian, each behind a 4-byte
//! magic, a version and a kind, and within what the CM carries on InfiniBand and RoCE
//! (docs/semantics.md): [`REQUEST_MAX`] and [`ACCEPT_MAX`] bytes.
//!
//! The kernel hands the receiver the whole private-data field, the sender's bytes padded
//! with zeros; a peer may also send anything at all. So decoding reads the fields it needs
//! from the front, ignores what follows, and fails, named, on anything short or foreign:
//! nothing a peer sends makes it panic or allocate more than the field.

use anyhow::{Result, bail, ensure};

use crate::handshake::{hex, unhex};

/// The private data a connection request carries through rdma_cm on InfiniBand and RoCE:
/// the CM's REQ holds 92 bytes (`IB_CM_REQ_PRIVATE_DATA_SIZE`), of which rdma_cm takes 36
/// for its own header (`struct cma_hdr`, the addresses and ports) on its TCP port space.
pub const REQUEST_MAX: usize = 92 - 36;
/// The private data an accept carries: all of the CM's REP, 196 bytes
/// (`IB_CM_REP_PRIVATE_DATA_SIZE`).
pub const ACCEPT_MAX: usize = 196;

const MAGIC: [u8; 4] = *b"SLSG";
/// The version of this encoding.
const VERSION: u8 = 1;
const REQUEST: u8 = 1;
const ACCEPT: u8 = 2;
const HEADER: usize = MAGIC.len() + 2;

/// The bytes of a token.
pub const TOKEN_LEN: usize = 16;
const REQUEST_LEN: usize = HEADER + TOKEN_LEN;
const ACCEPT_LEN: usize = HEADER + 8 + 4 + 8;
const _: () = assert!(REQUEST_LEN <= REQUEST_MAX && ACCEPT_LEN <= ACCEPT_MAX);

/// A session's one-time token: 16 random bytes, given to a client over the authenticated
/// TCP exchange, shown back in its rdma_cm connection request.
#[derive(Clone, PartialEq, Eq)]
pub struct Token([u8; TOKEN_LEN]);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(..)")
    }
}

impl Token {
    /// A fresh token from the operating system's randomness.
    pub fn generate() -> Result<Token> {
        let mut bytes = [0u8; TOKEN_LEN];
        getrandom::fill(&mut bytes)
            .map_err(|e| anyhow::anyhow!("no randomness for a session token: {e}"))?;
        Ok(Token(bytes))
    }

    /// The token as the server sends it: 32 hex digits.
    pub fn to_hex(&self) -> String {
        hex(&self.0)
    }

    /// A token as the server sent it.
    pub fn parse(text: &str) -> Result<Token> {
        unhex::<TOKEN_LEN>(text).map(Token).map_err(|_| {
            anyhow::anyhow!(
                "the server sent a malformed session token: not {} hex digits",
                2 * TOKEN_LEN
            )
        })
    }

    /// Whether `private`, a connection request's private data, carries this token:
    /// compared in constant time.
    pub fn shown_in(&self, private: &[u8]) -> bool {
        match body(private, REQUEST, TOKEN_LEN, "connection request") {
            Ok(shown) => {
                shown
                    .iter()
                    .zip(&self.0)
                    .fold(0u8, |diff, (a, b)| diff | (a ^ b))
                    == 0
            }
            Err(_) => false,
        }
    }
}

/// The private data of the client's connection request.
pub fn request(token: &Token) -> Vec<u8> {
    let mut out = header(REQUEST);
    out.extend_from_slice(&token.0);
    out
}

/// The target memory, as the server's accept gives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Region {
    pub addr: u64,
    pub rkey: u32,
    pub len: u64,
}

/// The private data of the server's accept.
pub fn accept(region: &Region) -> Vec<u8> {
    let mut out = header(ACCEPT);
    out.extend_from_slice(&region.addr.to_be_bytes());
    out.extend_from_slice(&region.rkey.to_be_bytes());
    out.extend_from_slice(&region.len.to_be_bytes());
    out
}

/// The region in the private data of an accept.
pub fn region(private: &[u8]) -> Result<Region> {
    let b = body(private, ACCEPT, ACCEPT_LEN - HEADER, "accept")?;
    let (addr, rest) = b.split_at(8);
    let (rkey, len) = rest.split_at(4);
    let word = |bytes: &[u8]| bytes.iter().fold(0u64, |v, &b| (v << 8) | u64::from(b));
    Ok(Region {
        addr: word(addr),
        rkey: word(rkey) as u32,
        len: word(len),
    })
}

fn header(kind: u8) -> Vec<u8> {
    let mut out = Vec::with_capacity(ACCEPT_LEN);
    out.extend_from_slice(&MAGIC);
    out.push(VERSION);
    out.push(kind);
    out
}

/// The `len` bytes after the header of a `kind` message in `private` (what follows them
/// is padding, or the peer's, and ignored).
fn body<'a>(private: &'a [u8], kind: u8, len: usize, what: &str) -> Result<&'a [u8]> {
    ensure!(
        private.len() >= HEADER + len,
        "the peer's rdma_cm {what} carries {} bytes of private data: too short for selsig's \
         ({} bytes)",
        private.len(),
        HEADER + len
    );
    if private[..MAGIC.len()] != MAGIC {
        bail!("the peer's rdma_cm {what} does not carry selsig's private data (is it selsig?)");
    }
    let (version, got) = (private[MAGIC.len()], private[MAGIC.len() + 1]);
    ensure!(
        version == VERSION,
        "the peer's rdma_cm {what} carries version {version} of selsig's private data, this \
         selsig {VERSION}: run the same selsig on both sides"
    );
    ensure!(
        got == kind,
        "the peer's rdma_cm {what} carries selsig's private data of another kind ({got})"
    );
    Ok(&private[HEADER..HEADER + len])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn padded(mut bytes: Vec<u8>, to: usize) -> Vec<u8> {
        bytes.resize(to, 0);
        bytes
    }

    #[test]
    fn a_token_goes_out_and_comes_back_padded_as_the_kernel_pads_it() {
        let token = Token::generate().unwrap();
        let sent = request(&token);
        assert!(sent.len() <= REQUEST_MAX);
        assert!(token.shown_in(&sent));
        assert!(token.shown_in(&padded(sent.clone(), REQUEST_MAX)));
        assert_eq!(Token::parse(&token.to_hex()).unwrap(), token);
        let other = Token::generate().unwrap();
        assert!(!other.shown_in(&sent));
    }

    #[test]
    fn a_region_goes_out_and_comes_back() {
        let r = Region {
            addr: 0x7f00_1234_5678_9abc,
            rkey: 0xdead_beef,
            len: 1 << 30,
        };
        let sent = accept(&r);
        assert!(sent.len() <= ACCEPT_MAX);
        assert_eq!(region(&sent).unwrap(), r);
        assert_eq!(region(&padded(sent, ACCEPT_MAX)).unwrap(), r);
    }

    #[test]
    fn short_foreign_or_mixed_up_private_data_is_refused_by_name() {
        let r = Region {
            addr: 1,
            rkey: 2,
            len: 3,
        };
        let sent = accept(&r);
        let short = region(&sent[..sent.len() - 1]).unwrap_err().to_string();
        assert!(short.contains("too short"), "{short}");
        let empty = region(&[]).unwrap_err().to_string();
        assert!(empty.contains("carries 0 bytes"), "{empty}");
        let zeros = region(&[0; ACCEPT_MAX]).unwrap_err().to_string();
        assert!(zeros.contains("is it selsig?"), "{zeros}");
        let mut later = sent.clone();
        later[4] = 9;
        let later = region(&later).unwrap_err().to_string();
        assert!(later.contains("version 9"), "{later}");
        // A request where an accept belongs, and the other way round.
        let token = Token::generate().unwrap();
        let mixed = region(&padded(request(&token), ACCEPT_MAX))
            .unwrap_err()
            .to_string();
        assert!(mixed.contains("another kind"), "{mixed}");
        assert!(!token.shown_in(&sent));
        assert!(!token.shown_in(&[]));
        assert!(Token::parse("12").is_err());
        assert!(Token::parse(&"g".repeat(32)).is_err());
    }

    #[test]
    fn no_bytes_a_peer_sends_make_decoding_panic() {
        let token = Token::generate().unwrap();
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for len in 0..=255usize {
            for _ in 0..8 {
                let mut bytes: Vec<u8> = (0..len)
                    .map(|_| {
                        state ^= state << 13;
                        state ^= state >> 7;
                        state ^= state << 17;
                        state as u8
                    })
                    .collect();
                if len >= HEADER && state.is_multiple_of(2) {
                    bytes[..4].copy_from_slice(&MAGIC);
                    bytes[4] = VERSION;
                    bytes[5] = if state.is_multiple_of(4) {
                        ACCEPT
                    } else {
                        REQUEST
                    };
                }
                let _ = region(&bytes);
                let _ = token.shown_in(&bytes);
            }
        }
    }
}
