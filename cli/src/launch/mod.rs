//! `halo launch`: start the ranks of a job, locally or on emulated hosts.
//!
//! [`launch`] starts `N` copies of a command with the environment HALO's bootstrap
//! and torch-style scripts read: `RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
//! `LOCAL_WORLD_SIZE`, `GROUP_RANK` (the host), `HALO_BOOTSTRAP_ADDR` (`ip:port`, served
//! by rank 0), `HALO_SECRET` (64 random hex digits, one per launch), `MASTER_ADDR` and
//! `MASTER_PORT` (the bootstrap port - 1, for torch's own store); on emulated hosts also
//! `HALO_SOCKET_IFNAME=eth0`. The ranks' stdin is `/dev/null`.
//!
//! - **Locally** every rank runs on this machine; the bootstrap address is
//!   `127.0.0.1` and a port that was free when the launch began.
//! - **On emulated hosts** ([`LaunchSpec::hosts`], needs root) the launcher builds a
//!   small cluster of network namespaces ([`EmulatedCluster`]: one per host plus a
//!   switch with a Linux bridge, a veth per host, addresses `10.201.0.(i+1)/24`,
//!   optionally shaped with tbf in both directions), places the ranks block-wise
//!   ([`Placement`]) and runs each inside its host's namespace with its own hostname
//!   (`hostI`, through a UTS namespace). The veths' byte counters before and after the
//!   run show what crossed the emulated network ([`LaunchReport::hosts`]).
//! - **As an MPI program** ([`LaunchSpec::mpi`]) the command is started through Open
//!   MPI's `mpirun`, locally or on the same emulated hosts (see the `mpi` module
//!   notes in the source), so that MPI baselines run on the very same layout.
//!
//! The job ends when every rank has exited 0, when one fails (the others are then
//! terminated: SIGTERM to each rank's process group, SIGKILL after the grace
//! period), when the timeout passes, or when the [`Interrupt`] fires (Ctrl-C). The
//! emulated cluster is always torn down: on success, on every error path (a guard's
//! `Drop`) and on interrupts, which are noticed between set-up steps too. Only
//! processes this launcher started are signalled, by their id; at teardown whatever
//! still runs inside the launch's own namespaces is terminated by pid.
//!
//! Nothing is left behind when the ranks or the launcher die (module `leftovers`):
//! the shared memory of ranks that die is removed once they are reaped; ranks get a
//! parent-death signal (SIGKILL; mpirun SIGTERM); and every launch first removes what
//! killed launchers left — their ranks' shared memory and, as root, their namespaces,
//! whose names (`halo-<pid>-<start>-<n>-...`) carry the launcher's pid and start time.

mod leftovers;
mod mpi;
mod netns;
mod placement;
mod procs;
mod signals;

pub use netns::{
    EmulatedCluster, HOST_DEVICE, Host, LinkCounters, MAX_HOSTS, SUBNET, emulation_unavailable,
    is_root,
};
pub use placement::{Placement, Slot};
pub use signals::Interrupt;

use nix::sys::signal::Signal;
use procs::{Ended, Job};
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::os::unix::process::CommandExt as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The bootstrap port on emulated hosts (host 0's namespace is fresh, so it is free).
pub const EMULATED_BOOTSTRAP_PORT: u16 = 29501;

/// Default time between SIGTERM and SIGKILL.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(3);

/// Variables the launcher sets per rank (and removes from mpirun's environment,
/// where Open MPI's own take their place).
const RANK_VARS: [&str; 5] = [
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
];

/// What can stop a launch before its ranks run to the end.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LaunchError {
    /// Emulated hosts need root.
    #[error(
        "halo launch --hosts needs root (network namespaces, veths and a bridge): run it as root \
         or drop --hosts to start the ranks locally"
    )]
    NeedsRoot,
    /// A wrong or inconsistent option.
    #[error("{0}")]
    InvalidArgument(String),
    /// A set-up command (`ip`, `tc`) failed.
    #[error("`{command}` failed: {message}")]
    Setup {
        /// The command line.
        command: String,
        /// Its stderr, or why it could not run.
        message: String,
    },
    /// The launcher could not do something itself (start a process, write a file).
    #[error("{what}: {source}")]
    Io {
        /// What it tried.
        what: String,
        /// Why it failed.
        source: std::io::Error,
    },
    /// The interrupt fired during set-up; everything was torn down.
    #[error("interrupted by signal {signal} during set-up; everything was torn down")]
    Interrupted {
        /// The signal.
        signal: i32,
    },
}

