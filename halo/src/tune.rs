//! Measured automatic selection: which algorithm a communicator's all-to-all (uniform)
//! and all-to-all-v data pass use when the caller forced none, decided by timing the
//! candidates on the run itself. One tuner serves both, with separate keys (`Key`).
//!
//! A model can be fooled (the simulator has no processor, no lock contention, no
//! oversubscribed cores), so the automatic mode measures. Per size class
//! ([`crate::select::size_class`]) — of the block for the uniform all-to-all, of the
//! mean block over all `n x n` pairs (total bytes / `n^2`) for all-to-all-v, which
//! every rank knows identically once the counts are exchanged (the gathered count
//! matrix, or the totals in the three-pass path's status blocks), so that every rank
//! uses the same class:
//!
//! 1. **Candidates**: the simulator's (or the alpha-beta model's) ranking for the class
//!    ([`crate::select`]), cheapest first, skipping algorithms that do not build and
//!    algorithms whose programs are the same as an earlier candidate's (tags aside),
//!    both judged on the first and the last rank's programs, at most
//!    [`MAX_CANDIDATES`]. Neither the ranking nor these tests depend on the calling
//!    rank, so every rank has the same list.
//! 2. **Trials**: the next calls of the class run the candidates in blocks of
//!    consecutive calls, in two passes, the model's order and then the reverse (A B C,
//!    C B A: a load that drifts over the trials weighs on every candidate alike). A
//!    block starts with [`lead_calls`] untimed calls and then times half of the
//!    candidate's [`trials`] (8 calls each for blocks under 64 KiB, whose calls take
//!    microseconds and vary by more than the candidates differ, [`TRIALS`] above);
//!    [`trial_call`] says which call does what. The untimed calls
//!    are there because a call's time depends on the calls before it: in the emulated
//!    cluster (16 threads on 2 cores) the first two calls of an algorithm after
//!    another one's took up to 25% more or less than its steady calls, and an earlier
//!    round robin (every call a different candidate) measured only those
//!    transitions — it ranked HALO 11% ahead of the flat fan-out at 8 KiB where it is
//!    4-9% behind in steady calls (docs/bench/JOURNAL.md, "The tuner's trials"). Each
//!    rank keeps, per candidate, the median of its timed calls (the fastest would
//!    reward one lucky turn of the scheduler).
//! 3. **Agreement**: right after the last trial call every rank takes part in one
//!    all-reduce (sum) of those times, in nanoseconds; divided by the ranks, a
//!    candidate's time is the mean over the ranks of their medians — what a rank spends
//!    in the call, OSU's "Avg Latency". (The slowest rank's, used before, adds the skew
//!    with which the ranks enter the call, which is the same whichever algorithm runs
//!    and is the noisiest part of a small call.) Every rank then picks the candidate
//!    with the smallest time, where a later candidate (the model ranked it lower) must
//!    be at least [`MARGIN`] faster than the one it displaces (ties and near-ties: the
//!    earlier candidate) — the same on every rank, because every rank reduces the same
//!    numbers.
//! 4. **Cached** per communicator and size class (in its policy, `src/policy.rs`,
//!    which asks the tuner once per call); after [`RETRY_CALLS`] more calls of the
//!    class the trials run again, so a choice made on a cold or disturbed machine is not
//!    kept for ever. A decided call is not timed: it costs one lookup.
//!
//! A forced algorithm ([`crate::Communicator::set_algorithm`], `HALO_ALGO`) bypasses all
//! of this (the policy looks at it before asking the tuner). With one candidate there is
//! nothing to measure and no all-reduce.
//!
//! All-to-all-v specifics: the candidates are those of the uniform all-to-all of the
//! mean block (built and compared with uniform blocks, as above), less the forwarding
//! algorithms the count exchange did not prepare for (after a uniform metadata pass only
//! that pass's algorithm may forward), and the time of a call is its data pass,
//! schedule build included (it is built on every call); the count exchange is the same
//! whichever algorithm runs and is not timed. A call that fails in the count exchange
//! (a count mismatch, invalid arguments) fails on every rank before the data pass, so
//! no rank records a trial for it and the trials stay in step.

use halo_collectives::{
    AlgoOptions, Algorithm, BuildCtx, CollectiveError, Layout, Schedule, Step, UniformSizes,
};
use halo_topology::{Rank, Topology};
use std::time::Duration;

/// Most candidates measured per size class.
pub const MAX_CANDIDATES: usize = 4;

