//! Every `HALO_*` environment variable HALO reads, declared once.
//!
//! NCCL declares each of its variables once (`NCCL_PARAM(name, env, default)`) and
//! UCX prints its table with `ucx_info -c`; this crate is HALO's table. Each
//! [`Param`] has its name, what its value is ([`Kind`]), its default, what a malformed
//! value does ([`OnBad`]), who reads it and one line of documentation. Every crate of
//! the workspace reads its variables through these declarations (a test checks that no
//! source reads a `HALO_*` variable by name), `halo params` prints them with their
//! current values, and `docs/PARAMETERS.md` is generated from [`markdown`] (a test
//! checks the committed file is current).
//!
//! The crate depends on nothing but `tracing`, so the `-sys` crates at the bottom of
//! the workspace can use it too.
//!
//! ```
//! use halo_params::{SHM_CMA_MIN, Kind};
//!
//! // Unset: None. Set: the number, or an error naming the variable.
//! assert_eq!(SHM_CMA_MIN.number_from(None).unwrap(), None);
//! assert_eq!(SHM_CMA_MIN.number_from(Some(" 4096 ")).unwrap(), Some(4096));
//! let e = SHM_CMA_MIN.number_from(Some("4k")).unwrap_err();
//! assert_eq!(e.to_string(), "HALO_SHM_CMA_MIN=\"4k\" is not a number of bytes");
//! assert!(matches!(SHM_CMA_MIN.kind, Kind::Number { .. }));
//! ```

use std::fmt::Write as _;

/// What a parameter's value is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A whole number of `unit`s in `min..=max`.
    Number {
        /// What one is ("bytes", "milliseconds", "polls").
        unit: &'static str,
        /// The smallest value taken.
        min: u64,
        /// The largest value taken.
        max: u64,
    },
    /// One of these words (parsed by its reader; listed for the docs).
    Choice(&'static [&'static str]),
    /// Text its reader checks: a name, a list, an address, a path.
    Text,
    /// A secret: [`Param::display_value`] never shows it.
    Secret,
}

/// What a malformed value does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnBad {
    /// The call that reads it fails naming the variable (`haloInvalidArgument`).
    Error,
    /// A warning is logged naming the variable, and the default is used.
    Warn,
}

/// Who reads a parameter (the sections of the table).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Reader {
    /// libhalo when a communicator is made and used.
    Communicator,
    /// The bootstrap (joining a job).
    Bootstrap,
    /// The shared-memory transport.
    Shm,
    /// The libfabric transport.
    Fabric,
    /// The all-to-all-v's count exchange.
    AllToAllV,
    /// The device path's library search (NCCL / RCCL and the runtime).
    Device,
    /// Local topology discovery (`halo topo`, a communicator without `HALO_TOPOLOGY`).
    Discovery,
    /// Logging.
    Logging,
    /// The `halo` tool.
    Tool,
    /// The Python package (read in Python; listed here for the docs).
    Python,
}

impl Reader {
    /// The section's heading.
    pub fn title(self) -> &'static str {
        match self {
            Reader::Communicator => "Communicator",
            Reader::Bootstrap => "Bootstrap (joining a job)",
            Reader::Shm => "Shared-memory transport",
            Reader::Fabric => "libfabric transport",
            Reader::AllToAllV => "All-to-all-v",
            Reader::Device => "Device path (NCCL / RCCL)",
            Reader::Discovery => "Topology discovery",
            Reader::Logging => "Logging",
            Reader::Tool => "The halo tool",
            Reader::Python => "Python package",
        }
    }
}

/// One `HALO_*` environment variable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Param {
    /// The variable's name.
    pub name: &'static str,
    /// What its value is.
    pub kind: Kind,
    /// The default, as the docs say it.
    pub default: &'static str,
    /// What a malformed value does.
    pub on_bad: OnBad,
    /// Who reads it.
    pub reader: Reader,
    /// One line of documentation.
    pub doc: &'static str,
}

/// A malformed value, naming the variable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParamError {
    /// Not a whole number.
    #[error("{name}={value:?} is not a number of {unit}")]
    NotANumber {
        /// The variable.
        name: &'static str,
        /// Its value.
        value: String,
        /// What the number counts.
        unit: &'static str,
    },
    /// A number outside the bounds.
    #[error("{name}={value:?} is outside {min}..={max} {unit}")]
    OutOfRange {
        /// The variable.
        name: &'static str,
        /// Its value.
        value: String,
        /// The smallest taken.
        min: u64,
        /// The largest taken.
        max: u64,
        /// What the number counts.
        unit: &'static str,
    },
}

impl Param {
    /// The value in this process's environment (`None`: unset or not UTF-8).
    pub fn raw(&self) -> Option<String> {
        std::env::var(self.name).ok()
    }

