//! Correctness check over a real communicator, as nccl-tests' `-c`: every algorithm,
//! all-to-all and all-to-all-v with counts that include zeros, byte-exact against a
//! reference every rank computes on its own.
//!
//! The data of block (src -> dst) is a pure function of (round, src, dst, index), and
//! the -v counts of every pair a pure function of (round, src, dst), so each rank can
//! check what it received without any other communication.

use halo::{Communicator, Partition};
use halo::{Error, Result};
use halo_collectives::Algorithm;
use std::time::{Duration, Instant};

/// What to check.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckOptions {
    /// Algorithms to run (`None` in the list means automatic selection).
    pub algorithms: Vec<Option<Algorithm>>,
    /// Elements (u32) per peer for the uniform all-to-all.
    pub counts: Vec<usize>,
    /// Largest count per pair in the -v rounds (counts are 0..=max, about a third zero).
    pub v_max: usize,
    /// Rounds of -v per algorithm, each with new counts.
    pub v_rounds: usize,
    /// Times the whole check is repeated, each time with new data (at least 1).
    pub loops: usize,
    /// Fault injection: one rank kills itself while a collective runs.
    pub die: Option<DieAt>,
}

/// Fault injection for tests: rank `rank` raises `SIGKILL` on itself while its
/// collective number `after` (counting from 0 over the whole check) runs.
///
/// The signal comes from a helper thread started just before that collective, after
/// a delay of 0-500 us that depends on `after`, so that it lands at different points
/// of the collective (while posting, while waiting) from trial to trial.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DieAt {
    /// The rank that dies.
    pub rank: usize,
    /// The collective during which it dies.
    pub after: usize,
}

impl Default for CheckOptions {
    fn default() -> Self {
        let mut algorithms: Vec<Option<Algorithm>> = vec![None];
        algorithms.extend(Algorithm::ALL.iter().copied().map(Some));
        CheckOptions {
            algorithms,
            counts: vec![0, 1, 7, 1024],
            v_max: 300,
            v_rounds: 3,
            loops: 1,
            die: None,
        }
    }
}

/// What a check did on this rank.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CheckReport {
    /// Collectives run and verified.
    pub collectives: usize,
    /// Bytes received and verified.
    pub bytes: u64,
    /// Time the whole check took on this rank (collectives and verification).
    pub elapsed: Duration,
    /// With more than one loop: the time and the collectives of the loops after the
    /// first (connections made, schedules built and cached), for timing.
    pub warm: Option<(Duration, usize)>,
}

impl CheckOptions {
    /// A lower bound of the bytes one rank of `n` allocates for one collective (the
    /// largest of --counts and of --v-max: send and receive buffers of u32 and the
    /// -v check's map); `None` if it cannot be counted.
    pub fn bytes_per_rank(&self, n: usize) -> Option<u128> {
        let n = n as u128;
        let count = self.counts.iter().copied().max().unwrap_or(0) as u128;
        let uniform = count.checked_mul(n)?.checked_mul(8)?;
        let v = if self.v_rounds == 0 {
            0
        } else {
            (self.v_max as u128 + 4).checked_mul(n)?.checked_mul(9)?
        };
        Some(uniform.max(v))
    }
}

/// Set once [`die_soon`] has started its thread: this process is to die.
static DOOMED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Starts the helper thread of [`DieAt`]: it raises `SIGKILL` on this process.
fn die_soon(after: usize) {
    let delay = Duration::from_micros(mix(after as u64 ^ 0xd1e) % 500);
    DOOMED.store(true, std::sync::atomic::Ordering::SeqCst);
    std::thread::spawn(move || {
        std::thread::sleep(delay);
        // SIGKILL cannot be caught: the process ends here, mid-collective, without
        // closing anything — as when a node or the OOM killer takes a rank.
        let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
    });
}

