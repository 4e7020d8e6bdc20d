//! Broadcast builders: the root's buffer of `len` bytes lands in every other rank's
//! receive buffer (`len` bytes). The root sends from its send buffer and has no
//! receive buffer (so a broadcast is in place: the caller lends the root's buffer as
//! the send buffer and every other rank's as the receive buffer).
//!
//! | algorithm | rounds | messages sent per rank | bytes sent per rank | for |
//! |---|---|---|---|---|
//! | [`BroadcastAlgorithm::Binomial`] | ceil(log2 N) | up to ceil(log2 N) | up to ceil(log2 N) x len | small buffers |
//! | [`BroadcastAlgorithm::Chain`] | N - 1 + chunks - 1 | chunks | len (the last rank: 0) | large buffers |
//!
//! Ranks are numbered relative to the root, `v = (r - root) mod N`.
//! - **Binomial tree**: rank `v > 0` receives from `v - lowbit(v)` and then sends to
//!   `v + 2^k` for every `2^k < lowbit(v)` (the root: every `2^k < N`), largest subtree
//!   first; every message is the whole buffer.
//! - **Pipelined chain**: the buffer goes in chunks of [`BROADCAST_CHUNK`] bytes along
//!   `v = 0, 1, ..., N-1`; a rank forwards chunk `c` as soon as it has received it, so
//!   the chunks flow through the chain one behind the other and every link carries the
//!   buffer once. Every receive is posted at once (tag: the chunk's number).
//!
//! Every rooted program (broadcast, gather, scatter) also sends a 1-byte agreement
//! message to the next rank and receives one from the previous, so that ranks that
//! disagree on the root always meet (see [`ROOT_AGREEMENT_TAG`]).
//!
//! A zero-byte buffer gives an empty program.

use crate::error::{CollectiveError, Result};
use crate::schedule::{Buf, Region, Schedule, ScheduleBuilder};
use halo_topology::Rank;
use std::fmt;
use std::str::FromStr;

/// A broadcast algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BroadcastAlgorithm {
    /// A binomial tree: ceil(log2 N) rounds of whole-buffer messages, for small buffers.
    Binomial,
    /// A pipelined chain of [`BROADCAST_CHUNK`]-byte chunks: every link carries the
    /// buffer once, for large buffers.
    Chain,
}

/// Bytes up to which the automatic choice takes the binomial tree.
pub const BROADCAST_SMALL: usize = 64 << 10;

/// The chain's chunk: 64 KiB.
pub const BROADCAST_CHUNK: usize = 64 << 10;

impl BroadcastAlgorithm {
    /// Every broadcast algorithm.
    pub const ALL: [BroadcastAlgorithm; 2] =
        [BroadcastAlgorithm::Binomial, BroadcastAlgorithm::Chain];

    /// The name used on command lines and in output.
    pub fn name(self) -> &'static str {
        match self {
            BroadcastAlgorithm::Binomial => "binomial",
            BroadcastAlgorithm::Chain => "chain",
        }
    }

    /// The automatic choice for `size` ranks and `len` bytes: the binomial tree up to
    /// [`BROADCAST_SMALL`] bytes or up to 2 ranks, the chain above.
    pub fn auto(size: usize, len: usize) -> BroadcastAlgorithm {
        if len <= BROADCAST_SMALL || size <= 2 {
            BroadcastAlgorithm::Binomial
        } else {
            BroadcastAlgorithm::Chain
        }
    }
}

impl fmt::Display for BroadcastAlgorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for BroadcastAlgorithm {
    type Err = CollectiveError;

    fn from_str(s: &str) -> Result<Self> {
        BroadcastAlgorithm::ALL
            .iter()
            .copied()
            .find(|a| a.name() == s)
            .ok_or_else(|| {
                CollectiveError::InvalidArgument(format!(
                    "unknown broadcast algorithm '{s}' (expected binomial or chain)"
                ))
            })
    }
}

