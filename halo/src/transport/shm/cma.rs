//! Cross-memory attach: large messages copied once, by the receiver, straight out of
//! the sender's buffer with `process_vm_readv` (a *rendezvous*).
//!
//! # Protocol
//! A send of at least [`CmaConfig::min`] bytes to a peer that can read this process's
//! memory publishes one cell of kind [`KIND_RDV`](super::segment::KIND_RDV) whose
//! payload is a [`Rdv`](super::segment::Rdv): the buffer's address and a state word,
//! [`OFFERED`]. The receiver takes the cell in ring order (whether or not the receive
//! is posted: without one it pulls into memory of its own, as the ring path does, so
//! a ring never waits for a receive), moves the state to [`CLAIMED`], reads the bytes
//! with one `process_vm_readv`, and moves it to [`DONE`] — the *ack* — before it frees
//! the cell. The send completes only when the sender sees `DONE`; until then the
//! caller's buffer stays borrowed by the session, as every send's is.
//!
//! A session that ends with a rendezvous not acked (its collective failed, timed out
//! or was aborted) moves the state to [`REVOKED`] without waiting. A receiver that
//! finds `REVOKED` before its read does not read; one that finds it after (its move to
//! `DONE` fails) drops what it read: either way the receive fails with an error naming
//! the sender, never with bytes the caller may already have changed. A read that fails
//! ([`FAILED`]) fails the receive and, through the state word, the send.
//!
//! # When it is used
//! Each receiver probes once per peer at set-up: it reads a 64-bit random word from
//! the peer's process at the address the peer published in its bell (with its pid and
//! PID namespace), and compares it with the value published next to it. Only a peer
//! whose word it read back gets [`CMA_OK`] in the ring from that peer, and only then
//! does that peer send rendezvous cells on it. So `ptrace` rules
//! (`/proc/sys/kernel/yama/ptrace_scope`, another user, no `CAP_SYS_PTRACE` in a
//! container, a seccomp filter, another PID namespace) turn it off per pair, with one
//! `tracing` info line, and messages take the ring. `HALO_SHM_CMA=0` turns it off,
//! `HALO_SHM_CMA=1` requires it (initialisation fails when a peer cannot be read);
//! `HALO_SHM_CMA_MIN` (bytes, default [`MIN_DEFAULT`]) is the threshold.
//!
//! A pid only names the sender while it lives: the receiver's read of a sender that
//! ended fails (`ESRCH`, its memory is gone), and so that a pid reused by another
//! process can never pass for the sender, the receiver holds a pidfd of each peer
//! (opened before the probe) and, after every read, checks that the peer has not
//! exited: if it had, the bytes are dropped and the receive fails naming it. (Without
//! pidfds, Linux before 5.3, that check is skipped: a reuse would need the pid counter
//! to wrap, `pid_max`, within the read.)

use crate::error::{Error, Result};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

/// A rendezvous offered by the sender, not yet taken.
pub(super) const OFFERED: u64 = 1;
/// The receiver is reading.
pub(super) const CLAIMED: u64 = 2;
/// The receiver has read every byte: the send is complete (the ack).
pub(super) const DONE: u64 = 3;
/// The sender withdrew it (its session ended first); the bytes must not be used.
pub(super) const REVOKED: u64 = 4;
/// The receiver's read failed.
pub(super) const FAILED: u64 = 5;

/// A ring's CMA word (written by the receiver): not probed yet.
pub(super) const CMA_UNKNOWN: u32 = 0;
/// The receiver can read the sender's memory.
pub(super) const CMA_OK: u32 = 1;
/// It cannot (or CMA is off): the ring path.
pub(super) const CMA_NO: u32 = 2;

/// Default threshold of a rendezvous, bytes (`HALO_SHM_CMA_MIN`).
pub(super) const MIN_DEFAULT: usize = 32 * 1024;

/// `HALO_SHM_CMA`: whether cross-memory attach is used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CmaMode {
    /// Where the probe succeeds (the default).
    Auto,
    /// Never.
    Off,
    /// Always; initialisation fails where the probe does not succeed.
    Required,
}

/// The transport's CMA settings.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CmaConfig {
    pub(super) mode: CmaMode,
    /// Sends of at least this many bytes go by rendezvous.
    pub(super) min: usize,
}

