//! Measured automatic selection: which algorithm a communicator's uniform all-to-all
//! uses when the caller forced none, decided by timing the candidates on the run itself.
//!
//! A model can be fooled (the simulator has no processor, no lock contention, no
//! oversubscribed cores), so the automatic mode measures. Per size class
//! ([`crate::select::size_class`]):
//!
//! 1. **Candidates**: the simulator's (or the alpha-beta model's) ranking for the class
//!    ([`crate::select`]), cheapest first, skipping algorithms that do not build and
//!    algorithms whose programs are the same as an earlier candidate's (tags aside),
//!    both judged on the first and the last rank's programs, at most
//!    [`MAX_CANDIDATES`]. Neither the ranking nor these tests depend on the calling
//!    rank, so every rank has the same list.
//! 2. **Trials**: the next `TRIALS x candidates` calls of the class run the candidates
//!    in turn (round robin, [`TRIALS`] calls each); each rank keeps, per candidate, the
//!    fastest of its calls.
//! 3. **Agreement**: right after the last trial call every rank takes part in one
//!    all-reduce (maximum) of those times, in nanoseconds, so a candidate's time is
//!    that of its slowest rank; every rank then picks the candidate with the smallest
//!    time (ties: the earlier candidate) — the same on every rank, because every rank
//!    reduces the same numbers.
//! 4. **Cached** per communicator and size class; after [`RETRY_CALLS`] more calls of the
//!    class the trials run again, so a choice made on a cold or disturbed machine is not
//!    kept for ever.
//!
//! A forced algorithm ([`crate::Communicator::set_algorithm`], `HALO_ALGO`) bypasses all
//! of this. With one candidate there is nothing to measure and no all-reduce.

use crate::select::Selector;
use halo_collectives::{AlgoOptions, Algorithm, BuildCtx, Layout, Schedule, Step, UniformSizes};
use halo_topology::{Rank, Topology};
use std::collections::HashMap;
use std::time::Duration;

/// Most candidates measured per size class.
pub const MAX_CANDIDATES: usize = 4;

/// Calls per candidate during a trial; the fastest counts.
pub const TRIALS: usize = 2;

/// Calls of a size class after which its trials run again.
pub const RETRY_CALLS: u64 = 4096;

/// One size class's state.
#[derive(Debug, Clone)]
enum State {
    /// Trial calls in progress: `done` calls made so far (round robin over the
    /// candidates), `best[i]` the fastest local time of candidate `i` in nanoseconds.
    Trying {
        candidates: Vec<Algorithm>,
        done: usize,
        best: Vec<u64>,
    },
    /// Decided; `calls` made since.
    Decided {
        candidates: Vec<Algorithm>,
        algorithm: Algorithm,
        times: Vec<u64>,
        calls: u64,
    },
}

/// What the measured selection concluded for one size class.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tuned {
    /// The algorithm in use.
    pub algorithm: Algorithm,
    /// Every candidate with its agreed time (the slowest rank's fastest trial call),
    /// in nanoseconds, in candidate order; empty when there was one candidate.
    pub times: Vec<(Algorithm, u64)>,
}

/// A communicator's measured-selection state, per size class.
#[derive(Debug, Default)]
pub(crate) struct Tuner {
    classes: HashMap<u32, State>,
}

