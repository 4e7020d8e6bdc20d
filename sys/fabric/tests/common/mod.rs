//! Shared by the integration tests and `examples/pingpong.rs`: opening RDM endpoints over a
//! named provider the way HALO's transport will (FI_EP_RDM, FI_TAGGED, FI_AV_TABLE, manual
//! progress, memory registration where `mr_mode` asks for it), and a completion loop that
//! retries -FI_EAGAIN while reading the completion queues and never waits past a deadline.
//!
//! Raw FFI on purpose: these tests check the bindings, not a safe layer.

#![allow(dead_code)] // each test crate uses a different part

use core::ffi::{CStr, c_char, c_void};
use core::ptr;
use std::ffi::CString;
use std::time::{Duration, Instant};

use halo_fabric_sys::*;

/// How long any single wait may take before the test fails instead of hanging.
pub(crate) const TIMEOUT: Duration = Duration::from_secs(10);

unsafe extern "C" {
    /// libc's strdup: `fi_freeinfo` frees the hint strings with `free`, so they must come
    /// from `malloc`.
    fn strdup(s: *const c_char) -> *mut c_char;
}

/// A provider to open, and the node to bind to (`FI_SOURCE`), if any.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Provider {
    /// `fabric_attr->prov_name` hint, e.g. `shm` or `tcp;ofi_rxm`.
    pub(crate) name: &'static str,
    /// Local address to bind to (passed to `fi_getinfo` with `FI_SOURCE`).
    pub(crate) node: Option<&'static str>,
}

/// Shared memory, within one host.
pub(crate) const SHM: Provider = Provider {
    name: "shm",
    node: None,
};

/// TCP with the RxM utility provider on top for RDM semantics, on loopback.
pub(crate) const TCP: Provider = Provider {
    name: "tcp;ofi_rxm",
    node: Some("127.0.0.1"),
};

/// Turns a negative libfabric return code into an error message naming the call.
pub(crate) fn check(ret: isize, what: &str) -> Result<(), String> {
    if ret < 0 {
        Err(format!("{what}: {} ({ret})", strerror(ret as i64)))
    } else {
        Ok(())
    }
}

/// `-FI_EAGAIN` as the data-path calls return it.
pub(crate) const EAGAIN: isize = -(FI_EAGAIN as isize);
/// `-FI_EAVAIL` as `fi_cq_read` returns it.
pub(crate) const EAVAIL: isize = -(FI_EAVAIL as isize);

/// An owned `fi_info` list from `fi_getinfo`.
#[derive(Debug)]
pub(crate) struct InfoList(*mut fi_info);

impl InfoList {
    /// Every entry of the list.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &fi_info> {
        let mut cur = self.0;
        core::iter::from_fn(move || {
            // SAFETY: `cur` is NULL or an entry of the list owned by `self`, which is
            // borrowed for as long as the returned references live.
            let info = unsafe { cur.as_ref()? };
            cur = info.next;
            Some(info)
        })
    }

    /// The first (preferred) entry.
    pub(crate) fn first(&self) -> *mut fi_info {
        self.0
    }
}

impl Drop for InfoList {
    fn drop(&mut self) {
        // SAFETY: the list came from fi_getinfo and is freed once, here.
        unsafe { fi_freeinfo(self.0) };
    }
}

