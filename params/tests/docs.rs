//! `docs/PARAMETERS.md` is what `halo_params::markdown` generates, and no source of the
//! workspace reads a `HALO_*` variable by name instead of through the table.
//!
//! To update the committed table after changing a declaration:
//!
//! ```sh
//! HALO_REGEN_DOCS=1 cargo test -p halo-params --test docs
//! ```

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[test]
fn committed_table_is_up_to_date() {
    let path = root().join("docs/PARAMETERS.md");
    let generated = halo_params::markdown();
    if std::env::var_os("HALO_REGEN_DOCS").is_some() {
        std::fs::write(&path, &generated).expect("writing docs/PARAMETERS.md");
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "docs/PARAMETERS.md is not what halo-params generates; regenerate it with\n    \
         HALO_REGEN_DOCS=1 cargo test -p halo-params --test docs\nand commit the result"
    );
}

/// The `.rs` files of the workspace's libraries and tools: not their tests (`tests/`,
/// `tests.rs`, `testing.rs`), examples or benchmarks (test programs have variables of
/// their own), not this crate, not build output.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        if p.is_dir() {
            if !matches!(
                name.as_str(),
                "target"
                    | "tests"
                    | "examples"
                    | "benches"
                    | "fuzz"
                    | ".git"
                    | "python"
                    | "docs"
                    | "params"
                    | "test-support"
            ) {
                sources(&p, out);
            }
        } else if name.ends_with(".rs") && name != "tests.rs" && name != "testing.rs" {
            out.push(p);
        }
    }
}

#[test]
fn no_source_reads_a_halo_variable_by_name() {
    let mut files = Vec::new();
    sources(&root(), &mut files);
    assert!(
        files.len() > 50,
        "found only {} sources under {}",
        files.len(),
        root().display()
    );
    let mut offenders = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap_or_default();
        for (n, line) in text.lines().enumerate() {
            for pat in ["env::var(\"HALO_", "env::var_os(\"HALO_", ".get(\"HALO_"] {
                if line.contains(pat) {
                    offenders.push(format!("{}:{}: {}", f.display(), n + 1, line.trim()));
                }
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "read these through halo_params (declare the variable there):\n{}",
        offenders.join("\n")
    );
}

#[test]
fn every_variable_the_sources_name_is_declared() {
    // A `"HALO_..."` string literal in a library source is a variable it reads or sets
    // for another process; each must be in the table.
    let mut files = Vec::new();
    sources(&root(), &mut files);
    let mut missing = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap_or_default();
        for (i, _) in text.match_indices("\"HALO_") {
            let name: String = text[i + 1..]
                .chars()
                .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            let whole = name.len() > "HALO_".len() && text[i + 1 + name.len()..].starts_with('"');
            if whole && halo_params::find(&name).is_none() {
                missing.push(format!("{}: {name}", f.display()));
            }
        }
    }
    missing.sort();
    missing.dedup();
    assert!(
        missing.is_empty(),
        "not declared in halo-params:\n{}",
        missing.join("\n")
    );
}
