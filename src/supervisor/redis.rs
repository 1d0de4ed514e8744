//! The Redis bridge (`cluster.redis_url`): what makes "across all workers"
//! mean "across all hosts". Owned by the supervisor, which is already the bus
//! hub and runs a poll loop that never serves a request; the workers never
//! talk to Redis, so nothing on a worker's loop can wait on it.
//!
//! Two non-blocking connections ([`crate::redis::conn`]) on the supervisor's poll:
//!
//! - **Commands** (pipelined): every flush the rate table's sets hit
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
//!   and one publishing connection keep each publisher's order. A
//!   [`Topic::Cache`](crate::bus::Topic::Cache) message (a shared-cache fill)
//!   is not for the workers: the supervisor stores it in its own host's
//!   shared cache ([`store_cache_entry`]).
//!
//! **Overshoot.** A host decides on its own count plus the others' as last
//! heard: after its own flush (every [`FLUSH_EVERY`] while it counts, the first
//! one up to 20 ms after an idle spell) or a refresh ([`REFRESH_EVERY`], for
//! keys it stopped hitting), plus a round trip. For one key the limit can be
//! passed by what the hosts admit on that stale view: at most
//! `hosts × r × (lag)` for a per-host rate `r` on that key, lag ≤ 20 ms + RTT
//! (≤ 5 ms + RTT once the key is busy), and never more than `(hosts − 1) × max`
//! per window (each host alone still holds `max`). Measured (two hosts, one
//! loopback Redis, `tests/it/redis.rs`): see `docs/architecture.md`.
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
use crate::shm::cache::SharedCache;
use crate::shm::ratelimit::{RateTable, WAYS};
use crate::shm::Region;

/// Poll token of the command connection.
pub const CMD: Token = Token(usize::MAX - 1);
/// Poll token of the subscriber connection.
pub const SUB: Token = Token(usize::MAX - 2);
/// How often the rate table's new hits are sent to Redis while hits come.
pub const FLUSH_EVERY: Duration = Duration::from_millis(5);
/// The same when the last flush found nothing (an idle supervisor wakes less).
const FLUSH_IDLE: Duration = Duration::from_millis(20);
/// How often keys this host counted in the current window, but did not hit
/// since, learn the other hosts' counts again.
pub const REFRESH_EVERY: Duration = Duration::from_millis(20);
/// Keys refreshed at most per [`REFRESH_EVERY`] (round robin over the rest).
const REFRESH_MAX: usize = 1024;
/// Replies awaited above which a flush waits for the next turn (the dirty
/// marks stay, nothing is lost).
const FLUSH_BACKLOG: usize = 20_000;
const HOST_ID: usize = 8;

/// What a command's reply is for.
enum Cmd {
    /// `INCRBY` or `GET` of rate bucket `index`'s key: the total minus `sent`
    /// (this host's share when the command was queued) is the other hosts' count.
    Count { index: usize, tag: u64, window: u64, sent: u64 },
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
    /// Buckets sent in their current window, to refresh ([`REFRESH_EVERY`]), and
    /// whether each bucket is in that list.
    active: Vec<usize>,
    is_active: Vec<bool>,
    cursor: usize,
    next_flush: Instant,
    next_refresh: Instant,
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

/// The Redis key counting bucket `index`'s key in window number `window`:
/// the set and tag identify the key on every host sharing the seed.
fn rate_key(window_ms: u64, index: usize, tag: u64, window: u64) -> String {
    format!("forkd:rl:{window_ms}:{}:{tag}:{window}", index / WAYS)
}

/// Store another host's shared-cache write ([`crate::bus::Topic::Cache`]
/// payload) in this host's cache. Its expiry, wall-clock ms, becomes this
/// host's monotonic ms (`wall_now`, `mono_now`: the two clocks now), and is cut
/// to `ttl_max` from now (this host's `upstreams.cache_ttl`) so that a clock
/// ahead of ours cannot keep an answer longer than any host would. Whether it
/// was stored (not: malformed, already expired, or the slot busy).
pub fn store_cache_entry(cache: &SharedCache, payload: &[u8], ttl_max: u64, wall_now: u64, mono_now: u64) -> bool {
    let Some(e) = crate::bus::CacheEntry::decode(payload) else {
        log::debug!("redis: malformed shared-cache entry from another host");
        return false;
    };
    let left = e.expires_wall_ms.saturating_sub(wall_now).min(ttl_max);
    let stored = left > 0 && cache.put(e.key, e.value, mono_now + left, mono_now);
    if stored {
        log::debug!("redis: stored another host's shared-cache entry {} for {left} ms", String::from_utf8_lossy(e.key));
    }
    stored
}

/// Wall-clock milliseconds minus monotonic milliseconds: added to the table's
/// clock so windows start at the same instant on every host.
pub fn clock_offset_ms() -> u64 {
    let wall = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64);
    wall.unwrap_or(0).wrapping_sub(crate::sys::monotonic_ms())
}

