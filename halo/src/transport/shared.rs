//! One rank's transport endpoint shared by a communicator and the sub-communicators
//! split from it.
//!
//! A split does not open new endpoints: every communicator of a split tree talks
//! through the endpoint of the communicator it came from (its *world*). On the first
//! split the world communicator's transport moves behind an `Arc<Mutex<..>>`
//! ([`Endpoint`]); each communicator then holds a [`SharedBackend`]: the endpoint, the
//! map from its ranks to world ranks, and its communicator id, which the communicator
//! puts in the top bits of every tag so that communicators never match each other's
//! messages (see `comm::collectives` for the tag layout).
//!
//! A communicator holds the endpoint's lock only while one pass of a collective runs,
//! and takes it with `try_lock`: communicators of one split tree may be used one after
//! the other from one thread (or handed between threads), but a pass that finds the
//! endpoint busy — another communicator of the same tree in use on another thread at
//! that moment — fails at once with [`CollectiveError::InvalidUsage`] instead of
//! waiting, which could deadlock across ranks.
//!
//! Communicator ids are kept per endpoint as a bitmap of the ids in use; an id is
//! released when its communicator is dropped.

use super::Backend;
use super::CResult;
use super::emulation::Emulation;
use halo_collectives::{Buffers, CollectiveError, ExecOptions, Region, Session, Transport};
use std::cell::Cell;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError, TryLockError};
use std::time::{Duration, Instant};

/// Most communicators that may use one endpoint at a time (ids `0..MAX_COMMS`).
pub(crate) const MAX_COMMS: u32 = 32;

/// A rank's transport, shared by the communicators of one split tree.
#[derive(Debug)]
pub(crate) struct Endpoint {
    /// The transport (`Local` or `Fabric`; `None` only while it is being moved in).
    transport: Mutex<Option<Backend>>,
    /// Bit `i`: communicator id `i` is in use on this endpoint.
    ids: AtomicU32,
    /// The in-process transport's link emulation, if it is one.
    emulation: Option<Emulation>,
    /// The libfabric provider to each world rank (empty on the in-process transport).
    providers: Vec<Option<String>>,
    /// The order in which this rank's operations on the tree's communicators run.
    turns: Turns,
}

/// Turns on a shared endpoint: every operation started on a communicator of the split
/// tree without blocking (`Communicator::scope`) takes a ticket when it is started, in
/// program order, and its worker runs it only when its turn comes; a blocking pass
/// takes a ticket when it begins. So the operations of one rank on the tree's
/// communicators run one at a time in the order the program started them — as the
/// same calls made blocking would — whichever worker thread gets there first.
#[derive(Debug, Default)]
pub(crate) struct Turns {
    /// A blocking pass (not a scope's operation) holds the turn: another thread's
    /// blocking pass is then refused at once, as before turns existed (two threads
    /// using one split tree concurrently is the caller's error, and waiting could
    /// deadlock across ranks).
    blocking: AtomicBool,
    next: AtomicU64,
    /// The ticket whose turn it is, and the tickets finished (or given up) early.
    state: Mutex<(u64, BTreeSet<u64>)>,
    changed: Condvar,
}

thread_local! {
    /// Whether this thread runs an operation in its turn (a scope's worker).
    static IN_TURN: Cell<bool> = const { Cell::new(false) };
}

/// A place in an endpoint's order; finishing it (or dropping it unused) lets the next
/// one run.
#[derive(Debug)]
pub(crate) struct Ticket {
    endpoint: Arc<Endpoint>,
    number: u64,
}

