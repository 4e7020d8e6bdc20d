//! All-to-all and all-to-all-v on the in-process transport: real threads, real bytes.
//!
//! For every rank count in {1, 2, 3, 4, 7, 8, 16} on flat, node and Frontier presets
//! (uneven ones included), every algorithm whose builder works, the receive buffers
//! must be byte-exact against a direct computation on seeded random data (all-to-all-v
//! also with blocks around the bytes its count exchange carries, `eager_v`).

mod local_common;

use halo::local::{self, Emulation};
use halo::topology::Topology;
use halo::{Algorithm, Communicator, Partition};
use local_common::{Rng, buildable};
use std::fmt::Debug;
use std::time::Duration;

trait Elem: bytemuck::Pod + PartialEq + Debug + Send + Sync {
    const SENTINEL: Self;
    fn make(src: usize, dst: usize, i: usize, salt: u64) -> Self;
}

impl Elem for u8 {
    const SENTINEL: Self = 0xEE;
    fn make(src: usize, dst: usize, i: usize, salt: u64) -> Self {
        ((src * 37 + dst * 11 + i * 3) as u64 ^ salt) as u8 & 0x7F
    }
}

impl Elem for f32 {
    const SENTINEL: Self = -1.0;
    fn make(src: usize, dst: usize, i: usize, salt: u64) -> Self {
        (src * 10_000 + dst * 100 + i) as f32 + (salt % 7) as f32 * 0.25
    }
}

impl Elem for u64 {
    const SENTINEL: Self = u64::MAX;
    fn make(src: usize, dst: usize, i: usize, salt: u64) -> Self {
        ((src as u64) << 44 | (dst as u64) << 24 | i as u64) ^ (salt << 60)
    }
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

/// Uniform all-to-all of `count` elements per pair.
fn check_uniform<E: Elem>(topo: &Topology, alg: Algorithm, count: usize, salt: u64) {
    let n = topo.size();
    let got = run_all(topo, alg, |comm| {
        let me = comm.rank();
        let send: Vec<E> = (0..n * count)
            .map(|k| E::make(me, k / count.max(1), k % count.max(1), salt))
            .collect();
        let mut recv = vec![E::SENTINEL; n * count];
        comm.all_to_all(&send, &mut recv)?;
        // A second call with the same buffers: schedules and scratch are reused.
        let mut again = vec![E::SENTINEL; n * count];
        comm.all_to_all(&send, &mut again)?;
        assert_eq!(recv, again, "second call differs");
        assert_eq!(comm.last_algorithm(), Some(alg));
        Ok(recv)
    });
    for (me, recv) in got.into_iter().enumerate() {
        let want: Vec<E> = (0..n * count)
            .map(|k| E::make(k / count.max(1), me, k % count.max(1), salt))
            .collect();
        assert_eq!(
            recv,
            want,
            "{alg} on {} ({} elements of {} bytes per pair): rank {me}",
            topo.name(),
            count,
            std::mem::size_of::<E>()
        );
    }
}

#[derive(Debug, Clone, Copy)]
enum Pattern {
    /// Random counts, about half of them zero.
    Random,
    /// Rank `r` sends nothing.
    ZeroRow(usize),
    /// Nobody sends to rank `c`.
    ZeroColumn(usize),
    /// Every rank sends only to itself.
    SelfOnly,
    /// Nothing at all.
    AllZero,
}

fn counts(n: usize, pattern: Pattern, seed: u64) -> Vec<usize> {
    let mut rng = Rng::new(seed);
    let mut m = vec![0usize; n * n];
    for s in 0..n {
        for d in 0..n {
            let c = if rng.chance(0.5) { 0 } else { 1 + rng.below(6) };
            m[s * n + d] = match pattern {
                Pattern::Random => c,
                Pattern::ZeroRow(r) if s == r % n => 0,
                Pattern::ZeroColumn(col) if d == col % n => 0,
                Pattern::ZeroRow(_) | Pattern::ZeroColumn(_) => c.max(1),
                Pattern::SelfOnly if s == d => 1 + c,
                Pattern::SelfOnly | Pattern::AllZero => 0,
            };
        }
    }
    m
}

/// Displacements for blocks of `sizes`, placed in a random order with random gaps;
/// returns them and the buffer length.
fn scatter(sizes: &[usize], rng: &mut Rng) -> (Vec<usize>, usize) {
    let n = sizes.len();
    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        order.swap(i, rng.below(i + 1));
    }
    let mut displs = vec![0usize; n];
    let mut at = 0;
    for q in order {
        at += rng.below(3);
        displs[q] = at;
        at += sizes[q];
    }
    (displs, at + rng.below(3))
}

