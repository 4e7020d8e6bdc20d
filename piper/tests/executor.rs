//! The executor against the single-rank reference: for every PP x EP layout with PP, EP in
//! {1, 2, 4} on at most 8 ranks (threads), and M in {1, 4}, one training step's loss and
//! every gradient group equal `halo_moe::forward_backward`'s, and one Adam step gives equal
//! parameters. Bad layouts are the same clear error on every rank.

mod common;

use common::{Failing, OnRead};
use halo::MoeDispatch;
use halo::local::{self, Emulation};
use halo::topology::Topology;
use halo_moe::{Adam, AdamConfig, GroupId, MoeConfig, MoeParams, Task, TaskConfig};
use halo_piper::{Executor, MeshLayout, PiperError, ReferenceModel};

const SEED: u64 = 7;
/// Global batch: 16 sequences, so it splits over EP (up to 4) x DP x M (up to 4).
const SEQUENCES: usize = 16;
/// Bound on the relative error max|a - b| / max|b| of every group.
const TOLERANCE: f64 = 1e-5;

fn config() -> MoeConfig {
    // `tiny` with shorter sequences to keep the 17 layouts quick.
    MoeConfig {
        seq: 16,
        ..MoeConfig::tiny()
    }
}

/// Adam's defaults (lr 1e-3). Adam's first step is about `lr * sign(g)` per element, so
/// gradients equal to rounding give parameters equal to `lr` times rounding.
fn adam_config() -> AdamConfig {
    AdamConfig::default()
}

/// What one rank returns: loss, its groups' gradients, its groups' parameters after Adam.
type RankOut = (f64, Vec<(GroupId, Vec<f32>)>, Vec<(GroupId, Vec<f32>)>);

fn run_layout(
    topology: &str,
    layout: MeshLayout,
    microbatches: usize,
) -> Vec<Result<RankOut, PiperError>> {
    run_layout_with(topology, layout, microbatches, false)
}

fn run_layout_with(
    topology: &str,
    layout: MeshLayout,
    microbatches: usize,
    overlap: bool,
) -> Vec<Result<RankOut, PiperError>> {
    run_layout_dispatch(
        topology,
        layout,
        microbatches,
        overlap,
        MoeDispatch::AllToAllV,
    )
}

fn run_layout_dispatch(
    topology: &str,
    layout: MeshLayout,
    microbatches: usize,
    overlap: bool,
    dispatch: MoeDispatch,
) -> Vec<Result<RankOut, PiperError>> {
    let cfg = config();
    let task = Task::new(&cfg, TaskConfig::default()).unwrap();
    let batch = task.batch(0, SEQUENCES);
    let topo = Topology::preset(topology).unwrap();
    local::run(&topo, Emulation::off(), |world| {
        let mut one = || -> Result<RankOut, PiperError> {
            let mut model = ReferenceModel::new(MoeParams::init(&cfg, SEED)?)?;
            let mut exec = Executor::new(world, layout, microbatches, &model)?;
            exec.set_overlap(overlap);
            exec.set_dispatch(dispatch);
            let report = exec.step(&mut model, &batch.tokens, &batch.targets)?;
            let ids = exec.owned_groups();
            let grads = ids
                .iter()
                .map(|&id| Ok((id, model.grads().group(id)?.to_vec())))
                .collect::<Result<Vec<_>, PiperError>>()?;
            let mut adam = Adam::new(adam_config())?;
            exec.adam_step(&mut model, &mut adam)?;
            let params = ids
                .iter()
                .map(|&id| Ok((id, model.params().group(id)?.to_vec())))
                .collect::<Result<Vec<_>, PiperError>>()?;
            Ok((report.loss, grads, params))
        };
        Ok(one())
    })
    .into_iter()
    .map(|r| r.expect("the rank's thread returned a library error"))
    .collect()
}

/// max|a - b| / max|b| (0 when both are all zeros).
fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let diff = a
        .iter()
        .zip(b)
        .map(|(x, y)| f64::from((x - y).abs()))
        .fold(0.0, f64::max);
    let scale = b.iter().map(|y| f64::from(y.abs())).fold(0.0, f64::max);
    if diff == 0.0 { 0.0 } else { diff / scale }
}

