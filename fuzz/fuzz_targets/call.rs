//! The call descriptor decoder: any 64 bits a peer sends with a message (the shm cell
//! header's `call`, libfabric's remote CQ data, the in-process record) decode to a
//! description and, against any other descriptor, to the words of a mismatch that
//! name both ranks — or agree. Never a panic; agreement is symmetric, and equal
//! descriptors (poison bit aside) always agree.

#![no_main]

use halo_collectives::Call;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: (u64, u64, u32, u32)| {
    let (a, b, ra, rb) = data;
    let (ra, rb) = (ra as usize % (1 << 20), rb as usize % (1 << 20));
    let (ca, cb) = (Call::from_raw(a), Call::from_raw(b));
    let _ = ca.describe();
    let _ = ca.byte_count();
    let _ = ca.kind();
    assert_eq!(ca.agrees(cb), cb.agrees(ca), "agreement is not symmetric");
    assert!(
        ca.agrees(ca.poison()),
        "a call disagrees with its own poison"
    );
    match Call::mismatch((ra, ca), (rb, cb)) {
        None => assert!(ca.agrees(cb)),
        Some(words) => {
            assert!(!ca.agrees(cb));
            assert!(
                words.contains(&format!("rank {ra}")) && words.contains(&format!("rank {rb}")),
                "the words do not name both ranks: {words}"
            );
            if ra != rb {
                assert_eq!(
                    Some(words),
                    Call::mismatch((rb, cb), (ra, ca)),
                    "not the same words on both ranks"
                );
            }
        }
    }
});
