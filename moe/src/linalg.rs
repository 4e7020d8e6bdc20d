//! Row-major matrix products as plain loops, with a fixed summation order.
//!
//! Every product is written as a sequence of `axpy` row updates (`out_row += s * w_row`), which
//! the compiler vectorises across the output row without reordering any one element's sum. So
//! each output element is the sum of its terms in index order, whatever the other rows are:
//! a token's activations do not depend on which other tokens share its batch, and weight
//! gradients accumulate row by row in the order the rows are given.

/// `out (n x b) = x (n x a) * w (a x b)`, overwriting `out`.
pub(crate) fn matmul(x: &[f32], w: &[f32], n: usize, a: usize, b: usize, out: &mut [f32]) {
    debug_assert_eq!(x.len(), n * a);
    debug_assert_eq!(w.len(), a * b);
    debug_assert_eq!(out.len(), n * b);
    for (xr, orow) in x.chunks_exact(a).zip(out.chunks_exact_mut(b)) {
        orow.fill(0.0);
        for (&xv, wr) in xr.iter().zip(w.chunks_exact(b)) {
            axpy(xv, wr, orow);
        }
    }
}

/// `dw (a x b) += x^T * dy` for `x (n x a)`, `dy (n x b)`: row `i` of the batch is added in
/// order `i = 0, 1, ...`.
pub(crate) fn matmul_tn_acc(x: &[f32], dy: &[f32], n: usize, a: usize, b: usize, dw: &mut [f32]) {
    debug_assert_eq!(x.len(), n * a);
    debug_assert_eq!(dy.len(), n * b);
    debug_assert_eq!(dw.len(), a * b);
    for (xr, dyr) in x.chunks_exact(a).zip(dy.chunks_exact(b)) {
        for (&xv, dwr) in xr.iter().zip(dw.chunks_exact_mut(b)) {
            axpy(xv, dyr, dwr);
        }
    }
}

/// `dx (n x a) = dy (n x b) * w^T` for `w (a x b)`, overwriting `dx`.
pub(crate) fn matmul_nt(dy: &[f32], w: &[f32], n: usize, a: usize, b: usize, dx: &mut [f32]) {
    let wt = transpose(w, a, b);
    matmul(dy, &wt, n, b, a, dx);
}

/// Transpose of `w (a x b)` as a new `b x a` matrix.
pub(crate) fn transpose(w: &[f32], a: usize, b: usize) -> Vec<f32> {
    debug_assert_eq!(w.len(), a * b);
    let mut t = vec![0.0; a * b];
    for i in 0..a {
        for j in 0..b {
            t[j * a + i] = w[i * b + j];
        }
    }
    t
}

/// `y += s * x`.
#[inline]
pub(crate) fn axpy(s: f32, x: &[f32], y: &mut [f32]) {
    for (yv, &xv) in y.iter_mut().zip(x) {
        *yv += s * xv;
    }
}

/// `y += x`.
#[inline]
pub(crate) fn add_into(x: &[f32], y: &mut [f32]) {
    for (yv, &xv) in y.iter_mut().zip(x) {
        *yv += xv;
    }
}

/// Dot product, summed in index order.
#[inline]
pub(crate) fn dot(x: &[f32], y: &[f32]) -> f32 {
    let mut s = 0.0f32;
    for (a, b) in x.iter().zip(y) {
        s += a * b;
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn products_match_definitions() {
        let (n, a, b) = (3, 4, 2);
        let x: Vec<f32> = (0..n * a).map(|i| i as f32 * 0.5 - 1.0).collect();
        let w: Vec<f32> = (0..a * b).map(|i| (i as f32).sin()).collect();
        let mut y = vec![9.0; n * b];
        matmul(&x, &w, n, a, b, &mut y);
        for i in 0..n {
            for j in 0..b {
                let want: f32 = (0..a).map(|p| x[i * a + p] * w[p * b + j]).sum();
                assert!((y[i * b + j] - want).abs() < 1e-5);
            }
        }
        let dy: Vec<f32> = (0..n * b).map(|i| (i as f32).cos()).collect();
        let mut dw = vec![1.0; a * b];
        matmul_tn_acc(&x, &dy, n, a, b, &mut dw);
        for p in 0..a {
            for j in 0..b {
                let want: f32 = 1.0 + (0..n).map(|i| x[i * a + p] * dy[i * b + j]).sum::<f32>();
                assert!((dw[p * b + j] - want).abs() < 1e-5);
            }
        }
        let mut dx = vec![7.0; n * a];
        matmul_nt(&dy, &w, n, a, b, &mut dx);
        for i in 0..n {
            for p in 0..a {
                let want: f32 = (0..b).map(|j| dy[i * b + j] * w[p * b + j]).sum();
                assert!((dx[i * a + p] - want).abs() < 1e-5);
            }
        }
    }
}
