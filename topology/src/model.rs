//! The topology: ranks placed in a tree of domains, with link classes and NICs.

use crate::error::{Result, TopologyError};
use crate::level::{Level, LinkClass};
use crate::spec::{NicSpec, RankSpec, TopologySpec};
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

/// A rank: a position 0..N-1 in the communicator.
pub type Rank = usize;

/// A network interface and the ranks it serves.
#[derive(Debug, Clone, PartialEq)]
pub struct Nic {
    /// Interface name (`hsn0`, `eth0`).
    pub name: String,
    /// Injection bandwidth, bytes per second.
    pub bandwidth: f64,
    /// Per-message latency, seconds.
    pub latency: f64,
    /// Ranks served, ascending; all on one node.
    pub ranks: Vec<Rank>,
}

/// One present level: its link class and its domains.
#[derive(Debug, Clone, PartialEq)]
struct LevelData {
    level: Level,
    link: LinkClass,
    /// rank -> dense domain id.
    domain_of: Vec<u32>,
    /// rank -> index inside its domain.
    local_index: Vec<u32>,
    /// CSR: members of domain d are `members[start[d]..start[d+1]]`, ascending.
    start: Vec<u32>,
    members: Vec<u32>,
    /// domain -> dense domain id at the next present level out (the last level has none).
    parent: Vec<u32>,
    /// CSR of the domains one level in, per domain (empty for the device level).
    child_start: Vec<u32>,
    children: Vec<u32>,
}

/// Ranks placed in a tree of domains (device ⊂ package ⊂ node ⊂ switch ⊂ group ⊂
/// system; inner levels may be absent), a link class per level, and the NICs.
///
/// Build one from a preset ([`Topology::preset`]), a file ([`Topology::load`]) or a
/// [`TopologySpec`]. Domains are numbered densely per level; inside a domain ranks are
/// in ascending order, and a rank's *local index* is its position there. Domains may
/// be uneven (the last node may hold fewer ranks).
///
/// ```
/// use halo_topology::{Level, Topology};
/// let t = Topology::preset("frontier:2").unwrap();
/// assert_eq!(t.size(), 16);
/// assert_eq!(t.meet(0, 1), Level::Package); // two GCDs of one MI250X
/// assert_eq!(t.meet(0, 2), Level::Node);
/// assert_eq!(t.meet(0, 8), Level::Switch);  // nodes 0 and 1 share a Rosetta switch
/// assert_eq!(t.aligned_peer(3, Level::Node, 1), 11);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Topology {
    name: String,
    levels: Vec<LevelData>,
    /// Level -> index in `levels`.
    index: [Option<u8>; 6],
    hosts: Vec<Option<String>>,
    nics: Vec<Nic>,
    nic_of: Vec<Option<u32>>,
    node_links: Option<NodeLinks>,
}

/// Most hops a path of [`NodeLinks::balanced_routes`] takes.
pub const RELAY_HOPS: usize = 3;

/// Most ranks of a node [`NodeLinks::balanced_routes`] searches paths for (every node
/// of the presets; the search grows with the cube of the ranks).
pub const RELAY_MAX_RANKS: usize = 8;

/// The direct links between the ranks of a node where a node is not uniform
/// ([`Topology::node_links`]): the same in every node, by the ranks' positions in their
/// node ([`Topology::local_index`] at [`Level::Node`]).
#[derive(Debug, Clone, PartialEq)]
pub struct NodeLinks {
    pub(crate) link: LinkClass,
    pub(crate) matrix: Vec<Vec<u32>>,
}

impl NodeLinks {
    /// What one link carries, one direction.
    pub fn link(&self) -> LinkClass {
        self.link
    }

    /// Ranks per node the matrix describes (its rows).
    pub fn size(&self) -> usize {
        self.matrix.len()
    }

    /// The links between the node's `i`-th and `j`-th rank (0: no direct link).
    ///
    /// # Panics
    /// When `i` or `j` is not below [`NodeLinks::size`].
    pub fn links(&self, i: usize, j: usize) -> u32 {
        self.matrix[i][j]
    }

    /// Every row of the matrix.
    pub fn matrix(&self) -> &[Vec<u32>] {
        &self.matrix
    }

