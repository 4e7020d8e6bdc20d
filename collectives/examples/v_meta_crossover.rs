//! Where all-to-all-v's count exchange should stop all-gathering whole rows.
//!
//! Up to a number of ranks, `Communicator::all_to_all_v` all-gathers every rank's row
//! of counts (`16 n` bytes) in one pass instead of a uniform all-to-all of 16 bytes per
//! pair followed by an agreement all-to-all of 16 bytes per pair. This prints, per
//! topology, the simulated time of both (the two uniform passes with the cheapest
//! algorithm at 16 bytes, what `auto` picks there; the all-gather with the direct
//! one-round fan-out and with the logarithmic builders) so the crossover can be read
//! off. The simulator models links and NICs, not processors: on one host, where
//! every message is a memory copy, read it as a lower bound on the gather's advantage.
//!
//! ```sh
//! cargo run --release -p halo-collectives --example v_meta_crossover
//! ```

use halo_collectives::{
    AlgoOptions, Algorithm, AllGatherAlgorithm, BuildCtx, Layout, META_BLOCK, SimOptions, Traffic,
    UniformSizes, build, build_all_gather, simulate, simulate_all_to_all,
};
use halo_topology::Topology;

fn us(t: f64) -> String {
    format!("{:.2} us", t * 1e6)
}

fn main() {
    let opts = SimOptions::default();
    println!(
        "| topology | ranks | 2 x uniform 16 B (algorithm) | gather direct | gather bruck | gather rec. doubling | best gather / 2 passes |"
    );
    println!("|---|---|---|---|---|---|---|");
    let presets = [
        "nodes:1x4",
        "nodes:1x8",
        "nodes:1x16",
        "nodes:1x64",
        "nodes:4x2",
        "nodes:2x8",
        "frontier:1",
        "frontier:2",
        "frontier:4",
        "frontier:8",
        "frontier:16",
        "frontier:32",
        "frontier:64",
    ];
    for spec in presets {
        let topo = Topology::preset(spec).expect("preset");
        let n = topo.size();
        let (pass, alg) = Algorithm::ALL
            .iter()
            .filter_map(|&a| {
                simulate_all_to_all(&topo, a, Traffic::Uniform(META_BLOCK), &opts)
                    .ok()
                    .map(|r| (r.time, a))
            })
            .min_by(|x, y| x.0.total_cmp(&y.0))
            .expect("some algorithm builds");
        let row = n * META_BLOCK;
        let counts = vec![row; n];
        let zeros = vec![0; n];
        let displs: Vec<usize> = (0..n).map(|q| q * row).collect();
        let direct: Vec<_> = (0..n)
            .map(|rank| {
                build(
                    Algorithm::Flat,
                    &BuildCtx {
                        topology: &topo,
                        rank,
                        layout: Layout::V {
                            send_counts: &counts,
                            send_displs: &zeros,
                            recv_counts: &counts,
                            recv_displs: &displs,
                        },
                        sizes: &UniformSizes(row),
                        options: &AlgoOptions::default(),
                    },
                )
                .expect("flat builds")
            })
            .collect();
        let direct = simulate(&topo, &direct, &opts).expect("simulates").time;
        let gather = |a: AllGatherAlgorithm| -> Option<f64> {
            let s: Vec<_> = (0..n)
                .map(|r| build_all_gather(a, r, n, row))
                .collect::<Result<_, _>>()
                .ok()?;
            Some(simulate(&topo, &s, &opts).expect("simulates").time)
        };
        let bruck = gather(AllGatherAlgorithm::Bruck);
        let doubling = gather(AllGatherAlgorithm::RecursiveDoubling);
        let best = [Some(direct), bruck, doubling]
            .into_iter()
            .flatten()
            .fold(f64::INFINITY, f64::min);
        println!(
            "| {spec} | {n} | {} ({alg}) | {} | {} | {} | {:.2} |",
            us(2.0 * pass),
            us(direct),
            bruck.map_or("-".into(), us),
            doubling.map_or("-".into(), us),
            best / (2.0 * pass)
        );
    }
}
