//! Creating, inspecting and freeing communicators; the unique id; the version; the
//! last-error message.

use crate::boundary::{call, call_comm, or_value};
use crate::error::{Failure, FfiResult, haloResult_t, thread_error_ptr};
use crate::handle::{Borrowed, haloComm, haloComm_t};
use crate::types::{ConfigFields, HALO_VERSION_CODE, haloConfig_t, haloUniqueId};
use halo_rs::{Communicator, InitConfig, UniqueId};
use std::ffi::{c_char, c_int};
use std::sync::Once;

/// Installs the `HALO_DEBUG` logger once per process (the first call that sets
/// something up).
fn init_logging() {
    static LOGGING: Once = Once::new();
    LOGGING.call_once(halo_logging::init_from_env);
}

/// Checks that an output pointer is not NULL.
fn out_ptr<T>(ptr: *mut T, what: &str) -> FfiResult<()> {
    if ptr.is_null() {
        Err(Failure::invalid(format!("{what} (an output) is NULL")))
    } else {
        Ok(())
    }
}

/// `nranks` and `rank` as sizes, checked.
fn rank_args(nranks: c_int, rank: c_int) -> FfiResult<(usize, usize)> {
    let n = usize::try_from(nranks)
        .ok()
        .filter(|&n| n > 0)
        .ok_or_else(|| Failure::invalid(format!("nranks is {nranks}: expected at least 1")))?;
    // Refused here, before anything is allocated for the ranks.
    if n > halo_rs::MAX_RANKS {
        return Err(Failure::invalid(format!(
            "nranks is {nranks}: at most {} ranks (2^20) are supported",
            halo_rs::MAX_RANKS
        )));
    }
    let r = usize::try_from(rank)
        .ok()
        .filter(|&r| r < n)
        .ok_or_else(|| {
            Failure::invalid(format!(
                "rank {rank} is out of range for {nranks} ranks (0 .. {})",
                nranks - 1
            ))
        })?;
    Ok((n, r))
}

/// Writes a new communicator to `*out` (the last step of a successful init).
///
/// # Safety
/// `out` is non-NULL and valid for a write.
unsafe fn publish(out: *mut haloComm_t, comm: Communicator) {
    let handle = haloComm::new(comm).into_handle();
    // SAFETY: per the contract.
    unsafe { out.write(handle) };
}

/// Reports the library's version.
///
/// Writes `HALO_MAJOR * 10000 + HALO_MINOR * 100 + HALO_PATCH` of the linked library
/// to `*version`.
///
/// Errors: `haloInvalidArgument` when `version` is NULL. Thread-safe.
///
/// # Safety
/// `version` is NULL or valid for writing an `int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn haloGetVersion(version: *mut c_int) -> haloResult_t {
    call("haloGetVersion", || {
        out_ptr(version, "version")?;
        // SAFETY: non-NULL, and valid for a write per the contract.
        unsafe { version.write(HALO_VERSION_CODE) };
        Ok(())
    })
}

/// Creates the unique id of a new job (as `ncclGetUniqueId`).
///
/// Call it on one rank, then pass the id to every rank (including this one) for
/// `haloCommInitRank`. It starts the job's rendezvous point on a thread of this
/// process, listening on `HALO_BOOTSTRAP_ADDR`'s address if set, else on the
/// interface `HALO_SOCKET_IFNAME` names, else on the first non-loopback IPv4
/// interface; the thread ends once every rank has joined or after the bootstrap
/// timeout (`HALO_BOOTSTRAP_TIMEOUT_MS`, default 120 s). The id holds a random secret:
/// keep it away from other users.
///
/// Errors: `haloInvalidArgument` when `uniqueId` is NULL or a `HALO_*` variable is
/// malformed; `haloSystemError` when no socket can be opened. `*uniqueId` is written
/// only on success. Thread-safe.
///
/// # Safety
/// `uniqueId` is NULL or valid for writing a `haloUniqueId`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn haloGetUniqueId(uniqueId: *mut haloUniqueId) -> haloResult_t {
    call("haloGetUniqueId", || {
        init_logging();
        out_ptr(uniqueId, "uniqueId")?;
        let id = haloUniqueId::from_id(&UniqueId::new()?);
        // SAFETY: non-NULL, and valid for a write per the contract.
        unsafe { uniqueId.write(id) };
        Ok(())
    })
}

