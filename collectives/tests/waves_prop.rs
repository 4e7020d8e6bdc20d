//! Wave grouping (the device path's program shape) is sound for every algorithm:
//! every builder x rank counts 1..=48 x presets (uneven domains) x uniform and random
//! -v counts with zeros passes the verifier and then `verify_waves` (no step shares a
//! wave with a step it depends on; order matching equals tag matching; no deadlock
//! under NCCL's group semantics). Hand-made schedules show each check can fail.

mod common;
use common::Rng;
use common::*;
use halo_collectives::*;
use halo_topology::{Level, Topology};
use proptest::prelude::*;

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

fn options(family: u8, choice: u8, chunk: usize) -> AlgoOptions {
    let halo_levels = if family % 4 == 2 {
        match choice % 3 {
            0 => None,
            1 => Some(vec![Level::Node, Level::Switch]),
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

fn random_matrix(n: usize, zero_pct: u64, max: u64, seed: u64) -> MatrixSizes {
    let mut rng = Rng::from_state(seed | 1);
    let m = (0..n * n)
        .map(|_| {
            if rng.below(100) < zero_pct as usize {
                0
            } else {
                1 + rng.below(max as usize)
            }
        })
        .collect();
    MatrixSizes::new(n, m)
}

fn check(
    schedules: &[Schedule],
    topo: &Topology,
    sizes: &dyn BlockSizes,
) -> Result<WaveReport, String> {
    verify_all_to_all(schedules, topo, sizes).map_err(|e| format!("verify: {e}"))?;
    let waves = group_waves(schedules).map_err(|e| format!("group: {e}"))?;
    verify_waves(schedules, &waves).map_err(|e| format!("waves: {e}"))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, .. ProptestConfig::default() })]

    #[test]
    fn uniform_waves_are_sound(
        family in 0u8..4, n in 1usize..=48, per in 1usize..=8, block in 1usize..=16,
        choice in 0u8..3, chunk in prop_oneof![Just(1usize << 20), 1usize..48],
    ) {
        let topo = topology(family, n, per);
        let opts = options(family, choice, chunk);
        for algo in Algorithm::ALL {
            let s = build_uniform(algo, &topo, block, &opts).unwrap();
            if let Err(e) = check(&s, &topo, &UniformSizes(block)) {
                prop_assert!(false, "{} on {} ({:?}): {}", algo, topo.name(), opts, e);
            }
        }
    }

    #[test]
    fn v_waves_are_sound(
        family in 0u8..4, n in 1usize..=48, per in 1usize..=8, zero_pct in 0u64..100,
        max in 1u64..40, seed in any::<u64>(), choice in 0u8..3,
        chunk in prop_oneof![Just(1usize << 20), 1usize..48],
    ) {
        let topo = topology(family, n, per);
        let opts = options(family, choice, chunk);
        let m = random_matrix(n, zero_pct, max, seed);
        for algo in Algorithm::ALL {
            let s = build_v(algo, &topo, &m, &opts).unwrap();
            if let Err(e) = check(&s, &topo, &m) {
                prop_assert!(false, "{} on {} ({:?}): {}", algo, topo.name(), opts, e);
            }
        }
    }
}

/// Every step is in the first wave after its dependencies' (a message's being those of
/// both ends), and both ends of a message share a wave.
#[test]
fn waves_follow_dependencies_and_pair_messages() {
    let topo = Topology::preset("frontier:2").unwrap();
    for algo in Algorithm::ALL {
        let s = build_uniform(algo, &topo, 8, &AlgoOptions::default()).unwrap();
        let w = group_waves(&s).unwrap();
        let mut recv_at = std::collections::HashMap::new();
        for (q, sch) in s.iter().enumerate() {
            for (t, st) in sch.steps().iter().enumerate() {
                if let Step::Recv { peer, tag, .. } = *st {
                    recv_at.insert((peer as usize, q, tag), (q, t as StepId));
                }
            }
        }
        let floor = |r: usize, i: StepId| {
            s[r].deps(i)
                .iter()
                .map(|&d| w[r].wave_of(d) + 1)
                .max()
                .unwrap_or(0)
        };
        for (r, sch) in s.iter().enumerate() {
            for i in 0..sch.len() as StepId {
                let want = match sch.steps()[i as usize] {
                    Step::Send { peer, tag, .. } => {
                        let (q, t) = recv_at[&(r, peer as usize, tag)];
                        assert_eq!(
                            w[r].wave_of(i),
                            w[q].wave_of(t),
                            "{algo}: ends of a message"
                        );
                        floor(r, i).max(floor(q, t))
                    }
                    Step::Recv { .. } => continue,
                    Step::Copy { .. } => floor(r, i),
                };
                assert_eq!(w[r].wave_of(i), want, "{algo} rank {r} step {i}");
            }
        }
        assert!(w.iter().map(|x| x.len()).max().unwrap() >= 1);
    }
}

