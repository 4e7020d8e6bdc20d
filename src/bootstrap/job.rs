//! Bringing up a job of processes: the address the network provider binds, the
//! shared-memory segments (one per host), the card exchange through the bootstrap,
//! the job's topology, the choice of transport per pair of ranks, and connecting
//! every peer.

use super::card::Card;
use crate::error::{Error, Result};
use crate::host::proc::this_process;
use crate::transport::Backend;
use crate::transport::fabric::{FabricConfig, FabricTransport, LOCAL};
use crate::transport::hybrid::HybridTransport;
use crate::transport::shm::{Reservation, Segment, ShmTransport, TransportChoice};

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

/// Brings up the transport of one rank: opens the fabric endpoints and reserves a
/// shared-memory segment file (each unless `HALO_TRANSPORT` rules it out), publishes
/// this rank's card through `join` (the bootstrap exchange), checks that every rank
/// uses the same topology, builds it, and chooses from every rank's card
/// ([`plan`]): the ranks of each host share a segment of HALO's shared-memory rings
/// (sized by the lowest of them) unless a rank forces the fabric; the fabric
/// transport carries every other pair. A one-host job on the rings gets the
/// shared-memory transport alone, a job without any the fabric transport, and a
/// rank with both the hybrid transport.
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
    let mut reservation = match effective {
        TransportChoice::Fabric => None,
        _ => match Segment::reserve() {
            Ok(s) => Some(s),
            Err(e) if effective == TransportChoice::Auto => {
                tracing::info!("no shared-memory transport for this rank: {e}");
                None
            }
            Err(e) => return Err(e.into()),
        },
    };
    // `shm`: same-host peers are all on the rings, so libfabric's own shared memory
    // is not opened; the network provider still is, for peers on other hosts.
    let mut shm_config;
    let config = if effective == TransportChoice::Shm && config.local_provider.is_some() {
        shm_config = config.clone();
        shm_config.local_provider = None;
        &shm_config
    } else {
        config
    };
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
        (None, None) => match halo_params::BOOTSTRAP_ADDR
            .raw()
            .and_then(|v| super::parse_host_port(&v, 1).ok())
        {
            Some(root) => route_to(root)?,
            None => super::default_bootstrap_ip()?,
        },
    };
    let (mut fabric, names) = FabricTransport::open(rank, size, config, &ip.to_string())?;
    let card = Card {
        host: local_hostname(),
        topology: topology_spec.to_string(),
        names,
        process: this_process(),
        bell: fabric.bell_path(),
        shm: reservation.as_ref().map(Reservation::path),
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
    let groups = plan(&cards)?;
    let group = groups.into_iter().find(|g| g.contains(&rank));
    let Some(group) = group else {
        // No ring for this rank: the fabric for every peer.
        drop(reservation);
        fabric.watch_processes(procs);
        let names: Vec<[Option<Vec<u8>>; 2]> = cards.iter().map(|c| c.names.clone()).collect();
        fabric.connect(&hosts, &names)?;
        // The bells of the peers reached over shared memory.
        let bells: Vec<Option<String>> = cards.iter().map(|c| c.bell.clone()).collect();
        fabric.open_bells(&bells);
        return Ok((Backend::Fabric(Box::new(fabric)), topology));
    };
    // The lowest rank of the group sizes its reserved file; the others open it once it
    // has (and remove their own).
    let leader = group[0];
    let seg = if leader == rank {
        reservation
            .take()
            .ok_or_else(|| Error::internal("shm group leader without a reserved segment"))?
            .into_segment(group.len())?
    } else {
        drop(reservation);
        let path = cards[leader]
            .shm
            .as_deref()
            .ok_or_else(|| Error::internal("shm group leader without a segment"))?;
        let watched = procs[leader];
        Segment::open_when_ready(
            path,
            group.len(),
            crate::bootstrap::bootstrap_timeout(),
            || watched.is_some_and(crate::host::proc::has_ended),
        )?
    };
    let shm = ShmTransport::new_group(
        rank,
        size,
        &group,
        seg,
        procs.clone(),
        crate::bootstrap::bootstrap_timeout(),
    )?;
    if group.len() == size {
        // The fabric endpoints of an `auto` rank are not needed.
        drop(fabric);
        return Ok((Backend::Shm(Box::new(shm)), topology));
    }
    // The fabric keeps the other pairs; the ranks of the group are not inserted into
    // its shared-memory address vector, nor watched by it.
    for &p in &group {
        procs[p] = None;
    }
    fabric.watch_processes(procs);
    let names: Vec<[Option<Vec<u8>>; 2]> = cards
        .iter()
        .enumerate()
        .map(|(p, c)| {
            let mut n = c.names.clone();
            if group.contains(&p) {
                n[LOCAL] = None;
            }
            n
        })
        .collect();
    fabric.connect(&hosts, &names)?;
    let bells: Vec<Option<String>> = cards.iter().map(|c| c.bell.clone()).collect();
    fabric.open_bells(&bells);
    Ok((
        Backend::Hybrid(Box::new(HybridTransport::new(shm, fabric))),
        topology,
    ))
}

