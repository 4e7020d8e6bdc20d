//! Step time and MFU of one layout: compute from the hardware profile, the expert
//! all-to-all from HALO's simulator on the machine's own topology restricted to one
//! expert-parallel group, the pipeline's point-to-point transfers and bubble, and the
//! gradient all-reduce.
//!
//! # Placement
//! GPU `((q·PP + p)·EP + j)` is expert-parallel rank `j` of pipeline stage `p` in
//! data-parallel replica `q`: an expert-parallel group is `EP` consecutive ranks (inside
//! a node or a switch when EP allows), consecutive stages are neighbouring groups.
//!
//! # The step (1F1B, nothing overlapped)
//! Per micro-batch of `b/(DP·M)` sequences, a GPU of a stage with `l` layers spends
//! - compute: per layer, the forward FLOPs of its `1/EP` share of the micro-batch's
//!   tokens (projections and router at the GEMM rate for that many tokens, attention
//!   at the attention rate for the sequence length, its experts at the GEMM rate for
//!   the tokens *one expert* receives, `b·s·k/E`), times 3 (forward and backward),
//!   4 with checkpointing;
//! - all-to-all: per layer, 4 all-to-alls of `2·(b/M)·s·k·d/EP` bytes per GPU,
//!   simulated on the group's own part of the topology (the faster of HALO and the flat
//!   fan-out, as automatic selection would pick);
//! - point-to-point: the micro-batch's activations forward and their gradient backward,
//!   `2·(b/M)·s·d/EP` bytes each from every GPU to its counterpart in the next stage,
//!   latency plus bytes over the slower of the link and the GPU's NIC share.
//!
//! The slowest stage sets the slot; the step is `(M + PP - 1)` slots plus the gradient
//! all-reduce (attention, router and shared experts over the stage's `EP·DP` GPUs,
//! experts over `DP`; ring, alpha-beta on the group's slowest link). MFU = model FLOPs
//! / (step time · GPUs · peak).

use crate::error::{PiperError, Result};
use crate::model::ModelConfig;
use crate::profile::HardwareProfile;
use crate::resource::{self, MemoryOptions, StageShape};
use halo_collectives::{Algorithm, SimOptions, Traffic, simulate_all_to_all};
use halo_topology::{Level, Topology, TopologySpec};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};

/// The largest batch (sequences) or sequence length accepted (2^30).
pub const MAX_WORKLOAD: u64 = 1 << 30;

/// A parallel layout: pipeline stages, expert-parallel degree, data-parallel replicas
/// and micro-batches per step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Layout {
    /// PP.
    pub pp: u64,
    /// EP.
    pub ep: u64,
    /// DP.
    pub dp: u64,
    /// M.
    pub microbatches: u64,
}

impl Layout {
    /// GPUs the layout uses: `PP·EP·DP`.
    pub fn gpus(&self) -> u64 {
        self.pp * self.ep * self.dp
    }

    /// The degrees the memory equations need.
    pub fn shape(&self) -> StageShape {
        StageShape {
            pp: self.pp,
            ep: self.ep,
            microbatches: self.microbatches,
        }
    }

    /// The GPU of expert-parallel rank `j` of stage `p` in replica `q`.
    pub fn rank(&self, q: u64, p: u64, j: u64) -> usize {
        ((q * self.pp + p) * self.ep + j) as usize
    }
}

/// What is trained: global batch in sequences, sequence length, memory options.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Workload {
    /// b: sequences per step, over all data-parallel replicas.
    pub batch: u64,
    /// s: tokens per sequence.
    pub seq: u64,
    /// FlashAttention and checkpointing.
    pub options: MemoryOptions,
}

impl Workload {
    /// Checks `batch` and `seq`.
    ///
    /// # Errors
    /// [`PiperError::Invalid`] naming `batch` or `seq`.
    pub fn validate(&self) -> Result<()> {
        for (field, v) in [("batch", self.batch), ("seq", self.seq)] {
            if v == 0 || v > MAX_WORKLOAD {
                return Err(PiperError::invalid(
                    "workload",
                    field,
                    format!("must be a positive integer up to {MAX_WORKLOAD}, got {v}"),
                ));
            }
        }
        Ok(())
    }
}

