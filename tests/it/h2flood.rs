//! HTTP/2 floods over a real loopback socket: raw frames written by hand after
//! the client preface and an empty SETTINGS. For each attack the worker's
//! memory stays bounded (peak RSS), the attacking connection ends (GOAWAY or
//! close) or, where the protocol lets the peer go on, is still answered
//! sanely, and `/health` on other connections answers in time throughout.
//! Control-frame floods (PING, SETTINGS, WINDOW_UPDATE, PRIORITY, unknown
//! types, SETTINGS that revisit 128 streams) end with
//! `GOAWAY(ENHANCE_YOUR_CALM)` soon and for little of the worker's CPU, while
//! ordinary clients (h2load, nghttp, curl, tiny windows) are never taken for one.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crate::util::*;

use crate::h2util::wire::*;

/// The most the worker's peak RSS may grow during one attack.
const RSS_BOUND_KIB: i64 = 16 * 1024;
/// The slowest `/health` on another connection, during or after an attack.
const HEALTH_BOUND: Duration = Duration::from_secs(1);
/// Time for one flood's writing.
const FLOOD_TIME: Duration = Duration::from_secs(12);
/// A write making no progress this long: the server stopped reading.
const STALL: Duration = Duration::from_millis(500);

/// One frame: 3-byte length, type, flags, 4-byte stream id (top bit clear).
fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut f = Vec::with_capacity(9 + payload.len());
    f.extend_from_slice(&len.to_be_bytes()[1..]);
    f.push(kind);
    f.push(flags);
    f.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// `n` copies of one frame.
fn repeat(f: &[u8], n: usize) -> Vec<u8> {
    f.repeat(n)
}

/// An HPACK integer with an `n`-bit prefix, `flags` in the first byte's high bits.
fn hpack_int(flags: u8, n: u32, mut v: usize, out: &mut Vec<u8>) {
    let max = (1usize << n) - 1;
    if v < max {
        out.push(flags | v as u8);
        return;
    }
    out.push(flags | max as u8);
    v -= max;
    while v >= 128 {
        out.push(0x80 | (v % 128) as u8);
        v /= 128;
    }
    out.push(v as u8);
}

/// An HPACK string literal, not Huffman-coded.
fn hpack_str(s: &[u8], out: &mut Vec<u8>) {
    hpack_int(0, 7, s.len(), out);
    out.extend_from_slice(s);
}

/// A request header block for `/health` (`:method` from the static table:
/// 0x82 GET, 0x83 POST), then `extra` representations.
fn request_block(method: u8, extra: &[u8]) -> Vec<u8> {
    request_block_for(method, b"/health", extra)
}

/// A request header block for `path`, then `extra` representations.
fn request_block_for(method: u8, path: &[u8], extra: &[u8]) -> Vec<u8> {
    let mut b = vec![method, 0x86]; // :scheme http
    b.push(0x04); // :path, literal without indexing (static name 4)
    hpack_str(path, &mut b);
    b.push(0x01); // :authority, literal without indexing (static name 1)
    hpack_str(b"localhost", &mut b);
    b.extend_from_slice(extra);
    b
}

/// What the server sent on the attacking connection.
#[derive(Default, Debug)]
struct Seen {
    frames: usize,
    settings_acks: usize,
    ping_acks: usize,
    /// The first GOAWAY's error code.
    goaway: Option<u32>,
    /// (stream, error code) of each RST_STREAM.
    resets: Vec<(u32, u32)>,
    /// (stream, first byte of the header block) of each HEADERS: 0x88 is `:status 200`.
    heads: Vec<(u32, u8)>,
}

impl Seen {
    fn reset(&self, stream: u32) -> Option<u32> {
        self.resets.iter().find(|(s, _)| *s == stream).map(|(_, c)| *c)
    }
    fn head(&self, stream: u32) -> Option<u8> {
        self.heads.iter().find(|(s, _)| *s == stream).map(|(_, b)| *b)
    }
}

/// How one flood's writing went.
#[derive(Debug)]
struct Flood {
    /// Bytes written.
    written: usize,
    /// The server stopped reading for a while (it was waiting for us to read).
    stalled: bool,
    /// A write failed: the server closed the connection.
    closed: bool,
}

/// A raw HTTP/2 client connection that writes frames by hand.
struct Attacker {
    sock: TcpStream,
    buf: Vec<u8>,
    seen: Seen,
    eof: bool,
}

