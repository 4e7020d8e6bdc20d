//! Tests of `halo_topology::discover`: the real machine, a fake sysfs tree, Slurm
//! environment parsing and the rendered tree.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    os::unix::fs::symlink,
    path::{Path, PathBuf},
    sync::atomic::{AtomicU32, Ordering},
};

use halo_topology::discover::{
    Core, CxiDevice, DiscoverError, DiscoverOptions, EnvSource, Gpu, GpuVendor, LocalMachine,
    NetworkDevice, NicKind, NumaNode, Package, PciDevice, SlurmPlacement, SlurmTopologyLevel,
    XgmiInfo, discover, discover_with, expand_nodelist,
};

// ---------------------------------------------------------------------------
// Helpers

/// A directory under the system temp dir, removed on drop.
struct TempTree(PathBuf);

impl TempTree {
    fn new(tag: &str) -> Self {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "halo-discover-{tag}-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.0.join(rel.trim_start_matches('/'))
    }

    /// Writes `content` to `rel`, creating parents.
    fn file(&self, rel: &str, content: &str) {
        let path = self.path(rel);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, content).unwrap();
    }

    fn dir(&self, rel: &str) {
        fs::create_dir_all(self.path(rel)).unwrap();
    }

    /// Makes `rel` a symbolic link to the tree path `target`.
    fn link(&self, rel: &str, target: &str) {
        let path = self.path(rel);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        symlink(self.path(target), path).unwrap();
    }
}

