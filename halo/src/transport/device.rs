//! The device backend: a schedule's waves as NCCL / RCCL groups on the caller's stream.
//!
//! Each wave is enqueued as its copies (`cudaMemcpyAsync` / `hipMemcpyAsync`, device to
//! device) followed by one `ncclGroupStart` / `ncclSend` / `ncclRecv` ... /
//! `ncclGroupEnd` (messages per peer in tag order, which [`halo_collectives::verify_waves`]
//! proved is how their receivers issue them). Everything is stream-ordered: the call
//! returns once the waves are enqueued, like an NCCL collective, and the bytes are in
//! place when the stream reaches that point.
//!
//! The libraries are loaded at run time ([`halo_rccl_sys`]): on a machine without them
//! every entry point returns [`Error::UnhandledDeviceError`] naming every place tried.
//! A communicator's NCCL communicator is made on its first device call (collective:
//! rank 0's `ncclUniqueId` travels over the host transport, together with every rank's
//! status, so a rank that cannot load the libraries makes every rank fail instead of
//! wait) on the device that holds the buffers.
//!
//! NOT RUN ON A GPU YET: no GPU was at hand when this was written; it compiles, its
//! failure paths are tested, and `scripts/gpu-check.sh` is the prepared check.

use crate::error::{Error, Result};
use halo_collectives::{Region, Step, StepId, WaveBackend};
use halo_rccl_sys::{MemcpyKind, MemoryKind, Nccl, NcclComm, RcclError, Runtime, Stream};
use std::ffi::c_void;
use std::sync::{Arc, OnceLock};

/// How the message of an [`Error::UnhandledDeviceError`] starts when the device path
/// could not start (libraries missing, too old, or another rank's were): nothing was
/// enqueued and the communicator's host path is untouched, so the C ABI does not mark
/// the communicator failed for it.
pub const UNAVAILABLE: &str = "device path unavailable";

/// A library error as HALO's: NCCL's own result codes keep their meaning (NCCL's
/// numbering is HALO's); loading and runtime failures are `UnhandledDeviceError`.
pub(crate) fn device_error(e: RcclError) -> Error {
    let message = match &e {
        RcclError::Unavailable { .. }
        | RcclError::MissingSymbol { .. }
        | RcclError::TooOld { .. } => format!("{}: {e}", UNAVAILABLE),
        _ => format!("device path: {e}"),
    };
    match &e {
        RcclError::Nccl { code, .. } => match code {
            2 => Error::SystemError { message },
            3 => Error::InternalError { message },
            4 => Error::InvalidArgument {
                peer: None,
                message,
            },
            5 => Error::InvalidUsage {
                peer: None,
                message,
            },
            _ => Error::UnhandledDeviceError { message },
        },
        RcclError::Invalid(_) => Error::InvalidArgument {
            peer: None,
            message,
        },
        _ => Error::UnhandledDeviceError { message },
    }
}

/// The device runtime, loaded once per process (the outcome, failure included, is kept).
///
/// # Errors
/// [`Error::UnhandledDeviceError`] naming every place tried.
pub(crate) fn runtime() -> Result<Arc<Runtime>> {
    static RT: OnceLock<std::result::Result<Arc<Runtime>, RcclError>> = OnceLock::new();
    RT.get_or_init(|| Runtime::load().map(Arc::new))
        .clone()
        .map_err(device_error)
}

/// NCCL / RCCL, loaded once per process.
///
/// # Errors
/// [`Error::UnhandledDeviceError`] naming every place tried.
pub(crate) fn nccl() -> Result<Arc<Nccl>> {
    static NCCL: OnceLock<std::result::Result<Arc<Nccl>, RcclError>> = OnceLock::new();
    NCCL.get_or_init(|| Nccl::load().map(Arc::new))
        .clone()
        .map_err(device_error)
}

/// What `ptr` points at.
///
/// # Errors
/// [`Error::UnhandledDeviceError`] without a runtime, or when the runtime fails.
pub(crate) fn memory_kind(ptr: *const c_void) -> Result<MemoryKind> {
    runtime()?.memory_kind(ptr).map_err(device_error)
}

/// One communicator's device state: its NCCL communicator and device scratch.
pub(crate) struct DeviceState {
    nccl: Arc<Nccl>,
    rt: Arc<Runtime>,
    comm: NcclComm,
    device: i32,
    scratch: *mut c_void,
    scratch_len: usize,
    /// The stream of the last call, which may still be using `scratch`.
    last_stream: Stream,
}

// SAFETY: the NCCL communicator and device pointers are plain handles that any thread
// may use; the `Communicator` that owns this state is used by one thread at a time
// (NCCL's own rule for a communicator).
unsafe impl Send for DeviceState {}

impl std::fmt::Debug for DeviceState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceState")
            .field("nccl", &self.nccl)
            .field("device", &self.device)
            .field("scratch_len", &self.scratch_len)
            .finish_non_exhaustive()
    }
}

impl DeviceState {
    /// Makes the NCCL communicator from the id every rank received (`ncclCommInitRank`
    /// on `device`).
    pub(crate) fn new(
        nccl: Arc<Nccl>,
        rt: Arc<Runtime>,
        device: i32,
        nranks: usize,
        rank: usize,
        id: &halo_rccl_sys::NcclUniqueId,
    ) -> Result<Self> {
        rt.set_device(device).map_err(device_error)?;
        let comm = nccl
            .comm_init_rank(nranks, id, rank)
            .map_err(device_error)?;
        tracing::info!(target: "halo::device", rank, nranks, device, "NCCL communicator ready");
        Ok(DeviceState {
            nccl,
            rt,
            comm,
            device,
            scratch: std::ptr::null_mut(),
            scratch_len: 0,
            last_stream: std::ptr::null_mut(),
        })
    }

