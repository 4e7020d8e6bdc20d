//! The layout planner: every PP x EP x DP family of the machine's GPUs under Piper's
//! constraints, the micro-batch count of each, ranked by predicted MFU.
//!
//! Constraints, checked in this order (the first one a family breaks is its *binding*
//! constraint):
//! 1. `EP` divides `E` (every GPU of a group holds `E/EP` whole experts);
//! 2. `PP <= L` (a stage holds at least one layer);
//! 3. `EP <= g·N_h` (the expert group stays inside one fast single-hop domain: a
//!    switch's nodes on Frontier, 8 GCDs x 4 nodes); since a group is `EP` consecutive
//!    ranks, `EP` must also divide `g·N_h`, or some groups would straddle two domains;
//! 4. `DP` divides the batch `b`;
//! 5. some micro-batch count `M` divides `b/DP` with `M >= PP` (1F1B needs at least as
//!    many micro-batches as stages to reach its steady state);
//! 6. memory: `M(i) <= GPU memory` for every stage (stage 0 is the one that binds when
//!    `PP` divides `L`).
//!
//! `PP·EP·DP = GPUs` holds by construction. Among the micro-batch counts that fit, the
//! one with the best predicted MFU is the family's layout.

use crate::error::{PiperError, Result};
use crate::model::ModelConfig;
use crate::predict::{Layout, Machine, Prediction, Predictor, Workload};
use crate::profile::HardwareProfile;
use crate::resource;
use halo_topology::Topology;
use serde::Serialize;
use std::fmt;

/// The most nodes [`smallest_machine`] tries.
pub const MAX_SEARCH_NODES: u64 = 1 << 14;

/// A constraint of the layout search.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Constraint {
    /// EP divides E.
    EpDividesExperts,
    /// PP <= L.
    PpAtMostLayers,
    /// EP <= g·N_h, and EP divides it (no group straddles two fast domains).
    EpInFastDomain,
    /// DP divides b.
    DpDividesBatch,
    /// Some M divides b/DP with M >= PP.
    Microbatches,
    /// M(i) <= GPU memory for every stage.
    Memory,
}

impl fmt::Display for Constraint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Constraint::EpDividesExperts => "EP divides E",
            Constraint::PpAtMostLayers => "PP <= L",
            Constraint::EpInFastDomain => "EP <= g*N_h",
            Constraint::DpDividesBatch => "DP divides b",
            Constraint::Microbatches => "M >= PP, M divides b/DP",
            Constraint::Memory => "M(i) <= GPU memory",
        })
    }
}

/// A family the search rejected, with the first constraint it breaks.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Rejected {
    /// PP.
    pub pp: u64,
    /// EP.
    pub ep: u64,
    /// DP.
    pub dp: u64,
    /// The binding constraint.
    pub constraint: Constraint,
    /// The numbers that break it.
    pub detail: String,
    /// For memory: the least `max_i M(i)` any micro-batch count reaches, bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub least_bytes: Option<f64>,
}

/// A valid layout and its prediction.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Planned {
    /// The layout.
    pub layout: Layout,
    /// `M(i)` for every stage, bytes.
    pub stage_bytes: Vec<f64>,
    /// The predicted step.
    pub prediction: Prediction,
}

impl Planned {
    /// `M(0)`.
    pub fn stage0_bytes(&self) -> f64 {
        self.stage_bytes[0]
    }
}

/// The outcome of [`plan`]: valid layouts best first, rejected families.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Plan {
    /// The machine's figures.
    pub machine: Machine,
    /// GPU memory per the profile, bytes.
    pub memory_bytes: f64,
    /// Valid layouts, best predicted MFU first (one per family: its best M).
    pub layouts: Vec<Planned>,
    /// Rejected families, by PP then EP.
    pub rejected: Vec<Rejected>,
}

/// The machine figures the constraints need (a [`Machine`] without the topology).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Shape {
    gpus: u64,
    fast: u64,
    memory: f64,
}