/// All-to-all-v of `counts(n, pattern, seed)` blocks of `scale` elements each. The
/// forced algorithm runs the data pass; where every block fits in the bytes the count
/// exchange carries (`Communicator::eager_v`) there is none and the call reports `Flat`.
fn check_v<E: Elem>(topo: &Topology, alg: Algorithm, pattern: Pattern, seed: u64, scale: usize) {
    let n = topo.size();
    let m: Vec<usize> = counts(n, pattern, seed)
        .into_iter()
        .map(|c| c * scale)
        .collect();
    let got = run_all(topo, alg, |comm| {
        let eager = comm.eager_v();
        let all_eager = eager > 0 && m.iter().all(|&c| c * std::mem::size_of::<E>() <= eager);
        let me = comm.rank();
        let mut rng = Rng::new(seed ^ ((me as u64 + 1) * 0x1000_0001));
        let send_counts: Vec<usize> = (0..n).map(|q| m[me * n + q]).collect();
        let recv_counts: Vec<usize> = (0..n).map(|q| m[q * n + me]).collect();
        let (send_displs, send_len) = scatter(&send_counts, &mut rng);
        let (recv_displs, recv_len) = scatter(&recv_counts, &mut rng);
        let mut send = vec![E::SENTINEL; send_len];
        for q in 0..n {
            for i in 0..send_counts[q] {
                send[send_displs[q] + i] = E::make(me, q, i, seed);
            }
        }
        let mut recv = vec![E::SENTINEL; recv_len];
        comm.all_to_all_v(
            &send,
            &Partition::new(&send_counts, &send_displs),
            &mut recv,
            &Partition::new(&recv_counts, &recv_displs),
        )?;
        let ran = if all_eager { Algorithm::Flat } else { alg };
        assert_eq!(comm.last_algorithm(), Some(ran), "eager bytes {eager}");
        Ok((recv, recv_counts, recv_displs))
    });
    for (me, (recv, recv_counts, recv_displs)) in got.into_iter().enumerate() {
        let mut want = vec![E::SENTINEL; recv.len()];
        for q in 0..n {
            for i in 0..recv_counts[q] {
                want[recv_displs[q] + i] = E::make(q, me, i, seed);
            }
        }
        assert_eq!(
            recv,
            want,
            "{alg} on {} ({pattern:?}, seed {seed}): rank {me}",
            topo.name()
        );
    }
}

fn check_topology(spec: &str) {
    let topo = Topology::preset(spec).unwrap();
    let n = topo.size();
    let algs = buildable(&topo);
    assert!(algs.contains(&Algorithm::Flat), "flat always builds");
    for (k, &alg) in algs.iter().enumerate() {
        let salt = k as u64 + 3;
        check_uniform::<u8>(&topo, alg, 3, salt);
        check_uniform::<f32>(&topo, alg, 5, salt);
        check_uniform::<u64>(&topo, alg, 2, salt);
        check_uniform::<u64>(&topo, alg, 0, salt);
        for (i, pattern) in [
            Pattern::Random,
            Pattern::ZeroRow(n / 2),
            Pattern::ZeroColumn(n - 1),
            Pattern::SelfOnly,
            Pattern::AllZero,
        ]
        .into_iter()
        .enumerate()
        {
            let seed = 0xC0FFEE + 17 * i as u64 + 1000 * k as u64;
            check_v::<u64>(&topo, alg, pattern, seed, 1);
        }
        check_v::<u8>(&topo, alg, Pattern::Random, 99 + k as u64, 1);
        check_v::<f32>(&topo, alg, Pattern::Random, 7 + k as u64, 1);
        // Blocks of 0-2064 bytes: with the default 1 KiB carried with the counts, some
        // whole, some split between the count exchange and the data pass.
        check_v::<u64>(&topo, alg, Pattern::Random, 51 + k as u64, 43);
        check_v::<u8>(&topo, alg, Pattern::ZeroColumn(1), 77 + k as u64, 341);
    }
}

macro_rules! topology_tests {
    ($($name:ident => $spec:expr,)*) => {
        $(
            #[test]
            fn $name() {
                check_topology($spec);
            }
        )*
    };
}

topology_tests! {
    flat_1 => "flat:1",
    flat_2 => "flat:2",
    flat_3 => "flat:3",
    flat_4 => "flat:4",
    flat_7 => "flat:7",
    flat_8 => "flat:8",
    flat_16 => "flat:16",
    nodes_1x2 => "nodes:1x2",
    nodes_3x1 => "nodes:3x1",
    nodes_2x2 => "nodes:2x2",
    nodes_2x4_ranks_7 => "nodes:2x4,ranks=7",
    nodes_4x2 => "nodes:4x2",
    nodes_2x4 => "nodes:2x4",
    nodes_4x4 => "nodes:4x4",
    nodes_4x4_ranks_14 => "nodes:4x4,ranks=14",
    nodes_3x3_ranks_7 => "nodes:3x3,ranks=7",
    frontier_1 => "frontier:1",
    frontier_2 => "frontier:2",
}

