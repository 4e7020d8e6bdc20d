//! Ring stress: two ranks as threads, each with its own mapping of one segment with
//! tiny rings (wrap-around many times over, full rings both ways at once, messages
//! many times larger than the ring, receives posted in another order than the sends,
//! zero-length messages), byte-exact; and the refusals (size mismatch, poison).

use super::{Segment, ShmTransport};
use halo_collectives::{Buf, Buffers, CollectiveError, Region, Session, Transport};
use std::time::{Duration, Instant};

/// Message lengths around the cell payload of 32 bytes and far beyond the ring.
const LENS: &[usize] = &[0, 1, 31, 32, 33, 64, 65, 100, 1000, 5000, 0, 7, 20_000];

fn pattern(rank: usize, round: usize, i: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|k| (rank * 131 + round * 31 + i * 7 + k * 13 + k / 256) as u8)
        .collect()
}

/// Two transports of one segment of `slots` cells of `cell` bytes per ring.
fn pair(slots: usize, cell: usize) -> (ShmTransport, ShmTransport) {
    let a = Segment::create_with(2, slots, cell).unwrap();
    let b = Segment::open_when_ready(a.path(), 2, Duration::from_secs(5), || false).unwrap();
    // Each waits until both attached: on two threads.
    std::thread::scope(|s| {
        let hb = s.spawn(|| ShmTransport::new(1, 2, b, vec![None, None]).unwrap());
        let ta = ShmTransport::new(0, 2, a, vec![None, None]).unwrap();
        (ta, hb.join().unwrap())
    })
}

/// Drives `s` until every token in `want` completed (or fails after 20 s).
fn complete(s: &mut impl Session, want: usize) -> Result<(), CollectiveError> {
    let mut done = Vec::new();
    let start = Instant::now();
    while done.len() < want {
        s.progress(&mut done)?;
        if done.len() < want {
            assert!(start.elapsed() < Duration::from_secs(20), "stuck: {done:?}");
            s.wait(Duration::from_micros(200))?;
        }
    }
    done.sort_unstable();
    done.dedup();
    assert_eq!(done.len(), want, "a token completed twice");
    Ok(())
}

/// One round on one rank: send every message of [`LENS`] to the peer and receive
/// the peer's, receives posted in reverse order (`reverse`) or in order.
fn round(t: &mut ShmTransport, r: usize, reverse: bool) {
    let me = t.rank();
    let peer = 1 - me;
    let send: Vec<u8> = LENS
        .iter()
        .enumerate()
        .flat_map(|(i, &l)| pattern(me, r, i, l))
        .collect();
    let total: usize = LENS.iter().sum();
    let mut recv = vec![0xeeu8; total];
    let offsets: Vec<usize> = LENS
        .iter()
        .scan(0, |o, &l| {
            let at = *o;
            *o += l;
            Some(at)
        })
        .collect();
    {
        let bufs = Buffers {
            send: &send,
            recv: &mut recv,
            scratch: &mut [],
            block: None,
        };
        let mut s = t.begin((r as u64) << 48, bufs).unwrap();
        let mut order: Vec<usize> = (0..LENS.len()).collect();
        if reverse {
            order.reverse();
        }
        for &i in &order {
            let region = Region::new(Buf::Recv, offsets[i], LENS[i]);
            s.post_recv(peer, i as u64, region, 1000 + i as u32)
                .unwrap();
        }
        for (i, &l) in LENS.iter().enumerate() {
            let region = Region::new(Buf::Send, offsets[i], l);
            s.post_send(peer, i as u64, region, i as u32).unwrap();
        }
        complete(&mut s, 2 * LENS.len()).unwrap();
    }
    for (i, &l) in LENS.iter().enumerate() {
        assert_eq!(
            &recv[offsets[i]..offsets[i] + l],
            &pattern(peer, r, i, l)[..],
            "rank {me} round {r} message {i} ({l} bytes)"
        );
    }
}

