//! Timing one rank's side of a sweep: the traffic of every size, the collective and
//! point-to-point measurements, and the byte patterns that validate them (`-c`).

use super::implementation::{Blocking, Implementation, MemcpyReference};
use super::{BenchAlgo, BenchOptions, Op, SETTLE_MAX_CALLS};
use halo::{Communicator, Error, Partition, Result};
use std::time::{Duration, Instant};

/// The byte at offset `i` of the block `src` sends `dst` in iteration `iter`.
fn pattern(src: usize, dst: usize, i: usize, iter: usize) -> u8 {
    (src.wrapping_mul(31) ^ dst.wrapping_mul(7) ^ i ^ iter.wrapping_mul(13)) as u8
}

fn fill_blocks(buf: &mut [u8], me: usize, counts: &[usize], displs: &[usize], iter: usize) {
    for (dst, (&c, &d)) in counts.iter().zip(displs).enumerate() {
        for (i, b) in buf[d..d + c].iter_mut().enumerate() {
            *b = pattern(me, dst, i, iter);
        }
    }
}

/// Wrong bytes in what this rank received from each source.
fn check_blocks(buf: &[u8], me: usize, counts: &[usize], displs: &[usize], iter: usize) -> u64 {
    let mut wrong = 0;
    for (src, (&c, &d)) in counts.iter().zip(displs).enumerate() {
        for (i, &b) in buf[d..d + c].iter().enumerate() {
            if b != pattern(src, me, i, iter) {
                wrong += 1;
            }
        }
    }
    wrong
}

fn prefix_sums(counts: &[usize]) -> Result<Vec<usize>> {
    let mut at = 0usize;
    counts
        .iter()
        .map(|&c| {
            let d = at;
            at = at
                .checked_add(c)
                .ok_or_else(|| Error::invalid_argument("buffer sizes overflow"))?;
            Ok(d)
        })
        .collect()
}

/// One rank's result for one (implementation, size).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Sample {
    /// Mean seconds per timed iteration (the meaning depends on the benchmark).
    pub(super) seconds: f64,
    pub(super) wrong: u64,
}

/// The benchmark's own barrier (outside the timer, or closing it with `--sync`):
/// `harness` when there is one (MPI_Barrier for every implementation of a run), else the
/// measured implementation's own.
fn barrier(
    e: &mut dyn Implementation,
    harness: &mut Option<&mut dyn Implementation>,
) -> Result<()> {
    match harness {
        Some(h) => h.barrier(),
        None => e.barrier(),
    }
}

/// Times one all-to-all(-v) size on this rank: `counts[src][dst]` bytes.
#[allow(clippy::too_many_arguments)]
fn measure_collective(
    e: &mut dyn Implementation,
    mut harness: Option<&mut dyn Implementation>,
    counts: &[Vec<usize>],
    iterations: usize,
    warmup: usize,
    validate: bool,
    uniform: bool,
    sync: bool,
    settle: bool,
) -> Result<Sample> {
    let (me, n) = (e.rank(), e.size());
    let send_counts = counts[me].clone();
    let recv_counts: Vec<usize> = counts.iter().map(|row| row[me]).collect();
    let send_displs = prefix_sums(&send_counts)?;
    let recv_displs = prefix_sums(&recv_counts)?;
    let mut send = vec![0u8; send_counts.iter().sum()];
    let mut recv = vec![0u8; recv_counts.iter().sum()];
    fill_blocks(&mut send, me, &send_counts, &send_displs, 0);
    let mut timed = Duration::ZERO;
    let mut wrong = 0;
    debug_assert_eq!(counts.len(), n);
    // The automatic mode's trials run untimed, before the warm-up: while the
    // implementation says its next call is a trial, a call does not count as one of
    // the `warmup + iterations`. Every rank decides on the same call, so every rank
    // makes as many calls.
    let block = send_counts.first().copied().unwrap_or(0);
    let mut trials = 0;
    let mut i = 0;
    while i < warmup + iterations {
        let trial = settle && uniform && trials < SETTLE_MAX_CALLS && e.tuning(block);
        if validate {
            fill_blocks(&mut send, me, &send_counts, &send_displs, i);
            recv.fill(0xa5);
        }
        barrier(e, &mut harness)?;
        let t = Instant::now();
        if uniform {
            e.all_to_all(&send, &mut recv)?;
        } else {
            e.all_to_all_v(
                &send,
                &Partition::new(&send_counts, &send_displs),
                &mut recv,
                &Partition::new(&recv_counts, &recv_displs),
            )?;
        }
        if sync {
            barrier(e, &mut harness)?;
        }
        if !trial && i >= warmup {
            timed += t.elapsed();
        }
        if validate {
            wrong += check_blocks(&recv, me, &recv_counts, &recv_displs, i);
        }
        if trial {
            trials += 1;
        } else {
            i += 1;
        }
    }
    if trials > 0 {
        tracing::debug!(
            rank = me,
            block,
            calls = trials,
            "auto's trials run untimed"
        );
    }
    Ok(Sample {
        seconds: mean(timed, iterations),
        wrong,
    })
}

