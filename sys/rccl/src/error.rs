//! The crate's error type.

/// One place a library was looked for, and why it was not used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tried {
    /// The path or soname (or the environment variable, when it is not set).
    pub place: String,
    /// Why it was not used (the loader's message, "not set", "no such file").
    pub why: String,
}

impl std::fmt::Display for Tried {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.place, self.why)
    }
}

/// What can go wrong loading or calling NCCL / RCCL or the device runtime.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RcclError {
    /// No library of this kind could be loaded: every place tried, with the reason.
    #[error(
        "no {what} library could be loaded; tried: {}",
        tried.iter().map(|t| t.to_string()).collect::<Vec<_>>().join("; ")
    )]
    Unavailable {
        /// "NCCL/RCCL" or "CUDA/HIP runtime".
        what: &'static str,
        /// Every place tried, in order.
        tried: Vec<Tried>,
    },
    /// A library loaded but lacks a symbol HALO needs.
    #[error("{library} lacks the required symbol {symbol}: {message}")]
    MissingSymbol {
        /// The path or soname that loaded.
        library: String,
        /// The symbol.
        symbol: &'static str,
        /// The loader's message.
        message: String,
    },
    /// The library is older than HALO needs.
    #[error("{library} is version {found}; HALO needs {needed} or newer")]
    TooOld {
        /// The path or soname that loaded.
        library: String,
        /// Its version.
        found: String,
        /// The oldest version HALO uses.
        needed: String,
    },
    /// An NCCL / RCCL call returned an error.
    #[error("{call} failed: {message} (ncclResult_t {code})")]
    Nccl {
        /// The function.
        call: &'static str,
        /// Its result code.
        code: i32,
        /// `ncclGetErrorString`'s text.
        message: String,
    },
    /// A runtime call returned an error.
    #[error("{call} failed: {message} (error {code})")]
    Runtime {
        /// The function (`cudaMalloc`, `hipMemcpyAsync`, ...).
        call: String,
        /// Its error code.
        code: i32,
        /// The runtime's `GetErrorString` text.
        message: String,
    },
    /// A call was given something it cannot take (a size that does not fit, an
    /// optional function the library does not have).
    #[error("{0}")]
    Invalid(String),
}

impl RcclError {
    /// The places tried, when no library could be loaded.
    pub fn tried(&self) -> &[Tried] {
        match self {
            RcclError::Unavailable { tried, .. } => tried,
            _ => &[],
        }
    }
}

/// Result with [`RcclError`].
pub type Result<T, E = RcclError> = std::result::Result<T, E>;
