//! Transport set-up for a job of processes (NCCL's `transport.cc`): this rank's fabric
//! endpoints and shared-memory segment file, its card, and, from every rank's card
//! (exchanged by the bootstrap, which carries them as bytes and nothing else), the
//! job's topology, the choice of backend per pair of ranks and connecting every peer.
//!
//! The choice is one ordered table, [`BACKENDS`]: a pair of ranks goes to the first
//! backend that can connect it, each answering from the two ranks' cards alone, so
//! every rank decides alike — HALO's shared-memory rings for ranks of the same host,
//! the fabric for every pair. A rank whose peers all go to the rings gets the
//! shared-memory transport, one with none the fabric transport, and one with both the
//! hybrid transport, which routes each operation by its peer.

use super::Backend;
use super::card::Card;
use crate::error::{Error, Result};
use crate::host::proc::this_process;
use crate::transport::fabric::{FabricConfig, FabricTransport, LOCAL};
use crate::transport::hybrid::HybridTransport;
use crate::transport::shm::{Reservation, Segment, ShmTransport, TransportChoice};
use std::time::Duration;

/// This host's name, as the kernel has it (per UTS namespace, so emulated hosts differ).
fn local_hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".into())
}

/// The topology `spec` (a preset or a file, from `HALO_TOPOLOGY`) describes, for a
/// job of `n` ranks.
fn spec_topology(spec: &str, n: usize) -> Result<halo_topology::Topology> {
    use halo_topology::Topology;
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
    Ok(t)
}

/// SHA-256 of a topology as JSON (levels, ranks, NICs, link matrix), hexadecimal.
fn topology_digest(t: &halo_topology::Topology) -> String {
    use sha2::{Digest, Sha256};
    crate::transport::text::hex(&Sha256::digest(t.to_spec().to_json_string().as_bytes()))
}

/// Every rank's card names the same topology spec and, when there is one, built the
/// same topology from it (a file of the same name can differ from host to host): else
/// the error, on every rank, naming the ranks that differ from rank 0.
fn check_topologies(cards: &[Card]) -> Result<()> {
    let differing: Vec<usize> = (0..cards.len())
        .filter(|&r| cards[r].topology != cards[0].topology)
        .collect();
    if let Some(&first) = differing.first() {
        return Err(Error::InvalidUsage {
            peer: Some(first),
            message: format!(
                "ranks disagree on the topology: rank 0 uses {:?} but ranks {differing:?} use {:?}",
                cards[0].topology, cards[first].topology
            ),
        });
    }
    if cards[0].topology.is_empty() {
        return Ok(());
    }
    let failed: Vec<usize> = (0..cards.len())
        .filter(|&r| cards[r].topology_digest.is_empty())
        .collect();
    if let Some(&first) = failed.first() {
        return Err(Error::InvalidUsage {
            peer: Some(first),
            message: format!(
                "HALO_TOPOLOGY={:?} did not build on ranks {failed:?} (each says why)",
                cards[0].topology
            ),
        });
    }
    let differing: Vec<usize> = (0..cards.len())
        .filter(|&r| cards[r].topology_digest != cards[0].topology_digest)
        .collect();
    if let Some(&first) = differing.first() {
        return Err(Error::InvalidUsage {
            peer: Some(first),
            message: format!(
                "ranks disagree on the topology: HALO_TOPOLOGY={:?} describes another machine \
                 (levels, ranks, NICs or links inside a node) on ranks {differing:?} than on \
                 rank 0 (topology SHA-256 {} there, {} on rank 0)",
                cards[0].topology,
                &cards[first].topology_digest[..16],
                &cards[0].topology_digest[..16]
            ),
        });
    }
    Ok(())
}

