//! Local machine discovery.
//!
//! [`discover`] describes the machine this process runs on: CPU packages, cores and
//! PUs, NUMA nodes, PCI devices, GPUs (with AMD XGMI hives), network interfaces,
//! Slingshot `cxi` devices and the Slurm placement of the process. It combines
//! three sources:
//!
//! - hwloc (feature `hwloc`, through `hwlocality`): CPUs, NUMA nodes, PCI devices
//!   and OS devices, built with every I/O object kept and disallowed CPUs included
//!   (the whole machine, not only this process's cgroup);
//! - sysfs and procfs below a configurable root: network interfaces, DRM cards
//!   (XGMI), `cxi` devices, RDMA devices, the host name, and CPUs, NUMA nodes and
//!   PCI devices when hwloc is not used or fails;
//! - the environment: Slurm variables.
//!
//! Nothing is invented: what no source reports stays absent (an empty `Vec` or
//! `None`), and [`LocalMachine::sources`] says which source was used and which was
//! unavailable, and why. One inference is made: on a machine with exactly one NUMA
//! node, a PCI device whose NUMA node is unknown is reported on that node (it
//! cannot be anywhere else); hwloc reports the same through its locality.

mod slurm;
mod sysfs;

#[cfg(feature = "hwloc")]
mod hwloc;

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt::Write as _,
    path::PathBuf,
};

use serde::{Deserialize, Serialize};

pub use self::slurm::expand_nodelist;
use self::sysfs::{Sysfs, natural_cmp};

/// What was found on this machine. Everything missing is reported as absent
/// (empty `Vec` / `None`), never invented.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LocalMachine {
    /// Host name, from `/proc/sys/kernel/hostname` (else hwloc, else `$HOSTNAME`).
    pub hostname: String,
    /// CPU packages (sockets) with their cores and PUs.
    pub packages: Vec<Package>,
    /// NUMA nodes, by OS index.
    pub numa_nodes: Vec<NumaNode>,
    /// GPUs on PCI, by bus id.
    pub gpus: Vec<Gpu>,
    /// Network interfaces of `/sys/class/net` except loopback, in natural name order.
    pub nics: Vec<NetworkDevice>,
    /// Every PCI device (and PCI-to-PCI bridge), by bus id.
    pub pci_devices: Vec<PciDevice>,
    /// Slingshot devices of `/sys/class/cxi`, in natural name order.
    pub cxi_devices: Vec<CxiDevice>,
    /// Placement under Slurm; `None` when neither `SLURM_JOB_ID` nor `SLURM_PROCID`
    /// is set.
    pub slurm: Option<SlurmPlacement>,
    /// Which sources were used (`hwloc 2.9.0 ...`, `sysfs /sys/class/net: ...`) and
    /// which were unavailable, with why (`hwloc: feature disabled`).
    pub sources: Vec<String>,
}

/// A CPU package (socket).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Package {
    /// OS index (`physical_package_id`); `None` for cores that are in no package.
    pub os_index: Option<u32>,
    /// CPU model name (hwloc `CPUModel`, or `model name` of `/proc/cpuinfo`).
    pub cpu_model: Option<String>,
    /// Cores of the package.
    pub cores: Vec<Core>,
}

impl Package {
    /// Number of cores.
    pub fn core_count(&self) -> usize {
        self.cores.len()
    }

    /// Number of PUs (hardware threads).
    pub fn pu_count(&self) -> usize {
        self.cores.iter().map(|c| c.pu_os_indices.len()).sum()
    }

    /// OS indices of all PUs of the package, ascending.
    pub fn pu_os_indices(&self) -> Vec<u32> {
        let mut pus: Vec<u32> = self
            .cores
            .iter()
            .flat_map(|c| c.pu_os_indices.iter().copied())
            .collect();
        pus.sort_unstable();
        pus
    }
}

/// A CPU core.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Core {
    /// OS index (`core_id`, unique only inside its package).
    pub os_index: Option<u32>,
    /// OS indices (Linux CPU numbers) of its PUs.
    pub pu_os_indices: Vec<u32>,
}

