//! `canned`: the limit a mio HTTP/1.1 server reaches on this machine, as a
//! reference for `bin/loadtest --with-canned`.
//!
//! It answers every request with the same bytes: one response copied once,
//! at start, from a running forkd (`--copy-from`, so head and body are the
//! size forkd sends, its date, request id and nonce frozen), or read from a
//! file. Like forkd it runs N single-threaded mio loops (threads here, one
//! `SO_REUSEPORT` listener each), reads until `WouldBlock`, answers every
//! pipelined request of a read before one write, and parses only enough to
//! find where a request ends (the blank line; a request with a body is not
//! supported). No routing, no headers, no allocation per request: whatever
//! forkd spends beyond this is its own cost.
//!
//! Usage: canned --listen 127.0.0.1:PORT [--threads 2]
//!                (--copy-from 127.0.0.1:PORT [--path /health] | --response FILE)
//! Built as a cargo example: `cargo build --release --example canned`.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream as StdStream};
use std::time::Duration;

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token};

const LISTENER: Token = Token(usize::MAX);
/// Read buffer per connection; a pipelined batch larger than this is answered in parts.
const READ_BUF: usize = 64 * 1024;

struct Args {
    listen: SocketAddr,
    threads: usize,
    response: Vec<u8>,
}

fn usage() -> ! {
    eprintln!("usage: canned --listen ADDR [--threads N] (--copy-from ADDR [--path /health] | --response FILE)");
    std::process::exit(2)
}

fn parse_args() -> io::Result<Args> {
    let mut listen = None;
    let mut threads = 2;
    let mut copy_from = None;
    let mut path = "/health".to_owned();
    let mut file = None;
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().unwrap_or_else(|| usage());
        match flag.as_str() {
            "--listen" => listen = Some(value.parse::<SocketAddr>().map_err(io::Error::other)?),
            "--threads" => threads = value.parse::<usize>().map_err(io::Error::other)?,
            "--copy-from" => copy_from = Some(value.parse::<SocketAddr>().map_err(io::Error::other)?),
            "--path" => path = value,
            "--response" => file = Some(value),
            _ => usage(),
        }
    }
    let listen = listen.unwrap_or_else(|| usage());
    let response = match (copy_from, file) {
        (Some(addr), None) => copy_response(addr, &path)?,
        (None, Some(f)) => std::fs::read(f)?,
        _ => usage(),
    };
    if threads == 0 {
        usage();
    }
    Ok(Args { listen, threads, response })
}

/// One keep-alive response to `GET path`, head and body, as the server sent it.
fn copy_response(addr: SocketAddr, path: &str) -> io::Result<Vec<u8>> {
    let mut s = StdStream::connect_timeout(&addr, Duration::from_secs(5))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n")?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = head_end(&buf, 0) {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let len = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse::<usize>().ok())
                .ok_or_else(|| io::Error::other("the response has no Content-Length"))?;
            if buf.len() >= end + len {
                buf.truncate(end + len);
                return Ok(buf);
            }
        }
        let n = s.read(&mut chunk)?;
        if n == 0 {
            return Err(io::Error::other("the server closed before a whole response"));
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// The end (past the blank line) of the first request head at or after `from`.
fn head_end(buf: &[u8], from: usize) -> Option<usize> {
    buf.get(from..)?.windows(4).position(|w| w == b"\r\n\r\n").map(|i| from + i + 4)
}

struct Conn {
    stream: TcpStream,
    /// Unanswered request bytes: `inbuf[..len]`.
    inbuf: Box<[u8]>,
    len: usize,
    out: Vec<u8>,
    sent: usize,
}

impl Conn {
    /// Read until `WouldBlock`, answer every whole request, write until
    /// `WouldBlock`; again while the read buffer filled up. `false`: the
    /// connection is finished.
    fn ready(&mut self, response: &[u8]) -> bool {
        loop {
            let mut open = true;
            while self.len < READ_BUF {
                match self.stream.read(&mut self.inbuf[self.len..]) {
                    Ok(0) => {
                        open = false;
                        break;
                    }
                    Ok(n) => self.len += n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => return false,
                }
            }
            let full = self.len == READ_BUF;
            let mut at = 0;
            while let Some(end) = head_end(&self.inbuf[..self.len], at) {
                self.out.extend_from_slice(response);
                at = end;
            }
            self.inbuf.copy_within(at..self.len, 0);
            self.len -= at;
            while self.sent < self.out.len() {
                match self.stream.write(&self.out[self.sent..]) {
                    Ok(0) => return false,
                    Ok(n) => self.sent += n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => return false,
                }
            }
            if self.sent == self.out.len() {
                self.out.clear();
                self.sent = 0;
            }
            if !open || (full && at == 0) {
                return false; // closed, or a head larger than the buffer
            }
            if !full {
                return true;
            }
        }
    }
}

fn listener(addr: SocketAddr) -> io::Result<TcpListener> {
    let domain = socket2::Domain::for_address(addr);
    let s = socket2::Socket::new(domain, socket2::Type::STREAM, Some(socket2::Protocol::TCP))?;
    s.set_reuse_address(true)?;
    s.set_reuse_port(true)?;
    s.set_nonblocking(true)?;
    s.bind(&addr.into())?;
    s.listen(1024)?;
    Ok(TcpListener::from_std(s.into()))
}

fn serve(addr: SocketAddr, response: &[u8]) -> io::Result<()> {
    let mut poll = Poll::new()?;
    let mut listener = listener(addr)?;
    poll.registry().register(&mut listener, LISTENER, Interest::READABLE)?;
    let mut conns: Vec<Option<Conn>> = Vec::new();
    let mut free: Vec<usize> = Vec::new();
    let mut events = Events::with_capacity(1024);
    loop {
        match poll.poll(&mut events, None) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
        for ev in events.iter() {
            if ev.token() == LISTENER {
                loop {
                    match listener.accept() {
                        Ok((mut stream, _)) => {
                            let _ = stream.set_nodelay(true);
                            let i = free.pop().unwrap_or_else(|| {
                                conns.push(None);
                                conns.len() - 1
                            });
                            poll.registry().register(&mut stream, Token(i), Interest::READABLE | Interest::WRITABLE)?;
                            conns[i] = Some(Conn {
                                stream,
                                inbuf: vec![0; READ_BUF].into_boxed_slice(),
                                len: 0,
                                out: Vec::with_capacity(READ_BUF),
                                sent: 0,
                            });
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(_) => break, // EMFILE and the like: try again on the next event
                    }
                }
                continue;
            }
            let i = ev.token().0;
            let done = match conns.get_mut(i).and_then(Option::as_mut) {
                Some(c) => !c.ready(response),
                None => false,
            };
            if done {
                if let Some(mut c) = conns[i].take() {
                    let _ = poll.registry().deregister(&mut c.stream);
                }
                free.push(i);
            }
        }
    }
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("canned: {e}");
            std::process::exit(1)
        }
    };
    let response: &'static [u8] = Box::leak(args.response.into_boxed_slice());
    eprintln!("canned: {} threads on {}, {} response bytes", args.threads, args.listen, response.len());
    let handles: Vec<_> = (0..args.threads)
        .map(|_| {
            let addr = args.listen;
            std::thread::spawn(move || serve(addr, response))
        })
        .collect();
    for h in handles {
        if let Ok(Err(e)) = h.join() {
            eprintln!("canned: {e}");
            std::process::exit(1);
        }
    }
}
