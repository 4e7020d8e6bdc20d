//! The MoE dispatcher (issue 29): DeepEP's dispatch / combine over HALO's
//! de-duplicating exchange (`halo_rs::MoeExchange`), with a handle that keeps the
//! routing between the calls.
//!
//! **Handles are numbers, never pointers.** A `haloMoeHandle_t` is an id drawn from a
//! counter that never repeats (per process) and entered in a table ([`HANDLES`]);
//! every call looks it up there first. So a handle used after `haloMoeHandleFree`, a
//! second free, or a number HALO never gave out is `haloInvalidArgument` naming it,
//! always (unlike a pointer, an id is never reused).
//!
//! Over 800 lines: it is the whole C surface of one object, the handle: its table,
//! create, info, layout and free, and the eight data calls (four blocking, four
//! `haloIMoe*`), which are thin wrappers with their C contracts over one shared set of
//! checks and runners (`DataArgs`, `check_data`, `data_call`, `nonblocking_data_call`,
//! `refuse`); split, those private helpers would become crate-wide for one caller, so
//! it stays one file.

use crate::boundary::{call, call_borrowed, call_comm};
use crate::error::{Failure, FfiResult, haloResult_t};
use crate::handle::{haloComm, haloComm_t};
use crate::requests::{check_request_out, haloRequest_t, start};
use crate::types::{check_stream, haloDataType, haloDataType_t, haloStream_t};
use halo_rs::c_abi::OpJob;
use halo_rs::{Communicator, MoeDispatch, MoeExchange, MoeRouting};
use std::collections::BTreeMap;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// A MoE routing exchanged by `haloMoeHandleCreate`: which rows each rank's experts
/// receive, from where, and how they go back. An opaque number (0 is never a handle);
/// freed by `haloMoeHandleFree`. Used by the data calls (`haloMoeDispatch`,
/// `haloMoeCombine`, `haloMoeDispatchPairs`, `haloMoeCombinePairs`) on the
/// communicator it was made on, as often as needed: one MoE layer's forward and
/// backward use one handle.
pub type haloMoeHandle_t = u64;

/// How `haloMoeHandleCreate` moves the tokens. Passed as a `haloMoeMode_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum haloMoeMode {
    /// De-duplicate when the routing has something to de-duplicate (some token has two
    /// experts on one other node), else the direct path; decided the same way on every
    /// rank.
    haloMoeAuto = 0,
    /// One copy of a token per destination node, replicated inside the node (both
    /// ways: the combine is reduced inside the node before one row per (token, node)
    /// goes back).
    haloMoeDedup = 1,
    /// One copy per (token, expert) pair, straight to the expert's rank.
    haloMoeDirect = 2,
}

/// A `haloMoeMode` value (an `int32_t`; a value outside the enum is
/// `haloInvalidArgument`).
pub type haloMoeMode_t = i32;

fn mode_from_raw(raw: haloMoeMode_t) -> FfiResult<MoeDispatch> {
    match raw {
        0 => Ok(MoeDispatch::Auto),
        1 => Ok(MoeDispatch::Dedup),
        2 => Ok(MoeDispatch::AllToAllV),
        other => Err(Failure::invalid(format!(
            "mode {other} is not a haloMoeMode_t (haloMoeAuto = 0, haloMoeDedup = 1, \
             haloMoeDirect = 2)"
        ))),
    }
}

/// One live handle: the communicator it belongs to (its handle's address) and the
/// exchanged routing.
struct MoeHandle {
    comm: usize,
    exchange: MoeExchange,
}

/// The live handles by id.
static HANDLES: Mutex<BTreeMap<u64, Arc<MoeHandle>>> = Mutex::new(BTreeMap::new());
/// The next id (ids start at 1 and never repeat).
static NEXT: AtomicU64 = AtomicU64::new(1);

fn handles() -> MutexGuard<'static, BTreeMap<u64, Arc<MoeHandle>>> {
    HANDLES.lock().unwrap_or_else(PoisonError::into_inner)
}

fn not_live(handle: haloMoeHandle_t) -> Failure {
    Failure::invalid(format!(
        "MoE handle {handle} is not live (freed already, or not made by haloMoeHandleCreate)"
    ))
}

/// The live handle `handle`, which must belong to `comm`.
fn lookup(handle: haloMoeHandle_t, comm: haloComm_t) -> FfiResult<Arc<MoeHandle>> {
    let h = handles()
        .get(&handle)
        .cloned()
        .ok_or_else(|| not_live(handle))?;
    if h.comm != comm as usize {
        return Err(Failure::invalid(format!(
            "MoE handle {handle} was made on another communicator"
        )));
    }
    Ok(h)
}

