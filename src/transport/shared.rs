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
use super::emulation::Emulation;
use halo_collectives::{
    Buffers, CollectiveError, ExecOptions, Region, Schedule, Session, Transport, execute,
};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, TryLockError};
use std::time::Duration;

type CResult<T> = std::result::Result<T, CollectiveError>;

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
                Backend::Shared(_) => unreachable!("checked above"),
            };
            let endpoint = Arc::new(Endpoint {
                transport: Mutex::new(None),
                ids: AtomicU32::new(1),
                emulation,
                providers,
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
        schedule: &Schedule,
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
            Some(Backend::Local(t)) => run_mapped(t, map, schedule, tag_base, bufs, opts),
            Some(Backend::Fabric(t)) => run_mapped(&mut **t, map, schedule, tag_base, bufs, opts),
            Some(Backend::Shm(t)) => run_mapped(&mut **t, map, schedule, tag_base, bufs, opts),
            _ => Err(CollectiveError::Internal(
                "shared endpoint without a transport".into(),
            )),
        }
    }
}

fn run_mapped<T: Transport>(
    transport: &mut T,
    map: Option<&[u32]>,
    schedule: &Schedule,
    tag_base: u64,
    bufs: Buffers<'_>,
    opts: &ExecOptions<'_>,
) -> CResult<()> {
    let Some(map) = map else {
        return super::run_on(transport, schedule, tag_base, bufs, opts);
    };
    let session = transport.begin(tag_base, bufs)?;
    let mut mapped = Mapped {
        inner: session,
        map,
    };
    let out = execute(schedule, &mut mapped, opts);
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
}
