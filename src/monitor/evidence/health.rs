//! The engine's `/health`: the loop that probes it every `health_period`, how each outcome is
//! judged (an excuse while the engine demonstrably serves, the agent policy's grace), the
//! re-arm after a restart, and rules 1, 2 and 3 of docs/policy.md.
//!
//! Its finding: `/health` answered before and fails now (past the grace, or refused).

use super::{Finding, Kind, Loops, Rule, RuleId, Side, Source, Task};
use crate::monitor::verdict::HealthState;
use crate::monitor::{HealthDetail, Monitor};
use crate::probe::health::{HealthCollector, HealthOutcome, HealthTransport, Transport};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio_util::sync::CancellationToken;

/// The engine's `/health`.
pub(crate) struct Health;

/// Rule 1: a `/health` failure has a grace.
const GRACE: Rule = Rule {
    id: RuleId(1),
    name: "health_grace",
    doc: "a /health failure that is not a refused connection is abnormal only once it has lasted the grace",
    keys: &["agent_policy.health_failure_grace"],
};

/// Rule 2: a dead engine is reported at once.
const REFUSED: Rule = Rule {
    id: RuleId(2),
    name: "refused_at_once",
    doc: "a refused connection (nothing listens on the engine's port) is abnormal at once, grace or not",
    keys: &[],
};

/// Rule 3: a probe failure beside a failing `/health` is not counted.
const BESIDE_FAILING: Rule = Rule {
    id: RuleId(3),
    name: "not_counted_beside_failing_health",
    doc: "a virtual request that fails while /health failed too is not counted: the grace decides",
    keys: &[],
};

impl Source for Health {
    fn name(&self) -> &'static str {
        "health"
    }

    fn rules(&self) -> &'static [Rule] {
        &[GRACE, REFUSED, BESIDE_FAILING]
    }

    fn finding(&self, m: &Monitor, side: Side) -> Option<Finding> {
        if m.health_on(side) != HealthState::Unhealthy {
            return None;
        }
        // Without rules 1 and 2 a failing /health is abnormal by the reference's own rule.
        let j = m.spec.judging(side)?;
        // The detail is read only when rule 2 applies (never under the reference).
        let refused = || m.health_detail().last_transport_error == Some(Transport::Refused);
        let rule = if j.applies(REFUSED.id.0) && refused() {
            Some(REFUSED.id)
        } else {
            j.applies(GRACE.id.0).then_some(GRACE.id)
        };
        Some(Finding {
            kind: Kind::Health,
            rule,
        })
    }

    fn reason(&self, m: &Monitor, _: &Finding) -> String {
        format!(
            "/health answered before and fails now: {}",
            m.health_detail().last_error.unwrap_or_default()
        )
    }

    fn task(&self, m: &Arc<Monitor>, with: &Loops<'_>, cancel: &CancellationToken) -> Option<Task> {
        Some(Box::pin(health_task(
            m.clone(),
            with.client.health(),
            cancel.clone(),
        )))
    }
}

/// Probes `/health` every `health_period` until cancelled.
pub(crate) async fn health_task<T: HealthTransport>(
    state: Arc<Monitor>,
    transport: T,
    cancel: CancellationToken,
) {
    let hc = &state.spec.health_check_config;
    let timeout = state
        .spec
        .timing
        .health_timeout
        .unwrap_or(Duration::from_secs(hc.health_collector_timeout));
    let mut collector = HealthCollector::new(
        transport,
        timeout,
        hc.health_collector_timeout_retry_attempts,
    )
    .answered_before(state.health_detail().has_connected);
    let period = state.spec.timing.health_period;
    loop {
        let outcome = tokio::select! {
            _ = cancel.cancelled() => return,
            o = collector.probe() => o,
        };
        state.record_health(&outcome, collector.has_connected());
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(period) => {}
        }
    }
}

impl Monitor {
    /// `/health` as the verdict reads it.
    pub(super) fn health(&self) -> HealthState {
        HealthState::from_u8(self.health.load(Ordering::Acquire))
    }

