//! A hostile second local user against `halo launch` run as root: the attacks run for
//! real, and each test fails if one succeeds.
//!
//! As root each test makes an unprivileged user of its own (`useradd`; removed again by
//! a guard, also when the test fails) and acts as that user through `setpriv`. Without
//! root, `useradd` or `setpriv` a test prints why and skips; under `HALO_REQUIRE_ALL=1`
//! it fails instead.
//!
//! - [`other_user_cannot_open_any_file_of_a_running_job`]: while a 4-rank job runs (over
//!   HALO's shared-memory transport, then over libfabric's `shm` provider), the other
//!   user tries to open, read-only, every file and directory of the job in `/dev/shm` and
//!   `/tmp` the moment it appears: every open must fail with `EACCES`, and `lstat` must
//!   show mode 0600 (0700 for a directory), owner root.
//! - [`links_planted_at_the_launchers_names_are_not_followed`]: the other user plants
//!   links to a root-owned file at every name the launcher and its ranks could be
//!   expected to write (the launcher's pid and start time are known before it runs):
//!   the target is unchanged and the job runs.
//! - [`other_users_leftover_like_directories_survive_a_launch`]: the other user's
//!   directories named like a dead launcher's scratch directories, and a record of
//!   theirs naming them, survive a launch that reclaims a dead launcher's leftovers
//!   (while root's own such directory, named by root's record, is removed).
//! - [`other_user_cannot_read_the_job_secret_of_a_launch`]: the other user reads every
//!   rank's and the launcher's command line and `ps`, none of which holds the job's
//!   secret, and cannot read a rank's environment, which does.

use halo::host::files::{Kind, Name};
use std::collections::BTreeMap;
use std::io::{BufRead as _, BufReader, Write as _};
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

const HALO: &str = env!("CARGO_BIN_EXE_halo");

fn skip(why: &str) {
    halo_test_support::skip(why);
}

