//! Point-to-point: untagged and tagged send/recv.

use super::*;

// ---------------------------------------------------------------- point-to-point

#[test]
fn send_recv_ring() {
    for n in [2usize, 3, 5, 8] {
        run_ok(&flat(n), |comm| {
            let (me, n) = (comm.rank(), comm.size());
            let (right, left) = ((me + 1) % n, (me + n - 1) % n);
            // send_recv posts both at once: no ordering needed.
            for k in 0..4 {
                let len = [5, 0, 1, 33][k];
                let send = payload(me, right, k, len);
                let mut recv = vec![u32::MAX; len];
                comm.send_recv(&send, right, &mut recv, left)?;
                assert_eq!(recv, payload(left, me, k, len), "send_recv round {k}");
            }
            // Blocking send and recv: rank 0 sends first, the others receive first.
            for k in 4..7 {
                let send = payload(me, right, k, 9);
                let mut recv = vec![u32::MAX; 9];
                if me == 0 {
                    comm.send(&send, right)?;
                    comm.recv(&mut recv, left)?;
                } else {
                    comm.recv(&mut recv, left)?;
                    comm.send(&send, right)?;
                }
                assert_eq!(recv, payload(left, me, k, 9), "send/recv round {k}");
            }
            Ok(())
        });
    }
}

#[test]
fn send_recv_pairs_in_order_between_collectives() {
    let lens = [3usize, 0, 1000, 0, 1, 17];
    run_ok(&Topology::preset("nodes:2x4").unwrap(), |comm| {
        let me = comm.rank();
        let peer = me ^ 1;
        // Even ranks send, odd ranks receive: the k-th receive takes the k-th message
        // (lengths differ, so a mismatch would be an error).
        if me % 2 == 0 {
            for (k, &len) in lens.iter().enumerate() {
                comm.send(&payload(me, peer, k, len), peer)?;
            }
        } else {
            for (k, &len) in lens.iter().enumerate() {
                let mut got = vec![u32::MAX; len];
                comm.recv(&mut got, peer)?;
                assert_eq!(got, payload(peer, me, k, len), "message {k}");
            }
        }
        // Collectives in between: point-to-point tags never meet collective tags.
        comm.barrier()?;
        let n = comm.size();
        let send: Vec<u64> = (0..n as u64).map(|q| me as u64 * 100 + q).collect();
        let mut recv = vec![0u64; n];
        comm.all_to_all(&send, &mut recv)?;
        assert_eq!(
            recv,
            (0..n as u64)
                .map(|q| q * 100 + me as u64)
                .collect::<Vec<_>>()
        );
        // And back, the other way; the counts go on from where they were.
        if me % 2 == 1 {
            for (k, &len) in lens.iter().enumerate() {
                comm.send(&payload(me, peer, k + 10, len), peer)?;
            }
        } else {
            for (k, &len) in lens.iter().enumerate() {
                let mut got = vec![u32::MAX; len];
                comm.recv(&mut got, peer)?;
                assert_eq!(got, payload(peer, me, k + 10, len), "reply {k}");
            }
        }
        let mut all = vec![0u32; n];
        comm.all_gather(&[me as u32], &mut all)?;
        assert_eq!(all, (0..n as u32).collect::<Vec<_>>());
        Ok(())
    });
}

#[test]
fn zero_length_messages_match() {
    run_ok(&flat(2), |comm| {
        let me = comm.rank();
        let empty: [f64; 0] = [];
        if me == 0 {
            comm.send(&empty, 1)?;
            comm.send(&[1.5f64, 2.5], 1)?;
            comm.send(&empty, 1)?;
        } else {
            let mut none: [f64; 0] = [];
            comm.recv(&mut none, 0)?;
            let mut two = [0f64; 2];
            comm.recv(&mut two, 0)?;
            assert_eq!(two, [1.5, 2.5]);
            comm.recv(&mut none, 0)?;
        }
        // Zero-length exchange both ways at once.
        let mut none: [u8; 0] = [];
        comm.send_recv(&[0u8; 0], 1 - me, &mut none, 1 - me)?;
        comm.barrier()
    });
}

