//! `halo train`, run as a program: the default run (tiny, PP 2 x EP 4, 8 micro-batches,
//! 100 steps) halves its loss; bad layouts exit with status 2 naming the numbers; the
//! same steps as processes under `halo launch` give the same losses as threads, and one
//! step as processes matches the single-rank reference (`halo-piper`'s `exactness`
//! example); the loss plot, emulated hosts and the planned layout.

mod run_halo;

use run_halo::{halo, ok, scratch, stderr, stdout};
use std::path::{Path, PathBuf};
use std::process::Command;

const HALO: &str = env!("CARGO_BIN_EXE_halo");

/// The JSON objects of `halo train --json`'s stdout (a `[R] ` prefix of `halo launch`
/// removed).
fn json_lines(out: &str) -> Vec<serde_json::Value> {
    out.lines()
        .map(|l| l.strip_prefix("[0] ").unwrap_or(l))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
        .collect()
}

fn losses(steps: &[serde_json::Value]) -> Vec<f64> {
    steps
        .iter()
        .map(|s| s["loss"].as_f64().expect("loss"))
        .collect()
}

/// `target/<profile>/examples/exactness` of `halo-piper`, built when missing.
fn exactness_example() -> PathBuf {
    let profile_dir = Path::new(HALO).parent().expect("target/<profile>");
    let exe = profile_dir.join("examples").join("exactness");
    if !exe.is_file() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.args(["build", "-p", "halo-piper", "--examples"])
            .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."));
        if profile_dir.file_name().is_some_and(|n| n == "release") {
            cmd.arg("--release");
        }
        let status = cmd.status().expect("cargo runs");
        assert!(status.success(), "{cmd:?} failed");
    }
    exe
}

#[test]
fn the_default_run_halves_its_loss() {
    let o = halo(&["train", "--json"]);
    assert!(o.status.success(), "{:?}\n{}", o.status, stderr(&o));
    let out = String::from_utf8(o.stdout).expect("UTF-8 stdout");
    let steps: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect();
    assert_eq!(steps.len(), 100, "one line per step of the default run");
    let losses: Vec<f64> = steps
        .iter()
        .enumerate()
        .map(|(i, s)| {
            assert_eq!(s["step"].as_u64(), Some(i as u64 + 1));
            assert_eq!(
                s["tokens"].as_u64(),
                Some(32 * 32),
                "32 sequences of 32 tokens"
            );
            assert!(s["tokens_per_s"].as_f64().unwrap() > 0.0);
            for k in ["compute_s", "all_to_all_s", "p2p_s", "all_reduce_s"] {
                assert!(s[k].as_f64().is_some_and(|v| v >= 0.0), "{k} in {s}");
            }
            assert!(s["all_to_all_s"].as_f64().unwrap() > 0.0, "EP 4 dispatches");
            let l = s["loss"].as_f64().expect("a loss field");
            assert!(l.is_finite());
            l
        })
        .collect();
    let first = losses[0];
    // The last three steps' mean: single batches are noisy.
    let last = losses[97..].iter().sum::<f64>() / 3.0;
    eprintln!("halo train: loss {first:.4} -> {last:.4}");
    assert!(
        first > 0.9 * 64f64.ln(),
        "first loss {first} is not near ln V"
    );
    assert!(
        last < 0.5 * first,
        "loss fell from {first} to {last}, not by half"
    );
}

#[test]
fn bad_layouts_exit_2_naming_the_numbers() {
    let cases: [(&[&str], &str); 4] = [
        (
            &["train", "--pp", "3", "--ep", "1", "--topology", "flat:8"],
            "layout PP 3 x EP 1 x DP 1 needs 3 ranks, but the world communicator has 8",
        ),
        (
            &["train", "--pp", "2", "--ep", "3"],
            "EP 3 does not divide the 8 experts of each block",
        ),
        (
            &["train", "--pp", "8", "--ep", "1"],
            "PP 8 exceeds the model's 4 blocks",
        ),
        (
            &["train", "--batch", "6"],
            "the global batch of 6 sequences does not split into EP 4 x DP 1 x 8 micro-batches",
        ),
    ];
    for (args, want) in cases {
        let o = halo(args);
        assert_eq!(o.status.code(), Some(2), "halo {args:?}: {}", stderr(&o));
        let err = stderr(&o);
        assert!(
            err.contains(want),
            "halo {args:?}: stderr {err:?} lacks {want:?}"
        );
    }
}

