//! Expert migration (Piper's third idea, REFERENCE.md §1.3): when the router sends far
//! more tokens to some experts than to others, move experts between the GPUs of their EP
//! group so that GPU work evens out, without changing the model.
//!
//! - [`load`]: per-expert loads agreed on by a collective, over a window of steps; GPU
//!   load and imbalance (max / mean).
//! - [`planner`]: Piper's hill climbing over swaps.
//! - [`mover`]: moving an expert's weights, gradients and Adam state with `all_to_all_v`,
//!   all or nothing, and switching the table on every rank at the same step boundary.
//! - [`Migrator`]: the three together, as a training loop calls them:
//!
//! ```text
//! let report = exec.step(&mut model, tokens, targets)?;
//! exec.adam_step(&mut model, &mut adam)?;
//! let load = migrator.observe(&mut exec, &report)?;          // collective, every step
//! if let Some(m) = migrator.maybe_migrate(&mut exec, &mut model, &mut adam)? { ... }
//! ```
//!
//! Function is preserved: an expert's rows reach it in the same order whichever rank
//! holds it, so with migration every step's loss, gradient and parameter is bit-for-bit
//! the run's without (`piper/tests/migration.rs`).

pub mod load;
pub mod mover;
pub mod planner;

use std::time::Instant;

use halo_moe::Adam;
use serde::Serialize;

use crate::error::{PiperError, Result};
use crate::executor::{Executor, Placement, StageCompute, StepReport};
pub use load::LoadWindow;
pub use mover::{MoveStats, expert_move_bytes, move_experts};
pub use planner::{LayerPlan, hill_climb};

/// When and how hard to migrate.
#[derive(Debug, Clone, PartialEq)]
pub struct MigrationConfig {
    /// A block is rebalanced when its imbalance (max / mean GPU load over the window)
    /// exceeds this (at least 1).
    pub threshold: f64,
    /// Most swaps per block per migration (Piper's T).
    pub iterations: usize,
    /// Check every this many steps.
    pub every: u64,
    /// Steps of load counted for a decision (at most the last `window` steps).
    pub window: usize,
    /// A block's plan is applied only when it lowers the block's imbalance by at least
    /// this much (absolute): swaps that even out the two GPUs they touch but barely lower
    /// the maximum are not worth their bytes.
    pub min_gain: f64,
}

impl Default for MigrationConfig {
    /// Threshold 1.1, 8 swaps, every 10 steps over the last 10 steps, gain 0.02.
    fn default() -> Self {
        MigrationConfig {
            threshold: 1.1,
            iterations: 8,
            every: 10,
            window: 10,
            min_gain: 0.02,
        }
    }
}

impl MigrationConfig {
    /// Checks every field; the error names the first wrong one.
    ///
    /// # Errors
    /// [`PiperError::Invalid`] naming the field.
    pub fn validate(&self) -> Result<()> {
        if !(self.threshold.is_finite() && self.threshold >= 1.0) {
            return Err(PiperError::invalid(
                "migration",
                "threshold",
                format!(
                    "is {}; must be a number >= 1 (max / mean load)",
                    self.threshold
                ),
            ));
        }
        if self.iterations == 0 {
            return Err(PiperError::invalid(
                "migration",
                "iterations",
                "must be at least 1",
            ));
        }
        if self.every == 0 {
            return Err(PiperError::invalid(
                "migration",
                "every",
                "must be at least 1 step",
            ));
        }
        if !(self.min_gain.is_finite() && self.min_gain >= 0.0) {
            return Err(PiperError::invalid(
                "migration",
                "min_gain",
                format!("is {}; must be a number >= 0", self.min_gain),
            ));
        }
        if self.window == 0 {
            return Err(PiperError::invalid(
                "migration",
                "window",
                "must be at least 1 step",
            ));
        }
        Ok(())
    }
}

/// One step's agreed load (the same on every rank).
#[derive(Debug, Clone, PartialEq)]
pub struct StepLoad {
    /// Slots routed to each expert, `layer * E + expert`, whole model, whole batch.
    pub loads: Vec<u64>,
    /// Per block: imbalance under the table in force this step.
    pub imbalance: Vec<f64>,
    /// Per block: imbalance under the initial (contiguous) table, i.e. without migration
    /// (the routing is the same either way, since migration preserves the function).
    pub imbalance_static: Vec<f64>,
}

/// One block's part of a migration (the same on every rank).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LayerMigration {
    /// The block.
    pub layer: usize,
    /// Swaps the planner made.
    pub swaps: usize,
    /// Experts whose owner changed (a swap moves two; two swaps of one expert may
    /// move fewer).
    pub experts_moved: usize,
    /// Bytes moved in one EP group (weights, gradients, Adam `m`, `v`, step count).
    pub bytes_moved: u64,
    /// Imbalance over the window under the old table.
    pub imbalance_before: f64,
    /// Imbalance over the window under the new table.
    pub imbalance_after: f64,
    /// The loads over the window the plan was made for, by expert id.
    pub expert_loads: Vec<u64>,
    /// Owners (EP index by expert id) after the migration.
    pub owners: Vec<usize>,
}

