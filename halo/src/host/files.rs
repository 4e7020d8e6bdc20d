//! The files HALO shares between the ranks of a host, in `/dev/shm` (a world-writable
//! place), private to the job's user: their names, `halo-{shm,bell}-NS-PID-N-TAG`
//! (PID namespace, process, count, 64 random bits), made by [`new_path`] and read by
//! [`Name::parse`] (the transports, the launcher's clean-up and the tests use these,
//! not names of their own); the private-file rule ([`create_private`], and
//! [`open_shared`] to attach to another rank's file); and the sweep of the files that
//! ended processes of this user left ([`sweep`]).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Where the shared files live.
pub const SHM_DIR: &str = "/dev/shm";

/// Which of HALO's shared files a name is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// A segment of HALO's shared-memory transport (`halo-shm-`): every rank makes
    /// one during set-up, the lowest rank of each host keeps its own as the host's.
    Segment,
    /// A doorbell of the libfabric transport (`halo-bell-`): one futex word a rank
    /// sleeps on while it waits for same-host peers.
    Bell,
}

impl Kind {
    /// Both kinds.
    pub const ALL: [Kind; 2] = [Kind::Segment, Kind::Bell];

    /// The start of its names: `halo-shm-` or `halo-bell-`.
    pub const fn prefix(self) -> &'static str {
        match self {
            Kind::Segment => "halo-shm-",
            Kind::Bell => "halo-bell-",
        }
    }
}

/// A name of a shared file, `halo-{shm,bell}-NS-PID-N-TAG`, in parts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Name {
    /// Segment or bell.
    pub kind: Kind,
    /// The PID namespace of the process that made it (its inode number).
    pub ns: u64,
    /// The process that made it (in that namespace).
    pub pid: u32,
    /// The count of such files that process had made before.
    pub n: u64,
    /// [`TAG_LEN`] random lowercase hex digits; `None` in the names of older builds
    /// (`halo-{shm,bell}-NS-PID-N`).
    pub tag: Option<String>,
}

impl Name {
    /// The parts of the file name `name` (not a path), if it is one of HALO's shared
    /// files: three decimal numbers, then a tag or (older builds) none.
    pub fn parse(name: &str) -> Option<Name> {
        let (kind, rest) = Kind::ALL
            .into_iter()
            .find_map(|k| name.strip_prefix(k.prefix()).map(|r| (k, r)))?;
        let parts: Vec<&str> = rest.split('-').collect();
        if !matches!(parts.len(), 3 | 4)
            || !parts[..3]
                .iter()
                .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
            || !parts[3..].iter().all(|t| is_tag(t))
        {
            return None;
        }
        Some(Name {
            kind,
            ns: parts[0].parse().ok()?,
            pid: parts[1].parse().ok()?,
            n: parts[2].parse().ok()?,
            tag: parts.get(3).map(|t| (*t).to_string()),
        })
    }
}

impl std::fmt::Display for Name {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}{}-{}-{}",
            self.kind.prefix(),
            self.ns,
            self.pid,
            self.n
        )?;
        match &self.tag {
            Some(t) => write!(f, "-{t}"),
            None => Ok(()),
        }
    }
}

/// The user this process acts as (its effective uid).
pub fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Hex digits of the random part of a shared file's name ([`random_tag`]).
pub const TAG_LEN: usize = 16;

