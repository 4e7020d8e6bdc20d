//! Nothing left behind: what ranks and launchers that died leave, and its removal.
//!
//! - **Shared memory of dead ranks.** A rank that dies without closing libfabric
//!   (SIGKILL, `--timeout`, Ctrl-C) leaves the 16 MiB region of the shm provider,
//!   `/dev/shm/<pid>:<n>:<n>`, HALO's doorbell `/dev/shm/halo-bell-<ns>-<pid>-<n>-<tag>`,
//!   and, when the job dies before every rank of a host mapped it, a segment file of
//!   HALO's shared-memory transport `/dev/shm/halo-shm-<ns>-<pid>-<n>-<tag>` (every rank
//!   makes one during set-up; the lowest rank of each host keeps its own as the
//!   host's segment).
//!   The launcher removes those of every process it started, by pid, once the process
//!   is reaped ([`remove_shm_of`]).
//! - **A launcher that died** (SIGKILL, OOM killer) cannot do that. Each launcher
//!   therefore keeps a record, `/dev/shm/halo-launch-<pid>-<start>-<tag>.pids` (its pid
//!   and start time, then one `pid start` line per process it started and one
//!   `scratch <dir>` line per scratch directory it made), removed when it ends; created
//!   private (mode 0600, `O_EXCL | O_NOFOLLOW`, 64 random bits in the name) and written
//!   through that one descriptor. Every launch first reclaims ([`reclaim`]) the records
//!   of launchers that are no longer alive — the pid runs no process, or runs one with
//!   another start time (a reused pid) — reading only records that are regular files of
//!   this user, and removes the shared memory of their ranks that are gone, the scratch
//!   directories `$TMPDIR/halo-<pid>-<start>-<n>-<tag>` the record names (directories
//!   of this user, not links), and, as root, their emulated hosts: the namespaces
//!   `halo-<pid>-<start>-<n>-{h<i>,sw}` (deleting the switch namespace destroys the
//!   bridge and the veths), after killing what still runs inside them.
//! - The ranks themselves get a parent-death signal (see `procs`), so that a launcher
//!   killed with SIGKILL does not leave them running.
//!
//! Only files and namespaces whose names carry the pid of a launcher or rank found dead
//! are touched, files and directories only when owned by this user (checked without
//! following a link), scratch directories only when a record of this user names them.

use super::procs::start_time;
use halo::host::files::Name;
use std::io::Write as _;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

// Where the records and the regions live.
use halo::host::files::SHM_DIR as SHM;

/// A process named by pid and start time (clock ticks since boot): unlike the pid
/// alone, never names two processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ProcessId {
    pub(crate) pid: i32,
    pub(crate) start: u64,
}

impl ProcessId {
    /// This process.
    pub(crate) fn me() -> ProcessId {
        let pid = std::process::id() as i32;
        ProcessId {
            pid,
            start: start_time(pid).unwrap_or(0),
        }
    }

    /// The process with this pid, if one runs.
    pub(crate) fn of(pid: i32) -> Option<ProcessId> {
        start_time(pid).map(|start| ProcessId { pid, start })
    }

    /// Whether this very process (same pid, same start time) still runs.
    pub(crate) fn alive(&self) -> bool {
        start_time(self.pid) == Some(self.start)
    }

    /// `<pid>-<start>`: the part of every name this launcher gives.
    pub(crate) fn tag(&self) -> String {
        format!("{}-{}", self.pid, self.start)
    }
}

/// Whether no live process has this pid. A zombie is dead (it cannot create files,
/// and its pid cannot be reused until it is reaped); a live process with this pid is
/// either the one meant or one that reused the pid — either way its files stay.
fn pid_free(pid: i32) -> bool {
    start_time(pid).is_none()
}

/// Whether `name` is a shared-memory file of process `pid`: libfabric's shm region
/// `<pid>:<n>[:<n>...]`, HALO's bell `halo-bell-<ns>-<pid>-<n>-<tag>` or the segment
/// of HALO's shared-memory transport `halo-shm-<ns>-<pid>-<n>-<tag>` (made by any
/// rank; `<tag>`: 16 random hex digits; names without it are those of older builds;
/// [`halo::host::files::Name`]).
fn shm_of(name: &str, pid: i32) -> bool {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if let Some(rest) = name
        .strip_prefix(pid.to_string().as_str())
        .and_then(|r| r.strip_prefix(':'))
    {
        return rest.split(':').all(digits);
    }
    // HALO's own files: the grammar is `halo::host::files`.
    Name::parse(name).is_some_and(|n| i64::from(n.pid) == i64::from(pid))
}

