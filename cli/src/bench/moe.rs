//! MoE-shaped all-to-all-v traffic: how many bytes each rank sends each other rank
//! when a top-k router dispatches its tokens to experts of Zipf-skewed popularity.
//!
//! The model, deterministic for a given [`MoeShape`]:
//!
//! - `experts` experts live on the ranks in contiguous blocks (expert `e` on rank
//!   `e * n / experts`), as Megatron's expert-parallel layout places them;
//! - expert popularity follows Zipf's law with exponent `skew` (`0` is uniform):
//!   the `j`-th most popular expert has weight `1 / (j + 1)^skew`. Which expert is
//!   the `j`-th most popular is a fixed pseudo-random permutation, so the hot experts
//!   are spread over the ranks instead of all sitting on rank 0;
//! - every rank routes `tokens` tokens; each token picks `topk` distinct experts by
//!   popularity (weighted sampling without replacement), its own random stream per
//!   rank (`seed`, rank);
//! - a token sent to two experts on the same rank is sent twice (Megatron's
//!   all-to-all dispatcher permutes tokens per expert, not per rank).
//!
//! [`MoeShape::bytes`] turns the routed token counts into bytes per (source,
//! destination) for one row of a benchmark sweep.

use halo::{Error, Result};
// The routing's random numbers: SplitMix64, pure integer arithmetic, so the benchmark's
// traffic is the same on every platform and version.
use halo_moe::SplitMix64 as SplitMix;

/// The router's parameters (`halo bench alltoallv --experts --topk --skew --tokens --hidden`).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct MoeShape {
    /// Experts in the layer (over all ranks).
    pub experts: usize,
    /// Experts each token is sent to.
    pub topk: usize,
    /// Zipf exponent of expert popularity (`0`: every expert equally popular).
    pub skew: f64,
    /// Tokens each rank routes per call (the sweep's size when `hidden` is not set
    /// only scales their bytes).
    pub tokens: usize,
    /// Hidden dimension in bf16 elements (2 bytes each): when set, each token carries
    /// `2 * hidden` bytes and the sweep's size is the number of tokens per rank.
    pub hidden: Option<usize>,
    /// Seed of the router's random streams.
    pub seed: u64,
}

impl Default for MoeShape {
    /// 64 experts, top-2, skew 1.0 (Zipf), 4,096 tokens per rank, sizes as bytes.
    fn default() -> Self {
        MoeShape {
            experts: 64,
            topk: 2,
            skew: 1.0,
            tokens: 4096,
            hidden: None,
            seed: 0x4d6f_4521,
        }
    }
}

/// Uniform in 0..n (n > 0) from 53 random bits (the benchmark's definition; not
/// `SplitMix64::below`, whose multiply-shift would change the sampled routes).
fn below(rng: &mut SplitMix, n: usize) -> usize {
    (rng.next_f64() * n as f64) as usize % n
}

impl MoeShape {
    /// Checks the parameters for `n` ranks.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming the option: no experts, `topk` of 0 or above
    /// `experts`, a negative or non-finite skew, no tokens, a hidden size of 0.
    pub fn validate(&self) -> Result<()> {
        if self.experts == 0 {
            return Err(Error::invalid_argument("--experts must be at least 1"));
        }
        if self.topk == 0 || self.topk > self.experts {
            return Err(Error::invalid_argument(format!(
                "--topk {} must be between 1 and --experts ({})",
                self.topk, self.experts
            )));
        }
        if !(self.skew.is_finite() && self.skew >= 0.0) {
            return Err(Error::invalid_argument(format!(
                "--skew {} must be a number >= 0",
                self.skew
            )));
        }
        if self.tokens == 0 {
            return Err(Error::invalid_argument("--tokens must be at least 1"));
        }
        if self.hidden == Some(0) {
            return Err(Error::invalid_argument("--hidden must be at least 1"));
        }
        Ok(())
    }

