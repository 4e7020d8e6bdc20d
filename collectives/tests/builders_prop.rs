//! Property tests: every builder x rank counts 1..=64 x presets (uneven domains
//! included) x random counts with many zeros passes the verifier, for all-to-all and
//! all-to-all-v, each rank's program built only from what that rank can know.

mod common;
use common::Rng;
use common::*;
use halo_collectives::*;
use halo_topology::{Level, Topology};
use proptest::prelude::*;

/// A topology with `n` ranks of one of the preset families.
fn topology(family: u8, n: usize, per: usize) -> Topology {
    let spec = match family % 4 {
        0 => format!("flat:{n}"),
        1 => {
            let per = per.clamp(1, 8);
            format!("nodes:{}x{per},ranks={n}", n.div_ceil(per))
        }
        2 => format!("frontier:{},ranks={n}", n.div_ceil(8)),
        _ => format!("dgx-h100:{},ranks={n}", n.div_ceil(8)),
    };
    Topology::preset(&spec).unwrap()
}

#[derive(Debug, Clone)]
enum Pattern {
    Random { zero_pct: u64, max: u64 },
    ZeroRows,
    ZeroColumns,
    SelfOnly,
    AllZero,
}

fn matrix(n: usize, pattern: &Pattern, seed: u64) -> MatrixSizes {
    let mut rng = Rng::from_state(seed | 1);
    let mut m = vec![0usize; n * n];
    for s in 0..n {
        for d in 0..n {
            m[s * n + d] = match pattern {
                Pattern::Random { zero_pct, max } => {
                    if rng.below(100) < *zero_pct as usize {
                        0
                    } else {
                        1 + rng.below(*max as usize)
                    }
                }
                Pattern::ZeroRows => {
                    if s % 3 == 0 {
                        0
                    } else {
                        rng.below(9)
                    }
                }
                Pattern::ZeroColumns => {
                    if d % 2 == 1 {
                        0
                    } else {
                        rng.below(9)
                    }
                }
                Pattern::SelfOnly => {
                    if s == d {
                        1 + rng.below(5)
                    } else {
                        0
                    }
                }
                Pattern::AllZero => 0,
            };
        }
    }
    MatrixSizes::new(n, m)
}

fn pattern() -> impl Strategy<Value = Pattern> {
    prop_oneof![
        4 => (0u64..95, 1u64..40).prop_map(|(zero_pct, max)| Pattern::Random { zero_pct, max }),
        1 => Just(Pattern::ZeroRows),
        1 => Just(Pattern::ZeroColumns),
        1 => Just(Pattern::SelfOnly),
        1 => Just(Pattern::AllZero),
    ]
}

fn options(family: u8, choice: u8, chunk: usize) -> AlgoOptions {
    let halo_levels = if family % 4 == 2 {
        match choice % 4 {
            0 => None,
            1 => Some(vec![Level::Node, Level::Switch]),
            2 => Some(vec![Level::Node, Level::Switch, Level::Group]),
            _ => Some(vec![Level::Package, Level::Node]),
        }
    } else {
        None
    };
    AlgoOptions {
        chunk_bytes: chunk,
        halo_levels,
        max_chunks: 4096,
        // Half the cases relay inside nodes with a link matrix at every size.
        node_relay_bytes: if choice.is_multiple_of(2) {
            0
        } else {
            usize::MAX
        },
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, .. ProptestConfig::default() })]

    #[test]
    fn uniform_all_to_all_verifies(
        family in 0u8..4, n in 1usize..=64, per in 1usize..=8, block in 1usize..=24,
        choice in 0u8..4, chunk in prop_oneof![Just(1usize << 20), 1usize..64],
    ) {
        let topo = topology(family, n, per);
        let opts = options(family, choice, chunk);
        for algo in Algorithm::ALL {
            let s = build_uniform(algo, &topo, block, &opts).unwrap();
            if let Err(e) = verify_all_to_all(&s, &topo, &UniformSizes(block)) {
                prop_assert!(false, "{} on {} (opts {:?}): {}", algo, topo.name(), opts, e);
            }
        }
    }

    #[test]
    fn all_to_all_v_verifies(
        family in 0u8..4, n in 1usize..=64, per in 1usize..=8, pattern in pattern(), seed in any::<u64>(),
        choice in 0u8..4, chunk in prop_oneof![Just(1usize << 20), 1usize..64],
    ) {
        let topo = topology(family, n, per);
        let opts = options(family, choice, chunk);
        let m = matrix(n, &pattern, seed);
        for algo in Algorithm::ALL {
            let s = build_v(algo, &topo, &m, &opts).unwrap();
            if let Err(e) = verify_all_to_all(&s, &topo, &m) {
                prop_assert!(false, "{} on {} (opts {:?}, {:?}): {}", algo, topo.name(), opts, pattern, e);
            }
        }
    }
}

/// Non-packed layouts: displacements in reverse rank order with gaps.
#[test]
fn scattered_displacements_verify() {
    let topo = Topology::preset("nodes:3x3,ranks=8").unwrap();
    let n = topo.size();
    let m = matrix(
        n,
        &Pattern::Random {
            zero_pct: 30,
            max: 9,
        },
        99,
    );
    let opts = AlgoOptions {
        chunk_bytes: 4,
        halo_levels: None,
        max_chunks: 4096,
        ..AlgoOptions::default()
    };
    for algo in [Algorithm::Flat, Algorithm::Pairwise, Algorithm::Halo] {
        let mut layouts_data = Vec::new();
        for r in 0..n {
            let send: Vec<usize> = m.row(r).to_vec();
            let recv: Vec<usize> = m.column(r);
            let mut sd = vec![0; n];
            let mut rd = vec![0; n];
            let (mut so, mut ro) = (3, 5);
            for q in (0..n).rev() {
                sd[q] = so;
                so += send[q] + 2;
                rd[q] = ro;
                ro += recv[q] + 1;
            }
            layouts_data.push((send, sd, recv, rd));
        }
        let layouts: Vec<Layout<'_>> = layouts_data
            .iter()
            .map(|(s, sd, r, rd)| Layout::V {
                send_counts: s,
                send_displs: sd,
                recv_counts: r,
                recv_displs: rd,
            })
            .collect();
        let schedules: Vec<Schedule> = (0..n)
            .map(|rank| {
                let ctx = BuildCtx {
                    topology: &topo,
                    rank,
                    layout: layouts[rank],
                    sizes: &m,
                    options: &opts,
                };
                build(algo, &ctx).unwrap()
            })
            .collect();
        let expect = Expectation::from_layouts(&layouts);
        verify(&schedules, &topo, &expect, &m).unwrap_or_else(|e| panic!("{algo}: {e}"));
    }
}
