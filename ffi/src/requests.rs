//! Non-blocking operations with request handles, MPI-style: `haloIAllToAll`,
//! `haloIAllToAllv`, `haloISend`, `haloIRecv`, `haloISendTagged`, `haloIRecvTagged`,
//! `haloIAllReduce`, `haloIReduceScatter`, `haloIAllGather`, `haloIBroadcast`,
//! `haloIGather`, `haloIScatter` and `haloIBarrier` start an operation and return a
//! `haloRequest_t`; `haloWait`, `haloTest` and `haloWaitAll` complete it.
//!
//! The operations of a communicator run on one worker thread per communicator, in
//! the order they were started (the same model as the Rust API's
//! `Communicator::scope`). A request handle is a number, never reused, looked up in a
//! table: a request already completed (or a pointer HALO never made) is
//! `haloInvalidArgument`, never undefined behaviour.

use crate::args::{
    AllGatherArgs, AllReduceArgs, AllToAllArgs, AllToAllvArgs, BarrierArgs, Op, P2pArgs,
    ReduceScatterArgs, RootedArgs,
};
use crate::boundary::{call, call_borrowed};
use crate::error::{Failure, FfiResult, c_message, haloResult_t};
use crate::handle::{haloComm, haloComm_t};
use crate::types::{haloDataType_t, haloRedOp_t};
use halo_rs::Communicator;
use halo_rs::c_abi::{OpHandle, OpJob};
use std::collections::BTreeMap;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// A started non-blocking operation (opaque). Completed, and freed, by `haloWait`,
/// `haloWaitAll`, or a `haloTest` that reports it done.
#[derive(Debug)]
pub struct haloRequest {
    _opaque: u8,
}

/// A request handle, as `haloI*` return it.
///
/// It is an identifier, not a pointer to memory: HALO checks every handle against its
/// table of live requests, so a request completed already (a second `haloWait`) or a
/// value HALO never returned gives `haloInvalidArgument` ("request is not a live
/// request"). Identifiers are never reused.
pub type haloRequest_t = *mut haloRequest;

/// A live request: its outcome and its communicator (for the last error).
struct Entry {
    op: OpHandle,
    comm: Arc<haloComm>,
    function: &'static str,
}

static REQUESTS: Mutex<BTreeMap<usize, Entry>> = Mutex::new(BTreeMap::new());
static NEXT: AtomicUsize = AtomicUsize::new(1);

fn table() -> MutexGuard<'static, BTreeMap<usize, Entry>> {
    REQUESTS.lock().unwrap_or_else(PoisonError::into_inner)
}

fn not_live(request: haloRequest_t) -> Failure {
    Failure::invalid(format!(
        "request {:#x} is not a live request (completed already by haloWait, haloWaitAll \
         or haloTest, or not returned by a haloI* call)",
        request as usize
    ))
}

/// Queues `job` on `comm` and writes its handle to `request`.
pub(crate) fn start(
    comm: &Arc<haloComm>,
    function: &'static str,
    name: &'static str,
    job: OpJob,
    request: *mut haloRequest_t,
) -> FfiResult<()> {
    let op = haloComm::submit(comm, name, job)?;
    let id = NEXT.fetch_add(1, Ordering::Relaxed);
    table().insert(
        id,
        Entry {
            op,
            comm: Arc::clone(comm),
            function,
        },
    );
    // SAFETY: `request` is non-NULL (checked by every caller first) and writable per
    // the contract of the haloI* functions.
    unsafe { request.write(std::ptr::without_provenance_mut(id)) };
    Ok(())
}

pub(crate) fn check_request_out(request: *mut haloRequest_t) -> FfiResult<()> {
    if request.is_null() {
        return Err(Failure::invalid("request is NULL"));
    }
    Ok(())
}

/// The outcome of a finished request, recorded as its communicator's last error when
/// it failed.
fn outcome(entry: &Entry, r: halo_rs::Result<()>) -> FfiResult<()> {
    r.map_err(|e| {
        let (name, index) = entry.op.describe();
        let f = Failure::from(e);
        let f = Failure {
            message: format!(
                "{} ({name}, request {index}): {}",
                entry.function, f.message
            ),
            ..f
        };
        entry.comm.record_failure(f.code, c_message(&f.message));
        f
    })
}

