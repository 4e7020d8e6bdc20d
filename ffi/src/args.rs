//! One argument checker for every collective (NCCL's `ncclInfo` and `argcheck.cc`).
//!
//! Each call shape has one struct and one `decode`: it turns the C arguments into
//! checked values (addresses as numbers, so that a request's worker can take them;
//! byte sizes, ranks, the element type) before anything is sent: the data type (and
//! operation) first, then, in the order each call documents, the byte sizes
//! (overflow), the pointers, the peer, root or tag, in-place use and overlap, and
//! alignment where typed elements are made. The stream or the request is checked
//! before `decode`, by the form. Its `run` ([`Op::run`]) makes the slices over the
//! caller's memory and runs the communicator's call: on the caller's thread for the
//! blocking form ([`blocking`], [`blocking_or_stream`]), moved into the job of the
//! communicator's worker for the non-blocking one (`requests` module). The Rust
//! communicator checks again.
//!
//! Over 800 lines: it is one checker for all eight call shapes (all-to-all,
//! all-to-all-v, barrier, point-to-point, all-gather, all-reduce, reduce-scatter, the
//! rooted calls), and every shape's `decode` uses the same private checks (byte
//! totals and blocks, buffers, overlap, counts, rank, peer, root and tag) and the same
//! `unsafe` slice makers with their safety contracts; kept together, each check is
//! written and reviewed once, in the order the calls document, so it stays one file.

use crate::boundary::call_comm;
use crate::error::{Failure, FfiResult, haloResult_t};
use crate::handle::{haloComm, haloComm_t};
use crate::types::{
    HALO_MAX_TAG, check_stream, haloDataType, haloDataType_t, haloRedOp, haloRedOp_t, haloStream_t,
    with_elem,
};
use halo_rs::{Communicator, Partition, ReduceOp, Reducible};
use std::ffi::{c_int, c_void};

/// A call's decoded and checked arguments, ready to run.
pub(crate) trait Op {
    /// Runs the call on `comm` over the caller's memory.
    ///
    /// # Safety
    /// The buffers the arguments name are valid as the call's contract says (readable,
    /// writable, for the sizes checked) and accessed by nobody else until this returns.
    unsafe fn run(self, comm: &mut Communicator) -> halo_rs::Result<()>;
}

/// A call that also runs on device buffers, enqueued on a stream (the device path,
/// issue 17: `haloAllToAll`, `haloAllToAllv`).
pub(crate) trait DeviceOp: Op {
    /// Enqueues the call on `stream`.
    ///
    /// # Safety
    /// As the call's contract with a stream: device buffers covering what the
    /// arguments reach.
    unsafe fn run_on_stream(self, c: &haloComm, stream: haloStream_t) -> FfiResult<()>;
}

/// Runs `a` on this thread once the communicator is held (after the requests started
/// before it).
///
/// # Safety
/// As [`Op::run`].
unsafe fn run_held<A: Op>(c: &haloComm, a: A) -> FfiResult<()> {
    let mut guard = c.lock()?;
    // SAFETY: as this function's contract says.
    unsafe { a.run(&mut guard) }?;
    Ok(())
}

/// The body of a blocking collective on the host: the stream must be NULL, `decode`
/// checks the arguments, and the call runs on this thread.
///
/// # Safety
/// `comm` is NULL or a live communicator, and the buffers that `decode`'s arguments
/// name are valid as the calling function's contract says, for the whole call.
pub(crate) unsafe fn blocking<A: Op>(
    name: &str,
    comm: haloComm_t,
    stream: haloStream_t,
    decode: impl FnOnce(&haloComm) -> FfiResult<A>,
) -> haloResult_t {
    call_comm(name, comm, |c| {
        check_stream(stream)?;
        let a = decode(c)?;
        // SAFETY: checked by `decode` (NULL, sizes, overlap, alignment) or promised by
        // the calling function's contract, as this function's contract says.
        unsafe { run_held(c, a) }
    })
}