impl Attacker {
    /// Connects and sends the preface and an empty SETTINGS.
    fn open(addr: SocketAddr) -> Attacker {
        let sock = TcpStream::connect_timeout(&addr, IO_TIMEOUT).expect("connect");
        sock.set_nodelay(true).expect("nodelay");
        sock.set_write_timeout(Some(STALL)).expect("write timeout");
        let mut a = Attacker { sock, buf: Vec::new(), seen: Seen::default(), eof: false };
        let mut hello = PREFACE.to_vec();
        hello.extend(frame(SETTINGS, 0, 0, &[]));
        a.send(&hello);
        a
    }

    /// Writes a few bytes that must go out whole.
    fn send(&mut self, bytes: &[u8]) {
        let f = self.flood(bytes, IO_TIMEOUT);
        assert!(!f.closed && f.written == bytes.len(), "could not send {} bytes: {f:?}", bytes.len());
    }

    /// The connection ended: a GOAWAY arrived, or the socket closed.
    fn ended(&self) -> bool {
        self.eof || self.seen.goaway.is_some()
    }

    /// One read, waiting at most `wait`; parses whole frames.
    fn read_some(&mut self, wait: Duration) {
        if self.eof {
            return;
        }
        self.sock.set_read_timeout(Some(wait)).expect("read timeout");
        let mut tmp = vec![0u8; 64 * 1024];
        match self.sock.read(&mut tmp) {
            Ok(0) => self.eof = true,
            Ok(n) => {
                self.buf.extend_from_slice(&tmp[..n]);
                self.parse();
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
                ) => {}
            Err(_) => self.eof = true,
        }
    }

    fn parse(&mut self) {
        let mut at = 0;
        while self.buf.len() - at >= 9 {
            let b = &self.buf[at..];
            let len = u32::from_be_bytes([0, b[0], b[1], b[2]]) as usize;
            if b.len() < 9 + len {
                break;
            }
            let (kind, flags) = (b[3], b[4]);
            let stream = u32::from_be_bytes([b[5], b[6], b[7], b[8]]) & 0x7fff_ffff;
            let p = &b[9..9 + len];
            let code = |at: usize| p.get(at..at + 4).map_or(0, |c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]));
            self.seen.frames += 1;
            match kind {
                SETTINGS if flags & ACK != 0 => self.seen.settings_acks += 1,
                PING if flags & ACK != 0 => self.seen.ping_acks += 1,
                GOAWAY => {
                    self.seen.goaway.get_or_insert(code(4));
                }
                RST_STREAM => self.seen.resets.push((stream, code(0))),
                HEADERS => {
                    // Skip the pad length and priority fields when flagged.
                    let mut skip = if flags & 0x8 != 0 { 1 } else { 0 };
                    if flags & 0x20 != 0 {
                        skip += 5;
                    }
                    self.seen.heads.push((stream, p.get(skip).copied().unwrap_or(0)));
                }
                _ => {}
            }
            at += 9 + len;
        }
        self.buf.drain(..at);
    }

    /// Writes `bytes` within `time`, without reading, until the server stops
    /// reading; from then on it reads between writes (the server is waiting
    /// for that). Stops early when the server closes.
    fn flood(&mut self, bytes: &[u8], time: Duration) -> Flood {
        let deadline = Instant::now() + time;
        let mut f = Flood { written: 0, stalled: false, closed: false };
        while f.written < bytes.len() && Instant::now() < deadline && !self.eof {
            let end = bytes.len().min(f.written + 64 * 1024);
            match self.sock.write(&bytes[f.written..end]) {
                Ok(0) => f.closed = true,
                Ok(n) => f.written += n,
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => f.stalled = true,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => f.closed = true,
            }
            if f.closed {
                break;
            }
            if f.stalled {
                self.read_some(Duration::from_millis(1));
            }
        }
        f
    }

    /// Reads until `done`, the end of the connection, or `timeout`; whether `done` held.
    fn read_until(&mut self, timeout: Duration, done: impl Fn(&Seen) -> bool) -> bool {
        let deadline = Instant::now() + timeout;
        while !done(&self.seen) && !self.eof && Instant::now() < deadline {
            self.read_some(Duration::from_millis(20));
        }
        done(&self.seen)
    }

    /// Reads until the server closes the socket.
    fn wait_eof(&mut self, timeout: Duration) -> bool {
        self.read_until(timeout, |_| false);
        self.eof
    }

    /// `GET /health` on `stream` answers 200 on this connection.
    fn assert_still_answers(&mut self, stream: u32, what: &str) {
        self.send(&frame(HEADERS, END_HEADERS | END_STREAM, stream, &request_block(0x82, &[])));
        let ok = self.read_until(IO_TIMEOUT, |s| s.head(stream).is_some());
        assert!(ok, "{what}: no answer on stream {stream} of the flooded connection: {:?}", self.summary());
        assert_eq!(self.seen.head(stream), Some(0x88), "{what}: not a 200 on stream {stream}");
    }

    fn report(&self, what: &str, f: &Flood) {
        eprintln!("{what}: {f:?}; {}", self.summary());
    }

    fn summary(&self) -> String {
        let s = &self.seen;
        format!(
            "{} frames, {} SETTINGS ACKs, {} PING ACKs, GOAWAY {:?}, {} RST_STREAMs (first {:?}), {} HEADERS, eof {}",
            s.frames,
            s.settings_acks,
            s.ping_acks,
            s.goaway,
            s.resets.len(),
            s.resets.first(),
            s.heads.len(),
            self.eof
        )
    }
}