/// Reads a C string field of an `fi_info` (NULL gives "").
pub(crate) fn cstr(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: libfabric's string fields are NUL-terminated and live as long as their info.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// The hints HALO's transport uses: RDM, tagged, table AV, manual progress, and the
/// memory-registration modes we can honour (local registration, virtual addresses,
/// provider keys, endpoint-bound MRs). `prov` is `None` for "any provider".
pub(crate) fn getinfo(prov: Option<&Provider>) -> Result<InfoList, String> {
    // SAFETY: fi_allocinfo returns a zeroed fi_info with all attribute structs allocated
    // (or NULL, checked). The fields set below are plain data; prov_name is allocated with
    // strdup because fi_freeinfo frees it.
    let hints = unsafe {
        let hints = fi_allocinfo();
        if hints.is_null() {
            return Err("fi_allocinfo returned NULL".into());
        }
        let h = &mut *hints;
        h.caps = FI_TAGGED | FI_SEND | FI_RECV;
        h.mode = FI_CONTEXT | FI_CONTEXT2;
        (*h.ep_attr).type_ = FI_EP_RDM;
        let d = &mut *h.domain_attr;
        d.mr_mode =
            FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
        d.threading = FI_THREAD_DOMAIN;
        d.control_progress = FI_PROGRESS_MANUAL;
        d.data_progress = FI_PROGRESS_MANUAL;
        d.av_type = FI_AV_TABLE;
        if let Some(p) = prov {
            let name = CString::new(p.name).expect("no NUL in provider name");
            (*h.fabric_attr).prov_name = strdup(name.as_ptr());
        }
        hints
    };
    let node = prov
        .and_then(|p| p.node)
        .map(|n| CString::new(n).expect("no NUL in node"));
    let (node_ptr, flags) = match &node {
        Some(n) => (n.as_ptr(), FI_SOURCE),
        None => (ptr::null(), 0),
    };
    let mut info = ptr::null_mut();
    // SAFETY: hints is a valid fi_info; node is NULL or a live C string; info is written on
    // success only. hints is freed exactly once, after the call.
    let ret = unsafe {
        let ret = fi_getinfo(MIN_VERSION, node_ptr, ptr::null(), flags, hints, &mut info);
        fi_freeinfo(hints);
        ret
    };
    check(ret as isize, "fi_getinfo")?;
    if info.is_null() {
        return Err("fi_getinfo returned no entries".into());
    }
    Ok(InfoList(info))
}

/// One completion taken off a completion queue (successful or not).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Completion {
    /// The `context` passed when the operation was posted.
    pub(crate) context: *mut c_void,
    /// `FI_SEND`, `FI_RECV`, `FI_TAGGED`, ...
    pub(crate) flags: u64,
    /// Bytes received.
    pub(crate) len: usize,
    /// Tag of the received message.
    pub(crate) tag: u64,
    /// 0, or the positive error number from `fi_cq_readerr` (e.g. `FI_ECANCELED`).
    pub(crate) err: i32,
    /// Provider-specific error number (0 on success).
    pub(crate) prov_errno: i32,
}

/// An RDM endpoint with its own fabric, domain, completion queue and address vector, and a
/// send and a receive buffer registered with it when the provider requires registration.
#[derive(Debug)]
pub(crate) struct Endpoint {
    fabric: *mut fid_fabric,
    domain: *mut fid_domain,
    /// The endpoint itself.
    pub(crate) ep: *mut fid_ep,
    /// Its completion queue (transmit and receive).
    pub(crate) cq: *mut fid_cq,
    av: *mut fid_av,
    mrs: Vec<*mut fid_mr>,
    /// `domain_attr->mr_mode` the provider returned.
    pub(crate) mr_mode: i32,
    /// Whether the buffers were registered (`send_desc`/`recv_desc` from `fi_mr_desc`).
    pub(crate) registered: bool,
    /// The provider that was opened (`fabric_attr->prov_name`).
    pub(crate) provider: String,
    /// Address from `fi_getname`, to insert into the peer's address vector.
    pub(crate) name: Vec<u8>,
    /// Buffer sent from, registered if needed.
    pub(crate) send_buf: Vec<u8>,
    /// Descriptor of `send_buf` (NULL when the provider needs none).
    pub(crate) send_desc: *mut c_void,
    /// Buffer received into, registered if needed.
    pub(crate) recv_buf: Vec<u8>,
    /// Descriptor of `recv_buf`.
    pub(crate) recv_desc: *mut c_void,
    /// Completions read while progressing and not yet claimed.
    done: Vec<Completion>,
}