/// The body of a blocking collective that takes device buffers with a stream:
/// `decode` checks the arguments; with a non-NULL `stream` the call is enqueued on it
/// (the device path), else it runs on this thread on the host.
///
/// # Safety
/// As [`blocking`], with device buffers when `stream` is not NULL.
pub(crate) unsafe fn blocking_or_stream<A: DeviceOp>(
    name: &str,
    comm: haloComm_t,
    stream: haloStream_t,
    decode: impl FnOnce(&haloComm) -> FfiResult<A>,
) -> haloResult_t {
    call_comm(name, comm, |c| {
        let a = decode(c)?;
        if !stream.is_null() {
            // SAFETY: the contract with a stream: device buffers of the checked sizes.
            return unsafe { a.run_on_stream(c, stream) };
        }
        // SAFETY: checked by `decode` or promised by the calling function's contract.
        unsafe { run_held(c, a) }
    })
}

/// `count` elements of `elem` bytes for each of `ranks` ranks, in bytes; an overflow
/// (or more than `isize::MAX` bytes, which no buffer can hold) is an error.
fn total_bytes(count: usize, elem: usize, ranks: usize, what: &str) -> FfiResult<usize> {
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

/// One rank's block (`count` elements of `elem` bytes) and `ranks` of them, in bytes.
fn blocks(count: usize, elem: usize, ranks: usize, what: &str) -> FfiResult<(usize, usize)> {
    Ok((
        total_bytes(count, elem, 1, what)?,
        total_bytes(count, elem, ranks, what)?,
    ))
}

/// A buffer that must hold `bytes` bytes may be NULL only when `bytes` is 0.
fn check_buffer(ptr: *const c_void, bytes: usize, what: &str, count: usize) -> FfiResult<()> {
    if ptr.is_null() && bytes > 0 {
        Err(Failure::invalid(format!(
            "{what} is NULL but count is {count}"
        )))
    } else {
        Ok(())
    }
}

/// Whether two byte ranges share a byte.
fn overlaps(a: *const c_void, a_len: usize, b: *const c_void, b_len: usize) -> bool {
    let (a, b) = (a as usize, b as usize);
    a_len > 0 && b_len > 0 && a < b.saturating_add(b_len) && b < a.saturating_add(a_len)
}

/// Whether `part` (one `block`) is block `index` of `whole` (`total` bytes), NCCL's
/// in-place form; any other overlap is an error with `overlap` as its message.
fn block_in_place(
    part: *const c_void,
    whole: *const c_void,
    (block, total): (usize, usize),
    index: usize,
    overlap: &'static str,
) -> FfiResult<bool> {
    // `block * index` < `total`, which did not overflow.
    let own = (whole as usize).wrapping_add(block * index);
    let in_place = block > 0 && part as usize == own;
    if !in_place && overlaps(part, block, whole, total) {
        return Err(Failure::invalid(overlap));
    }
    Ok(in_place)
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

/// A rank argument (`what`: "peer", "root"), checked against the communicator's size.
fn rank_index(rank: c_int, n: usize, what: &str) -> FfiResult<usize> {
    usize::try_from(rank)
        .ok()
        .filter(|&r| r < n)
        .ok_or_else(|| {
            Failure::invalid(format!(
                "{what} {rank} is out of range for {n} ranks (0 .. {})",
                n.saturating_sub(1)
            ))
        })
}

/// A peer argument, checked against the communicator's size.
fn peer_index(peer: c_int, n: usize) -> FfiResult<usize> {
    rank_index(peer, n, "peer")
}

/// A root argument, checked against the communicator's size.
fn root_index(root: c_int, n: usize) -> FfiResult<usize> {
    rank_index(root, n, "root")
}

/// A user tag, checked against `HALO_MAX_TAG`.
fn tag_value(tag: c_int) -> FfiResult<u32> {
    u32::try_from(tag)
        .ok()
        .filter(|&t| t <= HALO_MAX_TAG as u32)
        .ok_or_else(|| {
            Failure::invalid(format!(
                "tag {tag} is out of range (0 .. HALO_MAX_TAG = {HALO_MAX_TAG})"
            ))
        })
}

/// The caller's memory as bytes.
///
/// # Safety
/// When `len` > 0: `ptr` is non-NULL and readable for `len` bytes, not written by
/// anyone during the returned lifetime.
unsafe fn bytes<'a>(ptr: usize, len: usize) -> &'a [u8] {
    if len == 0 {
        return &[];
    }
    // SAFETY: per the contract; `u8` needs no alignment.
    unsafe { std::slice::from_raw_parts(ptr as *const u8, len) }
}

/// The caller's memory as writable bytes.
///
/// # Safety
/// When `len` > 0: `ptr` is non-NULL and writable for `len` bytes, accessed by nobody
/// else during the returned lifetime (no other slice over it exists).
unsafe fn bytes_mut<'a>(ptr: usize, len: usize) -> &'a mut [u8] {
    if len == 0 {
        return &mut [];
    }
    // SAFETY: per the contract; `u8` needs no alignment.
    unsafe { std::slice::from_raw_parts_mut(ptr as *mut u8, len) }
}

/// The send and receive slices of a call that sends `send_len` bytes at `send` and
/// receives `recv_len` bytes at `recv`. In place, the send bytes are copied into
/// `copy` first, so that the two slices never alias.
///
/// # Safety
/// Each buffer is non-NULL when its length is > 0, readable (`send`) or writable
/// (`recv`) for its length and accessed by nobody else during the returned lifetime;
/// the two do not overlap unless `in_place`.
unsafe fn send_recv(
    (send, send_len): (usize, usize),
    (recv, recv_len): (usize, usize),
    in_place: bool,
    copy: &mut Vec<u8>,
) -> (&[u8], &mut [u8]) {
    let send: &[u8] = if in_place {
        // SAFETY: non-NULL and readable per the contract; the slice ends with this
        // statement, before any slice over `recv` exists.
        *copy = unsafe { bytes(send, send_len) }.to_vec();
        copy
    } else {
        // SAFETY: non-NULL when non-empty, readable and unwritten per the contract,
        // and disjoint from `recv`.
        unsafe { bytes(send, send_len) }
    };
    // SAFETY: non-NULL when non-empty, writable and accessed by nobody else per the
    // contract; `send` is the copy or does not overlap it.
    let recv = unsafe { bytes_mut(recv, recv_len) };
    (send, recv)
}

/// `haloAllToAll`'s and `haloIAllToAll`'s arguments.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AllToAllArgs {
    send: usize,
    recv: usize,
    count: usize,
    elem: usize,
}

impl AllToAllArgs {
    /// Checks the arguments for a communicator of `n` ranks: data type, sizes, NULL,
    /// in-place use.
    pub(crate) fn decode(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        count: usize,
        datatype: haloDataType_t,
        n: usize,
    ) -> FfiResult<AllToAllArgs> {
        let elem = haloDataType::from_raw(datatype)?.size();
        let bytes = total_bytes(count, elem, n, "count")?;
        check_buffer(sendbuff, bytes, "sendbuff", count)?;
        check_buffer(recvbuff, bytes, "recvbuff", count)?;
        if bytes > 0 && sendbuff == recvbuff.cast_const() {
            return Err(Failure::invalid(
                "sendbuff == recvbuff: in-place all-to-all is not supported (HALO's \
                 all-to-all is out-of-place; use a separate receive buffer)",
            ));
        }
        Ok(AllToAllArgs {
            send: sendbuff as usize,
            recv: recvbuff as usize,
            count,
            elem,
        })
    }
}

impl DeviceOp for AllToAllArgs {
    unsafe fn run_on_stream(self, c: &haloComm, stream: haloStream_t) -> FfiResult<()> {
        let (s, r) = (self.send as *const c_void, self.recv as *mut c_void);
        // SAFETY: per this function's contract.
        unsafe { crate::device::all_to_all(c, s, r, self.count, self.elem, stream) }
    }
}

impl Op for AllToAllArgs {
    unsafe fn run(self, comm: &mut Communicator) -> halo_rs::Result<()> {
        let (s, r) = (self.send as *const u8, self.recv as *mut u8);
        // SAFETY: the buffers are valid for `count * nranks` elements and accessed by
        // nobody else (this function's contract), non-NULL when non-empty (checked);
        // the communicator checks overlap before making references to them.
        unsafe { halo_rs::c_abi::all_to_all(comm, s, r, self.count, self.elem) }
    }
}

/// `haloAllToAllv`'s and `haloIAllToAllv`'s arguments: the four count and
/// displacement arrays as slices over the caller's arrays (`C = &[usize]`) or as
/// copies (`C = Vec<usize>`, for the worker).
#[derive(Debug, Clone)]
pub(crate) struct AllToAllvArgs<C> {
    send: usize,
    recv: usize,
    sendcounts: C,
    sdispls: C,
    recvcounts: C,
    rdispls: C,
    elem: usize,
}

impl<'a> AllToAllvArgs<&'a [usize]> {
    /// Checks the arguments (buffer, counts and displacements of each side) for a
    /// communicator of `n` ranks: the data type and the arrays (the communicator checks extents, NULL buffers and overlap after the
    /// count exchange).
    ///
    /// # Safety
    /// Each array is NULL or holds `n` entries, unchanged while the result lives.
    pub(crate) unsafe fn decode(
        (sendbuff, sendcounts, sdispls): (*const c_void, *const usize, *const usize),
        (recvbuff, recvcounts, rdispls): (*mut c_void, *const usize, *const usize),
        datatype: haloDataType_t,
        n: usize,
    ) -> FfiResult<AllToAllvArgs<&'a [usize]>> {
        let elem = haloDataType::from_raw(datatype)?.size();
        // SAFETY: (four reads) each array is NULL or holds `n` entries per the contract.
        let (sc, sd, rc, rd) = unsafe {
            (
                counts(sendcounts, n, "sendcounts")?,
                counts(sdispls, n, "sdispls")?,
                counts(recvcounts, n, "recvcounts")?,
                counts(rdispls, n, "rdispls")?,
            )
        };
        Ok(AllToAllvArgs {
            send: sendbuff as usize,
            recv: recvbuff as usize,
            sendcounts: sc,
            sdispls: sd,
            recvcounts: rc,
            rdispls: rd,
            elem,
        })
    }

    /// The arguments with the arrays copied, for what outlives the call.
    pub(crate) fn to_owned(&self) -> AllToAllvArgs<Vec<usize>> {
        AllToAllvArgs {
            send: self.send,
            recv: self.recv,
            sendcounts: self.sendcounts.to_vec(),
            sdispls: self.sdispls.to_vec(),
            recvcounts: self.recvcounts.to_vec(),
            rdispls: self.rdispls.to_vec(),
            elem: self.elem,
        }
    }
}

