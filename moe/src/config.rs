//! Model shape: [`MoeConfig`] and its presets.

use crate::error::{MoeError, Result};

/// Expert MLP form, chosen by [`MoeConfig::expert_matrices`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpertKind {
    /// Two matrices: `y = gelu(x W1) W2` (GELU, tanh approximation).
    Gelu,
    /// Three matrices: `y = (silu(x W1) * (x W3)) W2` (SwiGLU, as in Mixtral / DeepSeek).
    SwiGlu,
}

/// Shape of the reference MoE model.
///
/// Every buffer length of every piece follows from these numbers (see the crate docs for the
/// layout). Build one with a preset ([`MoeConfig::tiny`], [`MoeConfig::small`],
/// [`MoeConfig::preset`]) or by hand, then call [`MoeConfig::validate`] (every piece also
/// validates what it is given).
#[derive(Debug, Clone, PartialEq)]
pub struct MoeConfig {
    /// Vocabulary size V (token ids are `0..V`).
    pub vocab: usize,
    /// Sequence length s (tokens per sequence; attention is causal within a sequence).
    pub seq: usize,
    /// Hidden size d.
    pub hidden: usize,
    /// Attention heads H (must divide `hidden`).
    pub heads: usize,
    /// Transformer blocks L.
    pub layers: usize,
    /// Routed experts E per block.
    pub experts: usize,
    /// Experts each token is sent to, k (`1..=experts`).
    pub top_k: usize,
    /// Expert inner size d_ffn.
    pub ffn: usize,
    /// Matrices per expert: 2 = GELU MLP, 3 = SwiGLU.
    pub expert_matrices: usize,
    /// Whether the k gate weights of a token are renormalised to sum to 1 (Mixtral does;
    /// Switch / GShard-style top-1 does not). When false the gates are the raw softmax
    /// probabilities of the chosen experts.
    pub renormalize_gates: bool,
    /// Epsilon of every RMSNorm.
    pub norm_eps: f32,
}

impl MoeConfig {
    /// `tiny`: d = 64, L = 4, E = 8, k = 2, H = 4, d_ffn = 128, s = 32, V = 64, SwiGLU experts
    /// (3 matrices), gates renormalised over the k. About 0.9 M parameters; trains the
    /// synthetic task in seconds on one CPU core (release build).
    pub fn tiny() -> Self {
        MoeConfig {
            vocab: 64,
            seq: 32,
            hidden: 64,
            heads: 4,
            layers: 4,
            experts: 8,
            top_k: 2,
            ffn: 128,
            expert_matrices: 3,
            renormalize_gates: true,
            norm_eps: 1e-5,
        }
    }

    /// `small`: d = 128, L = 6, E = 16, k = 2, H = 8, d_ffn = 256, s = 64, V = 256, SwiGLU
    /// experts, gates renormalised. About 10 M parameters.
    pub fn small() -> Self {
        MoeConfig {
            vocab: 256,
            seq: 64,
            hidden: 128,
            heads: 8,
            layers: 6,
            experts: 16,
            top_k: 2,
            ffn: 256,
            expert_matrices: 3,
            renormalize_gates: true,
            norm_eps: 1e-5,
        }
    }

    /// A preset by name: `tiny` or `small`.
    pub fn preset(name: &str) -> Result<Self> {
        match name {
            "tiny" => Ok(Self::tiny()),
            "small" => Ok(Self::small()),
            other => Err(MoeError::UnknownPreset(other.to_string())),
        }
    }

    /// Checks every field; the error names the first field that is wrong.
    pub fn validate(&self) -> Result<()> {
        fn bad(field: &'static str, reason: impl Into<String>) -> Result<()> {
            Err(MoeError::InvalidConfig {
                field,
                reason: reason.into(),
            })
        }
        for (field, v) in [
            ("vocab", self.vocab),
            ("seq", self.seq),
            ("hidden", self.hidden),
            ("heads", self.heads),
            ("layers", self.layers),
            ("experts", self.experts),
            ("top_k", self.top_k),
            ("ffn", self.ffn),
        ] {
            if v == 0 {
                return bad(field, "must be at least 1");
            }
        }
        if self.vocab > u32::MAX as usize {
            return bad("vocab", "must fit token ids in u32");
        }
        if self.experts > u32::MAX as usize {
            return bad("experts", "must fit expert ids in u32");
        }
        if !self.hidden.is_multiple_of(self.heads) {
            return bad(
                "heads",
                format!("({}) must divide hidden ({})", self.heads, self.hidden),
            );
        }
        if self.top_k > self.experts {
            return bad(
                "top_k",
                format!(
                    "({}) must not exceed experts ({})",
                    self.top_k, self.experts
                ),
            );
        }
        if !(self.expert_matrices == 2 || self.expert_matrices == 3) {
            return bad(
                "expert_matrices",
                format!(
                    "is {}; must be 2 (GELU MLP) or 3 (SwiGLU)",
                    self.expert_matrices
                ),
            );
        }
        if !(self.norm_eps.is_finite() && self.norm_eps > 0.0) {
            return bad("norm_eps", format!("is {}; must be > 0", self.norm_eps));
        }
        Ok(())
    }

    /// The expert form implied by [`MoeConfig::expert_matrices`] (after validation).
    pub fn expert_kind(&self) -> ExpertKind {
        if self.expert_matrices == 3 {
            ExpertKind::SwiGlu
        } else {
            ExpertKind::Gelu
        }
    }

    /// Size of one attention head, `hidden / heads`.
    pub fn head_dim(&self) -> usize {
        self.hidden / self.heads
    }

    /// Elements of the embedding group: token table `V x d` then positions `s x d`.
    pub fn embed_len(&self) -> usize {
        (self.vocab + self.seq) * self.hidden
    }

    /// Elements of one block's dense group: norm1 `d`, Wq, Wk, Wv, Wo `d x d`, norm2 `d`.
    pub fn dense_len(&self) -> usize {
        4 * self.hidden * self.hidden + 2 * self.hidden
    }

    /// Elements of one block's router: `d x E`.
    pub fn router_len(&self) -> usize {
        self.hidden * self.experts
    }

    /// Elements of one expert: W1 `d x f`, (W3 `d x f`,) W2 `f x d`.
    pub fn expert_len(&self) -> usize {
        self.expert_matrices * self.hidden * self.ffn
    }

    /// Elements of the head group: final norm `d` then output matrix `d x V`.
    pub fn head_len(&self) -> usize {
        self.hidden + self.hidden * self.vocab
    }

    /// Total parameter count.
    pub fn param_count(&self) -> usize {
        self.embed_len()
            + self.layers
                * (self.dense_len() + self.router_len() + self.experts * self.expert_len())
            + self.head_len()
    }
}
