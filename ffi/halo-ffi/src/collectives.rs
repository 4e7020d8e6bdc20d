//! The collectives: all-to-all, all-to-all-v, barrier, send / receive, all-gather,
//! all-reduce, reduce-scatter.
//!
//! Each call checks, in this order and before anything is sent: the communicator, the
//! stream, the data type (and operation), the byte sizes (overflow), the pointers,
//! in-place use and overlap, alignment where typed elements are made. Only then are
//! slices made over the caller's memory, and the Rust communicator checks again and
//! runs the collective.

use crate::boundary::call_comm;
use crate::error::{Failure, FfiResult, haloResult_t};
use crate::handle::haloComm_t;
use crate::types::{
    check_stream, haloDataType, haloDataType_t, haloRedOp, haloRedOp_t, haloStream_t, with_elem,
};
use halo_rs::{Communicator, Partition, ReduceOp, Reducible};
use std::ffi::{c_int, c_void};

/// `count` elements of `elem` bytes for each of `ranks` ranks, in bytes; an overflow
/// (or more than `isize::MAX` bytes, which no buffer can hold) is an error.
pub(crate) fn total_bytes(count: usize, elem: usize, ranks: usize, what: &str) -> FfiResult<usize> {
    count
        .checked_mul(elem)
        .and_then(|b| b.checked_mul(ranks))
        .filter(|&b| b <= isize::MAX as usize)
        .ok_or_else(|| {
            Failure::invalid(format!(
                "{what} {count} x {elem} bytes x {ranks} ranks overflows the address space"
            ))
        })
}

/// A buffer that must hold `bytes` bytes may be NULL only when `bytes` is 0.
pub(crate) fn check_buffer(
    ptr: *const c_void,
    bytes: usize,
    what: &str,
    count: usize,
) -> FfiResult<()> {
    if ptr.is_null() && bytes > 0 {
        Err(Failure::invalid(format!(
            "{what} is NULL but count is {count}"
        )))
    } else {
        Ok(())
    }
}

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
    call_comm("haloAllToAll", comm, |c| {
        let elem = haloDataType::from_raw(datatype)?.size();
        let bytes = total_bytes(count, elem, c.size(), "count")?;
        check_buffer(sendbuff, bytes, "sendbuff", count)?;
        check_buffer(recvbuff, bytes, "recvbuff", count)?;
        if bytes > 0 && sendbuff == recvbuff.cast_const() {
            return Err(Failure::invalid(
                "sendbuff == recvbuff: in-place all-to-all is not supported (HALO's \
                 all-to-all is out-of-place; use a separate receive buffer)",
            ));
        }
        if !stream.is_null() {
            // The device path (issue 17).
            // SAFETY: the contract with a stream: device buffers of `bytes` bytes.
            return unsafe {
                crate::device::all_to_all(c, sendbuff, recvbuff, count, elem, stream)
            };
        }
        let mut guard = c.lock()?;
        // SAFETY: per the contract the buffers are valid for `bytes` bytes (checked to
        // be non-NULL when non-empty) and not accessed by anyone else; the
        // communicator checks overlap before making references to them.
        unsafe {
            halo_rs::c_abi::all_to_all(&mut guard, sendbuff.cast(), recvbuff.cast(), count, elem)?;
        }
        Ok(())
    })
}

