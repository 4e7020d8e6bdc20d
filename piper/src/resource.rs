//! The Piper resource model: parameters, training-state and activation memory per
//! pipeline stage, all-to-all and point-to-point volumes, and the cost of migrating
//! experts. Equations from Dash and Wang, "Piper: Efficient Large-Scale MoE Training
//! via Resource Modeling and Pipelined Hybrid Parallelism" (ORNL, arXiv 2605.05049),
//! restated with their sources in docs/PLANNING.md.
//!
//! Symbols: d hidden, L layers, E routed experts, k top-k, H heads, s sequence length,
//! b batch in sequences, d_ffn expert inner size, m matrices per expert (3 SwiGLU, 2
//! plain FFN), PP and EP the pipeline and expert-parallel degrees, M micro-batches.
//! With m = 3, no shared experts and no vocabulary, every formula here is the paper's;
//! the router (d·E parameters per layer, which the paper leaves out) is counted and
//! held like attention.
//!
//! Byte counts are `f64` (exact below 2^53 bytes, 8 PiB); parameter counts are exact
//! integers.

use crate::error::{PiperError, Result};
use crate::model::ModelConfig;
use serde::Serialize;

/// Bytes of training state per parameter: fp16 weight and gradient (2 + 2), fp32 master
/// weight (4), fp32 Adam moments m and v (4 + 4).
pub const STATE_BYTES_PER_PARAM: u64 = 16;

/// Bytes of one activation element (bf16/fp16).
pub const ACTIVATION_BYTES: f64 = 2.0;

/// All-to-alls per MoE layer in one training step, per micro-batch: dispatch and
/// combine, forward and backward.
pub const A2A_PER_MOE_LAYER: u64 = 4;

/// What the activation memory model assumes about the kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct MemoryOptions {
    /// FlashAttention (default, as in the paper's runs): the attention-score matrix
    /// (`4·b·H·s²` bytes per layer) is not stored, only the softmax statistics
    /// (`4·b·H·s`, fp32 per row).
    pub flash_attention: bool,
    /// Full activation checkpointing: a layer keeps only its input (`2·b·s·d` bytes) per
    /// micro-batch in flight and recomputes the rest in the backward pass, which needs
    /// one layer's full activations for one micro-batch at a time and one more forward
    /// pass of compute.
    pub checkpointing: bool,
}

impl Default for MemoryOptions {
    fn default() -> Self {
        MemoryOptions {
            flash_attention: true,
            checkpointing: false,
        }
    }
}

/// Parameters of a model, per component.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Params {
    /// Every parameter.
    pub total: u128,
    /// Attention: `4·d²` per layer (Q, K, V, O).
    pub attention: u128,
    /// Routed experts: `m·E·d·d_ffn` per layer.
    pub experts: u128,
    /// Shared experts: `m·E_s·d·d_ffn` per layer.
    pub shared_experts: u128,
    /// Router (gate): `d·E` per layer.
    pub router: u128,
    /// Input embedding and output head, `2·V·d` (0 without a vocabulary).
    pub embedding: u128,
    /// Parameters one token goes through: everything but the experts it is not routed
    /// to (`k/E` of the routed experts).
    pub active: u128,
}

/// Parameter counts of `model`.
pub fn params(model: &ModelConfig) -> Params {
    let l = u128::from(model.layers);
    let attention = l * attention_params_per_layer(model);
    let experts = l * u128::from(model.experts) * expert_params(model);
    let shared_experts = l * u128::from(model.shared_experts) * expert_params(model);
    let router = l * u128::from(model.hidden) * u128::from(model.experts);
    let embedding = 2 * u128::from(model.vocab.unwrap_or(0)) * u128::from(model.hidden);
    let routed_active = l * u128::from(model.top_k) * expert_params(model);
    let total = attention + experts + shared_experts + router + embedding;
    Params {
        total,
        attention,
        experts,
        shared_experts,
        router,
        embedding,
        active: total - experts + routed_active,
    }
}

/// `4·d²`: Q, K, V and O projections of one layer.
pub fn attention_params_per_layer(model: &ModelConfig) -> u128 {
    4 * u128::from(model.hidden) * u128::from(model.hidden)
}

/// `m·d·d_ffn`: one expert.
pub fn expert_params(model: &ModelConfig) -> u128 {
    u128::from(model.expert_matrices) * u128::from(model.hidden) * u128::from(model.expert_ffn)
}

/// Parameters of one layer every GPU of an expert-parallel group holds whole:
/// attention, router and shared experts.
pub fn replicated_params_per_layer(model: &ModelConfig) -> u128 {
    attention_params_per_layer(model)
        + u128::from(model.hidden) * u128::from(model.experts)
        + u128::from(model.shared_experts) * expert_params(model)
}

