//! Ring stress: two ranks as threads, each with its own mapping of one segment with
//! tiny rings (wrap-around many times over, full rings both ways at once, messages
//! many times larger than the ring, receives posted in another order than the sends,
//! zero-length messages), byte-exact; and the refusals (size mismatch, poison).

use super::{Segment, ShmTransport, session::ShmSession};
use crate::transport::testing::complete;
use halo_collectives::{Buf, Buffers, Call, CallKind, CollectiveError, Region, Session, Transport};
use std::time::{Duration, Instant};

/// Message lengths around the cell payload of 32 bytes and far beyond the ring.
const LENS: &[usize] = &[0, 1, 31, 32, 33, 64, 65, 100, 1000, 5000, 0, 7, 20_000];

fn pattern(rank: usize, round: usize, i: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|k| (rank * 131 + round * 31 + i * 7 + k * 13 + k / 256) as u8)
        .collect()
}

/// Buffers of a call that only receives, into `recv` (no uniform block size).
fn receiving_into(recv: &mut [u8]) -> Buffers<'_> {
    Buffers {
        send: &[],
        recv,
        scratch: &mut [],
        call: Call::NONE,
    }
}

/// Two transports of one segment of `slots` cells of `cell` bytes per ring.
fn pair(slots: usize, cell: usize) -> (ShmTransport, ShmTransport) {
    let a = Segment::create_with(2, slots, cell).unwrap();
    let b = Segment::open_when_ready(a.path(), 2, Duration::from_secs(5), || false).unwrap();
    // Each waits until both attached: on two threads.
    std::thread::scope(|s| {
        let hb = s.spawn(|| ShmTransport::new(1, 2, b, vec![None, None]).unwrap());
        let ta = ShmTransport::new(0, 2, a, vec![None, None]).unwrap();
        (ta, hb.join().unwrap())
    })
}

/// One round on one rank: send every message of [`LENS`] to the peer and receive
/// the peer's, receives posted in reverse order (`reverse`) or in order.
fn round(t: &mut ShmTransport, r: usize, reverse: bool) {
    let me = t.rank();
    let peer = 1 - me;
    let send: Vec<u8> = LENS
        .iter()
        .enumerate()
        .flat_map(|(i, &l)| pattern(me, r, i, l))
        .collect();
    let total: usize = LENS.iter().sum();
    let mut recv = vec![0xeeu8; total];
    let offsets: Vec<usize> = LENS
        .iter()
        .scan(0, |o, &l| {
            let at = *o;
            *o += l;
            Some(at)
        })
        .collect();
    {
        let bufs = Buffers {
            send: &send,
            recv: &mut recv,
            scratch: &mut [],
            call: Call::NONE,
        };
        let mut s = t.begin((r as u64) << 48, bufs).unwrap();
        let mut order: Vec<usize> = (0..LENS.len()).collect();
        if reverse {
            order.reverse();
        }
        for &i in &order {
            let region = Region::new(Buf::Recv, offsets[i], LENS[i]);
            s.post_recv(peer, i as u64, region, 1000 + i as u32)
                .unwrap();
        }
        for (i, &l) in LENS.iter().enumerate() {
            let region = Region::new(Buf::Send, offsets[i], l);
            s.post_send(peer, i as u64, region, i as u32).unwrap();
        }
        complete(&mut s, 2 * LENS.len()).unwrap();
    }
    for (i, &l) in LENS.iter().enumerate() {
        assert_eq!(
            &recv[offsets[i]..offsets[i] + l],
            &pattern(peer, r, i, l)[..],
            "rank {me} round {r} message {i} ({l} bytes)"
        );
    }
}

#[test]
fn tiny_rings_wrap_fill_and_pass_messages_larger_than_the_ring() {
    // 2 cells of 64 bytes (32 of payload): every message above 64 bytes is larger
    // than the ring; 40 rounds wrap the ring's counters hundreds of times.
    for (slots, cell) in [(2, 64), (3, 128), (32, 8192)] {
        let (mut a, mut b) = pair(slots, cell);
        std::thread::scope(|s| {
            s.spawn(|| {
                for r in 0..40 {
                    round(&mut a, r, r % 2 == 0);
                }
            });
            s.spawn(|| {
                for r in 0..40 {
                    round(&mut b, r, r % 3 == 0);
                }
            });
        });
        assert!(a.broken.is_none() && b.broken.is_none());
        assert!(a.unexpected.is_empty() && b.unexpected.is_empty());
    }
}