/// The machine's figures the planner's constraints use, read from a [`Topology`].
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Machine {
    /// GPUs (ranks).
    pub gpus: u64,
    /// g: GPUs per node (1 when the topology has no node level).
    pub gpus_per_node: u64,
    /// N_h: nodes in the fast single-hop domain (the switch level; 1 without one).
    pub nodes_per_fast_domain: u64,
    /// g·N_h: GPUs in the largest fast domain; an expert-parallel group must fit in one.
    pub fast_domain_gpus: u64,
    /// B_NIC: network bandwidth per GPU, bytes per second (a NIC's bandwidth over the
    /// GPUs it serves; the system link's without NICs).
    pub nic_bandwidth_per_gpu: f64,
}

impl Machine {
    /// Reads the figures from a topology.
    pub fn of(topology: &Topology) -> Machine {
        let gpus = topology.size() as u64;
        let gpus_per_node = if topology.has_level(Level::Node) {
            topology.max_domain_size(Level::Node) as u64
        } else {
            1
        };
        let fast_domain_gpus = if topology.has_level(Level::Switch) {
            topology.max_domain_size(Level::Switch) as u64
        } else {
            gpus_per_node
        };
        Machine {
            gpus,
            gpus_per_node,
            nodes_per_fast_domain: fast_domain_gpus.div_ceil(gpus_per_node),
            fast_domain_gpus,
            nic_bandwidth_per_gpu: nic_share(topology, 0),
        }
    }
}

/// Network bandwidth of one GPU: its NIC's bandwidth shared by the GPUs it serves.
fn nic_share(topology: &Topology, rank: usize) -> f64 {
    match topology.nic_of(rank) {
        Some(nic) => nic.bandwidth / nic.ranks.len().max(1) as f64,
        None => topology.link(Level::System).sustained_bandwidth(),
    }
}

/// Bandwidth and latency between two GPUs for bulk transfers: the link class where they
/// meet, and when that is outside the node, no more than either GPU's NIC share.
fn pair_link(topology: &Topology, a: usize, b: usize) -> (f64, f64) {
    let level = topology.meet(a, b);
    let link = topology.link(level);
    let inside_node = level == Level::Device
        || (topology.has_level(Level::Node) && level <= Level::Node)
        || (level == Level::Package);
    let bw = if inside_node {
        link.bandwidth
    } else {
        link.sustained_bandwidth()
            .min(nic_share(topology, a))
            .min(nic_share(topology, b))
    };
    (bw, link.latency)
}

/// Ring all-reduce of `bytes` over `ranks`: `2(n-1)/n·bytes/B + 2(n-1)·latency` on the
/// group's slowest link.
fn allreduce_seconds(topology: &Topology, ranks: &[usize], bytes: f64) -> f64 {
    let n = ranks.len();
    if n <= 1 || bytes <= 0.0 {
        return 0.0;
    }
    let far = ranks
        .iter()
        .copied()
        .max_by_key(|&r| topology.meet(ranks[0], r))
        .unwrap_or(ranks[0]);
    let (bw, lat) = pair_link(topology, ranks[0], far);
    let n = n as f64;
    2.0 * (n - 1.0) / n * bytes / bw + 2.0 * (n - 1.0) * lat
}

/// The predicted step of one layout, its parts in seconds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Prediction {
    /// Step time.
    pub step_seconds: f64,
    /// Compute of the slowest stage, all micro-batches.
    pub compute_seconds: f64,
    /// Expert all-to-alls of the slowest stage, all micro-batches (simulated).
    pub a2a_seconds: f64,
    /// The paper's lower bound for the same all-to-alls (`2·4bskd/(EP·B_NIC)` per layer
    /// and micro-batch); below the simulated time when the group crosses nodes, and
    /// not a bound at all when the group stays inside a node (no NIC involved).
    pub a2a_lower_bound_seconds: f64,
    /// Which algorithm the simulation found faster for one all-to-all.
    pub a2a_algorithm: String,
    /// One all-to-all of one layer and micro-batch (simulated).
    pub a2a_one_seconds: f64,
    /// Point-to-point activations and gradients of the slowest stage.
    pub p2p_seconds: f64,
    /// The 1F1B bubble: `(PP - 1)` slots.
    pub bubble_seconds: f64,
    /// Gradient all-reduce across replicas and the expert-parallel group.
    pub allreduce_seconds: f64,
    /// Model FLOPs of one step.
    pub model_flops: f64,
    /// Achieved TFLOPS per GPU.
    pub tflops_per_gpu: f64,
    /// Model FLOPs utilisation: model FLOPs / (step · GPUs · peak).
    pub mfu: f64,
}

