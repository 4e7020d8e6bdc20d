//! HALO-2D (sender-side aggregation): every shape verifies, uniform and -v, uneven
//! nodes and scattered rank numbering included, and the message counts are the ones
//! worked out by hand.

mod common;
use common::*;
use halo_collectives::*;
use halo_topology::{Level, Topology, TopologySpec};

/// Every N (1..=17, 32, 64) flat, on nodes of 4 ranks and (up to 17) of 3 ranks, the
/// last node short where N does not divide.
fn every_n() -> Vec<String> {
    let ns = || (1..=17usize).chain([32, 64]);
    let mut out: Vec<String> = ns().map(|n| format!("flat:{n}")).collect();
    out.extend(ns().map(|n| format!("nodes:{}x4,ranks={n}", n.div_ceil(4))));
    out.extend((1..=17usize).map(|n| format!("nodes:{}x3,ranks={n}", n.div_ceil(3))));
    out
}

/// Named shapes: single node, one rank per node, uneven nodes, Frontier, DGX.
fn presets() -> Vec<String> {
    let mut out = Vec::new();
    out.extend(
        [
            "nodes:1x4",
            "nodes:2x1",
            "nodes:2x2",
            "nodes:4x2",
            "nodes:2x5",
            "nodes:3x3",
            "nodes:5x3",
            "nodes:4x4,ranks=14",
            "nodes:3x5,ranks=13",
            "nodes:4x4,ranks=13",
            "nodes:8x8",
            "frontier:2",
            "frontier:5,ranks=37",
            "dgx-h100:2",
        ]
        .map(String::from),
    );
    out
}

/// `h` nodes, rank r on node r % h: no node's ranks are numbered consecutively, so
/// Phase B goes through scratch. With `ranks`, only the first ranks are kept (uneven).
fn round_robin(h: usize, n: usize) -> Topology {
    let mut text = String::from(
        "name = \"round robin\"\n[links]\ndevice = { bandwidth = 1.0e10, latency = 0.0 }\n\
         node = { bandwidth = 5.0e9, latency = 1.0e-6 }\nsystem = { bandwidth = 1.25e10, latency = 5.0e-6 }\n",
    );
    for r in 0..n {
        text.push_str(&format!("[[ranks]]\nrank = {r}\nnode = {}\n", r % h));
    }
    TopologySpec::from_toml_str(&text).unwrap().build().unwrap()
}

fn option_sets(topo: &Topology) -> Vec<AlgoOptions> {
    let mut out = vec![
        AlgoOptions::default(),
        AlgoOptions {
            chunk_bytes: 3,
            halo_levels: None,
            max_chunks: 4096,
            ..AlgoOptions::default()
        },
    ];
    if topo.has_level(Level::Switch) {
        out.push(AlgoOptions {
            chunk_bytes: 5,
            halo_levels: Some(vec![Level::Node, Level::Switch]),
            max_chunks: 4096,
            ..AlgoOptions::default()
        });
        out.push(AlgoOptions {
            chunk_bytes: 1 << 20,
            halo_levels: Some(vec![Level::Package]),
            max_chunks: 4096,
            ..AlgoOptions::default()
        });
        out.push(AlgoOptions {
            chunk_bytes: 16,
            halo_levels: Some(vec![Level::Switch, Level::Group]),
            max_chunks: 4096,
            ..AlgoOptions::default()
        });
    }
    out
}

/// Count matrices with many zeros: random, whole zero rows, zero columns, only the
/// diagonal, nothing at all, and one lonely block.
fn matrices(n: usize, seed: u64) -> Vec<(&'static str, MatrixSizes)> {
    let mut rng = Rng::from_state(seed | 1);
    let mut make = |f: &mut dyn FnMut(usize, usize, &mut Rng) -> usize| {
        let mut m = vec![0usize; n * n];
        for s in 0..n {
            for d in 0..n {
                m[s * n + d] = f(s, d, &mut rng);
            }
        }
        MatrixSizes::new(n, m)
    };
    vec![
        (
            "random",
            make(&mut |_, _, r| {
                if r.below(2) == 0 { 0 } else { r.below(20) }
            }),
        ),
        (
            "sparse",
            make(&mut |_, _, r| {
                if r.below(10) != 0 { 0 } else { 1 + r.below(9) }
            }),
        ),
        (
            "zero rows",
            make(&mut |s, _, r| if s % 3 == 0 { 0 } else { r.below(9) }),
        ),
        (
            "zero columns",
            make(&mut |_, d, r| {
                if d % 2 == 1 { 0 } else { 1 + r.below(9) }
            }),
        ),
        (
            "only self",
            make(&mut |s, d, r| if s == d { 1 + r.below(5) } else { 0 }),
        ),
        ("all zero", make(&mut |_, _, _| 0)),
        (
            "one block",
            make(&mut |s, d, _| if s == n - 1 && d == n / 2 { 3 } else { 0 }),
        ),
    ]
}

