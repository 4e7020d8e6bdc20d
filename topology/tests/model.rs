//! Queries of the topology model on even and uneven trees, presets and their errors,
//! Frontier's figures, and property tests over random trees.
//!
//! Expected values are worked out by hand in the comments, not re-derived with the
//! model's own logic.

use halo_topology::spec::RankSpec;
use halo_topology::{Level, LinkClass, Topology, TopologyError, TopologySpec, commodity, frontier};
use proptest::prelude::*;
use std::collections::BTreeMap;

fn preset(spec: &str) -> Topology {
    Topology::preset(spec).unwrap_or_else(|e| panic!("preset {spec}: {e}"))
}

fn hand() -> Topology {
    Topology::load(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/hand.toml")).unwrap()
}

fn levels(t: &Topology) -> Vec<Level> {
    t.levels().collect()
}

fn nic_names<'a>(it: impl Iterator<Item = &'a halo_topology::Nic>) -> Vec<&'a str> {
    it.map(|n| n.name.as_str()).collect()
}

// ---------------------------------------------------------------------------------------
// nodes:4x4,ranks=14 — nodes {0..3} {4..7} {8..11} {12,13}; one NIC eth0 per node.

#[test]
fn nodes_uneven_levels_and_counts() {
    let t = preset("nodes:4x4,ranks=14");
    assert_eq!(t.name(), "nodes:4x4,ranks=14");
    assert_eq!(t.size(), 14);
    assert_eq!(levels(&t), [Level::Device, Level::Node, Level::System]);
    assert!(t.has_level(Level::Device) && t.has_level(Level::Node) && t.has_level(Level::System));
    assert!(
        !t.has_level(Level::Package) && !t.has_level(Level::Switch) && !t.has_level(Level::Group)
    );
    assert_eq!(t.num_domains(Level::Device), 14);
    assert_eq!(t.num_domains(Level::Node), 4);
    assert_eq!(t.num_domains(Level::System), 1);
    assert_eq!(t.domain_size(Level::Node, 0), 4);
    assert_eq!(t.domain_size(Level::Node, 3), 2);
    assert_eq!(t.domain_size(Level::System, 0), 14);
    assert_eq!(t.domain_size(Level::Device, 13), 1);
    assert_eq!(t.max_domain_size(Level::Node), 4);
    assert_eq!(t.max_domain_size(Level::Device), 1);
    assert!(!t.is_uniform(Level::Node));
    assert!(t.is_uniform(Level::Device));
    assert!(t.is_uniform(Level::System));
}

#[test]
fn nodes_uneven_domains_and_ranks() {
    let t = preset("nodes:4x4,ranks=14");
    assert_eq!(t.ranks(Level::Node, 0), [0, 1, 2, 3]);
    assert_eq!(t.ranks(Level::Node, 2), [8, 9, 10, 11]);
    assert_eq!(t.ranks(Level::Node, 3), [12, 13]);
    assert_eq!(t.ranks(Level::Device, 9), [9]);
    assert_eq!(t.ranks(Level::System, 0), (0..14).collect::<Vec<u32>>());
    assert_eq!(t.domain(7, Level::Node), 1);
    assert_eq!(t.domain(8, Level::Node), 2);
    assert_eq!(t.domain(13, Level::Node), 3);
    assert_eq!(t.domain(13, Level::Device), 13);
    assert_eq!(t.domain(13, Level::System), 0);
    assert_eq!(t.local_index(13, Level::Node), 1);
    assert_eq!(t.local_index(6, Level::Node), 2);
    assert_eq!(t.local_index(13, Level::System), 13);
    assert_eq!(t.local_index(13, Level::Device), 0);
    assert_eq!(t.leader(Level::Node, 2), 8);
    assert_eq!(t.leader(Level::Node, 3), 12);
    assert_eq!(t.leader(Level::System, 0), 0);
}

#[test]
fn nodes_uneven_meet_and_links() {
    let t = preset("nodes:4x4,ranks=14");
    assert_eq!(t.meet(13, 13), Level::Device);
    assert_eq!(t.meet(0, 3), Level::Node);
    assert_eq!(t.meet(12, 13), Level::Node);
    assert_eq!(t.meet(3, 4), Level::System);
    assert_eq!(t.meet(13, 0), Level::System);
    assert_eq!(t.link_between(0, 5), LinkClass::new(12.5e9, 5.0e-6));
    assert_eq!(t.link_between(4, 5), LinkClass::new(5e9, 1.0e-6));
    assert_eq!(t.link_between(5, 5), LinkClass::new(10e9, 0.0));
    assert_eq!(t.link(Level::Node), commodity::NODE);
}

#[test]
fn nodes_uneven_aligned_peer_wraps_into_smaller_last_node() {
    let t = preset("nodes:4x4,ranks=14");
    // Node 3 holds only ranks 12 and 13: local indices 0..3 wrap to 0, 1, 0, 1.
    assert_eq!(t.aligned_peer(0, Level::Node, 3), 12);
    assert_eq!(t.aligned_peer(1, Level::Node, 3), 13);
    assert_eq!(t.aligned_peer(2, Level::Node, 3), 12);
    assert_eq!(t.aligned_peer(3, Level::Node, 3), 13);
    assert_eq!(t.aligned_peer(7, Level::Node, 3), 13);
    // From the small node into a full one: no wrap needed.
    assert_eq!(t.aligned_peer(13, Level::Node, 0), 1);
    assert_eq!(t.aligned_peer(12, Level::Node, 2), 8);
    // A rank's own domain gives back the rank.
    assert_eq!(t.aligned_peer(5, Level::Node, 1), 5);
    assert_eq!(t.aligned_peer(9, Level::System, 0), 9);
}

