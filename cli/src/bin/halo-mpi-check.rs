//! `halo-mpi-check`: `halo check` bootstrapped through MPI (cargo feature `mpi`).
//!
//! ```text
//! mpirun -n 4 halo-mpi-check
//! ```
//!
//! MPI only introduces the ranks to each other (`MPI_Allgatherv` of their fabric
//! addresses); the all-to-alls then run over HALO's libfabric transport and are
//! verified byte-exact with every algorithm.

use halo::Communicator;
use halo_cli::check::{CheckOptions, run_check};
use mpi::traits::Communicator as _;
use std::process::ExitCode;

fn main() -> ExitCode {
    halo_logging::init_from_env();
    let Some(universe) = mpi::initialize() else {
        eprintln!("error: MPI could not be initialised");
        return ExitCode::from(1);
    };
    let world = universe.world();
    let rank = world.rank();
    let mut comm = match Communicator::init_mpi(&world) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: rank {rank}: init through MPI: {e}");
            return ExitCode::from(1);
        }
    };
    let opts = CheckOptions {
        counts: vec![0, 1, 300],
        v_rounds: 2,
        ..CheckOptions::default()
    };
    match run_check(&mut comm, &opts) {
        Ok(r) => {
            println!(
                "rank {}/{} (MPI bootstrap): {} collectives verified",
                comm.rank(),
                comm.size(),
                r.collectives
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: rank {rank}: {e}");
            ExitCode::from(1)
        }
    }
}
