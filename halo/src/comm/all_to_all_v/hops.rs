//! All-to-all-v's count messages in two hops across hosts, unpadded: each rank sends
//! one message per *other host* (to the rank with its own local index there) instead
//! of one per other rank, and that rank hands each of its host's ranks its part in one
//! message per host peer. The messages carry the counts (each sender's row) and the
//! first `min(count, C)` bytes of each block, at their own length: the receives take
//! up to a bound ([`Session::post_recv_up_to`]) and every length is checked against
//! the rows the message carries. See the module documentation of all-to-all-v ("Count
//! messages across hosts") for when it runs.
//!
//! Rank `(a, i)` (host `a`, local index `i`; `N` hosts of `L` ranks each):
//! 1. to each rank `(a, j)` of its host: `[row][first bytes of its block]` (as the
//!    direct exchange); to `(b, i)` on each other host `b`: `[row][first bytes of its
//!    blocks for (b, 0), (b, 1), ...]`;
//! 2. once every other host's message has come, to each rank `(a, j)`, `j != i`, of
//!    its host: `[the rows of (b, i) for every other host b][their first bytes for
//!    (a, j)]`.
//!
//! Every rank so learns every row (the matrix every rank checks alike) and the first
//! bytes of every block for it, which land where the direct exchange puts them, so the
//! rest of the call is the same. Over the network each rank sends `N - 1` messages
//! instead of `L (N - 1)`.

use super::V_CALL;
use super::wire::{eager_len, flush_sends, wrong_length};
use crate::comm::{Communicator, exec_options, sized};
use crate::transport::Program;
use halo_collectives::{
    Algorithm, Buf, Buffers, CollectiveError, ExecOptions, Idle, META_BLOCK, Region, Result,
    Session,
};
use halo_topology::{Level, Topology};

impl Communicator {
    /// The count messages in two hops across hosts ([`hop_exchange_driven`]), staged and
    /// landing where [`Communicator::meta_direct`] has them.
    pub(super) fn meta_hops(
        &mut self,
        base: u64,
        c: usize,
        valid: bool,
        send: &[u8],
        recv: &mut [u8],
    ) -> crate::error::Result<()> {
        let (n, me) = (self.size(), self.rank());
        let f = n * META_BLOCK + c;
        let core = &mut self.core;
        let pool = &mut self.pool;
        let layout = Layout::new(&core.topology, c, 2 * n * f);
        let stage = sized(&mut pool.v.stage, 2 * n * f + layout.len());
        let x = HopExchange {
            topo: &core.topology,
            me,
            c,
            send: &pool.send_bytes,
            valid,
            layout,
        };
        let state = &mut pool.v.hops;
        let mut driver = |session: &mut dyn Session, opts: &ExecOptions<'_>| {
            hop_exchange_driven(session, opts, &x, state)
        };
        let opts = exec_options(core.timeout, &core.abort);
        core.backend.run_program(
            Program::Driven(&mut driver),
            base,
            Buffers {
                send,
                recv,
                scratch: stage,
                call: V_CALL,
            },
            &opts,
        )?;
        core.last = Some(Algorithm::Halo);
        Ok(())
    }
}

/// Tags of the two hops' messages within their collective (the direct exchange's
/// message to a rank of the same host keeps its tag, 0).
const TAG_HOP: u64 = 2;
const TAG_FORWARD: u64 = 3;

/// Whether `topo` takes the two hops: ranks on more than one host, the same number on
/// each, more than one per host.
pub(super) fn applies(topo: &Topology) -> bool {
    topo.has_level(Level::Node)
        && topo.num_domains(Level::Node) > 1
        && topo.is_uniform(Level::Node)
        && topo.max_domain_size(Level::Node) > 1
}

/// Where the two hops keep their messages in the exchange's scratch, after the
/// direct exchange's `n` count messages out (at 0) and in (at `n f`) of `f = 16 n + c`
/// bytes each, which they use as the direct exchange does.
#[derive(Debug, Clone, Copy)]
struct Layout {
    n: usize,
    hosts: usize,
    local: usize,
    c: usize,
    /// Start of the hops' own part.
    at: usize,
}

impl Layout {
    fn new(topo: &Topology, c: usize, at: usize) -> Layout {
        Layout {
            n: topo.size(),
            hosts: topo.num_domains(Level::Node),
            local: topo.max_domain_size(Level::Node),
            c,
            at,
        }
    }

    fn row(&self) -> usize {
        self.n * META_BLOCK
    }

    /// The direct exchange's message: a row and one block's first bytes.
    fn f(&self) -> usize {
        self.row() + self.c
    }

    /// A first hop's message: a row and the first bytes of `local` blocks.
    fn hop(&self) -> usize {
        self.row() + self.local * self.c
    }

