//! Emulated hosts: network namespaces joined by a bridge, one shaped veth per host.
//!
//! Layout for a launch whose name prefix is `P` (`halo-<launcher pid>-<launcher start
//! time>-<counter>`):
//!
//! ```text
//!  ns P-h0 (hostname host0)      ns P-sw (the switch)           ns P-h1 (hostname host1)
//!  lo up                         lo up                          lo up
//!  eth0 10.201.0.1/24 <--veth--> h0 --+                 +-- h1 <--veth--> eth0 10.201.0.2/24
//!  tbf RATE on eth0              tbf  |                 |  tbf            tbf RATE on eth0
//!                                RATE +---- br0 --------+  RATE
//!                                on h0   (no address)      on h1
//! ```
//!
//! IPv6 is off inside these namespaces (IPv4 only), so that the veth counters show
//! the job's traffic and not neighbour discovery. Nothing is created in the
//! namespace the launcher runs in: the veth pairs are
//! created inside the switch namespace with their peer placed straight into the
//! host namespace. Device names only need to be unique within their namespace,
//! and every namespace belongs to this launch alone. Teardown kills what still
//! runs inside the namespaces (by pid), then deletes them; deleting the switch
//! namespace destroys the bridge and every veth pair with it.

use super::{LaunchError, run_tool};
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// The emulated cluster's subnet (inside its own namespaces only).
pub const SUBNET: &str = "10.201.0.0/24";

/// The host-side device name inside each host namespace.
pub const HOST_DEVICE: &str = "eth0";

const BRIDGE: &str = "br0";

/// Most hosts the /24 holds (.1 ..= .250; the rest stay free).
pub const MAX_HOSTS: usize = 250;

static LAUNCH_COUNTER: AtomicU32 = AtomicU32::new(0);

/// One emulated host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    /// Host index (0-based).
    pub index: usize,
    /// Its network namespace.
    pub namespace: String,
    /// Its hostname inside its UTS namespace (`hostI`).
    pub hostname: String,
    /// Its address on the emulated network (`10.201.0.(I+1)`).
    pub address: Ipv4Addr,
}

/// Byte and packet counters of one device.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LinkCounters {
    /// Bytes sent.
    pub tx_bytes: u64,
    /// Bytes received.
    pub rx_bytes: u64,
    /// Packets sent.
    pub tx_packets: u64,
    /// Packets received.
    pub rx_packets: u64,
}

impl LinkCounters {
    /// `self - earlier`, saturating (counters only grow on a live device).
    pub fn since(&self, earlier: &LinkCounters) -> LinkCounters {
        LinkCounters {
            tx_bytes: self.tx_bytes.saturating_sub(earlier.tx_bytes),
            rx_bytes: self.rx_bytes.saturating_sub(earlier.rx_bytes),
            tx_packets: self.tx_packets.saturating_sub(earlier.tx_packets),
            rx_packets: self.rx_packets.saturating_sub(earlier.rx_packets),
        }
    }

    /// Parses `ip -j -s link show DEV`.
    pub fn parse_ip_json(text: &str) -> Result<LinkCounters, String> {
        let v: serde_json::Value =
            serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
        let s = v
            .get(0)
            .and_then(|d| d.get("stats64").or_else(|| d.get("stats")))
            .ok_or("no stats64 in the output")?;
        let get = |dir: &str, what: &str| {
            s.get(dir)
                .and_then(|d| d.get(what))
                .and_then(serde_json::Value::as_u64)
                .ok_or_else(|| format!("no {dir}.{what} in the output"))
        };
        Ok(LinkCounters {
            tx_bytes: get("tx", "bytes")?,
            rx_bytes: get("rx", "bytes")?,
            tx_packets: get("tx", "packets")?,
            rx_packets: get("rx", "packets")?,
        })
    }
}

/// The namespaces, bridge and veths of one launch. Dropping it tears everything down.
#[derive(Debug)]
pub struct EmulatedCluster {
    prefix: String,
    switch: String,
    switch_created: bool,
    hosts: Vec<Host>,
    /// Namespaces created so far (hosts), for teardown.
    created_hosts: usize,
    grace: Duration,
    torn_down: bool,
}

