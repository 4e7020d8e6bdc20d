//! Result codes, their text, and the last-error messages.

use std::cell::RefCell;
use std::ffi::{CStr, CString, c_char};

/// The result of every HALO call. The numbers are stable and never reused; they are
/// NCCL's (`ncclResult_t`), so code that reads NCCL's results reads HALO's the same
/// way. `haloAborted` (9) is HALO's addition.
///
/// Functions return a `haloResult_t` (an `int32_t` holding one of these values):
/// `haloGetErrorString` turns it into text and `haloGetLastError` gives the message
/// of the failure itself.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum haloResult {
    /// The call succeeded.
    haloSuccess = 0,
    /// A device (GPU) runtime call failed (NCCL's `ncclUnhandledCudaError`).
    haloUnhandledDeviceError = 1,
    /// The operating system or a transport (libfabric, sockets) failed.
    haloSystemError = 2,
    /// A bug in HALO: an invariant did not hold, or a panic was caught at the boundary.
    haloInternalError = 3,
    /// An argument is wrong on this rank alone: a NULL pointer, a count that overflows,
    /// an unknown data type, a rank out of range, in-place buffers, a non-NULL stream.
    haloInvalidArgument = 4,
    /// The ranks disagree (a count rank a sends is not what rank b expects, another
    /// rank reported bad arguments), or the call is not allowed now (a communicator
    /// used by two threads at once).
    haloInvalidUsage = 5,
    /// A peer failed or went away.
    haloRemoteError = 6,
    /// A non-blocking operation has not finished yet.
    haloInProgress = 7,
    /// An operation did not finish within its timeout (`haloConfig_t.timeoutMs`,
    /// `HALO_TIMEOUT_MS`).
    haloTimeout = 8,
    /// The operation or the communicator was aborted (`haloCommAbort`).
    haloAborted = 9,
}

/// A `haloResult` value, as every HALO function returns it (an `int32_t`, so that its
/// size never depends on the compiler's choice for enums).
pub type haloResult_t = i32;

impl haloResult {
    /// Every code, in order.
    pub(crate) const ALL: [haloResult; 10] = [
        haloResult::haloSuccess,
        haloResult::haloUnhandledDeviceError,
        haloResult::haloSystemError,
        haloResult::haloInternalError,
        haloResult::haloInvalidArgument,
        haloResult::haloInvalidUsage,
        haloResult::haloRemoteError,
        haloResult::haloInProgress,
        haloResult::haloTimeout,
        haloResult::haloAborted,
    ];

    /// The code a Rust error maps to (`halo::Error::code` keeps the same numbers).
    pub(crate) fn from_code(code: i32) -> Option<haloResult> {
        usize::try_from(code)
            .ok()
            .and_then(|i| haloResult::ALL.get(i).copied())
    }

    /// The text `haloGetErrorString` returns.
    fn text(self) -> &'static CStr {
        match self {
            haloResult::haloSuccess => c"no error",
            haloResult::haloUnhandledDeviceError => {
                c"unhandled device error (haloGetLastError says which call failed)"
            }
            haloResult::haloSystemError => {
                c"system or transport error (haloGetLastError says what failed; HALO_DEBUG=info for more)"
            }
            haloResult::haloInternalError => {
                c"internal error: a bug in HALO, please report it with haloGetLastError's message"
            }
            haloResult::haloInvalidArgument => {
                c"invalid argument (haloGetLastError names the argument)"
            }
            haloResult::haloInvalidUsage => {
                c"invalid usage: the ranks disagree or the call is not allowed now (haloGetLastError says why)"
            }
            haloResult::haloRemoteError => c"a remote rank failed or went away",
            haloResult::haloInProgress => c"operation in progress",
            haloResult::haloTimeout => {
                c"operation timed out (haloGetLastError names the step and the peer)"
            }
            haloResult::haloAborted => c"operation or communicator aborted",
        }
    }
}

/// Why a call failed: its code and a message. The message is what
/// `haloGetLastError` returns, prefixed with the function's name.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Failure {
    pub(crate) code: haloResult,
    pub(crate) message: String,
}

