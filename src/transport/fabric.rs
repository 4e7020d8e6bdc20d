//! The libfabric transport: ranks as processes, tagged messages over RDM endpoints.
//!
//! Each rank opens up to two endpoints: `shm` for the ranks on its own host and a
//! network provider (`tcp;ofi_rxm` here, `cxi` on Slingshot) for the others; the
//! choice is made per peer from the host names exchanged at bootstrap, and
//! `HALO_FABRIC_PROVIDER` forces one provider for every peer. Shared memory reaches
//! across network namespaces, so per-peer choice is what keeps emulated hosts honest:
//! ranks on different hosts always talk over the network provider.
//!
//! Endpoints are `FI_EP_RDM` with `FI_TAGGED` and `FI_DIRECTED_RECV`, an `FI_AV_TABLE`
//! address vector (peers inserted in rank order) and manual progress: completion queues
//! are read whenever the engine progresses or waits. Buffers are registered per
//! collective only where the provider's `mr_mode` asks for it (`FI_MR_LOCAL`). Each
//! posted operation carries an `fi_context2` from a pool owned by the transport, so
//! steady-state calls allocate nothing per message.
//!
//! # Posting never blocks
//! A post refused with `-FI_EAGAIN` (RxM connects lazily, and with both providers the
//! first send to a peer is refused until that peer reads its completion queue) is kept
//! in a backlog and retried, in order per peer, every time the engine progresses. So a
//! post never waits: the engine's timeout and [`crate::AbortHandle`] apply to refused
//! posts as to everything else, and the receives of a step are posted while its sends
//! wait for their connections.
//!
//! # Waiting (`HALO_PROGRESS`)
//! When nothing completes the engine spins briefly, then calls [`Session::wait`] with a
//! growing bound (1 us up to 1 ms). What the wait does is [`FabricProgress`]: `block`
//! (the default: yield below 50 us, then sleep until there is something to do — on the
//! network completion queue's file descriptor where the provider has one, which
//! `tcp;ofi_rxm` does, and on a futex doorbell in shared memory that same-host peers
//! ring, because `shm` in libfabric 1.17 has no wait object), `sleep` (yield below
//! 50 us, else sleep up to 200 us), `yield` (always `sched_yield`) or `spin` (return at
//! once). Measured in docs/BENCHMARKS.md, "Progress under oversubscription (fabric
//! transport)".
//!
//! # Failures
//! - A peer on the same host (same host name and PID namespace) whose process has
//!   ended is noticed while waiting for it: the collective fails with
//!   [`CollectiveError::Remote`] naming it within about 50 ms, instead of at the
//!   timeout. Peers on other hosts are noticed through the provider's error
//!   completions or, failing that, at the timeout ([`CollectiveError::Timeout`]).
//! - A collective that fails on this rank (an error, the timeout, an abort: anything
//!   that leaves operations outstanding) leaves the transport *broken*: what was
//!   posted is cancelled, the endpoints are closed (so the provider can no longer
//!   touch the caller's buffers, and network peers see the connections go), and every
//!   later collective fails at once with [`CollectiveError::InvalidUsage`] saying why.
//!   As after an NCCL error, the communicator must be dropped and a new one created.
//! - `shm` keeps its queues under spin locks in shared memory. A peer killed while it
//!   holds one leaves the next call that needs the lock spinning inside libfabric,
//!   beyond the reach of timeouts and `abort()` (seen in about 1 of 100 kills during
//!   the first collective). A watchdog thread ends such a process: a libfabric call
//!   that has not returned for `HALO_WATCHDOG_MS` (default 3000; 0 turns it off) makes
//!   it print what is stuck and which same-host peers have ended, and exit with status
//!   1, as NCCL's watchdog does in PyTorch.
//! - A killed rank leaves its `shm` region `/dev/shm/PID:N:M` behind, and a later
//!   process that gets the same id could not create its own (`fi_enable`: `EBUSY`):
//!   before its first `shm` endpoint a process removes such files of its own id that
//!   are older than itself. Doorbell files of dead processes are removed likewise.
//!
//! When the provider is `cxi`, HPE's recommended settings for collective libraries are
//! applied unless the user set them (docs/REFERENCE.md §2): `FI_MR_CACHE_MONITOR=userfaultfd`,
//! `FI_CXI_DEFAULT_CQ_SIZE=131072`, `FI_CXI_DEFAULT_TX_SIZE=2048`,
//! `FI_CXI_RDZV_PROTO=alt_read`, `FI_CXI_RX_MATCH_MODE=hybrid`.

use super::raw::RawBuffers;
use crate::error::{Error, Result};
use halo_collectives::{Buf, Buffers, CollectiveError, Region, Session, TAG_BITS, Transport};
use halo_fabric_sys as fi;
use std::ffi::{CStr, CString, c_char, c_int, c_long, c_short, c_ulong, c_void};
use std::ptr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

type CResult<T> = std::result::Result<T, CollectiveError>;

const EAGAIN: isize = -(fi::FI_EAGAIN as isize);
const EAVAIL: isize = -(fi::FI_EAVAIL as isize);

/// HPE's recommended environment for collective libraries on `cxi`.
pub(crate) const CXI_DEFAULTS: [(&str, &str); 5] = [
    ("FI_MR_CACHE_MONITOR", "userfaultfd"),
    ("FI_CXI_DEFAULT_CQ_SIZE", "131072"),
    ("FI_CXI_DEFAULT_TX_SIZE", "2048"),
    ("FI_CXI_RDZV_PROTO", "alt_read"),
    ("FI_CXI_RX_MATCH_MODE", "hybrid"),
];

/// `struct pollfd`.
#[repr(C)]
struct PollFd {
    fd: c_int,
    events: c_short,
    revents: c_short,
}

/// `struct timespec` (`time_t` is `long` on the 64-bit Linux targets HALO builds for).
#[repr(C)]
struct Timespec {
    tv_sec: c_long,
    tv_nsec: c_long,
}

const POLLIN: c_short = 1;

unsafe extern "C" {
    /// libc's strdup: `fi_freeinfo` frees hint strings with `free`.
    fn strdup(s: *const c_char) -> *mut c_char;
    /// libc's ppoll (poll with a nanosecond timeout).
    fn ppoll(
        fds: *mut PollFd,
        nfds: c_ulong,
        timeout: *const Timespec,
        sigmask: *const c_void,
    ) -> c_int;
    fn mmap(
        addr: *mut c_void,
        len: usize,
        prot: c_int,
        flags: c_int,
        fd: c_int,
        offset: i64,
    ) -> *mut c_void;
    fn munmap(addr: *mut c_void, len: usize) -> c_int;
    /// libc's syscall (for futex).
    fn syscall(number: c_long, ...) -> c_long;
}

fn fi_err(what: &str, ret: isize) -> Error {
    Error::SystemError {
        message: format!("{what}: {} ({ret})", fi::strerror(ret as i64)),
    }
}

fn check(ret: isize, what: &str) -> Result<()> {
    if ret < 0 {
        Err(fi_err(what, ret))
    } else {
        Ok(())
    }
}

/// An owned `fi_info` list.
#[derive(Debug)]
struct InfoList(*mut fi::fi_info);

impl Drop for InfoList {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: the list came from fi_getinfo and is freed once, here.
            unsafe { fi::fi_freeinfo(self.0) };
        }
    }
}

/// Queries one provider for RDM tagged endpoints with directed receive.
fn getinfo(provider: &str, node: Option<&str>) -> Result<InfoList> {
    let prov = CString::new(provider)
        .map_err(|_| Error::invalid_argument("provider name contains NUL"))?;
    // SAFETY: fi_allocinfo returns a zeroed fi_info with its attribute structs allocated
    // (or NULL, checked). The fields set are plain data; prov_name comes from strdup
    // because fi_freeinfo frees it with free().
    let hints = unsafe {
        let hints = fi::fi_allocinfo();
        if hints.is_null() {
            return Err(Error::SystemError {
                message: "fi_allocinfo returned NULL".into(),
            });
        }
        let h = &mut *hints;
        h.caps = fi::FI_TAGGED | fi::FI_SEND | fi::FI_RECV | fi::FI_DIRECTED_RECV;
        h.mode = fi::FI_CONTEXT | fi::FI_CONTEXT2;
        (*h.ep_attr).type_ = fi::FI_EP_RDM;
        let d = &mut *h.domain_attr;
        d.mr_mode = fi::FI_MR_LOCAL
            | fi::FI_MR_VIRT_ADDR
            | fi::FI_MR_ALLOCATED
            | fi::FI_MR_PROV_KEY
            | fi::FI_MR_ENDPOINT;
        d.threading = fi::FI_THREAD_DOMAIN;
        d.control_progress = fi::FI_PROGRESS_MANUAL;
        d.data_progress = fi::FI_PROGRESS_MANUAL;
        d.av_type = fi::FI_AV_TABLE;
        (*h.fabric_attr).prov_name = strdup(prov.as_ptr());
        hints
    };
    let node = node.map(|n| CString::new(n).expect("an IP address has no NUL"));
    let (node_ptr, flags) = match &node {
        Some(n) => (n.as_ptr(), fi::FI_SOURCE),
        None => (ptr::null(), 0),
    };
    let mut info = ptr::null_mut();
    // SAFETY: hints is a valid fi_info; node is NULL or a live C string; info is written
    // on success only; hints is freed exactly once after the call.
    let ret = unsafe {
        let ret = fi::fi_getinfo(
            fi::MIN_VERSION,
            node_ptr,
            ptr::null(),
            flags,
            hints,
            &mut info,
        );
        fi::fi_freeinfo(hints);
        ret
    };
    if ret < 0 || info.is_null() {
        return Err(Error::SystemError {
            message: format!(
                "libfabric provider '{provider}' is not available for RDM tagged messages ({}); \
                 `fi_info -l` lists the providers this machine has",
                fi::strerror(ret as i64)
            ),
        });
    }
    Ok(InfoList(info))
}

