//! Downloads over HTTP/1.1: a file body after its head, read from disk on
//! the pool in 64 KiB slices only while the client keeps up ([`Download`]),
//! or, on a plain connection with a sized body, moved by `sendfile(2)` from
//! the page cache with the kernel advised to read ahead. The codec frames
//! (or passes through) every byte; the download ends by handing the
//! connection back to the codec (keep-alive, then the pipelined requests).
//!
//! An HTTP/2 download keeps the same [`Download`] in its exchange (`h2.rs`,
//! `Produce::Download`): it reads only as much as its stream may send
//! ([`Download::next_read`], asked with the stream's window), moves the
//! slices into the stream's unsent bytes, and never uses `sendfile`. This
//! file must not write HTTP framing or know a route.

use std::sync::Arc;
use std::time::Instant;

use super::conn::{flush, ConnState};
use super::pool::{ExchangeId, Work};
use super::streams::Stream;
use super::{Worker, SEND_TIMEOUT};
use crate::http::reply::FileRange;

/// State of one download: the pool reads the next slices only while the
/// client keeps up (back pressure: a slow reader pauses the disk; a download
/// holds at most `READS_AHEAD` slices, 128 KiB, counting the one being written).
pub struct Download {
    file: Arc<std::fs::File>,
    /// Next byte to append to the output.
    sent: u64,
    /// Next byte to ask the pool for.
    next_read: u64,
    /// One past the last byte to send.
    end: u64,
    /// Reads on the pool.
    in_flight: usize,
    /// Slices read and not yet in the output (they may complete out of order).
    ready: Vec<(u64, Vec<u8>)>,
    /// A written slice's buffer, for the next read.
    spare: Option<Vec<u8>>,
    /// Sent with `sendfile(2)`, page cache to socket, no slices (see [`Worker::send_direct`]).
    direct: bool,
    /// With `direct`: the file is advised to the kernel (`WILLNEED`) up to here.
    advised: u64,
}

impl Download {
    /// `len` bytes of `file` from `offset`; `direct`: sent with `sendfile(2)`.
    pub(super) fn new(file: Arc<std::fs::File>, offset: u64, len: u64, direct: bool) -> Download {
        Download {
            file,
            sent: offset,
            next_read: offset,
            end: offset.saturating_add(len),
            in_flight: 0,
            ready: Vec::new(),
            spare: None,
            direct,
            advised: offset,
        }
    }

    /// The next slice to ask the pool for (offset, length, a buffer to read into), while
    /// the download holds fewer than [`READS_AHEAD`] slices, counting the one being
    /// written (`writing`) and the reads in flight; `None` once the client must catch up
    /// or every slice is asked for.
    pub(super) fn next_slice(&mut self, writing: bool) -> Option<(u64, usize, Vec<u8>)> {
        self.read(usize::from(writing), SLICE as usize)
    }

    /// The next read of at most `max` bytes (an HTTP/2 stream's window), while fewer
    /// than [`READS_AHEAD`] reads are in flight or read and not taken.
    pub(super) fn next_read(&mut self, max: usize) -> Option<(u64, usize, Vec<u8>)> {
        self.read(0, max)
    }

    /// Bytes asked for and not yet taken: reads in flight and slices read.
    pub(super) fn ahead(&self) -> u64 {
        self.next_read - self.sent
    }

    /// Bytes remain to be asked for.
    pub(super) fn unread(&self) -> bool {
        self.next_read < self.end
    }

    fn read(&mut self, writing: usize, max: usize) -> Option<(u64, usize, Vec<u8>)> {
        if max == 0 || self.next_read >= self.end || writing + self.ready.len() + self.in_flight >= READS_AHEAD {
            return None;
        }
        let at = self.next_read;
        let len = (self.end - at).min(SLICE).min(max as u64) as usize;
        let buf = self.spare.take().unwrap_or_else(|| Vec::with_capacity(len));
        self.next_read += len as u64;
        self.in_flight += 1;
        Some((at, len, buf))
    }

