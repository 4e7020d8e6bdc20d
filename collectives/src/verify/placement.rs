//! Pass 4: placement. After the replay, every byte of every block lies exactly once
//! at its place in its destination's receive buffer and nothing else is there, and
//! every block a schedule lists as routed ([`crate::RoutedBlock`]) sits in scratch
//! where it says.

use super::content::RankState;
use super::{Expectation, err};
use crate::error::VerifyError;
use crate::layout::BlockSizes;

/// Checks every rank's final buffers, rank by rank (receive buffer, then routed
/// blocks).
pub(super) fn check(
    states: &[RankState<'_>],
    expect: &Expectation,
    sizes: &dyn BlockSizes,
) -> Result<(), VerifyError> {
    for (q, st) in states.iter().enumerate() {
        check_recv(q, st, expect)?;
        check_routed(q, st, sizes)?;
    }
    Ok(())
}

/// Every block at its place in rank `q`'s receive buffer, exactly once, and nothing
/// else there.
fn check_recv(q: usize, st: &RankState<'_>, expect: &Expectation) -> Result<(), VerifyError> {
    let mut got = vec![0usize; expect.n];
    for (&at, p) in &st.recv.0 {
        let src = p.src as usize;
        let (off, len) = expect.recv[q][src];
        if (!expect.any_dst && p.dst as usize != q) || at != off + p.off || p.off + p.len > len {
            return Err(err(
                q,
                p.writer,
                Some((src, p.dst as usize)),
                format!(
                    "bytes {}..{} of block {src}->{} landed at recv[{at}], expected the block from {src} at recv[{off}..{}]",
                    p.off,
                    p.off + p.len,
                    p.dst,
                    off + len
                ),
            ));
        }
        got[src] += p.len;
    }
    for (src, &g) in got.iter().enumerate() {
        let (off, len) = expect.recv[q][src];
        if g != len {
            return Err(err(
                q,
                None,
                Some((src, q)),
                format!(
                    "only {g} of {len} bytes from rank {src} reached recv[{off}..{}]",
                    off + len
                ),
            ));
        }
    }
    Ok(())
}

/// The blocks rank `q`'s schedule lists as routed sit in its scratch buffer where it
/// says, whole and in order.
fn check_routed(q: usize, st: &RankState<'_>, sizes: &dyn BlockSizes) -> Result<(), VerifyError> {
    for b in st.schedule.routed() {
        let len = sizes.bytes(b.src as usize, b.dst as usize);
        let ok = match st.scratch.read(b.offset, len) {
            Ok(pieces) => {
                let mut at = 0;
                pieces.iter().all(|p| {
                    let good = p.src == b.src && p.dst == b.dst && p.off == at;
                    at += p.len;
                    good
                })
            }
            Err(_) => false,
        };
        if !ok {
            return Err(err(
                q,
                None,
                Some((b.src as usize, b.dst as usize)),
                format!(
                    "routed block is not at scratch[{}..{}]",
                    b.offset,
                    b.offset + len
                ),
            ));
        }
    }
    Ok(())
}