/// Creates this rank's communicator in a job of `nranks` ranks (as
/// `ncclCommInitRank`), configured from the environment (`HALO_*` variables).
///
/// Every rank calls it with the same `commId` (from `haloGetUniqueId`) and `nranks`,
/// and its own `rank` in `0 .. nranks-1`; it returns once all ranks have joined (or
/// after the bootstrap timeout). On success `*comm` is the new communicator, which the
/// caller owns: free it with `haloCommDestroy` (or `haloCommAbort`).
///
/// Errors: `haloInvalidArgument` for a NULL `comm`, `nranks` < 1 or above 2^20
/// (1,048,576: refused before anything is allocated), a rank out of range, an id not made by `haloGetUniqueId`, or a malformed `HALO_*` variable;
/// `haloSystemError` when the network or libfabric fails; `haloTimeout` when the other
/// ranks do not all join in time; `haloInvalidUsage` when they disagree (on `nranks`,
/// ranks given twice). `*comm` is written only on success.
///
/// # Safety
/// `comm` is NULL or valid for writing a `haloComm_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn haloCommInitRank(
    comm: *mut haloComm_t,
    nranks: c_int,
    commId: haloUniqueId,
    rank: c_int,
) -> haloResult_t {
    // SAFETY: forwarded contract; a NULL config reads the environment only.
    unsafe {
        init_rank(
            "haloCommInitRank",
            comm,
            nranks,
            commId,
            rank,
            std::ptr::null(),
        )
    }
}

/// `haloCommInitRank` with a configuration (as `ncclCommInitRankConfig`).
///
/// `config` must have been set from `HALO_CONFIG_INITIALIZER` (see `haloConfig_t`); its
/// unset fields take the environment's values. NULL is the same as `haloCommInitRank`.
/// `config` and its strings are read during the call only.
///
/// Errors: as `haloCommInitRank`; also `haloInvalidArgument` when `config` was not set
/// from `HALO_CONFIG_INITIALIZER` (wrong `magic` or `size`: an uninitialised struct) or
/// a field is out of range (an unknown algorithm, a timeout <= 0, an empty provider).
/// The configuration is checked before any communication.
///
/// # Safety
/// `comm` as for `haloCommInitRank`; `config` is NULL or points to a `haloConfig_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn haloCommInitRankConfig(
    comm: *mut haloComm_t,
    nranks: c_int,
    commId: haloUniqueId,
    rank: c_int,
    config: *mut haloConfig_t,
) -> haloResult_t {
    // SAFETY: forwarded contract.
    unsafe {
        init_rank(
            "haloCommInitRankConfig",
            comm,
            nranks,
            commId,
            rank,
            config.cast_const(),
        )
    }
}

/// The body of both `haloCommInitRank*`.
///
/// # Safety
/// As `haloCommInitRankConfig`.
unsafe fn init_rank(
    name: &str,
    comm: *mut haloComm_t,
    nranks: c_int,
    id: haloUniqueId,
    rank: c_int,
    config: *const haloConfig_t,
) -> haloResult_t {
    call(name, || {
        init_logging();
        out_ptr(comm, "comm")?;
        let (n, r) = rank_args(nranks, rank)?;
        // SAFETY: per the contract `config` is NULL or points to a haloConfig_t.
        let config: InitConfig = unsafe { ConfigFields::read(config) }?.over_env()?;
        let id = id.to_id()?;
        let c = Communicator::init_rank_with(&id, n, r, &config)?;
        // SAFETY: checked non-NULL above; valid for a write per the contract.
        unsafe { publish(comm, c) };
        Ok(())
    })
}

