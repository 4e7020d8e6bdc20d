//! The rendezvous's wire constants and its two primitives (the proof's HMAC and the
//! nonces), shared by the rank's side (`rendezvous.rs`) and the root's (`root.rs`);
//! the wire format itself is described in `rendezvous.rs`.

use super::{Secret, sys_err};
use crate::error::Result;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::time::Duration;

pub(super) const HELLO_MAGIC: &[u8; 4] = b"HALB";
pub(super) const ROOT_MAGIC: &[u8; 4] = b"HALR";
pub(super) const VERSION: u8 = 2;
pub(super) const NONCE: usize = 32;
pub(super) const PROOF: usize = 32;
pub(super) const ROOT_LABEL: &[u8] = b"halo-bootstrap-root";
pub(super) const RANK_LABEL: &[u8] = b"halo-bootstrap-rank";
pub(super) const ANSWER_LABEL: &[u8] = b"halo-bootstrap-answer";

type HmacSha256 = Hmac<Sha256>;

/// `H(label, parts...)`: HMAC-SHA256 keyed with the job's secret.
pub(super) fn mac(secret: &Secret, label: &[u8], parts: &[&[u8]]) -> HmacSha256 {
    let mut m = HmacSha256::new_from_slice(secret).expect("HMAC takes a key of any length");
    m.update(label);
    for p in parts {
        m.update(p);
    }
    m
}

/// A fresh random nonce.
pub(super) fn nonce() -> Result<[u8; NONCE]> {
    let mut n = [0u8; NONCE];
    getrandom::fill(&mut n).map_err(|e| {
        sys_err(format!(
            "cannot get random bytes for a bootstrap nonce: {e}"
        ))
    })?;
    Ok(n)
}

/// Largest payload one rank may send.
pub(super) const MAX_PAYLOAD: usize = 16 << 20;
/// How long the root waits for one connection's hello and proof (in total), and for
/// each read of a proved rank's payload.
pub(super) const HELLO_TIMEOUT: Duration = Duration::from_secs(5);
