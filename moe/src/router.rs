//! Router piece: logits `u * Wr`, softmax over the E experts, top-k, gate weights.

use crate::config::MoeConfig;
use crate::error::{MoeError, Result, check_len, rows_of};
use crate::linalg::{matmul, matmul_nt, matmul_tn_acc};
use crate::params::{ParamGroup, RouterParams};

/// Which experts each token goes to, and with what weight.
///
/// Slot `j` of token `t` is at flat index `t * top_k + j`. Slots are ordered by descending
/// router probability, ties broken by the lower expert id; the k experts of a token are
/// distinct.
#[derive(Debug, Clone, PartialEq)]
pub struct Routing {
    /// k, slots per token.
    pub top_k: usize,
    /// Expert id per slot, `rows x top_k`.
    pub experts: Vec<u32>,
    /// Gate weight per slot, `rows x top_k`.
    pub gates: Vec<f32>,
}

impl Routing {
    /// Tokens routed.
    pub fn rows(&self) -> usize {
        self.experts.len().checked_div(self.top_k).unwrap_or(0)
    }

    /// Flat slot indices (`t * top_k + j`) sent to `expert`, ascending (token order): the
    /// row order of that expert's batch in the single-rank reference.
    pub fn slots_of(&self, expert: usize) -> Vec<usize> {
        self.experts
            .iter()
            .enumerate()
            .filter(|&(_, &e)| e as usize == expert)
            .map(|(i, _)| i)
            .collect()
    }

    /// Number of slots sent to each of `experts` experts (the send counts of a dispatch).
    pub fn counts(&self, experts: usize) -> Vec<usize> {
        let mut c = vec![0; experts];
        for &e in &self.experts {
            if let Some(x) = c.get_mut(e as usize) {
                *x += 1;
            }
        }
        c
    }
}

/// What [`router_backward`] needs: the input, the softmax probabilities and the routing.
#[derive(Debug, Clone)]
pub struct RouterSaved {
    rows: usize,
    u: Vec<f32>,
    probs: Vec<f32>,
    experts: Vec<u32>,
    gates: Vec<f32>,
}

impl RouterSaved {
    /// Rows (tokens) this state was made for.
    pub fn rows(&self) -> usize {
        self.rows
    }
    /// Bytes held.
    pub fn bytes(&self) -> usize {
        4 * (self.u.len() + self.probs.len() + self.experts.len() + self.gates.len())
    }
}

/// Routes `u` (`rows x hidden`): `probs = softmax(u * Wr)`, the k most probable experts per
/// token (descending, ties to the lower id), gates = their probabilities, divided by their
/// sum when [`MoeConfig::renormalize_gates`] is set. Each token's routing depends only on
/// that token. No auxiliary load-balancing loss is added.
pub fn router_forward(
    cfg: &MoeConfig,
    p: &RouterParams,
    u: &[f32],
) -> Result<(Routing, RouterSaved)> {
    cfg.validate()?;
    p.check(cfg, "router parameters")?;
    let (d, ne, k) = (cfg.hidden, cfg.experts, cfg.top_k);
    let rows = rows_of("u", u.len(), d)?;
    let mut probs = vec![0.0; rows * ne];
    matmul(u, p.w(), rows, d, ne, &mut probs);
    let mut experts = vec![0u32; rows * k];
    let mut gates = vec![0.0f32; rows * k];
    let mut order: Vec<usize> = Vec::with_capacity(ne);
    for t in 0..rows {
        let pr = &mut probs[t * ne..(t + 1) * ne];
        // Top-k on the logits (same order as the probabilities, without their rounding ties).
        order.clear();
        order.extend(0..ne);
        order.sort_by(|&a, &b| pr[b].total_cmp(&pr[a]).then(a.cmp(&b)));
        let mx = pr[order[0]];
        let mut sum = 0.0f32;
        for x in pr.iter_mut() {
            *x = (*x - mx).exp();
            sum += *x;
        }
        let inv = 1.0 / sum;
        for x in pr.iter_mut() {
            *x *= inv;
        }
        let ex = &mut experts[t * k..(t + 1) * k];
        let gt = &mut gates[t * k..(t + 1) * k];
        let mut sel = 0.0f32;
        for j in 0..k {
            ex[j] = order[j] as u32;
            gt[j] = pr[order[j]];
            sel += gt[j];
        }
        if cfg.renormalize_gates {
            for gj in gt.iter_mut() {
                *gj /= sel;
            }
        }
    }
    let routing = Routing {
        top_k: k,
        experts: experts.clone(),
        gates: gates.clone(),
    };
    Ok((
        routing,
        RouterSaved {
            rows,
            u: u.to_vec(),
            probs,
            experts,
            gates,
        },
    ))
}

