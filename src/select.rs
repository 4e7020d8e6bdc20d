//! Algorithm selection: a simple alpha-beta cost per level, until the simulator
//! replaces it.
//!
//! Each algorithm's time for a uniform all-to-all of `b` bytes per pair is estimated
//! from the topology's link classes, for rank 0 as the representative rank; the
//! cheapest that builds is used. A caller's forced choice
//! ([`crate::Communicator::set_algorithm`]) overrides it.
//!
//! # The formulas
//!
//! Symbols: `N` ranks, `H` nodes, `R` ranks in the largest node (without a node level,
//! `H = N` and `R = 1`); for a level `l`, `α_l` its latency and `B_l` its bandwidth;
//! `on` the levels where rank 0 meets its peers inside its node, `off` those outside,
//! with `m_l` peers at level `l` and `m_off` peers outside the node in all; `α_off`
//! the largest latency and `B_off` the smallest bandwidth of the `off` levels;
//! `B_dev` the device level's (local copy) bandwidth. A node's traffic leaves through
//! `k` ports of bandwidth `B_nic` (its NICs, or one port at the outermost bandwidth
//! when the topology lists none), and every message costs the port `g`
//! ([`NIC_MESSAGE_GAP`]) besides its bytes, so `M` messages of `s` bytes leaving one
//! node take `nic(M, s) = (M / k) (g + s / B_nic)`. A message leaving the node takes at
//! least `α + s / B` of its level.
//!
//! - **flat** (all at once): `max( max_on(α_l + b/B_l),
//!   α_off + max(nic(R m_off, b), b/B_off) )`.
//! - **pairwise** (one peer per round, the node's `R` ranks in step):
//!   `Σ_on m_l (α_l + b/B_l) + Σ_off m_l (α_l + max(nic(R, b), b/B_l))`.
//! - **bruck** (`⌈log2 N⌉` rounds; round `j` sends the `c_j ≈ N/2` blocks whose index has
//!   bit `j` set to rank `2^j` away, packed and unpacked):
//!   `2 N b / B_dev + Σ_j [ α_j + t_j(c_j b) + 2 c_j b / B_dev ]`, where `t_j(s) = s/B_j`
//!   inside the node and `max(nic(R, s), s/B_j)` outside.
//! - **halo** (node level): Phase I (the flat intra-node part) alongside
//!   pack + Phase II (one message of `R b` to the aligned rank of each other node) +
//!   Phase III (redistribution inside the node):
//!   `max( I, (H-1) R b / B_dev + α_off + max(nic(R (H-1), R b), R b / B_off)
//!   + α_node + (H-1) b / B_node )`.
//! - **halo2d** (gather by local index, then exchange): `max( I, α_node + (H-1) b / B_node
//!   + 2 (H-1) R b / B_dev + α_off + max(nic(R (H-1), R b), R b / B_off) )`.
//!
//! With one node, or one rank per node, HALO and 2D are the flat fan-out and are
//! costed as such. Ties go to the earlier algorithm of [`Algorithm::ALL`].

use crate::error::Result;
use halo_collectives::{
    AlgoOptions, Algorithm, BuildCtx, CollectiveError, Layout, UniformSizes, build,
};
use halo_topology::{Level, LinkClass, Topology};
use std::collections::HashMap;

/// Seconds a NIC spends per message besides its bytes (LogGP's gap *g*): 0.2 us,
/// i.e. 5 million messages per second per NIC, a host-driven commodity NIC. Used by
/// the cost model and, by default, by the in-process transport's link emulation.
pub const NIC_MESSAGE_GAP: f64 = 0.2e-6;

/// What the cost model needs of a topology, computed once.
#[derive(Debug, Clone)]
struct Shape {
    n: usize,
    h: usize,
    r: usize,
    /// Levels inside rank 0's node: link and number of peers there.
    on: Vec<(LinkClass, usize)>,
    /// Levels outside rank 0's node.
    off: Vec<(LinkClass, usize)>,
    m_off: usize,
    alpha_off: f64,
    b_off: f64,
    node: Option<LinkClass>,
    ports: f64,
    b_nic: f64,
    b_dev: f64,
    /// Bruck round j: link to the partner and number of blocks sent.
    bruck: Vec<(LinkClass, bool, usize)>,
}

