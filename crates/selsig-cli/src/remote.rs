//! Two processes, two hosts: `selsig serve` holds the target memory and its QP;
//! `selsig demo --connect HOST` writes into it. Like perftest and `ibv_rc_pingpong`, the
//! two exchange what RDMA needs over a small TCP handshake (JSON lines, [`handshake`]): QP
//! number, PSN, LID, GID, and the target region's address and key, given only to a client
//! that proves it knows the server's secret. After the run the client sends the outcome of
//! every WRITE and the server checks its memory. With `--cm rdma` the queue pairs meet
//! through rdma_cm instead, past the same handshake (`remote/rdma.rs`).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use clap::Args;
use selsig::{
    Access, ConnectOptions, Device, Endpoint, MemoryRegion, QpCaps, QpInit, QueuePair, RemoteAddr,
    connect_pair,
};
use serde::{Deserialize, Serialize};

use selsig_cli::handshake::{
    self, Challenge, Check, CheckReply, Checked, Hello, Limits, PROTOCOL, Refusal, Rendezvous,
    Reply, Secret, Wire, printable,
};
use selsig_verbs::cm::CmConnection;

mod rdma;
pub use rdma::Cm;
mod serve;
pub(crate) use serve::serve_on;
#[cfg(test)]
use serve::serve_one;

use crate::common::{DeviceInfo, OnDevice, Pattern, ProviderArgs, parse_size};
use crate::limits::{MAX_REGION, MAX_RUN, MAX_WRS};
use crate::net::{DEFAULT_PORT, host_and_port, show_address};

/// How long the server waits for a client's hello, and for its proof, which a client
/// sends at once: short, as a client that does not send them holds one of the server's
/// few handshakes meanwhile (`serve::MAX_HANDSHAKES`).
const HELLO_WAIT: Duration = Duration::from_secs(10);
const PROOF_WAIT: Duration = Duration::from_secs(5);
/// How long a client waits for each of the server's replies.
const REPLY_WAIT: Duration = Duration::from_secs(120);
/// How long either side takes to hand one message to a peer that does not read it (a
/// server serves one client at a time). Short in unit tests, which wait it out.
const SEND_WAIT: Duration = Duration::from_secs(if cfg!(test) { 3 } else { 120 });
/// The longest hello, welcome or check reply accepted (the outcomes may be longer).
const MAX_SHORT: u64 = 64 << 10;
/// The most of a server's refusal a client prints, in characters.
const MAX_REFUSAL: usize = 1000;
/// The server reads a WRITE back this many bytes at a time to check it.
const CHECK_CHUNK: usize = 64 << 10;

/// Sends one message, which the peer must take within [`SEND_WAIT`] however it spreads
/// its reads (a timeout for each write would let a peer that reads a byte now and then
/// hold the connection for ever).
fn send<T: Serialize>(w: &mut TcpStream, msg: &T) -> Result<()> {
    send_line(w, serde_json::to_string(msg)?)
}

/// Sends one message already written, as [`send`].
fn send_line(w: &mut TcpStream, mut line: String) -> Result<()> {
    line.push('\n');
    let deadline = Instant::now() + SEND_WAIT;
    let mut rest = line.as_bytes();
    while !rest.is_empty() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            bail!("the peer did not take the message within {SEND_WAIT:?}");
        }
        w.set_write_timeout(Some(left))?;
        match w.write(rest) {
            Ok(0) => bail!("the connection broke"),
            Ok(n) => rest = &rest[n..],
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                bail!("the peer did not take the message within {SEND_WAIT:?}")
            }
            Err(e) => return Err(e).context("the connection broke"),
        }
    }
    Ok(())
}

/// The longest message accepted: a client's outcomes, `MAX_WRS` numbers, fit easily.
const MAX_LINE: u64 = 16 << 20;

/// A connection read under a deadline for each message, however the peer spreads its
/// bytes (a timeout for each read would let a peer that sends a byte now and then hold
/// the connection for ever).
struct Timed {
    stream: TcpStream,
    deadline: Instant,
}

impl Timed {
    fn new(stream: TcpStream, wait: Duration) -> Timed {
        Timed {
            stream,
            deadline: Instant::now() + wait,
        }
    }
}

impl Read for Timed {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::ErrorKind::TimedOut.into());
        }
        self.stream.set_read_timeout(Some(left))?;
        self.stream.read(buf)
    }
}

/// Reads one message of at most `max` bytes, which must come within `wait` (the
/// deadline is set here).
fn receive_within<T: for<'de> Deserialize<'de>>(
    r: &mut BufReader<Timed>,
    what: &str,
    wait: Duration,
    max: u64,
) -> Result<T> {
    r.get_mut().deadline = Instant::now() + wait;
    receive(r, what, max).map_err(|e| timed_out(e, what, wait))
}

fn receive<T: for<'de> Deserialize<'de>>(r: &mut impl BufRead, what: &str, max: u64) -> Result<T> {
    handshake::parse(&receive_line(r, what, max)?, what)
}

/// Reads the bytes of one message (a line) of at most `max` bytes.
fn receive_line(r: &mut impl BufRead, what: &str, max: u64) -> Result<Vec<u8>> {
    // Bytes, not a line of text: a message cut at `max` inside a character is too long,
    // not malformed.
    let mut line = Vec::new();
    let n = std::io::Read::take(r, max)
        .read_until(b'\n', &mut line)
        .with_context(|| format!("cannot read the {what}"))?;
    ensure!(n > 0, "the peer closed the connection before the {what}");
    ensure!(
        line.ends_with(b"\n") || (n as u64) < max,
        "the peer sent a {what} longer than {max} bytes"
    );
    Ok(line)
}

/// Like [`receive_within`], the line's bytes.
fn receive_line_within(
    r: &mut BufReader<Timed>,
    what: &str,
    wait: Duration,
    max: u64,
) -> Result<Vec<u8>> {
    r.get_mut().deadline = Instant::now() + wait;
    receive_line(r, what, max).map_err(|e| timed_out(e, what, wait))
}

/// `e`, or that no `what` came within `wait` if it is a read's timeout.
fn timed_out(e: anyhow::Error, what: &str, wait: Duration) -> anyhow::Error {
    let timed_out = e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>().is_some_and(|io| {
            matches!(
                io.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            )
        })
    });
    if timed_out {
        anyhow::anyhow!("no {what} came within {wait:?}")
    } else {
        e
    }
}

/// A hint for a failed connection when the two sides' GIDs are of different kinds (one
/// side's `-x` names a link-local GID, the other's an IPv4-mapped one): empty otherwise.
pub fn gid_hint(mine: &Endpoint, theirs: &Endpoint, peer: &str) -> String {
    fn kind(gid: &[u8; 16]) -> &'static str {
        if gid[0] == 0xfe && gid[1] & 0xc0 == 0x80 {
            "link-local"
        } else if gid[..10].iter().all(|&b| b == 0) && gid[10..12] == [0xff, 0xff] {
            "IPv4-mapped"
        } else {
            "global"
        }
    }
    let (a, b) = (kind(&mine.gid), kind(&theirs.gid));
    if a == b {
        String::new()
    } else {
        format!(
            " (this side's GID is {a}, the {peer}'s {b}: give both sides a GID index, -x, of the same kind)"
        )
    }
}

/// The environment variable that holds a server's secret, 64 hex digits: `selsig serve`
/// takes it as its secret, a client proves it knows it.
pub const SECRET_VAR: &str = "SELSIG_SECRET";
/// The environment variable that names a file holding the secret (a client's
/// `--secret-file`).
pub const SECRET_FILE_VAR: &str = "SELSIG_SECRET_FILE";

/// The secret a client proves it knows: `SELSIG_SECRET`, or the file `SELSIG_SECRET_FILE`
/// names.
fn client_secret() -> Result<Secret> {
    if let Ok(text) = std::env::var(SECRET_VAR) {
        return Secret::parse(&text).with_context(|| format!("{SECRET_VAR} is not a secret"));
    }
    match std::env::var_os(SECRET_FILE_VAR) {
        Some(path) => read_secret(Path::new(&path)),
        None => bail!(
            "give this client the secret the server printed: {SECRET_VAR}=<64 hex digits>, or \
             {SECRET_FILE_VAR}=<a file that holds them>"
        ),
    }
}

/// The secret in the file at `path`.
fn read_secret(path: &Path) -> Result<Secret> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the secret file {}", path.display()))?;
    Secret::parse(&text).with_context(|| format!("{} holds no secret", path.display()))
}

/// The client side: a connection to a server, its region, and the check at the end.
pub struct RemotePeer {
    reader: BufReader<Timed>,
    writer: TcpStream,
    /// The slots asked for: the server's check names WRITEs among them.
    slots: u32,
    pub target: RemoteAddr,
    /// The server's QP (`None`: it answered a [`Rendezvous`] for rdma_cm, in `rendezvous`).
    pub endpoint: Option<Endpoint>,
    rendezvous: Option<Rendezvous>,
    /// The rdma_cm connection, once `rendezvous` led to one.
    cm: Option<CmConnection>,
    pub device: String,
    pub address: String,
}

