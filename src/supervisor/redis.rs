//! The Redis bridge (`cluster.redis_url`): what makes "across all workers"
//! mean "across all hosts". Owned by the supervisor, which is already the bus
//! hub and runs a poll loop that never serves a request; the workers never
//! talk to Redis, so nothing on a worker's loop can wait on it.
//!
//! Two non-blocking connections ([`crate::redis::conn`]) on the supervisor's poll:
//!
//! - **Commands** (pipelined): every [`FLUSH_EVERY`] the rate table's sets hit
//!   since the last flush are read ([`RateTable::drain_dirty`]); for each
//!   bucket, the hits not yet sent go out as `INCRBY` (with `PEXPIRE`) on a key
//!   named by the bucket's identity (set, tag, window number: the same on every
//!   host, since the table's seed derives from the shared signing secret and
//!   its windows from wall time), and the total Redis answers, less what this
//!   host sent, is written back as the other hosts' count
//!   ([`RateTable::set_remote`]), which every worker adds to its own on the
//!   next decision. Login failures are slots of the same table, so they go
//!   the same way (a slot given back is a negative `INCRBY`). Every bus
//!   message a local worker publishes is also `PUBLISH`ed, behind an 8-byte
//!   host id made at start.
//! - **Subscriber**: `SUBSCRIBE` to the bus channel; a message from another
//!   host goes to every local worker as if a local worker had published it;
//!   this host's own are skipped by their host id. One channel for every topic
//!   and one publishing connection keep each publisher's order.
//!
//! **Overshoot.** A host learns the others' counts once per flush (plus a
//! round trip), so for one key the limit can be passed by what the hosts
//! admit on stale knowledge: at most `hosts × r × (FLUSH_EVERY + RTT)` for a
//! per-host rate `r` on that key, and never more than `(hosts − 1) × max`
//! per window (each host alone still holds `max`).
//!
//! **Redis down.** The table's other-hosts counts stop applying
//! ([`RateTable::set_remote_on`]), so each host limits on its own count;
//! dirty marks stay set, so when Redis answers again the hits counted
//! meanwhile are sent in the first flush. Bus messages are not queued while
//! the connection is down (SSE clients catch up by `Last-Event-ID` replay).
//! The loss is logged once per outage and counted (`forkd_redis_up`,
//! `forkd_redis_fallbacks_total`); reconnecting is the connection's job.
//!
//! It must not block (the address is resolved once, at start-up) and must
//! not touch the workers' sockets: messages for them go back to the caller.

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::{Registry, Token};

use crate::redis::conn::Conn;
use crate::redis::resp::Value;
use crate::redis::RedisTarget;
use crate::shm::ratelimit::{RateTable, WAYS};
use crate::shm::Region;

/// Poll token of the command connection.
pub const CMD: Token = Token(usize::MAX - 1);
/// Poll token of the subscriber connection.
pub const SUB: Token = Token(usize::MAX - 2);
/// How often the rate table's new hits are sent to Redis.
pub const FLUSH_EVERY: Duration = Duration::from_millis(20);
/// Replies awaited above which a flush waits for the next turn (the dirty
/// marks stay, nothing is lost).
const FLUSH_BACKLOG: usize = 20_000;
const HOST_ID: usize = 8;

/// What a command's reply is for.
enum Cmd {
    /// `INCRBY` of rate bucket `index`: the total minus `sent` is the other hosts' count.
    Incr { index: usize, tag: u64, window: u64, sent: u64 },
    /// A reply nobody needs (`PEXPIRE`, `PUBLISH`).
    Ignore,
}

