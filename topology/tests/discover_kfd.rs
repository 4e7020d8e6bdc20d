//! GPU-to-GPU links from AMD's KFD topology, on sysfs trees of real machines built from
//! their public descriptions, and the errors of malformed, truncated, missing and
//! contradictory files.
//!
//! - **Frontier node** (HPE Cray EX235a, 4 MI250X = 8 GCDs, 4 Slingshot NICs). The link
//!   pattern is the OLCF Frontier User Guide's node diagram
//!   (docs.olcf.ornl.gov/systems/frontier_user_guide.html, "Node Diagram"): the two GCDs
//!   of a package share 4 xGMI links, across packages GCD pairs 0-6 and 2-4 have 2,
//!   0-2, 1-3, 1-5, 3-7, 4-6 and 5-7 one, the other 12 pairs none. The KFD values are
//!   what the amdgpu driver writes on MI200 (50,000 MB/s per link as the minimum, all
//!   links as the maximum, 0/0 for a pair without a direct link, weight 15 per hop);
//!   `rocm-smi --shownodesbw` of an 8-GCD MI250 machine (huggingface/optimum-amd,
//!   docs/source/amdgpu/perf_hardware.mdx) prints the same table. KFD nodes 0-3 are the
//!   CPU's NUMA domains, 4-11 the GCDs; GCD `g` hangs off NUMA node 3, 3, 1, 1, 0, 0, 2,
//!   2 (the guide's NUMA note); the GPU link of GCD to CPU is xGMI too (type 11), and
//!   must not count as a GPU link. NICs: cxi0-3 at 200 Gbit/s, each on the NUMA node of
//!   the odd GCD of its package.
//! - **MI300X node** (8 GPUs, each with one xGMI link to each of the 7 others, 64 GB/s
//!   per direction: AMD's MI300X platform brief).
//! - **A node without GPUs**: KFD lists CPU nodes only (or nothing).

mod discover_support;

use halo_topology::discover::{
    DiscoverError, DiscoverOptions, GpuLink, GpuLinkKind, LocalMachine, NicKind, discover_with,
};

use discover_support::{TempTree, no_env};

const NODES: &str = "/sys/devices/virtual/kfd/kfd/topology/nodes";

/// Frontier's GCD buses as `rocm-smi --showbus` lists them on a compute node.
const FRONTIER_BUS: [u64; 8] = [0xc1, 0xc6, 0xc9, 0xce, 0xd1, 0xd6, 0xd9, 0xde];
/// The NUMA node of each GCD.
const FRONTIER_NUMA: [u64; 8] = [3, 3, 1, 1, 0, 0, 2, 2];
/// xGMI links between GCD pairs (the node diagram), written out here apart from the
/// preset's `frontier::GCD_LINKS` on purpose: the fixture is its own reading of the
/// sources, and the test checks that the two agree.
const FRONTIER_LINKS: [[u32; 8]; 8] = [
    [0, 4, 1, 0, 0, 0, 2, 0],
    [4, 0, 0, 1, 0, 1, 0, 0],
    [1, 0, 0, 4, 2, 0, 0, 0],
    [0, 1, 4, 0, 0, 0, 0, 1],
    [0, 0, 2, 0, 0, 4, 1, 0],
    [0, 1, 0, 0, 4, 0, 0, 1],
    [2, 0, 0, 0, 1, 0, 0, 4],
    [0, 0, 0, 1, 0, 1, 4, 0],
];

fn cpu_node(t: &TempTree, node: usize, cores: u64) {
    t.file(
        &format!("{NODES}/{node}/properties"),
        &format!(
            "cpu_cores_count {cores}\nsimd_count 0\nmem_banks_count 1\ncaches_count 0\n\
             io_links_count 0\nvendor_id 0\ndevice_id 0\nlocation_id 0\ndomain 0\n\
             drm_render_minor 0\nhive_id 0\n"
        ),
    );
    t.file(&format!("{NODES}/{node}/gpu_id"), "0\n");
}

