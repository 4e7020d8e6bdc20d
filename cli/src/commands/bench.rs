//! `halo bench`: the OSU-style benchmark suite, in-process or as the ranks of a job.

use super::Failure;
use crate::bench::moe::MoeShape;
use crate::bench::report::{self, RunInfo};
use crate::bench::{BenchAlgo, BenchOptions, BenchRow, Op, run_local_bench, run_ranks};
use clap::{Args, ValueEnum};
use halo::Communicator;
use halo::local::Emulation;
use halo::topology::Topology;
use std::path::PathBuf;
use std::time::Duration;

/// How the table is printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Format {
    /// OSU's text layout.
    Osu,
    /// One JSON document.
    Json,
    /// CSV with a header line.
    Csv,
}

/// OSU-style benchmarks: all-to-all, MoE-shaped all-to-all-v, latency and bandwidth.
///
/// Without a launcher the ranks are threads of this process on an emulated topology
/// (per-level latency and bandwidth, a NIC shared by each node's ranks): no cluster
/// needed. Started as the ranks of a job (`halo launch`, mpirun, srun, torchrun) each
/// process is one rank and rank 0 prints. `--algo mpi` measures MPI_Alltoall(v) /
/// MPI_Send on the same processes (halo built with the cargo feature `mpi`, ranks
/// started by Open MPI: `halo launch --mpi`).
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  halo bench\n  \
    halo bench alltoallv --experts 64 --topk 2 --skew 1.2 -m 1:65536 -c\n  \
    halo launch -n 8 -- halo bench alltoall -m 1:1048576 --algo flat,halo,auto\n  \
    halo launch --mpi -n 8 --hosts 4 --host-rate 1gbit -- halo bench --algo all --compare\n  \
    halo launch -n 2 -- halo bench latency")]
