//! Model descriptions: [`ModelConfig`], the presets, and the TOML/JSON file format.
//!
//! ```toml
//! name = "my-moe"          # optional; a file's name defaults to its stem
//! layers = 32              # L, every layer an MoE layer (as the Piper paper treats them)
//! hidden = 4096            # d
//! heads = 32               # H
//! experts = 8              # E, routed experts per layer
//! shared_experts = 0       # E_s, experts every token goes through (optional, default 0)
//! top_k = 2                # k
//! expert_ffn = 14336       # d_ffn, an expert's inner size
//! expert_matrices = 3      # 3 for SwiGLU (gate, up, down), 2 for a plain FFN (optional, default 3)
//! vocab = 32000            # optional: adds input embedding and output head (V x d each)
//! ```
//!
//! Loading rejects a bad file with [`PiperError::Invalid`] naming the field: a
//! missing or unknown key, a value that is zero, negative or absurdly large, `top_k`
//! above `experts`, `hidden` not divisible by `heads`, `expert_matrices` other than 2
//! or 3.

use crate::error::{PiperError, Result};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// The largest value any size of a model may take (2^24): far above any real model,
/// small enough that every count and byte total stays exact.
pub const MAX_DIMENSION: u64 = 1 << 24;

/// An MoE transformer as the resource model sees it: `layers` identical layers, each an
/// attention block and an MoE block of routed (and optionally shared) experts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ModelConfig {
    /// A name for people.
    pub name: String,
    /// L: layers, every one an MoE layer.
    pub layers: u64,
    /// d: hidden size.
    pub hidden: u64,
    /// H: attention heads.
    pub heads: u64,
    /// E: routed experts per layer.
    pub experts: u64,
    /// E_s: shared experts per layer (every token goes through them; not expert-parallel).
    pub shared_experts: u64,
    /// k: routed experts per token.
    pub top_k: u64,
    /// d_ffn: an expert's inner size.
    pub expert_ffn: u64,
    /// Weight matrices per expert: 3 for SwiGLU, 2 for a plain FFN.
    pub expert_matrices: u64,
    /// V: vocabulary size, when the embedding and output head should be counted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vocab: Option<u64>,
}

/// The file form, with signed integers so that a negative value is reported as such.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ModelFile {
    #[serde(default)]
    name: Option<String>,
    layers: i64,
    hidden: i64,
    heads: i64,
    experts: i64,
    #[serde(default)]
    shared_experts: i64,
    top_k: i64,
    expert_ffn: i64,
    #[serde(default = "three")]
    expert_matrices: i64,
    #[serde(default)]
    vocab: Option<i64>,
}

fn three() -> i64 {
    3
}

/// Names of the fixed presets, in table order (plus `piper-ws:E`).
pub const PRESETS: [&str; 9] = [
    "switch-base",
    "mixtral-8x7b",
    "mixtral-8x22b",
    "grok-1",
    "glam",
    "deepseek-v2",
    "deepseek-v3",
    "llama4-scout",
    "kimi-k2",
];

fn positive(field: &str, v: i64) -> Result<u64> {
    if v <= 0 {
        return Err(PiperError::invalid(
            "model",
            field,
            format!("must be a positive integer, got {v}"),
        ));
    }
    let v = v as u64;
    if v > MAX_DIMENSION {
        return Err(PiperError::invalid(
            "model",
            field,
            format!("{v} is larger than {MAX_DIMENSION}, the largest size the model accepts"),
        ));
    }
    Ok(v)
}

