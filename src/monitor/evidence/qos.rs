//! The QoS loop: the engine's `/metrics` scraped every `qos.metrics_period` (the figures the
//! progress rules read, [`super::progress`]) and the score evaluated every `qos.period`; and
//! rule 9 of docs/policy.md, QoS eviction.
//!
//! Its finding: a held `evict` level with `qos.eviction` on.

use super::driver_faults::sub_health;
use super::{Finding, Kind, Loops, Rule, RuleId, Side, Source, Task};
use crate::monitor::Monitor;
use crate::monitor::inputs::{PeakSource, RingPeaks};
use crate::probe::MetricsSource;
use crate::qos::score::Level;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The QoS score and level.
pub(crate) struct Qos;

/// Rule 9: QoS eviction.
const EVICTION: Rule = Rule {
    id: RuleId(9),
    name: "qos_eviction",
    doc: "a held evict level (score below 0.3 for 3 evaluations) is abnormal",
    keys: &["qos.eviction"],
};

impl Source for Qos {
    fn name(&self) -> &'static str {
        "qos"
    }

    fn rules(&self) -> &'static [Rule] {
        &[EVICTION]
    }

    fn finding(&self, m: &Monitor, side: Side) -> Option<Finding> {
        m.qos_evicts_on(side).then_some(Finding {
            kind: Kind::QosEviction,
            rule: Some(EVICTION.id),
        })
    }

    fn reason(&self, m: &Monitor, _: &Finding) -> String {
        format!(
            "the QoS level is evict (score {}, below 0.3 for {} evaluations) and qos.eviction is on",
            m.qos
                .score()
                .map_or_else(|| "none".to_owned(), |s| format!("{s:.3}")),
            m.qos.below_evict()
        )
    }

    fn task(&self, m: &Arc<Monitor>, with: &Loops<'_>, cancel: &CancellationToken) -> Option<Task> {
        let peaks = RingPeaks {
            shared: with.shared.clone(),
            devices: m.devices.clone(),
        };
        Some(Box::pin(qos_task(
            m.clone(),
            with.client.metrics(),
            peaks,
            cancel.clone(),
        )))
    }
}

impl Monitor {
    /// `qos.eviction` is on and the QoS level is a held `evict`.
    pub(in crate::monitor) fn qos_evicts(&self) -> bool {
        self.qos_evicts_on(Side::InForce)
    }

    /// A held `evict`, with rule 9 applied by `side`.
    pub(in crate::monitor) fn qos_evicts_on(&self, side: Side) -> bool {
        self.spec
            .judging(side)
            .is_some_and(|j| j.applies(EVICTION.id.0))
            && self.qos.level() == Level::Evict
    }
}

/// Scrapes the engine's `/metrics` every `qos.metrics_period` and evaluates the QoS score
/// every `qos.period`, logging each level change, until cancelled. Does nothing when
/// neither the score nor stall detection is on.
pub(crate) async fn qos_task<M: MetricsSource>(
    state: Arc<Monitor>,
    metrics: M,
    npus: impl PeakSource,
    cancel: CancellationToken,
) {
    let q = &state.spec.qos;
    if !q.scrapes() {
        return;
    }
    let name = &state.spec.name;
    // At least 1 s even with a short period (tests), at most 5 s.
    let timeout = q
        .metrics_period
        .clamp(Duration::from_secs(1), Duration::from_secs(5));
    let mut scrape = tokio::time::interval(q.metrics_period);
    scrape.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut evaluate = tokio::time::interval(q.period);
    evaluate.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Evaluations start one period in, once there is a scrape to read.
    evaluate.reset();
    let mut failing = false;
    loop {
        tokio::select! {
            // A scrape due at the same time as an evaluation goes first: evaluate fresh data.
            biased;
            _ = cancel.cancelled() => return,
            _ = scrape.tick() => {
                let r = tokio::select! {
                    _ = cancel.cancelled() => return,
                    r = metrics.scrape(timeout) => r,
                };
                match (&r, failing) {
                    (Err(e), false) => tracing::info!(engine = %name, "cannot scrape the engine's /metrics (QoS inputs unknown until it answers): {e}"),
                    (Ok(_), true) => tracing::info!(engine = %name, "the engine's /metrics answers again"),
                    _ => {}
                }
                failing = r.is_err();
                if let Ok(m) = &r {
                    state.record_engine_start(m.process_start_time);
                }
                // Whether the NPU worked since the previous scrape: the signs of life hold
                // an engine that should be working to them.
                let busy = npus
                    .peak(q.metrics_period)
                    .map(|p| p >= state.spec.health_check_config.npu_usage_threshold);
                state.qos.record_scrape_beside(r, busy);
            }
            _ = evaluate.tick(), if q.enabled => {
                let probe = state.vi.last_probe().filter(|p| !p.warmup);
                let lowered = sub_health(&state, &npus.faults());
                let (score, _, transition) = state.qos.evaluate(q, probe.as_ref(), lowered);
                if let Some(t) = transition {
                    let score = score.map_or_else(|| "none".to_owned(), |s| format!("{s:.3}"));
                    let msg = format!("QoS level {} -> {} (score {score}: {})", t.from.as_str(), t.to.as_str(), t.why);
                    if t.to > t.from {
                        tracing::warn!(engine = %name, "{msg}");
                    } else {
                        tracing::info!(engine = %name, "{msg}");
                    }
                    if t.to == Level::Evict && q.eviction {
                        tracing::error!(engine = %name, "QoS level evict is held and qos.eviction is on: /status answers abnormal");
                    }
                }
            }
        }
    }
}
