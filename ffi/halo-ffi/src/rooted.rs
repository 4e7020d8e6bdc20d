//! The rooted collectives — broadcast, gather, scatter — and point-to-point with a
//! user tag: `haloBroadcast`, `haloGather`, `haloScatter`, `haloSendTagged`,
//! `haloRecvTagged`. Their non-blocking forms (`requests` module) share the checks and
//! the runners here: a `check_*` function validates everything before anything is
//! sent and keeps the addresses; a `run_*` function makes the slices and runs the
//! communicator's call (on the caller's thread, or on the communicator's worker).

use crate::boundary::call_comm;
use crate::collectives::{bytes, bytes_mut, check_buffer, overlaps, peer_index, total_bytes};
use crate::error::{Failure, FfiResult, haloResult_t};
use crate::handle::haloComm_t;
use crate::types::{HALO_MAX_TAG, check_stream, haloDataType, haloDataType_t, haloStream_t};
use halo_rs::Communicator;
use std::ffi::{c_int, c_void};

/// A root argument, checked against the communicator's size.
fn root_index(root: c_int, n: usize) -> FfiResult<usize> {
    usize::try_from(root)
        .ok()
        .filter(|&r| r < n)
        .ok_or_else(|| {
            Failure::invalid(format!(
                "root {root} is out of range for {n} ranks (0 .. {})",
                n.saturating_sub(1)
            ))
        })
}

/// A user tag, checked against `HALO_MAX_TAG`.
pub(crate) fn tag_value(tag: c_int) -> FfiResult<u32> {
    u32::try_from(tag)
        .ok()
        .filter(|&t| t <= HALO_MAX_TAG as u32)
        .ok_or_else(|| {
            Failure::invalid(format!(
                "tag {tag} is out of range (0 .. HALO_MAX_TAG = {HALO_MAX_TAG})"
            ))
        })
}

/// A rooted call's checked arguments: addresses (as numbers, so that the worker can
/// take them), this rank's byte sizes, the root.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RootedArgs {
    send: usize,
    recv: usize,
    /// Bytes per rank (the block, or the broadcast buffer).
    block: usize,
    /// `nranks * block`.
    total: usize,
    root: usize,
    me: usize,
    /// The root's buffers overlap as NCCL's in-place form allows.
    in_place: bool,
}

/// Checks `haloBroadcast`'s arguments (`n` ranks, this rank `me`).
pub(crate) fn check_broadcast(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: haloDataType_t,
    root: c_int,
    (n, me): (usize, usize),
) -> FfiResult<RootedArgs> {
    let elem = haloDataType::from_raw(datatype)?.size();
    let len = total_bytes(count, elem, 1, "count")?;
    let root = root_index(root, n)?;
    check_buffer(recvbuff, len, "recvbuff", count)?;
    let in_place = sendbuff == recvbuff.cast_const();
    if me == root {
        check_buffer(sendbuff, len, "sendbuff", count)?;
        if !in_place && overlaps(sendbuff, len, recvbuff.cast_const(), len) {
            return Err(Failure::invalid(
                "sendbuff and recvbuff overlap at the root: pass the same pointer for an \
                 in-place broadcast, or separate buffers",
            ));
        }
    }
    Ok(RootedArgs {
        send: sendbuff as usize,
        recv: recvbuff as usize,
        block: len,
        total: len,
        root,
        me,
        in_place,
    })
}

/// Runs a checked broadcast.
///
/// # Safety
/// The buffers of `a` are valid as `haloBroadcast`'s contract says, and nobody else
/// accesses them during the call.
pub(crate) unsafe fn run_broadcast(comm: &mut Communicator, a: RootedArgs) -> halo_rs::Result<()> {
    if a.me == a.root && !a.in_place && a.block > 0 {
        // SAFETY: both non-NULL (checked: `block` > 0), readable / writable for `block`
        // bytes per the contract, and disjoint (checked).
        unsafe {
            std::ptr::copy_nonoverlapping(a.send as *const u8, a.recv as *mut u8, a.block);
        }
    }
    // SAFETY: non-NULL when `block` > 0 (checked), writable for `block` bytes and
    // accessed by nobody else per the contract.
    let buf = unsafe { bytes_mut(a.recv as *mut c_void, a.block) };
    comm.broadcast(buf, a.root)
}

