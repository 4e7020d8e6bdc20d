//! A posted tagged receive that is cancelled with `fi_cancel` completes with an error entry:
//! `fi_cq_read` returns -FI_EAVAIL and `fi_cq_readerr` gives `FI_ECANCELED`. Before that,
//! waiting for it with a short deadline times out rather than hanging.

mod common;

use core::ffi::c_void;
use std::time::{Duration, Instant};

use common::{Endpoint, Provider, SHM, TCP, TIMEOUT, check, getinfo, wait};
use halo_fabric_sys::*;

fn cancelled_receive(p: &Provider) {
    let info = getinfo(Some(p)).unwrap_or_else(|e| panic!("{}: {e}", p.name));
    let ep = Endpoint::open(info.first(), 64, false).unwrap_or_else(|e| panic!("{}: {e}", p.name));
    let (raw_ep, buf, desc) = (ep.ep, ep.recv_buf.as_ptr(), ep.recv_desc);
    let mut eps = [ep];
    let ctx: *mut c_void = Box::into_raw(Box::new(fi_context2::default())).cast();
    let deadline = Instant::now() + TIMEOUT;

    // SAFETY: the endpoint is enabled; buf (64 bytes, owned by the endpoint) and ctx (heap)
    // outlive the operation, which ends with the cancellation completion awaited below.
    let ret = unsafe {
        fi_trecv(
            raw_ep,
            buf.cast_mut().cast(),
            64,
            desc,
            FI_ADDR_UNSPEC,
            0xdead,
            0,
            ctx,
        )
    };
    check(ret, "fi_trecv").unwrap();

    // Nobody sends this tag: waiting gives up at its deadline instead of hanging.
    let short = Instant::now() + Duration::from_millis(50);
    let err = wait(&mut eps, 0, ctx, short, "a message nobody sends").unwrap_err();
    assert!(err.contains("timed out"), "{err}");

    // SAFETY: ctx identifies the receive just posted on this endpoint; every libfabric
    // object starts with its fid, so the cast is `&ep->fid`.
    let ret = unsafe { fi_cancel(raw_ep.cast::<fid>(), ctx) };
    check(ret as isize, "fi_cancel").unwrap();

    let c = wait(&mut eps, 0, ctx, deadline, "cancellation")
        .unwrap_or_else(|e| panic!("{}: {e}", p.name));
    assert_eq!(
        c.err,
        FI_ECANCELED,
        "{}: error entry says {} ({})",
        p.name,
        strerror(i64::from(c.err)),
        c.err
    );
    assert_ne!(c.flags & FI_RECV, 0, "flags {:#x}", c.flags);
    eprintln!(
        "{}: cancelled receive -> {} (flags {:#x})",
        p.name,
        strerror(i64::from(c.err)),
        c.flags
    );

    // Nothing else is queued.
    eps[0].progress().unwrap();
    // SAFETY: the operation has completed, the provider no longer uses ctx.
    drop(unsafe { Box::from_raw(ctx.cast::<fi_context2>()) });
}

#[test]
fn shm_cancelled_receive_reports_ecanceled() {
    cancelled_receive(&SHM);
}

#[test]
fn tcp_rxm_cancelled_receive_reports_ecanceled() {
    cancelled_receive(&TCP);
}