/// The body of a non-blocking collective: `request` must not be NULL, `decode`
/// checks the arguments, and the call is queued on the communicator's worker
/// (`function` names the C function, `name` the operation).
///
/// # Safety
/// `comm` is NULL or a live communicator, `request` NULL or writable, and the buffers
/// that `decode`'s arguments name stay valid as the calling function's contract says
/// until the request completes.
unsafe fn nonblocking<A: Op + Send + 'static>(
    function: &'static str,
    name: &'static str,
    comm: haloComm_t,
    request: *mut haloRequest_t,
    decode: impl FnOnce(&haloComm) -> FfiResult<A>,
) -> haloResult_t {
    call_borrowed(function, comm, |c| {
        check_request_out(request)?;
        let a = decode(c)?;
        let job: OpJob = Box::new(move |comm: &mut Communicator| {
            // SAFETY: checked by `decode` (NULL, sizes, overlap, alignment); the
            // buffers stay valid and untouched by the caller until the request
            // completes, which is after this returns (this function's contract).
            unsafe { a.run(comm) }
        });
        start(c.shared(), function, name, job, request)
    })
}

/// Non-blocking `haloAllToAll`: starts the all-to-all and returns at once with a
/// request in `*request`. Arguments are checked as `haloAllToAll` checks them, before
/// anything is queued (a failure queues nothing and leaves `*request` alone).
///
/// **Buffers**: `sendbuff` must not be written and `recvbuff` not accessed until the
/// request has completed (`haloWait`, `haloWaitAll`, or `haloTest` reporting it done) —
/// MPI's rule for `MPI_Ialltoall`. There is no stream argument: a communicator's
/// operations, non-blocking and blocking, run in the order they were called (a
/// blocking call first waits for the requests started before it), and every rank must
/// start them in the same order.
///
/// Errors at start: those of `haloAllToAll` found before anything is sent; `haloInvalidArgument`
/// for a NULL `request`. The operation's own outcome comes from `haloWait` / `haloTest`.
///
/// # Safety
/// `comm` is NULL or a live communicator; `request` is NULL or writable; the buffers are
/// valid for `count * nranks` elements until the request completes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn haloIAllToAll(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: haloDataType_t,
    comm: haloComm_t,
    request: *mut haloRequest_t,
) -> haloResult_t {
    // SAFETY: the buffers stay valid as the contract says until the request completes.
    unsafe {
        nonblocking("haloIAllToAll", "all_to_all", comm, request, |c| {
            AllToAllArgs::decode(sendbuff, recvbuff, count, datatype, c.size())
        })
    }
}

/// Non-blocking `haloAllToAllv` (see `haloIAllToAll` for requests, buffers and order).
/// The four count and displacement arrays are copied at the call: only the buffers
/// must stay valid until the request completes.
///
/// # Safety
/// As `haloAllToAllv`, with the buffers valid until the request completes; `request`
/// is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn haloIAllToAllv(
    sendbuff: *const c_void,
    sendcounts: *const usize,
    sdispls: *const usize,
    recvbuff: *mut c_void,
    recvcounts: *const usize,
    rdispls: *const usize,
    datatype: haloDataType_t,
    comm: haloComm_t,
    request: *mut haloRequest_t,
) -> haloResult_t {
    let decode = |c: &haloComm| {
        let (s, r) = (
            (sendbuff, sendcounts, sdispls),
            (recvbuff, recvcounts, rdispls),
        );
        // SAFETY: each array is NULL or holds `nranks` entries per the contract; they
        // are copied here.
        Ok(unsafe { AllToAllvArgs::decode(s, r, datatype, c.size()) }?.to_owned())
    };
    // SAFETY: the buffers stay valid as the contract says until the request completes.
    unsafe { nonblocking("haloIAllToAllv", "all_to_all_v", comm, request, decode) }
}

/// Non-blocking `haloSend` (see `haloIAllToAll` for requests, buffers and order):
/// `sendbuff` must not be written until the request completes. Sends and receives
/// between two ranks match in the order they were started.
///
/// # Safety
/// `comm` is NULL or a live communicator; `sendbuff` NULL or readable for `count`
/// elements until the request completes; `request` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn haloISend(
    sendbuff: *const c_void,
    count: usize,
    datatype: haloDataType_t,
    peer: c_int,
    comm: haloComm_t,
    request: *mut haloRequest_t,
) -> haloResult_t {
    // SAFETY: `sendbuff` stays valid as the contract says until the request completes.
    unsafe {
        nonblocking("haloISend", "send", comm, request, |c| {
            let (to, n) = ((peer, None), c.size());
            P2pArgs::send(sendbuff, count, datatype, to, n)
        })
    }
}

