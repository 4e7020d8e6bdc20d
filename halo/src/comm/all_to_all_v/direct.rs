//! The direct exchange of the count messages as a driven program: every rank posts
//! its count messages to every other and the remainders of up to `S` bytes right
//! behind them, and reads each count message as it lands to post the receive of the
//! remainder that follows (into the receive buffer, or into scratch to drop).

use super::V_CALL;
use super::wire::{eager_len, flush_sends, wrong_length};
use crate::comm::{Communicator, exec_options};
use crate::error::Result;
use crate::transport::Program;
use halo_collectives::{
    Algorithm, Buf, Buffers, CollectiveError, ExecOptions, Idle, META_BLOCK, Region, Session,
};

/// Tags of the direct exchange's messages within their collective.
const TAG_COUNTS: u64 = 0;
const TAG_REST: u64 = 1;

/// The remainder of a block of `count` bytes (`u64::MAX`: its sender's arguments are
/// invalid) that its sender sends right behind the count message when `c` bytes go
/// with the counts and remainders up to `s` bytes are sent so; `None` when the block
/// fits in the eager bytes, is larger, or its sender had invalid arguments. Sender and
/// receiver decide with the same `count` (the sender's own, which the receiver reads
/// from the sender's count message), so both agree on every message.
pub(super) fn speculated(count: u64, c: usize, s: usize) -> Option<usize> {
    if count == u64::MAX {
        return None;
    }
    let rest = usize::try_from(count).ok()?.checked_sub(c)?;
    (rest > 0 && rest <= s).then_some(rest)
}

impl Communicator {
    /// The direct exchange of the count messages staged in `pool.v.stage` (out at 0, in
    /// at `n f`), with the remainders of up to `s` bytes right behind them
    /// ([`direct_exchange_driven`]); the dropped remainders land at `2 n f`.
    pub(super) fn meta_direct(
        &mut self,
        base: u64,
        (c, s): (usize, usize),
        valid: bool,
        send: &[u8],
        recv: &mut [u8],
    ) -> Result<()> {
        let (n, me) = (self.size(), self.rank());
        let f = n * META_BLOCK + c;
        let core = &mut self.core;
        let pool = &mut self.pool;
        let (send_bytes, send_displs) = (&pool.send_bytes, &pool.send_displs);
        let (recv_bytes, recv_displs) = (&pool.recv_bytes, &pool.recv_displs);
        let drive = &mut pool.v.drive;
        let mut driver = |session: &mut dyn Session, opts: &ExecOptions<'_>| {
            direct_exchange_driven(
                session,
                opts,
                &DirectExchange {
                    n,
                    me,
                    c,
                    s,
                    valid,
                    send: (send_bytes, send_displs),
                    recv: (recv_bytes, recv_displs),
                },
                drive,
            )
        };
        let opts = exec_options(core.timeout, &core.abort);
        core.backend.run_program(
            Program::Driven(&mut driver),
            base,
            Buffers {
                send,
                recv,
                scratch: &mut pool.v.stage[..2 * n * f + s],
                call: V_CALL,
            },
            &opts,
        )?;
        core.last = Some(Algorithm::Flat);
        Ok(())
    }
}

/// One rank's part of the direct count exchange with speculative remainders
/// ([`Communicator::meta_eager`]). The scratch holds the `n` count messages of `16 n + c`
/// bytes out at 0, the `n` in at `n f`, and the dropped remainder at `2 n f`.
struct DirectExchange<'a> {
    n: usize,
    me: usize,
    /// Eager bytes per block.
    c: usize,
    /// The largest remainder sent right behind the counts.
    s: usize,
    /// Whether this rank's arguments are valid (else it sends no data and keeps none).
    valid: bool,
    /// This rank's byte counts and displacements per peer, sending and receiving.
    send: (&'a [usize], &'a [usize]),
    recv: (&'a [usize], &'a [usize]),
}

/// The bookkeeping of [`direct_exchange_driven`], kept between calls (no allocation per
/// call in steady state).
#[derive(Debug, Default)]
pub(super) struct DriveState {
    /// Whether the count message from each peer has landed.
    got: Vec<bool>,
    /// Remainders to take and drop: (peer, bytes).
    to_drop: Vec<(usize, usize)>,
    /// Completions not yet processed.
    completed: Vec<u32>,
}

