//! When the Kubernetes API mode may try to take an engine's pod out (pure; time from tokio's
//! clock, so the rules run under paused time): at most one eviction that went through per
//! `eviction_cooldown`, and after a refusal (a PodDisruptionBudget: HTTP 429) or a failure,
//! a back-off that doubles from 5 s to 5 min while the ground holds. When the ground goes,
//! the back-off starts over; the cooldown stays.

use super::events::Reason;
use super::told::{GateMemory, Outcome, PodAction};
use std::time::Duration;
use tokio::time::Instant;

/// The first back-off after a refused or failed attempt.
pub(crate) const FIRST_BACKOFF: Duration = Duration::from_secs(5);
/// The longest back-off.
pub(crate) const MAX_BACKOFF: Duration = Duration::from_secs(300);

/// What to do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// No ground for an eviction.
    Idle,
    /// Try one now.
    Try,
    /// Ground, but held back until then: the cooldown after the last eviction, or the
    /// back-off after a refusal or failure.
    Wait { until: Instant, cooldown: bool },
}

/// How an attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Attempted {
    /// The API server took it: the pod goes.
    Done,
    /// Refused for now (429: a PodDisruptionBudget, or the server's rate limit).
    Refused,
    /// Any other failure (403, 500, timeout, garbage).
    Failed,
}

/// The gate of one engine.
#[derive(Debug, Clone)]
pub(crate) struct EvictionGate {
    cooldown: Duration,
    done_at: Option<Instant>,
    retry_at: Option<Instant>,
    backoff: Duration,
}

impl EvictionGate {
    pub(crate) fn new(cooldown: Duration) -> EvictionGate {
        EvictionGate {
            cooldown,
            done_at: None,
            retry_at: None,
            backoff: FIRST_BACKOFF,
        }
    }

    /// A gate that remembers `m` (saved by an agent that has since restarted).
    pub(crate) fn remembering(cooldown: Duration, m: GateMemory) -> EvictionGate {
        EvictionGate {
            cooldown,
            done_at: m.done_at_unix_ms.map(crate::clock::instant_of),
            retry_at: m.retry_at_unix_ms.map(|ms| {
                // A retry time in the future stays in the future.
                let now = crate::clock::unix_ms();
                Instant::now() + Duration::from_millis(ms.saturating_sub(now))
            }),
            backoff: Duration::from_millis(m.backoff_ms).clamp(FIRST_BACKOFF, MAX_BACKOFF),
        }
    }

    /// What the gate remembers, in wall-clock time.
    pub(crate) fn memory(&self) -> GateMemory {
        let now = Instant::now();
        GateMemory {
            done_at_unix_ms: self.done_at.map(crate::clock::unix_ms_of),
            retry_at_unix_ms: self.retry_at.map(|r| {
                crate::clock::unix_ms() + r.saturating_duration_since(now).as_millis() as u64
            }),
            backoff_ms: self.backoff.as_millis() as u64,
        }
    }

    /// What to do at `now` with (`ground`) or without a ground for eviction.
    pub(crate) fn step(&mut self, now: Instant, ground: bool) -> Step {
        if !ground {
            self.retry_at = None;
            self.backoff = FIRST_BACKOFF;
            return Step::Idle;
        }
        if let Some(done) = self.done_at
            && now < done + self.cooldown
        {
            return Step::Wait {
                until: done + self.cooldown,
                cooldown: true,
            };
        }
        match self.retry_at {
            Some(r) if now < r => Step::Wait {
                until: r,
                cooldown: false,
            },
            _ => Step::Try,
        }
    }

    /// Records an attempt made at `now`; returns the back-off applied, if any.
    pub(crate) fn record(&mut self, now: Instant, a: Attempted) -> Option<Duration> {
        match a {
            Attempted::Done => {
                self.done_at = Some(now);
                self.retry_at = None;
                self.backoff = FIRST_BACKOFF;
                None
            }
            Attempted::Refused | Attempted::Failed => {
                let wait = self.backoff;
                self.retry_at = Some(now + wait);
                self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
                Some(wait)
            }
        }
    }
}

/// The Event of an attempt `action` that ended as `outcome`.
pub(crate) fn event_reason(action: PodAction, outcome: Outcome) -> Reason {
    match (action, outcome) {
        (PodAction::MindclusterAnnotation, Outcome::Done) => Reason::MindClusterFaultAnnotated,
        (_, Outcome::Done) => Reason::EngineEvicted,
        (_, Outcome::Refused) => Reason::EvictionRefused,
        (_, _) => Reason::EvictionFailed,
    }
}

