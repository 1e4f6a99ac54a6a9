//! Virtual inference's log lines for each accounting outcome: the reference's wording, for
//! operators who grep for it, and what the agent policy adds.

use crate::monitor::account::{Accounted, Observation, Rules};
use crate::monitor::inputs::CapacityWaiting;
use crate::probe::outcome::Accounting;

/// The reference's log line for each accounting outcome (its wording, for operators who
/// grep for it).
pub(super) fn log_accounting(engine: &str, rules: &Rules, obs: &Observation, a: &Accounted) {
    let peak = obs.peak.unwrap_or_default();
    let why = a.why.as_deref().unwrap_or_default();
    match a.accounting {
        Accounting::Incremented => {
            if obs.capacity == Some(CapacityWaiting::NotExported) {
                tracing::info!(
                    engine,
                    "skip_when_capacity_waiting: the engine does not export vllm:num_requests_waiting_by_reason; counting as V5 does"
                );
            }
            tracing::warn!(
                engine,
                peak,
                "virtual inference failed while the NPU is idle. Current failure count: {}",
                count_words(rules, a.count)
            );
        }
        Accounting::IncrementedStalled => {
            let stalled = a.stalled.unwrap_or_default().as_secs_f64();
            tracing::warn!(
                engine,
                peak,
                stalled_s = stalled,
                "virtual inference failed while the NPU is busy and the engine has made no progress for {stalled:.0} s (stall detection). Current failure count: {}",
                count_words(rules, a.count)
            );
        }
        Accounting::UnchangedCapacityWaiting => tracing::info!(
            engine,
            peak,
            "virtual inference failed while the NPU is idle, but {why}; skip failure count"
        ),
        Accounting::DriverFault => tracing::error!(
            engine,
            peak,
            "virtual inference failed while {why}; the driver explains the failure"
        ),
        Accounting::NoSignOfLife => {
            tracing::error!(engine, peak, "virtual inference failed with {why}")
        }
        Accounting::UnchangedHealthFailing | Accounting::UnchangedAsleep => tracing::info!(
            engine,
            peak,
            "virtual inference failed, but {why}; skip failure count"
        ),
        Accounting::Unchanged => tracing::info!(
            engine,
            "virtual inference failed but AI Cube usage unavailable, skip failure count"
        ),
        // Why it reset (a success, or a failure on a busy NPU), so a reset can be explained.
        Accounting::Reset if obs.count > 0 => tracing::info!(
            engine,
            peak = obs.peak,
            "failure count reset from {} ({})",
            obs.count,
            if obs.failure.is_none() {
                "the request succeeded"
            } else {
                "the NPU is busy"
            }
        ),
        Accounting::Reset | Accounting::WarmUp => {}
    }
    if a.abnormal.is_some() {
        tracing::error!(engine, verdict = "abnormal", "{}", abnormal_words(rules, a));
    }
}

/// The failure count as the log shows it: the reference's `count/max`, and under the agent
/// policy the count that makes the engine abnormal when its failures are confirmed, so a
/// line saying `1/6` is not followed by an abnormal verdict at 2 unexplained.
pub(super) fn count_words(rules: &Rules, count: i64) -> String {
    let max = rules.max_failure_count;
    match rules.agent {
        Some(a) if a.confirm_failures < max => format!(
            "{count}/{max} (agent policy: abnormal at {} when confirmed)",
            a.confirm_failures
        ),
        _ => format!("{count}/{max}"),
    }
}

/// The line that says a probe made the engine abnormal: the reference's wording when the
/// count reached its maximum; else what made it abnormal sooner (agent policy).
pub(super) fn abnormal_words(rules: &Rules, a: &Accounted) -> String {
    if a.count >= rules.max_failure_count || rules.agent.is_none() {
        return format!(
            "Reach maximum failure count ({}); status is abnormal",
            a.count
        );
    }
    match a.accounting {
        Accounting::DriverFault | Accounting::NoSignOfLife => format!(
            "Abnormal at failure count {} ({}); status is abnormal",
            a.count,
            a.why.as_deref().unwrap_or_default()
        ),
        _ => format!(
            "Reach confirmed failure count ({}, agent policy: confirm_failures); status is abnormal",
            a.count
        ),
    }
}
