//! Creating communicators over real processes: NCCL's `ncclCommInitRank` with a
//! [`UniqueId`], or from the launcher's environment.

use super::Communicator;
use crate::bootstrap::{EnvBootstrap, EnvSource, UniqueId, bind_ip, bootstrap_timeout, exchange};
use crate::error::{Error, Result};
use crate::transport::Backend;
use crate::transport::connect::{Setup, connect};
use crate::transport::fabric::FabricConfig;
use crate::transport::shm::TransportChoice;
use halo_collectives::Algorithm;
use std::sync::Arc;
use std::time::Duration;

/// How a communicator is set up; [`InitConfig::from_env`] reads the `HALO_*` variables.
#[derive(Debug, Clone, PartialEq)]
pub struct InitConfig {
    /// Which libfabric providers carry messages.
    pub fabric: FabricConfig,
    /// A topology preset or file describing the job (`HALO_TOPOLOGY`); empty: one
    /// node per host name, found at bootstrap. Every rank must give the same value.
    pub topology: String,
    /// Per-operation timeout (`HALO_TIMEOUT_MS`, default 60 s).
    pub timeout: Duration,
    /// How long ranks wait for each other at bootstrap (`HALO_BOOTSTRAP_TIMEOUT_MS`, default 120 s).
    pub bootstrap_timeout: Duration,
    /// Force an algorithm (`HALO_ALGO`: flat, pairwise, bruck, halo, halo2d; default automatic).
    pub algorithm: Option<Algorithm>,
    /// Which transport carries the messages (`HALO_TRANSPORT`: auto, shm, fabric):
    /// by default HALO's shared-memory transport between the ranks of each host, and
    /// libfabric between hosts.
    pub transport: TransportChoice,
}

impl Default for InitConfig {
    fn default() -> Self {
        InitConfig {
            fabric: FabricConfig::default(),
            topology: String::new(),
            timeout: super::DEFAULT_TIMEOUT,
            bootstrap_timeout: Duration::from_secs(120),
            algorithm: None,
            transport: TransportChoice::Auto,
        }
    }
}

impl InitConfig {
    /// The defaults, changed by `HALO_FABRIC_PROVIDER`, `HALO_FABRIC_NET_PROVIDER`,
    /// `HALO_FABRIC_ADDR`, `HALO_TRANSPORT`, `HALO_TOPOLOGY`, `HALO_TIMEOUT_MS`, `HALO_BOOTSTRAP_TIMEOUT_MS`
    /// and `HALO_ALGO` (and checks `HALO_BARRIER_ALGO`, which the barrier reads). A
    /// malformed value is an error naming the variable.
    pub fn from_env() -> Result<InitConfig> {
        let ms = |p: &halo_params::Param| -> Result<Option<Duration>> {
            p.number()
                .map(|m| m.map(Duration::from_millis))
                .map_err(|e| Error::invalid_argument(e.to_string()))
        };
        let mut c = InitConfig {
            fabric: FabricConfig::from_env()?,
            topology: halo_params::TOPOLOGY.raw().unwrap_or_default(),
            bootstrap_timeout: bootstrap_timeout(),
            ..InitConfig::default()
        };
        if let Some(t) = ms(&halo_params::TIMEOUT_MS)? {
            c.timeout = t;
        }
        if let Some(t) = ms(&halo_params::BOOTSTRAP_TIMEOUT_MS)? {
            c.bootstrap_timeout = t;
        }
        if let Some(t) = halo_params::TRANSPORT.raw() {
            c.transport = t.parse()?;
        }
        super::forced_barrier()
            .map_err(|e| Error::invalid_argument(format!("HALO_BARRIER_ALGO: {e}")))?;
        if let Some(a) = halo_params::ALGO.raw()
            && a != "auto"
        {
            c.algorithm = Some(a.parse().map_err(|e: halo_collectives::CollectiveError| {
                Error::invalid_argument(format!("HALO_ALGO: {e}"))
            })?);
        }
        Ok(c)
    }
}