/// Creates this rank's communicator from the launcher's environment.
///
/// Reads rank and size from `RANK`/`WORLD_SIZE` (torchrun, `halo launch`),
/// `OMPI_COMM_WORLD_RANK`/`_SIZE` (Open MPI), `PMI_RANK`/`PMI_SIZE` (MPICH, Cray PMI)
/// or `SLURM_PROCID`/`SLURM_NTASKS` (srun), and the rendezvous address from
/// `HALO_BOOTSTRAP_ADDR`, else `MASTER_ADDR` and `MASTER_PORT + 1`, else the first host
/// of `SLURM_JOB_NODELIST`; rank 0 serves the rendezvous. The job's secret is
/// `HALO_SECRET` (64 hex digits; `halo launch` sets one), else the per-user key file
/// (`HALO_SECRET_FILE`, else `~/.config/halo/secret`, mode 0600, made by `halo secret
/// init`); `HALO_SECRET=insecure-derived` runs without one (a warning is logged). Every
/// rank of the job calls it; it returns once all have joined. The caller owns `*comm`.
///
/// Errors: `haloInvalidArgument` for a NULL `comm` or a missing or malformed variable
/// (the message names it), or when a job of more than one rank has no secret (the
/// message says how to provide one), or a key file others can read; otherwise as
/// `haloCommInitRank`. `*comm` is written only on success.
///
/// # Safety
/// `comm` is NULL or valid for writing a `haloComm_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn haloCommInitFromEnv(comm: *mut haloComm_t) -> haloResult_t {
    call("haloCommInitFromEnv", || {
        init_logging();
        out_ptr(comm, "comm")?;
        let c = Communicator::init_from_env()?;
        // SAFETY: checked non-NULL above; valid for a write per the contract.
        unsafe { publish(comm, c) };
        Ok(())
    })
}

/// Frees a communicator (as `ncclCommDestroy`).
///
/// Local: the other ranks are not waited for. NULL is allowed and does nothing. After
/// the call `comm` is invalid; do not pass it to any function again.
///
/// Errors: `haloInvalidArgument` when `comm` is not a live communicator — destroyed or
/// aborted already (a second `haloCommDestroy`), or not made by HALO; nothing is freed
/// then. The check knows addresses, not generations: once a new communicator has been
/// created at the address of a destroyed one, the stale handle is that new
/// communicator again (see `haloComm`). `haloInternalError` if tearing down panicked.
///
/// # Safety
/// `comm` is NULL or a communicator not yet destroyed or aborted, with no call on it in
/// progress in another thread (a destroyed one is detected as described above, but is
/// still a bug to pass).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn haloCommDestroy(comm: haloComm_t) -> haloResult_t {
    call("haloCommDestroy", || {
        // Outstanding requests finish first (each bounded by the timeout).
        if let Some(c) = Borrowed::new(comm)? {
            c.drain();
        }
        haloComm::release(comm)
    })
}

/// Aborts a communicator and frees it (as `ncclCommAbort`).
///
/// May be called from another thread while a collective on `comm` is blocked: that
/// collective returns `haloAborted` promptly, and the communicator is freed once it
/// has returned. Use it when a peer has failed or a collective hangs; the other ranks'
/// collectives fail too (with `haloRemoteError` or `haloTimeout`). After the call
/// `comm` is invalid in every thread: the aborted call's message is in
/// `haloGetLastError(NULL)` of its thread. NULL is allowed and does nothing.
///
/// Errors: `haloInvalidArgument` when `comm` is not a live communicator (destroyed or
/// aborted already; detected as for `haloCommDestroy`).
///
/// # Safety
/// `comm` is NULL or a communicator not yet destroyed or aborted.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn haloCommAbort(comm: haloComm_t) -> haloResult_t {
    call("haloCommAbort", || {
        if let Some(c) = Borrowed::new(comm)? {
            c.abort();
            // The worker of outstanding requests stops promptly once aborted.
            c.drain();
            drop(c);
            // A concurrent destroy or abort of the same handle may have released it
            // meanwhile: then this one reports it.
            haloComm::release(comm)?;
        }
        Ok(())
    })
}