    /// The read at `offset` completed with `bytes` (reads may complete out of order).
    /// `false`: the read failed or the file shrank (no bytes), so the promised length
    /// cannot be sent.
    pub(super) fn arrived(&mut self, offset: u64, bytes: Vec<u8>) -> bool {
        self.in_flight = self.in_flight.saturating_sub(1);
        if bytes.is_empty() {
            return false;
        }
        self.ready.push((offset, bytes));
        true
    }

    /// The next slice in file order, if it has arrived: it is sent from now on.
    pub(super) fn take_next(&mut self) -> Option<Vec<u8>> {
        let pos = self.ready.iter().position(|(o, _)| *o == self.sent)?;
        let (_, bytes) = self.ready.swap_remove(pos);
        self.sent += bytes.len() as u64;
        Some(bytes)
    }

    /// A written slice's buffer, kept for the next read when it is slice-sized.
    pub(super) fn recycle(&mut self, mut spare: Vec<u8>) {
        if spare.capacity() >= SLICE as usize && spare.capacity() <= 2 * SLICE as usize {
            spare.clear();
            self.spare = Some(spare);
        }
    }

    /// The file being sent.
    pub(super) fn file(&self) -> &Arc<std::fs::File> {
        &self.file
    }

    /// Reads are on the pool, or slices read and not yet taken: more comes
    /// without the client's help.
    pub(super) fn reading(&self) -> bool {
        self.in_flight > 0 || !self.ready.is_empty()
    }

    /// Every byte is sent (or handed to the output).
    pub(super) fn done(&self) -> bool {
        self.sent >= self.end
    }
}

