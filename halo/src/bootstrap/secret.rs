//! Where the job's secret comes from when ranks bootstrap from the environment
//! (torchrun, Open MPI, PMI, Slurm): nothing public about a job may be enough to
//! compute it.
//!
//! In order:
//! 1. `HALO_SECRET`: 64 hexadecimal digits (`halo launch` sets a random one per job);
//!    the value `insecure-derived` opts into the old secret derived from public facts
//!    (see 3).
//! 2. A per-user key file: `HALO_SECRET_FILE`, else `$HOME/.config/halo/secret`, made
//!    by `halo secret init` (or `umask 077; mkdir -p ~/.config/halo; head -c 32
//!    /dev/urandom | od -An -tx1 | tr -d ' \n' > ~/.config/halo/secret`). It must be a
//!    regular file of this user, readable by nobody else (no group or other bits), and
//!    hold 64 hexadecimal digits. The job's secret is `HMAC-SHA256(key,
//!    "halo-job-secret" || job identity)`, the identity being the root's address, the
//!    job's size and the launcher's job ids, so that each job gets its own secret and
//!    the key itself never serves as one.
//! 3. `HALO_SECRET=insecure-derived`: the secret is hashed (FNV-1a) from the job's
//!    identity alone. Anyone who can see the job's address and size can compute it and
//!    join the job; every rank logs a warning.
//!
//! Without any of these a job of more than one rank refuses to start, on every rank,
//! with an error that says how to provide a secret.

use super::Secret;
use crate::error::{Error, Result};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// The value of `HALO_SECRET` that opts into a secret derived from public facts.
pub const INSECURE_DERIVED: &str = "insecure-derived";

/// The variable naming the per-user key file.
pub const SECRET_FILE_VAR: &str = halo_params::SECRET_FILE.name;

/// Where the per-user key file is when `HALO_SECRET_FILE` is not set, below `$HOME`.
pub const DEFAULT_KEY_FILE: &str = ".config/halo/secret";

/// The launchers' job ids that are part of a job's identity.
const JOB_ID_VARS: [&str; 5] = [
    "TORCHELASTIC_RUN_ID",
    "SLURM_JOB_ID",
    "SLURM_STEP_ID",
    "OMPI_MCA_ess_base_jobid",
    "PMI_JOBID",
];

/// Where an environment-mode job's secret came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretSource {
    /// `HALO_SECRET` (64 hexadecimal digits).
    Env,
    /// The per-user key file at this path, combined with the job's identity.
    KeyFile(PathBuf),
    /// `HALO_SECRET=insecure-derived`: computed from public facts, anyone can.
    InsecureDerived,
    /// A job of one rank: there is no rendezvous, so no secret (all zeros).
    NotNeeded,
}

impl SecretSource {
    /// Whether a process outside the job cannot compute the secret.
    pub fn is_secret(&self) -> bool {
        matches!(self, SecretSource::Env | SecretSource::KeyFile(_))
    }
}

fn parse_hex(hex: &str, what: &str) -> Result<Secret> {
    let hex = hex.trim();
    if hex.len() != 64 || !hex.bytes().all(|c| c.is_ascii_hexdigit()) {
        return Err(Error::invalid_argument(format!(
            "{what} must be 64 hexadecimal digits (32 bytes){}",
            if what == "HALO_SECRET" {
                format!(", or {INSECURE_DERIVED} to run without a secret")
            } else {
                String::new()
            }
        )));
    }
    let mut s = [0u8; 32];
    for (i, b) in s.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).expect("checked hex");
    }
    Ok(s)
}

/// The job's identity: what every rank of one job agrees on and another job of the
/// same user (very likely) does not. Public: never a secret by itself.
fn identity(vars: &BTreeMap<String, String>, root: SocketAddr, size: usize) -> String {
    let mut key = format!("{root}/{size}");
    for v in JOB_ID_VARS {
        if let Some(x) = vars.get(v) {
            key.push('/');
            key.push_str(x);
        }
    }
    key
}

