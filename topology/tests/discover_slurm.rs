//! Slurm placement from the environment: parsing, absent, partial and malformed
//! variables, the placement in the machine and its tree, and the node list expander.

mod discover_support;

use halo_topology::discover::{
    DiscoverError, DiscoverOptions, EnvSource, SlurmPlacement, SlurmTopologyLevel, discover_with,
    expand_nodelist,
};

use discover_support::{TempTree, env, slurm_env, strings};

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
