//! `halo calibrate`: the fit on synthetic points, and real runs under `halo launch`
//! (over shared memory; on emulated hosts when root) whose topology file loads and
//! drives `halo simulate`.

use halo::topology::{Level, Topology};
use halo_cli::calibrate::{fit_alpha_beta, iterations, size_ladder};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Mutex, MutexGuard};

const HALO: &str = env!("CARGO_BIN_EXE_halo");

/// The launched tests time real messages: one at a time, not against each other.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn scratch(test: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("calibrate")
        .join(test);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs `halo ARGS` (at most 120 s) and fails the test when it fails.
///
/// The ranks spin while they wait (`HALO_PROGRESS=spin`): with the default `sleep` a
/// busy 2-core machine sometimes puts a ~200 us floor under every round trip, which
/// hides the bandwidth term of a 64 KiB message and leaves no slope to fit.
#[track_caller]
fn halo(args: &[&str]) -> Output {
    let out = Command::new("timeout")
        .args(["-s", "INT", "-k", "10", "120", HALO])
        .args(args)
        .env_remove("HALO_DEBUG")
        .env("HALO_PROGRESS", "spin")
        .stdin(Stdio::null())
        .output()
        .expect("run halo");
    assert!(
        out.status.success(),
        "halo {args:?} failed: {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Rank 0's lines of a launch's output, without the `[0] ` label.
fn rank0(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.strip_prefix("[0] ").or((l == "[0]").then_some("")))
        .map(|l| format!("{l}\n"))
        .collect()
}

#[track_caller]
fn assert_link_ok(topo: &Topology, level: Level) -> (f64, f64) {
    assert!(topo.has_level(level), "no {level} level");
    let l = topo.link(level);
    assert!(
        l.latency.is_finite() && l.latency > 0.0,
        "{level} latency {}",
        l.latency
    );
    assert!(
        l.bandwidth.is_finite() && l.bandwidth > 0.0,
        "{level} bandwidth {}",
        l.bandwidth
    );
    (l.latency, l.bandwidth)
}

fn simulate(file: &Path) {
    let out = halo(&[
        "simulate",
        "--topology",
        file.to_str().unwrap(),
        "--sizes",
        "1K:64K",
        "--algos",
        "flat,pairwise",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("(calibrated)"), "{text}");
    assert!(text.contains("64 KiB"), "{text}");
}

#[test]
fn fit_recovers_latency_and_bandwidth_exactly() {
    for (latency, bandwidth) in [(5e-6, 1.25e10), (3e-4, 1.25e7), (0.0, 2e9), (1e-7, 3e10)] {
        let points: Vec<(f64, f64)> = size_ladder(1, 4 << 20)
            .into_iter()
            .map(|s| (s as f64, latency + s as f64 / bandwidth))
            .collect();
        let fit = fit_alpha_beta(&points).expect("a fit");
        assert!(
            (fit.latency - latency).abs() <= 1e-9 * latency.max(1e-9),
            "latency {} != {latency}",
            fit.latency
        );
        assert!(
            (fit.bandwidth / bandwidth - 1.0).abs() < 1e-9,
            "bandwidth {} != {bandwidth}",
            fit.bandwidth
        );
        assert!(
            fit.residuals.iter().all(|r| r.abs() < 1e-9),
            "{:?}",
            fit.residuals
        );
    }
    // Two points are a line.
    let fit = fit_alpha_beta(&[(1.0, 1e-6 + 1e-9), (1e6, 1e-6 + 1e-3)]).unwrap();
    assert!((fit.latency / 1e-6 - 1.0).abs() < 1e-6);
    assert!((fit.bandwidth / 1e9 - 1.0).abs() < 1e-9);
    // No fit without a slope or with fewer than two sizes.
    assert!(fit_alpha_beta(&[(1.0, 1e-6), (1e6, 1e-6)]).is_none());
    assert!(fit_alpha_beta(&[(1.0, 1e-6)]).is_none());
    assert!(fit_alpha_beta(&[(1.0, 0.0), (2.0, 1.0)]).is_none());
}

#[test]
fn fit_ignores_a_shaper_burst_for_the_bandwidth() {
    // A token bucket lets its burst through at line rate: t = max(lat, (s - burst) / rate)
    // above the burst; the slope of the large sizes is still 1 / rate.
    let (lat, rate, burst) = (3e-4, 12.5e6, 256e3);
    let points: Vec<(f64, f64)> = size_ladder(1, 4 << 20)
        .into_iter()
        .map(|s| {
            let s = s as f64;
            (s, lat + s / 1e9 + ((s - burst).max(0.0) / rate))
        })
        .collect();
    let fit = fit_alpha_beta(&points).unwrap();
    let ratio = fit.bandwidth / rate;
    assert!((0.9..1.2).contains(&ratio), "bandwidth {}", fit.bandwidth);
    assert!(
        (fit.latency / lat - 1.0).abs() < 0.05,
        "latency {}",
        fit.latency
    );
}

#[test]
fn ladder_and_iterations() {
    assert_eq!(size_ladder(1, 64 << 10).len(), 9);
    assert_eq!(size_ladder(1, 100), vec![1, 4, 16, 64, 100]);
    assert_eq!(iterations(20, 1024), 20);
    assert_eq!(iterations(20, 256 << 10), 5);
    assert_eq!(iterations(20, 4 << 20), 2);
}

#[test]
fn launched_over_shared_memory_writes_a_loadable_topology() {
    let _serial = serial();
    let dir = scratch("shm");
    let file = dir.join("t.toml");
    let out = halo(&[
        "launch",
        "-n",
        "2",
        "--",
        HALO,
        "calibrate",
        "--sizes",
        "1:64K",
        "--iters",
        "20",
        "--out",
        file.to_str().unwrap(),
    ]);
    let table = rank0(&out);
    for want in [
        "device (ranks 0 and 0): latency",
        "node (ranks 0 and 1): latency",
        "64 KiB",
        "residual",
    ] {
        assert!(table.contains(want), "no '{want}' in:\n{table}");
    }
    let topo = Topology::load(&file).expect("the calibrated file loads");
    assert_eq!(topo.size(), 2);
    let (lat, bw) = assert_link_ok(&topo, Level::Node);
    eprintln!("node: latency {lat:.3e} s, bandwidth {bw:.3e} B/s");
    // Fitted, not the discovered defaults.
    assert!(topo.name().ends_with("(calibrated)"), "{}", topo.name());
    assert!(!table.contains("no fit"), "{table}");
    simulate(&file);

    // --json: the raw measurements, one sample per size per level.
    let out = halo(&[
        "launch",
        "-n",
        "2",
        "--",
        HALO,
        "calibrate",
        "--sizes",
        "1:1K",
        "--iters",
        "5",
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_str(&rank0(&out)).expect("JSON");
    let levels = v["levels"].as_array().unwrap();
    let names: Vec<&str> = levels
        .iter()
        .map(|l| l["level"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["device", "node"]);
    for l in levels {
        let samples = l["samples"].as_array().unwrap();
        assert_eq!(samples.len(), 6, "{l}");
        assert!(
            samples
                .iter()
                .all(|s| s["one_way_s"].as_f64().unwrap() > 0.0)
        );
    }
    assert_eq!(v["levels"][1]["ranks"], serde_json::json!([0, 1]));
}

/// Two emulated hosts at 100 Mbit/s: the fitted system bandwidth is the shaped rate,
/// 12.5 MB/s, within 0.5x..1.5x. tbf lets about 256 KB through unshaped, so the sizes
/// go up to 4 MiB, where the shaped part dominates and decides the slope.
#[test]
fn emulated_hosts_fit_the_shaped_rate() {
    if let Some(why) = halo_cli::launch::emulation_unavailable() {
        halo_test_support::skip(&format!("emulated hosts unavailable: {why}"));
        return;
    }
    let _serial = serial();
    let dir = scratch("hosts");
    let file = dir.join("t.toml");
    let out = halo(&[
        "launch",
        "-n",
        "2",
        "--hosts",
        "2",
        "--host-rate",
        "100mbit",
        "--",
        HALO,
        "calibrate",
        "--sizes",
        "1:4M",
        "--iters",
        "10",
        "--out",
        file.to_str().unwrap(),
    ]);
    let table = rank0(&out);
    assert!(table.contains("system (ranks 0 and 1): latency"), "{table}");
    let topo = Topology::load(&file).expect("the calibrated file loads");
    let (lat, bw) = assert_link_ok(&topo, Level::System);
    eprintln!("system: latency {lat:.3e} s, bandwidth {bw:.3e} B/s\n{table}");
    let ratio = bw / 12.5e6;
    assert!(
        (0.5..1.5).contains(&ratio),
        "system bandwidth {bw} B/s is {ratio:.2}x 12.5 MB/s\n{table}"
    );
    simulate(&file);
}
