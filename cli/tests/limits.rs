//! Up-front limits (docs/RELIABILITY.md, "Limits"): requests that cannot be served —
//! sizes beyond the machine's memory, counts that overflow, world sizes beyond
//! `halo::MAX_RANKS`, NaN and infinite numbers — end with exit status 2 and a message
//! naming the option and the figure needed, never with a panic, an abort, a wrapped
//! count or a table of zeros. Each command line below is the one of issue 11.

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const HALO: &str = env!("CARGO_BIN_EXE_halo");

/// Runs `halo ARGS` with `env` set, outside any launcher's environment, with a
/// deadline (a run that hangs fails the test instead of blocking it).
fn halo(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(HALO);
    cmd.args(args)
        .env_remove("HALO_DEBUG")
        .env_remove("HALO_TIMEOUT_MS")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for v in [
        "RANK",
        "WORLD_SIZE",
        "OMPI_COMM_WORLD_RANK",
        "PMI_RANK",
        "SLURM_PROCID",
        "LOCAL_WORLD_SIZE",
    ] {
        cmd.env_remove(v);
    }
    cmd.envs(env.iter().copied());
    let mut child = cmd.spawn().unwrap();
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > Duration::from_secs(60) {
            child.kill().unwrap();
            let out = child.wait_with_output().unwrap();
            panic!(
                "halo {args:?} ran past 60 s (an up-front refusal takes milliseconds)\nstderr:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// Asserts exit status 2, every needle in stderr, and no panic or abort.
#[track_caller]
fn refused(args: &[&str], env: &[(&str, &str)], needles: &[&str]) {
    let out = halo(args, env);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(2),
        "halo {args:?} {env:?}: {:?}\nstderr:\n{stderr}",
        out.status
    );
    assert!(
        !stderr.contains("panicked") && !stderr.contains("memory allocation"),
        "halo {args:?}: {stderr}"
    );
    for n in needles {
        assert!(stderr.contains(n), "halo {args:?}: no {n:?} in\n{stderr}");
    }
}

/// A job of one rank, as `halo launch -n 1` would describe it.
const ALONE: &[(&str, &str)] = &[("RANK", "0"), ("WORLD_SIZE", "1")];

#[test]
fn check_sizes_that_overflow_are_refused() {
    refused(
        &["check", "--algo", "flat", "--v-max", "18446744073709551615"],
        ALONE,
        &["--v-max 18446744073709551615", "needs more memory than"],
    );
    refused(
        &[
            "check",
            "--algo",
            "flat",
            "--counts",
            "18446744073709551615",
        ],
        ALONE,
        &["--counts 18446744073709551615", "needs more memory than"],
    );
    // Representable but more than this machine has: the figure in bytes and GiB.
    refused(
        &["check", "--algo", "flat", "--counts", "1,1099511627776"],
        ALONE,
        &[
            "--counts 1099511627776",
            "needs at least",
            "GiB (",
            "MemAvailable",
        ],
    );
}

#[test]
fn bench_sizes_and_rank_counts_beyond_memory_are_refused() {
    refused(
        &["bench", "-m", "1:1099511627776"],
        &[],
        &[
            "-m",
            "1099511627776 B on 16 in-process ranks",
            "needs at least 524288.0 GiB (562949953421312 bytes)",
            "MemAvailable",
        ],
    );
    refused(
        &["bench", "--topology", "flat:100000"],
        &[],
        &["--topology flat:100000: 100000 ranks", "at most 1024"],
    );
    refused(
        &["bench", "--topology", "flat:1000", "-m", "1:1048576"],
        &[],
        &["--topology flat:1000", "needs at least", "GiB"],
    );
}

#[test]
fn simulate_beyond_memory_and_nan_numbers_are_refused() {
    refused(
        &["simulate", "--topology", "frontier:100000"],
        &[],
        &[
            "simulating 800000 ranks",
            "--topology frontier:100000",
            "needs at least",
            "GiB",
        ],
    );
    for (flag, v) in [
        ("--skew", "NaN"),
        ("--skew", "inf"),
        ("--skew", "-1"),
        ("--nic-gap", "NaN"),
        ("--nic-gap", "inf"),
        ("--nic-gap", "-0.5"),
    ] {
        let arg = format!("{flag}={v}");
        refused(
            &["simulate", "--op", "alltoallv", "--sizes", "1K", &arg],
            &[],
            &[&format!("{flag} {v}"), "must be a number"],
        );
    }
}

#[test]
fn world_sizes_beyond_the_limit_are_refused_up_front() {
    refused(
        &["check"],
        &[
            ("RANK", "0"),
            ("WORLD_SIZE", "4294967296"),
            ("HALO_BOOTSTRAP_ADDR", "127.0.0.1:9"),
        ],
        &["WORLD_SIZE is 4294967296", "at most 1048576 ranks"],
    );
}

#[test]
fn launch_rank_counts_beyond_the_limit_are_refused() {
    refused(
        &["launch", "-n", "100000", "--", "true"],
        &[],
        &["-n 100000", "at most 1024 ranks"],
    );
}

#[test]
fn iteration_counts_that_overflow_or_are_zero_are_refused() {
    for flag in ["-i", "-x"] {
        refused(
            &["bench", "-m", "1:2", flag, "18446744073709551615"],
            &[],
            &[
                &format!("{flag} 18446744073709551615"),
                "at most 1000000000 iterations",
            ],
        );
    }
    refused(
        &["bench", "-m", "1:2", "-i", "0"],
        &[],
        &["-i 0", "at least 1 timed iteration"],
    );
}

#[test]
fn bench_reads_halo_timeout_ms_and_the_option_wins() {
    // The variable is read (a malformed value is an error naming it) ...
    refused(
        &["bench", "-m", "1:2", "-i", "1", "-x", "0"],
        &[("HALO_TIMEOUT_MS", "soon")],
        &["HALO_TIMEOUT_MS=\"soon\""],
    );
    // ... unless --timeout is given, which wins.
    let out = halo(
        &[
            "bench",
            "-m",
            "1:2",
            "-i",
            "1",
            "-x",
            "0",
            "--algo",
            "flat",
            "--timeout",
            "30",
        ],
        &[("HALO_TIMEOUT_MS", "soon")],
    );
    assert!(
        out.status.success(),
        "{:?}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}
