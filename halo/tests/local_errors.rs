//! Errors of the communicator on the in-process transport: every failure is an error
//! on every rank involved, within the timeout — never a hang.

mod local_common;

use halo::local::{self, Emulation};
use halo::topology::Topology;
use halo::{Algorithm, Error, Partition};
use std::sync::mpsc;
use std::time::{Duration, Instant};

fn topo(spec: &str) -> Topology {
    Topology::preset(spec).unwrap()
}

/// Packed displacements for `counts`.
fn packed(counts: &[usize]) -> Vec<usize> {
    let mut d = vec![0; counts.len()];
    for q in 1..counts.len() {
        d[q] = d[q - 1] + counts[q - 1];
    }
    d
}

/// Rank 0 sends two elements to rank 2, which expects one: both get InvalidUsage naming
/// each other and both counts; the others get an error too, all within the timeout.
#[test]
fn count_mismatch_is_invalid_usage_on_every_rank() {
    let t = topo("nodes:2x2");
    let n = t.size();
    for alg in [
        None,
        Some(Algorithm::Flat),
        Some(Algorithm::Pairwise),
        Some(Algorithm::Halo),
    ] {
        let start = Instant::now();
        let out = local::run(&t, Emulation::off(), |comm| {
            comm.set_timeout(Duration::from_secs(10));
            comm.set_algorithm(alg);
            let me = comm.rank();
            let mut send_counts = vec![1usize; n];
            if me == 0 {
                send_counts[2] = 2;
            }
            let recv_counts = vec![1usize; n];
            let send = vec![me as u32; send_counts.iter().sum()];
            let mut recv = vec![0u32; n];
            let r = comm.all_to_all_v(
                &send,
                &Partition::new(&send_counts, &packed(&send_counts)),
                &mut recv,
                &Partition::new(&recv_counts, &packed(&recv_counts)),
            );
            // The communicator stays usable: the next collective matches on every rank.
            let ok_counts = vec![1usize; n];
            let ok_displs = packed(&ok_counts);
            let send = vec![me as u32; n];
            comm.all_to_all_v(
                &send,
                &Partition::new(&ok_counts, &ok_displs),
                &mut recv,
                &Partition::new(&ok_counts, &ok_displs),
            )?;
            assert_eq!(recv, (0..n as u32).collect::<Vec<_>>());
            Ok(r)
        });
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "took {:?}",
            start.elapsed()
        );
        let errs: Vec<Error> = out
            .into_iter()
            .map(|r| {
                r.expect("second call succeeds")
                    .expect_err("first call fails")
            })
            .collect();
        for (r, e) in errs.iter().enumerate() {
            println!("{alg:?} rank {r}: {e}");
            assert!(matches!(e, Error::InvalidUsage { .. }), "rank {r}: {e:?}");
            assert_eq!(e.code(), 5);
        }
        assert_eq!(errs[0].peer(), Some(2));
        assert_eq!(errs[2].peer(), Some(0));
        for e in [&errs[0], &errs[2]] {
            let m = e.to_string();
            assert!(
                m.contains("8 bytes") && m.contains("4 bytes"),
                "both counts named: {m}"
            );
        }
    }
}