fn cstr(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: libfabric's string fields are NUL-terminated and live as long as their info.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// One provider's endpoint with its fabric, domain, completion queue and address vector.
#[derive(Debug)]
pub(crate) struct Endpoint {
    provider: String,
    fabric: *mut fi::fid_fabric,
    domain: *mut fi::fid_domain,
    cq: *mut fi::fid_cq,
    av: *mut fi::fid_av,
    ep: *mut fi::fid_ep,
    mr_mode: i32,
    name: Vec<u8>,
    /// The provider's address length (`fi_info.src_addrlen`/`addrlen`): every peer
    /// address inserted must have it.
    addrlen: usize,
    /// Bytes of remote completion data the provider carries (`cq_data_size`).
    cq_data: usize,
    /// The provider's address format (`fi_info.addr_format`: `FI_ADDR_STR` for `shm`,
    /// `FI_SOCKADDR_IN` for `tcp;ofi_rxm` over IPv4, ...).
    addr_format: u32,
    /// The completion queue's file descriptor, when it was opened with `FI_WAIT_FD`.
    wait_fd: Option<c_int>,
    /// Closed after a failure: objects the provider still holds busy are expected.
    abandoned: bool,
}

// SAFETY: the endpoint is opened with FI_THREAD_DOMAIN and owned by one transport,
// which is used by one thread at a time (the communicator is Send, not Sync); moving
// it to another thread between calls is allowed by that threading model.
unsafe impl Send for Endpoint {}

impl Endpoint {
    /// Opens `provider`, bound to `node` (an IP for network providers). With
    /// `want_fd` the completion queue gets a file descriptor to block on
    /// (`FI_WAIT_FD`) where the provider offers one.
    fn open(provider: &str, node: Option<&str>, want_fd: bool) -> Result<Endpoint> {
        restore_crash_signals();
        if provider.contains("cxi") {
            for (k, v) in CXI_DEFAULTS {
                if std::env::var_os(k).is_none() {
                    // SAFETY: set before libfabric reads its environment, during
                    // communicator initialisation; documented as HALO's behaviour so
                    // applications that read these variables concurrently set them first.
                    unsafe { std::env::set_var(k, v) };
                }
            }
        }
        let info = getinfo(provider, node)?;
        let mut e = Endpoint {
            provider: String::new(),
            fabric: ptr::null_mut(),
            domain: ptr::null_mut(),
            cq: ptr::null_mut(),
            av: ptr::null_mut(),
            ep: ptr::null_mut(),
            mr_mode: 0,
            name: Vec::new(),
            addrlen: 0,
            cq_data: 0,
            addr_format: 0,
            wait_fd: None,
            abandoned: false,
        };
        // On error `e` is dropped and closes what was opened.
        // SAFETY: info.0 is a valid entry that outlives this block; every out-pointer is
        // a field of `e`, written on success only; attribute structs are zeroed and filled.
        unsafe {
            let i = &*info.0;
            e.mr_mode = (*i.domain_attr).mr_mode;
            e.cq_data = (*i.domain_attr).cq_data_size.min(8);
            e.provider = cstr((*i.fabric_attr).prov_name);
            check(
                fi::fi_fabric(i.fabric_attr, &mut e.fabric, ptr::null_mut()) as isize,
                "fi_fabric",
            )?;
            check(
                fi::fi_domain(e.fabric, info.0, &mut e.domain, ptr::null_mut()) as isize,
                "fi_domain",
            )?;
            let mut opened = false;
            if want_fd {
                let mut cq_attr = fi::fi_cq_attr {
                    format: fi::FI_CQ_FORMAT_TAGGED,
                    wait_obj: fi::FI_WAIT_FD,
                    size: 4096,
                    ..Default::default()
                };
                // shm (1.17) refuses FI_WAIT_FD with -FI_ENOSYS: fall back to no wait object.
                if fi::fi_cq_open(e.domain, &mut cq_attr, &mut e.cq, ptr::null_mut()) == 0 {
                    opened = true;
                    let mut fd: c_int = -1;
                    let ret = fi::fi_control(
                        &mut (*e.cq).fid,
                        fi::FI_GETWAIT,
                        (&mut fd as *mut c_int).cast(),
                    );
                    if ret == 0 && fd >= 0 {
                        e.wait_fd = Some(fd);
                    }
                }
            }
            if !opened {
                let mut cq_attr = fi::fi_cq_attr {
                    format: fi::FI_CQ_FORMAT_TAGGED,
                    wait_obj: fi::FI_WAIT_NONE,
                    size: 4096,
                    ..Default::default()
                };
                check(
                    fi::fi_cq_open(e.domain, &mut cq_attr, &mut e.cq, ptr::null_mut()) as isize,
                    "fi_cq_open",
                )?;
            }
            let mut av_attr = fi::fi_av_attr {
                type_: fi::FI_AV_TABLE,
                ..Default::default()
            };
            check(
                fi::fi_av_open(e.domain, &mut av_attr, &mut e.av, ptr::null_mut()) as isize,
                "fi_av_open",
            )?;
            check(
                fi::fi_endpoint(e.domain, info.0, &mut e.ep, ptr::null_mut()) as isize,
                "fi_endpoint",
            )?;
            check(
                fi::fi_ep_bind(e.ep, &mut (*e.cq).fid, fi::FI_TRANSMIT | fi::FI_RECV) as isize,
                "fi_ep_bind(cq)",
            )?;
            check(
                fi::fi_ep_bind(e.ep, &mut (*e.av).fid, 0) as isize,
                "fi_ep_bind(av)",
            )?;
            check(fi::fi_enable(e.ep) as isize, "fi_enable")?;
            let mut name = vec![0u8; MAX_NAME];
            let mut len = name.len();
            check(
                fi::fi_getname(&mut (*e.ep).fid, name.as_mut_ptr().cast(), &mut len) as isize,
                "fi_getname",
            )?;
            name.truncate(len);
            e.name = name;
            e.addrlen = i.src_addrlen;
            e.addr_format = i.addr_format;
        }
        tracing::debug!(
            provider = %e.provider,
            mr_mode = e.mr_mode,
            addrlen = e.addrlen,
            name_len = e.name.len(),
            cq_data = e.cq_data,
            wait_fd = ?e.wait_fd,
            "fabric endpoint open"
        );
        Ok(e)
    }

    /// Whether `name` can be an address of this provider (what a peer's bootstrap card
    /// says before it is handed to `fi_av_insert`, which trusts it: an empty `shm`
    /// address makes it read past the end, a crash). `Err` says what is wrong.
    fn check_name(&self, name: &[u8]) -> std::result::Result<(), String> {
        if name.is_empty() {
            return Err("is empty".into());
        }
        if name.len() > MAX_NAME {
            return Err(format!(
                "is {} bytes, longer than any address ({MAX_NAME})",
                name.len()
            ));
        }
        let family = |want: u16| -> std::result::Result<(), String> {
            let got = u16::from_ne_bytes([name[0], name[1]]);
            if got != want {
                return Err(format!(
                    "is not an {} socket address (address family {got}, expected {want})",
                    if want == AF_INET { "IPv4" } else { "IPv6" }
                ));
            }
            Ok(())
        };
        let exact = |len: usize| -> std::result::Result<(), String> {
            if name.len() != len {
                return Err(format!(
                    "is {} bytes but {} addresses are {len} (the provider's addrlen)",
                    name.len(),
                    self.provider
                ));
            }
            Ok(())
        };
        match self.addr_format as c_int {
            fi::FI_ADDR_STR => {
                // A NUL-terminated string of printable characters.
                let (last, text) = name.split_last().expect("not empty");
                if *last != 0 || text.is_empty() || !text.iter().all(|b| (0x21..0x7f).contains(b)) {
                    return Err(format!(
                        "is not a {} address string (printable characters and one final NUL)",
                        self.provider
                    ));
                }
                Ok(())
            }
            fi::FI_SOCKADDR_IN => exact(self.addrlen).and_then(|()| family(AF_INET)),
            fi::FI_SOCKADDR_IN6 => exact(self.addrlen).and_then(|()| family(AF_INET6)),
            _ if self.addrlen > 0 => exact(self.addrlen),
            _ => Ok(()),
        }
    }

    /// Inserts the addresses of ranks in order (`field` names the card field they came
    /// from); returns their fabric addresses.
    fn insert(&mut self, names: &[(usize, &[u8])], field: &str) -> Result<Vec<fi::fi_addr_t>> {
        let mut out = Vec::with_capacity(names.len());
        for &(rank, n) in names {
            let bad = |why: String| Error::InvalidUsage {
                peer: Some(rank),
                message: format!(
                    "rank {rank}'s bootstrap card: field `{field}` ({} address, {} bytes: {}) {why}",
                    self.provider,
                    n.len(),
                    hex(&n[..n.len().min(64)])
                ),
            };
            self.check_name(n).map_err(bad)?;
            let mut addr: fi::fi_addr_t = fi::FI_ADDR_NOTAVAIL;
            // SAFETY: av is open; `n` holds one address of this provider's format and
            // length (checked just above); `addr` has room for one result.
            let ret = unsafe {
                fi::fi_av_insert(self.av, n.as_ptr().cast(), 1, &mut addr, 0, ptr::null_mut())
            };
            if ret != 1 {
                // 0: the provider did not take it, and says no more (its errno is 0).
                return Err(bad(if ret < 0 {
                    format!("was refused by fi_av_insert: {}", fi::strerror(ret as i64))
                } else {
                    "was not accepted by fi_av_insert (not an address of this provider)".into()
                }));
            }
            out.push(addr);
        }
        Ok(out)
    }

    /// The remote completion data that carries a call's uniform block size with each
    /// message ([`Buffers::block`] + 1, cut to what the provider carries; 0: none), so
    /// that the receiver can tell a peer that called with another count or type.
    fn block_data(&self, block: Option<usize>) -> u64 {
        match block {
            Some(b) if self.cq_data > 0 => {
                let v = (b as u64).wrapping_add(1);
                if self.cq_data >= 8 {
                    v
                } else {
                    (v & ((1u64 << (8 * self.cq_data)) - 1)).max(1)
                }
            }
            _ => 0,
        }
    }

    fn needs_registration(&self) -> bool {
        self.mr_mode & fi::FI_MR_LOCAL != 0
    }

    /// Registers memory for local access; returns the region and its descriptor.
    fn register(
        &self,
        base: *mut u8,
        len: usize,
        key: u64,
    ) -> Result<(*mut fi::fid_mr, *mut c_void)> {
        let mut mr = ptr::null_mut();
        let key = if self.mr_mode & fi::FI_MR_PROV_KEY != 0 {
            0
        } else {
            key
        };
        // SAFETY: domain is open; base/len describe a buffer the session borrows for
        // longer than the registration (closed in the session's drop); mr is written on
        // success only.
        unsafe {
            check(
                fi::fi_mr_reg(
                    self.domain,
                    base.cast(),
                    len,
                    fi::FI_SEND | fi::FI_RECV,
                    0,
                    key,
                    0,
                    &mut mr,
                    ptr::null_mut(),
                ) as isize,
                "fi_mr_reg",
            )?;
            if self.mr_mode & fi::FI_MR_ENDPOINT != 0 {
                check(
                    fi::fi_mr_bind(mr, &mut (*self.ep).fid, 0) as isize,
                    "fi_mr_bind",
                )?;
                check(fi::fi_mr_enable(mr) as isize, "fi_mr_enable")?;
            }
            Ok((mr, fi::fi_mr_desc(mr)))
        }
    }
}

fn close(f: *mut fi::fid, what: &str) {
    close_quietly(f, what, false);
}

/// Closes `f`; with `expect_busy` a failure is only a debug message (after a failed
/// collective the provider may keep objects busy that it then leaks).
fn close_quietly(f: *mut fi::fid, what: &str, expect_busy: bool) {
    if !f.is_null() {
        // SAFETY: `f` is an open libfabric object owned by the caller, closed once.
        let ret = unsafe { fi::fi_close(f) };
        if ret != 0 {
            let why = fi::strerror(i64::from(ret));
            if expect_busy {
                tracing::debug!("fi_close({what}) after a failure: {why}");
            } else {
                tracing::warn!("fi_close({what}): {why}");
            }
        }
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        // The endpoint first, then what it is bound to. Every libfabric object starts
        // with its `struct fid`, so the casts give the fid.
        let (p, q) = (&self.provider, self.abandoned);
        close_quietly(self.ep.cast(), &format!("{p} endpoint"), q);
        close_quietly(self.av.cast(), &format!("{p} address vector"), q);
        close_quietly(self.cq.cast(), &format!("{p} completion queue"), q);
        close_quietly(self.domain.cast(), &format!("{p} domain"), q);
        close_quietly(self.fabric.cast(), &format!("{p} fabric"), q);
    }
}

/// Signals whose handler a PSM library may have installed (see [`restore_crash_signals`]).
const PSM_SIGNALS: [c_int; 7] = [
    libc::SIGSEGV,
    libc::SIGBUS,
    libc::SIGILL,
    libc::SIGABRT,
    libc::SIGFPE,
    libc::SIGINT,
    libc::SIGTERM,
];

/// Gives crashes their signal back: removes the signal handlers of Intel's PSM
/// libraries, so that a segfaulting rank ends with SIGSEGV (and `halo launch`, CI or a
/// scheduler see a crash), and no `NAME.80s-PID,HOST.btr` file is written into the
/// working directory.
///
/// libfabric 1.17 as packaged here links `libpsm_infinipath.so.1`, whose
/// `libinfinipath.so.4` installs, *in a constructor that runs when the library is
/// loaded* (before `main` for programs linked with libhalo), a handler for SIGSEGV,
/// SIGBUS, SIGILL, SIGABRT, SIGINT and SIGTERM that prints a backtrace, writes that
/// file and exits with status 1 (`libpsm2` does the same only with `HFI_BACKTRACE`
/// set). Found with `tests/crash_signal.rs`: `IPATH_NO_BACKTRACE` stops it only when
/// it is in the environment when the process starts (`halo launch` sets it for its
/// ranks; the Python package sets it before it loads libhalo); setting it later is
/// too late, and excluding the provider (`FI_PROVIDER=^psm`) changes nothing because
/// the library is linked, not loaded by the provider. So, once per process before the
/// first endpoint opens, every one of these signals whose handler lives in a PSM
/// library gets the default action back (the action it replaced is not reachable;
/// before `main` it was the default, unless the signal was ignored at `exec`).
fn restore_crash_signals() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        for sig in PSM_SIGNALS {
            // SAFETY: struct sigaction is plain data; all zeros is a valid value.
            let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
            // SAFETY: with a null new action sigaction only reads the current one into
            // `old`, a valid struct sigaction.
            let read = unsafe { libc::sigaction(sig, ptr::null(), &mut old) };
            if read != 0 {
                continue;
            }
            let handler = old.sa_sigaction;
            if handler == libc::SIG_DFL || handler == libc::SIG_IGN {
                continue;
            }
            // SAFETY: Dl_info is plain data (pointers may be null); all zeros is valid.
            let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
            // SAFETY: dladdr only looks the address up in the loaded objects and fills
            // `info`; `dli_fname` is then NULL or a string owned by the dynamic loader,
            // valid while the object is loaded (it stays loaded).
            let found = unsafe { libc::dladdr(handler as *const c_void, &mut info) };
            if found == 0 || info.dli_fname.is_null() {
                continue;
            }
            let object = cstr(info.dli_fname);
            let file = object.rsplit('/').next().unwrap_or(&object);
            if !(file.starts_with("libinfinipath") || file.starts_with("libpsm")) {
                continue;
            }
            // SAFETY: a zeroed struct sigaction with SIG_DFL is the default disposition.
            let mut dfl: libc::sigaction = unsafe { std::mem::zeroed() };
            dfl.sa_sigaction = libc::SIG_DFL;
            // SAFETY: installs the default action for `sig`; `dfl` is a valid struct.
            let ret = unsafe { libc::sigaction(sig, &dfl, ptr::null_mut()) };
            if ret == 0 {
                tracing::debug!(signal = sig, library = file, "removed a PSM signal handler");
            }
        }
    });
}

