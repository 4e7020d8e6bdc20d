//! Processes of this host, from `/proc`: the one reader of `/proc/PID/stat` (a
//! process's state and start time); what one rank publishes of its process and how a
//! peer notices that it ended (gone, a zombie, or its id reused); when this process
//! started. Used by every transport that waits on a peer of this host (the libfabric
//! transport's watchdog and sessions, HALO's shared-memory rings) and by the bootstrap.

use std::time::Duration;

/// A process on this host: its id and its start time (clock ticks after boot, from
/// `/proc/PID/stat`), which tells a reused process id apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Proc {
    /// The process id.
    pub pid: u32,
    /// Its start time, in clock ticks after boot.
    pub start: u64,
}

/// State (field 3) and start time (field 22) of a process, from `/proc/PID/stat`.
pub fn proc_stat(path: &str) -> std::io::Result<(u8, u64)> {
    let s = std::fs::read_to_string(path)?;
    let bad = || std::io::Error::new(std::io::ErrorKind::InvalidData, "unexpected stat format");
    // The command name (field 2) is in parentheses and may hold anything.
    let (_, rest) = s.rsplit_once(')').ok_or_else(bad)?;
    let mut fields = rest.split_whitespace();
    let state = fields
        .next()
        .and_then(|f| f.bytes().next())
        .ok_or_else(bad)?;
    let start = fields
        .nth(18)
        .and_then(|f| f.parse::<u64>().ok())
        .ok_or_else(bad)?;
    Ok((state, start))
}

/// This process as peers on the same host can watch it: its PID namespace and
/// [`Proc`]. `None` when `/proc` does not show this process under its own id (a
/// `/proc` of another PID namespace), so that nobody watches the wrong process.
pub fn this_process() -> Option<(String, Proc)> {
    let ns = std::fs::read_link("/proc/self/ns/pid").ok()?;
    let pid = std::process::id();
    let (_, start) = proc_stat("/proc/self/stat").ok()?;
    let (_, seen) = proc_stat(&format!("/proc/{pid}/stat")).ok()?;
    (seen == start).then(|| (ns.to_string_lossy().into_owned(), Proc { pid, start }))
}

/// Whether a watched process has ended: gone, a zombie, or its id taken by another
/// process. `false` when that cannot be told.
pub fn has_ended(p: Proc) -> bool {
    match proc_stat(&format!("/proc/{}/stat", p.pid)) {
        Ok((state, start)) => start != p.start || matches!(state, b'Z' | b'X' | b'x'),
        Err(e) => e.kind() == std::io::ErrorKind::NotFound,
    }
}

/// When this process started, from `/proc/self/stat` and the boot time in `/proc/stat`
/// (10 ms resolution).
pub fn process_start() -> Option<std::time::SystemTime> {
    let (_, ticks) = proc_stat("/proc/self/stat").ok()?;
    let btime: u64 = std::fs::read_to_string("/proc/stat")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    // USER_HZ is 100 on every Linux that reports /proc times this way.
    Some(
        std::time::UNIX_EPOCH
            + Duration::from_secs(btime)
            + Duration::from_millis(ticks.saturating_mul(10)),
    )
}