fn status_kib(pid: i32, field: &str) -> Option<i64> {
    let st = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    st.lines().find(|l| l.starts_with(field))?.split_whitespace().nth(1)?.parse().ok()
}

/// One `GET /health` on another connection, while the worker is under attack.
#[derive(Debug)]
struct Probe {
    took: Duration,
    /// CPU the worker used meanwhile: what the probe waited for when the worker was busy.
    worker_cpu_ms: u64,
    status: Result<u16, String>,
}

impl Probe {
    /// Answered 200 (within the client's 3 s timeout), and fast: under `HEALTH_BOUND`, or,
    /// when the machine itself was slow (other processes on its cores), before the worker
    /// had spent `HEALTH_BOUND` of CPU on anything else.
    fn check(&self, server: &Server, what: &str) {
        assert_eq!(self.status, Ok(200), "{what}: /health mid-attack\n{}", server.log_tail());
        let busy = Duration::from_millis(self.worker_cpu_ms);
        assert!(
            self.took < HEALTH_BOUND || busy < HEALTH_BOUND,
            "{what}: /health mid-attack took {:?}, {busy:?} of it the worker's CPU",
            self.took
        );
    }
}

/// One `GET /health` on a fresh HTTP/1.1 connection to `worker`'s server.
fn probe(addr: SocketAddr, worker: i32) -> Probe {
    let t = Instant::now();
    let cpu = cpu_ms(worker);
    let r = (|| {
        let s = TcpStream::connect_timeout(&addr, IO_TIMEOUT)?;
        let mut c = Conn::from_stream(s, None);
        c.set_timeout(Duration::from_secs(3));
        c.try_write(&request("GET", "/health", &[], b""))?;
        c.try_read_response(false)
    })();
    Probe {
        took: t.elapsed(),
        worker_cpu_ms: cpu_ms(worker).saturating_sub(cpu),
        status: r.map(|r| r.status).map_err(|e| e.to_string()),
    }
}

/// `/health` on another connection answers 200 in time now, while the
/// attacking connection is still open and unread.
fn assert_probe(server: &Server, watch: &Watch, what: &str) {
    probe(server.addr(), watch.worker).check(server, what);
}

/// `GET /health` on fresh connections every 25 ms, on a thread, until stopped.
struct Prober {
    stop: mpsc::Sender<()>,
    /// Probes done so far.
    done: Arc<AtomicUsize>,
    thread: JoinHandle<Vec<Probe>>,
}

impl Prober {
    fn start(addr: SocketAddr, worker: i32) -> Prober {
        let (stop, rx) = mpsc::channel::<()>();
        let done = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&done);
        let thread = thread::spawn(move || {
            let mut probes = Vec::new();
            loop {
                probes.push(probe(addr, worker));
                count.fetch_add(1, Ordering::Relaxed);
                // Paced by the stop signal: a probe every 25 ms until it comes.
                if !matches!(rx.recv_timeout(Duration::from_millis(25)), Err(mpsc::RecvTimeoutError::Timeout)) {
                    return probes;
                }
            }
        });
        Prober { stop, done, thread }
    }

    /// Waits until at least `n` probes are done (bounded by `IO_TIMEOUT` each).
    fn wait_for(&self, n: usize) {
        eventually(IO_TIMEOUT * n as u32, || self.done.load(Ordering::Relaxed) >= n);
    }

    /// Every probe's time and status.
    fn finish(self) -> Vec<Probe> {
        let _ = self.stop.send(());
        self.thread.join().expect("prober")
    }
}

/// The worker's memory and its other connections, watched over one attack.
struct Watch {
    worker: i32,
    before: i64,
    /// The worker's peak RSS was reset (`clear_refs`), so VmHWM is this attack's peak.
    peak_reset: bool,
    prober: Prober,
}

