//! The simulator: deterministic discrete-event replay of every rank's schedule on a
//! topology's link model, to predict a collective's time at scales this machine
//! cannot run. docs/SIMULATION.md describes the model and its numbers.
//!
//! # The model
//!
//! - **Steps.** A step is posted once every step it depends on has completed. A
//!   `Send` and its `Recv` (same source, destination and tag) form a *message*, which
//!   starts when both are posted (rendezvous, the strictest protocol, the one the
//!   verifier proves schedules safe under). Both steps complete when the message is
//!   delivered. A `Copy` starts when posted.
//! - **Time of a message** of `s` bytes between ranks meeting at level `L`: its bytes
//!   occupy every resource on its path from the start, sharing each with the other
//!   flows there; it is delivered `latency(L)` after its last byte left the last
//!   resource. Alone on its path it takes `latency(L) + s / (slowest bandwidth)`. A
//!   copy occupies the rank's memory (the device level's bandwidth) for `len` bytes,
//!   plus the device level's latency.
//! - **Resources** (each direction separate):
//!   - inside a node (`L` = package or node): the sender's egress port and the
//!     receiver's ingress port of level `L`, at that level's bandwidth. When the
//!     topology has a link matrix ([`Topology::node_links`]: `frontier:N`, `mi300x:N`,
//!     a file's `[node_links]`), the levels inside the node share one port per rank
//!     and direction at the sum of the rank's links instead, and the transfer also
//!     crosses the links of its route ([`halo_topology::NodeLinks::route`]): the
//!     pair's own link (links x one link's bandwidth), or, for a pair without one, each
//!     link of the fewest-hop, widest path over its peers (only the level's latency is
//!     charged, once). `Topology::without_node_links` gives the uniform model back;
//!   - leaving a node: the sender's NIC (injection) and the receiver's NIC (ejection),
//!     at the NIC's bandwidth (a rank without a NIC uses one port per node with the sum
//!     of the node's NICs, or the bandwidth of the first level outside the node when
//!     it has none; a topology without a node level makes every rank its own node);
//!   - a tapered boundary (the link class of a level outside the node has
//!     `taper > 1`, e.g. Frontier's dragonfly global links at 1.75): every domain of
//!     the level just inside it has an uplink and a downlink of capacity (injection
//!     capacity of the domain's nodes) / taper, crossed by every message that leaves
//!     that domain. Untapered boundaries are not modelled: full bisection means they
//!     never limit more than the NICs do.
//! - **Per-message gap.** Every message costs each NIC (or node port) it crosses
//!   [`SimOptions::nic_gap`] seconds besides its bytes (LogGP's *g*: a NIC's message
//!   rate), and each intra-node port [`SimOptions::port_gap`]. This is what makes
//!   many small messages slower than a few large ones.
//! - **Order on an egress port.** [`Egress::Fair`] (default): a rank's messages to
//!   different peers share its egress port (package link, node link, NIC) fairly, and
//!   its messages to one peer leave in program order (an ordered channel per peer), so
//!   the chunks of one aggregated message pipeline. [`Egress::Fifo`]: one message at a
//!   time per port, in the order they became ready.
//! - **Sharing.** [`Sharing::ProcessorSharing`] (default): each resource is an
//!   independent processor-sharing server (equal shares of its capacity among the
//!   flows on it, tracked with a virtual clock, O(log n) per change); a flow is done
//!   once every resource on its path has served it. [`Sharing::MaxMin`]: exact max-min
//!   fair rates recomputed over all flows at every event, for small cases and to
//!   measure the approximation.
//!
//! Everything is deterministic: events at equal times are taken in a fixed order
//! (timers before departures, inner levels first, lower resource ids first) and no
//! hash map decides an order.
//!
//! ```
//! use halo_collectives::{simulate_all_to_all, Algorithm, SimOptions, Traffic};
//! use halo_topology::Topology;
//!
//! let topo = Topology::preset("frontier:4").unwrap();
//! let opts = SimOptions::default();
//! let flat = simulate_all_to_all(&topo, Algorithm::Flat, Traffic::Uniform(1024), &opts).unwrap();
//! let halo = simulate_all_to_all(&topo, Algorithm::Halo, Traffic::Uniform(1024), &opts).unwrap();
//! assert!(flat.time > 0.0 && halo.time > 0.0);
//! ```

