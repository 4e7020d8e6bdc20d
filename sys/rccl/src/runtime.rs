//! The device runtime: CUDA (`libcudart`) or HIP (`libamdhip64`), the same calls under
//! the prefix `cuda` / `hip`.

use crate::error::{RcclError, Result};
use crate::search::{RUNTIME_ENV, Search, candidates_runtime, open_first};
use crate::{Event, Stream};
use libloading::Library;
use std::ffi::{CStr, c_char, c_int, c_void};

/// Which runtime was loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuntimeFlavor {
    /// NVIDIA CUDA (`libcudart`).
    Cuda,
    /// AMD HIP (`libamdhip64`).
    Hip,
}

impl RuntimeFlavor {
    fn prefix(self) -> &'static str {
        match self {
            RuntimeFlavor::Cuda => "cuda",
            RuntimeFlavor::Hip => "hip",
        }
    }
}

/// The runtime's and the driver's version codes, as the runtime reports them
/// (CUDA: `1000 * major + 10 * minor`; HIP: `10^7 * major + 10^5 * minor + patch`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuntimeVersion {
    /// `{cuda,hip}RuntimeGetVersion`.
    pub runtime: i32,
    /// `{cuda,hip}DriverGetVersion` (0 where no driver is installed).
    pub driver: i32,
}

/// `cudaMemcpyKind` / `hipMemcpyKind` (the same values).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
pub enum MemcpyKind {
    /// Host to host.
    HostToHost = 0,
    /// Host to device.
    HostToDevice = 1,
    /// Device to host.
    DeviceToHost = 2,
    /// Device to device.
    DeviceToDevice = 3,
    /// Inferred from the pointers (unified addressing).
    Default = 4,
}

/// What a pointer points at, from the runtime's pointer attributes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryKind {
    /// Host memory, registered with the runtime or not.
    Host,
    /// Device memory of `device`.
    Device(i32),
    /// Managed (unified) memory, usable from `device`.
    Managed(i32),
}

impl MemoryKind {
    /// Whether a device kernel or copy engine can access it directly (device or managed).
    pub fn is_device(self) -> bool {
        matches!(self, MemoryKind::Device(_) | MemoryKind::Managed(_))
    }
}

type IntOutFn = unsafe extern "C" fn(*mut c_int) -> c_int;
type IntInFn = unsafe extern "C" fn(c_int) -> c_int;
type VoidFn = unsafe extern "C" fn() -> c_int;
type MallocFn = unsafe extern "C" fn(*mut *mut c_void, usize) -> c_int;
type FreeFn = unsafe extern "C" fn(*mut c_void) -> c_int;
type MemcpyFn = unsafe extern "C" fn(*mut c_void, *const c_void, usize, c_int) -> c_int;
type MemcpyAsyncFn =
    unsafe extern "C" fn(*mut c_void, *const c_void, usize, c_int, Stream) -> c_int;
type StreamCreateFn = unsafe extern "C" fn(*mut Stream) -> c_int;
type StreamFn = unsafe extern "C" fn(Stream) -> c_int;
type EventCreateFn = unsafe extern "C" fn(*mut Event) -> c_int;
type EventFn = unsafe extern "C" fn(Event) -> c_int;
type EventRecordFn = unsafe extern "C" fn(Event, Stream) -> c_int;
type ElapsedFn = unsafe extern "C" fn(*mut f32, Event, Event) -> c_int;
type AttributesFn = unsafe extern "C" fn(*mut c_void, *const c_void) -> c_int;
type ErrorStringFn = unsafe extern "C" fn(c_int) -> *const c_char;