/// Non-blocking `haloRecv` (see `haloIAllToAll` for requests, buffers and order):
/// `recvbuff` must not be accessed until the request completes.
///
/// # Safety
/// `comm` is NULL or a live communicator; `recvbuff` NULL or writable for `count`
/// elements until the request completes; `request` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn haloIRecv(
    recvbuff: *mut c_void,
    count: usize,
    datatype: haloDataType_t,
    peer: c_int,
    comm: haloComm_t,
    request: *mut haloRequest_t,
) -> haloResult_t {
    // SAFETY: `recvbuff` stays valid as the contract says until the request completes.
    unsafe {
        nonblocking("haloIRecv", "recv", comm, request, |c| {
            let (from, n) = ((peer, None), c.size());
            P2pArgs::recv(recvbuff, count, datatype, from, n)
        })
    }
}

/// Non-blocking `haloAllReduce` (in place when `sendbuff == recvbuff`; see
/// `haloIAllToAll` for requests, buffers and order). Arguments (data type, operation,
/// NULL, overlap, alignment) are checked at the call.
///
/// # Safety
/// `comm` is NULL or a live communicator; `sendbuff` NULL or readable and `recvbuff`
/// NULL or writable for `count` elements until the request completes; `request` NULL or
/// writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn haloIAllReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: haloDataType_t,
    op: haloRedOp_t,
    comm: haloComm_t,
    request: *mut haloRequest_t,
) -> haloResult_t {
    // SAFETY: the buffers stay valid as the contract says until the request completes.
    unsafe {
        nonblocking("haloIAllReduce", "all_reduce", comm, request, |_| {
            AllReduceArgs::decode(sendbuff, recvbuff, count, datatype, op)
        })
    }
}

/// Non-blocking `haloReduceScatter` (in place as NCCL's; see `haloIAllToAll` for
/// requests, buffers and order). Arguments (data type, operation, NULL, overlap,
/// alignment) are checked at the call.
///
/// # Safety
/// `comm` is NULL or a live communicator; `sendbuff` NULL or readable for `nranks *
/// recvcount` elements and `recvbuff` NULL or writable for `recvcount` until the
/// request completes; `request` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn haloIReduceScatter(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    recvcount: usize,
    datatype: haloDataType_t,
    op: haloRedOp_t,
    comm: haloComm_t,
    request: *mut haloRequest_t,
) -> haloResult_t {
    // SAFETY: the buffers stay valid as the contract says until the request completes.
    unsafe {
        nonblocking("haloIReduceScatter", "reduce_scatter", comm, request, |c| {
            let me = (c.size(), c.rank());
            ReduceScatterArgs::decode(sendbuff, recvbuff, recvcount, datatype, op, me)
        })
    }
}

/// Non-blocking `haloAllGather` (in place as NCCL's; see `haloIAllToAll` for
/// requests, buffers and order). Arguments are checked at the call.
///
/// # Safety
/// As `haloAllGather`, with the buffers valid until the request completes; `request`
/// is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn haloIAllGather(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    sendcount: usize,
    datatype: haloDataType_t,
    comm: haloComm_t,
    request: *mut haloRequest_t,
) -> haloResult_t {
    // SAFETY: the buffers stay valid as the contract says until the request completes.
    unsafe {
        nonblocking("haloIAllGather", "all_gather", comm, request, |c| {
            let me = (c.size(), c.rank());
            AllGatherArgs::decode(sendbuff, recvbuff, sendcount, datatype, me)
        })
    }
}

/// Non-blocking `haloBarrier`: the request completes once every rank has reached
/// it (see `haloIAllToAll` for requests and order).
///
/// # Safety
/// `comm` is NULL or a live communicator; `request` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn haloIBarrier(
    comm: haloComm_t,
    request: *mut haloRequest_t,
) -> haloResult_t {
    // SAFETY: `comm` is NULL or live and `request` NULL or writable; a barrier names
    // no buffer.
    unsafe {
        nonblocking("haloIBarrier", "barrier", comm, request, |_| {
            Ok(BarrierArgs)
        })
    }
}

