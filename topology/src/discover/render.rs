//! The readable tree of a [`LocalMachine`] that `halo topo` prints.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use super::{GpuLinkKind, LocalMachine, NumaNode};

impl LocalMachine {
    /// Readable tree for `halo topo`, e.g.
    ///
    /// ```text
    /// Machine myhost
    ///   Package 0: 2 cores, 2 PUs, AMD EPYC
    ///     NUMA 0: 23.4 GiB, CPUs 0-1
    ///   PCI 0000:00:03.0 [0200] 1af4:1041
    ///   GPUs: none found
    ///   NICs: eth0 (Ethernet, 10 Gb/s, up, PCI 0000:00:03.0, NUMA 0)
    ///   Slingshot cxi: none found
    ///   Slurm: not running under Slurm
    ///   Sources: hwloc 2.9.0 ...; sysfs /sys/class/net: 1 interfaces besides lo; ...
    /// ```
    pub fn render_tree(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let mut line = |indent: usize, text: String| {
            let _ = writeln!(out, "{:indent$}{text}", "", indent = indent * 2);
        };
        line(0, format!("Machine {}", self.hostname));

        let render_numa = |node: &NumaNode| {
            let memory = node
                .local_memory_bytes
                .map_or_else(|| "memory unknown".to_owned(), format_bytes);
            let cpus = if node.cpuset.is_empty() {
                "no CPUs".to_owned()
            } else {
                format!("CPUs {}", node.cpuset)
            };
            format!("NUMA {}: {memory}, {cpus}", node.os_index)
        };
        if self.packages.is_empty() {
            line(1, "Packages: none found".to_owned());
        }
        for package in &self.packages {
            let model = package
                .cpu_model
                .as_ref()
                .map(|m| format!(", {m}"))
                .unwrap_or_default();
            line(
                1,
                format!(
                    "Package {}: {} cores, {} PUs{model}",
                    or_unknown(package.os_index),
                    package.core_count(),
                    package.pu_count()
                ),
            );
            for node in self
                .numa_nodes
                .iter()
                .filter(|n| package.os_index.is_some() && n.package_os_index == package.os_index)
            {
                line(2, render_numa(node));
            }
        }
        let placed: BTreeSet<u32> = self.packages.iter().filter_map(|p| p.os_index).collect();
        for node in self
            .numa_nodes
            .iter()
            .filter(|n| n.package_os_index.is_none_or(|p| !placed.contains(&p)))
        {
            line(1, render_numa(node));
        }
        if self.numa_nodes.is_empty() {
            line(1, "NUMA: none found".to_owned());
        }

        for device in &self.pci_devices {
            let name = device
                .name
                .as_ref()
                .map(|n| format!(" {n}"))
                .unwrap_or_default();
            line(
                1,
                format!(
                    "PCI {} [{:04x}] {:04x}:{:04x}{name}",
                    device.bus_id, device.class_id, device.vendor_id, device.device_id
                ),
            );
        }

        if self.gpus.is_empty() {
            line(1, "GPUs: none found".to_owned());
        } else {
            line(1, format!("GPUs: {}", self.gpus.len()));
            for gpu in &self.gpus {
                let mut text = format!(
                    "GPU {} {} {:04x}:{:04x}",
                    gpu.pci_bus_id,
                    gpu.vendor.as_str(),
                    gpu.vendor_id,
                    gpu.device_id
                );
                if let Some(name) = &gpu.name {
                    let _ = write!(text, " {name}");
                }
                let _ = write!(text, ", NUMA {}", or_unknown(gpu.numa_node));
                if !gpu.os_device_names.is_empty() {
                    let _ = write!(text, ", {}", gpu.os_device_names.join(" "));
                }
                if let Some(x) = &gpu.xgmi {
                    let _ = write!(text, ", XGMI hive {:#x}", x.hive_id);
                    if let Some(id) = x.physical_id {
                        let _ = write!(text, " physical id {id}");
                    }
                    if !x.peer_pci_bus_ids.is_empty() {
                        let _ = write!(text, " peers {}", x.peer_pci_bus_ids.join(" "));
                    }
                }
                line(2, text);
            }
        }

        if self.nics.is_empty() {
            line(1, "NICs: none found".to_owned());
        } else {
            let nics: Vec<String> = self
                .nics
                .iter()
                .map(|n| {
                    let mut parts = vec![n.kind.as_str().to_owned()];
                    if let Some(speed) = n.link_speed_bytes_per_sec {
                        parts.push(format_link_speed(speed));
                    }
                    if let Some(state) = &n.operstate {
                        parts.push(state.clone());
                    }
                    if let Some(bus) = &n.pci_bus_id {
                        parts.push(format!("PCI {bus}"));
                    }
                    if let Some(numa) = n.numa_node {
                        parts.push(format!("NUMA {numa}"));
                    }
                    if !n.rdma_devices.is_empty() {
                        parts.push(n.rdma_devices.join(" "));
                    }
                    if n.is_virtual {
                        parts.push("virtual".to_owned());
                    }
                    format!("{} ({})", n.name, parts.join(", "))
                })
                .collect();
            line(1, format!("NICs: {}", nics.join(", ")));
        }

        if self.cxi_devices.is_empty() {
            line(1, "Slingshot cxi: none found".to_owned());
        } else {
            line(1, format!("Slingshot cxi: {}", self.cxi_devices.len()));
            for cxi in &self.cxi_devices {
                let mut text = format!(
                    "{} PCI {}, NUMA {}",
                    cxi.name,
                    or_unknown(cxi.pci_bus_id.as_ref()),
                    or_unknown(cxi.numa_node)
                );
                if let Some(nid) = cxi.nid {
                    let _ = write!(text, ", nid {nid:#x}");
                }
                if let Some(up) = cxi.link_up {
                    text.push_str(if up { ", link up" } else { ", link down" });
                }
                if let Some(speed) = cxi.link_speed_bytes_per_sec {
                    let _ = write!(text, ", {} Gbit/s", speed / 125_000_000);
                }
                if !cxi.net_interfaces.is_empty() {
                    let _ = write!(text, ", {}", cxi.net_interfaces.join(" "));
                }
                line(2, text);
            }
        }

        if !self.gpu_links.is_empty() {
            let nvml = self.gpu_links.iter().any(|l| l.kind == GpuLinkKind::NvLink);
            let kfd = self.gpu_links.iter().any(|l| l.kind != GpuLinkKind::NvLink);
            let from = match (kfd, nvml) {
                (true, true) => "KFD, NVML",
                (false, true) => "NVML",
                _ => "KFD",
            };
            line(
                1,
                format!("GPU links (links between each pair; . none; {from}):"),
            );
            for row in self.gpu_link_matrix() {
                line(2, row);
            }
        }

        match &self.slurm {
            None => line(1, "Slurm: not running under Slurm".to_owned()),
            Some(s) => {
                let mut parts = Vec::new();
                if let Some(job) = &s.job_id {
                    parts.push(format!("job {job}"));
                }
                if s.proc_id.is_some() || s.ntasks.is_some() {
                    parts.push(format!(
                        "rank {} of {}",
                        or_unknown(s.proc_id),
                        or_unknown(s.ntasks)
                    ));
                }
                if let Some(local) = s.local_id {
                    parts.push(format!("local rank {local}"));
                }
                if s.node_id.is_some() || !s.nodes.is_empty() {
                    let list = s
                        .job_nodelist
                        .as_ref()
                        .map(|l| format!(" ({l})"))
                        .unwrap_or_default();
                    parts.push(format!(
                        "node {} of {}{list}",
                        or_unknown(s.node_id),
                        s.nodes.len()
                    ));
                }
                if let Some(addr) = &s.topology_addr {
                    let pattern = s
                        .topology_addr_pattern
                        .as_ref()
                        .map(|p| format!(" ({p})"))
                        .unwrap_or_default();
                    parts.push(format!("topology {addr}{pattern}"));
                }
                line(1, format!("Slurm: {}", parts.join(", ")));
            }
        }
        line(1, format!("Sources: {}", self.sources.join("; ")));
        out
    }
}

