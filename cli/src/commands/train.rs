//! `halo train`: trains `halo-moe`'s reference model on its synthetic task with the Piper
//! executor (crate `halo-piper`), ranks as threads on an in-process cluster.
//!
//! Self-contained: everything the command needs is in this file.

use std::io::Write as _;
use std::path::PathBuf;
use std::time::Instant;

use super::Failure;
use clap::Args;
use halo::local::{self, Emulation};
use halo_cli::plot::{Series, fmt_bytes, step_plot};
use halo_moe::{Adam, AdamConfig, MoeConfig, MoeParams, Task, TaskConfig};
use halo_piper::migration::{LayerMigration, expert_move_bytes};
use halo_piper::{
    Executor, MeshLayout, MigrationConfig, Migrator, ModelConfig, PiperError, ReferenceModel,
};
use halo_topology::Topology;
use serde::Serialize;

/// Train the reference MoE model (halo-moe) on its synthetic task with the Piper pipeline
/// executor: PP x EP (x DP) ranks as threads, 1F1B over micro-batches, tokens dispatched
/// to the experts with HALO's all-to-all-v.
///
/// The task is class-conditioned random successor chains (halo-moe's `Task`): every
/// target follows from the sequence so far, so the loss can fall from ln V towards zero.
/// A step's data depends on the seed and the global batch only, never on the layout.
/// Each step prints rank 0's loss, tokens/s and time split (compute, all-to-all,
/// point-to-point, all-reduce; blocking calls, so waiting for peers — the pipeline
/// bubble — counts in the communication it waits in).
///
/// Every step the ranks agree on how many tokens each expert received (a collective) and
/// print the imbalance (max / mean GPU load, mean over blocks) under the table in force
/// and under the initial table (what it would be without migration: the routing is the
/// same either way). `--skew` makes the task's tokens Zipf-distributed so that imbalance
/// appears; `--migrate` turns on Piper's expert migration (hill-climbing swaps within each
/// EP group, experts moved with their gradients and Adam state), with one line per block
/// that migrated.
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  halo train\n  \
    halo train --model tiny --pp 2 --ep 4 --microbatches 8 --steps 100 --json\n  \
    halo train --pp 1 --ep 2 --dp 2 --microbatches 2 --steps 20\n  \
    halo train --skew 1.2 --migrate --every 10 --plot imbalance.svg")]
pub(crate) struct TrainArgs {
    /// Model preset of halo-moe: tiny or small.
    #[arg(long, default_value = "tiny")]
    model: String,
    /// Pipeline stages.
    #[arg(long, default_value_t = 2)]
    pp: usize,
    /// Expert-parallel group size (must divide the model's experts).
    #[arg(long, default_value_t = 4)]
    ep: usize,
    /// Data-parallel replicas.
    #[arg(long, default_value_t = 1)]
    dp: usize,
    /// Micro-batches per step (1F1B).
    #[arg(long, default_value_t = 8)]
    microbatches: usize,
    /// Sequences per step (global batch); default EP x DP x micro-batches.
    #[arg(long)]
    batch: Option<usize>,
    /// Training steps.
    #[arg(long, default_value_t = 100)]
    steps: u64,
    /// Seed of the parameters and of the data.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Adam's learning rate.
    #[arg(long, default_value_t = 3e-3)]
    lr: f32,
    /// Topology the threads run on (a preset such as nodes:2x4); default flat:PP*EP*DP.
    #[arg(long)]
    topology: Option<String>,
    /// One JSON object per step per line instead of text (with --migrate, also one per
    /// block that migrated, `"event": "migration"`, and a last `"event": "summary"`).
    #[arg(long)]
    json: bool,
    /// Zipf exponent of the synthetic task's token distribution (0 = uniform): a few
    /// tokens, and the experts they are routed to, get most of the traffic.
    #[arg(long, default_value_t = 0.0)]
    skew: f64,
    /// Expert migration: move experts between the GPUs of their EP group when the load
    /// is imbalanced.
    #[arg(long)]
    migrate: bool,
    /// With --migrate: migrate a block when its imbalance (max / mean GPU load over the
    /// window) exceeds X [default: 1.1].
    #[arg(long, value_name = "X")]
    threshold: Option<f64>,
    /// With --migrate: most swaps per block per migration (Piper's T) [default: 8].
    #[arg(long, value_name = "T")]
    iterations: Option<usize>,
    /// With --migrate: check every N steps [default: 10].
    #[arg(long, value_name = "N")]
    every: Option<u64>,
    /// With --migrate: steps of load counted per decision [default: --every].
    #[arg(long, value_name = "W")]
    window: Option<usize>,
    /// With --migrate: apply a block's plan only when it lowers the block's imbalance by
    /// at least G [default: 0.02].
    #[arg(long, value_name = "G")]
    min_gain: Option<f64>,
    /// Write the imbalance per step (with and without migration) as a plot (.svg, or
    /// .png).
    #[arg(long, value_name = "FILE")]
    plot: Option<PathBuf>,
}

