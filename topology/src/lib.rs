//! The machine model HALO's collectives are built against.
//!
//! A [`Topology`] places ranks in a tree of domains — device, package, node, switch,
//! group, system; inner levels may be absent — with a [`LinkClass`] (bandwidth,
//! latency, taper) per level and the [`Nic`]s that serve the ranks. The collectives
//! ask it where two ranks meet, which ranks share a domain, a rank's local index and
//! its rank-aligned peer in another domain.
//!
//! Topologies come from presets ([`Topology::preset`]), files ([`Topology::load`],
//! TOML or JSON, see [`spec`]) or discovery of the local machine ([`discover`]).
//!
//! ```
//! use halo_topology::{Level, Topology};
//! let t = Topology::preset("nodes:4x4,ranks=14").unwrap();
//! assert_eq!(t.num_domains(Level::Node), 4);
//! assert_eq!(t.domain_size(Level::Node, 3), 2); // uneven: the last node holds 2 ranks
//! assert_eq!(t.local_index(13, Level::Node), 1);
//! ```

pub mod discover;
mod error;
mod level;
mod model;
mod preset;
pub mod spec;

pub use error::{Result, TopologyError};
pub use level::{Level, LinkClass};
pub use model::{
    Nic, NodeLinks, RELAY_HOPS, RELAY_MAX_RANKS, Rank, Topology, fmt_bandwidth, fmt_seconds,
};
pub use preset::{commodity, dgx_h100, frontier, mi300x, preset_spec};
pub use spec::{MAX_FILE_BYTES, NodeLinksSpec, TopologySpec};
