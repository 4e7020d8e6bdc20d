//! Point-to-point, all-gather, all-reduce and split on the in-process transport: real
//! threads, real bytes.
//!
//! - send/recv: rings and pairs, several messages in order (zero-length ones among
//!   them), messages to self, a length mismatch, and a timeout that names the peer;
//! - all-gather: every algorithm for 1, 2, 3, 5 and 8 ranks, byte-exact;
//! - all-reduce: every element type x operation x rank count in {1,2,3,4,5,7,8} x
//!   length in {0,1,7,1000}, both algorithms and the automatic choice, exact against a
//!   reference (integer-valued data, so every order of summation is exact), and bitwise
//!   equal on every rank for random floats;
//! - split: by parity and by halves with reversed keys, all-to-all on the children,
//!   children and parent used alternately, no color (`None`), nested splits, concurrent
//!   use refused, communicator ids released on drop.

mod local_common;

use halo::local::{self, Emulation};
use halo::topology::Topology;
use halo::{
    AllGatherAlgorithm, AllReduceAlgorithm, Communicator, Error, ReduceOp, Reducible, bf16, f16,
};
use local_common::{Rng, buildable};
use std::fmt::Debug;
use std::time::{Duration, Instant};

/// Runs `f` on every rank of `topo` with a 30 s timeout and returns the results,
/// failing the test with every rank's error.
fn run_ok<R: Send>(
    topo: &Topology,
    f: impl Fn(&mut Communicator) -> halo::Result<R> + Sync,
) -> Vec<R> {
    let out = local::run(topo, Emulation::off(), |comm| {
        comm.set_timeout(Duration::from_secs(30));
        f(comm)
    });
    let errors: Vec<String> = out
        .iter()
        .enumerate()
        .filter_map(|(r, x)| x.as_ref().err().map(|e| format!("rank {r}: {e}")))
        .collect();
    assert!(errors.is_empty(), "{}:\n{}", topo.name(), errors.join("\n"));
    out.into_iter().map(|x| x.expect("checked")).collect()
}

fn flat(n: usize) -> Topology {
    Topology::preset(&format!("flat:{n}")).unwrap()
}

/// A payload that names its sender, receiver, message number and position.
fn payload(src: usize, dst: usize, k: usize, len: usize) -> Vec<u32> {
    (0..len)
        .map(|i| (src as u32) << 24 | (dst as u32) << 16 | (k as u32) << 10 | i as u32)
        .collect()
}

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

// ---------------------------------------------------------------- all-gather

#[test]
fn all_gather_is_byte_exact() {
    for n in [1usize, 2, 3, 5, 8] {
        let forced = [None].into_iter().chain(AllGatherAlgorithm::ALL.map(Some));
        for alg in forced {
            run_ok(&flat(n), |comm| {
                comm.set_all_gather_algorithm(alg);
                let me = comm.rank();
                for count in [0usize, 1, 7, 100, 3000] {
                    let send: Vec<u8> = (0..count).map(|i| (me * 31 + i * 7) as u8).collect();
                    let mut recv = vec![0xEEu8; n * count];
                    comm.all_gather(&send, &mut recv)?;
                    for q in 0..n {
                        let want: Vec<u8> = (0..count).map(|i| (q * 31 + i * 7) as u8).collect();
                        assert_eq!(
                            &recv[q * count..(q + 1) * count],
                            &want[..],
                            "{alg:?} n={n} count={count} block {q}"
                        );
                    }
                    // Wider elements and a repeat on the cached schedule.
                    let send: Vec<f64> = (0..count).map(|i| me as f64 * 1e6 + i as f64).collect();
                    let mut recv = vec![-1f64; n * count];
                    comm.all_gather(&send, &mut recv)?;
                    comm.all_gather(&send, &mut recv)?;
                    for (k, v) in recv.iter().enumerate() {
                        assert_eq!(
                            *v,
                            (k / count.max(1)) as f64 * 1e6 + (k % count.max(1)) as f64
                        );
                    }
                }
                Ok(())
            });
        }
    }
}