impl RemotePeer {
    /// Whether the server closed the connection (it was stopped, or gave up on this client):
    /// `None` while it is open; its refusal, if it said why (empty if not). Mid-run the
    /// server sends nothing unasked but the refusal it sends before it closes, so anything
    /// waiting on the socket, as an end of stream or an error, means it is gone. Reads
    /// nothing.
    pub fn closed(&self) -> Option<String> {
        let refusal = |bytes: &[u8]| {
            let line = bytes.split(|&b| b == b'\n').next().unwrap_or_default();
            match serde_json::from_slice::<Refusal>(line) {
                Ok(r) => printable(&r.error, MAX_REFUSAL),
                Err(_) => String::new(),
            }
        };
        // Read with the welcome, if it came right after it.
        if !self.reader.buffer().is_empty() {
            return Some(refusal(self.reader.buffer()));
        }
        if self.writer.set_nonblocking(true).is_err() {
            return None;
        }
        let mut waiting = vec![0u8; MAX_SHORT as usize];
        let peeked = self.writer.peek(&mut waiting);
        let _ = self.writer.set_nonblocking(false);
        match peeked {
            Ok(0) => Some(String::new()),
            Ok(n) => Some(refusal(&waiting[..n])),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => None,
            Err(_) => Some(String::new()),
        }
    }

    /// Connects to `host[:port]` and exchanges addresses; `local` is this side's QP, `run`
    /// how long the run takes at most, when known. A server that asks for its secret gets
    /// the proof of `SELSIG_SECRET`'s (or `SELSIG_SECRET_FILE`'s).
    pub fn connect(
        host: &str,
        local: &Endpoint,
        wrs: u32,
        size: u64,
        run: Option<Duration>,
        cm: Cm,
    ) -> Result<RemotePeer> {
        Self::connect_cm(host, local, (wrs, size, run), &client_secret, cm)
    }

    /// [`connect`](Self::connect), with the secret from `secret`, asked only if the server
    /// challenges (a TCP client, as the tests make them).
    #[cfg(test)]
    pub fn connect_with(
        host: &str,
        local: &Endpoint,
        sizes: (u32, u64, Option<Duration>),
        secret: &dyn Fn() -> Result<Secret>,
    ) -> Result<RemotePeer> {
        Self::connect_cm(host, local, sizes, secret, Cm::Tcp)
    }

    /// [`connect`](Self::connect) with the secret from `secret`, asking, with `Cm::Rdma`,
    /// for the server's rdma_cm rendezvous instead of its QP.
    fn connect_cm(
        host: &str,
        local: &Endpoint,
        (wrs, size, run): (u32, u64, Option<Duration>),
        secret: &dyn Fn() -> Result<Secret>,
        cm: Cm,
    ) -> Result<RemotePeer> {
        let (name, port) = host_and_port(host)?;
        let address = show_address(&name, port);
        let addrs: Vec<_> = (name.as_str(), port)
            .to_socket_addrs()
            .with_context(|| format!("cannot resolve {address}"))?
            .collect();
        let mut last = None;
        let stream = addrs
            .iter()
            .find_map(|a| {
                TcpStream::connect_timeout(a, Duration::from_secs(5))
                    .map_err(|e| last = Some(e))
                    .ok()
            })
            .with_context(|| {
                let why = last.map_or("no address".to_string(), |e| e.to_string());
                format!("cannot connect to selsig serve at {address} ({why}): is it running?")
            })?;
        let mut writer = stream.try_clone()?;
        let mut reader = BufReader::new(Timed::new(stream, REPLY_WAIT));
        let hello = serde_json::to_string(&Hello {
            version: PROTOCOL,
            qp: Wire::from_endpoint(local),
            wrs,
            size,
            run_s: run.map_or(0, |d| d.as_secs().saturating_add(1)),
            rdma_cm: cm == Cm::Rdma,
        })?;
        send_line(&mut writer, hello.clone())?;
        let reply = |reader: &mut BufReader<Timed>| {
            receive_within::<Reply>(reader, "server's reply", REPLY_WAIT, MAX_SHORT)
                .with_context(|| format!("selsig serve at {address} did not answer"))
        };
        let mut answer = reply(&mut reader)?;
        if let Reply::Challenge(Challenge { challenge }) = &answer {
            let secret = secret().with_context(|| {
                format!("selsig serve at {address} lets in only clients that know its secret")
            })?;
            send(
                &mut writer,
                &handshake::proof(&secret, challenge, hello.as_bytes())?,
            )?;
            answer = reply(&mut reader)?;
        }
        let welcome = match answer {
            Reply::Welcome(_) if cm == Cm::Rdma => bail!(
                "selsig serve at {address} does not connect through rdma_cm (a selsig from \
                 before --cm): use --cm tcp"
            ),
            Reply::Welcome(w) => w,
            Reply::Rendezvous(r) if cm == Cm::Rdma => {
                ensure!(
                    r.version == PROTOCOL,
                    "selsig serve at {address} speaks version {} of the exchange, this \
                     selsig {PROTOCOL}: run the same selsig on both sides",
                    r.version
                );
                return Ok(RemotePeer {
                    endpoint: None,
                    // Until the rdma_cm accept gives it.
                    target: RemoteAddr { addr: 0, rkey: 0 },
                    device: printable(&r.device, 64),
                    rendezvous: Some(r),
                    cm: None,
                    reader,
                    writer,
                    slots: wrs,
                    address,
                });
            }
            Reply::Rendezvous(_) => {
                bail!(
                    "selsig serve at {address} answered with an rdma_cm rendezvous, not asked for"
                )
            }
            Reply::Refusal(r) => bail!(
                "selsig serve at {address} refused: {}",
                printable(&r.error, MAX_REFUSAL)
            ),
            Reply::Challenge(_) => bail!("selsig serve at {address} challenged the proof itself"),
        };
        ensure!(
            welcome.version == PROTOCOL,
            "selsig serve at {address} speaks version {} of the exchange, this selsig {PROTOCOL}: \
             run the same selsig on both sides",
            welcome.version
        );
        Ok(RemotePeer {
            endpoint: Some(welcome.qp.endpoint()?),
            rendezvous: None,
            cm: None,
            target: RemoteAddr {
                addr: welcome.addr,
                rkey: welcome.rkey,
            },
            // Printed: no control characters from the peer reach the terminal.
            device: printable(&welcome.device, 64),
            reader,
            writer,
            slots: wrs,
            address,
        })
    }

    /// Connects `qp` to the queue pair of the server at `host` (through `cm`), which holds
    /// `slots` slots of `slot` bytes (at least 1) for it; `run` is how long the run takes at
    /// most, when known.
    pub fn open<Q: QueuePair>(
        qp: &Q,
        options: &ConnectOptions,
        (host, cm): (&str, Cm),
        slots: u32,
        slot: u64,
        run: Option<Duration>,
    ) -> Result<RemotePeer> {
        let mine = qp.endpoint(options)?;
        let want = u64::from(slots).saturating_mul(slot.max(1));
        let mut remote = RemotePeer::connect(host, &mine, slots, slot, run, cm)?;
        match (&remote.endpoint, remote.rendezvous.take()) {
            (Some(theirs), _) => {
                remote.fits(want)?;
                qp.connect(theirs, options).with_context(|| {
                    format!(
                        "cannot connect to the server's queue pair{}",
                        gid_hint(&mine, theirs, "server")
                    )
                })?
            }
            (None, Some(r)) => {
                rdma::connect(qp, &mut remote, &r, options, want)?;
                remote.fits(want)?;
            }
            (None, None) => bail!("selsig serve gave neither its queue pair nor a rendezvous"),
        }
        Ok(remote)
    }

    /// The server's region holds `want` bytes below 2^64 (the client computes addresses in
    /// it).
    fn fits(&self, want: u64) -> Result<()> {
        ensure!(
            self.target.addr.checked_add(want).is_some(),
            "selsig serve at {} gave a region at {:#x}, where {want} bytes do not fit below \
             2^64",
            self.address,
            self.target.addr
        );
        Ok(())
    }

    /// Ends the session with the digest of the server's region
    /// ([`selsig_scenario::fnv1a64`]), asked for once the client's work is done.
    pub fn digest(mut self) -> Result<u64> {
        let check = Check {
            completed: Vec::new(),
            verify: false,
            digest: true,
        };
        let checked = self.end(
            &check,
            ("server's digest", "to give its region's digest"),
            MAX_SHORT,
        )?;
        let digest = checked.digest.with_context(|| {
            format!(
                "selsig serve at {} sent no digest of its region (a selsig from before \
                 `selsig run --connect`): run the same selsig on both sides",
                self.address
            )
        })?;
        match digest.len() == 16 && digest.bytes().all(|b| b.is_ascii_hexdigit()) {
            true => u64::from_str_radix(&digest, 16).ok(),
            false => None,
        }
        .with_context(|| {
            format!(
                "selsig serve at {} sent a digest that is not 16 hex digits: {:?}",
                self.address,
                printable(&digest, 64)
            )
        })
    }

    /// Tells the server which WRITEs completed; returns those whose bytes differ.
    pub fn check(mut self, completed: Vec<u32>) -> Result<Vec<u32>> {
        let check = Check {
            completed,
            verify: true,
            digest: false,
        };
        let checked = self.end(&check, ("server's check", "the outcomes"), MAX_LINE)?;
        let mut mismatches = checked.mismatches;
        if let Some(wr) = mismatches.iter().find(|&&wr| wr == 0 || wr > self.slots) {
            bail!(
                "the server's check names WRITE {wr}, which was not posted (1 to {})",
                self.slots
            );
        }
        // Each slot once, in order, however the server lists them.
        mismatches.sort_unstable();
        mismatches.dedup();
        Ok(mismatches)
    }