/// A NUMA node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NumaNode {
    /// OS index (`nodeN`).
    pub os_index: u32,
    /// Local memory in bytes, if known.
    pub local_memory_bytes: Option<u64>,
    /// CPUs of the node as a list (`0-3,8`); empty for a memory-only node.
    pub cpuset: String,
    /// The package the node is inside, when it is inside exactly one.
    pub package_os_index: Option<u32>,
}

/// A PCI device (or PCI-to-PCI bridge).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PciDevice {
    /// `dddd:bb:dd.f`, lower-case hexadecimal.
    pub bus_id: String,
    /// Class and subclass (`0x0200` Ethernet, `0x0302` 3D controller).
    pub class_id: u16,
    /// PCI vendor id.
    pub vendor_id: u16,
    /// PCI device id.
    pub device_id: u16,
    /// Name, when hwloc has one.
    pub name: Option<String>,
    /// NUMA node the device is attached to, if known.
    pub numa_node: Option<u32>,
}

/// Who made a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum GpuVendor {
    /// AMD (PCI vendor 0x1002).
    #[serde(rename = "AMD")]
    Amd,
    /// NVIDIA (PCI vendor 0x10de).
    #[serde(rename = "NVIDIA")]
    Nvidia,
    /// Intel (PCI vendor 0x8086).
    #[serde(rename = "Intel")]
    Intel,
    /// Anyone else.
    #[serde(rename = "other")]
    Other,
}

impl GpuVendor {
    /// The vendor of a PCI vendor id.
    pub fn from_pci_vendor(vendor_id: u16) -> Self {
        match vendor_id {
            0x1002 => Self::Amd,
            0x10de => Self::Nvidia,
            0x8086 => Self::Intel,
            _ => Self::Other,
        }
    }

    /// `AMD`, `NVIDIA`, `Intel` or `other`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Amd => "AMD",
            Self::Nvidia => "NVIDIA",
            Self::Intel => "Intel",
            Self::Other => "other",
        }
    }
}

/// Whether a PCI device counts as a GPU: a 3D controller (`0x0302`) or other
/// display controller (`0x0380`, AMD Instinct) of any vendor, or a VGA controller
/// (`0x0300`) from AMD, NVIDIA or Intel. VGA controllers of other vendors (server
/// BMCs such as ASPEED, virtual GPUs) are not accelerators and stay PCI devices.
pub fn is_gpu_pci_device(class_id: u16, vendor_id: u16) -> bool {
    match class_id {
        0x0302 | 0x0380 => true,
        0x0300 => GpuVendor::from_pci_vendor(vendor_id) != GpuVendor::Other,
        _ => false,
    }
}

/// A GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gpu {
    /// PCI bus id (`0000:c1:00.0`).
    pub pci_bus_id: String,
    /// PCI vendor id.
    pub vendor_id: u16,
    /// PCI device id.
    pub device_id: u16,
    /// Vendor.
    pub vendor: GpuVendor,
    /// PCI class and subclass.
    pub class_id: u16,
    /// Name, when hwloc has one.
    pub name: Option<String>,
    /// NUMA node, if known.
    pub numa_node: Option<u32>,
    /// OS device names (`card0`, `renderD128`, and hwloc's `rsmi0`, `cuda0`...).
    pub os_device_names: Vec<String>,
    /// AMD XGMI hive membership, from sysfs; `None` when not in a hive.
    pub xgmi: Option<XgmiInfo>,
}

/// AMD XGMI (Infinity Fabric) information of one GPU, from
/// `/sys/class/drm/cardN/device/`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct XgmiInfo {
    /// `xgmi_hive_info/xgmi_hive_id` (non-zero).
    pub hive_id: u64,
    /// `xgmi_device_id`, if present.
    pub device_id: Option<u64>,
    /// `xgmi_physical_id`, if present.
    pub physical_id: Option<u32>,
    /// PCI bus ids of the other GPUs of this machine in the same hive.
    pub peer_pci_bus_ids: Vec<String>,
}

/// Kind of network interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum NicKind {
    /// Ethernet (`type` 1).
    Ethernet,
    /// HPE Slingshot: Ethernet personality, named `hsn*`.
    Slingshot,
    /// InfiniBand (`type` 32).
    InfiniBand,
    /// Anything else (see `link_layer_type`).
    Other,
}

