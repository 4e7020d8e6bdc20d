//! RMSNorm (`y = g * x / sqrt(mean(x^2) + eps)`), row by row.

/// What RMSNorm's backward needs: the normalised rows and each row's `1/rms`.
#[derive(Debug, Clone)]
pub(crate) struct NormSaved {
    pub(crate) xhat: Vec<f32>,
    pub(crate) rinv: Vec<f32>,
}

impl NormSaved {
    pub(crate) fn bytes(&self) -> usize {
        4 * (self.xhat.len() + self.rinv.len())
    }
}

/// Forward over rows of width `d`: returns `y` and the saved state.
pub(crate) fn rms_forward(x: &[f32], g: &[f32], d: usize, eps: f32) -> (Vec<f32>, NormSaved) {
    let rows = x.len() / d;
    let mut y = vec![0.0; x.len()];
    let mut xhat = vec![0.0; x.len()];
    let mut rinv = vec![0.0; rows];
    for r in 0..rows {
        let xr = &x[r * d..(r + 1) * d];
        let mut ss = 0.0f32;
        for &v in xr {
            ss += v * v;
        }
        let ri = 1.0 / (ss / d as f32 + eps).sqrt();
        rinv[r] = ri;
        let xh = &mut xhat[r * d..(r + 1) * d];
        let yr = &mut y[r * d..(r + 1) * d];
        for i in 0..d {
            xh[i] = xr[i] * ri;
            yr[i] = xh[i] * g[i];
        }
    }
    (y, NormSaved { xhat, rinv })
}

/// Backward: accumulates `dg` (rows in order) and returns `dx`.
pub(crate) fn rms_backward(
    dy: &[f32],
    saved: &NormSaved,
    g: &[f32],
    d: usize,
    dg: &mut [f32],
) -> Vec<f32> {
    let rows = saved.rinv.len();
    let mut dx = vec![0.0; rows * d];
    let mut dxh = vec![0.0; d];
    for r in 0..rows {
        let dyr = &dy[r * d..(r + 1) * d];
        let xh = &saved.xhat[r * d..(r + 1) * d];
        let mut m = 0.0f32;
        for i in 0..d {
            dg[i] += dyr[i] * xh[i];
            dxh[i] = dyr[i] * g[i];
            m += dxh[i] * xh[i];
        }
        m /= d as f32;
        let ri = saved.rinv[r];
        let dxr = &mut dx[r * d..(r + 1) * d];
        for i in 0..d {
            dxr[i] = ri * (dxh[i] - xh[i] * m);
        }
    }
    dx
}