    /// Ends the session without a check (the client wrote bytes the server cannot know).
    pub fn finish_unchecked(mut self) -> Result<()> {
        let check = Check {
            completed: Vec::new(),
            verify: false,
            digest: false,
        };
        self.end(
            &check,
            ("server's reply", "the end of the session"),
            MAX_SHORT,
        )
        .map(drop)
    }

    /// Ends the session: sends `check`, disconnects the queue pairs (the run is over), and
    /// reads the server's answer (`what`: its name, and what a refusal refused; at most
    /// `max` bytes); a refusal is an error.
    fn end(&mut self, check: &Check, what: (&str, &str), max: u64) -> Result<Checked> {
        send(&mut self.writer, check)?;
        rdma::hang_up(self.cm.take(), &self.address);
        match receive_within::<CheckReply>(&mut self.reader, what.0, REPLY_WAIT, max)? {
            CheckReply::Checked(checked) => Ok(checked),
            CheckReply::Refusal(r) => bail!(
                "selsig serve refused {}: {}",
                what.1,
                printable(&r.error, MAX_REFUSAL)
            ),
        }
    }
}

/// The other end of a command's WRITEs: a peer QP and a region on the same device, or
/// `selsig serve` in another process or host.
pub enum Peer<D: Device> {
    /// (Fields drop in order: the QP before its CQ.)
    Local {
        region: D::Mr,
        _qp: D::Qp,
        _cq: D::Cq,
    },
    Remote(Box<RemotePeer>),
}

impl<D: Device> Peer<D> {
    /// Sets up `slots` slots of `slot` bytes (at least 1) of target memory, in this
    /// process or at `connect`'s server, and connects `qp` to its queue pair; `run` is how
    /// long the run takes at most, when known (a server waits that long for the outcomes).
    #[allow(clippy::too_many_arguments)]
    pub fn open(
        dev: &D,
        pd: &D::Pd,
        qp: &D::Qp,
        options: &ConnectOptions,
        connect: Option<(&str, Cm)>,
        slots: u32,
        slot: u64,
        run: Option<Duration>,
    ) -> Result<Peer<D>> {
        if let Some((host, cm)) = connect {
            let remote = RemotePeer::open(qp, options, (host, cm), slots, slot, run)?;
            return Ok(Peer::Remote(Box::new(remote)));
        }
        let cq = dev
            .create_cq(2)
            .context("cannot create the peer's completion queue")?;
        let init = QpInit {
            caps: QpCaps {
                max_send_wr: 1,
                max_recv_wr: 1,
                ..QpCaps::default()
            },
            sq_sig_all: false,
        };
        let peer = dev
            .create_qp(pd, &cq, &cq, &init)
            .context("cannot create the peer queue pair")?;
        connect_pair(qp, &peer, options).context("cannot connect the queue pairs")?;
        let bytes = slots as usize * slot.max(1) as usize;
        let region = dev
            .reg_mr(pd, bytes, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
            .with_context(|| format!("cannot register the {bytes}-byte remote region"))?;
        Ok(Peer::Local {
            region,
            _qp: peer,
            _cq: cq,
        })
    }

    /// Where the WRITEs go: the start of the target memory.
    pub fn target(&self) -> RemoteAddr {
        match self {
            Peer::Local { region, .. } => region.remote(0),
            Peer::Remote(remote) => remote.target,
        }
    }

    /// For an error of the run: what became of the server, if it closed the connection;
    /// empty otherwise.
    pub fn closed_note(&self) -> String {
        match self {
            Peer::Remote(remote) if rdma::disconnected(remote) => format!(
                " (selsig serve at {} disconnected the rdma_cm connection, \
                 RDMA_CM_EVENT_DISCONNECTED: was it stopped?)",
                remote.address
            ),
            Peer::Remote(remote) => match remote.closed() {
                None => String::new(),
                Some(why) if why.is_empty() => format!(
                    " (selsig serve at {} closed the connection: was it stopped?)",
                    remote.address
                ),
                Some(why) => format!(
                    " (selsig serve at {} gave up and closed the connection: {why})",
                    remote.address
                ),
            },
            Peer::Local { .. } => String::new(),
        }
    }
}

/// Hold a target region and a QP for `selsig demo --connect` and `selsig bench --connect`
/// clients.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// The TCP port to listen on.
    #[arg(allow_negative_numbers = true, long, short = 'p', default_value_t = DEFAULT_PORT)]
    pub port: u16,
    /// The address to listen on.
    #[arg(long, default_value = "0.0.0.0")]
    pub bind: String,
    /// Serve one session, then exit: 0 if its check passed, 1 otherwise (1 too if a
    /// client is refused before one is admitted; a connection without a hello is not a
    /// client). A demo is one session; a bench sweep
    /// opens one for its warm-up and one per point (serve it without --once), a
    /// perftest-mode bench one.
    #[arg(long)]
    pub once: bool,
    /// The secret clients must prove they know, from this file (64 hex digits). Without
    /// it, SELSIG_SECRET's, or else a fresh one, printed at start.
    #[arg(long, value_name = "FILE", conflicts_with = "insecure")]
    pub secret_file: Option<PathBuf>,
    /// Let in every client, with no secret: anyone who reaches the port gets a key to
    /// write into this host's memory.
    #[arg(long)]
    pub insecure: bool,
    /// The most target memory registered for one client (up to 4GiB).
    #[arg(long, value_parser = parse_size, default_value = "1GiB", value_name = "BYTES")]
    pub max_memory: u64,
    /// The longest run a client may announce (up to a day).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "1h", value_name = "TIME")]
    pub max_run: Duration,
    /// How long a session may stay silent beyond the run its client announced (for a
    /// client that announced none, its whole run) before the server ends it.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "5m", value_name = "TIME")]
    pub idle_timeout: Duration,
    #[command(flatten)]
    pub provider: ProviderArgs,
}

/// Who a server lets in, and what one client may make it spend.
#[derive(Debug, Clone)]
pub struct Gate {
    /// The secret clients must prove they know; `None`: `--insecure`.
    pub secret: Option<Secret>,
    pub limits: Limits,
}

impl ServeArgs {
    /// The server's limits, as the flags set them.
    fn limits(&self) -> Limits {
        Limits {
            max_bytes: self.max_memory,
            max_wrs: MAX_WRS,
            max_run: self.max_run,
            idle: self.idle_timeout,
        }
    }

    /// The secret: `--secret-file`'s, `SELSIG_SECRET`, or a fresh one (and whether it is
    /// fresh, to be printed); `None` with `--insecure`.
    fn secret(&self) -> Result<Option<(Secret, bool)>> {
        if self.insecure {
            return Ok(None);
        }
        if let Some(path) = &self.secret_file {
            return Ok(Some((read_secret(path)?, false)));
        }
        if let Ok(text) = std::env::var(SECRET_VAR) {
            let secret =
                Secret::parse(&text).with_context(|| format!("{SECRET_VAR} is not a secret"))?;
            return Ok(Some((secret, false)));
        }
        Ok(Some((Secret::generate()?, true)))
    }
}

/// `selsig serve` serves RDMA clients in other processes: the verbs provider only.
pub fn validate(args: &ServeArgs) -> Result<()> {
    ensure!(
        args.provider.provider == crate::common::ProviderKind::Verbs,
        "selsig serve needs --provider verbs (the soft NIC connects queue pairs of one process only)"
    );
    ensure!(
        !args.bind.trim().is_empty(),
        "--bind '': no address given (a name or an IP address of this host)"
    );
    ensure!(
        (1..=MAX_REGION).contains(&args.max_memory),
        "--max-memory {}: 1 byte to {MAX_REGION} (4GiB)",
        args.max_memory
    );
    ensure!(
        args.max_run <= MAX_RUN,
        "--max-run {}: at most a day",
        humantime::format_duration(args.max_run)
    );
    ensure!(
        !args.idle_timeout.is_zero() && args.idle_timeout <= MAX_RUN,
        "--idle-timeout {}: more than 0, at most a day",
        humantime::format_duration(args.idle_timeout)
    );
    // A secret file that cannot be read, or SELSIG_SECRET that is no secret, is found
    // before the device is opened.
    args.secret()?;
    (bind_host(&args.bind), args.port)
        .to_socket_addrs()
        .with_context(|| {
            format!(
                "--bind {}: not an address of this host (a name or an IP address, no port: \
                 that is --port)",
                args.bind
            )
        })?;
    Ok(())
}

/// `--bind`'s address, an IPv6 address taken with or without brackets (`[::1]`, as
/// `--connect` writes it).
fn bind_host(bind: &str) -> &str {
    bind.strip_prefix('[')
        .and_then(|b| b.strip_suffix(']'))
        .unwrap_or(bind)
}

impl OnDevice for &ServeArgs {
    type Output = bool;

