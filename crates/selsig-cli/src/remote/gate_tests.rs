//! Who `selsig serve` lets in: a client without the secret, with another one, or replaying
//! an old exchange is refused before the server creates anything for it; the limits; the
//! idle timeout; a second client told the server is busy; peers that do not prove
//! themselves hold a handshake's thread (a few at most), never the session.

use std::sync::atomic::{AtomicU32, Ordering};

use selsig::{AsyncEvent, ProviderError, QpInit};
use selsig_cli::handshake::Welcome;
use selsig_soft::{SoftCq, SoftDevice, SoftMr, SoftPd, SoftQp};

use super::serve::MAX_HANDSHAKES;
use super::tests::{hello_from, local_listener, open_gate, soft_device, soft_info};
use super::*;

/// The soft NIC, counting the objects created through it (the clients' QPs are made on
/// the same device: software QPs connect only within one).
struct Counting {
    dev: SoftDevice,
    created: AtomicU32,
}

impl Counting {
    fn new() -> Counting {
        Counting {
            dev: SoftDevice::open(selsig_soft::SoftConfig::default()).unwrap(),
            created: AtomicU32::new(0),
        }
    }
    fn created(&self) -> u32 {
        self.created.load(Ordering::SeqCst)
    }
    fn count(&self) {
        self.created.fetch_add(1, Ordering::SeqCst);
    }
    /// A client's QP on the device (not counted), and its hello for 4 slots of 64 bytes.
    fn client(&self) -> (SoftQp, SoftPd, SoftCq, String) {
        let pd = self.dev.alloc_pd().unwrap();
        let cq = self.dev.create_cq(4).unwrap();
        let (qp, hello) = hello_from(&self.dev, &pd, &cq, 4, 64, 0);
        (qp, pd, cq, hello)
    }
}

impl Device for Counting {
    type Pd = SoftPd;
    type Mr = SoftMr;
    type Cq = SoftCq;
    type Qp = SoftQp;
    fn name(&self) -> &str {
        self.dev.name()
    }
    fn alloc_pd(&self) -> Result<SoftPd, ProviderError> {
        self.count();
        self.dev.alloc_pd()
    }
    fn reg_mr(&self, pd: &SoftPd, len: usize, access: Access) -> Result<SoftMr, ProviderError> {
        self.count();
        self.dev.reg_mr(pd, len, access)
    }
    fn create_cq(&self, min_entries: u32) -> Result<SoftCq, ProviderError> {
        self.count();
        self.dev.create_cq(min_entries)
    }
    fn create_qp(
        &self,
        pd: &SoftPd,
        send: &SoftCq,
        recv: &SoftCq,
        init: &QpInit,
    ) -> Result<SoftQp, ProviderError> {
        self.count();
        self.dev.create_qp(pd, send, recv, init)
    }
    fn poll_async_event(&self) -> Option<AsyncEvent> {
        self.dev.poll_async_event()
    }
}

fn gate(secret: &Secret) -> Gate {
    Gate {
        secret: Some(secret.clone()),
        ..open_gate()
    }
}

/// Connects to `at` as a client of `mine` whose secret is `secret`'s.
fn connect(at: &str, mine: &Endpoint, secret: Result<Secret>) -> Result<RemotePeer> {
    let secret = std::cell::RefCell::new(Some(secret));
    let take = || {
        secret
            .borrow_mut()
            .take()
            .unwrap_or_else(|| bail!("asked twice"))
    };
    RemotePeer::connect_with(at, mine, (4, 64, None), &take)
}

