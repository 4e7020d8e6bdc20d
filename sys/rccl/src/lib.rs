//! NCCL / RCCL and the CUDA / HIP runtime for HALO's device path, loaded at run time.
//!
//! Nothing here is linked: [`Nccl::load`] and [`Runtime::load`] open the libraries with
//! `dlopen` (crate `libloading`), so HALO builds, links and runs on machines without a
//! GPU stack, and a program that never touches device memory never loads one. What is
//! loaded is the subset HALO needs:
//!
//! - **NCCL / RCCL** ([`Nccl`]): `ncclGetVersion`, `ncclGetUniqueId`, `ncclCommInitRank`,
//!   `ncclCommDestroy`, `ncclCommAbort`, `ncclCommGetAsyncError`, `ncclGetErrorString`,
//!   `ncclSend`, `ncclRecv`, `ncclGroupStart`, `ncclGroupEnd` (required), and the
//!   all-to-all where the library has one (optional): RCCL's `ncclAllToAll` /
//!   `ncclAllToAllv`, NCCL >= 2.28's `ncclAlltoAll`.
//! - **The runtime** ([`Runtime`], CUDA `libcudart` or HIP `libamdhip64`, the same calls
//!   under the prefix `cuda` / `hip`): device count and selection, malloc / free,
//!   synchronous and asynchronous copies, streams, events, pointer attributes, versions.
//!
//! # Where the libraries are looked for ([`Search`])
//! 1. an explicit path: `HALO_NCCL_LIBRARY` / `HALO_CUDART_LIBRARY` (when set, only it);
//! 2. the sonames through the system loader (`LD_LIBRARY_PATH`, the `ldconfig` cache):
//!    `librccl.so.1`, `libnccl.so.2` — and for the runtime `libamdhip64.so.6`,
//!    `libamdhip64.so.5`, `libcudart.so.13`, `libcudart.so.12`, `libcudart.so.11.0`;
//! 3. the wheels of a Python environment: the running interpreter's `sys.path`
//!    (`HALO_PYTHON_SITE`, which HALO's Python package sets), `PYTHONPATH`, the
//!    `site-packages` / `dist-packages` under `VIRTUAL_ENV`, `CONDA_PREFIX`, the running
//!    program's prefix, `~/.local`, `/usr/local` and `/usr`:
//!    `nvidia/nccl/lib/libnccl.so.2`, `nvidia/cu13/lib/libcudart.so.13` (CUDA 13 wheels,
//!    torch 2.15), `nvidia/cuda_runtime/lib/libcudart.so.*` (CUDA 12 and 11), and
//!    torch's ROCm wheels' `torch/lib/librccl.so*` and `torch/lib/libamdhip64.so*`;
//! 4. the usual install prefixes (`/opt/rocm/lib`, `/usr/local/cuda/lib64`) and the
//!    unversioned names (`librccl.so`, `libnccl.so`, `libamdhip64.so`, `libcudart.so`).
//!
//! When none loads, the error is [`RcclError::Unavailable`], which names every place
//! tried and why each failed (the `dlerror` text). A library that loads but lacks a
//! required symbol, or is older than [`MIN_NCCL_VERSION`], is an error too; a missing
//! optional symbol is `None`.
//!
//! Every call into the libraries is an `unsafe fn` (they take raw device pointers and
//! handles) returning `Result`: a non-zero result code becomes [`RcclError::Nccl`] or
//! [`RcclError::Runtime`] with the library's own description.

mod error;
mod nccl;
mod runtime;
mod search;

pub use error::{RcclError, Result, Tried};
pub use nccl::{
    MIN_NCCL_VERSION, NCCL_UNIQUE_ID_BYTES, Nccl, NcclComm, NcclUniqueId, NcclVersion, ncclUint8,
};
pub use runtime::{MemcpyKind, MemoryKind, Runtime, RuntimeFlavor, RuntimeVersion};
pub use search::{
    NCCL_ENV, PYTHON_SITE_ENV, RUNTIME_ENV, Search, candidates_nccl, candidates_runtime,
};

/// An opaque device stream (`cudaStream_t`, `hipStream_t`); NULL is the default stream.
pub type Stream = *mut std::ffi::c_void;

/// An opaque device event (`cudaEvent_t`, `hipEvent_t`).
pub type Event = *mut std::ffi::c_void;