    /// A second hop's message: `hosts - 1` rows and as many blocks' first bytes.
    fn forward(&self) -> usize {
        (self.hosts - 1) * self.f()
    }

    fn hop_out(&self, host: usize) -> usize {
        self.at + host * self.hop()
    }

    fn hop_in(&self, host: usize) -> usize {
        self.at + (self.hosts + host) * self.hop()
    }

    fn forward_out(&self, local: usize) -> usize {
        self.at + 2 * self.hosts * self.hop() + local * self.forward()
    }

    fn forward_in(&self, local: usize) -> usize {
        self.at + 2 * self.hosts * self.hop() + (self.local + local) * self.forward()
    }

    /// Bytes of scratch the hops need beyond `at`.
    fn len(&self) -> usize {
        2 * self.hosts * self.hop() + 2 * self.local * self.forward()
    }
}

/// One rank's part of the two-hop count exchange. The scratch holds the direct
/// exchange's count messages out (at 0: `[row][first bytes][...]` for each rank) and
/// receives them in (at `n f`), as [`super::eager`] reads them afterwards.
struct HopExchange<'a> {
    topo: &'a Topology,
    me: usize,
    /// Eager bytes per block.
    c: usize,
    /// This rank's byte counts per peer, sending (its row says the same), and whether
    /// its arguments are valid (else it sends no data).
    send: &'a [usize],
    valid: bool,
    layout: Layout,
}

/// The bookkeeping of [`hop_exchange_driven`], kept between calls.
#[derive(Debug, Default)]
pub(super) struct HopState {
    /// Whether the message from each host (first hop) and from each rank of this host
    /// (direct, then second hop) has landed: `[hop per host][direct per local][forward
    /// per local]`.
    got: Vec<bool>,
    completed: Vec<u32>,
    /// Whether this rank's second hops are posted (or poison in their place).
    forwarded: bool,
}

/// Posts one operation: `(session, kind, index, peer, region)`.
type Post<'a> = dyn Fn(&mut dyn Session, usize, usize, usize, Region) -> Result<()> + 'a;

/// Kinds of operation, in the token (`kind * n + index`).
const DIRECT_IN: usize = 0;
const DIRECT_OUT: usize = 1;
const HOP_IN: usize = 2;
const HOP_OUT: usize = 3;
const FORWARD_IN: usize = 4;
const FORWARD_OUT: usize = 5;

/// The count `row_at`'s row (a region of the scratch) gives for rank `q`.
fn count_in_row(session: &mut dyn Session, row_at: usize, q: usize) -> Result<u64> {
    let mut b = [0u8; 8];
    session.read(
        Region::new(Buf::Scratch, row_at + q * META_BLOCK, 8),
        &mut b,
    )?;
    Ok(u64::from_le_bytes(b))
}

/// Runs [`HopExchange`] on `session`: posts every receive and every first-hop and
/// same-host send at once, copies what lands into the direct exchange's slots, and
/// posts the second hop's sends once every other host's message has landed. After a
/// size mismatch (here or from a peer) the second hops not yet sent are poison in
/// their place ([`Session::post_poison`]), so that this host's ranks fail at once
/// too, not at their timeout.
fn hop_exchange_driven(
    session: &mut dyn Session,
    opts: &ExecOptions<'_>,
    x: &HopExchange<'_>,
    st: &mut HopState,
) -> Result<()> {
    st.forwarded = false;
    let r = hop_exchange(session, opts, x, st);
    if let Err(CollectiveError::Mismatch { .. }) = &r {
        poison_forwards(session, x, st);
    }
    r
}

/// Poison in place of the second hops this rank has not sent.
fn poison_forwards(session: &mut dyn Session, x: &HopExchange<'_>, st: &mut HopState) {
    if st.forwarded {
        return;
    }
    st.forwarded = true;
    let host = x.topo.domain(x.me, Level::Node);
    for &q in x.topo.ranks(Level::Node, host) {
        if q as usize != x.me {
            // Best effort: the rank fails with its own error either way.
            let _ = session.post_poison(q as usize, TAG_FORWARD);
        }
    }
}

