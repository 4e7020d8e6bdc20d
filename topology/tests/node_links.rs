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
    assert!(
        table.contains("routed over: 0-3 via 1, 0-4 via 2, 0-5 via 1, 0-7 via 6, 1-2 via 0,"),
        "{table}"
    );
    assert!(
        table.contains("busiest link with 4 transfers per link"),
        "{table}"
    );
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

#[test]
fn routes_take_the_direct_link_else_the_widest_fewest_hops() {
    let t = preset("frontier:1");
    let m = t.node_links().unwrap();
    for i in 0..8 {
        assert!(m.route(i, i).is_empty());
        for j in (0..8).filter(|&j| j != i) {
            let r = m.route(i, j);
            if m.links(i, j) > 0 {
                assert_eq!(r, vec![(i, j)], "{i}->{j} has a link");
            } else {
                // Every unlinked pair of a Frontier node is two hops apart.
                assert_eq!(r.len(), 2, "{i}->{j}: {r:?}");
                assert_eq!((r[0].0, r[1].1), (i, j));
                assert_eq!(r[0].1, r[1].0);
                assert!(m.links(r[0].0, r[0].1) > 0 && m.links(r[1].0, r[1].1) > 0);
            }
        }
    }
    // 0 -> 7: over GCD 6 (2 links, then the quad link) rather than nothing wider.
    assert_eq!(m.route(0, 7), vec![(0, 6), (6, 7)]);
    // 0 -> 3: over GCD 1 or GCD 2, both a single link at the thinnest: the lower.
    assert_eq!(m.route(0, 3), vec![(0, 1), (1, 3)]);
    // 3 -> 4: over GCD 2 (quad, then dual).
    assert_eq!(m.route(3, 4), vec![(3, 2), (2, 4)]);
    // An all-to-all inside the node: the busiest single link carries 4 transfers (its
    // own and three routed over it); a fully connected MI300X node 1 each.
    assert_eq!(m.exchange_load(8), 4.0);
    assert_eq!(
        m.exchange_load(2),
        0.25,
        "GCDs 0 and 1: one transfer on 4 links"
    );
    assert_eq!(m.exchange_load(1), 0.0);
    assert_eq!(
        preset("mi300x:1").node_links().unwrap().exchange_load(8),
        1.0
    );
}

#[test]
fn routes_over_a_chain_and_between_parts_that_never_meet() {
    let link = "[node_links.link]\nbandwidth = 5e10\nlatency = 1e-6\n";
    // A chain 0 - 1 - 2 inside each node of 3.
    let chain = format!("[node_links]\nmatrix = [[0, 2, 0], [2, 0, 1], [0, 1, 0]]\n{link}");
    let t = TopologySpec::from_toml_str(&two_nodes_of_3(&chain))
        .and_then(|s| s.build())
        .unwrap();
    let m = t.node_links().unwrap();
    assert_eq!(m.route(0, 2), vec![(0, 1), (1, 2)]);
    assert_eq!(m.route(2, 0), vec![(2, 1), (1, 0)]);
    // The single link 1 -> 2 carries 1 -> 2 and 0 -> 2.
    assert_eq!(m.exchange_load(3), 2.0);
    // Rank 2 on its own: no path to it.
    let apart = format!("[node_links]\nmatrix = [[0, 2, 0], [2, 0, 0], [0, 0, 0]]\n{link}");
    let t = TopologySpec::from_toml_str(&two_nodes_of_3(&apart))
        .and_then(|s| s.build())
        .unwrap();
    let m = t.node_links().unwrap();
    assert!(m.route(0, 2).is_empty());
    assert_eq!(m.exchange_load(2), 0.5);
    assert_eq!(m.exchange_load(3), f64::INFINITY);
}

/// Why HALO's relays inside a Frontier node take paths of up to 3 hops (see
/// docs/SIMULATION.md, table 9): of every way to send each unlinked pair's transfer over
/// one of the peers both ends have a link to (2^16 choices for the 16 pairs with two
/// such peers), none loads the busiest link with fewer than the 4 transfers per link
/// that the fabric's routes ([`NodeLinks::route`]) give; `balanced_routes`, with three
/// hops, gets 3. (A cut bound: the 6 links between GCDs 0-3 and 4-7 carry 16 transfers
/// each way, so no routing gets below 16 / 6 = 2.67.)
#[test]
fn no_choice_of_two_hop_routes_beats_the_fabrics_on_frontier() {
    let t = preset("frontier:1");
    let m = t.node_links().unwrap();
    let n = m.size();
    let mut base = vec![0u32; n * n];
    let mut choices: Vec<((usize, usize), Vec<usize>)> = Vec::new();
    for i in 0..n {
        for j in (0..n).filter(|&j| j != i) {
            if m.links(i, j) > 0 {
                base[i * n + j] += 1;
            } else {
                let via: Vec<usize> = (0..n)
                    .filter(|&k| m.links(i, k) > 0 && m.links(k, j) > 0)
                    .collect();
                assert!(!via.is_empty(), "{i}-{j} is two hops apart");
                choices.push(((i, j), via));
            }
        }
    }
    let (single, multi): (Vec<_>, Vec<_>) = choices.into_iter().partition(|c| c.1.len() == 1);
    for ((i, j), via) in &single {
        base[i * n + via[0]] += 1;
        base[via[0] * n + j] += 1;
    }
    assert_eq!(multi.len(), 16);
    assert!(multi.iter().all(|c| c.1.len() == 2));
    let worst = |load: &[u32]| {
        (0..n * n)
            .filter(|&e| load[e] > 0)
            .map(|e| load[e] as f64 / m.links(e / n, e % n) as f64)
            .fold(0.0, f64::max)
    };
    let mut best = f64::INFINITY;
    let mut load = base.clone();
    for bits in 0u32..1 << multi.len() {
        load.copy_from_slice(&base);
        for (b, ((i, j), via)) in multi.iter().enumerate() {
            let k = via[(bits >> b) as usize & 1];
            load[i * n + k] += 1;
            load[k * n + j] += 1;
        }
        best = best.min(worst(&load));
    }
    assert_eq!(best, 4.0);
    assert_eq!(m.exchange_load(n), best);
    let (paths, load) = m.balanced_routes(n).unwrap();
    assert_eq!(load, 3.0);
    assert!(paths.iter().all(|p| p.len() <= 4), "at most 3 hops");
    // The paths are walks over links, from i to j.
    for i in 0..n {
        for j in (0..n).filter(|&j| j != i) {
            let p = &paths[i * n + j];
            assert_eq!((p[0], p[p.len() - 1]), (i, j));
            assert!(p.windows(2).all(|w| m.links(w[0], w[1]) > 0), "{p:?}");
        }
    }
    // Nothing to gain on a fully connected node. A cut node gets paths over its own
    // ranks only: better than the fabric's with 6 GCDs; with 5 the fabric's 3.0 (over
    // GCDs 5-7 too) is not beaten.
    assert!(
        preset("mi300x:1")
            .node_links()
            .unwrap()
            .balanced_routes(8)
            .is_none()
    );
    let (cut, load) = m.balanced_routes(6).unwrap();
    assert!(cut.iter().flatten().all(|&x| x < 6));
    assert!(load < m.exchange_load(6));
    assert_eq!(m.exchange_load(5), 3.0);
    assert!(m.balanced_routes(5).is_none());
}
