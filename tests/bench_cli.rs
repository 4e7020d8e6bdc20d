//! `halo bench` as a program, one short smoke run per mode (tiny sizes, few iterations,
//! `-c` on): threads, processes over shared memory, two emulated hosts (root only),
//! and the MPI baseline (cargo feature `mpi`, Open MPI's mpirun). Every run checks the
//! table's shape and that validation saw no wrong byte.

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

const HALO: &str = env!("CARGO_BIN_EXE_halo");

fn halo(args: &[&str]) -> Output {
    Command::new(HALO)
        .args(args)
        .env_remove("HALO_DEBUG")
        .env_remove("RANK")
        .env_remove("OMPI_COMM_WORLD_RANK")
        .env_remove("PMI_RANK")
        .env_remove("SLURM_PROCID")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

#[track_caller]
fn ok(out: &Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "halo failed: {:?}\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Data lines of OSU tables (after `[0] ` prefixes): (size, value, errors).
fn osu_rows(text: &str) -> Vec<(usize, f64, u64)> {
    text.lines()
        .map(|l| l.trim_start_matches("[0] "))
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            let c: Vec<&str> = l.split_whitespace().collect();
            Some((
                c[0].parse().ok()?,
                c[1].parse().ok()?,
                c.last()?.parse().ok()?,
            ))
        })
        .collect()
}

fn titles(text: &str) -> Vec<String> {
    text.lines()
        .map(|l| l.trim_start_matches("[0] "))
        .filter(|l| l.starts_with("# OSU-style"))
        .map(str::to_string)
        .collect()
}

