//! Downloads over HTTP/1.1: a file body after its head, read from disk on the pool in slices
//! only while the client keeps up ([`Download`]), or, on a plain connection with a sized body,
//! moved by `sendfile(2)` from the page cache with the kernel advised to read ahead. The
//! codec frames (or passes through) every byte; the download ends by handing the connection
//! back to the codec (keep-alive, then the pipelined requests).
//!
//! This file must not write HTTP framing or know a route.

use std::sync::Arc;
use std::time::Instant;

use super::conn::ConnState;
use super::conn::Stream;
use super::download::Download;
use super::pool::{ExchangeId, Work};
use super::Worker;
use crate::http::reply::FileRange;

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

impl Worker {
    /// Connection `idx` got a file reply; its head is in the output already.
    pub(super) fn start_download(&mut self, idx: usize, f: FileRange) {
        let Some(Some(c)) = self.conns.get_mut(idx) else { return };
        let ConnState::Http1(h) = &mut c.state else { return };
        let FileRange { file, offset, len } = f;
        // Plain HTTP/1.1 with a sized body: the bytes go to the socket as they are, so the
        // kernel can move them from the page cache (TLS encrypts in user space; chunked or
        // HEAD framing is not pass-through).
        let direct = c.io.tls.is_none() && len > 0 && h.codec.passthrough(len) == len;
        h.stream = Some(Stream::Download(Download::new(file, offset, len, direct)));
        self.drive_stream(idx);
    }

    /// Ask the pool for the next slices of a download while the client keeps up:
    /// at most `READS_AHEAD` buffers per download, counting the one being written.
    fn pump(&mut self, idx: usize) {
        let Some(Some(c)) = self.conns.get_mut(idx) else { return };
        let ConnState::Http1(h) = &mut c.state else { return };
        let Some(Stream::Download(d)) = &mut h.stream else { return };
        let writing = c.io.out.len() > c.io.out_pos;
        let id = ExchangeId::H1 { conn: idx, gen: c.generation };
        while let Some((at, len, buf)) = d.next_slice(writing) {
            self.pool.submit(id, Work::Read(Arc::clone(&d.file), at, len, buf));
        }
    }

    /// Whenever the output is fully written, the next slice in order becomes
    /// the output buffer (no copy); then more is asked for.
    pub(super) fn feed(&mut self, idx: usize) {
        if self.send_direct(idx) {
            return;
        }
        loop {
            let Some(Some(c)) = self.conns.get_mut(idx) else { return };
            let ConnState::Http1(h) = &mut c.state else { return };
            let Some(Stream::Download(d)) = &mut h.stream else { return };
            if c.io.out.len() > c.io.out_pos {
                break;
            }
            let Some(bytes) = d.take_next() else { break };
            // All of the output is written: the slice becomes the output (no copy).
            c.io.out.clear();
            c.io.out_pos = 0;
            d.recycle(h.codec.data_owned(&mut c.io.out, bytes));
            if d.done() {
                h.stream = None;
                // Back to HTTP/1.1: flush, then serve what was pipelined meanwhile.
                if !h.codec.end_body(&mut c.io.out, &self.env, Instant::now()) {
                    h.closing = true;
                }
                self.drive(idx);
                return;
            }
            if c.io.flush().is_err() {
                self.close(idx);
                return;
            }
            if c.io.pending_out() {
                c.io.output_waits(Instant::now());
                self.arm(idx);
            }
        }
        self.pump(idx);
    }

    /// A direct download: once the head is written, `sendfile(2)` moves what the socket
    /// accepts now straight from the page cache (no user-space buffer, so a slow reader costs
    /// only its socket buffer), at most [`DIRECT_TURN`] per turn; `WouldBlock` waits for the
    /// writable edge under the send timeout. The pool advises the kernel to read ahead.
    /// Returns `false` when the download is not direct (the slice path runs instead).
    fn send_direct(&mut self, idx: usize) -> bool {
        let Some(Some(c)) = self.conns.get_mut(idx) else { return true };
        let pending = c.io.pending_out();
        let ConnState::Http1(h) = &mut c.state else { return true };
        let Some(Stream::Download(d)) = &mut h.stream else { return true };
        if !d.direct {
            return false;
        }
        if pending {
            // The head is still going out: its writable edge comes back here.
            return true;
        }
        let turn_end = d.sent.saturating_add(DIRECT_TURN).min(d.end);
        while d.sent < turn_end {
            if d.advised < d.end && d.advised < d.sent.saturating_add(ADVISE_WINDOW / 2) {
                let (file, from) = (Arc::clone(&d.file), d.advised);
                let len = (d.end - from).min(ADVISE_WINDOW);
                d.advised += len;
                self.pool.chore(Box::new(move || advise(&file, from, len)));
            }
            let want = h.codec.passthrough(turn_end - d.sent);
            let Ok(mut off) = i64::try_from(d.sent) else { break };
            match nix::sys::sendfile::sendfile64(&c.io.sock, &*d.file, Some(&mut off), want as usize) {
                Ok(0) => {
                    // The file shrank: the promised length cannot be sent.
                    log::warn!("download: the file ended early; closing the connection");
                    self.close(idx);
                    return true;
                }
                Ok(n) => {
                    d.sent += n as u64;
                    h.codec.passed(n as u64);
                }
                Err(nix::errno::Errno::EAGAIN) => {
                    c.io.output_waits(Instant::now());
                    self.arm(idx);
                    return true;
                }
                Err(nix::errno::Errno::EINTR) => {}
                Err(_) => {
                    self.close(idx);
                    return true;
                }
            }
        }
        c.io.send_deadline = None;
        if d.sent < d.end {
            // The turn's share is sent and the socket takes more: the rest next turn.
            self.drained.push((idx, c.generation));
            return true;
        }
        h.stream = None;
        // Back to HTTP/1.1: flush, then serve what was pipelined meanwhile.
        if !h.codec.end_body(&mut c.io.out, &self.env, Instant::now()) {
            h.closing = true;
        }
        self.drive(idx);
        true
    }

    /// A slice of a download arrived from the pool (slices may complete out of order).
    pub(super) fn chunk_arrived(&mut self, idx: usize, offset: u64, bytes: Vec<u8>) {
        let Some(Some(c)) = self.conns.get_mut(idx) else { return };
        let ConnState::Http1(h) = &mut c.state else { return };
        let Some(Stream::Download(d)) = &mut h.stream else { return };
        if !d.arrived(offset, bytes) {
            // The file shrank or failed: the promised length cannot be sent.
            log::warn!("download read failed; closing the connection");
            self.close(idx);
            return;
        }
        self.drive_stream(idx);
    }
}
