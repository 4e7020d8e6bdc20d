//! The GPU check (`scripts/gpu-check.sh` runs it; issue 17). On a machine with an
//! NVIDIA GPU, the CUDA runtime and NCCL it:
//! 1. loads them and reports their versions;
//! 2. runs a one-rank communicator's `haloAllToAll` / `haloAllToAllv` on device buffers
//!    with a stream through the C ABI, and checks the bytes against a host reference
//!    and against NCCL's own `ncclAlltoAll` (where the library has one);
//! 3. runs N ranks on the one GPU with HALO's wave plans (every algorithm; the
//!    schedules grouped and proven sound as the device path does), each message a
//!    device-to-device copy on one stream (NCCL refuses two ranks on one GPU, so this
//!    step stands in for it), checks every byte, and times it with events against one
//!    device-to-device copy of the same bytes (the limit), printing the ratio.
//!
//! It writes one JSON object (the path in its first argument). Exit status: 0 all
//! checks passed, 1 a check failed, 77 skipped (no GPU, no CUDA runtime or no NCCL:
//! the reason is printed and written).
//!
//! NOT RUN ON A GPU YET: written and built without one.

#![allow(missing_docs)]

use halo::{
    haloAllToAll, haloAllToAllv, haloComm_t, haloCommDestroy, haloCommInitRank, haloGetLastError,
    haloGetUniqueId, haloUniqueId,
};
use halo_rccl_sys::{MemcpyKind, Nccl, Runtime, Stream};
use halo_rs::collectives::{
    AlgoOptions, Algorithm, Buf, BuildCtx, Layout, Region, Schedule, Step, UniformSizes, build,
    group_waves, verify_all_to_all, verify_waves,
};
use halo_rs::topology::Topology;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::ffi::{CStr, c_void};

/// `haloUint8`.
const UINT8: i32 = 1;

enum Outcome {
    Skip(String),
    Fail(String),
}

fn main() {
    if std::env::args().nth(1).as_deref() == Some("--loader-check") {
        // The script's first call: that the loader accepts this binary and its libraries.
        println!("loads");
        return;
    }
    let out = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "gpu-check.json".into());
    let mut report = json!({ "tool": "halo-gpu-check", "halo_version": env!("CARGO_PKG_VERSION") });
    let code = match run(&mut report) {
        Ok(()) => {
            report["status"] = json!("passed");
            0
        }
        Err(Outcome::Skip(why)) => {
            eprintln!("gpu-check: skipped: {why}");
            report["status"] = json!("skipped");
            report["skipped"] = json!(why);
            77
        }
        Err(Outcome::Fail(why)) => {
            eprintln!("gpu-check: FAILED: {why}");
            report["status"] = json!("failed");
            report["failed"] = json!(why);
            1
        }
    };
    let text = serde_json::to_string_pretty(&report).expect("JSON");
    if let Err(e) = std::fs::write(&out, format!("{text}\n")) {
        eprintln!("gpu-check: cannot write {out}: {e}");
        std::process::exit(1);
    }
    println!("{text}");
    std::process::exit(code);
}

fn fail(what: impl std::fmt::Display) -> Outcome {
    Outcome::Fail(what.to_string())
}