#[test]
fn a_message_of_another_length_is_a_mismatch_naming_both_sizes() {
    // Room for the whole message (4 x 32 bytes): the send completes eagerly.
    let (mut a, mut b) = pair(4, 64);
    std::thread::scope(|s| {
        s.spawn(|| {
            let send = vec![5u8; 100];
            let bufs = Buffers {
                send: &send,
                recv: &mut [],
                scratch: &mut [],
                call: Call::NONE,
            };
            let mut s = a.begin(0, bufs).unwrap();
            s.post_send(1, 3, Region::new(Buf::Send, 0, 100), 0)
                .unwrap();
            complete(&mut s, 1).unwrap();
        });
        s.spawn(|| {
            let mut recv = vec![0u8; 60];
            let bufs = receiving_into(&mut recv);
            let mut s = b.begin(0, bufs).unwrap();
            s.post_recv(0, 3, Region::new(Buf::Recv, 0, 60), 0).unwrap();
            match complete(&mut s, 1) {
                Err(CollectiveError::Mismatch { peer, message }) => {
                    assert_eq!(peer, 0);
                    assert!(
                        message.contains("100 bytes") && message.contains("expected 60 bytes"),
                        "{message}"
                    );
                }
                other => panic!("expected a mismatch, got {other:?}"),
            }
        });
    });
    // The receiver's transport is broken now; the sender's is not.
    assert!(b.broken.is_some());
    assert!(a.broken.is_none());
    let bufs = Buffers {
        send: &[],
        recv: &mut [],
        scratch: &mut [],
        call: Call::NONE,
    };
    assert!(matches!(
        b.begin(1 << 48, bufs),
        Err(CollectiveError::InvalidUsage(_))
    ));
}

/// Rank 0's side of the poison tests: poison for tag 9, then 4 bytes in blocks of 4
/// (tag 10).
fn send_poison_and_blocks_of_4(a: &mut ShmTransport) {
    let bufs = Buffers {
        send: &[1, 2, 3, 4],
        recv: &mut [],
        scratch: &mut [],
        call: Call::new(CallKind::AllToAll).count(4),
    };
    let mut s = a.begin(0, bufs).unwrap();
    s.post_poison(1, 9).unwrap();
    // Same length, other block size: refused too.
    s.post_send(1, 10, Region::new(Buf::Send, 0, 4), 0).unwrap();
    complete(&mut s, 1).unwrap();
}

