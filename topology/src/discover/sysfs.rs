//! Reading sysfs and procfs below a configurable root directory.
//!
//! Attribute files that are missing or cannot be read (sysfs answers `EINVAL` for
//! the speed of a link that is down) read as absent. Only a class directory that
//! exists but cannot be listed is an error.

use std::{
    collections::BTreeMap,
    fs, io,
    path::{Path, PathBuf},
};

use super::{Core, CxiDevice, DiscoverError, NetworkDevice, NicKind, NumaNode, Package, PciDevice};

/// `type` value of Ethernet interfaces (ARPHRD_ETHER).
/// The Slingshot driver's device class.
pub(super) const CXI_CLASS: &str = "/sys/class/cxi";
/// The class `cxi_user` registers for the same devices (libcxi reads it).
pub(super) const CXI_USER_CLASS: &str = "/sys/class/cxi_user";

const ARPHRD_ETHER: u32 = 1;
/// `type` value of InfiniBand interfaces (ARPHRD_INFINIBAND).
const ARPHRD_INFINIBAND: u32 = 32;
/// `type` value of the loopback interface (ARPHRD_LOOPBACK).
const ARPHRD_LOOPBACK: u32 = 772;

/// PUs by core of one package: key `(core_id, 0)`, or `(None, cpu)` for a CPU
/// without core id.
type CoresOfPackage = BTreeMap<(Option<u32>, u32), Vec<u32>>;

/// sysfs and procfs below `root`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Sysfs<'a> {
    /// The directory that plays `/`.
    root: &'a Path,
}

/// A `/sys/class/drm` entry (`card0`, `renderD128`) whose device is on PCI.
#[derive(Debug, Clone, Default)]
pub(super) struct DrmDevice {
    /// `card0`, `renderD128`.
    pub(super) name: String,
    /// Bus id of the PCI device.
    pub(super) pci_bus_id: String,
    /// `device/vendor`.
    pub(super) vendor_id: Option<u16>,
    /// `device/device`.
    pub(super) device_id: Option<u16>,
    /// `device/class` without the programming interface byte.
    pub(super) class_id: Option<u16>,
    /// `device/numa_node` when not -1.
    pub(super) numa_node: Option<u32>,
    /// `device/xgmi_hive_info/xgmi_hive_id` (amdgpu), when not 0.
    pub(super) xgmi_hive_id: Option<u64>,
    /// `device/xgmi_device_id` (amdgpu).
    pub(super) xgmi_device_id: Option<u64>,
    /// `device/xgmi_physical_id` (amdgpu).
    pub(super) xgmi_physical_id: Option<u32>,
}

/// What the CPU directories said, before grouping.
#[derive(Debug, Clone)]
struct CpuEntry {
    /// Linux CPU number (= hwloc PU OS index).
    cpu: u32,
    /// `topology/physical_package_id`.
    package: Option<u32>,
    /// `topology/core_id`.
    core: Option<u32>,
}

impl<'a> Sysfs<'a> {
    /// sysfs below `root`.
    pub(super) fn new(root: &'a Path) -> Self {
        Self { root }
    }

    /// The path of an absolute sysfs path below the root.
    pub(super) fn path(&self, absolute: &str) -> PathBuf {
        self.root.join(absolute.trim_start_matches('/'))
    }

    /// `/proc/sys/kernel/hostname`.
    pub(super) fn hostname(&self) -> Option<String> {
        read_attr(&self.path("/proc/sys/kernel/hostname"))
    }