/// Each rank grouping alone (each step right after its own dependencies) is not
/// sound: receives posted early fill wave 0 with messages their senders send late.
/// Bruck on 4 ranks is the smallest case; the wave check says so.
#[test]
fn grouping_each_rank_alone_deadlocks_and_is_rejected() {
    let topo = Topology::preset("flat:4").unwrap();
    let s = build_uniform(Algorithm::Bruck, &topo, 1, &AlgoOptions::default()).unwrap();
    let local: Vec<Waves> = s.iter().map(local_waves).collect();
    let e = verify_waves(&s, &local).unwrap_err();
    assert!(e.message.contains("deadlock under group semantics"), "{e}");
    verify_waves(&s, &group_waves(&s).unwrap()).unwrap();
}

/// Each step in the first wave after its own dependencies, ignoring the peers.
fn local_waves(s: &Schedule) -> Waves {
    let mut w = vec![0u32; s.len()];
    for i in 0..s.len() {
        w[i] = s
            .deps(i as StepId)
            .iter()
            .map(|&d| w[d as usize] + 1)
            .max()
            .unwrap_or(0);
    }
    Waves::from_assignment(s, w)
}

fn r(buf: Buf, off: usize, len: usize) -> Region {
    Region::new(buf, off, len)
}

/// Two ranks: rank 0 sends tag 2 then (depending on it) tag 1; rank 1 receives both
/// at once. Tags match, so the verifier accepts it, but grouped rank by rank the issue
/// order would pair tag 2 with tag 1's receive on NCCL.
#[test]
fn order_matching_that_differs_from_tag_matching_is_rejected() {
    let topo = Topology::preset("flat:2").unwrap();
    let sizes = UniformSizes(4);
    let mut b0 = ScheduleBuilder::new(0, 2, "test");
    b0.copy(r(Buf::Send, 0, 4), r(Buf::Recv, 0, 4), &[]);
    let first = b0.send(1, 2, r(Buf::Send, 4, 2), &[]);
    b0.send(1, 1, r(Buf::Send, 6, 2), &[first]);
    b0.recv(1, 3, r(Buf::Recv, 4, 4), &[]);
    let mut b1 = ScheduleBuilder::new(1, 2, "test");
    b1.copy(r(Buf::Send, 4, 4), r(Buf::Recv, 4, 4), &[]);
    b1.recv(0, 1, r(Buf::Recv, 2, 2), &[]);
    b1.recv(0, 2, r(Buf::Recv, 0, 2), &[]);
    b1.send(0, 3, r(Buf::Send, 0, 4), &[]);
    let s = vec![b0.finish(), b1.finish()];
    verify_all_to_all(&s, &topo, &sizes).expect("tag matching is fine");
    let e = verify_waves(&s, &s.iter().map(local_waves).collect::<Vec<_>>()).unwrap_err();
    assert!(
        e.message
            .contains("order matching differs from tag matching"),
        "{e}"
    );
    assert_eq!(e.rank, 0);
    // Grouped across ranks, both ends of each message share a wave: sound.
    verify_waves(&s, &group_waves(&s).unwrap()).unwrap();
}

/// Three ranks where grouping rank by rank creates a cycle the step-level replay does
/// not have: rank 0's wave 0 holds a receive from rank 2 that rank 2 sends only after
/// rank 0's wave 1 (which waits for all of wave 0).
#[test]
fn a_deadlock_that_groups_create_is_rejected() {
    let topo = Topology::preset("flat:3").unwrap();
    // Block sizes: 0->2 and 1->0 and 2->0 are 2 bytes; the rest 0. Copies of own blocks: none.
    let m = MatrixSizes::new(3, vec![0, 0, 2, 2, 0, 0, 2, 0, 0]);
    // rank 0: s0 recv A from 1 -> recv[0..2]; s1 recv B from 2 -> recv[2..4]; s2 send C to 2 after s0.
    let mut b0 = ScheduleBuilder::new(0, 3, "test");
    let s0 = b0.recv(1, 1, r(Buf::Recv, 0, 2), &[]);
    b0.recv(2, 2, r(Buf::Recv, 2, 2), &[]);
    b0.send(2, 3, r(Buf::Send, 0, 2), &[s0]);
    // rank 1: send A.
    let mut b1 = ScheduleBuilder::new(1, 3, "test");
    b1.send(0, 1, r(Buf::Send, 0, 2), &[]);
    // rank 2: recv C, then send B.
    let mut b2 = ScheduleBuilder::new(2, 3, "test");
    let c = b2.recv(0, 3, r(Buf::Recv, 0, 2), &[]);
    b2.send(0, 2, r(Buf::Send, 0, 2), &[c]);
    let s = vec![b0.finish(), b1.finish(), b2.finish()];
    verify_all_to_all(&s, &topo, &m).expect("deadlock-free under rendezvous per step");
    let e = verify_waves(&s, &s.iter().map(local_waves).collect::<Vec<_>>()).unwrap_err();
    assert!(e.message.contains("deadlock under group semantics"), "{e}");
    verify_waves(&s, &group_waves(&s).unwrap()).unwrap();
}