impl Watch {
    /// Warms the worker up, notes its RSS, and starts probing `/health` on other connections.
    fn start(server: &Server) -> Watch {
        let worker = server.wait_workers(1, IO_TIMEOUT)[0];
        assert_eq!(server.get("/health").status, 200);
        let peak_reset = std::fs::write(format!("/proc/{worker}/clear_refs"), "5").is_ok();
        let before = status_kib(worker, "VmRSS:").unwrap_or(0);
        Watch { worker, before, peak_reset, prober: Prober::start(server.addr(), worker) }
    }

    /// Asserts that every probe (and one more now) answered 200 in time and
    /// that the worker's peak RSS stayed within bound.
    fn finish(self, server: &Server, what: &str) {
        eprintln!(
            "{what}: worker RSS before {} KiB, now {} KiB, peak {:?} KiB",
            self.before,
            status_kib(self.worker, "VmRSS:").unwrap_or(0),
            status_kib(self.worker, "VmHWM:")
        );
        let mut probes = self.prober.finish();
        probes.push(probe(server.addr(), self.worker));
        let n = probes.len();
        for (i, p) in probes.iter().enumerate() {
            p.check(server, &format!("{what} (probe {i} of {n})"));
        }
        let now = status_kib(self.worker, "VmRSS:").unwrap_or(0);
        let peak = if self.peak_reset { status_kib(self.worker, "VmHWM:").unwrap_or(now).max(now) } else { now };
        assert!(
            peak - self.before < RSS_BOUND_KIB,
            "{what}: worker RSS {} KiB → peak {peak} KiB (now {now} KiB)",
            self.before
        );
    }
}

fn server() -> Server {
    Server::builder().start()
}

#[test]
fn window_updates_within_reason_go_on_and_an_overflow_is_a_flow_control_error() {
    let server = server();
    let watch = Watch::start(&server);
    let mut a = Attacker::open(server.addr());
    // An open stream: a POST whose body never ends.
    a.send(&frame(HEADERS, END_HEADERS, 1, &request_block(0x83, &[])));
    // 4 000 WINDOW_UPDATEs of 1, half on the connection, half on the stream:
    // legal (the windows stay far below 2^31 - 1) and, however pointless,
    // within what the server tolerates before it calls them a flood.
    let mut pair = frame(WINDOW_UPDATE, 0, 0, &1u32.to_be_bytes());
    pair.extend(frame(WINDOW_UPDATE, 0, 1, &1u32.to_be_bytes()));
    let n = 2_000;
    let f = a.flood(&repeat(&pair, n), FLOOD_TIME);
    assert_probe(&server, &watch, "WINDOW_UPDATEs");
    assert!(!f.closed && f.written == pair.len() * n, "legal WINDOW_UPDATEs: {f:?} {}", a.summary());
    a.assert_still_answers(3, "WINDOW_UPDATEs");
    assert!(!a.ended() && a.seen.reset(1).is_none(), "legal WINDOW_UPDATEs: {}", a.summary());
    // The stream's window past 2^31 - 1: a stream (or connection) flow-control error.
    a.send(&frame(WINDOW_UPDATE, 0, 1, &0x7fff_ffffu32.to_be_bytes()));
    a.read_until(IO_TIMEOUT, |s| s.reset(1).is_some() || s.goaway.is_some());
    let code = a.seen.reset(1).or(a.seen.goaway);
    assert_eq!(code, Some(FLOW_CONTROL_ERROR), "stream window overflow: {}", a.summary());
    // The connection's window past 2^31 - 1: GOAWAY(FLOW_CONTROL_ERROR), then the close.
    if a.seen.goaway.is_none() {
        let mut more = frame(WINDOW_UPDATE, 0, 0, &0x7fff_ffffu32.to_be_bytes());
        more.extend(frame(WINDOW_UPDATE, 0, 0, &0x7fff_ffffu32.to_be_bytes()));
        a.flood(&more, IO_TIMEOUT);
        a.read_until(IO_TIMEOUT, |s| s.goaway.is_some());
        assert_eq!(a.seen.goaway, Some(FLOW_CONTROL_ERROR), "connection window overflow: {}", a.summary());
    }
    assert!(a.wait_eof(IO_TIMEOUT), "closed after its GOAWAY: {}", a.summary());
    a.report("WINDOW_UPDATEs", &f);
    watch.finish(&server, "WINDOW_UPDATEs");
}

