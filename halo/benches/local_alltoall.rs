//! In-process all-to-all against a plain memcpy of the same bytes, in the same run.
//!
//! 8 ranks as threads, 1 MiB per pair: each rank sends and receives 8 MiB, 64 MiB move
//! in all. The baseline copies the same 64 MiB with one `copy_from_slice`. Throughput is
//! reported for the 64 MiB, so the ratio of the two is the in-process transport's
//! bandwidth as a fraction of memcpy (on a machine with fewer cores than ranks the
//! ranks share the cores; more cores can make the all-to-all faster than one memcpy).
//!
//! Run: `cargo bench -p halo --bench local_alltoall`.

#![allow(missing_docs)]

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use halo::Algorithm;
use halo::local::{self, Emulation};
use halo::topology::Topology;
use std::hint::black_box;
use std::time::{Duration, Instant};

const RANKS: usize = 8;
const BLOCK: usize = 1 << 20;

/// Runs `iters` all-to-alls on every rank (after one untimed warm-up that also touches
/// the pages) and returns the slowest rank's time.
fn all_to_all(topo: &Topology, alg: Algorithm, iters: u64) -> Duration {
    let out = local::run(topo, Emulation::off(), |comm| {
        comm.set_algorithm(Some(alg));
        let send = vec![comm.rank() as u8; RANKS * BLOCK];
        let mut recv = vec![0u8; RANKS * BLOCK];
        comm.all_to_all(&send, &mut recv)?;
        comm.barrier()?;
        let t = Instant::now();
        for _ in 0..iters {
            comm.all_to_all(black_box(&send), black_box(&mut recv))?;
        }
        Ok(t.elapsed())
    });
    out.into_iter()
        .map(|r| r.expect("all-to-all"))
        .max()
        .unwrap_or_default()
}

fn bench(c: &mut Criterion) {
    let topo = Topology::preset(&format!("nodes:1x{RANKS}")).expect("preset");
    let total = RANKS * RANKS * BLOCK;
    let mut g = c.benchmark_group("alltoall_8x1MiB");
    g.throughput(Throughput::Bytes(total as u64));
    g.sample_size(10);
    g.measurement_time(Duration::from_secs(5));
    g.bench_function("memcpy", |b| {
        let src = vec![1u8; total];
        let mut dst = vec![0u8; total];
        b.iter(|| dst.copy_from_slice(black_box(&src)));
        black_box(&dst);
    });
    for alg in [Algorithm::Flat, Algorithm::Pairwise, Algorithm::Halo] {
        g.bench_function(alg.name(), |b| {
            b.iter_custom(|iters| all_to_all(&topo, alg, iters))
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