impl DeviceOp for AllToAllvArgs<&[usize]> {
    unsafe fn run_on_stream(self, c: &haloComm, stream: haloStream_t) -> FfiResult<()> {
        let (s, r) = (self.send as *const c_void, self.recv as *mut c_void);
        let sp = (self.sendcounts, self.sdispls);
        let rp = (self.recvcounts, self.rdispls);
        // SAFETY: per this function's contract.
        unsafe { crate::device::all_to_all_v(c, s, sp, r, rp, self.elem, stream) }
    }
}

impl<C: AsRef<[usize]>> Op for AllToAllvArgs<C> {
    unsafe fn run(self, comm: &mut Communicator) -> halo_rs::Result<()> {
        let sp = Partition::new(self.sendcounts.as_ref(), self.sdispls.as_ref());
        let rp = Partition::new(self.recvcounts.as_ref(), self.rdispls.as_ref());
        let (s, r) = (self.send as *const u8, self.recv as *mut u8);
        // SAFETY: the buffers cover what the counts and displacements reach and nobody
        // else accesses them (this function's contract); the communicator checks
        // extents, NULL and overlap before making references to them.
        unsafe { halo_rs::c_abi::all_to_all_v(comm, s, &sp, r, &rp, self.elem) }
    }
}

/// `haloBarrier`'s and `haloIBarrier`'s arguments: none.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BarrierArgs;