impl LaunchError {
    pub(crate) fn invalid(message: impl Into<String>) -> LaunchError {
        LaunchError::InvalidArgument(message.into())
    }

    fn io(what: impl Into<String>, source: std::io::Error) -> LaunchError {
        LaunchError::Io {
            what: what.into(),
            source,
        }
    }
}

/// Runs a set-up tool and returns its stdout; on failure the error names the
/// command line and carries its stderr.
pub(crate) fn run_tool(program: &str, args: &[&str]) -> Result<String, LaunchError> {
    let command = std::iter::once(program)
        .chain(args.iter().copied())
        .collect::<Vec<_>>()
        .join(" ");
    tracing::debug!(%command, "running");
    // In a process group of its own: a Ctrl-C at the terminal reaches only the
    // launcher, which then finishes (or undoes) the set-up in order.
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .process_group(0)
        .output()
        .map_err(|e| LaunchError::Setup {
            command: command.clone(),
            message: if e.kind() == std::io::ErrorKind::NotFound {
                format!("{program} not found (Debian: apt-get install iproute2)")
            } else {
                e.to_string()
            },
        })?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
        return Err(LaunchError::Setup {
            command,
            message: if stderr.is_empty() {
                format!("exit status {}", procs::status_code(out.status))
            } else {
                stderr
            },
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// What to launch.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct LaunchSpec {
    /// The command and its arguments.
    pub command: Vec<String>,
    /// Ranks.
    pub ranks: usize,
    /// Emulated hosts and the ranks on each; `None` runs every rank locally.
    pub hosts: Option<Placement>,
    /// Rate of each host's link in tc syntax (`1gbit`, `100mbit`), both directions.
    pub host_rate: Option<String>,
    /// Kill everything after this long (from the start of the ranks).
    pub timeout: Option<Duration>,
    /// Time between SIGTERM and SIGKILL when terminating.
    pub grace: Duration,
    /// Start the command through Open MPI's mpirun.
    pub mpi: bool,
    /// Extra arguments for mpirun, before the command.
    pub mpirun_args: Vec<String>,
    /// Prefix each output line with `[RANK] ` (not with `mpi`, where the output
    /// comes through mpirun).
    pub label_output: bool,
}

impl LaunchSpec {
    /// `ranks` copies of `command`, locally, no timeout, labelled output.
    pub fn new(ranks: usize, command: Vec<String>) -> LaunchSpec {
        LaunchSpec {
            command,
            ranks,
            hosts: None,
            host_rate: None,
            timeout: None,
            grace: DEFAULT_GRACE,
            mpi: false,
            mpirun_args: Vec::new(),
            label_output: true,
        }
    }

    fn validate(&self) -> Result<(), LaunchError> {
        if self.command.is_empty() {
            return Err(LaunchError::invalid(
                "no command given (halo launch -n N -- CMD ARGS...)",
            ));
        }
        if self.ranks == 0 {
            return Err(LaunchError::invalid("-n must be at least 1"));
        }
        crate::limits::check_launch_ranks(self.ranks).map_err(LaunchError::invalid)?;
        if let Some(p) = &self.hosts {
            if p.ranks() != self.ranks {
                return Err(LaunchError::invalid(format!(
                    "the placement holds {} ranks, but -n is {}",
                    p.ranks(),
                    self.ranks
                )));
            }
            if p.hosts() > MAX_HOSTS {
                return Err(LaunchError::invalid(format!(
                    "at most {MAX_HOSTS} emulated hosts"
                )));
            }
        }
        if let Some(rate) = &self.host_rate {
            if self.hosts.is_none() {
                return Err(LaunchError::invalid("--host-rate needs --hosts"));
            }
            let digits = rate.trim_end_matches(|c: char| c.is_ascii_alphabetic());
            let ok = !digits.is_empty()
                && digits.chars().all(|c| c.is_ascii_digit() || c == '.')
                && digits.parse::<f64>().is_ok_and(|r| r > 0.0);
            if !ok {
                return Err(LaunchError::invalid(format!(
                    "--host-rate {rate:?}: expected a tc rate such as 1gbit, 100mbit or 500kbit"
                )));
            }
        }
        Ok(())
    }
}

/// How the job ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Every rank exited 0.
    Success,
    /// A rank failed first (`rank` is `None` under mpirun, which reports for all);
    /// the others were terminated. `code` is its exit status, or 128 + the signal
    /// that killed it.
    RankFailed {
        /// The rank, when known.
        rank: Option<usize>,
        /// Its status.
        code: i32,
        /// The signal that ended it, when one did (a crash: 11 for SIGSEGV).
        signal: Option<i32>,
    },
    /// The timeout passed; everything was killed.
    TimedOut,
    /// The interrupt fired; everything was terminated.
    Interrupted {
        /// The signal.
        signal: i32,
    },
}

impl Outcome {
    /// The launcher's exit status: 0, the failing rank's status, 124 on timeout,
    /// 128 + the signal when interrupted.
    pub fn exit_code(&self) -> u8 {
        let clamp = |c: i32| u8::try_from(c.clamp(1, 255)).unwrap_or(1);
        match *self {
            Outcome::Success => 0,
            Outcome::RankFailed { code, .. } => clamp(code),
            Outcome::TimedOut => 124,
            Outcome::Interrupted { signal } => clamp(128 + signal),
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Outcome::Success => "success",
            Outcome::RankFailed { .. } => "rank_failed",
            Outcome::TimedOut => "timed_out",
            Outcome::Interrupted { .. } => "interrupted",
        }
    }
}

/// One emulated host after the run: what crossed its veth during the run.
#[derive(Debug, Clone)]
pub struct HostReport {
    /// The host.
    pub host: Host,
    /// Its ranks.
    pub ranks: std::ops::Range<usize>,
    /// Counters of its veth (host side), after minus before.
    pub counters: LinkCounters,
}

/// What happened.
#[derive(Debug, Clone)]
pub struct LaunchReport {
    /// How the job ended.
    pub outcome: Outcome,
    /// Per emulated host (empty for a local launch, or when the counters could
    /// not be read: see `warnings`).
    pub hosts: Vec<HostReport>,
    /// The link rate, if shaped.
    pub host_rate: Option<String>,
    /// The namespace prefix of the emulated cluster.
    pub namespace_prefix: Option<String>,
    /// From the start of the ranks to the end of the last.
    pub elapsed: Duration,
    /// Things that went wrong after the ranks ran (reading counters, teardown).
    pub warnings: Vec<String>,
}

impl LaunchReport {
    /// The `--stats-json` document.
    pub fn stats_json(&self) -> serde_json::Value {
        let hosts: Vec<serde_json::Value> = self
            .hosts
            .iter()
            .map(|h| {
                serde_json::json!({
                    "host": h.host.index,
                    "hostname": h.host.hostname,
                    "namespace": h.host.namespace,
                    "address": h.host.address.to_string(),
                    "device": HOST_DEVICE,
                    "ranks": h.ranks.clone().collect::<Vec<_>>(),
                    "tx_bytes": h.counters.tx_bytes,
                    "rx_bytes": h.counters.rx_bytes,
                    "tx_packets": h.counters.tx_packets,
                    "rx_packets": h.counters.rx_packets,
                })
            })
            .collect();
        serde_json::json!({
            "outcome": self.outcome.name(),
            "exit_code": self.outcome.exit_code(),
            "elapsed_s": self.elapsed.as_secs_f64(),
            "subnet": SUBNET,
            "host_rate": self.host_rate,
            "namespace_prefix": self.namespace_prefix,
            "hosts": hosts,
        })
    }

    /// One line per host for `--stats`.
    pub fn stats_lines(&self) -> Vec<String> {
        self.hosts
            .iter()
            .map(|h| {
                let ranks = if h.ranks.len() == 1 {
                    format!("rank {}", h.ranks.start)
                } else {
                    format!("ranks {}-{}", h.ranks.start, h.ranks.end - 1)
                };
                format!(
                    "{} {} ({ranks}): tx {} B / {} pkts, rx {} B / {} pkts over {}{}",
                    h.host.hostname,
                    h.host.address,
                    h.counters.tx_bytes,
                    h.counters.tx_packets,
                    h.counters.rx_bytes,
                    h.counters.rx_packets,
                    HOST_DEVICE,
                    self.host_rate
                        .as_deref()
                        .map(|r| format!(" at {r}"))
                        .unwrap_or_default(),
                )
            })
            .collect()
    }
}

/// Runs the job described by `spec` to its end. Errors are set-up failures (nothing
/// of the launch is left behind); how the ranks ended is in the report.
pub fn launch(spec: &LaunchSpec, interrupt: &Interrupt) -> Result<LaunchReport, LaunchError> {
    spec.validate()?;
    if spec.hosts.is_some() && !is_root() {
        return Err(LaunchError::NeedsRoot);
    }
    // What earlier launchers that were killed left: their ranks' shared memory, their
    // emulated hosts.
    leftovers::reclaim();
    let mpirun = if spec.mpi {
        Some(mpi::find_mpirun()?)
    } else {
        None
    };
    let secret = halo::bootstrap::random_secret().map_err(|e| {
        LaunchError::io(
            "cannot make the job secret",
            std::io::Error::other(e.to_string()),
        )
    })?;
    let secret_bytes = secret;
    let secret: String = secret.iter().map(|b| format!("{b:02x}")).collect();
    match &spec.hosts {
        None => launch_local(spec, interrupt, &secret, secret_bytes, mpirun),
        Some(p) => launch_emulated(spec, p, interrupt, &secret, mpirun),
    }
}

/// A loopback port `p`, bound (the listener is returned and keeps it), such that
/// `p - 1` was free too (torch's `MASTER_PORT`).
fn free_port_pair_bound() -> Result<(u16, TcpListener), LaunchError> {
    for _ in 0..100 {
        let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .map_err(|e| LaunchError::io("cannot bind a loopback port", e))?;
        let p = l
            .local_addr()
            .map_err(|e| LaunchError::io("cannot read a bound port", e))?
            .port();
        if p > 1025 && TcpListener::bind((Ipv4Addr::LOCALHOST, p - 1)).is_ok() {
            return Ok((p, l));
        }
    }
    Err(LaunchError::invalid(
        "found no two adjacent free loopback ports",
    ))
}

/// The job-wide variables.
fn job_env(bootstrap: SocketAddr, secret: &str) -> Vec<(&'static str, String)> {
    vec![
        ("HALO_BOOTSTRAP_ADDR", bootstrap.to_string()),
        ("HALO_SECRET", secret.to_string()),
        ("MASTER_ADDR", bootstrap.ip().to_string()),
        ("MASTER_PORT", (bootstrap.port() - 1).to_string()),
        // Crashes keep their signal: Intel's PSM library, which libfabric links, would
        // otherwise catch SIGSEGV/SIGABRT/SIGTERM in every rank, write a backtrace file
        // into its working directory and exit with status 1 (it reads this variable
        // when it loads, before main; see halo's transport/fabric/signals.rs).
        ("IPATH_NO_BACKTRACE", "1".to_string()),
    ]
}

fn rank_env(slot: &Slot, ranks: usize) -> [(&'static str, String); 5] {
    [
        ("RANK", slot.rank.to_string()),
        ("WORLD_SIZE", ranks.to_string()),
        ("LOCAL_RANK", slot.local_rank.to_string()),
        ("LOCAL_WORLD_SIZE", slot.local_size.to_string()),
        ("GROUP_RANK", slot.host.to_string()),
    ]
}

/// mpirun's command, with its environment.
fn mpirun_command(
    mut cmd: Command,
    args: Vec<String>,
    spec: &LaunchSpec,
    env: &[(&'static str, String)],
) -> Command {
    cmd.args(args).args(&spec.command);
    for v in RANK_VARS {
        cmd.env_remove(v);
    }
    cmd.envs(env.iter().map(|(k, v)| (k, v)));
    cmd.env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
    cmd
}

fn launch_local(
    spec: &LaunchSpec,
    interrupt: &Interrupt,
    secret: &str,
    secret_bytes: halo::bootstrap::Secret,
    mpirun: Option<PathBuf>,
) -> Result<LaunchReport, LaunchError> {
    // The launcher serves the rendezvous root itself, on the port it has bound: when rank
    // 0 bound it, another job could take the port between this process choosing it and
    // rank 0 binding it (seen with tests running in parallel).
    let (port, listener) = free_port_pair_bound()?;
    let root = halo::bootstrap::RendezvousRoot::serve_on(
        listener,
        secret_bytes,
        Some(spec.ranks),
        halo::bootstrap::bootstrap_timeout(),
    )
    .map_err(|e| {
        LaunchError::io(
            "cannot serve the bootstrap root",
            std::io::Error::other(e.to_string()),
        )
    })?;
    let mut env = job_env(SocketAddr::from((Ipv4Addr::LOCALHOST, port)), secret);
    env.push(("HALO_BOOTSTRAP_SERVED", "1".to_string()));
    let placement = Placement::single_host(spec.ranks)?;
    let mut job = Job::new();
    let started = Instant::now();
    if let Some(mpirun) = mpirun {
        let exported: Vec<&str> = env.iter().map(|(k, _)| *k).collect();
        let args = mpi::mpirun_args(spec.ranks, None, &exported, &spec.mpirun_args);
        let cmd = mpirun_command(Command::new(&mpirun), args, spec, &env);
        job.spawn(cmd, None, Signal::SIGTERM)
            .map_err(|e| LaunchError::io(format!("cannot start {}", mpirun.display()), e))?;
    } else {
        for slot in placement.slots() {
            if interrupt.pending().is_some() {
                break;
            }
            let mut cmd = Command::new(&spec.command[0]);
            cmd.args(&spec.command[1..]);
            cmd.envs(env.iter().map(|(k, v)| (k, v)));
            cmd.envs(rank_env(&slot, spec.ranks));
            let label = spec.label_output.then(|| format!("[{}] ", slot.rank));
            job.spawn(cmd, label, Signal::SIGKILL).map_err(|e| {
                LaunchError::io(
                    format!("cannot start rank {}: {}", slot.rank, spec.command[0]),
                    e,
                )
            })?;
        }
    }
    let outcome = run_job(&mut job, spec, interrupt, started);
    // Answered, or waiting for ranks that are gone (it ends at its timeout).
    root.detach();
    Ok(LaunchReport {
        outcome,
        hosts: Vec::new(),
        host_rate: None,
        namespace_prefix: None,
        elapsed: started.elapsed(),
        warnings: Vec::new(),
    })
}

/// Watches the job to its end, terminates what is left, waits for the output.
fn run_job(job: &mut Job, spec: &LaunchSpec, interrupt: &Interrupt, started: Instant) -> Outcome {
    tracing::info!(pids = ?job.pids(), "ranks started");
    let ended = job.watch(spec.timeout.map(|t| started + t), interrupt);
    tracing::info!(?ended, "job ended");
    job.terminate(spec.grace, interrupt);
    job.drain_output(Duration::from_secs(2));
    match ended {
        Ended::AllSucceeded => Outcome::Success,
        Ended::Failed {
            index,
            code,
            signal,
        } => Outcome::RankFailed {
            rank: (!spec.mpi).then_some(index),
            code,
            signal,
        },
        Ended::TimedOut => Outcome::TimedOut,
        Ended::Interrupted { signal } => Outcome::Interrupted { signal },
    }
}

/// A scratch directory removed on drop (the rsh agent and hostfile).
#[derive(Debug)]
struct ScratchDir(PathBuf);

impl ScratchDir {
    /// Creates `$TMPDIR/NAME-TAG` (`TAG`: 64 random bits), mode 0700 from the moment it
    /// exists (`mkdir` fails on anything already there, a link included), after noting
    /// it in the launcher's `record` (a later launch removes it if this one is killed).
    fn create(name: &str, record: &leftovers::Record) -> Result<ScratchDir, LaunchError> {
        use std::os::unix::fs::DirBuilderExt as _;
        let tag = leftovers::random_tag()
            .map_err(|e| LaunchError::io("cannot name a scratch directory", e))?;
        let dir = std::env::temp_dir().join(format!("{name}-{tag}"));
        record.add_scratch(&dir);
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(|e| LaunchError::io(format!("cannot create {}", dir.display()), e))?;
        Ok(ScratchDir(dir))
    }

    /// Writes a new file `name` with `mode` from the moment it exists (`O_EXCL`,
    /// `O_NOFOLLOW`).
    fn write(&self, name: &str, text: &str, mode: u32) -> Result<PathBuf, LaunchError> {
        use std::io::Write as _;
        let path = self.0.join(name);
        halo::host::files::create_exclusive(&path, mode)
            .and_then(|mut f| f.write_all(text.as_bytes()))
            .map_err(|e| LaunchError::io(format!("cannot write {}", path.display()), e))?;
        Ok(path)
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `ip netns exec NS unshare --uts sh -c 'hostname NAME; exec "$@"' sh`, ready for
/// the program and its arguments.
fn on_host(host: &Host) -> Command {
    let mut cmd = Command::new("ip");
    cmd.args([
        "netns",
        "exec",
        &host.namespace,
        "unshare",
        "--uts",
        "sh",
        "-c",
        &format!("hostname {}; exec \"$@\"", host.hostname),
        "sh",
    ]);
    cmd
}

fn launch_emulated(
    spec: &LaunchSpec,
    placement: &Placement,
    interrupt: &Interrupt,
    secret: &str,
    mpirun: Option<PathBuf>,
) -> Result<LaunchReport, LaunchError> {
    let stop = || {
        interrupt
            .pending()
            .map(|signal| LaunchError::Interrupted { signal })
    };
    let mut cluster = EmulatedCluster::create(
        placement.hosts(),
        spec.host_rate.as_deref(),
        spec.grace,
        &stop,
    )?;
    tracing::info!(
        prefix = cluster.prefix(),
        hosts = placement.hosts(),
        "emulated cluster up"
    );
    let hosts = cluster.hosts().to_vec();
    let bootstrap = SocketAddr::from((hosts[0].address, EMULATED_BOOTSTRAP_PORT));
    let mut env = job_env(bootstrap, secret);
    env.push(("HALO_SOCKET_IFNAME", HOST_DEVICE.to_string()));
    let before = cluster.counters()?;
    let mut job = Job::new();
    let _scratch;
    let started = Instant::now();
    if let Some(mpirun) = mpirun {
        let scratch = ScratchDir::create(cluster.prefix(), job.record())?;
        let agent = scratch.write(
            "rsh-agent",
            &mpi::agent_script(cluster.prefix(), &hosts),
            0o700,
        )?;
        let hostfile = scratch.write("hostfile", &mpi::hostfile(&hosts, placement), 0o600)?;
        _scratch = scratch;
        let exported: Vec<&str> = env.iter().map(|(k, _)| *k).collect();
        let args = mpi::mpirun_args(
            spec.ranks,
            Some((&agent, &hostfile)),
            &exported,
            &spec.mpirun_args,
        );
        let mut in_host0 = on_host(&hosts[0]);
        in_host0.arg(&mpirun);
        let cmd = mpirun_command(in_host0, args, spec, &env);
        job.spawn(cmd, None, Signal::SIGTERM)
            .map_err(|e| LaunchError::io("cannot start mpirun in host0", e))?;
    } else {
        for slot in placement.slots() {
            if interrupt.pending().is_some() {
                break;
            }
            let mut cmd = on_host(&hosts[slot.host]);
            cmd.args(&spec.command);
            cmd.envs(env.iter().map(|(k, v)| (k, v)));
            cmd.envs(rank_env(&slot, spec.ranks));
            let label = spec.label_output.then(|| format!("[{}] ", slot.rank));
            job.spawn(cmd, label, Signal::SIGKILL).map_err(|e| {
                LaunchError::io(
                    format!("cannot start rank {} (ip netns exec)", slot.rank),
                    e,
                )
            })?;
        }
    }
    let outcome = run_job(&mut job, spec, interrupt, started);
    let elapsed = started.elapsed();
    drop(job);
    let mut warnings = Vec::new();
    let hosts_report = match cluster.counters() {
        Ok(after) => hosts
            .iter()
            .zip(after.iter().zip(&before))
            .map(|(h, (a, b))| HostReport {
                host: h.clone(),
                ranks: placement.ranks_of(h.index),
                counters: a.since(b),
            })
            .collect(),
        Err(e) => {
            warnings.push(format!("cannot read the veth counters: {e}"));
            Vec::new()
        }
    };
    let prefix = cluster.prefix().to_string();
    warnings.extend(
        cluster
            .teardown()
            .into_iter()
            .map(|p| format!("teardown: {p}")),
    );
    Ok(LaunchReport {
        outcome,
        hosts: hosts_report,
        host_rate: spec.host_rate.clone(),
        namespace_prefix: Some(prefix),
        elapsed,
        warnings,
    })
}

/// Whether a launcher (`halo launch`, mpirun, srun, torchrun) started this process as one
/// rank of a job: one of `RANK`, `OMPI_COMM_WORLD_RANK`, `PMI_RANK`, `SLURM_PROCID` is set.
pub fn launched() -> bool {
    ["RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"]
        .iter()
        .any(|v| std::env::var_os(v).is_some())
}
