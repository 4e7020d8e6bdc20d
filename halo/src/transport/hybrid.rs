//! The hybrid transport: a job across hosts whose ranks on one host reach each other
//! over HALO's shared-memory rings and everyone else over libfabric.
//!
//! Each host's ranks (same host name and PID namespace, as the bootstrap cards say)
//! share one segment holding only their rings ([`ShmTransport::new_group`]); the
//! fabric transport is connected to every rank but carries only the pairs on
//! different hosts. A collective opens one session on each half over the same buffers
//! and routes every operation by its peer; the two halves never touch the same bytes
//! (each writes only its own receives' regions).
//!
//! - **Progress** drives both halves. **Waiting**: while only one half has
//!   operations outstanding, its own wait runs unchanged (the shared-memory bell, or
//!   the network completion queue's descriptor); while both have, the halves wait in
//!   turn, each for at most [`SLICE`], so neither half's traffic waits long for the
//!   other's sleep.
//! - **Failures** are each half's (dead-peer detection: the rings' half watches the
//!   processes of this host's ranks, the fabric half reports peers on other hosts
//!   through error completions or the timeout), and a failure of either is shared with
//!   the other ([`ShmSession::share_failure`], [`FabricSession::share_failure`]): both
//!   halves break, the fabric endpoints close (peers on other hosts see it), and after
//!   a size mismatch both deliver their queued sends and poison first.
//! - The counts of messages each half carried are logged (`debug`) when the transport
//!   is dropped, so a run can show that same-host pairs really went over the rings.

use super::CResult;
use super::fabric::{FabricSession, FabricTransport};
use super::raw::RawBuffers;
use super::shm::{self, ShmSession, ShmTransport};
use halo_collectives::{Buffers, CollectiveError, Region, Session, Transport};
use std::time::Duration;

/// The longest a half waits while the other also has operations outstanding.
pub(crate) const SLICE: Duration = Duration::from_micros(100);

/// Which half carries an operation.
const SHM: usize = 0;
const FABRIC: usize = 1;
/// `side` of a token that is not outstanding.
const NONE: u8 = u8::MAX;

/// Shared memory for the ranks of this host, libfabric for the others.
pub(crate) struct HybridTransport {
    rank: usize,
    size: usize,
    shm: ShmTransport,
    fabric: FabricTransport,
    /// Per peer: [`SHM`] or [`FABRIC`].
    route: Vec<u8>,
    /// Messages posted per half (sends and receives), for the log.
    counts: [u64; 2],
}

impl std::fmt::Debug for HybridTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HybridTransport")
            .field("rank", &self.rank)
            .field("shm", &self.shm)
            .field("fabric", &self.fabric)
            .finish_non_exhaustive()
    }
}

impl HybridTransport {
    /// The transport over `shm` (this host's ranks) and `fabric` (connected to every
    /// rank; used for the others).
    pub(crate) fn new(shm: ShmTransport, fabric: FabricTransport) -> HybridTransport {
        let (rank, size) = (shm.rank(), shm.size());
        let route: Vec<u8> = (0..size)
            .map(|p| if shm.reaches(p) { SHM } else { FABRIC } as u8)
            .collect();
        let local: Vec<usize> = (0..size).filter(|&p| shm.reaches(p)).collect();
        tracing::info!(
            rank,
            size,
            shm_peers = ?local,
            fabric = ?fabric.providers(),
            "hybrid transport ready: shared memory for this host's ranks, the fabric for the others"
        );
        HybridTransport {
            rank,
            size,
            shm,
            fabric,
            route,
            counts: [0; 2],
        }
    }

    /// What carries messages to `peer`: [`shm::PROVIDER`] for this host's ranks, the
    /// fabric's provider for the others.
    pub(crate) fn provider_to(&self, peer: usize) -> Option<&str> {
        match self.route.get(peer)? {
            _ if peer == self.rank => None,
            &r if r as usize == SHM => Some(shm::PROVIDER),
            _ => self.fabric.provider_to(peer),
        }
    }

    /// [`ShmTransport::try_send_now`] to a rank of this host (never one over the
    /// fabric: `reaches` is false for those).
    pub(crate) fn try_send_now(&mut self, peer: usize, tag: u64, bytes: &[u8]) -> bool {
        self.shm.try_send_now(peer, tag, bytes)
    }
}

impl Drop for HybridTransport {
    fn drop(&mut self) {
        tracing::debug!(
            rank = self.rank,
            shm_messages = self.counts[SHM],
            fabric_messages = self.counts[FABRIC],
            "hybrid transport: messages posted per half"
        );
    }
}

impl Transport for HybridTransport {
    type Session<'a> = HybridSession<'a>;

    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn begin<'a>(&'a mut self, tag_base: u64, bufs: Buffers<'a>) -> CResult<HybridSession<'a>> {
        let call = bufs.call;
        let raw = RawBuffers::new(bufs);
        let second = raw.alias();
        let shm = self.shm.begin_raw(tag_base, raw, call)?;
        let fabric = self.fabric.begin_raw(tag_base, second, call)?;
        Ok(HybridSession {
            shm,
            fabric,
            route: &self.route,
            counts: &mut self.counts,
            side: Vec::new(),
            pending: [0; 2],
            turn: SHM,
        })
    }
}

/// One collective's operations on both halves.
pub(crate) struct HybridSession<'a> {
    shm: ShmSession<'a>,
    fabric: FabricSession<'a>,
    route: &'a [u8],
    counts: &'a mut [u64; 2],
    /// Per token: the half its outstanding operation is on ([`NONE`]: none).
    side: Vec<u8>,
    /// Operations outstanding per half.
    pending: [usize; 2],
    /// The half that waits next while both have operations outstanding.
    turn: usize,
}

