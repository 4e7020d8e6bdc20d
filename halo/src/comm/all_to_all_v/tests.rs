//! The ways of exchanging the counts, forced per communicator: the bytes, the
//! errors and the message counts of each.
//!
//! Over 800 lines: the tests share their helpers (the counts, the plans with their
//! eager bytes, `routes_counts`, `bad_call`) and most run every way of exchanging the
//! counts, so they stay in one file.

use super::MetaPlan;
use super::plan::model_plan;
use crate::local::{Emulation, LocalCluster};
use crate::topology::{Level, Topology};
use crate::{Algorithm, AllGatherAlgorithm, Error, Partition};
use std::time::Duration;

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

/// Elements rank `s` sends to rank `d` (zeros included).
fn count(s: usize, d: usize) -> usize {
    (s * 7 + d * 3) % 5
}

fn plans(n: usize) -> Vec<MetaPlan> {
    let mut p = vec![
        MetaPlan::Agreed,
        MetaPlan::Direct,
        MetaPlan::Gather(AllGatherAlgorithm::Bruck),
        MetaPlan::Gather(AllGatherAlgorithm::Ring),
    ];
    if n.is_power_of_two() {
        p.push(MetaPlan::Gather(AllGatherAlgorithm::RecursiveDoubling));
    }
    p
}

/// The plans with the eager bytes each is tried with: the direct exchange with the
/// default (every block of `count` fits), none (the old two passes), and 5 bytes
/// (blocks of 0-4 `u32`s: some whole, some split inside an element, the rest in the
/// data pass); the others carry none whatever is forced.
fn plans_eager(n: usize) -> Vec<(MetaPlan, Option<usize>)> {
    plans(n)
        .into_iter()
        .flat_map(|p| {
            if p == MetaPlan::Direct {
                vec![(p, None), (p, Some(0)), (p, Some(5))]
            } else {
                vec![(p, Some(5))]
            }
        })
        .collect()
}

/// Every plan x every algorithm (and automatic): every byte lands where it should,
/// on a topology where the forwarding algorithms really forward — with the eager
/// bytes of the direct exchange, also when the forwarding algorithms route the
/// remainders only.
#[test]
fn every_plan_moves_the_right_bytes_with_every_algorithm() {
    for spec in ["nodes:1x4", "nodes:2x2", "nodes:2x3"] {
        let topo = Topology::preset(spec).unwrap();
        let n = topo.size();
        for (plan, eager) in plans_eager(n) {
            let mut algs: Vec<Option<Algorithm>> =
                Algorithm::ALL.iter().copied().map(Some).collect();
            algs.push(None);
            for alg in algs {
                let cluster = LocalCluster::new(topo.clone(), Emulation::off()).unwrap();
                let out = cluster.run(|comm| {
                    comm.set_timeout(Duration::from_secs(20));
                    comm.force_meta_plan(Some(plan));
                    comm.set_eager_v(eager);
                    comm.set_algorithm(alg);
                    let me = comm.rank();
                    let sc: Vec<usize> = (0..n).map(|d| count(me, d)).collect();
                    let rc: Vec<usize> = (0..n).map(|s| count(s, me)).collect();
                    let send: Vec<u32> = (0..n)
                        .flat_map(|d| (0..sc[d]).map(move |i| (me * 10_000 + d * 100 + i) as u32))
                        .collect();
                    let mut recv = vec![u32::MAX; rc.iter().sum()];
                    let routes = plan == MetaPlan::Direct && routes_counts(comm);
                    comm.all_to_all_v(
                        &send,
                        &Partition::new(&sc, &packed(&sc)),
                        &mut recv,
                        &Partition::new(&rc, &packed(&rc)),
                    )?;
                    let expect: Vec<u32> = (0..n)
                        .flat_map(|s| (0..rc[s]).map(move |i| (s * 10_000 + me * 100 + i) as u32))
                        .collect();
                    assert_eq!(recv, expect, "{spec} {plan:?} {eager:?} {alg:?} rank {me}");
                    Ok((
                        routes,
                        comm.v_calls(),
                        comm.v_eager_only(),
                        (
                            comm.eager_v(),
                            routes_counts(comm),
                            comm.direct_eager_floor(),
                        ),
                        comm.last_algorithm(),
                    ))
                });
                let what = format!("{spec} {plan:?} eager {eager:?} {alg:?}");
                for (r, x) in out.into_iter().enumerate() {
                    let (routes, calls, eager_only, (c, routes_next, floor), last) =
                        x.unwrap_or_else(|e| panic!("{what} rank {r}: {e}"));
                    let want = if plan == MetaPlan::Agreed {
                        (0, 1)
                    } else {
                        (1, 0)
                    };
                    assert_eq!(calls, want, "{what} rank {r}");
                    // Blocks of at most 16 bytes: all eager with the default,
                    // which learns the fewest eager bytes for the next call (padded
                    // where the model routes the count messages, else unpadded and,
                    // across hosts, at least `EAGER_V_DIRECT`); with 5
                    // eager bytes the remainders go right behind the counts unless
                    // a forced algorithm other than Flat carries them, or the model
                    // routes the count messages (then the data pass does).
                    let behind = u64::from(alg.is_none_or(|a| a == Algorithm::Flat) && !routes);
                    let (want_c, want_eager) = match (plan, eager) {
                        (MetaPlan::Direct, None) if routes_next => {
                            (super::knobs::EAGER_V_LEARN_MIN, 1)
                        }
                        (MetaPlan::Direct, None) => (super::knobs::EAGER_V_LEARN_MIN.max(floor), 1),
                        (MetaPlan::Direct, Some(5)) => (5, behind),
                        _ => (0, 0),
                    };
                    assert_eq!((c, eager_only), (want_c, want_eager), "{what} rank {r}");
                    if want_eager == 1 && !routes {
                        assert_eq!(last, Some(Algorithm::Flat), "{what} rank {r}");
                    } else if alg.is_some() {
                        assert_eq!(last, alg, "{what} rank {r}");
                    }
                }
            }
        }
    }
}

