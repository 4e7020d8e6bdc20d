//! The `halo` command-line tool.
//!
//! `halo topo` shows the machine model: this machine as discovery sees it, or a
//! preset or topology file as the collectives will see it. `halo launch` starts the
//! ranks of a job, locally or on emulated hosts (network namespaces; see
//! `halo_cli::launch`), optionally through Open MPI's mpirun. Errors are printed as
//! `error: <message>` on stderr; bad input exits with status 2. Set `HALO_DEBUG`
//! (`info`, `debug`, `trace`) for logs on stderr.

use clap::Parser as _;
use halo_cli::commands;
use std::process::ExitCode;

fn main() -> ExitCode {
    halo_logging::init_from_env();
    let args = commands::Cli::parse();
    match commands::run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", e.message);
            ExitCode::from(e.code)
        }
    }
}
