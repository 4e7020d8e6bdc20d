//! The communicator handle and how it is owned.
//!
//! A `haloComm_t` is `Arc::into_raw` of an `Arc<haloComm>`: the handle itself holds one
//! reference, released by `haloCommDestroy` or `haloCommAbort` ([`haloComm::release`]),
//! and every call on it holds another for its duration ([`Borrowed`]). So a
//! `haloCommAbort` from a watchdog thread, while this thread is blocked in a
//! collective on the same communicator, stops that collective and frees the
//! communicator only when the collective has returned — as NCCL's `ncclCommAbort`
//! does. Nothing else creates or frees a `haloComm`; the only ways in and out are
//! [`haloComm::into_handle`], [`Borrowed::new`] and [`haloComm::release`].
//!
//! **Stale handles.** Every live handle is listed in a table ([`LIVE`]), entered by
//! `into_handle` and removed by `release`; a handle is dereferenced only after it was
//! found there (under the table's lock, which also orders a borrow against a concurrent
//! release). So `haloCommDestroy` twice, or any call after `haloCommDestroy` /
//! `haloCommAbort`, gets `haloInvalidArgument` ("comm is not a live communicator")
//! instead of a use after free, and so does a pointer HALO never made. The limit: the
//! table knows addresses, not generations of the same address — when a new
//! communicator is later allocated at the address of a destroyed one (the allocator
//! may reuse it), the stale handle names the new communicator again, and calls on it
//! reach that one. Destroyed handles must still not be used; the check turns the
//! common mistakes into an error, not every one.

use crate::error::{Failure, FfiResult, haloResult};
use halo_rs::c_abi::{OpHandle, OpJob, OpQueue};
use halo_rs::{AbortHandle, Communicator};
use std::collections::BTreeSet;
use std::ffi::{CString, c_char};
use std::fmt;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, TryLockError};

/// The addresses of the live handles (see the module notes).
static LIVE: Mutex<BTreeSet<usize>> = Mutex::new(BTreeSet::new());

fn live() -> MutexGuard<'static, BTreeSet<usize>> {
    // The table is consistent after every operation: a panic elsewhere leaves it usable.
    LIVE.lock().unwrap_or_else(PoisonError::into_inner)
}

fn not_live() -> Failure {
    Failure::invalid(
        "comm is not a live communicator (destroyed or aborted already, or not made by \
         haloCommInit* / haloCommSplit)",
    )
}

/// A communicator: one rank's handle on a group of ranks (opaque).
///
/// Created by `haloCommInitRank`, `haloCommInitRankConfig`, `haloCommInitFromEnv` or
/// `haloCommSplit`; freed by `haloCommDestroy` or `haloCommAbort`.
///
/// HALO keeps a table of the live handles and checks every `comm` argument against it
/// before using it: a handle already destroyed or aborted (or a pointer HALO never
/// made) gives `haloInvalidArgument` ("comm is not a live communicator") instead of
/// undefined behaviour. Limit: the table holds addresses; after a new communicator has
/// been created at the address of a destroyed one, the stale handle denotes the new
/// communicator. Do not use destroyed handles; the check catches the common mistakes
/// (a second destroy, a call right after destroy), not all.
pub struct haloComm {
    /// The Rust communicator; the mutex turns two threads using one communicator at
    /// once into `haloInvalidUsage` instead of a data race.
    comm: Mutex<Communicator>,
    /// Stops the communicator from any thread without taking the lock.
    abort: AbortHandle,
    rank: usize,
    size: usize,
    /// The first error that left the communicator in an unknown state (0: none).
    async_error: AtomicI32,
    /// The message of the last failed call on this communicator.
    last_error: Mutex<CString>,
    /// The non-blocking operations (`haloI*`) and the worker thread that runs them,
    /// while there are any; the worker holds `comm`'s lock until the queue is drained.
    pending: Mutex<Option<Pending>>,
}

/// A communicator's queue of non-blocking operations and its worker.
#[derive(Debug)]
struct Pending {
    queue: OpQueue,
    worker: std::thread::JoinHandle<()>,
}

/// A communicator handle, as every HALO function takes it.
pub type haloComm_t = *mut haloComm;

