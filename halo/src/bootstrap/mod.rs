//! Bootstrap: how the ranks of a job find each other before any collective runs.
//!
//! Every way in ends in one exchange: each rank hands a small payload (its card: its
//! host, its local topology, its fabric addresses) to a rendezvous root over TCP, and
//! gets back every rank's payload, in rank order. Then the transports take over.
//!
//! - **Unique id** (NCCL's way): one rank calls [`UniqueId::new`], which starts the
//!   rendezvous root on a thread of that process, and passes the 128-byte id to the
//!   others out of band (MPI_Bcast, a file, torch's store). The id holds the root's
//!   address and a random 32-byte secret. Rank and root prove to each other that they
//!   know it (HMAC-SHA256 over nonces from both sides, see `rendezvous`); the secret
//!   itself never goes on the wire, a rank gives its card only to a root that proved
//!   it, and connections that do not prove it are refused and logged.
//! - **Environment** ([`EnvBootstrap::detect`]): rank and size from `RANK`/`WORLD_SIZE`
//!   (torchrun), `OMPI_COMM_WORLD_RANK`/`_SIZE` (Open MPI), `PMI_RANK`/`PMI_SIZE` (MPICH,
//!   Cray PMI) or `SLURM_PROCID`/`SLURM_NTASKS` (srun); the root's address from
//!   `HALO_BOOTSTRAP_ADDR` (`ip:port`), else `MASTER_ADDR` and `MASTER_PORT + 1` (torch's
//!   own store keeps `MASTER_PORT`), else the first host of `SLURM_JOB_NODELIST` and port
//!   29511. Rank 0 runs the root. The secret (`secret.rs`) is `HALO_SECRET` (64 hex
//!   digits; `halo launch` sets a random one), else the per-user key file
//!   (`HALO_SECRET_FILE`, else `~/.config/halo/secret`, mode 0600, made by `halo secret
//!   init`) combined with the job's identity by HMAC; without either a job of more than
//!   one rank refuses to start, unless `HALO_SECRET=insecure-derived` opts into a secret
//!   anyone can compute (every rank then warns).
//! - **MPI** (cargo feature `mpi`, through the `mpi` crate): `exchange_mpi` gathers
//!   the payloads with `MPI_Allgatherv` over an MPI communicator the caller initialised.
//!
//! The payload is a rank's *card*, bytes to the bootstrap: the transport layer makes
//! and reads it (`transport/card.rs`) and connects the transports around the exchange
//! (`transport/connect.rs`), given a `join` that runs it. The bootstrap also chooses
//! the address the network provider binds (`bind_ip`: the one that reaches the root).

mod env;
#[cfg(feature = "mpi")]
mod mpi;
mod rendezvous;
mod root;
mod secret;
mod wire;

#[doc(hidden)]
pub use root::root_handshake_for_fuzzing;

pub use env::{DEFAULT_BOOTSTRAP_PORT, EnvBootstrap, EnvSource};
#[cfg(feature = "mpi")]
pub use mpi::exchange_mpi;
pub use rendezvous::{MAX_PENDING, RendezvousRoot, bootstrap_timeout, exchange};
pub use secret::{
    DEFAULT_KEY_FILE, INSECURE_DERIVED, SECRET_FILE_VAR, SecretSource, create_key_file,
    insecure_derived_secret, key_file_path, read_key_file,
};

use crate::error::{Error, Result};

pub(crate) fn sys_err(message: impl Into<String>) -> Error {
    Error::SystemError {
        message: message.into(),
    }
}
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// Bytes in a [`UniqueId`], as NCCL's `ncclUniqueId`.
pub const UNIQUE_ID_BYTES: usize = 128;

const MAGIC: &[u8; 4] = b"HALO";
const ID_VERSION: u8 = 1;

/// The job's shared secret: 32 random bytes.
pub type Secret = [u8; 32];

/// An opaque 128-byte value that lets ranks find the rendezvous root: its address
/// and the job's secret. Create it on one rank with [`UniqueId::new`] and pass it to
/// the others out of band.
///
/// Layout (stable): `"HALO"`, version, address family (4 or 6), port (u16 LE),
/// 16 address bytes, 32 secret bytes, zero padding.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct UniqueId([u8; UNIQUE_ID_BYTES]);