/// Whether the model routes the count messages of `comm`'s next call (automatic
/// mode, the direct plan, eager bytes, no remainders expected) with an algorithm
/// other than the direct exchange (across hosts, for small messages: HALO's).
fn routes_counts(comm: &mut crate::Communicator) -> bool {
    let plan = comm.meta_plan();
    let eager = comm.eager_for(plan);
    let spec = comm.speculate_v();
    eager > 0 && comm.count_route(eager, spec).unwrap().routed.is_some()
}

/// One rank's call of a bad case: `Ok` per rank, or the error.
fn bad_call(plan: MetaPlan, eager: Option<usize>, case: u8) -> Vec<Result<(), Error>> {
    let topo = Topology::preset("nodes:2x3").unwrap();
    let n = topo.size();
    let cluster = LocalCluster::new(topo, Emulation::off()).unwrap();
    cluster
        .run(|comm| {
            comm.set_timeout(Duration::from_secs(10));
            comm.force_meta_plan(Some(plan));
            comm.set_eager_v(eager);
            let me = comm.rank();
            let mut sc = vec![1usize; n];
            let rc = vec![1usize; n];
            let mut sd = packed(&sc);
            match case {
                // Rank 1 sends two elements to rank 4, which expects one.
                0 if me == 1 => sc[4] = 2,
                // Rank 2 passes an overflowing displacement, and rank 0 sends two
                // elements to rank 5 (the invalid rank is named to the others,
                // the disagreeing pair each other).
                1 if me == 2 => sd[3] = usize::MAX,
                1 if me == 0 => sc[5] = 2,
                // Rank 3 expects nothing from itself but sends one element.
                2 if me == 3 => sc[3] = 1,
                _ => {}
            }
            let mut rc = rc;
            if case == 2 && me == 3 {
                rc[3] = 0;
            }
            let send = vec![me as u16; sc.iter().sum::<usize>() + 1];
            let mut recv = vec![0u16; rc.iter().sum()];
            let r = comm.all_to_all_v(
                &send,
                &Partition::new(&sc, &sd),
                &mut recv,
                &Partition::new(&rc, &packed(&rc)),
            );
            // The communicator stays usable.
            let ok = vec![1usize; n];
            let mut recv = vec![0u16; n];
            comm.all_to_all_v(
                &vec![me as u16; n],
                &Partition::new(&ok, &packed(&ok)),
                &mut recv,
                &Partition::new(&ok, &packed(&ok)),
            )?;
            assert_eq!(recv, (0..n as u16).collect::<Vec<_>>());
            Ok(r)
        })
        .into_iter()
        .map(|r| r.expect("the call after the bad one succeeds"))
        .collect()
}