    /// Network interfaces of `/sys/class/net` except loopback, in natural name
    /// order; `None` when the directory is absent. NUMA nodes are those sysfs gives.
    pub(super) fn net_devices(&self) -> Result<Option<Vec<NetworkDevice>>, DiscoverError> {
        let dir = self.path("/sys/class/net");
        let Some(names) = list_dir(&dir)? else {
            return Ok(None);
        };
        let mut out = Vec::new();
        for name in names {
            let entry = dir.join(&name);
            // `bonding_masters` is a plain file next to the interfaces.
            if !entry.is_dir() {
                continue;
            }
            let link_layer_type =
                read_attr(&entry.join("type")).and_then(|t| t.parse::<u32>().ok());
            if name == "lo" || link_layer_type == Some(ARPHRD_LOOPBACK) {
                continue;
            }
            let kind = match link_layer_type {
                Some(ARPHRD_ETHER) if name.starts_with("hsn") => NicKind::Slingshot,
                Some(ARPHRD_ETHER) => NicKind::Ethernet,
                Some(ARPHRD_INFINIBAND) => NicKind::InfiniBand,
                _ => NicKind::Other,
            };
            let pci_bus_id = pci_bus_id_of(&entry.join("device"));
            let numa_node = read_numa(&entry.join("device/numa_node"))
                .or_else(|| pci_bus_id.as_deref().and_then(|b| self.pci_numa_node(b)));
            let is_virtual = fs::canonicalize(&entry)
                .map(|p| {
                    let parts: Vec<_> = p.components().map(|c| c.as_os_str().to_owned()).collect();
                    parts
                        .windows(2)
                        .any(|w| w[0] == "devices" && w[1] == "virtual")
                })
                .unwrap_or(false)
                || (!entry.join("device").exists() && pci_bus_id.is_none());
            let link_speed_bytes_per_sec = read_attr(&entry.join("speed"))
                .and_then(|s| s.parse::<i64>().ok())
                .filter(|&mbps| mbps > 0)
                .and_then(|mbps| u64::try_from(mbps).ok())
                .map(|mbps| mbps * 125_000);
            out.push(NetworkDevice {
                name,
                kind,
                link_layer_type,
                pci_bus_id,
                numa_node,
                link_speed_bytes_per_sec,
                address: read_attr(&entry.join("address")),
                operstate: read_attr(&entry.join("operstate")),
                is_virtual,
                rdma_devices: Vec::new(),
            });
        }
        out.sort_by(|a, b| natural_cmp(&a.name, &b.name));
        Ok(Some(out))
    }

    /// RDMA devices of `/sys/class/infiniband` by the PCI bus id of their device.
    pub(super) fn rdma_devices(
        &self,
    ) -> Result<Option<BTreeMap<String, Vec<String>>>, DiscoverError> {
        let dir = self.path("/sys/class/infiniband");
        let Some(names) = list_dir(&dir)? else {
            return Ok(None);
        };
        let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for name in names {
            if let Some(bus) = pci_bus_id_of(&dir.join(&name).join("device")) {
                out.entry(bus).or_default().push(name);
            }
        }
        Ok(Some(out))
    }

    /// `card*` and `renderD*` entries of `/sys/class/drm` that sit on PCI.
    pub(super) fn drm_devices(&self) -> Result<Option<Vec<DrmDevice>>, DiscoverError> {
        let dir = self.path("/sys/class/drm");
        let Some(names) = list_dir(&dir)? else {
            return Ok(None);
        };
        let mut out = Vec::new();
        for name in names {
            let is_card = numbered(&name, "card");
            if !is_card && !numbered(&name, "renderD") {
                continue;
            }
            let device = dir.join(&name).join("device");
            let Some(pci_bus_id) = pci_bus_id_of(&device) else {
                continue;
            };
            let mut drm = DrmDevice {
                name,
                pci_bus_id,
                vendor_id: read_hex(&device.join("vendor")).and_then(|v| u16::try_from(v).ok()),
                device_id: read_hex(&device.join("device")).and_then(|v| u16::try_from(v).ok()),
                class_id: read_hex(&device.join("class")).and_then(|v| u16::try_from(v >> 8).ok()),
                numa_node: read_numa(&device.join("numa_node")),
                ..DrmDevice::default()
            };
            if is_card {
                drm.xgmi_hive_id =
                    read_int(&device.join("xgmi_hive_info/xgmi_hive_id")).filter(|&id| id != 0);
                drm.xgmi_device_id = read_int(&device.join("xgmi_device_id"));
                drm.xgmi_physical_id =
                    read_int(&device.join("xgmi_physical_id")).and_then(|v| u32::try_from(v).ok());
            }
            out.push(drm);
        }
        out.sort_by(|a, b| natural_cmp(&a.name, &b.name));
        Ok(Some(out))
    }

    /// Slingshot devices of `/sys/class/cxi`; `net_interfaces` is left empty.
    pub(super) fn cxi_devices(&self) -> Result<Option<Vec<CxiDevice>>, DiscoverError> {
        self.cxi_devices_in(CXI_CLASS)
    }

