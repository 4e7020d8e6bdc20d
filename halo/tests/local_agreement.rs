//! Ranks that disagree on a call, on the in-process transport: another reduction
//! operation, element type, root or collective is an `InvalidUsage` error naming both
//! ranks and both values — never success with different results, never a hang.

use halo::local::{self, Emulation};
use halo::topology::Topology;
use halo::{Communicator, Error, ReduceOp};
use std::time::{Duration, Instant};

fn run_all<R: Send>(
    n: usize,
    f: impl Fn(&mut Communicator) -> halo::Result<R> + Sync,
) -> Vec<halo::Result<R>> {
    let topo = Topology::preset(&format!("flat:{n}")).unwrap();
    local::run(&topo, Emulation::off(), |comm| {
        comm.set_timeout(Duration::from_secs(3));
        f(comm)
    })
}

/// Every rank failed with `InvalidUsage`, within the time; the messages, by rank.
///
/// One exception, of the in-process transport: a rank that waits only for a rank which
/// failed before it posted the message (so it had no send to poison) learns of it when
/// that rank's thread ends — `RemoteError` "left (its endpoint was dropped)", as fast.
/// Such a rank's message is kept; the assertions on named ranks still need theirs.
fn usage_errors<R: std::fmt::Debug>(
    what: &str,
    out: Vec<halo::Result<R>>,
    start: Instant,
) -> Vec<String> {
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{what}: took {:?} (a rank waited for its timeout)",
        start.elapsed()
    );
    out.into_iter()
        .enumerate()
        .map(|(r, o)| match o {
            Err(Error::InvalidUsage { message, .. }) => message,
            Err(Error::RemoteError { message, .. }) if message.contains(LEFT) => message,
            other => panic!("{what}: rank {r}: expected InvalidUsage, got {other:?}"),
        })
        .collect()
}

/// `msgs[r]` contains `want` for each rank `r` of `ranks` — or, on this transport, says
/// that the peer it waited for left after failing the call first (see
/// [`usage_errors`]); at least one of them names `want` in every case.
fn named(what: &str, msgs: &[String], ranks: &[usize], want: &str) {
    for &r in ranks {
        assert!(
            msgs[r].contains(want) || msgs[r].contains(LEFT),
            "{what}: rank {r}: {:?} lacks {want:?}",
            msgs[r]
        );
    }
    assert!(
        ranks.iter().any(|&r| msgs[r].contains(want)),
        "{what}: no rank of {ranks:?} names {want:?}: {msgs:?}"
    );
}

/// What the in-process transport says of a peer whose thread ended while it was awaited.
const LEFT: &str = "left (its endpoint was dropped)";

/// Every rank's message names a disagreement with both values, or (a rank whose own
/// peers agreed with it) that a peer failed the call, or left after failing it.
fn all_told(what: &str, msgs: &[String], values: &str) {
    for (r, m) in msgs.iter().enumerate() {
        assert!(
            m.contains(values) || m.contains("failed this collective") || m.contains(LEFT),
            "{what}: rank {r}: {m}"
        );
    }
}

#[test]
fn another_reduction_operation_fails_every_rank() {
    for n in [2usize, 4] {
        let start = Instant::now();
        let out = run_all(n, |comm| {
            let op = if comm.rank() == 0 {
                ReduceOp::Sum
            } else {
                ReduceOp::Max
            };
            let send = vec![comm.rank() as f32 + 1.0; 8];
            let mut recv = vec![0f32; 8];
            comm.all_reduce(&send, &mut recv, op)
        });
        let what = format!("all_reduce sum/max on {n} ranks");
        let msgs = usage_errors(&what, out, start);
        named(
            &what,
            &msgs,
            &[0, 1],
            "rank 0 called all_reduce with sum, rank 1 with max",
        );
        if n == 4 {
            // Rank 2 meets rank 0 in the second round: poison with rank 0's call.
            named(
                &what,
                &msgs,
                &[2],
                "rank 0 called all_reduce with sum, rank 2 with max",
            );
        }
        all_told(&what, &msgs, "with sum");
    }
}

