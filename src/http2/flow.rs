//! HTTP/2 flow-control windows (RFC 9113 §5.2, §6.9), the arithmetic only: [`SendWindow`]
//! is what the peer lets us send (on a stream or the connection), [`RecvWindow`] what we let
//! the peer send and when to grant it more.
//!
//! Nothing here reads or writes frames: the connection state machine turns WINDOW_UPDATE and
//! SETTINGS_INITIAL_WINDOW_SIZE into calls and the results into frames or errors.

use super::wire::{Reason, MAX_WINDOW};

/// The peer's credit for our DATA. It may go negative when the peer lowers
/// SETTINGS_INITIAL_WINDOW_SIZE below what is in flight (RFC 9113 §6.9.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendWindow(i64);

impl SendWindow {
    /// A window of `initial` bytes.
    pub fn new(initial: u32) -> SendWindow {
        SendWindow(i64::from(initial.min(MAX_WINDOW)))
    }

    /// How many bytes may be sent now.
    pub fn available(&self) -> usize {
        usize::try_from(self.0).unwrap_or(0)
    }

    /// A WINDOW_UPDATE's increment: above 2^31 - 1 in total is FLOW_CONTROL_ERROR (a
    /// stream error on a stream, a connection error on the connection); an increment of 0
    /// is PROTOCOL_ERROR the same way (RFC 9113 §6.9).
    pub fn grant(&mut self, increment: u32) -> Result<(), Reason> {
        if increment == 0 {
            return Err(Reason::PROTOCOL_ERROR);
        }
        self.shift(i64::from(increment))
    }

    /// SETTINGS_INITIAL_WINDOW_SIZE changed from `old` to `new`: every stream window moves
    /// by the difference; above 2^31 - 1 is a FLOW_CONTROL_ERROR on the connection.
    pub fn resize(&mut self, old: u32, new: u32) -> Result<(), Reason> {
        self.shift(i64::from(new) - i64::from(old))
    }

    /// `n` bytes of DATA were sent; the caller sends at most [`SendWindow::available`].
    pub fn spend(&mut self, n: usize) {
        self.0 -= i64::try_from(n).unwrap_or(i64::MAX);
    }

    fn shift(&mut self, delta: i64) -> Result<(), Reason> {
        let next = self.0 + delta;
        if next > i64::from(MAX_WINDOW) {
            return Err(Reason::FLOW_CONTROL_ERROR);
        }
        self.0 = next;
        Ok(())
    }
}

/// Our credit for the peer's DATA: what the peer may still send, and what the application
/// consumed but we have not yet granted back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecvWindow {
    /// What the peer may still send.
    open: u32,
    /// The window we keep the peer at.
    target: u32,
    /// Consumed and not yet granted back.
    owed: u32,
}

impl RecvWindow {
    /// A window the peer starts at, and keeps being topped up to, `target` bytes.
    pub fn new(target: u32) -> RecvWindow {
        let target = target.min(MAX_WINDOW);
        RecvWindow { open: target, target, owed: 0 }
    }

    /// A DATA frame of `flow_len` bytes (padding included) arrived: more than the window is
    /// FLOW_CONTROL_ERROR (RFC 9113 §6.9.1).
    pub fn receive(&mut self, flow_len: usize) -> Result<(), Reason> {
        let n = u32::try_from(flow_len).map_err(|_| Reason::FLOW_CONTROL_ERROR)?;
        self.open = self.open.checked_sub(n).ok_or(Reason::FLOW_CONTROL_ERROR)?;
        Ok(())
    }

    /// `n` received bytes were consumed (or dropped): the increment to send now, once half
    /// the target is owed, so WINDOW_UPDATEs stay few.
    pub fn release(&mut self, n: usize) -> Option<u32> {
        let n = u32::try_from(n).unwrap_or(u32::MAX);
        self.owed = self.owed.saturating_add(n).min(self.target - self.open);
        if self.owed == 0 || self.owed < self.target / 2 {
            return None;
        }
        let increment = self.owed;
        self.open += increment;
        self.owed = 0;
        Some(increment)
    }

    /// What the peer may still send.
    pub fn open(&self) -> u32 {
        self.open
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn send_window_spends_grants_and_overflows() {
        let mut w = SendWindow::new(65_535);
        w.spend(65_000);
        assert_eq!(w.available(), 535);
        assert_eq!(w.grant(1000), Ok(()));
        assert_eq!(w.available(), 1535);
        assert_eq!(w.grant(0), Err(Reason::PROTOCOL_ERROR));
        assert_eq!(w.grant(MAX_WINDOW), Err(Reason::FLOW_CONTROL_ERROR), "past 2^31 - 1");
        assert_eq!(w.available(), 1535, "a refused grant changes nothing");
        let mut full = SendWindow::new(MAX_WINDOW);
        assert_eq!(full.grant(1), Err(Reason::FLOW_CONTROL_ERROR));
    }

    /// Lowering SETTINGS_INITIAL_WINDOW_SIZE below what is in flight leaves the window
    /// negative: nothing may be sent until grants bring it above 0 (RFC 9113 §6.9.2).
    #[test]
    fn send_window_follows_initial_window_changes() {
        let mut w = SendWindow::new(65_535);
        w.spend(60_000);
        assert_eq!(w.resize(65_535, 1_000), Ok(()));
        assert_eq!(w.available(), 0);
        assert_eq!(w.grant(58_000), Ok(()));
        assert_eq!(w.available(), 0, "still 1 000 below 0");
        assert_eq!(w.grant(1_000), Ok(()));
        assert_eq!(w.available(), 0, "exactly back at 0");
        assert_eq!(w.grant(10), Ok(()));
        assert_eq!(w.available(), 10);
        assert_eq!(w.grant(1_000), Ok(()));
        assert_eq!(w.resize(1_000, MAX_WINDOW), Err(Reason::FLOW_CONTROL_ERROR), "1 010 in credit + 2^31 - 1 - 1 000");
    }

    #[test]
    fn recv_window_refuses_overruns_and_grants_back_in_halves() {
        let mut w = RecvWindow::new(1_000);
        assert_eq!(w.receive(400), Ok(()));
        assert_eq!(w.release(400), None, "under half the target owed");
        assert_eq!(w.receive(600), Ok(()));
        assert_eq!(w.receive(1), Err(Reason::FLOW_CONTROL_ERROR), "past the window");
        assert_eq!(w.release(100), Some(500));
        assert_eq!(w.open(), 500);
        assert_eq!(w.release(10_000), Some(500), "never more than was received");
        assert_eq!(w.open(), 1_000);
        assert_eq!(w.release(1), None);
    }
}
