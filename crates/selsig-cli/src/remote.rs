//! Two processes, two hosts: `selsig serve` holds the target memory and its QP;
//! `selsig demo --connect HOST` writes into it. Like perftest and `ibv_rc_pingpong`, the
//! two exchange what RDMA needs over a small TCP handshake (JSON lines): QP number, PSN,
//! LID, GID, and the target region's address and key. After the run the client sends the
//! outcome of every WRITE and the server checks its memory.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use clap::Args;
use selsig::{
    Access, ConnectOptions, Device, Endpoint, MemoryRegion, QpCaps, QpInit, QueuePair, RemoteAddr,
    connect_pair,
};
use serde::{Deserialize, Serialize};

use crate::common::{DeviceInfo, OnDevice, ProviderArgs, pattern_byte};

/// The default TCP port (perftest's).
pub const DEFAULT_PORT: u16 = 18515;
/// Largest target region a server registers for one client.
const MAX_BYTES: u64 = 1 << 30;
/// How long the server waits for a client's hello, and for its outcomes.
const HELLO_WAIT: Duration = Duration::from_secs(30);
const RUN_WAIT: Duration = Duration::from_secs(300);
/// The server reads a WRITE back this many bytes at a time to check it.
const CHECK_CHUNK: usize = 64 << 10;

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
    fn from_endpoint(e: &Endpoint) -> Wire {
        Wire {
            qp_num: e.qp_num,
            psn: e.psn,
            lid: e.lid,
            gid: e.gid.iter().map(|b| format!("{b:02x}")).collect(),
            mtu: e.mtu,
            rd_atomic: e.rd_atomic,
        }
    }

    fn endpoint(&self) -> Result<Endpoint> {
        ensure!(
            self.qp_num <= 0x00ff_ffff,
            "the peer sent QP number {:#x}: QP numbers are 24 bits",
            self.qp_num
        );
        ensure!(
            self.gid.len() == 32 && self.gid.bytes().all(|b| b.is_ascii_hexdigit()),
            "the peer sent a malformed GID {:?}: not 32 hex digits",
            excerpt(&self.gid)
        );
        let mut gid = [0u8; 16];
        for (i, g) in gid.iter_mut().enumerate() {
            *g = u8::from_str_radix(&self.gid[2 * i..2 * i + 2], 16)
                .context("the peer sent a malformed GID")?;
        }
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
struct Hello {
    qp: Wire,
    wrs: u32,
    size: u64,
}

/// server → client: my QP and the region to write into.
#[derive(Debug, Serialize, Deserialize)]
struct Welcome {
    qp: Wire,
    addr: u64,
    rkey: u32,
    device: String,
}

/// server → client when it cannot serve.
#[derive(Debug, Serialize, Deserialize)]
struct Refusal {
    error: String,
}

/// What the server answers a hello.
#[derive(Debug, Serialize, Deserialize)]
#[serde(untagged)]
enum Reply {
    Welcome(Welcome),
    Refusal(Refusal),
}

/// client → server: which WRITEs completed (1-based), after the run.
#[derive(Debug, Serialize, Deserialize)]
struct Check {
    completed: Vec<u32>,
    /// Whether slot `k` holds the pattern of WRITE `k` exactly when `k` is in `completed`
    /// (the demo, a bench sweep); `false` where the client wrote other bytes (perftest
    /// mode, inline data): nothing is checked.
    #[serde(default = "yes")]
    verify: bool,
}

fn yes() -> bool {
    true
}

/// server → client: the WRITEs whose bytes are not as the outcomes say.
#[derive(Debug, Serialize, Deserialize)]
struct Checked {
    mismatches: Vec<u32>,
}

fn send<T: Serialize>(w: &mut TcpStream, msg: &T) -> Result<()> {
    let mut line = serde_json::to_string(msg)?;
    line.push('\n');
    w.write_all(line.as_bytes())
        .context("the connection broke")?;
    Ok(())
}

/// The longest message accepted: a client's outcomes, `MAX_WRS` numbers, fit easily.
const MAX_LINE: u64 = 16 << 20;

fn receive<T: for<'de> Deserialize<'de>>(r: &mut impl BufRead, what: &str) -> Result<T> {
    let mut line = String::new();
    let n = std::io::Read::take(r, MAX_LINE)
        .read_line(&mut line)
        .with_context(|| format!("cannot read the {what}"))?;
    ensure!(n > 0, "the peer closed the connection before the {what}");
    ensure!(
        line.ends_with('\n') || (n as u64) < MAX_LINE,
        "the peer sent a {what} longer than {MAX_LINE} bytes"
    );
    serde_json::from_str(line.trim()).with_context(|| {
        format!(
            "the peer sent a malformed {what}: {:?}",
            excerpt(line.trim())
        )
    })
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

/// The first 200 characters of what a peer sent, for an error message.
fn excerpt(text: &str) -> String {
    text.chars().take(200).collect()
}

/// `host[:port]` with the default port added where none is given: `host`, `host:port`,
/// an IPv4 address, an IPv6 address bare (`fe80::1`) or in brackets (`[::1]`,
/// `[::1]:9000`).
fn with_port(host: &str) -> String {
    use std::net::{IpAddr, SocketAddr};
    let host = host.trim();
    if host.parse::<SocketAddr>().is_ok() {
        return host.to_string();
    }
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if let Ok(ip) = bare.parse::<IpAddr>() {
        return SocketAddr::new(ip, DEFAULT_PORT).to_string();
    }
    if host.matches(':').count() == 1 {
        host.to_string()
    } else {
        format!("{host}:{DEFAULT_PORT}")
    }
}

/// The client side: a connection to a server, its region, and the check at the end.
pub struct RemotePeer {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
    pub target: RemoteAddr,
    pub endpoint: Endpoint,
    pub device: String,
    pub address: String,
}

impl RemotePeer {
    /// Connects to `host[:port]` and exchanges addresses; `local` is this side's QP.
    pub fn connect(host: &str, local: &Endpoint, wrs: u32, size: u64) -> Result<RemotePeer> {
        let address = with_port(host);
        let addrs: Vec<_> = address
            .to_socket_addrs()
            .with_context(|| format!("cannot resolve {address}"))?
            .collect();
        let stream = addrs
            .iter()
            .find_map(|a| TcpStream::connect_timeout(a, Duration::from_secs(5)).ok())
            .with_context(|| {
                format!("cannot connect to selsig serve at {address}: is it running?")
            })?;
        stream.set_read_timeout(Some(Duration::from_secs(60)))?;
        let mut writer = stream.try_clone()?;
        let mut reader = BufReader::new(stream);
        send(
            &mut writer,
            &Hello {
                qp: Wire::from_endpoint(local),
                wrs,
                size,
            },
        )?;
        let welcome = match receive::<Reply>(&mut reader, "server's reply")? {
            Reply::Welcome(w) => w,
            Reply::Refusal(r) => bail!("selsig serve at {address} refused: {}", r.error),
        };
        Ok(RemotePeer {
            endpoint: welcome.qp.endpoint()?,
            target: RemoteAddr {
                addr: welcome.addr,
                rkey: welcome.rkey,
            },
            device: welcome.device,
            reader,
            writer,
            address,
        })
    }

    /// Tells the server which WRITEs completed; returns those whose bytes differ.
    pub fn check(mut self, completed: Vec<u32>) -> Result<Vec<u32>> {
        send(
            &mut self.writer,
            &Check {
                completed,
                verify: true,
            },
        )?;
        let checked: Checked = receive(&mut self.reader, "server's check")?;
        Ok(checked.mismatches)
    }

    /// Ends the session without a check (the client wrote bytes the server cannot know).
    pub fn finish_unchecked(mut self) -> Result<()> {
        send(
            &mut self.writer,
            &Check {
                completed: Vec::new(),
                verify: false,
            },
        )?;
        receive::<Checked>(&mut self.reader, "server's reply")?;
        Ok(())
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
    Remote(RemotePeer),
}

impl<D: Device> Peer<D> {
    /// Sets up `slots` slots of `slot` bytes (at least 1) of target memory, in this
    /// process or at `connect`'s server, and connects `qp` to its queue pair.
    pub fn open(
        dev: &D,
        pd: &D::Pd,
        qp: &D::Qp,
        options: &ConnectOptions,
        connect: Option<&str>,
        slots: u32,
        slot: u64,
    ) -> Result<Peer<D>> {
        if let Some(host) = connect {
            let mine = qp.endpoint(options)?;
            let remote = RemotePeer::connect(host, &mine, slots, slot)?;
            qp.connect(&remote.endpoint, options).with_context(|| {
                format!(
                    "cannot connect to the server's queue pair{}",
                    gid_hint(&mine, &remote.endpoint, "server")
                )
            })?;
            return Ok(Peer::Remote(remote));
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
}

/// Hold a target region and a QP for `selsig demo --connect` and `selsig bench --connect`
/// clients.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// The TCP port to listen on.
    #[arg(long, short = 'p', default_value_t = DEFAULT_PORT)]
    pub port: u16,
    /// The address to listen on.
    #[arg(long, default_value = "0.0.0.0")]
    pub bind: String,
    /// Serve one session, then exit: 0 if its check passed, 1 otherwise. A demo is one
    /// session; a bench sweep opens one for its warm-up and one per point (serve it
    /// without --once), a perftest-mode bench one.
    #[arg(long)]
    pub once: bool,
    #[command(flatten)]
    pub provider: ProviderArgs,
}

/// `selsig serve` serves RDMA clients in other processes: the verbs provider only.
pub fn validate(args: &ServeArgs) -> Result<()> {
    ensure!(
        args.provider.provider == crate::common::ProviderKind::Verbs,
        "selsig serve needs --provider verbs (the soft NIC connects queue pairs of one process only)"
    );
    Ok(())
}

impl OnDevice for &ServeArgs {
    type Output = bool;

    fn run<D: Device>(self, dev: &D, info: &DeviceInfo) -> Result<bool> {
        let listener = TcpListener::bind((self.bind.as_str(), self.port))
            .with_context(|| format!("cannot listen on {}:{}", self.bind, self.port))?;
        let at = listener
            .local_addr()
            .context("cannot read the listening address")?;
        eprintln!(
            "selsig serve: {} ({} provider) listening on {at}",
            info.device,
            info.provider.as_str(),
        );
        loop {
            let (stream, from) = listener.accept().context("accept failed")?;
            let ok = match serve_one(dev, info, stream) {
                Ok((0, _)) => {
                    eprintln!("selsig serve: client {from}: done (nothing to check)");
                    true
                }
                Ok((wrs, bad)) => {
                    eprintln!(
                        "selsig serve: client {from}: {wrs} WRITEs checked, {}",
                        if bad.is_empty() {
                            "memory as the outcomes say".to_string()
                        } else {
                            format!("mismatches: {bad:?}")
                        }
                    );
                    bad.is_empty()
                }
                Err(e) => {
                    eprintln!("selsig serve: client {from}: error: {e:#}");
                    false
                }
            };
            if self.once {
                return Ok(ok);
            }
        }
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
        let mut holds = true;
        for from in (0..size).step_by(CHECK_CHUNK) {
            let piece = &mut got[..CHECK_CHUNK.min(size - from)];
            region.read(start + from, piece)?;
            holds = piece.iter().enumerate().all(|(i, &b)| {
                b == if landed {
                    pattern_byte(u64::from(wr), from + i)
                } else {
                    0
                }
            });
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

/// One client: its QP, its region, the handshake, the check.
fn serve_one<D: Device>(dev: &D, info: &DeviceInfo, stream: TcpStream) -> Result<(u32, Vec<u32>)> {
    // A client says hello as it connects: one that does not must not keep the others
    // (served one at a time) waiting long. Its outcomes come after its run: minutes.
    stream.set_read_timeout(Some(HELLO_WAIT))?;
    let mut writer = stream.try_clone()?;
    let mut reader = BufReader::new(stream);
    let hello: Hello = receive(&mut reader, "client's hello")?;
    reader.get_ref().set_read_timeout(Some(RUN_WAIT))?;
    match prepare(dev, info, &hello) {
        Ok(prepared) => finish(prepared, &hello, dev, &mut reader, &mut writer),
        Err(e) => {
            let _ = send(
                &mut writer,
                &Refusal {
                    error: format!("{e:#}"),
                },
            );
            Err(e)
        }
    }
}

/// The server's QP and region for one client, connected to it.
struct Prepared<D: Device> {
    qp: D::Qp,
    region: D::Mr,
    mine: Endpoint,
    _cq: Arc<D::Cq>,
    _pd: D::Pd,
}

fn prepare<D: Device>(dev: &D, info: &DeviceInfo, hello: &Hello) -> Result<Prepared<D>> {
    let slot = hello.size.max(1);
    let bytes = u64::from(hello.wrs).saturating_mul(slot);
    if hello.wrs == 0 || hello.wrs > crate::demo::MAX_WRS || bytes > MAX_BYTES {
        bail!(
            "the client asked for {} WRITEs of {} bytes: at most {} WRITEs and {MAX_BYTES} bytes in all",
            hello.wrs,
            hello.size,
            crate::demo::MAX_WRS
        );
    }
    // Checked before anything is created for it.
    let theirs = hello.qp.endpoint()?;
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
    let options = ConnectOptions {
        gid_index: info.gid_index,
        ..ConnectOptions::default()
    };
    let mine = qp.endpoint(&options)?;
    qp.connect(&theirs, &options).with_context(|| {
        format!(
            "cannot connect to the client's QP{}",
            gid_hint(&mine, &theirs, "client")
        )
    })?;
    Ok(Prepared {
        qp,
        region,
        mine,
        _cq: cq,
        _pd: pd,
    })
}

fn finish<D: Device>(
    p: Prepared<D>,
    hello: &Hello,
    dev: &D,
    reader: &mut BufReader<TcpStream>,
    writer: &mut TcpStream,
) -> Result<(u32, Vec<u32>)> {
    let Prepared {
        qp, region, mine, ..
    } = p;
    let slot = hello.size.max(1);
    send(
        writer,
        &Welcome {
            qp: Wire::from_endpoint(&mine),
            addr: region.addr(),
            rkey: region.rkey(),
            device: dev.name().to_string(),
        },
    )?;
    let mut check: Check = receive(reader, "client's outcomes")?;
    check.completed.sort_unstable();
    let checked = if check.verify { hello.wrs } else { 0 };
    let mismatches = mismatches(
        &region,
        checked,
        hello.size as usize,
        slot as usize,
        &check.completed,
    )?;
    send(
        writer,
        &Checked {
            mismatches: mismatches.clone(),
        },
    )?;
    drop(qp);
    Ok((checked, mismatches))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wire(gid: &str) -> Wire {
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
    fn the_default_port_is_added_where_none_is_given() {
        assert_eq!(with_port("target"), "target:18515");
        assert_eq!(with_port("target:9000"), "target:9000");
        assert_eq!(with_port("10.77.0.1"), "10.77.0.1:18515");
        assert_eq!(with_port("10.77.0.1:9000"), "10.77.0.1:9000");
        assert_eq!(with_port("::1"), "[::1]:18515");
        assert_eq!(with_port("[::1]"), "[::1]:18515");
        assert_eq!(with_port("[::1]:9000"), "[::1]:9000");
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
        let err = receive::<Check>(&mut r, "client's outcomes")
            .expect_err("too long")
            .to_string();
        assert!(err.contains("longer than"), "{err}");
        let mut r = std::io::Cursor::new(b"{\"completed\":[3,1]}\n".to_vec());
        let check: Check = receive(&mut r, "client's outcomes").expect("a short message");
        assert_eq!(check.completed, [3, 1]);
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
    }
}
