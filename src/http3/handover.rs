//! Who reads a slot's UDP socket while its workers hand over: the socket-free state machine
//! behind the inbox (`sys::inbox`), one per worker, in both roles at once.
//!
//! As a *successor* (a worker started beside live workers of its slot, its `siblings`): it
//! says hello to each and does not read the socket until each has acked (it then stopped
//! reading and told its CID generation), is gone, or did not ack within [`HELLO_WAIT`]. One
//! that did not ack but lives (a stuck loop, a binary without an inbox) is waited for as before
//! forwarding existed: until it is gone, `fallback_for` at most. Then the worker picks a
//! generation no acked sibling has, starts reading, and forwards the packets of the acked
//! generations to their inboxes ([`Handover::route`]) until a send finds one gone.
//!
//! As a *predecessor*: a hello makes the sender its successor; it stops reading (the
//! successor forwards its packets) until that pid is gone, checked every [`CHECK`], and then
//! reads again (a reload's new worker that died: the supervisor keeps the old one). A later
//! hello replaces the successor (two reloads in a row: the third worker says hello to both
//! older ones). Once it has acked, its generation no longer changes.
//!
//! It must not touch sockets or the poll: the worker sends, receives and registers; this
//! file only says who reads and where a packet goes. It lives beside the HTTP/3 codec, not
//! in the worker, because it is a pure state machine over pids, times and connection IDs
//! (`keys`), driven by the worker's inbox code.

use std::time::{Duration, Instant};

use nix::sys::socket::UnixAddr;

use super::keys::{generation_of, packet_cid, slot_of};

/// How long a successor waits for its predecessors' acks before it falls back.
pub(crate) const HELLO_WAIT: Duration = Duration::from_secs(1);
/// How often pending hellos are said again, and successors and predecessors checked.
pub(crate) const CHECK: Duration = Duration::from_millis(50);

/// An acked predecessor: where its packets go.
#[derive(Debug, Clone)]
pub(crate) struct Forward {
    /// The generation byte its connection IDs carry.
    pub generation: u8,
    /// Its pid.
    pub pid: i32,
    /// Its inbox.
    pub addr: UnixAddr,
}

/// One worker's side of the hand-over (see the module doc).
#[derive(Debug)]
pub(crate) struct Handover {
    /// Our hello phase is over: we read the socket unless a successor does.
    started: bool,
    /// Predecessors said hello to and not acked yet: pid, whether to say it again (it was
    /// not delivered: no inbox of that name yet, or its queue was full).
    waiting: Vec<(i32, bool)>,
    /// The waiting ones fall back then.
    hello_until: Instant,
    /// Predecessors that did not ack and live: we read once they are gone.
    fallback: Vec<i32>,
    /// ... or then at the latest.
    fallback_until: Option<Instant>,
    /// How long a fallback lasts at most.
    fallback_for: Duration,
    /// Acked predecessors: their packets are forwarded.
    forward: Vec<Forward>,
    /// The successor that reads the socket for us.
    successor: Option<i32>,
    /// Our generation was announced in an ack: it stays.
    frozen: bool,
    next_check: Option<Instant>,
}

impl Handover {
    /// A worker started beside `siblings` (hellos are being sent to each), or alone.
    pub(crate) fn new(siblings: &[i32], now: Instant, fallback_for: Duration) -> Handover {
        let mut h = Handover {
            started: false,
            waiting: siblings.iter().map(|&pid| (pid, false)).collect(),
            hello_until: now + HELLO_WAIT,
            fallback: Vec::new(),
            fallback_until: None,
            fallback_for,
            forward: Vec::new(),
            successor: None,
            frozen: false,
            next_check: None,
        };
        h.settle(now);
        h
    }

    /// Whether the worker reads the slot's socket now.
    pub(crate) fn reads(&self) -> bool {
        self.started && self.successor.is_none()
    }

    /// Whether the hello phase is over (the generation may be chosen, the socket registered).
    pub(crate) fn started(&self) -> bool {
        self.started
    }

    /// The successor reading for us, if any.
    pub(crate) fn successor(&self) -> Option<i32> {
        self.successor
    }

    /// When [`Handover::check`] is due.
    pub(crate) fn next_check(&self) -> Option<Instant> {
        self.next_check
    }

    /// Ends the hello phase when nothing is pending; schedules the next check.
    fn settle(&mut self, now: Instant) {
        if self.waiting.is_empty() && self.fallback.is_empty() {
            self.started = true;
            self.fallback_until = None;
        }
        let pending = !self.waiting.is_empty() || !self.fallback.is_empty() || self.successor.is_some();
        self.next_check = match (pending, self.next_check) {
            (false, _) => None,
            (true, Some(t)) => Some(t),
            (true, None) => Some(now + CHECK),
        };
    }

