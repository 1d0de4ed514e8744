//! HTTP/1.1's sink: how the exchange engine writes an HTTP/1.1 exchange's body onto its
//! connection.
//!
//! The codec (`http1/codec.rs`) parses the request, answers it and writes the head (and a
//! whole body). An exchange that waits on a pool job or upstreams, or whose body follows its
//! head (an event stream, a ticker, a relay, a WebSocket, a file), is the engine's: it adopts
//! it ([`super::exchange::Exchanges::adopt`]) under the key [`Current`] (one exchange at a
//! time), answers a waiting one through the codec ([`Sink::respond`]: the codec writes and
//! logs it, then has the connection back) and writes a body through [`H1Sink`]. What a producer made goes into the output as one
//! piece (a chunk) while the output is below the watermark; a WebSocket's frames go as they
//! are. A file body is read from disk on the pool in slices only while the client keeps up
//! (each slice becomes the output buffer, no copy), or, on a plain connection with a sized
//! body, moved by `sendfile(2)` from the page cache with the kernel advised to read ahead.
//! The codec frames (or passes through) every byte. What became of the connection is the
//! sink's [`Fate`]: the body ended (the codec has the connection back: keep-alive and the
//! pipelined requests, or its close), was abandoned (cut short, closed once flushed), the
//! connection cannot carry it (closed now), or the codec answered the exchange whole.
//!
//! This file must not write HTTP framing, touch the connection table or know a route.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::StatusCode;

use super::bufs::Bufs;
use super::transport::Transport;
use crate::exchange::pool::{ExchangeId, Pool, Work};
use crate::exchange::{Download, Exchange, Gone, Head, Key, Produce, Reset, Sink};
use crate::http::reply::FileRange;
use crate::http::response::{Delimit, Response};
use crate::http::service::{Env, Service, HIGH_WATERMARK};
use crate::http1::codec::Http1;
use crate::http2::ResponseFields;

/// A direct download asks the kernel to read ahead this much of the file at a time, on the
/// pool (`posix_fadvise(WILLNEED)`), half a window before `sendfile` gets there, so the
/// loop's `sendfile` finds the pages in the page cache rather than waiting for the disk.
const ADVISE_WINDOW: u64 = 4 << 20;
/// Bytes one connection sends with `sendfile` per loop turn before the others get theirs
/// (it goes on at the next turn).
const DIRECT_TURN: u64 = 4 << 20;

/// Ask the kernel to read `len` bytes of `file` from `from` into the page cache (on the pool:
/// the call may wait for the device queue). Advice only: a failure changes nothing but speed.
fn advise(file: &std::fs::File, from: u64, len: u64) {
    let (Ok(from), Ok(len)) = (i64::try_from(from), i64::try_from(len)) else { return };
    let _ = nix::fcntl::posix_fadvise(
        std::os::fd::AsRawFd::as_raw_fd(file),
        from,
        len,
        nix::fcntl::PosixFadviseAdvice::POSIX_FADV_WILLNEED,
    );
}

/// The exchange in progress on an HTTP/1.1 connection, its key in the engine: a connection
/// carries one at a time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Current;

impl Key for Current {
    fn id(self, conn: usize, gen: u32) -> ExchangeId {
        ExchangeId::H1 { conn, gen }
    }
}

/// The head of an exchange its codec answered: read, answered and logged there, so nothing
/// of it is kept.
pub(super) struct Answered;

impl Head for Answered {
    fn method(&self) -> &str {
        "GET"
    }
    fn path(&self) -> &str {
        ""
    }
    fn authority(&self) -> Option<&str> {
        None
    }
    fn fields(&self) -> impl Iterator<Item = (&str, &[u8])> {
        std::iter::empty()
    }
}

/// What became of the connection while the engine wrote to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Fate {
    /// The body goes on.
    Open,
    /// The body is complete: the codec writes its end and has the connection back.
    Ended,
    /// The body's producer failed after its head: nothing more is written (its client sees
    /// the body cut short) and the connection closes once its output is sent.
    Abandoned,
    /// The connection cannot carry the body (a write failed, the file shrank): it closes.
    Cut,
    /// The codec answered the exchange whole (a pool job's or upstreams' answer): it has the
    /// connection back (keep-alive and the pipelined requests, or its close).
    Answered,
}

