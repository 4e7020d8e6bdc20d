//! All-to-all-v in one pass (issue 16, item 3): on a small communicator a call sends one
//! round of count messages, which carry blocks of up to `Communicator::eager_v()` bytes
//! whole, and then the rest of larger blocks right behind them — counted on the
//! in-process transport's traffic counters, blocking and non-blocking alike — and the
//! bytes are right. (The three-pass way for large communicators, forced, the eager bytes forced
//! off, and the errors of each way are tested in `src/comm/all_to_all_v/tests.rs`.)

use halo::local::{Emulation, LocalCluster};
use halo::topology::{Level, Topology};
use halo::{Algorithm, Partition};

/// Elements (`u64`) rank `s` sends to rank `d`: every pair non-zero, so the flat fan-out
/// sends one message per pair; `extra` more on every pair.
fn count(s: usize, d: usize, extra: usize) -> usize {
    1 + (s * 5 + d * 3) % 4 + extra
}

/// One call of rank `comm.rank()` with `extra` elements more per block, every received
/// element checked; whether the eager bytes of the call cover every block.
fn call(comm: &mut halo::Communicator, extra: usize, nonblocking: bool) -> halo::Result<bool> {
    let (me, n) = (comm.rank(), comm.size());
    let sc: Vec<usize> = (0..n).map(|d| count(me, d, extra)).collect();
    let rc: Vec<usize> = (0..n).map(|s| count(s, me, extra)).collect();
    let fits = (0..n).all(|d| (0..n).all(|s| count(s, d, extra) * 8 <= comm.eager_v()));
    let send: Vec<u64> = (0..n)
        .flat_map(|d| (0..sc[d]).map(move |i| (me * 1000 + d * 10 + i + extra) as u64))
        .collect();
    let mut recv = vec![u64::MAX; rc.iter().sum()];
    let (sp, rp) = (Partition::packed(&sc), Partition::packed(&rc));
    if nonblocking {
        comm.scope(|s| s.all_to_all_v(&send, &sp, &mut recv, &rp).wait())?;
    } else {
        comm.all_to_all_v(&send, &sp, &mut recv, &rp)?;
    }
    let want: Vec<u64> = (0..n)
        .flat_map(|s| (0..rc[s]).map(move |i| (s * 1000 + me * 10 + i + extra) as u64))
        .collect();
    assert_eq!(recv, want, "rank {me}, extra {extra}");
    assert_eq!(comm.last_algorithm(), Some(Algorithm::Flat));
    Ok(fits)
}

/// One checked call with `extra` elements more per block on a fresh communicator; the
/// messages it sent and whether every rank's eager bytes (the same on all) cover every
/// block.
fn run(spec: &str, nonblocking: bool, extra: usize) -> (u64, bool) {
    let topo = Topology::preset(spec).unwrap();
    let cluster = LocalCluster::new(topo, Emulation::off()).unwrap();
    let traffic = cluster.traffic();
    let out = cluster.run(|comm| {
        comm.set_algorithm(Some(Algorithm::Flat));
        call(comm, extra, nonblocking)
    });
    let fits: Vec<bool> = out
        .into_iter()
        .enumerate()
        .map(|(r, x)| x.unwrap_or_else(|e| panic!("{spec} rank {r}: {e}")))
        .collect();
    assert!(fits.iter().all(|&f| f == fits[0]), "{spec}: {fits:?}");
    (traffic.messages_crossing(Level::Device), fits[0])
}