/// One step's line.
#[derive(Debug, Serialize)]
struct StepLine {
    step: u64,
    loss: f64,
    tokens: usize,
    seconds: f64,
    tokens_per_s: f64,
    /// Rank 0's time split (seconds); communication includes waiting for peers.
    compute_s: f64,
    all_to_all_s: f64,
    p2p_s: f64,
    all_reduce_s: f64,
    /// Imbalance (max / mean GPU load, mean over blocks) under the table in force.
    imbalance: f64,
    /// The same under the initial table: without migration.
    imbalance_static: f64,
    /// Rank 0's time agreeing on the load and migrating, seconds.
    migration_s: f64,
}

/// One block's migration.
#[derive(Debug, Serialize)]
struct MigrationLine<'a> {
    event: &'static str,
    /// The step after which it happened.
    step: u64,
    #[serde(flatten)]
    layer: &'a LayerMigration,
    /// Rank 0's time for the whole migration (every block), seconds.
    seconds: f64,
}

/// The run's summary (with --migrate).
#[derive(Debug, Serialize)]
struct Summary {
    event: &'static str,
    steps: u64,
    /// Rank 0's training time (steps, optimizer, load agreement and migration), seconds.
    train_s: f64,
    /// Of which load agreement and migration.
    migration_s: f64,
    /// `migration_s / train_s`.
    migration_share: f64,
    migrations: usize,
    experts_moved: usize,
    bytes_moved: u64,
    /// Bytes one expert moves with (weights, gradients, Adam m and v, step count).
    expert_move_bytes: u64,
    /// The resource model's `expert_bytes` for the same shape (16 per parameter).
    model_expert_bytes: f64,
    /// Mean over steps of `imbalance` and `imbalance_static`.
    imbalance_mean: f64,
    imbalance_static_mean: f64,
}

/// What rank 0 returns.
#[derive(Debug, Default)]
struct RunLog {
    losses: Vec<f64>,
    imbalance: Vec<f64>,
    imbalance_static: Vec<f64>,
    train_s: f64,
    migration_s: f64,
    migrations: Vec<(u64, LayerMigration)>,
}

fn input(e: impl std::fmt::Display) -> Failure {
    Failure::input(e)
}

fn piper(e: PiperError) -> Failure {
    if e.is_input() {
        Failure::input(e)
    } else {
        Failure::other(e)
    }
}

/// Writes a line to stdout; a closed pipe is ignored.
fn print_line(text: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{text}").and_then(|()| out.flush());
}