impl CmaConfig {
    /// From `HALO_SHM_CMA` and `HALO_SHM_CMA_MIN`.
    pub(super) fn from_env() -> Result<CmaConfig> {
        let mode = match halo_params::SHM_CMA.raw().ok_or(()) {
            Err(_) => CmaMode::Auto,
            Ok(v) => match v.trim() {
                "" | "auto" => CmaMode::Auto,
                "0" | "off" => CmaMode::Off,
                "1" | "on" => CmaMode::Required,
                other => {
                    return Err(Error::invalid_argument(format!(
                        "HALO_SHM_CMA={other:?}: expected 0 (off), 1 (required) or auto"
                    )));
                }
            },
        };
        let min = halo_params::SHM_CMA_MIN
            .number()
            .map_err(|e| Error::invalid_argument(e.to_string()))?
            .map_or(MIN_DEFAULT, |m| usize::try_from(m).unwrap_or(usize::MAX));
        Ok(CmaConfig {
            mode,
            min: min.max(1),
        })
    }
}

/// The word peers read to probe this process (its value is published next to its
/// address); 0 until [`probe_word`] first runs.
static PROBE: AtomicU64 = AtomicU64::new(0);

/// This process's probe word: (its address, its value), a random non-zero value.
pub(super) fn probe_word() -> (u64, u64) {
    let mut v = PROBE.load(Ordering::Acquire);
    if v == 0 {
        let mut r = [0u8; 8];
        // SAFETY: getrandom writes at most `r.len()` bytes into `r`.
        let n = unsafe { libc::getrandom(r.as_mut_ptr().cast(), r.len(), 0) };
        let mut x = u64::from_ne_bytes(r);
        if n != 8 {
            // Not secret, only unlikely to be found by chance in another process.
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            x = t ^ (u64::from(std::process::id()) << 32) ^ 0x9e37_79b9_7f4a_7c15;
        }
        let x = x | 1;
        v = match PROBE.compare_exchange(0, x, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => x,
            Err(cur) => cur,
        };
    }
    (PROBE.as_ptr() as u64, v)
}

/// This process's PID namespace (its inode), 0 if unknown.
pub(super) fn pid_ns_ino() -> u64 {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::metadata("/proc/self/ns/pid").map_or(0, |m| m.ino())
}

/// `/proc/sys/kernel/yama/ptrace_scope`, for the log line (`None` without Yama).
pub(super) fn ptrace_scope() -> Option<u8> {
    std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope")
        .ok()
        .and_then(|s| s.trim().parse().ok())
}

/// Reads `len` bytes at `remote` in process `pid` into `local` with
/// `process_vm_readv` (repeated while it returns short counts).
///
/// # Safety
/// `local .. local + len` must be writable memory of this process that nothing else
/// reads or writes meanwhile.
pub(super) unsafe fn read_from(
    pid: u32,
    local: *mut u8,
    remote: u64,
    len: usize,
) -> io::Result<()> {
    let mut done = 0usize;
    while done < len {
        let l = libc::iovec {
            // SAFETY: `done < len`: inside the caller's region.
            iov_base: unsafe { local.add(done) }.cast(),
            iov_len: len - done,
        };
        let r = libc::iovec {
            iov_base: (remote + done as u64) as *mut libc::c_void,
            iov_len: len - done,
        };
        // SAFETY: one local iovec over memory the caller guarantees writable and
        // unshared; the remote iovec is only dereferenced by the kernel, in the other
        // process, which checks it (EFAULT).
        let n = unsafe { libc::process_vm_readv(pid as libc::pid_t, &l, 1, &r, 1, 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "process_vm_readv read nothing",
            ));
        }
        done += n as usize;
    }
    Ok(())
}

/// Whether this process can read `pid`'s probe word at `addr` and finds `want` there.
pub(super) fn probe(pid: u32, addr: u64, want: u64) -> std::result::Result<(), String> {
    if pid == 0 || addr == 0 || want == 0 {
        return Err("the peer published no probe word".into());
    }
    let mut got = 0u64;
    // SAFETY: `got` is 8 writable bytes of this frame, unshared.
    match unsafe { read_from(pid, (&raw mut got).cast(), addr, 8) } {
        Ok(()) if got == want => Ok(()),
        Ok(()) => Err(format!("process {pid} is not the peer (its word differs)")),
        Err(e) => Err(format!("process_vm_readv of process {pid}: {e}")),
    }
}

/// A pidfd of process `pid` (`None` where the kernel has none, or `pid` is gone).
pub(super) fn pidfd(pid: u32) -> Option<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd as _;
    // SAFETY: pidfd_open takes a pid and flags, returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: a descriptor just returned by the kernel, owned by nobody else.
    Some(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) })
}

/// Whether the process of `fd` (a pidfd) has exited: readable, without waiting.
pub(super) fn exited(fd: &std::os::fd::OwnedFd) -> bool {
    use std::os::fd::AsRawFd as _;
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, zero timeout.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    n > 0 && p.revents & libc::POLLIN != 0
}
