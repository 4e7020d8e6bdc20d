//! NCCL / RCCL: the communicator, point-to-point calls in groups, the all-to-all.

use crate::Stream;
use crate::error::{RcclError, Result};
use crate::search::{NCCL_ENV, Search, candidates_nccl, open_first};
use libloading::Library;
use std::ffi::{CStr, c_char, c_int, c_void};

/// `ncclUint8`: HALO moves bytes, so every call uses this data type.
#[allow(non_upper_case_globals)]
pub const ncclUint8: c_int = 1;

/// Bytes of an `ncclUniqueId` (`NCCL_UNIQUE_ID_BYTES`).
pub const NCCL_UNIQUE_ID_BYTES: usize = 128;

/// The oldest NCCL HALO uses: 2.7.0, the first with `ncclSend` / `ncclRecv`.
pub const MIN_NCCL_VERSION: NcclVersion = NcclVersion {
    major: 2,
    minor: 7,
    patch: 0,
};

/// An opaque `ncclComm_t`.
pub type NcclComm = *mut c_void;

/// `ncclUniqueId`: 128 opaque bytes, passed by value to `ncclCommInitRank`.
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct NcclUniqueId {
    /// The bytes.
    pub internal: [c_char; NCCL_UNIQUE_ID_BYTES],
}

impl std::fmt::Debug for NcclUniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NcclUniqueId(..)")
    }
}

impl Default for NcclUniqueId {
    fn default() -> Self {
        NcclUniqueId {
            internal: [0; NCCL_UNIQUE_ID_BYTES],
        }
    }
}

impl NcclUniqueId {
    /// The id as bytes (to send to the other ranks).
    pub fn to_bytes(&self) -> [u8; NCCL_UNIQUE_ID_BYTES] {
        self.internal.map(|c| c as u8)
    }

    /// The id from bytes another rank sent.
    pub fn from_bytes(b: &[u8; NCCL_UNIQUE_ID_BYTES]) -> Self {
        NcclUniqueId {
            internal: b.map(|c| c as c_char),
        }
    }
}

/// A decoded `ncclGetVersion` code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct NcclVersion {
    /// Major.
    pub major: u32,
    /// Minor.
    pub minor: u32,
    /// Patch.
    pub patch: u32,
}

impl NcclVersion {
    /// Decodes `NCCL_VERSION_CODE`: `X*10000 + Y*100 + Z` since 2.9, `X*1000 + Y*100 + Z`
    /// before.
    pub fn from_code(code: i32) -> Self {
        let c = code.max(0) as u32;
        if c >= 10000 {
            NcclVersion {
                major: c / 10000,
                minor: (c % 10000) / 100,
                patch: c % 100,
            }
        } else {
            NcclVersion {
                major: c / 1000,
                minor: (c % 1000) / 100,
                patch: c % 100,
            }
        }
    }
}

impl std::fmt::Display for NcclVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

type GetVersionFn = unsafe extern "C" fn(*mut c_int) -> c_int;
type GetUniqueIdFn = unsafe extern "C" fn(*mut NcclUniqueId) -> c_int;
type CommInitRankFn = unsafe extern "C" fn(*mut NcclComm, c_int, NcclUniqueId, c_int) -> c_int;
type CommFn = unsafe extern "C" fn(NcclComm) -> c_int;
type AsyncErrorFn = unsafe extern "C" fn(NcclComm, *mut c_int) -> c_int;
type ErrorStringFn = unsafe extern "C" fn(c_int) -> *const c_char;
type SendFn = unsafe extern "C" fn(*const c_void, usize, c_int, c_int, NcclComm, Stream) -> c_int;
type RecvFn = unsafe extern "C" fn(*mut c_void, usize, c_int, c_int, NcclComm, Stream) -> c_int;
type GroupFn = unsafe extern "C" fn() -> c_int;
type AllToAllFn =
    unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, NcclComm, Stream) -> c_int;
type AllToAllvFn = unsafe extern "C" fn(
    *const c_void,
    *const usize,
    *const usize,
    *mut c_void,
    *const usize,
    *const usize,
    c_int,
    NcclComm,
    Stream,
) -> c_int;