#[test]
fn all_gather_checks_lengths() {
    run_ok(&flat(3), |comm| {
        let mut recv = vec![0u32; 5];
        let e = comm.all_gather(&[1u32, 2], &mut recv).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
        // The failed call took its sequence number on every rank: the next one matches.
        let mut recv = vec![0u32; 6];
        comm.all_gather(&[1u32, 2], &mut recv)?;
        assert_eq!(recv, [1, 2, 1, 2, 1, 2]);
        Ok(())
    });
}

// ---------------------------------------------------------------- all-reduce

trait TestElem: Reducible + PartialEq + Debug + Send + Sync {
    const NAME: &'static str;
    /// Unsigned types get inputs shifted to 0..=16, so that max and min compare alike.
    const UNSIGNED: bool;
    fn from_i64(v: i64) -> Self;
    /// The average of ranks whose exact sum is `sum`: `sum / n` in the element type.
    fn avg(sum: i64, n: usize) -> Self;
}

macro_rules! test_elem {
    ($t:ty, $name:expr, $unsigned:expr, $conv:expr, $avg:expr) => {
        impl TestElem for $t {
            const NAME: &'static str = $name;
            const UNSIGNED: bool = $unsigned;
            fn from_i64(v: i64) -> Self {
                $conv(v)
            }
            fn avg(sum: i64, n: usize) -> Self {
                $avg(sum, n)
            }
        }
    };
}
test_elem!(f32, "f32", false, |v| v as f32, |s, n| s as f32 / n as f32);
test_elem!(f64, "f64", false, |v| v as f64, |s, n| s as f64 / n as f64);
test_elem!(i8, "i8", false, |v| v as i8, |s: i64, n| (s / n as i64)
    as i8);
test_elem!(u8, "u8", true, |v| v as u8, |s: i64, n| (s / n as i64)
    as u8);
test_elem!(i32, "i32", false, |v| v as i32, |s: i64, n| (s / n as i64)
    as i32);
test_elem!(u32, "u32", true, |v| v as u32, |s: i64, n| (s / n as i64)
    as u32);
test_elem!(i64, "i64", false, |v| v, |s: i64, n| s / n as i64);
test_elem!(u64, "u64", true, |v| v as u64, |s: i64, n| (s / n as i64)
    as u64);
test_elem!(bf16, "bf16", false, |v| bf16::from_f32(v as f32), |s, n| {
    bf16::from_f32(s as f32 / n as f32)
});
test_elem!(f16, "f16", false, |v| f16::from_f32(v as f32), |s, n| {
    f16::from_f32(s as f32 / n as f32)
});

/// Small integers in -8..=8: sums over 8 ranks stay exact even in bf16 (8 bits) and
/// int8. For products, -2..=2 (powers of two: exact in every float type; integer
/// products wrap alike in i64 and in the element type).
fn input(rank: usize, i: usize, salt: usize, op: ReduceOp) -> i64 {
    let h = rank * 7 + i * 3 + salt * 5;
    match op {
        ReduceOp::Prod => [1, -1, 2, -2, 1, 2][h % 6],
        _ => (h % 17) as i64 - 8,
    }
}

/// The input of `rank` for element type `E`.
fn input_for<E: TestElem>(rank: usize, i: usize, salt: usize, op: ReduceOp) -> i64 {
    let v = input(rank, i, salt, op);
    if E::UNSIGNED && op != ReduceOp::Prod {
        v + 8
    } else {
        v
    }
}

/// The reduction of `op` over every rank's input at element `i`, in the element type.
fn reference<E: TestElem>(n: usize, i: usize, salt: usize, op: ReduceOp) -> E {
    let vals = (0..n).map(|r| input_for::<E>(r, i, salt, op));
    match op {
        ReduceOp::Sum => E::from_i64(vals.sum()),
        ReduceOp::Prod => E::from_i64(vals.product()),
        ReduceOp::Max => E::from_i64(vals.max().unwrap()),
        ReduceOp::Min => E::from_i64(vals.min().unwrap()),
        _ => E::avg(vals.sum(), n),
    }
}

/// Every operation.
const OPS: [ReduceOp; 5] = [
    ReduceOp::Sum,
    ReduceOp::Prod,
    ReduceOp::Max,
    ReduceOp::Min,
    ReduceOp::Avg,
];