/// Training-state bytes of one layer on one GPU of an `ep`-way expert-parallel group:
/// `16·(4d² + dE + m·E_s·d·d_ffn) + 16·m·(E/EP)·d·d_ffn`, i.e. the paper's
/// `64d² + (48E/EP)·d·d_ffn` plus the router and shared experts.
pub fn state_bytes_per_layer(model: &ModelConfig, ep: u64) -> f64 {
    let s = STATE_BYTES_PER_PARAM as f64;
    s * replicated_params_per_layer(model) as f64
        + s * model.experts as f64 / ep as f64 * expert_params(model) as f64
}

/// Attention activations of one layer for `b` sequences: `12·b·s·d + 4·b·H·s²`, or with
/// FlashAttention `12·b·s·d + 4·b·H·s`.
pub fn attention_activation_bytes(model: &ModelConfig, b: f64, s: f64, opt: MemoryOptions) -> f64 {
    let (d, h) = (model.hidden as f64, model.heads as f64);
    let scores = if opt.flash_attention {
        4.0 * b * h * s
    } else {
        4.0 * b * h * s * s
    };
    12.0 * b * s * d + scores
}

/// Routed-expert activations of one layer for `b` sequences on one of `ep` GPUs:
/// `2·b·s·k·(m·d_ffn + d) / EP` (the paper's `2bsk(3d_ffn + d)` for m = 3; a plain FFN
/// keeps two d_ffn-sized tensors per token, SwiGLU three), plus the shared experts'
/// `2·b·s·E_s·(m·d_ffn + d)`, not divided.
pub fn expert_activation_bytes(model: &ModelConfig, b: f64, s: f64, ep: u64) -> f64 {
    let per_token = (model.expert_matrices * model.expert_ffn + model.hidden) as f64;
    2.0 * b * s * model.top_k as f64 * per_token / ep as f64
        + 2.0 * b * s * model.shared_experts as f64 * per_token
}

/// All activations one layer keeps for `b` sequences on one of `ep` GPUs, without
/// checkpointing.
pub fn layer_activation_bytes(
    model: &ModelConfig,
    b: f64,
    s: f64,
    ep: u64,
    opt: MemoryOptions,
) -> f64 {
    attention_activation_bytes(model, b, s, opt) + expert_activation_bytes(model, b, s, ep)
}

/// What one layer keeps per micro-batch in flight: everything, or with checkpointing
/// only its input `2·b·s·d`.
pub fn stored_activation_bytes(
    model: &ModelConfig,
    b: f64,
    s: f64,
    ep: u64,
    opt: MemoryOptions,
) -> f64 {
    if opt.checkpointing {
        ACTIVATION_BYTES * b * s * model.hidden as f64
    } else {
        layer_activation_bytes(model, b, s, ep, opt)
    }
}

/// Recomputation working set under checkpointing: one layer's activations for one
/// batch of `b` sequences (0 without checkpointing).
fn recompute_bytes(model: &ModelConfig, b: f64, s: f64, ep: u64, opt: MemoryOptions) -> f64 {
    if opt.checkpointing {
        layer_activation_bytes(model, b, s, ep, opt)
    } else {
        0.0
    }
}

/// `M_u`: unpartitioned memory (one GPU holds everything, batch `b`):
/// `L·(64d² + 48E·d·d_ffn + 12bsd + 4Hbs² + 2bsk(3d_ffn + d))`.
pub fn unpartitioned_bytes(model: &ModelConfig, b: f64, s: f64, opt: MemoryOptions) -> f64 {
    expert_data_parallel_bytes(model, b, s, 1, opt)
}

/// `M_edp`: expert-data parallel over `ep` GPUs, batch `b`: expert state and expert
/// activations divided by EP, attention replicated.
pub fn expert_data_parallel_bytes(
    model: &ModelConfig,
    b: f64,
    s: f64,
    ep: u64,
    opt: MemoryOptions,
) -> f64 {
    model.layers as f64
        * (state_bytes_per_layer(model, ep) + stored_activation_bytes(model, b, s, ep, opt))
        + recompute_bytes(model, b, s, ep, opt)
        + embedding_state_bytes(model)
}

fn embedding_state_bytes(model: &ModelConfig) -> f64 {
    (STATE_BYTES_PER_PARAM * model.vocab.unwrap_or(0) * model.hidden) as f64
}