fn kind(id: GroupId) -> &'static str {
    match id {
        GroupId::Embed => "embed",
        GroupId::Dense(_) => "dense",
        GroupId::Router(_) => "router",
        GroupId::Expert { .. } => "expert",
        GroupId::Head => "head",
    }
}

/// Checks one layout on `flat:N`; returns a line for the summary.
fn check_layout(layout: MeshLayout, microbatches: usize) -> String {
    check_layout_on(&format!("flat:{}", layout.ranks()), layout, microbatches)
}

/// Checks one layout on a topology preset; returns a line for the summary.
fn check_layout_on(topology: &str, layout: MeshLayout, microbatches: usize) -> String {
    let cfg = config();
    let task = Task::new(&cfg, TaskConfig::default()).unwrap();
    let batch = task.batch(0, SEQUENCES);
    let mut params = MoeParams::init(&cfg, SEED).unwrap();
    let n = batch.tokens.len() as f32;
    let (ref_loss, ref_grads) =
        halo_moe::forward_backward(&params, &batch.tokens, &batch.targets, n).unwrap();
    let mut adam = Adam::new(adam_config()).unwrap();
    adam.step(&mut params, &ref_grads).unwrap();

    let outs = run_layout(topology, layout, microbatches);
    let name = format!(
        "PP {} x EP {} x DP {}, M {} on {topology}",
        layout.pp, layout.ep, layout.dp, microbatches
    );
    let mut seen = std::collections::BTreeSet::new();
    let mut loss_err = 0.0f64;
    // (kind) -> (max grad rel err, max param rel err, all bitwise)
    let mut worst: std::collections::BTreeMap<&str, (f64, f64, bool)> = Default::default();
    for (rank, out) in outs.into_iter().enumerate() {
        let (loss, grads, after) = out.unwrap_or_else(|e| panic!("{name}: rank {rank}: {e}"));
        let le = (loss - ref_loss).abs() / ref_loss.abs();
        loss_err = loss_err.max(le);
        assert!(
            le <= TOLERANCE,
            "{name}: rank {rank}: loss {loss} vs reference {ref_loss} (relative {le:e})"
        );
        for ((id, g), (id2, p)) in grads.iter().zip(&after) {
            assert_eq!(id, id2);
            seen.insert(*id);
            let ge = rel_err(g, ref_grads.group(*id).unwrap());
            let pe = rel_err(p, params.group(*id).unwrap());
            assert!(
                ge <= TOLERANCE,
                "{name}: rank {rank}: gradient of {id}: relative error {ge:e}"
            );
            if pe > TOLERANCE {
                // Adam's first step is lr * g / (|g| + eps) per element: where |g| is near
                // eps, it amplifies the gradients' rounding. Accept what that conditioning
                // allows: lr * |g - g_ref| / (min(|g|, |g_ref|) + eps), plus f32 rounding.
                let (gr, pr) = (ref_grads.group(*id).unwrap(), params.group(*id).unwrap());
                let c = adam_config();
                for i in 0..p.len() {
                    let allowed = c.lr * (g[i] - gr[i]).abs()
                        / (g[i].abs().min(gr[i].abs()) + c.eps)
                        + 1e-6 * (pr[i].abs() + c.lr);
                    assert!(
                        (p[i] - pr[i]).abs() <= allowed,
                        "{name}: rank {rank}: {id}[{i}] after Adam: {} vs {} (gradient {} vs {})",
                        p[i],
                        pr[i],
                        g[i],
                        gr[i]
                    );
                }
            }
            let w = worst.entry(kind(*id)).or_insert((0.0, 0.0, true));
            w.0 = w.0.max(ge);
            w.1 = w.1.max(pe);
            w.2 &= g == ref_grads.group(*id).unwrap();
        }
    }
    // Every group of the model is placed on some rank.
    assert_eq!(
        seen.len(),
        ref_grads.group_ids().len(),
        "{name}: groups placed"
    );
    let parts: Vec<String> = worst
        .iter()
        .map(|(k, (g, p, bit))| {
            if *bit {
                format!("{k} bitwise (params {p:.1e})")
            } else {
                format!("{k} {g:.1e} (params {p:.1e})")
            }
        })
        .collect();
    format!("{name}: loss {loss_err:.1e}, {}", parts.join(", "))
}

