//! All-gather builders: rank `r`'s block — its whole send buffer, `block` bytes — lands
//! at `r * block` of every rank's receive buffer (`N * block` bytes).
//!
//! | algorithm | rounds | messages per rank | bytes sent per rank | scratch |
//! |---|---|---|---|---|
//! | [`AllGatherAlgorithm::Ring`] | N-1 | N-1 | (N-1) x block | none |
//! | [`AllGatherAlgorithm::RecursiveDoubling`] (N a power of two) | log2 N | log2 N | (N-1) x block | none |
//! | [`AllGatherAlgorithm::Bruck`] (any N) | ceil(log2 N) | ceil(log2 N) | (N-1) x block | N x block |
//!
//! - **Ring**: in round `i` rank `r` passes block `(r - i) mod N` to `r + 1` and
//!   receives block `(r - i - 1) mod N` from `r - 1`; a forward waits for the receive of
//!   the round before. Bandwidth-optimal; for large blocks.
//! - **Recursive doubling**: in round `k` rank `r` exchanges the `2^k` blocks of its
//!   aligned group with the group of `r XOR 2^k`, straight between receive buffers
//!   (the blocks of a group are contiguous). For small blocks when N is a power of two.
//! - **Bruck**: blocks are kept rotated in scratch (slot `j` = block of rank
//!   `(r + j) mod N`); in round `k` rank `r` sends its first `min(2^k, N - 2^k)` slots
//!   to `r - 2^k` and receives as many from `r + 2^k` into slots `2^k..`; two copies
//!   rotate scratch into the receive buffer at the end. For small blocks, any N.
//!
//! Every receive is posted at once (distinct tags: the round number); zero-byte blocks
//! give an empty program.

use crate::error::{CollectiveError, Result};
use crate::schedule::{Buf, Region, Schedule, ScheduleBuilder, StepId};
use halo_topology::Rank;
use std::fmt;
use std::str::FromStr;

/// An all-gather algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AllGatherAlgorithm {
    /// N-1 rounds around a ring: bandwidth-optimal, for large blocks.
    Ring,
    /// log2 N rounds of pairwise exchanges of doubling groups; N must be a power of two.
    RecursiveDoubling,
    /// ceil(log2 N) rounds for any N, through rotated scratch.
    Bruck,
}

/// Total bytes (N x block) up to which the automatic choice takes a logarithmic algorithm.
pub const ALL_GATHER_SMALL: usize = 64 << 10;

impl AllGatherAlgorithm {
    /// Every all-gather algorithm.
    pub const ALL: [AllGatherAlgorithm; 3] = [
        AllGatherAlgorithm::Ring,
        AllGatherAlgorithm::RecursiveDoubling,
        AllGatherAlgorithm::Bruck,
    ];

    /// The name used on command lines and in output.
    pub fn name(self) -> &'static str {
        match self {
            AllGatherAlgorithm::Ring => "ring",
            AllGatherAlgorithm::RecursiveDoubling => "recursive-doubling",
            AllGatherAlgorithm::Bruck => "bruck",
        }
    }

    /// Whether the algorithm works for `size` ranks.
    pub fn supports(self, size: usize) -> bool {
        match self {
            AllGatherAlgorithm::RecursiveDoubling => size.is_power_of_two(),
            AllGatherAlgorithm::Ring | AllGatherAlgorithm::Bruck => size > 0,
        }
    }

    /// The automatic choice for `size` ranks and `block` bytes per rank: logarithmic
    /// rounds while the gathered total is at most [`ALL_GATHER_SMALL`], the ring above.
    pub fn auto(size: usize, block: usize) -> AllGatherAlgorithm {
        if block.saturating_mul(size) > ALL_GATHER_SMALL {
            AllGatherAlgorithm::Ring
        } else if size.is_power_of_two() {
            AllGatherAlgorithm::RecursiveDoubling
        } else {
            AllGatherAlgorithm::Bruck
        }
    }
}

impl fmt::Display for AllGatherAlgorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for AllGatherAlgorithm {
    type Err = CollectiveError;

    fn from_str(s: &str) -> Result<Self> {
        AllGatherAlgorithm::ALL
            .iter()
            .copied()
            .find(|a| a.name() == s)
            .ok_or_else(|| {
                CollectiveError::InvalidArgument(format!(
                    "unknown all-gather algorithm '{s}' (expected ring, recursive-doubling or bruck)"
                ))
            })
    }
}

