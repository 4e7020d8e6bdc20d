//! Local machine discovery.
//!
//! [`discover`] describes the machine this process runs on: CPU packages, cores and
//! PUs, NUMA nodes, PCI devices, GPUs (with AMD XGMI hives and the direct links
//! between GPUs), network interfaces, Slingshot `cxi` devices and the Slurm placement
//! of the process. It combines four sources:
//!
//! - hwloc (feature `hwloc`, through `hwlocality`): CPUs, NUMA nodes, PCI devices
//!   and OS devices, built with every I/O object kept and disallowed CPUs included
//!   (the whole machine, not only this process's cgroup);
//! - sysfs and procfs below a configurable root: network interfaces, DRM cards
//!   (XGMI), `cxi` devices, RDMA devices, AMD's KFD topology (GPU links), the host
//!   name, and CPUs, NUMA nodes and PCI devices when hwloc is not used or fails;
//! - NVML (`libnvidia-ml.so.1`, loaded at run time, never linked), only when NVIDIA
//!   GPUs were found and the root is `/`: the NVLink links between GPUs, direct or
//!   through NVSwitches; a missing or failing NVML is noted in `sources`, not an error;
//! - the environment: Slurm variables, and `HALO_NVML_LIBRARY` (the NVML to load).
//!
//! Nothing is invented: what no source reports stays absent (an empty `Vec` or
//! `None`), and [`LocalMachine::sources`] says which source was used and which was
//! unavailable, and why. One inference is made: on a machine with exactly one NUMA
//! node, a PCI device whose NUMA node is unknown is reported on that node (it
//! cannot be anywhere else); hwloc reports the same through its locality.
//!
//! [`discover_with`] takes the sources in turn, one (private) file each:
//! `findings.rs` runs hwloc; `cpus.rs` gives CPUs, NUMA nodes and PCI devices (and
//! the NUMA node of a PCI bus); `net.rs` network interfaces with their RDMA devices,
//! and `cxi` devices; `gpus.rs` GPUs; `kfd.rs` AMD's GPU links; `nvml.rs` NVIDIA's
//! NVLink links; `slurm.rs` the Slurm placement; the host name comes last. `sysfs.rs` and `hwloc.rs` read the two machine sources; `render.rs`
//! prints [`LocalMachine::render_tree`].

mod cpus;
mod findings;
mod gpus;
mod kfd;
mod net;
mod nvml;
mod render;
mod slurm;
mod sysfs;

#[cfg(feature = "hwloc")]
mod hwloc;

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};

use self::cpus::{Locality, Platform};
use self::findings::{HwFindings, run_hwloc};
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
    /// Direct GPU-to-GPU links (AMD: the KFD topology's io_links and p2p_links;
    /// NVIDIA: NVML's NVLinks, direct or through NVSwitches), one entry per direction,
    /// by (from, to) bus id within each source (KFD's first); empty when no source has
    /// them.
    #[serde(default)]
    pub gpu_links: Vec<GpuLink>,
    /// Placement under Slurm; `None` when neither `SLURM_JOB_ID` nor `SLURM_PROCID`
    /// is set.
    pub slurm: Option<SlurmPlacement>,
    /// Which sources were used (`hwloc 2.9.0 ...`, `sysfs /sys/class/net: ...`) and
    /// which were unavailable, with why (`hwloc: feature disabled`).
    pub sources: Vec<String>,
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

/// One direct link from one GPU to another, as the driver reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuLink {
    /// PCI bus id of the GPU the link leaves.
    pub from: String,
    /// PCI bus id of the GPU it reaches.
    pub to: String,
    /// What carries it.
    pub kind: GpuLinkKind,
    /// Number of links between the two (xGMI: `max_bandwidth / min_bandwidth`, as RCCL
    /// counts them; NVLink: active links from the one to the other, or through
    /// NVSwitches the smaller of the two GPUs' switch links; 1 otherwise).
    pub links: u32,
    /// Bandwidth of all of them together, one direction, bytes per second (KFD's
    /// `max_bandwidth`, MB/s x 10^6; NVLink: links x the per-link rate of the GPU's
    /// generation, 0 where that rate is not known).
    pub bandwidth_bytes_per_sec: u64,
    /// The driver's relative cost (KFD: 15 per xGMI hop, 20 per PCIe segment; NVML
    /// reports none: 0).
    pub weight: u32,
}