    /// The `cxi` devices of one class directory (`/sys/class/cxi`, or `cxi_user`, the
    /// class libcxi reads, which names the same PCI devices).
    pub(super) fn cxi_devices_in(
        &self,
        class: &str,
    ) -> Result<Option<Vec<CxiDevice>>, DiscoverError> {
        let dir = self.path(class);
        let Some(names) = list_dir(&dir)? else {
            return Ok(None);
        };
        let mut out = Vec::new();
        for name in names {
            let device = dir.join(&name).join("device");
            let pci_bus_id = pci_bus_id_of(&device);
            let numa_node = read_numa(&device.join("numa_node"))
                .or_else(|| pci_bus_id.as_deref().and_then(|b| self.pci_numa_node(b)));
            out.push(CxiDevice {
                name,
                pci_bus_id,
                numa_node,
                nid: read_hex(&device.join("properties/nid")).and_then(|v| u32::try_from(v).ok()),
                link_up: read_attr(&device.join("properties/link")).and_then(|s| {
                    match s.as_str() {
                        "1" => Some(true),
                        "0" => Some(false),
                        _ => None,
                    }
                }),
                link_speed_bytes_per_sec: read_attr(&device.join("properties/speed"))
                    .and_then(|s| s.parse::<u64>().ok())
                    .filter(|&mbps| mbps > 0)
                    .map(|mbps| mbps * 125_000),
                net_interfaces: Vec::new(),
            });
        }
        out.sort_by(|a, b| natural_cmp(&a.name, &b.name));
        Ok(Some(out))
    }

    /// `numa_node` of a PCI device by bus id.
    pub(super) fn pci_numa_node(&self, bus_id: &str) -> Option<u32> {
        read_numa(
            &self
                .path("/sys/bus/pci/devices")
                .join(bus_id)
                .join("numa_node"),
        )
    }

    /// Every device of `/sys/bus/pci/devices`, sorted by bus id.
    pub(super) fn pci_devices(&self) -> Result<Option<Vec<PciDevice>>, DiscoverError> {
        let dir = self.path("/sys/bus/pci/devices");
        let Some(names) = list_dir(&dir)? else {
            return Ok(None);
        };
        let mut out = Vec::new();
        for name in names {
            let bus_id = name.to_ascii_lowercase();
            if !is_pci_address(&bus_id) {
                continue;
            }
            let device = dir.join(&name);
            let (Some(class), Some(vendor), Some(dev)) = (
                read_hex(&device.join("class")),
                read_hex(&device.join("vendor")),
                read_hex(&device.join("device")),
            ) else {
                continue;
            };
            let (Ok(class_id), Ok(vendor_id), Ok(device_id)) = (
                u16::try_from(class >> 8),
                u16::try_from(vendor),
                u16::try_from(dev),
            ) else {
                continue;
            };
            out.push(PciDevice {
                bus_id,
                class_id,
                vendor_id,
                device_id,
                name: None,
                numa_node: read_numa(&device.join("numa_node")),
            });
        }
        out.sort_by(|a, b| a.bus_id.cmp(&b.bus_id));
        Ok(Some(out))
    }

    /// Packages from `/sys/devices/system/cpu/cpu*/topology` (online CPUs only) and
    /// CPU model names from `/proc/cpuinfo`; `None` when the CPU directory is absent.
    pub(super) fn packages(&self) -> Result<Option<Vec<Package>>, DiscoverError> {
        let dir = self.path("/sys/devices/system/cpu");
        let Some(names) = list_dir(&dir)? else {
            return Ok(None);
        };
        let online = read_attr(&dir.join("online")).and_then(|s| parse_cpulist(&s));
        let mut cpus: Vec<CpuEntry> = names
            .iter()
            .filter_map(|n| n.strip_prefix("cpu")?.parse::<u32>().ok())
            .filter(|cpu| online.as_ref().is_none_or(|o| o.contains(cpu)))
            .map(|cpu| {
                let topo = dir.join(format!("cpu{cpu}/topology"));
                let id = |f: &str| {
                    read_attr(&topo.join(f))
                        .and_then(|s| s.parse::<i64>().ok())
                        .and_then(|v| u32::try_from(v).ok())
                };
                CpuEntry {
                    cpu,
                    package: id("physical_package_id"),
                    core: id("core_id"),
                }
            })
            .collect();
        cpus.sort_by_key(|c| c.cpu);
        let models = self.cpu_models();

        // package -> core -> PUs; a CPU without core id is its own core.
        let mut grouped: BTreeMap<Option<u32>, CoresOfPackage> = BTreeMap::new();
        for c in &cpus {
            let core_key = match c.core {
                Some(core) => (Some(core), 0),
                None => (None, c.cpu),
            };
            grouped
                .entry(c.package)
                .or_default()
                .entry(core_key)
                .or_default()
                .push(c.cpu);
        }
        let mut packages: Vec<Package> = grouped
            .into_iter()
            .map(|(package, cores)| {
                let mut cores: Vec<Core> = cores
                    .into_iter()
                    .map(|((os_index, _), pu_os_indices)| Core {
                        os_index,
                        pu_os_indices,
                    })
                    .collect();
                cores.sort_by_key(|c| c.pu_os_indices.first().copied());
                Package {
                    os_index: package,
                    cpu_model: package.and_then(|p| models.get(&p).cloned()),
                    cores,
                }
            })
            .collect();
        // Packages with an index first (BTreeMap puts None first).
        packages.sort_by_key(|p| (p.os_index.is_none(), p.os_index));
        Ok(Some(packages))
    }