/// How much faster (a fraction of its time) a later candidate must measure than an
/// earlier one to be chosen over it: 5%. The trials of small calls are noisy, and the
/// candidates come in the model's order, so a near-tie goes to the model's choice.
pub const MARGIN: f64 = 0.05;

/// Timed calls per candidate during the trials of large blocks (the fewest); their
/// median counts. See [`trials`].
pub const TRIALS: usize = 4;

/// Timed calls per candidate during the trials of size class `class` (of the block,
/// or of the mean block for all-to-all-v; [`crate::select::size_class`]): 8 below 64
/// KiB, [`TRIALS`] above, half in each pass. Small calls take a few microseconds, and
/// two of them on a shared or oversubscribed machine differ by more than the candidates
/// do; their trials cost little however many they are. (With 4 and 2, the emulated
/// main job chose a candidate 10-13% slower than the best in one size class of 17 in
/// each of three runs.)
pub const fn trials(class: u32) -> usize {
    if class <= 16 { 2 * TRIALS } else { TRIALS }
}

/// Untimed calls at the start of each block of a candidate's trial calls (see the
/// module's documentation): 2 up to 64 KiB, 1 above, where a call costs as much as the
/// transition and takes long enough for it to matter less.
pub const fn lead_calls(class: u32) -> usize {
    if class <= 16 { 2 } else { 1 }
}

/// Passes over the candidates during the trials: the model's order, then the reverse.
const PASSES: usize = 2;

/// All trial calls of size class `class` with `candidates` candidates (none with one
/// candidate: there is nothing to measure).
pub const fn trial_calls(class: u32, candidates: usize) -> usize {
    if candidates < 2 {
        return 0;
    }
    PASSES * candidates * (lead_calls(class) + trials(class) / PASSES)
}

/// What trial call `call` (from 0) of size class `class` does among `candidates`
/// candidates: the index of the candidate it runs and whether it is timed; `None` once
/// the trials are over.
///
/// ```
/// use halo::tune::{trial_call, trial_calls};
/// // 64 KiB blocks (class 17), two candidates: one untimed call, then two timed calls
/// // of each, in the order 0, 1 and then 1, 0.
/// let plan: Vec<_> = (0..trial_calls(17, 2)).map(|c| trial_call(17, 2, c).unwrap()).collect();
/// let (lead, timed) = ((0, false), (0, true));
/// let (lead1, timed1) = ((1, false), (1, true));
/// assert_eq!(
///     plan,
///     [lead, timed, timed, lead1, timed1, timed1, lead1, timed1, timed1, lead, timed, timed]
/// );
/// assert_eq!(trial_call(17, 2, 12), None);
/// ```
pub fn trial_call(class: u32, candidates: usize, call: usize) -> Option<(usize, bool)> {
    if call >= trial_calls(class, candidates) {
        return None;
    }
    let lead = lead_calls(class);
    let block = lead + trials(class) / PASSES;
    let (pass, in_pass) = (call / (block * candidates), call % (block * candidates));
    let k = in_pass / block;
    let candidate = if pass % 2 == 0 { k } else { candidates - 1 - k };
    Some((candidate, in_pass % block >= lead))
}

impl Key {
    /// The size class the key is for.
    fn class(self) -> u32 {
        match self {
            Key::Uniform(c) | Key::V { class: c, .. } => c,
        }
    }
}

/// Calls of a size class after which its trials run again.
pub const RETRY_CALLS: u64 = 4096;

/// What a tuner state is kept for: a kind of call and a size class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Key {
    /// Uniform all-to-all of blocks in this size class.
    Uniform(u32),
    /// All-to-all-v data pass whose mean block is in size class `class`; `meta` is the
    /// algorithm of the uniform metadata pass (three passes), `None` after an
    /// all-gather of the counts.
    V {
        /// The size class of the mean block.
        class: u32,
        /// The metadata pass's algorithm, if the counts went through one.
        meta: Option<Algorithm>,
    },
}

