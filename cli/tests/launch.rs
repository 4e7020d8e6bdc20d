//! `halo launch`, run as a program: real processes, and — as root, where network
//! namespaces work — real emulated hosts (namespaces, a bridge, shaped veths).
//!
//! The emulated-host tests skip with a printed reason when not root or when
//! namespaces cannot be created; the MPI tests skip when `mpicc` is missing
//! (`scripts/deps.sh` installs Open MPI). Every emulated test checks that none of
//! its launch's namespaces is left afterwards.

#[macro_use]
mod launch_common;

use launch_common::*;
use std::process::Command;
use std::time::{Duration, Instant};

#[test]
fn local_every_rank_gets_its_environment() {
    let dir = scratch("local_env");
    let run = launch(
        &dir,
        &[
            "-n",
            "4",
            "--",
            "sh",
            "-c",
            "echo $RANK/$WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $GROUP_RANK $HALO_BOOTSTRAP_ADDR $MASTER_ADDR $MASTER_PORT $HALO_SECRET",
        ],
    );
    run.assert_ok();
    let mut lines = labelled(&run.stdout);
    lines.sort();
    assert_eq!(lines.len(), 4, "{}", run.stdout);
    let first: Vec<&str> = lines[0].1.split(' ').collect();
    let (ip, port) = first[4].split_once(':').unwrap();
    assert_eq!(ip, "127.0.0.1");
    let port: u16 = port.parse().unwrap();
    let secret = first[7];
    assert_eq!(secret.len(), 64);
    assert!(secret.bytes().all(|b| b.is_ascii_hexdigit()));
    for (r, (label, text)) in lines.iter().enumerate() {
        assert_eq!(*label, r);
        let f: Vec<&str> = text.split(' ').collect();
        assert_eq!(f[0], format!("{r}/4"));
        assert_eq!(f[1], r.to_string(), "LOCAL_RANK");
        assert_eq!(f[2], "4", "LOCAL_WORLD_SIZE");
        assert_eq!(f[3], "0", "GROUP_RANK");
        assert_eq!(f[4], format!("127.0.0.1:{port}"));
        assert_eq!(f[5], "127.0.0.1");
        assert_eq!(
            f[6],
            (port - 1).to_string(),
            "MASTER_PORT is the bootstrap port - 1"
        );
        assert_eq!(f[7], secret, "one secret per job");
    }
    // A second launch gets another secret.
    let again = launch(
        &dir,
        &[
            "-n",
            "1",
            "--no-prefix",
            "--",
            "sh",
            "-c",
            "echo $HALO_SECRET",
        ],
    );
    again.assert_ok();
    assert_ne!(again.stdout.trim(), secret);
}

#[test]
fn local_output_lines_stay_whole() {
    let dir = scratch("local_lines");
    let script = "i=0; while [ $i -lt 300 ]; do echo \"rank $RANK line $i xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\"; \
                  echo \"err $RANK $i\" >&2; i=$((i+1)); done; printf \"last $RANK\"";
    let run = launch(&dir, &["-n", "4", "--", "sh", "-c", script]);
    run.assert_ok();
    let lines = labelled(&run.stdout);
    assert_eq!(lines.len(), 4 * 301);
    for (r, text) in &lines {
        let ok = text == &format!("last {r}")
            || (text.starts_with(&format!("rank {r} line ")) && text.ends_with(&"x".repeat(48)));
        assert!(ok, "mixed line [{r}] {text:?}");
    }
    let errs = labelled(&run.stderr);
    assert_eq!(errs.len(), 4 * 300);
    assert!(
        errs.iter()
            .all(|(r, t)| t.starts_with(&format!("err {r} ")))
    );

    let plain = launch(
        &dir,
        &["-n", "2", "--no-prefix", "--", "sh", "-c", "echo r$RANK"],
    );
    plain.assert_ok();
    let mut got: Vec<&str> = plain.stdout.lines().collect();
    got.sort();
    assert_eq!(got, ["r0", "r1"]);
}

