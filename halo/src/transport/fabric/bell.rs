//! The doorbell of `block` between ranks on one host: a futex word in shared memory.

use super::CResult;
use std::ffi::{c_int, c_long, c_void};
use std::ptr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// The futex system call, on the targets bells are used on (elsewhere: no bell, and
/// `block` sleeps bounded as `sleep` does).
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
const SYS_FUTEX: Option<c_long> = Some(libc::SYS_futex);
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
const SYS_FUTEX: Option<c_long> = None;

/// A bell's word: the owner sleeps (or is about to).
const ASLEEP: u32 = 1;
/// A bell's word: the owner is awake, or was rung.
const AWAKE: u32 = 0;
/// Bytes mapped per bell (one page).
const BELL_LEN: usize = 4096;

/// A doorbell for `block` between ranks on one host: one futex word in a small
/// shared-memory file of its owner's. `shm` (libfabric 1.17) has no wait object, so a
/// rank that waits for same-host peers marks its word [`ASLEEP`] and sleeps on it
/// (bounded); a peer that hands it something — a send posted, or one of its sends
/// received (its completion may be what the owner waits for) — wakes it if the word
/// says it sleeps. A ring costs one shared load when the owner is awake. Only a hint:
/// every sleep is bounded, so a lost ring delays, never hangs.
pub(super) struct Bell {
    base: *mut c_void,
    /// The file, for the owner's bell (removed on drop).
    own: Option<std::path::PathBuf>,
}

impl std::fmt::Debug for Bell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bell").field("own", &self.own).finish()
    }
}

impl Bell {
    /// Creates this rank's bell, `/dev/shm/halo-bell-NS-PID-N-TAG` (PID namespace,
    /// process, count, 64 random bits), private to this user (mode 0600, `O_EXCL`,
    /// `O_NOFOLLOW`: `sys::create_private`), after removing the files of this user's
    /// processes of this namespace that ended without removing theirs (killed); `None`
    /// (no bell: bounded sleeps) when that fails.
    pub(super) fn create() -> Option<Bell> {
        SYS_FUTEX?;
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let ns: String = std::fs::read_link("/proc/self/ns/pid")
            .map(|l| {
                l.to_string_lossy()
                    .chars()
                    .filter(char::is_ascii_digit)
                    .collect()
            })
            .unwrap_or_default();
        let prefix = format!("halo-bell-{ns}-");
        if let Ok(dir) = std::fs::read_dir("/dev/shm") {
            for entry in dir.flatten() {
                let name = entry.file_name();
                let Some(pid) = name
                    .to_str()
                    .and_then(|n| n.strip_prefix(&prefix))
                    .and_then(|rest| rest.split('-').next())
                    .and_then(|pid| pid.parse::<u32>().ok())
                else {
                    continue;
                };
                if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
                    crate::transport::sys::remove_own_file(&entry.path());
                }
            }
        }
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let tag = crate::transport::sys::random_tag().ok()?;
        let path =
            std::path::PathBuf::from(format!("/dev/shm/{prefix}{}-{n}-{tag}", std::process::id()));
        let f = crate::transport::sys::create_private(&path).ok()?;
        let bell = f
            .set_len(BELL_LEN as u64)
            .ok()
            .and_then(|()| Bell::map(&f, Some(path.clone())));
        if bell.is_none() {
            let _ = std::fs::remove_file(&path);
        }
        bell
    }

    /// Maps a peer's bell.
    pub(super) fn open(path: &str) -> Option<Bell> {
        SYS_FUTEX?;
        if !crate::transport::sys::is_shared_name(path, "halo-bell-") {
            return None;
        }
        let f = crate::transport::sys::open_shared(std::path::Path::new(path)).ok()?;
        if f.metadata().ok()?.len() < BELL_LEN as u64 {
            return None;
        }
        Bell::map(&f, None)
    }

    fn map(f: &std::fs::File, own: Option<std::path::PathBuf>) -> Option<Bell> {
        use std::os::fd::AsRawFd as _;
        // SAFETY: a fresh shared mapping of BELL_LEN bytes of a file at least that
        // long; the result is checked against MAP_FAILED before use.
        let base = unsafe {
            libc::mmap(
                ptr::null_mut(),
                BELL_LEN,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED || base.is_null() {
            return None;
        }
        Some(Bell { base, own })
    }

    pub(super) fn path(&self) -> Option<String> {
        self.own.as_ref().map(|p| p.to_string_lossy().into_owned())
    }

    fn word(&self) -> &AtomicU32 {
        // SAFETY: the mapping is page-aligned, BELL_LEN bytes long and lives as long
        // as `self`; other processes access the word only atomically.
        unsafe { &*self.base.cast::<AtomicU32>() }
    }

    /// Wakes the owner if it sleeps.
    pub(super) fn ring(&self) {
        let w = self.word();
        if w.load(Ordering::SeqCst) == ASLEEP
            && w.swap(AWAKE, Ordering::SeqCst) == ASLEEP
            && let Some(nr) = SYS_FUTEX
        {
            // SAFETY: FUTEX_WAKE on a valid, aligned, shared u32; no other arguments
            // are read.
            unsafe { libc::syscall(nr, self.base, libc::FUTEX_WAKE, 1 as c_int) };
        }
    }

    /// Marks the owner asleep; then, unless `anything` finds work, sleeps until rung
    /// or `timeout` passes.
    pub(super) fn sleep(
        &self,
        timeout: Duration,
        anything: impl FnOnce() -> CResult<bool>,
    ) -> CResult<()> {
        let w = self.word();
        w.store(ASLEEP, Ordering::SeqCst);
        // A peer that handed something over before the store did not ring: look once
        // more after it (SeqCst on both sides: either the peer sees ASLEEP or this
        // look sees what the peer handed over).
        let found = anything();
        if matches!(found, Ok(false))
            && let Some(nr) = SYS_FUTEX
        {
            let ts = libc::timespec {
                tv_sec: timeout.as_secs() as libc::time_t,
                tv_nsec: c_long::from(timeout.subsec_nanos() as i32),
            };
            // SAFETY: FUTEX_WAIT on a valid, aligned, shared u32 with a valid relative
            // timeout; it returns at once if the word is no longer ASLEEP.
            unsafe {
                libc::syscall(
                    nr,
                    self.base,
                    libc::FUTEX_WAIT,
                    ASLEEP as c_int,
                    &ts as *const libc::timespec,
                )
            };
        }
        w.store(AWAKE, Ordering::SeqCst);
        found.map(|_| ())
    }
}

impl Drop for Bell {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, unmapped once.
        unsafe { libc::munmap(self.base, BELL_LEN) };
        if let Some(p) = &self.own {
            let _ = std::fs::remove_file(p);
        }
    }
}
