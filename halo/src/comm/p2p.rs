//! Point-to-point: [`Communicator::send`], [`Communicator::recv`],
//! [`Communicator::send_recv`], and the tag layout every call of a communicator uses.
//!
//! # Tags
//!
//! A message tag is 64 bits. The low [`TAG_BITS`] (48) belong to the schedule; the 16
//! above them are the communicator's:
//!
//! ```text
//!  63       59  58   57        48 47                                0
//! +-----------+----+------------+-----------------------------------+
//! | comm id   |p2p | sequence   | schedule tag / p2p message number |
//! +-----------+----+------------+-----------------------------------+
//! ```
//!
//! - **comm id** (5 bits): 0 for a communicator made at init; a sub-communicator gets
//!   the lowest id that no member rank has in use (see [`Communicator::split`]), so two
//!   communicators that share a pair of ranks never share an id, and parent and
//!   children never match each other's messages.
//! - **sequence** (10 bits): collectives are called by every rank in the same order, so
//!   each call takes the next number of a per-communicator counter that all ranks
//!   advance together (one per call for all-gather, all-reduce, reduce-scatter,
//!   broadcast, gather, scatter and split — the rounds of a reduction are told apart by
//!   the schedule tag — three for all-to-all-v).
//!   It wraps at 1024, far more than ranks of one communicator can drift apart.
//! - **p2p**: point-to-point calls are made by two ranks only, so they cannot take a
//!   sequence number. They set this bit (sequence 0) and split the low 48 bits into
//!   the user's tag and a message number per ordered pair and tag:
//!
//!   ```text
//!    47                 24 23                  0
//!   +---------------------+---------------------+
//!   | user tag (24 bits)  | message number      |
//!   +---------------------+---------------------+
//!   ```
//!
//!   The k-th send from a to b with tag t carries (t, k) and matches the k-th receive
//!   at b from a with tag t, whatever the transport's ordering; messages with other
//!   tags are independent of it. User tags are `0 ..= `[`MAX_USER_TAG`] (2^24 - 1; a
//!   larger one is [`Error::InvalidArgument`]); [`Communicator::send`] and
//!   [`Communicator::recv`] use tag 0. Message numbers wrap at 2^24, far more than
//!   can be outstanding between two ranks. A count advances only when its call
//!   succeeds, so a failed call, retried on both sides, matches again.

use super::{Communicator, Core, SEQ_BITS, exec_options, overlaps};
use crate::error::{Error, Result};
use crate::transport::MAX_COMMS;
use halo_collectives::{Buf, Buffers, Region, ScheduleBuilder, TAG_BITS};

/// The point-to-point bit of a tag.
const P2P_FLAG: u64 = 1 << (TAG_BITS + SEQ_BITS);
/// Where the communicator id starts.
pub(super) const COMM_SHIFT: u32 = TAG_BITS + SEQ_BITS + 1;
const _: () = assert!(1u64 << (64 - COMM_SHIFT) == MAX_COMMS as u64);
/// Bits of a point-to-point message number (below the user tag).
const P2P_COUNT_BITS: u32 = 24;
/// Point-to-point message numbers wrap at 2^24.
const P2P_COUNT_MASK: u64 = (1 << P2P_COUNT_BITS) - 1;
/// The largest user tag of [`Communicator::send_tagged`] and
/// [`Communicator::recv_tagged`]: 2^24 - 1 (the bits of a tag between the message
/// number and [`TAG_BITS`]).
pub const MAX_USER_TAG: u32 = (1 << (TAG_BITS - P2P_COUNT_BITS)) - 1;

/// The low 48 bits of a point-to-point message's tag: user tag and message number.
fn p2p_tag(user: u32, count: u64) -> u64 {
    u64::from(user) << P2P_COUNT_BITS | (count & P2P_COUNT_MASK)
}

/// Refuses a user tag above [`MAX_USER_TAG`].
fn check_tag(tag: u32, what: &str) -> Result<()> {
    if tag > MAX_USER_TAG {
        return Err(Error::invalid_argument(format!(
            "{what}: tag {tag} out of range (0 ..= {MAX_USER_TAG})"
        )));
    }
    Ok(())
}

impl Core {
    fn check_peer(&self, peer: usize, what: &str) -> Result<()> {
        if peer >= self.size {
            return Err(Error::invalid_argument_peer(
                peer,
                format!("{what}: rank {peer} out of range for {} ranks", self.size),
            ));
        }
        Ok(())
    }
}

/// Lone sends and receives whose one-step schedules are kept (most recent first).
const P2P_CACHED: usize = 4;

