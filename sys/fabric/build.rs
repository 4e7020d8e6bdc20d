//! Build script of `halo-fabric-sys`.
//!
//! 1. Finds libfabric >= 1.14 with pkg-config.
//! 2. With the `regenerate` feature: runs bindgen on `wrapper.h` and rewrites the committed
//!    `src/bindings.rs` and `src/static_fns.c` (the bodies of the `static inline` calls).
//! 3. Compiles `src/static_fns.c` with `cc` and links it before libfabric.

use std::path::PathBuf;

/// Oldest libfabric whose API the committed bindings are valid for.
const MIN_LIBFABRIC: &str = "1.14";

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=wrapper.h");
    println!("cargo:rerun-if-changed=src/static_fns.c");

    let lib = match pkg_config::Config::new()
        .atleast_version(MIN_LIBFABRIC)
        .cargo_metadata(false)
        .probe("libfabric")
    {
        Ok(lib) => lib,
        Err(e) => {
            eprintln!(
                "error: libfabric >= {MIN_LIBFABRIC} not found: apt-get install libfabric-dev\n\
                 (pkg-config said: {e})"
            );
            std::process::exit(1);
        }
    };

    let manifest_dir =
        PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets it"));

    #[cfg(feature = "regenerate")]
    regenerate::run(&manifest_dir, &lib);

    let mut shim = cc::Build::new();
    shim.file(manifest_dir.join("src/static_fns.c"))
        .include(&manifest_dir)
        .warnings(true)
        .extra_warnings(true);
    for dir in &lib.include_paths {
        shim.include(dir);
    }
    // Emits the link line for the static shim; libfabric must come after it.
    shim.compile("halo_fabric_shim");

    for dir in &lib.link_paths {
        println!("cargo:rustc-link-search=native={}", dir.display());
    }
    for name in &lib.libs {
        println!("cargo:rustc-link-lib={name}");
    }
    // Visible to dependents as DEP_FABRIC_VERSION / DEP_FABRIC_INCLUDE.
    println!("cargo:version={}", lib.version);
    if let Some(dir) = lib.include_paths.first() {
        println!("cargo:include={}", dir.display());
    }
}

#[cfg(feature = "regenerate")]
mod regenerate {
    use std::collections::HashSet;
    use std::path::Path;

    use bindgen::callbacks::{IntKind, ParseCallbacks};

    /// Functions exported by libfabric.so.
    const EXPORTED_FNS: &[&str] = &[
        "fi_getinfo",
        "fi_freeinfo",
        "fi_dupinfo",
        "fi_fabric",
        "fi_strerror",
        "fi_version",
        "fi_tostr",
    ];

    /// `static inline` functions in the headers: bindgen wraps them in src/static_fns.c.
    const INLINE_FNS: &[&str] = &[
        // object lifetime and control
        "fi_allocinfo",
        "fi_close",
        "fi_control",
        "fi_domain",
        "fi_endpoint",
        "fi_ep_bind",
        "fi_enable",
        "fi_cancel",
        "fi_setopt",
        "fi_getopt",
        "fi_getname",
        // address vector
        "fi_av_open",
        "fi_av_insert",
        "fi_av_remove",
        "fi_av_lookup",
        "fi_av_straddr",
        // completion queue and wait objects
        "fi_cq_open",
        "fi_cq_read",
        "fi_cq_readfrom",
        "fi_cq_readerr",
        "fi_cq_sread",
        "fi_cq_signal",
        "fi_cq_strerror",
        "fi_wait_open",
        "fi_wait",
        "fi_trywait",
        // memory registration
        "fi_mr_reg",
        "fi_mr_regv",
        "fi_mr_regattr",
        "fi_mr_desc",
        "fi_mr_key",
        "fi_mr_bind",
        "fi_mr_enable",
        // tagged messages
        "fi_trecv",
        "fi_trecvv",
        "fi_trecvmsg",
        "fi_tsend",
        "fi_tsendv",
        "fi_tsendmsg",
        "fi_tinject",
        "fi_tsenddata",
        // untagged messages
        "fi_recv",
        "fi_recvv",
        "fi_send",
        "fi_sendv",
        "fi_inject",
    ];

    /// Types not reached through the functions' signatures that callers still need.
    const TYPES: &[&str] = &[
        "fi_context",
        "fi_context2",
        "fi_cq_entry",
        "fi_cq_msg_entry",
        "fi_cq_data_entry",
        "fi_cq_tagged_entry",
        "fi_cq_err_entry",
        "fi_msg",
        "fi_msg_tagged",
        "fi_cq_format",
        "fi_wait_obj",
        "fi_cq_wait_cond",
    ];

