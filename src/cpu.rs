//! The CPU lane: a few threads at the lowest scheduling priority for work
//! that is pure CPU and long (password hashing: ~50 ms of argon2id each).
//!
//! Pool jobs hand such work to the lane and wait for it (they may block; the
//! event loop never does). Lane threads run under `SCHED_IDLE` (or nice 19
//! where that is refused), so when an event loop wakes it preempts them at
//! once: a login storm costs logins per second, not `/health` latency. The
//! pool threads run at nice 10 (below the loop, never starved like the lane),
//! so database work progresses when the CPUs are busy.

use crossbeam_channel::{Receiver, Sender};

type Work = Box<dyn FnOnce() + Send>;

/// Low-priority threads for CPU-heavy work.
pub struct CpuLane {
    tx: Sender<Work>,
}

impl CpuLane {
    /// Start `threads` lane threads; `on_idle` runs on a lane thread whenever
    /// it finds the queue empty after a piece of work (to release caches).
    pub fn start(threads: usize, on_idle: fn()) -> std::io::Result<CpuLane> {
        let (tx, rx): (Sender<Work>, Receiver<Work>) = crossbeam_channel::unbounded();
        for i in 0..threads.max(1) {
            let rx = rx.clone();
            std::thread::Builder::new().name(format!("cpu-{i}")).spawn(move || {
                if crate::sys::idle_thread_policy().is_err() {
                    let _ = crate::sys::lower_thread_priority(19);
                }
                for work in rx.iter() {
                    // A panic ends this piece of work (its caller sees `None`), not the thread.
                    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work));
                    if rx.is_empty() {
                        on_idle();
                    }
                }
            })?;
        }
        Ok(CpuLane { tx })
    }

    /// Run `f` on the lane and wait for its result; `None` if it panicked.
    pub fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
        let (done, result) = crossbeam_channel::bounded(1);
        self.tx
            .send(Box::new(move || {
                let _ = done.send(f());
            }))
            .ok()?;
        result.recv().ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_work_and_survives_a_panic() {
        let lane = CpuLane::start(1, || {}).expect("lane");
        assert_eq!(lane.run(|| 6 * 7), Some(42));
        assert_eq!(lane.run(|| -> u8 { panic!("boom") }), None);
        assert_eq!(lane.run(|| "still here"), Some("still here"));
    }
}
