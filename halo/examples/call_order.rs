//! How a call's time depends on the calls before it: ranks as threads on an emulated
//! cluster run uniform all-to-alls in blocks of consecutive calls of each algorithm
//! (a barrier before every call), and every call's time is reported by its position in
//! its block (0: the first call after another algorithm's). This is the measurement
//! behind the tuner's untimed lead-in calls (`halo::tune::lead_calls`; docs/bench/
//! JOURNAL.md, "The tuner's trials").
//!
//! ```sh
//! cargo run --release --example call_order -p halo -- 8192 flat,halo 6
//! # arguments: block bytes, algorithms, calls per block; EMULATION=off for none
//! ```

use halo::Algorithm;
use halo::local::{self, Emulation};
use halo::topology::Topology;
use std::collections::BTreeMap;
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let block: usize = args.next().as_deref().unwrap_or("8192").parse()?;
    let algorithms: Vec<Algorithm> = args
        .next()
        .as_deref()
        .unwrap_or("flat,halo")
        .split(',')
        .map(str::parse)
        .collect::<Result<_, _>>()?;
    let run: usize = args.next().as_deref().unwrap_or("6").parse()?;
    let emulation = match std::env::var("EMULATION").as_deref() {
        Ok("off") => Emulation::off(),
        _ => Emulation::on().scaled(100.0),
    };
    let topology = Topology::preset("nodes:4x4")?;
    let cycles = 40;
    let out = local::run(&topology, emulation, |comm| {
        let n = comm.size();
        let send = vec![1u8; n * block];
        let mut recv = vec![0u8; n * block];
        let mut times = Vec::new();
        for cycle in 0..cycles {
            for &a in &algorithms {
                comm.set_algorithm(Some(a));
                for position in 0..run {
                    comm.barrier()?;
                    let t = Instant::now();
                    comm.all_to_all(&send, &mut recv)?;
                    // The first cycle has no predecessor of another algorithm.
                    if cycle > 0 {
                        times.push((a, position, t.elapsed().as_micros() as u64));
                    }
                }
            }
        }
        Ok(times)
    });
    let mut by: BTreeMap<(String, usize), Vec<u64>> = BTreeMap::new();
    for rank in out {
        for (a, position, us) in rank? {
            by.entry((a.to_string(), position)).or_default().push(us);
        }
    }
    println!("# {block} B per peer, nodes:4x4 in threads, {emulation:?}");
    println!("# algorithm  position  calls  median_us  mean_us");
    for ((a, position), mut t) in by {
        t.sort_unstable();
        let mean = t.iter().sum::<u64>() as f64 / t.len() as f64;
        println!(
            "{a:>10} {position:>9} {:>6} {:>10} {mean:>8.0}",
            t.len(),
            t[t.len() / 2]
        );
    }
    Ok(())
}
