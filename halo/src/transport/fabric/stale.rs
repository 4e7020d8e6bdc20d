//! The stale `shm` regions of killed processes in `/dev/shm`, which the libfabric
//! `shm` provider cannot create its region over. (Watching same-host peers' processes
//! in `/proc` is `host::proc`, shared with HALO's own rings.)

use crate::host::proc::process_start;
use std::os::unix::fs::MetadataExt as _;

/// Removes `/dev/shm/PID:N:M` — the regions the `shm` provider names after the
/// process id — that an earlier process with this process's id left behind (killed
/// before it could remove them; they are older than this process). With one in place
/// the provider cannot create this process's region: `fi_enable` fails with `EBUSY`.
/// Once per process, before its first `shm` endpoint.
pub(super) fn remove_stale_shm_regions() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let Some(start) = process_start() else {
            return;
        };
        let Ok(dir) = std::fs::read_dir("/dev/shm") else {
            return;
        };
        let prefix = format!("{}:", std::process::id());
        for entry in dir.flatten() {
            let name = entry.file_name();
            let ours = name
                .to_str()
                .and_then(|n| n.strip_prefix(&prefix))
                .is_some_and(|rest| {
                    !rest.is_empty() && rest.chars().all(|c| c.is_ascii_digit() || c == ':')
                });
            if !ours {
                continue;
            }
            // Older than this process, or mapped by no process at all (a peer of the
            // dead owner may have written to it after this process started, which moves
            // its mtime; with /dev/shm shared across PID namespaces a live process of
            // another namespace could have this id, and it would map its region).
            // Only a regular file of this user (root must not remove another user's
            // region that happens to carry this pid).
            let Ok(meta) = std::fs::symlink_metadata(entry.path()) else {
                continue;
            };
            if !meta.is_file() || meta.uid() != crate::host::files::euid() {
                continue;
            }
            let older = meta.modified().is_ok_and(|t| t < start);
            if older || !mapped_by_any_process(&entry.path()) {
                match std::fs::remove_file(entry.path()) {
                    Ok(()) => tracing::info!(
                        "removed {}, left by an earlier process with this process id",
                        entry.path().display()
                    ),
                    Err(e) => tracing::debug!("cannot remove {}: {e}", entry.path().display()),
                }
            }
        }
    });
}

/// Whether any process this one can see has `path` mapped (`/proc/*/maps`). Only
/// called for a region named after this process's id before it made any, so rarely.
fn mapped_by_any_process(path: &std::path::Path) -> bool {
    let needle = path.to_string_lossy().into_owned();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return true;
    };
    procs.flatten().any(|p| {
        p.file_name()
            .to_str()
            .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
            && std::fs::read_to_string(p.path().join("maps"))
                .is_ok_and(|maps| maps.contains(&needle))
    })
}