/// Runs [`DirectExchange`] on `session`: posts every count receive and send and every
/// speculative send at once, then for each count message that lands reads the sender's
/// count for this rank and posts the receive of its remainder (into the receive
/// buffer where this rank's count agrees, else one at a time into scratch), until
/// everything has completed. Tokens: `kind * n + peer`.
fn direct_exchange_driven(
    session: &mut dyn Session,
    opts: &ExecOptions<'_>,
    x: &DirectExchange<'_>,
    st: &mut DriveState,
) -> halo_collectives::Result<()> {
    const COUNTS_IN: usize = 0;
    const COUNTS_OUT: usize = 1;
    const REST_OUT: usize = 2;
    const REST_IN: usize = 3;
    const DROPPED: usize = 4;
    let (n, me, c, s) = (x.n, x.me, x.c, x.s);
    let f = n * META_BLOCK + c;
    let (out_at, in_at, drop_at) = (0, n * f, 2 * n * f);
    let row = n * META_BLOCK;
    let mine = |q: usize| -> Option<usize> {
        if x.valid {
            speculated(x.send.0[q] as u64, c, s)
        } else {
            None
        }
    };
    // The length of the count message to `q`: the row, then the first bytes of the
    // block (none where this rank's arguments are invalid: its counts say so).
    let out_len = |q: usize| row + if x.valid { x.send.0[q].min(c) } else { 0 };
    // Operations posted and not yet complete, and the sends among them.
    let pending = std::cell::Cell::new(0usize);
    let sends = std::cell::Cell::new(0usize);
    // Posts one operation of `kind` with `peer`.
    let post = |session: &mut dyn Session, kind: usize, peer: usize, region: Region| {
        let (tag, token) = (
            if kind == COUNTS_IN || kind == COUNTS_OUT {
                TAG_COUNTS
            } else {
                TAG_REST
            },
            (kind * n + peer) as u32,
        );
        pending.set(pending.get() + 1);
        match kind {
            COUNTS_OUT | REST_OUT => {
                sends.set(sends.get() + 1);
                session.post_send(peer, tag, region, token)
            }
            COUNTS_IN => session.post_recv_up_to(peer, tag, region, token),
            _ => session.post_recv(peer, tag, region, token),
        }
    };
    // The counts from every peer, then to every peer (starting after this rank, as
    // the flat fan-out does), then the remainders right behind.
    for k in 1..n {
        let p = (me + n - k) % n;
        post(
            session,
            COUNTS_IN,
            p,
            Region::new(Buf::Scratch, in_at + p * f, f),
        )?;
    }
    for k in 1..n {
        let q = (me + k) % n;
        post(
            session,
            COUNTS_OUT,
            q,
            Region::new(Buf::Scratch, out_at + q * f, out_len(q)),
        )?;
    }
    for k in 1..n {
        let q = (me + k) % n;
        if let Some(len) = mine(q) {
            let region = Region::new(Buf::Send, x.send.1[q] + c, len);
            post(session, REST_OUT, q, region)?;
        }
    }
    // This rank's own block: copied, where its two counts agree.
    session.copy(
        Region::new(Buf::Scratch, out_at + me * f, out_len(me)),
        Region::new(Buf::Scratch, in_at + me * f, out_len(me)),
    )?;
    if let Some(len) = mine(me)
        && x.recv.0[me] == x.send.0[me]
    {
        session.copy(
            Region::new(Buf::Send, x.send.1[me] + c, len),
            Region::new(Buf::Recv, x.recv.1[me] + c, len),
        )?;
    }
    st.got.clear();
    st.got.resize(n, false);
    st.got[me] = true;
    st.to_drop.clear();
    st.completed.clear();
    let mut dropping = false;
    let mut idle = Idle::default();
    let mut count = [0u8; 8];
    loop {
        if !dropping && let Some((p, len)) = st.to_drop.pop() {
            post(session, DROPPED, p, Region::new(Buf::Scratch, drop_at, len))?;
            dropping = true;
        }
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
                    let peer = (0..n).find(|&p| !st.got[p]);
                    CollectiveError::Timeout {
                        algorithm: "all-to-all-v counts",
                        step: 0,
                        peer,
                        what: match peer {
                            Some(p) => format!("the count message from rank {p}"),
                            None => format!("{} remainders of blocks", pending.get()),
                        },
                        waited,
                    }
                },
            )?;
            continue;
        }
        idle.reset();
        for t in st.completed.drain(..) {
            pending.set(pending.get() - 1);
            let (kind, p) = (t as usize / n, t as usize % n);
            match kind {
                COUNTS_IN => {
                    st.got[p] = true;
                    // The sender's count for this rank, from its row.
                    session.read(
                        Region::new(Buf::Scratch, in_at + p * f + me * META_BLOCK, 8),
                        &mut count,
                    )?;
                    let theirs = u64::from_le_bytes(count);
                    // The message is the sender's row and the first `min(count, c)`
                    // bytes of its block: any other length means that the sender
                    // carries another number of bytes with its counts.
                    let eager = eager_len(theirs, c);
                    let got = session.received_len(t).ok_or_else(|| {
                        CollectiveError::Internal(format!(
                            "the count message from rank {p} completed without a length"
                        ))
                    })?;
                    if got != row + eager {
                        let e = wrong_length(p, me, got, row + eager, c);
                        return Err(flush_sends(
                            session,
                            sends.get(),
                            |t| matches!(t as usize / n, COUNTS_OUT | REST_OUT),
                            e,
                        ));
                    }
                    if let Some(len) = speculated(theirs, c, s) {
                        if x.valid && x.recv.0[p] as u64 == theirs {
                            let region = Region::new(Buf::Recv, x.recv.1[p] + c, len);
                            post(session, REST_IN, p, region)?;
                        } else {
                            st.to_drop.push((p, len));
                        }
                    }
                }
                DROPPED => dropping = false,
                COUNTS_OUT | REST_OUT => sends.set(sends.get() - 1),
                _ => {}
            }
        }
    }
}
