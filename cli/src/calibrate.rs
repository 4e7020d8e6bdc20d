//! Calibration: measure the link class of every level of a job's topology and fit
//! the alpha-beta model `time(s) = latency + s / bandwidth` to it, so that the
//! simulator (`halo simulate --topology FILE`) describes the machine the job ran on.
//!
//! For each level where two ranks of the job meet, rank 0 pairs with the first rank
//! that meets it at that level and runs a ping-pong ([`Communicator::send`] then
//! [`Communicator::recv`], the peer the other way round) for sizes in powers of 4; the
//! one-way time of a size is the median round trip over the timed iterations, halved. The
//! `device` level is a local memory copy on rank 0 (one copy = one "message"). Every
//! other rank waits at a [`Communicator::barrier`] before and after each level, so all
//! ranks call the same collectives in the same order. A level whose times do not grow
//! with size (no fit) is measured again, at most twice more; rank 0 tells the others
//! with an all-reduce.
//!
//! # The fit
//!
//! [`fit_alpha_beta`] fits the two parameters separately, each by least squares on the
//! points that carry it. The slope `1 / bandwidth` is the ordinary (unweighted)
//! least-squares slope over all sizes: absolute errors, so the largest sizes, whose
//! times are orders of magnitude larger and which sit far from the mean size, decide
//! it. The latency is then the least-squares intercept for that slope under relative
//! errors, i.e. the mean of `t_i - s_i / bandwidth` weighted by `1 / t_i^2`, over the
//! latency-dominated sizes: those whose bandwidth term `s_i / bandwidth` is at most a
//! tenth of their time (the smallest size alone if none is). So the smallest sizes,
//! whose time is nearly all latency, decide it, and the mid sizes, where neither term
//! dominates and the machine is least like a line, decide neither. A single fit of both
//! (weighted by `1 / t_i^2` throughout) was tried first and is not used: where the
//! machine is not one straight line (a traffic shaper lets its burst through at line
//! rate; a copy leaves the cache), the mid sizes drag the slope and the bandwidth came
//! out 4x too high on a 100 Mbit/s emulated link. Points that lie exactly on a line
//! are recovered exactly. A negative latency is written as 0 (the residuals are those
//! of what is written).

use halo::{Communicator, Error, ReduceOp, Result};
use halo_topology::{Level, LinkClass, Topology, TopologySpec};
use std::time::Instant;

/// The latency is fitted on the points whose bandwidth term `s / bandwidth` is at
/// most this share of their time.
const LATENCY_SHARE: f64 = 0.1;

/// A level whose times do not grow with size (no fit) is measured again, at most this
/// many more times (a busy machine can put a floor under the small sizes' times).
const RETRIES: usize = 2;

/// Sizes above this run fewer iterations (`iters * SMALL / size`, at least 2).
const SMALL: usize = 64 << 10;

/// What to measure.
#[derive(Debug, Clone)]
pub struct CalibrateOptions {
    /// Message sizes in bytes (see [`size_ladder`]).
    pub sizes: Vec<usize>,
    /// Timed round trips per size up to 64 KiB; larger sizes run
    /// `iters * 64 KiB / size` of them, at least 2 (as OSU does).
    pub iters: usize,
    /// Draw a progress bar over the levels on rank 0 (see [`crate::progress`]).
    pub progress: bool,
}

impl Default for CalibrateOptions {
    fn default() -> Self {
        CalibrateOptions {
            sizes: size_ladder(1, 4 << 20),
            iters: 100,
            progress: false,
        }
    }
}

/// `lo, 4 lo, 16 lo, ...` up to and including `hi` (the last step is cut to `hi`).
pub fn size_ladder(lo: usize, hi: usize) -> Vec<usize> {
    let lo = lo.max(1);
    let mut out = vec![lo];
    let mut s = lo;
    while s < hi {
        s = s.saturating_mul(4).min(hi);
        out.push(s);
    }
    out
}

/// Timed iterations for a size.
pub fn iterations(iters: usize, bytes: usize) -> usize {
    let iters = iters.max(1);
    if bytes <= SMALL {
        iters
    } else {
        (iters * SMALL / bytes).max(2).min(iters.max(2))
    }
}

/// One measured size.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// Message size, bytes.
    pub bytes: usize,
    /// Timed iterations.
    pub iters: usize,
    /// One-way time: median round trip / 2 (device: median copy time), seconds. The
    /// median, not the mean: on a busy machine a rank that waits for a core adds
    /// milliseconds to a few iterations.
    pub one_way: f64,
    /// The same from the mean round trip (OSU's statistic), seconds.
    pub mean: f64,
}

