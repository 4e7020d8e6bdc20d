//! Loading without a GPU stack: typed errors that name every place tried.
//!
//! These machines have no NCCL, RCCL, CUDA or HIP (docs/ENVIRONMENT.md): the default
//! search must fail with `Unavailable` and its list; a library that loads but is not
//! NCCL must fail with `MissingSymbol`. On a machine that has them, the first test
//! checks what loaded instead.

use halo_rccl_sys::{Nccl, RcclError, Runtime, Search, candidates_nccl, candidates_runtime};

#[test]
fn the_default_search_names_every_place_tried() {
    let search = Search::from_env();
    match Nccl::load_with(&search) {
        Ok(n) => {
            // A machine with NCCL (the GPU check's): what loaded must be usable.
            assert!(n.version() >= halo_rccl_sys::MIN_NCCL_VERSION);
        }
        Err(e) => {
            let RcclError::Unavailable { what, tried } = &e else {
                panic!("expected Unavailable, got {e:?}");
            };
            assert_eq!(*what, "NCCL/RCCL");
            let places: Vec<&str> = tried.iter().map(|t| t.place.as_str()).collect();
            if search.nccl.is_none() {
                assert_eq!(places[0], "HALO_NCCL_LIBRARY");
                assert_eq!(tried[0].why, "not set");
                for c in candidates_nccl(&search) {
                    assert!(places.contains(&c.as_str()), "{c} not in {places:?}");
                }
            }
            let text = e.to_string();
            assert!(
                text.contains("librccl.so.1") || search.nccl.is_some(),
                "{text}"
            );
            assert!(
                text.contains("libnccl.so.2") || search.nccl.is_some(),
                "{text}"
            );
        }
    }
    match Runtime::load_with(&search) {
        Ok(rt) => assert!(!rt.path().is_empty()),
        Err(e) => {
            let RcclError::Unavailable { tried, .. } = &e else {
                panic!("expected Unavailable, got {e:?}");
            };
            if search.runtime.is_none() {
                assert_eq!(tried.len(), candidates_runtime(&search).len() + 1);
                assert!(e.to_string().contains("libcudart.so.12"), "{e}");
                assert!(e.to_string().contains("libamdhip64.so.6"), "{e}");
            }
        }
    }
}

#[test]
fn an_explicit_path_that_does_not_exist_is_named() {
    let search = Search {
        nccl: Some("/nonexistent/halo-test/libnccl.so.2".into()),
        runtime: Some("/nonexistent/halo-test/libcudart.so.12".into()),
        ..Search::default()
    };
    let e = Nccl::load_with(&search).unwrap_err();
    assert_eq!(
        e.tried()
            .iter()
            .map(|t| (t.place.as_str(), t.why.as_str()))
            .collect::<Vec<_>>(),
        vec![(
            "HALO_NCCL_LIBRARY=/nonexistent/halo-test/libnccl.so.2",
            "no such file"
        )]
    );
    let e = Runtime::load_with(&search).unwrap_err();
    assert!(
        e.to_string()
            .contains("/nonexistent/halo-test/libcudart.so.12 (no such file)"),
        "{e}"
    );
}

#[test]
fn a_library_that_is_not_nccl_lacks_its_symbols() {
    // libm is on every glibc system; it loads, but it is not NCCL.
    let libm = [
        "/lib/x86_64-linux-gnu/libm.so.6",
        "/usr/lib/x86_64-linux-gnu/libm.so.6",
        "/lib64/libm.so.6",
    ]
    .into_iter()
    .find(|p| std::path::Path::new(p).exists())
    .expect("libm.so.6 is installed");
    let search = Search {
        nccl: Some(libm.into()),
        runtime: Some(libm.into()),
        ..Search::default()
    };
    match Nccl::load_with(&search).unwrap_err() {
        RcclError::MissingSymbol {
            library, symbol, ..
        } => {
            assert_eq!(library, libm);
            assert_eq!(symbol, "ncclGetVersion");
        }
        other => panic!("expected MissingSymbol, got {other:?}"),
    }
    match Runtime::load_with(&search).unwrap_err() {
        RcclError::MissingSymbol { symbol, .. } => assert_eq!(symbol, "GetDeviceCount"),
        other => panic!("expected MissingSymbol, got {other:?}"),
    }
}

#[test]
fn a_file_that_is_not_a_library_reports_the_loader_message() {
    let dir = std::env::temp_dir().join(format!("halo-rccl-sys-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let fake = dir.join("libnccl.so.2");
    std::fs::write(&fake, b"not an ELF file").unwrap();
    let search = Search {
        nccl: Some(fake.clone()),
        ..Search::default()
    };
    let e = Nccl::load_with(&search).unwrap_err();
    std::fs::remove_dir_all(&dir).ok();
    let t = &e.tried()[0];
    assert_eq!(t.place, format!("HALO_NCCL_LIBRARY={}", fake.display()));
    // dlopen's own words, not libloading's generic text.
    assert!(
        t.why.contains("invalid ELF header") || t.why.contains("too short"),
        "{t}"
    );
}
