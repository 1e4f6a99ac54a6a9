//! What the monitor reads besides the probe's own answer: the AI Cube peak of the engine's
//! NPUs (from the sampler's ring) and the engine-side signals of the opt-in accounting rules
//! (progress from the QoS scrapes, a fresh `/metrics` read for the V6 capacity rule). Traits,
//! so the loop runs the same against the real sources and the tests' scripts.

use super::Monitor;
use crate::probe::MetricsSource;
use crate::ring::Ring;
use crate::sampler::Shared;
use crate::window;
use std::sync::Arc;
use std::time::Duration;

/// Peak AI Cube usage of the engine's NPUs over the last `window`; `None` when unavailable.
pub trait PeakSource {
    fn peak(&self, window: Duration) -> Option<f64>;
}

/// Engine-side signals for the opt-in accounting rules.
pub trait EngineSignals {
    /// How long the engine has made no forward progress (requests running, no token counter
    /// advancing), from the latest `/metrics` scrapes; `None` when it is not stalled or that
    /// is unknown.
    fn stalled_for(&self) -> Option<Duration>;
    /// Requests waiting for KV-cache capacity, read from the engine now (V6 rule).
    fn waiting_for_capacity(&self) -> impl Future<Output = CapacityWaiting> + Send;
}

/// What a fresh read of the engine's waiting-for-capacity figure said (V6 rule).
#[derive(Debug, Clone, PartialEq)]
pub enum CapacityWaiting {
    /// This many requests wait for KV-cache capacity.
    Waiting(f64),
    /// The scrape succeeded and has no such series: the engine does not export it.
    NotExported,
    /// The figure could not be read (scrape failed, value not a number): why.
    Unknown(String),
}

/// No engine signals: only the reference's rules apply (the opt-in rules must be off).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoSignals;

impl EngineSignals for NoSignals {
    fn stalled_for(&self) -> Option<Duration> {
        None
    }
    async fn waiting_for_capacity(&self) -> CapacityWaiting {
        CapacityWaiting::Unknown("no engine signals".to_owned())
    }
}

/// Peak AI Cube usage of an engine's NPUs, from the ring.
#[derive(Debug, Clone)]
pub struct RingPeaks {
    pub shared: Arc<Shared>,
    pub devices: Vec<u16>,
}

impl PeakSource for RingPeaks {
    fn peak(&self, window: Duration) -> Option<f64> {
        window::query(&self.shared.ring, &self.devices, window)
            .combined
            .peak
            .map(f64::from)
    }
}

impl RingPeaks {
    /// The ring itself.
    pub fn ring(&self) -> &Ring {
        &self.shared.ring
    }
}

/// The engine signals of the opt-in accounting rules: progress from the QoS scrapes, and a
/// fresh `/metrics` read for the V6 capacity rule.
#[derive(Debug, Clone)]
pub struct ScrapeSignals<M> {
    pub state: Arc<Monitor>,
    pub metrics: M,
}

impl<M: MetricsSource + Sync> EngineSignals for ScrapeSignals<M> {
    fn stalled_for(&self) -> Option<Duration> {
        self.state.qos.stalled_for()
    }

    async fn waiting_for_capacity(&self) -> CapacityWaiting {
        let timeout = self.state.spec.timing.request_timeout;
        match self.metrics.scrape(timeout).await {
            Ok(m) => match (m.waiting_for_capacity, m.sources.waiting_for_capacity) {
                (Some(w), _) => CapacityWaiting::Waiting(w),
                (None, None) => CapacityWaiting::NotExported,
                (None, Some(name)) => CapacityWaiting::Unknown(format!("{name} is not a number")),
            },
            Err(e) => {
                tracing::info!(engine = %self.state.spec.name, "cannot read requests waiting for capacity: {e}");
                CapacityWaiting::Unknown(e)
            }
        }
    }
}
