//! Real tagged ping-pong between two endpoints in one process, over `shm` and over
//! `tcp;ofi_rxm` on 127.0.0.1: 1 MiB, 1 byte, 0 bytes and an odd size, byte-exact, with the
//! receive pre-posted and -FI_EAGAIN retried while both completion queues are read; and
//! messages that arrive before their receive is posted.

mod common;

use common::{Pair, Provider, SHM, TCP, pattern};
use halo_fabric_sys::FI_ADDR_UNSPEC;

const MIB: usize = 1 << 20;

fn pingpong(p: &Provider, always_register: bool) {
    let mut pair =
        Pair::open(p, MIB, always_register).unwrap_or_else(|e| panic!("{}: open: {e}", p.name));
    let sizes = [MIB, 1, 0, 4097, 1, MIB];
    for (round, &len) in sizes.iter().enumerate() {
        let tag = 0x4841_4c4f_0000_0000 | (round as u64) << 8;
        // ping: 0 -> 1
        pattern(round as u64, &mut pair.eps[0].send_buf[..len]);
        pair.eps[1].recv_buf.fill(0xee);
        pair.transfer(0, len, tag)
            .unwrap_or_else(|e| panic!("{} ping {len} B: {e}", p.name));
        assert!(
            pair.eps[1].recv_buf[..len] == pair.eps[0].send_buf[..len],
            "{} ping {len} B: payload differs",
            p.name
        );
        assert!(
            pair.eps[1].recv_buf[len..].iter().all(|&b| b == 0xee),
            "{} ping {len} B: wrote past the message",
            p.name
        );
        // pong: 1 echoes it back to 0 with another tag
        let (head, tail) = pair.eps.split_at_mut(1);
        tail[0].send_buf[..len].copy_from_slice(&tail[0].recv_buf[..len]);
        head[0].recv_buf.fill(0x11);
        pair.transfer(1, len, tag | 1)
            .unwrap_or_else(|e| panic!("{} pong {len} B: {e}", p.name));
        assert!(
            pair.eps[0].recv_buf[..len] == pair.eps[0].send_buf[..len],
            "{} pong {len} B: payload differs",
            p.name
        );
    }
    eprintln!(
        "{} ({}): ping-pong of {sizes:?} bytes byte-exact; mr_mode {:#x}; registered {}; \
         -FI_EAGAIN from fi_tsend {} times, from fi_trecv {} times",
        p.name,
        pair.eps[0].provider,
        pair.eps[0].mr_mode,
        pair.eps[0].registered,
        pair.send_eagain,
        pair.recv_eagain
    );
}

#[test]
fn shm_tagged_pingpong_is_byte_exact() {
    pingpong(&SHM, false);
}

#[test]
fn tcp_rxm_tagged_pingpong_is_byte_exact() {
    pingpong(&TCP, false);
}

/// Neither provider here asks for FI_MR_LOCAL; register anyway so that fi_mr_reg and
/// fi_mr_desc and descriptors on the data path are exercised as they will be on `cxi`.
#[test]
fn shm_tagged_pingpong_with_registered_buffers() {
    pingpong(&SHM, true);
}

#[test]
fn tcp_rxm_tagged_pingpong_with_registered_buffers() {
    pingpong(&TCP, true);
}

/// Sends posted before the matching receive (an "unexpected" message: a peer that is ahead)
/// are delivered intact once the receive is posted; small ones are buffered eagerly, 1 MiB
/// ones wait for the receive (their send completes only then).
fn late_receive(p: &Provider) {
    let mut pair = Pair::open(p, MIB, false).unwrap_or_else(|e| panic!("{}: open: {e}", p.name));
    // Warm the connection first so the first send is not stuck in -FI_EAGAIN.
    pair.transfer(0, 1, 1).unwrap();
    for (round, &len) in [1, MIB, 0, 4096, MIB].iter().enumerate() {
        pattern(100 + round as u64, &mut pair.eps[0].send_buf[..len]);
        pair.eps[1].recv_buf.fill(0);
        pair.transfer_with(0, len, 0x77 << 40 | round as u64, true)
            .unwrap_or_else(|e| panic!("{} late receive of {len} B: {e}", p.name));
        assert!(
            pair.eps[1].recv_buf[..len] == pair.eps[0].send_buf[..len],
            "{} late receive of {len} B: payload differs",
            p.name
        );
    }
    // The peer addresses from the AV are table indices: 0 for the only peer.
    assert_eq!(pair.peer, [0, 0]);
    assert_ne!(pair.peer[0], FI_ADDR_UNSPEC);
}

#[test]
fn shm_unexpected_message_matches_late_receive() {
    late_receive(&SHM);
}

#[test]
fn tcp_rxm_unexpected_message_matches_late_receive() {
    late_receive(&TCP);
}