impl Op for BarrierArgs {
    unsafe fn run(self, comm: &mut Communicator) -> halo_rs::Result<()> {
        comm.barrier()
    }
}

/// Which way a point-to-point call moves data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    /// `haloSend*`, `haloISend*`: the buffer is `sendbuff`.
    Send,
    /// `haloRecv*`, `haloIRecv*`: the buffer is `recvbuff`.
    Recv,
}

/// A point-to-point call's arguments (`haloSend`, `haloRecv`, their tagged and
/// non-blocking forms).
#[derive(Debug, Clone, Copy)]
pub(crate) struct P2pArgs {
    buf: usize,
    len: usize,
    peer: usize,
    /// The user tag; 0 for the untagged calls (`haloSend` is tag 0).
    tag: u32,
    direction: Direction,
}

impl P2pArgs {
    /// Checks a send's arguments (`haloSend*`, `haloISend*`) for `n` ranks.
    pub(crate) fn send(
        sendbuff: *const c_void,
        count: usize,
        datatype: haloDataType_t,
        to: (c_int, Option<c_int>),
        n: usize,
    ) -> FfiResult<P2pArgs> {
        P2pArgs::decode(Direction::Send, sendbuff, count, datatype, to, n)
    }

    /// Checks a receive's arguments (`haloRecv*`, `haloIRecv*`) for `n` ranks.
    pub(crate) fn recv(
        recvbuff: *mut c_void,
        count: usize,
        datatype: haloDataType_t,
        from: (c_int, Option<c_int>),
        n: usize,
    ) -> FfiResult<P2pArgs> {
        P2pArgs::decode(
            Direction::Recv,
            recvbuff.cast_const(),
            count,
            datatype,
            from,
            n,
        )
    }

