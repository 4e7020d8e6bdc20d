//! HALO's Phase II spread against its aligned routing, in one build (docs/SIMULATION.md,
//! table 1b): for each size, flat, HALO with every chunk to the aligned peer (the
//! sizes given as a matrix, which HALO routes as an all-to-all-v: aligned), and HALO
//! as a uniform all-to-all (spread once a packet is cut into chunks).
//!
//! ```text
//! cargo run --release -p halo-collectives --example spread_ab -- frontier:16 1024 65536 1048576
//! ```

use halo_collectives::{Algorithm, MatrixSizes, SimOptions, Traffic, simulate_all_to_all};
use halo_topology::{Topology, fmt_seconds};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(preset) = args.first() else {
        eprintln!("usage: spread_ab PRESET BYTES...");
        std::process::exit(2);
    };
    let topo = Topology::preset(preset).expect("a preset");
    let n = topo.size();
    let o = SimOptions::default();
    println!(
        "| topology | bytes per peer | flat | halo aligned | halo spread | flat / aligned | flat / spread |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for s in &args[1..] {
        let b: usize = s.parse().expect("bytes per peer");
        let time = |a, t| {
            simulate_all_to_all(&topo, a, t, &o)
                .expect("simulates")
                .time
        };
        let flat = time(Algorithm::Flat, Traffic::Uniform(b));
        let m = MatrixSizes::new(n, vec![b; n * n]);
        let aligned = time(Algorithm::Halo, Traffic::V(&m));
        let spread = time(Algorithm::Halo, Traffic::Uniform(b));
        println!(
            "| {preset} | {b} | {} | {} | {} | {:.4}x | {:.4}x |",
            fmt_seconds(flat),
            fmt_seconds(aligned),
            fmt_seconds(spread),
            flat / aligned,
            flat / spread
        );
    }
}