/// The global topology of a fabric job without `HALO_TOPOLOGY`: one node per distinct
/// host name, in order of first appearance, with the commodity link classes.
fn host_topology(hosts: &[String]) -> Result<halo_topology::Topology> {
    use halo_topology::{TopologySpec, commodity, spec::RankSpec};
    let n = hosts.len();
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
        node_links: None,
    };
    Ok(spec.build()?)
}

/// What [`connect`] needs besides every rank's cards.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Setup<'a> {
    /// This rank and the job's size.
    pub(crate) rank: usize,
    pub(crate) size: usize,
    /// The address the network provider binds (the bootstrap's `bind_ip`).
    pub(crate) ip: std::net::IpAddr,
    /// Which libfabric providers carry messages.
    pub(crate) fabric: &'a FabricConfig,
    /// This rank's `HALO_TRANSPORT`.
    pub(crate) choice: TransportChoice,
    /// This rank's `HALO_TOPOLOGY` (every rank must give the same).
    pub(crate) topology: &'a str,
    /// How long a rank waits for its host's segment and for the ranks sharing it.
    pub(crate) timeout: Duration,
}

/// Brings up the transport of one rank: opens the fabric endpoints and reserves a
/// shared-memory segment file (each unless `HALO_TRANSPORT` rules it out), publishes
/// this rank's card through `join` (the bootstrap exchange), checks that every rank
/// uses the same topology, builds it, and chooses from every rank's card
/// ([`plan`], over [`BACKENDS`]): the ranks of each host share a segment of HALO's
/// shared-memory rings (sized by the lowest of them) unless a rank forces the fabric;
/// the fabric transport carries every other pair. A one-host job on the rings gets
/// the shared-memory transport alone, a job without any the fabric transport, and a
/// rank with both the hybrid transport.
pub(crate) fn connect(
    setup: &Setup<'_>,
    join: impl FnOnce(&[u8]) -> Result<Vec<Vec<u8>>>,
) -> Result<(Backend, halo_topology::Topology)> {
    let Setup {
        rank,
        size,
        ip,
        fabric: config,
        choice,
        topology: topology_spec,
        timeout,
    } = *setup;
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
    let (mut fabric, names) = FabricTransport::open(rank, size, config, &ip.to_string())?;
    // Built before the exchange so that every rank can compare what it read; a spec
    // that does not build here is this rank's error after the exchange (the others
    // see its empty digest), so no rank is left waiting.
    let local_topology = (!topology_spec.is_empty()).then(|| spec_topology(topology_spec, size));
    let card = Card {
        host: local_hostname(),
        topology: topology_spec.to_string(),
        topology_digest: match &local_topology {
            Some(Ok(t)) => topology_digest(t),
            _ => String::new(),
        },
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
    let hosts: Vec<String> = cards.iter().map(|c| c.host.clone()).collect();
    let topology = match local_topology {
        Some(Err(e)) => return Err(e),
        Some(Ok(t)) => t,
        None => host_topology(&hosts)?,
    };
    // Every rank must describe the machine the same way.
    check_topologies(&cards)?;
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
        Segment::open_when_ready(path, group.len(), timeout, || {
            watched.is_some_and(crate::host::proc::has_ended)
        })?
    };
    let shm = ShmTransport::new_group(rank, size, &group, seg, procs.clone(), timeout)?;
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

/// The backends that can carry a pair of ranks, in order: a pair goes to the first that
/// can connect it ([`Via::can_connect`]; NCCL's transport table and `canConnect`).
const BACKENDS: [Via; 2] = [Via::Shm, Via::Fabric];

/// A backend of [`BACKENDS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Via {
    /// HALO's shared-memory rings, one segment per host.
    Shm,
    /// The fabric transport (libfabric).
    Fabric,
}

