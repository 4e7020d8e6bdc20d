//! What builders know about the data: this rank's buffer layout and the sizes of
//! the blocks that pass through it.

use crate::error::CollectiveError;
use crate::schedule::{Buf, Region, Schedule};
use halo_topology::Rank;
use std::cell::Cell;
use std::collections::HashMap;

/// The caller's buffer layout on this rank, in bytes.
#[derive(Debug, Clone, Copy)]
pub enum Layout<'a> {
    /// All-to-all: `block` bytes to and from every rank, block `q` at `q * block`.
    Uniform {
        /// Bytes per peer.
        block: usize,
    },
    /// All-to-all-v: per-peer counts and displacements, in bytes.
    V {
        /// Bytes sent to each rank.
        send_counts: &'a [usize],
        /// Offset in the send buffer of the bytes for each rank.
        send_displs: &'a [usize],
        /// Bytes received from each rank.
        recv_counts: &'a [usize],
        /// Offset in the receive buffer of the bytes from each rank.
        recv_displs: &'a [usize],
    },
}

impl Layout<'_> {
    /// Where the bytes for rank `q` sit in the send buffer.
    pub fn send_region(&self, q: Rank) -> Region {
        match *self {
            Layout::Uniform { block } => Region::new(Buf::Send, q * block, block),
            Layout::V {
                send_counts,
                send_displs,
                ..
            } => Region::new(Buf::Send, send_displs[q], send_counts[q]),
        }
    }

    /// Where the bytes from rank `q` land in the receive buffer.
    pub fn recv_region(&self, q: Rank) -> Region {
        match *self {
            Layout::Uniform { block } => Region::new(Buf::Recv, q * block, block),
            Layout::V {
                recv_counts,
                recv_displs,
                ..
            } => Region::new(Buf::Recv, recv_displs[q], recv_counts[q]),
        }
    }
}

/// Sizes of blocks: how many bytes `src` sends to `dst`.
///
/// A builder asks only about blocks it handles: its own row (`src` = this rank), its
/// own column (`dst` = this rank) and, for store-and-forward algorithms, blocks it
/// routes — which it learned from a uniform pass of the same algorithm over the
/// counts (see [`crate::RoutedBlock`]) or from an all-gather of every rank's counts.
pub trait BlockSizes {
    /// Bytes from `src` to `dst`.
    fn bytes(&self, src: Rank, dst: Rank) -> usize;

    /// A block the builder asked about that this oracle could not know, if any.
    fn unknown(&self) -> Option<(Rank, Rank)> {
        None
    }

    /// The size of every block, when every rank's oracle knows they are all equal
    /// (a uniform all-to-all); `None` otherwise. Builders may route a uniform
    /// all-to-all differently, since every rank can then compute every block's place.
    fn uniform(&self) -> Option<usize> {
        None
    }
}

/// Every block has the same size.
#[derive(Debug, Clone, Copy)]
pub struct UniformSizes(pub usize);

impl BlockSizes for UniformSizes {
    fn bytes(&self, _: Rank, _: Rank) -> usize {
        self.0
    }

    fn uniform(&self) -> Option<usize> {
        Some(self.0)
    }
}

/// A full `N x N` matrix of sizes (row = source), for tests, verification and simulation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MatrixSizes {
    n: usize,
    bytes: Vec<usize>,
}

impl MatrixSizes {
    /// From a row-major `n x n` matrix.
    ///
    /// # Panics
    /// If `bytes.len() != n * n`.
    pub fn new(n: usize, bytes: Vec<usize>) -> Self {
        assert_eq!(bytes.len(), n * n, "matrix must be n x n");
        MatrixSizes { n, bytes }
    }

    /// Number of ranks.
    pub fn n(&self) -> usize {
        self.n
    }

    /// Row `src`: what `src` sends to each rank.
    pub fn row(&self, src: Rank) -> &[usize] {
        &self.bytes[src * self.n..(src + 1) * self.n]
    }

    /// Column `dst`: what each rank sends to `dst`.
    pub fn column(&self, dst: Rank) -> Vec<usize> {
        (0..self.n).map(|s| self.bytes[s * self.n + dst]).collect()
    }
}

impl BlockSizes for MatrixSizes {
    fn bytes(&self, src: Rank, dst: Rank) -> usize {
        self.bytes[src * self.n + dst]
    }
}

