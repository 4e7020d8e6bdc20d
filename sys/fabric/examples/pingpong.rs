//! Tagged ping-pong between two endpoints in one process, over `shm` and `tcp;ofi_rxm`
//! (127.0.0.1): one-way latency of 1-byte messages and bandwidth of 1 MiB messages.
//!
//! ```text
//! cargo run --release -p halo-fabric-sys --example pingpong [shm|tcp] [iterations]
//! ```
//!
//! Each iteration is a round trip: endpoint 0 sends to 1, 1 sends back, every receive is
//! pre-posted and each side waits for its send and receive completions. Latency is half a
//! round trip; bandwidth is message size / half a round trip (bytes moved per second,
//! both directions together, as fi_pingpong counts). Both endpoints share one thread, so
//! this measures the provider plus the polling of two completion queues, not two cores.

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::Instant;

use common::{Pair, Provider, SHM, TCP, pattern};

const MIB: usize = 1 << 20;

fn run(p: &Provider, iters: usize) -> Result<(), String> {
    let t0 = Instant::now();
    let mut pair = Pair::open(p, MIB, false)?;
    let opened = t0.elapsed();
    pattern(7, &mut pair.eps[0].send_buf);
    pattern(9, &mut pair.eps[1].send_buf);

    // The first message also sets up RxM's connection (lazily, while the CQs are read).
    let t1 = Instant::now();
    pair.transfer(0, 1, 1)?;
    pair.transfer(1, 1, 2)?;
    let first = t1.elapsed();
    let eagain_first = pair.send_eagain;

    for (len, iters) in [(1usize, iters), (MIB, (iters / 50).max(20))] {
        let warmup = (iters / 10).max(5);
        for i in 0..warmup {
            pair.transfer(0, len, 10 + i as u64)?;
            pair.transfer(1, len, 10 + i as u64)?;
        }
        let t = Instant::now();
        for i in 0..iters {
            pair.transfer(0, len, 1 << 32 | i as u64)?;
            pair.transfer(1, len, 1 << 33 | i as u64)?;
        }
        let half_rtt = t.elapsed().as_secs_f64() / (2 * iters) as f64;
        if pair.eps[0].recv_buf[..len] != pair.eps[1].send_buf[..len] {
            return Err(format!("{len} B: payload differs"));
        }
        println!(
            "{:<12} {:>8} B  {:>6} round trips  latency {:>9.2} us  bandwidth {:>8.3} GB/s",
            p.name,
            len,
            iters,
            half_rtt * 1e6,
            len as f64 / half_rtt / 1e9
        );
    }
    println!(
        "{:<12} open {:.1} ms, first round trip {:.2} ms (fi_tsend -FI_EAGAIN x{}), \
         -FI_EAGAIN after that: {}",
        p.name,
        opened.as_secs_f64() * 1e3,
        first.as_secs_f64() * 1e3,
        eagain_first,
        pair.send_eagain - eagain_first
    );
    Ok(())
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let which = args.first().map_or("all", String::as_str);
    let iters = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(10_000);
    let providers: &[Provider] = match which {
        "shm" => &[SHM],
        "tcp" => &[TCP],
        "all" => &[SHM, TCP],
        other => {
            eprintln!("usage: pingpong [shm|tcp|all] [iterations] (got {other})");
            std::process::exit(2);
        }
    };
    for p in providers {
        if let Err(e) = run(p, iters) {
            eprintln!("{}: {e}", p.name);
            std::process::exit(1);
        }
    }
}
