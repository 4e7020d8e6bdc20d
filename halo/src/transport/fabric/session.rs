//! One collective's operations: posting (with the backlog of posts the provider
//! refused for now), waiting, the [`Session`] impl, and the [`Transport`] impl that
//! begins one.

use super::endpoint::close;
use super::transport::{Deferred, FabricTransport};
use super::watchdog::{CALL_TRECV, CALL_TSEND, watched};
use super::{CResult, EAGAIN, FabricProgress, LOCAL, NET, WAIT};
use crate::host::proc::has_ended;
use crate::host::wait::Step;
use crate::transport::FLUSH_SENDS;
use crate::transport::raw::RawBuffers;
use halo_collectives::{Buf, Buffers, Call, CollectiveError, Region, Session, Transport};
use halo_fabric_sys as fi;
use std::ffi::c_void;
use std::ptr;
use std::time::{Duration, Instant};

/// How long the cancelled operations of a failed collective may take to come back
/// before the endpoints are closed under them.
const CANCEL_DRAIN: Duration = Duration::from_millis(100);

/// The token of poison messages (never a step of a schedule, never reported).
const POISON_TOKEN: u32 = u32::MAX;

/// How often, while waiting, the processes of same-host peers with outstanding
/// operations are looked at.
const WATCH_EVERY: Duration = Duration::from_millis(50);

/// How long completions are still read after a peer's process was found ended, for
/// what it sent before it ended.
const LAST_WORDS: Duration = Duration::from_millis(20);

/// One collective's operations on the fabric transport.
pub(crate) struct FabricSession<'a> {
    t: &'a mut FabricTransport,
    bufs: RawBuffers<'a>,
    tag_base: u64,
    mrs: Vec<*mut fi::fid_mr>,
    /// Memory descriptors per endpoint slot per buffer (send, recv, scratch).
    descs: [[*mut c_void; 3]; 2],
    ready: Vec<u32>,
    /// The first error this session returned (why the transport breaks on drop).
    error: Option<String>,
    /// Whether that error is a size mismatch with a peer (see [`FLUSH_SENDS`]).
    mismatch: bool,
    /// When the processes of the peers waited for were last looked at.
    last_watch: Instant,
}

impl std::fmt::Debug for FabricSession<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FabricSession")
            .field("rank", &self.t.rank)
            .field("in_flight", &self.t.in_flight())
            .field("deferred", &self.t.backlog.len())
            .finish_non_exhaustive()
    }
}

/// A buffer's index in [`FabricSession`]'s descriptors (and registration keys).
fn buf_index(b: Buf) -> usize {
    match b {
        Buf::Send => 0,
        Buf::Recv => 1,
        Buf::Scratch => 2,
    }
}

impl<'a> FabricSession<'a> {
    /// Begins a collective on `t` over `bufs` (tags above `tag_base`): registers the
    /// buffers with the endpoints that require it.
    pub(super) fn begin(
        t: &'a mut FabricTransport,
        bufs: RawBuffers<'a>,
        tag_base: u64,
    ) -> CResult<FabricSession<'a>> {
        let mut session = FabricSession {
            t,
            bufs,
            tag_base,
            mrs: Vec::new(),
            descs: [[ptr::null_mut(); 3]; 2],
            ready: Vec::new(),
            error: None,
            mismatch: false,
            last_watch: Instant::now(),
        };
        session.t.lens.clear();
        session.register()?;
        Ok(session)
    }
}