fn gpu_node(t: &TempTree, node: usize, bus: u64, device_id: u64, links: usize, minor: u64) {
    t.file(
        &format!("{NODES}/{node}/properties"),
        &format!(
            "cpu_cores_count 0\nsimd_count 440\nmem_banks_count 1\ncaches_count 0\n\
             io_links_count {links}\nvendor_id 4098\ndevice_id {device_id}\n\
             location_id {}\ndomain 0\ndrm_render_minor {minor}\nhive_id 1234\n",
            bus << 8
        ),
    );
    t.file(
        &format!("{NODES}/{node}/gpu_id"),
        &format!("{}\n", 1000 + node),
    );
}

#[allow(clippy::too_many_arguments)]
fn io_link(
    t: &TempTree,
    sub: &str,
    node: usize,
    index: usize,
    to: usize,
    ty: u64,
    weight: u64,
    min: u64,
    max: u64,
) {
    t.file(
        &format!("{NODES}/{node}/{sub}/{index}/properties"),
        &format!(
            "type {ty}\nversion_major 0\nversion_minor 0\nnode_from {node}\nnode_to {to}\n\
             weight {weight}\nmin_latency 0\nmax_latency 0\nmin_bandwidth {min}\n\
             max_bandwidth {max}\nrecommended_transfer_size 0\nflags 1\n"
        ),
    );
}

/// A GPU's PCI device and DRM card, so that discovery lists it.
fn gpu_pci(t: &TempTree, bus: u64, device_id: &str, numa: u64, card: usize) {
    let dir = format!("/sys/devices/pci0000:{bus:02x}/0000:{bus:02x}:00.0");
    t.file(&format!("{dir}/vendor"), "0x1002\n");
    t.file(&format!("{dir}/device"), &format!("{device_id}\n"));
    t.file(&format!("{dir}/class"), "0x038000\n");
    t.file(&format!("{dir}/numa_node"), &format!("{numa}\n"));
    t.link(&format!("/sys/bus/pci/devices/0000:{bus:02x}:00.0"), &dir);
    let card_dir = format!("{dir}/drm/card{card}");
    t.dir(&card_dir);
    t.link(&format!("{card_dir}/device"), &dir);
    t.link(&format!("/sys/class/drm/card{card}"), &card_dir);
}

fn frontier() -> TempTree {
    let t = TempTree::new("kfd-frontier");
    t.file("/proc/sys/kernel/hostname", "frontier00001\n");
    for numa in 0..4 {
        cpu_node(&t, numa, 16);
    }
    for g in 0..8 {
        let node = 4 + g;
        gpu_node(&t, node, FRONTIER_BUS[g], 0x7408, 8, 128 + g as u64);
        gpu_pci(&t, FRONTIER_BUS[g], "0x7408", FRONTIER_NUMA[g], g + 1);
        // The link to the CPU: xGMI on Frontier (36+36 GB/s).
        io_link(
            &t,
            "io_links",
            node,
            0,
            FRONTIER_NUMA[g] as usize,
            11,
            15,
            36000,
            36000,
        );
        let mut index = 1;
        for (h, &n) in FRONTIER_LINKS[g].iter().enumerate() {
            if h == g {
                continue;
            }
            let (weight, min, max) = if n == 0 {
                (30, 0, 0)
            } else {
                (15, 50_000, 50_000 * u64::from(n))
            };
            io_link(&t, "io_links", node, index, 4 + h, 11, weight, min, max);
            index += 1;
        }
    }
    // Slingshot: cxi0-3 (hsn0-3), each on the NUMA node of its package's odd GCD.
    for (i, (bus, numa)) in [(0xc5u64, 3u64), (0xcd, 1), (0xd5, 0), (0xdd, 2)]
        .into_iter()
        .enumerate()
    {
        let dir = format!("/sys/devices/pci0000:{bus:02x}/0000:{bus:02x}:00.0");
        t.file(&format!("{dir}/vendor"), "0x17db\n");
        t.file(&format!("{dir}/device"), "0x0501\n");
        t.file(&format!("{dir}/class"), "0x020000\n");
        t.file(&format!("{dir}/numa_node"), &format!("{numa}\n"));
        let cxi = format!("{dir}/cxi/cxi{i}");
        t.dir(&cxi);
        t.link(&format!("{cxi}/device"), &dir);
        t.link(&format!("/sys/class/cxi/cxi{i}"), &cxi);
        t.file(&format!("{dir}/properties/link"), "1\n");
        t.file(&format!("{dir}/properties/speed"), "200000\n");
        // Its Ethernet personality, hsnN, on the same PCI device.
        let hsn = format!("{dir}/net/hsn{i}");
        t.link(&format!("{hsn}/device"), &dir);
        t.link(&format!("/sys/class/net/hsn{i}"), &hsn);
        t.file(&format!("{hsn}/type"), "1\n");
        t.file(&format!("{hsn}/speed"), "200000\n");
        t.file(&format!("{hsn}/operstate"), "up\n");
        t.file(&format!("{hsn}/address"), &format!("02:00:00:00:00:0{i}\n"));
    }
    t
}