pub(crate) struct BenchArgs {
    /// The benchmark: alltoall, alltoallv (MoE-shaped), latency, bw.
    #[arg(value_name = "BENCHMARK", default_value = "alltoall")]
    op: String,
    /// Sizes in bytes per destination, MAX or MIN:MAX (powers of two), like OSU's -m
    /// (alltoallv with --hidden: tokens per rank). Default: OSU's, except 1:65536
    /// in-process.
    #[arg(short = 'm', long = "message-size")]
    sizes: Option<String>,
    /// Timed iterations per size (default: OSU's per benchmark).
    #[arg(short = 'i', long)]
    iterations: Option<usize>,
    /// Warm-up iterations per size (default: OSU's per benchmark).
    #[arg(short = 'x', long)]
    warmup: Option<usize>,
    /// Validate every result of every iteration, outside the timer (OSU's -c); wrong
    /// bytes are counted in an Errors column and make the command fail.
    #[arg(short = 'c', long)]
    validate: bool,
    /// Time each all-to-all up to the end of a barrier after it, so that a rank's time
    /// ends when every rank is done (OSU times the call alone; see docs/bench/JOURNAL.md).
    #[arg(long)]
    sync: bool,
    /// With MPI in the run: time each implementation between its own barriers (HALO's
    /// for HALO) instead of MPI_Barrier for every implementation (the default, OSU's
    /// harness: only the timed calls differ between columns).
    #[arg(long)]
    own_barrier: bool,
    /// Time the automatic mode's trials too. By default the calls on which `auto` times
    /// its candidates (at most 48 per size, see `halo::tune`) run untimed and outside
    /// the warm-up and iteration counts, so that the column shows what a job sees once
    /// they are over, as a fixed algorithm's does from its first timed call.
    #[arg(long)]
    time_trials: bool,
    /// Measure every size in R rounds: each round runs every implementation's warm-up
    /// and timed iterations once, in an order rotated by the round, and a rank's figure
    /// is the median of its per-round means, so that load drifting over the run does
    /// not favour the implementations measured first (see docs/bench/JOURNAL.md). 1: each
    /// implementation's sweep after the other's, as OSU does.
    #[arg(long, value_name = "R", default_value_t = 1)]
    rounds: usize,
    /// Full output (OSU's -f): minimum, maximum and iterations.
    #[arg(short = 'f', long)]
    full: bool,
    /// Implementations, comma separated: flat, pairwise, bruck, halo, halo2d, auto,
    /// mpi, memcpy (alltoall's memory reference), or all (every HALO algorithm that
    /// builds, auto, and mpi when available).
    #[arg(long, default_value = "all", value_delimiter = ',')]
    algo: Vec<String>,
    /// Print nccl-tests' columns (size, count, type, time, algbw, busbw, #wrong).
    #[arg(long)]
    nccl_tests: bool,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Osu)]
    format: Format,
    /// Also write the rows as JSON to FILE (whatever --format says).
    #[arg(long, value_name = "FILE")]
    json_out: Option<PathBuf>,
    /// Print each implementation's time and its ratio to flat and to MPI per size (OSU
    /// text prints it anyway when several were measured), and write plots (SVG and
    /// PNG) into --plot-dir.
    #[arg(long)]
    compare: bool,
    /// Where --compare writes its plots.
    #[arg(long, value_name = "DIR", default_value = ".")]
    plot_dir: PathBuf,
    /// alltoallv: experts in the layer.
    #[arg(long, default_value_t = 64)]
    experts: usize,
    /// alltoallv: experts per token.
    #[arg(long, default_value_t = 2)]
    topk: usize,
    /// alltoallv: Zipf exponent of expert popularity (0 = uniform).
    #[arg(long, default_value_t = 1.0)]
    skew: f64,
    /// alltoallv: tokens routed per rank (sets the shape; sizes scale the bytes).
    #[arg(long, default_value_t = 4096)]
    tokens: usize,
    /// alltoallv: hidden size (bf16 elements per token); -m then counts tokens per rank.
    #[arg(long)]
    hidden: Option<usize>,
    /// bw: messages in flight per iteration (OSU's window).
    #[arg(long, default_value_t = 64)]
    window: usize,
    /// In-process: topology preset or file the ranks are placed in (one thread each).
    #[arg(long, default_value = "nodes:4x4")]
    topology: String,
    /// In-process: multiply every emulated time by this factor so that the modelled
    /// network stands out of the in-process overhead on a busy machine.
    #[arg(long, default_value_t = 20.0)]
    scale: f64,
    /// In-process: turn link emulation off (raw in-process transport).
    #[arg(long)]
    no_emulation: bool,
    /// Run in-process even when started by a launcher.
    #[arg(long)]
    threads: bool,
    /// Per-call timeout of HALO's calls, seconds [default: HALO_TIMEOUT_MS when set,
    /// else 60 s].
    #[arg(long)]
    timeout: Option<u64>,
}

fn parse_sizes(s: &str) -> Result<(usize, usize), Failure> {
    let parse = |x: &str| {
        crate::plot::parse_bytes(x)
            .map_err(|_| Failure::input(format!("-m {s}: '{x}' is not a size in bytes")))
    };
    let (lo, hi) = match s.split_once(':') {
        Some((a, b)) => (parse(a)?, parse(b)?),
        None => (1, parse(s)?),
    };
    if lo > hi {
        return Err(Failure::input(format!("-m {s}: MIN is larger than MAX")));
    }
    Ok((lo, hi))
}

/// The per-call timeout: `--timeout` when given, else `HALO_TIMEOUT_MS`, else 60 s
/// (the order every HALO program follows: the option, the variable, the default).
fn timeout(option: Option<u64>, variable: Option<&str>) -> Result<Duration, Failure> {
    match (option, variable) {
        (Some(0), _) => Err(Failure::input("--timeout must be at least 1 second")),
        (Some(s), _) => Ok(Duration::from_secs(s)),
        (None, Some(v)) => v
            .trim()
            .parse::<u64>()
            .ok()
            .filter(|&ms| ms > 0)
            .map(Duration::from_millis)
            .ok_or_else(|| {
                Failure::input(format!(
                    "HALO_TIMEOUT_MS={v:?} is not a positive number of milliseconds"
                ))
            }),
        (None, None) => Ok(halo::DEFAULT_TIMEOUT),
    }
}

