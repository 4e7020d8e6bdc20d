//! Property tests of the topology model over random trees.

use halo_topology::spec::RankSpec;
use halo_topology::{Level, LinkClass, TopologySpec};
use proptest::prelude::*;
use std::collections::BTreeMap;

/// A generated machine: groups of switches of nodes of packages, each package a number
/// of ranks; which inner levels are present; and how ranks and file entries are shuffled.
#[derive(Debug, Clone)]
struct Machine {
    tree: Vec<Vec<Vec<Vec<usize>>>>,
    present: [bool; 4], // package, node, switch, group
    hosts: bool,
    nic_per_node: bool,
    /// rank number of the i-th generated device
    numbering: Vec<usize>,
    /// file order of the entries
    order: Vec<usize>,
    /// labels are `scale * id + offset` (scale 0 means reversed: `1000 - id`)
    scale: i64,
    offset: i64,
}

/// Path (group, switch, node, package) of every generated device, in generation order.
fn paths(tree: &[Vec<Vec<Vec<usize>>>]) -> Vec<[usize; 4]> {
    let mut out = Vec::new();
    let (mut s_id, mut n_id, mut p_id) = (0, 0, 0);
    for (g, switches) in tree.iter().enumerate() {
        for nodes in switches {
            for packages in nodes {
                for &count in packages {
                    for _ in 0..count {
                        out.push([g, s_id, n_id, p_id]);
                    }
                    p_id += 1;
                }
                n_id += 1;
            }
            s_id += 1;
        }
    }
    out
}

fn machine() -> impl Strategy<Value = Machine> {
    let tree = prop::collection::vec(
        prop::collection::vec(
            prop::collection::vec(prop::collection::vec(1usize..4, 1..4), 1..4),
            1..3,
        ),
        1..3,
    );
    (
        tree,
        any::<[bool; 4]>(),
        any::<bool>(),
        any::<bool>(),
        0i64..4,
        0i64..50,
    )
        .prop_flat_map(|(tree, present, hosts, nic_per_node, scale, offset)| {
            let n = paths(&tree).len();
            let ids: Vec<usize> = (0..n).collect();
            (Just(ids.clone()).prop_shuffle(), Just(ids).prop_shuffle()).prop_map(
                move |(numbering, order)| Machine {
                    tree: tree.clone(),
                    present,
                    hosts,
                    nic_per_node,
                    numbering,
                    order,
                    scale,
                    offset,
                },
            )
        })
}

const INNER: [Level; 4] = [Level::Package, Level::Node, Level::Switch, Level::Group];

impl Machine {
    /// Path per rank (indexed by rank, not by generation order).
    fn rank_paths(&self) -> Vec<[usize; 4]> {
        let gen_paths = paths(&self.tree);
        let mut out = vec![[0; 4]; gen_paths.len()];
        for (i, p) in gen_paths.iter().enumerate() {
            out[self.numbering[i]] = *p;
        }
        out
    }

    fn label(&self, id: usize) -> i64 {
        if self.scale == 0 {
            1000 - id as i64
        } else {
            self.scale * id as i64 + self.offset
        }
    }

    fn spec(&self) -> TopologySpec {
        let paths = self.rank_paths();
        let mut links = BTreeMap::new();
        links.insert("device".to_string(), LinkClass::new(1e12, 0.0));
        links.insert("system".to_string(), LinkClass::new(1e9, 5e-6).tapered(1.5));
        for (k, l) in INNER.iter().enumerate() {
            if self.present[k] {
                links.insert(
                    l.name().to_string(),
                    LinkClass::new(1e11 / (k + 1) as f64, 1e-6),
                );
            }
        }
        let entries: Vec<RankSpec> = (0..paths.len())
            .map(|r| {
                let [g, s, n, p] = paths[r];
                let ids = [p, n, s, g];
                let mut domains = BTreeMap::new();
                for (k, l) in INNER.iter().enumerate() {
                    if self.present[k] {
                        domains.insert(l.name().to_string(), self.label(ids[k]));
                    }
                }
                RankSpec {
                    rank: r as i64,
                    host: self.hosts.then(|| format!("host{n}")),
                    domains,
                }
            })
            .collect();
        let ranks = self.order.iter().map(|&i| entries[i].clone()).collect();
        let mut nics = Vec::new();
        if self.nic_per_node {
            let nodes = paths.iter().map(|p| p[2]).max().unwrap() + 1;
            for node in (0..nodes).rev() {
                nics.push(halo_topology::spec::NicSpec {
                    name: format!("nic{node}"),
                    bandwidth: 2e10,
                    latency: 2e-6,
                    ranks: (0..paths.len())
                        .filter(|&r| paths[r][2] == node)
                        .map(|r| r as i64)
                        .collect(),
                });
            }
        }
        TopologySpec {
            name: "random".into(),
            links,
            ranks,
            nics,
            node_links: None,
        }
    }

    /// The innermost present level whose domain holds both ranks, from the paths.
    fn expected_meet(&self, a: usize, b: usize) -> Level {
        if a == b {
            return Level::Device;
        }
        let paths = self.rank_paths();
        let (pa, pb) = (paths[a], paths[b]);
        // index into [g, s, n, p]: package 3, node 2, switch 1, group 0
        for (k, l) in INNER.iter().enumerate() {
            if self.present[k] && pa[3 - k] == pb[3 - k] {
                return *l;
            }
        }
        Level::System
    }