/// Reports an error that left the communicator unusable (as
/// `ncclCommGetAsyncError`).
///
/// Writes `haloSuccess` to `*asyncError` while the communicator is healthy, else the
/// first failure after which the ranks may be out of step: `haloSystemError`,
/// `haloRemoteError`, `haloTimeout`, `haloInternalError` or `haloAborted` (argument
/// errors do not count). After such an error, abort or destroy the communicator. May be
/// called from another thread while a collective is in progress.
///
/// Errors: `haloInvalidArgument` for a NULL `comm` or `asyncError`.
///
/// # Safety
/// `comm` is NULL or a live communicator; `asyncError` is NULL or valid for writing a
/// `haloResult_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn haloCommGetAsyncError(
    comm: haloComm_t,
    asyncError: *mut haloResult_t,
) -> haloResult_t {
    call_comm("haloCommGetAsyncError", comm, |c| {
        out_ptr(asyncError, "asyncError")?;
        // SAFETY: non-NULL, valid for a write per the contract.
        unsafe { asyncError.write(c.async_error()) };
        Ok(())
    })
}

/// Writes the number of ranks of `comm` to `*count` (as `ncclCommCount`).
///
/// Errors: `haloInvalidArgument` for a NULL `comm` or `count`. May be called from any
/// thread.
///
/// # Safety
/// `comm` is NULL or a live communicator; `count` is NULL or valid for writing an `int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn haloCommCount(comm: haloComm_t, count: *mut c_int) -> haloResult_t {
    call_comm("haloCommCount", comm, |c| {
        out_ptr(count, "count")?;
        let n = c_int::try_from(c.size()).map_err(|_| Failure::internal("size exceeds int"))?;
        // SAFETY: non-NULL, valid for a write per the contract.
        unsafe { count.write(n) };
        Ok(())
    })
}

/// Writes this rank's index in `comm` (0 .. count-1) to `*rank` (as
/// `ncclCommUserRank`).
///
/// Errors: `haloInvalidArgument` for a NULL `comm` or `rank`. May be called from any
/// thread.
///
/// # Safety
/// `comm` is NULL or a live communicator; `rank` is NULL or valid for writing an `int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn haloCommUserRank(comm: haloComm_t, rank: *mut c_int) -> haloResult_t {
    call_comm("haloCommUserRank", comm, |c| {
        out_ptr(rank, "rank")?;
        let r = c_int::try_from(c.rank()).map_err(|_| Failure::internal("rank exceeds int"))?;
        // SAFETY: non-NULL, valid for a write per the contract.
        unsafe { rank.write(r) };
        Ok(())
    })
}