    /// How loaded the busiest link is when each of the node's first `ranks` ranks sends
    /// one transfer to each of the others over its [`route`](NodeLinks::route): the
    /// most transfers any one direction of a pair's links carries, divided by that
    /// pair's links (`frontier:1`: 4.0, a single link carrying its own transfer and
    /// three routed over it; `mi300x:1`: 1.0). An all-to-all of `b` bytes per pair
    /// inside the node then takes at least `exchange_load * b / link().bandwidth`.
    /// 0 when fewer than two ranks are given; infinite when two of them have no path.
    ///
    /// # Panics
    /// When `ranks` is above [`NodeLinks::size`].
    pub fn exchange_load(&self, ranks: usize) -> f64 {
        let size = self.size();
        assert!(ranks <= size, "more ranks than the matrix has rows");
        let mut load = vec![0u32; size * size];
        for i in 0..ranks {
            for j in (0..ranks).filter(|&j| j != i) {
                let route = self.route(i, j);
                if route.is_empty() {
                    return f64::INFINITY;
                }
                for (u, v) in route {
                    load[u * size + v] += 1;
                }
            }
        }
        (0..size * size)
            .filter(|&e| load[e] > 0)
            .map(|e| load[e] as f64 / self.matrix[e / size][e % size] as f64)
            .fold(0.0, f64::max)
    }

    /// Paths for an all-to-all inside the node that load its busiest link less than
    /// the fabric's [`route`](NodeLinks::route)s do, for a library that forwards blocks
    /// over peers itself: per ordered pair of the node's first `ranks` ranks (index
    /// `i * ranks + j`), the positions a block from `i` to `j` visits, `i` first and
    /// `j` last (empty for `i == j`), with their [`exchange_load`](NodeLinks::exchange_load).
    /// Paths have at most [`RELAY_HOPS`] hops and visit only those ranks; the search
    /// starts from the fabric's routes and moves one pair at a time to the path that lowers the busiest link's
    /// load (then the sum of squares of all loads) until none does — deterministic, the
    /// same on every rank. `None` when it finds nothing better than the fabric's
    /// routes, when two ranks have no path, or for more than [`RELAY_MAX_RANKS`] ranks.
    ///
    /// ```
    /// use halo_topology::Topology;
    ///
    /// let topo = Topology::preset("frontier:1").unwrap();
    /// let links = topo.node_links().unwrap();
    /// let (paths, load) = links.balanced_routes(8).unwrap();
    /// assert_eq!(load, 3.0); // against the fabric's 4.0
    /// assert_eq!(paths[1], vec![0, 1]); // GCD 0 -> 1 on the quad link
    /// ```
    ///
    /// # Panics
    /// When `ranks` is above [`NodeLinks::size`].
    pub fn balanced_routes(&self, ranks: usize) -> Option<(Vec<Vec<usize>>, f64)> {
        assert!(ranks <= self.size(), "more ranks than the matrix has rows");
        if !(2..=RELAY_MAX_RANKS).contains(&ranks) {
            return None;
        }
        let fabric = self.exchange_load(ranks);
        if !fabric.is_finite() {
            return None;
        }
        let n = ranks;
        let l = |u: usize, v: usize| self.matrix[u][v];
        // Every simple path of at most RELAY_HOPS hops, fewest hops first, then in order.
        let mut candidates: Vec<Vec<Vec<usize>>> = vec![Vec::new(); n * n];
        for i in 0..n {
            let mut stack = vec![vec![i]];
            while let Some(p) = stack.pop() {
                let u = *p.last().expect("a path has a start");
                for v in (0..n).filter(|&v| l(u, v) > 0 && !p.contains(&v)) {
                    let mut q = p.clone();
                    q.push(v);
                    if q.len() <= RELAY_HOPS {
                        stack.push(q.clone());
                    }
                    candidates[i * n + v].push(q);
                }
            }
        }
        for c in &mut candidates {
            c.sort_by(|a, b| a.len().cmp(&b.len()).then_with(|| a.cmp(b)));
        }
        let mut load = vec![0i64; n * n];
        let add = |load: &mut [i64], p: &[usize], d: i64| {
            for w in p.windows(2) {
                load[w[0] * n + w[1]] += d;
            }
        };
        let cost = |load: &[i64]| {
            let mut worst = 0.0f64;
            let mut squares = 0.0f64;
            for e in (0..n * n).filter(|&e| load[e] > 0) {
                let x = load[e] as f64 / l(e / n, e % n) as f64;
                worst = worst.max(x);
                squares += x * x;
            }
            (worst, squares)
        };
        let mut paths: Vec<Vec<usize>> = vec![Vec::new(); n * n];
        for i in 0..n {
            for j in (0..n).filter(|&j| j != i) {
                // The fabric's route, unless it crosses a GPU beyond the first `ranks`
                // (no rank there to forward): then the first candidate.
                let mut p = vec![i];
                p.extend(self.route(i, j).into_iter().map(|(_, v)| v));
                if p.iter().any(|&x| x >= n) {
                    p = candidates[i * n + j].first()?.clone();
                }
                add(&mut load, &p, 1);
                paths[i * n + j] = p;
            }
        }
        let mut now = cost(&load);
        for _ in 0..64 {
            let mut moved = false;
            for d in (0..n * n).filter(|&d| d / n != d % n) {
                let here = std::mem::take(&mut paths[d]);
                add(&mut load, &here, -1);
                let mut best = (now, here);
                for p in &candidates[d] {
                    add(&mut load, p, 1);
                    let c = cost(&load);
                    add(&mut load, p, -1);
                    if c < best.0 {
                        best = (c, p.clone());
                    }
                }
                if best.0 < now {
                    moved = true;
                    now = best.0;
                }
                add(&mut load, &best.1, 1);
                paths[d] = best.1;
            }
            if !moved {
                break;
            }
        }
        (now.0 < fabric).then_some((paths, now.0))
    }

