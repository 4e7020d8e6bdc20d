//! The error type of `halo-piper`.

/// What went wrong describing a model, a hardware profile or a layout, or planning one.
///
/// Every variant that comes from input names the offending field (`hidden`, `ep`,
/// `attention[2].tflops`, ...), so a command can print it as it is.
#[derive(Debug, thiserror::Error)]
pub enum PiperError {
    /// A value is out of range or inconsistent with another one.
    #[error("invalid {what}: {field}: {reason}")]
    Invalid {
        /// What was being described: `model`, `profile`, `layout`, `batch`, ...
        what: &'static str,
        /// The offending field, e.g. `hidden` or `ep`.
        field: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A preset name is not known.
    #[error("unknown {what} preset '{name}' (known: {known})")]
    UnknownPreset {
        /// `model` or `profile`.
        what: &'static str,
        /// The name as given.
        name: String,
        /// The known presets, comma separated.
        known: String,
    },
    /// A file could not be parsed as TOML or JSON.
    #[error("cannot parse {what} file {path}: {reason}")]
    Parse {
        /// `model` or `profile`.
        what: &'static str,
        /// The file.
        path: String,
        /// The parser's message (it names the key, line and column).
        reason: String,
    },
    /// A file could not be read.
    #[error("cannot read {what} file {path}: {source}")]
    Io {
        /// `model` or `profile`.
        what: &'static str,
        /// The file.
        path: String,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// The topology could not be built or restricted to a group.
    #[error(transparent)]
    Topology(#[from] halo_topology::TopologyError),
    /// The all-to-all of an expert-parallel group could not be simulated.
    #[error("simulating the expert all-to-all: {0}")]
    Simulation(#[from] halo_collectives::CollectiveError),
    /// No layout of the model fits the machine.
    #[error("{model} does not fit on {machine}: {reason}; {smallest}")]
    DoesNotFit {
        /// The model's name.
        model: String,
        /// The machine: topology name and GPU count.
        machine: String,
        /// Why, per constraint: what bound the families that came closest.
        reason: String,
        /// The smallest machine of the same kind that fits, as a sentence.
        smallest: String,
    },
    /// The executor's mesh does not use exactly the ranks of the world communicator.
    #[error(
        "layout PP {pp} x EP {ep} x DP {dp} needs {needed} ranks, but the world communicator has {world}"
    )]
    MeshSize {
        /// Pipeline stages.
        pp: usize,
        /// Expert-parallel group size.
        ep: usize,
        /// Data-parallel replicas.
        dp: usize,
        /// `pp * ep * dp`.
        needed: usize,
        /// Ranks of the world communicator.
        world: usize,
    },
    /// The expert-parallel group size does not divide the experts of a block.
    #[error("EP {ep} does not divide the {experts} experts of each block")]
    EpNotDividingExperts {
        /// Expert-parallel group size.
        ep: usize,
        /// Experts per block.
        experts: usize,
    },
    /// More pipeline stages than blocks: some stage would have no block.
    #[error("PP {pp} exceeds the model's {layers} blocks (every stage needs at least one)")]
    PpExceedsLayers {
        /// Pipeline stages.
        pp: usize,
        /// Blocks of the model.
        layers: usize,
    },
    /// The global batch does not split evenly over the data ranks and micro-batches.
    #[error(
        "the global batch of {sequences} sequences does not split into EP {ep} x DP {dp} x {microbatches} micro-batches of whole sequences"
    )]
    BatchSplit {
        /// Sequences in the global batch.
        sequences: usize,
        /// Expert-parallel group size.
        ep: usize,
        /// Data-parallel replicas.
        dp: usize,
        /// Micro-batches per step.
        microbatches: usize,
    },
    /// A communication call of the executor failed.
    #[error("executor communication: {0}")]
    Comm(#[from] halo::Error),
    /// The reference model rejected its input.
    #[error("model: {0}")]
    Model(#[from] halo_moe::MoeError),
    /// A caller-supplied compute implementation failed.
    #[error("compute: {0}")]
    Compute(String),
    /// Expert migration failed; this rank kept its old table, weights, gradients and
    /// optimizer state.
    #[error(
        "expert migration failed while {phase} (this rank keeps the old table and weights): {source}"
    )]
    Migration {
        /// What the move was doing: `transferring block 2`, `voting`, ...
        phase: String,
        /// What failed.
        #[source]
        source: Box<PiperError>,
    },
}

impl PiperError {
    pub(crate) fn invalid(
        what: &'static str,
        field: impl Into<String>,
        reason: impl Into<String>,
    ) -> Self {
        PiperError::Invalid {
            what,
            field: field.into(),
            reason: reason.into(),
        }
    }

    /// True for errors caused by the caller's input (a preset, a file, a size), as
    /// opposed to an answer ("does not fit") or an internal failure.
    pub fn is_input(&self) -> bool {
        matches!(
            self,
            PiperError::Invalid { .. }
                | PiperError::UnknownPreset { .. }
                | PiperError::Parse { .. }
                | PiperError::Io { .. }
                | PiperError::Topology(_)
                | PiperError::MeshSize { .. }
                | PiperError::EpNotDividingExperts { .. }
                | PiperError::PpExceedsLayers { .. }
                | PiperError::BatchSplit { .. }
        )
    }
}

/// Result with [`PiperError`].
pub type Result<T, E = PiperError> = std::result::Result<T, E>;
