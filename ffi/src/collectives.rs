//! The collectives: all-to-all, all-to-all-v, barrier, send / receive, all-gather,
//! all-reduce, reduce-scatter.
//!
//! Each call's arguments are decoded and checked once, before anything is sent, by
//! the argument struct of its shape (`args` module), which then runs the collective
//! on this thread; the non-blocking forms (`requests` module) use the same structs.
//! The Rust communicator checks again.

use crate::args::{
    AllGatherArgs, AllReduceArgs, AllToAllArgs, AllToAllvArgs, BarrierArgs, P2pArgs,
    ReduceScatterArgs, blocking, blocking_or_stream,
};
use crate::error::haloResult_t;
use crate::handle::{haloComm, haloComm_t};
use crate::types::{haloDataType_t, haloRedOp_t, haloStream_t};
use std::ffi::{c_int, c_void};

/// All-to-all (as RCCL's `ncclAllToAll`): `count` elements go from this rank to each
/// rank, and `count` come from each.
///
/// Block `q` of `sendbuff` (elements `q*count .. (q+1)*count-1`) goes to rank `q`; the
/// block from rank `q` lands at block `q` of `recvbuff`. Both buffers hold `count *
/// nranks` elements of `datatype`. Out-of-place only: the buffers must not overlap.
/// Blocking: returns when this rank's part is complete. Every rank calls it with the
/// same `count` and `datatype`.
///
/// Device buffers (the device path): with a non-NULL `stream` (`cudaStream_t`,
/// `hipStream_t`) both buffers must be device memory of one device (told by the
/// runtime's pointer attributes); the exchange is enqueued on `stream` as NCCL / RCCL
/// send / receive groups and device copies, and the call returns once it is enqueued
/// (as `ncclAllToAll`). The first such call on a communicator is collective and makes
/// its NCCL communicator. NCCL / RCCL and the CUDA / HIP runtime are loaded at run time
/// (`HALO_NCCL_LIBRARY`, `HALO_CUDART_LIBRARY`, then the usual library names).
/// Not yet run on a GPU (docs/ARCHITECTURE.md, "The device path").
///
/// Errors (nothing is sent and `recvbuff` is untouched):
/// - `haloInvalidArgument`: NULL `comm`; `datatype` not a `haloDataType`; `count *
///   size * nranks` overflows; `sendbuff` or `recvbuff` NULL with `count` > 0;
///   `sendbuff == recvbuff` (in-place) or overlapping buffers; with a stream, host
///   buffers or one host and one device buffer.
/// - `haloUnhandledDeviceError`: with a stream, no CUDA / HIP runtime or no NCCL /
///   RCCL could be loaded (`haloGetLastError` names every place tried), or a runtime
///   call failed.
/// - `haloInvalidUsage`: another thread is using `comm`.
///
/// Errors during the exchange: `haloTimeout` (after `timeoutMs`), `haloRemoteError`,
/// `haloSystemError`, `haloAborted`; the receive buffer's content is then undefined.
/// `haloGetLastError(comm)` says what happened.
///
/// # Safety
/// `comm` is NULL or a live communicator; `sendbuff` is NULL or readable and
/// `recvbuff` NULL or writable for `count * nranks` elements; neither is accessed by
/// another thread during the call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn haloAllToAll(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: haloDataType_t,
    comm: haloComm_t,
    stream: haloStream_t,
) -> haloResult_t {
    // SAFETY: the buffers are valid as the contract says, for the whole call (device
    // buffers with a stream).
    unsafe {
        blocking_or_stream("haloAllToAll", comm, stream, |c| {
            AllToAllArgs::decode(sendbuff, recvbuff, count, datatype, c.size())
        })
    }
}

