//! The device path of the C ABI (issue 17): `haloAllToAll` / `haloAllToAllv` with a
//! non-NULL stream. Kept in its own module so that the collectives' host path stays
//! as it was.
//!
//! With a stream, both buffers must be device (or managed) memory of one device —
//! told apart from host memory by the runtime's pointer attributes
//! (`cudaPointerGetAttributes` / `hipPointerGetAttributes`). Device buffers run on the
//! device path (NCCL / RCCL groups and async copies on `stream`, returning once
//! enqueued); host buffers with a stream, or one of each, are `haloInvalidArgument`
//! naming what each buffer is. Without the device libraries (no CUDA / HIP runtime, no
//! NCCL / RCCL) the call is `haloUnhandledDeviceError` and `haloGetLastError` names every
//! place that was tried. A NULL stream keeps the host transports.

use crate::error::{Failure, FfiResult};
use crate::handle::haloComm;
use crate::types::haloStream_t;
use halo_rs::Partition;
use std::ffi::c_void;

/// Whether a failure leaves the communicator usable although its code is one that
/// marks it failed: the device path could not start (its libraries are missing), which
/// touched nothing of the host path.
pub(crate) fn leaves_comm_usable(code: crate::error::haloResult, message: &std::ffi::CStr) -> bool {
    code == crate::error::haloResult::haloUnhandledDeviceError
        && message
            .to_str()
            .is_ok_and(|m| m.contains(halo_rs::device::UNAVAILABLE))
}

/// The device that holds both buffers; refuses host memory with a stream.
fn device_of(sendbuff: *const c_void, recvbuff: *const c_void) -> FfiResult<i32> {
    match halo_rs::device::buffers_device(sendbuff, recvbuff)? {
        Some(d) => Ok(d),
        None => Err(Failure::invalid(
            "a stream was given but the buffers are host memory: pass device buffers with a \
             stream (the device path), or a NULL stream for host buffers (the host transports)",
        )),
    }
}

/// `haloAllToAll` with a stream.
///
/// # Safety
/// As `haloAllToAll`'s contract with device buffers: `sendbuff` / `recvbuff` cover `bytes`
/// bytes of device memory until `stream` has run the call; `stream` is live.
pub(crate) unsafe fn all_to_all(
    c: &haloComm,
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    elem: usize,
    stream: haloStream_t,
) -> FfiResult<()> {
    let device = device_of(sendbuff, recvbuff.cast_const())?;
    let mut guard = c.lock()?;
    // SAFETY: per the contract; the communicator checks sizes and overlap first.
    unsafe {
        halo_rs::c_abi::device_all_to_all(
            &mut guard, sendbuff, recvbuff, count, elem, stream, device,
        )?;
    }
    Ok(())
}

/// `haloAllToAllv` with a stream.
///
/// # Safety
/// As `haloAllToAllv`'s contract with device buffers (the count and displacement arrays
/// are host memory, `nranks` entries each).
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn all_to_all_v(
    c: &haloComm,
    sendbuff: *const c_void,
    send: (&[usize], &[usize]),
    recvbuff: *mut c_void,
    recv: (&[usize], &[usize]),
    elem: usize,
    stream: haloStream_t,
) -> FfiResult<()> {
    let device = device_of(sendbuff, recvbuff.cast_const())?;
    let mut guard = c.lock()?;
    let (sp, rp) = (
        Partition::new(send.0, send.1),
        Partition::new(recv.0, recv.1),
    );
    // SAFETY: per the contract; counts are exchanged and checked before data moves.
    unsafe {
        halo_rs::c_abi::device_all_to_all_v(
            &mut guard, sendbuff, &sp, recvbuff, &rp, elem, stream, device,
        )?;
    }
    Ok(())
}
