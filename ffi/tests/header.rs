//! `ffi/include/halo.h` is what cbindgen generates from this crate.
//!
//! The header is committed so that C users need no Rust tooling to read it; this test
//! regenerates it into memory and fails when the committed file differs (CI runs it).
//! To update the committed header after changing the API or its doc comments:
//!
//! ```sh
//! HALO_REGEN_HEADER=1 cargo test -p halo-ffi --test header
//! ```

use std::path::{Path, PathBuf};

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn header_path() -> PathBuf {
    crate_dir().join("include/halo.h")
}

/// The header as cbindgen generates it now.
fn generate() -> String {
    let dir = crate_dir();
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml"))
        .unwrap_or_else(|e| panic!("reading cbindgen.toml: {e}"));
    let bindings = cbindgen::Builder::new()
        .with_crate(&dir)
        .with_config(config)
        .generate()
        .unwrap_or_else(|e| panic!("cbindgen failed: {e}"));
    let mut out = Vec::new();
    bindings.write(&mut out);
    String::from_utf8(out).expect("cbindgen writes UTF-8")
}

/// The first line where `a` and `b` differ, for the failure message.
fn first_difference(a: &str, b: &str) -> String {
    let (mut la, mut lb) = (a.lines(), b.lines());
    for n in 1.. {
        match (la.next(), lb.next()) {
            (Some(x), Some(y)) if x == y => continue,
            (None, None) => return "no line differs (line endings?)".into(),
            (x, y) => {
                return format!(
                    "line {n}:\n  committed: {}\n  generated: {}",
                    x.unwrap_or("<end of file>"),
                    y.unwrap_or("<end of file>")
                );
            }
        }
    }
    unreachable!()
}

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
}

#[test]
fn committed_header_is_up_to_date() {
    let generated = generate();
    let path = header_path();
    if std::env::var_os("HALO_REGEN_HEADER").is_some() {
        write(&path, &generated);
        eprintln!("wrote {}", path.display());
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "ffi/include/halo.h is not what cbindgen generates from the halo-ffi crate (first difference at \
         {}).\nRegenerate it with:\n    HALO_REGEN_HEADER=1 cargo test -p halo-ffi --test header\n\
         and commit the result.",
        first_difference(&committed, &generated)
    );
}

#[test]
fn header_names_the_whole_api() {
    let h = generate();
    for name in [
        "haloGetVersion",
        "haloGetUniqueId",
        "haloCommInitRank(",
        "haloCommInitRankConfig",
        "haloCommInitFromEnv",
        "haloCommDestroy",
        "haloCommAbort",
        "haloCommGetAsyncError",
        "haloCommCount",
        "haloCommUserRank",
        "haloCommSplit",
        "haloAllToAll(",
        "haloAllToAllv(",
        "haloSend(",
        "haloRecv(",
        "haloAllReduce(",
        "haloAllGather(",
        "haloBarrier(",
        "haloGetErrorString",
        "haloGetLastError",
        "haloTopologyJson",
        "HALO_CONFIG_INITIALIZER",
        "typedef int32_t haloResult_t;",
        "typedef int32_t haloDataType_t;",
        "haloBfloat16 = 9",
        "haloAborted = 9",
    ] {
        assert!(h.contains(name), "ffi/include/halo.h lacks {name}");
    }
}