/// One size class's state.
#[derive(Debug, Clone)]
enum State {
    /// Trial calls in progress: `done` calls made so far (in the order of
    /// [`trial_call`]), `seen[i]` the local times of candidate `i`'s timed calls in
    /// nanoseconds.
    Trying {
        candidates: Vec<Algorithm>,
        done: usize,
        seen: Vec<Vec<u64>>,
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
    /// Every candidate with its agreed time (the mean over the ranks of each rank's
    /// median timed trial call), in nanoseconds, in candidate order; empty when there
    /// was one candidate.
    pub times: Vec<(Algorithm, u64)>,
}

/// A communicator's measured-selection state, per size class.
#[derive(Debug, Default)]
pub(crate) struct Tuner {
    /// Per key, in the order first seen: a communicator uses a few dozen classes at
    /// most, and a scan of them costs less than hashing a key (this lookup is the whole
    /// per-call cost of a decided class).
    classes: Vec<(Key, State)>,
}

impl Tuner {
    /// The algorithm the next call of `class` runs, and whether that call is a trial
    /// (to be timed and passed to [`Tuner::record`]). `candidates` is asked only when
    /// the class has no state yet (it must give every rank the same list, not empty).
    /// A decided class counts the call here; after [`RETRY_CALLS`] of them its trials
    /// start again.
    pub(crate) fn pick(
        &mut self,
        class: Key,
        candidates: impl FnOnce() -> Vec<Algorithm>,
    ) -> Option<(Algorithm, bool)> {
        let at = match self.find(class) {
            Some(i) => i,
            None => {
                let c = candidates();
                if c.is_empty() {
                    return None;
                }
                self.classes.push((class, start(c)));
                self.classes.len() - 1
            }
        };
        let state = &mut self.classes[at].1;
        match state {
            State::Trying {
                candidates, done, ..
            } => {
                match trial_call(class.class(), candidates.len(), *done) {
                    Some((i, _)) => Some((candidates[i], true)),
                    None => {
                        // The agreement after the last trial did not happen (an
                        // error): try again.
                        *state = start(candidates.clone());
                        self.pick(class, Vec::new)
                    }
                }
            }
            State::Decided {
                candidates,
                algorithm,
                calls,
                ..
            } => {
                let a = *algorithm;
                *calls += 1;
                if *calls >= RETRY_CALLS {
                    *state = start(candidates.clone());
                }
                Some((a, false))
            }
        }
    }

    /// Records that a trial call of `class` with `algorithm` took `elapsed` on this
    /// rank (every trial call, timed by [`trial_call`] or not: the untimed ones only
    /// count). Returns this rank's times per candidate when the trials are complete:
    /// the caller must then all-reduce them (sum) on every rank, divide them by the
    /// ranks and pass the result to [`Tuner::agree`].
    pub(crate) fn record(
        &mut self,
        class: Key,
        algorithm: Algorithm,
        elapsed: Duration,
    ) -> Option<Vec<u64>> {
        let State::Trying {
            candidates,
            done,
            seen,
        } = self.get_mut(class)?
        else {
            return None;
        };
        let (i, timed) = trial_call(class.class(), candidates.len(), *done)?;
        if candidates[i] != algorithm {
            return None;
        }
        if timed {
            seen[i].push(u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX));
        }
        *done += 1;
        (*done == trial_calls(class.class(), candidates.len()))
            .then(|| seen.iter_mut().map(|t| median(t)).collect())
    }

    /// Decides `class` from the times agreed after its trials (the mean over the ranks
    /// of their medians).
    pub(crate) fn agree(&mut self, class: Key, times: &[u64]) -> Option<Algorithm> {
        let State::Trying { candidates, .. } = self.get(class)? else {
            return None;
        };
        if times.len() != candidates.len() {
            return None;
        }
        let candidates = candidates.clone();
        let mut at = 0;
        for (i, &t) in times.iter().enumerate() {
            if (t as f64) < times[at] as f64 * (1.0 - MARGIN) {
                at = i;
            }
        }
        let algorithm = candidates[at];
        tracing::debug!(
            ?class,
            %algorithm,
            times_ns = ?candidates.iter().zip(times).collect::<Vec<_>>(),
            "measured all-to-all candidates"
        );
        *self.get_mut(class)? = State::Decided {
            candidates,
            algorithm,
            times: times.to_vec(),
            calls: 0,
        };
        Some(algorithm)
    }

    fn find(&self, class: Key) -> Option<usize> {
        self.classes.iter().position(|(k, _)| *k == class)
    }

    fn get(&self, class: Key) -> Option<&State> {
        self.classes
            .iter()
            .find(|(k, _)| *k == class)
            .map(|(_, s)| s)
    }

    fn get_mut(&mut self, class: Key) -> Option<&mut State> {
        self.classes
            .iter_mut()
            .find(|(k, _)| *k == class)
            .map(|(_, s)| s)
    }

    /// What was decided for `class`, if anything.
    pub(crate) fn tuned(&self, class: Key) -> Option<Tuned> {
        tuned(self.get(class)?)
    }

