//! Named presets: `flat:N`, `nodes:HxR`, `frontier:N`, `mi300x:N`, `dgx-h100:N`.
//!
//! Any preset takes `,ranks=M` to keep only its first `M` ranks, which makes uneven
//! trees (`nodes:4x4,ranks=14` leaves 2 ranks on the last node).
//!
//! Figures come from docs/REFERENCE.md §2; latencies the sources do not give are
//! inferred and marked below.

use crate::error::{Result, TopologyError};
use crate::level::LinkClass;
use crate::model::Topology;
use crate::spec::{NicSpec, NodeLinksSpec, RankSpec, TopologySpec};
use std::collections::BTreeMap;

/// Frontier (OLCF): figures from docs/REFERENCE.md §2.
pub mod frontier {
    use crate::level::LinkClass;
    /// GCDs (ranks) per node.
    pub const GCDS_PER_NODE: usize = 8;
    /// GCDs per MI250X package.
    pub const GCDS_PER_PACKAGE: usize = 2;
    /// Nodes behind one Rosetta switch.
    pub const NODES_PER_SWITCH: usize = 4;
    /// Nodes per dragonfly group (one cabinet).
    pub const NODES_PER_GROUP: usize = 128;
    /// HBM2E copy rate of one GCD, 1.6 TB/s.
    pub const DEVICE: LinkClass = LinkClass::new(1.6e12, 0.0);
    /// Infinity Fabric between the 2 GCDs of one MI250X: 200 GB/s per direction.
    /// Latency inferred (~1.5 us, a device-to-device copy).
    pub const PACKAGE: LinkClass = LinkClass::new(200e9, 1.5e-6);
    /// Infinity Fabric between packages: 50-100 GB/s; the single-link 50 GB/s is used.
    /// Latency inferred.
    pub const NODE: LinkClass = LinkClass::new(50e9, 2.0e-6);
    /// Through one Rosetta switch: one Slingshot-11 NIC, 25 GB/s. Latency inferred.
    pub const SWITCH: LinkClass = LinkClass::new(25e9, 2.5e-6);
    /// Inside a dragonfly group: 200 Gb/s switch-to-switch links. Latency inferred.
    pub const GROUP: LinkClass = LinkClass::new(25e9, 3.5e-6);
    /// Between groups: 200 Gb/s global links, tapered about 1.75 : 1. Latency inferred.
    pub const SYSTEM: LinkClass = LinkClass::new(25e9, 4.5e-6).tapered(1.75);
    /// One Slingshot-11 NIC: 200 Gb/s.
    pub const NIC_BANDWIDTH: f64 = 25e9;
    /// NICs per node, one per MI250X package.
    pub const NICS_PER_NODE: usize = 4;
    /// One Infinity Fabric GPU-GPU link: 50 GB/s per direction (AMD's MI250 reference:
    /// 25 GT/s x 16 lanes). Latency as [`NODE`]'s (inferred).
    pub const XGMI_LINK: LinkClass = LinkClass::new(50e9, 2.0e-6);
    /// xGMI links between the GCDs of a node, by GCD: 4 inside an MI250X package, across
    /// packages 2 (GCDs 0-6, 2-4), 1 (0-2, 1-3, 1-5, 3-7, 4-6, 5-7) or none (the other
    /// 12 pairs, which route over a peer). From the OLCF Frontier User Guide's node
    /// diagram (docs.olcf.ornl.gov/systems/frontier_user_guide.html); `rocm-smi
    /// --shownodesbw` of an 8-GCD MI250 machine prints the same pattern (the KFD
    /// fixture in topology/tests/discover_kfd.rs).
    pub const GCD_LINKS: [[u32; 8]; 8] = [
        [0, 4, 1, 0, 0, 0, 2, 0],
        [4, 0, 0, 1, 0, 1, 0, 0],
        [1, 0, 0, 4, 2, 0, 0, 0],
        [0, 1, 4, 0, 0, 0, 0, 1],
        [0, 0, 2, 0, 0, 4, 1, 0],
        [0, 1, 0, 0, 4, 0, 0, 1],
        [2, 0, 0, 0, 1, 0, 0, 4],
        [0, 0, 0, 1, 0, 1, 4, 0],
    ];
}

