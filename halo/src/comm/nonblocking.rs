//! Non-blocking operations: [`Communicator::scope`], [`Scope`] and [`Request`].
//!
//! The public notes (model, ordering, lifetimes, errors) are on [`Scope`].

use super::p2p::{BATCH_MAX_OPS, P2pOp};
use super::{AbortHandle, Communicator, Partition, ReduceOp, Reducible};
use crate::error::{Error, Result};
use crate::transport::Ticket;
use crossbeam::channel::{Receiver, Sender, unbounded};
use std::cell::{Cell, RefCell};
use std::fmt;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};

/// One operation for the worker: what to run on the communicator.
pub(crate) type Job<'env> = Box<dyn FnOnce(&mut Communicator) -> Result<()> + Send + 'env>;

/// What a task asks of the worker: any operation as a closure, or a send or receive
/// as data, which the worker runs in one batch with the sends and receives queued
/// right after it ([`Communicator::p2p_batch`]).
pub(crate) enum Work<'env> {
    Job(Job<'env>),
    P2p(P2pOp<'env>),
}

impl Work<'_> {
    fn run(self, comm: &mut Communicator) -> Result<()> {
        match self {
            Work::Job(job) => job(comm),
            Work::P2p(op) => op.run(comm),
        }
    }
}

/// Where an operation's outcome lands.
#[derive(Debug, Default)]
pub(crate) struct Slot {
    outcome: Mutex<Outcome>,
    done: Condvar,
    /// Whether somebody took the outcome (a wait, a successful test).
    taken: AtomicBool,
}

/// A slot's state under its lock: the outcome once there, and how many threads sleep
/// on the slot's condition variable waiting for it (so that filling a slot nobody
/// waits on costs no wake-up system call: most of a window's requests are filled
/// before anyone waits on them).
#[derive(Debug, Default)]
struct Outcome {
    result: Option<Result<()>>,
    sleepers: u32,
}

impl Slot {
    /// A slot that has its outcome, success, and counts as taken: the request of an
    /// operation that completed as it started (an eager send).
    fn succeeded() -> Slot {
        Slot {
            outcome: Mutex::new(Outcome {
                result: Some(Ok(())),
                sleepers: 0,
            }),
            done: Condvar::new(),
            taken: AtomicBool::new(true),
        }
    }

    /// Stores `outcome` unless the slot has one.
    fn fill(&self, outcome: Result<()>) {
        self.fill_with(|| outcome);
    }

    /// [`Slot::fill`] with the outcome made only when the slot is still empty.
    fn fill_with(&self, outcome: impl FnOnce() -> Result<()>) {
        let mut g = self.outcome.lock().unwrap_or_else(PoisonError::into_inner);
        if g.result.is_some() {
            return;
        }
        g.result = Some(outcome());
        let sleepers = g.sleepers;
        drop(g);
        if sleepers > 0 {
            self.done.notify_all();
        }
    }

    /// Blocks until the operation has finished and returns its outcome.
    pub(crate) fn wait(&self) -> Result<()> {
        let mut g = self.outcome.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            if let Some(r) = g.result.as_ref() {
                self.taken.store(true, Ordering::Release);
                return r.clone();
            }
            // The worker fills every slot it was given, also when it unwinds (see
            // `Task`'s `Drop`), and every operation is bounded by the timeout. The
            // count is changed under the lock that `fill_with` reads it under, so a
            // fill either sees this sleeper or comes before the check above.
            g.sleepers += 1;
            g = self.done.wait(g).unwrap_or_else(PoisonError::into_inner);
            g.sleepers -= 1;
        }
    }

    /// The outcome if the operation has finished.
    pub(crate) fn try_take(&self) -> Option<Result<()>> {
        let g = self.outcome.lock().unwrap_or_else(PoisonError::into_inner);
        let r = g.result.as_ref().cloned();
        if r.is_some() {
            self.taken.store(true, Ordering::Release);
        }
        r
    }

    /// Whether the operation has finished.
    pub(crate) fn is_done(&self) -> bool {
        self.outcome
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .result
            .is_some()
    }

    fn outcome_if_untaken(&self) -> Option<Result<()>> {
        if self.taken.load(Ordering::Acquire) {
            return None;
        }
        self.outcome
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .result
            .clone()
    }
}