#[test]
fn another_element_type_of_the_same_size_fails_every_rank() {
    for n in [2usize, 4] {
        let start = Instant::now();
        let out = run_all(n, |comm| {
            if comm.rank() == 0 {
                let mut buf = vec![1.5f32; 16];
                comm.all_reduce_in_place(&mut buf, ReduceOp::Sum)
            } else {
                let mut buf = vec![1i32; 16];
                comm.all_reduce_in_place(&mut buf, ReduceOp::Sum)
            }
        });
        let what = format!("all_reduce float32/int32 on {n} ranks");
        let msgs = usage_errors(&what, out, start);
        named(
            &what,
            &msgs,
            &[0, 1],
            "rank 0 reduces float32, rank 1 int32",
        );
        all_told(&what, &msgs, "reduces float32");
    }
}

#[test]
fn reduce_scatter_with_another_operation_fails_every_rank() {
    for n in [2usize, 4] {
        let start = Instant::now();
        let out = run_all(n, |comm| {
            let op = if comm.rank() == n - 1 {
                ReduceOp::Min
            } else {
                ReduceOp::Sum
            };
            let send = vec![3u64; 4 * n];
            let mut recv = vec![0u64; 4];
            comm.reduce_scatter(&send, &mut recv, op)
        });
        let what = format!("reduce_scatter sum/min on {n} ranks");
        let msgs = usage_errors(&what, out, start);
        let last = n - 1;
        named(
            &what,
            &msgs,
            &[last],
            &format!("called reduce_scatter with sum, rank {last} with min"),
        );
        all_told(&what, &msgs, "with sum, rank");
    }
}

#[test]
fn another_collective_with_the_same_bytes_fails_every_rank() {
    for n in [2usize, 4] {
        let start = Instant::now();
        let out = run_all(n, |comm| {
            // 4096 bytes per peer against 4096 bytes per rank.
            let me = comm.rank();
            if me == 0 {
                let send = vec![7u32; 1024 * n];
                let mut recv = vec![0u32; 1024 * n];
                comm.all_to_all(&send, &mut recv)
            } else {
                let send = vec![7u32; 1024];
                let mut recv = vec![0u32; 1024 * n];
                comm.all_gather(&send, &mut recv)
            }
        });
        let what = format!("all_to_all/all_gather on {n} ranks");
        let msgs = usage_errors(&what, out, start);
        named(
            &what,
            &msgs,
            &[0],
            "rank 0 called all_to_all (4096 bytes per peer), rank ",
        );
        all_told(
            &what,
            &msgs,
            "rank 0 called all_to_all (4096 bytes per peer)",
        );
    }
}

#[test]
fn a_barrier_against_a_one_byte_all_to_all_is_named_a_barrier() {
    for n in [2usize, 4] {
        let start = Instant::now();
        let out = run_all(n, |comm| {
            if comm.rank() == 1 {
                comm.barrier()
            } else {
                let send = vec![1u8; comm.size()];
                let mut recv = vec![0u8; comm.size()];
                comm.all_to_all(&send, &mut recv)
            }
        });
        let what = format!("barrier/all_to_all on {n} ranks");
        let msgs = usage_errors(&what, out, start);
        if n == 2 {
            named(
                &what,
                &msgs,
                &[0, 1],
                "rank 0 called all_to_all (1 byte per peer), rank 1 barrier",
            );
        }
        // With 4, rank 1 names itself first to the ranks above it, and a rank whose
        // peers all agreed with it hears of the failure from one of them.
        for (r, m) in msgs.iter().enumerate() {
            assert!(
                (m.contains("rank 1 barrier") || m.contains("rank 1 called barrier"))
                    && m.contains("all_to_all (1 byte per peer)")
                    || m.contains("failed this collective")
                    || m.contains(LEFT),
                "{what}: rank {r}: {m}"
            );
        }
    }
}