/// Splits a communicator (as `ncclCommSplit`, `MPI_Comm_split`).
///
/// Collective over `comm`: every rank calls it. The ranks that pass the same `color`
/// form a new communicator, ordered by `key`, then by their rank in `comm`; a rank
/// that passes a negative `color` (`HALO_SPLIT_NOCOLOR`) joins none and gets NULL. The
/// new communicator shares `comm`'s transport (nothing is connected) and its topology
/// (restricted to the members); it inherits the timeout and the algorithm unless
/// `config` sets them (`algorithm`, `timeoutMs`; the other fields cannot change in a
/// split). The caller owns `*newcomm` and destroys it on its own; parent and children
/// may be destroyed in any order, but must not be used concurrently from different
/// threads (they share the transport: `haloInvalidUsage`). At most 32 communicators
/// share a rank's transport.
///
/// Errors: `haloInvalidArgument` for a NULL `comm` or `newcomm`, a `config` not set
/// from `HALO_CONFIG_INITIALIZER`, or one that sets `provider`, `topology` or
/// `bootstrapTimeoutMs`; `haloInvalidUsage` when a member already has 32
/// communicators or another thread uses `comm`; `haloTimeout`, `haloRemoteError`,
/// `haloAborted`. `*newcomm` is written only on success.
///
/// # Safety
/// `comm` is NULL or a live communicator; `newcomm` is NULL or valid for writing a
/// `haloComm_t`; `config` is NULL or points to a `haloConfig_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn haloCommSplit(
    comm: haloComm_t,
    color: c_int,
    key: c_int,
    newcomm: *mut haloComm_t,
    config: *mut haloConfig_t,
) -> haloResult_t {
    call_comm("haloCommSplit", comm, |c| {
        out_ptr(newcomm, "newcomm")?;
        // SAFETY: per the contract `config` is NULL or points to a haloConfig_t.
        let fields = unsafe { ConfigFields::read(config.cast_const()) }?;
        for (set, name) in [
            (fields.provider.is_some(), "provider"),
            (fields.topology.is_some(), "topology"),
            (fields.bootstrap_timeout.is_some(), "bootstrapTimeoutMs"),
        ] {
            if set {
                return Err(Failure::invalid(format!(
                    "config->{name} cannot change in a split (the new communicator shares \
                     this one's transport and topology): leave it unset"
                )));
            }
        }
        // A negative color (HALO_SPLIT_NOCOLOR) joins no communicator.
        let color = u32::try_from(color).ok();
        let child = c.lock()?.split(color, key)?;
        let handle = match child {
            None => std::ptr::null_mut(),
            Some(mut child) => {
                if let Some(a) = fields.algorithm {
                    child.set_algorithm(a);
                }
                if let Some(t) = fields.timeout {
                    child.set_timeout(t);
                }
                haloComm::new(child).into_handle()
            }
        };
        // SAFETY: non-NULL (checked), valid for a write per the contract.
        unsafe { newcomm.write(handle) };
        Ok(())
    })
}

/// The message of the last failed call (as `ncclGetLastError`).
///
/// With a communicator: the last failed call on `comm`. With NULL: the last failed
/// call on this thread, whatever its communicator: the place to look after a failed
/// `haloCommInit*` (no communicator exists) or after `haloCommAbort` (the
/// communicator is gone). The message names the function and what was wrong, e.g.
/// `"haloAllToAll: sendbuff is NULL but count is 16"`; `""` when nothing has failed.
///
/// The string belongs to HALO and is never NULL. It stays valid until the next HALO
/// call with the same `comm` (for NULL: the next HALO call on this thread), and until
/// `comm` is destroyed; copy it to keep it. A successful call does not clear it.
///
/// # Safety
/// `comm` is NULL or a live communicator.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn haloGetLastError(comm: haloComm_t) -> *const c_char {
    or_value(
        c"(HALO failed while reading the last error)".as_ptr(),
        || {
            match Borrowed::new(comm) {
                // NULL, or a handle that is not live: the thread's last error.
                Ok(None) | Err(_) => thread_error_ptr(),
                // The handle keeps its own reference, so the string outlives this borrow.
                Ok(Some(c)) => c.last_error_ptr(),
            }
        },
    )
}