/// Removes the shared-memory files of the processes `pids` that no longer run (no
/// live process has their pid: one that reused it may own files of the same name
/// now). Only files of this user. Returns the files removed.
pub(crate) fn remove_shm_of(pids: &[i32]) -> Vec<PathBuf> {
    remove_shm_in(Path::new(SHM), pids)
}

fn remove_shm_in(dir: &Path, pids: &[i32]) -> Vec<PathBuf> {
    let dead: Vec<i32> = pids
        .iter()
        .copied()
        .filter(|&p| p > 1 && pid_free(p))
        .collect();
    let mut removed = Vec::new();
    if dead.is_empty() {
        return removed;
    }
    let uid = nix::unistd::geteuid().as_raw();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return removed;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        if !dead.iter().any(|&p| shm_of(name, p)) {
            continue;
        }
        let Ok(meta) = e.metadata() else { continue };
        if meta.is_file() && meta.uid() == uid && std::fs::remove_file(e.path()).is_ok() {
            tracing::debug!(file = %e.path().display(), "removed a dead rank's shared memory");
            removed.push(e.path());
        }
    }
    removed
}

/// The most bytes of a record [`reclaim`] reads (a line is about 20 bytes a process).
const RECORD_MAX: u64 = 1 << 20;

/// 16 lowercase hex digits from the operating system's random source: the part of a
/// name in a world-writable directory that no other user can guess (and so cannot
/// take, or plant a link at, before the launcher creates it). The library's, for its
/// own files in `/dev/shm`.
pub(crate) use halo::host::files::random_tag;

/// This launcher's record of the processes it started and the scratch directories it
/// made; removed on drop. The file is created private to this user (mode 0600,
/// `O_CREAT | O_EXCL | O_NOFOLLOW`: a file or link planted at its name is never
/// followed or reused) and every line is appended through that one descriptor.
#[derive(Debug)]
pub(crate) struct Record {
    file: Option<(PathBuf, std::fs::File)>,
}

impl Record {
    /// Creates the record of this launcher, `/dev/shm/halo-launch-<pid>-<start>-<tag>.pids`
    /// (best effort: without `/dev/shm` there is none, and a later launch cannot clean
    /// up after this one if it is killed).
    pub(crate) fn create() -> Record {
        Self::create_in(Path::new(SHM))
    }

    fn create_in(dir: &Path) -> Record {
        let me = ProcessId::me();
        let made = random_tag().and_then(|tag| {
            let path = dir.join(format!("halo-launch-{}-{tag}.pids", me.tag()));
            let mut f = halo::host::files::create_private(&path)
                .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
            writeln!(f, "launcher {} {}", me.pid, me.start)?;
            Ok((path, f))
        });
        match made {
            Ok(file) => Record { file: Some(file) },
            Err(e) => {
                tracing::warn!(error = %e, "cannot write the launch record");
                Record { file: None }
            }
        }
    }

    /// Appends one line through the record's own descriptor.
    fn append(&self, line: &str) {
        let Some((path, f)) = &self.file else { return };
        // One write of the whole line (O_APPEND): a reader never sees half of it.
        if let Err(e) = (&*f).write_all(format!("{line}\n").as_bytes()) {
            tracing::warn!(path = %path.display(), error = %e, "cannot update the launch record");
        }
    }

    /// Adds a process this launcher started.
    pub(crate) fn add(&self, pid: i32) {
        let Some(p) = ProcessId::of(pid) else { return };
        self.append(&format!("{} {}", p.pid, p.start));
    }

    /// Notes a scratch directory this launcher is about to make in `$TMPDIR`, so that
    /// a later launch removes it if this one is killed ([`reclaim`]).
    pub(crate) fn add_scratch(&self, dir: &Path) {
        if let Some(d) = dir.to_str().filter(|d| !d.contains('\n')) {
            self.append(&format!("scratch {d}"));
        }
    }
}