impl Endpoint {
    /// Opens fabric, domain, CQ, AV and endpoint for `info`, binds and enables them, and
    /// allocates two buffers of `buf_len` bytes, registered if the provider's `mr_mode` has
    /// `FI_MR_LOCAL` or if `always_register` (to exercise registration on providers that do
    /// not need it).
    pub(crate) fn open(
        info: *mut fi_info,
        buf_len: usize,
        always_register: bool,
    ) -> Result<Endpoint, String> {
        let mut e = Endpoint {
            fabric: ptr::null_mut(),
            domain: ptr::null_mut(),
            ep: ptr::null_mut(),
            cq: ptr::null_mut(),
            av: ptr::null_mut(),
            mrs: Vec::new(),
            mr_mode: 0,
            registered: false,
            provider: String::new(),
            name: Vec::new(),
            send_buf: vec![0; buf_len],
            send_desc: ptr::null_mut(),
            recv_buf: vec![0; buf_len],
            recv_desc: ptr::null_mut(),
            done: Vec::new(),
        };
        // On any error below, `e` is dropped and closes what was opened so far.
        // SAFETY: info is a valid entry from fi_getinfo (checked non-NULL by the caller's
        // InfoList), which outlives this call; every out-pointer is a field of `e`, written
        // only on success; the attribute structs are zero-initialised and then filled.
        unsafe {
            let info_ref = &*info;
            e.mr_mode = (*info_ref.domain_attr).mr_mode;
            e.provider = cstr((*info_ref.fabric_attr).prov_name);
            check(
                fi_fabric(info_ref.fabric_attr, &mut e.fabric, ptr::null_mut()) as isize,
                "fi_fabric",
            )?;
            check(
                fi_domain(e.fabric, info, &mut e.domain, ptr::null_mut()) as isize,
                "fi_domain",
            )?;
            let mut cq_attr = fi_cq_attr {
                format: FI_CQ_FORMAT_TAGGED,
                wait_obj: FI_WAIT_NONE,
                ..Default::default()
            };
            check(
                fi_cq_open(e.domain, &mut cq_attr, &mut e.cq, ptr::null_mut()) as isize,
                "fi_cq_open",
            )?;
            let mut av_attr = fi_av_attr {
                type_: FI_AV_TABLE,
                ..Default::default()
            };
            check(
                fi_av_open(e.domain, &mut av_attr, &mut e.av, ptr::null_mut()) as isize,
                "fi_av_open",
            )?;
            check(
                fi_endpoint(e.domain, info, &mut e.ep, ptr::null_mut()) as isize,
                "fi_endpoint",
            )?;
            check(
                fi_ep_bind(e.ep, &mut (*e.cq).fid, FI_TRANSMIT | FI_RECV) as isize,
                "fi_ep_bind(cq)",
            )?;
            check(
                fi_ep_bind(e.ep, &mut (*e.av).fid, 0) as isize,
                "fi_ep_bind(av)",
            )?;
            check(fi_enable(e.ep) as isize, "fi_enable")?;

            let mut name = vec![0u8; 256];
            let mut len = name.len();
            check(
                fi_getname(&mut (*e.ep).fid, name.as_mut_ptr().cast(), &mut len) as isize,
                "fi_getname",
            )?;
            name.truncate(len);
            e.name = name;
        }
        let (ptr, len) = (e.send_buf.as_mut_ptr(), e.send_buf.len());
        e.send_desc = e.register(ptr, len, FI_SEND, always_register)?;
        let (ptr, len) = (e.recv_buf.as_mut_ptr(), e.recv_buf.len());
        e.recv_desc = e.register(ptr, len, FI_RECV, always_register)?;
        Ok(e)
    }

