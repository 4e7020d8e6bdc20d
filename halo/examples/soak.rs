//! The soak worker (`scripts/soak.sh`): one rank of a job under `halo launch`, calling
//! random all-to-all-v (random counts with zeros, gapped layouts, a random algorithm per
//! call) for a bounded time, checking every received element, and reading its own
//! resident memory from `/proc/self/status` as it goes.
//!
//! ```sh
//! cargo build --release --example soak
//! halo launch -n 8 -- target/release/examples/soak 60   # seconds
//! ```
//!
//! Prints one line per rank: `soak: rank R calls C wrong_bytes W rss_kb start S end E
//! max M`, and exits 1 when any byte was wrong or a call failed.

use halo::{Algorithm, Communicator, Partition, ReduceOp};
use halo_moe::SplitMix64;
use std::time::{Duration, Instant};

/// Largest count per pair (u32 elements).
const MAX_COUNT: usize = 2048;
/// The ranks agree on stopping every this many calls.
const AGREE_EVERY: u64 = 16;

/// Element `i` of the block rank `from` sends to rank `to` in call `call`.
fn value(call: u64, from: usize, to: usize, i: usize) -> u32 {
    let mut r = SplitMix64::new(call ^ ((from as u64) << 40) ^ ((to as u64) << 20) ^ i as u64);
    r.next_u64() as u32
}

/// Resident memory in KiB (`VmRSS`).
fn rss_kb() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let seconds: u64 = std::env::args()
        .nth(1)
        .map(|s| s.parse())
        .transpose()
        .map_err(|e| format!("soak SECONDS: {e}"))?
        .unwrap_or(60);
    let mut comm = Communicator::init_from_env()?;
    let (me, n) = (comm.rank(), comm.size());
    let algorithms = [
        None,
        Some(Algorithm::Flat),
        Some(Algorithm::Pairwise),
        Some(Algorithm::Bruck),
        Some(Algorithm::Halo),
        Some(Algorithm::Halo2d),
    ];
    let start = Instant::now();
    let limit = Duration::from_secs(seconds);
    let (mut calls, mut wrong_bytes) = (0u64, 0u64);
    let (mut rss_start, mut rss_max) = (0u64, 0u64);
    loop {
        // The same draw on every rank: the whole count matrix and the layouts.
        let mut rng = SplitMix64::new(0x5eed ^ calls.wrapping_mul(0x1_0000_0001));
        let counts: Vec<Vec<usize>> = (0..n)
            .map(|_| {
                (0..n)
                    .map(|_| match rng.below(4) {
                        0 => 0,
                        1 => rng.below(8) as usize,
                        _ => rng.below(MAX_COUNT as u32 + 1) as usize,
                    })
                    .collect()
            })
            .collect();
        let gap = rng.below(4) as usize;
        let algorithm = algorithms[rng.below(algorithms.len() as u32) as usize];
        // Send: blocks in rank order with `gap` elements between them.
        let scounts: Vec<usize> = (0..n).map(|q| counts[me][q]).collect();
        let rcounts: Vec<usize> = (0..n).map(|q| counts[q][me]).collect();
        let layout = |c: &[usize]| {
            let mut d = Vec::with_capacity(n);
            let mut at = gap;
            for &x in c {
                d.push(at);
                at += x + gap;
            }
            (d, at)
        };
        let (sdispls, slen) = layout(&scounts);
        // Receive blocks in reverse rank order, to exercise displacements.
        let (mut rdispls, rlen) = {
            let rev: Vec<usize> = rcounts.iter().rev().copied().collect();
            let (d, len) = layout(&rev);
            (d, len)
        };
        rdispls.reverse();
        let mut send = vec![0xdead_beefu32; slen];
        for q in 0..n {
            for i in 0..scounts[q] {
                send[sdispls[q] + i] = value(calls, me, q, i);
            }
        }
        const UNTOUCHED: u32 = 0x5a5a_5a5a;
        let mut recv = vec![UNTOUCHED; rlen];
        comm.set_algorithm(algorithm);
        comm.all_to_all_v(
            &send,
            &Partition::new(&scounts, &sdispls),
            &mut recv,
            &Partition::new(&rcounts, &rdispls),
        )
        .map_err(|e| format!("rank {me}: call {calls} ({algorithm:?}): {e}"))?;
        // Every received element, and the gaps untouched.
        let mut expect = vec![UNTOUCHED; rlen];
        for q in 0..n {
            for i in 0..rcounts[q] {
                expect[rdispls[q] + i] = value(calls, q, me, i);
            }
        }
        for (got, want) in recv.iter().zip(&expect) {
            if got != want {
                wrong_bytes += (got ^ want)
                    .to_le_bytes()
                    .iter()
                    .filter(|&&b| b != 0)
                    .count() as u64;
            }
        }
        calls += 1;
        if calls == 100 {
            // After the warm-up: buffers, connections and caches exist.
            rss_start = rss_kb();
        }
        rss_max = rss_max.max(rss_kb());
        if calls.is_multiple_of(AGREE_EVERY) {
            // Rank 0's clock decides for everyone, so all ranks make the same calls.
            let done = u32::from(me == 0 && start.elapsed() >= limit);
            let mut flag = [0u32];
            comm.all_reduce(&[done], &mut flag, ReduceOp::Max)?;
            if flag[0] == 1 {
                break;
            }
        }
    }
    if rss_start == 0 {
        rss_start = rss_kb();
    }
    let rss_end = rss_kb();
    println!(
        "soak: rank {me} calls {calls} wrong_bytes {wrong_bytes} rss_kb start {rss_start} end {rss_end} max {rss_max} seconds {:.1}",
        start.elapsed().as_secs_f64()
    );
    if wrong_bytes > 0 {
        return Err(format!("rank {me}: {wrong_bytes} wrong bytes").into());
    }
    Ok(())
}
