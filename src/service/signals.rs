//! The signals the agent acts on: SIGTERM and SIGINT stop it, SIGHUP reloads the config.
//!
//! Handled from the first line of `main` ([`install_early`]), before the configuration is
//! read or the tokio runtime exists: a signal that arrives then is remembered, not fatal, and
//! [`Signals::install`] hands it on ([`Signals::early`]). Commands that do not handle signals
//! get the default actions back ([`default_actions`]).

use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use tokio::signal::unix::{Signal, SignalKind, signal};

/// What a signal asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Signalled {
    /// Stop (the signal's name).
    Stop(&'static str),
    /// Re-read the configuration.
    Reload,
}

/// Flags set by the signals since [`install_early`].
#[derive(Debug, Default)]
struct Early {
    term: Arc<AtomicBool>,
    int: Arc<AtomicBool>,
    hup: Arc<AtomicBool>,
    /// Set by [`default_actions`]: each signal then acts as if never handled.
    default: Arc<AtomicBool>,
}

static EARLY: OnceLock<Early> = OnceLock::new();

impl Early {
    fn flags(&self) -> [(i32, &Arc<AtomicBool>); 3] {
        [
            (SIGTERM, &self.term),
            (SIGINT, &self.int),
            (SIGHUP, &self.hup),
        ]
    }
}

/// Catches SIGTERM, SIGINT and SIGHUP into flags. Call first in `main`.
pub(crate) fn install_early() {
    EARLY.get_or_init(|| {
        let e = Early::default();
        for (sig, flag) in e.flags() {
            // Failures leave the default action, as before: nothing better to do this early.
            let _ = signal_hook::flag::register_conditional_default(sig, Arc::clone(&e.default));
            let _ = signal_hook::flag::register(sig, Arc::clone(flag));
        }
        e
    });
}

/// For commands that do not handle signals: the default actions again, and a signal caught
/// since [`install_early`] takes its default effect now.
pub(crate) fn default_actions() {
    if let Some(e) = EARLY.get() {
        e.default.store(true, Ordering::SeqCst);
        for (sig, flag) in e.flags() {
            if flag.load(Ordering::SeqCst) {
                let _ = signal_hook::low_level::emulate_default_handler(sig);
            }
        }
    }
}

/// Installed handlers.
#[derive(Debug)]
pub(crate) struct Signals {
    term: Signal,
    int: Signal,
    hup: Signal,
}

impl Signals {
    /// Installs the handlers (inside a tokio runtime). From here on these signals arrive
    /// through [`Signals::next`].
    pub(crate) fn install() -> std::io::Result<Signals> {
        Ok(Signals {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
            hup: signal(SignalKind::hangup())?,
        })
    }

    /// What arrived between [`install_early`] and [`Signals::install`] (a stop before a
    /// reload), taken once.
    pub(crate) fn early(&self) -> Option<Signalled> {
        let e = EARLY.get()?;
        let term = e.term.swap(false, Ordering::SeqCst);
        let int = e.int.swap(false, Ordering::SeqCst);
        let hup = e.hup.swap(false, Ordering::SeqCst);
        if term {
            Some(Signalled::Stop("SIGTERM"))
        } else if int {
            Some(Signalled::Stop("SIGINT"))
        } else {
            hup.then_some(Signalled::Reload)
        }
    }

    /// The next request.
    pub(crate) async fn next(&mut self) -> Signalled {
        tokio::select! {
            _ = self.term.recv() => Signalled::Stop("SIGTERM"),
            _ = self.int.recv() => Signalled::Stop("SIGINT"),
            _ = self.hup.recv() => Signalled::Reload,
        }
    }
}