    /// The device the communicator lives on.
    pub(crate) fn device(&self) -> i32 {
        self.device
    }

    /// Runs (enqueues) one schedule's waves on `stream` over device buffers.
    ///
    /// # Safety
    /// `send` is device memory readable and `recv` device memory writable over every
    /// region the schedule names, until the stream has run the enqueued work; `stream`
    /// is a live stream of `self.device()` (or NULL, the default stream).
    pub(crate) unsafe fn run(
        &mut self,
        schedule: &halo_collectives::Schedule,
        waves: &halo_collectives::Waves,
        send: *const c_void,
        recv: *mut c_void,
        stream: Stream,
    ) -> Result<()> {
        self.rt.set_device(self.device).map_err(device_error)?;
        let need = schedule.scratch_len();
        if need > self.scratch_len || (stream != self.last_stream && !self.scratch.is_null()) {
            // The previous call's stream may still use the scratch: let it finish
            // before the scratch is reused from another stream or replaced.
            // SAFETY: `last_stream` was live when it was used (the caller's contract).
            unsafe { self.rt.stream_synchronize(self.last_stream) }.map_err(device_error)?;
        }
        if need > self.scratch_len {
            if !self.scratch.is_null() {
                // SAFETY: allocated by this runtime, not in use (synchronised above).
                unsafe { self.rt.free(self.scratch) }.map_err(device_error)?;
                self.scratch = std::ptr::null_mut();
                self.scratch_len = 0;
            }
            self.scratch = self.rt.malloc(need).map_err(device_error)?;
            self.scratch_len = need;
        }
        self.last_stream = stream;
        let mut backend = NcclWaves {
            nccl: &self.nccl,
            rt: &self.rt,
            comm: self.comm,
            stream,
            send,
            recv,
            scratch: self.scratch,
        };
        halo_collectives::execute_waves(schedule, waves, &mut backend).map_err(Error::from)?;
        // SAFETY: the communicator is live.
        unsafe { self.nccl.comm_async_error(self.comm) }.map_err(device_error)
    }
}

impl Drop for DeviceState {
    fn drop(&mut self) {
        // SAFETY: the stream was live at its last use; the scratch and the communicator
        // belong to this state and are not used after this.
        unsafe {
            let _ = self.rt.stream_synchronize(self.last_stream);
            if !self.scratch.is_null() {
                let _ = self.rt.free(self.scratch);
            }
            if let Err(e) = self.nccl.comm_destroy(self.comm) {
                tracing::warn!(target: "halo::device", "ncclCommDestroy: {e}");
            }
        }
    }
}

/// [`WaveBackend`] over NCCL: copies as async device copies, groups as NCCL groups.
struct NcclWaves<'a> {
    nccl: &'a Nccl,
    rt: &'a Runtime,
    comm: NcclComm,
    stream: Stream,
    send: *const c_void,
    recv: *mut c_void,
    scratch: *mut c_void,
}

impl NcclWaves<'_> {
    /// The device address of a region (in bounds: the schedule was built, and its
    /// regions checked, for these buffers).
    fn at(&self, r: Region) -> *mut c_void {
        let base = match r.buf {
            halo_collectives::Buf::Send => self.send.cast_mut(),
            halo_collectives::Buf::Recv => self.recv,
            halo_collectives::Buf::Scratch => self.scratch,
        };
        base.cast::<u8>().wrapping_add(r.offset).cast()
    }
}

fn collective(e: RcclError) -> halo_collectives::CollectiveError {
    match e {
        RcclError::Invalid(m) => halo_collectives::CollectiveError::InvalidArgument(m),
        other => halo_collectives::CollectiveError::System(format!("device path: {other}")),
    }
}

impl WaveBackend for NcclWaves<'_> {
    fn copy(&mut self, _step: StepId, src: Region, dst: Region) -> halo_collectives::Result<()> {
        // SAFETY: both regions lie in the caller's device buffers or the scratch (the
        // schedule's regions are inside the buffers it was built for), do not overlap
        // (verified schedules), and stay valid until the stream runs the copy.
        unsafe {
            self.rt.memcpy_async(
                self.at(dst),
                self.at(src),
                src.len,
                MemcpyKind::DeviceToDevice,
                self.stream,
            )
        }
        .map_err(collective)
    }

    fn group(&mut self, _wave: usize, messages: &[(StepId, Step)]) -> halo_collectives::Result<()> {
        self.nccl.group_start().map_err(collective)?;
        let mut out = Ok(());
        for &(_, step) in messages {
            // SAFETY: as for copies: regions inside device buffers that stay valid
            // until the stream has run the group.
            let r = unsafe {
                match step {
                    Step::Send { peer, region, .. } => self.nccl.send(
                        self.at(region),
                        region.len,
                        peer as usize,
                        self.comm,
                        self.stream,
                    ),
                    Step::Recv { peer, region, .. } => self.nccl.recv(
                        self.at(region),
                        region.len,
                        peer as usize,
                        self.comm,
                        self.stream,
                    ),
                    Step::Copy { .. } => Ok(()),
                }
            };
            if let Err(e) = r {
                out = Err(collective(e));
                break;
            }
        }
        // The group is always closed, also after a failed call inside it.
        let end = self.nccl.group_end().map_err(collective);
        out.and(end)
    }
}