/// Reads `n` counts or displacements from C.
///
/// # Safety
/// `ptr` is NULL or readable for `n` `size_t`s.
pub(crate) unsafe fn counts<'a>(ptr: *const usize, n: usize, what: &str) -> FfiResult<&'a [usize]> {
    if ptr.is_null() {
        return Err(Failure::invalid(format!(
            "{what} is NULL (it needs one entry per rank: {n})"
        )));
    }
    // SAFETY: non-NULL and readable for `n` entries per the contract; `usize` is
    // `size_t`.
    Ok(unsafe { std::slice::from_raw_parts(ptr, n) })
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
    call_comm("haloAllToAllv", comm, |c| {
        let elem = haloDataType::from_raw(datatype)?.size();
        let n = c.size();
        // SAFETY: (four reads) each array is NULL or holds `n` entries per the contract.
        let (sc, sd, rc, rd) = unsafe {
            (
                counts(sendcounts, n, "sendcounts")?,
                counts(sdispls, n, "sdispls")?,
                counts(recvcounts, n, "recvcounts")?,
                counts(rdispls, n, "rdispls")?,
            )
        };
        if !stream.is_null() {
            // The device path (issue 17).
            // SAFETY: the contract with a stream: device buffers covering what the
            // counts and displacements reach.
            return unsafe {
                crate::device::all_to_all_v(c, sendbuff, (sc, sd), recvbuff, (rc, rd), elem, stream)
            };
        }
        let mut guard = c.lock()?;
        // SAFETY: per the contract the buffers cover what the counts and displacements
        // reach and nobody else accesses them; the communicator checks extents, NULL and
        // overlap before making references to them.
        unsafe {
            let (sp, rp) = (Partition::new(sc, sd), Partition::new(rc, rd));
            halo_rs::c_abi::all_to_all_v(
                &mut guard,
                sendbuff.cast(),
                &sp,
                recvbuff.cast(),
                &rp,
                elem,
            )?;
        }
        Ok(())
    })
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
    call_comm("haloBarrier", comm, |c| {
        c.lock()?.barrier()?;
        Ok(())
    })
}

/// Whether two byte ranges share a byte.
pub(crate) fn overlaps(a: *const c_void, a_len: usize, b: *const c_void, b_len: usize) -> bool {
    let (a, b) = (a as usize, b as usize);
    a_len > 0 && b_len > 0 && a < b.saturating_add(b_len) && b < a.saturating_add(a_len)
}

/// The caller's memory as bytes.
///
/// # Safety
/// When `len` > 0: `ptr` is non-NULL and readable for `len` bytes, not written by
/// anyone during the returned lifetime.
pub(crate) unsafe fn bytes<'a>(ptr: *const c_void, len: usize) -> &'a [u8] {
    if len == 0 {
        return &[];
    }
    // SAFETY: per the contract; `u8` needs no alignment.
    unsafe { std::slice::from_raw_parts(ptr.cast(), len) }
}

/// The caller's memory as writable bytes.
///
/// # Safety
/// When `len` > 0: `ptr` is non-NULL and writable for `len` bytes, accessed by nobody
/// else during the returned lifetime (no other slice over it exists).
pub(crate) unsafe fn bytes_mut<'a>(ptr: *mut c_void, len: usize) -> &'a mut [u8] {
    if len == 0 {
        return &mut [];
    }
    // SAFETY: per the contract; `u8` needs no alignment.
    unsafe { std::slice::from_raw_parts_mut(ptr.cast(), len) }
}

/// A peer argument, checked against the communicator's size.
pub(crate) fn peer_index(peer: c_int, n: usize) -> FfiResult<usize> {
    usize::try_from(peer)
        .ok()
        .filter(|&p| p < n)
        .ok_or_else(|| {
            Failure::invalid(format!(
                "peer {peer} is out of range for {n} ranks (0 .. {})",
                n.saturating_sub(1)
            ))
        })
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
    call_comm("haloSend", comm, |c| {
        check_stream(stream)?;
        let elem = haloDataType::from_raw(datatype)?.size();
        let len = total_bytes(count, elem, 1, "count")?;
        check_buffer(sendbuff, len, "sendbuff", count)?;
        let peer = peer_index(peer, c.size())?;
        let mut guard = c.lock()?;
        // SAFETY: non-NULL when `len` > 0 (checked), readable for `len` bytes and not
        // written during the call per the contract.
        let send = unsafe { bytes(sendbuff, len) };
        guard.send(send, peer)?;
        Ok(())
    })
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
    call_comm("haloRecv", comm, |c| {
        check_stream(stream)?;
        let elem = haloDataType::from_raw(datatype)?.size();
        let len = total_bytes(count, elem, 1, "count")?;
        check_buffer(recvbuff, len, "recvbuff", count)?;
        let peer = peer_index(peer, c.size())?;
        let mut guard = c.lock()?;
        // SAFETY: non-NULL when `len` > 0 (checked), writable for `len` bytes and
        // accessed by nobody else per the contract.
        let recv = unsafe { bytes_mut(recvbuff, len) };
        guard.recv(recv, peer)?;
        Ok(())
    })
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
    call_comm("haloAllGather", comm, |c| {
        check_stream(stream)?;
        let a = check_all_gather(
            sendbuff,
            recvbuff,
            sendcount,
            datatype,
            (c.size(), c.rank()),
        )?;
        let mut guard = c.lock()?;
        // SAFETY: checked above (NULL, overlap) or promised by the contract.
        unsafe { run_all_gather(&mut guard, a) }?;
        Ok(())
    })
}