/// Discovery noted, in its sources, a line ending with `suffix`.
#[track_caller]
fn assert_noted(m: &LocalMachine, suffix: &str) {
    assert!(
        m.sources.iter().any(|s| s.ends_with(suffix)),
        "no source ends with {suffix:?}: {:?}",
        m.sources
    );
}

fn discover(t: &TempTree) -> Result<LocalMachine, DiscoverError> {
    discover_with(&DiscoverOptions {
        root: t.0.clone(),
        use_hwloc: false,
        env: no_env(),
    })
}

/// The link matrix of `m` over its GPUs in bus id order.
fn matrix(m: &LocalMachine) -> Vec<Vec<u32>> {
    let ids: Vec<&str> = m.gpus.iter().map(|g| g.pci_bus_id.as_str()).collect();
    ids.iter()
        .map(|a| {
            ids.iter()
                .map(|b| {
                    m.gpu_links
                        .iter()
                        .find(|l| l.from == *a && l.to == *b)
                        .map_or(0, |l| l.links)
                })
                .collect()
        })
        .collect()
}

#[test]
fn frontier_node_gives_the_mi250x_link_matrix_and_nic_speeds() {
    let t = frontier();
    let m = discover(&t).unwrap();
    assert_eq!(m.gpus.len(), 8);
    let want: Vec<Vec<u32>> = FRONTIER_LINKS.iter().map(|r| r.to_vec()).collect();
    assert_eq!(matrix(&m), want);
    // The frontier preset's node model is what discovery reads on the node.
    let preset = halo_topology::Topology::preset("frontier:1").unwrap();
    assert_eq!(preset.node_links().unwrap().matrix(), want.as_slice());
    assert_eq!(FRONTIER_LINKS, halo_topology::frontier::GCD_LINKS);
    // 16 ordered pairs: 4 quad, 2 dual and 6 single pairs, both directions.
    assert_eq!(m.gpu_links.len(), 24);
    let quad = m
        .gpu_links
        .iter()
        .find(|l| l.from == "0000:c1:00.0" && l.to == "0000:c6:00.0")
        .unwrap();
    assert_eq!(
        quad,
        &GpuLink {
            from: "0000:c1:00.0".into(),
            to: "0000:c6:00.0".into(),
            kind: GpuLinkKind::Xgmi,
            links: 4,
            bandwidth_bytes_per_sec: 200_000_000_000,
            weight: 15,
        }
    );
    let numa: Vec<Option<u32>> = m.gpus.iter().map(|g| g.numa_node).collect();
    assert_eq!(
        numa,
        FRONTIER_NUMA
            .iter()
            .map(|&n| Some(n as u32))
            .collect::<Vec<_>>()
    );
    let nics: Vec<(String, Option<u32>, Option<u64>)> = m
        .cxi_devices
        .iter()
        .map(|c| (c.name.clone(), c.numa_node, c.link_speed_bytes_per_sec))
        .collect();
    assert_eq!(
        nics,
        [("cxi0", 3), ("cxi1", 1), ("cxi2", 0), ("cxi3", 2)]
            .map(|(n, numa)| (n.to_string(), Some(numa), Some(25_000_000_000)))
            .to_vec()
    );
    // Each cxi NIC's hsn interface: same PCI device, NUMA node and speed, link up.
    let cxi_nets: Vec<Vec<String>> = m
        .cxi_devices
        .iter()
        .map(|c| c.net_interfaces.clone())
        .collect();
    assert_eq!(
        cxi_nets,
        (0..4).map(|i| vec![format!("hsn{i}")]).collect::<Vec<_>>()
    );
    type Nic = (String, NicKind, Option<u32>, Option<u64>, Option<String>);
    let hsn: Vec<Nic> = m
        .nics
        .iter()
        .map(|n| {
            (
                n.name.clone(),
                n.kind,
                n.numa_node,
                n.link_speed_bytes_per_sec,
                n.operstate.clone(),
            )
        })
        .collect();
    assert_eq!(
        hsn,
        [3, 1, 0, 2]
            .iter()
            .enumerate()
            .map(|(i, &numa)| (
                format!("hsn{i}"),
                NicKind::Slingshot,
                Some(numa),
                Some(25_000_000_000),
                Some("up".to_string())
            ))
            .collect::<Vec<_>>()
    );
    let tree = m.render_tree();
    assert!(tree.contains("GPU links (links between"), "{tree}");
    assert!(
        tree.contains(" 0 0000:c1:00.0   -  4  1  .  .  .  2  ."),
        "{tree}"
    );
    assert!(
        tree.contains("cxi0 PCI 0000:c5:00.0, NUMA 3, link up, 200 Gbit/s"),
        "{tree}"
    );
}