#[test]
fn an_empty_data_flood_on_an_open_post_is_bounded() {
    let server = server();
    let watch = Watch::start(&server);
    let mut a = Attacker::open(server.addr());
    a.send(&frame(HEADERS, END_HEADERS, 1, &request_block(0x83, &[])));
    let n = 100_000;
    let f = a.flood(&repeat(&frame(DATA, 0, 1, &[]), n), FLOOD_TIME);
    assert_probe(&server, &watch, "empty DATA flood");
    a.read_until(Duration::from_millis(200), |s| s.goaway.is_some());
    if f.closed || a.ended() {
        assert!(a.wait_eof(IO_TIMEOUT), "empty DATA flood: GOAWAY but no close: {}", a.summary());
    } else {
        // Still going: the stream's end gets its answer, and so does a new one.
        assert_eq!(f.written, n * 9, "empty DATA flood not written in time: {f:?} {}", a.summary());
        a.send(&frame(DATA, END_STREAM, 1, &[]));
        assert!(a.read_until(IO_TIMEOUT, |s| s.head(1).is_some() || s.reset(1).is_some()), "{}", a.summary());
        a.assert_still_answers(3, "empty DATA flood");
    }
    a.report("empty DATA flood", &f);
    watch.finish(&server, "empty DATA flood");
}

#[test]
fn an_hpack_bomb_is_refused_per_stream_without_buffering_it() {
    let server = server();
    let watch = Watch::start(&server);
    let mut a = Attacker::open(server.addr());
    // Stream 1 inserts one ~4 KB header into the dynamic table (entry
    // 4 000 + 7 + 32 bytes: it fits the default 4 096-byte table).
    let mut insert = vec![0x40]; // literal with incremental indexing, new name
    hpack_str(b"x-bombe", &mut insert);
    hpack_str(&vec![b'b'; 4000], &mut insert);
    a.send(&frame(HEADERS, END_HEADERS | END_STREAM, 1, &request_block(0x82, &insert)));
    // Every later stream refers to it 500 times (0xbe: dynamic index 62):
    // 500 bytes on the wire, ~2 MB decoded, far over `limits.max_header_bytes`.
    let refs = vec![0xbe; 500];
    let block = request_block(0x82, &refs);
    let streams = 3000u32;
    let mut bomb = Vec::new();
    for i in 0..streams {
        bomb.extend(frame(HEADERS, END_HEADERS | END_STREAM, 3 + 2 * i, &block));
    }
    let f = a.flood(&bomb, FLOOD_TIME);
    assert_probe(&server, &watch, "HPACK bomb");
    // Stream 1's head, then one answer (a head or a reset) per bombed stream, or the end.
    a.read_until(IO_TIMEOUT, |s| s.goaway.is_some() || s.resets.len() + s.heads.len() > streams as usize);
    // No bombed stream is served; each is refused (a bare 431, or RST_STREAM) or the
    // connection ends.
    for i in 0..streams {
        let id = 3 + 2 * i;
        assert_ne!(a.seen.head(id), Some(0x88), "bombed stream {id} was served: {}", a.summary());
    }
    let refused =
        (0..streams).map(|i| 3 + 2 * i).filter(|&id| a.seen.reset(id).is_some() || a.seen.head(id).is_some()).count();
    assert!(refused > 0 || a.ended(), "the bomb was not refused: {f:?} {}", a.summary());
    if a.ended() {
        assert!(a.wait_eof(IO_TIMEOUT), "HPACK bomb: GOAWAY but no close: {}", a.summary());
    } else {
        assert_eq!(refused, streams as usize, "every bombed stream refused: {}", a.summary());
    }
    a.report("HPACK bomb", &f);
    watch.finish(&server, "HPACK bomb");
}

/// HEADERS without END_HEADERS, then `n` CONTINUATION frames of `size` bytes each.
fn continuation_flood(n: usize, size: usize) {
    let server = server();
    let watch = Watch::start(&server);
    let mut a = Attacker::open(server.addr());
    let mut bytes = frame(HEADERS, END_STREAM, 1, &request_block(0x82, &[]));
    // Filler: the block never ends, so it is never decoded.
    bytes.extend(repeat(&frame(CONTINUATION, 0, 1, &vec![0; size]), n));
    let f = a.flood(&bytes, FLOOD_TIME);
    assert_probe(&server, &watch, "CONTINUATION flood");
    // Cut as a flood, promptly: not a GOAWAY(NO_ERROR) from an idle or header timer.
    a.read_until(Duration::from_secs(2), |s| s.goaway.is_some());
    let what = format!("CONTINUATION flood ({n} × {size} bytes)");
    let cut = a.seen.goaway.map_or(a.eof, |code| code != 0);
    assert!(cut, "{what}: not cut within 2 s of the flood: {f:?} {}", a.summary());
    assert!(a.wait_eof(IO_TIMEOUT), "{what}: GOAWAY but no close: {}", a.summary());
    assert!(a.seen.head(1).is_none(), "{what}: the endless header block was served");
    a.report(&what, &f);
    watch.finish(&server, &what);
}

