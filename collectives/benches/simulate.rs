//! Cost of simulating one all-to-all: frontier:128 (1,024 ranks), 64 KiB per peer,
//! flat and HALO — building every rank's schedule, matching, and the replay.

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use halo_collectives::{Algorithm, SimOptions, Traffic, simulate_all_to_all};
use halo_topology::Topology;
use std::hint::black_box;
use std::time::Duration;

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("simulate");
    g.sample_size(10);
    g.measurement_time(Duration::from_secs(40));
    let topo = Topology::preset("frontier:128").unwrap();
    let options = SimOptions::default();
    for algo in [Algorithm::Flat, Algorithm::Halo] {
        g.bench_with_input(
            BenchmarkId::new(format!("{algo}/64KiB"), topo.size()),
            &algo,
            |b, &algo| {
                b.iter(|| {
                    black_box(
                        simulate_all_to_all(&topo, algo, Traffic::Uniform(64 << 10), &options)
                            .unwrap(),
                    )
                })
            },
        );
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