impl ModelConfig {
    /// Checks every field; the error names the first one that is wrong.
    ///
    /// # Errors
    /// [`PiperError::Invalid`] naming the field.
    pub fn validate(&self) -> Result<()> {
        for (field, v) in [
            ("layers", self.layers),
            ("hidden", self.hidden),
            ("heads", self.heads),
            ("experts", self.experts),
            ("top_k", self.top_k),
            ("expert_ffn", self.expert_ffn),
            ("expert_matrices", self.expert_matrices),
        ] {
            positive(field, i64::try_from(v).unwrap_or(i64::MAX))?;
        }
        if self.shared_experts > MAX_DIMENSION {
            return Err(PiperError::invalid(
                "model",
                "shared_experts",
                format!("{} is larger than {MAX_DIMENSION}", self.shared_experts),
            ));
        }
        if let Some(v) = self.vocab {
            positive("vocab", i64::try_from(v).unwrap_or(i64::MAX))?;
        }
        if self.top_k > self.experts {
            return Err(PiperError::invalid(
                "model",
                "top_k",
                format!(
                    "{} experts per token is more than the {} routed experts",
                    self.top_k, self.experts
                ),
            ));
        }
        if !self.hidden.is_multiple_of(self.heads) {
            return Err(PiperError::invalid(
                "model",
                "heads",
                format!(
                    "hidden size {} is not divisible by {} heads",
                    self.hidden, self.heads
                ),
            ));
        }
        if !(2..=3).contains(&self.expert_matrices) {
            return Err(PiperError::invalid(
                "model",
                "expert_matrices",
                format!(
                    "must be 3 (SwiGLU: gate, up, down) or 2 (plain FFN: up, down), got {}",
                    self.expert_matrices
                ),
            ));
        }
        Ok(())
    }

    fn from_file(f: ModelFile, default_name: &str) -> Result<Self> {
        let m = ModelConfig {
            name: f.name.unwrap_or_else(|| default_name.to_string()),
            layers: positive("layers", f.layers)?,
            hidden: positive("hidden", f.hidden)?,
            heads: positive("heads", f.heads)?,
            experts: positive("experts", f.experts)?,
            shared_experts: if f.shared_experts < 0 {
                return Err(PiperError::invalid(
                    "model",
                    "shared_experts",
                    format!(
                        "must be zero or a positive integer, got {}",
                        f.shared_experts
                    ),
                ));
            } else {
                f.shared_experts as u64
            },
            top_k: positive("top_k", f.top_k)?,
            expert_ffn: positive("expert_ffn", f.expert_ffn)?,
            expert_matrices: positive("expert_matrices", f.expert_matrices)?,
            vocab: f.vocab.map(|v| positive("vocab", v)).transpose()?,
        };
        m.validate()?;
        Ok(m)
    }

    /// Parses the TOML form; `path` is only used in messages.
    ///
    /// # Errors
    /// [`PiperError::Parse`] (the message names the key) or [`PiperError::Invalid`].
    pub fn from_toml_str(text: &str, path: &str) -> Result<Self> {
        let f: ModelFile = toml::from_str(text).map_err(|e| PiperError::Parse {
            what: "model",
            path: path.to_string(),
            reason: toml_reason(&e, text),
        })?;
        Self::from_file(f, &stem(path))
    }

    /// Parses the JSON form; `path` is only used in messages.
    ///
    /// # Errors
    /// [`PiperError::Parse`] (the message names the key) or [`PiperError::Invalid`].
    pub fn from_json_str(text: &str, path: &str) -> Result<Self> {
        let f: ModelFile = serde_json::from_str(text).map_err(|e| PiperError::Parse {
            what: "model",
            path: path.to_string(),
            reason: e.to_string(),
        })?;
        Self::from_file(f, &stem(path))
    }