fn divisors(n: u64) -> Vec<u64> {
    let mut small = Vec::new();
    let mut large = Vec::new();
    let mut i = 1;
    while i * i <= n {
        if n.is_multiple_of(i) {
            small.push(i);
            if i * i != n {
                large.push(n / i);
            }
        }
        i += 1;
    }
    small.extend(large.into_iter().rev());
    small
}

/// `max_i M(i)` of a layout. Among stages with the same number of layers M(i) falls
/// with i (fewer micro-batches in flight), so the largest is stage 0, the first stage
/// with an extra layer, or the last stage (which holds the output head).
fn peak_bytes(model: &ModelConfig, workload: &Workload, layout: Layout) -> f64 {
    let b = (workload.batch / layout.dp) as f64;
    let (pp, rem) = (layout.pp, model.layers % layout.pp);
    let s = workload.seq as f64;
    [0, pp - rem.max(1), pp - 1]
        .into_iter()
        .map(|i| resource::stage_bytes(model, layout.shape(), i, b, s, workload.options))
        .fold(0.0, f64::max)
}

fn stage_bytes(model: &ModelConfig, workload: &Workload, layout: Layout) -> Vec<f64> {
    let b = (workload.batch / layout.dp) as f64;
    resource::stages_bytes(
        model,
        layout.shape(),
        b,
        workload.seq as f64,
        workload.options,
    )
}

/// Checks one family; on success the micro-batch counts that fit memory.
fn check_family(
    model: &ModelConfig,
    workload: &Workload,
    shape: Shape,
    (pp, ep, dp): (u64, u64, u64),
) -> std::result::Result<Vec<u64>, Rejected> {
    let reject = |constraint, detail: String, least_bytes| Rejected {
        pp,
        ep,
        dp,
        constraint,
        detail,
        least_bytes,
    };
    if !model.experts.is_multiple_of(ep) {
        return Err(reject(
            Constraint::EpDividesExperts,
            format!("EP {ep} does not divide E = {}", model.experts),
            None,
        ));
    }
    if pp > model.layers {
        return Err(reject(
            Constraint::PpAtMostLayers,
            format!("PP {pp} > L = {}", model.layers),
            None,
        ));
    }
    if ep > shape.fast {
        return Err(reject(
            Constraint::EpInFastDomain,
            format!("EP {ep} > g*N_h = {}", shape.fast),
            None,
        ));
    }
    if !shape.fast.is_multiple_of(ep) {
        return Err(reject(
            Constraint::EpInFastDomain,
            format!(
                "groups of EP {ep} consecutive GPUs would straddle the fast domains of {} GPUs",
                shape.fast
            ),
            None,
        ));
    }
    if !workload.batch.is_multiple_of(dp) {
        return Err(reject(
            Constraint::DpDividesBatch,
            format!("DP {dp} does not divide b = {}", workload.batch),
            None,
        ));
    }
    let per_replica = workload.batch / dp;
    let counts: Vec<u64> = divisors(per_replica)
        .into_iter()
        .filter(|&m| m >= pp)
        .collect();
    if counts.is_empty() {
        return Err(reject(
            Constraint::Microbatches,
            format!("b/DP = {per_replica} sequences cannot make PP = {pp} micro-batches"),
            None,
        ));
    }
    let mut least = f64::INFINITY;
    let mut least_m = 0;
    let mut fit = Vec::new();
    for &m in &counts {
        let layout = Layout {
            pp,
            ep,
            dp,
            microbatches: m,
        };
        let bytes = peak_bytes(model, workload, layout);
        if bytes < least {
            least = bytes;
            least_m = m;
        }
        if bytes <= shape.memory {
            fit.push(m);
        }
    }
    if fit.is_empty() {
        return Err(reject(
            Constraint::Memory,
            format!(
                "needs {} at least (M = {least_m}) > {}",
                gib(least),
                gib(shape.memory)
            ),
            Some(least),
        ));
    }
    Ok(fit)
}