impl FabricSession<'_> {
    /// Registers the buffers with the endpoints that require it.
    fn register(&mut self) -> CResult<()> {
        for slot in [LOCAL, NET] {
            let Some(e) = self.t.eps[slot].as_ref() else {
                continue;
            };
            if !e.needs_registration() {
                continue;
            }
            for b in [Buf::Send, Buf::Recv, Buf::Scratch] {
                let (base, len) = self.bufs.base(b);
                if len == 0 {
                    continue;
                }
                let key = (slot * 3 + buf_index(b)) as u64 + 1;
                let (mr, desc) = e
                    .register(base, len, key)
                    .map_err(|err| CollectiveError::System(err.to_string()))?;
                self.mrs.push(mr);
                self.descs[slot][buf_index(b)] = desc;
            }
        }
        Ok(())
    }

    /// Keeps the first error (for the reason the transport breaks) and returns it.
    fn note<T>(&mut self, r: CResult<T>) -> CResult<T> {
        if let Err(e) = &r
            && self.error.is_none()
        {
            self.error = Some(e.to_string());
            self.mismatch = matches!(e, CollectiveError::Mismatch { .. });
        }
        r
    }

    /// Takes `e`, the failure of the hybrid transport's other half in this
    /// collective, as this session's own: its drop then breaks the transport (closing
    /// the endpoints, so peers on other hosts see it) and, after a size mismatch,
    /// first delivers its outstanding sends, as after a failure of its own.
    pub(crate) fn share_failure(&mut self, e: &CollectiveError) {
        if self.error.is_none() {
            self.error = Some(e.to_string());
            self.mismatch = matches!(e, CollectiveError::Mismatch { .. });
        }
    }

    /// After a size mismatch: lets this rank's sends that are still outstanding reach
    /// their receivers (for at most `limit`), so that a peer whose call differs receives
    /// this rank's view of the sizes and fails with the mismatch itself, instead of
    /// waiting for a message that never comes. Deferred receives are dropped; no new
    /// one is posted.
    fn flush_sends(&mut self, limit: Duration) {
        let deadline = Instant::now() + limit;
        self.t.backlog.retain(|d| d.is_send);
        let mut sink = Vec::new();
        while Instant::now() < deadline
            && (self.t.ctxs.iter().any(|c| c.in_use && c.is_send) || !self.t.backlog.is_empty())
        {
            // Errors (more mismatches, the peer's own failure) are expected here.
            let _ = self.t.poll(&mut sink);
            let _ = self.retry_deferred();
            sink.clear();
            std::thread::yield_now();
        }
    }

    fn full_tag(&self, tag: u64) -> CResult<u64> {
        crate::transport::full_tag(self.tag_base, tag)
    }

    /// Posts an operation, or defers it when the provider refuses it for now (or
    /// when an earlier operation with the same peer is still deferred: per peer,
    /// operations reach the provider in posting order).
    fn post(
        &mut self,
        peer: usize,
        token: u32,
        is_send: bool,
        region: Region,
        tag: u64,
        up_to: bool,
    ) -> CResult<()> {
        if peer >= self.t.size || peer == self.t.rank {
            return Err(CollectiveError::Internal(format!(
                "no route to rank {peer}"
            )));
        }
        let tag = self.full_tag(tag)?;
        let d = Deferred {
            peer,
            token,
            is_send,
            region,
            tag,
            since: Instant::now(),
            poison: false,
            up_to,
        };
        if self.t.backlog.iter().any(|b| b.peer == peer) || !self.try_post(&d)? {
            self.t.backlog.push(d);
        }
        Ok(())
    }

    /// Hands one operation to the provider; `Ok(false)` when it refused with
    /// `-FI_EAGAIN`.
    fn try_post(&mut self, d: &Deferred) -> CResult<bool> {
        let route = self.t.routes[d.peer];
        let ptr_ = if d.is_send {
            self.bufs.locate(d.region)?.cast_mut()
        } else {
            self.bufs.locate_write(d.region)?
        };
        let desc = self.descs[route.ep as usize][buf_index(d.region.buf)];
        let Some(ep) = self.t.eps[route.ep as usize].as_ref().map(|e| e.ep) else {
            return Err(CollectiveError::Internal(format!(
                "no endpoint for rank {}",
                d.peer
            )));
        };
        let ctx = self.t.take_ctx(d, route.ep);
        let data = self.t.eps[route.ep as usize].as_ref().map_or(0, |e| {
            let data = if d.poison {
                e.poison_data(self.t.call)
            } else {
                e.call_data(self.t.call)
            };
            // A message without a descriptor (point to point) goes unstamped, as
            // `fi_tsend`: `shm` sends the smallest messages with data 0.5 us slower.
            if data == 0 {
                0
            } else {
                e.stamp(data, self.t.rank)
            }
        });
        let call = if d.is_send { CALL_TSEND } else { CALL_TRECV };
        // SAFETY: `ptr_ .. + region.len` lies in a buffer this session borrows until it
        // is dropped, and the drop cancels every operation and, if any is not back,
        // closes the endpoints first; the context is a live boxed OpCtx whose first
        // field is the fi_context2 the provider may use; `desc` is NULL or the
        // descriptor of that buffer's registration on this endpoint.
        let ret = watched(&self.t.watched, call, Some(d.peer), || unsafe {
            if d.is_send && data != 0 {
                fi::fi_tsenddata(
                    ep,
                    ptr_.cast_const().cast(),
                    d.region.len,
                    desc,
                    data,
                    route.addr,
                    d.tag,
                    ctx.cast(),
                )
            } else if d.is_send {
                fi::fi_tsend(
                    ep,
                    ptr_.cast_const().cast(),
                    d.region.len,
                    desc,
                    route.addr,
                    d.tag,
                    ctx.cast(),
                )
            } else {
                fi::fi_trecv(
                    ep,
                    ptr_.cast(),
                    d.region.len,
                    desc,
                    route.addr,
                    d.tag,
                    0,
                    ctx.cast(),
                )
            }
        });
        if ret == 0 {
            if d.is_send {
                self.t.ring(d.peer);
            }
            return Ok(true);
        }
        self.t.release(ctx);
        if ret == EAGAIN {
            return Ok(false);
        }
        Err(CollectiveError::System(format!(
            "{} rank {} over {}: {}",
            if d.is_send {
                "fi_tsend to"
            } else {
                "fi_trecv from"
            },
            d.peer,
            self.t.provider_name(route.ep),
            fi::strerror(ret as i64)
        )))
    }

    /// Retries the deferred posts in order, skipping the later ones of a peer whose
    /// earlier one is refused again.
    fn retry_deferred(&mut self) -> CResult<()> {
        if self.t.backlog.is_empty() {
            return Ok(());
        }
        let mut blocked = std::mem::take(&mut self.t.peers);
        blocked.clear();
        let mut out = Ok(());
        let mut i = 0;
        while i < self.t.backlog.len() {
            let d = self.t.backlog[i];
            if blocked.contains(&d.peer) {
                i += 1;
                continue;
            }
            match self.try_post(&d) {
                Ok(true) => {
                    self.t.backlog.remove(i);
                }
                Ok(false) => {
                    if d.since.elapsed() > self.t.post_timeout {
                        out = Err(CollectiveError::Remote {
                            peer: d.peer,
                            message: format!(
                                "rank {} has not accepted a message over {} for {:?} (it does \
                                 not read its completion queue: busy outside HALO, or hung)",
                                d.peer,
                                self.t.provider_name(self.t.routes[d.peer].ep),
                                self.t.post_timeout
                            ),
                        });
                        break;
                    }
                    blocked.push(d.peer);
                    i += 1;
                }
                Err(e) => {
                    out = Err(e);
                    break;
                }
            }
        }
        self.t.peers = blocked;
        out
    }

    /// Every `WATCH_EVERY` while waiting: fails with `Remote` when the process of a
    /// same-host peer that an outstanding operation needs has ended, after reading
    /// what it may have sent before.
    fn watch_peers(&mut self) -> CResult<()> {
        if self.last_watch.elapsed() < WATCH_EVERY || self.t.watch.iter().all(Option::is_none) {
            return Ok(());
        }
        self.last_watch = Instant::now();
        self.t.collect_peers();
        let ended = self
            .t
            .peers
            .iter()
            .find_map(|&p| self.t.watch[p].filter(|&w| has_ended(w)).map(|w| (p, w)));
        let Some((peer, proc_)) = ended else {
            return Ok(());
        };
        // Its last messages may still be on the way in: read completions for a moment.
        let until = Instant::now() + LAST_WORDS;
        while Instant::now() < until && self.t.waits_for(peer) {
            let mut done = std::mem::take(&mut self.ready);
            let r = self.t.poll(&mut done).and_then(|()| self.retry_deferred());
            self.ready = done;
            r?;
            std::thread::yield_now();
        }
        if !self.t.waits_for(peer) {
            // It did all this collective needs from it; another peer may still fail.
            self.t.watch[peer] = None;
            return Ok(());
        }
        Err(CollectiveError::Remote {
            peer,
            message: format!(
                "rank {peer} (process {} on this host) ended while rank {} was waiting for it",
                proc_.pid, self.t.rank
            ),
        })
    }
}