impl Drop for Record {
    fn drop(&mut self) {
        if let Some((p, _)) = &self.file {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// The text of the record at `path` if it is a regular file of this user (opened
/// without following a link, checked on the open descriptor), at most [`RECORD_MAX`]
/// bytes of it.
fn read_own_record(path: &Path) -> Option<String> {
    use std::io::Read as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .ok()?;
    let meta = f.metadata().ok()?;
    if !meta.is_file() || meta.uid() != nix::unistd::geteuid().as_raw() {
        return None;
    }
    let mut text = String::new();
    f.take(RECORD_MAX).read_to_string(&mut text).ok()?;
    Some(text)
}

/// Removes a scratch directory that the record of the dead launcher `launcher` names:
/// only a directory directly in `$TMPDIR` named `halo-<pid>-<start>-...` after that
/// launcher, not a link, owned by this user. Whether it did.
fn remove_scratch(launcher: ProcessId, dir: &Path) -> bool {
    let named = dir.parent() == Some(std::env::temp_dir().as_path())
        && dir
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with(&format!("halo-{}-", launcher.tag())));
    let own = std::fs::symlink_metadata(dir)
        .is_ok_and(|m| m.is_dir() && m.uid() == nix::unistd::geteuid().as_raw());
    // remove_dir_all does not follow links inside the directory either.
    named && own && std::fs::remove_dir_all(dir).is_ok()
}

/// What [`reclaim`] removed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Reclaimed {
    /// Records of dead launchers.
    pub(crate) records: Vec<PathBuf>,
    /// Shared-memory files of their dead ranks.
    pub(crate) shm: Vec<PathBuf>,
    /// Their scratch directories.
    pub(crate) scratch: Vec<PathBuf>,
    /// Namespaces of their emulated hosts.
    pub(crate) namespaces: Vec<String>,
}

/// Parses `halo-launch-<pid>-<start>-<tag>.pids` (and the older
/// `halo-launch-<pid>-<start>.pids`).
fn record_name(name: &str) -> Option<ProcessId> {
    let (pid, rest) = name
        .strip_prefix("halo-launch-")?
        .strip_suffix(".pids")?
        .split_once('-')?;
    let start = match rest.split_once('-') {
        Some((start, tag))
            if tag.len() == 16
                && tag
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) =>
        {
            start
        }
        Some(_) => return None,
        None => rest,
    };
    Some(ProcessId {
        pid: pid.parse().ok()?,
        start: start.parse().ok()?,
    })
}

/// The launcher of an emulated-host namespace or scratch directory
/// `halo-<pid>-<start>-<n>[-...]`; `start` is `None` for the older
/// `halo-<pid>-<n>-{h<i>,sw}` names.
fn launcher_of(name: &str) -> Option<(i32, Option<u64>)> {
    let parts: Vec<&str> = name.strip_prefix("halo-")?.split('-').collect();
    let num = |s: &str| s.parse::<u64>().ok();
    let pid = parts.first()?.parse().ok()?;
    match parts.as_slice() {
        [_, start, n, host] if num(start).is_some() && num(n).is_some() && is_host(host) => {
            Some((pid, num(start)))
        }
        [_, start, n] if num(start).is_some() && num(n).is_some() => Some((pid, num(start))),
        [_, n, host] if num(n).is_some() && is_host(host) => Some((pid, None)),
        _ => None,
    }
}

fn is_host(s: &str) -> bool {
    s == "sw"
        || s.strip_prefix('h')
            .is_some_and(|i| !i.is_empty() && i.bytes().all(|b| b.is_ascii_digit()))
}

/// Whether the launcher `(pid, start)` of a name is gone.
fn launcher_dead(pid: i32, start: Option<u64>) -> bool {
    if pid == std::process::id() as i32 {
        return false;
    }
    match start {
        Some(start) => !ProcessId { pid, start }.alive(),
        None => pid_free(pid),
    }
}

