//! Talking to the engine: the HealthCollector (`/health`), the HTTP client that carries the
//! virtual request and the scrapes, the server-sent events of a streamed probe, and the
//! outcome types a probe hands to the monitor. No policy lives here: a probe returns what
//! happened, and [`crate::monitor`] decides what it means.

pub mod health;
pub mod http;
pub mod outcome;
pub mod sse;

use outcome::ProbeResult;
use std::time::Duration;

/// Sends the virtual request (the real HTTP client, or a test double).
pub trait Prober {
    fn send(&self, timeout: Duration) -> impl Future<Output = ProbeResult> + Send;
}