impl Drop for TempTree {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn no_env() -> EnvSource {
    EnvSource::Snapshot(BTreeMap::new())
}

fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

// ---------------------------------------------------------------------------
// (1) The real machine (a 2-core, 1-package, 1-NUMA-node VM without GPU or cxi)

#[test]
fn real_machine_matches_the_system() {
    let m = discover().expect("discovery on this machine");

    assert_eq!(m.packages.len(), 1, "{m:#?}");
    assert!(m.core_count() >= 1);
    assert!(m.pu_count() >= m.core_count());
    assert_eq!(m.numa_nodes.len(), 1, "{m:#?}");
    assert!(m.gpus.is_empty(), "{:#?}", m.gpus);
    assert!(m.cxi_devices.is_empty(), "{:#?}", m.cxi_devices);

    let hostname = fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    assert_eq!(m.hostname, hostname.trim());

    let expected_nics: BTreeSet<String> = fs::read_dir("/sys/class/net")
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .map(|p| p.file_name().unwrap().to_str().unwrap().to_owned())
        .filter(|n| n != "lo")
        .collect();
    let nics: BTreeSet<String> = m.nics.iter().map(|n| n.name.clone()).collect();
    assert_eq!(nics, expected_nics);

    for nic in &m.nics {
        let sys = Path::new("/sys/class/net").join(&nic.name);
        let state = fs::read_to_string(sys.join("operstate")).ok();
        assert_eq!(nic.operstate.as_deref(), state.as_deref().map(str::trim));
        if Path::new("/sys/class/net")
            .join(&nic.name)
            .join("device")
            .exists()
        {
            assert!(nic.pci_bus_id.is_some(), "{nic:#?}");
        }
    }

    // Every PCI device of sysfs is reported (hwloc keeps all I/O objects).
    let sys_pci: BTreeSet<String> = fs::read_dir("/sys/bus/pci/devices")
        .map(|d| {
            d.map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect()
        })
        .unwrap_or_default();
    let found: BTreeSet<String> = m.pci_devices.iter().map(|d| d.bus_id.clone()).collect();
    assert!(found.is_superset(&sys_pci), "{found:?} vs {sys_pci:?}");

    #[cfg(feature = "hwloc")]
    assert!(
        m.sources[0].starts_with("hwloc 2."),
        "sources: {:?}",
        m.sources
    );
    #[cfg(not(feature = "hwloc"))]
    assert!(m.sources.iter().any(|s| s == "hwloc: feature disabled"));
}

#[cfg(feature = "hwloc")]
#[test]
fn hwloc_and_sysfs_agree_on_this_machine() {
    let with = discover_with(&DiscoverOptions {
        env: no_env(),
        ..DiscoverOptions::default()
    })
    .unwrap();
    let without = discover_with(&DiscoverOptions {
        use_hwloc: false,
        env: no_env(),
        ..DiscoverOptions::default()
    })
    .unwrap();
    assert!(
        without
            .sources
            .iter()
            .any(|s| s.starts_with("hwloc: not used")),
        "{:?}",
        without.sources
    );

    let shape = |m: &LocalMachine| -> Vec<(Option<u32>, Vec<Vec<u32>>)> {
        m.packages
            .iter()
            .map(|p| {
                (
                    p.os_index,
                    p.cores.iter().map(|c| c.pu_os_indices.clone()).collect(),
                )
            })
            .collect()
    };
    assert_eq!(shape(&with), shape(&without));
    let numa = |m: &LocalMachine| -> Vec<(u32, String, Option<u32>, bool)> {
        m.numa_nodes
            .iter()
            .map(|n| {
                (
                    n.os_index,
                    n.cpuset.clone(),
                    n.package_os_index,
                    n.local_memory_bytes.is_some(),
                )
            })
            .collect()
    };
    assert_eq!(numa(&with), numa(&without));
    let pci = |m: &LocalMachine| -> Vec<(String, u16, u16, u16, Option<u32>)> {
        m.pci_devices
            .iter()
            .map(|d| {
                (
                    d.bus_id.clone(),
                    d.class_id,
                    d.vendor_id,
                    d.device_id,
                    d.numa_node,
                )
            })
            .collect()
    };
    assert_eq!(pci(&with), pci(&without));
    assert_eq!(with.nics, without.nics);
    assert_eq!(with.hostname, without.hostname);
}

#[test]
fn render_tree_on_this_machine() {
    let m = discover_with(&DiscoverOptions {
        env: no_env(),
        ..DiscoverOptions::default()
    })
    .unwrap();
    let tree = m.render_tree();
    println!("{tree}");
    let p = &m.packages[0];
    let package_line = format!(
        "  Package {}: {} cores, {} PUs",
        p.os_index.unwrap(),
        p.core_count(),
        p.pu_count()
    );
    assert!(
        tree.starts_with(&format!("Machine {}\n", m.hostname)),
        "{tree}"
    );
    assert!(tree.contains(&package_line), "{tree}");
    assert!(tree.contains("\n    NUMA 0: "), "{tree}");
    assert!(tree.contains("\n  GPUs: none found\n"), "{tree}");
    assert!(tree.contains("\n  Slingshot cxi: none found\n"), "{tree}");
    assert!(
        tree.contains("\n  Slurm: not running under Slurm\n"),
        "{tree}"
    );
    for nic in &m.nics {
        assert!(tree.contains(&format!("{} (", nic.name)), "{tree}");
    }
}

#[test]
fn json_round_trip() {
    let m = discover_with(&DiscoverOptions {
        env: EnvSource::Snapshot(slurm_env()),
        ..DiscoverOptions::default()
    })
    .unwrap();
    let json = serde_json::to_string_pretty(&m).unwrap();
    let back: LocalMachine = serde_json::from_str(&json).unwrap();
    assert_eq!(back, m);
    assert!(json.contains("\"hostname\""));
}

// ---------------------------------------------------------------------------
// (2) A fake sysfs tree: two AMD GPUs in one XGMI hive, a BMC VGA, two cxi
// devices, hsn0, an InfiniBand port, a bond and lo; two packages, two NUMA nodes.

const GPU0: &str = "/sys/devices/pci0000:c0/0000:c1:00.0";
const GPU1: &str = "/sys/devices/pci0000:d0/0000:d1:00.0";
const BMC: &str = "/sys/devices/pci0000:00/0000:02:00.0";
const CXI0: &str = "/sys/devices/pci0000:c0/0000:c5:00.0";
const CXI1: &str = "/sys/devices/pci0000:d0/0000:d5:00.0";
const IB: &str = "/sys/devices/pci0000:e0/0000:e1:00.0";

fn pci_dev(t: &TempTree, dir: &str, vendor: &str, device: &str, class: &str, numa: &str) {
    t.file(&format!("{dir}/vendor"), &format!("{vendor}\n"));
    t.file(&format!("{dir}/device"), &format!("{device}\n"));
    t.file(&format!("{dir}/class"), &format!("{class}\n"));
    t.file(&format!("{dir}/numa_node"), &format!("{numa}\n"));
    let name = Path::new(dir).file_name().unwrap().to_str().unwrap();
    t.link(&format!("/sys/bus/pci/devices/{name}"), dir);
}

/// A class entry `class/name` that is a link to `parent/subdir/name`, whose
/// `device` links back to `parent`, as the kernel lays them out.
fn class_dev(t: &TempTree, class: &str, name: &str, parent: &str, subdir: &str) -> String {
    let dir = format!("{parent}/{subdir}/{name}");
    t.dir(&dir);
    t.link(&format!("{dir}/device"), parent);
    t.link(&format!("/sys/class/{class}/{name}"), &dir);
    dir
}

fn netdev(t: &TempTree, dir: &str, ty: &str, speed: &str, state: &str, addr: &str) {
    t.file(&format!("{dir}/type"), &format!("{ty}\n"));
    t.file(&format!("{dir}/speed"), &format!("{speed}\n"));
    t.file(&format!("{dir}/operstate"), &format!("{state}\n"));
    t.file(&format!("{dir}/address"), &format!("{addr}\n"));
}

fn build_fake_tree() -> TempTree {
    let t = TempTree::new("fake");
    t.file("/proc/sys/kernel/hostname", "fakenode01\n");
    t.file(
        "/proc/cpuinfo",
        "processor\t: 0\nmodel name\t: Fake EPYC 7A53\nphysical id\t: 0\n\n\
         processor\t: 1\nmodel name\t: Fake EPYC 7A53\nphysical id\t: 0\n\n\
         processor\t: 2\nmodel name\t: Fake EPYC 7A53\nphysical id\t: 1\n\n\
         processor\t: 3\nmodel name\t: Fake EPYC 7A53\nphysical id\t: 1\n\n",
    );

    // CPUs: 2 packages x 2 cores x 1 PU; cpu4 is offline.
    t.file("/sys/devices/system/cpu/online", "0-3\n");
    t.file("/sys/devices/system/cpu/possible", "0-4\n");
    t.dir("/sys/devices/system/cpu/cpufreq");
    for (cpu, package, core) in [(0, 0, 0), (1, 0, 1), (2, 1, 0), (3, 1, 1), (4, 1, 2)] {
        let topo = format!("/sys/devices/system/cpu/cpu{cpu}/topology");
        t.file(
            &format!("{topo}/physical_package_id"),
            &format!("{package}\n"),
        );
        t.file(&format!("{topo}/core_id"), &format!("{core}\n"));
    }
    t.file("/sys/devices/system/node/online", "0-1\n");
    t.file("/sys/devices/system/node/node0/cpulist", "0-1\n");
    t.file(
        "/sys/devices/system/node/node0/meminfo",
        "Node 0 MemTotal:        1048576 kB\nNode 0 MemFree:          524288 kB\n",
    );
    t.file("/sys/devices/system/node/node1/cpulist", "2-3\n");
    t.file(
        "/sys/devices/system/node/node1/meminfo",
        "Node 1 MemTotal:        2097152 kB\n",
    );

    // PCI devices.
    pci_dev(&t, GPU0, "0x1002", "0x7408", "0x038000", "0");
    pci_dev(&t, GPU1, "0x1002", "0x7408", "0x038000", "1");
    pci_dev(&t, BMC, "0x1a03", "0x2000", "0x030000", "-1");
    pci_dev(&t, CXI0, "0x17db", "0x0501", "0x020000", "0");
    pci_dev(&t, CXI1, "0x17db", "0x0501", "0x020000", "-1");
    pci_dev(&t, IB, "0x15b3", "0x101b", "0x020700", "1");

    // AMD XGMI attributes of the two GPUs (decimal, as amdgpu prints them).
    t.file(
        &format!("{GPU0}/xgmi_hive_info/xgmi_hive_id"),
        "1234567890123456789\n",
    );
    t.file(&format!("{GPU0}/xgmi_device_id"), "4242\n");
    t.file(&format!("{GPU0}/xgmi_physical_id"), "0\n");
    t.file(
        &format!("{GPU1}/xgmi_hive_info/xgmi_hive_id"),
        "1234567890123456789\n",
    );
    t.file(&format!("{GPU1}/xgmi_device_id"), "4243\n");
    t.file(&format!("{GPU1}/xgmi_physical_id"), "1\n");

    // DRM: cards and render nodes; card2 is the BMC's VGA; card0-DP-1 a connector.
    class_dev(&t, "drm", "card0", GPU0, "drm");
    class_dev(&t, "drm", "renderD128", GPU0, "drm");
    class_dev(&t, "drm", "card1", GPU1, "drm");
    class_dev(&t, "drm", "renderD129", GPU1, "drm");
    class_dev(&t, "drm", "card2", BMC, "drm");
    t.dir("/sys/class/drm/card0-DP-1");
    t.file("/sys/class/drm/version", "drm 1.1.0 20060810\n");

    // Slingshot: cxi0/hsn0 on one PCI device, cxi1 alone.
    let cxi0 = class_dev(&t, "cxi", "cxi0", CXI0, "cxi");
    let _ = cxi0;
    t.file(&format!("{CXI0}/properties/nid"), "0x1a2b\n");
    t.file(&format!("{CXI0}/properties/link"), "1\n");
    class_dev(&t, "cxi", "cxi1", CXI1, "cxi");
    t.file(&format!("{CXI1}/properties/nid"), "0x1a2c\n");
    t.file(&format!("{CXI1}/properties/link"), "0\n");
    let hsn0 = class_dev(&t, "net", "hsn0", CXI0, "net");
    netdev(&t, &hsn0, "1", "200000", "up", "02:00:00:00:1a:2b");

    // InfiniBand port with its RDMA device.
    let ib0 = class_dev(&t, "net", "ib0", IB, "net");
    netdev(&t, &ib0, "32", "100000", "up", "00:00:10:87:fe:80");
    class_dev(&t, "infiniband", "mlx5_0", IB, "infiniband");

    // Software interfaces.
    for (name, ty) in [("lo", "772"), ("bond0", "1")] {
        let dir = format!("/sys/devices/virtual/net/{name}");
        netdev(&t, &dir, ty, "-1", "down", "00:00:00:00:00:00");
        t.link(&format!("/sys/class/net/{name}"), &dir);
    }
    t.file("/sys/class/net/bonding_masters", "bond0\n");
    // bond0's speed is unreadable rather than -1.
    fs::remove_file(t.path("/sys/devices/virtual/net/bond0/speed")).unwrap();
    t
}

#[test]
fn fake_sysfs_tree_is_parsed_exactly() {
    let t = build_fake_tree();
    let m = discover_with(&DiscoverOptions {
        root: t.0.clone(),
        use_hwloc: false,
        env: no_env(),
    })
    .unwrap();

    assert_eq!(m.hostname, "fakenode01");
    assert_eq!(
        m.packages,
        vec![
            Package {
                os_index: Some(0),
                cpu_model: Some("Fake EPYC 7A53".to_owned()),
                cores: vec![
                    Core {
                        os_index: Some(0),
                        pu_os_indices: vec![0]
                    },
                    Core {
                        os_index: Some(1),
                        pu_os_indices: vec![1]
                    },
                ],
            },
            Package {
                os_index: Some(1),
                cpu_model: Some("Fake EPYC 7A53".to_owned()),
                cores: vec![
                    Core {
                        os_index: Some(0),
                        pu_os_indices: vec![2]
                    },
                    Core {
                        os_index: Some(1),
                        pu_os_indices: vec![3]
                    },
                ],
            },
        ]
    );
    assert_eq!(
        m.numa_nodes,
        vec![
            NumaNode {
                os_index: 0,
                local_memory_bytes: Some(1 << 30),
                cpuset: "0-1".to_owned(),
                package_os_index: Some(0),
            },
            NumaNode {
                os_index: 1,
                local_memory_bytes: Some(2 << 30),
                cpuset: "2-3".to_owned(),
                package_os_index: Some(1),
            },
        ]
    );

    let pci =
        |bus: &str, class_id: u16, vendor_id: u16, device_id: u16, numa: Option<u32>| PciDevice {
            bus_id: bus.to_owned(),
            class_id,
            vendor_id,
            device_id,
            name: None,
            numa_node: numa,
        };
    assert_eq!(
        m.pci_devices,
        vec![
            pci("0000:02:00.0", 0x0300, 0x1a03, 0x2000, None),
            pci("0000:c1:00.0", 0x0380, 0x1002, 0x7408, Some(0)),
            pci("0000:c5:00.0", 0x0200, 0x17db, 0x0501, Some(0)),
            pci("0000:d1:00.0", 0x0380, 0x1002, 0x7408, Some(1)),
            pci("0000:d5:00.0", 0x0200, 0x17db, 0x0501, None),
            pci("0000:e1:00.0", 0x0207, 0x15b3, 0x101b, Some(1)),
        ]
    );

    const HIVE: u64 = 1_234_567_890_123_456_789;
    assert_eq!(
        m.gpus,
        vec![
            Gpu {
                pci_bus_id: "0000:c1:00.0".to_owned(),
                vendor_id: 0x1002,
                device_id: 0x7408,
                vendor: GpuVendor::Amd,
                class_id: 0x0380,
                name: None,
                numa_node: Some(0),
                os_device_names: strings(&["card0", "renderD128"]),
                xgmi: Some(XgmiInfo {
                    hive_id: HIVE,
                    device_id: Some(4242),
                    physical_id: Some(0),
                    peer_pci_bus_ids: strings(&["0000:d1:00.0"]),
                }),
            },
            Gpu {
                pci_bus_id: "0000:d1:00.0".to_owned(),
                vendor_id: 0x1002,
                device_id: 0x7408,
                vendor: GpuVendor::Amd,
                class_id: 0x0380,
                name: None,
                numa_node: Some(1),
                os_device_names: strings(&["card1", "renderD129"]),
                xgmi: Some(XgmiInfo {
                    hive_id: HIVE,
                    device_id: Some(4243),
                    physical_id: Some(1),
                    peer_pci_bus_ids: strings(&["0000:c1:00.0"]),
                }),
            },
        ]
    );

    assert_eq!(
        m.nics,
        vec![
            NetworkDevice {
                name: "bond0".to_owned(),
                kind: NicKind::Ethernet,
                link_layer_type: Some(1),
                pci_bus_id: None,
                numa_node: None,
                link_speed_bytes_per_sec: None,
                address: Some("00:00:00:00:00:00".to_owned()),
                operstate: Some("down".to_owned()),
                is_virtual: true,
                rdma_devices: vec![],
            },
            NetworkDevice {
                name: "hsn0".to_owned(),
                kind: NicKind::Slingshot,
                link_layer_type: Some(1),
                pci_bus_id: Some("0000:c5:00.0".to_owned()),
                numa_node: Some(0),
                link_speed_bytes_per_sec: Some(25_000_000_000),
                address: Some("02:00:00:00:1a:2b".to_owned()),
                operstate: Some("up".to_owned()),
                is_virtual: false,
                rdma_devices: vec![],
            },
            NetworkDevice {
                name: "ib0".to_owned(),
                kind: NicKind::InfiniBand,
                link_layer_type: Some(32),
                pci_bus_id: Some("0000:e1:00.0".to_owned()),
                numa_node: Some(1),
                link_speed_bytes_per_sec: Some(12_500_000_000),
                address: Some("00:00:10:87:fe:80".to_owned()),
                operstate: Some("up".to_owned()),
                is_virtual: false,
                rdma_devices: strings(&["mlx5_0"]),
            },
        ]
    );

    assert_eq!(
        m.cxi_devices,
        vec![
            CxiDevice {
                name: "cxi0".to_owned(),
                pci_bus_id: Some("0000:c5:00.0".to_owned()),
                numa_node: Some(0),
                nid: Some(0x1a2b),
                link_up: Some(true),
                net_interfaces: strings(&["hsn0"]),
            },
            CxiDevice {
                name: "cxi1".to_owned(),
                pci_bus_id: Some("0000:d5:00.0".to_owned()),
                numa_node: None,
                nid: Some(0x1a2c),
                link_up: Some(false),
                net_interfaces: vec![],
            },
        ]
    );
    assert_eq!(m.slurm, None);

    let root = t.0.display().to_string();
    let expected_sources = vec![
        "hwloc: not used (use_hwloc = false)".to_owned(),
        format!("sysfs {root}/sys/devices/system/cpu: 2 packages"),
        format!("sysfs {root}/sys/devices/system/node: 2 NUMA nodes"),
        format!("sysfs {root}/sys/bus/pci/devices: 6 devices"),
        format!("sysfs {root}/sys/class/net: 3 interfaces besides lo"),
        format!("sysfs {root}/sys/class/infiniband: 1 devices"),
        format!("sysfs {root}/sys/class/drm: 5 cards/render nodes on PCI"),
        format!("sysfs {root}/sys/class/cxi: 2 devices"),
        "env: no SLURM_JOB_ID or SLURM_PROCID (not under Slurm)".to_owned(),
        format!("procfs {root}/proc/sys/kernel/hostname"),
    ];
    #[cfg(feature = "hwloc")]
    assert_eq!(m.sources, expected_sources);
    #[cfg(not(feature = "hwloc"))]
    assert_eq!(m.sources[1..], expected_sources[1..]);

    let tree = m.render_tree();
    println!("{tree}");
    for expected in [
        "Machine fakenode01\n",
        "\n  Package 0: 2 cores, 2 PUs, Fake EPYC 7A53\n    NUMA 0: 1.0 GiB, CPUs 0-1\n",
        "\n  Package 1: 2 cores, 2 PUs, Fake EPYC 7A53\n    NUMA 1: 2.0 GiB, CPUs 2-3\n",
        "\n  PCI 0000:02:00.0 [0300] 1a03:2000\n",
        "\n  GPUs: 2\n    GPU 0000:c1:00.0 AMD 1002:7408, NUMA 0, card0 renderD128, \
         XGMI hive 0x112210f47de98115 physical id 0 peers 0000:d1:00.0\n",
        "hsn0 (Slingshot, 200 Gb/s, up, PCI 0000:c5:00.0, NUMA 0)",
        "ib0 (InfiniBand, 100 Gb/s, up, PCI 0000:e1:00.0, NUMA 1, mlx5_0)",
        "bond0 (Ethernet, down, virtual)",
        "\n  Slingshot cxi: 2\n    cxi0 PCI 0000:c5:00.0, NUMA 0, nid 0x1a2b, link up, hsn0\n    \
         cxi1 PCI 0000:d5:00.0, NUMA ?, nid 0x1a2c, link down\n",
        "\n  Slurm: not running under Slurm\n",
    ] {
        assert!(tree.contains(expected), "missing {expected:?} in\n{tree}");
    }
}

#[test]
fn empty_root_reports_everything_absent() {
    let t = TempTree::new("empty");
    t.file("/proc/sys/kernel/hostname", "bare\n");
    let m = discover_with(&DiscoverOptions {
        root: t.0.clone(),
        use_hwloc: false,
        env: no_env(),
    })
    .unwrap();
    assert_eq!(m.hostname, "bare");
    assert!(m.packages.is_empty() && m.numa_nodes.is_empty() && m.pci_devices.is_empty());
    assert!(m.gpus.is_empty() && m.nics.is_empty() && m.cxi_devices.is_empty());
    let root = t.0.display().to_string();
    for absent in [
        "/sys/devices/system/cpu",
        "/sys/devices/system/node",
        "/sys/bus/pci/devices",
        "/sys/class/net",
        "/sys/class/drm",
        "/sys/class/cxi",
    ] {
        let note = format!("sysfs {root}{absent}: absent");
        assert!(m.sources.contains(&note), "{note} not in {:?}", m.sources);
    }
    let tree = m.render_tree();
    assert!(tree.contains("Packages: none found"), "{tree}");
    assert!(tree.contains("NICs: none found"), "{tree}");

    // Without any host name source discovery fails rather than inventing one.
    fs::remove_file(t.path("/proc/sys/kernel/hostname")).unwrap();
    let err = discover_with(&DiscoverOptions {
        root: t.0.clone(),
        use_hwloc: false,
        env: no_env(),
    })
    .unwrap_err();
    assert!(matches!(err, DiscoverError::Hostname(_)), "{err}");
}

// ---------------------------------------------------------------------------
// (3) Slurm environment

fn slurm_env() -> BTreeMap<String, String> {
    env(&[
        ("SLURM_JOB_ID", "4242"),
        ("SLURM_PROCID", "5"),
        ("SLURM_NTASKS", "16"),
        ("SLURM_LOCALID", "1"),
        ("SLURM_NODEID", "2"),
        ("SLURM_JOB_NUM_NODES", "4"),
        ("SLURMD_NODENAME", "frontier00003"),
        ("SLURM_JOB_NODELIST", "frontier[00001-00004]"),
        ("SLURM_TOPOLOGY_ADDR", "s0.s1.frontier00003"),
        ("SLURM_TOPOLOGY_ADDR_PATTERN", "switch.switch.node"),
        ("PATH", "/usr/bin"),
    ])
}

#[test]
fn slurm_environment_is_parsed_exactly() {
    let placement = SlurmPlacement::from_env(&slurm_env()).unwrap().unwrap();
    let level = |kind: &str, name: &str| SlurmTopologyLevel {
        kind: Some(kind.to_owned()),
        name: name.to_owned(),
    };
    assert_eq!(
        placement,
        SlurmPlacement {
            job_id: Some("4242".to_owned()),
            job_nodelist: Some("frontier[00001-00004]".to_owned()),
            nodes: strings(&[
                "frontier00001",
                "frontier00002",
                "frontier00003",
                "frontier00004"
            ]),
            job_num_nodes: Some(4),
            node_name: Some("frontier00003".to_owned()),
            topology_addr: Some("s0.s1.frontier00003".to_owned()),
            topology_addr_pattern: Some("switch.switch.node".to_owned()),
            topology_path: vec![
                level("switch", "s0"),
                level("switch", "s1"),
                level("node", "frontier00003"),
            ],
            proc_id: Some(5),
            ntasks: Some(16),
            local_id: Some(1),
            node_id: Some(2),
        }
    );
}

#[test]
fn slurm_absent_partial_and_malformed() {
    assert_eq!(
        SlurmPlacement::from_env(&env(&[("PATH", "/bin")])).unwrap(),
        None
    );

    // salloc shell: a job but no rank yet; no pattern: levels without kind.
    let p = SlurmPlacement::from_env(&env(&[
        ("SLURM_JOB_ID", "7"),
        ("SLURM_NODELIST", "n[1-2],login3"),
        ("SLURM_TOPOLOGY_ADDR", "sw0.n1"),
    ]))
    .unwrap()
    .unwrap();
    assert_eq!(p.proc_id, None);
    assert_eq!(p.nodes, strings(&["n1", "n2", "login3"]));
    assert_eq!(
        p.topology_path,
        vec![
            SlurmTopologyLevel {
                kind: None,
                name: "sw0".to_owned()
            },
            SlurmTopologyLevel {
                kind: None,
                name: "n1".to_owned()
            },
        ]
    );

    let mut bad = slurm_env();
    bad.insert(
        "SLURM_JOB_NODELIST".to_owned(),
        "frontier[00001-00004".to_owned(),
    );
    let err = SlurmPlacement::from_env(&bad).unwrap_err();
    assert!(
        matches!(err, DiscoverError::NodeList { ref list, .. } if list == "frontier[00001-00004")
    );
    assert!(err.to_string().contains("frontier[00001-00004"), "{err}");

    let mut bad = slurm_env();
    bad.insert("SLURM_PROCID".to_owned(), "five".to_owned());
    let err = SlurmPlacement::from_env(&bad).unwrap_err();
    assert!(
        matches!(err, DiscoverError::SlurmVariable { ref name, ref value, .. }
            if name == "SLURM_PROCID" && value == "five"),
        "{err}"
    );

    let mut bad = slurm_env();
    bad.insert(
        "SLURM_TOPOLOGY_ADDR_PATTERN".to_owned(),
        "switch.node".to_owned(),
    );
    let err = SlurmPlacement::from_env(&bad).unwrap_err();
    assert!(err.to_string().contains("switch.node"), "{err}");

    // Discovery itself fails on a malformed list instead of guessing.
    let mut bad = slurm_env();
    bad.insert("SLURM_JOB_NODELIST".to_owned(), "n[3-1]".to_owned());
    let t = TempTree::new("badslurm");
    t.file("/proc/sys/kernel/hostname", "x\n");
    let err = discover_with(&DiscoverOptions {
        root: t.0.clone(),
        use_hwloc: false,
        env: EnvSource::Snapshot(bad),
    })
    .unwrap_err();
    assert!(err.to_string().contains("n[3-1]"), "{err}");
}

#[test]
fn slurm_placement_reaches_the_machine_and_the_tree() {
    let t = TempTree::new("slurm");
    t.file("/proc/sys/kernel/hostname", "frontier00003\n");
    let m = discover_with(&DiscoverOptions {
        root: t.0.clone(),
        use_hwloc: false,
        env: EnvSource::Snapshot(slurm_env()),
    })
    .unwrap();
    let s = m.slurm.as_ref().unwrap();
    assert_eq!(s.proc_id, Some(5));
    assert_eq!(s.nodes.len(), 4);
    assert!(m.sources.contains(&"env: Slurm job 4242".to_owned()));
    let tree = m.render_tree();
    assert!(
        tree.contains(
            "\n  Slurm: job 4242, rank 5 of 16, local rank 1, node 2 of 4 \
             (frontier[00001-00004]), topology s0.s1.frontier00003 (switch.switch.node)\n"
        ),
        "{tree}"
    );
}

#[test]
fn nodelist_expander() {
    assert_eq!(
        expand_nodelist("frontier[00001-00004]").unwrap(),
        strings(&[
            "frontier00001",
            "frontier00002",
            "frontier00003",
            "frontier00004"
        ])
    );
    assert_eq!(
        expand_nodelist("a[1,3],b07,c[9-10]").unwrap(),
        strings(&["a1", "a3", "b07", "c9", "c10"])
    );
    for bad in ["", "a[1-2", "a]", "a[x]", "a[2-1]", "a,,b", "a[]"] {
        let err = expand_nodelist(bad).unwrap_err();
        assert!(
            matches!(err, DiscoverError::NodeList { ref list, .. } if list == bad),
            "{bad}: {err}"
        );
    }
}