fn check_all(name: &str, topo: &Topology, seed: u64) {
    for opts in option_sets(topo) {
        for block in [1, 7, 8] {
            let s = build_uniform(Algorithm::Halo2d, topo, block, &opts).unwrap();
            verify_all_to_all(&s, topo, &UniformSizes(block))
                .unwrap_or_else(|e| panic!("{name} block {block} {opts:?}: {e}"));
        }
        for (what, m) in matrices(topo.size(), seed) {
            let s = build_v(Algorithm::Halo2d, topo, &m, &opts)
                .unwrap_or_else(|e| panic!("{name} {what} {opts:?}: {e}"));
            verify_all_to_all(&s, topo, &m)
                .unwrap_or_else(|e| panic!("{name} {what} {opts:?}: {e}"));
        }
    }
}

#[test]
fn verifies_on_presets() {
    for (k, preset) in presets().iter().enumerate() {
        let topo = Topology::preset(preset).unwrap();
        check_all(preset, &topo, 101 + k as u64);
    }
}

#[test]
fn verifies_for_every_n() {
    for (k, preset) in every_n().iter().enumerate() {
        let topo = Topology::preset(preset).unwrap();
        check_all(preset, &topo, 701 + k as u64);
    }
}

#[test]
fn verifies_with_scattered_rank_numbers() {
    for (h, n) in [(2, 4), (3, 9), (4, 14), (3, 13), (5, 5), (5, 7)] {
        let topo = round_robin(h, n);
        check_all(
            &format!("round robin {h} nodes, {n} ranks"),
            &topo,
            (h * 100 + n) as u64,
        );
        // Phase B cannot land in place: it goes through scratch and is copied home.
        let s = build_uniform(Algorithm::Halo2d, &topo, 8, &AlgoOptions::default()).unwrap();
        let copied_home = s.iter().any(|sch| {
            sch.steps().iter().any(|st| {
                matches!(st, Step::Copy { src, dst } if src.buf == Buf::Scratch && dst.buf == Buf::Recv)
            })
        });
        // (Unless every node holds one rank: then each message is one block.)
        assert_eq!(copied_home, n > h, "round robin {h}x{n}");
    }
}

#[test]
fn message_counts_by_hand() {
    // nodes:4x2, 8-byte blocks, one chunk: per rank 1 direct + 1 Phase A (3 blocks:
    // one for each remote node) + 3 Phase B (2 blocks: one per rank of the node).
    let topo = Topology::preset("nodes:4x2").unwrap();
    let s = build_uniform(Algorithm::Halo2d, &topo, 8, &AlgoOptions::default()).unwrap();
    let report = verify_all_to_all(&s, &topo, &UniformSizes(8)).unwrap();
    assert_eq!(report.messages, 8 * 5);
    for sch in &s {
        let st = sch.stats();
        assert_eq!((st.sends, st.recvs), (5, 5), "rank {}", sch.rank());
        let mut by_phase = [0usize; 3];
        let mut bytes = [0usize; 3];
        for step in sch.steps() {
            if let Step::Send { tag, region, .. } = step {
                by_phase[(tag >> 44) as usize] += 1;
                bytes[(tag >> 44) as usize] += region.len;
            }
        }
        assert_eq!(by_phase, [1, 1, 3]);
        assert_eq!(bytes, [8, 3 * 8, 3 * 2 * 8]);
        assert_eq!(st.bytes_sent, 80);
        assert_eq!(st.bytes_received, 80);
        // Self + 3 Phase A packs + 3 x 2 Phase B packs; Phase B lands in place.
        assert_eq!(st.copies, 1 + 3 + 6);
    }

    // nodes:2x4: H = 2, so Phase A carries one block and is sent as it is.
    let topo = Topology::preset("nodes:2x4").unwrap();
    let s = build_uniform(Algorithm::Halo2d, &topo, 8, &AlgoOptions::default()).unwrap();
    verify_all_to_all(&s, &topo, &UniformSizes(8)).unwrap();
    for sch in &s {
        let st = sch.stats();
        // 3 direct + 3 Phase A + 1 Phase B.
        assert_eq!((st.sends, st.recvs), (7, 7));
        assert_eq!(st.bytes_sent, (3 + 3 + 4) * 8);
        // Self + the Phase B pack: the one-block Phase A receives sit next to each other
        // in scratch, so the pack is one run before this rank's own block and one after.
        let li = sch.rank() % 4;
        let runs = 1 + usize::from(li > 0) + usize::from(li < 3);
        assert_eq!(st.copies, 1 + runs, "rank {}", sch.rank());
    }

    // Chunked: Phase B of nodes:4x2 with 8-byte blocks is 16 bytes, cut in 3 chunks of <= 6.
    let opts = AlgoOptions {
        chunk_bytes: 6,
        halo_levels: None,
        max_chunks: 4096,
        ..AlgoOptions::default()
    };
    let topo = Topology::preset("nodes:4x2").unwrap();
    let s = build_uniform(Algorithm::Halo2d, &topo, 8, &opts).unwrap();
    verify_all_to_all(&s, &topo, &UniformSizes(8)).unwrap();
    for sch in &s {
        assert_eq!(sch.stats().sends, 1 + 1 + 3 * 3);
    }
}

