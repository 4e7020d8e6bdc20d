//! The transport of one rank: its endpoints, routes and pool of operation contexts,
//! opened and connected here (the [`Transport`](halo_collectives::Transport) impl that
//! begins a session per collective is in `session.rs`).

use super::bell::Bell;
use super::endpoint::FabricEndpoint;
use super::stale::remove_stale_shm_regions;
use super::watchdog::{CALL_CLOSE, Watched, watched};
use super::{FabricConfig, FabricProgress, LOCAL, NET};
use crate::error::{Error, Result};
use crate::host::proc::Proc;
use halo_collectives::{Buf, Call, Region};
use halo_fabric_sys as fi;
use std::time::{Duration, Instant};

/// A post the provider refused with `-FI_EAGAIN`, retried as the engine progresses.
#[derive(Debug, Clone, Copy)]
pub(super) struct Deferred {
    pub(super) peer: usize,
    pub(super) token: u32,
    pub(super) is_send: bool,
    pub(super) region: Region,
    /// The full tag (tag base included).
    pub(super) tag: u64,
    pub(super) since: Instant,
    /// A poison message ([`Session::post_poison`](halo_collectives::Session::post_poison)): no bytes, [`FabricEndpoint::poison_data`]
    /// as completion data.
    ///
    /// [`FabricEndpoint::poison_data`]: super::endpoint::FabricEndpoint::poison_data
    pub(super) poison: bool,
    /// A receive that a shorter message completes too ([`Session::post_recv_up_to`](halo_collectives::Session::post_recv_up_to)).
    pub(super) up_to: bool,
}

/// The context of one posted operation; libfabric returns its address in completions.
#[repr(C)]
pub(super) struct OpCtx {
    /// Provider scratch space (FI_CONTEXT / FI_CONTEXT2 modes); must come first.
    pub(super) fi: fi::fi_context2,
    pub(super) token: u32,
    pub(super) peer: u32,
    pub(super) ep: u8,
    pub(super) is_send: bool,
    pub(super) in_use: bool,
    pub(super) index: u32,
    /// The posted length (a receive completing with another is a size mismatch).
    pub(super) len: usize,
    /// The posted region (a receive's is written by the provider until it completes).
    pub(super) region: Region,
    /// A receive that a shorter message completes too (`Session::post_recv_up_to`).
    pub(super) up_to: bool,
    /// The full tag, for messages naming the operation.
    pub(super) tag: u64,
}

/// Which endpoint and fabric address reach a peer.
#[derive(Debug, Clone, Copy)]
pub(super) struct Route {
    pub(super) ep: u8,
    pub(super) addr: fi::fi_addr_t,
}

/// The libfabric transport of one rank.
pub(crate) struct FabricTransport {
    pub(super) rank: usize,
    pub(super) size: usize,
    pub(super) eps: [Option<FabricEndpoint>; 2],
    /// Provider names per slot (kept when the endpoints are closed).
    pub(super) providers: [Option<String>; 2],
    pub(super) routes: Vec<Route>,
    // Boxed: the provider holds pointers to these contexts, which must not move when
    // the pool grows.
    #[allow(clippy::vec_box)]
    pub(super) ctxs: Vec<Box<OpCtx>>,
    pub(super) free: Vec<u32>,
    /// Operations posted and not yet completed, per endpoint slot.
    pub(super) posted: [usize; 2],
    /// Calls of `poll`, to read idle completion queues now and then.
    pub(super) polls: u32,
    /// Posts refused with -FI_EAGAIN, in posting order (kept here to reuse the memory).
    pub(super) backlog: Vec<Deferred>,
    /// The lengths of the messages that completed receives posted with
    /// `Session::post_recv_up_to` in the session in progress, by token, until asked.
    pub(super) lens: Vec<(u32, usize)>,
    /// Scratch list of peers (reused).
    pub(super) peers: Vec<usize>,
    /// Same-host peers' processes, by rank, for noticing a peer that died.
    pub(super) watch: Vec<Option<Proc>>,
    /// This rank's doorbell (`block` with same-host peers).
    pub(super) bell: Option<Bell>,
    /// Same-host peers' doorbells, by rank (empty without a bell).
    pub(super) bells: Vec<Option<Bell>>,
    /// Why the transport may no longer be used.
    pub(super) broken: Option<String>,
    /// The descriptor of the collective in progress ([`Buffers::call`]).
    pub(super) call: Call,
    /// This transport's entry with the watchdog (`None`: disabled).
    pub(super) watched: Option<std::sync::Arc<Watched>>,
    pub(super) post_timeout: Duration,
    pub(super) progress: FabricProgress,
}

// SAFETY: the raw pointers inside are libfabric objects opened with FI_THREAD_DOMAIN,
// operation contexts the provider writes only while this transport progresses them,
// and doorbell mappings (process-wide shared memory, accessed only atomically); the
// transport is owned and used by one thread at a time (the communicator is Send, not
// Sync), which that threading model allows.
unsafe impl Send for FabricTransport {}