/// Every op x length for one element type; returns the failures.
fn reduce_all_ops<E: TestElem>(comm: &mut Communicator, salt: usize) -> halo::Result<Vec<String>> {
    let (me, n) = (comm.rank(), comm.size());
    let mut fails = Vec::new();
    for op in OPS {
        for len in [0usize, 1, 7, 1000] {
            let send: Vec<E> = (0..len)
                .map(|i| E::from_i64(input_for::<E>(me, i, salt, op)))
                .collect();
            let want: Vec<E> = (0..len).map(|i| reference::<E>(n, i, salt, op)).collect();
            let mut recv = vec![E::from_i64(99); len];
            comm.all_reduce(&send, &mut recv, op)?;
            if recv != want {
                let i = (0..len).find(|&i| recv[i] != want[i]).unwrap();
                fails.push(format!(
                    "rank {me}: {} {op:?} len {len}: element {i} is {:?}, want {:?}",
                    E::NAME,
                    recv[i],
                    want[i]
                ));
            }
            let mut inplace = send.clone();
            comm.all_reduce_in_place(&mut inplace, op)?;
            if inplace != want {
                fails.push(format!(
                    "rank {me}: {} {op:?} len {len}: in place differs",
                    E::NAME
                ));
            }
        }
    }
    Ok(fails)
}

#[test]
fn all_reduce_every_type_op_and_size() {
    for n in [1usize, 2, 3, 4, 5, 7, 8] {
        for alg in [
            None,
            Some(AllReduceAlgorithm::RecursiveDoubling),
            Some(AllReduceAlgorithm::Rabenseifner),
        ] {
            let fails = run_ok(&flat(n), |comm| {
                comm.set_all_reduce_algorithm(alg);
                let mut f = reduce_all_ops::<f32>(comm, 1)?;
                f.extend(reduce_all_ops::<f64>(comm, 2)?);
                f.extend(reduce_all_ops::<i32>(comm, 3)?);
                f.extend(reduce_all_ops::<i64>(comm, 4)?);
                f.extend(reduce_all_ops::<bf16>(comm, 5)?);
                f.extend(reduce_all_ops::<f16>(comm, 6)?);
                f.extend(reduce_all_ops::<i8>(comm, 7)?);
                f.extend(reduce_all_ops::<u8>(comm, 8)?);
                f.extend(reduce_all_ops::<u32>(comm, 9)?);
                f.extend(reduce_all_ops::<u64>(comm, 10)?);
                Ok(f)
            });
            let fails: Vec<String> = fails.into_iter().flatten().collect();
            assert!(fails.is_empty(), "n={n} {alg:?}:\n{}", fails.join("\n"));
        }
    }
}

#[test]
fn all_reduce_floats_are_bitwise_equal_on_every_rank() {
    for n in [3usize, 5, 6, 8] {
        for alg in AllReduceAlgorithm::ALL {
            let out = run_ok(&flat(n), |comm| {
                comm.set_all_reduce_algorithm(Some(alg));
                let mut rng = Rng::new(comm.rank() as u64 * 977 + 13);
                let len = 1001;
                let send: Vec<f32> = (0..len)
                    .map(|_| (rng.next_u64() >> 40) as f32 * 1e-3 - 8000.0)
                    .collect();
                let mut sum = vec![0f32; len];
                comm.all_reduce(&send, &mut sum, ReduceOp::Sum)?;
                let send64: Vec<f64> = send.iter().map(|&x| f64::from(x) / 3.0).collect();
                let mut sum64 = vec![0f64; len];
                comm.all_reduce(&send64, &mut sum64, ReduceOp::Sum)?;
                let halves: Vec<bf16> = send.iter().map(|&x| bf16::from_f32(x / 7.0)).collect();
                let mut hsum = vec![bf16::ZERO; len];
                comm.all_reduce(&halves, &mut hsum, ReduceOp::Sum)?;
                Ok((send, sum, sum64, hsum))
            });
            for (r, o) in out.iter().enumerate().skip(1) {
                assert!(
                    o.1.iter()
                        .zip(&out[0].1)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "n={n} {alg}: f32 sum on rank {r} differs from rank 0"
                );
                assert!(
                    o.2.iter()
                        .zip(&out[0].2)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "n={n} {alg}: f64 sum on rank {r} differs from rank 0"
                );
                assert!(
                    o.3.iter()
                        .zip(&out[0].3)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "n={n} {alg}: bf16 sum on rank {r} differs from rank 0"
                );
            }
            // Close to the exact sum: within the usual bound for n - 1 roundings.
            for i in 0..out[0].0.len() {
                let exact: f64 = out.iter().map(|o| f64::from(o.0[i])).sum();
                let scale: f64 = out.iter().map(|o| f64::from(o.0[i]).abs()).sum();
                let got = f64::from(out[0].1[i]);
                let bound = n as f64 * f64::from(f32::EPSILON) * scale;
                assert!(
                    (got - exact).abs() <= bound,
                    "n={n} {alg}: {got} vs {exact}"
                );
            }
        }
    }
}

