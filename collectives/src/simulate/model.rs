//! The resources of the machine and the path of every message through them.

use super::{ResourceClass, SimOptions};
use halo_topology::{Level, Rank, Topology};

/// A domain boundary whose links are tapered: leaving an `inner` domain for the rest
/// of its `outer` domain.
#[derive(Debug, Clone, Copy)]
struct Uplink {
    inner: Level,
    outer: Level,
    out_base: u32,
    in_base: u32,
}

/// Every resource a message or copy can occupy, with its capacity (bytes per second).
#[derive(Debug)]
pub(crate) struct Model {
    pub(crate) cap: Vec<f64>,
    /// Demand every message adds on this resource besides its bytes (gap x capacity).
    pub(crate) extra: Vec<f64>,
    pub(crate) class: Vec<ResourceClass>,
    /// Whether the resource is an egress port (a rank's package or node link, a NIC's
    /// injection side, a node port's injection side): the first resource of every path
    /// that leaves a rank. A message to a peer waits until the sender's previous message
    /// to that peer has left its egress port.
    pub(crate) gate: Vec<bool>,
    /// Per-message latency per level (index `Level as usize`; 0 where absent).
    pub(crate) latency: [f64; 6],
    /// The node level (`Node`, or `Device` when the topology has none: every rank is
    /// its own node).
    base: Level,
    mem: u32,
    /// Per intra-node level: (egress base, ingress base); resource = base + rank.
    ports: [Option<(u32, u32)>; 6],
    inj: Vec<u32>,
    ej: Vec<u32>,
    uplinks: Vec<Uplink>,
    /// The direct GPU-GPU links inside the nodes, when the topology has a link matrix.
    pairs: Option<PairLinks>,
}

/// The node's link matrix as resources: one per direction of every linked pair of
/// every node, and the route (the links crossed) of every ordered pair of positions.
#[derive(Debug)]
struct PairLinks {
    /// Ranks per node the matrix describes.
    size: usize,
    /// Resources per node (linked ordered pairs).
    per_node: u32,
    base: u32,
    /// Per ordered pair of positions `i * size + j`, the links a transfer crosses, as
    /// offsets of a node's resources (empty: the pair is not connected at all).
    routes: Vec<Vec<u32>>,
}

impl PairLinks {
    /// A node's linked pairs in order and every ordered pair's route over them
    /// ([`halo_topology::NodeLinks::route`]).
    fn new(links: &halo_topology::NodeLinks, base: u32) -> PairLinks {
        let size = links.size();
        let mut offset = vec![u32::MAX; size * size];
        let mut per_node = 0u32;
        for i in 0..size {
            for j in 0..size {
                if i != j && links.links(i, j) > 0 {
                    offset[i * size + j] = per_node;
                    per_node += 1;
                }
            }
        }
        let mut routes = vec![Vec::new(); size * size];
        for i in 0..size {
            for j in 0..size {
                routes[i * size + j] = links
                    .route(i, j)
                    .into_iter()
                    .map(|(u, v)| offset[u * size + v])
                    .collect();
            }
        }
        PairLinks {
            size,
            per_node,
            base,
            routes,
        }
    }
}

