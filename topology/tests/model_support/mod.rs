//! Helpers shared by the `model_*` test files. Each test file uses part of them.
#![allow(dead_code)]

use halo_topology::{Level, Topology};

pub(crate) fn preset(spec: &str) -> Topology {
    Topology::preset(spec).unwrap_or_else(|e| panic!("preset {spec}: {e}"))
}

pub(crate) fn hand() -> Topology {
    Topology::load(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/hand.toml")).unwrap()
}

pub(crate) fn levels(t: &Topology) -> Vec<Level> {
    t.levels().collect()
}

pub(crate) fn nic_names<'a>(it: impl Iterator<Item = &'a halo_topology::Nic>) -> Vec<&'a str> {
    it.map(|n| n.name.as_str()).collect()
}
