//! Where the libraries are looked for, and opening the first that loads.

use crate::error::{RcclError, Result, Tried};
use libloading::Library;
use std::path::{Path, PathBuf};

/// The environment variable naming the NCCL / RCCL library to use.
pub const NCCL_ENV: &str = halo_params::NCCL_LIBRARY.name;
/// The environment variable naming the CUDA / HIP runtime library to use.
pub const RUNTIME_ENV: &str = halo_params::CUDART_LIBRARY.name;
/// Directories of the running Python interpreter's packages (`sys.path`, separated by
/// `:`): HALO's Python package sets it before it loads libhalo, so the wheels of the
/// interpreter that runs the job (a virtual environment, a user site, pyenv, conda)
/// are searched whether or not that environment is activated.
pub const PYTHON_SITE_ENV: &str = halo_params::PYTHON_SITE.name;

/// What the search looks at: the explicit paths and the Python environments' roots.
/// [`Search::from_env`] reads the process environment; tests build one by hand.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Search {
    /// `HALO_NCCL_LIBRARY`: when set, the only NCCL / RCCL library tried.
    pub nccl: Option<PathBuf>,
    /// `HALO_CUDART_LIBRARY`: when set, the only runtime library tried.
    pub runtime: Option<PathBuf>,
    /// Directories that may hold Python packages (`site-packages`, `dist-packages`).
    pub python_dirs: Vec<PathBuf>,
    /// Whether to try the usual install prefixes and the unversioned names after the
    /// sonames (true from the environment; tests that want a short list turn it off).
    pub system: bool,
}

impl Search {
    /// The search as the environment asks for it.
    pub fn from_env() -> Self {
        let path = |name: &str| {
            std::env::var_os(name)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        let mut roots: Vec<PathBuf> = Vec::new();
        for var in ["VIRTUAL_ENV", "CONDA_PREFIX"] {
            if let Some(p) = path(var) {
                roots.push(p);
            }
        }
        // The prefix of the running program (an interpreter at PREFIX/bin/python3),
        // and the user site of `pip install --user` (~/.local).
        if let Some(prefix) = std::env::current_exe()
            .ok()
            .and_then(|exe| exe.parent()?.parent().map(Path::to_path_buf))
        {
            roots.push(prefix);
        }
        if let Some(home) = path("HOME") {
            roots.push(home.join(".local"));
        }
        roots.push(PathBuf::from("/usr/local"));
        roots.push(PathBuf::from("/usr"));
        let mut python_dirs: Vec<PathBuf> = Vec::new();
        for var in [PYTHON_SITE_ENV, "PYTHONPATH"] {
            if let Some(pp) = std::env::var_os(var) {
                python_dirs
                    .extend(std::env::split_paths(&pp).filter(|p| !p.as_os_str().is_empty()));
            }
        }
        for root in roots {
            python_dirs.extend(site_dirs(&root));
        }
        let mut seen = std::collections::HashSet::new();
        python_dirs.retain(|d| seen.insert(d.clone()));
        Search {
            nccl: path(NCCL_ENV),
            runtime: path(RUNTIME_ENV),
            python_dirs,
            system: true,
        }
    }
}

/// `ROOT/lib/python3*/{site,dist}-packages` and `ROOT/lib/python3/dist-packages`.
fn site_dirs(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let lib = root.join("lib");
    let Ok(entries) = std::fs::read_dir(&lib) else {
        return out;
    };
    let mut names: Vec<PathBuf> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("python3"))
        })
        .collect();
    names.sort();
    for dir in names {
        for sub in ["site-packages", "dist-packages"] {
            let d = dir.join(sub);
            if d.is_dir() {
                out.push(d);
            }
        }
    }
    out
}

/// The NCCL / RCCL candidates in order (see the crate docs), as paths or sonames.
pub fn candidates_nccl(search: &Search) -> Vec<String> {
    if let Some(p) = &search.nccl {
        return vec![p.display().to_string()];
    }
    let mut v: Vec<String> = vec!["librccl.so.1".into(), "libnccl.so.2".into()];
    for d in &search.python_dirs {
        // NCCL's wheel (torch's CUDA builds depend on it); torch's ROCm wheels carry
        // RCCL in torch/lib.
        v.push(d.join("nvidia/nccl/lib/libnccl.so.2").display().to_string());
        v.push(d.join("torch/lib/librccl.so.1").display().to_string());
        v.push(d.join("torch/lib/librccl.so").display().to_string());
    }
    if search.system {
        v.extend(
            [
                "/opt/rocm/lib/librccl.so.1",
                "/usr/local/cuda/lib64/libnccl.so.2",
                "librccl.so",
                "libnccl.so",
            ]
            .map(String::from),
        );
    }
    v
}

/// The runtime candidates in order (HIP before CUDA, as RCCL before NCCL).
pub fn candidates_runtime(search: &Search) -> Vec<String> {
    if let Some(p) = &search.runtime {
        return vec![p.display().to_string()];
    }
    let mut v: Vec<String> = [
        "libamdhip64.so.6",
        "libamdhip64.so.5",
        "libcudart.so.13",
        "libcudart.so.12",
        "libcudart.so.11.0",
    ]
    .map(String::from)
    .to_vec();
    for d in &search.python_dirs {
        // CUDA 13 wheels keep the runtime in nvidia/cu13/lib, CUDA 12 and 11 ones in
        // nvidia/cuda_runtime/lib; torch's ROCm wheels carry HIP in torch/lib.
        v.push(
            d.join("nvidia/cu13/lib/libcudart.so.13")
                .display()
                .to_string(),
        );
        for name in ["libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0"] {
            v.push(
                d.join("nvidia/cuda_runtime/lib")
                    .join(name)
                    .display()
                    .to_string(),
            );
        }
        for name in ["libamdhip64.so.7", "libamdhip64.so.6", "libamdhip64.so"] {
            v.push(d.join("torch/lib").join(name).display().to_string());
        }
    }
    if search.system {
        v.extend(
            [
                "/opt/rocm/lib/libamdhip64.so",
                "/usr/local/cuda/lib64/libcudart.so",
                "libamdhip64.so",
                "libcudart.so",
            ]
            .map(String::from),
        );
    }
    v
}

