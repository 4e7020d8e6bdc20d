//! `halo params`: every `HALO_*` environment variable with its value here (the table
//! of `halo-params`, as `ucx_info -c` prints UCX's).

use super::{Failure, emit};
use clap::Args;
use std::fmt::Write as _;

/// `halo params [NAME...]`.
#[derive(Debug, Args)]
#[command(
    after_help = "Secrets are shown as (set), never their value. docs/PARAMETERS.md \
                        is the same table with each variable's bounds and default."
)]
pub(crate) struct ParamsArgs {
    /// Only these variables (with or without the HALO_ prefix).
    names: Vec<String>,
    /// Only the variables set in this environment.
    #[arg(long)]
    set: bool,
}

/// Prints the table.
pub(crate) fn run(args: &ParamsArgs) -> Result<(), Failure> {
    let mut chosen: Vec<&halo_params::Param> = Vec::new();
    for n in &args.names {
        let name = if n.starts_with("HALO_") {
            n.clone()
        } else {
            format!("HALO_{}", n.to_ascii_uppercase())
        };
        chosen.push(halo_params::find(&name).ok_or_else(|| {
            Failure::input(format!(
                "{name} is not a HALO parameter (halo params lists them)"
            ))
        })?);
    }
    if chosen.is_empty() {
        chosen = halo_params::ALL.iter().collect();
    }
    if args.set {
        chosen.retain(|p| p.is_set());
    }
    emit(&table(&chosen))
}

/// One line per parameter: name, value here, default, what it does; grouped by reader.
fn table(params: &[&halo_params::Param]) -> String {
    let width = params.iter().map(|p| p.name.len()).max().unwrap_or(0);
    let mut out = String::new();
    let mut section = None;
    for p in params {
        if section != Some(p.reader) {
            section = Some(p.reader);
            let _ = writeln!(out, "# {}", p.reader.title());
        }
        let _ = write!(
            out,
            "{:width$}  {}  (default {}; {})",
            p.name,
            p.display_value(),
            p.default,
            p.doc,
        );
        // A number that does not parse or is out of bounds is flagged here, before a
        // job trips over it.
        match (p.kind, p.number()) {
            (halo_params::Kind::Number { .. }, Err(e)) => {
                let _ = writeln!(out, "  BAD: {e}");
            }
            _ => out.push('\n'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_parameter_has_a_line_under_its_section() {
        let all: Vec<&halo_params::Param> = halo_params::ALL.iter().collect();
        let text = table(&all);
        for p in halo_params::ALL {
            assert!(
                text.lines().any(|l| l.starts_with(p.name)),
                "{} missing",
                p.name
            );
        }
        assert!(text.starts_with("# Communicator\n"), "{text}");
    }
}
