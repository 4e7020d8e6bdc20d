//! `halo bench` as a program, one short smoke run per mode (tiny sizes, few iterations,
//! `-c` on): threads, processes over shared memory, two emulated hosts (root only),
//! and the MPI baseline (cargo feature `mpi`, Open MPI's mpirun). Every run checks the
//! table's shape and that validation saw no wrong byte.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

const HALO: &str = env!("CARGO_BIN_EXE_halo");

/// Runs `halo` with the words of `line` (the word `HALO` stands for this build's
/// binary, for `halo launch -- HALO bench ...`), then `extra` (paths), outside any
/// launcher's environment.
fn halo(line: &str, extra: &[&Path]) -> Output {
    let words = line
        .split_whitespace()
        .map(|w| if w == "HALO" { HALO } else { w });
    Command::new(HALO)
        .args(words)
        .args(extra)
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

/// Fails with status 2 and a message containing `want`.
#[track_caller]
fn refused(out: &Output, want: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains(want), "wanted {want:?} in: {err}");
}

/// Data lines of the OSU tables (after `[0] ` prefixes, before the comparison tables),
/// as (size, value, last column).
fn osu_rows(text: &str) -> Vec<(usize, f64, String)> {
    text.lines()
        .map(|l| l.trim_start_matches("[0] "))
        .take_while(|l| !l.starts_with("# Comparison"))
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            let c: Vec<&str> = l.split_whitespace().collect();
            Some((
                c[0].parse().ok()?,
                c[1].parse().ok()?,
                c.last()?.to_string(),
            ))
        })
        .collect()
}

/// The rows of a `-c` run, asserting there are `count` and that none saw a wrong byte.
#[track_caller]
fn validated_rows(text: &str, count: usize) {
    let rows = osu_rows(text);
    assert_eq!(rows.len(), count, "{text}");
    assert!(rows.iter().all(|r| r.1 > 0.0 && r.2 == "0"), "{text}");
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
    let out = ok(&halo(
        "bench alltoall --topology nodes:2x2 -m 1:64 -i 3 -x 1 -c --algo flat,halo,auto",
        &[],
    ));
    let t = titles(&out);
    assert_eq!(t.len(), 3, "{out}");
    assert!(t[1].contains("(algorithm: halo, 4 ranks, topology nodes:2x2, threads, emulated x20)"));
    validated_rows(&out, 3 * 7);
    // Every algorithm for alltoallv; one HALO path for latency and bw, whatever --algo
    // says. 0:256 is 10 sizes, 64:256 3 (bw prints MB/s with two decimals: a few bytes
    // on a loaded machine can print 0.00, and 0 B always would).
    for (op, sizes, rows) in [
        ("alltoallv", "0:256", 6 * 10),
        ("latency", "0:256", 10),
        ("bw", "64:256", 3),
    ] {
        let line = format!(
            "bench {op} --topology nodes:2x2 -m {sizes} -i 3 -x 1 -c --window 4 --experts 8 \
             --tokens 32"
        );
        validated_rows(&ok(&halo(&line, &[])), rows);
    }
}