impl fmt::Debug for haloComm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("haloComm")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("aborted", &self.abort.is_aborted())
            .field("async_error", &self.async_error.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl haloComm {
    /// Wraps a communicator.
    pub(crate) fn new(comm: Communicator) -> haloComm {
        haloComm {
            abort: comm.abort_handle(),
            rank: comm.rank(),
            size: comm.size(),
            comm: Mutex::new(comm),
            async_error: AtomicI32::new(0),
            last_error: Mutex::new(CString::default()),
            pending: Mutex::new(None),
        }
    }

    /// The handle C gets: owns one reference, and is listed as live.
    pub(crate) fn into_handle(self) -> haloComm_t {
        let handle = Arc::into_raw(Arc::new(self)).cast_mut();
        live().insert(handle as usize);
        handle
    }

    /// Gives up the handle's own reference (NULL: nothing). The communicator is
    /// dropped now, or when the last call still running on it returns.
    ///
    /// # Errors
    /// `haloInvalidArgument` when `handle` is not live (released already, or never
    /// made by [`haloComm::into_handle`]); nothing is touched then.
    pub(crate) fn release(handle: haloComm_t) -> FfiResult<()> {
        if handle.is_null() {
            return Ok(());
        }
        if !live().remove(&(handle as usize)) {
            return Err(not_live());
        }
        // SAFETY: the handle was live (listed, and removed just now under the lock, so
        // no other release can take it): it owns one strong reference from
        // `Arc::into_raw`, which this takes back exactly once.
        drop(unsafe { Arc::from_raw(handle.cast_const()) });
        Ok(())
    }

    /// This rank.
    pub(crate) fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks.
    pub(crate) fn size(&self) -> usize {
        self.size
    }

    /// Aborts the communicator; callable from any thread, also during a call.
    pub(crate) fn abort(&self) {
        self.abort.abort();
        let _ = self.async_error.compare_exchange(
            0,
            haloResult::haloAborted as i32,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
    }

    /// The first error that left the communicator in an unknown state.
    pub(crate) fn async_error(&self) -> i32 {
        self.async_error.load(Ordering::Acquire)
    }

    /// Waits until every non-blocking operation started on this communicator has
    /// finished (each is bounded by the communicator's timeout, and an abort stops
    /// them), and ends its worker. Their requests keep their outcomes.
    pub(crate) fn drain(&self) {
        let pending = self
            .pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(Pending { queue, worker }) = pending {
            drop(queue);
            // A panicked worker filled every request it held with an error (and
            // poisoned the communicator's lock, which `lock` reports).
            let _ = worker.join();
        }
    }

    /// Queues a non-blocking operation: it runs after the ones queued before it, on
    /// the communicator's worker (started here when there is none).
    ///
    /// # Errors
    /// `haloInvalidUsage` when another thread is using the communicator in a blocking
    /// call; `haloSystemError` when the worker thread cannot start.
    pub(crate) fn submit(
        this: &Arc<haloComm>,
        name: &'static str,
        job: OpJob,
    ) -> FfiResult<OpHandle> {
        let mut pending = this.pending.lock().unwrap_or_else(PoisonError::into_inner);
        if pending.is_none() {
            let guard = this.try_lock_now()?;
            let (queue, server) = halo_rs::c_abi::op_queue(&guard);
            drop(guard);
            let owner = Arc::clone(this);
            let worker = std::thread::Builder::new()
                .name(format!("halo-requests-r{}", this.rank))
                .spawn(move || {
                    let mut comm = owner.comm.lock().unwrap_or_else(PoisonError::into_inner);
                    server.serve(&mut comm);
                })
                .map_err(|e| {
                    Failure::new(
                        haloResult::haloSystemError,
                        format!("cannot start the communicator's request thread: {e}"),
                    )
                })?;
            *pending = Some(Pending { queue, worker });
        }
        match pending.as_mut() {
            Some(p) => Ok(p.queue.submit(name, job)),
            None => Err(Failure::internal("no request queue after starting one")),
        }
    }

    /// The communicator, for one blocking call, after the non-blocking operations
    /// started before it (stream order). A second thread using it at the same time gets
    /// `haloInvalidUsage`; after a panic inside an earlier call, `haloInternalError`.
    pub(crate) fn lock(&self) -> FfiResult<MutexGuard<'_, Communicator>> {
        self.drain();
        self.try_lock_now()
    }

    fn try_lock_now(&self) -> FfiResult<MutexGuard<'_, Communicator>> {
        self.comm.try_lock().map_err(|e| match e {
            TryLockError::WouldBlock => Failure::new(
                haloResult::haloInvalidUsage,
                "the communicator is in use by another thread (a communicator is used by one \
                 thread at a time; only haloCommAbort and haloCommGetAsyncError may be called \
                 concurrently)",
            ),
            TryLockError::Poisoned(_) => Failure::internal(
                "the communicator is unusable: an earlier call on it panicked; destroy it",
            ),
        })
    }

    /// Records a failed call: its message, and for failures after which the ranks
    /// may be out of step (a transport or remote failure, a timeout, an abort, a bug)
    /// the asynchronous error.
    pub(crate) fn record_failure(&self, code: haloResult, message: CString) {
        let usable = crate::device::leaves_comm_usable(code, &message);
        *self
            .last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = message;
        let fatal = !matches!(
            code,
            haloResult::haloSuccess
                | haloResult::haloInvalidArgument
                | haloResult::haloInvalidUsage
                | haloResult::haloInProgress
        ) && !usable;
        if fatal {
            let _ = self.async_error.compare_exchange(
                0,
                code as i32,
                Ordering::AcqRel,
                Ordering::Acquire,
            );
        }
    }

    /// The last failure's message; valid until the next failure on this communicator
    /// or its release (the string is replaced, never mutated in place).
    pub(crate) fn last_error_ptr(&self) -> *const c_char {
        self.last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ptr()
    }
}

/// A reference to a communicator held for the duration of one call.
#[derive(Debug)]
pub(crate) struct Borrowed(Arc<haloComm>);

impl Borrowed {
    /// Takes a reference for this call; `None` for NULL.
    ///
    /// # Errors
    /// `haloInvalidArgument` when `handle` is not live (see the module notes).
    pub(crate) fn new(handle: haloComm_t) -> FfiResult<Option<Borrowed>> {
        if handle.is_null() {
            return Ok(None);
        }
        let table = live();
        if !table.contains(&(handle as usize)) {
            return Err(not_live());
        }
        let ptr = handle.cast_const();
        // SAFETY: the handle is listed, so it came from `Arc::into_raw` and its own
        // reference is still held (a release removes it from the table first, and
        // cannot while this holds the lock): the strong count is at least one. This
        // adds the reference that `from_raw` below takes over.
        unsafe { Arc::increment_strong_count(ptr) };
        drop(table);
        // SAFETY: `ptr` came from `Arc::into_raw` and the reference it stands for was
        // just added.
        Ok(Some(Borrowed(unsafe { Arc::from_raw(ptr) })))
    }
}

impl Borrowed {
    /// The shared reference (for what outlives the call: a request's worker).
    pub(crate) fn shared(&self) -> &Arc<haloComm> {
        &self.0
    }
}

impl std::ops::Deref for Borrowed {
    type Target = haloComm;

    fn deref(&self) -> &haloComm {
        &self.0
    }
}