/// Rank 1's side of the poison tests, holding messages for `hold`: both of
/// [`send_poison_and_blocks_of_4`]'s messages are in the ring and progressed over before
/// `check` posts receives (in blocks of 2 bytes) on the session.
fn receive_poison_and_blocks_of_2(
    hold: Duration,
    check: impl FnOnce(&mut ShmSession<'_>, Result<(), CollectiveError>),
) {
    let (mut a, mut b) = pair(4, 128);
    b.hold = hold;
    send_poison_and_blocks_of_4(&mut a);
    let mut recv = [0u8; 8];
    let bufs = Buffers {
        send: &[],
        recv: &mut recv,
        scratch: &mut [],
        call: Call::new(CallKind::AllToAll).count(2),
    };
    let mut s = b.begin(0, bufs).unwrap();
    std::thread::sleep(Duration::from_millis(10));
    let mut sink = Vec::new();
    let r = s.progress(&mut sink);
    check(&mut s, r);
}

#[test]
fn poison_fails_the_receive_it_replaces_and_blocks_must_agree() {
    // Held or not (the check comes before the hold): the poison of this call (its
    // sequence number) from a rank whose call has other blocks fails the progress that
    // reads it, whatever its tag, naming both.
    for hold in [Duration::ZERO, Duration::from_secs(60)] {
        receive_poison_and_blocks_of_2(hold, |_, r| match r {
            Err(CollectiveError::Mismatch { peer: 0, message }) => assert!(
                message.contains("blocks of 4 bytes")
                    && message.contains("with 2 bytes")
                    && message.contains("failed this collective"),
                "{hold:?}: {message}"
            ),
            other => panic!("{hold:?}: expected a block mismatch, got {other:?}"),
        });
    }
}

/// Poison of the call in progress from a rank whose call agrees fails only the receive
/// it replaces: taken aside at once, or held until a receive from that rank is posted.
#[test]
fn agreeing_poison_fails_the_receive_it_replaces() {
    for hold in [Duration::ZERO, Duration::from_secs(60)] {
        let (mut a, mut b) = pair(4, 128);
        b.hold = hold;
        {
            let bufs = Buffers {
                send: &[],
                recv: &mut [],
                scratch: &mut [],
                call: Call::new(CallKind::AllToAll).count(4),
            };
            let mut s = a.begin(0, bufs).unwrap();
            s.post_poison(1, 9).unwrap();
        }
        let mut recv = [0u8; 4];
        let bufs = Buffers {
            send: &[],
            recv: &mut recv,
            scratch: &mut [],
            call: Call::new(CallKind::AllToAll).count(4),
        };
        let mut s = b.begin(0, bufs).unwrap();
        std::thread::sleep(Duration::from_millis(10));
        s.progress(&mut Vec::new()).unwrap();
        s.post_recv(0, 9, Region::new(Buf::Recv, 0, 4), 0)
            .and_then(|()| complete(&mut s, 1))
            .map_or_else(
                |e| match e {
                    CollectiveError::Mismatch { peer: 0, message } => {
                        assert!(
                            message.contains("failed this collective"),
                            "{hold:?}: {message}"
                        )
                    }
                    other => panic!("{hold:?}: expected poison, got {other:?}"),
                },
                |()| panic!("{hold:?}: the poisoned receive completed"),
            );
    }
}

// ---- Cross-memory attach (rendezvous) ----

/// Lengths around a rendezvous threshold of 1000 bytes, with ring traffic between.
const RDV_LENS: &[usize] = &[0, 1, 999, 1000, 1001, 5000, 3, 20_000, 1 << 20, 1000, 64];
const RDV_MIN: usize = 1000;

/// One round of [`RDV_LENS`] both ways; receives posted before (`early`) or after the
/// sends (so that rendezvous arrive before their receive: read into the transport's
/// own memory).
fn rdv_round(t: &mut ShmTransport, r: usize, early: bool) -> Result<(), CollectiveError> {
    let me = t.rank();
    let peer = 1 - me;
    let send: Vec<u8> = RDV_LENS
        .iter()
        .enumerate()
        .flat_map(|(i, &l)| pattern(me, r, i, l))
        .collect();
    let total: usize = RDV_LENS.iter().sum();
    let mut recv = vec![0xeeu8; total];
    let offsets: Vec<usize> = RDV_LENS
        .iter()
        .scan(0, |o, &l| {
            let at = *o;
            *o += l;
            Some(at)
        })
        .collect();
    {
        let bufs = Buffers {
            send: &send,
            recv: &mut recv,
            scratch: &mut [],
            call: Call::NONE,
        };
        let mut s = t.begin((r as u64) << 48, bufs)?;
        let post_recvs = |s: &mut <ShmTransport as Transport>::Session<'_>| {
            for i in (0..RDV_LENS.len()).rev() {
                let region = Region::new(Buf::Recv, offsets[i], RDV_LENS[i]);
                s.post_recv(peer, i as u64, region, 1000 + i as u32)?;
            }
            Ok::<(), CollectiveError>(())
        };
        if early {
            post_recvs(&mut s)?;
        }
        for (i, &l) in RDV_LENS.iter().enumerate() {
            let region = Region::new(Buf::Send, offsets[i], l);
            s.post_send(peer, i as u64, region, i as u32)?;
        }
        if !early {
            // Let the peer's messages arrive first.
            let start = Instant::now();
            let mut sink = Vec::new();
            while start.elapsed() < Duration::from_millis(5) {
                s.progress(&mut sink)?;
            }
            post_recvs(&mut s)?;
            complete(&mut s, 2 * RDV_LENS.len() - sink.len())?;
        } else {
            complete(&mut s, 2 * RDV_LENS.len())?;
        }
    }
    for (i, &l) in RDV_LENS.iter().enumerate() {
        assert_eq!(
            &recv[offsets[i]..offsets[i] + l],
            &pattern(peer, r, i, l)[..],
            "rank {me} round {r} message {i} ({l} bytes)"
        );
    }
    Ok(())
}

