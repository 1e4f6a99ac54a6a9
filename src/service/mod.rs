//! Running as a system service: systemd's readiness, status and watchdog protocol
//! ([`notify`], [`systemd`]) and the signals the agent acts on ([`signals`]).

pub mod notify;
pub mod signals;
pub mod systemd;