/// An all-gather's checked arguments: addresses (as numbers, for the worker of the
/// non-blocking form), the block and total bytes, whether it is in place.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AllGatherArgs {
    send: usize,
    recv: usize,
    block: usize,
    total: usize,
    in_place: bool,
}

/// Checks `haloAllGather`'s arguments (`n` ranks, this rank `me`).
pub(crate) fn check_all_gather(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    sendcount: usize,
    datatype: haloDataType_t,
    (n, me): (usize, usize),
) -> FfiResult<AllGatherArgs> {
    let elem = haloDataType::from_raw(datatype)?.size();
    let block = total_bytes(sendcount, elem, 1, "sendcount")?;
    let total = total_bytes(sendcount, elem, n, "sendcount")?;
    check_buffer(sendbuff, block, "sendbuff", sendcount)?;
    check_buffer(recvbuff, total, "recvbuff", sendcount)?;
    // `block * me` < `total`, which did not overflow.
    let own = (recvbuff as usize).wrapping_add(block * me);
    let in_place = block > 0 && sendbuff as usize == own;
    if !in_place && overlaps(sendbuff, block, recvbuff.cast_const(), total) {
        return Err(Failure::invalid(
            "sendbuff overlaps recvbuff: out-of-place, or in place with sendbuff == \
             recvbuff + rank * sendcount elements",
        ));
    }
    Ok(AllGatherArgs {
        send: sendbuff as usize,
        recv: recvbuff as usize,
        block,
        total,
        in_place,
    })
}

/// Runs a checked all-gather.
///
/// # Safety
/// The buffers of `a` are valid as `haloAllGather`'s contract says, and nobody else
/// accesses them during the call.
pub(crate) unsafe fn run_all_gather(
    comm: &mut Communicator,
    a: AllGatherArgs,
) -> halo_rs::Result<()> {
    // In place, this rank's block is copied out of `recvbuff` first, so that the
    // send and receive slices never alias.
    let copy: Vec<u8>;
    let send: &[u8] = if a.in_place {
        // SAFETY: non-NULL (`block` > 0) and readable per the contract; the slice ends
        // with this statement, before any slice over `recvbuff` exists.
        copy = unsafe { bytes(a.send as *const c_void, a.block) }.to_vec();
        &copy
    } else {
        // SAFETY: non-NULL when `block` > 0 (checked), readable and unwritten per the
        // contract, and disjoint from `recvbuff` (checked).
        unsafe { bytes(a.send as *const c_void, a.block) }
    };
    // SAFETY: non-NULL when `total` > 0 (checked), writable for `total` bytes and
    // accessed by nobody else; `send` is the copy or does not overlap it.
    let recv = unsafe { bytes_mut(a.recv as *mut c_void, a.total) };
    comm.all_gather(send, recv)
}

