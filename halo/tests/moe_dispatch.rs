//! `MoeExchange` (issue 18): token de-duplicating MoE dispatch and combine, on the
//! in-process transport (real threads, real bytes).
//!
//! - dispatch, both modes, byte-exact against a reference dispatch written from the
//!   documented order (expert, source rank, token), for random routings, empty experts,
//!   all tokens to one expert, k = E, every expert of a token on one node; on nodes:2x4,
//!   nodes:4x2 and an uneven nodes:3x3,ranks=8;
//! - `MoeStats::rows_sent_off_node` summed over the ranks equals the routing's unique
//!   (token, remote node) pairs (dedup) or (token, remote expert) pairs (a2av);
//! - combine, bitwise against a reference weighted sum with the documented summation
//!   order (per node in slot order, then nodes ascending), and dedup == a2av bitwise;
//!   `combine_residual` likewise (own node from the residual, then the other nodes);
//! - all of it through the single dispatch schedule and the gather/return schedules of
//!   `halo_collectives::algo::moe` (verified on their own in
//!   `collectives/tests/moe_schedule.rs`);
//! - bad input: an error on the rank that passed it, `InvalidUsage` on the others;
//!   differing expert maps refused everywhere;
//! - bytes: the in-process transport's traffic counters (`LocalCluster::traffic`)
//!   show exactly (unique (token, remote node) pairs) x row bytes crossing node
//!   boundaries for dedup and (token, remote expert) pairs x row bytes for a2av, for
//!   k in {1, 2, 4, 8}.
//!
//! Over 800 lines: the reference dispatch and combine, the routings and the
//! runners are shared by every test; one binary keeps one build of them.

use halo::local::{Emulation, LocalCluster};
use halo::topology::{Level, Topology};
use halo::{Algorithm, Communicator, Error, MoeDispatch, MoeExchange, MoeRouting};
use halo_moe::SplitMix64;
use std::time::Duration;

/// One job's routing: every rank's tokens and top-k choices.
#[derive(Debug, Clone)]
struct Job {
    d: usize,
    k: usize,
    expert_rank: Vec<u32>,
    /// Per rank: tokens x d values.
    tokens: Vec<Vec<f32>>,
    /// Per rank: tokens x k expert ids.
    experts: Vec<Vec<u32>>,
    /// Per rank: tokens x k gate weights.
    gates: Vec<Vec<f32>>,
}

#[derive(Debug, Clone, Copy)]
enum Shape {
    /// k distinct experts drawn uniformly.
    Random,
    /// Only even experts are ever chosen: the odd ones are empty.
    EmptyOdd,
    /// k = 1 and every token goes to expert 0 (on rank `expert_rank[0]`).
    AllToOne,
    /// k = E: every token goes to every expert.
    AllExperts,
    /// Every token's k experts live on one node (drawn per token).
    OneNode,
}

fn node_of(topo: &Topology, rank: usize) -> usize {
    topo.domain(rank, Level::Node)
}

fn pick_distinct(rng: &mut SplitMix64, from: &[u32], k: usize) -> Vec<u32> {
    let mut pool = from.to_vec();
    let mut out = Vec::with_capacity(k);
    for _ in 0..k {
        let i = (rng.next_u64() % pool.len() as u64) as usize;
        out.push(pool.swap_remove(i));
    }
    out
}

