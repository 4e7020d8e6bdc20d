//! The collectives: all-to-all, all-to-all-v, barrier.
//!
//! Each call checks, in this order and before anything is sent: the communicator, the
//! stream, the data type, the byte sizes (overflow), the pointers, in-place use. Then
//! the Rust communicator checks again and runs the collective.

use crate::boundary::call_comm;
use crate::error::{Failure, FfiResult, haloResult_t};
use crate::handle::haloComm_t;
use crate::types::{check_stream, haloDataType, haloDataType_t, haloStream_t};
use std::ffi::c_void;

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
/// Errors (nothing is sent and `recvbuff` is untouched):
/// - `haloInvalidArgument`: NULL `comm`; a non-NULL `stream`; `datatype` not a
///   `haloDataType`; `count * size * nranks` overflows; `sendbuff` or `recvbuff` NULL
///   with `count` > 0; `sendbuff == recvbuff` (in-place) or overlapping buffers.
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
        check_stream(stream)?;
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
        let mut guard = c.lock()?;
        // SAFETY: per the contract the buffers are valid for `bytes` bytes (checked to
        // be non-NULL when non-empty) and not accessed by anyone else; the
        // communicator checks overlap before making references to them.
        unsafe {
            guard.all_to_all_raw(sendbuff.cast(), recvbuff.cast(), count, elem)?;
        }
        Ok(())
    })
}

/// Reads `n` counts or displacements from C.
///
/// # Safety
/// `ptr` is NULL or readable for `n` `size_t`s.
unsafe fn counts<'a>(ptr: *const usize, n: usize, what: &str) -> FfiResult<&'a [usize]> {
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
/// - `haloInvalidArgument`, found on this rank before anything is sent: NULL `comm`;
///   a non-NULL `stream`; `datatype` not a `haloDataType`; a NULL count or
///   displacement array.
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
        check_stream(stream)?;
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
        let mut guard = c.lock()?;
        // SAFETY: per the contract the buffers cover what the counts and displacements
        // reach and nobody else accesses them; the communicator checks extents, NULL and
        // overlap before making references to them.
        unsafe {
            guard.all_to_all_v_raw(sendbuff.cast(), sc, sd, recvbuff.cast(), rc, rd, elem)?;
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
