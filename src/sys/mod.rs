//! The operating-system boundary: the only module allowed to use `unsafe`.
//!
//! It owns fork, the shared anonymous mapping, signal registration, the
//! parent-death signal, process titles (`title`), the counting allocator of
//! measurement builds (`alloc_count`, cargo feature `count-alloc`), closing inherited
//! descriptors after fork, reading another process's memory from `/proc`, when a worker
//! gives its free heap back (`trim`, a pure policy beside `trim_heap`), UDP's
//! segmentation offloads (`udp`: GSO sends, GRO receives), the programs that place new
//! connections and datagrams in a `SO_REUSEPORT` group (`reuseport`) and the HTTP/3 inbox
//! workers hand their slot's UDP socket over through (`inbox`). Everything above it gets safe
//! functions with the obligations written in their docs. It must not know
//! about HTTP, configuration or the process table.

#[cfg(feature = "count-alloc")]
pub mod alloc_count;
pub mod inbox;
pub mod reuseport;
pub mod signals;
pub mod title;
pub mod trim;
pub mod udp;

use std::io;
use std::os::fd::RawFd;

/// Which side of a [`fork`] we are on.
pub enum Forked {
    /// In the parent; the child's pid.
    Parent(i32),
    /// In the new child process.
    Child,
}

/// Fork the current process.
///
/// The caller must be single-threaded (the supervisor is): the child then
/// holds a consistent copy of every lock and allocator state. The child must
/// leave through [`std::process::exit`] and never return into the parent's
/// control flow, so that no object owned by the parent is dropped twice.
///
/// Every signal is blocked across the fork. The parent gets its mask back at
/// once; the child starts with all signals blocked and must call
/// [`unblock_signals`] once its own handlers are installed, so a signal sent
/// to it early (a SIGTERM right after a SIGTTOU) stays pending instead of
/// reaching the parent's handlers or none at all.
pub fn fork() -> io::Result<Forked> {
    use nix::sys::signal::{sigprocmask, SigSet, SigmaskHow};
    let mut old = SigSet::empty();
    sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::all()), Some(&mut old)).map_err(io::Error::from)?;
    // SAFETY: the supervisor never starts threads, so the child inherits no
    // lock held by another thread; the child only runs the worker and exits.
    let forked = unsafe { nix::unistd::fork() };
    match forked {
        Ok(nix::unistd::ForkResult::Parent { child }) => {
            let _ = sigprocmask(SigmaskHow::SIG_SETMASK, Some(&old), None);
            Ok(Forked::Parent(child.as_raw()))
        }
        Ok(nix::unistd::ForkResult::Child) => Ok(Forked::Child),
        Err(e) => {
            let _ = sigprocmask(SigmaskHow::SIG_SETMASK, Some(&old), None);
            Err(io::Error::from(e))
        }
    }
}

/// Unblock every signal (a forked child, once its handlers are installed).
pub fn unblock_signals() -> io::Result<()> {
    use nix::sys::signal::{sigprocmask, SigSet, SigmaskHow};
    sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None).map_err(io::Error::from)
}

/// Map `len` bytes of zeroed memory shared with every process forked later.
///
/// The mapping is never unmapped: it lives as long as the process, which is
/// what lets [`crate::shm`] hand out a `&'static` view of it.
pub fn map_shared_anonymous(len: usize) -> io::Result<*mut u8> {
    use nix::sys::mman::{mmap_anonymous, MapFlags, ProtFlags};
    let len =
        std::num::NonZeroUsize::new(len).ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "empty mapping"))?;
    // SAFETY: an anonymous mapping at a kernel-chosen address aliases no
    // existing Rust object; the kernel zero-fills it.
    let ptr = unsafe { mmap_anonymous(None, len, ProtFlags::PROT_READ | ProtFlags::PROT_WRITE, MapFlags::MAP_SHARED) }
        .map_err(io::Error::from)?;
    Ok(ptr.as_ptr().cast())
}