/// The bridge.
pub struct Bridge {
    cmd: Conn<Cmd>,
    sub: Conn<()>,
    host: [u8; HOST_ID],
    channel: Vec<u8>,
    rate: &'static RateTable,
    region: &'static Region,
    window_ms: u64,
    /// Per rate bucket: `tag | window | count sent`, packed like the table's words.
    sent: Vec<u64>,
    next_flush: Instant,
    up: bool,
    /// This outage was logged and counted.
    announced: bool,
    replies: Vec<(Option<Cmd>, Value)>,
    pushes: Vec<(Option<()>, Value)>,
    /// Messages from other hosts, for the local workers.
    inbound: Vec<Arc<[u8]>>,
    /// Bus messages not published because the connection was down or full.
    pub dropped: u64,
}

/// The rate table's seed when hosts share Redis: derived from the signing
/// secret (which hosts behind one load balancer share already), so every host
/// places a key in the same set with the same tag, and nobody without the
/// secret can pick colliding keys offline.
pub fn shared_seed(secret: &[u8]) -> u128 {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    h.update(b"forkd rate-limit table seed\0");
    h.update(secret);
    let d = h.finalize();
    let mut b = [0u8; 16];
    b.copy_from_slice(&d[..16]);
    u128::from_le_bytes(b)
}

/// Wall-clock milliseconds minus monotonic milliseconds: added to the table's
/// clock so windows start at the same instant on every host.
pub fn clock_offset_ms() -> u64 {
    let wall = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64);
    wall.unwrap_or(0).wrapping_sub(crate::sys::monotonic_ms())
}

impl Bridge {
    /// A bridge to `target`, counting windows of `window_ms` (`rate_limit.window`).
    /// Resolves the host name now (start-up, before serving: the only lookup).
    pub fn new(target: RedisTarget, rate: &'static RateTable, region: &'static Region, window_ms: u64) -> Bridge {
        let addr: Option<SocketAddr> = match (target.host.as_str(), target.port).to_socket_addrs() {
            Ok(mut a) => a.next(),
            Err(e) => {
                log::error!("redis: cannot resolve {}: {e}; cross-host state is off until a restart", target.host);
                None
            }
        };
        let channel = format!("forkd:{}:bus", target.db).into_bytes();
        let mut sub = Conn::new("subscriber", target.clone(), addr, SUB, true);
        sub.on_connect(&[b"SUBSCRIBE", &channel]);
        let cmd = Conn::new("commands", target.clone(), addr, CMD, false);
        region.set_redis_up(false);
        log::info!("redis: cross-host state through {target} (rate limits, login failures, bus)");
        Bridge {
            cmd,
            sub,
            host: rand::random(),
            channel,
            rate,
            region,
            window_ms: window_ms.max(1),
            sent: vec![0; crate::shm::ratelimit::BUCKETS],
            next_flush: Instant::now(),
            up: false,
            announced: false,
            replies: Vec::new(),
            pushes: Vec::new(),
            inbound: Vec::new(),
            dropped: 0,
        }
    }

    /// One of the bridge's sockets is ready.
    pub fn ready(&mut self, registry: &Registry, token: Token) {
        let now = Instant::now();
        if token == CMD {
            self.cmd.ready(registry, now, &mut self.replies);
            self.take_replies();
        } else if token == SUB {
            self.sub.ready(registry, now, &mut self.pushes);
            self.take_pushes();
        }
        self.note_state();
    }

    /// Timers: reconnects, pings, the rate flush. Call every loop turn.
    pub fn tick(&mut self, registry: &Registry) {
        let now = Instant::now();
        self.cmd.tick(registry, now);
        self.sub.tick(registry, now);
        self.note_state();
        if now >= self.next_flush {
            self.next_flush = now + FLUSH_EVERY;
            self.flush_rates();
            self.cmd.tick(registry, now);
        }
    }

    /// When [`Bridge::tick`] must run next at the latest.
    pub fn deadline(&self) -> Instant {
        self.next_flush.min(self.cmd.deadline()).min(self.sub.deadline())
    }

