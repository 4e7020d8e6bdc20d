//! Expert piece: one expert's MLP on a batch of rows in a caller-given order.

use crate::config::{ExpertKind, MoeConfig};
use crate::error::{Result, check_len, rows_of};
use crate::linalg::{add_into, matmul, matmul_nt, matmul_tn_acc};
use crate::params::ExpertParams;

/// What [`expert_backward`] needs: the input rows and the pre-activations.
#[derive(Debug, Clone)]
pub struct ExpertSaved {
    rows: usize,
    x: Vec<f32>,
    a1: Vec<f32>,
    /// SwiGLU's linear branch (empty for GELU).
    a3: Vec<f32>,
    act: Vec<f32>,
}

impl ExpertSaved {
    /// Rows this state was made for.
    pub fn rows(&self) -> usize {
        self.rows
    }
    /// Bytes held.
    pub fn bytes(&self) -> usize {
        4 * (self.x.len() + self.a1.len() + self.a3.len() + self.act.len())
    }
}

const GELU_C: f32 = 0.797_884_6; // sqrt(2 / pi)
const GELU_A: f32 = 0.044_715;

fn gelu(x: f32) -> f32 {
    0.5 * x * (1.0 + (GELU_C * (x + GELU_A * x * x * x)).tanh())
}

fn gelu_grad(x: f32) -> f32 {
    let t = (GELU_C * (x + GELU_A * x * x * x)).tanh();
    0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * GELU_C * (1.0 + 3.0 * GELU_A * x * x)
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// Runs one expert on `x` (`rows x hidden`, any number of rows including zero, in the
/// caller's order): GELU `gelu(x W1) W2` or SwiGLU `(silu(x W1) * x W3) W2`. Each output row
/// depends only on its input row. Returns `rows x hidden`.
pub fn expert_forward(
    cfg: &MoeConfig,
    p: &ExpertParams,
    x: &[f32],
) -> Result<(Vec<f32>, ExpertSaved)> {
    cfg.validate()?;
    p.check(cfg, "expert parameters")?;
    let (d, f) = (cfg.hidden, cfg.ffn);
    let rows = rows_of("expert input", x.len(), d)?;
    let mut a1 = vec![0.0; rows * f];
    matmul(x, p.w1(), rows, d, f, &mut a1);
    let (a3, act): (Vec<f32>, Vec<f32>) = match (cfg.expert_kind(), p.w3()) {
        (ExpertKind::SwiGlu, Some(w3)) => {
            let mut a3 = vec![0.0; rows * f];
            matmul(x, w3, rows, d, f, &mut a3);
            let act = a1
                .iter()
                .zip(&a3)
                .map(|(&g, &l)| g * sigmoid(g) * l)
                .collect();
            (a3, act)
        }
        _ => (Vec::new(), a1.iter().map(|&v| gelu(v)).collect()),
    };
    let mut y = vec![0.0; rows * d];
    matmul(&act, p.w2(), rows, f, d, &mut y);
    Ok((
        y,
        ExpertSaved {
            rows,
            x: x.to_vec(),
            a1,
            a3,
            act,
        },
    ))
}

/// Backward of [`expert_forward`] from `d_y` (`rows x hidden`, rows in the forward's order,
/// already multiplied by the gate: [`crate::CombineGrads::d_expert_out`]). Accumulates the
/// expert's gradients into `g` row by row in that order, and returns `d_x` (`rows x hidden`).
pub fn expert_backward(
    cfg: &MoeConfig,
    p: &ExpertParams,
    saved: &ExpertSaved,
    d_y: &[f32],
    g: &mut ExpertParams,
) -> Result<Vec<f32>> {
    cfg.validate()?;
    p.check(cfg, "expert parameters")?;
    g.check(cfg, "expert gradients")?;
    let (d, f) = (cfg.hidden, cfg.ffn);
    let rows = saved.rows;
    check_len("d_y", d_y.len(), rows * d)?;
    check_len("expert saved state", saved.a1.len(), rows * f)?;
    let (g1, g3, g2) = g.parts_mut();
    matmul_tn_acc(&saved.act, d_y, rows, f, d, g2);
    let mut dact = vec![0.0; rows * f];
    matmul_nt(d_y, p.w2(), rows, f, d, &mut dact);
    let mut dx = vec![0.0; rows * d];
    match (cfg.expert_kind(), p.w3()) {
        (ExpertKind::SwiGlu, Some(w3)) => {
            let mut da1 = vec![0.0; rows * f];
            let mut da3 = vec![0.0; rows * f];
            for i in 0..rows * f {
                let a = saved.a1[i];
                let s = sigmoid(a);
                da1[i] = dact[i] * saved.a3[i] * s * (1.0 + a * (1.0 - s));
                da3[i] = dact[i] * a * s;
            }
            matmul_tn_acc(&saved.x, &da1, rows, d, f, g1);
            matmul_tn_acc(&saved.x, &da3, rows, d, f, g3);
            matmul_nt(&da1, p.w1(), rows, d, f, &mut dx);
            let mut tmp = vec![0.0; rows * d];
            matmul_nt(&da3, w3, rows, d, f, &mut tmp);
            add_into(&tmp, &mut dx);
        }
        _ => {
            for (da, &a) in dact.iter_mut().zip(&saved.a1) {
                *da *= gelu_grad(a);
            }
            matmul_tn_acc(&saved.x, &dact, rows, d, f, g1);
            matmul_nt(&dact, p.w1(), rows, d, f, &mut dx);
        }
    }
    Ok(dx)
}