#[test]
fn messages_to_self() {
    run_ok(&flat(3), |comm| {
        let me = comm.rank();
        comm.send(&[me as u16, 7], me)?;
        comm.send(&[9u16], me)?;
        let mut a = [0u16; 2];
        comm.recv(&mut a, me)?;
        assert_eq!(a, [me as u16, 7]);
        // A wrong length is refused and the message stays.
        let mut wrong = [0u16; 3];
        let e = comm.recv(&mut wrong, me).unwrap_err();
        assert!(matches!(e, Error::InvalidUsage { .. }), "{e}");
        let mut b = [0u16; 1];
        comm.recv(&mut b, me)?;
        assert_eq!(b, [9]);
        let e = comm.recv(&mut b, me).unwrap_err();
        assert!(matches!(e, Error::InvalidUsage { .. }), "{e}");
        // send_recv with itself.
        let mut c = [0u32; 2];
        comm.send_recv(&[1u32, 2], me, &mut c, me)?;
        assert_eq!(c, [1, 2]);
        Ok(())
    });
}

#[test]
fn p2p_length_mismatch_is_an_error_on_both_sides() {
    let out = local::run(&flat(2), Emulation::off(), |comm| {
        comm.set_timeout(Duration::from_secs(10));
        if comm.rank() == 0 {
            comm.send(&[1u32, 2, 3, 4], 1)
        } else {
            let mut three = [0u32; 3];
            comm.recv(&mut three, 0)
        }
    });
    for (r, x) in out.iter().enumerate() {
        let e = x.as_ref().unwrap_err();
        assert!(matches!(e, Error::InvalidUsage { .. }), "rank {r}: {e}");
    }
}

#[test]
fn p2p_timeout_names_the_peer() {
    let timeout = Duration::from_millis(300);
    let out = local::run(&flat(3), Emulation::off(), |comm| {
        comm.set_timeout(timeout);
        let t0 = Instant::now();
        match comm.rank() {
            0 => {
                let mut buf = [0u8; 4];
                let e = comm.recv(&mut buf, 1).unwrap_err();
                Ok((Some(e), t0.elapsed()))
            }
            2 => {
                let e = comm.send(&[1u8, 2], 1).unwrap_err();
                Ok((Some(e), t0.elapsed()))
            }
            _ => {
                // Stays (its endpoint alive) well past the others' timeout, sending nothing.
                std::thread::sleep(timeout * 5);
                Ok((None, t0.elapsed()))
            }
        }
    });
    for r in [0, 2] {
        let (e, took) = out[r].as_ref().unwrap();
        let e = e.as_ref().unwrap();
        assert!(
            matches!(e, Error::Timeout { peer: Some(1), .. }),
            "rank {r}: {e}"
        );
        assert!(e.to_string().contains("rank 1"), "rank {r}: {e}");
        assert!(
            *took >= timeout && *took < timeout * 4,
            "rank {r} took {took:?}"
        );
    }
}

#[test]
fn p2p_bad_peer_is_an_argument_error() {
    run_ok(&flat(2), |comm| {
        let e = comm.send(&[1u8], 2).unwrap_err();
        assert!(
            matches!(e, Error::InvalidArgument { peer: Some(2), .. }),
            "{e}"
        );
        let mut b = [0u8];
        let e = comm.recv(&mut b, 5).unwrap_err();
        assert!(
            matches!(e, Error::InvalidArgument { peer: Some(5), .. }),
            "{e}"
        );
        comm.barrier()
    });
}

// ---------------------------------------------------------------- tagged point-to-point

