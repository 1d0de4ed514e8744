//! Processes of the server under test, found through `/proc` and never by name: worker
//! pids, signal masks, memory, liveness, and bounded waits for a child's exit. It signals
//! only pids a test names, never a process found by name.

use std::fs;
use std::process::ExitStatus;
use std::thread;
use std::time::{SystemTime, UNIX_EPOCH};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use super::*;

/// Processes whose parent is `parent` (not zombies), from /proc/*/stat. Never by name.
pub fn worker_pids(parent: i32) -> Vec<i32> {
    let mut out = Vec::new();
    let Ok(rd) = fs::read_dir("/proc") else { return out };
    for e in rd.flatten() {
        let name = e.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.parse::<i32>().ok()) else { continue };
        let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        let Some(close) = stat.rfind(')') else { continue };
        let mut f = stat[close + 1..].split_whitespace();
        let state = f.next().unwrap_or("");
        let ppid: i32 = f.next().and_then(|p| p.parse().ok()).unwrap_or(-1);
        if ppid == parent && state != "Z" && state != "X" {
            out.push(pid);
        }
    }
    out.sort();
    out
}

/// `State`, pending/blocked/ignored/caught signal masks of `pid` (for failure messages).
pub fn proc_signal_status(pid: i32) -> String {
    let st = fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    st.lines()
        .filter(|l| ["State", "SigPnd", "ShdPnd", "SigBlk", "SigIgn", "SigCgt"].iter().any(|k| l.starts_with(k)))
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Wall-clock time as `HH:MM:SS.mmm` UTC, to line test events up with the server log.
pub fn wall_clock() -> String {
    let d = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    let s = d.as_secs() % 86400;
    format!("{:02}:{:02}:{:02}.{:03}Z", s / 3600, s / 60 % 60, s % 60, d.subsec_millis())
}

pub fn pid_alive(pid: i32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat.rfind(')').and_then(|i| stat[i + 1..].split_whitespace().next().map(str::to_string));
            !matches!(state.as_deref(), Some("Z") | Some("X") | None)
        }
        Err(_) => false,
    }
}

pub fn kill_pid(pid: i32, sig: Signal) {
    kill(Pid::from_raw(pid), sig).unwrap_or_else(|e| panic!("kill({pid}, {sig:?}): {e}"));
}

/// `RssAnon` of `pid` in KiB: the resident memory only this process holds (heap, stacks,
/// buffers). The tests that bound what a worker buffers read this, not `VmRSS`, which also
/// counts the binary's code pages as each path first runs them.
pub fn anon_rss_kib(pid: i32) -> i64 {
    let st = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    st.lines()
        .find(|l| l.starts_with("RssAnon:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no RssAnon for pid {pid}"))
}

/// CPU time (user + system, all threads) process `pid` has used, in milliseconds; 0 when
/// it is gone.
pub fn cpu_ms(pid: i32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // After the command's closing parenthesis: state is field 3, utime 14, stime 15.
    let fields: Vec<&str> = stat.rsplit_once(')').map_or("", |(_, rest)| rest).split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    // SAFETY: sysconf only reads a system constant.
    let per_s = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).unwrap_or(100).max(1);
    (ticks(11) + ticks(12)) * 1000 / per_s
}

/// Polls `child` for its exit, up to `timeout`; `None` if it is still running.
pub fn wait_child(child: &mut std::process::Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(st) = child.try_wait().expect("try_wait") {
            return Some(st);
        }
        if Instant::now() >= deadline {
            return None;
        }
        thread::sleep(Duration::from_millis(10));
    }
}

/// Waits (at most `within`) until `replacements` workers beyond those in `seen` have been
/// seen (memory-ceiling replacements), adding every worker seen to `seen`.
pub fn wait_replacements(
    s: &Server,
    seen: &mut std::collections::BTreeSet<i32>,
    replacements: usize,
    within: Duration,
) {
    let target = seen.len() + replacements;
    let enough = eventually(within, || {
        seen.extend(s.workers());
        seen.len() >= target
    });
    assert!(
        enough,
        "fewer than {replacements} memory replacements within {within:?}: workers seen {seen:?}\nlog:\n{}",
        s.log_tail()
    );
}