#[test]
fn a_flood_of_empty_continuation_frames_ends_the_connection() {
    continuation_flood(10_000, 0);
}

#[test]
fn a_flood_of_full_continuation_frames_ends_the_connection_unbuffered() {
    // 32 MiB of header block if it were all kept.
    continuation_flood(2_000, 16_384);
}

// ---------------------------------------------------------------------------------------
// Control-frame floods end with GOAWAY(ENHANCE_YOUR_CALM) (issue #22, item 3)
// ---------------------------------------------------------------------------------------

/// The most worker CPU one control-frame flood may cost, from its first frame to the close.
const FLOOD_CPU_MS: u64 = 2_000;
/// The longest a flood may go on before its GOAWAY.
const CALM_WITHIN: Duration = Duration::from_secs(5);

/// A SETTINGS frame with one setting.
fn setting(id: u16, value: u32) -> Vec<u8> {
    let mut p = id.to_be_bytes().to_vec();
    p.extend_from_slice(&value.to_be_bytes());
    frame(SETTINGS, 0, 0, &p)
}

/// `f` flooded on a connection, with a stream open (a POST whose body never
/// ends) if `open`, ends with GOAWAY(ENHANCE_YOUR_CALM) and the close, soon
/// and for little of the worker's CPU; the worker's memory stays bounded and
/// `/health` on other connections fast.
fn control_flood(what: &str, f: &[u8], open: bool) {
    let server = server();
    let watch = Watch::start(&server);
    let mut a = Attacker::open(server.addr());
    if open {
        a.send(&frame(HEADERS, END_HEADERS, 1, &request_block(0x83, &[])));
    }
    let cpu = cpu_ms(watch.worker);
    let t = Instant::now();
    // About 30 MB: minutes of work for the worker if it never said stop.
    let flood = a.flood(&repeat(f, (30 << 20) / f.len()), FLOOD_TIME);
    a.read_until(IO_TIMEOUT, |s| s.goaway.is_some());
    let took = t.elapsed();
    a.report(what, &flood);
    assert_eq!(
        a.seen.goaway,
        Some(ENHANCE_YOUR_CALM),
        "{what}: not ended with GOAWAY(ENHANCE_YOUR_CALM) after {took:?}: {flood:?} {}",
        a.summary()
    );
    assert!(took < CALM_WITHIN, "{what}: the GOAWAY came after {took:?}");
    assert!(a.wait_eof(IO_TIMEOUT), "{what}: GOAWAY but no close: {}", a.summary());
    let used = cpu_ms(watch.worker) - cpu;
    eprintln!("{what}: GOAWAY after {took:?}, {used} ms of worker CPU");
    assert!(used < FLOOD_CPU_MS, "{what}: the worker spent {used} ms of CPU on it");
    watch.finish(&server, what);
}

#[test]
fn a_ping_flood_ends_with_enhance_your_calm() {
    control_flood("PING flood", &frame(PING, 0, 0, b"floodpng"), false);
}

#[test]
fn a_settings_flood_ends_with_enhance_your_calm() {
    control_flood("SETTINGS flood", &frame(SETTINGS, 0, 0, &[]), false);
}

#[test]
fn a_ping_flood_on_an_open_stream_ends_with_enhance_your_calm() {
    control_flood("PING flood, a stream open", &frame(PING, 0, 0, b"floodpng"), true);
}

#[test]
fn a_settings_flood_on_an_open_stream_ends_with_enhance_your_calm() {
    control_flood("SETTINGS flood, a stream open", &frame(SETTINGS, 0, 0, &[]), true);
}

#[test]
fn a_window_update_flood_on_an_open_stream_ends_with_enhance_your_calm() {
    let mut pair = frame(WINDOW_UPDATE, 0, 0, &1u32.to_be_bytes());
    pair.extend(frame(WINDOW_UPDATE, 0, 1, &1u32.to_be_bytes()));
    control_flood("WINDOW_UPDATE flood", &pair, true);
}

#[test]
fn a_priority_flood_on_an_open_stream_ends_with_enhance_your_calm() {
    // Stream 1 depends on stream 0, weight 16.
    control_flood("PRIORITY flood", &frame(PRIORITY_FRAME, 0, 1, &[0, 0, 0, 0, 15]), true);
}

#[test]
fn an_unknown_frame_type_flood_on_an_open_stream_ends_with_enhance_your_calm() {
    control_flood("unknown-type flood", &frame(0xfa, 0, 0, b"what"), true);
}

