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
        for l in topo.levels() {
            if l > Level::Device && l <= m.base {
                let bw = topo.link(l).bandwidth;
                let o = add(&mut m, n, bw, options.port_gap, ResourceClass::Link(l));
                let i = add(&mut m, n, bw, options.port_gap, ResourceClass::Link(l));
                m.ports[l as usize] = Some((o, i));
                m.gate[o as usize..(o as usize + n)].fill(true);
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
            Level::Package if self.base >= Level::Package => Some(0),
            l if l <= self.base => Some(1),
            _ => Some(2),
        }
    }

    /// The resource a copy of `rank` occupies (its memory).
    pub(crate) fn memory(&self, rank: Rank) -> u32 {
        self.mem + rank as u32
    }
}
