//! `halo plan`: Piper's resource model and layout planner (crate `halo-piper`).
//!
//! Self-contained: everything the command needs is in this file, so that it can move
//! with the tool.

use super::Failure;
use clap::{Args, Subcommand};
use halo_piper::model::ModelConfig;
use halo_piper::plan::{Plan, gib};
use halo_piper::predict::Workload;
use halo_piper::profile::HardwareProfile;
use halo_piper::resource::{self, MemoryOptions, StageShape};
use halo_piper::{PiperError, plan as plan_layouts};
use halo_topology::Topology;
use serde::Serialize;
use std::fmt::Write as _;

/// Piper's resource model: parameters, memory per pipeline stage, expert-migration cost,
/// and the PP x EP x DP layout search ranked by predicted MFU (docs/PLANNING.md).
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  halo plan params --model piper-ws:256 --json\n  \
    halo plan memory --model mixtral-8x7b --pp 8 --ep 8 --microbatches 256 --batch 512 --seq 4096\n  \
    halo plan migration --model mixtral-8x7b --group 8 --bandwidth 25e9\n  \
    halo plan layout --model mixtral-8x7b --topology frontier:8 --batch 512 --seq 4096\n\n\
    Models: switch-base, mixtral-8x7b, mixtral-8x22b, grok-1, glam, deepseek-v2, deepseek-v3,\n  \
    llama4-scout, kimi-k2, piper-ws:E, reference:tiny|small (halo train's), or a TOML/JSON file. Profiles: mi250x-gcd, h100-sxm, or a file."
)]
pub(crate) struct PlanArgs {
    #[command(subcommand)]
    form: PlanForm,
}

#[derive(Debug, Subcommand)]
enum PlanForm {
    /// Parameters per component: total, attention, experts, active.
    Params(ParamsArgs),
    /// Bytes per pipeline stage under 1F1B, with M_u and M_edp for comparison.
    Memory(MemoryArgs),
    /// Bytes per migrated expert and the worst-case migration of one layer.
    Migration(MigrationArgs),
    /// The valid PP x EP x DP layouts ranked by predicted MFU, and why the others fail.
    Layout(LayoutArgs),
}

/// A positive integer argument (`0` and negative numbers are refused by name).
fn positive(s: &str) -> Result<u64, String> {
    match s.trim().parse::<i128>() {
        Ok(v) if v > 0 && v <= i128::from(u32::MAX) => Ok(v as u64),
        Ok(v) => Err(format!(
            "must be a positive integer up to {}, got {v}",
            u32::MAX
        )),
        Err(_) => Err(format!("must be a positive integer, got '{s}'")),
    }
}

/// A positive number of bytes per second (`25e9`, `25000000000`).
fn bandwidth(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!(
            "must be a positive number of bytes per second, got '{s}'"
        )),
    }
}