#[test]
fn nodes_uneven_tree_navigation() {
    let t = preset("nodes:4x4,ranks=14");
    assert_eq!(t.parent(Level::Device, 13), 3);
    assert_eq!(t.parent(Level::Device, 4), 1);
    assert_eq!(t.parent(Level::Node, 3), 0);
    assert_eq!(t.children(Level::System, 0), [0, 1, 2, 3]);
    assert_eq!(t.children(Level::Node, 3), [12, 13]);
    assert_eq!(t.children(Level::Node, 1), [4, 5, 6, 7]);
    assert!(t.children(Level::Device, 5).is_empty());
    assert_eq!(t.outer(Level::Device), Some(Level::Node));
    assert_eq!(t.outer(Level::Node), Some(Level::System));
    assert_eq!(t.outer(Level::System), None);
    assert_eq!(t.inner(Level::System), Some(Level::Node));
    assert_eq!(t.inner(Level::Node), Some(Level::Device));
    assert_eq!(t.inner(Level::Device), None);
    // Absent levels have no neighbours.
    assert_eq!(t.outer(Level::Switch), None);
    assert_eq!(t.inner(Level::Package), None);
}

#[test]
fn nodes_uneven_nics_and_hosts() {
    let t = preset("nodes:4x4,ranks=14");
    assert_eq!(t.nics().len(), 4);
    let nic = t.nic_of(13).unwrap();
    assert_eq!(nic.name, "eth0");
    assert_eq!(nic.ranks, [12, 13]);
    assert_eq!(nic.bandwidth, 12.5e9);
    assert_eq!(nic.latency, 5.0e-6);
    assert_eq!(t.nic_of(5).unwrap().ranks, [4, 5, 6, 7]);
    let node3: Vec<_> = t.node_nics(3).collect();
    assert_eq!(node3.len(), 1);
    assert_eq!(node3[0].ranks, [12, 13]);
    assert_eq!(t.node_nics(0).next().unwrap().ranks, [0, 1, 2, 3]);
    assert_eq!(t.host(0), None);
    assert_eq!(t.host(13), None);
}

// ---------------------------------------------------------------------------------------
// frontier:5,ranks=37 — uneven package, node AND switch:
// packages r/2: 19, the last {36}; nodes r/8: 5, the last {32..36};
// switches node/4: {0..31} and {32..36}; one group.
// NICs: 4 per full node (hsn0..hsn3, 2 ranks each), node 4 has hsn0 {32,33},
// hsn1 {34,35}, hsn2 {36}: 19 in all.

#[test]
fn frontier_uneven_counts() {
    let t = preset("frontier:5,ranks=37");
    assert_eq!(t.size(), 37);
    assert_eq!(levels(&t), Level::ALL);
    assert_eq!(t.num_domains(Level::Device), 37);
    assert_eq!(t.num_domains(Level::Package), 19);
    assert_eq!(t.num_domains(Level::Node), 5);
    assert_eq!(t.num_domains(Level::Switch), 2);
    assert_eq!(t.num_domains(Level::Group), 1);
    assert_eq!(t.num_domains(Level::System), 1);
    assert_eq!(t.domain_size(Level::Package, 18), 1);
    assert_eq!(t.domain_size(Level::Package, 17), 2);
    assert_eq!(t.domain_size(Level::Node, 4), 5);
    assert_eq!(t.domain_size(Level::Switch, 0), 32);
    assert_eq!(t.domain_size(Level::Switch, 1), 5);
    assert_eq!(t.domain_size(Level::Group, 0), 37);
    assert_eq!(t.max_domain_size(Level::Package), 2);
    assert_eq!(t.max_domain_size(Level::Node), 8);
    assert_eq!(t.max_domain_size(Level::Switch), 32);
    for l in [Level::Package, Level::Node, Level::Switch] {
        assert!(!t.is_uniform(l), "{l}");
    }
    assert!(t.is_uniform(Level::Group));
}

#[test]
fn frontier_uneven_meet() {
    let t = preset("frontier:5,ranks=37");
    assert_eq!(t.meet(36, 36), Level::Device);
    assert_eq!(t.meet(0, 1), Level::Package);
    assert_eq!(t.meet(34, 35), Level::Package);
    assert_eq!(t.meet(1, 2), Level::Node);
    assert_eq!(t.meet(35, 36), Level::Node);
    assert_eq!(t.meet(0, 8), Level::Switch);
    assert_eq!(t.meet(31, 24), Level::Node);
    assert_eq!(t.meet(31, 16), Level::Switch);
    assert_eq!(t.meet(0, 32), Level::Group);
    assert_eq!(t.meet(36, 31), Level::Group);
    assert_eq!(t.link_between(0, 1), frontier::PACKAGE);
    assert_eq!(t.link_between(0, 2), frontier::NODE);
    assert_eq!(t.link_between(0, 8), frontier::SWITCH);
    assert_eq!(t.link_between(0, 32), LinkClass::new(25e9, 3.5e-6));
    assert_eq!(t.link(Level::Device), LinkClass::new(1.6e12, 0.0));
}