impl Ticket {
    /// Waits for this ticket's turn, at most `timeout`; stops early when `aborted`
    /// says so. While the turn is held (until the ticket is dropped), passes of this
    /// thread run without taking another ticket.
    pub(crate) fn wait_turn(
        &self,
        timeout: Duration,
        aborted: &dyn Fn() -> bool,
    ) -> std::result::Result<(), &'static str> {
        let t = &self.endpoint.turns;
        let deadline = Instant::now() + timeout;
        let mut g = t.state.lock().unwrap_or_else(PoisonError::into_inner);
        while g.0 != self.number {
            if aborted() {
                return Err("aborted");
            }
            let now = Instant::now();
            if now >= deadline {
                return Err("timeout");
            }
            let wait = (deadline - now).min(Duration::from_millis(20));
            g = t
                .changed
                .wait_timeout(g, wait)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        IN_TURN.with(|c| c.set(true));
        Ok(())
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let t = &self.endpoint.turns;
        let mut g = t.state.lock().unwrap_or_else(PoisonError::into_inner);
        if g.0 == self.number {
            IN_TURN.with(|c| c.set(false));
            g.0 += 1;
            loop {
                let next = g.0;
                if !g.1.remove(&next) {
                    break;
                }
                g.0 += 1;
            }
        } else {
            g.1.insert(self.number);
        }
        drop(g);
        t.changed.notify_all();
    }
}

/// Hands out [`Ticket`]s of one endpoint.
#[derive(Debug, Clone)]
pub(crate) struct SharedTickets(Arc<Endpoint>);

impl SharedTickets {
    /// The next place in the endpoint's order.
    pub(crate) fn ticket(&self) -> Ticket {
        self.0.ticket()
    }
}

impl Endpoint {
    fn ticket(self: &Arc<Self>) -> Ticket {
        Ticket {
            number: self.turns.next.fetch_add(1, Ordering::AcqRel),
            endpoint: Arc::clone(self),
        }
    }
}

/// A communicator's handle on a shared [`Endpoint`].
#[derive(Debug)]
pub(crate) struct SharedBackend {
    endpoint: Arc<Endpoint>,
    /// Communicator rank -> world rank; `None`: the identity (the world communicator).
    map: Option<Arc<[u32]>>,
    /// This communicator's id, released on drop.
    id: u32,
}

impl Drop for SharedBackend {
    fn drop(&mut self) {
        self.endpoint
            .ids
            .fetch_and(!(1u32 << self.id), Ordering::AcqRel);
    }
}

impl Backend {
    /// Moves this (world) backend behind a shared endpoint, if it is not shared yet, and
    /// returns the shared handle. The world communicator keeps id 0.
    pub(crate) fn share(&mut self) -> &SharedBackend {
        if !matches!(self, Backend::Shared(_)) {
            let (emulation, providers) = match &*self {
                Backend::Local(t) => (Some(t.emulation()), Vec::new()),
                Backend::Fabric(t) => (
                    None,
                    (0..t.size())
                        .map(|p| t.provider_to(p).map(str::to_string))
                        .collect(),
                ),
                Backend::Shm(t) => (None, vec![Some(super::shm::PROVIDER.to_string()); t.size()]),
                Backend::Hybrid(t) => (
                    None,
                    (0..t.size())
                        .map(|p| t.provider_to(p).map(str::to_string))
                        .collect(),
                ),
                Backend::Shared(_) => unreachable!("checked above"),
            };
            let endpoint = Arc::new(Endpoint {
                transport: Mutex::new(None),
                ids: AtomicU32::new(1),
                emulation,
                providers,
                turns: Turns::default(),
            });
            let world = std::mem::replace(
                self,
                Backend::Shared(SharedBackend {
                    endpoint: Arc::clone(&endpoint),
                    map: None,
                    id: 0,
                }),
            );
            *endpoint.transport.lock().unwrap_or_else(|p| p.into_inner()) = Some(world);
        }
        match self {
            Backend::Shared(s) => s,
            _ => unreachable!("shared just above"),
        }
    }
}

impl SharedBackend {
    /// The communicator ids in use on this endpoint, as a bitmap.
    pub(crate) fn ids_in_use(&self) -> u32 {
        self.endpoint.ids.load(Ordering::Acquire)
    }

    /// This communicator's id.
    pub(crate) fn id(&self) -> u32 {
        self.id
    }

    /// The world rank of this communicator's rank `rank`.
    pub(crate) fn world_rank(&self, rank: usize) -> usize {
        match &self.map {
            Some(m) => m[rank] as usize,
            None => rank,
        }
    }