#[derive(Debug, Args)]
struct ModelArg {
    /// A preset (mixtral-8x7b, piper-ws:256, ...) or a TOML/JSON model file.
    #[arg(long)]
    model: String,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct ActivationArgs {
    /// Plain attention: store the 4bHs^2 score matrix (the paper's equation as written).
    #[arg(long)]
    no_flash_attention: bool,
    /// Full activation checkpointing: keep each layer's input, recompute the rest.
    #[arg(long)]
    checkpointing: bool,
}

impl ActivationArgs {
    fn options(&self) -> MemoryOptions {
        MemoryOptions {
            flash_attention: !self.no_flash_attention,
            checkpointing: self.checkpointing,
        }
    }
}

#[derive(Debug, Args)]
#[command(allow_negative_numbers = true)]
struct ParamsArgs {
    #[command(flatten)]
    model: ModelArg,
}

#[derive(Debug, Args)]
#[command(allow_negative_numbers = true)]
struct MemoryArgs {
    #[command(flatten)]
    model: ModelArg,
    /// PP: pipeline stages.
    #[arg(long, value_parser = positive)]
    pp: u64,
    /// EP: expert-parallel degree (must divide the experts).
    #[arg(long, value_parser = positive)]
    ep: u64,
    /// M: micro-batches per step.
    #[arg(long, value_parser = positive)]
    microbatches: u64,
    /// b: global batch, sequences per step.
    #[arg(long, value_parser = positive)]
    batch: u64,
    /// s: sequence length.
    #[arg(long, value_parser = positive)]
    seq: u64,
    /// DP: data-parallel replicas (each takes b/DP sequences).
    #[arg(long, value_parser = positive, default_value_t = 1)]
    dp: u64,
    #[command(flatten)]
    activations: ActivationArgs,
}

#[derive(Debug, Args)]
#[command(allow_negative_numbers = true)]
struct MigrationArgs {
    #[command(flatten)]
    model: ModelArg,
    /// G: GPUs of the expert-parallel group the experts move in (must divide the experts).
    #[arg(long, value_parser = positive)]
    group: u64,
    /// B: bytes per second of the link each GPU sends over (e.g. 25e9).
    #[arg(long, value_parser = bandwidth)]
    bandwidth: f64,
}

#[derive(Debug, Args)]
#[command(allow_negative_numbers = true)]
struct LayoutArgs {
    #[command(flatten)]
    model: ModelArg,
    /// Topology preset (frontier:N, dgx-h100:N, nodes:HxR, flat:N) or file.
    #[arg(long)]
    topology: String,
    /// b: global batch, sequences per step.
    #[arg(long, value_parser = positive)]
    batch: u64,
    /// s: sequence length.
    #[arg(long, value_parser = positive)]
    seq: u64,
    /// Hardware profile preset (mi250x-gcd, h100-sxm) or file; default from the
    /// topology (h100-sxm for dgx-h100, mi250x-gcd otherwise).
    #[arg(long)]
    profile: Option<String>,
    /// Layouts to show.
    #[arg(long, value_parser = positive, default_value_t = 10)]
    top: u64,
    #[command(flatten)]
    activations: ActivationArgs,
}

fn fail(e: PiperError) -> Failure {
    if e.is_input() {
        Failure::input(e)
    } else {
        Failure::other(e)
    }
}

fn json<T: Serialize>(value: &T) -> Result<(), Failure> {
    let text = serde_json::to_string_pretty(value)
        .map_err(|e| Failure::other(format!("cannot write JSON: {e}")))?;
    super::emit(&(text + "\n"))
}

/// `1234567` -> `1,234,567`.
fn grouped(v: u128) -> String {
    let s = v.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Parameters with a short scale: 47.2B, 1.72T.
fn short(v: u128) -> String {
    let v = v as f64;
    if v >= 1e12 {
        format!("{:.2}T", v / 1e12)
    } else if v >= 1e9 {
        format!("{:.1}B", v / 1e9)
    } else if v >= 1e6 {
        format!("{:.1}M", v / 1e6)
    } else {
        format!("{v}")
    }
}

/// A byte count as an integer; one beyond 2^64 (an absurd model) is an error, not a
/// silently saturated number.
fn to_bytes(v: f64, what: &str) -> Result<u64, Failure> {
    if (0.0..18_446_744_073_709_551_615.0).contains(&v) {
        Ok(v.round() as u64)
    } else {
        Err(Failure::input(format!(
            "{what}: {v:.3e} bytes is more than this tool reports (2^64); check the model's sizes"
        )))
    }
}

fn describe(m: &ModelConfig) -> String {
    format!(
        "{}: L {}, d {}, H {}, E {} (+{} shared), k {}, d_ffn {}, {} matrices per expert{}",
        m.name,
        m.layers,
        m.hidden,
        m.heads,
        m.experts,
        m.shared_experts,
        m.top_k,
        m.expert_ffn,
        m.expert_matrices,
        m.vocab
            .map(|v| format!(", vocabulary {v}"))
            .unwrap_or_default()
    )
}

/// Runs `halo plan`.
pub(crate) fn run(args: &PlanArgs) -> Result<(), Failure> {
    match &args.form {
        PlanForm::Params(a) => params(a),
        PlanForm::Memory(a) => memory(a),
        PlanForm::Migration(a) => migration(a),
        PlanForm::Layout(a) => layout(a),
    }
}

fn load_model(arg: &ModelArg) -> Result<ModelConfig, Failure> {
    ModelConfig::resolve(&arg.model).map_err(fail)
}

#[derive(Serialize)]
struct ParamsOut<'a> {
    model: &'a ModelConfig,
    total: u128,
    attention: u128,
    experts: u128,
    shared_experts: u128,
    router: u128,
    embedding: u128,
    active: u128,
}

fn params(a: &ParamsArgs) -> Result<(), Failure> {
    let m = load_model(&a.model)?;
    let p = resource::params(&m);
    if a.model.json {
        return json(&ParamsOut {
            model: &m,
            total: p.total,
            attention: p.attention,
            experts: p.experts,
            shared_experts: p.shared_experts,
            router: p.router,
            embedding: p.embedding,
            active: p.active,
        });
    }
    let mut out = describe(&m) + "\n";
    for (name, v) in [
        ("attention", p.attention),
        ("experts", p.experts),
        ("shared experts", p.shared_experts),
        ("router", p.router),
        ("embedding", p.embedding),
        ("total", p.total),
        ("active", p.active),
    ] {
        let _ = writeln!(out, "{name:<16}{:>22}  {:>8}", grouped(v), short(v));
    }
    super::emit(&out)
}

#[derive(Serialize)]
struct StageOut {
    stage: u64,
    layers: u64,
    in_flight: u64,
    bytes: u64,
}

#[derive(Serialize)]
struct MemoryOut<'a> {
    model: &'a str,
    pp: u64,
    ep: u64,
    dp: u64,
    microbatches: u64,
    batch: u64,
    seq: u64,
    flash_attention: bool,
    checkpointing: bool,
    stages: Vec<StageOut>,
    m_u: u64,
    m_edp: u64,
    skew: u64,
}