    /// `/health` as `side` judges it (the shadow's grace may differ).
    pub(in crate::monitor) fn health_on(&self, side: Side) -> HealthState {
        match side {
            Side::InForce => self.health(),
            Side::Shadow => HealthState::from_u8(self.shadow_health.load(Ordering::Acquire)),
        }
    }

    /// Whether `/health` failed at or after `since` (the agent policy's accounting).
    pub(crate) fn health_failed_since(&self, since: tokio::time::Instant) -> bool {
        self.health_detail
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .last_failure_at
            .is_some_and(|t| t >= since)
    }

    /// Copy of the `/health` details.
    pub(crate) fn health_detail(&self) -> HealthDetail {
        self.health_detail
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .detail
            .clone()
    }

    /// Evidence that the engine serves requests right now: a periodic virtual probe that
    /// succeeded within `timing.serving_evidence_max_age` (two busy intervals, 40 s, by
    /// default), or token counters advancing in the latest `/metrics` scrape. `None` when the
    /// rule is off (max age zero).
    pub(crate) fn serving_evidence(&self) -> Option<String> {
        let fresh = self.spec.timing.serving_evidence_max_age();
        if fresh.is_zero() {
            return None;
        }
        if let Some(p) = self.vi.last_probe()
            && p.success
            && !p.warmup
        {
            let age = tokio::time::Instant::now().saturating_duration_since(p.at);
            if age <= fresh {
                return Some(format!(
                    "a virtual request succeeded {:.1} s ago",
                    age.as_secs_f64()
                ));
            }
        }
        (self.qos.progress() == crate::qos::progress::State::Advancing)
            .then(|| "its token counters advance".to_owned())
    }

    /// Applies one `/health` outcome (the rules below).
    pub(crate) fn record_health(&self, outcome: &HealthOutcome, has_connected: bool) {
        let before = self.health();
        let (after, last_error) = self.update_health_detail(outcome, has_connected);
        self.set_condition(crate::monitor::gates::health_condition(
            has_connected,
            last_error.as_deref(),
        ));
        self.health.store(after.to_u8(), Ordering::Release);
        self.log_health_change(before, after, last_error);
        self.rearm_after_restart(outcome);
    }

    /// Judges `outcome` and records it in the `/health` details; returns the new state and
    /// the last error.
    fn update_health_detail(
        &self,
        outcome: &HealthOutcome,
        has_connected: bool,
    ) -> (HealthState, Option<String>) {
        let evidence_rule = !self.spec.timing.serving_evidence_max_age().is_zero();
        let excuse = excuse(outcome, evidence_rule, || self.serving_evidence());
        let now = tokio::time::Instant::now();
        let mut seen = self.health_detail.lock().unwrap_or_else(|p| p.into_inner());
        let failed = matches!(outcome, HealthOutcome::Unhealthy { .. });
        seen.failing_since = failed.then(|| seen.failing_since.unwrap_or(now));
        if failed {
            seen.last_failure_at = Some(now);
        }
        let failing_for = seen.failing_since.map(|t| now.saturating_duration_since(t));
        let d = &mut seen.detail;
        d.failing_for_ms = failing_for.map(|f| f.as_millis() as u64);
        // Rules 1 and 2, as each side applies them.
        let grace = Grace {
            grace: self.spec.agent_policy.health_failure_grace,
            failing_for: failing_for.unwrap_or_default(),
        };
        let on = |j: &crate::config::policy::Judging| Rules {
            grace: j.applies(GRACE.id.0).then_some(grace),
            refused_at_once: j.applies(REFUSED.id.0),
        };
        let after = judge(outcome, excuse.is_some(), on(&self.spec.judging.in_force));
        if let Some(shadow) = &self.spec.judging.shadow {
            let s = judge(outcome, excuse.is_some(), on(shadow));
            self.shadow_health.store(s.to_u8(), Ordering::Release);
        }
        d.probes += 1;
        d.has_connected = has_connected;
        d.last_transport_error = match outcome {
            HealthOutcome::Unhealthy {
                transport: Some(t), ..
            } => Some(*t),
            _ => None,
        };
        self.note_outcome(d, outcome, excuse, after);
        d.state = after;
        (after, d.last_error.clone())
    }

