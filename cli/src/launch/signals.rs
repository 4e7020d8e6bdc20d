//! Ctrl-C and friends: the launcher notices them and tears down in order.

use std::sync::Arc;
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};

/// Tells a running launch to stop: set by SIGINT, SIGTERM or SIGHUP once
/// [`Interrupt::on_signals`] is installed, or by [`Interrupt::trigger`].
///
/// The launch checks it between set-up steps and while it waits for the ranks; on
/// the first request it terminates the ranks (SIGTERM, then SIGKILL after the grace
/// period) and tears the emulated cluster down; a second request skips the grace
/// period.
#[derive(Debug, Clone, Default)]
pub struct Interrupt {
    inner: Arc<State>,
}

#[derive(Debug, Default)]
struct State {
    signal: AtomicI32,
    count: AtomicUsize,
}

impl Interrupt {
    /// An interrupt that only fires through [`Interrupt::trigger`].
    pub fn new() -> Interrupt {
        Interrupt::default()
    }

    /// Catches SIGINT, SIGTERM and SIGHUP for the rest of the process's life: they no
    /// longer kill the process but fire this interrupt.
    ///
    /// The signals are blocked in the calling thread (and so in every thread it starts
    /// afterwards) and taken with `sigwait` by a dedicated thread, so no signal handler
    /// runs at all. Handlers would chain to whatever a library installed before —
    /// libfabric's PSM provider library installs a SIGINT handler that exits with
    /// status 1 — and the launcher must tear down instead. Call it from the main
    /// thread before starting others. Children get a clean signal mask (the standard
    /// library resets it before `exec`).
    pub fn on_signals() -> std::io::Result<Interrupt> {
        use nix::sys::signal::{SigSet, Signal};
        let this = Interrupt::new();
        let mut set = SigSet::empty();
        for s in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
            set.add(s);
        }
        set.thread_block().map_err(std::io::Error::from)?;
        let me = this.clone();
        std::thread::Builder::new()
            .name("halo-launch-signals".into())
            .spawn(move || {
                while let Ok(sig) = set.wait() {
                    me.trigger(sig as i32);
                }
            })?;
        Ok(this)
    }

    /// Fires the interrupt as if `signal` had arrived.
    pub fn trigger(&self, signal: i32) {
        self.inner.signal.store(signal, Ordering::SeqCst);
        self.inner.count.fetch_add(1, Ordering::SeqCst);
    }

    /// The last signal, if the interrupt has fired.
    pub fn pending(&self) -> Option<i32> {
        (self.count() > 0).then(|| self.inner.signal.load(Ordering::SeqCst))
    }

    /// How many times it fired.
    pub fn count(&self) -> usize {
        self.inner.count.load(Ordering::SeqCst)
    }
}
