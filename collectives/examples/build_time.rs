//! Time to build one rank's HALO (or flat) program at N = 65,536 (frontier:8192), rank
//! N/2+3, 4 KiB per peer, as the `schedule_build` bench does, reported as wall and CPU
//! time per build (CPU time from /proc/self/stat, so that a busy machine's waiting is
//! left out):
//!
//! ```text
//! cargo run --release -p halo-collectives --example build_time -- [halo|flat] [builds]
//! ```

use halo_collectives::{AlgoOptions, Algorithm, BuildCtx, Layout, UniformSizes, build};
use halo_topology::Topology;
use std::hint::black_box;
use std::time::Instant;

/// This process's user + system CPU time in seconds (Linux; clock ticks of 10 ms).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name in parentheses; utime and stime are 14 and 15.
    let rest = stat.rsplit(')').next().unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11).and_then(|x| x.parse().ok()).unwrap_or(0.0)
        + f.get(12).and_then(|x| x.parse().ok()).unwrap_or(0.0);
    ticks / 100.0
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let algo: Algorithm = args
        .get(1)
        .map_or("halo", String::as_str)
        .parse()
        .expect("algorithm");
    let builds: usize = args.get(2).map_or(200, |b| b.parse().expect("a count"));
    let topo = Topology::preset("frontier:8192").expect("preset");
    let n = topo.size();
    let options = AlgoOptions::default();
    let sizes = UniformSizes(4096);
    let ctx = BuildCtx {
        topology: &topo,
        rank: n / 2 + 3,
        layout: Layout::Uniform { block: 4096 },
        sizes: &sizes,
        options: &options,
    };
    let steps = build(algo, &ctx).expect("builds").len();
    let (wall, cpu) = (Instant::now(), cpu_seconds());
    let mut best = f64::INFINITY;
    for _ in 0..builds {
        let t = Instant::now();
        black_box(build(algo, &ctx).expect("builds"));
        best = best.min(t.elapsed().as_secs_f64());
    }
    let wall = wall.elapsed().as_secs_f64() / builds as f64;
    let cpu = (cpu_seconds() - cpu) / builds as f64;
    println!(
        "{algo} N={n}: {steps} steps; per build: wall mean {:.2} ms, min {:.2} ms, CPU {:.2} ms ({builds} builds)",
        wall * 1e3,
        best * 1e3,
        cpu * 1e3
    );
}
