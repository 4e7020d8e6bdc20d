//! Dense piece: one block's attention part (RMSNorm, causal multi-head self-attention,
//! residual, pre-MoE RMSNorm).

use crate::config::MoeConfig;
use crate::error::{Result, check_len, rows_of, whole_sequences};
use crate::linalg::{add_into, axpy, dot, matmul, matmul_nt, matmul_tn_acc};
use crate::norm::{NormSaved, rms_backward, rms_forward};
use crate::params::DenseParams;

/// Outputs of [`dense_forward`].
#[derive(Debug, Clone, PartialEq)]
pub struct DenseOutput {
    /// Residual stream after attention, `h = x + Attn(RMSNorm1(x))`, `rows x hidden`: the
    /// residual input of [`crate::combine_forward`].
    pub h: Vec<f32>,
    /// MoE input `u = RMSNorm2(h)`, `rows x hidden`: what the router sees and what is
    /// dispatched to the experts.
    pub u: Vec<f32>,
}

/// What [`dense_backward`] needs from the forward (normalised input, q, k, v, attention
/// probabilities, head outputs, norm statistics).
#[derive(Debug, Clone)]
pub struct DenseSaved {
    rows: usize,
    n1: NormSaved,
    a: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    /// Per sequence, per head, `seq x seq` (upper triangle zero).
    probs: Vec<f32>,
    o: Vec<f32>,
    n2: NormSaved,
}

impl DenseSaved {
    /// Rows (tokens) this state was made for.
    pub fn rows(&self) -> usize {
        self.rows
    }
    /// Bytes held (activation memory of this piece).
    pub fn bytes(&self) -> usize {
        self.n1.bytes()
            + self.n2.bytes()
            + 4 * (self.a.len()
                + self.q.len()
                + self.k.len()
                + self.v.len()
                + self.probs.len()
                + self.o.len())
    }
}

/// Forward of one block's attention part over `x` (`rows x hidden`, a whole number of
/// sequences; attention is causal within each sequence and never crosses sequences).
///
/// `h = x + (softmax_causal(q k^T / sqrt(dh)) v) Wo` per head, with `q, k, v = a Wq, a Wk, a Wv`
/// and `a = RMSNorm1(x)`; then `u = RMSNorm2(h)`. Each sequence's result depends only on that
/// sequence.
pub fn dense_forward(
    cfg: &MoeConfig,
    p: &DenseParams,
    x: &[f32],
) -> Result<(DenseOutput, DenseSaved)> {
    cfg.validate()?;
    p.check(cfg, "dense parameters")?;
    let d = cfg.hidden;
    let rows = rows_of("x", x.len(), d)?;
    let nseq = whole_sequences("x", rows, cfg.seq)?;
    let (s, nh, dh) = (cfg.seq, cfg.heads, cfg.head_dim());
    let scale = 1.0 / (dh as f32).sqrt();

    let (a, n1) = rms_forward(x, p.norm1(), d, cfg.norm_eps);
    let mut q = vec![0.0; rows * d];
    let mut k = vec![0.0; rows * d];
    let mut v = vec![0.0; rows * d];
    matmul(&a, p.wq(), rows, d, d, &mut q);
    matmul(&a, p.wk(), rows, d, d, &mut k);
    matmul(&a, p.wv(), rows, d, d, &mut v);

    let mut probs = vec![0.0; nseq * nh * s * s];
    let mut o = vec![0.0; rows * d];
    for b in 0..nseq {
        for h in 0..nh {
            let c0 = h * dh;
            let pbh = &mut probs[(b * nh + h) * s * s..(b * nh + h + 1) * s * s];
            for i in 0..s {
                let ri = b * s + i;
                let qi = &q[ri * d + c0..ri * d + c0 + dh];
                let prow = &mut pbh[i * s..(i + 1) * s];
                let mut mx = f32::NEG_INFINITY;
                for (j, pj) in prow[..=i].iter_mut().enumerate() {
                    let rj = b * s + j;
                    *pj = dot(qi, &k[rj * d + c0..rj * d + c0 + dh]) * scale;
                    mx = mx.max(*pj);
                }
                let mut sum = 0.0f32;
                for pj in &mut prow[..=i] {
                    *pj = (*pj - mx).exp();
                    sum += *pj;
                }
                let inv = 1.0 / sum;
                for pj in &mut prow[..=i] {
                    *pj *= inv;
                }
                let oi = &mut o[ri * d + c0..ri * d + c0 + dh];
                for (j, &pj) in prow[..=i].iter().enumerate() {
                    let rj = b * s + j;
                    axpy(pj, &v[rj * d + c0..rj * d + c0 + dh], oi);
                }
            }
        }
    }
    let mut h = vec![0.0; rows * d];
    matmul(&o, p.wo(), rows, d, d, &mut h);
    add_into(x, &mut h);
    let (u, n2) = rms_forward(&h, p.norm2(), d, cfg.norm_eps);
    Ok((
        DenseOutput { h, u },
        DenseSaved {
            rows,
            n1,
            a,
            q,
            k,
            v,
            probs,
            o,
            n2,
        },
    ))
}

