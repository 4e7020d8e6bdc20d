//! The default bootstrap address from the host's interfaces (`getifaddrs`):
//! `HALO_SOCKET_IFNAME` picks an interface by name, else the first non-loopback IPv4
//! address is used. Each case runs `default_bootstrap_ip` in a child process of this
//! test binary, with its own environment.

use std::net::{IpAddr, Ipv4Addr};
use std::process::Command;

#[test]
#[ignore = "run by the tests below in a child process with its own environment"]
fn print_default_bootstrap_ip() {
    match halo::bootstrap::default_bootstrap_ip() {
        Ok(ip) => println!("IP={ip}"),
        Err(e) => println!("ERR={e}"),
    }
}

/// What `default_bootstrap_ip` gives with `HALO_SOCKET_IFNAME` set to `ifname` (or
/// unset): `Ok(ip)` or `Err(message)`.
fn default_ip(ifname: Option<&str>) -> Result<IpAddr, String> {
    let mut cmd = Command::new(std::env::current_exe().expect("test binary"));
    cmd.args([
        "--exact",
        "print_default_bootstrap_ip",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ])
    .env_remove("HALO_BOOTSTRAP_ADDR")
    .env_remove("HALO_SOCKET_IFNAME");
    if let Some(name) = ifname {
        cmd.env("HALO_SOCKET_IFNAME", name);
    }
    let out = cmd.output().expect("run the test binary");
    assert!(out.status.success(), "child failed: {out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    // The harness prints the test's name on the same line, before the result.
    let found = stdout.lines().find_map(|l| {
        l.find("IP=")
            .map(|i| Ok(l[i + 3..].trim().to_string()))
            .or_else(|| l.find("ERR=").map(|i| Err(l[i + 4..].trim().to_string())))
    });
    match found {
        Some(Ok(ip)) => Ok(ip.parse().expect("an IP address")),
        Some(Err(e)) => Err(e),
        None => panic!("no result in the child's output: {stdout}"),
    }
}

#[test]
fn socket_ifname_names_the_interface() {
    assert_eq!(default_ip(Some("lo")), Ok(IpAddr::V4(Ipv4Addr::LOCALHOST)));
}

#[test]
fn unknown_socket_ifname_is_an_error_naming_it() {
    let err = default_ip(Some("halo-no-if0")).expect_err("no such interface");
    assert!(
        err.contains("HALO_SOCKET_IFNAME=halo-no-if0: no such interface with an IPv4 address"),
        "{err}"
    );
}

#[test]
fn default_is_the_first_non_loopback_ipv4_address() {
    let ip = default_ip(None).expect("an address");
    let IpAddr::V4(v4) = ip else {
        panic!("{ip} is not IPv4");
    };
    // 127.0.0.1 only when the host has no other IPv4 address.
    assert!(!v4.is_loopback() || v4 == Ipv4Addr::LOCALHOST, "{ip}");
    let has_other = std::fs::read_to_string("/proc/net/fib_trie")
        .map(|t| {
            t.lines()
                .zip(t.lines().skip(1))
                .filter(|(_, next)| next.contains("/32 host LOCAL"))
                .filter_map(|(l, _)| l.trim().trim_start_matches("|-- ").parse::<Ipv4Addr>().ok())
                .any(|a| !a.is_loopback())
        })
        .unwrap_or(false);
    assert_eq!(v4.is_loopback(), !has_other, "{ip}");
}