#[test]
fn formulas_hold_on_even_nodes() {
    // H nodes of R ranks: R-1 direct, R-1 Phase A, H-1 Phase B messages;
    // (R-1)B + (R-1)(H-1)B + (H-1)R*B bytes.
    for (h, r) in [(2, 2), (3, 4), (4, 8), (8, 2), (5, 5)] {
        let topo = Topology::preset(&format!("nodes:{h}x{r}")).unwrap();
        let b = 7u64;
        let s = build_uniform(
            Algorithm::Halo2d,
            &topo,
            b as usize,
            &AlgoOptions::default(),
        )
        .unwrap();
        verify_all_to_all(&s, &topo, &UniformSizes(b as usize)).unwrap();
        let (h, r) = (h as u64, r as u64);
        for sch in &s {
            let st = sch.stats();
            assert_eq!(st.sends as u64, (r - 1) + (r - 1) + (h - 1), "{h}x{r}");
            assert_eq!(st.recvs, st.sends);
            assert_eq!(
                st.bytes_sent,
                b * ((r - 1) + (r - 1) * (h - 1) + (h - 1) * r),
                "{h}x{r}"
            );
        }
    }
}

#[test]
fn flat_topology_is_the_fan_out() {
    for n in [1, 2, 7] {
        let topo = Topology::preset(&format!("flat:{n}")).unwrap();
        let opts = AlgoOptions::default();
        let s = build_uniform(Algorithm::Halo2d, &topo, 8, &opts).unwrap();
        let f = build_uniform(Algorithm::Flat, &topo, 8, &opts).unwrap();
        for (a, b) in s.iter().zip(&f) {
            assert_eq!(a.stats(), b.stats());
            assert_eq!(a.algorithm(), "halo2d");
        }
    }
}

#[test]
fn receives_are_posted_without_dependencies() {
    for preset in ["nodes:4x4,ranks=14", "frontier:2"] {
        let topo = Topology::preset(preset).unwrap();
        let opts = AlgoOptions {
            chunk_bytes: 5,
            halo_levels: None,
            max_chunks: 4096,
            ..AlgoOptions::default()
        };
        let s = build_uniform(Algorithm::Halo2d, &topo, 8, &opts).unwrap();
        for sch in &s {
            for (i, st) in sch.steps().iter().enumerate() {
                if matches!(st, Step::Recv { .. }) {
                    assert!(
                        sch.deps(i as StepId).is_empty(),
                        "{preset} rank {} step {i}",
                        sch.rank()
                    );
                }
            }
        }
    }
}

#[test]
fn uneven_nodes_use_the_wrapped_forwarder() {
    // nodes:3x5,ranks=13: nodes {0..5}, {5..10}, {10..13}. Rank 11 (local index 1 on
    // the small node) receives from node 0 through the rank of local index 1 (rank 1),
    // and rank 3 of node 0 receives from node 2 through rank 10 + (3 mod 3) = 10.
    let topo = Topology::preset("nodes:3x5,ranks=13").unwrap();
    let s = build_uniform(Algorithm::Halo2d, &topo, 8, &AlgoOptions::default()).unwrap();
    verify_all_to_all(&s, &topo, &UniformSizes(8)).unwrap();
    let phase_b_from = |rank: usize| -> Vec<u32> {
        let mut v: Vec<u32> = s[rank]
            .steps()
            .iter()
            .filter_map(|st| match st {
                Step::Recv { peer, tag, .. } if tag >> 44 == 2 => Some(*peer),
                _ => None,
            })
            .collect();
        v.sort_unstable();
        v
    };
    assert_eq!(phase_b_from(11), vec![1, 6]);
    // Rank 10 forwards node 2's blocks for ranks 0, 3 of node 0 (local index 0 mod 3)
    // and 5, 8 of node 1; rank 12 (index 2) forwards for 2 and 7 only.
    let phase_b_to = |rank: usize| -> Vec<u32> {
        let mut v: Vec<u32> = s[rank]
            .steps()
            .iter()
            .filter_map(|st| match st {
                Step::Send { peer, tag, .. } if tag >> 44 == 2 => Some(*peer),
                _ => None,
            })
            .collect();
        v.sort_unstable();
        v
    };
    assert_eq!(phase_b_to(10), vec![0, 3, 5, 8]);
    assert_eq!(phase_b_to(12), vec![2, 7]);
    // Rank 3 receives node 1's blocks through rank 8 and node 2's through rank 10.
    assert_eq!(phase_b_from(3), vec![8, 10]);
}
