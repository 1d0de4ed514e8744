//! One non-blocking Redis connection, driven by its owner's mio poll.
//!
//! States: `Down` (waiting for the back-off to end) → `Connecting` (a
//! non-blocking `connect` under way) → `Up` (the handshake, AUTH and SELECT
//! from the URL, is pipelined ahead of any command, so commands can be sent
//! as soon as the socket connects). Any error, a reply that is not RESP, a
//! refused AUTH/SELECT, or silence past [`DEAD_AFTER`] while a PING is
//! unanswered drops the socket and goes back to `Down`, with a back-off that
//! doubles from [`BACKOFF_MIN`] to [`BACKOFF_MAX`] (reset once a connection
//! has answered).
//!
//! Commands are pipelined: each one carries a tag of the owner's type `T`,
//! and its reply comes back with that tag, in order. Replies nobody asked
//! for (pub/sub pushes, in subscriber mode) come back untagged. The queue is
//! bounded ([`MAX_PENDING`] replies awaited, [`MAX_OUT`] bytes unsent): past
//! it [`Conn::send`] refuses rather than grow. Nothing here blocks: the
//! address is resolved by the owner (once, at start-up), the socket is
//! non-blocking, and reads and writes go until `WouldBlock`.
//!
//! With TLS (`rediss://`) the same socket carries a rustls client session,
//! driven by hand: what arrives goes through `read_tls` and the session's
//! plaintext into the decoder; what is queued goes into the session and out
//! through `write_tls` until the socket is full. The handshake starts with
//! the first write and the queued commands wait in the session meanwhile.
//!
//! It must not know what the commands mean (that is the owner's), and must
//! not register anything but its own socket, under the token it was given.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::net::TcpStream;
use mio::{Interest, Registry, Token};

use super::resp::{self, Value};
use super::RedisTarget;

/// TLS towards the server: the client configuration (roots, versions) and the
/// name its certificate must carry.
#[derive(Clone)]
pub struct TlsTo {
    /// Trusted roots, TLS 1.2 and 1.3 with ring.
    pub config: Arc<rustls::ClientConfig>,
    /// The URL's host.
    pub name: rustls::pki_types::ServerName<'static>,
}

/// Replies awaited at most; [`Conn::send`] refuses past it.
pub const MAX_PENDING: usize = 100_000;
/// Unsent bytes at most; [`Conn::send`] refuses past it.
pub const MAX_OUT: usize = 16 << 20;
/// How often an idle connection is pinged.
pub const PING_EVERY: Duration = Duration::from_millis(500);
/// A connection that has not answered for this long (a PING included) is dropped.
pub const DEAD_AFTER: Duration = Duration::from_millis(2000);
/// The first reconnect delay.
pub const BACKOFF_MIN: Duration = Duration::from_millis(50);
/// The longest reconnect delay.
pub const BACKOFF_MAX: Duration = Duration::from_millis(1000);

/// What a reply was for.
enum Awaited<T> {
    /// AUTH, SELECT, PING: checked here.
    Internal,
    /// The owner's command.
    Owner(T),
}

enum State {
    Down { retry_at: Instant },
    Connecting { since: Instant },
    Up,
}

/// What happened during one call, for the owner.
#[derive(Debug, PartialEq, Eq)]
pub enum Change {
    /// Nothing the owner must react to.
    None,
    /// The connection answered its first reply (the handshake went through).
    Up,
    /// The connection was lost; the owner's awaited replies will never come.
    Down,
}

/// One connection; `T` tags the owner's commands.
pub struct Conn<T> {
    name: &'static str,
    addr: Option<SocketAddr>,
    target: RedisTarget,
    token: Token,
    /// Commands sent right after connecting (after AUTH/SELECT), such as SUBSCRIBE.
    on_connect: Vec<Vec<Vec<u8>>>,
    /// In subscriber mode PING's answer is a push, not a reply.
    subscriber: bool,
    state: State,
    stream: Option<TcpStream>,
    /// `rediss://`: how to make a session for each connection.
    tls: Option<TlsTo>,
    /// The TLS session of the current connection.
    session: Option<rustls::ClientConnection>,
    out: Vec<u8>,
    out_pos: usize,
    input: Vec<u8>,
    awaited: VecDeque<Awaited<T>>,
    backoff: Duration,
    answered: bool,
    /// A failed TLS session was logged at warn level (later ones at debug, until one works).
    tls_warned: bool,
    last_rx: Instant,
    last_ping: Instant,
    /// Drops so far (for the owner's log line).
    pub drops: u64,
}