    /// Checks the arguments for a communicator of `n` ranks: data type, size, NULL,
    /// peer, and the tag of the tagged calls (`None` for the untagged ones).
    fn decode(
        direction: Direction,
        buf: *const c_void,
        count: usize,
        datatype: haloDataType_t,
        (peer, tag): (c_int, Option<c_int>),
        n: usize,
    ) -> FfiResult<P2pArgs> {
        let elem = haloDataType::from_raw(datatype)?.size();
        let len = total_bytes(count, elem, 1, "count")?;
        let what = match direction {
            Direction::Send => "sendbuff",
            Direction::Recv => "recvbuff",
        };
        check_buffer(buf, len, what, count)?;
        let peer = peer_index(peer, n)?;
        let tag = tag.map(tag_value).transpose()?.unwrap_or(0);
        Ok(P2pArgs {
            buf: buf as usize,
            len,
            peer,
            tag,
            direction,
        })
    }
}

impl Op for P2pArgs {
    unsafe fn run(self, comm: &mut Communicator) -> halo_rs::Result<()> {
        match self.direction {
            Direction::Send => {
                // SAFETY: non-NULL when `len` > 0 (checked), readable for `len` bytes
                // and not written during the call (this function's contract).
                let send = unsafe { bytes(self.buf, self.len) };
                comm.send_tagged(send, self.peer, self.tag)
            }
            Direction::Recv => {
                // SAFETY: non-NULL when `len` > 0 (checked), writable for `len` bytes
                // and accessed by nobody else (this function's contract).
                let recv = unsafe { bytes_mut(self.buf, self.len) };
                comm.recv_tagged(recv, self.peer, self.tag)
            }
        }
    }
}

/// An all-gather's arguments (`haloAllGather`, `haloIAllGather`): addresses, the block
/// and total bytes, whether it is in place.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AllGatherArgs {
    send: usize,
    recv: usize,
    block: usize,
    total: usize,
    in_place: bool,
}

impl AllGatherArgs {
    /// Checks the arguments for a communicator of `n` ranks, this rank `me`: data
    /// type, sizes, NULL, overlap (in place only as NCCL's, `sendbuff == recvbuff + me
    /// * sendcount` elements).
    pub(crate) fn decode(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        sendcount: usize,
        datatype: haloDataType_t,
        (n, me): (usize, usize),
    ) -> FfiResult<AllGatherArgs> {
        let elem = haloDataType::from_raw(datatype)?.size();
        let (block, total) = blocks(sendcount, elem, n, "sendcount")?;
        check_buffer(sendbuff, block, "sendbuff", sendcount)?;
        check_buffer(recvbuff, total, "recvbuff", sendcount)?;
        let in_place = block_in_place(
            sendbuff,
            recvbuff.cast_const(),
            (block, total),
            me,
            "sendbuff overlaps recvbuff: out-of-place, or in place with sendbuff == \
             recvbuff + rank * sendcount elements",
        )?;
        Ok(AllGatherArgs {
            send: sendbuff as usize,
            recv: recvbuff as usize,
            block,
            total,
            in_place,
        })
    }
}