/// An operation on its way to the worker.
pub(crate) struct Task<'env> {
    work: Option<Work<'env>>,
    /// Its place among the operations on the communicators of its split tree.
    ticket: Option<Ticket>,
    slot: Arc<Slot>,
    /// 1-based position among the operations of this queue.
    index: u64,
    name: &'static str,
}

impl Drop for Task<'_> {
    /// A task dropped before it ran (the worker panicked or went away) still
    /// completes its request, so no waiter waits forever.
    fn drop(&mut self) {
        // The message is made only for a task that did not run (the common drop is
        // of a task whose slot the worker filled: no allocation then).
        self.slot.fill_with(|| {
            Err(Error::internal(format!(
                "{} (operation {}) was not run: the communicator's worker stopped",
                self.name, self.index
            )))
        });
    }
}

/// The sending side of a queue of operations: numbers them and hands them to the
/// worker.
#[derive(Debug)]
pub(crate) struct Queue<'env> {
    tx: Sender<Task<'env>>,
    next: u64,
    progress: Arc<Progress>,
}

/// How far the worker is: what the starting thread reads before it writes a small send
/// itself ([`Scope`]'s eager sends), which it may only do when nothing started before
/// is unfinished.
#[derive(Debug, Default)]
pub(crate) struct Progress {
    /// Operations queued and not yet finished (the worker counts them down under the
    /// communicator's lock, once their outcome is in).
    unfinished: AtomicU64,
    /// Whether one failed (the later ones are then not run, eager sends included).
    failed: AtomicBool,
}

/// The receiving end of a [`Queue`], which [`serve`] runs.
#[derive(Debug)]
pub(crate) struct Inbox<'env> {
    rx: Receiver<Task<'env>>,
    progress: Arc<Progress>,
}

impl<'env> Queue<'env> {
    /// A queue and the receiving end that [`serve`] runs.
    pub(crate) fn new() -> (Self, Inbox<'env>) {
        let (tx, rx) = unbounded();
        let progress = Arc::new(Progress::default());
        let inbox = Inbox {
            rx,
            progress: Arc::clone(&progress),
        };
        (
            Queue {
                tx,
                next: 1,
                progress,
            },
            inbox,
        )
    }

    /// Whether every operation queued so far has finished, none failing.
    fn idle(&self) -> bool {
        self.progress.unfinished.load(Ordering::Acquire) == 0
            && !self.progress.failed.load(Ordering::Acquire)
    }

    /// The next operation's index, for one that completes without the worker.
    fn number(&mut self) -> u64 {
        self.next += 1;
        self.next - 1
    }

    /// Queues `work` under `name`, with its place in the split tree's order if the
    /// communicator shares its endpoint; returns its slot and index.
    pub(crate) fn submit(
        &mut self,
        name: &'static str,
        ticket: Option<Ticket>,
        work: Work<'env>,
    ) -> (Arc<Slot>, u64) {
        let slot = Arc::new(Slot::default());
        let index = self.number();
        self.progress.unfinished.fetch_add(1, Ordering::AcqRel);
        let task = Task {
            work: Some(work),
            ticket,
            slot: slot.clone(),
            index,
            name,
        };
        // The worker lives until the queue is dropped; if it is gone (it panicked) the
        // task is dropped here, which fills its slot with an error.
        let _ = self.tx.send(task);
        (slot, index)
    }
}