/// The Event's note of that attempt: what was done, why or why not, and the next try.
pub(crate) fn event_note(
    action: PodAction,
    outcome: Outcome,
    detail: &str,
    backoff: Option<Duration>,
) -> String {
    use super::config::{MINDCLUSTER_ANNOTATION, MINDCLUSTER_VALUE};
    let what = match action {
        PodAction::MindclusterAnnotation => {
            format!("MindCluster's fault annotation {MINDCLUSTER_ANNOTATION}={MINDCLUSTER_VALUE}")
        }
        _ => "Eviction (policy/v1)".to_owned(),
    };
    match backoff {
        Some(wait) => format!(
            "{what} {outcome}: {detail}; next try in {} if the ground holds",
            humantime::format_duration(wait)
        ),
        None => format!("{what} {outcome}: {detail}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_attempt_has_its_event_reason() {
        use Outcome::{Done, Failed, PodGone, Refused};
        use PodAction::{Eviction, MindclusterAnnotation};
        let cases = [
            (Eviction, Done, Reason::EngineEvicted),
            (
                MindclusterAnnotation,
                Done,
                Reason::MindClusterFaultAnnotated,
            ),
            (Eviction, Refused, Reason::EvictionRefused),
            (MindclusterAnnotation, Refused, Reason::EvictionRefused),
            (Eviction, Failed, Reason::EvictionFailed),
            (Eviction, PodGone, Reason::EvictionFailed),
        ];
        for (a, o, r) in cases {
            assert_eq!(event_reason(a, o), r, "{a:?} {o:?}");
        }
        let n = event_note(Eviction, Refused, "HTTP 429", Some(FIRST_BACKOFF));
        assert_eq!(
            n,
            "Eviction (policy/v1) refused: HTTP 429; next try in 5s if the ground holds"
        );
    }

    const MIN10: Duration = Duration::from_secs(600);

    // An agent restart between an eviction and the end of its cooldown keeps the cooldown,
    // and one during a back-off keeps the back-off and its next step.
    #[tokio::test]
    async fn a_restarted_gate_keeps_the_cooldown_and_the_back_off() {
        let mut g = EvictionGate::new(MIN10);
        let t0 = Instant::now();
        g.record(t0, Attempted::Done);
        let mut again = EvictionGate::remembering(MIN10, g.memory());
        assert!(matches!(
            again.step(Instant::now(), true),
            Step::Wait { cooldown: true, .. }
        ));
        let mut g = EvictionGate::new(MIN10);
        g.record(t0, Attempted::Refused);
        let mut again = EvictionGate::remembering(MIN10, g.memory());
        match again.step(Instant::now(), true) {
            Step::Wait {
                until,
                cooldown: false,
            } => assert!(until > Instant::now() + Duration::from_secs(4)),
            other => panic!("{other:?}"),
        }
        assert_eq!(again.memory().backoff_ms, 10_000);
    }

    #[tokio::test(start_paused = true)]
    async fn one_eviction_per_cooldown() {
        let mut g = EvictionGate::new(MIN10);
        let t0 = Instant::now();
        assert_eq!(g.step(t0, false), Step::Idle);
        assert_eq!(g.step(t0, true), Step::Try);
        assert_eq!(g.record(t0, Attempted::Done), None);
        let t = t0 + Duration::from_secs(599);
        assert_eq!(
            g.step(t, true),
            Step::Wait {
                until: t0 + MIN10,
                cooldown: true
            }
        );
        // The ground going and coming back does not reset the cooldown.
        assert_eq!(g.step(t, false), Step::Idle);
        assert!(matches!(g.step(t, true), Step::Wait { cooldown: true, .. }));
        assert_eq!(g.step(t0 + MIN10, true), Step::Try);
    }

    #[tokio::test(start_paused = true)]
    async fn refusals_back_off_doubling_to_five_minutes() {
        let mut g = EvictionGate::new(MIN10);
        let mut t = Instant::now();
        let mut waits = Vec::new();
        for _ in 0..9 {
            assert_eq!(g.step(t, true), Step::Try);
            let w = g.record(t, Attempted::Refused).unwrap();
            assert_eq!(
                g.step(t + w - Duration::from_millis(1), true),
                Step::Wait {
                    until: t + w,
                    cooldown: false
                }
            );
            waits.push(w.as_secs());
            t += w;
        }
        assert_eq!(waits, [5, 10, 20, 40, 80, 160, 300, 300, 300]);
        // A failure backs off the same way; the ground going starts over.
        assert_eq!(g.step(t, false), Step::Idle);
        assert_eq!(g.step(t, true), Step::Try);
        assert_eq!(g.record(t, Attempted::Failed), Some(FIRST_BACKOFF));
        // After an eviction goes through, the cooldown holds, not the back-off.
        t += FIRST_BACKOFF;
        assert_eq!(g.step(t, true), Step::Try);
        g.record(t, Attempted::Done);
        assert!(matches!(g.step(t, true), Step::Wait { cooldown: true, .. }));
    }
}