/// A server with `[download] dir` holding `big.bin` (4 MiB), and no rate limit
/// (each stream is a request).
fn download_server() -> (Server, tempfile::TempDir) {
    let tmp = tempfile::Builder::new().prefix("forkd-h2flood-").tempdir().expect("tempdir");
    std::fs::write(tmp.path().join("big.bin"), vec![0x5a; 4 << 20]).expect("write");
    let s = Server::builder().no_rate_limit().set("download", &format!("dir = \"{}\"", tmp.path().display())).start();
    (s, tmp)
}

#[test]
fn window_toggling_settings_over_128_downloads_end_with_calm_and_spare_the_worker() {
    let (server, _files) = download_server();
    let worker = server.wait_workers(1, IO_TIMEOUT)[0];
    let mut a = Attacker::open(server.addr());
    // 128 downloads, never read: they send what the connection window allows, then wait.
    let mut gets = Vec::new();
    for i in 0..128 {
        gets.extend(frame(
            HEADERS,
            END_HEADERS | END_STREAM,
            1 + 2 * i,
            &request_block_for(0x82, b"/download/big.bin", &[]),
        ));
    }
    a.send(&gets);
    assert!(a.read_until(IO_TIMEOUT, |s| s.heads.len() == 128), "128 downloads under way: {}", a.summary());
    // Each SETTINGS moves INITIAL_WINDOW_SIZE between 1 and 65 535: h2 revisits every stream.
    let mut toggles = Vec::new();
    for i in 0..500_000 {
        toggles.extend(setting(0x4, if i % 2 == 0 { 1 } else { 65_535 }));
    }
    let prober = Prober::start(server.addr(), worker);
    let cpu = cpu_ms(worker);
    let t = Instant::now();
    let flood = a.flood(&toggles, FLOOD_TIME);
    a.read_until(IO_TIMEOUT, |s| s.goaway.is_some());
    let took = t.elapsed();
    let used = cpu_ms(worker) - cpu;
    // The same worker answers others meanwhile (and right after, when the flood ends sooner
    // than five probes take).
    prober.wait_for(5);
    let probes = prober.finish();
    let failed: Vec<_> = probes.iter().filter(|p| p.status != Ok(200)).collect();
    let mut times: Vec<Duration> = probes.iter().map(|p| p.took).collect();
    times.sort();
    let p50 = times[times.len() / 2];
    a.report("window-toggling SETTINGS", &flood);
    eprintln!(
        "window-toggling SETTINGS: GOAWAY after {took:?}, {used} ms of worker CPU, /health p50 {p50:?}, \
         {} of {} probes failed",
        failed.len(),
        probes.len()
    );
    assert_eq!(
        a.seen.goaway,
        Some(ENHANCE_YOUR_CALM),
        "not ended with GOAWAY(ENHANCE_YOUR_CALM) after {took:?}: {flood:?} {}",
        a.summary()
    );
    assert!(took < CALM_WITHIN, "the GOAWAY came after {took:?}");
    assert!(failed.is_empty(), "/health failed during the SETTINGS flood: {failed:?}");
    assert!(p50 < Duration::from_millis(200), "/health p50 {p50:?} on the flooded worker ({} probes)", times.len());
    assert!(used < FLOOD_CPU_MS, "the worker spent {used} ms of CPU on it");
}

// ---------------------------------------------------------------------------------------
// Ordinary clients are never taken for a flood
// ---------------------------------------------------------------------------------------

fn installed(tool: &str) -> bool {
    std::process::Command::new(tool).arg("--version").output().is_ok_and(|o| o.status.success())
}

