//! `--cm rdma`: the client's queue pair and the server's connected through rdma_cm
//! ([`selsig_verbs::cm`]) instead of the exchange of QP numbers, PSNs and GIDs over TCP.
//!
//! The TCP connection stays: it carries the hello, the challenge and the proof (only a
//! client that knows the server's secret gets anywhere), the limits, and after the run the
//! outcomes and the server's check of its memory. Past the proof, the server listens with
//! rdma_cm on the address the client reached, at a port of the kernel's choosing, and
//! sends the client that port and a one-time token ([`Rendezvous`]). The client resolves
//! the address and the route, and sends a connection request carrying the token; the server
//! rejects every request that does not carry it, before it creates anything for it, then
//! creates the QP and the region and accepts with the region's address, key and length
//! in the accept's private data ([`cm_data`]). At the end each side calls
//! `rdma_disconnect` and waits for `RDMA_CM_EVENT_DISCONNECTED`: the client as it sends
//! its outcomes, the server once it read them, before it answers with its check.

use std::any::Any;
use std::io::BufReader;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use selsig::{ConnectOptions, Device, MemoryRegion, QueuePair, RemoteAddr};
use selsig_cli::cm_data::{self, Region, Token};
use selsig_cli::handshake::{Hello, Limits, PROTOCOL, Rendezvous};
use selsig_verbs::VerbsQp;
use selsig_verbs::cm::{self as rdma_cm, CmConnection, CmError, CmListener};

use super::{RemotePeer, Session, Timed, create, finish, refuse, send};
use crate::common::BadOption;

/// How a client's queue pair is connected to `selsig serve`'s.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Cm {
    /// selsig's exchange of QP numbers, PSNs and GIDs over the TCP connection.
    #[default]
    Tcp,
    /// rdma_cm (librdmacm): address and route resolution, the region in the private data.
    Rdma,
}

/// How long the server waits for the connection request that carries its token, and
/// either side for the connection to be set up.
const CONNECT_WAIT: Duration = Duration::from_secs(20);
/// How long either side waits for the other to answer its disconnection.
const DISCONNECT_WAIT: Duration = Duration::from_secs(5);

/// How long the server waits for a connection request before it looks whether the
/// client is still there.
const REQUEST_POLL: Duration = Duration::from_millis(200);

/// Whether the client closed its TCP connection (or it broke), without reading from it.
fn gone(stream: &TcpStream) -> bool {
    if stream.set_nonblocking(true).is_err() {
        return false;
    }
    let mut byte = [0u8; 1];
    let peeked = stream.peek(&mut byte);
    let _ = stream.set_nonblocking(false);
    match peeked {
        Ok(n) => n == 0,
        Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
    }
}

/// The queue pair as selsig-verbs' (rdma_cm connects only that provider's).
fn verbs_qp<Q: QueuePair>(qp: &Q) -> Result<&VerbsQp> {
    (qp as &dyn Any).downcast_ref::<VerbsQp>().ok_or_else(|| {
        anyhow::anyhow!("--cm rdma connects queue pairs of the verbs provider only")
            .context(BadOption("--cm rdma needs --provider verbs"))
    })
}

/// The client's side: connects `qp` to the server of `peer`, which answered
/// `rendezvous`, and takes the region (at least `want` bytes) from the accept.
pub(super) fn connect<Q: QueuePair>(
    qp: &Q,
    peer: &mut RemotePeer,
    rendezvous: &Rendezvous,
    options: &ConnectOptions,
    want: u64,
) -> Result<()> {
    let vqp = verbs_qp(qp)?;
    let token = Token::parse(&rendezvous.token)?;
    let ip = peer
        .writer
        .peer_addr()
        .context("cannot read the server's address")?
        .ip()
        .to_canonical();
    let to = SocketAddr::new(ip, rendezvous.cm_port);
    let (conn, private) = rdma_cm::connect(
        vqp,
        to,
        &cm_data::request(&token),
        (options.retry_cnt, options.rnr_retry),
        CONNECT_WAIT,
    )
    .with_context(|| {
        format!(
            "cannot connect to selsig serve at {} through rdma_cm ({to})",
            peer.address
        )
    })?;
    let region = cm_data::region(&private).context("selsig serve's rdma_cm accept")?;
    ensure!(
        region.len >= want,
        "selsig serve at {} gave a region of {} bytes in its rdma_cm accept, less than the \
         {want} asked for",
        peer.address,
        region.len
    );
    peer.target = RemoteAddr {
        addr: region.addr,
        rkey: region.rkey,
    };
    peer.cm = Some(conn);
    Ok(())
}