/// The typed all-reduce over the caller's memory.
///
/// # Safety
/// `send` and `recv` are non-NULL when `count` > 0, readable (`send`) and writable
/// (`recv`) for `count` elements of `E`, and not accessed by another thread; they are
/// either equal (in place) or do not overlap (both checked by the caller).
unsafe fn reduce_typed<E: Reducible>(
    comm: &mut Communicator,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    op: ReduceOp,
    name: &str,
) -> FfiResult<()> {
    let align = std::mem::align_of::<E>();
    if count > 0 {
        for (ptr, what) in [(send as usize, "sendbuff"), (recv as usize, "recvbuff")] {
            if ptr % align != 0 {
                return Err(Failure::invalid(format!(
                    "{what} is not aligned to {align} bytes, as {name} elements must be"
                )));
            }
        }
    }
    if count > 0 && send == recv.cast_const() {
        // SAFETY: non-NULL, aligned (checked), writable for `count` elements per the
        // contract, and the only slice over that memory.
        let buf = unsafe { std::slice::from_raw_parts_mut(recv.cast::<E>(), count) };
        comm.all_reduce_in_place(buf, op)?;
        return Ok(());
    }
    let (s, r): (&[E], &mut [E]) = if count == 0 {
        (&[], &mut [])
    } else {
        // SAFETY: non-NULL, aligned (checked), valid for `count` elements per the
        // contract, and the two ranges do not overlap (checked by the caller).
        unsafe {
            (
                std::slice::from_raw_parts(send.cast::<E>(), count),
                std::slice::from_raw_parts_mut(recv.cast::<E>(), count),
            )
        }
    };
    comm.all_reduce(s, r, op)?;
    Ok(())
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
    call_comm("haloAllReduce", comm, |c| {
        check_stream(stream)?;
        let dt = haloDataType::from_raw(datatype)?;
        let op = haloRedOp::from_raw(op)?;
        let len = total_bytes(count, dt.size(), 1, "count")?;
        check_buffer(sendbuff, len, "sendbuff", count)?;
        check_buffer(recvbuff, len, "recvbuff", count)?;
        if sendbuff != recvbuff.cast_const() && overlaps(sendbuff, len, recvbuff.cast_const(), len)
        {
            return Err(Failure::invalid(
                "sendbuff and recvbuff overlap: pass the same pointer for an in-place \
                 all-reduce, or separate buffers",
            ));
        }
        let name = format!("{dt:?}");
        let mut guard = c.lock()?;
        let comm: &mut Communicator = &mut guard;
        let (s, r) = (sendbuff, recvbuff);
        // SAFETY: non-NULL when `count` > 0, valid for `count` elements, equal or
        // disjoint: checked above or promised by the contract.
        with_elem!(dt, E => unsafe { reduce_typed::<E>(comm, s, r, count, op, &name) })
    })
}

/// A reduce-scatter's arguments, checked (`haloReduceScatter`, `haloIReduceScatter`):
/// the element type and the operation, and whether it is in place.
pub(crate) struct ReduceScatterArgs {
    pub(crate) dt: haloDataType,
    pub(crate) op: ReduceOp,
    pub(crate) in_place: bool,
}

/// Checks a reduce-scatter's arguments for a communicator of `n` ranks, this rank
/// `me`: data type, operation, sizes, NULL, overlap (in place only as NCCL's, `recvbuff
/// == sendbuff + me * recvcount` elements) and alignment.
pub(crate) fn check_reduce_scatter(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    recvcount: usize,
    datatype: haloDataType_t,
    op: haloRedOp_t,
    (n, me): (usize, usize),
) -> FfiResult<ReduceScatterArgs> {
    let dt = haloDataType::from_raw(datatype)?;
    let op = haloRedOp::from_raw(op)?;
    let elem = dt.size();
    let block = total_bytes(recvcount, elem, 1, "recvcount")?;
    let total = total_bytes(recvcount, elem, n, "recvcount")?;
    check_buffer(sendbuff, total, "sendbuff", recvcount)?;
    check_buffer(recvbuff, block, "recvbuff", recvcount)?;
    // `block * me` < `total`, which did not overflow.
    let own = (sendbuff as usize).wrapping_add(block * me);
    let in_place = block > 0 && recvbuff as usize == own;
    if !in_place && overlaps(sendbuff, total, recvbuff.cast_const(), block) {
        return Err(Failure::invalid(
            "recvbuff overlaps sendbuff: out-of-place, or in place with recvbuff == \
             sendbuff + rank * recvcount elements",
        ));
    }
    if block > 0
        && !((sendbuff as usize).is_multiple_of(elem) && (recvbuff as usize).is_multiple_of(elem))
    {
        return Err(Failure::invalid(format!(
            "sendbuff or recvbuff is not aligned to {elem} bytes, as {dt:?} elements must be"
        )));
    }
    Ok(ReduceScatterArgs { dt, op, in_place })
}

