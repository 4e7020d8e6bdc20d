//! Hand-written backward of every piece, and of the whole model, against central finite
//! differences.
//!
//! The forward is f32; each check evaluates a scalar (a random f64-weighted sum of a piece's
//! outputs, or the f64 loss) at `x +- eps * v` and `x +- eps/2 * v` and takes the
//! Richardson-extrapolated central difference (truncation error O(eps^4)). Tolerances, and
//! why (see `common::check_grad`):
//! - Along the gradient's own direction and along random directions, the error is measured
//!   against `sum_i |g_i v_i|`, the size of the terms of the directional derivative. What
//!   remains is f32 rounding of the scalar divided by the step; observed errors are 1e-7 to
//!   4e-4 (the largest for routers, where small steps are forced, see below). A wrong
//!   backward term is an error of the size of the terms it touches (a dropped factor in the
//!   renormalised-gate backward gives 0.17, a 10% error in the attention softmax backward
//!   0.006), so `1e-3` catches it.
//! - Single coordinates (the three largest gradient elements) move the scalar less, so
//!   rounding noise weighs more: their error is measured against the largest gradient
//!   element and must stay below `1e-2`.
//! - A step that changes any token's set of top-k experts is not used (the loss jumps there):
//!   the check falls back to smaller steps (down to 3e-5) and fails if every step changes the
//!   routing.

mod common;

use common::{Probe, check_grad, micro, rand_tokens, rand_vec, weighted};
use halo_moe::*;

/// Piece checks: gradient direction, two random directions, three coordinates.
const FULL: Probe = Probe {
    tol_dir: 1e-3,
    tol_el: 1e-2,
    random_dirs: 2,
    elements: 3,
};

/// Whole-`tiny` checks (each evaluation is a whole forward): gradient direction and one
/// random direction.
const LIGHT: Probe = Probe {
    random_dirs: 1,
    elements: 0,
    ..FULL
};

/// Gains away from 1 so their gradients are tested in general position.
fn jitter(data: &mut [f32], seed: u64) {
    let noise = rand_vec(seed, data.len(), 0.2);
    for (x, n) in data.iter_mut().zip(noise) {
        *x += n;
    }
}

fn configs() -> Vec<MoeConfig> {
    vec![micro(), MoeConfig::tiny()]
}

#[test]
fn embed_gradients() {
    for cfg in configs() {
        let mut p = EmbedParams::init(&cfg, 3);
        jitter(p.as_mut_slice(), 4);
        let tokens = rand_tokens(5, 2 * cfg.seq, cfg.vocab);
        let r = rand_vec(6, tokens.len() * cfg.hidden, 1.0);
        let mut g = EmbedParams::zeros(&cfg);
        embed_backward(&cfg, &tokens, &r, &mut g).unwrap();
        let f = |flat: &[f32]| {
            let p = EmbedParams::from_vec(&cfg, flat.to_vec()).unwrap();
            Some(weighted(&r, &embed_forward(&cfg, &p, &tokens).unwrap()))
        };
        check_grad("embed", p.as_slice(), g.as_slice(), &f, 7, FULL);
    }
}

#[test]
fn dense_gradients() {
    for cfg in configs() {
        let mut p = DenseParams::init(&cfg, 3, 0);
        jitter(p.as_mut_slice(), 4);
        let rows = 2 * cfg.seq;
        let x = rand_vec(5, rows * cfg.hidden, 1.0);
        let rh = rand_vec(6, rows * cfg.hidden, 1.0);
        let ru = rand_vec(7, rows * cfg.hidden, 1.0);
        let (_, saved) = dense_forward(&cfg, &p, &x).unwrap();
        let mut g = DenseParams::zeros(&cfg);
        let dx = dense_backward(&cfg, &p, &saved, &rh, &ru, &mut g).unwrap();
        let scalar = |p: &DenseParams, x: &[f32]| {
            let (o, _) = dense_forward(&cfg, p, x).unwrap();
            weighted(&rh, &o.h) + weighted(&ru, &o.u)
        };
        let fp = |flat: &[f32]| {
            Some(scalar(
                &DenseParams::from_vec(&cfg, flat.to_vec()).unwrap(),
                &x,
            ))
        };
        check_grad("dense params", p.as_slice(), g.as_slice(), &fp, 8, FULL);
        let fx = |xx: &[f32]| Some(scalar(&p, xx));
        check_grad("dense input", &x, &dx, &fx, 9, FULL);
    }
}