#[test]
fn every_layout_matches_the_single_rank_reference() {
    let mut lines = Vec::new();
    for pp in [1, 2, 4] {
        for ep in [1, 2, 4] {
            if pp * ep > 8 {
                continue;
            }
            for m in [1, 4] {
                lines.push(check_layout(MeshLayout::new(pp, ep), m));
            }
        }
    }
    // With data parallelism too.
    lines.push(check_layout(
        MeshLayout {
            pp: 2,
            ep: 2,
            dp: 2,
        },
        4,
    ));
    // On a two-level machine: each stage's EP group is one node.
    lines.push(check_layout_on("nodes:2x4", MeshLayout::new(2, 4), 4));
    for l in &lines {
        println!("{l}");
    }
}

/// Runs a bad layout on `ranks` threads and returns every rank's error.
fn bad_layout(ranks: usize, layout: MeshLayout, cfg: &MoeConfig) -> Vec<PiperError> {
    let topo = Topology::preset(&format!("flat:{ranks}")).unwrap();
    local::run(&topo, Emulation::off(), |world| {
        let model = ReferenceModel::new(MoeParams::init(cfg, SEED).unwrap()).unwrap();
        Ok(Executor::new(world, layout, 1, &model).err())
    })
    .into_iter()
    .map(|r| r.unwrap().expect("a bad layout must be refused"))
    .collect()
}

#[test]
fn bad_layouts_are_clear_errors_on_every_rank() {
    let cfg = config();
    let errs = bad_layout(8, MeshLayout::new(3, 1), &cfg);
    assert_eq!(errs.len(), 8);
    for e in &errs {
        assert!(
            matches!(
                e,
                PiperError::MeshSize {
                    pp: 3,
                    ep: 1,
                    dp: 1,
                    needed: 3,
                    world: 8
                }
            ),
            "{e}"
        );
        assert_eq!(
            e.to_string(),
            "layout PP 3 x EP 1 x DP 1 needs 3 ranks, but the world communicator has 8"
        );
    }
    let errs = bad_layout(6, MeshLayout::new(2, 3), &cfg);
    assert_eq!(errs.len(), 6);
    for e in &errs {
        assert!(
            matches!(e, PiperError::EpNotDividingExperts { ep: 3, experts: 8 }),
            "{e}"
        );
    }
    let errs = bad_layout(8, MeshLayout::new(8, 1), &cfg);
    assert_eq!(errs.len(), 8);
    for e in &errs {
        assert!(
            matches!(e, PiperError::PpExceedsLayers { pp: 8, layers: 4 }),
            "{e}"
        );
    }
}

#[test]
fn a_batch_that_does_not_split_is_refused_on_every_rank() {
    let cfg = config();
    let task = Task::new(&cfg, TaskConfig::default()).unwrap();
    let batch = task.batch(0, 6); // 6 sequences over EP 4 x M 1
    let topo = Topology::preset("flat:8").unwrap();
    let errs: Vec<PiperError> = local::run(&topo, Emulation::off(), |world| {
        let mut model = ReferenceModel::new(MoeParams::init(&cfg, SEED).unwrap()).unwrap();
        let mut exec = Executor::new(world, MeshLayout::new(2, 4), 1, &model).unwrap();
        Ok(exec.step(&mut model, &batch.tokens, &batch.targets).err())
    })
    .into_iter()
    .map(|r| r.unwrap().expect("an uneven batch must be refused"))
    .collect();
    for e in &errs {
        assert!(
            matches!(
                e,
                PiperError::BatchSplit {
                    sequences: 6,
                    ep: 4,
                    dp: 1,
                    microbatches: 1
                }
            ),
            "{e}"
        );
    }
}

