//! Reduce-scatter as data: a plan of exchange rounds ([`crate::ReduceRound`], the
//! shape of the all-reduce plans) over an accumulator of `N x count` elements — a copy
//! of the rank's send buffer — after which block `r` (elements `r*count ..
//! (r+1)*count`) of rank `r` holds block `r` of every rank reduced.
//!
//! **Ring.** In round `i` (`0 .. N-1`) rank `r` sends block `(r - i - 1) mod N` to
//! `r + 1` and receives block `(r - i - 2) mod N` from `r - 1`, reducing it into its
//! own copy with the received partial first. So the partial of block `b` travels
//! `b + 1, b + 2, ..., b` around the ring, each rank adding its own contribution last,
//! and ends at rank `b` after `N - 1` rounds: the expression of block `b` is
//! `((x[b+1] ⊕ x[b+2]) ⊕ ...) ⊕ x[b]` (indices mod N), fixed by the plan, so the bits
//! are the same from run to run for any deterministic operation.
//!
//! | rounds | messages per rank | elements sent per rank | reductions per rank |
//! |---|---|---|---|
//! | N-1 | N-1 | (N-1) x count | (N-1) x count |
//!
//! Bandwidth-optimal for any N (powers of two or not); a zero `count` or one rank
//! gives an empty plan. [`verify_reduce_scatter`] proves a plan: matching as for
//! all-reduce, and every element of block `r` on rank `r` holding every rank's input
//! exactly once.

use crate::error::{CollectiveError, Result, VerifyError};
use crate::reduce::{Landing, ReduceReport, ReduceRound, Transfer, replay_rounds, verr};
use halo_topology::Rank;
use std::collections::HashMap;

/// Builds `rank`'s reduce-scatter plan (the ring) for `size` ranks and blocks of
/// `count` elements; the accumulator has `size * count` elements.
///
/// # Errors
/// [`CollectiveError::InvalidArgument`] when `rank` is out of range or `size * count`
/// overflows.
pub fn reduce_scatter_plan(rank: Rank, size: usize, count: usize) -> Result<Vec<ReduceRound>> {
    if rank >= size {
        return Err(CollectiveError::InvalidArgument(format!(
            "rank {rank} out of range for {size} ranks"
        )));
    }
    if count.checked_mul(size).is_none() {
        return Err(CollectiveError::InvalidArgument(format!(
            "reduce-scatter of {size} x {count} elements overflows"
        )));
    }
    if size == 1 || count == 0 {
        return Ok(Vec::new());
    }
    let block = |b: usize| b * count..(b + 1) * count;
    let (left, right) = ((rank + size - 1) % size, (rank + 1) % size);
    Ok((0..size - 1)
        .map(|i| ReduceRound {
            tag: i as u64,
            send: Some(Transfer {
                peer: right,
                range: block((rank + 2 * size - i - 1) % size),
            }),
            recv: Some(Transfer {
                peer: left,
                range: block((rank + 2 * size - i - 2) % size),
            }),
            landing: Landing::Reduce { peer_first: true },
        })
        .collect())
}

/// Verifies one reduce-scatter plan per rank for blocks of `count` elements,
/// symbolically: the static checks and the matching of [`crate::verify_all_reduce`]
/// (so running the rounds in tag order cannot deadlock), then that every element of
/// block `r` on rank `r` holds an expression with every rank's input exactly once.
pub fn verify_reduce_scatter(
    plans: &[Vec<ReduceRound>],
    count: usize,
) -> std::result::Result<ReduceReport, VerifyError> {
    let n = plans.len();
    let len = n
        .checked_mul(count)
        .ok_or_else(|| verr(0, format!("{n} x {count} elements overflow")))?;
    let (acc, exprs, report) = replay_rounds(plans, len)?;
    let mut memo = HashMap::new();
    for (r, acc) in acc.iter().enumerate() {
        for (i, &e) in acc[r * count..(r + 1) * count].iter().enumerate() {
            if let Some((q, c)) = exprs
                .counts(e, &mut memo)
                .iter()
                .enumerate()
                .find(|(_, c)| **c != 1)
            {
                return Err(verr(
                    r,
                    format!("element {i} of block {r} ends with the input of rank {q} {c} times"),
                ));
            }
        }
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_verifies_for_every_size() {
        for n in 1..=9 {
            for count in [0usize, 1, 3] {
                let plans: Vec<_> = (0..n)
                    .map(|r| reduce_scatter_plan(r, n, count).unwrap())
                    .collect();
                let report = verify_reduce_scatter(&plans, count).unwrap();
                let want = if count == 0 { 0 } else { n * (n - 1) };
                assert_eq!(report.messages, want, "n={n} count={count}");
                assert_eq!(report.reductions, (want * count) as u64);
            }
        }
    }

    #[test]
    fn a_missing_round_is_found() {
        let n = 4;
        let mut plans: Vec<_> = (0..n)
            .map(|r| reduce_scatter_plan(r, n, 2).unwrap())
            .collect();
        // Rank 2 skips its last round: rank 3 waits for a message that never comes.
        plans[2].pop();
        assert!(verify_reduce_scatter(&plans, 2).is_err());
        // All ranks skip their last round: the blocks lack one contribution each.
        let mut short: Vec<_> = (0..n)
            .map(|r| reduce_scatter_plan(r, n, 2).unwrap())
            .collect();
        for p in &mut short {
            p.pop();
        }
        let e = verify_reduce_scatter(&short, 2).unwrap_err();
        assert!(e.message.contains("0 times"), "{e}");
        // An all-reduce plan reduces block r on rank r too: it passes.
        let ar: Vec<_> = (0..n)
            .map(|r| {
                crate::all_reduce_plan(crate::AllReduceAlgorithm::Rabenseifner, r, n, n * 2)
                    .unwrap()
            })
            .collect();
        verify_reduce_scatter(&ar, 2).unwrap();
    }
}