fn memory(a: &MemoryArgs) -> Result<(), Failure> {
    let m = load_model(&a.model)?;
    let shape = StageShape {
        pp: a.pp,
        ep: a.ep,
        microbatches: a.microbatches,
    };
    shape.validate(&m).map_err(fail)?;
    if !a.batch.is_multiple_of(a.dp) {
        return Err(Failure::input(format!(
            "invalid layout: dp: DP {} does not divide the batch of {} sequences",
            a.dp, a.batch
        )));
    }
    let b = a.batch / a.dp;
    if !b.is_multiple_of(a.microbatches) {
        return Err(Failure::input(format!(
            "invalid layout: microbatches: M {} does not divide the {b} sequences per replica",
            a.microbatches
        )));
    }
    let opt = a.activations.options();
    let (bf, s) = (b as f64, a.seq as f64);
    let bytes = resource::stages_bytes(&m, shape, bf, s, opt);
    let out = MemoryOut {
        model: &m.name,
        pp: a.pp,
        ep: a.ep,
        dp: a.dp,
        microbatches: a.microbatches,
        batch: a.batch,
        seq: a.seq,
        flash_attention: opt.flash_attention,
        checkpointing: opt.checkpointing,
        stages: bytes
            .iter()
            .enumerate()
            .map(|(i, &v)| {
                Ok(StageOut {
                    stage: i as u64,
                    layers: resource::stage_layers(m.layers, a.pp, i as u64),
                    in_flight: resource::in_flight(shape, i as u64),
                    bytes: to_bytes(v, "stages")?,
                })
            })
            .collect::<Result<Vec<_>, Failure>>()?,
        m_u: to_bytes(resource::unpartitioned_bytes(&m, bf, s, opt), "m_u")?,
        m_edp: to_bytes(
            resource::expert_data_parallel_bytes(&m, bf, s, a.ep, opt),
            "m_edp",
        )?,
        skew: to_bytes(resource::skew_bytes(&m, shape, bf, s, opt), "skew")?,
    };
    if a.model.json {
        return json(&out);
    }
    let mut t = describe(&m) + "\n";
    let _ = writeln!(
        t,
        "PP {} x EP {} (x DP {}), M = {} micro-batches of {} sequences, s = {}, FlashAttention {}, checkpointing {}",
        a.pp,
        a.ep,
        a.dp,
        a.microbatches,
        b / a.microbatches,
        a.seq,
        if opt.flash_attention { "on" } else { "off" },
        if opt.checkpointing { "on" } else { "off" }
    );
    let _ = writeln!(
        t,
        "{:>5} {:>6} {:>9} {:>20} {:>10}",
        "stage", "layers", "in flight", "bytes", "GiB"
    );
    for st in &out.stages {
        let _ = writeln!(
            t,
            "{:>5} {:>6} {:>9} {:>20} {:>10.2}",
            st.stage,
            st.layers,
            st.in_flight,
            grouped(u128::from(st.bytes)),
            st.bytes as f64 / (1u64 << 30) as f64
        );
    }
    for (name, v) in [
        ("M_u (one GPU, whole batch)", out.m_u),
        ("M_edp (expert-data parallel over EP)", out.m_edp),
        ("skew M(0) - M(PP-1)", out.skew),
    ] {
        let _ = writeln!(
            t,
            "{name:<38}{:>20} {:>10.2} GiB",
            grouped(u128::from(v)),
            v as f64 / (1u64 << 30) as f64
        );
    }
    super::emit(&t)
}