impl Shape {
    fn new(t: &Topology) -> Self {
        let n = t.size();
        let has_node = t.has_level(Level::Node);
        let (h, r) = if has_node {
            (t.num_domains(Level::Node), t.max_domain_size(Level::Node))
        } else {
            (n, 1)
        };
        let same_node = |a: usize, b: usize| {
            if has_node {
                t.domain(a, Level::Node) == t.domain(b, Level::Node)
            } else {
                a == b
            }
        };
        let mut per_level: HashMap<Level, (usize, bool)> = HashMap::new();
        for q in 1..n {
            let e = per_level
                .entry(t.meet(0, q))
                .or_insert((0, same_node(0, q)));
            e.0 += 1;
        }
        let mut on = Vec::new();
        let mut off = Vec::new();
        for l in t.levels() {
            if let Some(&(count, inside)) = per_level.get(&l) {
                if inside {
                    on.push((t.link(l), count));
                } else {
                    off.push((t.link(l), count));
                }
            }
        }
        let m_off = off.iter().map(|(_, c)| c).sum();
        let alpha_off = off.iter().map(|(l, _)| l.latency).fold(0.0, f64::max);
        let b_off = off
            .iter()
            .map(|(l, _)| l.bandwidth)
            .fold(f64::INFINITY, f64::min);
        let outer = t.link(Level::System).bandwidth;
        let (ports, b_nic) = if has_node {
            let nics: Vec<_> = t.node_nics(0).collect();
            if nics.is_empty() {
                (1.0, outer)
            } else {
                (
                    nics.len() as f64,
                    nics.iter().map(|x| x.bandwidth).sum::<f64>() / nics.len() as f64,
                )
            }
        } else {
            match t.nic_of(0) {
                Some(nic) => (1.0, nic.bandwidth),
                None => (1.0, outer),
            }
        };
        let mut bruck = Vec::new();
        let mut dist = 1usize;
        while dist < n {
            let blocks = (0..n).filter(|i| i & dist != 0).count();
            let peer = dist % n;
            bruck.push((t.link_between(0, peer), same_node(0, peer), blocks));
            dist <<= 1;
        }
        Shape {
            n,
            h,
            r,
            on,
            off,
            m_off,
            alpha_off,
            b_off,
            node: has_node.then(|| t.link(Level::Node)),
            ports,
            b_nic,
            b_dev: t.link(Level::Device).bandwidth,
            bruck,
        }
    }

    fn nic(&self, messages: f64, bytes: f64) -> f64 {
        messages / self.ports * (NIC_MESSAGE_GAP + bytes / self.b_nic)
    }

    fn phase_one(&self, b: f64) -> f64 {
        self.on
            .iter()
            .map(|(l, _)| l.latency + b / l.bandwidth)
            .fold(0.0, f64::max)
    }

    fn flat(&self, b: f64) -> f64 {
        let off = if self.m_off > 0 {
            self.alpha_off
                + self
                    .nic((self.r * self.m_off) as f64, b)
                    .max(b / self.b_off)
        } else {
            0.0
        };
        self.phase_one(b).max(off)
    }

    fn pairwise(&self, b: f64) -> f64 {
        let on: f64 = self
            .on
            .iter()
            .map(|(l, m)| *m as f64 * (l.latency + b / l.bandwidth))
            .sum();
        let off: f64 = self
            .off
            .iter()
            .map(|(l, m)| *m as f64 * (l.latency + self.nic(self.r as f64, b).max(b / l.bandwidth)))
            .sum();
        on + off
    }

    fn bruck(&self, b: f64) -> f64 {
        let mut t = 2.0 * self.n as f64 * b / self.b_dev;
        for &(l, inside, blocks) in &self.bruck {
            let s = blocks as f64 * b;
            let wire = if inside {
                s / l.bandwidth
            } else {
                self.nic(self.r as f64, s).max(s / l.bandwidth)
            };
            t += l.latency + wire + 2.0 * s / self.b_dev;
        }
        t
    }

    /// HALO (`two_d` = false) or the 2D variant, or `None` where they are the flat fan-out.
    fn hierarchical(&self, b: f64, two_d: bool) -> Option<f64> {
        let node = self.node?;
        if self.h <= 1 || self.r <= 1 || self.m_off == 0 {
            return None;
        }
        let (h, r) = ((self.h - 1) as f64, self.r as f64);
        let pack = h * r * b / self.b_dev;
        let exchange = self.alpha_off + self.nic(r * h, r * b).max(r * b / self.b_off);
        let local = node.latency + h * b / node.bandwidth;
        let remote = if two_d {
            local + 2.0 * pack + exchange
        } else {
            pack + exchange + local
        };
        Some(self.phase_one(b).max(remote))
    }