#[test]
fn router_gradients_with_and_without_renormalisation() {
    for mut cfg in configs() {
        for renorm in [false, true] {
            cfg.renormalize_gates = renorm;
            let p = RouterParams::init(&cfg, 3, 1);
            let rows = cfg.seq;
            let u = rand_vec(5, rows * cfg.hidden, 1.5);
            let r = rand_vec(6, rows * cfg.top_k, 1.0);
            let (routing, saved) = router_forward(&cfg, &p, &u).unwrap();
            check_routing(&cfg, &routing, rows).unwrap();
            if renorm {
                for t in 0..rows {
                    let s: f32 = routing.gates[t * cfg.top_k..(t + 1) * cfg.top_k]
                        .iter()
                        .sum();
                    assert!((s - 1.0).abs() < 1e-6, "renormalised gates sum to {s}");
                }
            }
            let mut g = RouterParams::zeros(&cfg);
            let du = router_backward(&cfg, &p, &saved, &r, &mut g).unwrap();
            let scalar = |p: &RouterParams, u: &[f32]| {
                let (ro, _) = router_forward(&cfg, p, u).unwrap();
                (ro.experts == routing.experts).then(|| weighted(&r, &ro.gates))
            };
            let fp =
                |flat: &[f32]| scalar(&RouterParams::from_vec(&cfg, flat.to_vec()).unwrap(), &u);
            check_grad("router params", p.as_slice(), g.as_slice(), &fp, 8, FULL);
            let fu = |uu: &[f32]| scalar(&p, uu);
            check_grad("router input", &u, &du, &fu, 9, FULL);
        }
    }
}

#[test]
fn expert_gradients_gelu_and_swiglu() {
    for mut cfg in configs() {
        for matrices in [2, 3] {
            cfg.expert_matrices = matrices;
            let p = ExpertParams::init(&cfg, 3, 1, 2);
            assert_eq!(p.w3().is_some(), matrices == 3);
            let rows = 11;
            let x = rand_vec(5, rows * cfg.hidden, 1.5);
            let r = rand_vec(6, rows * cfg.hidden, 1.0);
            let (_, saved) = expert_forward(&cfg, &p, &x).unwrap();
            let mut g = ExpertParams::zeros(&cfg);
            let dx = expert_backward(&cfg, &p, &saved, &r, &mut g).unwrap();
            let scalar =
                |p: &ExpertParams, x: &[f32]| weighted(&r, &expert_forward(&cfg, p, x).unwrap().0);
            let fp = |flat: &[f32]| {
                Some(scalar(
                    &ExpertParams::from_vec(&cfg, flat.to_vec()).unwrap(),
                    &x,
                ))
            };
            check_grad("expert params", p.as_slice(), g.as_slice(), &fp, 8, FULL);
            let fx = |xx: &[f32]| Some(scalar(&p, xx));
            check_grad("expert input", &x, &dx, &fx, 9, FULL);
        }
    }
}

#[test]
fn expert_with_no_rows_is_empty_and_adds_nothing() {
    let cfg = micro();
    let p = ExpertParams::init(&cfg, 3, 0, 0);
    let (y, saved) = expert_forward(&cfg, &p, &[]).unwrap();
    assert!(y.is_empty());
    let mut g = ExpertParams::zeros(&cfg);
    let dx = expert_backward(&cfg, &p, &saved, &[], &mut g).unwrap();
    assert!(dx.is_empty());
    assert!(g.as_slice().iter().all(|&v| v == 0.0));
}

#[test]
fn combine_and_moe_input_gradients() {
    for cfg in configs() {
        let (d, k) = (cfg.hidden, cfg.top_k);
        let rows = 9;
        let h = rand_vec(1, rows * d, 1.0);
        let gates = rand_vec(2, rows * k, 1.0);
        let eo = rand_vec(3, rows * k * d, 1.0);
        let r = rand_vec(4, rows * d, 1.0);
        let (_, saved) = combine_forward(&cfg, &h, &gates, &eo).unwrap();
        let cg = combine_backward(&cfg, &saved, &r).unwrap();
        let s = |h: &[f32], g: &[f32], e: &[f32]| {
            Some(weighted(&r, &combine_forward(&cfg, h, g, e).unwrap().0))
        };
        check_grad("combine h", &h, &cg.d_h, &|x| s(x, &gates, &eo), 5, FULL);
        check_grad(
            "combine gates",
            &gates,
            &cg.d_gates,
            &|x| s(&h, x, &eo),
            6,
            FULL,
        );
        check_grad(
            "combine expert_out",
            &eo,
            &cg.d_expert_out,
            &|x| s(&h, &gates, x),
            7,
            FULL,
        );
        // d_u = d_router + sum of the slots' expert input gradients (exact sums, small ints).
        let dr: Vec<f32> = (0..rows * d).map(|i| (i % 5) as f32).collect();
        let de: Vec<f32> = (0..rows * k * d).map(|i| (i % 3) as f32).collect();
        let du = moe_input_backward(&cfg, &dr, &de).unwrap();
        for t in 0..rows {
            for c in 0..d {
                let want = dr[t * d + c] + (0..k).map(|j| de[(t * k + j) * d + c]).sum::<f32>();
                assert_eq!(du[t * d + c], want);
            }
        }
    }
}

