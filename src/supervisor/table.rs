//! The process table: every worker process the supervisor has forked and
//! not yet reaped, and what the supervisor expects of it.

use std::time::Instant;

/// What the supervisor wants from a worker process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Serving its slot; replaced if it dies.
    Serving,
    /// Told to drain (stop, memory ceiling, fewer workers); not replaced.
    Draining,
}

/// One live worker process.
#[derive(Debug)]
pub struct Proc {
    /// Process id.
    pub pid: i32,
    /// The slot (listening socket) it serves.
    pub slot: usize,
    /// Its record in shared memory.
    pub record: usize,
    /// Serving or draining.
    pub role: Role,
    /// When it was forked.
    pub started: Instant,
    /// When the supervisor kills it if it still runs (set when draining).
    pub kill_at: Option<Instant>,
}

/// All live worker processes.
#[derive(Default)]
pub struct Table {
    procs: Vec<Proc>,
}

impl Table {
    /// Record a new process.
    pub fn add(&mut self, p: Proc) {
        self.procs.push(p);
    }

    /// Remove and return the process `pid`.
    pub fn remove(&mut self, pid: i32) -> Option<Proc> {
        let i = self.procs.iter().position(|p| p.pid == pid)?;
        Some(self.procs.swap_remove(i))
    }

    /// Every live process.
    pub fn iter(&self) -> impl Iterator<Item = &Proc> {
        self.procs.iter()
    }

    /// Every live process, mutably.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut Proc> {
        self.procs.iter_mut()
    }

    /// No process left.
    pub fn is_empty(&self) -> bool {
        self.procs.is_empty()
    }

    /// Processes serving `slot`.
    pub fn serving(&self, slot: usize) -> impl Iterator<Item = &Proc> {
        self.procs.iter().filter(move |p| p.slot == slot && p.role == Role::Serving)
    }
}
