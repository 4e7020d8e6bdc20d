//! HALO: a topology-aware hierarchical all-to-all for Mixture-of-Experts training.
//!
//! This crate is the facade over [`halo_topology`] (the machine model) and the
//! collectives; for now it holds the logging set-up shared by the library and the
//! `halo` command-line tool.

pub use halo_topology as topology;

pub mod logging;