mod events;
mod maxmin;
mod model;
mod processor_sharing;
mod program;

use crate::algo::{AlgoOptions, Algorithm, BuildCtx, build};
use crate::error::{CollectiveError, Result};
use crate::layout::{BlockSizes, Layout};
use crate::schedule::Schedule;
use halo_topology::{Level, Rank, Topology, fmt_seconds};
use std::fmt;
use std::fmt::Write as _;

/// Seconds a NIC spends per message besides its bytes, by default: 0.2 us (5 million
/// messages per second per NIC), the same figure as the `halo` crate's cost model
/// (`select::NIC_MESSAGE_GAP`) and its link emulation.
pub const DEFAULT_NIC_GAP: f64 = 0.2e-6;

/// How concurrent flows share a resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Sharing {
    /// Each resource an independent processor-sharing server: fast (a million flows in
    /// about a second), exact on every single bottleneck, approximate on which flow
    /// leaves a shared resource first.
    #[default]
    ProcessorSharing,
    /// Max-min fair rates recomputed over all flows at every event: exact, and
    /// O(flows) per event — for a few thousand messages at most.
    MaxMin,
}

/// In what order a rank's messages leave through one of its egress ports (its package
/// link, node link or NIC).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Egress {
    /// Messages to different peers share the port fairly; messages to the same peer
    /// leave in program order (an ordered channel per peer, as NCCL/RCCL connections
    /// and rendezvous pulls by each receiver behave).
    #[default]
    Fair,
    /// One message at a time per port, in the order they became ready (a NIC working
    /// through one command queue). Ranks that share a port (two GCDs on one NIC) still
    /// share it fairly.
    Fifo,
}

/// Knobs of a simulation.
#[derive(Debug, Clone, PartialEq)]
pub struct SimOptions {
    /// The builders' knobs, for [`simulate_all_to_all`].
    pub algo: AlgoOptions,
    /// The sharing model.
    pub sharing: Sharing,
    /// The order a rank's messages leave its egress ports.
    pub egress: Egress,
    /// Seconds per message on every NIC (or node port) it crosses, besides its bytes.
    pub nic_gap: f64,
    /// Seconds per message on every intra-node port it crosses, besides its bytes.
    pub port_gap: f64,
}

impl Default for SimOptions {
    fn default() -> Self {
        SimOptions {
            algo: AlgoOptions::default(),
            sharing: Sharing::default(),
            egress: Egress::default(),
            nic_gap: DEFAULT_NIC_GAP,
            port_gap: 0.0,
        }
    }
}

/// What the ranks exchange in [`simulate_all_to_all`].
#[derive(Clone, Copy)]
pub enum Traffic<'a> {
    /// All-to-all: this many bytes from every rank to every rank.
    Uniform(usize),
    /// All-to-all-v: `sizes.bytes(src, dst)` from `src` to `dst`, packed buffers. The
    /// oracle answers for every block (it is the whole machine's view; each rank's
    /// builder only asks about the blocks that rank handles), so it can be a generator
    /// such as [`MoeSizes`] instead of an `N x N` matrix.
    V(&'a dyn BlockSizes),
}

impl fmt::Debug for Traffic<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Traffic::Uniform(b) => f.debug_tuple("Uniform").field(b).finish(),
            Traffic::V(_) => f.write_str("V(..)"),
        }
    }
}

/// A kind of resource, for [`SimReport::loads`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ResourceClass {
    /// A rank's memory (copies, messages to itself).
    Memory,
    /// A rank's egress or ingress port at an intra-node level (package, node); with a
    /// link matrix ([`Topology::node_links`]) one port for both, at the sum of the
    /// rank's links.
    Link(Level),
    /// One direction of the direct links between two ranks of a node (the topology's
    /// link matrix, [`Topology::node_links`]).
    GpuLink,
    /// A NIC, injection or ejection.
    Nic,
    /// A node's shared port for ranks without a NIC of their own.
    NodePort,
    /// A domain's tapered uplink or downlink to the rest of the next level out
    /// (`Uplink(Group)`: a dragonfly group's global links).
    Uplink(Level),
}