/// Refuses iteration counts that cannot be run or reported: `-i 0` (no latency to
/// report), `--rounds 0`, and more than
/// [`MAX_ITERATIONS`](crate::limits::MAX_ITERATIONS) iterations or
/// [`MAX_ROUNDS`](crate::limits::MAX_ROUNDS) rounds.
fn check_iterations(args: &BenchArgs) -> Result<(), Failure> {
    use crate::limits::{MAX_ITERATIONS, MAX_ROUNDS};
    if args.iterations == Some(0) {
        return Err(Failure::input(
            "-i 0: at least 1 timed iteration is needed to report a latency",
        ));
    }
    for (flag, v) in [("-i", args.iterations), ("-x", args.warmup)] {
        if let Some(v) = v.filter(|&v| v > MAX_ITERATIONS) {
            return Err(Failure::input(format!(
                "{flag} {v}: at most {MAX_ITERATIONS} iterations per size"
            )));
        }
    }
    if args.rounds == 0 {
        return Err(Failure::input(
            "--rounds 0: at least 1 round per size is needed",
        ));
    }
    if args.rounds > MAX_ROUNDS {
        return Err(Failure::input(format!(
            "--rounds {}: at most {MAX_ROUNDS} rounds per size",
            args.rounds
        )));
    }
    Ok(())
}

fn algorithms(list: &[String]) -> Result<Vec<BenchAlgo>, Failure> {
    let mut out = Vec::new();
    for a in list {
        if a == "all" {
            return Ok(Vec::new());
        }
        out.push(a.parse::<BenchAlgo>().map_err(Failure::input)?);
    }
    Ok(out)
}

fn options(args: &BenchArgs, op: Op, in_process: bool) -> Result<BenchOptions, Failure> {
    check_iterations(args)?;
    let timeout = timeout(args.timeout, halo_params::TIMEOUT_MS.raw().as_deref())?;
    let (min_size, max_size) = match &args.sizes {
        Some(s) => parse_sizes(s)?,
        None if in_process && op.is_collective() => (1, 65536),
        None => op.default_sizes(),
    };
    Ok(BenchOptions {
        op,
        algorithms: algorithms(&args.algo)?,
        min_size,
        max_size,
        iterations: args.iterations,
        warmup: args.warmup,
        timeout,
        validate: args.validate,
        sync: args.sync,
        own_barrier: args.own_barrier,
        time_trials: args.time_trials,
        moe: MoeShape {
            experts: args.experts,
            topk: args.topk,
            skew: args.skew,
            tokens: args.tokens,
            hidden: args.hidden,
            ..MoeShape::default()
        },
        window: args.window,
        rounds: args.rounds,
        progress: args.format == Format::Osu && crate::progress::on_terminal(),
    })
}

/// The note of a run whose `auto` column did not time its trials.
const AUTO_TRIALS_NOTE: &str = "auto: the calls on which it times its candidates ran untimed, before the warm-up (--time-trials times them)";