#[test]
fn mi300x_node_is_fully_connected_with_one_link_a_pair() {
    let t = TempTree::new("kfd-mi300x");
    t.file("/proc/sys/kernel/hostname", "mi300x\n");
    cpu_node(&t, 0, 48);
    cpu_node(&t, 1, 48);
    let bus = [0x05u64, 0x25, 0x45, 0x65, 0x85, 0xa5, 0xc5, 0xe5];
    for (g, &b) in bus.iter().enumerate() {
        let node = 2 + g;
        gpu_node(&t, node, b, 0x74a1, 8, 128 + g as u64);
        gpu_pci(&t, b, "0x74a1", (g / 4) as u64, g);
        io_link(&t, "io_links", node, 0, g / 4, 2, 20, 0, 0);
        for (index, h) in (1..).zip((0..8).filter(|&h| h != g)) {
            io_link(&t, "io_links", node, index, 2 + h, 11, 15, 64_000, 64_000);
        }
    }
    let m = discover(&t).unwrap();
    let want: Vec<Vec<u32>> = (0..8)
        .map(|a| (0..8).map(|b| u32::from(a != b)).collect())
        .collect();
    assert_eq!(matrix(&m), want);
    assert!(
        m.gpu_links
            .iter()
            .all(|l| l.bandwidth_bytes_per_sec == 64_000_000_000 && l.kind == GpuLinkKind::Xgmi)
    );
}

#[test]
fn a_node_without_gpus_has_no_gpu_links() {
    let t = TempTree::new("kfd-cpu");
    t.file("/proc/sys/kernel/hostname", "cpuonly\n");
    cpu_node(&t, 0, 64);
    cpu_node(&t, 1, 64);
    io_link(&t, "io_links", 0, 0, 1, 2, 21, 0, 0);
    io_link(&t, "io_links", 1, 0, 0, 2, 21, 0, 0);
    let m = discover(&t).unwrap();
    assert!(m.gpus.is_empty() && m.gpu_links.is_empty());
    assert_noted(&m, "nodes: 0 direct GPU-to-GPU links (KFD)");
    assert!(!m.render_tree().contains("GPU links (links between"));
}

/// One MI250X: two GCDs (KFD nodes 1 and 2) with 4 links between them.
fn two_gcds() -> TempTree {
    let t = TempTree::new("kfd-two");
    t.file("/proc/sys/kernel/hostname", "two\n");
    cpu_node(&t, 0, 8);
    for (g, &bus) in FRONTIER_BUS.iter().take(2).enumerate() {
        gpu_node(&t, 1 + g, bus, 0x7408, 2, 128 + g as u64);
        io_link(&t, "io_links", 1 + g, 0, 0, 11, 15, 36000, 36000);
        io_link(&t, "io_links", 1 + g, 1, 2 - g, 11, 15, 50_000, 200_000);
    }
    t
}

/// [`two_gcds`] whose files `spoil` then changes: discovery's error.
fn two_gcds_with(spoil: impl FnOnce(&TempTree)) -> String {
    let t = two_gcds();
    assert_eq!(discover(&t).unwrap().gpu_links.len(), 2);
    spoil(&t);
    discover(&t).unwrap_err().to_string()
}

