//! The doorbell of `block` between ranks on one host: a futex word
//! ([`crate::host::futex`]) in a shared-memory file of its owner's
//! ([`crate::host::files`]).

use super::CResult;
use crate::host::files::{self, Kind};
use crate::host::futex::{Futex, SUPPORTED};
use std::ffi::c_void;
use std::ptr;
use std::time::Duration;

/// Bytes mapped per bell (one page).
const BELL_LEN: usize = 4096;

/// A doorbell for `block` between ranks on one host: one futex word in a small
/// shared-memory file of its owner's. `shm` (libfabric 1.17) has no wait object, so a
/// rank that waits for same-host peers marks its word asleep and sleeps on it
/// (bounded); a peer that hands it something — a send posted, or one of its sends
/// received (its completion may be what the owner waits for) — wakes it if the word
/// says it sleeps. A ring costs one shared load when the owner is awake. Only a hint:
/// every sleep is bounded, so a lost ring delays, never hangs. On targets without
/// bells ([`SUPPORTED`]) there is none, and `block` sleeps bounded as `sleep` does.
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
    /// `O_NOFOLLOW`: `files::create_private`), after removing the files of this user's
    /// processes of this namespace that ended without removing theirs (killed:
    /// `files::new_path`); `None` (no bell: bounded sleeps) when that fails.
    pub(super) fn create() -> Option<Bell> {
        if !SUPPORTED {
            return None;
        }
        let path = files::new_path(Kind::Bell).ok()?;
        let f = files::create_private(&path).ok()?;
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
        if !SUPPORTED || !files::is_shared_name(path, Kind::Bell) {
            return None;
        }
        let f = files::open_shared(std::path::Path::new(path)).ok()?;
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

    fn word(&self) -> &Futex {
        // SAFETY: the mapping is page-aligned, BELL_LEN bytes long and lives as long
        // as `self`; other processes access the word only atomically (a `Futex` is
        // an `AtomicU32`).
        unsafe { &*self.base.cast::<Futex>() }
    }

    /// Wakes the owner if it sleeps.
    pub(super) fn ring(&self) {
        self.word().ring();
    }

    /// Marks the owner asleep; then, unless `anything` finds work, sleeps until rung
    /// or `timeout` passes.
    pub(super) fn sleep(
        &self,
        timeout: Duration,
        anything: impl FnOnce() -> CResult<bool>,
    ) -> CResult<()> {
        self.word().sleep(timeout, anything)
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