/// Backward of [`router_forward`] from the gradient of the gate weights `d_gates`
/// (`rows x top_k`, [`crate::CombineGrads::d_gates`]). The top-k choice itself is treated
/// as constant (it is piecewise constant). Accumulates `g` (rows in order) and returns the
/// router's part of `d_u`.
pub fn router_backward(
    cfg: &MoeConfig,
    p: &RouterParams,
    saved: &RouterSaved,
    d_gates: &[f32],
    g: &mut RouterParams,
) -> Result<Vec<f32>> {
    cfg.validate()?;
    p.check(cfg, "router parameters")?;
    g.check(cfg, "router gradients")?;
    let (d, ne, k) = (cfg.hidden, cfg.experts, cfg.top_k);
    let rows = saved.rows;
    check_len("d_gates", d_gates.len(), rows * k)?;
    check_len("router saved state", saved.probs.len(), rows * ne)?;
    let mut dlogits = vec![0.0f32; rows * ne];
    let mut dp = vec![0.0f32; ne];
    for t in 0..rows {
        let pr = &saved.probs[t * ne..(t + 1) * ne];
        let ex = &saved.experts[t * k..(t + 1) * k];
        let gt = &saved.gates[t * k..(t + 1) * k];
        let dg = &d_gates[t * k..(t + 1) * k];
        dp.fill(0.0);
        if cfg.renormalize_gates {
            // g_j = p_j / S, S = sum of the selected p: dp_j = (dg_j - sum_i dg_i g_i) / S.
            let mut sel = 0.0f32;
            let mut dot = 0.0f32;
            for j in 0..k {
                sel += pr[ex[j] as usize];
                dot += dg[j] * gt[j];
            }
            for j in 0..k {
                dp[ex[j] as usize] = (dg[j] - dot) / sel;
            }
        } else {
            for j in 0..k {
                dp[ex[j] as usize] = dg[j];
            }
        }
        let mut pdp = 0.0f32;
        for e in 0..ne {
            pdp += pr[e] * dp[e];
        }
        let dl = &mut dlogits[t * ne..(t + 1) * ne];
        for e in 0..ne {
            dl[e] = pr[e] * (dp[e] - pdp);
        }
    }
    matmul_tn_acc(&saved.u, &dlogits, rows, d, ne, g.as_mut_slice());
    let mut du = vec![0.0; rows * d];
    matmul_nt(&dlogits, p.w(), rows, d, ne, &mut du);
    Ok(du)
}

/// Checks a routing against a configuration and a row count (for callers that build or
/// receive one).
pub fn check_routing(cfg: &MoeConfig, routing: &Routing, rows: usize) -> Result<()> {
    if routing.top_k != cfg.top_k {
        return Err(MoeError::InvalidConfig {
            field: "top_k",
            reason: format!(
                "routing has top_k {}, configuration {}",
                routing.top_k, cfg.top_k
            ),
        });
    }
    check_len("routing.experts", routing.experts.len(), rows * cfg.top_k)?;
    check_len("routing.gates", routing.gates.len(), rows * cfg.top_k)?;
    if let Some(index) = routing
        .experts
        .iter()
        .position(|&e| e as usize >= cfg.experts)
    {
        return Err(MoeError::ExpertOutOfRange {
            index,
            expert: routing.experts[index],
            experts: cfg.experts,
        });
    }
    Ok(())
}
