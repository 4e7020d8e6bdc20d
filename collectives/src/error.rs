//! The error type of `halo-collectives`.

use std::fmt;
use std::time::Duration;

/// Where the verifier found a schedule wrong: rank, step and block, where they apply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifyError {
    /// The rank whose program is wrong.
    pub rank: usize,
    /// The step, where one is to blame.
    pub step: Option<u32>,
    /// The block `(src, dst)`, where one is to blame.
    pub block: Option<(usize, usize)>,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for VerifyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "rank {}", self.rank)?;
        if let Some(s) = self.step {
            write!(f, ", step {s}")?;
        }
        if let Some((s, d)) = self.block {
            write!(f, ", block {s}->{d}")?;
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for VerifyError {}

/// What went wrong building, verifying or running a collective.
///
/// The variants map one to one onto HALO's C result codes (NCCL's numbering).
#[derive(Debug, thiserror::Error)]
pub enum CollectiveError {
    /// An argument is wrong on this rank alone (a count that overflows, a buffer too small).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// Ranks disagree or the call is not allowed (counts that do not match between a pair).
    #[error("invalid usage: {0}")]
    InvalidUsage(String),
    /// This rank and `peer` disagree on the size of a message or on the call (a
    /// uniform all-to-all with different counts or element types): reported by the
    /// receiver of the message, naming both sizes, and where the transport can tell
    /// it, by the sender too. HALO's `InvalidUsage`.
    #[error("invalid usage: {message}")]
    Mismatch {
        /// The other rank of the pair.
        peer: usize,
        /// Both views of the size.
        message: String,
    },
    /// A step did not complete within the operation's timeout.
    #[error("timeout after {waited:?} in {algorithm}: step {step} ({what}) did not complete")]
    Timeout {
        /// The algorithm that was running.
        algorithm: &'static str,
        /// The oldest pending step.
        step: u32,
        /// The peer of that step, if it talks to one.
        peer: Option<usize>,
        /// The step, in words.
        what: String,
        /// How long the operation waited.
        waited: Duration,
    },
    /// A peer failed or went away.
    #[error("remote error from rank {peer}: {message}")]
    Remote {
        /// The peer.
        peer: usize,
        /// What happened.
        message: String,
    },
    /// The transport or the operating system failed.
    #[error("system error: {0}")]
    System(String),
    /// The operation was aborted.
    #[error("aborted: {0}")]
    Aborted(String),
    /// A schedule failed verification.
    #[error("schedule verification failed: {0}")]
    Verify(#[from] VerifyError),
    /// A bug in HALO: an invariant did not hold.
    #[error("internal error: {0}")]
    Internal(String),
}

/// Result with [`CollectiveError`].
pub type Result<T, E = CollectiveError> = std::result::Result<T, E>;
