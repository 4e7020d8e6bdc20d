//! Measures this machine's compute as a Piper hardware profile, so that the planner can
//! rank layouts of `halo train` (threads on CPU cores) rather than of GPUs.
//!
//! ```text
//! cargo run --release -p halo-piper --example cpu_profile -- RANKS CORES > cpu.toml
//! halo plan layout --model reference:tiny --profile cpu.toml --topology nodes:2x4 --batch 64 --seq 32
//! ```
//!
//! On one thread it times `halo-moe`'s reference pieces, forward plus backward:
//! - the GEMM curve: one SwiGLU expert (d 64, d_ffn 128) on 8 to 1,024 rows, FLOPs
//!   `3 x 2 x rows x m x d x d_ffn`;
//! - the attention curve: one block's dense part on 4 sequences of 16 to 128 tokens; the
//!   projections' `3 x 8 x d^2` FLOPs per token are charged at the GEMM rate for those
//!   rows and the rest of the time to the attention core's `3 x 4 x s x d` per token (the
//!   split the planner's step-time model uses).
//!
//! Every rate is divided by RANKS / CORES (threads share the cores), the memory is the
//! machine's divided by RANKS. Prints the profile as TOML.

use halo_moe::{DenseParams, ExpertParams, MoeConfig, dense_backward, dense_forward};
use std::time::Instant;

/// Seconds per call of `f`, repeated for at least 50 ms.
fn time(mut f: impl FnMut()) -> f64 {
    f();
    let t0 = Instant::now();
    let mut n = 0u32;
    while t0.elapsed().as_secs_f64() < 0.05 || n < 3 {
        f();
        n += 1;
    }
    t0.elapsed().as_secs_f64() / f64::from(n)
}

fn gemm_seconds(cfg: &MoeConfig, rows: usize) -> f64 {
    let p = ExpertParams::init(cfg, 1, 0, 0);
    let mut g = ExpertParams::zeros(cfg);
    let x: Vec<f32> = (0..rows * cfg.hidden)
        .map(|i| ((i % 17) as f32 - 8.0) / 8.0)
        .collect();
    time(|| {
        let (y, saved) = halo_moe::expert_forward(cfg, &p, &x).expect("expert forward");
        halo_moe::expert_backward(cfg, &p, &saved, &y, &mut g).expect("expert backward");
    })
}

fn gemm_flops(cfg: &MoeConfig, rows: usize) -> f64 {
    3.0 * 2.0 * (rows * cfg.expert_matrices * cfg.hidden * cfg.ffn) as f64
}

/// Linear interpolation of the measured GEMM rate (FLOP/s) at `rows`.
fn gemm_rate(points: &[(f64, f64)], rows: f64) -> f64 {
    let mut prev = points[0];
    for &p in points {
        if rows <= p.0 {
            if p.0 == prev.0 {
                return p.1;
            }
            let t = (rows - prev.0) / (p.0 - prev.0);
            return prev.1 + t * (p.1 - prev.1);
        }
        prev = p;
    }
    prev.1
}

fn main() {
    let args: Vec<f64> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let [ranks, cores] = args[..] else {
        eprintln!("usage: cpu_profile RANKS CORES (threads that will share CORES cores)");
        std::process::exit(2);
    };
    let share = (ranks / cores).max(1.0);
    let tiny = MoeConfig::tiny();
    let mut gemm = Vec::new();
    for rows in [8usize, 16, 32, 64, 128, 256, 512, 1024] {
        let rate = gemm_flops(&tiny, rows) / gemm_seconds(&tiny, rows);
        gemm.push((rows as f64, rate));
    }
    let mut attention = Vec::new();
    for seq in [16usize, 32, 64, 128] {
        let cfg = MoeConfig {
            seq,
            ..tiny.clone()
        };
        let p = DenseParams::init(&cfg, 1, 0);
        let mut g = DenseParams::zeros(&cfg);
        let rows = 4 * seq;
        let d = cfg.hidden;
        let x: Vec<f32> = (0..rows * d)
            .map(|i| ((i % 13) as f32 - 6.0) / 6.0)
            .collect();
        let secs = time(|| {
            let (out, saved) = dense_forward(&cfg, &p, &x).expect("dense forward");
            dense_backward(&cfg, &p, &saved, &out.h, &out.u, &mut g).expect("dense backward");
        });
        let proj = 3.0 * rows as f64 * 8.0 * (d * d) as f64 / gemm_rate(&gemm, rows as f64);
        let core = 3.0 * rows as f64 * 4.0 * (seq * d) as f64;
        // At least a tenth of the time goes to the core, whatever the split says.
        let rate = core / (secs - proj).max(0.1 * secs);
        attention.push((seq as f64, rate));
    }
    let tf = |r: f64| r / share / 1e12;
    let peak = gemm
        .iter()
        .chain(&attention)
        .map(|p| tf(p.1))
        .fold(0.0, f64::max);
    let memory = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map_or(16.0, |kib| kib / (1u64 << 20) as f64);
    println!(
        "# Measured by halo-piper's cpu_profile example: {ranks} ranks on {cores} cores \
         (rates divided by {share})."
    );
    println!("name = \"cpu ({ranks} ranks on {cores} cores)\"");
    println!("peak_tflops = {:.6e}", peak);
    println!("memory_gib = {:.3}", memory / ranks);
    for (seq, r) in &attention {
        println!("\n[[attention]]\nseq = {seq}\ntflops = {:.6e}", tf(*r));
    }
    for (rows, r) in &gemm {
        println!("\n[[gemm]]\ntokens = {rows}\ntflops = {:.6e}", tf(*r));
    }
}
