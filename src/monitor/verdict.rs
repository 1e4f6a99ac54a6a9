//! The verdict's words: what `/status` answers ([`Status`], reference §3.3) and the `/health`
//! state it starts from ([`HealthState`]). The monitor computes the verdict once by asking the
//! evidence sources in turn ([`super::evidence`]); [`status`] is the same precedence as a
//! plain function, for a saved state's log line and the tables:
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

/// The verdict, from the `/health` state, virtual inference, a held QoS `evict` that
/// `qos.eviction` turns into a verdict, and (under the agent policy) an engine process
/// stopped past its grace ([`super::evidence::processes::stopped`]).
pub(crate) fn status(
    health: HealthState,
    vi_abnormal: bool,
    qos_evicts: bool,
    stopped: bool,
) -> Status {
    match health {
        HealthState::NeverAnswered => Status::Initial,
        HealthState::Unhealthy => Status::Abnormal,
        _ if vi_abnormal || qos_evicts || stopped => Status::Abnormal,
        _ => Status::Normal,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use HealthState::*;

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