impl fmt::Display for ResourceClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ResourceClass::Memory => f.write_str("memory"),
            ResourceClass::Link(l) => write!(f, "{l} link"),
            ResourceClass::GpuLink => f.write_str("gpu link"),
            ResourceClass::Nic => f.write_str("nic"),
            ResourceClass::NodePort => f.write_str("node port"),
            ResourceClass::Uplink(l) => write!(f, "{l} uplink"),
        }
    }
}

/// How busy the busiest resource of one class was.
#[derive(Debug, Clone, PartialEq)]
pub struct ResourceLoad {
    /// The class.
    pub class: ResourceClass,
    /// Resources of the class (both directions).
    pub resources: usize,
    /// Seconds of work (bytes and per-message gaps at its capacity) on the busiest
    /// resource of the class: a lower bound on the collective's time.
    pub busiest: f64,
}

/// Messages and bytes between ranks that meet at one level.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LevelTraffic {
    /// The level (`Device`: messages a rank sends itself).
    pub level: Level,
    /// Messages.
    pub messages: u64,
    /// Bytes.
    pub bytes: u64,
}

/// The outcome of a simulation. Equal inputs give equal reports.
#[derive(Debug, Clone, PartialEq)]
pub struct SimReport {
    /// The topology's name.
    pub topology: String,
    /// The algorithm that built the schedules (`mixed` when they differ).
    pub algorithm: String,
    /// Number of ranks.
    pub ranks: usize,
    /// Time of the collective: the latest completion over all ranks, seconds.
    pub time: f64,
    /// Per rank: when its last step completed (0 for an empty program).
    pub rank_time: Vec<f64>,
    /// Per present level, innermost first: messages between ranks that meet there.
    pub levels: Vec<LevelTraffic>,
    /// Copy steps.
    pub copies: u64,
    /// Bytes copied.
    pub copy_bytes: u64,
    /// Per resource class present, the busiest resource.
    pub loads: Vec<ResourceLoad>,
    /// Events processed (deliveries and departures).
    pub events: u64,
}

impl SimReport {
    /// Messages in all.
    pub fn messages(&self) -> u64 {
        self.levels.iter().map(|l| l.messages).sum()
    }

    /// Bytes carried by messages in all.
    pub fn bytes(&self) -> u64 {
        self.levels.iter().map(|l| l.bytes).sum()
    }

    /// Traffic between ranks that meet at `level` (zero when absent).
    pub fn level(&self, level: Level) -> LevelTraffic {
        self.levels
            .iter()
            .copied()
            .find(|l| l.level == level)
            .unwrap_or(LevelTraffic {
                level,
                messages: 0,
                bytes: 0,
            })
    }

    /// The busiest resource of a class, if the class is present.
    pub fn load(&self, class: ResourceClass) -> Option<&ResourceLoad> {
        self.loads.iter().find(|l| l.class == class)
    }

    /// A few lines for people: time, traffic per level, busiest resources.
    pub fn summary(&self) -> String {
        let mut out = String::new();
        let mean = self.rank_time.iter().sum::<f64>() / self.rank_time.len().max(1) as f64;
        let _ = writeln!(
            out,
            "{} on {} ({} ranks): {} (mean rank {}), {} events",
            self.algorithm,
            self.topology,
            self.ranks,
            fmt_seconds(self.time),
            fmt_seconds(mean),
            self.events
        );
        for l in self.levels.iter().filter(|l| l.messages > 0) {
            let _ = writeln!(
                out,
                "  {:<8} {:>12} messages {:>16} bytes",
                l.level.name(),
                l.messages,
                l.bytes
            );
        }
        let _ = writeln!(
            out,
            "  copies   {:>12}          {:>16} bytes",
            self.copies, self.copy_bytes
        );
        for l in &self.loads {
            let _ = writeln!(
                out,
                "  busiest {:<16} {} of work ({} resources)",
                l.class.to_string(),
                fmt_seconds(l.busiest),
                l.resources
            );
        }
        out
    }
}

