//! The hand-written topology file (labels renumbered, queries, JSON equals TOML),
//! the rendered tree, Frontier's figures and preset strings with their errors.
//!
//! Expected values are worked out by hand in the comments, not re-derived with the
//! model's own logic.

mod model_support;

use halo_topology::{Level, LinkClass, Topology, TopologyError};

use model_support::{hand, levels, nic_names, preset};

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