/// Overlapping and in-place buffers are InvalidArgument before any communication.
#[test]
fn overlapping_buffers_are_invalid_argument() {
    let t = topo("nodes:2x2");
    let n = t.size();
    let out = local::run(&t, Emulation::off(), |comm| {
        comm.set_timeout(Duration::from_secs(2));
        let mut mem = vec![0u8; 4 * n * 8];
        let base = mem.as_mut_ptr();
        let mut errs = Vec::new();
        // SAFETY: both ranges lie inside `mem` (8 * n bytes each from offsets 0, 4 and 0);
        // the call rejects the overlap before making references to the memory.
        unsafe {
            errs.push(halo::c_abi::all_to_all(comm, base, base.add(4), 8, 1).unwrap_err());
            errs.push(halo::c_abi::all_to_all(comm, base, base, 2, 4).unwrap_err());
            let counts = vec![2usize; n];
            let displs = packed(&counts);
            errs.push(
                halo::c_abi::all_to_all_v(
                    comm,
                    base,
                    &Partition::new(&counts, &displs),
                    base.add(3),
                    &Partition::new(&counts, &displs),
                    4,
                )
                .unwrap_err(),
            );
        }
        Ok(errs)
    });
    for (r, x) in out.into_iter().enumerate() {
        for e in x.unwrap() {
            // Uniform calls fail locally; the v call fails locally on every rank too.
            assert!(
                matches!(e, Error::InvalidArgument { .. }),
                "rank {r}: {e:?}"
            );
            assert!(e.to_string().contains("overlap"), "{e}");
        }
    }
}

/// A displacement that overflows is InvalidArgument naming the peer on that rank, and
/// an error, not a hang, on the others.
#[test]
fn displacement_overflow_names_the_peer() {
    let t = topo("nodes:2x2");
    let n = t.size();
    let start = Instant::now();
    let out = local::run(&t, Emulation::off(), |comm| {
        comm.set_timeout(Duration::from_secs(10));
        let me = comm.rank();
        let counts = vec![1usize; n];
        let mut send_displs = packed(&counts);
        if me == 1 {
            send_displs[3] = usize::MAX;
        }
        let send = vec![1u64; n];
        let mut recv = vec![0u64; n];
        Ok(comm.all_to_all_v(
            &send,
            &Partition::new(&counts, &send_displs),
            &mut recv,
            &Partition::new(&counts, &packed(&counts)),
        ))
    });
    assert!(start.elapsed() < Duration::from_secs(5));
    for (r, x) in out.into_iter().enumerate() {
        let e = x.unwrap().unwrap_err();
        println!("rank {r}: {e}");
        if r == 1 {
            assert!(
                matches!(e, Error::InvalidArgument { peer: Some(3), .. }),
                "{e:?}"
            );
            assert!(e.to_string().contains("overflows"), "{e}");
        } else {
            assert!(
                matches!(e, Error::InvalidUsage { peer: Some(1), .. }),
                "rank {r}: {e:?}"
            );
        }
    }
}

/// Blocks outside the buffer, wrong lengths, wrong numbers of counts.
#[test]
fn bad_lengths_are_invalid_argument() {
    let t = topo("flat:3");
    let n = t.size();
    let out = local::run(&t, Emulation::off(), |comm| {
        comm.set_timeout(Duration::from_secs(10));
        let mut errs = Vec::new();
        let mut recv = vec![0u16; 6];
        errs.push(comm.all_to_all(&[0u16; 5], &mut recv).unwrap_err()); // lengths differ
        let mut recv5 = vec![0u16; 5];
        errs.push(comm.all_to_all(&[0u16; 5], &mut recv5).unwrap_err()); // not a multiple of 3
        let c = vec![1usize; n];
        let d = packed(&c);
        let send = vec![0u16; n];
        // Too few counts.
        errs.push(
            comm.all_to_all_v(
                &send,
                &Partition::new(&c[..2], &d),
                &mut recv,
                &Partition::new(&c, &d),
            )
            .unwrap_err(),
        );
        // A block past the end of the receive buffer.
        let mut short = vec![0u16; 2];
        errs.push(
            comm.all_to_all_v(
                &send,
                &Partition::new(&c, &d),
                &mut short,
                &Partition::new(&c, &d),
            )
            .unwrap_err(),
        );
        // Overlapping receive blocks.
        let same = vec![0usize; n];
        errs.push(
            comm.all_to_all_v(
                &send,
                &Partition::new(&c, &d),
                &mut recv,
                &Partition::new(&c, &same),
            )
            .unwrap_err(),
        );
        Ok(errs)
    });
    for (r, x) in out.into_iter().enumerate() {
        let errs = x.unwrap();
        for (i, e) in errs.iter().enumerate() {
            println!("rank {r} case {i}: {e}");
            assert!(
                matches!(e, Error::InvalidArgument { .. }),
                "rank {r} case {i}: {e:?}"
            );
            assert_eq!(e.code(), 4);
        }
        assert_eq!(
            errs[3].peer(),
            Some(2),
            "the block from rank 2 is the one outside"
        );
    }
}