/// The longest endpoint name HALO reads from `fi_getname` (and accepts in a card).
const MAX_NAME: usize = 1024;
/// `AF_INET` and `AF_INET6` on Linux.
const AF_INET: u16 = 2;
const AF_INET6: u16 = 10;

/// `PROT_READ | PROT_WRITE`.
const PROT_RW: c_int = 3;
/// `MAP_SHARED`.
const MAP_SHARED: c_int = 1;
const FUTEX_WAIT: c_int = 0;
const FUTEX_WAKE: c_int = 1;
#[cfg(target_arch = "x86_64")]
const SYS_FUTEX: Option<c_long> = Some(202);
#[cfg(target_arch = "aarch64")]
const SYS_FUTEX: Option<c_long> = Some(98);
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
const SYS_FUTEX: Option<c_long> = None;

/// A bell's word: the owner sleeps (or is about to).
const ASLEEP: u32 = 1;
/// A bell's word: the owner is awake, or was rung.
const AWAKE: u32 = 0;
/// Bytes mapped per bell (one page).
const BELL_LEN: usize = 4096;

/// A doorbell for `block` between ranks on one host: one futex word in a small
/// shared-memory file of its owner's. `shm` (libfabric 1.17) has no wait object, so a
/// rank that waits for same-host peers marks its word [`ASLEEP`] and sleeps on it
/// (bounded); a peer that hands it something — a send posted, or one of its sends
/// received (its completion may be what the owner waits for) — wakes it if the word
/// says it sleeps. A ring costs one shared load when the owner is awake. Only a hint:
/// every sleep is bounded, so a lost ring delays, never hangs.
struct Bell {
    base: *mut c_void,
    /// The file, for the owner's bell (removed on drop).
    own: Option<std::path::PathBuf>,
}

impl std::fmt::Debug for Bell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bell").field("own", &self.own).finish()
    }
}

impl Bell {
    /// Creates this rank's bell, `/dev/shm/halo-bell-NS-PID-N` (PID namespace, process,
    /// count), after removing the files of processes of this namespace that ended
    /// without removing theirs (killed); `None` (no bell: bounded sleeps) when that
    /// fails.
    fn create() -> Option<Bell> {
        SYS_FUTEX?;
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let ns: String = std::fs::read_link("/proc/self/ns/pid")
            .map(|l| {
                l.to_string_lossy()
                    .chars()
                    .filter(char::is_ascii_digit)
                    .collect()
            })
            .unwrap_or_default();
        let prefix = format!("halo-bell-{ns}-");
        if let Ok(dir) = std::fs::read_dir("/dev/shm") {
            for entry in dir.flatten() {
                let name = entry.file_name();
                let Some(pid) = name
                    .to_str()
                    .and_then(|n| n.strip_prefix(&prefix))
                    .and_then(|rest| rest.split('-').next())
                    .and_then(|pid| pid.parse::<u32>().ok())
                else {
                    continue;
                };
                if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
                    let _ = std::fs::remove_file(entry.path());
                }
            }
        }
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = std::path::PathBuf::from(format!("/dev/shm/{prefix}{}-{n}", std::process::id()));
        // A file of a dead process whose id this one reuses: replace it.
        let _ = std::fs::remove_file(&path);
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .ok()?;
        let bell = f
            .set_len(BELL_LEN as u64)
            .ok()
            .and_then(|()| Bell::map(&f, Some(path.clone())));
        if bell.is_none() {
            let _ = std::fs::remove_file(&path);
        }
        bell
    }

    /// Maps a peer's bell.
    fn open(path: &str) -> Option<Bell> {
        SYS_FUTEX?;
        if !path.starts_with("/dev/shm/halo-bell-") {
            return None;
        }
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .ok()?;
        if f.metadata().ok()?.len() < BELL_LEN as u64 {
            return None;
        }
        Bell::map(&f, None)
    }

    fn map(f: &std::fs::File, own: Option<std::path::PathBuf>) -> Option<Bell> {
        use std::os::fd::AsRawFd as _;
        // SAFETY: a fresh shared mapping of BELL_LEN bytes of a file at least that
        // long; the result is checked against MAP_FAILED before use.
        let base = unsafe {
            mmap(
                ptr::null_mut(),
                BELL_LEN,
                PROT_RW,
                MAP_SHARED,
                f.as_raw_fd(),
                0,
            )
        };
        if base as isize == -1 || base.is_null() {
            return None;
        }
        Some(Bell { base, own })
    }

    fn path(&self) -> Option<String> {
        self.own.as_ref().map(|p| p.to_string_lossy().into_owned())
    }

    fn word(&self) -> &AtomicU32 {
        // SAFETY: the mapping is page-aligned, BELL_LEN bytes long and lives as long
        // as `self`; other processes access the word only atomically.
        unsafe { &*self.base.cast::<AtomicU32>() }
    }

    /// Wakes the owner if it sleeps.
    fn ring(&self) {
        let w = self.word();
        if w.load(Ordering::SeqCst) == ASLEEP
            && w.swap(AWAKE, Ordering::SeqCst) == ASLEEP
            && let Some(nr) = SYS_FUTEX
        {
            // SAFETY: FUTEX_WAKE on a valid, aligned, shared u32; no other arguments
            // are read.
            unsafe { syscall(nr, self.base, FUTEX_WAKE, 1 as c_int) };
        }
    }

    /// Marks the owner asleep; then, unless `anything` finds work, sleeps until rung
    /// or `timeout` passes.
    fn sleep(&self, timeout: Duration, anything: impl FnOnce() -> CResult<bool>) -> CResult<()> {
        let w = self.word();
        w.store(ASLEEP, Ordering::SeqCst);
        // A peer that handed something over before the store did not ring: look once
        // more after it (SeqCst on both sides: either the peer sees ASLEEP or this
        // look sees what the peer handed over).
        let found = anything();
        if matches!(found, Ok(false))
            && let Some(nr) = SYS_FUTEX
        {
            let ts = Timespec {
                tv_sec: timeout.as_secs() as c_long,
                tv_nsec: c_long::from(timeout.subsec_nanos() as i32),
            };
            // SAFETY: FUTEX_WAIT on a valid, aligned, shared u32 with a valid relative
            // timeout; it returns at once if the word is no longer ASLEEP.
            unsafe {
                syscall(
                    nr,
                    self.base,
                    FUTEX_WAIT,
                    ASLEEP as c_int,
                    &ts as *const Timespec,
                )
            };
        }
        w.store(AWAKE, Ordering::SeqCst);
        found.map(|_| ())
    }
}

