//! Signal delivery as counters plus a wake-up byte.
//!
//! The handler only increments an atomic counter and writes one byte to a
//! non-blocking socket, both async-signal-safe. The owning loop polls the
//! read end, then takes the counters. Counting (instead of a flag) lets a
//! loop see that TERM arrived twice between two turns.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

pub use signal_hook::SigId;

/// Counters for a set of signals and the read end of their wake-up socket.
pub struct SignalSet {
    counters: Vec<(i32, Arc<AtomicUsize>)>,
    ids: Vec<SigId>,
    reader: mio::net::UnixStream,
}

impl SignalSet {
    /// Install handlers for `signals`.
    pub fn install(signals: &[i32]) -> io::Result<SignalSet> {
        let (reader, writer) = std::os::unix::net::UnixStream::pair()?;
        reader.set_nonblocking(true)?;
        writer.set_nonblocking(true)?;
        let reader = mio::net::UnixStream::from_std(reader);
        let mut counters = Vec::new();
        let mut ids = Vec::new();
        for &sig in signals {
            let counter = Arc::new(AtomicUsize::new(0));
            let c = Arc::clone(&counter);
            // SAFETY: the action only performs an atomic increment, which is
            // async-signal-safe; it allocates nothing and takes no lock.
            let id = unsafe {
                signal_hook::low_level::register(sig, move || {
                    c.fetch_add(1, Ordering::SeqCst);
                })
            }?;
            ids.push(id);
            ids.push(signal_hook::low_level::pipe::register(sig, writer.try_clone()?)?);
            counters.push((sig, counter));
        }
        Ok(SignalSet { counters, ids, reader })
    }

    /// The read end, to register with a `mio::Poll`.
    pub fn source(&mut self) -> &mut mio::net::UnixStream {
        &mut self.reader
    }

    /// The read end's descriptor.
    pub fn fd(&self) -> RawFd {
        self.reader.as_raw_fd()
    }

    /// Empty the wake-up socket and return how often `sig` fired since the last call.
    pub fn take(&mut self, sig: i32) -> usize {
        self.counters.iter().find(|(s, _)| *s == sig).map(|(_, c)| c.swap(0, Ordering::SeqCst)).unwrap_or(0)
    }

    /// Drain the wake-up bytes (call after a readable event).
    pub fn drain(&mut self) {
        use std::io::Read;
        let mut buf = [0u8; 64];
        while let Ok(n) = self.reader.read(&mut buf) {
            if n == 0 {
                break;
            }
        }
    }

    /// Remove the handlers (used in a freshly forked child, which installs its own).
    pub fn uninstall(&mut self) {
        for id in self.ids.drain(..) {
            signal_hook::low_level::unregister(id);
        }
    }
}

/// Ignore `sig` in this process from now on (by registering an action that does nothing).
pub fn ignore(sig: i32) -> io::Result<SigId> {
    // SAFETY: the action does nothing, which is trivially async-signal-safe.
    unsafe { signal_hook::low_level::register(sig, || {}) }
}
