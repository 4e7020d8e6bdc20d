//! The hybrid transport in one process: ranks as threads, each in its own UTS
//! namespace with a host name of its choosing (root), so that ranks "on one host"
//! share HALO's shared-memory rings and the others talk over libfabric (`tcp;ofi_rxm`
//! on loopback). Byte-exact all-to-all and all-to-all-v (zero counts, messages larger
//! than a ring) with every algorithm; a size mismatch fails every rank on both halves
//! (not at the timeout); abort from another thread; the communicator after a failure.
//!
//! Across real processes on emulated hosts: `cli/tests/hybrid.rs`.

use halo::{Algorithm, Communicator, Error, InitConfig, Partition, TransportChoice, UniqueId};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Puts the calling thread in a new UTS namespace named `host` (needs root; the test
/// fails, not skips, without it).
fn become_host(host: &str) {
    // SAFETY: unshare(CLONE_NEWUTS) affects only the calling thread's namespaces.
    let r = unsafe { libc::unshare(libc::CLONE_NEWUTS) };
    assert_eq!(
        r,
        0,
        "unshare(CLONE_NEWUTS): {} (these tests need root)",
        std::io::Error::last_os_error()
    );
    // SAFETY: a valid pointer and length of the name's bytes.
    let r = unsafe { libc::sethostname(host.as_ptr().cast(), host.len()) };
    assert_eq!(r, 0, "sethostname: {}", std::io::Error::last_os_error());
}

fn config(timeout: Duration) -> InitConfig {
    let mut c = InitConfig {
        transport: TransportChoice::Auto,
        ..InitConfig::default()
    };
    c.timeout = timeout;
    c.bootstrap_timeout = Duration::from_secs(60);
    c
}

/// Runs `f(rank, comm)` for ranks on `hosts[rank]`, each on its own thread.
fn job<R: Send>(
    hosts: &[&str],
    config: &InitConfig,
    f: impl Fn(usize, Communicator) -> R + Sync,
) -> Vec<R> {
    let n = hosts.len();
    let root: std::net::SocketAddr = "127.0.0.1:0".parse().unwrap();
    let id = UniqueId::new_on(root).unwrap();
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|r| {
                let (f, id) = (&f, &id);
                let host = hosts[r];
                s.spawn(move || {
                    become_host(host);
                    let comm = Communicator::init_rank_with(id, n, r, config)
                        .unwrap_or_else(|e| panic!("rank {r} init: {e}"));
                    f(r, comm)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn value(src: usize, dst: usize, i: usize) -> u32 {
    (src * 1_000_003 + dst * 7919 + i * 31 + 1) as u32
}

/// Checks the provider to every peer: `halo-shm` on the same host, the network
/// provider otherwise.
fn check_routes(comm: &Communicator, hosts: &[&str]) {
    let me = comm.rank();
    for p in (0..hosts.len()).filter(|&p| p != me) {
        let want = if hosts[p] == hosts[me] {
            "halo-shm"
        } else {
            "tcp;ofi_rxm"
        };
        assert_eq!(comm.provider_to(p), Some(want), "rank {me} -> {p}");
    }
}

fn every_algorithm(hosts: &[&str]) {
    let n = hosts.len();
    job(hosts, &config(Duration::from_secs(30)), |me, mut comm| {
        check_routes(&comm, hosts);
        let mut algos: Vec<Option<Algorithm>> = Algorithm::ALL.iter().copied().map(Some).collect();
        algos.push(None);
        for algo in algos {
            comm.set_algorithm(algo);
            // 70,000 x 4 bytes per peer: larger than a ring (32 cells of 8 KiB).
            for count in [0usize, 1, 7, 1500, 70_000] {
                let send: Vec<u32> = (0..n)
                    .flat_map(|d| (0..count).map(move |i| value(me, d, i)))
                    .collect();
                let mut recv = vec![0u32; n * count];
                comm.all_to_all(&send, &mut recv)
                    .unwrap_or_else(|e| panic!("rank {me} {algo:?} count {count}: {e}"));
                let want: Vec<u32> = (0..n)
                    .flat_map(|s| (0..count).map(move |i| value(s, me, i)))
                    .collect();
                assert!(
                    recv == want,
                    "rank {me} {algo:?} count {count}: wrong bytes"
                );
            }
            // -v with zeros: rank s sends (s + d) % 3 * 5 elements to d (zero for a
            // third of the pairs), and 0 or 20,000 for pairs that differ in parity.
            let count = |s: usize, d: usize| {
                if (s + d) % 2 == 1 && s.is_multiple_of(3) {
                    20_000
                } else {
                    (s + d) % 3 * 5
                }
            };
            let sc: Vec<usize> = (0..n).map(|d| count(me, d)).collect();
            let rc: Vec<usize> = (0..n).map(|s| count(s, me)).collect();
            let send: Vec<u32> = (0..n)
                .flat_map(|d| (0..sc[d]).map(move |i| value(me, d, i)))
                .collect();
            let mut recv = vec![0u32; rc.iter().sum()];
            comm.all_to_all_v(
                &send,
                &Partition::packed(&sc),
                &mut recv,
                &Partition::packed(&rc),
            )
            .unwrap_or_else(|e| panic!("rank {me} {algo:?} -v: {e}"));
            let want: Vec<u32> = (0..n)
                .flat_map(|s| (0..rc[s]).map(move |i| value(s, me, i)))
                .collect();
            assert!(recv == want, "rank {me} {algo:?} -v: wrong bytes");
        }
    });
}

#[test]
fn every_algorithm_byte_exact_2_hosts_x_2() {
    every_algorithm(&["hya", "hya", "hyb", "hyb"]);
}

#[test]
fn every_algorithm_byte_exact_uneven_interleaved_hosts() {
    // Host a: ranks 0, 2, 4; host b: 1, 5; host c: 3 alone (no ring).
    every_algorithm(&["hya", "hyb", "hya", "hyc", "hya", "hyb"]);
}

#[test]
fn a_size_mismatch_fails_every_rank_on_both_halves() {
    let hosts = ["hma", "hma", "hmb", "hmb"];
    let timeout = Duration::from_secs(20);
    let out = job(&hosts, &config(timeout), |me, mut comm| {
        comm.set_algorithm(Some(Algorithm::Flat));
        // Rank 3 calls with another block size.
        let count = if me == 3 { 3 } else { 2 };
        let send = vec![me as u32; 4 * count];
        let mut recv = vec![0u32; 4 * count];
        let start = Instant::now();
        let r = comm.all_to_all(&send, &mut recv);
        (r, start.elapsed())
    });
    for (me, (r, took)) in out.into_iter().enumerate() {
        match r {
            Err(Error::InvalidUsage { message, .. }) => {
                assert!(message.contains("size mismatch"), "rank {me}: {message}")
            }
            other => panic!("rank {me}: expected a size mismatch, got {other:?}"),
        }
        assert!(took < timeout / 2, "rank {me} took {took:?}");
    }
}

/// All-to-all-v whose remainders go right behind the count messages (blocks of 6 KB
/// and more, beyond the 1 KiB that rides with the counts) while pairs disagree on
/// both halves: rank 0 sends rank 1 (its ring) 3,000 elements where rank 1 expects
/// 1,500, rank 2 sends rank 0 (the fabric) 5,000 where rank 0 expects 4,000, and rank 3
/// passes an overflowing displacement, so it takes and drops every remainder sent to
/// it. Every rank fails at once, with the errors of the three-pass exchange, and the
/// next call on the same communicators moves every byte right (nothing was left
/// unread in a ring or a provider's queue).
/// All-to-all-v with pairs that disagree on their counts, on real ranks over HALO's
/// rings and `tcp;ofi_rxm`: either way the count messages go (`alg`), every rank fails
/// at once with the errors of the three passes, and the next call is byte-exact.
fn an_all_to_all_v_count_mismatch(alg: Option<Algorithm>, eager: usize, hosts: [&str; 4]) {
    let n = hosts.len();
    let timeout = Duration::from_secs(20);
    let out = job(&hosts, &config(timeout), |me, mut comm| {
        check_routes(&comm, &hosts);
        comm.set_algorithm(alg);
        assert_eq!(comm.eager_v(), eager);
        let mut sc = vec![1500usize; n];
        let mut rc = vec![1500usize; n];
        match me {
            0 => {
                sc[1] = 3000;
                rc[2] = 4000;
            }
            2 => sc[0] = 5000,
            _ => {}
        }
        let mut sd = Partition::packed(&sc).displs().to_vec();
        if me == 3 {
            sd[2] = usize::MAX;
        }
        let send: Vec<u32> = (0..sc.iter().sum::<usize>())
            .map(|i| value(me, 0, i))
            .collect();
        let mut recv = vec![0u32; rc.iter().sum()];
        let start = Instant::now();
        let bad = comm.all_to_all_v(
            &send,
            &Partition::new(&sc, &sd),
            &mut recv,
            &Partition::packed(&rc),
        );
        let took = start.elapsed();
        // The communicator after it: blocks of 2,000 elements, every one checked.
        let good = vec![2000usize; n];
        let send: Vec<u32> = (0..n)
            .flat_map(|d| (0..2000).map(move |i| value(me, d, i)))
            .collect();
        let mut recv = vec![0u32; n * 2000];
        comm.all_to_all_v(
            &send,
            &Partition::packed(&good),
            &mut recv,
            &Partition::packed(&good),
        )
        .unwrap_or_else(|e| panic!("rank {me}, the call after the bad one: {e}"));
        let want: Vec<u32> = (0..n)
            .flat_map(|s| (0..2000).map(move |i| value(s, me, i)))
            .collect();
        assert!(recv == want, "rank {me}: wrong bytes after the bad call");
        (bad, took)
    });
    for (me, (r, took)) in out.into_iter().enumerate() {
        assert!(took < timeout / 2, "rank {me} took {took:?}");
        match (me, r) {
            (3, Err(Error::InvalidArgument { peer, .. })) => assert_eq!(peer, Some(2)),
            (0, Err(Error::InvalidUsage { peer, message })) => {
                assert_eq!(peer, Some(1), "{message}");
                assert!(message.contains("12000 bytes") && message.contains("6000 bytes"));
            }
            (1, Err(Error::InvalidUsage { peer, .. })) => assert_eq!(peer, Some(0)),
            (2, Err(Error::InvalidUsage { peer, message })) => {
                assert_eq!(peer, Some(0), "{message}");
                assert!(message.contains("20000 bytes") && message.contains("16000 bytes"));
            }
            (r, other) => panic!("rank {r}: {other:?}"),
        }
    }
}

#[test]
fn an_all_to_all_v_count_mismatch_with_remainders_behind_the_counts() {
    // Flat forced: the count messages go direct with 8 KiB of each block, and the
    // blocks of 12,000 bytes and more send their remainders right behind them.
    an_all_to_all_v_count_mismatch(Some(Algorithm::Flat), 8192, ["hva", "hva", "hvb", "hvb"]);
}

#[test]
fn an_all_to_all_v_count_mismatch_with_the_counts_in_two_hops() {
    // Automatic: the count messages take the two hops between the hosts with the first
    // 1 KiB of each block; the remainders take the data pass.
    an_all_to_all_v_count_mismatch(None, 1024, ["hwa", "hwa", "hwb", "hwb"]);
}

#[test]
fn abort_from_another_thread_and_the_communicator_after_it() {
    let hosts = ["haa", "haa", "hab", "hab"];
    let (release, wait) = mpsc::channel::<()>();
    let wait = std::sync::Mutex::new(wait);
    let idle_until_released = |comm: Communicator| {
        // Keeps the endpoints open until rank 0 is done.
        let _ = wait.lock().unwrap().recv_timeout(Duration::from_secs(60));
        drop(comm);
    };
    let release = std::sync::Mutex::new(release);
    job(&hosts, &config(Duration::from_secs(60)), |me, mut comm| {
        if me != 0 {
            return idle_until_released(comm);
        }
        check_routes(&comm, &hosts);
        let handle = comm.abort_handle();
        let (tx, rx) = mpsc::channel();
        let aborter = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            tx.send(Instant::now()).unwrap();
            handle.abort();
        });
        // Waits for ranks 1 (rings) and 2, 3 (fabric), which never join.
        let send = vec![7u64; 4 * 512];
        let mut recv = vec![0u64; 4 * 512];
        let r = comm.all_to_all(&send, &mut recv);
        let returned = Instant::now();
        let aborted_at = rx.recv().unwrap();
        aborter.join().unwrap();
        let took = returned.saturating_duration_since(aborted_at);
        assert!(matches!(r, Err(Error::Aborted { .. })), "{r:?}");
        assert!(
            took < Duration::from_secs(1),
            "returned {took:?} after abort()"
        );
        let r = comm.all_to_all(&send, &mut recv);
        assert!(matches!(r, Err(Error::Aborted { .. })), "{r:?}");
        for _ in 1..hosts.len() {
            release.lock().unwrap().send(()).unwrap();
        }
    });
}

#[test]
fn after_a_timeout_the_communicator_is_unusable() {
    let hosts = ["hta", "hta", "htb", "htb"];
    let (release, wait) = mpsc::channel::<()>();
    let wait = std::sync::Mutex::new(wait);
    let release = std::sync::Mutex::new(release);
    job(
        &hosts,
        &config(Duration::from_millis(400)),
        |me, mut comm| {
            if me != 0 {
                let _ = wait.lock().unwrap().recv_timeout(Duration::from_secs(60));
                return;
            }
            let send = vec![1u32; 4 * 8];
            let mut recv = vec![0u32; 4 * 8];
            let r = comm.all_to_all(&send, &mut recv);
            assert!(matches!(r, Err(Error::Timeout { .. })), "{r:?}");
            let r = comm.all_to_all(&send, &mut recv);
            match r {
                Err(Error::InvalidUsage { message, .. }) => {
                    assert!(message.contains("can no longer be used"), "{message}")
                }
                other => panic!("expected the communicator to be unusable: {other:?}"),
            }
            for _ in 1..hosts.len() {
                release.lock().unwrap().send(()).unwrap();
            }
        },
    );
}

#[test]
fn split_communicators_route_through_the_worlds_halves() {
    // Hosts a: 0, 1, 2; b: 3, 4, 5. Split by rank parity: {0, 2, 4} and {1, 3, 5},
    // each with a same-host pair on the rings and the rest over the fabric.
    let hosts = ["hsa", "hsa", "hsa", "hsb", "hsb", "hsb"];
    job(&hosts, &config(Duration::from_secs(30)), |me, mut world| {
        let mut sub = world
            .split(Some(me as u32 % 2), me as i32)
            .unwrap()
            .expect("a member");
        let (sr, sn) = (sub.rank(), sub.size());
        assert_eq!((sr, sn), (me / 2, 3));
        for q in (0..sn).filter(|&q| q != sr) {
            let wq = 2 * q + me % 2;
            let want = if hosts[wq] == hosts[me] {
                "halo-shm"
            } else {
                "tcp;ofi_rxm"
            };
            assert_eq!(sub.provider_to(q), Some(want), "rank {me} -> sub rank {q}");
        }
        for algo in Algorithm::ALL {
            sub.set_algorithm(Some(algo));
            let count = 3000;
            let send: Vec<u32> = (0..sn)
                .flat_map(|d| (0..count).map(move |i| value(me, d, i)))
                .collect();
            let mut recv = vec![0u32; sn * count];
            sub.all_to_all(&send, &mut recv)
                .unwrap_or_else(|e| panic!("rank {me} {algo:?}: {e}"));
            let want: Vec<u32> = (0..sn)
                .flat_map(|s| (0..count).map(move |i| value(2 * s + me % 2, sr, i)))
                .collect();
            assert!(recv == want, "rank {me} {algo:?}: wrong bytes");
        }
        // The world still works after its split.
        let send = vec![me as u64; 6];
        let mut recv = vec![0u64; 6];
        world.all_to_all(&send, &mut recv).unwrap();
        assert_eq!(recv, vec![0, 1, 2, 3, 4, 5]);
    });
}