fn run(report: &mut Value) -> Result<(), Outcome> {
    // 0. The machine as HALO's discovery reads it (issue 33): on an NVIDIA machine,
    // NVML's NVLink links and its `sources` note, recorded once on a real driver. Never
    // a failure of the check.
    report["discovery"] = match halo_rs::topology::discover::discover() {
        Ok(m) => json!({
            "sources": m.sources,
            "gpus": m.gpus.iter().map(|g| g.pci_bus_id.clone()).collect::<Vec<_>>(),
            "gpu_links": serde_json::to_value(&m.gpu_links).unwrap_or(Value::Null),
        }),
        Err(e) => json!({ "error": e.to_string() }),
    };
    // 1. Versions.
    let info = halo_rs::device::probe().map_err(|e| Outcome::Skip(e.to_string()))?;
    if info.devices == 0 {
        return Err(Outcome::Skip("the CUDA runtime sees no GPU".into()));
    }
    report["versions"] = json!({
        "runtime": format!("{:?} {} ({})", info.flavor, info.runtime_version, info.runtime_path),
        "driver": info.driver_version,
        "devices": info.devices,
        "nccl": format!("{} ({})", info.nccl_version, info.nccl_path),
        "nccl_all_to_all": info.nccl_all_to_all,
    });
    let rt = Runtime::load().map_err(fail)?;
    let nccl = Nccl::load().map_err(fail)?;
    rt.set_device(0).map_err(fail)?;
    let stream = rt.stream_create().map_err(fail)?;

    // 2. One rank through the C ABI.
    let mut one = Vec::new();
    let mut failures = Vec::new();
    let comm = one_rank_comm()?;
    for bytes in [1usize, 4096, 1 << 20] {
        let r = one_rank(&rt, &nccl, comm, stream, bytes);
        if let Some(f) = r.get("failure") {
            failures.push(format!("one rank, {bytes} bytes: {f}"));
        }
        one.push(r);
    }
    // SAFETY: a live communicator, destroyed once.
    unsafe { haloCommDestroy(comm) };
    report["one_rank_c_abi"] = json!(one);

    // 3. N ranks on one GPU.
    let ranks: usize = std::env::var("HALO_GPU_CHECK_RANKS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8);
    let topo = Topology::preset(&format!("nodes:2x{}", ranks.div_ceil(2)))
        .and_then(|t| {
            if t.size() == ranks {
                Ok(t)
            } else {
                Topology::preset(&format!("flat:{ranks}"))
            }
        })
        .map_err(fail)?;
    let mut threads = Vec::new();
    for block in [4096usize, 1 << 20] {
        for algo in Algorithm::ALL {
            let r = n_ranks_one_gpu(&rt, stream, &topo, algo, block);
            if let Some(f) = r.get("failure") {
                failures.push(format!("{algo}, {ranks} ranks, {block} bytes: {f}"));
            }
            threads.push(r);
        }
    }
    report["ranks_on_one_gpu"] = json!(threads);
    // SAFETY: created above, used only in this function, synchronised in every step.
    unsafe { rt.stream_destroy(stream) }.map_err(fail)?;
    if failures.is_empty() {
        Ok(())
    } else {
        Err(Outcome::Fail(failures.join("; ")))
    }
}

fn last_error(comm: haloComm_t) -> String {
    // SAFETY: haloGetLastError returns a valid NUL-terminated string (never NULL).
    unsafe { CStr::from_ptr(haloGetLastError(comm)) }
        .to_string_lossy()
        .into_owned()
}

fn one_rank_comm() -> Result<haloComm_t, Outcome> {
    let mut id = std::mem::MaybeUninit::<haloUniqueId>::uninit();
    // SAFETY: writes one id.
    let rc = unsafe { haloGetUniqueId(id.as_mut_ptr()) };
    if rc != 0 {
        return Err(fail(format!(
            "haloGetUniqueId: {}",
            last_error(std::ptr::null_mut())
        )));
    }
    // SAFETY: initialised by the successful call above.
    let id = unsafe { id.assume_init() };
    let mut comm: haloComm_t = std::ptr::null_mut();
    // SAFETY: writes one handle.
    let rc = unsafe { haloCommInitRank(&mut comm, 1, id, 0) };
    if rc != 0 {
        return Err(fail(format!(
            "haloCommInitRank: {}",
            last_error(std::ptr::null_mut())
        )));
    }
    Ok(comm)
}

/// Device memory freed on drop.
struct DevBuf<'a> {
    rt: &'a Runtime,
    ptr: *mut c_void,
    len: usize,
}

impl<'a> DevBuf<'a> {
    fn new(rt: &'a Runtime, len: usize) -> Result<Self, String> {
        Ok(DevBuf {
            rt,
            ptr: rt.malloc(len).map_err(|e| e.to_string())?,
            len,
        })
    }
    fn upload(&self, host: &[u8]) -> Result<(), String> {
        assert!(host.len() <= self.len);
        // SAFETY: `ptr` holds `len` >= host.len() bytes of device memory.
        unsafe {
            self.rt.memcpy(
                self.ptr,
                host.as_ptr().cast(),
                host.len(),
                MemcpyKind::HostToDevice,
            )
        }
        .map_err(|e| e.to_string())
    }
    fn download(&self, len: usize) -> Result<Vec<u8>, String> {
        let mut v = vec![0u8; len];
        // SAFETY: as above, device to host into a buffer of `len` bytes.
        unsafe {
            self.rt.memcpy(
                v.as_mut_ptr().cast(),
                self.ptr,
                len,
                MemcpyKind::DeviceToHost,
            )
        }
        .map_err(|e| e.to_string())?;
        Ok(v)
    }
}

impl Drop for DevBuf<'_> {
    fn drop(&mut self) {
        // SAFETY: allocated by this runtime; every use was synchronised.
        let _ = unsafe { self.rt.free(self.ptr) };
    }
}

fn pattern(len: usize, salt: usize) -> Vec<u8> {
    (0..len)
        .map(|i| ((i * 131 + salt * 17 + i / 251) % 251) as u8)
        .collect()
}