/// How a sharing model moves bytes: flows join with their demand per resource, and
/// leave when every resource has served them.
pub(crate) trait Sharer {
    /// Operation `op` starts at `t` with `path` = (resource, demand > 0), not empty.
    fn add(&mut self, t: f64, op: u32, path: &[(u32, f64)]);
    /// Brings the next departure time up to date after adds and pops.
    fn flush(&mut self);
    /// Time of the next departure of a flow from a resource, if any.
    fn next(&self) -> Option<f64>;
    /// Processes the next departure at `t`; pushes the operations now done, and those
    /// that left their egress port (the first resource of their path).
    fn pop(&mut self, t: f64, done: &mut Vec<u32>, released: &mut Vec<u32>);
    /// Total demand per resource.
    fn loads(&self) -> &[f64];
}

fn check_options(options: &SimOptions) -> Result<()> {
    for (name, v) in [("nic_gap", options.nic_gap), ("port_gap", options.port_gap)] {
        if !(v.is_finite() && v >= 0.0) {
            return Err(CollectiveError::InvalidArgument(format!(
                "{name} must be a non-negative number of seconds, got {v}"
            )));
        }
    }
    Ok(())
}

fn run(topo: &Topology, mut prog: program::Program, options: &SimOptions) -> Result<SimReport> {
    let model = model::Model::new(topo, options);
    let ops = prog.msgs.len() + prog.copies.len();
    let remaining = std::mem::take(&mut prog.ndeps);
    let out = match options.sharing {
        Sharing::ProcessorSharing => {
            let ps = processor_sharing::ProcessorSharing::new(&model.cap, &model.gate, ops);
            events::run(&prog, remaining, &model, topo, ps, options.egress)?
        }
        Sharing::MaxMin => {
            let mm = maxmin::MaxMin::new(&model.cap);
            events::run(&prog, remaining, &model, topo, mm, options.egress)?
        }
    };
    let mut loads: Vec<ResourceLoad> = Vec::new();
    for (r, &class) in model.class.iter().enumerate() {
        let busy = out.loads[r] / model.cap[r];
        match loads.iter_mut().find(|l| l.class == class) {
            Some(l) => {
                l.resources += 1;
                l.busiest = l.busiest.max(busy);
            }
            None => loads.push(ResourceLoad {
                class,
                resources: 1,
                busiest: busy,
            }),
        }
    }
    loads.sort_by_key(|l| l.class);
    Ok(SimReport {
        topology: topo.name().to_string(),
        algorithm: prog.algorithm.to_string(),
        ranks: topo.size(),
        time: out.rank_time.iter().copied().fold(0.0, f64::max),
        levels: topo
            .levels()
            .map(|level| LevelTraffic {
                level,
                messages: out.level_messages[level as usize],
                bytes: out.level_bytes[level as usize],
            })
            .collect(),
        rank_time: out.rank_time,
        copies: out.copies,
        copy_bytes: out.copy_bytes,
        loads,
        events: out.events,
    })
}

/// Simulates one schedule per rank (`schedules[r]` for rank `r`) on `topology`.
///
/// # Errors
/// `InvalidArgument` when the schedules do not fit the topology; `InvalidUsage` when
/// a send has no matching receive (or the sizes differ) or the schedules deadlock.
pub fn simulate(
    topology: &Topology,
    schedules: &[Schedule],
    options: &SimOptions,
) -> Result<SimReport> {
    check_options(options)?;
    let mut b = program::ProgramBuilder::new(topology.size());
    for s in schedules {
        b.add(s)?;
    }
    let prog = b.finish()?;
    run(topology, prog, options)
}

