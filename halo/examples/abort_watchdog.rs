//! Aborting from a watchdog thread (like `ncclCommAbort`): rank 3 of 4 never joins the
//! all-to-all, so the other ranks would wait until their timeout. Each rank's watchdog
//! thread holds an `AbortHandle` and aborts the communicator after 200 ms; the blocked
//! call returns `Error::Aborted` at once, and so does every later call.
//!
//! ```sh
//! cargo run -p halo --example abort_watchdog
//! ```

use halo::Error;
use halo::local::{self, Emulation};
use halo::topology::Topology;
use std::time::{Duration, Instant};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let topology = Topology::preset("flat:4")?;
    let results = local::run(&topology, Emulation::off(), |comm| {
        if comm.rank() == 3 {
            // The straggler: busy elsewhere (its communicator alive) and never calls
            // the collective.
            std::thread::sleep(Duration::from_millis(1500));
            return Ok(None);
        }
        comm.set_timeout(Duration::from_secs(60));
        let handle = comm.abort_handle();
        let watchdog = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            handle.abort();
        });
        let start = Instant::now();
        let send = vec![comm.rank() as u32; 4];
        let mut recv = vec![0u32; 4];
        let first = comm.all_to_all(&send, &mut recv);
        let waited = start.elapsed();
        let later = comm.barrier();
        watchdog.join().expect("the watchdog thread ends");
        Ok(Some((first, later, waited)))
    });
    for (rank, r) in results.into_iter().enumerate() {
        let Some((first, later, waited)) = r? else {
            continue;
        };
        match (first, later) {
            (Err(Error::Aborted { .. }), Err(Error::Aborted { .. }))
                if waited < Duration::from_secs(10) =>
            {
                println!("rank {rank}: aborted after {} ms", waited.as_millis());
            }
            other => {
                return Err(format!("rank {rank}: expected Aborted twice, got {other:?}").into());
            }
        }
    }
    println!("abort: 3 ranks aborted by their watchdogs, later calls refused");
    Ok(())
}