/// An HTTP/1.1 connection's write side for one engine call.
pub(super) struct H1Sink<'a> {
    codec: &'a mut Http1,
    io: &'a mut Transport,
    /// Where an answer's output buffer comes from (an idle connection holds none).
    bufs: &'a mut Bufs,
    now: Instant,
    /// What became of the connection.
    pub(super) fate: Fate,
    /// A direct download sent its share of this turn and the socket takes more: it goes on
    /// at the next turn.
    pub(super) again: bool,
}

impl<'a> H1Sink<'a> {
    /// The write side of the connection whose codec is `codec` and transport `io`, with
    /// output buffers from `bufs`; what became of it so far is `fate`.
    pub(super) fn new(
        codec: &'a mut Http1,
        io: &'a mut Transport,
        bufs: &'a mut Bufs,
        fate: Fate,
        now: Instant,
    ) -> H1Sink<'a> {
        H1Sink { codec, io, bufs, now, fate, again: false }
    }

    /// Whenever the output is fully written, the next slice in order becomes the output
    /// buffer (no copy), and goes out.
    fn slices(&mut self, d: &mut Download) -> Result<(), Gone> {
        while self.io.out.len() <= self.io.out_pos {
            let Some(bytes) = d.take_next() else { break };
            self.io.out.clear();
            self.io.out_pos = 0;
            d.recycle(self.codec.data_owned(&mut self.io.out, bytes));
            if d.done() {
                break;
            }
            self.io.flush().map_err(|_| Gone)?;
            if self.io.pending_out() {
                self.io.output_waits(self.now);
            }
        }
        Ok(())
    }

    /// A direct download: once the head is written, `sendfile(2)` moves what the socket
    /// accepts now straight from the page cache (no user-space buffer, so a slow reader costs
    /// only its socket buffer), at most [`DIRECT_TURN`] per turn; `WouldBlock` waits for the
    /// writable edge under the send timeout. The pool advises the kernel to read ahead.
    fn direct(&mut self, d: &mut Download, pool: &Pool) -> Result<(), Gone> {
        if self.io.pending_out() {
            // The head is still going out: its writable edge comes back here.
            return Ok(());
        }
        let turn_end = d.sent.saturating_add(DIRECT_TURN).min(d.end);
        while d.sent < turn_end {
            if d.advised < d.end && d.advised < d.sent.saturating_add(ADVISE_WINDOW / 2) {
                let (file, from) = (Arc::clone(&d.file), d.advised);
                let len = (d.end - from).min(ADVISE_WINDOW);
                d.advised += len;
                pool.chore(Box::new(move || advise(&file, from, len)));
            }
            let want = self.codec.passthrough(turn_end - d.sent);
            let Ok(mut off) = i64::try_from(d.sent) else { break };
            match nix::sys::sendfile::sendfile64(&self.io.sock, &*d.file, Some(&mut off), want as usize) {
                Ok(0) => {
                    log::warn!("download: the file ended early; closing the connection");
                    return Err(Gone);
                }
                Ok(n) => {
                    d.sent += n as u64;
                    self.codec.passed(n as u64);
                }
                Err(nix::errno::Errno::EAGAIN) => {
                    self.io.output_waits(self.now);
                    return Ok(());
                }
                Err(nix::errno::Errno::EINTR) => {}
                Err(_) => return Err(Gone),
            }
        }
        self.io.send_deadline = None;
        self.again = d.sent < d.end;
        Ok(())
    }
}