    /// Number of distinct domains at an inner level, from the generator.
    fn expected_domains(&self, k: usize) -> usize {
        let mut ids: Vec<usize> = self.rank_paths().iter().map(|p| p[3 - k]).collect();
        ids.sort_unstable();
        ids.dedup();
        ids.len()
    }
}

/// Every invariant of the model on one generated machine.
fn check_invariants(m: &Machine) -> Result<(), TestCaseError> {
    let spec = m.spec();
    let t = spec.build().unwrap();
    let n = t.size();
    prop_assert_eq!(n, m.numbering.len());
    prop_assert_eq!(t.num_domains(Level::Device), n);
    prop_assert_eq!(t.num_domains(Level::System), 1);
    for (k, l) in INNER.iter().enumerate() {
        prop_assert_eq!(t.has_level(*l), m.present[k]);
        if m.present[k] {
            prop_assert_eq!(t.num_domains(*l), m.expected_domains(k));
        }
    }
    for l in t.levels() {
        // Members of the domains partition the ranks; each list ascending, and the
        // local index is the position in it.
        let mut seen = vec![false; n];
        let mut max = 0;
        let mut sizes = Vec::new();
        for d in 0..t.num_domains(l) {
            let members = t.ranks(l, d);
            prop_assert!(!members.is_empty());
            prop_assert!(members.windows(2).all(|w| w[0] < w[1]));
            prop_assert_eq!(t.leader(l, d), members[0] as usize);
            prop_assert_eq!(t.domain_size(l, d), members.len());
            max = max.max(members.len());
            sizes.push(members.len());
            for (i, &r) in members.iter().enumerate() {
                let r = r as usize;
                prop_assert!(!seen[r]);
                seen[r] = true;
                prop_assert_eq!(t.domain(r, l), d);
                prop_assert_eq!(t.local_index(r, l), i);
            }
        }
        prop_assert!(seen.iter().all(|&s| s));
        prop_assert_eq!(t.max_domain_size(l), max);
        prop_assert_eq!(t.is_uniform(l), sizes.iter().all(|&s| s == sizes[0]));
        // Rank-aligned peers land in the target domain at the wrapped index.
        for r in 0..n {
            for d in 0..t.num_domains(l) {
                let peer = t.aligned_peer(r, l, d);
                prop_assert_eq!(t.domain(peer, l), d);
                prop_assert_eq!(
                    t.local_index(peer, l),
                    t.local_index(r, l) % t.domain_size(l, d)
                );
            }
        }
        // Parent and children agree.
        match t.outer(l) {
            Some(o) => {
                prop_assert_eq!(t.inner(o), Some(l));
                let mut total = 0;
                for pd in 0..t.num_domains(o) {
                    let kids = t.children(o, pd);
                    prop_assert!(!kids.is_empty());
                    prop_assert!(kids.windows(2).all(|w| w[0] < w[1]));
                    total += kids.len();
                    for &c in kids {
                        prop_assert_eq!(t.parent(l, c as usize), pd);
                    }
                }
                prop_assert_eq!(total, t.num_domains(l));
                for r in 0..n {
                    prop_assert_eq!(t.domain(r, o), t.parent(l, t.domain(r, l)));
                }
            }
            None => prop_assert_eq!(l, Level::System),
        }
    }
    prop_assert!(t.children(Level::Device, 0).is_empty());
    // meet: symmetric, Device on the diagonal, and what the generator says.
    for a in 0..n {
        prop_assert_eq!(t.meet(a, a), Level::Device);
        for b in 0..n {
            let l = t.meet(a, b);
            prop_assert_eq!(l, t.meet(b, a));
            prop_assert_eq!(l, m.expected_meet(a, b));
            prop_assert_eq!(t.domain(a, l), t.domain(b, l));
            prop_assert_eq!(t.link_between(a, b), t.link(l));
        }
    }
    // Hosts and NICs.
    let paths = m.rank_paths();
    for (r, path) in paths.iter().enumerate() {
        let node = path[2];
        let host = format!("host{node}");
        prop_assert_eq!(t.host(r), m.hosts.then_some(host.as_str()));
        match t.nic_of(r) {
            Some(nic) => {
                prop_assert!(m.nic_per_node);
                prop_assert_eq!(&nic.name, &format!("nic{node}"));
                prop_assert!(nic.ranks.contains(&r));
            }
            None => prop_assert!(!m.nic_per_node),
        }
    }
    // Round trips: TOML and JSON of the built topology, and of the spec as written.
    let back = TopologySpec::from_toml_str(&t.to_spec().to_toml_string())
        .unwrap()
        .build()
        .unwrap();
    prop_assert_eq!(&back, &t);
    let back = TopologySpec::from_json_str(&t.to_spec().to_json_string())
        .unwrap()
        .build()
        .unwrap();
    prop_assert_eq!(&back, &t);
    let reread = TopologySpec::from_toml_str(&spec.to_toml_string()).unwrap();
    prop_assert_eq!(&reread, &spec);
    prop_assert_eq!(&reread.build().unwrap(), &t);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn random_trees_hold_invariants(m in machine()) {
        check_invariants(&m)?;
    }
}
