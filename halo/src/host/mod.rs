//! The host layer, at the bottom of the library: what HALO needs of the machine it
//! runs on, in one place, for the transports above it, the bootstrap, the launcher
//! (`halo launch`) and the tests.
//!
//! - [`futex`]: the doorbell — one futex word, rung by a peer and slept on by its
//!   owner, with the fence protocol that loses no wake-up; the futex system calls
//!   (and their `unsafe`) live only there.
//! - [`files`]: the files HALO shares between the ranks of a host in `/dev/shm`: the
//!   name grammar `halo-{shm,bell}-NS-PID-N-TAG` (made, parsed, checked), the private
//!   file rule (created mode 0600 with `O_EXCL | O_NOFOLLOW`, attached with
//!   `O_NOFOLLOW` only when a regular file of this user) and the sweep of the files
//!   of ended processes of this user.
//! - [`proc`]: `/proc/PID/stat` (a process's state and start time): whether a
//!   watched process has ended, and this process as its peers can watch it.
//! - [`wait`]: the wait policy (spin, then yield, then sleep) each transport
//!   configures with its own numbers.
//! - [`CACHE_LINE`].
//!
//! It uses only the standard library and `libc` and returns `std::io` errors: the
//! error types of the layers above are theirs.

pub mod files;
pub mod futex;
pub mod proc;
pub mod wait;

/// Bytes of a cache line: what shared words are aligned and padded to, so that words
/// written by different ranks never share one.
pub const CACHE_LINE: usize = 64;
