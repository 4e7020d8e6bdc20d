//! Thin safe wrappers over the system calls the library needs outside a transport
//! (`unsafe` stays in the transports' internals): the host's network interfaces; the
//! files HALO shares between the ranks of a host (in `/dev/shm`, a world-writable place),
//! private to the job's user.

use std::ffi::CStr;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// One address of a network interface, as `getifaddrs(3)` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Interface {
    /// The interface's name (`lo`, `eth0`, ...).
    pub(crate) name: String,
    /// One of its IP addresses.
    pub(crate) ip: IpAddr,
    /// Whether that address is a loopback address (127.0.0.0/8, ::1).
    pub(crate) loopback: bool,
}

/// The IPv4 and IPv6 addresses of this host's interfaces, in the order `getifaddrs`
/// gives them (entries of other families, or without an address, are left out).
pub(crate) fn interfaces() -> std::io::Result<Vec<Interface>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list head into `head` on success (checked); the list
    // is freed once, below, with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut out = Vec::new();
    let mut next = head;
    while !next.is_null() {
        // SAFETY: `next` is an entry of the list getifaddrs returned, alive until the
        // freeifaddrs below.
        let entry = unsafe { &*next };
        next = entry.ifa_next;
        // SAFETY: `ifa_addr` is NULL or points to a socket address whose `sa_family`
        // says which struct it is; the one read below matches that family.
        let ip = unsafe {
            match entry.ifa_addr.as_ref().map(|a| i32::from(a.sa_family)) {
                Some(libc::AF_INET) => {
                    let a = &*entry.ifa_addr.cast::<libc::sockaddr_in>();
                    IpAddr::V4(Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)))
                }
                Some(libc::AF_INET6) => {
                    let a = &*entry.ifa_addr.cast::<libc::sockaddr_in6>();
                    IpAddr::V6(Ipv6Addr::from(a.sin6_addr.s6_addr))
                }
                _ => continue,
            }
        };
        let name = if entry.ifa_name.is_null() {
            String::new()
        } else {
            // SAFETY: `ifa_name` is a NUL-terminated string owned by the list.
            unsafe { CStr::from_ptr(entry.ifa_name) }
                .to_string_lossy()
                .into_owned()
        };
        out.push(Interface {
            name,
            loopback: ip.is_loopback(),
            ip,
        });
    }
    // SAFETY: `head` came from getifaddrs and is freed once; nothing of it is used after.
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}

/// The user this process acts as (its effective uid).
pub(crate) fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Hex digits of the random part of a shared file's name ([`random_tag`]).
pub(crate) const TAG_LEN: usize = 16;

/// `TAG_LEN` lowercase hex digits from the operating system's random source (64 bits):
/// the part of a name in `/dev/shm` that another user cannot guess, so that it cannot
/// plant a file or a link there before HALO creates it.
pub(crate) fn random_tag() -> std::io::Result<String> {
    let mut b = [0u8; TAG_LEN / 2];
    getrandom::fill(&mut b).map_err(|e| std::io::Error::other(e.to_string()))?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// Whether `path` is `/dev/shm/<prefix>N-N-N-<tag>`: three decimal numbers (PID
/// namespace, pid, count) and a [`random_tag`].
pub(crate) fn is_shared_name(path: &str, prefix: &str) -> bool {
    path.strip_prefix("/dev/shm/")
        .and_then(|n| n.strip_prefix(prefix))
        .is_some_and(|rest| {
            let parts: Vec<&str> = rest.split('-').collect();
            parts.len() == 4
                && parts[..3]
                    .iter()
                    .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
                && parts[3].len() == TAG_LEN
                && parts[3]
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        })
}

/// Creates `path` as a new file, readable and writable by this user only from the
/// moment it exists: `O_CREAT | O_EXCL` (a file or a link already there is an error,
/// never reused or followed), mode 0600, `O_NOFOLLOW`, `O_CLOEXEC`. Never `chmod`-ed
/// afterwards.
pub(crate) fn create_private(path: &std::path::Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt as _;
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
}

/// Opens a file another rank of this job made with [`create_private`], for reading and
/// writing: not through a link (`O_NOFOLLOW`), and only a regular file of this user.
pub(crate) fn open_shared(path: &std::path::Path) -> std::io::Result<std::fs::File> {
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
pub(crate) fn remove_own_file(path: &std::path::Path) -> bool {
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
            "halo-bell-"
        ));
        assert!(!is_shared_name("/dev/shm/halo-bell-1-2-3", "halo-bell-"));
        assert!(!is_shared_name(
            &format!("/dev/shm/halo-bell-1-2-3-{a}"),
            "halo-shm-"
        ));
        assert!(!is_shared_name(
            &format!("/dev/shm/halo-bell-../../etc-2-3-{a}"),
            "halo-bell-"
        ));
    }

    #[test]
    fn lists_the_loopback_interface() {
        let ifs = interfaces().expect("getifaddrs");
        let lo = ifs
            .iter()
            .find(|i| i.ip == IpAddr::V4(Ipv4Addr::LOCALHOST))
            .expect("127.0.0.1 is on an interface");
        assert!(lo.loopback);
        assert!(!lo.name.is_empty());
        assert!(
            ifs.iter()
                .all(|i| i.loopback == i.ip.is_loopback() && !i.name.is_empty())
        );
    }
}
