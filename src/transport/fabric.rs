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
//! growing bound (1 us up to 1 ms). What the wait does is [`Progress`]: `sleep` (the
//! default: yield below 50 us, else sleep up to 200 us), `yield` (always
//! `sched_yield`), `spin` (return at once) or `block` (sleep on the completion
//! queue's file descriptor where the provider has one: `tcp;ofi_rxm` does, `shm` in
//! libfabric 1.17 does not, and there `block` sleeps as `sleep` does). Measured in
//! docs/BENCHMARKS.md, "Progress under oversubscription (fabric transport)".
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
//!
//! When the provider is `cxi`, HPE's recommended settings for collective libraries are
//! applied unless the user set them (REFERENCE.md §2): `FI_MR_CACHE_MONITOR=userfaultfd`,
//! `FI_CXI_DEFAULT_CQ_SIZE=131072`, `FI_CXI_DEFAULT_TX_SIZE=2048`,
//! `FI_CXI_RDZV_PROTO=alt_read`, `FI_CXI_RX_MATCH_MODE=hybrid`.

use super::raw::RawBuffers;
use crate::error::{Error, Result};
use halo_collectives::{Buf, Buffers, CollectiveError, Region, Session, TAG_BITS, Transport};
use halo_fabric_sys as fi;
use std::ffi::{CStr, CString, c_char, c_int, c_long, c_short, c_ulong, c_void};
use std::ptr;
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
    /// The completion queue's file descriptor, when it was opened with `FI_WAIT_FD`.
    wait_fd: Option<c_int>,
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
            wait_fd: None,
        };
        // On error `e` is dropped and closes what was opened.
        // SAFETY: info.0 is a valid entry that outlives this block; every out-pointer is
        // a field of `e`, written on success only; attribute structs are zeroed and filled.
        unsafe {
            let i = &*info.0;
            e.mr_mode = (*i.domain_attr).mr_mode;
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
                    format: fi::FI_CQ_FORMAT_CONTEXT,
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
                    format: fi::FI_CQ_FORMAT_CONTEXT,
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
            let mut name = vec![0u8; 1024];
            let mut len = name.len();
            check(
                fi::fi_getname(&mut (*e.ep).fid, name.as_mut_ptr().cast(), &mut len) as isize,
                "fi_getname",
            )?;
            name.truncate(len);
            e.name = name;
        }
        tracing::debug!(
            provider = %e.provider,
            mr_mode = e.mr_mode,
            wait_fd = ?e.wait_fd,
            "fabric endpoint open"
        );
        Ok(e)
    }

    /// Inserts addresses in order; returns their fabric addresses.
    fn insert(&mut self, names: &[&[u8]]) -> Result<Vec<fi::fi_addr_t>> {
        let mut out = Vec::with_capacity(names.len());
        for n in names {
            let mut addr: fi::fi_addr_t = fi::FI_ADDR_NOTAVAIL;
            // SAFETY: av is open; `n` holds one address as produced by fi_getname on a
            // peer endpoint of the same provider; `addr` has room for one result.
            let ret = unsafe {
                fi::fi_av_insert(self.av, n.as_ptr().cast(), 1, &mut addr, 0, ptr::null_mut())
            };
            if ret != 1 {
                return Err(fi_err(
                    &format!("fi_av_insert ({})", self.provider),
                    ret as isize,
                ));
            }
            out.push(addr);
        }
        Ok(out)
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
    if !f.is_null() {
        // SAFETY: `f` is an open libfabric object owned by the caller, closed once.
        let ret = unsafe { fi::fi_close(f) };
        if ret != 0 {
            tracing::warn!("fi_close({what}): {}", fi::strerror(i64::from(ret)));
        }
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        // The endpoint first, then what it is bound to. Every libfabric object starts
        // with its `struct fid`, so the casts give the fid.
        let p = &self.provider;
        close(self.ep.cast(), &format!("{p} endpoint"));
        close(self.av.cast(), &format!("{p} address vector"));
        close(self.cq.cast(), &format!("{p} completion queue"));
        close(self.domain.cast(), &format!("{p} domain"));
        close(self.fabric.cast(), &format!("{p} fabric"));
    }
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

/// The libfabric transport of one rank.
pub(crate) struct FabricTransport {
    rank: usize,
    size: usize,
    eps: [Option<Endpoint>; 2],
    routes: Vec<Route>,
    // Boxed: the provider holds pointers to these contexts, which must not move when
    // the pool grows.
    #[allow(clippy::vec_box)]
    ctxs: Vec<Box<OpCtx>>,
    free: Vec<u32>,
    broken: Option<String>,
    post_timeout: Duration,
}

// SAFETY: the raw pointers inside are libfabric objects opened with FI_THREAD_DOMAIN
// and operation contexts the provider writes only while this transport progresses
// them; the transport is owned and used by one thread at a time (the communicator is
// Send, not Sync), which that threading model allows.
unsafe impl Send for FabricTransport {}

impl std::fmt::Debug for FabricTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FabricTransport")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("providers", &self.providers())
            .field("broken", &self.broken)
            .finish_non_exhaustive()
    }
}