/// Whether this process runs as root (needed for network namespaces).
pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Why emulated hosts cannot be created here, if they cannot: not root, `ip netns`
/// missing, or namespaces refused (checked with an anonymous `unshare --net --uts`,
/// which creates nothing named).
pub fn emulation_unavailable() -> Option<String> {
    if !is_root() {
        return Some("not root".into());
    }
    let ok = |prog: &str, args: &[&str]| {
        std::process::Command::new(prog)
            .args(args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if !ok("ip", &["netns", "list"]) {
        return Some("`ip netns list` does not work (iproute2 missing?)".into());
    }
    if !ok("unshare", &["--net", "--uts", "true"]) {
        return Some("cannot create network namespaces (unshare --net --uts failed)".into());
    }
    None
}

impl EmulatedCluster {
    /// Creates `hosts` host namespaces and the switch, shaping each host link to
    /// `rate` (tc syntax, e.g. `1gbit`) in both directions when given. On any
    /// failure, or when `stop` says so between steps, what was created is removed
    /// before returning.
    pub fn create(
        hosts: usize,
        rate: Option<&str>,
        grace: Duration,
        stop: &dyn Fn() -> Option<LaunchError>,
    ) -> Result<EmulatedCluster, LaunchError> {
        if !is_root() {
            return Err(LaunchError::NeedsRoot);
        }
        if hosts == 0 || hosts > MAX_HOSTS {
            return Err(LaunchError::invalid(format!(
                "--hosts must be between 1 and {MAX_HOSTS}"
            )));
        }
        let n = LAUNCH_COUNTER.fetch_add(1, Ordering::Relaxed);
        // The launcher's pid and start time: a later launch removes the namespaces of
        // launchers that died (see `leftovers`).
        let prefix = format!("halo-{}-{n}", super::leftovers::ProcessId::me().tag());
        let hosts_list = (0..hosts)
            .map(|i| Host {
                index: i,
                namespace: format!("{prefix}-h{i}"),
                hostname: format!("host{i}"),
                address: Ipv4Addr::new(10, 201, 0, (i + 1) as u8),
            })
            .collect();
        let mut c = EmulatedCluster {
            switch: format!("{prefix}-sw"),
            prefix,
            switch_created: false,
            hosts: hosts_list,
            created_hosts: 0,
            grace,
            torn_down: false,
        };
        c.build(rate, stop)?;
        Ok(c)
    }

    fn build(
        &mut self,
        rate: Option<&str>,
        stop: &dyn Fn() -> Option<LaunchError>,
    ) -> Result<(), LaunchError> {
        let check = || stop().map_or(Ok(()), Err);
        // A tool that fails because of the interrupt reports the interrupt.
        let run_tool =
            |program: &str, args: &[&str]| run_tool(program, args).map_err(|e| stop().unwrap_or(e));
        let sw = self.switch.clone();
        run_tool("ip", &["netns", "add", &sw])?;
        self.switch_created = true;
        quiet_ipv6(&sw);
        run_tool("ip", &["-n", &sw, "link", "set", "lo", "up"])?;
        run_tool("ip", &["-n", &sw, "link", "add", BRIDGE, "type", "bridge"])?;
        run_tool("ip", &["-n", &sw, "link", "set", BRIDGE, "up"])?;
        for i in 0..self.hosts.len() {
            check()?;
            let h = self.hosts[i].clone();
            let port = format!("h{i}");
            run_tool("ip", &["netns", "add", &h.namespace])?;
            self.created_hosts = i + 1;
            quiet_ipv6(&h.namespace);
            run_tool("ip", &["-n", &h.namespace, "link", "set", "lo", "up"])?;
            run_tool(
                "ip",
                &[
                    "-n",
                    &sw,
                    "link",
                    "add",
                    &port,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    HOST_DEVICE,
                    "netns",
                    &h.namespace,
                ],
            )?;
            run_tool("ip", &["-n", &sw, "link", "set", &port, "master", BRIDGE])?;
            run_tool("ip", &["-n", &sw, "link", "set", &port, "up"])?;
            let cidr = format!("{}/24", h.address);
            run_tool(
                "ip",
                &["-n", &h.namespace, "addr", "add", &cidr, "dev", HOST_DEVICE],
            )?;
            run_tool(
                "ip",
                &["-n", &h.namespace, "link", "set", HOST_DEVICE, "up"],
            )?;
            if let Some(rate) = rate {
                for (ns, dev) in [(h.namespace.as_str(), HOST_DEVICE), (sw.as_str(), &port)] {
                    run_tool(
                        "tc",
                        &[
                            "-n", ns, "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate,
                            "burst", "256kb", "latency", "50ms",
                        ],
                    )?;
                }
            }
        }
        check()
    }

    /// The name prefix of every namespace of this launch (`halo-<pid>-<start>-<counter>`).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The switch namespace.
    pub fn switch_namespace(&self) -> &str {
        &self.switch
    }

    /// The hosts.
    pub fn hosts(&self) -> &[Host] {
        &self.hosts
    }

    /// Reads the counters of every host's veth (host side: tx is what left the host).
    pub fn counters(&self) -> Result<Vec<LinkCounters>, LaunchError> {
        self.hosts
            .iter()
            .map(|h| {
                let out = run_tool(
                    "ip",
                    &["-n", &h.namespace, "-j", "-s", "link", "show", HOST_DEVICE],
                )?;
                LinkCounters::parse_ip_json(&out).map_err(|e| LaunchError::Setup {
                    command: format!("ip -n {} -j -s link show {HOST_DEVICE}", h.namespace),
                    message: e,
                })
            })
            .collect()
    }

    fn namespaces(&self) -> Vec<String> {
        let mut v: Vec<String> = self.hosts[..self.created_hosts]
            .iter()
            .map(|h| h.namespace.clone())
            .collect();
        if self.switch_created {
            v.push(self.switch.clone());
        }
        v
    }

    /// Kills whatever still runs inside this launch's namespaces (SIGTERM, then
    /// SIGKILL after the grace period), then deletes the namespaces. Returns what
    /// could not be done; safe to call again.
    pub fn teardown(&mut self) -> Vec<String> {
        if self.torn_down {
            return Vec::new();
        }
        self.torn_down = true;
        let mut problems = Vec::new();
        let namespaces = self.namespaces();
        let pids_in = |ns: &str| -> Vec<i32> {
            run_tool("ip", &["netns", "pids", ns])
                .map(|out| {
                    out.split_whitespace()
                        .filter_map(|p| p.parse().ok())
                        .collect()
                })
                .unwrap_or_default()
        };
        let all_pids = || -> Vec<i32> { namespaces.iter().flat_map(|ns| pids_in(ns)).collect() };
        let left = all_pids();
        if !left.is_empty() {
            tracing::info!(?left, "terminating processes left in the emulated hosts");
            for &p in &left {
                super::procs::signal_pid(p, nix::sys::signal::Signal::SIGTERM);
            }
            let deadline = Instant::now() + self.grace;
            let mut left = all_pids();
            while !left.is_empty() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
                left = all_pids();
            }
            for &p in &left {
                super::procs::signal_pid(p, nix::sys::signal::Signal::SIGKILL);
            }
            let deadline = Instant::now() + Duration::from_secs(5);
            while !left.is_empty() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
                left = all_pids();
            }
            if !left.is_empty() {
                problems.push(format!(
                    "processes {left:?} still run in the emulated hosts; their namespaces \
                     disappear when they exit"
                ));
            }
        }
        for ns in &namespaces {
            if let Err(e) = run_tool("ip", &["netns", "del", ns]) {
                problems.push(format!("{e} (delete it with `ip netns del {ns}`)"));
            }
        }
        problems
    }
}

