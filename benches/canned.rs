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

use mio::net::TcpStream;

#[path = "mio_serve.rs"]
mod mio_serve;
use mio_serve::{write_out, Args, Service};

/// Read buffer per connection; a pipelined batch larger than this is answered in parts.
const READ_BUF: usize = 64 * 1024;

const USAGE: &str = "canned --listen ADDR [--threads N] (--copy-from ADDR [--path /health] | --response FILE)";

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

/// Every connection answers with the same bytes.
#[derive(Clone, Copy)]
struct Canned(&'static [u8]);

impl Service for Canned {
    type Conn = Conn;

    fn open(&mut self, stream: TcpStream) -> Conn {
        Conn { stream, inbuf: vec![0; READ_BUF].into_boxed_slice(), len: 0, out: Vec::with_capacity(READ_BUF), sent: 0 }
    }

    fn stream(conn: &mut Conn) -> &mut TcpStream {
        &mut conn.stream
    }

    /// Read until `WouldBlock`, answer every whole request, write until
    /// `WouldBlock`; again while the read buffer filled up.
    fn ready(&mut self, c: &mut Conn) -> bool {
        loop {
            let mut open = true;
            while c.len < READ_BUF {
                match c.stream.read(&mut c.inbuf[c.len..]) {
                    Ok(0) => {
                        open = false;
                        break;
                    }
                    Ok(n) => c.len += n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => return false,
                }
            }
            let full = c.len == READ_BUF;
            let mut at = 0;
            while let Some(end) = head_end(&c.inbuf[..c.len], at) {
                c.out.extend_from_slice(self.0);
                at = end;
            }
            c.inbuf.copy_within(at..c.len, 0);
            c.len -= at;
            if !write_out(&mut c.stream, &mut c.out, &mut c.sent) {
                return false;
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

fn main() {
    let (args, response) = match Args::parse(USAGE).and_then(|a| {
        let response = match (a.copy_from, &a.response) {
            (Some(addr), None) => copy_response(addr, &a.path)?,
            (None, Some(f)) => std::fs::read(f)?,
            _ => {
                eprintln!("usage: {USAGE}");
                std::process::exit(2)
            }
        };
        Ok((a, response))
    }) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("canned: {e}");
            std::process::exit(1)
        }
    };
    let response: &'static [u8] = Box::leak(response.into_boxed_slice());
    eprintln!("canned: {} threads on {}, {} response bytes", args.threads, args.listen, response.len());
    mio_serve::run("canned", args.threads, args.listen, move || Canned(response));
}
