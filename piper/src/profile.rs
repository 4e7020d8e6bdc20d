//! Hardware profiles: what one GPU computes and holds, for the step-time prediction.
//!
//! A profile gives the bf16 peak (the MFU denominator), the memory one GPU has for
//! training state and activations, and two throughput curves measured (or assumed, as
//! each preset says) as a function of problem size:
//!
//! - `attention`: the attention kernel's TFLOPS by sequence length;
//! - `gemm`: a GEMM's TFLOPS by the number of token rows it multiplies (an expert's
//!   tokens, or a micro-batch's tokens for the projections).
//!
//! Between points the curve is linear in log2 of the size; outside them it is flat.
//!
//! ```toml
//! name = "my-gpu"
//! peak_tflops = 191.5
//! memory_gib = 64
//! attention = [ { seq = 512, tflops = 60 }, { seq = 8192, tflops = 120 } ]
//! gemm = [ { tokens = 128, tflops = 15 }, { tokens = 16384, tflops = 115 } ]
//! ```

use crate::error::{PiperError, Result};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// One point of the attention curve.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttentionPoint {
    /// Sequence length.
    pub seq: f64,
    /// Achieved TFLOPS (forward and backward alike).
    pub tflops: f64,
}

/// One point of the GEMM curve.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GemmPoint {
    /// Token rows of the GEMM.
    pub tokens: f64,
    /// Achieved TFLOPS.
    pub tflops: f64,
}

/// What one GPU of the machine computes and holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HardwareProfile {
    /// A name for people.
    #[serde(default)]
    pub name: String,
    /// bf16/fp16 dense peak, TFLOPS: the MFU denominator.
    pub peak_tflops: f64,
    /// Memory for training state and activations, GiB (2^30 bytes).
    pub memory_gib: f64,
    /// Attention TFLOPS by sequence length, ascending.
    pub attention: Vec<AttentionPoint>,
    /// GEMM TFLOPS by token rows, ascending.
    pub gemm: Vec<GemmPoint>,
}

/// Names of the presets.
pub const PROFILES: [&str; 2] = ["mi250x-gcd", "h100-sxm"];

/// MI250X GCD curves (the paper's micro-benchmarks):
/// attention 60-120 TFLOPS rising with sequence length; expert GEMMs latency-bound at
/// a few hundred tokens and about 100 TFLOPS or more at large token counts. The exact
/// points between those published ranges are this project's reading, not measurements;
/// the GEMM plateau (125 TFLOPS) is set so that one Mixtral 8x7B MoE layer on one node
/// predicts close to the paper's 117.5 TFLOPS per GCD (docs/PLANNING.md).
const MI250X_ATTENTION: [(f64, f64); 5] = [
    (512.0, 60.0),
    (1024.0, 75.0),
    (2048.0, 95.0),
    (4096.0, 110.0),
    (8192.0, 120.0),
];
const MI250X_GEMM: [(f64, f64); 8] = [
    (64.0, 10.0),
    (256.0, 35.0),
    (512.0, 55.0),
    (1024.0, 75.0),
    (2048.0, 95.0),
    (4096.0, 110.0),
    (8192.0, 120.0),
    (16384.0, 125.0),
];

impl HardwareProfile {
    /// A preset: `mi250x-gcd` (one Frontier GCD: 191.5 TFLOPS bf16, 64 GiB HBM2E, the
    /// paper's micro-benchmark ranges) or `h100-sxm` (989 TFLOPS dense bf16 and 80 GiB
    /// HBM3, NVIDIA's H100 SXM data sheet; no micro-benchmarks were available, so its
    /// curves are the MI250X curves' fractions of peak scaled to 989 TFLOPS — an
    /// assumption, stated wherever it is used).
    ///
    /// # Errors
    /// [`PiperError::UnknownPreset`].
    pub fn preset(name: &str) -> Result<Self> {
        let scaled = |peak: f64| {
            let f = peak / 191.5;
            (
                MI250X_ATTENTION
                    .iter()
                    .map(|&(seq, t)| AttentionPoint { seq, tflops: t * f })
                    .collect(),
                MI250X_GEMM
                    .iter()
                    .map(|&(tokens, t)| GemmPoint {
                        tokens,
                        tflops: t * f,
                    })
                    .collect(),
            )
        };
        let (peak, memory_gib) = match name {
            "mi250x-gcd" => (191.5, 64.0),
            "h100-sxm" => (989.0, 80.0),
            _ => {
                return Err(PiperError::UnknownPreset {
                    what: "profile",
                    name: name.to_string(),
                    known: PROFILES.join(", "),
                });
            }
        };
        let (attention, gemm) = scaled(peak);
        Ok(HardwareProfile {
            name: name.to_string(),
            peak_tflops: peak,
            memory_gib,
            attention,
            gemm,
        })
    }