#[test]
fn a_client_without_the_secret_or_with_another_gets_nothing_and_one_with_it_is_served() {
    let server_dev = Counting::new();
    let secret = Secret::generate().unwrap();
    let (qp, _pd, _cq, _) = server_dev.client();
    let mine = qp.endpoint(&ConnectOptions::default()).unwrap();
    let no_secret = || Err(anyhow::anyhow!("no secret given"));
    let cases: [(Result<Secret>, &str, &str); 2] = [
        (
            no_secret(),
            "lets in only clients that know its secret: no secret given",
            "the peer closed the connection before the client's proof",
        ),
        (
            Ok(Secret::generate().unwrap()),
            "refused: the client did not prove it knows this server's secret",
            "the client did not prove it knows this server's secret",
        ),
    ];
    for (given, client_says, server_says) in cases {
        let (listener, at) = local_listener();
        std::thread::scope(|s| {
            let server = s.spawn(|| {
                let stream = listener.accept().unwrap().0;
                serve_one(&server_dev, &soft_info(), &gate(&secret), stream)
            });
            let err = connect(&at, &mine, given).err().expect("refused");
            assert!(format!("{err:#}").contains(client_says), "{err:#}");
            let err = server.join().unwrap().expect_err("refused");
            assert!(format!("{err:#}").contains(server_says), "{err:#}");
        });
        assert_eq!(server_dev.created(), 0, "nothing created for it");
    }
    let (listener, at) = local_listener();
    std::thread::scope(|s| {
        let server = s.spawn(|| {
            let stream = listener.accept().unwrap().0;
            serve_one(&server_dev, &soft_info(), &gate(&secret), stream)
        });
        let peer = connect(&at, &mine, Ok(secret.clone())).unwrap();
        peer.finish_unchecked().unwrap();
        assert_eq!(server.join().unwrap().unwrap().checked(), (0, Vec::new()));
    });
    assert!(server_dev.created() >= 4, "its PD, CQ, QP and region");
}

/// A client that sends its hello and reads the server's first answer.
fn hello_and_challenge(at: &str, hello: &str) -> (BufReader<TcpStream>, TcpStream, Reply) {
    let mut writer = TcpStream::connect(at).unwrap();
    // A server that never answers fails the test rather than hangs it.
    writer
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    writer.write_all(hello.as_bytes()).unwrap();
    let mut reader = BufReader::new(writer.try_clone().unwrap());
    let reply = receive(&mut reader, "server's reply", MAX_SHORT).unwrap();
    (reader, writer, reply)
}

/// A client that says hello, proves it knows `secret`, and reads the server's answer to
/// its proof.
fn proven(at: &str, hello: &str, secret: &Secret) -> (BufReader<TcpStream>, TcpStream, Reply) {
    let (mut reader, mut writer, reply) = hello_and_challenge(at, hello);
    let Reply::Challenge(c) = reply else {
        panic!("no challenge: {reply:?}")
    };
    let proof = handshake::proof(secret, &c.challenge, hello.as_bytes()).unwrap();
    send(&mut writer, &proof).unwrap();
    let reply = receive(&mut reader, "server's reply", MAX_SHORT).unwrap();
    (reader, writer, reply)
}

#[test]
fn a_replayed_exchange_fails() {
    let server_dev = Counting::new();
    let secret = Secret::generate().unwrap();
    let (_qp, _pd, _cq, hello) = server_dev.client();
    let (listener, at) = local_listener();
    std::thread::scope(|s| {
        let server = s.spawn(|| {
            let g = gate(&secret);
            let first = serve_one(&server_dev, &soft_info(), &g, listener.accept().unwrap().0);
            let second = serve_one(&server_dev, &soft_info(), &g, listener.accept().unwrap().0);
            (first, second)
        });
        // The first exchange, seen on the wire: the hello, the challenge, the proof.
        let (mut reader, mut writer, reply) = hello_and_challenge(&at, &hello);
        let Reply::Challenge(c) = reply else {
            panic!("no challenge: {reply:?}")
        };
        let seen = handshake::proof(&secret, &c.challenge, hello.as_bytes()).unwrap();
        send(&mut writer, &seen).unwrap();
        let welcome: Reply = receive(&mut reader, "server's reply", MAX_SHORT).unwrap();
        assert!(matches!(welcome, Reply::Welcome(_)), "{welcome:?}");
        drop((reader, writer));
        // Replayed: the same hello and proof, to a new challenge.
        let (mut reader, mut writer, reply) = hello_and_challenge(&at, &hello);
        let Reply::Challenge(again) = reply else {
            panic!("no challenge: {reply:?}")
        };
        assert_ne!(again.challenge, c.challenge, "a fresh challenge");
        send(&mut writer, &seen).unwrap();
        let refused: Reply = receive(&mut reader, "server's reply", MAX_SHORT).unwrap();
        assert!(
            matches!(&refused, Reply::Refusal(r) if r.error.contains("did not prove it knows")),
            "{refused:?}"
        );
        let (first, second) = server.join().unwrap();
        assert!(first.is_err(), "the first client left without its outcomes");
        let err = format!("{:#}", second.expect_err("refused"));
        assert!(err.contains("did not prove it knows"), "{err}");
    });
    assert_eq!(server_dev.created(), 4, "the first session's objects only");
}