#[test]
fn h2load_nghttp_and_curl_are_not_a_flood() {
    let (server, _files) = download_server();
    let base = format!("http://{}", server.addr());
    if installed("h2load") {
        // 3 000 requests on one connection, 16 at a time, then a download through 16 KiB windows.
        let out = std::process::Command::new("h2load")
            .args(["-n", "3000", "-c", "1", "-m", "16", &format!("{base}/health")])
            .output()
            .expect("h2load");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("3000 succeeded, 0 failed, 0 errored"), "h2load: {text}");
        let out = std::process::Command::new("h2load")
            .args(["-n", "4", "-c", "1", "-m", "1", "-w", "14", "-W", "16", &format!("{base}/download/big.bin")])
            .output()
            .expect("h2load");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("4 succeeded, 0 failed, 0 errored"), "h2load with small windows: {text}");
    } else {
        eprintln!("h2load not installed: skipped");
    }
    if installed("nghttp") {
        // 300 requests on one connection at once, then a download through 1 KiB stream windows.
        let urls: Vec<String> = (0..300).map(|i| format!("{base}/health?i={i}")).collect();
        let out = std::process::Command::new("nghttp").args(["-n", "-s"]).args(&urls).output().expect("nghttp");
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(text.lines().filter(|l| l.contains(" 200 ")).count(), 300, "nghttp: {text}");
        let out = std::process::Command::new("nghttp")
            .args(["-n", "-s", "-w", "10", "-W", "16", &format!("{base}/download/big.bin")])
            .output()
            .expect("nghttp");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains(" 200   4M /download/big.bin"), "nghttp with small windows: {text}");
    } else {
        eprintln!("nghttp not installed: skipped");
    }
    if installed("curl") {
        let out = std::process::Command::new("curl")
            .args(["-sS", "--max-time", "30", "--http2-prior-knowledge", "-o", "/dev/null"])
            .args(["-w", "%{http_code} %{size_download}", &format!("{base}/download/big.bin")])
            .output()
            .expect("curl");
        assert_eq!(String::from_utf8_lossy(&out.stdout), "200 4194304", "{}", String::from_utf8_lossy(&out.stderr));
    } else {
        eprintln!("curl not installed: skipped");
    }
    assert!(!server.logs().contains("HTTP/2 flood"), "{}", server.log_tail());
}

#[test]
fn a_download_through_tiny_windows_completes_without_being_called_a_flood() {
    let (server, _files) = download_server();
    // 256-byte stream windows: about 16 000 DATA frames, each answered by a WINDOW_UPDATE.
    let mut builder = h2::client::Builder::new();
    builder.initial_window_size(256);
    let mut c = crate::h2util::H2Client::h2c_with(server.addr(), builder);
    let req = c.build("GET", "/download/big.bin", &[]);
    let r = c.exchange(req, b"", Duration::from_secs(60)).expect("the download");
    assert_eq!(r.status, 200);
    assert_eq!(r.body.len(), 4 << 20);
    assert!(c.ended.is_none() && !c.eof, "the connection goes on");
    assert_eq!(c.get("/health").status, 200);
    assert!(!server.logs().contains("HTTP/2 flood"), "{}", server.log_tail());
}

/// A flood already queued behind the preface when the worker first reads the
/// connection (its loop was busy) is read as HTTP/2 reads, a window at a
/// time: the sniff that finds the preface does not drain the socket into
/// memory first.
#[test]
fn a_flood_queued_behind_the_preface_is_not_read_whole_by_the_sniff() {
    let server = server();
    let worker = server.wait_workers(1, IO_TIMEOUT)[0];
    assert_eq!(server.get("/health").status, 200);
    let peak_reset = std::fs::write(format!("/proc/{worker}/clear_refs"), "5").is_ok();
    let before = status_kib(worker, "VmRSS:").unwrap_or(0);
    // The worker's loop sleeps for 1 s (a debug route), so the attacker's bytes pile up.
    let mut busy = Conn::open(server.addr());
    busy.send(&request("GET", "/_debug/block?ms=1000", &[], b""));
    thread::sleep(Duration::from_millis(100));
    let addr = server.addr();
    let writer = thread::spawn(move || {
        let mut sock = TcpStream::connect_timeout(&addr, IO_TIMEOUT).expect("connect");
        sock.set_write_timeout(Some(IO_TIMEOUT)).expect("write timeout");
        let mut hello = PREFACE.to_vec();
        hello.extend(frame(SETTINGS, 0, 0, &[]));
        let pings = repeat(&frame(PING, 0, 0, b"queuedpg"), 64 * 1024 / 17);
        let mut written = hello.len();
        let ok = sock.write_all(&hello).is_ok();
        // 64 MB as fast as the socket takes it (the server reads and drops the rest of a
        // connection it ended), or until it closes.
        while ok && written < 64 << 20 && sock.write_all(&pings).is_ok() {
            written += pings.len();
        }
        written
    });
    assert_eq!(busy.read_response().status, 200, "the busy loop answers once it wakes");
    let written = writer.join().expect("writer");
    let now = status_kib(worker, "VmRSS:").unwrap_or(0);
    let peak = if peak_reset { status_kib(worker, "VmHWM:").unwrap_or(now).max(now) } else { now };
    eprintln!("queued flood: {written} bytes written; worker RSS {before} KiB → peak {peak} KiB (now {now} KiB)");
    assert!(peak - before < 4 * 1024, "worker RSS {before} KiB → peak {peak} KiB after a queued flood");
    // It was read as HTTP/2, and ended as a flood.
    server.wait_log_line(IO_TIMEOUT, |l| l.contains("HTTP/2 flood"));
    assert_eq!(server.get("/health").status, 200);
}