/// `count` elements of `size` bytes, or an overflow error naming `what`.
fn bytes_of(count: usize, size: usize, what: &str) -> FfiResult<usize> {
    count
        .checked_mul(size)
        .filter(|&b| b <= isize::MAX as usize)
        .ok_or_else(|| Failure::invalid(format!("{what}: {count} elements overflow")))
}

/// A C array of `len` elements of `E` as a slice: NULL only when `len` is 0, aligned.
///
/// # Safety
/// `ptr` is NULL or readable for `len` elements, and not written during the call.
unsafe fn input<'a, E>(ptr: *const c_void, len: usize, what: &str) -> FfiResult<&'a [E]> {
    if len == 0 {
        return Ok(&[]);
    }
    if ptr.is_null() {
        return Err(Failure::invalid(format!(
            "{what} is NULL but holds {len} elements"
        )));
    }
    if !(ptr as usize).is_multiple_of(std::mem::align_of::<E>()) {
        return Err(Failure::invalid(format!(
            "{what} is not aligned to its element type ({} bytes)",
            std::mem::align_of::<E>()
        )));
    }
    // SAFETY: not NULL, aligned, and readable for `len` elements by the contract.
    Ok(unsafe { std::slice::from_raw_parts(ptr.cast::<E>(), len) })
}

fn no_overlap(a: *const c_void, a_len: usize, b: *const c_void, b_len: usize) -> FfiResult<()> {
    let (x, y) = (a as usize, b as usize);
    if a_len > 0 && b_len > 0 && x < y.saturating_add(b_len) && y < x.saturating_add(a_len) {
        return Err(Failure::invalid(
            "the input and output buffers overlap (the MoE calls are out-of-place only)",
        ));
    }
    Ok(())
}

/// This rank's routing from the C arguments of `haloMoeHandleCreate`: the expert ids,
/// the expert table, `topK`.
///
/// # Safety
/// As `haloMoeHandleCreate`'s contract.
unsafe fn routing_of(
    topk_idx: *const i64,
    num_tokens: usize,
    top_k: c_int,
    expert_rank: *const i32,
    num_experts: c_int,
    n: usize,
) -> FfiResult<(Vec<u32>, Vec<u32>, usize)> {
    let k = usize::try_from(top_k)
        .ok()
        .filter(|&k| k >= 1)
        .ok_or_else(|| Failure::invalid(format!("topK is {top_k}: at least 1")))?;
    let experts = usize::try_from(num_experts)
        .ok()
        .filter(|&e| e >= 1)
        .ok_or_else(|| Failure::invalid(format!("numExperts is {num_experts}: at least 1")))?;
    let pairs = num_tokens
        .checked_mul(k)
        .ok_or_else(|| Failure::invalid("numTokens x topK overflows"))?;
    bytes_of(pairs, 8, "topkIdx")?;
    // SAFETY: the contract: `numTokens * topK` and `numExperts` elements.
    let idx = unsafe { input::<i64>(topk_idx.cast(), pairs, "topkIdx") }?;
    // SAFETY: as above.
    let map = unsafe { input::<i32>(expert_rank.cast(), experts, "expertRank") }?;
    let mut ids = Vec::with_capacity(pairs);
    for (i, &e) in idx.iter().enumerate() {
        if e < 0 || e >= experts as i64 {
            let (t, j) = (i / k, i % k);
            let why = if e == -1 {
                " (a masked slot, as DeepEP allows, is not supported: give every token \
                 topK experts)"
            } else {
                ""
            };
            return Err(Failure::invalid(format!(
                "topkIdx of token {t} slot {j} is {e}, not an expert 0..{experts}{why}"
            )));
        }
        ids.push(e as u32);
    }
    let mut table = Vec::with_capacity(experts);
    for (e, &q) in map.iter().enumerate() {
        if q < 0 || q as usize >= n {
            return Err(Failure::invalid(format!(
                "expertRank[{e}] is {q}, not a rank of the communicator (0..{n})"
            )));
        }
        table.push(q as u32);
    }
    Ok((ids, table, k))
}