impl super::Ext {
    /// Messages sent to (`sent`) or received from `peer` with user tag `tag` so far.
    fn count(&self, sent: bool, peer: usize, tag: u32) -> u64 {
        match (tag, sent) {
            (0, true) => self.sent[peer],
            (0, false) => self.received[peer],
            _ => self.tagged.get(&(sent, peer, tag)).copied().unwrap_or(0),
        }
    }

    /// Makes room for the counts of `n` ranks (the first point-to-point call).
    fn count_ranks(&mut self, n: usize) {
        if self.sent.len() != n {
            self.sent.resize(n, 0);
            self.received.resize(n, 0);
        }
    }

    /// The counter of [`Self::count`]'s kind.
    fn counter(&mut self, sent: bool, peer: usize, tag: u32) -> &mut u64 {
        match (tag, sent) {
            (0, true) => &mut self.sent[peer],
            (0, false) => &mut self.received[peer],
            _ => self.tagged.entry((sent, peer, tag)).or_insert(0),
        }
    }

    /// Counts one more message of [`Self::count`]'s kind.
    fn advance(&mut self, sent: bool, peer: usize, tag: u32) {
        let c = self.counter(sent, peer, tag);
        *c = c.wrapping_add(1);
    }

    /// Takes back one [`Self::advance`] (a batch that failed).
    fn retreat(&mut self, sent: bool, peer: usize, tag: u32) {
        let c = self.counter(sent, peer, tag);
        *c = c.wrapping_sub(1);
    }

    /// The one-step schedule of a lone send (`key.0`) or receive of `key.2` bytes with
    /// rank `key.1`, tag 0; built once, then kept among the last [`P2P_CACHED`].
    fn p2p_schedule(
        &mut self,
        me: usize,
        n: usize,
        name: &'static str,
        key: (bool, usize, usize),
    ) -> &halo_collectives::Schedule {
        match self.p2p.iter().position(|(k, _)| *k == key) {
            Some(0) => {}
            Some(i) => {
                let entry = self.p2p.remove(i);
                self.p2p.insert(0, entry);
            }
            None => {
                let (is_send, peer, len) = key;
                let mut b = ScheduleBuilder::new(me, n, name);
                if is_send {
                    b.send(peer, 0, Region::new(Buf::Send, 0, len), &[]);
                } else {
                    b.recv(peer, 0, Region::new(Buf::Recv, 0, len), &[]);
                }
                self.p2p.truncate(P2P_CACHED - 1);
                self.p2p.insert(0, (key, b.finish()));
            }
        }
        &self.p2p[0].1
    }
}

impl Communicator {
    /// Sends `buf` to rank `peer` (NCCL's `ncclSend`, MPI's `MPI_Send`), blocking until
    /// the transport is done with `buf`.
    ///
    /// Messages between a pair of ranks match in order: the k-th `send` from a to b
    /// meets the k-th [`Communicator::recv`] at b from a, which must have the same
    /// length (zero included: an empty message is sent and must be received). Only the
    /// two ranks take part.
    ///
    /// The in-process transport is rendezvous: a send completes when the receiver has
    /// taken the bytes, so two ranks that both `send` to each other first wait for each
    /// other until the timeout (as MPI_Send may). Use [`Communicator::send_recv`] for
    /// exchanges and rings. A send to this rank itself is buffered and completes at once.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `peer` is out of range; [`Error::InvalidUsage`]
    /// when the receiver expects another length; [`Error::Timeout`] naming `peer` when
    /// it does not receive within the communicator's timeout; [`Error::Aborted`],
    /// [`Error::RemoteError`] as they happen.
    pub fn send<E: bytemuck::Pod>(&mut self, buf: &[E], peer: usize) -> Result<()> {
        self.p2p(Some((bytemuck::cast_slice(buf), peer)), None, 0)
    }

    /// [`Communicator::send`] with a user tag (`MPI_Send`'s, torch's `send(tag=)`):
    /// it matches the receive at `peer` with the same tag, the k-th send with tag t
    /// the k-th receive with tag t; messages with other tags do not affect it.
    /// [`Communicator::send`] is tag 0.
    ///
    /// # Errors
    /// As [`Communicator::send`]; [`Error::InvalidArgument`] when `tag` is above
    /// [`MAX_USER_TAG`].
    pub fn send_tagged<E: bytemuck::Pod>(
        &mut self,
        buf: &[E],
        peer: usize,
        tag: u32,
    ) -> Result<()> {
        check_tag(tag, "send")?;
        self.p2p(Some((bytemuck::cast_slice(buf), peer)), None, tag)
    }

