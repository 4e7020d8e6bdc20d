//! Piper for HALO: the resource model of MoE training and the layout planner.
//!
//! Piper (Dash and Wang, "Piper: Efficient Large-Scale MoE Training via Resource
//! Modeling and Pipelined Hybrid Parallelism", ORNL, arXiv 2605.05049) computes the
//! parallel layout of an MoE training job before it runs: how much memory every
//! pipeline stage needs, how long the expert all-to-all takes on the machine's
//! topology, how busy the GPUs will be, and which pipeline x expert-parallel layout is
//! best. This crate holds that model and the pipeline executor that runs a layout with
//! HALO's communicators, and expert migration.
//!
//! - [`model`]: [`ModelConfig`], the presets and the model file format;
//! - [`resource`]: the equations (parameters, memory per stage, all-to-all and
//!   point-to-point volumes, migration cost);
//! - [`profile`]: hardware profiles (peak, memory, attention and GEMM throughput);
//! - [`predict`]: step time and MFU of one layout, the all-to-all simulated with
//!   HALO's simulator on the machine's topology;
//! - [`plan`](mod@plan): the PP x EP x DP search;
//! - [`executor`]: the pipeline executor (PP x EP x DP mesh of HALO communicators, 1F1B,
//!   MoE layers dispatching with `all_to_all_v`), exact against `halo-moe`'s reference;
//! - [`migration`]: expert migration on that executor (agreed load, hill-climbing swaps,
//!   experts moved with their optimizer state, all or nothing).
//!
//! ```
//! use halo_piper::{ModelConfig, resource};
//! let m = ModelConfig::preset("piper-ws:256").unwrap();
//! let p = resource::params(&m);
//! assert_eq!(p.total / 1_000_000_000, 1721); // about 1.7T
//! ```
//!
//! docs/PLANNING.md has the equations with their sources and worked examples.

mod error;
pub mod executor;
pub mod migration;
pub mod model;
pub mod plan;
pub mod predict;
pub mod profile;
pub mod resource;

pub use error::{PiperError, Result};
pub use executor::{
    ActivationPeak, Executor, Footprint, MeshLayout, Placement, ReferenceModel, StageCompute,
    StepReport, StepTimes,
};
pub use migration::{MigrationConfig, MigrationReport, Migrator};
pub use model::ModelConfig;
pub use plan::{Constraint, Plan, Planned, Rejected, plan};
pub use predict::{Layout, Machine, Prediction, Predictor, Workload};
pub use profile::HardwareProfile;
pub use resource::{MemoryOptions, Params, StageShape};