impl Drop for Bell {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, unmapped once.
        unsafe { munmap(self.base, BELL_LEN) };
        if let Some(p) = &self.own {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Default of `HALO_WATCHDOG_MS`: how long one libfabric call may run before the
/// watchdog ends the process.
const WATCHDOG_DEFAULT: Duration = Duration::from_secs(3);
/// How often the watchdog looks.
const WATCHDOG_EVERY: Duration = Duration::from_millis(100);

/// What a transport is doing inside libfabric, for the watchdog.
///
/// `shm` keeps its queues under spin locks in shared memory: a peer killed while it
/// holds one (in the middle of its own progress, or of a send to a third rank) leaves
/// every later call that needs that lock spinning inside libfabric forever, where no
/// timeout and no abort can reach. The watchdog notices a call that has not returned
/// for `HALO_WATCHDOG_MS` (default 3 s; 0 disables it) and, as NCCL's watchdog does
/// in PyTorch, ends the process: it prints which call is stuck, on which rank, and
/// which same-host peers have ended, then exits with status 1 (`_exit`: the stuck
/// provider must not be called again by exit handlers).
#[derive(Debug)]
struct Watched {
    /// Incremented when a call starts and when it returns: odd while inside a call.
    seq: std::sync::atomic::AtomicU64,
    /// The call's peer (`u32::MAX`: none) and name (an index into `CALLS`).
    peer: AtomicU32,
    what: AtomicU32,
    rank: usize,
    limit: Duration,
    /// Same-host peers' processes, to say which have ended.
    procs: Mutex<Vec<(usize, Proc)>>,
}

const CALLS: [&str; 7] = [
    "fi_tsend",
    "fi_trecv",
    "fi_cq_read",
    "fi_cq_readerr",
    "fi_cancel",
    "fi_trywait",
    "fi_close",
];
const CALL_TSEND: u32 = 0;
const CALL_TRECV: u32 = 1;
const CALL_CQ_READ: u32 = 2;
const CALL_CQ_READERR: u32 = 3;
const CALL_CANCEL: u32 = 4;
const CALL_TRYWAIT: u32 = 5;
const CALL_CLOSE: u32 = 6;

/// The transports the watchdog looks after.
static WATCHED: Mutex<Vec<std::sync::Weak<Watched>>> = Mutex::new(Vec::new());

unsafe extern "C" {
    /// Ends the process at once (no exit handlers, no destructors).
    fn _exit(status: c_int) -> !;
}

impl Watched {
    /// A new entry, registered with the watchdog (started on first use); `None` when
    /// `limit` is zero.
    fn register(rank: usize, limit: Duration) -> Option<std::sync::Arc<Watched>> {
        if limit.is_zero() {
            return None;
        }
        let w = std::sync::Arc::new(Watched {
            seq: std::sync::atomic::AtomicU64::new(0),
            peer: AtomicU32::new(u32::MAX),
            what: AtomicU32::new(0),
            rank,
            limit,
            procs: Mutex::new(Vec::new()),
        });
        static STARTED: std::sync::Once = std::sync::Once::new();
        STARTED.call_once(|| {
            let spawned = std::thread::Builder::new()
                .name("halo-watchdog".into())
                .spawn(watchdog);
            if let Err(e) = spawned {
                tracing::warn!("cannot start the libfabric watchdog: {e}");
            }
        });
        WATCHED
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(std::sync::Arc::downgrade(&w));
        Some(w)
    }

    fn enter(&self, what: u32, peer: Option<usize>) {
        self.what.store(what, Ordering::Relaxed);
        self.peer
            .store(peer.map_or(u32::MAX, |p| p as u32), Ordering::Relaxed);
        self.seq.fetch_add(1, Ordering::Release);
    }

    fn leave(&self) {
        self.seq.fetch_add(1, Ordering::Release);
    }
}

/// Runs `f` (one libfabric call) marked for the watchdog.
fn watched<T>(
    w: &Option<std::sync::Arc<Watched>>,
    what: u32,
    peer: Option<usize>,
    f: impl FnOnce() -> T,
) -> T {
    if let Some(w) = w {
        w.enter(what, peer);
        let r = f();
        w.leave();
        r
    } else {
        f()
    }
}

/// The watchdog thread: ends the process when a call has been stuck past its limit.
fn watchdog() {
    // Per entry: the odd sequence number last seen and since when.
    let mut seen: Vec<(std::sync::Weak<Watched>, u64, Instant)> = Vec::new();
    loop {
        std::thread::sleep(WATCHDOG_EVERY);
        let live: Vec<std::sync::Arc<Watched>> = {
            let mut list = WATCHED.lock().unwrap_or_else(|p| p.into_inner());
            list.retain(|w| w.strong_count() > 0);
            list.iter().filter_map(std::sync::Weak::upgrade).collect()
        };
        seen.retain(|(w, _, _)| w.strong_count() > 0);
        for w in &live {
            let seq = w.seq.load(Ordering::Acquire);
            let i = seen
                .iter()
                .position(|(x, _, _)| std::ptr::eq(x.as_ptr(), std::sync::Arc::as_ptr(w)));
            if seq % 2 == 0 {
                if let Some(i) = i {
                    seen.swap_remove(i);
                }
                continue;
            }
            match i {
                Some(i) if seen[i].1 == seq => {
                    if seen[i].2.elapsed() >= w.limit {
                        stuck(w, seen[i].2.elapsed());
                    }
                }
                Some(i) => seen[i] = (std::sync::Arc::downgrade(w), seq, Instant::now()),
                None => seen.push((std::sync::Arc::downgrade(w), seq, Instant::now())),
            }
        }
    }
}

/// Reports a stuck call and ends the process.
fn stuck(w: &Watched, for_: Duration) -> ! {
    let what = CALLS
        .get(w.what.load(Ordering::Relaxed) as usize)
        .copied()
        .unwrap_or("a libfabric call");
    let peer = match w.peer.load(Ordering::Relaxed) {
        u32::MAX => String::new(),
        p => format!(" (rank {p})"),
    };
    let ended: Vec<String> = w
        .procs
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .filter(|(_, p)| has_ended(*p))
        .map(|(r, p)| format!("rank {r} (process {})", p.pid))
        .collect();
    let why = if ended.is_empty() {
        "the provider is stuck".to_string()
    } else {
        format!(
            "{} ended; the shm provider waits forever on a lock that a dead process held",
            ended.join(", ")
        )
    };
    eprintln!(
        "halo watchdog: rank {}: {what}{peer} has not returned for {:.1} s: {why}; ending \
         this process with status 1 (HALO_WATCHDOG_MS sets the limit, 0 turns this off)",
        w.rank,
        for_.as_secs_f64()
    );
    // SAFETY: _exit ends the process without running anything else; nothing of this
    // process is used afterwards.
    unsafe { _exit(1) }
}

/// The context of one posted operation; libfabric returns its address in completions.
#[repr(C)]
struct OpCtx {
    /// Provider scratch space (FI_CONTEXT / FI_CONTEXT2 modes); must come first.
    fi: fi::fi_context2,
    token: u32,
    peer: u32,
    ep: u8,
    is_send: bool,
    in_use: bool,
    index: u32,
    /// The posted length (a receive completing with another is a size mismatch).
    len: usize,
    /// The full tag, for messages naming the operation.
    tag: u64,
}

/// Which endpoint and fabric address reach a peer.
#[derive(Debug, Clone, Copy)]
struct Route {
    ep: u8,
    addr: fi::fi_addr_t,
}

/// Endpoint slot for peers on this host.
const LOCAL: usize = 0;
/// Endpoint slot for peers on other hosts.
const NET: usize = 1;

/// How long the cancelled operations of a failed collective may take to come back
/// before the endpoints are closed under them.
const CANCEL_DRAIN: Duration = Duration::from_millis(100);

/// How long a rank that found a size mismatch keeps delivering its outstanding sends
/// before it closes its endpoints: the peers that called with another size then see
/// the mismatch themselves (both ends name both sizes) instead of waiting for these
/// messages until their timeout.
const FLUSH_SENDS: Duration = Duration::from_millis(500);

/// How often, while waiting, the processes of same-host peers with outstanding
/// operations are looked at.
const WATCH_EVERY: Duration = Duration::from_millis(50);

/// How long completions are still read after a peer's process was found ended, for
/// what it sent before it ended.
const LAST_WORDS: Duration = Duration::from_millis(20);

/// Below this bound `sleep` and `block` only yield: a sleep costs a system call and
/// its granularity is tens of microseconds (timer slack).
const YIELD_BELOW: Duration = Duration::from_micros(50);

/// The longest single sleep of `sleep` (and of `block` where an endpoint has no file
/// descriptor to block on).
const SLEEP_MAX: Duration = Duration::from_micros(200);

/// What a rank does while it waits for completions (`HALO_PROGRESS`).
///
/// The engine first polls without pause (`ExecOptions::spin` times, 4 by default),
/// then calls the transport's wait with a bound that grows from 1 us to 1 ms; this is
/// what that wait does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum FabricProgress {
    /// Return at once: poll without pause. Lowest latency with a core per rank;
    /// oversubscribed, a spinning rank takes the processor from the peer it waits for.
    Spin,
    /// `sched_yield` between polls.
    Yield,
    /// Yield while the bound is below 50 us, then sleep up to 200 us at a time.
    Sleep,
    /// The default. As `sleep`, but the sleep ends as soon as there is something to
    /// do: on the network completion queue's file descriptor (`FI_WAIT_FD`,
    /// `fi_trywait`, `ppoll`) where the provider has one (`tcp;ofi_rxm`), and for
    /// same-host peers (`shm` has no wait object in libfabric 1.17) on a futex
    /// "doorbell" in shared memory that peers ring when they hand this rank a message.
    /// Waits only for the network sleep until woken (up to the engine's 1 ms bound).
    #[default]
    Block,
}

impl std::str::FromStr for FabricProgress {
    type Err = Error;

    fn from_str(s: &str) -> Result<FabricProgress> {
        match s.trim() {
            "spin" => Ok(FabricProgress::Spin),
            "yield" => Ok(FabricProgress::Yield),
            "sleep" => Ok(FabricProgress::Sleep),
            "block" => Ok(FabricProgress::Block),
            other => Err(Error::invalid_argument(format!(
                "HALO_PROGRESS={other:?}: expected spin, yield, sleep or block"
            ))),
        }
    }
}

impl std::fmt::Display for FabricProgress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            FabricProgress::Spin => "spin",
            FabricProgress::Yield => "yield",
            FabricProgress::Sleep => "sleep",
            FabricProgress::Block => "block",
        })
    }
}

/// A post the provider refused with `-FI_EAGAIN`, retried as the engine progresses.
#[derive(Debug, Clone, Copy)]
struct Deferred {
    peer: usize,
    token: u32,
    is_send: bool,
    region: Region,
    /// The full tag (tag base included).
    tag: u64,
    since: Instant,
}

/// A process on this host: its id and its start time (clock ticks after boot, from
/// `/proc/PID/stat`), which tells a reused process id apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Proc {
    pid: u32,
    start: u64,
}

/// State (field 3) and start time (field 22) of a process, from `/proc/PID/stat`.
fn proc_stat(path: &str) -> std::io::Result<(u8, u64)> {
    let s = std::fs::read_to_string(path)?;
    let bad = || std::io::Error::new(std::io::ErrorKind::InvalidData, "unexpected stat format");
    // The command name (field 2) is in parentheses and may hold anything.
    let (_, rest) = s.rsplit_once(')').ok_or_else(bad)?;
    let mut fields = rest.split_whitespace();
    let state = fields
        .next()
        .and_then(|f| f.bytes().next())
        .ok_or_else(bad)?;
    let start = fields
        .nth(18)
        .and_then(|f| f.parse::<u64>().ok())
        .ok_or_else(bad)?;
    Ok((state, start))
}

/// When this process started, from `/proc/self/stat` and the boot time in `/proc/stat`
/// (10 ms resolution).
fn process_start() -> Option<std::time::SystemTime> {
    let (_, ticks) = proc_stat("/proc/self/stat").ok()?;
    let btime: u64 = std::fs::read_to_string("/proc/stat")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    // USER_HZ is 100 on every Linux that reports /proc times this way.
    Some(
        std::time::UNIX_EPOCH
            + Duration::from_secs(btime)
            + Duration::from_millis(ticks.saturating_mul(10)),
    )
}

/// Removes `/dev/shm/PID:N:M` — the regions the `shm` provider names after the
/// process id — that an earlier process with this process's id left behind (killed
/// before it could remove them; they are older than this process). With one in place
/// the provider cannot create this process's region: `fi_enable` fails with `EBUSY`.
/// Once per process, before its first `shm` endpoint.
fn remove_stale_shm_regions() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let Some(start) = process_start() else {
            return;
        };
        let Ok(dir) = std::fs::read_dir("/dev/shm") else {
            return;
        };
        let prefix = format!("{}:", std::process::id());
        for entry in dir.flatten() {
            let name = entry.file_name();
            let ours = name
                .to_str()
                .and_then(|n| n.strip_prefix(&prefix))
                .is_some_and(|rest| {
                    !rest.is_empty() && rest.chars().all(|c| c.is_ascii_digit() || c == ':')
                });
            let older = entry
                .metadata()
                .and_then(|m| m.modified())
                .is_ok_and(|t| t < start);
            if ours && older {
                match std::fs::remove_file(entry.path()) {
                    Ok(()) => tracing::info!(
                        "removed {}, left by an earlier process with this process id",
                        entry.path().display()
                    ),
                    Err(e) => tracing::debug!("cannot remove {}: {e}", entry.path().display()),
                }
            }
        }
    });
}

/// This process as peers on the same host can watch it: its PID namespace and
/// [`Proc`]. `None` when `/proc` does not show this process under its own id (a
/// `/proc` of another PID namespace), so that nobody watches the wrong process.
fn this_process() -> Option<(String, Proc)> {
    let ns = std::fs::read_link("/proc/self/ns/pid").ok()?;
    let pid = std::process::id();
    let (_, start) = proc_stat("/proc/self/stat").ok()?;
    let (_, seen) = proc_stat(&format!("/proc/{pid}/stat")).ok()?;
    (seen == start).then(|| (ns.to_string_lossy().into_owned(), Proc { pid, start }))
}

/// Whether a watched process has ended: gone, a zombie, or its id taken by another
/// process. `false` when that cannot be told.
fn has_ended(p: Proc) -> bool {
    match proc_stat(&format!("/proc/{}/stat", p.pid)) {
        Ok((state, start)) => start != p.start || matches!(state, b'Z' | b'X' | b'x'),
        Err(e) => e.kind() == std::io::ErrorKind::NotFound,
    }
}

/// The libfabric transport of one rank.
pub(crate) struct FabricTransport {
    rank: usize,
    size: usize,
    eps: [Option<Endpoint>; 2],
    /// Provider names per slot (kept when the endpoints are closed).
    providers: [Option<String>; 2],
    routes: Vec<Route>,
    // Boxed: the provider holds pointers to these contexts, which must not move when
    // the pool grows.
    #[allow(clippy::vec_box)]
    ctxs: Vec<Box<OpCtx>>,
    free: Vec<u32>,
    /// Operations posted and not yet completed, per endpoint slot.
    posted: [usize; 2],
    /// Calls of `poll`, to read idle completion queues now and then.
    polls: u32,
    /// Posts refused with -FI_EAGAIN, in posting order (kept here to reuse the memory).
    backlog: Vec<Deferred>,
    /// Scratch list of peers (reused).
    peers: Vec<usize>,
    /// Same-host peers' processes, by rank, for noticing a peer that died.
    watch: Vec<Option<Proc>>,
    /// This rank's doorbell (`block` with same-host peers).
    bell: Option<Bell>,
    /// Same-host peers' doorbells, by rank (empty without a bell).
    bells: Vec<Option<Bell>>,
    /// Why the transport may no longer be used.
    broken: Option<String>,
    /// The uniform block size of the collective in progress ([`Buffers::block`]).
    block: Option<usize>,
    /// This transport's entry with the watchdog (`None`: disabled).
    watched: Option<std::sync::Arc<Watched>>,
    post_timeout: Duration,
    progress: FabricProgress,
}

