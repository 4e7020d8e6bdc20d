//! The card: what one rank publishes about its transports for the others at bootstrap
//! (host, topology, fabric addresses, process, doorbell, segment file), as JSON, and its
//! checks: every field of every rank's card has its type, a bounded size and a
//! well-formed value before anything uses it. The bootstrap carries cards as bytes;
//! `connect.rs` makes and reads them.

use crate::error::{Error, Result};
use crate::host::proc::Proc;
use crate::transport::fabric::{LOCAL, MAX_NAME, NET};
use crate::transport::text::{hex, unhex};

/// What one rank publishes at bootstrap.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Card {
    /// Its host name.
    pub(super) host: String,
    /// Its topology spec (`HALO_TOPOLOGY`; every rank must give the same).
    pub(super) topology: String,
    /// SHA-256 (hexadecimal) of the topology that spec built on this rank (its levels,
    /// ranks, NICs and link matrix, as JSON): ranks that read the same file name must
    /// have read the same machine. Empty without a spec, or when it did not build here.
    pub(super) topology_digest: String,
    /// Its endpoint names, slot by slot (local, network).
    pub(super) names: [Option<Vec<u8>>; 2],
    /// Its process, for peers on the same host: PID namespace and process.
    pub(super) process: Option<(String, Proc)>,
    /// Its doorbell file, for peers on the same host (`block`).
    pub(super) bell: Option<String>,
    /// The empty shared-memory segment file this rank made: its host's segment if it
    /// is the lowest rank of that host (`None`: it made none, or the fabric is forced).
    pub(super) shm: Option<String>,
    /// Its `HALO_TRANSPORT` (`auto`, `shm` or `fabric`; missing: `auto`).
    pub(super) transport: Option<String>,
}

impl Card {
    /// The card as JSON.
    pub(super) fn encode(&self) -> Vec<u8> {
        let mut v = serde_json::json!({
            "host": self.host,
            "topology": self.topology,
            "local": self.names[LOCAL].as_deref().map(hex),
            "net": self.names[NET].as_deref().map(hex),
        });
        if !self.topology_digest.is_empty() {
            v["topology_digest"] = self.topology_digest.as_str().into();
        }
        if let Some(b) = &self.bell {
            v["bell"] = b.as_str().into();
        }
        if let Some(p) = &self.shm {
            v["shm"] = p.as_str().into();
        }
        if let Some(t) = &self.transport {
            v["transport"] = t.as_str().into();
        }
        if let Some((ns, p)) = &self.process {
            v["pidns"] = ns.as_str().into();
            v["pid"] = p.pid.into();
            v["start"] = p.start.into();
        }
        v.to_string().into_bytes()
    }