/// AMD Instinct MI300X platform: 8 GPUs, each joined to each of the other 7 by one
/// xGMI link of 64 GB/s per direction (AMD's MI300X platform brief; 448 GB/s per GPU
/// and direction in all), one 400 Gb/s NIC per GPU.
pub mod mi300x {
    use crate::level::LinkClass;
    /// GPUs per node.
    pub const GPUS_PER_NODE: usize = 8;
    /// HBM3 copy rate, 5.3 TB/s.
    pub const DEVICE: LinkClass = LinkClass::new(5.3e12, 0.0);
    /// One xGMI link between two GPUs: 64 GB/s per direction. Latency inferred.
    pub const XGMI_LINK: LinkClass = LinkClass::new(64e9, 1.5e-6);
    /// The node level: any pair meets on its one link.
    pub const NODE: LinkClass = XGMI_LINK;
    /// Between nodes: one 400 Gb/s NIC per GPU. Latency inferred.
    pub const SYSTEM: LinkClass = LinkClass::new(50e9, 3.0e-6);
    /// One 400 Gb/s NIC.
    pub const NIC_BANDWIDTH: f64 = 50e9;
}

/// DGX H100: 8 GPUs on NVLink 4 (450 GB/s per direction), 8 ConnectX-7 NICs of 400 Gb/s,
/// one per GPU.
pub mod dgx_h100 {
    use crate::level::LinkClass;
    /// GPUs per node.
    pub const GPUS_PER_NODE: usize = 8;
    /// HBM3 copy rate, 3.35 TB/s.
    pub const DEVICE: LinkClass = LinkClass::new(3.35e12, 0.0);
    /// NVLink 4 through NVSwitch, 450 GB/s per direction. Latency inferred.
    pub const NODE: LinkClass = LinkClass::new(450e9, 1.0e-6);
    /// InfiniBand NDR between nodes, 50 GB/s per NIC. Latency inferred.
    pub const SYSTEM: LinkClass = LinkClass::new(50e9, 3.0e-6);
    /// One ConnectX-7 NIC: 400 Gb/s.
    pub const NIC_BANDWIDTH: f64 = 50e9;
}

/// A commodity cluster for `nodes:HxR` and `flat:N`.
pub mod commodity {
    use crate::level::LinkClass;
    /// A host's memory copy rate, 10 GB/s.
    pub const DEVICE: LinkClass = LinkClass::new(10e9, 0.0);
    /// Shared memory between processes of one host, 5 GB/s, 1 us.
    pub const NODE: LinkClass = LinkClass::new(5e9, 1.0e-6);
    /// A 100 Gb/s network, 12.5 GB/s, 5 us.
    pub const SYSTEM: LinkClass = LinkClass::new(12.5e9, 5.0e-6);
}

fn bad(spec: &str, reason: impl Into<String>) -> TopologyError {
    TopologyError::Preset {
        spec: spec.to_string(),
        reason: reason.into(),
    }
}

fn count(spec: &str, what: &str, s: &str) -> Result<usize> {
    match s.trim().parse::<usize>() {
        Ok(0) => Err(bad(spec, format!("{what} must be at least 1"))),
        Ok(v) if v > 1 << 24 => Err(bad(
            spec,
            format!("{what} {v} is more than this library supports (16,777,216)"),
        )),
        Ok(v) => Ok(v),
        Err(_) => Err(bad(spec, format!("{what} '{s}' is not a positive integer"))),
    }
}

/// Builder for regular presets: `nodes` nodes of `per_node` ranks with the given link
/// classes and domain sizes.
struct Regular {
    name: String,
    links: Vec<(&'static str, LinkClass)>,
    nodes: usize,
    per_node: usize,
    /// ranks per package (0 = no package level)
    per_package: usize,
    /// nodes per switch / per group (0 = level absent)
    nodes_per_switch: usize,
    nodes_per_group: usize,
    /// NICs per node; NIC i serves local ranks [i*per_nic, (i+1)*per_nic)
    nics_per_node: usize,
    nic_prefix: &'static str,
    nic: LinkClass,
    /// The links between the ranks of a node, where it is not uniform.
    node_links: Option<NodeLinksSpec>,
}

impl Regular {
    /// Ranks in the whole preset (`None` when that overflows).
    fn total(&self) -> Option<usize> {
        self.nodes.checked_mul(self.per_node)
    }