    /// Popularity weights per expert (sum 1): Zipf over a fixed permutation.
    pub fn popularity(&self) -> Vec<f64> {
        let mut order: Vec<usize> = (0..self.experts).collect();
        let mut rng = SplitMix::new(self.seed ^ 0x5045_524d);
        for i in (1..order.len()).rev() {
            order.swap(i, below(&mut rng, i + 1));
        }
        let mut w = vec![0.0; self.experts];
        for (j, &e) in order.iter().enumerate() {
            w[e] = 1.0 / ((j + 1) as f64).powf(self.skew);
        }
        let sum: f64 = w.iter().sum();
        w.iter_mut().for_each(|x| *x /= sum);
        w
    }

    /// The rank expert `e` lives on, for `n` ranks.
    pub fn rank_of(&self, expert: usize, n: usize) -> usize {
        expert * n / self.experts
    }

    /// Token copies each rank sends each rank: `m[src][dst]`, for `tokens` tokens per
    /// rank. Every row sums to `tokens * topk`.
    pub fn token_matrix(&self, n: usize, tokens: usize) -> Vec<Vec<u64>> {
        let pop = self.popularity();
        (0..n)
            .map(|src| {
                let mut rng = SplitMix::new(self.seed ^ (src as u64).wrapping_mul(0x9e37_79b9));
                let mut row = vec![0u64; n];
                let mut chosen = Vec::with_capacity(self.topk);
                for _ in 0..tokens {
                    chosen.clear();
                    // Weighted sampling without replacement: draw from the remaining mass.
                    let mut left = 1.0;
                    for _ in 0..self.topk {
                        let mut x = rng.next_f64() * left;
                        let mut pick = None;
                        for (e, &p) in pop.iter().enumerate() {
                            if chosen.contains(&e) {
                                continue;
                            }
                            pick = Some(e);
                            if x < p {
                                break;
                            }
                            x -= p;
                        }
                        let e = pick.expect("topk <= experts leaves an expert to pick");
                        left -= pop[e];
                        chosen.push(e);
                        row[self.rank_of(e, n)] += 1;
                    }
                }
                row
            })
            .collect()
    }

