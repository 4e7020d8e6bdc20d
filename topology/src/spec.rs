//! The topology file format (TOML or JSON) and its validation.
//!
//! ```toml
//! name = "two hosts"
//!
//! [links]                       # one link class per level that is present
//! device = { bandwidth = 1.0e10, latency = 0.0 }    # memory copy on one rank
//! node   = { bandwidth = 2.0e10, latency = 5.0e-7 } # shared memory between ranks of a host
//! system = { bandwidth = 1.25e8, latency = 5.0e-5 } # the network
//!
//! [[ranks]]
//! rank = 0
//! node = 0
//! host = "node0"                # optional
//!
//! [[ranks]]
//! rank = 1
//! node = 1
//!
//! [[nics]]
//! name = "eth0"
//! bandwidth = 1.25e8
//! latency = 5.0e-5
//! ranks = [0]
//! ```
//!
//! Nodes that are not uniform add the direct links between their ranks, by the ranks'
//! positions in a node, the same in every node ([`NodeLinksSpec`]; the `frontier`
//! preset writes its MI250X pattern so):
//!
//! ```toml
//! [node_links]
//! matrix = [[0, 4, 1], [4, 0, 0], [1, 0, 0]]   # links per pair, symmetric, 0 on the diagonal
//! link = { bandwidth = 5.0e10, latency = 2.0e-6 }  # one link, one direction
//! ```
//!
//! Levels are `device`, `package`, `node`, `switch`, `group` and `system`; `device`
//! and `system` are always present, the others when `[links]` names them. Each rank
//! gives its domain at every present level between them (any non-negative label;
//! labels are renumbered densely in ascending order). Loading rejects a bad file with
//! a [`TopologyError::Invalid`] that names the field and what is wrong.

use crate::error::{Result, TopologyError};
use crate::level::{Level, LinkClass};
use crate::model::{Nic, NodeLinks, Topology};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

/// The most bytes a topology file may have (64 MiB: a description of a million ranks
/// is about 60 bytes a rank in TOML).
pub const MAX_FILE_BYTES: u64 = 64 << 20;

/// Reads `path` as UTF-8 text: a regular file of at most [`MAX_FILE_BYTES`].
fn read_bounded(path: &Path) -> Result<String> {
    use std::io::Read as _;
    use std::os::unix::fs::{FileTypeExt as _, OpenOptionsExt as _};
    let io = |source| TopologyError::Io {
        path: path.display().to_string(),
        source,
    };
    // O_NONBLOCK: opening a FIFO without a writer must not wait for one (on a regular
    // file the flag changes nothing).
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(io)?;
    let meta = f.metadata().map_err(io)?;
    let t = meta.file_type();
    if !t.is_file() {
        let kind = if t.is_dir() {
            "a directory"
        } else if t.is_char_device() {
            "a character device"
        } else if t.is_block_device() {
            "a block device"
        } else if t.is_fifo() {
            "a FIFO"
        } else if t.is_socket() {
            "a socket"
        } else {
            "of another kind"
        };
        return Err(TopologyError::NotAFile {
            path: path.display().to_string(),
            kind,
        });
    }
    let too_large = || TopologyError::TooLarge {
        path: path.display().to_string(),
        limit: MAX_FILE_BYTES,
    };
    if meta.len() > MAX_FILE_BYTES {
        return Err(too_large());
    }
    // The size may grow while it is read: read one byte past the limit at most.
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    f.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(io)?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(too_large());
    }
    String::from_utf8(bytes).map_err(|_| {
        io(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "stream did not contain valid UTF-8",
        ))
    })
}

/// A topology as written in a file: the serde form of [`Topology`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopologySpec {
    /// A name for people (a preset writes its own spelling, e.g. `frontier:16`).
    #[serde(default)]
    pub name: String,
    /// Link class per present level, keyed by level name.
    pub links: BTreeMap<String, LinkClass>,
    /// Where every rank sits.
    pub ranks: Vec<RankSpec>,
    /// Network interfaces and the ranks each one serves.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nics: Vec<NicSpec>,
    /// The GPU-to-GPU links inside a node, where a node is not uniform (a Frontier
    /// node's MI250X pattern); absent: every pair meets on its level's link class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_links: Option<NodeLinksSpec>,
}

