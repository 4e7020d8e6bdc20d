//! The OSU-style benchmark suite behind `halo bench`, as a library.
//!
//! Four benchmarks, measured as the OSU micro-benchmarks measure them
//! (docs/REFERENCE.md §3):
//!
//! - [`Op::AllToAll`] (`osu_alltoall`): sizes are bytes per destination, powers of two;
//!   per size `warmup` untimed then `iterations` timed calls, a barrier before each call
//!   and outside the timer; each rank averages its own iterations and the report gives
//!   the mean, minimum and maximum over ranks of those averages.
//! - [`Op::AllToAllV`] (`osu_alltoallv`, MoE-shaped): the same timing, with per-peer
//!   byte counts from a top-k router over Zipf-popular experts ([`moe`]).
//! - [`Op::Latency`] (`osu_latency`): ping-pong between rank 0 and the last rank (the
//!   farthest apart), half the round trip; the other ranks wait.
//! - [`Op::Bandwidth`] (`osu_bw`): rank 0 sends a window of messages to the last rank,
//!   which answers with a 4-byte acknowledgement; MB/s = 10^6 bytes per second.
//!
//! Every measurement runs through one [`Implementation`]: HALO's [`Communicator`] (with the
//! algorithm of each [`BenchAlgo`]) or, with the cargo feature `mpi`, MPI itself
//! ([`mpi::MpiImplementation`]) on the same processes, so that each comparison is a ratio
//! from one run. [`run_ranks`] is what every rank calls, whether the ranks are
//! threads of this process ([`run_local_bench`]) or processes started by `halo
//! launch`, mpirun or srun; rank 0 gets the rows. [`report`] formats them (OSU text,
//! nccl-tests columns, JSON, CSV, comparison tables, plots).

mod implementation;
mod measure;
pub mod moe;
#[cfg(feature = "mpi")]
pub mod mpi;
pub mod report;

use halo::Communicator;
use halo::local::{self, Emulation};
use halo::select;
use halo::{Error, Result};
use halo_collectives::{AlgoOptions, Algorithm};
use halo_topology::Topology;
pub use implementation::Implementation;
use measure::{measure_rank, sweep};
use moe::MoeShape;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// Largest size (bytes per destination) that gets OSU's small-message iteration counts.
pub const LARGE_MESSAGE_SIZE: usize = 8192;

/// Most untimed calls an `auto` all-to-all size runs for the automatic mode's trials
/// ([`BenchOptions::time_trials`]): twice the most the tuner takes
/// ([`halo::tune::trial_calls`] of the smallest blocks with
/// [`halo::tune::MAX_CANDIDATES`] candidates: 48), a bound, not a target.
pub const SETTLE_MAX_CALLS: usize = 2 * halo::tune::trial_calls(0, halo::tune::MAX_CANDIDATES);

/// Which benchmark.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// `osu_alltoall`.
    AllToAll,
    /// `osu_alltoallv` with MoE-shaped counts.
    AllToAllV,
    /// `osu_latency`: ping-pong, half the round trip.
    Latency,
    /// `osu_bw`: windowed one-way bandwidth.
    Bandwidth,
}

impl Op {
    /// Every benchmark, in the order `halo bench --help` lists them.
    pub const ALL: [Op; 4] = [Op::AllToAll, Op::AllToAllV, Op::Latency, Op::Bandwidth];