#[test]
fn local_failing_rank_sets_status_and_others_are_killed() {
    let dir = scratch("local_fail");
    std::fs::create_dir_all(dir.join("pids")).unwrap();
    let script = format!(
        "echo $$ > {}/pids/$RANK; if [ $RANK = 2 ]; then sleep 0.5; exit 7; fi; exec sleep 61",
        dir.display()
    );
    let run = launch(&dir, &["-n", "4", "--", "sh", "-c", &script]);
    assert_eq!(run.code(), Some(7), "{run:?}");
    assert!(
        run.stderr.contains("rank 2 exited with status 7"),
        "{}",
        run.stderr
    );
    assert!(run.elapsed < Duration::from_secs(20), "{:?}", run.elapsed);
    let pids = rank_pids(&dir);
    assert_eq!(pids.len(), 4);
    for p in pids {
        assert!(!running(p, "sleep"), "rank process {p} still runs");
    }
}

#[test]
fn local_rank_killed_by_signal_reports_128_plus_signal() {
    let dir = scratch("local_signal");
    let run = launch(
        &dir,
        &[
            "-n",
            "2",
            "--",
            "sh",
            "-c",
            "if [ $RANK = 1 ]; then kill -KILL $$; fi; exec sleep 62",
        ],
    );
    assert_eq!(run.code(), Some(137), "{run:?}");
}

#[test]
fn local_timeout_kills_everything_with_124() {
    let dir = scratch("local_timeout");
    std::fs::create_dir_all(dir.join("pids")).unwrap();
    // Rank 1 ignores SIGTERM: it must be SIGKILLed after the grace period.
    let script = format!(
        "echo $$ > {}/pids/$RANK; if [ $RANK = 1 ]; then trap '' TERM; fi; exec sleep 63",
        dir.display()
    );
    let run = launch(
        &dir,
        &[
            "-n",
            "3",
            "--timeout",
            "1",
            "--grace",
            "1",
            "--",
            "sh",
            "-c",
            &script,
        ],
    );
    assert_eq!(run.code(), Some(124), "{run:?}");
    assert!(run.stderr.contains("timed out"), "{}", run.stderr);
    assert!(
        run.elapsed >= Duration::from_millis(900) && run.elapsed < Duration::from_secs(15),
        "{:?}",
        run.elapsed
    );
    let pids = rank_pids(&dir);
    assert_eq!(pids.len(), 3);
    for p in pids {
        assert!(!running(p, "sleep"), "rank process {p} still runs");
    }
}

#[test]
fn local_ctrl_c_terminates_the_ranks() {
    let dir = scratch("local_sigint");
    std::fs::create_dir_all(dir.join("pids")).unwrap();
    let script = format!("echo $$ > {}/pids/$RANK; exec sleep 64", dir.display());
    let started = Instant::now();
    let child = start(&dir, &["-n", "3", "--", "sh", "-c", &script]);
    while rank_pids(&dir).len() < 3 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "ranks did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    signal(child.id(), "INT");
    let run = finish(&dir, child, started, Duration::from_secs(60));
    assert_eq!(run.code(), Some(130), "{run:?}");
    for p in rank_pids(&dir) {
        assert!(!running(p, "sleep"), "rank process {p} still runs");
    }
}

