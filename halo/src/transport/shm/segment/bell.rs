//! The bells: one futex word per rank in the segment (and what peers need to probe
//! cross-memory attach to it); ringing a peer's bell after publishing, marking this
//! rank asleep and awake, and the futex wait.

use super::Segment;
use std::ffi::{c_int, c_long};
use std::ptr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering, fence};
use std::time::Duration;

/// A bell's word: its owner sleeps (or is about to).
const ASLEEP: u32 = 1;
/// A bell's word: its owner is awake, or was rung.
const AWAKE: u32 = 0;

/// A rank's bell: one futex word, on its own cache line, and (written once before the
/// rank attaches, read by peers after every rank has) what a peer needs to probe
/// cross-memory attach to it.
#[repr(C, align(64))]
pub(crate) struct Bell {
    word: AtomicU32,
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
        unsafe { &*self.base.add(self.bells_at + rank * 64).cast::<Bell>() }
    }

    /// Wakes `rank` if it sleeps on its bell. Call after publishing something it may
    /// wait for (a cell or a head).
    pub(crate) fn ring_bell(&self, rank: usize) {
        // Pairs with the fence in `sleep`: either this load sees ASLEEP or the
        // sleeper's look after its store sees what was published before this fence.
        fence(Ordering::SeqCst);
        let w = &self.bell(rank).word;
        if w.load(Ordering::Relaxed) == ASLEEP && w.swap(AWAKE, Ordering::SeqCst) == ASLEEP {
            // SAFETY: FUTEX_WAKE on a valid, aligned u32 in a shared mapping (not
            // FUTEX_PRIVATE: the waiter may be another process); no other argument is read.
            unsafe {
                libc::syscall(
                    libc::SYS_futex,
                    ptr::from_ref(w),
                    libc::FUTEX_WAKE,
                    1 as c_int,
                )
            };
        }
    }

    /// Marks `rank` asleep on its bell. The caller then looks at its rings once more
    /// and, if it found nothing, calls [`Segment::futex_wait`]; then
    /// [`Segment::mark_awake`].
    pub(crate) fn mark_asleep(&self, rank: usize) {
        self.bell(rank).word.store(ASLEEP, Ordering::SeqCst);
        // Pairs with the fence in `ring_bell`: either the waker sees ASLEEP or the look
        // after this fence sees what it published.
        fence(Ordering::SeqCst);
    }

    /// Sleeps until `rank`'s bell is rung or `timeout` passes (at once if it was rung
    /// since [`Segment::mark_asleep`]).
    pub(crate) fn futex_wait(&self, rank: usize, timeout: Duration) {
        let w = &self.bell(rank).word;
        let ts = libc::timespec {
            tv_sec: timeout.as_secs() as libc::time_t,
            tv_nsec: c_long::from(timeout.subsec_nanos() as i32),
        };
        // SAFETY: FUTEX_WAIT on a valid, aligned, shared u32 with a valid relative
        // timeout; it returns at once if the word is no longer ASLEEP.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                ptr::from_ref(w),
                libc::FUTEX_WAIT,
                ASLEEP as c_int,
                &ts as *const libc::timespec,
            )
        };
    }

    /// Marks `rank` awake.
    pub(crate) fn mark_awake(&self, rank: usize) {
        self.bell(rank).word.store(AWAKE, Ordering::SeqCst);
    }
}
