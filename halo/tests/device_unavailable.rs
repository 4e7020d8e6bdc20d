//! The device path on a machine without NCCL / RCCL, CUDA / HIP or a GPU (these
//! machines, docs/ENVIRONMENT.md): every device entry point returns the typed error —
//! `UnhandledDeviceError`, C code 1 — naming every place it looked, never a crash or a
//! hang. On a machine with the libraries the same tests check what was found instead.

use halo::local::{self, Emulation};
use halo::topology::Topology;
use halo::{Error, Partition};
use std::time::{Duration, Instant};

/// The libraries are absent here; a GPU machine (scripts/gpu-check.sh) takes the other arm.
fn absent() -> Option<String> {
    match halo::device::probe() {
        Ok(info) => {
            assert!(info.devices >= 1, "{info:?}");
            None
        }
        Err(Error::UnhandledDeviceError { message }) => Some(message),
        Err(other) => panic!("expected UnhandledDeviceError, got {other:?}"),
    }
}

#[test]
fn probe_names_every_place_tried() {
    let Some(message) = absent() else { return };
    assert_eq!(
        Error::UnhandledDeviceError {
            message: message.clone()
        }
        .code(),
        1
    );
    // The runtime is loaded first; its candidates are all named.
    for place in [
        "HALO_CUDART_LIBRARY",
        "libamdhip64.so.6",
        "libcudart.so.12",
        "/usr/local/cuda/lib64/libcudart.so",
        "libcudart.so",
    ] {
        assert!(message.contains(place), "{place} not named in: {message}");
    }
    assert!(
        message.contains("no CUDA/HIP runtime library could be loaded"),
        "{message}"
    );
}

#[test]
fn pointer_attributes_need_the_runtime() {
    let Some(_) = absent() else { return };
    let host = [0u8; 16];
    let e =
        halo::device::buffers_device(host.as_ptr().cast(), host[8..].as_ptr().cast()).unwrap_err();
    assert_eq!(e.code(), 1, "{e}");
    assert!(e.to_string().contains("libcudart.so.12"), "{e}");
    // Two NULL (empty) buffers need no lookup.
    assert_eq!(
        halo::device::buffers_device(std::ptr::null(), std::ptr::null()).unwrap(),
        None
    );
}

#[test]
fn device_collectives_fail_on_every_rank_with_the_places_tried() {
    let Some(_) = absent() else { return };
    let topo = Topology::preset("nodes:2x2").unwrap();
    let start = Instant::now();
    let out = local::run(&topo, Emulation::off(), |comm| {
        comm.set_timeout(Duration::from_secs(20));
        let n = comm.size();
        // Host memory stands in for device pointers: the libraries are missing, so
        // nothing dereferences them.
        let send = vec![1u8; 4 * n];
        let mut recv = vec![0u8; 4 * n];
        // SAFETY: the buffers are valid for the sizes given; without a device runtime
        // the call fails before any access.
        let a = unsafe {
            halo::c_abi::device_all_to_all(
                comm,
                send.as_ptr().cast(),
                recv.as_mut_ptr().cast(),
                4,
                1,
                std::ptr::null_mut(),
                0,
            )
        };
        let counts = vec![4usize; n];
        let part = Partition::packed(&counts);
        // SAFETY: as above.
        let v = unsafe {
            halo::c_abi::device_all_to_all_v(
                comm,
                send.as_ptr().cast(),
                &part,
                recv.as_mut_ptr().cast(),
                &part,
                1,
                std::ptr::null_mut(),
                0,
            )
        };
        // The host path still works afterwards on the same communicator.
        comm.all_to_all(&send, &mut recv)?;
        Ok((a, v, recv))
    });
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "took {:?}",
        start.elapsed()
    );
    for (r, o) in out.into_iter().enumerate() {
        let (a, v, recv) = o.unwrap_or_else(|e| panic!("rank {r}: {e}"));
        for (what, res) in [("all_to_all", a), ("all_to_all_v", v)] {
            match res {
                Err(Error::UnhandledDeviceError { message }) => {
                    assert!(
                        message.contains("libcudart.so.12")
                            && message.contains("HALO_CUDART_LIBRARY"),
                        "rank {r} {what}: {message}"
                    );
                }
                other => panic!("rank {r} {what}: expected UnhandledDeviceError, got {other:?}"),
            }
        }
        assert_eq!(
            recv,
            vec![1u8; 16],
            "rank {r}: the host path after the failures"
        );
    }
}