pub(crate) fn run(a: &TrainArgs) -> Result<(), Failure> {
    let cfg = MoeConfig::preset(&a.model).map_err(input)?;
    let layout = MeshLayout {
        pp: a.pp,
        ep: a.ep,
        dp: a.dp,
    };
    if a.steps == 0 {
        return Err(input("--steps must be at least 1"));
    }
    if a.microbatches == 0 {
        return Err(input("--microbatches must be at least 1"));
    }
    let topo_name = a
        .topology
        .clone()
        .unwrap_or_else(|| format!("flat:{}", layout.ranks().max(1)));
    let topo = Topology::preset(&topo_name).map_err(input)?;
    // Every check that needs no communication, before starting any thread.
    layout
        .validate(topo.size(), cfg.layers, cfg.experts)
        .map_err(piper)?;
    let batch = a.batch.unwrap_or(layout.ep * layout.dp * a.microbatches);
    let parts = layout.ep * layout.dp * a.microbatches;
    if batch == 0 || !batch.is_multiple_of(parts) {
        return Err(piper(PiperError::BatchSplit {
            sequences: batch,
            ep: layout.ep,
            dp: layout.dp,
            microbatches: a.microbatches,
        }));
    }
    let task = Task::new(
        &cfg,
        TaskConfig {
            seed: a.seed,
            skew: a.skew,
            ..TaskConfig::default()
        },
    )
    .map_err(input)?;
    let mig_cfg = migration_config(a)?;
    let adam_cfg = AdamConfig {
        lr: a.lr,
        ..AdamConfig::default()
    };
    Adam::new(adam_cfg.clone()).map_err(input)?;
    if !a.json {
        print_line(&format!(
            "halo train: {} (L {}, E {}, k {}, d {}), PP {} x EP {} x DP {} on {topo_name}, \
             {} micro-batches, {batch} sequences of {} tokens per step, seed {}",
            a.model,
            cfg.layers,
            cfg.experts,
            cfg.top_k,
            cfg.hidden,
            layout.pp,
            layout.ep,
            layout.dp,
            a.microbatches,
            cfg.seq,
            a.seed
        ));
        if let Some(m) = &mig_cfg {
            print_line(&format!(
                "skew {}; migration: threshold {}, up to {} swaps per block, every {} steps \
                 over the last {}, gain at least {}",
                a.skew, m.threshold, m.iterations, m.every, m.window, m.min_gain
            ));
        }
    }
    let results = local::run(&topo, Emulation::off(), |world| {
        let one = |world: &mut halo::Communicator| -> Result<RunLog, PiperError> {
            train_rank(
                world,
                a,
                &cfg,
                layout,
                &task,
                batch,
                &adam_cfg,
                mig_cfg.as_ref(),
            )
        };
        Ok(one(world))
    });
    // The first rank's own error is the most telling; a library error (a peer gone) next.
    let mut first_err = None;
    let mut log = None;
    for r in results {
        match r {
            Ok(Ok(l)) => {
                log.get_or_insert(l);
            }
            Ok(Err(e)) => {
                first_err.get_or_insert(piper(e));
            }
            Err(e) => {
                first_err.get_or_insert(Failure::other(e));
            }
        }
    }
    if let Some(e) = first_err {
        return Err(e);
    }
    let log = log.unwrap_or_default();
    let losses = &log.losses;
    if !a.json
        && let (Some(first), Some(last)) = (losses.first(), losses.last())
    {
        print_line(&format!(
            "loss {first:.4} -> {last:.4} over {} steps",
            losses.len()
        ));
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    if let Some(path) = &a.plot {
        let pts = |v: &[f64]| -> Vec<(f64, f64)> {
            v.iter()
                .enumerate()
                .map(|(i, &y)| ((i + 1) as f64, y))
                .collect()
        };
        let mut series = vec![Series {
            name: "without migration".into(),
            points: pts(&log.imbalance_static),
        }];
        if mig_cfg.is_some() {
            series.push(Series {
                name: "with migration".into(),
                points: pts(&log.imbalance),
            });
        }
        let title = format!(
            "halo train {}: PP {} x EP {}, skew {}, seed {}",
            a.model, layout.pp, layout.ep, a.skew, a.seed
        );
        step_plot(
            path,
            &title,
            "imbalance (max / mean GPU load, mean over blocks)",
            1.0,
            &series,
        )
        .map_err(Failure::other)?;
    }
    if mig_cfg.is_some() {
        let model = ModelConfig {
            name: a.model.clone(),
            layers: cfg.layers as u64,
            hidden: cfg.hidden as u64,
            heads: cfg.heads as u64,
            experts: cfg.experts as u64,
            shared_experts: 0,
            top_k: cfg.top_k as u64,
            expert_ffn: cfg.ffn as u64,
            expert_matrices: cfg.expert_matrices as u64,
            vocab: Some(cfg.vocab as u64),
        };
        let sum = Summary {
            event: "summary",
            steps: losses.len() as u64,
            train_s: log.train_s,
            migration_s: log.migration_s,
            migration_share: log.migration_s / log.train_s.max(1e-12),
            migrations: log.migrations.len(),
            experts_moved: log.migrations.iter().map(|m| m.1.experts_moved).sum(),
            bytes_moved: log.migrations.iter().map(|m| m.1.bytes_moved).sum(),
            expert_move_bytes: expert_move_bytes(cfg.expert_len()),
            model_expert_bytes: halo_piper::resource::migration_expert_bytes(&model),
            imbalance_mean: mean(&log.imbalance),
            imbalance_static_mean: mean(&log.imbalance_static),
        };
        if a.json {
            print_line(&serde_json::to_string(&sum).unwrap_or_default());
        } else {
            print_line(&format!(
                "imbalance (mean over steps and blocks): {:.3} without migration, {:.3} with; \
                 {} block migrations moved {} experts ({}); migration {:.3} s of {:.3} s \
                 training ({:.2}%); an expert moves {} B (resource model: {} B + 8 B of Adam \
                 step count)",
                sum.imbalance_static_mean,
                sum.imbalance_mean,
                sum.migrations,
                sum.experts_moved,
                fmt_bytes(sum.bytes_moved as f64),
                sum.migration_s,
                sum.train_s,
                100.0 * sum.migration_share,
                sum.expert_move_bytes,
                sum.model_expert_bytes
            ));
        }
    } else if !a.json {
        print_line(&format!(
            "imbalance (mean over steps and blocks, no migration): {:.3}",
            mean(&log.imbalance_static)
        ));
    }
    Ok(())
}

/// The migration settings, or `None` without --migrate (its options alone are an error).
fn migration_config(a: &TrainArgs) -> Result<Option<MigrationConfig>, Failure> {
    if !a.migrate {
        for (given, name) in [
            (a.threshold.is_some(), "--threshold"),
            (a.iterations.is_some(), "--iterations"),
            (a.every.is_some(), "--every"),
            (a.window.is_some(), "--window"),
            (a.min_gain.is_some(), "--min-gain"),
        ] {
            if given {
                return Err(input(format!("{name} needs --migrate")));
            }
        }
        return Ok(None);
    }
    let d = MigrationConfig::default();
    let every = a.every.unwrap_or(d.every);
    let m = MigrationConfig {
        threshold: a.threshold.unwrap_or(d.threshold),
        iterations: a.iterations.unwrap_or(d.iterations),
        every,
        window: a
            .window
            .unwrap_or_else(|| usize::try_from(every).unwrap_or(usize::MAX)),
        min_gain: a.min_gain.unwrap_or(d.min_gain),
    };
    m.validate().map_err(piper)?;
    Ok(Some(m))
}

/// One rank's training loop; rank 0 prints and returns the log.
#[allow(clippy::too_many_arguments)]
fn train_rank(
    world: &mut halo::Communicator,
    a: &TrainArgs,
    cfg: &MoeConfig,
    layout: MeshLayout,
    task: &Task,
    batch: usize,
    adam_cfg: &AdamConfig,
    mig_cfg: Option<&MigrationConfig>,
) -> Result<RunLog, PiperError> {
    let rank = world.rank();
    let mut model = ReferenceModel::new(MoeParams::init(cfg, a.seed)?)?;
    let mut exec = Executor::new(world, layout, a.microbatches, &model)?;
    let mut adam = Adam::new(adam_cfg.clone())?;
    // Without --migrate the migrator only agrees on the load (it is never asked to move).
    let mut migrator = Migrator::new(
        mig_cfg.cloned().unwrap_or_default(),
        &exec,
        cfg.expert_len(),
    )?;
    let mut log = RunLog::default();
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    for step in 0..a.steps {
        let data = task.batch(step, batch);
        let t0 = Instant::now();
        let report = exec.step(&mut model, &data.tokens, &data.targets)?;
        exec.adam_step(&mut model, &mut adam)?;
        let seconds = t0.elapsed().as_secs_f64();
        let t1 = Instant::now();
        let load = migrator.observe(&mut exec, &report)?;
        let migration = if mig_cfg.is_some() {
            migrator.maybe_migrate(&mut exec, &mut model, &mut adam)?
        } else {
            None
        };
        let migration_s = t1.elapsed().as_secs_f64();
        log.train_s += seconds + migration_s;
        log.migration_s += migration_s;
        log.losses.push(report.loss);
        log.imbalance.push(mean(&load.imbalance));
        log.imbalance_static.push(mean(&load.imbalance_static));
        if rank != 0 {
            continue;
        }
        let line = StepLine {
            step: step + 1,
            loss: report.loss,
            tokens: report.tokens,
            seconds,
            tokens_per_s: report.tokens as f64 / seconds.max(1e-12),
            compute_s: report.times.compute.as_secs_f64(),
            all_to_all_s: report.times.all_to_all.as_secs_f64(),
            p2p_s: report.times.p2p.as_secs_f64(),
            all_reduce_s: report.times.all_reduce.as_secs_f64(),
            imbalance: mean(&load.imbalance),
            imbalance_static: mean(&load.imbalance_static),
            migration_s,
        };
        if a.json {
            print_line(&serde_json::to_string(&line).unwrap_or_default());
        } else {
            let ms = |x: f64| x * 1e3;
            print_line(&format!(
                "step {:>5}  loss {:>8.4}  tokens/s {:>8.0}  ms: compute {:>6.1} \
                 all-to-all {:>6.1} p2p {:>6.1} all-reduce {:>5.1}  imbalance {:.3} \
                 (static {:.3})",
                line.step,
                line.loss,
                line.tokens_per_s,
                ms(line.compute_s),
                ms(line.all_to_all_s),
                ms(line.p2p_s),
                ms(line.all_reduce_s),
                line.imbalance,
                line.imbalance_static
            ));
        }
        if let Some(m) = migration {
            for lm in &m.layers {
                if a.json {
                    let row = MigrationLine {
                        event: "migration",
                        step: step + 1,
                        layer: lm,
                        seconds: m.seconds,
                    };
                    print_line(&serde_json::to_string(&row).unwrap_or_default());
                } else {
                    print_line(&format!(
                        "  migration after step {}: block {}: {} swaps, {} experts moved \
                         ({}), imbalance {:.3} -> {:.3} over the window ({:.1} ms, all blocks)",
                        step + 1,
                        lm.layer,
                        lm.swaps,
                        lm.experts_moved,
                        fmt_bytes(lm.bytes_moved as f64),
                        lm.imbalance_before,
                        lm.imbalance_after,
                        m.seconds * 1e3
                    ));
                }
            }
            log.migrations
                .extend(m.layers.into_iter().map(|lm| (step + 1, lm)));
        }
    }
    Ok(log)
}