#[test]
fn frontier_uneven_local_index_leader_peer() {
    let t = preset("frontier:5,ranks=37");
    assert_eq!(t.local_index(36, Level::Package), 0);
    assert_eq!(t.local_index(35, Level::Package), 1);
    assert_eq!(t.local_index(36, Level::Node), 4);
    assert_eq!(t.local_index(36, Level::Switch), 4);
    assert_eq!(t.local_index(31, Level::Switch), 31);
    assert_eq!(t.local_index(36, Level::Group), 36);
    assert_eq!(t.leader(Level::Package, 18), 36);
    assert_eq!(t.leader(Level::Node, 4), 32);
    assert_eq!(t.leader(Level::Switch, 1), 32);
    // Into the 5-rank node / switch: local index mod 5.
    assert_eq!(t.aligned_peer(7, Level::Node, 4), 34); // 7 % 5 = 2
    assert_eq!(t.aligned_peer(13, Level::Node, 4), 32); // 5 % 5 = 0
    assert_eq!(t.aligned_peer(31, Level::Switch, 1), 33); // 31 % 5 = 1
    assert_eq!(t.aligned_peer(4, Level::Switch, 1), 36); // 4 % 5 = 4
    // Into the 1-rank package: always its only rank.
    assert_eq!(t.aligned_peer(1, Level::Package, 18), 36);
    assert_eq!(t.aligned_peer(0, Level::Package, 18), 36);
    // Out of the small node into a full one.
    assert_eq!(t.aligned_peer(36, Level::Node, 1), 12);
    assert_eq!(t.aligned_peer(36, Level::Switch, 0), 4);
}

#[test]
fn frontier_uneven_tree_navigation() {
    let t = preset("frontier:5,ranks=37");
    assert_eq!(t.parent(Level::Device, 36), 18);
    assert_eq!(t.parent(Level::Package, 18), 4);
    assert_eq!(t.parent(Level::Package, 3), 0);
    assert_eq!(t.parent(Level::Node, 4), 1);
    assert_eq!(t.parent(Level::Node, 3), 0);
    assert_eq!(t.parent(Level::Switch, 1), 0);
    assert_eq!(t.parent(Level::Group, 0), 0);
    assert_eq!(t.children(Level::Package, 18), [36]);
    assert_eq!(t.children(Level::Package, 0), [0, 1]);
    assert_eq!(t.children(Level::Node, 4), [16, 17, 18]);
    assert_eq!(t.children(Level::Node, 1), [4, 5, 6, 7]);
    assert_eq!(t.children(Level::Switch, 0), [0, 1, 2, 3]);
    assert_eq!(t.children(Level::Switch, 1), [4]);
    assert_eq!(t.children(Level::Group, 0), [0, 1]);
    assert_eq!(t.children(Level::System, 0), [0]);
    assert_eq!(t.outer(Level::Device), Some(Level::Package));
    assert_eq!(t.outer(Level::Package), Some(Level::Node));
    assert_eq!(t.outer(Level::Node), Some(Level::Switch));
    assert_eq!(t.outer(Level::Switch), Some(Level::Group));
    assert_eq!(t.outer(Level::Group), Some(Level::System));
    assert_eq!(t.inner(Level::Switch), Some(Level::Node));
    assert_eq!(t.inner(Level::Package), Some(Level::Device));
}

#[test]
fn frontier_uneven_nics() {
    let t = preset("frontier:5,ranks=37");
    assert_eq!(t.nics().len(), 19);
    let last = t.nic_of(36).unwrap();
    assert_eq!(last.name, "hsn2");
    assert_eq!(last.ranks, [36]);
    assert_eq!(last.bandwidth, 25e9);
    assert_eq!(last.latency, 2.5e-6);
    let n5 = t.nic_of(5).unwrap();
    assert_eq!(n5.name, "hsn2");
    assert_eq!(n5.ranks, [4, 5]);
    assert_eq!(t.nic_of(15).unwrap().name, "hsn3");
    assert_eq!(nic_names(t.node_nics(4)), ["hsn0", "hsn1", "hsn2"]);
    assert_eq!(nic_names(t.node_nics(1)), ["hsn0", "hsn1", "hsn2", "hsn3"]);
    assert_eq!(t.node_nics(1).next().unwrap().ranks, [8, 9]);
}

// ---------------------------------------------------------------------------------------
// frontier:2, flat:7, dgx-h100:2

#[test]
fn frontier_two_nodes() {
    let t = preset("frontier:2");
    assert_eq!(t.size(), 16);
    assert_eq!(t.meet(0, 1), Level::Package);
    assert_eq!(t.meet(0, 2), Level::Node);
    assert_eq!(t.meet(0, 8), Level::Switch);
    assert_eq!(t.meet(15, 8), Level::Node);
    assert_eq!(t.num_domains(Level::Switch), 1);
    assert_eq!(t.num_domains(Level::Group), 1);
    assert_eq!(t.aligned_peer(3, Level::Node, 1), 11);
    assert_eq!(t.aligned_peer(11, Level::Node, 0), 3);
    assert_eq!(t.aligned_peer(3, Level::Package, 7), 15);
    for l in Level::ALL {
        assert!(t.is_uniform(l), "{l}");
    }
    assert_eq!(t.children(Level::Switch, 0), [0, 1]);
    assert_eq!(t.nics().len(), 8);
    assert_eq!(nic_names(t.node_nics(1)), ["hsn0", "hsn1", "hsn2", "hsn3"]);
}