    /// What was decided for all-to-all-v calls whose mean block is in size class
    /// `class`, whatever the count exchange (a communicator uses one).
    pub(crate) fn tuned_v(&self, class: u32) -> Option<Tuned> {
        self.classes
            .iter()
            .filter(|(k, _)| matches!(k, Key::V { class: c, .. } if *c == class))
            .find_map(|(_, s)| tuned(s))
    }

    /// Forgets `class` (its candidates changed: one of them did not build).
    pub(crate) fn forget(&mut self, class: Key) {
        self.classes.retain(|(k, _)| *k != class);
    }

    /// Forgets everything (the builder options changed).
    pub(crate) fn reset(&mut self) {
        self.classes.clear();
    }
}

/// What a decided state says; `None` during trials.
fn tuned(state: &State) -> Option<Tuned> {
    match state {
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
        seen: vec![Vec::new(); candidates.len()],
        candidates,
        done: 0,
    }
}

/// The median of `t` (the lower of the two middle values for an even count; 0 for
/// none): a candidate's typical call, where the fastest would reward one lucky turn of
/// the scheduler (ranks outnumbering cores make a microsecond call's time vary 2-10x).
fn median(t: &mut [u64]) -> u64 {
    if t.is_empty() {
        return 0;
    }
    t.sort_unstable();
    t[(t.len() - 1) / 2]
}

