//! Bringing up a fabric job: the address the network provider binds, the card
//! exchange through the bootstrap, the job's topology, and connecting every peer.

use super::card::Card;
use crate::error::{Error, Result};
use crate::transport::fabric::{FabricConfig, FabricTransport, this_process};

/// This host's name, as the kernel has it (per UTS namespace, so emulated hosts differ).
fn local_hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".into())
}

/// The local IP the kernel would use to reach `root` (a UDP "connect" sends nothing).
fn route_to(root: std::net::SocketAddr) -> Result<std::net::IpAddr> {
    let any: std::net::SocketAddr = if root.is_ipv4() {
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

/// The global topology of a fabric job: `spec` (a preset or a file, from
/// `HALO_TOPOLOGY`) when given, else one node per distinct host name, in order of
/// first appearance, with the commodity link classes.
fn job_topology(hosts: &[String], spec: &str) -> Result<halo_topology::Topology> {
    use halo_topology::{Topology, TopologySpec, commodity, spec::RankSpec};
    let n = hosts.len();
    if !spec.is_empty() {
        let t = if std::path::Path::new(spec).exists() {
            Topology::load(spec)?
        } else {
            Topology::preset(spec)?
        };
        if t.size() != n {
            return Err(Error::invalid_argument(format!(
                "HALO_TOPOLOGY={spec} describes {} ranks, but the job has {n}",
                t.size()
            )));
        }
        return Ok(t);
    }
    let mut order: Vec<&str> = Vec::new();
    let ranks = (0..n)
        .map(|r| {
            let node = match order.iter().position(|h| *h == hosts[r]) {
                Some(i) => i,
                None => {
                    order.push(&hosts[r]);
                    order.len() - 1
                }
            };
            RankSpec {
                rank: r as i64,
                host: Some(hosts[r].clone()),
                domains: [("node".to_string(), node as i64)].into_iter().collect(),
            }
        })
        .collect();
    let spec = TopologySpec {
        name: format!("{} ranks on {} hosts", n, order.len()),
        links: [
            ("device".to_string(), commodity::DEVICE),
            ("node".to_string(), commodity::NODE),
            ("system".to_string(), commodity::SYSTEM),
        ]
        .into_iter()
        .collect(),
        ranks,
        nics: Vec::new(),
    };
    Ok(spec.build()?)
}

/// Brings up the fabric transport of one rank: opens the endpoints, publishes this
/// rank's card through `join` (the bootstrap exchange), checks that every rank uses
/// the same topology, builds it and connects every peer.
pub(crate) fn establish(
    rank: usize,
    size: usize,
    root: Option<std::net::SocketAddr>,
    config: &FabricConfig,
    topology_spec: &str,
    join: impl FnOnce(&[u8]) -> Result<Vec<Vec<u8>>>,
) -> Result<(FabricTransport, halo_topology::Topology)> {
    // The network provider binds the address that reaches the bootstrap root (or,
    // without a root, the one that reaches HALO_BOOTSTRAP_ADDR, else the one bootstrap
    // would choose: HALO_SOCKET_IFNAME, else the first non-loopback interface).
    let ip = match (config.addr, root) {
        (Some(a), _) => a,
        _ if size == 1 => std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
        (None, Some(root)) => route_to(root)?,
        // Bootstrapped another way (MPI): HALO_BOOTSTRAP_ADDR, where a launcher set it,
        // is the job's root on another host for most ranks — bind what reaches it.
        (None, None) => match std::env::var("HALO_BOOTSTRAP_ADDR")
            .ok()
            .and_then(|v| super::parse_host_port(&v, 1).ok())
        {
            Some(root) => route_to(root)?,
            None => super::default_bootstrap_ip()?,
        },
    };
    let (mut transport, names) = FabricTransport::open(rank, size, config, &ip.to_string())?;
    let card = Card {
        host: local_hostname(),
        topology: topology_spec.to_string(),
        names,
        process: this_process(),
        bell: transport.bell_path(),
    };
    let cards: Vec<Card> = join(&card.encode())?
        .iter()
        .enumerate()
        .map(|(r, b)| Card::decode(r, b))
        .collect::<Result<_>>()?;
    // Every rank must describe the machine the same way.
    let differing: Vec<usize> = (0..size)
        .filter(|&r| cards[r].topology != cards[0].topology)
        .collect();
    if !differing.is_empty() {
        return Err(Error::InvalidUsage {
            peer: differing.first().copied(),
            message: format!(
                "ranks disagree on the topology: rank 0 uses {:?} but ranks {differing:?} use {:?}",
                cards[0].topology, cards[differing[0]].topology
            ),
        });
    }
    let hosts: Vec<String> = cards.iter().map(|c| c.host.clone()).collect();
    let topology = job_topology(&hosts, topology_spec)?;
    // Same host name and PID namespace: this rank can see the peer's process end.
    let mut procs = vec![None; size];
    if let Some((ns, _)) = &cards[rank].process {
        for (p, c) in cards.iter().enumerate() {
            if p != rank
                && c.host == cards[rank].host
                && let Some((pns, proc_)) = &c.process
                && pns == ns
            {
                procs[p] = Some(*proc_);
            }
        }
    }
    transport.watch_processes(procs);
    let names: Vec<[Option<Vec<u8>>; 2]> = cards.iter().map(|c| c.names.clone()).collect();
    transport.connect(&hosts, &names)?;
    // The bells of the peers reached over shared memory.
    let bells: Vec<Option<String>> = cards.iter().map(|c| c.bell.clone()).collect();
    transport.open_bells(&bells);
    Ok((transport, topology))
}