/// All-to-all with per-rank counts (as RCCL's `ncclAllToAllv`).
///
/// `sendcounts[q]` elements starting at element `sdispls[q]` of `sendbuff` go to rank
/// `q`; `recvcounts[q]` elements from rank `q` land at element `rdispls[q]` of
/// `recvbuff`. Counts and displacements are in elements of `datatype` and may be zero;
/// each array has one entry per rank. `recvcounts[q]` on this rank must equal
/// `sendcounts[me]` on rank `q`. Out-of-place only. Blocking.
///
/// The counts are exchanged before any data moves, so a problem on one rank is an
/// error on every rank instead of a hang: a rank whose own arguments are wrong gets
/// `haloInvalidArgument`, two ranks that disagree on a count get `haloInvalidUsage`
/// naming each other and both counts, and every other rank gets `haloInvalidUsage`
/// naming the rank that reported. No data moves and `recvbuff` is untouched.
///
/// Errors:
/// Device buffers: with a non-NULL `stream`, as `haloAllToAll` (the counts and
/// displacements stay host arrays; they are exchanged on the host transport first).
///
/// - `haloInvalidArgument`, found on this rank before anything is sent: NULL `comm`;
///   `datatype` not a `haloDataType`; a NULL count or displacement array; with a
///   stream, host buffers or one host and one device buffer.
/// - `haloUnhandledDeviceError`: with a stream, as `haloAllToAll`.
/// - `haloInvalidArgument`, found after the count exchange (and reported to every
///   rank): a displacement plus count that overflows, a NULL buffer with a non-zero
///   count, overlapping receive blocks, `sendbuff` and `recvbuff` overlapping (in-place).
/// - `haloInvalidUsage`: counts that disagree between ranks, another rank's error, or
///   another thread using `comm`.
/// - `haloTimeout`, `haloRemoteError`, `haloSystemError`, `haloAborted` during the
///   exchange.
///
/// # Safety
/// `comm` is NULL or a live communicator; each array is NULL or holds `nranks`
/// entries; `sendbuff` is readable and `recvbuff` writable over the elements the counts
/// and displacements reach; neither is accessed by another thread during the call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn haloAllToAllv(
    sendbuff: *const c_void,
    sendcounts: *const usize,
    sdispls: *const usize,
    recvbuff: *mut c_void,
    recvcounts: *const usize,
    rdispls: *const usize,
    datatype: haloDataType_t,
    comm: haloComm_t,
    stream: haloStream_t,
) -> haloResult_t {
    let decode = |c: &haloComm| {
        let (s, r) = (
            (sendbuff, sendcounts, sdispls),
            (recvbuff, recvcounts, rdispls),
        );
        // SAFETY: each array is NULL or holds `nranks` entries per the contract.
        unsafe { AllToAllvArgs::decode(s, r, datatype, c.size()) }
    };
    // SAFETY: the buffers cover what the counts and displacements reach, as the
    // contract says, for the whole call (device buffers with a stream).
    unsafe { blocking_or_stream("haloAllToAllv", comm, stream, decode) }
}

/// Waits until every rank of `comm` has called `haloBarrier`.
///
/// Errors: `haloInvalidArgument` for a NULL `comm`; `haloInvalidUsage` while another
/// thread uses `comm`; `haloTimeout`, `haloRemoteError`, `haloAborted` as they happen.
///
/// # Safety
/// `comm` is NULL or a live communicator.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn haloBarrier(comm: haloComm_t) -> haloResult_t {
    // SAFETY: `comm` is NULL or live; a barrier names no buffer.
    unsafe {
        blocking("haloBarrier", comm, std::ptr::null_mut(), |_| {
            Ok(BarrierArgs)
        })
    }
}

/// Sends `count` elements to rank `peer` (as `ncclSend`).
///
/// Blocking: returns when the transport is done with `sendbuff`. Messages between two
/// ranks match in order: the k-th `haloSend` from a to b meets the k-th `haloRecv` at
/// b from a, which must have the same size (zero included). Only the two ranks take
/// part. There are no group calls (`ncclGroupStart`): order the calls so that they
/// match (in a ring, even ranks send first and odd ranks receive first). A send to this
/// rank itself is buffered until the matching `haloRecv`.
///
/// Errors: `haloInvalidArgument` for a NULL `comm`, a non-NULL `stream`, an unknown
/// `datatype`, a size that overflows, a NULL `sendbuff` with `count` > 0, or a `peer`
/// out of range (all before anything is sent); `haloInvalidUsage` when the receiver
/// expects another size or another thread uses `comm`; `haloTimeout` naming the peer
/// when it does not receive in time; `haloRemoteError`, `haloAborted`.
///
/// # Safety
/// `comm` is NULL or a live communicator; `sendbuff` is NULL or readable for `count`
/// elements and not written during the call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn haloSend(
    sendbuff: *const c_void,
    count: usize,
    datatype: haloDataType_t,
    peer: c_int,
    comm: haloComm_t,
    stream: haloStream_t,
) -> haloResult_t {
    // SAFETY: `sendbuff` is valid as the contract says, for the whole call.
    unsafe {
        blocking("haloSend", comm, stream, |c| {
            let (to, n) = ((peer, None), c.size());
            P2pArgs::send(sendbuff, count, datatype, to, n)
        })
    }
}

/// Receives `count` elements from rank `peer` (as `ncclRecv`), blocking until they are
/// in `recvbuff`. See `haloSend` for how sends and receives match.
///
/// Errors: as `haloSend`, for `recvbuff`; `haloTimeout` naming the peer when nothing
/// arrives in time.
///
/// # Safety
/// `comm` is NULL or a live communicator; `recvbuff` is NULL or writable for `count`
/// elements and not accessed by another thread during the call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn haloRecv(
    recvbuff: *mut c_void,
    count: usize,
    datatype: haloDataType_t,
    peer: c_int,
    comm: haloComm_t,
    stream: haloStream_t,
) -> haloResult_t {
    // SAFETY: `recvbuff` is valid as the contract says, for the whole call.
    unsafe {
        blocking("haloRecv", comm, stream, |c| {
            let (from, n) = ((peer, None), c.size());
            P2pArgs::recv(recvbuff, count, datatype, from, n)
        })
    }
}

