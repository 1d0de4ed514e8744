//! An in-memory duplex for the `h2` crate's client, no socket: the tests
//! drive [`super::H2Conn`] with h2's client over it.
//!
//! The test copies bytes from the server into the input buffer
//! ([`Io::feed`]) and moves the output buffer to the server
//! ([`Io::write_output`], [`Io::drain_output`]). h2 sees an
//! `AsyncRead + AsyncWrite` that is `Pending` when the input is empty (more
//! will come with the next shuttle) and when the output holds more than its
//! cap. Wakers are never stored: the caller re-polls every time.

use std::cell::RefCell;
use std::io::{self, Write};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Both buffers of one connection.
struct Buffers {
    /// Bytes received from the peer, not yet read by h2.
    input: BytesMut,
    /// The peer closed its side: reads return 0 bytes once `input` is empty.
    eof: bool,
    /// Bytes h2 wrote, not yet taken by the caller.
    output: Vec<u8>,
    /// Writes are refused (`Pending`) while `output` holds at least this much.
    output_cap: usize,
    /// h2 shut its write side down (it has nothing more to send).
    shutdown: bool,
}

/// A shared handle on a connection's input and output buffers.
///
/// One clone is owned by h2 (as its transport), the other by the codec that
/// fills and drains it; everything runs on one thread, so the buffers live
/// in an `Rc<RefCell<_>>`. h2 only touches them from inside a poll, never
/// while the caller holds a borrow.
#[derive(Clone)]
pub struct Io {
    inner: Rc<RefCell<Buffers>>,
}

impl Io {
    /// Empty buffers; writes pause while the output holds `output_cap` bytes
    /// or more.
    pub fn new(output_cap: usize) -> Io {
        let buffers = Buffers {
            input: BytesMut::new(),
            eof: false,
            output: Vec::new(),
            output_cap: output_cap.max(1),
            shutdown: false,
        };
        Io { inner: Rc::new(RefCell::new(buffers)) }
    }

    /// Append bytes received from the peer.
    pub fn feed(&self, bytes: &[u8]) {
        self.inner.borrow_mut().input.extend_from_slice(bytes);
    }

    /// The peer closed its write side (read returned 0).
    pub fn feed_eof(&self) {
        self.inner.borrow_mut().eof = true;
    }

    /// Received bytes h2 has not read yet. The caller stops reading the
    /// socket while this is large (h2 stops reading while its output is
    /// full).
    pub fn input_len(&self) -> usize {
        self.inner.borrow().input.len()
    }

    /// Bytes waiting to be written to the peer.
    pub fn output_len(&self) -> usize {
        self.inner.borrow().output.len()
    }

    /// The output cap: at or above it, h2's writes are `Pending`.
    pub fn output_cap(&self) -> usize {
        self.inner.borrow().output_cap
    }

    /// h2 shut its write side down: once the output is drained, nothing
    /// more will come.
    pub fn is_shutdown(&self) -> bool {
        self.inner.borrow().shutdown
    }

    /// Move every pending output byte to the end of `out`. An empty `out`
    /// trades buffers with the output instead (no copy; the output goes on
    /// in `out`'s old allocation).
    pub fn drain_output(&self, out: &mut Vec<u8>) {
        let mut b = self.inner.borrow_mut();
        if out.is_empty() {
            std::mem::swap(out, &mut b.output);
        } else {
            out.extend_from_slice(&b.output);
            b.output.clear();
        }
    }

