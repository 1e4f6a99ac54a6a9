//! Talking to the engine: the HealthCollector (`/health`), the HTTP client that carries the
//! virtual request and the scrapes, the parsers of what the engine answers (its `/metrics`,
//! the server-sent events of a streamed probe), the engine's processes as `/proc` shows them
//! ([`process`]), the outcome types a probe hands to the monitor, and a failure in words
//! ([`cause`]). No policy lives here: a probe returns what happened, and [`crate::monitor`]
//! decides what it means.

pub(crate) mod cause;
pub mod engine_metrics;
pub mod health;
pub mod http;
pub mod outcome;
pub mod process;
pub(crate) mod sse;

use engine_metrics::EngineMetrics;
use outcome::ProbeResult;
use std::time::Duration;

/// Sends the virtual request (the real HTTP client, or a test double).
pub trait Prober {
    fn send(&self, timeout: Duration) -> impl Future<Output = ProbeResult> + Send;
}

/// Reads the engine's `/metrics` (HTTP in production, scripted in tests).
pub trait MetricsSource {
    /// One scrape; `Err` says why it failed (a failure is "unknown", never "bad").
    fn scrape(
        &self,
        timeout: Duration,
    ) -> impl Future<Output = Result<EngineMetrics, String>> + Send;
}
