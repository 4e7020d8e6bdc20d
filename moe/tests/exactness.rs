//! What a pipeline / expert-parallel executor relies on: splitting a batch, reordering the
//! work across ranks, and repeating a run change nothing (or only rounding, where stated).

mod common;

use common::{micro, rand_tokens};
use halo_moe::*;

/// Max over elements of `|a - b|`, relative to max `|b|`, per group; the worst group.
fn worst_group_error(a: &MoeParams, b: &MoeParams) -> (f64, String) {
    let mut worst = (0.0, String::new());
    for id in b.group_ids() {
        let (ga, gb) = (a.group(id).unwrap(), b.group(id).unwrap());
        let scale = gb.iter().fold(0.0f64, |m, &x| m.max(f64::from(x).abs()));
        assert!(scale > 0.0, "gradient of {id} is zero");
        let err = ga
            .iter()
            .zip(gb)
            .fold(0.0f64, |m, (&x, &y)| m.max(f64::from(x - y).abs()))
            / scale;
        if err > worst.0 {
            worst = (err, id.to_string());
        }
    }
    worst
}

fn bits(p: &MoeParams) -> Vec<u32> {
    p.group_ids()
        .into_iter()
        .flat_map(|id| {
            p.group(id)
                .unwrap()
                .iter()
                .map(|x| x.to_bits())
                .collect::<Vec<_>>()
        })
        .collect()
}

fn data(cfg: &MoeConfig, sequences: usize) -> (Vec<u32>, Vec<u32>) {
    (
        rand_tokens(31, sequences * cfg.seq, cfg.vocab),
        rand_tokens(32, sequences * cfg.seq, cfg.vocab),
    )
}

/// Sum of separately computed parts (each with the global normaliser) vs the whole batch.
#[test]
fn gradients_of_parts_sum_to_the_full_batch() {
    for (cfg, sequences, splits) in [
        (
            MoeConfig::tiny(),
            4,
            vec![vec![1, 3], vec![2, 2], vec![1, 1, 1, 1]],
        ),
        (micro(), 5, vec![vec![2, 3], vec![1, 1, 1, 1, 1]]),
    ] {
        let params = MoeParams::init(&cfg, 5).unwrap();
        let (tokens, targets) = data(&cfg, sequences);
        let n = tokens.len() as f32;
        let (loss, full) = forward_backward(&params, &tokens, &targets, n).unwrap();
        for split in splits {
            let mut sum = MoeParams::zeros(&cfg).unwrap();
            let mut loss_sum = 0.0f64;
            let mut start = 0;
            for part in &split {
                let r = start * cfg.seq..(start + part) * cfg.seq;
                let (l, g) = forward_backward(&params, &tokens[r.clone()], &targets[r], n).unwrap();
                loss_sum += l;
                sum.add_assign(&g).unwrap();
                start += part;
            }
            let (err, group) = worst_group_error(&sum, &full);
            assert!(
                err <= 1e-5,
                "split {split:?}: group {group} differs by {err:e} (relative) from the full batch"
            );
            assert!(
                (loss_sum - loss).abs() <= 1e-12 * loss,
                "split {split:?}: losses sum to {loss_sum}, full batch {loss}"
            );
        }
    }
}

/// Accumulating the parts into one gradient buffer, in order, is bit-for-bit the full batch.
#[test]
fn accumulating_parts_in_order_is_bitwise_the_full_batch() {
    let cfg = MoeConfig::tiny();
    let params = MoeParams::init(&cfg, 5).unwrap();
    let (tokens, targets) = data(&cfg, 4);
    let n = tokens.len() as f32;
    let (_, full) = forward_backward(&params, &tokens, &targets, n).unwrap();
    let mut acc = MoeParams::zeros(&cfg).unwrap();
    for (a, b) in [(0, 1), (1, 3), (3, 4)] {
        let r = a * cfg.seq..b * cfg.seq;
        forward_backward_into(&params, &tokens[r.clone()], &targets[r], n, &mut acc).unwrap();
    }
    assert!(
        bits(&acc) == bits(&full),
        "micro-batch accumulation is not bitwise"
    );
}