/// The candidates for a uniform all-to-all of `block` bytes: the ranking's algorithms
/// that `keep` accepts and that build, cheapest first, without those whose programs are
/// the same as an earlier candidate's (tags aside), at most [`MAX_CANDIDATES`]. For
/// all-to-all-v `block` is the mean block and `keep` excludes the forwarding algorithms
/// the count exchange did not prepare for. Both tests look at the programs
/// of the first and the last rank only — never at the calling rank's — so every rank
/// computes the same list (as [`crate::select::buildable`] does). `ranked` is the
/// model's order for the class (the policy's, `src/policy.rs`); algorithms that do not
/// build are passed to `unavailable`.
pub(crate) fn candidates(
    ranked: Vec<Algorithm>,
    topology: &Topology,
    options: &AlgoOptions,
    block: usize,
    keep: impl Fn(Algorithm) -> bool,
    mut unavailable: impl FnMut(Algorithm, &CollectiveError),
) -> Vec<Algorithm> {
    let sizes = UniformSizes(block);
    let probes: Vec<Rank> = {
        let last = topology.size().saturating_sub(1);
        if last == 0 { vec![0] } else { vec![0, last] }
    };
    let mut out = Vec::new();
    let mut programs: Vec<Vec<Schedule>> = Vec::new();
    for a in ranked {
        if !keep(a) {
            continue;
        }
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
            Err(e) => unavailable(a, &e),
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

    /// Runs every trial call of `key` through `pick` and `record`, each taking
    /// `took(call, algorithm)`; returns the algorithms in call order and what the last
    /// `record` returned (this rank's medians).
    fn run_trials(
        t: &mut Tuner,
        key: Key,
        c: &[Algorithm],
        took: impl Fn(usize, Algorithm) -> Duration,
    ) -> (Vec<Algorithm>, Option<Vec<u64>>) {
        let (mut ran, mut out) = (Vec::new(), None);
        for call in 0..trial_calls(key.class(), c.len()) {
            let (a, trial) = t.pick(key, || c.to_vec()).unwrap();
            assert!(trial, "call {call} is a trial");
            assert!(t.tuned(key).is_none());
            ran.push(a);
            out = t.record(key, a, took(call, a));
            assert_eq!(out.is_some(), call + 1 == trial_calls(key.class(), c.len()));
        }
        (ran, out)
    }

    #[test]
    fn trials_run_in_blocks_with_lead_in_calls_in_two_passes() {
        // Class 5: 2 untimed + 4 timed calls per candidate and pass.
        let plan: Vec<_> = (0..trial_calls(5, 3))
            .map(|c| trial_call(5, 3, c).unwrap())
            .collect();
        assert_eq!(plan.len(), 2 * 3 * (2 + 4));
        let order: Vec<usize> = plan.chunks(6).map(|b| b[0].0).collect();
        assert_eq!(order, [0, 1, 2, 2, 1, 0]);
        for b in plan.chunks(6) {
            assert!(b.iter().all(|p| p.0 == b[0].0));
            let timed: Vec<bool> = b.iter().map(|p| p.1).collect();
            assert_eq!(timed, [false, false, true, true, true, true]);
        }
        assert_eq!(trial_call(5, 3, plan.len()), None);
        // Large blocks: one lead-in call, [`TRIALS`] timed calls in all.
        assert_eq!(trial_calls(20, 4), 2 * 4 * (1 + TRIALS / 2));
        assert_eq!(trial_calls(20, 1), 0);
        assert_eq!(trial_call(20, 1, 0), None);
    }

    #[test]
    fn lead_in_calls_do_not_count_and_the_smallest_time_is_agreed() {
        let mut t = Tuner::default();
        let c = vec![Algorithm::Flat, Algorithm::Halo, Algorithm::Bruck];
        let key = Key::Uniform(5);
        // Lead-in calls take 1 s: if they counted, they would decide.
        let (ran, out) = run_trials(&mut t, key, &c, |call, a| match trial_call(5, 3, call) {
            Some((_, false)) => ms(1000),
            _ => match a {
                Algorithm::Flat => ms(30),
                Algorithm::Halo => ms(10 + call as u64),
                _ => ms(20),
            },
        });
        assert_eq!(&ran[..2], &[Algorithm::Flat, Algorithm::Flat]);
        assert_eq!(ran[6], Algorithm::Halo);
        // HALO's blocks are calls 6-11 and 24-29, timed from the third call: 18-21
        // and 36-39 ms; the lower middle of the eight is 21 ms.
        assert_eq!(out.unwrap(), vec![30_000_000, 21_000_000, 20_000_000]);
        // Another rank was slower with HALO: the agreed (mean) times decide.
        let agreed = vec![30_000_000, 25_000_000, 20_000_000];
        assert_eq!(t.agree(key, &agreed), Some(Algorithm::Bruck));
        assert_eq!(t.pick(key, Vec::new), Some((Algorithm::Bruck, false)));
        let tuned = t.tuned(key).unwrap();
        assert_eq!(tuned.algorithm, Algorithm::Bruck);
        assert_eq!(tuned.times[1], (Algorithm::Halo, 25_000_000));
    }

    #[test]
    fn a_call_of_the_wrong_algorithm_is_not_recorded() {
        let mut t = Tuner::default();
        let c = vec![Algorithm::Flat, Algorithm::Halo];
        let key = Key::Uniform(3);
        assert_eq!(t.pick(key, || c.clone()), Some((Algorithm::Flat, true)));
        assert!(t.record(key, Algorithm::Halo, ms(1)).is_none());
        // Still the first call.
        assert_eq!(t.pick(key, Vec::new), Some((Algorithm::Flat, true)));
    }

    #[test]
    fn ties_go_to_the_earlier_candidate_and_one_candidate_needs_no_trial() {
        let mut t = Tuner::default();
        let c = vec![Algorithm::Halo, Algorithm::Flat];
        run_trials(&mut t, Key::Uniform(1), &c, |_, _| ms(1));
        assert_eq!(t.agree(Key::Uniform(1), &[7, 7]), Some(Algorithm::Halo));
        assert_eq!(
            t.pick(Key::Uniform(2), || vec![Algorithm::Pairwise])
                .map(|p| p.0),
            Some(Algorithm::Pairwise)
        );
        assert!(
            t.record(Key::Uniform(2), Algorithm::Pairwise, ms(1))
                .is_none()
        );
        assert_eq!(
            t.tuned(Key::Uniform(2)).unwrap().algorithm,
            Algorithm::Pairwise
        );
        assert_eq!(t.pick(Key::Uniform(3), Vec::new), None);
    }

    #[test]
    fn a_decision_is_retried_after_retry_calls() {
        let mut t = Tuner::default();
        let c = vec![Algorithm::Flat, Algorithm::Halo];
        run_trials(&mut t, Key::Uniform(9), &c, |_, _| ms(1));
        t.agree(Key::Uniform(9), &[1, 2]);
        for _ in 0..RETRY_CALLS {
            // Decided calls are no trials: the caller neither times nor records them.
            let a = t.pick(Key::Uniform(9), Vec::new).unwrap();
            assert_eq!(a, (Algorithm::Flat, false));
        }
        assert!(t.tuned(Key::Uniform(9)).is_none(), "trials start again");
        let (ran, _) = run_trials(&mut t, Key::Uniform(9), &c, |_, _| ms(1));
        assert_eq!(ran.len(), trial_calls(9, 2));
        assert_eq!(ran[lead_calls(9) + trials(9) / 2], Algorithm::Halo);
    }

    #[test]
    fn small_classes_take_more_trials_and_a_decided_call_is_no_trial() {
        assert_eq!((trials(0), trials(12), trials(16)), (8, 8, 8));
        assert_eq!((trials(17), trials(30)), (TRIALS, TRIALS));
        assert_eq!((lead_calls(16), lead_calls(17)), (2, 1));
        let mut t = Tuner::default();
        let c = vec![Algorithm::Flat, Algorithm::Halo];
        let key = Key::V {
            class: 14,
            meta: None,
        };
        let (ran, _) = run_trials(&mut t, key, &c, |_, _| ms(1));
        assert_eq!(ran.len(), 2 * 2 * (2 + 4));
        t.agree(key, &[3, 2]);
        assert_eq!(t.pick(key, Vec::new), Some((Algorithm::Halo, false)));
        assert!(t.record(key, Algorithm::Halo, ms(1)).is_none());
    }

    #[test]
    fn a_later_candidate_must_be_clearly_faster() {
        for (times, want) in [
            ([100u64, 96], Algorithm::Flat),
            ([100, 94], Algorithm::Halo),
            ([100, 100], Algorithm::Flat),
        ] {
            let mut t = Tuner::default();
            let c = vec![Algorithm::Flat, Algorithm::Halo];
            run_trials(&mut t, Key::Uniform(20), &c, |_, _| ms(1));
            assert_eq!(t.agree(Key::Uniform(20), &times), Some(want), "{times:?}");
        }
        assert_eq!(median(&mut [5, 1, 3]), 3);
        assert_eq!(median(&mut [4, 1, 3, 2]), 2);
        assert_eq!(median(&mut []), 0);
    }

    #[test]
    fn a_missed_agreement_restarts_the_trials() {
        let mut t = Tuner::default();
        let c = vec![Algorithm::Flat, Algorithm::Halo];
        run_trials(&mut t, Key::Uniform(4), &c, |_, _| ms(1));
        // No agree(): the next pick starts over, from the first call of the plan.
        let (ran, out) = run_trials(&mut t, Key::Uniform(4), &c, |_, _| ms(1));
        assert_eq!(ran.len(), trial_calls(4, 2));
        assert_eq!(out.map(|o| o.len()), Some(2));
        assert!(
            t.agree(Key::Uniform(4), &[1]).is_none(),
            "wrong length is refused"
        );
    }

    #[test]
    fn uniform_and_v_classes_are_kept_apart() {
        let mut t = Tuner::default();
        let c = vec![Algorithm::Flat, Algorithm::Halo];
        let v = Key::V {
            class: 7,
            meta: None,
        };
        let v3 = Key::V {
            class: 7,
            meta: Some(Algorithm::Bruck),
        };
        run_trials(&mut t, Key::Uniform(7), &c, |_, _| ms(1));
        assert_eq!(t.agree(Key::Uniform(7), &[5, 1]), Some(Algorithm::Halo));
        // The v class of the same size starts its own trials, from its own candidates.
        assert!(t.tuned_v(7).is_none());
        let vc = [Algorithm::Pairwise, Algorithm::Flat];
        let (ran, local) = run_trials(&mut t, v, &vc, |call, a| {
            ms(call as u64 % 7 + if a == Algorithm::Pairwise { 3 } else { 0 })
        });
        assert_eq!(ran[0], Algorithm::Pairwise);
        // Pairwise is timed on calls 2-5 and 20-23 (5, 6, 7, 8 and 9, 3, 4, 5 ms), flat
        // on 8-11 and 14-17 (1, 2, 3, 4 and 0, 1, 2, 3 ms): lower middles 5 and 2 ms.
        assert_eq!(local, Some(vec![5_000_000, 2_000_000]));
        assert_eq!(t.agree(v, &[9, 4]), Some(Algorithm::Flat));
        assert_eq!(t.tuned_v(7).unwrap().algorithm, Algorithm::Flat);
        assert!(t.tuned_v(6).is_none());
        assert_eq!(t.tuned(Key::Uniform(7)).unwrap().algorithm, Algorithm::Halo);
        // After a metadata pass the key differs again.
        assert!(t.tuned(v3).is_none());
        // Forgetting a key restarts it from fresh candidates.
        t.forget(v);
        assert!(t.tuned_v(7).is_none());
        assert_eq!(
            t.pick(v, || vec![Algorithm::Bruck]).map(|p| p.0),
            Some(Algorithm::Bruck)
        );
    }
}