impl FabricSession<'_> {
    /// `block`: yields while the bound is short, then sleeps on this rank's bell while
    /// it waits only for same-host peers that have one (bounded as `sleep`: a ring
    /// only ends the sleep early), on the completion queues' descriptors otherwise.
    fn block(&mut self, max: Duration) -> CResult<()> {
        let Step::Sleep(timeout) = WAIT.step(max, max) else {
            std::thread::yield_now();
            return Ok(());
        };
        let bells = &self.t.bells;
        let belled = !bells.is_empty()
            && self.t.backlog.is_empty()
            && self.t.ctxs.iter().any(|c| c.in_use)
            && self
                .t
                .ctxs
                .iter()
                .filter(|c| c.in_use)
                .all(|c| bells.get(c.peer as usize).is_some_and(Option::is_some));
        if belled && let Some(bell) = self.t.bell.take() {
            // Bounded as `sleep`: shm protocol steps that complete nothing (segmented
            // copies without CMA) ring no bell.
            let r = bell.sleep(timeout, || {
                let mut done = std::mem::take(&mut self.ready);
                let r = self.t.poll(&mut done);
                let any = !done.is_empty();
                self.ready = done;
                r.map(|()| any)
            });
            self.t.bell = Some(bell);
            return self.note(r);
        }
        self.t.block_fd(max);
        Ok(())
    }
}