/// Builds `rank`'s all-gather program for `size` ranks and `block` bytes per rank.
///
/// # Errors
/// [`CollectiveError::InvalidArgument`] when `rank` is out of range, the algorithm does
/// not support `size` ranks, or `size x block` overflows.
pub fn build_all_gather(
    algorithm: AllGatherAlgorithm,
    rank: Rank,
    size: usize,
    block: usize,
) -> Result<Schedule> {
    if rank >= size {
        return Err(CollectiveError::InvalidArgument(format!(
            "rank {rank} out of range for {size} ranks"
        )));
    }
    if !algorithm.supports(size) {
        return Err(CollectiveError::InvalidArgument(format!(
            "all-gather {algorithm} needs a power-of-two number of ranks, not {size}"
        )));
    }
    if block.checked_mul(size).is_none() {
        return Err(CollectiveError::InvalidArgument(format!(
            "all-gather of {size} x {block} bytes overflows"
        )));
    }
    let name = match algorithm {
        AllGatherAlgorithm::Ring => "all-gather ring",
        AllGatherAlgorithm::RecursiveDoubling => "all-gather recursive doubling",
        AllGatherAlgorithm::Bruck => "all-gather bruck",
    };
    let mut b = ScheduleBuilder::new(rank, size, name);
    if block == 0 {
        return Ok(b.finish());
    }
    match algorithm {
        AllGatherAlgorithm::Ring => ring(&mut b, rank, size, block),
        AllGatherAlgorithm::RecursiveDoubling => doubling(&mut b, rank, size, block),
        AllGatherAlgorithm::Bruck => bruck(&mut b, rank, size, block),
    }
    Ok(b.finish())
}

fn ring(b: &mut ScheduleBuilder, me: Rank, n: usize, block: usize) {
    let mine = Region::new(Buf::Send, 0, block);
    let at = |q: Rank| Region::new(Buf::Recv, q * block, block);
    b.reserve(2 * n, n);
    b.copy(mine, at(me), &[]);
    if n == 1 {
        return;
    }
    let (left, right) = ((me + n - 1) % n, (me + 1) % n);
    let recvs: Vec<StepId> = (0..n - 1)
        .map(|i| b.recv(left, i as u64, at((me + 2 * n - i - 1) % n), &[]))
        .collect();
    for i in 0..n - 1 {
        if i == 0 {
            b.send(right, 0, mine, &[]);
        } else {
            b.send(right, i as u64, at((me + n - i) % n), &[recvs[i - 1]]);
        }
    }
}

fn doubling(b: &mut ScheduleBuilder, me: Rank, n: usize, block: usize) {
    let rounds = n.trailing_zeros() as usize;
    b.reserve(2 * rounds + 1, rounds * rounds + rounds);
    let copy = b.copy(
        Region::new(Buf::Send, 0, block),
        Region::new(Buf::Recv, me * block, block),
        &[],
    );
    let mut written: Vec<StepId> = vec![copy];
    let mut recvs = Vec::with_capacity(rounds);
    for k in 0..rounds {
        let d = 1usize << k;
        let partner = me ^ d;
        let base = partner & !(d - 1);
        recvs.push(b.recv(
            partner,
            k as u64,
            Region::new(Buf::Recv, base * block, d * block),
            &[],
        ));
    }
    for (k, &recv) in recvs.iter().enumerate() {
        let d = 1usize << k;
        let partner = me ^ d;
        if k == 0 {
            b.send(partner, 0, Region::new(Buf::Send, 0, block), &[]);
        } else {
            let base = me & !(d - 1);
            b.send(
                partner,
                k as u64,
                Region::new(Buf::Recv, base * block, d * block),
                &written,
            );
        }
        written.push(recv);
    }
}

fn bruck(b: &mut ScheduleBuilder, me: Rank, n: usize, block: usize) {
    let scratch = b.scratch(n * block);
    let slot = |j: usize, count: usize| scratch.sub(j * block, count * block);
    let first = b.copy(Region::new(Buf::Send, 0, block), slot(0, 1), &[]);
    let mut written: Vec<StepId> = vec![first];
    let mut d = 1usize;
    let mut k = 0u64;
    let mut rounds: Vec<(usize, usize)> = Vec::new();
    while d < n {
        let count = d.min(n - d);
        rounds.push((d, count));
        d <<= 1;
    }
    let recvs: Vec<StepId> = rounds
        .iter()
        .enumerate()
        .map(|(i, &(d, count))| b.recv((me + d) % n, i as u64, slot(d, count), &[]))
        .collect();
    for (&(d, count), &recv) in rounds.iter().zip(&recvs) {
        b.send((me + n - d) % n, k, slot(0, count), &written);
        written.push(recv);
        k += 1;
    }
    // Slot j holds the block of rank (me + j) mod n.
    let tail = n - me;
    b.copy(
        slot(0, tail),
        Region::new(Buf::Recv, me * block, tail * block),
        &written,
    );
    if me > 0 {
        b.copy(
            slot(tail, me),
            Region::new(Buf::Recv, 0, me * block),
            &written,
        );
    }
}