/// Bad counts fail every rank, the same way whichever plan exchanged the counts:
/// the same error kind, peer and message on every rank as the three passes give.
#[test]
fn every_plan_fails_every_rank_exactly_as_the_three_passes_do() {
    for case in 0..3 {
        let agreed = bad_call(MetaPlan::Agreed, None, case);
        for (r, e) in agreed.iter().enumerate() {
            let e = e.as_ref().expect_err("every rank fails");
            println!("case {case} rank {r}: {e}");
        }
        match case {
            0 => {
                for (r, e) in agreed.iter().enumerate() {
                    let e = e.as_ref().unwrap_err();
                    assert!(matches!(e, Error::InvalidUsage { .. }), "rank {r}: {e:?}");
                    let want = match r {
                        1 => 4,
                        4 => 1,
                        _ => 1,
                    };
                    assert_eq!(e.peer(), Some(want), "rank {r}: {e}");
                    if r == 1 || r == 4 {
                        let m = e.to_string();
                        assert!(m.contains("4 bytes") && m.contains("2 bytes"), "{m}");
                    }
                }
            }
            1 => {
                for (r, e) in agreed.iter().enumerate() {
                    let e = e.as_ref().unwrap_err();
                    match r {
                        2 => assert!(
                            matches!(e, Error::InvalidArgument { peer: Some(3), .. }),
                            "{e:?}"
                        ),
                        0 => assert_eq!(e.peer(), Some(5), "{e}"),
                        5 => assert_eq!(e.peer(), Some(0), "{e}"),
                        _ => assert!(
                            matches!(e, Error::InvalidUsage { peer: Some(0), .. }),
                            "rank {r}: {e:?}"
                        ),
                    }
                }
            }
            _ => {
                for (r, e) in agreed.iter().enumerate() {
                    let e = e.as_ref().unwrap_err();
                    assert!(
                        matches!(e, Error::InvalidUsage { peer: Some(3), .. }),
                        "rank {r}: {e:?}"
                    );
                }
            }
        }
        // The direct exchange with its default eager bytes (the blocks of 2 bytes
        // all go with the counts), none, and 1 (half of each block, the rest in the
        // data pass of the call after the bad one).
        for (plan, eager) in plans_eager(6)
            .into_iter()
            .skip(1)
            .chain([(MetaPlan::Direct, Some(1))])
        {
            assert_eq!(
                bad_call(plan, eager, case),
                agreed,
                "case {case}, {plan:?}, eager {eager:?}"
            );
        }
    }
}

/// Messages per call: the one-pass plan sends `n - 1` messages of counts per rank,
/// carrying blocks of up to `eager_v()` bytes, and the remainders of larger blocks
/// right behind them (no data pass), or with that turned off in the data pass;
/// without eager bytes always the data pass; the three passes send more. Every byte
/// checked.
#[test]
fn one_metadata_pass_is_one_round_of_messages() {
    let topo = Topology::preset("nodes:2x2").unwrap();
    let n = topo.size() as u64;
    let round = n * (n - 1);
    let direct = Some(MetaPlan::Direct);
    // With flat forced the count messages go direct: at least `EAGER_V_DIRECT`
    // bytes of each block with them.
    let (e1, s1) = (super::knobs::EAGER_V_DIRECT + 1, super::SPECULATE_V);
    // (plan, eager bytes, speculated bytes, block bytes, messages, calls without a
    // data pass).
    let cases = [
        // The model picks the direct exchange for 4 ranks: one round.
        (None, None, None, 3, round, 1),
        (direct, None, None, 3, round, 1),
        (direct, None, None, super::knobs::EAGER_V_DIRECT, round, 1),
        // One byte more than the eager part: the remainder right behind the counts
        // (two messages per pair, no data pass), up to the largest speculated.
        (direct, None, None, e1, 2 * round, 1),
        (
            direct,
            None,
            None,
            super::knobs::EAGER_V_DIRECT + s1,
            2 * round,
            1,
        ),
        (direct, Some(2), None, 3, 2 * round, 1),
        // Beyond it, or with speculation off: counts, then the data pass.
        (
            direct,
            None,
            None,
            super::knobs::EAGER_V_DIRECT + s1 + 1,
            2 * round,
            0,
        ),
        (direct, None, Some(0), e1, 2 * round, 0),
        (direct, Some(2), Some(0), 3, 2 * round, 0),
        // HALO_A2AV_EAGER=0: the count exchange, then the data pass, as before.
        (direct, Some(0), None, 3, 2 * round, 0),
        // Two uniform passes of counts (n - 1 messages each with the flat fan-out,
        // fewer with Bruck's) on top of the data.
        (Some(MetaPlan::Agreed), None, None, 3, 0, 0),
    ];
    let mut direct_no_eager = 0;
    for (plan, eager, spec, block, want, eager_calls) in cases {
        let cluster = LocalCluster::new(topo.clone(), Emulation::off()).unwrap();
        let traffic = cluster.traffic();
        let out = cluster.run(|comm| {
            comm.force_meta_plan(plan);
            comm.set_eager_v(eager);
            comm.set_speculate_v(spec);
            comm.set_algorithm(Some(Algorithm::Flat));
            let (me, n) = (comm.rank(), comm.size());
            let c = vec![block; n];
            let send: Vec<u8> = (0..n * block)
                .map(|k| (me * 31 + k * 7 + k / block) as u8)
                .collect();
            let mut recv = vec![0u8; n * block];
            comm.all_to_all_v(
                &send,
                &Partition::new(&c, &packed(&c)),
                &mut recv,
                &Partition::new(&c, &packed(&c)),
            )?;
            for (k, &b) in recv.iter().enumerate() {
                let (s, i) = (k / block, k % block);
                let sent = me * block + i; // index of the byte in rank s's send
                assert_eq!(
                    b,
                    (s * 31 + sent * 7 + sent / block) as u8,
                    "rank {me} byte {k}"
                );
            }
            Ok((comm.v_calls(), comm.v_eager_only()))
        });
        let calls: Vec<_> = out.into_iter().map(|r| r.unwrap()).collect();
        let messages = traffic.messages_crossing(Level::Device);
        let what = format!("{plan:?} eager {eager:?} speculated {spec:?} block {block}");
        println!("{what}: {calls:?}, {messages} messages");
        if plan == Some(MetaPlan::Agreed) {
            assert!(calls.iter().all(|&c| c == ((0, 1), 0)), "{what}: {calls:?}");
            assert!(messages > direct_no_eager, "{what}: {messages}");
        } else {
            assert!(
                calls.iter().all(|&c| c == ((1, 0), eager_calls)),
                "{what}: {calls:?}"
            );
            assert_eq!(messages, want, "{what}");
            if eager == Some(0) {
                direct_no_eager = messages;
            }
        }
    }
}

