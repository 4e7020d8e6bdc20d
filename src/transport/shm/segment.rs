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
//! - from page 1: one [`Bell`] (64 bytes) per rank, padded to a page (its futex word,
//!   and what peers need to probe cross-memory attach: pid, PID namespace, probe word);
//! - then `N x N` rings, ring `(s, r)` (sender `s`, receiver `r`) at index `s * N + r`
//!   (the diagonal is unused), each a [`RingCtl`] (128 bytes) followed by `slots`
//!   cells of `cell` bytes: a [`CellHead`] (32 bytes) and the payload.

use halo_collectives::CollectiveError;
use std::ffi::{c_int, c_long};
use std::os::fd::AsRawFd as _;
use std::os::unix::fs::MetadataExt as _;
use std::path::PathBuf;
use std::ptr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering, fence};
use std::time::Duration;

type CResult<T> = std::result::Result<T, CollectiveError>;

/// The header's magic: `"HALOSHM1"`.
const MAGIC: u64 = u64::from_le_bytes(*b"HALOSHM1");
/// Page size used for the layout (the mapping itself is page-aligned).
const PAGE: usize = 4096;
/// Bytes of a ring's control block (the head on its own cache line).
const CTL: usize = 64;
/// Bytes of a cell's header.
pub(super) const CELL_HEAD: usize = std::mem::size_of::<CellHead>();
const _: () = assert!(
    std::mem::size_of::<RingCtl>() == CTL
        && std::mem::size_of::<Bell>() == 64
        && CELL_HEAD == 32
        && std::mem::size_of::<Rdv>() <= 32
);
/// Prefix of the segment files' names in `/dev/shm`.
pub(crate) const FILE_PREFIX: &str = "halo-shm-";

/// A bell's word: its owner sleeps (or is about to).
const ASLEEP: u32 = 1;
/// A bell's word: its owner is awake, or was rung.
const AWAKE: u32 = 0;

/// The segment's first page.
#[repr(C)]
struct Header {
    /// [`MAGIC`], written last by the creator (Release).
    magic: AtomicU64,
    nranks: AtomicU32,
    slots: AtomicU32,
    cell: AtomicU32,
    /// Ranks that have mapped the segment; the one that makes it `nranks` unlinks the file.
    attached: AtomicU32,
}

/// One ring's control block: `head` (cells consumed, written by the receiver) on its
/// own cache line and, next to it, `cma`: whether the receiver can read the sender's
/// memory ([`super::cma::CMA_OK`]), written once by the receiver at set-up. There is no
/// tail: a cell is published by its own stamp ([`CellHead::stamp`]), so the receiver
/// finds a message by reading the cell it needs anyway (one cache line from the
/// sender's core, not a tail's and then the cell's).
#[repr(C, align(64))]
pub(super) struct RingCtl {
    pub(super) head: AtomicU64,
    pub(super) cma: AtomicU32,
    _pad: [u8; 52],
}

/// A rank's bell: one futex word, on its own cache line, and (written once before the
/// rank attaches, read by peers after every rank has) what a peer needs to probe
/// cross-memory attach to it.
#[repr(C, align(64))]
pub(super) struct Bell {
    word: AtomicU32,
    /// The rank's process id (in its PID namespace).
    pub(super) pid: AtomicU32,
    /// Its PID namespace's inode.
    pub(super) pid_ns: AtomicU64,
    /// The address of its probe word and the word's value.
    pub(super) probe_addr: AtomicU64,
    pub(super) probe_val: AtomicU64,
}

/// A rendezvous cell's payload: the state word (see `cma.rs`) and the address of the
/// sender's bytes.
#[repr(C)]
pub(super) struct Rdv {
    pub(super) state: AtomicU64,
    pub(super) addr: AtomicU64,
}

