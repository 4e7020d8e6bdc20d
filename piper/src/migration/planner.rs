//! Piper's hill-climbing planner (REFERENCE.md §1.3): up to `T` times, take the most and
//! the least loaded GPU of the EP group and apply the expert swap between them that
//! shrinks their gap the most; stop when no swap helps.
//!
//! One extension: when no swap between the most and the *least* loaded GPU helps, the
//! most loaded one is paired with the next least loaded, and so on; the climb stops when
//! no swap between the most loaded GPU and any other shrinks their gap. Piper's rule alone
//! stalls on loads such as `[432, 4 | 384, 12 | 259, 186 | 425, 346]` (imbalance 1.43
//! after one swap, where 1.18 is possible); with the extension it reaches 1.18.
//!
//! Swapping expert `a` (on the most loaded GPU) with `b` (on the least loaded) changes
//! both loads by `delta = load(a) - load(b)`; their gap `g` becomes `|g - 2 delta|`, which
//! is smaller exactly when `0 < delta < g`. Each such swap strictly lowers the sum of
//! squared GPU loads, so the climb never cycles.
//!
//! Only swaps: every GPU keeps `E / EP` experts, so its memory stays what the resource
//! model sized it for, and a dispatch's count exchange stays a uniform all-to-all. Loads
//! are integers and ties go to the lower index, so every rank computes the same plan
//! from the same agreed loads.

use super::load::{gpu_loads, imbalance};

/// The plan for one block.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerPlan {
    /// Owners after the swaps, by expert id.
    pub owners: Vec<usize>,
    /// Swaps applied, in order: `(expert on the most loaded GPU, expert on the least)`.
    pub swaps: Vec<(usize, usize)>,
    /// Imbalance (max / mean GPU load) before.
    pub before: f64,
    /// Imbalance after.
    pub after: f64,
}

/// Hill climbing from `owners` (EP index per expert) for `loads` (per expert), at most
/// `iterations` swaps.
pub fn hill_climb(loads: &[u64], owners: &[usize], ep: usize, iterations: usize) -> LayerPlan {
    let mut owners = owners.to_vec();
    let mut gpu = gpu_loads(loads, &owners, ep);
    let before = imbalance(&gpu);
    let mut swaps = Vec::new();
    for _ in 0..iterations {
        let Some(hi) = argmax(&gpu) else { break };
        // Partners by load, least loaded first (ties to the lower index): Piper's rule
        // takes the least loaded; when no swap with it helps, the next one is tried.
        let mut partners: Vec<usize> = (0..ep).filter(|&q| q != hi).collect();
        partners.sort_by_key(|&q| (gpu[q], q));
        let found = partners
            .iter()
            .find_map(|&lo| best_swap(loads, &owners, &gpu, hi, lo).map(|(a, b)| (lo, a, b)));
        let Some((lo, a, b)) = found else { break };
        owners.swap(a, b);
        let delta = loads[a] - loads[b];
        gpu[hi] -= delta;
        gpu[lo] += delta;
        swaps.push((a, b));
    }
    let after = imbalance(&gpu);
    LayerPlan {
        owners,
        swaps,
        before,
        after,
    }
}

/// The swap of an expert `a` of GPU `hi` with an expert `b` of GPU `lo` that shrinks
/// their gap the most (`None` when none shrinks it); ties to the lowest ids.
fn best_swap(
    loads: &[u64],
    owners: &[usize],
    gpu: &[u64],
    hi: usize,
    lo: usize,
) -> Option<(usize, usize)> {
    if gpu[hi] <= gpu[lo] {
        return None;
    }
    let gap = gpu[hi] - gpu[lo];
    let mut best: Option<(u64, usize, usize)> = None;
    for a in (0..owners.len()).filter(|&a| owners[a] == hi) {
        for b in (0..owners.len()).filter(|&b| owners[b] == lo) {
            if loads[a] <= loads[b] {
                continue;
            }
            let delta = loads[a] - loads[b];
            if delta >= gap {
                continue;
            }
            let new_gap = (gap as i128 - 2 * delta as i128).unsigned_abs() as u64;
            if best.is_none_or(|(g, _, _)| new_gap < g) {
                best = Some((new_gap, a, b));
            }
        }
    }
    best.map(|(_, a, b)| (a, b))
}

fn argmax(v: &[u64]) -> Option<usize> {
    let m = *v.iter().max()?;
    v.iter().position(|&x| x == m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_swap_evens_two_gpus() {
        // GPU 0: 9 + 7 = 16, GPU 1: 1 + 2 = 3, gap 13. 9 <-> 2 and 7 <-> 1 both leave a
        // gap of 1: the lower ids win.
        let p = hill_climb(&[9, 7, 1, 2], &[0, 0, 1, 1], 2, 10);
        assert_eq!(p.swaps, [(0, 3)]);
        assert_eq!(p.owners, [1, 0, 1, 0]);
        assert_eq!(gpu_loads(&[9, 7, 1, 2], &p.owners, 2), [9, 10]);
        assert!(p.after < p.before);
    }

    #[test]
    fn pairs_with_the_next_gpu_when_the_least_loaded_one_does_not_help() {
        let loads = [432, 4, 384, 12, 259, 186, 425, 346];
        let p = hill_climb(&loads, &[0, 0, 1, 1, 2, 2, 3, 3], 4, 16);
        // The best possible: 605 of a mean 512.
        assert_eq!(*gpu_loads(&loads, &p.owners, 4).iter().max().unwrap(), 605);
        assert_eq!(p.swaps, [(6, 2), (2, 4)]);
    }

    #[test]
    fn stops_when_no_swap_helps_and_respects_the_budget() {
        let p = hill_climb(&[5, 5, 5, 5], &[0, 0, 1, 1], 2, 10);
        assert!(p.swaps.is_empty());
        assert_eq!(p.before, 1.0);
        let loads = [100, 90, 80, 70, 4, 3, 2, 1];
        let owners = [0, 0, 1, 1, 2, 2, 3, 3];
        assert_eq!(hill_climb(&loads, &owners, 4, 1).swaps.len(), 1);
        let p = hill_climb(&loads, &owners, 4, 100);
        assert!(p.swaps.len() > 1);
        // Never more or fewer experts per GPU.
        for q in 0..4 {
            assert_eq!(p.owners.iter().filter(|&&o| o == q).count(), 2);
        }
    }
}
