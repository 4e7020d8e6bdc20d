//! The exact sharing model, for small cases: max-min fair rates recomputed over all
//! active flows at every event (progressive filling).
//!
//! A flow's progress is measured in *units*, its largest demand on any resource; at
//! rate `x` units per second it loads resource `r` with `x * d_r / units`. Rates are
//! max-min fair in units per second: without per-message gaps every demand is the
//! message's bytes and this is ordinary max-min fairness in bytes per second. Each
//! event costs O(flows x path x bottleneck levels): fine for a few thousand flows,
//! far too slow for a million, which is why [`super::processor_sharing`] is the default.

use super::Sharer;

#[derive(Debug)]
struct Flow {
    op: u32,
    /// (resource, weight = demand / units).
    path: Vec<(u32, f64)>,
    units: f64,
    rem: f64,
    rate: f64,
}

/// Max-min fair sharing, recomputed at every event.
#[derive(Debug)]
pub(crate) struct MaxMin {
    cap: Vec<f64>,
    flows: Vec<Flow>,
    t: f64,
    next: Option<(f64, usize)>,
    dirty: bool,
    load: Vec<f64>,
    residual: Vec<f64>,
    wsum: Vec<f64>,
}

impl MaxMin {
    pub(crate) fn new(cap: &[f64]) -> Self {
        MaxMin {
            cap: cap.to_vec(),
            flows: Vec::new(),
            t: 0.0,
            next: None,
            dirty: false,
            load: vec![0.0; cap.len()],
            residual: vec![0.0; cap.len()],
            wsum: vec![0.0; cap.len()],
        }
    }

    fn advance(&mut self, t: f64) {
        let dt = t - self.t;
        if dt > 0.0 {
            for f in &mut self.flows {
                f.rem -= f.rate * dt;
            }
        }
        self.t = t;
    }

    /// Progressive filling: raise every unfrozen flow's rate together until a resource
    /// saturates, freeze the flows crossing it, repeat.
    fn rates(&mut self) {
        let mut touched: Vec<u32> = self
            .flows
            .iter()
            .flat_map(|f| f.path.iter().map(|p| p.0))
            .collect();
        touched.sort_unstable();
        touched.dedup();
        for &r in &touched {
            self.residual[r as usize] = self.cap[r as usize];
        }
        let mut frozen = vec![false; self.flows.len()];
        for f in &mut self.flows {
            f.rate = 0.0;
        }
        loop {
            for &r in &touched {
                self.wsum[r as usize] = 0.0;
            }
            for (f, _) in self.flows.iter().zip(&frozen).filter(|(_, z)| !**z) {
                for &(r, w) in &f.path {
                    self.wsum[r as usize] += w;
                }
            }
            let step = touched
                .iter()
                .filter(|&&r| self.wsum[r as usize] > 0.0)
                .map(|&r| self.residual[r as usize].max(0.0) / self.wsum[r as usize])
                .min_by(f64::total_cmp);
            let Some(step) = step else { break };
            for &r in &touched {
                self.residual[r as usize] -= step * self.wsum[r as usize];
            }
            for (i, f) in self.flows.iter_mut().enumerate() {
                if frozen[i] {
                    continue;
                }
                f.rate += step;
                if f.path.iter().any(|&(r, _)| {
                    self.wsum[r as usize] > 0.0
                        && self.residual[r as usize] <= 1e-9 * self.cap[r as usize]
                }) {
                    frozen[i] = true;
                }
            }
        }
        self.next = self
            .flows
            .iter()
            .enumerate()
            .map(|(i, f)| (self.t + (f.rem.max(0.0) / f.rate), i))
            .min_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    }
}

impl Sharer for MaxMin {
    fn add(&mut self, t: f64, op: u32, path: &[(u32, f64)]) {
        self.advance(t);
        let units = path.iter().map(|p| p.1).fold(0.0, f64::max);
        for &(r, d) in path {
            self.load[r as usize] += d;
        }
        self.flows.push(Flow {
            op,
            path: path.iter().map(|&(r, d)| (r, d / units)).collect(),
            units,
            rem: units,
            rate: 0.0,
        });
        self.dirty = true;
    }

    fn flush(&mut self) {
        if self.dirty {
            self.dirty = false;
            self.rates();
        }
    }

    fn next(&self) -> Option<f64> {
        self.next.map(|n| n.0)
    }

    fn pop(&mut self, t: f64, done: &mut Vec<u32>, released: &mut Vec<u32>) {
        self.advance(t);
        let (_, first) = self.next.expect("a pending completion");
        let mut k = 0;
        self.flows.retain(|f| {
            let gone = k == first || f.rem <= 1e-9 * f.units;
            k += 1;
            if gone {
                done.push(f.op);
                released.push(f.op);
            }
            !gone
        });
        self.dirty = true;
    }

    fn loads(&self) -> &[f64] {
        &self.load
    }
}