    fn run<D: Device>(self, dev: &D, info: &DeviceInfo) -> Result<bool> {
        let listener = TcpListener::bind((bind_host(&self.bind), self.port)).map_err(|e| {
            let not_ours = e.kind() == std::io::ErrorKind::AddrNotAvailable;
            let e = anyhow::Error::new(e)
                .context(format!("cannot listen on {}:{}", self.bind, self.port));
            if not_ours {
                e.context(crate::common::BadOption(
                    "--bind names an address this host does not have",
                ))
            } else {
                e
            }
        })?;
        let at = listener
            .local_addr()
            .context("cannot read the listening address")?;
        let secret = match self.secret()? {
            Some((secret, fresh)) => {
                if fresh {
                    say!(
                        "selsig serve: clients must know this server's secret: on each, \
                         {SECRET_VAR}={} selsig demo --connect HOST (or the secret in a file \
                         named by {SECRET_FILE_VAR})",
                        secret.to_hex()
                    );
                }
                Some(secret)
            }
            None => {
                say!(
                    "selsig serve: --insecure: every client that reaches {at} gets a key to \
                     write into this host's memory"
                );
                None
            }
        };
        say!(
            "selsig serve: {} ({} provider) listening on {at}",
            info.device,
            info.provider.as_str(),
        );
        let gate = Gate {
            secret,
            limits: self.limits(),
        };
        serve_on(&listener, dev, info, &gate, self.once)
    }
}

/// The WRITEs 1..=`wrs` (`size` bytes each, `slot` apart in `region`) whose bytes are not
/// what their outcome says: the pattern if `completed` (sorted) has them, zeros if not.
/// Compared a piece at a time: a WRITE may be as large as the region (1 GiB).
fn mismatches<M: MemoryRegion>(
    region: &M,
    wrs: u32,
    size: usize,
    slot: usize,
    completed: &[u32],
) -> Result<Vec<u32>> {
    let mut bad = Vec::new();
    let mut got = vec![0u8; size.min(CHECK_CHUNK)];
    for wr in 1..=wrs {
        let start = (wr as usize - 1) * slot;
        let landed = completed.binary_search(&wr).is_ok();
        let pattern = Pattern::new(u64::from(wr));
        let mut holds = true;
        for from in (0..size).step_by(CHECK_CHUNK) {
            let piece = &mut got[..CHECK_CHUNK.min(size - from)];
            region.read(start + from, piece)?;
            holds = piece
                .iter()
                .enumerate()
                .all(|(i, &b)| b == if landed { pattern.byte(from + i) } else { 0 });
            if !holds {
                break;
            }
        }
        if !holds {
            bad.push(wr);
        }
    }
    Ok(bad)
}

/// The FNV-1a digest of `region`'s bytes ([`selsig_scenario::fnv1a64`]), read a piece at
/// a time.
fn digest<M: MemoryRegion>(region: &M) -> Result<u64> {
    let mut h = selsig_scenario::Fnv1a64::default();
    let mut piece = vec![0u8; region.len().min(CHECK_CHUNK)];
    for from in (0..region.len()).step_by(CHECK_CHUNK) {
        let piece = &mut piece[..CHECK_CHUNK.min(region.len() - from)];
        region.read(from, piece)?;
        h.update(piece);
    }
    Ok(h.finish())
}

/// Tells the client why it is not served (as far as it still listens); returns `e`.
fn refuse(writer: &mut TcpStream, e: anyhow::Error) -> anyhow::Error {
    let _ = send(
        writer,
        &Refusal {
            error: format!("{e:#}"),
        },
    );
    e
}

/// The server's QP and region for one client.
struct Prepared<D: Device> {
    qp: D::Qp,
    region: D::Mr,
    _cq: Arc<D::Cq>,
    _pd: D::Pd,
}

/// The server's objects for a client whose hello [`handshake::admit`] took, connected to
/// its QP; and the server QP's address.
fn prepare<D: Device>(
    dev: &D,
    info: &DeviceInfo,
    hello: &Hello,
    theirs: &Endpoint,
) -> Result<(Prepared<D>, Endpoint)> {
    let p = create(dev, hello)?;
    let options = ConnectOptions {
        gid_index: info.gid_index,
        port: info.port,
        ..ConnectOptions::default()
    };
    let mine = p.qp.endpoint(&options)?;
    p.qp.connect(theirs, &options).with_context(|| {
        format!(
            "cannot connect to the client's QP{}",
            gid_hint(&mine, theirs, "client")
        )
    })?;
    Ok((p, mine))
}

/// The server's objects for a client whose hello [`handshake::admit`] took: a QP in the
/// RESET state and the target region.
fn create<D: Device>(dev: &D, hello: &Hello) -> Result<Prepared<D>> {
    let bytes = u64::from(hello.wrs).saturating_mul(hello.size.max(1));
    let pd = dev
        .alloc_pd()
        .context("cannot allocate a protection domain")?;
    let cq = Arc::new(
        dev.create_cq(16)
            .context("cannot create the completion queue")?,
    );
    let init = QpInit {
        caps: QpCaps {
            max_send_wr: 1,
            max_recv_wr: 1,
            ..QpCaps::default()
        },
        sq_sig_all: false,
    };
    let qp = dev
        .create_qp(&pd, &cq, &cq, &init)
        .context("cannot create the queue pair")?;
    let region = dev
        .reg_mr(
            &pd,
            bytes as usize,
            Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        )
        .context("cannot register the target region")?;
    Ok(Prepared {
        qp,
        region,
        _cq: cq,
        _pd: pd,
    })
}

/// What a session came to: the slots checked, those whose bytes are not as the outcomes
/// say, and the region's digest (its length and digest) where the client asked for it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Session {
    pub slots: u32,
    pub mismatches: Vec<u32>,
    pub digest: Option<(usize, u64)>,
}

impl Session {
    /// The slots checked and the mismatches, as the tests compare them.
    #[cfg(test)]
    pub(crate) fn checked(self) -> (u32, Vec<u32>) {
        (self.slots, self.mismatches)
    }
}

/// The rest of a session, the client told where to write: its outcomes (then
/// `outcomes_read`), the check of the region, the answer.
fn finish<D: Device>(
    p: Prepared<D>,
    hello: &Hello,
    limits: &Limits,
    reader: &mut BufReader<Timed>,
    writer: &mut TcpStream,
    outcomes_read: &mut dyn FnMut(),
) -> Result<Session> {
    let Prepared { qp, region, .. } = p;
    let slot = hello.size.max(1);
    let wait = limits.idle + Duration::from_secs(hello.run_s);
    let mut check: Check = receive_within(reader, "client's outcomes", wait, MAX_LINE)
        .map_err(|e| refuse(writer, e))?;
    outcomes_read();
    check.completed.sort_unstable();
    handshake::posted_once(&check.completed, hello.wrs).map_err(|e| refuse(writer, e))?;
    let checked = if check.verify { hello.wrs } else { 0 };
    let mismatches = mismatches(
        &region,
        checked,
        hello.size as usize,
        slot as usize,
        &check.completed,
    )
    .map_err(|e| refuse(writer, e))?;
    let digest = match check.digest {
        true => Some((
            region.len(),
            digest(&region).map_err(|e| refuse(writer, e))?,
        )),
        false => None,
    };
    send(
        writer,
        &Checked {
            mismatches: mismatches.clone(),
            digest: digest.map(|(_, d)| format!("{d:016x}")),
        },
    )
    .with_context(|| {
        // The server's own record of the check, which the client did not get.
        format!(
            "cannot send the check of {checked} slots: {} not as the outcomes say{}",
            mismatches.len(),
            match mismatches.len() {
                0 => String::new(),
                _ => format!(" (slots {:?})", &mismatches[..mismatches.len().min(10)]),
            }
        )
    })?;
    drop(qp);
    Ok(Session {
        slots: checked,
        mismatches,
        digest,
    })
}

mod scenario;
pub use scenario::ScenarioPeer;

#[cfg(test)]
mod gate_tests;

#[cfg(test)]
pub(crate) mod tests {
    use selsig_cli::handshake::Welcome;

    use super::*;

    /// A server that lets every client in, with the limits of a server before the secret.
    pub(crate) fn open_gate() -> Gate {
        Gate {
            secret: None,
            limits: Limits {
                max_bytes: MAX_REGION,
                max_wrs: MAX_WRS,
                max_run: MAX_RUN,
                idle: Duration::from_secs(300),
            },
        }
    }

    pub(crate) fn wire(gid: &str) -> Wire {
        Wire {
            qp_num: 1,
            psn: 0,
            lid: 0,
            gid: gid.to_string(),
            mtu: 0,
            rd_atomic: 0,
        }
    }

    #[test]
    fn bind_takes_an_ipv6_address_with_or_without_brackets() {
        assert_eq!(bind_host("[::1]"), "::1");
        assert_eq!(bind_host("::1"), "::1");
        assert_eq!(bind_host("0.0.0.0"), "0.0.0.0");
        assert_eq!(bind_host("[::1"), "[::1");
        let addrs: Vec<_> = (bind_host("[::1]"), 9000)
            .to_socket_addrs()
            .unwrap()
            .collect();
        assert_eq!(
            addrs,
            [std::net::SocketAddr::from((
                [0u16, 0, 0, 0, 0, 0, 0, 1],
                9000
            ))]
        );
    }

