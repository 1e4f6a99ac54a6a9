//! What the integrations' rules read of one engine, taken at one instant ([`ActionInputs`]):
//! the verdict and why it is `abnormal`, `/health`, virtual inference's phase, the QoS level
//! and score. Every rule of the wing (readiness, liveness, HAProxy's states, the eviction
//! ground) reads these facts and nothing else of the monitor.

use crate::monitor::Monitor;
use crate::monitor::evidence::Verdict;
use crate::monitor::verdict::{HealthState, Status};
use crate::monitor::vi_state::Phase;
use crate::probe::health::Transport;
use crate::qos::score::Level;
use serde::{Deserialize, Serialize};

/// Why the verdict is `abnormal`, as far as the actions care.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum AbnormalCause {
    /// `/health` answered before and fails now (past the agent policy's grace).
    Health,
    /// Virtual inference went abnormal (warm-up failed, or the failure count reached its
    /// maximum).
    VirtualInference,
    /// A held QoS `evict` with `qos.eviction` on.
    QosEviction,
    /// One of the engine's processes stopped past `agent_policy.stopped_process_grace`.
    EngineStopped,
}

/// What the action rules read of one engine, taken at one instant.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ActionInputs {
    /// The verdict `/status` serves under the policy in force.
    pub status: Status,
    /// Why it is abnormal; `None` unless `status` is `abnormal`.
    pub cause: Option<AbnormalCause>,
    /// The verdict's reason, in words.
    pub reason: String,
    /// `/health` as last judged.
    pub health: HealthState,
    /// The last `/health` failure was a refused connection: the engine's port is closed.
    pub port_closed: bool,
    /// Virtual inference's phase (warming up: the engine answers its first request).
    pub phase: Phase,
    pub level: Level,
    pub score: Option<f64>,
    /// Every QoS component had an input at the last evaluation: the score does not rest on
    /// missing inputs.
    pub inputs_complete: bool,
    /// Requests running when the level left `normal` (a router's cap while it is not).
    pub admission_cap: Option<u32>,
}

impl ActionInputs {
    /// The facts of `m` now.
    pub(crate) fn of(m: &Monitor) -> ActionInputs {
        // The monitor's one verdict: its status, cause and reason come from one walk.
        ActionInputs::with(m, &m.verdict())
    }

    /// The facts of `m` now, with `verdict` read by the caller (the observer reads it once
    /// for these and for the rules' records).
    pub(crate) fn with(m: &Monitor, verdict: &Verdict) -> ActionInputs {
        use crate::monitor::evidence::Kind;
        let health = m.health_detail();
        let cause = verdict.cause.as_ref().map(|c| match c.kind {
            Kind::Health => AbnormalCause::Health,
            Kind::EngineStopped => AbnormalCause::EngineStopped,
            Kind::VirtualInference => AbnormalCause::VirtualInference,
            Kind::QosEviction => AbnormalCause::QosEviction,
        });
        let components = m.qos().components();
        ActionInputs {
            status: verdict.status,
            cause,
            // One line, whatever the engine's error said.
            reason: verdict.reason.replace(['\n', '\r'], " "),
            port_closed: health.last_transport_error == Some(Transport::Refused),
            health: health.state,
            phase: m.vi().phase(),
            level: m.qos().level(),
            score: m.qos().score(),
            inputs_complete: !components.is_empty() && components.iter().all(|c| c.score.is_some()),
            admission_cap: m.qos().admission_cap(),
        }
    }

    /// The level (and score) in words, for the answers' reasons.
    pub(crate) fn level_words(&self) -> String {
        match self.score {
            Some(s) => format!("QoS level {} (score {s:.3})", self.level.as_str()),
            None => format!("QoS level {}", self.level.as_str()),
        }
    }

    /// A held `evict` whose score rests on no missing input.
    pub(crate) fn evict_held(&self) -> bool {
        self.level == Level::Evict && self.inputs_complete
    }
}