#[test]
fn tiny_rings_wrap_fill_and_pass_messages_larger_than_the_ring() {
    // 2 cells of 64 bytes (32 of payload): every message above 64 bytes is larger
    // than the ring; 40 rounds wrap the ring's counters hundreds of times.
    for (slots, cell) in [(2, 64), (3, 128), (32, 8192)] {
        let (mut a, mut b) = pair(slots, cell);
        std::thread::scope(|s| {
            s.spawn(|| {
                for r in 0..40 {
                    round(&mut a, r, r % 2 == 0);
                }
            });
            s.spawn(|| {
                for r in 0..40 {
                    round(&mut b, r, r % 3 == 0);
                }
            });
        });
        assert!(a.broken.is_none() && b.broken.is_none());
        assert!(a.unexpected.is_empty() && b.unexpected.is_empty());
    }
}

#[test]
fn a_message_of_another_length_is_a_mismatch_naming_both_sizes() {
    // Room for the whole message (4 x 32 bytes): the send completes eagerly.
    let (mut a, mut b) = pair(4, 64);
    std::thread::scope(|s| {
        s.spawn(|| {
            let send = vec![5u8; 100];
            let bufs = Buffers {
                send: &send,
                recv: &mut [],
                scratch: &mut [],
                block: None,
            };
            let mut s = a.begin(0, bufs).unwrap();
            s.post_send(1, 3, Region::new(Buf::Send, 0, 100), 0)
                .unwrap();
            complete(&mut s, 1).unwrap();
        });
        s.spawn(|| {
            let mut recv = vec![0u8; 60];
            let bufs = Buffers {
                send: &[],
                recv: &mut recv,
                scratch: &mut [],
                block: None,
            };
            let mut s = b.begin(0, bufs).unwrap();
            s.post_recv(0, 3, Region::new(Buf::Recv, 0, 60), 0).unwrap();
            match complete(&mut s, 1) {
                Err(CollectiveError::Mismatch { peer, message }) => {
                    assert_eq!(peer, 0);
                    assert!(
                        message.contains("100 bytes") && message.contains("expected 60 bytes"),
                        "{message}"
                    );
                }
                other => panic!("expected a mismatch, got {other:?}"),
            }
        });
    });
    // The receiver's transport is broken now; the sender's is not.
    assert!(b.broken.is_some());
    assert!(a.broken.is_none());
    let bufs = Buffers {
        send: &[],
        recv: &mut [],
        scratch: &mut [],
        block: None,
    };
    assert!(matches!(
        b.begin(1 << 48, bufs),
        Err(CollectiveError::InvalidUsage(_))
    ));
}

#[test]
fn poison_fails_the_receive_it_replaces_and_blocks_must_agree() {
    let (mut a, mut b) = pair(4, 128);
    {
        let bufs = Buffers {
            send: &[1, 2, 3, 4],
            recv: &mut [],
            scratch: &mut [],
            block: Some(4),
        };
        let mut s = a.begin(0, bufs).unwrap();
        s.post_poison(1, 9).unwrap();
        // Same length, other block size: refused too.
        s.post_send(1, 10, Region::new(Buf::Send, 0, 4), 0).unwrap();
        complete(&mut s, 1).unwrap();
    }
    let mut recv = [0u8; 8];
    let bufs = Buffers {
        send: &[],
        recv: &mut recv,
        scratch: &mut [],
        block: Some(2),
    };
    let mut s = b.begin(0, bufs).unwrap();
    // Both arrive before their receives are posted: checked at post time.
    std::thread::sleep(Duration::from_millis(10));
    let mut sink = Vec::new();
    s.progress(&mut sink).unwrap();
    match s.post_recv(0, 9, Region::new(Buf::Recv, 0, 4), 0) {
        Err(CollectiveError::Mismatch { peer: 0, message }) => {
            assert!(message.contains("failed this collective"), "{message}")
        }
        other => panic!("expected poison, got {other:?}"),
    }
    match s.post_recv(0, 10, Region::new(Buf::Recv, 4, 4), 1) {
        Err(CollectiveError::Mismatch { peer: 0, message }) => assert!(
            message.contains("blocks of 4 bytes") && message.contains("with 2 bytes"),
            "{message}"
        ),
        other => panic!("expected a block mismatch, got {other:?}"),
    }
}
