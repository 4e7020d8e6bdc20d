//! The segment's file in `/dev/shm` and its life cycle: reserved (empty, private,
//! unguessable name) by every rank before the bootstrap exchange, sized by its maker,
//! opened by the other ranks once it is ready, removed by the reservation's or the
//! maker's drop when nobody attached. (Its name, the private-file rule and the sweep
//! of files that ended processes left are `crate::host::files`.)

use super::cell::CELL_HEAD;
use super::layout::{MAGIC, PAGE, geometry, layout};
use super::{CResult, Segment, sys};
use crate::host::{CACHE_LINE, files};
use halo_collectives::CollectiveError;
use std::os::unix::fs::MetadataExt as _;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// The segment files' kind of name in `/dev/shm` (`halo-shm-`).
const KIND: files::Kind = files::Kind::Segment;

/// Why [`Segment::open`] did not open a segment.
#[derive(Debug)]
enum NotReady {
    /// Its maker has not sized it yet (what was found).
    Yet(String),
    /// It cannot be opened.
    Not(CollectiveError),
}

/// Whether `path` names a segment file (`/dev/shm/halo-shm-N-N-N-TAG`).
pub(crate) fn is_segment_path(path: &str) -> bool {
    files::is_shared_name(path, KIND)
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
        if slots < 2 || cell <= CELL_HEAD || !cell.is_multiple_of(CACHE_LINE) {
            return Err(CollectiveError::InvalidArgument(format!(
                "shared-memory rings of {slots} cells of {cell} bytes: need at least 2 cells \
                 of a multiple of 64 bytes above {CELL_HEAD}"
            )));
        }
        let (_, _, _, total) = layout(nranks, slots, cell)
            .ok_or_else(|| sys("segment size", format!("too large for {nranks} ranks")))?;
        let path = self.path.clone();
        let f = files::open_shared(&path)
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
    /// [`files::create_private`]).
    pub(crate) fn reserve() -> CResult<Reservation> {
        // After the sweep of the files of this namespace's ended processes.
        let path = files::new_path(KIND).map_err(|e| sys("getrandom", e))?;
        let f = files::create_private(&path)
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
                "{path:?} is not a HALO shared-memory segment (/dev/shm/{}N-N-N-TAG)",
                KIND.prefix()
            ))));
        }
        let f = files::open_shared(std::path::Path::new(path))
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
        assert_eq!(meta.uid(), crate::host::files::euid());
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
}
