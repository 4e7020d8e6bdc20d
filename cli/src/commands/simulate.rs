//! `halo simulate`: predict all-to-all times at scale by replaying the schedules.

use super::Failure;
use crate::plot::{Series, fmt_bytes, line_plot};
use clap::Args;
use halo::collectives::{
    AlgoOptions, Algorithm, BlockSizes, MatrixSizes, MoeSizes, SimOptions, Traffic,
    simulate_all_to_all,
};
use halo::topology::{Level, Topology, fmt_seconds};
use std::fmt::Write as _;
use std::path::PathBuf;

/// Simulates one all-to-all(-v) per algorithm and size on a topology: every rank's
/// schedule is built as the library builds it and replayed against the link model
/// (latency per level, bandwidth on every resource a message crosses, fair sharing,
/// the global-link taper). Results are simulated, not measured (docs/SIMULATION.md).
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  halo simulate --topology frontier:128 --sizes 1K:16M\n  \
    halo simulate --topology frontier:16 --op alltoallv --experts 64 --topk 2 --skew 1.0 --plot a2av.svg"
)]
pub(crate) struct SimulateArgs {
    /// Topology preset or file.
    #[arg(long, default_value = "frontier:16")]
    topology: String,
    /// alltoall (uniform) or alltoallv (MoE-shaped counts).
    #[arg(long, default_value = "alltoall")]
    op: String,
    /// Bytes per peer: MIN:MAX (powers of two; K, M, G suffixes) or one size. For
    /// alltoallv, the mean bytes per peer (tokens are derived from it).
    #[arg(long, default_value = "1K:16M")]
    sizes: String,
    /// Algorithms, comma separated (flat, pairwise, bruck, halo, halo2d, auto). `auto`
    /// is what a communicator's model would pick before it measures (`halo::select`:
    /// the simulator's cheapest up to 128 ranks, the alpha-beta model's above), with
    /// its pick in the last column.
    #[arg(long, default_value = "flat,halo,halo2d", value_delimiter = ',')]
    algos: Vec<String>,
    /// HALO aggregation levels, comma separated (default: node).
    #[arg(long, value_delimiter = ',')]
    halo_levels: Vec<String>,
    /// alltoallv: experts (placed round-robin on the ranks).
    #[arg(long, default_value_t = 64)]
    experts: usize,
    /// alltoallv: experts each token is routed to.
    #[arg(long, default_value_t = 2)]
    topk: usize,
    /// alltoallv: Zipf skew of expert popularity (0 = uniform).
    #[arg(long, default_value_t = 1.0)]
    skew: f64,
    /// alltoallv: hidden size; a token is hidden x 2 bytes (bf16).
    #[arg(long, default_value_t = 4096)]
    hidden: usize,
    /// Seconds per message on every NIC it crosses (LogGP's g).
    #[arg(long)]
    nic_gap: Option<f64>,
    /// Cost transfers inside a node on the node level's one bandwidth, as if every
    /// pair of the node were linked alike, instead of on the links of the topology's
    /// link matrix (`frontier:N`, `mi300x:N`, a file's `[node_links]`): the uniform
    /// model, to compare with.
    #[arg(long)]
    uniform_node: bool,
    /// HALO relays intra-node blocks of at least this many bytes over peers on the
    /// node's balanced paths (`AlgoOptions::node_relay_bytes`; K, M suffixes), or
    /// `never`. Default: the library's (128 KiB).
    #[arg(long, value_name = "BYTES|never")]
    node_relay: Option<String>,
    /// Write a plot of time against size, one line per algorithm: SVG, or PNG when the
    /// file name ends in `.png`.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Validate against a measurement: a `halo bench alltoall --json-out FILE` run
    /// (or `alltoallv`: its router's counts are rebuilt exactly; the simulator replays
    /// the data pass only, not the count exchange).
    /// Every HALO algorithm's row (flat, pairwise, bruck, halo, halo2d) is simulated
    /// at its size on --topology (which must have the run's rank count; a `halo
    /// calibrate` file of the same job is the intended one), and the table gives
    /// measured and simulated times, the error, and each algorithm's ratio to flat
    /// measured and simulated.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["plot", "algos", "sizes", "op"])]
    measured: Option<PathBuf>,
}

/// A lower bound of the simulator's memory per (source, destination) pair of ranks:
/// every rank's schedule holds a message per peer (about 100 bytes per pair measured
/// with flat on frontier:128, 1,024 ranks).
const BYTES_PER_PAIR: u128 = 64;