/// Across hosts of the same number of ranks the count messages take the two hops
/// in automatic mode ([`super::hops`]): on 4 nodes of 2 ranks 3 messages between
/// nodes per rank and call instead of 6, every byte right and no data pass. Blocks
/// larger than the eager bytes learned take a data pass once (the two hops carry
/// no remainders), then go whole with the counts (learned up to 16 KiB); beyond
/// that the call after goes direct with the remainders right behind the counts.
#[test]
fn count_messages_take_two_hops_across_hosts() {
    let topo = Topology::preset("nodes:4x2").unwrap();
    let n = topo.size();
    let run = |alg: Option<Algorithm>, blocks: &[usize]| {
        let cluster = LocalCluster::new(topo.clone(), Emulation::off()).unwrap();
        let traffic = cluster.traffic();
        let out = cluster.run(|comm| {
            comm.set_algorithm(alg);
            let me = comm.rank();
            let mut lasts = Vec::new();
            for (call, &block) in blocks.iter().enumerate() {
                let c = vec![block; n];
                let byte = |s: usize, d: usize, i: usize| (s * 31 + d * 7 + i + call) as u8;
                let send: Vec<u8> = (0..n)
                    .flat_map(|d| (0..block).map(move |i| byte(me, d, i)))
                    .collect();
                let mut recv = vec![0u8; n * block];
                let routes = routes_counts(comm);
                comm.all_to_all_v(
                    &send,
                    &Partition::new(&c, &packed(&c)),
                    &mut recv,
                    &Partition::new(&c, &packed(&c)),
                )?;
                let want: Vec<u8> = (0..n)
                    .flat_map(|s| (0..block).map(move |i| byte(s, me, i)))
                    .collect();
                assert_eq!(recv, want, "{alg:?} block {block} rank {me} call {call}");
                lasts.push((comm.last_algorithm(), routes, comm.v_eager_only()));
            }
            Ok((comm.v_eager_only(), lasts))
        });
        let out: Vec<_> = out.into_iter().map(|r| r.unwrap()).collect();
        (out, traffic.messages_crossing(Level::Node))
    };
    let (flat, halo) = (Some(Algorithm::Flat), Some(Algorithm::Halo));
    let (routed, routed_msgs) = run(None, &[3, 3]);
    let (direct, direct_msgs) = run(flat, &[3, 3]);
    println!("messages between nodes: two hops {routed_msgs}, direct {direct_msgs}");
    for r in 0..n {
        assert_eq!(
            routed[r],
            (2, vec![(halo, true, 1), (halo, true, 2)]),
            "rank {r}"
        );
        assert_eq!(
            direct[r],
            (2, vec![(flat, false, 1), (flat, false, 2)]),
            "rank {r}"
        );
    }
    // Per rank and call: 6 messages off-node direct, 3 (one per other node) in
    // two hops.
    assert_eq!(direct_msgs, 2 * 8 * 6);
    assert_eq!(routed_msgs, 2 * 8 * 3);
    // 2 KiB blocks: the first call after 3-byte ones carries 64 bytes of each and
    // takes a data pass, the next carries them whole; 20,000-byte blocks (above
    // 16 KiB): a data pass, then direct with the remainders behind the counts.
    let (mixed, _) = run(None, &[3, 3, 2048, 2048, 20_000, 20_000]);
    for (r, (_, calls)) in mixed.into_iter().enumerate() {
        // (routed, calls without a data pass so far); the data passes' algorithm
        // is the tuner's.
        let got: Vec<_> = calls.iter().map(|&(_, routes, e)| (routes, e)).collect();
        assert_eq!(
            got[2..],
            [(true, 2), (true, 3), (true, 3), (false, 4)],
            "rank {r}: {calls:?}"
        );
        assert_eq!(
            (calls[3].0, calls[5].0),
            (halo, flat),
            "rank {r}: {calls:?}"
        );
    }
}