/// Bytes read from disk per pool job: the contract's 64 KiB chunks.
const SLICE: u64 = 64 * 1024;
/// A direct download asks the kernel to read ahead this much of the file at a time, on the
/// pool (`posix_fadvise(WILLNEED)`), half a window before `sendfile` gets there, so the
/// loop's `sendfile` finds the pages in the page cache rather than waiting for the disk.
const ADVISE_WINDOW: u64 = 4 << 20;
/// Bytes one connection sends with `sendfile` per loop turn before the others get theirs
/// (it goes on at the next turn).
const DIRECT_TURN: u64 = 4 << 20;
/// Reads kept in flight per download, so the disk read of the next slice
/// overlaps the socket write of this one. Measured on a 1 GiB loopback
/// download: one 64 KiB read at a time gave 0.73-0.76 GB/s, one 128 KiB read
/// 0.92-1.32 GB/s.
const READS_AHEAD: usize = 2;

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
        let direct = c.tls.is_none() && len > 0 && h.codec.passthrough(len) == len;
        h.stream = Some(Stream::Download(Download::new(file, offset, len, direct)));
        self.drive_stream(idx);
    }

    /// Ask the pool for the next slices of a download while the client keeps up:
    /// at most `READS_AHEAD` buffers per download, counting the one being written.
    fn pump(&mut self, idx: usize) {
        let Some(Some(c)) = self.conns.get_mut(idx) else { return };
        let ConnState::Http1(h) = &mut c.state else { return };
        let Some(Stream::Download(d)) = &mut h.stream else { return };
        let writing = c.out.len() > c.out_pos;
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
            if c.out.len() > c.out_pos {
                break;
            }
            let Some(bytes) = d.take_next() else { break };
            // All of the output is written: the slice becomes the output (no copy).
            c.out.clear();
            c.out_pos = 0;
            d.recycle(h.codec.data_owned(&mut c.out, bytes));
            if d.done() {
                h.stream = None;
                // Back to HTTP/1.1: flush, then serve what was pipelined meanwhile.
                if !h.codec.end_body(&mut c.out, &self.env, Instant::now()) {
                    h.closing = true;
                }
                self.drive(idx);
                return;
            }
            if flush(&mut c.sock, &mut c.tls, &mut c.out, &mut c.out_pos).is_err() {
                self.close(idx);
                return;
            }
            if c.pending_out() {
                c.send_deadline = c.send_deadline.or(Some(Instant::now() + SEND_TIMEOUT));
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
        let pending = c.pending_out();
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
            match nix::sys::sendfile::sendfile64(&c.sock, &*d.file, Some(&mut off), want as usize) {
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
                    c.send_deadline = c.send_deadline.or(Some(Instant::now() + SEND_TIMEOUT));
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
        c.send_deadline = None;
        if d.sent < d.end {
            // The turn's share is sent and the socket takes more: the rest next turn.
            self.drained.push((idx, c.generation));
            return true;
        }
        h.stream = None;
        // Back to HTTP/1.1: flush, then serve what was pipelined meanwhile.
        if !h.codec.end_body(&mut c.out, &self.env, Instant::now()) {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn download(offset: u64, len: u64) -> Download {
        let file = tempfile::tempfile().expect("temp file");
        Download::new(Arc::new(file), offset, len, false)
    }

    #[test]
    fn at_most_two_slices_are_held_counting_the_one_being_written() {
        let mut d = download(10, 3 * SLICE + 5);
        let first = d.next_slice(false).map(|(at, len, _)| (at, len));
        let second = d.next_slice(false).map(|(at, len, _)| (at, len));
        assert_eq!(first, Some((10, SLICE as usize)));
        assert_eq!(second, Some((10 + SLICE, SLICE as usize)));
        assert!(d.next_slice(false).is_none(), "two reads in flight");
        assert!(d.arrived(10, vec![1; SLICE as usize]));
        assert!(d.next_slice(false).is_none(), "one in flight, one ready");
        assert_eq!(d.take_next().map(|b| b.len()), Some(SLICE as usize));
        assert!(d.next_slice(true).is_none(), "one in flight, one being written");
        let third = d.next_slice(false).map(|(at, len, _)| (at, len));
        assert_eq!(third, Some((10 + 2 * SLICE, SLICE as usize)));
    }

    #[test]
    fn slices_go_out_in_file_order_whatever_order_they_arrive_in() {
        let mut d = download(0, SLICE + 3);
        let (a, _, _) = d.next_slice(false).expect("first");
        let (b, len_b, _) = d.next_slice(false).expect("second");
        assert_eq!(len_b, 3, "the last slice is what is left");
        assert!(d.reading(), "reads on the pool");
        assert!(d.arrived(b, vec![2; 3]));
        assert!(d.take_next().is_none(), "the second slice waits for the first");
        assert!(d.arrived(a, vec![1; SLICE as usize]));
        assert_eq!(d.take_next().map(|s| s[0]), Some(1));
        assert!(!d.done());
        assert_eq!(d.take_next(), Some(vec![2; 3]));
        assert!(d.done());
        assert!(d.next_slice(false).is_none(), "nothing more to read");
        assert!(!d.reading());
    }

    #[test]
    fn reads_for_a_window_are_no_longer_than_it() {
        let mut d = download(0, 3 * SLICE);
        assert!(d.next_read(0).is_none(), "a closed window reads nothing");
        assert!(d.unread() && d.ahead() == 0);
        let (at, len, _) = d.next_read(1000).expect("first");
        assert_eq!((at, len), (0, 1000));
        let (at, len, _) = d.next_read(10 * SLICE as usize).expect("second");
        assert_eq!((at, len), (1000, SLICE as usize), "a slice at most");
        assert_eq!(d.ahead(), 1000 + SLICE);
        assert!(d.next_read(1).is_none(), "two reads in flight");
        assert!(d.arrived(0, vec![1; 1000]));
        assert_eq!(d.take_next().map(|b| b.len()), Some(1000));
        assert_eq!(d.ahead(), SLICE);
    }

    #[test]
    fn a_failed_read_is_reported_and_buffers_are_recycled() {
        let mut d = download(0, 2 * SLICE);
        let (at, _, buf) = d.next_slice(false).expect("first");
        assert!(!d.arrived(at, Vec::new()), "no bytes: the file shrank or failed");
        d.recycle(buf);
        let (_, _, again) = d.next_slice(false).expect("second");
        assert!(again.capacity() >= SLICE as usize && again.is_empty());
        d.recycle(Vec::with_capacity(16));
        assert!(d.spare.is_none(), "a small buffer is not kept");
    }
}