fn mean(total: Duration, iterations: usize) -> f64 {
    if iterations == 0 {
        0.0
    } else {
        total.as_secs_f64() / iterations as f64
    }
}

/// Times ping-pong (`latency`) or a window of sends (`bw`) between rank 0 and the last
/// rank. Returns rank 0's mean seconds per message (one way).
#[allow(clippy::too_many_arguments)]
fn measure_p2p(
    e: &mut dyn Implementation,
    mut harness: Option<&mut dyn Implementation>,
    op: Op,
    size: usize,
    iterations: usize,
    warmup: usize,
    validate: bool,
    window: usize,
) -> Result<Sample> {
    let (me, n) = (e.rank(), e.size());
    let peer = n - 1;
    let mut buf = vec![0u8; size];
    // `bw`'s receiver: one block per message of the window.
    let mut window_buf = match (op, me) {
        (Op::Bandwidth, r) if r == peer && r != 0 => vec![0u8; size * window],
        _ => Vec::new(),
    };
    let mut ack = [0u8; 4];
    let mut wrong = 0;
    let mut start = Instant::now();
    let fill = |buf: &mut [u8], src: usize, iter: usize| {
        for (i, b) in buf.iter_mut().enumerate() {
            *b = pattern(src, 0, i, iter);
        }
    };
    let check = |buf: &[u8], src: usize, iter: usize| -> u64 {
        buf.iter()
            .enumerate()
            .filter(|&(i, &b)| b != pattern(src, 0, i, iter))
            .count() as u64
    };
    barrier(e, &mut harness)?;
    for i in 0..warmup + iterations {
        if i == warmup {
            start = Instant::now();
        }
        match (op, me) {
            (Op::Latency, 0) => {
                if validate {
                    fill(&mut buf, 0, i);
                }
                e.send(&buf, peer)?;
                e.recv(&mut buf, peer)?;
                if validate {
                    wrong += check(&buf, peer, i);
                }
            }
            (Op::Latency, r) if r == peer => {
                e.recv(&mut buf, 0)?;
                if validate {
                    wrong += check(&buf, 0, i);
                    fill(&mut buf, peer, i);
                }
                e.send(&buf, 0)?;
            }
            (_, 0) => {
                if validate {
                    fill(&mut buf, 0, i);
                }
                e.send_window(&buf, peer, window)?;
                e.recv(&mut ack, peer)?;
            }
            (_, r) if r == peer => {
                if validate {
                    window_buf.fill(0xa5);
                }
                e.recv_window(&mut window_buf, size, 0, window)?;
                if validate && size > 0 {
                    for block in window_buf.chunks(size) {
                        wrong += check(block, 0, i);
                    }
                }
                e.send(&ack, 0)?;
            }
            _ => {}
        }
    }
    let total = start.elapsed();
    barrier(e, &mut harness)?;
    let per_message = match op {
        Op::Latency => 2 * iterations,
        _ => window * iterations,
    };
    Ok(Sample {
        seconds: mean(total, per_message),
        wrong,
    })
}

/// One size of a sweep: the size asked for, the row's label (bytes per destination; the
/// mean for `alltoallv`) and, for the all-to-alls, the bytes per (source, destination).
#[derive(Debug)]
pub(super) struct Point {
    pub(super) size: usize,
    pub(super) label: usize,
    counts: Vec<Vec<usize>>,
}

/// The sweep's sizes with their traffic, computed once for every implementation.
///
/// # Errors
/// [`Error::InvalidArgument`] when a size overflows a buffer.
pub(super) fn sweep(opts: &BenchOptions, n: usize) -> Result<Vec<Point>> {
    opts.sizes()
        .into_iter()
        .map(|size| {
            let bytes = match (opts.op, opts.moe.hidden) {
                (Op::AllToAllV, Some(h)) => size
                    .checked_mul(opts.moe.topk)
                    .and_then(|t| t.checked_mul(2 * h)),
                (Op::AllToAll | Op::AllToAllV, _) => size.checked_mul(n),
                _ => Some(size),
            };
            if bytes.is_none_or(|b| b > isize::MAX as usize / 2) {
                return Err(Error::invalid_argument(format!(
                    "size {size} with {n} ranks overflows a buffer"
                )));
            }
            let (label, counts) = match opts.op {
                Op::AllToAll => (size, vec![vec![size; n]; n]),
                Op::AllToAllV => opts.moe.bytes(n, size)?,
                Op::Latency | Op::Bandwidth => (size, Vec::new()),
            };
            Ok(Point {
                size,
                label,
                counts,
            })
        })
        .collect()
}

