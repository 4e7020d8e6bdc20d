//! The device path's CPU twin: every algorithm's schedules grouped into NCCL-style
//! waves (both ends of a message in one wave, proven sound before running) and run
//! wave by wave over the in-process transport — the program a GPU runs, with host
//! messages in place of `ncclSend` / `ncclRecv` and host copies in place of async
//! device copies. Receive buffers must be byte-exact for the uniform all-to-all and
//! for every -v pattern: random with zeros, zero rows, zero columns, self only, all
//! zero, uneven topologies, scattered (non-packed) displacements.

mod local_common;

use halo::local::{self, Emulation};
use halo::topology::Topology;
use halo::{Algorithm, Communicator, Error, Partition};
use local_common::{Rng, buildable};
use std::time::Duration;

fn val(src: usize, dst: usize, i: usize) -> u32 {
    ((src as u32) << 20) | ((dst as u32) << 10) | (i as u32 & 0x3FF)
}

fn run_all<R: Send>(
    topo: &Topology,
    alg: Algorithm,
    f: impl Fn(&mut Communicator) -> halo::Result<R> + Sync,
) -> Vec<R> {
    let out = local::run(topo, Emulation::off(), |comm| {
        comm.set_timeout(Duration::from_secs(30));
        comm.set_algorithm(Some(alg));
        f(comm)
    });
    let errors: Vec<String> = out
        .iter()
        .enumerate()
        .filter_map(|(r, x)| x.as_ref().err().map(|e| format!("rank {r}: {e}")))
        .collect();
    assert!(
        errors.is_empty(),
        "{alg} on {}:\n{}",
        topo.name(),
        errors.join("\n")
    );
    out.into_iter().map(|x| x.expect("checked")).collect()
}

const TOPOLOGIES: [&str; 6] = [
    "flat:1",
    "flat:5",
    "nodes:2x2",
    "nodes:3x3,ranks=7",
    "frontier:1",
    "frontier:2,ranks=13",
];

