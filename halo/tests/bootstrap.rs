//! Bootstrap: unique ids, the rendezvous over real TCP on loopback, every
//! environment style, a wrong-secret connection refused while the job completes.

use halo::Error;
use halo::bootstrap::{
    EnvBootstrap, EnvSource, RendezvousRoot, SecretSource, UniqueId, exchange, random_secret,
};
use std::collections::BTreeMap;
use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

const LOOPBACK: &str = "127.0.0.1:0";

fn free_port() -> u16 {
    TcpListener::bind(LOOPBACK)
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn env(pairs: &[(&str, String)]) -> EnvSource {
    EnvSource::Snapshot(
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect::<BTreeMap<_, _>>(),
    )
}

#[test]
fn unique_id_round_trips_and_hides_its_secret() {
    let secret = [7u8; 32];
    let addr: SocketAddr = "10.201.0.3:4242".parse().unwrap();
    let id = UniqueId::from_parts(addr, &secret);
    let back = UniqueId::from_bytes(id.as_bytes()).unwrap();
    assert_eq!(back, id);
    assert_eq!(back.root(), addr);
    assert_eq!(back.secret(), secret);
    let v6: SocketAddr = "[fe80::1]:99".parse().unwrap();
    assert_eq!(UniqueId::from_parts(v6, &secret).root(), v6);
    assert!(
        !format!("{id:?}").contains("7, 7"),
        "Debug must not print the secret"
    );

    let e = UniqueId::from_bytes(&[0u8; 12]).unwrap_err();
    assert_eq!(e.code(), 4, "{e}");
    assert!(e.to_string().contains("128 bytes, got 12"), "{e}");
    let e = UniqueId::from_bytes(&[0u8; 128]).unwrap_err();
    assert!(e.to_string().contains("not a HALO unique id"), "{e}");
}

#[test]
fn four_ranks_exchange_payloads_in_rank_order() {
    let id = UniqueId::new_on(LOOPBACK.parse().unwrap()).unwrap();
    let handles: Vec<_> = (0..4)
        .map(|rank| {
            std::thread::spawn(move || {
                let payload = format!("rank {rank} says hello").into_bytes();
                exchange(
                    id.root(),
                    &id.secret(),
                    rank,
                    4,
                    &payload,
                    Duration::from_secs(20),
                )
            })
        })
        .collect();
    for h in handles {
        let all = h.join().unwrap().unwrap();
        let text: Vec<String> = all
            .into_iter()
            .map(|p| String::from_utf8(p).unwrap())
            .collect();
        assert_eq!(
            text,
            (0..4)
                .map(|r| format!("rank {r} says hello"))
                .collect::<Vec<_>>()
        );
    }
}

#[test]
fn wrong_secret_is_refused_while_the_job_completes() {
    let secret = random_secret().unwrap();
    let root = RendezvousRoot::start(
        LOOPBACK.parse().unwrap(),
        secret,
        Some(2),
        Duration::from_secs(20),
    )
    .unwrap();
    let addr = root.local_addr();
    // An intruder with the wrong secret, and one that sends garbage, come first.
    let mut wrong = secret;
    wrong[0] ^= 1;
    let intruder =
        std::thread::spawn(move || exchange(addr, &wrong, 0, 2, b"evil", Duration::from_secs(5)));
    let mut garbage = TcpStream::connect(addr).unwrap();
    garbage.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
    let e = intruder.join().unwrap().unwrap_err();
    assert_eq!(e.code(), 2, "the intruder's connection is closed: {e}");
    let ranks: Vec<_> = (0..2)
        .map(|rank| {
            std::thread::spawn(move || {
                exchange(
                    addr,
                    &secret,
                    rank,
                    2,
                    &[rank as u8],
                    Duration::from_secs(20),
                )
            })
        })
        .collect();
    for r in ranks {
        assert_eq!(r.join().unwrap().unwrap(), vec![vec![0u8], vec![1u8]]);
    }
    root.join().unwrap();
}

#[test]
fn disagreeing_size_and_duplicate_rank_are_refused() {
    let secret = random_secret().unwrap();
    let root = RendezvousRoot::start(
        LOOPBACK.parse().unwrap(),
        secret,
        Some(2),
        Duration::from_secs(20),
    )
    .unwrap();
    let addr = root.local_addr();
    let e = exchange(addr, &secret, 1, 3, b"", Duration::from_secs(5)).unwrap_err();
    assert!(matches!(e, Error::InvalidUsage { .. }), "{e}");
    assert!(e.to_string().contains("says the job has 3 ranks"), "{e}");
    let a =
        std::thread::spawn(move || exchange(addr, &secret, 0, 2, b"a", Duration::from_secs(20)));
    std::thread::sleep(Duration::from_millis(200));
    let e = exchange(addr, &secret, 0, 2, b"b", Duration::from_secs(5)).unwrap_err();
    assert!(e.to_string().contains("rank 0 joined twice"), "{e}");
    let b = exchange(addr, &secret, 1, 2, b"c", Duration::from_secs(20)).unwrap();
    assert_eq!(b, vec![b"a".to_vec(), b"c".to_vec()]);
    assert_eq!(a.join().unwrap().unwrap(), b);
    root.join().unwrap();
}

#[test]
fn missing_rank_times_out_naming_it() {
    let secret = random_secret().unwrap();
    let root = RendezvousRoot::start(
        LOOPBACK.parse().unwrap(),
        secret,
        Some(3),
        Duration::from_millis(700),
    )
    .unwrap();
    let addr = root.local_addr();
    let t = Instant::now();
    let joined: Vec<_> = [0usize, 2]
        .into_iter()
        .map(|rank| {
            std::thread::spawn(move || {
                exchange(addr, &secret, rank, 3, b"x", Duration::from_secs(10))
            })
        })
        .collect();
    for j in joined {
        let e = j.join().unwrap().unwrap_err();
        assert!(e.to_string().contains("ranks [1] of 3 never joined"), "{e}");
    }
    assert!(t.elapsed() < Duration::from_secs(5));
    let e = root.join().unwrap_err();
    assert_eq!(e.code(), 8, "{e}");
    // Nobody at all: the client gives up within its own timeout.
    let port = free_port();
    let t = Instant::now();
    let e = exchange(
        format!("127.0.0.1:{port}").parse().unwrap(),
        &secret,
        0,
        2,
        b"",
        Duration::from_millis(300),
    )
    .unwrap_err();
    assert_eq!(e.code(), 8, "{e}");
    assert!(t.elapsed() < Duration::from_secs(3));
}

#[test]
fn every_environment_style_is_read() {
    let torch = env(&[
        ("RANK", "2".into()),
        ("WORLD_SIZE", "4".into()),
        ("MASTER_ADDR", "127.0.0.1".into()),
        ("MASTER_PORT", "29500".into()),
        ("TORCHELASTIC_RUN_ID", "abc".into()),
        ("HALO_SECRET", "insecure-derived".into()),
    ]);
    let b = EnvBootstrap::detect(&torch).unwrap();
    assert_eq!((b.rank, b.size, b.launcher), (2, 4, "torchrun"));
    assert_eq!(
        b.root,
        "127.0.0.1:29501".parse().unwrap(),
        "MASTER_PORT + 1: torch's store keeps MASTER_PORT"
    );
    assert_eq!(b.secret_source, SecretSource::InsecureDerived);

    let ompi = env(&[
        ("OMPI_COMM_WORLD_RANK", "0".into()),
        ("OMPI_COMM_WORLD_SIZE", "8".into()),
        ("HALO_BOOTSTRAP_ADDR", "127.0.0.1:5000".into()),
        ("HALO_SECRET", "ab".repeat(32)),
    ]);
    let b = EnvBootstrap::detect(&ompi).unwrap();
    assert_eq!((b.rank, b.size, b.launcher), (0, 8, "openmpi"));
    assert_eq!(b.root, "127.0.0.1:5000".parse().unwrap());
    assert_eq!(b.secret, [0xab; 32]);
    assert_eq!(b.secret_source, SecretSource::Env);

    let pmi = env(&[
        ("PMI_RANK", "1".into()),
        ("PMI_SIZE", "2".into()),
        ("HALO_BOOTSTRAP_ADDR", "127.0.0.1".into()),
        ("HALO_SECRET", "cd".repeat(32)),
    ]);
    let b = EnvBootstrap::detect(&pmi).unwrap();
    assert_eq!((b.rank, b.size, b.launcher), (1, 2, "pmi"));
    assert_eq!(b.root.port(), halo::bootstrap::DEFAULT_BOOTSTRAP_PORT);

    let slurm = env(&[
        ("SLURM_PROCID", "3".into()),
        ("SLURM_NTASKS", "16".into()),
        ("SLURM_JOB_ID", "1234".into()),
        ("SLURM_JOB_NODELIST", "localhost".into()),
        ("HALO_SECRET", "insecure-derived".into()),
    ]);
    let b = EnvBootstrap::detect(&slurm).unwrap();
    assert_eq!((b.rank, b.size, b.launcher), (3, 16, "slurm"));
    assert!(b.root.ip().is_loopback());

    // Two ranks of one job derive the same (insecure) secret; another job does not.
    let other_rank = env(&[
        ("SLURM_PROCID", "0".into()),
        ("SLURM_NTASKS", "16".into()),
        ("SLURM_JOB_ID", "1234".into()),
        ("SLURM_JOB_NODELIST", "localhost".into()),
        ("HALO_SECRET", "insecure-derived".into()),
    ]);
    let other_job = env(&[
        ("SLURM_PROCID", "0".into()),
        ("SLURM_NTASKS", "16".into()),
        ("SLURM_JOB_ID", "1235".into()),
        ("SLURM_JOB_NODELIST", "localhost".into()),
        ("HALO_SECRET", "insecure-derived".into()),
    ]);
    assert_eq!(EnvBootstrap::detect(&other_rank).unwrap().secret, b.secret);
    assert_ne!(EnvBootstrap::detect(&other_job).unwrap().secret, b.secret);
}

#[test]
fn bad_environments_name_the_variable() {
    let cases: Vec<(Vec<(&str, String)>, &str)> = vec![
        (vec![], "no launcher environment"),
        (
            vec![("RANK", "1".into())],
            "RANK and WORLD_SIZE must be set together",
        ),
        (
            vec![("RANK", "x".into()), ("WORLD_SIZE", "2".into())],
            "RANK=\"x\"",
        ),
        (
            vec![("RANK", "2".into()), ("WORLD_SIZE", "2".into())],
            "rank 2 out of range",
        ),
        (
            vec![("RANK", "0".into()), ("WORLD_SIZE", "2".into())],
            "no rendezvous address",
        ),
        (
            vec![
                ("RANK", "0".into()),
                ("WORLD_SIZE", "2".into()),
                ("MASTER_ADDR", "127.0.0.1".into()),
                ("HALO_SECRET", "zz".into()),
            ],
            "HALO_SECRET must be 64 hexadecimal digits",
        ),
        (
            vec![
                ("RANK", "0".into()),
                ("WORLD_SIZE", "2".into()),
                ("MASTER_ADDR", "127.0.0.1".into()),
            ],
            "no job secret",
        ),
        (
            vec![
                ("SLURM_PROCID", "0".into()),
                ("SLURM_NTASKS", "2".into()),
                ("SLURM_JOB_NODELIST", "n[1-".into()),
            ],
            "SLURM_JOB_NODELIST",
        ),
    ];
    for (vars, want) in cases {
        let e = EnvBootstrap::detect(&env(&vars)).unwrap_err();
        assert_eq!(e.code(), 4, "{e}");
        assert!(e.to_string().contains(want), "{vars:?}: {e}");
    }
}

#[test]
fn torchrun_style_job_joins() {
    let port = free_port();
    let handles: Vec<_> = (0..3)
        .map(|rank| {
            let vars = env(&[
                ("RANK", rank.to_string()),
                ("WORLD_SIZE", "3".into()),
                ("MASTER_ADDR", "127.0.0.1".into()),
                ("MASTER_PORT", (port - 1).to_string()),
                ("HALO_SECRET", "3c".repeat(32)),
                ("HALO_BOOTSTRAP_TIMEOUT_MS", "20000".into()),
            ]);
            std::thread::spawn(move || {
                let b = EnvBootstrap::detect(&vars)?;
                b.join(format!("host-of-{rank}").as_bytes())
            })
        })
        .collect();
    for h in handles {
        let all = h.join().unwrap().unwrap();
        assert_eq!(
            all,
            (0..3)
                .map(|r| format!("host-of-{r}").into_bytes())
                .collect::<Vec<_>>()
        );
    }
}

/// `HALO_BOOTSTRAP_SERVED=1` (what `halo launch` sets when it serves the root on the
/// port it holds): rank 0 does not bind the root address, it connects like the others,
/// and every rank gets every payload from the launcher's root; another value is an
/// error naming the variable.
#[test]
fn a_root_served_by_the_launcher_is_joined_by_rank_0_too() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let secret = [0x5a; 32];
    let root = halo::bootstrap::RendezvousRoot::serve_on(
        listener,
        secret,
        Some(3),
        std::time::Duration::from_secs(30),
    )
    .unwrap();
    let ranks: Vec<_> = (0..3)
        .map(|r| {
            std::thread::spawn(move || {
                let b = EnvBootstrap::detect(&env(&[
                    ("RANK", r.to_string()),
                    ("WORLD_SIZE", "3".into()),
                    ("HALO_BOOTSTRAP_ADDR", addr.to_string()),
                    ("HALO_SECRET", "5a".repeat(32)),
                    ("HALO_BOOTSTRAP_SERVED", "1".into()),
                ]))
                .unwrap();
                assert!(b.root_served);
                b.join(&[r as u8; 5]).unwrap()
            })
        })
        .collect();
    for t in ranks {
        let got = t.join().unwrap();
        assert_eq!(got, vec![vec![0u8; 5], vec![1u8; 5], vec![2u8; 5]]);
    }
    root.join().unwrap();

    let err = EnvBootstrap::detect(&env(&[
        ("RANK", "0".into()),
        ("WORLD_SIZE", "2".into()),
        ("HALO_BOOTSTRAP_ADDR", "127.0.0.1:5000".into()),
        ("HALO_BOOTSTRAP_SERVED", "yes".into()),
    ]))
    .unwrap_err();
    assert!(
        matches!(&err, halo::Error::InvalidArgument { .. })
            && err.to_string().contains("HALO_BOOTSTRAP_SERVED"),
        "{err:?}"
    );
}
