//! Algorithm builders: one file per algorithm, each a function from a [`BuildCtx`]
//! to one rank's [`Schedule`].
//!
//! Adding an algorithm: write `algo/NAME.rs` with `pub(crate) fn build(ctx) ->
//! Result<Schedule>`, add a variant to [`Algorithm`], and list it in
//! [`Algorithm::ALL`]; the verifier, the executor, the simulator and the benchmarks
//! then take it as they take the others.

mod bruck;
mod flat;
mod halo;
mod halo2d;
pub(crate) mod moe;
mod pack;
mod pairwise;

use crate::error::{CollectiveError, Result};
use crate::layout::{BlockSizes, Layout};
use crate::schedule::Schedule;
use halo_topology::{Level, Rank, Topology};
use std::fmt;
use std::str::FromStr;

/// An all-to-all algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// The vendor fan-out (what RCCL and NCCL do): every send and receive posted at once.
    Flat,
    /// N-1 rounds; in round i rank r sends to r+i and receives from r-i (XOR partners
    /// when N is a power of two).
    Pairwise,
    /// ceil(log2 N) rounds with local rotations; for small messages.
    Bruck,
    /// Hierarchical over the topology: intra-node exchange alongside one aggregated
    /// message per remote domain to the rank-aligned peer there, then redistribution.
    Halo,
    /// Sender-side aggregation (RCCL/MSCCL "2D"): gather by local index inside the node,
    /// then one exchange per remote node between same-index ranks.
    Halo2d,
}

impl Algorithm {
    /// Every algorithm.
    pub const ALL: [Algorithm; 5] = [
        Algorithm::Flat,
        Algorithm::Pairwise,
        Algorithm::Bruck,
        Algorithm::Halo,
        Algorithm::Halo2d,
    ];