/// Ask the kernel to send `SIGTERM` to this process when its parent dies,
/// then check the parent did not die before the request took effect.
pub fn die_with_parent(expected_parent: i32) -> io::Result<()> {
    // SAFETY: prctl(PR_SET_PDEATHSIG) takes plain integers and touches no memory.
    let rc = unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM as libc::c_ulong, 0, 0, 0) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    if nix::unistd::getppid().as_raw() != expected_parent {
        return Err(io::Error::other("parent exited during start-up"));
    }
    Ok(())
}

/// Close every descriptor of this process except stdin, stdout, stderr and `keep`.
///
/// Called in a freshly forked worker so it does not hold the supervisor's
/// poll, signal pipe or other slots' listening sockets. The objects that owned
/// those descriptors in the parent are never dropped in the child (it exits
/// with [`std::process::exit`]), so nothing closes them a second time.
pub fn close_inherited_fds(keep: &[RawFd]) {
    let fds: Vec<RawFd> = match std::fs::read_dir("/proc/self/fd") {
        Ok(dir) => {
            dir.filter_map(|e| e.ok()).filter_map(|e| e.file_name().to_str().and_then(|s| s.parse().ok())).collect()
        }
        Err(_) => return,
    };
    for fd in fds {
        if fd > 2 && !keep.contains(&fd) {
            // The read_dir descriptor itself is already closed; EBADF is harmless.
            let _ = nix::unistd::close(fd);
        }
    }
}

/// Resident set size of `pid` in bytes, from `/proc/<pid>/statm`.
pub fn rss_bytes(pid: i32) -> io::Result<u64> {
    let statm = std::fs::read_to_string(format!("/proc/{pid}/statm"))?;
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| io::Error::other("unreadable statm"))?;
    Ok(pages * page_size())
}

/// Descriptors `pid` has open: the entries of `/proc/<pid>/fd`.
pub fn open_fds(pid: i32) -> io::Result<u64> {
    Ok(std::fs::read_dir(format!("/proc/{pid}/fd"))?.count() as u64)
}

/// CPU time `pid` has used, user and system, in seconds, from `/proc/<pid>/stat`.
pub fn cpu_seconds(pid: i32) -> io::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // SAFETY: sysconf takes an integer and returns an integer.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    cpu_seconds_of(&stat, if ticks > 0 { ticks as f64 } else { 100.0 })
        .ok_or_else(|| io::Error::other("unreadable stat"))
}

/// `utime + stime` of a `/proc/<pid>/stat` line, in seconds at `ticks` per second. The
/// command name (field 2, in parentheses) may hold spaces and parentheses: the fields are
/// counted from the last `)`.
fn cpu_seconds_of(stat: &str, ticks: f64) -> Option<f64> {
    let (_, rest) = stat.rsplit_once(')')?;
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some((utime + stime) as f64 / ticks)
}

/// The system page size.
pub fn page_size() -> u64 {
    // SAFETY: sysconf takes an integer and returns an integer.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if n > 0 {
        n as u64
    } else {
        4096
    }
}

/// Milliseconds on the monotonic clock, comparable between processes of one boot.
pub fn monotonic_ms() -> u64 {
    match nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC) {
        Ok(ts) => ts.tv_sec() as u64 * 1000 + ts.tv_nsec() as u64 / 1_000_000,
        Err(_) => 0,
    }
}

/// Send `sig` to `pid`; a process that is already gone is not an error.
pub fn kill(pid: i32, sig: nix::sys::signal::Signal) {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig);
}

/// Whether process `pid` still exists (a zombie counts until its parent reaps it).
pub fn alive(pid: i32) -> bool {
    !matches!(nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None), Err(nix::errno::Errno::ESRCH))
}

/// Take ownership of an inherited listening socket by descriptor number.
///
/// Only for a freshly forked worker: `fd` must be a listening TCP socket the
/// parent created and this process now owns exclusively (the parent's object
/// for it is never dropped in the child).
pub fn listener_from_fd(fd: RawFd) -> std::net::TcpListener {
    use std::os::fd::FromRawFd;
    // SAFETY: per the contract above, `fd` is open, is a TCP listener and has
    // no other owner in this process.
    unsafe { std::net::TcpListener::from_raw_fd(fd) }
}