impl Bridge {
    /// A bridge to `target`, counting windows of `window_ms` (`rate_limit.window`).
    /// Resolves the host name now (start-up, before serving: the only lookup) and, for
    /// `rediss://`, reads the roots; a roots file that is unusable is the error.
    pub fn new(
        target: RedisTarget,
        rate: &'static RateTable,
        region: &'static Region,
        window_ms: u64,
    ) -> Result<Bridge, String> {
        let tls = crate::redis::tls_to(&target)?;
        let addr: Option<SocketAddr> = match (target.host.as_str(), target.port).to_socket_addrs() {
            Ok(mut a) => a.next(),
            Err(e) => {
                log::error!("redis: cannot resolve {}: {e}; cross-host state is off until a restart", target.host);
                None
            }
        };
        let channel = format!("forkd:{}:bus", target.db).into_bytes();
        let mut sub = Conn::new("subscriber", target.clone(), addr, tls.clone(), SUB, true);
        sub.on_connect(&[b"SUBSCRIBE", &channel]);
        let cmd = Conn::new("commands", target.clone(), addr, tls, CMD, false);
        region.set_redis_up(false);
        log::info!("redis: cross-host state through {target} (rate limits, login failures, bus)");
        Ok(Bridge {
            cmd,
            sub,
            host: rand::random(),
            channel,
            rate,
            region,
            window_ms: window_ms.max(1),
            sent: vec![0; crate::shm::ratelimit::BUCKETS],
            active: Vec::new(),
            is_active: vec![false; crate::shm::ratelimit::BUCKETS],
            cursor: 0,
            next_flush: Instant::now(),
            next_refresh: Instant::now(),
            up: false,
            announced: false,
            replies: Vec::new(),
            pushes: Vec::new(),
            inbound: Vec::new(),
            dropped: 0,
        })
    }