impl Tuner {
    /// The algorithm the next call of `class` runs. `candidates` is asked only when the
    /// class has no state yet (it must give every rank the same list, not empty).
    pub(crate) fn pick(
        &mut self,
        class: u32,
        candidates: impl FnOnce() -> Vec<Algorithm>,
    ) -> Option<Algorithm> {
        let state = match self.classes.entry(class) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                let c = candidates();
                if c.is_empty() {
                    return None;
                }
                e.insert(start(c))
            }
        };
        match state {
            State::Trying {
                candidates, done, ..
            } => {
                if *done >= TRIALS * candidates.len() {
                    // The agreement after the last trial did not happen (an error): try again.
                    *state = start(candidates.clone());
                    return self.pick(class, Vec::new);
                }
                Some(candidates[*done % candidates.len()])
            }
            State::Decided { algorithm, .. } => Some(*algorithm),
        }
    }

    /// Records that a call of `class` with `algorithm` took `elapsed` on this rank.
    /// Returns this rank's times per candidate when the trials are complete: the caller
    /// must then all-reduce them (maximum) on every rank and pass the result to
    /// [`Tuner::agree`].
    pub(crate) fn record(
        &mut self,
        class: u32,
        algorithm: Algorithm,
        elapsed: Duration,
    ) -> Option<Vec<u64>> {
        let state = self.classes.get_mut(&class)?;
        match state {
            State::Trying {
                candidates,
                done,
                best,
            } => {
                let i = *done % candidates.len();
                if candidates[i] != algorithm {
                    return None;
                }
                let ns = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
                best[i] = best[i].min(ns);
                *done += 1;
                (*done == TRIALS * candidates.len()).then(|| best.clone())
            }
            State::Decided {
                candidates, calls, ..
            } => {
                *calls += 1;
                if *calls >= RETRY_CALLS {
                    *state = start(candidates.clone());
                }
                None
            }
        }
    }

    /// Decides `class` from the times all-reduced (maximum over ranks) after its trials.
    pub(crate) fn agree(&mut self, class: u32, times: &[u64]) -> Option<Algorithm> {
        let State::Trying { candidates, .. } = self.classes.get(&class)? else {
            return None;
        };
        if times.len() != candidates.len() {
            return None;
        }
        let candidates = candidates.clone();
        let mut at = 0;
        for (i, &t) in times.iter().enumerate() {
            if t < times[at] {
                at = i;
            }
        }
        let algorithm = candidates[at];
        tracing::debug!(
            class,
            %algorithm,
            times_ns = ?candidates.iter().zip(times).collect::<Vec<_>>(),
            "measured all-to-all candidates"
        );
        self.classes.insert(
            class,
            State::Decided {
                candidates,
                algorithm,
                times: times.to_vec(),
                calls: 0,
            },
        );
        Some(algorithm)
    }

    /// What was decided for `class`, if anything.
    pub(crate) fn tuned(&self, class: u32) -> Option<Tuned> {
        match self.classes.get(&class)? {
            State::Decided {
                candidates,
                algorithm,
                times,
                ..
            } => Some(Tuned {
                algorithm: *algorithm,
                times: candidates
                    .iter()
                    .copied()
                    .zip(times.iter().copied())
                    .collect(),
            }),
            State::Trying { .. } => None,
        }
    }

    /// Forgets everything (the builder options changed).
    pub(crate) fn reset(&mut self) {
        self.classes.clear();
    }
}

fn start(candidates: Vec<Algorithm>) -> State {
    if candidates.len() == 1 {
        return State::Decided {
            algorithm: candidates[0],
            candidates,
            times: Vec::new(),
            calls: 0,
        };
    }
    State::Trying {
        best: vec![u64::MAX; candidates.len()],
        candidates,
        done: 0,
    }
}

/// The candidates for a uniform all-to-all of `block` bytes: the ranking's algorithms
/// that build, cheapest first, without those whose programs are the same as an earlier
/// candidate's (tags aside), at most [`MAX_CANDIDATES`]. Both tests look at the programs
/// of the first and the last rank only — never at the calling rank's — so every rank
/// computes the same list (as [`crate::select::buildable`] does). Algorithms that do not
/// build are marked unavailable in `selector`.
pub(crate) fn candidates(
    selector: &mut Selector,
    topology: &Topology,
    options: &AlgoOptions,
    block: usize,
) -> Vec<Algorithm> {
    let sizes = UniformSizes(block);
    let probes: Vec<Rank> = {
        let last = topology.size().saturating_sub(1);
        if last == 0 { vec![0] } else { vec![0, last] }
    };
    let mut out = Vec::new();
    let mut programs: Vec<Vec<Schedule>> = Vec::new();
    for a in selector.candidates(topology, options, block) {
        if out.len() == MAX_CANDIDATES {
            break;
        }
        let built: Result<Vec<Schedule>, _> = probes
            .iter()
            .map(|&rank| {
                halo_collectives::build(
                    a,
                    &BuildCtx {
                        topology,
                        rank,
                        layout: Layout::Uniform { block },
                        sizes: &sizes,
                        options,
                    },
                )
            })
            .collect();
        match built {
            Ok(s) => {
                let duplicate = programs
                    .iter()
                    .any(|p| p.iter().zip(&s).all(|(x, y)| same_program(x, y)));
                if !duplicate {
                    out.push(a);
                    programs.push(s);
                }
            }
            Err(e) => selector.mark_unavailable(a, &e),
        }
    }
    out
}