impl Via {
    /// Whether this backend can connect ranks `a` and `b` of `job`, from the cards alone
    /// (so every rank answers alike). The rings: `a` and `b` on the same host (same host
    /// name and PID namespace), every rank of that host (so both) reserved a segment file,
    /// and no rank of the job forces the fabric. The fabric: always.
    fn can_connect(self, job: &Job<'_>, a: usize, b: usize) -> bool {
        match self {
            Via::Shm => {
                a != b
                    && job.fabric.is_empty()
                    && matches!((job.host[a], job.host[b]),
                        (Some(h), Some(k)) if h == k && job.hosts[h].segments)
            }
            Via::Fabric => true,
        }
    }
}

/// A host of a job: a host name and PID namespace, as the cards say.
struct Host<'a> {
    /// Its name.
    name: &'a str,
    /// Its ranks, ascending.
    ranks: Vec<usize>,
    /// Whether each of them reserved a segment file.
    segments: bool,
}

/// Every rank's card, with what [`Via::can_connect`] asks of them worked out once.
struct Job<'a> {
    cards: &'a [Card],
    /// Per rank: its host in `hosts` (`None`: its card has no process).
    host: Vec<Option<usize>>,
    /// The hosts, in order of first appearance.
    hosts: Vec<Host<'a>>,
    /// The ranks that say `HALO_TRANSPORT=shm`, and `fabric`.
    shm: Vec<usize>,
    fabric: Vec<usize>,
}