impl Model {
    pub(crate) fn new(topo: &Topology, options: &SimOptions) -> Model {
        let n = topo.size();
        let mut m = Model {
            cap: Vec::new(),
            extra: Vec::new(),
            class: Vec::new(),
            gate: Vec::new(),
            latency: [0.0; 6],
            base: if topo.has_level(Level::Node) {
                Level::Node
            } else {
                Level::Device
            },
            mem: 0,
            ports: [None; 6],
            inj: vec![0; n],
            ej: vec![0; n],
            uplinks: Vec::new(),
            pairs: None,
        };
        for l in topo.levels() {
            m.latency[l as usize] = topo.link(l).latency;
        }
        let add = |m: &mut Model, count: usize, cap: f64, gap: f64, class| -> u32 {
            let base = m.cap.len() as u32;
            for _ in 0..count {
                m.cap.push(cap);
                m.extra.push(gap * cap);
                m.class.push(class);
                m.gate.push(false);
            }
            base
        };
        m.mem = add(
            &mut m,
            n,
            topo.link(Level::Device).bandwidth,
            0.0,
            ResourceClass::Memory,
        );
        match topo.node_links().filter(|_| m.base == Level::Node) {
            None => {
                for l in topo.levels() {
                    if l > Level::Device && l <= m.base {
                        let bw = topo.link(l).bandwidth;
                        let o = add(&mut m, n, bw, options.port_gap, ResourceClass::Link(l));
                        let i = add(&mut m, n, bw, options.port_gap, ResourceClass::Link(l));
                        m.ports[l as usize] = Some((o, i));
                        m.gate[o as usize..(o as usize + n)].fill(true);
                    }
                }
            }
            Some(links) => {
                // One port per rank and direction for every level inside the node, at
                // the sum of the rank's links (the node level's bandwidth for a rank
                // without any), and a resource per direction of every linked pair.
                let per_link = links.link().bandwidth;
                let fallback = topo.link(Level::Node).bandwidth;
                let base = m.cap.len() as u32;
                for dir in 0..2 {
                    for r in 0..n {
                        let i = topo.local_index(r, Level::Node);
                        let sum: u32 = (0..links.size())
                            .map(|j| {
                                if dir == 0 {
                                    links.links(i, j)
                                } else {
                                    links.links(j, i)
                                }
                            })
                            .sum();
                        let cap = if sum > 0 {
                            sum as f64 * per_link
                        } else {
                            fallback
                        };
                        add(
                            &mut m,
                            1,
                            cap,
                            options.port_gap,
                            ResourceClass::Link(Level::Node),
                        );
                    }
                }
                let (o, i) = (base, base + n as u32);
                m.gate[o as usize..(o as usize + n)].fill(true);
                for l in topo.levels() {
                    if l > Level::Device && l <= m.base {
                        m.ports[l as usize] = Some((o, i));
                    }
                }
                let pairs = PairLinks::new(links, m.cap.len() as u32);
                for _ in 0..topo.num_domains(Level::Node) {
                    for a in 0..pairs.size {
                        for b in (0..pairs.size).filter(|&b| b != a) {
                            let l = links.links(a, b);
                            if l > 0 {
                                add(&mut m, 1, l as f64 * per_link, 0.0, ResourceClass::GpuLink);
                            }
                        }
                    }
                }
                m.pairs = Some(pairs);
            }
        }
        // Nodes and their injection capacity: the sum of their NICs, or one port at the
        // bandwidth of the first level outside the node when they have none.
        let has_node = m.base == Level::Node;
        let node_of = |r: Rank| {
            if has_node {
                topo.domain(r, Level::Node)
            } else {
                r
            }
        };
        let nodes = if has_node {
            topo.num_domains(Level::Node)
        } else {
            n
        };
        let first_out = topo.outer(m.base).unwrap_or(Level::System);
        let fallback = topo.link(first_out).bandwidth;
        let mut node_nic = vec![0.0f64; nodes];
        for nic in topo.nics() {
            node_nic[node_of(nic.ranks[0])] += nic.bandwidth;
        }
        let node_cap: Vec<f64> = node_nic
            .iter()
            .map(|&b| if b > 0.0 { b } else { fallback })
            .collect();
        let gap = options.nic_gap;
        let mut nic_res = Vec::with_capacity(topo.nics().len());
        for nic in topo.nics() {
            let o = add(&mut m, 1, nic.bandwidth, gap, ResourceClass::Nic);
            let i = add(&mut m, 1, nic.bandwidth, gap, ResourceClass::Nic);
            m.gate[o as usize] = true;
            nic_res.push((o, i));
        }
        let mut nic_index: Vec<Option<usize>> = vec![None; n];
        for (j, nic) in topo.nics().iter().enumerate() {
            for &r in &nic.ranks {
                nic_index[r] = Some(j);
            }
        }
        let mut pool: Vec<Option<(u32, u32)>> = vec![None; nodes];
        for (r, nic) in nic_index.iter().enumerate() {
            let (o, i) = match *nic {
                Some(j) => nic_res[j],
                None => {
                    let node = node_of(r);
                    match pool[node] {
                        Some(p) => p,
                        None => {
                            let c = node_cap[node];
                            let o = add(&mut m, 1, c, gap, ResourceClass::NodePort);
                            let i = add(&mut m, 1, c, gap, ResourceClass::NodePort);
                            m.gate[o as usize] = true;
                            pool[node] = Some((o, i));
                            (o, i)
                        }
                    }
                }
            };
            m.inj[r] = o;
            m.ej[r] = i;
        }
        // Tapered boundaries: a domain's share of the links out of it is the injection
        // capacity of its nodes divided by the taper of the level outside it.
        let mut level = m.base;
        while let Some(outer) = topo.outer(level) {
            let taper = topo.link(outer).taper;
            if taper > 1.0 {
                let mut cap = vec![0.0f64; topo.num_domains(level)];
                for (node, c) in node_cap.iter().enumerate() {
                    let leader = if has_node {
                        topo.leader(Level::Node, node)
                    } else {
                        node
                    };
                    cap[topo.domain(leader, level)] += c / taper;
                }
                let class = ResourceClass::Uplink(level);
                let out_base = m.cap.len() as u32;
                for &c in &cap {
                    add(&mut m, 1, c, 0.0, class);
                }
                let in_base = m.cap.len() as u32;
                for &c in &cap {
                    add(&mut m, 1, c, 0.0, class);
                }
                m.uplinks.push(Uplink {
                    inner: level,
                    outer,
                    out_base,
                    in_base,
                });
            }
            level = outer;
        }
        m
    }

