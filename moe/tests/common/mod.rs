//! Shared helpers of the integration tests: small shapes, random data, finite differences.
#![allow(dead_code, unreachable_pub)]

use halo_moe::{MoeConfig, SplitMix64};

/// A shape smaller than `tiny` (2 blocks, d = 16, 4 experts, top-2, GELU experts, gates not
/// renormalised): exercises the options `tiny` does not.
pub fn micro() -> MoeConfig {
    MoeConfig {
        vocab: 24,
        seq: 8,
        hidden: 16,
        heads: 2,
        layers: 2,
        experts: 4,
        top_k: 2,
        ffn: 24,
        expert_matrices: 2,
        renormalize_gates: false,
        norm_eps: 1e-5,
    }
}

/// Uniform values in `[-a, a)`.
pub fn rand_vec(seed: u64, n: usize, a: f32) -> Vec<f32> {
    let mut r = SplitMix64::new(seed);
    (0..n).map(|_| r.symmetric(a)).collect()
}

/// Random token ids below `vocab`.
pub fn rand_tokens(seed: u64, n: usize, vocab: usize) -> Vec<u32> {
    let mut r = SplitMix64::new(seed);
    (0..n).map(|_| r.below(vocab as u32)).collect()
}

/// `sum_i r_i * y_i` in f64.
pub fn weighted(r: &[f32], y: &[f32]) -> f64 {
    assert_eq!(r.len(), y.len());
    r.iter()
        .zip(y)
        .map(|(&a, &b)| f64::from(a) * f64::from(b))
        .sum()
}

/// `x + s * v`.
pub fn shifted(x: &[f32], v: &[f32], s: f64) -> Vec<f32> {
    x.iter()
        .zip(v)
        .map(|(&a, &b)| (f64::from(a) + s * f64::from(b)) as f32)
        .collect()
}

/// Step sizes tried, largest first; a step is used when the function is defined (the
/// routing did not change) on both sides.
const EPS: [f64; 6] = [1e-2, 3e-3, 1e-3, 3e-4, 1e-4, 3e-5];

/// Derivative of `f` along `v` at `x0` by central differences with Richardson
/// extrapolation (`(4 D(eps/2) - D(eps)) / 3`, error O(eps^4)); `f` returns `None` where the
/// point must not be used (a top-k choice changed), and then a smaller step is tried.
/// Returns (derivative, step used).
pub fn central(name: &str, x0: &[f32], v: &[f32], f: &dyn Fn(&[f32]) -> Option<f64>) -> (f64, f64) {
    let diff = |eps: f64| -> Option<f64> {
        let plus = f(&shifted(x0, v, eps))?;
        let minus = f(&shifted(x0, v, -eps))?;
        Some((plus - minus) / (2.0 * eps))
    };
    for eps in EPS {
        if let (Some(d1), Some(d2)) = (diff(eps), diff(eps / 2.0)) {
            return ((4.0 * d2 - d1) / 3.0, eps);
        }
    }
    panic!("{name}: every finite-difference step changed the routing");
}

/// How thoroughly [`check_grad`] probes.
#[derive(Debug, Clone, Copy)]
pub struct Probe {
    /// Tolerance of the directional checks.
    pub tol_dir: f64,
    /// Tolerance of the single-coordinate checks.
    pub tol_el: f64,
    /// Random directions (besides the gradient's own).
    pub random_dirs: u64,
    /// Largest-gradient coordinates checked one by one.
    pub elements: usize,
}

/// Checks the gradient `grad` of `f` at `x0`:
/// - along the gradient's own direction `v = grad / max|grad|` (a large derivative, so the
///   f32 noise of `f` is a small share): relative error <= `tol_dir`;
/// - along `random_dirs` random directions `v` in `[-1, 1]^n`: error <= `tol_dir` times
///   `sum_i |grad_i v_i|` (a random direction's derivative can cancel to near zero while
///   its terms do not; a wrong term shows up at the size of the terms);
/// - along the `elements` largest-gradient coordinates: error <= `tol_el` times `max|grad|`
///   (one coordinate moves `f` little, so rounding noise weighs more).
///
/// Returns the worst relative error of the first two kinds.
pub fn check_grad(
    name: &str,
    x0: &[f32],
    grad: &[f32],
    f: &dyn Fn(&[f32]) -> Option<f64>,
    seed: u64,
    probe: Probe,
) -> f64 {
    let Probe {
        tol_dir,
        tol_el,
        random_dirs,
        elements,
    } = probe;
    assert_eq!(x0.len(), grad.len(), "{name}: gradient length");
    let gmax = grad.iter().fold(0.0f64, |m, &g| m.max(f64::from(g).abs()));
    assert!(gmax > 0.0, "{name}: gradient is identically zero");
    let mut worst = 0.0f64;
    let mut dirs = vec![(
        "gradient direction",
        grad.iter()
            .map(|&g| (f64::from(g) / gmax) as f32)
            .collect::<Vec<f32>>(),
    )];
    for k in 0..random_dirs {
        dirs.push(("random direction", rand_vec(seed * 7 + k, x0.len(), 1.0)));
    }
    for (kind, v) in dirs {
        let an = weighted(grad, &v);
        let scale: f64 = grad
            .iter()
            .zip(&v)
            .map(|(&g, &x)| (f64::from(g) * f64::from(x)).abs())
            .sum();
        let (fd, eps) = central(name, x0, &v, f);
        let rel = (an - fd).abs() / scale;
        worst = worst.max(rel);
        assert!(
            rel <= tol_dir,
            "{name}: derivative along the {kind}: analytic {an:e} vs finite difference {fd:e} \
             (eps {eps:e}): error {rel:e} of sum |g v| {scale:e} > {tol_dir:e}"
        );
    }
    let mut idx: Vec<usize> = (0..grad.len()).collect();
    idx.sort_by(|&a, &b| grad[b].abs().total_cmp(&grad[a].abs()));
    for &i in idx.iter().take(elements) {
        let mut v = vec![0.0f32; x0.len()];
        v[i] = 1.0;
        let (fd, eps) = central(name, x0, &v, f);
        let an = f64::from(grad[i]);
        let err = (an - fd).abs() / gmax;
        assert!(
            err <= tol_el,
            "{name}[{i}]: analytic {an:e} vs finite difference {fd:e} (eps {eps:e}): \
             error {err:e} of max |grad| {gmax:e} > {tol_el:e}"
        );
    }
    eprintln!("{name}: worst directional error {worst:e}");
    worst
}
