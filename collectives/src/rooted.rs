//! Gather and scatter builders: flat programs to and from a root, `block` bytes per
//! rank.
//!
//! | collective | messages at the root | at every other rank | bytes at the root |
//! |---|---|---|---|
//! | [`build_gather`] | N-1 receives, one copy | one send | (N-1) x block received |
//! | [`build_scatter`] | N-1 sends, one copy | one receive | (N-1) x block sent |
//!
//! - **Gather**: every rank's send buffer (`block` bytes) lands at `q * block` of the
//!   root's receive buffer (`N * block` bytes); the other ranks have no receive buffer.
//! - **Scatter**: block `q` of the root's send buffer (`N * block` bytes, block `q` at
//!   `q * block`) lands in rank `q`'s receive buffer (`block` bytes); the other ranks
//!   have no send buffer.
//!
//! Every receive is posted at once (tag 0: each peer sends one message), with the
//! 1-byte agreement ring of every rooted program (`broadcast`'s module); a zero-byte
//! block gives an empty program.

use crate::broadcast::{add_root_agreement, check_root};
use crate::error::Result;
use crate::schedule::{Buf, Region, Schedule, ScheduleBuilder};
use halo_topology::Rank;

/// Builds `rank`'s gather program for `size` ranks, root `root`, `block` bytes each.
///
/// # Errors
/// [`crate::CollectiveError::InvalidArgument`] when `rank` or `root` is out of range.
pub fn build_gather(rank: Rank, size: usize, root: Rank, block: usize) -> Result<Schedule> {
    check_root(rank, size, root)?;
    let mut b = ScheduleBuilder::new(rank, size, "gather flat");
    if block == 0 {
        return Ok(b.finish());
    }
    add_root_agreement(&mut b, rank, size);
    let mine = Region::new(Buf::Send, 0, block);
    if rank == root {
        b.reserve(size, 0);
        for q in (0..size).filter(|&q| q != root) {
            b.recv(q, 0, Region::new(Buf::Recv, q * block, block), &[]);
        }
        b.copy(mine, Region::new(Buf::Recv, root * block, block), &[]);
    } else {
        b.send(root, 0, mine, &[]);
    }
    Ok(b.finish())
}

/// Builds `rank`'s scatter program for `size` ranks, root `root`, `block` bytes each.
///
/// # Errors
/// [`crate::CollectiveError::InvalidArgument`] when `rank` or `root` is out of range.
pub fn build_scatter(rank: Rank, size: usize, root: Rank, block: usize) -> Result<Schedule> {
    check_root(rank, size, root)?;
    let mut b = ScheduleBuilder::new(rank, size, "scatter flat");
    if block == 0 {
        return Ok(b.finish());
    }
    add_root_agreement(&mut b, rank, size);
    let mine = Region::new(Buf::Recv, 0, block);
    if rank == root {
        b.reserve(size, 0);
        for q in (0..size).filter(|&q| q != root) {
            b.send(q, 0, Region::new(Buf::Send, q * block, block), &[]);
        }
        b.copy(Region::new(Buf::Send, root * block, block), mine, &[]);
    } else {
        b.recv(root, 0, mine, &[]);
    }
    Ok(b.finish())
}
