//! Up-front limits: what a command line may ask for, refused before anything is
//! allocated or started, with the figure that would be needed (docs/RELIABILITY.md,
//! "Limits").
//!
//! - Memory: a command that allocates buffers from its options (`halo bench`,
//!   `halo check`, `halo simulate`) computes a lower bound of what they need and
//!   refuses when it exceeds `MemAvailable` of `/proc/meminfo` (or cannot be
//!   represented at all).
//! - Counts: iterations ([`MAX_ITERATIONS`]), rounds ([`MAX_ROUNDS`]), in-process ranks ([`MAX_THREAD_RANKS`]),
//!   ranks of one `halo launch` ([`MAX_LAUNCH_RANKS`] and `RLIMIT_NPROC`), world size
//!   ([`halo::MAX_RANKS`]).

/// Most timed or warm-up iterations per size of `halo bench` (`-i`, `-x`): 10^9.
pub const MAX_ITERATIONS: usize = 1_000_000_000;

/// Most rounds per size of `halo bench --rounds`: 10,000 (each rank keeps every
/// round's figure of every implementation and size until it takes their median).
pub const MAX_ROUNDS: usize = 10_000;

/// Most ranks of an in-process `halo bench` (one thread each): 1,024.
pub const MAX_THREAD_RANKS: usize = 1024;

/// Most ranks one `halo launch` starts on this machine (each is a process with its own
/// endpoints and a shared-memory region of libfabric's shm provider): 1,024, and never
/// more than the soft `RLIMIT_NPROC`.
pub const MAX_LAUNCH_RANKS: usize = 1024;

/// `MemAvailable` of `/proc/meminfo` in bytes, if it can be read.
pub fn mem_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// `12.5 GiB (13421772800 bytes)`.
pub fn fmt_memory(bytes: u128) -> String {
    format!(
        "{:.1} GiB ({bytes} bytes)",
        bytes as f64 / (1u64 << 30) as f64
    )
}

/// Refuses `need` bytes (`None`: more than can be counted) when more than this
/// machine has available; `what` says what asked for it (`-m 1:1T on 16 ranks`).
///
/// # Errors
/// A message naming `what`, the memory needed and the memory available.
pub fn check_memory(what: &str, need: Option<u128>) -> Result<(), String> {
    let Some(need) = need.filter(|&n| n <= isize::MAX as u128) else {
        return Err(format!(
            "{what} needs more memory than this machine can address (over {})",
            fmt_memory(isize::MAX as u128)
        ));
    };
    match mem_available() {
        Some(avail) if need > u128::from(avail) => Err(format!(
            "{what} needs at least {} of memory, but only {} is available \
             (MemAvailable in /proc/meminfo)",
            fmt_memory(need),
            fmt_memory(u128::from(avail))
        )),
        _ => Ok(()),
    }
}

/// The soft `RLIMIT_NPROC` (processes of this user), `None` when unlimited or unknown.
pub fn nproc_limit() -> Option<u64> {
    use nix::sys::resource::{RLIM_INFINITY, Resource, getrlimit};
    getrlimit(Resource::RLIMIT_NPROC)
        .ok()
        .map(|(soft, _)| soft)
        .filter(|&s| s != RLIM_INFINITY)
}

/// Refuses more than [`MAX_LAUNCH_RANKS`] ranks, or more than `RLIMIT_NPROC` allows.
///
/// # Errors
/// A message naming `-n`, the limit and which one it is.
pub fn check_launch_ranks(ranks: usize) -> Result<(), String> {
    if let Some(limit) = nproc_limit()
        && ranks as u64 > limit
        && (limit as usize) < MAX_LAUNCH_RANKS
    {
        return Err(format!(
            "-n {ranks}: this user may run at most {limit} processes (RLIMIT_NPROC, `ulimit -u`)"
        ));
    }
    if ranks > MAX_LAUNCH_RANKS {
        return Err(format!(
            "-n {ranks}: halo launch starts at most {MAX_LAUNCH_RANKS} ranks on one machine \
             (a fixed limit: each rank is a process with its own endpoints and a 16 MiB \
             shared-memory region)"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_checks() {
        assert!(mem_available().is_some_and(|m| m > 0));
        assert!(check_memory("small", Some(1024)).is_ok());
        let e = check_memory("-m 1:1T", Some(1u128 << 60)).unwrap_err();
        assert!(e.contains("-m 1:1T needs at least 1073741824.0 GiB"), "{e}");
        assert!(e.contains("MemAvailable"), "{e}");
        let e = check_memory("--counts X", None).unwrap_err();
        assert!(e.contains("--counts X needs more memory than"), "{e}");
    }

    #[test]
    fn launch_ranks() {
        assert!(check_launch_ranks(4).is_ok());
        let e = check_launch_ranks(100_000).unwrap_err();
        assert!(e.contains("-n 100000"), "{e}");
    }
}
