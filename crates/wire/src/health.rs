//! `/health` as `/status/detail` shows it: the state the verdict starts from, and the class
//! of the last failure without a usable answer.

use serde::{Deserialize, Serialize};

/// `/health` as last seen. The agent keeps beside it the monotonic instants its rules need
/// (since when `/health` fails, when it last failed); they are not sent.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HealthDetail {
    pub state: HealthState,
    pub has_connected: bool,
    /// Unix milliseconds of the last healthy probe.
    pub last_ok_unix_ms: Option<u64>,
    pub last_error: Option<String>,
    /// Class of the last failure without a usable answer (`refused`, `reset`, `protocol`,
    /// `body_too_large`, `tls`, `local`, `connect`, `other`); only `refused` can be the
    /// "down" half of a restart.
    pub last_transport_error: Option<Transport>,
    pub consecutive_failures: u64,
    pub probes: u64,
    /// `/health` timeouts not taken as abnormal because the engine was serving.
    pub excused_timeouts: u64,
    /// How long `/health` has failed without a healthy answer (`None`: it answers).
    pub failing_for_ms: Option<u64>,
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

    /// Its discriminant: the encoding the monitor's atomic holds, read by every `/status`.
    pub fn to_u8(self) -> u8 {
        self as u8
    }

    /// The state stored as `v` (an unknown value reads as `Unhealthy`).
    pub fn from_u8(v: u8) -> HealthState {
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

/// Why a request got no usable answer. Only [`Transport::Refused`] is evidence that the
/// engine process went away (nothing listens on its port), so only it can be the "down" half
/// of a restart; a garbled answer came from a process that is still there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Transport {
    /// Connection refused: nothing listens on the engine's port.
    Refused,
    /// The connection was reset or closed before a whole answer.
    Reset,
    /// The answer was not HTTP: a bad status line, garbage bytes, bad framing.
    Protocol,
    /// The answer's body was larger than the agent reads.
    BodyTooLarge,
    /// TLS failed (handshake, certificate).
    Tls,
    /// The agent itself ran out of something (file descriptors): says nothing about the engine.
    Local,
    /// Any other connect failure (unreachable host, name resolution).
    Connect,
    /// Anything else.
    Other,
}

impl Transport {
    /// Every class, `Refused` first.
    pub const ALL: [Transport; 8] = [
        Transport::Refused,
        Transport::Reset,
        Transport::Protocol,
        Transport::BodyTooLarge,
        Transport::Tls,
        Transport::Local,
        Transport::Connect,
        Transport::Other,
    ];

    /// The class's name in `/status/detail` and the metrics (serde's name).
    pub fn as_str(self) -> &'static str {
        match self {
            Transport::Refused => "refused",
            Transport::Reset => "reset",
            Transport::Protocol => "protocol",
            Transport::BodyTooLarge => "body_too_large",
            Transport::Tls => "tls",
            Transport::Local => "local",
            Transport::Connect => "connect",
            Transport::Other => "other",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{HealthState, Transport};

    #[test]
    fn every_health_state_reads_back_from_its_u8() {
        let all = [
            HealthState::NeverAnswered,
            HealthState::Healthy,
            HealthState::Slow,
            HealthState::AgentError,
            HealthState::Unhealthy,
            HealthState::Failing,
        ];
        for s in all {
            assert_eq!(HealthState::from_u8(s.to_u8()), s, "{s:?}");
        }
    }

    #[test]
    fn every_transport_class_is_listed_once() {
        for (i, t) in Transport::ALL.into_iter().enumerate() {
            assert_eq!(t as usize, i, "{t:?} sits at its own place");
        }
    }
}