/// Opens the first candidate that loads; the error names every one tried.
///
/// `explicit` is the environment variable that named the only candidate, if one did.
pub(crate) fn open_first(
    what: &'static str,
    candidates: &[String],
    explicit: Option<&'static str>,
) -> Result<(Library, String)> {
    let mut tried = Vec::with_capacity(candidates.len() + 1);
    if explicit.is_none() {
        // Say that the override was looked at too.
        tried.push(Tried {
            place: if what == "NCCL/RCCL" {
                NCCL_ENV
            } else {
                RUNTIME_ENV
            }
            .to_string(),
            why: "not set".into(),
        });
    }
    for c in candidates {
        let place = match explicit {
            Some(var) => format!("{var}={c}"),
            None => c.clone(),
        };
        let is_path = c.contains('/');
        if is_path && !Path::new(c).exists() {
            tried.push(Tried {
                place,
                why: "no such file".into(),
            });
            continue;
        }
        // SAFETY: loading a shared library runs its initialisers. The candidates are
        // the vendor libraries HALO looks for (or what the user named); their
        // initialisers are what any program that links them runs.
        match unsafe { Library::new(c) } {
            Ok(lib) => {
                tracing::debug!(target: "halo::device", "loaded {what} from {c}");
                return Ok((lib, c.clone()));
            }
            Err(e) => tried.push(Tried {
                place,
                why: loader_message(&e),
            }),
        }
    }
    Err(RcclError::Unavailable { what, tried })
}

/// The loader's own words (libloading's `Display` hides the `dlerror` text).
fn loader_message(e: &libloading::Error) -> String {
    match e {
        libloading::Error::DlOpen { desc } => format!("{desc:?}")
            .trim_start_matches("DlDescription(")
            .trim_end_matches(')')
            .trim_matches('"')
            .to_string(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_explicit_path_is_the_only_candidate() {
        let s = Search {
            nccl: Some("/x/libnccl.so.2".into()),
            runtime: Some("/y/libcudart.so".into()),
            python_dirs: vec!["/p".into()],
            system: true,
        };
        assert_eq!(candidates_nccl(&s), vec!["/x/libnccl.so.2".to_string()]);
        assert_eq!(candidates_runtime(&s), vec!["/y/libcudart.so".to_string()]);
    }

    #[test]
    fn the_order_is_rccl_nccl_python_then_system() {
        let s = Search {
            python_dirs: vec!["/venv/lib/python3.11/site-packages".into()],
            system: true,
            ..Search::default()
        };
        let c = candidates_nccl(&s);
        assert_eq!(c[0], "librccl.so.1");
        assert_eq!(c[1], "libnccl.so.2");
        assert_eq!(
            c[2],
            "/venv/lib/python3.11/site-packages/nvidia/nccl/lib/libnccl.so.2"
        );
        assert_eq!(c.last().unwrap(), "libnccl.so");
        let r = candidates_runtime(&s);
        assert_eq!(r[0], "libamdhip64.so.6");
        assert!(
            r.contains(
                &"/venv/lib/python3.11/site-packages/nvidia/cuda_runtime/lib/libcudart.so.12"
                    .to_string()
            )
        );
    }

    #[test]
    fn torch_wheels_are_searched_where_they_keep_their_libraries() {
        let site = "/venv/lib/python3.12/site-packages";
        let s = Search {
            python_dirs: vec![site.into()],
            system: false,
            ..Search::default()
        };
        let r = candidates_runtime(&s);
        // torch 2.15's CUDA 13 wheels: nvidia/cu13/lib/libcudart.so.13, before CUDA 12's.
        let cu13 = format!("{site}/nvidia/cu13/lib/libcudart.so.13");
        let cu12 = format!("{site}/nvidia/cuda_runtime/lib/libcudart.so.12");
        let at = |x: &str| r.iter().position(|c| c == x).unwrap();
        assert!(at(&cu13) < at(&cu12), "{r:?}");
        assert!(r.contains(&format!("{site}/torch/lib/libamdhip64.so.6")));
        let c = candidates_nccl(&s);
        assert!(c.contains(&format!("{site}/nvidia/nccl/lib/libnccl.so.2")));
        assert!(c.contains(&format!("{site}/torch/lib/librccl.so.1")));
    }

    #[test]
    fn the_running_interpreters_site_is_searched() {
        // HALO's Python package sets HALO_PYTHON_SITE; the search reads it. Checked in
        // a child process so this process's environment stays as it is.
        if std::env::var_os(halo_params::SEARCH_CHILD.name).is_some() {
            let s = Search::from_env();
            assert!(
                s.python_dirs.contains(&PathBuf::from("/opt/site-a")),
                "{:?}",
                s.python_dirs
            );
            assert!(s.python_dirs.contains(&PathBuf::from("/opt/site-b")));
            return;
        }
        let exe = std::env::current_exe().unwrap();
        let out = std::process::Command::new(exe)
            .args([
                "--exact",
                "search::tests::the_running_interpreters_site_is_searched",
                "--nocapture",
            ])
            .env(halo_params::SEARCH_CHILD.name, "1")
            .env(PYTHON_SITE_ENV, "/opt/site-a:/opt/site-b")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(String::from_utf8_lossy(&out.stdout).contains("1 passed"));
    }
}