// SAFETY: the raw pointers inside are libfabric objects opened with FI_THREAD_DOMAIN,
// operation contexts the provider writes only while this transport progresses them,
// and doorbell mappings (process-wide shared memory, accessed only atomically); the
// transport is owned and used by one thread at a time (the communicator is Send, not
// Sync), which that threading model allows.
unsafe impl Send for FabricTransport {}

impl std::fmt::Debug for FabricTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FabricTransport")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("providers", &self.providers())
            .field("progress", &self.progress)
            .field("broken", &self.broken)
            .finish_non_exhaustive()
    }
}

/// Provider choice for a job.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct FabricConfig {
    /// Provider for peers on the same host (`shm`); `None` sends everything over the network provider.
    pub local_provider: Option<String>,
    /// Provider for peers on other hosts (`tcp;ofi_rxm`; `cxi` on Slingshot).
    pub net_provider: String,
    /// Local IP the network provider binds (default: the address that routes to the bootstrap root).
    pub addr: Option<std::net::IpAddr>,
    /// How long one post may keep being refused with -FI_EAGAIN before the collective
    /// fails (the collective's own timeout applies as well).
    pub post_timeout: Duration,
    /// What a rank does while it waits (`HALO_PROGRESS`).
    pub progress: FabricProgress,
    /// How long one libfabric call may run before the watchdog ends the process
    /// (`HALO_WATCHDOG_MS`, default 3 s; zero: no watchdog). See the module notes.
    pub watchdog: Duration,
}

impl Default for FabricConfig {
    fn default() -> Self {
        FabricConfig {
            local_provider: Some("shm".into()),
            net_provider: "tcp;ofi_rxm".into(),
            addr: None,
            post_timeout: Duration::from_secs(60),
            progress: FabricProgress::default(),
            watchdog: WATCHDOG_DEFAULT,
        }
    }
}

impl FabricConfig {
    /// The default, changed by `HALO_FABRIC_PROVIDER` (one provider for every peer,
    /// e.g. `tcp;ofi_rxm` or `shm`), `HALO_FABRIC_NET_PROVIDER` (the network provider
    /// only), `HALO_FABRIC_ADDR` (the IP the network provider binds), `HALO_PROGRESS`
    /// (`spin`, `yield`, `sleep` or `block`; see [`FabricProgress`]) and
    /// `HALO_WATCHDOG_MS`.
    pub fn from_env() -> Result<Self> {
        let mut c = FabricConfig::default();
        if let Ok(p) = std::env::var("HALO_FABRIC_PROVIDER") {
            c.force(&p);
        }
        if let Ok(p) = std::env::var("HALO_FABRIC_NET_PROVIDER") {
            c.net_provider = p;
        }
        if let Ok(a) = std::env::var("HALO_FABRIC_ADDR") {
            c.addr = Some(a.parse().map_err(|_| {
                Error::invalid_argument(format!("HALO_FABRIC_ADDR={a:?} is not an IP address"))
            })?);
        }
        if let Ok(p) = std::env::var("HALO_PROGRESS") {
            c.progress = p.parse()?;
        }
        if let Ok(v) = std::env::var("HALO_WATCHDOG_MS") {
            c.watchdog = Duration::from_millis(v.trim().parse::<u64>().map_err(|_| {
                Error::invalid_argument(format!(
                    "HALO_WATCHDOG_MS={v:?} is not a number of milliseconds"
                ))
            })?);
        }
        Ok(c)
    }

    /// Uses one provider for every peer.
    pub fn force(&mut self, provider: &str) {
        self.local_provider = None;
        self.net_provider = provider.to_string();
    }
}

impl FabricTransport {
    /// Opens this rank's endpoints; `net_node` is the IP the network provider binds.
    /// Returns the transport (not yet connected) and its endpoint names, slot by slot,
    /// to publish at bootstrap.
    pub(crate) fn open(
        rank: usize,
        size: usize,
        config: &FabricConfig,
        net_node: &str,
    ) -> Result<(FabricTransport, [Option<Vec<u8>>; 2])> {
        let want_fd = config.progress == FabricProgress::Block;
        if config
            .local_provider
            .as_deref()
            .is_some_and(|p| p.starts_with("shm"))
            || config.net_provider.starts_with("shm")
        {
            remove_stale_shm_regions();
        }
        let local = match &config.local_provider {
            Some(p) if size > 1 => Some(Endpoint::open(p, None, want_fd)?),
            _ => None,
        };
        let bell = if want_fd && local.is_some() {
            Bell::create()
        } else {
            None
        };
        let node = (!config.net_provider.starts_with("shm")).then_some(net_node);
        let net = Endpoint::open(&config.net_provider, node, want_fd)?;
        let names = [
            local.as_ref().map(|e| e.name.clone()),
            Some(net.name.clone()),
        ];
        let t = FabricTransport {
            rank,
            size,
            providers: [
                local.as_ref().map(|e| e.provider.clone()),
                Some(net.provider.clone()),
            ],
            eps: [local, Some(net)],
            routes: Vec::new(),
            ctxs: Vec::new(),
            posted: [0; 2],
            polls: 0,
            free: Vec::new(),
            backlog: Vec::new(),
            peers: Vec::new(),
            watch: vec![None; size],
            bell,
            bells: Vec::new(),
            broken: None,
            block: None,
            watched: Watched::register(rank, config.watchdog),
            post_timeout: config.post_timeout,
            progress: config.progress,
        };
        Ok((t, names))
    }

    /// Sets the route to every peer: the local endpoint for peers on this rank's host
    /// (when both have one), the network endpoint otherwise. `hosts[r]` and `names[r]`
    /// are what rank r published.
    pub(crate) fn connect(
        &mut self,
        hosts: &[String],
        names: &[[Option<Vec<u8>>; 2]],
    ) -> Result<()> {
        let n = self.size;
        if hosts.len() != n || names.len() != n {
            return Err(Error::internal(
                "fabric connect: one host and name set per rank expected",
            ));
        }
        let me = self.rank;
        let mut routes = vec![
            Route {
                ep: NET as u8,
                addr: fi::FI_ADDR_NOTAVAIL
            };
            n
        ];
        // Local peers.
        if self.eps[LOCAL].is_some() {
            let local: Vec<usize> = (0..n)
                .filter(|&p| p != me && hosts[p] == hosts[me] && names[p][LOCAL].is_some())
                .collect();
            let list: Vec<(usize, &[u8])> = local
                .iter()
                .map(|&p| (p, names[p][LOCAL].as_deref().expect("filtered")))
                .collect();
            let addrs = self.eps[LOCAL]
                .as_mut()
                .expect("checked")
                .insert(&list, "local")?;
            for (p, a) in local.into_iter().zip(addrs) {
                routes[p] = Route {
                    ep: LOCAL as u8,
                    addr: a,
                };
            }
        }
        // Everyone else over the network provider; all ranks are inserted in rank order
        // so that the fabric address is the rank.
        let list: Vec<(usize, &[u8])> = (0..n)
            .map(|p| {
                names[p][NET]
                    .as_deref()
                    .map(|a| (p, a))
                    .ok_or_else(|| Error::InvalidUsage {
                        peer: Some(p),
                        message: format!(
                            "rank {p}'s bootstrap card: field `net` (its network address) is missing"
                        ),
                    })
            })
            .collect::<Result<_>>()?;
        let addrs = self.eps[NET]
            .as_mut()
            .expect("always open")
            .insert(&list, "net")?;
        for (p, a) in addrs.into_iter().enumerate() {
            if routes[p].addr == fi::FI_ADDR_NOTAVAIL {
                routes[p] = Route {
                    ep: NET as u8,
                    addr: a,
                };
            }
        }
        self.routes = routes;
        let local = self
            .routes
            .iter()
            .enumerate()
            .filter(|&(p, r)| p != me && r.ep == LOCAL as u8)
            .count();
        tracing::info!(
            rank = me,
            local_peers = local,
            providers = ?self.providers(),
            progress = %self.progress,
            "fabric transport connected"
        );
        Ok(())
    }

    /// The providers in use: (local, network).
    pub(crate) fn providers(&self) -> (Option<&str>, Option<&str>) {
        (
            self.providers[LOCAL].as_deref(),
            self.providers[NET].as_deref(),
        )
    }

    /// The provider that carries messages to `peer`.
    pub(crate) fn provider_to(&self, peer: usize) -> Option<&str> {
        let r = self.routes.get(peer)?;
        self.providers[r.ep as usize].as_deref()
    }

    fn provider_name(&self, slot: u8) -> &str {
        self.providers[slot as usize].as_deref().unwrap_or("?")
    }

    /// A context for a new operation.
    fn take_ctx(&mut self, d: &Deferred, ep: u8) -> *mut OpCtx {
        let (token, peer, is_send) = (d.token, d.peer, d.is_send);
        let i = match self.free.pop() {
            Some(i) => i as usize,
            None => {
                self.ctxs.push(Box::new(OpCtx {
                    // SAFETY: fi_context2 is an array of raw pointers; all-zero is valid.
                    fi: unsafe { std::mem::zeroed() },
                    token: 0,
                    peer: 0,
                    ep: 0,
                    is_send: false,
                    in_use: false,
                    index: 0,
                    len: 0,
                    tag: 0,
                }));
                let i = self.ctxs.len() - 1;
                self.ctxs[i].index = i as u32;
                i
            }
        };
        let c = &mut self.ctxs[i];
        c.token = token;
        c.peer = peer as u32;
        c.ep = ep;
        c.is_send = is_send;
        c.in_use = true;
        c.len = d.region.len;
        c.tag = d.tag;
        self.posted[ep as usize] += 1;
        &mut **c as *mut OpCtx
    }

    fn in_flight(&self) -> usize {
        self.ctxs.len() - self.free.len()
    }

    /// The peers of every outstanding operation (posted or deferred), sorted, into
    /// `self.peers`.
    fn collect_peers(&mut self) {
        self.peers.clear();
        self.peers.extend(
            self.ctxs
                .iter()
                .filter(|c| c.in_use)
                .map(|c| c.peer as usize),
        );
        self.peers.extend(self.backlog.iter().map(|d| d.peer));
        self.peers.sort_unstable();
        self.peers.dedup();
    }

    /// Whether an operation with `peer` is outstanding.
    fn waits_for(&self, peer: usize) -> bool {
        self.ctxs
            .iter()
            .any(|c| c.in_use && c.peer as usize == peer)
            || self.backlog.iter().any(|d| d.peer == peer)
    }

