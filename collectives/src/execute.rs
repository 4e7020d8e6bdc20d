//! The transport interface and the executor that runs a schedule over it.
//!
//! A [`Transport`] moves tagged byte regions between ranks. For one collective
//! [`execute`] opens a [`Session`] over the caller's buffers (so a transport can
//! register them once), posts every step whose dependencies are complete, drives
//! progress, and unlocks dependants as steps complete — until all are done, the
//! timeout passes, or the operation is aborted.

use crate::call::Call;
use crate::error::{CollectiveError, Result};
use crate::schedule::{Region, Schedule, Step, StepId};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The buffers of one collective call on one rank.
#[derive(Debug)]
pub struct Buffers<'a> {
    /// The caller's send buffer.
    pub send: &'a [u8],
    /// The caller's receive buffer.
    pub recv: &'a mut [u8],
    /// Scratch, at least [`Schedule::scratch_len`] bytes.
    pub scratch: &'a mut [u8],
    /// What every rank of this call must agree on ([`Call`]; [`Call::NONE`] for a call
    /// that does not say). Transports carry it with every message, and a receiver whose
    /// own call has another descriptor fails with [`CollectiveError::Mismatch`] naming
    /// both ranks and both calls: ranks that called different collectives, operations,
    /// element types, roots or counts are told so even where the message sizes happen
    /// to agree.
    pub call: Call,
}

/// A way to move bytes between the ranks of a communicator.
///
/// Implementations today: the in-process transport in `halo` (ranks as threads) and
/// the libfabric transport (`halo`'s fabric transport). Device memory does not go
/// through a `Transport`: NCCL has no tags or per-message completion, so the device
/// path runs schedules as waves ([`crate::execute_waves`]). An algorithm never knows
/// which one it runs on.
pub trait Transport {
    /// One collective's use of a set of buffers.
    type Session<'a>: Session
    where
        Self: 'a;

    /// This rank.
    fn rank(&self) -> usize;

    /// Number of ranks.
    fn size(&self) -> usize;

    /// Opens a session over `bufs`. `tag_base` is combined with every step's tag
    /// (it holds the collective's sequence number above [`crate::TAG_BITS`]).
    fn begin<'a>(&'a mut self, tag_base: u64, bufs: Buffers<'a>) -> Result<Self::Session<'a>>;
}

/// Non-blocking operations over one collective's buffers.
///
/// Every posted operation is identified by a token chosen by the caller ([`execute`]
/// uses the step id). Dropping a session must cancel what is still outstanding and
/// must not return while the transport could still touch the buffers.
pub trait Session {
    /// Starts sending `region` to `peer` with `tag`.
    fn post_send(&mut self, peer: usize, tag: u64, region: Region, token: u32) -> Result<()>;

    /// Starts receiving exactly `region.len` bytes from `peer` with `tag` into `region`.
    /// A message of another length (shorter or longer) is not a completion but an
    /// error, [`CollectiveError::Mismatch`] naming the peer and both sizes.
    fn post_recv(&mut self, peer: usize, tag: u64, region: Region, token: u32) -> Result<()>;

    /// Starts receiving a message of *at most* `region.len` bytes from `peer` with
    /// `tag` into the start of `region`, as an MPI receive does: a shorter message
    /// completes it, and [`Session::received_len`] then tells its length. A longer
    /// message is an error, [`CollectiveError::Mismatch`], as with
    /// [`Session::post_recv`]. For a program that learns a message's length from the
    /// message itself (all-to-all-v's count messages carry the first bytes of each
    /// block, unpadded). The default refuses.
    fn post_recv_up_to(&mut self, peer: usize, tag: u64, region: Region, token: u32) -> Result<()> {
        let _ = (peer, tag, token);
        Err(CollectiveError::Internal(format!(
            "this transport's sessions cannot receive a message of unknown length into {region}"
        )))
    }

    /// The length of the message that completed the receive `token` posted with
    /// [`Session::post_recv_up_to`] (told once: a second ask, or an ask before it
    /// completed or for any other operation, is `None`).
    fn received_len(&mut self, token: u32) -> Option<usize> {
        let _ = token;
        None
    }

    /// Copies a region to another, now.
    fn copy(&mut self, src: Region, dst: Region) -> Result<()>;

