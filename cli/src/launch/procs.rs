//! The ranks' processes: start, forward output, watch, terminate.
//!
//! Each process is started in a process group of its own (its pid is the group id)
//! so that terminating it reaches whatever it started too; signals go only to the
//! groups of processes this launcher started, by id. The children's stdin is
//! `/dev/null`; their stdout and stderr are read line by line and written whole to
//! the launcher's stdout and stderr, optionally prefixed with the rank (`[3] `), so
//! lines of different ranks never mix.
//!
//! Every process started gets a parent-death signal (`PR_SET_PDEATHSIG`, set in the
//! child before exec): SIGKILL for ranks, SIGTERM for mpirun (which then terminates its
//! own ranks), so that a launcher killed with SIGKILL leaves nothing running. The
//! signal comes when the launcher's *thread* that started the process ends; `halo
//! launch` starts every process from its main thread, and library callers of
//! [`super::launch`] stay in the call until the job ends. When a started process is
//! reaped its shared-memory files are removed and it is listed in the launcher's
//! record meanwhile (see `leftovers`).

use super::leftovers::{Record, remove_shm_of};
use super::signals::Interrupt;
use nix::sys::signal::Signal;
use nix::unistd::Pid;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// How often the launcher looks at its children.
const POLL: Duration = Duration::from_millis(10);

/// Longest piece of output written at once when a line does not end.
const MAX_LINE: usize = 64 * 1024;

/// Sends `sig` to the process `pid` (never to a group, never to pid 0, 1 or below).
pub(crate) fn signal_pid(pid: i32, sig: Signal) {
    if pid > 1 {
        let _ = nix::sys::signal::kill(Pid::from_raw(pid), sig);
    }
}

/// Sends `sig` to the process group `pgid` (the group of a child started with
/// `process_group(0)`; never group 0 or 1).
fn signal_group(pgid: i32, sig: Signal) {
    if pgid > 1 {
        let _ = nix::sys::signal::killpg(Pid::from_raw(pgid), sig);
    }
}

/// The shell's number for how a process ended: its exit code, or 128 + the signal
/// that killed it.
pub(crate) fn status_code(status: ExitStatus) -> i32 {
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1)
}

/// How the watched processes ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ended {
    /// Every process exited with status 0.
    AllSucceeded,
    /// This process (index) failed first, with this status code (and the signal
    /// that ended it, if one did).
    Failed {
        index: usize,
        code: i32,
        signal: Option<i32>,
    },
    /// The timeout passed.
    TimedOut,
    /// The interrupt fired with this signal.
    Interrupted { signal: i32 },
}

struct Proc {
    child: Child,
    pgid: i32,
    status: Option<ExitStatus>,
}