#[test]
fn all_reduce_nan_and_checks() {
    run_ok(&flat(3), |comm| {
        let me = comm.rank();
        let send = [if me == 1 { f32::NAN } else { me as f32 }, me as f32];
        let mut max = [0f32; 2];
        comm.all_reduce(&send, &mut max, ReduceOp::Max)?;
        assert!(max[0].is_nan());
        assert_eq!(max[1], 2.0);
        let mut short = [0f32; 1];
        let e = comm
            .all_reduce(&send, &mut short, ReduceOp::Sum)
            .unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
        // Integer sums wrap.
        let mut s = [0i32];
        comm.all_reduce(&[i32::MAX], &mut s, ReduceOp::Sum)?;
        assert_eq!(s[0], i32::MAX.wrapping_mul(3));
        Ok(())
    });
}

// ---------------------------------------------------------------- split

/// A uniform all-to-all on `comm`, byte-exact, with every algorithm that builds on its
/// topology and the automatic choice.
fn check_all_to_all(comm: &mut Communicator, salt: u32) -> halo::Result<()> {
    let (me, n) = (comm.rank() as u32, comm.size() as u32);
    let algs = [None]
        .into_iter()
        .chain(buildable(comm.topology()).into_iter().map(Some));
    for alg in algs {
        comm.set_algorithm(alg);
        let count = 3u32;
        let send: Vec<u32> = (0..n * count).map(|k| salt << 24 | me << 16 | k).collect();
        let mut recv = vec![u32::MAX; (n * count) as usize];
        comm.all_to_all(&send, &mut recv)?;
        for q in 0..n {
            for i in 0..count {
                let want = salt << 24 | q << 16 | (me * count + i);
                assert_eq!(
                    recv[(q * count + i) as usize],
                    want,
                    "{alg:?} rank {me} from {q}"
                );
            }
        }
    }
    comm.set_algorithm(None);
    Ok(())
}

#[test]
fn split_by_parity_and_by_half_with_reversed_keys() {
    run_ok(&Topology::preset("nodes:2x4").unwrap(), |comm| {
        let me = comm.rank();
        // Parity, reversed: color 0 = {6, 4, 2, 0}, color 1 = {7, 5, 3, 1}.
        let mut parity = comm
            .split(Some((me % 2) as u32), -(me as i32))?
            .expect("a color");
        assert_eq!(parity.size(), 4);
        assert_eq!(parity.rank(), 3 - me / 2);
        assert_eq!(parity.topology().size(), 4);
        // Halves, reversed: color 0 = {3, 2, 1, 0}, color 1 = {7, 6, 5, 4}.
        let mut half = comm
            .split(Some((me / 4) as u32), 100 - me as i32)?
            .expect("a color");
        assert_eq!(half.size(), 4);
        assert_eq!(half.rank(), 3 - me % 4);
        check_all_to_all(&mut parity, 1)?;
        check_all_to_all(&mut half, 2)?;
        // Who is who: an all-gather of parent ranks in child order.
        let mut who = vec![0u32; 4];
        parity.all_gather(&[me as u32], &mut who)?;
        let first = (me % 2) as u32;
        assert_eq!(who, [6 + first, 4 + first, 2 + first, first]);
        half.all_gather(&[me as u32], &mut who)?;
        let base = (me / 4 * 4) as u32;
        assert_eq!(who, [base + 3, base + 2, base + 1, base]);
        check_all_to_all(comm, 3)?;
        Ok(())
    });
}