/// A pipeline x expert-parallel layout's degrees, for the memory equations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct StageShape {
    /// PP: pipeline stages.
    pub pp: u64,
    /// EP: expert-parallel degree (GPUs per stage per replica).
    pub ep: u64,
    /// M: micro-batches per step.
    pub microbatches: u64,
}

impl StageShape {
    /// Checks the layout against the model: each degree positive, `PP <= L`, EP
    /// divides E, M positive.
    ///
    /// # Errors
    /// [`PiperError::Invalid`] naming `pp`, `ep` or `microbatches`.
    pub fn validate(&self, model: &ModelConfig) -> Result<()> {
        for (field, v) in [
            ("pp", self.pp),
            ("ep", self.ep),
            ("microbatches", self.microbatches),
        ] {
            if v == 0 {
                return Err(PiperError::invalid(
                    "layout",
                    field,
                    "must be a positive integer, got 0",
                ));
            }
        }
        if self.pp > model.layers {
            return Err(PiperError::invalid(
                "layout",
                "pp",
                format!(
                    "{} stages is more than the model's {} layers",
                    self.pp, model.layers
                ),
            ));
        }
        if model.experts % self.ep != 0 {
            return Err(PiperError::invalid(
                "layout",
                "ep",
                format!(
                    "EP {} does not divide the {} experts",
                    self.ep, model.experts
                ),
            ));
        }
        Ok(())
    }
}

/// Layers of stage `i` of `pp`: `L/PP` each when PP divides L; otherwise the last
/// `L mod PP` stages take one more (they hold the fewest micro-batches in flight).
pub fn stage_layers(layers: u64, pp: u64, i: u64) -> u64 {
    let (base, rem) = (layers / pp, layers % pp);
    base + u64::from(i >= pp - rem)
}

/// Micro-batches stage `i` holds in flight under 1F1B: `PP - i` (at most M).
pub fn in_flight(shape: StageShape, i: u64) -> u64 {
    (shape.pp - i).min(shape.microbatches)
}

/// `M(i)`: bytes on one GPU of pipeline stage `i` under 1F1B with `b` sequences per
/// step (per data-parallel replica) split into M micro-batches:
///
/// `M(i) = (L/PP)·[64d² + (48E/EP)·d·d_ffn + (PP - i)·((12b/M)·s·d + (4b/M)·H·s² + (2bsk/(M·EP))·(3d_ffn + d))]`
///
/// (with FlashAttention the `s²` term becomes `s`; with checkpointing each layer keeps
/// `2(b/M)sd` per micro-batch plus one layer's recomputation working set; stage 0 adds
/// the input embedding and the last stage the output head when the model has a
/// vocabulary).
pub fn stage_bytes(
    model: &ModelConfig,
    shape: StageShape,
    i: u64,
    b: f64,
    s: f64,
    opt: MemoryOptions,
) -> f64 {
    let mb = b / shape.microbatches as f64;
    let layers = stage_layers(model.layers, shape.pp, i) as f64;
    let held = in_flight(shape, i) as f64;
    let mut bytes = layers
        * (state_bytes_per_layer(model, shape.ep)
            + held * stored_activation_bytes(model, mb, s, shape.ep, opt))
        + recompute_bytes(model, mb, s, shape.ep, opt);
    let emb = (STATE_BYTES_PER_PARAM * model.vocab.unwrap_or(0) * model.hidden) as f64;
    if i == 0 {
        bytes += emb;
    }
    if i == shape.pp - 1 {
        bytes += emb;
    }
    bytes
}

/// `M(i)` for every stage, 0 to PP-1.
pub fn stages_bytes(
    model: &ModelConfig,
    shape: StageShape,
    b: f64,
    s: f64,
    opt: MemoryOptions,
) -> Vec<f64> {
    (0..shape.pp)
        .map(|i| stage_bytes(model, shape, i, b, s, opt))
        .collect()
}

/// The skew `M(0) - M(PP-1)`: how much more the first stage needs than the last.
pub fn skew_bytes(
    model: &ModelConfig,
    shape: StageShape,
    b: f64,
    s: f64,
    opt: MemoryOptions,
) -> f64 {
    stage_bytes(model, shape, 0, b, s, opt) - stage_bytes(model, shape, shape.pp - 1, b, s, opt)
}

/// Bytes one GPU sends in one all-to-all (dispatch or combine) of an `ep`-way group for
/// `b` sequences: `2·b·s·k·d / EP` (bf16 tokens, k copies, the group's tokens spread
/// evenly over its GPUs; the share a GPU keeps for itself included).
pub fn a2a_bytes_per_gpu(model: &ModelConfig, b: f64, s: f64, ep: u64) -> f64 {
    ACTIVATION_BYTES * b * s * model.top_k as f64 * model.hidden as f64 / ep as f64
}

