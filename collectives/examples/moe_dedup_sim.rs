//! Simulated MoE dispatch, de-duplicated per node vs plain all-to-all-v (issue 18), for
//! DeepSeek-V3's shape by default: 256 experts (contiguous on the ranks), top-8,
//! rows of 7168 bf16 (14,336 bytes), uniform random routing; with `LIMIT` > 0 each
//! token first draws `LIMIT` nodes (DeepSeek-V3's node-limited routing uses 4) and
//! then its k experts among theirs.
//!
//! Both MoE modes are simulated as the schedules `halo::MoeExchange` runs
//! (`halo_collectives::moe_plans` for the routing, then `build_moe_dispatch`, and
//! `build_moe_gather` + `build_moe_return` for the combine): dedup sends each token once
//! per destination node to the rank-aligned peer there (Phase II) and replicates it
//! inside the node (Phase III); the per-expert baseline sends one row per (token,
//! expert) straight to the expert's rank. For reference, `a2av (ALGO)` is the same
//! per-expert traffic as one all-to-all-v built with `ALGO` (default `halo`). The count
//! and metadata passes are left out everywhere. All numbers are simulated, not measured.
//!
//! ```text
//! cargo run --release -p halo-collectives --example moe_dedup_sim -- frontier:16 [TOKENS=4096] [EXPERTS=256] [ROW=14336] [ALGO=halo] [LIMIT=0]
//! ```

use halo_collectives::{
    Algorithm, MatrixSizes, MoeRoutes, Schedule, SimOptions, SimReport, Traffic,
    build_moe_dispatch, build_moe_gather, build_moe_return, moe_plans, simulate,
    simulate_all_to_all,
};
use halo_topology::{Level, Topology};

/// SplitMix64 (the routing's random numbers).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

fn inter_node(r: &SimReport) -> u64 {
    r.levels
        .iter()
        .filter(|l| l.level > Level::Node)
        .map(|l| l.bytes)
        .sum()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let topo = Topology::preset(args.first().map_or("frontier:16", String::as_str))?;
    let arg = |i: usize, d: usize| -> Result<usize, Box<dyn std::error::Error>> {
        Ok(args.get(i).map(|s| s.parse()).transpose()?.unwrap_or(d))
    };
    let (tokens, experts, row) = (arg(1, 4096)?, arg(2, 256)?, arg(3, 14336)?);
    let algo: Algorithm = args.get(4).map_or("halo", String::as_str).parse()?;
    let limit = arg(5, 0)?;
    let n = topo.size();
    let node = |r: usize| topo.domain(r, Level::Node);
    let rank_of = |e: usize| e * n / experts;
    let opts = SimOptions::default();
    println!(
        "# {} ({n} ranks, {} nodes), {experts} experts, {tokens} tokens per rank, rows of {row} B, {algo}, nodes per token {}; simulated",
        topo.name(),
        topo.num_domains(Level::Node),
        if limit == 0 {
            "any".to_string()
        } else {
            format!("<= {limit}")
        }
    );
    let expert_nodes: Vec<usize> = {
        let mut v: Vec<usize> = (0..experts).map(|e| node(rank_of(e))).collect();
        v.dedup();
        v
    };
    println!(
        "| k | (token, remote expert) pairs | unique (token, remote node) | per-expert inter-node bytes | dedup inter-node bytes | ratio | a2av ({algo}) dispatch | per-expert dispatch | dedup dispatch | per-expert combine | dedup combine (gather + return) |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for k in [1usize, 2, 4, 8] {
        let mut rng = Rng(18 + k as u64);
        let mut a2av = vec![0usize; n * n];
        let mut ids: Vec<Vec<u32>> = vec![Vec::with_capacity(tokens * k); n];
        let (mut pairs, mut unique) = (0u64, 0u64);
        for s in 0..n {
            for _ in 0..tokens {
                let mut pool: Vec<usize> = if limit == 0 {
                    (0..experts).collect()
                } else {
                    let mut nodes = expert_nodes.clone();
                    let picked: Vec<usize> = (0..limit.min(nodes.len()))
                        .map(|_| nodes.swap_remove((rng.next() % nodes.len() as u64) as usize))
                        .collect();
                    (0..experts)
                        .filter(|&e| picked.contains(&node(rank_of(e))))
                        .collect()
                };
                if pool.len() < k {
                    return Err(
                        format!("{} experts on the chosen nodes, k = {k}", pool.len()).into(),
                    );
                }
                let mut chosen: Vec<usize> = (0..k)
                    .map(|_| pool.swap_remove((rng.next() % pool.len() as u64) as usize))
                    .collect();
                ids[s].extend(chosen.iter().map(|&e| e as u32));
                chosen.sort_unstable_by_key(|&e| node(rank_of(e)));
                let mut i = 0;
                while i < chosen.len() {
                    let nd = node(rank_of(chosen[i]));
                    if nd != node(s) {
                        unique += 1;
                    }
                    while i < chosen.len() && node(rank_of(chosen[i])) == nd {
                        a2av[s * n + rank_of(chosen[i])] += row;
                        if nd != node(s) {
                            pairs += 1;
                        }
                        i += 1;
                    }
                }
            }
        }
        let routes = MoeRoutes {
            top_k: k,
            expert_rank: (0..experts).map(|e| rank_of(e) as u32).collect(),
            experts: ids,
        };
        let run =
            |dedup: bool| -> Result<(SimReport, SimReport, SimReport), Box<dyn std::error::Error>> {
                let plans = moe_plans(&topo, &routes, row, dedup)?;
                let build =
                    |f: fn(&halo_collectives::MoePlan) -> halo_collectives::Result<Schedule>| {
                        plans
                            .iter()
                            .map(f)
                            .collect::<halo_collectives::Result<Vec<Schedule>>>()
                    };
                Ok((
                    simulate(&topo, &build(build_moe_dispatch)?, &opts)?,
                    simulate(&topo, &build(build_moe_gather)?, &opts)?,
                    simulate(&topo, &build(build_moe_return)?, &opts)?,
                ))
            };
        let (pd, pg, pr) = run(false)?;
        let (dd, dg, dr) = run(true)?;
        let sizes = MatrixSizes::new(n, a2av);
        let plain = simulate_all_to_all(&topo, algo, Traffic::V(&sizes), &opts)?;
        let (pb, db) = (inter_node(&pd), inter_node(&dd));
        println!(
            "| {k} | {pairs} | {unique} | {pb} | {db} | {:.3} | {:.3} ms | {:.3} ms | {:.3} ms | {:.3} ms | {:.3} ms ({:.3} + {:.3}) |",
            pb as f64 / db.max(1) as f64,
            plain.time * 1e3,
            pd.time * 1e3,
            dd.time * 1e3,
            (pg.time + pr.time) * 1e3,
            (dg.time + dr.time) * 1e3,
            dg.time * 1e3,
            dr.time * 1e3
        );
    }
    Ok(())
}