/// The automatic choice runs, gives the same bytes, and reports what it ran.
#[test]
fn automatic_selection_is_exact() {
    for spec in ["nodes:4x4", "flat:7", "frontier:2", "nodes:4x4,ranks=14"] {
        let topo = Topology::preset(spec).unwrap();
        let n = topo.size();
        for count in [1usize, 300, 70_000] {
            let out = local::run(&topo, Emulation::off(), |comm| {
                let me = comm.rank();
                let send: Vec<u64> = (0..n * count)
                    .map(|k| u64::make(me, k / count, k % count, 1))
                    .collect();
                let mut recv = vec![0u64; n * count];
                comm.all_to_all(&send, &mut recv)?;
                let alg = comm.last_algorithm().expect("an algorithm ran");
                Ok((recv, alg))
            });
            let algs: Vec<Algorithm> = out.iter().map(|r| r.as_ref().unwrap().1).collect();
            assert!(
                algs.iter().all(|a| *a == algs[0]),
                "ranks chose differently: {algs:?}"
            );
            for (me, r) in out.into_iter().enumerate() {
                let (recv, _) = r.unwrap();
                let want: Vec<u64> = (0..n * count)
                    .map(|k| u64::make(k / count, me, k % count, 1))
                    .collect();
                assert_eq!(recv, want, "auto on {spec}, {count} per pair, rank {me}");
            }
        }
    }
}

/// Many collectives in a row — uniform, v and barriers interleaved — stay in step.
#[test]
fn successive_collectives_do_not_mix() {
    let topo = Topology::preset("nodes:2x4").unwrap();
    let n = topo.size();
    let out = local::run(&topo, Emulation::off(), |comm| {
        let me = comm.rank();
        for round in 0..50usize {
            let count = 1 + round % 4;
            let send: Vec<u32> = (0..n * count)
                .map(|k| (me * 1_000_000 + round * 1000 + k) as u32)
                .collect();
            let mut recv = vec![0u32; n * count];
            comm.all_to_all(&send, &mut recv)?;
            for q in 0..n {
                for i in 0..count {
                    assert_eq!(
                        recv[q * count + i],
                        (q * 1_000_000 + round * 1000 + me * count + i) as u32
                    );
                }
            }
            let c = (me + round) % 3;
            let send_counts = vec![c; n];
            let send_displs: Vec<usize> = (0..n).map(|q| q * c).collect();
            let recv_counts: Vec<usize> = (0..n).map(|q| (q + round) % 3).collect();
            let mut recv_displs = vec![0; n];
            for q in 1..n {
                recv_displs[q] = recv_displs[q - 1] + recv_counts[q - 1];
            }
            let send = vec![(me * 100 + round) as u16; n * c];
            let mut recv = vec![0u16; recv_counts.iter().sum()];
            comm.all_to_all_v(
                &send,
                &Partition::new(&send_counts, &send_displs),
                &mut recv,
                &Partition::new(&recv_counts, &recv_displs),
            )?;
            for q in 0..n {
                for i in 0..recv_counts[q] {
                    assert_eq!(recv[recv_displs[q] + i], (q * 100 + round) as u16);
                }
            }
            if round % 7 == 0 {
                comm.barrier()?;
            }
        }
        Ok(())
    });
    for (r, x) in out.into_iter().enumerate() {
        x.unwrap_or_else(|e| panic!("rank {r}: {e}"));
    }
}

/// Large blocks (several MiB per rank) go through unchanged.
#[test]
fn large_blocks() {
    let topo = Topology::preset("nodes:2x2").unwrap();
    let n = topo.size();
    let count = 256 * 1024; // 1 MiB of f32 per pair
    for alg in buildable(&topo) {
        let got = run_all(&topo, alg, |comm| {
            let me = comm.rank();
            let send: Vec<f32> = (0..n * count)
                .map(|k| f32::make(me, k / count, k % count, 0))
                .collect();
            let mut recv = vec![0f32; n * count];
            comm.all_to_all(&send, &mut recv)?;
            Ok(recv)
        });
        for (me, recv) in got.into_iter().enumerate() {
            for q in 0..n {
                for i in [0, 1, count / 2, count - 1] {
                    assert_eq!(
                        recv[q * count + i],
                        f32::make(q, me, i, 0),
                        "{alg} rank {me} from {q} at {i}"
                    );
                }
            }
        }
    }
}
