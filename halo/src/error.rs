//! The error type of the `halo` crate.
//!
//! One enum for every failure of the library. Its variants map one to one onto the
//! C result codes (`haloResult_t`), which keep NCCL's numbering so that a program
//! written against NCCL or RCCL reads HALO's codes the same way:
//!
//! | code | variant | meaning |
//! |---:|---|---|
//! | 0 | (success, not a variant) | |
//! | 1 | [`Error::UnhandledDeviceError`] | a device (GPU) call failed |
//! | 2 | [`Error::SystemError`] | the operating system or a transport failed |
//! | 3 | [`Error::InternalError`] | a bug in HALO: an invariant did not hold |
//! | 4 | [`Error::InvalidArgument`] | an argument is wrong on this rank alone |
//! | 5 | [`Error::InvalidUsage`] | the ranks disagree, or the call is not allowed |
//! | 6 | [`Error::RemoteError`] | a peer failed or went away |
//! | 7 | [`Error::InProgress`] | a non-blocking operation has not finished yet |
//! | 8 | [`Error::Timeout`] | an operation did not finish within its timeout |
//! | 9 | [`Error::Aborted`] | the operation or the communicator was aborted (HALO's addition) |
//!
//! Codes are never reused; new failures get new numbers.

use halo_collectives::CollectiveError;
use halo_topology::TopologyError;
use std::time::Duration;

/// Result with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in HALO.
///
/// Variants carry what a caller may want to act on (the peer, the step) besides the
/// message; [`Error::code`] gives the stable C result code.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A device (GPU) runtime call failed (NCCL's `ncclUnhandledCudaError`).
    #[error("unhandled device error: {message}")]
    UnhandledDeviceError {
        /// What failed.
        message: String,
    },
    /// The operating system or a transport failed.
    #[error("system error: {message}")]
    SystemError {
        /// What failed.
        message: String,
    },
    /// A bug in HALO: an invariant did not hold.
    #[error("internal error: {message}")]
    InternalError {
        /// What did not hold.
        message: String,
    },
    /// An argument is wrong on this rank alone: a length, a count that overflows,
    /// overlapping buffers.
    #[error("invalid argument: {message}")]
    InvalidArgument {
        /// The peer whose count or displacement is wrong, where one is.
        peer: Option<usize>,
        /// What is wrong.
        message: String,
    },
    /// The ranks disagree (a count that rank a sends is not what rank b expects), or the
    /// call is not allowed.
    #[error("invalid usage: {message}")]
    InvalidUsage {
        /// The peer this rank disagrees with, where one is.
        peer: Option<usize>,
        /// What is wrong.
        message: String,
    },
    /// A peer failed or went away.
    #[error("remote error from rank {peer}: {message}")]
    RemoteError {
        /// The peer.
        peer: usize,
        /// What happened.
        message: String,
    },
    /// A non-blocking operation has not finished yet.
    #[error("operation in progress")]
    InProgress,
    /// An operation did not finish within its timeout.
    #[error("timeout after {waited:?}: {message}")]
    Timeout {
        /// The peer of the oldest step still pending, if it talks to one.
        peer: Option<usize>,
        /// That step's index in the rank's schedule.
        step: Option<u32>,
        /// How long the operation waited.
        waited: Duration,
        /// The algorithm and the step, in words.
        message: String,
    },
    /// The operation or the communicator was aborted.
    #[error("aborted: {message}")]
    Aborted {
        /// What was aborted.
        message: String,
    },
}

impl Error {
    /// The C result code (NCCL's numbering; 9 = aborted is HALO's addition).
    pub fn code(&self) -> i32 {
        match self {
            Error::UnhandledDeviceError { .. } => 1,
            Error::SystemError { .. } => 2,
            Error::InternalError { .. } => 3,
            Error::InvalidArgument { .. } => 4,
            Error::InvalidUsage { .. } => 5,
            Error::RemoteError { .. } => 6,
            Error::InProgress => 7,
            Error::Timeout { .. } => 8,
            Error::Aborted { .. } => 9,
        }
    }

    /// The name of a C result code (`"InvalidUsage"` for 5), `"Success"` for 0 and
    /// `"Unknown"` for codes HALO does not define.
    pub fn code_name(code: i32) -> &'static str {
        match code {
            0 => "Success",
            1 => "UnhandledDeviceError",
            2 => "SystemError",
            3 => "InternalError",
            4 => "InvalidArgument",
            5 => "InvalidUsage",
            6 => "RemoteError",
            7 => "InProgress",
            8 => "Timeout",
            9 => "Aborted",
            _ => "Unknown",
        }
    }

    /// The peer the error names, if any.
    pub fn peer(&self) -> Option<usize> {
        match self {
            Error::InvalidArgument { peer, .. }
            | Error::InvalidUsage { peer, .. }
            | Error::Timeout { peer, .. } => *peer,
            Error::RemoteError { peer, .. } => Some(*peer),
            _ => None,
        }
    }

    /// An [`Error::InvalidArgument`] not tied to a peer (what a caller got wrong).
    pub fn invalid_argument(message: impl Into<String>) -> Self {
        Error::InvalidArgument {
            peer: None,
            message: message.into(),
        }
    }

    pub(crate) fn invalid_argument_peer(peer: usize, message: impl Into<String>) -> Self {
        Error::InvalidArgument {
            peer: Some(peer),
            message: message.into(),
        }
    }

    /// An [`Error::InternalError`]: a bug of HALO's, not the caller's.
    pub fn internal(message: impl Into<String>) -> Self {
        Error::InternalError {
            message: message.into(),
        }
    }
}

impl From<CollectiveError> for Error {
    fn from(e: CollectiveError) -> Self {
        match e {
            CollectiveError::InvalidArgument(message) => Error::InvalidArgument {
                peer: None,
                message,
            },
            CollectiveError::InvalidUsage(message) => Error::InvalidUsage {
                peer: None,
                message,
            },
            CollectiveError::Mismatch { peer, message } => Error::InvalidUsage {
                peer: Some(peer),
                message,
            },
            CollectiveError::Timeout {
                algorithm,
                step,
                peer,
                what,
                waited,
            } => Error::Timeout {
                peer,
                step: Some(step),
                waited,
                message: format!(
                    "{algorithm}: step {step} ({what}) did not complete{}",
                    match peer {
                        Some(p) => format!(" (waiting for rank {p})"),
                        None => String::new(),
                    }
                ),
            },
            CollectiveError::Remote { peer, message } => Error::RemoteError { peer, message },
            CollectiveError::System(message) => Error::SystemError { message },
            CollectiveError::Aborted(message) => Error::Aborted { message },
            CollectiveError::Verify(v) => Error::InternalError {
                message: format!("schedule verification failed: {v}"),
            },
            CollectiveError::Internal(message) => Error::InternalError { message },
        }
    }
}

impl From<TopologyError> for Error {
    fn from(e: TopologyError) -> Self {
        match e {
            TopologyError::Io { .. } | TopologyError::Discover(_) => Error::SystemError {
                message: e.to_string(),
            },
            other => Error::InvalidArgument {
                peer: None,
                message: other.to_string(),
            },
        }
    }
}
