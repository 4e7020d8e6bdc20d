//! Algorithm selection for the automatic mode: which algorithm a communicator uses for
//! an all-to-all of `b` bytes per pair when the caller did not force one
//! ([`crate::Communicator::set_algorithm`]).
//!
//! # How the choice is made
//!
//! Block sizes fall into *size classes* (powers of two: class 0 is 0 bytes, class `c`
//! holds `2^(c-1) ..= 2^c - 1` bytes); a class is represented by its smallest size
//! ([`representative`]). For a class, every algorithm of [`Algorithm::ALL`] is costed at
//! the representative size on the communicator's whole topology, and the cheapest that
//! builds is used:
//!
//! - **Simulated** ([`Method::Simulated`]) when the communicator has at most
//!   [`SIMULATE_MAX_RANKS`] ranks: each candidate's every-rank schedules are replayed by
//!   [`halo_collectives::simulate_all_to_all`] with default [`SimOptions`] (the NIC gap
//!   [`NIC_MESSAGE_GAP`]) and the communicator's [`AlgoOptions`]; its time is the
//!   simulated makespan. A candidate whose schedules do not build (for any rank) is
//!   unavailable.
//! - **Alpha-beta** ([`Method::AlphaBeta`]) above that, where simulating would make the
//!   first call take a second or more (docs/SIMULATION.md, "Automatic selection"): the
//!   closed-form model below, for rank 0 as the representative rank; candidates that do
//!   not build for rank 0 or the last rank ([`buildable`]) are unavailable.
//!
//! Ties go to the earlier algorithm of [`Algorithm::ALL`]. The outcome, a [`Ranking`],
//! depends on the topology's structure and link classes (not its name or host names),
//! the builder options and the size class only — never on the rank — and the simulator
//! is deterministic, so every rank of a communicator reaches the same choice without
//! communicating. Rankings are kept in a process-wide cache keyed by (topology
//! fingerprint, builder options, size class): sub-communicators of the same shape, new
//! communicators on the same topology and repeated runs reuse them ([`ranking`],
//! [`cached_ranking`]). Each communicator's policy (`src/policy.rs`) also keeps, per
//! size class, its ranking and the model's pick (its one cache of choices).
//!
//! # The alpha-beta formulas
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
//! - **flat** (all at once): `max( I, α_off + ...)` with the intra-node part
//!   `I = max_on(α_l + b/B_l)`, or, when the topology has a link matrix
//!   (`Topology::node_links`), `I = α_node + b λ / B_link`: `λ` the busiest link's load
//!   of an exchange inside rank 0's node over the fabric's routes
//!   (`NodeLinks::exchange_load`), `B_link` one link's bandwidth. In full:
//!   `max( max_on(α_l + b/B_l),
//!   α_off + max(nic(R m_off, b), b/B_off) )`.
//! - **pairwise** (one peer per round, the node's `R` ranks in step):
//!   `Σ_on m_l (α_l + b/B_l) + Σ_off m_l (α_l + max(nic(R, b), b/B_l))`.
//! - **bruck** (`⌈log2 N⌉` rounds; round `j` sends the `c_j ≈ N/2` blocks whose index has
//!   bit `j` set to rank `2^j` away, packed and unpacked):
//!   `2 N b / B_dev + Σ_j [ α_j + t_j(c_j b) + 2 c_j b / B_dev ]`, where `t_j(s) = s/B_j`
//!   inside the node and `max(nic(R, s), s/B_j)` outside.
//! - **halo** (node level): Phase I (the flat intra-node part) alongside
//!   pack + Phase II (`c` messages of `R b / c` to each other node) + Phase III
//!   (redistribution inside the node of the fraction `f` of blocks not already at
//!   their rank):
//!   `max( I, (H-1) R b / B_dev + α_off + max(nic(c R (H-1), R b / c), R b / (c B_off)) +
//!   [f > 0] (α_node + f (H-1) b / B_node) )` (with a link matrix the last term is
//!   `α_node + f (H-1) b λ / B_link`, as `I` is; also halo2d's gather below). As the builder cuts the packet
//!   (`AlgoOptions::chunks`): `c = 1`, `f = 1` (one message to the aligned rank) while
//!   it is one chunk; once it is cut, chunks of `p = min(⌈R / chunks⌉, 2)` blocks go to
//!   one of their blocks' ranks, `c = ⌈R / p⌉`, `f = (p - 1) / p`.
//! - **halo2d** (gather by local index, then exchange): `max( I, α_node + (H-1) b / B_node
//!   + 2 (H-1) R b / B_dev + α_off + max(nic(R (H-1), R b), R b / B_off) )`.
//!
//! With one node, or one rank per node, HALO and 2D are the flat fan-out and are
//! costed as such. Ties go to the earlier algorithm of [`Algorithm::ALL`].