    /// Drives progress without blocking and appends the tokens of operations that
    /// completed since the last call.
    fn progress(&mut self, completed: &mut Vec<u32>) -> Result<()>;

    /// Whether the operation with `token` has completed (it is then not reported by
    /// [`Session::progress`] again).
    fn test(&mut self, token: u32) -> Result<bool>;

    /// Cancels an outstanding operation (no effect if it already completed).
    fn cancel(&mut self, token: u32) -> Result<()>;

    /// After this rank's part of a collective failed with [`CollectiveError::Mismatch`]
    /// (the ranks called with different sizes): tells `peer`, which waits for the
    /// message `tag` from this rank that will now never be sent, so that it fails at
    /// once with `Mismatch` naming this rank — and tells the ranks waiting for *it* in
    /// turn — instead of at its timeout. Best effort, nothing to wait for; the default
    /// does nothing.
    fn post_poison(&mut self, peer: usize, tag: u64) -> Result<()> {
        let _ = (peer, tag);
        Ok(())
    }

    /// Waits until something may have completed or `max` has passed. The default
    /// yields the processor; transports with a wait object block on it.
    fn wait(&mut self, max: Duration) -> Result<()> {
        let _ = max;
        std::thread::yield_now();
        Ok(())
    }

    /// Copies the bytes of `region` into `out` (exactly `region.len` bytes), for a
    /// program that decides what to post next from what it has received (all-to-all-v
    /// reads each count message as it lands). `region` must not be the destination of
    /// a receive still outstanding: a transport whose receives may land outside its
    /// own calls refuses such a read with [`CollectiveError::Internal`]. The default
    /// refuses every read.
    fn read(&mut self, region: Region, out: &mut [u8]) -> Result<()> {
        let _ = out;
        Err(CollectiveError::Internal(format!(
            "this transport's sessions cannot read {region}"
        )))
    }
}

/// How [`execute`] runs one collective.
#[derive(Debug, Clone, Copy)]
pub struct ExecOptions<'a> {
    /// The whole operation must finish within this time.
    pub timeout: Duration,
    /// Set from another thread to make the operation return `Aborted` promptly.
    pub abort: Option<&'a AtomicBool>,
    /// Polls without waiting before [`execute`] starts to back off (default 4: with
    /// more ranks than cores, every poll spent spinning is taken from the peer being
    /// waited for; 4 processes on 2 cores ran a 4-byte all-to-all in about 13 us with
    /// 0-4 polls against 25-30 us with 64, and 2 processes on 2 cores saw no
    /// difference — docs/bench/JOURNAL.md, "Fixes made while measuring").
    pub spin: u32,
}

impl Default for ExecOptions<'_> {
    fn default() -> Self {
        ExecOptions {
            timeout: Duration::from_secs(60),
            abort: None,
            spin: 4,
        }
    }
}

/// Runs `schedule` on `session`: posts ready steps, progresses, completes.
///
/// Returns an error naming the step and its peer when a step fails, when the
/// timeout passes (the oldest pending step is named) or when the operation is aborted.
/// After a [`CollectiveError::Mismatch`], every send this rank had not posted yet is
/// replaced by [`Session::post_poison`], so that the ranks waiting for those messages
/// fail now too.
pub fn execute<S: Session + ?Sized>(
    schedule: &Schedule,
    session: &mut S,
    opts: &ExecOptions<'_>,
) -> Result<()> {
    // The engine's bookkeeping is reused from call to call on this thread (no
    // allocation per call in steady state: a small message's whole call costs well
    // under a microsecond). A nested call — a session that runs a schedule itself —
    // gets fresh vectors.
    WORKSPACE.with(|cell| match cell.try_borrow_mut() {
        Ok(mut ws) => execute_in(schedule, session, opts, &mut ws),
        Err(_) => execute_in(schedule, session, opts, &mut Workspace::default()),
    })
}

/// The engine's per-call bookkeeping, kept between calls.
#[derive(Debug, Default)]
struct Workspace {
    /// Whether each step was posted.
    posted: Vec<bool>,
    /// Dependencies not yet complete, per step.
    waiting: Vec<u32>,
    /// Steps ready to post, in reverse program order.
    ready: Vec<StepId>,
    /// Whether each step completed.
    done: Vec<bool>,
    /// Completions not yet processed.
    completed: Vec<u32>,
    /// The schedule's dependants, as CSR ([`Schedule::dependants_into`]).
    rstart: Vec<u32>,
    rdeps: Vec<StepId>,
}