/// Exchanges a MoE routing (DeepEP's `get_dispatch_layout` and the metadata of its
/// `dispatch`, in one collective call): this rank's `numTokens` tokens each go to the
/// `topK` experts `topkIdx[t * topK + j]` (`int64_t`, as torch's and DeepEP's
/// `topk_idx`; distinct within a token, each `< numExperts`), expert `e` living on rank
/// `expertRank[e]` (the same table on every rank: expert placement, so migration is a
/// new table). Writes a handle for the data calls to `*handle`.
///
/// Collective: every rank of `comm` calls it, with the same `numExperts`, table and
/// `mode` (`haloMoeMode_t`). Afterwards each rank knows, without further
/// communication, how many rows its experts receive and from where
/// (`haloMoeHandleGetLayout`). The rows are ordered by local expert (ascending id),
/// then source rank, then token index at the source.
///
/// Errors (on every rank: a rank whose routing is wrong gets `haloInvalidArgument`
/// naming what, the others `haloInvalidUsage` naming that rank; nothing is written to
/// `*handle`):
/// - `haloInvalidArgument`: NULL `comm` or `handle`; `topK` < 1; `numExperts` < 1; NULL
///   `topkIdx` with `numTokens` > 0; NULL `expertRank`; an expert id negative (DeepEP's
///   masked slot -1 is not supported), `>= numExperts`, or twice in one token; a rank in
///   `expertRank` outside the communicator; `mode` not a `haloMoeMode_t`; a non-NULL
///   `stream`.
/// - `haloInvalidUsage`: the ranks' tables or modes differ, or another rank's
///   arguments were wrong.
/// - `haloTimeout`, `haloRemoteError`, `haloSystemError`, `haloAborted`.
///
/// # Safety
/// `topkIdx` is NULL or holds `numTokens * topK` values; `expertRank` holds
/// `numExperts`; `handle` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn haloMoeHandleCreate(
    topkIdx: *const i64,
    numTokens: usize,
    topK: c_int,
    expertRank: *const i32,
    numExperts: c_int,
    mode: haloMoeMode_t,
    comm: haloComm_t,
    stream: haloStream_t,
    handle: *mut haloMoeHandle_t,
) -> haloResult_t {
    call_comm("haloMoeHandleCreate", comm, |c| {
        if handle.is_null() {
            return Err(Failure::invalid("handle is NULL"));
        }
        // A wrong argument on this rank still takes part in the exchange (with an
        // empty routing): the other ranks then fail naming this one, not by timeout.
        let checked = check_stream(stream).and_then(|_| {
            // SAFETY: as this function's contract.
            unsafe { routing_of(topkIdx, numTokens, topK, expertRank, numExperts, c.size()) }
        });
        let mode_checked = mode_from_raw(mode);
        let (ids, table, k) = checked.clone().unwrap_or_default();
        let gates = vec![1.0f32; ids.len()];
        let routing = MoeRouting {
            top_k: k.max(1),
            experts: &ids,
            gates: &gates,
            expert_rank: &table,
        };
        let precheck = checked
            .and(mode_checked.clone())
            .map(|_| ())
            .map_err(|f| halo_rs::Error::invalid_argument(f.message));
        let exchange = {
            let mut guard = c.lock()?;
            MoeExchange::route_checked(
                &mut guard,
                &routing,
                mode_checked.unwrap_or(MoeDispatch::Auto),
                precheck,
            )?
        };
        let id = NEXT.fetch_add(1, Ordering::Relaxed);
        handles().insert(
            id,
            Arc::new(MoeHandle {
                comm: comm as usize,
                exchange,
            }),
        );
        // SAFETY: not NULL (checked) and writable by the contract.
        unsafe { *handle = id };
        Ok(())
    })
}

/// The sizes of a handle's routing at this rank: `*numRecvRows` (rows its experts
/// receive, in all), `*numLocalExperts` (experts on this rank), `*numTokens` and
/// `*topK` (this rank's routing). Any pointer may be NULL. Local: no communication.
///
/// Errors: `haloInvalidArgument` when `handle` is not live or not made on `comm`.
///
/// # Safety
/// Each pointer is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn haloMoeHandleGetInfo(
    handle: haloMoeHandle_t,
    comm: haloComm_t,
    numRecvRows: *mut usize,
    numLocalExperts: *mut c_int,
    numTokens: *mut usize,
    topK: *mut c_int,
) -> haloResult_t {
    call_comm("haloMoeHandleGetInfo", comm, |_| {
        let h = lookup(handle, comm)?;
        let ex = &h.exchange;
        // SAFETY: each pointer is NULL or writable by the contract.
        unsafe {
            if !numRecvRows.is_null() {
                *numRecvRows = ex.num_rows();
            }
            if !numLocalExperts.is_null() {
                *numLocalExperts = ex.local_experts().len() as c_int;
            }
            if !numTokens.is_null() {
                *numTokens = ex.num_tokens();
            }
            if !topK.is_null() {
                *topK = ex.top_k() as c_int;
            }
        }
        Ok(())
    })
}