/// The alpha-beta fit of one level.
#[derive(Debug, Clone, PartialEq)]
pub struct Fit {
    /// Fitted latency, seconds (as fitted; may be negative, see [`Fit::link`]).
    pub latency: f64,
    /// Fitted bandwidth, bytes per second.
    pub bandwidth: f64,
    /// Per point, `model / measured - 1` with the latency clamped at 0 (what the file
    /// describes).
    pub residuals: Vec<f64>,
}

impl Fit {
    /// The link class written to the file: the fitted bandwidth, the latency clamped
    /// at 0, and `taper`.
    pub fn link(&self, taper: f64) -> LinkClass {
        LinkClass::new(self.bandwidth, self.latency.max(0.0)).tapered(taper)
    }
}

/// Fits `t = latency + s / bandwidth` to `(s, t)` points in two steps (see the
/// [module docs](self)): the slope `1 / bandwidth` by ordinary least squares (absolute
/// errors: the largest sizes, with the largest times and the most leverage, decide it),
/// then the latency as the `1 / t^2`-weighted mean of `t - s / bandwidth` over the
/// latency-dominated points, those where `s / bandwidth` is at most a tenth of `t`
/// (the smallest size alone when there are none). Points on a line give it back exactly. `None`
/// with fewer than two distinct sizes, a non-positive or non-finite time, or no
/// positive slope.
pub fn fit_alpha_beta(points: &[(f64, f64)]) -> Option<Fit> {
    if points.len() < 2
        || points
            .iter()
            .any(|&(s, t)| !(t > 0.0 && t.is_finite() && s.is_finite()))
    {
        return None;
    }
    let n = points.len() as f64;
    let ms = points.iter().map(|p| p.0).sum::<f64>() / n;
    let mt = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - ms) * (p.0 - ms)).sum();
    let sxy: f64 = points.iter().map(|p| (p.0 - ms) * (p.1 - mt)).sum();
    if sxx <= 0.0 {
        return None;
    }
    let slope = sxy / sxx;
    if !(slope > 0.0 && slope.is_finite()) {
        return None;
    }
    // Latency-dominated points: the bandwidth term is at most a tenth of the time.
    // Without any, the smallest size alone.
    let small: Vec<(f64, f64)> = match points
        .iter()
        .copied()
        .filter(|&(s, t)| s * slope <= LATENCY_SHARE * t)
        .collect::<Vec<_>>()
    {
        v if !v.is_empty() => v,
        _ => vec![
            *points
                .iter()
                .min_by(|a, b| a.0.total_cmp(&b.0))
                .expect("two points or more"),
        ],
    };
    let (mut num, mut den) = (0.0, 0.0);
    for &(s, t) in &small {
        let w = 1.0 / (t * t);
        num += w * (t - s * slope);
        den += w;
    }
    let latency = num / den;
    let bandwidth = 1.0 / slope;
    let clamped = latency.max(0.0);
    let residuals = points
        .iter()
        .map(|&(s, t)| (clamped + s * slope) / t - 1.0)
        .collect();
    Some(Fit {
        latency,
        bandwidth,
        residuals,
    })
}

/// The measurements and fit of one level.
#[derive(Debug, Clone)]
pub struct LevelCalibration {
    /// The level.
    pub level: Level,
    /// The rank paired with rank 0 (0 for `device`: a local copy).
    pub peer: usize,
    /// One sample per size.
    pub samples: Vec<Sample>,
    /// The fit; `None` when it failed (the level keeps its link class).
    pub fit: Option<Fit>,
}

/// The rank that rank 0 pairs with for each level where two ranks of `topo` meet:
/// `(level, peer)`, innermost first; `device` pairs rank 0 with itself.
pub fn pairs(topo: &Topology) -> Vec<(Level, usize)> {
    topo.levels()
        .filter_map(|level| {
            if level == Level::Device {
                return Some((level, 0));
            }
            (1..topo.size())
                .find(|&r| topo.meet(0, r) == level)
                .map(|r| (level, r))
        })
        .collect()
}