    /// The links a transfer from the node's `i`-th to its `j`-th rank crosses, as
    /// pairs of positions: the direct link when there is one, else the path with the
    /// fewest hops and of those the widest (the most links at its thinnest hop), ties
    /// to the lowest positions — how the fabric forwards a transfer between two GPUs
    /// without a link of their own over a peer (KFD reports such pairs as two xGMI
    /// hops). Empty when `i == j` or no path joins them.
    ///
    /// ```
    /// use halo_topology::Topology;
    ///
    /// let topo = Topology::preset("frontier:1").unwrap();
    /// let links = topo.node_links().unwrap();
    /// assert_eq!(links.route(0, 1), vec![(0, 1)]); // the package's quad link
    /// assert_eq!(links.route(0, 3), vec![(0, 1), (1, 3)]); // no link: over GCD 1
    /// ```
    ///
    /// # Panics
    /// When `i` or `j` is not below [`NodeLinks::size`].
    pub fn route(&self, i: usize, j: usize) -> Vec<(usize, usize)> {
        let size = self.size();
        assert!(i < size && j < size, "position out of range");
        if i == j {
            return Vec::new();
        }
        // Breadth first from i: per position the fewest hops, the widest bottleneck
        // among those paths, and the predecessor on the widest (the lowest on a tie).
        let mut hops = vec![usize::MAX; size];
        let mut width = vec![0u32; size];
        let mut prev = vec![usize::MAX; size];
        hops[i] = 0;
        width[i] = u32::MAX;
        let mut frontier = vec![i];
        while !frontier.is_empty() && hops[j] == usize::MAX {
            let mut next = Vec::new();
            for &u in &frontier {
                for v in 0..size {
                    let l = self.matrix[u][v];
                    if v == u || l == 0 || hops[v] <= hops[u] {
                        continue;
                    }
                    if hops[v] == usize::MAX {
                        hops[v] = hops[u] + 1;
                        next.push(v);
                    }
                    let w = width[u].min(l);
                    if w > width[v] {
                        width[v] = w;
                        prev[v] = u;
                    }
                }
            }
            next.sort_unstable();
            frontier = next;
        }
        if hops[j] == usize::MAX {
            return Vec::new();
        }
        let mut route = Vec::with_capacity(hops[j]);
        let mut v = j;
        while v != i {
            route.push((prev[v], v));
            v = prev[v];
        }
        route.reverse();
        route
    }
}