    /// A handle for a sub-communicator whose rank `i` is this communicator's rank
    /// `members[i]`, with communicator id `id`.
    ///
    /// # Errors
    /// [`CollectiveError::InvalidUsage`] when `id` is already in use on this endpoint
    /// (another communicator of the tree was split at the same time on another thread).
    pub(crate) fn child(&self, members: &[usize], id: u32) -> CResult<SharedBackend> {
        let bit = 1u32 << id;
        if self.endpoint.ids.fetch_or(bit, Ordering::AcqRel) & bit != 0 {
            return Err(CollectiveError::InvalidUsage(format!(
                "communicator id {id} was taken while this split ran: communicators split from \
                 one another must not be used concurrently from different threads"
            )));
        }
        let map: Arc<[u32]> = members.iter().map(|&m| self.world_rank(m) as u32).collect();
        Ok(SharedBackend {
            endpoint: Arc::clone(&self.endpoint),
            map: Some(map),
            id,
        })
    }

    /// What hands out places in the endpoint's order of operations (see [`Turns`]).
    pub(crate) fn tickets(&self) -> SharedTickets {
        SharedTickets(Arc::clone(&self.endpoint))
    }

    /// The in-process transport's link emulation, if the endpoint is one.
    pub(crate) fn emulation(&self) -> Option<Emulation> {
        self.endpoint.emulation
    }

    /// The libfabric provider that carries messages to this communicator's rank `peer`.
    pub(crate) fn provider_to(&self, peer: usize) -> Option<&str> {
        let world = match &self.map {
            Some(m) => *m.get(peer)? as usize,
            None => peer,
        };
        self.endpoint.providers.get(world)?.as_deref()
    }

    /// Runs one pass over the shared endpoint, peers mapped to world ranks.
    pub(crate) fn run(
        &self,
        program: super::Program<'_>,
        tag_base: u64,
        bufs: Buffers<'_>,
        opts: &ExecOptions<'_>,
    ) -> CResult<()> {
        // A pass outside a scope's turn takes its own place in the order, after the
        // operations already started on the tree's communicators.
        let busy = || {
            CollectiveError::InvalidUsage(
                "this rank's transport is in use by another communicator of the same split \
                 tree on another thread: communicators split from one another may be used \
                 one after the other, not concurrently"
                    .into(),
            )
        };
        let own_turn = if IN_TURN.with(Cell::get) {
            None
        } else {
            if self.endpoint.turns.blocking.load(Ordering::Acquire) {
                return Err(busy());
            }
            let ticket = self.endpoint.ticket();
            let aborted = || opts.abort.is_some_and(|a| a.load(Ordering::Acquire));
            match ticket.wait_turn(opts.timeout, &aborted) {
                Ok(()) => {
                    self.endpoint.turns.blocking.store(true, Ordering::Release);
                    Some(ticket)
                }
                Err("aborted") => {
                    return Err(CollectiveError::Aborted(
                        "aborted while waiting for the operations started before this one on \
                         communicators of the same split tree"
                            .into(),
                    ));
                }
                Err(_) => {
                    return Err(CollectiveError::Timeout {
                        algorithm: "turn",
                        step: 0,
                        peer: None,
                        what: "waiting for the operations started before this one on \
                               communicators of the same split tree"
                            .into(),
                        waited: opts.timeout,
                    });
                }
            }
        };
        let out = self.run_in_turn(program, tag_base, bufs, opts);
        if let Some(t) = own_turn {
            self.endpoint.turns.blocking.store(false, Ordering::Release);
            drop(t);
        }
        out
    }