/// Non-blocking `haloBroadcast` (in place when `sendbuff == recvbuff`; see
/// `haloIAllToAll` for requests, buffers and order). Arguments are checked at the
/// call.
///
/// # Safety
/// As `haloBroadcast`, with the buffers valid until the request completes; `request`
/// is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn haloIBroadcast(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: haloDataType_t,
    root: c_int,
    comm: haloComm_t,
    request: *mut haloRequest_t,
) -> haloResult_t {
    // SAFETY: the buffers stay valid as the contract says until the request completes.
    unsafe {
        nonblocking("haloIBroadcast", "broadcast", comm, request, |c| {
            let me = (c.size(), c.rank());
            RootedArgs::broadcast(sendbuff, recvbuff, count, datatype, root, me)
        })
    }
}

/// Non-blocking `haloGather` (see `haloIAllToAll` for requests, buffers and order).
/// Arguments are checked at the call.
///
/// # Safety
/// As `haloGather`, with the buffers valid until the request completes; `request` is
/// NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn haloIGather(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    sendcount: usize,
    datatype: haloDataType_t,
    root: c_int,
    comm: haloComm_t,
    request: *mut haloRequest_t,
) -> haloResult_t {
    // SAFETY: the buffers stay valid as the contract says until the request completes.
    unsafe {
        nonblocking("haloIGather", "gather", comm, request, |c| {
            let me = (c.size(), c.rank());
            RootedArgs::gather(sendbuff, recvbuff, sendcount, datatype, root, me)
        })
    }
}

/// Non-blocking `haloScatter` (see `haloIAllToAll` for requests, buffers and order).
/// Arguments are checked at the call.
///
/// # Safety
/// As `haloScatter`, with the buffers valid until the request completes; `request` is
/// NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn haloIScatter(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    recvcount: usize,
    datatype: haloDataType_t,
    root: c_int,
    comm: haloComm_t,
    request: *mut haloRequest_t,
) -> haloResult_t {
    // SAFETY: the buffers stay valid as the contract says until the request completes.
    unsafe {
        nonblocking("haloIScatter", "scatter", comm, request, |c| {
            let me = (c.size(), c.rank());
            RootedArgs::scatter(sendbuff, recvbuff, recvcount, datatype, root, me)
        })
    }
}

/// Non-blocking `haloSendTagged` (see `haloISend`).
///
/// # Safety
/// As `haloISend`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn haloISendTagged(
    sendbuff: *const c_void,
    count: usize,
    datatype: haloDataType_t,
    peer: c_int,
    tag: c_int,
    comm: haloComm_t,
    request: *mut haloRequest_t,
) -> haloResult_t {
    // SAFETY: `sendbuff` stays valid as the contract says until the request completes.
    unsafe {
        nonblocking("haloISendTagged", "send", comm, request, |c| {
            let (to, n) = ((peer, Some(tag)), c.size());
            P2pArgs::send(sendbuff, count, datatype, to, n)
        })
    }
}

/// Non-blocking `haloRecvTagged` (see `haloIRecv`).
///
/// # Safety
/// As `haloIRecv`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn haloIRecvTagged(
    recvbuff: *mut c_void,
    count: usize,
    datatype: haloDataType_t,
    peer: c_int,
    tag: c_int,
    comm: haloComm_t,
    request: *mut haloRequest_t,
) -> haloResult_t {
    // SAFETY: `recvbuff` stays valid as the contract says until the request completes.
    unsafe {
        nonblocking("haloIRecvTagged", "recv", comm, request, |c| {
            let (from, n) = ((peer, Some(tag)), c.size());
            P2pArgs::recv(recvbuff, count, datatype, from, n)
        })
    }
}

/// Waits until `request` has completed and returns the operation's result (the codes
/// of the blocking call; `haloGetLastError(comm)` and `haloGetLastError(NULL)` say
/// what failed). The request is freed: waiting on it again, or testing it, is
/// `haloInvalidArgument`.
///
/// The wait is bounded: each operation (and each one queued before it on the
/// communicator) is bounded by the communicator's timeout, and `haloCommAbort` stops
/// them. An operation started after one that failed on the same communicator is not
/// run: it fails with that failure's code, naming it.
///
/// # Safety
/// None beyond passing a value a haloI* call returned (any other value is refused).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn haloWait(request: haloRequest_t) -> haloResult_t {
    call("haloWait", || {
        let entry = table()
            .remove(&(request as usize))
            .ok_or_else(|| not_live(request))?;
        let r = entry.op.wait();
        outcome(&entry, r)
    })
}