    /// Reads and checks rank `rank`'s card: every field has its type, a bounded size
    /// and a well-formed value (the addresses are checked against the provider when
    /// they are inserted, by the fabric transport's `FabricEndpoint::check_name`). Errors
    /// name the rank and the field.
    pub(super) fn decode(rank: usize, bytes: &[u8]) -> Result<Card> {
        let bad = |field: &str, why: &str| Error::InvalidUsage {
            peer: Some(rank),
            message: format!("rank {rank}'s bootstrap card: field `{field}` {why}"),
        };
        let v: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|e| Error::InvalidUsage {
                peer: Some(rank),
                message: format!("rank {rank}'s bootstrap card is not a HALO card ({e})"),
            })?;
        let text = |k: &str, max: usize| -> Result<Option<String>> {
            match v.get(k) {
                None | Some(serde_json::Value::Null) => Ok(None),
                Some(serde_json::Value::String(s)) if s.is_empty() => Err(bad(k, "is empty")),
                Some(serde_json::Value::String(s)) if s.len() > max => {
                    Err(bad(k, &format!("is {} bytes, more than {max}", s.len())))
                }
                Some(serde_json::Value::String(s)) if s.chars().any(char::is_control) => {
                    Err(bad(k, "holds control characters"))
                }
                Some(serde_json::Value::String(s)) => Ok(Some(s.clone())),
                Some(_) => Err(bad(k, "is not a string")),
            }
        };
        let name = |k: &str| -> Result<Option<Vec<u8>>> {
            match text(k, 2 * MAX_NAME)? {
                None => Ok(None),
                Some(s) => unhex(&s)
                    .map(Some)
                    .ok_or_else(|| bad(k, "is not an address in hexadecimal")),
            }
        };
        let host = text("host", HOST_MAX)?.ok_or_else(|| bad("host", "is missing"))?;
        let topology = match v.get("topology") {
            Some(serde_json::Value::String(s)) if s.is_empty() => String::new(),
            _ => text("topology", TOPOLOGY_MAX)?.ok_or_else(|| bad("topology", "is missing"))?,
        };
        let topology_digest = text("topology_digest", 64)?.unwrap_or_default();
        if !(topology_digest.is_empty()
            || topology_digest.len() == 64
                && topology_digest
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
        {
            return Err(bad(
                "topology_digest",
                "is not a SHA-256 in lower-case hexadecimal",
            ));
        }
        let names = [name("local")?, name("net")?];
        let pid = match v.get("pid") {
            None | Some(serde_json::Value::Null) => None,
            Some(p) => Some(
                p.as_u64()
                    .filter(|&p| (1..=PID_MAX).contains(&p))
                    .ok_or_else(|| bad("pid", &format!("is not a process id (1..={PID_MAX})")))?
                    as u32,
            ),
        };
        let start = match v.get("start") {
            None | Some(serde_json::Value::Null) => None,
            Some(s) => Some(
                s.as_u64()
                    .ok_or_else(|| bad("start", "is not a start time"))?,
            ),
        };
        let pidns = text("pidns", 64)?;
        if let Some(ns) = &pidns
            && !(ns.starts_with("pid:[") && ns.ends_with(']'))
        {
            return Err(bad("pidns", "is not a PID namespace (pid:[N])"));
        }
        let process = match (pidns, pid, start) {
            (Some(ns), Some(pid), Some(start)) => Some((ns, Proc { pid, start })),
            (None, None, None) => None,
            _ => {
                return Err(bad(
                    "pid",
                    "comes without its pidns and start, or they without it",
                ));
            }
        };
        let bell = text("bell", 255)?;
        if let Some(b) = &bell
            && !crate::host::files::is_shared_name(b, crate::host::files::Kind::Bell)
        {
            return Err(bad(
                "bell",
                "is not a HALO doorbell file (/dev/shm/halo-bell-N-N-N-TAG)",
            ));
        }
        let shm = text("shm", 255)?;
        if let Some(p) = &shm
            && !crate::transport::shm::is_segment_path(p)
        {
            return Err(bad(
                "shm",
                "is not a HALO shared-memory segment (/dev/shm/halo-shm-N-N-N-TAG)",
            ));
        }
        let transport = text("transport", 16)?;
        if let Some(t) = &transport
            && !matches!(t.as_str(), "auto" | "shm" | "fabric")
        {
            return Err(bad("transport", "is not auto, shm or fabric"));
        }
        Ok(Card {
            host,
            topology,
            topology_digest,
            names,
            process,
            bell,
            shm,
            transport,
        })
    }
}

/// Longest host name in a card (Linux allows 64; DNS names 253).
const HOST_MAX: usize = 255;
/// Longest topology spec in a card (a preset or a file path).
const TOPOLOGY_MAX: usize = 4096;
/// Largest process id Linux hands out (`pid_max` at most 2^22).
const PID_MAX: u64 = 1 << 22;

/// Decodes `bytes` as rank `rank`'s bootstrap card (with every check a real card gets)
/// and returns the accepted card encoded again. Only for the fuzz target
/// `fuzz/fuzz_targets/card.rs`, which feeds it hostile bytes and checks that the
/// re-encoded card decodes to itself; not part of the API.
#[doc(hidden)]
pub fn decode_card_for_fuzzing(rank: usize, bytes: &[u8]) -> Result<Vec<u8>> {
    Card::decode(rank, bytes).map(|card| card.encode())
}