/// All-gather (as `ncclAllGather`): every rank's `sendcount` elements land at block
/// `r` of every rank's `recvbuff` (elements `r*sendcount .. (r+1)*sendcount-1` for
/// rank `r`), which holds `nranks * sendcount` elements.
///
/// In place as in NCCL: when `sendbuff == recvbuff + rank * sendcount` elements, this
/// rank's block is already where it belongs. Any other overlap is an error. Every rank
/// passes the same `sendcount` and `datatype`. Blocking.
///
/// Errors: `haloInvalidArgument` for a NULL `comm`, a non-NULL `stream`, an unknown
/// `datatype`, a size that overflows, a NULL buffer with `sendcount` > 0, or
/// overlapping buffers (all before anything is sent); `haloInvalidUsage` when ranks pass
/// different sizes (where the transport sees it) or another thread uses `comm`;
/// `haloTimeout`, `haloRemoteError`, `haloAborted`.
///
/// # Safety
/// `comm` is NULL or a live communicator; `sendbuff` is NULL or readable for
/// `sendcount` elements, `recvbuff` NULL or writable for `nranks * sendcount`; no other
/// thread accesses them during the call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn haloAllGather(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    sendcount: usize,
    datatype: haloDataType_t,
    comm: haloComm_t,
    stream: haloStream_t,
) -> haloResult_t {
    // SAFETY: the buffers are valid as the contract says, for the whole call.
    unsafe {
        blocking("haloAllGather", comm, stream, |c| {
            let me = (c.size(), c.rank());
            AllGatherArgs::decode(sendbuff, recvbuff, sendcount, datatype, me)
        })
    }
}

/// All-reduce (as `ncclAllReduce`): element `i` of `recvbuff` becomes element `i` of
/// every rank's `sendbuff` combined with `op`, on every rank. In place when `sendbuff ==
/// recvbuff`. Every rank passes the same `count`, `datatype` and `op`, and gets the
/// same bits. Blocking.
///
/// Data types: every `haloDataType`; operations: every `haloRedOp` (`haloAvg` divides
/// the sum by the number of ranks). The buffers must be aligned to their element size
/// (as any C array of that type is).
///
/// Errors: `haloInvalidArgument` for a NULL `comm`, a non-NULL `stream`, an unknown
/// `datatype` or `op`, a size that overflows, a NULL buffer with `count` >
/// 0, buffers that overlap without being equal, or a misaligned buffer (all before
/// anything is sent); `haloInvalidUsage` when ranks pass different counts (where the
/// transport sees it) or another thread uses `comm`; `haloTimeout`, `haloRemoteError`,
/// `haloAborted`.
///
/// # Safety
/// `comm` is NULL or a live communicator; `sendbuff` is NULL or readable and `recvbuff`
/// NULL or writable for `count` elements; no other thread accesses them during the
/// call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn haloAllReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: haloDataType_t,
    op: haloRedOp_t,
    comm: haloComm_t,
    stream: haloStream_t,
) -> haloResult_t {
    // SAFETY: the buffers are valid as the contract says, for the whole call.
    unsafe {
        blocking("haloAllReduce", comm, stream, |_| {
            AllReduceArgs::decode(sendbuff, recvbuff, count, datatype, op)
        })
    }
}

/// Reduce-scatter (as `ncclReduceScatter`): `sendbuff` holds `nranks * recvcount`
/// elements; this rank's `recvbuff` (`recvcount` elements) becomes block `rank` of
/// `sendbuff` (elements `rank*recvcount .. (rank+1)*recvcount-1`) combined with `op`
/// over every rank. In place as in NCCL: when `recvbuff == sendbuff + rank *
/// recvcount` elements. Every rank passes the same `recvcount`, `datatype` and `op`.
/// Blocking.
///
/// Data types: every `haloDataType`; operations: every `haloRedOp`. A ring of
/// `nranks - 1` rounds; each block is reduced in an order fixed by the algorithm, so
/// the bits are the same from run to run. The buffers must be aligned to their element
/// size.
///
/// Errors: `haloInvalidArgument` for a NULL `comm`, a non-NULL `stream`, an unknown
/// `datatype` or `op`, a size that overflows, a NULL buffer with `recvcount` > 0,
/// buffers that overlap other than in place, or a misaligned buffer (all before
/// anything is sent); `haloInvalidUsage` when ranks pass different counts (where the
/// transport sees it) or another thread uses `comm`; `haloTimeout`, `haloRemoteError`,
/// `haloAborted`.
///
/// # Safety
/// `comm` is NULL or a live communicator; `sendbuff` is NULL or readable for `nranks *
/// recvcount` elements and `recvbuff` NULL or writable for `recvcount`; no other thread
/// accesses them during the call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn haloReduceScatter(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    recvcount: usize,
    datatype: haloDataType_t,
    op: haloRedOp_t,
    comm: haloComm_t,
    stream: haloStream_t,
) -> haloResult_t {
    // SAFETY: the buffers are valid as the contract says, for the whole call.
    unsafe {
        blocking("haloReduceScatter", comm, stream, |c| {
            let me = (c.size(), c.rank());
            ReduceScatterArgs::decode(sendbuff, recvbuff, recvcount, datatype, op, me)
        })
    }
}
