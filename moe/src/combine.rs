//! Combine piece (weighted sum of the k expert outputs plus the residual) and the row
//! gather/scatter helpers of a dispatch.

use crate::config::MoeConfig;
use crate::error::{MoeError, Result, check_len, rows_of};
use crate::linalg::{add_into, axpy, dot};

/// What [`combine_backward`] needs: the gate weights and the expert outputs.
#[derive(Debug, Clone)]
pub struct CombineSaved {
    rows: usize,
    gates: Vec<f32>,
    expert_out: Vec<f32>,
}

impl CombineSaved {
    /// Rows (tokens) this state was made for.
    pub fn rows(&self) -> usize {
        self.rows
    }
    /// Bytes held.
    pub fn bytes(&self) -> usize {
        4 * (self.gates.len() + self.expert_out.len())
    }
}

/// Gradients returned by [`combine_backward`].
#[derive(Debug, Clone, PartialEq)]
pub struct CombineGrads {
    /// Gradient of the residual input `h` (`rows x hidden`; equal to `d_out`).
    pub d_h: Vec<f32>,
    /// Gradient of the gate weights (`rows x top_k`), for [`crate::router_backward`].
    pub d_gates: Vec<f32>,
    /// Gradient of each slot's expert output (`rows x top_k x hidden`, slot-indexed like
    /// the forward's `expert_out`): `gate * d_out`, what goes back to the experts.
    pub d_expert_out: Vec<f32>,
}

/// `out[t] = h[t] + gates[t,0] * y[t,0] + gates[t,1] * y[t,1] + ...`, added in slot order.
///
/// `h` is `rows x hidden` ([`crate::DenseOutput::h`]), `gates` is `rows x top_k`
/// ([`crate::Routing::gates`]) and `expert_out` is `rows x top_k x hidden`: row
/// `t * top_k + j` is the output of the expert of slot `j` of token `t` (see
/// [`scatter_slots`]).
pub fn combine_forward(
    cfg: &MoeConfig,
    h: &[f32],
    gates: &[f32],
    expert_out: &[f32],
) -> Result<(Vec<f32>, CombineSaved)> {
    cfg.validate()?;
    let (d, k) = (cfg.hidden, cfg.top_k);
    let rows = rows_of("h", h.len(), d)?;
    check_len("gates", gates.len(), rows * k)?;
    check_len("expert_out", expert_out.len(), rows * k * d)?;
    let mut out = h.to_vec();
    for t in 0..rows {
        let orow = &mut out[t * d..(t + 1) * d];
        for j in 0..k {
            let s = t * k + j;
            axpy(gates[s], &expert_out[s * d..(s + 1) * d], orow);
        }
    }
    Ok((
        out,
        CombineSaved {
            rows,
            gates: gates.to_vec(),
            expert_out: expert_out.to_vec(),
        },
    ))
}

/// Backward of [`combine_forward`] from `d_out` (`rows x hidden`).
pub fn combine_backward(
    cfg: &MoeConfig,
    saved: &CombineSaved,
    d_out: &[f32],
) -> Result<CombineGrads> {
    cfg.validate()?;
    let (d, k) = (cfg.hidden, cfg.top_k);
    let rows = saved.rows;
    check_len("d_out", d_out.len(), rows * d)?;
    check_len("combine saved state", saved.gates.len(), rows * k)?;
    let mut d_gates = vec![0.0; rows * k];
    let mut d_expert_out = vec![0.0; rows * k * d];
    for t in 0..rows {
        let dr = &d_out[t * d..(t + 1) * d];
        for j in 0..k {
            let s = t * k + j;
            d_gates[s] = dot(&saved.expert_out[s * d..(s + 1) * d], dr);
            axpy(saved.gates[s], dr, &mut d_expert_out[s * d..(s + 1) * d]);
        }
    }
    Ok(CombineGrads {
        d_h: d_out.to_vec(),
        d_gates,
        d_expert_out,
    })
}

/// Gradient of the MoE input `u`, added in this order:
/// `d_u[t] = d_router[t] + d_expert_in[t, 0] + ... + d_expert_in[t, k-1]`.
///
/// `d_router` is `rows x hidden` ([`crate::router_backward`]); `d_expert_in` is
/// `rows x top_k x hidden`, slot-indexed (each expert's `d_x` put back with
/// [`scatter_slots`]).
pub fn moe_input_backward(
    cfg: &MoeConfig,
    d_router: &[f32],
    d_expert_in: &[f32],
) -> Result<Vec<f32>> {
    cfg.validate()?;
    let (d, k) = (cfg.hidden, cfg.top_k);
    let rows = rows_of("d_router", d_router.len(), d)?;
    check_len("d_expert_in", d_expert_in.len(), rows * k * d)?;
    let mut du = d_router.to_vec();
    for t in 0..rows {
        let r = &mut du[t * d..(t + 1) * d];
        for j in 0..k {
            let s = t * k + j;
            add_into(&d_expert_in[s * d..(s + 1) * d], r);
        }
    }
    Ok(du)
}

fn check_slots(what: &'static str, slots: &[usize], bound: usize) -> Result<()> {
    match slots.iter().position(|&s| s >= bound) {
        None => Ok(()),
        Some(i) => Err(MoeError::Shape {
            what,
            expected: bound,
            got: slots[i] + 1,
        }),
    }
}

/// Rows of the tokens of `slots` (flat slot indices `t * top_k + j`): row `i` of the result
/// is `u[slots[i] / top_k]`. This is the dispatch buffer of one expert (`u` is
/// `rows x width`).
pub fn gather_tokens(u: &[f32], width: usize, top_k: usize, slots: &[usize]) -> Result<Vec<f32>> {
    let rows = rows_of("u", u.len(), width)?;
    check_slots("slots (token rows)", slots, rows * top_k)?;
    let mut out = Vec::with_capacity(slots.len() * width);
    for &s in slots {
        let t = s / top_k;
        out.extend_from_slice(&u[t * width..(t + 1) * width]);
    }
    Ok(out)
}

/// Rows `slots[i]` of a slot-indexed buffer `x` (`rows x top_k x width`), e.g. the part of
/// [`CombineGrads::d_expert_out`] that goes back to one expert.
pub fn gather_slots(x: &[f32], width: usize, slots: &[usize]) -> Result<Vec<f32>> {
    let n = rows_of("x", x.len(), width)?;
    check_slots("slots", slots, n)?;
    let mut out = Vec::with_capacity(slots.len() * width);
    for &s in slots {
        out.extend_from_slice(&x[s * width..(s + 1) * width]);
    }
    Ok(out)
}

/// Writes row `i` of `rows` (`slots.len() x width`) to row `slots[i]` of the slot-indexed
/// buffer `dst` (`rows x top_k x width`), e.g. an expert's outputs into `expert_out`.
pub fn scatter_slots(rows: &[f32], width: usize, slots: &[usize], dst: &mut [f32]) -> Result<()> {
    check_len("rows", rows.len(), slots.len() * width)?;
    let n = rows_of("dst", dst.len(), width)?;
    check_slots("slots", slots, n)?;
    for (i, &s) in slots.iter().enumerate() {
        dst[s * width..(s + 1) * width].copy_from_slice(&rows[i * width..(i + 1) * width]);
    }
    Ok(())
}