/// The CUDA or HIP runtime, loaded.
pub struct Runtime {
    flavor: RuntimeFlavor,
    path: String,
    version: RuntimeVersion,
    get_device_count: IntOutFn,
    get_device: IntOutFn,
    set_device: IntInFn,
    device_synchronize: VoidFn,
    get_last_error: VoidFn,
    malloc: MallocFn,
    free: FreeFn,
    memcpy: MemcpyFn,
    memcpy_async: MemcpyAsyncFn,
    stream_create: StreamCreateFn,
    stream_destroy: StreamFn,
    stream_synchronize: StreamFn,
    event_create: EventCreateFn,
    event_destroy: EventFn,
    event_record: EventRecordFn,
    event_synchronize: EventFn,
    event_elapsed_time: ElapsedFn,
    pointer_get_attributes: AttributesFn,
    get_error_string: ErrorStringFn,
    _lib: Library,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("flavor", &self.flavor)
            .field("path", &self.path)
            .field("version", &self.version)
            .finish()
    }
}

/// Copies the function `{prefix}{name}` out of `lib`.
///
/// # Safety
/// `F` must be the symbol's real type.
unsafe fn symbol<F: Copy>(
    lib: &Library,
    path: &str,
    prefix: &str,
    name: &'static str,
) -> Result<F> {
    let full = format!("{prefix}{name}\0");
    // SAFETY: the caller guarantees `F` is the symbol's type; the pointer is used only
    // while `lib` is loaded (stored next to the `Library` that owns it).
    unsafe { lib.get::<F>(full.as_bytes()) }
        .map(|s| *s)
        .map_err(|e| RcclError::MissingSymbol {
            library: path.to_string(),
            symbol: name,
            message: format!("{}{name}: {e:?}", prefix),
        })
}

impl Runtime {
    /// Loads the runtime as the environment says ([`Search::from_env`]).
    ///
    /// # Errors
    /// [`RcclError::Unavailable`] naming every place tried; [`RcclError::MissingSymbol`];
    /// [`RcclError::TooOld`] for CUDA before 10.0 (another pointer-attribute layout).
    pub fn load() -> Result<Self> {
        Self::load_with(&Search::from_env())
    }

    /// Loads the runtime from the first candidate of `search` that loads.
    ///
    /// # Errors
    /// As [`Runtime::load`].
    pub fn load_with(search: &Search) -> Result<Self> {
        let candidates = candidates_runtime(search);
        let explicit = search.runtime.as_ref().map(|_| RUNTIME_ENV);
        let (lib, path) = open_first("CUDA/HIP runtime", &candidates, explicit)?;
        // SAFETY: only probes whether a symbol exists; the type is never called.
        let is_hip = unsafe { lib.get::<VoidFn>(b"hipGetDeviceCount\0") }.is_ok();
        let flavor = if is_hip {
            RuntimeFlavor::Hip
        } else {
            RuntimeFlavor::Cuda
        };
        let pre = flavor.prefix();
        let p = path.as_str();
        // SAFETY: (every `symbol` call) the types are the CUDA / HIP runtime API's
        // signatures, with the error enums, memcpy kinds and device numbers as `int`.
        let rt = unsafe {
            Runtime {
                flavor,
                version: RuntimeVersion {
                    runtime: 0,
                    driver: 0,
                },
                get_device_count: symbol(&lib, p, pre, "GetDeviceCount")?,
                get_device: symbol(&lib, p, pre, "GetDevice")?,
                set_device: symbol(&lib, p, pre, "SetDevice")?,
                device_synchronize: symbol(&lib, p, pre, "DeviceSynchronize")?,
                get_last_error: symbol(&lib, p, pre, "GetLastError")?,
                malloc: symbol(&lib, p, pre, "Malloc")?,
                free: symbol(&lib, p, pre, "Free")?,
                memcpy: symbol(&lib, p, pre, "Memcpy")?,
                memcpy_async: symbol(&lib, p, pre, "MemcpyAsync")?,
                stream_create: symbol(&lib, p, pre, "StreamCreate")?,
                stream_destroy: symbol(&lib, p, pre, "StreamDestroy")?,
                stream_synchronize: symbol(&lib, p, pre, "StreamSynchronize")?,
                event_create: symbol(&lib, p, pre, "EventCreate")?,
                event_destroy: symbol(&lib, p, pre, "EventDestroy")?,
                event_record: symbol(&lib, p, pre, "EventRecord")?,
                event_synchronize: symbol(&lib, p, pre, "EventSynchronize")?,
                event_elapsed_time: symbol(&lib, p, pre, "EventElapsedTime")?,
                pointer_get_attributes: symbol(&lib, p, pre, "PointerGetAttributes")?,
                get_error_string: symbol(&lib, p, pre, "GetErrorString")?,
                path: path.clone(),
                _lib: lib,
            }
        };
        let mut rt = rt;
        // SAFETY: both symbols have the signature `int f(int*)`.
        let (rget, dget): (IntOutFn, IntOutFn) = unsafe {
            (
                symbol(&rt._lib, p, pre, "RuntimeGetVersion")?,
                symbol(&rt._lib, p, pre, "DriverGetVersion")?,
            )
        };
        let (mut r, mut d) = (0, 0);
        // SAFETY: each writes one int through a valid pointer.
        let rc = unsafe { rget(&mut r) };
        rt.check("RuntimeGetVersion", rc)?;
        // SAFETY: as above; a missing driver reports 0 or an error, neither is fatal here.
        let _ = unsafe { dget(&mut d) };
        rt.version = RuntimeVersion {
            runtime: r,
            driver: d,
        };
        if flavor == RuntimeFlavor::Cuda && r < 10000 {
            return Err(RcclError::TooOld {
                library: path,
                found: format!("CUDA runtime {r}"),
                needed: "10000 (CUDA 10.0)".into(),
            });
        }
        tracing::info!(target: "halo::device", "{flavor:?} runtime {r} (driver {d}) from {path}");
        Ok(rt)
    }

