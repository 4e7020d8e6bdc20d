//! Levels of the domain tree and the link class that joins ranks meeting at each.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// A level of the domain tree, innermost first.
///
/// Two ranks *meet* at the innermost level whose domain holds both of them; the
/// link class of that level is what a message between them crosses. `Device` and
/// `System` are always present: `Device` holds one rank (its link class is the
/// device's own memory-copy rate) and `System` holds every rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    /// One rank: a GPU, a GCD, or one process's device.
    Device,
    /// A multi-die package (an MI250X holds two GCDs).
    Package,
    /// A host: ranks that share memory and the node's NICs.
    Node,
    /// The nodes behind one leaf switch (Frontier: 4 nodes per Rosetta switch).
    Switch,
    /// A dragonfly group (Frontier: one cabinet of 128 nodes).
    Group,
    /// The whole machine.
    System,
}

impl Level {
    /// Every level, innermost first.
    pub const ALL: [Level; 6] = [
        Level::Device,
        Level::Package,
        Level::Node,
        Level::Switch,
        Level::Group,
        Level::System,
    ];

    /// The lowercase name used in files and presets.
    pub fn name(self) -> &'static str {
        match self {
            Level::Device => "device",
            Level::Package => "package",
            Level::Node => "node",
            Level::Switch => "switch",
            Level::Group => "group",
            Level::System => "system",
        }
    }
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Level {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Level::ALL
            .iter()
            .copied()
            .find(|l| l.name() == s)
            .ok_or_else(|| {
                format!("unknown level '{s}' (expected one of device, package, node, switch, group, system)")
            })
    }
}

/// What a message between two ranks that meet at a level crosses.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkClass {
    /// Bandwidth of one link in one direction, bytes per second.
    pub bandwidth: f64,
    /// Per-message latency, seconds.
    pub latency: f64,
    /// Oversubscription of this level's links (1.0 = none; Frontier's global links
    /// are tapered 1.75 : 1). Traffic that all crosses the level at once gets
    /// `bandwidth / taper` per link.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub taper: f64,
}

fn one() -> f64 {
    1.0
}

fn is_one(x: &f64) -> bool {
    *x == 1.0
}

impl LinkClass {
    /// A link class without taper.
    pub const fn new(bandwidth: f64, latency: f64) -> Self {
        LinkClass {
            bandwidth,
            latency,
            taper: 1.0,
        }
    }

    /// The same link class with a taper.
    pub const fn tapered(self, taper: f64) -> Self {
        LinkClass { taper, ..self }
    }

    /// Bandwidth available when every link of the level is busy: `bandwidth / taper`.
    pub fn sustained_bandwidth(&self) -> f64 {
        self.bandwidth / self.taper
    }

    /// Alpha-beta time of one message of `bytes` over this link class, seconds.
    pub fn message_time(&self, bytes: u64) -> f64 {
        self.latency + bytes as f64 / self.bandwidth
    }
}