impl std::fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the secret.
        f.debug_struct("UniqueId")
            .field("root", &self.root())
            .finish_non_exhaustive()
    }
}

impl UniqueId {
    /// Starts a rendezvous root on this process and returns its id. The root binds the
    /// address [`default_bootstrap_ip`] chooses, on a free port; the root thread ends
    /// once every rank of the job has been answered (or after its timeout).
    pub fn new() -> Result<UniqueId> {
        Self::new_on(SocketAddr::new(default_bootstrap_ip()?, 0))
    }

    /// Starts a rendezvous root bound to `addr` (port 0 picks a free port).
    pub fn new_on(addr: SocketAddr) -> Result<UniqueId> {
        let secret = random_secret()?;
        let root = RendezvousRoot::start(addr, secret, None, rendezvous::bootstrap_timeout())?;
        let id = UniqueId::from_parts(root.local_addr(), &secret);
        root.detach();
        Ok(id)
    }

    /// Builds an id from a root address and a secret (no root is started).
    pub fn from_parts(root: SocketAddr, secret: &Secret) -> UniqueId {
        let mut b = [0u8; UNIQUE_ID_BYTES];
        b[..4].copy_from_slice(MAGIC);
        b[4] = ID_VERSION;
        let (fam, ip) = match root.ip() {
            IpAddr::V4(v4) => (4u8, v4.to_ipv6_mapped().octets()),
            IpAddr::V6(v6) => (6u8, v6.octets()),
        };
        b[5] = fam;
        b[6..8].copy_from_slice(&root.port().to_le_bytes());
        b[8..24].copy_from_slice(&ip);
        b[24..56].copy_from_slice(secret);
        UniqueId(b)
    }

    /// Reads an id from bytes, checking its header.
    pub fn from_bytes(bytes: &[u8]) -> Result<UniqueId> {
        let arr: [u8; UNIQUE_ID_BYTES] = bytes.try_into().map_err(|_| {
            Error::invalid_argument(format!(
                "a unique id is {UNIQUE_ID_BYTES} bytes, got {}",
                bytes.len()
            ))
        })?;
        if &arr[..4] != MAGIC || arr[4] != ID_VERSION || !matches!(arr[5], 4 | 6) {
            return Err(Error::invalid_argument(
                "not a HALO unique id (bad magic or version): was it created by haloGetUniqueId / UniqueId::new?",
            ));
        }
        Ok(UniqueId(arr))
    }

    /// The raw bytes.
    pub fn as_bytes(&self) -> &[u8; UNIQUE_ID_BYTES] {
        &self.0
    }

    /// The rendezvous root's address.
    pub fn root(&self) -> SocketAddr {
        let port = u16::from_le_bytes([self.0[6], self.0[7]]);
        let octets: [u8; 16] = self.0[8..24].try_into().expect("16 bytes");
        let v6 = Ipv6Addr::from(octets);
        let ip = match (self.0[5], v6.to_ipv4_mapped()) {
            (4, Some(v4)) => IpAddr::V4(v4),
            _ => IpAddr::V6(v6),
        };
        SocketAddr::new(ip, port)
    }

    /// The job's secret.
    pub fn secret(&self) -> Secret {
        self.0[24..56].try_into().expect("32 bytes")
    }
}

/// 32 random bytes from the operating system.
pub fn random_secret() -> Result<Secret> {
    let mut s = [0u8; 32];
    getrandom::fill(&mut s)
        .map_err(|e| sys_err(format!("cannot get random bytes for the job secret: {e}")))?;
    Ok(s)
}

/// The most ranks a job may have (2^20 = 1,048,576): larger world sizes are refused
/// before anything is allocated for them (docs/RELIABILITY.md, "Limits").
pub const MAX_RANKS: usize = 1 << 20;

/// Refuses a world size above [`MAX_RANKS`]; `what` names where it came from.
pub(crate) fn check_world_size(size: usize, what: &str) -> crate::Result<()> {
    if size > MAX_RANKS {
        return Err(crate::Error::invalid_argument(format!(
            "{what} is {size}: at most {MAX_RANKS} ranks (2^20) are supported"
        )));
    }
    Ok(())
}

