//! `halo calibrate`: one rank of a job measures every level's link and fits it.

use super::Failure;
use crate::calibrate::{CalibrateOptions, calibrated_spec, measure, to_json};
use crate::plot::fmt_bytes;
use clap::Args;
use halo::Communicator;
use halo::topology::{fmt_bandwidth, fmt_seconds};
use std::fmt::Write as _;
use std::path::PathBuf;

/// Measures the latency and bandwidth of every level of the job's topology where two
/// ranks meet (ping-pong between rank 0 and the first rank that meets it there; the
/// device level is a memory copy) and fits `time = latency + bytes / bandwidth` per
/// level. Run it as every rank of a job; rank 0 prints the table and writes the
/// topology with the fitted link classes, for `halo simulate --topology FILE`.
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  halo launch -n 4 -- halo calibrate --out t.toml\n  \
    halo launch -n 4 --hosts 2 --host-rate 1gbit -- halo calibrate --out t.toml\n  \
    halo simulate --topology t.toml --sizes 1K:1M"
)]
pub(crate) struct CalibrateArgs {
    /// Message sizes: MIN:MAX (powers of 4 from MIN; K, M, G suffixes) or one size.
    #[arg(long, default_value = "1:4M")]
    sizes: String,
    /// Timed round trips per size up to 64 KiB (fewer above, at least 2).
    #[arg(long, default_value_t = 100)]
    iters: usize,
    /// Write the calibrated topology here (TOML, or JSON when it ends in .json).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Print the raw measurements and fits as JSON instead of the table.
    #[arg(long)]
    json: bool,
}

pub(crate) fn run(args: &CalibrateArgs) -> Result<(), Failure> {
    let opts = CalibrateOptions {
        sizes: super::size_ladder_arg(&args.sizes)?,
        iters: args.iters,
        progress: !args.json && crate::progress::on_terminal(),
    };
    if opts.sizes.len() < 2 {
        return Err(Failure::input(format!(
            "--sizes {}: a fit needs at least two sizes",
            args.sizes
        )));
    }
    let mut comm =
        Communicator::init_from_env().map_err(|e| Failure::other(format!("init: {e}")))?;
    let levels = measure(&mut comm, &opts)
        .map_err(|e| Failure::other(format!("rank {}: {e}", comm.rank())))?;
    if comm.rank() != 0 {
        return Ok(());
    }
    let topo = comm.topology();
    let spec = calibrated_spec(topo, &levels);
    if let Some(path) = &args.out {
        let text = if path.extension().is_some_and(|e| e == "json") {
            spec.to_json_string()
        } else {
            spec.to_toml_string()
        };
        std::fs::write(path, text)
            .map_err(|e| Failure::other(format!("cannot write {}: {e}", path.display())))?;
    }
    if args.json {
        let text = serde_json::to_string_pretty(&to_json(topo, &levels))
            .map_err(|e| Failure::other(format!("json: {e}")))?;
        return super::emit(&format!("{text}\n"));
    }
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# halo calibrate: {} ranks, topology {}; one-way time = median round \
         trip / 2 (device: one memory copy); HALO_PROGRESS={}",
        topo.size(),
        topo.name(),
        halo_params::PROGRESS
            .raw()
            .unwrap_or_else(|| "sleep (default)".into())
    );
    let _ = writeln!(
        out,
        "# fit: time = latency + bytes / bandwidth; bandwidth by least squares (large sizes \
         decide it), latency by least squares on relative errors (small sizes decide it)"
    );
    for l in &levels {
        let _ = writeln!(out);
        match &l.fit {
            Some(f) => {
                let clamped = if f.latency < 0.0 {
                    format!(" (fitted {}, written as 0)", fmt_signed_seconds(f.latency))
                } else {
                    String::new()
                };
                let _ = writeln!(
                    out,
                    "{} (ranks 0 and {}): latency {}{clamped}, bandwidth {}",
                    l.level,
                    l.peer,
                    fmt_seconds(f.latency.max(0.0)),
                    fmt_bandwidth(f.bandwidth)
                );
            }
            None => {
                let _ = writeln!(
                    out,
                    "{} (ranks 0 and {}): no fit (times do not grow with size); link class unchanged",
                    l.level, l.peer
                );
            }
        }
        let _ = writeln!(
            out,
            "{:>10} {:>6} {:>14} {:>14} {:>9}",
            "size", "iters", "measured", "fitted", "residual"
        );
        for (i, s) in l.samples.iter().enumerate() {
            let (fitted, resid) = match &l.fit {
                Some(f) => (
                    fmt_seconds(f.latency.max(0.0) + s.bytes as f64 / f.bandwidth),
                    format!("{:+.1}%", f.residuals[i] * 100.0),
                ),
                None => ("-".to_string(), "-".to_string()),
            };
            let _ = writeln!(
                out,
                "{:>10} {:>6} {:>14} {:>14} {:>9}",
                fmt_bytes(s.bytes as f64),
                s.iters,
                fmt_seconds(s.one_way),
                fitted,
                resid
            );
        }
    }
    let unmeasured: Vec<String> = topo
        .levels()
        .filter(|l| !levels.iter().any(|c| c.level == *l))
        .map(|l| {
            let link = topo.link(l);
            format!(
                "{l} ({}, {})",
                fmt_seconds(link.latency),
                fmt_bandwidth(link.bandwidth)
            )
        })
        .collect();
    if !unmeasured.is_empty() {
        let _ = writeln!(
            out,
            "\nnot measured (no two ranks of this job meet there), written unchanged: {}",
            unmeasured.join(", ")
        );
    }
    if let Some(path) = &args.out {
        let _ = writeln!(out, "\nwrote {}", path.display());
    }
    super::emit(&out)
}

fn fmt_signed_seconds(s: f64) -> String {
    if s < 0.0 {
        format!("-{}", fmt_seconds(-s))
    } else {
        fmt_seconds(s)
    }
}