/// The client's end of the session, its outcomes sent: disconnects, and says so if the
/// server did not answer (the check is the server's: this changes nothing of it).
pub(super) fn hang_up(conn: Option<CmConnection>, address: &str) {
    if let Some(conn) = conn
        && let Err(e) = conn.disconnect(DISCONNECT_WAIT)
    {
        say!("selsig: the rdma_cm disconnection from selsig serve at {address}: {e}");
    }
}

/// Whether the server's side of the rdma_cm connection went away (it disconnected, or
/// its process ended).
pub(super) fn disconnected(peer: &RemotePeer) -> bool {
    peer.cm.as_ref().is_some_and(CmConnection::disconnected)
}

/// The server's side, for a client whose hello asked for rdma_cm, past its proof and
/// admitted: the rendezvous, the connection request with the token, the QP and the region,
/// the accept; then the outcomes and the check, as over TCP ([`finish`]); then the
/// disconnection.
pub(super) fn serve<D: Device>(
    dev: &D,
    hello: &Hello,
    limits: &Limits,
    reader: &mut BufReader<Timed>,
    writer: &mut TcpStream,
) -> Result<Session> {
    let at = writer
        .local_addr()
        .context("cannot read the address the client reached")?
        .ip()
        // A dual-stack socket (`--bind ::`) sees an IPv4 client as ::ffff:a.b.c.d, which
        // rdma_cm cannot bind: the IPv4 address itself.
        .to_canonical();
    let listener = CmListener::bind(SocketAddr::new(at, 0))
        .with_context(|| format!("cannot listen with rdma_cm on {at}"))
        .map_err(|e| refuse(writer, e))?;
    let token = Token::generate()?;
    send(
        writer,
        &Rendezvous {
            version: PROTOCOL,
            cm_port: listener.port(),
            token: token.to_hex(),
            device: dev.name().to_string(),
        },
    )?;
    let deadline = Instant::now() + CONNECT_WAIT;
    let request = loop {
        // Waited for a moment at a time: a client that gave up (its TCP connection closed)
        // does not hold the server (one session at a time) for the rest of the wait.
        let left = deadline.saturating_duration_since(Instant::now());
        let request = match listener.request(left.min(REQUEST_POLL)) {
            Err(CmError::TimedOut { .. }) if !left.is_zero() && !gone(writer) => continue,
            Err(CmError::TimedOut { .. }) if !left.is_zero() => {
                bail!("the client closed the connection before its rdma_cm connection request")
            }
            other => other
                .context("the client's rdma_cm connection request did not come")
                .map_err(|e| refuse(writer, e))?,
        };
        if token.shown_in(request.private_data()) {
            break request;
        }
        say!(
            "selsig serve: rejected an rdma_cm connection request that does not carry this \
             session's token"
        );
        let _ = request.reject(b"selsig serve: no valid session token");
    };
    let p = match create(dev, hello) {
        Ok(p) => p,
        Err(e) => {
            let _ = request.reject(b"selsig serve: cannot set up the session");
            return Err(refuse(writer, e));
        }
    };
    let region = Region {
        addr: p.region.addr(),
        rkey: p.region.rkey(),
        len: p.region.len() as u64,
    };
    let conn = verbs_qp(&p.qp)
        .and_then(|qp| {
            listener
                .accept(request, qp, &cm_data::accept(&region), CONNECT_WAIT)
                .context("cannot accept the client's rdma_cm connection")
        })
        .map_err(|e| refuse(writer, e))?;
    say!(
        "selsig serve: rdma_cm connection established (QP {:#x}, {} bytes at {:#x})",
        p.qp.qp_num(),
        region.len,
        region.addr
    );
    // Disconnected once the outcomes came (the client disconnects as it sends them), before
    // the check is answered: when the client has the answer, the session is over here
    // too, and its next session (a bench's next point) finds the server free.
    let mut conn = Some(conn);
    let mut hang_up = || {
        if let Some(conn) = conn.take() {
            match conn.disconnect(DISCONNECT_WAIT) {
                Ok(()) => {
                    say!("selsig serve: rdma_cm connection closed (RDMA_CM_EVENT_DISCONNECTED)")
                }
                Err(e) => say!("selsig serve: rdma_cm disconnection: {e}"),
            }
        }
    };
    let result = finish(p, hello, limits, reader, writer, &mut hang_up);
    // A session that ended before the outcomes.
    hang_up();
    result
}