/// Builds every rank's schedule for an all-to-all (or all-to-all-v) with `algorithm`
/// and simulates it. Schedules are compacted as they are built, so 8,192 ranks fit.
///
/// All-to-all-v is simulated as its data pass; the metadata pass that precedes it at
/// run time is a uniform all-to-all of [`crate::META_BLOCK`] bytes, which can be
/// simulated on its own.
///
/// # Errors
/// Whatever the builder returns (an algorithm that does not support the topology),
/// and the errors of [`simulate`].
pub fn simulate_all_to_all(
    topology: &Topology,
    algorithm: Algorithm,
    traffic: Traffic<'_>,
    options: &SimOptions,
) -> Result<SimReport> {
    check_options(options)?;
    let n = topology.size();
    let mut b = program::ProgramBuilder::new(n);
    let mut counts = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for rank in 0..n {
        let schedule = match traffic {
            Traffic::Uniform(block) => {
                let sizes = crate::layout::UniformSizes(block);
                let ctx = BuildCtx {
                    topology,
                    rank,
                    layout: Layout::Uniform { block },
                    sizes: &sizes,
                    options: &options.algo,
                };
                build(algorithm, &ctx)?
            }
            Traffic::V(sizes) => {
                let (send, sd, recv, rd) = &mut counts;
                fill_counts(n, |q| sizes.bytes(rank, q), send, sd)?;
                fill_counts(n, |q| sizes.bytes(q, rank), recv, rd)?;
                let ctx = BuildCtx {
                    topology,
                    rank,
                    layout: Layout::V {
                        send_counts: send,
                        send_displs: sd,
                        recv_counts: recv,
                        recv_displs: rd,
                    },
                    sizes,
                    options: &options.algo,
                };
                build(algorithm, &ctx)?
            }
        };
        b.add(&schedule)?;
    }
    let prog = b.finish()?;
    run(topology, prog, options)
}

/// Counts and packed displacements.
fn fill_counts(
    n: usize,
    count: impl Fn(Rank) -> usize,
    counts: &mut Vec<usize>,
    displs: &mut Vec<usize>,
) -> Result<()> {
    counts.clear();
    displs.clear();
    let mut at = 0usize;
    for q in 0..n {
        let c = count(q);
        displs.push(at);
        counts.push(c);
        at = at.checked_add(c).ok_or_else(|| {
            CollectiveError::InvalidArgument("a rank's buffer exceeds the address space".into())
        })?;
    }
    Ok(())
}

/// All-to-all-v sizes shaped like an MoE dispatch, computed per block (no `N x N`
/// matrix): `experts` experts placed round-robin on the ranks (expert `e` on rank
/// `e mod N`), with Zipf popularity `1 / k^skew` over a seeded shuffle of the experts
/// (so the hot ones are scattered); every rank routes `tokens` tokens to `topk`
/// experts each. The block from `src` to `dst` is the *expected* number of
/// token-choices landing on `dst`'s experts, times a per-pair jitter in [0.5, 1.5)
/// from a hash of (seed, src, dst), rounded, times `bytes_per_token`.
#[derive(Debug, Clone, PartialEq)]
pub struct MoeSizes {
    share: Vec<f64>,
    choices: f64,
    bytes_per_token: usize,
    seed: u64,
}

fn mix(mut x: u64) -> u64 {
    x ^= x >> 30;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

impl MoeSizes {
    /// Sizes for `ranks` ranks. `skew` 0 is uniform popularity; 1 is classic Zipf.
    ///
    /// # Panics
    /// If `ranks` or `experts` is 0.
    pub fn new(
        ranks: usize,
        experts: usize,
        topk: usize,
        skew: f64,
        tokens: usize,
        bytes_per_token: usize,
        seed: u64,
    ) -> Self {
        assert!(
            ranks > 0 && experts > 0,
            "ranks and experts must be positive"
        );
        let mut order: Vec<(u64, usize)> = (0..experts)
            .map(|e| (mix(seed ^ mix(e as u64 + 1)), e))
            .collect();
        order.sort_unstable();
        let mut pop = vec![0.0; experts];
        for (k, &(_, e)) in order.iter().enumerate() {
            pop[e] = 1.0 / ((k + 1) as f64).powf(skew);
        }
        let total: f64 = pop.iter().sum();
        let mut share = vec![0.0; ranks];
        for (e, p) in pop.iter().enumerate() {
            share[e % ranks] += p / total;
        }
        MoeSizes {
            share,
            choices: (tokens * topk.min(experts)) as f64,
            bytes_per_token,
            seed,
        }
    }
}

impl BlockSizes for MoeSizes {
    fn bytes(&self, src: Rank, dst: Rank) -> usize {
        let h = mix(self.seed ^ mix(((src as u64) << 32) ^ dst as u64 ^ 0x5151));
        let jitter = 0.5 + (h >> 11) as f64 / (1u64 << 53) as f64;
        (self.choices * self.share[dst] * jitter).round() as usize * self.bytes_per_token
    }
}