    /// The name on the command line: `alltoall`, `alltoallv`, `latency`, `bw`.
    pub fn name(self) -> &'static str {
        match self {
            Op::AllToAll => "alltoall",
            Op::AllToAllV => "alltoallv",
            Op::Latency => "latency",
            Op::Bandwidth => "bw",
        }
    }

    /// A collective (every rank takes part) rather than a point-to-point test.
    pub fn is_collective(self) -> bool {
        matches!(self, Op::AllToAll | Op::AllToAllV)
    }

    /// OSU's default sizes: 1 B to 1 MiB for the collectives, 0 B (latency) or 1 B
    /// (bandwidth) to 4 MiB for the point-to-point tests.
    pub fn default_sizes(self) -> (usize, usize) {
        match self {
            Op::AllToAll | Op::AllToAllV => (1, 1 << 20),
            Op::Latency => (0, 4 << 20),
            Op::Bandwidth => (1, 4 << 20),
        }
    }

    /// OSU's default (timed, warm-up) iterations for a size.
    pub fn default_iterations(self, size: usize) -> (usize, usize) {
        let small = size <= LARGE_MESSAGE_SIZE;
        match (self, small) {
            (Op::AllToAll | Op::AllToAllV, true) => (1000, 100),
            (Op::AllToAll | Op::AllToAllV, false) => (100, 10),
            (Op::Latency, true) => (10000, 1000),
            (Op::Latency, false) => (1000, 100),
            (Op::Bandwidth, true) => (100, 10),
            (Op::Bandwidth, false) => (20, 2),
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Op {
    type Err = Error;
    fn from_str(s: &str) -> Result<Op> {
        Op::ALL.into_iter().find(|o| o.name() == s).ok_or_else(|| {
            Error::invalid_argument(format!(
                "unknown benchmark '{s}' (alltoall, alltoallv, latency, bw)"
            ))
        })
    }
}

/// What carries a benchmark's calls: a HALO algorithm, HALO's automatic choice, or MPI.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BenchAlgo {
    /// HALO with this algorithm, or the automatic choice (`None`, named `auto`; for the
    /// point-to-point tests HALO's send/recv, named `halo`).
    Halo(Option<Algorithm>),
    /// The MPI library the processes were started with (`MPI_Alltoall`, `MPI_Alltoallv`,
    /// `MPI_Send`/`MPI_Recv`), cargo feature `mpi`.
    Mpi,
    /// The memory floor of `alltoall`, not an all-to-all: every rank copies its send
    /// buffer into its receive buffer with `memcpy`, all ranks at once, then waits at a
    /// barrier (inside the timer). Its time is what moving every rank's bytes once
    /// costs on this machine, with the processor shared as the all-to-all shares it,
    /// plus one barrier.
    Memcpy,
    /// `latency` and `bw` only: HALO's blocking send and receive, one after the other
    /// (the window of `bw` without non-blocking operations), named `halo-blocking`.
    HaloBlocking,
}

impl BenchAlgo {
    /// The name in tables and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            BenchAlgo::Halo(None) => "auto",
            BenchAlgo::Halo(Some(a)) => a.name(),
            BenchAlgo::Mpi => "mpi",
            BenchAlgo::Memcpy => "memcpy",
            BenchAlgo::HaloBlocking => "halo-blocking",
        }
    }

    /// The name for a benchmark: HALO's point-to-point path is `halo`.
    pub fn label(self, op: Op) -> &'static str {
        match (self, op.is_collective()) {
            (BenchAlgo::Halo(_), false) => "halo",
            _ => self.name(),
        }
    }
}

impl fmt::Display for BenchAlgo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for BenchAlgo {
    type Err = Error;
    fn from_str(s: &str) -> Result<BenchAlgo> {
        match s {
            "auto" | "halo-auto" => Ok(BenchAlgo::Halo(None)),
            "mpi" => Ok(BenchAlgo::Mpi),
            "memcpy" => Ok(BenchAlgo::Memcpy),
            "halo-blocking" => Ok(BenchAlgo::HaloBlocking),
            other => other
                .parse::<Algorithm>()
                .map(|a| BenchAlgo::Halo(Some(a)))
                .map_err(|e| {
                    Error::invalid_argument(format!(
                        "{e}; or auto, mpi, memcpy, halo-blocking, all"
                    ))
                }),
        }
    }
}

