//! Broadcast, gather and scatter.

use super::*;
use halo::BroadcastAlgorithm;

// ---------------------------------------------------------------- broadcast, gather, scatter

#[test]
fn broadcast_every_root_size_and_algorithm() {
    for n in 1usize..=9 {
        for alg in [
            None,
            Some(BroadcastAlgorithm::Binomial),
            Some(BroadcastAlgorithm::Chain),
        ] {
            run_ok(&flat(n), |comm| {
                comm.set_broadcast_algorithm(alg);
                let me = comm.rank();
                for root in 0..n {
                    // 0 bytes, a few, and 80 KB (two chunks of the chain).
                    for len in [0usize, 1, 7, 20_000] {
                        let want = payload(root, 99, len % 64, len);
                        let mut buf = if me == root {
                            want.clone()
                        } else {
                            vec![0xA5A5_A5A5u32; len]
                        };
                        comm.broadcast(&mut buf, root)?;
                        assert!(buf == want, "n={n} {alg:?} root {root} len {len} rank {me}");
                    }
                }
                let e = comm.broadcast(&mut [0u8; 4], n).unwrap_err();
                assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
                assert!(e.to_string().contains("root"), "{e}");
                Ok(())
            });
        }
    }
}

#[test]
fn gather_and_scatter_every_root_and_size() {
    for n in 1usize..=9 {
        run_ok(&flat(n), |comm| {
            let me = comm.rank();
            for root in 0..n {
                for len in [0usize, 1, 5, 3000] {
                    let send = payload(me, root, 1, len);
                    let mut recv = if me == root {
                        vec![0xA5A5_A5A5u32; n * len]
                    } else {
                        Vec::new()
                    };
                    comm.gather(&send, &mut recv, root)?;
                    if me == root {
                        let want: Vec<u32> =
                            (0..n).flat_map(|q| payload(q, root, 1, len)).collect();
                        assert!(recv == want, "gather n={n} root {root} len {len}");
                    }
                    let send: Vec<u32> = if me == root {
                        (0..n).flat_map(|q| payload(root, q, 2, len)).collect()
                    } else {
                        Vec::new()
                    };
                    let mut recv = vec![0xA5A5_A5A5u32; len];
                    comm.scatter(&send, &mut recv, root)?;
                    assert!(
                        recv == payload(root, me, 2, len),
                        "scatter n={n} root {root} len {len}"
                    );
                }
            }
            // Wrong sizes at the root (found there only: checked on one rank), a root
            // out of range (on every rank): argument errors, and the next call matches.
            if n == 1 {
                let e = comm.gather(&[1u32; 2], &mut [0u32; 3], 0).unwrap_err();
                assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
                let e = comm.scatter(&[1u32; 3], &mut [0u32; 2], 0).unwrap_err();
                assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
                assert!(e.to_string().contains("expected 1 ranks x 8 bytes"), "{e}");
            }
            let e = comm.gather(&[1u32], &mut [0u32], n + 3).unwrap_err();
            assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
            let e = comm.scatter(&[1u32], &mut [0u32], n).unwrap_err();
            assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
            let mut all = vec![0u32; n];
            comm.all_gather(&[me as u32], &mut all)?;
            assert_eq!(all, (0..n as u32).collect::<Vec<_>>());
            Ok(())
        });
    }
}

#[test]
fn rooted_count_mismatch_is_an_error_never_a_hang() {
    for n in [2usize, 3, 5] {
        let start = Instant::now();
        let out = run_all(n, Duration::from_secs(2), |comm| {
            let me = comm.rank();
            let len = if me == n - 1 { 3 } else { 2 };
            let mut buf = vec![7u16; len];
            let b = comm.broadcast(&mut buf, 0);
            let mut recv = vec![0u16; if me == 0 { n * 2 } else { 0 }];
            let g = comm.gather(&vec![1u16; len], &mut recv, 0);
            Ok((b, g))
        });
        // The rank that differs and the one it exchanges with fail; nobody hangs.
        let last = out[n - 1].as_ref().unwrap();
        assert!(last.0.is_err() && last.1.is_err(), "n={n}: {last:?}");
        let root = out[0].as_ref().unwrap();
        assert!(
            root.1.is_err(),
            "n={n}: the gather's root returned normally"
        );
        assert!(
            start.elapsed() < Duration::from_secs(8),
            "n={n}: {:?}",
            start.elapsed()
        );
    }
}