impl NicKind {
    /// `Ethernet`, `Slingshot`, `InfiniBand` or `other`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ethernet => "Ethernet",
            Self::Slingshot => "Slingshot",
            Self::InfiniBand => "InfiniBand",
            Self::Other => "other",
        }
    }
}

/// A network interface of `/sys/class/net`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetworkDevice {
    /// Interface name (`eth0`, `hsn0`, `ib0`).
    pub name: String,
    /// Kind, from `type` and the name.
    pub kind: NicKind,
    /// The `type` file (Linux `ARPHRD_*`: 1 Ethernet, 32 InfiniBand).
    pub link_layer_type: Option<u32>,
    /// PCI bus id of the device behind it, if it is on PCI.
    pub pci_bus_id: Option<String>,
    /// NUMA node, if known.
    pub numa_node: Option<u32>,
    /// Link speed in bytes per second (`speed` is Mb/s; -1 or unreadable: `None`).
    pub link_speed_bytes_per_sec: Option<u64>,
    /// Hardware address (`address`).
    pub address: Option<String>,
    /// `operstate` (`up`, `down`, `unknown`).
    pub operstate: Option<String>,
    /// A software device (under `/sys/devices/virtual`, or without device).
    pub is_virtual: bool,
    /// RDMA devices on the same PCI device (`mlx5_0`), from `/sys/class/infiniband`
    /// and hwloc.
    pub rdma_devices: Vec<String>,
}

/// A Slingshot NIC of `/sys/class/cxi`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CxiDevice {
    /// Device name (`cxi0`), also its libfabric domain name.
    pub name: String,
    /// PCI bus id, from the `device` link.
    pub pci_bus_id: Option<String>,
    /// NUMA node (`device/numa_node`), if known.
    pub numa_node: Option<u32>,
    /// Fabric node id (`device/properties/nid`), if present.
    pub nid: Option<u32>,
    /// Link state (`device/properties/link`), if present.
    pub link_up: Option<bool>,
    /// Network interfaces on the same PCI device (`hsn0`).
    pub net_interfaces: Vec<String>,
}

/// Where Slurm placed this process, from its environment variables.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlurmPlacement {
    /// `SLURM_JOB_ID`.
    pub job_id: Option<String>,
    /// `SLURM_JOB_NODELIST` (else `SLURM_NODELIST`), as given.
    pub job_nodelist: Option<String>,
    /// The node list expanded into host names.
    pub nodes: Vec<String>,
    /// `SLURM_JOB_NUM_NODES` (else `SLURM_NNODES`).
    pub job_num_nodes: Option<u32>,
    /// `SLURMD_NODENAME`: this node's name for Slurm.
    pub node_name: Option<String>,
    /// `SLURM_TOPOLOGY_ADDR` (`s0.s1.frontier00003`).
    pub topology_addr: Option<String>,
    /// `SLURM_TOPOLOGY_ADDR_PATTERN` (`switch.switch.node`).
    pub topology_addr_pattern: Option<String>,
    /// The topology address split into levels, top switch first.
    pub topology_path: Vec<SlurmTopologyLevel>,
    /// `SLURM_PROCID`: global rank.
    pub proc_id: Option<u32>,
    /// `SLURM_NTASKS`: number of ranks.
    pub ntasks: Option<u32>,
    /// `SLURM_LOCALID`: rank on this node.
    pub local_id: Option<u32>,
    /// `SLURM_NODEID`: index of this node in the job.
    pub node_id: Option<u32>,
}

/// One level of a Slurm topology address.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlurmTopologyLevel {
    /// Field of the pattern (`switch`, `node`); `None` without a pattern.
    pub kind: Option<String>,
    /// Name at this level (`s1`, `frontier00003`).
    pub name: String,
}

impl SlurmPlacement {
    /// Reads the placement from an environment snapshot; `Ok(None)` when neither
    /// `SLURM_JOB_ID` nor `SLURM_PROCID` is set.
    ///
    /// # Errors
    ///
    /// [`DiscoverError::NodeList`] for a malformed node list,
    /// [`DiscoverError::SlurmVariable`] for a non-numeric rank or count, or a
    /// topology pattern that does not match the address.
    pub fn from_env(env: &BTreeMap<String, String>) -> Result<Option<Self>, DiscoverError> {
        slurm::placement_from_env(env)
    }
}

