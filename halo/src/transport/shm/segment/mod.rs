//! A host's shared-memory segment: one file in `/dev/shm`, reserved (empty) by every
//! rank before the bootstrap exchange, sized by the lowest rank of the host's ranks
//! after it, mapped by each of them, unlinked by the last one to map it; its layout;
//! the rings' and bells' raw access; the futex.
//!
//! The segment holds the `n` ranks of one host (all of a one-host job's); rings and
//! bells are indexed by *slot* (the rank's place among them), and every accessor takes
//! the job's rank and maps it ([`Segment::set_ranks`]).
//!
//! Layout (all offsets from the start of the mapping; a fresh file is all zero, and
//! all zero is a valid state — every ring empty, every bell awake — so ranks may map
//! it as soon as its maker has written the header):
//! - page 0: [`Header`];
//! - from page 1: one [`Bell`](bell::Bell) (64 bytes) per rank, padded to a page (its
//!   futex word, and what peers need to probe cross-memory attach: pid, PID namespace,
//!   probe word);
//! - then `N x N` rings, ring `(s, r)` (sender `s`, receiver `r`) at index `s * N + r`
//!   (the diagonal is unused), each a [`RingCtl`] (128 bytes) followed by `slots`
//!   cells of `cell` bytes: a [`CellHead`] (32 bytes) and the payload.
//!
//! Files: this one, the [`Segment`] type (the mapping, its slots, the rings' and cells'
//! raw access, unmapping); `file.rs`: the file's life cycle in `/dev/shm` (reserve,
//! size, open when ready, remove; the sweep of stale files); `layout.rs`: the header,
//! the rings' control blocks, the geometry and the offsets; `cell.rs`: a cell's header
//! and its protocol (stamp, publish, published; the kinds; the rendezvous payload);
//! `bell.rs`: the bells (each a `host::futex::Futex` and what peers need to probe
//! cross-memory attach).

mod bell;
mod cell;
mod file;
mod layout;

pub(super) use cell::{
    CELL_HEAD, CellHead, KIND_FIRST, KIND_MORE, KIND_POISON, KIND_RDV, Rdv, publish, published,
    stamp, write_head,
};
pub(crate) use file::{Reservation, is_segment_path};

use crate::transport::CResult;
use halo_collectives::CollectiveError;
use layout::{CTL, Header, RingCtl, layout};
use std::os::fd::AsRawFd as _;
use std::os::unix::fs::MetadataExt as _;
use std::path::PathBuf;
use std::ptr;
use std::sync::atomic::Ordering;

/// A mapped segment.
pub(crate) struct Segment {
    base: *mut u8,
    len: usize,
    nranks: usize,
    slots: usize,
    cell: usize,
    bells_at: usize,
    rings_at: usize,
    ring_len: usize,
    /// The file and its (device, inode), for the creator: it removes the file on drop
    /// if the file is still there (a rank never attached).
    own: Option<(PathBuf, u64, u64)>,
    path: String,
    /// Job rank -> slot in this segment (`NO_SLOT`: a rank of another host).
    slot: Vec<u32>,
}

/// [`Segment`]'s `slot` of a rank that is not in the segment.
const NO_SLOT: u32 = u32::MAX;

impl std::fmt::Debug for Segment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Segment")
            .field("path", &self.path)
            .field("nranks", &self.nranks)
            .field("slots", &self.slots)
            .field("cell", &self.cell)
            .finish()
    }
}

// SAFETY: the mapping is process-wide shared memory; everything other ranks (or
// threads) also write is accessed through atomics or, for cells, under the rings'
// single-producer/single-consumer protocol; the pointer itself is owned by this value.
unsafe impl Send for Segment {}

fn sys(what: &str, e: impl std::fmt::Display) -> CollectiveError {
    CollectiveError::System(format!("shared-memory transport: {what}: {e}"))
}

