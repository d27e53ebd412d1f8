//! `selsig serve`'s loop: it accepts clients and serves one session at a time.

use std::io::{BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use selsig::{Device, MemoryRegion};
use selsig_cli::handshake::{self, Hello, PROTOCOL, Proof, Refusal, Welcome, Wire};

use super::{
    Gate, HELLO_WAIT, MAX_SHORT, PROOF_WAIT, SECRET_FILE_VAR, SECRET_VAR, Timed, finish, prepare,
    rdma, receive_line_within, receive_within, refuse, send,
};
use crate::common::DeviceInfo;

/// Serves the clients that connect to `listener`, one at a time, for ever or, `once`, one
/// session: then whether its check passed. A client that connects while another is
/// served waits up to [`BUSY_GRACE`] for that session to end (one such client at a time: a
/// client that starts its next session as soon as it has the last one's result comes while
/// the server still takes the last one's objects down), then is told the server is busy.
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
    let (to_session, sessions) = mpsc::channel::<(TcpStream, SocketAddr)>();
    // Connections told the server is busy, read until they close (a few at most, each
    // for a moment): no thread for them, so a peer that connects again and again costs
    // the server nothing but this list.
    let mut closing: Vec<(TcpStream, Instant)> = Vec::new();
    let tell = |stream: TcpStream, closing: &mut Vec<(TcpStream, Instant)>| {
        if closing.len() < MAX_CLOSING && tell_busy(&stream) {
            closing.push((stream, Instant::now() + BUSY_LINGER));
        }
    };
    // The one client that waits for the session to end.
    let mut next: Option<(TcpStream, SocketAddr, Instant)> = None;
    std::thread::scope(|scope| {
        let served = scope.spawn(|| {
            let mut ok = true;
            for (stream, from) in sessions {
                ok = serve_client(dev, info, gate, stream, from);
                // A `--once` server stays busy to its end: a client waiting for this
                // session to end is told so, not handed to a session that never comes.
                if once {
                    break;
                }
                busy.store(false, Ordering::Release);
            }
            ok
        });
        while !served.is_finished() {
            if let Some((_, _, until)) = &next {
                let late = Instant::now() >= *until;
                if !busy.swap(true, Ordering::AcqRel) {
                    if let Some((stream, from, _)) = next.take() {
                        let _ = stream.set_nonblocking(false);
                        if to_session.send((stream, from)).is_err() {
                            break;
                        }
                    }
                } else if late && let Some((stream, _, _)) = next.take() {
                    tell(stream, &mut closing);
                }
            }
            match listener.accept() {
                Ok((stream, from)) => {
                    if !busy.swap(true, Ordering::AcqRel) {
                        let _ = stream.set_nonblocking(false);
                        if to_session.send((stream, from)).is_err() {
                            break;
                        }
                    } else if next.is_none() {
                        next = Some((stream, from, Instant::now() + BUSY_GRACE));
                    } else {
                        tell(stream, &mut closing);
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    closing.retain(|(stream, until)| still_closing(stream, *until));
                    std::thread::sleep(ACCEPT_POLL);
                }
                Err(e) => {
                    // A client that gave up, or no file descriptor left for a moment: the
                    // next clients are still served.
                    say!("selsig serve: cannot accept a connection: {e}");
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
        // A `--once` server that served its session: the one waiting is not served.
        if let Some((stream, _, _)) = next.take() {
            tell(stream, &mut closing);
        }
        drop(to_session);
        served
            .join()
            .map_err(|_| anyhow::anyhow!("the session's thread panicked"))
    })
}

/// How long a client that connects while another is served waits for that session to end
/// before it is told the server is busy.
const BUSY_GRACE: Duration = Duration::from_secs(2);

/// How often a server looks for a new client, and for the end of a `--once` session.
const ACCEPT_POLL: Duration = Duration::from_millis(20);

/// The most connections told the server is busy that it reads until they close (more are
/// dropped at once), and how long it reads each.
const MAX_CLOSING: usize = 64;
const BUSY_LINGER: Duration = Duration::from_secs(2);

/// Tells a client that connected while another is served that the server is busy (the
/// connection does not block: the line fits its empty send buffer) and ends its side of
/// the connection; whether to read it until it closes, so that the client's end is not
/// reset before it reads why.
fn tell_busy(stream: &TcpStream) -> bool {
    let refusal = Refusal {
        error: "busy: this server serves one client at a time, and another one's session is \
                on; try again when it ends"
            .to_string(),
    };
    let Ok(line) = serde_json::to_string(&refusal) else {
        return false;
    };
    let mut writer = stream;
    writer.set_nonblocking(true).is_ok()
        && writer.write_all(format!("{line}\n").as_bytes()).is_ok()
        && stream.shutdown(std::net::Shutdown::Write).is_ok()
}

/// Reads what a connection told the server is busy sent (its hello), without blocking:
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
    gate: &Gate,
    stream: TcpStream,
    from: SocketAddr,
) -> bool {
    match serve_one(dev, info, gate, stream) {
        Ok((0, _)) => {
            say!("selsig serve: client {from}: done (nothing to check)");
            true
        }
        Ok((wrs, bad)) => {
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

/// One client: the handshake (its hello, the challenge and its proof, the limits), then
/// its QP, its region, and the check. Nothing is created for a client before its proof
/// and its hello passed.
pub(super) fn serve_one<D: Device>(
    dev: &D,
    info: &DeviceInfo,
    gate: &Gate,
    stream: TcpStream,
) -> Result<(u32, Vec<u32>)> {
    // A client says hello as it connects: one that does not must not keep the others
    // (served one at a time) waiting long. Its outcomes come after its run: minutes.
    let mut writer = stream.try_clone()?;
    let mut reader = BufReader::new(Timed::new(stream, HELLO_WAIT));
    let line = receive_line_within(&mut reader, "client's hello", HELLO_WAIT, MAX_SHORT)
        .map_err(|e| refuse(&mut writer, e))?;
    let hello: Hello =
        handshake::parse(&line, "client's hello").map_err(|e| refuse(&mut writer, e))?;
    handshake::version(&hello).map_err(|e| refuse(&mut writer, e))?;
    if let Some(secret) = &gate.secret {
        let challenge = handshake::challenge()?;
        send(&mut writer, &challenge)?;
        let proof: Proof = receive_within(&mut reader, "client's proof", PROOF_WAIT, MAX_SHORT)
            .map_err(|e| refuse(&mut writer, e))?;
        if !handshake::verify(secret, &challenge.challenge, &line, &proof) {
            let e = anyhow::anyhow!(
                "the client did not prove it knows this server's secret (give it the one the \
                 server printed, in {SECRET_VAR} or a file named by {SECRET_FILE_VAR})"
            );
            return Err(refuse(&mut writer, e));
        }
    }
    let theirs = handshake::admit(&hello, &gate.limits).map_err(|e| refuse(&mut writer, e))?;
    if hello.rdma_cm {
        return rdma::serve(dev, &hello, &gate.limits, &mut reader, &mut writer);
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
                &gate.limits,
                &mut reader,
                &mut writer,
                &mut || (),
            )
        }
        Err(e) => Err(refuse(&mut writer, e)),
    }
}
