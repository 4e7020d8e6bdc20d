//! The automatic algorithm choice: the simulator's argmin on the communicator's
//! topology, the same on every rank, cached process-wide; the alpha-beta model above
//! `SIMULATE_MAX_RANKS`.
#![allow(missing_docs)]

use halo::collectives::{SimOptions, Traffic, simulate_all_to_all};
use halo::local::{self, Emulation};
use halo::select::{self, Method, SIMULATE_MAX_RANKS};
use halo::topology::Topology;
use halo::{AlgoOptions, Algorithm, Partition};
use std::sync::Arc;

/// Every candidate simulated on its own, as `select` should have done it: the algorithms
/// that build with their time, in the order of `Algorithm::ALL`.
fn simulate_each(topo: &Topology, block: usize, options: &AlgoOptions) -> Vec<(Algorithm, f64)> {
    let sim = SimOptions {
        algo: options.clone(),
        ..SimOptions::default()
    };
    Algorithm::ALL
        .into_iter()
        .filter_map(|a| {
            simulate_all_to_all(topo, a, Traffic::Uniform(block), &sim)
                .ok()
                .map(|r| (a, r.time))
        })
        .collect()
}

/// The first algorithm (in `Algorithm::ALL` order) with the smallest time.
fn argmin(times: &[(Algorithm, f64)]) -> Algorithm {
    let mut best = times[0];
    for &(a, t) in &times[1..] {
        if t < best.1 {
            best = (a, t);
        }
    }
    best.0
}

/// A topology of its own for one test, so that no other test shares its cache entries:
/// `preset` with the system level's latency nudged by `salt` picoseconds.
fn unique(preset: &str, salt: u32) -> Topology {
    let mut spec = halo::topology::preset_spec(preset).unwrap();
    let link = spec.links.get_mut("system").unwrap();
    link.latency += f64::from(salt) * 1e-12;
    spec.name = format!("{preset} (salt {salt})");
    spec.build().unwrap()
}

#[test]
fn choice_is_the_argmin_of_simulated_times() {
    let options = AlgoOptions::default();
    let presets = [
        "flat:8",
        "nodes:2x4",
        "nodes:4x4",
        "frontier:2",
        "dgx-h100:2",
        "nodes:3x4,ranks=10",
    ];
    let sizes = [0, 1, 24, 1000, 4096, 64 << 10, 1 << 20];
    let mut winners = Vec::new();
    for preset in presets {
        let topo = Topology::preset(preset).unwrap();
        for block in sizes {
            let rep = select::representative(block);
            let expect = simulate_each(&topo, rep, &options);
            let r = select::ranking(&topo, block, &options);
            assert_eq!(r.method, Method::Simulated, "{preset} {block}");
            assert_eq!(r.block, rep);
            // Same set of candidates, same times (the simulator is deterministic)...
            let mut got = r.times.clone();
            got.sort_by_key(|&(a, _)| Algorithm::ALL.iter().position(|&x| x == a));
            assert_eq!(got, expect, "{preset} {block}");
            // ...ordered cheapest first, and the choice is the argmin.
            assert!(r.times.windows(2).all(|w| w[0].1 <= w[1].1), "{r:?}");
            let best = argmin(&expect);
            assert_eq!(r.best(), Some(best), "{preset} {block}: {r:?}");
            assert_eq!(select::choose(&topo, block, &options), best);
            println!("{preset:>20} {block:>8} B -> {best} ({:?})", r.times);
            if !winners.contains(&best) {
                winners.push(best);
            }
        }
    }
    // The sizes and shapes above are not all won by one algorithm.
    assert!(winners.len() >= 2, "{winners:?}");
}

#[test]
fn blocks_of_one_size_class_share_a_ranking() {
    let topo = unique("nodes:2x4", 1);
    let options = AlgoOptions::default();
    let a = select::ranking(&topo, 4096, &options);
    let b = select::ranking(&topo, 8191, &options);
    assert!(Arc::ptr_eq(&a, &b));
    assert_eq!(a.block, 4096);
    let c = select::ranking(&topo, 8192, &options);
    assert!(!Arc::ptr_eq(&a, &c));
    assert_eq!(c.block, 8192);
}