/// What a cell carries before its payload. Written by the sender, `stamp` last with
/// Release ([`publish`]): that store publishes the cell; the receiver reads the stamp
/// with Acquire ([`published`]) and the rest only once it is the cell's.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(super) struct CellHead {
    /// The message's full tag.
    pub(super) tag: u64,
    /// The message's length in bytes (all its cells together).
    pub(super) len: u64,
    /// The descriptor of the sender's call (`halo_collectives::Call`, 0 for none; with
    /// poison, of the call the poisoner failed).
    pub(super) call: u64,
    /// The kind ([`KIND_FIRST`], [`KIND_MORE`], [`KIND_POISON`], [`KIND_RDV`]) in the
    /// low 8 bits, the cell's number in the ring plus one (modulo 2^24) above: a cell
    /// holds either its previous occupant's stamp (`slots` numbers earlier, never equal:
    /// at most 65,536 slots), zero (never used) or the one the receiver waits for.
    pub(super) stamp: u32,
    /// Payload bytes in this cell.
    pub(super) chunk: u32,
}

/// Where [`CellHead::stamp`] lies in a cell.
const STAMP_AT: usize = std::mem::offset_of!(CellHead, stamp);

impl CellHead {
    /// The cell's kind.
    pub(super) fn kind(&self) -> u32 {
        self.stamp & 0xff
    }
}

/// The stamp of cell number `seq` of a ring (counted from 0 over the ring's life).
pub(super) fn stamp(kind: u32, seq: u64) -> u32 {
    ((seq.wrapping_add(1) as u32) << 8) | (kind & 0xff)
}

/// Writes every field of `h` but its stamp into `cell` (the payload may follow; then
/// [`publish`]).
///
/// # Safety
/// `cell` is a cell of the mapping that this rank, its ring's sender, may write: free
/// (the receiver has consumed its previous occupant) and not yet published.
pub(super) unsafe fn write_head(cell: *mut u8, h: &CellHead) {
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
pub(super) unsafe fn publish(cell: *mut u8, stamp: u32) {
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
pub(super) unsafe fn published(cell: *const u8, seq: u64) -> bool {
    // SAFETY: as in `publish`.
    let st = unsafe { AtomicU32::from_ptr(cell.add(STAMP_AT).cast::<u32>().cast_mut()) }
        .load(Ordering::Acquire);
    st >> 8 == stamp(0, seq) >> 8
}

/// The first cell of a message.
pub(super) const KIND_FIRST: u32 = 1;
/// A further cell of the message in progress.
pub(super) const KIND_MORE: u32 = 2;
/// Poison in place of the message `tag` (no payload).
pub(super) const KIND_POISON: u32 = 3;
/// A whole message by rendezvous: the payload is a [`Rdv`], the receiver reads the
/// bytes from the sender's memory.
pub(super) const KIND_RDV: u32 = 4;

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

/// Why [`Segment::open`] did not open a segment.
#[derive(Debug)]
enum NotReady {
    /// Its maker has not sized it yet (what was found).
    Yet(String),
    /// It cannot be opened.
    Not(CollectiveError),
}

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
        Some(c) => (c as usize).next_multiple_of(64),
        None => 8192,
    };
    (slots, cell)
}

fn round_page(n: usize) -> usize {
    n.next_multiple_of(PAGE)
}

/// Byte offsets: (bells, rings, one ring's length, total).
fn layout(nranks: usize, slots: usize, cell: usize) -> Option<(usize, usize, usize, usize)> {
    let bells_at = PAGE;
    let rings_at = bells_at + round_page(nranks.checked_mul(64)?);
    let ring_len = CTL + slots.checked_mul(cell)?;
    let total = rings_at + nranks.checked_mul(nranks)?.checked_mul(ring_len)?;
    Some((bells_at, rings_at, ring_len, round_page(total)))
}

fn sys(what: &str, e: impl std::fmt::Display) -> CollectiveError {
    CollectiveError::System(format!("shared-memory transport: {what}: {e}"))
}

/// This process's PID namespace number (for file names that tell processes apart).
fn pid_ns() -> String {
    std::fs::read_link("/proc/self/ns/pid")
        .map(|l| {
            l.to_string_lossy()
                .chars()
                .filter(char::is_ascii_digit)
                .collect()
        })
        .unwrap_or_default()
}

/// Whether `path` names a segment file (`/dev/shm/halo-shm-N-N-N-TAG`).
pub(crate) fn is_segment_path(path: &str) -> bool {
    crate::transport::sys::is_shared_name(path, FILE_PREFIX)
}