impl std::fmt::Debug for FabricTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FabricTransport")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("providers", &self.providers())
            .field("progress", &self.progress)
            .field("broken", &self.broken)
            .finish_non_exhaustive()
    }
}

impl FabricTransport {
    /// Opens this rank's endpoints; `net_node` is the IP the network provider binds.
    /// Returns the transport (not yet connected) and its endpoint names, slot by slot,
    /// to publish at bootstrap.
    pub(crate) fn open(
        rank: usize,
        size: usize,
        config: &FabricConfig,
        net_node: &str,
    ) -> Result<(FabricTransport, [Option<Vec<u8>>; 2])> {
        let want_fd = config.progress == FabricProgress::Block;
        if config
            .local_provider
            .as_deref()
            .is_some_and(|p| p.starts_with("shm"))
            || config.net_provider.starts_with("shm")
        {
            remove_stale_shm_regions();
        }
        let local = match &config.local_provider {
            Some(p) if size > 1 => Some(FabricEndpoint::open(p, None, want_fd)?),
            _ => None,
        };
        let bell = if want_fd && local.is_some() {
            Bell::create()
        } else {
            None
        };
        let node = (!config.net_provider.starts_with("shm")).then_some(net_node);
        let net = FabricEndpoint::open(&config.net_provider, node, want_fd)?;
        let names = [
            local.as_ref().map(|e| e.name.clone()),
            Some(net.name.clone()),
        ];
        let t = FabricTransport {
            rank,
            size,
            providers: [
                local.as_ref().map(|e| e.provider.clone()),
                Some(net.provider.clone()),
            ],
            eps: [local, Some(net)],
            routes: Vec::new(),
            ctxs: Vec::new(),
            posted: [0; 2],
            polls: 0,
            free: Vec::new(),
            backlog: Vec::new(),
            lens: Vec::new(),
            peers: Vec::new(),
            watch: vec![None; size],
            bell,
            bells: Vec::new(),
            broken: None,
            call: Call::NONE,
            watched: Watched::register(rank, config.watchdog),
            post_timeout: config.post_timeout,
            progress: config.progress,
        };
        Ok((t, names))
    }

    /// Sets the route to every peer: the local endpoint for peers on this rank's host
    /// (when both have one), the network endpoint otherwise. `hosts[r]` and `names[r]`
    /// are what rank r published.
    pub(crate) fn connect(
        &mut self,
        hosts: &[String],
        names: &[[Option<Vec<u8>>; 2]],
    ) -> Result<()> {
        let n = self.size;
        if hosts.len() != n || names.len() != n {
            return Err(Error::internal(
                "fabric connect: one host and name set per rank expected",
            ));
        }
        let me = self.rank;
        let mut routes = vec![
            Route {
                ep: NET as u8,
                addr: fi::FI_ADDR_NOTAVAIL
            };
            n
        ];
        // Local peers.
        if self.eps[LOCAL].is_some() {
            let local: Vec<usize> = (0..n)
                .filter(|&p| p != me && hosts[p] == hosts[me] && names[p][LOCAL].is_some())
                .collect();
            let list: Vec<(usize, &[u8])> = local
                .iter()
                .map(|&p| (p, names[p][LOCAL].as_deref().expect("filtered")))
                .collect();
            let addrs = self.eps[LOCAL]
                .as_mut()
                .expect("checked")
                .insert(&list, "local")?;
            for (p, a) in local.into_iter().zip(addrs) {
                routes[p] = Route {
                    ep: LOCAL as u8,
                    addr: a,
                };
            }
        }
        // Everyone else over the network provider; all ranks are inserted in rank order
        // so that the fabric address is the rank.
        let list: Vec<(usize, &[u8])> = (0..n)
            .map(|p| {
                names[p][NET]
                    .as_deref()
                    .map(|a| (p, a))
                    .ok_or_else(|| Error::InvalidUsage {
                        peer: Some(p),
                        message: format!(
                            "rank {p}'s bootstrap card: field `net` (its network address) is missing"
                        ),
                    })
            })
            .collect::<Result<_>>()?;
        let addrs = self.eps[NET]
            .as_mut()
            .expect("always open")
            .insert(&list, "net")?;
        for (p, a) in addrs.into_iter().enumerate() {
            if routes[p].addr == fi::FI_ADDR_NOTAVAIL {
                routes[p] = Route {
                    ep: NET as u8,
                    addr: a,
                };
            }
        }
        self.routes = routes;
        let local = self
            .routes
            .iter()
            .enumerate()
            .filter(|&(p, r)| p != me && r.ep == LOCAL as u8)
            .count();
        tracing::info!(
            rank = me,
            local_peers = local,
            providers = ?self.providers(),
            progress = %self.progress,
            "fabric transport connected"
        );
        Ok(())
    }