/// Ranks that carry different numbers of bytes with the counts (`set_eager_v`
/// differs, a misuse) send count messages of other lengths than their receivers
/// expect: every rank fails with a size mismatch, none hangs, none takes wrong
/// bytes, and the communicator works again once they agree — direct (one host,
/// flat forced) and in two hops (two hosts, automatic).
#[test]
fn count_messages_of_another_length_fail_every_rank() {
    for (spec, alg) in [("nodes:1x4", Some(Algorithm::Flat)), ("nodes:2x2", None)] {
        count_messages_of_another_length(spec, alg);
    }
}

fn count_messages_of_another_length(spec: &str, alg: Option<Algorithm>) {
    let topo = Topology::preset(spec).unwrap();
    let n = topo.size();
    let timeout = Duration::from_secs(5);
    let out = LocalCluster::new(topo, Emulation::off())
        .unwrap()
        .run(|comm| {
            comm.set_timeout(timeout);
            comm.set_algorithm(alg);
            let hops = routes_counts(comm);
            let me = comm.rank();
            // Blocks of 150 bytes: rank 1 carries 100 of them with the counts,
            // the others all 150 (its messages are shorter, theirs to it longer).
            comm.set_eager_v(Some(if me == 1 { 100 } else { 1024 }));
            let c = vec![150usize; n];
            let send = vec![me as u8 + 1; n * 150];
            let mut recv = vec![0u8; n * 150];
            let d = packed(&c);
            let p = Partition::new(&c, &d);
            let start = std::time::Instant::now();
            let bad = comm.all_to_all_v(&send, &p, &mut recv, &p);
            let took = start.elapsed();
            comm.set_eager_v(None);
            let mut again = vec![0u8; n * 150];
            let good = comm.all_to_all_v(&send, &p, &mut again, &p);
            Ok((hops, bad, took, good.map(|()| again)))
        });
    let out: Vec<_> = out.into_iter().map(|x| x.unwrap()).collect();
    for (r, (_, bad, took, good)) in out.iter().enumerate() {
        println!(
            "{spec} rank {r}: {took:?} {bad:?}; after: {:?}",
            good.as_ref().err()
        );
    }
    for (r, (hops, bad, took, good)) in out.into_iter().enumerate() {
        assert_eq!(hops, alg.is_none(), "{spec} rank {r}");
        let e = bad.unwrap_err();
        println!("{spec} rank {r} after {took:?}: {e}");
        assert!(took < timeout / 2, "rank {r} took {took:?}");
        assert!(
            matches!(e, Error::InvalidUsage { .. }) && e.to_string().contains("mismatch"),
            "rank {r}: {e:?}"
        );
        let again = good.unwrap_or_else(|e| panic!("rank {r}, the call after: {e}"));
        let want: Vec<u8> = (0..n).flat_map(|s| vec![s as u8 + 1; 150]).collect();
        assert_eq!(again, want, "rank {r}");
    }
}

/// The driven direct exchange waits as the engine does: a rank that never calls
/// makes the others time out naming it (the count message they wait for), and an
/// abort from another thread ends the wait at once.
#[test]
fn the_driven_exchange_times_out_and_aborts() {
    let topo = Topology::preset("nodes:1x4").unwrap();
    let n = topo.size();
    let timeout = Duration::from_millis(300);
    let out = LocalCluster::new(topo, Emulation::off())
        .unwrap()
        .run(|comm| {
            comm.set_timeout(timeout);
            let me = comm.rank();
            if me == 1 {
                std::thread::sleep(timeout * 4);
                return Ok(None);
            }
            // Blocks of 9000 bytes: remainders behind the counts.
            let c = vec![9000usize; n];
            let send = vec![me as u8; n * 9000];
            let mut recv = vec![0u8; n * 9000];
            let handle = comm.abort_handle();
            let aborter = (me == 3).then(|| {
                std::thread::spawn(move || {
                    std::thread::sleep(Duration::from_millis(50));
                    handle.abort();
                })
            });
            let start = std::time::Instant::now();
            let e = comm
                .all_to_all_v(
                    &send,
                    &Partition::new(&c, &packed(&c)),
                    &mut recv,
                    &Partition::new(&c, &packed(&c)),
                )
                .unwrap_err();
            if let Some(a) = aborter {
                a.join().unwrap();
            }
            Ok(Some((e, start.elapsed())))
        });
    for (r, x) in out.into_iter().enumerate() {
        let Some((e, took)) = x.unwrap() else {
            continue;
        };
        println!("rank {r} after {took:?}: {e}");
        if r == 3 {
            assert!(matches!(e, Error::Aborted { .. }), "rank {r}: {e:?}");
            assert!(took < timeout, "rank {r} took {took:?}");
        } else {
            assert!(
                matches!(e, Error::Timeout { peer: Some(1), .. }),
                "rank {r}: {e:?}"
            );
            assert!(e.to_string().contains("count message from rank 1"), "{e}");
            assert!(
                took >= timeout && took < timeout * 3,
                "rank {r} took {took:?}"
            );
        }
    }
}

