//! SIGINT, SIGTERM and SIGHUP for railrun and its agents: the handler only records the signal;
//! the main loops poll [`take`] and stop the job in order.

use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};

static SIGNALLED: AtomicI32 = AtomicI32::new(0);
static COUNT: AtomicU32 = AtomicU32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    SIGNALLED.store(sig, Ordering::SeqCst);
    COUNT.fetch_add(1, Ordering::SeqCst);
}

/// Catch SIGINT, SIGTERM and SIGHUP from now on.
pub fn install() {
    use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};
    let sa = SigAction::new(
        SigHandler::Handler(on_signal),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    for s in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        // SAFETY: the handler only touches atomics.
        let _ = unsafe { sigaction(s, &sa) };
    }
}

/// The signal caught since the last call, if any.
pub fn take() -> Option<i32> {
    match SIGNALLED.swap(0, Ordering::SeqCst) {
        0 => None,
        sig => Some(sig),
    }
}

/// The signal caught and not yet [`take`]n, if any, left for the main loop: long loops (the
/// spawn loop of a node's ranks) stop early on it.
pub fn pending() -> Option<i32> {
    match SIGNALLED.load(Ordering::SeqCst) {
        0 => None,
        sig => Some(sig),
    }
}

/// How many signals were caught so far.
pub fn count() -> u32 {
    COUNT.load(Ordering::SeqCst)
}
