//! Reference Mixture-of-Experts model for HALO: f32, CPU, deterministic, in pieces.
//!
//! The model is a decoder-only transformer whose every feed-forward layer is a routed MoE:
//!
//! ```text
//! x0 = tok_emb[token] + pos_emb[position]                      embed_forward      (stage 0)
//! for each of L blocks:
//!     h = x + Wo * causal_mha(RMSNorm1(x))                    dense_forward
//!     u = RMSNorm2(h)                                          (dense_forward)
//!     top-k experts and gates from softmax(u * Wr)            router_forward
//!     y[t,j] = expert_{e(t,j)}(u[t])                          expert_forward     (on the expert's rank)
//!     x = h + sum_j gate[t,j] * y[t,j]                        combine_forward
//! loss = sum_t CE(softmax(RMSNorm(x[t]) * Wout), target[t]) / normaliser   head_loss_forward (last stage)
//! ```
//!
//! Choices: learned positions; RMSNorm (pre-norm); no biases; experts of 2 matrices (GELU,
//! tanh form) or 3 (SwiGLU) by [`MoeConfig::expert_matrices`]; the top-k gates are the
//! chosen softmax probabilities, renormalised over the k when
//! [`MoeConfig::renormalize_gates`] is set (the presets do, as Mixtral); no auxiliary
//! load-balancing loss; the top-k choice is treated as constant in the backward.
//!
//! # Pieces
//!
//! Each piece is a forward function returning its outputs and an explicit saved state, and a
//! backward function taking that state and the output gradients, accumulating its parameter
//! gradients into a caller-owned group and returning the input gradient. An executor places
//! embed and head on the first and last pipeline stages, dense and router with each block,
//! and each expert on its own EP rank; [`forward_backward`] chains the same pieces on one
//! rank and is the reference that executor is checked against.
//!
//! | piece | forward | backward |
//! |---|---|---|
//! | embedding | [`embed_forward`] | [`embed_backward`] |
//! | attention part | [`dense_forward`] -> [`DenseOutput`] `{h, u}` | [`dense_backward`] (`d_h`, `d_u`) |
//! | router | [`router_forward`] -> [`Routing`] | [`router_backward`] (`d_gates`) |
//! | expert | [`expert_forward`] (rows in any order) | [`expert_backward`] |
//! | combine | [`combine_forward`] | [`combine_backward`] -> [`CombineGrads`], then [`moe_input_backward`] |
//! | head + loss | [`head_loss_forward`] | [`head_loss_backward`] |
//!
//! Dispatch helpers: [`Routing::slots_of`] (an expert's slots, in token order),
//! [`gather_tokens`] (its input rows), [`scatter_slots`] (its outputs back into the
//! slot-indexed `expert_out`), [`gather_slots`] (its part of `d_expert_out`).
//!
//! Buffers are row-major `f32`: activations `rows x hidden` where `rows` is a whole number of
//! sequences for the pieces that see sequences (embed, dense; attention never crosses a
//! sequence); slot-indexed buffers `rows x top_k x hidden`, slot `j` of token `t` at row
//! `t * top_k + j`.
//!
//! # Determinism and exactness
//!
//! All products are plain loops (a private module) with one fixed summation order per
//! output element, so: the same inputs give the same bits; a token's activations do not
//! depend on which other tokens share its batch (sequences for attention); and every
//! parameter gradient accumulates row by row in the order the rows are given. Hence
//! [`forward_backward_into`] over consecutive parts of a batch gives bit-for-bit the
//! full batch's gradients, and an executor that feeds each expert its rows in token order
//! reproduces the reference exactly (all-reduce of replicated gradients reorders sums, so
//! there the agreement is to rounding). No matrix-product crate is used: at these sizes
//! (d <= 128) vectorised plain loops are fast enough (a `tiny` training step of 4
//! sequences takes tens of milliseconds in a release build), and they make the summation
//! order a documented property of this crate rather than of a dependency's kernels and
//! CPU-feature dispatch. Parameters are initialised from a hand-written SplitMix64
//! ([`SplitMix64`]), with one independent stream per parameter group, so a rank that owns
//! one expert initialises it exactly as the reference does.
//!
//! # Example
//!
//! ```
//! use halo_moe::{Adam, AdamConfig, MoeConfig, MoeParams, Task, TaskConfig, forward_backward};
//!
//! # fn main() -> Result<(), halo_moe::MoeError> {
//! let mut cfg = MoeConfig::tiny();
//! cfg.layers = 1; // keep the doc test quick
//! let mut params = MoeParams::init(&cfg, 42)?;
//! let task = Task::new(&cfg, TaskConfig::default())?;
//! let mut adam = Adam::new(AdamConfig { lr: 1e-2, ..AdamConfig::default() })?;
//! let mut first = None;
//! for step in 0..5 {
//!     let batch = task.batch(step, 2);
//!     let n = batch.tokens.len() as f32; // normaliser: tokens of the global batch
//!     let (loss, grads) = forward_backward(&params, &batch.tokens, &batch.targets, n)?;
//!     first.get_or_insert(loss);
//!     adam.step(&mut params, &grads)?;
//! }
//! let batch = task.batch(0, 2);
//! let after = halo_moe::forward_loss(&params, &batch.tokens, &batch.targets, 64.0)?;
//! assert!(after < first.unwrap());
//! # Ok(())
//! # }
//! ```
//!
//! # Synthetic task
//!
//! See [`Task`]: class-conditioned random successor chains, optionally Zipf-skewed.
//!
//! # Memory
//!
//! See [`Adam`]: 16 bytes per parameter (f32 weight, gradient, `m`, `v`). Each saved state
//! reports its activation bytes (`bytes()`).

mod adam;
mod combine;
mod config;
mod dense;
mod embed;
mod error;
mod expert;
mod head;
mod linalg;
mod model;
mod norm;
mod params;
mod rng;
mod router;
mod task;

pub use adam::{Adam, AdamConfig, AdamState};
pub use combine::{
    CombineGrads, CombineSaved, combine_backward, combine_forward, gather_slots, gather_tokens,
    moe_input_backward, scatter_slots,
};
pub use config::{ExpertKind, MoeConfig};
pub use dense::{DenseOutput, DenseSaved, dense_backward, dense_forward};
pub use embed::{embed_backward, embed_forward};
pub use error::{MoeError, Result};
pub use expert::{ExpertSaved, expert_backward, expert_forward};
pub use head::{HeadSaved, head_loss_backward, head_loss_forward};
pub use model::{forward_backward, forward_backward_into, forward_loss, forward_loss_routed};
pub use params::{
    DenseParams, EmbedParams, ExpertParams, GroupId, HeadParams, LayerParams, MoeGrads, MoeParams,
    ParamGroup, RouterParams,
};
pub use rng::SplitMix64;
pub use router::{RouterSaved, Routing, check_routing, router_backward, router_forward};
pub use task::{Batch, Task, TaskConfig};
