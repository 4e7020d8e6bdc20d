//! Where each rank runs: which emulated host, and its place there.

use super::LaunchError;

/// Ranks placed block-wise on hosts: host 0 holds ranks `0..c0`, host 1 the next
/// `c1`, and so on. Every host holds at least one rank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    counts: Vec<usize>,
}

/// One rank's position, as the launcher tells it through the environment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    /// The rank (`RANK`).
    pub rank: usize,
    /// The host it runs on (`GROUP_RANK`).
    pub host: usize,
    /// Its index among the ranks of its host (`LOCAL_RANK`).
    pub local_rank: usize,
    /// Ranks on its host (`LOCAL_WORLD_SIZE`).
    pub local_size: usize,
}

impl Placement {
    /// All `ranks` on one host (a local launch).
    pub fn single_host(ranks: usize) -> Result<Placement, LaunchError> {
        Placement::from_counts(vec![ranks], ranks)
    }

    /// `ranks` spread block-wise over `hosts` as evenly as possible: the first
    /// `ranks % hosts` hosts hold one rank more than the others.
    pub fn even(ranks: usize, hosts: usize) -> Result<Placement, LaunchError> {
        if hosts == 0 {
            return Err(LaunchError::invalid("--hosts must be at least 1"));
        }
        if ranks < hosts {
            return Err(LaunchError::invalid(format!(
                "{ranks} ranks cannot fill {hosts} hosts: every emulated host needs at least one rank"
            )));
        }
        let (base, extra) = (ranks / hosts, ranks % hosts);
        let counts = (0..hosts).map(|h| base + usize::from(h < extra)).collect();
        Placement::from_counts(counts, ranks)
    }

    /// Parses `--ranks-per-host`: either one number `M` (hosts filled `M` at a time,
    /// the last may hold fewer) or a comma-separated count per host (`3,1`) that adds
    /// up to `ranks`. `hosts`, when given, must agree.
    pub fn parse(spec: &str, ranks: usize, hosts: Option<usize>) -> Result<Placement, LaunchError> {
        let parts: Vec<usize> = spec
            .split(',')
            .map(|p| {
                p.trim().parse::<usize>().map_err(|_| {
                    LaunchError::invalid(format!(
                        "--ranks-per-host {spec:?}: expected a number or a comma-separated list of numbers"
                    ))
                })
            })
            .collect::<Result<_, _>>()?;
        let counts = if parts.len() == 1 {
            let m = parts[0];
            if m == 0 {
                return Err(LaunchError::invalid("--ranks-per-host must be at least 1"));
            }
            let k = ranks.div_ceil(m);
            (0..k).map(|h| m.min(ranks - h * m)).collect()
        } else {
            if parts.contains(&0) {
                return Err(LaunchError::invalid(format!(
                    "--ranks-per-host {spec:?}: every emulated host needs at least one rank"
                )));
            }
            let sum: usize = parts.iter().sum();
            if sum != ranks {
                return Err(LaunchError::invalid(format!(
                    "--ranks-per-host {spec:?} places {sum} ranks, but -n is {ranks}"
                )));
            }
            parts
        };
        if let Some(k) = hosts
            && k != counts.len()
        {
            return Err(LaunchError::invalid(format!(
                "--ranks-per-host {spec:?} with -n {ranks} makes {} hosts, but --hosts is {k}",
                counts.len()
            )));
        }
        Placement::from_counts(counts, ranks)
    }

    fn from_counts(counts: Vec<usize>, ranks: usize) -> Result<Placement, LaunchError> {
        if ranks == 0 {
            return Err(LaunchError::invalid("-n must be at least 1"));
        }
        debug_assert_eq!(counts.iter().sum::<usize>(), ranks);
        Ok(Placement { counts })
    }

    /// Hosts.
    pub fn hosts(&self) -> usize {
        self.counts.len()
    }

    /// Ranks in all.
    pub fn ranks(&self) -> usize {
        self.counts.iter().sum()
    }

    /// Ranks on each host, in host order.
    pub fn counts(&self) -> &[usize] {
        &self.counts
    }

    /// The ranks of `host`.
    pub fn ranks_of(&self, host: usize) -> std::ops::Range<usize> {
        let start: usize = self.counts[..host].iter().sum();
        start..start + self.counts[host]
    }

    /// Every rank's slot, in rank order.
    pub fn slots(&self) -> Vec<Slot> {
        let mut out = Vec::with_capacity(self.ranks());
        for (host, &local_size) in self.counts.iter().enumerate() {
            for local_rank in 0..local_size {
                out.push(Slot {
                    rank: out.len(),
                    host,
                    local_rank,
                    local_size,
                });
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn even_blocks_put_the_remainder_first() {
        assert_eq!(Placement::even(4, 2).unwrap().counts(), &[2, 2]);
        assert_eq!(Placement::even(5, 2).unwrap().counts(), &[3, 2]);
        assert_eq!(Placement::even(5, 4).unwrap().counts(), &[2, 1, 1, 1]);
        assert!(Placement::even(2, 3).is_err());
        assert!(Placement::even(0, 1).is_err());
        assert!(Placement::even(3, 0).is_err());
    }

    #[test]
    fn slots_are_block_wise() {
        let p = Placement::even(5, 2).unwrap();
        let s = p.slots();
        assert_eq!(s.len(), 5);
        assert_eq!(
            s[2],
            Slot {
                rank: 2,
                host: 0,
                local_rank: 2,
                local_size: 3
            }
        );
        assert_eq!(
            s[3],
            Slot {
                rank: 3,
                host: 1,
                local_rank: 0,
                local_size: 2
            }
        );
        assert_eq!(p.ranks_of(1), 3..5);
    }

    #[test]
    fn ranks_per_host_forms() {
        assert_eq!(Placement::parse("2", 5, None).unwrap().counts(), &[2, 2, 1]);
        assert_eq!(Placement::parse("2", 4, Some(2)).unwrap().counts(), &[2, 2]);
        assert_eq!(Placement::parse("3,1", 4, None).unwrap().counts(), &[3, 1]);
        assert!(Placement::parse("3,1", 5, None).is_err());
        assert!(Placement::parse("2", 4, Some(3)).is_err());
        assert!(Placement::parse("0", 4, None).is_err());
        assert!(Placement::parse("2,0,2", 4, None).is_err());
        assert!(Placement::parse("x", 4, None).is_err());
    }
}