/// Checks `haloGather`'s arguments (`n` ranks, this rank `me`).
pub(crate) fn check_gather(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    sendcount: usize,
    datatype: haloDataType_t,
    root: c_int,
    (n, me): (usize, usize),
) -> FfiResult<RootedArgs> {
    let elem = haloDataType::from_raw(datatype)?.size();
    let block = total_bytes(sendcount, elem, 1, "sendcount")?;
    let total = total_bytes(sendcount, elem, n, "sendcount")?;
    let root = root_index(root, n)?;
    check_buffer(sendbuff, block, "sendbuff", sendcount)?;
    let mut in_place = false;
    if me == root {
        check_buffer(recvbuff, total, "recvbuff", sendcount)?;
        // `block * root` < `total`, which did not overflow.
        let own = (recvbuff as usize).wrapping_add(block * root);
        in_place = block > 0 && sendbuff as usize == own;
        if !in_place && overlaps(sendbuff, block, recvbuff.cast_const(), total) {
            return Err(Failure::invalid(
                "sendbuff overlaps recvbuff at the root: out-of-place, or in place with \
                 sendbuff == recvbuff + root * sendcount elements",
            ));
        }
    }
    Ok(RootedArgs {
        send: sendbuff as usize,
        recv: recvbuff as usize,
        block,
        total,
        root,
        me,
        in_place,
    })
}

/// Runs a checked gather.
///
/// # Safety
/// The buffers of `a` are valid as `haloGather`'s contract says, and nobody else
/// accesses them during the call.
pub(crate) unsafe fn run_gather(comm: &mut Communicator, a: RootedArgs) -> halo_rs::Result<()> {
    if a.me != a.root {
        // SAFETY: non-NULL when `block` > 0 (checked), readable and unwritten.
        let send = unsafe { bytes(a.send as *const c_void, a.block) };
        return comm.gather(send, &mut [], a.root);
    }
    // In place, this rank's block is copied out of `recvbuff` first, so that the send
    // and receive slices never alias.
    let copy: Vec<u8>;
    let send: &[u8] = if a.in_place {
        // SAFETY: non-NULL (`block` > 0) and readable; the slice ends with this
        // statement, before any slice over `recvbuff` exists.
        copy = unsafe { bytes(a.send as *const c_void, a.block) }.to_vec();
        &copy
    } else {
        // SAFETY: non-NULL when `block` > 0 (checked), readable, disjoint from
        // `recvbuff` (checked).
        unsafe { bytes(a.send as *const c_void, a.block) }
    };
    // SAFETY: non-NULL when `total` > 0 (checked), writable for `total` bytes and
    // accessed by nobody else; `send` is the copy or does not overlap it.
    let recv = unsafe { bytes_mut(a.recv as *mut c_void, a.total) };
    comm.gather(send, recv, a.root)
}

/// Checks `haloScatter`'s arguments (`n` ranks, this rank `me`).
pub(crate) fn check_scatter(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    recvcount: usize,
    datatype: haloDataType_t,
    root: c_int,
    (n, me): (usize, usize),
) -> FfiResult<RootedArgs> {
    let elem = haloDataType::from_raw(datatype)?.size();
    let block = total_bytes(recvcount, elem, 1, "recvcount")?;
    let total = total_bytes(recvcount, elem, n, "recvcount")?;
    let root = root_index(root, n)?;
    check_buffer(recvbuff, block, "recvbuff", recvcount)?;
    let mut in_place = false;
    if me == root {
        check_buffer(sendbuff, total, "sendbuff", recvcount)?;
        // `block * root` < `total`, which did not overflow.
        let own = (sendbuff as usize).wrapping_add(block * root);
        in_place = block > 0 && recvbuff as usize == own;
        if !in_place && overlaps(sendbuff, total, recvbuff.cast_const(), block) {
            return Err(Failure::invalid(
                "recvbuff overlaps sendbuff at the root: out-of-place, or in place with \
                 recvbuff == sendbuff + root * recvcount elements",
            ));
        }
    }
    Ok(RootedArgs {
        send: sendbuff as usize,
        recv: recvbuff as usize,
        block,
        total,
        root,
        me,
        in_place,
    })
}

