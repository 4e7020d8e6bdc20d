//! What the C and Python tests share: where the repository and this build's library are.

use std::path::PathBuf;

/// The repository root.
pub(crate) fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .unwrap()
}

/// Where cargo put `libhalo.so` and `libhalo.a` for this test: the test binary's own
/// directory (`target/<profile>/deps`), where the library this test depends on is
/// rebuilt whenever its sources change.
pub(crate) fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().to_path_buf();
    assert!(
        dir.join("libhalo.so").is_file(),
        "libhalo.so is not in {} (cargo builds it for this test as the halo-ffi cdylib)",
        dir.display()
    );
    dir
}
