//! Token de-duplicating MoE dispatch as processes (issue 18): every rank routes `T`
//! tokens (rows of `D` f32) to `k` distinct experts drawn at random (2 experts per
//! rank, a fixed seed), runs `REPS` dispatch + combine with `MoeExchange` in the given
//! mode, and checks every combined token bitwise against its own reference (the
//! documented summation order). Rank 0 prints the routing's prediction — (token,
//! remote expert) pairs and unique (token, remote node) pairs over the whole job —
//! and the mean time per dispatch + combine.
//!
//! ```sh
//! cargo build --example moe_dedup -p halo && cargo build -p halo-cli
//! target/debug/halo launch -n 8 --hosts 4 --stats-json s.json -- \
//!     target/debug/examples/moe_dedup dedup 4 1024 256 3     # MODE K D T REPS
//! ```
//!
//! Output (rank 0): `moe_dedup: mode M k K d D tokens T reps R nodes H pairs P unique U
//! predicted_row_bytes B seconds_per_rep S`, where `B` is the row bytes the routing
//! predicts crossing hosts over all reps (dispatch and combine: `2 x REPS x D x 4 x`
//! `U` for dedup, `P` for a2av). Exits 1 when a token came back wrong.

use halo::topology::Level;
use halo::{Communicator, MoeDispatch, MoeExchange, MoeRouting, ReduceOp};
use halo_moe::SplitMix64;
use std::time::Instant;

const EXPERTS_PER_RANK: usize = 2;
const SEED: u64 = 18;

/// Rank `r`'s routing: `t` tokens x `k` distinct experts of `e_total`, gates, rows.
fn routing(
    r: usize,
    t: usize,
    k: usize,
    e_total: usize,
    d: usize,
) -> (Vec<u32>, Vec<f32>, Vec<f32>) {
    let mut rng = SplitMix64::derive(SEED, &[r as u64]);
    let mut experts = Vec::with_capacity(t * k);
    for _ in 0..t {
        let mut pool: Vec<u32> = (0..e_total as u32).collect();
        for _ in 0..k {
            let i = (rng.next_u64() % pool.len() as u64) as usize;
            experts.push(pool.swap_remove(i));
        }
    }
    let gates = (0..t * k)
        .map(|_| (rng.next_u64() % 1000) as f32 / 997.0)
        .collect();
    let tokens = (0..t * d)
        .map(|_| (rng.next_u64() % 2001) as f32 / 16.0 - 60.0)
        .collect();
    (experts, gates, tokens)
}

fn expert_fn(e: u32, x: f32) -> f32 {
    x * (1.0 + e as f32 / 8.0) - e as f32
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: moe_dedup dedup|a2av K D TOKENS REPS";
    if args.len() != 5 {
        return Err(usage.into());
    }
    let mode: MoeDispatch = args[0].parse()?;
    let num = |i: usize| -> Result<usize, Box<dyn std::error::Error>> {
        Ok(args[i]
            .parse()
            .map_err(|e| format!("{usage}: {}: {e}", args[i]))?)
    };
    let (k, d, t, reps) = (num(1)?, num(2)?, num(3)?, num(4)?);
    let mut comm = Communicator::init_from_env()?;
    let (me, n) = (comm.rank(), comm.size());
    let topo = comm.topology().clone();
    let node = |r: usize| {
        if topo.has_level(Level::Node) {
            topo.domain(r, Level::Node)
        } else {
            r
        }
    };
    let e_total = EXPERTS_PER_RANK * n;
    if k > e_total {
        return Err(format!("k = {k} is more than the {e_total} experts").into());
    }
    let expert_rank: Vec<u32> = (0..e_total).map(|e| (e % n) as u32).collect();
    let (experts, gates, tokens) = routing(me, t, k, e_total, d);
    let route = MoeRouting {
        top_k: k,
        experts: &experts,
        gates: &gates,
        expert_rank: &expert_rank,
    };
    // The reference combine of this rank's tokens.
    let nodes = if topo.has_level(Level::Node) {
        topo.num_domains(Level::Node)
    } else {
        n
    };
    let mut want = vec![0f32; t * d];
    for tok in 0..t {
        for nd in 0..nodes {
            let mut partial = vec![0f32; d];
            let mut any = false;
            for j in 0..k {
                let e = experts[tok * k + j];
                if node(expert_rank[e as usize] as usize) != nd {
                    continue;
                }
                any = true;
                for (p, &x) in partial.iter_mut().zip(&tokens[tok * d..(tok + 1) * d]) {
                    *p += gates[tok * k + j] * expert_fn(e, x);
                }
            }
            if any {
                for (o, p) in want[tok * d..(tok + 1) * d].iter_mut().zip(&partial) {
                    *o += p;
                }
            }
        }
    }
    comm.barrier()?;
    let start = Instant::now();
    let mut wrong = 0u64;
    for _ in 0..reps {
        let (ex, rows) = MoeExchange::dispatch(&mut comm, &tokens, d, &route, mode)?;
        let mut y = Vec::with_capacity(rows.len());
        let mut r = 0;
        for (li, &e) in ex.local_experts().iter().enumerate() {
            for _ in 0..ex.expert_counts()[li] {
                y.extend(rows[r * d..(r + 1) * d].iter().map(|&x| expert_fn(e, x)));
                r += 1;
            }
        }
        let back = ex.combine(&mut comm, &y)?;
        wrong += back
            .iter()
            .zip(&want)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count() as u64;
    }
    comm.barrier()?;
    let seconds = start.elapsed().as_secs_f64() / reps.max(1) as f64;
    let mut total_wrong = [wrong];
    comm.all_reduce_in_place(&mut total_wrong, ReduceOp::Sum)?;
    if me == 0 {
        let (mut pairs, mut unique) = (0u64, 0u64);
        for s in 0..n {
            let (ids, _, _) = routing(s, t, k, e_total, 0);
            for tok in ids.chunks(k) {
                let mut remote: Vec<usize> = tok
                    .iter()
                    .map(|&e| node(expert_rank[e as usize] as usize))
                    .filter(|&x| x != node(s))
                    .collect();
                pairs += remote.len() as u64;
                remote.sort_unstable();
                remote.dedup();
                unique += remote.len() as u64;
            }
        }
        let per = if mode == MoeDispatch::Dedup {
            unique
        } else {
            pairs
        };
        println!(
            "moe_dedup: mode {} k {k} d {d} tokens {t} reps {reps} nodes {nodes} pairs {pairs} unique {unique} predicted_row_bytes {} seconds_per_rep {seconds:.6} wrong {}",
            args[0],
            2 * reps as u64 * d as u64 * 4 * per,
            total_wrong[0]
        );
    }
    if total_wrong[0] != 0 {
        return Err(format!(
            "{} combined elements differ from the reference",
            total_wrong[0]
        )
        .into());
    }
    Ok(())
}
