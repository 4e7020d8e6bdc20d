//! Head piece (last pipeline stage): final RMSNorm, output matrix, cross-entropy.

use crate::config::MoeConfig;
use crate::error::{MoeError, Result, check_len, check_tokens, rows_of};
use crate::linalg::{matmul, matmul_nt, matmul_tn_acc};
use crate::norm::{NormSaved, rms_backward, rms_forward};
use crate::params::HeadParams;

/// What [`head_loss_backward`] needs.
#[derive(Debug, Clone)]
pub struct HeadSaved {
    rows: usize,
    norm: NormSaved,
    z: Vec<f32>,
    probs: Vec<f32>,
    targets: Vec<u32>,
    normaliser: f32,
}

impl HeadSaved {
    /// Rows (tokens) this state was made for.
    pub fn rows(&self) -> usize {
        self.rows
    }
    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.norm.bytes() + 4 * (self.z.len() + self.probs.len() + self.targets.len())
    }
}

fn check_normaliser(normaliser: f32) -> Result<()> {
    if normaliser.is_finite() && normaliser > 0.0 {
        Ok(())
    } else {
        Err(MoeError::BadNormaliser(normaliser))
    }
}

/// Loss of `x` (`rows x hidden`) against `targets` (`rows` ids):
/// `sum_t CE(softmax(RMSNorm(x[t]) * W), targets[t]) / normaliser`.
///
/// `normaliser` is the number of target tokens of the GLOBAL batch: a batch split into parts
/// (ranks, micro-batches), each evaluated with the same normaliser, has losses and gradients
/// that sum to exactly the full batch's mean loss and its gradients. The per-token terms
/// (f32) are summed in f64 in row order, and the loss is returned as f64: it is a reported
/// scalar, and f64 keeps the sum of parts equal to the whole to ~1e-15.
pub fn head_loss_forward(
    cfg: &MoeConfig,
    p: &HeadParams,
    x: &[f32],
    targets: &[u32],
    normaliser: f32,
) -> Result<(f64, HeadSaved)> {
    cfg.validate()?;
    p.check(cfg, "head parameters")?;
    check_normaliser(normaliser)?;
    let (d, nv) = (cfg.hidden, cfg.vocab);
    let rows = rows_of("x", x.len(), d)?;
    check_len("targets", targets.len(), rows)?;
    check_tokens("targets", targets, nv)?;
    let (z, norm) = rms_forward(x, p.norm(), d, cfg.norm_eps);
    let mut probs = vec![0.0; rows * nv];
    matmul(&z, p.w(), rows, d, nv, &mut probs);
    let mut total = 0.0f64;
    for t in 0..rows {
        let pr = &mut probs[t * nv..(t + 1) * nv];
        let mx = pr.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let target_logit = pr[targets[t] as usize];
        let mut sum = 0.0f32;
        for x in pr.iter_mut() {
            *x = (*x - mx).exp();
            sum += *x;
        }
        let inv = 1.0 / sum;
        for x in pr.iter_mut() {
            *x *= inv;
        }
        // CE = logsumexp - logit[target].
        total += f64::from(sum.ln() + mx - target_logit);
    }
    let loss = total / f64::from(normaliser);
    Ok((
        loss,
        HeadSaved {
            rows,
            norm,
            z,
            probs,
            targets: targets.to_vec(),
            normaliser,
        },
    ))
}

/// Backward of [`head_loss_forward`] (the loss's own gradient is 1): accumulates the head's
/// gradients into `g` (rows in order) and returns `d_x` (`rows x hidden`).
pub fn head_loss_backward(
    cfg: &MoeConfig,
    p: &HeadParams,
    saved: &HeadSaved,
    g: &mut HeadParams,
) -> Result<Vec<f32>> {
    cfg.validate()?;
    p.check(cfg, "head parameters")?;
    g.check(cfg, "head gradients")?;
    let (d, nv) = (cfg.hidden, cfg.vocab);
    let rows = saved.rows;
    check_len("head saved state", saved.probs.len(), rows * nv)?;
    let inv = 1.0 / saved.normaliser;
    let mut dlogits = saved.probs.clone();
    for t in 0..rows {
        let dl = &mut dlogits[t * nv..(t + 1) * nv];
        dl[saved.targets[t] as usize] -= 1.0;
        for v in dl.iter_mut() {
            *v *= inv;
        }
    }
    let (gn, gw) = g.split_mut();
    matmul_tn_acc(&saved.z, &dlogits, rows, d, nv, gw);
    let mut dz = vec![0.0; rows * d];
    matmul_nt(&dlogits, p.w(), rows, d, nv, &mut dz);
    Ok(rms_backward(&dz, &saved.norm, p.norm(), d, gn))
}