/// What to measure.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// The benchmark.
    pub op: Op,
    /// The implementations to measure, in order; empty: every HALO algorithm that
    /// builds, then `auto`, then `mpi` when an MPI engine is given (the `memcpy`
    /// reference only when asked for).
    pub algorithms: Vec<BenchAlgo>,
    /// Smallest size (bytes per destination; for `alltoallv` with `hidden`, tokens).
    /// Rounded up to a power of two; 0 is measured as 0.
    pub min_size: usize,
    /// Largest size.
    pub max_size: usize,
    /// Timed iterations per size (`None`: OSU's defaults, [`Op::default_iterations`]).
    pub iterations: Option<usize>,
    /// Untimed warm-up iterations per size (`None`: OSU's defaults).
    pub warmup: Option<usize>,
    /// Per-call timeout of HALO's calls.
    pub timeout: Duration,
    /// Check every received byte of every iteration, outside the timer (OSU's `-c`).
    pub validate: bool,
    /// Time each collective up to the end of a barrier after it (`--sync`), so that a
    /// rank's time ends when every rank has finished, not when its own part returned.
    /// OSU's timing (the default) lets a library whose sends complete into kernel
    /// socket buffers return before the bytes have crossed the network; the rest of the
    /// transfer then hides in the next, untimed barrier. The barrier's own cost is
    /// included (measure it with the `memcpy` reference's smallest size).
    pub sync: bool,
    /// Each implementation's own barrier around its timed calls (HALO's for HALO,
    /// MPI_Barrier for MPI). By default, when the ranks are MPI processes, every
    /// implementation runs between MPI_Barriers (OSU's harness), so that the barrier's
    /// exit — which ranks leave it first and when — is the same for every column and
    /// only the timed calls differ; without MPI every column uses HALO's.
    pub own_barrier: bool,
    /// Time the automatic mode's trial calls (`--time-trials`). By default the calls of
    /// an `auto` all-to-all size on which the communicator times its candidates
    /// ([`halo::Communicator::tuning`]) run untimed and count neither as warm-up nor as
    /// timed iterations, at most [`SETTLE_MAX_CALLS`] per size.
    pub time_trials: bool,
    /// The router behind `alltoallv`'s counts.
    pub moe: MoeShape,
    /// Messages in flight per iteration of `bw` (OSU's window, 64).
    pub window: usize,
    /// Draw a progress bar on rank 0 (the tool sets it on a terminal with text output;
    /// see [`crate::progress`]).
    pub progress: bool,
    /// Rounds per size (`--rounds`, at least 1). With 1 every implementation is
    /// measured at every size before the next implementation starts. With more, each
    /// round measures every size with every implementation (warm-up and timed
    /// iterations each), the implementations in an order rotated by the round, and a
    /// rank's figure is the median over rounds of its per-round means: a drift of the
    /// machine's load over the run then shifts all implementations alike instead of
    /// the ones measured last.
    pub rounds: usize,
}

impl Default for BenchOptions {
    /// `alltoall`, every algorithm, 1 B to 1 MiB, OSU's iteration counts, no validation.
    fn default() -> Self {
        BenchOptions {
            op: Op::AllToAll,
            algorithms: Vec::new(),
            min_size: 1,
            max_size: 1 << 20,
            iterations: None,
            warmup: None,
            timeout: Duration::from_secs(60),
            validate: false,
            sync: false,
            own_barrier: false,
            time_trials: false,
            moe: MoeShape::default(),
            window: 64,
            progress: false,
            rounds: 1,
        }
    }
}

impl BenchOptions {
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

    /// A lower bound of the bytes one rank of `n` allocates for its buffers at the
    /// largest size (send and receive; `None` if it cannot be counted), for the
    /// up-front memory check ([`crate::limits::check_memory`]).
    pub fn bytes_per_rank(&self, n: usize) -> Option<u128> {
        let max = self.max_size as u128;
        let n = n as u128;
        match self.op {
            Op::AllToAllV => match self.moe.hidden {
                // Tokens per rank, each routed to topk experts, 2 * hidden bytes each.
                Some(h) => max
                    .checked_mul(self.moe.topk as u128)?
                    .checked_mul(2 * h as u128)?
                    .checked_mul(2),
                None => max.checked_mul(n)?.checked_mul(2),
            },
            Op::AllToAll => max.checked_mul(n)?.checked_mul(2),
            Op::Latency => max.checked_mul(2),
            Op::Bandwidth => max.checked_mul(self.window as u128)?.checked_mul(2),
        }
    }

    /// Timed and warm-up iterations for a size.
    pub fn iterations_for(&self, size: usize) -> (usize, usize) {
        let (i, w) = self.op.default_iterations(size);
        (self.iterations.unwrap_or(i), self.warmup.unwrap_or(w))
    }