#[test]
fn uniform_waves_are_byte_exact_for_every_algorithm() {
    for spec in TOPOLOGIES {
        let topo = Topology::preset(spec).unwrap();
        let n = topo.size();
        for alg in buildable(&topo) {
            for count in [1usize, 3, 40] {
                let got = run_all(&topo, alg, |comm| {
                    let me = comm.rank();
                    let send: Vec<u32> = (0..n * count)
                        .map(|k| val(me, k / count, k % count))
                        .collect();
                    let mut recv = vec![u32::MAX; n * count];
                    comm.all_to_all_waves(&send, &mut recv)?;
                    let mut again = vec![u32::MAX; n * count];
                    comm.all_to_all_waves(&send, &mut again)?;
                    assert_eq!(recv, again, "a second call (cached plan) differs");
                    Ok(recv)
                });
                for (me, recv) in got.iter().enumerate() {
                    let want: Vec<u32> = (0..n * count)
                        .map(|k| val(k / count, me, k % count))
                        .collect();
                    assert_eq!(recv, &want, "{alg} on {spec}, {count} per pair, rank {me}");
                }
            }
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Pattern {
    Random,
    ZeroRows,
    ZeroColumns,
    SelfOnly,
    AllZero,
}

fn counts(n: usize, p: Pattern, seed: u64) -> Vec<Vec<usize>> {
    let mut rng = Rng::new(seed);
    (0..n)
        .map(|s| {
            (0..n)
                .map(|d| match p {
                    Pattern::Random => {
                        if rng.chance(0.3) {
                            0
                        } else {
                            1 + rng.below(17)
                        }
                    }
                    Pattern::ZeroRows => {
                        if s % 3 == 0 {
                            0
                        } else {
                            rng.below(9)
                        }
                    }
                    Pattern::ZeroColumns => {
                        if d % 2 == 1 {
                            0
                        } else {
                            rng.below(9)
                        }
                    }
                    Pattern::SelfOnly => usize::from(s == d) * (1 + rng.below(5)),
                    Pattern::AllZero => 0,
                })
                .collect()
        })
        .collect()
}

/// Displacements: packed, or in reverse rank order with gaps (`scattered`).
fn displs(c: &[usize], scattered: bool) -> (Vec<usize>, usize) {
    let n = c.len();
    let mut d = vec![0; n];
    let mut o = if scattered { 3 } else { 0 };
    let order: Vec<usize> = if scattered {
        (0..n).rev().collect()
    } else {
        (0..n).collect()
    };
    for q in order {
        d[q] = o;
        o += c[q] + usize::from(scattered) * 2;
    }
    (d, o)
}

#[test]
fn v_waves_are_byte_exact_for_every_algorithm_and_pattern() {
    let patterns = [
        Pattern::Random,
        Pattern::ZeroRows,
        Pattern::ZeroColumns,
        Pattern::SelfOnly,
        Pattern::AllZero,
    ];
    for (t, spec) in TOPOLOGIES.iter().enumerate() {
        let topo = Topology::preset(spec).unwrap();
        let n = topo.size();
        for alg in buildable(&topo) {
            for (p, &pattern) in patterns.iter().enumerate() {
                let scattered = (t + p) % 2 == 1;
                let m = counts(n, pattern, (t * 10 + p) as u64 + 1);
                let got = run_all(&topo, alg, |comm| {
                    let me = comm.rank();
                    let sc = m[me].clone();
                    let rc: Vec<usize> = (0..n).map(|s| m[s][me]).collect();
                    let (sd, slen) = displs(&sc, scattered);
                    let (rd, rlen) = displs(&rc, scattered);
                    let mut send = vec![0xDEAD_BEEFu32; slen];
                    for q in 0..n {
                        for i in 0..sc[q] {
                            send[sd[q] + i] = val(me, q, i);
                        }
                    }
                    let mut recv = vec![u32::MAX; rlen];
                    comm.all_to_all_v_waves(
                        &send,
                        &Partition::new(&sc, &sd),
                        &mut recv,
                        &Partition::new(&rc, &rd),
                    )?;
                    Ok((recv, rc, rd))
                });
                for (me, (recv, rc, rd)) in got.iter().enumerate() {
                    let mut want = vec![u32::MAX; recv.len()];
                    for s in 0..n {
                        for i in 0..rc[s] {
                            want[rd[s] + i] = val(s, me, i);
                        }
                    }
                    assert_eq!(
                        recv, &want,
                        "{alg} on {spec}, {pattern:?} (scattered {scattered}), rank {me}"
                    );
                }
            }
        }
    }
}

/// Counts that disagree between two ranks fail on every rank, before any data moves:
/// the pair names each other, the others name the pair.
#[test]
fn disagreeing_counts_fail_on_every_rank() {
    let topo = Topology::preset("flat:4").unwrap();
    let n = topo.size();
    let out = local::run(&topo, Emulation::off(), |comm| {
        comm.set_timeout(Duration::from_secs(10));
        let me = comm.rank();
        let sc = vec![2usize; n];
        let mut rc = vec![2usize; n];
        if me == 1 {
            rc[3] = 5; // rank 1 expects 5 from rank 3, which sends 2
        }
        let send = vec![7u8; 2 * n];
        let mut recv = vec![0u8; rc.iter().sum()];
        comm.all_to_all_v_waves(
            &send,
            &Partition::packed(&sc),
            &mut recv,
            &Partition::packed(&rc),
        )
    });
    for (r, o) in out.iter().enumerate() {
        match o {
            Err(Error::InvalidUsage { peer, message }) => {
                assert!(
                    message.contains("rank 3 sends 2 bytes to rank 1, but rank 1 expects 5"),
                    "{message}"
                );
                let want = if r == 3 { 1 } else { 3 };
                assert_eq!(*peer, Some(want), "rank {r}: {message}");
            }
            other => panic!("rank {r}: expected InvalidUsage, got {other:?}"),
        }
    }
}
