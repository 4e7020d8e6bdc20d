//! `KnownSizes::from_matrix` (all-to-all-v after an all-gather of every rank's counts):
//! every builder, given the whole matrix, builds exactly the program it builds from the
//! routed sizes of a metadata pass, and the programs verify; a matrix of the wrong shape
//! fails the build of a forwarding algorithm instead of moving wrong bytes.

mod common;
use common::*;
use halo_collectives::*;
use halo_topology::Topology;

fn random_matrix(n: usize, seed: u64) -> MatrixSizes {
    let mut rng = Rng::from_state(seed | 1);
    let m = (0..n * n)
        .map(|_| {
            if rng.below(100) < 30 {
                0
            } else {
                1 + rng.below(700)
            }
        })
        .collect();
    MatrixSizes::new(n, m)
}

fn packed(counts: &[usize]) -> Vec<usize> {
    counts
        .iter()
        .scan(0, |at, &c| {
            let d = *at;
            *at += c;
            Some(d)
        })
        .collect()
}

/// Every rank's program built from the whole matrix.
fn build_from_matrix(
    algo: Algorithm,
    topo: &Topology,
    m: &MatrixSizes,
    flat: &[usize],
) -> Result<Vec<Schedule>> {
    (0..topo.size())
        .map(|rank| {
            let send = m.row(rank).to_vec();
            let recv = m.column(rank);
            let (sd, rd) = (packed(&send), packed(&recv));
            let known = KnownSizes::from_matrix(rank, &send, &recv, flat);
            let ctx = BuildCtx {
                topology: topo,
                rank,
                layout: Layout::V {
                    send_counts: &send,
                    send_displs: &sd,
                    recv_counts: &recv,
                    recv_displs: &rd,
                },
                sizes: &known,
                options: &AlgoOptions::default(),
            };
            build(algo, &ctx)
        })
        .collect()
}

#[test]
fn the_whole_matrix_builds_what_the_routed_sizes_build() {
    for (spec, seed) in [
        ("flat:5", 3),
        ("nodes:2x4", 5),
        ("nodes:3x3,ranks=7", 7),
        ("frontier:2", 11),
        ("dgx-h100:2,ranks=13", 13),
    ] {
        let topo = Topology::preset(spec).unwrap();
        let n = topo.size();
        let m = random_matrix(n, seed);
        let flat: Vec<usize> = (0..n).flat_map(|s| m.row(s).to_vec()).collect();
        for algo in Algorithm::ALL {
            let Ok(routed) = build_v(algo, &topo, &m, &AlgoOptions::default()) else {
                // An algorithm that does not support this topology fails alike.
                assert!(
                    build_from_matrix(algo, &topo, &m, &flat).is_err(),
                    "{spec} {algo}"
                );
                continue;
            };
            let whole = build_from_matrix(algo, &topo, &m, &flat)
                .unwrap_or_else(|e| panic!("{spec} {algo}: {e}"));
            assert_eq!(whole, routed, "{spec} {algo}: the programs differ");
            verify_all_to_all(&whole, &topo, &m).unwrap_or_else(|e| panic!("{spec} {algo}: {e}"));
        }
    }
}

#[test]
fn a_matrix_of_the_wrong_shape_is_an_internal_error_for_forwarding_algorithms() {
    let topo = Topology::preset("nodes:2x4").unwrap();
    let n = topo.size();
    let m = random_matrix(n, 17);
    let short: Vec<usize> = (0..n - 1).flat_map(|s| m.row(s).to_vec()).collect();
    for algo in Algorithm::ALL {
        let out = build_from_matrix(algo, &topo, &m, &short);
        if algo.forwards() {
            match out {
                Err(CollectiveError::Internal(msg)) => {
                    assert!(msg.contains("cannot know"), "{algo}: {msg}")
                }
                other => panic!("{algo}: expected an internal error, got {other:?}"),
            }
        } else {
            // Direct algorithms ask only about their own row and column.
            let s = out.unwrap_or_else(|e| panic!("{algo}: {e}"));
            verify_all_to_all(&s, &topo, &m).unwrap();
        }
    }
}
