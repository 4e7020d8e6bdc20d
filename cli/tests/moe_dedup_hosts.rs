//! Issue 18 on emulated hosts (root): `halo::MoeExchange` as 8 processes on 4 hosts x 2
//! (`examples/moe_dedup.rs` of the `halo` package, over libfabric `tcp;ofi_rxm`), dedup
//! against a2av for k = 2 and 8. The rows' bytes on the wire — the hosts' veth `tx_bytes`
//! with rows of 1024 f32 minus the same run with rows of 0 (same routing, same control
//! traffic) — are at least what the routing predicts (unique (token, remote host) pairs
//! for dedup, (token, remote expert) pairs for a2av) and at most 10 % more (TCP/IP
//! framing); every combined token is checked bitwise by the ranks themselves.

#[macro_use]
mod launch_common;

use launch_common::*;
use std::path::{Path, PathBuf};
use std::process::Command;

const HALO: &str = env!("CARGO_BIN_EXE_halo");

/// `target/<profile>/examples/moe_dedup`, built (cargo decides whether it is current).
fn example() -> PathBuf {
    let profile_dir = Path::new(HALO).parent().expect("target/<profile>");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "-p", "halo", "--example", "moe_dedup"])
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."));
    if profile_dir.file_name().is_some_and(|n| n == "release") {
        cmd.arg("--release");
    }
    let status = cmd.status().expect("cargo runs");
    assert!(status.success(), "{cmd:?} failed");
    let exe = profile_dir.join("examples").join("moe_dedup");
    assert!(exe.is_file(), "no example at {}", exe.display());
    exe
}

/// (tx bytes of all hosts, predicted row bytes) of one launch.
fn run(dir: &Path, exe: &Path, mode: &str, k: usize, d: usize) -> (u64, u64) {
    let json = dir.join(format!("{mode}-{k}-{d}.json"));
    let exe = exe.to_str().unwrap();
    let (k, d) = (k.to_string(), d.to_string());
    let run = launch(
        dir,
        &[
            "-n",
            "8",
            "--hosts",
            "4",
            "--stats-json",
            json.to_str().unwrap(),
            "--timeout",
            "100",
            "--",
            exe,
            mode,
            &k,
            &d,
            "64",
            "1",
        ],
    );
    run.assert_ok();
    assert_torn_down(&run);
    let line = run
        .stdout
        .lines()
        .find(|l| l.contains("moe_dedup: "))
        .unwrap_or_else(|| panic!("no report:\n{}", run.stdout));
    assert!(line.ends_with("wrong 0"), "{line}");
    let field = |name: &str| -> u64 {
        let words: Vec<&str> = line.split_whitespace().collect();
        let i = words.iter().position(|w| *w == name).expect(name);
        words[i + 1].parse().expect(name)
    };
    let v = stats(&json);
    let tx = (0..4).map(|h| host_stat(&v, h, "tx_bytes")).sum();
    (tx, field("predicted_row_bytes"))
}

#[test]
fn dedup_cuts_the_veth_bytes_by_the_routings_factor() {
    need_emulation!();
    let exe = example();
    let dir = scratch("moe_dedup_hosts");
    for k in [2usize, 8] {
        let mut rows = vec![];
        let mut predicted = vec![];
        for mode in ["a2av", "dedup"] {
            let (tx, pred) = run(&dir, &exe, mode, k, 1024);
            let (tx0, _) = run(&dir, &exe, mode, k, 0);
            let r = tx.saturating_sub(tx0);
            eprintln!("k {k} {mode}: tx {tx} tx(d=0) {tx0} rows {r} predicted {pred}");
            assert!(
                r >= pred && r as f64 <= pred as f64 * 1.10,
                "k {k} {mode}: {r} bytes of rows on the wire, predicted {pred}"
            );
            rows.push(r as f64);
            predicted.push(pred as f64);
        }
        let (got, want) = (rows[0] / rows[1], predicted[0] / predicted[1]);
        eprintln!("k {k}: a2av / dedup = {got:.3}, predicted {want:.3}");
        assert!((got / want - 1.0).abs() < 0.05, "k {k}: {got} vs {want}");
    }
}
