//! Waiting, on a session's side: when nothing completes, spinning, then yielding the
//! processor, then sleeping on this rank's bell (the transport's
//! [`WaitPolicy`](crate::host::wait::WaitPolicy); marked asleep, one more look at the
//! rings, the futex; `shm/segment/bell.rs`, `crate::host::futex`); and, every
//! `WATCH_EVERY`, looking at the processes of the peers an outstanding operation needs.

use super::{CResult, Dest, Partial, ShmSession};
use crate::host::proc::has_ended;
use crate::host::wait::Step;
use halo_collectives::CollectiveError;
use std::time::{Duration, Instant};

/// How often, while waiting, the processes of the peers waited for are looked at.
const WATCH_EVERY: Duration = Duration::from_millis(50);

impl ShmSession<'_> {
    /// The peers an outstanding operation of this rank needs.
    pub(super) fn waited_for(&self) -> Vec<usize> {
        let mut v: Vec<usize> = self.t.recvs.iter().map(|r| r.peer).collect();
        for p in 0..self.t.size {
            let partial_recv = matches!(
                self.t.inn[p].partial,
                Some(Partial {
                    dest: Dest::Recv { .. },
                    ..
                })
            );
            if partial_recv || !self.t.sendq[p].is_empty() || !self.t.rdvq[p].is_empty() {
                v.push(p);
            }
        }
        v.sort_unstable();
        v.dedup();
        v
    }

    /// Every `WATCH_EVERY` while waiting: fails with `Remote` when the process of a
    /// peer an outstanding operation needs has ended (after reading what it published).
    fn watch_peers(&mut self, now: Instant) -> CResult<()> {
        let last = *self.last_watch.get_or_insert(now);
        if now.saturating_duration_since(last) < WATCH_EVERY
            || self.t.procs.iter().all(Option::is_none)
        {
            return Ok(());
        }
        self.last_watch = Some(now);
        let ended = self
            .waited_for()
            .into_iter()
            .find_map(|p| self.t.procs[p].filter(|&w| has_ended(w)).map(|w| (p, w)));
        let Some((peer, proc_)) = ended else {
            return Ok(());
        };
        // What it published before it ended is still in the ring.
        self.poll()?;
        if !self.waited_for().contains(&peer) {
            self.t.procs[peer] = None;
            return Ok(());
        }
        Err(CollectiveError::Remote {
            peer,
            message: format!(
                "rank {peer} (process {} on this host) ended while rank {} was waiting for it",
                proc_.pid, self.t.rank
            ),
        })
    }

    /// [`Session::wait`](halo_collectives::Session::wait): spins, then yields, then
    /// sleeps on this rank's bell, until something may have moved or `max` has passed.
    pub(super) fn wait_inner(&mut self, max: Duration) -> CResult<()> {
        if !self.done.is_empty() {
            return Ok(());
        }
        // One look at the clock per wait.
        let now = Instant::now();
        let r = self.watch_peers(now);
        self.note(r)?;
        let idle = now.saturating_duration_since(*self.idle_since.get_or_insert(now));
        let timeout = match self.t.wait.step(idle, max) {
            Step::Spin => {
                // A few pauses only: the next poll comes sooner (a 1-byte ping-pong
                // notices the message up to ~16 pauses earlier than with 16).
                for _ in 0..2 {
                    std::hint::spin_loop();
                }
                return Ok(());
            }
            Step::Yield => {
                std::thread::yield_now();
                return Ok(());
            }
            Step::Sleep(timeout) => timeout,
        };
        let me = self.t.rank;
        self.t.seg.mark_asleep(me);
        // Look once more after marking: a peer that published before the mark did not
        // see it (see `Segment::ring_bell`).
        let r = self.poll();
        if matches!(r, Ok(false)) && self.done.is_empty() {
            self.t.seg.futex_wait(me, timeout);
        }
        self.t.seg.mark_awake(me);
        if matches!(r, Ok(true)) {
            self.idle_since = None;
        }
        self.note(r).map(|_| ())
    }
}