/// NCCL or RCCL, loaded. Cheap to share (`Arc`); the library stays loaded while it lives.
pub struct Nccl {
    path: String,
    version: NcclVersion,
    get_unique_id: GetUniqueIdFn,
    comm_init_rank: CommInitRankFn,
    comm_destroy: CommFn,
    comm_abort: CommFn,
    comm_get_async_error: AsyncErrorFn,
    get_error_string: ErrorStringFn,
    send: SendFn,
    recv: RecvFn,
    group_start: GroupFn,
    group_end: GroupFn,
    /// RCCL's `ncclAllToAll` or NCCL >= 2.28's `ncclAlltoAll`, with its name.
    all_to_all: Option<(AllToAllFn, &'static str)>,
    all_to_all_v: Option<AllToAllvFn>,
    _lib: Library,
}

impl std::fmt::Debug for Nccl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nccl")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("all_to_all", &self.all_to_all.map(|(_, n)| n))
            .field("all_to_all_v", &self.all_to_all_v.is_some())
            .finish()
    }
}

/// Copies a function pointer out of `lib`.
///
/// # Safety
/// `F` must be the symbol's real type.
unsafe fn symbol<F: Copy>(lib: &Library, path: &str, name: &'static str) -> Result<F> {
    let mut z = name.as_bytes().to_vec();
    z.push(0);
    // SAFETY: the caller guarantees `F` is the symbol's type; the pointer is used only
    // while `lib` is loaded (it is stored next to the `Library` that owns it).
    unsafe { lib.get::<F>(&z) }
        .map(|s| *s)
        .map_err(|e| RcclError::MissingSymbol {
            library: path.to_string(),
            symbol: name,
            message: format!("{e:?}"),
        })
}

impl Nccl {
    /// Loads NCCL / RCCL as the environment says ([`Search::from_env`]).
    ///
    /// # Errors
    /// [`RcclError::Unavailable`] naming every place tried; [`RcclError::MissingSymbol`];
    /// [`RcclError::TooOld`].
    pub fn load() -> Result<Self> {
        Self::load_with(&Search::from_env())
    }

    /// Loads NCCL / RCCL from the first candidate of `search` that loads.
    ///
    /// # Errors
    /// As [`Nccl::load`].
    pub fn load_with(search: &Search) -> Result<Self> {
        let candidates = candidates_nccl(search);
        let explicit = search.nccl.as_ref().map(|_| NCCL_ENV);
        let (lib, path) = open_first("NCCL/RCCL", &candidates, explicit)?;
        Self::from_library(lib, path)
    }

    fn from_library(lib: Library, path: String) -> Result<Self> {
        let p = path.as_str();
        // SAFETY: (every `symbol` call below) the types are the NCCL API's signatures
        // (nccl.h / rccl.h), with `ncclResult_t` and the enums as `int`.
        let get_version: GetVersionFn = unsafe { symbol(&lib, p, "ncclGetVersion")? };
        let mut code: c_int = 0;
        // SAFETY: `ncclGetVersion` writes one int through a valid pointer.
        let rc = unsafe { get_version(&mut code) };
        if rc != 0 {
            return Err(RcclError::Nccl {
                call: "ncclGetVersion",
                code: rc,
                message: format!("{path} could not report its version"),
            });
        }
        let version = NcclVersion::from_code(code);
        if version < MIN_NCCL_VERSION {
            return Err(RcclError::TooOld {
                library: path,
                found: version.to_string(),
                needed: MIN_NCCL_VERSION.to_string(),
            });
        }
        // SAFETY: as above, for each symbol.
        let nccl = unsafe {
            Nccl {
                version,
                get_unique_id: symbol(&lib, p, "ncclGetUniqueId")?,
                comm_init_rank: symbol(&lib, p, "ncclCommInitRank")?,
                comm_destroy: symbol(&lib, p, "ncclCommDestroy")?,
                comm_abort: symbol(&lib, p, "ncclCommAbort")?,
                comm_get_async_error: symbol(&lib, p, "ncclCommGetAsyncError")?,
                get_error_string: symbol(&lib, p, "ncclGetErrorString")?,
                send: symbol(&lib, p, "ncclSend")?,
                recv: symbol(&lib, p, "ncclRecv")?,
                group_start: symbol(&lib, p, "ncclGroupStart")?,
                group_end: symbol(&lib, p, "ncclGroupEnd")?,
                all_to_all: symbol(&lib, p, "ncclAllToAll")
                    .map(|f| (f, "ncclAllToAll"))
                    .or_else(|_| symbol(&lib, p, "ncclAlltoAll").map(|f| (f, "ncclAlltoAll")))
                    .ok(),
                all_to_all_v: symbol(&lib, p, "ncclAllToAllv").ok(),
                path: path.clone(),
                _lib: lib,
            }
        };
        tracing::info!(
            target: "halo::device",
            "NCCL/RCCL {} from {} (all-to-all: {})",
            nccl.version,
            nccl.path,
            nccl.all_to_all.map_or("none", |(_, n)| n)
        );
        Ok(nccl)
    }

