//! Running as a system service: systemd's readiness, status and watchdog protocol
//! ([`notify`], [`systemd`]) and the signals the agent acts on ([`signals`]).

pub(crate) mod notify;
pub(crate) mod signals;
pub(crate) mod systemd;