/// Removes what launchers that died left (see the module notes). Best effort: what
/// cannot be removed is logged and left for the next launch. Only records that are
/// regular files of this user are read, and only what they name is touched.
pub(crate) fn reclaim() -> Reclaimed {
    let mut out = Reclaimed::default();
    if let Ok(entries) = std::fs::read_dir(SHM) {
        for e in entries.flatten() {
            let Some(launcher) = e.file_name().to_str().and_then(record_name) else {
                continue;
            };
            if launcher.alive() {
                continue;
            }
            let Some(text) = read_own_record(&e.path()) else {
                continue;
            };
            let ranks: Vec<ProcessId> = text
                .lines()
                .filter_map(|l| {
                    let (p, s) = l.split_once(' ')?;
                    Some(ProcessId {
                        pid: p.parse().ok()?,
                        start: s.parse().ok()?,
                    })
                })
                .filter(|p| *p != launcher)
                .collect();
            // A rank that still runs (it ignored the parent-death signal, or is being
            // killed now) keeps the record for a later launch.
            if ranks.iter().any(ProcessId::alive) {
                continue;
            }
            let pids: Vec<i32> = ranks.iter().map(|p| p.pid).collect();
            out.shm.extend(remove_shm_of(&pids));
            for dir in text.lines().filter_map(|l| l.strip_prefix("scratch ")) {
                let dir = PathBuf::from(dir);
                if remove_scratch(launcher, &dir) {
                    out.scratch.push(dir);
                }
            }
            if std::fs::remove_file(e.path()).is_ok() {
                out.records.push(e.path());
            }
        }
    }
    if super::is_root() {
        out.namespaces = reclaim_namespaces();
    }
    if out != Reclaimed::default() {
        tracing::info!(?out, "removed what launchers that died left behind");
    }
    out
}