    fn run_in_turn(
        &self,
        program: super::Program<'_>,
        tag_base: u64,
        bufs: Buffers<'_>,
        opts: &ExecOptions<'_>,
    ) -> CResult<()> {
        let mut guard = match self.endpoint.transport.try_lock() {
            Ok(g) => g,
            // A panic on another thread mid-pass: its session was dropped while
            // unwinding, which withdrew everything it had posted.
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => {
                return Err(CollectiveError::InvalidUsage(
                    "this rank's transport is in use by another communicator of the same split \
                     tree on another thread: communicators split from one another may be used \
                     one after the other, not concurrently"
                        .into(),
                ));
            }
        };
        let map = self.map.as_deref();
        match guard.as_mut() {
            Some(Backend::Local(t)) => run_mapped(t, map, program, tag_base, bufs, opts),
            Some(Backend::Fabric(t)) => run_mapped(&mut **t, map, program, tag_base, bufs, opts),
            Some(Backend::Shm(t)) => run_mapped(&mut **t, map, program, tag_base, bufs, opts),
            Some(Backend::Hybrid(t)) => run_mapped(&mut **t, map, program, tag_base, bufs, opts),
            _ => Err(CollectiveError::Internal(
                "shared endpoint without a transport".into(),
            )),
        }
    }
}

fn run_mapped<T: Transport>(
    transport: &mut T,
    map: Option<&[u32]>,
    program: super::Program<'_>,
    tag_base: u64,
    bufs: Buffers<'_>,
    opts: &ExecOptions<'_>,
) -> CResult<()> {
    let Some(map) = map else {
        return super::run_on(transport, program, tag_base, bufs, opts);
    };
    let session = transport.begin(tag_base, bufs)?;
    let mut mapped = Mapped {
        inner: session,
        map,
    };
    let out = program.run_on_session(&mut mapped, opts);
    // Dropped before returning on every path: that cancels what is outstanding.
    drop(mapped);
    out.map_err(|e| match e {
        CollectiveError::Remote { peer, message } => CollectiveError::Remote {
            peer: map.iter().position(|&w| w as usize == peer).unwrap_or(peer),
            message: format!("{message} (world rank {peer})"),
        },
        CollectiveError::Mismatch { peer, message } => CollectiveError::Mismatch {
            peer: map.iter().position(|&w| w as usize == peer).unwrap_or(peer),
            message: format!("{message} (world rank {peer})"),
        },
        other => other,
    })
}

/// A session whose peers are a sub-communicator's ranks.
struct Mapped<'m, S> {
    inner: S,
    map: &'m [u32],
}

impl<S> Mapped<'_, S> {
    fn world(&self, peer: usize) -> CResult<usize> {
        self.map.get(peer).map(|&w| w as usize).ok_or_else(|| {
            CollectiveError::Internal(format!(
                "peer {peer} out of range for {} ranks",
                self.map.len()
            ))
        })
    }
}

impl<S: Session> Session for Mapped<'_, S> {
    fn post_send(&mut self, peer: usize, tag: u64, region: Region, token: u32) -> CResult<()> {
        let w = self.world(peer)?;
        self.inner.post_send(w, tag, region, token)
    }

    fn post_poison(&mut self, peer: usize, tag: u64) -> CResult<()> {
        let w = self.world(peer)?;
        self.inner.post_poison(w, tag)
    }

    fn post_recv(&mut self, peer: usize, tag: u64, region: Region, token: u32) -> CResult<()> {
        let w = self.world(peer)?;
        self.inner.post_recv(w, tag, region, token)
    }

    fn post_recv_up_to(
        &mut self,
        peer: usize,
        tag: u64,
        region: Region,
        token: u32,
    ) -> CResult<()> {
        let w = self.world(peer)?;
        self.inner.post_recv_up_to(w, tag, region, token)
    }

    fn received_len(&mut self, token: u32) -> Option<usize> {
        self.inner.received_len(token)
    }

    fn copy(&mut self, src: Region, dst: Region) -> CResult<()> {
        self.inner.copy(src, dst)
    }

    fn progress(&mut self, completed: &mut Vec<u32>) -> CResult<()> {
        self.inner.progress(completed)
    }

    fn test(&mut self, token: u32) -> CResult<bool> {
        self.inner.test(token)
    }

    fn cancel(&mut self, token: u32) -> CResult<()> {
        self.inner.cancel(token)
    }

    fn wait(&mut self, max: Duration) -> CResult<()> {
        self.inner.wait(max)
    }

    fn read(&mut self, region: Region, out: &mut [u8]) -> CResult<()> {
        self.inner.read(region, out)
    }
}