    /// Write pending output to `w` until it is empty or `w` would block;
    /// what was written is consumed. Returns the number of bytes written.
    /// `WouldBlock` is not an error here (the rest stays queued).
    pub fn write_output<W: Write>(&self, w: &mut W) -> io::Result<usize> {
        let mut b = self.inner.borrow_mut();
        let mut total = 0;
        while !b.output.is_empty() {
            match w.write(&b.output) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    b.output.drain(..n);
                    total += n;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(total)
    }
}

impl AsyncRead for Io {
    fn poll_read(self: Pin<&mut Self>, _cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let b = &mut *self.inner.borrow_mut();
        if b.input.is_empty() {
            // Ready with nothing filled is EOF to the reader.
            return if b.eof { Poll::Ready(Ok(())) } else { Poll::Pending };
        }
        let n = b.input.len().min(buf.remaining());
        buf.put_slice(&b.input[..n]);
        b.input.advance(n);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Io {
    fn poll_write(self: Pin<&mut Self>, _cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        let mut b = self.inner.borrow_mut();
        if b.output.len() >= b.output_cap {
            return Poll::Pending;
        }
        // Take at most what fits under the cap: the output never grows past
        // it, whatever h2 has queued.
        let n = data.len().min(b.output_cap - b.output.len());
        b.output.extend_from_slice(&data[..n]);
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // Everything written is already queued for the caller.
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.inner.borrow_mut().shutdown = true;
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cx() -> Context<'static> {
        Context::from_waker(std::task::Waker::noop())
    }

    #[test]
    fn reads_are_pending_until_fed_then_eof() {
        let io = Io::new(16);
        let mut mem = [0u8; 8];
        let mut reader = io.clone();
        let mut buf = ReadBuf::new(&mut mem);
        assert!(Pin::new(&mut reader).poll_read(&mut cx(), &mut buf).is_pending());
        io.feed(b"hello world");
        assert!(Pin::new(&mut reader).poll_read(&mut cx(), &mut buf).is_ready());
        assert_eq!(buf.filled(), b"hello wo");
        assert_eq!(io.input_len(), 3);
        io.feed_eof();
        let mut mem = [0u8; 8];
        let mut buf = ReadBuf::new(&mut mem);
        assert!(Pin::new(&mut reader).poll_read(&mut cx(), &mut buf).is_ready());
        assert_eq!(buf.filled(), b"rld");
        let mut buf = ReadBuf::new(&mut mem);
        assert!(matches!(Pin::new(&mut reader).poll_read(&mut cx(), &mut buf), Poll::Ready(Ok(()))));
        assert!(buf.filled().is_empty());
    }

    #[test]
    fn writes_stop_at_the_cap_until_drained() {
        let io = Io::new(10);
        let mut writer = io.clone();
        assert!(matches!(Pin::new(&mut writer).poll_write(&mut cx(), &[1; 8]), Poll::Ready(Ok(8))));
        assert!(matches!(Pin::new(&mut writer).poll_write(&mut cx(), &[2; 8]), Poll::Ready(Ok(2))));
        assert!(Pin::new(&mut writer).poll_write(&mut cx(), &[3; 8]).is_pending());
        let mut out = Vec::new();
        io.drain_output(&mut out);
        assert_eq!(out.len(), 10);
        assert!(matches!(Pin::new(&mut writer).poll_write(&mut cx(), &[3; 8]), Poll::Ready(Ok(8))));
        let mut sink = Vec::new();
        assert_eq!(io.write_output(&mut sink).expect("vec write"), 8);
        assert_eq!(io.output_len(), 0);
    }

    #[test]
    fn draining_appends_whether_or_not_the_target_is_empty() {
        let io = Io::new(64);
        let mut writer = io.clone();
        assert!(matches!(Pin::new(&mut writer).poll_write(&mut cx(), b"abc"), Poll::Ready(Ok(3))));
        let mut out = Vec::new();
        io.drain_output(&mut out);
        assert_eq!(out, b"abc");
        assert_eq!(io.output_len(), 0);
        assert!(matches!(Pin::new(&mut writer).poll_write(&mut cx(), b"def"), Poll::Ready(Ok(3))));
        io.drain_output(&mut out);
        assert_eq!(out, b"abcdef");
        assert_eq!(io.output_len(), 0);
    }
}