/// One rank's model fails mid-step (block 1 of stage 0, PP 2 x EP 4): that rank reports
/// its error, every other rank a communication error naming a departed peer, none hangs.
#[test]
fn a_rank_failing_mid_step_is_an_error_on_every_rank() {
    let cfg = config();
    let task = Task::new(&cfg, TaskConfig::default()).unwrap();
    let batch = task.batch(0, SEQUENCES);
    let topo = Topology::preset("flat:8").unwrap();
    let t0 = std::time::Instant::now();
    let out: Vec<Option<PiperError>> = local::run(&topo, Emulation::off(), |world| {
        world.set_timeout(std::time::Duration::from_secs(5));
        // A model brought by the caller, through the same trait: rank 2's experts of
        // block 1 fail in their forward.
        let fail_layer = (world.rank() == 2).then_some(1);
        let mut model = Failing::new(&cfg, SEED, fail_layer, OnRead::Error, true);
        let mut exec = Executor::new(world, MeshLayout::new(2, 4), 4, &model).unwrap();
        Ok(exec.step(&mut model, &batch.tokens, &batch.targets).err())
    })
    .into_iter()
    .map(|r| r.unwrap())
    .collect();
    let took = t0.elapsed();
    for (rank, e) in out.iter().enumerate() {
        let e = e
            .as_ref()
            .unwrap_or_else(|| panic!("rank {rank} finished a step whose peer failed"));
        eprintln!("rank {rank}: {e}");
        if rank == 2 {
            assert!(
                matches!(e, PiperError::Compute(m) if m.contains("injected failure")),
                "{e}"
            );
        } else {
            assert!(matches!(e, PiperError::Comm(_)), "rank {rank}: {e}");
        }
    }
    // The peers see the failed rank gone at once, before the 5 s timeout.
    assert!(took.as_secs() < 5, "took {took:?}");
}

/// Five training steps (Adam state carried across steps): the executor's losses follow the
/// reference's — bitwise with EP = 1, within 1e-4 relative with EP = 4 (rounding of the
/// gradient all-reduce, carried through the updates).
#[test]
fn five_steps_follow_the_reference() {
    let cfg = config();
    let task = Task::new(&cfg, TaskConfig::default()).unwrap();
    let steps = 5u64;
    let mut params = MoeParams::init(&cfg, SEED).unwrap();
    let mut adam = Adam::new(adam_config()).unwrap();
    let mut reference = Vec::new();
    for step in 0..steps {
        let b = task.batch(step, SEQUENCES);
        let n = b.tokens.len() as f32;
        let (loss, grads) = halo_moe::forward_backward(&params, &b.tokens, &b.targets, n).unwrap();
        reference.push(loss);
        adam.step(&mut params, &grads).unwrap();
    }
    for (layout, tol) in [(MeshLayout::new(2, 1), 0.0), (MeshLayout::new(2, 4), 1e-4)] {
        let topo = Topology::preset(&format!("flat:{}", layout.ranks())).unwrap();
        let out = local::run(&topo, Emulation::off(), |world| {
            let mut one = || -> Result<Vec<f64>, PiperError> {
                let mut model = ReferenceModel::new(MoeParams::init(&cfg, SEED)?)?;
                let mut exec = Executor::new(world, layout, 4, &model)?;
                let mut adam = Adam::new(adam_config())?;
                let mut losses = Vec::new();
                for step in 0..steps {
                    let b = task.batch(step, SEQUENCES);
                    losses.push(exec.step(&mut model, &b.tokens, &b.targets)?.loss);
                    exec.adam_step(&mut model, &mut adam)?;
                }
                Ok(losses)
            };
            Ok(one())
        });
        let mut worst = 0.0f64;
        for (rank, r) in out.into_iter().enumerate() {
            let losses = r.unwrap().unwrap_or_else(|e| panic!("rank {rank}: {e}"));
            assert_eq!(losses.len(), reference.len());
            for (step, (a, b)) in losses.iter().zip(&reference).enumerate() {
                let e = (a - b).abs() / b.abs();
                worst = worst.max(e);
                assert!(
                    e <= tol,
                    "PP {} x EP {}: rank {rank}: step {step}: loss {a} vs {b} ({e:e})",
                    layout.pp,
                    layout.ep
                );
            }
        }
        println!(
            "PP {} x EP {}: {steps} steps, worst loss relative error {worst:e}",
            layout.pp, layout.ep
        );
    }
}