/// Blocks around the eager size (0, 1, `C - 1`, `C`, `C + 1`, `3 C` bytes) between
/// gaps in both buffers, the remainders right behind the counts, or in the data
/// pass of every algorithm (and automatic), or some each way (at most `C` bytes
/// behind the counts: the blocks of `C + 1`), twice per communicator (the staging
/// reused): every byte right, the gaps untouched.
#[test]
fn eager_parts_and_remainders_land_byte_exact() {
    let topo = Topology::preset("nodes:2x3").unwrap();
    let n = topo.size();
    for c in [super::knobs::EAGER_V, 100] {
        let sizes = [0, 1, c - 1, c, c + 1, 3 * c];
        let count = |s: usize, d: usize| sizes[(s * 5 + d * 2 + s * d) % sizes.len()];
        let byte = |s: usize, d: usize, i: usize, call: usize| {
            (s * 31 + d * 7 + i * 13 + i / 251 + call * 5) as u8
        };
        let mut algs: Vec<Option<Algorithm>> = Algorithm::ALL.iter().copied().map(Some).collect();
        algs.push(None);
        let runs = algs.into_iter().flat_map(|alg| {
            let specs = if alg.is_none_or(|a| a == Algorithm::Flat) {
                vec![None, Some(0), Some(c)]
            } else {
                vec![None]
            };
            specs.into_iter().map(move |spec| (alg, spec))
        });
        for (alg, spec) in runs {
            let cluster = LocalCluster::new(topo.clone(), Emulation::off()).unwrap();
            let out = cluster.run(|comm| {
                comm.set_timeout(Duration::from_secs(20));
                comm.force_meta_plan(Some(MetaPlan::Direct));
                // Fixed: learning would carry the blocks of 3 C whole.
                comm.set_eager_v(Some(c));
                comm.set_speculate_v(spec);
                comm.set_algorithm(alg);
                assert_eq!(comm.eager_v(), c);
                // Where the model routes the count messages of the first call, its
                // remainders take the data pass (no remainders were expected).
                let routes = routes_counts(comm);
                let me = comm.rank();
                let sc: Vec<usize> = (0..n).map(|d| count(me, d)).collect();
                let rc: Vec<usize> = (0..n).map(|s| count(s, me)).collect();
                let gapped = |counts: &[usize], gap: usize| {
                    let mut at = 0;
                    counts
                        .iter()
                        .map(|&k| {
                            at += gap;
                            let d = at;
                            at += k;
                            d
                        })
                        .collect::<Vec<_>>()
                };
                let (sd, rd) = (gapped(&sc, 2), gapped(&rc, 3));
                for call in 0..2 {
                    let mut send = vec![0x5au8; sd[n - 1] + sc[n - 1]];
                    for d in 0..n {
                        for i in 0..sc[d] {
                            send[sd[d] + i] = byte(me, d, i, call);
                        }
                    }
                    let mut recv = vec![0xa5u8; rd[n - 1] + rc[n - 1] + 3];
                    comm.all_to_all_v(
                        &send,
                        &Partition::new(&sc, &sd),
                        &mut recv,
                        &Partition::new(&rc, &rd),
                    )?;
                    let mut want = vec![0xa5u8; recv.len()];
                    for s in 0..n {
                        for i in 0..rc[s] {
                            want[rd[s] + i] = byte(s, me, i, call);
                        }
                    }
                    let what = format!("C {c} {alg:?} speculated {spec:?} rank {me}");
                    assert_eq!(recv, want, "{what} call {call}");
                }
                Ok((routes, comm.v_eager_only(), comm.last_algorithm()))
            });
            for (r, x) in out.into_iter().enumerate() {
                let what = format!("C {c} {alg:?} speculated {spec:?} rank {r}");
                let (routes, eager_only, last) = x.unwrap_or_else(|e| panic!("{what}: {e}"));
                // Blocks of 3 C on every call: a data pass, unless their remainders
                // all went behind the counts (the second call's always: the first
                // one's matrix says remainders follow).
                let behind = spec.is_none() && alg.is_none_or(|a| a == Algorithm::Flat);
                let want = match (behind, routes) {
                    (false, _) => 0,
                    (true, true) => 1,
                    (true, false) => 2,
                };
                assert_eq!(eager_only, want, "{what} routes {routes}");
                if behind {
                    assert_eq!(last, Some(Algorithm::Flat), "{what}");
                } else if alg.is_some() {
                    assert_eq!(last, alg, "{what}");
                }
            }
        }
    }
}

