//! The verdict's words: what `/status` answers ([`Status`], reference §3.3) and the `/health`
//! state it starts from ([`HealthState`]). The monitor computes the verdict once by asking the
//! evidence sources in turn ([`super::evidence`], whose tests hold it to this table):
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

use serde::{Deserialize, Serialize};

pub(crate) use npu_health_wire::Status;

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
    #[cfg(test)]
    pub(crate) fn as_str(self) -> &'static str {
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
    pub(crate) fn answers(self) -> bool {
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

#[cfg(test)]
mod tests {
    use super::*;
    use HealthState::*;

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