impl Topology {
    /// Builds and checks the tree. `labels[i]` are the file labels of every rank at
    /// `inner[i]`. When the ranks come from a file, `entry[r]` is the index of rank `r`'s
    /// entry in its `ranks`, so that errors name the field (`ranks[4].switch`).
    pub(crate) fn assemble(
        name: String,
        links: Vec<(Level, LinkClass)>,
        inner: &[Level],
        labels: Vec<Vec<i64>>,
        hosts: Vec<Option<String>>,
        nics: Vec<Nic>,
        entry: Option<&[usize]>,
    ) -> Result<Self> {
        let at = |r: usize| match entry {
            Some(e) => format!("ranks[{}]", e[r]),
            None => format!("ranks (rank {r})"),
        };
        let n = hosts.len();
        let mut levels = Vec::with_capacity(links.len());
        for (level, link) in links {
            let domain_of: Vec<u32> = match level {
                Level::Device => (0..n as u32).collect(),
                Level::System => vec![0; n],
                _ => {
                    let li = inner.iter().position(|l| *l == level).expect("inner level");
                    let mut sorted: Vec<i64> = labels[li].clone();
                    sorted.sort_unstable();
                    sorted.dedup();
                    let dense: HashMap<i64, u32> = sorted
                        .iter()
                        .enumerate()
                        .map(|(i, l)| (*l, i as u32))
                        .collect();
                    labels[li].iter().map(|l| dense[l]).collect()
                }
            };
            levels.push(LevelData::new(level, link, domain_of));
        }
        // Parents and tree consistency: a domain must sit inside exactly one domain of the next level out.
        for li in 0..levels.len() - 1 {
            let (lo, hi) = levels.split_at_mut(li + 1);
            let (child, parent) = (&mut lo[li], &mut hi[0]);
            let mut up = vec![u32::MAX; child.num_domains()];
            for r in 0..n {
                let d = child.domain_of[r] as usize;
                let p = parent.domain_of[r];
                if up[d] == u32::MAX {
                    up[d] = p;
                } else if up[d] != p {
                    let first = child.members(d)[0];
                    let (c, p) = (child.level, parent.level);
                    return Err(TopologyError::invalid(
                        format!("{}.{p}", at(r)),
                        format!(
                            "rank {r} is in the same {c} as rank {first} but in a different {p}: \
                             a {c} must lie inside one {p}"
                        ),
                    ));
                }
            }
            // children CSR for the parent
            let mut counts = vec![0u32; parent.num_domains() + 1];
            for &p in &up {
                counts[p as usize + 1] += 1;
            }
            for i in 1..counts.len() {
                counts[i] += counts[i - 1];
            }
            let mut fill = counts.clone();
            let mut kids = vec![0u32; up.len()];
            for (d, &p) in up.iter().enumerate() {
                kids[fill[p as usize] as usize] = d as u32;
                fill[p as usize] += 1;
            }
            parent.child_start = counts;
            parent.children = kids;
            child.parent = up;
        }
        let node = levels.iter().position(|l| l.level == Level::Node);
        // Host names: one per node, distinct across nodes.
        if let Some(ni) = node {
            let nl = &levels[ni];
            let mut seen: HashMap<&str, usize> = HashMap::new();
            for d in 0..nl.num_domains() {
                let members = nl.members(d);
                let h0 = &hosts[members[0] as usize];
                let show = |h: &Option<String>| match h {
                    Some(h) => format!("'{h}'"),
                    None => "none".to_string(),
                };
                for &r in members {
                    if hosts[r as usize] != *h0 {
                        return Err(TopologyError::invalid(
                            format!("{}.host", at(r as usize)),
                            format!(
                                "ranks {} and {r} are on one node but name different hosts ({} and {})",
                                members[0],
                                show(h0),
                                show(&hosts[r as usize])
                            ),
                        ));
                    }
                }
                if let Some(h) = h0
                    && let Some(other) = seen.insert(h.as_str(), d)
                {
                    let other_rank = nl.members(other)[0];
                    return Err(TopologyError::invalid(
                        format!("{}.host", at(members[0] as usize)),
                        format!(
                            "host '{h}' names two nodes: node {other} (rank {other_rank}) and node {d} (rank {})",
                            members[0]
                        ),
                    ));
                }
            }
        }
        // NICs: all ranks of one NIC on one node.
        let mut nic_of = vec![None; n];
        for (j, nic) in nics.iter().enumerate() {
            if let Some(ni) = node {
                let d0 = levels[ni].domain_of[nic.ranks[0]];
                if let Some(&r) = nic.ranks.iter().find(|&&r| levels[ni].domain_of[r] != d0) {
                    return Err(TopologyError::invalid(
                        format!("nics[{j}].ranks"),
                        format!(
                            "NIC '{}' serves ranks {} and {r}, which are on different nodes",
                            nic.name, nic.ranks[0]
                        ),
                    ));
                }
            }
            for &r in &nic.ranks {
                nic_of[r] = Some(j as u32);
            }
        }
        let mut index = [None; 6];
        for (i, l) in levels.iter().enumerate() {
            index[l.level as usize] = Some(i as u8);
        }
        Ok(Topology {
            name,
            levels,
            index,
            hosts,
            nics,
            nic_of,
            node_links: None,
        })
    }