fn make_job(
    topo: &Topology,
    seed: u64,
    shape: Shape,
    experts_per_rank: usize,
    k: usize,
    d: usize,
) -> Job {
    let n = topo.size();
    let e_total = n * experts_per_rank;
    let mut rng = SplitMix64::new(seed);
    // A shuffled expert -> rank map (the migration layer moves experts around).
    let mut expert_rank: Vec<u32> = (0..e_total).map(|e| (e % n) as u32).collect();
    for i in (1..e_total).rev() {
        let j = (rng.next_u64() % (i as u64 + 1)) as usize;
        expert_rank.swap(i, j);
    }
    let k = match shape {
        Shape::AllToOne => 1,
        Shape::AllExperts => e_total,
        _ => k,
    };
    let all: Vec<u32> = (0..e_total as u32).collect();
    let even: Vec<u32> = all.iter().copied().filter(|e| e % 2 == 0).collect();
    let mut job = Job {
        d,
        k,
        expert_rank,
        tokens: vec![],
        experts: vec![],
        gates: vec![],
    };
    for _ in 0..n {
        // Some ranks have no tokens at all.
        let t = (rng.next_u64() % 13) as usize;
        let tokens: Vec<f32> = (0..t * d)
            .map(|_| (rng.next_u64() % 2001) as f32 / 16.0 - 60.0)
            .collect();
        let mut ids = Vec::with_capacity(t * k);
        for _ in 0..t {
            match shape {
                Shape::Random => ids.extend(pick_distinct(&mut rng, &all, k)),
                Shape::EmptyOdd => ids.extend(pick_distinct(&mut rng, &even, k)),
                Shape::AllToOne => ids.push(0),
                Shape::AllExperts => ids.extend(pick_distinct(&mut rng, &all, k)),
                Shape::OneNode => {
                    let node = (rng.next_u64() % topo.num_domains(Level::Node) as u64) as usize;
                    let here: Vec<u32> = all
                        .iter()
                        .copied()
                        .filter(|&e| node_of(topo, job.expert_rank[e as usize] as usize) == node)
                        .collect();
                    assert!(here.len() >= k, "OneNode needs k <= experts per node");
                    ids.extend(pick_distinct(&mut rng, &here, k));
                }
            }
        }
        let gates: Vec<f32> = (0..t * k)
            .map(|_| (rng.next_u64() % 1000) as f32 / 997.0)
            .collect();
        job.tokens.push(tokens);
        job.experts.push(ids);
        job.gates.push(gates);
    }
    job
}

/// The expert's computation (deterministic, per element).
fn expert_fn(e: u32, x: f32) -> f32 {
    x * (1.0 + e as f32 / 8.0) - e as f32
}

/// Reference dispatch for `rank`: rows by (local expert ascending, source, token).
/// Local experts, rows per expert, origins, rows.
type Dispatched = (Vec<u32>, Vec<usize>, Vec<(u32, u32)>, Vec<f32>);

fn reference_rows(job: &Job, rank: usize) -> Dispatched {
    let d = job.d;
    let local: Vec<u32> = (0..job.expert_rank.len() as u32)
        .filter(|&e| job.expert_rank[e as usize] as usize == rank)
        .collect();
    let mut counts = vec![0; local.len()];
    let mut origins = vec![];
    let mut rows = vec![];
    for (li, &e) in local.iter().enumerate() {
        for s in 0..job.tokens.len() {
            for (t, ids) in job.experts[s].chunks(job.k).enumerate() {
                if ids.contains(&e) {
                    counts[li] += 1;
                    origins.push((s as u32, t as u32));
                    rows.extend_from_slice(&job.tokens[s][t * d..(t + 1) * d]);
                }
            }
        }
    }
    (local, counts, origins, rows)
}

/// Reference combine for `rank`'s tokens: per node (ascending) the partial
/// sum_j gate_j * expert(x) in slot order from 0.0, then the partials from 0.0.
fn reference_combine(job: &Job, topo: &Topology, rank: usize) -> Vec<f32> {
    let d = job.d;
    let t_count = job.experts[rank].len() / job.k;
    let mut out = vec![0f32; t_count * d];
    for t in 0..t_count {
        let ids = &job.experts[rank][t * job.k..(t + 1) * job.k];
        let gates = &job.gates[rank][t * job.k..(t + 1) * job.k];
        for node in 0..topo.num_domains(Level::Node) {
            let mut partial = vec![0f32; d];
            let mut any = false;
            for (j, &e) in ids.iter().enumerate() {
                if node_of(topo, job.expert_rank[e as usize] as usize) != node {
                    continue;
                }
                any = true;
                let x = &job.tokens[rank][t * d..(t + 1) * d];
                for (p, &xi) in partial.iter_mut().zip(x) {
                    *p += gates[j] * expert_fn(e, xi);
                }
            }
            if any {
                for (o, p) in out[t * d..(t + 1) * d].iter_mut().zip(&partial) {
                    *o += p;
                }
            }
        }
    }
    out
}