#[test]
fn every_rank_makes_the_same_choice() {
    for preset in ["nodes:2x4", "frontier:1", "dgx-h100:2"] {
        let topo = Topology::preset(preset).unwrap();
        let n = topo.size();
        for block in [8usize, 1000, 64 << 10] {
            let out = local::run(&topo, Emulation::off(), |comm| {
                let send = vec![comm.rank() as u8; n * block];
                let mut recv = vec![0u8; n * block];
                comm.all_to_all(&send, &mut recv)?;
                let uniform = comm.last_algorithm();
                // All-to-all-v with uneven blocks: the data pass chooses by the mean block.
                let counts: Vec<usize> = (0..n).map(|q| block / 2 + (q % 3) * block / 4).collect();
                let displs: Vec<usize> = counts
                    .iter()
                    .scan(0, |at, &c| {
                        let d = *at;
                        *at += c;
                        Some(d)
                    })
                    .collect();
                let me = comm.rank();
                let recv_counts = vec![counts[me]; n];
                let recv_displs: Vec<usize> = (0..n).map(|q| q * counts[me]).collect();
                let vsend = vec![me as u8; counts.iter().sum()];
                let mut vrecv = vec![0u8; n * counts[me]];
                comm.all_to_all_v(
                    &vsend,
                    &Partition::new(&counts, &displs),
                    &mut vrecv,
                    &Partition::new(&recv_counts, &recv_displs),
                )?;
                Ok((uniform, comm.last_algorithm()))
            });
            let out: Vec<_> = out.into_iter().map(|r| r.unwrap()).collect();
            let (uniform, v) = out[0];
            assert!(uniform.is_some() && v.is_some());
            assert!(
                out.iter().all(|&x| x == (uniform, v)),
                "{preset} {block}: {out:?}"
            );
            let expect = select::choose(&topo, block, &AlgoOptions::default());
            assert_eq!(uniform, Some(expect), "{preset} {block}");
            println!("{preset} {block} B: all-to-all {uniform:?}, all-to-all-v {v:?}");
        }
    }
}

#[test]
fn the_cache_is_hit_by_later_communicators_and_equal_shapes() {
    let topo = unique("nodes:2x4", 2);
    let options = AlgoOptions::default();
    let block = 3000; // class 2048..4095
    assert!(select::cached_ranking(&topo, block, &options).is_none());
    let run = || {
        local::run(&topo, Emulation::off(), |comm| {
            let n = comm.size();
            let send = vec![1u8; n * block];
            let mut recv = vec![0u8; n * block];
            comm.all_to_all(&send, &mut recv)?;
            // The first call runs the ranking's best (the first candidate measured,
            // `halo::tune`).
            let first = comm.last_algorithm();
            // The communicator's second call of the class: its own memo.
            comm.all_to_all(&send, &mut recv)?;
            Ok(first)
        })
    };
    let first: Vec<_> = run().into_iter().map(|r| r.unwrap()).collect();
    let cached = select::cached_ranking(&topo, block, &options).expect("computed by the run");
    assert_eq!(first[0], cached.best());
    // New communicators on the same topology find the entry instead of recomputing it.
    let second: Vec<_> = run().into_iter().map(|r| r.unwrap()).collect();
    assert_eq!(first, second);
    let after = select::cached_ranking(&topo, block, &options).unwrap();
    assert!(Arc::ptr_eq(&cached, &after));
    assert!(Arc::ptr_eq(
        &cached,
        &select::ranking(&topo, 2048, &options)
    ));
    // The same shape under another name is the same entry...
    let mut spec = topo.to_spec();
    spec.name = "renamed".into();
    let renamed = spec.build().unwrap();
    assert!(Arc::ptr_eq(
        &cached,
        &select::cached_ranking(&renamed, block, &options).unwrap()
    ));
    // ...while other builder options are another.
    let other = AlgoOptions {
        chunk_bytes: 4096,
        ..AlgoOptions::default()
    };
    assert!(select::cached_ranking(&topo, block, &other).is_none());
    assert!(!Arc::ptr_eq(
        &cached,
        &select::ranking(&topo, block, &other)
    ));
}

