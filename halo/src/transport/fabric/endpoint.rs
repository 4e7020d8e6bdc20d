//! One provider's endpoint: `fi_getinfo`, then the fabric, domain, completion queue,
//! address vector and RDM endpoint it opens; peer addresses checked and inserted;
//! memory registration; closing.

use super::signals::restore_crash_signals;
use super::{check, cstr};
use crate::error::{Error, Result};
use crate::transport::text::hex;
use halo_collectives::Call;
use halo_fabric_sys as fi;
use std::ffi::{CString, c_int, c_void};
use std::ptr;

/// HPE's recommended environment for collective libraries on `cxi`.
const CXI_DEFAULTS: [(&str, &str); 5] = [
    ("FI_MR_CACHE_MONITOR", "userfaultfd"),
    ("FI_CXI_DEFAULT_CQ_SIZE", "131072"),
    ("FI_CXI_DEFAULT_TX_SIZE", "2048"),
    ("FI_CXI_RDZV_PROTO", "alt_read"),
    ("FI_CXI_RX_MATCH_MODE", "hybrid"),
];

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
        (*h.fabric_attr).prov_name = libc::strdup(prov.as_ptr());
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

/// One provider's endpoint with its fabric, domain, completion queue and address vector.
#[derive(Debug)]
pub(super) struct FabricEndpoint {
    pub(super) provider: String,
    pub(super) fabric: *mut fi::fid_fabric,
    domain: *mut fi::fid_domain,
    pub(super) cq: *mut fi::fid_cq,
    av: *mut fi::fid_av,
    pub(super) ep: *mut fi::fid_ep,
    mr_mode: i32,
    /// This endpoint's address (`fi_getname`), published in the card.
    pub(super) name: Vec<u8>,
    /// The provider's address length (`fi_info.src_addrlen`/`addrlen`): every peer
    /// address inserted must have it.
    addrlen: usize,
    /// Bytes of remote completion data the provider carries (`cq_data_size`).
    cq_data: usize,
    /// The provider's address format (`fi_info.addr_format`: `FI_ADDR_STR` for `shm`,
    /// `FI_SOCKADDR_IN` for `tcp;ofi_rxm` over IPv4, ...).
    addr_format: u32,
    /// The completion queue's file descriptor, when it was opened with `FI_WAIT_FD`.
    pub(super) wait_fd: Option<c_int>,
    /// Closed after a failure: objects the provider still holds busy are expected.
    pub(super) abandoned: bool,
}

// SAFETY: the endpoint is opened with FI_THREAD_DOMAIN and owned by one transport,
// which is used by one thread at a time (the communicator is Send, not Sync); moving
// it to another thread between calls is allowed by that threading model.
unsafe impl Send for FabricEndpoint {}

