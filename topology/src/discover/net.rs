//! Network interfaces (sysfs `/sys/class/net`) with their RDMA devices
//! (`/sys/class/infiniband` and hwloc), and Slingshot `cxi` devices
//! (`/sys/class/cxi`).

use std::collections::{BTreeMap, BTreeSet};

use super::cpus::Locality;
use super::findings::{HwOsDevice, HwOsKind};
use super::sysfs::{CXI_CLASS, CXI_USER_CLASS, Sysfs};
use super::{CxiDevice, DiscoverError, NetworkDevice, note, show, sorted_natural};

/// The network interfaces besides `lo`, each with its PCI device (sysfs, else
/// hwloc), NUMA node and RDMA devices.
pub(super) fn network_interfaces(
    sys: &Sysfs<'_>,
    hw_osdevs: &[HwOsDevice],
    locality: &Locality<'_>,
    sources: &mut Vec<String>,
) -> Result<Vec<NetworkDevice>, DiscoverError> {
    let mut nics = note(sources, sys, "/sys/class/net", sys.net_devices()?, |n| {
        format!("{} interfaces besides lo", n.len())
    });
    for nic in &mut nics {
        if nic.pci_bus_id.is_none() {
            nic.pci_bus_id = hw_osdevs
                .iter()
                .find(|d| d.kind == HwOsKind::Network && d.name == nic.name)
                .and_then(|d| d.pci_bus_id.clone());
        }
        if nic.numa_node.is_none() {
            nic.numa_node = locality.numa_of_bus(nic.pci_bus_id.as_deref());
        }
    }
    let mut rdma: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    if let Some(by_bus) = sys.rdma_devices()? {
        sources.push(format!(
            "sysfs {}: {} devices",
            show(sys, "/sys/class/infiniband"),
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
    Ok(nics)
}

/// The Slingshot `cxi` devices, each with its NUMA node and the network interfaces
/// on its PCI device.
pub(super) fn cxi_devices(
    sys: &Sysfs<'_>,
    nics: &[NetworkDevice],
    locality: &Locality<'_>,
    sources: &mut Vec<String>,
) -> Result<Vec<CxiDevice>, DiscoverError> {
    // `/sys/class/cxi`, else `cxi_user` (the user-space driver's class for the same
    // devices, which libcxi reads) where only that one is there.
    let (class, found) = match sys.cxi_devices()? {
        Some(found) => (CXI_CLASS, Some(found)),
        None => match sys.cxi_devices_in(CXI_USER_CLASS)? {
            Some(found) => (CXI_USER_CLASS, Some(found)),
            None => (CXI_CLASS, None),
        },
    };
    let mut cxi_devices = note(sources, sys, class, found, |c| {
        format!("{} devices", c.len())
    });
    for cxi in &mut cxi_devices {
        if cxi.numa_node.is_none() {
            cxi.numa_node = locality.numa_of_bus(cxi.pci_bus_id.as_deref());
        }
        if let Some(bus) = &cxi.pci_bus_id {
            cxi.net_interfaces = nics
                .iter()
                .filter(|n| n.pci_bus_id.as_ref() == Some(bus))
                .map(|n| n.name.clone())
                .collect();
        }
    }
    Ok(cxi_devices)
}
