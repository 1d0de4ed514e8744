//! A file body's read-ahead ([`Download`]): which 64 KiB slices to ask the pool for, only
//! while the client keeps up, and which read slice goes out next. An HTTP/1.1 download
//! (`h1_sink.rs`) also sends a plain sized body with `sendfile(2)` and keeps only its
//! progress here; an HTTP/2 download keeps the same state in its exchange (`h2.rs`,
//! `Produce::Download`), reads only as much as its stream may send
//! ([`Download::next_read`], asked with the stream's window) and never uses `sendfile`.
//!
//! Socket-free: this file must not touch a connection, write HTTP framing or know a route.

use std::sync::Arc;

/// State of one download: the pool reads the next slices only while the
/// client keeps up (back pressure: a slow reader pauses the disk; a download
/// holds at most `READS_AHEAD` slices, 128 KiB, counting the one being written).
pub struct Download {
    pub(crate) file: Arc<std::fs::File>,
    /// Next byte to append to the output.
    pub(crate) sent: u64,
    /// Next byte to ask the pool for.
    next_read: u64,
    /// One past the last byte to send.
    pub(crate) end: u64,
    /// Reads on the pool.
    in_flight: usize,
    /// Slices read and not yet in the output (they may complete out of order).
    ready: Vec<(u64, Vec<u8>)>,
    /// A written slice's buffer, for the next read.
    spare: Option<Vec<u8>>,
    /// Sent with `sendfile(2)`, page cache to socket, no slices (`h1_sink.rs`).
    pub(crate) direct: bool,
    /// With `direct`: the file is advised to the kernel (`WILLNEED`) up to here.
    pub(crate) advised: u64,
}

impl Download {
    /// `len` bytes of `file` from `offset`; `direct`: sent with `sendfile(2)`.
    pub(crate) fn new(file: Arc<std::fs::File>, offset: u64, len: u64, direct: bool) -> Download {
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
    pub(crate) fn next_slice(&mut self, writing: bool) -> Option<(u64, usize, Vec<u8>)> {
        self.read(usize::from(writing), SLICE as usize)
    }

    /// The next read of at most `max` bytes (an HTTP/2 stream's window), while fewer
    /// than [`READS_AHEAD`] reads are in flight or read and not taken.
    pub(crate) fn next_read(&mut self, max: usize) -> Option<(u64, usize, Vec<u8>)> {
        self.read(0, max)
    }

    /// Bytes asked for and not yet taken: reads in flight and slices read.
    pub(crate) fn ahead(&self) -> u64 {
        self.next_read - self.sent
    }

    /// Bytes remain to be asked for.
    pub(crate) fn unread(&self) -> bool {
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
    pub(crate) fn arrived(&mut self, offset: u64, bytes: Vec<u8>) -> bool {
        self.in_flight = self.in_flight.saturating_sub(1);
        if bytes.is_empty() {
            return false;
        }
        self.ready.push((offset, bytes));
        true
    }

    /// The next slice in file order, if it has arrived: it is sent from now on.
    pub(crate) fn take_next(&mut self) -> Option<Vec<u8>> {
        let pos = self.ready.iter().position(|(o, _)| *o == self.sent)?;
        let (_, bytes) = self.ready.swap_remove(pos);
        self.sent += bytes.len() as u64;
        Some(bytes)
    }

    /// A written slice's buffer, kept for the next read when it is slice-sized.
    pub(crate) fn recycle(&mut self, mut spare: Vec<u8>) {
        if spare.capacity() >= SLICE as usize && spare.capacity() <= 2 * SLICE as usize {
            spare.clear();
            self.spare = Some(spare);
        }
    }

    /// The file being sent.
    pub(crate) fn file(&self) -> &Arc<std::fs::File> {
        &self.file
    }

    /// Reads are on the pool, or slices read and not yet taken: more comes
    /// without the client's help.
    pub(crate) fn reading(&self) -> bool {
        self.in_flight > 0 || !self.ready.is_empty()
    }

    /// Every byte is sent (or handed to the output).
    pub(crate) fn done(&self) -> bool {
        self.sent >= self.end
    }
}

/// Bytes read from disk per pool job: the contract's 64 KiB chunks.
const SLICE: u64 = super::SLICE as u64;
/// Reads kept in flight per download, so the disk read of the next slice
/// overlaps the socket write of this one. Measured on a 1 GiB loopback
/// download: one 64 KiB read at a time gave 0.73-0.76 GB/s, one 128 KiB read
/// 0.92-1.32 GB/s.
const READS_AHEAD: usize = 2;

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
