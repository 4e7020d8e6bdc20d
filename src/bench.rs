//! The OSU-style all-to-all benchmark behind `halo bench`, as a library.
//!
//! Without a cluster it runs `N` ranks as threads of this process on an emulated
//! topology (default `nodes:4x4` with link emulation on) and measures, per algorithm
//! and message size, what `osu_alltoall` measures:
//!
//! - sizes are bytes per destination, powers of two from `min_size` to `max_size`;
//! - per size, `warmup` untimed then `iterations` timed calls (OSU's defaults: 1000 and
//!   100 up to 8 KiB, 100 and 10 above); a barrier separates the calls and is not timed;
//! - each rank averages its own iterations; the report gives the mean, minimum and
//!   maximum over ranks of those averages;
//! - a bus bandwidth column after nccl-tests: `algbw = size x N / t` (the bytes one rank
//!   sends, including to itself, over the mean time) and `busbw = algbw x (N - 1) / N`.
//!
//! [`format_osu`] prints the tables in OSU's layout.

use crate::error::{Error, Result};
use crate::local::{self, Emulation};
use crate::select;
use halo_collectives::{AlgoOptions, Algorithm};
use halo_topology::Topology;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

/// Largest size (bytes per destination) that gets OSU's small-message iteration counts.
pub const LARGE_MESSAGE_SIZE: usize = 8192;

/// What to measure.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// The topology the ranks are placed in (one thread per rank).
    pub topology: Topology,
    /// Link emulation of the in-process transport.
    pub emulation: Emulation,
    /// The algorithms to measure, in order (empty: every algorithm that builds).
    pub algorithms: Vec<Algorithm>,
    /// Smallest size, bytes per destination (rounded up to a power of two; 0 is measured as 0).
    pub min_size: usize,
    /// Largest size, bytes per destination.
    pub max_size: usize,
    /// Timed iterations per size (`None`: OSU's 1000 up to 8 KiB, 100 above).
    pub iterations: Option<usize>,
    /// Untimed warm-up iterations per size (`None`: OSU's 100 up to 8 KiB, 10 above).
    pub warmup: Option<usize>,
    /// Per-call timeout.
    pub timeout: Duration,
    /// Check every received byte after the last iteration of each size (OSU's `-c`).
    pub validate: bool,
}

impl BenchOptions {
    /// The defaults: `nodes:4x4` emulated, every algorithm that builds, 1 B to 1 MiB,
    /// OSU's iteration counts.
    ///
    /// # Errors
    /// Never in practice (the preset is valid); the signature carries the topology's error.
    pub fn new() -> Result<Self> {
        Ok(BenchOptions {
            topology: Topology::preset("nodes:4x4")?,
            emulation: Emulation::on(),
            algorithms: Vec::new(),
            min_size: 1,
            max_size: 1 << 20,
            iterations: None,
            warmup: None,
            timeout: Duration::from_secs(60),
            validate: false,
        })
    }

    /// The sizes measured: powers of two from `min_size` to `max_size` (a 0 first when
    /// `min_size` is 0).
    pub fn sizes(&self) -> Vec<usize> {
        let mut out = Vec::new();
        if self.min_size == 0 {
            out.push(0);
        }
        let mut s = self.min_size.max(1).next_power_of_two();
        while s <= self.max_size {
            out.push(s);
            match s.checked_mul(2) {
                Some(t) => s = t,
                None => break,
            }
        }
        out
    }

    /// Timed and warm-up iterations for a size.
    pub fn iterations_for(&self, size: usize) -> (usize, usize) {
        let small = size <= LARGE_MESSAGE_SIZE;
        (
            self.iterations.unwrap_or(if small { 1000 } else { 100 }),
            self.warmup.unwrap_or(if small { 100 } else { 10 }),
        )
    }
}

/// One line of a table: one algorithm at one size.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchRow {
    /// The algorithm.
    pub algorithm: Algorithm,
    /// Bytes per destination.
    pub size: usize,
    /// Mean over ranks of each rank's mean latency, microseconds.
    pub avg_us: f64,
    /// Smallest rank mean, microseconds.
    pub min_us: f64,
    /// Largest rank mean, microseconds.
    pub max_us: f64,
    /// Timed iterations.
    pub iterations: usize,
    /// nccl-tests' bus bandwidth, GB/s (10^9 bytes per second).
    pub bus_bw_gbs: f64,
}

/// The algorithms a benchmark measures: those asked for, or every one that builds.
/// Algorithms that do not build are left out and logged.
pub fn algorithms(opts: &BenchOptions) -> Vec<Algorithm> {
    let asked: Vec<Algorithm> = if opts.algorithms.is_empty() {
        Algorithm::ALL.to_vec()
    } else {
        opts.algorithms.clone()
    };
    let options = AlgoOptions::default();
    asked
        .into_iter()
        .filter(|&a| match select::buildable(&opts.topology, a, &options) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(algorithm = %a, error = %e, "skipping an algorithm that does not build");
                false
            }
        })
        .collect()
}

fn fill(buf: &mut [u8], rank: usize, iteration: usize, size: usize) {
    for (i, b) in buf.iter_mut().enumerate() {
        let (dst, off) = (
            i.checked_div(size).unwrap_or(0),
            i.checked_rem(size).unwrap_or(0),
        );
        *b = (rank.wrapping_mul(31) ^ dst.wrapping_mul(7) ^ off ^ iteration) as u8;
    }
}