    /// A listener on the loopback, and the address to connect to it.
    pub(crate) fn local_listener() -> (TcpListener, String) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let at = listener.local_addr().unwrap().to_string();
        (listener, at)
    }

    /// A server in a thread: `serve` gets the first connection (a reader and a writer);
    /// returns the address to connect to.
    pub(crate) fn fake_server(
        serve: impl FnOnce(BufReader<TcpStream>, TcpStream) + Send + 'static,
    ) -> (String, std::thread::JoinHandle<()>) {
        let (listener, at) = local_listener();
        let server = std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            let writer = stream.try_clone().unwrap();
            serve(BufReader::new(stream), writer);
        });
        (at, server)
    }

    /// A welcome to a client, from a server of `device`.
    pub(crate) fn welcome(device: &str) -> Welcome {
        Welcome {
            version: PROTOCOL,
            qp: wire(&"0".repeat(32)),
            addr: 4096,
            rkey: 7,
            device: device.into(),
        }
    }

    /// A local listener and a connection to it: (the accepted side, the connecting side).
    fn tcp_pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        (server, client)
    }

    #[test]
    fn a_peer_that_sends_a_byte_now_and_then_runs_out_of_time_for_its_message() {
        let (server, mut client) = tcp_pair();
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let trickle = {
            let done = Arc::clone(&done);
            std::thread::spawn(move || {
                // A byte every 50 ms, for up to 5 s: each read gets one within any per-read
                // timeout.
                for _ in 0..100 {
                    if done.load(std::sync::atomic::Ordering::Relaxed)
                        || client.write_all(b" ").is_err()
                    {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
            })
        };
        let wait = Duration::from_millis(300);
        let mut reader = BufReader::new(Timed::new(server, wait));
        let start = Instant::now();
        let err = receive_within::<Hello>(&mut reader, "client's hello", wait, MAX_SHORT)
            .expect_err("no hello")
            .to_string();
        let took = start.elapsed();
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        // Well before the trickle ends (a deadline armed again by each byte would wait for
        // that), with room for a slow machine.
        assert!(
            took >= wait && took < Duration::from_millis(3500),
            "{took:?}"
        );
        assert_eq!(err, "no client's hello came within 300ms");
        trickle.join().unwrap();
    }

    #[test]
    fn a_client_refuses_a_check_that_names_writes_it_did_not_post_and_escapes_the_device() {
        let (at, server) = fake_server(|mut reader, mut writer| {
            let hello: Hello = receive(&mut reader, "client's hello", MAX_SHORT).unwrap();
            assert_eq!((hello.wrs, hello.run_s), (4, 3));
            send(&mut writer, &welcome("rxe0\u{1b}[2J\nfake line")).unwrap();
            let _: Check = receive(&mut reader, "client's outcomes", MAX_LINE).unwrap();
            send(
                &mut writer,
                &Checked {
                    mismatches: vec![2, 5],
                    digest: None,
                },
            )
            .unwrap();
        });
        let mine = wire(&"0".repeat(32)).endpoint().unwrap();
        let peer = RemotePeer::connect(
            &at,
            &mine,
            4,
            64,
            Some(Duration::from_millis(2500)),
            Cm::Tcp,
        )
        .unwrap();
        assert_eq!(peer.device, "rxe0\\u{1b}[2J\\nfake line");
        let err = peer.check(vec![1, 2]).expect_err("WRITE 5").to_string();
        assert_eq!(
            err,
            "the server's check names WRITE 5, which was not posted (1 to 4)"
        );
        server.join().unwrap();
    }

    #[test]
    fn both_sides_refuse_a_peer_of_another_version_of_the_exchange() {
        // The server, before it challenges the client or creates anything for it.
        let old: Hello = serde_json::from_str(&format!(
            r#"{{"qp":{},"wrs":8,"size":64}}"#,
            serde_json::to_string(&wire(&"0".repeat(32))).unwrap()
        ))
        .unwrap();
        let err = handshake::version(&old).expect_err("refused").to_string();
        assert_eq!(
            err,
            "the client speaks version 0 of the exchange, this server 2: run the same selsig \
             on both sides"
        );
        // The client, of a server that sent no version.
        let (listener, at) = local_listener();
        let server = std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let _: Hello = receive(&mut reader, "client's hello", MAX_SHORT).unwrap();
            let welcome = format!(
                r#"{{"qp":{},"addr":0,"rkey":1,"device":"rxe0"}}"#,
                serde_json::to_string(&wire(&"0".repeat(32))).unwrap()
            );
            stream.write_all(format!("{welcome}\n").as_bytes()).unwrap();
        });
        let mine = wire(&"0".repeat(32)).endpoint().unwrap();
        let err = RemotePeer::connect(&at, &mine, 4, 64, None, Cm::Tcp)
            .err()
            .expect("refused")
            .to_string();
        assert_eq!(
            err,
            format!(
                "selsig serve at {at} speaks version 0 of the exchange, this selsig 2: run the \
                 same selsig on both sides"
            )
        );
        server.join().unwrap();
    }

    /// A soft NIC, a protection domain and a CQ on it, for the QPs of clients.
    pub(crate) fn soft_device() -> (
        selsig_soft::SoftDevice,
        selsig_soft::SoftPd,
        selsig_soft::SoftCq,
    ) {
        let dev = selsig_soft::SoftDevice::open(selsig_soft::SoftConfig::default()).unwrap();
        let pd = dev.alloc_pd().unwrap();
        let cq = dev.create_cq(4).unwrap();
        (dev, pd, cq)
    }

    pub(crate) fn soft_info() -> DeviceInfo {
        DeviceInfo {
            provider: crate::common::ProviderKind::Soft,
            device: "soft0".into(),
            personality: None,
            gid_index: None,
            rxe: false,
            port: 1,
            faults: None,
        }
    }

    /// A hello for `wrs` slots of `size` bytes and a run of `run_s` seconds, from a QP of
    /// `dev` (returned: it must outlive the exchange).
    pub(crate) fn hello_from<D: Device>(
        dev: &D,
        pd: &D::Pd,
        cq: &D::Cq,
        wrs: u32,
        size: u64,
        run_s: u64,
    ) -> (D::Qp, String) {
        let init = QpInit {
            caps: QpCaps {
                max_send_wr: 1,
                max_recv_wr: 1,
                ..QpCaps::default()
            },
            sq_sig_all: false,
        };
        let qp = dev.create_qp(pd, cq, cq, &init).unwrap();
        let mine = qp.endpoint(&ConnectOptions::default()).unwrap();
        let hello = Hello {
            version: PROTOCOL,
            qp: Wire::from_endpoint(&mine),
            wrs,
            size,
            run_s,
            rdma_cm: false,
        };
        (qp, serde_json::to_string(&hello).unwrap() + "\n")
    }

    /// What `serve_one` returns for a session of `wrs` slots of 64 bytes and a run of
    /// `run_s` seconds whose client says no WRITE completed.
    fn none_completed<D: Device>(
        dev: &D,
        pd: &D::Pd,
        cq: &D::Cq,
        wrs: u32,
        run_s: u64,
    ) -> Result<Session> {
        let (_qp, hello) = hello_from(dev, pd, cq, wrs, 64, run_s);
        let (server, mut client) = tcp_pair();
        client
            .write_all((hello + "{\"completed\":[]}\n").as_bytes())
            .unwrap();
        serve_one(dev, &soft_info(), &open_gate(), server)
    }

    /// The client's side of a session whose outcomes the server refused: a welcome, then
    /// the refusal `err` in place of the check.
    fn hears_outcomes_refused(client: TcpStream, err: &str) {
        let mut reader = BufReader::new(client);
        let _: Welcome = receive(&mut reader, "server's reply", MAX_SHORT).unwrap();
        let reply: CheckReply = receive(&mut reader, "server's check", MAX_LINE).unwrap();
        assert!(
            matches!(&reply, CheckReply::Refusal(r) if r.error == err),
            "{reply:?}"
        );
    }

    #[test]
    fn a_server_refuses_outcomes_of_writes_not_posted_or_named_twice() {
        let (dev, pd, cq) = soft_device();
        for (completed, why) in [
            (
                "[9,0,4294967295]",
                "WRITE 0, which it did not post (1 to 8)",
            ),
            ("[1,9]", "WRITE 9, which it did not post (1 to 8)"),
            ("[3,1,3]", "WRITE 3 twice"),
        ] {
            let (_qp, hello) = hello_from(&dev, &pd, &cq, 8, 64, 0);
            let (server, mut client) = tcp_pair();
            let check = format!("{{\"completed\":{completed}}}\n");
            client.write_all((hello + &check).as_bytes()).unwrap();
            let err = serve_one(&dev, &soft_info(), &open_gate(), server)
                .expect_err("refused")
                .to_string();
            assert_eq!(err, format!("the client's outcomes name {why}"));
            // The client hears why, in place of the check.
            hears_outcomes_refused(client, &err);
        }
        // Outcomes of WRITEs posted, each once, are checked.
        assert_eq!(
            none_completed(&dev, &pd, &cq, 8, 0).unwrap().checked(),
            (8, Vec::new())
        );
    }

    #[test]
    fn a_client_names_a_server_that_does_not_answer_and_one_that_closed_the_connection() {
        let mine = wire(&"0".repeat(32)).endpoint().unwrap();
        // No answer to the hello: the server is named (a busy one says so at once).
        let (at, server) = fake_server(|mut reader, _| {
            let _: Hello = receive(&mut reader, "client's hello", MAX_SHORT).unwrap();
        });
        let err = RemotePeer::connect(&at, &mine, 4, 64, None, Cm::Tcp)
            .err()
            .expect("no answer");
        assert_eq!(
            format!("{err:#}"),
            format!(
                "selsig serve at {at} did not answer: the peer closed the connection before the \
                 server's reply"
            )
        );
        server.join().unwrap();
        // A server that goes away after the welcome: the run's errors say so.
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let (at, server) = fake_server(move |mut reader, mut writer| {
            let _: Hello = receive(&mut reader, "client's hello", MAX_SHORT).unwrap();
            send(&mut writer, &welcome("rxe0")).unwrap();
            stopped.recv().unwrap();
        });
        let peer = RemotePeer::connect(&at, &mine, 4, 64, None, Cm::Tcp).unwrap();
        assert_eq!(peer.closed(), None);
        let peer: Peer<selsig_soft::SoftDevice> = Peer::Remote(Box::new(peer));
        assert_eq!(peer.closed_note(), "");
        stop.send(()).unwrap();
        server.join().unwrap();
        assert_eq!(
            closed_note_within(&peer),
            format!(" (selsig serve at {at} closed the connection: was it stopped?)")
        );
    }

    /// `peer`'s closed note, once it has one (the close takes a moment to arrive).
    fn closed_note_within(peer: &Peer<selsig_soft::SoftDevice>) -> String {
        let start = Instant::now();
        loop {
            let note = peer.closed_note();
            if !note.is_empty() {
                return note;
            }
            assert!(start.elapsed() < Duration::from_secs(5), "never closed");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// What prints is kept; what does not, or reorders a line (bidirectional controls,
    /// line separators), is escaped.
    #[test]
    fn a_peers_text_is_printed_as_it_prints() {
        assert_eq!(printable("rxe0 \"é\" 'x' \\ ü", 100), "rxe0 \"é\" 'x' \\ ü");
        assert_eq!(
            printable("a\u{1b}[2J\u{202e}b\u{2028}c\u{2066}\t", 100),
            "a\\u{1b}[2J\\u{202e}b\\u{2028}c\\u{2066}\\t"
        );
        assert_eq!(printable("abcdef", 3), "abc");
    }

    /// A server that gives up mid-run says why before it closes: the run's errors quote it.
    #[test]
    fn a_client_quotes_a_server_that_gave_up_mid_run() {
        let mine = wire(&"0".repeat(32)).endpoint().unwrap();
        // The refusal right after the welcome (read with it), and later (on the socket).
        for later in [false, true] {
            let (go, gone) = std::sync::mpsc::channel::<()>();
            let (at, server) = fake_server(move |mut reader, mut writer| {
                let _: Hello = receive(&mut reader, "client's hello", MAX_SHORT).unwrap();
                send(&mut writer, &welcome("rxe0")).unwrap();
                if later {
                    gone.recv().unwrap();
                }
                let error = "no client's outcomes came within 300s\u{1b}".to_string();
                send(&mut writer, &Refusal { error }).unwrap();
            });
            let peer = RemotePeer::connect(&at, &mine, 4, 64, None, Cm::Tcp).unwrap();
            let peer: Peer<selsig_soft::SoftDevice> = Peer::Remote(Box::new(peer));
            if later {
                assert_eq!(peer.closed_note(), "");
                go.send(()).unwrap();
            }
            server.join().unwrap();
            assert_eq!(
                closed_note_within(&peer),
                format!(
                    " (selsig serve at {at} gave up and closed the connection: no client's \
                     outcomes came within 300s\\u{{1b}})"
                ),
                "later: {later}"
            );
        }
    }

    /// The end of an unchecked session: a refusal is the server's, quoted, not a malformed
    /// reply.
    #[test]
    fn a_client_reports_a_server_that_refuses_an_unchecked_end() {
        let (at, server) = fake_server(|mut reader, mut writer| {
            let _: Hello = receive(&mut reader, "client's hello", MAX_SHORT).unwrap();
            send(&mut writer, &welcome("rxe0")).unwrap();
            let _: Check = receive(&mut reader, "client's outcomes", MAX_LINE).unwrap();
            let error = "no client's outcomes came within 300s".to_string();
            send(&mut writer, &Refusal { error }).unwrap();
        });
        let mine = wire(&"0".repeat(32)).endpoint().unwrap();
        let peer = RemotePeer::connect(&at, &mine, 4, 64, None, Cm::Tcp).unwrap();
        let err = peer.finish_unchecked().expect_err("refused").to_string();
        assert_eq!(
            err,
            "selsig serve refused the end of the session: no client's outcomes came within 300s"
        );
        server.join().unwrap();
    }

    /// A check that names a slot twice, or out of order, is taken as the set it names.
    #[test]
    fn a_servers_mismatches_are_each_slot_once_in_order() {
        let (at, server) = fake_server(|mut reader, mut writer| {
            let _: Hello = receive(&mut reader, "client's hello", MAX_SHORT).unwrap();
            send(&mut writer, &welcome("rxe0")).unwrap();
            let _: Check = receive(&mut reader, "client's outcomes", MAX_LINE).unwrap();
            send(
                &mut writer,
                &Checked {
                    mismatches: vec![3, 1, 3, 3, 1],
                    digest: None,
                },
            )
            .unwrap();
        });
        let mine = wire(&"0".repeat(32)).endpoint().unwrap();
        let peer = RemotePeer::connect(&at, &mine, 4, 64, None, Cm::Tcp).unwrap();
        assert_eq!(peer.check(vec![1, 2, 3, 4]).unwrap(), [1, 3]);
        server.join().unwrap();
    }

    #[test]
    fn a_client_reports_a_server_that_refuses_its_outcomes() {
        let (at, server) = fake_server(|mut reader, mut writer| {
            let _: Hello = receive(&mut reader, "client's hello", MAX_SHORT).unwrap();
            send(&mut writer, &welcome("rxe0")).unwrap();
            let _: Check = receive(&mut reader, "client's outcomes", MAX_LINE).unwrap();
            let error = "the client's outcomes name WRITE 3 twice".to_string();
            send(&mut writer, &Refusal { error }).unwrap();
        });
        let mine = wire(&"0".repeat(32)).endpoint().unwrap();
        let peer = RemotePeer::connect(&at, &mine, 4, 64, None, Cm::Tcp).unwrap();
        let err = peer.check(vec![3, 3]).expect_err("refused").to_string();
        assert_eq!(
            err,
            "selsig serve refused the outcomes: the client's outcomes name WRITE 3 twice"
        );
        server.join().unwrap();
    }

    /// What a server says in a refusal reaches the terminal with its control characters
    /// escaped, and at most 1000 characters of it: of the hello and of the outcomes.
    #[test]
    fn a_servers_refusal_is_printed_escaped_and_cut() {
        let error = format!("\u{1b}[2J\nfake: ok{}", "A".repeat(60_000));
        let shown = format!(
            "\\u{{1b}}[2J\\nfake: ok{}",
            "A".repeat(MAX_REFUSAL - "\u{1b}[2J\nfake: ok".chars().count())
        );
        let mine = wire(&"0".repeat(32)).endpoint().unwrap();
        let refusal = error.clone();
        let (at, server) = fake_server(move |mut reader, mut writer| {
            let _: Hello = receive(&mut reader, "client's hello", MAX_SHORT).unwrap();
            send(&mut writer, &Refusal { error: refusal }).unwrap();
        });
        let err = RemotePeer::connect(&at, &mine, 4, 64, None, Cm::Tcp)
            .err()
            .expect("refused")
            .to_string();
        assert_eq!(err, format!("selsig serve at {at} refused: {shown}"));
        server.join().unwrap();
        let (at, server) = fake_server(move |mut reader, mut writer| {
            let _: Hello = receive(&mut reader, "client's hello", MAX_SHORT).unwrap();
            send(&mut writer, &welcome("rxe0")).unwrap();
            let _: Check = receive(&mut reader, "client's outcomes", MAX_LINE).unwrap();
            send(&mut writer, &Refusal { error }).unwrap();
        });
        let peer = RemotePeer::connect(&at, &mine, 4, 64, None, Cm::Tcp).unwrap();
        let err = peer.check(vec![1]).expect_err("refused").to_string();
        assert_eq!(err, format!("selsig serve refused the outcomes: {shown}"));
        server.join().unwrap();
    }

    /// A hello or outcomes the server cannot take: the client hears why, not a closed
    /// connection (which it would blame on a busy server).
    #[test]
    fn a_server_tells_the_client_what_it_could_not_read() {
        let (dev, pd, cq) = soft_device();
        // A malformed hello.
        let (server, mut client) = tcp_pair();
        client.write_all(b"{\"wrs\":-1}\n").unwrap();
        let err = format!(
            "{:#}",
            serve_one(&dev, &soft_info(), &open_gate(), server).expect_err("bad")
        );
        assert!(
            err.starts_with(r#"the peer sent a malformed client's hello: "{\"wrs\":-1}": "#),
            "{err}"
        );
        let reply: Reply =
            receive(&mut BufReader::new(client), "server's reply", MAX_SHORT).unwrap();
        assert!(
            matches!(&reply, Reply::Refusal(r) if r.error == err),
            "{reply:?}"
        );
        // Malformed outcomes, after the welcome.
        let (_qp, hello) = hello_from(&dev, &pd, &cq, 8, 64, 0);
        let (server, mut client) = tcp_pair();
        client
            .write_all((hello + "{\"completed\":\"all\"}\n").as_bytes())
            .unwrap();
        let err = format!(
            "{:#}",
            serve_one(&dev, &soft_info(), &open_gate(), server).expect_err("bad")
        );
        assert!(
            err.starts_with("the peer sent a malformed client's outcomes"),
            "{err}"
        );
        hears_outcomes_refused(client, &err);
    }

    /// A message that reaches the length limit in the middle of a character is too long,
    /// not malformed.
    #[test]
    fn a_message_cut_inside_a_character_is_too_long() {
        let text = format!("{}\u{e9}\n", " ".repeat(99));
        let err = receive::<Hello>(&mut text.as_bytes(), "client's hello", 100)
            .expect_err("too long")
            .to_string();
        assert_eq!(err, "the peer sent a client's hello longer than 100 bytes");
    }

    #[test]
    fn a_server_refuses_a_run_longer_than_a_day_and_survives_any_length() {
        let (dev, pd, cq) = soft_device();
        // A day, which a client announces with the second it rounds up by, is served.
        let day = MAX_RUN.as_secs() + 1;
        assert_eq!(
            none_completed(&dev, &pd, &cq, 1, day).unwrap().checked(),
            (1, Vec::new())
        );
        for run_s in [MAX_RUN.as_secs() + 2, u64::MAX / 2, u64::MAX] {
            let (_qp, hello) = hello_from(&dev, &pd, &cq, 1, 64, run_s);
            let (server, mut client) = tcp_pair();
            client.write_all(hello.as_bytes()).unwrap();
            let err = serve_one(&dev, &soft_info(), &open_gate(), server)
                .expect_err("refused")
                .to_string();
            assert_eq!(
                err,
                format!(
                    "the client said its run takes {run_s} s: this server allows at most 86400 \
                     s (its --max-run)"
                )
            );
            // The client hears why.
            let mut reader = BufReader::new(client);
            let reply: Reply = receive(&mut reader, "server's reply", MAX_SHORT).unwrap();
            assert!(
                matches!(&reply, Reply::Refusal(r) if r.error == err),
                "{reply:?}"
            );
        }
    }

    /// `err` says the peer did not take a message, soon after `start` (the unit tests'
    /// wait is 3 s).
    fn gave_up(err: &str, start: Instant) {
        assert_eq!(err, "the peer did not take the message within 3s");
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{:?}",
            start.elapsed()
        );
    }

    #[test]
    fn a_server_gives_up_on_a_client_that_does_not_read_its_check() {
        let (dev, pd, cq) = soft_device();
        // Every WRITE said to have completed, none landed: the reply names every one,
        // megabytes that fill the socket's buffers.
        let wrs = MAX_WRS;
        let (_qp, hello) = hello_from(&dev, &pd, &cq, wrs, 1, 0);
        let (server, mut client) = tcp_pair();
        let check = serde_json::to_string(&Check {
            completed: (1..=wrs).collect(),
            verify: true,
            digest: false,
        })
        .unwrap()
            + "\n";
        let (done, stop) = std::sync::mpsc::channel::<()>();
        let quiet = std::thread::spawn(move || {
            client.write_all(hello.as_bytes()).unwrap();
            client.write_all(check.as_bytes()).unwrap();
            // Connected, reading nothing, until the server is done.
            let _ = stop.recv_timeout(Duration::from_secs(60));
        });
        let start = Instant::now();
        let err = serve_one(&dev, &soft_info(), &open_gate(), server).expect_err("given up");
        gave_up(&err.root_cause().to_string(), start);
        // The server's own record of what it found, which the client did not get.
        assert_eq!(
            err.to_string(),
            format!(
                "cannot send the check of {wrs} slots: {wrs} not as the outcomes say (slots \
                 [1, 2, 3, 4, 5, 6, 7, 8, 9, 10])"
            )
        );
        drop(done);
        quiet.join().unwrap();
    }

    #[test]
    fn a_client_gives_up_on_a_server_that_does_not_read_its_outcomes() {
        let (listener, at) = local_listener();
        let (done, stop) = std::sync::mpsc::channel::<()>();
        let server = std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            let mut writer = stream.try_clone().unwrap();
            let mut reader = BufReader::new(stream);
            let _: Hello = receive(&mut reader, "client's hello", MAX_SHORT).unwrap();
            send(
                &mut writer,
                &Welcome {
                    version: PROTOCOL,
                    qp: wire(&"0".repeat(32)),
                    addr: 0,
                    rkey: 1,
                    device: "rxe0".into(),
                },
            )
            .unwrap();
            // Connected, reading none of the outcomes, until the client is done.
            let _ = stop.recv_timeout(Duration::from_secs(60));
        });
        let mine = wire(&"0".repeat(32)).endpoint().unwrap();
        let wrs = MAX_WRS;
        let peer = RemotePeer::connect(&at, &mine, wrs, 1, None, Cm::Tcp).unwrap();
        let start = Instant::now();
        let err = peer
            .check((1..=wrs).collect())
            .expect_err("given up")
            .to_string();
        gave_up(&err, start);
        drop(done);
        server.join().unwrap();
    }

    #[test]
    fn a_connection_that_fails_says_why() {
        // A port nobody listens on: one a socket holds without listening (a port given back
        // could go to another test's listener meanwhile).
        use rustix::net::{AddressFamily, SocketType};
        let held = rustix::net::socket(AddressFamily::INET, SocketType::STREAM, None).unwrap();
        let loopback: std::net::SocketAddr = "127.0.0.1:0".parse().unwrap();
        rustix::net::bind(&held, &loopback).unwrap();
        let bound = rustix::net::getsockname(&held).unwrap();
        let at = std::net::SocketAddr::try_from(bound).unwrap().to_string();
        let mine = wire(&"0".repeat(32)).endpoint().unwrap();
        let err = RemotePeer::connect(&at, &mine, 4, 64, None, Cm::Tcp)
            .err()
            .expect("nobody listens")
            .to_string();
        assert!(
            err.starts_with(&format!(
                "cannot connect to selsig serve at {at} (Connection refused"
            )),
            "{err}"
        );
    }

    #[test]
    fn the_mtu_and_read_depth_travel_and_an_older_peer_without_them_reads_as_unknown() {
        let w: Wire = serde_json::from_str(
            r#"{"qp_num":1,"psn":2,"lid":0,"gid":"000000000000000000000000000000ff"}"#,
        )
        .unwrap();
        assert_eq!(w.endpoint().unwrap().mtu, 0);
        assert_eq!(w.endpoint().unwrap().rd_atomic, 0);
        let mut e = w.endpoint().unwrap();
        e.mtu = 1024;
        e.rd_atomic = 16;
        let back: Wire =
            serde_json::from_str(&serde_json::to_string(&Wire::from_endpoint(&e)).unwrap())
                .unwrap();
        assert_eq!(back.endpoint().unwrap(), e);
    }

    #[test]
    fn a_message_longer_than_the_limit_is_refused_without_reading_on() {
        let mut long = vec![b'['; MAX_LINE as usize + 10];
        long.push(b'\n');
        let mut r = std::io::Cursor::new(long);
        let err = receive::<Check>(&mut r, "client's outcomes", MAX_LINE)
            .expect_err("too long")
            .to_string();
        assert!(err.contains("longer than"), "{err}");
        let mut r = std::io::Cursor::new(b"{\"completed\":[3,1]}\n".to_vec());
        let check: Check = receive(&mut r, "client's outcomes", MAX_LINE).expect("a short message");
        assert_eq!(check.completed, [3, 1]);
        // The limit counts the newline: a message of exactly the limit is taken.
        let line = b"{\"completed\":[3,1]}\n";
        let max = line.len() as u64;
        let check: Check = receive(&mut &line[..], "client's outcomes", max).expect("at the limit");
        assert_eq!(check.completed, [3, 1]);
        let err = receive::<Check>(&mut &line[..], "client's outcomes", max - 1)
            .expect_err("one byte over")
            .to_string();
        assert_eq!(
            err,
            format!(
                "the peer sent a client's outcomes longer than {} bytes",
                max - 1
            )
        );
    }

    #[test]
    fn gids_of_different_kinds_get_a_hint() {
        let at = |gid: [u8; 16]| Endpoint {
            qp_num: 1,
            psn: 0,
            lid: 0,
            gid,
            mtu: 0,
            rd_atomic: 0,
        };
        let mut link_local = [0u8; 16];
        link_local[..2].copy_from_slice(&[0xfe, 0x80]);
        let mut mapped = [0u8; 16];
        mapped[10..].copy_from_slice(&[0xff, 0xff, 10, 77, 0, 1]);
        let hint = gid_hint(&at(mapped), &at(link_local), "server");
        assert!(
            hint.contains("IPv4-mapped") && hint.contains("server's link-local"),
            "{hint}"
        );
        assert_eq!(gid_hint(&at(mapped), &at(mapped), "server"), "");
        // Link-local is fe80::/10: febf:: is, fec0:: is not.
        let prefixed = |bytes: [u8; 2]| {
            let mut gid = [0u8; 16];
            gid[..2].copy_from_slice(&bytes);
            gid[15] = 1;
            gid
        };
        assert_eq!(
            gid_hint(&at(prefixed([0xfe, 0xbf])), &at(link_local), "server"),
            ""
        );
        let hint = gid_hint(&at(prefixed([0xfe, 0xc0])), &at(link_local), "client");
        assert!(
            hint.contains("side's GID is global, the client's link-local"),
            "{hint}"
        );
        // IPv4-mapped is ::ffff:a.b.c.d, not any GID of ten zero bytes first (::1).
        let hint = gid_hint(&at(prefixed([0, 0])), &at(mapped), "server");
        assert!(
            hint.contains("side's GID is global, the server's IPv4-mapped"),
            "{hint}"
        );
    }

    #[test]
    fn a_malformed_gid_from_the_peer_is_an_error() {
        let good = format!("fe80{}", "0".repeat(26) + "01");
        let e = wire(&good).endpoint().expect("32 hex digits");
        assert_eq!((e.gid[0], e.gid[1], e.gid[15]), (0xfe, 0x80, 0x01));
        // 32 bytes but not 32 characters (slicing it by bytes would split a character), a
        // sign the integer parser would take, too few digits.
        let multibyte = format!("a{}b", "é".repeat(15));
        assert_eq!(multibyte.len(), 32);
        let signed = format!("+{}", "0".repeat(31));
        for bad in [multibyte.as_str(), signed.as_str(), "fe80"] {
            let err = wire(bad).endpoint().expect_err(bad).to_string();
            assert!(err.contains("malformed GID"), "{err}");
        }
        // A long one is shown cut to 200 characters.
        let err = wire(&"g".repeat(300)).endpoint().unwrap_err().to_string();
        assert_eq!(
            err,
            format!(
                "the peer sent a malformed GID {:?}: not 32 hex digits",
                "g".repeat(200)
            )
        );
    }

    #[test]
    fn a_qp_number_beyond_24_bits_from_the_peer_is_an_error() {
        let gid = "0".repeat(32);
        let mut w = wire(&gid);
        w.qp_num = 0x00ff_ffff;
        assert!(w.endpoint().is_ok());
        w.qp_num = 0x0100_0000;
        let err = w.endpoint().unwrap_err().to_string();
        assert!(err.contains("24 bits"), "{err}");
    }

    #[test]
    fn the_server_finds_every_write_whose_bytes_are_not_its_outcome_across_pieces() {
        use selsig_soft::SoftDevice;
        let dev = SoftDevice::open(selsig_soft::SoftConfig::default()).unwrap();
        let pd = dev.alloc_pd().unwrap();
        // Four WRITEs of a piece and a half each: 1 and 3 completed, 2 and 4 not.
        let size = CHECK_CHUNK + CHECK_CHUNK / 2;
        let region = dev.reg_mr(&pd, 4 * size, Access::LOCAL_WRITE).unwrap();
        for wr in [1u32, 3] {
            region
                .write(
                    (wr as usize - 1) * size,
                    &crate::common::pattern(u64::from(wr), size),
                )
                .unwrap();
        }
        assert_eq!(
            mismatches(&region, 4, size, size, &[1, 3]).unwrap(),
            [0u32; 0]
        );
        // Said the other way round, all four are wrong.
        assert_eq!(
            mismatches(&region, 4, size, size, &[2, 4]).unwrap(),
            [1, 2, 3, 4]
        );
        // One byte off in the second piece of WRITE 3; one byte landed in WRITE 4's.
        region.write(2 * size + CHECK_CHUNK + 7, &[0]).unwrap();
        region.write(3 * size + size - 1, &[9]).unwrap();
        assert_eq!(mismatches(&region, 4, size, size, &[1, 3]).unwrap(), [3, 4]);
        // One byte off in the first piece of WRITE 1, whose last piece is right.
        region.write(7, &[0]).unwrap();
        assert_eq!(
            mismatches(&region, 4, size, size, &[1, 3]).unwrap(),
            [1, 3, 4]
        );
    }

    #[test]
    fn a_client_takes_a_check_of_its_last_slot_and_refuses_one_of_write_0() {
        let mine = wire(&"0".repeat(32)).endpoint().unwrap();
        for (named, expected) in [
            (4, Ok(vec![4])),
            (
                0,
                Err("the server's check names WRITE 0, which was not posted (1 to 4)"),
            ),
        ] {
            let (at, server) = fake_server(move |mut reader, mut writer| {
                let _: Hello = receive(&mut reader, "client's hello", MAX_SHORT).unwrap();
                send(&mut writer, &welcome("rxe0")).unwrap();
                let _: Check = receive(&mut reader, "client's outcomes", MAX_LINE).unwrap();
                let mismatches = vec![named];
                let digest = None;
                send(&mut writer, &Checked { mismatches, digest }).unwrap();
            });
            let peer = RemotePeer::connect(&at, &mine, 4, 64, None, Cm::Tcp).unwrap();
            let got = peer.check(vec![1]).map_err(|e| e.to_string());
            assert_eq!(got, expected.map_err(str::to_string), "WRITE {named}");
            server.join().unwrap();
        }
    }

    /// Each message has its own wait, from when it is awaited: a server waits for the
    /// outcomes as long as the run takes, however short its wait for the hello was.
    #[test]
    fn each_message_is_awaited_from_when_it_is_expected() {
        let (server, mut client) = tcp_pair();
        let wait = Duration::from_millis(300);
        let mut reader = BufReader::new(Timed::new(server, wait));
        client.write_all(b"{\"completed\":[1]}\n").unwrap();
        let first: Check =
            receive_within(&mut reader, "client's outcomes", wait, MAX_LINE).unwrap();
        std::thread::sleep(2 * wait);
        client.write_all(b"{\"completed\":[2]}\n").unwrap();
        let second: Check =
            receive_within(&mut reader, "client's outcomes", wait, MAX_LINE).unwrap();
        assert_eq!((first.completed, second.completed), (vec![1], vec![2]));
    }

    #[test]
    fn a_server_refuses_no_slots_and_more_memory_than_it_registers_for_a_client() {
        // Regions of at most 1 MiB: a request the server takes fails at the registration.
        let config = selsig_soft::SoftConfig {
            max_mr_size: 1 << 20,
            ..selsig_soft::SoftConfig::default()
        };
        let dev = selsig_soft::SoftDevice::open(config).unwrap();
        let hello = |wrs: u32, size: u64| Hello {
            version: PROTOCOL,
            qp: wire(&"0".repeat(32)),
            wrs,
            size,
            run_s: 0,
            rdma_cm: false,
        };
        let max_wrs = MAX_WRS;
        let limits = open_gate().limits;
        for (wrs, size) in [(0, 64), (max_wrs + 1, 1), (max_wrs, 4097), (2, 1 << 63)] {
            let err = handshake::admit(&hello(wrs, size), &limits)
                .expect_err("refused")
                .to_string();
            assert_eq!(
                err,
                format!(
                    "the client asked for {wrs} slots of {size} bytes: this server registers \
                     at most 1048576 slots and 4294967296 bytes in all (its --max-memory)"
                )
            );
        }
        // Exactly the most: past the check, to the device.
        for (wrs, size) in [(4, 1 << 30), (max_wrs, 4096)] {
            let theirs = handshake::admit(&hello(wrs, size), &limits).expect("admitted");
            let err = prepare(&dev, &soft_info(), &hello(wrs, size), &theirs)
                .err()
                .expect("more than the device takes");
            assert!(
                format!("{err:#}").starts_with("cannot register the target region: "),
                "{err:#}"
            );
        }
    }

    /// A session the client ends without a check (it wrote bytes the server cannot know):
    /// the server checks no slot, and the client hears back.
    #[test]
    fn a_session_ended_unchecked_checks_nothing() {
        let (dev, pd, cq) = soft_device();
        let (qp, _) = hello_from(&dev, &pd, &cq, 8, 64, 0);
        let mine = qp.endpoint(&ConnectOptions::default()).unwrap();
        let (listener, at) = local_listener();
        std::thread::scope(|s| {
            let server = s.spawn(|| {
                serve_one(
                    &dev,
                    &soft_info(),
                    &open_gate(),
                    listener.accept().unwrap().0,
                )
            });
            let peer = RemotePeer::connect(&at, &mine, 8, 64, None, Cm::Tcp).unwrap();
            peer.finish_unchecked().unwrap();
            assert_eq!(server.join().unwrap().unwrap().checked(), (0, Vec::new()));
        });
    }

    /// A server that reset the connection (it closed with bytes unread) is closed too.
    #[test]
    fn a_client_sees_a_connection_the_server_reset() {
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let (at, server) = fake_server(move |mut reader, mut writer| {
            let _: Hello = receive(&mut reader, "client's hello", MAX_SHORT).unwrap();
            send(&mut writer, &welcome("rxe0")).unwrap();
            stopped.recv().unwrap();
        });
        let mine = wire(&"0".repeat(32)).endpoint().unwrap();
        let mut peer = RemotePeer::connect(&at, &mine, 4, 64, None, Cm::Tcp).unwrap();
        // A byte the server never reads: its close resets the connection.
        peer.writer.write_all(b"x").unwrap();
        std::thread::sleep(Duration::from_millis(100));
        stop.send(()).unwrap();
        server.join().unwrap();
        std::thread::sleep(Duration::from_millis(100));
        // The reset is reported once, by the first look: that one must see it.
        assert_eq!(peer.closed().as_deref(), Some(""));
    }
}
