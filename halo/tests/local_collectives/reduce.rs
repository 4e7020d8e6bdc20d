//! All-gather, all-reduce and reduce-scatter.

use super::*;

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
