//! The worker's thread pool: blocking or CPU-heavy jobs run here, never on
//! the event loop. Jobs go in over a crossbeam channel; results come back
//! over another, and a `mio::Waker` tells the loop to collect them.
//!
//! Jobs run behind the panic boundary (`panics::guard`): a job that panics
//! yields a 500 for its request, a replay that panics ends its stream; the
//! thread lives on.
//! The pool knows nothing of connections beyond the [`ExchangeId`] it
//! carries back.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crossbeam_channel::{Receiver, Sender};

use super::panics::guard;
use crate::app::Job;
use crate::error::Error;
use crate::http::response::Response;

/// What a pool thread runs.
pub enum Work {
    /// A handler's job: its result is the response.
    Request(Job),
    /// An SSE replay: the events' bytes and the last id.
    Replay(Box<dyn FnOnce() -> (Vec<u8>, i64) + Send>),
    /// Read `len` bytes of a file at `offset` (a download slice) into the
    /// given buffer (recycled by the download, so reads allocate nothing).
    Read(std::sync::Arc<std::fs::File>, u64, usize, Vec<u8>),
    /// Housekeeping that answers no exchange (the store's purge): nothing comes back.
    Chore(Box<dyn FnOnce() + Send>),
}

/// What comes back.
pub enum Completion {
    /// The response of a [`Work::Request`].
    Response(Result<Response, Error>),
    /// The result of a [`Work::Replay`]: the events' bytes and the last id
    /// ([`REPLAY_PANICKED`] when the replay panicked: ids are never negative).
    Replay(Vec<u8>, i64),
    /// The offset and bytes of a [`Work::Read`]; empty on an error or a short file.
    Chunk(u64, Vec<u8>),
}

/// The last id of a replay that panicked.
pub const REPLAY_PANICKED: i64 = -1;

pub use crate::http::exchange::ExchangeId;

struct Task {
    id: ExchangeId,
    work: Work,
}

/// A finished job.
pub struct Done {
    /// The exchange it was submitted for.
    pub id: ExchangeId,
    /// The job's result.
    pub result: Completion,
}

/// A fixed set of threads.
pub struct Pool {
    tx: Sender<Task>,
    done: Receiver<Done>,
    active: Arc<AtomicUsize>,
}

impl Pool {
    /// Start `threads` threads that wake `waker` after each job.
    pub fn new(threads: usize, waker: Arc<mio::Waker>) -> std::io::Result<Pool> {
        let (tx, rx) = crossbeam_channel::unbounded::<Task>();
        let (done_tx, done) = crossbeam_channel::unbounded::<Done>();
        let active = Arc::new(AtomicUsize::new(0));
        for i in 0..threads.max(1) {
            let rx = rx.clone();
            let done_tx = done_tx.clone();
            let waker = Arc::clone(&waker);
            let active = Arc::clone(&active);
            std::thread::Builder::new().name(format!("pool-{i}")).spawn(move || {
                for task in rx.iter() {
                    let result = match task.work {
                        Work::Request(job) => {
                            Completion::Response(guard("pool job", job).unwrap_or_else(|p| Err(p.into_error())))
                        }
                        Work::Read(file, offset, len, mut buf) => {
                            use std::os::unix::fs::FileExt;
                            buf.resize(len, 0);
                            match file.read_exact_at(&mut buf, offset) {
                                Ok(()) => Completion::Chunk(offset, buf),
                                Err(_) => Completion::Chunk(offset, Vec::new()),
                            }
                        }
                        Work::Replay(job) => {
                            let (bytes, last) = guard("SSE replay", job).unwrap_or((Vec::new(), REPLAY_PANICKED));
                            Completion::Replay(bytes, last)
                        }
                        Work::Chore(job) => {
                            // The hook logged a panic; there is no one to answer.
                            let _ = guard("pool chore", job);
                            active.fetch_sub(1, Ordering::AcqRel);
                            continue;
                        }
                    };
                    let _ = done_tx.send(Done { id: task.id, result });
                    active.fetch_sub(1, Ordering::AcqRel);
                    let _ = waker.wake();
                }
            })?;
        }
        Ok(Pool { tx, done, active })
    }

    /// Queue a job for exchange `id`.
    pub fn submit(&self, id: ExchangeId, work: Work) {
        self.active.fetch_add(1, Ordering::AcqRel);
        if self.tx.send(Task { id, work }).is_err() {
            self.active.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Queue housekeeping that answers no exchange ([`Work::Chore`]).
    pub fn chore(&self, job: Box<dyn FnOnce() + Send>) {
        // No exchange has this id (no slab index reaches usize::MAX); nothing is sent back for it.
        self.submit(ExchangeId::H1 { conn: usize::MAX, gen: 0 }, Work::Chore(job));
    }

    /// The results that are ready.
    pub fn completions(&self) -> crossbeam_channel::TryIter<'_, Done> {
        self.done.try_iter()
    }

    /// Jobs queued or running.
    pub fn active(&self) -> usize {
        self.active.load(Ordering::Acquire)
    }
}