impl Session for FabricSession<'_> {
    fn post_send(&mut self, peer: usize, tag: u64, region: Region, token: u32) -> CResult<()> {
        let r = self.post(peer, token, true, region, tag, false);
        self.note(r)
    }

    fn post_recv(&mut self, peer: usize, tag: u64, region: Region, token: u32) -> CResult<()> {
        let r = self.post(peer, token, false, region, tag, false);
        self.note(r)
    }

    fn post_recv_up_to(
        &mut self,
        peer: usize,
        tag: u64,
        region: Region,
        token: u32,
    ) -> CResult<()> {
        let r = self.post(peer, token, false, region, tag, true);
        self.note(r)
    }

    fn received_len(&mut self, token: u32) -> Option<usize> {
        crate::transport::take_len(&mut self.t.lens, token)
    }

    fn post_poison(&mut self, peer: usize, tag: u64) -> CResult<()> {
        let can = self
            .t
            .routes
            .get(peer)
            .and_then(|r| self.t.eps[r.ep as usize].as_ref())
            .is_some_and(|e| e.carries_data());
        if !can || peer == self.t.rank {
            return Ok(());
        }
        let d = Deferred {
            peer,
            token: POISON_TOKEN,
            is_send: true,
            region: Region::new(Buf::Send, 0, 0),
            tag: self.full_tag(tag)?,
            since: Instant::now(),
            poison: true,
            up_to: false,
        };
        if self.t.backlog.iter().any(|b| b.peer == peer) || !self.try_post(&d)? {
            self.t.backlog.push(d);
        }
        Ok(())
    }

    fn copy(&mut self, src: Region, dst: Region) -> CResult<()> {
        self.bufs.copy(src, dst)
    }

    fn read(&mut self, region: Region, out: &mut [u8]) -> CResult<()> {
        // The provider writes a posted receive's buffer whenever it progresses (some
        // have threads of their own): no read of a region one may still write.
        let busy = self.t.ctxs.iter().find(|c| {
            c.in_use
                && !c.is_send
                && c.region.buf == region.buf
                && c.region.len > 0
                && region.len > 0
                && c.region.offset < region.end()
                && region.offset < c.region.end()
        });
        if let Some(c) = busy {
            return Err(CollectiveError::Internal(format!(
                "read {region} while receive {} into {} is outstanding",
                c.token, c.region
            )));
        }
        self.bufs.read(region, out)
    }

    fn progress(&mut self, completed: &mut Vec<u32>) -> CResult<()> {
        completed.append(&mut self.ready);
        let r = self.t.poll(completed).and_then(|()| self.retry_deferred());
        self.note(r)
    }

    fn test(&mut self, token: u32) -> CResult<bool> {
        let mut done = std::mem::take(&mut self.ready);
        let r = self.t.poll(&mut done).and_then(|()| self.retry_deferred());
        self.ready = done;
        self.note(r)?;
        if let Some(i) = self.ready.iter().position(|&t| t == token) {
            self.ready.swap_remove(i);
            return Ok(true);
        }
        Ok(!self.t.ctxs.iter().any(|c| c.in_use && c.token == token)
            && !self.t.backlog.iter().any(|d| d.token == token))
    }

    fn cancel(&mut self, token: u32) -> CResult<()> {
        self.t.backlog.retain(|d| d.token != token);
        for i in 0..self.t.ctxs.len() {
            if self.t.ctxs[i].in_use && self.t.ctxs[i].token == token {
                self.t.cancel_ctx(i);
            }
        }
        Ok(())
    }

    fn wait(&mut self, max: Duration) -> CResult<()> {
        if !self.ready.is_empty() {
            return Ok(());
        }
        let r = self.watch_peers();
        self.note(r)?;
        match self.t.progress {
            FabricProgress::Spin => std::hint::spin_loop(),
            FabricProgress::Yield => std::thread::yield_now(),
            FabricProgress::Sleep => match WAIT.step(max, max) {
                Step::Sleep(timeout) => std::thread::sleep(timeout),
                Step::Spin | Step::Yield => std::thread::yield_now(),
            },
            FabricProgress::Block => return self.block(max),
        }
        Ok(())
    }
}

