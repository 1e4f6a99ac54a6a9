//! What virtual inference reads beside a periodic probe for its accounting, and only that:
//! the driver's faults, a fresh read of the engine's `/metrics`, the V6 capacity figure, the
//! stall and the quiet, the NPU over the whole streak.

use super::state::{Io, Known};
use crate::monitor::account::{self, Observation, Stage};
use crate::monitor::evidence::driver_faults::unanswered_worst;
use crate::monitor::inputs::{EngineSignals, FreshMetrics, PeakSource};
use crate::probe::Prober;
use crate::probe::outcome::ProbeResult;
use crate::sampler::faults::NpuFault;

/// What one periodic probe saw besides its own outcome.
pub(super) struct Seen {
    pub(super) obs: Observation,
    /// The driver's faults after the probe (agent policy; empty under the reference).
    pub(super) faults_after: Vec<NpuFault>,
    /// The engine's token counters, when they were read.
    pub(super) tokens: Option<f64>,
}

/// Reads the evidence a probe's accounting needs, and only that: the agent policy's for a
/// failure (the V6 capacity figure comes from the same read when there is one), the V6
/// capacity figure for an idle failure, the stall for a busy failure.
pub(super) async fn observe(
    io: &Io<'_, impl Prober, impl PeakSource, impl EngineSignals>,
    p: Known<'_>,
    r: &ProbeResult,
    peak: Option<f64>,
    started: tokio::time::Instant,
    since: tokio::time::Instant,
) -> Seen {
    // What either the policy in force or the shadow needs is read.
    let (t, rules) = (&io.cfg.timing, &io.cfg.reads());
    let failed = r.outcome.is_err();
    let agent_read = rules.agent.is_some() && failed;
    // The driver's faults after the probe, read once (the reference has no use for them).
    let faults_after = if rules.agent.is_some() {
        io.peaks.faults()
    } else {
        Vec::new()
    };
    let driver_fault = if agent_read {
        unanswered_worst(&faults_after, p.answered)
    } else {
        None
    };
    let fresh = if agent_read {
        io.signals.fresh().await
    } else {
        FreshMetrics::default()
    };
    let capacity = if account::needs_capacity(rules, failed, peak) {
        Some(match fresh.capacity.clone() {
            Some(c) => c,
            None => io.signals.waiting_for_capacity().await,
        })
    } else {
        None
    };
    let obs = Observation {
        stage: Stage::Periodic,
        failure: r.outcome.clone().err(),
        peak,
        // Read only when it matters: a failure on a busy NPU.
        stalled_for: (rules.stall_window.is_some()
            && failed
            && peak.is_some_and(|p| p >= rules.npu_usage_threshold))
        .then(|| io.signals.stalled_for())
        .flatten(),
        // After the fresh read: the signs of life as they are now.
        quiet_for: (agent_read
            && rules.agent.is_some_and(|a| a.progress_window.is_some())
            && peak.is_some_and(|p| p >= rules.npu_usage_threshold))
        .then(|| io.signals.quiet_for())
        .flatten(),
        since_served: p.last_served.elapsed(),
        capacity,
        count: io.state.failure_count(),
        health_failed: agent_read && io.signals.health_failed_since(started),
        asleep: fresh.asleep == Some(true),
        idle_throughout: if agent_read {
            io.peaks
                .peak(since.elapsed().max(t.window))
                .map(|p| p < rules.npu_usage_threshold)
        } else {
            None
        },
        tokens_advanced: match (p.streak_tokens, fresh.tokens) {
            (Some(before), Some(now)) => Some(now > before),
            _ => None,
        },
        last_ok_latency: p.last_ok,
        driver_fault,
    };
    Seen {
        obs,
        faults_after,
        tokens: fresh.tokens,
    }
}