#[test]
fn a_request_beyond_the_limits_is_refused_after_the_proof_and_before_anything_is_made() {
    let server_dev = Counting::new();
    let secret = Secret::generate().unwrap();
    let (qp, _pd, _cq, _) = server_dev.client();
    let mine = qp.endpoint(&ConnectOptions::default()).unwrap();
    let small = Gate {
        limits: Limits {
            max_bytes: 128,
            ..open_gate().limits
        },
        ..gate(&secret)
    };
    let (listener, at) = local_listener();
    std::thread::scope(|s| {
        let server = s.spawn(|| {
            let stream = listener.accept().unwrap().0;
            serve_one(&server_dev, &soft_info(), &small, stream)
        });
        // 4 slots of 64 bytes: 256.
        let err = connect(&at, &mine, Ok(secret.clone()))
            .err()
            .expect("refused");
        let want = "this server registers at most 1048576 slots and 128 bytes in all (its \
                    --max-memory)";
        assert!(format!("{err:#}").contains(want), "{err:#}");
        assert!(server.join().unwrap().is_err());
    });
    assert_eq!(server_dev.created(), 0);
}

#[test]
fn a_session_that_stays_silent_past_the_idle_timeout_is_ended() {
    let (dev, pd, cq) = soft_device();
    let (_qp, hello) = hello_from(&dev, &pd, &cq, 4, 64, 0);
    let quick = Gate {
        limits: Limits {
            idle: Duration::from_millis(300),
            ..open_gate().limits
        },
        ..open_gate()
    };
    let (listener, at) = local_listener();
    std::thread::scope(|s| {
        let server = s.spawn(|| {
            let stream = listener.accept().unwrap().0;
            serve_one(&dev, &soft_info(), &quick, stream)
        });
        let (mut reader, _writer, reply) = hello_and_challenge(&at, &hello);
        assert!(matches!(reply, Reply::Welcome(_)), "{reply:?}");
        let start = Instant::now();
        let err = format!("{:#}", server.join().unwrap().expect_err("ended"));
        assert_eq!(err, "no client's outcomes came within 300ms");
        assert!(start.elapsed() < Duration::from_secs(5));
        // The client is told.
        let refused: Reply = receive(&mut reader, "server's reply", MAX_SHORT).unwrap();
        assert!(matches!(refused, Reply::Refusal(r) if r.error == err));
    });
}

#[test]
fn a_client_that_comes_while_another_is_served_is_told_the_server_is_busy() {
    let (dev, pd, cq) = soft_device();
    let (_qp, hello) = hello_from(&dev, &pd, &cq, 4, 64, 0);
    let secret = Secret::generate().unwrap();
    let (listener, at) = local_listener();
    std::thread::scope(|s| {
        let server = s.spawn(|| serve_on(&listener, &dev, &soft_info(), &gate(&secret), true));
        // The first client proves itself and holds its session, welcomed.
        let (first_reader, first_writer, reply) = proven(&at, &hello, &secret);
        assert!(matches!(reply, Reply::Welcome(_)), "{reply:?}");
        // The second proves itself too, waits for the session to end, and is told.
        let (_reader, _writer, reply) = proven(&at, &hello, &secret);
        assert!(
            matches!(&reply, Reply::Refusal(r) if r.error.starts_with("busy: this server serves one client at a time")),
            "{reply:?}"
        );
        // Many more, which send their hello and hold their connections: each holds a
        // handshake's thread or is told there are too many, none holds the server.
        let held: Vec<TcpStream> = (0..100)
            .map(|_| {
                let mut c = TcpStream::connect(&at).unwrap();
                c.write_all(hello.as_bytes()).unwrap();
                c
            })
            .collect();
        // The first one leaves: its session ends, and with --once the server, soon.
        let start = Instant::now();
        drop((first_reader, first_writer));
        assert!(!server.join().unwrap().unwrap(), "the session failed");
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{:?}",
            start.elapsed()
        );
        drop(held);
    });
}

