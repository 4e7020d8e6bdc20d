//! The C ABI of HALO: `libhalo.so` / `libhalo.a` and `ffi/include/halo.h`.
//!
//! The API has NCCL's (and RCCL's) shape, so that a program written against NCCL
//! swaps `ncclX` for `haloX`: a unique id made by one rank and passed to the others,
//! `haloCommInitRank`, collectives that take a count in elements, a data type, the
//! communicator and a stream, and results that keep NCCL's numbering
//! ([`haloResult`]). The header is generated from this crate by cbindgen
//! (`ffi/cbindgen.toml`); the doc comments here are the header's documentation.
//!
//! How the boundary is kept safe:
//!
//! - **Panics** never cross it: every exported function runs inside one boundary
//!   (`boundary` module) that turns a panic into `haloInternalError` (or NULL / 0 for
//!   the functions that return a pointer or a number) with the panic's message as the
//!   last error.
//! - **Enums from C are integers** (`haloDataType_t`, `haloRedOp_t`, ... are
//!   `int32_t`): a value outside the enum is an error, never undefined behaviour.
//! - **Handles**: a `haloComm_t` is an `Arc` turned into a pointer (`handle` module).
//!   Every call holds a reference for its duration, so `haloCommAbort` from another
//!   thread frees the communicator only once the call it interrupts has returned.
//! - **Arguments** are checked before anything moves: NULL pointers with a non-zero
//!   count, counts whose byte size overflows, in-place calls, ranks out of range,
//!   unknown data types, a configuration not set with `HALO_CONFIG_INITIALIZER`.
//!   Outputs are written last, and only on success.
//! - **Errors** carry a message: `haloGetLastError(comm)` (per communicator) and
//!   `haloGetLastError(NULL)` (per thread).
//!
//! `unsafe` lives only here and in the `ffi/` crates; every block says why it holds.

#![allow(non_camel_case_types, non_snake_case, non_upper_case_globals)]

// cbindgen writes the items in the order it reads the modules: constants and types,
// then communicators, then collectives. (Blank lines keep rustfmt from sorting them.)
mod types;

mod error;

mod handle;

mod comm;

mod args;

mod collectives;

mod rooted;

// The MoE dispatcher (issue 29): haloMoeHandleCreate, haloMoeDispatch, haloMoeCombine.
mod moe;

mod requests;

mod boundary;

// The device path (issue 17): haloAllToAll / haloAllToAllv with a stream.
mod device;

pub use collectives::*;
pub use comm::*;
pub use error::*;
pub use handle::{haloComm, haloComm_t};
pub use moe::*;
pub use requests::*;
pub use rooted::*;
pub use types::*;
