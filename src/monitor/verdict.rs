//! The verdict `/status` serves (reference §3.3), as plain functions of what the monitor
//! knows, and the `/health` bookkeeping behind it:
//!
//! - `/health` never answered → `initial`;
//! - answered once, failing now (or answering `false`) → `abnormal`;
//! - healthy: `abnormal` if virtual inference is (or a held QoS `evict` with `qos.eviction`),
//!   else `normal`.
//!
//! Two departures from the reference, both off under `serving_evidence_max_age = "0s"`:
//! a `/health` that only timed out while the engine demonstrably serves is `slow`, not
//! unhealthy; a failure that is the agent's own (out of file descriptors) is `agent_error`.
//! And one addition the reference cannot have (it dies with its engine): a re-arm after a
//! restart, see [`restart`].
//!
//! Under `policy = "agent"` one more: a failure that is not a dead engine (anything but a
//! refused connection) is `failing`, not unhealthy, until it has lasted
//! `agent_policy.health_failure_grace` ([`judge`]'s `grace`).

use crate::probe::health::{HealthOutcome, Transport};
use serde::{Deserialize, Serialize};

/// What `/status` answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Initial,
    Normal,
    Abnormal,
}

impl Status {
    /// The exact body MindIE's engine server returns.
    pub fn body(self) -> &'static str {
        match self {
            Status::Initial => r#"{"status":"initial"}"#,
            Status::Normal => r#"{"status":"normal"}"#,
            Status::Abnormal => r#"{"status":"abnormal"}"#,
        }
    }

    /// `initial`, `normal` or `abnormal`.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Initial => "initial",
            Status::Normal => "normal",
            Status::Abnormal => "abnormal",
        }
    }
}

/// The engine's `/health` as last judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HealthState {
    /// Never reached: `/status` says `initial`.
    #[default]
    NeverAnswered,
    Healthy,
    /// Timing out while the engine demonstrably serves: not abnormal.
    Slow,
    /// The agent could not make the request (out of file descriptors): not abnormal.
    AgentError,
    /// Answered before and fails now.
    Unhealthy,
    /// Fails now, for less than the agent policy's `health_failure_grace`, and the engine's
    /// port is open: not abnormal yet.
    Failing,
}

impl HealthState {
    /// As shown in `/status/detail`.
    pub fn as_str(self) -> &'static str {
        match self {
            HealthState::NeverAnswered => "never_answered",
            HealthState::Healthy => "healthy",
            HealthState::Slow => "slow",
            HealthState::AgentError => "agent_error",
            HealthState::Unhealthy => "unhealthy",
            HealthState::Failing => "failing",
        }
    }

    /// The engine answers well enough for `/status` to look further (healthy, or a failure
    /// that is excused).
    pub fn answers(self) -> bool {
        matches!(
            self,
            HealthState::Healthy
                | HealthState::Slow
                | HealthState::AgentError
                | HealthState::Failing
        )
    }

    pub(super) fn to_u8(self) -> u8 {
        self as u8
    }

    pub(super) fn from_u8(v: u8) -> HealthState {
        match v {
            0 => HealthState::NeverAnswered,
            1 => HealthState::Healthy,
            2 => HealthState::Slow,
            3 => HealthState::AgentError,
            5 => HealthState::Failing,
            _ => HealthState::Unhealthy,
        }
    }
}