#[derive(Serialize)]
struct MigrationOut<'a> {
    model: &'a str,
    group: u64,
    bandwidth: f64,
    expert_bytes: u64,
    experts_per_gpu: u64,
    per_gpu_bytes: u64,
    seconds: f64,
}

fn migration(a: &MigrationArgs) -> Result<(), Failure> {
    let m = load_model(&a.model)?;
    let c = resource::migration_cost(&m, a.group, a.bandwidth).map_err(fail)?;
    let out = MigrationOut {
        model: &m.name,
        group: a.group,
        bandwidth: a.bandwidth,
        expert_bytes: to_bytes(c.expert_bytes, "expert_bytes")?,
        experts_per_gpu: c.experts_per_gpu,
        per_gpu_bytes: to_bytes(c.per_gpu_bytes, "per_gpu_bytes")?,
        seconds: c.seconds,
    };
    if a.model.json {
        return json(&out);
    }
    let mut t = describe(&m) + "\n";
    let _ = writeln!(
        t,
        "one expert (16 bytes x {} x d x d_ffn): {} bytes ({})",
        m.expert_matrices,
        grouped(u128::from(out.expert_bytes)),
        gib(c.expert_bytes)
    );
    let _ = writeln!(
        t,
        "worst case, every expert of one layer moves in a group of {}: {} experts per GPU, {} bytes per GPU ({})",
        a.group,
        c.experts_per_gpu,
        grouped(u128::from(out.per_gpu_bytes)),
        gib(c.per_gpu_bytes)
    );
    let _ = writeln!(t, "at {} bytes/s: {:.4} s", a.bandwidth, c.seconds);
    super::emit(&t)
}

#[derive(Serialize)]
struct LayoutRow {
    pp: u64,
    ep: u64,
    dp: u64,
    microbatches: u64,
    stage0_bytes: u64,
    max_stage_bytes: u64,
    step_seconds: f64,
    mfu: f64,
    tflops_per_gpu: f64,
    compute_seconds: f64,
    a2a_seconds: f64,
    a2a_lower_bound_seconds: f64,
    a2a_algorithm: String,
    p2p_seconds: f64,
    bubble_seconds: f64,
    allreduce_seconds: f64,
}

#[derive(Serialize)]
struct RejectedRow {
    pp: u64,
    ep: u64,
    dp: u64,
    constraint: String,
    detail: String,
}

#[derive(Serialize)]
struct LayoutOut<'a> {
    model: &'a str,
    topology: &'a str,
    gpus: u64,
    gpus_per_node: u64,
    nodes_per_fast_domain: u64,
    profile: &'a str,
    peak_tflops: f64,
    memory_bytes: u64,
    batch: u64,
    seq: u64,
    flash_attention: bool,
    checkpointing: bool,
    layouts: Vec<LayoutRow>,
    rejected: Vec<RejectedRow>,
}