/// The worker: runs the queue's operations on `comm` in order until the queue is
/// dropped. After a failure the later operations are not run: each fails with the
/// failed operation's kind of error, naming it.
///
/// A send or receive is run in one batch with the sends and receives already queued
/// behind it (up to [`BATCH_MAX_OPS`]; small ones, to other ranks, on a communicator
/// with its endpoint to itself): one pass of the transport instead of one each, and
/// never a wait for more to come.
pub(crate) fn serve(comm: &Mutex<&mut Communicator>, inbox: Inbox<'_>) {
    let Inbox { rx, progress } = inbox;
    let lock = || comm.lock().unwrap_or_else(PoisonError::into_inner);
    let mut failed: Option<(u64, &'static str, Error)> = None;
    let mut next: Option<Task<'_>> = None;
    while let Some(mut task) = next.take().or_else(|| rx.recv().ok()) {
        let Some(mut work) = task.work.take() else {
            continue;
        };
        let mut guard = lock();
        let comm: &mut Communicator = &mut guard;
        if let Work::P2p(op) = work {
            if task.ticket.is_some() || failed.is_some() || !op.batchable(comm) {
                work = Work::P2p(op);
            } else {
                let mut batch = vec![(task, op)];
                while batch.len() < BATCH_MAX_OPS {
                    let Ok(mut t) = rx.try_recv() else { break };
                    match t.work.take() {
                        Some(Work::P2p(o)) if t.ticket.is_none() && o.batchable(comm) => {
                            batch.push((t, o));
                        }
                        other => {
                            t.work = other;
                            next = Some(t);
                            break;
                        }
                    }
                }
                if batch.len() > 1 {
                    let n = batch.len() as u64;
                    run_batch(comm, batch, &mut failed);
                    progress.finished(n, failed.is_some());
                    continue;
                }
                let (t, op) = batch.pop().expect("one");
                task = t;
                work = Work::P2p(op);
            }
        }
        let outcome = match &failed {
            _ if comm.is_aborted() => Err(Error::Aborted {
                message: format!(
                    "{} (operation {}) was not run: communicator of rank {} was aborted",
                    task.name,
                    task.index,
                    comm.rank()
                ),
            }),
            Some((index, name, e)) => Err(not_run(e, &task, name, *index)),
            None => {
                let r = match &task.ticket {
                    None => work.run(comm),
                    Some(t) => {
                        let abort = comm.abort_handle();
                        match t.wait_turn(comm.timeout(), &|| abort.is_aborted()) {
                            Ok(()) => work.run(comm),
                            Err(why) => Err(turn_error(why, &task, comm)),
                        }
                    }
                };
                // Its turn ends here: the next operation of the tree may run.
                task.ticket = None;
                if let Err(e) = &r {
                    tracing::debug!(rank = comm.rank(), op = task.name, index = task.index, error = %e, "non-blocking operation failed");
                    failed = Some((task.index, task.name, e.clone()));
                }
                r
            }
        };
        task.slot.fill(outcome);
        progress.finished(1, failed.is_some());
    }
}

impl Progress {
    /// `n` more operations finished; whether one has failed so far. Called under the
    /// communicator's lock, after their outcomes are in.
    fn finished(&self, n: u64, failed: bool) {
        if failed {
            self.failed.store(true, Ordering::Release);
        }
        self.unfinished.fetch_sub(n, Ordering::AcqRel);
    }
}

/// The error of `task`, not run because operation `index` (`name`) failed with `e`.
fn not_run(e: &Error, task: &Task<'_>, name: &str, index: u64) -> Error {
    with_context(
        e,
        &format!(
            "{} (operation {}) was not run because {name} (operation {index}) on this \
             communicator failed before it",
            task.name, task.index
        ),
    )
}

/// Runs a batch of sends and receives ([`Communicator::p2p_batch`]) and completes
/// their requests: all succeed, or all fail with the batch's error, each naming the
/// batch, and the batch's first operation is what the later ones name.
fn run_batch(
    comm: &mut Communicator,
    batch: Vec<(Task<'_>, P2pOp<'_>)>,
    failed: &mut Option<(u64, &'static str, Error)>,
) {
    let (tasks, mut ops): (Vec<_>, Vec<_>) = batch.into_iter().unzip();
    let r = if comm.is_aborted() {
        Err(Error::Aborted {
            message: format!("communicator of rank {} was aborted", comm.rank()),
        })
    } else {
        comm.p2p_batch(&mut ops)
    };
    drop(ops);
    match r {
        Ok(()) => tasks.iter().for_each(|t| t.slot.fill(Ok(()))),
        Err(e) => {
            let (first, last) = (tasks[0].index, tasks[tasks.len() - 1].index);
            tracing::debug!(rank = comm.rank(), first, last, error = %e, "a batch of non-blocking sends and receives failed");
            for t in &tasks {
                t.slot.fill(Err(with_context(
                    &e,
                    &format!(
                        "{} (operation {}, run in one batch with operations {first}-{last})",
                        t.name, t.index
                    ),
                )));
            }
            *failed = Some((first, tasks[0].name, e));
        }
    }
}

/// A buffer's bytes.
fn bytes<E: bytemuck::Pod>(buf: &[E]) -> &[u8] {
    bytemuck::cast_slice(buf)
}

/// A buffer's bytes, to write.
fn bytes_mut<E: bytemuck::Pod>(buf: &mut [E]) -> &mut [u8] {
    bytemuck::cast_slice_mut(buf)
}

/// The error of an operation that did not get its turn.
fn turn_error(why: &str, task: &Task<'_>, comm: &Communicator) -> Error {
    let what = format!(
        "{} (operation {}) waited for the operations started before it on communicators \
         of the same split tree",
        task.name, task.index
    );
    if why == "aborted" {
        Error::Aborted {
            message: format!("{what}: communicator of rank {} was aborted", comm.rank()),
        }
    } else {
        Error::Timeout {
            peer: None,
            step: None,
            waited: comm.timeout(),
            message: format!("{what}, and they did not finish"),
        }
    }
}

/// `e` with `context` before its message (same variant, same code).
pub(crate) fn with_context(e: &Error, context: &str) -> Error {
    let mut e = e.clone();
    match &mut e {
        Error::UnhandledDeviceError { message }
        | Error::SystemError { message }
        | Error::InternalError { message }
        | Error::InvalidArgument { message, .. }
        | Error::InvalidUsage { message, .. }
        | Error::RemoteError { message, .. }
        | Error::Timeout { message, .. }
        | Error::Aborted { message } => *message = format!("{context}: {message}"),
        Error::InProgress => {}
    }
    e
}

/// The operations started in one [`Communicator::scope`].
///
/// Buffers are borrowed for `'env`, the scope's whole lifetime. Not `Sync`: one
/// thread starts the operations, so their order is the program's.
///
/// # Model
///
/// A communicator runs one schedule at a time (its transport is not `Sync`). In a
/// scope its **worker thread** (one per communicator, started by its first scope and
/// kept) holds the communicator (`&mut`, under a lock) and runs the operations started
/// in the scope one after the other, in the order they were started (NCCL's stream
/// order). The thread that opened the scope goes on computing; each start returns a
/// [`Request`] to wait on or test. So operations progress on their own, whether anyone
/// waits or not.
///
/// **Sends and receives.** Two paths make a window of small point-to-point operations
/// cost less than a hand-over to the worker each (OSU's `bw`):
///
/// - *Batches*: the worker runs a send or receive together with the sends and
///   receives already queued right behind it (up to 64, each at most 4 KiB, to other
///   ranks) as one pass of the transport; it never waits for more to come. The
///   operations of a batch progress together, which only removes waits: each message
///   still matches the operation it would match alone. A batch succeeds or fails as
///   one (each request then names the batch).
/// - *Eager sends*: a send of at most 4 KiB started when every operation started
///   before it in the scope has finished is written by the starting thread itself when
///   the transport can do it at once (HALO's shared-memory rings with a free cell;
///   not on a communicator that shares its endpoint), as `MPI_Isend`'s eager path
///   does; its request is complete when the call returns. Otherwise it is queued.
///
/// [`Communicator::p2p_stats`] counts both.
///
/// **Ordering.** As for blocking calls, every rank must start the operations of a
/// communicator in the same order (point-to-point: the two ranks of a pair in
/// matching order). Operations of one scope never overlap each other (but for the
/// sends and receives of a batch, above). Operations of communicators with transports
/// of their own (separate jobs) progress at the same time, each scope on its worker
/// (scopes nested). Communicators **split from one
/// another share one transport endpoint** per rank: their operations (in scopes, and
/// blocking passes made meanwhile) take their turn in the order this rank started
/// them, whichever worker gets there first — so nested scopes on an EP and a PP
/// sub-communicator are correct, and deadlock-free exactly when the same calls made
/// blocking in that order would be, but they overlap computation, not each other.
///
/// **Lifetimes.** Buffers are borrowed for the whole scope (`'env`: they must be
/// declared before the scope) and the scope ends only when every operation it started
/// has finished, so no request outlives its buffers and no buffer is touched while an
/// operation may still use it. Misuse does not compile:
///
/// ```compile_fail
/// # use halo::{local, Emulation, topology::Topology};
/// # let topo = Topology::preset("flat:2").unwrap();
/// local::run(&topo, Emulation::off(), |comm| {
///     comm.scope(|s| {
///         let buf = vec![1u32; 4]; // declared inside the scope: does not live long enough
///         s.send(&buf, 1 - s.rank()).wait()
///     })
/// });
/// ```
///
/// and neither does reading a receive buffer before the scope has ended:
///
/// ```compile_fail
/// # use halo::{local, Emulation, topology::Topology};
/// # let topo = Topology::preset("flat:2").unwrap();
/// local::run(&topo, Emulation::off(), |comm| {
///     let mut buf = vec![0u32; 4];
///     comm.scope(|s| {
///         let r = s.recv(&mut buf, 1 - s.rank());
///         r.wait()?;
///         println!("{}", buf[0]); // still borrowed by the scope
///         Ok(())
///     })
/// });
/// ```
///
/// **Errors.** A failed operation returns its error from [`Request::wait`] (or
/// [`Request::test`]); the operations started after it in the same scope are not run
/// and fail with the same kind of error, naming the failed one. A request dropped
/// without waiting is still completed at the end of the scope, and its error (if any)
/// is what [`Communicator::scope`] returns — never lost. After the scope the
/// communicator is in the state a failed blocking call leaves it in.
///
/// **Abort.** [`Scope::abort_handle`] (or a handle taken before) aborts from any
/// thread: the operation in progress returns [`Error::Aborted`] promptly, and the
/// queued ones fail at once.
pub struct Scope<'env> {
    queue: RefCell<Queue<'env>>,
    /// The communicator, which the worker locks for each operation (or batch) and the
    /// starting thread for an eager send.
    comm: Arc<Mutex<&'env mut Communicator>>,
    /// The one slot of every eager send's request.
    succeeded: Arc<Slot>,
    /// Every request started, to report the errors of those never waited.
    started: RefCell<Vec<(u64, &'static str, Arc<Slot>)>>,
    rank: usize,
    size: usize,
    abort: AbortHandle,
    /// Takes a place in the split tree's order (`None`: an endpoint of its own).
    tickets: Option<Box<dyn Fn() -> Ticket + 'env>>,
    /// `'env` must not shrink (no shorter-lived buffers through variance).
    _env: PhantomData<Cell<&'env mut ()>>,
}

impl fmt::Debug for Scope<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Scope")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("started", &self.started.borrow().len())
            .finish_non_exhaustive()
    }
}

