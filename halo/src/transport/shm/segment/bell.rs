//! The bells: one futex word per rank in the segment (and what peers need to probe
//! cross-memory attach to it); ringing a peer's bell after publishing, marking this
//! rank asleep and awake, and the futex wait (the doorbell and its protocol are
//! [`crate::host::futex`]).

use super::Segment;
use crate::host::CACHE_LINE;
use crate::host::futex::Futex;
use std::sync::atomic::{AtomicU32, AtomicU64};
use std::time::Duration;

/// A rank's bell: one futex word, on its own cache line, and (written once before the
/// rank attaches, read by peers after every rank has) what a peer needs to probe
/// cross-memory attach to it.
#[repr(C, align(64))]
pub(crate) struct Bell {
    word: Futex,
    /// The rank's process id (in its PID namespace).
    pub(crate) pid: AtomicU32,
    /// Its PID namespace's inode.
    pub(crate) pid_ns: AtomicU64,
    /// The address of its probe word and the word's value.
    pub(crate) probe_addr: AtomicU64,
    pub(crate) probe_val: AtomicU64,
}

impl Segment {
    pub(crate) fn bell(&self, rank: usize) -> &Bell {
        let rank = self.at(rank);
        debug_assert!(rank < self.nranks);
        // SAFETY: inside the bells' pages, 64-aligned; the word is atomic.
        unsafe {
            &*self
                .base
                .add(self.bells_at + rank * CACHE_LINE)
                .cast::<Bell>()
        }
    }

    /// Wakes `rank` if it sleeps on its bell. Call after publishing something it may
    /// wait for (a cell or a head).
    pub(crate) fn ring_bell(&self, rank: usize) {
        self.bell(rank).word.ring();
    }

    /// Marks `rank` asleep on its bell. The caller then looks at its rings once more
    /// and, if it found nothing, calls [`Segment::futex_wait`]; then
    /// [`Segment::mark_awake`].
    pub(crate) fn mark_asleep(&self, rank: usize) {
        self.bell(rank).word.mark_asleep();
    }

    /// Sleeps until `rank`'s bell is rung or `timeout` passes (at once if it was rung
    /// since [`Segment::mark_asleep`]).
    pub(crate) fn futex_wait(&self, rank: usize, timeout: Duration) {
        self.bell(rank).word.wait(timeout);
    }

    /// Marks `rank` awake.
    pub(crate) fn mark_awake(&self, rank: usize) {
        self.bell(rank).word.mark_awake();
    }
}
