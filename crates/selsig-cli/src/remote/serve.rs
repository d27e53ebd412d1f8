//! `selsig serve`'s loop: it accepts clients, proves them in threads of their own (a few
//! at a time), and serves the sessions of those it admitted one at a time.

use std::io::{BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use selsig::{Device, Endpoint, MemoryRegion};
use selsig_cli::handshake::{self, Hello, Limits, PROTOCOL, Proof, Refusal, Welcome, Wire};

use super::{
    Gate, HELLO_WAIT, MAX_SHORT, PROOF_WAIT, SECRET_FILE_VAR, SECRET_VAR, Session, Timed, finish,
    prepare, rdma, receive_line_within, receive_within, refuse, send,
};
use crate::common::DeviceInfo;

/// Serves the clients that connect to `listener`, one session at a time, for ever or,
/// `once`, one session: then whether its check passed.
///
/// Each connection's handshake (its hello, the challenge and its proof, the limits) runs
/// in a thread of its own, [`MAX_HANDSHAKES`] at most at once: a connection beyond them
/// is told at once that too many clients are proving themselves, and to try again. Only
/// an admitted client claims the session: a peer that does not know the secret holds one
/// handshake's thread for [`HELLO_WAIT`] and [`PROOF_WAIT`] at most, and never the
/// session. An admitted client that comes while another is served waits up to
/// [`BUSY_GRACE`] for that session to end (one such client at a time: a client that
/// starts its next session as soon as it has the last one's result comes while the
/// server still takes the last one's objects down), then is told the server is busy.
///
/// `once`: the first client that speaks the exchange (its hello parses) decides. An
/// admitted client's session is the server's one, and its check the answer; a client
/// refused before any was admitted (without the secret, of another version, asking too
/// much) ends the server at once, failed, and the handshakes still under way are cut off.
/// A connection that says no hello or a malformed one (a port scan, a health check) is
/// printed and decides nothing, nor does a refusal after a client was admitted.
pub(crate) fn serve_on<D: Device>(
    listener: &TcpListener,
    dev: &D,
    info: &DeviceInfo,
    gate: &Gate,
    once: bool,
) -> Result<bool> {
    listener
        .set_nonblocking(true)
        .context("cannot listen without blocking")?;
    let busy = AtomicBool::new(false);
    let (to_session, sessions) = mpsc::channel::<(Admitted, SocketAddr)>();
    let (done, ended) = mpsc::channel::<Ended>();
    std::thread::scope(|scope| {
        let served = scope.spawn(|| {
            let mut ok = true;
            for (client, from) in sessions {
                ok = serve_client(dev, info, &gate.limits, client, from);
                // A `--once` server stays busy to its end: a client waiting for this
                // session to end is told so, not handed to a session that never comes.
                if once {
                    break;
                }
                busy.store(false, Ordering::Release);
            }
            ok
        });
        let mut door = Door {
            gate: Arc::new(gate.clone()),
            once,
            busy: &busy,
            to_session,
            done,
            ended,
            handshakes: Vec::new(),
            next: None,
            closing: Vec::new(),
            claimed: false,
        };
        let refused = door.run(listener, || served.is_finished());
        door.close();
        let ok = served
            .join()
            .map_err(|_| anyhow::anyhow!("the session's thread panicked"))?;
        Ok(refused.unwrap_or(ok))
    })
}

/// How long a client admitted while another is served waits for that session to end
/// before it is told the server is busy.
const BUSY_GRACE: Duration = Duration::from_secs(2);

/// How often a server looks for a new client, and for the end of a `--once` session.
const ACCEPT_POLL: Duration = Duration::from_millis(20);

/// The most connections told to go away (the server is busy, or proving too many) that
/// it reads until they close (more are dropped at once), and how long it reads each.
const MAX_CLOSING: usize = 64;
const BUSY_LINGER: Duration = Duration::from_secs(2);

/// The most handshakes under way at once, each in its own thread for [`HELLO_WAIT`] and
/// [`PROOF_WAIT`] at most, reading [`MAX_SHORT`] bytes at most of each message.
pub(super) const MAX_HANDSHAKES: usize = 8;

/// What a client told the server is busy reads.
const BUSY: &str = "busy: this server serves one client at a time, and another one's session \
                    is on; try again when it ends";

/// What a connection beyond [`MAX_HANDSHAKES`] reads.
const CROWDED: &str = "too many clients are proving themselves to this server at once; try \
                       again in a moment";

/// A client past its handshake: what its session needs.
struct Admitted {
    reader: BufReader<Timed>,
    writer: TcpStream,
    hello: Hello,
    /// The client's QP, as its hello gives it (rdma_cm's clients connect theirs later).
    theirs: Endpoint,
}

/// A refused handshake: why, and whether the peer spoke the exchange (its hello parsed).
struct Refused {
    error: anyhow::Error,
    spoke: bool,
}

impl Refused {
    /// A refusal of a peer that said no hello that parses.
    fn mute(error: anyhow::Error) -> Self {
        Refused {
            error,
            spoke: false,
        }
    }
}

/// How one handshake ended, and whose it was.
type Ended = (SocketAddr, Result<Admitted, Refused>);

/// A handshake under way in its own thread, and its connection, to cut off if the server
/// ends first.
struct Handshake {
    thread: JoinHandle<()>,
    stream: TcpStream,
}

/// The accepting thread's side of the server: the handshakes under way, the admitted
/// client that waits for the session, the connections told to go away.
struct Door<'a> {
    gate: Arc<Gate>,
    once: bool,
    /// Whether a session is on (or, `once`, was).
    busy: &'a AtomicBool,
    to_session: mpsc::Sender<(Admitted, SocketAddr)>,
    /// Each handshake's thread sends how it ended here.
    done: mpsc::Sender<Ended>,
    ended: mpsc::Receiver<Ended>,
    handshakes: Vec<Handshake>,
    /// The one admitted client that waits for the session to end, until when.
    next: Option<(Admitted, SocketAddr, Instant)>,
    /// Connections told to go away, read until they close (a few at most, each for a
    /// moment): no thread for them, so a peer that connects again and again costs the
    /// server nothing but this list.
    closing: Vec<(TcpStream, Instant)>,
    /// Whether a client was handed the session.
    claimed: bool,
}

