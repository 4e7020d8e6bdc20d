//! Helpers shared by the `discover_*` test files: a temporary fake sysfs root and
//! environment snapshots. Each test file uses part of them.
#![allow(dead_code)]

use std::{
    collections::BTreeMap,
    fs,
    os::unix::fs::symlink,
    path::PathBuf,
    sync::atomic::{AtomicU32, Ordering},
};

use halo_topology::discover::EnvSource;

/// A directory under the system temp dir, removed on drop.
pub(crate) struct TempTree(pub(crate) PathBuf);

impl TempTree {
    pub(crate) fn new(tag: &str) -> Self {
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

    pub(crate) fn path(&self, rel: &str) -> PathBuf {
        self.0.join(rel.trim_start_matches('/'))
    }

    /// Writes `content` to `rel`, creating parents.
    pub(crate) fn file(&self, rel: &str, content: &str) {
        let path = self.path(rel);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, content).unwrap();
    }

    pub(crate) fn dir(&self, rel: &str) {
        fs::create_dir_all(self.path(rel)).unwrap();
    }

    /// Makes `rel` a symbolic link to the tree path `target`.
    pub(crate) fn link(&self, rel: &str, target: &str) {
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

pub(crate) fn no_env() -> EnvSource {
    EnvSource::Snapshot(BTreeMap::new())
}

pub(crate) fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

pub(crate) fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

/// A Slurm job environment: rank 5 of 16 on node 2 of 4, with a topology address.
pub(crate) fn slurm_env() -> BTreeMap<String, String> {
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