impl FabricEndpoint {
    /// Opens `provider`, bound to `node` (an IP for network providers). With
    /// `want_fd` the completion queue gets a file descriptor to block on
    /// (`FI_WAIT_FD`) where the provider offers one.
    pub(super) fn open(
        provider: &str,
        node: Option<&str>,
        want_fd: bool,
    ) -> Result<FabricEndpoint> {
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
        let mut e = FabricEndpoint {
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
    pub(super) fn insert(
        &mut self,
        names: &[(usize, &[u8])],
        field: &str,
    ) -> Result<Vec<fi::fi_addr_t>> {
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

    /// The remote completion data that carries a call's descriptor with each message
    /// ([`Buffers::call`], cut to the bytes the provider carries; 0: none), so that the
    /// receiver can tell a peer that made another call. No descriptor's low bits are
    /// all ones, so that a cut one is never [`FabricEndpoint::poison_data`].
    ///
    /// [`Buffers::call`]: halo_collectives::Buffers::call
    pub(super) fn call_data(&self, call: Call) -> u64 {
        match self.cq_data {
            0 => 0,
            8.. => call.to_raw(),
            n => call.to_raw() & ((1u64 << (8 * n)) - 1),
        }
    }

    /// The completion data of a poison message from a rank whose call was `call`: with 8
    /// bytes, the descriptor with its poison bit ([`Call::poison`]); with fewer, all ones
    /// (0 when the provider carries none: no poison then).
    pub(super) fn poison_data(&self, call: Call) -> u64 {
        match self.cq_data {
            0 => 0,
            8.. => call.poison().to_raw(),
            n => (1u64 << (8 * n)) - 1,
        }
    }

    /// Whether remote completion data `data` is poison, and the poisoner's call where it
    /// says ([`Call::NONE`] where not).
    pub(super) fn poison_of(&self, data: u64) -> Option<Call> {
        match self.cq_data {
            0 => None,
            8.. => Call::from_raw(data)
                .is_poison()
                .then(|| Call::from_raw(data).unpoisoned()),
            n => (data == (1u64 << (8 * n)) - 1).then_some(Call::NONE),
        }
    }

    /// `data` (a descriptor as [`FabricEndpoint::call_data`] or
    /// [`FabricEndpoint::poison_data`] made it) keyed with rank `rank`'s
    /// [`sender_stamp`] where the provider carries 8 bytes: the sender stamps what it
    /// sends with its own rank, the receiver applies the stamp of the rank it posted the
    /// receive for and gets the descriptor back only if that rank sent the message. As
    /// it is, `data` where the provider carries fewer bytes (no room: no check).
    pub(super) fn stamp(&self, data: u64, rank: usize) -> u64 {
        if self.cq_data >= 8 {
            data ^ sender_stamp(rank)
        } else {
            data
        }
    }

    /// Whether completion data is stamped with the sender's rank ([`FabricEndpoint::stamp`]).
    pub(super) fn stamps(&self) -> bool {
        self.cq_data >= 8
    }

    /// Whether the provider carries remote completion data (poison needs it).
    pub(super) fn carries_data(&self) -> bool {
        self.cq_data > 0
    }

    pub(super) fn needs_registration(&self) -> bool {
        self.mr_mode & fi::FI_MR_LOCAL != 0
    }

    /// Registers memory for local access; returns the region and its descriptor.
    pub(super) fn register(
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

/// Closes `f`, warning when that fails.
pub(super) fn close(f: *mut fi::fid, what: &str) {
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

impl Drop for FabricEndpoint {
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

/// The longest endpoint name HALO reads from `fi_getname` (and accepts in a card).
pub(crate) const MAX_NAME: usize = 1024;
/// `AF_INET` and `AF_INET6` as `sa_family_t`, the first two bytes of a socket address.
const AF_INET: u16 = libc::AF_INET as u16;
const AF_INET6: u16 = libc::AF_INET6 as u16;

/// The key a sender's rank puts on the descriptor of every message it sends over a
/// provider that carries 8 bytes of completion data ([`FabricEndpoint::stamp`]): an
/// end-to-end check that the message a receive completed with comes from the rank the
/// receive was posted for, which directed receive (`FI_DIRECTED_RECV`) promises but a
/// provider can break: libfabric 1.17's `shm` was seen completing a receive addressed
/// to a rank that had closed its endpoint with another rank's message
/// (docs/RELIABILITY.md, "Every libfabric receive checks its sender").
///
/// Stamps of different ranks differ (the rank itself is in bits 12..32, the root
/// field: HALO has at most 2^20 ranks), the rest of the descriptor is mixed with a
/// hash of the rank so that a stamp is not a plausible call, and every stamp has the
/// kind bits all ones: two ranks' stamps cancel there, so a message of
/// [`Call::NONE`] (point to point) read with another rank's stamp has kind 0 and
/// other bits set, which no descriptor has. The poison bit (63) and the hashed-count
/// bit (62) are never touched.
pub(super) fn sender_stamp(rank: usize) -> u64 {
    const KIND: u64 = 0xf;
    const FIELDS: u64 = (1 << 62) - 1;
    let mut x = rank as u64 ^ 0x9e37_79b9_7f4a_7c15;
    x ^= x >> 30;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^= x >> 31;
    let root = (rank as u64 & 0xf_ffff) << 12;
    (x & FIELDS & !(0xf_ffff << 12) & !KIND) | root | KIND
}

/// Whether a message whose completion data arrived as `data` (stamped,
/// [`sender_stamp`]) comes from `peer`, the rank its receive was posted for, on `n`
/// ranks, by a receiver whose own descriptor is `ours`: `Ok` where `peer`'s stamp gives
/// `ours` (P aside) or, failing that, a well-formed descriptor that no other rank's
/// stamp explains (a call that differs, reported as a mismatch); `Err(Some(q))` where
/// rank `q`'s stamp gives `ours`; `Err(None)` where `peer`'s stamp gives no descriptor.
pub(super) fn sender_check(
    data: u64,
    peer: usize,
    n: usize,
    ours: u64,
) -> std::result::Result<(), Option<usize>> {
    let with = |q: usize| Call::from_raw(data ^ sender_stamp(q));
    if with(peer).unpoisoned().to_raw() == ours {
        return Ok(());
    }
    let from = (0..n)
        .filter(|&q| q != peer)
        .find(|&q| with(q).unpoisoned().to_raw() == ours);
    match from {
        None if with(peer).is_well_formed() => Ok(()),
        other => Err(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use halo_collectives::CallKind;

    #[test]
    fn stamps_of_different_ranks_differ_and_keep_poison_and_kind() {
        let mut seen = std::collections::HashSet::new();
        for r in (0..5000).chain([(1 << 20) - 1]) {
            let s = sender_stamp(r);
            assert!(seen.insert(s), "rank {r}");
            assert_eq!(s & 0xf, 0xf);
            assert_eq!(s >> 62, 0);
        }
    }

    #[test]
    fn a_message_of_another_rank_is_told_from_the_peers() {
        let call = Call::new(CallKind::AllReduce)
            .op(1)
            .dtype(3)
            .count(64)
            .to_raw();
        let other = Call::new(CallKind::AllReduce)
            .op(3)
            .dtype(3)
            .count(64)
            .to_raw();
        let n = 4;
        // From the peer: its own call, another call, poison of another call.
        assert_eq!(sender_check(call ^ sender_stamp(0), 0, n, call), Ok(()));
        assert_eq!(sender_check(other ^ sender_stamp(0), 0, n, call), Ok(()));
        let poison = Call::from_raw(other).poison().to_raw();
        assert_eq!(sender_check(poison ^ sender_stamp(0), 0, n, call), Ok(()));
        // Rank 3's message of the same call on a receive posted for rank 0.
        assert_eq!(
            sender_check(call ^ sender_stamp(3), 0, n, call),
            Err(Some(3))
        );
        // Point to point (no descriptor) from rank 1 on a receive for rank 2.
        assert_eq!(sender_check(sender_stamp(1), 2, n, 0), Err(Some(1)));
        // From a rank beyond the communicator: no rank's stamp explains it.
        assert_eq!(sender_check(sender_stamp(9), 2, n, 0), Err(None));
        assert_eq!(sender_check(sender_stamp(2), 2, n, 0), Ok(()));
    }
}