/// Why discovery failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DiscoverError {
    /// A directory that exists could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Io {
        /// The directory.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// A Slurm node list could not be expanded.
    #[error("malformed Slurm node list `{list}`: {reason}")]
    NodeList {
        /// The list as given.
        list: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A Slurm variable has a value that cannot be used.
    #[error("malformed Slurm variable {name}=`{value}`: {reason}")]
    SlurmVariable {
        /// Variable name.
        name: String,
        /// Its value.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// No source gave a host name.
    #[error("cannot determine the host name: {0}")]
    Hostname(String),
}

/// Where environment variables come from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum EnvSource {
    /// The process environment (`std::env::vars_os`, non-UTF-8 entries skipped).
    #[default]
    Process,
    /// A fixed snapshot.
    Snapshot(BTreeMap<String, String>),
}

impl EnvSource {
    /// The variables as a map.
    pub fn variables(&self) -> BTreeMap<String, String> {
        match self {
            Self::Process => std::env::vars_os()
                .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
                .collect(),
            Self::Snapshot(vars) => vars.clone(),
        }
    }
}

/// How to discover.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoverOptions {
    /// Directory below which `/sys` and `/proc` are read (default `/`); tests point
    /// it at a fake tree. hwloc always reads the real machine.
    pub root: PathBuf,
    /// Use hwloc for CPUs, NUMA nodes, PCI and OS devices (default `true`; without
    /// the `hwloc` feature this is noted in `sources` and sysfs is used).
    pub use_hwloc: bool,
    /// Where the Slurm variables come from (default: the process environment).
    pub env: EnvSource,
}

impl Default for DiscoverOptions {
    fn default() -> Self {
        Self {
            root: PathBuf::from("/"),
            use_hwloc: true,
            env: EnvSource::Process,
        }
    }
}

/// Discovers this machine with the default options: hwloc (when the feature is
/// on), sysfs below `/` and the process environment.
///
/// # Errors
///
/// See [`discover_with`].
pub fn discover() -> Result<LocalMachine, DiscoverError> {
    discover_with(&DiscoverOptions::default())
}

