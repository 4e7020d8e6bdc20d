//! The C ABI's argument checks: sequences of `libhalo` calls with fuzzed arguments on a
//! real one-rank communicator (the same functions a C program calls, linked from the
//! `halo-ffi` rlib). Every call must return a result code, never crash or panic
//! (`haloInternalError` is a caught panic: a failure here); a call whose arguments are
//! wrong in a way this harness knows must return `haloInvalidArgument`; a call that
//! succeeds must have moved the right bytes.
//!
//! The harness keeps the C contract itself — pointers are NULL, dangling only where the
//! size overflows (so the library must refuse before touching them), or real buffers
//! as large as the counts say — so a crash is HALO's, not the harness's. Nothing
//! leaves this process: unique ids that are not HALO's own are forced to loopback.
//!
//! Over 800 lines: one harness for every C call, since a fuzzed sequence mixes them
//! on one communicator; each call's generator and its expectation sit side by side.

#![no_main]

use arbitrary::Arbitrary;
use halo_ffi::*;
use libfuzzer_sys::fuzz_target;
use std::ffi::{CStr, CString, c_int, c_void};
use std::ptr::{null, null_mut};
use std::sync::Mutex;

const SUCCESS: i32 = haloResult::haloSuccess as i32;
const INVALID_ARGUMENT: i32 = haloResult::haloInvalidArgument as i32;

/// Element sizes of the `haloDataType`s, by value.
const SIZES: [usize; 10] = [1, 1, 4, 4, 8, 8, 2, 4, 8, 2];

fn elem(dtype: i32) -> Option<usize> {
    usize::try_from(dtype)
        .ok()
        .and_then(|d| SIZES.get(d).copied())
}

/// A communicator argument.
#[derive(Arbitrary, Debug, Clone, Copy)]
enum CommArg {
    Null,
    Live,
    /// A communicator destroyed just before the call.
    Stale,
    /// An address HALO never made (checked against the live table, never followed).
    Bogus(usize),
}

/// A count: small enough for real buffers, or one whose byte size overflows (the
/// buffers are then dangling, and the library must refuse before using them).
#[derive(Arbitrary, Debug, Clone, Copy)]
enum Count {
    Small(u8),
    Huge(usize),
}

impl Count {
    fn value(self) -> usize {
        match self {
            Count::Small(c) => usize::from(c % 64),
            Count::Huge(c) => c | (1 << 63),
        }
    }
    fn huge(self) -> bool {
        matches!(self, Count::Huge(_))
    }
}

/// How a buffer argument is passed.
#[derive(Arbitrary, Debug, Clone, Copy)]
enum BufArg {
    Null,
    Real,
}

#[derive(Arbitrary, Debug, Clone)]
struct ConfigArg {
    good_magic: bool,
    good_size: bool,
    algorithm: Option<i32>,
    timeout_ms: Option<i32>,
    bootstrap_timeout_ms: Option<i32>,
    provider: Option<String>,
    topology: Option<String>,
}

#[derive(Arbitrary, Debug, Clone)]
enum IdArg {
    Genuine,
    Bytes(Vec<u8>),
}

#[derive(Arbitrary, Debug, Clone)]
enum Op {
    AllToAll {
        comm: CommArg,
        send: BufArg,
        recv: BufArg,
        same: bool,
        count: Count,
        dtype: i32,
        stream: bool,
    },
    AllToAllv {
        comm: CommArg,
        arrays: [bool; 4],
        sendcount: Count,
        sdispl: u8,
        recvcount: Count,
        rdispl: u8,
        send: BufArg,
        recv: BufArg,
        dtype: i32,
        stream: bool,
    },
    SendRecv {
        comm: CommArg,
        sendcount: Count,
        recvcount: Count,
        send: BufArg,
        recv: BufArg,
        dtype: i32,
        peer: i32,
        stream: bool,
    },
    AllGather {
        comm: CommArg,
        count: Count,
        in_place: bool,
        send: BufArg,
        recv: BufArg,
        dtype: i32,
        stream: bool,
    },
    AllReduce {
        comm: CommArg,
        count: Count,
        in_place: bool,
        misalign: bool,
        dtype: i32,
        op: i32,
        stream: bool,
    },
    Barrier(CommArg),
    Query {
        comm: CommArg,
        which: u8,
        null_out: bool,
    },
    TopologyJson {
        comm: CommArg,
        null_buf: bool,
        len: u16,
        null_needed: bool,
    },
    Split {
        comm: CommArg,
        color: i32,
        key: i32,
        null_out: bool,
        config: Option<ConfigArg>,
    },
    InitRank {
        null_out: bool,
        nranks: i32,
        rank: i32,
        id: IdArg,
        config: Option<ConfigArg>,
    },
    Destroy(CommArg),
    Abort(CommArg),
    ErrorString(i32),
    Version(bool),
}