/// The layout of the rows a handle dispatches to this rank: `localExperts` (this
/// rank's experts, ascending; `numLocalExperts` entries), `tokensPerExpert` (rows per
/// local expert: DeepEP's `num_recv_tokens_per_expert_list`), and per received row
/// (`numRecvRows` entries each) `rowExpert` (its expert's global id), `rowSrcRank` and
/// `rowSrcToken` (where it came from). Any pointer may be NULL. Local.
///
/// Errors: `haloInvalidArgument` when `handle` is not live or not made on `comm`.
///
/// # Safety
/// Each pointer is NULL or writable for the entries above.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn haloMoeHandleGetLayout(
    handle: haloMoeHandle_t,
    comm: haloComm_t,
    localExperts: *mut i32,
    tokensPerExpert: *mut i64,
    rowExpert: *mut i32,
    rowSrcRank: *mut i32,
    rowSrcToken: *mut i64,
) -> haloResult_t {
    call_comm("haloMoeHandleGetLayout", comm, |_| {
        let h = lookup(handle, comm)?;
        let ex = &h.exchange;
        let fill = |p: *mut c_void, values: Vec<i64>, wide: bool| {
            if p.is_null() {
                return;
            }
            for (i, v) in values.into_iter().enumerate() {
                // SAFETY: writable for as many entries as the contract says; `i32`
                // entries hold values below 2^31 (ranks, experts as `c_int`).
                unsafe {
                    if wide {
                        *p.cast::<i64>().add(i) = v;
                    } else {
                        *p.cast::<i32>().add(i) = v as i32;
                    }
                }
            }
        };
        let local = ex.local_experts().iter().map(|&e| i64::from(e)).collect();
        fill(localExperts.cast(), local, false);
        let counts = ex.expert_counts().iter().map(|&c| c as i64).collect();
        fill(tokensPerExpert.cast(), counts, true);
        let experts = ex.row_experts().into_iter().map(i64::from).collect();
        fill(rowExpert.cast(), experts, false);
        let ranks = ex.origins().iter().map(|&(s, _)| i64::from(s)).collect();
        fill(rowSrcRank.cast(), ranks, false);
        let tokens = ex.origins().iter().map(|&(_, t)| i64::from(t)).collect();
        fill(rowSrcToken.cast(), tokens, true);
        Ok(())
    })
}

/// Frees a handle. Local. A handle not live (freed already, never made) is
/// `haloInvalidArgument` naming it, not undefined behaviour.
#[unsafe(no_mangle)]
pub extern "C" fn haloMoeHandleFree(handle: haloMoeHandle_t) -> haloResult_t {
    call("haloMoeHandleFree", || {
        handles()
            .remove(&handle)
            .map(|_| ())
            .ok_or_else(|| not_live(handle))
    })
}

/// Which data call, and how it is sized.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Data {
    /// Token rows in (`numTokens x hidden`), expert rows out (`numRecvRows x hidden`).
    Dispatch,
    /// Expert rows in, token rows out (summed).
    Combine,
    /// One value per (token, slot) in, one per row out.
    DispatchPairs,
    /// One value per row in, one per (token, slot) out.
    CombinePairs,
}

/// A data call's arguments, checked against the handle (sizes, NULL, alignment,
/// overlap, the type): what runs now (blocking) or on the communicator's worker
/// (`haloIMoe*`). The buffers are kept as addresses so that a queued call can move to
/// the worker.
struct DataArgs {
    what: Data,
    inp: usize,
    out: usize,
    n_in: usize,
    n_out: usize,
    hidden: usize,
    dt: haloDataType,
}

/// Checks one buffer of a data call: NULL only when it holds nothing, aligned to the
/// element type.
fn check_buffer(ptr: *const c_void, len: usize, dt: haloDataType, what: &str) -> FfiResult<()> {
    if len == 0 {
        return Ok(());
    }
    if ptr.is_null() {
        return Err(Failure::invalid(format!(
            "{what} is NULL but holds {len} elements"
        )));
    }
    if !(ptr as usize).is_multiple_of(dt.size()) {
        return Err(Failure::invalid(format!(
            "{what} is not aligned to its element type ({} bytes)",
            dt.size()
        )));
    }
    Ok(())
}