    /// Checks the profile; the error names the field.
    ///
    /// # Errors
    /// [`PiperError::Invalid`] naming e.g. `peak_tflops` or `gemm[2].tokens`.
    pub fn validate(&self) -> Result<()> {
        let bad =
            |field: String, reason: String| Err(PiperError::invalid("profile", field, reason));
        if !(self.peak_tflops.is_finite() && self.peak_tflops > 0.0) {
            return bad(
                "peak_tflops".into(),
                format!("must be a positive number, got {}", self.peak_tflops),
            );
        }
        if !(self.memory_gib.is_finite() && self.memory_gib > 0.0) {
            return bad(
                "memory_gib".into(),
                format!("must be a positive number, got {}", self.memory_gib),
            );
        }
        let curves: [Curve<'_>; 2] = [
            (
                "attention",
                "seq",
                self.attention.iter().map(|p| (p.seq, p.tflops)).collect(),
            ),
            (
                "gemm",
                "tokens",
                self.gemm.iter().map(|p| (p.tokens, p.tflops)).collect(),
            ),
        ];
        for (curve, x_name, points) in curves {
            if points.is_empty() {
                return bad(curve.into(), "needs at least one point".into());
            }
            for (i, &(x, t)) in points.iter().enumerate() {
                if !(x.is_finite() && x > 0.0) {
                    return bad(
                        format!("{curve}[{i}].{x_name}"),
                        format!("must be a positive number, got {x}"),
                    );
                }
                if i > 0 && x <= points[i - 1].0 {
                    return bad(
                        format!("{curve}[{i}].{x_name}"),
                        format!(
                            "points must be in ascending order: {x} after {}",
                            points[i - 1].0
                        ),
                    );
                }
                if !(t.is_finite() && t > 0.0 && t <= self.peak_tflops) {
                    return bad(
                        format!("{curve}[{i}].tflops"),
                        format!(
                            "must be positive and at most peak_tflops ({}), got {t}",
                            self.peak_tflops
                        ),
                    );
                }
            }
        }
        Ok(())
    }

    /// Loads a profile file: JSON when the name ends in `.json`, TOML otherwise.
    ///
    /// # Errors
    /// [`PiperError::Io`], [`PiperError::Parse`] or [`PiperError::Invalid`].
    pub fn load(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| PiperError::Io {
            what: "profile",
            path: shown.clone(),
            source,
        })?;
        let parse = |reason: String| PiperError::Parse {
            what: "profile",
            path: shown.clone(),
            reason,
        };
        let mut p: HardwareProfile = if path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("json"))
        {
            serde_json::from_str(&text).map_err(|e| parse(e.to_string()))?
        } else {
            toml::from_str(&text).map_err(|e| parse(crate::model::toml_reason(&e, &text)))?
        };
        if p.name.is_empty() {
            p.name = path
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default();
        }
        p.validate()?;
        Ok(p)
    }

    /// A preset name or a file (a name with `/` or ending in `.toml` / `.json`).
    ///
    /// # Errors
    /// As [`HardwareProfile::preset`] and [`HardwareProfile::load`].
    pub fn resolve(spec: &str) -> Result<Self> {
        if spec.contains('/') || spec.ends_with(".toml") || spec.ends_with(".json") {
            Self::load(spec)
        } else {
            Self::preset(spec)
        }
    }

    /// The preset that matches a topology's name: `h100-sxm` for `dgx-h100:*`,
    /// `mi250x-gcd` otherwise.
    pub fn for_topology(name: &str) -> Self {
        let preset = if name.starts_with("dgx-h100") {
            "h100-sxm"
        } else {
            "mi250x-gcd"
        };
        Self::preset(preset).expect("the presets exist")
    }

    /// Bytes of memory per GPU.
    pub fn memory_bytes(&self) -> f64 {
        self.memory_gib * (1u64 << 30) as f64
    }

    /// Attention TFLOPS at sequence length `seq`.
    pub fn attention_tflops(&self, seq: f64) -> f64 {
        interpolate(self.attention.iter().map(|p| (p.seq, p.tflops)), seq)
    }

    /// GEMM TFLOPS at `tokens` token rows.
    pub fn gemm_tflops(&self, tokens: f64) -> f64 {
        interpolate(self.gemm.iter().map(|p| (p.tokens, p.tflops)), tokens)
    }
}