    /// The implementations measured on `topology`, `mpi` telling whether an MPI engine
    /// is there: those asked for, or every HALO algorithm that builds, `auto` and (when
    /// there) `mpi`. Algorithms that do not build on the topology are left out and
    /// logged; the point-to-point tests measure HALO once.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `mpi` is asked for without an MPI engine, or
    /// nothing is left to measure.
    pub fn resolve(&self, topology: &Topology, mpi: bool) -> Result<Vec<BenchAlgo>> {
        let asked: Vec<BenchAlgo> = if self.algorithms.is_empty() {
            let mut all: Vec<BenchAlgo> = Algorithm::ALL
                .iter()
                .map(|&a| BenchAlgo::Halo(Some(a)))
                .collect();
            all.push(BenchAlgo::Halo(None));
            if mpi {
                all.push(BenchAlgo::Mpi);
            }
            all
        } else {
            self.algorithms.clone()
        };
        if asked.contains(&BenchAlgo::Mpi) && !mpi {
            return Err(Error::invalid_argument(
                "--algo mpi needs the ranks to be MPI processes and halo built with the \
                 cargo feature `mpi`: halo launch --mpi -n N [--hosts K] -- halo bench ... \
                 (or mpirun -n N halo bench ...)",
            ));
        }
        if asked.contains(&BenchAlgo::Memcpy) && self.op != Op::AllToAll {
            return Err(Error::invalid_argument(
                "--algo memcpy is the reference of alltoall only",
            ));
        }
        if asked.contains(&BenchAlgo::HaloBlocking) && self.op.is_collective() {
            return Err(Error::invalid_argument(
                "--algo halo-blocking is for the point-to-point tests (latency, bw) only",
            ));
        }
        let options = AlgoOptions::default();
        let mut out = Vec::new();
        for a in asked {
            let a = match (a, self.op.is_collective()) {
                (BenchAlgo::Halo(_), false) => BenchAlgo::Halo(None),
                _ => a,
            };
            if out.contains(&a) {
                continue;
            }
            if let BenchAlgo::Halo(Some(alg)) = a
                && let Err(e) = select::buildable(topology, alg, &options)
            {
                tracing::warn!(algorithm = %alg, error = %e, "skipping an algorithm that does not build");
                continue;
            }
            out.push(a);
        }
        if out.is_empty() {
            return Err(Error::invalid_argument(
                "no algorithm to benchmark builds on this topology",
            ));
        }
        Ok(out)
    }
}

/// One line of a table: one implementation at one size.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchRow {
    /// The benchmark.
    pub op: Op,
    /// The implementation.
    pub algorithm: BenchAlgo,
    /// Bytes per destination (`alltoallv`: the mean over pairs; `latency`/`bw`: the
    /// message size).
    pub size: usize,
    /// Mean over ranks of each rank's mean latency, microseconds (`latency`: rank 0's
    /// one-way latency; `bw`: rank 0's time per message). With several
    /// [`rounds`](BenchOptions::rounds) a rank's figure is the median of its per-round
    /// means, and the mean, minimum and maximum are taken over those medians.
    pub avg_us: f64,
    /// Smallest rank mean, microseconds.
    pub min_us: f64,
    /// Largest rank mean, microseconds.
    pub max_us: f64,
    /// Timed iterations.
    pub iterations: usize,
    /// nccl-tests' algorithm bandwidth, GB/s: bytes one rank sends (itself included)
    /// over the mean time; for `latency` and `bw` the message's bytes over its time.
    pub alg_bw_gbs: f64,
    /// nccl-tests' bus bandwidth, GB/s: `algbw x (n - 1) / n` for the all-to-alls,
    /// `algbw` for the point-to-point tests.
    pub bus_bw_gbs: f64,
    /// Wrong bytes found by validation (0 without `-c`).
    pub wrong: u64,
}

impl BenchRow {
    /// OSU's bandwidth figure, MB/s (10^6 bytes per second), of a `bw` row.
    pub fn mb_per_s(&self) -> f64 {
        self.alg_bw_gbs * 1e3
    }
}