/// FNV-1a, seeded.
fn fnv(seed: u64, data: &[u8]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64 ^ seed;
    for &b in data {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The secret `HALO_SECRET=insecure-derived` gives: FNV-1a of the job's identity (what
/// HALO did silently before). Anyone can compute it; tests use it as the outsider.
pub fn insecure_derived_secret(
    vars: &BTreeMap<String, String>,
    root: SocketAddr,
    size: usize,
) -> Secret {
    let key = identity(vars, root, size);
    let mut s = [0u8; 32];
    for (i, chunk) in s.chunks_mut(8).enumerate() {
        chunk.copy_from_slice(&fnv(i as u64, key.as_bytes()).to_le_bytes());
    }
    s
}

/// The job's secret from the per-user `key`: `HMAC-SHA256(key, "halo-job-secret" ||
/// identity)`.
fn job_secret(
    key: &Secret,
    vars: &BTreeMap<String, String>,
    root: SocketAddr,
    size: usize,
) -> Secret {
    let mut m = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes a key of any length");
    m.update(b"halo-job-secret");
    m.update(identity(vars, root, size).as_bytes());
    m.finalize().into_bytes().into()
}

/// The key file `vars` name: `HALO_SECRET_FILE`, else `$HOME/.config/halo/secret`
/// (`None` without either).
pub fn key_file_path(vars: &BTreeMap<String, String>) -> Option<PathBuf> {
    if let Some(p) = vars.get(SECRET_FILE_VAR).filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    vars.get("HOME")
        .filter(|h| !h.is_empty())
        .map(|h| Path::new(h).join(DEFAULT_KEY_FILE))
}

/// What to tell a user who has no secret.
fn how_to_provide() -> String {
    format!(
        "set HALO_SECRET to the same 64 hexadecimal digits on every rank (e.g. from `openssl \
         rand -hex 32`, passed privately), or create a per-user key file with `halo secret \
         init` (it writes ~/.config/halo/secret, mode 0600; {SECRET_FILE_VAR} names another \
         one), or start the job with `halo launch` (it makes a secret per job); \
         HALO_SECRET={INSECURE_DERIVED} runs without one, which lets any user who can reach \
         the job's address join it"
    )
}

/// Reads a per-user key file: a regular file of this user (not through a link), with no
/// permission bits for group or others, holding 64 hexadecimal digits.
pub fn read_key_file(path: &Path) -> Result<Secret> {
    use std::io::Read as _;
    use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _};
    let shown = path.display();
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| {
            if e.raw_os_error() == Some(libc::ELOOP) {
                Error::invalid_argument(format!(
                    "the HALO key file {shown} is a symbolic link: it must be a regular file"
                ))
            } else {
                Error::invalid_argument(format!("cannot open the HALO key file {shown}: {e}"))
            }
        })?;
    let meta = f.metadata().map_err(|e| {
        Error::invalid_argument(format!("cannot read the HALO key file {shown}: {e}"))
    })?;
    if !meta.is_file() {
        return Err(Error::invalid_argument(format!(
            "the HALO key file {shown} is not a regular file"
        )));
    }
    let me = crate::host::files::euid();
    if meta.uid() != me {
        return Err(Error::invalid_argument(format!(
            "the HALO key file {shown} is owned by uid {}, not by this user (uid {me}): \
             refusing a key another user controls",
            meta.uid()
        )));
    }
    let mode = meta.mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(Error::invalid_argument(format!(
            "the HALO key file {shown} has mode {mode:04o}: other users may read it; it must \
             be readable by its owner only (chmod 600 {shown})"
        )));
    }
    let mut text = String::new();
    f.by_ref()
        .take(256)
        .read_to_string(&mut text)
        .map_err(|e| {
            Error::invalid_argument(format!("cannot read the HALO key file {shown}: {e}"))
        })?;
    parse_hex(&text, &format!("the HALO key file {shown}"))
}

/// Creates a per-user key file at `path` with 32 random bytes (64 hexadecimal digits):
/// mode 0600 from the moment it exists, its directory made (mode 0700) when missing. An
/// existing file is kept unless `replace`.
pub fn create_key_file(path: &Path, replace: bool) -> Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::DirBuilderExt as _;
    let shown = path.display();
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| {
                super::sys_err(format!(
                    "cannot create the directory {}: {e}",
                    dir.display()
                ))
            })?;
    }
    if replace {
        match std::fs::symlink_metadata(path) {
            Ok(m) if m.is_file() => std::fs::remove_file(path)
                .map_err(|e| super::sys_err(format!("cannot replace {shown}: {e}")))?,
            Ok(_) => {
                return Err(Error::invalid_argument(format!(
                    "{shown} exists and is not a regular file"
                )));
            }
            Err(_) => {}
        }
    }
    let key = super::random_secret()?;
    let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
    let mut f = crate::host::files::create_private(path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::AlreadyExists {
            Error::invalid_argument(format!(
                "{shown} exists already (keep it, or replace it with --force: running jobs \
                 that read it keep their secret)"
            ))
        } else {
            super::sys_err(format!("cannot create the HALO key file {shown}: {e}"))
        }
    })?;
    f.write_all(format!("{hex}\n").as_bytes())
        .and_then(|()| f.sync_all())
        .map_err(|e| super::sys_err(format!("cannot write the HALO key file {shown}: {e}")))
}

/// The secret of a job of `size` ranks whose root is `root`, and where it came from.
pub(super) fn resolve(
    vars: &BTreeMap<String, String>,
    root: SocketAddr,
    size: usize,
) -> Result<(Secret, SecretSource)> {
    match vars.get(halo_params::SECRET.name).map(|v| v.trim()) {
        Some(INSECURE_DERIVED) => {
            return Ok((
                insecure_derived_secret(vars, root, size),
                SecretSource::InsecureDerived,
            ));
        }
        Some(h) => return Ok((parse_hex(h, "HALO_SECRET")?, SecretSource::Env)),
        None => {}
    }
    if size == 1 {
        return Ok(([0u8; 32], SecretSource::NotNeeded));
    }
    let explicit = vars.get(SECRET_FILE_VAR).is_some_and(|p| !p.is_empty());
    if let Some(path) = key_file_path(vars)
        && (explicit || std::fs::symlink_metadata(&path).is_ok())
    {
        let key = read_key_file(&path)?;
        return Ok((
            job_secret(&key, vars, root, size),
            SecretSource::KeyFile(path),
        ));
    }
    Err(Error::invalid_argument(format!(
        "no job secret: HALO_SECRET is not set and there is no key file ({}); without a \
         secret any user who can reach the job's bootstrap address could join it. To run, {}",
        key_file_path(vars)
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| format!("{SECRET_FILE_VAR} and HOME are not set")),
        how_to_provide()
    )))
}