/// Discovers this machine with the given options.
///
/// A failing hwloc is not an error: sysfs is used instead and `sources` says why.
///
/// # Errors
///
/// [`DiscoverError::Io`] when a sysfs class directory exists but cannot be listed,
/// [`DiscoverError::NodeList`] / [`DiscoverError::SlurmVariable`] for malformed
/// Slurm variables, [`DiscoverError::Hostname`] when no host name is found.
pub fn discover_with(options: &DiscoverOptions) -> Result<LocalMachine, DiscoverError> {
    let sys = Sysfs::new(&options.root);
    let mut sources = Vec::new();
    let hw = run_hwloc(options.use_hwloc, &mut sources);

    // CPUs, NUMA nodes and PCI devices: hwloc, else sysfs.
    let (packages, numa_nodes, mut pci_devices) = match &hw {
        Some(h) => (
            h.packages.clone(),
            h.numa_nodes.clone(),
            h.pci_devices.clone(),
        ),
        None => {
            let packages = note(
                &mut sources,
                &sys,
                "/sys/devices/system/cpu",
                sys.packages()?,
                |p| format!("{} packages", p.len()),
            );
            let numa = note(
                &mut sources,
                &sys,
                "/sys/devices/system/node",
                sys.numa_nodes(&packages)?,
                |n| format!("{} NUMA nodes", n.len()),
            );
            let pci = note(
                &mut sources,
                &sys,
                "/sys/bus/pci/devices",
                sys.pci_devices()?,
                |d| format!("{} devices", d.len()),
            );
            (packages, numa, pci)
        }
    };
    let only_numa_node = match numa_nodes.as_slice() {
        [only] => Some(only.os_index),
        _ => None,
    };
    // sysfs knows the node of each PCI device; hwloc's locality can be coarser (a
    // package spanning several nodes), so sysfs comes first.
    for device in &mut pci_devices {
        device.numa_node = sys
            .pci_numa_node(&device.bus_id)
            .or(device.numa_node)
            .or(only_numa_node);
    }
    let pci_numa: BTreeMap<String, Option<u32>> = pci_devices
        .iter()
        .map(|d| (d.bus_id.clone(), d.numa_node))
        .collect();
    let numa_of_bus = |bus: Option<&str>| -> Option<u32> {
        let bus = bus?;
        pci_numa
            .get(bus)
            .copied()
            .flatten()
            .or_else(|| sys.pci_numa_node(bus))
            .or(only_numa_node)
    };

    let hw_osdevs = hw.as_ref().map(|h| h.os_devices.as_slice()).unwrap_or(&[]);

    // Network interfaces.
    let mut nics = match sys.net_devices()? {
        Some(nics) => {
            sources.push(format!(
                "sysfs {}: {} interfaces besides lo",
                show(&sys, "/sys/class/net"),
                nics.len()
            ));
            nics
        }
        None => {
            sources.push(format!("sysfs {}: absent", show(&sys, "/sys/class/net")));
            Vec::new()
        }
    };
    for nic in &mut nics {
        if nic.pci_bus_id.is_none() {
            nic.pci_bus_id = hw_osdevs
                .iter()
                .find(|d| d.kind == HwOsKind::Network && d.name == nic.name)
                .and_then(|d| d.pci_bus_id.clone());
        }
        if nic.numa_node.is_none() {
            nic.numa_node = numa_of_bus(nic.pci_bus_id.as_deref());
        }
    }
    let mut rdma: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    if let Some(by_bus) = sys.rdma_devices()? {
        sources.push(format!(
            "sysfs {}: {} devices",
            show(&sys, "/sys/class/infiniband"),
            by_bus.values().map(Vec::len).sum::<usize>()
        ));
        for (bus, names) in by_bus {
            rdma.entry(bus).or_default().extend(names);
        }
    }
    for d in hw_osdevs.iter().filter(|d| d.kind == HwOsKind::OpenFabrics) {
        if let Some(bus) = &d.pci_bus_id {
            rdma.entry(bus.clone()).or_default().insert(d.name.clone());
        }
    }
    for nic in &mut nics {
        if let Some(names) = nic.pci_bus_id.as_ref().and_then(|b| rdma.get(b)) {
            nic.rdma_devices = sorted_natural(names.iter().cloned());
        }
    }

    // GPUs: PCI devices of a GPU class, plus DRM cards on PCI.
    let mut gpus: BTreeMap<String, Gpu> = pci_devices
        .iter()
        .filter(|d| is_gpu_pci_device(d.class_id, d.vendor_id))
        .map(|d| {
            let gpu = Gpu {
                pci_bus_id: d.bus_id.clone(),
                vendor_id: d.vendor_id,
                device_id: d.device_id,
                vendor: GpuVendor::from_pci_vendor(d.vendor_id),
                class_id: d.class_id,
                name: d.name.clone(),
                numa_node: d.numa_node,
                os_device_names: Vec::new(),
                xgmi: None,
            };
            (d.bus_id.clone(), gpu)
        })
        .collect();
    let drm = match sys.drm_devices()? {
        Some(drm) => {
            sources.push(format!(
                "sysfs {}: {} cards/render nodes on PCI",
                show(&sys, "/sys/class/drm"),
                drm.len()
            ));
            drm
        }
        None => {
            sources.push(format!("sysfs {}: absent", show(&sys, "/sys/class/drm")));
            Vec::new()
        }
    };
    for card in &drm {
        if !gpus.contains_key(&card.pci_bus_id) {
            let (Some(class_id), Some(vendor_id), Some(device_id)) =
                (card.class_id, card.vendor_id, card.device_id)
            else {
                continue;
            };
            if !is_gpu_pci_device(class_id, vendor_id) {
                continue;
            }
            gpus.insert(
                card.pci_bus_id.clone(),
                Gpu {
                    pci_bus_id: card.pci_bus_id.clone(),
                    vendor_id,
                    device_id,
                    vendor: GpuVendor::from_pci_vendor(vendor_id),
                    class_id,
                    name: None,
                    numa_node: card
                        .numa_node
                        .or_else(|| numa_of_bus(Some(&card.pci_bus_id))),
                    os_device_names: Vec::new(),
                    xgmi: None,
                },
            );
        }
        if let Some(gpu) = gpus.get_mut(&card.pci_bus_id) {
            gpu.os_device_names.push(card.name.clone());
            gpu.numa_node = gpu.numa_node.or(card.numa_node);
            if let Some(hive_id) = card.xgmi_hive_id {
                gpu.xgmi = Some(XgmiInfo {
                    hive_id,
                    device_id: card.xgmi_device_id,
                    physical_id: card.xgmi_physical_id,
                    peer_pci_bus_ids: Vec::new(),
                });
            }
        }
    }
    for d in hw_osdevs
        .iter()
        .filter(|d| matches!(d.kind, HwOsKind::Gpu | HwOsKind::CoProcessor))
    {
        if let Some(gpu) = d.pci_bus_id.as_ref().and_then(|b| gpus.get_mut(b)) {
            gpu.os_device_names.push(d.name.clone());
        }
    }
    let hives: Vec<(String, u64)> = gpus
        .values()
        .filter_map(|g| Some((g.pci_bus_id.clone(), g.xgmi.as_ref()?.hive_id)))
        .collect();
    for gpu in gpus.values_mut() {
        gpu.os_device_names = sorted_natural(std::mem::take(&mut gpu.os_device_names));
        gpu.numa_node = gpu.numa_node.or(only_numa_node);
        if let Some(xgmi) = &mut gpu.xgmi {
            xgmi.peer_pci_bus_ids = hives
                .iter()
                .filter(|(bus, hive)| *hive == xgmi.hive_id && *bus != gpu.pci_bus_id)
                .map(|(bus, _)| bus.clone())
                .collect();
        }
    }
    let gpus: Vec<Gpu> = gpus.into_values().collect();

    // Slingshot cxi devices.
    let mut cxi_devices = match sys.cxi_devices()? {
        Some(cxi) => {
            sources.push(format!(
                "sysfs {}: {} devices",
                show(&sys, "/sys/class/cxi"),
                cxi.len()
            ));
            cxi
        }
        None => {
            sources.push(format!("sysfs {}: absent", show(&sys, "/sys/class/cxi")));
            Vec::new()
        }
    };
    for cxi in &mut cxi_devices {
        if cxi.numa_node.is_none() {
            cxi.numa_node = numa_of_bus(cxi.pci_bus_id.as_deref());
        }
        if let Some(bus) = &cxi.pci_bus_id {
            cxi.net_interfaces = nics
                .iter()
                .filter(|n| n.pci_bus_id.as_ref() == Some(bus))
                .map(|n| n.name.clone())
                .collect();
        }
    }

    // Environment.
    let env = options.env.variables();
    let slurm = SlurmPlacement::from_env(&env)?;
    sources.push(match &slurm {
        Some(s) => format!(
            "env: Slurm{}",
            s.job_id
                .as_ref()
                .map(|j| format!(" job {j}"))
                .unwrap_or_default()
        ),
        None => "env: no SLURM_JOB_ID or SLURM_PROCID (not under Slurm)".to_owned(),
    });

    // Host name.
    let hostname = if let Some(name) = sys.hostname() {
        sources.push(format!(
            "procfs {}",
            show(&sys, "/proc/sys/kernel/hostname")
        ));
        name
    } else if let Some(name) = hw.as_ref().and_then(|h| h.hostname.clone()) {
        sources.push("hostname from hwloc".to_owned());
        name
    } else if let Some(name) = env.get("HOSTNAME").filter(|h| !h.is_empty()) {
        sources.push("hostname from $HOSTNAME".to_owned());
        name.clone()
    } else {
        return Err(DiscoverError::Hostname(format!(
            "{} unreadable, no hwloc HostName, no $HOSTNAME",
            show(&sys, "/proc/sys/kernel/hostname")
        )));
    };

    Ok(LocalMachine {
        hostname,
        packages,
        numa_nodes,
        gpus,
        nics,
        pci_devices,
        cxi_devices,
        slurm,
        sources,
    })
}

