//! The verifier: symbolic execution of every rank's program.
//!
//! It proves, for one set of schedules (one per rank):
//! - every send meets exactly one receive with the same (source, destination, tag)
//!   and the same size, and tags, peers and regions are in range;
//! - the steps, joined by their matches, cannot deadlock: a send and its receive
//!   complete together (rendezvous, the strictest transport), and the graph of
//!   dependencies and matches has no cycle;
//! - every byte of every block from every source lands exactly once at its place in
//!   the destination's receive buffer, and nothing else is written there;
//! - no step reads scratch (or receive) bytes before they are written, and every
//!   read of such bytes depends on the step that wrote them (directly or through
//!   other steps of the same rank), so any execution order gives the same result;
//! - scratch and receive bytes are written at most once (no reuse, so no
//!   write-after-read hazards);
//! - the blocks a schedule lists as routed ([`crate::RoutedBlock`]) really sit there.
//!
//! A rooted collective's agreement messages ([`crate::ROOT_AGREEMENT_TAG`]) are
//! matched and ordered like any other, but move no content: they carry the call's
//! descriptor, not data, and the scratch byte one lands in stays unwritten, so a step
//! that read it would fail the data-flow checks.
//!
//! Content is tracked per byte range (interval maps, [`content`]), not per byte, so
//! large blocks cost no more than small ones.
//!
//! # Passes
//!
//! [`verify`] runs four passes in order; the first failure is the error returned.
//! 1. [`shape`]: as many schedules and layouts as the topology has ranks, each
//!    schedule for its own rank.
//! 2. [`matching`]: static checks of every step (dependencies point backwards; peers,
//!    tags and regions in range) and the matching of sends to receives, which gives
//!    the partner table the later passes use.
//! 3. [`replay`]: the symbolic replay (Kahn's algorithm, a matched pair released as
//!    one step). Deadlock freedom and the data-flow checks (read before write,
//!    dependencies on writers, single writes) are found in the same walk.
//! 4. [`placement`]: every block exactly once at its place in the receive buffers,
//!    and routed blocks where the schedule says.
//!
//! For the device path, [`verify_waves`] proves the grouping of verified schedules
//! into NCCL-style waves ([`crate::group_waves`]) sound.

mod content;
mod matching;
mod moe;
mod placement;
mod replay;
mod shape;
mod waves;

pub use moe::{MoeVerifyReport, verify_moe};
pub use waves::{WaveReport, verify_waves};

use crate::error::VerifyError;
use crate::layout::{BlockSizes, Layout, UniformSizes};
use crate::schedule::{Buf, Region, Schedule, StepId};
use halo_topology::Topology;

/// The buffer layouts of every rank: where each block sits before and after.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expectation {
    n: usize,
    /// Per rank, per peer: (offset, len) in the send buffer.
    send: Vec<Vec<(usize, usize)>>,
    /// Per rank, per peer: (offset, len) in the receive buffer.
    recv: Vec<Vec<(usize, usize)>>,
    /// All-gather: a source's one block is meant for every rank (see [`Expectation::all_gather`]).
    any_dst: bool,
}

impl Expectation {
    /// Uniform all-to-all: `block` bytes per pair, block q at q * block.
    pub fn uniform(n: usize, block: usize) -> Self {
        let row: Vec<(usize, usize)> = (0..n).map(|q| (q * block, block)).collect();
        Expectation {
            n,
            send: vec![row.clone(); n],
            recv: vec![row; n],
            any_dst: false,
        }
    }

    /// All-to-all-v with packed buffers: displacements are prefix sums of the counts in rank order.
    pub fn packed(n: usize, sizes: &dyn BlockSizes) -> Self {
        let mut send = Vec::with_capacity(n);
        let mut recv = Vec::with_capacity(n);
        for r in 0..n {
            let (mut so, mut ro) = (0, 0);
            let mut srow = Vec::with_capacity(n);
            let mut rrow = Vec::with_capacity(n);
            for q in 0..n {
                let s = sizes.bytes(r, q);
                srow.push((so, s));
                so += s;
                let v = sizes.bytes(q, r);
                rrow.push((ro, v));
                ro += v;
            }
            send.push(srow);
            recv.push(rrow);
        }
        Expectation {
            n,
            send,
            recv,
            any_dst: false,
        }
    }