/// A curve for validation: its name, the name of its x, its points.
type Curve<'a> = (&'a str, &'a str, Vec<(f64, f64)>);

/// Piecewise linear in log2(x), flat outside the points.
fn interpolate(points: impl Iterator<Item = (f64, f64)>, x: f64) -> f64 {
    let points: Vec<(f64, f64)> = points.collect();
    let (first, last) = (points[0], points[points.len() - 1]);
    if x <= first.0 {
        return first.1;
    }
    if x >= last.0 {
        return last.1;
    }
    for w in points.windows(2) {
        let ((x0, y0), (x1, y1)) = (w[0], w[1]);
        if x <= x1 {
            let t = (x.log2() - x0.log2()) / (x1.log2() - x0.log2());
            return y0 + t * (y1 - y0);
        }
    }
    last.1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_validate_and_interpolate() {
        let p = HardwareProfile::preset("mi250x-gcd").unwrap();
        p.validate().unwrap();
        assert_eq!(p.memory_bytes(), 68_719_476_736.0);
        assert_eq!(p.attention_tflops(100.0), 60.0);
        assert_eq!(p.attention_tflops(1e6), 120.0);
        assert_eq!(p.attention_tflops(4096.0), 110.0);
        // Half way between 2048 and 4096 in log2: sqrt(2048 * 4096).
        let mid = (2048.0f64 * 4096.0).sqrt();
        assert!((p.gemm_tflops(mid) - 102.5).abs() < 1e-9);
        let h = HardwareProfile::preset("h100-sxm").unwrap();
        h.validate().unwrap();
        assert_eq!(h.peak_tflops, 989.0);
        assert!((h.gemm_tflops(4096.0) - 110.0 * 989.0 / 191.5).abs() < 1e-9);
        assert_eq!(HardwareProfile::for_topology("dgx-h100:4").name, "h100-sxm");
        assert_eq!(
            HardwareProfile::for_topology("frontier:4").name,
            "mi250x-gcd"
        );
        let e = HardwareProfile::preset("a100").unwrap_err().to_string();
        assert!(
            e.contains("unknown profile preset 'a100'") && e.contains("h100-sxm"),
            "{e}"
        );
    }

    #[test]
    fn profile_errors_name_the_field() {
        let mut p = HardwareProfile::preset("mi250x-gcd").unwrap();
        p.gemm[2].tokens = 10.0;
        let e = p.validate().unwrap_err().to_string();
        assert!(
            e.contains("gemm[2].tokens") && e.contains("ascending"),
            "{e}"
        );
        let mut p = HardwareProfile::preset("mi250x-gcd").unwrap();
        p.attention[0].tflops = 500.0;
        assert!(
            p.validate()
                .unwrap_err()
                .to_string()
                .contains("attention[0].tflops")
        );
        let mut p = HardwareProfile::preset("mi250x-gcd").unwrap();
        p.memory_gib = -1.0;
        assert!(p.validate().unwrap_err().to_string().contains("memory_gib"));
        p.memory_gib = 1.0;
        p.gemm.clear();
        assert!(
            p.validate()
                .unwrap_err()
                .to_string()
                .contains("gemm: needs")
        );
    }
}
