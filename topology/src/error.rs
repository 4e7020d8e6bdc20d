//! The error type of `halo-topology`.

/// What went wrong building, loading or querying a topology.
///
/// Every variant names what was wrong; `Invalid` carries the path of the
/// offending field in the file format (for example `ranks[3].node` or `nics[0].ranks`).
#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    /// A topology description is inconsistent.
    #[error("invalid topology: {field}: {reason}")]
    Invalid {
        /// Path of the offending field, e.g. `levels[1].bandwidth`.
        field: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A file or string could not be parsed as TOML or JSON.
    #[error("cannot parse topology {what}: {reason}")]
    Parse {
        /// The file name or "string".
        what: String,
        /// The parser's message (it names line and column).
        reason: String,
    },
    /// A file could not be read.
    #[error("cannot read topology file {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// A topology file is larger than [`crate::MAX_FILE_BYTES`].
    #[error(
        "topology file {path} is larger than the limit of {limit} bytes ({} MiB)",
        limit >> 20
    )]
    TooLarge {
        /// The file.
        path: String,
        /// The limit, [`crate::MAX_FILE_BYTES`].
        limit: u64,
    },
    /// A topology file is not a regular file (a device, a FIFO, a directory...).
    #[error("topology file {path} is not a regular file: it is {kind}")]
    NotAFile {
        /// The file.
        path: String,
        /// What it is instead ("a character device", "a FIFO", ...).
        kind: &'static str,
    },
    /// A preset name or its arguments are not understood.
    #[error("bad preset '{spec}': {reason}")]
    Preset {
        /// The preset string as given.
        spec: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A query named a rank, level or domain the topology does not have.
    #[error("{0}")]
    OutOfRange(String),
    /// Discovery of the local machine failed.
    #[error("discovery failed: {0}")]
    Discover(String),
}

impl TopologyError {
    pub(crate) fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        TopologyError::Invalid {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

/// Result with [`TopologyError`].
pub type Result<T, E = TopologyError> = std::result::Result<T, E>;