/// The learned eager bytes: the largest block plus an eighth, rounded up to 64
/// bytes, 64 to 4096; kept while the blocks fit and need more than half; the
/// default above 4096 or where padding every block would send over four times the
/// data.
#[test]
fn learn_eager_follows_the_largest_block() {
    use super::knobs::{EAGER_V, learn_eager};
    let uniform = |n: usize, b: usize| (n * n * b) as u64;
    // Tiny blocks: 64 bytes, the least (not the default 1 KiB).
    assert_eq!(learn_eager(EAGER_V, 10, uniform(4, 5), 4, false), 64);
    assert_eq!(learn_eager(EAGER_V, 0, 0, 4, false), 64);
    // Larger blocks: the largest plus an eighth, rounded up to 64.
    assert_eq!(learn_eager(EAGER_V, 2080, uniform(4, 2000), 4, false), 2368);
    assert_eq!(learn_eager(64, 1000, uniform(8, 900), 8, false), 1152);
    // Kept while every block fits and needs more than half of it.
    assert_eq!(learn_eager(2048, 2048, uniform(4, 2000), 4, false), 2048);
    assert_eq!(learn_eager(2048, 1000, uniform(4, 900), 4, false), 2048);
    assert_eq!(learn_eager(2048, 900, uniform(4, 900), 4, false), 1024);
    assert_eq!(learn_eager(64, 64, uniform(4, 64), 4, false), 64);
    // One byte over: grows.
    assert_eq!(learn_eager(64, 65, uniform(4, 65), 4, false), 128);
    // At most 4 KiB; a block above it: the default.
    assert_eq!(learn_eager(EAGER_V, 4000, uniform(4, 4000), 4, false), 4096);
    assert_eq!(learn_eager(EAGER_V, 4096, uniform(4, 4096), 4, false), 4096);
    assert_eq!(learn_eager(4096, 4097, uniform(4, 4097), 4, false), EAGER_V);
    assert_eq!(learn_eager(64, usize::MAX, u64::MAX, 64, false), EAGER_V);
    // One 4000-byte block among 63 empty ones (8 ranks): padding 64 blocks to 4 KiB
    // is 65x the data: the default. Up to 1 KiB padding is always taken.
    assert_eq!(learn_eager(EAGER_V, 4000, 4000, 8, false), EAGER_V);
    assert_eq!(learn_eager(EAGER_V, 900, 900, 8, false), EAGER_V);
    assert_eq!(learn_eager(64, 500, 500, 8, false), 576);
    // Padding to four times the data is still taken (2 x 2 blocks of 2304 B for
    // 2304 B of data), a byte more is not.
    assert_eq!(learn_eager(EAGER_V, 2000, 2304, 2, false), 2304);
    assert_eq!(learn_eager(EAGER_V, 2000, 2303, 2, false), EAGER_V);
    // Unpadded (the two hops across hosts): up to 16 KiB, whatever the padding
    // would have been.
    assert_eq!(learn_eager(EAGER_V, 4000, 4000, 8, true), 4544);
    assert_eq!(learn_eager(EAGER_V, 14000, 14000, 8, true), 15808);
    assert_eq!(learn_eager(EAGER_V, 16384, 16384, 8, true), 16384);
    assert_eq!(learn_eager(16384, 16385, 16385, 8, true), EAGER_V);
}

/// Only the direct exchange carries eager bytes: the logarithmic all-gathers and
/// the three passes carry none, whatever is forced.
#[test]
fn only_the_direct_exchange_is_eager() {
    let topo = Topology::preset("nodes:2x2").unwrap();
    let mut comms = LocalCluster::new(topo, Emulation::off())
        .unwrap()
        .into_communicators();
    let comm = &mut comms[0];
    comm.set_algorithm(Some(Algorithm::Flat));
    for (plan, want) in [
        // Learned (the 1 KiB default before any call), at least `EAGER_V_DIRECT`
        // where the count messages go direct (forced flat here).
        (MetaPlan::Direct, super::knobs::EAGER_V_DIRECT),
        (MetaPlan::Gather(AllGatherAlgorithm::Bruck), 0),
        (MetaPlan::Gather(AllGatherAlgorithm::RecursiveDoubling), 0),
        (MetaPlan::Agreed, 0),
    ] {
        comm.force_meta_plan(Some(plan));
        comm.set_eager_v(None);
        assert_eq!(comm.eager_v(), want, "{plan:?}");
        comm.set_eager_v(Some(77));
        assert_eq!(comm.eager_v(), if want > 0 { 77 } else { 0 }, "{plan:?}");
        comm.set_eager_v(Some(usize::MAX));
        assert_eq!(
            comm.eager_v(),
            if want > 0 {
                super::knobs::EAGER_V_MAX
            } else {
                0
            },
            "{plan:?}"
        );
    }
}

