//! Logging to stderr, switched on by the `HALO_DEBUG` environment variable.
//!
//! Like `NCCL_DEBUG`, `HALO_DEBUG` names how much to say:
//!
//! | `HALO_DEBUG`                  | what is printed                           |
//! |-------------------------------|-------------------------------------------|
//! | unset, empty, `warn`          | warnings and errors (the default)         |
//! | `off` / `none`                | nothing                                   |
//! | `error`                       | errors only                               |
//! | `info`                        | what HALO decided (topology, algorithms)  |
//! | `debug`                       | and why                                   |
//! | `trace`                       | everything, per message                   |
//!
//! Names are case-insensitive (`INFO` works). Anything else is taken as a
//! [`tracing_subscriber::EnvFilter`] directive, e.g. `warn,halo_topology=debug`.
//! Log lines go to stderr so that they never mix with a command's output.

use std::io::IsTerminal as _;
use tracing_subscriber::EnvFilter;

/// The environment variable read by [`init_from_env`].
pub const ENV_VAR: &str = halo_params::DEBUG.name;

/// The filter directive for a value of `HALO_DEBUG` (`None` when unset).
///
/// # Errors
/// When the value is neither a level name nor a valid filter directive; the message
/// says what was expected.
pub fn directive(value: Option<&str>) -> Result<String, String> {
    let value = value.map(str::trim).unwrap_or("");
    let level = match value.to_ascii_lowercase().as_str() {
        "" | "warn" | "warning" => "warn",
        "off" | "none" => "off",
        "error" => "error",
        "info" => "info",
        "debug" => "debug",
        "trace" => "trace",
        // A filter directive names targets (`halo_topology=debug`) or several parts; a
        // lone unknown word (`verbose`) would silently be read as a target name, so it
        // is refused.
        _ if value.contains(['=', ',']) => {
            return EnvFilter::try_new(value)
                .map(|_| value.to_string())
                .map_err(|e| not_understood(value, &e.to_string()));
        }
        _ => return Err(not_understood(value, "not a level name")),
    };
    Ok(level.to_string())
}

fn not_understood(value: &str, why: &str) -> String {
    format!(
        "{ENV_VAR}='{value}' is not understood ({why}); expected off, error, warn, info, \
         debug, trace or a filter such as 'warn,halo_topology=debug'"
    )
}

/// Installs a stderr logger filtered by `HALO_DEBUG` (see the module documentation).
///
/// An invalid value is reported on stderr and the default (warnings) is used. Does
/// nothing when a global subscriber is already installed, so calling it twice is
/// harmless.
pub fn init_from_env() {
    let value = std::env::var(ENV_VAR).ok();
    let filter = match directive(value.as_deref()) {
        Ok(d) => EnvFilter::new(d),
        Err(message) => {
            eprintln!("warning: {message}; logging warnings only");
            EnvFilter::new("warn")
        }
    };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}

#[cfg(test)]
mod tests {
    use super::directive;

    #[test]
    fn level_names() {
        assert_eq!(directive(None).unwrap(), "warn");
        assert_eq!(directive(Some("")).unwrap(), "warn");
        assert_eq!(directive(Some("INFO")).unwrap(), "info");
        assert_eq!(directive(Some(" debug ")).unwrap(), "debug");
        assert_eq!(directive(Some("Trace")).unwrap(), "trace");
        assert_eq!(directive(Some("none")).unwrap(), "off");
        assert_eq!(directive(Some("WARN")).unwrap(), "warn");
    }

    #[test]
    fn filter_directives_pass_through() {
        assert_eq!(
            directive(Some("warn,halo_topology=debug")).unwrap(),
            "warn,halo_topology=debug"
        );
    }

    #[test]
    fn nonsense_is_an_error() {
        let e = directive(Some("loud")).unwrap_err();
        assert!(e.contains("HALO_DEBUG='loud' is not understood"), "{e}");
        let e = directive(Some("halo=[")).unwrap_err();
        assert!(e.contains("HALO_DEBUG='halo=['"), "{e}");
    }
}