#[test]
fn child_and_parent_used_alternately() {
    run_ok(&Topology::preset("nodes:2x4").unwrap(), |comm| {
        let (me, n) = (comm.rank(), comm.size());
        let mut child = comm
            .split(Some((me % 2) as u32), me as i32)?
            .expect("a color");
        let cme = child.rank();
        for round in 0..3u32 {
            // Parent all-reduce, child all-reduce, parent and child point-to-point,
            // child all-to-all, parent barrier — in one thread, interleaved.
            let mut total = [0i64];
            comm.all_reduce(&[me as i64 + i64::from(round)], &mut total, ReduceOp::Sum)?;
            assert_eq!(
                total[0],
                (n * (n - 1) / 2) as i64 + i64::from(round) * n as i64
            );
            let mut ctotal = [0i64];
            child.all_reduce(&[me as i64], &mut ctotal, ReduceOp::Sum)?;
            assert_eq!(ctotal[0], if me % 2 == 0 { 12 } else { 16 });
            // The child's rank cme is the parent's rank 2 * cme + me % 2; both talk to
            // the "same" peers by different numbers.
            let cpeer = cme ^ 1;
            let ppeer = 2 * cpeer + me % 2;
            let mut got = [0u32; 2];
            child.send_recv(&[me as u32, round], cpeer, &mut got, cpeer)?;
            assert_eq!(got, [ppeer as u32, round]);
            comm.send_recv(&[me as u32 + 100, round], ppeer, &mut got, ppeer)?;
            assert_eq!(got, [ppeer as u32 + 100, round]);
            check_all_to_all(&mut child, round)?;
            comm.barrier()?;
        }
        Ok(())
    });
}

#[test]
fn nocolor_gives_none() {
    run_ok(&flat(5), |comm| {
        let me = comm.rank();
        let color = if me == 2 { None } else { Some(7) };
        let child = comm.split(color, 0)?;
        match child {
            None => assert_eq!(me, 2),
            Some(mut c) => {
                assert_ne!(me, 2);
                assert_eq!(c.size(), 4);
                assert_eq!(c.rank(), if me < 2 { me } else { me - 1 });
                let mut sum = [0u32];
                c.all_reduce(&[me as u32], &mut sum, ReduceOp::Sum)?;
                assert_eq!(sum[0], 1 + 3 + 4);
                check_all_to_all(&mut c, 9)?;
            }
        }
        // Everybody, again.
        comm.barrier()
    });
}

#[test]
fn nested_split() {
    run_ok(&Topology::preset("nodes:2x4").unwrap(), |comm| {
        let me = comm.rank();
        let mut half = comm.split(Some((me / 4) as u32), 0)?.expect("a color");
        // Inside each half, by parity with reversed keys: {2, 0} and {3, 1} of the half.
        let hme = half.rank();
        let mut quarter = half
            .split(Some((hme % 2) as u32), -(hme as i32))?
            .expect("a color");
        assert_eq!(quarter.size(), 2);
        assert_eq!(quarter.rank(), 1 - hme / 2);
        let mut who = [0u32; 2];
        quarter.all_gather(&[me as u32], &mut who)?;
        let base = (me / 4 * 4 + me % 2) as u32;
        assert_eq!(who, [base + 2, base]);
        check_all_to_all(&mut quarter, 4)?;
        // All three levels in turn.
        let mut s = [0u64; 3];
        quarter.all_reduce(&[1u64, me as u64, 0], &mut s, ReduceOp::Sum)?;
        assert_eq!(s[0], 2);
        half.all_reduce(&[1u64, me as u64, 0], &mut s, ReduceOp::Sum)?;
        assert_eq!(s[..2], [4, if me < 4 { 6 } else { 22 }]);
        comm.all_reduce(&[1u64, me as u64, 0], &mut s, ReduceOp::Sum)?;
        assert_eq!(s[..2], [8, 28]);
        // The grandchild outlives its parent.
        drop(half);
        check_all_to_all(&mut quarter, 5)?;
        // A child split with everybody in one color and no reordering is a copy.
        let mut copy = comm.split(Some(0), 0)?.expect("a color");
        assert_eq!((copy.rank(), copy.size()), (me, 8));
        check_all_to_all(&mut copy, 6)?;
        Ok(())
    });
}