impl<T> Conn<T> {
    /// A connection to `addr` (`None`: the name did not resolve; it stays down),
    /// registered under `token`, over TLS when `tls` is given. `subscriber`:
    /// pushes, not replies, answer PING.
    pub fn new(
        name: &'static str,
        target: RedisTarget,
        addr: Option<SocketAddr>,
        tls: Option<TlsTo>,
        token: Token,
        subscriber: bool,
    ) -> Conn<T> {
        let now = Instant::now();
        Conn {
            name,
            addr,
            target,
            token,
            on_connect: Vec::new(),
            subscriber,
            state: State::Down { retry_at: now },
            stream: None,
            tls,
            session: None,
            out: Vec::new(),
            out_pos: 0,
            input: Vec::new(),
            awaited: VecDeque::new(),
            backoff: BACKOFF_MIN,
            answered: false,
            tls_warned: false,
            last_rx: now,
            last_ping: now,
            drops: 0,
        }
    }

    /// Send `args` after every (re)connect, before any other command.
    pub fn on_connect(&mut self, args: &[&[u8]]) {
        self.on_connect.push(args.iter().map(|a| a.to_vec()).collect());
    }

    /// Whether the connection is up and has answered.
    pub fn is_up(&self) -> bool {
        matches!(self.state, State::Up) && self.answered
    }

    /// Whether commands may be queued now (the socket is connecting or up).
    pub fn accepts(&self) -> bool {
        !matches!(self.state, State::Down { .. })
            && self.awaited.len() < MAX_PENDING
            && self.out.len() - self.out_pos < MAX_OUT
    }

    /// Replies still awaited.
    pub fn awaited(&self) -> usize {
        self.awaited.len()
    }

    /// Queue a command; `false` (nothing queued) when the connection is down
    /// or its queue is full.
    pub fn send(&mut self, args: &[&[u8]], tag: T) -> bool {
        if !self.accepts() {
            return false;
        }
        resp::encode(&mut self.out, args);
        self.awaited.push_back(Awaited::Owner(tag));
        true
    }

    /// When [`Conn::tick`] must run next at the latest.
    pub fn deadline(&self) -> Instant {
        match self.state {
            State::Down { retry_at } => retry_at,
            State::Connecting { since } => since + DEAD_AFTER,
            State::Up => (self.last_ping + PING_EVERY).min(self.last_rx + DEAD_AFTER),
        }
    }

    /// Timers: connect when the back-off is over, ping when idle, drop a
    /// connection that stopped answering; then write what is queued.
    pub fn tick(&mut self, registry: &Registry, now: Instant) -> Change {
        match self.state {
            State::Down { retry_at } if now >= retry_at => {
                if let Err(e) = self.connect(registry, now) {
                    log::debug!("redis {}: connect to {}: {e}", self.name, self.target);
                    self.down(registry, now);
                }
            }
            State::Down { .. } => {}
            State::Connecting { since } if now.duration_since(since) >= DEAD_AFTER => {
                log::debug!("redis {}: connect to {} timed out", self.name, self.target);
                return self.fail(registry, now);
            }
            State::Connecting { .. } => {}
            State::Up => {
                if now.duration_since(self.last_rx) >= DEAD_AFTER {
                    log::debug!("redis {}: no answer for {:?}", self.name, DEAD_AFTER);
                    return self.fail(registry, now);
                }
                if now.duration_since(self.last_ping) >= PING_EVERY {
                    self.last_ping = now;
                    resp::encode(&mut self.out, &[b"PING"]);
                    if !self.subscriber {
                        self.awaited.push_back(Awaited::Internal);
                    }
                }
            }
        }
        self.flush(registry, now)
    }