/// What one rank really knows at run time: its own send and receive counts and the
/// sizes of the blocks it routes, learned from the metadata pass — either the routed
/// blocks alone ([`KnownSizes::new`], from a uniform metadata pass of the data pass's
/// algorithm) or every block ([`KnownSizes::from_matrix`], when every rank's counts were
/// all-gathered).
///
/// Asking about any other block returns 0 and is remembered, so that the build fails
/// with an internal error instead of moving wrong bytes.
#[derive(Debug)]
pub struct KnownSizes<'a> {
    me: Rank,
    send: &'a [usize],
    recv: &'a [usize],
    routed: Routed<'a>,
    unknown: Cell<Option<(Rank, Rank)>>,
}

/// Where [`KnownSizes`] looks up the blocks of other ranks.
#[derive(Debug)]
enum Routed<'a> {
    /// The routed blocks, by (source, destination).
    Map(HashMap<(u32, u32), usize>),
    /// The whole `N x N` matrix, row-major, row = source.
    Matrix(&'a [usize]),
}

impl<'a> KnownSizes<'a> {
    /// This rank's counts in bytes, and the routed block sizes.
    pub fn new(
        me: Rank,
        send: &'a [usize],
        recv: &'a [usize],
        routed: HashMap<(u32, u32), usize>,
    ) -> Self {
        KnownSizes {
            me,
            send,
            recv,
            routed: Routed::Map(routed),
            unknown: Cell::new(None),
        }
    }

    /// This rank's counts in bytes and the whole send matrix: `matrix[src * N + dst]`
    /// bytes from `src` to `dst`, `N = send.len()` (an all-gather of every rank's
    /// counts gives it). A block outside the matrix (one of the wrong length) is
    /// unknown, as with [`KnownSizes::new`].
    pub fn from_matrix(
        me: Rank,
        send: &'a [usize],
        recv: &'a [usize],
        matrix: &'a [usize],
    ) -> Self {
        KnownSizes {
            me,
            send,
            recv,
            routed: Routed::Matrix(matrix),
            unknown: Cell::new(None),
        }
    }

    /// Reads the routed sizes out of a metadata pass: `schedule` is the uniform
    /// schedule that ran with blocks of [`META_BLOCK`] bytes whose first 8 bytes are the
    /// sender's byte count (little endian), and `scratch` is its scratch after the run.
    pub fn routed_from_meta(
        schedule: &Schedule,
        scratch: &[u8],
    ) -> Result<HashMap<(u32, u32), usize>, CollectiveError> {
        let mut out = HashMap::with_capacity(schedule.routed().len());
        for b in schedule.routed() {
            let bytes = scratch.get(b.offset..b.offset + 8).ok_or_else(|| {
                CollectiveError::Internal(format!(
                    "routed block ({}, {}) outside scratch",
                    b.src, b.dst
                ))
            })?;
            let v = u64::from_le_bytes(bytes.try_into().expect("8 bytes"));
            let v = usize::try_from(v).map_err(|_| {
                CollectiveError::InvalidUsage(format!(
                    "rank {} announced {v} bytes for rank {}",
                    b.src, b.dst
                ))
            })?;
            out.insert((b.src, b.dst), v);
        }
        Ok(out)
    }
}

/// Bytes per block of the metadata pass: the sender's count to the receiver and the
/// sender's expected count from the receiver, both `u64` little endian.
pub const META_BLOCK: usize = 16;

impl BlockSizes for KnownSizes<'_> {
    fn bytes(&self, src: Rank, dst: Rank) -> usize {
        if src == self.me {
            return self.send[dst];
        }
        if dst == self.me {
            return self.recv[src];
        }
        let known = match &self.routed {
            Routed::Map(m) => m.get(&(src as u32, dst as u32)).copied(),
            Routed::Matrix(m) => src
                .checked_mul(self.send.len())
                .and_then(|i| i.checked_add(dst))
                .filter(|_| dst < self.send.len())
                .and_then(|i| m.get(i).copied()),
        };
        match known {
            Some(b) => b,
            None => {
                if self.unknown.get().is_none() {
                    self.unknown.set(Some((src, dst)));
                }
                0
            }
        }
    }

    fn unknown(&self) -> Option<(Rank, Rank)> {
        self.unknown.get()
    }
}