fn scratch(test: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("shared_machine")
        .join(test);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// One test at a time: the links one plants in `/dev/shm` are not another's job's files.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A second, unprivileged user made for one test; deleted on drop.
#[derive(Debug)]
struct OtherUser {
    name: String,
    uid: u32,
    gid: u32,
}

impl OtherUser {
    /// Makes the user, or skips (returns `None`) when this cannot be done here.
    fn create(test: &str) -> Option<OtherUser> {
        if !nix::unistd::geteuid().is_root() {
            skip("needs root to make a second user (useradd)");
            return None;
        }
        if let Err(e) = Command::new("setpriv").arg("--version").output() {
            skip(&format!("cannot run setpriv to act as another user: {e}"));
            return None;
        }
        let name = format!("haloprobe{}{test}", std::process::id() % 100_000);
        // Left by an earlier run that was killed before its guard ran.
        let _ = Command::new("userdel").arg(&name).output();
        let mut last = String::new();
        for _ in 0..40 {
            let out = match Command::new("useradd")
                .args(["--system", "--no-create-home", "--user-group"])
                .args(["--shell", "/usr/sbin/nologin", &name])
                .output()
            {
                Ok(o) => o,
                Err(e) => {
                    skip(&format!("cannot run useradd: {e}"));
                    return None;
                }
            };
            if out.status.success() {
                let user = nix::unistd::User::from_name(&name)
                    .unwrap()
                    .expect("the user just made");
                let u = OtherUser {
                    name,
                    uid: user.uid.as_raw(),
                    gid: user.gid.as_raw(),
                };
                assert_ne!(u.uid, 0);
                return Some(u);
            }
            // Another useradd (another test) holds /etc/passwd: try again.
            last = String::from_utf8_lossy(&out.stderr).into_owned();
            std::thread::sleep(Duration::from_millis(250));
        }
        panic!("useradd {name} failed: {last}");
    }

    /// `PROGRAM` run as this user (its uid and gid, no supplementary groups).
    fn command(&self, program: &str) -> Command {
        let mut c = Command::new("setpriv");
        c.arg(format!("--reuid={}", self.uid))
            .arg(format!("--regid={}", self.gid))
            .arg("--clear-groups")
            .arg(program);
        c
    }

    /// Runs `sh -c SCRIPT` as this user; panics unless it succeeds.
    fn sh(&self, script: &str) {
        let out = self.command("sh").args(["-c", script]).output().unwrap();
        assert!(
            out.status.success(),
            "as {}: {script}: {}",
            self.name,
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for OtherUser {
    fn drop(&mut self) {
        // Retried: another test's useradd or userdel may hold /etc/passwd.
        for _ in 0..40 {
            match Command::new("userdel").arg(&self.name).output() {
                Ok(o) if o.status.success() => return,
                Ok(o) if o.status.code() == Some(6) => return, // no such user
                Err(_) => return,
                Ok(_) => std::thread::sleep(Duration::from_millis(250)),
            }
        }
        eprintln!("warning: cannot delete the test user {}", self.name);
    }
}

/// Removes the paths it holds on drop (what the other user planted), also when the test
/// fails.
#[derive(Debug, Default)]
struct Planted(Vec<PathBuf>);

impl Drop for Planted {
    fn drop(&mut self) {
        for p in &self.0 {
            match std::fs::symlink_metadata(p) {
                Ok(m) if m.is_dir() => {
                    let _ = std::fs::remove_dir_all(p);
                }
                Ok(_) => {
                    let _ = std::fs::remove_file(p);
                }
                Err(_) => {}
            }
        }
    }
}

/// What opening a path read-only as the other user gave.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Probe {
    Opened,
    Denied,
    /// Gone before the open (`ENOENT`): says nothing either way.
    Gone,
    Other(String),
}

/// A shell running as the other user that opens, read-only, each path written to it and
/// says what came of it.
struct Prober {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Prober {
    fn start(user: &OtherUser) -> Prober {
        // `exec 3<PATH` in a subshell: open(PATH, O_RDONLY) — a directory too.
        let script = r#"while IFS= read -r f; do
            if m=$( (exec 3<"$f") 2>&1 ); then echo OPEN; else echo "FAIL $m"; fi
        done"#;
        let mut child = user
            .command("sh")
            .args(["-c", script])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the probe as the other user");
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Prober {
            child,
            stdin,
            stdout,
        }
    }

    fn open(&mut self, path: &Path) -> Probe {
        writeln!(self.stdin, "{}", path.display()).unwrap();
        self.stdin.flush().unwrap();
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        let line = line.trim_end();
        if line == "OPEN" {
            Probe::Opened
        } else if line.ends_with("Permission denied") {
            Probe::Denied
        } else if line.contains("No such file") {
            Probe::Gone
        } else {
            Probe::Other(line.to_string())
        }
    }
}

impl Drop for Prober {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What was seen of one file of the job.
#[derive(Debug)]
struct Seen {
    mode: u32,
    uid: u32,
    dir: bool,
    probe: Probe,
}

/// Whether `name` is a file of the job's processes `pids`: HALO's names (`halo-...`)
/// that carry one of them as a whole component (`halo-{shm,bell}-NS-PID-N-TAG`,
/// `halo-launch-PID-START-TAG.pids`, `halo-PID-START-N-TAG`), libfabric's `PID:N:M`.
fn of_job(name: &str, pids: &[u32]) -> bool {
    let pid = |c: &str| c.parse::<u32>().is_ok_and(|c| pids.contains(&c));
    if name.starts_with("halo-") {
        name.split(['-', '.']).any(pid)
    } else {
        name.contains(':') && name.split(':').next().is_some_and(pid)
    }
}

/// The pids the rank scripts wrote to `dir/pids/RANK`.
fn rank_pids(dir: &Path) -> Vec<u32> {
    std::fs::read_dir(dir.join("pids"))
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| std::fs::read_to_string(e.path()).ok())
                .filter_map(|t| t.trim().parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

fn wait_for(child: &mut Child, limit: Duration) -> ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st;
        }
        if start.elapsed() > limit {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(child.id() as i32),
                nix::sys::signal::Signal::SIGINT,
            );
            let _ = child.wait();
            panic!("halo launch ran past {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn output(dir: &Path) -> String {
    format!(
        "stdout:\n{}\nstderr:\n{}",
        std::fs::read_to_string(dir.join("stdout")).unwrap_or_default(),
        std::fs::read_to_string(dir.join("stderr")).unwrap_or_default()
    )
}

/// `halo launch ARGS` with `transport`, output to files in `dir`.
fn launch_command(dir: &Path, transport: &str, args: &[&str]) -> Command {
    let mut c = Command::new(HALO);
    c.arg("launch")
        .args(["--timeout", "120"])
        .args(args)
        .env_remove("HALO_DEBUG")
        .env_remove("HALO_FABRIC_PROVIDER")
        .env_remove("TMPDIR")
        .env("HALO_TRANSPORT", transport)
        .stdout(std::fs::File::create(dir.join("stdout")).unwrap())
        .stderr(std::fs::File::create(dir.join("stderr")).unwrap());
    c
}

/// Runs a 4-rank `halo check` job over `transport` (rank 3 starts 3 s late, so that the
/// others' set-up files exist meanwhile) while the other user opens every file of the
/// job in `/dev/shm` and `/tmp` as it appears. Returns what was seen, by path.
fn probe_job(user: &OtherUser, test: &str, transport: &str) -> BTreeMap<PathBuf, Seen> {
    let dir = scratch(test);
    std::fs::create_dir_all(dir.join("pids")).unwrap();
    let script = format!(
        "echo $$ > {}/pids/$RANK; if [ \"$RANK\" = 3 ]; then sleep 3; fi; \
         exec {HALO} check --counts 16,5000 --v-rounds 1",
        dir.display()
    );
    let mut prober = Prober::start(user);
    let mut job = launch_command(&dir, transport, &["-n", "4", "--", "sh", "-c", &script])
        .stdin(Stdio::null())
        .spawn()
        .expect("start halo launch");
    let mut seen: BTreeMap<PathBuf, Seen> = BTreeMap::new();
    let start = Instant::now();
    let status = loop {
        if let Some(st) = job.try_wait().unwrap() {
            break st;
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "the job ran past 120 s"
        );
        let mut pids = rank_pids(&dir);
        pids.push(job.id());
        for place in ["/dev/shm", "/tmp"] {
            let Ok(rd) = std::fs::read_dir(place) else {
                continue;
            };
            for e in rd.flatten() {
                let path = e.path();
                let Some(name) = e.file_name().to_str().map(str::to_string) else {
                    continue;
                };
                if seen.contains_key(&path) || !of_job(&name, &pids) {
                    continue;
                }
                let probe = prober.open(&path);
                // Stat after the probe: the mode it met (files are never chmod-ed).
                let Ok(m) = std::fs::symlink_metadata(&path) else {
                    continue; // gone: looked at again if it reappears
                };
                seen.insert(
                    path,
                    Seen {
                        mode: m.permissions().mode() & 0o7777,
                        uid: m.uid(),
                        dir: m.is_dir(),
                        probe,
                    },
                );
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    assert!(status.success(), "{status:?}\n{}", output(&dir));
    eprintln!("{transport}: seen {seen:#?}");
    for (path, s) in &seen {
        assert!(
            s.probe == Probe::Denied || s.probe == Probe::Gone,
            "the other user's read-only open of {} gave {:?} (mode {:o}, uid {})",
            path.display(),
            s.probe,
            s.mode,
            s.uid
        );
        let want = if s.dir { 0o700 } else { 0o600 };
        assert_eq!(
            (s.mode, s.uid),
            (want, 0),
            "{}: mode {:o} owner {}, want {want:o} owner root",
            path.display(),
            s.mode,
            s.uid
        );
    }
    seen
}

/// Whether an open of a file whose name starts with `prefix` was refused.
fn denied(seen: &BTreeMap<PathBuf, Seen>, prefix: &str) -> bool {
    seen.iter().any(|(p, s)| {
        s.probe == Probe::Denied
            && p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(prefix))
    })
}

#[test]
fn other_user_cannot_open_any_file_of_a_running_job() {
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let Some(user) = OtherUser::create("a") else {
        return;
    };
    // HALO's shared-memory transport: the segment files (reserved by every rank before
    // the exchange) and the launcher's record.
    let seen = probe_job(&user, "open_shm", "shm");
    assert!(
        denied(&seen, Kind::Segment.prefix()),
        "no segment file was probed: {seen:#?}"
    );
    assert!(
        denied(&seen, "halo-launch-"),
        "the launcher's record was not probed: {seen:#?}"
    );
    // libfabric's shm provider: HALO's doorbells and the provider's own regions.
    let seen = probe_job(&user, "open_fabric", "fabric");
    assert!(
        denied(&seen, Kind::Bell.prefix()),
        "no doorbell was probed: {seen:#?}"
    );
    assert!(
        seen.iter()
            .any(|(p, s)| s.probe == Probe::Denied && p.to_string_lossy().contains(':')),
        "no region of libfabric's shm provider was probed: {seen:#?}"
    );
    assert!(
        denied(&seen, "halo-launch-"),
        "the launcher's record was not probed: {seen:#?}"
    );
}

/// The start time of process `pid` (clock ticks since boot, field 22 of its stat).
fn start_time(pid: u32) -> u64 {
    halo::host::proc::proc_stat(&format!("/proc/{pid}/stat"))
        .unwrap()
        .1
}

#[test]
fn links_planted_at_the_launchers_names_are_not_followed() {
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let Some(user) = OtherUser::create("b") else {
        return;
    };
    let dir = scratch("links");
    // What root can write and the other user cannot: the link's target.
    let victim = dir.join("victim");
    std::fs::write(&victim, "precious\n").unwrap();
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let before = std::fs::metadata(&victim).unwrap();
    // The launcher, held before it runs: its pid and start time are what it names its
    // files after (exec keeps both).
    let mut held = Command::new("sh")
        .args(["-c", "read _ && exec \"$@\"", "sh", HALO])
        .args(["launch", "--timeout", "120", "-n", "2", "--", HALO, "check"])
        .args(["--counts", "16", "--v-rounds", "0"])
        .env_remove("HALO_DEBUG")
        .env("HALO_TRANSPORT", "shm")
        .stdin(Stdio::piped())
        .stdout(std::fs::File::create(dir.join("stdout")).unwrap())
        .stderr(std::fs::File::create(dir.join("stderr")).unwrap())
        .spawn()
        .unwrap();
    let pid = held.id();
    let start = start_time(pid);
    let ns: u64 = halo::host::files::pid_ns().parse().unwrap();
    // Every name the launcher (its record, its scratch directories) and its ranks (the
    // segments and doorbells of their first transports, whatever pids they get) could
    // be guessed to write.
    let mut names = vec![
        format!("/dev/shm/halo-launch-{pid}-{start}.pids"),
        format!("/dev/shm/halo-launch-{pid}-{start}-0000000000000000.pids"),
        format!("/tmp/halo-{pid}-{start}-0"),
        format!("/tmp/halo-{pid}-{start}-0-0000000000000000"),
    ];
    for p in pid..pid + 400 {
        for kind in Kind::ALL {
            let name = Name {
                kind,
                ns,
                pid: p,
                n: 0,
                tag: None,
            };
            names.push(format!("/dev/shm/{name}"));
        }
    }
    let mut planted = Planted::default();
    for chunk in names.chunks(100) {
        let script: String = chunk
            .iter()
            .map(|n| format!("ln -s '{}' '{n}' 2>/dev/null; ", victim.display()))
            .collect();
        user.sh(&format!("{script}true"));
        planted.0.extend(chunk.iter().map(PathBuf::from));
    }
    let links = planted
        .0
        .iter()
        .filter(|p| std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_symlink()))
        .count();
    assert!(links > 0, "the other user could plant no link");
    // Release the launcher.
    writeln!(held.stdin.take().unwrap()).unwrap();
    let status = wait_for(&mut held, Duration::from_secs(120));
    let after = std::fs::metadata(&victim).unwrap();
    assert_eq!(
        std::fs::read_to_string(&victim).unwrap(),
        "precious\n",
        "a planted link made root write the target\n{}",
        output(&dir)
    );
    assert_eq!(
        (after.len(), after.mtime(), after.mtime_nsec(), after.ino()),
        (
            before.len(),
            before.mtime(),
            before.mtime_nsec(),
            before.ino()
        )
    );
    assert!(status.success(), "{status:?}\n{}", output(&dir));
    // The links are the other user's: left as they were, not followed, not replaced.
    for p in &planted.0 {
        if let Ok(m) = std::fs::symlink_metadata(p) {
            assert!(m.file_type().is_symlink(), "{} was replaced", p.display());
            assert_eq!(m.uid(), user.uid, "{}", p.display());
        }
    }
}

#[test]
fn other_users_leftover_like_directories_survive_a_launch() {
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let Some(user) = OtherUser::create("c") else {
        return;
    };
    let dir = scratch("leftovers");
    // A launcher that is gone: a pid no process has now, any start time.
    let mut child = Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let start = 4242;
    let mut planted = Planted::default();
    // The other user's directories named like that launcher's scratch directories
    // (older and current names), and a record of theirs naming them.
    let old = PathBuf::from(format!("/tmp/halo-{dead}-{start}-0"));
    let new = PathBuf::from(format!("/tmp/halo-{dead}-{start}-1-0123456789abcdef"));
    let theirs = PathBuf::from(format!(
        "/dev/shm/halo-launch-{dead}-{start}-fedcba9876543210.pids"
    ));
    planted.0.extend([old.clone(), new.clone(), theirs.clone()]);
    user.sh(&format!(
        "mkdir {0} {1} && echo mine > {0}/file && echo mine > {1}/file && \
         printf 'launcher {dead} {start}\\nscratch {0}\\nscratch {1}\\n' > {2}",
        old.display(),
        new.display(),
        theirs.display()
    ));
    // Root's own leftover of that launcher, named by root's record: this one goes, which
    // shows the launch below did reclaim.
    let own = PathBuf::from(format!("/tmp/halo-{dead}-{start}-2-00112233445566aa"));
    let record = PathBuf::from(format!(
        "/dev/shm/halo-launch-{dead}-{start}-aa66554433221100.pids"
    ));
    planted.0.extend([own.clone(), record.clone()]);
    std::fs::create_dir(&own).unwrap();
    std::fs::write(own.join("hostfile"), "x\n").unwrap();
    std::fs::write(
        &record,
        format!("launcher {dead} {start}\nscratch {}\n", own.display()),
    )
    .unwrap();
    let status = launch_command(&dir, "shm", &["-n", "2", "--", "true"])
        .stdin(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "{status:?}\n{}", output(&dir));
    for p in [&old, &new] {
        assert_eq!(
            std::fs::read_to_string(p.join("file")).ok().as_deref(),
            Some("mine\n"),
            "the other user's {} was removed",
            p.display()
        );
    }
    assert!(theirs.exists(), "the other user's record was removed");
    assert!(
        !own.exists() && !record.exists(),
        "the launch did not reclaim root's own leftovers of a dead launcher"
    );
}

/// The job's secret under `halo launch` reaches the ranks in their environment only: the
/// other user can read every rank's and the launcher's command line (and `ps`), and none
/// holds the secret, but cannot read a rank's environment (`/proc/PID/environ`).
#[test]
fn other_user_cannot_read_the_job_secret_of_a_launch() {
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let Some(user) = OtherUser::create("s") else {
        return;
    };
    let script = "echo \"pid $$ secret $HALO_SECRET\"; exec sleep 5";
    let mut launch = Command::new(HALO)
        .args([
            "launch",
            "-n",
            "2",
            "--timeout",
            "60",
            "--",
            "sh",
            "-c",
            script,
        ])
        .env_remove("HALO_SECRET")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(launch.stdout.take().unwrap()).lines();
    let mut ranks = Vec::new();
    let mut secret = String::new();
    while ranks.len() < 2 {
        let line = lines.next().expect("each rank prints its pid").unwrap();
        let words: Vec<&str> = line.split_whitespace().collect();
        let at = words.iter().position(|w| *w == "pid").unwrap();
        ranks.push(words[at + 1].parse::<u32>().unwrap());
        secret = words[at + 3].to_string();
    }
    assert_eq!(secret.len(), 64, "{secret}");
    let mut pids = ranks.clone();
    pids.push(launch.id());
    for pid in &pids {
        let cmdline = user
            .command("cat")
            .arg(format!("/proc/{pid}/cmdline"))
            .output()
            .unwrap();
        assert!(cmdline.status.success(), "the command line is public");
        assert!(
            !String::from_utf8_lossy(&cmdline.stdout).contains(&secret),
            "the secret is on the command line of {pid}"
        );
    }
    for pid in &ranks {
        let environ = user
            .command("cat")
            .arg(format!("/proc/{pid}/environ"))
            .output()
            .unwrap();
        assert!(
            !environ.status.success()
                && !String::from_utf8_lossy(&environ.stdout).contains(&secret),
            "the other user read rank {pid}'s environment"
        );
    }
    let ps = user.command("ps").args(["-eo", "args"]).output().unwrap();
    assert!(ps.status.success());
    assert!(!String::from_utf8_lossy(&ps.stdout).contains(&secret));
    let status = wait_for(&mut launch, Duration::from_secs(60));
    assert!(status.success(), "{status}");
}