    /// `model name` per `physical id` from `/proc/cpuinfo` (x86 layout).
    fn cpu_models(&self) -> BTreeMap<u32, String> {
        let mut out = BTreeMap::new();
        let Some(text) = read_attr(&self.path("/proc/cpuinfo")) else {
            return out;
        };
        for block in text.split("\n\n") {
            let field = |key: &str| {
                block.lines().find_map(|line| {
                    let (k, v) = line.split_once(':')?;
                    (k.trim() == key).then(|| v.trim().to_owned())
                })
            };
            if let (Some(model), Some(package)) = (
                field("model name"),
                field("physical id").and_then(|p| p.parse::<u32>().ok()),
            ) {
                out.entry(package).or_insert(model);
            }
        }
        out
    }

    /// NUMA nodes of `/sys/devices/system/node`, with the package of their CPUs
    /// when all of them are in one package; `None` when the directory is absent.
    pub(super) fn numa_nodes(
        &self,
        packages: &[Package],
    ) -> Result<Option<Vec<NumaNode>>, DiscoverError> {
        let dir = self.path("/sys/devices/system/node");
        let Some(names) = list_dir(&dir)? else {
            return Ok(None);
        };
        let package_of_cpu: BTreeMap<u32, Option<u32>> = packages
            .iter()
            .flat_map(|p| {
                p.cores
                    .iter()
                    .flat_map(move |c| c.pu_os_indices.iter().map(move |&pu| (pu, p.os_index)))
            })
            .collect();
        let mut out = Vec::new();
        for name in names {
            let Some(os_index) = name
                .strip_prefix("node")
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            let node = dir.join(&name);
            let cpus = read_attr(&node.join("cpulist"))
                .and_then(|s| parse_cpulist(&s))
                .unwrap_or_default();
            let local_memory_bytes = read_attr(&node.join("meminfo")).and_then(|text| {
                text.lines().find_map(|line| {
                    let rest = line.split_once("MemTotal:")?.1.trim();
                    let kib = rest.strip_suffix("kB").unwrap_or(rest).trim();
                    kib.parse::<u64>().ok().map(|k| k * 1024)
                })
            });
            let mut owners = cpus
                .iter()
                .map(|cpu| package_of_cpu.get(cpu).copied().flatten());
            let package_os_index = match owners.next() {
                Some(Some(first)) if owners.all(|o| o == Some(first)) => Some(first),
                _ => None,
            };
            out.push(NumaNode {
                os_index,
                local_memory_bytes,
                cpuset: format_cpulist(&cpus),
                package_os_index,
            });
        }
        out.sort_by_key(|n| n.os_index);
        Ok(Some(out))
    }
}

/// Names in a directory, sorted; `None` when it does not exist.
pub(super) fn list_dir(dir: &Path) -> Result<Option<Vec<String>>, DiscoverError> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(DiscoverError::Io {
                path: dir.to_owned(),
                source,
            });
        }
    };
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| DiscoverError::Io {
            path: dir.to_owned(),
            source,
        })?;
        if let Ok(name) = entry.file_name().into_string() {
            names.push(name);
        }
    }
    names.sort();
    Ok(Some(names))
}

/// A sysfs attribute, trimmed; `None` when missing, unreadable or empty.
fn read_attr(path: &Path) -> Option<String> {
    let text = fs::read_to_string(path).ok()?;
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_owned())
}

/// A hexadecimal attribute, with or without `0x`.
fn read_hex(path: &Path) -> Option<u64> {
    let text = read_attr(path)?;
    let digits = text
        .strip_prefix("0x")
        .or_else(|| text.strip_prefix("0X"))
        .unwrap_or(&text);
    u64::from_str_radix(digits, 16).ok()
}

/// An integer attribute: decimal, or hexadecimal with `0x`.
fn read_int(path: &Path) -> Option<u64> {
    let text = read_attr(path)?;
    match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => text.parse().ok(),
    }
}