#[test]
fn threads_rounds_interleave_every_implementation_and_size() {
    // 4 ranks as threads; 3 rounds of 7 sizes x 3 implementations, every byte checked.
    let out = ok(&halo(
        "bench alltoall --topology nodes:2x2 -m 1:64 -i 3 -x 1 -c --rounds 3 --algo flat,halo,auto",
        &[],
    ));
    assert_eq!(
        out.lines().next(),
        Some("# rounds: 3, median of per-round means"),
        "{out}"
    );
    let t = titles(&out);
    assert_eq!(t.len(), 3, "{out}");
    for (title, alg) in t.iter().zip(["flat", "halo", "auto"]) {
        assert!(
            title.contains(&format!("(algorithm: {alg}, 4 ranks, topology nodes:2x2")),
            "{title}"
        );
    }
    validated_rows(&out, 3 * 7);
    let sizes: Vec<usize> = osu_rows(&out).iter().map(|r| r.0).collect();
    let sweep = [1, 2, 4, 8, 16, 32, 64];
    assert_eq!(sizes, [sweep, sweep, sweep].concat(), "{out}");
    assert!(out.contains("time in us, median of 3 rounds"), "{out}");
    // JSON names the rounds; the point-to-point tests take rounds too.
    let json = ok(&halo(
        "bench latency --topology nodes:2x2 -m 0:8 -i 3 -x 1 -c --rounds 2 --format json",
        &[],
    ));
    let j: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(j["rounds"], 2, "{json}");
    let rows = j["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 5, "{json}");
    assert!(
        rows.iter()
            .all(|r| r["wrong"] == 0 && r["avg_us"].as_f64().unwrap() > 0.0),
        "{json}"
    );
}

#[test]
fn threads_formats_and_compare_with_plots() {
    let dir = scratch("compare");
    let json = dir.join("rows.json");
    let out = ok(&halo(
        "bench --topology nodes:2x2 -m 1:8 -i 2 -x 0 --algo flat,halo --nccl-tests --compare \
         --plot-dir",
        &[&dir, Path::new("--json-out"), &json],
    ));
    assert!(
        out.contains("#       size        count     type       time    algbw    busbw  #wrong"),
        "{out}"
    );
    assert!(out.contains("# Speed-up over the flat fan-out"), "{out}");
    for f in ["latency.svg", "latency.png", "busbw.svg", "busbw.png"] {
        let p = dir.join(format!("halo-bench-alltoall-{f}"));
        let len = std::fs::metadata(&p).map(|m| m.len()).unwrap_or(0);
        assert!(len > 1000, "{p:?}: {len} bytes");
    }
    let j: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(j["rows"].as_array().unwrap().len(), 2 * 4);
    assert_eq!(j["ranks"], 4);
    let csv = ok(&halo(
        "bench --topology nodes:2x2 -m 4 -i 1 -x 0 --algo bruck --format csv",
        &[],
    ));
    assert_eq!(csv.lines().count(), 1 + 3, "{csv}");
}

#[test]
fn bad_arguments_fail_with_status_2() {
    for (line, want) in [
        ("bench allreduce", "unknown benchmark 'allreduce'"),
        ("bench -m 64:8", "MIN is larger than MAX"),
        ("bench --algo fastest", "fastest"),
        ("bench --algo mpi -m 1", "halo launch --mpi"),
        ("bench alltoallv --topk 0", "--topk 0"),
        ("bench bw --window 0", "--window"),
        ("bench --rounds 0 -m 1", "--rounds 0"),
        ("bench --rounds 10001 -m 1", "--rounds 10001"),
        (
            "bench alltoallv --algo memcpy -m 8",
            "reference of alltoall only",
        ),
    ] {
        refused(&halo(line, &[]), want);
    }
}

#[test]
fn processes_over_shared_memory() {
    let out = ok(&halo(
        "launch -n 4 --timeout 120 -- HALO bench alltoallv -m 0:512 -i 3 -x 1 -c \
         --algo flat,halo,auto --experts 16",
        &[],
    ));
    let t = titles(&out);
    assert_eq!(t.len(), 3, "{out}");
    assert!(
        t[0].contains("4 ranks") && t[0].contains("processes"),
        "{out}"
    );
    validated_rows(&out, 3 * 11);
    let out = ok(&halo(
        "launch -n 2 --timeout 60 -- HALO bench latency -m 0:64 -i 20 -x 2 -c",
        &[],
    ));
    validated_rows(&out, 8);
}

/// `bw` with its window of non-blocking sends and receives (`halo`) and the blocking
/// loop (`halo-blocking`) in one run, every byte of every message of every window
/// checked (`-c`), over processes and over threads; `halo-blocking` is refused for
/// the collectives.
#[test]
fn bw_window_non_blocking_and_blocking_in_one_run() {
    let out = ok(&halo(
        "launch -n 2 --timeout 120 -- HALO bench bw -m 64:65536 -i 3 -x 1 -c --window 8 \
         --algo halo,halo-blocking",
        &[],
    ));
    let t = titles(&out);
    assert_eq!(t.len(), 2, "{out}");
    assert!(
        t[0].contains("path: halo,") && t[1].contains("path: halo-blocking,"),
        "{out}"
    );
    validated_rows(&out, 2 * 11);
    let out = ok(&halo(
        "bench bw --topology flat:2 -m 64:4096 -i 3 -x 1 -c --window 16 --algo halo,halo-blocking",
        &[],
    ));
    validated_rows(&out, 2 * 7);
    refused(
        &halo("bench alltoall --topology flat:2 --algo halo-blocking", &[]),
        "halo-blocking is for the point-to-point tests",
    );
}

#[test]
fn two_emulated_hosts() {
    if let Some(why) = halo_cli::launch::emulation_unavailable() {
        halo_test_support::skip(&format!("emulated hosts unavailable: {why}"));
        return;
    }
    let out = ok(&halo(
        "launch -n 4 --hosts 2 --host-rate 1gbit --timeout 120 -- HALO bench alltoall \
         -m 1:1024 -i 3 -x 1 -c --algo flat,halo",
        &[],
    ));
    validated_rows(&out, 2 * 11);
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
        halo_test_support::skip(&why);
        return;
    }
    let dir = scratch("mpi");
    let hosts = if halo_cli::launch::emulation_unavailable().is_none() {
        "--hosts 2"
    } else {
        ""
    };
    // Size 0: empty buffers, whose pointer Open MPI would take for MPI_IN_PLACE.
    let line = format!(
        "launch --mpi -n 4 --timeout 180 {hosts} -- HALO bench alltoall -m 0:256 -i 3 -x 1 -c \
         --algo flat,halo,mpi --compare --plot-dir"
    );
    let out = ok(&halo(&line, &[&dir]));
    let t = titles(&out);
    assert_eq!(t.len(), 3, "{out}");
    assert!(
        t[2].contains("algorithm: mpi") && t[2].contains("MPI-launched"),
        "{out}"
    );
    // Every column runs between MPI_Barriers (the harness), HALO's too.
    assert!(
        t.iter().all(|t| t.contains("MPI_Barrier between calls")),
        "{out}"
    );
    // Size 0 has no time to speak of: check its error column only.
    let rows = osu_rows(&out);
    assert_eq!(rows.len(), 3 * 10, "{out}");
    assert!(rows.iter().all(|r| r.2 == "0"), "{out}");
    assert!(out.contains("# Speed-up over MPI"), "{out}");
    for (op, barrier) in [("alltoallv", ""), ("bw", "--own-barrier")] {
        let line = format!(
            "launch --mpi -n 2 --timeout 120 -- HALO bench {op} -m 0:128 -i 3 -x 1 -c \
             --algo auto,mpi --window 4 --experts 4 --tokens 16 {barrier}"
        );
        let out = ok(&halo(&line, &[]));
        let t = titles(&out);
        assert_eq!(t.len(), 2, "{op}: {out}");
        let mode = if barrier.is_empty() {
            "MPI_Barrier between calls"
        } else {
            "own barriers"
        };
        assert!(t.iter().all(|t| t.contains(mode)), "{op}: {out}");
        // Sizes 0..128: 9 per implementation; at 0 B bw has no bandwidth to check.
        let rows = osu_rows(&out);
        assert_eq!(rows.len(), 2 * 9, "{op}: {out}");
        assert!(rows.iter().all(|r| r.2 == "0"), "{op}: {out}");
    }
}