    /// The socket is ready: read and decode what came (replies into
    /// `replies`, with their tags; pushes untagged), write what is queued.
    pub fn ready(&mut self, registry: &Registry, now: Instant, replies: &mut Vec<(Option<T>, Value)>) -> Change {
        let mut change = Change::None;
        if let State::Connecting { .. } = self.state {
            match self.stream.as_ref().map(|s| (s.take_error(), s.peer_addr())) {
                Some((Ok(None), Ok(_))) => {
                    self.state = State::Up;
                    self.last_rx = now;
                    self.last_ping = now;
                }
                Some((Ok(None), Err(e))) if e.kind() == io::ErrorKind::NotConnected => return Change::None,
                _ => return self.fail(registry, now),
            }
        }
        let Some(stream) = self.stream.as_mut() else { return Change::None };
        // Replies that came before the end of the stream are still handed over.
        let closed = match self.session.as_mut() {
            None => read_plain(stream, &mut self.input),
            Some(session) => match read_tls(stream, session, &mut self.input) {
                Ok(closed) => closed,
                Err(e) => {
                    if std::mem::replace(&mut self.tls_warned, true) {
                        log::debug!("redis {}: {}: TLS: {e}", self.name, self.target);
                    } else {
                        log::warn!("redis {}: {}: TLS: {e}", self.name, self.target);
                    }
                    return self.fail(registry, now);
                }
            },
        };
        let mut used = 0;
        loop {
            match resp::decode(&self.input[used..]) {
                Ok(Some((value, n))) => {
                    used += n;
                    self.last_rx = now;
                    if !self.answered {
                        self.answered = true;
                        self.tls_warned = false;
                        self.backoff = BACKOFF_MIN;
                        change = Change::Up;
                    }
                    match self.awaited.pop_front() {
                        Some(Awaited::Internal) => {
                            if let Value::Error(e) = value {
                                log::error!("redis {}: {} refused the handshake: {e}", self.name, self.target);
                                self.input.drain(..used);
                                return self.fail(registry, now);
                            }
                        }
                        Some(Awaited::Owner(tag)) => replies.push((Some(tag), value)),
                        None => replies.push((None, value)),
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    log::warn!("redis {}: {}: bad reply: {e}", self.name, self.target);
                    return self.fail(registry, now);
                }
            }
        }
        self.input.drain(..used);
        if closed {
            return match self.fail(registry, now) {
                Change::None => change,
                other => other,
            };
        }
        match self.flush(registry, now) {
            Change::None => change,
            other => other,
        }
    }

    fn connect(&mut self, registry: &Registry, now: Instant) -> io::Result<()> {
        let addr = self.addr.ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "address not resolved"))?;
        self.session = match &self.tls {
            Some(tls) => Some(
                rustls::ClientConnection::new(Arc::clone(&tls.config), tls.name.clone()).map_err(io::Error::other)?,
            ),
            None => None,
        };
        let mut stream = TcpStream::connect(addr)?;
        let _ = stream.set_nodelay(true);
        registry.register(&mut stream, self.token, Interest::READABLE | Interest::WRITABLE)?;
        self.stream = Some(stream);
        self.state = State::Connecting { since: now };
        self.answered = false;
        // The handshake goes first, ahead of anything the owner queued.
        let mut head = Vec::new();
        let mut internal = 0;
        let auth: Option<Vec<&[u8]>> = match (&self.target.user, &self.target.password) {
            (Some(u), Some(p)) => Some(vec![b"AUTH", u.as_bytes(), p.as_bytes()]),
            (None, Some(p)) => Some(vec![b"AUTH", p.as_bytes()]),
            _ => None,
        };
        if let Some(auth) = auth {
            resp::encode(&mut head, &auth);
            internal += 1;
        }
        if self.target.db != 0 && !self.subscriber {
            resp::encode(&mut head, &[b"SELECT", self.target.db.to_string().as_bytes()]);
            internal += 1;
        }
        for args in &self.on_connect {
            let args: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
            resp::encode(&mut head, &args);
        }
        // PING proves the handshake went through even when it is empty.
        resp::encode(&mut head, &[b"PING"]);
        if !self.subscriber {
            internal += 1;
        }
        for _ in 0..internal {
            self.awaited.push_front(Awaited::Internal);
        }
        head.extend_from_slice(&self.out[self.out_pos..]);
        self.out = head;
        self.out_pos = 0;
        self.last_rx = now;
        self.last_ping = now;
        Ok(())
    }

    /// Write what is queued until the socket is full.
    fn flush(&mut self, registry: &Registry, now: Instant) -> Change {
        if !matches!(self.state, State::Up) {
            return Change::None;
        }
        let Some(stream) = self.stream.as_mut() else { return Change::None };
        let written = match self.session.as_mut() {
            None => write_plain(stream, &self.out, &mut self.out_pos),
            Some(session) => write_tls(stream, session, &self.out, &mut self.out_pos),
        };
        if written.is_err() {
            return self.fail(registry, now);
        }
        if self.out_pos == self.out.len() {
            self.out.clear();
            self.out_pos = 0;
        } else if self.out_pos > 64 * 1024 {
            self.out.drain(..self.out_pos);
            self.out_pos = 0;
        }
        Change::None
    }

    /// Drop the connection; report `Down` if it had been up.
    fn fail(&mut self, registry: &Registry, now: Instant) -> Change {
        let was_up = self.answered;
        self.down(registry, now);
        if was_up {
            Change::Down
        } else {
            Change::None
        }
    }

    fn down(&mut self, registry: &Registry, now: Instant) {
        if let Some(mut s) = self.stream.take() {
            let _ = registry.deregister(&mut s);
        }
        self.session = None;
        self.drops += 1;
        self.out.clear();
        self.out_pos = 0;
        self.input.clear();
        self.awaited.clear();
        self.answered = false;
        self.state = State::Down { retry_at: now + self.backoff };
        self.backoff = (self.backoff * 2).min(BACKOFF_MAX);
    }
}