    /// The name used on command lines and in output.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Flat => "flat",
            Algorithm::Pairwise => "pairwise",
            Algorithm::Bruck => "bruck",
            Algorithm::Halo => "halo",
            Algorithm::Halo2d => "halo2d",
        }
    }

    /// Whether blocks of other ranks pass through this algorithm's ranks, so that an
    /// all-to-all-v needs the metadata pass to learn their sizes.
    pub fn forwards(self) -> bool {
        matches!(self, Algorithm::Bruck | Algorithm::Halo | Algorithm::Halo2d)
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Algorithm {
    type Err = CollectiveError;

    fn from_str(s: &str) -> Result<Self> {
        Algorithm::ALL
            .iter()
            .copied()
            .find(|a| a.name() == s)
            .ok_or_else(|| {
                CollectiveError::InvalidArgument(format!(
                    "unknown algorithm '{s}' (expected one of flat, pairwise, bruck, halo, halo2d)"
                ))
            })
    }
}

/// Knobs of the builders.
#[derive(Debug, Clone, PartialEq)]
pub struct AlgoOptions {
    /// Messages that cross an aggregation level are cut into chunks of about this
    /// many bytes (at most [`AlgoOptions::max_chunks`] of them), so redistribution of one
    /// chunk overlaps the transfer of the next. (HALO's uniform all-to-all cuts such a
    /// message instead into chunks of one or two blocks, each sent to a rank it holds a
    /// block for: `algo/halo.rs`.)
    pub chunk_bytes: usize,
    /// Most chunks one message is cut into (each chunk costs a message).
    pub max_chunks: usize,
    /// The levels HALO aggregates at, innermost first (default: the node level, or
    /// none when the topology has no node level, which makes HALO the flat fan-out).
    /// Adding outer levels (switch, group) sends one message per remote switch or
    /// group instead of per remote node, at the cost of one more hop.
    pub halo_levels: Option<Vec<Level>>,
    /// HALO's intra-node phase forwards blocks of at least this many bytes over peers
    /// itself, on the paths of [`NodeLinks::balanced_routes`](halo_topology::NodeLinks::balanced_routes),
    /// when the topology has a link matrix and those paths load the node's busiest
    /// link less than the fabric's own routes (a Frontier node: 3 transfers per link
    /// against 4). Uniform all-to-all only; `usize::MAX`: never. The default is where
    /// it starts to pay on frontier:1 (docs/SIMULATION.md, table 9).
    pub node_relay_bytes: usize,
}

impl Default for AlgoOptions {
    fn default() -> Self {
        AlgoOptions {
            chunk_bytes: 128 << 10,
            max_chunks: 8,
            halo_levels: None,
            node_relay_bytes: DEFAULT_NODE_RELAY_BYTES,
        }
    }
}

/// [`AlgoOptions::node_relay_bytes`]'s default.
pub const DEFAULT_NODE_RELAY_BYTES: usize = 128 << 10;

/// Most chunks a message can be cut into: 12 bits of the tag.
pub(crate) const MAX_CHUNKS: usize = 1 << 12;

impl AlgoOptions {
    /// How a message of `len` bytes is cut: (number of chunks, bytes per chunk; the
    /// last may be shorter). Simulated on Frontier (docs/SIMULATION.md), 128 KiB chunks
    /// and at most 8 per message keep Phase III overlapped without paying too many
    /// per-message costs.
    pub fn chunks(&self, len: usize) -> (usize, usize) {
        let k = len
            .div_ceil(self.chunk_bytes.max(1))
            .clamp(1, self.max_chunks.clamp(1, MAX_CHUNKS));
        (k, len.div_ceil(k))
    }
}

impl AlgoOptions {
    /// The levels HALO aggregates at on `topology`, innermost first, checked.
    pub fn halo_levels(&self, topology: &Topology) -> Result<Vec<Level>> {
        match &self.halo_levels {
            None => Ok(if topology.has_level(Level::Node) {
                vec![Level::Node]
            } else {
                Vec::new()
            }),
            Some(levels) => {
                let mut out = levels.clone();
                out.sort();
                out.dedup();
                for l in &out {
                    if matches!(l, Level::Device | Level::System) {
                        return Err(CollectiveError::InvalidArgument(format!(
                            "HALO cannot aggregate at the {l} level (choose among package, node, switch, group)"
                        )));
                    }
                    if !topology.has_level(*l) {
                        return Err(CollectiveError::InvalidArgument(format!(
                            "HALO level {l} is not present in topology '{}'",
                            topology.name()
                        )));
                    }
                }
                Ok(out)
            }
        }
    }
}

/// Everything a builder needs to write one rank's program.
#[derive(Clone, Copy)]
pub struct BuildCtx<'a> {
    /// The machine.
    pub topology: &'a Topology,
    /// The rank whose program is built.
    pub rank: Rank,
    /// This rank's buffer layout.
    pub layout: Layout<'a>,
    /// Sizes of the blocks this rank handles.
    pub sizes: &'a dyn BlockSizes,
    /// Builder knobs.
    pub options: &'a AlgoOptions,
}

impl fmt::Debug for BuildCtx<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BuildCtx")
            .field("topology", &self.topology.name())
            .field("rank", &self.rank)
            .field("layout", &self.layout)
            .field("options", &self.options)
            .finish()
    }
}

impl BuildCtx<'_> {
    /// Number of ranks.
    pub fn size(&self) -> usize {
        self.topology.size()
    }
}

/// Builds `ctx.rank`'s program for an all-to-all(-v) with `algorithm`.
pub fn build(algorithm: Algorithm, ctx: &BuildCtx<'_>) -> Result<Schedule> {
    if ctx.rank >= ctx.size() {
        return Err(CollectiveError::InvalidArgument(format!(
            "rank {} out of range for {} ranks",
            ctx.rank,
            ctx.size()
        )));
    }
    let schedule = match algorithm {
        Algorithm::Flat => flat::build(ctx),
        Algorithm::Pairwise => pairwise::build(ctx),
        Algorithm::Bruck => bruck::build(ctx)?,
        Algorithm::Halo => halo::build(ctx)?,
        Algorithm::Halo2d => halo2d::build(ctx)?,
    };
    if let Some((s, d)) = ctx.sizes.unknown() {
        return Err(CollectiveError::Internal(format!(
            "{algorithm} on rank {} asked for the size of block {s}->{d}, which that rank cannot know",
            ctx.rank
        )));
    }
    Ok(schedule)
}

/// Tag of a direct block message in the flat and pairwise algorithms.
pub(crate) const TAG_DIRECT: u64 = 0;