/// A started non-blocking operation of a [`Scope`].
///
/// [`Request::wait`] blocks until it has finished and returns its outcome;
/// [`Request::test`] asks without blocking. Dropping a request does not cancel the
/// operation: it still runs, and its error is returned by [`Communicator::scope`].
#[must_use = "a request's error is returned by `wait` (or, if dropped, by the scope)"]
pub struct Request<'s> {
    slot: Arc<Slot>,
    index: u64,
    name: &'static str,
    _scope: PhantomData<&'s ()>,
}

impl fmt::Debug for Request<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Request")
            .field("op", &self.name)
            .field("index", &self.index)
            .field("done", &self.slot.is_done())
            .finish()
    }
}

impl Request<'_> {
    /// Blocks until the operation has finished; returns its outcome. The
    /// communicator's timeout applies inside the operation (and to each one queued
    /// before it), and an abort stops it promptly.
    ///
    /// # Errors
    /// The operation's error, as the blocking call returns it; for an operation not
    /// run because an earlier one of the scope failed, that failure's kind of error,
    /// naming it.
    pub fn wait(self) -> Result<()> {
        self.slot.wait()
    }

    /// Whether the operation has finished (successfully or not), without blocking.
    pub fn is_done(&self) -> bool {
        self.slot.is_done()
    }

    /// Asks without blocking: `Ok(None)` when the operation finished successfully,
    /// `Ok(Some(self))` when it is still queued or running (test again or wait).
    ///
    /// # Errors
    /// As [`Request::wait`], once the operation has finished.
    pub fn test(self) -> Result<Option<Self>> {
        match self.slot.try_take() {
            Some(r) => r.map(|()| None),
            None => Ok(Some(self)),
        }
    }

    /// The operation's name (`"all_to_all_v"`, `"send"`, ...).
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Its 1-based position among the operations started in its scope.
    pub fn index(&self) -> u64 {
        self.index
    }
}

