//! What hwloc reported, and running it when asked and available. The walk of the
//! hwloc topology itself is in `hwloc.rs` (built with the `hwloc` feature only);
//! without the feature nothing here is built but the note that hwloc was not used.

#[cfg(feature = "hwloc")]
use super::hwloc;
use super::{NumaNode, Package, PciDevice};

/// Kind of an hwloc OS device that discovery uses.
#[cfg_attr(not(feature = "hwloc"), allow(dead_code))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum HwOsKind {
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
pub(super) struct HwOsDevice {
    /// Name given by hwloc (`eth0`, `card1`).
    pub(super) name: String,
    /// What it is.
    pub(super) kind: HwOsKind,
    /// Bus id of the PCI device it hangs off, if any.
    pub(super) pci_bus_id: Option<String>,
}

/// What hwloc reported (never built without the `hwloc` feature).
#[cfg_attr(not(feature = "hwloc"), allow(dead_code))]
#[derive(Debug, Clone)]
pub(super) struct HwFindings {
    /// `hwloc 2.9.0`, for `sources`.
    pub(super) version: String,
    /// The `HostName` info of the root object.
    pub(super) hostname: Option<String>,
    /// Packages with cores and PUs.
    pub(super) packages: Vec<Package>,
    /// NUMA nodes.
    pub(super) numa_nodes: Vec<NumaNode>,
    /// PCI devices and PCI-to-PCI bridges.
    pub(super) pci_devices: Vec<PciDevice>,
    /// OS devices of the kinds in [`HwOsKind`].
    pub(super) os_devices: Vec<HwOsDevice>,
}

/// Runs hwloc when asked and available, noting the outcome in `sources`.
#[cfg(feature = "hwloc")]
pub(super) fn run_hwloc(use_hwloc: bool, sources: &mut Vec<String>) -> Option<HwFindings> {
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
pub(super) fn run_hwloc(use_hwloc: bool, sources: &mut Vec<String>) -> Option<HwFindings> {
    sources.push(if use_hwloc {
        "hwloc: feature disabled".to_owned()
    } else {
        "hwloc: not used (use_hwloc = false; feature disabled)".to_owned()
    });
    None
}
