//! The panic boundary: every exported function's body runs in one of these.
//!
//! What a caught panic returns is decided per return type: `haloInternalError` for
//! the functions that return a `haloResult_t` ([`call`], [`call_comm`]), a fixed
//! value chosen by the function for the others ([`or_value`]: a static string, 0).
//! The panic's message becomes the last error, so `haloGetLastError` says what broke.

use crate::error::{Failure, FfiResult, c_message, haloResult, haloResult_t, set_thread_error};
use crate::handle::{Borrowed, haloComm, haloComm_t};
use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind};

/// The text of a panic payload.
fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "(no message)".to_string()
    }
}

/// Runs `f`; a panic becomes a [`Failure`] with code `haloInternalError`.
fn catch<T>(name: &str, f: impl FnOnce() -> FfiResult<T>) -> FfiResult<T> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(payload) => Err(Failure::internal(format!(
            "panic in HALO (please report it): {}",
            panic_message(payload.as_ref())
        ))),
    }
    .map_err(|f| Failure {
        message: format!("{name}: {}", f.message),
        ..f
    })
}

/// The body of an exported function that takes no communicator: runs `f`, records a
/// failure as this thread's last error and returns its code.
pub(crate) fn call(name: &str, f: impl FnOnce() -> FfiResult<()>) -> haloResult_t {
    match catch(name, f) {
        Ok(()) => haloResult::haloSuccess as haloResult_t,
        Err(failure) => {
            set_thread_error(&c_message(&failure.message));
            failure.code as haloResult_t
        }
    }
}

/// The body of an exported function on a communicator: checks `comm` is not NULL,
/// holds a reference to it for the whole call, runs `f`, and records a failure as the
/// communicator's and this thread's last error.
pub(crate) fn call_comm(
    name: &str,
    comm: haloComm_t,
    f: impl FnOnce(&haloComm) -> FfiResult<()>,
) -> haloResult_t {
    call_borrowed(name, comm, |b| f(b))
}

/// [`call_comm`] with the reference itself, for what outlives the call.
pub(crate) fn call_borrowed(
    name: &str,
    comm: haloComm_t,
    f: impl FnOnce(&Borrowed) -> FfiResult<()>,
) -> haloResult_t {
    let mut held: Option<Borrowed> = None;
    let result = catch(name, || {
        // A stale or foreign handle is refused here, before it is dereferenced.
        let c = Borrowed::new(comm)?.ok_or_else(|| Failure::invalid("comm is NULL"))?;
        let c = held.insert(c);
        f(c)
    });
    match result {
        Ok(()) => haloResult::haloSuccess as haloResult_t,
        Err(failure) => {
            let message = c_message(&failure.message);
            set_thread_error(&message);
            if let Some(c) = &held {
                c.record_failure(failure.code, message);
            }
            failure.code as haloResult_t
        }
    }
}

/// The body of an exported function that returns a value instead of a result code:
/// a panic returns `on_panic` (and becomes this thread's last error).
pub(crate) fn or_value<T>(on_panic: T, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(payload) => {
            set_thread_error(&c_message(&format!(
                "panic in HALO (please report it): {}",
                panic_message(payload.as_ref())
            )));
            on_panic
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::thread_error_ptr;
    use std::ffi::CStr;

    fn last() -> String {
        // SAFETY: the thread's last error is a NUL-terminated string owned by the thread.
        unsafe { CStr::from_ptr(thread_error_ptr()) }
            .to_string_lossy()
            .into_owned()
    }

    #[test]
    fn a_panic_is_an_internal_error_with_its_message() {
        let r = call("haloTest", || panic!("boom {}", 42));
        assert_eq!(r, haloResult::haloInternalError as i32);
        assert!(last().contains("haloTest: panic in HALO"), "{}", last());
        assert!(last().contains("boom 42"), "{}", last());
        assert_eq!(or_value(7, || panic!("static")), 7);
        assert!(last().contains("static"));
    }

    #[test]
    fn failures_name_the_function() {
        let r = call("haloTest", || Err(Failure::invalid("bad thing")));
        assert_eq!(r, 4);
        assert_eq!(last(), "haloTest: bad thing");
        assert_eq!(call("haloTest", || Ok(())), 0);
        // A success leaves the last error alone.
        assert_eq!(last(), "haloTest: bad thing");
    }

    #[test]
    fn null_comm_is_an_invalid_argument() {
        let r = call_comm("haloTest", std::ptr::null_mut(), |_| Ok(()));
        assert_eq!(r, 4);
        assert_eq!(last(), "haloTest: comm is NULL");
    }
}