/// One rank never calls: the others time out, naming it.
#[test]
fn timeout_names_the_missing_peer() {
    let t = topo("nodes:2x2");
    let n = t.size();
    let timeout = Duration::from_millis(300);
    let out = local::run(&t, Emulation::off(), |comm| {
        comm.set_timeout(timeout);
        if comm.rank() == 1 {
            std::thread::sleep(timeout * 4);
            return Ok(None);
        }
        let start = Instant::now();
        let send = vec![1u8; n * 16];
        let mut recv = vec![0u8; n * 16];
        let e = comm.all_to_all(&send, &mut recv).unwrap_err();
        Ok(Some((e, start.elapsed())))
    });
    for (r, x) in out.into_iter().enumerate() {
        let Some((e, took)) = x.unwrap() else {
            continue;
        };
        println!("rank {r} after {took:?}: {e}");
        assert!(
            matches!(e, Error::Timeout { peer: Some(1), .. }),
            "rank {r}: {e:?}"
        );
        assert!(e.to_string().contains("rank 1"), "{e}");
        assert!(
            took >= timeout && took < timeout * 3,
            "rank {r} took {took:?}"
        );
    }
}

/// `abort` from another thread makes a blocked call return Aborted within a second,
/// and later calls too.
#[test]
fn abort_from_another_thread() {
    let t = topo("nodes:2x2");
    let n = t.size();
    let (tx, rx) = mpsc::channel::<(usize, halo::AbortHandle)>();
    std::thread::scope(|s| {
        let aborter = s.spawn(move || {
            let handles: Vec<_> = rx.iter().take(n - 1).collect();
            std::thread::sleep(Duration::from_millis(200));
            let at = Instant::now();
            for (_, h) in &handles {
                h.abort();
            }
            at
        });
        let out = local::run(&t, Emulation::off(), |comm| {
            comm.set_timeout(Duration::from_secs(30));
            if comm.rank() == 3 {
                std::thread::sleep(Duration::from_millis(1500));
                return Ok(None);
            }
            tx.send((comm.rank(), comm.abort_handle())).unwrap();
            let send = vec![1u8; n];
            let mut recv = vec![0u8; n];
            let e = comm.all_to_all(&send, &mut recv).unwrap_err();
            let done = Instant::now();
            let again = comm.all_to_all(&send, &mut recv).unwrap_err();
            assert!(comm.is_aborted());
            Ok(Some((e, again, done)))
        });
        let aborted_at = aborter.join().unwrap();
        for (r, x) in out.into_iter().enumerate() {
            let Some((e, again, done)) = x.unwrap() else {
                continue;
            };
            println!("rank {r}: {e}");
            assert!(matches!(e, Error::Aborted { .. }), "rank {r}: {e:?}");
            assert_eq!(e.code(), 9);
            assert!(matches!(again, Error::Aborted { .. }));
            let took = done.duration_since(aborted_at);
            assert!(
                took < Duration::from_secs(1),
                "rank {r} returned {took:?} after the abort"
            );
        }
    });
}