/// A client that asks for rdma_cm gets, past its proof, the server's rendezvous or, where
/// the server cannot listen with rdma_cm (this host: no RDMA device, or no librdmacm),
/// a refusal that says so: either way nothing is created for it before its connection
/// request comes with the token (and a soft QP cannot make one: the client says so).
#[test]
fn an_rdma_cm_client_gets_nothing_before_its_connection_request() {
    let server_dev = Counting::new();
    let secret = Secret::generate().unwrap();
    let (qp, _pd, _cq, _) = server_dev.client();
    let mine = qp.endpoint(&ConnectOptions::default()).unwrap();
    let (listener, at) = local_listener();
    std::thread::scope(|s| {
        let server = s.spawn(|| {
            let stream = listener.accept().unwrap().0;
            serve_one(&server_dev, &soft_info(), &gate(&secret), stream)
        });
        let take = || Ok(secret.clone());
        match RemotePeer::connect_cm(&at, &mine, (4, 64, None), &take, Cm::Rdma) {
            Err(e) => {
                let e = format!("{e:#}");
                assert!(
                    e.contains("refused: cannot listen with rdma_cm on 127.0.0.1"),
                    "{e}"
                );
            }
            Ok(mut peer) => {
                let r = peer.rendezvous.take().expect("a rendezvous");
                assert!(peer.endpoint.is_none());
                let options = ConnectOptions::default();
                let e = rdma::connect(&qp, &mut peer, &r, &options, 256).unwrap_err();
                assert!(
                    e.downcast_ref::<crate::common::BadOption>().is_some(),
                    "{e:#}"
                );
            }
        }
        // The server ends the session (its client is gone, or it refused).
        assert!(server.join().unwrap().is_err());
    });
    assert_eq!(server_dev.created(), 0, "nothing created for it");
}

/// A `--cm rdma` client of a server from before rdma_cm (which ignores the field and
/// welcomes it) stops and says so; a `--cm tcp` hello is as before (no `rdma_cm` field).
#[test]
fn an_rdma_cm_client_of_an_older_server_stops_and_a_tcp_hello_is_unchanged() {
    let hello = Hello {
        version: PROTOCOL,
        qp: Wire::from_endpoint(&super::tests::wire(&"0".repeat(32)).endpoint().unwrap()),
        wrs: 1,
        size: 64,
        run_s: 0,
        rdma_cm: false,
    };
    assert!(!serde_json::to_string(&hello).unwrap().contains("rdma_cm"));
    let reply: Reply = handshake::parse(
        br#"{"version":2,"cm_port":4791,"token":"00112233445566778899aabbccddeeff","device":"rxe0"}"#,
        "server's reply",
    )
    .unwrap();
    assert!(
        matches!(reply, Reply::Rendezvous(ref r) if r.cm_port == 4791),
        "{reply:?}"
    );
    // An older server: a welcome to an rdma_cm hello.
    let (listener, at) = local_listener();
    std::thread::scope(|s| {
        s.spawn(|| {
            let (stream, _) = listener.accept().unwrap();
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            let mut writer = stream;
            let welcome = Welcome {
                version: PROTOCOL,
                qp: super::tests::wire(&"0".repeat(32)),
                addr: 0,
                rkey: 0,
                device: "old".into(),
            };
            send(&mut writer, &welcome).unwrap();
        });
        let mine = super::tests::wire(&"0".repeat(32)).endpoint().unwrap();
        let e = RemotePeer::connect_cm(&at, &mine, (1, 64, None), &|| bail!("no secret"), Cm::Rdma)
            .err()
            .expect("stopped");
        assert!(
            format!("{e:#}").contains(
                "does not connect through rdma_cm (a selsig from before --cm): use --cm tcp"
            ),
            "{e:#}"
        );
    });
}

/// A client that connects while the last session ends (a bench's next point, as soon as
/// it has the last one's result) waits for it and is served, not told the server is busy.
#[test]
fn a_client_that_comes_as_the_session_ends_is_served() {
    // The server serves for ever: its thread outlives the test's scope, so what it uses
    // lives as long.
    let (dev, pd, cq) = soft_device();
    let (_qp, hello) = hello_from(&dev, &pd, &cq, 4, 64, 0);
    let dev: &'static SoftDevice = Box::leak(Box::new(dev));
    let secret = Secret::generate().unwrap();
    let (listener, at) = local_listener();
    let g = gate(&secret);
    std::thread::spawn(move || serve_on(&listener, dev, &soft_info(), &g, false));
    let (first_reader, first_writer, reply) = proven(&at, &hello, &secret);
    assert!(matches!(reply, Reply::Welcome(_)), "{reply:?}");
    std::thread::scope(|s| {
        let second = s.spawn(|| proven(&at, &hello, &secret).2);
        // The second is in; then the first leaves, well within the grace.
        std::thread::sleep(Duration::from_millis(300));
        drop((first_reader, first_writer));
        let reply = second.join().unwrap();
        assert!(matches!(reply, Reply::Welcome(_)), "{reply:?}");
    });
}

