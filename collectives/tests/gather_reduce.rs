//! All-gather builders and all-reduce plans, proven symbolically: every all-gather
//! schedule verifies (each rank's block at its place on every rank, no deadlock, no
//! read before write) for many rank counts and block sizes, and every all-reduce plan
//! verifies (matched rounds, each rank's input exactly once in every element, the same
//! expression — so the same bits — on every rank). Broken variants are caught.

use halo_collectives::*;
use halo_topology::Topology;

fn sizes() -> Vec<usize> {
    (1..=17).chain([24, 31, 32, 33, 64]).collect()
}

fn gather_all(alg: AllGatherAlgorithm, n: usize, block: usize) -> Vec<Schedule> {
    (0..n)
        .map(|r| build_all_gather(alg, r, n, block).expect("builds"))
        .collect()
}

#[test]
fn all_gather_builders_verify() {
    for n in sizes() {
        let topo = Topology::preset(&format!("flat:{n}")).unwrap();
        for alg in AllGatherAlgorithm::ALL {
            if !alg.supports(n) {
                assert!(build_all_gather(alg, 0, n, 8).is_err(), "{alg} on {n}");
                continue;
            }
            for block in [0usize, 1, 3, 8, 40] {
                let s = gather_all(alg, n, block);
                let report = verify_all_gather(&s, &topo, block)
                    .unwrap_or_else(|e| panic!("{alg} n={n} block={block}: {e}"));
                if block == 0 {
                    assert_eq!(report.messages, 0);
                    continue;
                }
                let rounds = match alg {
                    AllGatherAlgorithm::Ring => n - 1,
                    _ => n.next_power_of_two().trailing_zeros() as usize,
                };
                assert_eq!(report.messages, n * rounds, "{alg} n={n}");
                // Every rank sends every other rank's block once, whatever the algorithm.
                assert_eq!(
                    report.message_bytes,
                    (n * (n - 1) * block) as u64,
                    "{alg} n={n}"
                );
            }
        }
    }
}

#[test]
fn all_gather_auto_choice() {
    assert_eq!(
        AllGatherAlgorithm::auto(8, 16),
        AllGatherAlgorithm::RecursiveDoubling
    );
    assert_eq!(AllGatherAlgorithm::auto(7, 16), AllGatherAlgorithm::Bruck);
    assert_eq!(
        AllGatherAlgorithm::auto(7, 1 << 20),
        AllGatherAlgorithm::Ring
    );
    for a in AllGatherAlgorithm::ALL {
        assert_eq!(a.name().parse::<AllGatherAlgorithm>().unwrap(), a);
    }
    assert!("tree".parse::<AllGatherAlgorithm>().is_err());
}

#[test]
fn broken_all_gather_is_caught() {
    let n = 5;
    let topo = Topology::preset("flat:5").unwrap();
    let good = gather_all(AllGatherAlgorithm::Ring, n, 4);
    // Rank 2 forwards the wrong block in its last round.
    let mut bad = good.clone();
    bad[2] = good[2].edited(|steps, _| {
        let last = steps.len() - 1;
        if let Step::Send { region, .. } = &mut steps[last] {
            region.offset = (region.offset + 4) % 20;
        }
    });
    assert!(verify_all_gather(&bad, &topo, 4).is_err());
    // Rank 0 does not wait for the block it forwards.
    let mut racy = good.clone();
    racy[0] = good[0].edited(|_, deps| {
        let last = deps.len() - 1;
        deps[last].clear();
    });
    let e = verify_all_gather(&racy, &topo, 4).unwrap_err();
    assert!(e.message.contains("without depending") || e.message.contains("before"));
    // An all-to-all is not an all-gather.
    let a2a: Vec<Schedule> = (0..n)
        .map(|rank| {
            let sizes = UniformSizes(4);
            let ctx = BuildCtx {
                topology: &topo,
                rank,
                layout: Layout::Uniform { block: 4 },
                sizes: &sizes,
                options: &AlgoOptions::default(),
            };
            build(Algorithm::Flat, &ctx).unwrap()
        })
        .collect();
    assert!(verify_all_gather(&a2a, &topo, 4).is_err());
}

