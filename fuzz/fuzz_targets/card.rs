//! The bootstrap card decoder: any bytes a peer (or an impostor) sends as its card are
//! refused with an error that names the rank and the field, or accepted as a card that
//! encodes to bytes which decode to the same card. Never a panic.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The first byte picks the rank the card claims to come from.
    let (rank, bytes) = match data.split_first() {
        Some((&r, rest)) => (usize::from(r), rest),
        None => (0, data),
    };
    match halo::decode_card_for_fuzzing(rank, bytes) {
        Err(e) => {
            let message = e.to_string();
            assert!(
                message.contains(&format!("rank {rank}'s bootstrap card")),
                "the error does not name the rank: {message}"
            );
        }
        Ok(encoded) => {
            let again = halo::decode_card_for_fuzzing(rank, &encoded).unwrap_or_else(|e| {
                panic!(
                    "an accepted card, encoded again, is refused: {e}\n{}",
                    String::from_utf8_lossy(&encoded)
                )
            });
            assert_eq!(again, encoded, "encode(decode(card)) is not stable");
        }
    }
});