/// Tests `request` without blocking: `*done = 1` when it has completed — then the
/// result is the operation's and the request is freed, as by `haloWait` — else
/// `*done = 0` and `haloSuccess` (the request stays live).
///
/// # Safety
/// `done` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn haloTest(request: haloRequest_t, done: *mut c_int) -> haloResult_t {
    call("haloTest", || {
        if done.is_null() {
            return Err(Failure::invalid("done is NULL"));
        }
        let mut t = table();
        let entry = t
            .get(&(request as usize))
            .ok_or_else(|| not_live(request))?;
        let Some(r) = entry.op.try_take() else {
            drop(t);
            // SAFETY: non-NULL (checked) and writable per the contract.
            unsafe { done.write(0) };
            return Ok(());
        };
        let entry = t
            .remove(&(request as usize))
            .ok_or_else(|| not_live(request))?;
        drop(t);
        // SAFETY: non-NULL (checked) and writable per the contract.
        unsafe { done.write(1) };
        outcome(&entry, r)
    })
}

/// Waits for `count` requests (`requests[0 .. count-1]`) and frees them, setting each
/// entry to NULL. Every handle is checked first: if one is not live (NULL included),
/// nothing is waited and the result is `haloInvalidArgument`. Otherwise all are waited
/// for, and the result is the first failure in array order (`haloSuccess` when none).
///
/// # Safety
/// `requests` is NULL (with `count` 0) or an array of `count` handles, writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn haloWaitAll(count: c_int, requests: *mut haloRequest_t) -> haloResult_t {
    call("haloWaitAll", || {
        let n = usize::try_from(count)
            .map_err(|_| Failure::invalid(format!("count {count} is negative")))?;
        if n == 0 {
            return Ok(());
        }
        if requests.is_null() {
            return Err(Failure::invalid(format!(
                "requests is NULL but count is {n}"
            )));
        }
        // SAFETY: non-NULL and an array of `n` handles per the contract.
        let handles = unsafe { std::slice::from_raw_parts_mut(requests, n) };
        let entries: Vec<Entry> = {
            let mut t = table();
            for (i, &h) in handles.iter().enumerate() {
                if !t.contains_key(&(h as usize)) {
                    let f = not_live(h);
                    return Err(Failure {
                        message: format!("requests[{i}]: {}", f.message),
                        ..f
                    });
                }
                if handles[..i].contains(&h) {
                    return Err(Failure::invalid(format!(
                        "requests[{i}] repeats an earlier entry"
                    )));
                }
            }
            handles
                .iter()
                .filter_map(|&h| t.remove(&(h as usize)))
                .collect()
        };
        let mut first: Option<Failure> = None;
        for (h, entry) in handles.iter_mut().zip(&entries) {
            *h = std::ptr::null_mut();
            let r = entry.op.wait();
            if let Err(f) = outcome(entry, r) {
                first.get_or_insert(f);
            }
        }
        match first {
            None => Ok(()),
            Some(f) => Err(f),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::haloResult;

    fn code(r: haloResult_t) -> Option<haloResult> {
        haloResult::from_code(r)
    }

    #[test]
    fn stale_requests_are_invalid_arguments() {
        let bogus: haloRequest_t = std::ptr::without_provenance_mut(usize::MAX - 3);
        // SAFETY: any value is allowed; it is looked up, never dereferenced.
        let r = unsafe { haloWait(bogus) };
        assert_eq!(code(r), Some(haloResult::haloInvalidArgument));
        let mut done = 7;
        // SAFETY: as above; `done` is writable.
        let r = unsafe { haloTest(bogus, &mut done) };
        assert_eq!(code(r), Some(haloResult::haloInvalidArgument));
        assert_eq!(done, 7, "written on failure");
        let mut list = [bogus];
        // SAFETY: a writable array of one handle.
        let r = unsafe { haloWaitAll(1, list.as_mut_ptr()) };
        assert_eq!(code(r), Some(haloResult::haloInvalidArgument));
    }
}
