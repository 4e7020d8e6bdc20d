//! `halo train`: trains `halo-moe`'s reference model on its synthetic task with the Piper
//! executor (crate `halo-piper`): ranks as threads on an in-process cluster, or as the
//! processes of a job started by `halo launch` (or another launcher).
//!
//! Self-contained: everything the command needs is in this file.
//!
//! Over 800 lines: the command's options, its two ways of running (threads or a
//! launched job), the progress report and the JSON summary read as one flow; none of it
//! is used elsewhere.

use std::io::Write as _;
use std::path::PathBuf;
use std::time::Instant;

use super::Failure;
use crate::plot::{Series, fmt_bytes, step_plot};
use clap::Args;
use halo::Communicator;
use halo::local::{self, Emulation};
use halo_moe::{Adam, AdamConfig, MoeConfig, MoeParams, Task, TaskConfig};
use halo_piper::migration::{LayerMigration, expert_move_bytes};
use halo_piper::predict::Workload;
use halo_piper::{
    Executor, HardwareProfile, MemoryOptions, MeshLayout, MigrationConfig, Migrator, ModelConfig,
    PiperError, ReferenceModel, plan,
};
use halo_topology::Topology;
use indicatif::ProgressBar;
use serde::Serialize;

/// Train the reference MoE model (halo-moe) on its synthetic task with the Piper pipeline
/// executor: PP x EP (x DP) ranks, 1F1B over micro-batches, tokens dispatched to the
/// experts with HALO's all-to-all-v.
///
/// Without a launcher the ranks are threads of this process (no cluster needed); started
/// by `halo launch -n P` (or mpirun, srun, torchrun) every process is one rank and the
/// layout must use all P of them. `--hosts H` runs the threads as H emulated hosts
/// (topology nodes:HxR, link emulation on); `halo launch --hosts H` does it with real
/// processes in network namespaces.
///
/// The task is class-conditioned random successor chains (halo-moe's `Task`): every
/// target follows from the sequence so far, so the loss can fall from ln V towards zero.
/// A step's data depends on the seed and the global batch only, never on the layout.
/// Each step prints the loss, tokens/s and rank 0's time split: compute, all-to-all,
/// point-to-point transfer, all-reduce, and idle (waiting for the neighbour stage: the
/// pipeline bubble). At the end, every rank's peak activation memory and idle share.
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
    halo train --model tiny --pp 2 --ep 4 --microbatches 8 --steps 100 --plot loss.svg\n  \
    halo train --pp 1 --ep 2 --dp 2 --microbatches 2 --steps 20 --json\n  \
    halo train --auto-layout --topology nodes:2x4 --hosts 2\n  \
    halo launch -n 8 -- halo train --pp 2 --ep 4\n  \
    halo launch -n 8 --hosts 4 --host-rate 1gbit -- halo train --pp 2 --ep 4\n  \
    halo train --skew 1.2 --migrate --every 10 --plot-imbalance imbalance.svg")]
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
    /// Take PP, EP, DP and the micro-batches from the planner (`halo plan layout`): its
    /// best predicted layout for this model, batch and topology (--profile's hardware).
    #[arg(long)]
    auto_layout: bool,
    /// Hardware profile the planner predicts with (--auto-layout): mi250x-gcd, h100-sxm
    /// or a file.
    #[arg(long, default_value = "mi250x-gcd")]
    profile: String,
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
    /// Topology the threads run on (a preset such as nodes:2x4); default flat:PP*EP*DP,
    /// or nodes:HxR with --hosts H.
    #[arg(long)]
    topology: Option<String>,
    /// Threads only: run the ranks as H emulated hosts (topology nodes:HxR unless
    /// --topology is given) with link emulation on.
    #[arg(long)]
    hosts: Option<usize>,
    /// Threads only: delay every message to the topology's modelled time, times SCALE
    /// (default 1 when given without a value; on with --hosts).
    #[arg(long, num_args = 0..=1, default_missing_value = "1")]
    emulate: Option<f64>,
    /// Overlap the MoE layers' communication with the experts' compute: one
    /// all-to-all-v per local expert index, on the non-blocking scope (same results, bit
    /// for bit).
    #[arg(long)]
    overlap: bool,
    /// How each MoE layer moves the tokens: `a2av` (one copy per (token, expert) both
    /// ways) or `dedup` (the forward dispatch sends one copy per destination node,
    /// replicated inside it, and the forward combine sums a token's outputs inside each
    /// node before one row goes back; the backward stays per (token, expert)). The same
    /// sums in another order: losses agree to 1e-6; not with --overlap.
    #[arg(long, default_value = "a2av", value_parser = ["a2av", "dedup"])]
    dispatch: String,
    /// Run as threads even when started by a launcher.
    #[arg(long)]
    threads: bool,
    /// Write the loss curve to this file at the end (SVG, or PNG for a .png name).
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Write the imbalance per step (with and without migration) as a plot (.svg, or
    /// .png).
    #[arg(long, value_name = "FILE")]
    plot_imbalance: Option<PathBuf>,
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
}

