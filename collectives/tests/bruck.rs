//! Bruck's all-to-all: every shape verifies, uniform and -v, and the message counts
//! are the ones worked out by hand.

mod common;
use common::*;
use halo_collectives::*;
use halo_topology::Topology;

fn presets() -> Vec<String> {
    let mut out: Vec<String> = (1..=17)
        .chain([32, 64])
        .map(|n| format!("flat:{n}"))
        .collect();
    out.extend(
        [
            "nodes:2x2",
            "nodes:4x2",
            "nodes:3x3",
            "nodes:4x4,ranks=14",
            "nodes:3x5,ranks=13",
            "frontier:2",
            "frontier:5,ranks=37",
            "dgx-h100:2",
        ]
        .map(String::from),
    );
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

#[test]
fn uniform_verifies_everywhere() {
    let opts = AlgoOptions::default();
    for preset in presets() {
        let topo = Topology::preset(&preset).unwrap();
        for block in [1, 7, 8] {
            let s = build_uniform(Algorithm::Bruck, &topo, block, &opts).unwrap();
            verify_all_to_all(&s, &topo, &UniformSizes(block))
                .unwrap_or_else(|e| panic!("{preset} block {block}: {e}"));
        }
    }
}

#[test]
fn all_to_all_v_verifies_with_zeros() {
    let opts = AlgoOptions::default();
    for (k, preset) in presets().iter().enumerate() {
        let topo = Topology::preset(preset).unwrap();
        for (what, m) in matrices(topo.size(), 17 + k as u64) {
            let s = build_v(Algorithm::Bruck, &topo, &m, &opts)
                .unwrap_or_else(|e| panic!("{preset} {what}: {e}"));
            verify_all_to_all(&s, &topo, &m).unwrap_or_else(|e| panic!("{preset} {what}: {e}"));
        }
    }
}

#[test]
fn zero_blocks_of_size_zero_build_no_messages() {
    let topo = Topology::preset("flat:9").unwrap();
    let s = build_uniform(Algorithm::Bruck, &topo, 0, &AlgoOptions::default()).unwrap();
    verify_all_to_all(&s, &topo, &UniformSizes(0)).unwrap();
    assert!(s.iter().all(|s| s.is_empty()));
}

/// Blocks sent per rank: positions 1..N-1, each once per set bit.
fn popcount_sum(n: usize) -> u64 {
    (1..n).map(|i| u64::from(i.count_ones())).sum()
}

#[test]
fn message_counts_by_hand() {
    let opts = AlgoOptions::default();
    // N = 8: 3 rounds of 4 blocks (positions with bit k set), 12 blocks in all.
    let topo = Topology::preset("flat:8").unwrap();
    let s = build_uniform(Algorithm::Bruck, &topo, 8, &opts).unwrap();
    let report = verify_all_to_all(&s, &topo, &UniformSizes(8)).unwrap();
    assert_eq!(report.messages, 8 * 3);
    for sch in &s {
        let st = sch.stats();
        assert_eq!((st.sends, st.recvs), (3, 3), "rank {}", sch.rank());
        assert_eq!(st.bytes_sent, 12 * 8);
        assert_eq!(st.bytes_received, 12 * 8);
        assert_eq!(popcount_sum(8), 12);
        // Every round message is 4 blocks.
        for step in sch.steps() {
            if let Step::Send { region, tag, .. } | Step::Recv { region, tag, .. } = step {
                assert_eq!(region.len, 32);
                assert!(*tag < 3);
            }
        }
    }
    // N = 5: 3 rounds carrying positions {1,3}, {2,3}, {4}; 5 blocks.
    let topo = Topology::preset("flat:5").unwrap();
    let s = build_uniform(Algorithm::Bruck, &topo, 1, &opts).unwrap();
    verify_all_to_all(&s, &topo, &UniformSizes(1)).unwrap();
    for sch in &s {
        let st = sch.stats();
        assert_eq!((st.sends, st.recvs), (3, 3));
        assert_eq!(st.bytes_sent, popcount_sum(5));
        assert_eq!(popcount_sum(5), 5);
    }
    // ceil(log2 N) rounds for every N; bytes = B * sum of popcounts.
    for n in (1..=17usize).chain([32, 64]) {
        let topo = Topology::preset(&format!("flat:{n}")).unwrap();
        let s = build_uniform(Algorithm::Bruck, &topo, 7, &opts).unwrap();
        let rounds = n.next_power_of_two().trailing_zeros() as usize;
        for sch in &s {
            let st = sch.stats();
            assert_eq!((st.sends, st.recvs), (rounds, rounds), "N={n}");
            assert_eq!(st.bytes_sent, 7 * popcount_sum(n), "N={n}");
        }
    }
}

#[test]
fn two_ranks_is_one_message_straight_into_place() {
    let topo = Topology::preset("flat:2").unwrap();
    let s = build_uniform(Algorithm::Bruck, &topo, 8, &AlgoOptions::default()).unwrap();
    verify_all_to_all(&s, &topo, &UniformSizes(8)).unwrap();
    for sch in &s {
        let st = sch.stats();
        // The self copy; the send goes from the send buffer, the receive lands in place.
        assert_eq!((st.sends, st.recvs, st.copies), (1, 1, 1));
        assert_eq!(sch.scratch_len(), 0);
    }
}

#[test]
fn final_copies_merge() {
    // N = 16: the copies home are a few per round, not one per block.
    let topo = Topology::preset("flat:16").unwrap();
    let s = build_uniform(Algorithm::Bruck, &topo, 8, &AlgoOptions::default()).unwrap();
    verify_all_to_all(&s, &topo, &UniformSizes(8)).unwrap();
    for sch in &s {
        let into_recv = sch
            .steps()
            .iter()
            .filter(|st| matches!(st, Step::Copy { dst, .. } if dst.buf == Buf::Recv))
            .count();
        // 1 self copy + at most 2 per round (a wrap around N splits a run).
        assert!(
            into_recv <= 1 + 2 * 4,
            "rank {}: {into_recv} copies home",
            sch.rank()
        );
    }
}

#[test]
fn receives_are_posted_without_dependencies() {
    let topo = Topology::preset("flat:13").unwrap();
    let s = build_uniform(Algorithm::Bruck, &topo, 8, &AlgoOptions::default()).unwrap();
    for sch in &s {
        for (i, st) in sch.steps().iter().enumerate() {
            if matches!(st, Step::Recv { .. }) {
                assert!(
                    sch.deps(i as StepId).is_empty(),
                    "rank {} step {i}",
                    sch.rank()
                );
            }
        }
    }
}

#[test]
fn forwarded_blocks_are_routed() {
    // Every block that passes through a rank other than its source and destination is
    // announced by the metadata pass, so all-to-all-v builds ask only for known sizes.
    let topo = Topology::preset("flat:11").unwrap();
    let s = build_uniform(Algorithm::Bruck, &topo, META_BLOCK, &AlgoOptions::default()).unwrap();
    verify_all_to_all(&s, &topo, &UniformSizes(META_BLOCK)).unwrap();
    assert!(Algorithm::Bruck.forwards());
    let routed: usize = s
        .iter()
        .map(|sch| {
            sch.routed()
                .iter()
                .filter(|b| b.dst as usize != sch.rank())
                .count()
        })
        .sum();
    assert!(routed > 0);
}