    /// This topology with the per-pair links inside its nodes (checked by the caller:
    /// [`TopologySpec::build`]).
    pub(crate) fn with_node_links(mut self, links: NodeLinks) -> Self {
        self.node_links = Some(links);
        self
    }

    /// The per-pair links inside a node, when the topology has them (a preset of a
    /// machine whose nodes are not uniform, or a file's `[node_links]`).
    pub fn node_links(&self) -> Option<&NodeLinks> {
        self.node_links.as_ref()
    }

    /// This topology without its link matrix: every pair of a node meets at its level's
    /// one bandwidth, as the uniform model has it (to compare the two, `halo simulate
    /// --uniform-node`).
    pub fn without_node_links(&self) -> Topology {
        Topology {
            node_links: None,
            ..self.clone()
        }
    }

    /// The direct links between ranks `a` and `b` of the same node, by the node's link
    /// matrix; `None` when the topology has none or the ranks are on different nodes
    /// (or are the same rank).
    pub fn links_between(&self, a: Rank, b: Rank) -> Option<u32> {
        let m = self.node_links.as_ref()?;
        if a == b || self.domain(a, Level::Node) != self.domain(b, Level::Node) {
            return None;
        }
        Some(m.links(
            self.local_index(a, Level::Node),
            self.local_index(b, Level::Node),
        ))
    }

    /// Loads a topology file (TOML, or JSON when the name ends in `.json`).
    pub fn load(path: impl AsRef<std::path::Path>) -> Result<Self> {
        TopologySpec::load(path)?.build()
    }

    /// The name given in the file or by the preset.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Number of ranks.
    pub fn size(&self) -> usize {
        self.hosts.len()
    }