/// One migration.
#[derive(Debug, Clone, PartialEq)]
pub struct MigrationReport {
    /// The blocks that changed.
    pub layers: Vec<LayerMigration>,
    /// This rank's wall time for planning, moving, voting and switching, seconds.
    pub seconds: f64,
    /// What this rank sent and received.
    pub moved: MoveStats,
}

/// Load counting, planning and moving for one rank's executor.
#[derive(Debug)]
pub struct Migrator {
    config: MigrationConfig,
    window: LoadWindow,
    initial: Placement,
    steps: u64,
    expert_len: usize,
}

impl Migrator {
    /// A migrator for `exec` running a model whose experts have `expert_len` parameters.
    ///
    /// # Errors
    /// [`PiperError::Invalid`] naming a bad field of `config`.
    pub fn new(config: MigrationConfig, exec: &Executor, expert_len: usize) -> Result<Self> {
        config.validate()?;
        let p = exec.placement();
        Ok(Migrator {
            window: LoadWindow::new(config.window, p.layers() * p.experts())?,
            initial: p.clone(),
            config,
            steps: 0,
            expert_len,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &MigrationConfig {
        &self.config
    }

    /// Agrees on the step's loads (collective over the mesh: three small all-reduces),
    /// adds them to the window and returns them with the step's imbalance per block.
    ///
    /// # Errors
    /// [`PiperError::Comm`] from the library.
    pub fn observe(&mut self, exec: &mut Executor, report: &StepReport) -> Result<StepLoad> {
        let mut loads = report.routed.clone();
        load::agree(exec.mesh_mut(), &mut loads)?;
        self.window.push(loads.clone())?;
        self.steps += 1;
        let p = exec.placement();
        let e = p.experts();
        let per_layer = |t: &Placement| -> Vec<f64> {
            (0..t.layers())
                .map(|l| {
                    load::imbalance(&load::gpu_loads(
                        &loads[l * e..(l + 1) * e],
                        t.owners(l),
                        t.ep(),
                    ))
                })
                .collect()
        };
        Ok(StepLoad {
            imbalance: per_layer(p),
            imbalance_static: per_layer(&self.initial),
            loads: loads.clone(),
        })
    }

    /// The plan for the loads in the window: per block whose imbalance exceeds the
    /// threshold, the hill climb from the current table. The same on every rank.
    pub fn plan(&self, current: &Placement) -> (Placement, Vec<LayerMigration>) {
        let loads = self.window.sum();
        let e = current.experts();
        let mut owners: Vec<Vec<usize>> = (0..current.layers())
            .map(|l| current.owners(l).to_vec())
            .collect();
        let mut layers = Vec::new();
        for (l, row) in owners.iter_mut().enumerate() {
            let ld = &loads[l * e..(l + 1) * e];
            let before = load::imbalance(&load::gpu_loads(ld, row, current.ep()));
            if before <= self.config.threshold {
                continue;
            }
            let plan = hill_climb(ld, row, current.ep(), self.config.iterations);
            let moved = plan
                .owners
                .iter()
                .zip(row.iter())
                .filter(|(a, b)| a != b)
                .count();
            if moved == 0 || before - plan.after < self.config.min_gain {
                continue;
            }
            layers.push(LayerMigration {
                layer: l,
                swaps: plan.swaps.len(),
                experts_moved: moved,
                bytes_moved: moved as u64 * expert_move_bytes(self.expert_len),
                imbalance_before: plan.before,
                imbalance_after: plan.after,
                expert_loads: ld.to_vec(),
                owners: plan.owners.clone(),
            });
            *row = plan.owners;
        }
        let next = Placement::from_owners(current.ep(), owners).unwrap_or_else(|_| current.clone());
        (next, layers)
    }

    /// Every [`MigrationConfig::every`] observed steps: plans from the window and, when a
    /// block changes, moves the experts ([`move_experts`]) and restarts the window.
    /// Collective over the mesh. `None` when it was not time or nothing changed.
    ///
    /// # Errors
    /// As [`move_experts`]; on error every rank keeps the old table.
    pub fn maybe_migrate<C: StageCompute>(
        &mut self,
        exec: &mut Executor,
        model: &mut C,
        adam: &mut Adam,
    ) -> Result<Option<MigrationReport>> {
        if self.steps == 0 || !self.steps.is_multiple_of(self.config.every) {
            return Ok(None);
        }
        let t0 = Instant::now();
        let (next, layers) = self.plan(exec.placement());
        if layers.is_empty() {
            return Ok(None);
        }
        let moved = move_experts(exec, model, adam, &next)?;
        self.window.clear();
        Ok(Some(MigrationReport {
            layers,
            seconds: t0.elapsed().as_secs_f64(),
            moved,
        }))
    }
}