    /// Reads every endpoint's completion queue once; completed tokens go to `done`.
    ///
    /// A queue with nothing posted on it and no refused post waiting for it is read
    /// only every 64th call: reading the `tcp;ofi_rxm` queue is an `epoll_wait`
    /// system call, which all-local collectives would otherwise pay on every poll.
    /// Reading it now and then keeps the provider's own progress going (connection
    /// requests from peers that are ahead of this rank).
    ///
    /// A peer's failure (an error completion) is returned after the rest of the queues
    /// was read, and a size mismatch found there is returned instead: a peer that
    /// failed on a mismatch with this rank may have closed its endpoint just after its
    /// last message, which this rank then reports as what it is.
    fn poll(&mut self, done: &mut Vec<u32>) -> CResult<()> {
        self.polls = self.polls.wrapping_add(1);
        let sweep = self.polls.is_multiple_of(64);
        let mut failed: Option<CollectiveError> = None;
        for slot in [LOCAL, NET] {
            if !sweep
                && self.posted[slot] == 0
                && !self
                    .backlog
                    .iter()
                    .any(|d| self.routes[d.peer].ep as usize == slot)
            {
                continue;
            }
            while let Some(cq) = self.eps[slot].as_ref().map(|e| e.cq) {
                let mut entries = [fi::fi_cq_tagged_entry {
                    op_context: ptr::null_mut(),
                    flags: 0,
                    len: 0,
                    buf: ptr::null_mut(),
                    data: 0,
                    tag: 0,
                }; 32];
                // SAFETY: the CQ is open with FI_CQ_FORMAT_TAGGED, so each entry is an
                // fi_cq_tagged_entry; the array has room for the count passed.
                let ret = watched(&self.watched, CALL_CQ_READ, None, || unsafe {
                    fi::fi_cq_read(cq, entries.as_mut_ptr().cast(), entries.len())
                });
                if ret > 0 {
                    // Every entry is completed (and its context released) before the
                    // first error is returned.
                    let mut first = Ok(());
                    for en in &entries[..ret as usize] {
                        let r = self.complete(en, slot, done);
                        if first.is_ok() {
                            first = r;
                        }
                    }
                    first?;
                    if (ret as usize) < entries.len() {
                        break;
                    }
                } else if ret == EAGAIN {
                    break;
                } else if ret == EAVAIL {
                    let mut err = fi::fi_cq_err_entry::default();
                    // SAFETY: the CQ is open; `err` is a zeroed entry the provider fills.
                    let r = watched(&self.watched, CALL_CQ_READERR, None, || unsafe {
                        fi::fi_cq_readerr(cq, &mut err, 0)
                    });
                    if r == EAGAIN {
                        break;
                    }
                    let provider = self.provider_name(slot as u8);
                    if r < 0 {
                        return Err(CollectiveError::System(format!(
                            "fi_cq_readerr on {provider}: {}",
                            fi::strerror(r as i64)
                        )));
                    }
                    let ctx = err.op_context.cast::<OpCtx>();
                    if ctx.is_null() {
                        return Err(CollectiveError::System(format!(
                            "{provider} completion error without context: {}",
                            fi::strerror(i64::from(err.err))
                        )));
                    }
                    // SAFETY: every operation is posted with a context from `self.ctxs`,
                    // boxed and alive until released below.
                    let (peer, is_send, token, posted, tag) = unsafe {
                        let c = &*ctx;
                        (c.peer, c.is_send, c.token, c.len, c.tag)
                    };
                    // shm reports the error number negated.
                    if err.err.unsigned_abs() == fi::FI_ETRUNC as u32 && !is_send {
                        // A longer message than the receive: the sender's size is what
                        // arrived plus what did not fit, where the provider says
                        // (`shm`; `tcp;ofi_rxm` reports neither).
                        self.release(ctx);
                        let sent = Some(err.len.saturating_add(err.olen)).filter(|&n| n > posted);
                        let block = (err.flags & fi::FI_REMOTE_CQ_DATA != 0)
                            .then(|| block_of(err.data))
                            .flatten();
                        return Err(super::mismatch(
                            peer as usize,
                            self.rank,
                            tag,
                            (sent, block),
                            super::Expected {
                                len: posted,
                                block: self.block,
                            },
                            self.rank,
                        ));
                    }
                    let msg = format!(
                        "{} rank {peer} failed on {provider}: {} (step {token})",
                        if is_send { "send to" } else { "receive from" },
                        fi::strerror(i64::from(err.err))
                    );
                    self.release(ctx);
                    if err.err == fi::FI_ECANCELED {
                        continue;
                    }
                    failed.get_or_insert(CollectiveError::Remote {
                        peer: peer as usize,
                        message: msg,
                    });
                } else {
                    return Err(CollectiveError::System(format!(
                        "fi_cq_read on {}: {}",
                        self.provider_name(slot as u8),
                        fi::strerror(ret as i64)
                    )));
                }
            }
        }
        match failed {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Completes one operation. A receive that completed with another length than
    /// it was posted with (a shorter message), or from a peer whose call has another
    /// uniform block size, is an error naming the peer and both sizes.
    fn complete(
        &mut self,
        en: &fi::fi_cq_tagged_entry,
        slot: usize,
        done: &mut Vec<u32>,
    ) -> CResult<()> {
        let ctx = en.op_context.cast::<OpCtx>();
        if ctx.is_null() {
            return Ok(());
        }
        // SAFETY: the context is one of ours (see `poll`).
        let (token, peer, is_send, posted, tag) = unsafe {
            let c = &*ctx;
            (c.token, c.peer, c.is_send, c.len, c.tag)
        };
        self.release(ctx);
        if !is_send {
            // The sender may be waiting for its send to complete.
            self.ring(peer as usize);
            let block = (en.flags & fi::FI_REMOTE_CQ_DATA != 0)
                .then(|| block_of(en.data))
                .flatten();
            let ours = self.eps[slot]
                .as_ref()
                .map_or(0, |e| e.block_data(self.block));
            let blocks_differ = block.is_some() && ours != 0 && en.data != ours;
            if en.len != posted || blocks_differ {
                return Err(super::mismatch(
                    peer as usize,
                    self.rank,
                    tag,
                    (Some(en.len), block),
                    super::Expected {
                        len: posted,
                        block: self.block,
                    },
                    self.rank,
                ));
            }
        }
        done.push(token);
        Ok(())
    }

    /// Wakes a same-host peer that sleeps on its bell.
    fn ring(&self, peer: usize) {
        if let Some(Some(b)) = self.bells.get(peer) {
            b.ring();
        }
    }

    fn release(&mut self, ctx: *mut OpCtx) {
        // SAFETY: the context is one of ours (see `poll`), alive in `self.ctxs`.
        let c = unsafe { &mut *ctx };
        if c.in_use {
            c.in_use = false;
            self.posted[c.ep as usize] = self.posted[c.ep as usize].saturating_sub(1);
            self.free.push(c.index);
        }
    }

    /// Asks the provider to cancel operation `i` of the pool (it then completes with
    /// `FI_ECANCELED`, or normally if it was already done).
    fn cancel_ctx(&mut self, i: usize) {
        let c = &mut self.ctxs[i];
        if !c.in_use {
            return;
        }
        if let Some(e) = self.eps[c.ep as usize].as_ref() {
            // SAFETY: the endpoint is open and the context was posted on it; cancel
            // only asks the provider to complete it with FI_ECANCELED.
            let ret = watched(
                &self.watched,
                CALL_CANCEL,
                Some(c.peer as usize),
                || unsafe { fi::fi_cancel(&mut (*e.ep).fid, (&mut **c as *mut OpCtx).cast()) },
            );
            if ret != 0 && ret != -(fi::FI_ENOENT as isize) {
                tracing::debug!(
                    rank = self.rank,
                    peer = c.peer,
                    "fi_cancel: {}",
                    fi::strerror(ret as i64)
                );
            }
        }
    }

    /// Cancels everything outstanding and reads completions until it is all back or
    /// `limit` has passed; returns how many operations are still with the provider.
    fn cancel_all(&mut self, limit: Duration) -> usize {
        self.backlog.clear();
        for i in 0..self.ctxs.len() {
            self.cancel_ctx(i);
        }
        let deadline = Instant::now() + limit;
        let mut sink = Vec::new();
        while self.in_flight() > 0 && Instant::now() < deadline {
            // Errors other than cancellations (a peer that failed) are expected here.
            let _ = self.poll(&mut sink);
            sink.clear();
            std::thread::yield_now();
        }
        self.in_flight()
    }

    /// Closes the endpoints and refuses every later collective with `why`.
    fn break_down(&mut self, why: String) {
        self.backlog.clear();
        for e in self.eps.iter_mut().flatten() {
            e.abandoned = true;
        }
        let eps = std::mem::take(&mut self.eps);
        watched(&self.watched, CALL_CLOSE, None, || drop(eps));
        for c in &mut self.ctxs {
            c.in_use = false;
        }
        self.posted = [0; 2];
        self.free = (0..self.ctxs.len() as u32).collect();
        self.broken = Some(why);
    }

    /// Waits up to `max` on the completion queues' file descriptors (`block`).
    fn block_fd(&mut self, max: Duration) {
        let mut fds = [
            PollFd {
                fd: -1,
                events: POLLIN,
                revents: 0,
            },
            PollFd {
                fd: -1,
                events: POLLIN,
                revents: 0,
            },
        ];
        let mut n = 0;
        let mut every = true;
        for e in self.eps.iter().flatten() {
            let Some(fd) = e.wait_fd else {
                every = false;
                continue;
            };
            let mut fid: *mut fi::fid = e.cq.cast();
            // SAFETY: the fabric and the CQ are open; `fid` is one fid of that fabric.
            let ret = watched(&self.watched, CALL_TRYWAIT, None, || unsafe {
                fi::fi_trywait(e.fabric, &mut fid, 1)
            });
            if ret as isize == EAGAIN {
                // Completions are ready (or progress is needed): poll again now.
                return;
            }
            if ret != 0 {
                every = false;
                continue;
            }
            fds[n].fd = fd;
            n += 1;
        }
        // Completions of an endpoint without a descriptor (shm) or of a deferred post
        // are only seen by polling: bound the block as `sleep` does then.
        let bound = if every && self.backlog.is_empty() {
            max
        } else {
            max.min(SLEEP_MAX)
        };
        if n == 0 {
            std::thread::sleep(bound);
            return;
        }
        let ts = Timespec {
            tv_sec: bound.as_secs() as c_long,
            tv_nsec: c_long::from(bound.subsec_nanos() as i32),
        };
        // SAFETY: `fds` holds `n` initialised pollfds; `ts` is a valid timespec; no
        // signal mask is changed (NULL).
        unsafe { ppoll(fds.as_mut_ptr(), n as c_ulong, &ts, ptr::null()) };
    }
}

impl Drop for FabricTransport {
    fn drop(&mut self) {
        // Closing an shm endpoint touches peers' shared memory too: watched.
        let eps = std::mem::take(&mut self.eps);
        watched(&self.watched, CALL_CLOSE, None, || drop(eps));
    }
}

impl Transport for FabricTransport {
    type Session<'a> = FabricSession<'a>;

    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn begin<'a>(&'a mut self, tag_base: u64, bufs: Buffers<'a>) -> CResult<FabricSession<'a>> {
        if let Some(why) = &self.broken {
            return Err(CollectiveError::InvalidUsage(format!(
                "rank {}: this communicator can no longer be used: {why}; drop it and create \
                 a new one (HALO_TIMEOUT_MS sets the timeout)",
                self.rank
            )));
        }
        if self.routes.len() != self.size {
            return Err(CollectiveError::Internal(
                "fabric transport used before connect".into(),
            ));
        }
        self.block = bufs.block;
        let raw = RawBuffers::new(bufs);
        let mut session = FabricSession {
            t: self,
            bufs: raw,
            tag_base,
            mrs: Vec::new(),
            descs: [[ptr::null_mut(); 3]; 2],
            ready: Vec::new(),
            error: None,
            mismatch: false,
            last_watch: Instant::now(),
        };
        session.register()?;
        Ok(session)
    }
}

/// One collective's operations on the fabric transport.
pub(crate) struct FabricSession<'a> {
    t: &'a mut FabricTransport,
    bufs: RawBuffers<'a>,
    tag_base: u64,
    mrs: Vec<*mut fi::fid_mr>,
    /// Memory descriptors per endpoint slot per buffer (send, recv, scratch).
    descs: [[*mut c_void; 3]; 2],
    ready: Vec<u32>,
    /// The first error this session returned (why the transport breaks on drop).
    error: Option<String>,
    /// Whether that error is a size mismatch with a peer (see [`FLUSH_SENDS`]).
    mismatch: bool,
    /// When the processes of the peers waited for were last looked at.
    last_watch: Instant,
}

impl std::fmt::Debug for FabricSession<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FabricSession")
            .field("rank", &self.t.rank)
            .field("in_flight", &self.t.in_flight())
            .field("deferred", &self.t.backlog.len())
            .finish_non_exhaustive()
    }
}

fn buf_index(b: Buf) -> usize {
    match b {
        Buf::Send => 0,
        Buf::Recv => 1,
        Buf::Scratch => 2,
    }
}