fn one_rank(rt: &Runtime, nccl: &Nccl, comm: haloComm_t, stream: Stream, bytes: usize) -> Value {
    let r = (|| -> Result<Value, String> {
        let send = DevBuf::new(rt, bytes)?;
        let recv = DevBuf::new(rt, bytes)?;
        let host = pattern(bytes, 1);
        send.upload(&host)?;
        recv.upload(&vec![0xEE; bytes])?;
        // SAFETY: device buffers of `bytes` bytes each; the stream is live.
        let rc = unsafe { haloAllToAll(send.ptr, recv.ptr, bytes, UINT8, comm, stream) };
        if rc != 0 {
            return Err(format!("haloAllToAll returned {rc}: {}", last_error(comm)));
        }
        // SAFETY: live stream.
        unsafe { rt.stream_synchronize(stream) }.map_err(|e| e.to_string())?;
        let got = recv.download(bytes)?;
        let a2a = if got == host {
            "ok"
        } else {
            return Err("haloAllToAll bytes differ from the host reference".into());
        };
        // all-to-all-v with one count, then with zero.
        recv.upload(&vec![0xEE; bytes])?;
        let (c, d) = ([bytes], [0usize]);
        // SAFETY: as above; the arrays hold one entry (one rank).
        let rc = unsafe {
            haloAllToAllv(
                send.ptr,
                c.as_ptr(),
                d.as_ptr(),
                recv.ptr,
                c.as_ptr(),
                d.as_ptr(),
                UINT8,
                comm,
                stream,
            )
        };
        if rc != 0 {
            return Err(format!("haloAllToAllv returned {rc}: {}", last_error(comm)));
        }
        // SAFETY: live stream.
        unsafe { rt.stream_synchronize(stream) }.map_err(|e| e.to_string())?;
        if recv.download(bytes)? != host {
            return Err("haloAllToAllv bytes differ from the host reference".into());
        }
        // NCCL's own all-to-all on the same bytes.
        let nccl_result = match nccl.all_to_all_name() {
            None => "absent".to_string(),
            Some(name) => {
                let id = nccl.unique_id().map_err(|e| e.to_string())?;
                let nc = nccl.comm_init_rank(1, &id, 0).map_err(|e| e.to_string())?;
                let ref_recv = DevBuf::new(rt, bytes)?;
                // SAFETY: device buffers of `bytes`; live communicator and stream.
                unsafe { nccl.all_to_all(send.ptr, ref_recv.ptr, bytes, nc, stream) }
                    .map_err(|e| e.to_string())?;
                // SAFETY: live stream; the communicator is destroyed once.
                unsafe {
                    rt.stream_synchronize(stream).map_err(|e| e.to_string())?;
                    nccl.comm_destroy(nc).map_err(|e| e.to_string())?;
                }
                if ref_recv.download(bytes)? != got {
                    return Err(format!("haloAllToAll and {name} differ"));
                }
                format!("{name}: identical")
            }
        };
        Ok(
            json!({ "bytes_per_peer": bytes, "haloAllToAll": a2a, "haloAllToAllv": "ok", "nccl_reference": nccl_result }),
        )
    })();
    r.unwrap_or_else(|e| json!({ "bytes_per_peer": bytes, "failure": e }))
}

