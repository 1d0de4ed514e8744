//! CPU lanes: a few threads below the event loop's priority for work that is
//! pure CPU and long: password hashing (~50 ms of argon2id each) on a lane
//! under `SCHED_IDLE` (or nice 19 where that is refused), per-response
//! compression on a lane at nice 10.
//!
//! Pool jobs hand such work to a lane and wait for it (they may block; the
//! event loop never does). When an event loop wakes it preempts lane threads
//! at once: a login storm costs logins per second and a compressing load
//! compressed pages per second, not `/health` latency. The pool threads stay
//! at the loop's priority, so database work and file reads keep their share
//! when the CPUs are busy.

use crossbeam_channel::{Receiver, Sender};

type Work = Box<dyn FnOnce() + Send>;

/// Low-priority threads for CPU-heavy work.
pub struct CpuLane {
    tx: Sender<Work>,
}

/// How far below the event loop a lane's threads run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Standing {
    /// `SCHED_IDLE` (nice 19 where refused): only what the loops leave.
    Idle,
    /// A nice value above the loop's 0: a share of the CPUs when contended, never starved.
    Nice(i32),
}

impl CpuLane {
    /// Start `threads` lane threads named `name-N` at `standing`; at a nice value, it returns
    /// once each has taken it (an idle thread may not run for a long time on a busy machine,
    /// so nothing waits for it). `on_idle` runs on a lane thread whenever it finds the queue
    /// empty after a piece of work (to release caches).
    pub fn start(name: &str, threads: usize, standing: Standing, on_idle: fn()) -> std::io::Result<CpuLane> {
        let (tx, rx): (Sender<Work>, Receiver<Work>) = crossbeam_channel::unbounded();
        let (placed, ready) = crossbeam_channel::unbounded::<()>();
        let threads = threads.max(1);
        for i in 0..threads {
            let rx = rx.clone();
            let placed = placed.clone();
            std::thread::Builder::new().name(format!("{name}-{i}")).spawn(move || {
                // Refused only by a seccomp filter: the lane then runs at the loop's priority.
                let _ = match standing {
                    Standing::Idle => {
                        crate::sys::idle_thread_policy().or_else(|_| crate::sys::lower_thread_priority(19))
                    }
                    Standing::Nice(n) => crate::sys::lower_thread_priority(n),
                };
                let _ = placed.send(());
                for work in rx.iter() {
                    // A panic ends this piece of work (its caller sees `None`), not the thread.
                    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work));
                    if rx.is_empty() {
                        on_idle();
                    }
                }
            })?;
        }
        drop(placed);
        // A thread that died before it said so ends the wait early (the sender is gone).
        for _ in 0..threads {
            if standing == Standing::Idle || ready.recv().is_err() {
                break;
            }
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
    fn start_returns_once_the_threads_took_their_standing() {
        let _lane = CpuLane::start("standing", 2, Standing::Nice(3), || {}).expect("lane");
        // Read at once, with no work run: each lane thread is already at nice 3.
        let nices: Vec<String> = std::fs::read_dir("/proc/self/task")
            .expect("tasks")
            .flatten()
            .filter_map(|t| std::fs::read_to_string(t.path().join("stat")).ok())
            .filter(|stat| stat.contains("(standing-"))
            .map(|stat| stat[stat.rfind(')').unwrap_or(0) + 1..].split_whitespace().nth(16).unwrap_or("").to_string())
            .collect();
        assert_eq!(nices, ["3", "3"]);
    }

    #[test]
    fn runs_work_and_survives_a_panic() {
        let lane = CpuLane::start("test", 1, Standing::Nice(1), || {}).expect("lane");
        assert_eq!(lane.run(|| 6 * 7), Some(42));
        assert_eq!(lane.run(|| -> u8 { panic!("boom") }), None);
        assert_eq!(lane.run(|| "still here"), Some("still here"));
    }
}