#[test]
fn one_step_as_processes_matches_the_single_rank_reference() {
    let exe = exactness_example();
    for layout in [
        ["2", "4", "1", "4"],
        ["4", "2", "1", "1"],
        ["1", "4", "2", "2"],
    ] {
        let mut args = vec!["launch", "-n", "8", "--", exe.to_str().unwrap()];
        args.extend(layout);
        let o = Command::new(HALO)
            .args(&args)
            .env("HALO_TIMEOUT_MS", "30000")
            .env_remove("HALO_DEBUG")
            .output()
            .expect("run halo launch");
        let out = stdout(&o);
        assert!(
            o.status.success(),
            "{args:?}: {:?}\n{out}\n{}",
            o.status,
            stderr(&o)
        );
        let oks = out.lines().filter(|l| l.ends_with(": ok")).count();
        assert_eq!(oks, 8, "every rank matches the reference:\n{out}");
        eprintln!("{}", out.lines().next().unwrap_or_default());
    }
}

#[test]
fn processes_under_halo_launch_give_the_threads_losses() {
    let args = [
        "train",
        "--pp",
        "2",
        "--ep",
        "2",
        "--microbatches",
        "2",
        "--steps",
        "3",
        "--json",
    ];
    let threads = json_lines(&ok(&args));
    let mut launched = vec!["launch", "-n", "4", "--", HALO];
    launched.extend(args);
    let o = Command::new(HALO)
        .args(&launched)
        .env("HALO_TIMEOUT_MS", "30000")
        .env_remove("HALO_DEBUG")
        .output()
        .expect("run halo launch");
    assert!(o.status.success(), "{:?}\n{}", o.status, stderr(&o));
    let procs = json_lines(&stdout(&o));
    assert_eq!(procs.len(), 3, "rank 0 prints one line per step");
    // The same arithmetic in the same order: the losses are bit-for-bit equal.
    assert_eq!(losses(&procs), losses(&threads));
}

#[test]
fn emulated_hosts_a_loss_plot_and_the_time_split() {
    let dir = scratch("train_cli", "plot");
    let svg = dir.join("loss.svg");
    let out = ok(&[
        "train",
        "--hosts",
        "2",
        "--steps",
        "4",
        "--plot",
        svg.to_str().unwrap(),
    ]);
    assert!(
        out.contains("on nodes:2x4 (threads, link emulation x1)"),
        "{out}"
    );
    assert!(out.contains("loss curve: "), "{out}");
    // The end-of-run table: one row per rank, stage 0 holding two micro-batches in flight.
    let rows: Vec<&str> = out
        .lines()
        .skip_while(|l| !l.contains("rank stage ep dp"))
        .skip(1)
        .take_while(|l| !l.starts_with("idle share"))
        .collect();
    assert_eq!(rows.len(), 8, "{out}");
    let text = std::fs::read_to_string(&svg).expect("the plot was written");
    assert!(text.starts_with("<svg"), "an SVG file");
    assert!(text.contains("loss"), "the y axis is labelled");
    // JSON rows carry the idle time and the activation peak.
    let rows = json_lines(&ok(&["train", "--steps", "2", "--json"]));
    for r in &rows {
        for k in [
            "idle_s",
            "p2p_s",
            "compute_s",
            "all_to_all_s",
            "all_reduce_s",
        ] {
            assert!(r[k].as_f64().is_some_and(|v| v >= 0.0), "{k} in {r}");
        }
        assert!(r["activation_bytes"].as_u64().is_some_and(|v| v > 0), "{r}");
    }
}