/// How many of [`RDV_LENS`] go by rendezvous per round.
fn rdv_per_round() -> u64 {
    RDV_LENS.iter().filter(|&&l| l >= RDV_MIN).count() as u64
}

#[test]
fn rendezvous_byte_exact_at_below_and_above_the_threshold_in_one_process() {
    // Tiny rings: rendezvous cells interleave with eager and pipelined messages and
    // wrap around; the ring is full of unacked rendezvous at times.
    for (slots, cell) in [(2, 64), (3, 256), (32, 8192)] {
        let (mut a, mut b) = pair(slots, cell);
        // This process reads itself: the probe succeeds.
        assert_eq!(a.cma_pid[1], std::process::id());
        assert_eq!(b.cma_pid[0], std::process::id());
        a.cma.min = RDV_MIN;
        b.cma.min = RDV_MIN;
        std::thread::scope(|s| {
            s.spawn(|| {
                for r in 0..20 {
                    rdv_round(&mut a, r, r % 2 == 0).unwrap();
                }
            });
            s.spawn(|| {
                for r in 0..20 {
                    rdv_round(&mut b, r, r % 3 == 0).unwrap();
                }
            });
        });
        assert_eq!(a.rdv_sent, 20 * rdv_per_round(), "{slots} x {cell}");
        assert_eq!(b.rdv_sent, 20 * rdv_per_round(), "{slots} x {cell}");
        assert!(a.broken.is_none() && b.broken.is_none());
        assert!(a.unexpected.is_empty() && b.unexpected.is_empty());
    }
}

#[test]
fn rendezvous_off_takes_the_ring() {
    let (mut a, mut b) = pair(3, 256);
    a.cma.min = RDV_MIN;
    b.cma.min = RDV_MIN;
    a.cma.mode = super::cma::CmaMode::Off;
    b.cma.mode = super::cma::CmaMode::Off;
    std::thread::scope(|s| {
        s.spawn(|| rdv_round(&mut a, 0, true).unwrap());
        s.spawn(|| rdv_round(&mut b, 0, false).unwrap());
    });
    assert_eq!((a.rdv_sent, b.rdv_sent), (0, 0));
}

#[test]
fn the_probe_refuses_a_dead_process_and_a_wrong_word() {
    let (addr, val) = super::cma::probe_word();
    assert_eq!(super::cma::probe(std::process::id(), addr, val), Ok(()));
    let e = super::cma::probe(std::process::id(), addr, val ^ 2).unwrap_err();
    assert!(e.contains("not the peer"), "{e}");
    // A process that ended (and was reaped): its pid names nobody.
    let mut c = std::process::Command::new("true").spawn().unwrap();
    let pid = c.id();
    c.wait().unwrap();
    let e = super::cma::probe(pid, addr, val).unwrap_err();
    assert!(e.contains("process_vm_readv"), "{e}");
    assert!(super::cma::probe(0, addr, val).is_err());
    // The pidfd check after every read: this process lives, a child that ended not.
    let me = super::cma::pidfd(std::process::id()).expect("pidfd_open (Linux 5.3)");
    assert!(!super::cma::exited(&me));
    let mut c = std::process::Command::new("true").spawn().unwrap();
    let fd = super::cma::pidfd(c.id()).expect("pidfd of a child");
    c.wait().unwrap();
    assert!(super::cma::exited(&fd));
}