impl Op for AllGatherArgs {
    unsafe fn run(self, comm: &mut Communicator) -> halo_rs::Result<()> {
        let mut copy = Vec::new();
        // SAFETY: NULL and overlap checked; valid and accessed by nobody else per this
        // function's contract. In place, the own block is copied out of `recvbuff`.
        let (send, recv) = unsafe {
            send_recv(
                (self.send, self.block),
                (self.recv, self.total),
                self.in_place,
                &mut copy,
            )
        };
        comm.all_gather(send, recv)
    }
}

/// An all-reduce's arguments (`haloAllReduce`, `haloIAllReduce`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct AllReduceArgs {
    send: usize,
    recv: usize,
    count: usize,
    dt: haloDataType,
    op: ReduceOp,
}

impl AllReduceArgs {
    /// Checks the arguments: data type, operation, size, NULL, overlap (in place only
    /// with `sendbuff == recvbuff`) and alignment.
    pub(crate) fn decode(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        count: usize,
        datatype: haloDataType_t,
        op: haloRedOp_t,
    ) -> FfiResult<AllReduceArgs> {
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
        let align = dt.size();
        if count > 0 {
            for (ptr, what) in [
                (sendbuff as usize, "sendbuff"),
                (recvbuff as usize, "recvbuff"),
            ] {
                if !ptr.is_multiple_of(align) {
                    return Err(Failure::invalid(format!(
                        "{what} is not aligned to {align} bytes, as {dt:?} elements must be"
                    )));
                }
            }
        }
        Ok(AllReduceArgs {
            send: sendbuff as usize,
            recv: recvbuff as usize,
            count,
            dt,
            op,
        })
    }
}

/// The caller's memory as typed slices: `send_len` elements of `E` at `send`,
/// `recv_len` at `recv`.
///
/// # Safety
/// Both are non-NULL, aligned for `E`, readable (`send`) or writable (`recv`) for
/// their lengths, accessed by nobody else during the returned lifetime, and disjoint.
unsafe fn typed<'a, E>(
    (send, send_len): (usize, usize),
    (recv, recv_len): (usize, usize),
) -> (&'a [E], &'a mut [E]) {
    // SAFETY: per the contract.
    unsafe {
        (
            std::slice::from_raw_parts(send as *const E, send_len),
            std::slice::from_raw_parts_mut(recv as *mut E, recv_len),
        )
    }
}

/// The typed all-reduce over the caller's memory.
///
/// # Safety
/// The buffers of `a` are non-NULL when `count` > 0, aligned for `E`, readable (`send`)
/// and writable (`recv`) for `count` elements of `E`, and not accessed by anyone else;
/// they are either equal (in place) or do not overlap.
unsafe fn all_reduce_typed<E: Reducible>(
    comm: &mut Communicator,
    a: AllReduceArgs,
) -> halo_rs::Result<()> {
    let (send, recv, count, op) = (a.send, a.recv, a.count, a.op);
    if count == 0 {
        return comm.all_reduce::<E>(&[], &mut [], op);
    }
    if send == recv {
        // SAFETY: non-NULL, aligned, writable for `count` elements per the contract,
        // and the only slice over that memory.
        let buf = unsafe { std::slice::from_raw_parts_mut(recv as *mut E, count) };
        return comm.all_reduce_in_place(buf, op);
    }
    // SAFETY: non-NULL, aligned, valid for `count` elements per the contract, and the
    // two ranges do not overlap.
    let (s, r) = unsafe { typed::<E>((send, count), (recv, count)) };
    comm.all_reduce(s, r, op)
}

impl Op for AllReduceArgs {
    unsafe fn run(self, comm: &mut Communicator) -> halo_rs::Result<()> {
        // SAFETY: NULL, alignment and overlap checked by `decode`; valid and accessed by
        // nobody else per this function's contract.
        with_elem!(self.dt, E => unsafe { all_reduce_typed::<E>(comm, self) })
    }
}

