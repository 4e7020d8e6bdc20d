//! The crate's one error type.

/// Everything that can go wrong in `halo-moe`: bad configuration or bad input to a piece.
///
/// Every variant names what was wrong (the configuration field, the argument, the index), so
/// a caller passing a buffer of the wrong length learns which buffer and which length.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum MoeError {
    /// A configuration field has a value the model cannot use.
    #[error("invalid MoE configuration: `{field}` {reason}")]
    InvalidConfig {
        /// The field of [`crate::MoeConfig`] (or [`crate::AdamConfig`], [`crate::TaskConfig`]).
        field: &'static str,
        /// Why the value is rejected.
        reason: String,
    },
    /// No preset of that name.
    #[error("unknown MoE preset `{0}` (known: tiny, small)")]
    UnknownPreset(String),
    /// A buffer passed to a piece has the wrong number of elements.
    #[error("`{what}` has {got} elements, expected {expected}")]
    Shape {
        /// The argument.
        what: &'static str,
        /// The element count the configuration implies.
        expected: usize,
        /// The element count passed.
        got: usize,
    },
    /// A token id (input or target) is not below the vocabulary size.
    #[error("`{what}`[{index}] = {token} is out of range (vocabulary {vocab})")]
    TokenOutOfRange {
        /// The argument (`tokens` or `targets`).
        what: &'static str,
        /// Position in the argument.
        index: usize,
        /// The offending id.
        token: u32,
        /// The vocabulary size.
        vocab: usize,
    },
    /// A row count is not a whole number of sequences.
    #[error("`{what}` has {rows} rows, not a multiple of the sequence length {seq}")]
    NotWholeSequences {
        /// The argument.
        what: &'static str,
        /// Rows passed.
        rows: usize,
        /// The configured sequence length.
        seq: usize,
    },
    /// An expert id in a routing is not below the number of experts.
    #[error("expert id {expert} at slot {index} is out of range ({experts} experts)")]
    ExpertOutOfRange {
        /// Flat slot index (token * top_k + slot).
        index: usize,
        /// The offending id.
        expert: u32,
        /// The configured number of experts.
        experts: usize,
    },
    /// The loss normaliser is not a positive finite number.
    #[error("loss normaliser {0} is not a positive finite number")]
    BadNormaliser(f32),
    /// A parameter group index does not exist in this model.
    #[error("parameter group {0} does not exist in this model")]
    NoSuchGroup(String),
    /// The optimizer has no state for a group, or already has one.
    #[error("optimizer state for group {group}: {reason}")]
    OptimizerState {
        /// The group.
        group: String,
        /// What was wrong.
        reason: &'static str,
    },
    /// Two parameter sets (e.g. parameters and gradients) come from different configurations.
    #[error("parameter sets do not match: {0}")]
    Mismatch(String),
}

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, MoeError>;

/// Checks a buffer length, naming the argument on error.
pub(crate) fn check_len(what: &'static str, got: usize, expected: usize) -> Result<()> {
    if got == expected {
        Ok(())
    } else {
        Err(MoeError::Shape {
            what,
            expected,
            got,
        })
    }
}

/// Rows of width `width` in a buffer of `len` elements, naming the argument on error.
pub(crate) fn rows_of(what: &'static str, len: usize, width: usize) -> Result<usize> {
    if len.is_multiple_of(width) {
        Ok(len / width)
    } else {
        Err(MoeError::Shape {
            what,
            expected: len.div_ceil(width) * width,
            got: len,
        })
    }
}

/// Checks that `rows` is a whole number of sequences of length `seq`.
pub(crate) fn whole_sequences(what: &'static str, rows: usize, seq: usize) -> Result<usize> {
    if rows.is_multiple_of(seq) {
        Ok(rows / seq)
    } else {
        Err(MoeError::NotWholeSequences { what, rows, seq })
    }
}

/// Checks token ids against the vocabulary.
pub(crate) fn check_tokens(what: &'static str, tokens: &[u32], vocab: usize) -> Result<()> {
    match tokens.iter().position(|&t| t as usize >= vocab) {
        None => Ok(()),
        Some(index) => Err(MoeError::TokenOutOfRange {
            what,
            index,
            token: tokens[index],
            vocab,
        }),
    }
}