    /// A reload changed `rate_limit.window`: count new windows under it.
    pub fn set_window(&mut self, window_ms: u64) {
        self.window_ms = window_ms.max(1);
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
            let busy = self.flush_rates();
            if now >= self.next_refresh {
                self.next_refresh = now + REFRESH_EVERY;
                self.refresh_rates();
            }
            self.next_flush = now + if busy { FLUSH_EVERY } else { FLUSH_IDLE };
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

    /// Send the hits counted since the last flush; learn the other hosts'
    /// counts. Whether there was anything to send.
    fn flush_rates(&mut self) -> bool {
        if !self.cmd.is_up() || self.cmd.awaited() > FLUSH_BACKLOG {
            return false; // the dirty marks stay: nothing counted is lost
        }
        let rate = self.rate;
        let ttl = (2 * self.window_ms).to_string();
        let window_ms = self.window_ms;
        let mut busy = false;
        let (cmd, sent, active, is_active) = (&mut self.cmd, &mut self.sent, &mut self.active, &mut self.is_active);
        rate.drain_dirty(|c| {
            busy = true;
            let prev = sent[c.index];
            let prev_sent = if prev >> 20 == (c.tag << 20 | c.window) { prev & 0xF_FFFF } else { 0 };
            let delta = c.count as i64 - prev_sent as i64;
            let key = rate_key(window_ms, c.index, c.tag, c.window);
            let queued = cmd.send(
                &[b"INCRBY", key.as_bytes(), delta.to_string().as_bytes()],
                Cmd::Count { index: c.index, tag: c.tag, window: c.window, sent: c.count },
            );
            if queued {
                sent[c.index] = (c.tag << 40) | (c.window << 20) | c.count;
                cmd.send(&[b"PEXPIRE", key.as_bytes(), ttl.as_bytes()], Cmd::Ignore);
                if !is_active[c.index] {
                    is_active[c.index] = true;
                    active.push(c.index);
                }
            }
        });
        busy
    }

    /// Ask again for the totals of keys this host counted in the current
    /// window (a host that stopped hitting a key must still learn that the
    /// others went on); forget the ones evicted or in an older window.
    fn refresh_rates(&mut self) {
        if !self.cmd.is_up() || self.cmd.awaited() > FLUSH_BACKLOG || self.active.is_empty() {
            return;
        }
        let current = self.rate.window_at(crate::sys::monotonic_ms(), self.window_ms);
        let mut done = 0;
        while done < REFRESH_MAX.min(self.active.len()) {
            if self.cursor >= self.active.len() {
                self.cursor = 0;
            }
            let index = self.active[self.cursor];
            let prev = self.sent[index];
            let (tag, window, sent) = (prev >> 40, (prev >> 20) & 0xF_FFFF, prev & 0xF_FFFF);
            let live = self.rate.bucket(index).is_some_and(|c| c.tag == tag && c.window == window);
            if !live || window != current {
                self.is_active[index] = false;
                self.active.swap_remove(self.cursor);
                continue;
            }
            let key = rate_key(self.window_ms, index, tag, window);
            self.cmd.send(&[b"GET", key.as_bytes()], Cmd::Count { index, tag, window, sent });
            self.cursor += 1;
            done += 1;
        }
    }

    fn take_replies(&mut self) {
        for (tag, value) in self.replies.drain(..) {
            match (tag, value) {
                (Some(Cmd::Count { index, tag, window, sent }), Value::Int(total)) => {
                    let other = (total - sent as i64).max(0) as u64;
                    self.rate.set_remote(index, tag, window, other);
                }
                (Some(Cmd::Count { index, tag, window, sent }), Value::Bulk(total)) => {
                    let total = total.and_then(|t| std::str::from_utf8(&t).ok()?.parse::<i64>().ok()).unwrap_or(0);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bus::CacheEntry;

    #[test]
    fn another_hosts_cache_write_is_stored_on_this_hosts_clock_and_capped_by_its_ttl() {
        let cache = SharedCache::create(64, 7).expect("map");
        let (wall, mono) = (1_700_000_000_000u64, 5_000u64);
        let entry = |key: &'static [u8], expires_wall_ms| {
            CacheEntry { key, value: b"{\"v\":1}", expires_wall_ms }.encode().expect("fits")
        };
        let mut out = Vec::new();
        // 3 s left on the sender's wall clock: 3 s on our monotonic clock.
        assert!(store_cache_entry(cache, &entry(b"a", wall + 3_000), 60_000, wall, mono));
        assert_eq!(cache.get(b"a", mono, &mut out), Some(mono + 3_000));
        assert_eq!(out, b"{\"v\":1}");
        // Far in the future (a clock ahead of ours): no longer than our TTL.
        assert!(store_cache_entry(cache, &entry(b"b", wall + 86_400_000), 60_000, wall, mono));
        assert_eq!(cache.get(b"b", mono, &mut out), Some(mono + 60_000));
        // Already expired here, or malformed: not stored.
        assert!(!store_cache_entry(cache, &entry(b"c", wall), 60_000, wall, mono));
        assert!(!store_cache_entry(cache, &entry(b"d", wall - 1), 60_000, wall, mono));
        assert!(!store_cache_entry(cache, b"\x01\x02", 60_000, wall, mono));
        assert_eq!(cache.get(b"c", mono, &mut out), None);
    }
}
