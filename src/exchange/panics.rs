//! The panic boundary: app code that panics ends its own exchange, never the
//! worker.
//!
//! Every call from the worker (the loop and its pool threads) into `app/`
//! goes through [`guard`]. It runs the call under `catch_unwind`; a panic
//! becomes a [`Panicked`] the caller turns into the right end for that
//! exchange (a 500, an ended stream, a WebSocket close 1011, a dropped
//! subscriber), and one `log::error!` line naming the place and the message.
//!
//! The hook records each panic's message and location per thread. Inside a
//! guard it only records (the guard writes the one log line); a panic
//! anywhere else (worker code itself) is logged by the hook as before.

use std::cell::{Cell, RefCell};
use std::panic::{catch_unwind, AssertUnwindSafe};

thread_local! {
    static LAST: RefCell<String> = const { RefCell::new(String::new()) };
    /// Guards this thread is inside (they may nest).
    static DEPTH: Cell<u32> = const { Cell::new(0) };
}

/// Install the hook (once per process).
pub fn install_hook() {
    std::panic::set_hook(Box::new(|info| {
        let msg = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "panic".to_string());
        let at = info.location().map(|l| format!("{}:{}", l.file(), l.line())).unwrap_or_default();
        let text = format!("{msg} at {at}");
        if DEPTH.with(Cell::get) == 0 {
            log::error!("panicked: {text}");
        }
        LAST.with(|l| *l.borrow_mut() = text);
    }));
}

/// The message of this thread's last panic.
fn take_last() -> String {
    LAST.with(|l| std::mem::take(&mut *l.borrow_mut()))
}

/// App code panicked inside a [`guard`].
#[derive(Debug)]
pub struct Panicked {
    /// Where (the guard's `what`).
    pub what: &'static str,
    /// The panic message and its location.
    pub message: String,
}

impl Panicked {
    /// The error for a response that has not started: a 500 whose `stack`
    /// (development only) is the message.
    pub fn into_error(self) -> crate::error::Error {
        crate::error::Error::Internal(format!("{} panicked: {}", self.what, self.message))
    }

    /// The 500 envelope for an exchange whose response has not started.
    pub fn into_response(self, development: bool) -> crate::http::response::Response {
        self.into_error().into_response(development)
    }
}

/// Run `f` (app code) behind the panic boundary. A panic is logged once,
/// naming `what`, and returned as [`Panicked`]; the caller ends the affected
/// exchange only. Inlined: it wraps every request's handler call.
#[inline]
pub fn guard<T>(what: &'static str, f: impl FnOnce() -> T) -> Result<T, Panicked> {
    struct Depth;
    impl Drop for Depth {
        fn drop(&mut self) {
            DEPTH.with(|d| d.set(d.get() - 1));
        }
    }
    DEPTH.with(|d| d.set(d.get() + 1));
    let depth = Depth;
    let result = catch_unwind(AssertUnwindSafe(f));
    drop(depth);
    result.map_err(|_| {
        let message = take_last();
        log::error!("{what} panicked: {message}");
        Panicked { what, message }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_an_error_and_the_depth_is_restored() {
        assert_eq!(guard("ok", || 7).unwrap(), 7);
        let p = guard("unit test", || -> u8 { panic!("boom") }).unwrap_err();
        assert_eq!(p.what, "unit test");
        let nested = guard("outer", || guard("inner", || -> u8 { panic!("deep") }).is_err()).unwrap();
        assert!(nested);
        assert_eq!(DEPTH.with(Cell::get), 0);
    }
}