impl<'env> Scope<'env> {
    fn start(&self, name: &'static str, job: Job<'env>) -> Request<'_> {
        self.start_work(name, Work::Job(job))
    }

    fn start_work(&self, name: &'static str, work: Work<'env>) -> Request<'_> {
        if let Work::P2p(P2pOp::Send(bytes, peer, tag)) = &work
            && let Some(index) = self.send_now(bytes, *peer, *tag)
        {
            return Request {
                slot: Arc::clone(&self.succeeded),
                index,
                name,
                _scope: PhantomData,
            };
        }
        let ticket = self.tickets.as_ref().map(|t| t());
        let (slot, index) = self.queue.borrow_mut().submit(name, ticket, work);
        self.started.borrow_mut().push((index, name, slot.clone()));
        Request {
            slot,
            index,
            name,
            _scope: PhantomData,
        }
    }

    /// A send's eager path: when every operation started before has finished (none
    /// failing) and the transport can write the message at once
    /// ([`Communicator::try_send_now`]), this thread writes it; its index, or `None`
    /// to queue it. The worker is idle then, so the order is the program's either way.
    fn send_now(&self, bytes: &[u8], peer: usize, tag: u32) -> Option<u64> {
        let mut queue = self.queue.borrow_mut();
        if self.tickets.is_some() || !queue.idle() {
            return None;
        }
        // The worker holds the lock at most until it has counted its last operation
        // down; nothing can be queued meanwhile (this thread queues).
        let mut comm = self.comm.lock().unwrap_or_else(PoisonError::into_inner);
        comm.try_send_now(bytes, peer, tag).then(|| queue.number())
    }

    /// This rank of the scope's communicator.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Ranks of the scope's communicator.
    pub fn size(&self) -> usize {
        self.size
    }

    /// A handle that aborts the scope's communicator from any thread.
    pub fn abort_handle(&self) -> AbortHandle {
        self.abort.clone()
    }

    /// Starts [`Communicator::all_to_all`].
    pub fn all_to_all<E: bytemuck::Pod + Send + Sync>(
        &self,
        send: &'env [E],
        recv: &'env mut [E],
    ) -> Request<'_> {
        self.start(
            "all_to_all",
            Box::new(move |c: &mut Communicator| c.all_to_all(send, recv)),
        )
    }

    /// Starts [`Communicator::all_to_all_v`]. The partitions are copied: only the
    /// buffers stay borrowed.
    pub fn all_to_all_v<E: bytemuck::Pod + Send + Sync>(
        &self,
        send: &'env [E],
        send_part: &Partition<'_>,
        recv: &'env mut [E],
        recv_part: &Partition<'_>,
    ) -> Request<'_> {
        let (sp, rp) = (send_part.to_owned_static(), recv_part.to_owned_static());
        self.start(
            "all_to_all_v",
            Box::new(move |c: &mut Communicator| c.all_to_all_v(send, &sp, recv, &rp)),
        )
    }

    /// Starts [`Communicator::send`].
    pub fn send<E: bytemuck::Pod + Send + Sync>(&self, buf: &'env [E], peer: usize) -> Request<'_> {
        self.start_work("send", Work::P2p(P2pOp::Send(bytes(buf), peer, 0)))
    }

    /// Starts [`Communicator::recv`].
    pub fn recv<E: bytemuck::Pod + Send + Sync>(
        &self,
        buf: &'env mut [E],
        peer: usize,
    ) -> Request<'_> {
        self.start_work("recv", Work::P2p(P2pOp::Recv(bytes_mut(buf), peer, 0)))
    }

    /// Starts [`Communicator::send_recv`].
    pub fn send_recv<E: bytemuck::Pod + Send + Sync>(
        &self,
        send: &'env [E],
        dst: usize,
        recv: &'env mut [E],
        src: usize,
    ) -> Request<'_> {
        self.start(
            "send_recv",
            Box::new(move |c: &mut Communicator| c.send_recv(send, dst, recv, src)),
        )
    }

    /// Starts [`Communicator::all_reduce`].
    pub fn all_reduce<E: Reducible + Send + Sync>(
        &self,
        send: &'env [E],
        recv: &'env mut [E],
        op: ReduceOp,
    ) -> Request<'_> {
        self.start(
            "all_reduce",
            Box::new(move |c: &mut Communicator| c.all_reduce(send, recv, op)),
        )
    }

    /// Starts [`Communicator::all_reduce_in_place`].
    pub fn all_reduce_in_place<E: Reducible + Send + Sync>(
        &self,
        buf: &'env mut [E],
        op: ReduceOp,
    ) -> Request<'_> {
        self.start(
            "all_reduce_in_place",
            Box::new(move |c: &mut Communicator| c.all_reduce_in_place(buf, op)),
        )
    }

    /// Starts [`Communicator::all_gather`].
    pub fn all_gather<E: bytemuck::Pod + Send + Sync>(
        &self,
        send: &'env [E],
        recv: &'env mut [E],
    ) -> Request<'_> {
        self.start(
            "all_gather",
            Box::new(move |c: &mut Communicator| c.all_gather(send, recv)),
        )
    }

    /// Starts [`Communicator::barrier`].
    pub fn barrier(&self) -> Request<'_> {
        self.start("barrier", Box::new(move |c: &mut Communicator| c.barrier()))
    }

    /// Starts [`Communicator::send_tagged`].
    pub fn send_tagged<E: bytemuck::Pod + Send + Sync>(
        &self,
        buf: &'env [E],
        peer: usize,
        tag: u32,
    ) -> Request<'_> {
        self.start_work("send", Work::P2p(P2pOp::Send(bytes(buf), peer, tag)))
    }

    /// Starts [`Communicator::recv_tagged`].
    pub fn recv_tagged<E: bytemuck::Pod + Send + Sync>(
        &self,
        buf: &'env mut [E],
        peer: usize,
        tag: u32,
    ) -> Request<'_> {
        self.start_work("recv", Work::P2p(P2pOp::Recv(bytes_mut(buf), peer, tag)))
    }

    /// Starts [`Communicator::reduce_scatter`].
    pub fn reduce_scatter<E: Reducible + Send + Sync>(
        &self,
        send: &'env [E],
        recv: &'env mut [E],
        op: ReduceOp,
    ) -> Request<'_> {
        self.start(
            "reduce_scatter",
            Box::new(move |c: &mut Communicator| c.reduce_scatter(send, recv, op)),
        )
    }

    /// Starts [`Communicator::broadcast`].
    pub fn broadcast<E: bytemuck::Pod + Send + Sync>(
        &self,
        buf: &'env mut [E],
        root: usize,
    ) -> Request<'_> {
        self.start(
            "broadcast",
            Box::new(move |c: &mut Communicator| c.broadcast(buf, root)),
        )
    }

    /// Starts [`Communicator::gather`].
    pub fn gather<E: bytemuck::Pod + Send + Sync>(
        &self,
        send: &'env [E],
        recv: &'env mut [E],
        root: usize,
    ) -> Request<'_> {
        self.start(
            "gather",
            Box::new(move |c: &mut Communicator| c.gather(send, recv, root)),
        )
    }

    /// Starts [`Communicator::scatter`].
    pub fn scatter<E: bytemuck::Pod + Send + Sync>(
        &self,
        send: &'env [E],
        recv: &'env mut [E],
        root: usize,
    ) -> Request<'_> {
        self.start(
            "scatter",
            Box::new(move |c: &mut Communicator| c.scatter(send, recv, root)),
        )
    }
}