    fn estimate(&self, algorithm: Algorithm, b: usize) -> f64 {
        let b = b as f64;
        if self.n <= 1 {
            return b / self.b_dev;
        }
        match algorithm {
            Algorithm::Flat => self.flat(b),
            Algorithm::Pairwise => self.pairwise(b),
            Algorithm::Bruck => self.bruck(b),
            Algorithm::Halo => self.hierarchical(b, false).unwrap_or_else(|| self.flat(b)),
            Algorithm::Halo2d => self.hierarchical(b, true).unwrap_or_else(|| self.flat(b)),
        }
    }
}

/// The estimated time, in seconds, of a uniform all-to-all of `block` bytes per pair
/// with `algorithm` on `topology` (see the [module documentation](self)).
pub fn estimate(topology: &Topology, algorithm: Algorithm, block: usize) -> f64 {
    Shape::new(topology).estimate(algorithm, block)
}

/// Every algorithm with its estimated time, cheapest first (ties in the order of
/// [`Algorithm::ALL`]).
pub fn ranked(topology: &Topology, block: usize) -> Vec<(Algorithm, f64)> {
    rank_shape(&Shape::new(topology), block)
}

fn rank_shape(shape: &Shape, block: usize) -> Vec<(Algorithm, f64)> {
    let mut out: Vec<(Algorithm, f64)> = Algorithm::ALL
        .iter()
        .map(|&a| (a, shape.estimate(a, block)))
        .collect();
    out.sort_by(|x, y| x.1.total_cmp(&y.1));
    out
}

/// Whether `algorithm` builds on `topology` with `options`: rank 0's and the last
/// rank's programs for a uniform all-to-all of one byte per pair. Builders that are
/// not written yet fail here with [`crate::Error::InternalError`].
pub fn buildable(topology: &Topology, algorithm: Algorithm, options: &AlgoOptions) -> Result<()> {
    let sizes = UniformSizes(1);
    for rank in [0, topology.size().saturating_sub(1)] {
        let ctx = BuildCtx {
            topology,
            rank,
            layout: Layout::Uniform { block: 1 },
            sizes: &sizes,
            options,
        };
        build(algorithm, &ctx)?;
    }
    Ok(())
}

/// The cheapest algorithm that builds on `topology` for `block` bytes per pair
/// (flat when nothing else does).
pub fn choose(topology: &Topology, block: usize, options: &AlgoOptions) -> Algorithm {
    ranked(topology, block)
        .into_iter()
        .map(|(a, _)| a)
        .find(|&a| buildable(topology, a, options).is_ok())
        .unwrap_or(Algorithm::Flat)
}

/// A communicator's selection state: the topology's shape, the ranking per size class
/// and the algorithms found not to build.
#[derive(Debug, Default)]
pub(crate) struct Selector {
    shape: Option<Shape>,
    ranked: HashMap<u32, Vec<Algorithm>>,
    unavailable: Vec<Algorithm>,
}

/// The size class of a block: 0 for 0 bytes, otherwise 1 + floor(log2 bytes).
fn class(block: usize) -> u32 {
    usize::BITS - block.leading_zeros()
}

impl Selector {
    /// Algorithms to try for `block` bytes per pair, cheapest first, skipping those
    /// known not to build. The ranking is computed once per size class from the class's
    /// smallest size, so that every rank decides alike.
    pub(crate) fn candidates(&mut self, topology: &Topology, block: usize) -> Vec<Algorithm> {
        let c = class(block);
        let shape = self.shape.get_or_insert_with(|| Shape::new(topology));
        let list = self.ranked.entry(c).or_insert_with(|| {
            let rep = if c == 0 { 0 } else { 1usize << (c - 1) };
            rank_shape(shape, rep).into_iter().map(|(a, _)| a).collect()
        });
        list.iter()
            .copied()
            .filter(|a| !self.unavailable.contains(a))
            .collect()
    }

    /// Records that `algorithm` does not build (an internal error from its builder).
    pub(crate) fn mark_unavailable(&mut self, algorithm: Algorithm, why: &CollectiveError) {
        if !self.unavailable.contains(&algorithm) {
            tracing::info!(%algorithm, %why, "algorithm does not build; automatic selection skips it");
            self.unavailable.push(algorithm);
        }
    }

    /// Forgets what was learned (the builder options changed).
    pub(crate) fn reset(&mut self) {
        self.ranked.clear();
        self.unavailable.clear();
    }
}