    /// The resources a message of `bytes` from `a` to `b` occupies and its demand on
    /// each (resources it would not load are left out); returns the level where the
    /// two ranks meet.
    pub(crate) fn path(
        &self,
        topo: &Topology,
        a: Rank,
        b: Rank,
        bytes: u64,
        out: &mut Vec<(u32, f64)>,
    ) -> Level {
        out.clear();
        let level = topo.meet(a, b);
        let s = bytes as f64;
        let mut push = |r: u32, extra: f64| {
            let d = s + extra;
            if d > 0.0 {
                out.push((r, d));
            }
        };
        if level == Level::Device {
            push(self.mem + a as u32, 0.0);
        } else if level <= self.base {
            let (o, i) = self.ports[level as usize].expect("an intra-node level has ports");
            push(o + a as u32, self.extra[o as usize]);
            if let Some(p) = &self.pairs {
                let node = topo.domain(a, Level::Node) as u32;
                let (x, y) = (
                    topo.local_index(a, Level::Node),
                    topo.local_index(b, Level::Node),
                );
                for &link in &p.routes[x * p.size + y] {
                    push(p.base + node * p.per_node + link, 0.0);
                }
            }
            push(i + b as u32, self.extra[i as usize]);
        } else {
            let (o, i) = (self.inj[a], self.ej[b]);
            push(o, self.extra[o as usize]);
            push(i, self.extra[i as usize]);
            for u in &self.uplinks {
                if u.outer <= level {
                    push(u.out_base + topo.domain(a, u.inner) as u32, 0.0);
                    push(u.in_base + topo.domain(b, u.inner) as u32, 0.0);
                }
            }
        }
        level
    }

    /// The egress port a message between ranks meeting at `level` leaves its sender
    /// by, as a slot per rank: 0 the package link, 1 the node link, 2 the way out of
    /// the node; `None` for a message to itself.
    pub(crate) fn slot(&self, level: Level) -> Option<usize> {
        match level {
            Level::Device => None,
            // With a link matrix every level inside the node leaves by one port.
            Level::Package if self.base >= Level::Package && self.pairs.is_none() => Some(0),
            l if l <= self.base => Some(1),
            _ => Some(2),
        }
    }

    /// The resource a copy of `rank` occupies (its memory).
    pub(crate) fn memory(&self, rank: Rank) -> u32 {
        self.mem + rank as u32
    }
}
