//! The watchdog: ends a process whose libfabric call is stuck (see the module notes
//! of `fabric`, "Failures").

use crate::host::proc::{Proc, has_ended};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// Default of `HALO_WATCHDOG_MS`: how long one libfabric call may run before the
/// watchdog ends the process.
pub(super) const WATCHDOG_DEFAULT: Duration = Duration::from_secs(3);
/// How often the watchdog looks.
const WATCHDOG_EVERY: Duration = Duration::from_millis(100);

/// What a transport is doing inside libfabric, for the watchdog.
///
/// `shm` keeps its queues under spin locks in shared memory: a peer killed while it
/// holds one (in the middle of its own progress, or of a send to a third rank) leaves
/// every later call that needs that lock spinning inside libfabric forever, where no
/// timeout and no abort can reach. The watchdog notices a call that has not returned
/// for `HALO_WATCHDOG_MS` (default 3 s; 0 disables it) and, as NCCL's watchdog does
/// in PyTorch, ends the process: it prints which call is stuck, on which rank, and
/// which same-host peers have ended, then exits with status 1 (`_exit`: the stuck
/// provider must not be called again by exit handlers).
#[derive(Debug)]
pub(super) struct Watched {
    /// Incremented when a call starts and when it returns: odd while inside a call.
    seq: std::sync::atomic::AtomicU64,
    /// The call's peer (`u32::MAX`: none) and name (an index into `CALLS`).
    peer: AtomicU32,
    what: AtomicU32,
    rank: usize,
    limit: Duration,
    /// Same-host peers' processes, to say which have ended.
    pub(super) procs: Mutex<Vec<(usize, Proc)>>,
}

const CALLS: [&str; 7] = [
    "fi_tsend",
    "fi_trecv",
    "fi_cq_read",
    "fi_cq_readerr",
    "fi_cancel",
    "fi_trywait",
    "fi_close",
];
pub(super) const CALL_TSEND: u32 = 0;
pub(super) const CALL_TRECV: u32 = 1;
pub(super) const CALL_CQ_READ: u32 = 2;
pub(super) const CALL_CQ_READERR: u32 = 3;
pub(super) const CALL_CANCEL: u32 = 4;
pub(super) const CALL_TRYWAIT: u32 = 5;
pub(super) const CALL_CLOSE: u32 = 6;

/// The transports the watchdog looks after.
static WATCHED: Mutex<Vec<std::sync::Weak<Watched>>> = Mutex::new(Vec::new());

impl Watched {
    /// A new entry, registered with the watchdog (started on first use); `None` when
    /// `limit` is zero.
    pub(super) fn register(rank: usize, limit: Duration) -> Option<std::sync::Arc<Watched>> {
        if limit.is_zero() {
            return None;
        }
        let w = std::sync::Arc::new(Watched {
            seq: std::sync::atomic::AtomicU64::new(0),
            peer: AtomicU32::new(u32::MAX),
            what: AtomicU32::new(0),
            rank,
            limit,
            procs: Mutex::new(Vec::new()),
        });
        static STARTED: std::sync::Once = std::sync::Once::new();
        STARTED.call_once(|| {
            let spawned = std::thread::Builder::new()
                .name("halo-watchdog".into())
                .spawn(watchdog);
            if let Err(e) = spawned {
                tracing::warn!("cannot start the libfabric watchdog: {e}");
            }
        });
        WATCHED
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(std::sync::Arc::downgrade(&w));
        Some(w)
    }

    fn enter(&self, what: u32, peer: Option<usize>) {
        self.what.store(what, Ordering::Relaxed);
        self.peer
            .store(peer.map_or(u32::MAX, |p| p as u32), Ordering::Relaxed);
        self.seq.fetch_add(1, Ordering::Release);
    }

    fn leave(&self) {
        self.seq.fetch_add(1, Ordering::Release);
    }
}

/// Runs `f` (one libfabric call) marked for the watchdog.
pub(super) fn watched<T>(
    w: &Option<std::sync::Arc<Watched>>,
    what: u32,
    peer: Option<usize>,
    f: impl FnOnce() -> T,
) -> T {
    if let Some(w) = w {
        w.enter(what, peer);
        let r = f();
        w.leave();
        r
    } else {
        f()
    }
}

/// The watchdog thread: ends the process when a call has been stuck past its limit.
fn watchdog() {
    // Per entry: the odd sequence number last seen and since when.
    let mut seen: Vec<(std::sync::Weak<Watched>, u64, Instant)> = Vec::new();
    loop {
        std::thread::sleep(WATCHDOG_EVERY);
        let live: Vec<std::sync::Arc<Watched>> = {
            let mut list = WATCHED.lock().unwrap_or_else(|p| p.into_inner());
            list.retain(|w| w.strong_count() > 0);
            list.iter().filter_map(std::sync::Weak::upgrade).collect()
        };
        seen.retain(|(w, _, _)| w.strong_count() > 0);
        for w in &live {
            let seq = w.seq.load(Ordering::Acquire);
            let i = seen
                .iter()
                .position(|(x, _, _)| std::ptr::eq(x.as_ptr(), std::sync::Arc::as_ptr(w)));
            if seq % 2 == 0 {
                if let Some(i) = i {
                    seen.swap_remove(i);
                }
                continue;
            }
            match i {
                Some(i) if seen[i].1 == seq => {
                    if seen[i].2.elapsed() >= w.limit {
                        stuck(w, seen[i].2.elapsed());
                    }
                }
                Some(i) => seen[i] = (std::sync::Arc::downgrade(w), seq, Instant::now()),
                None => seen.push((std::sync::Arc::downgrade(w), seq, Instant::now())),
            }
        }
    }
}

/// Reports a stuck call and ends the process.
fn stuck(w: &Watched, for_: Duration) -> ! {
    let what = CALLS
        .get(w.what.load(Ordering::Relaxed) as usize)
        .copied()
        .unwrap_or("a libfabric call");
    let peer = match w.peer.load(Ordering::Relaxed) {
        u32::MAX => String::new(),
        p => format!(" (rank {p})"),
    };
    let ended: Vec<String> = w
        .procs
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .filter(|(_, p)| has_ended(*p))
        .map(|(r, p)| format!("rank {r} (process {})", p.pid))
        .collect();
    let why = if ended.is_empty() {
        "the provider is stuck".to_string()
    } else {
        format!(
            "{} ended; the shm provider waits forever on a lock that a dead process held",
            ended.join(", ")
        )
    };
    eprintln!(
        "halo watchdog: rank {}: {what}{peer} has not returned for {:.1} s: {why}; ending \
         this process with status 1 (HALO_WATCHDOG_MS sets the limit, 0 turns this off)",
        w.rank,
        for_.as_secs_f64()
    );
    // SAFETY: _exit ends the process without running anything else; nothing of this
    // process is used afterwards.
    unsafe { libc::_exit(1) }
}
