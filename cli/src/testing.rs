//! What the test suites share about tests that cannot run everywhere.
//!
//! Some tests need root (network namespaces), Open MPI, `setpriv` or numpy. Without them a
//! developer's run prints why and skips; with `HALO_REQUIRE_ALL=1` (set by `.ci/run` and by
//! `scripts/test.sh` when run as root, after `scripts/deps.sh test` installed everything)
//! such a test fails instead, naming what was missing, so that a CI run can never pass by
//! skipping.

/// The switch: `HALO_REQUIRE_ALL=1` turns every skip into a failure.
pub const REQUIRE_ALL: &str = "HALO_REQUIRE_ALL";

/// Whether every test must run (`HALO_REQUIRE_ALL=1`).
pub fn all_required() -> bool {
    std::env::var(REQUIRE_ALL).as_deref() == Ok("1")
}

/// Skips the calling test, printing `why`; under `HALO_REQUIRE_ALL=1` fails it instead.
///
/// # Panics
/// When [`all_required`]: the test cannot run here and must not pass as skipped.
pub fn skip(why: &str) {
    assert!(
        !all_required(),
        "{REQUIRE_ALL}=1 but this test cannot run here: {why}"
    );
    eprintln!("skipped: {why} (set {REQUIRE_ALL}=1 to make this a failure)");
}