/// The started processes. Dropping it kills (SIGKILL) and reaps whatever still runs.
pub(crate) struct Job {
    procs: Vec<Proc>,
    readers: Arc<AtomicUsize>,
    record: Record,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job")
            .field(
                "pids",
                &self.procs.iter().map(|p| p.pgid).collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

impl Job {
    pub(crate) fn new() -> Job {
        Job {
            procs: Vec::new(),
            readers: Arc::new(AtomicUsize::new(0)),
            record: Record::create(),
        }
    }

    /// The launcher's record of this job (`leftovers`).
    pub(crate) fn record(&self) -> &Record {
        &self.record
    }

    /// Starts `cmd` in its own process group, its output forwarded with `label`
    /// (`Some("[3] ")`) in front of each line; `death` is the signal it gets when the
    /// launcher dies.
    pub(crate) fn spawn(
        &mut self,
        mut cmd: Command,
        label: Option<String>,
        death: Signal,
    ) -> std::io::Result<()> {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        let launcher = nix::unistd::getpid();
        // SAFETY: the closure runs in the child between fork and exec. It makes only
        // the async-signal-safe system calls prctl(2) and getppid(2) and allocates
        // nothing (errors are built from raw OS codes).
        unsafe {
            cmd.pre_exec(move || {
                nix::sys::prctl::set_pdeathsig(death)
                    .map_err(|e| std::io::Error::from_raw_os_error(e as i32))?;
                // The launcher died between fork and prctl: the signal will not come.
                if nix::unistd::getppid() != launcher {
                    return Err(std::io::Error::from_raw_os_error(
                        nix::errno::Errno::ESRCH as i32,
                    ));
                }
                Ok(())
            });
        }
        let mut child = cmd.spawn()?;
        let pgid = i32::try_from(child.id()).unwrap_or(0);
        self.record.add(pgid);
        let out = child.stdout.take();
        let err = child.stderr.take();
        self.procs.push(Proc {
            child,
            pgid,
            status: None,
        });
        if let Some(out) = out {
            self.forward(out, label.clone(), false);
        }
        if let Some(err) = err {
            self.forward(err, label, true);
        }
        Ok(())
    }

    fn forward(&self, pipe: impl Read + Send + 'static, label: Option<String>, to_stderr: bool) {
        let active = Arc::clone(&self.readers);
        active.fetch_add(1, Ordering::SeqCst);
        let spawned = std::thread::Builder::new()
            .name("halo-launch-output".into())
            .spawn(move || {
                forward_lines(pipe, label.as_deref().unwrap_or(""), to_stderr);
                active.fetch_sub(1, Ordering::SeqCst);
            });
        if spawned.is_err() {
            self.readers.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Pids of the processes started.
    pub(crate) fn pids(&self) -> Vec<i32> {
        self.procs.iter().map(|p| p.pgid).collect()
    }

    /// Reaps whatever exited; returns the first failure seen in this pass (lowest index).
    fn poll(&mut self) -> Option<(usize, i32, Option<i32>)> {
        let mut failed = None;
        for (i, p) in self.procs.iter_mut().enumerate() {
            if p.status.is_some() {
                continue;
            }
            if let Ok(Some(st)) = p.child.try_wait() {
                p.status = Some(st);
                remove_shm_of(&[p.pgid]);
                tracing::debug!(index = i, pid = p.pgid, status = ?st, "process ended");
                if !st.success() && failed.is_none() {
                    failed = Some((i, status_code(st), st.signal()));
                }
            }
        }
        failed
    }

    fn all_done(&self) -> bool {
        self.procs.iter().all(|p| p.status.is_some())
    }

    /// Waits until every process succeeds, one fails, `deadline` passes or the
    /// interrupt fires — whichever comes first.
    pub(crate) fn watch(&mut self, deadline: Option<Instant>, interrupt: &Interrupt) -> Ended {
        loop {
            if let Some((index, code, signal)) = self.poll() {
                return Ended::Failed {
                    index,
                    code,
                    signal,
                };
            }
            if self.all_done() {
                return Ended::AllSucceeded;
            }
            if let Some(signal) = interrupt.pending() {
                return Ended::Interrupted { signal };
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Ended::TimedOut;
            }
            std::thread::sleep(POLL);
        }
    }

    /// Terminates the job: SIGTERM to every process group started, then SIGKILL
    /// after `grace` (at once if the interrupt fires again meanwhile) to whatever is
    /// left of those groups and of the processes descending from them — also those
    /// that moved to groups of their own (mpirun's ranks do) — then reaps. Groups of
    /// processes that already exited get the same treatment, so that nothing a rank
    /// left behind outlives the job.
    pub(crate) fn terminate(&mut self, grace: Duration, interrupt: &Interrupt) {
        let fired = interrupt.count();
        self.poll();
        for g in self.pids() {
            signal_group(g, Signal::SIGTERM);
        }
        let marked = self.strays(&snapshot());
        let deadline = Instant::now() + grace;
        loop {
            self.poll();
            let table = snapshot();
            let left = !self.strays(&table).is_empty() || marked.iter().any(|m| m.alive_in(&table));
            if (self.all_done() && !left) || Instant::now() >= deadline || interrupt.count() > fired
            {
                break;
            }
            std::thread::sleep(2 * POLL);
        }
        self.kill_and_reap(&marked);
    }

    /// Live processes of the groups started, and live descendants of the processes
    /// started that are not reaped yet (by pid and start time).
    fn strays(&self, table: &[ProcInfo]) -> Vec<ProcInfo> {
        let groups: Vec<i32> = self.pids();
        let mut out: Vec<ProcInfo> = table
            .iter()
            .filter(|p| p.live && groups.contains(&p.pgrp))
            .copied()
            .collect();
        let mut parents: Vec<i32> = self
            .procs
            .iter()
            .filter(|p| p.status.is_none())
            .map(|p| p.pgid)
            .collect();
        while let Some(parent) = parents.pop() {
            for p in table.iter().filter(|p| p.ppid == parent && p.pid > 1) {
                if !out.iter().any(|o| o.pid == p.pid) {
                    if p.live {
                        out.push(*p);
                    }
                    parents.push(p.pid);
                }
            }
        }
        out
    }

    /// SIGKILL to every group with live members, to `marked` processes that still
    /// run (same pid and start time) and to live descendants, then reaps (bounded).
    fn kill_and_reap(&mut self, marked: &[ProcInfo]) {
        self.poll();
        let table = snapshot();
        let mut victims = self.strays(&table);
        victims.extend(marked.iter().filter(|m| m.alive_in(&table)).copied());
        for v in &victims {
            signal_pid(v.pid, Signal::SIGKILL);
        }
        let stray_pids: Vec<i32> = victims.iter().map(|v| v.pid).collect();
        for p in &self.procs {
            if p.status.is_none() || group_alive(p.pgid) {
                signal_group(p.pgid, Signal::SIGKILL);
            }
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while !self.all_done() && Instant::now() < deadline {
            self.poll();
            std::thread::sleep(POLL);
        }
        // Descendants that were killed (reaped by now unless their parent lingers).
        remove_shm_of(&stray_pids);
    }

    /// Waits (at most `limit`) for the output of every process to be written out.
    pub(crate) fn drain_output(&self, limit: Duration) {
        let deadline = Instant::now() + limit;
        while self.readers.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
            std::thread::sleep(POLL);
        }
    }
}

/// One line of `/proc/PID/stat`: what the launcher needs to find its strays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ProcInfo {
    pid: i32,
    ppid: i32,
    pgrp: i32,
    /// Start time in clock ticks since boot: with the pid, names one process.
    start: u64,
    /// Not a zombie (an orphan's zombie waits for init, which may be slow to reap it).
    live: bool,
}

impl ProcInfo {
    /// One `/proc/PID/stat` line, read by the library's one reader
    /// ([`halo::host::proc::Stat`]).
    fn parse(stat: &str) -> Option<ProcInfo> {
        let st = halo::host::proc::Stat::parse(stat)?;
        Some(ProcInfo {
            pid: st.pid,
            ppid: st.ppid,
            pgrp: st.pgrp,
            start: st.start,
            live: st.state != b'Z' && st.state != b'X',
        })
    }

    /// Whether the same process (pid and start time) still runs.
    fn alive_in(&self, table: &[ProcInfo]) -> bool {
        table
            .iter()
            .any(|p| p.pid == self.pid && p.start == self.start && p.live)
    }
}

/// The start time of the live (not zombie) process `pid`, from `/proc/PID/stat`.
pub(crate) fn start_time(pid: i32) -> Option<u64> {
    if pid <= 0 {
        return None;
    }
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    ProcInfo::parse(&stat)
        .filter(|p| p.live && p.pid == pid)
        .map(|p| p.start)
}

/// Every process of the machine (of this pid namespace), from `/proc`.
fn snapshot() -> Vec<ProcInfo> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
        })
        .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
        .filter_map(|s| ProcInfo::parse(&s))
        .collect()
}