    /// The present levels, innermost (`Device`) first, `System` last.
    pub fn levels(&self) -> impl ExactSizeIterator<Item = Level> + '_ {
        self.levels.iter().map(|l| l.level)
    }

    /// Whether the level is present.
    pub fn has_level(&self, level: Level) -> bool {
        self.index[level as usize].is_some()
    }

    fn data(&self, level: Level) -> &LevelData {
        match self.index[level as usize] {
            Some(i) => &self.levels[i as usize],
            None => panic!("topology '{}' has no {level} level", self.name),
        }
    }

    /// The link class of a level.
    ///
    /// # Panics
    /// If the level is absent (see [`Topology::has_level`]); so do the other per-level queries.
    pub fn link(&self, level: Level) -> LinkClass {
        self.data(level).link
    }

    /// The next present level out from `level` (`None` for `System`).
    pub fn outer(&self, level: Level) -> Option<Level> {
        let i = self.index[level as usize]? as usize;
        self.levels.get(i + 1).map(|l| l.level)
    }

    /// The next present level in from `level` (`None` for `Device`).
    pub fn inner(&self, level: Level) -> Option<Level> {
        let i = self.index[level as usize]? as usize;
        i.checked_sub(1).map(|i| self.levels[i].level)
    }

    /// The innermost level whose domain holds both ranks (`Device` when `a == b`).
    pub fn meet(&self, a: Rank, b: Rank) -> Level {
        self.levels
            .iter()
            .find(|l| l.domain_of[a] == l.domain_of[b])
            .map(|l| l.level)
            .expect("the system level holds every rank")
    }

    /// The link class a message from `a` to `b` crosses.
    pub fn link_between(&self, a: Rank, b: Rank) -> LinkClass {
        self.link(self.meet(a, b))
    }

    /// Number of domains at a level.
    pub fn num_domains(&self, level: Level) -> usize {
        self.data(level).num_domains()
    }

    /// The domain of `rank` at `level`.
    pub fn domain(&self, rank: Rank, level: Level) -> usize {
        self.data(level).domain_of[rank] as usize
    }

    /// The ranks of a domain, ascending.
    pub fn ranks(&self, level: Level, domain: usize) -> &[u32] {
        self.data(level).members(domain)
    }

    /// Number of ranks in a domain.
    pub fn domain_size(&self, level: Level, domain: usize) -> usize {
        self.ranks(level, domain).len()
    }

    /// The largest number of ranks in any domain of the level.
    pub fn max_domain_size(&self, level: Level) -> usize {
        let d = self.data(level);
        d.start
            .windows(2)
            .map(|w| (w[1] - w[0]) as usize)
            .max()
            .unwrap_or(0)
    }

    /// Whether every domain of the level has the same number of ranks.
    pub fn is_uniform(&self, level: Level) -> bool {
        let d = self.data(level);
        let first = d.start[1] - d.start[0];
        d.start.windows(2).all(|w| w[1] - w[0] == first)
    }

    /// The position of `rank` among the ranks of its domain at `level`.
    pub fn local_index(&self, rank: Rank, level: Level) -> usize {
        self.data(level).local_index[rank] as usize
    }

    /// The domain's leader: its lowest rank.
    pub fn leader(&self, level: Level, domain: usize) -> Rank {
        self.ranks(level, domain)[0] as usize
    }

    /// The rank of `domain` (at `level`) with the same local index as `rank` — the
    /// rank-aligned peer. When the target domain is smaller (uneven trees) the index
    /// wraps around its size.
    pub fn aligned_peer(&self, rank: Rank, level: Level, domain: usize) -> Rank {
        let members = self.ranks(level, domain);
        members[self.local_index(rank, level) % members.len()] as usize
    }

    /// The domain at the next present level out that holds `domain`.
    ///
    /// # Panics
    /// For the `System` level, which has no parent.
    pub fn parent(&self, level: Level, domain: usize) -> usize {
        self.data(level).parent[domain] as usize
    }

    /// The domains one present level in that `domain` holds, ascending.
    pub fn children(&self, level: Level, domain: usize) -> &[u32] {
        let d = self.data(level);
        if d.child_start.is_empty() {
            return &[];
        }
        &d.children[d.child_start[domain] as usize..d.child_start[domain + 1] as usize]
    }

    /// The host name of the rank's node, when known.
    pub fn host(&self, rank: Rank) -> Option<&str> {
        self.hosts[rank].as_deref()
    }

    /// All NICs.
    pub fn nics(&self) -> &[Nic] {
        &self.nics
    }

    /// The NIC serving `rank`, if any.
    pub fn nic_of(&self, rank: Rank) -> Option<&Nic> {
        self.nic_of[rank].map(|j| &self.nics[j as usize])
    }

    /// The NICs of a node (by node domain), in file order.
    pub fn node_nics(&self, node: usize) -> impl Iterator<Item = &Nic> + '_ {
        let has_node = self.has_level(Level::Node);
        self.nics
            .iter()
            .filter(move |nic| !has_node || self.domain(nic.ranks[0], Level::Node) == node)
    }

    /// The file form of this topology. Domain labels are the dense domain ids, so the
    /// spec builds back to an equal topology.
    pub fn to_spec(&self) -> TopologySpec {
        let links = self
            .levels
            .iter()
            .map(|l| (l.level.name().to_string(), l.link))
            .collect();
        let inner: Vec<&LevelData> = self
            .levels
            .iter()
            .filter(|l| !matches!(l.level, Level::Device | Level::System))
            .collect();
        let ranks = (0..self.size())
            .map(|r| RankSpec {
                rank: r as i64,
                host: self.hosts[r].clone(),
                domains: inner
                    .iter()
                    .map(|l| (l.level.name().to_string(), l.domain_of[r] as i64))
                    .collect::<BTreeMap<_, _>>(),
            })
            .collect();
        let nics = self
            .nics
            .iter()
            .map(|n| NicSpec {
                name: n.name.clone(),
                bandwidth: n.bandwidth,
                latency: n.latency,
                ranks: n.ranks.iter().map(|&r| r as i64).collect(),
            })
            .collect();
        TopologySpec {
            name: self.name.clone(),
            links,
            ranks,
            nics,
            node_links: self
                .node_links
                .as_ref()
                .map(|m| crate::spec::NodeLinksSpec {
                    link: m.link,
                    matrix: m.matrix.clone(),
                }),
        }
    }

    /// One line per level, outermost first: domains, ranks per domain, link class.
    pub fn summary(&self) -> String {
        let mut out = String::new();
        for l in self.levels.iter().rev() {
            let sizes = l.start.windows(2).map(|w| w[1] - w[0]);
            let (lo, hi) = sizes.fold((u32::MAX, 0), |(lo, hi), s| (lo.min(s), hi.max(s)));
            let per = if lo == hi {
                format!("{lo} rank{} each", if lo == 1 { "" } else { "s" })
            } else {
                format!("{lo}..{hi} ranks each (uneven)")
            };
            let taper = if l.link.taper != 1.0 {
                format!(", taper {}:1", l.link.taper)
            } else {
                String::new()
            };
            let _ = writeln!(
                out,
                "{:<8} {:>6} domain{} {:<26} link {} {}{}",
                l.level.name(),
                l.num_domains(),
                if l.num_domains() == 1 { " " } else { "s" },
                per,
                fmt_bandwidth(l.link.bandwidth),
                fmt_seconds(l.link.latency),
                taper
            );
        }
        if !self.nics.is_empty() {
            let bw: f64 = self.nics.iter().map(|n| n.bandwidth).sum();
            let _ = writeln!(
                out,
                "nics     {:>6} NIC{}    {} injection in all",
                self.nics.len(),
                if self.nics.len() == 1 { " " } else { "s" },
                fmt_bandwidth(bw)
            );
        }
        out
    }

    /// The per-pair links inside a node as a matrix (links per pair of the node's
    /// ranks, `.` none, `-` itself), with what one link carries; `None` when the
    /// topology has no [`NodeLinks`].
    pub fn node_links_table(&self) -> Option<String> {
        let m = self.node_links.as_ref()?;
        let mut out = format!(
            "Links inside a node (per pair; one link {} per direction, {} latency):\n     ",
            fmt_bandwidth(m.link.bandwidth),
            fmt_seconds(m.link.latency)
        );
        for j in 0..m.size() {
            let _ = write!(out, "{j:>3}");
        }
        out.push('\n');
        for (i, row) in m.matrix.iter().enumerate() {
            let _ = write!(out, "  {i:>3}");
            for (j, &v) in row.iter().enumerate() {
                let cell = match v {
                    _ if i == j => "-".to_string(),
                    0 => ".".to_string(),
                    v => v.to_string(),
                };
                let _ = write!(out, "{cell:>3}");
            }
            out.push('\n');
        }
        // The pairs without a link of their own, by the peer the fabric forwards over.
        let mut routed = Vec::new();
        for i in 0..m.size() {
            for j in (i + 1..m.size()).filter(|&j| m.links(i, j) == 0) {
                let hops: Vec<String> = m.route(i, j)[1..]
                    .iter()
                    .map(|&(u, _)| u.to_string())
                    .collect();
                routed.push(if hops.is_empty() {
                    format!("{i}-{j} unreachable")
                } else {
                    format!("{i}-{j} via {}", hops.join(","))
                });
            }
        }
        if !routed.is_empty() {
            let _ = writeln!(
                out,
                "Pairs without a link, routed over: {}",
                routed.join(", ")
            );
        }
        let _ = writeln!(
            out,
            "An all-to-all inside a node loads its busiest link with {} transfers per link",
            m.exchange_load(m.size())
        );
        Some(out)
    }

    /// A readable tree, outermost level first. At most `max_children` children are
    /// shown per domain; the rest are counted.
    pub fn render_tree(&self, max_children: usize) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "Topology {} ({} ranks)", self.name, self.size());
        let top = self.levels.len() - 1;
        self.render_domain(&mut out, top, 0, 1, max_children.max(1));
        out
    }

    fn render_domain(&self, out: &mut String, li: usize, d: usize, depth: usize, max: usize) {
        let l = &self.levels[li];
        let indent = "  ".repeat(depth);
        let members = l.members(d);
        if l.level == Level::Device {
            let r = members[0] as usize;
            let nic = self
                .nic_of(r)
                .map(|n| format!("  nic {}", n.name))
                .unwrap_or_default();
            let _ = writeln!(out, "{indent}rank {r}{nic}");
            return;
        }
        let host = if l.level == Level::Node {
            self.hosts[members[0] as usize]
                .as_deref()
                .map(|h| format!(" {h}"))
                .unwrap_or_default()
        } else {
            String::new()
        };
        let nics = if l.level == Level::Node {
            let names: Vec<&str> = self.node_nics(d).map(|n| n.name.as_str()).collect();
            if names.is_empty() {
                String::new()
            } else {
                format!(", NICs {}", names.join(" "))
            }
        } else {
            String::new()
        };
        let _ = writeln!(
            out,
            "{indent}{} {d}{host}: {} rank{}{nics}",
            l.level,
            members.len(),
            if members.len() == 1 { "" } else { "s" }
        );
        let kids = &l.children[l.child_start[d] as usize..l.child_start[d + 1] as usize];
        for &c in kids.iter().take(max) {
            self.render_domain(out, li - 1, c as usize, depth + 1, max);
        }
        if kids.len() > max {
            let (more, kind) = (kids.len() - max, self.levels[li - 1].level);
            let plural = match (more, kind) {
                (1, _) => "",
                (_, Level::Switch) => "es",
                _ => "s",
            };
            let _ = writeln!(out, "{indent}  ... {more} more {kind}{plural}");
        }
    }
}