/// Deletes the namespaces of dead launchers, after killing what runs inside them.
fn reclaim_namespaces() -> Vec<String> {
    let Ok(list) = super::run_tool("ip", &["netns", "list"]) else {
        return Vec::new();
    };
    let stale: Vec<String> = list
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| launcher_of(n).is_some_and(|(pid, start)| launcher_dead(pid, start)))
        .map(str::to_string)
        .collect();
    let mut removed = Vec::new();
    for ns in &stale {
        // Left-over processes of a dead launcher's job (normally none: the ranks got
        // the parent-death signal).
        if let Ok(pids) = super::run_tool("ip", &["netns", "pids", ns]) {
            for p in pids.split_whitespace().filter_map(|p| p.parse().ok()) {
                super::procs::signal_pid(p, nix::sys::signal::Signal::SIGKILL);
            }
        }
        match super::run_tool("ip", &["netns", "del", ns]) {
            Ok(_) => removed.push(ns.clone()),
            Err(e) => tracing::warn!(%ns, error = %e, "cannot delete a dead launcher's namespace"),
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(shm_of("1234:0:0", 1234));
        assert!(shm_of("1234:12", 1234));
        assert!(!shm_of("12345:0:0", 1234));
        assert!(!shm_of("1234:0:x", 1234));
        assert!(!shm_of("1234", 1234));
        assert!(shm_of("halo-bell-4026531836-1234-0", 1234));
        assert!(shm_of("halo-shm-4026531836-1234-0", 1234));
        assert!(shm_of("halo-shm-4026531836-1234-0-0123456789abcdef", 1234));
        assert!(shm_of("halo-bell-4026531836-1234-7-0123456789abcdef", 1234));
        assert!(!shm_of("halo-bell-4026531836-1234-7-0123456789abcde", 1234));
        assert!(!shm_of(
            "halo-bell-4026531836-1234-7-x123456789abcdef",
            1234
        ));
        assert!(!shm_of("halo-shm-4026531836-12345-0", 1234));
        assert!(!shm_of("halo-bell-4026531836-12345-0", 1234));
        assert!(!shm_of("halo-bell-1234-77-0", 1234));
        assert_eq!(
            record_name("halo-launch-77-123456.pids"),
            Some(ProcessId {
                pid: 77,
                start: 123456
            })
        );
        assert_eq!(record_name("halo-launch-77.pids"), None);
        assert_eq!(
            record_name("halo-launch-77-123456-0123456789abcdef.pids"),
            Some(ProcessId {
                pid: 77,
                start: 123456
            })
        );
        assert_eq!(record_name("halo-launch-77-123456-xyz.pids"), None);
        assert_eq!(launcher_of("halo-77-5000-0-h3"), Some((77, Some(5000))));
        assert_eq!(launcher_of("halo-77-5000-1-sw"), Some((77, Some(5000))));
        assert_eq!(launcher_of("halo-77-5000-1"), Some((77, Some(5000))));
        assert_eq!(launcher_of("halo-77-1-sw"), Some((77, None)));
        assert_eq!(launcher_of("halo-77-1-h0"), Some((77, None)));
        assert_eq!(launcher_of("halo-bell-1-2-3"), None);
        assert_eq!(launcher_of("other-77-1-h0"), None);
        assert_eq!(launcher_of("halo-77-5000-1-eth0"), None);
    }

    #[test]
    fn record_is_private_appended_in_place_and_links_are_not_read() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = std::env::temp_dir().join(format!("halo-record-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap();
        let rec = Record::create_in(&dir);
        let (path, _) = rec.file.as_ref().expect("a record");
        let path = path.clone();
        let name = path.file_name().unwrap().to_str().unwrap();
        assert_eq!(record_name(name), Some(ProcessId::me()), "{name}");
        let meta = std::fs::symlink_metadata(&path).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        rec.add(std::process::id() as i32);
        rec.add_scratch(Path::new("/tmp/halo-1-2-3-0123456789abcdef"));
        let text = read_own_record(&path).unwrap();
        let me = ProcessId::me();
        assert_eq!(
            text,
            format!(
                "launcher {0} {1}\n{0} {1}\nscratch /tmp/halo-1-2-3-0123456789abcdef\n",
                me.pid, me.start
            )
        );
        // A link to a record is not read.
        let link = dir.join("halo-launch-1-2.pids");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        assert_eq!(read_own_record(&link), None);
        drop(rec);
        assert!(!path.exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn scratch_is_removed_only_when_named_after_the_launcher_and_a_real_directory() {
        let me = ProcessId::me();
        let tmp = std::env::temp_dir();
        let dir = tmp.join(format!("halo-{}-7-0123456789abcdef", me.tag()));
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("hostfile"), b"x").unwrap();
        // Another launcher's name, a path outside $TMPDIR, a link: left alone.
        let other = ProcessId {
            pid: me.pid,
            start: me.start + 1,
        };
        assert!(!remove_scratch(other, &dir));
        assert!(!remove_scratch(me, Path::new("/etc")));
        let link = tmp.join(format!("halo-{}-8-0123456789abcdef", me.tag()));
        std::os::unix::fs::symlink(&dir, &link).unwrap();
        assert!(!remove_scratch(me, &link));
        assert!(dir.join("hostfile").exists());
        std::fs::remove_file(&link).unwrap();
        assert!(remove_scratch(me, &dir));
        assert!(!dir.exists());
    }

    #[test]
    fn me_is_alive_and_a_changed_start_time_is_not() {
        let me = ProcessId::me();
        assert!(me.alive());
        assert!(
            !ProcessId {
                start: me.start + 1,
                ..me
            }
            .alive()
        );
        assert!(!launcher_dead(me.pid, Some(me.start)));
    }

    #[test]
    fn shm_of_dead_processes_only_is_removed() {
        let dir = std::env::temp_dir().join(format!("halo-shm-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // A process that ran and was reaped: its pid is free (unless reused at once,
        // in which case nothing may be removed and the test says so below).
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id() as i32;
        child.wait().unwrap();
        let me = std::process::id() as i32;
        for name in [
            format!("{dead}:0:0"),
            format!("halo-bell-1-{dead}-0"),
            format!("{me}:0:0"),
            format!("{dead}0:0:0"),
        ] {
            std::fs::write(dir.join(name), b"x").unwrap();
        }
        let removed = remove_shm_in(&dir, &[dead, me]);
        let mut left: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        std::fs::remove_dir_all(&dir).unwrap();
        if !pid_free(dead) {
            return; // reused between wait and the check: nothing to conclude
        }
        assert_eq!(removed.len(), 2, "{removed:?}");
        let mut want = vec![format!("{dead}0:0:0"), format!("{me}:0:0")];
        want.sort();
        assert_eq!(left, want);
    }
}