    /// This rank's doorbell file, for its card (`block` with a local provider).
    pub(crate) fn bell_path(&self) -> Option<String> {
        self.bell.as_ref().and_then(Bell::path)
    }

    /// Watches the processes of same-host peers (`procs[r]`: rank r's; `None`: not
    /// watched), so that a collective waiting for one that ended fails naming it, and
    /// the watchdog says which have ended.
    pub(crate) fn watch_processes(&mut self, procs: Vec<Option<Proc>>) {
        self.watch = procs;
        if let Some(w) = &self.watched {
            *w.procs.lock().unwrap_or_else(|p| p.into_inner()) = self
                .watch
                .iter()
                .enumerate()
                .filter_map(|(r, p)| p.map(|p| (r, p)))
                .collect();
        }
    }

    /// Maps the doorbells of the peers reached over shared memory (`paths[r]`: rank r's
    /// doorbell file), after [`FabricTransport::connect`]; nothing when this rank has no
    /// bell of its own.
    pub(crate) fn open_bells(&mut self, paths: &[Option<String>]) {
        if self.bell.is_some() {
            self.bells = (0..self.size)
                .map(|p| {
                    let local = p != self.rank && self.routes[p].ep == LOCAL as u8;
                    paths[p].as_deref().filter(|_| local).and_then(Bell::open)
                })
                .collect();
        }
    }

    /// The providers in use: (local, network).
    pub(crate) fn providers(&self) -> (Option<&str>, Option<&str>) {
        (
            self.providers[LOCAL].as_deref(),
            self.providers[NET].as_deref(),
        )
    }

    /// The provider that carries messages to `peer`.
    pub(crate) fn provider_to(&self, peer: usize) -> Option<&str> {
        let r = self.routes.get(peer)?;
        self.providers[r.ep as usize].as_deref()
    }

    pub(super) fn provider_name(&self, slot: u8) -> &str {
        self.providers[slot as usize].as_deref().unwrap_or("?")
    }

    /// A context for a new operation.
    pub(super) fn take_ctx(&mut self, d: &Deferred, ep: u8) -> *mut OpCtx {
        let (token, peer, is_send) = (d.token, d.peer, d.is_send);
        let i = match self.free.pop() {
            Some(i) => i as usize,
            None => {
                self.ctxs.push(Box::new(OpCtx {
                    // SAFETY: fi_context2 is an array of raw pointers; all-zero is valid.
                    fi: unsafe { std::mem::zeroed() },
                    token: 0,
                    peer: 0,
                    ep: 0,
                    is_send: false,
                    in_use: false,
                    index: 0,
                    len: 0,
                    region: Region::new(Buf::Send, 0, 0),
                    up_to: false,
                    tag: 0,
                }));
                let i = self.ctxs.len() - 1;
                self.ctxs[i].index = i as u32;
                i
            }
        };
        let c = &mut self.ctxs[i];
        c.token = token;
        c.peer = peer as u32;
        c.ep = ep;
        c.is_send = is_send;
        c.in_use = true;
        c.len = d.region.len;
        c.region = d.region;
        c.up_to = d.up_to;
        c.tag = d.tag;
        self.posted[ep as usize] += 1;
        &mut **c as *mut OpCtx
    }

    pub(super) fn in_flight(&self) -> usize {
        self.ctxs.len() - self.free.len()
    }

    /// The peers of every outstanding operation (posted or deferred), sorted, into
    /// `self.peers`.
    pub(super) fn collect_peers(&mut self) {
        self.peers.clear();
        self.peers.extend(
            self.ctxs
                .iter()
                .filter(|c| c.in_use)
                .map(|c| c.peer as usize),
        );
        self.peers.extend(self.backlog.iter().map(|d| d.peer));
        self.peers.sort_unstable();
        self.peers.dedup();
    }

    /// Whether an operation with `peer` is outstanding.
    pub(super) fn waits_for(&self, peer: usize) -> bool {
        self.ctxs
            .iter()
            .any(|c| c.in_use && c.peer as usize == peer)
            || self.backlog.iter().any(|d| d.peer == peer)
    }

    /// Wakes a same-host peer that sleeps on its bell.
    pub(super) fn ring(&self, peer: usize) {
        if let Some(Some(b)) = self.bells.get(peer) {
            b.ring();
        }
    }

    pub(super) fn release(&mut self, ctx: *mut OpCtx) {
        // SAFETY: the context is one of ours (see `poll`), alive in `self.ctxs`.
        let c = unsafe { &mut *ctx };
        if c.in_use {
            c.in_use = false;
            self.posted[c.ep as usize] = self.posted[c.ep as usize].saturating_sub(1);
            self.free.push(c.index);
        }
    }
}

impl Drop for FabricTransport {
    fn drop(&mut self) {
        // Closing an shm endpoint touches peers' shared memory too: watched.
        let eps = std::mem::take(&mut self.eps);
        watched(&self.watched, CALL_CLOSE, None, || drop(eps));
    }
}