impl Door<'_> {
    /// Accepts connections and settles their handshakes until `session_over` (a `--once`
    /// server's session ended); `Some(false)`: a `--once` server whose first handshake
    /// was refused.
    fn run(&mut self, listener: &TcpListener, session_over: impl Fn() -> bool) -> Option<bool> {
        while !session_over() {
            // A finished handshake's connection is its session's now, or closed.
            self.handshakes.retain(|h| !h.thread.is_finished());
            while let Ok((from, outcome)) = self.ended.try_recv() {
                if self.settle(from, outcome) {
                    return Some(false);
                }
            }
            self.serve_next();
            match listener.accept() {
                Ok((stream, from)) => self.knock(stream, from),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    self.closing
                        .retain(|(stream, until)| still_closing(stream, *until));
                    // Waits for a handshake's end, or the next look at the listener.
                    if let Ok((from, outcome)) = self.ended.recv_timeout(ACCEPT_POLL)
                        && self.settle(from, outcome)
                    {
                        return Some(false);
                    }
                }
                Err(e) => {
                    // A client that gave up, or no file descriptor left for a moment: the
                    // next clients are still served.
                    say!("selsig serve: cannot accept a connection: {e}");
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
        None
    }

    /// A new connection: its handshake starts, or it is told too many are under way.
    fn knock(&mut self, stream: TcpStream, from: SocketAddr) {
        self.handshakes.retain(|h| !h.thread.is_finished());
        if self.handshakes.len() >= MAX_HANDSHAKES {
            self.tell(stream, CROWDED);
            return;
        }
        match start_handshake(&self.gate, stream, from, &self.done) {
            Ok(handshake) => self.handshakes.push(handshake),
            Err(e) => say!("selsig serve: client {from}: cannot start its handshake: {e}"),
        }
    }

    /// A handshake that ended: an admitted client claims the session, or waits for it,
    /// or is told the server is busy; a refused one is printed. Whether that ends a
    /// `--once` server (a client that spoke the exchange refused before any was admitted).
    fn settle(&mut self, from: SocketAddr, outcome: Result<Admitted, Refused>) -> bool {
        match outcome {
            Ok(client) => {
                if !self.busy.swap(true, Ordering::AcqRel) {
                    self.hand_over(client, from);
                } else if self.next.is_none() {
                    self.next = Some((client, from, Instant::now() + BUSY_GRACE));
                } else {
                    self.tell(client.writer, BUSY);
                }
                false
            }
            Err(refused) => {
                say!("selsig serve: client {from}: error: {:#}", refused.error);
                self.once && !self.claimed && refused.spoke
            }
        }
    }

    /// The waiting client gets the session if it is free, or is told the server is busy
    /// once its grace is over.
    fn serve_next(&mut self) {
        let Some((_, _, until)) = &self.next else {
            return;
        };
        let late = Instant::now() >= *until;
        if !self.busy.swap(true, Ordering::AcqRel) {
            if let Some((client, from, _)) = self.next.take() {
                self.hand_over(client, from);
            }
        } else if late && let Some((client, _, _)) = self.next.take() {
            self.tell(client.writer, BUSY);
        }
    }

    /// Hands the session (claimed: `busy` set) to `client`.
    fn hand_over(&mut self, client: Admitted, from: SocketAddr) {
        self.claimed = true;
        // The session's thread ends only with a `--once` server's session (or a panic):
        // the loop sees it next.
        let _ = self.to_session.send((client, from));
    }

    /// Tells a connection why it is not served, and reads it until it closes (if the
    /// list has room).
    fn tell(&mut self, stream: TcpStream, why: &str) {
        if self.closing.len() < MAX_CLOSING && tell(&stream, why) {
            self.closing.push((stream, Instant::now() + BUSY_LINGER));
        }
    }

    /// The server ends (a `--once` server): the clients admitted meanwhile are told it is
    /// busy, the refused ones printed, the handshakes under way cut off.
    fn close(mut self) {
        if let Some((client, _, _)) = self.next.take() {
            self.tell(client.writer, BUSY);
        }
        while let Ok((from, outcome)) = self.ended.try_recv() {
            match outcome {
                Ok(client) => self.tell(client.writer, BUSY),
                Err(refused) => say!("selsig serve: client {from}: error: {:#}", refused.error),
            }
        }
        for handshake in &self.handshakes {
            let _ = handshake.stream.shutdown(Shutdown::Both);
        }
    }
}

/// Starts `stream`'s handshake in a thread of its own, which sends how it ended to
/// `done`.
fn start_handshake(
    gate: &Arc<Gate>,
    stream: TcpStream,
    from: SocketAddr,
    done: &mpsc::Sender<Ended>,
) -> std::io::Result<Handshake> {
    stream.set_nonblocking(false)?;
    let held = stream.try_clone()?;
    let gate = Arc::clone(gate);
    let done = done.clone();
    let thread = std::thread::Builder::new()
        .name("selsig-handshake".to_string())
        .spawn(move || {
            // The server may have ended: then nobody waits for it.
            let _ = done.send((from, admit(&gate, stream)));
        })?;
    Ok(Handshake {
        thread,
        stream: held,
    })
}

/// Tells a client why it is not served, `why` (the connection does not block: the line
/// fits its empty send buffer) and ends its side of the connection; whether to read it
/// until it closes, so that the client's end is not reset before it reads why.
fn tell(stream: &TcpStream, why: &str) -> bool {
    let refusal = Refusal {
        error: why.to_string(),
    };
    let Ok(line) = serde_json::to_string(&refusal) else {
        return false;
    };
    let mut writer = stream;
    writer.set_nonblocking(true).is_ok()
        && writer.write_all(format!("{line}\n").as_bytes()).is_ok()
        && stream.shutdown(Shutdown::Write).is_ok()
}

/// Reads what a connection told to go away sent (its hello), without blocking:
/// whether to keep it, until it closes or `until`.
fn still_closing(mut stream: &TcpStream, until: Instant) -> bool {
    let mut sink = [0u8; 4096];
    // A bounded read each time: a peer that keeps sending does not hold the server here.
    for _ in 0..4 {
        match stream.read(&mut sink) {
            Ok(0) => return false,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(_) => return false,
        }
    }
    Instant::now() < until
}

/// One client's session, and what the server says of it: whether its check passed.
fn serve_client<D: Device>(
    dev: &D,
    info: &DeviceInfo,
    limits: &Limits,
    client: Admitted,
    from: SocketAddr,
) -> bool {
    match serve_admitted(dev, info, limits, client) {
        Ok(Session {
            digest: Some((bytes, digest)),
            ..
        }) => {
            say!(
                "selsig serve: client {from}: the digest of its {bytes}-byte region sent \
                 ({digest:016x})"
            );
            true
        }
        Ok(Session { slots: 0, .. }) => {
            say!("selsig serve: client {from}: done (nothing to check)");
            true
        }
        Ok(Session {
            slots: wrs,
            mismatches: bad,
            ..
        }) => {
            say!(
                "selsig serve: client {from}: {wrs} slots checked (each holds the last \
                 WRITE to it), {}",
                match bad.len() {
                    0 => "memory as the outcomes say".to_string(),
                    n if n <= 10 => format!("mismatches: {bad:?}"),
                    n => format!("{n} mismatches, the first 10: {:?}", &bad[..10]),
                }
            );
            bad.is_empty()
        }
        Err(e) => {
            say!("selsig serve: client {from}: error: {e:#}");
            false
        }
    }
}

/// One client, its handshake and its session in one go (as the tests drive a server).
#[cfg(test)]
pub(super) fn serve_one<D: Device>(
    dev: &D,
    info: &DeviceInfo,
    gate: &Gate,
    stream: TcpStream,
) -> Result<Session> {
    let client = admit(gate, stream).map_err(|r| r.error)?;
    serve_admitted(dev, info, &gate.limits, client)
}

/// One client's handshake: its hello, the challenge and its proof (if the server has a
/// secret), the limits. Nothing is created for a client here: that waits for its session.
fn admit(gate: &Gate, stream: TcpStream) -> Result<Admitted, Refused> {
    // A client says hello as it connects: one that does not must not hold a handshake's
    // thread long. Its outcomes come after its run: minutes.
    let mut writer = stream.try_clone().map_err(|e| Refused::mute(e.into()))?;
    let mut reader = BufReader::new(Timed::new(stream, HELLO_WAIT));
    let line = receive_line_within(&mut reader, "client's hello", HELLO_WAIT, MAX_SHORT)
        .map_err(|e| Refused::mute(refuse(&mut writer, e)))?;
    let hello: Hello = handshake::parse(&line, "client's hello")
        .map_err(|e| Refused::mute(refuse(&mut writer, e)))?;
    // From here on the peer speaks the exchange.
    let refused = |writer: &mut TcpStream, e| Refused {
        error: refuse(writer, e),
        spoke: true,
    };
    handshake::version(&hello).map_err(|e| refused(&mut writer, e))?;
    if let Some(secret) = &gate.secret {
        let challenge = handshake::challenge().map_err(|e| refused(&mut writer, e))?;
        send(&mut writer, &challenge).map_err(|e| refused(&mut writer, e))?;
        let proof: Proof = receive_within(&mut reader, "client's proof", PROOF_WAIT, MAX_SHORT)
            .map_err(|e| refused(&mut writer, e))?;
        if !handshake::verify(secret, &challenge.challenge, &line, &proof) {
            let e = anyhow::anyhow!(
                "the client did not prove it knows this server's secret (give it the one the \
                 server printed, in {SECRET_VAR} or a file named by {SECRET_FILE_VAR})"
            );
            return Err(refused(&mut writer, e));
        }
    }
    let theirs = handshake::admit(&hello, &gate.limits).map_err(|e| refused(&mut writer, e))?;
    Ok(Admitted {
        reader,
        writer,
        hello,
        theirs,
    })
}

/// An admitted client's session: its QP, its region, and the check (or, for an rdma_cm
/// client, the rendezvous first).
fn serve_admitted<D: Device>(
    dev: &D,
    info: &DeviceInfo,
    limits: &Limits,
    client: Admitted,
) -> Result<Session> {
    let Admitted {
        mut reader,
        mut writer,
        hello,
        theirs,
    } = client;
    if hello.rdma_cm {
        return rdma::serve(dev, &hello, limits, &mut reader, &mut writer);
    }
    match prepare(dev, info, &hello, &theirs) {
        Ok((prepared, mine)) => {
            send(
                &mut writer,
                &Welcome {
                    version: PROTOCOL,
                    qp: Wire::from_endpoint(&mine),
                    addr: prepared.region.addr(),
                    rkey: prepared.region.rkey(),
                    device: dev.name().to_string(),
                },
            )?;
            finish(
                prepared,
                &hello,
                limits,
                &mut reader,
                &mut writer,
                &mut || (),
            )
        }
        Err(e) => Err(refuse(&mut writer, e)),
    }
}
