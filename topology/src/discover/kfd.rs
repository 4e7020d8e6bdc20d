//! AMD's KFD topology, the per-pair GPU links the ROCm stack and RCCL read
//! (`/sys/devices/virtual/kfd/kfd/topology/nodes/N/`).
//!
//! Each node directory has a `properties` file (`key value` per line, decimal): a CPU
//! node has `simd_count 0`, a GPU node `simd_count > 0`, its PCI address in
//! `domain` and `location_id` (`bus << 8 | device << 3 | function`). Each
//! `io_links/M/properties` (and `p2p_links/M/properties`, on kernels built with
//! `HSA_AMD_P2P`) describes one link from the node: `type` (the CRAT numbering: 2
//! PCIe, 11 xGMI), `node_from`, `node_to`, `weight` (15 per xGMI hop, 20 per PCIe
//! segment), `min_bandwidth` and `max_bandwidth` in MB/s. On MI200 the kernel reports
//! one xGMI link's bandwidth as the minimum and all links' as the maximum, so
//! `max / min` is the number of links (RCCL counts them so); a GPU pair without a
//! direct link reads `0 / 0` and is not a link. A GPU's link to a CPU node (type 11
//! on Frontier, where the CPU is on Infinity Fabric too) is not a GPU link.
//!
//! Reading is strict where the files exist: a node without `properties`, a line that
//! is not `key value`, a missing key, a link from another node than its directory's,
//! a link to a node that does not exist, and a pair whose two directions disagree
//! are errors naming the file. An absent topology directory is not an error (no
//! amdgpu driver).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::{DiscoverError, GpuLink, GpuLinkKind};

/// CRAT I/O link type of PCI Express.
const CRAT_PCIE: u64 = 2;
/// CRAT I/O link type of xGMI (Infinity Fabric).
const CRAT_XGMI: u64 = 11;

/// The topology directory below the sysfs root.
pub(super) const TOPOLOGY: &str = "/sys/devices/virtual/kfd/kfd/topology/nodes";

/// One parsed `properties` file.
struct Properties {
    path: PathBuf,
    values: BTreeMap<String, u64>,
}

impl Properties {
    fn read(path: PathBuf) -> Result<Properties, DiscoverError> {
        let text = std::fs::read_to_string(&path).map_err(|e| DiscoverError::Kfd {
            path: path.clone(),
            reason: format!("cannot be read: {e}"),
        })?;
        let mut values = BTreeMap::new();
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let parsed = line
                .split_once(' ')
                .and_then(|(k, v)| Some((k, v.trim().parse::<u64>().ok()?)));
            let Some((key, value)) = parsed else {
                return Err(DiscoverError::Kfd {
                    path,
                    reason: format!(
                        "line {} is not `key value` with a decimal value: `{line}`",
                        i + 1
                    ),
                });
            };
            values.insert(key.to_owned(), value);
        }
        Ok(Properties { path, values })
    }

    fn get(&self, key: &str) -> Result<u64, DiscoverError> {
        self.values
            .get(key)
            .copied()
            .ok_or_else(|| DiscoverError::Kfd {
                path: self.path.clone(),
                reason: format!("has no `{key}` (truncated?)"),
            })
    }
}

/// A KFD node: its PCI bus id when it is a GPU.
struct Node {
    gpu: Option<String>,
}

/// One link as read, before the two directions are matched.
struct Read {
    from: u64,
    to: u64,
    kind: GpuLinkKind,
    weight: u64,
    min: u64,
    max: u64,
    path: PathBuf,
}

/// Every direct GPU-to-GPU link of the KFD topology below `dir`, one entry per
/// direction, sorted by (from, to) bus id; `None` when `dir` does not exist.
pub(super) fn gpu_links(dir: &Path) -> Result<Option<Vec<GpuLink>>, DiscoverError> {
    let Some(names) = super::sysfs::list_dir(dir)? else {
        return Ok(None);
    };
    let mut nodes: BTreeMap<u64, Node> = BTreeMap::new();
    let mut links: Vec<Read> = Vec::new();
    for name in names {
        let Ok(id) = name.parse::<u64>() else {
            continue;
        };
        let node_dir = dir.join(&name);
        let props = Properties::read(node_dir.join("properties"))?;
        let gpu = if props.get("simd_count")? > 0 {
            let domain = props.get("domain")?;
            let location = props.get("location_id")?;
            Some(format!(
                "{domain:04x}:{:02x}:{:02x}.{:x}",
                location >> 8,
                (location >> 3) & 0x1f,
                location & 0x7
            ))
        } else {
            None
        };
        nodes.insert(id, Node { gpu });
        for sub in ["io_links", "p2p_links"] {
            let Some(entries) = super::sysfs::list_dir(&node_dir.join(sub))? else {
                continue;
            };
            for entry in entries {
                let link = Properties::read(node_dir.join(sub).join(&entry).join("properties"))?;
                let from = link.get("node_from")?;
                if from != id {
                    return Err(DiscoverError::Kfd {
                        path: link.path,
                        reason: format!("says node_from {from}, but it is a link of node {id}"),
                    });
                }
                let kind = match link.get("type")? {
                    CRAT_XGMI => GpuLinkKind::Xgmi,
                    CRAT_PCIE => GpuLinkKind::Pcie,
                    other => GpuLinkKind::Other(u32::try_from(other).unwrap_or(u32::MAX)),
                };
                links.push(Read {
                    from,
                    to: link.get("node_to")?,
                    kind,
                    weight: link.get("weight")?,
                    min: link.get("min_bandwidth")?,
                    max: link.get("max_bandwidth")?,
                    path: link.path,
                });
            }
        }
    }
    let mut out: BTreeMap<(String, String), (GpuLink, PathBuf)> = BTreeMap::new();
    for l in links {
        let Some(to) = nodes.get(&l.to) else {
            return Err(DiscoverError::Kfd {
                path: l.path,
                reason: format!("links to node {}, which does not exist", l.to),
            });
        };
        let (Some(from_bus), Some(to_bus)) = (&nodes[&l.from].gpu, &to.gpu) else {
            continue; // a link with a CPU node
        };
        if l.max == 0 {
            continue; // a peer reached through others: no direct link
        }
        let links = l.max.checked_div(l.min).unwrap_or(1).max(1);
        let link = GpuLink {
            from: from_bus.clone(),
            to: to_bus.clone(),
            kind: l.kind,
            links: u32::try_from(links).unwrap_or(u32::MAX),
            bandwidth_bytes_per_sec: l.max.saturating_mul(1_000_000),
            weight: u32::try_from(l.weight).unwrap_or(u32::MAX),
        };
        // io_links and p2p_links may both list a direct link: the first one stays.
        out.entry((link.from.clone(), link.to.clone()))
            .or_insert((link, l.path));
    }
    for ((from, to), (link, path)) in &out {
        match out.get(&(to.clone(), from.clone())) {
            None => {
                return Err(DiscoverError::Kfd {
                    path: path.clone(),
                    reason: format!("links {from} to {to}, but {to} has no link back"),
                });
            }
            Some((back, back_path)) if back.links != link.links || back.kind != link.kind => {
                return Err(DiscoverError::Kfd {
                    path: path.clone(),
                    reason: format!(
                        "says {from} -> {to} is {} x {:?}, but {} says {} x {:?}",
                        link.links,
                        link.kind,
                        back_path.display(),
                        back.links,
                        back.kind
                    ),
                });
            }
            Some(_) => {}
        }
    }
    Ok(Some(out.into_values().map(|(l, _)| l).collect()))
}
