//! The whole model on one rank, built from exactly the pieces an executor places.

use crate::combine::{
    CombineSaved, combine_backward, combine_forward, gather_slots, gather_tokens,
    moe_input_backward, scatter_slots,
};
use crate::dense::{DenseSaved, dense_backward, dense_forward};
use crate::embed::{embed_backward, embed_forward};
use crate::error::{MoeError, Result};
use crate::expert::{ExpertSaved, expert_backward, expert_forward};
use crate::head::{head_loss_backward, head_loss_forward};
use crate::params::{MoeGrads, MoeParams};
use crate::router::{RouterSaved, Routing, router_backward, router_forward};

/// Saved state of one block's forward on one rank.
struct BlockTape {
    dense: DenseSaved,
    router: RouterSaved,
    routing: Routing,
    /// Per expert: its slots (row order of its batch) and its saved state.
    experts: Vec<(Vec<usize>, Option<ExpertSaved>)>,
    combine: CombineSaved,
}

/// One block's MoE forward given the dense output, by the reference dispatch: for each
/// expert in id order, its slots in token order.
fn block_forward(params: &MoeParams, l: usize, x: &[f32]) -> Result<(Vec<f32>, BlockTape)> {
    let cfg = params.config();
    let lp = &params.layers[l];
    let (d, k) = (cfg.hidden, cfg.top_k);
    let (dout, dsaved) = dense_forward(cfg, &lp.dense, x)?;
    let (routing, rsaved) = router_forward(cfg, &lp.router, &dout.u)?;
    let rows = dout.u.len() / d;
    let mut expert_out = vec![0.0; rows * k * d];
    let mut experts = Vec::with_capacity(cfg.experts);
    for (e, ep) in lp.experts.iter().enumerate() {
        let slots = routing.slots_of(e);
        if slots.is_empty() {
            experts.push((slots, None));
            continue;
        }
        let xin = gather_tokens(&dout.u, d, k, &slots)?;
        let (y, es) = expert_forward(cfg, ep, &xin)?;
        scatter_slots(&y, d, &slots, &mut expert_out)?;
        experts.push((slots, Some(es)));
    }
    let (out, csaved) = combine_forward(cfg, &dout.h, &routing.gates, &expert_out)?;
    let tape = BlockTape {
        dense: dsaved,
        router: rsaved,
        routing,
        experts,
        combine: csaved,
    };
    Ok((out, tape))
}

fn check_inputs(params: &MoeParams, tokens: &[u32], targets: &[u32]) -> Result<()> {
    params.check_shape()?;
    if targets.len() != tokens.len() {
        return Err(MoeError::Shape {
            what: "targets",
            expected: tokens.len(),
            got: targets.len(),
        });
    }
    Ok(())
}

/// Mean cross-entropy loss (sum over the tokens / `normaliser`) of the model on `tokens`
/// (whole sequences) against next-token `targets`, forward only.
pub fn forward_loss(
    params: &MoeParams,
    tokens: &[u32],
    targets: &[u32],
    normaliser: f32,
) -> Result<f64> {
    check_inputs(params, tokens, targets)?;
    let cfg = params.config();
    let mut x = embed_forward(cfg, &params.embed, tokens)?;
    for l in 0..cfg.layers {
        x = block_forward(params, l, &x)?.0;
    }
    Ok(head_loss_forward(cfg, &params.head, &x, targets, normaliser)?.0)
}

/// As [`forward_loss`], also returning every block's [`Routing`] (e.g. for expert-load
/// statistics, or to check that a perturbation did not change any top-k choice).
pub fn forward_loss_routed(
    params: &MoeParams,
    tokens: &[u32],
    targets: &[u32],
    normaliser: f32,
) -> Result<(f64, Vec<Routing>)> {
    check_inputs(params, tokens, targets)?;
    let cfg = params.config();
    let mut x = embed_forward(cfg, &params.embed, tokens)?;
    let mut routings = Vec::with_capacity(cfg.layers);
    for l in 0..cfg.layers {
        let (out, tape) = block_forward(params, l, &x)?;
        routings.push(tape.routing);
        x = out;
    }
    let loss = head_loss_forward(cfg, &params.head, &x, targets, normaliser)?.0;
    Ok((loss, routings))
}