/// A `numa_node` attribute; -1 (unknown) reads as `None`.
fn read_numa(path: &Path) -> Option<u32> {
    read_attr(path)
        .and_then(|s| s.parse::<i64>().ok())
        .and_then(|v| u32::try_from(v).ok())
}

/// `name` is `prefix` followed by decimal digits only.
fn numbered(name: &str, prefix: &str) -> bool {
    name.strip_prefix(prefix)
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// `dddd:bb:dd.f` in hexadecimal (the domain may have 4 to 8 digits).
pub(super) fn is_pci_address(s: &str) -> bool {
    let hex = |p: &str, min: usize, max: usize| {
        (min..=max).contains(&p.len()) && p.bytes().all(|b| b.is_ascii_hexdigit())
    };
    let mut parts = s.split(':');
    let (Some(domain), Some(bus), Some(devfn), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return false;
    };
    let Some((dev, func)) = devfn.split_once('.') else {
        return false;
    };
    hex(domain, 4, 8) && hex(bus, 2, 2) && hex(dev, 2, 2) && hex(func, 1, 1)
}

/// The PCI bus id of the device a sysfs link leads to: the last PCI address among
/// the components of its resolved path (a virtio net device resolves to
/// `.../0000:00:03.0/virtio2`).
fn pci_bus_id_of(link: &Path) -> Option<String> {
    let resolved = fs::canonicalize(link).ok()?;
    resolved
        .components()
        .rev()
        .filter_map(|c| c.as_os_str().to_str())
        .map(str::to_ascii_lowercase)
        .find(|c| is_pci_address(c))
}

/// Parses a Linux CPU list (`0-3,8,10-11`); `None` when malformed.
pub(super) fn parse_cpulist(text: &str) -> Option<Vec<u32>> {
    let mut out = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((lo, hi)) => {
                let (lo, hi) = (lo.parse::<u32>().ok()?, hi.parse::<u32>().ok()?);
                if lo > hi || hi - lo > 1 << 20 {
                    return None;
                }
                out.extend(lo..=hi);
            }
            None => out.push(part.parse().ok()?),
        }
    }
    out.sort_unstable();
    out.dedup();
    Some(out)
}

/// Formats CPU numbers as a list in hwloc's style (`0-3,8,10-11`).
pub(super) fn format_cpulist(cpus: &[u32]) -> String {
    let mut sorted = cpus.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut parts = Vec::new();
    let mut i = 0;
    while i < sorted.len() {
        let start = sorted[i];
        let mut end = start;
        while i + 1 < sorted.len() && sorted[i + 1] == end + 1 {
            i += 1;
            end = sorted[i];
        }
        parts.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
        i += 1;
    }
    parts.join(",")
}

/// Orders `eth2` before `eth10`: compares the text before the trailing digits, then
/// the number they make, then the whole name.
pub(super) fn natural_cmp(a: &str, b: &str) -> std::cmp::Ordering {
    let split = |s: &str| {
        let digits = s.len() - s.trim_end_matches(|c: char| c.is_ascii_digit()).len();
        let (head, tail) = s.split_at(s.len() - digits);
        (head.to_owned(), tail.parse::<u128>().ok())
    };
    split(a).cmp(&split(b)).then_with(|| a.cmp(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpulists_round_trip() {
        assert_eq!(
            parse_cpulist("0-3,8,10-11"),
            Some(vec![0, 1, 2, 3, 8, 10, 11])
        );
        assert_eq!(format_cpulist(&[0, 1, 2, 3, 8, 10, 11]), "0-3,8,10-11");
        assert_eq!(format_cpulist(&[]), "");
        assert_eq!(parse_cpulist("3-1"), None);
        assert_eq!(parse_cpulist("x"), None);
    }

    #[test]
    fn pci_addresses() {
        assert!(is_pci_address("0000:00:03.0"));
        assert!(is_pci_address("10000:c1:00.7"));
        assert!(!is_pci_address("pci0000:00"));
        assert!(!is_pci_address("virtio2"));
        assert!(!is_pci_address("0000:00:03"));
    }

    #[test]
    fn natural_order() {
        let mut names = vec!["eth10", "eth2", "hsn1", "eth1", "cxi0", "eth"];
        names.sort_by(|a, b| natural_cmp(a, b));
        assert_eq!(names, ["cxi0", "eth", "eth1", "eth2", "eth10", "hsn1"]);
    }
}
