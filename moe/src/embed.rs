//! Embedding piece (pipeline stage 0).

use crate::config::MoeConfig;
use crate::error::{Result, check_len, check_tokens, whole_sequences};
use crate::params::EmbedParams;

/// Embeds `tokens` (a whole number of sequences, `rows = tokens.len()`): row `t` is
/// `token_table[tokens[t]] + position_table[t % seq]`. Returns `rows x hidden`.
///
/// The saved state of the backward is the token list itself, which the caller keeps.
pub fn embed_forward(cfg: &MoeConfig, p: &EmbedParams, tokens: &[u32]) -> Result<Vec<f32>> {
    cfg.validate()?;
    p.check(cfg, "embed parameters")?;
    whole_sequences("tokens", tokens.len(), cfg.seq)?;
    check_tokens("tokens", tokens, cfg.vocab)?;
    let d = cfg.hidden;
    let mut x = vec![0.0; tokens.len() * d];
    let (tok, pos) = (p.tokens(), p.positions());
    for (t, (&id, xr)) in tokens.iter().zip(x.chunks_exact_mut(d)).enumerate() {
        let pr = &pos[(t % cfg.seq) * d..(t % cfg.seq + 1) * d];
        let tr = &tok[id as usize * d..(id as usize + 1) * d];
        for i in 0..d {
            xr[i] = tr[i] + pr[i];
        }
    }
    Ok(x)
}

/// Backward of [`embed_forward`]: adds `d_x` (`rows x hidden`) into the token and position
/// rows of `g`, row by row in order.
pub fn embed_backward(
    cfg: &MoeConfig,
    tokens: &[u32],
    d_x: &[f32],
    g: &mut EmbedParams,
) -> Result<()> {
    cfg.validate()?;
    g.check(cfg, "embed gradients")?;
    whole_sequences("tokens", tokens.len(), cfg.seq)?;
    check_tokens("tokens", tokens, cfg.vocab)?;
    let d = cfg.hidden;
    check_len("d_x", d_x.len(), tokens.len() * d)?;
    let (gt, gp) = g.split_mut();
    for (t, (&id, dr)) in tokens.iter().zip(d_x.chunks_exact(d)).enumerate() {
        let id = id as usize;
        crate::linalg::add_into(dr, &mut gt[id * d..(id + 1) * d]);
        let ps = t % cfg.seq;
        crate::linalg::add_into(dr, &mut gp[ps * d..(ps + 1) * d]);
    }
    Ok(())
}