/// Checks a rooted collective's rank and root.
pub(crate) fn check_root(rank: Rank, size: usize, root: Rank) -> Result<()> {
    if rank >= size {
        return Err(CollectiveError::InvalidArgument(format!(
            "rank {rank} out of range for {size} ranks"
        )));
    }
    if root >= size {
        return Err(CollectiveError::InvalidArgument(format!(
            "root {root} out of range for {size} ranks"
        )));
    }
    Ok(())
}

/// The tag of a rooted collective's agreement message (above every data tag).
pub const ROOT_AGREEMENT_TAG: u64 = 1 << (crate::schedule::TAG_BITS - 1);

/// Adds the agreement ring of a rooted collective: a 1-byte message to the next rank
/// and one from the previous (`(rank ± 1) mod size`), independent of the data steps.
///
/// A rooted collective's data flows only between a root and the ranks that take it as
/// theirs, so two ranks that disagree on the root (each naming itself, or each the
/// other) may exchange nothing: both could succeed with different results, or both
/// wait. The ring makes every rank receive a message carrying its neighbour's call
/// descriptor, so whenever ranks disagree on anything, some rank meets a neighbour
/// that disagrees and names both values (and, where the transport poisons, the others
/// fail with it). Two scratch bytes; one small message in parallel with the data.
pub(crate) fn add_root_agreement(b: &mut ScheduleBuilder, rank: Rank, size: usize) {
    if size < 2 {
        return;
    }
    let out = b.scratch(1);
    let back = b.scratch(1);
    b.send((rank + 1) % size, ROOT_AGREEMENT_TAG, out, &[]);
    b.recv((rank + size - 1) % size, ROOT_AGREEMENT_TAG, back, &[]);
}

/// Builds `rank`'s broadcast program for `size` ranks, root `root` and `len` bytes.
///
/// # Errors
/// [`CollectiveError::InvalidArgument`] when `rank` or `root` is out of range.
pub fn build_broadcast(
    algorithm: BroadcastAlgorithm,
    rank: Rank,
    size: usize,
    root: Rank,
    len: usize,
) -> Result<Schedule> {
    check_root(rank, size, root)?;
    let name = match algorithm {
        BroadcastAlgorithm::Binomial => "broadcast binomial",
        BroadcastAlgorithm::Chain => "broadcast chain",
    };
    let mut b = ScheduleBuilder::new(rank, size, name);
    if len == 0 || size == 1 {
        return Ok(b.finish());
    }
    add_root_agreement(&mut b, rank, size);
    let v = (rank + size - root) % size;
    let real = |v: usize| (v + root) % size;
    match algorithm {
        BroadcastAlgorithm::Binomial => {
            let low = if v == 0 {
                size.next_power_of_two()
            } else {
                1 << v.trailing_zeros()
            };
            let (buf, deps) = if v == 0 {
                (Buf::Send, Vec::new())
            } else {
                let r = b.recv(real(v - low), 0, Region::new(Buf::Recv, 0, len), &[]);
                (Buf::Recv, vec![r])
            };
            let mut k = low >> 1;
            while k > 0 {
                if v + k < size {
                    b.send(real(v + k), 0, Region::new(buf, 0, len), &deps);
                }
                k >>= 1;
            }
        }
        BroadcastAlgorithm::Chain => {
            let chunks = len.div_ceil(BROADCAST_CHUNK);
            let chunk = |c: usize| {
                let at = c * BROADCAST_CHUNK;
                (at, BROADCAST_CHUNK.min(len - at))
            };
            b.reserve(2 * chunks, chunks);
            let recvs: Vec<_> = if v == 0 {
                Vec::new()
            } else {
                (0..chunks)
                    .map(|c| {
                        let (at, n) = chunk(c);
                        b.recv(real(v - 1), c as u64, Region::new(Buf::Recv, at, n), &[])
                    })
                    .collect()
            };
            if v + 1 < size {
                for c in 0..chunks {
                    let (at, n) = chunk(c);
                    // The root sends from its buffer; the others forward what came.
                    let (buf, deps) = match recvs.get(c) {
                        None => (Buf::Send, &[][..]),
                        Some(r) => (Buf::Recv, std::slice::from_ref(r)),
                    };
                    b.send(real(v + 1), c as u64, Region::new(buf, at, n), deps);
                }
            }
        }
    }
    Ok(b.finish())
}