impl<'a> Job<'a> {
    fn new(cards: &'a [Card]) -> Job<'a> {
        let says = |t: &str| -> Vec<usize> {
            (0..cards.len())
                .filter(|&r| cards[r].transport.as_deref() == Some(t))
                .collect()
        };
        let mut index = std::collections::HashMap::new();
        let mut hosts: Vec<Host<'a>> = Vec::new();
        let host = cards
            .iter()
            .enumerate()
            .map(|(r, c)| {
                let (ns, _) = c.process.as_ref()?;
                let h = *index
                    .entry((c.host.as_str(), ns.as_str()))
                    .or_insert_with(|| {
                        hosts.push(Host {
                            name: &c.host,
                            ranks: Vec::new(),
                            segments: true,
                        });
                        hosts.len() - 1
                    });
                hosts[h].ranks.push(r);
                hosts[h].segments &= c.shm.is_some();
                Some(h)
            })
            .collect();
        Job {
            cards,
            host,
            hosts,
            shm: says("shm"),
            fabric: says("fabric"),
        }
    }

    /// The backend that connects ranks `a` and `b`: the first of [`BACKENDS`] that can.
    fn via(&self, a: usize, b: usize) -> Via {
        BACKENDS
            .into_iter()
            .find(|v| v.can_connect(self, a, b))
            .expect("the fabric connects every pair")
    }

    /// An error when a rank says `HALO_TRANSPORT=shm` and the table does not put the
    /// ranks of each host on the rings: a rank forces the fabric, or a host of at least
    /// two ranks has one without a segment file.
    fn check(&self) -> Result<()> {
        let Some(&asks) = self.shm.first() else {
            return Ok(());
        };
        let refuse = |peer: usize, why: String| Error::InvalidUsage {
            peer: Some(peer),
            message: format!(
                "rank {asks} asked for HALO_TRANSPORT=shm, which needs the ranks of each host \
                 on HALO's shared memory and none forcing the fabric, but {why}"
            ),
        };
        if let Some(&f) = self.fabric.first() {
            return Err(refuse(
                f,
                format!(
                    "rank {f} uses the fabric (HALO_TRANSPORT=fabric, or a provider forced \
                     with HALO_FABRIC_PROVIDER)"
                ),
            ));
        }
        for host in self.hosts.iter().filter(|h| h.ranks.len() >= 2) {
            if let Some(&r) = host.ranks.iter().find(|&&r| self.cards[r].shm.is_none()) {
                return Err(refuse(
                    r,
                    format!(
                        "rank {r} (on host {:?}) could not create its shared-memory \
                         segment file (see its log)",
                        host.name
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// The groups of ranks that share a segment of HALO's shared-memory rings, from every
/// rank's card (so that every rank decides alike): per host, its ranks that
/// [`BACKENDS`] puts on the rings with its first rank, when there are at least two
/// (the ranks of each host, same host name and PID namespace, when none of the job's
/// ranks forces the fabric and each of them reserved a segment file). Each group is
/// ascending; its first rank makes the segment. An error when a rank says `shm` and a
/// host's ranks cannot share one.
fn plan(cards: &[Card]) -> Result<Vec<Vec<usize>>> {
    let job = Job::new(cards);
    job.check()?;
    Ok(job
        .hosts
        .iter()
        .filter_map(|host| {
            let (&first, rest) = host.ranks.split_first()?;
            let group: Vec<usize> = std::iter::once(first)
                .chain(
                    rest.iter()
                        .copied()
                        .filter(|&p| job.via(first, p) == Via::Shm),
                )
                .collect();
            (group.len() >= 2).then_some(group)
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::proc::Proc;

    fn card(host: &str, ns: &str, transport: &str, shm: Option<&str>) -> Card {
        Card {
            host: host.into(),
            topology: String::new(),
            topology_digest: String::new(),
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

    /// Cards naming `spec`, with the digests of `topologies` (`None`: did not build).
    fn cards_of(spec: &str, topologies: &[Option<&halo_topology::Topology>]) -> Vec<Card> {
        topologies
            .iter()
            .map(|t| Card {
                topology: spec.into(),
                topology_digest: t.map(topology_digest).unwrap_or_default(),
                ..card("a", "pid:[1]", "auto", None)
            })
            .collect()
    }

    #[test]
    fn ranks_must_build_the_same_topology_from_the_same_spec() {
        use halo_topology::Topology;
        let links = Topology::preset("frontier:1").unwrap();
        let uniform = links.without_node_links();
        assert_eq!(topology_digest(&links).len(), 64);
        assert_eq!(topology_digest(&links), topology_digest(&links.clone()));
        check_topologies(&cards_of("t.toml", &[Some(&links), Some(&links)])).unwrap();
        check_topologies(&cards_of("", &[None, None])).unwrap();
        // The same file name, another machine on rank 2: only the link matrix differs.
        let cards = cards_of("t.toml", &[Some(&links), Some(&links), Some(&uniform)]);
        match check_topologies(&cards) {
            Err(Error::InvalidUsage { peer, message }) => {
                assert_eq!(peer, Some(2));
                assert!(
                    message.contains("HALO_TOPOLOGY=\"t.toml\" describes another machine")
                        && message.contains("on ranks [2]"),
                    "{message}"
                );
            }
            other => panic!("{other:?}"),
        }
        // Rank 1 could not build it: every rank says so.
        match check_topologies(&cards_of("t.toml", &[Some(&links), None])) {
            Err(Error::InvalidUsage { peer, message }) => {
                assert_eq!(peer, Some(1));
                assert!(message.contains("did not build on ranks [1]"), "{message}");
            }
            other => panic!("{other:?}"),
        }
        // Different specs: named as before.
        let mut cards = cards_of("a.toml", &[Some(&links), Some(&links)]);
        cards[1].topology = "b.toml".into();
        match check_topologies(&cards) {
            Err(Error::InvalidUsage { message, .. }) => {
                assert!(
                    message.contains("rank 0 uses \"a.toml\" but ranks [1]"),
                    "{message}"
                )
            }
            other => panic!("{other:?}"),
        }
        // The digest travels in the card and is checked there.
        let card = &cards_of("t.toml", &[Some(&links)])[0];
        assert_eq!(&Card::decode(0, &card.encode()).unwrap(), card);
        let bad = String::from_utf8(card.encode())
            .unwrap()
            .replace(&card.topology_digest, "XYZ");
        let e = Card::decode(0, bad.as_bytes()).unwrap_err().to_string();
        assert!(e.contains("topology_digest"), "{e}");
    }
}