/// `TAG_LEN` lowercase hex digits from the operating system's random source (64 bits):
/// the part of a name in `/dev/shm` that another user cannot guess, so that it cannot
/// plant a file or a link there before HALO creates it.
pub fn random_tag() -> std::io::Result<String> {
    let mut b = [0u8; TAG_LEN / 2];
    getrandom::fill(&mut b).map_err(|e| std::io::Error::other(e.to_string()))?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// Whether `t` is a [`random_tag`]: [`TAG_LEN`] lowercase hex digits.
fn is_tag(t: &str) -> bool {
    t.len() == TAG_LEN
        && t.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Whether `path` is `/dev/shm/<prefix>N-N-N-<tag>` for `kind`'s prefix: three decimal
/// numbers (PID namespace, pid, count) and a [`random_tag`].
pub fn is_shared_name(path: &str, kind: Kind) -> bool {
    path.strip_prefix("/dev/shm/")
        .and_then(|n| n.strip_prefix(kind.prefix()))
        .is_some_and(|rest| {
            let parts: Vec<&str> = rest.split('-').collect();
            parts.len() == 4
                && parts[..3]
                    .iter()
                    .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
                && is_tag(parts[3])
        })
}

/// This process's PID namespace number (for file names that tell processes apart):
/// the digits of `/proc/self/ns/pid`'s link, empty if it cannot be read.
pub fn pid_ns() -> String {
    std::fs::read_link("/proc/self/ns/pid")
        .map(|l| {
            l.to_string_lossy()
                .chars()
                .filter(char::is_ascii_digit)
                .collect()
        })
        .unwrap_or_default()
}

/// A new name of `kind` for this process, `/dev/shm/halo-{shm,bell}-NS-PID-N-TAG`
/// (PID namespace, process, this process's count of `kind`, 64 random bits: no other
/// user can guess it), after the [`sweep`] of this namespace's stale files of `kind`.
/// Create it with [`create_private`]. Fails only when the random source does.
pub fn new_path(kind: Kind) -> std::io::Result<PathBuf> {
    static SEGMENTS: AtomicU64 = AtomicU64::new(0);
    static BELLS: AtomicU64 = AtomicU64::new(0);
    let ns = pid_ns();
    sweep(kind, &ns);
    let next = match kind {
        Kind::Segment => &SEGMENTS,
        Kind::Bell => &BELLS,
    };
    let n = next.fetch_add(1, Ordering::Relaxed);
    let tag = random_tag()?;
    Ok(PathBuf::from(format!(
        "{SHM_DIR}/{}{ns}-{}-{n}-{tag}",
        kind.prefix(),
        std::process::id()
    )))
}

/// Removes the files of `kind` of processes of PID namespace `ns` that ended without
/// removing theirs (killed): regular files of this user only.
pub fn sweep(kind: Kind, ns: &str) {
    let prefix = format!("{}{ns}-", kind.prefix());
    let Ok(dir) = std::fs::read_dir(SHM_DIR) else {
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
        if !Path::new(&format!("/proc/{pid}")).exists() {
            remove_own_file(&entry.path());
        }
    }
}

/// Creates `path` as a new file, readable and writable by this user only from the
/// moment it exists: `O_CREAT | O_EXCL` (a file or a link already there is an error,
/// never reused or followed), mode 0600, `O_NOFOLLOW`, `O_CLOEXEC`. Never `chmod`-ed
/// afterwards.
pub fn create_private(path: &Path) -> std::io::Result<std::fs::File> {
    create_exclusive(path, 0o600)
}

/// Creates the new file `path` with `mode` from the moment it exists, for reading and
/// writing: `O_CREAT | O_EXCL` (a file or link already at the name is never reused or
/// followed) and `O_NOFOLLOW`. [`create_private`] is this with mode 0600; `halo launch`
/// uses it for its record and for the scripts it hands mpirun (mode 0700).
pub fn create_exclusive(path: &Path, mode: u32) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt as _;
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(mode)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
}

/// Opens a file another rank of this job made with [`create_private`], for reading and
/// writing: not through a link (`O_NOFOLLOW`), and only a regular file of this user.
pub fn open_shared(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _};
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)?;
    let meta = f.metadata()?;
    if !meta.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    if meta.uid() != euid() {
        return Err(std::io::Error::other(format!(
            "owned by uid {}, not by this job's user (uid {})",
            meta.uid(),
            euid()
        )));
    }
    Ok(f)
}

/// Removes `path` if it is a regular file (not a link) of this user; whether it did.
pub fn remove_own_file(path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::symlink_metadata(path).is_ok_and(|m| m.is_file() && m.uid() == euid())
        && std::fs::remove_file(path).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};

    #[test]
    fn private_files_are_0600_never_reused_never_followed() {
        let dir = std::env::temp_dir().join(format!("halo-sys-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap();
        let path = dir.join("f");
        let f = create_private(&path).unwrap();
        let meta = f.metadata().unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert_eq!(meta.uid(), euid());
        // An existing file is not reused.
        let e = create_private(&path).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::AlreadyExists);
        assert!(open_shared(&path).is_ok());
        // A link (dangling or not) is neither followed nor replaced.
        let target = dir.join("target");
        let link = dir.join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(create_private(&link).is_err());
        assert!(!target.exists());
        std::fs::write(&target, b"keep").unwrap();
        assert!(open_shared(&link).is_err());
        assert!(!remove_own_file(&link), "a link is not removed as a file");
        assert!(link.symlink_metadata().is_ok());
        assert_eq!(std::fs::read(&target).unwrap(), b"keep");
        assert!(remove_own_file(&path));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn shared_names_carry_a_random_tag() {
        let (a, b) = (random_tag().unwrap(), random_tag().unwrap());
        assert_ne!(a, b);
        assert!(is_shared_name(
            &format!("/dev/shm/halo-bell-1-2-3-{a}"),
            Kind::Bell
        ));
        assert!(!is_shared_name("/dev/shm/halo-bell-1-2-3", Kind::Bell));
        assert!(!is_shared_name(
            &format!("/dev/shm/halo-bell-1-2-3-{a}"),
            Kind::Segment
        ));
        assert!(!is_shared_name(
            &format!("/dev/shm/halo-bell-../../etc-2-3-{a}"),
            Kind::Bell
        ));
    }

    #[test]
    fn names_parse_and_print_back() {
        let tag = random_tag().unwrap();
        for kind in Kind::ALL {
            let path = new_path(kind).unwrap();
            let file = path.file_name().unwrap().to_str().unwrap();
            let name = Name::parse(file).unwrap();
            assert_eq!(name.kind, kind);
            assert_eq!(name.pid, std::process::id());
            assert_eq!(name.to_string(), file);
            assert!(is_shared_name(path.to_str().unwrap(), kind));
        }
        let old = Name::parse("halo-shm-4026531836-1234-0").unwrap();
        assert_eq!(
            (old.ns, old.pid, old.n, old.tag),
            (4026531836, 1234, 0, None)
        );
        let bell = format!("halo-bell-1-2-3-{tag}");
        assert_eq!(Name::parse(&bell).unwrap().to_string(), bell);
        assert!(Name::parse("halo-bell-1-2").is_none());
        assert!(Name::parse("halo-bell-1-2-x").is_none());
        assert!(Name::parse("halo-bell-1-2-3-0123456789abcde").is_none());
        assert!(Name::parse("halo-bell-1-2-3-0123456789ABCDEF").is_none());
        assert!(Name::parse("halo-launch-1-2-3").is_none());
        assert!(Name::parse("1234:0:0").is_none());
    }
}