impl DataArgs {
    /// Checks a data call's arguments on `ex` (nothing is read or written).
    fn check(
        ex: &MoeExchange,
        what: Data,
        inp: *const c_void,
        out: *mut c_void,
        hidden: usize,
        dt: haloDataType,
    ) -> FfiResult<DataArgs> {
        let (n_in, n_out) = sizes(ex, what, hidden)?;
        let size = dt.size();
        no_overlap(
            inp,
            bytes_of(n_in, size, "input")?,
            out,
            bytes_of(n_out, size, "output")?,
        )?;
        if what == Data::Combine && !dt.is_float() {
            return Err(Failure::invalid(format!(
                "haloMoeCombine adds rows: datatype {dt:?} is not a floating-point type \
                 (haloFloat16, haloBfloat16, haloFloat32, haloFloat64)"
            )));
        }
        let (in_name, out_name) = match what {
            Data::Dispatch => ("x", "recvX"),
            Data::Combine => ("y", "out"),
            Data::DispatchPairs => ("perSlot", "perRow"),
            Data::CombinePairs => ("perRow", "perSlot"),
        };
        check_buffer(inp, n_in, dt, in_name)?;
        check_buffer(out, n_out, dt, out_name)?;
        Ok(DataArgs {
            what,
            inp: inp as usize,
            out: out as usize,
            n_in,
            n_out,
            hidden,
            dt,
        })
    }

    /// Runs the call on `comm` with `ex`'s routing.
    ///
    /// # Safety
    /// The buffers checked by [`DataArgs::check`] are readable (input) and writable
    /// (output) for their sizes, and nobody else accesses them until this returns.
    unsafe fn run(&self, comm: &mut Communicator, ex: &MoeExchange) -> halo_rs::Result<()> {
        let (what, hidden) = (self.what, self.hidden);
        // The combine adds rows, so only the float types have one (`$combine`); the
        // integer arms never reach theirs: refused by `check`.
        macro_rules! go {
            ($E:ty, $combine:expr) => {{
                let src: &[$E] = if self.n_in == 0 {
                    &[]
                } else {
                    // SAFETY: not NULL, aligned (checked), readable for `n_in`
                    // elements and not written meanwhile (this function's contract).
                    unsafe { std::slice::from_raw_parts(self.inp as *const $E, self.n_in) }
                };
                let got = match what {
                    Data::Dispatch => ex.dispatch_rows(comm, src, hidden)?,
                    Data::DispatchPairs => ex.dispatch_pairs(comm, src)?,
                    Data::CombinePairs => ex.combine_pairs(comm, src)?,
                    Data::Combine => $combine(comm, src)?,
                };
                if self.n_out > 0 {
                    let out = self.out as *mut $E;
                    // SAFETY: not NULL, aligned (checked), writable for `n_out`
                    // elements, disjoint from the input (checked) and accessed by
                    // nobody else (this function's contract).
                    let dst = unsafe { std::slice::from_raw_parts_mut(out, self.n_out) };
                    dst.copy_from_slice(&got);
                }
                Ok(())
            }};
            ($E:ty) => {
                go!($E, |_: &mut Communicator,
                         _: &[$E]|
                 -> halo_rs::Result<Vec<$E>> {
                    unreachable!("the combine of an integer type is refused")
                })
            };
        }
        match self.dt {
            haloDataType::haloFloat32 => go!(f32, |m: &mut Communicator, s: &[f32]| ex
                .combine_sum::<f32>(m, s, hidden)),
            haloDataType::haloFloat64 => go!(f64, |m: &mut Communicator, s: &[f64]| ex
                .combine_sum::<f64>(m, s, hidden)),
            haloDataType::haloFloat16 => {
                go!(halo_rs::f16, |m: &mut Communicator, s: &[halo_rs::f16]| {
                    ex.combine_sum::<halo_rs::f16>(m, s, hidden)
                })
            }
            haloDataType::haloBfloat16 => go!(
                halo_rs::bf16,
                |m: &mut Communicator, s: &[halo_rs::bf16]| ex
                    .combine_sum::<halo_rs::bf16>(m, s, hidden)
            ),
            haloDataType::haloInt8 => go!(i8),
            haloDataType::haloUint8 => go!(u8),
            haloDataType::haloInt32 => go!(i32),
            haloDataType::haloUint32 => go!(u32),
            haloDataType::haloInt64 => go!(i64),
            haloDataType::haloUint64 => go!(u64),
        }
    }
}

