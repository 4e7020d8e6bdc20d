//! The bootstrap root's side of the handshake: any bytes a connection sends (a
//! stranger's, in any chunks) are refused or, only when they carry a valid proof of the
//! job's secret, joined with a payload no larger than the limit. Never a panic.
//!
//! The first byte's low bit asks the harness to forge the proof over the header the
//! input gives (as a rank that knows the secret would), so that the payload stage and
//! the header checks are reached too; without it nothing may join.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (forge, bytes) = match data.split_first() {
        Some((&f, rest)) => (f & 1 == 1, rest),
        None => (false, data),
    };
    let joined = halo::root_handshake_for_fuzzing(bytes, forge);
    assert!(
        forge || !joined,
        "a connection that did not prove the secret joined"
    );
});
