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

/// The fields of one `/proc/PID/stat` line that HALO reads: `pid (comm) state ppid pgrp
/// session tty tpgid flags minflt cminflt majflt cmajflt utime stime cutime cstime
/// priority nice threads itrealvalue starttime ...`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    /// The process id (field 1).
    pub pid: i32,
    /// Its state (field 3): `R`, `S`, `D`, `Z` (zombie), `X` (dead), ...
    pub state: u8,
    /// The parent's id (field 4).
    pub ppid: i32,
    /// The process group (field 5).
    pub pgrp: i32,
    /// The start time (field 22), in clock ticks after boot.
    pub start: u64,
}

impl Stat {
    /// Parses a stat line; the command name (field 2) is in parentheses and may hold
    /// anything, spaces and parentheses included. `None` when it is not one.
    pub fn parse(text: &str) -> Option<Stat> {
        let open = text.find(" (")?;
        let (_, rest) = text.rsplit_once(')')?;
        let mut fields = rest.split_whitespace();
        let state = fields.next()?.bytes().next()?;
        let ppid = fields.next()?.parse().ok()?;
        let pgrp = fields.next()?.parse().ok()?;
        let start = fields.nth(16)?.parse().ok()?;
        Some(Stat {
            pid: text[..open].trim().parse().ok()?,
            state,
            ppid,
            pgrp,
            start,
        })
    }

    /// Whether the process runs (is neither a zombie nor dead).
    pub fn live(&self) -> bool {
        !matches!(self.state, b'Z' | b'X' | b'x')
    }
}

/// State (field 3) and start time (field 22) of a process, from `/proc/PID/stat`.
pub fn proc_stat(path: &str) -> std::io::Result<(u8, u64)> {
    let s = std::fs::read_to_string(path)?;
    let st = Stat::parse(&s).ok_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::InvalidData, "unexpected stat format")
    })?;
    Ok((st.state, st.start))
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