/// Whether the process group still has live members.
fn group_alive(pgid: i32) -> bool {
    pgid > 1
        && nix::sys::signal::killpg(Pid::from_raw(pgid), None).is_ok()
        && snapshot().iter().any(|p| p.pgrp == pgid && p.live)
}

impl Drop for Job {
    fn drop(&mut self) {
        if self.procs.iter().any(|p| p.status.is_none()) {
            self.kill_and_reap(&[]);
        }
    }
}

/// Copies `pipe` to the launcher's stdout or stderr, one whole line at a time, with
/// `label` in front. A last line without newline gets one; write errors (a closed
/// stdout) only stop the copying, not the reading, so the child never blocks.
fn forward_lines(pipe: impl Read, label: &str, to_stderr: bool) {
    let mut reader = BufReader::with_capacity(MAX_LINE, pipe);
    let mut line = Vec::with_capacity(256);
    let mut writable = true;
    let mut emit = |line: &mut Vec<u8>| {
        if line.last() != Some(&b'\n') {
            line.push(b'\n');
        }
        if writable {
            let mut whole = Vec::with_capacity(label.len() + line.len());
            whole.extend_from_slice(label.as_bytes());
            whole.extend_from_slice(line);
            let res = if to_stderr {
                std::io::stderr().lock().write_all(&whole)
            } else {
                let mut out = std::io::stdout().lock();
                out.write_all(&whole).and_then(|()| out.flush())
            };
            writable = res.is_ok();
        }
        line.clear();
    };
    loop {
        let buf = match reader.fill_buf() {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        if buf.is_empty() {
            break;
        }
        let (take, complete) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (i + 1, true),
            None => (buf.len(), false),
        };
        line.extend_from_slice(&buf[..take]);
        reader.consume(take);
        if complete || line.len() >= MAX_LINE {
            emit(&mut line);
        }
    }
    if !line.is_empty() {
        emit(&mut line);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines() {
        let tail = "0 -1 4194304 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 200";
        let p = ProcInfo::parse(&format!("12 (a) b) (c) S 10 13 13 {tail}")).unwrap();
        assert_eq!(
            p,
            ProcInfo {
                pid: 12,
                ppid: 10,
                pgrp: 13,
                start: 987654,
                live: true
            }
        );
        let z = ProcInfo::parse(&format!("12 (sleep) Z 1 12 12 {tail}")).unwrap();
        assert!(!z.live);
        assert!(ProcInfo::parse("garbage").is_none());
        let me = snapshot();
        let mine = i32::try_from(std::process::id()).unwrap();
        assert!(me.iter().any(|p| p.pid == mine && p.live));
    }

    #[test]
    fn status_codes() {
        assert_eq!(status_code(ExitStatus::from_raw(7 << 8)), 7);
        assert_eq!(status_code(ExitStatus::from_raw(9)), 137);
    }
}
