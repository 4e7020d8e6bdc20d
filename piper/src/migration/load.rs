//! Load: the slots each expert received, agreed on by every rank of the mesh with a
//! collective, counted over a window of steps; load per GPU and imbalance.
//!
//! Each rank counts what its own routers sent to every expert of its stage's blocks
//! ([`crate::StepReport::routed`]); [`agree`] sums those counts over the EP group, the DP
//! group and the pipeline (integer all-reduces, exact), so every rank ends with the same
//! `layers x experts` loads of the whole model and can plan every block identically.

use std::collections::VecDeque;

use halo::ReduceOp;

use crate::error::{PiperError, Result};
use crate::executor::Mesh;

/// Sums `routed` (`layers x experts`, this rank's part) over the EP, DP and PP groups of
/// `mesh` in place: afterwards every rank holds the same loads of every block. Collective
/// over the whole mesh (three small all-reduces).
///
/// # Errors
/// [`PiperError::Comm`] from the library.
pub fn agree(mesh: &mut Mesh, routed: &mut [u64]) -> Result<()> {
    if mesh.ep.size() > 1 {
        mesh.ep.all_reduce_in_place(routed, ReduceOp::Sum)?;
    }
    if let Some(dp) = mesh.dp.as_mut() {
        dp.all_reduce_in_place(routed, ReduceOp::Sum)?;
    }
    if mesh.pp.size() > 1 {
        mesh.pp.all_reduce_in_place(routed, ReduceOp::Sum)?;
    }
    Ok(())
}

/// Load per GPU of one block: the sum of the loads of the experts each EP index holds.
pub fn gpu_loads(loads: &[u64], owners: &[usize], ep: usize) -> Vec<u64> {
    let mut g = vec![0u64; ep];
    for (&l, &q) in loads.iter().zip(owners) {
        if let Some(x) = g.get_mut(q) {
            *x += l;
        }
    }
    g
}

/// Imbalance of GPU loads: max / mean (1 when there is no load).
pub fn imbalance(gpu: &[u64]) -> f64 {
    let total: u64 = gpu.iter().sum();
    let max = gpu.iter().copied().max().unwrap_or(0);
    if total == 0 {
        1.0
    } else {
        max as f64 * gpu.len() as f64 / total as f64
    }
}

/// The agreed loads of the last `window` steps, summed.
#[derive(Debug, Clone)]
pub struct LoadWindow {
    window: usize,
    len: usize,
    steps: VecDeque<Vec<u64>>,
}

impl LoadWindow {
    /// A window of `window` steps over loads of `len` (`layers x experts`) counters.
    ///
    /// # Errors
    /// [`PiperError::Invalid`] naming `window` when it is 0.
    pub fn new(window: usize, len: usize) -> Result<Self> {
        if window == 0 {
            return Err(PiperError::invalid(
                "migration",
                "window",
                "must be at least 1 step",
            ));
        }
        Ok(LoadWindow {
            window,
            len,
            steps: VecDeque::with_capacity(window),
        })
    }

    /// Adds one step's agreed loads, dropping the oldest beyond the window.
    ///
    /// # Errors
    /// [`PiperError::Invalid`] when `loads` has the wrong length.
    pub fn push(&mut self, loads: Vec<u64>) -> Result<()> {
        if loads.len() != self.len {
            return Err(PiperError::invalid(
                "migration",
                "loads",
                format!("{} counters, expected {}", loads.len(), self.len),
            ));
        }
        if self.steps.len() == self.window {
            self.steps.pop_front();
        }
        self.steps.push_back(loads);
        Ok(())
    }

    /// Steps held (at most the window).
    pub fn steps(&self) -> usize {
        self.steps.len()
    }

    /// The loads summed over the window.
    pub fn sum(&self) -> Vec<u64> {
        let mut s = vec![0u64; self.len];
        for step in &self.steps {
            for (a, b) in s.iter_mut().zip(step) {
                *a += b;
            }
        }
        s
    }

    /// Forgets every step (after a migration the old loads still describe the experts,
    /// but the window restarts so that each decision sees whole windows).
    pub fn clear(&mut self) {
        self.steps.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn imbalance_is_max_over_mean() {
        let g = gpu_loads(&[10, 0, 5, 5, 0, 0, 20, 0], &[0, 0, 1, 1, 2, 2, 3, 3], 4);
        assert_eq!(g, [10, 10, 0, 20]);
        assert_eq!(imbalance(&g), 2.0);
        assert_eq!(imbalance(&[0, 0]), 1.0);
    }

    #[test]
    fn the_window_keeps_the_last_steps() {
        let mut w = LoadWindow::new(2, 2).unwrap();
        w.push(vec![1, 2]).unwrap();
        w.push(vec![10, 20]).unwrap();
        w.push(vec![100, 200]).unwrap();
        assert_eq!(w.sum(), [110, 220]);
        assert_eq!(w.steps(), 2);
        assert!(w.push(vec![1]).is_err());
        assert!(LoadWindow::new(0, 2).is_err());
    }
}