    /// [`Communicator::recv`] with a user tag: it takes the oldest unreceived message
    /// from `peer` with the same tag (see [`Communicator::send_tagged`]).
    ///
    /// # Errors
    /// As [`Communicator::recv`]; [`Error::InvalidArgument`] when `tag` is above
    /// [`MAX_USER_TAG`].
    pub fn recv_tagged<E: bytemuck::Pod>(
        &mut self,
        buf: &mut [E],
        peer: usize,
        tag: u32,
    ) -> Result<()> {
        check_tag(tag, "recv")?;
        self.p2p(None, Some((bytemuck::cast_slice_mut(buf), peer)), tag)
    }

    /// Receives exactly `buf.len()` elements from rank `peer` (NCCL's `ncclRecv`),
    /// blocking until they are in `buf`. See [`Communicator::send`] for the matching
    /// rules; a receive from this rank itself takes the oldest message this rank sent
    /// itself, and fails at once when there is none.
    ///
    /// # Errors
    /// As [`Communicator::send`]; [`Error::Timeout`] names `peer` when nothing arrives.
    pub fn recv<E: bytemuck::Pod>(&mut self, buf: &mut [E], peer: usize) -> Result<()> {
        self.p2p(None, Some((bytemuck::cast_slice_mut(buf), peer)), 0)
    }

    /// Sends `send` to `dst` and receives `recv` from `src` at the same time
    /// (`MPI_Sendrecv`): both are posted at once, so rings and pairwise exchanges do not
    /// deadlock. Each half follows the matching rules of [`Communicator::send`] and
    /// [`Communicator::recv`].
    ///
    /// # Errors
    /// As [`Communicator::send`] and [`Communicator::recv`]; [`Error::InvalidArgument`]
    /// when the buffers overlap.
    pub fn send_recv<E: bytemuck::Pod>(
        &mut self,
        send: &[E],
        dst: usize,
        recv: &mut [E],
        src: usize,
    ) -> Result<()> {
        let send: &[u8] = bytemuck::cast_slice(send);
        let recv: &mut [u8] = bytemuck::cast_slice_mut(recv);
        if overlaps(send.as_ptr(), send.len(), recv.as_ptr(), recv.len()) {
            return Err(Error::invalid_argument(
                "send_recv: send and receive buffers overlap",
            ));
        }
        self.p2p(Some((send, dst)), Some((recv, src)), 0)
    }

    fn p2p(
        &mut self,
        send: Option<(&[u8], usize)>,
        recv: Option<(&mut [u8], usize)>,
        tag: u32,
    ) -> Result<()> {
        let core = &mut self.core;
        core.check_aborted()?;
        let (n, me) = (core.size, core.rank);
        if let Some((_, peer)) = send {
            core.check_peer(peer, "send")?;
        }
        if let Some((_, peer)) = &recv {
            core.check_peer(*peer, "recv")?;
        }
        let ext = &mut core.ext;
        ext.count_ranks(n);
        // Messages to itself go through a queue: the transports reach only other ranks.
        let send = match send {
            Some((bytes, peer)) if peer == me => {
                ext.to_self.push_back((tag, bytes.to_vec()));
                None
            }
            other => other,
        };
        let recv = match recv {
            Some((buf, peer)) if peer == me => {
                let Some(at) = ext.to_self.iter().position(|(t, _)| *t == tag) else {
                    return Err(Error::InvalidUsage {
                        peer: Some(me),
                        message: format!(
                            "recv: rank {me} receives from itself (tag {tag}) but sent itself \
                             nothing with that tag"
                        ),
                    });
                };
                let msg = &ext.to_self[at].1;
                if msg.len() != buf.len() {
                    let got = msg.len();
                    return Err(Error::InvalidUsage {
                        peer: Some(me),
                        message: format!(
                            "recv: rank {me} sent itself {got} bytes but receives {} bytes",
                            buf.len()
                        ),
                    });
                }
                buf.copy_from_slice(msg);
                ext.to_self.remove(at);
                None
            }
            other => other,
        };
        let name = match (&send, &recv) {
            (None, None) => return Ok(()),
            (Some(_), None) => "send",
            (None, Some(_)) => "recv",
            (Some(_), Some(_)) => "send_recv",
        };
        let recv_tag = recv
            .as_ref()
            .map(|(_, peer)| p2p_tag(tag, ext.count(false, *peer, tag)));
        let send_tag = send
            .as_ref()
            .map(|(_, peer)| p2p_tag(tag, ext.count(true, *peer, tag)));
        // A lone send or receive (the common case, and every ping-pong) runs a cached
        // one-step schedule whose tag is 0, the message number going into the tag base
        // instead (the same tag on the wire): no schedule is built per message.
        let (tag_base, key) = match (&send, &recv, send_tag, recv_tag) {
            (Some((bytes, peer)), None, Some(t), _) => (t, Some((true, *peer, bytes.len()))),
            (None, Some((buf, peer)), _, Some(t)) => (t, Some((false, *peer, buf.len()))),
            _ => (0, None),
        };
        let built;
        let schedule = match key {
            Some(key) => ext.p2p_schedule(me, n, name, key),
            None => {
                let mut b = ScheduleBuilder::new(me, n, name);
                if let (Some((buf, peer)), Some(tag)) = (&recv, recv_tag) {
                    b.recv(*peer, tag, Region::new(Buf::Recv, 0, buf.len()), &[]);
                }
                if let (Some((bytes, peer)), Some(tag)) = (&send, send_tag) {
                    b.send(*peer, tag, Region::new(Buf::Send, 0, bytes.len()), &[]);
                }
                built = b.finish();
                &built
            }
        };
        let (dst, src) = (send.as_ref().map(|s| s.1), recv.as_ref().map(|r| r.1));
        let bufs = Buffers {
            send: send.map_or(&[][..], |s| s.0),
            recv: match recv {
                Some((buf, _)) => buf,
                None => &mut [],
            },
            scratch: &mut [],
            call: halo_collectives::Call::NONE,
        };
        let opts = exec_options(core.timeout, &core.abort);
        core.backend
            .run(schedule, core.comm_tag | P2P_FLAG | tag_base, bufs, &opts)?;
        if let Some(d) = dst {
            core.ext.advance(true, d, tag);
        }
        if let Some(s) = src {
            core.ext.advance(false, s, tag);
        }
        Ok(())
    }
}

