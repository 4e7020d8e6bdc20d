//! Cost of building one rank's program, as the runtime does it on every call:
//! N = 1,024 and 65,536 ranks, uniform and -v, flat and HALO.

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use halo_collectives::{AlgoOptions, Algorithm, BlockSizes, BuildCtx, Layout, UniformSizes, build};
use halo_topology::{Rank, Topology};
use std::hint::black_box;

/// Pseudo-random block sizes without an N x N matrix: 0..=255 bytes from a hash.
struct HashSizes;

impl BlockSizes for HashSizes {
    fn bytes(&self, src: Rank, dst: Rank) -> usize {
        let h = (src as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
            ^ (dst as u64).wrapping_mul(0xC2B2_AE3D_27D4_EB4F);
        ((h >> 29) & 0xff) as usize
    }
}

fn bench(c: &mut Criterion) {
    let options = AlgoOptions::default();
    let mut g = c.benchmark_group("schedule_build");
    g.sample_size(10);
    for nodes in [128usize, 8192] {
        let topo = Topology::preset(&format!("frontier:{nodes}")).unwrap();
        let n = topo.size();
        let rank = n / 2 + 3;
        let uniform = UniformSizes(4096);
        let sizes = HashSizes;
        let send: Vec<usize> = (0..n).map(|q| sizes.bytes(rank, q)).collect();
        let recv: Vec<usize> = (0..n).map(|q| sizes.bytes(q, rank)).collect();
        let prefix = |v: &[usize]| {
            v.iter()
                .scan(0, |acc, &x| {
                    let o = *acc;
                    *acc += x;
                    Some(o)
                })
                .collect::<Vec<_>>()
        };
        let (sd, rd) = (prefix(&send), prefix(&recv));
        for algo in [Algorithm::Flat, Algorithm::Halo] {
            g.bench_with_input(
                BenchmarkId::new(format!("{algo}/uniform"), n),
                &n,
                |b, _| {
                    let ctx = BuildCtx {
                        topology: &topo,
                        rank,
                        layout: Layout::Uniform { block: 4096 },
                        sizes: &uniform,
                        options: &options,
                    };
                    b.iter(|| black_box(build(algo, &ctx).unwrap()))
                },
            );
            g.bench_with_input(BenchmarkId::new(format!("{algo}/v"), n), &n, |b, _| {
                let ctx = BuildCtx {
                    topology: &topo,
                    rank,
                    layout: Layout::V {
                        send_counts: &send,
                        send_displs: &sd,
                        recv_counts: &recv,
                        recv_displs: &rd,
                    },
                    sizes: &sizes,
                    options: &options,
                };
                b.iter(|| black_box(build(algo, &ctx).unwrap()))
            });
        }
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
