//! Measured automatic selection (`halo::tune`): the first calls of a size class try the
//! candidates, all ranks agree on the fastest through one all-reduce, forced algorithms
//! win, and the bytes are exact on every call, trial or not — for the uniform
//! all-to-all and for all-to-all-v (keyed by the mean block's class, apart from the
//! uniform classes; a count mismatch in the middle of the trials records nothing).
#![allow(missing_docs)]

use halo::local::{self, Emulation};
use halo::select::size_class;
use halo::topology::Topology;
use halo::tune::{MARGIN, MAX_CANDIDATES, TRIALS, trial_call, trial_calls};

/// The candidate the agreed times should choose: in candidate order, a later one
/// displaces the current choice only when it is more than `MARGIN` faster.
fn expected_choice(times: &[(Algorithm, u64)]) -> Algorithm {
    let mut at = 0;
    for (i, t) in times.iter().enumerate() {
        if (t.1 as f64) < times[at].1 as f64 * (1.0 - MARGIN) {
            at = i;
        }
    }
    times[at].0
}

/// The most trial calls for blocks (or mean blocks) of `block` bytes (with the most
/// candidates).
fn most_trials(block: usize) -> usize {
    trial_calls(size_class(block), MAX_CANDIDATES)
}

/// The candidates trial calls of blocks of `block` bytes run, in call order.
fn planned(block: usize, cands: &[Algorithm]) -> Vec<Algorithm> {
    let class = size_class(block);
    (0..trial_calls(class, cands.len()))
        .map(|c| cands[trial_call(class, cands.len(), c).unwrap().0])
        .collect()
}
use halo::{Algorithm, Communicator, Error, Partition};

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
                while comm.tuning(block) {
                    assert!(call < most_trials(block), "no decision after {call} calls");
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
                // Blocks of calls per candidate, in two passes (`halo::tune::trial_call`),
                // and the choice is the one with the smallest agreed time (a later one
                // by more than MARGIN).
                let cands: Vec<Algorithm> = tuned.times.iter().map(|t| t.0).collect();
                assert!(cands.len() >= 2 && cands.len() <= MAX_CANDIDATES);
                assert_eq!(ran, &planned(block, &cands));
                assert_eq!(tuned.algorithm, expected_choice(&tuned.times));
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
        for call in 0..most_trials(block) + 2 {
            assert_eq!(exact_call(comm, block, call)?, Algorithm::Pairwise);
        }
        assert!(comm.tuned(block).is_none(), "nothing measured while forced");
        assert!(!comm.tuning(block), "no trials while forced");
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

/// Bytes rank `s` sends rank `d` in call `call`: a fixed multiset of counts (zeros
/// included: every 11th entry) rotated by the call, so that every pair's count changes
/// from call to call while the total — hence the mean block and its size class — stays.
fn v_count(n: usize, s: usize, d: usize, call: usize, scale: usize) -> usize {
    let k = (s * n + d + call * 7) % (n * n);
    (k * 37 % 11) * scale
}

/// The mean block of [`v_count`]'s calls: total bytes / n^2.
fn v_mean(n: usize, scale: usize) -> usize {
    (0..n * n).map(|k| (k * 37 % 11) * scale).sum::<usize>() / (n * n)
}

/// The mean block the data pass moves after `eager` bytes of every block went with the
/// counts (`Communicator::eager_v`): the tuner's class of all-to-all-v is that of the
/// remainders (the same on every call, [`v_count`] permuting the same counts).
fn v_mean_beyond(n: usize, scale: usize, eager: usize) -> usize {
    (0..n * n)
        .map(|k| ((k * 37 % 11) * scale).saturating_sub(eager))
        .sum::<usize>()
        / (n * n)
}

/// One all-to-all-v of [`v_count`]'s counts, every received byte checked, receive
/// blocks packed behind a gap of 3 bytes each. With `bad`, rank 1 sends rank 0 one
/// byte more than rank 0 expects.
fn exact_v_call(
    comm: &mut Communicator,
    scale: usize,
    call: usize,
    bad: bool,
) -> halo::Result<Algorithm> {
    let (me, n) = (comm.rank(), comm.size());
    let mut sc: Vec<usize> = (0..n).map(|d| v_count(n, me, d, call, scale)).collect();
    if bad && me == 1 {
        sc[0] += 1;
    }
    let rc: Vec<usize> = (0..n).map(|s| v_count(n, s, me, call, scale)).collect();
    let send: Vec<u8> = (0..n)
        .flat_map(|d| (0..sc[d]).map(move |i| byte(me, d, i, call)))
        .collect();
    let mut rd = Vec::with_capacity(n);
    let mut at = 0;
    for &c in &rc {
        at += 3;
        rd.push(at);
        at += c;
    }
    let mut recv = vec![0xa5u8; at];
    comm.all_to_all_v(
        &send,
        &Partition::packed(&sc),
        &mut recv,
        &Partition::new(&rc, &rd),
    )?;
    for s in 0..n {
        let gap = rd[s] - 3;
        assert!(
            recv[gap..rd[s]].iter().all(|&b| b == 0xa5),
            "rank {me}, call {call}: the gap before rank {s}'s block was written"
        );
        for i in 0..rc[s] {
            assert_eq!(
                recv[rd[s] + i],
                byte(s, me, i, call),
                "rank {me}, call {call}: byte {i} of {} from rank {s}",
                rc[s]
            );
        }
    }
    Ok(comm.last_algorithm().expect("an algorithm ran"))
}

/// Checks that every rank tried the same candidates in the same order and chose the
/// same, in the class's plan of trial calls (`mean`: the mean block), the choice the
/// smallest agreed time (a later candidate by more than MARGIN).
fn check_agreed(what: &str, mean: usize, out: &[(Vec<Algorithm>, halo::tune::Tuned)]) {
    let (ran, tuned) = &out[0];
    for (rank, o) in out.iter().enumerate() {
        assert_eq!(&o.1, tuned, "{what}: rank {rank} chose differently");
        assert_eq!(&o.0, ran, "{what}: rank {rank} tried differently");
    }
    if tuned.times.is_empty() {
        assert!(ran.iter().all(|a| *a == tuned.algorithm), "{what}: {ran:?}");
        return;
    }
    let cands: Vec<Algorithm> = tuned.times.iter().map(|t| t.0).collect();
    assert!(cands.len() >= 2 && cands.len() <= MAX_CANDIDATES, "{what}");
    assert_eq!(ran, &planned(mean, &cands), "{what}");
    assert_eq!(tuned.algorithm, expected_choice(&tuned.times), "{what}");
    assert!(tuned.times.iter().all(|t| t.1 > 0), "{what}");
}

/// The data pass is measured by the mean of what it moves: with the eager bytes of the
/// one-pass count exchange (`Communicator::eager_v`, fixed here at the default 1 KiB)
/// the remainders beyond them. Where every block fits (mean blocks
/// of about 5 B here: counts of 0-10 B), no call has a data pass, nothing is measured
/// and every call is the eager exchange (`Flat`); the 120x scale leaves remainders of a
/// few bytes on average and is measured.
#[test]
fn every_rank_measures_all_to_all_v_alike() {
    for preset in ["nodes:2x4", "frontier:2", "nodes:3x2,ranks=5"] {
        let topo = Topology::preset(preset).unwrap();
        let n = topo.size();
        // Mean blocks of about 5 B, 600 B, 3 KB and 40 KB (before the eager bytes).
        for scale in [1usize, 120, 600, 8000] {
            let out = local::run(&topo, Emulation::off(), |comm| {
                // Fixed at the default: learned eager bytes would make the later calls
                // of the smaller scales one pass (nothing left to measure); so would
                // the remainders sent right behind the counts.
                comm.set_eager_v(Some(1024));
                comm.set_speculate_v(Some(0));
                let eager = comm.eager_v();
                let mean = v_mean_beyond(n, scale, eager);
                if 10 * scale <= eager {
                    // Every block goes with the counts: one pass, no data pass measured;
                    // the count messages go the cost model's way for their size (the
                    // direct exchange, or across nodes a hierarchical one), the same on
                    // every rank at every call.
                    let full = v_mean(n, scale);
                    for call in 0..most_trials(full) + 2 {
                        let ran = exact_v_call(comm, scale, call, false)?;
                        let at = Algorithm::ALL.iter().position(|&a| a == ran).unwrap() as u64;
                        let (mut hi, mut lo) = ([0u64], [0u64]);
                        comm.all_reduce(&[at], &mut hi, halo::ReduceOp::Max)?;
                        comm.all_reduce(&[at], &mut lo, halo::ReduceOp::Min)?;
                        assert_eq!(hi, lo, "call {call}: the ranks ran different algorithms");
                    }
                    assert!(comm.tuned_v(full).is_none(), "eager calls measured");
                    assert!(comm.tuned_v(0).is_none(), "eager calls measured");
                    return Ok(None);
                }
                let mut ran = Vec::new();
                let mut call = 0;
                while comm.tuned_v(mean).is_none() {
                    assert!(call < most_trials(mean), "no decision after {call} calls");
                    ran.push(exact_v_call(comm, scale, call, false)?);
                    call += 1;
                }
                let tuned = comm.tuned_v(mean).unwrap();
                // The uniform all-to-all's class of the same size is its own.
                assert!(
                    comm.tuned(mean).is_none(),
                    "v trials decided a uniform class"
                );
                for extra in 0..3 {
                    assert_eq!(
                        exact_v_call(comm, scale, call + extra, false)?,
                        tuned.algorithm
                    );
                }
                Ok(Some((ran, tuned, mean, eager)))
            });
            let out: Vec<_> = out
                .into_iter()
                .enumerate()
                .map(|(r, x)| x.unwrap_or_else(|e| panic!("{preset} x{scale}: rank {r}: {e}")))
                .collect();
            if out.iter().all(Option::is_none) {
                println!("{preset} x{scale}: every block eager, nothing measured");
                continue;
            }
            let out: Vec<_> = out
                .into_iter()
                .map(|o| o.expect("every rank alike: eager or measured"))
                .collect();
            let (mean, eager) = (out[0].2, out[0].3);
            assert!(out.iter().all(|o| (o.2, o.3) == (mean, eager)), "{preset}");
            let out: Vec<_> = out.into_iter().map(|o| (o.0, o.1)).collect();
            let what = format!("{preset}, mean {mean} B beyond {eager} eager bytes");
            check_agreed(&what, mean, &out);
            println!("{what}: tried {:?}, chose {:?}", out[0].0, out[0].1);
        }
    }
}

#[test]
fn a_count_mismatch_during_v_trials_records_no_trial() {
    let topo = Topology::preset("nodes:2x4").unwrap();
    let n = topo.size();
    let scale = 600;
    let out = local::run(&topo, Emulation::off(), |comm| {
        // The remainders beyond the (fixed) eager bytes are measured (in the data
        // pass: none right behind the counts).
        comm.set_eager_v(Some(1024));
        comm.set_speculate_v(Some(0));
        let mean = v_mean_beyond(n, scale, comm.eager_v());
        let mut ran = Vec::new();
        let mut call = 0;
        let mut failed = 0;
        while comm.tuned_v(mean).is_none() {
            assert!(call < 2 * most_trials(mean) + 2, "no decision");
            // Every other call is a mismatch, including the one before the trial
            // that completes the class.
            if call % 2 == 1 {
                let e = exact_v_call(comm, scale, call, true).expect_err("a mismatch fails");
                assert!(matches!(e, Error::InvalidUsage { .. }), "{e:?}");
                failed += 1;
            } else {
                ran.push(exact_v_call(comm, scale, call, false)?);
            }
            call += 1;
        }
        assert!(failed >= TRIALS, "{failed} mismatches");
        let tuned = comm.tuned_v(mean).unwrap();
        assert_eq!(exact_v_call(comm, scale, call, false)?, tuned.algorithm);
        Ok((ran, tuned, mean))
    });
    let out: Vec<_> = out.into_iter().map(|r| r.unwrap()).collect();
    let mean = out[0].2;
    let out: Vec<_> = out.into_iter().map(|o| (o.0, o.1)).collect();
    check_agreed("nodes:2x4 with mismatches", mean, &out);
}

#[test]
fn a_forced_algorithm_wins_over_v_measurement() {
    let topo = Topology::preset("nodes:2x4").unwrap();
    let n = topo.size();
    // Blocks of up to 3000 B, beyond the (fixed) eager bytes of the count exchange:
    // every call has a data pass, which the forced algorithm runs.
    let scale = 300;
    let out = local::run(&topo, Emulation::off(), |comm| {
        comm.set_eager_v(Some(1024));
        comm.set_speculate_v(Some(0));
        let mean = v_mean_beyond(n, scale, comm.eager_v());
        comm.set_algorithm(Some(Algorithm::Pairwise));
        for call in 0..most_trials(mean) + 2 {
            assert_eq!(exact_v_call(comm, scale, call, false)?, Algorithm::Pairwise);
        }
        assert!(
            comm.tuned_v(mean).is_none(),
            "nothing measured while forced"
        );
        comm.set_algorithm(None);
        let first = exact_v_call(comm, scale, 100, false)?;
        comm.set_algorithm(Some(Algorithm::Bruck));
        assert_eq!(exact_v_call(comm, scale, 101, false)?, Algorithm::Bruck);
        // Back to automatic: the trials go on where they were, on every rank alike.
        comm.set_algorithm(None);
        let second = exact_v_call(comm, scale, 102, false)?;
        Ok((first, second))
    });
    let picks: Vec<_> = out.into_iter().map(|r| r.unwrap()).collect();
    assert!(picks.iter().all(|p| *p == picks[0]), "{picks:?}");
}

/// One rank decides at once. Its all-to-all-v of a block beyond the eager bytes to
/// itself has a data pass (a block that fits has none, and measures nothing; nor does
/// one whose remainder goes right behind the counts, turned off here).
#[test]
fn one_rank_all_to_all_v_needs_no_trial() {
    let topo = Topology::preset("flat:1").unwrap();
    let out = local::run(&topo, Emulation::off(), |comm| {
        comm.set_speculate_v(Some(0));
        let eager = comm.eager_v();
        let block = eager + 1000;
        let send: Vec<u8> = (0..block).map(|i| byte(0, 0, i, 0)).collect();
        let mut recv = vec![0xa5u8; block];
        let p = [block];
        comm.all_to_all_v(
            &send,
            &Partition::packed(&p),
            &mut recv,
            &Partition::packed(&p),
        )?;
        assert_eq!(recv, send);
        Ok(comm.tuned_v(block - eager))
    });
    let tuned = out
        .into_iter()
        .next()
        .unwrap()
        .unwrap()
        .expect("decided at once");
    assert!(tuned.times.is_empty());
}