/// `23.4 GiB`, `512.0 MiB`.
fn format_bytes(bytes: u64) -> String {
    const GIB: f64 = (1u64 << 30) as f64;
    const MIB: f64 = (1u64 << 20) as f64;
    #[allow(clippy::cast_precision_loss)]
    let b = bytes as f64;
    if b >= GIB {
        format!("{:.1} GiB", b / GIB)
    } else {
        format!("{:.1} MiB", b / MIB)
    }
}

/// `10 Gb/s`, `100 Mb/s`, `2.5 Gb/s` from bytes per second.
fn format_link_speed(bytes_per_sec: u64) -> String {
    let mbps = bytes_per_sec / 125_000;
    if mbps >= 1000 {
        if mbps.is_multiple_of(1000) {
            format!("{} Gb/s", mbps / 1000)
        } else {
            #[allow(clippy::cast_precision_loss)]
            let gbps = mbps as f64 / 1000.0;
            format!("{gbps} Gb/s")
        }
    } else {
        format!("{mbps} Mb/s")
    }
}

/// `Some(x)` as `x`, `None` as `?`.
impl LocalMachine {
    /// The GPU links as rows of a matrix over the GPUs in bus id order: a header of
    /// GPU indices, then per GPU its bus id and the number of links to each other GPU
    /// (`.` for none, `-` for itself).
    pub fn gpu_link_matrix(&self) -> Vec<String> {
        let ids: Vec<&str> = self.gpus.iter().map(|g| g.pci_bus_id.as_str()).collect();
        let mut rows = vec![format!(
            "{:16}{}",
            "",
            (0..ids.len())
                .map(|i| format!("{i:>3}"))
                .collect::<String>()
        )];
        for (i, a) in ids.iter().enumerate() {
            let cells: String = ids
                .iter()
                .map(|b| {
                    if a == b {
                        return format!("{:>3}", "-");
                    }
                    match self.gpu_links.iter().find(|l| l.from == *a && l.to == *b) {
                        Some(l) => format!("{:>3}", l.links),
                        None => format!("{:>3}", "."),
                    }
                })
                .collect();
            rows.push(format!("{i:>2} {a:13}{cells}"));
        }
        rows
    }
}

fn or_unknown<T: std::fmt::Display>(value: Option<T>) -> String {
    value.map_or_else(|| "?".to_owned(), |v| v.to_string())
}