/// Provider choice for a job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FabricConfig {
    /// Provider for peers on the same host (`shm`); `None` sends everything over the network provider.
    pub local_provider: Option<String>,
    /// Provider for peers on other hosts (`tcp;ofi_rxm`; `cxi` on Slingshot).
    pub net_provider: String,
    /// Local IP the network provider binds (default: the address that routes to the bootstrap root).
    pub addr: Option<std::net::IpAddr>,
    /// How long posting one operation may be refused with -FI_EAGAIN before failing.
    pub post_timeout: Duration,
}

impl Default for FabricConfig {
    fn default() -> Self {
        FabricConfig {
            local_provider: Some("shm".into()),
            net_provider: "tcp;ofi_rxm".into(),
            addr: None,
            post_timeout: Duration::from_secs(60),
        }
    }
}

impl FabricConfig {
    /// The default, changed by `HALO_FABRIC_PROVIDER` (one provider for every peer,
    /// e.g. `tcp;ofi_rxm` or `shm`), `HALO_FABRIC_NET_PROVIDER` (the network provider
    /// only) and `HALO_FABRIC_ADDR` (the IP the network provider binds).
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
        let local = match &config.local_provider {
            Some(p) if size > 1 => Some(Endpoint::open(p, None)?),
            _ => None,
        };
        let node = (!config.net_provider.starts_with("shm")).then_some(net_node);
        let net = Endpoint::open(&config.net_provider, node)?;
        let names = [
            local.as_ref().map(|e| e.name.clone()),
            Some(net.name.clone()),
        ];
        let t = FabricTransport {
            rank,
            size,
            eps: [local, Some(net)],
            routes: Vec::new(),
            ctxs: Vec::new(),
            free: Vec::new(),
            broken: None,
            post_timeout: config.post_timeout,
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
            let list: Vec<&[u8]> = local
                .iter()
                .map(|&p| names[p][LOCAL].as_deref().expect("filtered"))
                .collect();
            let addrs = self.eps[LOCAL].as_mut().expect("checked").insert(&list)?;
            for (p, a) in local.into_iter().zip(addrs) {
                routes[p] = Route {
                    ep: LOCAL as u8,
                    addr: a,
                };
            }
        }
        // Everyone else over the network provider; all ranks are inserted in rank order
        // so that the fabric address is the rank.
        let list: Vec<&[u8]> = (0..n)
            .map(|p| {
                names[p][NET].as_deref().ok_or_else(|| {
                    Error::internal(format!("rank {p} published no network endpoint"))
                })
            })
            .collect::<Result<_>>()?;
        let addrs = self.eps[NET].as_mut().expect("always open").insert(&list)?;
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
            "fabric transport connected"
        );
        Ok(())
    }

    /// The providers in use: (local, network).
    pub(crate) fn providers(&self) -> (Option<&str>, Option<&str>) {
        (
            self.eps[LOCAL].as_ref().map(|e| e.provider.as_str()),
            self.eps[NET].as_ref().map(|e| e.provider.as_str()),
        )
    }

    /// The provider that carries messages to `peer`.
    pub(crate) fn provider_to(&self, peer: usize) -> Option<&str> {
        let r = self.routes.get(peer)?;
        self.eps[r.ep as usize]
            .as_ref()
            .map(|e| e.provider.as_str())
    }

    /// A context for a new operation.
    fn take_ctx(&mut self, token: u32, peer: usize, ep: u8, is_send: bool) -> *mut OpCtx {
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
        &mut **c as *mut OpCtx
    }

    fn in_flight(&self) -> usize {
        self.ctxs.len() - self.free.len()
    }

    /// Reads every endpoint's completion queue once; completed tokens go to `done`.
    fn poll(&mut self, done: &mut Vec<u32>) -> CResult<()> {
        for slot in [LOCAL, NET] {
            while let Some(e) = self.eps[slot].as_ref() {
                let (cq, provider) = (e.cq, e.provider.clone());
                let mut entries = [fi::fi_cq_entry {
                    op_context: ptr::null_mut(),
                }; 32];
                // SAFETY: the CQ is open with FI_CQ_FORMAT_CONTEXT, so each entry is an
                // fi_cq_entry; the array has room for the count passed.
                let ret = unsafe { fi::fi_cq_read(cq, entries.as_mut_ptr().cast(), entries.len()) };
                if ret > 0 {
                    for en in &entries[..ret as usize] {
                        self.complete(en.op_context, done);
                    }
                    if (ret as usize) < entries.len() {
                        break;
                    }
                } else if ret == EAGAIN {
                    break;
                } else if ret == EAVAIL {
                    let mut err = fi::fi_cq_err_entry::default();
                    // SAFETY: the CQ is open; `err` is a zeroed entry the provider fills.
                    let r = unsafe { fi::fi_cq_readerr(cq, &mut err, 0) };
                    if r == EAGAIN {
                        break;
                    }
                    if r < 0 {
                        return Err(CollectiveError::System(format!(
                            "fi_cq_readerr: {}",
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
                    let (peer, is_send, token) =
                        unsafe { ((*ctx).peer, (*ctx).is_send, (*ctx).token) };
                    self.release(ctx);
                    if err.err == fi::FI_ECANCELED {
                        continue;
                    }
                    let what = if is_send { "send to" } else { "receive from" };
                    let msg = format!(
                        "{what} rank {peer} failed on {provider}: {} (step {token})",
                        fi::strerror(i64::from(err.err))
                    );
                    return Err(CollectiveError::Remote {
                        peer: peer as usize,
                        message: msg,
                    });
                } else {
                    return Err(CollectiveError::System(format!(
                        "fi_cq_read: {}",
                        fi::strerror(ret as i64)
                    )));
                }
            }
        }
        Ok(())
    }

    fn complete(&mut self, ctx: *mut c_void, done: &mut Vec<u32>) {
        let ctx = ctx.cast::<OpCtx>();
        if ctx.is_null() {
            return;
        }
        // SAFETY: the context is one of ours (see `poll`).
        let token = unsafe { (*ctx).token };
        self.release(ctx);
        done.push(token);
    }

    fn release(&mut self, ctx: *mut OpCtx) {
        // SAFETY: the context is one of ours (see `poll`), alive in `self.ctxs`.
        let c = unsafe { &mut *ctx };
        if c.in_use {
            c.in_use = false;
            self.free.push(c.index);
        }
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
            return Err(CollectiveError::System(format!(
                "the fabric transport is unusable: {why}"
            )));
        }
        if self.routes.len() != self.size {
            return Err(CollectiveError::Internal(
                "fabric transport used before connect".into(),
            ));
        }
        let raw = RawBuffers::new(bufs);
        let mut session = FabricSession {
            t: self,
            bufs: raw,
            tag_base,
            mrs: Vec::new(),
            descs: [[ptr::null_mut(); 3]; 2],
            ready: Vec::new(),
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
}

impl std::fmt::Debug for FabricSession<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FabricSession")
            .field("rank", &self.t.rank)
            .field("in_flight", &self.t.in_flight())
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

    fn full_tag(&self, tag: u64) -> CResult<u64> {
        if tag >> TAG_BITS != 0 {
            return Err(CollectiveError::Internal(format!(
                "tag {tag:#x} wider than {TAG_BITS} bits"
            )));
        }
        Ok(self.tag_base | tag)
    }

    fn route(&self, peer: usize) -> CResult<Route> {
        if peer >= self.t.size || peer == self.t.rank {
            return Err(CollectiveError::Internal(format!(
                "no route to rank {peer}"
            )));
        }
        Ok(self.t.routes[peer])
    }

    /// Posts with `-FI_EAGAIN` retried while progressing, within the post timeout.
    fn post(
        &mut self,
        peer: usize,
        token: u32,
        is_send: bool,
        region: Region,
        tag: u64,
    ) -> CResult<()> {
        let route = self.route(peer)?;
        let tag = self.full_tag(tag)?;
        let ptr_ = if is_send {
            self.bufs.locate(region)?.cast_mut()
        } else {
            self.bufs.locate_write(region)?
        };
        let desc = self.descs[route.ep as usize][buf_index(region.buf)];
        let ctx = self.t.take_ctx(token, peer, route.ep, is_send);
        let ep = self.t.eps[route.ep as usize]
            .as_ref()
            .expect("routed endpoint is open")
            .ep;
        let start = Instant::now();
        loop {
            // SAFETY: `ptr_ .. + region.len` lies in a buffer this session borrows until
            // it is dropped, and the drop cancels and drains every operation first; the
            // context is a live boxed OpCtx whose first field is the fi_context2 the
            // provider may use; `desc` is NULL or the descriptor of that buffer's
            // registration on this endpoint.
            let ret = unsafe {
                if is_send {
                    fi::fi_tsend(
                        ep,
                        ptr_.cast_const().cast(),
                        region.len,
                        desc,
                        route.addr,
                        tag,
                        ctx.cast(),
                    )
                } else {
                    fi::fi_trecv(
                        ep,
                        ptr_.cast(),
                        region.len,
                        desc,
                        route.addr,
                        tag,
                        0,
                        ctx.cast(),
                    )
                }
            };
            if ret == 0 {
                return Ok(());
            }
            if ret != EAGAIN {
                self.t.release(ctx);
                let what = if is_send {
                    "fi_tsend to"
                } else {
                    "fi_trecv from"
                };
                return Err(CollectiveError::System(format!(
                    "{what} rank {peer}: {}",
                    fi::strerror(ret as i64)
                )));
            }
            let mut done = std::mem::take(&mut self.ready);
            let polled = self.t.poll(&mut done);
            self.ready = done;
            if let Err(e) = polled {
                self.t.release(ctx);
                return Err(e);
            }
            if start.elapsed() > self.t.post_timeout {
                self.t.release(ctx);
                return Err(CollectiveError::System(format!(
                    "rank {peer} did not accept a message for {:?} (provider busy)",
                    self.t.post_timeout
                )));
            }
            std::thread::yield_now();
        }
    }
}

impl Session for FabricSession<'_> {
    fn post_send(&mut self, peer: usize, tag: u64, region: Region, token: u32) -> CResult<()> {
        self.post(peer, token, true, region, tag)
    }

    fn post_recv(&mut self, peer: usize, tag: u64, region: Region, token: u32) -> CResult<()> {
        self.post(peer, token, false, region, tag)
    }

    fn copy(&mut self, src: Region, dst: Region) -> CResult<()> {
        self.bufs.copy(src, dst)
    }

    fn progress(&mut self, completed: &mut Vec<u32>) -> CResult<()> {
        completed.append(&mut self.ready);
        self.t.poll(completed)
    }

    fn test(&mut self, token: u32) -> CResult<bool> {
        let mut done = std::mem::take(&mut self.ready);
        let r = self.t.poll(&mut done);
        self.ready = done;
        r?;
        if let Some(i) = self.ready.iter().position(|&t| t == token) {
            self.ready.swap_remove(i);
            return Ok(true);
        }
        Ok(!self.t.ctxs.iter().any(|c| c.in_use && c.token == token))
    }

    fn cancel(&mut self, token: u32) -> CResult<()> {
        for c in self
            .t
            .ctxs
            .iter_mut()
            .filter(|c| c.in_use && c.token == token)
        {
            if let Some(e) = self.t.eps[c.ep as usize].as_ref() {
                // SAFETY: the endpoint is open and the context was posted on it; cancel
                // only asks the provider to complete it with FI_ECANCELED.
                unsafe { fi::fi_cancel(&mut (*e.ep).fid, (&mut **c as *mut OpCtx).cast()) };
            }
        }
        Ok(())
    }

    fn wait(&mut self, max: Duration) -> CResult<()> {
        if max < Duration::from_micros(50) {
            std::thread::yield_now();
        } else {
            std::thread::sleep(max.min(Duration::from_micros(200)));
        }
        Ok(())
    }
}

impl Drop for FabricSession<'_> {
    fn drop(&mut self) {
        // Cancel what is still posted, then read completions until every context is
        // back. Only then may the caller's buffers go.
        if self.t.in_flight() > 0 {
            for i in 0..self.t.ctxs.len() {
                let c = &mut self.t.ctxs[i];
                if !c.in_use {
                    continue;
                }
                if let Some(e) = self.t.eps[c.ep as usize].as_ref() {
                    // SAFETY: as in `cancel`.
                    unsafe { fi::fi_cancel(&mut (*e.ep).fid, (&mut **c as *mut OpCtx).cast()) };
                }
            }
            let deadline = Instant::now() + Duration::from_secs(2);
            let mut sink = Vec::new();
            while self.t.in_flight() > 0 && Instant::now() < deadline {
                let _ = self.t.poll(&mut sink);
                sink.clear();
                std::thread::yield_now();
            }
            if self.t.in_flight() > 0 {
                // The provider still holds operations on the caller's buffers: close the
                // endpoints so nothing can touch them any more, and refuse further use.
                let why = format!("{} operations could not be cancelled", self.t.in_flight());
                tracing::error!(rank = self.t.rank, "{why}; closing the fabric endpoints");
                self.t.eps = [None, None];
                for c in &mut self.t.ctxs {
                    c.in_use = false;
                }
                self.t.free = (0..self.t.ctxs.len() as u32).collect();
                self.t.broken = Some(why);
            }
        }
        for mr in self.mrs.drain(..) {
            close(mr.cast());
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
}

impl Card {
    fn encode(&self) -> Vec<u8> {
        serde_json::json!({
            "host": self.host,
            "topology": self.topology,
            "local": self.names[LOCAL].as_deref().map(hex),
            "net": self.names[NET].as_deref().map(hex),
        })
        .to_string()
        .into_bytes()
    }

    fn decode(rank: usize, bytes: &[u8]) -> Result<Card> {
        let bad = || Error::internal(format!("rank {rank} published a malformed bootstrap card"));
        let v: serde_json::Value = serde_json::from_slice(bytes).map_err(|_| bad())?;
        let name = |k: &str| -> Result<Option<Vec<u8>>> {
            match v.get(k) {
                None | Some(serde_json::Value::Null) => Ok(None),
                Some(serde_json::Value::String(s)) => unhex(s).map(Some).ok_or_else(bad),
                Some(_) => Err(bad()),
            }
        };
        Ok(Card {
            host: v
                .get("host")
                .and_then(|h| h.as_str())
                .ok_or_else(bad)?
                .to_string(),
            topology: v
                .get("topology")
                .and_then(|h| h.as_str())
                .ok_or_else(bad)?
                .to_string(),
            names: [name("local")?, name("net")?],
        })
    }
}

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
    root: std::net::SocketAddr,
    config: &FabricConfig,
    topology_spec: &str,
    join: impl FnOnce(&[u8]) -> Result<Vec<Vec<u8>>>,
) -> Result<(FabricTransport, halo_topology::Topology)> {
    let ip = match config.addr {
        Some(a) => a,
        None if size == 1 => std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
        None => route_to(root)?,
    };
    let (mut transport, names) = FabricTransport::open(rank, size, config, &ip.to_string())?;
    let card = Card {
        host: local_hostname(),
        topology: topology_spec.to_string(),
        names,
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
    let names: Vec<[Option<Vec<u8>>; 2]> = cards.into_iter().map(|c| c.names).collect();
    transport.connect(&hosts, &names)?;
    Ok((transport, topology))
}