/// Issue 11, defect 4: a launcher killed with SIGKILL. Its ranks (real HALO ranks over
/// libfabric's shm provider, each with its 16 MiB `/dev/shm/PID:0:0` region) end by
/// their parent-death signal, and the next launch removes their shared memory and the
/// dead launcher's record. Only files named with this test's ranks' pids are looked at.
#[test]
fn local_sigkilled_launcher_leaves_no_ranks_and_no_shared_memory() {
    let dir = scratch("local_sigkill");
    let started = Instant::now();
    let mut child = start(
        &dir,
        &[
            "-n",
            "2",
            "--",
            HALO,
            "check",
            "--algo",
            "flat",
            "--counts",
            "1",
            "--v-rounds",
            "0",
            "--loop",
            "1000000000",
        ],
    );
    let launcher = child.id();
    let ranks = loop {
        let r = children_of(launcher);
        if r.len() == 2 && r.iter().all(|&p| !shm_files_of(p).is_empty()) {
            break r;
        }
        if started.elapsed() > Duration::from_secs(60) {
            signal(launcher, "INT");
            let _ = child.wait();
            panic!(
                "the ranks did not set up their shared memory: children {r:?}\n{}",
                std::fs::read_to_string(dir.join("stderr")).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let records = launch_records_of(launcher);
    signal(launcher, "KILL");
    child.wait().unwrap();
    let killed = Instant::now();
    while ranks.iter().any(|&p| running(p, "halo")) {
        if killed.elapsed() > Duration::from_secs(2) {
            // Ours to end (by pid) before failing, or they would run on.
            kill_all(&ranks);
            panic!(
                "ranks {ranks:?} still ran {:?} after their launcher was killed",
                killed.elapsed()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(records.len(), 1, "the launcher's record: {records:?}");
    // The next launch cleans up after the dead one.
    let next = launch(&scratch("local_sigkill_next"), &["-n", "1", "--", "true"]);
    next.assert_ok();
    for p in &ranks {
        let left = shm_files_of(*p);
        assert!(left.is_empty(), "rank {p} left {left:?} in /dev/shm");
    }
    assert!(launch_records_of(launcher).is_empty());
}

/// The launcher removes the shared memory of a rank that dies (SIGKILL) during the job.
#[test]
fn local_rank_killed_mid_job_leaves_no_shared_memory() {
    let dir = scratch("local_rank_shm");
    std::fs::create_dir_all(dir.join("pids")).unwrap();
    let script = format!(
        "echo $$ > {}/pids/$RANK; exec {HALO} check --algo flat --counts 1 --v-rounds 0 \
         --loop 1000 --die-rank 1 --die-after 20",
        dir.display()
    );
    let run = launch(&dir, &["-n", "2", "--", "sh", "-c", &script]);
    assert_eq!(run.code(), Some(137), "{run:?}");
    let pids = rank_pids(&dir);
    assert_eq!(pids.len(), 2);
    for p in pids {
        let left = shm_files_of(p);
        assert!(left.is_empty(), "rank {p} left {left:?} in /dev/shm");
    }
}

#[test]
fn bad_options_exit_with_2() {
    let dir = scratch("bad_options");
    for (args, needle) in [
        (&["-n", "0", "--", "true"][..], "-n must be at least 1"),
        (
            &["-n", "2", "--host-rate", "1gbit", "--", "true"][..],
            "needs emulated hosts",
        ),
        (
            &["-n", "2", "--stats", "--", "true"][..],
            "needs emulated hosts",
        ),
        (
            &["-n", "2", "--hosts", "3", "--", "true"][..],
            "every emulated host needs at least one rank",
        ),
        (
            &["-n", "4", "--ranks-per-host", "3,2", "--", "true"][..],
            "places 5 ranks",
        ),
        (
            &[
                "-n",
                "2",
                "--hosts",
                "2",
                "--host-rate",
                "fast",
                "--",
                "true",
            ][..],
            "tc rate",
        ),
        (
            &["-n", "2", "--timeout", "0", "--", "true"][..],
            "--timeout must be positive",
        ),
    ] {
        let run = launch(&dir, args);
        assert_eq!(run.code(), Some(2), "{args:?}: {run:?}");
        assert!(run.stderr.contains(needle), "{args:?}: {}", run.stderr);
    }
    // A command that does not exist: the launcher says so (status 1).
    let run = launch(&dir, &["-n", "2", "--", "/nonexistent/program"]);
    assert_eq!(run.code(), Some(1), "{run:?}");
    assert!(run.stderr.contains("cannot start rank 0"), "{}", run.stderr);
}

#[test]
fn hosts_without_root_is_a_clear_error() {
    let out = if is_root() {
        // Drop to nobody for this one run, if setpriv is there.
        match Command::new("setpriv")
            .args([
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                HALO,
                "launch",
            ])
            .args(["-n", "2", "--hosts", "2", "--", "true"])
            .output()
        {
            Ok(o) => o,
            Err(e) => {
                halo_test_support::skip(&format!("cannot run setpriv to drop root: {e}"));
                return;
            }
        }
    } else {
        Command::new(HALO)
            .args(["launch", "-n", "2", "--hosts", "2", "--", "true"])
            .output()
            .unwrap()
    };
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("halo launch --hosts needs root (network namespaces"),
        "{stderr}"
    );
}

// ---------------------------------------------------------------------------
// Emulated hosts