/// One level's samples, on rank 0 and `peer` (for `device`, rank 0 alone).
fn time_level(
    comm: &mut Communicator,
    level: Level,
    peer: usize,
    opts: &CalibrateOptions,
    a: &mut [u8],
    b: &mut [u8],
) -> Result<Vec<Sample>> {
    let me = comm.rank();
    let mut samples = Vec::new();
    for &bytes in &opts.sizes {
        // Copies are cheap: the device level runs every iteration asked for.
        let iters = if level == Level::Device {
            opts.iters.max(1)
        } else {
            iterations(opts.iters, bytes)
        };
        let warmup = if bytes > SMALL { 1 } else { 2 + iters / 10 };
        let mut times = Vec::with_capacity(iters);
        for i in 0..warmup + iters {
            let start = Instant::now();
            if level == Level::Device {
                b[..bytes].copy_from_slice(&a[..bytes]);
                std::hint::black_box(&mut *b);
            } else if me == 0 {
                comm.send(&a[..bytes], peer)?;
                comm.recv(&mut b[..bytes], peer)?;
            } else {
                comm.recv(&mut b[..bytes], 0)?;
                comm.send(&b[..bytes], 0)?;
            }
            if i >= warmup {
                times.push(start.elapsed().as_secs_f64());
            }
            a[0] = a[0].wrapping_add(1);
        }
        let half = if level == Level::Device { 1.0 } else { 0.5 };
        let mean = times.iter().sum::<f64>() / iters as f64 * half;
        times.sort_by(f64::total_cmp);
        let one_way = times[iters / 2] * half;
        samples.push(Sample {
            bytes,
            iters,
            one_way,
            mean,
        });
    }
    Ok(samples)
}

/// Runs the calibration as one rank of `comm`; every rank must call it with the same
/// options. Rank 0 returns the measurements; other ranks return an empty list.
///
/// # Errors
/// [`Error::InvalidArgument`] for no sizes; whatever the point-to-point calls and
/// barriers return.
pub fn measure(comm: &mut Communicator, opts: &CalibrateOptions) -> Result<Vec<LevelCalibration>> {
    if opts.sizes.is_empty() {
        return Err(Error::invalid_argument("calibrate: no sizes"));
    }
    let me = comm.rank();
    let largest = *opts.sizes.iter().max().expect("not empty");
    let mut a = vec![0x5au8; largest];
    let mut b = vec![0u8; largest];
    let mut out = Vec::new();
    let pairs = pairs(comm.topology());
    let bar = crate::progress::bar(pairs.len(), "calibrating levels", opts.progress && me == 0);
    for (level, peer) in pairs {
        bar.inc(1);
        for attempt in 0..=RETRIES {
            comm.barrier()?;
            let samples = if me == 0 || me == peer {
                time_level(comm, level, peer, opts, &mut a, &mut b)?
            } else {
                Vec::new()
            };
            let fit = if me == 0 {
                let points: Vec<(f64, f64)> = samples
                    .iter()
                    .map(|s| (s.bytes as f64, s.one_way))
                    .collect();
                fit_alpha_beta(&points)
            } else {
                None
            };
            // Rank 0 tells every rank whether the level is measured again.
            let mut again = [u32::from(me == 0 && fit.is_none() && attempt < RETRIES)];
            comm.all_reduce_in_place(&mut again, ReduceOp::Max)?;
            if again[0] == 0 {
                if me == 0 {
                    out.push(LevelCalibration {
                        level,
                        peer,
                        fit,
                        samples,
                    });
                }
                break;
            }
            tracing::info!(%level, attempt, "calibrate: times do not grow with size; measuring again");
        }
    }
    bar.finish_and_clear();
    Ok(out)
}

/// `topo` as a file with the fitted link classes substituted for the measured levels
/// (each keeps its taper); the name gets ` (calibrated)`.
pub fn calibrated_spec(topo: &Topology, levels: &[LevelCalibration]) -> TopologySpec {
    let mut spec = topo.to_spec();
    for l in levels {
        if let Some(fit) = &l.fit {
            let taper = topo.link(l.level).taper;
            spec.links
                .insert(l.level.name().to_string(), fit.link(taper));
        }
    }
    spec.name = if spec.name.is_empty() {
        "calibrated".to_string()
    } else {
        format!("{} (calibrated)", spec.name)
    };
    spec
}

/// The raw measurements and fits as JSON.
pub fn to_json(topo: &Topology, levels: &[LevelCalibration]) -> serde_json::Value {
    let levels: Vec<serde_json::Value> = levels
        .iter()
        .map(|l| {
            serde_json::json!({
                "level": l.level.name(),
                "ranks": [0, l.peer],
                "samples": l.samples.iter().map(|s| serde_json::json!({
                    "bytes": s.bytes,
                    "iters": s.iters,
                    "one_way_s": s.one_way,
                    "one_way_mean_s": s.mean,
                })).collect::<Vec<_>>(),
                "fit": l.fit.as_ref().map(|f| serde_json::json!({
                    "latency_s": f.latency,
                    "bandwidth_bytes_per_s": f.bandwidth,
                    "residuals": f.residuals,
                })),
            })
        })
        .collect();
    serde_json::json!({
        "topology": topo.name(),
        "ranks": topo.size(),
        "levels": levels,
    })
}