fn hop_exchange(
    session: &mut dyn Session,
    opts: &ExecOptions<'_>,
    x: &HopExchange<'_>,
    st: &mut HopState,
) -> Result<()> {
    let t = x.topo;
    let (me, c, lay) = (x.me, x.c, x.layout);
    let (n, row, f) = (lay.n, lay.row(), lay.f());
    let (hosts, local) = (lay.hosts, lay.local);
    let (out_at, in_at) = (0, n * f);
    let host = t.domain(me, Level::Node);
    let mine = t.local_index(me, Level::Node);
    let peers = |h: usize| t.ranks(Level::Node, h);
    let k = |q: usize| if x.valid { x.send[q].min(c) } else { 0 };
    // Operations posted and not yet complete, and the sends among them.
    let pending = std::cell::Cell::new(0usize);
    let sends = std::cell::Cell::new(0usize);
    let post = |session: &mut dyn Session, kind: usize, idx: usize, peer, region| {
        let tag = match kind {
            DIRECT_IN | DIRECT_OUT => 0,
            HOP_IN | HOP_OUT => TAG_HOP,
            _ => TAG_FORWARD,
        };
        let token = (kind * n + idx) as u32;
        pending.set(pending.get() + 1);
        match kind {
            DIRECT_OUT | HOP_OUT | FORWARD_OUT => {
                sends.set(sends.get() + 1);
                session.post_send(peer, tag, region, token)
            }
            _ => session.post_recv_up_to(peer, tag, region, token),
        }
    };
    // Receives: the same host's ranks (direct, then their second hops), the aligned
    // rank of every other host.
    for (j, &p) in peers(host).iter().enumerate() {
        let p = p as usize;
        if p != me {
            let r = Region::new(Buf::Scratch, in_at + p * f, f);
            post(session, DIRECT_IN, j, p, r)?;
            let r = Region::new(Buf::Scratch, lay.forward_in(j), lay.forward());
            post(session, FORWARD_IN, j, p, r)?;
        }
    }
    for h in (0..hosts).filter(|&h| h != host) {
        let p = peers(h)[mine] as usize;
        let r = Region::new(Buf::Scratch, lay.hop_in(h), lay.hop());
        post(session, HOP_IN, h, p, r)?;
    }
    // Sends: the first hop to every other host, `[row][first bytes for each of its
    // ranks]`, and the direct messages to this host's ranks.
    for k_ in 1..hosts {
        let h = (host + k_) % hosts;
        let mut at = lay.hop_out(h);
        session.copy(
            Region::new(Buf::Scratch, out_at, row),
            Region::new(Buf::Scratch, at, row),
        )?;
        at += row;
        for &q in peers(h) {
            let q = q as usize;
            let len = k(q);
            session.copy(
                Region::new(Buf::Scratch, out_at + q * f + row, len),
                Region::new(Buf::Scratch, at, len),
            )?;
            at += len;
        }
        let p = peers(h)[mine] as usize;
        let r = Region::new(Buf::Scratch, lay.hop_out(h), at - lay.hop_out(h));
        post(session, HOP_OUT, h, p, r)?;
    }
    for (j, &q) in peers(host).iter().enumerate() {
        let q = q as usize;
        if q != me {
            let r = Region::new(Buf::Scratch, out_at + q * f, row + k(q));
            post(session, DIRECT_OUT, j, q, r)?;
        }
    }
    session.copy(
        Region::new(Buf::Scratch, out_at + me * f, row + k(me)),
        Region::new(Buf::Scratch, in_at + me * f, row + k(me)),
    )?;
    // got: [hop per host][direct per local][forward per local].
    st.got.clear();
    st.got.resize(hosts + 2 * local, false);
    st.got[host] = true;
    st.got[hosts + mine] = true;
    st.got[hosts + local + mine] = true;
    st.completed.clear();
    let mut hops_left = hosts - 1;
    // A message of the wrong length fails this rank, but first its peers learn of it:
    // the second hops it will not send now are poison, and its sends are delivered.
    let fail = |session: &mut dyn Session, st: &mut HopState, e: CollectiveError| {
        poison_forwards(session, x, st);
        let is_send = |t: u32| matches!(t as usize / n, DIRECT_OUT | HOP_OUT | FORWARD_OUT);
        flush_sends(session, sends.get(), is_send, e)
    };
    let mut idle = Idle::default();
    loop {
        if pending.get() == 0 {
            return Ok(());
        }
        session.progress(&mut st.completed)?;
        if st.completed.is_empty() {
            idle.wait(
                session,
                opts,
                || {
                    let pending = pending.get();
                    format!("all-to-all-v count exchange aborted with {pending} operations pending")
                },
                |waited| {
                    let peer = st.got.iter().position(|g| !g).map(|i| {
                        if i < hosts {
                            peers(i)[mine] as usize
                        } else {
                            peers(host)[(i - hosts) % local] as usize
                        }
                    });
                    CollectiveError::Timeout {
                        algorithm: "all-to-all-v counts (two hops)",
                        step: 0,
                        peer,
                        what: match peer {
                            Some(p) => format!("a count message from rank {p}"),
                            None => format!("{} count messages to other ranks", pending.get()),
                        },
                        waited,
                    }
                },
            )?;
            continue;
        }
        idle.reset();
        let done = std::mem::take(&mut st.completed);
        for tok in &done {
            pending.set(pending.get() - 1);
            let (kind, idx) = (*tok as usize / n, *tok as usize % n);
            let got = session.received_len(*tok);
            let got_or = |from: usize| {
                got.ok_or_else(|| {
                    CollectiveError::Internal(format!(
                        "the count message from rank {from} completed without a length"
                    ))
                })
            };
            match kind {
                DIRECT_IN => {
                    let p = peers(host)[idx] as usize;
                    st.got[hosts + idx] = true;
                    let v = count_in_row(session, in_at + p * f, me)?;
                    let (got, want) = (got_or(p)?, row + eager_len(v, c));
                    if got != want {
                        return Err(fail(session, st, wrong_length(p, me, got, want, c)));
                    }
                }
                HOP_IN => {
                    let p = peers(idx)[mine] as usize;
                    st.got[idx] = true;
                    let base = lay.hop_in(idx);
                    // Its blocks for this host's ranks, in local order: this rank's.
                    let (mut want, mut at) = (row, 0);
                    for &q in peers(host) {
                        let e = eager_len(count_in_row(session, base, q as usize)?, c);
                        if q as usize == me {
                            at = base + want;
                        }
                        want += e;
                    }
                    let got = got_or(p)?;
                    if got != want {
                        return Err(fail(session, st, wrong_length(p, me, got, want, c)));
                    }
                    let e = eager_len(count_in_row(session, base, me)?, c);
                    session.copy(
                        Region::new(Buf::Scratch, base, row),
                        Region::new(Buf::Scratch, in_at + p * f, row),
                    )?;
                    session.copy(
                        Region::new(Buf::Scratch, at, e),
                        Region::new(Buf::Scratch, in_at + p * f + row, e),
                    )?;
                    hops_left -= 1;
                    if hops_left == 0 {
                        st.forwarded = true;
                        forward(session, x, &post)?;
                    }
                }
                FORWARD_IN => {
                    let p = peers(host)[idx] as usize;
                    st.got[hosts + local + idx] = true;
                    let base = lay.forward_in(idx);
                    let others = (0..hosts).filter(|&h| h != host);
                    let mut want = (hosts - 1) * row;
                    let mut at = base + want;
                    for r in 0..hosts - 1 {
                        want += eager_len(count_in_row(session, base + r * row, me)?, c);
                    }
                    let got = got_or(p)?;
                    if got != want {
                        return Err(fail(session, st, wrong_length(p, me, got, want, c)));
                    }
                    // The rows of (h, idx) for every other host h, then their first
                    // bytes for this rank.
                    for (r, h) in others.enumerate() {
                        let q = peers(h)[idx] as usize;
                        let e = eager_len(count_in_row(session, base + r * row, me)?, c);
                        session.copy(
                            Region::new(Buf::Scratch, base + r * row, row),
                            Region::new(Buf::Scratch, in_at + q * f, row),
                        )?;
                        session.copy(
                            Region::new(Buf::Scratch, at, e),
                            Region::new(Buf::Scratch, in_at + q * f + row, e),
                        )?;
                        at += e;
                    }
                }
                _ => sends.set(sends.get() - 1),
            }
        }
        st.completed = done;
        st.completed.clear();
    }
}