fn layout(a: &LayoutArgs) -> Result<(), Failure> {
    let m = load_model(&a.model)?;
    let topo = if std::path::Path::new(&a.topology).exists() {
        Topology::load(&a.topology)
    } else {
        Topology::preset(&a.topology)
    }
    .map_err(Failure::input)?;
    let profile = match &a.profile {
        Some(p) => HardwareProfile::resolve(p).map_err(fail)?,
        None => HardwareProfile::for_topology(topo.name()),
    };
    let workload = Workload {
        batch: a.batch,
        seq: a.seq,
        options: a.activations.options(),
    };
    let plan: Plan = plan_layouts(&topo, &m, &workload, &profile).map_err(fail)?;
    let out = LayoutOut {
        model: &m.name,
        topology: topo.name(),
        gpus: plan.machine.gpus,
        gpus_per_node: plan.machine.gpus_per_node,
        nodes_per_fast_domain: plan.machine.nodes_per_fast_domain,
        profile: &profile.name,
        peak_tflops: profile.peak_tflops,
        memory_bytes: plan.memory_bytes.round() as u64,
        batch: a.batch,
        seq: a.seq,
        flash_attention: workload.options.flash_attention,
        checkpointing: workload.options.checkpointing,
        layouts: plan
            .layouts
            .iter()
            .take(usize::try_from(a.top).unwrap_or(usize::MAX))
            .map(|l| {
                let p = &l.prediction;
                LayoutRow {
                    pp: l.layout.pp,
                    ep: l.layout.ep,
                    dp: l.layout.dp,
                    microbatches: l.layout.microbatches,
                    stage0_bytes: l.stage0_bytes().round() as u64,
                    max_stage_bytes: l.stage_bytes.iter().copied().fold(0.0, f64::max).round()
                        as u64,
                    step_seconds: p.step_seconds,
                    mfu: p.mfu,
                    tflops_per_gpu: p.tflops_per_gpu,
                    compute_seconds: p.compute_seconds,
                    a2a_seconds: p.a2a_seconds,
                    a2a_lower_bound_seconds: p.a2a_lower_bound_seconds,
                    a2a_algorithm: p.a2a_algorithm.clone(),
                    p2p_seconds: p.p2p_seconds,
                    bubble_seconds: p.bubble_seconds,
                    allreduce_seconds: p.allreduce_seconds,
                }
            })
            .collect(),
        rejected: plan
            .rejected
            .iter()
            .map(|r| RejectedRow {
                pp: r.pp,
                ep: r.ep,
                dp: r.dp,
                constraint: r.constraint.to_string(),
                detail: r.detail.clone(),
            })
            .collect(),
    };
    if a.model.json {
        return json(&out);
    }
    let mut t = describe(&m) + "\n";
    let _ = writeln!(
        t,
        "on {} ({} GPUs; g = {}, N_h = {}: EP <= {}), profile {} ({} TFLOPS, {}), b = {}, s = {}, FlashAttention {}, checkpointing {}",
        out.topology,
        out.gpus,
        out.gpus_per_node,
        out.nodes_per_fast_domain,
        plan.machine.fast_domain_gpus,
        out.profile,
        out.peak_tflops,
        gib(plan.memory_bytes),
        a.batch,
        a.seq,
        if out.flash_attention { "on" } else { "off" },
        if out.checkpointing { "on" } else { "off" }
    );
    let _ = writeln!(
        t,
        "Valid layouts, best predicted MFU first (times in seconds per step; a2a simulated on one EP group):"
    );
    let _ = writeln!(
        t,
        "{:>4} {:>4} {:>4} {:>4} {:>5} {:>9} {:>8} {:>6} {:>7} {:>8} {:>7} {:>7} {:>7} {:>7}",
        "#",
        "PP",
        "EP",
        "DP",
        "M",
        "M(0) GiB",
        "step",
        "MFU",
        "TFLOPS",
        "compute",
        "a2a",
        "p2p",
        "bubble",
        "allred"
    );
    for (i, r) in out.layouts.iter().enumerate() {
        let _ = writeln!(
            t,
            "{:>4} {:>4} {:>4} {:>4} {:>5} {:>9.1} {:>8.3} {:>5.1}% {:>7.1} {:>8.3} {:>7.3} {:>7.3} {:>7.3} {:>7.3}",
            i + 1,
            r.pp,
            r.ep,
            r.dp,
            r.microbatches,
            r.stage0_bytes as f64 / (1u64 << 30) as f64,
            r.step_seconds,
            100.0 * r.mfu,
            r.tflops_per_gpu,
            r.compute_seconds,
            r.a2a_seconds,
            r.p2p_seconds,
            r.bubble_seconds,
            r.allreduce_seconds
        );
    }
    if plan.layouts.len() > out.layouts.len() {
        let _ = writeln!(
            t,
            "({} more; --top N shows them)",
            plan.layouts.len() - out.layouts.len()
        );
    }
    if !out.rejected.is_empty() {
        let _ = writeln!(t, "Rejected families (binding constraint):");
        let _ = writeln!(
            t,
            "{:>4} {:>4} {:>4}  {:<24} detail",
            "PP", "EP", "DP", "constraint"
        );
        for r in &out.rejected {
            let _ = writeln!(
                t,
                "{:>4} {:>4} {:>4}  {:<24} {}",
                r.pp, r.ep, r.dp, r.constraint, r.detail
            );
        }
    }
    super::emit(&t)
}
