//! What the monitor reads besides the probe's own answer: the AI Cube peak of the engine's
//! NPUs (from the sampler's ring) and the engine-side signals of the opt-in accounting rules
//! (progress from the QoS scrapes, a fresh `/metrics` read for the V6 capacity rule). Traits,
//! so the loop runs the same against the real sources and the tests' scripts.

use super::Monitor;
use crate::probe::MetricsSource;
use crate::probe::engine_metrics::EngineMetrics;
use crate::sampler::Shared;
use crate::sampler::faults::NpuFault;
use crate::window;
use std::sync::Arc;
use std::time::Duration;

/// What the monitor reads of the engine's NPUs: the AI Cube peak, and the driver's faults.
pub(crate) trait PeakSource {
    /// Peak AI Cube usage over the last `window`; `None` when unavailable.
    fn peak(&self, window: Duration) -> Option<f64>;
    /// The fault codes the driver reports now on the engine's NPUs, with their levels (a
    /// read too old to count is none). Default: none.
    fn faults(&self) -> Vec<NpuFault> {
        Vec::new()
    }
}

/// Engine-side signals for the opt-in accounting rules.
pub(crate) trait EngineSignals {
    /// How long the engine has made no forward progress (requests running, no token counter
    /// advancing), from the latest `/metrics` scrapes; `None` when it is not stalled or that
    /// is unknown.
    fn stalled_for(&self) -> Option<Duration>;
    /// How long the engine has shown no sign of life while it should be working (requests
    /// running, or its NPU busy: rule 11), from the latest `/metrics` reads; `None` when it is
    /// not quiet or that is unknown. Default: unknown.
    fn quiet_for(&self) -> Option<Duration> {
        None
    }
    /// How many requests the engine reported running at its latest `/metrics` read; `None`
    /// when unknown. Default: unknown.
    fn requests_running(&self) -> Option<f64> {
        None
    }
    /// Requests waiting for KV-cache capacity, read from the engine now (V6 rule).
    fn waiting_for_capacity(&self) -> impl Future<Output = CapacityWaiting> + Send;
    /// Whether the engine's `/health` failed at or after `since` (agent policy). Default:
    /// not known to have failed.
    fn health_failed_since(&self, _since: tokio::time::Instant) -> bool {
        false
    }
    /// The engine's sleep state and token counters, read from it now (agent policy), and the
    /// V6 capacity figure from the same read where the source has it. Default: unknown.
    fn fresh(&self) -> impl Future<Output = FreshMetrics> + Send {
        std::future::ready(FreshMetrics::default())
    }
}

/// What a fresh read of the engine's `/metrics` says for the agent policy's accounting;
/// `None` is unknown (the read failed, or the engine does not export the series).
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct FreshMetrics {
    pub asleep: Option<bool>,
    /// Prompt plus generation tokens since the engine started.
    pub tokens: Option<f64>,
    /// The V6 rule's figure from the same read, so a failure that needs both is one scrape;
    /// `None` when the source did not read it.
    pub capacity: Option<CapacityWaiting>,
}

/// What a fresh read of the engine's waiting-for-capacity figure said (V6 rule).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum CapacityWaiting {
    /// This many requests wait for KV-cache capacity.
    Waiting(f64),
    /// The scrape succeeded and has no such series: the engine does not export it.
    NotExported,
    /// The figure could not be read (scrape failed, value not a number): why.
    Unknown(String),
}

/// No engine signals: only the reference's rules apply (the opt-in rules must be off).
#[cfg(test)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct NoSignals;

#[cfg(test)]
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
pub(crate) struct RingPeaks {
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

    fn faults(&self) -> Vec<NpuFault> {
        self.devices
            .iter()
            .flat_map(|&i| self.shared.evidence_faults_of(i))
            .collect()
    }
}

/// The engine signals of the opt-in accounting rules: progress from the QoS scrapes, and a
/// fresh `/metrics` read for the V6 capacity rule.
#[derive(Debug, Clone)]
pub(crate) struct ScrapeSignals<M> {
    pub state: Arc<Monitor>,
    pub metrics: M,
}

impl<M: MetricsSource + Sync> EngineSignals for ScrapeSignals<M> {
    fn stalled_for(&self) -> Option<Duration> {
        self.state.qos.stalled_for()
    }

    fn quiet_for(&self) -> Option<Duration> {
        self.state.qos.quiet_for()
    }

    fn requests_running(&self) -> Option<f64> {
        self.state.qos.requests_running()
    }

    async fn waiting_for_capacity(&self) -> CapacityWaiting {
        let timeout = self.state.spec.timing.request_timeout;
        self.capacity_of(&self.metrics.scrape(timeout).await)
    }

    fn health_failed_since(&self, since: tokio::time::Instant) -> bool {
        self.state.health_failed_since(since)
    }

    async fn fresh(&self) -> FreshMetrics {
        // Short: the read delays the confirming re-probe.
        let timeout = self
            .state
            .spec
            .timing
            .request_timeout
            .min(Duration::from_secs(2));
        let read = self.metrics.scrape(timeout).await;
        // A fresh read is one more scrape for progress and the signs of life: the verdict
        // that follows reads them as they are now, not as the last periodic scrape left them.
        if read.is_ok() {
            self.state.qos.record_scrape(read.clone());
        }
        let capacity = Some(self.capacity_of(&read));
        match read {
            Ok(m) => FreshMetrics {
                asleep: m.asleep,
                tokens: match (m.prompt_tokens, m.generation_tokens) {
                    (None, None) => None,
                    (p, g) => Some(p.unwrap_or(0.0) + g.unwrap_or(0.0)),
                },
                capacity,
            },
            Err(_) => FreshMetrics {
                capacity,
                ..FreshMetrics::default()
            },
        }
    }
}

impl<M> ScrapeSignals<M> {
    /// The V6 rule's figure in one scrape's result.
    fn capacity_of(&self, read: &Result<EngineMetrics, String>) -> CapacityWaiting {
        match read {
            Ok(m) => match (m.waiting_for_capacity, m.sources.waiting_for_capacity) {
                (Some(w), _) => CapacityWaiting::Waiting(w),
                (None, None) => CapacityWaiting::NotExported,
                (None, Some(name)) => CapacityWaiting::Unknown(format!("{name} is not a number")),
            },
            Err(e) => {
                tracing::info!(engine = %self.state.spec.name, "cannot read requests waiting for capacity: {e}");
                CapacityWaiting::Unknown(e.clone())
            }
        }
    }
}
