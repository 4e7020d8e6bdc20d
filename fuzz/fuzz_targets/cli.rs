//! The `halo` tool's parsers: any command line (one argument per line of the input)
//! parses or gives clap's usage error, never a panic, with the tool's own value
//! parsers (`halo plan`'s numbers and bandwidths) inside; and each argument, given to
//! the tool's parse helpers (sizes with K/M/G, `--sizes` ladders, `--ranks-per-host`,
//! presets, algorithm and operation names), parses or gives an error.

#![no_main]

use clap::Parser as _;
use libfuzzer_sys::fuzz_target;

use halo_cli::commands;

/// Whether a preset spec names at most a few thousand ranks (larger ones are refused
/// only after they are built, which is slow, not wrong).
fn small_numbers(s: &str) -> bool {
    let mut run = 0;
    s.chars().all(|c| {
        run = if c.is_ascii_digit() { run + 1 } else { 0 };
        run <= 3
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let args: Vec<&str> = text.split('\n').collect();
    let argv = std::iter::once("halo").chain(args.iter().copied());
    if let Err(e) = commands::Cli::try_parse_from(argv) {
        // Help and version are "errors" too; each renders to text.
        assert!(!e.render().to_string().is_empty());
    }
    for a in &args {
        if let Ok(v) = halo_cli::plot::parse_bytes(a) {
            let ladder = halo_cli::calibrate::size_ladder(v.max(1), v.saturating_mul(1 << 20));
            assert!(!ladder.is_empty());
            assert!(
                ladder.windows(2).all(|w| w[0] < w[1]),
                "ladder not increasing"
            );
        }
        if let Some((lo, hi)) = a.split_once(':')
            && let (Ok(lo), Ok(hi)) = (
                halo_cli::plot::parse_bytes(lo),
                halo_cli::plot::parse_bytes(hi),
            )
            && 0 < lo
            && lo <= hi
        {
            let ladder = halo_cli::calibrate::size_ladder(lo, hi);
            assert_eq!(ladder.first(), Some(&lo));
            assert!(
                ladder.iter().all(|&s| lo <= s && s <= hi),
                "{ladder:?} outside {lo}..{hi}"
            );
        }
        for ranks in [1usize, 7, 64] {
            for hosts in [None, Some(1), Some(3)] {
                if let Ok(p) = halo_cli::launch::Placement::parse(a, ranks, hosts) {
                    assert_eq!(p.ranks(), ranks);
                    assert_eq!(p.counts().iter().sum::<usize>(), ranks);
                }
            }
        }
        if small_numbers(a)
            && let Ok(spec) = halo_topology::preset_spec(a)
            && spec.ranks.len() <= 4096
        {
            let _ = spec.build();
        }
        let _ = a.parse::<halo_cli::bench::Op>();
        let _ = a.parse::<halo_cli::bench::BenchAlgo>();
        let _ = a.parse::<halo::Algorithm>();
        let _ = a.parse::<halo::AllGatherAlgorithm>();
        let _ = a.parse::<halo::AllReduceAlgorithm>();
        let _ = a.parse::<halo::FabricProgress>();
        let _ = a.parse::<halo_topology::Level>();
    }
});
