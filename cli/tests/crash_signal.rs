//! Crashes keep their signal (issue 11, defect 3). libfabric here links Intel's PSM
//! (`libpsm_infinipath` -> `libinfinipath`), whose load-time constructor installs a
//! handler for SIGSEGV, SIGBUS, SIGILL, SIGABRT, SIGINT and SIGTERM that prints a
//! backtrace, writes `NAME.80s-PID,HOST.btr` into the working directory and exits with
//! status 1: a crash looked like an ordinary failure.
//!
//! The rank program is this test binary (`crash_rank`, ignored when run on its own):
//! it opens the fabric transport (a one-rank communicator, or the job `halo launch`
//! describes), then raises SIGSEGV. Checked: it ends by signal 11, no `.btr` file
//! appears in its working directory, and `halo launch` names the signal.

use std::os::unix::process::ExitStatusExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

const HALO: &str = env!("CARGO_BIN_EXE_halo");

fn scratch(test: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("crash_signal")
        .join(test);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The `.btr` files in `dir`.
fn btr_files(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".btr"))
        .collect()
}

/// The rank program. `CRASH_SIGNAL_MODE`: `solo` (a one-rank communicator over the
/// fabric transport, then SIGSEGV), `job` (the job `halo launch` describes; rank
/// `CRASH_SIGNAL_RANK` raises SIGSEGV after a barrier, the others wait for the end).
#[test]
#[ignore = "the rank program of the tests below, started by them"]
fn crash_rank() {
    let mode = std::env::var("CRASH_SIGNAL_MODE").unwrap_or_default();
    let comm = match mode.as_str() {
        "solo" => {
            let id = halo::UniqueId::new_on("127.0.0.1:0".parse().unwrap()).unwrap();
            halo::Communicator::init_rank(&id, 1, 0).expect("init")
        }
        "job" => {
            let mut c = halo::Communicator::init_from_env().expect("init");
            c.barrier().expect("barrier");
            c
        }
        other => panic!("CRASH_SIGNAL_MODE={other:?}"),
    };
    let crash: usize = std::env::var("CRASH_SIGNAL_RANK")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    if comm.rank() == crash {
        eprintln!("rank {} raises SIGSEGV", comm.rank());
        // Rust's runtime has a SIGSEGV handler (for stack overflows) where the
        // disposition was the default at start-up: it restores the default and
        // returns, so a raised (not faulted) SIGSEGV needs a second raise.
        for _ in 0..2 {
            nix::sys::signal::raise(nix::sys::signal::Signal::SIGSEGV).unwrap();
        }
        unreachable!("SIGSEGV returned twice");
    }
    // The others wait to be terminated by the launcher (SIGTERM).
    std::thread::sleep(Duration::from_secs(60));
}

fn rank_program(dir: &Path, launcher: Option<&[&str]>, env: &[(&str, &str)]) -> Output {
    let exe = std::env::current_exe().unwrap();
    let mut cmd = match launcher {
        Some(args) => {
            let mut c = Command::new(HALO);
            c.args(args).arg("--").arg(&exe);
            c
        }
        None => Command::new(&exe),
    };
    cmd.args(["--exact", "crash_rank", "--ignored", "--nocapture"])
        .current_dir(dir)
        .env_remove("IPATH_NO_BACKTRACE")
        .env_remove("HALO_DEBUG")
        .envs(env.iter().copied())
        .stdin(Stdio::null());
    cmd.output().expect("start the rank program")
}

/// A process that opened the fabric transport and then segfaults ends by SIGSEGV —
/// without `IPATH_NO_BACKTRACE` in its environment: HALO removes PSM's handler itself.
#[test]
fn a_segfault_after_fabric_init_ends_by_sigsegv_and_writes_no_file() {
    let dir = scratch("solo");
    let out = rank_program(&dir, None, &[("CRASH_SIGNAL_MODE", "solo")]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.signal(),
        Some(11),
        "expected death by SIGSEGV, got {:?}\n{stderr}",
        out.status
    );
    assert!(
        btr_files(&dir).is_empty(),
        "backtrace files: {:?}",
        btr_files(&dir)
    );
    assert!(!stderr.contains("Backtrace"), "{stderr}");
}

/// Under `halo launch`: the job's exit status is 139 and the launcher says that rank 1
/// was killed by signal 11 (SIGSEGV); no file in the ranks' working directory.
#[test]
fn halo_launch_names_the_signal_of_a_segfaulting_rank() {
    let dir = scratch("launch");
    let out = rank_program(
        &dir,
        Some(&["launch", "-n", "2", "--timeout", "60"]),
        &[("CRASH_SIGNAL_MODE", "job"), ("CRASH_SIGNAL_RANK", "1")],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(139), "{:?}\n{stderr}", out.status);
    assert!(
        stderr.contains("rank 1") && stderr.contains("signal 11 (SIGSEGV)"),
        "{stderr}"
    );
    assert!(
        btr_files(&dir).is_empty(),
        "backtrace files: {:?}",
        btr_files(&dir)
    );
    assert!(!stderr.contains("Backtrace"), "{stderr}");
}
