//! `fi_getinfo` finds the providers HALO uses on these machines, with RDM and tagged
//! messaging, and `fi_dupinfo`/`fi_freeinfo` round-trip an entry.

mod common;

use common::{Provider, SHM, TCP, cstr, getinfo};
use halo_fabric_sys::*;

#[test]
fn rdm_tagged_lists_shm_and_tcp_rxm() {
    let list = getinfo(None).expect("fi_getinfo without a provider");
    let mut names: Vec<String> = list
        .iter()
        // SAFETY: every entry's fabric_attr is allocated by libfabric.
        .map(|i| cstr(unsafe { (*i.fabric_attr).prov_name }))
        .collect();
    names.dedup();
    eprintln!("RDM + tagged providers: {names:?}");
    for want in ["shm", "tcp;ofi_rxm"] {
        assert!(
            names.iter().any(|n| n == want),
            "{want} missing from {names:?}"
        );
    }
}

fn check_provider(p: &Provider) {
    let list = getinfo(Some(p)).unwrap_or_else(|e| panic!("{}: {e}", p.name));
    let first = list.iter().next().expect("at least one entry");
    // SAFETY: the attribute structs of an entry from fi_getinfo are all allocated.
    let (ep, dom, fab, tx) = unsafe {
        (
            &*first.ep_attr,
            &*first.domain_attr,
            &*first.fabric_attr,
            &*first.tx_attr,
        )
    };
    assert_eq!(ep.type_, FI_EP_RDM);
    assert_ne!(first.caps & FI_TAGGED, 0, "caps {:#x}", first.caps);
    assert_eq!(cstr(fab.prov_name), p.name);
    assert_eq!(dom.av_type, FI_AV_TABLE);
    eprintln!(
        "{}: fabric {} domain {} mr_mode {:#x} mode {:#x} progress control {} data {} \
         inject_size {} max_msg_size {} mem_tag_format {:#x}",
        p.name,
        cstr(fab.name),
        cstr(dom.name),
        dom.mr_mode,
        first.mode,
        dom.control_progress,
        dom.data_progress,
        tx.inject_size,
        ep.max_msg_size,
        ep.mem_tag_format,
    );

    // SAFETY: fi_dupinfo deep-copies one valid entry; the copy is freed once.
    unsafe {
        let dup = fi_dupinfo(first);
        assert!(!dup.is_null());
        assert_eq!(cstr((*(*dup).fabric_attr).prov_name), p.name);
        assert_eq!((*dup).caps, first.caps);
        fi_freeinfo(dup);
    }
}

#[test]
fn shm_offers_rdm_tagged() {
    check_provider(&SHM);
}

#[test]
fn tcp_rxm_offers_rdm_tagged() {
    check_provider(&TCP);
}