    /// The outcome's counters and last error in `d` (an excused failure says why).
    fn note_outcome(
        &self,
        d: &mut HealthDetail,
        outcome: &HealthOutcome,
        excuse: Option<String>,
        after: HealthState,
    ) {
        match outcome {
            HealthOutcome::Healthy => {
                let now_ms = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis() as u64);
                d.last_ok_unix_ms = Some(now_ms);
                d.consecutive_failures = 0;
                d.last_error = None;
            }
            HealthOutcome::Unhealthy { reason, .. } => {
                d.consecutive_failures += 1;
                match &excuse {
                    Some(why) => {
                        if d.state != after {
                            tracing::warn!(engine = %self.spec.name, "{reason}, but {why}: not abnormal");
                        }
                        d.excused_timeouts += 1;
                        d.last_error = Some(format!("{reason} (not abnormal: {why})"));
                    }
                    None => d.last_error = Some(reason.clone()),
                }
            }
            HealthOutcome::NeverConnected(e) => {
                d.consecutive_failures += 1;
                d.last_error = Some(e.clone());
            }
        }
    }

    /// Logs when the verdict's view of `/health` changes (an excused failure still answers).
    fn log_health_change(
        &self,
        before: HealthState,
        after: HealthState,
        last_error: Option<String>,
    ) {
        let name = &self.spec.name;
        let class = |h: HealthState| {
            (
                h.answers() && h != HealthState::Failing,
                h == HealthState::Unhealthy,
                h == HealthState::Failing,
            )
        };
        if class(after) == class(before) {
            return;
        }
        match after {
            HealthState::Failing => tracing::warn!(
                engine = %name,
                verdict = self.peek_status().as_str(),
                "/health fails; abnormal if it still fails after {:?} (agent_policy.health_failure_grace): {}",
                self.spec.agent_policy.health_failure_grace,
                last_error.unwrap_or_default()
            ),
            HealthState::Unhealthy => tracing::warn!(
                engine = %name,
                verdict = "abnormal",
                "/health fails: {}",
                last_error.unwrap_or_default()
            ),
            h if h.answers() => tracing::info!(
                engine = %name,
                verdict = self.peek_status().as_str(),
                "/health answers"
            ),
            _ => {}
        }
    }

    /// Re-arms virtual inference when `/health` was down after abnormal and answers again
    /// (the engine restarted).
    fn rearm_after_restart(&self, outcome: &HealthOutcome) {
        let (down, rearm) = restart(
            self.down_after_abnormal.load(Ordering::Acquire),
            outcome,
            self.vi_abnormal_in_force(),
        );
        self.down_after_abnormal.store(down, Ordering::Release);
        if rearm {
            tracing::warn!(engine = %self.spec.name, "the engine restarted (/health down, then up); virtual inference is re-armed");
            self.vi.rearm();
            self.rearms.fetch_add(1, Ordering::Relaxed);
            self.rearm_tx.send_modify(|g| *g += 1);
            self.started.store(false, Ordering::Release);
        }
    }
}

/// Why a `/health` failure is not held against the engine, if it is not.
///
/// `evidence` is the engine's evidence of serving right now (it is asked only for a
/// timeout); `evidence_rule` is false under `serving_evidence_max_age = "0s"` (the
/// reference's verdict: nothing is excused).
pub(crate) fn excuse(
    outcome: &HealthOutcome,
    evidence_rule: bool,
    evidence: impl FnOnce() -> Option<String>,
) -> Option<String> {
    if !evidence_rule {
        return None;
    }
    match outcome {
        HealthOutcome::Unhealthy {
            timed_out: true, ..
        } => evidence(),
        // The agent's own shortage says nothing about the engine.
        HealthOutcome::Unhealthy {
            transport: Some(Transport::Local),
            ..
        } => {
            Some("the agent itself could not make the request (out of file descriptors)".to_owned())
        }
        _ => None,
    }
}

