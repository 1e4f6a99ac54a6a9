//! The signals the agent acts on: SIGTERM and SIGINT stop it, SIGHUP reloads the config.

use tokio::signal::unix::{Signal, SignalKind, signal};

/// What a signal asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request {
    /// Stop (the signal's name).
    Stop(&'static str),
    /// Re-read the configuration.
    Reload,
}

/// Installed handlers.
#[derive(Debug)]
pub struct Signals {
    term: Signal,
    int: Signal,
    hup: Signal,
}

impl Signals {
    /// Installs the handlers (inside a tokio runtime). From here on these signals no longer
    /// kill the process; they arrive through [`Signals::next`].
    pub fn install() -> std::io::Result<Signals> {
        Ok(Signals {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
            hup: signal(SignalKind::hangup())?,
        })
    }

    /// The next request.
    pub async fn next(&mut self) -> Request {
        tokio::select! {
            _ = self.term.recv() => Request::Stop("SIGTERM"),
            _ = self.int.recv() => Request::Stop("SIGINT"),
            _ = self.hup.recv() => Request::Reload,
        }
    }
}