/// The groups of ranks that share a segment of HALO's shared-memory rings, from every
/// rank's card (so that every rank decides alike): the ranks of each host (same host
/// name and PID namespace), when there are at least two, none of the job's ranks
/// forces the fabric, and each of them reserved a segment file. Each group is
/// ascending; its first rank makes the segment. An error when a rank says `shm` and a
/// host's ranks cannot share one.
fn plan(cards: &[Card]) -> Result<Vec<Vec<usize>>> {
    let says = |t: &str| -> Vec<usize> {
        (0..cards.len())
            .filter(|&r| cards[r].transport.as_deref() == Some(t))
            .collect()
    };
    let (shm, fabric) = (says("shm"), says("fabric"));
    let refuse = |peer: usize, why: String| Error::InvalidUsage {
        peer: Some(peer),
        message: format!(
            "rank {} asked for HALO_TRANSPORT=shm, which needs the ranks of each host on \
             HALO's shared memory and none forcing the fabric, but {why}",
            shm[0]
        ),
    };
    if let Some(&f) = fabric.first() {
        if !shm.is_empty() {
            return Err(refuse(
                f,
                format!(
                    "rank {f} uses the fabric (HALO_TRANSPORT=fabric, or a provider forced \
                     with HALO_FABRIC_PROVIDER)"
                ),
            ));
        }
        return Ok(Vec::new());
    }
    let mut hosts: Vec<((&str, &str), Vec<usize>)> = Vec::new();
    for (r, c) in cards.iter().enumerate() {
        let Some((ns, _)) = &c.process else {
            continue;
        };
        let key = (c.host.as_str(), ns.as_str());
        match hosts.iter_mut().find(|(k, _)| *k == key) {
            Some((_, ranks)) => ranks.push(r),
            None => hosts.push((key, vec![r])),
        }
    }
    let mut groups = Vec::new();
    for ((host, _), ranks) in hosts {
        if ranks.len() < 2 {
            continue;
        }
        match ranks.iter().find(|&&r| cards[r].shm.is_none()) {
            None => groups.push(ranks),
            Some(&r) if !shm.is_empty() => {
                return Err(refuse(
                    r,
                    format!(
                        "rank {r} (on host {host:?}) could not create its shared-memory \
                         segment file (see its log)"
                    ),
                ));
            }
            Some(_) => {}
        }
    }
    Ok(groups)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::proc::Proc;

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

    const SEG: Option<&str> = Some("/dev/shm/halo-shm-1-2-0-0123456789abcdef");

    #[test]
    fn one_host_auto_uses_shm_every_rank_deciding_alike() {
        let cards = vec![
            card("a", "pid:[1]", "auto", SEG),
            card("a", "pid:[1]", "auto", SEG),
            card("a", "pid:[1]", "shm", SEG),
        ];
        assert_eq!(plan(&cards).unwrap(), vec![vec![0, 1, 2]]);
    }

    #[test]
    fn each_hosts_ranks_share_a_segment_and_the_rest_is_the_fabric() {
        // Ranks interleaved over hosts a, b, c; c has one rank; d's ranks are in two
        // PID namespaces (they cannot see each other's processes).
        let cards = vec![
            card("a", "pid:[1]", "auto", SEG),
            card("b", "pid:[1]", "auto", SEG),
            card("a", "pid:[1]", "shm", SEG),
            card("c", "pid:[1]", "auto", SEG),
            card("b", "pid:[1]", "auto", SEG),
            card("a", "pid:[1]", "auto", SEG),
            card("d", "pid:[1]", "auto", SEG),
            card("d", "pid:[2]", "auto", SEG),
        ];
        assert_eq!(plan(&cards).unwrap(), vec![vec![0, 2, 5], vec![1, 4]]);
        // A host whose rank has no segment file: that host's pairs use the fabric.
        let mut c = cards.clone();
        c[2].transport = Some("auto".into());
        c[4].shm = None;
        assert_eq!(plan(&c).unwrap(), vec![vec![0, 2, 5]]);
    }

    #[test]
    fn a_forced_fabric_or_no_segment_means_the_fabric() {
        for cards in [
            vec![
                card("a", "pid:[1]", "auto", SEG),
                card("b", "pid:[1]", "auto", SEG),
            ],
            vec![
                card("a", "pid:[1]", "auto", SEG),
                card("a", "pid:[2]", "auto", SEG),
            ],
            vec![
                card("a", "pid:[1]", "auto", SEG),
                card("a", "pid:[1]", "fabric", None),
            ],
            vec![
                card("a", "pid:[1]", "auto", SEG),
                card("a", "pid:[1]", "auto", None),
            ],
            // One rank forcing the fabric turns the rings off for the whole job.
            vec![
                card("a", "pid:[1]", "auto", SEG),
                card("a", "pid:[1]", "auto", SEG),
                card("b", "pid:[1]", "fabric", None),
            ],
        ] {
            assert!(plan(&cards).unwrap().is_empty(), "{cards:?}");
        }
    }

    #[test]
    fn forced_shm_is_for_same_host_pairs_and_an_error_when_they_cannot() {
        // Across hosts: the rings inside each, nothing wrong.
        let cards = vec![
            card("a", "pid:[1]", "shm", SEG),
            card("a", "pid:[1]", "shm", SEG),
            card("b", "pid:[1]", "shm", SEG),
        ];
        assert_eq!(plan(&cards).unwrap(), vec![vec![0, 1]]);
        let cases = [
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
                    card("a", "pid:[1]", "shm", SEG),
                ],
                "rank 0 (on host \"a\") could not create",
            ),
        ];
        for (cards, why) in cases {
            match plan(&cards) {
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
