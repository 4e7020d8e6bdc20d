//! Discovery through hwloc (the `hwloc` feature, crate `hwlocality`).

use std::collections::BTreeMap;

use hwlocality::{
    Topology,
    cpu::cpuset::CpuSet,
    object::{
        TopologyObject,
        attributes::{ObjectAttributes, PCIDeviceAttributes, UpstreamAttributes},
        types::{OSDeviceType, ObjectType},
    },
    topology::builder::{BuildFlags, TypeFilter},
};

use super::findings::{HwFindings, HwOsDevice, HwOsKind};
use super::sysfs::format_cpulist;
use super::{Core, NumaNode, Package, PciDevice};

/// Builds the topology of the whole machine (disallowed CPUs included) with every
/// I/O object kept, and walks it.
pub(super) fn discover() -> Result<HwFindings, String> {
    let topology = Topology::builder()
        .with_flags(BuildFlags::INCLUDE_DISALLOWED)
        .map_err(|e| format!("setting build flags: {e}"))?
        .with_io_type_filter(TypeFilter::KeepAll)
        .map_err(|e| format!("setting the I/O type filter: {e}"))?
        .build()
        .map_err(|e| format!("loading the topology: {e}"))?;

    let root = topology.root_object();
    let info = |key: &str| {
        root.info(key)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let version = match info("hwlocVersion") {
        Some(v) => format!("hwloc {v}"),
        None => {
            let api = hwlocality::hwloc_api_version();
            format!(
                "hwloc (API {}.{}.{})",
                api >> 16,
                (api >> 8) & 0xff,
                api & 0xff
            )
        }
    };

    Ok(HwFindings {
        version,
        hostname: info("HostName"),
        packages: packages(&topology),
        numa_nodes: numa_nodes(&topology),
        pci_devices: pci_devices(&topology),
        os_devices: os_devices(&topology),
    })
}

/// `os_index` as `u32`.
fn os_index(obj: &TopologyObject) -> Option<u32> {
    obj.os_index().and_then(|i| u32::try_from(i).ok())
}

/// The only NUMA node in an object's nodeset, if it has exactly one.
fn single_numa_node(obj: &TopologyObject) -> Option<u32> {
    let nodeset = obj.nodeset()?;
    if nodeset.weight() != Some(1) {
        return None;
    }
    nodeset
        .first_set()
        .and_then(|i| u32::try_from(usize::from(i)).ok())
}

/// The package an object belongs to, `None` when it is not inside exactly one.
fn package_of(obj: &TopologyObject) -> Option<&TopologyObject> {
    obj.first_ancestor_with_type(ObjectType::Package)
}

/// Packages with their cores and PUs, in hwloc's logical order. Cores outside any
/// package (hwloc found no package level) are gathered in one package without an
/// OS index.
fn packages(topology: &Topology) -> Vec<Package> {
    let mut by_package: BTreeMap<Option<usize>, Package> = BTreeMap::new();
    for package in topology.objects_with_type(ObjectType::Package) {
        by_package.insert(
            Some(package.logical_index()),
            Package {
                os_index: os_index(package),
                cpu_model: package
                    .info("CPUModel")
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned),
                cores: Vec::new(),
            },
        );
    }
    let mut pus_by_core: BTreeMap<usize, Vec<u32>> = BTreeMap::new();
    for pu in topology.objects_with_type(ObjectType::PU) {
        if let (Some(core), Some(index)) =
            (pu.first_ancestor_with_type(ObjectType::Core), os_index(pu))
        {
            pus_by_core
                .entry(core.logical_index())
                .or_default()
                .push(index);
        }
    }
    for core in topology.objects_with_type(ObjectType::Core) {
        let key = package_of(core).map(TopologyObject::logical_index);
        let pus = pus_by_core
            .remove(&core.logical_index())
            .unwrap_or_default();
        by_package
            .entry(key)
            .or_insert_with(|| Package {
                os_index: None,
                cpu_model: None,
                cores: Vec::new(),
            })
            .cores
            .push(Core {
                os_index: os_index(core),
                pu_os_indices: pus,
            });
    }
    // Packages first in logical order, the package-less group last.
    let mut out: Vec<Package> = Vec::new();
    let mut orphan = None;
    for (key, package) in by_package {
        match key {
            Some(_) => out.push(package),
            None => orphan = Some(package),
        }
    }
    out.extend(orphan);
    out
}