/// A peer that connects and says nothing, and one that says hello and never sends its
/// proof, each hold a handshake's thread, not the session: a client with the secret that
/// comes after them is served at once, well before they run out of time, and its session
/// is a `--once` server's one (a handshake refused meanwhile changes nothing).
#[test]
fn peers_that_do_not_prove_themselves_keep_no_client_waiting() {
    let server_dev = Counting::new();
    let secret = Secret::generate().unwrap();
    let (qp, _pd, _cq, hello) = server_dev.client();
    let mine = qp.endpoint(&ConnectOptions::default()).unwrap();
    let (listener, at) = local_listener();
    std::thread::scope(|s| {
        let server =
            s.spawn(|| serve_on(&listener, &server_dev, &soft_info(), &gate(&secret), true));
        let silent = TcpStream::connect(&at).unwrap();
        let (mut reader, mut writer, reply) = hello_and_challenge(&at, &hello);
        let Reply::Challenge(c) = reply else {
            panic!("no challenge: {reply:?}")
        };
        let start = Instant::now();
        let peer = connect(&at, &mine, Ok(secret.clone())).unwrap();
        // The one that was challenged sends a wrong proof now: refused, and the server,
        // which has its session, goes on.
        let other = Secret::generate().unwrap();
        let proof = handshake::proof(&other, &c.challenge, hello.as_bytes()).unwrap();
        send(&mut writer, &proof).unwrap();
        let refused: Reply = receive(&mut reader, "server's reply", MAX_SHORT).unwrap();
        assert!(
            matches!(&refused, Reply::Refusal(r) if r.error.contains("did not prove it knows")),
            "{refused:?}"
        );
        // The server takes the refusal's end within its poll (20 ms).
        std::thread::sleep(Duration::from_millis(200));
        peer.finish_unchecked().unwrap();
        assert!(
            server.join().unwrap().unwrap(),
            "the --once server's session is the admitted client's"
        );
        assert!(
            start.elapsed() < HELLO_WAIT / 2,
            "served in {:?}",
            start.elapsed()
        );
        drop(silent);
    });
    assert!(server_dev.created() >= 4, "its PD, CQ, QP and region");
}

/// With [`MAX_HANDSHAKES`] silent connections open, the next one is told at once why it is
/// not served; once they go, a client with the secret is.
#[test]
fn a_connection_beyond_the_handshakes_under_way_is_refused_at_once() {
    // The server serves for ever: its thread outlives the test, so what it uses lives as
    // long.
    let dev: &'static Counting = Box::leak(Box::new(Counting::new()));
    let (qp, _pd, _cq, _) = dev.client();
    let mine = qp.endpoint(&ConnectOptions::default()).unwrap();
    let secret = Secret::generate().unwrap();
    let (listener, at) = local_listener();
    let g = gate(&secret);
    std::thread::spawn(move || serve_on(&listener, dev, &soft_info(), &g, false));
    let silent: Vec<TcpStream> = (0..MAX_HANDSHAKES)
        .map(|_| TcpStream::connect(&at).unwrap())
        .collect();
    let start = Instant::now();
    let crowded = TcpStream::connect(&at).unwrap();
    crowded
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let reply: Reply = receive(&mut BufReader::new(crowded), "server's reply", MAX_SHORT).unwrap();
    assert!(
        matches!(&reply, Reply::Refusal(r) if r.error.starts_with("too many clients are proving themselves")),
        "{reply:?}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
    // A client of the crowded server is told so too.
    let err = connect(&at, &mine, Ok(secret.clone()))
        .err()
        .expect("refused");
    assert!(
        format!("{err:#}").contains("refused: too many clients are proving themselves"),
        "{err:#}"
    );
    // They go: their handshakes end as soon as the server reads their end.
    drop(silent);
    let until = Instant::now() + Duration::from_secs(5);
    let peer = loop {
        match connect(&at, &mine, Ok(secret.clone())) {
            Err(e) if format!("{e:#}").contains("too many") && Instant::now() < until => {
                std::thread::sleep(Duration::from_millis(20));
            }
            other => break other.unwrap(),
        }
    };
    peer.finish_unchecked().unwrap();
}
