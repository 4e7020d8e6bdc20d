//! Bootstrap from the environment a launcher sets (torchrun, Open MPI, MPICH/PMI, Slurm).

use super::rendezvous::{RendezvousRoot, exchange};
use super::secret::{INSECURE_DERIVED, SecretSource};
use super::{Secret, parse_host_port};
use crate::error::{Error, Result};
pub use halo_topology::discover::EnvSource;
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

/// Port used with `SLURM_JOB_NODELIST` when nothing else names one.
pub const DEFAULT_BOOTSTRAP_PORT: u16 = 29511;

/// Where this rank sits and how to reach the root, read from the environment.
#[derive(Clone, PartialEq, Eq)]
pub struct EnvBootstrap {
    /// This rank.
    pub rank: usize,
    /// Ranks in the job.
    pub size: usize,
    /// The rendezvous root (served by rank 0).
    pub root: SocketAddr,
    /// The job's secret.
    pub secret: Secret,
    /// Which launcher's variables gave rank and size (`torchrun`, `openmpi`, `pmi`, `slurm`).
    pub launcher: &'static str,
    /// Where the secret came from: `HALO_SECRET`, the per-user key file, or the
    /// insecure opt-in (see [`crate::bootstrap`]'s secret notes).
    pub secret_source: SecretSource,
    /// How long to wait for the other ranks (`HALO_BOOTSTRAP_TIMEOUT_MS`, default 120 s).
    pub timeout: Duration,
    /// Whether the launcher serves the root (`HALO_BOOTSTRAP_SERVED=1`, set by `halo
    /// launch`): then rank 0 only connects to it, like the other ranks.
    pub root_served: bool,
}

impl std::fmt::Debug for EnvBootstrap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EnvBootstrap")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("root", &self.root)
            .field("launcher", &self.launcher)
            .field("secret_source", &self.secret_source)
            .finish_non_exhaustive()
    }
}

fn number(vars: &BTreeMap<String, String>, name: &str) -> Result<Option<usize>> {
    match vars.get(name) {
        None => Ok(None),
        Some(v) => v.trim().parse::<usize>().map(Some).map_err(|_| {
            Error::invalid_argument(format!("{name}={v:?} is not a non-negative integer"))
        }),
    }
}