    /// CUDA or HIP.
    pub fn flavor(&self) -> RuntimeFlavor {
        self.flavor
    }

    /// The path or soname it was loaded from.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The runtime's and driver's versions.
    pub fn version(&self) -> RuntimeVersion {
        self.version
    }

    /// The runtime's description of an error code.
    pub fn error_string(&self, code: i32) -> String {
        // SAFETY: takes any value; returns NULL or a static NUL-terminated string.
        let p = unsafe { (self.get_error_string)(code) };
        if p.is_null() {
            return format!("error {code}");
        }
        // SAFETY: non-NULL, NUL-terminated, static.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }

    fn check(&self, name: &str, code: c_int) -> Result<()> {
        if code == 0 {
            Ok(())
        } else {
            Err(RcclError::Runtime {
                call: format!("{}{name}", self.flavor.prefix()),
                code,
                message: self.error_string(code),
            })
        }
    }

    /// Number of visible devices (an error where there is no driver or no device).
    ///
    /// # Errors
    /// The runtime's error (e.g. "no CUDA-capable device is detected").
    pub fn device_count(&self) -> Result<usize> {
        let mut n: c_int = 0;
        // SAFETY: writes one int through a valid pointer.
        let rc = unsafe { (self.get_device_count)(&mut n) };
        self.check("GetDeviceCount", rc)?;
        Ok(n.max(0) as usize)
    }

    /// The current device of this thread.
    ///
    /// # Errors
    /// The runtime's error.
    pub fn device(&self) -> Result<i32> {
        let mut d: c_int = 0;
        // SAFETY: writes one int through a valid pointer.
        let rc = unsafe { (self.get_device)(&mut d) };
        self.check("GetDevice", rc)?;
        Ok(d)
    }

    /// Makes `device` current for this thread.
    ///
    /// # Errors
    /// The runtime's error.
    pub fn set_device(&self, device: i32) -> Result<()> {
        // SAFETY: takes a device number; an invalid one is an error code.
        let rc = unsafe { (self.set_device)(device) };
        self.check("SetDevice", rc)
    }

    /// Waits for all work on the current device.
    ///
    /// # Errors
    /// The runtime's error (also an earlier asynchronous one).
    pub fn device_synchronize(&self) -> Result<()> {
        // SAFETY: no arguments.
        let rc = unsafe { (self.device_synchronize)() };
        self.check("DeviceSynchronize", rc)
    }

    /// Allocates `bytes` of device memory (at least one byte is asked for).
    ///
    /// # Errors
    /// The runtime's error.
    pub fn malloc(&self, bytes: usize) -> Result<*mut c_void> {
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: writes one pointer through a valid pointer.
        let rc = unsafe { (self.malloc)(&mut p, bytes.max(1)) };
        self.check("Malloc", rc)?;
        Ok(p)
    }

    /// Frees device memory from [`Runtime::malloc`].
    ///
    /// # Safety
    /// `ptr` came from this runtime's `malloc` and is not used afterwards.
    pub unsafe fn free(&self, ptr: *mut c_void) -> Result<()> {
        // SAFETY: per the contract.
        let rc = unsafe { (self.free)(ptr) };
        self.check("Free", rc)
    }

    /// A synchronous copy.
    ///
    /// # Safety
    /// `dst` writable and `src` readable for `bytes` bytes, in the memory `kind` says.
    pub unsafe fn memcpy(
        &self,
        dst: *mut c_void,
        src: *const c_void,
        bytes: usize,
        kind: MemcpyKind,
    ) -> Result<()> {
        // SAFETY: per the contract.
        let rc = unsafe { (self.memcpy)(dst, src, bytes, kind as c_int) };
        self.check("Memcpy", rc)
    }

    /// An asynchronous copy enqueued on `stream`.
    ///
    /// # Safety
    /// `dst` writable and `src` readable for `bytes` bytes until the copy completes on
    /// `stream`, in the memory `kind` says; `stream` is live.
    pub unsafe fn memcpy_async(
        &self,
        dst: *mut c_void,
        src: *const c_void,
        bytes: usize,
        kind: MemcpyKind,
        stream: Stream,
    ) -> Result<()> {
        // SAFETY: per the contract.
        let rc = unsafe { (self.memcpy_async)(dst, src, bytes, kind as c_int, stream) };
        self.check("MemcpyAsync", rc)
    }

    /// A new stream on the current device.
    ///
    /// # Errors
    /// The runtime's error.
    pub fn stream_create(&self) -> Result<Stream> {
        let mut s: Stream = std::ptr::null_mut();
        // SAFETY: writes one handle through a valid pointer.
        let rc = unsafe { (self.stream_create)(&mut s) };
        self.check("StreamCreate", rc)?;
        Ok(s)
    }

    /// Destroys a stream.
    ///
    /// # Safety
    /// `stream` came from [`Runtime::stream_create`] and is not used afterwards.
    pub unsafe fn stream_destroy(&self, stream: Stream) -> Result<()> {
        // SAFETY: per the contract.
        let rc = unsafe { (self.stream_destroy)(stream) };
        self.check("StreamDestroy", rc)
    }

    /// Waits until everything enqueued on `stream` has run.
    ///
    /// # Safety
    /// `stream` is live (or NULL, the default stream).
    pub unsafe fn stream_synchronize(&self, stream: Stream) -> Result<()> {
        // SAFETY: per the contract.
        let rc = unsafe { (self.stream_synchronize)(stream) };
        self.check("StreamSynchronize", rc)
    }

    /// A new event.
    ///
    /// # Errors
    /// The runtime's error.
    pub fn event_create(&self) -> Result<Event> {
        let mut e: Event = std::ptr::null_mut();
        // SAFETY: writes one handle through a valid pointer.
        let rc = unsafe { (self.event_create)(&mut e) };
        self.check("EventCreate", rc)?;
        Ok(e)
    }

    /// Destroys an event.
    ///
    /// # Safety
    /// `event` came from [`Runtime::event_create`] and is not used afterwards.
    pub unsafe fn event_destroy(&self, event: Event) -> Result<()> {
        // SAFETY: per the contract.
        let rc = unsafe { (self.event_destroy)(event) };
        self.check("EventDestroy", rc)
    }

    /// Records `event` on `stream`.
    ///
    /// # Safety
    /// Both are live.
    pub unsafe fn event_record(&self, event: Event, stream: Stream) -> Result<()> {
        // SAFETY: per the contract.
        let rc = unsafe { (self.event_record)(event, stream) };
        self.check("EventRecord", rc)
    }

    /// Waits for `event`.
    ///
    /// # Safety
    /// `event` is live.
    pub unsafe fn event_synchronize(&self, event: Event) -> Result<()> {
        // SAFETY: per the contract.
        let rc = unsafe { (self.event_synchronize)(event) };
        self.check("EventSynchronize", rc)
    }

    /// Milliseconds between two recorded, completed events.
    ///
    /// # Safety
    /// Both are live.
    pub unsafe fn event_elapsed_ms(&self, start: Event, end: Event) -> Result<f32> {
        let mut ms = 0f32;
        // SAFETY: per the contract; writes one float through a valid pointer.
        let rc = unsafe { (self.event_elapsed_time)(&mut ms, start, end) };
        self.check("EventElapsedTime", rc)?;
        Ok(ms)
    }

    /// What `ptr` points at. Host memory the runtime does not know is [`MemoryKind::Host`]
    /// (CUDA >= 11 and HIP >= 6 say "unregistered"; older runtimes return an
    /// invalid-value error, which is cleared and read the same way).
    ///
    /// # Errors
    /// Another runtime error (no driver, no device).
    // The runtime looks the address up in its tables; it never reads through it, so any
    // pointer value is safe to pass.
    #[allow(clippy::not_unsafe_ptr_arg_deref)]
    pub fn memory_kind(&self, ptr: *const c_void) -> Result<MemoryKind> {
        // Larger than any runtime's attribute struct (CUDA: 24 bytes; HIP 6: 32), and
        // aligned for its pointers.
        let mut attrs = [0u64; 16];
        // SAFETY: the runtime writes its attribute struct (at most 32 bytes) into a
        // zeroed, 8-aligned buffer of 128 bytes; `ptr` is only looked up, never read.
        let rc = unsafe { (self.pointer_get_attributes)(attrs.as_mut_ptr().cast(), ptr) };
        if rc == 1 {
            // cudaErrorInvalidValue / hipErrorInvalidValue: memory the runtime does not
            // know (older runtimes). Clear it so that it does not surface later.
            // SAFETY: no arguments.
            let _ = unsafe { (self.get_last_error)() };
            return Ok(MemoryKind::Host);
        }
        self.check("PointerGetAttributes", rc)?;
        // SAFETY: reading the first two 32-bit fields of the struct the runtime wrote
        // (the memory type and the device) out of the u64 buffer.
        let (kind, device): (i32, i32) = unsafe {
            let p = attrs.as_ptr().cast::<i32>();
            (*p, *p.add(1))
        };
        let hip_old = self.flavor == RuntimeFlavor::Hip && self.version.runtime < 60_000_000;
        Ok(match (hip_old, kind) {
            // CUDA >= 10 and HIP >= 6: 0 unregistered, 1 host, 2 device, 3 managed
            // (HIP 6 adds 10 array, 11 unified: device memory).
            (false, 2) | (false, 10) => MemoryKind::Device(device),
            (false, 3) | (false, 11) => MemoryKind::Managed(device),
            (false, _) => MemoryKind::Host,
            // HIP 5 (`memoryType`): 0 host, 1 device, 2 array, 3 unified, 4 managed.
            (true, 1) | (true, 2) => MemoryKind::Device(device),
            (true, 3) | (true, 4) => MemoryKind::Managed(device),
            (true, _) => MemoryKind::Host,
        })
    }
}
