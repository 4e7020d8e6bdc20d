//! The de-duplicated MoE dispatch and combine schedules, verified on random routings
//! (`verify_moe`), with the inter-node bytes each mode must send.

use halo_collectives::{MoeRoutes, moe_node_of, moe_plans, verify_moe};
use halo_topology::Topology;

use halo_test_support::Rng;

/// `tokens` tokens per rank, each with `k` distinct experts drawn from `pick`.
fn routes(
    n: usize,
    tokens: usize,
    k: usize,
    expert_rank: Vec<u32>,
    rng: &mut Rng,
    pick: &dyn Fn(&mut Rng) -> u32,
) -> MoeRoutes {
    let experts = (0..n)
        .map(|_| {
            let mut ids = Vec::with_capacity(tokens * k);
            for _ in 0..tokens {
                let mut row: Vec<u32> = Vec::with_capacity(k);
                while row.len() < k {
                    let e = pick(rng);
                    if !row.contains(&e) {
                        row.push(e);
                    }
                }
                ids.extend(row);
            }
            ids
        })
        .collect();
    MoeRoutes {
        top_k: k,
        expert_rank,
        experts,
    }
}

/// (unique (token, remote node) pairs, (token, remote expert) pairs) over all ranks.
fn remote_pairs(topo: &Topology, r: &MoeRoutes) -> (u64, u64) {
    let (mut uniq, mut all) = (0, 0);
    for (s, ids) in r.experts.iter().enumerate() {
        let home = moe_node_of(topo, s);
        for tok in ids.chunks(r.top_k) {
            let mut nodes: Vec<u32> = tok
                .iter()
                .map(|&e| moe_node_of(topo, r.expert_rank[e as usize] as usize))
                .filter(|&nd| nd != home)
                .collect();
            all += nodes.len() as u64;
            nodes.sort_unstable();
            nodes.dedup();
            uniq += nodes.len() as u64;
        }
    }
    (uniq, all)
}

fn check(topo: &Topology, r: &MoeRoutes, row: usize) {
    let (uniq, all) = remote_pairs(topo, r);
    for dedup in [true, false] {
        let plans = moe_plans(topo, r, row, dedup).unwrap();
        let rep = verify_moe(topo, r, &plans).unwrap_or_else(|e| panic!("dedup={dedup}: {e}"));
        let want = if dedup { uniq } else { all } * row as u64;
        assert_eq!(rep.dispatch_inter_node_bytes, want, "dedup={dedup}");
        assert_eq!(rep.combine_inter_node_bytes, want, "dedup={dedup}");
    }
}

#[test]
fn random_routings_verify_and_send_one_row_per_token_and_node() {
    let mut rng = Rng::from_state(18);
    for preset in [
        "nodes:2x2",
        "nodes:4x2",
        "nodes:3x4",
        "frontier:2",
        "flat:3",
    ] {
        let topo = Topology::preset(preset).unwrap();
        let n = topo.size();
        for _ in 0..4 {
            let experts = n * (1 + rng.below(3));
            let k = 1 + rng.below(experts.min(8));
            let tokens = rng.below(12);
            // Random expert map (some ranks may have none).
            let map: Vec<u32> = (0..experts).map(|_| rng.below(n) as u32).collect();
            let r = routes(n, tokens, k, map, &mut rng, &|g| g.below(experts) as u32);
            check(&topo, &r, 4 + 4 * rng.below(3));
        }
    }
}

#[test]
fn edge_routings_verify() {
    let topo = Topology::preset("nodes:4x2").unwrap();
    let n = topo.size();
    let mut rng = Rng::from_state(7);
    let contiguous: Vec<u32> = (0..16).map(|e| (e / 2) as u32).collect();
    // All tokens to one expert (the others empty).
    check(
        &topo,
        &routes(n, 9, 1, contiguous.clone(), &mut rng, &|_| 5),
        8,
    );
    // k = E: every token to every expert.
    check(
        &topo,
        &routes(n, 3, 16, contiguous.clone(), &mut rng, &|g| {
            g.below(16) as u32
        }),
        8,
    );
    // Every expert of a token on one node (experts 4..8 live on node 1).
    check(
        &topo,
        &routes(n, 6, 4, contiguous.clone(), &mut rng, &|g| {
            4 + g.below(4) as u32
        }),
        8,
    );
    // No tokens at all, and two experts of a token on the same rank.
    check(
        &topo,
        &routes(n, 0, 2, contiguous.clone(), &mut rng, &|g| {
            g.below(16) as u32
        }),
        8,
    );
    check(
        &topo,
        &routes(n, 5, 2, contiguous, &mut rng, &|g| {
            2 * g.below(8) as u32 + (g.next_u64() % 2) as u32
        }),
        8,
    );
}

#[test]
fn the_verifier_catches_a_misplaced_row_and_a_lost_contribution() {
    let topo = Topology::preset("nodes:2x2").unwrap();
    let mut rng = Rng::from_state(3);
    let map: Vec<u32> = (0..4).collect();
    let r = routes(4, 4, 2, map, &mut rng, &|g| g.below(4) as u32);
    let plans = moe_plans(&topo, &r, 8, true).unwrap();
    verify_moe(&topo, &r, &plans).unwrap();
    // Two rows of one land swapped: the dispatch puts them at each other's place.
    let mut bad = plans.clone();
    let l = bad
        .iter_mut()
        .flat_map(|p| p.lands.iter_mut())
        .find(|l| l.positions.len() >= 2)
        .expect("a land with two rows");
    l.positions.swap(0, 1);
    let e = verify_moe(&topo, &r, &bad).unwrap_err();
    assert!(e.message.contains("should be token"), "{e}");
    // A relay that forgets a slot's expert: fewer contributions than k.
    let mut bad = plans.clone();
    let entry = bad
        .iter_mut()
        .flat_map(|p| p.relays.iter_mut())
        .find(|e| e.experts.iter().any(|x| x.len() >= 2))
        .expect("a token with two experts on one node");
    let i = entry.experts.iter().position(|x| x.len() >= 2).unwrap();
    entry.experts[i].pop();
    entry.targets[i].pop();
    assert!(verify_moe(&topo, &r, &bad).is_err());
}