/// The model gathers where the simulated all-gather is no slower than two passes:
/// small communicators, never above `GATHER_MAX_RANKS`.
#[test]
fn the_model_gathers_small_communicators_only() {
    for (spec, gathers) in [
        ("nodes:1x4", true),
        ("nodes:4x2", true),
        ("frontier:2", true),
        ("frontier:8", false),
        ("frontier:16", false),
    ] {
        let topo = Topology::preset(spec).unwrap();
        let comms = LocalCluster::new(topo, Emulation::off())
            .unwrap()
            .into_communicators();
        let plan = model_plan(&comms[0].core, None);
        println!("{spec}: {plan:?}");
        assert_eq!(plan != MetaPlan::Agreed, gathers, "{spec}: {plan:?}");
        // The environment's override decides by size alone.
        assert_eq!(model_plan(&comms[0].core, Some(0)), MetaPlan::Agreed);
        assert_ne!(model_plan(&comms[0].core, Some(4096)), MetaPlan::Agreed);
    }
}

/// Automatic mode measures on both count exchanges (and on the remainders beyond
/// the eager bytes): every rank tries the same
/// candidates in the same order and decides alike, after three passes (where only
/// the metadata pass's algorithm may forward) as after the gathered counts, every
/// byte right on every call.
#[test]
fn both_count_exchanges_measure_alike_on_every_rank() {
    use crate::select::size_class as class;
    use crate::tune::{MAX_CANDIDATES, trial_call, trial_calls};
    let topo = Topology::preset("nodes:2x3").unwrap();
    let n = topo.size();
    // The tuner's class is the mean of what the data pass moves: with `c` eager
    // bytes per block, the remainders' (the blocks, of at most 16 bytes, would all
    // go with the counts with the default, and no data pass would ever be measured;
    // so would the remainders, right behind the counts, unless turned off).
    let mean_beyond = |c: usize| {
        let total: usize = (0..n)
            .flat_map(|s| (0..n).map(move |d| (count(s, d) * 4).saturating_sub(c)))
            .sum();
        total / (n * n)
    };
    for (plan, eager) in [
        (MetaPlan::Agreed, None),
        (MetaPlan::Direct, Some(0)),
        (MetaPlan::Direct, Some(5)),
    ] {
        let mean = mean_beyond(eager.unwrap_or(0));
        let cluster = LocalCluster::new(topo.clone(), Emulation::off()).unwrap();
        let out = cluster.run(|comm| {
            comm.set_timeout(Duration::from_secs(20));
            comm.force_meta_plan(Some(plan));
            comm.set_eager_v(eager);
            comm.set_speculate_v(Some(0));
            let me = comm.rank();
            let sc: Vec<usize> = (0..n).map(|d| count(me, d)).collect();
            let rc: Vec<usize> = (0..n).map(|s| count(s, me)).collect();
            let mut ran = Vec::new();
            let mut call = 0u32;
            while comm.tuned_v(mean).is_none() {
                assert!(
                    (call as usize) < trial_calls(class(mean), MAX_CANDIDATES),
                    "no decision"
                );
                let send: Vec<u32> = (0..n)
                    .flat_map(|d| {
                        (0..sc[d]).map(move |i| (me * 10_000 + d * 100 + i) as u32 ^ call)
                    })
                    .collect();
                let mut recv = vec![u32::MAX; rc.iter().sum()];
                comm.all_to_all_v(
                    &send,
                    &Partition::new(&sc, &packed(&sc)),
                    &mut recv,
                    &Partition::new(&rc, &packed(&rc)),
                )?;
                let expect: Vec<u32> = (0..n)
                    .flat_map(|s| {
                        (0..rc[s]).map(move |i| (s * 10_000 + me * 100 + i) as u32 ^ call)
                    })
                    .collect();
                assert_eq!(recv, expect, "{plan:?} rank {me} call {call}");
                ran.push(comm.last_algorithm().unwrap());
                call += 1;
            }
            let calls = comm.v_calls();
            Ok((ran, comm.tuned_v(mean).unwrap(), calls))
        });
        let out: Vec<_> = out.into_iter().map(|r| r.unwrap()).collect();
        let (ran, tuned, calls) = &out[0];
        for (r, o) in out.iter().enumerate() {
            assert_eq!((&o.0, &o.1), (ran, tuned), "{plan:?}: rank {r}");
        }
        let k = ran.len() as u64;
        assert_eq!(
            *calls,
            if plan == MetaPlan::Agreed {
                (0, k)
            } else {
                (k, 0)
            },
            "{plan:?}"
        );
        let cands: Vec<Algorithm> = tuned.times.iter().map(|t| t.0).collect();
        println!("{plan:?}: tried {ran:?}, chose {tuned:?}");
        assert!(cands.len() >= 2, "{plan:?}: {cands:?}");
        let c = class(mean);
        let planned: Vec<Algorithm> = (0..trial_calls(c, cands.len()))
            .map(|k| cands[trial_call(c, cands.len(), k).unwrap().0])
            .collect();
        assert_eq!(ran, &planned, "{plan:?}");
        if plan == MetaPlan::Agreed {
            let forwarding: Vec<_> = cands.iter().filter(|a| a.forwards()).collect();
            assert!(forwarding.len() <= 1, "{forwarding:?}");
        }
    }
}
