//! Views per worker: `/_debug/streams` asked until every worker has answered, and
//! connections known to be served by a given worker. They need `[debug] routes`, which the
//! harness turns on; nothing here changes a worker.

use std::thread;

use serde_json::Value;

use super::*;

use std::collections::BTreeMap;

impl Server {
    /// One `GET /_debug/streams` on a fresh connection: `{"pid","sse","ws","members","connections"}`
    /// of the worker that answered.
    pub fn streams_once(&self) -> Option<Value> {
        let r = self.try_get("/_debug/streams", IO_TIMEOUT).ok()?;
        if r.status != 200 {
            return None;
        }
        let v: Value = serde_json::from_slice(&r.body).ok()?;
        v["pid"].as_i64()?;
        Some(v)
    }

    /// `/_debug/streams` polled over fresh connections until every one of the current
    /// worker pids has answered (bounded 5 s): the latest answer per pid. Panics otherwise.
    pub fn streams_by_pid(&self) -> BTreeMap<i32, Value> {
        let want = self.workers();
        let mut seen: BTreeMap<i32, Value> = BTreeMap::new();
        let ok = eventually(Duration::from_secs(5), || {
            if let Some(v) = self.streams_once() {
                seen.insert(v["pid"].as_i64().unwrap() as i32, v);
            }
            want.iter().all(|p| seen.contains_key(p))
        });
        if !ok {
            panic!(
                "/_debug/streams: did not hear from every worker {want:?} within 5 s; got {seen:?}\nlog:\n{}",
                self.log_tail()
            );
        }
        seen
    }

    /// Polls (bounded `timeout`) until `pred` holds for a complete per-worker snapshot;
    /// returns the last snapshot and whether it held.
    pub fn streams_until(
        &self,
        timeout: Duration,
        mut pred: impl FnMut(&BTreeMap<i32, Value>) -> bool,
    ) -> (BTreeMap<i32, Value>, bool) {
        let deadline = Instant::now() + timeout;
        loop {
            let snap = self.streams_by_pid();
            if pred(&snap) {
                return (snap, true);
            }
            if Instant::now() >= deadline {
                return (snap, false);
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// A fresh keep-alive connection known to be served by worker `pid` (asked with
    /// `/_debug/pid` on it); bounded to 300 connection attempts.
    pub fn conn_on(&self, pid: i32) -> Conn {
        for _ in 0..300 {
            let mut c = self.conn();
            let r = c.get("/_debug/pid");
            if r.status == 200 && r.json()["pid"].as_i64() == Some(pid as i64) && !r.closes() {
                return c;
            }
        }
        panic!("no connection landed on worker {pid} in 300 attempts\nlog:\n{}", self.log_tail());
    }

    /// The pid of the worker that answered `r`: the `pid=` of the access log line with its
    /// request id (bounded 5 s). Unlike a `/_debug/pid` on the next connection, it does not
    /// depend on how the supervisor places connections.
    pub fn served_by(&self, r: &Response) -> i32 {
        let id = r.header("x-request-id").unwrap_or_else(|| panic!("no x-request-id in {r:?}")).to_string();
        let line = self.wait_log_line(Duration::from_secs(5), |l| l.contains(&format!(" id={id} ")));
        line.split_whitespace()
            .find_map(|w| w.strip_prefix("pid="))
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("no pid= in the access line {line:?}"))
    }

    /// A fresh connection and the pid of the worker serving it.
    pub fn conn_with_pid(&self) -> (Conn, i32) {
        let mut c = self.conn();
        let r = c.get("/_debug/pid");
        assert_eq!(r.status, 200, "GET /_debug/pid: {r:?}\nlog:\n{}", self.log_tail());
        let pid = r.json()["pid"].as_i64().unwrap() as i32;
        (c, pid)
    }
}

/// `v[key]` as i64, 0 when absent (for `/_debug/streams` counts).
pub fn count_of(v: &Value, key: &str) -> i64 {
    v[key].as_i64().unwrap_or(0)
}