#[test]
fn above_the_threshold_the_alpha_beta_model_decides() {
    let options = AlgoOptions::default();
    for preset in [
        format!(
            "nodes:{}x8,ranks={}",
            SIMULATE_MAX_RANKS / 8 + 1,
            SIMULATE_MAX_RANKS + 1
        ),
        "frontier:64".to_string(),
    ] {
        let topo = Topology::preset(&preset).unwrap();
        assert!(topo.size() > SIMULATE_MAX_RANKS);
        for block in [16usize, 1 << 10, 64 << 10, 1 << 20] {
            let r = select::ranking(&topo, block, &options);
            assert_eq!(r.method, Method::AlphaBeta, "{preset}");
            let rep = select::representative(block);
            let expect: Vec<(Algorithm, f64)> = select::ranked(&topo, rep)
                .into_iter()
                .filter(|&(a, _)| select::buildable(&topo, a, &options).is_ok())
                .collect();
            assert_eq!(r.times, expect, "{preset} {block}");
            assert_eq!(r.best(), Some(expect[0].0));
            assert_eq!(*r, select::alpha_beta_ranking(&topo, rep, &options));
            println!("{preset} {block} B -> {:?}", r.best());
        }
    }
}

#[test]
fn one_rank_and_empty_blocks_still_choose() {
    let options = AlgoOptions::default();
    for preset in ["flat:1", "nodes:1x1", "nodes:2x2"] {
        let topo = Topology::preset(preset).unwrap();
        let r = select::ranking(&topo, 0, &options);
        assert!(r.best().is_some(), "{preset}: {r:?}");
        let out = local::run(&topo, Emulation::off(), |comm| {
            let mut recv: [u8; 0] = [];
            comm.all_to_all::<u8>(&[], &mut recv)?;
            Ok(comm.last_algorithm())
        });
        for o in out {
            assert_eq!(o.unwrap(), r.best(), "{preset}");
        }
    }
}

#[test]
fn the_link_matrix_inside_a_node_is_part_of_the_choice() {
    // frontier:1 with its MI250X link matrix and without it (the uniform model) are
    // different machines to the model: different times, separate cache entries.
    let links = Topology::preset("frontier:1").unwrap();
    let uniform = links.without_node_links();
    let block = 1 << 20;
    let opts = AlgoOptions::default();
    let a = select::ranking(&links, block, &opts);
    let b = select::ranking(&uniform, block, &opts);
    assert_eq!(a.method, Method::Simulated);
    let flat = |r: &select::Ranking| r.times.iter().find(|t| t.0 == Algorithm::Flat).unwrap().1;
    // Each the simulator's own figure for its topology (4 and 6 MiB-transfers' worth
    // on the busiest 50 GB/s resource: the single link, the node port).
    let sim = |t: &Topology| simulate_each(t, block, &opts)[0].1;
    assert_eq!(flat(&a), sim(&links));
    assert_eq!(flat(&b), sim(&uniform));
    assert!(flat(&a) < flat(&b) * 0.7, "{} vs {}", flat(&a), flat(&b));
    // The alpha-beta model: the busiest link's load, 4 transfers at 50 GB/s.
    let e = select::estimate(&links, Algorithm::Flat, block);
    assert!((e - (2e-6 + 4.0 * block as f64 / 50e9)).abs() < 1e-9, "{e}");
    assert!(select::estimate(&uniform, Algorithm::Flat, block) < e);
    // Above 128 ranks: halo2d's gather inside the node (127 blocks per pair on
    // frontier:128) runs on the busiest link too, 4 x where the uniform node had 1 x.
    let big = Topology::preset("frontier:128").unwrap();
    let b = 64 << 10;
    let gather = |t: &Topology| select::estimate(t, Algorithm::Halo2d, b);
    let extra = 127.0 * b as f64 * (4.0 - 1.0) / 50e9;
    let got = gather(&big) - gather(&big.without_node_links());
    assert!((got - extra).abs() < 1e-3 * extra, "{got} vs {extra}");
    assert_eq!(
        select::alpha_beta_ranking(&big, b, &opts).method,
        Method::AlphaBeta
    );
}