/// The direct links between the ranks of a node, the same in every node: how many
/// links join each pair, by the ranks' positions in their node, and what one link
/// carries. A node with fewer ranks (a preset cut short by `,ranks=M`) uses the first
/// rows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeLinksSpec {
    /// One link in one direction: bandwidth (bytes per second) and latency.
    pub link: LinkClass,
    /// `matrix[i][j]`: the links between the node's `i`-th and `j`-th rank (square,
    /// symmetric, zero on the diagonal; 0 where two ranks have no direct link).
    pub matrix: Vec<Vec<u32>>,
}

impl NodeLinksSpec {
    /// Checks the matrix against `topology` and builds the model's form.
    fn check(&self, topology: &Topology) -> Result<NodeLinks> {
        check_link("node_links.link", &self.link)?;
        let k = self.matrix.len();
        if k == 0 {
            return Err(TopologyError::invalid(
                "node_links.matrix",
                "empty: one row per rank of a node",
            ));
        }
        for (i, row) in self.matrix.iter().enumerate() {
            if row.len() != k {
                return Err(TopologyError::invalid(
                    format!("node_links.matrix[{i}]"),
                    format!("has {} entries, but the matrix has {k} rows", row.len()),
                ));
            }
            if row[i] != 0 {
                return Err(TopologyError::invalid(
                    format!("node_links.matrix[{i}][{i}]"),
                    format!("is {}: a rank has no link to itself (0)", row[i]),
                ));
            }
            for (j, &v) in row.iter().enumerate() {
                if self.matrix[j][i] != v {
                    return Err(TopologyError::invalid(
                        format!("node_links.matrix[{i}][{j}]"),
                        format!(
                            "is {v}, but node_links.matrix[{j}][{i}] is {}: links join both ways",
                            self.matrix[j][i]
                        ),
                    ));
                }
            }
        }
        if !topology.has_level(Level::Node) {
            return Err(TopologyError::invalid(
                "node_links",
                "the topology has no node level for the links to be inside",
            ));
        }
        let largest = topology.max_domain_size(Level::Node);
        if largest > k {
            return Err(TopologyError::invalid(
                "node_links.matrix",
                format!("has {k} rows, but a node has {largest} ranks"),
            ));
        }
        Ok(NodeLinks {
            link: self.link,
            matrix: self.matrix.clone(),
        })
    }
}

/// One rank's place in the tree.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RankSpec {
    /// The rank, 0..N-1, each exactly once.
    pub rank: i64,
    /// The host name of the rank's node, if known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// Domain label per level between device and system (`package`, `node`, `switch`, `group`).
    #[serde(flatten)]
    pub domains: BTreeMap<String, i64>,
}

/// One network interface.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NicSpec {
    /// Interface name (`hsn0`, `cxi0`, `mlx5_0`, `eth0`).
    pub name: String,
    /// Injection bandwidth, bytes per second.
    pub bandwidth: f64,
    /// Per-message latency, seconds.
    #[serde(default)]
    pub latency: f64,
    /// The ranks (devices) this NIC serves; all on one node.
    pub ranks: Vec<i64>,
}

fn check_link(field: &str, link: &LinkClass) -> Result<()> {
    if !(link.bandwidth.is_finite() && link.bandwidth > 0.0) {
        return Err(TopologyError::invalid(
            format!("{field}.bandwidth"),
            format!(
                "must be a positive, finite number of bytes per second, got {}",
                link.bandwidth
            ),
        ));
    }
    if !(link.latency.is_finite() && link.latency >= 0.0) {
        return Err(TopologyError::invalid(
            format!("{field}.latency"),
            format!(
                "must be a non-negative, finite number of seconds, got {}",
                link.latency
            ),
        ));
    }
    if !(link.taper.is_finite() && link.taper >= 1.0) {
        return Err(TopologyError::invalid(
            format!("{field}.taper"),
            format!("must be >= 1 (1 = no oversubscription), got {}", link.taper),
        ));
    }
    Ok(())
}

impl TopologySpec {
    /// Parses TOML.
    pub fn from_toml_str(text: &str) -> Result<Self> {
        toml::from_str(text).map_err(|e| TopologyError::Parse {
            what: "TOML".into(),
            reason: e.to_string(),
        })
    }