    /// The path or soname it was loaded from.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Its version.
    pub fn version(&self) -> NcclVersion {
        self.version
    }

    /// The name of the library's all-to-all (`ncclAllToAll` or `ncclAlltoAll`), if any.
    pub fn all_to_all_name(&self) -> Option<&'static str> {
        self.all_to_all.map(|(_, n)| n)
    }

    /// Whether RCCL's `ncclAllToAllv` is there.
    pub fn has_all_to_all_v(&self) -> bool {
        self.all_to_all_v.is_some()
    }

    /// `ncclGetErrorString`.
    pub fn error_string(&self, code: i32) -> String {
        // SAFETY: `ncclGetErrorString` takes any value and returns NULL or a static,
        // NUL-terminated string.
        let p = unsafe { (self.get_error_string)(code) };
        if p.is_null() {
            return format!("ncclResult_t {code}");
        }
        // SAFETY: non-NULL and NUL-terminated (static storage in the library).
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }

    fn check(&self, call: &'static str, code: c_int) -> Result<()> {
        if code == 0 {
            Ok(())
        } else {
            Err(RcclError::Nccl {
                call,
                code,
                message: self.error_string(code),
            })
        }
    }

    /// `ncclGetUniqueId`.
    ///
    /// # Errors
    /// The library's error.
    pub fn unique_id(&self) -> Result<NcclUniqueId> {
        let mut id = NcclUniqueId::default();
        // SAFETY: writes one `ncclUniqueId` through a valid pointer.
        let rc = unsafe { (self.get_unique_id)(&mut id) };
        self.check("ncclGetUniqueId", rc)?;
        Ok(id)
    }

    /// `ncclCommInitRank` (collective over the `nranks` ranks; the current device is used).
    ///
    /// # Errors
    /// The library's error.
    pub fn comm_init_rank(
        &self,
        nranks: usize,
        id: &NcclUniqueId,
        rank: usize,
    ) -> Result<NcclComm> {
        let n = c_int::try_from(nranks)
            .map_err(|_| RcclError::Invalid(format!("{nranks} ranks do not fit an int")))?;
        let r = c_int::try_from(rank)
            .map_err(|_| RcclError::Invalid(format!("rank {rank} does not fit an int")))?;
        let mut comm: NcclComm = std::ptr::null_mut();
        // SAFETY: writes one handle through a valid pointer; the id is passed by value.
        let rc = unsafe { (self.comm_init_rank)(&mut comm, n, *id, r) };
        self.check("ncclCommInitRank", rc)?;
        Ok(comm)
    }

    /// `ncclCommDestroy`.
    ///
    /// # Safety
    /// `comm` is a live communicator of this library, not used afterwards.
    pub unsafe fn comm_destroy(&self, comm: NcclComm) -> Result<()> {
        // SAFETY: per the contract.
        let rc = unsafe { (self.comm_destroy)(comm) };
        self.check("ncclCommDestroy", rc)
    }

    /// `ncclCommAbort`.
    ///
    /// # Safety
    /// `comm` is a live communicator of this library, not used afterwards.
    pub unsafe fn comm_abort(&self, comm: NcclComm) -> Result<()> {
        // SAFETY: per the contract.
        let rc = unsafe { (self.comm_abort)(comm) };
        self.check("ncclCommAbort", rc)
    }

    /// `ncclCommGetAsyncError`: `Ok(())` while the communicator is healthy (or an
    /// operation is in progress), the asynchronous error otherwise.
    ///
    /// # Safety
    /// `comm` is a live communicator of this library.
    pub unsafe fn comm_async_error(&self, comm: NcclComm) -> Result<()> {
        let mut e: c_int = 0;
        // SAFETY: per the contract; writes one int through a valid pointer.
        let rc = unsafe { (self.comm_get_async_error)(comm, &mut e) };
        self.check("ncclCommGetAsyncError", rc)?;
        // 7 = ncclInProgress: not an error.
        if e == 7 {
            return Ok(());
        }
        self.check("ncclCommGetAsyncError (asynchronous error)", e)
    }

    /// `ncclGroupStart`.
    ///
    /// # Errors
    /// The library's error.
    pub fn group_start(&self) -> Result<()> {
        // SAFETY: no arguments; opens a group on this thread.
        let rc = unsafe { (self.group_start)() };
        self.check("ncclGroupStart", rc)
    }

    /// `ncclGroupEnd`: launches the group's operations on their streams.
    ///
    /// # Errors
    /// The library's error.
    pub fn group_end(&self) -> Result<()> {
        // SAFETY: no arguments; closes the group this thread opened.
        let rc = unsafe { (self.group_end)() };
        self.check("ncclGroupEnd", rc)
    }

    /// `ncclSend` of `bytes` bytes (as `ncclUint8`).
    ///
    /// # Safety
    /// `buf` is device memory readable for `bytes` bytes until the operation completes
    /// on `stream`; `comm` and `stream` are live.
    pub unsafe fn send(
        &self,
        buf: *const c_void,
        bytes: usize,
        peer: usize,
        comm: NcclComm,
        stream: Stream,
    ) -> Result<()> {
        let p = c_int::try_from(peer)
            .map_err(|_| RcclError::Invalid(format!("peer {peer} does not fit an int")))?;
        // SAFETY: per the contract.
        let rc = unsafe { (self.send)(buf, bytes, ncclUint8, p, comm, stream) };
        self.check("ncclSend", rc)
    }

    /// `ncclRecv` of `bytes` bytes (as `ncclUint8`).
    ///
    /// # Safety
    /// `buf` is device memory writable for `bytes` bytes until the operation completes
    /// on `stream`; `comm` and `stream` are live.
    pub unsafe fn recv(
        &self,
        buf: *mut c_void,
        bytes: usize,
        peer: usize,
        comm: NcclComm,
        stream: Stream,
    ) -> Result<()> {
        let p = c_int::try_from(peer)
            .map_err(|_| RcclError::Invalid(format!("peer {peer} does not fit an int")))?;
        // SAFETY: per the contract.
        let rc = unsafe { (self.recv)(buf, bytes, ncclUint8, p, comm, stream) };
        self.check("ncclRecv", rc)
    }

    /// The library's own all-to-all of `bytes_per_peer` bytes (as `ncclUint8`), for
    /// reference checks.
    ///
    /// # Errors
    /// [`RcclError::Invalid`] when the library has none; the library's error.
    ///
    /// # Safety
    /// `send` / `recv` are device memory of `bytes_per_peer * nranks` bytes; `comm`
    /// and `stream` are live.
    pub unsafe fn all_to_all(
        &self,
        send: *const c_void,
        recv: *mut c_void,
        bytes_per_peer: usize,
        comm: NcclComm,
        stream: Stream,
    ) -> Result<()> {
        let Some((f, name)) = self.all_to_all else {
            return Err(RcclError::Invalid(format!(
                "{} (NCCL {}) has no all-to-all (ncclAllToAll: RCCL; ncclAlltoAll: NCCL >= 2.28)",
                self.path, self.version
            )));
        };
        // SAFETY: per the contract.
        let rc = unsafe { f(send, recv, bytes_per_peer, ncclUint8, comm, stream) };
        self.check(name, rc)
    }

    /// RCCL's `ncclAllToAllv`, counts and displacements in bytes.
    ///
    /// # Errors
    /// [`RcclError::Invalid`] when the library has none; the library's error.
    ///
    /// # Safety
    /// The arrays hold one entry per rank; the buffers are device memory covering what
    /// they reach; `comm` and `stream` are live.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn all_to_all_v(
        &self,
        send: *const c_void,
        send_counts: *const usize,
        send_displs: *const usize,
        recv: *mut c_void,
        recv_counts: *const usize,
        recv_displs: *const usize,
        comm: NcclComm,
        stream: Stream,
    ) -> Result<()> {
        let Some(f) = self.all_to_all_v else {
            return Err(RcclError::Invalid(format!(
                "{} has no ncclAllToAllv (RCCL only)",
                self.path
            )));
        };
        // SAFETY: per the contract.
        let rc = unsafe {
            f(
                send,
                send_counts,
                send_displs,
                recv,
                recv_counts,
                recv_displs,
                ncclUint8,
                comm,
                stream,
            )
        };
        self.check("ncclAllToAllv", rc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_codes_decode_both_formats() {
        assert_eq!(NcclVersion::from_code(22803).to_string(), "2.28.3");
        assert_eq!(NcclVersion::from_code(21805).to_string(), "2.18.5");
        assert_eq!(NcclVersion::from_code(2708).to_string(), "2.7.8");
        assert!(NcclVersion::from_code(2604) < MIN_NCCL_VERSION);
        assert!(NcclVersion::from_code(2703) >= MIN_NCCL_VERSION);
    }

    #[test]
    fn unique_ids_round_trip_through_bytes() {
        let mut b = [0u8; NCCL_UNIQUE_ID_BYTES];
        for (i, x) in b.iter_mut().enumerate() {
            *x = (i * 7 + 200) as u8;
        }
        assert_eq!(NcclUniqueId::from_bytes(&b).to_bytes(), b);
    }
}
