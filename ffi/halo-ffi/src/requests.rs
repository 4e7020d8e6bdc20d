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

use crate::boundary::{call, call_borrowed};
use crate::collectives::{
    bytes, bytes_mut, check_all_gather, check_buffer, check_reduce_scatter, counts, peer_index,
    reduce_scatter_typed, run_all_gather, total_bytes,
};
use crate::error::{Failure, FfiResult, c_message, haloResult_t};
use crate::handle::{haloComm, haloComm_t};
use crate::rooted::{
    check_broadcast, check_gather, check_scatter, run_broadcast, run_gather, run_scatter, tag_value,
};
use crate::types::{haloDataType, haloDataType_t, haloRedOp, haloRedOp_t, with_elem};
use halo_rs::c_abi::{OpHandle, OpJob};
use halo_rs::{Communicator, Partition, ReduceOp, Reducible};
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
fn start(
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

fn check_request_out(request: *mut haloRequest_t) -> FfiResult<()> {
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

/// Pointers as numbers, to move into the worker (see each caller's SAFETY note).
fn addr<T>(p: *const T) -> usize {
    p as usize
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
    call_borrowed("haloIAllToAll", comm, |c| {
        check_request_out(request)?;
        let elem = haloDataType::from_raw(datatype)?.size();
        let bytes = total_bytes(count, elem, c.size(), "count")?;
        check_buffer(sendbuff, bytes, "sendbuff", count)?;
        check_buffer(recvbuff, bytes, "recvbuff", count)?;
        if bytes > 0 && sendbuff == recvbuff.cast_const() {
            return Err(Failure::invalid(
                "sendbuff == recvbuff: in-place all-to-all is not supported",
            ));
        }
        let (s, r) = (addr(sendbuff), addr(recvbuff));
        let job: OpJob = Box::new(move |comm: &mut Communicator| {
            // SAFETY: per haloIAllToAll's contract the buffers stay valid for `bytes`
            // bytes and untouched by the caller until the request completes, which is
            // after this function has returned; the communicator checks NULL and
            // overlap before making references.
            unsafe { halo_rs::c_abi::all_to_all(comm, s as *const u8, r as *mut u8, count, elem) }
        });
        start(c.shared(), "haloIAllToAll", "all_to_all", job, request)
    })
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
    call_borrowed("haloIAllToAllv", comm, |c| {
        check_request_out(request)?;
        let elem = haloDataType::from_raw(datatype)?.size();
        let n = c.size();
        // SAFETY: (four reads) each array is NULL or holds `n` entries per the contract.
        let (sc, sd, rc, rd) = unsafe {
            (
                counts(sendcounts, n, "sendcounts")?.to_vec(),
                counts(sdispls, n, "sdispls")?.to_vec(),
                counts(recvcounts, n, "recvcounts")?.to_vec(),
                counts(rdispls, n, "rdispls")?.to_vec(),
            )
        };
        let (s, r) = (addr(sendbuff), addr(recvbuff));
        let job: OpJob = Box::new(move |comm: &mut Communicator| {
            let (sp, rp) = (Partition::new(&sc, &sd), Partition::new(&rc, &rd));
            // SAFETY: per the contract the buffers cover what the counts reach and stay
            // valid and untouched until the request completes, after this returns; the
            // communicator checks extents, NULL and overlap before making references.
            unsafe {
                halo_rs::c_abi::all_to_all_v(comm, s as *const u8, &sp, r as *mut u8, &rp, elem)
            }
        });
        start(c.shared(), "haloIAllToAllv", "all_to_all_v", job, request)
    })
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
    call_borrowed("haloISend", comm, |c| {
        check_request_out(request)?;
        let elem = haloDataType::from_raw(datatype)?.size();
        let len = total_bytes(count, elem, 1, "count")?;
        check_buffer(sendbuff, len, "sendbuff", count)?;
        let peer = peer_index(peer, c.size())?;
        let s = addr(sendbuff);
        let job: OpJob = Box::new(move |comm: &mut Communicator| {
            // SAFETY: non-NULL when `len` > 0 (checked at start), readable and unwritten
            // until the request completes (after this returns) per the contract.
            let send = unsafe { bytes(s as *const c_void, len) };
            comm.send(send, peer)
        });
        start(c.shared(), "haloISend", "send", job, request)
    })
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
    call_borrowed("haloIRecv", comm, |c| {
        check_request_out(request)?;
        let elem = haloDataType::from_raw(datatype)?.size();
        let len = total_bytes(count, elem, 1, "count")?;
        check_buffer(recvbuff, len, "recvbuff", count)?;
        let peer = peer_index(peer, c.size())?;
        let r = addr(recvbuff);
        let job: OpJob = Box::new(move |comm: &mut Communicator| {
            // SAFETY: non-NULL when `len` > 0 (checked at start), writable and accessed
            // by nobody else until the request completes (after this returns).
            let recv = unsafe { bytes_mut(r as *mut c_void, len) };
            comm.recv(recv, peer)
        });
        start(c.shared(), "haloIRecv", "recv", job, request)
    })
}

/// The worker's part of `haloIAllReduce` for elements `E`.
fn reduce_job<E: Reducible>(s: usize, r: usize, count: usize, op: ReduceOp) -> OpJob {
    Box::new(move |comm: &mut Communicator| {
        if count == 0 {
            return comm.all_reduce::<E>(&[], &mut [], op);
        }
        if s == r {
            // SAFETY: non-NULL, aligned (checked at start), writable for `count`
            // elements and untouched by the caller until the request completes.
            let buf = unsafe { std::slice::from_raw_parts_mut(r as *mut E, count) };
            return comm.all_reduce_in_place(buf, op);
        }
        // SAFETY: non-NULL, aligned (checked at start), valid for `count` elements until
        // the request completes, and the ranges do not overlap (checked at start).
        let (send, recv) = unsafe {
            (
                std::slice::from_raw_parts(s as *const E, count),
                std::slice::from_raw_parts_mut(r as *mut E, count),
            )
        };
        comm.all_reduce(send, recv, op)
    })
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
    call_borrowed("haloIAllReduce", comm, |c| {
        check_request_out(request)?;
        let dt = haloDataType::from_raw(datatype)?;
        let op = haloRedOp::from_raw(op)?;
        let len = total_bytes(count, dt.size(), 1, "count")?;
        check_buffer(sendbuff, len, "sendbuff", count)?;
        check_buffer(recvbuff, len, "recvbuff", count)?;
        let (s, r) = (addr(sendbuff), addr(recvbuff));
        if s != r && len > 0 && s < r.saturating_add(len) && r < s.saturating_add(len) {
            return Err(Failure::invalid(
                "sendbuff and recvbuff overlap: pass the same pointer for an in-place \
                 all-reduce, or separate buffers",
            ));
        }
        let align = dt.size();
        if count > 0 && (s % align != 0 || r % align != 0) {
            return Err(Failure::invalid(format!(
                "sendbuff or recvbuff is not aligned to {align} bytes, as {dt:?} elements \
                 must be"
            )));
        }
        let job = with_elem!(dt, E => reduce_job::<E>(s, r, count, op));
        start(c.shared(), "haloIAllReduce", "all_reduce", job, request)
    })
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
    call_borrowed("haloIReduceScatter", comm, |c| {
        check_request_out(request)?;
        let a = check_reduce_scatter(
            sendbuff,
            recvbuff,
            recvcount,
            datatype,
            op,
            (c.size(), c.rank()),
        )?;
        let (s, r) = (addr(sendbuff), addr(recvbuff));
        let (op, in_place) = (a.op, a.in_place);
        let job: OpJob = with_elem!(a.dt, E => Box::new(move |comm: &mut Communicator| {
            // SAFETY: checked at start (NULL, alignment, overlap); valid and untouched
            // by the caller until the request completes, after this returns.
            unsafe { reduce_scatter_typed::<E>(comm, s, r, recvcount, op, in_place) }
        }));
        start(
            c.shared(),
            "haloIReduceScatter",
            "reduce_scatter",
            job,
            request,
        )
    })
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
    call_borrowed("haloIAllGather", comm, |c| {
        check_request_out(request)?;
        let a = check_all_gather(
            sendbuff,
            recvbuff,
            sendcount,
            datatype,
            (c.size(), c.rank()),
        )?;
        let job: OpJob = Box::new(move |comm: &mut Communicator| {
            // SAFETY: checked at start (NULL, overlap); valid and untouched by the
            // caller until the request completes, after this returns.
            unsafe { run_all_gather(comm, a) }
        });
        start(c.shared(), "haloIAllGather", "all_gather", job, request)
    })
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
    call_borrowed("haloIBarrier", comm, |c| {
        check_request_out(request)?;
        let job: OpJob = Box::new(|comm: &mut Communicator| comm.barrier());
        start(c.shared(), "haloIBarrier", "barrier", job, request)
    })
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
    call_borrowed("haloIBroadcast", comm, |c| {
        check_request_out(request)?;
        let a = check_broadcast(
            sendbuff,
            recvbuff,
            count,
            datatype,
            root,
            (c.size(), c.rank()),
        )?;
        let job: OpJob = Box::new(move |comm: &mut Communicator| {
            // SAFETY: checked at start (NULL, overlap); valid and untouched by the
            // caller until the request completes, after this returns.
            unsafe { run_broadcast(comm, a) }
        });
        start(c.shared(), "haloIBroadcast", "broadcast", job, request)
    })
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
    call_borrowed("haloIGather", comm, |c| {
        check_request_out(request)?;
        let a = check_gather(
            sendbuff,
            recvbuff,
            sendcount,
            datatype,
            root,
            (c.size(), c.rank()),
        )?;
        let job: OpJob = Box::new(move |comm: &mut Communicator| {
            // SAFETY: checked at start (NULL, overlap); valid and untouched by the
            // caller until the request completes, after this returns.
            unsafe { run_gather(comm, a) }
        });
        start(c.shared(), "haloIGather", "gather", job, request)
    })
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
    call_borrowed("haloIScatter", comm, |c| {
        check_request_out(request)?;
        let a = check_scatter(
            sendbuff,
            recvbuff,
            recvcount,
            datatype,
            root,
            (c.size(), c.rank()),
        )?;
        let job: OpJob = Box::new(move |comm: &mut Communicator| {
            // SAFETY: checked at start (NULL, overlap); valid and untouched by the
            // caller until the request completes, after this returns.
            unsafe { run_scatter(comm, a) }
        });
        start(c.shared(), "haloIScatter", "scatter", job, request)
    })
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
    call_borrowed("haloISendTagged", comm, |c| {
        check_request_out(request)?;
        let elem = haloDataType::from_raw(datatype)?.size();
        let len = total_bytes(count, elem, 1, "count")?;
        check_buffer(sendbuff, len, "sendbuff", count)?;
        let peer = peer_index(peer, c.size())?;
        let tag = tag_value(tag)?;
        let s = addr(sendbuff);
        let job: OpJob = Box::new(move |comm: &mut Communicator| {
            // SAFETY: non-NULL when `len` > 0 (checked at start), readable and unwritten
            // until the request completes (after this returns) per the contract.
            let send = unsafe { bytes(s as *const c_void, len) };
            comm.send_tagged(send, peer, tag)
        });
        start(c.shared(), "haloISendTagged", "send", job, request)
    })
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
    call_borrowed("haloIRecvTagged", comm, |c| {
        check_request_out(request)?;
        let elem = haloDataType::from_raw(datatype)?.size();
        let len = total_bytes(count, elem, 1, "count")?;
        check_buffer(recvbuff, len, "recvbuff", count)?;
        let peer = peer_index(peer, c.size())?;
        let tag = tag_value(tag)?;
        let r = addr(recvbuff);
        let job: OpJob = Box::new(move |comm: &mut Communicator| {
            // SAFETY: non-NULL when `len` > 0 (checked at start), writable and accessed
            // by nobody else until the request completes (after this returns).
            let recv = unsafe { bytes_mut(r as *mut c_void, len) };
            comm.recv_tagged(recv, peer, tag)
        });
        start(c.shared(), "haloIRecvTagged", "recv", job, request)
    })
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