    /// Parses JSON.
    pub fn from_json_str(text: &str) -> Result<Self> {
        serde_json::from_str(text).map_err(|e| TopologyError::Parse {
            what: "JSON".into(),
            reason: e.to_string(),
        })
    }

    /// Writes TOML, ending in a newline.
    pub fn to_toml_string(&self) -> String {
        let mut text = toml::to_string(self).expect("a topology spec always serialises to TOML");
        if !text.ends_with('\n') {
            text.push('\n');
        }
        text
    }

    /// Writes pretty JSON.
    pub fn to_json_string(&self) -> String {
        serde_json::to_string_pretty(self).expect("a topology spec always serialises to JSON")
    }

    /// Validates the spec and builds the [`Topology`].
    pub fn build(&self) -> Result<Topology> {
        // Levels and link classes.
        let mut links: Vec<(Level, LinkClass)> = Vec::new();
        for (name, link) in &self.links {
            let level: Level = name.parse().map_err(|reason: String| {
                TopologyError::invalid(format!("links.{name}"), reason)
            })?;
            check_link(&format!("links.{name}"), link)?;
            links.push((level, *link));
        }
        links.sort_by_key(|(l, _)| *l);
        for must in [Level::Device, Level::System] {
            if !links.iter().any(|(l, _)| *l == must) {
                let what = if must == Level::Device {
                    "the memory-copy rate of one rank"
                } else {
                    "the link between ranks that meet only at the top"
                };
                return Err(TopologyError::invalid(
                    format!("links.{must}"),
                    format!("missing: every topology needs the {must} link class ({what})"),
                ));
            }
        }
        let inner: Vec<Level> = links
            .iter()
            .map(|(l, _)| *l)
            .filter(|l| !matches!(l, Level::Device | Level::System))
            .collect();

        // Ranks.
        let n = self.ranks.len();
        if n == 0 {
            return Err(TopologyError::invalid(
                "ranks",
                "no ranks: a topology needs at least one",
            ));
        }
        // Every rank 0..N-1 exactly once: a negative rank and a duplicate are named at
        // their entry; a rank beyond N-1 means some rank below it is missing, which is
        // what the file most likely got wrong, so the gap is reported.
        let mut slot: Vec<Option<usize>> = vec![None; n];
        let mut beyond: Option<(usize, i64)> = None;
        for (i, r) in self.ranks.iter().enumerate() {
            let field = format!("ranks[{i}].rank");
            if r.rank < 0 {
                return Err(TopologyError::invalid(
                    field,
                    format!(
                        "rank {} is negative: ranks must be 0..{} (one entry each)",
                        r.rank,
                        n - 1
                    ),
                ));
            }
            if r.rank as u64 >= n as u64 {
                beyond.get_or_insert((i, r.rank));
                continue;
            }
            let k = r.rank as usize;
            if let Some(prev) = slot[k] {
                return Err(TopologyError::invalid(
                    field,
                    format!("duplicate rank {k} (also at ranks[{prev}])"),
                ));
            }
            slot[k] = Some(i);
        }
        if let Some(missing) = slot.iter().position(|s| s.is_none()) {
            let why = match beyond {
                Some((i, r)) => format!(
                    "; ranks[{i}] gives rank {r}, beyond the last rank {}",
                    n - 1
                ),
                None => String::new(),
            };
            return Err(TopologyError::invalid(
                "ranks",
                format!(
                    "rank {missing} missing: {n} entries must give ranks 0..{} once each{why}",
                    n - 1
                ),
            ));
        }

        // Labels per rank per inner level, in rank order.
        let mut labels: Vec<Vec<i64>> = vec![Vec::with_capacity(n); inner.len()];
        let mut hosts: Vec<Option<String>> = Vec::with_capacity(n);
        for (rank, entry) in slot.iter().enumerate() {
            let i = entry.expect("checked above");
            let spec = &self.ranks[i];
            for key in spec.domains.keys() {
                let level: Level = key.parse().map_err(|reason: String| {
                    TopologyError::invalid(format!("ranks[{i}].{key}"), reason)
                })?;
                if matches!(level, Level::Device | Level::System) {
                    return Err(TopologyError::invalid(
                        format!("ranks[{i}].{key}"),
                        format!(
                            "the {level} level is implicit (one rank / every rank); do not give it"
                        ),
                    ));
                }
                if !inner.contains(&level) {
                    return Err(TopologyError::invalid(
                        format!("ranks[{i}].{key}"),
                        format!("level '{level}' has no link class in [links]"),
                    ));
                }
            }
            for (li, level) in inner.iter().enumerate() {
                let label = *spec.domains.get(level.name()).ok_or_else(|| {
                    TopologyError::invalid(
                        format!("ranks[{i}]"),
                        format!("rank {rank} gives no '{level}', but level {level} is present in [links]"),
                    )
                })?;
                if label < 0 {
                    return Err(TopologyError::invalid(
                        format!("ranks[{i}].{level}"),
                        format!("domain label must be non-negative, got {label}"),
                    ));
                }
                labels[li].push(label);
            }
            if let Some(h) = &spec.host
                && h.is_empty()
            {
                return Err(TopologyError::invalid(
                    format!("ranks[{i}].host"),
                    "empty host name",
                ));
            }
            hosts.push(spec.host.clone());
        }

        // NICs.
        let mut nics = Vec::with_capacity(self.nics.len());
        let mut nic_of: Vec<Option<usize>> = vec![None; n];
        for (j, nic) in self.nics.iter().enumerate() {
            let field = format!("nics[{j}]");
            if nic.name.is_empty() {
                return Err(TopologyError::invalid(
                    format!("{field}.name"),
                    "empty NIC name",
                ));
            }
            check_link(&field, &LinkClass::new(nic.bandwidth, nic.latency))?;
            if nic.ranks.is_empty() {
                return Err(TopologyError::invalid(
                    format!("{field}.ranks"),
                    format!("NIC '{}' serves no device", nic.name),
                ));
            }
            let mut served = Vec::with_capacity(nic.ranks.len());
            for &r in &nic.ranks {
                if r < 0 || r as u64 >= n as u64 {
                    return Err(TopologyError::invalid(
                        format!("{field}.ranks"),
                        format!(
                            "NIC '{}' serves rank {r}, which does not exist (ranks are 0..{})",
                            nic.name,
                            n - 1
                        ),
                    ));
                }
                let r = r as usize;
                if nic_of[r] == Some(j) {
                    return Err(TopologyError::invalid(
                        format!("{field}.ranks"),
                        format!("NIC '{}' lists rank {r} twice", nic.name),
                    ));
                }
                if let Some(other) = nic_of[r] {
                    return Err(TopologyError::invalid(
                        format!("{field}.ranks"),
                        format!(
                            "rank {r} is served by both NIC '{}' (nics[{other}]) and NIC '{}'",
                            self.nics[other].name, nic.name
                        ),
                    ));
                }
                nic_of[r] = Some(j);
                served.push(r);
            }
            served.sort_unstable();
            nics.push(Nic {
                name: nic.name.clone(),
                bandwidth: nic.bandwidth,
                latency: nic.latency,
                ranks: served,
            });
        }

        let levels: Vec<(Level, LinkClass)> = links;
        let entry: Vec<usize> = slot.iter().map(|s| s.expect("checked above")).collect();
        let topology = Topology::assemble(
            self.name.clone(),
            levels,
            &inner,
            labels,
            hosts,
            nics,
            Some(&entry),
        )?;
        match &self.node_links {
            None => Ok(topology),
            Some(spec) => {
                let links = spec.check(&topology)?;
                Ok(topology.with_node_links(links))
            }
        }
    }

    /// Reads a file: `.json` is JSON, anything else TOML (a file that starts with `{` is JSON too).
    ///
    /// The file must be a regular file (a link to one is followed) of at most
    /// [`MAX_FILE_BYTES`]: anything else fails at once with
    /// [`TopologyError::NotAFile`] or [`TopologyError::TooLarge`], so that
    /// `--file /dev/zero` or a FIFO neither fills memory nor blocks.
    pub fn load(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let text = read_bounded(path)?;
        let is_json =
            path.extension().is_some_and(|e| e == "json") || text.trim_start().starts_with('{');
        let parsed = if is_json {
            Self::from_json_str(&text)
        } else {
            Self::from_toml_str(&text)
        };
        parsed.map_err(|e| match e {
            TopologyError::Parse { reason, .. } => TopologyError::Parse {
                what: path.display().to_string(),
                reason,
            },
            other => other,
        })
    }
}