#[test]
fn tagged_messages_match_per_tag_in_order() {
    for n in [2usize, 3, 5] {
        run_ok(&flat(n), |comm| {
            let (me, n) = (comm.rank(), comm.size());
            let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
            // Interleaved tags, each with its own message numbers, and zero-length ones.
            let plan: [(u32, usize); 6] = [
                (3, 5),
                (0, 2),
                (3, 0),
                (halo::MAX_USER_TAG, 4),
                (3, 7),
                (0, 1),
            ];
            for (k, &(tag, len)) in plan.iter().enumerate() {
                let out = payload(me, next, k, len);
                let mut got = vec![0u32; len];
                if me % 2 == 0 {
                    comm.send_tagged(&out, next, tag)?;
                    comm.recv_tagged(&mut got, prev, tag)?;
                } else {
                    comm.recv_tagged(&mut got, prev, tag)?;
                    comm.send_tagged(&out, next, tag)?;
                }
                assert_eq!(
                    got,
                    payload(prev, me, k, len),
                    "n={n} rank {me} message {k}"
                );
            }
            // A tag out of range is an argument error, before anything is sent.
            let e = comm
                .send_tagged(&[1u8], next, halo::MAX_USER_TAG + 1)
                .unwrap_err();
            assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
            assert!(e.to_string().contains("tag 16777216 out of range"), "{e}");
            let e = comm.recv_tagged(&mut [0u8], prev, u32::MAX).unwrap_err();
            assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
            // Untagged calls are tag 0: they pair with tagged calls of tag 0.
            if me % 2 == 0 {
                comm.send(&[me as u16], next)?;
                let mut b = [0u16];
                comm.recv_tagged(&mut b, prev, 0)?;
                assert_eq!(b[0], prev as u16);
            } else {
                let mut b = [0u16];
                comm.recv_tagged(&mut b, prev, 0)?;
                comm.send(&[me as u16], next)?;
                assert_eq!(b[0], prev as u16);
            }
            Ok(())
        });
    }
}

#[test]
fn tagged_messages_to_self_match_by_tag() {
    run_ok(&flat(2), |comm| {
        let me = comm.rank();
        comm.send_tagged(&[1u8, 1], me, 1)?;
        comm.send_tagged(&[2u8], me, 2)?;
        comm.send_tagged(&[3u8, 3, 3], me, 1)?;
        let mut b = [0u8];
        comm.recv_tagged(&mut b, me, 2)?;
        assert_eq!(b, [2]);
        let e = comm.recv_tagged(&mut b, me, 5).unwrap_err();
        assert!(matches!(e, Error::InvalidUsage { .. }), "{e}");
        let mut b = [0u8; 2];
        comm.recv_tagged(&mut b, me, 1)?;
        assert_eq!(b, [1, 1]);
        let mut b = [0u8; 3];
        comm.recv_tagged(&mut b, me, 1)?;
        assert_eq!(b, [3, 3, 3]);
        Ok(())
    });
}

#[test]
fn a_receive_with_another_tag_does_not_take_the_message() {
    let out = local::run(&flat(2), Emulation::off(), |comm| {
        comm.set_timeout(Duration::from_secs(10));
        if comm.rank() == 0 {
            comm.send_tagged(&[42u32, 43], 1, 8)?;
            return Ok(None);
        }
        comm.set_timeout(Duration::from_millis(300));
        let mut b = [0u32; 2];
        let e = comm.recv_tagged(&mut b, 0, 9).unwrap_err();
        assert_eq!(
            b,
            [0, 0],
            "a message with tag 8 landed in a receive with tag 9"
        );
        comm.set_timeout(Duration::from_secs(10));
        comm.recv_tagged(&mut b, 0, 8)?;
        assert_eq!(b, [42, 43]);
        Ok(Some(e))
    });
    let e = out[1].as_ref().unwrap().as_ref().unwrap();
    assert!(matches!(e, Error::Timeout { .. }), "{e}");
    assert!(out[0].is_ok(), "{:?}", out[0]);
}