/// NUMA nodes with local memory, cpuset and package.
fn numa_nodes(topology: &Topology) -> Vec<NumaNode> {
    topology
        .objects_with_type(ObjectType::NUMANode)
        .filter_map(|node| {
            let local_memory_bytes = match node.attributes() {
                Some(ObjectAttributes::NUMANode(attrs)) => attrs.local_memory().map(u64::from),
                _ => None,
            };
            Some(NumaNode {
                os_index: os_index(node)?,
                local_memory_bytes,
                cpuset: node.cpuset().map(|c| cpu_list(&c)).unwrap_or_default(),
                package_os_index: package_of(node).and_then(os_index),
            })
        })
        .collect()
}

/// A cpuset as a list (`0-3,8`); empty for an infinite set.
fn cpu_list(set: &CpuSet) -> String {
    if set.weight().is_none() {
        return String::new();
    }
    let cpus: Vec<u32> = set
        .iter_set()
        .filter_map(|i| u32::try_from(usize::from(i)).ok())
        .collect();
    format_cpulist(&cpus)
}

/// `dddd:bb:dd.f` from PCI attributes.
fn bus_id(pci: &PCIDeviceAttributes) -> String {
    format!(
        "{:04x}:{:02x}:{:02x}.{:x}",
        pci.domain(),
        pci.bus_id(),
        pci.bus_device(),
        pci.function()
    )
}

/// The name hwloc has for a PCI object: its own name, else the vendor and device
/// names from its infos.
fn pci_name(obj: &TopologyObject) -> Option<String> {
    if let Some(name) = obj.name().and_then(|n| n.to_str().ok())
        && !name.is_empty()
    {
        return Some(name.to_owned());
    }
    let info = |k: &str| obj.info(k).and_then(|v| v.to_str().ok());
    match (info("PCIVendor"), info("PCIDevice")) {
        (Some(v), Some(d)) => Some(format!("{v} {d}")),
        (Some(x), None) | (None, Some(x)) => Some(x.to_owned()),
        (None, None) => None,
    }
}

/// Every PCI device, and every bridge that has PCI attributes (PCI-to-PCI bridges),
/// sorted by bus id.
fn pci_devices(topology: &Topology) -> Vec<PciDevice> {
    let mut out: Vec<PciDevice> = topology
        .pci_devices()
        .chain(topology.bridges())
        .filter_map(|obj| {
            let pci = match obj.attributes()? {
                ObjectAttributes::PCIDevice(pci) => pci,
                ObjectAttributes::Bridge(bridge) => match bridge.upstream_attributes()? {
                    UpstreamAttributes::PCI(pci) => pci,
                },
                _ => return None,
            };
            Some(PciDevice {
                bus_id: bus_id(pci),
                class_id: pci.class_id(),
                vendor_id: pci.vendor_id(),
                device_id: pci.device_id(),
                name: pci_name(obj),
                numa_node: obj.first_non_io_ancestor().and_then(single_numa_node),
            })
        })
        .collect();
    out.sort_by(|a, b| a.bus_id.cmp(&b.bus_id));
    out.dedup_by(|a, b| a.bus_id == b.bus_id);
    out
}

/// GPU, co-processor, network and OpenFabrics OS devices with their PCI parent.
fn os_devices(topology: &Topology) -> Vec<HwOsDevice> {
    topology
        .os_devices()
        .filter_map(|obj| {
            let kind = match obj.attributes()? {
                ObjectAttributes::OSDevice(osdev) => match osdev.device_type() {
                    OSDeviceType::GPU => HwOsKind::Gpu,
                    OSDeviceType::CoProcessor => HwOsKind::CoProcessor,
                    OSDeviceType::Network => HwOsKind::Network,
                    OSDeviceType::OpenFabrics => HwOsKind::OpenFabrics,
                    _ => return None,
                },
                _ => return None,
            };
            let name = obj.name()?.to_str().ok()?.to_owned();
            let pci_bus_id = obj.ancestors().find_map(|a| match a.attributes() {
                Some(ObjectAttributes::PCIDevice(pci)) => Some(bus_id(pci)),
                _ => None,
            });
            Some(HwOsDevice {
                name,
                kind,
                pci_bus_id,
            })
        })
        .collect()
}