impl Sink for H1Sink<'_> {
    type Stream = Current;

    /// The codec writes every HTTP/1.1 head: an adopted exchange is past its head.
    fn informational(&mut self, _: Current, _: &ResponseFields) -> Result<(), Gone> {
        Err(Gone)
    }

    /// As [`H1Sink::informational`].
    fn send_head(&mut self, _: Current, _: StatusCode, _: &ResponseFields, _: bool) -> Result<(), Gone> {
        Err(Gone)
    }

    /// Framed by the codec as its head announced; the end is the codec's to write.
    fn send_data(&mut self, _: Current, data: Bytes, end: bool) -> Result<(), Gone> {
        if self.fate == Fate::Cut {
            return Err(Gone);
        }
        self.codec.data(&mut self.io.out, &data);
        if end {
            self.fate = Fate::Ended;
        }
        Ok(())
    }

    /// HTTP/1.1 has no reset but closing the connection: at once when the exchange is given
    /// up (`Cancel`), once what was sent is flushed when the server failed mid-body
    /// (`Internal`: the body is cut short).
    fn reset(&mut self, _: Current, why: Reset) {
        self.fate = match why {
            Reset::Cancel => Fate::Cut,
            Reset::Internal if self.fate == Fate::Cut => Fate::Cut,
            Reset::Internal => Fate::Abandoned,
        };
    }

    fn abandon(&mut self, _: Current) {
        if self.fate != Fate::Cut {
            self.fate = Fate::Abandoned;
        }
    }

    const ANSWERS: bool = true;

    /// The codec writes the head (and a whole body) and logs the exchange; once it is whole,
    /// the codec has the connection back ([`Fate::Answered`]).
    fn respond(&mut self, _: Current, resp: Response, delimit: Delimit, svc: &mut dyn Service, env: &mut Env) -> bool {
        self.bufs.fill(&mut self.io.out);
        let follows = if delimit == Delimit::Length {
            self.codec.complete(resp, &mut self.io.out, svc, env, self.now);
            false
        } else {
            self.codec.complete_stream(resp, &mut self.io.out, svc, env, self.now)
        };
        if !follows {
            self.fate = Fate::Answered;
        }
        follows
    }

    /// The connection's input is read as its turn allows: no window to open.
    fn release(&mut self, _: Current, _: usize) {}

    fn file_body(f: FileRange) -> Produce {
        Produce::Download(Download::new(f.file, f.offset, f.len, false))
    }

    /// A download's slices, or its direct turn, go out as the socket takes them; what a
    /// producer made goes into the output as one piece while the output is below the
    /// watermark (above it the bytes wait, so the producer is held back).
    fn feed<H>(&mut self, ex: &mut Exchange<Current, H>, pool: &Pool, _: ExchangeId) -> bool {
        let Some(Produce::Download(d)) = &mut ex.produce else {
            if matches!(ex.produce, Some(Produce::Ws(_))) {
                // A WebSocket's frames are the connection's bytes, after the 101.
                self.io.out.append(&mut ex.unsent);
            } else if !ex.unsent.is_empty() && self.io.backlog() <= HIGH_WATERMARK {
                // Taken, not kept: a long-lived stream holds no buffer between its pieces.
                let piece = std::mem::take(&mut ex.unsent);
                self.codec.data(&mut self.io.out, &piece);
            }
            return false;
        };
        let sent = if d.direct { self.direct(d, pool) } else { self.slices(d) };
        if sent.is_err() {
            self.fate = Fate::Cut;
            return true;
        }
        ex.done |= d.done();
        false
    }

    /// Ask the pool for a download's next slices while the client keeps up: at most
    /// `READS_AHEAD` buffers per download, counting the one being written.
    fn pump<H>(&mut self, exchanges: &mut [Exchange<Current, H>], pool: &Pool, conn: usize, gen: u32) -> bool {
        let writing = self.io.out.len() > self.io.out_pos;
        for ex in exchanges {
            let Some(Produce::Download(d)) = &mut ex.produce else { continue };
            if d.direct {
                continue;
            }
            let id = ex.stream.id(conn, gen);
            while let Some((at, len, buf)) = d.next_slice(writing) {
                pool.submit(id, Work::Read(Arc::clone(&d.file), at, len, buf));
            }
        }
        false
    }
}
