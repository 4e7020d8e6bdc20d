//! The rooted collectives — broadcast, gather, scatter — and point-to-point with a
//! user tag: `haloBroadcast`, `haloGather`, `haloScatter`, `haloSendTagged`,
//! `haloRecvTagged`. Their arguments are decoded and checked by the structs of the
//! `args` module (`RootedArgs`, `P2pArgs`), which their non-blocking forms
//! (`requests` module) share.

use crate::args::{P2pArgs, RootedArgs, blocking};
use crate::error::haloResult_t;
use crate::handle::haloComm_t;
use crate::types::{haloDataType_t, haloStream_t};
use std::ffi::{c_int, c_void};

/// Broadcast (as `ncclBroadcast`): `count` elements of `sendbuff` on rank `root` land
/// in `recvbuff` of every rank (the root's included). In place when `sendbuff ==
/// recvbuff`; `sendbuff` is used only at the root (it may be NULL elsewhere). Every
/// rank passes the same `count`, `datatype` and `root`. Blocking.
///
/// A binomial tree up to 64 KiB, a pipelined chain of 64 KiB chunks above.
///
/// Errors: `haloInvalidArgument` for a NULL `comm`, a non-NULL `stream`, an unknown
/// `datatype`, a size that overflows, a NULL buffer with `count` > 0 (`sendbuff`: at
/// the root), `root` out of range, or overlapping buffers at the root other than in
/// place (all before anything is sent); `haloInvalidUsage` when ranks pass different
/// counts (on the ranks that exchange with the one that differs; the others complete,
/// or fail waiting for it) or another thread uses `comm`; `haloTimeout`,
/// `haloRemoteError`, `haloAborted`.
///
/// # Safety
/// `comm` is NULL or a live communicator; at the root `sendbuff` is NULL or readable
/// for `count` elements; `recvbuff` is NULL or writable for `count` elements; no other
/// thread accesses them during the call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn haloBroadcast(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: haloDataType_t,
    root: c_int,
    comm: haloComm_t,
    stream: haloStream_t,
) -> haloResult_t {
    // SAFETY: the buffers are valid as the contract says, for the whole call.
    unsafe {
        blocking("haloBroadcast", comm, stream, |c| {
            let me = (c.size(), c.rank());
            RootedArgs::broadcast(sendbuff, recvbuff, count, datatype, root, me)
        })
    }
}

/// Gather to a root (as `MPI_Gather`): every rank's `sendcount` elements land at
/// block `r` of `recvbuff` on rank `root` (elements `r*sendcount ..
/// (r+1)*sendcount-1` for rank `r`), which holds `nranks * sendcount` elements.
/// `recvbuff` is used only at the root (it may be NULL elsewhere). In place at the
/// root when `sendbuff == recvbuff + root * sendcount` elements. Every rank passes the
/// same `sendcount`, `datatype` and `root`. Blocking.
///
/// Errors: `haloInvalidArgument` for a NULL `comm`, a non-NULL `stream`, an unknown
/// `datatype`, a size that overflows, a NULL buffer with `sendcount` > 0
/// (`recvbuff`: at the root), `root` out of range, or overlapping buffers at the root
/// other than in place (all before anything is sent); `haloInvalidUsage` when ranks
/// pass different counts (at the root and the rank that differs) or another thread
/// uses `comm`; `haloTimeout`, `haloRemoteError`, `haloAborted`.
///
/// # Safety
/// `comm` is NULL or a live communicator; `sendbuff` is NULL or readable for
/// `sendcount` elements; at the root `recvbuff` is NULL or writable for `nranks *
/// sendcount`; no other thread accesses them during the call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn haloGather(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    sendcount: usize,
    datatype: haloDataType_t,
    root: c_int,
    comm: haloComm_t,
    stream: haloStream_t,
) -> haloResult_t {
    // SAFETY: the buffers are valid as the contract says, for the whole call.
    unsafe {
        blocking("haloGather", comm, stream, |c| {
            let me = (c.size(), c.rank());
            RootedArgs::gather(sendbuff, recvbuff, sendcount, datatype, root, me)
        })
    }
}

/// Scatter from a root (as `MPI_Scatter`): block `r` of `sendbuff` on rank `root`
/// (elements `r*recvcount .. (r+1)*recvcount-1`; `nranks * recvcount` in all) lands
/// in `recvbuff` (`recvcount` elements) of rank `r`. `sendbuff` is used only at the
/// root (it may be NULL elsewhere). In place at the root when `recvbuff == sendbuff +
/// root * recvcount` elements. Every rank passes the same `recvcount`, `datatype` and
/// `root`. Blocking.
///
/// Errors: as `haloGather`, with `sendbuff` checked at the root and `recvbuff` on
/// every rank.
///
/// # Safety
/// `comm` is NULL or a live communicator; at the root `sendbuff` is NULL or readable
/// for `nranks * recvcount` elements; `recvbuff` is NULL or writable for `recvcount`;
/// no other thread accesses them during the call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn haloScatter(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    recvcount: usize,
    datatype: haloDataType_t,
    root: c_int,
    comm: haloComm_t,
    stream: haloStream_t,
) -> haloResult_t {
    // SAFETY: the buffers are valid as the contract says, for the whole call.
    unsafe {
        blocking("haloScatter", comm, stream, |c| {
            let me = (c.size(), c.rank());
            RootedArgs::scatter(sendbuff, recvbuff, recvcount, datatype, root, me)
        })
    }
}

/// `haloSend` with a user tag `tag` (`0 .. HALO_MAX_TAG`): it matches the
/// `haloRecvTagged` at `peer` with the same tag — the k-th send from a to b with tag t
/// meets the k-th receive at b from a with tag t — and messages with other tags do not
/// affect it. `haloSend` is tag 0.
///
/// Errors: as `haloSend`; `haloInvalidArgument` for a tag out of range.
///
/// # Safety
/// As `haloSend`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn haloSendTagged(
    sendbuff: *const c_void,
    count: usize,
    datatype: haloDataType_t,
    peer: c_int,
    tag: c_int,
    comm: haloComm_t,
    stream: haloStream_t,
) -> haloResult_t {
    // SAFETY: `sendbuff` is valid as the contract says, for the whole call.
    unsafe {
        blocking("haloSendTagged", comm, stream, |c| {
            let (with, n) = ((peer, Some(tag)), c.size());
            P2pArgs::send(sendbuff, count, datatype, with, n)
        })
    }
}

/// `haloRecv` with a user tag `tag` (see `haloSendTagged`). `haloRecv` is tag 0.
///
/// Errors: as `haloRecv`; `haloInvalidArgument` for a tag out of range.
///
/// # Safety
/// As `haloRecv`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn haloRecvTagged(
    recvbuff: *mut c_void,
    count: usize,
    datatype: haloDataType_t,
    peer: c_int,
    tag: c_int,
    comm: haloComm_t,
    stream: haloStream_t,
) -> haloResult_t {
    // SAFETY: `recvbuff` is valid as the contract says, for the whole call.
    unsafe {
        blocking("haloRecvTagged", comm, stream, |c| {
            let (with, n) = ((peer, Some(tag)), c.size());
            P2pArgs::recv(recvbuff, count, datatype, with, n)
        })
    }
}
