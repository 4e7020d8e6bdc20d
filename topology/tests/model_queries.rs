//! Queries of the topology model on even and uneven preset trees: levels, domains,
//! meets, links, tree navigation, NICs and hosts.
//!
//! Expected values are worked out by hand in the comments, not re-derived with the
//! model's own logic.

mod model_support;

use halo_topology::{Level, LinkClass, commodity, frontier};

use model_support::{levels, nic_names, preset};

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