fn mix(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

/// The value of element `i` of block `src -> dst` in round `round`.
pub fn element(round: u64, src: usize, dst: usize, i: usize) -> u32 {
    mix(round ^ ((src as u64) << 40) ^ ((dst as u64) << 20) ^ (i as u64).wrapping_mul(0x9e37_79b9))
        as u32
}

/// Elements `src` sends to `dst` in -v round `round`: 0..=max, about a third zero,
/// and whole zero rows for some ranks.
pub fn v_count(round: u64, src: usize, dst: usize, max: usize) -> usize {
    let h = mix(round.wrapping_mul(0x5851_f42d) ^ ((src as u64) << 32) ^ dst as u64);
    if h.is_multiple_of(3) || (src as u64 + round).is_multiple_of(5) {
        0
    } else {
        ((h >> 8) % (max as u64).saturating_add(1)) as usize
    }
}

fn mismatch(comm: &Communicator, what: &str, src: usize, i: usize, got: u32, want: u32) -> Error {
    Error::InternalError {
        message: format!(
            "check failed on rank {} ({what}): element {i} from rank {src} is {got:#x}, expected {want:#x}",
            comm.rank()
        ),
    }
}

/// Payload bytes that rank `src` sends to rank `dst` over a whole check of `n` ranks
/// with `opts` (every uniform and -v collective; no metadata, headers or forwarding).
/// A lower bound for what must cross between them, e.g. between emulated hosts.
pub fn pair_bytes(opts: &CheckOptions, src: usize, dst: usize) -> u64 {
    let mut round = 0u64;
    let mut bytes = 0u64;
    for _ in 0..opts.loops.max(1) {
        for _ in &opts.algorithms {
            for &count in &opts.counts {
                round += 1;
                bytes += (count * 4) as u64;
            }
            for _ in 0..opts.v_rounds {
                round += 1;
                bytes += (v_count(round, src, dst, opts.v_max) * 4) as u64;
            }
        }
    }
    bytes
}

/// Runs the check on this rank; every rank of the communicator must call it with the
/// same options. Returns the first wrong element as an error.
pub fn run_check(comm: &mut Communicator, opts: &CheckOptions) -> Result<CheckReport> {
    let (me, n) = (comm.rank(), comm.size());
    let mut report = CheckReport::default();
    let mut round = 0u64;
    let saved = comm.algorithm();
    let start = Instant::now();
    let mut started = 0usize;
    // Counts collectives as they start; fires the fault injection at its collective.
    let mut next = || {
        if let Some(d) = opts.die
            && d.rank == me
            && d.after == started
        {
            die_soon(d.after);
        }
        started += 1;
    };
    let mut warm: Option<(Instant, usize)> = None;
    for lp in 0..opts.loops.max(1) {
        if lp == 1 {
            warm = Some((Instant::now(), report.collectives));
        }
        for &algo in &opts.algorithms {
            comm.set_algorithm(algo);
            let name = algo.map_or("auto".to_string(), |a| a.to_string());
            for &count in &opts.counts {
                round += 1;
                next();
                let send: Vec<u32> = (0..n)
                    .flat_map(|dst| (0..count).map(move |i| element(round, me, dst, i)))
                    .collect();
                let mut recv = vec![0xdead_beef_u32; n * count];
                comm.all_to_all(&send, &mut recv)?;
                for src in 0..n {
                    for i in 0..count {
                        let (got, want) = (recv[src * count + i], element(round, src, me, i));
                        if got != want {
                            return Err(mismatch(
                                comm,
                                &format!("{name} all_to_all, {count} per peer"),
                                src,
                                i,
                                got,
                                want,
                            ));
                        }
                    }
                }
                report.collectives += 1;
                report.bytes += (recv.len() * 4) as u64;
            }
            for _ in 0..opts.v_rounds {
                round += 1;
                next();
                let sc: Vec<usize> = (0..n).map(|d| v_count(round, me, d, opts.v_max)).collect();
                let rc: Vec<usize> = (0..n).map(|s| v_count(round, s, me, opts.v_max)).collect();
                // Displacements with a gap of 3 elements between blocks, in reverse rank
                // order on the receive side, so layouts are not the packed default.
                let mut sd = vec![0; n];
                let mut at = 0;
                for d in 0..n {
                    sd[d] = at;
                    at += sc[d] + 3;
                }
                let send_len = at;
                let mut rd = vec![0; n];
                let mut at = 1;
                for s in (0..n).rev() {
                    rd[s] = at;
                    at += rc[s] + 3;
                }
                let recv_len = at;
                let mut send = vec![0u32; send_len];
                for d in 0..n {
                    for i in 0..sc[d] {
                        send[sd[d] + i] = element(round, me, d, i);
                    }
                }
                let mut recv = vec![0xdead_beef_u32; recv_len];
                comm.all_to_all_v(
                    &send,
                    &Partition::new(&sc, &sd),
                    &mut recv,
                    &Partition::new(&rc, &rd),
                )?;
                let mut expect_untouched = vec![true; recv_len];
                for s in 0..n {
                    for i in 0..rc[s] {
                        expect_untouched[rd[s] + i] = false;
                        let (got, want) = (recv[rd[s] + i], element(round, s, me, i));
                        if got != want {
                            return Err(mismatch(
                                comm,
                                &format!("{name} all_to_all_v"),
                                s,
                                i,
                                got,
                                want,
                            ));
                        }
                    }
                }
                if let Some(at) =
                    (0..recv_len).find(|&i| expect_untouched[i] && recv[i] != 0xdead_beef)
                {
                    return Err(Error::InternalError {
                        message: format!(
                            "check failed on rank {me} ({name} all_to_all_v): element {at} of the receive buffer, \
                         outside every block, was overwritten"
                        ),
                    });
                }
                report.collectives += 1;
                report.bytes += (rc.iter().sum::<usize>() * 4) as u64;
            }
        }
    }
    comm.set_algorithm(saved);
    report.elapsed = start.elapsed();
    if let Some((t, c)) = warm {
        report.warm = Some((t.elapsed(), report.collectives - c));
    }
    // A rank doomed by the fault injection that got through every collective before its
    // killer thread ran (a busy machine can delay a thread past the whole job) waits for
    // it here, so it still dies by SIGKILL rather than reporting success.
    while DOOMED.load(std::sync::atomic::Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(report)
}
