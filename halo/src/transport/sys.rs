//! Thin safe wrappers over the system calls the library needs outside a transport
//! (`unsafe` stays in the transports' internals): the host's network interfaces. (The
//! files HALO shares between the ranks of a host, private to the job's user, are
//! `crate::host::files`.)

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

#[cfg(test)]
mod tests {
    use super::*;

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