impl Communicator {
    /// Joins the job identified by `id` as `rank` of `nranks` (NCCL's
    /// `ncclCommInitRank`), configured from the environment ([`InitConfig::from_env`]).
    /// Every rank of the job must call it; it returns once all have joined.
    pub fn init_rank(id: &UniqueId, nranks: usize, rank: usize) -> Result<Communicator> {
        Self::init_rank_with(id, nranks, rank, &InitConfig::from_env()?)
    }

    /// [`Communicator::init_rank`] with an explicit configuration.
    pub fn init_rank_with(
        id: &UniqueId,
        nranks: usize,
        rank: usize,
        config: &InitConfig,
    ) -> Result<Communicator> {
        super::check_world_size(nranks, "nranks")?;
        if nranks == 0 || rank >= nranks {
            return Err(Error::invalid_argument(format!(
                "rank {rank} out of range for {nranks} ranks"
            )));
        }
        let (root, secret) = (id.root(), id.secret());
        let timeout = config.bootstrap_timeout;
        let join = |card: &[u8]| exchange(root, &secret, rank, nranks, card, timeout);
        Self::establish(rank, nranks, Some(root), config, join)
    }

    /// Joins the job the launcher describes in the environment: torchrun, Open MPI,
    /// MPICH/PMI or Slurm (see [`crate::bootstrap`]).
    pub fn init_from_env() -> Result<Communicator> {
        // Refuses a world size above MAX_RANKS, naming the variable, before the secret.
        let b = EnvBootstrap::detect(&EnvSource::Process)?;
        let config = InitConfig::from_env()?;
        Self::establish(b.rank, b.size, Some(b.root), &config, |card: &[u8]| {
            b.join(card)
        })
    }

    fn establish(
        rank: usize,
        size: usize,
        root: Option<std::net::SocketAddr>,
        config: &InitConfig,
        join: impl FnOnce(&[u8]) -> Result<Vec<Vec<u8>>>,
    ) -> Result<Communicator> {
        let setup = Setup {
            rank,
            size,
            ip: bind_ip(config.fabric.addr, size, root)?,
            fabric: &config.fabric,
            choice: config.transport,
            topology: &config.topology,
            // HALO_BOOTSTRAP_TIMEOUT_MS (not `config.bootstrap_timeout`, as before).
            timeout: bootstrap_timeout(),
        };
        let (backend, topology) = connect(&setup, join)?;
        let mut comm = Communicator::from_backend(backend, rank, size, Arc::new(topology));
        comm.set_timeout(config.timeout);
        comm.set_algorithm(config.algorithm);
        tracing::info!(rank, size, topology = %comm.topology().name(), "communicator ready");
        Ok(comm)
    }

    /// Joins the job through MPI (cargo feature `mpi`): every rank of `world` calls it;
    /// the ranks exchange their cards with `MPI_Allgatherv` instead of a rendezvous
    /// root. The HALO communicator has `world`'s ranks and size; its messages go over
    /// libfabric like every other communicator's (MPI only carries the bootstrap).
    #[cfg(feature = "mpi")]
    pub fn init_mpi<C: mpi::traits::Communicator>(world: &C) -> Result<Communicator> {
        let config = InitConfig::from_env()?;
        let (rank, size) = (world.rank() as usize, world.size() as usize);
        Self::establish(rank, size, None, &config, |card: &[u8]| {
            crate::bootstrap::exchange_mpi(world, card)
        })
    }

    /// The libfabric provider that carries this rank's messages to `peer`, or
    /// `"halo-shm"` for HALO's shared-memory rings (`None` on the in-process transport).
    pub fn provider_to(&self, peer: usize) -> Option<&str> {
        match &self.core.backend {
            Backend::Fabric(t) => t.provider_to(peer),
            Backend::Shm(t) => {
                use halo_collectives::Transport as _;
                (peer < t.size() && peer != t.rank()).then_some(crate::transport::shm::PROVIDER)
            }
            Backend::Hybrid(t) => t.provider_to(peer),
            Backend::Local(_) => None,
            Backend::Shared(s) => s.provider_to(peer),
        }
    }
}