impl Segment {
    fn map(
        f: &std::fs::File,
        len: usize,
        nranks: usize,
        slots: usize,
        cell: usize,
        own: Option<(PathBuf, u64, u64)>,
    ) -> CResult<Segment> {
        let (bells_at, rings_at, ring_len, _) =
            layout(nranks, slots, cell).ok_or_else(|| sys("layout", "overflow"))?;
        // SAFETY: a fresh shared mapping of `len` bytes of a file at least that long
        // (created and sized by us, or checked by `open`); the result is checked
        // against MAP_FAILED before use.
        let base = unsafe {
            libc::mmap(
                ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED || base.is_null() {
            return Err(sys("mmap", std::io::Error::last_os_error()));
        }
        let path = own
            .as_ref()
            .map(|o| o.0.to_string_lossy().into_owned())
            .unwrap_or_default();
        Ok(Segment {
            base: base.cast(),
            len,
            nranks,
            slots,
            cell,
            bells_at,
            rings_at,
            ring_len,
            own,
            path,
            slot: (0..nranks as u32).collect(),
        })
    }

    /// The file's path.
    pub(crate) fn path(&self) -> &str {
        &self.path
    }

    /// Slots per ring.
    pub(super) fn slots(&self) -> usize {
        self.slots
    }

    /// Payload bytes per cell.
    pub(super) fn payload(&self) -> usize {
        self.cell - CELL_HEAD
    }

    fn header(&self) -> &Header {
        // SAFETY: the mapping is page-aligned and at least a page long; the header's
        // fields are atomics, so shared access from other processes is sound.
        unsafe { &*self.base.cast::<Header>() }
    }

    /// Counts this rank as attached; the rank that completes the count removes the
    /// file (every rank has it mapped now, so nothing is left in `/dev/shm` however
    /// the job ends). Returns whether this call removed it.
    pub(crate) fn attach(&self) -> bool {
        let n = self.header().attached.fetch_add(1, Ordering::AcqRel) + 1;
        if n as usize == self.nranks && !self.path.is_empty() {
            let _ = std::fs::remove_file(&self.path);
            tracing::debug!(path = %self.path, "shared-memory segment unlinked: every rank attached");
            return true;
        }
        false
    }

    /// How many ranks the segment holds.
    pub(crate) fn ranks(&self) -> usize {
        self.nranks
    }

    /// How many ranks have attached.
    pub(crate) fn attached(&self) -> usize {
        self.header().attached.load(Ordering::Acquire) as usize
    }

    /// Which job ranks the segment's slots hold, in slot order (`ranks[i]` has slot
    /// `i`; one per slot), in a job of `size` ranks. By default rank `i` has slot `i`.
    pub(crate) fn set_ranks(&mut self, ranks: &[usize], size: usize) -> CResult<()> {
        if ranks.len() != self.nranks || ranks.iter().any(|&r| r >= size) {
            return Err(CollectiveError::Internal(format!(
                "shared-memory segment of {} ranks given ranks {ranks:?} of {size}",
                self.nranks
            )));
        }
        self.slot = vec![NO_SLOT; size];
        for (i, &r) in ranks.iter().enumerate() {
            self.slot[r] = i as u32;
        }
        Ok(())
    }

    /// Whether job rank `rank` has a slot in this segment.
    pub(super) fn holds(&self, rank: usize) -> bool {
        self.slot.get(rank).is_some_and(|&s| s != NO_SLOT)
    }

    /// The slot of job rank `rank` (a rank of this segment).
    #[inline]
    fn at(&self, rank: usize) -> usize {
        let s = self.slot[rank] as usize;
        debug_assert!(s < self.nranks, "rank {rank} has no slot");
        s
    }

    /// The control block of ring `(s, r)` (job ranks).
    pub(super) fn ring(&self, s: usize, r: usize) -> &RingCtl {
        let (s, r) = (self.at(s), self.at(r));
        debug_assert!(s < self.nranks && r < self.nranks);
        let at = self.rings_at + (s * self.nranks + r) * self.ring_len;
        // SAFETY: `at + CTL` is inside the mapping (layout), 64-aligned (page-aligned
        // base, CTL and cell multiples of 64); the fields are atomics.
        unsafe { &*self.base.add(at).cast::<RingCtl>() }
    }

    /// A pointer to cell `i` (`< slots`) of ring `(s, r)`; `cell` bytes from there
    /// lie inside the mapping.
    pub(super) fn cell(&self, s: usize, r: usize, i: usize) -> *mut u8 {
        let (s, r) = (self.at(s), self.at(r));
        debug_assert!(s < self.nranks && r < self.nranks && i < self.slots);
        let at = self.rings_at + (s * self.nranks + r) * self.ring_len + CTL + i * self.cell;
        // SAFETY: in bounds of the mapping by the layout (see `layout`).
        unsafe { self.base.add(at) }
    }

    /// The rendezvous in cell `i` of ring `(s, r)`.
    pub(super) fn rdv(&self, s: usize, r: usize, i: usize) -> &Rdv {
        // SAFETY: the payload of a cell starts CELL_HEAD (32) bytes into it, so it is
        // 32-aligned, and is at least 32 bytes (cells are multiples of 64 above the
        // header): room for the two atomics.
        unsafe { &*self.cell(s, r, i).add(CELL_HEAD).cast::<Rdv>() }
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, unmapped once; nothing borrows it any more
        // (borrows of `self` end before drop).
        unsafe { libc::munmap(self.base.cast(), self.len) };
        if let Some((path, dev, ino)) = &self.own
            && let Ok(m) = std::fs::metadata(path)
            && m.dev() == *dev
            && m.ino() == *ino
        {
            // A rank never attached (the job failed during set-up): the creator removes it.
            let _ = std::fs::remove_file(path);
        }
    }
}
