//! A file body over HTTP/3 ([`FileBody`]): read from disk on the pool no faster than its stream
//! takes it.
//!
//! quinn takes a stream's bytes up to the client's flow-control credit for that stream (and
//! the connection's send window) and does not say how much credit is left. So the next slice
//! is asked for only once the stream's queue is empty (quinn took all so far), one read at a
//! time, and its size follows what the stream took: it starts at [`MIN_SLICE`], doubles up
//! to [`MAX_SLICE`] while the stream takes each slice whole, and halves when it did not. A
//! stalled stream then holds at most the rest of one slice beside
//! what quinn holds within the client's window; one stalled from its start (a client that
//! keeps its window near zero) holds no more than the smallest slice, or only its head. A
//! stream that takes everything still overlaps the next disk read with quinn sending what it
//! holds. HTTP/1.1 and HTTP/2 read ahead by `download::Download`'s rule instead.
//!
//! This file must not write frames, touch quinn or the pool.

use std::sync::Arc;

/// The first read, and the smallest.
pub(crate) const MIN_SLICE: usize = 4 * 1024;
/// The largest read: the slice of every protocol.
pub(crate) const MAX_SLICE: usize = super::SLICE;

/// A byte range of a file being sent on one stream.
pub(crate) struct FileBody {
    file: Arc<std::fs::File>,
    /// The next byte to ask the pool for.
    next: u64,
    /// One past the last byte to send.
    end: u64,
    /// A read is on the pool.
    reading: bool,
    /// A slice that arrived and is not yet in the stream's queue.
    ready: Option<Vec<u8>>,
    /// The length of the next read.
    size: usize,
}

impl FileBody {
    /// `len` bytes of `file` from `offset`.
    pub(crate) fn new(file: Arc<std::fs::File>, offset: u64, len: u64) -> FileBody {
        FileBody { file, next: offset, end: offset.saturating_add(len), reading: false, ready: None, size: MIN_SLICE }
    }

    /// The next read for the pool (offset, length, a buffer), when the stream's queue is empty
    /// (the caller's to check) and no slice is on the pool or waiting.
    pub(crate) fn next_read(&mut self) -> Option<(u64, usize, Vec<u8>)> {
        if self.reading || self.ready.is_some() || self.next >= self.end {
            return None;
        }
        let len = (self.end - self.next).min(self.size as u64) as usize;
        self.reading = true;
        Some((self.next, len, Vec::with_capacity(len)))
    }

    /// The read at `offset` completed with `bytes`. `false`: it failed or the file shrank (no
    /// bytes), so the promised length cannot be sent.
    pub(crate) fn arrived(&mut self, offset: u64, bytes: Vec<u8>) -> bool {
        self.reading = false;
        if bytes.is_empty() || offset != self.next {
            return false;
        }
        self.next += bytes.len() as u64;
        self.ready = Some(bytes);
        true
    }

    /// The slice that arrived, to queue on the stream.
    pub(crate) fn take(&mut self) -> Option<Vec<u8>> {
        self.ready.take()
    }

    /// How the stream took the slice just queued: `whole` (its queue is empty again), so the
    /// next may be twice as large; or not, so the next is half as large.
    pub(crate) fn taken(&mut self, whole: bool) {
        self.size = if whole { (self.size * 2).min(MAX_SLICE) } else { (self.size / 2).max(MIN_SLICE) };
    }

    /// A read is on the pool, or arrived and waits for the stream.
    pub(crate) fn reading(&self) -> bool {
        self.reading || self.ready.is_some()
    }

    /// Bytes are left to ask the pool for.
    pub(crate) fn unread(&self) -> bool {
        self.next < self.end
    }

    /// The file being sent.
    pub(crate) fn file(&self) -> &Arc<std::fs::File> {
        &self.file
    }

    /// Every byte was read and handed to the stream.
    pub(crate) fn done(&self) -> bool {
        self.next >= self.end && !self.reading && self.ready.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(len: u64) -> FileBody {
        let file = tempfile::tempfile().expect("a temporary file");
        FileBody::new(Arc::new(file), 10, len)
    }

    #[test]
    fn one_read_at_a_time_growing_while_the_stream_keeps_up() {
        let mut b = body(300 * 1024);
        let (at, len, _) = b.next_read().expect("a first read");
        assert_eq!((at, len), (10, MIN_SLICE));
        assert!(b.next_read().is_none(), "one read at a time");
        assert!(b.arrived(at, vec![1; len]));
        assert!(b.next_read().is_none(), "not before the slice is queued");
        assert_eq!(b.take().map(|s| s.len()), Some(MIN_SLICE));
        let mut sizes = Vec::new();
        b.taken(true);
        while let Some((at, len, _)) = b.next_read() {
            sizes.push(len);
            assert!(b.arrived(at, vec![1; len]));
            b.take();
            b.taken(true);
        }
        assert_eq!(sizes[..5], [8192, 16384, 32768, 65536, 65536]);
        assert_eq!(sizes.iter().sum::<usize>() + MIN_SLICE, 300 * 1024, "every byte, once");
        assert!(b.done());
    }

    #[test]
    fn a_stream_that_stalls_gets_smaller_slices() {
        let mut b = body(1 << 20);
        for _ in 0..5 {
            let (at, len, _) = b.next_read().expect("a read");
            assert!(b.arrived(at, vec![0; len]));
            b.take();
            b.taken(true);
        }
        assert_eq!(b.next_read().map(|r| r.1), Some(MAX_SLICE));
        assert!(b.arrived(b.next, vec![0; MAX_SLICE]));
        b.take();
        b.taken(false);
        assert_eq!(b.next_read().map(|r| r.1), Some(MAX_SLICE / 2), "after a slice that did not go whole");
        assert!(b.arrived(b.next, vec![0; MAX_SLICE / 2]));
        for _ in 0..8 {
            b.take();
            b.taken(false);
        }
        assert_eq!(b.size, MIN_SLICE, "never below the smallest");
    }

    #[test]
    fn a_failed_or_misplaced_read_ends_the_body() {
        let mut b = body(100);
        let (at, _, _) = b.next_read().expect("a read");
        assert!(!b.arrived(at, Vec::new()), "no bytes: the file shrank or the read failed");
        let (at, _, _) = b.next_read().expect("asked again");
        assert!(!b.arrived(at + 1, vec![0; 10]), "not the slice asked for");
    }
}
