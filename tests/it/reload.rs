//! `SIGHUP` (CONTRACT §9): the supervisor reads its configuration again and, when it is
//! valid, replaces the workers one by one (each new worker serves before its old one
//! drains) without a failed request; an invalid configuration changes nothing; the worker
//! count may change with it.

use std::collections::BTreeSet;
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::util::*;

/// `retryMs` in `GET /api/config` on a fresh connection.
fn retry_ms(s: &Server) -> Option<u64> {
    let r = s.get("/api/config");
    (r.status == 200).then(|| r.json()["data"]["sse"]["retryMs"].as_u64()).flatten()
}

/// Rewrites the server's config file with `from` replaced by `to`.
fn edit_config(s: &Server, from: &str, to: &str) {
    assert!(s.config_text.contains(from), "the config has no {from:?}:\n{}", s.config_text);
    std::fs::write(s.config_path(), s.config_text.replace(from, to)).expect("write config");
}

#[test]
fn hup_reloads_the_configuration_and_replaces_every_worker_without_a_failed_request() {
    let s = Server::builder().workers(2).set("sse", "retry_ms = 3000").set("compression", "min_bytes = 0").start();
    let old: BTreeSet<i32> = s.wait_workers(2, START_TIMEOUT).into_iter().collect();
    assert_eq!(retry_ms(&s), Some(3000), "before the reload");
    let hammer = Hammer::start(s.addr(), "/health");
    assert!(hammer.wait_more(5, IO_TIMEOUT), "no background traffic before the reload");
    edit_config(&s, "retry_ms = 3000", "retry_ms = 1234");
    s.signal(Signal::SIGHUP);
    let replaced = eventually(Duration::from_secs(15), || {
        let now: BTreeSet<i32> = s.workers().into_iter().collect();
        now.len() == 2 && now.is_disjoint(&old)
    });
    assert!(replaced, "after SIGHUP both workers must be new: {:?} (old {old:?})\nlog:\n{}", s.workers(), s.log_tail());
    // Fresh connections reach both new workers; every one answers with the new value.
    for _ in 0..20 {
        assert_eq!(retry_ms(&s), Some(1234), "after the reload, /api/config must show sse.retry_ms = 1234");
    }
    // Its compressed form, made before fork like the body, is the new configuration's too.
    let br = s.call("GET", "/api/config", &[("Accept-Encoding", "br")], b"");
    assert_eq!(br.header("content-encoding"), Some("br"), "/api/config in br: {br:?}");
    let mut text = Vec::new();
    let decoded = std::io::Read::read_to_end(&mut brotli::Decompressor::new(&br.body[..], 4096), &mut text);
    assert!(decoded.is_ok(), "/api/config in br does not decode: {decoded:?}");
    let v: serde_json::Value = serde_json::from_slice(&text).unwrap_or_default();
    assert_eq!(v["data"]["sse"]["retryMs"].as_u64(), Some(1234), "the br form after the reload: {v}");
    assert!(hammer.wait_more(5, IO_TIMEOUT), "background traffic stalled after the reload");
    let rep = hammer.finish();
    assert!(rep.failures.is_empty(), "requests failed during the reload: {:?}", rep.failures);
    for pid in old {
        assert!(
            eventually(Duration::from_secs(10), || !pid_alive(pid)),
            "old worker {pid} did not exit after draining"
        );
    }
    s.wait_log_line(IO_TIMEOUT, |l| l.contains("reload complete"));
}

#[test]
fn hup_with_an_invalid_configuration_keeps_the_running_one() {
    let s = Server::builder().set("sse", "retry_ms = 3000").start();
    let before = s.wait_workers(1, START_TIMEOUT);
    edit_config(&s, "retry_ms = 3000", "retry_ms = 3000\nno_such_key = 1");
    s.signal(Signal::SIGHUP);
    let line = s.wait_log_line(IO_TIMEOUT, |l| l.contains("reload refused"));
    assert!(line.contains("no_such_key"), "the refusal must name the problem: {line}");
    assert_eq!(s.workers(), before, "an invalid configuration must not replace the workers");
    assert_eq!(retry_ms(&s), Some(3000), "the running configuration stays");
    // A later valid one applies.
    std::fs::write(s.config_path(), s.config_text.replace("retry_ms = 3000", "retry_ms = 2500")).unwrap();
    s.signal(Signal::SIGHUP);
    assert!(eventually(Duration::from_secs(15), || retry_ms(&s) == Some(2500)), "the valid config after a refused one");
}

#[test]
fn hup_can_change_the_number_of_workers() {
    let s = Server::builder().workers(1).start();
    s.wait_workers(1, START_TIMEOUT);
    edit_config(&s, "workers = 1", "workers = 3");
    s.signal(Signal::SIGHUP);
    s.wait_workers(3, Duration::from_secs(15));
    let line = s.wait_log_line(IO_TIMEOUT, |l| l.contains("reload: workers"));
    assert!(
        line.contains("reload: workers 1 -> 3 (`workers` changed from 1 to 3 in the configuration)"),
        "the reload logs the change as its own: {line}"
    );
    s.wait_log_line(Duration::from_secs(15), |l| l.contains("reload complete"));
    edit_config(&s, "workers = 1", "workers = 2");
    s.signal(Signal::SIGHUP);
    s.wait_workers(2, Duration::from_secs(15));
    s.assert_healthy();
}

#[test]
fn hup_refuses_a_new_listen_address() {
    let s = Server::builder().start();
    let before = s.wait_workers(1, START_TIMEOUT);
    let listen = format!("listen = \"{}\"", s.addr());
    edit_config(&s, &listen, "listen = \"127.0.0.1:1\"");
    s.signal(Signal::SIGHUP);
    let line = s.wait_log_line(IO_TIMEOUT, |l| l.contains("reload refused"));
    assert!(line.contains("listen"), "the refusal must name `listen`: {line}");
    assert_eq!(s.workers(), before, "the workers stay");
    s.assert_healthy();
}

#[test]
fn hup_resets_ttin_and_logs_it_as_the_reload_s_own_action() {
    let s = Server::builder().workers(2).start();
    s.wait_workers(2, START_TIMEOUT);
    s.signal(Signal::SIGTTIN);
    s.wait_workers(3, Duration::from_secs(15));
    s.wait_log_line(IO_TIMEOUT, |l| l.contains("SIGTTIN: 3 worker(s)"));
    let before = s.logs().len();
    s.signal(Signal::SIGHUP);
    s.wait_log_line(Duration::from_secs(20), |l| l.contains("reload complete"));
    s.wait_workers(2, Duration::from_secs(15));
    let after = s.logs()[before..].to_string();
    assert!(
        after.contains("reload: workers 3 -> 2 (the configured count; TTIN/TTOU adjustments are reset)"),
        "the reload must say that it brings the count back to the configured one:\n{after}"
    );
    assert!(!after.contains("SIGTTOU") && !after.contains("SIGTTIN"), "no signal is named for it:\n{after}");
    // An unchanged count logs no such line.
    let before = s.logs().len();
    s.signal(Signal::SIGHUP);
    assert!(
        eventually(Duration::from_secs(20), || s.logs()[before..].contains("reload complete")),
        "second reload\n{}",
        s.log_tail()
    );
    assert!(!s.logs()[before..].contains("reload: workers"), "{}", s.log_tail());
}
