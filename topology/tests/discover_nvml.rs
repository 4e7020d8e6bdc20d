//! NVIDIA GPUs and NVML: discovery of a test tree never loads NVML (it reads the real
//! machine), says so in its sources, and `halo topo`'s matrix shows NVLink links as
//! NVML's. The walk over NVML itself and its per-pair rules are tested in
//! `topology/src/discover/nvml.rs` (the functions are private to discovery).
//!
//! The tree is a DGX H100's GPUs: 8 H100 SXM5 (PCI `10de:2330`, 3D controller) at the
//! bus ids `nvidia-smi` lists on one (18, 2a, 3a, 5d, 9a, ab, ba, db), the first four on
//! NUMA node 0, the others on 1.

mod discover_support;

use halo_topology::discover::{
    DiscoverOptions, EnvSource, GpuLink, GpuLinkKind, GpuVendor, LocalMachine, discover_with,
};

use discover_support::{TempTree, env};

const DGX_H100_BUS: [u8; 8] = [0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb];

fn dgx_h100() -> TempTree {
    let t = TempTree::new("nvml-dgx");
    t.file("/proc/sys/kernel/hostname", "dgx01\n");
    for (i, bus) in DGX_H100_BUS.iter().enumerate() {
        let dir = format!("/sys/devices/pci0000:{bus:02x}/0000:{bus:02x}:00.0");
        t.file(&format!("{dir}/vendor"), "0x10de\n");
        t.file(&format!("{dir}/device"), "0x2330\n");
        t.file(&format!("{dir}/class"), "0x030200\n");
        t.file(&format!("{dir}/numa_node"), &format!("{}\n", i / 4));
        t.link(&format!("/sys/bus/pci/devices/0000:{bus:02x}:00.0"), &dir);
    }
    t
}

fn discover(t: &TempTree, env: EnvSource) -> LocalMachine {
    discover_with(&DiscoverOptions {
        root: t.0.clone(),
        use_hwloc: false,
        env,
    })
    .unwrap()
}

/// A test tree is never the machine NVML describes: NVML is not loaded, even where
/// `HALO_NVML_LIBRARY` names a library, and the sources say why.
#[test]
fn a_test_tree_never_loads_nvml() {
    let t = dgx_h100();
    let snapshot = env(&[(
        "HALO_NVML_LIBRARY",
        "/nonexistent/halo-test/libnvidia-ml.so.1",
    )]);
    let m = discover(&t, EnvSource::Snapshot(snapshot));
    assert_eq!(m.gpus.len(), 8);
    assert!(m.gpus.iter().all(|g| g.vendor == GpuVendor::Nvidia));
    assert!(m.gpu_links.is_empty());
    let note = format!(
        "nvml: not tried (root {} is not /, and NVML reads the real machine)",
        t.0.display()
    );
    assert!(m.sources.contains(&note), "{:?}", m.sources);
    assert!(!m.sources.iter().any(|s| s.contains("unavailable")));
}

/// What NVML gives a DGX H100 (18 links between every two GPUs, through the switches),
/// printed as `halo topo` prints it.
#[test]
fn nvlink_links_render_as_nvml() {
    let t = dgx_h100();
    let mut m = discover(&t, EnvSource::Snapshot(Default::default()));
    let ids: Vec<String> = m.gpus.iter().map(|g| g.pci_bus_id.clone()).collect();
    for a in &ids {
        for b in ids.iter().filter(|b| *b != a) {
            m.gpu_links.push(GpuLink {
                from: a.clone(),
                to: b.clone(),
                kind: GpuLinkKind::NvLink,
                links: 18,
                bandwidth_bytes_per_sec: 450_000_000_000,
                weight: 0,
            });
        }
    }
    let tree = m.render_tree();
    assert!(
        tree.contains("GPU links (links between each pair; . none; NVML):"),
        "{tree}"
    );
    let rows = m.gpu_link_matrix();
    assert_eq!(rows.len(), 9);
    assert_eq!(rows[1], " 0 0000:18:00.0   - 18 18 18 18 18 18 18");
    assert_eq!(rows[8], " 7 0000:db:00.0  18 18 18 18 18 18 18  -");
}