/// Runs a checked scatter.
///
/// # Safety
/// The buffers of `a` are valid as `haloScatter`'s contract says, and nobody else
/// accesses them during the call.
pub(crate) unsafe fn run_scatter(comm: &mut Communicator, a: RootedArgs) -> halo_rs::Result<()> {
    if a.me != a.root {
        // SAFETY: non-NULL when `block` > 0 (checked), writable for `block` bytes and
        // accessed by nobody else.
        let recv = unsafe { bytes_mut(a.recv as *mut c_void, a.block) };
        return comm.scatter(&[], recv, a.root);
    }
    // In place, the root's send buffer (which holds `recvbuff`) is copied first, so
    // that the send and receive slices never alias.
    let copy: Vec<u8>;
    let send: &[u8] = if a.in_place {
        // SAFETY: non-NULL (`block` > 0, so `total` > 0) and readable for `total`
        // bytes; the slice ends with this statement, before the slice over `recvbuff`.
        copy = unsafe { bytes(a.send as *const c_void, a.total) }.to_vec();
        &copy
    } else {
        // SAFETY: non-NULL when `total` > 0 (checked), readable, disjoint from
        // `recvbuff` (checked).
        unsafe { bytes(a.send as *const c_void, a.total) }
    };
    // SAFETY: non-NULL when `block` > 0 (checked), writable for `block` bytes and
    // accessed by nobody else; `send` is the copy or does not overlap it.
    let recv = unsafe { bytes_mut(a.recv as *mut c_void, a.block) };
    comm.scatter(send, recv, a.root)
}

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
    call_comm("haloBroadcast", comm, |c| {
        check_stream(stream)?;
        let a = check_broadcast(
            sendbuff,
            recvbuff,
            count,
            datatype,
            root,
            (c.size(), c.rank()),
        )?;
        let mut guard = c.lock()?;
        // SAFETY: checked above (NULL, overlap) or promised by the contract.
        unsafe { run_broadcast(&mut guard, a) }?;
        Ok(())
    })
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
    call_comm("haloGather", comm, |c| {
        check_stream(stream)?;
        let a = check_gather(
            sendbuff,
            recvbuff,
            sendcount,
            datatype,
            root,
            (c.size(), c.rank()),
        )?;
        let mut guard = c.lock()?;
        // SAFETY: checked above (NULL, overlap) or promised by the contract.
        unsafe { run_gather(&mut guard, a) }?;
        Ok(())
    })
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
    call_comm("haloScatter", comm, |c| {
        check_stream(stream)?;
        let a = check_scatter(
            sendbuff,
            recvbuff,
            recvcount,
            datatype,
            root,
            (c.size(), c.rank()),
        )?;
        let mut guard = c.lock()?;
        // SAFETY: checked above (NULL, overlap) or promised by the contract.
        unsafe { run_scatter(&mut guard, a) }?;
        Ok(())
    })
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
    call_comm("haloSendTagged", comm, |c| {
        check_stream(stream)?;
        let elem = haloDataType::from_raw(datatype)?.size();
        let len = total_bytes(count, elem, 1, "count")?;
        check_buffer(sendbuff, len, "sendbuff", count)?;
        let peer = peer_index(peer, c.size())?;
        let tag = tag_value(tag)?;
        let mut guard = c.lock()?;
        // SAFETY: non-NULL when `len` > 0 (checked), readable for `len` bytes and not
        // written during the call per the contract.
        let send = unsafe { bytes(sendbuff, len) };
        guard.send_tagged(send, peer, tag)?;
        Ok(())
    })
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
    call_comm("haloRecvTagged", comm, |c| {
        check_stream(stream)?;
        let elem = haloDataType::from_raw(datatype)?.size();
        let len = total_bytes(count, elem, 1, "count")?;
        check_buffer(recvbuff, len, "recvbuff", count)?;
        let peer = peer_index(peer, c.size())?;
        let tag = tag_value(tag)?;
        let mut guard = c.lock()?;
        // SAFETY: non-NULL when `len` > 0 (checked), writable for `len` bytes and
        // accessed by nobody else per the contract.
        let recv = unsafe { bytes_mut(recvbuff, len) };
        guard.recv_tagged(recv, peer, tag)?;
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roots_and_tags() {
        assert_eq!(root_index(2, 3).unwrap(), 2);
        let e = root_index(3, 3).unwrap_err();
        assert_eq!(e.message, "root 3 is out of range for 3 ranks (0 .. 2)");
        assert!(root_index(-1, 3).is_err());
        assert_eq!(tag_value(HALO_MAX_TAG).unwrap(), HALO_MAX_TAG as u32);
        let e = tag_value(HALO_MAX_TAG + 1).unwrap_err();
        assert!(e.message.contains("out of range"), "{}", e.message);
        assert!(tag_value(-1).is_err());
    }
}