thread_local! {
    static WORKSPACE: std::cell::RefCell<Workspace> = std::cell::RefCell::default();
}

fn execute_in<S: Session + ?Sized>(
    schedule: &Schedule,
    session: &mut S,
    opts: &ExecOptions<'_>,
    ws: &mut Workspace,
) -> Result<()> {
    let out = run(schedule, session, opts, ws);
    if let Err(CollectiveError::Mismatch { .. }) = &out {
        for (s, step) in schedule.steps().iter().enumerate() {
            if let Step::Send { peer, tag, .. } = *step
                && !ws.posted[s]
            {
                // Best effort: the collective has failed already.
                let _ = session.post_poison(peer as usize, tag);
            }
        }
    }
    out
}

/// Idle polls between two looks at the clock for the timeout (a look costs about as
/// much as a poll; the timeout is seconds, so its precision does not suffer).
const CLOCK_EVERY: u32 = 16;

/// How a program that polls a [`Session`] waits when a poll completed nothing: the
/// abort flag and the timeout are checked, a few polls spin (`ExecOptions::spin`),
/// then [`Session::wait`] with a bound growing to 1 ms. [`execute`] waits this way,
/// and so does any program that drives a session itself.
#[derive(Debug, Default)]
pub struct Idle {
    /// The first idle poll since the program started (the clock starts there:
    /// posting never blocks).
    start: Option<Instant>,
    waited: Duration,
    polls: u32,
}

impl Idle {
    /// Called after a poll that completed nothing. Returns
    /// [`CollectiveError::Aborted`] with `aborted()`'s words when the operation was
    /// aborted, `timed_out(waited)` once `opts.timeout` has passed since the first
    /// idle poll, and otherwise spins or waits once.
    ///
    /// # Errors
    /// The two above, and the session's own from [`Session::wait`].
    pub fn wait<S: Session + ?Sized>(
        &mut self,
        session: &mut S,
        opts: &ExecOptions<'_>,
        aborted: impl FnOnce() -> String,
        timed_out: impl FnOnce(Duration) -> CollectiveError,
    ) -> Result<()> {
        if let Some(flag) = opts.abort
            && flag.load(Ordering::Relaxed)
        {
            return Err(CollectiveError::Aborted(aborted()));
        }
        let since = *self.start.get_or_insert_with(Instant::now);
        if self.polls.is_multiple_of(CLOCK_EVERY) || self.polls > opts.spin {
            self.waited = since.elapsed();
        }
        if self.waited >= opts.timeout {
            return Err(timed_out(self.waited));
        }
        self.polls = self.polls.saturating_add(1);
        if self.polls > opts.spin {
            // Back off: yield first, then wait with a growing bound (oversubscribed
            // ranks must leave the processor to the peers they wait for).
            let max = Duration::from_micros(u64::from((self.polls - opts.spin).min(1000)));
            session.wait(max.min(opts.timeout.saturating_sub(self.waited)))?;
        } else {
            std::hint::spin_loop();
        }
        Ok(())
    }

    /// Called after a poll that completed something: the next idle poll spins again.
    pub fn reset(&mut self) {
        self.polls = 0;
    }
}