/// The live one-rank communicator, made once and remade when an operation ends it.
struct State {
    live: haloComm_t,
}

// SAFETY: the handle is only used under the mutex below, and HALO's handles may move
// between threads.
unsafe impl Send for State {}

static STATE: Mutex<Option<State>> = Mutex::new(None);

fn last_error(comm: haloComm_t) -> String {
    // SAFETY: NULL or a live communicator (a stale one reads the thread's error).
    let p = unsafe { haloGetLastError(comm) };
    assert!(!p.is_null(), "haloGetLastError returned NULL");
    // SAFETY: HALO's string, valid until the next call.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

fn new_comm() -> haloComm_t {
    let mut id = haloUniqueId {
        internal: [0; HALO_UNIQUE_ID_BYTES],
    };
    // SAFETY: a valid out pointer.
    let r = unsafe { haloGetUniqueId(&mut id) };
    assert_eq!(r, SUCCESS, "haloGetUniqueId: {}", last_error(null_mut()));
    let mut comm = null_mut();
    // The harness's own communicator may take its time (the fuzzed calls get 200 ms).
    let mut config = Config::new(&ConfigArg {
        good_magic: true,
        good_size: true,
        algorithm: None,
        timeout_ms: None,
        bootstrap_timeout_ms: None,
        provider: None,
        topology: None,
    })
    .raw;
    config.bootstrapTimeoutMs = 10_000;
    // SAFETY: a valid out pointer and config.
    let r = unsafe { haloCommInitRankConfig(&mut comm, 1, id, 0, &mut config) };
    assert_eq!(
        r,
        SUCCESS,
        "one-rank haloCommInitRank: {}",
        last_error(null_mut())
    );
    assert!(!comm.is_null());
    comm
}

/// A topology string that cannot name a huge preset or a file outside the working
/// directory (a preset of millions of ranks is refused by the library's own limit of
/// 2^24 only after it is built, which is slow, not wrong).
fn tame(s: &str) -> bool {
    let mut run = 0;
    for c in s.chars() {
        if c.is_ascii_digit() {
            run += 1;
            if run > 3 {
                return false;
            }
        } else {
            run = 0;
        }
    }
    !s.contains('/') && !s.contains('\0')
}

/// Holds a `haloConfig_t` and the strings it points to.
struct Config {
    raw: haloConfig_t,
    _strings: Vec<CString>,
}

impl Config {
    fn new(arg: &ConfigArg) -> Config {
        let mut strings = Vec::new();
        let string = |s: &Option<String>, strings: &mut Vec<CString>| match s {
            Some(s) if tame(s) => {
                let c = CString::new(s.as_str()).expect("no NUL");
                let p = c.as_ptr();
                strings.push(c);
                p
            }
            _ => null(),
        };
        // Waits are bounded: timeouts are at most 200 ms.
        let millis = |v: Option<i32>| match v {
            None => HALO_CONFIG_UNDEF_INT,
            Some(v) if v > 200 => 200,
            Some(v) => v,
        };
        let raw = haloConfig_t {
            size: if arg.good_size {
                std::mem::size_of::<haloConfig_t>()
            } else {
                std::mem::size_of::<haloConfig_t>() + 8
            },
            magic: if arg.good_magic {
                HALO_CONFIG_MAGIC
            } else {
                0xdead_beef
            },
            version: HALO_VERSION_CODE as u32,
            algorithm: arg.algorithm.unwrap_or(HALO_CONFIG_UNDEF_INT),
            timeoutMs: millis(arg.timeout_ms),
            bootstrapTimeoutMs: millis(arg.bootstrap_timeout_ms),
            provider: string(&arg.provider, &mut strings),
            topology: string(&arg.topology, &mut strings),
        };
        Config {
            raw,
            _strings: strings,
        }
    }

    fn invalid(&self) -> bool {
        self.raw.magic != HALO_CONFIG_MAGIC
            || self.raw.size != std::mem::size_of::<haloConfig_t>()
            || (self.raw.timeoutMs != HALO_CONFIG_UNDEF_INT && self.raw.timeoutMs <= 0)
            || (self.raw.bootstrapTimeoutMs != HALO_CONFIG_UNDEF_INT
                && self.raw.bootstrapTimeoutMs <= 0)
            || (self.raw.algorithm != HALO_CONFIG_UNDEF_INT
                && !(0..=5).contains(&self.raw.algorithm))
    }
}

/// A byte buffer with room for `bytes` bytes at 8-byte alignment, filled with a pattern.
fn buffer(bytes: usize, seed: u8) -> Vec<u64> {
    let mut v = vec![0u64; bytes.div_ceil(8) + 1];
    let b: &mut [u8] = bytemuck::cast_slice_mut(&mut v);
    for (i, x) in b.iter_mut().enumerate() {
        *x = (i as u8).wrapping_mul(31).wrapping_add(seed);
    }
    v
}

fn as_bytes(v: &[u64], n: usize) -> &[u8] {
    &bytemuck::cast_slice(v)[..n]
}

/// What the harness passes for one communicator argument, and whether it is live.
fn comm_arg(arg: CommArg, live: haloComm_t) -> (haloComm_t, bool) {
    match arg {
        CommArg::Null => (null_mut(), false),
        CommArg::Live => (live, true),
        CommArg::Stale => {
            let c = new_comm();
            // SAFETY: a live communicator, destroyed once.
            assert_eq!(unsafe { haloCommDestroy(c) }, SUCCESS);
            // Only `live` is allocated besides, so the address is not live.
            (c, c == live)
        }
        CommArg::Bogus(a) => (a as haloComm_t, a == live as usize && !live.is_null()),
    }
}

/// Checks a result: never a panic caught at the boundary nor a code outside the enum;
/// `haloInvalidArgument` when the harness knows an argument is wrong; a message after a
/// failure.
fn check(name: &str, r: i32, known_invalid: bool, comm: haloComm_t) {
    assert!(
        (0..=9).contains(&r),
        "{name}: result {r} is not a haloResult"
    );
    let message = if r == SUCCESS {
        String::new()
    } else {
        last_error(comm)
    };
    assert_ne!(
        r,
        haloResult::haloInternalError as i32,
        "{name}: internal error (a caught panic?): {message}"
    );
    if known_invalid {
        assert_eq!(
            r, INVALID_ARGUMENT,
            "{name}: expected haloInvalidArgument: {message}"
        );
    }
    if r != SUCCESS {
        assert!(!message.is_empty(), "{name} failed ({r}) without a message");
    }
}

/// A stream with host buffers (the device path, issue 17): without a CUDA / HIP runtime
/// `haloUnhandledDeviceError`; with one, `haloInvalidArgument` (host memory, or an
/// argument error found later). Never success.
fn device_refused(name: &str, r: i32) {
    assert!(
        r == haloResult::haloUnhandledDeviceError as i32 || r == INVALID_ARGUMENT,
        "{name} with a stream and host buffers returned {r}"
    );
}

fn stream_arg(nonnull: bool) -> haloStream_t {
    if nonnull {
        0x1000 as haloStream_t
    } else {
        null_mut()
    }
}

/// Runs one operation; returns whether the live communicator must be remade.
fn run(op: &Op, live: haloComm_t) -> bool {
    match op.clone() {
        Op::AllToAll {
            comm,
            send,
            recv,
            same,
            count,
            dtype,
            stream,
        } => {
            let (c, ok) = comm_arg(comm, live);
            let size = elem(dtype);
            let n = count.value();
            let bytes = size.map(|s| n * s).unwrap_or(0);
            let invalid_early = !ok || size.is_none() || count.huge();
            let s = buffer(if count.huge() { 0 } else { bytes }, 1);
            let mut r = buffer(if count.huge() { 0 } else { bytes }, 2);
            let dangling = std::ptr::NonNull::<u64>::dangling().as_ptr();
            let sp: *const c_void = match (send, count.huge()) {
                (BufArg::Null, _) => null(),
                (BufArg::Real, true) => dangling.cast_const().cast(),
                (BufArg::Real, false) => s.as_ptr().cast(),
            };
            let rp: *mut c_void = match (recv, count.huge(), same) {
                (BufArg::Null, _, _) => null_mut(),
                (BufArg::Real, true, _) => dangling.cast(),
                (BufArg::Real, false, true) => sp.cast_mut(),
                (BufArg::Real, false, false) => r.as_mut_ptr().cast(),
            };
            let null_bad = bytes > 0 && (sp.is_null() || rp.is_null());
            let alias = bytes > 0 && sp == rp.cast_const();
            // SAFETY: buffers are NULL, dangling with an overflowing size, or real and
            // as large as the count says.
            let res = unsafe { haloAllToAll(sp, rp, n, dtype, c, stream_arg(stream)) };
            let known = invalid_early || null_bad || alias;
            check("haloAllToAll", res, known, c);
            if stream && !known {
                device_refused("haloAllToAll", res);
            }
            if res == SUCCESS && !alias && bytes > 0 {
                assert_eq!(
                    as_bytes(&r, bytes),
                    as_bytes(&s, bytes),
                    "haloAllToAll on one rank: wrong bytes"
                );
            }
            false
        }
        Op::AllToAllv {
            comm,
            arrays,
            sendcount,
            sdispl,
            recvcount,
            rdispl,
            send,
            recv,
            dtype,
            stream,
        } => {
            let (c, ok) = comm_arg(comm, live);
            let size = elem(dtype);
            let (sc, rc) = (sendcount.value(), recvcount.value());
            let (sd, rd) = (usize::from(sdispl % 16), usize::from(rdispl % 16));
            let huge = sendcount.huge() || recvcount.huge();
            let es = size.unwrap_or(1);
            let sbytes = if huge { 0 } else { (sd + sc) * es };
            let rbytes = if huge { 0 } else { (rd + rc) * es };
            let s = buffer(sbytes, 3);
            let mut r = buffer(rbytes, 4);
            let arr = [[sc], [sd], [rc], [rd]];
            let ptr =
                |i: usize| -> *const usize { if arrays[i] { arr[i].as_ptr() } else { null() } };
            let sp: *const c_void = match send {
                BufArg::Null => null(),
                BufArg::Real => s.as_ptr().cast(),
            };
            let rp: *mut c_void = match recv {
                BufArg::Null => null_mut(),
                BufArg::Real => r.as_mut_ptr().cast(),
            };
            let invalid_early = !ok || size.is_none() || arrays.iter().any(|&a| !a);
            // SAFETY: each array is NULL or holds one entry (the communicator has one
            // rank); the buffers cover what the counts and displacements reach, or the
            // counts overflow.
            let res = unsafe {
                haloAllToAllv(
                    sp,
                    ptr(0),
                    ptr(1),
                    rp,
                    ptr(2),
                    ptr(3),
                    dtype,
                    c,
                    stream_arg(stream),
                )
            };
            // With a stream the buffers' memory is looked up first (the device path).
            let known = invalid_early
                || (ok
                    && !stream
                    && size.is_some()
                    && (huge || (sc > 0 && sp.is_null()) || (rc > 0 && rp.is_null())));
            check("haloAllToAllv", res, known, c);
            if stream && !invalid_early {
                device_refused("haloAllToAllv", res);
            }
            if res == SUCCESS {
                assert_eq!(sc, rc, "haloAllToAllv accepted {sc} sent and {rc} expected");
                if sc > 0 {
                    assert_eq!(
                        &as_bytes(&r, rbytes)[rd * es..],
                        &as_bytes(&s, sbytes)[sd * es..],
                        "haloAllToAllv on one rank: wrong bytes"
                    );
                }
            }
            // A failure after the count exchange may leave the communicator's state
            // unknown: start again from a fresh one.
            res != SUCCESS && ok
        }
        Op::SendRecv {
            comm,
            sendcount,
            recvcount,
            send,
            recv,
            dtype,
            peer,
            stream,
        } => {
            let (c, ok) = comm_arg(comm, live);
            let size = elem(dtype);
            let es = size.unwrap_or(1);
            let (sn, rn) = (sendcount.value(), recvcount.value());
            let s = buffer(if sendcount.huge() { 0 } else { sn * es }, 5);
            let mut r = buffer(if recvcount.huge() { 0 } else { rn * es }, 6);
            let dangling = std::ptr::NonNull::<u64>::dangling().as_ptr();
            let sp: *const c_void = match (send, sendcount.huge()) {
                (BufArg::Null, _) => null(),
                (BufArg::Real, true) => dangling.cast_const().cast(),
                (BufArg::Real, false) => s.as_ptr().cast(),
            };
            let rp: *mut c_void = match (recv, recvcount.huge()) {
                (BufArg::Null, _) => null_mut(),
                (BufArg::Real, true) => dangling.cast(),
                (BufArg::Real, false) => r.as_mut_ptr().cast(),
            };
            let common = !ok || stream || size.is_none() || peer != 0;
            let send_bad = common || sendcount.huge() || (sn > 0 && sp.is_null());
            let recv_bad = common || recvcount.huge() || (rn > 0 && rp.is_null());
            // SAFETY: as for haloAllToAll.
            let res = unsafe { haloSend(sp, sn, dtype, peer, c, stream_arg(stream)) };
            check("haloSend", res, send_bad, c);
            // A receive with good arguments and nothing sent would wait for its
            // timeout: only then is it skipped.
            if res == SUCCESS || recv_bad {
                // SAFETY: as for haloAllToAll.
                let res2 = unsafe { haloRecv(rp, rn, dtype, peer, c, stream_arg(stream)) };
                check("haloRecv", res2, recv_bad, c);
                if res2 == SUCCESS {
                    assert_eq!(sn, rn, "haloRecv of {rn} accepted a send of {sn}");
                    assert_eq!(
                        as_bytes(&r, rn * es),
                        as_bytes(&s, sn * es),
                        "send/recv to self: wrong bytes"
                    );
                }
                // A send left unreceived, or a mismatch: start again.
                ok && res == SUCCESS && res2 != SUCCESS
            } else {
                false
            }
        }
        Op::AllGather {
            comm,
            count,
            in_place,
            send,
            recv,
            dtype,
            stream,
        } => {
            let (c, ok) = comm_arg(comm, live);
            let size = elem(dtype);
            let n = count.value();
            let bytes = if count.huge() {
                0
            } else {
                n * size.unwrap_or(1)
            };
            let s = buffer(bytes, 7);
            let mut r = buffer(bytes, 8);
            let dangling = std::ptr::NonNull::<u64>::dangling().as_ptr();
            let rp: *mut c_void = match (recv, count.huge()) {
                (BufArg::Null, _) => null_mut(),
                (BufArg::Real, true) => dangling.cast(),
                (BufArg::Real, false) => r.as_mut_ptr().cast(),
            };
            let sp: *const c_void = match (send, count.huge(), in_place) {
                (BufArg::Null, _, _) => null(),
                (BufArg::Real, true, _) => dangling.cast_const().cast(),
                (BufArg::Real, false, true) => rp.cast_const(),
                (BufArg::Real, false, false) => s.as_ptr().cast(),
            };
            let known = !ok
                || stream
                || size.is_none()
                || count.huge()
                || (bytes > 0 && (sp.is_null() || rp.is_null()));
            let expect: Vec<u8> = if sp.is_null() || count.huge() || bytes == 0 {
                Vec::new()
            } else if sp == rp.cast_const() {
                as_bytes(&r, bytes).to_vec()
            } else {
                as_bytes(&s, bytes).to_vec()
            };
            // SAFETY: as for haloAllToAll; in place is sendbuff == recvbuff + 0 (rank 0).
            let res = unsafe { haloAllGather(sp, rp, n, dtype, c, stream_arg(stream)) };
            check("haloAllGather", res, known, c);
            if res == SUCCESS && bytes > 0 {
                assert_eq!(
                    as_bytes(&r, bytes),
                    &expect[..],
                    "haloAllGather: wrong bytes"
                );
            }
            false
        }
        Op::AllReduce {
            comm,
            count,
            in_place,
            misalign,
            dtype,
            op,
            stream,
        } => {
            let (c, ok) = comm_arg(comm, live);
            let size = elem(dtype);
            let n = count.value();
            let es = size.unwrap_or(1);
            let bytes = if count.huge() { 0 } else { n * es };
            let s = buffer(bytes + 8, 9);
            let mut r = buffer(bytes + 8, 10);
            let off = usize::from(misalign);
            let dangling = std::ptr::NonNull::<u64>::dangling().as_ptr();
            let (sp, rp): (*const c_void, *mut c_void) = if count.huge() {
                (dangling.cast_const().cast(), dangling.cast())
            } else {
                // SAFETY: `off` <= 1 and the buffers have 8 spare bytes.
                let rp = unsafe { r.as_mut_ptr().cast::<u8>().add(off) }.cast::<c_void>();
                let sp = if in_place {
                    rp.cast_const()
                } else {
                    // SAFETY: as above.
                    unsafe { s.as_ptr().cast::<u8>().add(off) }.cast::<c_void>()
                };
                (sp, rp)
            };
            let expect: Vec<u8> = if count.huge() {
                Vec::new()
            } else if in_place {
                as_bytes(&r, bytes + off)[off..].to_vec()
            } else {
                as_bytes(&s, bytes + off)[off..].to_vec()
            };
            let known = !ok
                || stream
                || size.is_none()
                || !matches!(op, 0 | 2 | 3)
                || count.huge()
                || matches!(dtype, 0 | 1)
                || (n > 0 && off != 0 && es > 1);
            // SAFETY: as for haloAllToAll.
            let res = unsafe { haloAllReduce(sp, rp, n, dtype, op, c, stream_arg(stream)) };
            check("haloAllReduce", res, known, c);
            if res == SUCCESS && bytes > 0 {
                // One rank: the result is the input, NaNs included (bit for bit).
                assert_eq!(
                    &as_bytes(&r, bytes + off)[off..],
                    &expect[..],
                    "haloAllReduce on one rank: wrong bytes"
                );
            }
            false
        }
        Op::Barrier(comm) => {
            let (c, ok) = comm_arg(comm, live);
            // SAFETY: comm is NULL, live, or checked against the live table.
            let res = unsafe { haloBarrier(c) };
            check("haloBarrier", res, !ok, c);
            if ok {
                assert_eq!(res, SUCCESS, "one-rank barrier failed: {}", last_error(c));
            }
            false
        }
        Op::Query {
            comm,
            which,
            null_out,
        } => {
            let (c, ok) = comm_arg(comm, live);
            let mut v: c_int = -7;
            let mut e: i32 = -7;
            let vp = if null_out {
                null_mut()
            } else {
                &mut v as *mut c_int
            };
            let ep = if null_out {
                null_mut()
            } else {
                &mut e as *mut i32
            };
            // SAFETY: out pointers are NULL or valid.
            let res = unsafe {
                match which % 3 {
                    0 => haloCommCount(c, vp),
                    1 => haloCommUserRank(c, vp),
                    _ => haloCommGetAsyncError(c, ep),
                }
            };
            check(
                "haloCommCount/UserRank/GetAsyncError",
                res,
                !ok || null_out,
                c,
            );
            if res == SUCCESS {
                match which % 3 {
                    0 => assert_eq!(v, 1),
                    1 => assert_eq!(v, 0),
                    _ => assert!((0..=9).contains(&e)),
                }
            }
            false
        }
        Op::TopologyJson {
            comm,
            null_buf,
            len,
            null_needed,
        } => {
            let (c, ok) = comm_arg(comm, live);
            let len = usize::from(len);
            let mut buf = vec![0x55u8; len.max(1)];
            let bp = if null_buf {
                null_mut()
            } else {
                buf.as_mut_ptr().cast()
            };
            let mut needed = 0usize;
            let np = if null_needed {
                null_mut()
            } else {
                &mut needed as *mut usize
            };
            // SAFETY: buf is NULL or writable for `len` bytes; needed NULL or valid.
            let res = unsafe { haloTopologyJson(c, bp, len, np) };
            check("haloTopologyJson", res, !ok || (null_buf && len > 0), c);
            if res == SUCCESS && !null_buf {
                let s = CStr::from_bytes_until_nul(&buf).expect("NUL-terminated");
                let spec = halo_topology::TopologySpec::from_json_str(s.to_str().unwrap())
                    .expect("haloTopologyJson writes a topology file");
                assert_eq!(spec.ranks.len(), 1);
            }
            false
        }
        Op::Split {
            comm,
            color,
            key,
            null_out,
            config,
        } => {
            let (c, ok) = comm_arg(comm, live);
            let cfg = config.as_ref().map(Config::new);
            let mut cfg_raw = cfg.as_ref().map(|c| c.raw);
            let cp = cfg_raw
                .as_mut()
                .map_or(null_mut(), |c| c as *mut haloConfig_t);
            let cfg_bad = cfg.as_ref().is_some_and(|c| {
                c.invalid()
                    || (c.raw.magic == HALO_CONFIG_MAGIC
                        && c.raw.size == std::mem::size_of::<haloConfig_t>()
                        && (!c.raw.provider.is_null()
                            || !c.raw.topology.is_null()
                            || c.raw.bootstrapTimeoutMs != HALO_CONFIG_UNDEF_INT))
            });
            let mut out: haloComm_t = 0x1 as haloComm_t;
            let op = if null_out {
                null_mut()
            } else {
                &mut out as *mut haloComm_t
            };
            // SAFETY: out is NULL or valid; config NULL or a haloConfig_t whose strings
            // live in `cfg`.
            let res = unsafe { haloCommSplit(c, color, key, op, cp) };
            check("haloCommSplit", res, !ok || null_out || (ok && cfg_bad), c);
            if res == SUCCESS {
                if color < 0 {
                    assert!(out.is_null(), "NOCOLOR gave a communicator");
                } else {
                    assert!(!out.is_null());
                    let mut v = -1;
                    // SAFETY: the new communicator, then destroyed once.
                    unsafe {
                        assert_eq!(haloCommCount(out, &mut v), SUCCESS);
                        assert_eq!(v, 1);
                        assert_eq!(haloCommDestroy(out), SUCCESS);
                    }
                }
            }
            false
        }
        Op::InitRank {
            null_out,
            nranks,
            rank,
            id,
            config,
        } => {
            let mut uid = haloUniqueId {
                internal: [0; HALO_UNIQUE_ID_BYTES],
            };
            match &id {
                IdArg::Genuine => {
                    // SAFETY: a valid out pointer.
                    assert_eq!(unsafe { haloGetUniqueId(&mut uid) }, SUCCESS);
                }
                IdArg::Bytes(b) => {
                    for (d, s) in uid.internal.iter_mut().zip(b) {
                        *d = *s as _;
                    }
                    // Network safety: an id that passes the header check points at
                    // loopback port 1 (nothing listens; refused at once).
                    uid.internal[5] = 4;
                    let addr = std::net::Ipv4Addr::LOCALHOST.to_ipv6_mapped().octets();
                    for (d, s) in uid.internal[8..24].iter_mut().zip(addr) {
                        *d = s as _;
                    }
                    uid.internal[6] = 1;
                    uid.internal[7] = 0;
                }
            }
            // Always a config, so that a rendezvous that cannot complete (a good id
            // and more than one rank) gives up after 200 ms.
            let cfg = Config::new(&config.unwrap_or(ConfigArg {
                good_magic: true,
                good_size: true,
                algorithm: None,
                timeout_ms: None,
                bootstrap_timeout_ms: None,
                provider: None,
                topology: None,
            }));
            let mut cfg_raw = cfg.raw;
            if cfg_raw.bootstrapTimeoutMs == HALO_CONFIG_UNDEF_INT {
                cfg_raw.bootstrapTimeoutMs = 200;
            }
            let cp = &mut cfg_raw as *mut haloConfig_t;
            let range_bad = nranks < 1 || nranks > 1 << 20 || rank < 0 || rank >= nranks;
            let mut out: haloComm_t = null_mut();
            let op = if null_out {
                null_mut()
            } else {
                &mut out as *mut haloComm_t
            };
            // SAFETY: out is NULL or valid; config NULL or a haloConfig_t.
            let res = unsafe { haloCommInitRankConfig(op, nranks, uid, rank, cp) };
            let known = null_out || range_bad || cfg.invalid();
            check("haloCommInitRankConfig", res, known, null_mut());
            if res == SUCCESS {
                assert!(!out.is_null());
                // SAFETY: the new communicator, destroyed once.
                assert_eq!(unsafe { haloCommDestroy(out) }, SUCCESS);
            } else {
                assert!(out.is_null(), "a failed init wrote *comm");
            }
            false
        }
        Op::Destroy(comm) => {
            let (c, ok) = comm_arg(comm, live);
            // SAFETY: NULL, live (then remade), or checked against the live table.
            let res = unsafe { haloCommDestroy(c) };
            check("haloCommDestroy", res, !ok && !c.is_null(), null_mut());
            if c.is_null() {
                assert_eq!(res, SUCCESS, "haloCommDestroy(NULL)");
            }
            ok
        }
        Op::Abort(comm) => {
            let (c, ok) = comm_arg(comm, live);
            // SAFETY: as for Destroy.
            let res = unsafe { haloCommAbort(c) };
            check("haloCommAbort", res, !ok && !c.is_null(), null_mut());
            ok
        }
        Op::ErrorString(r) => {
            let p = haloGetErrorString(r);
            assert!(!p.is_null());
            // SAFETY: a static string.
            assert!(!unsafe { CStr::from_ptr(p) }.to_bytes().is_empty());
            false
        }
        Op::Version(null) => {
            let mut v = 0;
            let vp = if null {
                null_mut()
            } else {
                &mut v as *mut c_int
            };
            // SAFETY: NULL or valid.
            let res = unsafe { haloGetVersion(vp) };
            check("haloGetVersion", res, null, null_mut());
            if !null {
                assert_eq!(v, HALO_VERSION_CODE);
            }
            false
        }
    }
}

fuzz_target!(|ops: Vec<Op>| {
    let mut guard = STATE.lock().unwrap_or_else(|e| e.into_inner());
    let state = guard.get_or_insert_with(|| {
        // Every wait is short: a rendezvous that cannot complete, a receive with
        // nothing sent.
        // SAFETY: set before any HALO call, while this is the only thread.
        unsafe {
            // (The rendezvous roots of haloGetUniqueId wait this long; each fuzzed
            // haloCommInitRankConfig waits at most 200 ms, its config says so.)
            std::env::set_var("HALO_BOOTSTRAP_TIMEOUT_MS", "5000");
            // Errors only: the library's warnings (a rendezvous that timed out) would
            // drown libFuzzer's output.
            std::env::set_var("HALO_DEBUG", "error");
            // Rendezvous roots on loopback only.
            std::env::set_var("HALO_BOOTSTRAP_ADDR", "127.0.0.1");
            std::env::set_var("HALO_TIMEOUT_MS", "200");
        }
        State { live: new_comm() }
    });
    for op in ops.iter().take(16) {
        if run(op, state.live) {
            // The live communicator was destroyed, aborted or left in an unknown
            // state: destroy it if still live, and make another.
            // SAFETY: the handle is checked against the live table.
            let _ = unsafe { haloCommDestroy(state.live) };
            state.live = new_comm();
        }
        let mut e = 0;
        // SAFETY: live, valid out pointer.
        assert_eq!(
            unsafe { haloCommGetAsyncError(state.live, &mut e) },
            SUCCESS
        );
        if e != SUCCESS {
            // SAFETY: as above.
            let _ = unsafe { haloCommDestroy(state.live) };
            state.live = new_comm();
        }
    }
});
