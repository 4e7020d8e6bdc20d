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
        if !model.experts.is_multiple_of(self.ep) {
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
    if group == 0 || !model.experts.is_multiple_of(group) {
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

#[cfg(test)]
mod tests {
    //! Every equation against values computed by hand (in the comments) on a small
    //! model, and on one preset per family: Mixtral (routed experts only), DeepSeek-V2
    //! (shared experts), the weak-scaling family (two-matrix experts).
    use super::*;

    /// L 4, d 64, H 4, E 4, k 2, d_ffn 128, SwiGLU.
    fn tiny() -> ModelConfig {
        ModelConfig {
            name: "tiny".into(),
            layers: 4,
            hidden: 64,
            heads: 4,
            experts: 4,
            shared_experts: 0,
            top_k: 2,
            expert_ffn: 128,
            expert_matrices: 3,
            vocab: None,
        }
    }

    const FLASH: MemoryOptions = MemoryOptions {
        flash_attention: true,
        checkpointing: false,
    };
    const PLAIN: MemoryOptions = MemoryOptions {
        flash_attention: false,
        checkpointing: false,
    };
    const CKPT: MemoryOptions = MemoryOptions {
        flash_attention: true,
        checkpointing: true,
    };

    #[test]
    fn tiny_params() {
        let p = params(&tiny());
        // attention 4 x 4*64^2 = 65,536; one expert 3*64*128 = 24,576; experts 4*4*24,576.
        assert_eq!(p.attention, 65_536);
        assert_eq!(expert_params(&tiny()), 24_576);
        assert_eq!(p.experts, 393_216);
        assert_eq!(p.router, 1_024); // 4 x 64*4
        assert_eq!(p.shared_experts, 0);
        assert_eq!(p.embedding, 0);
        assert_eq!(p.total, 459_776);
        // active: attention + router + 4 layers x 2 experts x 24,576.
        assert_eq!(p.active, 65_536 + 1_024 + 196_608);
        let mut v = tiny();
        v.vocab = Some(1000);
        assert_eq!(params(&v).embedding, 2 * 1000 * 64);
        assert_eq!(params(&v).total, 459_776 + 128_000);
    }

    #[test]
    fn tiny_memory_per_stage() {
        let m = tiny();
        let shape = StageShape {
            pp: 2,
            ep: 2,
            microbatches: 4,
        };
        shape.validate(&m).unwrap();
        // State per layer at EP 2: 16*(16,384 + 256) + 16*(4/2)*24,576 = 1,052,672.
        assert_eq!(state_bytes_per_layer(&m, 2), 1_052_672.0);
        // b = 8, M = 4: 2 sequences of 16 per micro-batch.
        // attention 12*2*16*64 + 4*2*4*16 = 25,088 (flash) or + 4*2*4*256 = 32,768 (plain)
        assert_eq!(attention_activation_bytes(&m, 2.0, 16.0, FLASH), 25_088.0);
        assert_eq!(attention_activation_bytes(&m, 2.0, 16.0, PLAIN), 32_768.0);
        // experts 2*2*16*2*(3*128 + 64)/2 = 28,672
        assert_eq!(expert_activation_bytes(&m, 2.0, 16.0, 2), 28_672.0);
        // M(0) = 2 layers x (1,052,672 + 2 in flight x 53,760); M(1) with 1 in flight.
        let st = stages_bytes(&m, shape, 8.0, 16.0, FLASH);
        assert_eq!(st, vec![2_320_384.0, 2_212_864.0]);
        assert_eq!(skew_bytes(&m, shape, 8.0, 16.0, FLASH), 107_520.0);
        // The paper's formula as written (plain attention), plus the router's 16*d*E:
        // (L/PP)[64d^2 + (48E/EP) d d_ffn + (PP-i)((12b/M)sd + (4b/M)Hs^2 + (2bsk/(M EP))(3d_ffn+d))]
        let (d, e, f, h, s, b, mm, ep, pp) = (64.0, 4.0, 128.0, 4.0, 16.0, 8.0, 4.0, 2.0, 2.0);
        let paper = |i: f64| {
            2.0 * (64.0 * d * d
                + 48.0 * e / ep * d * f
                + 16.0 * d * e
                + (pp - i)
                    * (12.0 * b / mm * s * d
                        + 4.0 * b / mm * h * s * s
                        + 2.0 * b * s * 2.0 / (mm * ep) * (3.0 * f + d)))
        };
        assert_eq!(paper(0.0), 2_351_104.0);
        let plain = stages_bytes(&m, shape, 8.0, 16.0, PLAIN);
        assert_eq!(plain, vec![paper(0.0), paper(1.0)]);
        // Checkpointing: 2*2*16*64 = 4,096 per layer and micro-batch, plus one layer's
        // activations (53,760) to recompute: 2*(1,052,672 + 2*4,096) + 53,760.
        assert_eq!(stage_bytes(&m, shape, 0, 8.0, 16.0, CKPT), 2_175_488.0);
        // Fewer micro-batches than stages: at most M in flight.
        let few = StageShape {
            pp: 4,
            ep: 1,
            microbatches: 2,
        };
        assert_eq!(in_flight(few, 0), 2);
        assert_eq!(in_flight(few, 3), 1);
    }

    #[test]
    fn tiny_unpartitioned_and_edp() {
        let m = tiny();
        // Per layer at EP 1: 16*16,640 + 16*4*24,576 = 1,839,104; activations for b = 8:
        // 12*8*16*64 + 4*8*4*16 = 100,352 and 2*8*16*2*448 = 229,376.
        assert_eq!(unpartitioned_bytes(&m, 8.0, 16.0, FLASH), 4.0 * 2_168_832.0);
        // EP 2: 1,052,672 + 100,352 + 114,688 per layer.
        assert_eq!(
            expert_data_parallel_bytes(&m, 8.0, 16.0, 2, FLASH),
            4.0 * 1_267_712.0
        );
        // Plain attention adds 4*8*4*16*16 - 4*8*4*16 per layer.
        assert_eq!(
            unpartitioned_bytes(&m, 8.0, 16.0, PLAIN) - unpartitioned_bytes(&m, 8.0, 16.0, FLASH),
            4.0 * (32_768.0 - 2_048.0)
        );
    }

    #[test]
    fn tiny_communication_and_flops() {
        let m = tiny();
        // 2*b*s*k*d/EP with b = 2, s = 16, k = 2, d = 64, EP = 2.
        assert_eq!(a2a_bytes_per_gpu(&m, 2.0, 16.0, 2), 4_096.0);
        // 4*b*s*k*d/(EP*B) = 16,384 / (2 * 1e9)
        assert_eq!(a2a_lower_bound_seconds(&m, 2.0, 16.0, 2, 1e9), 8.192e-6);
        assert_eq!(A2A_PER_MOE_LAYER, 4);
        assert_eq!(p2p_bytes(&m, 2.0, 16.0), 4_096.0);
        // Per layer 8*64^2 + 4*16*64 + 2*2*3*64*128 + 2*64*4 = 135,680; 4 layers.
        assert_eq!(forward_flops_per_token(&m, 16.0), 542_720.0);
        assert_eq!(step_flops(&m, 8.0, 16.0), 3.0 * 128.0 * 542_720.0);
    }

    #[test]
    fn tiny_migration() {
        let m = tiny();
        // 16 * 3 * 64 * 128 = 393,216 bytes per expert; E/G = 2 experts per GPU.
        let c = migration_cost(&m, 2, 1e6).unwrap();
        assert_eq!(c.expert_bytes, 393_216.0);
        assert_eq!(c.experts_per_gpu, 2);
        assert_eq!(c.per_gpu_bytes, 786_432.0);
        assert_eq!(c.seconds, 0.786_432);
        for (g, bw, field) in [
            (3, 1e6, "group"),
            (0, 1e6, "group"),
            (2, 0.0, "bandwidth"),
            (2, f64::NAN, "bandwidth"),
        ] {
            let e = migration_cost(&m, g, bw).unwrap_err().to_string();
            assert!(e.contains(field), "{e}");
        }
    }

    #[test]
    fn layout_validation_names_the_field() {
        let m = tiny();
        let bad = |pp, ep, microbatches| {
            StageShape {
                pp,
                ep,
                microbatches,
            }
            .validate(&m)
            .unwrap_err()
            .to_string()
        };
        assert!(bad(5, 1, 1).contains("pp"));
        assert!(bad(1, 3, 1).contains("ep: EP 3 does not divide the 4 experts"));
        assert!(bad(1, 1, 0).contains("microbatches"));
        assert!(bad(0, 1, 1).contains("pp"));
    }

    #[test]
    fn uneven_stages_give_the_last_ones_more_layers() {
        assert_eq!(
            (0..4).map(|i| stage_layers(61, 4, i)).collect::<Vec<_>>(),
            [15, 15, 15, 16]
        );
        assert_eq!(
            (0..3).map(|i| stage_layers(32, 3, i)).collect::<Vec<_>>(),
            [10, 11, 11]
        );
        assert_eq!((0..8).map(|i| stage_layers(32, 8, i)).sum::<u64>(), 32);
    }

    #[test]
    fn mixtral_8x7b() {
        let m = ModelConfig::preset("mixtral-8x7b").unwrap();
        let p = params(&m);
        // 32 * 4 * 4096^2; 32 * 8 * 3 * 4096 * 14336; 32 * 4096 * 8.
        assert_eq!(p.attention, 2_147_483_648);
        assert_eq!(p.experts, 45_097_156_608);
        assert_eq!(p.router, 1_048_576);
        assert_eq!(p.total, 47_245_688_832);
        assert_eq!(p.active, 13_422_821_376);
        // PP 8 x EP 8, M = 256, b = 512, s = 4096, FlashAttention: about 32 GiB.
        // State per layer 16*(4*4096^2 + 4096*8) + 16*1*3*4096*14336 = 3,892,838,400;
        // per micro-batch of 2: 12*2*4096*4096 + 4*2*32*4096 = 403,701,760 and
        // 2*2*4096*2*47,104/8 = 192,937,984; stage 0: 4 x (state + 8 x both).
        let shape = StageShape {
            pp: 8,
            ep: 8,
            microbatches: 256,
        };
        assert_eq!(state_bytes_per_layer(&m, 8), 3_892_838_400.0);
        let m0 = stage_bytes(&m, shape, 0, 512.0, 4096.0, FLASH);
        assert_eq!(m0, 34_663_825_408.0);
        assert!((m0 / (1u64 << 30) as f64 - 32.28).abs() < 0.01);
        // Without FlashAttention the 4bHs^2 term (4*2*32*4096^2 per layer and
        // micro-batch) makes it 128 GiB more: no layout of 64 GCDs fits (tests/planner.rs).
        let plain = stage_bytes(&m, shape, 0, 512.0, 4096.0, PLAIN);
        assert_eq!(
            plain - m0,
            4.0 * 8.0 * (4.0 * 2.0 * 32.0 * 4096.0 * 4096.0 - 4.0 * 2.0 * 32.0 * 4096.0)
        );
        // Migration: 48 * 4096 * 14336 per expert; one expert per GPU at G = 8.
        let c = migration_cost(&m, 8, 25e9).unwrap();
        assert_eq!(c.expert_bytes, 2_818_572_288.0);
        assert_eq!(c.per_gpu_bytes, 2_818_572_288.0);
        assert_eq!(c.seconds, 2_818_572_288.0 / 25e9);
        // a2a lower bound, b = 2 per micro-batch, EP 8, 12.5 GB/s per GCD:
        // 4*2*4096*2*4096 / (8 * 12.5e9).
        assert_eq!(
            a2a_lower_bound_seconds(&m, 2.0, 4096.0, 8, 12.5e9),
            268_435_456.0 / 1e11
        );
    }

    #[test]
    fn deepseek_v2_with_shared_experts() {
        let m = ModelConfig::preset("deepseek-v2").unwrap();
        let p = params(&m);
        // one expert 3*5120*1536 = 23,592,960
        assert_eq!(p.attention, 6_291_456_000); // 60 * 4 * 5120^2
        assert_eq!(p.experts, 226_492_416_000); // 60 * 160 * one
        assert_eq!(p.shared_experts, 2_831_155_200); // 60 * 2 * one
        assert_eq!(p.router, 49_152_000); // 60 * 5120 * 160
        assert_eq!(p.total, 235_664_179_200);
        assert_eq!(
            p.active,
            235_664_179_200 - 226_492_416_000 + 60 * 6 * 23_592_960
        );
        // PP 4 x EP 8, M = 8, b = 16, s = 4096. State per layer
        // 16*(4*5120^2 + 5120*160 + 2*one) + 16*20*one = 9,995,550,720; per micro-batch of 2:
        // attention 12*2*4096*5120 + 4*2*128*4096 = 507,510,784; routed 2*2*4096*6*9728/8
        // = 119,537,664; shared 2*2*4096*2*9728 = 318,767,104 (not divided by EP).
        let shape = StageShape {
            pp: 4,
            ep: 8,
            microbatches: 8,
        };
        assert_eq!(state_bytes_per_layer(&m, 8), 9_995_550_720.0);
        assert_eq!(
            expert_activation_bytes(&m, 2.0, 4096.0, 8),
            119_537_664.0 + 318_767_104.0
        );
        assert_eq!(
            stage_bytes(&m, shape, 0, 16.0, 4096.0, FLASH),
            206_682_193_920.0
        );
    }

    #[test]
    fn weak_scaling_family_totals() {
        // Two-matrix experts reproduce the paper's 110B, 862B and 1.7T.
        for (e, total) in [
            (16, 110_732_247_040u128),
            (128, 862_369_873_920),
            (256, 1_721_384_304_640),
        ] {
            let m = ModelConfig::preset(&format!("piper-ws:{e}")).unwrap();
            let p = params(&m);
            // 32 * 4 * 5120^2 + 32 * E * 2 * 5120 * 20480 + 32 * 5120 * E
            assert_eq!(p.attention, 3_355_443_200);
            assert_eq!(p.experts, 32 * e * 2 * 5120 * 20480);
            assert_eq!(p.total, total);
        }
        // SwiGLU experts would give 164B at E = 16 (161B of experts).
        let mut swiglu = ModelConfig::preset("piper-ws:16").unwrap();
        swiglu.expert_matrices = 3;
        assert_eq!(params(&swiglu).experts, 161_061_273_600);
        assert_eq!(params(&swiglu).total, 164_419_338_240);
        // Migration moves 32*d*d_ffn per two-matrix expert, not 48.
        let m = ModelConfig::preset("piper-ws:256").unwrap();
        let c = migration_cost(&m, 32, 25e9).unwrap();
        assert_eq!(c.expert_bytes, 32.0 * 5120.0 * 20480.0);
        assert_eq!(c.per_gpu_bytes, 32.0 * 5120.0 * 20480.0 * 8.0);
    }
}