/// Kind of an hwloc OS device that discovery uses.
#[cfg_attr(not(feature = "hwloc"), allow(dead_code))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HwOsKind {
    /// `card0`, `renderD128`, `rsmi0`, `nvml0`...
    Gpu,
    /// `cuda0`, `opencl0d0`...
    CoProcessor,
    /// Network interface (`eth0`).
    Network,
    /// RDMA device (`mlx5_0`).
    OpenFabrics,
}

/// An hwloc OS device.
#[cfg_attr(not(feature = "hwloc"), allow(dead_code))]
#[derive(Debug, Clone)]
struct HwOsDevice {
    /// Name given by hwloc (`eth0`, `card1`).
    name: String,
    /// What it is.
    kind: HwOsKind,
    /// Bus id of the PCI device it hangs off, if any.
    pci_bus_id: Option<String>,
}

/// What hwloc reported (never built without the `hwloc` feature).
#[cfg_attr(not(feature = "hwloc"), allow(dead_code))]
#[derive(Debug, Clone)]
struct HwFindings {
    /// `hwloc 2.9.0`, for `sources`.
    version: String,
    /// The `HostName` info of the root object.
    hostname: Option<String>,
    /// Packages with cores and PUs.
    packages: Vec<Package>,
    /// NUMA nodes.
    numa_nodes: Vec<NumaNode>,
    /// PCI devices and PCI-to-PCI bridges.
    pci_devices: Vec<PciDevice>,
    /// OS devices of the kinds in [`HwOsKind`].
    os_devices: Vec<HwOsDevice>,
}