/// One step's line.
#[derive(Debug, Serialize)]
struct StepLine {
    step: u64,
    loss: f64,
    tokens: usize,
    seconds: f64,
    tokens_per_s: f64,
    /// Rank 0's time split (seconds); they add up to its step time.
    compute_s: f64,
    all_to_all_s: f64,
    p2p_s: f64,
    idle_s: f64,
    all_reduce_s: f64,
    /// Rank 0's peak of saved activations in the step.
    activation_bytes: usize,
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

/// What a rank returns (the series are the same on every rank: the loss and the loads
/// are agreed on).
#[derive(Debug, Default)]
struct RunLog {
    losses: Vec<f64>,
    imbalance: Vec<f64>,
    imbalance_static: Vec<f64>,
    train_s: f64,
    migration_s: f64,
    migrations: Vec<(u64, LayerMigration)>,
}

/// What rank 0 reports as the run goes.
enum Event<'a> {
    Step(StepLine),
    Migration(MigrationLine<'a>),
}

/// One rank's figures over the whole run.
#[derive(Debug, Clone, Copy, Default)]
struct RankSummary {
    stage: usize,
    ep_index: usize,
    dp_index: usize,
    peak_bytes: usize,
    expert_bytes: usize,
    in_flight: usize,
    idle_s: f64,
    total_s: f64,
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

/// Everything a rank needs, decided before any communication.
struct Setup {
    cfg: MoeConfig,
    layout: MeshLayout,
    microbatches: usize,
    batch: usize,
    task: Task,
    adam: AdamConfig,
    migration: Option<MigrationConfig>,
    overlap: bool,
    dispatch: halo::MoeDispatch,
}

/// Resolves the model, the layout (given or planned) and the batch for `ranks` ranks
/// on `topo`; every check that needs no communication.
fn setup(a: &TrainArgs, topo: &Topology) -> Result<Setup, Failure> {
    let cfg = MoeConfig::preset(&a.model).map_err(input)?;
    if a.steps == 0 {
        return Err(input("--steps must be at least 1"));
    }
    if a.microbatches == 0 {
        return Err(input("--microbatches must be at least 1"));
    }
    let (layout, microbatches) = if a.auto_layout {
        planned_layout(a, &cfg, topo)?
    } else {
        let l = MeshLayout {
            pp: a.pp,
            ep: a.ep,
            dp: a.dp,
        };
        (l, a.microbatches)
    };
    layout
        .validate(topo.size(), cfg.layers, cfg.experts)
        .map_err(piper)?;
    let batch = a.batch.unwrap_or(layout.ep * layout.dp * microbatches);
    let parts = layout.ep * layout.dp * microbatches;
    if batch == 0 || !batch.is_multiple_of(parts) {
        return Err(piper(PiperError::BatchSplit {
            sequences: batch,
            ep: layout.ep,
            dp: layout.dp,
            microbatches,
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
    let adam = AdamConfig {
        lr: a.lr,
        ..AdamConfig::default()
    };
    Adam::new(adam.clone()).map_err(input)?;
    let migration = migration_config(a)?;
    let dispatch: halo::MoeDispatch = a.dispatch.parse().map_err(input)?;
    if a.overlap && dispatch == halo::MoeDispatch::Dedup {
        return Err(input("--overlap and --dispatch dedup cannot be combined"));
    }
    Ok(Setup {
        cfg,
        layout,
        microbatches,
        batch,
        task,
        adam,
        migration,
        overlap: a.overlap,
        dispatch,
    })
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

/// The planner's best layout for this model on `topo` (`halo plan layout`), with the
/// batch of `--batch` or, by default, 8 sequences per rank.
fn planned_layout(
    a: &TrainArgs,
    cfg: &MoeConfig,
    topo: &Topology,
) -> Result<(MeshLayout, usize), Failure> {
    let model = ModelConfig::from(cfg);
    let profile = HardwareProfile::resolve(&a.profile).map_err(piper)?;
    let batch = a.batch.unwrap_or(8 * topo.size());
    let workload = Workload {
        batch: batch as u64,
        seq: cfg.seq as u64,
        options: MemoryOptions::default(),
    };
    let p = plan(topo, &model, &workload, &profile).map_err(piper)?;
    // The planner splits a micro-batch's tokens over the EP group; the executor gives
    // every EP rank whole sequences, so EP x DP x M must divide the batch: the planner's
    // M, else the largest M below it that does (at least PP).
    let best = p
        .layouts
        .iter()
        .map(|l| l.layout)
        .find_map(|l| {
            let fits = |m: u64| (batch as u64).is_multiple_of(l.ep * l.dp * m);
            let m = (l.pp..=l.microbatches).rev().find(|&m| fits(m))?;
            Some(halo_piper::Layout {
                microbatches: m,
                ..l
            })
        })
        .ok_or_else(|| {
            input(format!(
                "--auto-layout: the planner found no layout for {} ranks whose EP x DP x M \
                 divides the batch of {batch} sequences",
                topo.size()
            ))
        })?;
    Ok((
        MeshLayout {
            pp: best.pp as usize,
            ep: best.ep as usize,
            dp: best.dp as usize,
        },
        best.microbatches as usize,
    ))
}

/// Trains on one rank; rank 0 reports each step (and migration) through `report`.
/// Returns the run's log and this rank's summary.
fn train_rank(
    world: &mut Communicator,
    s: &Setup,
    seed: u64,
    steps: u64,
    report: &(dyn Fn(Event<'_>) + Sync),
) -> Result<(RunLog, RankSummary), PiperError> {
    let rank = world.rank();
    let mut model = ReferenceModel::new(MoeParams::init(&s.cfg, seed)?)?;
    let mut exec = Executor::new(world, s.layout, s.microbatches, &model)?;
    exec.set_overlap(s.overlap);
    exec.set_dispatch(s.dispatch);
    let mut adam = Adam::new(s.adam.clone())?;
    // Without --migrate the migrator only agrees on the load (it is never asked to move).
    let mut migrator = Migrator::new(
        s.migration.clone().unwrap_or_default(),
        &exec,
        s.cfg.expert_len(),
    )?;
    let mut log = RunLog::default();
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    let mesh = exec.mesh();
    let mut sum = RankSummary {
        stage: mesh.stage(),
        ep_index: mesh.ep_index(),
        dp_index: mesh.dp_index(),
        ..RankSummary::default()
    };
    for step in 0..steps {
        let data = s.task.batch(step, s.batch);
        let t0 = Instant::now();
        let r = exec.step(&mut model, &data.tokens, &data.targets)?;
        exec.adam_step(&mut model, &mut adam)?;
        let seconds = t0.elapsed().as_secs_f64();
        let t1 = Instant::now();
        let load = migrator.observe(&mut exec, &r)?;
        let migration = if s.migration.is_some() {
            migrator.maybe_migrate(&mut exec, &mut model, &mut adam)?
        } else {
            None
        };
        let migration_s = t1.elapsed().as_secs_f64();
        log.train_s += seconds + migration_s;
        log.migration_s += migration_s;
        log.losses.push(r.loss);
        log.imbalance.push(mean(&load.imbalance));
        log.imbalance_static.push(mean(&load.imbalance_static));
        if r.activations.bytes > sum.peak_bytes {
            sum.peak_bytes = r.activations.bytes;
            sum.expert_bytes = r.activations.expert_bytes;
            sum.in_flight = r.activations.in_flight;
        }
        sum.idle_s += r.times.idle.as_secs_f64();
        sum.total_s += r.times.total.as_secs_f64();
        if rank == 0 {
            report(Event::Step(StepLine {
                step: step + 1,
                loss: r.loss,
                tokens: r.tokens,
                seconds,
                tokens_per_s: r.tokens as f64 / seconds.max(1e-12),
                compute_s: r.times.compute.as_secs_f64(),
                all_to_all_s: r.times.all_to_all.as_secs_f64(),
                p2p_s: r.times.p2p.as_secs_f64(),
                idle_s: r.times.idle.as_secs_f64(),
                all_reduce_s: r.times.all_reduce.as_secs_f64(),
                activation_bytes: r.activations.bytes,
                imbalance: mean(&load.imbalance),
                imbalance_static: mean(&load.imbalance_static),
                migration_s,
            }));
        }
        if let Some(m) = migration {
            if rank == 0 {
                for lm in &m.layers {
                    report(Event::Migration(MigrationLine {
                        event: "migration",
                        step: step + 1,
                        layer: lm,
                        seconds: m.seconds,
                    }));
                }
            }
            log.migrations
                .extend(m.layers.into_iter().map(|lm| (step + 1, lm)));
        }
    }
    Ok((log, sum))
}

/// Every rank's summary at rank 0 (an all-gather over the world).
fn gather_summaries(
    world: &mut Communicator,
    mine: RankSummary,
) -> Result<Vec<RankSummary>, PiperError> {
    let send = [
        mine.stage as f64,
        mine.ep_index as f64,
        mine.dp_index as f64,
        mine.peak_bytes as f64,
        mine.expert_bytes as f64,
        mine.in_flight as f64,
        mine.idle_s,
        mine.total_s,
    ];
    let mut recv = vec![0.0f64; send.len() * world.size()];
    world.all_gather(&send, &mut recv)?;
    Ok(recv
        .chunks_exact(send.len())
        .map(|c| RankSummary {
            stage: c[0] as usize,
            ep_index: c[1] as usize,
            dp_index: c[2] as usize,
            peak_bytes: c[3] as usize,
            expert_bytes: c[4] as usize,
            in_flight: c[5] as usize,
            idle_s: c[6],
            total_s: c[7],
        })
        .collect())
}

fn step_text(line: &StepLine) -> String {
    let ms = |x: f64| x * 1e3;
    format!(
        "step {:>5}  loss {:>8.4}  tokens/s {:>8.0}  ms: compute {:>6.1} all-to-all {:>6.1} \
         p2p {:>5.1} idle {:>6.1} all-reduce {:>5.1}  imbalance {:.3} (static {:.3})",
        line.step,
        line.loss,
        line.tokens_per_s,
        ms(line.compute_s),
        ms(line.all_to_all_s),
        ms(line.p2p_s),
        ms(line.idle_s),
        ms(line.all_reduce_s),
        line.imbalance,
        line.imbalance_static
    )
}

fn migration_text(m: &MigrationLine<'_>) -> String {
    let lm = m.layer;
    format!(
        "  migration after step {}: block {}: {} swaps, {} experts moved ({}), imbalance \
         {:.3} -> {:.3} over the window ({:.1} ms, all blocks)",
        m.step,
        lm.layer,
        lm.swaps,
        lm.experts_moved,
        fmt_bytes(lm.bytes_moved as f64),
        lm.imbalance_before,
        lm.imbalance_after,
        m.seconds * 1e3
    )
}

fn summary_text(s: &Setup, ranks: &[RankSummary]) -> String {
    let pp = s.layout.pp as f64;
    let m = s.microbatches as f64;
    let mut out = format!(
        "per rank: peak saved activations and idle share (bubble; 1F1B's ideal \
         (PP-1)/(M+PP-1) = {:.3})\n  rank stage ep dp  peak KiB  experts KiB  in flight  idle",
        (pp - 1.0) / (m + pp - 1.0)
    );
    let shares: Vec<f64> = ranks
        .iter()
        .map(|x| x.idle_s / x.total_s.max(1e-12))
        .collect();
    let mean = shares.iter().sum::<f64>() / shares.len().max(1) as f64;
    for (r, x) in ranks.iter().enumerate() {
        out.push_str(&format!(
            "\n  {r:>4} {:>5} {:>2} {:>2} {:>9.1} {:>12.1} {:>10} {:>5.3}",
            x.stage,
            x.ep_index,
            x.dp_index,
            x.peak_bytes as f64 / 1024.0,
            x.expert_bytes as f64 / 1024.0,
            x.in_flight,
            shares[r]
        ));
    }
    out.push_str(&format!(
        "\nidle share: mean {mean:.3} over {} ranks, 1F1B ideal {:.3}",
        ranks.len(),
        (pp - 1.0) / (m + pp - 1.0)
    ));
    out
}

pub(crate) fn run(a: &TrainArgs) -> Result<(), Failure> {
    if a.emulate.is_some_and(|x| !(x.is_finite() && x >= 0.0)) {
        return Err(input("--emulate takes a finite scale >= 0"));
    }
    let in_process = a.threads || !crate::launch::launched();
    if in_process {
        run_threads(a)
    } else {
        if a.hosts.is_some() || a.emulate.is_some() || a.topology.is_some() {
            return Err(input(
                "--hosts, --emulate and --topology are for threads; under a launcher the job's \
                 processes are the ranks (emulated hosts: halo launch --hosts H)",
            ));
        }
        run_process(a)
    }
}

/// The threads' topology: --topology, else nodes:HxR with --hosts H, else flat:P.
fn thread_topology(a: &TrainArgs) -> Result<(String, Topology), Failure> {
    let ranks = if a.auto_layout {
        None
    } else {
        Some((a.pp * a.ep * a.dp).max(1))
    };
    let name = match (&a.topology, a.hosts, ranks) {
        (Some(t), _, _) => t.clone(),
        (None, Some(h), Some(p)) => {
            if h == 0 || !p.is_multiple_of(h) {
                return Err(input(format!(
                    "--hosts {h} does not divide the {p} ranks of PP x EP x DP"
                )));
            }
            format!("nodes:{h}x{}", p / h)
        }
        (None, None, Some(p)) => format!("flat:{p}"),
        (None, _, None) => {
            return Err(input(
                "--auto-layout needs --topology (the machine the planner places the ranks on)",
            ));
        }
    };
    let topo = Topology::preset(&name).map_err(input)?;
    Ok((name, topo))
}

fn banner(a: &TrainArgs, s: &Setup, place: &str) -> String {
    let l = s.layout;
    format!(
        "halo train: {} (L {}, E {}, k {}, d {}), PP {} x EP {} x DP {}{} on {place}, \
         {} micro-batches, {} sequences of {} tokens per step, seed {}{}",
        a.model,
        s.cfg.layers,
        s.cfg.experts,
        s.cfg.top_k,
        s.cfg.hidden,
        l.pp,
        l.ep,
        l.dp,
        if a.auto_layout { " (planned)" } else { "" },
        s.microbatches,
        s.batch,
        s.cfg.seq,
        a.seed,
        match &s.migration {
            Some(m) => format!(
                "\nskew {}; migration: threshold {}, up to {} swaps per block, every {} steps \
                 over the last {}, gain at least {}",
                a.skew, m.threshold, m.iterations, m.every, m.window, m.min_gain
            ),
            None if a.skew > 0.0 => format!(", skew {}", a.skew),
            None => String::new(),
        }
    )
}

/// Prints a step or a migration (JSON or text, above the bar) and advances the bar.
fn reporter<'a>(a: &'a TrainArgs, bar: &'a ProgressBar) -> impl Fn(Event<'_>) + Sync + 'a {
    move |event: Event<'_>| {
        let (json, text) = match &event {
            Event::Step(line) => (serde_json::to_string(line), step_text(line)),
            Event::Migration(m) => (serde_json::to_string(m), migration_text(m)),
        };
        if a.json {
            print_line(&json.unwrap_or_default());
        } else if bar.is_hidden() {
            print_line(&text);
        } else {
            bar.println(text);
        }
        if matches!(event, Event::Step(_)) {
            bar.inc(1);
        }
    }
}

fn finish(a: &TrainArgs, s: &Setup, log: &RunLog, ranks: &[RankSummary]) -> Result<(), Failure> {
    let losses = &log.losses;
    let pts = |v: &[f64]| -> Vec<(f64, f64)> {
        v.iter()
            .enumerate()
            .map(|(i, &y)| ((i + 1) as f64, y))
            .collect()
    };
    let l = s.layout;
    if let Some(path) = &a.plot {
        let series = [Series {
            name: format!(
                "PP {} x EP {} x DP {}, M {}",
                l.pp, l.ep, l.dp, s.microbatches
            ),
            points: pts(losses),
        }];
        let title = format!("halo train: {} on the synthetic task", a.model);
        step_plot(path, &title, "loss", None, &series)
            .map_err(|e| Failure::other(e.to_string()))?;
        if !a.json {
            print_line(&format!("loss curve: {}", path.display()));
        }
    }
    if let Some(path) = &a.plot_imbalance {
        let mut series = vec![Series {
            name: "without migration".into(),
            points: pts(&log.imbalance_static),
        }];
        if s.migration.is_some() {
            series.push(Series {
                name: "with migration".into(),
                points: pts(&log.imbalance),
            });
        }
        let title = format!(
            "halo train {}: PP {} x EP {}, skew {}, seed {}",
            a.model, l.pp, l.ep, a.skew, a.seed
        );
        let y = "imbalance (max / mean GPU load, mean over blocks)";
        step_plot(path, &title, y, Some(1.0), &series)
            .map_err(|e| Failure::other(e.to_string()))?;
        if !a.json {
            print_line(&format!("imbalance plot: {}", path.display()));
        }
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    if s.migration.is_some() {
        let sum = Summary {
            event: "summary",
            steps: losses.len() as u64,
            train_s: log.train_s,
            migration_s: log.migration_s,
            migration_share: log.migration_s / log.train_s.max(1e-12),
            migrations: log.migrations.len(),
            experts_moved: log.migrations.iter().map(|m| m.1.experts_moved).sum(),
            bytes_moved: log.migrations.iter().map(|m| m.1.bytes_moved).sum(),
            expert_move_bytes: expert_move_bytes(s.cfg.expert_len()),
            model_expert_bytes: halo_piper::resource::migration_expert_bytes(&ModelConfig::from(
                &s.cfg,
            )),
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
    if !a.json {
        if let (Some(first), Some(last)) = (losses.first(), losses.last()) {
            print_line(&format!(
                "loss {first:.4} -> {last:.4} over {} steps",
                losses.len()
            ));
        }
        print_line(&summary_text(s, ranks));
    }
    Ok(())
}

fn run_threads(a: &TrainArgs) -> Result<(), Failure> {
    let (topo_name, topo) = thread_topology(a)?;
    if topo.size() > crate::limits::MAX_THREAD_RANKS {
        return Err(input(format!(
            "{topo_name}: {} ranks, but threads run at most {}; run larger jobs as processes \
             (halo launch)",
            topo.size(),
            crate::limits::MAX_THREAD_RANKS
        )));
    }
    let s = setup(a, &topo)?;
    let emulation = match (a.emulate, a.hosts) {
        (Some(scale), _) => Emulation::on().scaled(scale),
        (None, Some(_)) => Emulation::on(),
        (None, None) => Emulation::off(),
    };
    let place = if emulation.enabled {
        format!("{topo_name} (threads, link emulation x{})", emulation.scale)
    } else {
        format!("{topo_name} (threads)")
    };
    if !a.json {
        print_line(&banner(a, &s, &place));
    }
    let bar = crate::progress::bar(
        a.steps as usize,
        "training",
        !a.json && a.steps >= 20 && crate::progress::on_terminal(),
    );
    let report = reporter(a, &bar);
    let results = local::run(&topo, emulation, |world| {
        let out = train_rank(world, &s, a.seed, a.steps, &report).and_then(|(log, sum)| {
            let all = gather_summaries(world, sum)?;
            Ok((log, all))
        });
        Ok(out)
    });
    bar.finish_and_clear();
    // The first rank's own error is the most telling; a library error (a peer gone) next.
    let mut first_err = None;
    let mut done = None;
    for r in results {
        match r {
            Ok(Ok(x)) => {
                done.get_or_insert(x);
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
    let (log, ranks) = done.unwrap_or_default();
    finish(a, &s, &log, &ranks)
}

fn run_process(a: &TrainArgs) -> Result<(), Failure> {
    let mut world = Communicator::init_from_env().map_err(|e| Failure::other(e.to_string()))?;
    let topo = world.topology().clone();
    let s = setup(a, &topo)?;
    let rank = world.rank();
    if rank == 0 && !a.json {
        print_line(&banner(
            a,
            &s,
            &format!("{} processes ({})", world.size(), topo.name()),
        ));
    }
    let bar = crate::progress::bar(
        a.steps as usize,
        "training",
        rank == 0 && !a.json && a.steps >= 20 && crate::progress::on_terminal(),
    );
    let report = reporter(a, &bar);
    let (log, sum) = train_rank(&mut world, &s, a.seed, a.steps, &report).map_err(piper)?;
    let ranks = gather_summaries(&mut world, sum).map_err(piper)?;
    bar.finish_and_clear();
    if rank == 0 {
        finish(a, &s, &log, &ranks)?;
    }
    Ok(())
}