#[test]
fn concurrent_use_of_a_split_tree_is_refused() {
    let out = local::run(&flat(2), Emulation::off(), |comm| {
        comm.set_timeout(Duration::from_secs(10));
        let me = comm.rank();
        let mut child = comm.split(Some(0), 0)?.expect("a color");
        if me == 0 {
            std::thread::scope(|s| {
                // The child blocks in a receive (holding the endpoint) on another thread...
                let t = s.spawn(move || {
                    let mut b = [0u8; 1];
                    child.recv(&mut b, 1).map(|()| b[0])
                });
                std::thread::sleep(Duration::from_millis(300));
                // ...so the parent is refused at once instead of waiting.
                let t0 = Instant::now();
                let e = comm.send(&[1u8], 1).unwrap_err();
                assert!(matches!(e, Error::InvalidUsage { .. }), "{e}");
                assert!(t0.elapsed() < Duration::from_millis(500));
                let got = t.join().expect("no panic")?;
                assert_eq!(got, 42);
                Ok::<(), Error>(())
            })?;
        } else {
            std::thread::sleep(Duration::from_millis(1500));
            child.send(&[42u8], 0)?;
        }
        // Everything works again afterwards.
        comm.barrier()?;
        let mut x = [0u32];
        comm.all_reduce(&[1u32], &mut x, ReduceOp::Sum)?;
        assert_eq!(x[0], 2);
        Ok(())
    });
    for (r, x) in out.iter().enumerate() {
        assert!(x.is_ok(), "rank {r}: {:?}", x);
    }
}

#[test]
fn communicator_ids_are_released_and_bounded() {
    run_ok(&flat(3), |comm| {
        let me = comm.rank();
        // Many short-lived children: ids come back when they are dropped.
        for i in 0..50 {
            let mut c = comm.split(Some(0), i)?.expect("a color");
            let mut s = [0u32];
            c.all_reduce(&[1u32], &mut s, ReduceOp::Sum)?;
            assert_eq!(s[0], 3);
        }
        // At most 32 at once per rank, the world's included.
        let mut live = Vec::new();
        let err = loop {
            match comm.split(Some(0), me as i32) {
                Ok(c) => live.push(c.expect("a color")),
                Err(e) => break e,
            }
            assert!(live.len() <= 31, "no limit");
        };
        assert_eq!(live.len(), 31);
        assert!(matches!(err, Error::InvalidUsage { .. }), "{err}");
        // They all work, oldest last.
        for c in live.iter_mut().rev().step_by(10) {
            check_all_to_all(c, 7)?;
        }
        live.truncate(10);
        let mut again = comm.split(Some(1), 0)?.expect("a color");
        check_all_to_all(&mut again, 8)?;
        Ok(())
    });
}

#[test]
fn split_topology_follows_the_members() {
    run_ok(&Topology::preset("nodes:2x4").unwrap(), |comm| {
        let me = comm.rank();
        // One rank per node: ranks 0 and 4.
        let c = comm.split(if me % 4 == 0 { Some(0) } else { None }, 0)?;
        if let Some(c) = c {
            let t = c.topology();
            assert_eq!(t.size(), 2);
            assert_eq!(t.meet(0, 1), halo::topology::Level::System);
        }
        // A node's ranks only.
        let c = comm.split(Some((me / 4) as u32), 0)?.expect("a color");
        assert_eq!(c.topology().meet(0, 3), halo::topology::Level::Node);
        Ok(())
    });
}

// ---------------------------------------------------------------- reduce-scatter