impl Failure {
    pub(crate) fn new(code: haloResult, message: impl Into<String>) -> Failure {
        Failure {
            code,
            message: message.into(),
        }
    }

    /// `haloInvalidArgument` with a message.
    pub(crate) fn invalid(message: impl Into<String>) -> Failure {
        Failure::new(haloResult::haloInvalidArgument, message)
    }

    /// `haloInternalError` with a message.
    pub(crate) fn internal(message: impl Into<String>) -> Failure {
        Failure::new(haloResult::haloInternalError, message)
    }
}

impl From<halo_rs::Error> for Failure {
    fn from(e: halo_rs::Error) -> Failure {
        let code = haloResult::from_code(e.code()).unwrap_or(haloResult::haloInternalError);
        Failure::new(code, e.to_string())
    }
}

/// Result of the bodies of exported functions.
pub(crate) type FfiResult<T> = Result<T, Failure>;

/// A C string from a message: interior NUL bytes (which C cannot see past) become
/// spaces.
pub(crate) fn c_message(message: &str) -> CString {
    CString::new(message.replace('\0', " ")).unwrap_or_default()
}

thread_local! {
    /// The message of the last failed call on this thread.
    static THREAD_LAST: RefCell<CString> = RefCell::new(CString::default());
}

/// Records `message` as this thread's last error.
pub(crate) fn set_thread_error(message: &CString) {
    THREAD_LAST.with(|l| *l.borrow_mut() = message.clone());
}

/// This thread's last error; the pointer stays valid until the next failed HALO call
/// on this thread (the string lives in thread-local storage and is replaced, not
/// mutated, only by a failure on this thread).
pub(crate) fn thread_error_ptr() -> *const c_char {
    THREAD_LAST.with(|l| l.borrow().as_ptr())
}

/// Describes a result code.
///
/// Returns a static, NUL-terminated English description of `result` (never NULL; an
/// unknown value gives `"unknown result code"`). For the message of the failure
/// itself, call `haloGetLastError`. Thread-safe.
#[unsafe(no_mangle)]
pub extern "C" fn haloGetErrorString(result: haloResult_t) -> *const c_char {
    crate::boundary::or_value(
        c"internal error while describing a result code".as_ptr(),
        || {
            haloResult::from_code(result)
                .map(haloResult::text)
                .unwrap_or(c"unknown result code")
                .as_ptr()
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_match_the_rust_error_codes() {
        for (i, r) in haloResult::ALL.iter().enumerate() {
            assert_eq!(*r as i32, i as i32);
            assert_eq!(haloResult::from_code(i as i32), Some(*r));
        }
        assert_eq!(haloResult::from_code(-1), None);
        assert_eq!(haloResult::from_code(10), None);
        let e = halo_rs::Error::Aborted {
            message: "x".into(),
        };
        assert_eq!(Failure::from(e).code, haloResult::haloAborted);
        let e = halo_rs::Error::InvalidUsage {
            peer: Some(1),
            message: "y".into(),
        };
        assert_eq!(Failure::from(e).code, haloResult::haloInvalidUsage);
        // Every name agrees with halo::Error::code_name ("haloInvalidUsage" = "InvalidUsage").
        for r in haloResult::ALL {
            assert_eq!(
                format!("{r:?}"),
                format!("halo{}", halo_rs::Error::code_name(r as i32))
            );
        }
    }

    #[test]
    fn error_strings() {
        let s = |r| {
            // SAFETY: haloGetErrorString returns a static NUL-terminated string.
            let c = unsafe { CStr::from_ptr(haloGetErrorString(r)) };
            c.to_str().unwrap()
        };
        assert_eq!(s(0), "no error");
        assert!(s(4).starts_with("invalid argument"));
        assert_eq!(s(42), "unknown result code");
        assert_eq!(s(-7), "unknown result code");
    }

    #[test]
    fn messages_lose_interior_nuls() {
        assert_eq!(c_message("a\0b").to_str().unwrap(), "a b");
    }
}
