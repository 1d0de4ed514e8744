//! Programs that choose which socket of a `SO_REUSEPORT` group receives a new connection
//! or datagram: attaching a classic BPF program ([`attach_classic`]) and loading and
//! attaching the eBPF round-robin one ([`attach_round_robin`]).
//!
//! The kernel runs a group's program for every new connection (TCP: its SYN) or datagram
//! (UDP) and uses what it returns as an index into the group, sockets numbered in the
//! order they joined it; an index past the group's end makes it fall back to its hash of
//! the addresses and ports. This module knows sockets and programs, not slots or protocols.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// `bpf(2)` commands and constants used here (`linux/bpf.h`).
const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_MAP_TYPE_ARRAY: u32 = 2;
const BPF_PROG_TYPE_SOCKET_FILTER: u32 = 1;
const BPF_PSEUDO_MAP_FD: u8 = 1;
const BPF_FUNC_MAP_LOOKUP_ELEM: i32 = 1;

/// The first fields of `union bpf_attr` for `BPF_MAP_CREATE` (the kernel takes a shorter
/// attribute as the longer one with zeros after it).
#[repr(C)]
#[derive(Default)]
struct MapCreate {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
}

/// The first fields of `union bpf_attr` for `BPF_PROG_LOAD`.
#[repr(C)]
#[derive(Default)]
struct ProgLoad {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
}

/// One eBPF instruction (`struct bpf_insn`): opcode, destination and source registers
/// (4 bits each, destination low), offset, immediate.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Insn {
    code: u8,
    regs: u8,
    off: i16,
    imm: i32,
}

const fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn { code, regs: (src << 4) | dst, off, imm }
}

/// The round-robin program for a group of `n` sockets, `map_fd` being a one-entry array of
/// `u32` (the counter):
///
/// ```text
/// key = 0; value = map_lookup_elem(map, &key)
/// if value == NULL: return u32::MAX            (past any group: the kernel's hash)
/// return atomic_fetch_add(value, 1) % n
/// ```
pub fn round_robin_program(map_fd: i32, n: u32) -> [Insn; 14] {
    const R0: u8 = 0;
    const R1: u8 = 1;
    const R2: u8 = 2;
    const R10: u8 = 10;
    [
        /* 0 */ insn(0x62, R10, 0, -4, 0), // *(u32 *)(r10 - 4) = 0     (BPF_ST | BPF_MEM | BPF_W)
        /* 1 */ insn(0xbf, R2, R10, 0, 0), // r2 = r10                  (BPF_ALU64 | BPF_MOV | BPF_X)
        /* 2 */ insn(0x07, R2, 0, 0, -4), // r2 += -4                   (BPF_ALU64 | BPF_ADD | BPF_K)
        /* 3 */ insn(0x18, R1, BPF_PSEUDO_MAP_FD, 0, map_fd), // r1 = map (BPF_LD | BPF_DW | BPF_IMM)
        /* 4 */ insn(0, 0, 0, 0, 0), //                                  (its upper half)
        /* 5 */ insn(0x85, 0, 0, 0, BPF_FUNC_MAP_LOOKUP_ELEM), // call   (BPF_JMP | BPF_CALL)
        /* 6 */ insn(0x15, R0, 0, 5, 0), // if r0 == 0 goto 12          (BPF_JMP | BPF_JEQ | BPF_K)
        /* 7 */ insn(0xb7, R1, 0, 0, 1), // r1 = 1                      (BPF_ALU64 | BPF_MOV | BPF_K)
        /* 8 */
        insn(0xc3, R0, R1, 0, 0x01), // r1 = fetch_add32(*r0, r1) (BPF_STX | BPF_ATOMIC | BPF_W, BPF_ADD | BPF_FETCH)
        /* 9 */ insn(0x94, R1, 0, 0, n as i32), // w1 %= n              (BPF_ALU | BPF_MOD | BPF_K)
        /* 10 */ insn(0xbc, R0, R1, 0, 0), // w0 = w1                   (BPF_ALU | BPF_MOV | BPF_X)
        /* 11 */ insn(0x95, 0, 0, 0, 0), // exit
        /* 12 */ insn(0xb4, R0, 0, 0, -1), // w0 = u32::MAX             (BPF_ALU | BPF_MOV | BPF_K)
        /* 13 */ insn(0x95, 0, 0, 0, 0), // exit
    ]
}