#[derive(Debug, Clone, Copy)]
struct A2a {
    seconds: f64,
    algorithm: Algorithm,
}

/// Predicts step times on one topology, caching the simulated all-to-alls by group
/// shape and message size.
#[derive(Debug)]
pub struct Predictor<'t> {
    topology: &'t Topology,
    spec: TopologySpec,
    profile: HardwareProfile,
    options: SimOptions,
    rank_nic: Vec<Option<usize>>,
    groups: HashMap<String, Topology>,
    shapes: HashMap<u64, Vec<String>>,
    cache: BTreeMap<(String, usize), A2a>,
    /// Simulations run (cache misses), for tests and logs.
    pub simulations: usize,
}

impl<'t> Predictor<'t> {
    /// A predictor for `topology` and `profile`.
    ///
    /// # Errors
    /// [`PiperError::Invalid`] when the profile is invalid.
    pub fn new(topology: &'t Topology, profile: HardwareProfile) -> Result<Self> {
        profile.validate()?;
        let spec = topology.to_spec();
        let mut rank_nic = vec![None; topology.size()];
        for (i, nic) in spec.nics.iter().enumerate() {
            for &r in &nic.ranks {
                if let Some(slot) = usize::try_from(r).ok().and_then(|r| rank_nic.get_mut(r)) {
                    *slot = Some(i);
                }
            }
        }
        Ok(Predictor {
            topology,
            spec,
            rank_nic,
            shapes: HashMap::new(),
            profile,
            options: SimOptions::default(),
            groups: HashMap::new(),
            cache: BTreeMap::new(),
            simulations: 0,
        })
    }

    /// The profile in use.
    pub fn profile(&self) -> &HardwareProfile {
        &self.profile
    }