/// The address a rendezvous root binds by default: `HALO_BOOTSTRAP_ADDR`'s IP if set,
/// else the IPv4 address of the interface named by `HALO_SOCKET_IFNAME` (like
/// `NCCL_SOCKET_IFNAME`), else the first non-loopback IPv4 interface that is up, else
/// 127.0.0.1.
pub fn default_bootstrap_ip() -> Result<IpAddr> {
    if let Some(v) = halo_params::BOOTSTRAP_ADDR.raw() {
        return parse_host_port(&v, 0).map(|a| a.ip());
    }
    let ifs = crate::transport::sys::interfaces()
        .map_err(|e| sys_err(format!("cannot list network interfaces: {e}")))?;
    if let Some(name) = halo_params::SOCKET_IFNAME.raw() {
        return ifs
            .iter()
            .find(|i| i.name == name && i.ip.is_ipv4())
            .map(|i| i.ip)
            .ok_or_else(|| {
                Error::invalid_argument(format!(
                    "HALO_SOCKET_IFNAME={name}: no such interface with an IPv4 address"
                ))
            });
    }
    Ok(ifs
        .iter()
        .find(|i| !i.loopback && i.ip.is_ipv4())
        .map(|i| i.ip)
        .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST)))
}

/// The local IP the kernel would use to reach `root` (a UDP "connect" sends nothing).
fn route_to(root: SocketAddr) -> Result<IpAddr> {
    let any: SocketAddr = if root.is_ipv4() {
        "0.0.0.0:0"
    } else {
        "[::]:0"
    }
    .parse()
    .expect("literal address");
    let s = std::net::UdpSocket::bind(any).map_err(|e| Error::SystemError {
        message: format!("cannot open a UDP socket to find the local address: {e}"),
    })?;
    s.connect(root).map_err(|e| Error::SystemError {
        message: format!("no route to the bootstrap root {root}: {e}"),
    })?;
    Ok(s.local_addr()
        .map_err(|e| Error::SystemError {
            message: format!("local address: {e}"),
        })?
        .ip())
}

/// The address the network provider of a job of `size` ranks binds: `addr`
/// (`HALO_FABRIC_ADDR`) when given, 127.0.0.1 for one rank, else the one that reaches
/// the bootstrap root (or, without a root, the one that reaches HALO_BOOTSTRAP_ADDR,
/// else the one [`default_bootstrap_ip`] chooses: HALO_SOCKET_IFNAME, else the first
/// non-loopback interface).
pub(crate) fn bind_ip(
    addr: Option<IpAddr>,
    size: usize,
    root: Option<SocketAddr>,
) -> Result<IpAddr> {
    Ok(match (addr, root) {
        (Some(a), _) => a,
        _ if size == 1 => IpAddr::V4(Ipv4Addr::LOCALHOST),
        (None, Some(root)) => route_to(root)?,
        // Bootstrapped another way (MPI): HALO_BOOTSTRAP_ADDR, where a launcher set
        // it, is the job's root on another host for most ranks — bind what reaches it.
        (None, None) => match halo_params::BOOTSTRAP_ADDR
            .raw()
            .and_then(|v| parse_host_port(&v, 1).ok())
        {
            Some(root) => route_to(root)?,
            None => default_bootstrap_ip()?,
        },
    })
}

/// Parses `ip`, `ip:port`, `[v6]:port` or `host[:port]` (resolved), with a default port.
pub fn parse_host_port(s: &str, default_port: u16) -> Result<SocketAddr> {
    use std::net::ToSocketAddrs;
    let s = s.trim();
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(a);
    }
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, default_port));
    }
    let with_port = if s
        .rsplit_once(':')
        .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
    {
        s.to_string()
    } else {
        format!("{s}:{default_port}")
    };
    with_port
        .to_socket_addrs()
        .map_err(|e| {
            Error::invalid_argument(format!("cannot resolve bootstrap address '{s}': {e}"))
        })?
        .find(|a| a.is_ipv4())
        .ok_or_else(|| {
            Error::invalid_argument(format!("bootstrap address '{s}' has no IPv4 address"))
        })
}
