//! An MoE layer's token exchange, as processes: every rank routes its tokens to experts
//! (top-2 of 2 experts per rank), exchanges the counts, dispatches the tokens with
//! all-to-all-v, lets its experts transform them, and combines them back with the
//! reverse all-to-all-v. Each rank checks every token it gets back.
//!
//! ```sh
//! cargo build --example moe_dispatch -p halo && cargo build -p halo-cli
//! target/debug/halo launch -n 4 -- target/debug/examples/moe_dispatch
//! ```

use halo::{Communicator, Partition};

const HIDDEN: usize = 16; // elements per token
const TOKENS: usize = 64; // tokens per rank
const EXPERTS_PER_RANK: usize = 2;

/// The router: a deterministic top-2 of the job's experts for token `t` of rank `r`.
fn route(r: usize, t: usize, experts: usize) -> [usize; 2] {
    let a = (r * 31 + t * 7) % experts;
    [a, (a + 1 + t % (experts - 1)) % experts]
}

/// What expert `e` does to a token: adds `e + 1` to every element.
fn expert(e: usize, token: &mut [f32]) {
    token.iter_mut().for_each(|x| *x += (e + 1) as f32);
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut comm = Communicator::init_from_env()?;
    let (me, n) = (comm.rank(), comm.size());
    let experts = n * EXPERTS_PER_RANK;
    let tokens: Vec<f32> = (0..TOKENS * HIDDEN)
        .map(|i| (me * 100_000 + i) as f32)
        .collect();

    // Route: (token, expert) pairs grouped by the rank that holds the expert.
    let mut pairs: Vec<(usize, usize)> = (0..TOKENS)
        .flat_map(|t| route(me, t, experts).map(|e| (t, e)))
        .collect();
    pairs.sort_by_key(|&(t, e)| (e / EXPERTS_PER_RANK, e, t));
    let mut send_counts = vec![0usize; n];
    let mut send = Vec::with_capacity(pairs.len() * (HIDDEN + 1));
    for &(t, e) in &pairs {
        send_counts[e / EXPERTS_PER_RANK] += HIDDEN + 1;
        send.push(e as f32); // the expert id travels with the token
        send.extend_from_slice(&tokens[t * HIDDEN..(t + 1) * HIDDEN]);
    }

    // Exchange the counts (a uniform all-to-all of one count per peer), then dispatch.
    let mut recv_counts = vec![0usize; n];
    comm.all_to_all(&send_counts, &mut recv_counts)?;
    let mut recv = vec![0f32; recv_counts.iter().sum()];
    let (send_part, recv_part) = (
        Partition::packed(&send_counts),
        Partition::packed(&recv_counts),
    );
    comm.all_to_all_v(&send, &send_part, &mut recv, &recv_part)?;

    // The local experts process what arrived, in place.
    for row in recv.chunks_exact_mut(HIDDEN + 1) {
        let e = row[0] as usize;
        assert_eq!(
            e / EXPERTS_PER_RANK,
            me,
            "token for expert {e} reached rank {me}"
        );
        expert(e, &mut row[1..]);
    }

    // Combine: the reverse exchange brings every processed token home.
    let mut back = vec![0f32; send.len()];
    comm.all_to_all_v(&recv, &recv_part, &mut back, &send_part)?;
    let mut combined = vec![0f32; TOKENS * HIDDEN];
    for (row, &(t, e)) in back.chunks_exact(HIDDEN + 1).zip(&pairs) {
        assert_eq!(
            row[0] as usize, e,
            "rank {me}: token {t} came back from another expert"
        );
        for (c, x) in combined[t * HIDDEN..(t + 1) * HIDDEN]
            .iter_mut()
            .zip(&row[1..])
        {
            *c += x;
        }
    }
    // Check: each token is the sum of its two experts' outputs.
    for t in 0..TOKENS {
        let [a, b] = route(me, t, experts);
        for i in 0..HIDDEN {
            let x = tokens[t * HIDDEN + i];
            let want = 2.0 * x + (a + 1) as f32 + (b + 1) as f32;
            if combined[t * HIDDEN + i] != want {
                return Err(format!("rank {me}: token {t} element {i} wrong").into());
            }
        }
    }
    comm.barrier()?;
    println!(
        "rank {me}/{n}: {TOKENS} tokens dispatched to {experts} experts and combined, byte-exact"
    );
    Ok(())
}