/// The order of a rank's measurements: `(round, implementation, point)` indices.
///
/// One round (the default) measures implementation after implementation, every size of
/// one before the next. With `rounds > 1` the rounds are the outer loop, then the sizes,
/// then the implementations, in an order rotated by the round (round `r` starts with
/// implementation `r mod k`), so that every implementation of a size is measured close
/// in time to the others and first as often as the others: a drift of the machine's load
/// over the run then falls on all of them alike.
pub(super) fn schedule(rounds: usize, k: usize, points: usize) -> Vec<(usize, usize, usize)> {
    let mut out = Vec::with_capacity(rounds * k * points);
    if rounds <= 1 {
        for a in 0..k {
            for p in 0..points {
                out.push((0, a, p));
            }
        }
        return out;
    }
    for r in 0..rounds {
        for p in 0..points {
            for j in 0..k {
                out.push((r, (r + j) % k, p));
            }
        }
    }
    out
}

/// The median of `values` (the mean of the two middle ones for an even count; 0 when
/// empty). NaN never occurs here (times are finite), and sorts last if it did.
pub(super) fn median(values: &mut [f64]) -> f64 {
    values.sort_unstable_by(f64::total_cmp);
    let n = values.len();
    match n {
        0 => 0.0,
        _ if n % 2 == 1 => values[n / 2],
        _ => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

/// One (implementation, point)'s figure from its rounds: the median of the per-round
/// means, and the wrong bytes of every round.
pub(super) fn aggregate(rounds: &[Sample]) -> Sample {
    let mut seconds: Vec<f64> = rounds.iter().map(|s| s.seconds).collect();
    Sample {
        seconds: median(&mut seconds),
        wrong: rounds.iter().map(|s| s.wrong).sum(),
    }
}

/// The MPI engine as the harness's barrier, when `shared`.
fn harness_of<'a>(
    mpi: &'a mut Option<&mut dyn Implementation>,
    shared: bool,
) -> Option<&'a mut dyn Implementation> {
    match mpi {
        Some(m) if shared => Some(&mut **m),
        _ => None,
    }
}

/// Measures one implementation at one point: switches `comm` to the algorithm (or wraps
/// it, or takes the MPI engine) for this call only.
fn measure_point(
    comm: &mut Communicator,
    mpi: &mut Option<&mut dyn Implementation>,
    opts: &BenchOptions,
    alg: BenchAlgo,
    point: &Point,
) -> Result<Sample> {
    let mut memcpy;
    let mut blocking;
    // The harness barrier: MPI's for every implementation when the ranks are MPI
    // processes (unless `own_barrier`), so that only the timed calls differ.
    let shared = !opts.own_barrier;
    let (engine, harness): (&mut dyn Implementation, Option<&mut dyn Implementation>) = match alg {
        BenchAlgo::HaloBlocking => {
            comm.set_algorithm(None);
            blocking = Blocking(comm);
            (&mut blocking, harness_of(mpi, shared))
        }
        BenchAlgo::Memcpy => {
            memcpy = MemcpyReference(comm);
            (&mut memcpy, harness_of(mpi, shared))
        }
        BenchAlgo::Halo(a) => {
            comm.set_algorithm(a);
            (comm, harness_of(mpi, shared))
        }
        BenchAlgo::Mpi => match mpi.as_deref_mut() {
            Some(m) => (m, None),
            None => return Err(Error::invalid_argument("--algo mpi without MPI")),
        },
    };
    let size = point.size;
    let (iterations, warmup) = opts.iterations_for(size);
    match opts.op {
        Op::AllToAll | Op::AllToAllV => measure_collective(
            engine,
            harness,
            &point.counts,
            iterations,
            warmup,
            // The copy is not an all-to-all: nothing to validate.
            opts.validate && alg != BenchAlgo::Memcpy,
            opts.op == Op::AllToAll,
            opts.sync,
            !opts.time_trials,
        ),
        Op::Latency | Op::Bandwidth => measure_p2p(
            engine,
            harness,
            opts.op,
            size,
            iterations,
            warmup,
            opts.validate,
            opts.window,
        ),
    }
}