/// Writes the communicator's topology, as HALO's topology file format in JSON (the
/// `halo topo --json` format), to `buf` as a NUL-terminated string.
///
/// Call it with `buf` = NULL and `len` = 0 to learn the size: `*needed` (if not NULL)
/// receives the bytes the string needs, terminating NUL included. With a buffer, the
/// string is written when `len` is at least that, and `*needed` receives the same.
///
/// Errors: `haloInvalidArgument` for a NULL `comm`, a NULL `buf` with `len` > 0, or a
/// buffer too small (nothing is written; the message says how many bytes are needed);
/// `haloInvalidUsage` while another thread uses `comm`.
///
/// # Safety
/// `comm` is NULL or a live communicator; `buf` is NULL or valid for writing `len`
/// bytes; `needed` is NULL or valid for writing a `size_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn haloTopologyJson(
    comm: haloComm_t,
    buf: *mut c_char,
    len: usize,
    needed: *mut usize,
) -> haloResult_t {
    call_comm("haloTopologyJson", comm, |c| {
        let json = c.lock()?.topology().to_spec().to_json_string();
        let need = json.len() + 1;
        if buf.is_null() && len > 0 {
            return Err(Failure::invalid(format!("buf is NULL but len is {len}")));
        }
        if !buf.is_null() {
            if len < need {
                return Err(Failure::invalid(format!(
                    "buf holds {len} bytes but the topology JSON needs {need} (call with \
                     buf = NULL, len = 0 to learn the size)"
                )));
            }
            // SAFETY: `buf` is valid for `len` >= `need` bytes per the contract, and a
            // Rust String cannot overlap memory the caller passed in.
            unsafe {
                std::ptr::copy_nonoverlapping(json.as_ptr(), buf.cast::<u8>(), json.len());
                buf.add(json.len()).write(0);
            }
        }
        if !needed.is_null() {
            // SAFETY: non-NULL, valid for a write per the contract.
            unsafe { needed.write(need) };
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    fn last(comm: haloComm_t) -> String {
        // SAFETY: haloGetLastError never returns NULL; `comm` is NULL or live.
        unsafe { CStr::from_ptr(haloGetLastError(comm)) }
            .to_string_lossy()
            .into_owned()
    }

    #[test]
    fn version() {
        let mut v = -1;
        // SAFETY: a valid int.
        assert_eq!(unsafe { haloGetVersion(&mut v) }, 0);
        assert_eq!(v, HALO_VERSION_CODE);
        // SAFETY: NULL is allowed.
        assert_eq!(unsafe { haloGetVersion(std::ptr::null_mut()) }, 4);
        assert_eq!(
            last(std::ptr::null_mut()),
            "haloGetVersion: version (an output) is NULL"
        );
    }

    #[test]
    fn bad_init_arguments() {
        let id = haloUniqueId { internal: [0; 128] };
        let mut comm: haloComm_t = std::ptr::null_mut();
        for (n, r, needle) in [
            (0, 0, "nranks is 0"),
            (-3, 0, "nranks is -3"),
            (4, 4, "rank 4 is out of range for 4 ranks (0 .. 3)"),
            (4, -1, "rank -1 is out of range"),
            (4, 1, "not a HALO unique id"),
        ] {
            // SAFETY: `comm` is a valid output.
            let r = unsafe { haloCommInitRank(&mut comm, n, id, r) };
            assert_eq!(r, 4);
            assert!(last(std::ptr::null_mut()).contains(needle), "{needle}");
            assert!(comm.is_null(), "output written on failure");
        }
        // SAFETY: NULL output is checked.
        let r = unsafe { haloCommInitRank(std::ptr::null_mut(), 2, id, 0) };
        assert_eq!(r, 4);
        assert!(last(std::ptr::null_mut()).contains("comm (an output) is NULL"));
    }

    #[test]
    fn null_handles() {
        // SAFETY: NULL is allowed for destroy and abort.
        unsafe {
            assert_eq!(haloCommDestroy(std::ptr::null_mut()), 0);
            assert_eq!(haloCommAbort(std::ptr::null_mut()), 0);
            let mut n = 0;
            assert_eq!(haloCommCount(std::ptr::null_mut(), &mut n), 4);
            assert_eq!(last(std::ptr::null_mut()), "haloCommCount: comm is NULL");
        }
    }
}
