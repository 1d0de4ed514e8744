//! The part the reference servers in `benches/` (`canned`, `h2ceiling`) have in common:
//! their command line, N single-threaded mio loops (threads here, one `SO_REUSEPORT`
//! listener each) accepting into a slab of connections, and writing a connection's
//! output until `WouldBlock`. What a connection does with its bytes is each server's own,
//! through [`Service`]. Included by each with `#[path]`; not a module of forkd.

use std::io::{self, Write};
use std::net::SocketAddr;

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token};

const LISTENER: Token = Token(usize::MAX);

/// What one server thread does with its connections.
pub trait Service {
    type Conn;
    /// A connection was accepted.
    fn open(&mut self, stream: TcpStream) -> Self::Conn;
    /// The connection's socket, to register and deregister.
    fn stream(conn: &mut Self::Conn) -> &mut TcpStream;
    /// The connection is readable or writable; `false`: it is finished.
    fn ready(&mut self, conn: &mut Self::Conn) -> bool;
    /// Once per loop turn, before its events.
    fn turn(&mut self) {}
}

/// The command line: `--listen ADDR [--threads N] [--copy-from ADDR] [--path P]
/// [--response FILE]`; which of the sources a server takes is its own to check.
pub struct Args {
    pub listen: SocketAddr,
    pub threads: usize,
    pub copy_from: Option<SocketAddr>,
    pub path: String,
    pub response: Option<String>,
}

impl Args {
    /// Parses the process's arguments; prints `usage` and exits 2 on anything else.
    pub fn parse(usage: &str) -> io::Result<Args> {
        let bad = || -> ! {
            eprintln!("usage: {usage}");
            std::process::exit(2)
        };
        let (mut listen, mut threads, mut copy_from, mut path, mut response) = (None, 2, None, None, None);
        let mut it = std::env::args().skip(1);
        while let Some(flag) = it.next() {
            let value = it.next().unwrap_or_else(|| bad());
            match flag.as_str() {
                "--listen" => listen = Some(value.parse::<SocketAddr>().map_err(io::Error::other)?),
                "--threads" => threads = value.parse::<usize>().map_err(io::Error::other)?,
                "--copy-from" => copy_from = Some(value.parse::<SocketAddr>().map_err(io::Error::other)?),
                "--path" => path = Some(value),
                "--response" => response = Some(value),
                _ => bad(),
            }
        }
        let Some(listen) = listen else { bad() };
        if threads == 0 {
            bad();
        }
        Ok(Args { listen, threads, copy_from, path: path.unwrap_or_else(|| "/health".to_owned()), response })
    }
}

/// Runs `threads` loops on `addr`, each serving with its own `make()`, until one fails;
/// then prints the error as `name: …` and exits 1.
pub fn run<S: Service>(name: &str, threads: usize, addr: SocketAddr, make: impl Fn() -> S + Send + Copy + 'static) {
    let handles: Vec<_> = (0..threads).map(|_| std::thread::spawn(move || serve(addr, make()))).collect();
    for h in handles {
        if let Ok(Err(e)) = h.join() {
            eprintln!("{name}: {e}");
            std::process::exit(1);
        }
    }
}

/// Writes `out[*sent..]` until it is all sent or the socket would block; clears `out` once
/// it is all sent. `false`: the connection failed.
pub fn write_out(stream: &mut TcpStream, out: &mut Vec<u8>, sent: &mut usize) -> bool {
    while *sent < out.len() {
        match stream.write(&out[*sent..]) {
            Ok(0) => return false,
            Ok(n) => *sent += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
    if *sent == out.len() {
        out.clear();
        *sent = 0;
    }
    true
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

/// One thread's loop: accept, and hand each ready connection to `service`.
fn serve<S: Service>(addr: SocketAddr, mut service: S) -> io::Result<()> {
    let mut poll = Poll::new()?;
    let mut listener = listener(addr)?;
    poll.registry().register(&mut listener, LISTENER, Interest::READABLE)?;
    let mut conns: Vec<Option<S::Conn>> = Vec::new();
    let mut free: Vec<usize> = Vec::new();
    let mut events = Events::with_capacity(1024);
    loop {
        match poll.poll(&mut events, None) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
        service.turn();
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
                            conns[i] = Some(service.open(stream));
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
                Some(c) => !service.ready(c),
                None => false,
            };
            if done {
                if let Some(mut c) = conns[i].take() {
                    let _ = poll.registry().deregister(S::stream(&mut c));
                }
                free.push(i);
            }
        }
    }
}
