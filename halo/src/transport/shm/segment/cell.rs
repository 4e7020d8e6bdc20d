//! A cell of a ring: its header ([`CellHead`]: tag, length, call descriptor, stamp,
//! chunk) and the protocol by which the sender publishes it and the receiver finds it
//! (the stamp, written last with Release: [`write_head`], [`publish`], [`published`]);
//! the cells' kinds; the rendezvous cell's payload ([`Rdv`]).

use std::ptr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Bytes of a cell's header.
pub(crate) const CELL_HEAD: usize = std::mem::size_of::<CellHead>();

/// A rendezvous cell's payload: the state word (see `cma.rs`) and the address of the
/// sender's bytes.
#[repr(C)]
pub(crate) struct Rdv {
    pub(crate) state: AtomicU64,
    pub(crate) addr: AtomicU64,
}

/// What a cell carries before its payload. Written by the sender, `stamp` last with
/// Release ([`publish`]): that store publishes the cell; the receiver reads the stamp
/// with Acquire ([`published`]) and the rest only once it is the cell's.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct CellHead {
    /// The message's full tag.
    pub(crate) tag: u64,
    /// The message's length in bytes (all its cells together).
    pub(crate) len: u64,
    /// The descriptor of the sender's call (`halo_collectives::Call`, 0 for none; with
    /// poison, of the call the poisoner failed).
    pub(crate) call: u64,
    /// The kind ([`KIND_FIRST`], [`KIND_MORE`], [`KIND_POISON`], [`KIND_RDV`]) in the
    /// low 8 bits, the cell's number in the ring plus one (modulo 2^24) above: a cell
    /// holds either its previous occupant's stamp (`slots` numbers earlier, never equal:
    /// at most 65,536 slots), zero (never used) or the one the receiver waits for.
    pub(crate) stamp: u32,
    /// Payload bytes in this cell.
    pub(crate) chunk: u32,
}

/// Where [`CellHead::stamp`] lies in a cell.
const STAMP_AT: usize = std::mem::offset_of!(CellHead, stamp);

impl CellHead {
    /// The cell's kind.
    pub(crate) fn kind(&self) -> u32 {
        self.stamp & 0xff
    }
}

/// The stamp of cell number `seq` of a ring (counted from 0 over the ring's life).
pub(crate) fn stamp(kind: u32, seq: u64) -> u32 {
    ((seq.wrapping_add(1) as u32) << 8) | (kind & 0xff)
}

/// Writes every field of `h` but its stamp into `cell` (the payload may follow; then
/// [`publish`]).
///
/// # Safety
/// `cell` is a cell of the mapping that this rank, its ring's sender, may write: free
/// (the receiver has consumed its previous occupant) and not yet published.
pub(crate) unsafe fn write_head(cell: *mut u8, h: &CellHead) {
    let c = cell.cast::<CellHead>();
    // SAFETY: per the caller, the cell is ours to write; the fields are inside it and
    // aligned (the cell is 64-aligned, `CellHead` is `repr(C)`). The stamp, which the
    // receiver may be reading, is not touched here.
    unsafe {
        ptr::addr_of_mut!((*c).tag).write(h.tag);
        ptr::addr_of_mut!((*c).len).write(h.len);
        ptr::addr_of_mut!((*c).call).write(h.call);
        ptr::addr_of_mut!((*c).chunk).write(h.chunk);
    }
}

/// Publishes `cell`: stores its stamp with Release, after everything else in it.
///
/// # Safety
/// As [`write_head`]; the cell's header and payload are written.
pub(crate) unsafe fn publish(cell: *mut u8, stamp: u32) {
    // SAFETY: the stamp is a 4-aligned u32 inside the cell, accessed only atomically
    // while the cell may be read (here and in `published`).
    unsafe { AtomicU32::from_ptr(cell.add(STAMP_AT).cast::<u32>()) }
        .store(stamp, Ordering::Release);
}

/// Whether `cell` holds cell number `seq` of its ring (published): if so, its header
/// and payload may be read.
///
/// # Safety
/// `cell` is the cell of the mapping where number `seq` goes, in a ring this rank
/// receives on.
pub(crate) unsafe fn published(cell: *const u8, seq: u64) -> bool {
    // SAFETY: as in `publish`.
    let st = unsafe { AtomicU32::from_ptr(cell.add(STAMP_AT).cast::<u32>().cast_mut()) }
        .load(Ordering::Acquire);
    st >> 8 == stamp(0, seq) >> 8
}

/// The first cell of a message.
pub(crate) const KIND_FIRST: u32 = 1;
/// A further cell of the message in progress.
pub(crate) const KIND_MORE: u32 = 2;
/// Poison in place of the message `tag` (no payload).
pub(crate) const KIND_POISON: u32 = 3;
/// A whole message by rendezvous: the payload is a [`Rdv`], the receiver reads the
/// bytes from the sender's memory.
pub(crate) const KIND_RDV: u32 = 4;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cell_is_published_by_its_own_stamp_only() {
        // A cell holds zero (never used), its previous occupant's stamp (`slots`
        // numbers earlier) or its own: only its own is published, across the stamp's
        // 24-bit wrap too, whatever the kinds.
        #[repr(C, align(64))]
        struct Cell([u8; 64]);
        let mut cell = Cell([0; 64]);
        let c = cell.0.as_mut_ptr();
        for slots in [2u64, 3, 32, 1 << 16] {
            for seq in [
                0,
                1,
                slots - 1,
                slots,
                (1 << 24) - 1,
                1 << 24,
                (1 << 24) + slots,
                1 << 40,
            ] {
                // SAFETY: (test) `c` is a 64-aligned, 64-byte cell of this test's own.
                unsafe {
                    if seq < slots {
                        publish(c, 0);
                        assert!(!published(c, seq), "zero as {seq}");
                    } else {
                        publish(c, stamp(KIND_FIRST, seq - slots));
                        assert!(!published(c, seq), "{seq} - {slots} as {seq}");
                    }
                    for kind in [KIND_FIRST, KIND_MORE, KIND_POISON, KIND_RDV] {
                        write_head(
                            c,
                            &CellHead {
                                tag: seq,
                                len: 1,
                                call: 2,
                                stamp: 0,
                                chunk: 3,
                            },
                        );
                        publish(c, stamp(kind, seq));
                        assert!(published(c, seq), "{seq} of {slots}");
                        let h = ptr::read(c.cast::<CellHead>());
                        assert_eq!((h.tag, h.len, h.call, h.chunk), (seq, 1, 2, 3));
                        assert_eq!(h.kind(), kind);
                        assert!(!published(c, seq + 1) && !published(c, seq + slots));
                    }
                }
            }
        }
    }
}