#[test]
fn another_root_fails_the_ranks_that_exchange() {
    for n in [2usize, 4] {
        let start = Instant::now();
        // Scatter: rank 0 names root 0; the last rank names root 1 (with 2 ranks, each
        // names itself). Rank 0's block for the last rank meets a call with another
        // root there: both fail naming both roots. The ranks in between agree with
        // rank 0 and get their blocks.
        let last = n - 1;
        let out = run_all(n, |comm| {
            let me = comm.rank();
            let root = if me == last { 1 } else { 0 };
            let send: Vec<u16> = if me == root {
                (0..4 * n as u16).collect()
            } else {
                Vec::new()
            };
            let mut recv = vec![0u16; 4];
            comm.scatter(&send, &mut recv, root).map(|()| recv)
        });
        let what = format!("scatter root 0/1 on {n} ranks");
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "{what}: {:?}",
            start.elapsed()
        );
        // The last rank meets rank 0's block or the agreement message of the rank
        // before it (rank 0 with 2 ranks), rank 0 the last rank's agreement message.
        let want = format!("called scatter with root 0, rank {last} with root 1");
        for r in [0, last] {
            match &out[r] {
                Err(Error::InvalidUsage { message, .. }) => {
                    assert!(message.contains(&want), "{what}: rank {r}: {message}")
                }
                Err(Error::RemoteError { message, .. }) if message.contains(LEFT) => {}
                other => panic!("{what}: rank {r}: expected InvalidUsage, got {other:?}"),
            }
        }
        assert!(
            [0, last].iter().any(|&r| matches!(&out[r],
                Err(Error::InvalidUsage { message, .. }) if message.contains(&want))),
            "{what}: neither rank 0 nor rank {last} names both roots: {out:?}"
        );
        for (r, o) in out.iter().enumerate().take(last).skip(1) {
            match o {
                Ok(recv) => {
                    let base = 4 * r as u16;
                    assert_eq!(
                        recv,
                        &(base..base + 4).collect::<Vec<_>>(),
                        "{what}: rank {r}"
                    )
                }
                // The root may find the mismatch before it sends to this rank: then
                // it poisons the send instead, and this rank is told (never wrong bytes).
                Err(Error::InvalidUsage { message, .. })
                    if message.contains("failed this collective") || message.contains(&want) => {}
                Err(Error::RemoteError { message, .. }) if message.contains(LEFT) => {}
                Err(e) => panic!("{what}: rank {r} agreed with its root: {e}"),
            }
        }
    }
}

/// Rooted calls where no data flows between the ranks that disagree — every rank
/// names itself a broadcast's root, or the next rank a gather's — fail on every rank
/// (each receives the previous rank's 1-byte agreement message, carrying a root it
/// does not name), never success with different buffers, never a hang.
#[test]
fn ranks_that_disagree_on_the_root_fail_where_no_data_flows() {
    for n in [2usize, 4] {
        let start = Instant::now();
        let out = run_all(n, |comm| {
            let mut buf = vec![comm.rank() as u32; 8];
            comm.broadcast(&mut buf, comm.rank())
        });
        let msgs = usage_errors(&format!("broadcast self on {n}"), out, start);
        let all: Vec<usize> = (0..n).collect();
        named("broadcast self", &msgs, &all, "called broadcast with root ");
        let start = Instant::now();
        let out = run_all(n, |comm| {
            let (me, n) = (comm.rank(), comm.size());
            let send = vec![me as u32; 4];
            let mut recv = vec![0u32; 4 * n];
            comm.gather(&send, &mut recv, (me + 1) % n)
        });
        let msgs = usage_errors(&format!("gather crossed on {n}"), out, start);
        named("gather crossed", &msgs, &all, "called gather with root ");
    }
}

#[test]
fn agreeing_calls_still_succeed_and_p2p_is_unchanged() {
    let out = run_all(3, |comm| {
        let me = comm.rank();
        let mut buf = vec![me as f64; 5];
        comm.all_reduce_in_place(&mut buf, ReduceOp::Sum)?;
        assert_eq!(buf, vec![3.0; 5]);
        comm.barrier()?;
        // Point-to-point carries no call: different element types of one size pass.
        if me == 0 {
            comm.send(&[1.0f32, 2.0], 1)?;
        } else if me == 1 {
            let mut got = [0u32; 2];
            comm.recv(&mut got, 0)?;
            assert_eq!(got, [1.0f32.to_bits(), 2.0f32.to_bits()]);
        }
        Ok(())
    });
    for (r, o) in out.into_iter().enumerate() {
        o.unwrap_or_else(|e| panic!("rank {r}: {e}"));
    }
}
