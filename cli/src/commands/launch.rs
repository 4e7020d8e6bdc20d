//! `halo launch`: start the ranks of a job, locally or on emulated hosts.

use super::Failure;
use crate::launch::{self, Interrupt, LaunchError, LaunchSpec, Outcome, Placement};
use clap::Args;
use std::path::PathBuf;
use std::time::Duration;

/// `halo launch` options. The help text (after the options) says what each rank
/// gets, what --hosts builds and what the exit status means.
#[derive(Debug, Args)]
#[command(after_help = "\
Each rank gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK (its host),
HALO_BOOTSTRAP_ADDR (ip:port, served by rank 0), HALO_SECRET (random, one per launch),
MASTER_ADDR and MASTER_PORT (= bootstrap port - 1); stdin is /dev/null and each output
line is prefixed with [RANK].

--hosts K (root only) runs the ranks block-wise on K emulated hosts: network namespaces
joined by a bridge in a switch namespace, one veth per host (10.201.0.I+1/24, hostname
hostI), shaped with --host-rate in both directions; all of it is removed when the job
ends, fails or is interrupted.

Exit status: 0 when every rank succeeds; else the first failing rank's status (the
others are terminated: SIGTERM, SIGKILL after --grace), 124 after --timeout, 128+signal
when interrupted (Ctrl-C), 2 for bad options, 1 when set-up fails.

Examples:
  halo launch -n 4 -- python3 train.py
  halo launch -n 8 --hosts 2 --host-rate 1gbit --stats -- ./my_alltoall
  halo launch -n 4 --hosts 2 --mpi -- ./osu_alltoall")]
pub(crate) struct LaunchArgs {
    /// Processes (ranks) to start.
    #[arg(short = 'n', long = "nprocs", value_name = "N")]
    nprocs: usize,

    /// Run the ranks on K emulated hosts (network namespaces; needs root).
    #[arg(long, value_name = "K")]
    hosts: Option<usize>,

    /// Shape each host's link to RATE in both directions (tc syntax: 1gbit, 100mbit).
    #[arg(long, value_name = "RATE")]
    host_rate: Option<String>,

    /// Ranks per emulated host: M (hosts filled M at a time, the last may hold
    /// fewer) or a list such as 3,1. Implies emulated hosts. Default: even blocks.
    #[arg(long, value_name = "M|LIST")]
    ranks_per_host: Option<String>,

    /// Kill everything after SECS seconds and exit with 124.
    #[arg(long, value_name = "SECS")]
    timeout: Option<f64>,

    /// Seconds between SIGTERM and SIGKILL when terminating ranks.
    #[arg(long, value_name = "SECS", default_value_t = 3.0)]
    grace: f64,

    /// After the run, write each emulated host's veth byte and packet counters
    /// (the difference over the run) to FILE as JSON.
    #[arg(long, value_name = "FILE")]
    stats_json: Option<PathBuf>,

    /// After the run, print one line of veth counters per emulated host to stderr.
    #[arg(long)]
    stats: bool,

    /// Start CMD through Open MPI's mpirun (on the emulated hosts with --hosts).
    #[arg(long)]
    mpi: bool,

    /// An extra argument for mpirun (repeatable), e.g. --mpirun-arg=--tag-output.
    #[arg(
        long = "mpirun-arg",
        value_name = "ARG",
        requires = "mpi",
        allow_hyphen_values = true
    )]
    mpirun_args: Vec<String>,

    /// Do not prefix output lines with "[RANK] ".
    #[arg(long)]
    no_prefix: bool,

    /// The command and its arguments (after `--`).
    #[arg(required = true, trailing_var_arg = true, value_name = "CMD")]
    command: Vec<String>,
}

fn seconds(name: &str, v: f64) -> Result<Duration, Failure> {
    if (0.0..1e9).contains(&v) {
        Ok(Duration::from_secs_f64(v))
    } else {
        Err(Failure::input(format!(
            "{name} {v}: expected a number of seconds"
        )))
    }
}