use crate::error::Result;
use halo_collectives::{
    AlgoOptions, Algorithm, BuildCtx, Layout, META_BLOCK, SimOptions, Traffic, UniformSizes, build,
    simulate_all_to_all,
};
use halo_topology::{Level, LinkClass, Topology};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

pub use crate::transport::emulation::NIC_MESSAGE_GAP;

/// What the cost model needs of a topology, computed once.
#[derive(Debug, Clone)]
struct Shape {
    n: usize,
    h: usize,
    r: usize,
    /// Levels inside rank 0's node: link and number of peers there.
    on: Vec<(LinkClass, usize)>,
    /// With a link matrix: the node level's latency and the seconds per byte of a pair
    /// on the node's busiest link (`NodeLinks::exchange_load` / one link's bandwidth).
    links: Option<(f64, f64)>,
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
        let links = t.node_links().filter(|_| has_node).map(|m| {
            let load = m.exchange_load(t.domain_size(Level::Node, 0).min(m.size()));
            (t.link(Level::Node).latency, load / m.link().bandwidth)
        });
        Shape {
            n,
            h,
            r,
            on,
            links,
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

    /// An exchange inside the node of `s` bytes per pair: on the node level's link, or,
    /// with a link matrix, on the node's busiest link (as `phase_one`).
    fn inside(&self, node: LinkClass, s: f64) -> f64 {
        match self.links {
            Some((alpha, per_byte)) => alpha + s * per_byte,
            None => node.latency + s / node.bandwidth,
        }
    }

    fn phase_one(&self, b: f64) -> f64 {
        if let Some((alpha, per_byte)) = self.links {
            return alpha + b * per_byte;
        }
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

    /// How HALO's builder cuts a uniform Phase II packet of `R` blocks of `block` bytes
    /// (`collectives/src/algo/halo.rs`, `spread`): messages per remote node, and the
    /// fraction of the blocks they carry that Phase III forwards. One message (to the
    /// aligned peer, all but its own block forwarded) unless the packet is cut into
    /// chunks; then chunks of at most two blocks, each to one of its blocks' ranks.
    fn halo_cut(&self, block: usize, options: &AlgoOptions) -> (f64, f64) {
        let r = self.r;
        let (k, _) = options.chunks(r.saturating_mul(block));
        if k < 2 || block <= META_BLOCK {
            return (k as f64, 1.0);
        }
        let per = r
            .div_ceil(k)
            .min(2)
            .max(r.div_ceil(options.max_chunks.max(1)));
        (r.div_ceil(per) as f64, (per - 1) as f64 / per as f64)
    }

    /// HALO (`two_d` = false) or the 2D variant, or `None` where they are the flat fan-out.
    fn hierarchical(&self, block: usize, two_d: bool, options: &AlgoOptions) -> Option<f64> {
        let node = self.node?;
        if self.h <= 1 || self.r <= 1 || self.m_off == 0 {
            return None;
        }
        let b = block as f64;
        let (h, r) = ((self.h - 1) as f64, self.r as f64);
        let pack = h * r * b / self.b_dev;
        let (msgs, forwarded) = if two_d {
            (1.0, 1.0)
        } else {
            self.halo_cut(block, options)
        };
        let exchange = self.alpha_off
            + self
                .nic(r * h * msgs, r * b / msgs)
                .max(r * b / msgs / self.b_off);
        let local = if forwarded > 0.0 {
            self.inside(node, forwarded * h * b)
        } else {
            0.0
        };
        let remote = if two_d {
            local + 2.0 * pack + exchange
        } else {
            pack + exchange + local
        };
        Some(self.phase_one(b).max(remote))
    }

    fn estimate(&self, algorithm: Algorithm, block: usize, options: &AlgoOptions) -> f64 {
        let b = block as f64;
        if self.n <= 1 {
            return b / self.b_dev;
        }
        match algorithm {
            Algorithm::Flat => self.flat(b),
            Algorithm::Pairwise => self.pairwise(b),
            Algorithm::Bruck => self.bruck(b),
            Algorithm::Halo => self
                .hierarchical(block, false, options)
                .unwrap_or_else(|| self.flat(b)),
            Algorithm::Halo2d => self
                .hierarchical(block, true, options)
                .unwrap_or_else(|| self.flat(b)),
        }
    }
}

/// The estimated time, in seconds, of a uniform all-to-all of `block` bytes per pair
/// with `algorithm` on `topology`, with the default builder options (see the [module
/// documentation](self)).
pub fn estimate(topology: &Topology, algorithm: Algorithm, block: usize) -> f64 {
    Shape::new(topology).estimate(algorithm, block, &AlgoOptions::default())
}

/// Every algorithm with its estimated time with the default builder options, cheapest
/// first (ties in the order of [`Algorithm::ALL`]).
pub fn ranked(topology: &Topology, block: usize) -> Vec<(Algorithm, f64)> {
    rank_shape(&Shape::new(topology), block)
}

fn rank_shape(shape: &Shape, block: usize) -> Vec<(Algorithm, f64)> {
    let mut out: Vec<(Algorithm, f64)> = Algorithm::ALL
        .iter()
        .map(|&a| (a, shape.estimate(a, block, &AlgoOptions::default())))
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

/// Communicators of at most this many ranks choose by simulation; larger ones by the
/// alpha-beta model. The first choice of a size class costs about 2 ms at 16 ranks,
/// 15-20 ms at 64 and 55-220 ms at 128, but 1.3-5 s at 512 (release build, five
/// candidates on two busy cores; docs/SIMULATION.md, "Automatic selection"). Above it a
/// reduced topology (fewer nodes of the same shape) was tried and chose worse than the
/// alpha-beta model at tiny sizes, where Bruck's `log N` rounds win only at full scale.
pub const SIMULATE_MAX_RANKS: usize = 128;

/// How a [`Ranking`] was computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// By replaying every rank's schedule in the simulator.
    Simulated,
    /// By the closed-form alpha-beta model (see the [module documentation](self)).
    AlphaBeta,
}

/// The candidates of one size class on one topology, costed.
#[derive(Debug, Clone, PartialEq)]
pub struct Ranking {
    /// How the times were computed.
    pub method: Method,
    /// The bytes per pair the candidates were costed at (the class's representative).
    pub block: usize,
    /// The algorithms that build, with their estimated time in seconds, cheapest first
    /// (ties in the order of [`Algorithm::ALL`]).
    pub times: Vec<(Algorithm, f64)>,
    /// The algorithms that do not build on the topology, and why.
    pub unavailable: Vec<(Algorithm, String)>,
}

impl Ranking {
    /// The cheapest algorithm, if any builds.
    pub fn best(&self) -> Option<Algorithm> {
        self.times.first().map(|&(a, _)| a)
    }

    /// The algorithms that build, cheapest first.
    pub fn order(&self) -> impl Iterator<Item = Algorithm> + '_ {
        self.times.iter().map(|&(a, _)| a)
    }
}

/// Cheapest first; the sort is stable, so ties keep the order of [`Algorithm::ALL`].
fn cheapest_first(mut times: Vec<(Algorithm, f64)>) -> Vec<(Algorithm, f64)> {
    times.sort_by(|x, y| x.1.total_cmp(&y.1));
    times
}

/// The size class of a block: 0 for 0 bytes, otherwise 1 + floor(log2 bytes).
pub fn size_class(block: usize) -> u32 {
    usize::BITS - block.leading_zeros()
}

/// The size a class is costed at: its smallest size (0 for class 0, `2^(c-1)` for
/// class `c`), so that every block of the class maps to the same number.
pub fn representative(block: usize) -> usize {
    match size_class(block) {
        0 => 0,
        c => 1usize << (c - 1),
    }
}

/// Costs every algorithm of [`Algorithm::ALL`] by simulating a uniform all-to-all of
/// `block` bytes per pair on the whole of `topology` with `options` (the block as given,
/// not its class's representative), whatever the number of ranks; no cache.
///
/// The candidates are simulated on up to five threads. When none builds (or the
/// simulator rejects every one), the alpha-beta ranking is returned instead.
pub fn simulated_ranking(topology: &Topology, block: usize, options: &AlgoOptions) -> Ranking {
    let sim = SimOptions {
        algo: options.clone(),
        ..SimOptions::default()
    };
    let outcomes: Vec<halo_collectives::Result<f64>> = std::thread::scope(|s| {
        let handles: Vec<_> = Algorithm::ALL
            .iter()
            .map(|&a| {
                let sim = &sim;
                s.spawn(move || {
                    simulate_all_to_all(topology, a, Traffic::Uniform(block), sim).map(|r| r.time)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| match h.join() {
                Ok(r) => r,
                Err(panic) => std::panic::resume_unwind(panic),
            })
            .collect()
    });
    let mut times = Vec::new();
    let mut unavailable = Vec::new();
    for (&a, outcome) in Algorithm::ALL.iter().zip(outcomes) {
        match outcome {
            Ok(t) => times.push((a, t)),
            Err(e) => unavailable.push((a, e.to_string())),
        }
    }
    if times.is_empty() {
        return alpha_beta_ranking(topology, block, options);
    }
    Ranking {
        method: Method::Simulated,
        block,
        times: cheapest_first(times),
        unavailable,
    }
}

/// Costs every algorithm of [`Algorithm::ALL`] with the alpha-beta model for `block`
/// bytes per pair; those that do not build for rank 0 or the last rank are
/// unavailable. No cache.
pub fn alpha_beta_ranking(topology: &Topology, block: usize, options: &AlgoOptions) -> Ranking {
    let shape = Shape::new(topology);
    let mut times = Vec::new();
    let mut unavailable = Vec::new();
    for a in Algorithm::ALL {
        match buildable(topology, a, options) {
            Ok(()) => times.push((a, shape.estimate(a, block, options))),
            Err(e) => unavailable.push((a, e.to_string())),
        }
    }
    Ranking {
        method: Method::AlphaBeta,
        block,
        times: cheapest_first(times),
        unavailable,
    }
}

/// What a topology is for the simulator, as numbers: ranks, per level its link class
/// and every rank's domain, the NICs (bandwidth, latency, ranks) and the link matrix
/// inside the nodes. Names and host
/// names are left out, so equal shapes under different names share cache entries.
pub(crate) fn fingerprint(t: &Topology) -> Arc<[u64]> {
    let n = t.size();
    let mut v = vec![n as u64];
    for l in t.levels() {
        let link = t.link(l);
        v.extend([
            l as u64,
            link.bandwidth.to_bits(),
            link.latency.to_bits(),
            link.taper.to_bits(),
        ]);
        if !matches!(l, Level::Device | Level::System) {
            v.extend((0..n).map(|r| t.domain(r, l) as u64));
        }
    }
    v.push(u64::MAX);
    for nic in t.nics() {
        v.extend([
            nic.bandwidth.to_bits(),
            nic.latency.to_bits(),
            nic.ranks.len() as u64,
        ]);
        v.extend(nic.ranks.iter().map(|&r| r as u64));
    }
    // The link matrix inside the nodes: the simulator routes on it.
    if let Some(m) = t.node_links() {
        v.push(u64::MAX);
        v.extend([m.link().bandwidth.to_bits(), m.link().latency.to_bits()]);
        v.extend(m.matrix().iter().flatten().map(|&l| l as u64));
    }
    v.into()
}

/// A key of the process-wide cache.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    topology: Arc<[u64]>,
    /// The builder options, as their `Debug` text (every field, present and future).
    options: String,
    class: u32,
}

type Slot = Arc<OnceLock<Arc<Ranking>>>;

fn cache() -> &'static Mutex<HashMap<Key, Slot>> {
    static CACHE: OnceLock<Mutex<HashMap<Key, Slot>>> = OnceLock::new();
    CACHE.get_or_init(Mutex::default)
}

fn slot(key: Key) -> Slot {
    let mut map = cache().lock().unwrap_or_else(|e| e.into_inner());
    map.entry(key).or_default().clone()
}

/// The ranking for `block`'s size class on `topology` with `options`, by the policy of
/// the [module documentation](self) (simulated up to [`SIMULATE_MAX_RANKS`] ranks,
/// alpha-beta above), from the process-wide cache. The first caller for a key computes
/// it while later callers for the same key wait for it; the answer is then shared (the
/// same [`Arc`]) by every communicator and thread of the process.
pub fn ranking(topology: &Topology, block: usize, options: &AlgoOptions) -> Arc<Ranking> {
    ranking_with(fingerprint(topology), topology, block, options)
}

fn key(fingerprint: Arc<[u64]>, block: usize, options: &AlgoOptions) -> Key {
    Key {
        topology: fingerprint,
        options: format!("{options:?}"),
        class: size_class(block),
    }
}

/// [`ranking`] with the topology's fingerprint already computed (a communicator's
/// policy keeps it, `src/policy.rs`).
pub(crate) fn ranking_with(
    fingerprint: Arc<[u64]>,
    topology: &Topology,
    block: usize,
    options: &AlgoOptions,
) -> Arc<Ranking> {
    let slot = slot(key(fingerprint, block, options));
    slot.get_or_init(|| {
        let rep = representative(block);
        let started = std::time::Instant::now();
        let r = if topology.size() <= SIMULATE_MAX_RANKS {
            simulated_ranking(topology, rep, options)
        } else {
            alpha_beta_ranking(topology, rep, options)
        };
        tracing::debug!(
            topology = topology.name(),
            ranks = topology.size(),
            block = rep,
            method = ?r.method,
            best = ?r.best(),
            seconds = started.elapsed().as_secs_f64(),
            "ranked all-to-all algorithms"
        );
        Arc::new(r)
    })
    .clone()
}

/// The cached ranking for `block`'s size class, if some caller of [`ranking`] (or a
/// communicator in automatic mode) computed it already; never computes.
pub fn cached_ranking(
    topology: &Topology,
    block: usize,
    options: &AlgoOptions,
) -> Option<Arc<Ranking>> {
    let key = key(fingerprint(topology), block, options);
    let map = cache().lock().unwrap_or_else(|e| e.into_inner());
    map.get(&key).and_then(|s| s.get().cloned())
}

/// The algorithm the automatic mode picks for `block` bytes per pair: the best of
/// [`ranking`] (flat when nothing builds).
pub fn choose(topology: &Topology, block: usize, options: &AlgoOptions) -> Algorithm {
    ranking(topology, block, options)
        .best()
        .unwrap_or(Algorithm::Flat)
}
