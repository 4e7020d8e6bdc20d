//! Pass 5 (for the device path): the grouped program is sound.
//!
//! For schedules that passed [`super::verify`], and their waves
//! ([`crate::group_waves`]), it proves:
//! 1. **no step shares a wave with a step it depends on**: every dependency sits in an
//!    earlier wave, so stream order (wave `k` starts after wave `k - 1` ended) runs it
//!    before its dependants;
//! 2. **order matching is tag matching**: NCCL matches the messages of one pair of
//!    ranks in the order they are issued, not by tag; the sequence of tags rank `a`
//!    issues to `b` (wave by wave, in each wave's issue order) equals the sequence
//!    `b` issues receives for from `a`, so every message meets the receive the verifier
//!    matched it with (and so has its length);
//! 3. **deadlock freedom under NCCL's group semantics**: a replay in which a rank's
//!    wave starts only when its previous wave has fully completed, the messages of a
//!    started wave progress independently, a message completes only when both its
//!    ends' waves have started (rendezvous) and after the earlier messages of its pair
//!    (in order) — ends with every rank past its last wave.

use super::err;
use crate::error::VerifyError;
use crate::schedule::{Schedule, Step, StepId};
use crate::waves::Waves;
use std::collections::HashMap;

/// What the grouped program looks like, in total.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WaveReport {
    /// The most waves of any rank.
    pub max_waves: usize,
    /// Groups (waves with messages) over all ranks.
    pub groups: usize,
    /// Messages over all ranks (counted at the sender).
    pub messages: usize,
}

