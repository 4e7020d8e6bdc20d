//! Discovery of the real machine (a 2-core, 1-package, 1-NUMA-node VM without GPU
//! or cxi): hwloc and sysfs agree with the system, the rendered tree, JSON.

mod discover_support;

use std::{collections::BTreeSet, fs, path::Path};

use halo_topology::discover::{DiscoverOptions, EnvSource, LocalMachine, discover, discover_with};

use discover_support::{no_env, slurm_env};

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