/// A reduce-scatter's arguments (`haloReduceScatter`, `haloIReduceScatter`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ReduceScatterArgs {
    send: usize,
    recv: usize,
    recvcount: usize,
    dt: haloDataType,
    op: ReduceOp,
    in_place: bool,
}

impl ReduceScatterArgs {
    /// Checks the arguments for a communicator of `n` ranks, this rank `me`: data
    /// type, operation, sizes, NULL, overlap (in place only as NCCL's, `recvbuff ==
    /// sendbuff + me * recvcount` elements) and alignment.
    pub(crate) fn decode(
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
        let (block, total) = blocks(recvcount, elem, n, "recvcount")?;
        check_buffer(sendbuff, total, "sendbuff", recvcount)?;
        check_buffer(recvbuff, block, "recvbuff", recvcount)?;
        let in_place = block_in_place(
            recvbuff.cast_const(),
            sendbuff,
            (block, total),
            me,
            "recvbuff overlaps sendbuff: out-of-place, or in place with recvbuff == \
             sendbuff + rank * recvcount elements",
        )?;
        if block > 0
            && !((sendbuff as usize).is_multiple_of(elem)
                && (recvbuff as usize).is_multiple_of(elem))
        {
            return Err(Failure::invalid(format!(
                "sendbuff or recvbuff is not aligned to {elem} bytes, as {dt:?} elements must be"
            )));
        }
        Ok(ReduceScatterArgs {
            send: sendbuff as usize,
            recv: recvbuff as usize,
            recvcount,
            dt,
            op,
            in_place,
        })
    }
}

/// The typed reduce-scatter over the caller's memory.
///
/// # Safety
/// In `a`, `send` is readable for `size * recvcount` and `recv` writable for
/// `recvcount` elements of `E`, both aligned and non-NULL when `recvcount` > 0, not
/// accessed by anyone else during the call; they do not overlap unless `in_place`
/// (`recv` is block `rank` of `send`).
unsafe fn reduce_scatter_typed<E: Reducible>(
    comm: &mut Communicator,
    a: ReduceScatterArgs,
) -> halo_rs::Result<()> {
    let (send, recv, count, op) = (a.send, a.recv, a.recvcount, a.op);
    if count == 0 {
        return comm.reduce_scatter::<E>(&[], &mut [], op);
    }
    let total = count * comm.size();
    if a.in_place {
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
    let (s, r) = unsafe { typed::<E>((send, total), (recv, count)) };
    comm.reduce_scatter(s, r, op)
}

impl Op for ReduceScatterArgs {
    unsafe fn run(self, comm: &mut Communicator) -> halo_rs::Result<()> {
        // SAFETY: NULL, alignment and overlap checked by `decode`; valid and accessed by
        // nobody else per this function's contract.
        with_elem!(self.dt, E => unsafe { reduce_scatter_typed::<E>(comm, self) })
    }
}

/// The rooted collectives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rooted {
    Broadcast,
    Gather,
    Scatter,
}

/// A rooted call's arguments (`haloBroadcast`, `haloGather`, `haloScatter` and their
/// non-blocking forms): addresses, this rank's byte sizes, the root.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RootedArgs {
    kind: Rooted,
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