    /// The spec of the first `keep` ranks (at most [`Regular::total`]), and the NICs that
    /// serve at least one of them.
    fn spec(&self, keep: usize) -> TopologySpec {
        let n = keep;
        let mut ranks = Vec::with_capacity(n);
        for r in 0..n {
            let node = r / self.per_node;
            let mut domains = BTreeMap::new();
            // A zero size means the level is absent.
            if let Some(package) = r.checked_div(self.per_package) {
                domains.insert("package".to_string(), package as i64);
            }
            if self.links.iter().any(|(l, _)| *l == "node") {
                domains.insert("node".to_string(), node as i64);
            }
            if let Some(switch) = node.checked_div(self.nodes_per_switch) {
                domains.insert("switch".to_string(), switch as i64);
            }
            if let Some(group) = node.checked_div(self.nodes_per_group) {
                domains.insert("group".to_string(), group as i64);
            }
            ranks.push(RankSpec {
                rank: r as i64,
                host: None,
                domains,
            });
        }
        let mut nics = Vec::new();
        if self.nics_per_node > 0 {
            let per_nic = self.per_node.div_ceil(self.nics_per_node);
            for node in 0..n.div_ceil(self.per_node) {
                for i in 0..self.nics_per_node {
                    let lo = node * self.per_node + i * per_nic;
                    let hi = (lo + per_nic).min((node + 1) * self.per_node).min(n);
                    if lo >= hi {
                        continue;
                    }
                    nics.push(NicSpec {
                        name: format!("{}{i}", self.nic_prefix),
                        bandwidth: self.nic.bandwidth,
                        latency: self.nic.latency,
                        ranks: (lo as i64..hi as i64).collect(),
                    });
                }
            }
        }
        TopologySpec {
            name: self.name.clone(),
            links: self
                .links
                .iter()
                .map(|(l, c)| (l.to_string(), *c))
                .collect(),
            ranks,
            nics,
            node_links: self.node_links.clone(),
        }
    }
}

/// The spec of a named preset.
pub fn preset_spec(spec: &str) -> Result<TopologySpec> {
    let (body, ranks) = match spec.split_once(",ranks=") {
        Some((b, m)) => (b, Some(count(spec, "ranks", m)?)),
        None => (spec, None),
    };
    let (name, arg) = body.split_once(':').ok_or_else(|| {
        bad(
            spec,
            "expected NAME:ARGS, one of flat:N, nodes:HxR, frontier:N, mi300x:N, dgx-h100:N (optionally ,ranks=M)",
        )
    })?;
    let regular = match name {
        "flat" => {
            let n = count(spec, "N", arg)?;
            Regular {
                name: body.to_string(),
                links: vec![("device", commodity::DEVICE), ("system", commodity::SYSTEM)],
                nodes: n,
                per_node: 1,
                per_package: 0,
                nodes_per_switch: 0,
                nodes_per_group: 0,
                nics_per_node: 0,
                nic_prefix: "",
                nic: commodity::SYSTEM,
                node_links: None,
            }
        }
        "nodes" => {
            let (h, r) = arg
                .split_once('x')
                .ok_or_else(|| bad(spec, "nodes takes HxR: H hosts of R ranks, e.g. nodes:4x2"))?;
            let (h, r) = (count(spec, "H", h)?, count(spec, "R", r)?);
            Regular {
                name: body.to_string(),
                links: vec![
                    ("device", commodity::DEVICE),
                    ("node", commodity::NODE),
                    ("system", commodity::SYSTEM),
                ],
                nodes: h,
                per_node: r,
                per_package: 0,
                nodes_per_switch: 0,
                nodes_per_group: 0,
                nics_per_node: 1,
                nic_prefix: "eth",
                nic: commodity::SYSTEM,
                node_links: None,
            }
        }
        "frontier" => {
            let nodes = count(spec, "N (nodes)", arg)?;
            Regular {
                name: body.to_string(),
                links: vec![
                    ("device", frontier::DEVICE),
                    ("package", frontier::PACKAGE),
                    ("node", frontier::NODE),
                    ("switch", frontier::SWITCH),
                    ("group", frontier::GROUP),
                    ("system", frontier::SYSTEM),
                ],
                nodes,
                per_node: frontier::GCDS_PER_NODE,
                per_package: frontier::GCDS_PER_PACKAGE,
                nodes_per_switch: frontier::NODES_PER_SWITCH,
                nodes_per_group: frontier::NODES_PER_GROUP,
                nics_per_node: frontier::NICS_PER_NODE,
                nic_prefix: "hsn",
                nic: LinkClass::new(frontier::NIC_BANDWIDTH, frontier::SWITCH.latency),
                node_links: Some(NodeLinksSpec {
                    link: frontier::XGMI_LINK,
                    matrix: frontier::GCD_LINKS.iter().map(|r| r.to_vec()).collect(),
                }),
            }
        }
        "dgx-h100" => {
            let nodes = count(spec, "N (nodes)", arg)?;
            Regular {
                name: body.to_string(),
                links: vec![
                    ("device", dgx_h100::DEVICE),
                    ("node", dgx_h100::NODE),
                    ("system", dgx_h100::SYSTEM),
                ],
                nodes,
                per_node: dgx_h100::GPUS_PER_NODE,
                per_package: 0,
                nodes_per_switch: 0,
                nodes_per_group: 0,
                nics_per_node: dgx_h100::GPUS_PER_NODE,
                nic_prefix: "mlx5_",
                nic: LinkClass::new(dgx_h100::NIC_BANDWIDTH, dgx_h100::SYSTEM.latency),
                node_links: None,
            }
        }
        "mi300x" => {
            let nodes = count(spec, "N (nodes)", arg)?;
            let n = mi300x::GPUS_PER_NODE;
            Regular {
                name: body.to_string(),
                links: vec![
                    ("device", mi300x::DEVICE),
                    ("node", mi300x::NODE),
                    ("system", mi300x::SYSTEM),
                ],
                nodes,
                per_node: n,
                per_package: 0,
                nodes_per_switch: 0,
                nodes_per_group: 0,
                nics_per_node: n,
                nic_prefix: "rdma",
                nic: LinkClass::new(mi300x::NIC_BANDWIDTH, mi300x::SYSTEM.latency),
                node_links: Some(NodeLinksSpec {
                    link: mi300x::XGMI_LINK,
                    matrix: (0..n)
                        .map(|i| (0..n).map(|j| u32::from(i != j)).collect())
                        .collect(),
                }),
            }
        }
        other => {
            return Err(bad(
                spec,
                format!(
                    "unknown preset '{other}' (known: flat, nodes, frontier, mi300x, dgx-h100)"
                ),
            ));
        }
    };
    // Sizes are checked before anything is built: `nodes:16777216x16777216` must be an
    // error, not an attempt to allocate 2^48 ranks.
    let total = regular.total();
    let keep = match (ranks, total) {
        (Some(m), Some(t)) if m > t => {
            return Err(bad(
                spec,
                format!("ranks={m} is more than the {t} ranks the preset has"),
            ));
        }
        (Some(m), _) => m,
        (None, Some(t)) => t,
        (None, None) => usize::MAX,
    };
    if keep > 1 << 24 {
        return Err(bad(
            spec,
            "more than 16,777,216 ranks (keep fewer with ,ranks=M)",
        ));
    }
    let mut out = regular.spec(keep);
    if ranks.is_some() {
        out.name = spec.to_string();
    }
    Ok(out)
}

impl Topology {
    /// A named preset: `flat:N`, `nodes:HxR`, `frontier:N` (N nodes of 8 GCDs),
    /// `dgx-h100:N`; `,ranks=M` keeps the first M ranks.
    pub fn preset(spec: &str) -> Result<Topology> {
        preset_spec(spec)?.build()
    }
}