    /// The hello to `pid` was not delivered: say it again at the next check (until
    /// [`HELLO_WAIT`] ends).
    pub(crate) fn undelivered(&mut self, pid: i32) {
        if let Some(w) = self.waiting.iter_mut().find(|w| w.0 == pid) {
            w.1 = true;
        }
    }

    /// Every predecessor falls back (the worker has no inbox to talk through).
    pub(crate) fn without_inbox(&mut self, now: Instant) {
        self.hello_until = now;
        self.check(now, |_| true);
    }

    /// Runs the checks due at `now` (`alive`: whether a pid still exists); returns the pids
    /// to say hello to again. The worker compares [`Handover::reads`] before and after.
    pub(crate) fn check(&mut self, now: Instant, alive: impl Fn(i32) -> bool) -> Vec<i32> {
        self.next_check = None;
        self.waiting.retain(|w| alive(w.0));
        self.fallback.retain(|&pid| alive(pid));
        if now >= self.hello_until && !self.waiting.is_empty() {
            self.fallback.extend(self.waiting.drain(..).map(|w| w.0));
            self.fallback_until.get_or_insert(now + self.fallback_for);
        }
        if self.fallback_until.is_some_and(|t| now >= t) {
            self.fallback.clear();
        }
        if self.successor.is_some_and(|pid| !alive(pid)) {
            self.successor = None;
        }
        self.forward.retain(|f| alive(f.pid));
        let again = self.waiting.iter().filter(|w| w.1).map(|w| w.0).collect();
        self.settle(now);
        again
    }

    /// `pid` acked our hello: its connection IDs carry `generation`, its inbox is `addr`;
    /// `ours`: our generation so far. Whether it was taken (a pid we said hello to).
    pub(crate) fn acked(&mut self, now: Instant, pid: i32, generation: u8, addr: UnixAddr, ours: u8) -> bool {
        let was_waiting = self.waiting.iter().any(|w| w.0 == pid);
        if !was_waiting && !self.fallback.contains(&pid) {
            return false;
        }
        if generation == ours && (self.started || self.frozen) {
            // Ours cannot change any more and its packets cannot be told from ours: it stays
            // a fallback (read once it is gone).
            log::warn!("HTTP/3: worker {pid} has our CID generation {generation}; waiting for it to exit");
            return false;
        }
        self.waiting.retain(|w| w.0 != pid);
        self.fallback.retain(|&p| p != pid);
        self.forward.retain(|f| f.pid != pid && f.generation != generation);
        self.forward.push(Forward { generation, pid, addr });
        self.settle(now);
        true
    }

    /// `pid` said hello (we acked): it reads the socket from now on.
    pub(crate) fn hello(&mut self, now: Instant, pid: i32) {
        self.successor = Some(pid);
        self.frozen = true;
        self.settle(now);
    }

    /// Our generation once the hello phase is over: `ours` unless an acked predecessor has
    /// it (and it was not announced yet), then the next free byte.
    pub(crate) fn pick(&self, ours: u8) -> u8 {
        if self.frozen {
            return ours;
        }
        let mut g = ours;
        while self.forward.iter().any(|f| f.generation == g) {
            g = g.wrapping_add(1);
        }
        g
    }

    /// Where `datagram` goes when it is an acked predecessor's (its CID names slot `slot` and
    /// that predecessor's generation).
    pub(crate) fn route(&self, datagram: &[u8], slot: u16) -> Option<&Forward> {
        if self.forward.is_empty() {
            return None;
        }
        let cid = packet_cid(datagram)?;
        if slot_of(cid)? != slot {
            return None;
        }
        let generation = generation_of(cid)?;
        self.forward.iter().find(|f| f.generation == generation)
    }