/// Every op x count for one element type; returns the failures.
fn reduce_scatter_all_ops<E: TestElem>(
    comm: &mut Communicator,
    salt: usize,
) -> halo::Result<Vec<String>> {
    let (me, n) = (comm.rank(), comm.size());
    let mut fails = Vec::new();
    for op in OPS {
        for count in [0usize, 1, 7, 100] {
            let send: Vec<E> = (0..n * count)
                .map(|i| E::from_i64(input_for::<E>(me, i, salt, op)))
                .collect();
            let want: Vec<E> = (0..count)
                .map(|i| reference::<E>(n, me * count + i, salt, op))
                .collect();
            let mut recv = vec![E::from_i64(99); count];
            let before = send.clone();
            comm.reduce_scatter(&send, &mut recv, op)?;
            if recv != want {
                let i = (0..count).find(|&i| recv[i] != want[i]).unwrap();
                fails.push(format!(
                    "rank {me}: {} {op:?} count {count}: element {i} is {:?}, want {:?}",
                    E::NAME,
                    recv[i],
                    want[i]
                ));
            }
            assert!(send == before, "reduce_scatter wrote its send buffer");
        }
    }
    Ok(fails)
}

#[test]
fn reduce_scatter_every_type_op_and_size() {
    for n in 1usize..=9 {
        let fails = run_ok(&flat(n), |comm| {
            let mut f = reduce_scatter_all_ops::<f32>(comm, 1)?;
            f.extend(reduce_scatter_all_ops::<f64>(comm, 2)?);
            f.extend(reduce_scatter_all_ops::<i8>(comm, 3)?);
            f.extend(reduce_scatter_all_ops::<u8>(comm, 4)?);
            f.extend(reduce_scatter_all_ops::<i32>(comm, 5)?);
            f.extend(reduce_scatter_all_ops::<u32>(comm, 6)?);
            f.extend(reduce_scatter_all_ops::<i64>(comm, 7)?);
            f.extend(reduce_scatter_all_ops::<u64>(comm, 8)?);
            f.extend(reduce_scatter_all_ops::<bf16>(comm, 9)?);
            f.extend(reduce_scatter_all_ops::<f16>(comm, 10)?);
            Ok(f)
        });
        let fails: Vec<String> = fails.into_iter().flatten().collect();
        assert!(fails.is_empty(), "n={n}:\n{}", fails.join("\n"));
    }
}

#[test]
fn reduce_scatter_checks_lengths() {
    run_ok(&flat(3), |comm| {
        let mut recv = [0u32; 2];
        let e = comm
            .reduce_scatter(&[1u32; 5], &mut recv, ReduceOp::Sum)
            .unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
        assert!(e.to_string().contains("expected 3 ranks x 2"), "{e}");
        // The failed call took its sequence number on every rank: the next one matches.
        comm.reduce_scatter(&[1u32; 6], &mut recv, ReduceOp::Sum)?;
        assert_eq!(recv, [3, 3]);
        Ok(())
    });
}

/// Runs `f` on `n` ranks with a `timeout` and returns every rank's outcome.
fn run_all<R: Send>(
    n: usize,
    timeout: Duration,
    f: impl Fn(&mut Communicator) -> halo::Result<R> + Sync,
) -> Vec<halo::Result<R>> {
    local::run(&flat(n), Emulation::off(), |comm| {
        comm.set_timeout(timeout);
        f(comm)
    })
}

#[test]
fn reduce_scatter_count_mismatch_fails_every_rank() {
    for n in [2usize, 3, 5] {
        let start = Instant::now();
        let out = run_all(n, Duration::from_secs(2), |comm| {
            let count = if comm.rank() == 1 { 3 } else { 2 };
            let send = vec![1i32; n * count];
            let mut recv = vec![0i32; count];
            comm.reduce_scatter(&send, &mut recv, ReduceOp::Sum)
        });
        for (r, o) in out.iter().enumerate() {
            let e = o.as_ref().expect_err("a rank returned normally");
            assert!(
                matches!(
                    e,
                    Error::InvalidUsage { .. } | Error::Timeout { .. } | Error::RemoteError { .. }
                ),
                "n={n} rank {r}: {e}"
            );
        }
        assert!(
            start.elapsed() < Duration::from_secs(8),
            "n={n}: took {:?}",
            start.elapsed()
        );
    }
}

// ---------------------------------------------------------------- broadcast, gather, scatter

use halo::BroadcastAlgorithm;

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
