//! The worker's free list of connection byte buffers.
//!
//! An HTTP/1.1 connection between requests, an event stream or a WebSocket
//! with nothing buffered holds no buffer of its own: its read buffer and its
//! output go back here when they are empty ([`Bufs::shed`]), and come back
//! from here when bytes arrive or a response is written ([`Bufs::take`]).
//! So 10 000 idle keep-alive connections hold nothing, and a busy one does
//! not allocate per request (nginx likewise frees an idle connection's
//! buffers in `ngx_http_set_keepalive`).
//!
//! It owns only the buffers it holds; it must not know a socket, a protocol
//! or a connection.

/// Capacity of a fresh buffer: a request head, a small response.
const FRESH: usize = 4 * 1024;
/// A buffer larger than this is freed, not kept (a burst's output).
const KEEP_MAX: usize = 64 * 1024;
/// At most this many buffers are kept (at most `KEEP * KEEP_MAX` bytes).
const KEEP: usize = 32;

/// Empty byte buffers ready for reuse.
#[derive(Default)]
pub(super) struct Bufs {
    free: Vec<Vec<u8>>,
}

impl Bufs {
    /// An empty buffer with some capacity: a kept one if there is one.
    pub(super) fn take(&mut self) -> Vec<u8> {
        self.free.pop().unwrap_or_else(|| Vec::with_capacity(FRESH))
    }

    /// Give `buf` a capacity if it has none (it was shed).
    pub(super) fn fill(&mut self, buf: &mut Vec<u8>) {
        if buf.capacity() == 0 {
            *buf = self.take();
        }
    }

    /// Keep `buf` for reuse (cleared), or free it when it is large or enough are kept.
    pub(super) fn give(&mut self, mut buf: Vec<u8>) {
        if buf.capacity() == 0 || buf.capacity() > KEEP_MAX || self.free.len() >= KEEP {
            return;
        }
        buf.clear();
        self.free.push(buf);
    }

    /// Take back whichever of a connection's buffers holds nothing: its read
    /// buffer when all of it is parsed, its output when all of it is written
    /// (the flush clears it then).
    pub(super) fn shed(&mut self, inbuf: &mut Vec<u8>, out: &mut Vec<u8>) {
        if inbuf.is_empty() && inbuf.capacity() > 0 {
            self.give(std::mem::take(inbuf));
        }
        if out.is_empty() && out.capacity() > 0 {
            self.give(std::mem::take(out));
        }
    }

    /// Buffers kept now.
    #[cfg(test)]
    fn kept(&self) -> usize {
        self.free.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_buffer_goes_back_and_is_reused() {
        let mut bufs = Bufs::default();
        let mut inbuf = bufs.take();
        let mut out = bufs.take();
        inbuf.extend_from_slice(b"GET / HTTP/1.1\r\n\r\n");
        out.extend_from_slice(b"HTTP/1.1 200 OK\r\n\r\n");
        let (in_ptr, out_ptr) = (inbuf.as_ptr(), out.as_ptr());
        // Input still unparsed and output not yet written: both stay.
        bufs.shed(&mut inbuf, &mut out);
        assert!(inbuf.capacity() > 0 && out.capacity() > 0);
        assert_eq!(bufs.kept(), 0);
        // All parsed and all written: the connection holds nothing.
        inbuf.clear();
        out.clear();
        bufs.shed(&mut inbuf, &mut out);
        assert_eq!((inbuf.capacity(), out.capacity()), (0, 0));
        assert_eq!(bufs.kept(), 2);
        // The next request gets them back, no allocation.
        bufs.fill(&mut inbuf);
        bufs.fill(&mut out);
        assert!(inbuf.is_empty() && out.is_empty());
        let mut got = [inbuf.as_ptr(), out.as_ptr()];
        let mut want = [in_ptr, out_ptr];
        got.sort();
        want.sort();
        assert_eq!(got, want);
        assert_eq!(bufs.kept(), 0);
    }

    #[test]
    fn large_buffers_are_freed_and_the_list_is_bounded() {
        let mut bufs = Bufs::default();
        bufs.give(Vec::with_capacity(KEEP_MAX + 1));
        assert_eq!(bufs.kept(), 0, "a burst's buffer is not kept");
        for _ in 0..KEEP + 5 {
            bufs.give(Vec::with_capacity(16));
        }
        assert_eq!(bufs.kept(), KEEP);
        // A buffer that has capacity keeps it.
        let mut b = Vec::with_capacity(8);
        let p = b.as_ptr();
        bufs.fill(&mut b);
        assert_eq!(b.as_ptr(), p);
    }
}