    /// Loads a model file: JSON when the name ends in `.json`, TOML otherwise.
    ///
    /// # Errors
    /// [`PiperError::Io`], [`PiperError::Parse`] or [`PiperError::Invalid`].
    pub fn load(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| PiperError::Io {
            what: "model",
            path: shown.clone(),
            source,
        })?;
        if path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("json"))
        {
            Self::from_json_str(&text, &shown)
        } else {
            Self::from_toml_str(&text, &shown)
        }
    }

    /// The TOML file form of this model.
    pub fn to_toml_string(&self) -> String {
        toml::to_string(self).expect("a model always serialises to TOML")
    }

    /// A preset by name (see [`PRESETS`] and `piper-ws:E`).
    ///
    /// # Errors
    /// [`PiperError::UnknownPreset`], or [`PiperError::Invalid`] for a bad `piper-ws:E`.
    pub fn preset(name: &str) -> Result<Self> {
        if let Some(e) = name.strip_prefix("piper-ws:") {
            let experts: i64 = e.trim().parse().map_err(|_| {
                PiperError::invalid(
                    "model",
                    "experts",
                    format!("piper-ws:E takes a positive number of experts, got '{e}'"),
                )
            })?;
            let experts = positive("experts", experts)?;
            return Ok(piper_ws(experts));
        }
        let m = |layers, hidden, heads, experts, shared_experts, top_k, expert_ffn| ModelConfig {
            name: name.to_string(),
            layers,
            hidden,
            heads,
            experts,
            shared_experts,
            top_k,
            expert_ffn,
            expert_matrices: 3,
            vocab: None,
        };
        Ok(match name {
            "switch-base" => m(12, 768, 12, 128, 0, 1, 2048),
            "mixtral-8x7b" => m(32, 4096, 32, 8, 0, 2, 14336),
            "mixtral-8x22b" => m(56, 6144, 48, 8, 0, 2, 16384),
            "grok-1" => m(64, 6144, 48, 8, 0, 2, 32768),
            "glam" => m(64, 8192, 128, 64, 0, 2, 32768),
            "deepseek-v2" => m(60, 5120, 128, 160, 2, 6, 1536),
            "deepseek-v3" => m(61, 7168, 128, 256, 1, 8, 2048),
            "llama4-scout" => m(48, 5120, 40, 16, 1, 1, 8192),
            "kimi-k2" => m(61, 7168, 64, 384, 1, 8, 2048),
            _ => {
                return Err(PiperError::UnknownPreset {
                    what: "model",
                    name: name.to_string(),
                    known: format!("{}, piper-ws:E", PRESETS.join(", ")),
                });
            }
        })
    }

    /// A preset name, `reference:tiny` / `reference:small` (`halo-moe`'s reference
    /// models, the ones `halo train` runs), or a file: a name containing `/` or ending in
    /// `.toml` / `.json`, or naming an existing file, is loaded as a file.
    ///
    /// # Errors
    /// As [`ModelConfig::preset`] and [`ModelConfig::load`].
    pub fn resolve(spec: &str) -> Result<Self> {
        if let Some(preset) = spec.strip_prefix("reference:") {
            let cfg = halo_moe::MoeConfig::preset(preset)
                .map_err(|e| PiperError::invalid("model", "reference", e.to_string()))?;
            return Ok(ModelConfig::from(&cfg));
        }
        let p = Path::new(spec);
        let looks_like_file = spec.contains('/')
            || spec.ends_with(".toml")
            || spec.ends_with(".json")
            || (p.is_file() && !PRESETS.contains(&spec));
        if looks_like_file {
            Self::load(p)
        } else {
            Self::preset(spec)
        }
    }

    /// d / H: the size of one attention head.
    pub fn head_dim(&self) -> u64 {
        self.hidden / self.heads
    }
}

impl From<&halo_moe::MoeConfig> for ModelConfig {
    /// The resource model's view of a `halo-moe` reference model (named `reference`):
    /// the same layers, sizes, experts and vocabulary, no shared experts.
    fn from(c: &halo_moe::MoeConfig) -> Self {
        ModelConfig {
            name: "reference".to_string(),
            layers: c.layers as u64,
            hidden: c.hidden as u64,
            heads: c.heads as u64,
            experts: c.experts as u64,
            shared_experts: 0,
            top_k: c.top_k as u64,
            expert_ffn: c.ffn as u64,
            expert_matrices: c.expert_matrices as u64,
            vocab: Some(c.vocab as u64),
        }
    }
}

/// The Piper paper's weak-scaling family: d = 5120, d_ffn = 20480, L = 32, k = 2, E
/// experts, with **plain two-matrix FFN experts** and 40 heads (head size 128; the
/// paper does not state H, and no parameter count depends on it). Two matrices are
/// what reproduce the paper's totals (110B, 862B, 1.7T at E = 16, 128, 256);
/// SwiGLU experts would give 164B at E = 16 (docs/PLANNING.md).
pub fn piper_ws(experts: u64) -> ModelConfig {
    ModelConfig {
        name: format!("piper-ws:{experts}"),
        layers: 32,
        hidden: 5120,
        heads: 40,
        experts,
        shared_experts: 0,
        top_k: 2.min(experts),
        expert_ffn: 20480,
        expert_matrices: 2,
        vocab: None,
    }
}

/// A TOML error on one line, with the line it is on:
/// `TOML parse error at line 1, column 10: invalid type: ... (in `layers = "four"`)`.
pub(crate) fn toml_reason(e: &toml::de::Error, text: &str) -> String {
    let shown = e.to_string();
    let first = shown.lines().next().unwrap_or_default();
    let line = e
        .span()
        .and_then(|span| {
            let start = text[..span.start.min(text.len())]
                .rfind('\n')
                .map_or(0, |i| i + 1);
            text[start..].lines().next()
        })
        .map(|l| format!(" (in `{}`)", l.trim()))
        .unwrap_or_default();
    format!("{first}: {}{line}", e.message())
}

