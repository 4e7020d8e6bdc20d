//! What the `halo launch` tests share: running the launcher, signals, rank pids,
//! labelled output, and the emulated hosts' checks (namespaces left, veth counters).
#![allow(dead_code, unused_macros)] // each test file uses a part

use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

pub(crate) const HALO: &str = env!("CARGO_BIN_EXE_halo");

/// A finished launcher run.
#[derive(Debug)]
pub(crate) struct Run {
    pub(crate) pid: u32,
    pub(crate) status: ExitStatus,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
    pub(crate) elapsed: Duration,
}

impl Run {
    pub(crate) fn code(&self) -> Option<i32> {
        self.status.code()
    }

    #[track_caller]
    pub(crate) fn assert_ok(&self) {
        assert!(
            self.status.success(),
            "halo launch failed: {:?}\nstdout:\n{}\nstderr:\n{}",
            self.status,
            self.stdout,
            self.stderr
        );
    }
}

/// A fresh directory `target/tmp/launch/TEST`.
pub(crate) fn scratch(test: &str) -> PathBuf {
    halo_test_support::scratch(env!("CARGO_TARGET_TMPDIR"), "launch", test)
}

/// Starts `halo launch ARGS` with stdout and stderr going to files in `dir`.
pub(crate) fn start(dir: &Path, args: &[&str]) -> std::process::Child {
    let out = std::fs::File::create(dir.join("stdout")).unwrap();
    let err = std::fs::File::create(dir.join("stderr")).unwrap();
    Command::new(HALO)
        .arg("launch")
        .args(args)
        // These tests are about libfabric's shared memory (its regions in /dev/shm);
        // HALO's own shared-memory transport has its tests in shm.rs.
        .env("HALO_TRANSPORT", "fabric")
        .env_remove("HALO_DEBUG")
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .expect("start halo launch")
}

/// Waits for a launcher started by [`start`]; past `limit` it is interrupted
/// (SIGINT, so that it still tears down), then killed, and the test fails.
pub(crate) fn finish(
    dir: &Path,
    mut child: std::process::Child,
    started: Instant,
    limit: Duration,
) -> Run {
    let pid = child.id();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if started.elapsed() > limit {
            signal(pid, "INT");
            std::thread::sleep(Duration::from_secs(10));
            let _ = child.kill();
            let st = child.wait().unwrap();
            panic!(
                "halo launch (pid {pid}) ran past {limit:?} ({st:?})\nstdout:\n{}\nstderr:\n{}",
                std::fs::read_to_string(dir.join("stdout")).unwrap_or_default(),
                std::fs::read_to_string(dir.join("stderr")).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Run {
        pid,
        status,
        stdout: std::fs::read_to_string(dir.join("stdout")).unwrap(),
        stderr: std::fs::read_to_string(dir.join("stderr")).unwrap(),
        elapsed: started.elapsed(),
    }
}

pub(crate) fn launch(dir: &Path, args: &[&str]) -> Run {
    let started = Instant::now();
    let child = start(dir, args);
    finish(dir, child, started, Duration::from_secs(120))
}

/// Sends a signal to a process this test started, by pid.
pub(crate) fn signal(pid: u32, sig: &str) {
    use nix::sys::signal::Signal;
    let sig = match sig {
        "INT" => Signal::SIGINT,
        "TERM" => Signal::SIGTERM,
        "KILL" => Signal::SIGKILL,
        other => panic!("no signal {other}"),
    };
    let pid = i32::try_from(pid).expect("pid fits i32");
    assert!(pid > 1);
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig);
}

/// SIGKILL to rank processes this test started (by pid), before failing.
pub(crate) fn kill_all(pids: &[u32]) {
    for &p in pids {
        signal(p, "KILL");
    }
}

/// Whether a live (not zombie) process has this pid and runs `what`.
pub(crate) fn running(pid: u32, what: &str) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let live = stat
        .rfind(')')
        .and_then(|i| stat[i + 1..].split_whitespace().next())
        .is_some_and(|s| s != "Z" && s != "X");
    let cmdline = std::fs::read_to_string(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    live && cmdline.contains(what)
}

/// Live children of the process `pid` (from `/proc/*/stat`).
pub(crate) fn children_of(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(child) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        let fields: Vec<&str> = stat
            .rfind(')')
            .map(|i| stat[i + 1..].split_whitespace().collect())
            .unwrap_or_default();
        if fields.len() > 1 && fields[0] != "Z" && fields[1] == pid.to_string() {
            out.push(child);
        }
    }
    out.sort_unstable();
    out
}