/// `combine_residual`'s order: the residual `h` (here `h[i] = i * 0.37 - rank`),
/// plus the token's own node's slots in slot order, then each other node's partial
/// (from 0.0, slot order) in ascending node order.
fn residual_of(job: &Job, rank: usize) -> Vec<f32> {
    (0..job.tokens[rank].len())
        .map(|i| i as f32 * 0.37 - rank as f32)
        .collect()
}

fn reference_combine_residual(job: &Job, topo: &Topology, rank: usize) -> Vec<f32> {
    let d = job.d;
    let t_count = job.experts[rank].len() / job.k;
    let mut out = residual_of(job, rank);
    let home = node_of(topo, rank);
    let nodes = topo.num_domains(Level::Node);
    for t in 0..t_count {
        let ids = &job.experts[rank][t * job.k..(t + 1) * job.k];
        let gates = &job.gates[rank][t * job.k..(t + 1) * job.k];
        let x = &job.tokens[rank][t * d..(t + 1) * d];
        for node in std::iter::once(home).chain((0..nodes).filter(|&n| n != home)) {
            let mut partial = vec![0f32; d];
            if node == home {
                partial.copy_from_slice(&out[t * d..(t + 1) * d]);
            }
            for (j, &e) in ids.iter().enumerate() {
                if node_of(topo, job.expert_rank[e as usize] as usize) == node {
                    for (p, &xi) in partial.iter_mut().zip(x) {
                        *p += gates[j] * expert_fn(e, xi);
                    }
                }
            }
            let o = &mut out[t * d..(t + 1) * d];
            if node == home {
                o.copy_from_slice(&partial);
            } else if ids
                .iter()
                .any(|&e| node_of(topo, job.expert_rank[e as usize] as usize) == node)
            {
                for (o, p) in o.iter_mut().zip(&partial) {
                    *o += p;
                }
            }
        }
    }
    out
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// What one rank saw: dispatched rows and metadata, the combine, rows sent.
type Seen = (
    Vec<u32>,
    Vec<usize>,
    Vec<(u32, u32)>,
    Vec<f32>,
    Vec<f32>,
    halo::MoeStats,
    Vec<f32>,
);

fn run_rank(comm: &mut Communicator, job: &Job, mode: MoeDispatch) -> halo::Result<Seen> {
    comm.set_timeout(Duration::from_secs(30));
    let me = comm.rank();
    let routing = MoeRouting {
        top_k: job.k,
        experts: &job.experts[me],
        gates: &job.gates[me],
        expert_rank: &job.expert_rank,
    };
    let (ex, rows) = MoeExchange::dispatch(comm, &job.tokens[me], job.d, &routing, mode)?;
    // Apply each row's expert.
    let mut y = Vec::with_capacity(rows.len());
    let mut r = 0;
    for (li, &e) in ex.local_experts().iter().enumerate() {
        for _ in 0..ex.expert_counts()[li] {
            y.extend(
                rows[r * job.d..(r + 1) * job.d]
                    .iter()
                    .map(|&x| expert_fn(e, x)),
            );
            r += 1;
        }
    }
    let back = ex.combine(comm, &y)?;
    let with_residual = ex.combine_residual(comm, &y, &residual_of(job, me))?;
    Ok((
        ex.local_experts().to_vec(),
        ex.expert_counts().to_vec(),
        ex.origins().to_vec(),
        rows,
        back,
        ex.stats(),
        with_residual,
    ))
}

fn check_job(topo: &Topology, job: &Job, what: &str) {
    let mut combined: Vec<Vec<Vec<u32>>> = vec![];
    for mode in [MoeDispatch::Dedup, MoeDispatch::AllToAllV] {
        let out = halo::local::run(topo, Emulation::off(), |comm| run_rank(comm, job, mode));
        let mut mine = vec![];
        let mut off_node = 0;
        for (rank, r) in out.into_iter().enumerate() {
            let (local, counts, origins, rows, back, stats, with_residual) =
                r.unwrap_or_else(|e| panic!("{what} {mode:?}: rank {rank}: {e}"));
            let (rl, rc, ro, rr) = reference_rows(job, rank);
            assert_eq!(local, rl, "{what} {mode:?} rank {rank}: local experts");
            assert_eq!(counts, rc, "{what} {mode:?} rank {rank}: expert counts");
            assert_eq!(origins, ro, "{what} {mode:?} rank {rank}: origins");
            assert_eq!(bits(&rows), bits(&rr), "{what} {mode:?} rank {rank}: rows");
            let reference = reference_combine(job, topo, rank);
            assert_eq!(
                bits(&back),
                bits(&reference),
                "{what} {mode:?} rank {rank}: combine"
            );
            assert_eq!(
                bits(&with_residual),
                bits(&reference_combine_residual(job, topo, rank)),
                "{what} {mode:?} rank {rank}: combine_residual"
            );
            mine.push(bits(&back));
            mine.push(bits(&with_residual));
            off_node += stats.rows_sent_off_node;
        }
        // Rows that left their node: unique (token, remote node) pairs for dedup,
        // (token, remote expert) pairs for a2av.
        let (mut pairs, mut unique) = (0, 0);
        for s in 0..topo.size() {
            for ids in job.experts[s].chunks(job.k) {
                let mut nodes: Vec<usize> = ids
                    .iter()
                    .map(|&e| node_of(topo, job.expert_rank[e as usize] as usize))
                    .filter(|&n| n != node_of(topo, s))
                    .collect();
                pairs += nodes.len();
                nodes.sort_unstable();
                nodes.dedup();
                unique += nodes.len();
            }
        }
        let want = if mode == MoeDispatch::Dedup {
            unique
        } else {
            pairs
        };
        assert_eq!(off_node, want, "{what} {mode:?}: rows sent off node");
        combined.push(mine);
    }
    assert_eq!(combined[0], combined[1], "{what}: dedup and a2av differ");
}

#[test]
fn dispatch_and_combine_match_the_reference() {
    for spec in ["nodes:2x4", "nodes:4x2", "nodes:3x3,ranks=8"] {
        let topo = Topology::preset(spec).unwrap();
        for (i, shape) in [
            Shape::Random,
            Shape::EmptyOdd,
            Shape::AllToOne,
            Shape::AllExperts,
            Shape::OneNode,
        ]
        .into_iter()
        .enumerate()
        {
            for k in [1, 2, 3] {
                for seed in 0..3u64 {
                    let job = make_job(&topo, seed * 31 + i as u64 * 7 + k as u64, shape, 2, k, 5);
                    check_job(&topo, &job, &format!("{spec} {shape:?} k={k} seed={seed}"));
                }
            }
        }
    }
}

#[test]
fn wide_rows_and_one_rank() {
    let topo = Topology::preset("nodes:2x4").unwrap();
    let job = make_job(&topo, 99, Shape::Random, 3, 4, 257);
    check_job(&topo, &job, "d=257 k=4");
    let one = Topology::preset("nodes:1x1").unwrap();
    let job = make_job(&one, 5, Shape::AllExperts, 4, 0, 3);
    check_job(&one, &job, "one rank");
}

#[test]
fn bad_routing_is_an_error_on_every_rank() {
    let topo = Topology::preset("nodes:2x2").unwrap();
    for mode in [MoeDispatch::Dedup, MoeDispatch::AllToAllV] {
        let out = halo::local::run(&topo, Emulation::off(), |comm| {
            comm.set_timeout(Duration::from_secs(20));
            let me = comm.rank();
            // Rank 2 names expert 1 twice.
            let experts: &[u32] = if me == 2 { &[1, 1] } else { &[0, 1] };
            let routing = MoeRouting {
                top_k: 2,
                experts,
                gates: &[1.0, 1.0],
                expert_rank: &[0, 3],
            };
            MoeExchange::dispatch(comm, &[1u8, 2], 2, &routing, mode).map(|_| ())
        });
        for (rank, r) in out.iter().enumerate() {
            match (rank, r) {
                (2, Err(Error::InvalidArgument { message, .. })) => {
                    assert!(message.contains("expert 1 twice"), "{message}")
                }
                (2, other) => panic!("rank 2: {other:?}"),
                (_, Err(Error::InvalidUsage { peer, .. })) => assert_eq!(*peer, Some(2)),
                (_, other) => panic!("rank {rank}: {other:?}"),
            }
        }
        // Maps that differ: refused on every rank.
        let out = halo::local::run(&topo, Emulation::off(), |comm| {
            comm.set_timeout(Duration::from_secs(20));
            let map: &[u32] = if comm.rank() == 0 { &[0, 1] } else { &[0, 2] };
            let routing = MoeRouting {
                top_k: 1,
                experts: &[0],
                gates: &[1.0],
                expert_rank: map,
            };
            MoeExchange::dispatch(comm, &[1u8], 1, &routing, mode).map(|_| ())
        });
        for (rank, r) in out.iter().enumerate() {
            assert!(
                matches!(r, Err(Error::InvalidUsage { message, .. }) if message.contains("map")),
                "rank {rank}: {r:?}"
            );
        }
    }
    // A wrong expert_out length in the combine: an error on that rank, and on every
    // rank that exchanges rows with it (here all: every token goes to every expert).
    for mode in [MoeDispatch::Dedup, MoeDispatch::AllToAllV] {
        let out = halo::local::run(&topo, Emulation::off(), |comm| {
            comm.set_timeout(Duration::from_secs(20));
            let routing = MoeRouting {
                top_k: 4,
                experts: &[0, 1, 2, 3],
                gates: &[1.0; 4],
                expert_rank: &[0, 1, 2, 3],
            };
            let (ex, rows) = MoeExchange::dispatch(comm, &[1f32, 2.0], 2, &routing, mode)?;
            let y = if comm.rank() == 1 {
                &rows[1..]
            } else {
                &rows[..]
            };
            ex.combine(comm, y).map(|_| ())
        });
        for (rank, r) in out.iter().enumerate() {
            match (rank, r) {
                (1, Err(Error::InvalidArgument { message, .. })) => {
                    assert!(message.contains("expert_out has 7 elements"), "{message}")
                }
                (1, other) => panic!("{mode:?} rank 1: {other:?}"),
                (_, Err(Error::InvalidUsage { .. })) => {}
                (_, other) => panic!("{mode:?} rank {rank}: {other:?}"),
            }
        }
    }
    // Local checks: out-of-range expert, rank, lengths.
    let out = halo::local::run(
        &Topology::preset("flat:1").unwrap(),
        Emulation::off(),
        |comm| {
            #[allow(clippy::type_complexity)]
            let cases: [(&[u32], &[f32], &[u32], usize, &str); 4] = [
                (&[5], &[1.0], &[0], 1, "not in the expert map"),
                (&[0], &[1.0], &[3], 1, "mapped to rank 3"),
                (&[0], &[], &[0], 1, "gate weights"),
                (&[0], &[1.0], &[0], 2, "not 1 tokens x d = 2"),
            ];
            for (experts, gates, map, d, want) in cases {
                let routing = MoeRouting {
                    top_k: 1,
                    experts,
                    gates,
                    expert_rank: map,
                };
                match MoeExchange::dispatch(comm, &[0f32], d, &routing, MoeDispatch::Dedup) {
                    Err(Error::InvalidArgument { message, .. }) if message.contains(want) => {}
                    other => panic!("{want}: {:?}", other.map(|_| ())),
                }
            }
            Ok(())
        },
    );
    out.into_iter().for_each(|r| r.unwrap());
}

/// Bytes that crossed node boundaries during one dispatch + combine of `job`.
fn crossing_bytes(topo: &Topology, job: &Job, mode: MoeDispatch) -> u64 {
    let cluster = LocalCluster::new(topo.clone(), Emulation::off()).unwrap();
    let traffic = cluster.traffic();
    let out = cluster.run(|comm| {
        comm.set_algorithm(Some(Algorithm::Halo));
        run_rank(comm, job, mode)
    });
    for r in out {
        r.unwrap();
    }
    traffic.bytes_crossing(Level::Node)
}

#[test]
fn dedup_cuts_inter_node_bytes_as_the_routing_predicts() {
    let topo = Topology::preset("nodes:4x2").unwrap();
    let d = 256;
    eprintln!(
        "k  pairs(token,remote expert)  unique(token,remote node)  a2av_row_bytes  dedup_row_bytes  predicted  measured  control_bytes(a2av,dedup)"
    );
    for k in [1usize, 2, 4, 8] {
        let mut job = make_job(&topo, 1000 + k as u64, Shape::Random, 2, k, d);
        // 64 tokens on every rank.
        let mut rng = SplitMix64::new(k as u64);
        let e_total = job.expert_rank.len() as u32;
        let all: Vec<u32> = (0..e_total).collect();
        for s in 0..topo.size() {
            job.tokens[s] = (0..64 * d).map(|i| (i % 7) as f32).collect();
            job.experts[s] = (0..64)
                .flat_map(|_| pick_distinct(&mut rng, &all, k))
                .collect();
            job.gates[s] = vec![0.5; 64 * k];
        }
        // What the routing predicts: rows that leave their node.
        let (mut pairs, mut unique) = (0u64, 0u64);
        for s in 0..topo.size() {
            for ids in job.experts[s].chunks(k) {
                let mut nodes: Vec<usize> = ids
                    .iter()
                    .map(|&e| node_of(&topo, job.expert_rank[e as usize] as usize))
                    .filter(|&n| n != node_of(&topo, s))
                    .collect();
                pairs += nodes.len() as u64;
                nodes.sort_unstable();
                nodes.dedup();
                unique += nodes.len() as u64;
            }
        }
        // Rows cross three times (dispatch, combine and combine_residual); control traffic is measured with
        // d = 0 (same routing, same algorithm) and subtracted.
        let row = (d * 4) as u64;
        let mut empty = job.clone();
        empty.d = 0;
        empty.tokens = vec![vec![]; topo.size()];
        let mut measured = vec![];
        let mut control = vec![];
        for mode in [MoeDispatch::AllToAllV, MoeDispatch::Dedup] {
            let full = crossing_bytes(&topo, &job, mode);
            let ctl = crossing_bytes(&topo, &empty, mode);
            measured.push(full - ctl);
            control.push(ctl);
        }
        assert_eq!(measured[0], 3 * pairs * row, "k={k}: a2av row bytes");
        assert_eq!(measured[1], 3 * unique * row, "k={k}: dedup row bytes");
        eprintln!(
            "{k}  {pairs}  {unique}  {}  {}  {:.3}  {:.3}  {:?}",
            measured[0],
            measured[1],
            pairs as f64 / unique as f64,
            measured[0] as f64 / measured[1] as f64,
            control
        );
    }
}

/// The DeepEP-shaped calls (issue 29): one routing, rows moved as often as needed.
/// Per rank: rows (f32), rows again (f64), the unweighted combine of the experts'
/// outputs, the gates per row, the gates back through `combine_pairs`, the mode.
type Routed = (
    Vec<f32>,
    Vec<f64>,
    Vec<f32>,
    Vec<f32>,
    Vec<f32>,
    MoeDispatch,
);

fn run_routed(comm: &mut Communicator, job: &Job, mode: MoeDispatch) -> halo::Result<Routed> {
    comm.set_timeout(Duration::from_secs(30));
    let me = comm.rank();
    let routing = MoeRouting {
        top_k: job.k,
        experts: &job.experts[me],
        gates: &job.gates[me],
        expert_rank: &job.expert_rank,
    };
    let ex = MoeExchange::route(comm, &routing, mode)?;
    let rows = ex.dispatch_rows(comm, &job.tokens[me], job.d)?;
    let wide: Vec<f64> = job.tokens[me].iter().map(|&x| f64::from(x)).collect();
    let rows64 = ex.dispatch_rows(comm, &wide, job.d)?;
    let experts = ex.row_experts();
    assert_eq!(experts.len(), ex.num_rows());
    let y: Vec<f32> = rows
        .chunks(job.d.max(1))
        .zip(&experts)
        .flat_map(|(r, &e)| r.iter().map(move |&x| expert_fn(e, x)))
        .collect();
    let back = ex.combine_sum(comm, &y, job.d)?;
    let gates = ex.dispatch_pairs(comm, &job.gates[me])?;
    let gates_back = ex.combine_pairs(comm, &gates)?;
    Ok((rows, rows64, back, gates, gates_back, ex.mode()))
}

fn check_routed(topo: &Topology, job: &Job, what: &str) {
    let mut unit = job.clone();
    for g in &mut unit.gates {
        g.iter_mut().for_each(|g| *g = 1.0);
    }
    let mut sums = vec![];
    for mode in [
        MoeDispatch::Dedup,
        MoeDispatch::AllToAllV,
        MoeDispatch::Auto,
    ] {
        let out = halo::local::run(topo, Emulation::off(), |comm| run_routed(comm, job, mode));
        let mut mine = vec![];
        for (rank, r) in out.into_iter().enumerate() {
            let (rows, rows64, back, gates, gates_back, _) =
                r.unwrap_or_else(|e| panic!("{what} {mode:?}: rank {rank}: {e}"));
            let (local, _, origins, want_rows) = reference_rows(job, rank);
            assert_eq!(
                bits(&rows),
                bits(&want_rows),
                "{what} {mode:?} rank {rank}: rows"
            );
            let narrowed: Vec<f32> = rows64.iter().map(|&x| x as f32).collect();
            assert_eq!(
                bits(&narrowed),
                bits(&want_rows),
                "{what} {mode:?}: f64 rows"
            );
            // combine_sum is combine with every gate 1.0 (1.0 * y is y, bit for bit).
            assert_eq!(
                bits(&back),
                bits(&reference_combine(&unit, topo, rank)),
                "{what} {mode:?} rank {rank}: combine_sum"
            );
            // Row r's gate is its (source, token)'s gate for the row's expert.
            let (_, counts, _, _) = reference_rows(job, rank);
            let row_expert: Vec<u32> = local
                .iter()
                .zip(&counts)
                .flat_map(|(&e, &c)| std::iter::repeat_n(e, c))
                .collect();
            let want_gates: Vec<f32> = origins
                .iter()
                .zip(&row_expert)
                .map(|(&(s, t), &e)| {
                    let (s, t) = (s as usize, t as usize);
                    let slot = job.experts[s][t * job.k..(t + 1) * job.k]
                        .iter()
                        .position(|&x| x == e)
                        .unwrap();
                    job.gates[s][t * job.k + slot]
                })
                .collect();
            assert_eq!(
                bits(&gates),
                bits(&want_gates),
                "{what} {mode:?}: gates per row"
            );
            assert_eq!(
                bits(&gates_back),
                bits(&job.gates[rank]),
                "{what} {mode:?} rank {rank}: combine_pairs(dispatch_pairs(g)) != g"
            );
            mine.push(bits(&back));
        }
        sums.push(mine);
    }
    assert_eq!(
        sums[0], sums[1],
        "{what}: combine_sum differs between modes"
    );
}

#[test]
fn route_once_move_rows_many_times() {
    for spec in ["nodes:2x4", "nodes:3x3,ranks=8"] {
        let topo = Topology::preset(spec).unwrap();
        for (i, shape) in [
            Shape::Random,
            Shape::EmptyOdd,
            Shape::AllToOne,
            Shape::OneNode,
        ]
        .into_iter()
        .enumerate()
        {
            for k in [1, 2] {
                let job = make_job(&topo, 500 + i as u64 * 3 + k as u64, shape, 2, k, 3);
                check_routed(&topo, &job, &format!("{spec} {shape:?} k={k}"));
            }
        }
        let job = make_job(&topo, 77, Shape::Random, 2, 8, 2);
        check_routed(&topo, &job, &format!("{spec} k=8"));
    }
}

#[test]
fn auto_goes_direct_only_when_nothing_can_be_saved() {
    let topo = Topology::preset("nodes:2x4").unwrap();
    for (k, shape, want) in [
        (1, Shape::Random, MoeDispatch::AllToAllV),
        (1, Shape::AllToOne, MoeDispatch::AllToAllV),
        (2, Shape::OneNode, MoeDispatch::Dedup),
        (4, Shape::Random, MoeDispatch::Dedup),
    ] {
        let mut job = make_job(&topo, 9 + k as u64, shape, 2, k, 2);
        // At least one token everywhere, so that a Random k = 4 routing has a token
        // with two experts on one other node.
        for (s, t) in job.tokens.iter_mut().enumerate() {
            if t.is_empty() {
                *t = vec![1.0, 2.0];
                job.experts[s] = (0..k as u32).collect();
                job.gates[s] = vec![0.5; k];
            }
        }
        let out = halo::local::run(&topo, Emulation::off(), |comm| {
            run_routed(comm, &job, MoeDispatch::Auto)
        });
        for (rank, r) in out.into_iter().enumerate() {
            let got = r
                .unwrap_or_else(|e| panic!("k={k} {shape:?} rank {rank}: {e}"))
                .5;
            assert_eq!(got, want, "k={k} {shape:?} rank {rank}");
        }
    }
    assert_eq!("auto".parse::<MoeDispatch>().unwrap(), MoeDispatch::Auto);
}

#[test]
fn ranks_that_call_differently_fail_together() {
    let topo = Topology::preset("nodes:2x2").unwrap();
    let run = |body: fn(&mut Communicator, &MoeExchange) -> halo::Result<()>| {
        halo::local::run(&topo, Emulation::off(), move |comm| {
            comm.set_timeout(Duration::from_secs(20));
            let routing = MoeRouting {
                top_k: 2,
                experts: &[0, 3],
                gates: &[0.5, 0.5],
                expert_rank: &[0, 1, 2, 3],
            };
            let ex = MoeExchange::route(comm, &routing, MoeDispatch::Dedup)?;
            body(comm, &ex)
        })
    };
    let expect_all = |out: Vec<halo::Result<()>>, want: &str| {
        for (rank, r) in out.iter().enumerate() {
            match r {
                Err(Error::InvalidUsage { message, .. }) if message.contains(want) => {}
                other => panic!("rank {rank}: want InvalidUsage with {want:?}, got {other:?}"),
            }
        }
    };
    // Another row width on rank 1 (its own tokens are consistent with it).
    let out = run(|comm, ex| {
        let d = if comm.rank() == 1 { 3 } else { 2 };
        ex.dispatch_rows(comm, &vec![1f32; d], d).map(|_| ())
    });
    expect_all(out, "rows of 3 x f32");
    // Another element type.
    let out = run(|comm, ex| {
        if comm.rank() == 2 {
            ex.dispatch_rows(comm, &[1f64, 2.0], 2).map(|_| ())
        } else {
            ex.dispatch_rows(comm, &[1f32, 2.0], 2).map(|_| ())
        }
    });
    expect_all(out, "x f64");
    // Another call: rank 0 combines while the others dispatch.
    let out = run(|comm, ex| {
        if comm.rank() == 0 {
            let rows = vec![0f32; ex.num_rows() * 2];
            ex.combine_sum(comm, &rows, 2).map(|_| ())
        } else {
            ex.dispatch_rows(comm, &[1f32, 2.0], 2).map(|_| ())
        }
    });
    expect_all(out, "MoE calls differ");
    // Another exchange: rank 3 routes twice and uses the second.
    let out = halo::local::run(&topo, Emulation::off(), |comm| {
        comm.set_timeout(Duration::from_secs(20));
        let routing = MoeRouting {
            top_k: 1,
            experts: &[1],
            gates: &[1.0],
            expert_rank: &[0, 1, 2, 3],
        };
        let first = MoeExchange::route(comm, &routing, MoeDispatch::Dedup)?;
        let second = MoeExchange::route(comm, &routing, MoeDispatch::Dedup)?;
        let ex = if comm.rank() == 3 { &second } else { &first };
        ex.dispatch_rows(comm, &[1f32], 1).map(|_| ())
    });
    expect_all(out, "routed at call");
    // A wrong length on one rank: named there, InvalidUsage naming it elsewhere.
    let out = run(|comm, ex| {
        let n = if comm.rank() == 1 { 3 } else { 2 };
        ex.dispatch_pairs(comm, &vec![0.5f32; n]).map(|_| ())
    });
    for (rank, r) in out.iter().enumerate() {
        match (rank, r) {
            (1, Err(Error::InvalidArgument { message, .. })) => {
                assert!(message.contains("3 values"), "{message}")
            }
            (_, Err(Error::InvalidUsage { peer, .. })) if rank != 1 => {
                assert_eq!(*peer, Some(1))
            }
            (_, other) => panic!("rank {rank}: {other:?}"),
        }
    }
}