/// A rank that dies (panics) is reported by its peers as a remote error, long before
/// their timeout.
#[test]
fn dead_peer_is_a_remote_error() {
    let t = topo("nodes:2x2");
    let n = t.size();
    let start = Instant::now();
    let out = local::run(&t, Emulation::off(), |comm| {
        comm.set_timeout(Duration::from_secs(20));
        if comm.rank() == 2 {
            panic!("rank 2 dies on purpose");
        }
        let send = vec![1u32; n];
        let mut recv = vec![0u32; n];
        comm.all_to_all(&send, &mut recv)
    });
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "took {:?}",
        start.elapsed()
    );
    for (r, x) in out.into_iter().enumerate() {
        let e = x.unwrap_err();
        println!("rank {r}: {e}");
        if r == 2 {
            assert!(matches!(e, Error::InternalError { .. }) && e.to_string().contains("panicked"));
        } else {
            assert!(
                matches!(e, Error::RemoteError { peer: 2, .. }),
                "rank {r}: {e:?}"
            );
        }
    }
}

/// Ranks that disagree on the block size of a uniform all-to-all get an error, not
/// wrong bytes or a hang.
#[test]
fn uniform_size_mismatch_is_an_error() {
    let t = topo("flat:2");
    let out = local::run(&t, Emulation::off(), |comm| {
        comm.set_timeout(Duration::from_secs(5));
        comm.set_algorithm(Some(Algorithm::Flat));
        let count = if comm.rank() == 0 { 4 } else { 8 };
        let send = vec![1u8; 2 * count];
        let mut recv = vec![0u8; 2 * count];
        Ok(comm.all_to_all(&send, &mut recv))
    });
    for (r, x) in out.into_iter().enumerate() {
        let e = x.unwrap().unwrap_err();
        println!("rank {r}: {e}");
        assert!(
            matches!(e, Error::InvalidUsage { .. } | Error::RemoteError { .. }),
            "rank {r}: {e:?}"
        );
    }
}

/// The C result codes keep NCCL's numbering.
#[test]
fn error_codes_follow_nccl() {
    let cases: [(Error, i32, &str); 9] = [
        (
            Error::UnhandledDeviceError {
                message: String::new(),
            },
            1,
            "UnhandledDeviceError",
        ),
        (
            Error::SystemError {
                message: String::new(),
            },
            2,
            "SystemError",
        ),
        (
            Error::InternalError {
                message: String::new(),
            },
            3,
            "InternalError",
        ),
        (
            Error::InvalidArgument {
                peer: None,
                message: String::new(),
            },
            4,
            "InvalidArgument",
        ),
        (
            Error::InvalidUsage {
                peer: None,
                message: String::new(),
            },
            5,
            "InvalidUsage",
        ),
        (
            Error::RemoteError {
                peer: 0,
                message: String::new(),
            },
            6,
            "RemoteError",
        ),
        (Error::InProgress, 7, "InProgress"),
        (
            Error::Timeout {
                peer: None,
                step: None,
                waited: Duration::ZERO,
                message: String::new(),
            },
            8,
            "Timeout",
        ),
        (
            Error::Aborted {
                message: String::new(),
            },
            9,
            "Aborted",
        ),
    ];
    for (e, code, name) in cases {
        assert_eq!(e.code(), code);
        assert_eq!(Error::code_name(code), name);
    }
    assert_eq!(Error::code_name(0), "Success");
    let c: Error = halo::collectives::CollectiveError::Timeout {
        algorithm: "flat",
        step: 3,
        peer: Some(5),
        what: "recv".into(),
        waited: Duration::from_millis(1),
    }
    .into();
    assert!(matches!(
        c,
        Error::Timeout {
            peer: Some(5),
            step: Some(3),
            ..
        }
    ));
    let topo_err: Error = Topology::preset("nodes:0x1").unwrap_err().into();
    assert_eq!(topo_err.code(), 4);
}

/// A communicator moves to its thread; the abort handle is shared between threads.
#[test]
fn communicator_is_send_and_abort_handle_is_sync() {
    fn send<T: Send>() {}
    fn sync<T: Send + Sync>() {}
    send::<halo::Communicator>();
    sync::<halo::AbortHandle>();
    sync::<Error>();
}
