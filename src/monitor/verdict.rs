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

pub(crate) use npu_health_wire::Status;

pub(crate) use npu_health_wire::HealthState;

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