impl EnvBootstrap {
    /// Reads rank, size, root and secret. Fails naming the variable that is missing
    /// or malformed, the key file that others can read, or, for a job of more than one
    /// rank without `HALO_SECRET` or a key file, saying how to provide a secret
    /// (`secret.rs`); `HALO_SECRET=insecure-derived` is logged as a warning.
    pub fn detect(source: &EnvSource) -> Result<EnvBootstrap> {
        let vars = source.variables();
        let styles: [(&'static str, &str, &str); 4] = [
            ("torchrun", "RANK", "WORLD_SIZE"),
            ("openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
            ("pmi", "PMI_RANK", "PMI_SIZE"),
            ("slurm", "SLURM_PROCID", "SLURM_NTASKS"),
        ];
        let mut found = None;
        for (launcher, r, s) in styles {
            match (number(&vars, r)?, number(&vars, s)?) {
                (Some(rank), Some(size)) => {
                    // The size first: a world too large is refused before anything else
                    // (the secret included) is looked at for it.
                    super::check_world_size(size, s)?;
                    found = Some((launcher, rank, size));
                    break;
                }
                (Some(_), None) | (None, Some(_)) => {
                    return Err(Error::invalid_argument(format!(
                        "{r} and {s} must be set together"
                    )));
                }
                (None, None) => {}
            }
        }
        let (launcher, rank, size) = found.ok_or_else(|| {
            Error::invalid_argument(
                "no launcher environment: set RANK/WORLD_SIZE (torchrun), OMPI_COMM_WORLD_RANK/SIZE, \
                 PMI_RANK/PMI_SIZE or SLURM_PROCID/SLURM_NTASKS",
            )
        })?;
        if size == 0 || rank >= size {
            return Err(Error::invalid_argument(format!(
                "rank {rank} out of range for a job of {size} ranks"
            )));
        }
        let root = if let Some(a) = vars.get(halo_params::BOOTSTRAP_ADDR.name) {
            parse_host_port(a, DEFAULT_BOOTSTRAP_PORT)?
        } else if let Some(a) = vars.get("MASTER_ADDR") {
            let port = match number(&vars, "MASTER_PORT")? {
                Some(p) if p < 65535 => p as u16 + 1,
                Some(p) => {
                    return Err(Error::invalid_argument(format!(
                        "MASTER_PORT={p} is not a port below 65535"
                    )));
                }
                None => DEFAULT_BOOTSTRAP_PORT,
            };
            parse_host_port(a, port)?
        } else if let Some(list) = vars.get("SLURM_JOB_NODELIST") {
            let hosts = halo_topology::discover::expand_nodelist(list)
                .map_err(|e| Error::invalid_argument(format!("SLURM_JOB_NODELIST: {e}")))?;
            let first = hosts
                .first()
                .ok_or_else(|| Error::invalid_argument("SLURM_JOB_NODELIST is empty"))?;
            parse_host_port(first, DEFAULT_BOOTSTRAP_PORT)?
        } else if size == 1 {
            SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0)
        } else {
            return Err(Error::invalid_argument(
                "no rendezvous address: set HALO_BOOTSTRAP_ADDR (ip:port) or MASTER_ADDR/MASTER_PORT",
            ));
        };
        let timeout = match halo_params::BOOTSTRAP_TIMEOUT_MS
            .number_from(
                vars.get(halo_params::BOOTSTRAP_TIMEOUT_MS.name)
                    .map(String::as_str),
            )
            .map_err(|e| Error::invalid_argument(e.to_string()))?
        {
            Some(ms) => Duration::from_millis(ms),
            None => Duration::from_secs(120),
        };
        let root_served = match vars
            .get(halo_params::BOOTSTRAP_SERVED.name)
            .map(|v| v.trim())
        {
            None | Some("0") | Some("") => false,
            Some("1") => true,
            Some(v) => {
                return Err(Error::invalid_argument(format!(
                    "HALO_BOOTSTRAP_SERVED={v:?}: expected 0 or 1"
                )));
            }
        };
        let (secret, secret_source) = super::secret::resolve(&vars, root, size)?;
        if secret_source == SecretSource::InsecureDerived {
            tracing::warn!(
                rank,
                %root,
                "HALO_SECRET={INSECURE_DERIVED}: this job's bootstrap is not authenticated; \
                 any user who can reach {root} can compute its secret and join it"
            );
        }
        Ok(EnvBootstrap {
            rank,
            size,
            root,
            secret,
            launcher,
            secret_source,
            timeout,
            root_served,
        })
    }

    /// Joins the job: rank 0 serves the root (binding the root address, or every
    /// interface on its port when that address is not local) unless the launcher does
    /// (`HALO_BOOTSTRAP_SERVED=1`), then every rank
    /// exchanges its payload. Returns every rank's payload in rank order.
    pub fn join(&self, payload: &[u8]) -> Result<Vec<Vec<u8>>> {
        if self.size == 1 {
            return Ok(vec![payload.to_vec()]);
        }
        let timeout = self.timeout;
        let root = if self.rank == 0 && !self.root_served {
            let server = RendezvousRoot::start(self.root, self.secret, Some(self.size), timeout)
                .or_else(|_| {
                    let any = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), self.root.port());
                    RendezvousRoot::start(any, self.secret, Some(self.size), timeout)
                })?;
            Some(server)
        } else {
            None
        };
        let out = exchange(
            self.root,
            &self.secret,
            self.rank,
            self.size,
            payload,
            timeout,
        );
        if let Some(server) = root {
            server.join()?;
        }
        out
    }
}
