//! `halo secret`: the per-user key file that environment-mode jobs (torchrun, srun)
//! derive their secret from.

use super::{Failure, emit};
use clap::{Args, Subcommand};
use std::path::PathBuf;

/// `halo secret` options.
#[derive(Debug, Args)]
#[command(after_help = "\
Jobs started by torchrun, srun or mpirun (without the mpi feature) and without
HALO_SECRET derive their secret from this key file: HMAC-SHA256 of the key over the
job's identity (bootstrap address, size, the launcher's job ids), so each job gets its
own secret and nobody who cannot read the file can compute it. The file must be a
regular file of the job's user with mode 0600 (or 0400); HALO refuses any other.
Every host of the job must see the same key (a shared home directory, or copy it).

Without halo: umask 077; mkdir -p ~/.config/halo; openssl rand -hex 32 > ~/.config/halo/secret")]
pub(crate) struct SecretArgs {
    #[command(subcommand)]
    command: SecretCommand,
}

#[derive(Debug, Subcommand)]
enum SecretCommand {
    /// Create the key file ($HALO_SECRET_FILE, else ~/.config/halo/secret), mode 0600.
    Init {
        /// Where to write it (default: $HALO_SECRET_FILE, else ~/.config/halo/secret).
        #[arg(long, value_name = "PATH")]
        file: Option<PathBuf>,

        /// Replace an existing key file (jobs running keep their secret).
        #[arg(long)]
        force: bool,
    },
}

pub(crate) fn run(args: &SecretArgs) -> Result<(), Failure> {
    match &args.command {
        SecretCommand::Init { file, force } => {
            let path =
                match file {
                    Some(p) => p.clone(),
                    None => halo::bootstrap::key_file_path(
                        &halo::bootstrap::EnvSource::Process.variables(),
                    )
                    .ok_or_else(|| {
                        Failure::input("neither HALO_SECRET_FILE nor HOME is set: pass --file PATH")
                    })?,
                };
            halo::bootstrap::create_key_file(&path, *force).map_err(|e| match e {
                halo::Error::InvalidArgument { .. } => Failure::input(e),
                _ => Failure::other(e),
            })?;
            // Read back through the same checks a rank applies.
            halo::bootstrap::read_key_file(&path).map_err(Failure::other)?;
            emit(&format!(
                "wrote {} (mode 0600): jobs without HALO_SECRET now derive their secret from it\n",
                path.display()
            ))
        }
    }
}