/// Removes the segment files of processes of this PID namespace that ended without
/// removing theirs (killed during set-up): regular files of this user only.
fn remove_stale(ns: &str) {
    let prefix = format!("{FILE_PREFIX}{ns}-");
    let Ok(dir) = std::fs::read_dir("/dev/shm") else {
        return;
    };
    for entry in dir.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(&prefix))
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            crate::transport::sys::remove_own_file(&entry.path());
        }
    }
}

/// An empty segment file this rank made before the bootstrap exchange (its name goes
/// in its card): the segment of its host's ranks if it turns out to be the lowest of
/// them ([`Reservation::into_segment`]), removed on drop otherwise.
pub(crate) struct Reservation {
    path: PathBuf,
    dev: u64,
    ino: u64,
}

impl std::fmt::Debug for Reservation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reservation")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl Reservation {
    /// The file's path (`/dev/shm/halo-shm-NS-PID-N-TAG`).
    pub(crate) fn path(&self) -> String {
        self.path.to_string_lossy().into_owned()
    }

    /// Sizes the file for `nranks` ranks (the default geometry) and maps it: the
    /// segment the other ranks open ([`Segment::open_when_ready`]).
    pub(crate) fn into_segment(self, nranks: usize) -> CResult<Segment> {
        let (slots, cell) = geometry(nranks);
        self.into_segment_with(nranks, slots, cell)
    }

    /// [`Reservation::into_segment`] with `slots` cells of `cell` bytes per ring
    /// (`cell` a multiple of 64 above the cell header, `slots >= 2`).
    pub(crate) fn into_segment_with(
        mut self,
        nranks: usize,
        slots: usize,
        cell: usize,
    ) -> CResult<Segment> {
        // On failure the reservation's drop removes the file: ranks waiting for the
        // segment see it gone and fail at once.
        if slots < 2 || cell <= CELL_HEAD || !cell.is_multiple_of(64) {
            return Err(CollectiveError::InvalidArgument(format!(
                "shared-memory rings of {slots} cells of {cell} bytes: need at least 2 cells \
                 of a multiple of 64 bytes above {CELL_HEAD}"
            )));
        }
        let (_, _, _, total) = layout(nranks, slots, cell)
            .ok_or_else(|| sys("segment size", format!("too large for {nranks} ranks")))?;
        let path = self.path.clone();
        let f = crate::transport::sys::open_shared(&path)
            .map_err(|e| sys(&format!("cannot open {}", path.display()), e))?;
        let meta = f.metadata().map_err(|e| sys("stat", e))?;
        if (meta.dev(), meta.ino()) != (self.dev, self.ino) {
            return Err(sys(
                &path.display().to_string(),
                "replaced by another file since this rank made it",
            ));
        }
        f.set_len(total as u64).map_err(|e| {
            sys(
                &format!("cannot size {} to {total} bytes", path.display()),
                e,
            )
        })?;
        let own = Some((path.clone(), self.dev, self.ino));
        let seg = Self::map_created(&f, total, nranks, slots, cell, own)?;
        // The segment owns the file now (its drop removes it if no rank attached): the
        // reservation's drop leaves it alone.
        self.path = PathBuf::new();
        tracing::debug!(path = %path.display(), total, slots, cell, "shared-memory segment created");
        Ok(seg)
    }

    fn map_created(
        f: &std::fs::File,
        total: usize,
        nranks: usize,
        slots: usize,
        cell: usize,
        own: Option<(PathBuf, u64, u64)>,
    ) -> CResult<Segment> {
        let seg = Segment::map(f, total, nranks, slots, cell, own)?;
        let h = seg.header();
        h.nranks.store(nranks as u32, Ordering::Relaxed);
        h.slots.store(slots as u32, Ordering::Relaxed);
        h.cell.store(cell as u32, Ordering::Relaxed);
        h.magic.store(MAGIC, Ordering::Release);
        Ok(seg)
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if self.path.as_os_str().is_empty() {
            return;
        }
        if let Ok(m) = std::fs::metadata(&self.path)
            && m.dev() == self.dev
            && m.ino() == self.ino
        {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

impl Segment {
    /// Makes an empty segment file, `/dev/shm/halo-shm-NS-PID-N-TAG` (every rank that
    /// may use the transport does, before the card exchange): PID namespace, process,
    /// count and 64 random bits, so that no other user can guess the name; created
    /// private to this user (mode 0600, `O_EXCL`, `O_NOFOLLOW`: see
    /// [`crate::transport::sys::create_private`]).
    pub(crate) fn reserve() -> CResult<Reservation> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let ns = pid_ns();
        remove_stale(&ns);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let tag = crate::transport::sys::random_tag().map_err(|e| sys("getrandom", e))?;
        let path = PathBuf::from(format!(
            "/dev/shm/{FILE_PREFIX}{ns}-{}-{n}-{tag}",
            std::process::id()
        ));
        let f = crate::transport::sys::create_private(&path)
            .map_err(|e| sys(&format!("cannot create {}", path.display()), e))?;
        let meta = f.metadata().map_err(|e| sys("stat", e))?;
        Ok(Reservation {
            path,
            dev: meta.dev(),
            ino: meta.ino(),
        })
    }

    /// Creates a segment for `nranks` ranks at once ([`Segment::reserve`], then
    /// [`Reservation::into_segment`]).
    #[cfg(test)]
    pub(crate) fn create(nranks: usize) -> CResult<Segment> {
        Self::reserve()?.into_segment(nranks)
    }

    /// [`Segment::create`] with `slots` cells of `cell` bytes per ring.
    #[cfg(test)]
    pub(crate) fn create_with(nranks: usize, slots: usize, cell: usize) -> CResult<Segment> {
        Self::reserve()?.into_segment_with(nranks, slots, cell)
    }

    /// Opens the segment another rank sizes at `path` for `nranks` ranks, waiting
    /// until it has ([`Reservation::into_segment`]): fails when the file is gone (its
    /// maker failed or ended), when `ended()` says its maker ended, or after `limit`.
    pub(crate) fn open_when_ready(
        path: &str,
        nranks: usize,
        limit: Duration,
        ended: impl Fn() -> bool,
    ) -> CResult<Segment> {
        let start = std::time::Instant::now();
        let mut pause = Duration::from_micros(20);
        loop {
            match Self::open(path, nranks) {
                Ok(s) => return Ok(s),
                Err(NotReady::Not(e)) => return Err(e),
                Err(NotReady::Yet(why)) => {
                    if ended() {
                        return Err(sys(
                            path,
                            "the rank that makes this segment ended before it was ready",
                        ));
                    }
                    if start.elapsed() >= limit {
                        return Err(sys(
                            path,
                            format!(
                                "not ready within {limit:?} ({why}; HALO_BOOTSTRAP_TIMEOUT_MS)"
                            ),
                        ));
                    }
                }
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(2));
        }
    }

    /// Maps the segment another rank made at `path` for `nranks` ranks, after
    /// checking its header and size; `NotReady::Yet` while it is still empty or
    /// being sized.
    fn open(path: &str, nranks: usize) -> Result<Segment, NotReady> {
        if !is_segment_path(path) {
            return Err(NotReady::Not(CollectiveError::InvalidUsage(format!(
                "{path:?} is not a HALO shared-memory segment (/dev/shm/{FILE_PREFIX}N-N-N-TAG)"
            ))));
        }
        let f = crate::transport::sys::open_shared(std::path::Path::new(path))
            .map_err(|e| NotReady::Not(sys(&format!("cannot open {path}"), e)))?;
        let size = f
            .metadata()
            .map_err(|e| NotReady::Not(sys("stat", e)))?
            .len() as usize;
        if size < PAGE {
            return Err(NotReady::Yet(format!("{size} bytes")));
        }
        // Map the header first to learn the geometry.
        let probe = Self::map(&f, PAGE, nranks, 1, CELL_HEAD + 8, None).map_err(NotReady::Not)?;
        let h = probe.header();
        if h.magic.load(Ordering::Acquire) != MAGIC {
            return Err(NotReady::Yet("no header yet".into()));
        }
        let (n, slots, cell) = (
            h.nranks.load(Ordering::Relaxed) as usize,
            h.slots.load(Ordering::Relaxed) as usize,
            h.cell.load(Ordering::Relaxed) as usize,
        );
        drop(probe);
        if n != nranks {
            return Err(NotReady::Not(CollectiveError::InvalidUsage(format!(
                "shared-memory segment {path} was made for {n} ranks, this host has {nranks}"
            ))));
        }
        let total = layout(nranks, slots, cell)
            .map(|l| l.3)
            .filter(|&t| t == size && slots >= 2 && cell > CELL_HEAD)
            .ok_or_else(|| NotReady::Not(sys(path, "size does not match its header")))?;
        let mut seg = Self::map(&f, total, nranks, slots, cell, None).map_err(NotReady::Not)?;
        seg.path = path.to_string();
        Ok(seg)
    }

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

    pub(super) fn bell(&self, rank: usize) -> &Bell {
        let rank = self.at(rank);
        debug_assert!(rank < self.nranks);
        // SAFETY: inside the bells' pages, 64-aligned; the word is atomic.
        unsafe { &*self.base.add(self.bells_at + rank * 64).cast::<Bell>() }
    }

    /// Wakes `rank` if it sleeps on its bell. Call after publishing something it may
    /// wait for (a cell or a head).
    pub(super) fn ring_bell(&self, rank: usize) {
        // Pairs with the fence in `sleep`: either this load sees ASLEEP or the
        // sleeper's look after its store sees what was published before this fence.
        fence(Ordering::SeqCst);
        let w = &self.bell(rank).word;
        if w.load(Ordering::Relaxed) == ASLEEP && w.swap(AWAKE, Ordering::SeqCst) == ASLEEP {
            // SAFETY: FUTEX_WAKE on a valid, aligned u32 in a shared mapping (not
            // FUTEX_PRIVATE: the waiter may be another process); no other argument is read.
            unsafe {
                libc::syscall(
                    libc::SYS_futex,
                    ptr::from_ref(w),
                    libc::FUTEX_WAKE,
                    1 as c_int,
                )
            };
        }
    }

    /// Marks `rank` asleep on its bell. The caller then looks at its rings once more
    /// and, if it found nothing, calls [`Segment::futex_wait`]; then
    /// [`Segment::mark_awake`].
    pub(super) fn mark_asleep(&self, rank: usize) {
        self.bell(rank).word.store(ASLEEP, Ordering::SeqCst);
        // Pairs with the fence in `ring_bell`: either the waker sees ASLEEP or the look
        // after this fence sees what it published.
        fence(Ordering::SeqCst);
    }

    /// Sleeps until `rank`'s bell is rung or `timeout` passes (at once if it was rung
    /// since [`Segment::mark_asleep`]).
    pub(super) fn futex_wait(&self, rank: usize, timeout: Duration) {
        let w = &self.bell(rank).word;
        let ts = libc::timespec {
            tv_sec: timeout.as_secs() as libc::time_t,
            tv_nsec: c_long::from(timeout.subsec_nanos() as i32),
        };
        // SAFETY: FUTEX_WAIT on a valid, aligned, shared u32 with a valid relative
        // timeout; it returns at once if the word is no longer ASLEEP.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                ptr::from_ref(w),
                libc::FUTEX_WAIT,
                ASLEEP as c_int,
                &ts as *const libc::timespec,
            )
        };
    }

    /// Marks `rank` awake.
    pub(super) fn mark_awake(&self, rank: usize) {
        self.bell(rank).word.store(AWAKE, Ordering::SeqCst);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segment_paths() {
        assert!(is_segment_path(
            "/dev/shm/halo-shm-4026531836-1234-0-0123456789abcdef"
        ));
        // The old name without the random tag, a short or upper-case tag.
        assert!(!is_segment_path("/dev/shm/halo-shm-4026531836-1234-0"));
        assert!(!is_segment_path("/dev/shm/halo-shm-1-2-3-0123456789abcde"));
        assert!(!is_segment_path("/dev/shm/halo-shm-1-2-3-0123456789ABCDEF"));
        assert!(!is_segment_path("/dev/shm/halo-shm-1-2"));
        assert!(!is_segment_path("/dev/shm/halo-shm-1-2-x"));
        assert!(!is_segment_path("/tmp/halo-shm-1-2-3"));
        assert!(!is_segment_path("/dev/shm/../etc/halo-shm-1-2-3"));
    }

    #[test]
    fn segment_files_are_private_with_unguessable_names() {
        use std::os::unix::fs::PermissionsExt as _;
        let a = Segment::reserve().unwrap();
        let b = Segment::reserve().unwrap();
        let (pa, pb) = (a.path(), b.path());
        assert!(is_segment_path(&pa) && is_segment_path(&pb), "{pa} {pb}");
        // Same process, consecutive counts: the names still differ in their tags.
        let tag = |p: &str| p.rsplit('-').next().unwrap().to_string();
        assert_ne!(tag(&pa), tag(&pb));
        let meta = std::fs::symlink_metadata(&pa).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600, "{pa}");
        assert_eq!(meta.uid(), crate::transport::sys::euid());
    }

    #[test]
    fn create_open_attach_unlinks_once_all_attached() {
        let a = Segment::create(2).unwrap();
        let path = a.path().to_string();
        let b = Segment::open(&path, 2).unwrap();
        assert!(matches!(
            Segment::open(&path, 3),
            Err(NotReady::Not(CollectiveError::InvalidUsage(_)))
        ));
        assert!(!a.attach());
        assert!(std::path::Path::new(&path).exists());
        assert!(b.attach());
        assert!(!std::path::Path::new(&path).exists());
        // Both still share the memory.
        a.ring(0, 1).head.store(7, Ordering::Release);
        assert_eq!(b.ring(0, 1).head.load(Ordering::Acquire), 7);
    }

    #[test]
    fn creator_removes_the_file_when_nobody_attached() {
        let a = Segment::create(3).unwrap();
        let path = a.path().to_string();
        assert!(std::path::Path::new(&path).exists());
        drop(a);
        assert!(!std::path::Path::new(&path).exists());
    }

    #[test]
    fn reservation_is_removed_unless_sized_and_waiters_see_either() {
        const LIMIT: Duration = Duration::from_secs(10);
        // Dropped: the file goes, and a rank waiting for it fails at once.
        let r = Segment::reserve().unwrap();
        let path = r.path();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 0);
        assert!(matches!(Segment::open(&path, 2), Err(NotReady::Yet(_))));
        drop(r);
        assert!(!std::path::Path::new(&path).exists());
        let t = std::time::Instant::now();
        let e = Segment::open_when_ready(&path, 2, LIMIT, || false).unwrap_err();
        assert!(e.to_string().contains("cannot open"), "{e}");
        assert!(t.elapsed() < Duration::from_secs(1));
        // Its maker ended: the waiter fails instead of waiting out the limit.
        let r = Segment::reserve().unwrap();
        let e = Segment::open_when_ready(&r.path(), 2, LIMIT, || true).unwrap_err();
        assert!(e.to_string().contains("ended before it was ready"), "{e}");
        // Sized while another rank waits: it opens it; ranks map to slots.
        let path = r.path();
        let waiter = std::thread::spawn(move || {
            let mut b = Segment::open_when_ready(&path, 2, LIMIT, || false).unwrap();
            b.set_ranks(&[3, 5], 6).unwrap();
            b
        });
        std::thread::sleep(Duration::from_millis(30));
        let mut a = r.into_segment_with(2, 4, 128).unwrap();
        a.set_ranks(&[3, 5], 6).unwrap();
        let b = waiter.join().unwrap();
        assert!(a.holds(3) && a.holds(5) && !a.holds(0) && !a.holds(4) && !a.holds(9));
        a.ring(5, 3).head.store(11, Ordering::Release);
        assert_eq!(b.ring(5, 3).head.load(Ordering::Acquire), 11);
        assert_eq!(b.ring(3, 5).head.load(Ordering::Acquire), 0);
        assert!(a.set_ranks(&[1, 2, 3], 6).is_err());
        assert!(!a.attach());
        assert!(b.attach());
        assert!(!std::path::Path::new(a.path()).exists());
    }

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