    /// From every rank's layout.
    pub fn from_layouts(layouts: &[Layout<'_>]) -> Self {
        let n = layouts.len();
        let region = |r: Region| (r.offset, r.len);
        Expectation {
            n,
            send: layouts
                .iter()
                .map(|l| (0..n).map(|q| region(l.send_region(q))).collect())
                .collect(),
            recv: layouts
                .iter()
                .map(|l| (0..n).map(|q| region(l.recv_region(q))).collect())
                .collect(),
            any_dst: false,
        }
    }

    /// All-gather: each rank's send buffer is one block of `block` bytes, and every
    /// rank receives the block of rank `q` at `q * block`. The same bytes are meant for
    /// every destination, so a piece of rank `q`'s block may land at any rank.
    pub fn all_gather(n: usize, block: usize) -> Self {
        let send = (0..n)
            .map(|r| {
                (0..n)
                    .map(|q| if q == r { (0, block) } else { (0, 0) })
                    .collect()
            })
            .collect();
        let row: Vec<(usize, usize)> = (0..n).map(|q| (q * block, block)).collect();
        Expectation {
            n,
            send,
            recv: vec![row; n],
            any_dst: true,
        }
    }

    /// Broadcast from `root`: the root's send buffer is one block of `len` bytes, and
    /// every other rank receives it at 0 of its receive buffer; the root has no
    /// receive buffer. The same bytes are meant for every rank.
    pub fn broadcast(n: usize, root: usize, len: usize) -> Self {
        let cell = |yes: bool| if yes { (0, len) } else { (0, 0) };
        Expectation {
            n,
            send: (0..n)
                .map(|r| (0..n).map(|q| cell(r == root && q == root)).collect())
                .collect(),
            recv: (0..n)
                .map(|r| (0..n).map(|q| cell(r != root && q == root)).collect())
                .collect(),
            any_dst: true,
        }
    }

    /// Gather to `root`: every rank's send buffer is its block of `block` bytes for
    /// the root, which receives the block of rank `q` at `q * block`; the other ranks
    /// have no receive buffer.
    pub fn gather(n: usize, root: usize, block: usize) -> Self {
        Expectation {
            n,
            send: (0..n)
                .map(|_| {
                    (0..n)
                        .map(|q| if q == root { (0, block) } else { (0, 0) })
                        .collect()
                })
                .collect(),
            recv: (0..n)
                .map(|r| {
                    (0..n)
                        .map(|q| {
                            if r == root {
                                (q * block, block)
                            } else {
                                (0, 0)
                            }
                        })
                        .collect()
                })
                .collect(),
            any_dst: false,
        }
    }

    /// Scatter from `root`: block `q` of the root's send buffer (at `q * block`) goes
    /// to rank `q`, which receives it at 0; the other ranks have no send buffer.
    pub fn scatter(n: usize, root: usize, block: usize) -> Self {
        Expectation {
            n,
            send: (0..n)
                .map(|r| {
                    (0..n)
                        .map(|q| {
                            if r == root {
                                (q * block, block)
                            } else {
                                (0, 0)
                            }
                        })
                        .collect()
                })
                .collect(),
            recv: (0..n)
                .map(|_| {
                    (0..n)
                        .map(|q| if q == root { (0, block) } else { (0, 0) })
                        .collect()
                })
                .collect(),
            any_dst: false,
        }
    }

    fn buf_len(&self, rank: usize, buf: Buf, scratch: usize) -> usize {
        let end = |v: &Vec<(usize, usize)>| v.iter().map(|(o, l)| o + l).max().unwrap_or(0);
        match buf {
            Buf::Send => end(&self.send[rank]),
            Buf::Recv => end(&self.recv[rank]),
            Buf::Scratch => scratch,
        }
    }
}

/// What a verified set of schedules does, in total.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VerifyReport {
    /// Messages (matched send/receive pairs) that carry data.
    pub messages: usize,
    /// Bytes carried by those messages.
    pub message_bytes: u64,
    /// A rooted collective's 1-byte agreement messages ([`crate::ROOT_AGREEMENT_TAG`]),
    /// counted apart from the data.
    pub agreement_messages: usize,
    /// Local copies.
    pub copies: usize,
    /// Bytes copied.
    pub copy_bytes: u64,
}

fn err(
    rank: usize,
    step: Option<StepId>,
    block: Option<(usize, usize)>,
    message: impl Into<String>,
) -> VerifyError {
    VerifyError {
        rank,
        step,
        block,
        message: message.into(),
    }
}

/// Verifies an all-to-all(-v) with packed buffers (displacements are prefix sums of
/// the counts; uniform blocks when `sizes` is uniform).
pub fn verify_all_to_all(
    schedules: &[Schedule],
    topology: &Topology,
    sizes: &dyn BlockSizes,
) -> Result<VerifyReport, VerifyError> {
    let expect = Expectation::packed(topology.size(), sizes);
    verify(schedules, topology, &expect, sizes)
}

/// Verifies an all-gather of `block` bytes per rank ([`Expectation::all_gather`]).
pub fn verify_all_gather(
    schedules: &[Schedule],
    topology: &Topology,
    block: usize,
) -> Result<VerifyReport, VerifyError> {
    let expect = Expectation::all_gather(topology.size(), block);
    verify(schedules, topology, &expect, &UniformSizes(block))
}

/// Verifies a broadcast of `len` bytes from `root` ([`Expectation::broadcast`]).
pub fn verify_broadcast(
    schedules: &[Schedule],
    topology: &Topology,
    root: usize,
    len: usize,
) -> Result<VerifyReport, VerifyError> {
    let expect = Expectation::broadcast(topology.size(), root, len);
    verify(schedules, topology, &expect, &UniformSizes(len))
}

/// Verifies a gather of `block` bytes per rank to `root` ([`Expectation::gather`]).
pub fn verify_gather(
    schedules: &[Schedule],
    topology: &Topology,
    root: usize,
    block: usize,
) -> Result<VerifyReport, VerifyError> {
    let expect = Expectation::gather(topology.size(), root, block);
    verify(schedules, topology, &expect, &UniformSizes(block))
}

/// Verifies a scatter of `block` bytes per rank from `root` ([`Expectation::scatter`]).
pub fn verify_scatter(
    schedules: &[Schedule],
    topology: &Topology,
    root: usize,
    block: usize,
) -> Result<VerifyReport, VerifyError> {
    let expect = Expectation::scatter(topology.size(), root, block);
    verify(schedules, topology, &expect, &UniformSizes(block))
}

/// Verifies one schedule per rank against the expected layouts (see the module docs
/// for what is proven). `sizes` gives the block sizes, used to check routed blocks.
pub fn verify(
    schedules: &[Schedule],
    topology: &Topology,
    expect: &Expectation,
    sizes: &dyn BlockSizes,
) -> Result<VerifyReport, VerifyError> {
    shape::check(schedules, topology, expect)?;
    let partners = matching::check_and_match(schedules, topology.size(), expect)?;
    let (states, report) = replay::replay(schedules, expect, &partners)?;
    placement::check(&states, expect, sizes)?;
    Ok(report)
}