/// The typed reduce-scatter over the caller's memory (addresses as numbers, so that
/// the non-blocking form can move them to the worker).
///
/// # Safety
/// `send` is readable for `size * count` and `recv` writable for `count` elements of
/// `E`, both aligned and non-NULL when `count` > 0, not accessed by anyone else during
/// the call; they do not overlap unless `in_place` (`recv` is block `rank` of `send`).
pub(crate) unsafe fn reduce_scatter_typed<E: Reducible>(
    comm: &mut Communicator,
    send: usize,
    recv: usize,
    count: usize,
    op: ReduceOp,
    in_place: bool,
) -> halo_rs::Result<()> {
    if count == 0 {
        return comm.reduce_scatter::<E>(&[], &mut [], op);
    }
    let total = count * comm.size();
    if in_place {
        // SAFETY: readable, aligned and non-NULL for `total` elements per the contract;
        // the slice ends with this statement, before the slice over `recv` exists.
        let copy = unsafe { std::slice::from_raw_parts(send as *const E, total) }.to_vec();
        // SAFETY: writable, aligned and non-NULL for `count` elements, and the only
        // slice over that memory now.
        let r = unsafe { std::slice::from_raw_parts_mut(recv as *mut E, count) };
        return comm.reduce_scatter(&copy, r, op);
    }
    // SAFETY: valid, aligned and non-NULL for their lengths per the contract, and
    // disjoint (checked by the caller).
    let (s, r) = unsafe {
        (
            std::slice::from_raw_parts(send as *const E, total),
            std::slice::from_raw_parts_mut(recv as *mut E, count),
        )
    };
    comm.reduce_scatter(s, r, op)
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
    call_comm("haloReduceScatter", comm, |c| {
        check_stream(stream)?;
        let a = check_reduce_scatter(
            sendbuff,
            recvbuff,
            recvcount,
            datatype,
            op,
            (c.size(), c.rank()),
        )?;
        let mut guard = c.lock()?;
        let (s, r) = (sendbuff as usize, recvbuff as usize);
        // SAFETY: checked above (NULL, alignment, overlap) or promised by the contract.
        with_elem!(a.dt, E => unsafe {
            reduce_scatter_typed::<E>(&mut guard, s, r, recvcount, a.op, a.in_place)
        })?;
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_totals_overflow() {
        assert_eq!(total_bytes(3, 4, 5, "count").unwrap(), 60);
        assert_eq!(total_bytes(0, 8, 5, "count").unwrap(), 0);
        let e = total_bytes(usize::MAX / 2, 4, 2, "count").unwrap_err();
        assert!(e.message.contains("overflows"), "{}", e.message);
        assert!(total_bytes(isize::MAX as usize / 4 + 1, 4, 1, "c").is_err());
    }

    #[test]
    fn null_buffers() {
        assert!(check_buffer(std::ptr::null(), 0, "sendbuff", 0).is_ok());
        let e = check_buffer(std::ptr::null(), 8, "sendbuff", 2).unwrap_err();
        assert_eq!(e.message, "sendbuff is NULL but count is 2");
    }
}
