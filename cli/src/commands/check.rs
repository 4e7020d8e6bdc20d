//! `halo check`: one rank of a job verifies every algorithm byte-exact.

use super::Failure;
use crate::check::{CheckOptions, DieAt, run_check};
use clap::Args;
use halo::Communicator;
use halo::collectives::Algorithm;

/// Verifies all-to-all and all-to-all-v (counts with zeros, gapped layouts) with
/// every algorithm, byte-exact, as one rank of a job started by `halo launch`,
/// mpirun, srun or torchrun (ranks find each other through the environment).
#[derive(Debug, Args)]
#[command(after_help = "Example:\n  halo launch -n 4 -- halo check\n  \
    HALO_FABRIC_PROVIDER='tcp;ofi_rxm' halo launch -n 4 -- halo check --algo halo,flat")]
pub(crate) struct CheckArgs {
    /// Algorithms, comma separated: auto, flat, pairwise, bruck, halo, halo2d, or all.
    #[arg(long, default_value = "all", value_delimiter = ',')]
    algo: Vec<String>,
    /// Elements (u32) per peer for the uniform all-to-all, comma separated.
    #[arg(long, default_value = "0,1,7,1024", value_delimiter = ',')]
    counts: Vec<usize>,
    /// Largest -v count per pair.
    #[arg(long, default_value_t = 300)]
    v_max: usize,
    /// -v rounds per algorithm.
    #[arg(long, default_value_t = 3)]
    v_rounds: usize,
    /// Repeat the whole check N times, with new data each time (for timing: the
    /// output gives the time per collective).
    #[arg(long = "loop", value_name = "N", default_value_t = 1)]
    loops: usize,
    /// Fault injection (tests): this rank kills itself with SIGKILL ...
    #[arg(long, value_name = "R", requires = "die_after")]
    die_rank: Option<usize>,
    /// ... while its collective number K (from 0) runs.
    #[arg(long, value_name = "K", requires = "die_rank")]
    die_after: Option<usize>,
}

fn algorithms(list: &[String]) -> Result<Vec<Option<Algorithm>>, Failure> {
    let mut out = Vec::new();
    for a in list {
        match a.as_str() {
            "all" => {
                out.push(None);
                out.extend(Algorithm::ALL.iter().copied().map(Some));
            }
            "auto" => out.push(None),
            other => out.push(Some(other.parse().map_err(Failure::input)?)),
        }
    }
    Ok(out)
}

fn max_count(counts: &[usize]) -> usize {
    counts.iter().copied().max().unwrap_or(0)
}

pub(crate) fn run(args: &CheckArgs) -> Result<(), Failure> {
    let opts = CheckOptions {
        algorithms: algorithms(&args.algo)?,
        counts: args.counts.clone(),
        v_max: args.v_max,
        v_rounds: args.v_rounds,
        loops: args.loops,
        die: args
            .die_rank
            .zip(args.die_after)
            .map(|(rank, after)| DieAt { rank, after }),
    };
    // Refused before joining the job (as if alone), and again with the job's size.
    let memory = |n: usize| {
        crate::limits::check_memory(
            &format!(
                "--counts {} / --v-max {} on {n} ranks",
                max_count(&opts.counts),
                opts.v_max
            ),
            opts.bytes_per_rank(n),
        )
        .map_err(Failure::input)
    };
    memory(1)?;
    let mut comm = Communicator::init_from_env().map_err(|e| match e {
        halo::Error::InvalidArgument { .. } => Failure::input(format!("init: {e}")),
        e => Failure::other(format!("init: {e}")),
    })?;
    memory(comm.size())?;
    let report = run_check(&mut comm, &opts)
        .map_err(|e| Failure::other(format!("rank {}: {e}", comm.rank())))?;
    let peers: Vec<String> = (0..comm.size())
        .filter(|&p| p != comm.rank())
        .map(|p| format!("{p}:{}", comm.provider_to(p).unwrap_or("-")))
        .collect();
    let timing = match report.warm {
        Some((t, c)) => format!(
            "; after the first loop {:.1} us per collective",
            t.as_secs_f64() * 1e6 / c.max(1) as f64
        ),
        None => String::new(),
    };
    super::emit(&format!(
        "rank {}/{}: {} collectives verified, {} bytes received (peers {}) in {:.3} s{timing}\n",
        comm.rank(),
        comm.size(),
        report.collectives,
        report.bytes,
        peers.join(" "),
        report.elapsed.as_secs_f64(),
    ))
}
