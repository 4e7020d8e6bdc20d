//! Crash signals: PSM's handlers removed, so that a crashing rank ends with its signal.

use super::cstr;
use std::ffi::{c_int, c_void};
use std::ptr;

/// Signals whose handler a PSM library may have installed (see [`restore_crash_signals`]).
const PSM_SIGNALS: [c_int; 7] = [
    libc::SIGSEGV,
    libc::SIGBUS,
    libc::SIGILL,
    libc::SIGABRT,
    libc::SIGFPE,
    libc::SIGINT,
    libc::SIGTERM,
];

/// Gives crashes their signal back: removes the signal handlers of Intel's PSM
/// libraries, so that a segfaulting rank ends with SIGSEGV (and `halo launch`, CI or a
/// scheduler see a crash), and no `NAME.80s-PID,HOST.btr` file is written into the
/// working directory.
///
/// libfabric 1.17 as packaged here links `libpsm_infinipath.so.1`, whose
/// `libinfinipath.so.4` installs, *in a constructor that runs when the library is
/// loaded* (before `main` for programs linked with libhalo), a handler for SIGSEGV,
/// SIGBUS, SIGILL, SIGABRT, SIGINT and SIGTERM that prints a backtrace, writes that
/// file and exits with status 1 (`libpsm2` does the same only with `HFI_BACKTRACE`
/// set). Found with `tests/crash_signal.rs`: `IPATH_NO_BACKTRACE` stops it only when
/// it is in the environment when the process starts (`halo launch` sets it for its
/// ranks; the Python package sets it before it loads libhalo); setting it later is
/// too late, and excluding the provider (`FI_PROVIDER=^psm`) changes nothing because
/// the library is linked, not loaded by the provider. So, once per process before the
/// first endpoint opens, every one of these signals whose handler lives in a PSM
/// library gets the default action back (the action it replaced is not reachable;
/// before `main` it was the default, unless the signal was ignored at `exec`).
pub(super) fn restore_crash_signals() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        for sig in PSM_SIGNALS {
            // SAFETY: struct sigaction is plain data; all zeros is a valid value.
            let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
            // SAFETY: with a null new action sigaction only reads the current one into
            // `old`, a valid struct sigaction.
            let read = unsafe { libc::sigaction(sig, ptr::null(), &mut old) };
            if read != 0 {
                continue;
            }
            let handler = old.sa_sigaction;
            if handler == libc::SIG_DFL || handler == libc::SIG_IGN {
                continue;
            }
            // SAFETY: Dl_info is plain data (pointers may be null); all zeros is valid.
            let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
            // SAFETY: dladdr only looks the address up in the loaded objects and fills
            // `info`; `dli_fname` is then NULL or a string owned by the dynamic loader,
            // valid while the object is loaded (it stays loaded).
            let found = unsafe { libc::dladdr(handler as *const c_void, &mut info) };
            if found == 0 || info.dli_fname.is_null() {
                continue;
            }
            let object = cstr(info.dli_fname);
            let file = object.rsplit('/').next().unwrap_or(&object);
            if !(file.starts_with("libinfinipath") || file.starts_with("libpsm")) {
                continue;
            }
            // SAFETY: a zeroed struct sigaction with SIG_DFL is the default disposition.
            let mut dfl: libc::sigaction = unsafe { std::mem::zeroed() };
            dfl.sa_sigaction = libc::SIG_DFL;
            // SAFETY: installs the default action for `sig`; `dfl` is a valid struct.
            let ret = unsafe { libc::sigaction(sig, &dfl, ptr::null_mut()) };
            if ret == 0 {
                tracing::debug!(signal = sig, library = file, "removed a PSM signal handler");
            }
        }
    });
}