    /// The topology restricted to `members` (new rank `i` = `members[i]`), with domain
    /// labels renumbered from 0 in order of appearance and NICs renamed, so that two
    /// groups of the same shape give the same spec (the cache key).
    fn group_spec(&self, members: &[usize]) -> TopologySpec {
        let mut new_rank = HashMap::new();
        let mut relabel: BTreeMap<String, HashMap<i64, i64>> = BTreeMap::new();
        let mut ranks = Vec::with_capacity(members.len());
        let mut nic_ids: Vec<usize> = Vec::new();
        for (i, &m) in members.iter().enumerate() {
            new_rank.insert(m as i64, i as i64);
            let mut r = self.spec.ranks[m].clone();
            r.rank = i as i64;
            r.host = None;
            for (level, label) in r.domains.iter_mut() {
                let map = relabel.entry(level.clone()).or_default();
                let next = map.len() as i64;
                *label = *map.entry(*label).or_insert(next);
            }
            ranks.push(r);
            if let Some(n) = self.rank_nic[m]
                && !nic_ids.contains(&n)
            {
                nic_ids.push(n);
            }
        }
        let nics = nic_ids
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                let mut nic = self.spec.nics[n].clone();
                nic.ranks = nic
                    .ranks
                    .iter()
                    .filter_map(|r| new_rank.get(r).copied())
                    .collect();
                nic.ranks.sort_unstable();
                nic.name = format!("nic{i}");
                nic
            })
            .collect();
        TopologySpec {
            name: String::new(),
            links: self.spec.links.clone(),
            ranks,
            nics,
            node_links: self.group_node_links(members),
        }
    }

    /// The link matrix of a group's nodes: the topology's, restricted to the positions
    /// the group's members hold in their nodes, when those are the same in every node
    /// of the group (groups of consecutive ranks aligned to the nodes); else none (the
    /// group's nodes are not alike, and the uniform levels stand for them). Pairs whose
    /// only paths ran over GPUs outside the group keep no route in the group: the
    /// simulator charges them on the ports alone.
    fn group_node_links(&self, members: &[usize]) -> Option<halo_topology::NodeLinksSpec> {
        let links = self.spec.node_links.as_ref()?;
        let t = self.topology;
        let mut positions: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for &m in members {
            positions
                .entry(t.domain(m, Level::Node))
                .or_default()
                .push(t.local_index(m, Level::Node));
        }
        let mut nodes = positions.values();
        let first = nodes.next()?;
        if nodes.any(|p| p != first) {
            tracing::debug!("EP group's nodes hold different GPUs: uniform node model");
            return None;
        }
        Some(halo_topology::NodeLinksSpec {
            link: links.link,
            matrix: first
                .iter()
                .map(|&i| first.iter().map(|&j| links.matrix[i][j]).collect())
                .collect(),
        })
    }

    /// The distinct shapes of the expert-parallel groups of degree `ep` (blocks of `ep`
    /// consecutive ranks), built once each.
    fn group_shapes(&mut self, ep: u64) -> Result<Vec<String>> {
        if let Some(keys) = self.shapes.get(&ep) {
            return Ok(keys.clone());
        }
        let n = self.topology.size();
        let ep_us = ep as usize;
        let mut keys: Vec<String> = Vec::new();
        for start in (0..n).step_by(ep_us) {
            let members: Vec<usize> = (start..(start + ep_us).min(n)).collect();
            let mut spec = self.group_spec(&members);
            let key = serde_json::to_string(&spec).expect("a spec serialises");
            if !self.groups.contains_key(&key) {
                spec.name = format!("{} EP group of {ep}", self.topology.name());
                self.groups.insert(key.clone(), spec.build()?);
            }
            if !keys.contains(&key) {
                keys.push(key);
            }
        }
        self.shapes.insert(ep, keys.clone());
        Ok(keys)
    }

    /// Time of one uniform all-to-all of `bytes_per_peer` in a group of shape `key`:
    /// simulated with HALO and with the flat fan-out, the faster kept; cached.
    fn a2a(&mut self, key: &str, bytes_per_peer: usize) -> Result<A2a> {
        if let Some(hit) = self.cache.get(&(key.to_string(), bytes_per_peer)) {
            return Ok(*hit);
        }
        let topo = &self.groups[key];
        let mut best: Option<A2a> = None;
        for algorithm in [Algorithm::Halo, Algorithm::Flat] {
            let r = simulate_all_to_all(
                topo,
                algorithm,
                Traffic::Uniform(bytes_per_peer),
                &self.options,
            )?;
            self.simulations += 1;
            if best.is_none_or(|b| r.time < b.seconds) {
                best = Some(A2a {
                    seconds: r.time,
                    algorithm,
                });
            }
        }
        let best = best.expect("two algorithms simulated");
        tracing::debug!(
            group = topo.size(),
            bytes_per_peer,
            seconds = best.seconds,
            algorithm = best.algorithm.name(),
            "EP all-to-all simulated"
        );
        self.cache.insert((key.to_string(), bytes_per_peer), best);
        Ok(best)
    }

    /// Predicts one step of `model` under `layout` and `workload` on this topology.
    ///
    /// # Errors
    /// [`PiperError::Invalid`] when the layout does not use exactly the topology's GPUs,
    /// EP does not divide E, PP exceeds L, or DP·M does not divide the batch; errors of
    /// the simulator.
    pub fn predict(
        &mut self,
        model: &ModelConfig,
        layout: Layout,
        workload: &Workload,
    ) -> Result<Prediction> {
        workload.validate()?;
        if layout.dp == 0 {
            return Err(PiperError::invalid(
                "layout",
                "dp",
                "must be a positive integer, got 0",
            ));
        }
        layout.shape().validate(model)?;
        let gpus = self.topology.size() as u64;
        if layout.gpus() != gpus {
            return Err(PiperError::invalid(
                "layout",
                "pp",
                format!(
                    "PP {} x EP {} x DP {} = {} GPUs, but the topology has {gpus}",
                    layout.pp,
                    layout.ep,
                    layout.dp,
                    layout.gpus()
                ),
            ));
        }
        if !workload
            .batch
            .is_multiple_of(layout.dp * layout.microbatches)
        {
            return Err(PiperError::invalid(
                "layout",
                "microbatches",
                format!(
                    "DP {} x M {} does not divide the batch of {} sequences",
                    layout.dp, layout.microbatches, workload.batch
                ),
            ));
        }
        let (d, f, m) = (
            model.hidden as f64,
            model.expert_ffn as f64,
            model.expert_matrices as f64,
        );
        let (k, e, ep) = (model.top_k as f64, model.experts as f64, layout.ep as f64);
        let s = workload.seq as f64;
        let mb = (workload.batch / layout.dp / layout.microbatches) as f64;
        let p = &self.profile;

        // Compute per layer and micro-batch on one GPU.
        let tokens = mb * s / ep;
        let gemm = p.gemm_tflops(tokens) * 1e12;
        let attention = p.attention_tflops(s) * 1e12;
        let expert_rate = p.gemm_tflops(mb * s * k / e) * 1e12;
        let dense =
            tokens * (8.0 * d * d + 2.0 * d * e + 2.0 * model.shared_experts as f64 * m * d * f);
        let core = tokens * 4.0 * s * d;
        let experts = mb * s * k / ep * 2.0 * m * d * f;
        let passes = if workload.options.checkpointing {
            4.0
        } else {
            3.0
        };
        let layer_compute = passes * (dense / gemm + core / attention + experts / expert_rate);
        let head = 3.0 * tokens * 2.0 * model.vocab.unwrap_or(0) as f64 * d / gemm;

        // One all-to-all of one layer and micro-batch: the slowest group shape.
        let bytes = resource::a2a_bytes_per_gpu(model, mb, s, layout.ep) / ep;
        let bytes_per_peer = bytes.round().max(1.0) as usize;
        let mut one = A2a {
            seconds: 0.0,
            algorithm: Algorithm::Halo,
        };
        for key in self.group_shapes(layout.ep)? {
            let t = self.a2a(&key, bytes_per_peer)?;
            if t.seconds > one.seconds {
                one = t;
            }
        }
        let a2a_layer = resource::A2A_PER_MOE_LAYER as f64 * one.seconds;

        // Point-to-point between consecutive stages, forward and backward.
        let p2p_bytes = resource::p2p_bytes(model, mb, s) / ep;
        let mut p2p = 0.0f64;
        for q in 0..layout.dp {
            for st in 0..layout.pp.saturating_sub(1) {
                for j in 0..layout.ep {
                    let (bw, lat) = pair_link(
                        self.topology,
                        layout.rank(q, st, j),
                        layout.rank(q, st + 1, j),
                    );
                    p2p = p2p.max(2.0 * (lat + p2p_bytes / bw));
                }
            }
        }

        // The slowest stage.
        let mut slot = 0.0f64;
        let mut parts = (0.0, 0.0, 0.0, 0u64);
        for st in 0..layout.pp {
            let layers = resource::stage_layers(model.layers, layout.pp, st);
            let c = layers as f64 * layer_compute + if st == layout.pp - 1 { head } else { 0.0 };
            let a = layers as f64 * a2a_layer;
            if c + a + p2p > slot {
                slot = c + a + p2p;
                parts = (c, a, p2p, layers);
            }
        }
        let mbs = layout.microbatches as f64;
        let bubble = (layout.pp - 1) as f64 * slot;

        // Gradient all-reduce, per stage.
        let mut allreduce = 0.0f64;
        for st in 0..layout.pp {
            let layers = resource::stage_layers(model.layers, layout.pp, st) as f64;
            let stage: Vec<usize> = (0..layout.dp)
                .flat_map(|q| (0..layout.ep).map(move |j| (q, j)))
                .map(|(q, j)| layout.rank(q, st, j))
                .collect();
            let replicated = 2.0 * layers * resource::replicated_params_per_layer(model) as f64;
            let replicas: Vec<usize> = (0..layout.dp).map(|q| layout.rank(q, st, 0)).collect();
            let expert = 2.0 * layers * e / ep * resource::expert_params(model) as f64;
            let t = allreduce_seconds(self.topology, &stage, replicated)
                + allreduce_seconds(self.topology, &replicas, expert);
            allreduce = allreduce.max(t);
        }

        let step = mbs * slot + bubble + allreduce;
        let model_flops = resource::step_flops(model, workload.batch as f64, s);
        let tflops_per_gpu = model_flops / (step * gpus as f64) / 1e12;
        let b_nic = Machine::of(self.topology).nic_bandwidth_per_gpu;
        Ok(Prediction {
            step_seconds: step,
            compute_seconds: mbs * parts.0,
            a2a_seconds: mbs * parts.1,
            a2a_lower_bound_seconds: mbs
                * parts.3 as f64
                * 2.0
                * resource::a2a_lower_bound_seconds(model, mb, s, layout.ep, b_nic),
            a2a_algorithm: one.algorithm.name().to_string(),
            a2a_one_seconds: one.seconds,
            p2p_seconds: mbs * parts.2,
            bubble_seconds: bubble,
            allreduce_seconds: allreduce,
            model_flops,
            tflops_per_gpu,
            mfu: tflops_per_gpu / self.profile.peak_tflops,
        })
    }
}