    /// Bytes each rank sends each rank for one row of a sweep at `size`, and the row's
    /// label: the mean bytes per destination.
    ///
    /// Without `hidden`, `size` is the mean bytes per destination: the routed token
    /// counts are scaled so that a rank sends `size * n` bytes in all (rounded per
    /// pair, so small sizes give some empty pairs, as small batches do). With
    /// `hidden`, `size` is the tokens per rank and each token carries `2 * hidden`
    /// bytes.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when a byte count overflows.
    pub fn bytes(&self, n: usize, size: usize) -> Result<(usize, Vec<Vec<usize>>)> {
        let overflow = || Error::invalid_argument(format!("alltoallv at size {size} overflows"));
        match self.hidden {
            Some(h) => {
                let per_token = h.checked_mul(2).ok_or_else(overflow)?;
                let m = self.token_matrix(n, size);
                let mut out = Vec::with_capacity(n);
                for row in m {
                    let mut r = Vec::with_capacity(n);
                    for c in row {
                        r.push(
                            usize::try_from(c)
                                .ok()
                                .and_then(|c| c.checked_mul(per_token))
                                .ok_or_else(overflow)?,
                        );
                    }
                    out.push(r);
                }
                let label = size
                    .checked_mul(self.topk)
                    .and_then(|t| t.checked_mul(per_token))
                    .ok_or_else(overflow)?
                    / n.max(1);
                Ok((label, out))
            }
            None => {
                let m = self.token_matrix(n, self.tokens);
                let copies = (self.tokens * self.topk) as f64;
                let total = (size as f64) * n as f64;
                if total > (usize::MAX / 4) as f64 {
                    return Err(overflow());
                }
                let out = m
                    .into_iter()
                    .map(|row| {
                        row.into_iter()
                            .map(|c| (c as f64 * total / copies).round() as usize)
                            .collect()
                    })
                    .collect();
                Ok((size, out))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Imbalance of a byte matrix: the largest row or column total over the mean total
    /// (1.0 is perfectly balanced). The busiest sender or receiver sets the pace.
    fn imbalance(m: &[Vec<usize>]) -> f64 {
        let n = m.len();
        if n == 0 {
            return 1.0;
        }
        let rows: Vec<usize> = m.iter().map(|r| r.iter().sum()).collect();
        let cols: Vec<usize> = (0..n).map(|d| m.iter().map(|r| r[d]).sum()).collect();
        let mean = rows.iter().sum::<usize>() as f64 / n as f64;
        if mean == 0.0 {
            return 1.0;
        }
        let max = rows.iter().chain(cols.iter()).copied().max().unwrap_or(0);
        max as f64 / mean
    }

    #[test]
    fn rows_sum_to_tokens_times_topk_and_are_deterministic() {
        let s = MoeShape {
            tokens: 500,
            ..MoeShape::default()
        };
        let a = s.token_matrix(8, 500);
        assert_eq!(a, s.token_matrix(8, 500));
        for row in &a {
            assert_eq!(row.iter().sum::<u64>(), 1000);
        }
        // Different ranks route differently.
        assert_ne!(a[0], a[1]);
    }

    #[test]
    fn topk_picks_distinct_experts() {
        // 2 experts, top-2: every token goes to both, one on each of 2 ranks.
        let s = MoeShape {
            experts: 2,
            topk: 2,
            ..MoeShape::default()
        };
        assert_eq!(s.token_matrix(2, 10), vec![vec![10, 10], vec![10, 10]]);
    }

    #[test]
    fn skew_zero_is_uniform_and_skew_makes_imbalance() {
        let uniform = MoeShape {
            skew: 0.0,
            ..MoeShape::default()
        };
        assert!(
            uniform
                .popularity()
                .iter()
                .all(|&p| (p - 1.0 / 64.0).abs() < 1e-12)
        );
        let (_, u) = uniform.bytes(8, 4096).unwrap();
        let skewed = MoeShape {
            skew: 1.2,
            ..MoeShape::default()
        };
        let (_, s) = skewed.bytes(8, 4096).unwrap();
        assert!(imbalance(&u) < 1.1, "{}", imbalance(&u));
        assert!(imbalance(&s) > imbalance(&u) + 0.2, "{}", imbalance(&s));
    }

    #[test]
    fn sizes_scale_to_the_mean_and_hidden_counts_tokens() {
        let s = MoeShape::default();
        let (label, m) = s.bytes(4, 1024).unwrap();
        assert_eq!(label, 1024);
        let total: usize = m.iter().flatten().sum();
        assert!((total as f64 - 1024.0 * 16.0).abs() < 16.0, "{total}");
        let h = MoeShape {
            hidden: Some(8),
            ..MoeShape::default()
        };
        let (label, m) = h.bytes(4, 32).unwrap();
        // 32 tokens x top-2 x 16 bytes per rank, over 4 destinations.
        assert_eq!(label, 32 * 2 * 16 / 4);
        for row in &m {
            assert_eq!(row.iter().sum::<usize>(), 32 * 2 * 16);
            assert!(row.iter().all(|b| b % 16 == 0));
        }
    }

    #[test]
    fn bad_shapes_name_the_option() {
        let bad = |s: MoeShape| s.validate().unwrap_err().to_string();
        assert!(
            bad(MoeShape {
                topk: 65,
                ..MoeShape::default()
            })
            .contains("--topk 65")
        );
        assert!(
            bad(MoeShape {
                skew: -1.0,
                ..MoeShape::default()
            })
            .contains("--skew")
        );
        assert!(
            bad(MoeShape {
                experts: 0,
                ..MoeShape::default()
            })
            .contains("--experts")
        );
        assert!(
            bad(MoeShape {
                hidden: Some(0),
                ..MoeShape::default()
            })
            .contains("--hidden")
        );
    }
}