/// `bpf(cmd, attr)`: a new descriptor, or the error.
fn bpf<T>(cmd: libc::c_long, attr: &T) -> io::Result<OwnedFd> {
    // SAFETY: `attr` is a live, initialised `repr(C)` prefix of `union bpf_attr` of the
    // size passed; the kernel only reads it (and the memory its pointers name, which the
    // callers keep alive across the call).
    let fd = unsafe { libc::syscall(libc::SYS_bpf, cmd, std::ptr::from_ref(attr), std::mem::size_of::<T>()) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = i32::try_from(fd).map_err(|_| io::Error::other("bpf: descriptor out of range"))?;
    // SAFETY: the kernel just returned `fd`, a new descriptor nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `setsockopt(SOL_SOCKET, option, value)` for a plain-old-data `value`.
fn set_socket_option<T>(socket: &impl AsRawFd, option: libc::c_int, value: &T) -> io::Result<()> {
    // SAFETY: `value` points at a live `T` of the size passed; the kernel copies it.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            option,
            std::ptr::from_ref(value).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Attach a classic BPF `program` to the `SO_REUSEPORT` group of `socket` (any socket of
/// the group: the program is the group's, and sockets that join later inherit it). Fails
/// on kernels before 4.5.
pub fn attach_classic(socket: &impl AsRawFd, program: &[libc::sock_filter]) -> io::Result<()> {
    let len = u16::try_from(program.len()).map_err(|_| io::Error::other("classic BPF program too long"))?;
    let fprog = libc::sock_fprog { len, filter: program.as_ptr().cast_mut() };
    set_socket_option(socket, libc::SO_ATTACH_REUSEPORT_CBPF, &fprog)
}

/// Attach to the `SO_REUSEPORT` group of `socket` a program that gives each new
/// connection to the next of the group's first `n` sockets in turn (round robin), in
/// place of the kernel's hash, which may give one socket of two 60 of 100 connections
/// opened together. Loading an eBPF program takes `CAP_BPF` (or `CAP_SYS_ADMIN`) where
/// unprivileged BPF is off, as on most distributions, and a kernel of 5.12 or later (the
/// atomic fetch-and-add); without them it fails and the group keeps the hash.
pub fn attach_round_robin(socket: &impl AsRawFd, n: u32) -> io::Result<()> {
    if n == 0 {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "round robin over no sockets"));
    }
    let map = bpf(
        BPF_MAP_CREATE,
        &MapCreate { map_type: BPF_MAP_TYPE_ARRAY, key_size: 4, value_size: 4, max_entries: 1, map_flags: 0 },
    )?;
    let program = round_robin_program(map.as_raw_fd(), n);
    let license = c"GPL";
    let mut prog_name = [0u8; 16];
    prog_name[..8].copy_from_slice(b"forkd_rr");
    let prog = bpf(
        BPF_PROG_LOAD,
        &ProgLoad {
            prog_type: BPF_PROG_TYPE_SOCKET_FILTER,
            insn_cnt: program.len() as u32,
            insns: program.as_ptr() as u64,
            license: license.as_ptr() as u64,
            prog_name,
            ..ProgLoad::default()
        },
    )?;
    // The group holds the program, and the program its map: both descriptors close here.
    set_socket_option(socket, libc::SO_ATTACH_REUSEPORT_EBPF, &prog.as_raw_fd())
}

/// `SO_DETACH_REUSEPORT_BPF` where it is `asm-generic/socket.h`'s 68 (the libc crate does
/// not name it for Linux); `None` on the architectures that number it otherwise.
const SO_DETACH_REUSEPORT_BPF: Option<libc::c_int> = if cfg!(any(
    target_arch = "x86_64",
    target_arch = "x86",
    target_arch = "aarch64",
    target_arch = "arm",
    target_arch = "riscv64"
)) {
    Some(68)
} else {
    None
};

/// Take the program off `socket`'s `SO_REUSEPORT` group: the kernel's hash decides again.
/// Kernel 5.8 or later; `NotFound` when the group had none.
pub fn detach(socket: &impl AsRawFd) -> io::Result<()> {
    match SO_DETACH_REUSEPORT_BPF {
        Some(option) => set_socket_option(socket, option, &0i32),
        None => Err(io::Error::from(io::ErrorKind::Unsupported)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instructions_have_the_kernel_layout() {
        assert_eq!(std::mem::size_of::<Insn>(), 8);
        // r1 = map: the pseudo-map flag in the source register's nibble, the map in imm.
        let p = round_robin_program(7, 3);
        assert_eq!(p[3], Insn { code: 0x18, regs: 0x11, off: 0, imm: 7 });
        assert_eq!(p[9].imm, 3);
        // The jump to the fallback lands on it.
        assert_eq!(6 + 1 + p[6].off as usize, 12);
    }

    #[test]
    fn no_sockets_is_refused_before_the_kernel() {
        let s = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
        assert_eq!(attach_round_robin(&s, 0).map_err(|e| e.kind()), Err(io::ErrorKind::InvalidInput));
    }
}