/// The largest message of a batch of point-to-point operations
/// ([`Communicator::p2p_batch`]): its bytes are staged through one buffer per
/// direction, which costs a copy that only small messages repay.
pub(crate) const BATCH_MAX_BYTES: usize = 4096;

/// The most operations of one batch (OSU's window).
pub(crate) const BATCH_MAX_OPS: usize = 64;

/// How this communicator's non-blocking sends and receives ran so far
/// ([`Communicator::p2p_stats`]): what the scope's worker batched and what the
/// starting thread wrote itself. For tests and tuning; the paths are described on
/// [`Scope`](super::Scope).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct P2pStats {
    /// Batches of more than one send or receive run as one pass.
    pub batches: u64,
    /// Operations in those batches.
    pub batched: u64,
    /// Sends written by the starting thread at once (the eager path).
    pub eager: u64,
}

/// One send or one receive of a scope, as data: what the scope's worker batches with
/// the ones queued after it ([`Communicator::p2p_batch`]).
#[derive(Debug)]
pub(crate) enum P2pOp<'a> {
    /// [`Communicator::send_tagged`]: bytes, peer, user tag.
    Send(&'a [u8], usize, u32),
    /// [`Communicator::recv_tagged`]: buffer, peer, user tag.
    Recv(&'a mut [u8], usize, u32),
}

impl P2pOp<'_> {
    /// Runs it alone, as the blocking call.
    pub(crate) fn run(self, comm: &mut Communicator) -> Result<()> {
        match self {
            P2pOp::Send(bytes, peer, tag) => comm.send_tagged(bytes, peer, tag),
            P2pOp::Recv(buf, peer, tag) => comm.recv_tagged(buf, peer, tag),
        }
    }

    /// Whether it may run in a batch on `comm`: a valid peer other than this rank, a
    /// valid tag, at most [`BATCH_MAX_BYTES`]. Anything else runs alone, where its
    /// error (or its message to itself) is the blocking call's.
    pub(crate) fn batchable(&self, comm: &Communicator) -> bool {
        let (len, peer, tag) = match self {
            P2pOp::Send(b, p, t) => (b.len(), *p, *t),
            P2pOp::Recv(b, p, t) => (b.len(), *p, *t),
        };
        len <= BATCH_MAX_BYTES && peer < comm.size() && peer != comm.rank() && tag <= MAX_USER_TAG
    }
}

impl Communicator {
    /// How this communicator's non-blocking sends and receives ran so far: batched by
    /// the scope's worker, or written at once by the starting thread (see [`Scope`](super::Scope)).
    pub fn p2p_stats(&self) -> P2pStats {
        self.core.ext.p2p_stats
    }

