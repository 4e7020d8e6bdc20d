//! `halo params`: the table of `halo-params` with this environment's values; a secret's
//! value never printed; an unknown name refused with exit status 2.

use std::process::{Command, Output};

fn halo(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_halo"));
    cmd.arg("params").args(args);
    for p in halo_params::ALL {
        cmd.env_remove(p.name);
    }
    cmd.envs(env.iter().copied());
    cmd.output().expect("running halo params")
}

fn stdout(o: &Output) -> String {
    assert!(o.status.success(), "{o:?}");
    String::from_utf8(o.stdout.clone()).unwrap()
}

#[test]
fn every_parameter_is_listed_with_its_value() {
    let out = stdout(&halo(&[], &[("HALO_SHM_CELL", "4096")]));
    let lines: Vec<&str> = out.lines().filter(|l| l.starts_with("HALO_")).collect();
    assert_eq!(lines.len(), halo_params::ALL.len(), "{out}");
    let cell = lines
        .iter()
        .find(|l| l.starts_with("HALO_SHM_CELL "))
        .unwrap();
    assert!(
        cell.contains("\"4096\"") && cell.contains("(default 8192;"),
        "{cell}"
    );
    let timeout = lines
        .iter()
        .find(|l| l.starts_with("HALO_TIMEOUT_MS "))
        .unwrap();
    assert!(timeout.contains("  -  (default 60000;"), "{timeout}");
}

#[test]
fn a_bad_number_is_flagged() {
    let out = stdout(&halo(
        &["shm_slots", "TIMEOUT_MS"],
        &[("HALO_SHM_SLOTS", "1"), ("HALO_TIMEOUT_MS", "5s")],
    ));
    let slots = out
        .lines()
        .find(|l| l.starts_with("HALO_SHM_SLOTS "))
        .unwrap();
    assert!(
        slots.ends_with("BAD: HALO_SHM_SLOTS=\"1\" is outside 2..=65536 slots"),
        "{slots}"
    );
    let t = out
        .lines()
        .find(|l| l.starts_with("HALO_TIMEOUT_MS "))
        .unwrap();
    assert!(
        t.ends_with("BAD: HALO_TIMEOUT_MS=\"5s\" is not a number of milliseconds"),
        "{t}"
    );
}

#[test]
fn a_secret_is_shown_as_set_never_its_value() {
    let secret = "ab".repeat(32);
    let out = stdout(&halo(
        &["SECRET", "HALO_SECRET_FILE"],
        &[("HALO_SECRET", &secret)],
    ));
    assert!(!out.contains(&secret), "{out}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("HALO_SECRET ") && l.contains("(set)")),
        "{out}"
    );
    assert_eq!(
        out.lines().filter(|l| l.starts_with("HALO_")).count(),
        2,
        "{out}"
    );
}

#[test]
fn only_the_set_ones_with_set() {
    let out = stdout(&halo(
        &["--set"],
        &[("HALO_PROGRESS", "spin"), ("HALO_ALGO", "halo")],
    ));
    let names: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("HALO_"))
        .map(|l| l.split_whitespace().next().unwrap())
        .collect();
    assert_eq!(names, ["HALO_ALGO", "HALO_PROGRESS"], "{out}");
}

#[test]
fn an_unknown_name_is_refused() {
    let o = halo(&["NOPE"], &[]);
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("HALO_NOPE is not a HALO parameter"), "{err}");
}