/// Files in `/dev/shm` of the process `pid`: libfabric's shm regions `PID:N:N` and
/// HALO's bells `halo-bell-NS-PID-N-TAG`.
pub(crate) fn shm_files_of(pid: u32) -> Vec<String> {
    use halo::host::files::{Kind, Name};
    let region = format!("{pid}:");
    std::fs::read_dir("/dev/shm")
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| {
                    n.starts_with(&region)
                        || Name::parse(n).is_some_and(|b| b.kind == Kind::Bell && b.pid == pid)
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The record a launcher keeps in `/dev/shm` (`halo-launch-PID-START.pids`), if any.
pub(crate) fn launch_records_of(pid: u32) -> Vec<String> {
    let prefix = format!("halo-launch-{pid}-");
    std::fs::read_dir("/dev/shm")
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| n.starts_with(&prefix))
                .collect()
        })
        .unwrap_or_default()
}

/// Pids the ranks wrote to `dir/pids/RANK`.
pub(crate) fn rank_pids(dir: &Path) -> Vec<u32> {
    let mut v = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir.join("pids")) {
        for e in rd.flatten() {
            if let Ok(t) = std::fs::read_to_string(e.path())
                && let Ok(p) = t.trim().parse()
            {
                v.push(p);
            }
        }
    }
    v
}

/// Lines of `[R] text` output, as (R, text).
pub(crate) fn labelled(stdout: &str) -> Vec<(usize, String)> {
    stdout
        .lines()
        .map(|l| {
            let rest = l
                .strip_prefix('[')
                .unwrap_or_else(|| panic!("unlabelled line {l:?}"));
            let (r, text) = rest
                .split_once("] ")
                .unwrap_or_else(|| panic!("bad line {l:?}"));
            (r.parse().unwrap(), text.to_string())
        })
        .collect()
}

// ---------------------------------------------------------------------------
// Local launches
// ---------------------------------------------------------------------------

// ---------------------------------------------------------------------------

#[allow(unused_imports)] // not every launch test needs root
pub(crate) use halo_cli::launch::is_root;

macro_rules! need_emulation {
    () => {
        if let Some(why) = halo_cli::launch::emulation_unavailable() {
            halo_test_support::skip(&format!("emulated hosts unavailable: {why}"));
            return;
        }
    };
}

/// Namespaces of the launcher with this pid still listed by `ip netns list`.
pub(crate) fn leftover_namespaces(pid: u32) -> Vec<String> {
    let out = Command::new("ip").args(["netns", "list"]).output().unwrap();
    let prefix = format!("halo-{pid}-");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(&prefix))
        .map(str::to_string)
        .collect()
}

#[track_caller]
pub(crate) fn assert_torn_down(run: &Run) {
    let left = leftover_namespaces(run.pid);
    assert!(
        left.is_empty(),
        "namespaces left behind: {left:?}\n{}",
        run.stderr
    );
    assert!(!run.stderr.contains("teardown"), "{}", run.stderr);
}

pub(crate) fn stats(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

pub(crate) fn host_stat(v: &serde_json::Value, host: usize, key: &str) -> u64 {
    v["hosts"][host][key].as_u64().unwrap()
}

pub(crate) fn ip(args: &[&str]) -> String {
    let out = Command::new("ip").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

pub(crate) fn root_links() -> Vec<String> {
    ip(&["-o", "link", "show"])
        .lines()
        .filter_map(|l| l.split(':').nth(1))
        .map(|n| n.trim().split('@').next().unwrap().to_string())
        .collect()
}

/// Namespaces of this test process (library-level tests below run in one test
/// function, so nothing else of this process makes them meanwhile).
pub(crate) fn own_namespaces() -> Vec<String> {
    let me = format!("halo-{}-", std::process::id());
    ip(&["netns", "list"])
        .lines()
        .filter(|l| l.starts_with(&me))
        .map(str::to_string)
        .collect()
}
