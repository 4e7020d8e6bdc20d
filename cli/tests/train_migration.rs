//! `halo train --skew 1.2 --migrate`, run as a program (tiny: 8 experts on 4 EP ranks,
//! PP 2): the losses are those of the run without migration on the same seed, the
//! imbalance "without migration" it reports is the imbalance of that run, every migration
//! lowers its blocks' imbalance to within 10% of the best assignment (brute force over the
//! loads it reports), the bytes per expert are the resource model's `expert_bytes` plus
//! Adam's step count, and the plot is written. Migration options without --migrate and
//! bad values exit with status 2 naming them.

mod run_halo;

use run_halo::{fails_with, ok};
use serde_json::Value;

const STEPS: usize = 20;

fn rows(out: &str) -> Vec<Value> {
    out.lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect()
}

fn steps(rows: &[Value]) -> Vec<&Value> {
    rows.iter().filter(|r| r.get("event").is_none()).collect()
}

/// The smallest max GPU load over assignments of `loads` to `ep` GPUs holding equally
/// many experts.
fn best_max(loads: &[u64], ep: usize) -> u64 {
    fn go(loads: &[u64], i: usize, per: usize, held: &mut [usize], sum: &mut [u64]) -> u64 {
        if i == loads.len() {
            return *sum.iter().max().unwrap();
        }
        let mut best = u64::MAX;
        for q in 0..held.len() {
            if held[q] < per {
                held[q] += 1;
                sum[q] += loads[i];
                best = best.min(go(loads, i + 1, per, held, sum));
                held[q] -= 1;
                sum[q] -= loads[i];
            }
        }
        best
    }
    go(
        loads,
        0,
        loads.len() / ep,
        &mut vec![0; ep],
        &mut vec![0; ep],
    )
}

#[test]
fn migration_keeps_the_losses_and_evens_the_load() {
    let steps_arg = STEPS.to_string();
    let plot = std::env::temp_dir().join(format!("halo-train-mig-{}.svg", std::process::id()));
    let plain = rows(&ok(&[
        "train", "--skew", "1.2", "--steps", &steps_arg, "--json",
    ]));
    let with = rows(&ok(&[
        "train",
        "--skew",
        "1.2",
        "--steps",
        &steps_arg,
        "--json",
        "--migrate",
        "--every",
        "5",
        "--plot-imbalance",
        plot.to_str().unwrap(),
    ]));
    let (p, w) = (steps(&plain), steps(&with));
    assert_eq!(p.len(), STEPS);
    assert_eq!(w.len(), STEPS);
    for (a, b) in p.iter().zip(&w) {
        // serde_json prints the shortest decimal that reads back as the same f64.
        assert_eq!(a["loss"].as_f64(), b["loss"].as_f64(), "step {}", a["step"]);
        assert_eq!(
            a["imbalance"].as_f64(),
            b["imbalance_static"].as_f64(),
            "step {}: the static imbalance is the run without migration's",
            a["step"]
        );
        assert_eq!(a["imbalance"], a["imbalance_static"]);
        assert!(b["migration_s"].as_f64().unwrap() >= 0.0);
    }
    let summary = with
        .iter()
        .find(|r| r["event"] == "summary")
        .expect("a summary row");
    let per_expert = summary["expert_move_bytes"].as_u64().unwrap();
    assert_eq!(
        per_expert as f64,
        summary["model_expert_bytes"].as_f64().unwrap() + 8.0,
        "weights, gradients, m, v (the resource model's 16 B per parameter) and the step count"
    );
    let migrations: Vec<&Value> = with.iter().filter(|r| r["event"] == "migration").collect();
    assert!(!migrations.is_empty(), "a skewed run migrates");
    assert_eq!(
        summary["migrations"].as_u64(),
        Some(migrations.len() as u64)
    );
    for m in &migrations {
        let loads: Vec<u64> = m["expert_loads"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap())
            .collect();
        assert_eq!(loads.len(), 8);
        let total: u64 = loads.iter().sum();
        let best = best_max(&loads, 4) as f64 * 4.0 / total as f64;
        let (before, after) = (
            m["imbalance_before"].as_f64().unwrap(),
            m["imbalance_after"].as_f64().unwrap(),
        );
        eprintln!(
            "step {} block {}: {before:.3} -> {after:.3} (best {best:.3}), {} swaps, {} B",
            m["step"], m["layer"], m["swaps"], m["bytes_moved"]
        );
        assert!(after < before, "{m}");
        assert!(after <= 1.1 * best, "{m}: best {best}");
        assert!(m["swaps"].as_u64().unwrap() >= 1);
        assert!(m["layer"].as_u64().unwrap() < 4);
        assert_eq!(
            m["bytes_moved"].as_u64().unwrap(),
            m["experts_moved"].as_u64().unwrap() * per_expert
        );
        assert!(m["step"].as_u64().unwrap() % 5 == 0);
    }
    assert!(
        summary["imbalance_mean"].as_f64() < summary["imbalance_static_mean"].as_f64(),
        "{summary}"
    );
    let svg = std::fs::read_to_string(&plot).expect("the plot is written");
    let _ = std::fs::remove_file(&plot);
    assert!(svg.starts_with("<svg"), "an SVG file");
    for name in ["without migration", "with migration"] {
        assert!(svg.contains(name), "the plot's legend lacks {name:?}");
    }
}

#[test]
fn migration_options_are_checked() {
    let e = fails_with(2, &["train", "--threshold", "1.2"]);
    assert!(e.contains("--threshold needs --migrate"), "{e}");
    let e = fails_with(2, &["train", "--migrate", "--threshold", "0.5"]);
    assert!(
        e.contains("invalid migration: threshold: is 0.5; must be a number >= 1"),
        "{e}"
    );
    let e = fails_with(2, &["train", "--migrate", "--every", "0"]);
    assert!(e.contains("every: must be at least 1 step"), "{e}");
    let e = fails_with(2, &["train", "--skew=-1"]);
    assert!(e.contains("skew"), "{e}");
}