fn stem(path: &str) -> String {
    Path::new(path)
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_preset_is_valid_and_named() {
        for name in PRESETS {
            let m = ModelConfig::preset(name).unwrap();
            m.validate().unwrap();
            assert_eq!(m.name, name);
        }
        let ws = ModelConfig::preset("piper-ws:128").unwrap();
        assert_eq!(
            (
                ws.layers,
                ws.hidden,
                ws.expert_ffn,
                ws.experts,
                ws.top_k,
                ws.expert_matrices
            ),
            (32, 5120, 20480, 128, 2, 2)
        );
    }

    #[test]
    fn table_values() {
        let d = ModelConfig::preset("deepseek-v2").unwrap();
        assert_eq!(
            (
                d.layers,
                d.hidden,
                d.heads,
                d.experts,
                d.shared_experts,
                d.top_k,
                d.expert_ffn
            ),
            (60, 5120, 128, 160, 2, 6, 1536)
        );
        let k = ModelConfig::preset("kimi-k2").unwrap();
        assert_eq!(
            (k.experts, k.shared_experts, k.top_k, k.heads),
            (384, 1, 8, 64)
        );
    }

    #[test]
    fn unknown_preset_lists_the_known_ones() {
        let e = ModelConfig::preset("mixtral-9x9b").unwrap_err().to_string();
        assert!(e.contains("unknown model preset 'mixtral-9x9b'"), "{e}");
        assert!(e.contains("glam") && e.contains("piper-ws:E"), "{e}");
        let e = ModelConfig::preset("piper-ws:0").unwrap_err().to_string();
        assert!(e.contains("experts") && e.contains("positive"), "{e}");
        let e = ModelConfig::preset("piper-ws:x").unwrap_err().to_string();
        assert!(e.contains("experts"), "{e}");
    }

    #[test]
    fn file_round_trip_toml_and_json() {
        let m = ModelConfig::preset("deepseek-v3").unwrap();
        let back = ModelConfig::from_toml_str(&m.to_toml_string(), "x.toml").unwrap();
        assert_eq!(back, m);
        let json = serde_json::to_string(&m).unwrap();
        assert_eq!(ModelConfig::from_json_str(&json, "x.json").unwrap(), m);
    }

    #[test]
    fn file_errors_name_the_field() {
        let base = "layers = 4\nhidden = 64\nheads = 4\nexperts = 4\ntop_k = 2\nexpert_ffn = 128\n";
        let ok = ModelConfig::from_toml_str(base, "dir/tiny.toml").unwrap();
        assert_eq!(ok.name, "tiny");
        assert_eq!(ok.expert_matrices, 3);
        let cases = [
            (
                base.replace("layers = 4", "layers = 0"),
                "layers",
                "positive",
            ),
            (base.replace("hidden = 64", "hidden = -64"), "hidden", "-64"),
            (base.replace("top_k = 2", "top_k = 5"), "top_k", "more than"),
            (base.replace("heads = 4", "heads = 5"), "heads", "divisible"),
            (
                format!("{base}expert_matrices = 4\n"),
                "expert_matrices",
                "3",
            ),
            (
                format!("{base}shared_experts = -1\n"),
                "shared_experts",
                "-1",
            ),
            (format!("{base}vocab = 0\n"), "vocab", "positive"),
            (
                base.replace("expert_ffn = 128", "expert_ffn = 99999999999"),
                "expert_ffn",
                "larger",
            ),
            (base.replace("experts = 4\n", ""), "experts", "missing"),
            (format!("{base}expertz = 3\n"), "expertz", "unknown"),
            (
                base.replace("layers = 4", "layers = \"four\""),
                "layers",
                "invalid type",
            ),
        ];
        for (text, field, what) in cases {
            let e = ModelConfig::from_toml_str(&text, "m.toml")
                .unwrap_err()
                .to_string();
            assert!(e.contains(field) && e.contains(what), "{field}: {e}");
        }
        let e = ModelConfig::from_json_str("{\"layers\": 1", "m.json")
            .unwrap_err()
            .to_string();
        assert!(e.contains("cannot parse model file m.json"), "{e}");
    }
}
