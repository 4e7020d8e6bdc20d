//! Text forms of bytes that the transports and the layers above share: bytes in
//! lower-case hexadecimal and back (how a bootstrap card carries fabric addresses, and
//! how a fabric endpoint names an address in its errors).

/// `bytes` in lower-case hexadecimal (how a card carries fabric addresses).
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The bytes `s` spells in hexadecimal, two digits each (see [`hex`]); `None` if it
/// does not.
pub(crate) fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok())
        .collect()
}
