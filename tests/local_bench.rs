//! The OSU-style benchmark library behind `halo bench`.

use halo::Algorithm;
use halo::bench::{self, BenchOptions, BenchRow};
use halo::local::Emulation;
use halo::topology::Topology;
use std::time::Duration;

fn small_options() -> BenchOptions {
    BenchOptions {
        topology: Topology::preset("nodes:2x2").unwrap(),
        emulation: Emulation::on(),
        algorithms: vec![Algorithm::Flat, Algorithm::Halo],
        min_size: 1,
        max_size: 64,
        iterations: Some(5),
        warmup: Some(1),
        timeout: Duration::from_secs(30),
        validate: true,
    }
}

#[test]
fn sizes_and_iterations_follow_osu() {
    let mut o = BenchOptions::new().unwrap();
    assert_eq!(o.topology.size(), 16);
    assert!(o.emulation.enabled);
    assert_eq!(o.sizes().len(), 21); // 1 B .. 1 MiB
    assert_eq!(o.iterations_for(8192), (1000, 100));
    assert_eq!(o.iterations_for(16384), (100, 10));
    o.min_size = 3;
    o.max_size = 20;
    assert_eq!(o.sizes(), vec![4, 8, 16]);
    o.min_size = 0;
    assert_eq!(o.sizes(), vec![0, 1, 2, 4, 8, 16]);
}

#[test]
fn runs_and_formats_a_table_per_algorithm() {
    let opts = small_options();
    let rows = bench::run_local_bench(&opts).unwrap();
    assert_eq!(rows.len(), 2 * 7);
    for r in &rows {
        assert!(r.min_us <= r.avg_us && r.avg_us <= r.max_us, "{r:?}");
        assert!(r.min_us > 0.0 && r.bus_bw_gbs > 0.0, "{r:?}");
        assert_eq!(r.iterations, 5);
    }
    let text = bench::format_osu(&opts, &rows);
    print!("{text}");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines[0],
        "# OSU MPI-style All-to-All Latency Test (HALO flat, 4 ranks, topology nodes:2x2, emulated)"
    );
    assert_eq!(
        lines[1],
        "# Size         Avg Latency(us)     Min Latency(us)     Max Latency(us)  Iterations        Bus BW(GB/s)"
    );
    assert!(lines[2].starts_with("1         "), "{}", lines[2]);
    assert_eq!(lines[2].len(), 10 + 20 * 3 + 12 + 20);
    assert!(text.contains("(HALO halo, 4 ranks"));
}

#[test]
fn format_is_exact_for_known_rows() {
    let opts = small_options();
    let rows = [BenchRow {
        algorithm: Algorithm::Flat,
        size: 1024,
        avg_us: 12.345,
        min_us: 10.0,
        max_us: 15.5,
        iterations: 1000,
        bus_bw_gbs: bench::bus_bandwidth(1024, 4, 12.345e-6),
    }];
    let text = bench::format_osu(&opts, &rows);
    let line = text.lines().nth(2).unwrap();
    assert_eq!(
        line,
        "1024                     12.35               10.00               15.50        1000                0.25"
    );
    // nccl-tests: algbw = 1024 x 4 / t; busbw = algbw x 3/4.
    let bw = bench::bus_bandwidth(1024, 4, 1e-6);
    assert!((bw - 4096.0 / 1e-6 / 1e9 * 0.75).abs() < 1e-9);
}