impl FabricSession<'_> {
    /// Registers the buffers with the endpoints that require it.
    fn register(&mut self) -> CResult<()> {
        for slot in [LOCAL, NET] {
            let Some(e) = self.t.eps[slot].as_ref() else {
                continue;
            };
            if !e.needs_registration() {
                continue;
            }
            for b in [Buf::Send, Buf::Recv, Buf::Scratch] {
                let (base, len) = self.bufs.base(b);
                if len == 0 {
                    continue;
                }
                let key = (slot * 3 + buf_index(b)) as u64 + 1;
                let (mr, desc) = e
                    .register(base, len, key)
                    .map_err(|err| CollectiveError::System(err.to_string()))?;
                self.mrs.push(mr);
                self.descs[slot][buf_index(b)] = desc;
            }
        }
        Ok(())
    }

    /// Keeps the first error (for the reason the transport breaks) and returns it.
    fn note<T>(&mut self, r: CResult<T>) -> CResult<T> {
        if let Err(e) = &r
            && self.error.is_none()
        {
            self.error = Some(e.to_string());
            self.mismatch = matches!(e, CollectiveError::Mismatch { .. });
        }
        r
    }

    /// After a size mismatch: lets this rank's sends that are still outstanding reach
    /// their receivers (for at most `limit`), so that a peer whose call differs receives
    /// this rank's view of the sizes and fails with the mismatch itself, instead of
    /// waiting for a message that never comes. Deferred receives are dropped; no new
    /// one is posted.
    fn flush_sends(&mut self, limit: Duration) {
        let deadline = Instant::now() + limit;
        self.t.backlog.retain(|d| d.is_send);
        let mut sink = Vec::new();
        while Instant::now() < deadline
            && (self.t.ctxs.iter().any(|c| c.in_use && c.is_send) || !self.t.backlog.is_empty())
        {
            // Errors (more mismatches, the peer's own failure) are expected here.
            let _ = self.t.poll(&mut sink);
            let _ = self.retry_deferred();
            sink.clear();
            std::thread::yield_now();
        }
    }

    fn full_tag(&self, tag: u64) -> CResult<u64> {
        if tag >> TAG_BITS != 0 {
            return Err(CollectiveError::Internal(format!(
                "tag {tag:#x} wider than {TAG_BITS} bits"
            )));
        }
        Ok(self.tag_base | tag)
    }

    /// Posts an operation, or defers it when the provider refuses it for now (or
    /// when an earlier operation with the same peer is still deferred: per peer,
    /// operations reach the provider in posting order).
    fn post(
        &mut self,
        peer: usize,
        token: u32,
        is_send: bool,
        region: Region,
        tag: u64,
    ) -> CResult<()> {
        if peer >= self.t.size || peer == self.t.rank {
            return Err(CollectiveError::Internal(format!(
                "no route to rank {peer}"
            )));
        }
        let tag = self.full_tag(tag)?;
        let d = Deferred {
            peer,
            token,
            is_send,
            region,
            tag,
            since: Instant::now(),
        };
        if self.t.backlog.iter().any(|b| b.peer == peer) || !self.try_post(&d)? {
            self.t.backlog.push(d);
        }
        Ok(())
    }

    /// Hands one operation to the provider; `Ok(false)` when it refused with
    /// `-FI_EAGAIN`.
    fn try_post(&mut self, d: &Deferred) -> CResult<bool> {
        let route = self.t.routes[d.peer];
        let ptr_ = if d.is_send {
            self.bufs.locate(d.region)?.cast_mut()
        } else {
            self.bufs.locate_write(d.region)?
        };
        let desc = self.descs[route.ep as usize][buf_index(d.region.buf)];
        let Some(ep) = self.t.eps[route.ep as usize].as_ref().map(|e| e.ep) else {
            return Err(CollectiveError::Internal(format!(
                "no endpoint for rank {}",
                d.peer
            )));
        };
        let ctx = self.t.take_ctx(d, route.ep);
        let data = self.t.eps[route.ep as usize]
            .as_ref()
            .map_or(0, |e| e.block_data(self.t.block));
        let call = if d.is_send { CALL_TSEND } else { CALL_TRECV };
        // SAFETY: `ptr_ .. + region.len` lies in a buffer this session borrows until it
        // is dropped, and the drop cancels every operation and, if any is not back,
        // closes the endpoints first; the context is a live boxed OpCtx whose first
        // field is the fi_context2 the provider may use; `desc` is NULL or the
        // descriptor of that buffer's registration on this endpoint.
        let ret = watched(&self.t.watched, call, Some(d.peer), || unsafe {
            if d.is_send && data != 0 {
                fi::fi_tsenddata(
                    ep,
                    ptr_.cast_const().cast(),
                    d.region.len,
                    desc,
                    data,
                    route.addr,
                    d.tag,
                    ctx.cast(),
                )
            } else if d.is_send {
                fi::fi_tsend(
                    ep,
                    ptr_.cast_const().cast(),
                    d.region.len,
                    desc,
                    route.addr,
                    d.tag,
                    ctx.cast(),
                )
            } else {
                fi::fi_trecv(
                    ep,
                    ptr_.cast(),
                    d.region.len,
                    desc,
                    route.addr,
                    d.tag,
                    0,
                    ctx.cast(),
                )
            }
        });
        if ret == 0 {
            if d.is_send {
                self.t.ring(d.peer);
            }
            return Ok(true);
        }
        self.t.release(ctx);
        if ret == EAGAIN {
            return Ok(false);
        }
        Err(CollectiveError::System(format!(
            "{} rank {} over {}: {}",
            if d.is_send {
                "fi_tsend to"
            } else {
                "fi_trecv from"
            },
            d.peer,
            self.t.provider_name(route.ep),
            fi::strerror(ret as i64)
        )))
    }

    /// Retries the deferred posts in order, skipping the later ones of a peer whose
    /// earlier one is refused again.
    fn retry_deferred(&mut self) -> CResult<()> {
        if self.t.backlog.is_empty() {
            return Ok(());
        }
        let mut blocked = std::mem::take(&mut self.t.peers);
        blocked.clear();
        let mut out = Ok(());
        let mut i = 0;
        while i < self.t.backlog.len() {
            let d = self.t.backlog[i];
            if blocked.contains(&d.peer) {
                i += 1;
                continue;
            }
            match self.try_post(&d) {
                Ok(true) => {
                    self.t.backlog.remove(i);
                }
                Ok(false) => {
                    if d.since.elapsed() > self.t.post_timeout {
                        out = Err(CollectiveError::Remote {
                            peer: d.peer,
                            message: format!(
                                "rank {} has not accepted a message over {} for {:?} (it does \
                                 not read its completion queue: busy outside HALO, or hung)",
                                d.peer,
                                self.t.provider_name(self.t.routes[d.peer].ep),
                                self.t.post_timeout
                            ),
                        });
                        break;
                    }
                    blocked.push(d.peer);
                    i += 1;
                }
                Err(e) => {
                    out = Err(e);
                    break;
                }
            }
        }
        self.t.peers = blocked;
        out
    }

    /// Every `WATCH_EVERY` while waiting: fails with `Remote` when the process of a
    /// same-host peer that an outstanding operation needs has ended, after reading
    /// what it may have sent before.
    fn watch_peers(&mut self) -> CResult<()> {
        if self.last_watch.elapsed() < WATCH_EVERY || self.t.watch.iter().all(Option::is_none) {
            return Ok(());
        }
        self.last_watch = Instant::now();
        self.t.collect_peers();
        let ended = self
            .t
            .peers
            .iter()
            .find_map(|&p| self.t.watch[p].filter(|&w| has_ended(w)).map(|w| (p, w)));
        let Some((peer, proc_)) = ended else {
            return Ok(());
        };
        // Its last messages may still be on the way in: read completions for a moment.
        let until = Instant::now() + LAST_WORDS;
        while Instant::now() < until && self.t.waits_for(peer) {
            let mut done = std::mem::take(&mut self.ready);
            let r = self.t.poll(&mut done).and_then(|()| self.retry_deferred());
            self.ready = done;
            r?;
            std::thread::yield_now();
        }
        if !self.t.waits_for(peer) {
            // It did all this collective needs from it; another peer may still fail.
            self.t.watch[peer] = None;
            return Ok(());
        }
        Err(CollectiveError::Remote {
            peer,
            message: format!(
                "rank {peer} (process {} on this host) ended while rank {} was waiting for it",
                proc_.pid, self.t.rank
            ),
        })
    }
}

impl FabricSession<'_> {
    /// `block`: yields while the bound is short, then sleeps on this rank's bell while
    /// it waits only for same-host peers that have one (bounded as `sleep`: a ring
    /// only ends the sleep early), on the completion queues' descriptors otherwise.
    fn block(&mut self, max: Duration) -> CResult<()> {
        if max < YIELD_BELOW {
            std::thread::yield_now();
            return Ok(());
        }
        let bells = &self.t.bells;
        let belled = !bells.is_empty()
            && self.t.backlog.is_empty()
            && self.t.ctxs.iter().any(|c| c.in_use)
            && self
                .t
                .ctxs
                .iter()
                .filter(|c| c.in_use)
                .all(|c| bells.get(c.peer as usize).is_some_and(Option::is_some));
        if belled && let Some(bell) = self.t.bell.take() {
            // Bounded as `sleep`: shm protocol steps that complete nothing (segmented
            // copies without CMA) ring no bell.
            let r = bell.sleep(max.min(SLEEP_MAX), || {
                let mut done = std::mem::take(&mut self.ready);
                let r = self.t.poll(&mut done);
                let any = !done.is_empty();
                self.ready = done;
                r.map(|()| any)
            });
            self.t.bell = Some(bell);
            return self.note(r);
        }
        self.t.block_fd(max);
        Ok(())
    }
}

impl Session for FabricSession<'_> {
    fn post_send(&mut self, peer: usize, tag: u64, region: Region, token: u32) -> CResult<()> {
        let r = self.post(peer, token, true, region, tag);
        self.note(r)
    }

    fn post_recv(&mut self, peer: usize, tag: u64, region: Region, token: u32) -> CResult<()> {
        let r = self.post(peer, token, false, region, tag);
        self.note(r)
    }

    fn copy(&mut self, src: Region, dst: Region) -> CResult<()> {
        self.bufs.copy(src, dst)
    }

    fn progress(&mut self, completed: &mut Vec<u32>) -> CResult<()> {
        completed.append(&mut self.ready);
        let r = self.t.poll(completed).and_then(|()| self.retry_deferred());
        self.note(r)
    }

    fn test(&mut self, token: u32) -> CResult<bool> {
        let mut done = std::mem::take(&mut self.ready);
        let r = self.t.poll(&mut done).and_then(|()| self.retry_deferred());
        self.ready = done;
        self.note(r)?;
        if let Some(i) = self.ready.iter().position(|&t| t == token) {
            self.ready.swap_remove(i);
            return Ok(true);
        }
        Ok(!self.t.ctxs.iter().any(|c| c.in_use && c.token == token)
            && !self.t.backlog.iter().any(|d| d.token == token))
    }

    fn cancel(&mut self, token: u32) -> CResult<()> {
        self.t.backlog.retain(|d| d.token != token);
        for i in 0..self.t.ctxs.len() {
            if self.t.ctxs[i].in_use && self.t.ctxs[i].token == token {
                self.t.cancel_ctx(i);
            }
        }
        Ok(())
    }

    fn wait(&mut self, max: Duration) -> CResult<()> {
        if !self.ready.is_empty() {
            return Ok(());
        }
        let r = self.watch_peers();
        self.note(r)?;
        match self.t.progress {
            FabricProgress::Spin => std::hint::spin_loop(),
            FabricProgress::Yield => std::thread::yield_now(),
            FabricProgress::Sleep if max < YIELD_BELOW => std::thread::yield_now(),
            FabricProgress::Sleep => std::thread::sleep(max.min(SLEEP_MAX)),
            FabricProgress::Block => return self.block(max),
        }
        Ok(())
    }
}

impl Drop for FabricSession<'_> {
    fn drop(&mut self) {
        // Operations still outstanding mean the collective did not complete (the
        // engine returns success only when every step has): the transport breaks.
        let failed = self.t.in_flight() > 0 || !self.t.backlog.is_empty() || self.error.is_some();
        let mut why = String::new();
        if failed {
            self.t.collect_peers();
            let (posted, deferred) = (self.t.in_flight(), self.t.backlog.len());
            why = match &self.error {
                Some(e) => format!("a collective failed on this rank ({e})"),
                None => format!(
                    "a collective did not complete on this rank (timed out or aborted with \
                     {} operations outstanding, with ranks {:?})",
                    posted + deferred,
                    self.t.peers
                ),
            };
            if self.mismatch {
                self.flush_sends(FLUSH_SENDS);
            }
            let left = self.t.cancel_all(CANCEL_DRAIN);
            tracing::warn!(
                rank = self.t.rank,
                left,
                "{why}; closing the fabric endpoints"
            );
        }
        // Registrations go before the endpoints they may be bound to.
        for mr in self.mrs.drain(..) {
            close(mr.cast(), "memory registration");
        }
        if failed {
            // Closing the endpoints guarantees that the provider no longer touches the
            // caller's buffers, whatever it still held.
            self.t.break_down(why);
        }
    }
}

