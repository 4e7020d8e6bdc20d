//! The doorbell: one futex word, in memory shared between the ranks of a host, that
//! its owner sleeps on while it waits for its peers and that a peer rings after
//! handing it something. The futex system calls live here and only here.
//!
//! The protocol, which loses no wake-up: the owner [`Futex::mark_asleep`]s (a store,
//! then a full fence), looks once more for what it waits for, and only if it found
//! nothing [`Futex::wait`]s; then [`Futex::mark_awake`]. A peer publishes, then
//! [`Futex::ring`]s (a full fence, then a load of the word, and the wake-up only if it
//! says the owner sleeps). Either the peer's load sees `ASLEEP` or the owner's look
//! after its fence sees what the peer published before its own. A ring costs one
//! shared load when the owner is awake; every wait is bounded, so a ring that does not
//! come delays, never hangs.

use std::ffi::{c_int, c_long};
use std::ptr;
use std::sync::atomic::{AtomicU32, Ordering, fence};
use std::time::Duration;

/// Whether doorbells are used on this target (the futex system call as the libfabric
/// transport's bells use it; elsewhere it has no bell and sleeps bounded).
pub const SUPPORTED: bool = cfg!(any(target_arch = "x86_64", target_arch = "aarch64"));

/// A bell's word: its owner sleeps (or is about to).
const ASLEEP: u32 = 1;
/// A bell's word: its owner is awake, or was rung.
const AWAKE: u32 = 0;

/// One futex word (four bytes, the layout of an `AtomicU32`: it may sit in a
/// `#[repr(C)]` struct in shared memory, or at the start of a mapped page). Other
/// processes access it only atomically.
#[derive(Debug, Default)]
#[repr(transparent)]
pub struct Futex(AtomicU32);

impl Futex {
    /// Wakes the owner if it sleeps on this word. Call after publishing something it
    /// may wait for.
    pub fn ring(&self) {
        // Pairs with the fence in `mark_asleep`: either this load sees ASLEEP or the
        // sleeper's look after its store sees what was published before this fence.
        fence(Ordering::SeqCst);
        let w = &self.0;
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

    /// Marks the owner asleep. The owner then looks for work once more and, if it
    /// found nothing, calls [`Futex::wait`]; then [`Futex::mark_awake`].
    pub fn mark_asleep(&self) {
        self.0.store(ASLEEP, Ordering::SeqCst);
        // Pairs with the fence in `ring`: either the waker sees ASLEEP or the look
        // after this fence sees what it published.
        fence(Ordering::SeqCst);
    }

    /// Sleeps until the word is rung or `timeout` passes (at once if it was rung
    /// since [`Futex::mark_asleep`]).
    pub fn wait(&self, timeout: Duration) {
        let w = &self.0;
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

    /// Marks the owner awake.
    pub fn mark_awake(&self) {
        self.0.store(AWAKE, Ordering::SeqCst);
    }

    /// The whole protocol for an owner that can look from a closure: marks it asleep;
    /// then, unless `anything` finds work (or fails), sleeps until rung or `timeout`
    /// passes; marks it awake. What `anything` said, less whether it found work.
    pub fn sleep<E>(
        &self,
        timeout: Duration,
        anything: impl FnOnce() -> Result<bool, E>,
    ) -> Result<(), E> {
        self.mark_asleep();
        // A peer that handed something over before the mark did not ring: look once
        // more after it.
        let found = anything();
        if matches!(found, Ok(false)) {
            self.wait(timeout);
        }
        self.mark_awake();
        found.map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Instant;

    #[test]
    fn a_ring_ends_a_sleep_and_an_unrung_sleep_is_bounded() {
        let f = Arc::new(Futex::default());
        // Nobody rings: the sleep ends at its bound.
        let t = Instant::now();
        f.sleep(Duration::from_millis(20), || Ok::<_, ()>(false))
            .unwrap();
        assert!(t.elapsed() >= Duration::from_millis(15));
        // Work found after the mark: no sleep at all.
        let t = Instant::now();
        f.sleep(Duration::from_secs(10), || Ok::<_, ()>(true))
            .unwrap();
        assert!(t.elapsed() < Duration::from_secs(5));
        // Rung from another thread (until the sleeper is back) while asleep.
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (g, d) = (Arc::clone(&f), Arc::clone(&done));
        let ringer = std::thread::spawn(move || {
            while !d.load(Ordering::Acquire) {
                std::thread::sleep(Duration::from_millis(5));
                g.ring();
            }
        });
        let t = Instant::now();
        f.sleep(Duration::from_secs(20), || Ok::<_, ()>(false))
            .unwrap();
        done.store(true, Ordering::Release);
        assert!(t.elapsed() < Duration::from_secs(10));
        ringer.join().unwrap();
    }
}
