//! Strangers flooding the bootstrap root, for real, over loopback: 10,000 connections
//! that never prove the job's secret (half of them silent, half sending a HALO hello
//! and then nothing) while a job of 4 starts. The job must start within its timeout,
//! the root must not crash, and this process's thread count (`/proc/self/status`) must
//! stay bounded: the root serves every connection from its one thread (the old root
//! spawned a thread per connection and held each up to the 5 s hello timeout).
//!
//! Its own test binary, so that no other test's threads are counted. Needs 10,000 file
//! descriptors (the soft limit is raised to the hard one); without them the test skips,
//! or fails under `HALO_REQUIRE_ALL=1`.

use halo::bootstrap::{MAX_PENDING, RendezvousRoot, exchange, random_secret};
use std::io::Write as _;
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const STRANGERS: usize = 10_000;
const ATTACKERS: usize = 4;
const RANKS: usize = 4;
const JOB_TIMEOUT: Duration = Duration::from_secs(30);
/// The root's own life: long enough for the flood phase of a loaded machine too (the
/// root stops serving at its timeout, and then nothing accepts the strangers).
const ROOT_TIMEOUT: Duration = Duration::from_secs(240);

fn threads() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// Raises the soft limit on open files to the hard one; whether `need` fit.
fn enough_descriptors(need: u64) -> bool {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid rlimit for getrlimit to fill.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return false;
    }
    lim.rlim_cur = lim.rlim_max;
    // SAFETY: `lim` is a valid rlimit; raising the soft limit to the hard one is allowed.
    unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) };
    lim.rlim_cur >= need
}

#[test]
fn ten_thousand_strangers_do_not_stop_a_job_of_four() {
    let need = (STRANGERS + 2 * MAX_PENDING + 200) as u64;
    if !enough_descriptors(need) {
        let why = format!("needs {need} open files (RLIMIT_NOFILE hard limit is lower)");
        assert!(
            std::env::var("HALO_REQUIRE_ALL").as_deref() != Ok("1"),
            "HALO_REQUIRE_ALL=1 but this test cannot run here: {why}"
        );
        eprintln!("skipped: {why} (set HALO_REQUIRE_ALL=1 to make this a failure)");
        return;
    }
    let baseline = threads();
    let secret = random_secret().unwrap();
    let root = RendezvousRoot::start(
        "127.0.0.1:0".parse().unwrap(),
        secret,
        Some(RANKS),
        ROOT_TIMEOUT,
    )
    .unwrap();
    let addr: SocketAddr = root.local_addr();

    // The sampler: the most threads this process ever had.
    let stop = Arc::new(AtomicBool::new(false));
    let most = Arc::new(AtomicUsize::new(0));
    let sampler = {
        let (stop, most) = (stop.clone(), most.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                most.fetch_max(threads(), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    };

    // The strangers: 10,000 connections held open, never proving the secret; then they
    // go on connecting while the job starts.
    let opened = Arc::new(AtomicUsize::new(0));
    let flooding = Arc::new(AtomicBool::new(true));
    let held: Arc<Mutex<Vec<TcpStream>>> = Arc::new(Mutex::new(Vec::new()));
    let flood_started = Instant::now();
    let attackers: Vec<_> = (0..ATTACKERS)
        .map(|a| {
            let (opened, held, flooding) = (opened.clone(), held.clone(), flooding.clone());
            std::thread::spawn(move || {
                let mut hello = b"HALB\x02\0\0\0".to_vec();
                hello.extend_from_slice(&[0x66; 32]);
                let mut i = 0usize;
                let mut extra = Vec::new();
                while i < STRANGERS / ATTACKERS || flooding.load(Ordering::Relaxed) {
                    if let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_secs(2)) {
                        if (i + a).is_multiple_of(2) {
                            let _ = s.write_all(&hello);
                        }
                        opened.fetch_add(1, Ordering::Relaxed);
                        if i < STRANGERS / ATTACKERS {
                            held.lock().unwrap().push(s);
                        } else {
                            // The second wave: a bounded window of new connections.
                            extra.push(s);
                            if extra.len() > 500 {
                                extra.remove(0);
                            }
                        }
                    }
                    i += 1;
                }
            })
        })
        .collect();
    // 15 s here when the machine is quiet; a loaded CI machine took over 60 s once
    // (8,260 in 60 s), so the window is wide: the root must keep accepting, not be fast.
    let until = Instant::now() + Duration::from_secs(180);
    while opened.load(Ordering::Relaxed) < STRANGERS && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(5));
    }
    let during = opened.load(Ordering::Relaxed);
    eprintln!(
        "{during} stranger connections opened in {:?}",
        flood_started.elapsed()
    );
    // Each connection is accepted (or queued) at once by a root that keeps up; the old
    // root, a thread per connection, accepted 3,900 in 60 s.
    assert!(
        during >= STRANGERS,
        "the root took only {during} of {STRANGERS} stranger connections in {:?} (this \
         process had up to {} threads)",
        flood_started.elapsed(),
        most.load(Ordering::Relaxed)
    );
    let started = Instant::now();
    let ranks: Vec<_> = (0..RANKS)
        .map(|rank| {
            std::thread::spawn(move || {
                exchange(addr, &secret, rank, RANKS, &[rank as u8; 64], JOB_TIMEOUT)
            })
        })
        .collect();
    let results: Vec<_> = ranks.into_iter().map(|r| r.join().unwrap()).collect();
    let took = started.elapsed();
    flooding.store(false, Ordering::Relaxed);
    for a in attackers {
        a.join().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    sampler.join().unwrap();
    let most = most.load(Ordering::Relaxed);
    let opened = opened.load(Ordering::Relaxed);
    eprintln!(
        "job of {RANKS} started in {took:?} with {during} stranger connections opened \
         ({opened} in all); threads: {baseline} before, at most {most}"
    );
    let want: Vec<Vec<u8>> = (0..RANKS).map(|r| vec![r as u8; 64]).collect();
    for (rank, r) in results.into_iter().enumerate() {
        assert_eq!(r.expect("the job's rank gets through"), want, "rank {rank}");
    }
    assert!(took < JOB_TIMEOUT, "the job took {took:?}");
    // The root, its sampler, the attackers and the ranks, and a little slack.
    let bound = baseline + 1 + 1 + ATTACKERS + RANKS + 6;
    assert!(
        most <= bound,
        "{most} threads (bound {bound}): the root spent threads on strangers"
    );
    root.join()
        .expect("the root served the job without crashing");
    drop(held);
}