/// This host's name, as the kernel has it (per UTS namespace, so emulated hosts differ).
pub(crate) fn local_hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".into())
}

/// The local IP the kernel would use to reach `root` (a UDP "connect" sends nothing).
pub(crate) fn route_to(root: std::net::SocketAddr) -> Result<std::net::IpAddr> {
    let any: std::net::SocketAddr = if root.is_ipv4() {
        "0.0.0.0:0"
    } else {
        "[::]:0"
    }
    .parse()
    .expect("literal address");
    let s = std::net::UdpSocket::bind(any).map_err(|e| Error::SystemError {
        message: format!("cannot open a UDP socket to find the local address: {e}"),
    })?;
    s.connect(root).map_err(|e| Error::SystemError {
        message: format!("no route to the bootstrap root {root}: {e}"),
    })?;
    Ok(s.local_addr()
        .map_err(|e| Error::SystemError {
            message: format!("local address: {e}"),
        })?
        .ip())
}

/// The uniform block size carried as remote completion data (see
/// [`Endpoint::block_data`]); `None` for 0 (none carried). Exact when the provider
/// carries 8 bytes; with fewer only used for comparison, where it may read smaller.
fn block_of(data: u64) -> Option<usize> {
    data.checked_sub(1).map(|b| b as usize)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok())
        .collect()
}

/// What one rank publishes at bootstrap.
#[derive(Debug, Clone, PartialEq)]
struct Card {
    host: String,
    topology: String,
    names: [Option<Vec<u8>>; 2],
    /// Its process, for peers on the same host: PID namespace and process.
    process: Option<(String, Proc)>,
    /// Its doorbell file, for peers on the same host (`block`).
    bell: Option<String>,
}

impl Card {
    fn encode(&self) -> Vec<u8> {
        let mut v = serde_json::json!({
            "host": self.host,
            "topology": self.topology,
            "local": self.names[LOCAL].as_deref().map(hex),
            "net": self.names[NET].as_deref().map(hex),
        });
        if let Some(b) = &self.bell {
            v["bell"] = b.as_str().into();
        }
        if let Some((ns, p)) = &self.process {
            v["pidns"] = ns.as_str().into();
            v["pid"] = p.pid.into();
            v["start"] = p.start.into();
        }
        v.to_string().into_bytes()
    }

    /// Reads and checks rank `rank`'s card: every field has its type, a bounded size
    /// and a well-formed value (the addresses are checked against the provider when
    /// they are inserted, [`Endpoint::check_name`]). Errors name the rank and the field.
    fn decode(rank: usize, bytes: &[u8]) -> Result<Card> {
        let bad = |field: &str, why: &str| Error::InvalidUsage {
            peer: Some(rank),
            message: format!("rank {rank}'s bootstrap card: field `{field}` {why}"),
        };
        let v: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|e| Error::InvalidUsage {
                peer: Some(rank),
                message: format!("rank {rank}'s bootstrap card is not a HALO card ({e})"),
            })?;
        let text = |k: &str, max: usize| -> Result<Option<String>> {
            match v.get(k) {
                None | Some(serde_json::Value::Null) => Ok(None),
                Some(serde_json::Value::String(s)) if s.is_empty() => Err(bad(k, "is empty")),
                Some(serde_json::Value::String(s)) if s.len() > max => {
                    Err(bad(k, &format!("is {} bytes, more than {max}", s.len())))
                }
                Some(serde_json::Value::String(s)) if s.chars().any(char::is_control) => {
                    Err(bad(k, "holds control characters"))
                }
                Some(serde_json::Value::String(s)) => Ok(Some(s.clone())),
                Some(_) => Err(bad(k, "is not a string")),
            }
        };
        let name = |k: &str| -> Result<Option<Vec<u8>>> {
            match text(k, 2 * MAX_NAME)? {
                None => Ok(None),
                Some(s) => unhex(&s)
                    .map(Some)
                    .ok_or_else(|| bad(k, "is not an address in hexadecimal")),
            }
        };
        let host = text("host", HOST_MAX)?.ok_or_else(|| bad("host", "is missing"))?;
        let topology = match v.get("topology") {
            Some(serde_json::Value::String(s)) if s.is_empty() => String::new(),
            _ => text("topology", TOPOLOGY_MAX)?.ok_or_else(|| bad("topology", "is missing"))?,
        };
        let names = [name("local")?, name("net")?];
        let pid = match v.get("pid") {
            None | Some(serde_json::Value::Null) => None,
            Some(p) => Some(
                p.as_u64()
                    .filter(|&p| (1..=PID_MAX).contains(&p))
                    .ok_or_else(|| bad("pid", &format!("is not a process id (1..={PID_MAX})")))?
                    as u32,
            ),
        };
        let start = match v.get("start") {
            None | Some(serde_json::Value::Null) => None,
            Some(s) => Some(
                s.as_u64()
                    .ok_or_else(|| bad("start", "is not a start time"))?,
            ),
        };
        let pidns = text("pidns", 64)?;
        if let Some(ns) = &pidns
            && !(ns.starts_with("pid:[") && ns.ends_with(']'))
        {
            return Err(bad("pidns", "is not a PID namespace (pid:[N])"));
        }
        let process = match (pidns, pid, start) {
            (Some(ns), Some(pid), Some(start)) => Some((ns, Proc { pid, start })),
            (None, None, None) => None,
            _ => {
                return Err(bad(
                    "pid",
                    "comes without its pidns and start, or they without it",
                ));
            }
        };
        let bell = text("bell", 255)?;
        if let Some(b) = &bell {
            let ok = b.strip_prefix("/dev/shm/halo-bell-").is_some_and(|rest| {
                !rest.is_empty() && rest.bytes().all(|c| c.is_ascii_digit() || c == b'-')
            });
            if !ok {
                return Err(bad(
                    "bell",
                    "is not a HALO doorbell file (/dev/shm/halo-bell-N-N-N)",
                ));
            }
        }
        Ok(Card {
            host,
            topology,
            names,
            process,
            bell,
        })
    }
}

/// Decodes `bytes` as rank `rank`'s bootstrap card (with every check a real card gets)
/// and returns the accepted card encoded again. Only for the fuzz target
/// `fuzz/fuzz_targets/card.rs`, which feeds it hostile bytes and checks that the
/// re-encoded card decodes to itself; not part of the API.
#[doc(hidden)]
pub fn decode_card_for_fuzzing(rank: usize, bytes: &[u8]) -> Result<Vec<u8>> {
    Card::decode(rank, bytes).map(|card| card.encode())
}

/// Longest host name in a card (Linux allows 64; DNS names 253).
const HOST_MAX: usize = 255;
/// Longest topology spec in a card (a preset or a file path).
const TOPOLOGY_MAX: usize = 4096;
/// Largest process id Linux hands out (`pid_max` at most 2^22).
const PID_MAX: u64 = 1 << 22;

/// The global topology of a fabric job: `spec` (a preset or a file, from
/// `HALO_TOPOLOGY`) when given, else one node per distinct host name, in order of
/// first appearance, with the commodity link classes.
pub(crate) fn job_topology(hosts: &[String], spec: &str) -> Result<halo_topology::Topology> {
    use halo_topology::{Topology, TopologySpec, commodity, spec::RankSpec};
    let n = hosts.len();
    if !spec.is_empty() {
        let t = if std::path::Path::new(spec).exists() {
            Topology::load(spec)?
        } else {
            Topology::preset(spec)?
        };
        if t.size() != n {
            return Err(Error::invalid_argument(format!(
                "HALO_TOPOLOGY={spec} describes {} ranks, but the job has {n}",
                t.size()
            )));
        }
        return Ok(t);
    }
    let mut order: Vec<&str> = Vec::new();
    let ranks = (0..n)
        .map(|r| {
            let node = match order.iter().position(|h| *h == hosts[r]) {
                Some(i) => i,
                None => {
                    order.push(&hosts[r]);
                    order.len() - 1
                }
            };
            RankSpec {
                rank: r as i64,
                host: Some(hosts[r].clone()),
                domains: [("node".to_string(), node as i64)].into_iter().collect(),
            }
        })
        .collect();
    let spec = TopologySpec {
        name: format!("{} ranks on {} hosts", n, order.len()),
        links: [
            ("device".to_string(), commodity::DEVICE),
            ("node".to_string(), commodity::NODE),
            ("system".to_string(), commodity::SYSTEM),
        ]
        .into_iter()
        .collect(),
        ranks,
        nics: Vec::new(),
    };
    Ok(spec.build()?)
}

/// Brings up the fabric transport of one rank: opens the endpoints, publishes this
/// rank's card through `join` (the bootstrap exchange), checks that every rank uses
/// the same topology, builds it and connects every peer.
pub(crate) fn establish(
    rank: usize,
    size: usize,
    root: Option<std::net::SocketAddr>,
    config: &FabricConfig,
    topology_spec: &str,
    join: impl FnOnce(&[u8]) -> Result<Vec<Vec<u8>>>,
) -> Result<(FabricTransport, halo_topology::Topology)> {
    // The network provider binds the address that reaches the bootstrap root (or,
    // without a root, the one that reaches HALO_BOOTSTRAP_ADDR, else the one bootstrap
    // would choose: HALO_SOCKET_IFNAME, else the first non-loopback interface).
    let ip = match (config.addr, root) {
        (Some(a), _) => a,
        _ if size == 1 => std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
        (None, Some(root)) => route_to(root)?,
        // Bootstrapped another way (MPI): HALO_BOOTSTRAP_ADDR, where a launcher set it,
        // is the job's root on another host for most ranks — bind what reaches it.
        (None, None) => match std::env::var("HALO_BOOTSTRAP_ADDR")
            .ok()
            .and_then(|v| crate::bootstrap::parse_host_port(&v, 1).ok())
        {
            Some(root) => route_to(root)?,
            None => crate::bootstrap::default_bootstrap_ip()?,
        },
    };
    let (mut transport, names) = FabricTransport::open(rank, size, config, &ip.to_string())?;
    let card = Card {
        host: local_hostname(),
        topology: topology_spec.to_string(),
        names,
        process: this_process(),
        bell: transport.bell.as_ref().and_then(Bell::path),
    };
    let cards: Vec<Card> = join(&card.encode())?
        .iter()
        .enumerate()
        .map(|(r, b)| Card::decode(r, b))
        .collect::<Result<_>>()?;
    // Every rank must describe the machine the same way.
    let differing: Vec<usize> = (0..size)
        .filter(|&r| cards[r].topology != cards[0].topology)
        .collect();
    if !differing.is_empty() {
        return Err(Error::InvalidUsage {
            peer: differing.first().copied(),
            message: format!(
                "ranks disagree on the topology: rank 0 uses {:?} but ranks {differing:?} use {:?}",
                cards[0].topology, cards[differing[0]].topology
            ),
        });
    }
    let hosts: Vec<String> = cards.iter().map(|c| c.host.clone()).collect();
    let topology = job_topology(&hosts, topology_spec)?;
    // Same host name and PID namespace: this rank can see the peer's process end.
    if let Some((ns, _)) = &cards[rank].process {
        for (p, c) in cards.iter().enumerate() {
            if p != rank
                && c.host == cards[rank].host
                && let Some((pns, proc_)) = &c.process
                && pns == ns
            {
                transport.watch[p] = Some(*proc_);
            }
        }
    }
    if let Some(w) = &transport.watched {
        *w.procs.lock().unwrap_or_else(|p| p.into_inner()) = transport
            .watch
            .iter()
            .enumerate()
            .filter_map(|(r, p)| p.map(|p| (r, p)))
            .collect();
    }
    let names: Vec<[Option<Vec<u8>>; 2]> = cards.iter().map(|c| c.names.clone()).collect();
    transport.connect(&hosts, &names)?;
    // The bells of the peers reached over shared memory.
    if transport.bell.is_some() {
        transport.bells = (0..size)
            .map(|p| {
                let local = p != rank && transport.routes[p].ep == LOCAL as u8;
                cards[p]
                    .bell
                    .as_deref()
                    .filter(|_| local)
                    .and_then(Bell::open)
            })
            .collect();
    }
    Ok((transport, topology))
}