/// Refuses NaN, infinite and negative `--skew` and `--nic-gap`, as `halo bench` does.
fn check_numbers(args: &SimulateArgs) -> Result<(), Failure> {
    if !(args.skew.is_finite() && args.skew >= 0.0) {
        return Err(Failure::input(format!(
            "--skew {} must be a number >= 0",
            args.skew
        )));
    }
    if let Some(g) = args.nic_gap
        && !(g.is_finite() && g >= 0.0)
    {
        return Err(Failure::input(format!(
            "--nic-gap {g} must be a number of seconds >= 0"
        )));
    }
    Ok(())
}

pub(crate) fn run(args: &SimulateArgs) -> Result<(), Failure> {
    let topo = if std::path::Path::new(&args.topology).exists() {
        Topology::load(&args.topology)
    } else {
        Topology::preset(&args.topology)
    }
    .map_err(Failure::input)?;
    let topo = if args.uniform_node {
        topo.without_node_links()
    } else {
        topo
    };
    check_numbers(args)?;
    let n = topo.size() as u128;
    crate::limits::check_memory(
        &format!(
            "simulating {n} ranks (--topology {}; about {BYTES_PER_PAIR} bytes per pair of ranks)",
            args.topology
        ),
        n.checked_mul(n).and_then(|p| p.checked_mul(BYTES_PER_PAIR)),
    )
    .map_err(Failure::input)?;
    if let Some(file) = &args.measured {
        let mut opts = SimOptions::default();
        if let Some(g) = args.nic_gap {
            opts.nic_gap = g;
        }
        return super::emit(&validate(&topo, file, &opts)?);
    }
    // `None` is `auto`.
    let algos: Vec<Option<Algorithm>> = args
        .algos
        .iter()
        .map(|a| match a.as_str() {
            "auto" => Ok(None),
            a => a.parse::<Algorithm>().map(Some).map_err(Failure::input),
        })
        .collect::<Result<_, _>>()?;
    let name = |a: &Option<Algorithm>| a.map_or("auto", |a| a.name());
    let flat = Some(Algorithm::Flat);
    let v = match args.op.as_str() {
        "alltoall" => false,
        "alltoallv" => true,
        other => {
            return Err(Failure::input(format!(
                "--op {other}: expected alltoall or alltoallv"
            )));
        }
    };
    let mut opts = SimOptions::default();
    if !args.halo_levels.is_empty() {
        let levels: Vec<Level> = args
            .halo_levels
            .iter()
            .map(|l| l.parse::<Level>().map_err(Failure::input))
            .collect::<Result<_, _>>()?;
        opts.algo = AlgoOptions {
            halo_levels: Some(levels),
            ..AlgoOptions::default()
        };
    }
    if let Some(r) = &args.node_relay {
        opts.algo.node_relay_bytes = match r.as_str() {
            "never" => usize::MAX,
            r => crate::plot::parse_bytes(r)
                .map_err(|e| Failure::input(format!("--node-relay {r}: {e}")))?,
        };
    }
    if let Some(g) = args.nic_gap {
        opts.nic_gap = g;
    }
    if v && (args.experts == 0 || args.topk == 0 || args.hidden == 0) {
        return Err(Failure::input(
            "--experts, --topk and --hidden must be positive",
        ));
    }
    let n = topo.size();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# HALO simulated {} on {} ({} ranks){}",
        args.op,
        topo.name(),
        n,
        if v {
            format!(
                ", MoE counts: {} experts, top-{}, skew {}, hidden {}",
                args.experts, args.topk, args.skew, args.hidden
            )
        } else {
            String::new()
        }
    );
    let _ = write!(out, "{:<12}", "# Size");
    for a in &algos {
        let _ = write!(
            out,
            "{:>14}{:>12}",
            format!("{} time", name(a)),
            "algbw GB/s"
        );
    }
    if algos.contains(&flat) {
        for a in algos.iter().filter(|a| **a != flat) {
            let _ = write!(out, "{:>14}", format!("{}/flat", name(a)));
        }
    }
    if algos.contains(&None) {
        let _ = write!(out, "{:>12}", "auto picks");
    }
    out.push('\n');
    super::emit(&out)?;
    let mut series: Vec<Series> = algos
        .iter()
        .map(|a| Series {
            name: name(a).to_string(),
            points: Vec::new(),
        })
        .collect();
    let sizes = super::size_ladder_arg(&args.sizes)?;
    let bar = crate::progress::bar(
        sizes.len() * algos.len(),
        &format!("simulating {n} ranks"),
        crate::progress::on_terminal(),
    );
    for size in sizes {
        let bytes_per_token = args.hidden * 2;
        let tokens = (size * n).div_ceil(args.topk * bytes_per_token).max(1);
        let moe = MoeSizes::new(
            n,
            args.experts,
            args.topk,
            args.skew,
            tokens,
            bytes_per_token,
            7,
        );
        // algbw as nccl-tests: the payload one rank sends (incl. to itself) / time.
        let per_rank = if v {
            (0..n)
                .flat_map(|s| (0..n).map(move |d| (s, d)))
                .map(|(s, d)| moe.bytes(s, d) as f64)
                .sum::<f64>()
                / n as f64
        } else {
            (size * n) as f64
        };
        let mut line = format!("{:<12}", fmt_bytes(size as f64));
        let mut times = Vec::new();
        let mut auto_pick = None;
        for (i, &a) in algos.iter().enumerate() {
            let traffic = if v {
                Traffic::V(&moe)
            } else {
                Traffic::Uniform(size)
            };
            let a = a.unwrap_or_else(|| {
                let pick = halo::select::choose(&topo, size, &opts.algo);
                auto_pick = Some(pick);
                pick
            });
            let simulated = simulate_all_to_all(&topo, a, traffic, &opts);
            bar.inc(1);
            match simulated {
                Ok(r) => {
                    let algbw = if r.time > 0.0 {
                        per_rank / r.time / 1e9
                    } else {
                        0.0
                    };
                    let _ = write!(line, "{:>14}{:>12.2}", fmt_seconds(r.time), algbw);
                    series[i].points.push((size as f64, r.time * 1e6));
                    times.push(Some(r.time));
                }
                Err(e) => {
                    tracing::warn!(algorithm = %a, "{e}");
                    let _ = write!(line, "{:>14}{:>12}", "-", "-");
                    times.push(None);
                }
            }
        }
        if let Some(fi) = algos.iter().position(|a| *a == flat) {
            for (i, _) in algos.iter().enumerate().filter(|(_, a)| **a != flat) {
                match (times[fi], times[i]) {
                    (Some(f), Some(t)) if t > 0.0 => {
                        let _ = write!(line, "{:>13.2}x", f / t);
                    }
                    _ => {
                        let _ = write!(line, "{:>14}", "-");
                    }
                }
            }
        }
        if let Some(pick) = auto_pick {
            let _ = write!(line, "{:>12}", pick.name());
        }
        line.push('\n');
        bar.suspend(|| super::emit(&line))?;
    }
    bar.finish_and_clear();
    if let Some(path) = &args.plot {
        let title = format!("Simulated {} on {} ({} ranks)", args.op, topo.name(), n);
        line_plot(path, &title, "time (us)", &series).map_err(|e| Failure::other(e.to_string()))?;
        eprintln!("plot written to {}", path.display());
    }
    Ok(())
}

