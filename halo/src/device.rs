//! The device path: NCCL / RCCL and GPU memory.
//!
//! A collective over device buffers runs the same schedules as the host path, grouped
//! into waves ([`halo_collectives::group_waves`], proven sound by
//! [`halo_collectives::verify_waves`]) and enqueued on the caller's stream as
//! `ncclSend` / `ncclRecv` groups plus async device copies (`transport::device`). The
//! C ABI takes this path when a call gets a non-NULL stream and device pointers
//! (`haloAllToAll`, `haloAllToAllv`); the Python package when it gets CUDA / ROCm
//! tensors. NCCL and the runtime are loaded at run time ([`halo_rccl_sys`]): without
//! them (or without a GPU) every device entry point returns
//! [`Error::UnhandledDeviceError`] naming every place tried.
//!
//! **Not run on a GPU yet**: this code compiles and its failure paths and CPU twin are
//! tested here; `scripts/gpu-check.sh` is the prepared check for a machine with one.

use crate::error::{Error, Result};
pub use halo_rccl_sys::{MemoryKind, NcclVersion, RuntimeFlavor};
use std::ffi::c_void;

pub use crate::transport::device::UNAVAILABLE;

/// What the device path found on this machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// CUDA or HIP.
    pub flavor: RuntimeFlavor,
    /// Where the runtime was loaded from.
    pub runtime_path: String,
    /// The runtime's version code.
    pub runtime_version: i32,
    /// The driver's version code (0 without a driver).
    pub driver_version: i32,
    /// Visible devices.
    pub devices: usize,
    /// Where NCCL / RCCL was loaded from.
    pub nccl_path: String,
    /// Its version.
    pub nccl_version: NcclVersion,
    /// Its own all-to-all, if it has one (`ncclAllToAll`: RCCL; `ncclAlltoAll`: NCCL >= 2.28).
    pub nccl_all_to_all: Option<&'static str>,
}

/// Loads the runtime and NCCL / RCCL and counts the devices.
///
/// # Errors
/// [`Error::UnhandledDeviceError`] naming every place tried when a library is missing,
/// or the runtime's error when there is no driver or no device.
pub fn probe() -> Result<DeviceInfo> {
    let rt = crate::transport::device::runtime()?;
    let nccl = crate::transport::device::nccl()?;
    let devices = rt
        .device_count()
        .map_err(crate::transport::device::device_error)?;
    Ok(DeviceInfo {
        flavor: rt.flavor(),
        runtime_path: rt.path().to_string(),
        runtime_version: rt.version().runtime,
        driver_version: rt.version().driver,
        devices,
        nccl_path: nccl.path().to_string(),
        nccl_version: nccl.version(),
        nccl_all_to_all: nccl.all_to_all_name(),
    })
}

/// What `ptr` points at, from the runtime's pointer attributes.
///
/// # Errors
/// [`Error::UnhandledDeviceError`] without a runtime (naming every place tried).
pub fn memory_kind(ptr: *const c_void) -> Result<MemoryKind> {
    crate::transport::device::memory_kind(ptr)
}

/// Where a collective's two buffers live: `Ok(Some(device))` when both are device (or
/// managed) memory of one device, `Ok(None)` when both are host memory. A NULL pointer
/// (an empty buffer) takes the other's place.
///
/// # Errors
/// [`Error::InvalidArgument`] when one is device memory and the other host memory, or
/// they are on different devices; [`Error::UnhandledDeviceError`] without a runtime.
pub fn buffers_device(send: *const c_void, recv: *const c_void) -> Result<Option<i32>> {
    let kind = |p: *const c_void| -> Result<Option<MemoryKind>> {
        if p.is_null() {
            Ok(None)
        } else {
            memory_kind(p).map(Some)
        }
    };
    let (s, r) = (kind(send)?, kind(recv)?);
    let device = |k: MemoryKind| match k {
        MemoryKind::Device(d) | MemoryKind::Managed(d) => Some(d),
        MemoryKind::Host => None,
    };
    let name = |k: MemoryKind| match k {
        MemoryKind::Host => "host memory".to_string(),
        MemoryKind::Device(d) => format!("device memory (device {d})"),
        MemoryKind::Managed(d) => format!("managed memory (device {d})"),
    };
    match (s, r) {
        (None, None) => Ok(None),
        (Some(k), None) | (None, Some(k)) => Ok(device(k)),
        (Some(a), Some(b)) => match (device(a), device(b)) {
            (None, None) => Ok(None),
            (Some(x), Some(y)) if x == y => Ok(Some(x)),
            _ => Err(Error::invalid_argument(format!(
                "sendbuff is {} but recvbuff is {}: both buffers must be device memory of one \
                 device (with a stream) or host memory (with a NULL stream)",
                name(a),
                name(b)
            ))),
        },
    }
}