/// The paper's lower bound on the forward all-to-all time of one MoE layer (dispatch
/// and combine, balanced load, NICs saturated): `4·b·s·k·d / (EP·B_NIC)` seconds, with
/// `B_NIC` the network bandwidth per GPU in bytes per second. A training step has
/// twice this per layer and batch (four all-to-alls).
pub fn a2a_lower_bound_seconds(model: &ModelConfig, b: f64, s: f64, ep: u64, b_nic: f64) -> f64 {
    4.0 * b * s * model.top_k as f64 * model.hidden as f64 / (ep as f64 * b_nic)
}

/// Bytes a stage boundary carries per micro-batch of `b` sequences and direction (the
/// activations forward, their gradient backward): `2·b·s·d`, split over the `ep` GPUs
/// of the stage, each sending its share to its counterpart point-to-point.
pub fn p2p_bytes(model: &ModelConfig, b: f64, s: f64) -> f64 {
    ACTIVATION_BYTES * b * s * model.hidden as f64
}

/// Bytes that move with one expert when it migrates: its parameters, gradients and
/// optimizer state, `16·m·d·d_ffn` (the paper's `48·d·d_ffn` for SwiGLU experts).
pub fn migration_expert_bytes(model: &ModelConfig) -> f64 {
    (STATE_BYTES_PER_PARAM as u128 * expert_params(model)) as f64
}

/// Migration cost of the worst case: every expert of one layer moves within a group of
/// `group` GPUs, each GPU sending its `E/G` experts, `48·E·d·d_ffn / G` bytes per GPU
/// (SwiGLU), and the time over a link of `bandwidth` bytes per second.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct MigrationCost {
    /// Bytes that move with one expert.
    pub expert_bytes: f64,
    /// Experts each GPU of the group holds of one layer: `E / G`.
    pub experts_per_gpu: u64,
    /// Worst-case bytes each GPU sends for one layer.
    pub per_gpu_bytes: f64,
    /// `per_gpu_bytes / bandwidth`, seconds.
    pub seconds: f64,
}

/// The worst-case migration of one layer's experts in a group of `group` GPUs over
/// links of `bandwidth` bytes per second.
///
/// # Errors
/// [`PiperError::Invalid`] naming `group` (zero, or not dividing E: a migration group
/// is an expert-parallel group) or `bandwidth` (not a positive, finite number).
pub fn migration_cost(model: &ModelConfig, group: u64, bandwidth: f64) -> Result<MigrationCost> {
    if group == 0 || model.experts % group != 0 {
        return Err(PiperError::invalid(
            "migration",
            "group",
            format!(
                "a group of {group} GPUs does not divide the {} experts (it is an expert-parallel group)",
                model.experts
            ),
        ));
    }
    if !(bandwidth.is_finite() && bandwidth > 0.0) {
        return Err(PiperError::invalid(
            "migration",
            "bandwidth",
            format!("must be a positive number of bytes per second, got {bandwidth}"),
        ));
    }
    let expert_bytes = migration_expert_bytes(model);
    let per_gpu_bytes = expert_bytes * model.experts as f64 / group as f64;
    Ok(MigrationCost {
        expert_bytes,
        experts_per_gpu: model.experts / group,
        per_gpu_bytes,
        seconds: per_gpu_bytes / bandwidth,
    })
}

/// Model FLOPs of one token's forward pass through the whole model:
/// per layer `8d²` (projections) `+ 4·s·d` (scores and weighted sum, no causal
/// discount) `+ 2·k·m·d·d_ffn` (routed experts) `+ 2·E_s·m·d·d_ffn` (shared) `+ 2·d·E`
/// (router), plus `2·V·d` for the output head. A training step costs three times this
/// per token (forward, and backward at twice the forward), the convention MFU is
/// computed with; recomputation is not counted.
pub fn forward_flops_per_token(model: &ModelConfig, s: f64) -> f64 {
    let (d, f, m) = (
        model.hidden as f64,
        model.expert_ffn as f64,
        model.expert_matrices as f64,
    );
    let layer = 8.0 * d * d
        + 4.0 * s * d
        + 2.0 * model.top_k as f64 * m * d * f
        + 2.0 * model.shared_experts as f64 * m * d * f
        + 2.0 * d * model.experts as f64;
    model.layers as f64 * layer + 2.0 * model.vocab.unwrap_or(0) as f64 * d
}

/// Model FLOPs of one training step of `b` sequences of length `s`.
pub fn step_flops(model: &ModelConfig, b: f64, s: f64) -> f64 {
    3.0 * b * s * forward_flops_per_token(model, s)
}