/// Overlapped MoE exchanges (one round per local expert index, on the non-blocking
/// scope) give the same bits as the blocking path: loss, every gradient group and the
/// parameters after Adam, on every rank.
/// The de-duplicating dispatch and combine (`Executor::set_dispatch(MoeDispatch::Dedup)`,
/// `MoeExchange`) give all-to-all-v's results up to the order of one sum: the combine
/// adds a token's outputs per node (inside the node first), all-to-all-v in slot order,
/// so the loss agrees to 1e-6 relative, every gradient group to 1e-5 and the parameters
/// after Adam (whose first step divides by |g|) to 1e-4 (`rel_err`), on every rank, on topologies with several nodes per
/// EP group; with one node per EP group (`nodes:1x4`) the two orders coincide and the
/// bits are equal.
#[test]
fn dedup_dispatch_matches_all_to_all_v() {
    let cases = [
        (
            "nodes:2x2",
            MeshLayout {
                pp: 1,
                ep: 4,
                dp: 1,
            },
            4,
        ),
        (
            "nodes:4x1",
            MeshLayout {
                pp: 1,
                ep: 4,
                dp: 1,
            },
            1,
        ),
        (
            "nodes:2x4",
            MeshLayout {
                pp: 2,
                ep: 4,
                dp: 1,
            },
            4,
        ),
        (
            "nodes:4x2",
            MeshLayout {
                pp: 2,
                ep: 2,
                dp: 2,
            },
            1,
        ),
        (
            "nodes:1x4",
            MeshLayout {
                pp: 1,
                ep: 4,
                dp: 1,
            },
            2,
        ),
    ];
    for (topo, layout, m) in cases {
        let plain = run_layout_dispatch(topo, layout, m, false, MoeDispatch::AllToAllV);
        let dedup = run_layout_dispatch(topo, layout, m, false, MoeDispatch::Dedup);
        let one_node = topo == "nodes:1x4";
        for (rank, (a, b)) in plain.into_iter().zip(dedup).enumerate() {
            let (a, b) = (a.unwrap(), b.unwrap());
            let what = format!("{topo} {layout:?} M {m}: rank {rank}");
            if one_node {
                assert_eq!(a.0.to_bits(), b.0.to_bits(), "{what}: loss");
                assert_eq!(a.1, b.1, "{what}: gradients");
                assert_eq!(a.2, b.2, "{what}: parameters after Adam");
                continue;
            }
            let loss = (a.0 - b.0).abs() / a.0.abs().max(f64::MIN_POSITIVE);
            assert!(loss <= 1e-6, "{what}: loss {} vs {} ({loss:e})", a.0, b.0);
            for (what_of, x, y, tol) in [
                ("gradients", &a.1, &b.1, 1e-5),
                ("parameters", &a.2, &b.2, 1e-4),
            ] {
                assert_eq!(x.len(), y.len(), "{what}: {what_of} groups");
                for ((ia, ga), (ib, gb)) in x.iter().zip(y) {
                    assert_eq!(ia, ib, "{what}: {what_of} group ids");
                    let e = rel_err(gb, ga);
                    assert!(e <= tol, "{what}: {what_of} group {ia:?}: rel err {e:e}");
                }
            }
        }
    }
}

#[test]
fn overlap_gives_the_same_bits() {
    let layouts = [
        (
            MeshLayout {
                pp: 1,
                ep: 2,
                dp: 1,
            },
            1,
        ),
        (
            MeshLayout {
                pp: 1,
                ep: 4,
                dp: 1,
            },
            4,
        ),
        (
            MeshLayout {
                pp: 2,
                ep: 4,
                dp: 1,
            },
            4,
        ),
        (
            MeshLayout {
                pp: 2,
                ep: 2,
                dp: 2,
            },
            1,
        ),
        (
            MeshLayout {
                pp: 4,
                ep: 2,
                dp: 1,
            },
            4,
        ),
    ];
    for (layout, m) in layouts {
        let topo = format!("flat:{}", layout.ranks());
        let plain = run_layout_with(&topo, layout, m, false);
        let over = run_layout_with(&topo, layout, m, true);
        for (rank, (a, b)) in plain.into_iter().zip(over).enumerate() {
            let (a, b) = (a.unwrap(), b.unwrap());
            assert_eq!(
                a.0.to_bits(),
                b.0.to_bits(),
                "{layout:?} M {m}: rank {rank}: loss"
            );
            assert_eq!(a.1, b.1, "{layout:?} M {m}: rank {rank}: gradients");
            assert_eq!(
                a.2, b.2,
                "{layout:?} M {m}: rank {rank}: parameters after Adam"
            );
        }
    }
}