#[test]
fn a_withdrawn_rendezvous_fails_its_receive_with_the_senders_rank() {
    let (mut a, mut b) = pair(4, 128);
    a.cma.min = 64;
    let send = vec![7u8; 4096];
    {
        let bufs = Buffers {
            send: &send,
            recv: &mut [],
            scratch: &mut [],
            call: Call::NONE,
        };
        let mut s = a.begin(0, bufs).unwrap();
        s.post_send(1, 5, Region::new(Buf::Send, 0, 4096), 0)
            .unwrap();
        s.post_send(1, 6, Region::new(Buf::Send, 0, 4096), 1)
            .unwrap();
        let mut done = Vec::new();
        s.progress(&mut done).unwrap();
        assert!(
            done.is_empty(),
            "a rendezvous completed without its receiver"
        );
        // The session ends (a timeout, an abort) with both unacked: withdrawn.
    }
    assert!(a.broken.is_some());
    assert_eq!(a.rdv_sent, 2);
    let mut recv = vec![0u8; 8192];
    let bufs = receiving_into(&mut recv);
    let mut s = b.begin(0, bufs).unwrap();
    // The first with its receive posted, the second before its receive.
    s.post_recv(0, 5, Region::new(Buf::Recv, 0, 4096), 0)
        .unwrap();
    match complete(&mut s, 1) {
        Err(CollectiveError::Remote { peer: 0, message }) => {
            assert!(message.contains("withdrew"), "{message}")
        }
        other => panic!("expected the withdrawal, got {other:?}"),
    }
    drop(s);
    assert!(recv.iter().all(|&x| x == 0), "withdrawn bytes were written");
}

// ---- Between real processes: this test binary, run again as the other rank ----

fn proc_of(pid: u32) -> crate::host::proc::Proc {
    crate::host::proc::Proc {
        pid,
        start: crate::host::proc::proc_stat(&format!("/proc/{pid}/stat"))
            .unwrap()
            .1,
    }
}

/// Starts this test binary as the other rank (`cma_peer_process`) with `env`.
fn spawn_peer(seg: &Segment, role: &str, env: &[(&str, &str)]) -> std::process::Child {
    std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "transport::shm::tests::cma_peer_process",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("HALO_SHM_TEST_SEGMENT", seg.path())
        .env("HALO_SHM_TEST_ROLE", role)
        .env_remove("HALO_SHM_CMA")
        .env_remove("HALO_SHM_CMA_MIN")
        .envs(env.iter().copied())
        .stdin(std::process::Stdio::null())
        .spawn()
        .unwrap()
}