#[test]
fn the_planner_chooses_the_layout() {
    let out = ok(&[
        "train",
        "--auto-layout",
        "--topology",
        "nodes:2x4",
        "--steps",
        "2",
    ]);
    let banner = out.lines().next().unwrap_or_default();
    assert!(banner.contains("(planned) on nodes:2x4"), "{banner}");
    let err = halo(&["train", "--auto-layout", "--steps", "1"]);
    assert_eq!(err.status.code(), Some(2));
    assert!(
        stderr(&err).contains("--auto-layout needs --topology"),
        "{}",
        stderr(&err)
    );
}

/// `halo launch --hosts 2` (network namespaces, as root): the 8 ranks of PP 2 x EP 4 on
/// two emulated hosts, over tcp between them, give the threads' losses bit for bit.
#[test]
fn processes_on_emulated_hosts_give_the_threads_losses() {
    if let Some(why) = halo_cli::launch::emulation_unavailable() {
        halo_test_support::skip(&format!("emulated hosts unavailable: {why}"));
        return;
    }
    let args = ["train", "--microbatches", "4", "--steps", "2", "--json"];
    let threads = json_lines(&ok(&args));
    let mut launched = vec!["launch", "-n", "8", "--hosts", "2", "--", HALO];
    launched.extend(args);
    let o = Command::new(HALO)
        .args(&launched)
        .env("HALO_TIMEOUT_MS", "60000")
        .env_remove("HALO_DEBUG")
        .output()
        .expect("run halo launch --hosts");
    assert!(o.status.success(), "{:?}\n{}", o.status, stderr(&o));
    let procs = json_lines(&stdout(&o));
    assert_eq!(losses(&procs), losses(&threads));
}

/// `--dispatch dedup` (MoeExchange, one copy of a token per destination node) gives the
/// losses of `--dispatch a2av` to 1e-6 relative (its combine sums a token's outputs per
/// node first: another order of the same sum), on 4 nodes of 2 threads with experts
/// migrating the same way; combined with `--overlap` it exits 2 naming both.
#[test]
fn dedup_dispatch_gives_the_same_losses() {
    let run = |mode: &str| {
        let o = halo(&[
            "train",
            "--pp",
            "1",
            "--ep",
            "4",
            "--dp",
            "2",
            "--microbatches",
            "2",
            "--topology",
            "nodes:4x2",
            "--steps",
            "12",
            "--skew",
            "1.5",
            "--migrate",
            "--every",
            "3",
            "--threshold",
            "1.05",
            "--min-gain",
            "0",
            "--json",
            "--dispatch",
            mode,
        ]);
        assert!(o.status.success(), "{mode}: {:?}\n{}", o.status, stderr(&o));
        let lines = json_lines(&stdout(&o));
        let summary = lines.last().expect("a summary line").clone();
        let steps: Vec<_> = lines.into_iter().filter(|l| l["event"].is_null()).collect();
        (losses(&steps), summary)
    };
    let (a2av, sa) = run("a2av");
    let (dedup, sd) = run("dedup");
    assert_eq!(a2av.len(), 12);
    assert_eq!(dedup.len(), 12);
    for (step, (a, b)) in a2av.iter().zip(&dedup).enumerate() {
        let rel = (a - b).abs() / a.abs().max(f64::MIN_POSITIVE);
        assert!(rel <= 1e-6, "step {step}: a2av {a} vs dedup {b} ({rel:e})");
    }
    assert!(
        sd["migrations"].as_u64().unwrap_or(0) > 0 && sa["migrations"] == sd["migrations"],
        "experts moved the same way: {sa} / {sd}"
    );
    let o = halo(&["train", "--overlap", "--dispatch", "dedup", "--steps", "1"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("--overlap and --dispatch dedup"),
        "{}",
        stderr(&o)
    );
}