impl RootedArgs {
    /// Checks `haloBroadcast`'s arguments (`n` ranks, this rank `me`).
    pub(crate) fn broadcast(
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
            kind: Rooted::Broadcast,
            send: sendbuff as usize,
            recv: recvbuff as usize,
            block: len,
            total: len,
            root,
            me,
            in_place,
        })
    }

    /// Checks `haloGather`'s arguments (`n` ranks, this rank `me`).
    pub(crate) fn gather(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        sendcount: usize,
        datatype: haloDataType_t,
        root: c_int,
        ranks: (usize, usize),
    ) -> FfiResult<RootedArgs> {
        let (part, whole) = ((sendbuff, "sendbuff"), (recvbuff.cast_const(), "recvbuff"));
        let count = (sendcount, "sendcount");
        RootedArgs::blocked(Rooted::Gather, part, whole, count, datatype, root, ranks)
    }

    /// Checks `haloScatter`'s arguments (`n` ranks, this rank `me`).
    pub(crate) fn scatter(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        recvcount: usize,
        datatype: haloDataType_t,
        root: c_int,
        ranks: (usize, usize),
    ) -> FfiResult<RootedArgs> {
        let (part, whole) = ((recvbuff.cast_const(), "recvbuff"), (sendbuff, "sendbuff"));
        let count = (recvcount, "recvcount");
        RootedArgs::blocked(Rooted::Scatter, part, whole, count, datatype, root, ranks)
    }

    /// Checks a gather's or a scatter's arguments: every rank's block of `count`
    /// elements is `part` (the gather's `sendbuff`, the scatter's `recvbuff`), the
    /// root's `nranks` blocks are `whole` (checked at the root only); in place at the
    /// root when `part` is block `root` of `whole`.
    fn blocked(
        kind: Rooted,
        (part, part_name): (*const c_void, &str),
        (whole, whole_name): (*const c_void, &str),
        (count, what): (usize, &str),
        datatype: haloDataType_t,
        root: c_int,
        (n, me): (usize, usize),
    ) -> FfiResult<RootedArgs> {
        let elem = haloDataType::from_raw(datatype)?.size();
        let (block, total) = blocks(count, elem, n, what)?;
        let root = root_index(root, n)?;
        check_buffer(part, block, part_name, count)?;
        let mut in_place = false;
        if me == root {
            check_buffer(whole, total, whole_name, count)?;
            let overlap = if kind == Rooted::Gather {
                "sendbuff overlaps recvbuff at the root: out-of-place, or in place with \
                 sendbuff == recvbuff + root * sendcount elements"
            } else {
                "recvbuff overlaps sendbuff at the root: out-of-place, or in place with \
                 recvbuff == sendbuff + root * recvcount elements"
            };
            in_place = block_in_place(part, whole, (block, total), root, overlap)?;
        }
        let (send, recv) = if kind == Rooted::Gather {
            (part, whole)
        } else {
            (whole, part)
        };
        Ok(RootedArgs {
            kind,
            send: send as usize,
            recv: recv as usize,
            block,
            total,
            root,
            me,
            in_place,
        })
    }
}

impl Op for RootedArgs {
    unsafe fn run(self, comm: &mut Communicator) -> halo_rs::Result<()> {
        let a = self;
        let at_root = a.me == a.root;
        match a.kind {
            Rooted::Broadcast => {
                if at_root && !a.in_place && a.block > 0 {
                    // SAFETY: both non-NULL (checked: `block` > 0), readable / writable
                    // for `block` bytes per the contract, and disjoint (checked).
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            a.send as *const u8,
                            a.recv as *mut u8,
                            a.block,
                        );
                    }
                }
                // SAFETY: non-NULL when `block` > 0 (checked), writable for `block`
                // bytes and accessed by nobody else per the contract.
                let buf = unsafe { bytes_mut(a.recv, a.block) };
                comm.broadcast(buf, a.root)
            }
            Rooted::Gather if !at_root => {
                // SAFETY: non-NULL when `block` > 0 (checked), readable and unwritten.
                let send = unsafe { bytes(a.send, a.block) };
                comm.gather(send, &mut [], a.root)
            }
            Rooted::Gather => {
                let mut copy = Vec::new();
                // SAFETY: NULL and overlap checked; valid and accessed by nobody else
                // per the contract. In place, the own block is copied out of `recvbuff`.
                let (send, recv) = unsafe {
                    send_recv((a.send, a.block), (a.recv, a.total), a.in_place, &mut copy)
                };
                comm.gather(send, recv, a.root)
            }
            Rooted::Scatter if !at_root => {
                // SAFETY: non-NULL when `block` > 0 (checked), writable for `block`
                // bytes and accessed by nobody else.
                let recv = unsafe { bytes_mut(a.recv, a.block) };
                comm.scatter(&[], recv, a.root)
            }
            Rooted::Scatter => {
                let mut copy = Vec::new();
                // SAFETY: NULL and overlap checked; valid and accessed by nobody else
                // per the contract. In place, the root's send buffer (which holds
                // `recvbuff`) is copied first.
                let (send, recv) = unsafe {
                    send_recv((a.send, a.total), (a.recv, a.block), a.in_place, &mut copy)
                };
                comm.scatter(send, recv, a.root)
            }
        }
    }
}

#[cfg(test)]
mod tests;
