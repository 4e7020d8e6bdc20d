//! Hello all-to-all: 8 ranks as threads of this process (no launcher, no cluster), on a
//! topology of 2 nodes x 4 ranks, with the algorithm chosen automatically.
//!
//! ```sh
//! cargo run -p halo --example all_to_all_threads
//! ```

use halo::local::{self, Emulation};
use halo::topology::Topology;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let topology = Topology::preset("nodes:2x4")?;
    let per_peer = 1024; // elements each rank sends to each rank
    let results = local::run(&topology, Emulation::off(), |comm| {
        let (me, n) = (comm.rank(), comm.size());
        // Block q of `send` goes to rank q; element i of it encodes (me, q, i).
        let send: Vec<u64> = (0..n * per_peer)
            .map(|j| ((me * n + j / per_peer) * per_peer + j % per_peer) as u64)
            .collect();
        let mut recv = vec![0u64; n * per_peer];
        comm.all_to_all(&send, &mut recv)?;
        // Block s of `recv` came from rank s: its element i encodes (s, me, i).
        let expected =
            (0..n * per_peer).map(|j| ((j / per_peer * n + me) * per_peer + j % per_peer) as u64);
        let ok = recv.iter().copied().eq(expected);
        Ok((ok, comm.last_algorithm()))
    });
    for (rank, r) in results.into_iter().enumerate() {
        let (ok, algorithm) = r?;
        if !ok {
            return Err(format!("rank {rank}: wrong bytes").into());
        }
        if rank == 0 {
            println!(
                "algorithm: {}",
                algorithm.map_or("none".into(), |a| a.to_string())
            );
        }
    }
    println!("all_to_all: 8 ranks, {per_peer} u64 per peer, byte-exact");
    Ok(())
}
