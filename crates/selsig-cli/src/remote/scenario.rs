//! `selsig run --connect`: a scenario's remote side is `selsig serve` on another host.

use anyhow::{Context, Result};
use selsig::{ConnectOptions, Device, RemoteAddr};
use selsig_scenario::RemoteSide;

use super::{Cm, RemotePeer};

/// The server at `host` as a scenario's remote side: it holds the region the scenario's
/// WRITEs go to (one slot, the region's size) and gives its digest at the end.
pub struct ScenarioPeer<'a> {
    host: &'a str,
    cm: Cm,
    session: Option<RemotePeer>,
    /// The server's device and address, once connected.
    server: Option<String>,
}

impl<'a> ScenarioPeer<'a> {
    /// The server at `host`, connected through `cm` once the run asks.
    pub fn new(host: &'a str, cm: Cm) -> Self {
        ScenarioPeer {
            host,
            cm,
            session: None,
            server: None,
        }
    }

    /// The server's device and address, once connected: `rxe0 at 10.0.0.1:18515`.
    pub fn server(&self) -> Option<&str> {
        self.server.as_deref()
    }
}

impl<D: Device> RemoteSide<D> for ScenarioPeer<'_> {
    fn connect(&mut self, qp: &D::Qp, options: &ConnectOptions, len: u64) -> Result<RemoteAddr> {
        let session = RemotePeer::open(qp, options, (self.host, self.cm), 1, len, None)?;
        let target = session.target;
        self.server = Some(format!("{} at {}", session.device, session.address));
        self.session = Some(session);
        Ok(target)
    }

    fn digest(&mut self) -> Result<u64> {
        self.session
            .take()
            .context("no session with selsig serve (the run never connected)")?
            .digest()
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use selsig_scenario::{Event, RunOptions, RunResult, load};

    use super::*;
    use crate::remote::tests::{
        fake_server, local_listener, open_gate, soft_device, soft_info, welcome,
    };
    use crate::remote::{MAX_LINE, MAX_SHORT, receive, send, serve_on};
    use selsig_cli::handshake::{Check, Checked, Hello};

    /// The trace without the asynchronous events of queue pairs on the server's side
    /// (here the server shares the device, and its queue pair's events show by number).
    fn here(result: &RunResult) -> Vec<String> {
        result
            .trace
            .iter()
            .filter(|e| {
                !matches!(e, Event::Async { qp: Some(q), .. } if q == "a.peer" || q.starts_with("0x"))
            })
            .map(Event::line)
            .collect()
    }

    /// `selsig serve` holds a scenario's peer and region: the trace is the loopback run's,
    /// the region's digest the server's, and the session passes.
    #[test]
    fn serve_is_the_remote_side_of_a_scenario() {
        let (dev, _, _) = soft_device();
        let info = soft_info();
        let (listener, at) = local_listener();
        let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios");
        for file in ["seed.toml", "error-mid.toml"] {
            let scenario = load(&shipped.join(file)).unwrap();
            let options = RunOptions::new();
            let local = selsig_scenario::run(&scenario, &dev, &options).unwrap();
            assert!(local.passed(), "{file}: {:?}", local.failures);
            std::thread::scope(|s| {
                let server = s.spawn(|| serve_on(&listener, &dev, &info, &open_gate(), true));
                let mut peer = ScenarioPeer::new(&at, Cm::Tcp);
                let far =
                    selsig_scenario::run_remote(&scenario, &dev, &options, &mut peer).unwrap();
                assert!(far.error.is_none(), "{file}: {:?}", far.error);
                assert_eq!(here(&far), here(&local), "{file}");
                // Every expectation held but the one a shared device breaks: the server's
                // queue pair's event, which a server on another host keeps there.
                assert!(
                    far.failures.iter().all(
                        |f| f.starts_with("async events: expected [], got [\"qp_access_err:0x")
                    ),
                    "{file}: {:?}",
                    far.failures
                );
                // error-mid expects the peer's event on mlx5: not checked, and said so.
                let unchecked = far.checked.iter().any(|c| {
                    c == "not the peer's events [\"qp_access_err:a.peer\"]: on the remote side"
                });
                assert_eq!(
                    unchecked,
                    file == "error-mid.toml",
                    "{file}: {:?}",
                    far.checked
                );
                assert_eq!(peer.server(), Some(format!("soft0 at {at}").as_str()));
                assert!(
                    server.join().unwrap().unwrap(),
                    "{file}: the server's session"
                );
            });
        }
    }

    /// A region whose end the server puts beyond 2^64 is not written to: the client stops
    /// before its first post, naming it.
    #[test]
    fn a_region_past_the_end_of_the_address_space_is_refused() {
        let (dev, pd, cq) = soft_device();
        let (at, server) = fake_server(|mut reader, mut writer| {
            let _: Hello = receive(&mut reader, "client's hello", MAX_SHORT).unwrap();
            let mut w = welcome("rxe0");
            w.addr = u64::MAX - 100;
            send(&mut writer, &w).unwrap();
        });
        let (qp, _) = crate::remote::tests::hello_from(&dev, &pd, &cq, 1, 64, 0);
        let options = ConnectOptions::default();
        let e = match RemotePeer::open(&qp, &options, (&at, Cm::Tcp), 1, 512, None) {
            Ok(_) => panic!("a region past 2^64 was taken"),
            Err(e) => format!("{e:#}"),
        };
        assert!(
            e.contains("gave a region at 0xffffffffffffff9b, where 512 bytes do not fit"),
            "{e}"
        );
        server.join().unwrap();
    }

    /// A server from before `selsig run --connect` sends no digest; one that sends a bad
    /// one is not believed: either is an error, named.
    #[test]
    fn a_digest_the_server_does_not_send_or_garbles_is_an_error() {
        for (sent, why) in [
            (None, "sent no digest of its region"),
            (
                Some("+123456789abcdef"),
                "not 16 hex digits: \"+123456789abcdef\"",
            ),
            (Some("00000000000000ff"), ""),
        ] {
            let (at, server) = fake_server(move |mut reader, mut writer| {
                let hello: Hello = receive(&mut reader, "client's hello", MAX_SHORT).unwrap();
                assert_eq!((hello.wrs, hello.size), (1, 512));
                send(&mut writer, &welcome("rxe0")).unwrap();
                let check: Check = receive(&mut reader, "client's outcomes", MAX_LINE).unwrap();
                assert!(check.digest && !check.verify && check.completed.is_empty());
                let digest = sent.map(str::to_string);
                send(
                    &mut writer,
                    &Checked {
                        mismatches: vec![],
                        digest,
                    },
                )
                .unwrap();
            });
            let mine = crate::remote::tests::wire(&"0".repeat(32))
                .endpoint()
                .unwrap();
            let peer = RemotePeer::connect(&at, &mine, 1, 512, None, Cm::Tcp).unwrap();
            match peer.digest() {
                Ok(digest) => assert_eq!((digest, why), (0xff, "")),
                Err(e) => assert!(!why.is_empty() && format!("{e:#}").contains(why), "{e:#}"),
            }
            server.join().unwrap();
        }
    }
}