/// Why a `/health` failure is not held against the engine, if it is not.
///
/// `evidence` is the engine's evidence of serving right now (it is asked only for a
/// timeout); `evidence_rule` is false under `serving_evidence_max_age = "0s"` (the
/// reference's verdict: nothing is excused).
pub fn excuse(
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
pub struct Grace {
    /// `agent_policy.health_failure_grace`.
    pub grace: std::time::Duration,
    /// How long `/health` has failed without a healthy answer, this outcome included.
    pub failing_for: std::time::Duration,
}

/// The `/health` state after one outcome, given its [`excuse`] and, under the agent policy,
/// its [`Grace`] (`None`: the reference's verdict).
pub fn judge(outcome: &HealthOutcome, excused: bool, grace: Option<Grace>) -> HealthState {
    match outcome {
        HealthOutcome::Healthy => HealthState::Healthy,
        HealthOutcome::Unhealthy {
            timed_out: true, ..
        } if excused => HealthState::Slow,
        HealthOutcome::Unhealthy { .. } if excused => HealthState::AgentError,
        // Nothing listens: the engine process is gone, which is reported at once.
        HealthOutcome::Unhealthy {
            transport: Some(Transport::Refused),
            ..
        } => HealthState::Unhealthy,
        HealthOutcome::Unhealthy { .. } if grace.is_some_and(|g| g.failing_for < g.grace) => {
            HealthState::Failing
        }
        HealthOutcome::Unhealthy { .. } => HealthState::Unhealthy,
        HealthOutcome::NeverConnected(_) => HealthState::NeverAnswered,
    }
}

/// The verdict, from the `/health` state, virtual inference, a held QoS `evict` that
/// `qos.eviction` turns into a verdict, and (under the agent policy) an engine process
/// stopped past its grace ([`stopped`]).
pub fn status(health: HealthState, vi_abnormal: bool, qos_evicts: bool, stopped: bool) -> Status {
    match health {
        HealthState::NeverAnswered => Status::Initial,
        HealthState::Unhealthy => Status::Abnormal,
        _ if vi_abnormal || qos_evicts || stopped => Status::Abnormal,
        _ => Status::Normal,
    }
}

/// The agent policy's stopped-process rule: one of the engine's processes has been stopped
/// (`T`: SIGSTOP, a debugger) for `grace` or longer. A `grace` of zero turns it off; the
/// reference policy has no such rule (its caller passes `None`).
pub fn stopped(
    stopped_for: Option<std::time::Duration>,
    grace: Option<std::time::Duration>,
) -> bool {
    match (stopped_for, grace) {
        (Some(d), Some(g)) => !g.is_zero() && d >= g,
        _ => false,
    }
}

/// Restart detection, one `/health` outcome at a time: after virtual inference went
/// abnormal, `/health` refused (the engine process is gone) and then answered for real —
/// the engine restarted, and virtual inference is re-armed. A timeout, an HTTP error or a
/// garbled answer is not the "down" half; an excused timeout is not the "up" half.
///
/// `down` is whether the "down" half was seen; returns (`down` after, re-arm now).
pub fn restart(down: bool, outcome: &HealthOutcome, vi_abnormal: bool) -> (bool, bool) {
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

    // Each /health outcome, with and without evidence of serving, under the agent's rule and
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
                judge(&out, why.is_some(), None),
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
            assert_eq!(judge(&outcome(o), excused, grace), want, "{o} {grace:?}");
        }
        assert_eq!(status(Failing, false, false, false), Status::Normal);
        assert_eq!(status(Failing, true, false, false), Status::Abnormal);
    }

    // §3.3: the verdict from the /health state, virtual inference and held QoS evict.
    #[test]
    fn status_table() {
        let rows = [
            (NeverAnswered, false, false, Status::Initial),
            (NeverAnswered, true, true, Status::Initial),
            (Unhealthy, false, false, Status::Abnormal),
            (Healthy, false, false, Status::Normal),
            (Healthy, true, false, Status::Abnormal),
            (Healthy, false, true, Status::Abnormal),
            (Slow, false, false, Status::Normal),
            (Slow, true, false, Status::Abnormal),
            (AgentError, false, false, Status::Normal),
        ];
        for (h, vi, qos, want) in rows {
            assert_eq!(status(h, vi, qos, false), want, "{h:?} vi {vi} qos {qos}");
        }
        // A stopped engine process: abnormal whatever /health says, once it has answered.
        assert_eq!(status(Failing, false, false, true), Status::Abnormal);
        assert_eq!(status(Healthy, false, false, true), Status::Abnormal);
        assert_eq!(status(NeverAnswered, false, false, true), Status::Initial);
    }

    // The stopped-process rule (agent policy): stopped for the grace or longer; a zero grace
    // or the reference policy (no grace at all) never fires.
    #[test]
    fn stopped_table() {
        let s = std::time::Duration::from_secs;
        let ms = std::time::Duration::from_millis;
        let rows = [
            (None, Some(s(2)), false),
            (Some(ms(1999)), Some(s(2)), false),
            (Some(s(2)), Some(s(2)), true),
            (Some(s(60)), Some(s(2)), true),
            (Some(s(60)), Some(s(0)), false),
            (Some(s(60)), None, false),
        ];
        for (stopped_for, grace, want) in rows {
            assert_eq!(
                stopped(stopped_for, grace),
                want,
                "{stopped_for:?} {grace:?}"
            );
        }
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

    #[test]
    fn health_states_round_trip_through_their_atomic_form() {
        for h in [NeverAnswered, Healthy, Slow, AgentError, Unhealthy, Failing] {
            assert_eq!(HealthState::from_u8(h.to_u8()), h);
            assert_eq!(
                serde_json::to_value(h).unwrap(),
                serde_json::json!(h.as_str())
            );
        }
    }
}
