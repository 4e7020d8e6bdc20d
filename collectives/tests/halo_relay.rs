//! HALO's intra-node phase relaying blocks over peers where a node's link matrix has
//! better paths than the fabric's routes (`AlgoOptions::node_relay_bytes`): when it
//! relays, that the schedules verify, and what the simulator says it is worth.

mod common;
use common::*;
use halo_collectives::*;
use halo_topology::{Level, Topology};

/// Sends of relayed blocks (tier 15 of HALO's tags) in every rank's schedule.
fn relayed_sends(s: &[Schedule]) -> usize {
    s.iter()
        .flat_map(|s| s.steps())
        .filter(|st| matches!(st, Step::Send { tag, .. } if tag >> 44 == 15))
        .count()
}

fn halo(topo: &Topology, block: usize, opts: &AlgoOptions) -> Vec<Schedule> {
    let s = build_uniform(Algorithm::Halo, topo, block, opts).unwrap();
    verify_all_to_all(&s, topo, &UniformSizes(block))
        .unwrap_or_else(|e| panic!("{} {block}: {e}", topo.name()));
    s
}

#[test]
fn relays_from_the_threshold_on_nodes_with_better_paths() {
    let opts = AlgoOptions::default();
    assert_eq!(opts.node_relay_bytes, DEFAULT_NODE_RELAY_BYTES);
    let frontier = Topology::preset("frontier:1").unwrap();
    assert_eq!(relayed_sends(&halo(&frontier, 64 << 10, &opts)), 0);
    // 128 KiB: one chunk per relayed block; every one of the 32 unlinked pairs and one
    // linked pair take a path over peers (balanced_routes), each hop a send.
    let at = DEFAULT_NODE_RELAY_BYTES;
    let relays = relayed_sends(&halo(&frontier, at, &opts));
    let (paths, load) = frontier.node_links().unwrap().balanced_routes(8).unwrap();
    assert_eq!(load, 3.0);
    let hops: usize = paths
        .iter()
        .filter(|p| p.len() > 2)
        .map(|p| p.len() - 1)
        .sum();
    assert_eq!(relays, hops);
    assert!(paths.iter().filter(|p| p.len() > 2).count() >= 32);
    // Off: never; a fully connected MI300X node and the uniform model: nothing better.
    let off = AlgoOptions {
        node_relay_bytes: usize::MAX,
        ..AlgoOptions::default()
    };
    assert_eq!(relayed_sends(&halo(&frontier, 1 << 20, &off)), 0);
    let mi300x = Topology::preset("mi300x:1").unwrap();
    assert_eq!(relayed_sends(&halo(&mi300x, 1 << 20, &opts)), 0);
    assert_eq!(
        relayed_sends(&halo(&frontier.without_node_links(), 1 << 20, &opts)),
        0
    );
    // HALO aggregating at the package first: the node is not its first tier.
    let package = AlgoOptions {
        halo_levels: Some(vec![Level::Package, Level::Node]),
        node_relay_bytes: 0,
        ..AlgoOptions::default()
    };
    assert_eq!(relayed_sends(&halo(&frontier, 1 << 10, &package)), 0);
    // Several nodes and cut last nodes, chunked relays: a last node of 6 GCDs relays
    // over its own ranks, one of 5 keeps the fabric's routes (nothing better there).
    let chunked = AlgoOptions {
        chunk_bytes: 8,
        node_relay_bytes: 0,
        ..AlgoOptions::default()
    };
    for (spec, last_node_relays) in [
        ("frontier:2", true),
        ("frontier:2,ranks=14", true),
        ("frontier:3,ranks=21", false),
    ] {
        let topo = Topology::preset(spec).unwrap();
        let s = halo(&topo, 40, &chunked);
        assert!(relayed_sends(&s[..8]) > 0, "{spec}");
        let last = (topo.size() - 1) / 8 * 8;
        assert_eq!(relayed_sends(&s[last..]) > 0, last_node_relays, "{spec}");
    }
}

#[test]
fn on_one_frontier_node_relaying_meets_the_balanced_bound() {
    // 16 MiB per pair: flat is bound by the fabric's busiest single link (4 transfers
    // at 50 GB/s), HALO's relayed phase by the balanced paths' (3).
    let s = 16usize << 20;
    let topo = Topology::preset("frontier:1").unwrap();
    let o = SimOptions::default();
    let flat = simulate_all_to_all(&topo, Algorithm::Flat, Traffic::Uniform(s), &o).unwrap();
    let halo = simulate_all_to_all(&topo, Algorithm::Halo, Traffic::Uniform(s), &o).unwrap();
    let bound = 3.0 * s as f64 / 50e9;
    assert!(
        (halo.load(ResourceClass::GpuLink).unwrap().busiest - bound).abs() < 1e-9,
        "{}",
        halo.summary()
    );
    assert!(halo.time < bound * 1.01, "{}", halo.summary());
    assert!(flat.time / halo.time > 1.3, "{} {}", flat.time, halo.time);
}