#[test]
fn head_loss_gradients() {
    for cfg in configs() {
        let mut p = HeadParams::init(&cfg, 3);
        jitter(p.as_mut_slice(), 4);
        let rows = 2 * cfg.seq;
        let x = rand_vec(5, rows * cfg.hidden, 1.0);
        let targets = rand_tokens(6, rows, cfg.vocab);
        let norm = 1.5 * rows as f32;
        let (_, saved) = head_loss_forward(&cfg, &p, &x, &targets, norm).unwrap();
        let mut g = HeadParams::zeros(&cfg);
        let dx = head_loss_backward(&cfg, &p, &saved, &mut g).unwrap();
        let scalar =
            |p: &HeadParams, x: &[f32]| head_loss_forward(&cfg, p, x, &targets, norm).unwrap().0;
        let fp = |flat: &[f32]| {
            Some(scalar(
                &HeadParams::from_vec(&cfg, flat.to_vec()).unwrap(),
                &x,
            ))
        };
        check_grad("head params", p.as_slice(), g.as_slice(), &fp, 8, FULL);
        check_grad("head input", &x, &dx, &|xx| Some(scalar(&p, xx)), 9, FULL);
    }
}

/// Whole-model check of the listed groups (and of all parameters at once).
fn whole_model(cfg: &MoeConfig, sequences: usize, groups: &[GroupId], probe: Probe) {
    let params = MoeParams::init(cfg, 11).unwrap();
    let tokens = rand_tokens(12, sequences * cfg.seq, cfg.vocab);
    let targets = rand_tokens(13, sequences * cfg.seq, cfg.vocab);
    let n = tokens.len() as f32;
    let (loss, grads) = forward_backward(&params, &tokens, &targets, n).unwrap();
    let (loss_fwd, routing) = forward_loss_routed(&params, &tokens, &targets, n).unwrap();
    assert_eq!(loss.to_bits(), loss_fwd.to_bits());
    assert!(loss.is_finite() && loss > 0.0);
    // The set of experts of each token (the loss is continuous when two chosen experts only
    // swap slots).
    let ids_of = |r: &[Routing]| {
        r.iter()
            .map(|x| {
                let mut e = x.experts.clone();
                for t in e.chunks_mut(x.top_k) {
                    t.sort_unstable();
                }
                e
            })
            .collect::<Vec<_>>()
    };
    let base = ids_of(&routing);
    let eval = |p: &MoeParams| {
        let (l, r) = forward_loss_routed(p, &tokens, &targets, n).unwrap();
        (ids_of(&r) == base).then_some(l)
    };
    for &id in groups {
        let f = |flat: &[f32]| {
            let mut p = params.clone();
            p.group_mut(id).unwrap().copy_from_slice(flat);
            eval(&p)
        };
        check_grad(
            &format!("model {id}"),
            params.group(id).unwrap(),
            grads.group(id).unwrap(),
            &f,
            21,
            probe,
        );
    }
    // All parameters along one direction.
    let ids = params.group_ids();
    let flat: Vec<f32> = ids
        .iter()
        .flat_map(|&id| params.group(id).unwrap().to_vec())
        .collect();
    let gflat: Vec<f32> = ids
        .iter()
        .flat_map(|&id| grads.group(id).unwrap().to_vec())
        .collect();
    let f = |x: &[f32]| {
        let mut p = params.clone();
        let mut off = 0;
        for &id in &ids {
            let g = p.group_mut(id).unwrap();
            let len = g.len();
            g.copy_from_slice(&x[off..off + len]);
            off += len;
        }
        eval(&p)
    };
    check_grad("model, all parameters", &flat, &gflat, &f, 22, probe);
}

#[test]
fn whole_model_gradients_micro_every_group() {
    let cfg = micro();
    let params = MoeParams::init(&cfg, 11).unwrap();
    whole_model(&cfg, 3, &params.group_ids(), FULL);
}

#[test]
fn whole_model_gradients_tiny() {
    let cfg = MoeConfig::tiny();
    whole_model(
        &cfg,
        1,
        &[
            GroupId::Dense(0),
            GroupId::Router(0),
            GroupId::Expert {
                layer: 1,
                expert: 3,
            },
        ],
        LIGHT,
    );
}
