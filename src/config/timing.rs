//! `[engine.timing]`: virtual inference's timing (the reference's V5 constants by default,
//! every one configurable), the bounds each value must lie in, and their check.

use super::bounds::Shown;
use super::{KeyError, duration};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Virtual-inference timing. Defaults equal the reference's constants (V5); every value is
/// configurable so tests can compress time. Also `[engine.timing]` as read: a key left out
/// keeps its default.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Timing {
    /// Timeout of the warm-up request. Reference: 180 s.
    #[serde(with = "duration")]
    pub warmup_timeout: Duration,
    /// Timeout of each periodic request. Reference: 5 s.
    #[serde(with = "duration")]
    pub request_timeout: Duration,
    /// AI Cube peak window. Reference: 5 s.
    #[serde(with = "duration")]
    pub window: Duration,
    /// Sleep between probes. Reference: 5 s.
    #[serde(with = "duration")]
    pub interval: Duration,
    /// Sleep between probes while the NPU is busy. Reference: 20 s.
    #[serde(with = "duration")]
    pub high_load_interval: Duration,
    /// Peak (percent) at or above which the busy interval applies. Reference: 80.
    pub high_load_threshold: f64,
    /// How often the agent probes the engine's `/health` in the background. Not in the
    /// reference (it probes on every `/status`); default 1 s.
    #[serde(with = "duration")]
    pub health_period: Duration,
    /// Overrides `health_check_config.health_collector_timeout` (whole seconds there) with
    /// any duration, so tests and the chaos suite can compress it. Default: not set.
    #[serde(with = "duration::option")]
    pub health_timeout: Option<Duration>,
    /// A `/health` that only times out is not abnormal while the engine shows it serves
    /// within this long (a periodic virtual request succeeded, or tokens advance). Default:
    /// twice `high_load_interval`; `"0s"` turns the rule off (the reference's verdict).
    #[serde(with = "duration::option")]
    pub serving_evidence_max_age: Option<Duration>,
}

impl Timing {
    /// How old evidence of serving may be to excuse a `/health` timeout (zero: never).
    pub(crate) fn serving_evidence_max_age(&self) -> Duration {
        self.serving_evidence_max_age
            .unwrap_or(self.high_load_interval * 2)
    }
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            warmup_timeout: Duration::from_secs(180),
            request_timeout: Duration::from_secs(5),
            window: Duration::from_secs(5),
            interval: Duration::from_secs(5),
            high_load_interval: Duration::from_secs(20),
            high_load_threshold: 80.0,
            health_period: Duration::from_secs(1),
            health_timeout: None,
            serving_evidence_max_age: None,
        }
    }
}

impl Timing {
    /// Bounds of `[engine.timing]`; keys are inside the table (`window`).
    pub(crate) fn validate(&self) -> Result<(), KeyError> {
        use bounds::{
            HEALTH_PERIOD, HEALTH_TIMEOUT, HIGH_LOAD_INTERVAL, HIGH_LOAD_THRESHOLD, INTERVAL,
            REQUEST_TIMEOUT, SERVING_EVIDENCE_MAX_AGE, WARMUP_TIMEOUT, WINDOW,
        };
        let key = |k: &str, m: String| Err((k.to_owned(), m));
        let t = self;
        WARMUP_TIMEOUT.check("warmup_timeout", t.warmup_timeout)?;
        REQUEST_TIMEOUT.check("request_timeout", t.request_timeout)?;
        WINDOW.check("window", t.window)?;
        INTERVAL.check("interval", t.interval)?;
        HIGH_LOAD_INTERVAL.check("high_load_interval", t.high_load_interval)?;
        HIGH_LOAD_THRESHOLD.check("high_load_threshold", t.high_load_threshold)?;
        HEALTH_PERIOD.check("health_period", t.health_period)?;
        if let Some(d) = t.health_timeout {
            HEALTH_TIMEOUT.check("health_timeout", d)?;
        }
        if let Some(d) = t.serving_evidence_max_age
            && !d.is_zero()
            && !SERVING_EVIDENCE_MAX_AGE.contains(d)
        {
            return key(
                "serving_evidence_max_age",
                format!(
                    "`{}` is outside {SERVING_EVIDENCE_MAX_AGE} (or `0s`, which turns the rule off)",
                    d.shown()
                ),
            );
        }
        Ok(())
    }
}

/// `[engine.timing]` bounds.
pub mod bounds {
    use crate::config::bounds::{Within, ms, secs};
    use std::time::Duration;

    pub const WARMUP_TIMEOUT: Within<Duration> = Within::new(secs(1), secs(3600));
    pub const REQUEST_TIMEOUT: Within<Duration> = Within::new(ms(50), secs(600));
    /// At most 10 minutes: the ring is sized at start for the longest window plus 5 s, and
    /// holds at most an hour.
    pub const WINDOW: Within<Duration> = Within::new(ms(50), secs(600));
    pub const INTERVAL: Within<Duration> = Within::new(ms(50), secs(3600));
    pub const HIGH_LOAD_INTERVAL: Within<Duration> = Within::new(ms(50), secs(3600));
    pub(crate) const HIGH_LOAD_THRESHOLD: Within<f64> = Within::new(0.0, 100.0);
    /// At least 50 ms: each period is one `GET /health` to the engine.
    pub const HEALTH_PERIOD: Within<Duration> = Within::new(ms(50), secs(60));
    pub const HEALTH_TIMEOUT: Within<Duration> = Within::new(ms(50), secs(600));
    /// Besides `0s`, which turns the rule off.
    pub(crate) const SERVING_EVIDENCE_MAX_AGE: Within<Duration> = Within::new(ms(50), secs(7200));
}
