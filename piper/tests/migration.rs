//! Expert migration on the executor (ranks as threads on the in-process transport):
//!
//! - function preserved: with migration, every step's loss and, at the end, every
//!   parameter group are bit-for-bit those of the run without, for PP, EP in {1, 2, 4}
//!   (and one layout with DP 2), including a step where every expert of every block moves
//!   at once, between `step` and `adam_step` (so the gradients must move too);
//! - on a skewed run (skew 1.2, 8 experts on 4 EP ranks) the planner's imbalance is within
//!   10% of the best assignment (brute force) and lower than before, and the switch
//!   happens on every rank;
//! - a rank failing in the middle of a move: every rank errors within the timeout and
//!   keeps the old table, weights, gradients and Adam state.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::{Failing, OnRead};
use halo::local::{self, Emulation};
use halo::topology::Topology;
use halo_moe::{Adam, AdamConfig, AdamState, GroupId, MoeConfig, MoeParams, Task, TaskConfig};
use halo_piper::migration::{self, MigrationConfig, Migrator, move_experts};
use halo_piper::{Executor, MeshLayout, PiperError, Placement, ReferenceModel};

const SEED: u64 = 7;
const SEQUENCES: usize = 16;
const STEPS: u64 = 6;
/// The step after whose `step` (before `adam_step`) every expert moves one rank on.
const ROTATE_AT: u64 = 2;

fn config() -> MoeConfig {
    MoeConfig {
        seq: 16,
        ..MoeConfig::tiny()
    }
}

fn task(skew: f64) -> Task {
    Task::new(
        &config(),
        TaskConfig {
            skew,
            ..TaskConfig::default()
        },
    )
    .unwrap()
}

fn adam_config() -> AdamConfig {
    AdamConfig {
        lr: 3e-3,
        ..AdamConfig::default()
    }
}

/// Every expert of every block moves to the next EP index.
fn rotated(p: &Placement) -> Placement {
    let owners = (0..p.layers())
        .map(|l| p.owners(l).iter().map(|&q| (q + 1) % p.ep()).collect())
        .collect();
    Placement::from_owners(p.ep(), owners).unwrap()
}

/// What a rank returns from a run: losses per step, its final table, and the final
/// parameters and Adam state of the groups it owns.
struct RunOut {
    losses: Vec<f64>,
    placement: Placement,
    params: BTreeMap<GroupId, Vec<f32>>,
    adam: BTreeMap<GroupId, AdamState>,
    /// Experts moved by each planned migration (this rank's view of the whole model).
    moved: Vec<usize>,
    /// Experts moved by the rotation.
    rotated: usize,
}