    /// Publish a bus message a local worker sent (already forwarded locally).
    pub fn publish(&mut self, registry: &Registry, msg: &[u8]) {
        let mut payload = Vec::with_capacity(HOST_ID + msg.len());
        payload.extend_from_slice(&self.host);
        payload.extend_from_slice(msg);
        if !self.cmd.is_up() || !self.cmd.send(&[b"PUBLISH", &self.channel, &payload], Cmd::Ignore) {
            self.dropped += 1;
            return;
        }
        self.cmd.tick(registry, Instant::now());
    }

    /// Messages from other hosts since the last call, for every local worker.
    pub fn take_inbound(&mut self) -> Vec<Arc<[u8]>> {
        std::mem::take(&mut self.inbound)
    }

    /// Send the hits counted since the last flush; learn the other hosts' counts.
    fn flush_rates(&mut self) {
        if !self.cmd.is_up() || self.cmd.awaited() > FLUSH_BACKLOG {
            return; // the dirty marks stay: nothing counted is lost
        }
        let rate = self.rate;
        let ttl = (2 * self.window_ms).to_string();
        let window_ms = self.window_ms;
        let (cmd, sent) = (&mut self.cmd, &mut self.sent);
        rate.drain_dirty(|c| {
            let prev = sent[c.index];
            let prev_sent = if prev >> 20 == (c.tag << 20 | c.window) { prev & 0xF_FFFF } else { 0 };
            let delta = c.count as i64 - prev_sent as i64;
            let key = format!("forkd:rl:{window_ms}:{}:{}:{}", c.index / WAYS, c.tag, c.window);
            let queued = cmd.send(
                &[b"INCRBY", key.as_bytes(), delta.to_string().as_bytes()],
                Cmd::Incr { index: c.index, tag: c.tag, window: c.window, sent: c.count },
            );
            if queued {
                sent[c.index] = (c.tag << 40) | (c.window << 20) | c.count;
                cmd.send(&[b"PEXPIRE", key.as_bytes(), ttl.as_bytes()], Cmd::Ignore);
            }
        });
    }

    fn take_replies(&mut self) {
        for (tag, value) in self.replies.drain(..) {
            match (tag, value) {
                (Some(Cmd::Incr { index, tag, window, sent }), Value::Int(total)) => {
                    let other = (total - sent as i64).max(0) as u64;
                    self.rate.set_remote(index, tag, window, other);
                }
                (_, Value::Error(e)) => log::debug!("redis: command refused: {e}"),
                _ => {}
            }
        }
    }

    fn take_pushes(&mut self) {
        for (_, value) in self.pushes.drain(..) {
            let Value::Array(Some(items)) = value else { continue };
            let [Value::Bulk(Some(kind)), Value::Bulk(Some(_channel)), Value::Bulk(Some(payload))] = items.as_slice()
            else {
                continue; // subscribe confirmations, pongs
            };
            if kind != b"message" || payload.len() < HOST_ID || payload[..HOST_ID] == self.host {
                continue;
            }
            let msg = &payload[HOST_ID..];
            if crate::bus::decode(msg).is_none() || msg.len() > crate::bus::MAX_MESSAGE {
                log::debug!("redis: malformed bus message from another host");
                continue;
            }
            self.inbound.push(msg.into());
        }
    }

    /// Follow the command connection up and down: the rate table's use of
    /// other hosts' counts, the metrics, one log line per outage.
    fn note_state(&mut self) {
        let up = self.cmd.is_up();
        if up && !self.up {
            log::info!("redis: connected; rate limits and the bus span every host");
            self.announced = false;
        }
        if !up && !self.announced && (self.up || self.cmd.drops > 0) {
            self.announced = true;
            self.region.count_redis_fallback();
            log::warn!(
                "redis: unreachable; rate limits fall back to this host's own count and cross-host \
                 delivery pauses until it answers again"
            );
        }
        if up != self.up {
            self.up = up;
            self.rate.set_remote_on(up);
            self.region.set_redis_up(up);
        }
    }
}