impl LevelData {
    fn new(level: Level, link: LinkClass, domain_of: Vec<u32>) -> Self {
        let n = domain_of.len();
        let domains = domain_of.iter().map(|&d| d as usize + 1).max().unwrap_or(0);
        let mut start = vec![0u32; domains + 1];
        for &d in &domain_of {
            start[d as usize + 1] += 1;
        }
        for i in 1..start.len() {
            start[i] += start[i - 1];
        }
        let mut fill = start.clone();
        let mut members = vec![0u32; n];
        let mut local_index = vec![0u32; n];
        for (r, &d) in domain_of.iter().enumerate() {
            let at = fill[d as usize];
            members[at as usize] = r as u32;
            local_index[r] = at - start[d as usize];
            fill[d as usize] += 1;
        }
        LevelData {
            level,
            link,
            domain_of,
            local_index,
            start,
            members,
            parent: Vec::new(),
            child_start: Vec::new(),
            children: Vec::new(),
        }
    }

    fn num_domains(&self) -> usize {
        self.start.len() - 1
    }

    fn members(&self, d: usize) -> &[u32] {
        &self.members[self.start[d] as usize..self.start[d + 1] as usize]
    }
}

/// Formats bytes per second as `25.0 GB/s` (decimal units, as network people write them).
pub fn fmt_bandwidth(bytes_per_s: f64) -> String {
    let units = [("TB/s", 1e12), ("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)];
    for (u, f) in units {
        if bytes_per_s >= f {
            return format!("{:.1} {u}", bytes_per_s / f);
        }
    }
    format!("{bytes_per_s:.0} B/s")
}

/// Formats seconds as `2.00 us`, `50.0 us`, `1.20 ms`.
pub fn fmt_seconds(s: f64) -> String {
    if s == 0.0 {
        "0 us".into()
    } else if s < 1e-3 {
        format!("{:.2} us", s * 1e6)
    } else if s < 1.0 {
        format!("{:.2} ms", s * 1e3)
    } else {
        format!("{s:.2} s")
    }
}