/// Whether two programs do the same thing: the same steps (tags aside) in the same
/// order with the same dependencies and scratch.
fn same_program(a: &Schedule, b: &Schedule) -> bool {
    fn strip(s: &Step) -> Step {
        match *s {
            Step::Send { peer, region, .. } => Step::Send {
                peer,
                tag: 0,
                region,
            },
            Step::Recv { peer, region, .. } => Step::Recv {
                peer,
                tag: 0,
                region,
            },
            c @ Step::Copy { .. } => c,
        }
    }
    a.len() == b.len()
        && a.scratch_len() == b.scratch_len()
        && a.steps()
            .iter()
            .zip(b.steps())
            .enumerate()
            .all(|(i, (x, y))| strip(x) == strip(y) && a.deps(i as u32) == b.deps(i as u32))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(x: u64) -> Duration {
        Duration::from_millis(x)
    }

    #[test]
    fn trials_round_robin_then_agree_on_the_smallest_time() {
        let mut t = Tuner::default();
        let c = vec![Algorithm::Flat, Algorithm::Halo, Algorithm::Bruck];
        let mut seen = Vec::new();
        let mut out = None;
        for i in 0..TRIALS * 3 {
            let a = t.pick(5, || c.clone()).unwrap();
            seen.push(a);
            assert!(t.tuned(5).is_none());
            let took = match a {
                Algorithm::Flat => 30,
                Algorithm::Halo => 10 + i as u64,
                _ => 20,
            };
            out = t.record(5, a, ms(took));
            assert_eq!(out.is_some(), i + 1 == TRIALS * 3);
        }
        assert_eq!(&seen[..3], &c[..]);
        let local = out.unwrap();
        assert_eq!(local, vec![30_000_000, 11_000_000, 20_000_000]);
        // Another rank was slower with HALO: the maximum decides.
        let agreed = vec![30_000_000, 25_000_000, 20_000_000];
        assert_eq!(t.agree(5, &agreed), Some(Algorithm::Bruck));
        assert_eq!(t.pick(5, Vec::new), Some(Algorithm::Bruck));
        let tuned = t.tuned(5).unwrap();
        assert_eq!(tuned.algorithm, Algorithm::Bruck);
        assert_eq!(tuned.times[1], (Algorithm::Halo, 25_000_000));
    }

    #[test]
    fn ties_go_to_the_earlier_candidate_and_one_candidate_needs_no_trial() {
        let mut t = Tuner::default();
        let c = vec![Algorithm::Halo, Algorithm::Flat];
        for _ in 0..TRIALS * 2 {
            let a = t.pick(1, || c.clone()).unwrap();
            t.record(1, a, ms(1));
        }
        assert_eq!(t.agree(1, &[7, 7]), Some(Algorithm::Halo));
        assert_eq!(
            t.pick(2, || vec![Algorithm::Pairwise]),
            Some(Algorithm::Pairwise)
        );
        assert!(t.record(2, Algorithm::Pairwise, ms(1)).is_none());
        assert_eq!(t.tuned(2).unwrap().algorithm, Algorithm::Pairwise);
        assert_eq!(t.pick(3, Vec::new), None);
    }

    #[test]
    fn a_decision_is_retried_after_retry_calls() {
        let mut t = Tuner::default();
        let c = vec![Algorithm::Flat, Algorithm::Halo];
        for _ in 0..TRIALS * 2 {
            let a = t.pick(9, || c.clone()).unwrap();
            t.record(9, a, ms(1));
        }
        t.agree(9, &[1, 2]);
        for _ in 0..RETRY_CALLS {
            let a = t.pick(9, Vec::new).unwrap();
            assert_eq!(a, Algorithm::Flat);
            assert!(t.record(9, a, ms(1)).is_none());
        }
        assert!(t.tuned(9).is_none(), "trials start again");
        assert_eq!(t.pick(9, Vec::new), Some(Algorithm::Flat));
        assert!(t.record(9, Algorithm::Flat, ms(1)).is_none());
        assert_eq!(t.pick(9, Vec::new), Some(Algorithm::Halo));
    }

    #[test]
    fn a_missed_agreement_restarts_the_trials() {
        let mut t = Tuner::default();
        let c = vec![Algorithm::Flat, Algorithm::Halo];
        for _ in 0..TRIALS * 2 {
            let a = t.pick(4, || c.clone()).unwrap();
            t.record(4, a, ms(1));
        }
        // No agree(): the next pick starts over.
        assert_eq!(t.pick(4, Vec::new), Some(Algorithm::Flat));
        assert!(t.agree(4, &[1]).is_none(), "wrong length is refused");
    }
}