impl std::fmt::Debug for HybridSession<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HybridSession")
            .field("shm", &self.shm)
            .field("fabric", &self.fabric)
            .field("pending", &self.pending)
            .finish_non_exhaustive()
    }
}

/// The kinds of operation [`HybridSession::post`] routes to a half.
#[derive(Debug, Clone, Copy)]
enum Op {
    Send,
    Recv,
    RecvUpTo,
}

impl HybridSession<'_> {
    /// The half that reaches `peer`.
    fn half(&self, peer: usize) -> CResult<usize> {
        self.route
            .get(peer)
            .map(|&r| r as usize)
            .ok_or_else(|| CollectiveError::Internal(format!("no route to rank {peer}")))
    }

    /// Passes a failure of half `from` to the other half and returns it.
    fn shared<T>(&mut self, from: usize, r: CResult<T>) -> CResult<T> {
        if let Err(e) = &r {
            if from == SHM {
                self.fabric.share_failure(e);
            } else {
                self.shm.share_failure(e);
            }
        }
        r
    }

    /// Notes that the operation `token` went to half `h`.
    fn posted(&mut self, token: u32, h: usize) {
        let t = token as usize;
        if self.side.len() <= t {
            self.side.resize(t + 1, NONE);
        }
        if self.side[t] == NONE {
            self.pending[h] += 1;
        }
        self.side[t] = h as u8;
        self.counts[h] += 1;
    }

    /// Notes that the operation `token` is no longer outstanding.
    fn finished(&mut self, token: u32) {
        if let Some(s) = self.side.get_mut(token as usize)
            && *s != NONE
        {
            self.pending[*s as usize] -= 1;
            *s = NONE;
        }
    }

    fn post(&mut self, op: Op, peer: usize, tag: u64, region: Region, token: u32) -> CResult<()> {
        let h = self.half(peer)?;
        let half: &mut dyn Session = if h == SHM {
            &mut self.shm
        } else {
            &mut self.fabric
        };
        let r = match op {
            Op::Send => half.post_send(peer, tag, region, token),
            Op::Recv => half.post_recv(peer, tag, region, token),
            Op::RecvUpTo => half.post_recv_up_to(peer, tag, region, token),
        };
        self.shared(h, r)?;
        self.posted(token, h);
        Ok(())
    }
}

impl Session for HybridSession<'_> {
    fn post_send(&mut self, peer: usize, tag: u64, region: Region, token: u32) -> CResult<()> {
        self.post(Op::Send, peer, tag, region, token)
    }

    fn post_recv(&mut self, peer: usize, tag: u64, region: Region, token: u32) -> CResult<()> {
        self.post(Op::Recv, peer, tag, region, token)
    }

    fn post_recv_up_to(
        &mut self,
        peer: usize,
        tag: u64,
        region: Region,
        token: u32,
    ) -> CResult<()> {
        self.post(Op::RecvUpTo, peer, tag, region, token)
    }

    fn received_len(&mut self, token: u32) -> Option<usize> {
        // Tokens are unique within the session: at most one half knows this one.
        self.shm
            .received_len(token)
            .or_else(|| self.fabric.received_len(token))
    }

    fn post_poison(&mut self, peer: usize, tag: u64) -> CResult<()> {
        match self.half(peer)? {
            SHM => self.shm.post_poison(peer, tag),
            _ => self.fabric.post_poison(peer, tag),
        }
    }

    fn copy(&mut self, src: Region, dst: Region) -> CResult<()> {
        self.shm.copy(src, dst)
    }

    fn read(&mut self, region: Region, out: &mut [u8]) -> CResult<()> {
        // Both halves view the same buffers; only the fabric's receives land outside
        // this rank's calls, and its half checks them.
        self.fabric.read(region, out)
    }

    fn progress(&mut self, completed: &mut Vec<u32>) -> CResult<()> {
        let from = completed.len();
        // Both halves, always: the rings' half also drains messages that arrive
        // before their receives are posted, which keeps same-host peers' large sends
        // moving.
        let r = self.shm.progress(completed);
        self.shared(SHM, r)?;
        let r = self.fabric.progress(completed);
        self.shared(FABRIC, r)?;
        for &token in &completed[from..] {
            self.finished(token);
        }
        Ok(())
    }

    fn test(&mut self, token: u32) -> CResult<bool> {
        let h = match self.side.get(token as usize) {
            Some(&s) if s != NONE => s as usize,
            // Not outstanding: completed (or never posted).
            _ => return Ok(true),
        };
        let r = if h == SHM {
            self.shm.test(token)
        } else {
            self.fabric.test(token)
        };
        let done = self.shared(h, r)?;
        if done {
            self.finished(token);
        }
        Ok(done)
    }

    fn cancel(&mut self, token: u32) -> CResult<()> {
        let h = match self.side.get(token as usize) {
            Some(&s) if s != NONE => s as usize,
            _ => return Ok(()),
        };
        let r = if h == SHM {
            self.shm.cancel(token)
        } else {
            self.fabric.cancel(token)
        };
        self.finished(token);
        self.shared(h, r)
    }

    fn wait(&mut self, max: Duration) -> CResult<()> {
        let h = match (self.pending[SHM] > 0, self.pending[FABRIC] > 0) {
            (true, false) => {
                let r = self.shm.wait(max);
                return self.shared(SHM, r);
            }
            (false, true) => {
                let r = self.fabric.wait(max);
                return self.shared(FABRIC, r);
            }
            _ => {
                let h = self.turn;
                self.turn = 1 - h;
                h
            }
        };
        let slice = max.min(SLICE);
        if h == SHM {
            let r = self.shm.wait(slice);
            self.shared(SHM, r)
        } else {
            let r = self.fabric.wait(slice);
            self.shared(FABRIC, r)
        }
    }
}
