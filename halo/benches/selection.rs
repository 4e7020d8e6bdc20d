//! Measurements of automatic selection for docs/SIMULATION.md ("Automatic selection"):
//! the cost of a first choice (simulated vs alpha-beta ranking) and how the simulated
//! choice compares on reduced topologies. A plain program (no harness) printing tables:
//!
//! `cargo bench -p halo --bench selection`

#![allow(missing_docs)]

use halo::select::{self, SIMULATE_MAX_RANKS};
use halo::topology::{Level, Topology};
use halo::{AlgoOptions, Algorithm};

/// A topology of its own for one test, so that no other test shares its cache entries:
/// `preset` with the system level's latency nudged by `salt` picoseconds.
fn unique(preset: &str, salt: u32) -> Topology {
    let mut spec = halo::topology::preset_spec(preset).unwrap();
    let link = spec.links.get_mut("system").unwrap();
    link.latency += f64::from(salt) * 1e-12;
    spec.name = format!("{preset} (salt {salt})");
    spec.build().unwrap()
}

/// For the measurement: the same machine with fewer nodes: the first nodes of `topology` (in node order),
/// as many as fit in `max_ranks` ranks but at least two, with their levels, link
/// classes and NICs; ranks renumbered in order. Without a node level every rank is its
/// own node and the first `max_ranks` ranks are kept. `None` when `topology` has no
/// more ranks than that already, or its nodes are uneven.
fn reduced(topology: &Topology, max_ranks: usize) -> Option<Topology> {
    let n = topology.size();
    let keep: Vec<bool> = if topology.has_level(Level::Node) {
        let r = topology.max_domain_size(Level::Node);
        if !topology.is_uniform(Level::Node) {
            return None;
        }
        let nodes = (max_ranks / r).max(2);
        (0..n)
            .map(|q| topology.domain(q, Level::Node) < nodes)
            .collect()
    } else {
        (0..n).map(|q| q < max_ranks.max(2)).collect()
    };
    let kept = keep.iter().filter(|&&k| k).count();
    if kept >= n {
        return None;
    }
    let mut new_rank = vec![usize::MAX; n];
    let mut next = 0;
    for q in 0..n {
        if keep[q] {
            new_rank[q] = next;
            next += 1;
        }
    }
    let mut spec = topology.to_spec();
    spec.name = format!("{} (first {kept} ranks)", spec.name);
    spec.ranks.retain(|r| keep[r.rank as usize]);
    for r in &mut spec.ranks {
        r.rank = new_rank[r.rank as usize] as i64;
    }
    spec.nics
        .retain(|nic| nic.ranks.iter().all(|&q| keep[q as usize]));
    for nic in &mut spec.nics {
        for q in &mut nic.ranks {
            *q = new_rank[*q as usize] as i64;
        }
    }
    spec.build().ok()
}

fn main() {
    // `cargo test --all-targets` runs bench programs too: measure only under `cargo bench`.
    if !std::env::args().any(|a| a == "--bench") {
        println!("selection: measurements run under `cargo bench -p halo --bench selection`");
        return;
    }
    use std::time::Instant;
    let options = AlgoOptions::default();
    let sizes: Vec<usize> = vec![
        16,
        256,
        1 << 10,
        4 << 10,
        16 << 10,
        64 << 10,
        256 << 10,
        1 << 20,
        16 << 20,
    ];
    // 1. The cost of a first choice: one size class, a topology not seen before.
    for (preset, salt) in [
        ("frontier:2", 100),
        ("frontier:8", 101),
        ("frontier:16", 102),
        ("frontier:64", 103),
    ] {
        for &block in &[1usize << 10, 1 << 20] {
            let topo = unique(preset, salt + block as u32);
            let t = Instant::now();
            let r = select::ranking(&topo, block, &options);
            let policy = t.elapsed();
            let t = Instant::now();
            let s = select::simulated_ranking(&topo, block, &options);
            let sim = t.elapsed();
            let t = Instant::now();
            let a = select::alpha_beta_ranking(&topo, block, &options);
            let ab = t.elapsed();
            let t = Instant::now();
            let _ = select::ranking(&topo, block, &options);
            let hit = t.elapsed();
            println!(
                "COST {preset} ({} ranks) {block} B: first choice {policy:?} ({:?}), simulate all {sim:?} -> {:?}, alpha-beta {ab:?} -> {:?}, cached {hit:?}",
                topo.size(),
                r.method,
                s.best(),
                a.best()
            );
        }
    }
    // 2. Above the threshold: alpha-beta and a reduced topology against the full simulation.
    for preset in [
        "nodes:2x4",
        "nodes:4x4",
        "frontier:2",
        "dgx-h100:2",
        "nodes:8x8",
        "frontier:8",
        "dgx-h100:8",
        "nodes:16x8",
        "frontier:16",
        "dgx-h100:16",
        "frontier:32",
        "frontier:64",
        "dgx-h100:64",
        "nodes:64x8",
    ] {
        let topo = Topology::preset(preset).unwrap();
        let small = reduced(&topo, SIMULATE_MAX_RANKS).unwrap_or_else(|| topo.clone());
        for &block in &sizes {
            let full = select::simulated_ranking(&topo, block, &options);
            let time = |a: Option<Algorithm>| {
                full.times
                    .iter()
                    .find(|x| Some(x.0) == a)
                    .map(|x| x.1)
                    .unwrap()
            };
            let best = full.best();
            let ab = select::alpha_beta_ranking(&topo, block, &options).best();
            let red = select::simulated_ranking(&small, block, &options).best();
            println!(
                "VS {preset} {block} B: full sim {best:?} | alpha-beta {ab:?} ({:.3}x) | reduced {} ranks {red:?} ({:.3}x)",
                time(ab) / time(best),
                small.size(),
                time(red) / time(best),
            );
        }
    }
}