    /// Registers `len` bytes at `buf` if the provider's `mr_mode` has `FI_MR_LOCAL` (or
    /// `always`), binding
    /// the region to the endpoint when it has `FI_MR_ENDPOINT`. Returns the descriptor to
    /// pass with data transfers, or NULL when none is needed. The memory must stay valid
    /// until the endpoint is dropped (it is owned by `self` here).
    fn register(
        &mut self,
        buf: *mut u8,
        len: usize,
        access: u64,
        always: bool,
    ) -> Result<*mut c_void, String> {
        if self.mr_mode & FI_MR_LOCAL == 0 && !always {
            return Ok(ptr::null_mut());
        }
        let key = if self.mr_mode & FI_MR_PROV_KEY == 0 {
            self.mrs.len() as u64 + 1
        } else {
            0
        };
        let mut mr = ptr::null_mut();
        // SAFETY: domain is open; buf/len describe memory owned by self that outlives the
        // registration (closed in Drop before the buffers are freed); mr is written on
        // success only and then owned by self.mrs.
        unsafe {
            check(
                fi_mr_reg(
                    self.domain,
                    buf.cast(),
                    len,
                    access,
                    0,
                    key,
                    0,
                    &mut mr,
                    ptr::null_mut(),
                ) as isize,
                "fi_mr_reg",
            )?;
            self.mrs.push(mr);
            self.registered = true;
            if self.mr_mode & FI_MR_ENDPOINT != 0 {
                check(
                    fi_mr_bind(mr, &mut (*self.ep).fid, 0) as isize,
                    "fi_mr_bind",
                )?;
                check(fi_mr_enable(mr) as isize, "fi_mr_enable")?;
            }
            Ok(fi_mr_desc(mr))
        }
    }

    /// Inserts a peer's address into this endpoint's AV; returns its `fi_addr_t` (its index,
    /// as the AV is a table).
    pub(crate) fn insert(&mut self, name: &[u8]) -> Result<fi_addr_t, String> {
        let mut addr: fi_addr_t = FI_ADDR_NOTAVAIL;
        // SAFETY: av is open; name holds one address as returned by fi_getname; addr has
        // room for the one address inserted.
        let ret = unsafe {
            fi_av_insert(
                self.av,
                name.as_ptr().cast(),
                1,
                &mut addr,
                0,
                ptr::null_mut(),
            )
        };
        if ret != 1 {
            check(ret as isize, "fi_av_insert")?;
            return Err(format!("fi_av_insert inserted {ret} addresses, not 1"));
        }
        Ok(addr)
    }

    /// Reads whatever the CQ has (this is also what drives manual progress), keeping the
    /// completions; error completions are read with `fi_cq_readerr`.
    pub(crate) fn progress(&mut self) -> Result<(), String> {
        let mut entries = [fi_cq_tagged_entry::default(); 16];
        // SAFETY: cq is open and was opened with FI_CQ_FORMAT_TAGGED, so each entry is an
        // fi_cq_tagged_entry; the array has room for the count passed.
        let ret = unsafe { fi_cq_read(self.cq, entries.as_mut_ptr().cast(), entries.len()) };
        if ret > 0 {
            for e in &entries[..ret as usize] {
                self.done.push(Completion {
                    context: e.op_context,
                    flags: e.flags,
                    len: e.len,
                    tag: e.tag,
                    err: 0,
                    prov_errno: 0,
                });
            }
            Ok(())
        } else if ret == EAGAIN {
            Ok(())
        } else if ret == EAVAIL {
            let mut err = fi_cq_err_entry::default(); // err_data_size 0: no provider data
            // SAFETY: cq is open; err is a zeroed fi_cq_err_entry the provider fills in.
            let r = unsafe { fi_cq_readerr(self.cq, &mut err, 0) };
            if r == EAGAIN {
                return Ok(()); // raced with nothing: try again next round
            }
            if r < 0 {
                check(r, "fi_cq_readerr")?;
            }
            self.done.push(Completion {
                context: err.op_context,
                flags: err.flags,
                len: err.len,
                tag: err.tag,
                err: err.err,
                prov_errno: err.prov_errno,
            });
            Ok(())
        } else {
            check(ret, "fi_cq_read")
        }
    }

