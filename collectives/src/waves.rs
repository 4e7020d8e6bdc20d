//! Waves: a schedule run as a sequence of groups, the way NCCL / RCCL run point-to-point.
//!
//! NCCL has no tags and no completion events per message: a program issues `ncclSend` /
//! `ncclRecv` between `ncclGroupStart` and `ncclGroupEnd`, and the group runs on a
//! stream as one unit — its operations progress together, the next thing on the stream
//! starts when all of them are done, and messages between one pair of ranks match in
//! the order they were issued. So a schedule runs on a device as **waves**
//! ([`group_waves`]): a step goes in the first wave after the waves of all the steps it
//! depends on (wave 0 when it depends on nothing), a message's dependencies being those
//! of both its ends — so a send and its receive share a wave index on both ranks. Wave `k` is its copies (async
//! device copies) followed by one group of its sends and receives, issued per peer in
//! tag order; everything is stream-ordered, so wave `k` starts once wave `k - 1` is done.
//!
//! That this is sound for a set of schedules — no step shares a wave with a step it
//! depends on, the order in which each pair's messages are issued matches them exactly
//! as their tags do, and the grouped program cannot deadlock under NCCL's group
//! semantics — is what [`crate::verify_waves`] proves; `collectives/tests/waves_prop.rs`
//! runs it for every algorithm.
//!
//! [`execute_waves`] is the executor over any [`WaveBackend`]: `halo`'s device backend
//! (NCCL groups and async copies on the stream) and [`SessionWaves`], the CPU twin over
//! a host [`Session`], which runs the same waves — copies, then the wave's messages
//! posted together and waited for together — so that grouping, ordering and byte
//! placement are tested byte-exact on machines without a GPU.

use crate::error::{CollectiveError, Result};
use crate::execute::{ExecOptions, Session};
use crate::schedule::{Region, Schedule, Step, StepId};
use std::sync::atomic::Ordering;
use std::time::Instant;

/// One wave: its copies, then its messages (issued in this order).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Wave {
    /// Copy steps, in program order.
    pub copies: Vec<StepId>,
    /// Send and receive steps, ordered by (peer, receives after sends, tag): the order
    /// they are issued in, so each pair's messages are issued in tag order.
    pub messages: Vec<StepId>,
}

/// A schedule's waves, in order; every step is in exactly one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Waves {
    waves: Vec<Wave>,
    of_step: Vec<u32>,
}

impl Waves {
    /// The waves, in order.
    pub fn waves(&self) -> &[Wave] {
        &self.waves
    }

    /// Number of waves.
    pub fn len(&self) -> usize {
        self.waves.len()
    }

    /// Whether there is no wave (an empty schedule).
    pub fn is_empty(&self) -> bool {
        self.waves.is_empty()
    }

    /// The wave of `step`.
    pub fn wave_of(&self, step: StepId) -> usize {
        self.of_step[step as usize] as usize
    }
}

impl Waves {
    /// Waves from a wave index per step (`of_step[s]`), messages in issue order. Any
    /// assignment can be made; [`crate::verify_waves`] says whether it is sound.
    pub fn from_assignment(schedule: &Schedule, of_step: Vec<u32>) -> Self {
        assert_eq!(of_step.len(), schedule.len(), "one wave per step");
        let count = of_step.iter().map(|&w| w as usize + 1).max().unwrap_or(0);
        let mut waves = vec![Wave::default(); count];
        for (s, step) in schedule.steps().iter().enumerate() {
            let w = &mut waves[of_step[s] as usize];
            match step {
                Step::Copy { .. } => w.copies.push(s as StepId),
                _ => w.messages.push(s as StepId),
            }
        }
        for w in &mut waves {
            w.messages
                .sort_by_key(|&s| message_key(&schedule.steps()[s as usize]));
        }
        Waves { waves, of_step }
    }
}