#[test]
fn flat_has_only_device_and_system() {
    let t = preset("flat:7");
    assert_eq!(t.size(), 7);
    assert_eq!(levels(&t), [Level::Device, Level::System]);
    assert!(!t.has_level(Level::Node));
    assert_eq!(t.meet(3, 3), Level::Device);
    assert_eq!(t.meet(0, 6), Level::System);
    assert_eq!(t.link_between(0, 6), commodity::SYSTEM);
    assert_eq!(t.num_domains(Level::Device), 7);
    assert_eq!(t.num_domains(Level::System), 1);
    assert_eq!(t.max_domain_size(Level::System), 7);
    assert_eq!(t.local_index(5, Level::System), 5);
    assert_eq!(t.aligned_peer(3, Level::System, 0), 3);
    assert_eq!(t.aligned_peer(3, Level::Device, 6), 6);
    assert_eq!(t.parent(Level::Device, 4), 0);
    assert_eq!(t.children(Level::System, 0), [0, 1, 2, 3, 4, 5, 6]);
    assert_eq!(t.outer(Level::Device), Some(Level::System));
    assert_eq!(t.inner(Level::System), Some(Level::Device));
    assert!(t.nics().is_empty());
    assert!(t.nic_of(0).is_none());
    assert_eq!(t.node_nics(0).count(), 0);
}

#[test]
#[should_panic(expected = "has no node level")]
fn query_on_absent_level_panics_with_its_name() {
    let t = preset("flat:7");
    let _ = t.num_domains(Level::Node);
}

#[test]
#[should_panic]
fn system_has_no_parent() {
    let t = preset("flat:7");
    let _ = t.parent(Level::System, 0);
}

#[test]
fn dgx_one_nic_per_gpu() {
    let t = preset("dgx-h100:2");
    assert_eq!(t.size(), 16);
    assert_eq!(levels(&t), [Level::Device, Level::Node, Level::System]);
    assert_eq!(t.meet(0, 7), Level::Node);
    assert_eq!(t.meet(0, 8), Level::System);
    assert_eq!(t.link(Level::Node), LinkClass::new(450e9, 1.0e-6));
    assert_eq!(t.link_between(7, 8), LinkClass::new(50e9, 3.0e-6));
    assert_eq!(t.nics().len(), 16);
    let n9 = t.nic_of(9).unwrap();
    assert_eq!(n9.name, "mlx5_1");
    assert_eq!(n9.ranks, [9]);
    assert_eq!(n9.bandwidth, 50e9);
    assert_eq!(
        nic_names(t.node_nics(1)),
        [
            "mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7"
        ]
    );
    assert_eq!(t.node_nics(1).next().unwrap().ranks, [8]);
    assert_eq!(t.aligned_peer(2, Level::Node, 1), 10);
}

// ---------------------------------------------------------------------------------------
// tests/data/hand.toml: node labels 10, 3, 7 -> nodes 3 -> 0 {1,4,5}, 7 -> 1 {2,6},
// 10 -> 2 {0,3}; switch labels 5 -> 0 {0,2,3,6}, 9 -> 1 {1,4,5}.

#[test]
fn hand_file_labels_renumbered_ascending() {
    let t = hand();
    assert_eq!(t.name(), "hand");
    assert_eq!(t.size(), 7);
    assert_eq!(
        levels(&t),
        [Level::Device, Level::Node, Level::Switch, Level::System]
    );
    assert_eq!(t.num_domains(Level::Node), 3);
    assert_eq!(t.num_domains(Level::Switch), 2);
    assert_eq!(t.domain(0, Level::Node), 2);
    assert_eq!(t.domain(1, Level::Node), 0);
    assert_eq!(t.domain(2, Level::Node), 1);
    assert_eq!(t.ranks(Level::Node, 0), [1, 4, 5]);
    assert_eq!(t.ranks(Level::Node, 1), [2, 6]);
    assert_eq!(t.ranks(Level::Node, 2), [0, 3]);
    assert_eq!(t.ranks(Level::Switch, 0), [0, 2, 3, 6]);
    assert_eq!(t.ranks(Level::Switch, 1), [1, 4, 5]);
    assert_eq!(t.domain(6, Level::Switch), 0);
    assert_eq!(t.domain(4, Level::Switch), 1);
    assert_eq!(t.max_domain_size(Level::Node), 3);
    assert!(!t.is_uniform(Level::Node));
    assert!(!t.is_uniform(Level::Switch));
}

#[test]
fn hand_file_tree() {
    let t = hand();
    assert_eq!(t.parent(Level::Node, 0), 1);
    assert_eq!(t.parent(Level::Node, 1), 0);
    assert_eq!(t.parent(Level::Node, 2), 0);
    assert_eq!(t.children(Level::Switch, 0), [1, 2]);
    assert_eq!(t.children(Level::Switch, 1), [0]);
    assert_eq!(t.children(Level::System, 0), [0, 1]);
    assert_eq!(t.children(Level::Node, 0), [1, 4, 5]);
    assert_eq!(t.outer(Level::Node), Some(Level::Switch));
    assert_eq!(t.inner(Level::Switch), Some(Level::Node));
    assert_eq!(t.outer(Level::Switch), Some(Level::System));
}