    /// Takes the completion for `context`, if it has been read.
    fn take(&mut self, context: *mut c_void) -> Option<Completion> {
        let i = self.done.iter().position(|c| c.context == context)?;
        Some(self.done.swap_remove(i))
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        // Memory regions first, then the endpoint, then what it was bound to. Every libfabric
        // object begins with its `struct fid` (C code writes `&ep->fid`), so the casts below
        // give the fid without dereferencing anything.
        let fids = self.mrs.iter().map(|mr| mr.cast::<fid>()).chain([
            self.ep.cast::<fid>(),
            self.av.cast(),
            self.cq.cast(),
            self.domain.cast(),
            self.fabric.cast(),
        ]);
        for f in fids.filter(|f| !f.is_null()) {
            // SAFETY: every non-NULL fid was opened by `open` or `register` and is closed
            // exactly once, here, children before parents.
            let ret = unsafe { fi_close(f) };
            if ret != 0 {
                eprintln!("fi_close: {}", strerror(i64::from(ret)));
            }
        }
    }
}

/// Progresses every endpoint until `eps[who]` has the completion for `context`, or fails
/// at `deadline`.
pub(crate) fn wait(
    eps: &mut [Endpoint],
    who: usize,
    context: *mut c_void,
    deadline: Instant,
    what: &str,
) -> Result<Completion, String> {
    loop {
        if let Some(c) = eps[who].take(context) {
            return Ok(c);
        }
        for e in eps.iter_mut() {
            e.progress()?;
        }
        if Instant::now() > deadline {
            return Err(format!("timed out waiting for {what} on endpoint {who}"));
        }
    }
}

/// Calls `post` until it does not return -FI_EAGAIN, progressing every endpoint in between
/// (RxM connects lazily and only moves while the CQs are read). Returns how many times it
/// got -FI_EAGAIN.
pub(crate) fn post(
    eps: &mut [Endpoint],
    deadline: Instant,
    what: &str,
    mut post: impl FnMut() -> isize,
) -> Result<u64, String> {
    let mut eagain = 0;
    loop {
        let ret = post();
        if ret != EAGAIN {
            check(ret, what)?;
            return Ok(eagain);
        }
        eagain += 1;
        for e in eps.iter_mut() {
            e.progress()?;
        }
        if Instant::now() > deadline {
            return Err(format!("{what}: still -FI_EAGAIN after {eagain} tries"));
        }
    }
}

/// Two endpoints of one provider in this process, each knowing the other as `peer[i]`.
#[derive(Debug)]
pub(crate) struct Pair {
    /// The endpoints.
    pub(crate) eps: [Endpoint; 2],
    /// `peer[i]`: address of endpoint `1 - i` in endpoint `i`'s AV.
    pub(crate) peer: [fi_addr_t; 2],
    /// -FI_EAGAIN returns seen while posting sends.
    pub(crate) send_eagain: u64,
    /// -FI_EAGAIN returns seen while posting receives.
    pub(crate) recv_eagain: u64,
}

impl Pair {
    /// Opens two endpoints on `prov` with `buf_len`-byte buffers (see [`Endpoint::open`] for
    /// `always_register`) and exchanges names.
    pub(crate) fn open(
        prov: &Provider,
        buf_len: usize,
        always_register: bool,
    ) -> Result<Pair, String> {
        let info = getinfo(Some(prov))?;
        let a = Endpoint::open(info.first(), buf_len, always_register)?;
        let b = Endpoint::open(info.first(), buf_len, always_register)?;
        let mut eps = [a, b];
        let name0 = eps[0].name.clone();
        let name1 = eps[1].name.clone();
        let peer = [eps[0].insert(&name1)?, eps[1].insert(&name0)?];
        Ok(Pair {
            eps,
            peer,
            send_eagain: 0,
            recv_eagain: 0,
        })
    }

    /// Sends `len` bytes of `eps[from].send_buf` with `tag` into `eps[to].recv_buf`: the
    /// receive is posted first, the send retried on -FI_EAGAIN, and both completions are
    /// awaited. Returns the receive completion.
    pub(crate) fn transfer(
        &mut self,
        from: usize,
        len: usize,
        tag: u64,
    ) -> Result<Completion, String> {
        self.transfer_with(from, len, tag, false)
    }