#[test]
fn same_seed_same_bits() {
    let cfg = MoeConfig::tiny();
    let a = MoeParams::init(&cfg, 9).unwrap();
    let b = MoeParams::init(&cfg, 9).unwrap();
    assert!(bits(&a) == bits(&b));
    assert!(bits(&a) != bits(&MoeParams::init(&cfg, 10).unwrap()));
    // A group initialised alone equals the same group of the whole model.
    let e = ExpertParams::init(&cfg, 9, 2, 5);
    assert_eq!(e.as_slice(), a.layers[2].experts[5].as_slice());

    let task = Task::new(&cfg, TaskConfig::default()).unwrap();
    let run = || {
        let mut p = MoeParams::init(&cfg, 9).unwrap();
        let mut adam = Adam::new(AdamConfig {
            lr: 3e-3,
            ..AdamConfig::default()
        })
        .unwrap();
        let mut losses = Vec::new();
        for step in 0..3 {
            let batch = task.batch(step, 2);
            let n = batch.tokens.len() as f32;
            let (l, g) = forward_backward(&p, &batch.tokens, &batch.targets, n).unwrap();
            losses.push(l.to_bits());
            adam.step(&mut p, &g).unwrap();
        }
        (losses, bits(&p))
    };
    let (l1, p1) = run();
    let (l2, p2) = run();
    assert_eq!(l1, l2);
    assert!(p1 == p2, "two identical training runs differ");
}

/// A token's activations do not depend on the other rows of its batch.
#[test]
fn rows_are_independent() {
    let cfg = MoeConfig::tiny();
    let d = cfg.hidden;
    let e = ExpertParams::init(&cfg, 1, 0, 0);
    let x = common::rand_vec(2, 7 * d, 1.0);
    let (y, _) = expert_forward(&cfg, &e, &x).unwrap();
    let perm = [3usize, 0, 6, 1, 5, 2, 4];
    let xp: Vec<f32> = perm
        .iter()
        .flat_map(|&i| x[i * d..(i + 1) * d].to_vec())
        .collect();
    let (yp, _) = expert_forward(&cfg, &e, &xp).unwrap();
    for (k, &i) in perm.iter().enumerate() {
        assert_eq!(yp[k * d..(k + 1) * d], y[i * d..(i + 1) * d]);
    }
    // One sequence alone vs the same sequence second in a batch of two.
    let p = DenseParams::init(&cfg, 1, 0);
    let xs = common::rand_vec(3, 2 * cfg.seq * d, 1.0);
    let (both, _) = dense_forward(&cfg, &p, &xs).unwrap();
    let (alone, _) = dense_forward(&cfg, &p, &xs[cfg.seq * d..]).unwrap();
    assert_eq!(alone.h, both.h[cfg.seq * d..]);
    assert_eq!(alone.u, both.u[cfg.seq * d..]);
}

