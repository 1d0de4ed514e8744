//! The floor under a WebSocket room fan-out on this machine: no server, only the writes.
//!
//! `bin/bench-ws-fanout` runs it after forkd, in the same run, as the peer to compare
//! with. It opens `MEMBERS` loopback TCP connections (the client ends with
//! `SO_TIMESTAMPNS` and in one epoll set, as the bench's client has them, and never
//! read), splits the server ends
//! over `THREADS` threads (forkd's workers), and for `ROUNDS` rounds has every thread
//! write one `SIZE`-byte frame to each of its sockets at once, one `write(2)` each, which
//! is what a worker does for its members. A write on loopback returns after the
//! receiver's TCP stack has queued the bytes, so the time from the round's start to a
//! write's return is the delivery latency the bench's kernel stamps measure, minus
//! everything a server does before its first write (reading the sender's frame, the bus).
//! Prints p50 / p99 / max of those times over every member and round.
//!
//! Usage: `fanout_floor [MEMBERS=1000] [ROUNDS=20] [THREADS=2] [SIZE=120]`
//! (`cargo build --release --example fanout_floor`). A benchmark: it never checks numbers.

use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

fn arg(n: usize, default: usize) -> usize {
    std::env::args().nth(n).and_then(|a| a.parse().ok()).unwrap_or(default)
}

/// Watches `s` for input in the epoll set `ep`, as the bench's client (one selector over
/// every socket) does: each arrival then also queues an epoll event.
fn watch(ep: libc::c_int, s: &TcpStream) {
    let mut ev = libc::epoll_event { events: libc::EPOLLIN as u32, u64: 0 };
    // SAFETY: a valid epoll fd and socket, and an event the call only reads.
    if unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, s.as_raw_fd(), &mut ev) } != 0 {
        eprintln!("epoll_ctl: {}", std::io::Error::last_os_error());
    }
}

/// Asks the kernel to stamp each packet `s` receives, as the bench's client does.
fn stamp_arrivals(s: &TcpStream) {
    let on: libc::c_int = 1;
    // SAFETY: a valid socket, a c_int option value and its exact size.
    let rc = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_TIMESTAMPNS,
            (&on as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        eprintln!("SO_TIMESTAMPNS: {}", std::io::Error::last_os_error());
    }
}

fn main() -> std::io::Result<()> {
    let (members, rounds, threads, size) = (arg(1, 1000), arg(2, 20), arg(3, 2).max(1), arg(4, 120).max(2));
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    // SAFETY: epoll_create1 takes no pointers; the fd lives as long as the process.
    let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    if ep < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut clients = Vec::with_capacity(members);
    let mut servers = Vec::with_capacity(members);
    for _ in 0..members {
        let c = TcpStream::connect(addr)?;
        stamp_arrivals(&c);
        watch(ep, &c);
        let (s, _) = listener.accept()?;
        s.set_nodelay(true)?;
        clients.push(c);
        servers.push(s);
    }
    // A WebSocket text frame as a server sends it: unmasked, a 7-bit length.
    let mut frame = vec![b'x'; size.min(127)];
    frame[0] = 0x81;
    frame[1] = (frame.len() - 2) as u8;
    let frame: Arc<[u8]> = frame.into();
    let start = Arc::new(Barrier::new(threads));
    let mut workers = Vec::new();
    let per = members.div_ceil(threads);
    let mut rest = servers.into_iter();
    for _ in 0..threads {
        let mut socks: Vec<TcpStream> = rest.by_ref().take(per).collect();
        let (start, frame) = (Arc::clone(&start), Arc::clone(&frame));
        workers.push(thread::spawn(move || -> std::io::Result<Vec<f64>> {
            let mut done = Vec::with_capacity(rounds * socks.len());
            for _ in 0..rounds {
                start.wait();
                let t = Instant::now();
                for s in socks.iter_mut() {
                    s.write_all(&frame)?;
                    done.push(t.elapsed().as_secs_f64() * 1e3);
                }
                // Rounds apart, as the bench's are (its default gap is 50 ms).
                thread::sleep(Duration::from_millis(50));
            }
            Ok(done)
        }));
    }
    let mut ms = Vec::new();
    for w in workers {
        ms.extend(w.join().map_err(|_| std::io::Error::other("a writer panicked"))??);
    }
    ms.sort_by(f64::total_cmp);
    let pct = |q: f64| ms.get(((ms.len().saturating_sub(1)) as f64 * q) as usize).copied().unwrap_or(f64::NAN);
    println!(
        "    floor (bare writes)   {:7.2} {:7.2} {:7.2}   ({members} members, {threads} threads, {rounds} rounds, {}-byte frames)",
        pct(0.5),
        pct(0.99),
        pct(1.0),
        frame.len()
    );
    drop(clients);
    Ok(())
}