/// The handle, the type and the buffers of a data call, checked.
fn check_data(
    what: Data,
    input: *const c_void,
    output: *mut c_void,
    hidden: usize,
    datatype: haloDataType_t,
    handle: haloMoeHandle_t,
    comm: haloComm_t,
) -> FfiResult<(Arc<MoeHandle>, DataArgs)> {
    let h = lookup(handle, comm)?;
    let dt = haloDataType::from_raw(datatype)?;
    let args = DataArgs::check(&h.exchange, what, input, output, hidden, dt)?;
    Ok((h, args))
}

/// The body of the four blocking data calls.
///
/// # Safety
/// `input` / `output` are readable / writable for the sizes the call's contract says.
#[allow(clippy::too_many_arguments)]
unsafe fn data_call(
    name: &str,
    what: Data,
    input: *const c_void,
    output: *mut c_void,
    hidden: usize,
    datatype: haloDataType_t,
    handle: haloMoeHandle_t,
    comm: haloComm_t,
    stream: haloStream_t,
) -> haloResult_t {
    call_comm(name, comm, |c| {
        let checked = check_stream(stream)
            .and_then(|_| check_data(what, input, output, hidden, datatype, handle, comm));
        let (h, args) = checked.map_err(|f| refuse(c, f))?;
        let mut comm = c.lock()?;
        // SAFETY: as this function's contract.
        unsafe { args.run(&mut comm, &h.exchange) }?;
        Ok(())
    })
}

/// The body of the four non-blocking data calls (`haloIMoe*`): checks as the blocking
/// ones, then queues the call on the communicator's worker and writes its request. A
/// wrong argument is returned now and queues this rank's refusal in its place, so the
/// other ranks' requests fail naming it instead of waiting.
///
/// # Safety
/// The buffers stay readable / writable for the sizes the call's contract says, and
/// untouched by the caller, until the request completes.
#[allow(clippy::too_many_arguments)]
unsafe fn nonblocking_data_call(
    name: &'static str,
    op: &'static str,
    what: Data,
    input: *const c_void,
    output: *mut c_void,
    hidden: usize,
    datatype: haloDataType_t,
    handle: haloMoeHandle_t,
    comm: haloComm_t,
    request: *mut haloRequest_t,
) -> haloResult_t {
    call_borrowed(name, comm, |b| {
        let checked = check_request_out(request)
            .and_then(|_| check_data(what, input, output, hidden, datatype, handle, comm));
        match checked {
            Ok((h, args)) => {
                let job: OpJob = Box::new(move |comm: &mut Communicator| {
                    // SAFETY: checked by `DataArgs::check`; the buffers stay valid and
                    // untouched by the caller until the request completes, which is
                    // after this returns (this function's contract).
                    unsafe { args.run(comm, &h.exchange) }
                });
                start(b.shared(), name, op, job, request)
            }
            Err(f) => {
                let error = halo_rs::Error::invalid_argument(f.message.clone());
                // The refusal fails in this rank's queue as the other ranks' call fails
                // in theirs, so that the operations queued after it are skipped on every
                // rank alike (a queue's later operations fail after a failed one).
                let refusal: OpJob =
                    Box::new(move |comm: &mut Communicator| Err(MoeExchange::refuse(comm, error)));
                haloComm::submit(b.shared(), op, refusal)?;
                Err(f)
            }
        }
    })
}

/// A data call this rank cannot make (its arguments are wrong): it still takes part
/// in the call's agreement, so that the other ranks fail naming it instead of
/// waiting. Returns `f`.
fn refuse(c: &haloComm, f: Failure) -> Failure {
    if let Ok(mut comm) = c.lock() {
        MoeExchange::refuse(
            &mut comm,
            halo_rs::Error::invalid_argument(f.message.clone()),
        );
    }
    f
}

/// Elements in and out of a data call.
fn sizes(ex: &MoeExchange, what: Data, hidden: usize) -> FfiResult<(usize, usize)> {
    let rows = |r: usize, what: &str| {
        r.checked_mul(hidden)
            .ok_or_else(|| Failure::invalid(format!("{what}: {r} rows x hidden {hidden} overflow")))
    };
    let pairs = ex.num_tokens() * ex.top_k();
    Ok(match what {
        Data::Dispatch => (rows(ex.num_tokens(), "x")?, rows(ex.num_rows(), "recvX")?),
        Data::Combine => (rows(ex.num_rows(), "y")?, rows(ex.num_tokens(), "out")?),
        Data::DispatchPairs => (pairs, ex.num_rows()),
        Data::CombinePairs => (ex.num_rows(), pairs),
    })
}