fn spec(args: &LaunchArgs) -> Result<LaunchSpec, Failure> {
    let mut spec = LaunchSpec::new(args.nprocs, args.command.clone());
    if args.nprocs == 0 {
        return Err(Failure::input("-n must be at least 1"));
    }
    spec.hosts = match (&args.ranks_per_host, args.hosts) {
        (Some(list), k) => Some(Placement::parse(list, args.nprocs, k).map_err(Failure::input)?),
        (None, Some(k)) => Some(Placement::even(args.nprocs, k).map_err(Failure::input)?),
        (None, None) => None,
    };
    let emulated = spec.hosts.is_some();
    if !emulated {
        for (set, name) in [
            (args.host_rate.is_some(), "--host-rate"),
            (args.stats_json.is_some(), "--stats-json"),
            (args.stats, "--stats"),
        ] {
            if set {
                return Err(Failure::input(format!(
                    "{name} needs emulated hosts (--hosts K)"
                )));
            }
        }
    }
    spec.host_rate = args.host_rate.clone();
    spec.timeout = match args.timeout {
        Some(t) if t <= 0.0 => return Err(Failure::input("--timeout must be positive")),
        Some(t) => Some(seconds("--timeout", t)?),
        None => None,
    };
    spec.grace = seconds("--grace", args.grace)?;
    spec.mpi = args.mpi;
    spec.mpirun_args = args.mpirun_args.clone();
    spec.label_output = !args.no_prefix;
    Ok(spec)
}

pub(crate) fn run(args: &LaunchArgs) -> Result<(), Failure> {
    let spec = spec(args)?;
    let interrupt =
        Interrupt::on_signals().map_err(|e| Failure::other(format!("cannot catch Ctrl-C: {e}")))?;
    let report = launch::launch(&spec, &interrupt).map_err(|e| match e {
        LaunchError::NeedsRoot | LaunchError::InvalidArgument(_) => Failure::input(e),
        LaunchError::Interrupted { signal } => Failure {
            message: e.to_string(),
            code: u8::try_from(128 + signal).unwrap_or(1),
        },
        _ => Failure::other(e),
    })?;
    for w in &report.warnings {
        eprintln!("halo launch: warning: {w}");
    }
    if args.stats {
        for line in report.stats_lines() {
            eprintln!("halo launch: {line}");
        }
    }
    if let Some(path) = &args.stats_json {
        let text = serde_json::to_string_pretty(&report.stats_json())
            .map_err(|e| Failure::other(format!("cannot write JSON: {e}")))?;
        std::fs::write(path, text + "\n")
            .map_err(|e| Failure::other(format!("cannot write {}: {e}", path.display())))?;
    }
    let code = report.outcome.exit_code();
    let message = match report.outcome {
        Outcome::Success => return Ok(()),
        Outcome::RankFailed {
            rank: Some(rank),
            code,
            signal: Some(sig),
        } => format!(
            "rank {rank} was killed by signal {sig}{} (status {code}); the other ranks were \
             terminated",
            signal_name(sig)
                .map(|n| format!(" ({n})"))
                .unwrap_or_default()
        ),
        Outcome::RankFailed {
            rank: Some(rank),
            code,
            signal: None,
        } => format!("rank {rank} exited with status {code}; the other ranks were terminated"),
        Outcome::RankFailed {
            rank: None, code, ..
        } => format!("mpirun exited with status {code}"),
        Outcome::TimedOut => format!(
            "timed out after {} s; every rank was killed",
            spec.timeout.map_or(0.0, |t| t.as_secs_f64())
        ),
        Outcome::Interrupted { signal } => {
            format!("interrupted by signal {signal}; every rank was terminated")
        }
    };
    Err(Failure { message, code })
}

/// The name of a signal, for the usual fatal ones.
fn signal_name(signal: i32) -> Option<&'static str> {
    Some(match signal {
        1 => "SIGHUP",
        2 => "SIGINT",
        3 => "SIGQUIT",
        4 => "SIGILL",
        5 => "SIGTRAP",
        6 => "SIGABRT",
        7 => "SIGBUS",
        8 => "SIGFPE",
        9 => "SIGKILL",
        11 => "SIGSEGV",
        13 => "SIGPIPE",
        15 => "SIGTERM",
        _ => return None,
    })
}