#[test]
fn truncated_missing_malformed_and_contradictory_files_are_errors_naming_them() {
    // Truncated: the link lost its last lines.
    let e = two_gcds_with(|t| {
        t.file(
            &format!("{NODES}/1/io_links/1/properties"),
            "type 11\nversion_major 0\nversion_minor 0\nnode_from 1\nnode_to 2\nweight 15\n",
        );
    });
    assert!(
        e.contains("nodes/1/io_links/1/properties has no `min_bandwidth` (truncated?)"),
        "{e}"
    );
    // Missing: a node directory without its properties.
    let e = two_gcds_with(|t| {
        std::fs::remove_file(t.path(&format!("{NODES}/2/properties"))).unwrap();
    });
    assert!(e.contains("nodes/2/properties cannot be read"), "{e}");
    // Malformed: not `key value`.
    let e = two_gcds_with(|t| {
        t.file(
            &format!("{NODES}/1/properties"),
            "simd_count 440\ndomain zero\n",
        );
    });
    assert!(
        e.contains(
            "nodes/1/properties line 2 is not `key value` with a decimal value: `domain zero`"
        ),
        "{e}"
    );
    // Contradictory: the two directions disagree on the link count.
    let e = two_gcds_with(|t| {
        io_link(t, "io_links", 2, 1, 1, 11, 15, 50_000, 100_000);
    });
    assert!(
        e.contains("says 0000:c1:00.0 -> 0000:c6:00.0 is 4 x Xgmi, but")
            && e.contains("nodes/2/io_links/1/properties says 2 x Xgmi"),
        "{e}"
    );
    // Contradictory: a link one way only.
    let e = two_gcds_with(|t| {
        io_link(t, "io_links", 2, 1, 1, 11, 30, 0, 0);
    });
    assert!(
        e.contains("links 0000:c1:00.0 to 0000:c6:00.0, but 0000:c6:00.0 has no link back"),
        "{e}"
    );
    // A link filed under another node, and one to a node that does not exist.
    let e = two_gcds_with(|t| {
        io_link(t, "io_links", 1, 2, 2, 11, 15, 50_000, 50_000);
        let p = t.path(&format!("{NODES}/1/io_links/2/properties"));
        let text = std::fs::read_to_string(&p).unwrap();
        std::fs::write(&p, text.replace("node_from 1", "node_from 2")).unwrap();
    });
    assert!(
        e.contains("says node_from 2, but it is a link of node 1"),
        "{e}"
    );
    let e = two_gcds_with(|t| {
        io_link(t, "io_links", 1, 2, 9, 11, 15, 50_000, 50_000);
    });
    assert!(e.contains("links to node 9, which does not exist"), "{e}");
}

#[test]
fn p2p_links_add_to_io_links_without_doubling() {
    let t = two_gcds();
    // The same direct link listed again under p2p_links: still one link each way.
    io_link(&t, "p2p_links", 1, 0, 2, 11, 15, 50_000, 200_000);
    io_link(&t, "p2p_links", 2, 0, 1, 11, 15, 50_000, 200_000);
    let m = discover(&t).unwrap();
    assert_eq!(m.gpu_links.len(), 2);
    assert!(m.gpu_links.iter().all(|l| l.links == 4));
    // A malformed p2p file is an error like any other.
    t.file(&format!("{NODES}/2/p2p_links/1/properties"), "type\n");
    let e = discover(&t).unwrap_err().to_string();
    assert!(e.contains("nodes/2/p2p_links/1/properties line 1"), "{e}");
}

#[test]
fn cxi_devices_are_found_under_cxi_user_where_the_cxi_class_is_missing() {
    let t = frontier();
    std::fs::rename(t.0.join("sys/class/cxi"), t.0.join("sys/class/cxi_user")).unwrap();
    let m = discover(&t).unwrap();
    let found: Vec<(String, Option<u64>, Vec<String>)> = m
        .cxi_devices
        .iter()
        .map(|c| {
            (
                c.name.clone(),
                c.link_speed_bytes_per_sec,
                c.net_interfaces.clone(),
            )
        })
        .collect();
    assert_eq!(
        found,
        (0..4)
            .map(|i| (
                format!("cxi{i}"),
                Some(25_000_000_000),
                vec![format!("hsn{i}")]
            ))
            .collect::<Vec<_>>()
    );
    assert_noted(&m, "/sys/class/cxi_user: 4 devices");
}