/// Lower the calling thread's scheduling priority to `nice` (Linux nice
/// values are per thread). Pool threads run CPU-heavy work such as password
/// hashing; at a higher nice value the event loop, when it wakes, preempts
/// them instead of queueing behind them.
pub fn lower_thread_priority(nice: i32) -> io::Result<()> {
    // SAFETY: gettid and setpriority take and return plain integers.
    let rc = unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::setpriority(libc::PRIO_PROCESS, tid, nice)
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Move the calling thread to `SCHED_IDLE`: it runs only when no normal
/// thread wants the CPU, and a waking normal thread preempts it at once.
pub fn idle_thread_policy() -> io::Result<()> {
    // SAFETY: sched_setscheduler reads the param struct we pass and keeps no pointer.
    let rc = unsafe {
        let param = libc::sched_param { sched_priority: 0 };
        libc::sched_setscheduler(0, libc::SCHED_IDLE, &param)
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The mmap threshold the supervisor and its workers fix ([`fix_mmap_threshold`]).
pub const MMAP_THRESHOLD: usize = 1 << 20;

/// Fix glibc's mmap threshold at `bytes`: larger allocations are always their
/// own mapping and go back to the kernel when freed, and a thread's arena gives
/// its free top back as chunks are freed. (By default the threshold, and with it
/// the trim threshold, rises after the first large free: later large buffers,
/// such as argon2's working memory, then stay in the allocator's arenas for
/// good, and a finished thread's arena keeps its free top, which `malloc_trim`
/// does not return for arenas other than the main one.)
pub fn fix_mmap_threshold(bytes: usize) {
    let bytes = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
    // SAFETY: mallopt changes allocator tuning; it is called before any other
    // thread of this process exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, bytes);
    }
}

/// Return the allocator's free memory to the kernel (glibc `malloc_trim`).
/// The supervisor calls it after start-up work (migrations) it will not repeat.
pub fn trim_heap() {
    // SAFETY: malloc_trim only releases free heap pages; it touches no live allocation.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Descriptors handed over through `LISTEN_FDS` (systemd socket activation,
/// or the previous supervisor during a binary upgrade), from fd 3, each with
/// its name from `LISTEN_FDNAMES` (empty when unnamed). The variables are
/// removed so that no child sees them; nothing is returned when they are
/// absent or name another process in `LISTEN_PID`. Call once, at start,
/// before any thread exists.
pub fn take_listen_fds() -> Vec<(RawFd, String)> {
    let n = std::env::var("LISTEN_FDS").ok().and_then(|v| v.parse::<i32>().ok()).unwrap_or(0);
    let ours = std::env::var("LISTEN_PID").map_or(true, |p| p.parse::<u32>().ok() == Some(std::process::id()));
    let names: Vec<String> =
        std::env::var("LISTEN_FDNAMES").map(|v| v.split(':').map(str::to_string).collect()).unwrap_or_default();
    for k in ["LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES"] {
        std::env::remove_var(k);
    }
    if !ours || n <= 0 {
        return Vec::new();
    }
    (0..n.min(256))
        .map(|i| {
            let fd = 3 + i;
            // Not for the workers or anything this process executes.
            let _ = nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC));
            (fd, names.get(i as usize).cloned().unwrap_or_default())
        })
        .collect()
}

/// Take ownership of an inherited descriptor (from [`take_listen_fds`]) as a file.
pub fn file_from_fd(fd: RawFd) -> std::fs::File {
    use std::os::fd::FromRawFd;
    // SAFETY: `fd` came from `take_listen_fds`: open, handed to this process
    // for it to own, and adopted once.
    unsafe { std::fs::File::from_raw_fd(fd) }
}

/// In a freshly forked child of the (single-threaded) supervisor: execute
/// `exe` with `args`, handing `fds` over as `LISTEN_FDS` from fd 3 with the
/// given names, every other descriptor closed. Returns only on failure.
pub fn exec_with_fds(exe: &std::path::Path, args: &[std::ffi::OsString], fds: &[(RawFd, &str)]) -> io::Error {
    use nix::fcntl::{fcntl, FcntlArg};
    use std::os::unix::process::CommandExt;
    // Move every descriptor out of the way first, so that placing one at 3+i
    // never overwrites another still to be placed.
    let mut high = Vec::with_capacity(fds.len());
    for (fd, _) in fds {
        match fcntl(*fd, FcntlArg::F_DUPFD_CLOEXEC(1000)) {
            Ok(h) => high.push(h),
            Err(e) => return e.into(),
        }
    }
    let mut keep = Vec::with_capacity(fds.len());
    for (i, h) in high.iter().enumerate() {
        let target = 3 + i as RawFd;
        // dup2 clears close-on-exec on the new descriptor: it survives the exec.
        if let Err(e) = nix::unistd::dup2(*h, target) {
            return e.into();
        }
        keep.push(target);
    }
    close_inherited_fds(&keep);
    let names: Vec<&str> = fds.iter().map(|(_, n)| *n).collect();
    std::process::Command::new(exe)
        .args(args.iter().skip(1))
        .env("LISTEN_FDS", fds.len().to_string())
        .env("LISTEN_PID", std::process::id().to_string())
        .env("LISTEN_FDNAMES", names.join(":"))
        .exec()
}

/// Drop this process's resident pages of its own executable code. The
/// supervisor calls it once its start-up work (config, migrations: most of
/// the code it will ever run) is done: afterwards its loop touches a few
/// pages, which fault back in from the page cache, and the workers it forks
/// start with none of them resident and map in only the code they run, so a
/// worker's RSS counts its own heap and the code it uses. Only the executable,
/// non-writable mappings of the binary are touched: code is never modified
/// after loading. (Read-only data is not: with RELRO, relocated pointers live
/// in read-only private pages whose file copy is not what the process holds.)
pub fn drop_code_pages() {
    let Ok(exe) = std::fs::read_link("/proc/self/exe") else { return };
    for_each_mapping(|start, len, perms, path| {
        if perms.contains('w') || !perms.contains('x') || path != exe.to_str() {
            return;
        }
        // SAFETY: an executable, non-writable private mapping of the binary
        // (its code), as the kernel lists it: MADV_DONTNEED only discards the
        // resident copies, which the next access reads back from the file
        // unchanged, since code pages are never written.
        unsafe {
            libc::madvise(start as *mut libc::c_void, len, libc::MADV_DONTNEED);
        }
    });
}

/// Call `f(start, len, perms, path)` for each mapping in `/proc/self/maps`.
fn for_each_mapping(mut f: impl FnMut(usize, usize, &str, Option<&str>)) {
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else { return };
    for line in maps.lines() {
        let mut fields = line.split_whitespace();
        let (Some(range), Some(perms)) = (fields.next(), fields.next()) else { continue };
        let path = fields.nth(3);
        let Some((start, end)) = range.split_once('-') else { continue };
        let (Ok(start), Ok(end)) = (usize::from_str_radix(start, 16), usize::from_str_radix(end, 16)) else { continue };
        f(start, end.saturating_sub(start), perms, path);
    }
}

/// Rss in KiB of this process's mapping that starts at `start` (from
/// `/proc/self/smaps`): what tests use to see which pages a call touched.
#[cfg(test)]
pub(crate) fn mapping_rss_kib(start: usize) -> u64 {
    let smaps = std::fs::read_to_string("/proc/self/smaps").expect("smaps");
    let head = format!("{start:x}-");
    let mut lines = smaps.lines().skip_while(|l| !l.starts_with(&head));
    lines.next().expect("the mapping is listed");
    lines.find(|l| l.starts_with("Rss:")).and_then(|l| l.split_whitespace().nth(1)?.parse().ok()).expect("Rss")
}

#[cfg(test)]
mod tests {
    #[test]
    fn cpu_time_is_counted_from_the_last_parenthesis() {
        let stat = "4242 (a (b) c) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 1 0 12 0 0";
        assert_eq!(super::cpu_seconds_of(stat, 100.0), Some(3.0));
        assert_eq!(super::cpu_seconds_of("4242 (x) S 1", 100.0), None);
        let me = std::process::id() as i32;
        assert!(super::cpu_seconds(me).is_ok() && super::open_fds(me).unwrap_or(0) >= 3);
    }
}