/// Turns IPv6 off in a fresh namespace (before its devices exist), so that neighbour
/// discovery and multicast listener reports do not show in the veth counters: what
/// crosses them is then the job's traffic plus a packet or two. Best effort.
fn quiet_ipv6(ns: &str) {
    const SCRIPT: &str = "[ -d /proc/sys/net/ipv6 ] || exit 0; \
        echo 1 > /proc/sys/net/ipv6/conf/default/disable_ipv6 && \
        echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6";
    if let Err(e) = run_tool("ip", &["netns", "exec", ns, "sh", "-c", SCRIPT]) {
        tracing::warn!(ns, error = %e, "cannot turn IPv6 off in an emulated host");
    }
}

impl Drop for EmulatedCluster {
    fn drop(&mut self) {
        for p in self.teardown() {
            eprintln!("halo launch: teardown: {p}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ip_link_json() {
        let text = r#"[{"ifindex":2,"ifname":"eth0","stats64":{"rx":{"bytes":100,"packets":3,"errors":0},"tx":{"bytes":250,"packets":5}}}]"#;
        let c = LinkCounters::parse_ip_json(text).unwrap();
        assert_eq!(
            c,
            LinkCounters {
                tx_bytes: 250,
                rx_bytes: 100,
                tx_packets: 5,
                rx_packets: 3
            }
        );
        let later = LinkCounters {
            tx_bytes: 1250,
            rx_bytes: 100,
            tx_packets: 9,
            rx_packets: 4,
        };
        assert_eq!(later.since(&c).tx_bytes, 1000);
        assert!(LinkCounters::parse_ip_json("[]").is_err());
    }
}
