//! The Rust programs in `examples/` (package `halo`), built and run as a user would:
//! the thread examples directly, the MoE dispatch as 4 processes under `halo launch`.
//! Each example checks its own bytes and exits non-zero on a wrong one; here the exit
//! status and the closing line of each are checked.

use std::path::{Path, PathBuf};
use std::process::Command;

const HALO: &str = env!("CARGO_BIN_EXE_halo");

/// `target/<profile>/examples/NAME`, building the `halo` package's examples when missing
/// (`cargo test --workspace --all-targets` has built them already).
fn example(name: &str) -> PathBuf {
    let profile_dir = Path::new(HALO).parent().expect("target/<profile>");
    let exe = profile_dir.join("examples").join(name);
    if !exe.is_file() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.args(["build", "-p", "halo", "--examples"])
            .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."));
        if profile_dir.file_name().is_some_and(|n| n == "release") {
            cmd.arg("--release");
        }
        let status = cmd.status().expect("cargo runs");
        assert!(status.success(), "{cmd:?} failed");
    }
    assert!(exe.is_file(), "no example at {}", exe.display());
    exe
}

/// Runs `cmd` with a time limit; returns stdout, failing on a non-zero status.
fn run_ok(cmd: &mut Command) -> String {
    let out = cmd
        .env("HALO_TIMEOUT_MS", "30000")
        .output()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn all_to_all_on_threads() {
    let out = run_ok(&mut Command::new(example("all_to_all_threads")));
    assert!(
        out.contains("all_to_all: 8 ranks, 1024 u64 per peer, byte-exact"),
        "{out}"
    );
}

#[test]
fn split_into_sub_communicators() {
    let out = run_ok(&mut Command::new(example("split")));
    assert!(
        out.contains("split: 2 node communicators of 4 and 4 index communicators of 2, sums exact"),
        "{out}"
    );
}

#[test]
fn abort_from_a_watchdog_thread() {
    let out = run_ok(&mut Command::new(example("abort_watchdog")));
    assert_eq!(out.matches(": aborted after ").count(), 3, "{out}");
    assert!(out.contains("abort: 3 ranks aborted"), "{out}");
}

#[test]
fn moe_dispatch_as_processes_under_halo_launch() {
    let exe = example("moe_dispatch");
    let out = run_ok(
        Command::new(HALO)
            .args(["launch", "-n", "4", "--timeout", "120", "--"])
            .arg(&exe),
    );
    for r in 0..4 {
        assert!(
            out.contains(&format!(
                "rank {r}/4: 64 tokens dispatched to 8 experts and combined, byte-exact"
            )),
            "rank {r} missing:\n{out}"
        );
    }
}

#[test]
fn measured_auto_agrees_across_processes() {
    let exe = example("auto_select");
    let out = run_ok(
        Command::new(HALO)
            .args(["launch", "-n", "4", "--timeout", "120", "--"])
            .arg(&exe),
    );
    for r in 0..4 {
        for block in [16, 4096, 65536] {
            assert!(
                out.contains(&format!("rank {r}/4: {block} B per peer -> ")),
                "rank {r}, {block} B missing:\n{out}"
            );
        }
    }
    assert_eq!(out.matches("all ranks agree").count(), 12, "{out}");
    // The same choice printed by every rank, size by size.
    for block in [16, 4096, 65536] {
        let picks: Vec<&str> = out
            .lines()
            .filter(|l| l.contains(&format!(": {block} B per peer -> ")))
            .map(|l| l.split(" -> ").nth(1).unwrap().split(' ').next().unwrap())
            .collect();
        assert_eq!(picks.len(), 4, "{out}");
        assert!(picks.iter().all(|p| *p == picks[0]), "{block} B: {picks:?}");
    }
}

#[test]
fn measured_auto_all_to_all_v_agrees_across_processes() {
    let exe = example("auto_select_v");
    let out = run_ok(
        Command::new(HALO)
            .args(["launch", "-n", "4", "--timeout", "120", "--"])
            .arg(&exe),
    );
    // Mean blocks of the example's three scales on 4 ranks.
    let means: Vec<usize> = [1usize, 600, 8000]
        .iter()
        .map(|s| (0..16).map(|k| (k * 37 % 11) * s).sum::<usize>() / 16)
        .collect();
    for r in 0..4 {
        for m in &means {
            assert!(
                out.contains(&format!("rank {r}/4: all_to_all_v mean {m} B -> ")),
                "rank {r}, mean {m} B missing:\n{out}"
            );
        }
    }
    assert_eq!(out.matches("all ranks agree").count(), 12, "{out}");
    for m in &means {
        let picks: Vec<&str> = out
            .lines()
            .filter(|l| l.contains(&format!(" mean {m} B -> ")))
            .map(|l| l.split(" -> ").nth(1).unwrap().split(' ').next().unwrap())
            .collect();
        assert_eq!(picks.len(), 4, "{out}");
        assert!(
            picks.iter().all(|p| *p == picks[0]),
            "mean {m} B: {picks:?}"
        );
    }
}
