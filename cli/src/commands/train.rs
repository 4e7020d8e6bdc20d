//! `halo train`: trains `halo-moe`'s reference model on its synthetic task with the Piper
//! executor (crate `halo-piper`), ranks as threads on an in-process cluster.
//!
//! Self-contained: everything the command needs is in this file.

use std::io::Write as _;
use std::time::Instant;

use super::Failure;
use clap::Args;
use halo::local::{self, Emulation};
use halo_moe::{Adam, AdamConfig, MoeConfig, MoeParams, Task, TaskConfig};
use halo_piper::{Executor, MeshLayout, PiperError, ReferenceModel};
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
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  halo train\n  \
    halo train --model tiny --pp 2 --ep 4 --microbatches 8 --steps 100 --json\n  \
    halo train --pp 1 --ep 2 --dp 2 --microbatches 2 --steps 20")]
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
    /// One JSON object per step per line instead of text.
    #[arg(long)]
    json: bool,
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
            ..TaskConfig::default()
        },
    )
    .map_err(input)?;
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
    }
    let results = local::run(&topo, Emulation::off(), |world| {
        let rank = world.rank();
        let one = |world: &mut halo::Communicator| -> Result<Vec<f64>, PiperError> {
            let mut model = ReferenceModel::new(MoeParams::init(&cfg, a.seed)?)?;
            let mut exec = Executor::new(world, layout, a.microbatches, &model)?;
            let mut adam = Adam::new(adam_cfg.clone())?;
            let mut losses = Vec::with_capacity(a.steps as usize);
            for step in 0..a.steps {
                let data = task.batch(step, batch);
                let t0 = Instant::now();
                let report = exec.step(&mut model, &data.tokens, &data.targets)?;
                exec.adam_step(&mut model, &mut adam)?;
                let seconds = t0.elapsed().as_secs_f64();
                losses.push(report.loss);
                if rank == 0 {
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
                    };
                    if a.json {
                        print_line(&serde_json::to_string(&line).unwrap_or_default());
                    } else {
                        let ms = |x: f64| x * 1e3;
                        print_line(&format!(
                            "step {:>5}  loss {:>8.4}  tokens/s {:>8.0}  ms: compute {:>6.1} \
                             all-to-all {:>6.1} p2p {:>6.1} all-reduce {:>5.1}",
                            line.step,
                            line.loss,
                            line.tokens_per_s,
                            ms(line.compute_s),
                            ms(line.all_to_all_s),
                            ms(line.p2p_s),
                            ms(line.all_reduce_s)
                        ));
                    }
                }
            }
            Ok(losses)
        };
        Ok(one(world))
    });
    // The first rank's own error is the most telling; a library error (a peer gone) next.
    let mut first_err = None;
    let mut losses = None;
    for r in results {
        match r {
            Ok(Ok(l)) => {
                losses.get_or_insert(l);
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
    let losses = losses.unwrap_or_default();
    if !a.json
        && let (Some(first), Some(last)) = (losses.first(), losses.last())
    {
        print_line(&format!(
            "loss {first:.4} -> {last:.4} over {} steps",
            losses.len()
        ));
    }
    Ok(())
}