/// Proves the waves of verified schedules sound (see the module docs); `waves[r]` are
/// rank `r`'s.
pub fn verify_waves(schedules: &[Schedule], waves: &[Waves]) -> Result<WaveReport, VerifyError> {
    if schedules.len() != waves.len() {
        return Err(err(
            0,
            None,
            None,
            format!(
                "{} schedules but {} wave lists",
                schedules.len(),
                waves.len()
            ),
        ));
    }
    let n = schedules.len();
    let mut report = WaveReport::default();
    // 1. Dependencies in earlier waves; every step in exactly the wave it is said to be in.
    for (r, (s, w)) in schedules.iter().zip(waves).enumerate() {
        let mut seen = vec![false; s.len()];
        for (k, wave) in w.waves().iter().enumerate() {
            for &id in wave.copies.iter().chain(&wave.messages) {
                let i = id as usize;
                if i >= s.len() || seen[i] || w.wave_of(id) != k {
                    return Err(err(
                        r,
                        Some(id),
                        None,
                        format!("step {id} is misplaced in wave {k}"),
                    ));
                }
                seen[i] = true;
                let is_copy = matches!(s.steps()[i], Step::Copy { .. });
                if is_copy != wave.copies.contains(&id) {
                    return Err(err(
                        r,
                        Some(id),
                        None,
                        format!(
                            "wave {k}: a copy among the messages or a message among the copies"
                        ),
                    ));
                }
                for &d in s.deps(id) {
                    if w.wave_of(d) >= k {
                        return Err(err(
                            r,
                            Some(id),
                            None,
                            format!(
                                "{} in wave {k} depends on step {d} ({}) in wave {}: a step shares or precedes the group of a step it depends on",
                                s.steps()[i],
                                s.steps()[d as usize],
                                w.wave_of(d)
                            ),
                        ));
                    }
                }
            }
            if !wave.messages.is_empty() {
                report.groups += 1;
            }
        }
        if let Some(i) = seen.iter().position(|&x| !x) {
            return Err(err(r, Some(i as StepId), None, "step in no wave"));
        }
        report.max_waves = report.max_waves.max(w.len());
    }

    // 2. Issue order per pair: (src, dst) -> the sends' (step, tag) and the receives'.
    type Seq = Vec<(StepId, u64)>;
    let mut sends: HashMap<(usize, usize), Seq> = HashMap::new();
    let mut recvs: HashMap<(usize, usize), Seq> = HashMap::new();
    for (r, (s, w)) in schedules.iter().zip(waves).enumerate() {
        for wave in w.waves() {
            for &id in &wave.messages {
                match s.steps()[id as usize] {
                    Step::Send { peer, tag, .. } => {
                        sends.entry((r, peer as usize)).or_default().push((id, tag));
                        report.messages += 1;
                    }
                    Step::Recv { peer, tag, .. } => {
                        recvs.entry((peer as usize, r)).or_default().push((id, tag))
                    }
                    Step::Copy { .. } => {}
                }
            }
        }
    }
    let empty = Seq::new();
    let mut pairs: Vec<(usize, usize)> = sends.keys().chain(recvs.keys()).copied().collect();
    pairs.sort_unstable();
    pairs.dedup();
    for &(a, b) in &pairs {
        let (ss, rr) = (
            sends.get(&(a, b)).unwrap_or(&empty),
            recvs.get(&(a, b)).unwrap_or(&empty),
        );
        for i in 0..ss.len().max(rr.len()) {
            let (st, rt) = (ss.get(i).map(|x| x.1), rr.get(i).map(|x| x.1));
            if st != rt {
                let fmt =
                    |t: Option<u64>| t.map_or("nothing".to_string(), |t| format!("tag {t:#x}"));
                return Err(err(
                    a,
                    ss.get(i).map(|x| x.0),
                    None,
                    format!(
                        "order matching differs from tag matching: message {i} from rank {a} to rank {b} is {} on the sender but {} on the receiver",
                        fmt(st),
                        fmt(rt)
                    ),
                ));
            }
        }
    }

    // 3. The group replay.
    let mut cur = vec![0usize; n];
    let mut left = vec![0usize; n];
    let start = |r: usize, k: usize| waves[r].waves()[k].messages.len();
    for r in 0..n {
        while cur[r] < waves[r].len() && start(r, cur[r]) == 0 {
            cur[r] += 1;
        }
        if cur[r] < waves[r].len() {
            left[r] = start(r, cur[r]);
        }
    }
    let mut head: HashMap<(usize, usize), usize> = pairs.iter().map(|&p| (p, 0)).collect();
    loop {
        let mut progress = false;
        for &(a, b) in &pairs {
            let ss = sends.get(&(a, b)).unwrap_or(&empty);
            let rr = recvs.get(&(a, b)).unwrap_or(&empty);
            let h = head.get_mut(&(a, b)).expect("every pair has a head");
            while *h < ss.len() {
                let (sa, sb) = (ss[*h].0, rr[*h].0);
                let (wa, wb) = (waves[a].wave_of(sa), waves[b].wave_of(sb));
                if cur[a] != wa || cur[b] != wb {
                    break;
                }
                *h += 1;
                left[a] -= 1;
                left[b] -= 1;
                progress = true;
            }
        }
        for r in 0..n {
            while cur[r] < waves[r].len() && left[r] == 0 {
                cur[r] += 1;
                if cur[r] < waves[r].len() {
                    left[r] = start(r, cur[r]);
                }
                progress = true;
            }
        }
        if !progress {
            break;
        }
    }
    for r in 0..n {
        if cur[r] < waves[r].len() {
            let k = cur[r];
            let s = &schedules[r];
            // Name a message of the stuck wave that has not completed, and where its
            // partner is.
            for &(a, b) in &pairs {
                let h = head[&(a, b)];
                let (ss, rr) = (
                    sends.get(&(a, b)).unwrap_or(&empty),
                    recvs.get(&(a, b)).unwrap_or(&empty),
                );
                if h >= ss.len() {
                    continue;
                }
                let (mine, other, other_step) = if a == r && waves[a].wave_of(ss[h].0) == k {
                    (ss[h].0, b, rr[h].0)
                } else if b == r && waves[b].wave_of(rr[h].0) == k {
                    (rr[h].0, a, ss[h].0)
                } else {
                    continue;
                };
                return Err(err(
                    r,
                    Some(mine),
                    None,
                    format!(
                        "deadlock under group semantics: wave {k}'s {} waits for rank {other}'s step {other_step} in its wave {}, but rank {other} is stuck in wave {}",
                        s.steps()[mine as usize],
                        waves[other].wave_of(other_step),
                        cur[other]
                    ),
                ));
            }
            return Err(err(
                r,
                None,
                None,
                format!("deadlock under group semantics in wave {k}"),
            ));
        }
    }
    Ok(report)
}
