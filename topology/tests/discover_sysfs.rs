//! Discovery from a fake sysfs tree: two AMD GPUs in one XGMI hive, a BMC VGA, two
//! cxi devices, hsn0, an InfiniBand port, a bond and lo; two packages, two NUMA
//! nodes. And an empty root, where everything is reported absent.

mod discover_support;

use std::{fs, path::Path};

use halo_topology::discover::{
    Core, CxiDevice, DiscoverError, DiscoverOptions, Gpu, GpuVendor, NetworkDevice, NicKind,
    NumaNode, Package, PciDevice, XgmiInfo, discover_with,
};

use discover_support::{TempTree, no_env, strings};

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
    t.file(&format!("{CXI0}/properties/speed"), "200000\n");
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
                link_speed_bytes_per_sec: Some(25_000_000_000),
                net_interfaces: strings(&["hsn0"]),
            },
            CxiDevice {
                name: "cxi1".to_owned(),
                pci_bus_id: Some("0000:d5:00.0".to_owned()),
                numa_node: None,
                nid: Some(0x1a2c),
                link_up: Some(false),
                link_speed_bytes_per_sec: None,
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
        format!("sysfs {root}/sys/devices/virtual/kfd/kfd/topology/nodes: absent"),
        "nvml: not tried (no NVIDIA GPU)".to_owned(),
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
        "\n  Slingshot cxi: 2\n    cxi0 PCI 0000:c5:00.0, NUMA 0, nid 0x1a2b, link up, 200 Gbit/s, hsn0\n    \
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
        "/sys/devices/virtual/kfd/kfd/topology/nodes",
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