fn scratch(name: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("bench")
        .join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn threads_every_benchmark() {
    let out = ok(&halo(&[
        "bench",
        "alltoall",
        "--topology",
        "nodes:2x2",
        "-m",
        "1:64",
        "-i",
        "3",
        "-x",
        "1",
        "-c",
        "--algo",
        "flat,halo,auto",
    ]));
    let t = titles(&out);
    assert_eq!(t.len(), 3, "{out}");
    assert!(t[1].contains("(algorithm: halo, 4 ranks, topology nodes:2x2, threads, emulated x20)"));
    let rows = osu_rows(&out);
    assert_eq!(rows.len(), 3 * 7, "{out}");
    assert!(rows.iter().all(|r| r.1 > 0.0 && r.2 == 0), "{out}");
    for op in ["alltoallv", "latency", "bw"] {
        let out = ok(&halo(&[
            "bench",
            op,
            "--topology",
            "nodes:2x2",
            "-m",
            "0:256",
            "-i",
            "3",
            "-x",
            "1",
            "-c",
            "--window",
            "4",
            "--experts",
            "8",
            "--tokens",
            "32",
        ]));
        assert!(!osu_rows(&out).is_empty(), "{op}: {out}");
        assert!(osu_rows(&out).iter().all(|r| r.2 == 0), "{op}: {out}");
    }
}

#[test]
fn threads_formats_and_compare_with_plots() {
    let dir = scratch("compare");
    let json = dir.join("rows.json");
    let out = ok(&halo(&[
        "bench",
        "--topology",
        "nodes:2x2",
        "-m",
        "1:8",
        "-i",
        "2",
        "-x",
        "0",
        "--algo",
        "flat,halo",
        "--nccl-tests",
        "--compare",
        "--plot-dir",
        dir.to_str().unwrap(),
        "--json-out",
        json.to_str().unwrap(),
    ]));
    assert!(
        out.contains("#       size        count     type       time    algbw    busbw  #wrong"),
        "{out}"
    );
    assert!(out.contains("# Speed-up over the flat fan-out"), "{out}");
    for f in ["latency.svg", "latency.png", "busbw.svg", "busbw.png"] {
        let p = dir.join(format!("halo-bench-alltoall-{f}"));
        assert!(
            std::fs::metadata(&p)
                .map(|m| m.len() > 1000)
                .unwrap_or(false),
            "{p:?}"
        );
    }
    let j: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(j["rows"].as_array().unwrap().len(), 2 * 4);
    assert_eq!(j["ranks"], 4);
    let csv = ok(&halo(&[
        "bench",
        "--topology",
        "nodes:2x2",
        "-m",
        "4",
        "-i",
        "1",
        "-x",
        "0",
        "--algo",
        "bruck",
        "--format",
        "csv",
    ]));
    assert_eq!(csv.lines().count(), 1 + 3, "{csv}");
}

#[test]
fn bad_arguments_fail_with_status_2() {
    for (args, want) in [
        (&["bench", "allreduce"][..], "unknown benchmark 'allreduce'"),
        (&["bench", "-m", "64:8"][..], "MIN is larger than MAX"),
        (&["bench", "--algo", "fastest"][..], "fastest"),
        (
            &["bench", "--algo", "mpi", "-m", "1"][..],
            "halo launch --mpi",
        ),
        (&["bench", "alltoallv", "--topk", "0"][..], "--topk 0"),
        (&["bench", "bw", "--window", "0"][..], "--window"),
    ] {
        let out = halo(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
}

#[test]
fn processes_over_shared_memory() {
    let out = ok(&halo(&[
        "launch",
        "-n",
        "4",
        "--timeout",
        "120",
        "--",
        HALO,
        "bench",
        "alltoallv",
        "-m",
        "0:512",
        "-i",
        "3",
        "-x",
        "1",
        "-c",
        "--algo",
        "flat,halo,auto",
        "--experts",
        "16",
    ]));
    let t = titles(&out);
    assert_eq!(t.len(), 3, "{out}");
    assert!(
        t[0].contains("4 ranks") && t[0].contains("processes"),
        "{out}"
    );
    let rows = osu_rows(&out);
    assert_eq!(rows.len(), 3 * 11, "{out}");
    assert!(rows.iter().all(|r| r.2 == 0), "{out}");
    let out = ok(&halo(&[
        "launch",
        "-n",
        "2",
        "--timeout",
        "60",
        "--",
        HALO,
        "bench",
        "latency",
        "-m",
        "0:64",
        "-i",
        "20",
        "-x",
        "2",
        "-c",
    ]));
    assert_eq!(osu_rows(&out).len(), 8, "{out}");
}

#[test]
fn two_emulated_hosts() {
    if let Some(why) = halo::launch::emulation_unavailable() {
        eprintln!("skipped: emulated hosts unavailable: {why}");
        return;
    }
    let out = ok(&halo(&[
        "launch",
        "-n",
        "4",
        "--hosts",
        "2",
        "--host-rate",
        "1gbit",
        "--timeout",
        "120",
        "--",
        HALO,
        "bench",
        "alltoall",
        "-m",
        "1:1024",
        "-i",
        "3",
        "-x",
        "1",
        "-c",
        "--algo",
        "flat,halo",
    ]));
    let rows = osu_rows(&out);
    assert_eq!(rows.len(), 2 * 11, "{out}");
    assert!(rows.iter().all(|r| r.2 == 0), "{out}");
}

/// MPI's `mpirun` on PATH, or why the MPI test skips.
fn mpi_missing() -> Option<String> {
    if !cfg!(feature = "mpi") {
        return Some("built without the cargo feature `mpi`".into());
    }
    match Command::new("mpirun").arg("--version").output() {
        Ok(o) if o.status.success() => None,
        _ => Some("no mpirun (scripts/deps.sh test installs openmpi-bin)".into()),
    }
}

#[test]
fn mpi_baseline_in_the_same_run() {
    if let Some(why) = mpi_missing() {
        eprintln!("skipped: {why}");
        return;
    }
    let dir = scratch("mpi");
    let mut args = vec!["launch", "--mpi", "-n", "4", "--timeout", "180"];
    let emulated = halo::launch::emulation_unavailable().is_none();
    if emulated {
        args.extend(["--hosts", "2"]);
    }
    args.extend([
        "--",
        HALO,
        "bench",
        "alltoall",
        "-m",
        "0:256",
        "-i",
        "3",
        "-x",
        "1",
        "-c",
        "--algo",
        "flat,halo,mpi",
        "--compare",
        "--plot-dir",
        dir.to_str().unwrap(),
    ]);
    let out = ok(&halo(&args));
    let t = titles(&out);
    assert_eq!(t.len(), 3, "{out}");
    assert!(
        t[2].contains("algorithm: mpi") && t[2].contains("MPI-launched"),
        "{out}"
    );
    assert!(osu_rows(&out).iter().all(|r| r.2 == 0), "{out}");
    assert!(out.contains("# Speed-up over MPI"), "{out}");
    for op in ["alltoallv", "bw"] {
        let out = ok(&halo(&[
            "launch",
            "--mpi",
            "-n",
            "2",
            "--timeout",
            "120",
            "--",
            HALO,
            "bench",
            op,
            "-m",
            "0:128", // size 0: empty buffers, whose pointer Open MPI would take for MPI_IN_PLACE
            "-i",
            "3",
            "-x",
            "1",
            "-c",
            "--algo",
            "auto,mpi",
            "--window",
            "4",
            "--experts",
            "4",
            "--tokens",
            "16",
        ]));
        let t = titles(&out);
        assert_eq!(t.len(), 2, "{op}: {out}");
        assert!(osu_rows(&out).iter().all(|r| r.2 == 0), "{op}: {out}");
    }
}

#[test]
fn memcpy_reference_and_its_ratio() {
    let out = ok(&halo(&[
        "bench",
        "--topology",
        "nodes:2x2",
        "-m",
        "1024:1024",
        "-i",
        "2",
        "-x",
        "0",
        "--algo",
        "flat,memcpy",
        "--compare",
        "--plot-dir",
        scratch("memcpy").to_str().unwrap(),
    ]));
    assert!(out.contains("(algorithm: memcpy, 4 ranks"), "{out}");
    let ratio = out
        .lines()
        .skip_while(|l| !l.starts_with("# Bus bandwidth / memcpy bandwidth"))
        .nth(2)
        .unwrap_or_else(|| panic!("{out}"));
    let cols: Vec<&str> = ratio.split_whitespace().collect();
    assert_eq!(cols[0], "1024", "{out}");
    assert!(cols[1].ends_with('x'), "{out}");
    let out = halo(&["bench", "alltoallv", "--algo", "memcpy", "-m", "8"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("reference of alltoall only"));
}

#[test]
fn simulate_against_a_measurement() {
    let dir = scratch("validate");
    let json = dir.join("rows.json");
    ok(&halo(&[
        "bench",
        "--topology",
        "nodes:2x2",
        "-m",
        "1:1024",
        "-i",
        "2",
        "-x",
        "0",
        "--algo",
        "flat,halo",
        "--threads",
        "--json-out",
        json.to_str().unwrap(),
    ]));
    let out = ok(&halo(&[
        "simulate",
        "--topology",
        "nodes:2x2",
        "--measured",
        json.to_str().unwrap(),
    ]));
    let rows: Vec<&str> = out.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(rows.len(), 11, "{out}");
    for r in &rows {
        // size, flat measured, simulated, error, halo measured, simulated, error, ratios
        assert!(r.contains('%') && r.contains(" | "), "{r}");
    }
    assert!(out.contains("# flat: error from"), "{out}");
    assert!(out.contains("# halo: error from"), "{out}");
    let wrong = halo(&[
        "simulate",
        "--topology",
        "flat:8",
        "--measured",
        json.to_str().unwrap(),
    ]);
    assert_eq!(wrong.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&wrong.stderr).contains("has 4 ranks but topology"),
        "{}",
        String::from_utf8_lossy(&wrong.stderr)
    );
    std::fs::write(
        &json,
        "{\"benchmark\": \"latency\", \"ranks\": 4, \"rows\": []}",
    )
    .unwrap();
    let lat = halo(&[
        "simulate",
        "--topology",
        "nodes:2x2",
        "--measured",
        json.to_str().unwrap(),
    ]);
    assert_eq!(lat.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&lat.stderr)
            .contains("only alltoall and alltoallv runs are compared")
    );
    // alltoallv: the router travels in the file and the counts are rebuilt.
    ok(&halo(&[
        "bench",
        "alltoallv",
        "--topology",
        "nodes:2x2",
        "-m",
        "64:256",
        "-i",
        "2",
        "-x",
        "0",
        "--algo",
        "flat,halo",
        "--experts",
        "8",
        "--skew",
        "1.5",
        "--json-out",
        json.to_str().unwrap(),
    ]));
    let j: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(j["moe"]["experts"], 8);
    assert_eq!(j["moe"]["skew"], 1.5);
    let out = ok(&halo(&[
        "simulate",
        "--topology",
        "nodes:2x2",
        "--measured",
        json.to_str().unwrap(),
    ]));
    assert_eq!(
        out.lines().filter(|l| !l.starts_with('#')).count(),
        3,
        "{out}"
    );
    assert!(out.contains("# halo: error from"), "{out}");
}

#[test]
fn sync_timing_is_named_in_the_title() {
    let out = ok(&halo(&[
        "bench",
        "--topology",
        "nodes:2x2",
        "-m",
        "8:8",
        "-i",
        "2",
        "-x",
        "0",
        "--algo",
        "flat",
        "--sync",
        "-c",
    ]));
    assert!(
        titles(&out)[0].contains("threads, emulated x20, timed to a barrier after each call)"),
        "{out}"
    );
    assert_eq!(osu_rows(&out).len(), 1, "{out}");
}

#[test]
fn plain_mpirun_bootstraps_through_mpi() {
    if let Some(why) = mpi_missing() {
        eprintln!("skipped: {why}");
        return;
    }
    let out = Command::new("mpirun")
        .args(["-n", "2", "--oversubscribe", "--bind-to", "none"])
        .args([
            HALO,
            "bench",
            "-m",
            "1:8",
            "-i",
            "2",
            "-x",
            "0",
            "-c",
            "--algo",
            "flat,halo",
        ])
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env_remove("HALO_DEBUG")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = ok(&out);
    let t = titles(&text);
    assert_eq!(t.len(), 2, "{text}");
    assert!(
        t[0].contains("2 ranks") && t[0].contains("MPI-launched"),
        "{text}"
    );
    assert!(osu_rows(&text).iter().all(|r| r.2 == 0), "{text}");
}