/// Runs the benchmark: one thread per rank, every algorithm, every size.
///
/// # Errors
/// The first rank's error if any rank fails (a timeout, a validation failure as
/// [`Error::InternalError`]); [`Error::InvalidArgument`] when no algorithm is left to
/// measure or a size overflows.
pub fn run_local_bench(opts: &BenchOptions) -> Result<Vec<BenchRow>> {
    let algorithms = algorithms(opts);
    if algorithms.is_empty() {
        return Err(Error::invalid_argument(
            "no algorithm to benchmark builds on this topology",
        ));
    }
    let sizes = opts.sizes();
    let n = opts.topology.size();
    for &s in &sizes {
        if s.checked_mul(n).is_none() {
            return Err(Error::invalid_argument(format!(
                "{s} bytes x {n} ranks overflows"
            )));
        }
    }
    // Per rank: per (algorithm, size) its mean latency in seconds.
    let per_rank = local::run(&opts.topology, opts.emulation, |comm| {
        comm.set_timeout(opts.timeout);
        let me = comm.rank();
        let mut out = Vec::with_capacity(algorithms.len() * sizes.len());
        for &alg in &algorithms {
            comm.set_algorithm(Some(alg));
            for &size in &sizes {
                let (iterations, warmup) = opts.iterations_for(size);
                let mut send = vec![0u8; size * n];
                let mut recv = vec![0u8; size * n];
                fill(&mut send, me, 0, size);
                let mut timed = Duration::ZERO;
                for i in 0..warmup + iterations {
                    comm.barrier()?;
                    let t = Instant::now();
                    comm.all_to_all(&send, &mut recv)?;
                    if i >= warmup {
                        timed += t.elapsed();
                    }
                }
                if opts.validate {
                    let mut want = vec![0u8; size];
                    for q in 0..n {
                        let mut row = vec![0u8; size * n];
                        fill(&mut row, q, 0, size);
                        want.copy_from_slice(&row[me * size..(me + 1) * size]);
                        if recv[q * size..(q + 1) * size] != want[..] {
                            return Err(Error::internal(format!(
                                "validation failed: {alg} at {size} bytes, rank {me}, block from rank {q}"
                            )));
                        }
                    }
                }
                let mean = if iterations == 0 {
                    0.0
                } else {
                    timed.as_secs_f64() / iterations as f64
                };
                out.push((alg, size, iterations, mean));
            }
        }
        comm.barrier()?;
        Ok(out)
    });
    let per_rank: Vec<Vec<(Algorithm, usize, usize, f64)>> =
        per_rank.into_iter().collect::<Result<_>>()?;
    let mut rows = Vec::new();
    for (i, &(alg, size, iterations, _)) in per_rank[0].iter().enumerate() {
        let times: Vec<f64> = per_rank.iter().map(|r| r[i].3).collect();
        let avg = times.iter().sum::<f64>() / times.len() as f64;
        let min = times.iter().copied().fold(f64::INFINITY, f64::min);
        let max = times.iter().copied().fold(0.0, f64::max);
        rows.push(BenchRow {
            algorithm: alg,
            size,
            avg_us: avg * 1e6,
            min_us: min * 1e6,
            max_us: max * 1e6,
            iterations,
            bus_bw_gbs: bus_bandwidth(size, n, avg),
        });
    }
    Ok(rows)
}

/// nccl-tests' bus bandwidth of an all-to-all, GB/s: `algbw = size x n / seconds`,
/// `busbw = algbw x (n - 1) / n` (0 when the time is 0).
pub fn bus_bandwidth(size: usize, n: usize, seconds: f64) -> f64 {
    if seconds <= 0.0 || n == 0 {
        return 0.0;
    }
    let algbw = (size as f64 * n as f64) / seconds / 1e9;
    algbw * (n as f64 - 1.0) / n as f64
}

/// The tables in OSU's layout: per algorithm a title line
/// `# OSU MPI-style All-to-All Latency Test (HALO <algo>, N ranks, topology <name>[, emulated])`,
/// the column header and one line per size.
pub fn format_osu(opts: &BenchOptions, rows: &[BenchRow]) -> String {
    let mut out = String::new();
    let n = opts.topology.size();
    let mut algs: Vec<Algorithm> = Vec::new();
    for r in rows {
        if !algs.contains(&r.algorithm) {
            algs.push(r.algorithm);
        }
    }
    for (i, alg) in algs.into_iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        let emulated = if opts.emulation.enabled {
            if opts.emulation.scale == 1.0 {
                ", emulated".to_string()
            } else {
                format!(", emulated x{}", opts.emulation.scale)
            }
        } else {
            String::new()
        };
        let _ = writeln!(
            out,
            "# OSU MPI-style All-to-All Latency Test (HALO {alg}, {n} ranks, topology {}{emulated})",
            opts.topology.name()
        );
        let _ = writeln!(
            out,
            "{:<10}{:>20}{:>20}{:>20}{:>12}{:>20}",
            "# Size",
            "Avg Latency(us)",
            "Min Latency(us)",
            "Max Latency(us)",
            "Iterations",
            "Bus BW(GB/s)"
        );
        for r in rows.iter().filter(|r| r.algorithm == alg) {
            let _ = writeln!(
                out,
                "{:<10}{:>20.2}{:>20.2}{:>20.2}{:>12}{:>20.2}",
                r.size, r.avg_us, r.min_us, r.max_us, r.iterations, r.bus_bw_gbs
            );
        }
    }
    out
}