/// Backward of [`dense_forward`]. `d_h` is the gradient reaching the residual stream `h`
/// directly (from the combine's residual path, [`crate::CombineGrads::d_h`]); `d_u` is the
/// gradient of the MoE input (router plus experts, [`crate::moe_input_backward`]).
/// Accumulates this block's parameter gradients into `g` (rows in order) and returns `d_x`.
pub fn dense_backward(
    cfg: &MoeConfig,
    p: &DenseParams,
    saved: &DenseSaved,
    d_h: &[f32],
    d_u: &[f32],
    g: &mut DenseParams,
) -> Result<Vec<f32>> {
    cfg.validate()?;
    p.check(cfg, "dense parameters")?;
    g.check(cfg, "dense gradients")?;
    let d = cfg.hidden;
    let rows = saved.rows;
    check_len("d_h", d_h.len(), rows * d)?;
    check_len("d_u", d_u.len(), rows * d)?;
    check_len("dense saved state", saved.a.len(), rows * d)?;
    let nseq = rows / cfg.seq;
    let (s, nh, dh) = (cfg.seq, cfg.heads, cfg.head_dim());
    let scale = 1.0 / (dh as f32).sqrt();
    let (gn1, gwq, gwk, gwv, gwo, gn2) = g.parts_mut();

    // Pre-MoE norm, then the residual stream's total gradient.
    let mut dhh = rms_backward(d_u, &saved.n2, p.norm2(), d, gn2);
    add_into(d_h, &mut dhh);

    // Output projection.
    matmul_tn_acc(&saved.o, &dhh, rows, d, d, gwo);
    let mut d_o = vec![0.0; rows * d];
    matmul_nt(&dhh, p.wo(), rows, d, d, &mut d_o);

    // Attention, per sequence and head.
    let mut dq = vec![0.0; rows * d];
    let mut dk = vec![0.0; rows * d];
    let mut dv = vec![0.0; rows * d];
    let mut dp = vec![0.0; s];
    for b in 0..nseq {
        for h in 0..nh {
            let c0 = h * dh;
            let pbh = &saved.probs[(b * nh + h) * s * s..(b * nh + h + 1) * s * s];
            for i in 0..s {
                let ri = b * s + i;
                let prow = &pbh[i * s..(i + 1) * s];
                let doi = &d_o[ri * d + c0..ri * d + c0 + dh];
                let mut pdp = 0.0f32;
                for j in 0..=i {
                    let rj = b * s + j;
                    dp[j] = dot(doi, &saved.v[rj * d + c0..rj * d + c0 + dh]);
                    pdp += prow[j] * dp[j];
                    axpy(prow[j], doi, &mut dv[rj * d + c0..rj * d + c0 + dh]);
                }
                for j in 0..=i {
                    let rj = b * s + j;
                    let ds = prow[j] * (dp[j] - pdp) * scale;
                    axpy(
                        ds,
                        &saved.k[rj * d + c0..rj * d + c0 + dh],
                        &mut dq[ri * d + c0..ri * d + c0 + dh],
                    );
                    axpy(
                        ds,
                        &saved.q[ri * d + c0..ri * d + c0 + dh],
                        &mut dk[rj * d + c0..rj * d + c0 + dh],
                    );
                }
            }
        }
    }

    // Projections.
    matmul_tn_acc(&saved.a, &dq, rows, d, d, gwq);
    matmul_tn_acc(&saved.a, &dk, rows, d, d, gwk);
    matmul_tn_acc(&saved.a, &dv, rows, d, d, gwv);
    let mut da = vec![0.0; rows * d];
    let mut tmp = vec![0.0; rows * d];
    matmul_nt(&dq, p.wq(), rows, d, d, &mut da);
    matmul_nt(&dk, p.wk(), rows, d, d, &mut tmp);
    add_into(&tmp, &mut da);
    matmul_nt(&dv, p.wv(), rows, d, d, &mut tmp);
    add_into(&tmp, &mut da);

    // Pre-attention norm and the residual.
    let mut dx = rms_backward(&da, &saved.n1, p.norm1(), d, gn1);
    add_into(&dhh, &mut dx);
    Ok(dx)
}