fn plans(alg: AllReduceAlgorithm, n: usize, len: usize) -> Vec<Vec<ReduceRound>> {
    (0..n)
        .map(|r| all_reduce_plan(alg, r, n, len).expect("plans"))
        .collect()
}

#[test]
fn all_reduce_plans_verify() {
    for n in sizes() {
        for alg in AllReduceAlgorithm::ALL {
            for len in [0usize, 1, 2, 3, 7, n - 1, n, n + 1, 100] {
                let p = plans(alg, n, len);
                let report = verify_all_reduce(&p, len)
                    .unwrap_or_else(|e| panic!("{alg} n={n} len={len}: {e}"));
                if n == 1 || len == 0 {
                    assert_eq!(report.messages, 0);
                }
            }
        }
    }
}

#[test]
fn all_reduce_traffic() {
    // 8 ranks, 800 elements: recursive doubling sends 3 x 800 per rank, Rabenseifner
    // 2 x 7/8 x 800.
    let rd = verify_all_reduce(&plans(AllReduceAlgorithm::RecursiveDoubling, 8, 800), 800).unwrap();
    assert_eq!(rd.elements, 8 * 3 * 800);
    assert_eq!(rd.rounds, 3);
    let rb = verify_all_reduce(&plans(AllReduceAlgorithm::Rabenseifner, 8, 800), 800).unwrap();
    assert_eq!(rb.elements, 8 * 2 * 700);
    assert_eq!(rb.rounds, 6);
    // 6 ranks: the two extra ranks fold in and out.
    let r6 = verify_all_reduce(&plans(AllReduceAlgorithm::Rabenseifner, 6, 40), 40).unwrap();
    assert_eq!(r6.rounds, 2 + 4);
    assert_eq!(
        AllReduceAlgorithm::auto(8, 4, 16),
        AllReduceAlgorithm::RecursiveDoubling
    );
    assert_eq!(
        AllReduceAlgorithm::auto(8, 1 << 20, 4 << 20),
        AllReduceAlgorithm::Rabenseifner
    );
    for a in AllReduceAlgorithm::ALL {
        assert_eq!(a.name().parse::<AllReduceAlgorithm>().unwrap(), a);
    }
}

#[test]
fn broken_all_reduce_is_caught() {
    let n = 4;
    let good = plans(AllReduceAlgorithm::RecursiveDoubling, n, 5);
    // One rank puts its own operand first where its partner does not: the results
    // could differ in the last bits.
    let mut flipped = good.clone();
    flipped[1][0].landing = Landing::Reduce { peer_first: false };
    let e = verify_all_reduce(&flipped, 5).unwrap_err();
    assert!(e.message.contains("differently"), "{e}");
    // A rank counted twice.
    let mut twice = good.clone();
    for plan in &mut twice {
        let extra = plan[0].clone();
        plan.push(ReduceRound { tag: 99, ..extra });
    }
    let e = verify_all_reduce(&twice, 5).unwrap_err();
    assert!(e.message.contains("times"), "{e}");
    // A send nobody receives.
    let mut lost = good.clone();
    lost[2][1].recv = None;
    assert!(verify_all_reduce(&lost, 5).is_err());
    // Sizes that disagree.
    let mut short = plans(AllReduceAlgorithm::Rabenseifner, n, 9);
    short[3][0].recv.as_mut().unwrap().range.end -= 1;
    assert!(verify_all_reduce(&short, 9).is_err());
}

#[test]
fn exchange_is_two_steps() {
    let s = exchange(
        0,
        2,
        "send",
        7,
        Some((1, Region::new(Buf::Send, 0, 4))),
        Some((1, Region::new(Buf::Recv, 0, 0))),
    );
    assert_eq!(s.len(), 2);
    assert!(matches!(
        s.steps()[0],
        Step::Recv {
            peer: 1,
            tag: 7,
            ..
        }
    ));
    assert!(matches!(
        s.steps()[1],
        Step::Send {
            peer: 1,
            tag: 7,
            ..
        }
    ));
    assert!(s.deps(1).is_empty());
}