/// Groups every rank's schedule into waves: each step goes in the first wave after
/// the waves of all its dependencies, where a message's dependencies are those of
/// *both* its ends (a send and its receive sit in one group, as NCCL runs them: the
/// matched pair is one node, as in the verifier's replay). Both ends of every message
/// then share a wave index, so wave `k` of every rank can run once every rank's
/// earlier waves ran — which [`crate::verify_waves`] checks independently.
///
/// A rank needs every rank's schedule for this (the uniform all-to-all builds them all;
/// the all-to-all-v needs the whole count matrix): O(total steps).
///
/// # Errors
/// [`CollectiveError::Internal`] for a message without its partner or schedules that
/// cannot complete (both are verifier errors: verify first).
pub fn group_waves(schedules: &[Schedule]) -> Result<Vec<Waves>> {
    use std::collections::HashMap;
    let n = schedules.len();
    let mut recv_of: HashMap<(u32, u32, u64), (usize, StepId)> = HashMap::new();
    for (q, s) in schedules.iter().enumerate() {
        for (t, step) in s.steps().iter().enumerate() {
            if let Step::Recv { peer, tag, .. } = *step {
                recv_of.insert((peer, q as u32, tag), (q, t as StepId));
            }
        }
    }
    // partner[r][s]: the other end of a message.
    let mut partner: Vec<Vec<Option<(usize, StepId)>>> =
        schedules.iter().map(|s| vec![None; s.len()]).collect();
    for (r, s) in schedules.iter().enumerate() {
        for (i, step) in s.steps().iter().enumerate() {
            if let Step::Send { peer, tag, .. } = *step {
                let Some(&(q, t)) = recv_of.get(&(r as u32, peer, tag)) else {
                    return Err(CollectiveError::Internal(format!(
                        "rank {r} step {i} ({step}) has no matching receive"
                    )));
                };
                partner[r][i] = Some((q, t));
                partner[q][t as usize] = Some((r, i as StepId));
            }
        }
    }
    for (r, s) in schedules.iter().enumerate() {
        for (i, step) in s.steps().iter().enumerate() {
            if matches!(step, Step::Recv { .. }) && partner[r][i].is_none() {
                return Err(CollectiveError::Internal(format!(
                    "rank {r} step {i} ({step}) has no matching send"
                )));
            }
        }
    }
    let dependants: Vec<(Vec<u32>, Vec<StepId>)> =
        schedules.iter().map(|s| s.dependants()).collect();
    let mut waiting: Vec<Vec<u32>> = schedules
        .iter()
        .map(|s| {
            (0..s.len())
                .map(|i| s.deps(i as StepId).len() as u32)
                .collect()
        })
        .collect();
    // The lowest wave each step may take (max over finished dependencies + 1).
    let mut floor: Vec<Vec<u32>> = schedules.iter().map(|s| vec![0; s.len()]).collect();
    let mut wave: Vec<Vec<u32>> = schedules.iter().map(|s| vec![u32::MAX; s.len()]).collect();
    let mut queue: Vec<(usize, StepId)> = Vec::new();
    let ready = |waiting: &Vec<Vec<u32>>, r: usize, s: StepId| -> bool {
        waiting[r][s as usize] == 0
            && partner[r][s as usize].is_none_or(|(q, t)| waiting[q][t as usize] == 0)
    };
    for (r, s) in schedules.iter().enumerate() {
        for i in 0..s.len() as StepId {
            // Queue a pair once, by its send; a copy by itself.
            let by_me = !matches!(s.steps()[i as usize], Step::Recv { .. });
            if by_me && ready(&waiting, r, i) {
                queue.push((r, i));
            }
        }
    }
    let mut done = 0usize;
    let total: usize = schedules.iter().map(|s| s.len()).sum();
    while let Some((r, s)) = queue.pop() {
        let mut ends = vec![(r, s)];
        if let Some(p) = partner[r][s as usize] {
            ends.push(p);
        }
        let w = ends
            .iter()
            .map(|&(a, b)| floor[a][b as usize])
            .max()
            .unwrap_or(0);
        for &(a, b) in &ends {
            wave[a][b as usize] = w;
            done += 1;
        }
        for &(a, b) in &ends {
            let (start, deps) = &dependants[a];
            for &d in &deps[start[b as usize] as usize..start[b as usize + 1] as usize] {
                let du = d as usize;
                waiting[a][du] -= 1;
                floor[a][du] = floor[a][du].max(w + 1);
                if waiting[a][du] == 0 {
                    // Queue the pair by its send (or the copy) once both ends are free.
                    let (qa, qb) = match (schedules[a].steps()[du], partner[a][du]) {
                        (Step::Recv { .. }, Some(p)) => p,
                        _ => (a, d),
                    };
                    if ready(&waiting, qa, qb) {
                        queue.push((qa, qb));
                    }
                }
            }
        }
    }
    if done < total {
        return Err(CollectiveError::Internal(format!(
            "{} of {total} steps cannot be grouped: the schedules deadlock (verify them first)",
            total - done
        )));
    }
    let _ = n;
    Ok(schedules
        .iter()
        .zip(wave)
        .map(|(s, w)| Waves::from_assignment(s, w))
        .collect())
}

/// The issue order inside a wave: (peer, receives after sends, tag).
fn message_key(step: &Step) -> (u32, bool, u64) {
    match *step {
        Step::Send { peer, tag, .. } => (peer, false, tag),
        Step::Recv { peer, tag, .. } => (peer, true, tag),
        Step::Copy { .. } => (u32::MAX, true, u64::MAX),
    }
}

/// What runs waves: a device backend (NCCL groups on a stream) or the CPU twin.
pub trait WaveBackend {
    /// Enqueues (or performs) a local copy.
    fn copy(&mut self, step: StepId, src: Region, dst: Region) -> Result<()>;