    /// As [`Pair::transfer`]; with `late_recv` the send is posted first and both endpoints
    /// are progressed for a few milliseconds before the receive is posted, so the message
    /// arrives unexpected.
    pub(crate) fn transfer_with(
        &mut self,
        from: usize,
        len: usize,
        tag: u64,
        late_recv: bool,
    ) -> Result<Completion, String> {
        let to = 1 - from;
        let deadline = Instant::now() + TIMEOUT;
        // The provider may use the context memory (mode FI_CONTEXT2) until the completion
        // is read: heap-allocated, freed on success and leaked if the transfer fails.
        let rctx_p: *mut c_void = Box::into_raw(Box::new(fi_context2::default())).cast();
        let sctx_p: *mut c_void = Box::into_raw(Box::new(fi_context2::default())).cast();

        let r = &self.eps[to];
        let (rep, rbuf, rdesc, src) = (r.ep, r.recv_buf.as_ptr(), r.recv_desc, self.peer[to]);
        assert!(len <= r.recv_buf.len());
        let s = &self.eps[from];
        let (sep, sbuf, sdesc, dst) = (s.ep, s.send_buf.as_ptr(), s.send_desc, self.peer[from]);
        assert!(len <= s.send_buf.len());

        // SAFETY: the endpoint is enabled; rbuf has room for len bytes and stays alive (owned
        // by the endpoint) until the completion is taken below; rdesc is its descriptor; the
        // context is heap memory that outlives the operation.
        let post_recv =
            || unsafe { fi_trecv(rep, rbuf.cast_mut().cast(), len, rdesc, src, tag, 0, rctx_p) };
        // SAFETY: as for the receive; sbuf holds len valid bytes.
        let post_send = || unsafe { fi_tsend(sep, sbuf.cast(), len, sdesc, dst, tag, sctx_p) };

        if late_recv {
            self.send_eagain += post(&mut self.eps, deadline, "fi_tsend", post_send)?;
            let until = Instant::now() + Duration::from_millis(5);
            while Instant::now() < until {
                for e in &mut self.eps {
                    e.progress()?;
                }
            }
            self.recv_eagain += post(&mut self.eps, deadline, "fi_trecv", post_recv)?;
        } else {
            self.recv_eagain += post(&mut self.eps, deadline, "fi_trecv", post_recv)?;
            self.send_eagain += post(&mut self.eps, deadline, "fi_tsend", post_send)?;
        }

        let sc = wait(&mut self.eps, from, sctx_p, deadline, "send completion")?;
        let rc = wait(&mut self.eps, to, rctx_p, deadline, "receive completion")?;
        // SAFETY: both contexts came from Box::into_raw above and their operations have
        // completed, so the provider no longer uses them.
        unsafe {
            drop(Box::from_raw(sctx_p.cast::<fi_context2>()));
            drop(Box::from_raw(rctx_p.cast::<fi_context2>()));
        }
        for (c, what) in [(sc, "send"), (rc, "receive")] {
            if c.err != 0 {
                return Err(format!(
                    "{what} failed: {} (prov_errno {})",
                    strerror(i64::from(c.err)),
                    c.prov_errno
                ));
            }
        }
        if rc.len != len || rc.tag != tag {
            return Err(format!(
                "receive completion says {} bytes, tag {:#x}; sent {len} bytes, tag {tag:#x}",
                rc.len, rc.tag
            ));
        }
        Ok(rc)
    }
}

/// A byte pattern that differs per message and per position.
pub(crate) fn pattern(seed: u64, buf: &mut [u8]) {
    for (i, b) in buf.iter_mut().enumerate() {
        *b = (i as u64)
            .wrapping_mul(31)
            .wrapping_add(seed.wrapping_mul(131)) as u8
            ^ 0x5a;
    }
}
