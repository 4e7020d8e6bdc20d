//! Bringing up a job of processes: the address the network provider binds, the
//! shared-memory segment, the card exchange through the bootstrap, the job's
//! topology, the choice of transport, and connecting every peer.

use super::card::Card;
use crate::error::{Error, Result};
use crate::transport::Backend;
use crate::transport::fabric::{FabricConfig, FabricTransport, this_process};
use crate::transport::shm::{Segment, ShmTransport, TransportChoice};

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

/// Brings up the transport of one rank: opens the fabric endpoints (unless
/// `HALO_TRANSPORT=shm`) and, on rank 0, the shared-memory segment (unless the
/// fabric is forced), publishes this rank's card through `join` (the bootstrap
/// exchange), checks that every rank uses the same topology, builds it, and chooses:
/// HALO's shared-memory transport when every rank is on this host and none forces
/// the fabric, else the fabric transport, connected to every peer.
pub(crate) fn establish(
    rank: usize,
    size: usize,
    root: Option<std::net::SocketAddr>,
    config: &FabricConfig,
    choice: TransportChoice,
    topology_spec: &str,
    join: impl FnOnce(&[u8]) -> Result<Vec<Vec<u8>>>,
) -> Result<(Backend, halo_topology::Topology)> {
    // What this rank allows: forcing a libfabric provider means libfabric.
    let effective = match choice {
        TransportChoice::Auto if size < 2 || config.local_provider.is_none() => {
            TransportChoice::Fabric
        }
        c => c,
    };
    if effective == TransportChoice::Shm && size < 2 {
        return Err(Error::invalid_argument(
            "HALO_TRANSPORT=shm needs at least 2 ranks",
        ));
    }
    let segment = match (effective, rank) {
        (TransportChoice::Fabric, _) | (_, 1..) => None,
        (_, 0) => match Segment::create(size) {
            Ok(s) => Some(s),
            Err(e) if effective == TransportChoice::Auto => {
                tracing::info!("no shared-memory transport for this job: {e}");
                None
            }
            Err(e) => return Err(e.into()),
        },
    };
    let mut fabric = None;
    let mut names = [None, None];
    if effective != TransportChoice::Shm {
        // The network provider binds the address that reaches the bootstrap root (or,
        // without a root, the one that reaches HALO_BOOTSTRAP_ADDR, else the one
        // bootstrap would choose: HALO_SOCKET_IFNAME, else the first non-loopback
        // interface).
        let ip = match (config.addr, root) {
            (Some(a), _) => a,
            _ if size == 1 => std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
            (None, Some(root)) => route_to(root)?,
            // Bootstrapped another way (MPI): HALO_BOOTSTRAP_ADDR, where a launcher set
            // it, is the job's root on another host for most ranks — bind what reaches it.
            (None, None) => match std::env::var("HALO_BOOTSTRAP_ADDR")
                .ok()
                .and_then(|v| super::parse_host_port(&v, 1).ok())
            {
                Some(root) => route_to(root)?,
                None => super::default_bootstrap_ip()?,
            },
        };
        let (t, n) = FabricTransport::open(rank, size, config, &ip.to_string())?;
        fabric = Some(t);
        names = n;
    }
    let card = Card {
        host: local_hostname(),
        topology: topology_spec.to_string(),
        names,
        process: this_process(),
        bell: fabric.as_ref().and_then(FabricTransport::bell_path),
        shm: segment.as_ref().map(|s| s.path().to_string()),
        transport: Some(effective.to_string()),
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
    if use_shm(&cards)? {
        let seg = match segment {
            Some(s) => s,
            None => Segment::open(cards[0].shm.as_deref().expect("checked"), size)?,
        };
        // The fabric endpoints of an `auto` rank are not needed.
        drop(fabric);
        let t = ShmTransport::new(rank, size, seg, procs)?;
        return Ok((Backend::Shm(Box::new(t)), topology));
    }
    // Rank 0's segment, unused, goes (its drop removes the file).
    drop(segment);
    let Some(mut transport) = fabric else {
        return Err(Error::internal("fabric transport not opened"));
    };
    transport.watch_processes(procs);
    let names: Vec<[Option<Vec<u8>>; 2]> = cards.iter().map(|c| c.names.clone()).collect();
    transport.connect(&hosts, &names)?;
    // The bells of the peers reached over shared memory.
    let bells: Vec<Option<String>> = cards.iter().map(|c| c.bell.clone()).collect();
    transport.open_bells(&bells);
    Ok((Backend::Fabric(Box::new(transport)), topology))
}

/// Whether the job runs on HALO's shared-memory transport, from every rank's card (so
/// that every rank decides alike): yes when every rank is on one host (same host name
/// and PID namespace), none says `fabric` and rank 0 made a segment; an error when a
/// rank says `shm` and that cannot be.
fn use_shm(cards: &[Card]) -> Result<bool> {
    let says = |t: &str| -> Vec<usize> {
        (0..cards.len())
            .filter(|&r| cards[r].transport.as_deref() == Some(t))
            .collect()
    };
    let (shm, fabric) = (says("shm"), says("fabric"));
    let ns = |c: &Card| c.process.as_ref().map(|(ns, _)| ns.clone());
    let apart: Vec<usize> = (0..cards.len())
        .filter(|&r| {
            cards[r].host != cards[0].host
                || ns(&cards[r]).is_none()
                || ns(&cards[r]) != ns(&cards[0])
        })
        .collect();
    let ok = fabric.is_empty() && apart.is_empty() && cards[0].shm.is_some();
    if !shm.is_empty() && !ok {
        let why = if let Some(&f) = fabric.first() {
            format!(
                "rank {f} uses the fabric (HALO_TRANSPORT=fabric, or a provider forced with HALO_FABRIC_PROVIDER)"
            )
        } else if let Some(&a) = apart.first() {
            format!(
                "rank {a} is on host {:?} (or in another PID namespace), rank 0 on {:?}",
                cards[a].host, cards[0].host
            )
        } else {
            "rank 0 could not create the shared-memory segment (see its log)".to_string()
        };
        return Err(Error::InvalidUsage {
            peer: fabric.first().or(apart.first()).copied(),
            message: format!(
                "rank {} asked for HALO_TRANSPORT=shm, which needs every rank on one host \
                 and none forcing the fabric, but {why}",
                shm[0]
            ),
        });
    }
    Ok(ok)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::fabric::Proc;

    fn card(host: &str, ns: &str, transport: &str, shm: Option<&str>) -> Card {
        Card {
            host: host.into(),
            topology: String::new(),
            names: [None, None],
            process: Some((ns.into(), Proc { pid: 7, start: 1 })),
            bell: None,
            shm: shm.map(str::to_string),
            transport: Some(transport.into()),
        }
    }

    const SEG: Option<&str> = Some("/dev/shm/halo-shm-1-2-0");

    #[test]
    fn one_host_auto_uses_shm_every_rank_deciding_alike() {
        let cards = vec![
            card("a", "pid:[1]", "auto", SEG),
            card("a", "pid:[1]", "auto", None),
            card("a", "pid:[1]", "shm", None),
        ];
        assert!(use_shm(&cards).unwrap());
    }

    #[test]
    fn another_host_a_forced_fabric_or_no_segment_means_the_fabric() {
        for cards in [
            vec![
                card("a", "pid:[1]", "auto", SEG),
                card("b", "pid:[1]", "auto", None),
            ],
            vec![
                card("a", "pid:[1]", "auto", SEG),
                card("a", "pid:[2]", "auto", None),
            ],
            vec![
                card("a", "pid:[1]", "auto", SEG),
                card("a", "pid:[1]", "fabric", None),
            ],
            vec![
                card("a", "pid:[1]", "auto", None),
                card("a", "pid:[1]", "auto", None),
            ],
        ] {
            assert!(!use_shm(&cards).unwrap(), "{cards:?}");
        }
    }

    #[test]
    fn forced_shm_that_cannot_be_is_an_error_naming_why() {
        let cases = [
            (
                vec![
                    card("a", "pid:[1]", "shm", SEG),
                    card("b", "pid:[1]", "shm", None),
                ],
                "rank 1 is on host \"b\"",
            ),
            (
                vec![
                    card("a", "pid:[1]", "shm", SEG),
                    card("a", "pid:[1]", "fabric", None),
                ],
                "rank 1 uses the fabric",
            ),
            (
                vec![
                    card("a", "pid:[1]", "auto", None),
                    card("a", "pid:[1]", "shm", None),
                ],
                "rank 0 could not create",
            ),
        ];
        for (cards, why) in cases {
            match use_shm(&cards) {
                Err(Error::InvalidUsage { message, .. }) => {
                    assert!(
                        message.contains("HALO_TRANSPORT=shm") && message.contains(why),
                        "{message}"
                    )
                }
                other => panic!("{why}: {other:?}"),
            }
        }
    }
}
