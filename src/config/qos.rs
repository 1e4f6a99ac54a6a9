//! `[engine.qos]`: the QoS settings of one engine, with their defaults and bounds. The
//! score and levels they configure are in [`crate::qos`].

use serde::Serialize;
use std::time::Duration;

/// QoS settings of one engine (`[engine.qos]`, a key left out keeps its default); defaults
/// documented per field. `qos_eviction` and `qos_probe_max_tokens` are accepted as the names
/// the issue tracker and operators use.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct QosConfig {
    /// Compute the score at all. Default true.
    pub enabled: bool,
    /// Time to first token that scores 0. Default 2 s (the seed's).
    #[serde(with = "crate::config::duration")]
    pub ttft_budget: Duration,
    /// Default 0.5 / 0.3 / 0.2.
    pub weights: Weights,
    /// KV-cache headroom at and above which memory scores 1. Default 0.10.
    pub kv_headroom_full: f64,
    /// Margin above a boundary needed to return to a better level. Default 0.05.
    pub hysteresis: f64,
    /// Consecutive scores below 0.3 before `evict`. Default 3.
    pub evict_after: u32,
    /// A held `evict` makes `/status` answer `abnormal` (`qos_eviction`). Default false.
    #[serde(alias = "qos_eviction")]
    pub eviction: bool,
    /// Time between score evaluations. Default 5 s.
    #[serde(with = "crate::config::duration")]
    pub period: Duration,
    /// Time between scrapes of the engine's `/metrics`. Default 5 s.
    #[serde(with = "crate::config::duration")]
    pub metrics_period: Duration,
    /// Inputs older than this are missing. Default 60 s.
    #[serde(with = "crate::config::duration")]
    pub max_input_age: Duration,
    /// `max_tokens` of the virtual probe; above 1 the probe streams and also measures time
    /// per output token. Default 1 (the reference's request, unchanged).
    #[serde(alias = "qos_probe_max_tokens")]
    pub probe_max_tokens: u32,
    /// Count a failed probe on a busy NPU when the engine made no progress for
    /// `stall_window` (requests running, no token advancing). Default false (reference).
    pub stall_detection: bool,
    /// Default 60 s.
    #[serde(with = "crate::config::duration")]
    pub stall_window: Duration,
    /// MindIE V6's rule: a low-usage failure is not counted while requests wait for KV-cache
    /// capacity (or while that metric is unknown). Default false (V5 parity).
    pub skip_when_capacity_waiting: bool,
}

impl Default for QosConfig {
    fn default() -> Self {
        QosConfig {
            enabled: true,
            ttft_budget: Duration::from_secs(2),
            weights: Weights::default(),
            kv_headroom_full: 0.10,
            hysteresis: 0.05,
            evict_after: 3,
            eviction: false,
            period: Duration::from_secs(5),
            metrics_period: Duration::from_secs(5),
            max_input_age: Duration::from_secs(60),
            probe_max_tokens: 1,
            stall_detection: false,
            stall_window: Duration::from_secs(60),
            skip_when_capacity_waiting: false,
        }
    }
}

impl QosConfig {
    /// Checks every value against its bound ([`bounds`]);
    /// `Err((key, message))`, the message stating the bound.
    pub(crate) fn validate(&self) -> Result<(), super::KeyError> {
        use crate::config::bounds::Shown;
        use bounds::{
            EVICT_AFTER, MAX_INPUT_AGE, METRICS_PERIOD, PERIOD, PROBE_MAX_TOKENS, STALL_WINDOW,
            TTFT_BUDGET, WEIGHT,
        };
        let w = self.weights;
        for (k, v) in [
            ("weights.latency", w.latency),
            ("weights.memory", w.memory),
            ("weights.progress", w.progress),
        ] {
            WEIGHT.check(k, v)?;
        }
        if w.latency + w.memory + w.progress <= 0.0 {
            return Err((
                "weights".to_owned(),
                "at least one weight must be above 0".to_owned(),
            ));
        }
        // Half-open ranges, in the interval notation of docs/qos.md.
        let v = self.kv_headroom_full;
        if !(v > 0.0 && v <= 1.0) {
            return Err((
                "kv_headroom_full".to_owned(),
                format!("`{}` is outside (0, 1]", v.shown()),
            ));
        }
        let v = self.hysteresis;
        if !(0.0..0.3).contains(&v) {
            return Err((
                "hysteresis".to_owned(),
                format!("`{}` is outside [0, 0.3)", v.shown()),
            ));
        }
        EVICT_AFTER.check("evict_after", self.evict_after)?;
        PROBE_MAX_TOKENS.check("probe_max_tokens", self.probe_max_tokens)?;
        TTFT_BUDGET.check("ttft_budget", self.ttft_budget)?;
        PERIOD.check("period", self.period)?;
        METRICS_PERIOD.check("metrics_period", self.metrics_period)?;
        MAX_INPUT_AGE.check("max_input_age", self.max_input_age)?;
        STALL_WINDOW.check("stall_window", self.stall_window)?;
        Ok(())
    }

    /// Age beyond which a scrape is missing: 3 scrape periods, at most `max_input_age`.
    pub(crate) fn scrape_max_age(&self) -> Duration {
        self.max_input_age.min(self.metrics_period * 3)
    }

    /// Whether the engine's `/metrics` is scraped at all.
    pub(crate) fn scrapes(&self) -> bool {
        self.enabled || self.stall_detection
    }
}

/// Component weights (defaults 0.5 / 0.3 / 0.2, as in the seed).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Weights {
    pub latency: f64,
    pub memory: f64,
    pub progress: f64,
}

impl Default for Weights {
    fn default() -> Self {
        Weights {
            latency: 0.5,
            memory: 0.3,
            progress: 0.2,
        }
    }
}

/// `[engine.qos]` bounds (checked by [`QosConfig::validate`]).
pub mod bounds {
    use crate::config::bounds::{Within, ms, secs};
    use std::time::Duration;

    pub const TTFT_BUDGET: Within<Duration> = Within::new(ms(10), secs(600));
    pub(crate) const WEIGHT: Within<f64> = Within::new(0.0, 100.0);
    pub(crate) const EVICT_AFTER: Within<u32> = Within::new(1, 1000);
    /// The streamed probe must finish within the request timeout.
    pub(crate) const PROBE_MAX_TOKENS: Within<u32> = Within::new(1, 256);
    pub const PERIOD: Within<Duration> = Within::new(ms(50), secs(600));
    pub(crate) const METRICS_PERIOD: Within<Duration> = Within::new(ms(50), secs(600));
    pub const MAX_INPUT_AGE: Within<Duration> = Within::new(ms(100), secs(3600));
    pub const STALL_WINDOW: Within<Duration> = Within::new(ms(100), secs(3600));
}