/// What carries a [`GpuLink`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum GpuLinkKind {
    /// AMD Infinity Fabric (xGMI).
    Xgmi,
    /// PCI Express.
    Pcie,
    /// NVIDIA NVLink.
    NvLink,
    /// Another CRAT link type (its number).
    Other(u32),
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
    /// Link speed in bytes per second (`device/properties/speed` is Mb/s; 0 or
    /// unreadable: `None`).
    #[serde(default)]
    pub link_speed_bytes_per_sec: Option<u64>,
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
    /// A file of AMD's KFD topology is malformed, truncated or contradicts another.
    #[error("KFD topology: {} {reason}", path.display())]
    Kfd {
        /// The file.
        path: PathBuf,
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
    /// it at a fake tree. hwloc always reads the real machine; NVML does too, so it is
    /// loaded only when the root is `/`.
    pub root: PathBuf,
    /// Use hwloc for CPUs, NUMA nodes, PCI and OS devices (default `true`; without
    /// the `hwloc` feature this is noted in `sources` and sysfs is used).
    pub use_hwloc: bool,
    /// Where the Slurm variables and `HALO_NVML_LIBRARY` come from (default: the
    /// process environment).
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
/// Nor is an NVML that does not load, initialise or answer: there are no NVLink links
/// and `sources` says why.
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
    let hw_osdevs = hw.as_ref().map(|h| h.os_devices.as_slice()).unwrap_or(&[]);

    let Platform {
        packages,
        numa_nodes,
        mut pci_devices,
    } = cpus::cpus_numa_pci(&sys, hw.as_ref(), &mut sources)?;
    let locality = Locality::new(&sys, &numa_nodes, &mut pci_devices);
    let nics = net::network_interfaces(&sys, hw_osdevs, &locality, &mut sources)?;
    let gpus = gpus::gpus(&sys, &pci_devices, hw_osdevs, &locality, &mut sources)?;
    let cxi_devices = net::cxi_devices(&sys, &nics, &locality, &mut sources)?;
    let mut gpu_links = note(
        &mut sources,
        &sys,
        kfd::TOPOLOGY,
        kfd::gpu_links(&sys.path(kfd::TOPOLOGY))?,
        |l| format!("{} direct GPU-to-GPU links (KFD)", l.len()),
    );
    let env = options.env.variables();
    gpu_links.extend(nvml_links(&options.root, &gpus, &env, &mut sources));
    let slurm = slurm::placement(&env, &mut sources)?;
    let hostname = hostname(&sys, hw.as_ref(), &env, &mut sources)?;

    Ok(LocalMachine {
        hostname,
        packages,
        numa_nodes,
        gpus,
        nics,
        pci_devices,
        cxi_devices,
        gpu_links,
        slurm,
        sources,
    })
}

/// The NVLink links NVML reports, when there are NVIDIA GPUs and the root is `/`: NVML
/// reads the real machine, so discovery of a test tree never loads it. Never an error:
/// an NVML that does not load, initialise or answer is noted in `sources`.
fn nvml_links(
    root: &Path,
    gpus: &[Gpu],
    env: &BTreeMap<String, String>,
    sources: &mut Vec<String>,
) -> Vec<GpuLink> {
    if !gpus.iter().any(|g| g.vendor == GpuVendor::Nvidia) {
        sources.push("nvml: not tried (no NVIDIA GPU)".to_owned());
        return Vec::new();
    }
    if root != Path::new("/") {
        sources.push(format!(
            "nvml: not tried (root {} is not /, and NVML reads the real machine)",
            root.display()
        ));
        return Vec::new();
    }
    let library = env
        .get(halo_params::NVML_LIBRARY.name)
        .filter(|v| !v.trim().is_empty())
        .map(PathBuf::from);
    match nvml::read(library.as_deref()) {
        Ok(found) => {
            let links = nvml::nvlink_pairs(&found.devices);
            let unknown = if links.iter().any(|l| l.bandwidth_bytes_per_sec == 0) {
                " (bandwidth 0 where the GPU's per-link rate is not known)"
            } else {
                ""
            };
            sources.push(format!(
                "nvml {}: {} GPUs, {} NVLink pairs{unknown}",
                found.library,
                found.devices.len(),
                links.len()
            ));
            links
        }
        Err(nvml::NvmlError::Unavailable(why)) => {
            if library.is_some() {
                tracing::warn!("{} not used: {why}", halo_params::NVML_LIBRARY.name);
            }
            sources.push(format!("nvml: unavailable ({why})"));
            Vec::new()
        }
        Err(nvml::NvmlError::Failed(why)) => {
            tracing::warn!("NVML failed, no NVLink links: {why}");
            sources.push(format!("nvml: failed ({why}); no NVLink links"));
            Vec::new()
        }
    }
}

/// The host name: procfs, else hwloc's `HostName`, else `$HOSTNAME`.
fn hostname(
    sys: &Sysfs<'_>,
    hw: Option<&HwFindings>,
    env: &BTreeMap<String, String>,
    sources: &mut Vec<String>,
) -> Result<String, DiscoverError> {
    Ok(if let Some(name) = sys.hostname() {
        sources.push(format!("procfs {}", show(sys, "/proc/sys/kernel/hostname")));
        name
    } else if let Some(name) = hw.and_then(|h| h.hostname.clone()) {
        sources.push("hostname from hwloc".to_owned());
        name
    } else if let Some(name) = env.get("HOSTNAME").filter(|h| !h.is_empty()) {
        sources.push("hostname from $HOSTNAME".to_owned());
        name.clone()
    } else {
        return Err(DiscoverError::Hostname(format!(
            "{} unreadable, no hwloc HostName, no $HOSTNAME",
            show(sys, "/proc/sys/kernel/hostname")
        )));
    })
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