#[test]
fn hand_file_queries() {
    let t = hand();
    assert_eq!(t.meet(0, 3), Level::Node);
    assert_eq!(t.meet(4, 5), Level::Node);
    assert_eq!(t.meet(0, 2), Level::Switch);
    assert_eq!(t.meet(3, 6), Level::Switch);
    assert_eq!(t.meet(0, 1), Level::System);
    assert_eq!(t.local_index(5, Level::Node), 2);
    assert_eq!(t.local_index(6, Level::Node), 1);
    assert_eq!(t.local_index(6, Level::Switch), 3);
    assert_eq!(t.local_index(3, Level::Switch), 2);
    assert_eq!(t.leader(Level::Node, 0), 1);
    assert_eq!(t.leader(Level::Node, 2), 0);
    assert_eq!(t.aligned_peer(5, Level::Node, 1), 2); // index 2 wraps to 0 in {2,6}
    assert_eq!(t.aligned_peer(6, Level::Node, 0), 4); // index 1 in {1,4,5}
    assert_eq!(t.aligned_peer(6, Level::Switch, 1), 1); // index 3 wraps to 0 in {1,4,5}
    assert_eq!(t.aligned_peer(4, Level::Switch, 0), 2); // index 1 in {0,2,3,6}
    let sys = t.link(Level::System);
    assert_eq!(sys.taper, 2.0);
    assert_eq!(sys.sustained_bandwidth(), 2.5e8);
    assert_eq!(t.link_between(0, 3), LinkClass::new(2e10, 1e-6));
}

#[test]
fn hand_file_hosts_and_nics() {
    let t = hand();
    assert_eq!(t.host(0), Some("c"));
    assert_eq!(t.host(3), Some("c"));
    assert_eq!(t.host(1), Some("a"));
    assert_eq!(t.host(6), Some("b"));
    assert_eq!(t.nics().len(), 2);
    let ib0 = t.nic_of(5).unwrap();
    assert_eq!(ib0.name, "ib0");
    assert_eq!(ib0.ranks, [1, 5]); // given as [5, 1]: kept ascending
    assert_eq!(ib0.latency, 2e-6);
    assert_eq!(t.nic_of(1).unwrap().name, "ib0");
    assert!(t.nic_of(4).is_none());
    let ib1 = t.nic_of(3).unwrap();
    assert_eq!(ib1.name, "ib1");
    assert_eq!(ib1.latency, 0.0); // default
    assert_eq!(nic_names(t.node_nics(0)), ["ib0"]);
    assert_eq!(t.node_nics(1).count(), 0);
    assert_eq!(nic_names(t.node_nics(2)), ["ib1"]);
}

