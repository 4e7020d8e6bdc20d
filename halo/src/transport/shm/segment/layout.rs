//! The segment's layout: its header (page 0), the rings' control blocks, the geometry
//! (`HALO_SHM_SLOTS`, `HALO_SHM_CELL`) and the byte offsets of the bells and rings.

use super::bell::Bell;
use super::cell::{CELL_HEAD, Rdv};
use crate::host::CACHE_LINE;
use std::sync::atomic::{AtomicU32, AtomicU64};

/// The header's magic: `"HALOSHM1"`.
pub(super) const MAGIC: u64 = u64::from_le_bytes(*b"HALOSHM1");
/// Page size used for the layout (the mapping itself is page-aligned).
pub(super) const PAGE: usize = 4096;
/// Bytes of a ring's control block (the head on its own cache line).
pub(super) const CTL: usize = CACHE_LINE;
const _: () = assert!(
    std::mem::size_of::<RingCtl>() == CTL
        && std::mem::size_of::<Bell>() == CACHE_LINE
        && CELL_HEAD == 32
        && std::mem::size_of::<Rdv>() <= 32
);

/// The segment's first page.
#[repr(C)]
pub(super) struct Header {
    /// [`MAGIC`], written last by the creator (Release).
    pub(super) magic: AtomicU64,
    pub(super) nranks: AtomicU32,
    pub(super) slots: AtomicU32,
    pub(super) cell: AtomicU32,
    /// Ranks that have mapped the segment; the one that makes it `nranks` unlinks the file.
    pub(super) attached: AtomicU32,
}

/// One ring's control block: `head` (cells consumed, written by the receiver) on its
/// own cache line and, next to it, `cma`: whether the receiver can read the sender's
/// memory ([`CMA_OK`](crate::transport::shm::cma::CMA_OK)), written once by the
/// receiver at set-up. There is no tail: a cell is published by its own stamp
/// ([`CellHead::stamp`](super::cell::CellHead::stamp)), so the receiver finds a
/// message by reading the cell it needs anyway (one cache line from the sender's core,
/// not a tail's and then the cell's).
#[repr(C, align(64))]
pub(crate) struct RingCtl {
    pub(crate) head: AtomicU64,
    pub(crate) cma: AtomicU32,
    _pad: [u8; 52],
}

/// `HALO_SHM_CELL`'s smallest value (the table's bound): a cell's head and one word.
const CELL_MIN: u64 = match halo_params::SHM_CELL.kind {
    halo_params::Kind::Number { min, .. } => min,
    _ => 0,
};
const _: () = assert!(
    CELL_MIN == (CELL_HEAD + 8) as u64,
    "HALO_SHM_CELL's lower bound in halo-params is the cell head plus one word"
);

/// The layout for `nranks` ranks: (slots per ring, bytes per cell).
pub(super) fn geometry(nranks: usize) -> (usize, usize) {
    // A malformed or out-of-bounds value is logged and the default taken.
    let slots = match halo_params::SHM_SLOTS.number_or_warn() {
        Some(s) => s as usize,
        // Every ring is used in an all-to-all, so all of it ends up resident:
        // N x N x slots x cell bytes (8 ranks: 16 MiB; 64 ranks: 512 MiB; 128: 1 GiB).
        _ if nranks <= 16 => 32,
        _ if nranks <= 64 => 16,
        _ => 8,
    };
    let cell = match halo_params::SHM_CELL.number_or_warn() {
        Some(c) => (c as usize).next_multiple_of(CACHE_LINE),
        None => 8192,
    };
    (slots, cell)
}

fn round_page(n: usize) -> usize {
    n.next_multiple_of(PAGE)
}

/// Byte offsets: (bells, rings, one ring's length, total).
pub(super) fn layout(
    nranks: usize,
    slots: usize,
    cell: usize,
) -> Option<(usize, usize, usize, usize)> {
    let bells_at = PAGE;
    let rings_at = bells_at + round_page(nranks.checked_mul(CACHE_LINE)?);
    let ring_len = CTL + slots.checked_mul(cell)?;
    let total = rings_at + nranks.checked_mul(nranks)?.checked_mul(ring_len)?;
    Some((bells_at, rings_at, ring_len, round_page(total)))
}
