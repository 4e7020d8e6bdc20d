//! CPUs, NUMA nodes and PCI devices (from hwloc, else sysfs), and the NUMA node of a
//! PCI bus, which the network, GPU and `cxi` sources look up.

use std::collections::BTreeMap;

use super::findings::HwFindings;
use super::sysfs::Sysfs;
use super::{DiscoverError, NumaNode, Package, PciDevice, note};

/// CPU packages, NUMA nodes and PCI devices.
pub(super) struct Platform {
    pub(super) packages: Vec<Package>,
    pub(super) numa_nodes: Vec<NumaNode>,
    pub(super) pci_devices: Vec<PciDevice>,
}

/// Packages, NUMA nodes and PCI devices: hwloc's when it ran, else sysfs's (each
/// sysfs directory noted in `sources`).
pub(super) fn cpus_numa_pci(
    sys: &Sysfs<'_>,
    hw: Option<&HwFindings>,
    sources: &mut Vec<String>,
) -> Result<Platform, DiscoverError> {
    Ok(match hw {
        Some(h) => Platform {
            packages: h.packages.clone(),
            numa_nodes: h.numa_nodes.clone(),
            pci_devices: h.pci_devices.clone(),
        },
        None => {
            let packages = note(
                sources,
                sys,
                "/sys/devices/system/cpu",
                sys.packages()?,
                |p| format!("{} packages", p.len()),
            );
            let numa = note(
                sources,
                sys,
                "/sys/devices/system/node",
                sys.numa_nodes(&packages)?,
                |n| format!("{} NUMA nodes", n.len()),
            );
            let pci = note(
                sources,
                sys,
                "/sys/bus/pci/devices",
                sys.pci_devices()?,
                |d| format!("{} devices", d.len()),
            );
            Platform {
                packages,
                numa_nodes: numa,
                pci_devices: pci,
            }
        }
    })
}

/// Which NUMA node a PCI bus is on.
pub(super) struct Locality<'s> {
    sys: &'s Sysfs<'s>,
    /// The node of every known PCI device, by bus id.
    pci_numa: BTreeMap<String, Option<u32>>,
    /// The one NUMA node of a machine that has exactly one.
    pub(super) only_numa_node: Option<u32>,
}

impl<'s> Locality<'s> {
    /// Settles the NUMA node of every PCI device and remembers it by bus id.
    pub(super) fn new(
        sys: &'s Sysfs<'s>,
        numa_nodes: &[NumaNode],
        pci_devices: &mut [PciDevice],
    ) -> Self {
        let only_numa_node = match numa_nodes {
            [only] => Some(only.os_index),
            _ => None,
        };
        // sysfs knows the node of each PCI device; hwloc's locality can be coarser (a
        // package spanning several nodes), so sysfs comes first.
        for device in pci_devices.iter_mut() {
            device.numa_node = sys
                .pci_numa_node(&device.bus_id)
                .or(device.numa_node)
                .or(only_numa_node);
        }
        let pci_numa = pci_devices
            .iter()
            .map(|d| (d.bus_id.clone(), d.numa_node))
            .collect();
        Locality {
            sys,
            pci_numa,
            only_numa_node,
        }
    }

    /// The NUMA node of the device on `bus`: a known PCI device's, else sysfs's, else
    /// the only node.
    pub(super) fn numa_of_bus(&self, bus: Option<&str>) -> Option<u32> {
        let bus = bus?;
        self.pci_numa
            .get(bus)
            .copied()
            .flatten()
            .or_else(|| self.sys.pci_numa_node(bus))
            .or(self.only_numa_node)
    }
}