    /// Whether the variable is set at all.
    pub fn is_set(&self) -> bool {
        std::env::var_os(self.name).is_some()
    }

    /// The value, unless it is unset or blank.
    pub fn text(&self) -> Option<String> {
        self.raw().filter(|v| !v.trim().is_empty())
    }

    /// The number in `raw` (`None` when unset), trimmed and checked against the
    /// bounds of a [`Kind::Number`] (other kinds have none).
    ///
    /// # Errors
    /// [`ParamError`] naming the variable when `raw` is not a whole number or is out
    /// of bounds.
    pub fn number_from(&self, raw: Option<&str>) -> Result<Option<u64>, ParamError> {
        let Some(value) = raw else { return Ok(None) };
        let (unit, min, max) = match self.kind {
            Kind::Number { unit, min, max } => (unit, min, max),
            _ => ("units", 0, u64::MAX),
        };
        let n = value
            .trim()
            .parse::<u64>()
            .map_err(|_| ParamError::NotANumber {
                name: self.name,
                value: value.to_string(),
                unit,
            })?;
        if !(min..=max).contains(&n) {
            return Err(ParamError::OutOfRange {
                name: self.name,
                value: value.to_string(),
                min,
                max,
                unit,
            });
        }
        Ok(Some(n))
    }

    /// The number in the environment ([`Param::number_from`]).
    ///
    /// # Errors
    /// As [`Param::number_from`].
    pub fn number(&self) -> Result<Option<u64>, ParamError> {
        self.number_from(self.raw().as_deref())
    }

    /// The number in the environment, a malformed value logged as a warning and taken
    /// as unset (the [`OnBad::Warn`] parameters).
    pub fn number_or_warn(&self) -> Option<u64> {
        self.number().unwrap_or_else(|e| {
            tracing::warn!("{e}: ignored, the default ({}) is used", self.default);
            None
        })
    }

    /// The current value as `halo params` shows it: `-` when unset, `(set)` for a
    /// secret.
    pub fn display_value(&self) -> String {
        match (self.kind, std::env::var_os(self.name)) {
            (_, None) => "-".into(),
            (Kind::Secret, Some(_)) => "(set)".into(),
            (_, Some(v)) => format!("{:?}", v.to_string_lossy()),
        }
    }

    /// What a value is, for the docs.
    pub fn describe_kind(&self) -> String {
        match self.kind {
            Kind::Number { unit, min, max } if max == u64::MAX => format!("{unit}, >= {min}"),
            Kind::Number { unit, min, max } => format!("{unit}, {min}..={max}"),
            Kind::Choice(words) => words.join(" \\| "),
            Kind::Text => "text".into(),
            Kind::Secret => "secret".into(),
        }
    }
}