    /// The predecessor of `generation` is gone: its packets are no longer forwarded.
    pub(crate) fn forget(&mut self, generation: u8) {
        self.forward.retain(|f| f.generation != generation);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(pid: i32) -> UnixAddr {
        UnixAddr::new_abstract(format!("t-{pid}").as_bytes()).expect("name")
    }

    /// A short-header packet of slot `slot`, generation `generation`.
    fn packet(slot: u16, generation: u8) -> Vec<u8> {
        let mut p = vec![0x41];
        p.extend_from_slice(&slot.to_be_bytes());
        p.push(generation);
        p.extend_from_slice(&[0; 30]);
        p
    }

    const LONG: Duration = Duration::from_secs(30);

    #[test]
    fn alone_it_reads_at_once() {
        let h = Handover::new(&[], Instant::now(), LONG);
        assert!(h.reads() && h.started());
        assert_eq!(h.next_check(), None, "no timer");
        assert!(h.route(&packet(0, 1), 0).is_none());
    }

    #[test]
    fn a_successor_reads_once_acked_and_forwards_the_predecessors_packets() {
        let t0 = Instant::now();
        let mut h = Handover::new(&[100], t0, LONG);
        assert!(!h.reads() && h.next_check().is_some());
        assert!(!h.acked(t0, 999, 7, addr(999), 7), "an ack from a pid not said hello to");
        assert!(h.acked(t0, 100, 7, addr(100), 7));
        assert!(h.reads());
        assert_eq!(h.pick(7), 8, "not the predecessor's generation");
        assert_eq!(h.pick(3), 3);
        assert_eq!(h.route(&packet(2, 7), 2).map(|f| f.pid), Some(100));
        assert!(h.route(&packet(2, 8), 2).is_none(), "ours");
        assert!(h.route(&packet(1, 7), 2).is_none(), "another slot's");
        assert!(h.route(&[0xc0, 0, 0, 0, 1, 8, 1, 2], 2).is_none(), "a client's own CID");
        h.forget(7);
        assert!(h.route(&packet(2, 7), 2).is_none(), "gone: answered like any unknown CID");
    }

    #[test]
    fn a_silent_predecessor_is_waited_for_until_gone() {
        let t0 = Instant::now();
        let mut h = Handover::new(&[100, 101], t0, LONG);
        h.undelivered(101);
        assert_eq!(h.check(t0 + CHECK, |_| true), vec![101], "hello again where not delivered");
        assert!(h.acked(t0 + CHECK, 101, 5, addr(101), 9));
        assert!(!h.reads(), "100 still pending");
        assert!(h.check(t0 + HELLO_WAIT, |_| true).is_empty());
        assert!(!h.reads(), "100 lives: fallback");
        assert!(h.check(t0 + 2 * HELLO_WAIT, |pid| pid != 100).is_empty());
        assert!(h.reads(), "100 is gone");
        assert_eq!(h.route(&packet(0, 5), 0).map(|f| f.pid), Some(101));
        // The fallback has a bound too.
        let mut h = Handover::new(&[100], t0, LONG);
        h.check(t0 + HELLO_WAIT, |_| true);
        assert!(!h.reads());
        h.check(t0 + HELLO_WAIT + LONG, |_| true);
        assert!(h.reads(), "waited long enough");
        // A late ack still routes.
        let mut h = Handover::new(&[100], t0, LONG);
        h.check(t0 + HELLO_WAIT, |_| true);
        assert!(h.acked(t0 + HELLO_WAIT, 100, 4, addr(100), 9) && h.reads());
        // No inbox: every sibling falls back at once.
        let mut h = Handover::new(&[100], t0, LONG);
        h.without_inbox(t0);
        assert!(!h.reads());
        h.check(t0 + CHECK, |_| false);
        assert!(h.reads());
    }

    #[test]
    fn a_predecessor_stops_on_hello_and_resumes_when_the_successor_dies() {
        let t0 = Instant::now();
        let mut h = Handover::new(&[], t0, LONG);
        h.hello(t0, 200);
        assert!(!h.reads() && h.successor() == Some(200));
        assert!(h.next_check().is_some_and(|t| t <= t0 + CHECK), "the successor is watched");
        h.check(t0 + CHECK, |_| true);
        assert!(!h.reads(), "the successor lives");
        h.check(t0 + 2 * CHECK, |pid| pid != 200);
        assert!(h.reads(), "it died: read again");
        assert_eq!(h.next_check(), None);
        // A second successor replaces the first (two reloads in a row).
        h.hello(t0, 300);
        h.hello(t0, 301);
        h.check(t0 + 3 * CHECK, |pid| pid != 300);
        assert!(!h.reads() && h.successor() == Some(301));
    }

    #[test]
    fn an_announced_generation_stays() {
        let t0 = Instant::now();
        // Said hello to by a later worker while still waiting for its own predecessor.
        let mut h = Handover::new(&[100], t0, LONG);
        h.hello(t0, 300);
        assert_eq!(h.pick(7), 7);
        assert!(!h.acked(t0, 100, 7, addr(100), 7), "the same generation cannot be told apart");
        assert!(h.acked(t0, 100, 6, addr(100), 7));
        assert!(h.started() && !h.reads(), "started, but the successor reads");
        assert_eq!(h.pick(7), 7);
    }
}