fn wait_child(c: &mut std::process::Child) -> std::process::ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(st) = c.try_wait().unwrap() {
            return st;
        }
        if start.elapsed() > Duration::from_secs(60) {
            let _ = c.kill();
            let _ = c.wait();
            panic!("the peer process ran past 60 s");
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The other rank (rank 0) of the process tests below; not a test on its own.
#[test]
#[ignore = "the other rank of the process tests, started by them"]
fn cma_peer_process() {
    let path = std::env::var("HALO_SHM_TEST_SEGMENT").expect("started by a process test");
    let role = std::env::var("HALO_SHM_TEST_ROLE").unwrap();
    let seg = Segment::open_when_ready(&path, 2, Duration::from_secs(30), || false).unwrap();
    let parent = proc_of(std::os::unix::process::parent_id());
    let mut t = ShmTransport::new(0, 2, seg, vec![None, Some(parent)]).unwrap();
    wait_cma_word(&t, 1);
    match role.as_str() {
        "exact" => {
            for r in 0..6 {
                rdv_round(&mut t, r, r % 2 == 0).unwrap();
            }
            let want: u64 = std::env::var("HALO_SHM_TEST_RDV").unwrap().parse().unwrap();
            assert_eq!(t.rdv_sent, want);
        }
        "send-and-wait" => {
            // One rendezvous, then wait for an ack that will not come: killed meanwhile.
            let send = vec![3u8; 1 << 20];
            let bufs = Buffers {
                send: &send,
                recv: &mut [],
                scratch: &mut [],
                call: Call::NONE,
            };
            let mut s = t.begin(0, bufs).unwrap();
            s.post_send(1, 1, Region::new(Buf::Send, 0, 1 << 20), 0)
                .unwrap();
            let _ = complete(&mut s, 1);
            panic!("the receiver acked a message it was not reading");
        }
        "idle" => std::thread::sleep(Duration::from_secs(30)),
        other => panic!("role {other}"),
    }
}

/// Waits until `peer` has said whether it reads this rank's rendezvous (its probe).
fn wait_cma_word(t: &ShmTransport, peer: usize) {
    let start = Instant::now();
    while t
        .seg
        .ring(t.rank, peer)
        .cma
        .load(std::sync::atomic::Ordering::Acquire)
        == 0
    {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "rank {peer} never probed"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn process_pair(role: &str, env: &[(&str, &str)]) -> (ShmTransport, std::process::Child) {
    let seg = Segment::create_with(2, 4, 256).unwrap();
    let child = spawn_peer(&seg, role, env);
    let t = ShmTransport::new(1, 2, seg, vec![Some(proc_of(child.id())), None]).unwrap();
    (t, child)
}

#[test]
fn rendezvous_byte_exact_between_processes_and_forced_off() {
    let per = rdv_per_round();
    for (cma, want) in [("auto", 6 * per), ("0", 0)] {
        let n = want.to_string();
        let env = [
            ("HALO_SHM_CMA", cma),
            ("HALO_SHM_CMA_MIN", "1000"),
            ("HALO_SHM_TEST_RDV", n.as_str()),
        ];
        let (mut t, mut child) = process_pair("exact", &env);
        if cma == "0" {
            // The peer did not offer to read this process: the ring, whatever this
            // rank's settings.
            assert_eq!(t.cma_pid[0], 0);
        } else {
            assert_eq!(t.cma_pid[0], child.id());
        }
        t.cma.min = RDV_MIN;
        wait_cma_word(&t, 0);
        for r in 0..6 {
            rdv_round(&mut t, r, r % 3 == 0).unwrap();
        }
        assert_eq!(t.rdv_sent, want, "HALO_SHM_CMA={cma}");
        assert!(wait_child(&mut child).success(), "HALO_SHM_CMA={cma}");
    }
}

/// Waits until `pid` is a zombie (killed, not reaped).
fn wait_zombie(pid: u32) {
    let start = Instant::now();
    loop {
        let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        if s.rsplit_once(')').unwrap().1.trim_start().starts_with('Z') {
            return;
        }
        assert!(start.elapsed() < Duration::from_secs(10));
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn a_sender_killed_during_a_rendezvous_fails_the_receive_naming_it() {
    let (mut t, mut child) = process_pair("send-and-wait", &[("HALO_SHM_CMA_MIN", "4096")]);
    let cell = t.seg.cell(0, 1, 0);
    let start = Instant::now();
    // SAFETY: (test) cell 0 of the ring from rank 0, which this rank receives on.
    while !unsafe { super::segment::published(cell, 0) } {
        assert!(start.elapsed() < Duration::from_secs(20), "no rendezvous");
        std::thread::sleep(Duration::from_millis(1));
    }
    // The rendezvous is published and not read: the sender dies.
    // SAFETY: (test) a signal to the child this test started.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    wait_zombie(child.id());
    let mut recv = vec![0u8; 1 << 20];
    let bufs = receiving_into(&mut recv);
    let started = Instant::now();
    {
        let mut s = t.begin(0, bufs).unwrap();
        s.post_recv(0, 1, Region::new(Buf::Recv, 0, 1 << 20), 0)
            .unwrap();
        match complete(&mut s, 1) {
            Err(CollectiveError::Remote { peer: 0, message }) => {
                assert!(
                    message.contains("ended before rank 1 had read"),
                    "{message}"
                )
            }
            other => panic!("expected rank 0's end, got {other:?}"),
        }
    }
    assert!(started.elapsed() < Duration::from_secs(2));
    assert!(recv.iter().all(|&x| x == 0));
    let _ = child.wait();
}

#[test]
fn a_receiver_killed_while_its_sender_waits_for_the_ack_fails_the_send() {
    let (mut t, mut child) = process_pair("idle", &[]);
    t.cma.min = 4096;
    wait_cma_word(&t, 0);
    let send = vec![9u8; 1 << 20];
    let bufs = Buffers {
        send: &send,
        recv: &mut [],
        scratch: &mut [],
        call: Call::NONE,
    };
    let mut s = t.begin(0, bufs).unwrap();
    s.post_send(0, 1, Region::new(Buf::Send, 0, 1 << 20), 0)
        .unwrap();
    let mut sink = Vec::new();
    s.progress(&mut sink).unwrap();
    assert!(sink.is_empty(), "completed without an ack");
    // SAFETY: (test) a signal to the child this test started.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    let started = Instant::now();
    match complete(&mut s, 1) {
        Err(CollectiveError::Remote { peer: 0, message }) => {
            assert!(message.contains("ended"), "{message}")
        }
        other => panic!("expected rank 0's end, got {other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(2));
    drop(s);
    assert!(t.broken.is_some());
    assert_eq!(t.rdv_sent, 1);
    let _ = child.wait();
}

#[test]
fn receives_up_to_a_length_take_shorter_messages_and_tell_their_length() {
    // Tiny rings (messages above 64 bytes are larger than the ring: they arrive in
    // part before a late receive is posted) and the default cells.
    for (slots, cell) in [(2, 64), (32, 8192)] {
        for late in [false, true] {
            let (mut a, mut b) = pair(slots, cell);
            std::thread::scope(|s| {
                s.spawn(|| crate::transport::testing::receives_up_to(&mut a, late));
                s.spawn(|| crate::transport::testing::receives_up_to(&mut b, late));
            });
            assert!(a.broken.is_none() && b.broken.is_none());
            assert!(a.unexpected.is_empty() && b.unexpected.is_empty());
        }
    }
    let (mut a, mut b) = pair(4, 64);
    std::thread::scope(|s| {
        s.spawn(|| crate::transport::testing::a_longer_message_is_a_mismatch(&mut a));
        s.spawn(|| crate::transport::testing::a_longer_message_is_a_mismatch(&mut b));
    });
}

/// Rank 0 of [`pair`]: sends `RDV_MIN * 20` bytes (tag 1; by rendezvous or, larger than
/// the ring, through it), then 8 bytes (tag 2), and waits for both to be taken.
fn send_large_then_small(t: &mut ShmTransport) -> Vec<u8> {
    let big = pattern(0, 0, 1, RDV_MIN * 20);
    let mut send = big.clone();
    send.extend_from_slice(&[9u8; 8]);
    let bufs = Buffers {
        send: &send,
        recv: &mut [],
        scratch: &mut [],
        call: Call::NONE,
    };
    let mut s = t.begin(0, bufs).unwrap();
    s.post_send(1, 1, Region::new(Buf::Send, 0, big.len()), 0)
        .unwrap();
    s.post_send(1, 2, Region::new(Buf::Send, big.len(), 8), 1)
        .unwrap();
    complete(&mut s, 2).unwrap();
    big
}

/// One exchange of [`send_large_then_small`] on a pair with rings of 8 cells of 256
/// bytes, rank 1 holding messages for 60 s (long enough that no scheduling delay of a
/// loaded machine lets it run out); the large message goes by rendezvous or
/// (`!rendezvous`) through the ring, whose 2 KB it fills. `receive` posts rank 1's
/// receives (tag 1 into `0..RDV_MIN * 20`, tag 2 behind it) and completes them. Checks
/// both messages byte-exact and rank 1's transport clean afterwards; returns
/// `(rendezvous sends of rank 0, messages rank 1 read aside, what receive returned)`.
fn exchange_while_holding<T: Send>(
    rendezvous: bool,
    receive: impl FnOnce(&mut ShmSession<'_>) -> T,
) -> (u64, u64, T) {
    let (mut a, mut b) = pair(8, 256);
    a.cma.min = if rendezvous { RDV_MIN } else { usize::MAX };
    b.cma.min = RDV_MIN;
    b.hold = Duration::from_secs(60);
    let mut recv = vec![0u8; RDV_MIN * 20 + 8];
    let (big, out) = std::thread::scope(|sc| {
        let h = sc.spawn(|| send_large_then_small(&mut a));
        let bufs = receiving_into(&mut recv);
        let mut s = b.begin(0, bufs).unwrap();
        let out = receive(&mut s);
        drop(s);
        (h.join().unwrap(), out)
    });
    assert_eq!(&recv[..big.len()], &big[..], "rendezvous {rendezvous}");
    assert_eq!(&recv[big.len()..], &[9u8; 8]);
    assert!(b.unexpected.is_empty() && b.broken.is_none());
    (a.rdv_sent, b.buffered, out)
}

/// A receive of tag 1 (`RDV_MIN * 20` bytes, at 0) or tag 2 (8 bytes, behind it).
fn region_of(tag: u64) -> Region {
    match tag {
        1 => Region::new(Buf::Recv, 0, RDV_MIN * 20),
        _ => Region::new(Buf::Recv, RDV_MIN * 20, 8),
    }
}

#[test]
fn a_message_waits_at_the_ring_head_for_its_receive_and_is_read_once() {
    for rendezvous in [true, false] {
        let (sent, buffered, ()) = exchange_while_holding(rendezvous, |s| {
            // The message arrives while no receive from rank 0 is posted: it stays in
            // the ring (and the small message behind it with it).
            let start = Instant::now();
            let mut done = Vec::new();
            while start.elapsed() < Duration::from_millis(50) {
                s.progress(&mut done).unwrap();
            }
            assert!(done.is_empty());
            s.post_recv(0, 1, region_of(1), 10).unwrap();
            s.post_recv(0, 2, region_of(2), 11).unwrap();
            complete(s, 2).unwrap();
        });
        assert_eq!(
            (sent, buffered),
            (u64::from(rendezvous), 0),
            "rendezvous {rendezvous}: read straight into place"
        );
    }
}

#[test]
fn a_receive_behind_a_waiting_message_is_not_held_up_by_it() {
    for rendezvous in [true, false] {
        let (sent, buffered, took) = exchange_while_holding(rendezvous, |s| {
            // Only the small message's receive: a receive from rank 0 is posted, so
            // the message ahead of it is read aside at once, far sooner than the hold.
            let start = Instant::now();
            s.post_recv(0, 2, region_of(2), 11).unwrap();
            complete(s, 1).unwrap();
            let took = start.elapsed();
            s.post_recv(0, 1, region_of(1), 10).unwrap();
            complete(s, 1).unwrap();
            took
        });
        assert!(took < Duration::from_secs(20), "held for {took:?}");
        assert_eq!(
            (sent, buffered),
            (u64::from(rendezvous), 1),
            "rendezvous {rendezvous}: read aside, then copied"
        );
    }
}

#[test]
fn a_send_written_now_is_received_byte_exact_and_refused_when_it_would_wait() {
    // 3 cells of 64 bytes: 32 bytes of payload each.
    let (mut a, mut b) = pair(3, 64);
    let tag = |k: u64| (7u64 << 48) | k;
    let msgs: Vec<Vec<u8>> = (0..3).map(|k| pattern(0, 1, k, 10 + k)).collect();
    for (k, m) in msgs.iter().enumerate() {
        assert!(a.try_send_now(1, tag(k as u64), m), "message {k}");
    }
    // The ring is full; more than a cell's payload; to itself; to no rank.
    assert!(!a.try_send_now(1, tag(3), &[1]));
    assert!(!a.try_send_now(1, tag(3), &[0; 33]));
    assert!(!a.try_send_now(0, tag(3), &[1]));
    assert!(!a.try_send_now(2, tag(3), &[1]));
    // Received by a session as any message with those tags, in another order.
    let mut recv = vec![0xeeu8; 33];
    {
        let mut s = b.begin(7u64 << 48, receiving_into(&mut recv)).unwrap();
        let mut at = 0;
        for k in [2usize, 0, 1] {
            let len = 10 + k;
            s.post_recv(0, k as u64, Region::new(Buf::Recv, at, len), k as u32)
                .unwrap();
            at += len;
        }
        complete(&mut s, 3).unwrap();
    }
    assert_eq!(&recv[..12], &msgs[2][..]);
    assert_eq!(&recv[12..22], &msgs[0][..]);
    assert_eq!(&recv[22..], &msgs[1][..]);
    // The cells are free again; a broken transport writes nothing.
    assert!(a.try_send_now(1, tag(3), &[]));
    a.broken = Some("test".into());
    assert!(!a.try_send_now(1, tag(4), &[1]));
}
