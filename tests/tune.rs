//! Measured automatic selection (`halo::tune`): the first calls of a size class try the
//! candidates, all ranks agree on the fastest through one all-reduce, forced algorithms
//! win, and the bytes are exact on every call, trial or not.
#![allow(missing_docs)]

use halo::local::{self, Emulation};
use halo::topology::Topology;
use halo::tune::{MAX_CANDIDATES, TRIALS};
use halo::{Algorithm, Communicator};

/// The byte rank `src` sends rank `dst` at offset `i` in call `call`.
fn byte(src: usize, dst: usize, i: usize, call: usize) -> u8 {
    (src * 31 + dst * 7 + i + call * 13) as u8
}

/// One uniform all-to-all of `block` bytes per peer with a fresh pattern, checked.
fn exact_call(comm: &mut Communicator, block: usize, call: usize) -> halo::Result<Algorithm> {
    let (me, n) = (comm.rank(), comm.size());
    let send: Vec<u8> = (0..n * block)
        .map(|k| byte(me, k / block, k % block, call))
        .collect();
    let mut recv = vec![0xa5u8; n * block];
    comm.all_to_all(&send, &mut recv)?;
    for (k, &b) in recv.iter().enumerate() {
        assert_eq!(
            b,
            byte(k / block, me, k % block, call),
            "rank {me}, call {call}, byte {k} of {block} per peer"
        );
    }
    Ok(comm.last_algorithm().expect("an algorithm ran"))
}

#[test]
fn every_rank_measures_and_picks_the_same_algorithm() {
    for preset in ["nodes:2x4", "frontier:2", "nodes:3x2,ranks=5"] {
        let topo = Topology::preset(preset).unwrap();
        for block in [8usize, 3000, 40 << 10] {
            let out = local::run(&topo, Emulation::off(), |comm| {
                let mut ran = Vec::new();
                let mut call = 0;
                while comm.tuned(block).is_none() {
                    assert!(
                        call < TRIALS * MAX_CANDIDATES,
                        "no decision after {call} calls"
                    );
                    ran.push(exact_call(comm, block, call)?);
                    call += 1;
                }
                let tuned = comm.tuned(block).unwrap();
                // Later calls of the class (another size, same class) use the choice.
                for extra in 0..3 {
                    let a = exact_call(comm, block + 1 - block % 2, call + extra)?;
                    assert_eq!(a, tuned.algorithm);
                }
                Ok((ran, tuned))
            });
            let out: Vec<_> = out.into_iter().map(|r| r.unwrap()).collect();
            let (ran, tuned) = &out[0];
            for (rank, o) in out.iter().enumerate() {
                assert_eq!(
                    &o.1, tuned,
                    "{preset} {block} B: rank {rank} chose differently"
                );
                assert_eq!(
                    &o.0, ran,
                    "{preset} {block} B: rank {rank} tried differently"
                );
            }
            if tuned.times.is_empty() {
                assert!(ran.is_empty() || ran.iter().all(|a| *a == tuned.algorithm));
            } else {
                // Round robin over the candidates, TRIALS calls each, and the choice is
                // the one with the smallest agreed time.
                let cands: Vec<Algorithm> = tuned.times.iter().map(|t| t.0).collect();
                assert!(cands.len() >= 2 && cands.len() <= MAX_CANDIDATES);
                assert_eq!(ran.len(), TRIALS * cands.len());
                for (i, a) in ran.iter().enumerate() {
                    assert_eq!(*a, cands[i % cands.len()]);
                }
                let best = tuned.times.iter().map(|t| t.1).min().unwrap();
                let first_best = tuned.times.iter().find(|t| t.1 == best).unwrap().0;
                assert_eq!(tuned.algorithm, first_best);
                assert!(tuned.times.iter().all(|t| t.1 > 0));
            }
            println!("{preset} {block} B: tried {ran:?}, chose {tuned:?}");
        }
    }
}

#[test]
fn a_forced_algorithm_wins_over_measurement() {
    let topo = Topology::preset("nodes:2x4").unwrap();
    let out = local::run(&topo, Emulation::off(), |comm| {
        let block = 512;
        comm.set_algorithm(Some(Algorithm::Pairwise));
        for call in 0..TRIALS * MAX_CANDIDATES + 2 {
            assert_eq!(exact_call(comm, block, call)?, Algorithm::Pairwise);
        }
        assert!(comm.tuned(block).is_none(), "nothing measured while forced");
        // Back to automatic: the measurement starts, and forcing again still wins.
        comm.set_algorithm(None);
        let first = exact_call(comm, block, 100)?;
        comm.set_algorithm(Some(Algorithm::Bruck));
        assert_eq!(exact_call(comm, block, 101)?, Algorithm::Bruck);
        Ok(first)
    });
    let firsts: Vec<Algorithm> = out.into_iter().map(|r| r.unwrap()).collect();
    assert!(firsts.iter().all(|a| *a == firsts[0]), "{firsts:?}");
}

#[test]
fn one_candidate_needs_no_trial() {
    // One rank: every algorithm is the same copy, so there is nothing to measure.
    let topo = Topology::preset("flat:1").unwrap();
    let out = local::run(&topo, Emulation::off(), |comm| {
        exact_call(comm, 64, 0)?;
        Ok(comm.tuned(64))
    });
    let tuned = out
        .into_iter()
        .next()
        .unwrap()
        .unwrap()
        .expect("decided at once");
    assert!(tuned.times.is_empty());
}
