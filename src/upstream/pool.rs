//! The worker's upstream connections as one value ([`Upstreams`]): the slab of
//! [`UpConn`]s, the idle pool of each endpoint (at most [`MAX_IDLE`], closed after
//! [`IDLE_TIMEOUT`]), the in-flight table that lets an identical coalescible request join
//! one already running, each connection's deadline, and what one readiness or timer event
//! on a connection means for whoever waits on it ([`Pass`]): a pooled connection found dead
//! before it answered is replaced once by a fresh one, a refused address gives way to the
//! next one the name resolved to. When an exchange ends, what only it waited on is closed
//! ([`Upstreams::cancel`]), so the upstream sees the connection go.
//!
//! It knows nothing of the event loop or of exchanges: sockets are registered and deadlines
//! queued through a [`Registrar`] the worker implements, and what an [`Owner`] must be told
//! comes back as a value for the worker to deliver. It must not decide what an answer means.

use std::collections::HashMap;
use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::net::TcpStream;

use super::call::CallState;
use super::conn::{connect_from, tls_session, up_io, Owner, Step, UpConn};
use super::wire::{write_request, ClientError, Endpoint, Outbound, ResponseReader, ENDPOINTS};
use crate::http::exchange::ExchangeId;

/// An idle pooled connection is closed after this long. Below the 5 s that
/// Node.js servers keep idle connections, so a reused connection is rarely
/// one the upstream is closing at that moment.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(4);
/// Idle connections kept per endpoint.
pub const MAX_IDLE: usize = 32;

/// What [`Upstreams`] needs from the event loop. The caller's duties: a registered socket
/// reports readiness as [`Upstreams::pass`] on its connection, and an armed deadline comes
/// back as [`Upstreams::timer`] with the same `at` and `generation`, not before `at`.
pub trait Registrar {
    /// Watch `sock`, upstream connection `ui`, for reading and writing.
    fn register(&mut self, sock: &mut TcpStream, ui: usize) -> io::Result<()>;
    /// Stop watching `sock`.
    fn deregister(&mut self, sock: &mut TcpStream);
    /// Queue connection `ui`'s deadline `at`.
    fn arm(&mut self, ui: usize, at: Instant, generation: u32);
}

/// What one I/O pass on a connection ([`Upstreams::pass`]) means for those waiting on it.
pub enum Pass {
    /// Nothing for anyone (an idle connection checked, the next address being tried).
    Quiet,
    /// `step` for `owner`, about connection `ui` (`None`: it is closed).
    Step(Owner, Option<usize>, Step),
    /// A pooled connection died before answering and a fresh one sends its request again,
    /// for the same owner and followers ([`Upstreams::waiting`]): their bookkeeping moves
    /// from `old` to `new`, then `new` is driven.
    Moved {
        /// The dead connection (closed).
        old: usize,
        /// The fresh one.
        new: usize,
    },
    /// A pooled connection died before answering and no fresh one could be opened: the
    /// followers fail with `error`, then the owner gets [`Step::Failed`] without a connection.
    Lost {
        /// The dead connection (closed).
        old: usize,
        /// Whose request it carried.
        owner: Owner,
        /// The requests that had joined it.
        followers: Vec<Owner>,
        /// Why no fresh connection could be opened.
        error: ClientError,
    },
}

/// The worker's upstream connections and pools.
#[derive(Default)]
pub struct Upstreams {
    conns: Vec<Option<UpConn>>,
    free: Vec<usize>,
    idle: [Vec<usize>; ENDPOINTS],
    next_generation: u32,
    /// Coalescible requests in flight: (endpoint id, path) → connection.
    inflight: HashMap<(usize, String), usize>,
}

impl Upstreams {
    /// Connection `ui`, while open.
    pub fn get_mut(&mut self, ui: usize) -> Option<&mut UpConn> {
        self.conns.get_mut(ui)?.as_mut()
    }