/// Bytes as GiB with one decimal.
pub fn gib(bytes: f64) -> String {
    format!("{:.1} GiB", bytes / (1u64 << 30) as f64)
}

/// Every (PP, EP, DP) with PP·EP·DP = `gpus`, by PP then EP.
fn families(gpus: u64) -> Vec<(u64, u64, u64)> {
    let mut out = Vec::new();
    for pp in divisors(gpus) {
        for ep in divisors(gpus / pp) {
            out.push((pp, ep, gpus / pp / ep));
        }
    }
    out
}

/// Plans `model` on `topology`: every valid layout with its prediction, best MFU
/// first, and every rejected family with its binding constraint.
///
/// # Errors
/// [`PiperError::Invalid`] for a bad model, workload or profile;
/// [`PiperError::DoesNotFit`] when no family is valid, naming the smallest machine of
/// the same kind (same node, same fast domain) on which one is; simulator errors.
pub fn plan(
    topology: &Topology,
    model: &ModelConfig,
    workload: &Workload,
    profile: &HardwareProfile,
) -> Result<Plan> {
    model.validate()?;
    workload.validate()?;
    profile.validate()?;
    let machine = Machine::of(topology);
    let shape = Shape {
        gpus: machine.gpus,
        fast: machine.fast_domain_gpus,
        memory: profile.memory_bytes(),
    };
    let mut predictor = Predictor::new(topology, profile.clone())?;
    let mut layouts = Vec::new();
    let mut rejected = Vec::new();
    for family in families(machine.gpus) {
        match check_family(model, workload, shape, family) {
            Err(r) => rejected.push(r),
            Ok(counts) => {
                let mut best: Option<Planned> = None;
                for m in counts {
                    let layout = Layout {
                        pp: family.0,
                        ep: family.1,
                        dp: family.2,
                        microbatches: m,
                    };
                    let prediction = predictor.predict(model, layout, workload)?;
                    if best
                        .as_ref()
                        .is_none_or(|b| prediction.mfu > b.prediction.mfu)
                    {
                        best = Some(Planned {
                            layout,
                            stage_bytes: stage_bytes(model, workload, layout),
                            prediction,
                        });
                    }
                }
                layouts.extend(best);
            }
        }
    }
    tracing::debug!(
        simulations = predictor.simulations,
        valid = layouts.len(),
        rejected = rejected.len(),
        "planned"
    );
    if layouts.is_empty() {
        return Err(does_not_fit(
            topology, model, workload, shape, &machine, &rejected,
        ));
    }
    layouts.sort_by(|a, b| {
        b.prediction
            .mfu
            .total_cmp(&a.prediction.mfu)
            .then(a.layout.cmp(&b.layout))
    });
    Ok(Plan {
        machine,
        memory_bytes: shape.memory,
        layouts,
        rejected,
    })
}

