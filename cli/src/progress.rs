//! Progress bars for the long-running commands (bench sweeps, simulations at 1,024+
//! ranks, calibration), drawn on stderr with `indicatif`.
//!
//! A bar is shown only when both stdout and stderr are terminals and the command prints
//! human tables: piped output, `--json` and non-zero ranks of a job stay quiet.

use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal as _;

/// Whether this process may draw a bar: stdout and stderr are terminals.
pub fn on_terminal() -> bool {
    std::io::stdout().is_terminal() && std::io::stderr().is_terminal()
}

/// A bar of `len` steps labelled `what`, or a hidden one when `show` is false.
pub fn bar(len: usize, what: &str, show: bool) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new(len as u64);
    if let Ok(style) = ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} {elapsed}") {
        pb.set_style(style.progress_chars("=> "));
    }
    pb.set_message(what.to_string());
    pb
}