/// Runs the benchmark as one rank of a job: every rank of `comm` calls it with the same
/// options (and all with or all without `mpi`, an engine over the same processes).
/// Rank 0 returns the rows; the others `None`.
///
/// Per-rank results are gathered with HALO's all-gather after the last measurement.
///
/// # Errors
/// [`Error::InvalidArgument`] for options that cannot run (see
/// [`BenchOptions::resolve`]; `latency` and `bw` need two ranks; a size that
/// overflows); HALO's errors as they happen (a timeout names the peer). Validation
/// failures are not errors: the rows count the wrong bytes.
pub fn run_ranks(
    comm: &mut Communicator,
    mpi: Option<&mut dyn Implementation>,
    opts: &BenchOptions,
) -> Result<Option<Vec<BenchRow>>> {
    let n = comm.size();
    if !opts.op.is_collective() && n < 2 {
        return Err(Error::invalid_argument(format!(
            "{} needs at least 2 ranks",
            opts.op
        )));
    }
    if opts.op == Op::AllToAllV {
        opts.moe.validate()?;
    }
    if opts.window == 0 {
        return Err(Error::invalid_argument("--window must be at least 1"));
    }
    if opts.rounds == 0 {
        return Err(Error::invalid_argument("--rounds must be at least 1"));
    }
    let algorithms = opts.resolve(comm.topology(), mpi.is_some())?;
    let points = sweep(opts, n)?;
    comm.set_timeout(opts.timeout);
    let saved = comm.algorithm();
    let samples = measure_rank(comm, mpi, opts, &algorithms, &points);
    comm.set_algorithm(saved);
    let samples = samples?;
    // Gather every rank's samples: [seconds, wrong] as two f64 per sample.
    let mine: Vec<f64> = samples
        .iter()
        .flat_map(|s| [s.seconds, s.wrong as f64])
        .collect();
    let mut all = vec![0f64; mine.len() * n];
    comm.set_algorithm(None);
    comm.all_gather(&mine, &mut all)?;
    comm.set_algorithm(saved);
    if comm.rank() != 0 {
        return Ok(None);
    }
    let per_rank: Vec<&[f64]> = all.chunks(mine.len().max(1)).collect();
    let mut rows = Vec::with_capacity(samples.len());
    let mut k = 0;
    for &alg in &algorithms {
        for point in &points {
            let (size, label) = (point.size, point.label);
            let times: Vec<f64> = per_rank.iter().map(|r| r[2 * k]).collect();
            let wrong: u64 = per_rank.iter().map(|r| r[2 * k + 1] as u64).sum();
            let (iterations, _) = opts.iterations_for(size);
            let row = if opts.op.is_collective() {
                let avg = times.iter().sum::<f64>() / times.len() as f64;
                let algbw = if avg > 0.0 {
                    label as f64 * n as f64 / avg / 1e9
                } else {
                    0.0
                };
                BenchRow {
                    op: opts.op,
                    algorithm: alg,
                    size: label,
                    avg_us: avg * 1e6,
                    min_us: times.iter().copied().fold(f64::INFINITY, f64::min) * 1e6,
                    max_us: times.iter().copied().fold(0.0, f64::max) * 1e6,
                    iterations,
                    alg_bw_gbs: algbw,
                    bus_bw_gbs: bus_bandwidth(label, n, avg),
                    wrong,
                }
            } else {
                let t = times[0];
                let bw = if t > 0.0 { size as f64 / t / 1e9 } else { 0.0 };
                BenchRow {
                    op: opts.op,
                    algorithm: alg,
                    size,
                    avg_us: t * 1e6,
                    min_us: t * 1e6,
                    max_us: t * 1e6,
                    iterations,
                    alg_bw_gbs: bw,
                    bus_bw_gbs: bw,
                    wrong,
                }
            };
            rows.push(row);
            k += 1;
        }
    }
    Ok(Some(rows))
}

/// Runs the benchmark with the ranks as threads of this process on `topology` (one
/// thread per rank, the in-process transport with `emulation`): the embedded default,
/// no cluster needed. MPI is not available in this mode.
///
/// # Errors
/// As [`run_ranks`]; the first rank's error if any rank fails.
pub fn run_local_bench(
    opts: &BenchOptions,
    topology: &Topology,
    emulation: Emulation,
) -> Result<Vec<BenchRow>> {
    let results = local::run(topology, emulation, |comm| run_ranks(comm, None, opts));
    let mut rows = None;
    for r in results {
        if let Some(r) = r? {
            rows = Some(r);
        }
    }
    rows.ok_or_else(|| Error::internal("rank 0 returned no rows"))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for op in Op::ALL {
            assert_eq!(op.name().parse::<Op>().unwrap(), op);
        }
        assert!("allreduce".parse::<Op>().is_err());
        for a in ["flat", "halo", "auto", "mpi", "bruck", "halo-blocking"] {
            assert_eq!(a.parse::<BenchAlgo>().unwrap().name(), a);
        }
        let e = "fast".parse::<BenchAlgo>().unwrap_err().to_string();
        assert!(e.contains("fast") && e.contains("mpi"), "{e}");
    }

    #[test]
    fn resolve_refuses_mpi_without_an_engine() {
        let t = Topology::preset("nodes:2x2").unwrap();
        let o = BenchOptions {
            algorithms: vec![BenchAlgo::Mpi],
            ..BenchOptions::default()
        };
        let e = o.resolve(&t, false).unwrap_err().to_string();
        assert!(e.contains("halo launch --mpi"), "{e}");
        assert_eq!(o.resolve(&t, true).unwrap(), vec![BenchAlgo::Mpi]);
        let all = BenchOptions::default().resolve(&t, true).unwrap();
        assert_eq!(all.last(), Some(&BenchAlgo::Mpi));
        assert!(!all.contains(&BenchAlgo::Memcpy));
        assert!(all.contains(&BenchAlgo::Halo(None)));
        let p2p = BenchOptions {
            op: Op::Latency,
            ..BenchOptions::default()
        };
        assert_eq!(
            p2p.resolve(&t, true).unwrap(),
            vec![BenchAlgo::Halo(None), BenchAlgo::Mpi]
        );
    }
}
