//! Process titles: what `ps` shows for the supervisor and each worker
//! (`forkd: supervisor`, `forkd: worker 3`), after nginx's `ngx_setproctitle`.
//!
//! A title lives in two places. The thread name (`/proc/PID/comm`, what `top`
//! and `ps -o comm` show, at most 15 bytes) is set with `prctl(PR_SET_NAME)`.
//! The command line (`/proc/PID/cmdline`, what `ps -f` and `ps aux` show) is
//! read by the kernel from the process's own memory: the argument strings at
//! the top of the initial stack, between `arg_start` and `arg_end` of
//! `/proc/self/stat`. The title is written there. So that a title longer than
//! the original arguments fits (`forkd` alone has 6 bytes), the environment
//! strings that follow them are used too, once every `environ` entry has been
//! copied to the heap; the kernel reads on past `arg_end` when the last
//! argument byte is not a NUL.
//!
//! Obligations: [`init`] runs once, while the process is single-threaded and
//! after the arguments were read (Rust's `std::env::args` reads them from
//! that memory each time it is called: afterwards it returns the title).
//! `/proc/PID/environ` shows the title's padding, not the environment.

use std::sync::atomic::{AtomicUsize, Ordering};

/// The writable title area, from [`init`]: start address and length (0: none).
static AREA_START: AtomicUsize = AtomicUsize::new(0);
static AREA_LEN: AtomicUsize = AtomicUsize::new(0);

extern "C" {
    /// The C library's environment: a NULL-terminated array of `NAME=value` strings.
    static mut environ: *mut *mut libc::c_char;
}

/// Find the argument area (and the environment area right after it, whose
/// strings are first moved to the heap) for [`set`] to write titles into.
///
/// Call once, in the supervisor at start: the process must be single-threaded
/// (nothing may read the environment meanwhile) and must have read its
/// arguments already. Forked workers inherit the result.
pub fn init() {
    let Some([arg_start, arg_end, env_start, env_end]) = stat_areas() else { return };
    if arg_end <= arg_start {
        return;
    }
    let mut end = arg_end;
    if env_start == arg_end && env_end > env_start && move_environment(env_start, env_end) {
        end = env_end;
    }
    AREA_START.store(arg_start, Ordering::Relaxed);
    AREA_LEN.store(end - arg_start, Ordering::Relaxed);
}

/// Set this process's title: the thread name (first 15 bytes) and, after
/// [`init`], the command line (NUL-padded to the end of the area; cut to it
/// when longer).
pub fn set(title: &str) {
    let mut comm = [0u8; 16];
    let n = title.len().min(15);
    comm[..n].copy_from_slice(&title.as_bytes()[..n]);
    // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16 bytes
    // from the pointer; `comm` is 16 bytes with a NUL at index 15 at the latest.
    unsafe {
        libc::prctl(libc::PR_SET_NAME, comm.as_ptr() as libc::c_ulong, 0, 0, 0);
    }
    let (start, len) = (AREA_START.load(Ordering::Relaxed), AREA_LEN.load(Ordering::Relaxed));
    if start == 0 || len < 2 {
        return;
    }
    // SAFETY: [start, start + len) is this process's argument area (plus the
    // environment strings after it, which `init` moved every `environ` entry
    // out of), as the kernel reported it in /proc/self/stat: mapped and
    // writable (the initial stack) for the life of the process. No Rust
    // reference to it exists; the only pointers into it are the C `argv`
    // array (read by std::env::args, which then sees the title) and glibc's
    // `program_invocation_name`, both to NUL-terminated strings, and the area
    // stays NUL-terminated.
    let area = unsafe { std::slice::from_raw_parts_mut(start as *mut u8, len) };
    let n = title.len().min(len - 1);
    area[..n].copy_from_slice(&title.as_bytes()[..n]);
    area[n..].fill(0);
}

/// `arg_start`, `arg_end`, `env_start`, `env_end`: fields 48 to 51 of `/proc/self/stat`.
fn stat_areas() -> Option<[usize; 4]> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which may hold spaces and parentheses) start at field 3.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(48 - 3);
    let mut out = [0usize; 4];
    for v in &mut out {
        *v = fields.next()?.parse().ok()?;
    }
    Some(out)
}

/// Copy every `environ` string that lies in [start, end) to the heap and
/// point `environ` at the copy; false (the area must not be used) if a copy
/// failed. The copies live as long as the process.
fn move_environment(start: usize, end: usize) -> bool {
    // SAFETY: the process is single-threaded (the caller's obligation), so no
    // one reads or changes the environment meanwhile. `environ` is the C
    // library's NULL-terminated array; each entry is replaced by a strdup'ed
    // copy of the same string, which getenv and std::env read as before.
    unsafe {
        let env = std::ptr::addr_of_mut!(environ).read();
        if env.is_null() {
            return true;
        }
        let mut i = 0;
        loop {
            let entry = env.add(i);
            let s = *entry;
            if s.is_null() {
                return true;
            }
            if (start..end).contains(&(s as usize)) {
                let copy = libc::strdup(s);
                if copy.is_null() {
                    return false;
                }
                *entry = copy;
            }
            i += 1;
        }
    }
}