/// The agent policy's `/health` grace, as it stands at one outcome.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Grace {
    /// `agent_policy.health_failure_grace`.
    pub grace: std::time::Duration,
    /// How long `/health` has failed without a healthy answer, this outcome included.
    pub failing_for: std::time::Duration,
}

/// Rules 1 and 2 as one side applies them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Rules {
    /// Rule 1's grace (`None`: the reference's verdict, every failure at once).
    pub grace: Option<Grace>,
    /// Rule 2: a refused connection is abnormal at once, grace or not.
    pub refused_at_once: bool,
}

#[cfg(test)]
impl Rules {
    /// The reference's: no grace.
    pub(crate) const REFERENCE: Rules = Rules {
        grace: None,
        refused_at_once: true,
    };
}

/// The `/health` state after one outcome, given its [`excuse`] and the [`Rules`] in force.
pub(crate) fn judge(outcome: &HealthOutcome, excused: bool, rules: Rules) -> HealthState {
    let grace = rules.grace;
    match outcome {
        HealthOutcome::Healthy => HealthState::Healthy,
        HealthOutcome::Unhealthy {
            timed_out: true, ..
        } if excused => HealthState::Slow,
        HealthOutcome::Unhealthy { .. } if excused => HealthState::AgentError,
        // Nothing listens: the engine process is gone, which is reported at once (rule 2).
        HealthOutcome::Unhealthy {
            transport: Some(Transport::Refused),
            ..
        } if rules.refused_at_once => HealthState::Unhealthy,
        HealthOutcome::Unhealthy { .. } if grace.is_some_and(|g| g.failing_for < g.grace) => {
            HealthState::Failing
        }
        HealthOutcome::Unhealthy { .. } => HealthState::Unhealthy,
        HealthOutcome::NeverConnected(_) => HealthState::NeverAnswered,
    }
}

