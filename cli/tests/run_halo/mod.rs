//! What the tests that run the `halo` tool as a program share: running it, its output as
//! text, and the checks for success and for a given exit status.
#![allow(dead_code)] // each test file uses a part

use std::path::PathBuf;
use std::process::{Command, Output};

/// Runs `halo ARGS` (without `HALO_DEBUG`, so stderr holds only what the command says).
pub(crate) fn halo(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_halo"))
        .args(args)
        .env_remove("HALO_DEBUG")
        .output()
        .expect("run halo")
}

pub(crate) fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).expect("UTF-8 stdout")
}

pub(crate) fn stderr(o: &Output) -> String {
    String::from_utf8(o.stderr.clone()).expect("UTF-8 stderr")
}

/// Runs `halo ARGS` expecting success; returns stdout.
#[track_caller]
pub(crate) fn ok(args: &[&str]) -> String {
    let o = halo(args);
    assert!(
        o.status.success(),
        "halo {args:?}: {:?}\n{}",
        o.status,
        stderr(&o)
    );
    stdout(&o)
}

/// Runs `halo ARGS` expecting exit status `code` and no panic; returns stderr.
#[track_caller]
pub(crate) fn fails_with(code: i32, args: &[&str]) -> String {
    let o = halo(args);
    let err = stderr(&o);
    assert_eq!(
        o.status.code(),
        Some(code),
        "halo {args:?}\nstdout: {}\nstderr: {err}",
        stdout(&o)
    );
    assert!(!err.contains("panicked"), "{err}");
    err
}

/// A fresh directory `target/tmp/GROUP/TEST`.
pub(crate) fn scratch(group: &str, test: &str) -> PathBuf {
    halo_test_support::scratch(env!("CARGO_TARGET_TMPDIR"), group, test)
}
