//! Quick end-to-end check of the builders on a few presets.
mod common;
use common::*;
use halo_collectives::*;
use halo_topology::{Level, Topology};

#[test]
fn smoke() {
    for preset in [
        "flat:1",
        "flat:5",
        "nodes:2x2",
        "nodes:4x4,ranks=14",
        "frontier:2",
        "frontier:5,ranks=37",
    ] {
        let topo = Topology::preset(preset).unwrap();
        for algo in [Algorithm::Flat, Algorithm::Pairwise, Algorithm::Halo] {
            for opts in [
                AlgoOptions::default(),
                AlgoOptions {
                    chunk_bytes: 3,
                    halo_levels: None,
                    max_chunks: 4096,
                    // Relays inside Frontier's nodes at every size, in chunks.
                    node_relay_bytes: 0,
                },
            ] {
                let s = build_uniform(algo, &topo, 8, &opts).unwrap();
                verify_all_to_all(&s, &topo, &UniformSizes(8))
                    .unwrap_or_else(|e| panic!("{preset} {algo}: {e}"));
                let n = topo.size();
                let mut rng = Rng::from_state(7);
                let m = MatrixSizes::new(
                    n,
                    (0..n * n)
                        .map(|_| if rng.below(3) == 0 { 0 } else { rng.below(20) })
                        .collect(),
                );
                let s = build_v(algo, &topo, &m, &opts).unwrap();
                verify_all_to_all(&s, &topo, &m)
                    .unwrap_or_else(|e| panic!("{preset} {algo} v: {e}"));
            }
        }
        if topo.has_level(Level::Switch) {
            let opts = AlgoOptions {
                chunk_bytes: 5,
                halo_levels: Some(vec![Level::Node, Level::Switch, Level::Group]),
                max_chunks: 4096,
                node_relay_bytes: 0,
            };
            let s = build_uniform(Algorithm::Halo, &topo, 8, &opts).unwrap();
            verify_all_to_all(&s, &topo, &UniformSizes(8))
                .unwrap_or_else(|e| panic!("{preset} deep: {e}"));
        }
    }
}