/// One measured row of a `halo bench --json-out` file.
#[derive(Debug, serde::Deserialize)]
struct MeasuredRow {
    algorithm: String,
    size: usize,
    avg_us: f64,
}

#[derive(Debug, serde::Deserialize)]
struct Measured {
    benchmark: String,
    ranks: usize,
    #[serde(default)]
    mode: String,
    /// The router of an `alltoallv` run.
    #[serde(default)]
    moe: Option<crate::bench::moe::MoeShape>,
    rows: Vec<MeasuredRow>,
}

/// `halo simulate --measured FILE`: simulated against measured, per algorithm and size.
fn validate(topo: &Topology, file: &std::path::Path, opts: &SimOptions) -> Result<String, Failure> {
    let text = std::fs::read_to_string(file)
        .map_err(|e| Failure::input(format!("--measured {}: {e}", file.display())))?;
    let m: Measured = serde_json::from_str(&text).map_err(|e| {
        Failure::input(format!(
            "--measured {}: not a `halo bench --json-out` file: {e}",
            file.display()
        ))
    })?;
    let moe = match (m.benchmark.as_str(), &m.moe) {
        ("alltoall", _) => None,
        ("alltoallv", Some(shape)) if shape.hidden.is_none() => Some(shape.clone()),
        ("alltoallv", Some(_)) => {
            return Err(Failure::input(format!(
                "--measured {}: an alltoallv run with --hidden (sizes are tokens); only \
                 byte-sized sweeps are compared",
                file.display()
            )));
        }
        ("alltoallv", None) => {
            return Err(Failure::input(format!(
                "--measured {}: an alltoallv run without its router (\"moe\"); re-run it \
                 with this version of halo bench",
                file.display()
            )));
        }
        (other, _) => {
            return Err(Failure::input(format!(
                "--measured {}: a {other} run; only alltoall and alltoallv runs are compared",
                file.display()
            )));
        }
    };
    if m.ranks != topo.size() {
        return Err(Failure::input(format!(
            "--measured {} has {} ranks but topology {} has {}",
            file.display(),
            m.ranks,
            topo.name(),
            topo.size()
        )));
    }
    let mut algos: Vec<Algorithm> = Vec::new();
    for r in &m.rows {
        if let Ok(a) = r.algorithm.parse::<Algorithm>()
            && !algos.contains(&a)
        {
            algos.push(a);
        }
    }
    if algos.is_empty() {
        return Err(Failure::input(format!(
            "--measured {}: no row of a HALO algorithm (flat, pairwise, bruck, halo, halo2d)",
            file.display()
        )));
    }
    let mut sizes: Vec<usize> = m.rows.iter().map(|r| r.size).collect();
    sizes.sort_unstable();
    sizes.dedup();
    let measured = |a: Algorithm, s: usize| {
        m.rows
            .iter()
            .find(|r| r.size == s && r.algorithm == a.name())
            .map(|r| r.avg_us * 1e-6)
    };
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# Simulated against measured: {} ({} ranks, {}) on topology {}",
        file.display(),
        m.ranks,
        m.mode,
        topo.name()
    );
    let _ = writeln!(
        out,
        "# error = simulated / measured - 1; x flat = flat time / algorithm time (measured | simulated)"
    );
    let _ = write!(out, "{:<10}", "# Size");
    for a in &algos {
        let _ = write!(
            out,
            "{:>12}{:>12}{:>9}",
            format!("{a} meas"),
            format!("{a} sim"),
            "error"
        );
    }
    let has_flat = algos.contains(&Algorithm::Flat);
    if has_flat {
        for a in algos.iter().filter(|a| **a != Algorithm::Flat) {
            let _ = write!(out, "{:>16}", format!("{a} x flat"));
        }
    }
    out.push('\n');
    let mut errors: Vec<(Algorithm, f64)> = Vec::new();
    for &s in &sizes {
        let _ = write!(out, "{s:<10}");
        let mut sim = Vec::new();
        for &a in &algos {
            let meas = measured(a, s);
            let t = match &moe {
                None => simulate_all_to_all(topo, a, Traffic::Uniform(s), opts)
                    .map(|r| r.time)
                    .ok(),
                Some(shape) => shape.bytes(m.ranks, s).ok().and_then(|(_, rows)| {
                    let flat: Vec<usize> = rows.into_iter().flatten().collect();
                    let sizes = MatrixSizes::new(m.ranks, flat);
                    simulate_all_to_all(topo, a, Traffic::V(&sizes), opts)
                        .map(|r| r.time)
                        .ok()
                }),
            };
            sim.push((meas, t));
            match (meas, t) {
                (Some(mv), Some(tv)) => {
                    let err = tv / mv - 1.0;
                    errors.push((a, err));
                    let _ = write!(
                        out,
                        "{:>12}{:>12}{:>8.0}%",
                        fmt_seconds(mv),
                        fmt_seconds(tv),
                        err * 100.0
                    );
                }
                _ => {
                    let _ = write!(out, "{:>12}{:>12}{:>9}", "-", "-", "-");
                }
            }
        }
        if let Some(fi) = algos.iter().position(|a| *a == Algorithm::Flat) {
            for (i, _) in algos.iter().enumerate().filter(|(i, _)| *i != fi) {
                let ratio = |f: Option<f64>, t: Option<f64>| match (f, t) {
                    (Some(f), Some(t)) if t > 0.0 => format!("{:.2}", f / t),
                    _ => "-".to_string(),
                };
                let cell = format!(
                    "{} | {}",
                    ratio(sim[fi].0, sim[i].0),
                    ratio(sim[fi].1, sim[i].1)
                );
                let _ = write!(out, "{cell:>16}");
            }
        }
        out.push('\n');
    }
    for &a in &algos {
        let e: Vec<f64> = errors
            .iter()
            .filter(|(b, _)| *b == a)
            .map(|(_, e)| *e)
            .collect();
        if e.is_empty() {
            continue;
        }
        let lo = e.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = e.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let mean_abs = e.iter().map(|x| x.abs()).sum::<f64>() / e.len() as f64;
        let _ = writeln!(
            out,
            "# {a}: error from {:+.0}% to {:+.0}%, mean |error| {:.0}%",
            lo * 100.0,
            hi * 100.0,
            mean_abs * 100.0
        );
    }
    Ok(out)
}
