//! Panic capture: a panicking handler becomes a 500, not a dead worker.
//!
//! The hook logs the panic with its location (instead of printing to
//! stderr) and keeps the message per thread, so the code that caught the
//! unwind can put it in the error's `stack` (development only).

use std::cell::RefCell;

thread_local! {
    static LAST: RefCell<String> = const { RefCell::new(String::new()) };
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
        let text = format!("panicked: {msg} at {at}");
        log::error!("{text}");
        LAST.with(|l| *l.borrow_mut() = text);
    }));
}

/// The message of this thread's last panic.
pub fn take_last() -> String {
    LAST.with(|l| std::mem::take(&mut *l.borrow_mut()))
}