fn run(layout: MeshLayout, migrate: bool) -> Vec<RunOut> {
    let cfg = config();
    let task = task(1.2);
    let topo = Topology::preset(&format!("flat:{}", layout.ranks())).unwrap();
    local::run(&topo, Emulation::off(), |world| {
        let mut one = || -> Result<RunOut, PiperError> {
            let mut model = ReferenceModel::new(MoeParams::init(&cfg, SEED)?)?;
            let mut exec = Executor::new(world, layout, 2, &model)?;
            let mut adam = Adam::new(adam_config())?;
            let mc = MigrationConfig {
                threshold: 1.0,
                iterations: 8,
                every: 2,
                window: 2,
                min_gain: 0.0,
            };
            let mut mig = Migrator::new(mc, &exec, cfg.expert_len())?;
            let mut out = RunOut {
                losses: Vec::new(),
                placement: exec.placement().clone(),
                params: BTreeMap::new(),
                adam: BTreeMap::new(),
                moved: Vec::new(),
                rotated: 0,
            };
            for step in 0..STEPS {
                let b = task.batch(step, SEQUENCES);
                let report = exec.step(&mut model, &b.tokens, &b.targets)?;
                out.losses.push(report.loss);
                if migrate && step == ROTATE_AT {
                    // Between the backward and the optimizer: gradients must move too.
                    let next = rotated(exec.placement());
                    let moved = (0..next.layers())
                        .map(|l| {
                            (0..next.experts())
                                .filter(|&e| next.owner(l, e) != exec.placement().owner(l, e))
                                .count()
                        })
                        .sum();
                    move_experts(&mut exec, &mut model, &mut adam, &next)?;
                    assert_eq!(exec.placement(), &next);
                    out.rotated = moved;
                }
                exec.adam_step(&mut model, &mut adam)?;
                if migrate {
                    mig.observe(&mut exec, &report)?;
                    if let Some(r) = mig.maybe_migrate(&mut exec, &mut model, &mut adam)? {
                        out.moved
                            .push(r.layers.iter().map(|l| l.experts_moved).sum::<usize>());
                    }
                }
            }
            out.placement = exec.placement().clone();
            for id in exec.owned_groups() {
                out.params.insert(id, model.params().group(id)?.to_vec());
                if let GroupId::Expert { .. } = id {
                    let st = adam.state(id).cloned().expect("an owned expert has state");
                    out.adam.insert(id, st);
                }
            }
            // No state left behind for experts this rank gave away.
            for id in adam.groups() {
                assert!(
                    out.params.contains_key(&id),
                    "Adam state of {id} on a rank that does not own it"
                );
            }
            Ok(out)
        };
        Ok(one())
    })
    .into_iter()
    .enumerate()
    .map(|(rank, r)| {
        r.unwrap()
            .unwrap_or_else(|e| panic!("rank {rank} of {layout:?}: {e}"))
    })
    .collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn migration_preserves_the_function_bitwise() {
    let mut layouts = Vec::new();
    for pp in [1, 2, 4] {
        for ep in [1, 2, 4] {
            if pp * ep <= 8 {
                layouts.push(MeshLayout::new(pp, ep));
            }
        }
    }
    layouts.push(MeshLayout {
        pp: 2,
        ep: 2,
        dp: 2,
    });
    for layout in layouts {
        let plain = run(layout, false);
        let moved = run(layout, true);
        let table = &moved[0].placement;
        let mut all_plain: BTreeMap<GroupId, Vec<u32>> = BTreeMap::new();
        let mut all_moved: BTreeMap<GroupId, Vec<u32>> = BTreeMap::new();
        let mut adam_plain: BTreeMap<GroupId, &AdamState> = BTreeMap::new();
        let mut adam_moved: BTreeMap<GroupId, &AdamState> = BTreeMap::new();
        for (rank, (a, b)) in plain.iter().zip(&moved).enumerate() {
            let la: Vec<u64> = a.losses.iter().map(|x| x.to_bits()).collect();
            let lb: Vec<u64> = b.losses.iter().map(|x| x.to_bits()).collect();
            assert_eq!(
                la, lb,
                "{layout:?} rank {rank}: losses {:?} vs {:?}",
                a.losses, b.losses
            );
            assert_eq!(&b.placement, table, "{layout:?}: rank {rank}'s table");
            for (id, p) in &a.params {
                all_plain.insert(*id, bits(p));
            }
            for (id, p) in &b.params {
                // DP replicas hold equal copies.
                let prev = all_moved.insert(*id, bits(p));
                assert!(
                    prev.is_none_or(|q| q == bits(p)),
                    "{layout:?}: {id} replicas"
                );
            }
            adam_plain.extend(a.adam.iter().map(|(k, v)| (*k, v)));
            adam_moved.extend(b.adam.iter().map(|(k, v)| (*k, v)));
        }
        assert_eq!(all_plain.len(), all_moved.len(), "{layout:?}: groups");
        for (id, p) in &all_plain {
            assert!(all_moved[id] == *p, "{layout:?}: {id} after {STEPS} steps");
        }
        assert_eq!(adam_plain, adam_moved, "{layout:?}: Adam states");
        let total: usize = moved[0].moved.iter().sum();
        if layout.ep > 1 {
            // The rotation moves every expert of every block at once.
            assert_eq!(moved[0].rotated, config().layers * config().experts);
            assert!(total > 0, "{layout:?}: the planner moved nothing");
            assert_ne!(
                table,
                &Placement::contiguous(config().layers, config().experts, layout.ep).unwrap()
            );
        } else {
            assert_eq!(total, 0);
        }
        println!(
            "{layout:?}: {STEPS} steps bitwise equal with migration (all {} experts rotated at once, \
             then {} planned migrations moving {total})",
            moved[0].rotated,
            moved[0].moved.len()
        );
    }
}

/// The smallest max GPU load over every assignment of `loads` to `ep` GPUs with an equal
/// number of experts each.
fn best_max(loads: &[u64], ep: usize) -> u64 {
    fn go(
        loads: &[u64],
        i: usize,
        per: usize,
        held: &mut [usize],
        sum: &mut [u64],
        best: &mut u64,
    ) {
        if i == loads.len() {
            *best = (*best).min(*sum.iter().max().unwrap());
            return;
        }
        for q in 0..held.len() {
            if held[q] == per {
                continue;
            }
            held[q] += 1;
            sum[q] += loads[i];
            if sum[q] < *best {
                go(loads, i + 1, per, held, sum, best);
            }
            held[q] -= 1;
            sum[q] -= loads[i];
        }
    }
    let mut best = u64::MAX;
    go(
        loads,
        0,
        loads.len() / ep,
        &mut vec![0; ep],
        &mut vec![0; ep],
        &mut best,
    );
    best
}

#[test]
fn a_skewed_run_gets_within_ten_percent_of_the_best_assignment() {
    let cfg = config();
    assert_eq!(cfg.experts, 8);
    let layout = MeshLayout::new(2, 4);
    let task = task(1.2);
    let topo = Topology::preset("flat:8").unwrap();
    let window = 4;
    let out = local::run(&topo, Emulation::off(), |world| {
        let mut one = || -> Result<_, PiperError> {
            let mut model = ReferenceModel::new(MoeParams::init(&cfg, SEED)?)?;
            let mut exec = Executor::new(world, layout, 2, &model)?;
            let mut adam = Adam::new(adam_config())?;
            let mc = MigrationConfig {
                threshold: 1.05,
                iterations: 16,
                every: window as u64,
                window,
                min_gain: 0.0,
            };
            let mut mig = Migrator::new(mc, &exec, cfg.expert_len())?;
            let mut report = None;
            let mut after_loads = None;
            for step in 0..=window as u64 {
                let b = task.batch(step, SEQUENCES);
                let r = exec.step(&mut model, &b.tokens, &b.targets)?;
                exec.adam_step(&mut model, &mut adam)?;
                let load = mig.observe(&mut exec, &r)?;
                if step == window as u64 {
                    after_loads = Some(load);
                } else if let Some(m) = mig.maybe_migrate(&mut exec, &mut model, &mut adam)? {
                    report = Some(m);
                }
            }
            Ok((report, exec.placement().clone(), after_loads))
        };
        Ok(one())
    });
    let outs: Vec<_> = out
        .into_iter()
        .map(|r| r.unwrap().unwrap_or_else(|e| panic!("{e}")))
        .collect();
    let (report, table, _) = &outs[0];
    let report = report.as_ref().expect("a skewed run migrates");
    for (rank, (r, t, _)) in outs.iter().enumerate() {
        assert_eq!(
            r.as_ref().map(|r| &r.layers),
            Some(&report.layers),
            "rank {rank}"
        );
        assert_eq!(t, table, "rank {rank}'s table");
    }
    assert!(!report.layers.is_empty());
    for lm in &report.layers {
        let best = best_max(&lm.expert_loads, 4);
        let total: u64 = lm.expert_loads.iter().sum();
        let best_imb = best as f64 * 4.0 / total as f64;
        println!(
            "block {}: loads {:?}: imbalance {:.3} -> {:.3} in {} swaps ({} experts, {} B); best {:.3}",
            lm.layer,
            lm.expert_loads,
            lm.imbalance_before,
            lm.imbalance_after,
            lm.swaps,
            lm.experts_moved,
            lm.bytes_moved,
            best_imb
        );
        assert!(
            lm.imbalance_after < lm.imbalance_before,
            "block {}",
            lm.layer
        );
        assert!(
            lm.imbalance_after <= 1.1 * best_imb,
            "block {}: {} vs best {best_imb}",
            lm.layer,
            lm.imbalance_after
        );
        // The table in force is the plan's, and it gives the reported imbalance.
        assert_eq!(table.owners(lm.layer), lm.owners.as_slice());
        let g = migration::load::gpu_loads(&lm.expert_loads, &lm.owners, 4);
        assert_eq!(migration::load::imbalance(&g), lm.imbalance_after);
        assert_eq!(
            lm.bytes_moved,
            lm.experts_moved as u64 * (16 * cfg.expert_len() as u64 + 8)
        );
    }
}

/// PP 2 x EP 4, every expert moving: rank 1 (stage 0) dies after block 0's transfer, when
/// it copies out block 1. Every rank errors, within the timeout, and keeps the old table
/// and every weight, gradient and Adam state it had.
#[test]
fn a_rank_dying_mid_move_leaves_every_rank_as_it_was() {
    let cfg = config();
    let task = task(1.2);
    let layout = MeshLayout::new(2, 4);
    let topo = Topology::preset("flat:8").unwrap();
    let timeout = Duration::from_secs(5);
    let t_move = std::sync::Mutex::new(Vec::new());
    let out = local::run(&topo, Emulation::off(), |world| {
        world.set_timeout(timeout);
        let rank = world.rank();
        let mut model = Failing::new(&cfg, SEED, (rank == 1).then_some(1), OnRead::Error, false);
        let mut exec = Executor::new(world, layout, 2, &model).unwrap();
        let mut adam = Adam::new(adam_config()).unwrap();
        for step in 0..2 {
            let b = task.batch(step, SEQUENCES);
            exec.step(&mut model, &b.tokens, &b.targets).unwrap();
            exec.adam_step(&mut model, &mut adam).unwrap();
        }
        let b = task.batch(2, SEQUENCES);
        exec.step(&mut model, &b.tokens, &b.targets).unwrap();
        let table = exec.placement().clone();
        let params = model.inner.params().clone();
        let grads = model.inner.grads().clone();
        let states: Vec<_> = adam
            .groups()
            .into_iter()
            .map(|id| (id, adam.state(id).cloned()))
            .collect();
        model.armed.store(true, Ordering::Relaxed);
        let next = rotated(&table);
        let t0 = Instant::now();
        let err = move_experts(&mut exec, &mut model, &mut adam, &next).err();
        t_move.lock().unwrap().push((rank, t0.elapsed()));
        let unchanged = exec.placement() == &table
            && model.inner.params() == &params
            && model.inner.grads() == &grads
            && adam
                .groups()
                .into_iter()
                .map(|id| (id, adam.state(id).cloned()))
                .collect::<Vec<_>>()
                == states;
        Ok((err, unchanged))
    });
    for (rank, r) in out.into_iter().enumerate() {
        let (err, unchanged) = r.unwrap();
        let err = err.unwrap_or_else(|| panic!("rank {rank} completed a move whose peer died"));
        eprintln!("rank {rank}: {err}");
        assert!(
            matches!(err, PiperError::Migration { .. }),
            "rank {rank}: {err}"
        );
        if rank == 1 {
            assert!(err.to_string().contains("injected death"), "{err}");
        }
        assert!(
            unchanged,
            "rank {rank} changed its table, weights, gradients or Adam state"
        );
    }
    for (rank, t) in t_move.into_inner().unwrap() {
        assert!(t < timeout, "rank {rank} took {t:?} to fail");
    }
}

#[test]
fn ranks_given_different_tables_are_refused_on_every_rank() {
    let cfg = config();
    let topo = Topology::preset("flat:4").unwrap();
    let out = local::run(&topo, Emulation::off(), |world| {
        let rank = world.rank();
        let mut model = ReferenceModel::new(MoeParams::init(&cfg, SEED).unwrap()).unwrap();
        let mut exec = Executor::new(world, MeshLayout::new(1, 4), 1, &model).unwrap();
        let mut adam = Adam::new(adam_config()).unwrap();
        let mut next = exec.placement().clone();
        next.swap(0, 0, if rank == 3 { 7 } else { 6 });
        let err = move_experts(&mut exec, &mut model, &mut adam, &next).err();
        Ok((err, exec.placement().clone()))
    });
    let contiguous = Placement::contiguous(cfg.layers, cfg.experts, 4).unwrap();
    for r in out {
        let (err, table) = r.unwrap();
        let err = err.expect("different tables must be refused");
        assert_eq!(
            err.to_string(),
            "invalid placement: table: the ranks of the mesh were given different tables"
        );
        assert_eq!(table, contiguous);
    }
}
