//! The links inside a node where a node is not uniform: the presets' matrices (the
//! real MI250X pattern of a Frontier node, a fully connected MI300X node, the uniform
//! DGX), their round trip through TOML and JSON, the queries, and the errors of a bad
//! `[node_links]`.

use halo_topology::{Topology, TopologySpec, frontier, mi300x};

fn preset(spec: &str) -> Topology {
    Topology::preset(spec).unwrap()
}

#[test]
fn frontier_nodes_carry_the_mi250x_pattern() {
    let t = preset("frontier:2");
    let m = t.node_links().expect("frontier has node links");
    assert_eq!(m.size(), 8);
    assert_eq!(m.link().bandwidth, 50e9);
    let want: Vec<Vec<u32>> = frontier::GCD_LINKS.iter().map(|r| r.to_vec()).collect();
    assert_eq!(m.matrix(), want.as_slice());
    // Rank pairs, in both nodes: 4 inside a package, 2, 1 or none across.
    for base in [0, 8] {
        assert_eq!(t.links_between(base, base + 1), Some(4));
        assert_eq!(t.links_between(base + 6, base), Some(2));
        assert_eq!(t.links_between(base + 2, base + 4), Some(2));
        assert_eq!(t.links_between(base, base + 2), Some(1));
        assert_eq!(t.links_between(base + 1, base + 5), Some(1));
        assert_eq!(t.links_between(base, base + 3), Some(0));
        assert_eq!(t.links_between(base + 3, base + 3), None);
    }
    assert_eq!(t.links_between(0, 8), None, "different nodes");
    // Every GCD: 7 links if even, 6 if odd (plus its CPU link, not modelled here).
    let per_gcd: Vec<u32> = (0..8).map(|i| m.matrix()[i].iter().sum()).collect();
    assert_eq!(per_gcd, [7, 6, 7, 6, 7, 6, 7, 6]);
    let table = t.node_links_table().unwrap();
    assert!(
        table.contains("one link 50.0 GB/s per direction"),
        "{table}"
    );
    assert!(table.contains("    0  -  4  1  .  .  .  2  ."), "{table}");
}

#[test]
fn mi300x_is_fully_connected_and_dgx_is_uniform() {
    let t = preset("mi300x:2");
    assert_eq!(t.size(), 16);
    let m = t.node_links().unwrap();
    assert_eq!(m.link().bandwidth, mi300x::XGMI_LINK.bandwidth);
    for a in 0..8 {
        for b in 0..8 {
            assert_eq!(m.links(a, b), u32::from(a != b));
        }
    }
    assert_eq!(t.links_between(9, 15), Some(1));
    assert_eq!(t.nics().len(), 16);
    assert!(preset("dgx-h100:2").node_links().is_none());
    assert!(preset("nodes:2x4").node_links().is_none());
    assert!(preset("dgx-h100:1").node_links_table().is_none());
}

#[test]
fn node_links_round_trip_through_toml_and_json() {
    for spec in ["frontier:2", "frontier:1,ranks=5", "mi300x:1"] {
        let t = preset(spec);
        let toml = t.to_spec().to_toml_string();
        assert!(toml.contains("[node_links]"), "{toml}");
        let back = TopologySpec::from_toml_str(&toml).unwrap().build().unwrap();
        assert_eq!(back, t, "{spec} through TOML");
        let json = t.to_spec().to_json_string();
        let back = TopologySpec::from_json_str(&json).unwrap().build().unwrap();
        assert_eq!(back, t, "{spec} through JSON");
    }
    // A cut node keeps the first rows: rank 4 of frontier:1,ranks=5 is GCD 4.
    let t = preset("frontier:1,ranks=5");
    assert_eq!(t.links_between(2, 4), Some(2));
}

/// The file of nodes:2x3 with `node_links` appended.
fn two_nodes_of_3(node_links: &str) -> String {
    format!(
        "[links.device]\nbandwidth = 1e10\nlatency = 0.0\n\
         [links.node]\nbandwidth = 5e9\nlatency = 1e-6\n\
         [links.system]\nbandwidth = 1e9\nlatency = 5e-6\n\
         [[ranks]]\nrank = 0\nnode = 0\n[[ranks]]\nrank = 1\nnode = 0\n[[ranks]]\nrank = 2\nnode = 0\n\
         [[ranks]]\nrank = 3\nnode = 1\n[[ranks]]\nrank = 4\nnode = 1\n[[ranks]]\nrank = 5\nnode = 1\n\
         {node_links}"
    )
}

/// [`two_nodes_of_3`] built: the error.
fn error_with(node_links: &str) -> String {
    match TopologySpec::from_toml_str(&two_nodes_of_3(node_links)).and_then(|s| s.build()) {
        Ok(_) => panic!("built with {node_links}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn bad_node_links_are_errors_naming_the_field() {
    let link = "[node_links.link]\nbandwidth = 5e10\nlatency = 1e-6\n";
    let good = format!("[node_links]\nmatrix = [[0, 2, 1], [2, 0, 0], [1, 0, 0]]\n{link}");
    // The good one builds.
    let text = error_with_ok(&good);
    assert_eq!(text.links_between(0, 1), Some(2));
    assert_eq!(text.links_between(4, 5), Some(0));
    for (bad, want) in [
        (
            "matrix = [[0, 2], [2, 0, 1], [1, 0, 0]]",
            "node_links.matrix[0]: has 2 entries, but the matrix has 3 rows",
        ),
        (
            "matrix = [[1, 2, 1], [2, 0, 0], [1, 0, 0]]",
            "node_links.matrix[0][0]: is 1: a rank has no link to itself (0)",
        ),
        (
            "matrix = [[0, 2, 1], [3, 0, 0], [1, 0, 0]]",
            "node_links.matrix[0][1]: is 2, but node_links.matrix[1][0] is 3",
        ),
        (
            "matrix = [[0, 2], [2, 0]]",
            "node_links.matrix: has 2 rows, but a node has 3 ranks",
        ),
        ("matrix = []", "node_links.matrix: empty"),
    ] {
        let e = error_with(&format!("[node_links]\n{bad}\n{link}"));
        assert!(e.contains(want), "{bad}: {e}");
    }
    let e = error_with(
        "[node_links]\nmatrix = [[0, 1, 1], [1, 0, 1], [1, 1, 0]]\n\
         [node_links.link]\nbandwidth = -1.0\nlatency = 0.0\n",
    );
    assert!(e.contains("node_links.link.bandwidth"), "{e}");
    let e = error_with("[node_links]\nmatrix = [[0]]\nextra = 1\n");
    assert!(e.contains("extra"), "{e}");
}

fn error_with_ok(node_links: &str) -> Topology {
    TopologySpec::from_toml_str(&two_nodes_of_3(node_links))
        .unwrap()
        .build()
        .unwrap()
}

#[test]
fn node_links_need_a_node_level() {
    let mut spec = halo_topology::preset_spec("flat:3").unwrap();
    spec.node_links = preset("mi300x:1").to_spec().node_links;
    let e = spec.build().unwrap_err().to_string();
    assert!(
        e.contains("node_links: the topology has no node level"),
        "{e}"
    );
}