/// Runs hwloc when asked and available, noting the outcome in `sources`.
#[cfg(feature = "hwloc")]
fn run_hwloc(use_hwloc: bool, sources: &mut Vec<String>) -> Option<HwFindings> {
    if !use_hwloc {
        sources.push("hwloc: not used (use_hwloc = false)".to_owned());
        return None;
    }
    match hwloc::discover() {
        Ok(found) => {
            sources.push(format!(
                "{} (whole machine incl. disallowed CPUs, I/O filter KeepAll)",
                found.version
            ));
            Some(found)
        }
        Err(e) => {
            sources.push(format!(
                "hwloc: failed ({e}); CPUs, NUMA and PCI from sysfs"
            ));
            None
        }
    }
}

/// Runs hwloc when asked and available, noting the outcome in `sources`.
#[cfg(not(feature = "hwloc"))]
fn run_hwloc(use_hwloc: bool, sources: &mut Vec<String>) -> Option<HwFindings> {
    sources.push(if use_hwloc {
        "hwloc: feature disabled".to_owned()
    } else {
        "hwloc: not used (use_hwloc = false; feature disabled)".to_owned()
    });
    None
}

/// The path shown in `sources` for an absolute sysfs path.
fn show(sys: &Sysfs<'_>, absolute: &str) -> String {
    sys.path(absolute).display().to_string()
}

/// Notes a sysfs source (used with a summary, or absent) and unwraps it.
fn note<T: Default>(
    sources: &mut Vec<String>,
    sys: &Sysfs<'_>,
    absolute: &str,
    found: Option<T>,
    summary: impl FnOnce(&T) -> String,
) -> T {
    match found {
        Some(v) => {
            sources.push(format!("sysfs {}: {}", show(sys, absolute), summary(&v)));
            v
        }
        None => {
            sources.push(format!("sysfs {}: absent", show(sys, absolute)));
            T::default()
        }
    }
}

/// Names sorted in natural order, without duplicates.
fn sorted_natural(names: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut names: Vec<String> = names.into_iter().collect();
    names.sort_by(|a, b| natural_cmp(a, b));
    names.dedup();
    names
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
fn or_unknown<T: std::fmt::Display>(value: Option<T>) -> String {
    value.map_or_else(|| "?".to_owned(), |v| v.to_string())
}

impl LocalMachine {
    /// Total number of cores.
    pub fn core_count(&self) -> usize {
        self.packages.iter().map(Package::core_count).sum()
    }

    /// Total number of PUs.
    pub fn pu_count(&self) -> usize {
        self.packages.iter().map(Package::pu_count).sum()
    }

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
                if !cxi.net_interfaces.is_empty() {
                    let _ = write!(text, ", {}", cxi.net_interfaces.join(" "));
                }
                line(2, text);
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
