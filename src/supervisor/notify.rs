//! systemd's notify protocol (`sd_notify`): `READY=1`, `STOPPING=1`,
//! `STATUS=…` and `WATCHDOG=1` datagrams to `$NOTIFY_SOCKET`, when set.
//! Without systemd every call is a no-op.

use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::time::Duration;

/// A handle on `$NOTIFY_SOCKET`.
pub struct Notifier {
    target: Option<(UnixDatagram, SocketAddr)>,
    /// Half of `$WATCHDOG_USEC`: how often to send `WATCHDOG=1`.
    pub watchdog_every: Option<Duration>,
}

impl Notifier {
    /// Read `$NOTIFY_SOCKET` and `$WATCHDOG_USEC`.
    pub fn from_env() -> Notifier {
        let target = std::env::var("NOTIFY_SOCKET").ok().and_then(|path| {
            let addr = if let Some(name) = path.strip_prefix('@') {
                use std::os::linux::net::SocketAddrExt;
                SocketAddr::from_abstract_name(name.as_bytes()).ok()?
            } else {
                SocketAddr::from_pathname(&path).ok()?
            };
            Some((UnixDatagram::unbound().ok()?, addr))
        });
        let watchdog_every = std::env::var("WATCHDOG_USEC")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .filter(|us| *us > 0)
            .map(|us| Duration::from_micros(us / 2));
        Notifier { target, watchdog_every }
    }

    /// Send one state string, e.g. `"READY=1\nSTATUS=serving"`.
    pub fn send(&self, state: &str) {
        if let Some((sock, addr)) = &self.target {
            if let Err(e) = sock.send_to_addr(state.as_bytes(), addr) {
                log::warn!("sd_notify: {e}");
            }
        }
    }
}