    /// Anonymous C enums (error numbers past 256, address formats, protocols, fid classes,
    /// control commands, ...) come out of bindgen typed as `_bindgen_ty_N`, a name that
    /// changes whenever the headers change. Their values are C `int`s: give them `c_int`
    /// and drop the numbered aliases.
    fn name_anonymous_enums(text: &str) -> String {
        const MARK: &str = "_bindgen_ty_";
        let mut out = String::with_capacity(text.len());
        for line in text.lines() {
            let t = line.trim_start();
            if t.starts_with(&format!("pub type {MARK}")) {
                continue;
            }
            let mut rest = line;
            while let Some(pos) = rest.find(MARK) {
                let (before, after) = rest.split_at(pos);
                let standalone = !before
                    .chars()
                    .next_back()
                    .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
                let digits = after[MARK.len()..]
                    .chars()
                    .take_while(char::is_ascii_digit)
                    .count();
                out.push_str(before);
                if standalone && digits > 0 {
                    out.push_str("::core::ffi::c_int");
                } else {
                    out.push_str(&after[..MARK.len() + digits]);
                }
                rest = &after[MARK.len() + digits..];
            }
            out.push_str(rest);
            out.push('\n');
        }
        out
    }

    /// Chooses Rust types for `#define` constants: error numbers are `c_int` (calls return
    /// them negated), `FI_MR_*` bits are `c_int` (`fi_domain_attr::mr_mode` is an `int`),
    /// `FI_SHARED_CONTEXT` is `usize`, every other flag is `u64` (capabilities, modes,
    /// operation flags).
    #[derive(Debug)]
    struct MacroTypes {
        errnos: HashSet<String>,
    }

    impl ParseCallbacks for MacroTypes {
        fn int_macro(&self, name: &str, _value: i64) -> Option<IntKind> {
            if name == "FI_SHARED_CONTEXT" {
                // SIZE_MAX, stored in the size_t context counts.
                Some(IntKind::Custom {
                    name: "usize",
                    is_signed: false,
                })
            } else if self.errnos.contains(name) || name.starts_with("FI_MR_") {
                Some(IntKind::Int)
            } else if name.ends_with("_VERSION") {
                Some(IntKind::U32)
            } else {
                Some(IntKind::U64)
            }
        }
    }

    pub(super) fn run(manifest_dir: &Path, lib: &pkg_config::Library) {
        let out_dir = std::path::PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets it"));
        let include = lib
            .include_paths
            .iter()
            .map(|d| d.join("rdma/fi_errno.h"))
            .chain(std::iter::once("/usr/include/rdma/fi_errno.h".into()))
            .find(|p| p.exists())
            .expect("rdma/fi_errno.h not found");
        let errno_h = std::fs::read_to_string(&include).expect("read fi_errno.h");
        let errnos = errno_h
            .lines()
            .filter_map(|l| l.trim_start().strip_prefix("#define"))
            .filter_map(|l| l.split_whitespace().next())
            .filter(|n| n.starts_with("FI_E") || *n == "FI_SUCCESS")
            .map(str::to_owned)
            .collect();

        let mut builder = bindgen::Builder::default()
            // Relative, so the generated C file includes "wrapper.h" (the build script runs
            // in the crate directory).
            .header("wrapper.h")
            .clang_args(
                lib.include_paths
                    .iter()
                    .map(|d| format!("-I{}", d.display())),
            )
            .raw_line(format!(
                "// Generated by bindgen from libfabric {} headers (wrapper.h). Do not edit:\n\
                 // cargo build -p halo-fabric-sys --features regenerate",
                lib.version
            ))
            .use_core()
            .prepend_enum_name(false)
            .default_enum_style(bindgen::EnumVariation::Consts)
            .translate_enum_integer_types(true)
            .derive_default(true)
            .layout_tests(true)
            .generate_comments(false)
            .parse_callbacks(Box::new(MacroTypes { errnos }))
            // Provider-facing operation tables: only ever reached through pointers.
            .opaque_type("fi_ops_.*")
            .opaque_type("fi_ops")
            .allowlist_var("FI_.*")
            .blocklist_item("FI_DEPRECATED_.*")
            .blocklist_item("FI_FORMAT_PRINTF")
            .blocklist_item("FI_SET_OPS_HMEM_OVERRIDE")
            .wrap_static_fns(true)
            .wrap_static_fns_path(out_dir.join("static_fns"));
        for f in EXPORTED_FNS.iter().chain(INLINE_FNS) {
            builder = builder.allowlist_function(f);
        }
        for t in TYPES {
            builder = builder.allowlist_type(t);
        }
        let bindings = builder.generate().expect("bindgen failed on wrapper.h");
        let text = name_anonymous_enums(&bindings.to_string());
        let shim =
            std::fs::read_to_string(out_dir.join("static_fns.c")).expect("read static_fns.c");
        let changed = write_if_changed(&manifest_dir.join("src/bindings.rs"), &text)
            | write_if_changed(&manifest_dir.join("src/static_fns.c"), &shim);
        if changed {
            println!(
                "cargo:warning=regenerated src/bindings.rs and src/static_fns.c from libfabric {}",
                lib.version
            );
        }
    }

    /// Writes only when the content differs, so that an unchanged regeneration does not
    /// touch the files (which would make cargo rerun this script on every build).
    fn write_if_changed(path: &Path, text: &str) -> bool {
        if std::fs::read_to_string(path).is_ok_and(|old| old == text) {
            return false;
        }
        std::fs::write(path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        true
    }
}