impl Communicator {
    /// Runs `f` with a [`Scope`] in which operations on this communicator start
    /// without blocking and run in order on a worker thread, while `f` goes on (see
    /// [`Scope`] for ordering, lifetimes and errors).
    ///
    /// Returns when `f` has returned **and** every operation started in the scope has
    /// finished. Its result is `f`'s; when `f` succeeded but a request that nobody
    /// waited for failed, that error (the first such, by start order).
    ///
    /// ```
    /// use halo::{local, Emulation, Partition, topology::Topology};
    ///
    /// let topo = Topology::preset("flat:4").unwrap();
    /// let out = local::run(&topo, Emulation::off(), |comm| {
    ///     let (me, n) = (comm.rank(), comm.size());
    ///     let send: Vec<u32> = (0..n as u32).map(|q| 100 * me as u32 + q).collect();
    ///     let mut recv = vec![0u32; n];
    ///     let mut acc = 0u64;
    ///     comm.scope(|s| {
    ///         let r = s.all_to_all(&send, &mut recv);
    ///         acc = (0..1000u64).sum(); // computes while the all-to-all runs
    ///         r.wait()
    ///     })?;
    ///     assert_eq!(acc, 499_500);
    ///     Ok(recv)
    /// });
    /// assert_eq!(out[2].as_ref().unwrap(), &[2, 102, 202, 302]);
    /// ```
    ///
    /// The worker is one thread per communicator, started by its first scope and kept
    /// for the next ones (a pool of one thread, `rayon-core`). A panic in `f` or in
    /// the worker propagates once every started operation has finished.
    ///
    /// # Errors
    /// `f`'s error; else the first error of a request never waited;
    /// [`Error::InternalError`] if the worker thread could not start.
    pub fn scope<'env, T>(
        &'env mut self,
        f: impl for<'s> FnOnce(&'s Scope<'env>) -> Result<T>,
    ) -> Result<T> {
        let pool = self.worker_pool()?;
        let (queue, inbox) = Queue::new();
        let tickets: Option<Box<dyn Fn() -> Ticket + 'env>> = self
            .core
            .backend
            .shared_endpoint()
            .map(|s| Box::new(move || s.ticket()) as Box<dyn Fn() -> Ticket + 'env>);
        let (rank, size, abort) = (self.rank(), self.size(), self.abort_handle());
        let comm = Arc::new(Mutex::new(self));
        let scope = Scope {
            tickets,
            queue: RefCell::new(queue),
            comm: Arc::clone(&comm),
            succeeded: Arc::new(Slot::succeeded()),
            started: RefCell::new(Vec::new()),
            rank,
            size,
            abort,
            _env: PhantomData,
        };
        let (out, started) = pool.in_place_scope(|rs| {
            rs.spawn(move |_| serve(&comm, inbox));
            let out = f(&scope);
            let Scope { queue, started, .. } = scope;
            // The worker ends when the queue is gone; `in_place_scope` waits for it.
            drop(queue);
            (out, started)
        });
        finish(out, started.into_inner())
    }

    /// The communicator's worker thread for scopes: a pool of one thread, made on the
    /// first scope and kept (a thread per scope would cost ~0.1-0.2 ms per scope).
    fn worker_pool(&mut self) -> Result<Arc<rayon_core::ThreadPool>> {
        if let Some(p) = &self.core.ext.pool {
            return Ok(Arc::clone(p));
        }
        let rank = self.rank();
        let pool = rayon_core::ThreadPoolBuilder::new()
            .num_threads(1)
            .thread_name(move |_| format!("halo-nb-r{rank}"))
            .build()
            .map_err(|e| Error::internal(format!("cannot start the scope's worker: {e}")))?;
        let pool = Arc::new(pool);
        self.core.ext.pool = Some(Arc::clone(&pool));
        Ok(pool)
    }
}

/// The scope's result: `f`'s, or (when `f` succeeded) the first error of a request
/// never waited.
fn finish<T>(out: Result<T>, started: Vec<(u64, &'static str, Arc<Slot>)>) -> Result<T> {
    let mut lost =
        started
            .into_iter()
            .filter_map(|(index, name, slot)| match slot.outcome_if_untaken() {
                Some(Err(e)) => Some((index, name, e)),
                _ => None,
            });
    match out {
        Ok(v) => match lost.next() {
            Some((index, name, e)) => Err(with_context(
                &e,
                &format!("{name} (operation {index} of the scope, never waited) failed"),
            )),
            None => Ok(v),
        },
        Err(e) => {
            for (index, name, other) in lost {
                tracing::warn!(index, op = name, error = %other, "a non-blocking operation that was never waited failed too");
            }
            Err(e)
        }
    }
}