pub(crate) fn run(args: &BenchArgs) -> Result<(), Failure> {
    let op: Op = args.op.parse().map_err(Failure::input)?;
    let in_process = args.threads || !crate::launch::launched();
    let opts = options(args, op, in_process)?;
    // What run_ranks would refuse, refused before a job bootstraps for nothing.
    if op == Op::AllToAllV {
        opts.moe.validate().map_err(Failure::input)?;
    }
    if opts.window == 0 {
        return Err(Failure::input("--window must be at least 1"));
    }
    let fail = |e: halo::Error| match e {
        halo::Error::InvalidArgument { .. } => Failure::input(format!("bench: {e}")),
        e => Failure::other(format!("bench: {e}")),
    };
    let (info, rows) = if in_process {
        let topology = if std::path::Path::new(&args.topology).exists() {
            Topology::load(&args.topology)
        } else {
            Topology::preset(&args.topology)
        }
        .map_err(Failure::input)?;
        let n = topology.size();
        if n > crate::limits::MAX_THREAD_RANKS {
            return Err(Failure::input(format!(
                "--topology {}: {n} ranks, but an in-process bench runs at most {} (one thread \
                 each); run larger jobs as processes (halo launch) or simulate them (halo simulate)",
                args.topology,
                crate::limits::MAX_THREAD_RANKS
            )));
        }
        let need = opts
            .bytes_per_rank(n)
            .and_then(|b| b.checked_mul(n as u128));
        crate::limits::check_memory(
            &format!(
                "{op} up to {} B on {n} in-process ranks (-m, --topology {})",
                opts.max_size, args.topology
            ),
            need,
        )
        .map_err(Failure::input)?;
        if !(args.scale.is_finite() && args.scale > 0.0) {
            return Err(Failure::input(format!(
                "--scale {} must be a positive number",
                args.scale
            )));
        }
        let emulation = if args.no_emulation {
            Emulation::off()
        } else {
            Emulation {
                scale: args.scale,
                ..Emulation::on()
            }
        };
        let mode = if !emulation.enabled {
            "threads".to_string()
        } else if emulation.scale == 1.0 {
            "threads, emulated".to_string()
        } else {
            format!("threads, emulated x{}", emulation.scale)
        };
        let rows = run_local_bench(&opts, &topology, emulation).map_err(fail)?;
        let info = RunInfo {
            op,
            ranks: topology.size(),
            topology: topology.name().to_string(),
            mode,
            moe: None,
            rounds: opts.rounds,
            notes: Vec::new(),
        };
        (info, rows)
    } else {
        match run_processes(&opts).map_err(fail)? {
            Some(r) => r,
            None => return Ok(()),
        }
    };
    let mut info = info;
    info.rounds = opts.rounds;
    if op == Op::AllToAllV {
        info.moe = Some(opts.moe.clone());
    }
    if args.sync {
        info.mode.push_str(", timed to a barrier after each call");
    }
    let auto = opts.algorithms.is_empty() || opts.algorithms.contains(&BenchAlgo::Halo(None));
    if op == Op::AllToAll && !args.time_trials && auto {
        info.notes.push(AUTO_TRIALS_NOTE.to_string());
    }
    print_results(args, &info, &rows)
}

/// Rank 0 prints; the rows go to stdout in the chosen format, the JSON copy and the
/// plots to their files. Wrong bytes fail the command.
fn print_results(args: &BenchArgs, info: &RunInfo, rows: &[BenchRow]) -> Result<(), Failure> {
    let text = if args.nccl_tests {
        report::format_nccl_tests(info, rows)
    } else {
        match args.format {
            Format::Osu => report::format_osu(info, rows, args.full, args.validate),
            Format::Json => report::format_json(info, rows),
            Format::Csv => report::format_csv(info, rows),
        }
    };
    super::emit(&text)?;
    // The ratios come with OSU's text whenever there is something to compare; with
    // --compare also after the other formats, and the plots.
    let several = rows.iter().any(|r| r.algorithm != rows[0].algorithm);
    let text_format = args.format == Format::Osu && !args.nccl_tests;
    if args.compare || (text_format && several) {
        super::emit(&report::compare_table(info, rows))?;
    }
    if let Some(path) = &args.json_out {
        std::fs::write(path, report::format_json(info, rows))
            .map_err(|e| Failure::other(format!("cannot write {}: {e}", path.display())))?;
    }
    if args.compare {
        let files = report::write_plots(&args.plot_dir, info, rows)
            .map_err(|e| Failure::other(format!("plots: {e}")))?;
        let names: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
        super::emit(&format!("# plots: {}\n", names.join(" ")))?;
    }
    let wrong: Vec<String> = rows
        .iter()
        .filter(|r| r.wrong > 0)
        .map(|r| format!("{} at {} B: {} wrong bytes", r.algorithm, r.size, r.wrong))
        .collect();
    if !wrong.is_empty() {
        return Err(Failure::other(format!(
            "validation failed: {}",
            wrong.join("; ")
        )));
    }
    Ok(())
}