/// Calls in a row on one fresh cluster of `topo` with flat forced and the eager bytes
/// `fix`, each step `(extra elements per block, messages the call sends, eager bytes
/// after it)` checked on every rank (blocking and non-blocking calls alternate).
fn calls_in_a_row(topo: &Topology, fix: Option<usize>, steps: &[(usize, u64, usize)]) {
    let cluster = LocalCluster::new(topo.clone(), Emulation::off()).unwrap();
    let traffic = cluster.traffic();
    let mut comms = cluster.into_communicators();
    for comm in &mut comms {
        comm.set_algorithm(Some(Algorithm::Flat));
        comm.set_eager_v(fix);
    }
    for (i, &(extra, messages, eager)) in steps.iter().enumerate() {
        let before = traffic.messages_crossing(Level::Device);
        let out: Vec<halo::Result<usize>> = std::thread::scope(|s| {
            let hs: Vec<_> = comms
                .iter_mut()
                .map(|comm| {
                    s.spawn(move || {
                        call(comm, extra, i % 2 == 1)?;
                        Ok(comm.eager_v())
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let what = format!("eager {fix:?}, step {i}: extra {extra}");
        for (r, x) in out.into_iter().enumerate() {
            let got = x.unwrap_or_else(|e| panic!("{what}: rank {r}: {e}"));
            assert_eq!(got, eager, "{what}: rank {r}'s eager bytes after the call");
        }
        let sent = traffic.messages_crossing(Level::Device) - before;
        assert_eq!(sent, messages, "{what}: messages");
    }
}

#[test]
fn a_small_communicator_sends_one_round_then_the_data_beyond_the_eager_bytes() {
    for spec in ["nodes:1x4", "nodes:2x2", "nodes:4x2"] {
        let n = Topology::preset(spec).unwrap().size() as u64;
        for nonblocking in [false, true] {
            // Blocks of 8-32 bytes go with the counts: n - 1 messages per rank in all.
            let (messages, fits) = run(spec, nonblocking, 0);
            println!("{spec} (non-blocking: {nonblocking}): {messages} messages, eager");
            assert!(fits, "{spec}: the default eager bytes hold 32-byte blocks");
            assert_eq!(messages, n * (n - 1), "{spec}");
            // Blocks of 2 KiB and more: across hosts they also go whole with the
            // counts (the direct exchange's messages are not padded, and carry 8 KiB
            // of each block there); on one host the first call carries 1 KiB of each,
            // the remainders follow right behind.
            let (messages, fits) = run(spec, nonblocking, 256);
            let hosts = spec != "nodes:1x4";
            assert_eq!(fits, hosts, "{spec}: 2 KiB blocks");
            assert_eq!(messages, n * (n - 1) * if hosts { 1 } else { 2 }, "{spec}");
            // Blocks of 8.8 KiB and more: n - 1 messages of counts (and each block's
            // first bytes) per rank, then n - 1 of the remainders (right behind them);
            // three passes would be 3 n (n - 1) with the flat fan-out.
            let (messages, fits) = run(spec, nonblocking, 1100);
            println!("{spec} (non-blocking: {nonblocking}): {messages} messages, 8.8 KiB+");
            assert!(!fits, "{spec}");
            assert_eq!(messages, 2 * n * (n - 1), "{spec}");
        }
    }
}

/// The eager bytes of the direct exchange across hosts, alike on every rank from call
/// to call: with the count messages going direct (flat forced) at least 8 KiB of each
/// block go with them, or more where more was learned (the messages are not padded),
/// so blocks of up to 8 KiB are one round and larger ones send their remainders right
/// behind the counts; fixed eager bytes (`set_eager_v`) are kept as they are. Every
/// element of every call checked.
#[test]
fn the_direct_exchange_carries_its_eager_bytes_from_call_to_call() {
    let topo = Topology::preset("nodes:2x2").unwrap();
    let n = topo.size();
    let round = (n * (n - 1)) as u64;
    // (extra elements of 8 bytes per block, messages of the call, eager bytes after).
    // Blocks are 8 * (1..=4 + extra) bytes.
    // Learned as on one host, but up to 16 KiB (the messages are never padded here).
    let learn = [
        (256, round, 8192),      // up to 2080 B: one round; learned 2368
        (1100, 2 * round, 9984), // up to 8832 B: remainders behind; learned 8832 + 1104
        (0, round, 8192),        // up to 32 B; learned 64
        (1100, 2 * round, 9984),
        (100, round, 8192), // up to 832 B; learned 960
    ];
    let fixed = [
        (256, 2 * round, 1024),
        (256, 2 * round, 1024),
        (0, round, 1024),
    ];
    for (fix, steps) in [(None, &learn[..]), (Some(1024), &fixed[..])] {
        calls_in_a_row(&topo, fix, steps);
    }
}

/// The eager bytes are learned from call to call, alike on every rank (on one host the
/// direct exchange carries what is learned, unpadded): blocks of about 2 KiB cost a
/// second message per pair on a communicator's first call (the default 1 KiB; the
/// remainders right behind the counts), and then go whole with the counts (one
/// round); smaller blocks keep what was learned while it is less than twice what they
/// need, tiny ones shrink it to 64 bytes, and blocks above 4 KiB return it to 1 KiB
/// (two messages per pair either way). Fixed eager bytes (`set_eager_v`) do not
/// learn. Every element of every call checked.
#[test]
fn the_eager_bytes_are_learned_from_call_to_call() {
    let topo = Topology::preset("nodes:1x4").unwrap();
    let n = topo.size();
    let round = (n * (n - 1)) as u64;
    // (extra elements of 8 bytes per block, messages of the call, eager bytes after).
    // Blocks are 8 * (1..=4 + extra) bytes; learned: the largest block plus an eighth,
    // rounded up to 64 bytes.
    let learn = [
        (256, 2 * round, 2368), // up to 2080 B > 1024: remainders behind; 2080 + 260
        (256, round, 2368),     // now every block fits: one round
        (200, round, 2368),     // up to 1632 B: fits, and 1856 > 2368 / 2: kept
        (0, round, 64),         // up to 32 B: fits; 64 <= 2368 / 2: shrunk
        (0, round, 64),
        (600, 2 * round, 1024), // up to 4832 B > 4 KiB: remainders behind, the default
        (600, 2 * round, 1024),
        (100, round, 1024), // up to 832 B: fits in 1024, and 960 > 512: kept
    ];
    let fixed = [
        (256, 2 * round, 1024),
        (256, 2 * round, 1024),
        (0, round, 1024),
    ];
    for (fix, steps) in [(None, &learn[..]), (Some(1024), &fixed[..])] {
        calls_in_a_row(&topo, fix, steps);
    }
}