    /// Runs one wave's messages as one group, issued in the order given
    /// (`(step, step's content)`, sends and receives only). A device backend enqueues
    /// the group and returns; a host one returns when all of them completed.
    fn group(&mut self, wave: usize, messages: &[(StepId, Step)]) -> Result<()>;
}

/// Runs `schedule` wave by wave on `backend`: each wave's copies, then its group.
///
/// # Errors
/// The backend's error, with the wave named for errors without more detail.
pub fn execute_waves<B: WaveBackend + ?Sized>(
    schedule: &Schedule,
    waves: &Waves,
    backend: &mut B,
) -> Result<()> {
    let mut messages: Vec<(StepId, Step)> = Vec::new();
    for (k, wave) in waves.waves().iter().enumerate() {
        for &c in &wave.copies {
            let Step::Copy { src, dst } = schedule.steps()[c as usize] else {
                return Err(CollectiveError::Internal(format!(
                    "wave {k}: step {c} is not a copy"
                )));
            };
            backend.copy(c, src, dst)?;
        }
        messages.clear();
        messages.extend(
            wave.messages
                .iter()
                .map(|&s| (s, schedule.steps()[s as usize])),
        );
        if !messages.is_empty() {
            backend.group(k, &messages)?;
        }
    }
    Ok(())
}

/// The CPU twin: waves over a host [`Session`]. Copies happen at once; a group posts
/// all its messages and waits until every one completed (within the options'
/// timeout, promptly on abort), as a stream would before starting the next wave.
#[derive(Debug)]
pub struct SessionWaves<'o, S> {
    /// The host session.
    pub session: S,
    opts: ExecOptions<'o>,
    start: Instant,
    algorithm: &'static str,
    completed: Vec<u32>,
}

impl<'o, S: Session> SessionWaves<'o, S> {
    /// A twin over `session`; the timeout counts from now.
    pub fn new(session: S, opts: ExecOptions<'o>, algorithm: &'static str) -> Self {
        SessionWaves {
            session,
            opts,
            start: Instant::now(),
            algorithm,
            completed: Vec::new(),
        }
    }
}

impl<S: Session> WaveBackend for SessionWaves<'_, S> {
    fn copy(&mut self, _step: StepId, src: Region, dst: Region) -> Result<()> {
        self.session.copy(src, dst)
    }

    fn group(&mut self, wave: usize, messages: &[(StepId, Step)]) -> Result<()> {
        for &(s, step) in messages {
            match step {
                Step::Send { peer, tag, region } => {
                    self.session.post_send(peer as usize, tag, region, s)?
                }
                Step::Recv { peer, tag, region } => {
                    self.session.post_recv(peer as usize, tag, region, s)?
                }
                Step::Copy { .. } => {
                    return Err(CollectiveError::Internal(format!(
                        "wave {wave}: step {s} is a copy in a group"
                    )));
                }
            }
        }
        let mut pending: Vec<StepId> = messages.iter().map(|&(s, _)| s).collect();
        let mut idle = 0u32;
        while !pending.is_empty() {
            self.completed.clear();
            self.session.progress(&mut self.completed)?;
            if self.completed.is_empty() {
                if let Some(flag) = self.opts.abort
                    && flag.load(Ordering::Relaxed)
                {
                    return Err(CollectiveError::Aborted(format!(
                        "{} aborted in wave {wave} with {} messages pending",
                        self.algorithm,
                        pending.len()
                    )));
                }
                let waited = self.start.elapsed();
                if waited >= self.opts.timeout {
                    let s = pending[0];
                    let step = messages
                        .iter()
                        .find(|m| m.0 == s)
                        .map(|m| m.1)
                        .expect("pending steps are in the group");
                    let peer = match step {
                        Step::Send { peer, .. } | Step::Recv { peer, .. } => Some(peer as usize),
                        Step::Copy { .. } => None,
                    };
                    return Err(CollectiveError::Timeout {
                        algorithm: self.algorithm,
                        step: s,
                        peer,
                        what: format!("wave {wave}: {step}"),
                        waited,
                    });
                }
                idle = idle.saturating_add(1);
                if idle > self.opts.spin {
                    let max = std::time::Duration::from_micros(u64::from(
                        (idle - self.opts.spin).min(1000),
                    ));
                    self.session
                        .wait(max.min(self.opts.timeout.saturating_sub(waited)))?;
                }
                continue;
            }
            idle = 0;
            for &t in &self.completed {
                let Some(i) = pending.iter().position(|&p| p == t) else {
                    return Err(CollectiveError::Internal(format!(
                        "wave {wave}: step {t} completed but was not pending"
                    )));
                };
                pending.swap_remove(i);
            }
        }
        Ok(())
    }
}