fn process_info(op: Op, comm: &Communicator, mpi: bool) -> RunInfo {
    RunInfo {
        op,
        ranks: comm.size(),
        topology: comm.topology().name().to_string(),
        mode: if mpi {
            "processes, MPI-launched".to_string()
        } else {
            "processes".to_string()
        },
        moe: None,
        rounds: 1,
        notes: Vec::new(),
    }
}

/// As one rank of a job. Started by an MPI launcher (Open MPI's or PMI's variables) and
/// built with the `mpi` feature, the ranks bootstrap through MPI — so plain `mpirun -n N
/// halo bench` works — and MPI is measured too when asked for; else they bootstrap from
/// the launcher's environment. `None` on ranks other than 0.
fn run_processes(opts: &BenchOptions) -> halo::Result<Option<(RunInfo, Vec<BenchRow>)>> {
    let mpi_env = ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE"]
        .iter()
        .any(|v| std::env::var_os(v).is_some());
    if mpi_env {
        #[cfg(feature = "mpi")]
        return run_with_mpi(opts);
    }
    let mut comm = Communicator::init_from_env()?;
    check_process_memory(opts, comm.size())?;
    let info = process_info(opts.op, &comm, false);
    Ok(run_ranks(&mut comm, None, opts)?.map(|rows| (info, rows)))
}

/// As one rank of `n`: refuses buffers this host cannot hold (this rank's, times the
/// ranks on this host when the launcher says how many: `LOCAL_WORLD_SIZE`).
fn check_process_memory(opts: &BenchOptions, n: usize) -> halo::Result<()> {
    let local = std::env::var("LOCAL_WORLD_SIZE")
        .ok()
        .and_then(|v| v.parse::<u128>().ok())
        .unwrap_or(1)
        .max(1);
    let need = opts.bytes_per_rank(n).and_then(|b| b.checked_mul(local));
    crate::limits::check_memory(
        &format!(
            "{} up to {} B on {n} ranks, {local} on this host (-m)",
            opts.op, opts.max_size
        ),
        need,
    )
    .map_err(halo::Error::invalid_argument)
}

#[cfg(feature = "mpi")]
fn run_with_mpi(opts: &BenchOptions) -> halo::Result<Option<(RunInfo, Vec<BenchRow>)>> {
    use crate::bench::{Implementation, mpi::MpiImplementation};
    let universe = mpi::initialize().ok_or_else(|| halo::Error::SystemError {
        message: "MPI could not be initialised (MPI_Init failed or ran before)".into(),
    })?;
    let world = universe.world();
    let mut comm = Communicator::init_mpi(&world)?;
    check_process_memory(opts, comm.size())?;
    let mut info = process_info(opts.op, &comm, true);
    info.mode.push_str(if opts.own_barrier {
        ", own barriers"
    } else {
        ", MPI_Barrier between calls"
    });
    // Passed also when MPI is not measured: its barrier is the harness's.
    let mut engine = MpiImplementation::new(&world);
    let engine = Some(&mut engine as &mut dyn Implementation);
    let rows = run_ranks(&mut comm, engine, opts)?;
    drop(comm);
    Ok(rows.map(|rows| (info, rows)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_option_wins_then_the_variable_then_the_default() {
        assert_eq!(
            timeout(Some(5), Some("100")).unwrap(),
            Duration::from_secs(5)
        );
        assert_eq!(
            timeout(None, Some("250")).unwrap(),
            Duration::from_millis(250)
        );
        assert_eq!(timeout(None, None).unwrap(), halo::DEFAULT_TIMEOUT);
        assert!(timeout(None, Some("soon")).is_err());
        assert!(timeout(Some(0), None).is_err());
    }
}
