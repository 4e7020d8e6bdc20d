//! `halo topo`: show a topology.

use super::{Failure, emit};
use clap::{ArgGroup, Args};
use halo_topology::{Topology, discover};
use std::path::PathBuf;

/// Without `--preset` or `--file`, discovers this machine and shows what was found.
/// With one of them, shows the topology the collectives would use: the tree of
/// domains and one summary line per level.
#[derive(Debug, Args)]
#[command(group(ArgGroup::new("source").args(["preset", "file"])))]
#[command(group(ArgGroup::new("format").args(["json", "toml"])))]
pub(crate) struct TopoArgs {
    /// A named preset: flat:N, nodes:HxR, frontier:N, mi300x:N, dgx-h100:N, optionally ,ranks=M.
    #[arg(long, value_name = "PRESET")]
    preset: Option<String>,

    /// A topology file (TOML, or JSON when it ends in .json).
    #[arg(long, value_name = "PATH")]
    file: Option<PathBuf>,

    /// Print JSON: the topology file form (loadable with --file), or what discovery
    /// found.
    #[arg(long)]
    json: bool,

    /// Print the topology file form as TOML (needs --preset or --file).
    #[arg(long, requires = "source")]
    toml: bool,

    /// Children shown per domain in the tree; the rest are counted.
    #[arg(long, value_name = "N", default_value_t = 4, requires = "source")]
    max_children: usize,
}

pub(crate) fn run(args: &TopoArgs) -> Result<(), Failure> {
    let topology = match (&args.preset, &args.file) {
        (Some(p), _) => Topology::preset(p).map_err(Failure::input)?,
        (None, Some(f)) => Topology::load(f).map_err(Failure::input)?,
        (None, None) => return local(args),
    };
    tracing::info!(
        name = topology.name(),
        ranks = topology.size(),
        levels = topology.levels().len(),
        "built topology"
    );
    let text = if args.json {
        topology.to_spec().to_json_string() + "\n"
    } else if args.toml {
        topology.to_spec().to_toml_string()
    } else {
        format!(
            "{}\nLevels (outermost first):\n{}{}",
            topology.render_tree(args.max_children),
            topology.summary(),
            topology
                .node_links_table()
                .map(|t| format!("\n{t}"))
                .unwrap_or_default()
        )
    };
    emit(&text)
}

/// This machine, as discovery sees it.
fn local(args: &TopoArgs) -> Result<(), Failure> {
    let machine =
        discover::discover().map_err(|e| Failure::other(format!("discovery failed: {e}")))?;
    tracing::info!(host = machine.hostname, "discovered the local machine");
    let text = if args.json {
        serde_json::to_string_pretty(&machine)
            .map_err(|e| Failure::other(format!("cannot write JSON: {e}")))?
            + "\n"
    } else {
        machine.render_tree()
    };
    emit(&text)
}
