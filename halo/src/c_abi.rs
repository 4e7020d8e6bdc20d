//! Raw-pointer entry points for the C ABI (`ffi`), hidden from the Rust API.
//!
//! A Rust program uses the slice-based calls of [`Communicator`]; these take what C
//! passes (pointers, element counts, element sizes) and check everything they can
//! before making a reference to the memory. They are public only because `libhalo` is
//! another crate.

use crate::comm::{Inbox, Job, Queue, Slot, Task, Work, serve, with_context};
use crate::{Communicator, Error, Result};
use std::sync::Arc;

/// `haloAllToAll`: `count` elements of `elem_size` bytes per peer.
///
/// # Safety
/// `send` must be valid for reads and `recv` for writes of `count * elem_size * size()`
/// bytes (either may be null when that is zero), and no other thread may write `send`
/// or access `recv` during the call.
///
/// # Errors
/// As [`Communicator::all_to_all`]; also [`crate::Error::InvalidArgument`] for a null
/// pointer with a non-zero length, and when the byte count overflows.
pub unsafe fn all_to_all(
    comm: &mut Communicator,
    send: *const u8,
    recv: *mut u8,
    count: usize,
    elem_size: usize,
) -> Result<()> {
    // SAFETY: the caller upholds `all_to_all_raw`'s contract, which is this function's.
    unsafe { comm.all_to_all_raw(send, recv, count, elem_size) }
}

/// `haloAllToAllv`: counts and displacements in elements of `elem_size` bytes; the
/// buffers' extents are what they reach. Invalid counts still take part in the count
/// exchange, so the other ranks fail too instead of waiting.
///
/// # Safety
/// `send` must be valid for reads and `recv` for writes of the bytes the counts and
/// displacements reach (either may be null when that is zero), and no other thread may
/// write `send` or access `recv` during the call.
///
/// # Errors
/// As [`Communicator::all_to_all_v`]; also [`crate::Error::InvalidArgument`] for a null
/// pointer with a non-zero extent.
pub unsafe fn all_to_all_v(
    comm: &mut Communicator,
    send: *const u8,
    send_part: &crate::Partition<'_>,
    recv: *mut u8,
    recv_part: &crate::Partition<'_>,
    elem_size: usize,
) -> Result<()> {
    // SAFETY: the caller upholds `all_to_all_v_raw`'s contract, which is this function's.
    unsafe { comm.all_to_all_v_raw(send, send_part, recv, recv_part, elem_size) }
}

/// The queue of a C communicator's non-blocking operations (`haloI*`): the same
/// worker model as [`Communicator::scope`], with operations that own what they use
/// (the C caller keeps its buffers valid until the request completes, MPI's rule).
#[derive(Debug)]
pub struct OpQueue(Queue<'static>, Option<crate::transport::SharedTickets>);

/// The receiving end of an [`OpQueue`]: [`OpServer::serve`] runs its operations.
#[derive(Debug)]
pub struct OpServer(Inbox<'static>);

/// A queued operation's outcome, to wait on or test.
#[derive(Debug, Clone)]
pub struct OpHandle {
    slot: Arc<Slot>,
    index: u64,
    name: &'static str,
}

impl std::fmt::Debug for Task<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Task").finish_non_exhaustive()
    }
}

/// An operation of an [`OpQueue`]: what runs on the communicator.
pub type OpJob = Box<dyn FnOnce(&mut Communicator) -> Result<()> + Send + 'static>;

/// A new queue for `comm`'s operations, and its server.
pub fn op_queue(comm: &Communicator) -> (OpQueue, OpServer) {
    let (q, rx) = Queue::new();
    (
        OpQueue(q, comm.core.backend.shared_endpoint()),
        OpServer(rx),
    )
}

impl OpQueue {
    /// Queues `job` under `name` (an operation name for messages).
    pub fn submit(&mut self, name: &'static str, job: OpJob) -> OpHandle {
        let job: Job<'static> = job;
        let ticket = self.1.as_ref().map(|t| t.ticket());
        let (slot, index) = self.0.submit(name, ticket, Work::Job(job));
        OpHandle { slot, index, name }
    }
}

impl OpServer {
    /// Runs the queued operations on `comm`, in order, until the [`OpQueue`] is
    /// dropped (the rules of [`Communicator::scope`]: after a failure the later ones
    /// fail naming it).
    pub fn serve(self, comm: &mut Communicator) {
        serve(&std::sync::Mutex::new(comm), self.0);
    }
}

impl OpHandle {
    /// Blocks until the operation has finished; its outcome.
    ///
    /// # Errors
    /// The operation's error.
    pub fn wait(&self) -> Result<()> {
        self.slot.wait()
    }

    /// The outcome if finished.
    pub fn try_take(&self) -> Option<Result<()>> {
        self.slot.try_take()
    }

    /// The operation's name and 1-based position in its queue.
    pub fn describe(&self) -> (&'static str, u64) {
        (self.name, self.index)
    }
}

/// `e` with `context` before its message (same variant and code).
pub fn error_with_context(e: &Error, context: &str) -> Error {
    with_context(e, context)
}
/// `haloAllToAll` with a stream and device buffers on `device` (the device path).
///
/// # Safety
/// `send` / `recv` are device memory of `device` covering `count * elem_size * size()`
/// bytes until `stream` has run the call; `stream` is a live stream of that device.
///
/// # Errors
/// As [`Communicator::all_to_all`]; [`crate::Error::UnhandledDeviceError`] without the
/// device libraries (naming every place tried); NCCL's errors.
pub unsafe fn device_all_to_all(
    comm: &mut Communicator,
    send: *const std::ffi::c_void,
    recv: *mut std::ffi::c_void,
    count: usize,
    elem_size: usize,
    stream: *mut std::ffi::c_void,
    device: i32,
) -> Result<()> {
    // SAFETY: the caller upholds `device_all_to_all_raw`'s contract, which is this one's.
    unsafe { comm.device_all_to_all_raw(send, recv, count, elem_size, stream, device) }
}

/// `haloAllToAllv` with a stream and device buffers on `device` (the device path).
///
/// # Safety
/// As [`device_all_to_all`], over the extents the counts and displacements reach.
///
/// # Errors
/// As [`Communicator::all_to_all_v`], and the device errors.
#[allow(clippy::too_many_arguments)]
pub unsafe fn device_all_to_all_v(
    comm: &mut Communicator,
    send: *const std::ffi::c_void,
    send_part: &crate::Partition<'_>,
    recv: *mut std::ffi::c_void,
    recv_part: &crate::Partition<'_>,
    elem_size: usize,
    stream: *mut std::ffi::c_void,
    device: i32,
) -> Result<()> {
    // SAFETY: the caller upholds `device_all_to_all_v_raw`'s contract, which is this one's.
    unsafe {
        comm.device_all_to_all_v_raw(send, send_part, recv, recv_part, elem_size, stream, device)
    }
}