#[test]
fn plain_mpirun_bootstraps_through_mpi() {
    if let Some(why) = mpi_missing() {
        halo_test_support::skip(&why);
        return;
    }
    let out = Command::new("mpirun")
        .args(["-n", "2", "--oversubscribe", "--bind-to", "none", HALO])
        .args([
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
    // MPI is not measured, but its barrier is the harness's.
    assert!(t[0].contains("MPI_Barrier between calls"), "{text}");
    validated_rows(&text, 2 * 4);
}

#[test]
fn memcpy_reference_and_its_ratio() {
    let dir = scratch("memcpy");
    let out = ok(&halo(
        "bench --topology nodes:2x2 -m 1024:1024 -i 2 -x 0 --algo flat,memcpy --compare \
         --plot-dir",
        &[&dir],
    ));
    assert!(out.contains("(algorithm: memcpy, 4 ranks"), "{out}");
    let ratio = out
        .lines()
        .skip_while(|l| !l.starts_with("# Bus bandwidth / memcpy bandwidth"))
        .nth(2)
        .unwrap_or_else(|| panic!("{out}"));
    let cols: Vec<&str> = ratio.split_whitespace().collect();
    assert_eq!(cols[0], "1024", "{out}");
    let r: f64 = cols[1].trim_end_matches('x').parse().unwrap();
    assert!(r > 0.0, "{out}");
}

#[test]
fn sync_timing_is_named_in_the_title() {
    let out = ok(&halo(
        "bench --topology nodes:2x2 -m 8:8 -i 2 -x 0 --algo flat --sync -c",
        &[],
    ));
    assert!(
        titles(&out)[0].contains("threads, emulated x20, timed to a barrier after each call)"),
        "{out}"
    );
    validated_rows(&out, 1);
}

#[test]
fn simulate_against_a_measurement() {
    let dir = scratch("validate");
    let json = dir.join("rows.json");
    let measured = |topology: &str| {
        halo(
            &format!("simulate --topology {topology} --measured"),
            &[&json],
        )
    };
    ok(&halo(
        "bench --topology nodes:2x2 -m 1:1024 -i 2 -x 0 --algo flat,halo --threads --json-out",
        &[&json],
    ));
    let out = ok(&measured("nodes:2x2"));
    let rows: Vec<&str> = out.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(rows.len(), 11, "{out}");
    for r in &rows {
        // size, flat measured, simulated, error, halo measured, simulated, error, ratios
        assert!(r.contains('%') && r.contains(" | "), "{r}");
    }
    assert!(out.contains("# flat: error from"), "{out}");
    assert!(out.contains("# halo: error from"), "{out}");
    refused(&measured("flat:8"), "has 4 ranks but topology");
    std::fs::write(&json, r#"{"benchmark": "latency", "ranks": 4, "rows": []}"#).unwrap();
    refused(
        &measured("nodes:2x2"),
        "only alltoall and alltoallv runs are compared",
    );
    // alltoallv: the router travels in the file and the counts are rebuilt.
    ok(&halo(
        "bench alltoallv --topology nodes:2x2 -m 64:256 -i 2 -x 0 --algo flat,halo \
         --experts 8 --skew 1.5 --json-out",
        &[&json],
    ));
    let j: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(j["moe"]["experts"], 8);
    assert_eq!(j["moe"]["skew"], 1.5);
    let out = ok(&measured("nodes:2x2"));
    assert_eq!(
        out.lines().filter(|l| !l.starts_with('#')).count(),
        3,
        "{out}"
    );
    assert!(out.contains("# halo: error from"), "{out}");
}

/// `auto`'s trials run untimed before its warm-up (every rank the same number of calls,
/// the whole plan of its candidates' trials), and are timed with `--time-trials`.
#[test]
fn autos_trials_run_untimed_unless_asked() {
    let run = |extra: &str| {
        let out = Command::new(HALO)
            .args(["bench", "--threads", "--topology", "nodes:2x2", "-m", "8:8"])
            .args([
                "-i",
                "2",
                "-x",
                "0",
                "-c",
                "--no-emulation",
                "--algo",
                "flat,auto",
            ])
            .args(extra.split_whitespace())
            .env("HALO_DEBUG", "debug")
            .env_remove("RANK")
            .env_remove("OMPI_COMM_WORLD_RANK")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let log = String::from_utf8_lossy(&out.stderr).to_string();
        (ok(&out), log)
    };
    let (table, log) = run("");
    assert!(
        table.contains("# auto: the calls on which it times its candidates ran untimed"),
        "{table}"
    );
    let calls: Vec<usize> = log
        .lines()
        .filter(|l| l.contains("auto's trials run untimed"))
        .map(|l| {
            let at = l.find("calls=").expect("calls= in the line") + 6;
            l[at..].split_whitespace().next().unwrap().parse().unwrap()
        })
        .collect();
    assert_eq!(calls.len(), 4, "one line per rank:\n{log}");
    assert!(calls.iter().all(|&c| c == calls[0]), "{calls:?}");
    // 8 B blocks: two passes of a block of calls per candidate (halo::tune::trial_call),
    // two or more candidates.
    let class = halo::select::size_class(8);
    let per_candidate = halo::tune::trial_calls(class, 2) / 2;
    assert!(
        calls[0] >= halo::tune::trial_calls(class, 2) && calls[0].is_multiple_of(per_candidate),
        "{calls:?}"
    );
    assert!(log.contains("measured all-to-all candidates"), "{log}");

    let (table, log) = run("--time-trials");
    assert!(!table.contains("ran untimed"), "{table}");
    assert!(!log.contains("auto's trials run untimed"), "{log}");
}