fn run<S: Session + ?Sized>(
    schedule: &Schedule,
    session: &mut S,
    opts: &ExecOptions<'_>,
    ws: &mut Workspace,
) -> Result<()> {
    let n = schedule.len();
    ws.posted.clear();
    ws.posted.resize(n, false);
    if n == 0 {
        return Ok(());
    }
    schedule.dependants_into(&mut ws.rstart, &mut ws.rdeps);
    let Workspace {
        posted,
        waiting,
        ready,
        done,
        completed,
        rstart,
        rdeps,
    } = ws;
    waiting.clear();
    waiting.extend((0..n).map(|s| schedule.deps(s as StepId).len() as u32));
    ready.clear();
    // Post in program order: pop from the back of a reversed list.
    ready.extend((0..n as StepId).rev().filter(|&s| waiting[s as usize] == 0));
    done.clear();
    done.resize(n, false);
    completed.clear();
    let mut remaining = n;
    let mut idle = Idle::default();

    let fail = |step: StepId, e: CollectiveError| -> CollectiveError {
        match e {
            CollectiveError::System(m) => CollectiveError::System(format!(
                "{} step {step} ({}): {m}",
                schedule.algorithm(),
                schedule.steps()[step as usize]
            )),
            other => other,
        }
    };

    while remaining > 0 {
        // Post everything that is ready; copies complete at once.
        while let Some(s) = ready.pop() {
            let step = schedule.steps()[s as usize];
            posted[s as usize] = true;
            let local_done = match step {
                Step::Send { peer, tag, region } => {
                    session
                        .post_send(peer as usize, tag, region, s)
                        .map_err(|e| fail(s, e))?;
                    false
                }
                Step::Recv { peer, tag, region } => {
                    session
                        .post_recv(peer as usize, tag, region, s)
                        .map_err(|e| fail(s, e))?;
                    false
                }
                Step::Copy { src, dst } => {
                    session.copy(src, dst).map_err(|e| fail(s, e))?;
                    true
                }
            };
            if local_done {
                completed.push(s);
            }
        }
        if completed.is_empty() {
            session.progress(completed)?;
        }
        if completed.is_empty() {
            idle.wait(
                session,
                opts,
                || {
                    format!(
                        "{} aborted with {remaining} of {n} steps pending",
                        schedule.algorithm()
                    )
                },
                |waited| {
                    let oldest = (0..n).find(|&s| !done[s]).expect("a step is pending") as StepId;
                    let step = schedule.steps()[oldest as usize];
                    let peer = match step {
                        Step::Send { peer, .. } | Step::Recv { peer, .. } => Some(peer as usize),
                        Step::Copy { .. } => None,
                    };
                    CollectiveError::Timeout {
                        algorithm: schedule.algorithm(),
                        step: oldest,
                        peer,
                        what: step.to_string(),
                        waited,
                    }
                },
            )?;
            continue;
        }
        idle.reset();
        for s in completed.drain(..) {
            let su = s as usize;
            if done[su] {
                return Err(CollectiveError::Internal(format!(
                    "step {s} completed twice"
                )));
            }
            done[su] = true;
            remaining -= 1;
            for &d in &rdeps[rstart[su] as usize..rstart[su + 1] as usize] {
                waiting[d as usize] -= 1;
                if waiting[d as usize] == 0 {
                    ready.push(d);
                }
            }
        }
    }
    Ok(())
}

/// A borrowed session is a session (so that a wrapper such as
/// [`crate::SessionWaves`] can run over a session its caller keeps).
impl<S: Session + ?Sized> Session for &mut S {
    fn post_send(&mut self, peer: usize, tag: u64, region: Region, token: u32) -> Result<()> {
        (**self).post_send(peer, tag, region, token)
    }
    fn post_recv(&mut self, peer: usize, tag: u64, region: Region, token: u32) -> Result<()> {
        (**self).post_recv(peer, tag, region, token)
    }
    fn post_recv_up_to(&mut self, peer: usize, tag: u64, region: Region, token: u32) -> Result<()> {
        (**self).post_recv_up_to(peer, tag, region, token)
    }
    fn received_len(&mut self, token: u32) -> Option<usize> {
        (**self).received_len(token)
    }
    fn copy(&mut self, src: Region, dst: Region) -> Result<()> {
        (**self).copy(src, dst)
    }
    fn progress(&mut self, completed: &mut Vec<u32>) -> Result<()> {
        (**self).progress(completed)
    }
    fn test(&mut self, token: u32) -> Result<bool> {
        (**self).test(token)
    }
    fn cancel(&mut self, token: u32) -> Result<()> {
        (**self).cancel(token)
    }
    fn post_poison(&mut self, peer: usize, tag: u64) -> Result<()> {
        (**self).post_poison(peer, tag)
    }
    fn wait(&mut self, max: Duration) -> Result<()> {
        (**self).wait(max)
    }
    fn read(&mut self, region: Region, out: &mut [u8]) -> Result<()> {
        (**self).read(region, out)
    }
}
