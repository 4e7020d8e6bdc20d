//! GPUs: PCI devices of a GPU class, plus DRM cards on PCI (sysfs `/sys/class/drm`,
//! with AMD XGMI hives), named by their DRM cards and hwloc OS devices.

use std::collections::BTreeMap;

use super::cpus::Locality;
use super::findings::{HwOsDevice, HwOsKind};
use super::sysfs::Sysfs;
use super::{
    DiscoverError, Gpu, GpuVendor, PciDevice, XgmiInfo, is_gpu_pci_device, note, sorted_natural,
};

/// The GPUs, in PCI bus id order.
pub(super) fn gpus(
    sys: &Sysfs<'_>,
    pci_devices: &[PciDevice],
    hw_osdevs: &[HwOsDevice],
    locality: &Locality<'_>,
    sources: &mut Vec<String>,
) -> Result<Vec<Gpu>, DiscoverError> {
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
    let drm = note(sources, sys, "/sys/class/drm", sys.drm_devices()?, |d| {
        format!("{} cards/render nodes on PCI", d.len())
    });
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
                        .or_else(|| locality.numa_of_bus(Some(&card.pci_bus_id))),
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
        gpu.numa_node = gpu.numa_node.or(locality.only_numa_node);
        if let Some(xgmi) = &mut gpu.xgmi {
            xgmi.peer_pci_bus_ids = hives
                .iter()
                .filter(|(bus, hive)| *hive == xgmi.hive_id && *bus != gpu.pci_bus_id)
                .map(|(bus, _)| bus.clone())
                .collect();
        }
    }
    Ok(gpus.into_values().collect())
}
