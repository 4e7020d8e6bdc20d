//! `halo launch --mpi`: the command as an Open MPI program, on the same layout.
//!
//! On emulated hosts mpirun itself runs inside host 0 (its namespace, hostname
//! `host0`): the hostfile lists the hosts by address, so Open MPI sees that
//! `10.201.0.1` is its own and starts host 0's ranks itself, and reaches the other
//! hosts through a stand-in for ssh (the "rsh agent") that runs Open MPI's daemon
//! command inside that host's namespace with that host's hostname — through a
//! shell, as ssh would. Open MPI's out-of-band and TCP traffic is pinned to the
//! emulated subnet; ranks on one host use shared memory (`vader`), ranks on
//! different hosts TCP over the shaped veths.

use super::LaunchError;
use super::netns::{Host, SUBNET};
use super::placement::Placement;
use std::path::{Path, PathBuf};

/// Finds Open MPI's `mpirun` on `PATH`, refusing MPICH's (its options differ).
pub(crate) fn find_mpirun() -> Result<PathBuf, LaunchError> {
    let missing = || {
        LaunchError::invalid(
            "--mpi needs Open MPI's mpirun on PATH (Debian: apt-get install openmpi-bin libopenmpi-dev)",
        )
    };
    let path = std::env::var_os("PATH").ok_or_else(missing)?;
    let mpirun = std::env::split_paths(&path)
        .map(|d| d.join("mpirun"))
        .find(|p| p.is_file())
        .ok_or_else(missing)?;
    let version = std::process::Command::new(&mpirun)
        .arg("--version")
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| LaunchError::invalid(format!("cannot run {}: {e}", mpirun.display())))?;
    let text = String::from_utf8_lossy(&version.stdout);
    if !text.contains("Open MPI") && !text.contains("OpenRTE") {
        return Err(LaunchError::invalid(format!(
            "--mpi needs Open MPI's mpirun, but {} is not Open MPI ({})",
            mpirun.display(),
            text.lines().next().unwrap_or("no version")
        )));
    }
    Ok(mpirun)
}

/// The rsh agent script for these hosts.
pub(crate) fn agent_script(prefix: &str, hosts: &[Host]) -> String {
    let mut s = String::new();
    s.push_str("#!/bin/sh\n");
    s.push_str(&format!(
        "# Stand-in for ssh, written by `halo launch --mpi` for launch {prefix}.\n\
         # Usage (as Open MPI calls it): AGENT [-options] HOST COMMAND...\n\
         # Runs COMMAND through a shell, as ssh would, inside HOST's network namespace\n\
         # and UTS namespace, with HOST's hostname.\n"
    ));
    s.push_str(
        "while [ $# -gt 0 ]; do\n  case \"$1\" in\n    -*) shift ;;\n    *) break ;;\n  esac\ndone\n",
    );
    s.push_str("if [ $# -lt 1 ]; then echo \"halo rsh agent: no host given\" >&2; exit 255; fi\n");
    s.push_str("host=$1\nshift\ncase \"$host\" in\n");
    for h in hosts {
        s.push_str(&format!(
            "  {addr}|{name}) ns={ns}; name={name} ;;\n",
            addr = h.address,
            name = h.hostname,
            ns = h.namespace
        ));
    }
    s.push_str(
        "  *) echo \"halo rsh agent: $host is not an emulated host of this launch\" >&2; exit 255 ;;\nesac\n",
    );
    s.push_str(
        "exec ip netns exec \"$ns\" unshare --uts sh -c 'hostname \"$1\" || exit 255; shift; eval \"$*\"' sh \"$name\" \"$@\"\n",
    );
    s
}

/// The hostfile: one line per host, its address and its ranks as slots.
pub(crate) fn hostfile(hosts: &[Host], placement: &Placement) -> String {
    hosts
        .iter()
        .zip(placement.counts())
        .map(|(h, c)| format!("{} slots={c}\n", h.address))
        .collect()
}

/// mpirun's arguments (without the program): on emulated hosts when `agent` and
/// `hostfile` are given, else locally; `exported` variables are passed on to every
/// rank (`-x`).
pub(crate) fn mpirun_args(
    ranks: usize,
    emulated: Option<(&Path, &Path)>,
    exported: &[&str],
    extra: &[String],
) -> Vec<String> {
    let mut a: Vec<String> = vec![
        "-n".into(),
        ranks.to_string(),
        "--oversubscribe".into(),
        "--bind-to".into(),
        "none".into(),
    ];
    let mut mca = |k: &str, v: &str| {
        a.extend(["--mca".to_string(), k.to_string(), v.to_string()]);
    };
    mca("mpi_yield_when_idle", "1");
    if let Some((agent, hostfile)) = emulated {
        mca("plm_rsh_agent", &agent.display().to_string());
        mca("plm_rsh_no_tree_spawn", "1");
        mca("oob_tcp_if_include", SUBNET);
        mca("btl_tcp_if_include", SUBNET);
        mca("btl", "vader,tcp,self");
        a.extend([
            "--hostfile".to_string(),
            hostfile.display().to_string(),
            "--map-by".to_string(),
            "slot".to_string(),
        ]);
    }
    for v in exported {
        a.extend(["-x".to_string(), v.to_string()]);
    }
    a.extend(extra.iter().cloned());
    a
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn hosts() -> Vec<Host> {
        (0..2)
            .map(|i| Host {
                index: i,
                namespace: format!("halo-1-0-h{i}"),
                hostname: format!("host{i}"),
                address: Ipv4Addr::new(10, 201, 0, i as u8 + 1),
            })
            .collect()
    }

    #[test]
    fn hostfile_has_slots_per_host() {
        let p = Placement::even(5, 2).unwrap();
        assert_eq!(
            hostfile(&hosts(), &p),
            "10.201.0.1 slots=3\n10.201.0.2 slots=2\n"
        );
    }

    #[test]
    fn agent_maps_addresses_to_namespaces() {
        let s = agent_script("halo-1-0", &hosts());
        assert!(s.starts_with("#!/bin/sh\n"));
        assert!(s.contains("  10.201.0.2|host1) ns=halo-1-0-h1; name=host1 ;;\n"));
        assert!(s.contains("exec ip netns exec \"$ns\" unshare --uts sh -c"));
    }

    #[test]
    fn mpirun_args_pin_the_subnet() {
        let a = mpirun_args(
            4,
            Some((Path::new("/t/agent"), Path::new("/t/hosts"))),
            &["HALO_SECRET", "MASTER_PORT"],
            &["--tag-output".into()],
        );
        let s = a.join(" ");
        assert!(s.starts_with("-n 4 --oversubscribe"));
        assert!(s.contains("--mca plm_rsh_agent /t/agent --mca plm_rsh_no_tree_spawn 1"));
        assert!(s.contains("--mca oob_tcp_if_include 10.201.0.0/24"));
        assert!(s.contains("--mca btl_tcp_if_include 10.201.0.0/24"));
        assert!(s.contains("--mca btl vader,tcp,self"));
        assert!(s.contains("--hostfile /t/hosts"));
        assert!(s.ends_with("-x MASTER_PORT --tag-output"));
        let local = mpirun_args(2, None, &[], &[]).join(" ");
        assert!(!local.contains("plm_rsh_agent"));
    }
}