/// What one rank measures: one [`Sample`] per (implementation, point), in order, each
/// the [`aggregate`] of its `opts.rounds` rounds (measured in the order of
/// [`schedule`]).
pub(super) fn measure_rank(
    comm: &mut Communicator,
    mut mpi: Option<&mut dyn Implementation>,
    opts: &BenchOptions,
    algorithms: &[BenchAlgo],
    points: &[Point],
) -> Result<Vec<Sample>> {
    let rounds = opts.rounds.max(1);
    let (k, m) = (algorithms.len(), points.len());
    let order = schedule(rounds, k, m);
    // per_round[(a * m + p) * rounds + r]
    let mut per_round = vec![
        Sample {
            seconds: 0.0,
            wrong: 0
        };
        k * m * rounds
    ];
    let bar = crate::progress::bar(
        order.len(),
        &format!("{} on {} ranks", opts.op, comm.size()),
        opts.progress && comm.rank() == 0,
    );
    for (r, a, p) in order {
        let alg = algorithms[a];
        let sample = measure_point(comm, &mut mpi, opts, alg, &points[p])?;
        tracing::debug!(algorithm = %alg, size = points[p].size, round = r, seconds = sample.seconds, "measured");
        per_round[(a * m + p) * rounds + r] = sample;
        bar.inc(1);
    }
    bar.finish_and_clear();
    Ok(per_round.chunks(rounds).map(aggregate).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_counts_wrong_bytes() {
        let counts = [3usize, 0, 2];
        let displs = prefix_sums(&counts).unwrap();
        let mut buf = vec![0u8; 5];
        // What rank 1 receives: from 0 three bytes, from 2 two bytes.
        for (src, (&c, &d)) in counts.iter().zip(&displs).enumerate() {
            for i in 0..c {
                buf[d + i] = pattern(src, 1, i, 4);
            }
        }
        assert_eq!(check_blocks(&buf, 1, &counts, &displs, 4), 0);
        assert_eq!(check_blocks(&buf, 1, &counts, &displs, 5), 5);
        buf[4] ^= 1;
        assert_eq!(check_blocks(&buf, 1, &counts, &displs, 4), 1);
    }

    #[test]
    fn median_of_per_round_means_and_wrong_bytes_summed() {
        let s = |seconds, wrong| Sample { seconds, wrong };
        // Odd count: the middle one, whatever the order (an outlier round is dropped).
        assert_eq!(aggregate(&[s(5.0, 0), s(1.0, 2), s(3.0, 1)]), s(3.0, 3));
        assert_eq!(aggregate(&[s(2.0, 0), s(100.0, 0), s(2.5, 0)]).seconds, 2.5);
        // Even count: the mean of the two middle ones.
        assert_eq!(
            aggregate(&[s(4.0, 0), s(1.0, 0), s(2.0, 0), s(9.0, 7)]),
            s(3.0, 7)
        );
        // One round: that round's figure, unchanged.
        assert_eq!(aggregate(&[s(0.125, 4)]), s(0.125, 4));
        assert_eq!(median(&mut []), 0.0);
    }

    #[test]
    fn one_round_is_implementation_after_implementation() {
        assert_eq!(
            schedule(1, 2, 3),
            [
                (0, 0, 0),
                (0, 0, 1),
                (0, 0, 2),
                (0, 1, 0),
                (0, 1, 1),
                (0, 1, 2)
            ]
        );
    }

    #[test]
    fn rounds_interleave_implementations_rotated_per_round() {
        let s = schedule(3, 3, 2);
        assert_eq!(s.len(), 3 * 3 * 2);
        // Round 0: size 0 with implementations 0 1 2, then size 1; round 1 starts with 1.
        assert_eq!(
            &s[..9],
            [
                (0, 0, 0),
                (0, 1, 0),
                (0, 2, 0),
                (0, 0, 1),
                (0, 1, 1),
                (0, 2, 1),
                (1, 1, 0),
                (1, 2, 0),
                (1, 0, 0),
            ]
        );
        assert_eq!(&s[12..15], [(2, 2, 0), (2, 0, 0), (2, 1, 0)]);
        // Every (round, implementation, size) exactly once.
        let mut sorted = s.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), s.len());
        // With more rounds than implementations the rotation wraps.
        assert_eq!(
            schedule(4, 2, 1),
            [
                (0, 0, 0),
                (0, 1, 0),
                (1, 1, 0),
                (1, 0, 0),
                (2, 0, 0),
                (2, 1, 0),
                (3, 1, 0),
                (3, 0, 0)
            ]
        );
    }
}