/// Restart detection, one `/health` outcome at a time: after virtual inference went
/// abnormal, `/health` refused (the engine process is gone) and then answered for real —
/// the engine restarted, and virtual inference is re-armed. A timeout, an HTTP error or a
/// garbled answer is not the "down" half; an excused timeout is not the "up" half.
///
/// `down` is whether the "down" half was seen; returns (`down` after, re-arm now).
pub(crate) fn restart(down: bool, outcome: &HealthOutcome, vi_abnormal: bool) -> (bool, bool) {
    match outcome {
        HealthOutcome::Unhealthy {
            unreachable: true, ..
        } => (down || vi_abnormal, false),
        HealthOutcome::Healthy => (false, down && vi_abnormal),
        _ => (down, false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use HealthState::*;

    fn outcome(o: &str) -> HealthOutcome {
        let unhealthy = |unreachable, timed_out, transport| HealthOutcome::Unhealthy {
            reason: o.into(),
            unreachable,
            timed_out,
            transport,
        };
        match o {
            "ok" => HealthOutcome::Healthy,
            "refused" => unhealthy(true, false, Some(Transport::Refused)),
            "timeout" => unhealthy(false, true, None),
            "503" => unhealthy(false, false, None),
            "false" => unhealthy(false, false, None),
            "emfile" => unhealthy(false, false, Some(Transport::Local)),
            "reset" => unhealthy(false, false, Some(Transport::Reset)),
            _ => HealthOutcome::NeverConnected(o.into()),
        }
    }

    // the reference's (`serving_evidence_max_age = "0s"`) → the /health state.
    #[test]
    fn health_table() {
        let rows = [
            ("ok", true, true, Healthy),
            ("ok", false, false, Healthy),
            ("never", true, true, NeverAnswered),
            ("refused", true, true, Unhealthy),
            ("503", true, true, Unhealthy),
            ("false", true, true, Unhealthy),
            ("reset", true, true, Unhealthy),
            ("timeout", true, true, Slow),
            ("timeout", true, false, Unhealthy),
            ("timeout", false, true, Unhealthy),
            ("emfile", true, false, AgentError),
            ("emfile", false, false, Unhealthy),
        ];
        for (o, rule, serving, want) in rows {
            let out = outcome(o);
            let asked = std::cell::Cell::new(false);
            let why = excuse(&out, rule, || {
                asked.set(true);
                serving.then(|| "a virtual request succeeded".to_owned())
            });
            assert_eq!(
                judge(&out, why.is_some(), Rules::REFERENCE),
                want,
                "{o} rule {rule} serving {serving}"
            );
            assert_eq!(
                asked.get(),
                rule && o == "timeout",
                "{o}: the evidence is asked for a timeout only"
            );
        }
    }

    // The agent policy's grace: every failure but a refusal is `failing` while it has lasted
    // less than the grace, `unhealthy` from then on; an excuse still applies first.
    #[test]
    fn grace_table() {
        let s = std::time::Duration::from_secs;
        let g = |failing_for| {
            Some(Grace {
                grace: s(15),
                failing_for: s(failing_for),
            })
        };
        let rows = [
            ("503", false, g(0), Failing),
            ("503", false, g(14), Failing),
            ("503", false, g(15), Unhealthy),
            ("timeout", false, g(3), Failing),
            ("timeout", true, g(30), Slow),
            ("false", false, g(1), Failing),
            ("reset", false, g(1), Failing),
            ("refused", false, g(0), Unhealthy),
            ("ok", false, g(20), Healthy),
            ("never", false, g(20), NeverAnswered),
            ("503", false, None, Unhealthy),
            (
                "503",
                false,
                Some(Grace {
                    grace: s(0),
                    failing_for: s(0),
                }),
                Unhealthy,
            ),
        ];
        for (o, excused, grace, want) in rows {
            let rules = Rules {
                grace,
                refused_at_once: true,
            };
            assert_eq!(judge(&outcome(o), excused, rules), want, "{o} {grace:?}");
        }
        // Rule 2 off (its mode `off` or `observe`): a refusal has the grace too.
        let without_2 = |grace| Rules {
            grace,
            refused_at_once: false,
        };
        assert_eq!(judge(&outcome("refused"), false, without_2(g(3))), Failing);
        assert_eq!(
            judge(&outcome("refused"), false, without_2(g(15))),
            Unhealthy
        );
        assert_eq!(
            judge(&outcome("refused"), false, without_2(None)),
            Unhealthy
        );
    }

    // Sequences of /health outcomes on an engine whose virtual inference is abnormal (or
    // not) → re-arms. Only a refusal then a real answer is a restart.
    #[test]
    fn restart_table() {
        let rows: [(&str, &[&str], bool, u32); 8] = [
            ("down then up", &["refused", "ok"], true, 1),
            ("up without down", &["ok", "ok"], true, 0),
            ("a timeout is not down", &["timeout", "ok"], true, 0),
            ("an HTTP error is not down", &["503", "ok"], true, 0),
            ("a reset is not down", &["reset", "ok"], true, 0),
            ("the agent's EMFILE is not down", &["emfile", "ok"], true, 0),
            (
                "down, still down, up",
                &["refused", "refused", "timeout", "ok"],
                true,
                1,
            ),
            (
                "not abnormal: nothing to re-arm",
                &["refused", "ok"],
                false,
                0,
            ),
        ];
        for (what, seq, vi_abnormal, want) in rows {
            let (mut down, mut rearms) = (false, 0);
            for o in seq {
                let (d, rearm) = restart(down, &outcome(o), vi_abnormal);
                down = d;
                rearms += u32::from(rearm);
            }
            assert_eq!(rearms, want, "{what}");
            assert!(
                !down || *seq.last().unwrap() != "ok",
                "{what}: an answer clears down"
            );
        }
    }
}