/// Dispatches this rank's tokens along a handle's routing (DeepEP's `dispatch`): `x`
/// holds `numTokens x hidden` elements (token-major), `recvX` receives `numRecvRows x
/// hidden`, one row per (token, local expert) in the handle's layout
/// (`haloMoeHandleGetLayout`). With the handle's mode de-duplicating, each token
/// crosses the network once per destination node and is replicated inside the node.
/// Also the backward of `haloMoeCombine` (a token's gradient to each of its experts).
/// Any `haloDataType_t`. Collective: every rank calls it with the same handle (made in
/// the same `haloMoeHandleCreate`), `hidden` and `datatype`. Blocking; host buffers
/// (`stream` must be NULL: the device path of the MoE calls is not built yet).
///
/// Errors (on every rank: the others get `haloInvalidUsage` naming the rank):
/// - `haloInvalidArgument`: `handle` not live or made on another communicator; NULL,
///   unaligned or overlapping buffers; `datatype` unknown; sizes that overflow; a
///   non-NULL `stream`.
/// - `haloInvalidUsage`: ranks that call different MoE calls, on different handles, or
///   with different `hidden` or `datatype` (named: both ranks, both calls).
/// - `haloTimeout`, `haloRemoteError`, `haloSystemError`, `haloAborted`.
///
/// # Safety
/// `x` is readable and `recvX` writable for the sizes above.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn haloMoeDispatch(
    x: *const c_void,
    recvX: *mut c_void,
    hidden: usize,
    datatype: haloDataType_t,
    handle: haloMoeHandle_t,
    comm: haloComm_t,
    stream: haloStream_t,
) -> haloResult_t {
    // SAFETY: as the contract says.
    unsafe {
        data_call(
            "haloMoeDispatch",
            Data::Dispatch,
            x,
            recvX,
            hidden,
            datatype,
            handle,
            comm,
            stream,
        )
    }
}

/// Combines the experts' rows back to their tokens (DeepEP's `combine`): `y` holds
/// `numRecvRows x hidden` elements in the handle's layout, `out` receives `numTokens x
/// hidden`: for each token the **sum** of its rows (the caller weights them by the
/// gates first, as with DeepEP). De-duplicated: the rows of one token on one node are
/// added at that node before one row goes back; then the source adds the nodes' rows
/// in ascending node order (so the order of the additions is fixed by the routing and
/// the topology, the same in every run). Also the backward of `haloMoeDispatch`.
/// Floating-point types only (`haloFloat16`, `haloBfloat16`, `haloFloat32`,
/// `haloFloat64`, added in the type). Collective and blocking, host buffers; errors
/// as `haloMoeDispatch`.
///
/// # Safety
/// `y` is readable and `out` writable for the sizes above.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn haloMoeCombine(
    y: *const c_void,
    out: *mut c_void,
    hidden: usize,
    datatype: haloDataType_t,
    handle: haloMoeHandle_t,
    comm: haloComm_t,
    stream: haloStream_t,
) -> haloResult_t {
    // SAFETY: as the contract says.
    unsafe {
        data_call(
            "haloMoeCombine",
            Data::Combine,
            y,
            out,
            hidden,
            datatype,
            handle,
            comm,
            stream,
        )
    }
}

/// Sends one value per (token, slot) of this rank's routing (`perSlot`: `numTokens x
/// topK`, as `topkIdx`) to its expert's rank: `perRow` receives one per received row
/// (DeepEP's `recv_topk_weights`, for the gate weights). Any `haloDataType_t`.
/// Collective and blocking, host buffers; errors as `haloMoeDispatch`.
///
/// # Safety
/// `perSlot` is readable for `numTokens * topK` elements and `perRow` writable for
/// `numRecvRows`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn haloMoeDispatchPairs(
    perSlot: *const c_void,
    perRow: *mut c_void,
    datatype: haloDataType_t,
    handle: haloMoeHandle_t,
    comm: haloComm_t,
    stream: haloStream_t,
) -> haloResult_t {
    // SAFETY: as the contract says.
    unsafe {
        data_call(
            "haloMoeDispatchPairs",
            Data::DispatchPairs,
            perSlot,
            perRow,
            1,
            datatype,
            handle,
            comm,
            stream,
        )
    }
}

