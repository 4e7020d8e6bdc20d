//! Split communicators.

use super::*;

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
fn a_split_child_inherits_every_forced_algorithm() {
    run_ok(&flat(4), |comm| {
        comm.set_algorithm(Some(halo::Algorithm::Pairwise));
        comm.set_all_gather_algorithm(Some(AllGatherAlgorithm::Bruck));
        comm.set_all_reduce_algorithm(Some(AllReduceAlgorithm::Rabenseifner));
        comm.set_broadcast_algorithm(Some(BroadcastAlgorithm::Chain));
        let mut c = comm.split(Some((comm.rank() % 2) as u32), 0)?.unwrap();
        assert_eq!(c.algorithm(), Some(halo::Algorithm::Pairwise));
        assert_eq!(c.all_gather_algorithm(), Some(AllGatherAlgorithm::Bruck));
        assert_eq!(
            c.all_reduce_algorithm(),
            Some(AllReduceAlgorithm::Rabenseifner)
        );
        assert_eq!(c.broadcast_algorithm(), Some(BroadcastAlgorithm::Chain));
        let mut buf = [comm.rank() as u8; 3];
        c.broadcast(&mut buf, 1)?;
        assert_eq!(buf, [(comm.rank() % 2 + 2) as u8; 3]);
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