macro_rules! params {
    ($( $(#[$m:meta])* $id:ident = $name:literal, $kind:expr, $default:literal, $on_bad:ident, $reader:ident, $doc:literal; )*) => {
        $(
            $(#[$m])*
            #[doc = concat!("`", $name, "`: ", $doc)]
            pub const $id: Param = Param {
                name: $name,
                kind: $kind,
                default: $default,
                on_bad: OnBad::$on_bad,
                reader: Reader::$reader,
                doc: $doc,
            };
        )*
        /// Every parameter, in the table's order.
        pub const ALL: &[Param] = &[$($id),*];
    };
}

const fn count(unit: &'static str, min: u64, max: u64) -> Kind {
    Kind::Number { unit, min, max }
}

const MS: Kind = count("milliseconds", 0, u64::MAX);
const US: Kind = count("microseconds", 0, u64::MAX);

params! {
    TRANSPORT = "HALO_TRANSPORT", Kind::Choice(&["auto", "shm", "fabric"]), "auto", Error, Communicator,
        "How ranks of one job reach each other: shared memory inside a host and libfabric between hosts (auto), or one of them for every peer.";
    TOPOLOGY = "HALO_TOPOLOGY", Kind::Text, "discovered", Error, Communicator,
        "The topology instead of discovering it: a preset (frontier:16), nodes:AxB (A nodes of B ranks, emulated) or a topology file.";
    TIMEOUT_MS = "HALO_TIMEOUT_MS", MS, "60000", Error, Communicator,
        "How long one operation may take before it fails on every rank (also the halo tool's --timeout default).";
    ALGO = "HALO_ALGO", Kind::Text, "auto", Error, Communicator,
        "The all-to-all algorithm for every call: auto, flat, pairwise, bruck, halo or halo2d.";
    BARRIER_ALGO = "HALO_BARRIER_ALGO", Kind::Text, "auto", Error, Communicator,
        "The all-to-all algorithm the barrier runs on (flat, pairwise, bruck, halo, halo2d); auto: flat on one host up to 8 ranks, else bruck.";
    SPIN = "HALO_SPIN", count("polls", 0, u32::MAX as u64), "4", Warn, Communicator,
        "Polls before the schedule engine starts to back off.";

    BOOTSTRAP_ADDR = "HALO_BOOTSTRAP_ADDR", Kind::Text, "MASTER_ADDR:MASTER_PORT+1", Error, Bootstrap,
        "The rendezvous root's ip:port (halo launch sets it); rank 0 serves it.";
    BOOTSTRAP_SERVED = "HALO_BOOTSTRAP_SERVED", Kind::Choice(&["0", "1"]), "0", Error, Bootstrap,
        "1: the launcher serves the rendezvous root, rank 0 only joins (halo launch sets it).";
    BOOTSTRAP_TIMEOUT_MS = "HALO_BOOTSTRAP_TIMEOUT_MS", MS, "120000", Error, Bootstrap,
        "How long joining a job may take: the root waits for every rank, a rank for the answer.";
    SOCKET_IFNAME = "HALO_SOCKET_IFNAME", Kind::Text, "-", Error, Bootstrap,
        "The network interface whose IPv4 address a rendezvous root binds (like NCCL_SOCKET_IFNAME).";
    SECRET = "HALO_SECRET", Kind::Secret, "the key file", Error, Bootstrap,
        "The job's secret, 64 hex digits (halo launch sets a random one per job); insecure-derived opts out, with a warning.";
    SECRET_FILE = "HALO_SECRET_FILE", Kind::Text, "~/.config/halo/secret", Error, Bootstrap,
        "The per-user key file (mode 0600, made by halo secret init) a job's secret is derived from without HALO_SECRET.";

    SHM_CMA = "HALO_SHM_CMA", Kind::Choice(&["auto", "0", "off", "1", "on"]), "auto", Error, Shm,
        "The single copy (process_vm_readv) for large messages: where the kernel allows it (auto), never, or required.";
    SHM_CMA_MIN = "HALO_SHM_CMA_MIN", count("bytes", 0, u64::MAX), "32768", Error, Shm,
        "Messages of at least this many bytes go by the single copy.";
    SHM_SLOTS = "HALO_SHM_SLOTS", count("slots", 2, 1 << 16), "32 (up to 16 ranks), 16 (64), 8", Warn, Shm,
        "Cells per ring of the shared-memory segment.";
    SHM_CELL = "HALO_SHM_CELL", count("bytes", 40, 1 << 24), "8192", Warn, Shm,
        "Bytes per cell (rounded up to 64).";
    SHM_SPIN_US = "HALO_SHM_SPIN_US", US, "1000", Error, Shm,
        "How long a rank polls, yielding, before it sleeps on its doorbell.";
    SHM_PURE_US = "HALO_SHM_PURE_US", US, "HALO_SHM_SPIN_US", Warn, Shm,
        "How long of that it polls without yielding when every rank has a core.";

    FABRIC_PROVIDER = "HALO_FABRIC_PROVIDER", Kind::Text, "shm inside a host, HALO_FABRIC_NET_PROVIDER between", Error, Fabric,
        "One libfabric provider for every peer (tcp;ofi_rxm, shm, verbs;ofi_rxm, cxi).";
    FABRIC_NET_PROVIDER = "HALO_FABRIC_NET_PROVIDER", Kind::Text, "tcp;ofi_rxm", Error, Fabric,
        "The libfabric provider between hosts.";
    FABRIC_ADDR = "HALO_FABRIC_ADDR", Kind::Text, "the provider's choice", Error, Fabric,
        "The IP address the network provider binds.";
    PROGRESS = "HALO_PROGRESS", Kind::Choice(&["spin", "yield", "sleep", "block"]), "sleep", Error, Fabric,
        "How a rank waits for libfabric completions.";
    WATCHDOG_MS = "HALO_WATCHDOG_MS", MS, "3000", Error, Fabric,
        "How often the libfabric transport checks that its peers' processes are alive.";

    A2AV_EAGER = "HALO_A2AV_EAGER", count("bytes", 0, 1 << 20), "measured", Warn, AllToAllV,
        "Bytes of each block carried with the counts (0: counts first, then the data); above the bound it is cut to it.";
    A2AV_GATHER_MAX = "HALO_A2AV_GATHER_MAX", count("ranks", 0, u64::MAX), "measured", Warn, AllToAllV,
        "Up to how many ranks the count matrix is gathered in one step.";
    A2AV_SPECULATE = "HALO_A2AV_SPECULATE", count("bytes", 0, 16 << 20), "measured", Warn, AllToAllV,
        "Bytes per block sent before the counts are known (0: off); above the bound it is cut to it.";

    NCCL_LIBRARY = "HALO_NCCL_LIBRARY", Kind::Text, "searched", Error, Device,
        "The NCCL / RCCL library to load; when set, the only one tried.";
    CUDART_LIBRARY = "HALO_CUDART_LIBRARY", Kind::Text, "searched", Error, Device,
        "The CUDA / HIP runtime library to load; when set, the only one tried.";
    PYTHON_SITE = "HALO_PYTHON_SITE", Kind::Text, "-", Error, Device,
        "Python site directories searched for the libraries (nvidia/nccl/lib, torch/lib); the Python package sets it.";
    SEARCH_CHILD = "HALO_SEARCH_CHILD", Kind::Choice(&["1"]), "-", Error, Device,
        "Internal: marks the child process the library search runs its check in.";

    NVML_LIBRARY = "HALO_NVML_LIBRARY", Kind::Text, "libnvidia-ml.so.1, then libnvidia-ml.so", Warn, Discovery,
        "The NVML library (a path) discovery loads on a machine with NVIDIA GPUs for their NVLink links; when set, the only one tried. One that does not load is a warning, not an error: no NVLink links, and discovery's sources say why.";

    DEBUG = "HALO_DEBUG", Kind::Text, "warn", Error, Logging,
        "How much to log on stderr, as NCCL_DEBUG: off, error, warn, info, debug, trace, or a tracing filter (warn,halo_topology=debug).";

    PLOT_FONT = "HALO_PLOT_FONT", Kind::Text, "DejaVu Sans", Error, Tool,
        "The TrueType font file the tool's plots use.";

    LIBRARY = "HALO_LIBRARY", Kind::Text, "searched", Error, Python,
        "The libhalo the Python package loads; when set, the only one tried.";
}

/// The parameter named `name`, if HALO has one.
pub fn find(name: &str) -> Option<&'static Param> {
    ALL.iter().find(|p| p.name == name)
}

/// `docs/PARAMETERS.md`: every parameter, one table per reader.
pub fn markdown() -> String {
    let mut out = String::from(
        "# Parameters\n\n\
         Every `HALO_*` environment variable HALO reads, generated from their one \
         declaration (`params/src/lib.rs`, the `halo-params` crate); `halo params` prints \
         the same table with the values set in its environment. Regenerate this file \
         with `HALO_REGEN_DOCS=1 cargo test -p halo-params --test docs`; CI checks that \
         it is current.\n\n\
         \"Bad value\": *error* — the call that reads it fails naming the variable \
         (`haloInvalidArgument`, a `ValueError` / `HaloError` in Python); *warn* — a \
         warning names it and the default is used.\n",
    );
    let mut readers: Vec<Reader> = ALL.iter().map(|p| p.reader).collect();
    readers.sort();
    readers.dedup();
    for r in readers {
        let _ = write!(
            out,
            "\n## {}\n\n| variable | value | default | bad value | what it does |\n|---|---|---|---|---|\n",
            r.title()
        );
        for p in ALL.iter().filter(|p| p.reader == r) {
            let bad = match p.on_bad {
                OnBad::Error => "error",
                OnBad::Warn => "warn",
            };
            let _ = writeln!(
                out,
                "| `{}` | {} | {} | {} | {} |",
                p.name,
                p.describe_kind(),
                p.default,
                bad,
                p.doc
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_prefixed() {
        let mut names: Vec<&str> = ALL.iter().map(|p| p.name).collect();
        names.sort_unstable();
        let before = names.len();
        names.dedup();
        assert_eq!(before, names.len(), "a parameter is declared twice");
        assert!(names.iter().all(|n| n.starts_with("HALO_")));
        assert_eq!(find("HALO_SHM_CELL"), Some(&SHM_CELL));
        assert_eq!(find("HALO_NOPE"), None);
    }

    #[test]
    fn numbers_are_checked_against_their_bounds() {
        assert_eq!(SHM_SLOTS.number_from(Some("2")), Ok(Some(2)));
        assert_eq!(
            SHM_SLOTS.number_from(Some("1")).unwrap_err().to_string(),
            "HALO_SHM_SLOTS=\"1\" is outside 2..=65536 slots"
        );
        assert_eq!(
            TIMEOUT_MS.number_from(Some("-5")).unwrap_err().to_string(),
            "HALO_TIMEOUT_MS=\"-5\" is not a number of milliseconds"
        );
        assert_eq!(TIMEOUT_MS.number_from(Some(" 250\n")), Ok(Some(250)));
    }

    #[test]
    fn a_secret_is_never_displayed() {
        assert_eq!(SECRET.kind, Kind::Secret);
        // Whatever the environment holds, the secret's value is not shown.
        assert!(matches!(SECRET.display_value().as_str(), "-" | "(set)"));
    }
}