/// The reverse of `haloMoeDispatchPairs` (its backward: the gradients of the gate
/// weights): one value per received row (`perRow`) back to its (token, slot) at the
/// source (`perSlot`, `numTokens x topK`). Collective and blocking, host buffers;
/// errors as `haloMoeDispatch`.
///
/// # Safety
/// `perRow` is readable for `numRecvRows` elements and `perSlot` writable for
/// `numTokens * topK`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn haloMoeCombinePairs(
    perRow: *const c_void,
    perSlot: *mut c_void,
    datatype: haloDataType_t,
    handle: haloMoeHandle_t,
    comm: haloComm_t,
    stream: haloStream_t,
) -> haloResult_t {
    // SAFETY: as the contract says.
    unsafe {
        data_call(
            "haloMoeCombinePairs",
            Data::CombinePairs,
            perRow,
            perSlot,
            1,
            datatype,
            handle,
            comm,
            stream,
        )
    }
}

/// Non-blocking `haloMoeDispatch`: checks the arguments as `haloMoeDispatch` does, queues the
/// call on the communicator's worker and returns at once with a request in `*request`
/// (completed by `haloWait`, `haloWaitAll` or `haloTest`, like the other `haloI*`
/// calls; the communicator's operations run in the order they were started). The
/// buffers must not be touched until the request has completed; the handle may be
/// freed meanwhile (the request keeps the routing). A wrong argument is returned now
/// (`*request` left alone) and the other ranks' requests fail naming this rank.
/// There is no stream argument (host buffers).
///
/// # Safety
/// As `haloMoeDispatch`, for as long as the request is live; `request` is NULL or
/// writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn haloIMoeDispatch(
    x: *const c_void,
    recvX: *mut c_void,
    hidden: usize,
    datatype: haloDataType_t,
    handle: haloMoeHandle_t,
    comm: haloComm_t,
    request: *mut haloRequest_t,
) -> haloResult_t {
    // SAFETY: as the contract says.
    unsafe {
        nonblocking_data_call(
            "haloIMoeDispatch",
            "moe dispatch",
            Data::Dispatch,
            x,
            recvX,
            hidden,
            datatype,
            handle,
            comm,
            request,
        )
    }
}

/// Non-blocking `haloMoeCombine`, as `haloIMoeDispatch` is of `haloMoeDispatch`.
///
/// # Safety
/// As `haloMoeCombine`, for as long as the request is live; `request` is NULL or
/// writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn haloIMoeCombine(
    y: *const c_void,
    out: *mut c_void,
    hidden: usize,
    datatype: haloDataType_t,
    handle: haloMoeHandle_t,
    comm: haloComm_t,
    request: *mut haloRequest_t,
) -> haloResult_t {
    // SAFETY: as the contract says.
    unsafe {
        nonblocking_data_call(
            "haloIMoeCombine",
            "moe combine",
            Data::Combine,
            y,
            out,
            hidden,
            datatype,
            handle,
            comm,
            request,
        )
    }
}

/// Non-blocking `haloMoeDispatchPairs`, as `haloIMoeDispatch` is of `haloMoeDispatch`.
///
/// # Safety
/// As `haloMoeDispatchPairs`, for as long as the request is live; `request` is NULL or
/// writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn haloIMoeDispatchPairs(
    perSlot: *const c_void,
    perRow: *mut c_void,
    datatype: haloDataType_t,
    handle: haloMoeHandle_t,
    comm: haloComm_t,
    request: *mut haloRequest_t,
) -> haloResult_t {
    // SAFETY: as the contract says.
    unsafe {
        nonblocking_data_call(
            "haloIMoeDispatchPairs",
            "moe dispatch pairs",
            Data::DispatchPairs,
            perSlot,
            perRow,
            1,
            datatype,
            handle,
            comm,
            request,
        )
    }
}

/// Non-blocking `haloMoeCombinePairs`, as `haloIMoeDispatch` is of `haloMoeDispatch`.
///
/// # Safety
/// As `haloMoeCombinePairs`, for as long as the request is live; `request` is NULL or
/// writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn haloIMoeCombinePairs(
    perRow: *const c_void,
    perSlot: *mut c_void,
    datatype: haloDataType_t,
    handle: haloMoeHandle_t,
    comm: haloComm_t,
    request: *mut haloRequest_t,
) -> haloResult_t {
    // SAFETY: as the contract says.
    unsafe {
        nonblocking_data_call(
            "haloIMoeCombinePairs",
            "moe combine pairs",
            Data::CombinePairs,
            perRow,
            perSlot,
            1,
            datatype,
            handle,
            comm,
            request,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::haloResult;

    #[test]
    fn a_freed_or_unknown_handle_is_refused() {
        assert_eq!(
            haloMoeHandleFree(0),
            haloResult::haloInvalidArgument as haloResult_t
        );
        assert_eq!(
            haloMoeHandleFree(u64::MAX),
            haloResult::haloInvalidArgument as haloResult_t
        );
    }
}