fn does_not_fit(
    topology: &Topology,
    model: &ModelConfig,
    workload: &Workload,
    shape: Shape,
    machine: &Machine,
    rejected: &[Rejected],
) -> PiperError {
    let mut by: Vec<(Constraint, usize)> = Vec::new();
    for r in rejected {
        match by.iter_mut().find(|(c, _)| *c == r.constraint) {
            Some((_, n)) => *n += 1,
            None => by.push((r.constraint, 1)),
        }
    }
    by.sort();
    let mut reason = format!(
        "all {} PP x EP x DP families are rejected (",
        rejected.len()
    );
    reason += &by
        .iter()
        .map(|(c, n)| format!("{n} by {c}"))
        .collect::<Vec<_>>()
        .join(", ");
    reason.push(')');
    if let Some(closest) = rejected
        .iter()
        .filter(|r| r.least_bytes.is_some())
        .min_by(|a, b| {
            a.least_bytes
                .unwrap_or(0.0)
                .total_cmp(&b.least_bytes.unwrap_or(0.0))
        })
    {
        reason += &format!(
            "; the closest, PP {} x EP {} x DP {}, {}",
            closest.pp, closest.ep, closest.dp, closest.detail
        );
    }
    let kind = machine_kind(topology, machine);
    let smallest = match smallest_machine(model, workload, &kind, shape.memory) {
        Some((nodes, layout)) => format!(
            "the smallest machine of this kind that fits is {} ({} GPUs: PP {} x EP {} x DP {}, M = {})",
            scaled_name(topology.name(), nodes, machine.gpus_per_node),
            layout.gpus(),
            layout.pp,
            layout.ep,
            layout.dp,
            layout.microbatches
        ),
        None => format!(
            "no machine of this kind up to {MAX_SEARCH_NODES} nodes fits it (try activation checkpointing, a smaller batch or shorter sequences)"
        ),
    };
    PiperError::DoesNotFit {
        model: model.name.clone(),
        machine: format!("{} ({} GPUs)", topology.name(), machine.gpus),
        reason,
        smallest,
    }
}

/// The figures of the machine's kind at full size: for a preset that scales with its
/// node count (`frontier:N`, `dgx-h100:N`, `nodes:HxR`), the preset at 64 nodes (so that
/// `frontier:1`, whose only switch holds one node, still counts 4 nodes per switch);
/// otherwise the topology's own.
fn machine_kind(topology: &Topology, machine: &Machine) -> Machine {
    let name = scaled_name(topology.name(), 64, machine.gpus_per_node);
    match Topology::preset(&name) {
        Ok(t) if Machine::of(&t).gpus_per_node == machine.gpus_per_node => Machine::of(&t),
        _ => *machine,
    }
}

/// The smallest number of nodes of `machine`'s kind (its GPUs per node and fast
/// domain) on which some layout of `model` satisfies every constraint, and that layout
/// (the largest micro-batch count of the first valid family). Memory only: no
/// prediction.
pub fn smallest_machine(
    model: &ModelConfig,
    workload: &Workload,
    machine: &Machine,
    memory: f64,
) -> Option<(u64, Layout)> {
    let g = machine.gpus_per_node.max(1);
    let fast_full = machine.nodes_per_fast_domain.max(1) * g;
    // Hopeless when one layer's training state, with the widest group allowed, does
    // not fit.
    let widest = divisors(model.experts)
        .into_iter()
        .filter(|&ep| ep <= fast_full)
        .max()
        .unwrap_or(1);
    if resource::state_bytes_per_layer(model, widest) > memory {
        return None;
    }
    for nodes in 1..=MAX_SEARCH_NODES {
        let gpus = nodes * g;
        let shape = Shape {
            gpus,
            fast: fast_full.min(gpus),
            memory,
        };
        for family in families(gpus) {
            if let Ok(counts) = check_family(model, workload, shape, family) {
                let m = counts[counts.len() - 1];
                return Some((
                    nodes,
                    Layout {
                        pp: family.0,
                        ep: family.1,
                        dp: family.2,
                        microbatches: m,
                    },
                ));
            }
        }
    }
    None
}

/// `frontier:8` with 256 nodes is `frontier:256`; `nodes:4x8` becomes `nodes:256x8`;
/// any other topology is described in words.
pub fn scaled_name(name: &str, nodes: u64, gpus_per_node: u64) -> String {
    let base = name.split(",ranks=").next().unwrap_or(name);
    match base.split_once(':') {
        Some((kind @ ("frontier" | "dgx-h100"), _)) => format!("{kind}:{nodes}"),
        Some(("nodes", arg)) => match arg.split_once('x') {
            Some((_, r)) => format!("nodes:{nodes}x{r}"),
            None => format!("{nodes} nodes of {gpus_per_node} GPUs"),
        },
        _ => format!("{nodes} nodes of {gpus_per_node} GPUs like {name}'s"),
    }
}