fn n_ranks_one_gpu(
    rt: &Runtime,
    stream: Stream,
    topo: &Topology,
    algo: Algorithm,
    block: usize,
) -> Value {
    let n = topo.size();
    let r = (|| -> Result<Value, String> {
        let opts = AlgoOptions::default();
        let sizes = UniformSizes(block);
        let schedules: Vec<Schedule> = (0..n)
            .map(|rank| {
                build(
                    algo,
                    &BuildCtx {
                        topology: topo,
                        rank,
                        layout: Layout::Uniform { block },
                        sizes: &sizes,
                        options: &opts,
                    },
                )
            })
            .collect::<Result<_, _>>()
            .map_err(|e| e.to_string())?;
        verify_all_to_all(&schedules, topo, &sizes).map_err(|e| e.to_string())?;
        let waves = group_waves(&schedules).map_err(|e| e.to_string())?;
        let report = verify_waves(&schedules, &waves).map_err(|e| e.to_string())?;
        let total = n * block;
        let mut bufs = Vec::with_capacity(n);
        for (r, s) in schedules.iter().enumerate() {
            let send = DevBuf::new(rt, total)?;
            send.upload(&pattern(total, r + 2))?;
            let recv = DevBuf::new(rt, total)?;
            let scratch = DevBuf::new(rt, s.scratch_len().max(1))?;
            bufs.push((send, recv, scratch));
        }
        let at = |r: usize, reg: Region| -> *mut c_void {
            let b = match reg.buf {
                Buf::Send => bufs[r].0.ptr,
                Buf::Recv => bufs[r].1.ptr,
                Buf::Scratch => bufs[r].2.ptr,
            };
            b.cast::<u8>().wrapping_add(reg.offset).cast()
        };
        let mut send_of: HashMap<(u32, u32, u64), Region> = HashMap::new();
        for (r, s) in schedules.iter().enumerate() {
            for st in s.steps() {
                if let Step::Send { peer, tag, region } = *st {
                    send_of.insert((r as u32, peer, tag), region);
                }
            }
        }
        let max_waves = waves.iter().map(|w| w.len()).max().unwrap_or(0);
        // Wave by wave over every rank, on one stream: stream order puts wave k after k - 1.
        let enqueue = || -> Result<(), String> {
            for k in 0..max_waves {
                for (r, s) in schedules.iter().enumerate() {
                    let Some(w) = waves[r].waves().get(k) else {
                        continue;
                    };
                    for &c in w.copies.iter().chain(&w.messages) {
                        let (src, dst) = match s.steps()[c as usize] {
                            Step::Copy { src, dst } => (at(r, src), at(r, dst)),
                            Step::Recv { peer, tag, region } => {
                                let from = send_of[&(peer, r as u32, tag)];
                                (at(peer as usize, from), at(r, region))
                            }
                            Step::Send { .. } => continue,
                        };
                        let len = match s.steps()[c as usize] {
                            Step::Copy { src, .. } => src.len,
                            Step::Recv { region, .. } => region.len,
                            Step::Send { .. } => 0,
                        };
                        // SAFETY: regions inside the device buffers allocated above for
                        // these schedules; the stream is live.
                        unsafe {
                            rt.memcpy_async(dst, src, len, MemcpyKind::DeviceToDevice, stream)
                        }
                        .map_err(|e| e.to_string())?;
                    }
                }
            }
            Ok(())
        };
        let (e0, e1) = (
            rt.event_create().map_err(|e| e.to_string())?,
            rt.event_create().map_err(|e| e.to_string())?,
        );
        let iters = 5;
        enqueue()?; // warm-up, and the run whose bytes are checked below
        // SAFETY: live stream and events (destroyed at the end).
        let halo_ms = unsafe {
            rt.event_record(e0, stream).map_err(|e| e.to_string())?;
            for _ in 0..iters {
                enqueue()?;
            }
            rt.event_record(e1, stream).map_err(|e| e.to_string())?;
            rt.event_synchronize(e1).map_err(|e| e.to_string())?;
            rt.event_elapsed_ms(e0, e1).map_err(|e| e.to_string())? / iters as f32
        };
        for (me, b) in bufs.iter().enumerate() {
            let got = b.1.download(total)?;
            for q in 0..n {
                let want = &pattern(total, q + 2)[me * block..(me + 1) * block];
                if &got[q * block..(q + 1) * block] != want {
                    return Err(format!("rank {me}: the block from rank {q} is wrong"));
                }
            }
        }
        // The limit: one device-to-device copy of every byte that moves.
        let (src, dst) = (DevBuf::new(rt, n * total)?, DevBuf::new(rt, n * total)?);
        // SAFETY: device buffers of n * total bytes; live stream and events.
        let copy_ms = unsafe {
            rt.memcpy_async(
                dst.ptr,
                src.ptr,
                n * total,
                MemcpyKind::DeviceToDevice,
                stream,
            )
            .map_err(|e| e.to_string())?;
            rt.event_record(e0, stream).map_err(|e| e.to_string())?;
            for _ in 0..iters {
                rt.memcpy_async(
                    dst.ptr,
                    src.ptr,
                    n * total,
                    MemcpyKind::DeviceToDevice,
                    stream,
                )
                .map_err(|e| e.to_string())?;
            }
            rt.event_record(e1, stream).map_err(|e| e.to_string())?;
            rt.event_synchronize(e1).map_err(|e| e.to_string())?;
            let ms = rt.event_elapsed_ms(e0, e1).map_err(|e| e.to_string())? / iters as f32;
            rt.event_destroy(e0).map_err(|e| e.to_string())?;
            rt.event_destroy(e1).map_err(|e| e.to_string())?;
            ms
        };
        Ok(json!({
            "algorithm": algo.to_string(), "ranks": n, "topology": topo.name(),
            "bytes_per_pair": block, "waves": report.max_waves, "bytes": "exact",
            "halo_ms": halo_ms, "d2d_copy_ms": copy_ms,
            "ratio_to_copy": if copy_ms > 0.0 { f64::from(halo_ms / copy_ms) } else { f64::NAN },
        }))
    })();
    r.unwrap_or_else(|e| json!({ "algorithm": algo.to_string(), "ranks": n, "bytes_per_pair": block, "failure": e }))
}