/// Read until the socket would block, into `input`; whether the stream ended.
fn read_plain(stream: &mut TcpStream, input: &mut Vec<u8>) -> bool {
    let mut buf = [0u8; 16 * 1024];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return true,
            Ok(n) => input.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return false,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return true,
        }
    }
}

/// Read TLS records until the socket would block, their plaintext into
/// `input`; whether the stream ended (or the server closed the session). An
/// error is a session that cannot go on (a certificate that does not verify,
/// a bad record).
fn read_tls(
    stream: &mut TcpStream,
    session: &mut rustls::ClientConnection,
    input: &mut Vec<u8>,
) -> Result<bool, rustls::Error> {
    loop {
        match session.read_tls(stream) {
            Ok(0) => return Ok(true),
            Ok(_) => {
                let state = session.process_new_packets()?;
                let n = state.plaintext_bytes_to_read();
                if n > 0 {
                    let at = input.len();
                    input.resize(at + n, 0);
                    let got = session.reader().read(&mut input[at..]).unwrap_or(0);
                    input.truncate(at + got);
                }
                if state.peer_has_closed() {
                    return Ok(true);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return Ok(true),
        }
    }
}

/// Write `out[*pos..]` until the socket would block; `Err` drops the connection.
fn write_plain(stream: &mut TcpStream, out: &[u8], pos: &mut usize) -> io::Result<()> {
    while *pos < out.len() {
        match stream.write(&out[*pos..]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => *pos += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Move `out[*pos..]` into the session (as much as its buffer takes; before the
/// handshake ends it waits there) and the session's records into the socket,
/// until the socket would block or nothing moves; `Err` drops the connection.
fn write_tls(
    stream: &mut TcpStream,
    session: &mut rustls::ClientConnection,
    out: &[u8],
    pos: &mut usize,
) -> io::Result<()> {
    loop {
        let mut moved = false;
        if *pos < out.len() {
            let n = session.writer().write(&out[*pos..])?;
            *pos += n;
            moved |= n > 0;
        }
        while session.wants_write() {
            match session.write_tls(stream) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(_) => moved = true,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
        if !moved || *pos == out.len() {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader};
    use std::net::TcpListener;

    /// A fake Redis: accepts one connection, reads `expect` commands (each an array of
    /// bulk strings), answers each with `answer(cmd)`, then closes.
    fn fake(
        listener: TcpListener,
        expect: usize,
        answer: fn(&[String]) -> String,
    ) -> std::thread::JoinHandle<Vec<Vec<String>>> {
        std::thread::spawn(move || {
            let (sock, _) = listener.accept().expect("accept");
            sock.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
            serve(sock, expect, answer)
        })
    }

    /// The fake's protocol over `stream`: read `expect` commands, answer each.
    fn serve(stream: impl Read + Write, expect: usize, answer: fn(&[String]) -> String) -> Vec<Vec<String>> {
        let mut r = BufReader::new(stream);
        let mut seen = Vec::new();
        for _ in 0..expect {
            let mut line = String::new();
            r.read_line(&mut line).expect("array head");
            let n: usize = line.trim_start_matches('*').trim().parse().expect("array length");
            let mut args = Vec::new();
            for _ in 0..n {
                line.clear();
                r.read_line(&mut line).expect("bulk head");
                line.clear();
                r.read_line(&mut line).expect("bulk");
                args.push(line.trim_end().to_owned());
            }
            r.get_mut().write_all(answer(&args).as_bytes()).expect("answer");
            r.get_mut().flush().expect("flush");
            seen.push(args);
        }
        seen
    }

    /// A CA and a certificate for 127.0.0.1 it signed: (the CA's DER, a server config).
    fn pki() -> (rustls::pki_types::CertificateDer<'static>, Arc<rustls::ServerConfig>) {
        let ca_key = rcgen::KeyPair::generate().expect("CA key");
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca_cert = ca.self_signed(&ca_key).expect("CA cert");
        let key = rcgen::KeyPair::generate().expect("key");
        let params = rcgen::CertificateParams::new(vec!["127.0.0.1".into()]).expect("params");
        let cert = params.signed_by(&key, &ca_cert, &ca_key).expect("cert");
        let key = rustls::pki_types::PrivateKeyDer::try_from(key.serialize_der()).expect("key der");
        let server = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_no_client_auth()
            .with_single_cert(vec![cert.der().clone()], key)
            .expect("server config");
        (ca_cert.der().clone(), Arc::new(server))
    }

    /// TLS towards 127.0.0.1, trusting `ca`.
    fn tls_trusting(ca: rustls::pki_types::CertificateDer<'static>) -> TlsTo {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca).expect("root");
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        let name = rustls::pki_types::ServerName::try_from("127.0.0.1").expect("name").to_owned();
        TlsTo { config: Arc::new(config), name }
    }

    #[test]
    fn over_tls_commands_flow_and_a_certificate_from_another_ca_is_refused() {
        let (ca, server) = pki();
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let config = Arc::clone(&server);
        let fake = std::thread::spawn(move || {
            let (sock, _) = listener.accept().expect("accept");
            sock.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
            let tls = rustls::ServerConnection::new(config).expect("session");
            serve(rustls::StreamOwned::new(tls, sock), 3, |args| match args[0].as_str() {
                "AUTH" | "PING" => "+OK\r\n".into(),
                _ => format!("${}\r\n{}\r\n", args[1].len(), args[1]),
            })
        });
        let mut poll = mio::Poll::new().expect("poll");
        let t = RedisTarget { tls: true, ..target(addr.port(), Some("pw"), 0) };
        let mut conn: Conn<u32> = Conn::new("test", t, Some(addr), Some(tls_trusting(ca)), Token(1), false);
        conn.tick(poll.registry(), Instant::now());
        // Queued before the handshake: it waits in the session, then goes out.
        assert!(conn.send(&[b"ECHO", b"over tls"], 4));
        let mut replies = Vec::new();
        drive(&mut poll, &mut conn, &mut replies, |_, r| !r.is_empty());
        assert_eq!(replies, [(Some(4), Value::Bulk(Some(b"over tls".to_vec())))]);
        let seen = fake.join().expect("fake server");
        assert_eq!(seen[0], ["AUTH", "pw"], "the password went inside TLS, first");

        // A server whose certificate another CA signed: the session fails, never up.
        let (other_ca, _) = pki();
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let fake = std::thread::spawn(move || {
            let (sock, _) = listener.accept().expect("accept");
            sock.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
            let tls = rustls::ServerConnection::new(server).expect("session");
            let mut stream = rustls::StreamOwned::new(tls, sock);
            let mut buf = [0u8; 64];
            stream.read(&mut buf).is_err() // the client's alert ends the handshake
        });
        let t = RedisTarget { tls: true, ..target(addr.port(), None, 0) };
        let mut conn: Conn<u32> = Conn::new("test", t, Some(addr), Some(tls_trusting(other_ca)), Token(1), false);
        conn.tick(poll.registry(), Instant::now());
        let mut replies = Vec::new();
        drive(&mut poll, &mut conn, &mut replies, |c, _| c.drops >= 1);
        assert!(!conn.is_up() && replies.is_empty());
        assert!(fake.join().expect("fake server"), "the server's handshake failed too");
    }

    /// Drive `conn` until `done` says so (bounded).
    fn drive<T>(
        poll: &mut mio::Poll,
        conn: &mut Conn<T>,
        replies: &mut Vec<(Option<T>, Value)>,
        done: impl Fn(&Conn<T>, &[(Option<T>, Value)]) -> bool,
    ) {
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut events = mio::Events::with_capacity(8);
        while !done(conn, replies) {
            assert!(Instant::now() < deadline, "timed out");
            conn.tick(poll.registry(), Instant::now());
            poll.poll(&mut events, Some(Duration::from_millis(10))).expect("poll");
            if !events.is_empty() {
                conn.ready(poll.registry(), Instant::now(), replies);
            }
        }
    }

    fn target(port: u16, password: Option<&str>, db: u32) -> RedisTarget {
        RedisTarget {
            tls: false,
            ca_file: None,
            host: "127.0.0.1".into(),
            port,
            user: None,
            password: password.map(Into::into),
            db,
        }
    }

    #[test]
    fn auth_and_select_go_first_and_replies_come_back_with_their_tags() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let server = fake(listener, 5, |args| match args[0].as_str() {
            "AUTH" | "SELECT" => "+OK\r\n".into(),
            "PING" => "+PONG\r\n".into(),
            "INCRBY" => format!(":{}\r\n", args[2]),
            _ => "$-1\r\n".into(),
        });
        let mut poll = mio::Poll::new().expect("poll");
        let mut conn: Conn<u32> =
            Conn::new("test", target(addr.port(), Some("pw"), 7), Some(addr), None, Token(1), false);
        assert!(!conn.send(&[b"GET", b"k"], 0), "nothing is queued while down");
        conn.tick(poll.registry(), Instant::now());
        assert!(conn.send(&[b"INCRBY", b"k", b"5"], 1));
        assert!(conn.send(&[b"GET", b"k"], 2));
        let mut replies = Vec::new();
        drive(&mut poll, &mut conn, &mut replies, |_, r| r.len() == 2);
        assert_eq!(replies, [(Some(1), Value::Int(5)), (Some(2), Value::Bulk(None))]);
        let seen = server.join().expect("fake server");
        let names: Vec<&str> = seen.iter().map(|a| a[0].as_str()).collect();
        assert_eq!(names, ["AUTH", "SELECT", "PING", "INCRBY", "GET"]);
        assert_eq!(seen[0], ["AUTH", "pw"]);
        assert_eq!(seen[1], ["SELECT", "7"]);
        // The fake server closed (maybe in the same read as the replies, which still count):
        // the connection goes down, then tries again by itself.
        drive(&mut poll, &mut conn, &mut replies, |c, _| !c.is_up());
        assert!(conn.drops >= 1);
    }

    #[test]
    fn replies_that_arrive_with_the_end_of_the_stream_are_not_lost() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let server = fake(listener, 2, |args| match args[0].as_str() {
            "PING" => "+PONG\r\n".into(),
            _ => "$1\r\nv\r\n".into(),
        });
        let mut poll = mio::Poll::new().expect("poll");
        let mut conn: Conn<u32> = Conn::new("test", target(addr.port(), None, 0), Some(addr), None, Token(1), false);
        conn.tick(poll.registry(), Instant::now());
        assert!(conn.send(&[b"GET", b"k"], 9));
        let mut replies = Vec::new();
        // Connected and the commands written; nothing read yet.
        drive(&mut poll, &mut conn, &mut replies, |c, _| matches!(c.state, State::Up));
        // The server answers and closes before the connection reads: one read gets both.
        server.join().expect("fake server");
        let change = conn.ready(poll.registry(), Instant::now(), &mut replies);
        assert_eq!(replies, [(Some(9), Value::Bulk(Some(b"v".to_vec())))]);
        assert_eq!(change, Change::Down);
        assert!(!conn.is_up());
    }

    #[test]
    fn a_refused_password_drops_the_connection() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let server = fake(listener, 1, |_| "-WRONGPASS invalid password\r\n".into());
        let mut poll = mio::Poll::new().expect("poll");
        let mut conn: Conn<u32> =
            Conn::new("test", target(addr.port(), Some("bad"), 0), Some(addr), None, Token(1), false);
        conn.tick(poll.registry(), Instant::now());
        let mut replies = Vec::new();
        drive(&mut poll, &mut conn, &mut replies, |c, _| c.drops > 0);
        assert!(!conn.is_up());
        assert!(replies.is_empty());
        server.join().expect("fake server");
    }

    #[test]
    fn nothing_listening_means_down_with_a_growing_back_off() {
        let port = TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port();
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let mut poll = mio::Poll::new().expect("poll");
        let mut conn: Conn<u32> = Conn::new("test", target(port, None, 0), Some(addr), None, Token(1), false);
        let mut replies = Vec::new();
        drive(&mut poll, &mut conn, &mut replies, |c, _| c.drops >= 3);
        assert!(!conn.is_up());
        assert!(conn.backoff > BACKOFF_MIN, "the delay grows: {:?}", conn.backoff);
        assert!(conn.deadline() > Instant::now(), "the next attempt waits");
    }
}
