//! `halo bench`: the OSU-style all-to-all benchmark, in-process on an emulated cluster.

use super::Failure;
use clap::Args;
use halo::bench::{BenchOptions, BenchRow, format_osu, run_local_bench};
use halo::collectives::Algorithm;
use halo::local::Emulation;
use halo::topology::Topology;
use std::fmt::Write as _;
use std::time::Duration;

/// Measures all-to-all latency per algorithm and message size, as osu_alltoall does,
/// with N ranks as threads of this process on an emulated topology (per-level latency
/// and bandwidth, a NIC shared by each node's ranks). No cluster needed.
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  halo bench\n  halo bench --topology frontier:2 -m 1:65536 -i 100 --algo flat,halo\n  \
    halo bench --scale 1 -c"
)]
pub(crate) struct BenchArgs {
    /// Topology preset or file the ranks are placed in (one thread per rank).
    #[arg(long, default_value = "nodes:4x4")]
    topology: String,
    /// Sizes in bytes per destination: MAX or MIN:MAX (powers of two), like OSU's -m.
    #[arg(short = 'm', long = "message-size", default_value = "1:65536")]
    sizes: String,
    /// Timed iterations per size (default: OSU's 1000 up to 8 KiB, 100 above).
    #[arg(short = 'i', long)]
    iterations: Option<usize>,
    /// Warm-up iterations per size (default: OSU's 100 up to 8 KiB, 10 above).
    #[arg(short = 'x', long)]
    warmup: Option<usize>,
    /// Validate every result (OSU's -c).
    #[arg(short = 'c', long)]
    validate: bool,
    /// Full output (OSU's -f); min, max and iterations are always printed.
    #[arg(short = 'f', long)]
    full: bool,
    /// Algorithms, comma separated (flat, pairwise, bruck, halo, halo2d) or all.
    #[arg(long, default_value = "all", value_delimiter = ',')]
    algo: Vec<String>,
    /// Multiply every emulated time by this factor so that the modelled network stands
    /// out of the in-process overhead on a busy machine.
    #[arg(long, default_value_t = 20.0)]
    scale: f64,
    /// Turn link emulation off (raw in-process transport).
    #[arg(long)]
    no_emulation: bool,
    /// Per-call timeout in seconds.
    #[arg(long, default_value_t = 60)]
    timeout: u64,
}

fn parse_sizes(s: &str) -> Result<(usize, usize), Failure> {
    let parse = |x: &str| {
        x.trim()
            .parse::<usize>()
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

/// One line per size: each algorithm's latency and its ratio to the flat fan-out.
fn ratio_table(rows: &[BenchRow]) -> String {
    let mut out = String::new();
    let mut algs: Vec<Algorithm> = Vec::new();
    for r in rows {
        if !algs.contains(&r.algorithm) {
            algs.push(r.algorithm);
        }
    }
    if !algs.contains(&Algorithm::Flat) || algs.len() < 2 {
        return out;
    }
    let _ = writeln!(
        out,
        "\n# Speed-up over the flat fan-out (flat latency / algorithm latency; > 1 is faster)"
    );
    let _ = write!(out, "{:<10}", "# Size");
    for a in algs.iter().filter(|a| **a != Algorithm::Flat) {
        let _ = write!(out, "{:>12}", a.name());
    }
    out.push('\n');
    let mut sizes: Vec<usize> = rows.iter().map(|r| r.size).collect();
    sizes.dedup();
    sizes.sort_unstable();
    sizes.dedup();
    for size in sizes {
        let lat = |a: Algorithm| {
            rows.iter()
                .find(|r| r.size == size && r.algorithm == a)
                .map(|r| r.avg_us)
        };
        let Some(flat) = lat(Algorithm::Flat) else {
            continue;
        };
        let _ = write!(out, "{size:<10}");
        for a in algs.iter().filter(|a| **a != Algorithm::Flat) {
            match lat(*a) {
                Some(t) if t > 0.0 => {
                    let _ = write!(out, "{:>11.2}x", flat / t);
                }
                _ => {
                    let _ = write!(out, "{:>12}", "-");
                }
            }
        }
        out.push('\n');
    }
    out
}

pub(crate) fn run(args: &BenchArgs) -> Result<(), Failure> {
    let topology = if std::path::Path::new(&args.topology).exists() {
        Topology::load(&args.topology)
    } else {
        Topology::preset(&args.topology)
    }
    .map_err(Failure::input)?;
    let (min_size, max_size) = parse_sizes(&args.sizes)?;
    let mut algorithms = Vec::new();
    for a in &args.algo {
        if a == "all" {
            algorithms.clear();
            break;
        }
        algorithms.push(a.parse::<Algorithm>().map_err(Failure::input)?);
    }
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
    let _ = args.full;
    let opts = BenchOptions {
        topology,
        emulation,
        algorithms,
        min_size,
        max_size,
        iterations: args.iterations,
        warmup: args.warmup,
        timeout: Duration::from_secs(args.timeout),
        validate: args.validate,
    };
    let rows = run_local_bench(&opts).map_err(|e| Failure::other(format!("bench: {e}")))?;
    super::emit(&format_osu(&opts, &rows))?;
    super::emit(&ratio_table(&rows))
}