    /// Who waits on connection `ui`: its owner, then the requests that joined it.
    pub fn waiting(&self, ui: usize) -> impl Iterator<Item = Owner> + '_ {
        let u = self.conns.get(ui).and_then(Option::as_ref);
        u.and_then(|u| u.owner).into_iter().chain(u.into_iter().flat_map(|u| u.followers.iter().copied()))
    }

    /// Join an identical coalescible request already in flight; the connection it runs on.
    pub fn join(&mut self, owner: Owner, req: &Outbound) -> Option<usize> {
        if !req.coalesce || !req.idempotent() {
            return None;
        }
        let ui = *self.inflight.get(&(req.endpoint.id, req.path.clone()))?;
        let u = self.conns.get_mut(ui)?.as_mut()?;
        // Only a request still waiting for its answer can be joined.
        u.owner?;
        u.followers.push(owner);
        Some(ui)
    }

    /// Let identical requests join `req`, running on connection `ui`, if it is coalescible.
    pub fn share(&mut self, ui: usize, req: &Outbound) {
        if !req.coalesce || !req.idempotent() {
            return;
        }
        let key = (req.endpoint.id, req.path.clone());
        if let Some(Some(u)) = self.conns.get_mut(ui) {
            u.inflight = Some(key.clone());
        }
        self.inflight.insert(key, ui);
    }

    /// Send `req` for `owner` on a pooled connection or a new one; returns its index.
    pub fn start(&mut self, owner: Owner, req: &Outbound, reg: &mut impl Registrar) -> Result<usize, ClientError> {
        let now = Instant::now();
        let id = req.endpoint.id.min(ENDPOINTS - 1);
        let reuse = if req.idempotent() { self.take_idle(id) } else { None };
        let ui = match reuse {
            Some(ui) => ui,
            None => self.open(&req.endpoint, reg)?,
        };
        let Some(Some(u)) = self.conns.get_mut(ui) else { return Err(ClientError::Closed) };
        u.reused = reuse.is_some();
        u.owner = Some(owner);
        u.out.clear();
        u.out_pos = 0;
        write_request(req, &mut u.out);
        u.reader = ResponseReader::new(req.max_body, req.method == "HEAD");
        u.body.clear();
        u.inbuf.clear();
        u.timeout = req.timeout;
        u.total = req.total_deadline;
        u.idempotent = req.idempotent();
        u.max_body = req.max_body;
        u.received = false;
        u.paused = false;
        u.deadline = Some(now + req.timeout);
        Ok(ui)
    }

    /// A live idle connection to endpoint `id`, if the pool has one.
    fn take_idle(&mut self, id: usize) -> Option<usize> {
        while let Some(ui) = self.idle[id].pop() {
            if let Some(Some(u)) = self.conns.get(ui) {
                if u.owner.is_none() && !u.eof {
                    return Some(ui);
                }
            }
        }
        None
    }

    /// Open a non-blocking connection to `endpoint`, starting at its first address.
    fn open(&mut self, endpoint: &Arc<Endpoint>, reg: &mut impl Registrar) -> Result<usize, ClientError> {
        let (mut sock, addr) = connect_from(endpoint, 0)?;
        let tls = tls_session(endpoint)?;
        let ui = self.free.pop().unwrap_or_else(|| {
            self.conns.push(None);
            self.conns.len() - 1
        });
        if let Err(e) = reg.register(&mut sock, ui) {
            self.free.push(ui);
            return Err(ClientError::Connect(e.to_string()));
        }
        self.next_generation = self.next_generation.wrapping_add(1);
        self.conns[ui] = Some(UpConn {
            sock,
            tls,
            endpoint: Arc::clone(endpoint),
            addr,
            connected: false,
            out: Vec::new(),
            out_pos: 0,
            inbuf: Vec::new(),
            reader: ResponseReader::new(0, false),
            body: Vec::new(),
            owner: None,
            followers: Vec::new(),
            inflight: None,
            generation: self.next_generation,
            timer_at: None,
            deadline: None,
            timeout: Duration::ZERO,
            total: true,
            idempotent: false,
            max_body: 0,
            reused: false,
            received: false,
            eof: false,
            paused: false,
            more: false,
        });
        Ok(ui)
    }

    /// Close connection `ui` (the peer sees FIN).
    pub fn close(&mut self, ui: usize, reg: &mut impl Registrar) {
        if let Some(mut u) = self.conns.get_mut(ui).and_then(Option::take) {
            if let Some(key) = u.inflight.take() {
                self.inflight.remove(&key);
            }
            reg.deregister(&mut u.sock);
            self.free.push(ui);
        }
    }

    /// Exchange `id` no longer waits on connection `ui`: a request others joined goes on
    /// for them, one nobody else waits for is closed.
    pub fn leave(&mut self, ui: usize, id: ExchangeId, reg: &mut impl Registrar) {
        let Some(Some(u)) = self.conns.get_mut(ui) else { return };
        u.followers.retain(|f| f.id != id);
        if u.owner.is_some_and(|o| o.id == id) {
            match u.followers.pop() {
                Some(next) => u.owner = Some(next),
                None => self.close(ui, reg),
            }
        }
    }

    /// Exchange `id` ended while it waited on upstreams (`call`, taken from it): every
    /// connection a gather's request ran on is left (one that other exchanges joined goes on
    /// for them), a relay's connection is closed, so the upstream sees the connection go.
    pub fn cancel(&mut self, id: ExchangeId, call: CallState, reg: &mut impl Registrar) {
        match call {
            CallState::Gather { ups, .. } => ups.into_iter().flatten().for_each(|ui| self.leave(ui, id, reg)),
            CallState::Relay { up, .. } => up.into_iter().for_each(|ui| self.close(ui, reg)),
        }
    }

    /// The owner of connection `ui` is gone: the next request that joined it takes its
    /// place (returned), or, with none, the connection is closed.
    pub fn hand_over(&mut self, ui: usize, reg: &mut impl Registrar) -> Option<Owner> {
        let next = self.get_mut(ui).and_then(|u| {
            let next = u.followers.pop();
            if next.is_some() {
                u.owner = next;
            }
            next
        });
        if next.is_none() {
            self.close(ui, reg);
        }
        next
    }

    /// Connection `ui` answered completely: its followers, the answer's status and body.
    /// The connection goes back to the idle pool when it can carry another request.
    pub fn answered(&mut self, ui: usize, reg: &mut impl Registrar) -> Option<(Vec<Owner>, u16, Vec<u8>)> {
        let u = self.conns.get_mut(ui)?.as_mut()?;
        let status = u.reader.head().map_or(0, |h| h.status);
        let body = std::mem::take(&mut u.body);
        let followers = std::mem::take(&mut u.followers);
        if let Some(key) = u.inflight.take() {
            self.inflight.remove(&key);
        }
        self.release(ui, reg);
        Some((followers, status, body))
    }

    /// Connection `ui` failed with `e`: closed; the requests that had joined it.
    pub fn failed(&mut self, ui: usize, e: &ClientError, reg: &mut impl Registrar) -> Vec<Owner> {
        let mut followers = Vec::new();
        if let Some(u) = self.get_mut(ui) {
            log::warn!("upstream {}: {e}", u.endpoint.url);
            followers = std::mem::take(&mut u.followers);
        }
        self.close(ui, reg);
        followers
    }

    /// A finished exchange: back to the idle pool when the connection can carry another,
    /// else closed.
    pub fn release(&mut self, ui: usize, reg: &mut impl Registrar) {
        let Some(Some(u)) = self.conns.get_mut(ui) else { return };
        // Only connections that carried idempotent requests are pooled: only
        // those requests may take one (a dead pooled connection is retried).
        let reusable = u.idempotent
            && u.reader.is_done()
            && u.reader.head().is_some_and(|h| h.keep_alive)
            && u.inbuf.is_empty()
            && !u.eof
            // The last read stopped at its cap: unread bytes (or the upstream's
            // FIN) may follow, which no new edge would report while it idles.
            && !u.more
            && self.idle[u.endpoint.id.min(ENDPOINTS - 1)].len() < MAX_IDLE;
        if !reusable {
            self.close(ui, reg);
            return;
        }
        u.owner = None;
        u.paused = false;
        u.out.clear();
        u.out_pos = 0;
        u.body = Vec::new();
        u.deadline = Some(Instant::now() + IDLE_TIMEOUT);
        let id = u.endpoint.id.min(ENDPOINTS - 1);
        self.idle[id].push(ui);
        self.arm(ui, reg);
    }

    /// Queue connection `ui`'s deadline, if it has one earlier than the one queued.
    pub fn arm(&mut self, ui: usize, reg: &mut impl Registrar) {
        let Some(Some(u)) = self.conns.get_mut(ui) else { return };
        if let Some(at) = u.deadline {
            if u.timer_at.is_none_or(|t| at < t) {
                u.timer_at = Some(at);
                reg.arm(ui, at, u.generation);
            }
        }
    }

    /// Connection `ui`'s deadline `at` came: an idle connection past it is closed; the owner
    /// of a busy one is returned, to be told [`ClientError::Timeout`]. A deadline moved
    /// later is queued again.
    pub fn timer(
        &mut self,
        ui: usize,
        at: Instant,
        generation: u32,
        now: Instant,
        reg: &mut impl Registrar,
    ) -> Option<Owner> {
        let u = self.get_mut(ui)?;
        if u.generation != generation || u.timer_at != Some(at) {
            return None;
        }
        u.timer_at = None;
        match u.deadline {
            Some(d) if d <= now => match u.owner {
                None => self.close(ui, reg),
                Some(owner) => {
                    u.deadline = None;
                    return Some(owner);
                }
            },
            _ => self.arm(ui, reg),
        }
        None
    }

    /// Whether connection `ui` should have another pass at once: its last read stopped at
    /// its cap, its owner waits and is not behind.
    pub fn more(&self, ui: usize) -> bool {
        matches!(self.conns.get(ui), Some(Some(u)) if u.more && !u.paused && u.owner.is_some())
    }

    /// Whether connection `ui` stopped reading because its relay's client is behind.
    pub fn paused(&self, ui: usize) -> bool {
        matches!(self.conns.get(ui), Some(Some(u)) if u.paused)
    }

    /// A relay's client is behind (`slow`: connection `ui` stops reading and its deadline
    /// with it) or keeps up; its deadline is queued.
    pub fn pause(&mut self, ui: usize, slow: bool, reg: &mut impl Registrar) {
        if let Some(u) = self.get_mut(ui) {
            u.paused = slow;
            if slow {
                u.deadline = None;
            }
        }
        self.arm(ui, reg);
    }

    /// A relay's client caught up: connection `ui` reads again (a deadline between reads
    /// restarts); whether it is still open.
    pub fn unpause(&mut self, ui: usize) -> bool {
        let Some(u) = self.get_mut(ui) else { return false };
        u.paused = false;
        if !u.total {
            u.deadline = Some(Instant::now() + u.timeout);
        }
        true
    }

    /// One I/O pass on connection `ui` (readiness, or a request just started) and what it
    /// means for those waiting on it.
    pub fn pass(&mut self, ui: usize, scratch: &mut [u8], reg: &mut impl Registrar) -> Pass {
        let Some(Some(u)) = self.conns.get_mut(ui) else { return Pass::Quiet };
        let Some(owner) = u.owner else {
            // Idle in the pool: anything (data, EOF, error) means it is unusable.
            let mut probe = [0u8; 1];
            match io::Read::read(&mut u.sock, &mut probe) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                _ => self.close(ui, reg),
            }
            return Pass::Quiet;
        };
        match up_io(u, scratch) {
            // A pooled connection that died before answering: try once more, fresh.
            Step::Failed(ClientError::Closed | ClientError::Connect(_)) if u.reused && !u.received && u.idempotent => {
                self.retry(ui, owner, reg)
            }
            // The address refused: try the next one the name resolved to.
            Step::Failed(ClientError::Connect(e)) if !u.connected && u.addr + 1 < u.endpoint.addrs.len() => {
                let (endpoint, next) = (Arc::clone(&u.endpoint), u.addr + 1);
                log::debug!("upstream {}: {e}; trying the next address", endpoint.url);
                match connect_from(&endpoint, next).and_then(|c| tls_session(&endpoint).map(|t| (c, t))) {
                    Ok(((mut sock, addr), tls)) => {
                        reg.deregister(&mut u.sock);
                        if let Err(e) = reg.register(&mut sock, ui) {
                            Pass::Step(owner, Some(ui), Step::Failed(ClientError::Connect(e.to_string())))
                        } else {
                            u.sock = sock;
                            u.tls = tls;
                            u.addr = addr;
                            u.out_pos = 0;
                            Pass::Quiet
                        }
                    }
                    Err(e) => Pass::Step(owner, Some(ui), Step::Failed(e)),
                }
            }
            step => Pass::Step(owner, Some(ui), step),
        }
    }

    /// The pooled connection `ui`, `owner`'s, died before answering: its request goes out
    /// again on a fresh connection.
    fn retry(&mut self, ui: usize, owner: Owner, reg: &mut impl Registrar) -> Pass {
        let Some(u) = self.get_mut(ui) else { return Pass::Quiet };
        let endpoint = Arc::clone(&u.endpoint);
        let (out, reader_max, timeout, total) = (std::mem::take(&mut u.out), u.max_body, u.timeout, u.total);
        let deadline = u.deadline;
        let followers = std::mem::take(&mut u.followers);
        let inflight = u.inflight.take();
        self.close(ui, reg);
        match self.open(&endpoint, reg) {
            Ok(nu) => {
                if let Some(Some(n)) = self.conns.get_mut(nu) {
                    n.owner = Some(owner);
                    n.followers = followers;
                    n.inflight = inflight.clone();
                    n.out = out;
                    n.reader = ResponseReader::new(reader_max, false);
                    n.timeout = timeout;
                    n.total = total;
                    n.idempotent = true;
                    n.max_body = reader_max;
                    n.deadline = deadline;
                }
                if let Some(key) = inflight {
                    self.inflight.insert(key, nu);
                }
                Pass::Moved { old: ui, new: nu }
            }
            Err(error) => {
                if let Some(key) = inflight {
                    self.inflight.remove(&key);
                }
                Pass::Lost { old: ui, owner, followers, error }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;

    use mio::{Events, Interest, Poll, Token};

    use super::*;

    /// A [`Registrar`] over a real poll, recording what it was asked.
    struct Loop {
        poll: Poll,
        registered: Vec<usize>,
        deregistered: usize,
        armed: Vec<(usize, Instant, u32)>,
    }

    impl Loop {
        fn new() -> Loop {
            Loop { poll: Poll::new().expect("poll"), registered: Vec::new(), deregistered: 0, armed: Vec::new() }
        }

        /// Wait until connection `ui`'s socket reports its peer's end.
        fn wait_closed(&mut self, ui: usize) {
            let mut events = Events::with_capacity(8);
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                self.poll.poll(&mut events, Some(Duration::from_millis(100))).expect("poll");
                if events.iter().any(|e| e.token() == Token(ui) && e.is_read_closed()) {
                    return;
                }
            }
            panic!("connection {ui} never saw its peer's end");
        }
    }

    impl Registrar for Loop {
        fn register(&mut self, sock: &mut TcpStream, ui: usize) -> io::Result<()> {
            self.registered.push(ui);
            self.poll.registry().register(sock, Token(ui), Interest::READABLE | Interest::WRITABLE)
        }

        fn deregister(&mut self, sock: &mut TcpStream) {
            self.deregistered += 1;
            let _ = self.poll.registry().deregister(sock);
        }

        fn arm(&mut self, ui: usize, at: Instant, generation: u32) {
            self.armed.push((ui, at, generation));
        }
    }

    /// An upstream listening on loopback (connections wait in its backlog) and its endpoint.
    fn upstream() -> (TcpListener, Arc<Endpoint>) {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("address");
        (listener, endpoint(vec![addr]))
    }

    /// An upstream on loopback, its endpoint, an empty pool and the loop it registers with.
    struct Fixture {
        /// Kept for the test's length: the upstream's connections wait in its backlog.
        _listener: TcpListener,
        ep: Arc<Endpoint>,
        ups: Upstreams,
        reg: Loop,
    }

    fn fixture() -> Fixture {
        let (_listener, ep) = upstream();
        Fixture { _listener, ep, ups: Upstreams::default(), reg: Loop::new() }
    }

    /// An endpoint whose name resolved to `addrs`.
    fn endpoint(addrs: Vec<std::net::SocketAddr>) -> Arc<Endpoint> {
        let host = addrs[0].to_string();
        Arc::new(Endpoint { id: 0, url: format!("http://{host}"), host, path: String::new(), addrs, tls: None })
    }

    fn get(endpoint: &Arc<Endpoint>, path: &str, coalesce: bool) -> Outbound {
        Outbound {
            endpoint: Arc::clone(endpoint),
            method: "GET",
            path: path.to_string(),
            headers: Vec::new(),
            body: Vec::new(),
            max_body: 1024,
            timeout: Duration::from_secs(10),
            total_deadline: true,
            coalesce,
        }
    }

    fn owner(conn: usize) -> Owner {
        Owner { id: ExchangeId::H1 { conn, gen: 0 }, slot: 0 }
    }

    fn ids(ups: &Upstreams, ui: usize) -> Vec<ExchangeId> {
        ups.waiting(ui).map(|o| o.id).collect()
    }

    /// Connection `ui` read this complete keep-alive response.
    fn answer(ups: &mut Upstreams, ui: usize, body: &[u8]) {
        let u = ups.get_mut(ui).expect("open");
        let mut response = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", body.len()).into_bytes();
        response.extend_from_slice(body);
        let n = u.reader.feed(&response, &mut u.body).expect("a valid response");
        assert_eq!(n, response.len());
        assert!(u.reader.is_done());
    }

    #[test]
    fn an_identical_coalescible_get_joins_the_one_in_flight() {
        let Fixture { _listener, ep, mut ups, mut reg } = fixture();
        let req = get(&ep, "/a", true);
        let ui = ups.start(owner(1), &req, &mut reg).expect("started");
        ups.share(ui, &req);
        assert_eq!(ups.join(owner(2), &req), Some(ui));
        assert_eq!(ups.join(owner(3), &get(&ep, "/b", true)), None, "another path");
        assert_eq!(ups.join(owner(3), &get(&ep, "/a", false)), None, "not coalescible");
        let mut post = get(&ep, "/a", true);
        post.method = "POST";
        assert_eq!(ups.join(owner(3), &post), None, "not idempotent");
        assert_eq!(ids(&ups, ui), [owner(1).id, owner(2).id]);
        assert_eq!(reg.registered, [ui], "one connection for both");
    }

    #[test]
    fn an_answer_goes_to_every_joined_request_and_ends_the_joining() {
        let Fixture { _listener, ep, mut ups, mut reg } = fixture();
        let req = get(&ep, "/a", true);
        let ui = ups.start(owner(1), &req, &mut reg).expect("started");
        ups.share(ui, &req);
        assert_eq!(ups.join(owner(2), &req), Some(ui));
        answer(&mut ups, ui, b"ok");
        let (followers, status, body) = ups.answered(ui, &mut reg).expect("open");
        assert_eq!(followers.iter().map(|o| o.id).collect::<Vec<_>>(), [owner(2).id]);
        assert_eq!((status, &body[..]), (200, &b"ok"[..]));
        assert_eq!(ups.join(owner(3), &req), None, "answered: a new request goes out again");
        assert_eq!(ups.idle[0], [ui], "the connection went back to the pool");
    }

    #[test]
    fn a_pooled_connection_carries_the_next_idempotent_request_only() {
        let Fixture { _listener, ep, mut ups, mut reg } = fixture();
        let ui = ups.start(owner(1), &get(&ep, "/a", false), &mut reg).expect("started");
        answer(&mut ups, ui, b"");
        ups.release(ui, &mut reg);
        let mut post = get(&ep, "/a", false);
        post.method = "POST";
        let fresh = ups.start(owner(2), &post, &mut reg).expect("started");
        assert_ne!(fresh, ui, "a POST never takes a pooled connection");
        let again = ups.start(owner(3), &get(&ep, "/b", false), &mut reg).expect("started");
        assert_eq!(again, ui);
        assert!(ups.get_mut(ui).is_some_and(|u| u.reused));
        assert_eq!(reg.registered, [ui, fresh]);
    }

    #[test]
    fn the_idle_pool_keeps_at_most_max_idle_connections_per_endpoint() {
        let Fixture { _listener, ep, mut ups, mut reg } = fixture();
        let busy: Vec<usize> =
            (0..=MAX_IDLE).map(|i| ups.start(owner(i), &get(&ep, "/", false), &mut reg).expect("started")).collect();
        for &ui in &busy {
            answer(&mut ups, ui, b"");
            ups.release(ui, &mut reg);
        }
        assert_eq!(ups.idle[0].len(), MAX_IDLE);
        assert_eq!(reg.deregistered, 1, "the one past the limit is closed");
        assert!(ups.get_mut(busy[MAX_IDLE]).is_none());
    }

    #[test]
    fn a_connection_is_not_pooled_when_its_answer_was_not_keep_alive() {
        let Fixture { _listener, ep, mut ups, mut reg } = fixture();
        let ui = ups.start(owner(1), &get(&ep, "/", false), &mut reg).expect("started");
        let u = ups.get_mut(ui).expect("open");
        let response = b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n";
        u.reader.feed(response, &mut u.body).expect("a valid response");
        ups.release(ui, &mut reg);
        assert!(ups.get_mut(ui).is_none());
        assert!(ups.idle[0].is_empty());
    }

    #[test]
    fn an_idle_connection_closes_at_its_deadline_and_not_before() {
        let Fixture { _listener, ep, mut ups, mut reg } = fixture();
        let ui = ups.start(owner(1), &get(&ep, "/", false), &mut reg).expect("started");
        answer(&mut ups, ui, b"");
        let released = Instant::now();
        ups.release(ui, &mut reg);
        let &[(armed, at, generation)] = &reg.armed[..] else { panic!("one deadline: {:?}", reg.armed) };
        assert_eq!(armed, ui);
        assert!(at >= released + IDLE_TIMEOUT);
        assert_eq!(ups.timer(ui, at, generation.wrapping_add(1), at, &mut reg), None);
        assert!(ups.get_mut(ui).is_some(), "another generation's deadline is stale");
        assert_eq!(ups.timer(ui, at, generation, at - Duration::from_millis(1), &mut reg), None);
        assert!(ups.get_mut(ui).is_some(), "early: still pooled");
        assert_eq!(reg.armed.len(), 2, "and its deadline queued again");
        assert_eq!(ups.timer(ui, at, generation, at, &mut reg), None);
        assert!(ups.get_mut(ui).is_none(), "closed at its deadline");
        assert_eq!(reg.deregistered, 1);
    }

    #[test]
    fn a_busy_connection_past_its_deadline_names_its_owner_once() {
        let Fixture { _listener, ep, mut ups, mut reg } = fixture();
        let ui = ups.start(owner(1), &get(&ep, "/", false), &mut reg).expect("started");
        ups.arm(ui, &mut reg);
        let &[(_, at, generation)] = &reg.armed[..] else { panic!("one deadline: {:?}", reg.armed) };
        let timed_out = ups.timer(ui, at, generation, at, &mut reg);
        assert_eq!(timed_out.map(|o| o.id), Some(owner(1).id));
        assert_eq!(ups.timer(ui, at, generation, at, &mut reg).map(|o| o.id), None);
    }

    #[test]
    fn a_request_others_joined_outlives_its_owner_leaving() {
        let Fixture { _listener, ep, mut ups, mut reg } = fixture();
        let req = get(&ep, "/a", true);
        let ui = ups.start(owner(1), &req, &mut reg).expect("started");
        ups.share(ui, &req);
        ups.join(owner(2), &req);
        ups.join(owner(3), &req);
        ups.leave(ui, owner(1).id, &mut reg);
        assert_eq!(ids(&ups, ui), [owner(3).id, owner(2).id], "the last to join takes over");
        ups.leave(ui, owner(2).id, &mut reg);
        assert_eq!(ids(&ups, ui), [owner(3).id]);
        assert_eq!(reg.deregistered, 0);
        ups.leave(ui, owner(3).id, &mut reg);
        assert!(ups.get_mut(ui).is_none(), "nobody waits: closed");
        assert_eq!(reg.deregistered, 1);
        assert_eq!(ups.join(owner(4), &req), None, "and no longer joinable");
    }

    #[test]
    fn an_exchange_that_ends_closes_what_only_it_waited_on() {
        let Fixture { _listener, ep, mut ups, mut reg } = fixture();
        let (shared, own) = (get(&ep, "/shared", true), get(&ep, "/own", false));
        let joined = ups.start(owner(1), &shared, &mut reg).expect("started");
        ups.share(joined, &shared);
        ups.join(owner(2), &shared);
        let alone = ups.start(Owner { id: owner(1).id, slot: 1 }, &own, &mut reg).expect("started");
        let call = CallState::Gather {
            ups: vec![Some(joined), Some(alone)],
            results: vec![None, None],
            waiting: 2,
            finish: Box::new(|_| Err(crate::error::Error::UpstreamTimeout)),
        };
        ups.cancel(owner(1).id, call, &mut reg);
        assert!(ups.get_mut(alone).is_none(), "closed: nobody else waited on it");
        assert_eq!(ids(&ups, joined), [owner(2).id], "goes on for the exchange that joined it");
        assert_eq!(reg.deregistered, 1);
    }

    #[test]
    fn an_owner_gone_hands_its_connection_to_a_follower_or_closes_it() {
        let Fixture { _listener, ep, mut ups, mut reg } = fixture();
        let req = get(&ep, "/a", true);
        let ui = ups.start(owner(1), &req, &mut reg).expect("started");
        ups.share(ui, &req);
        ups.join(owner(2), &req);
        assert_eq!(ups.hand_over(ui, &mut reg).map(|o| o.id), Some(owner(2).id));
        assert_eq!(ids(&ups, ui), [owner(2).id]);
        assert_eq!(ups.hand_over(ui, &mut reg).map(|o| o.id), None);
        assert!(ups.get_mut(ui).is_none());
    }

    #[test]
    fn a_failed_connection_closes_and_returns_who_had_joined() {
        let Fixture { _listener, ep, mut ups, mut reg } = fixture();
        let req = get(&ep, "/a", true);
        let ui = ups.start(owner(1), &req, &mut reg).expect("started");
        ups.share(ui, &req);
        ups.join(owner(2), &req);
        let followers = ups.failed(ui, &ClientError::Timeout, &mut reg);
        assert_eq!(followers.iter().map(|o| o.id).collect::<Vec<_>>(), [owner(2).id]);
        assert!(ups.get_mut(ui).is_none());
        assert_eq!(ups.join(owner(3), &req), None);
    }

    #[test]
    fn a_refused_address_gives_way_to_the_next_one_the_name_resolved_to() {
        let refused = TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a port");
        let (_listener, ep) = upstream();
        let ep = endpoint(vec![refused, ep.addrs[0]]);
        let (mut ups, mut reg) = (Upstreams::default(), Loop::new());
        let ui = ups.start(owner(1), &get(&ep, "/", false), &mut reg).expect("started");
        let mut scratch = vec![0; 4096];
        let mut events = Events::with_capacity(8);
        let deadline = Instant::now() + Duration::from_secs(5);
        // A refusal is reported at once or by the connection's first pass.
        while !ups.get_mut(ui).is_some_and(|u| u.connected) {
            assert!(Instant::now() < deadline, "never connected");
            reg.poll.poll(&mut events, Some(Duration::from_millis(100))).expect("poll");
            match ups.pass(ui, &mut scratch, &mut reg) {
                Pass::Quiet | Pass::Step(_, _, Step::Pending) => {}
                Pass::Step(_, _, Step::Failed(e)) => panic!("failed: {e}"),
                _ => panic!("not a fallback"),
            }
        }
        assert_eq!(ups.get_mut(ui).map(|u| u.addr), Some(1));
    }

    #[test]
    fn a_pooled_connection_found_dead_sends_its_request_again_on_a_fresh_one() {
        let (listener, ep) = upstream();
        let (mut ups, mut reg) = (Upstreams::default(), Loop::new());
        let ui = ups.start(owner(1), &get(&ep, "/", false), &mut reg).expect("started");
        let (peer, _) = listener.accept().expect("accept");
        answer(&mut ups, ui, b"");
        ups.release(ui, &mut reg);
        drop(peer);
        reg.wait_closed(ui);
        let req = get(&ep, "/a", true);
        assert_eq!(ups.start(owner(2), &req, &mut reg).ok(), Some(ui), "taken from the pool");
        ups.share(ui, &req);
        ups.join(owner(3), &req);
        let mut scratch = vec![0; 4096];
        let Pass::Moved { old, new } = ups.pass(ui, &mut scratch, &mut reg) else { panic!("not retried") };
        assert_eq!(old, ui);
        assert_eq!(ids(&ups, new), [owner(2).id, owner(3).id], "the same owner and followers");
        assert_eq!(ups.join(owner(4), &req), Some(new), "joinable on the fresh connection");
        let u = ups.get_mut(new).expect("open");
        assert!(!u.reused);
        assert!(u.out.starts_with(b"GET /a HTTP/1.1\r\n"), "the same request bytes");
        assert_eq!(reg.registered.len(), 2);
    }
}