/// The second hop: to each other rank `(a, j)` of this host, the rows of the ranks
/// `(b, i)` whose first-hop messages this rank holds, then their first bytes for
/// `(a, j)`.
fn forward(session: &mut dyn Session, x: &HopExchange<'_>, post: &Post<'_>) -> Result<()> {
    let (t, lay, c) = (x.topo, x.layout, x.c);
    let row = lay.row();
    let host = t.domain(x.me, Level::Node);
    let mine = t.local_index(x.me, Level::Node);
    let here = t.ranks(Level::Node, host);
    let others: Vec<usize> = (0..lay.hosts).filter(|&h| h != host).collect();
    for (j, &q) in here.iter().enumerate() {
        let q = q as usize;
        if j == mine {
            continue;
        }
        let start = lay.forward_out(j);
        let mut at = start;
        for &h in &others {
            session.copy(
                Region::new(Buf::Scratch, lay.hop_in(h), row),
                Region::new(Buf::Scratch, at, row),
            )?;
            at += row;
        }
        for &h in &others {
            // (h, mine)'s block for q follows its row and its blocks for the ranks of
            // this host before q.
            let base = lay.hop_in(h);
            let mut off = base + row;
            for &before in &here[..j] {
                off += eager_len(count_in_row(session, base, before as usize)?, c);
            }
            let e = eager_len(count_in_row(session, base, q)?, c);
            session.copy(
                Region::new(Buf::Scratch, off, e),
                Region::new(Buf::Scratch, at, e),
            )?;
            at += e;
        }
        post(
            session,
            FORWARD_OUT,
            j,
            q,
            Region::new(Buf::Scratch, start, at - start),
        )?;
    }
    Ok(())
}
