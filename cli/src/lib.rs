//! The tooling around the HALO library, behind the `halo` command-line tool.
//!
//! A training program depends on the `halo` crate alone; this crate is what the tool adds
//! on top of it, kept apart so that the library (and `libhalo.so`) never builds clap,
//! plotters or the launcher's system calls:
//!
//! - [`launch`]: start the ranks of a job as processes, locally or on emulated hosts
//!   (network namespaces), optionally through Open MPI's `mpirun` (`halo launch`).
//! - [`bench`]: the OSU-style benchmarks, HALO against MPI in the same run (`halo bench`).
//! - [`check`]: every algorithm byte-exact as one rank of a job (`halo check`).
//! - [`calibrate`]: per-level latency and bandwidth fitted into a topology file
//!   (`halo calibrate`).
//! - [`limits`]: the up-front limits of what a command line may ask for.
//! - [`commands`]: the tool's command line (clap) and each command's `run`; the
//!   binary is `main` over [`commands::run`], and the fuzz targets parse with it.
//! - [`plot`]: the SVG/PNG plots of `halo bench --compare` and `halo simulate --plot`.
//!
//! Errors are the library's [`halo::Error`]: every failure here is one the library
//! reports or an invalid argument, so the tool keeps the C result codes' meaning.

pub mod bench;
pub mod calibrate;
pub mod check;
pub mod commands;
pub mod launch;
pub mod limits;
pub mod plot;
pub mod progress;
