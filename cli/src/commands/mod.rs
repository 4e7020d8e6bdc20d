//! Command-line arguments and the commands.

mod bench;
mod calibrate;
mod check;
mod launch;
mod params;
mod plan;
mod secret;
mod simulate;
mod topo;
mod train;

use clap::{Parser, Subcommand};
use std::io::Write as _;

/// `halo`: tools around the HALO collective communication library.
#[derive(Debug, Parser)]
#[command(name = "halo", version, about, long_about = None)]
#[command(after_help = "Logging: set HALO_DEBUG=info|debug|trace for logs on stderr.")]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Show a topology: this machine (discovery), a preset or a file.
    Topo(topo::TopoArgs),
    /// Start N ranks of a command, locally or on emulated hosts (like mpirun/torchrun).
    Launch(launch::LaunchArgs),
    /// As one rank of a job: verify every algorithm byte-exact (like nccl-tests -c).
    Check(check::CheckArgs),
    /// OSU-style all-to-all benchmark, in-process on an emulated cluster.
    Bench(bench::BenchArgs),
    /// Predict all-to-all times at scale (1,024+ ranks) by replaying the schedules.
    Simulate(simulate::SimulateArgs),
    /// As one rank of a job: measure every level's latency and bandwidth into a topology file.
    Calibrate(calibrate::CalibrateArgs),
    /// Piper's resource model: parameters, memory per stage, migration cost, PP x EP layouts.
    Plan(plan::PlanArgs),
    /// Train the reference MoE model with the Piper pipeline executor (ranks as threads).
    Train(train::TrainArgs),
    /// The per-user key file torchrun/srun-style jobs derive their secret from (`init`).
    Secret(secret::SecretArgs),
    /// Every HALO_* environment variable, its value here and its default (like `ucx_info -c`).
    Params(params::ParamsArgs),
}

/// A failed command: what to print after `error: ` and the exit status.
#[derive(Debug)]
pub struct Failure {
    /// What went wrong, printed after `error: `.
    pub message: String,
    /// The process exit status: 2 for bad input, 1 for anything else.
    pub code: u8,
}

impl Failure {
    /// Bad input from the user (a preset, a file): status 2, as for usage errors.
    fn input(message: impl std::fmt::Display) -> Self {
        Failure {
            message: message.to_string(),
            code: 2,
        }
    }

    /// Anything else that went wrong: status 1.
    fn other(message: impl std::fmt::Display) -> Self {
        Failure {
            message: message.to_string(),
            code: 1,
        }
    }
}

/// Runs the command.
pub fn run(cli: Cli) -> Result<(), Failure> {
    match cli.command {
        Command::Topo(args) => topo::run(&args),
        Command::Launch(args) => launch::run(&args),
        Command::Check(args) => check::run(&args),
        Command::Bench(args) => bench::run(&args),
        Command::Simulate(args) => simulate::run(&args),
        Command::Calibrate(args) => calibrate::run(&args),
        Command::Plan(args) => plan::run(&args),
        Command::Train(args) => train::run(&args),
        Command::Secret(args) => secret::run(&args),
        Command::Params(args) => params::run(&args),
    }
}

/// Writes to stdout. A closed pipe (`halo topo | head`) is not an error.
fn emit(text: &str) -> Result<(), Failure> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(Failure::other(format!("cannot write to stdout: {e}"))),
    }
}

/// `--sizes MIN:MAX` (or one size) as the ladder `MIN, 4 MIN, 16 MIN, ...` up to `MAX`
/// (`halo simulate`, `halo calibrate`); sizes take K/M/G suffixes.
fn size_ladder_arg(spec: &str) -> Result<Vec<usize>, Failure> {
    use crate::plot::parse_bytes;
    let (lo, hi) = match spec.split_once(':') {
        Some((a, b)) => (
            parse_bytes(a).map_err(Failure::input)?,
            parse_bytes(b).map_err(Failure::input)?,
        ),
        None => {
            let v = parse_bytes(spec).map_err(Failure::input)?;
            (v, v)
        }
    };
    if lo == 0 || lo > hi {
        return Err(Failure::input(format!(
            "--sizes {spec}: need 0 < MIN <= MAX"
        )));
    }
    Ok(crate::calibrate::size_ladder(lo, hi))
}