impl Drop for FabricSession<'_> {
    fn drop(&mut self) {
        // Operations still outstanding mean the collective did not complete (the
        // engine returns success only when every step has): the transport breaks.
        let failed = self.t.in_flight() > 0 || !self.t.backlog.is_empty() || self.error.is_some();
        let mut why = String::new();
        if failed {
            self.t.collect_peers();
            let (posted, deferred) = (self.t.in_flight(), self.t.backlog.len());
            why = match &self.error {
                Some(e) => format!("a collective failed on this rank ({e})"),
                None => format!(
                    "a collective did not complete on this rank (timed out or aborted with \
                     {} operations outstanding, with ranks {:?})",
                    posted + deferred,
                    self.t.peers
                ),
            };
            if self.mismatch {
                self.flush_sends(FLUSH_SENDS);
            }
            let left = self.t.cancel_all(CANCEL_DRAIN);
            tracing::warn!(
                rank = self.t.rank,
                left,
                "{why}; closing the fabric endpoints"
            );
        }
        // Registrations go before the endpoints they may be bound to.
        for mr in self.mrs.drain(..) {
            close(mr.cast(), "memory registration");
        }
        if failed {
            // Closing the endpoints guarantees that the provider no longer touches the
            // caller's buffers, whatever it still held.
            self.t.break_down(why);
        }
    }
}

impl Transport for FabricTransport {
    type Session<'a> = FabricSession<'a>;

    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn begin<'a>(&'a mut self, tag_base: u64, bufs: Buffers<'a>) -> CResult<FabricSession<'a>> {
        let call = bufs.call;
        self.begin_raw(tag_base, RawBuffers::new(bufs), call)
    }
}

impl FabricTransport {
    /// [`Transport::begin`] over buffers already taken as raw pointers (the hybrid
    /// transport's, whose other half uses the same buffers for other peers).
    pub(crate) fn begin_raw<'a>(
        &'a mut self,
        tag_base: u64,
        raw: RawBuffers<'a>,
        call: Call,
    ) -> CResult<FabricSession<'a>> {
        if let Some(why) = &self.broken {
            return Err(CollectiveError::InvalidUsage(format!(
                "rank {}: this communicator can no longer be used: {why}; drop it and create \
                 a new one (HALO_TIMEOUT_MS sets the timeout)",
                self.rank
            )));
        }
        if self.routes.len() != self.size {
            return Err(CollectiveError::Internal(
                "fabric transport used before connect".into(),
            ));
        }
        self.call = call;
        FabricSession::begin(self, raw, tag_base)
    }
}