/// Loss and gradients of the whole model on one rank: the single-rank reference.
///
/// Built from the pieces exactly as an executor would chain them: [`crate::embed_forward`];
/// per block [`crate::dense_forward`], [`crate::router_forward`], for each expert in id order
/// [`crate::gather_tokens`] of [`crate::Routing::slots_of`] then [`crate::expert_forward`]
/// then [`crate::scatter_slots`], [`crate::combine_forward`]; [`crate::head_loss_forward`];
/// and the backward in reverse ([`crate::combine_backward`], each expert's
/// [`crate::expert_backward`] on [`crate::gather_slots`] of `d_expert_out`,
/// [`crate::router_backward`], [`crate::moe_input_backward`], [`crate::dense_backward`],
/// [`crate::embed_backward`]).
///
/// `normaliser` is the token count of the global batch (see [`crate::head_loss_forward`]).
pub fn forward_backward(
    params: &MoeParams,
    tokens: &[u32],
    targets: &[u32],
    normaliser: f32,
) -> Result<(f64, MoeGrads)> {
    let mut grads = MoeParams::zeros(params.config())?;
    let loss = forward_backward_into(params, tokens, targets, normaliser, &mut grads)?;
    Ok((loss, grads))
}

/// As [`forward_backward`], but adds the gradients into `grads` (which must have the same
/// configuration). Every gradient accumulates row by row in token order, so calling this on
/// consecutive parts of a batch (whole sequences, in order, same `normaliser`) gives
/// bit-for-bit the gradients of one call on the whole batch; the returned losses sum to the
/// whole batch's loss up to rounding (they are f64).
pub fn forward_backward_into(
    params: &MoeParams,
    tokens: &[u32],
    targets: &[u32],
    normaliser: f32,
    grads: &mut MoeGrads,
) -> Result<f64> {
    check_inputs(params, tokens, targets)?;
    params.check_same_shape(grads)?;
    let cfg = params.config();
    let d = cfg.hidden;

    let mut x = embed_forward(cfg, &params.embed, tokens)?;
    let mut tapes = Vec::with_capacity(cfg.layers);
    for l in 0..cfg.layers {
        let (out, tape) = block_forward(params, l, &x)?;
        tapes.push(tape);
        x = out;
    }
    let (loss, hsaved) = head_loss_forward(cfg, &params.head, &x, targets, normaliser)?;

    let mut dx = head_loss_backward(cfg, &params.head, &hsaved, &mut grads.head)?;
    for (l, tape) in tapes.iter().enumerate().rev() {
        let lp = &params.layers[l];
        let gl = &mut grads.layers[l];
        let cg = combine_backward(cfg, &tape.combine, &dx)?;
        let mut d_expert_in = vec![0.0; cg.d_expert_out.len()];
        for (e, (slots, es)) in tape.experts.iter().enumerate() {
            let Some(es) = es else { continue };
            let dy = gather_slots(&cg.d_expert_out, d, slots)?;
            let dxe = expert_backward(cfg, &lp.experts[e], es, &dy, &mut gl.experts[e])?;
            scatter_slots(&dxe, d, slots, &mut d_expert_in)?;
        }
        debug_assert_eq!(tape.routing.top_k, cfg.top_k);
        let d_router = router_backward(cfg, &lp.router, &tape.router, &cg.d_gates, &mut gl.router)?;
        let du = moe_input_backward(cfg, &d_router, &d_expert_in)?;
        dx = dense_backward(cfg, &lp.dense, &tape.dense, &cg.d_h, &du, &mut gl.dense)?;
    }
    embed_backward(cfg, tokens, &dx, &mut grads.embed)?;
    Ok(loss)
}