#[test]
fn hand_file_json_equals_toml() {
    let json =
        Topology::load(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/hand.json")).unwrap();
    assert_eq!(json, hand());
}

#[test]
fn render_tree_and_summary() {
    let t = hand();
    let tree = t.render_tree(4);
    assert!(tree.starts_with("Topology hand (7 ranks)\n"), "{tree}");
    assert!(tree.contains("node 0 a: 3 ranks, NICs ib0"), "{tree}");
    assert!(tree.contains("node 1 b: 2 ranks\n"), "{tree}");
    assert!(tree.contains("rank 5  nic ib0"), "{tree}");
    let small = preset("frontier:5,ranks=37").render_tree(2);
    assert!(
        small.contains("\n          ... 1 more package\n"),
        "{small}"
    );
    assert!(small.contains("\n        ... 2 more nodes\n"), "{small}");
    let f = preset("frontier:16");
    let tree = f.render_tree(2);
    assert!(tree.contains("  ... 2 more switches\n"), "{tree}");
    let summary = f.summary();
    let lines: Vec<&str> = summary.lines().collect();
    assert_eq!(lines.len(), 7, "{summary}"); // six levels and the NICs
    assert!(lines[0].starts_with("system "), "{summary}");
    assert!(lines[0].contains("taper 1.75:1"), "{summary}");
    assert!(
        lines[3].starts_with("node ") && lines[3].contains("16 domains"),
        "{summary}"
    );
    assert!(
        lines[6].starts_with("nics ") && lines[6].contains("64 NICs"),
        "{summary}"
    );
    let uneven = preset("nodes:4x4,ranks=14").summary();
    assert!(uneven.contains("2..4 ranks each (uneven)"), "{uneven}");
}

// ---------------------------------------------------------------------------------------
// Frontier facts (docs/REFERENCE.md §2).

#[test]
fn frontier_16_facts() {
    let t = preset("frontier:16");
    assert_eq!(t.size(), 128);
    assert_eq!(t.num_domains(Level::Package), 64);
    assert_eq!(t.num_domains(Level::Node), 16);
    assert_eq!(t.num_domains(Level::Switch), 4);
    assert_eq!(t.num_domains(Level::Group), 1);
    assert_eq!(t.nics().len(), 64);
    for nic in t.nics() {
        assert_eq!(nic.ranks.len(), 2, "{}", nic.name);
        assert_eq!(
            t.meet(nic.ranks[0], nic.ranks[1]),
            Level::Package,
            "{}",
            nic.name
        );
        assert_eq!(nic.bandwidth, 25e9);
    }
    for r in 0..128 {
        assert!(t.nic_of(r).unwrap().ranks.contains(&r));
    }
    for node in 0..16 {
        assert_eq!(t.node_nics(node).count(), 4);
    }
    let sys = t.link(Level::System);
    assert_eq!(sys.taper, 1.75);
    assert_eq!(sys.bandwidth, 25e9);
    assert_eq!(sys.sustained_bandwidth(), 25e9 / 1.75);
    assert_eq!(t.link(Level::Package).bandwidth, 200e9);
    assert_eq!(t.link(Level::Node).bandwidth, 50e9);
    assert_eq!(t.link(Level::Switch).bandwidth, 25e9);
    for l in Level::ALL {
        assert!(t.is_uniform(l), "{l}");
    }
    assert_eq!(t.domain_size(Level::Switch, 3), 32);
}

#[test]
fn frontier_130_has_two_uneven_groups() {
    let t = preset("frontier:130");
    assert_eq!(t.size(), 1040);
    assert_eq!(t.num_domains(Level::Node), 130);
    assert_eq!(t.num_domains(Level::Switch), 33); // 32 full switches and one of 2 nodes
    assert_eq!(t.num_domains(Level::Group), 2);
    assert_eq!(t.domain_size(Level::Group, 0), 1024);
    assert_eq!(t.domain_size(Level::Group, 1), 16);
    assert_eq!(t.domain_size(Level::Switch, 32), 16);
    assert!(!t.is_uniform(Level::Group));
    assert!(!t.is_uniform(Level::Switch));
    assert!(t.is_uniform(Level::Node));
    assert_eq!(t.children(Level::Group, 1), [32]);
    assert_eq!(t.children(Level::Group, 0), (0..32).collect::<Vec<u32>>());
    assert_eq!(t.children(Level::Switch, 32), [128, 129]);
    assert_eq!(t.meet(0, 1023), Level::Group);
    assert_eq!(t.meet(0, 1024), Level::System);
    assert_eq!(t.link_between(0, 1024).taper, 1.75);
    assert_eq!(t.aligned_peer(1000, Level::Group, 1), 1024 + 1000 % 16);
    assert_eq!(t.nics().len(), 520);
}

// ---------------------------------------------------------------------------------------
// Preset strings.

fn preset_err(spec: &str) -> String {
    match Topology::preset(spec) {
        Err(TopologyError::Preset { spec: s, reason }) => {
            assert_eq!(s, spec);
            reason
        }
        Err(other) => panic!("{spec}: expected a Preset error, got {other:?}"),
        Ok(t) => panic!("{spec}: expected an error, got {} ranks", t.size()),
    }
}

#[test]
fn bad_presets() {
    assert!(preset_err("bogus:3").contains("unknown preset 'bogus'"));
    assert!(preset_err("frontier").contains("expected NAME:ARGS"));
    assert!(preset_err("nodes:4").contains("HxR"));
    assert!(preset_err("nodes:0x2").contains("H must be at least 1"));
    assert!(preset_err("nodes:2x0").contains("R must be at least 1"));
    assert!(preset_err("frontier:abc").contains("'abc' is not a positive integer"));
    assert!(preset_err("flat:-3").contains("not a positive integer"));
    assert!(preset_err("flat:4,ranks=0").contains("ranks must be at least 1"));
    assert!(preset_err("nodes:2x2,ranks=5").contains("ranks=5 is more than the 4 ranks"));
    assert!(preset_err("flat:16777217").contains("more than this library supports"));
    // Each factor is allowed but the product is not; this must not try to build 2^48 ranks.
    assert!(preset_err("nodes:16777216x16777216").contains("more than 16,777,216 ranks"));
    assert!(preset_err("frontier:3000000").contains("more than 16,777,216 ranks"));
}

#[test]
fn huge_preset_cut_down_with_ranks_is_cheap() {
    let t = preset("frontier:16777216,ranks=12");
    assert_eq!(t.size(), 12);
    assert_eq!(t.name(), "frontier:16777216,ranks=12");
    assert_eq!(t.num_domains(Level::Node), 2);
    assert_eq!(t.nics().len(), 6); // hsn0..hsn3 on node 0, hsn0 and hsn1 on node 1
}

#[test]
fn preset_names() {
    assert_eq!(preset("flat:3").name(), "flat:3");
    assert_eq!(preset("nodes:3x5,ranks=13").name(), "nodes:3x5,ranks=13");
    assert_eq!(preset("dgx-h100:1").size(), 8);
    assert_eq!(preset("nodes:3x5,ranks=13").domain_size(Level::Node, 2), 3);
}

// ---------------------------------------------------------------------------------------
// Property tests over random trees.

/// A generated machine: groups of switches of nodes of packages, each package a number
/// of ranks; which inner levels are present; and how ranks and file entries are shuffled.
#[derive(Debug, Clone)]
struct Machine {
    tree: Vec<Vec<Vec<Vec<usize>>>>,
    present: [bool; 4], // package, node, switch, group
    hosts: bool,
    nic_per_node: bool,
    /// rank number of the i-th generated device
    numbering: Vec<usize>,
    /// file order of the entries
    order: Vec<usize>,
    /// labels are `scale * id + offset` (scale 0 means reversed: `1000 - id`)
    scale: i64,
    offset: i64,
}

/// Path (group, switch, node, package) of every generated device, in generation order.
fn paths(tree: &[Vec<Vec<Vec<usize>>>]) -> Vec<[usize; 4]> {
    let mut out = Vec::new();
    let (mut s_id, mut n_id, mut p_id) = (0, 0, 0);
    for (g, switches) in tree.iter().enumerate() {
        for nodes in switches {
            for packages in nodes {
                for &count in packages {
                    for _ in 0..count {
                        out.push([g, s_id, n_id, p_id]);
                    }
                    p_id += 1;
                }
                n_id += 1;
            }
            s_id += 1;
        }
    }
    out
}

fn machine() -> impl Strategy<Value = Machine> {
    let tree = prop::collection::vec(
        prop::collection::vec(
            prop::collection::vec(prop::collection::vec(1usize..4, 1..4), 1..4),
            1..3,
        ),
        1..3,
    );
    (
        tree,
        any::<[bool; 4]>(),
        any::<bool>(),
        any::<bool>(),
        0i64..4,
        0i64..50,
    )
        .prop_flat_map(|(tree, present, hosts, nic_per_node, scale, offset)| {
            let n = paths(&tree).len();
            let ids: Vec<usize> = (0..n).collect();
            (Just(ids.clone()).prop_shuffle(), Just(ids).prop_shuffle()).prop_map(
                move |(numbering, order)| Machine {
                    tree: tree.clone(),
                    present,
                    hosts,
                    nic_per_node,
                    numbering,
                    order,
                    scale,
                    offset,
                },
            )
        })
}

const INNER: [Level; 4] = [Level::Package, Level::Node, Level::Switch, Level::Group];

impl Machine {
    /// Path per rank (indexed by rank, not by generation order).
    fn rank_paths(&self) -> Vec<[usize; 4]> {
        let gen_paths = paths(&self.tree);
        let mut out = vec![[0; 4]; gen_paths.len()];
        for (i, p) in gen_paths.iter().enumerate() {
            out[self.numbering[i]] = *p;
        }
        out
    }

    fn label(&self, id: usize) -> i64 {
        if self.scale == 0 {
            1000 - id as i64
        } else {
            self.scale * id as i64 + self.offset
        }
    }

    fn spec(&self) -> TopologySpec {
        let paths = self.rank_paths();
        let mut links = BTreeMap::new();
        links.insert("device".to_string(), LinkClass::new(1e12, 0.0));
        links.insert("system".to_string(), LinkClass::new(1e9, 5e-6).tapered(1.5));
        for (k, l) in INNER.iter().enumerate() {
            if self.present[k] {
                links.insert(
                    l.name().to_string(),
                    LinkClass::new(1e11 / (k + 1) as f64, 1e-6),
                );
            }
        }
        let entries: Vec<RankSpec> = (0..paths.len())
            .map(|r| {
                let [g, s, n, p] = paths[r];
                let ids = [p, n, s, g];
                let mut domains = BTreeMap::new();
                for (k, l) in INNER.iter().enumerate() {
                    if self.present[k] {
                        domains.insert(l.name().to_string(), self.label(ids[k]));
                    }
                }
                RankSpec {
                    rank: r as i64,
                    host: self.hosts.then(|| format!("host{n}")),
                    domains,
                }
            })
            .collect();
        let ranks = self.order.iter().map(|&i| entries[i].clone()).collect();
        let mut nics = Vec::new();
        if self.nic_per_node {
            let nodes = paths.iter().map(|p| p[2]).max().unwrap() + 1;
            for node in (0..nodes).rev() {
                nics.push(halo_topology::spec::NicSpec {
                    name: format!("nic{node}"),
                    bandwidth: 2e10,
                    latency: 2e-6,
                    ranks: (0..paths.len())
                        .filter(|&r| paths[r][2] == node)
                        .map(|r| r as i64)
                        .collect(),
                });
            }
        }
        TopologySpec {
            name: "random".into(),
            links,
            ranks,
            nics,
        }
    }

    /// The innermost present level whose domain holds both ranks, from the paths.
    fn expected_meet(&self, a: usize, b: usize) -> Level {
        if a == b {
            return Level::Device;
        }
        let paths = self.rank_paths();
        let (pa, pb) = (paths[a], paths[b]);
        // index into [g, s, n, p]: package 3, node 2, switch 1, group 0
        for (k, l) in INNER.iter().enumerate() {
            if self.present[k] && pa[3 - k] == pb[3 - k] {
                return *l;
            }
        }
        Level::System
    }

    /// Number of distinct domains at an inner level, from the generator.
    fn expected_domains(&self, k: usize) -> usize {
        let mut ids: Vec<usize> = self.rank_paths().iter().map(|p| p[3 - k]).collect();
        ids.sort_unstable();
        ids.dedup();
        ids.len()
    }
}

/// Every invariant of the model on one generated machine.
fn check_invariants(m: &Machine) -> Result<(), TestCaseError> {
    let spec = m.spec();
    let t = spec.build().unwrap();
    let n = t.size();
    prop_assert_eq!(n, m.numbering.len());
    prop_assert_eq!(t.num_domains(Level::Device), n);
    prop_assert_eq!(t.num_domains(Level::System), 1);
    for (k, l) in INNER.iter().enumerate() {
        prop_assert_eq!(t.has_level(*l), m.present[k]);
        if m.present[k] {
            prop_assert_eq!(t.num_domains(*l), m.expected_domains(k));
        }
    }
    for l in t.levels() {
        // Members of the domains partition the ranks; each list ascending, and the
        // local index is the position in it.
        let mut seen = vec![false; n];
        let mut max = 0;
        let mut sizes = Vec::new();
        for d in 0..t.num_domains(l) {
            let members = t.ranks(l, d);
            prop_assert!(!members.is_empty());
            prop_assert!(members.windows(2).all(|w| w[0] < w[1]));
            prop_assert_eq!(t.leader(l, d), members[0] as usize);
            prop_assert_eq!(t.domain_size(l, d), members.len());
            max = max.max(members.len());
            sizes.push(members.len());
            for (i, &r) in members.iter().enumerate() {
                let r = r as usize;
                prop_assert!(!seen[r]);
                seen[r] = true;
                prop_assert_eq!(t.domain(r, l), d);
                prop_assert_eq!(t.local_index(r, l), i);
            }
        }
        prop_assert!(seen.iter().all(|&s| s));
        prop_assert_eq!(t.max_domain_size(l), max);
        prop_assert_eq!(t.is_uniform(l), sizes.iter().all(|&s| s == sizes[0]));
        // Rank-aligned peers land in the target domain at the wrapped index.
        for r in 0..n {
            for d in 0..t.num_domains(l) {
                let peer = t.aligned_peer(r, l, d);
                prop_assert_eq!(t.domain(peer, l), d);
                prop_assert_eq!(
                    t.local_index(peer, l),
                    t.local_index(r, l) % t.domain_size(l, d)
                );
            }
        }
        // Parent and children agree.
        match t.outer(l) {
            Some(o) => {
                prop_assert_eq!(t.inner(o), Some(l));
                let mut total = 0;
                for pd in 0..t.num_domains(o) {
                    let kids = t.children(o, pd);
                    prop_assert!(!kids.is_empty());
                    prop_assert!(kids.windows(2).all(|w| w[0] < w[1]));
                    total += kids.len();
                    for &c in kids {
                        prop_assert_eq!(t.parent(l, c as usize), pd);
                    }
                }
                prop_assert_eq!(total, t.num_domains(l));
                for r in 0..n {
                    prop_assert_eq!(t.domain(r, o), t.parent(l, t.domain(r, l)));
                }
            }
            None => prop_assert_eq!(l, Level::System),
        }
    }
    prop_assert!(t.children(Level::Device, 0).is_empty());
    // meet: symmetric, Device on the diagonal, and what the generator says.
    for a in 0..n {
        prop_assert_eq!(t.meet(a, a), Level::Device);
        for b in 0..n {
            let l = t.meet(a, b);
            prop_assert_eq!(l, t.meet(b, a));
            prop_assert_eq!(l, m.expected_meet(a, b));
            prop_assert_eq!(t.domain(a, l), t.domain(b, l));
            prop_assert_eq!(t.link_between(a, b), t.link(l));
        }
    }
    // Hosts and NICs.
    let paths = m.rank_paths();
    for (r, path) in paths.iter().enumerate() {
        let node = path[2];
        let host = format!("host{node}");
        prop_assert_eq!(t.host(r), m.hosts.then_some(host.as_str()));
        match t.nic_of(r) {
            Some(nic) => {
                prop_assert!(m.nic_per_node);
                prop_assert_eq!(&nic.name, &format!("nic{node}"));
                prop_assert!(nic.ranks.contains(&r));
            }
            None => prop_assert!(!m.nic_per_node),
        }
    }
    // Round trips: TOML and JSON of the built topology, and of the spec as written.
    let back = TopologySpec::from_toml_str(&t.to_spec().to_toml_string())
        .unwrap()
        .build()
        .unwrap();
    prop_assert_eq!(&back, &t);
    let back = TopologySpec::from_json_str(&t.to_spec().to_json_string())
        .unwrap()
        .build()
        .unwrap();
    prop_assert_eq!(&back, &t);
    let reread = TopologySpec::from_toml_str(&spec.to_toml_string()).unwrap();
    prop_assert_eq!(&reread, &spec);
    prop_assert_eq!(&reread.build().unwrap(), &t);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn random_trees_hold_invariants(m in machine()) {
        check_invariants(&m)?;
    }
}

/// The simulator and the in-process emulation agree on inter-node messages only while no
/// level above the node has a link slower than the NICs (the emulation caps each message
/// at the meeting level's link bandwidth, the simulator does not: docs/SIMULATION.md,
/// "The system level's bandwidth"). Every preset keeps them in agreement.
#[test]
fn presets_have_no_outer_link_slower_than_their_nics() {
    for spec in [
        "flat:8",
        "nodes:4x4",
        "frontier:2",
        "frontier:128",
        "dgx-h100:2",
    ] {
        let t = preset(spec);
        for nic in t.nics() {
            for level in [Level::Switch, Level::Group, Level::System] {
                if t.has_level(level) {
                    assert!(
                        t.link(level).bandwidth >= nic.bandwidth,
                        "{spec}: the {level:?} link ({} B/s) is slower than NIC {} ({} B/s)",
                        t.link(level).bandwidth,
                        nic.name,
                        nic.bandwidth
                    );
                }
            }
        }
    }
}