    /// A non-blocking send's eager path ([`Scope`](super::Scope)): `bytes` to `peer`
    /// with user tag `tag`, written now if the transport can without waiting and
    /// without a session (`Backend::try_send_now`: HALO's rings), with the tag and
    /// count the blocking send would give it. Whether it was; when not (any doubt:
    /// another rank's peer, this rank, a bad tag, an aborted communicator, more than
    /// [`BATCH_MAX_BYTES`]), nothing changed and the send goes the usual way, where its
    /// error is the blocking call's.
    pub(crate) fn try_send_now(&mut self, bytes: &[u8], peer: usize, tag: u32) -> bool {
        let core = &mut self.core;
        if core.check_aborted().is_err()
            || peer >= core.size
            || peer == core.rank
            || tag > MAX_USER_TAG
            || bytes.len() > BATCH_MAX_BYTES
        {
            return false;
        }
        let ext = &mut core.ext;
        ext.count_ranks(core.size);
        let wire = core.comm_tag | P2P_FLAG | p2p_tag(tag, ext.count(true, peer, tag));
        if !core.backend.try_send_now(peer, wire, bytes) {
            return false;
        }
        core.ext.advance(true, peer, tag);
        core.ext.p2p_stats.eager += 1;
        true
    }

    /// Runs consecutive sends and receives of a scope as one pass of the transport: one
    /// schedule whose steps are the operations, independent of each other, their bytes
    /// staged through one buffer per direction. What a window of small non-blocking
    /// operations costs is then the messages, not a schedule and a transport session
    /// each. Each message carries the tag it would carry alone (its pair's and tag's
    /// message number), so it matches the same operation at the peer, batched or not.
    ///
    /// Every operation must be [`P2pOp::batchable`]. On error nothing is counted (as
    /// for a failed blocking call) and the receive buffers are untouched.
    pub(crate) fn p2p_batch(&mut self, ops: &mut [P2pOp<'_>]) -> Result<()> {
        let core = &mut self.core;
        core.check_aborted()?;
        let (n, me) = (core.size, core.rank);
        let ext = &mut core.ext;
        ext.count_ranks(n);
        let mut stage_send = std::mem::take(&mut ext.batch_send);
        let mut stage_recv = std::mem::take(&mut ext.batch_recv);
        stage_send.clear();
        stage_recv.clear();
        let mut b = ScheduleBuilder::new(me, n, "send/recv batch");
        for op in ops.iter() {
            let (sent, peer, tag, len) = match op {
                P2pOp::Send(bytes, peer, tag) => (true, *peer, *tag, bytes.len()),
                P2pOp::Recv(buf, peer, tag) => (false, *peer, *tag, buf.len()),
            };
            // The number it would have alone: counted now, taken back on failure.
            let wire = p2p_tag(tag, ext.count(sent, peer, tag));
            ext.advance(sent, peer, tag);
            match op {
                P2pOp::Send(bytes, ..) => {
                    b.send(
                        peer,
                        wire,
                        Region::new(Buf::Send, stage_send.len(), len),
                        &[],
                    );
                    stage_send.extend_from_slice(bytes);
                }
                P2pOp::Recv(..) => {
                    b.recv(
                        peer,
                        wire,
                        Region::new(Buf::Recv, stage_recv.len(), len),
                        &[],
                    );
                    stage_recv.resize(stage_recv.len() + len, 0);
                }
            }
        }
        let schedule = b.finish();
        let bufs = Buffers {
            send: &stage_send,
            recv: &mut stage_recv,
            scratch: &mut [],
            call: halo_collectives::Call::NONE,
        };
        let opts = exec_options(core.timeout, &core.abort);
        let r = core
            .backend
            .run(&schedule, core.comm_tag | P2P_FLAG, bufs, &opts);
        let ext = &mut core.ext;
        match &r {
            Ok(()) => {
                ext.p2p_stats.batches += 1;
                ext.p2p_stats.batched += ops.len() as u64;
                let mut at = 0;
                for op in ops.iter_mut() {
                    if let P2pOp::Recv(buf, ..) = op {
                        buf.copy_from_slice(&stage_recv[at..at + buf.len()]);
                        at += buf.len();
                    }
                }
            }
            Err(_) => {
                for op in ops.iter() {
                    match op {
                        P2pOp::Send(_, peer, tag) => ext.retreat(true, *peer, *tag),
                        P2pOp::Recv(_, peer, tag) => ext.retreat(false, *peer, *tag),
                    }
                }
            }
        }
        ext.batch_send = stage_send;
        ext.batch_recv = stage_recv;
        r.map_err(Into::into)
    }
}