/// A two-rank expert-parallel step emulated with the pieces: each rank holds half of the
/// sequences and half of the experts; tokens go to their expert's rank and come back; the
/// replicated groups' gradients are summed over the ranks (the all-reduce). The loss and
/// gradients match the single-rank reference: expert, embedding and head gradients bit for
/// bit (same rows in the same order), replicated ones to rounding.
#[test]
fn expert_parallel_emulation_matches_the_reference() {
    for cfg in [micro(), MoeConfig::tiny()] {
        let ranks = 2;
        let params = MoeParams::init(&cfg, 21).unwrap();
        let (tokens, targets) = data(&cfg, 4);
        let n = tokens.len() as f32;
        let (ref_loss, ref_grads) = forward_backward(&params, &tokens, &targets, n).unwrap();

        let (d, k, ne) = (cfg.hidden, cfg.top_k, cfg.experts);
        let owner = |e: usize| e * ranks / ne;
        let per = tokens.len() / ranks;
        let tok: Vec<&[u32]> = tokens.chunks(per).collect();
        let tgt: Vec<&[u32]> = targets.chunks(per).collect();
        // Per rank gradient buffers: each rank accumulates only what it owns or replicates.
        let mut grads: Vec<MoeParams> = (0..ranks)
            .map(|_| MoeParams::zeros(&cfg).unwrap())
            .collect();

        // Forward.
        let mut x: Vec<Vec<f32>> = (0..ranks)
            .map(|r| embed_forward(&cfg, &params.embed, tok[r]).unwrap())
            .collect();
        /// Per source rank, the slots it sent, in arrival order.
        type Arrivals = Vec<(usize, Vec<usize>)>;
        struct Tape {
            dense: Vec<DenseSaved>,
            router: Vec<RouterSaved>,
            routing: Vec<Routing>,
            combine: Vec<CombineSaved>,
            /// Per expert: (source rank, slots) in arrival order, and the saved state.
            experts: Vec<(Arrivals, ExpertSaved)>,
        }
        let mut tapes = Vec::new();
        for l in 0..cfg.layers {
            let lp = &params.layers[l];
            let mut tape = Tape {
                dense: vec![],
                router: vec![],
                routing: vec![],
                combine: vec![],
                experts: vec![],
            };
            let mut outs = Vec::new();
            for xr in &x {
                let (o, ds) = dense_forward(&cfg, &lp.dense, xr).unwrap();
                let (ro, rs) = router_forward(&cfg, &lp.router, &o.u).unwrap();
                tape.dense.push(ds);
                tape.router.push(rs);
                tape.routing.push(ro);
                outs.push(o);
            }
            let mut expert_out: Vec<Vec<f32>> =
                (0..ranks).map(|r| vec![0.0; outs[r].u.len() * k]).collect();
            for (e, ep) in lp.experts.iter().enumerate() {
                // All-to-all: rank r sends the rows of its tokens routed to e, in token order;
                // the owner concatenates them in rank order and runs the expert once.
                let mut arrivals = Vec::new();
                let mut rows = Vec::new();
                for (r, out) in outs.iter().enumerate() {
                    let slots = tape.routing[r].slots_of(e);
                    rows.extend(gather_tokens(&out.u, d, k, &slots).unwrap());
                    arrivals.push((r, slots));
                }
                let (y, es) = expert_forward(&cfg, ep, &rows).unwrap();
                let mut off = 0;
                for (r, slots) in &arrivals {
                    let len = slots.len() * d;
                    scatter_slots(&y[off..off + len], d, slots, &mut expert_out[*r]).unwrap();
                    off += len;
                }
                tape.experts.push((arrivals, es));
            }
            for r in 0..ranks {
                let (o, cs) =
                    combine_forward(&cfg, &outs[r].h, &tape.routing[r].gates, &expert_out[r])
                        .unwrap();
                tape.combine.push(cs);
                x[r] = o;
            }
            tapes.push(tape);
        }
        let mut loss = 0.0;
        let mut dx = Vec::new();
        for r in 0..ranks {
            let (lr, hs) = head_loss_forward(&cfg, &params.head, &x[r], tgt[r], n).unwrap();
            loss += lr;
            dx.push(head_loss_backward(&cfg, &params.head, &hs, &mut grads[r].head).unwrap());
        }
        // Backward.
        for l in (0..cfg.layers).rev() {
            let lp = &params.layers[l];
            let tape = &tapes[l];
            let cgs: Vec<CombineGrads> = (0..ranks)
                .map(|r| combine_backward(&cfg, &tape.combine[r], &dx[r]).unwrap())
                .collect();
            let mut d_in: Vec<Vec<f32>> = cgs
                .iter()
                .map(|c| vec![0.0; c.d_expert_out.len()])
                .collect();
            for (e, (arrivals, es)) in tape.experts.iter().enumerate() {
                let mut dy = Vec::new();
                for (r, slots) in arrivals {
                    dy.extend(gather_slots(&cgs[*r].d_expert_out, d, slots).unwrap());
                }
                let o = owner(e);
                let dxe = expert_backward(
                    &cfg,
                    &lp.experts[e],
                    es,
                    &dy,
                    &mut grads[o].layers[l].experts[e],
                )
                .unwrap();
                let mut off = 0;
                for (r, slots) in arrivals {
                    let len = slots.len() * d;
                    scatter_slots(&dxe[off..off + len], d, slots, &mut d_in[*r]).unwrap();
                    off += len;
                }
            }
            for r in 0..ranks {
                let g = &mut grads[r].layers[l];
                let dr = router_backward(
                    &cfg,
                    &lp.router,
                    &tape.router[r],
                    &cgs[r].d_gates,
                    &mut g.router,
                )
                .unwrap();
                let du = moe_input_backward(&cfg, &dr, &d_in[r]).unwrap();
                dx[r] = dense_backward(
                    &cfg,
                    &lp.dense,
                    &tape.dense[r],
                    &cgs[r].d_h,
                    &du,
                    &mut g.dense,
                )
                .unwrap();
            }
        }
        for r in 0..ranks {
            embed_backward(&cfg, tok[r], &dx[r], &mut grads[r].embed).unwrap();
        }
        // "All-reduce": sum the ranks' buffers (expert groups are non-zero on one rank only).
        let mut total = MoeParams::zeros(&cfg).unwrap();
        for g in &grads {
            total.add_assign(g).unwrap();
        }
        assert!(
            (loss - ref_loss).abs() <= 1e-12 * ref_loss,
            "loss {loss} vs {ref_loss}"
        );
        let (err, group) = worst_group_error(&total, &ref_grads);
        assert!(err <= 1e-5, "group {group}: relative error {err:e}");
        for l in 0..cfg.layers {
            for e in 0..ne {
                assert_eq!(
                    grads[owner(e)].layers[l].experts[e].as_slice(),
                    ref_grads.layers[l].experts[e].as_slice(),
                    "layer {l} expert {e} gradient is not bitwise the reference"
                );
            }
        }
    }
}
