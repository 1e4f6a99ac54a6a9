//! What one virtual request returned, and what the monitor keeps of it: shared by the probe
//! client ([`super::http`]), the virtual inference loop ([`crate::monitor`]) and QoS
//! ([`crate::qos`]), so none of them reaches into another for these types. The failure and
//! its class serve `/health` and `/metrics` too.

use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Why a request to the engine failed: the virtual request, and `/health` and `/metrics`
/// in their reasons. Its `Display`, the words an operator reads, is in [`super::cause`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeFailure {
    /// No whole answer within this timeout.
    Timeout(Duration),
    /// No usable answer (refused, reset, TLS, not HTTP): its class and the client's error.
    Transport(Transport, String),
    /// Non-2xx status.
    Status(u16),
    /// 2xx but the body is not JSON.
    BadBody(String),
    /// A streamed probe (`probe_max_tokens` > 1) whose stream was not a complete answer: an
    /// event not JSON, an error event, no token, or no `[DONE]`.
    BadStream(String),
}

/// Why a request got no usable answer. Only [`Transport::Refused`] is evidence that the
/// engine process went away (nothing listens on its port), so only it can be the "down" half
/// of a restart; a garbled answer came from a process that is still there.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    serde::Serialize,
    serde::Deserialize,
    strum::IntoStaticStr,
    strum::EnumIter,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
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
    #[cfg(test)]
    /// Every class that is not evidence the engine went away (all but `Refused`).
    pub(crate) const NOT_DOWN: [Transport; 7] = [
        Transport::Reset,
        Transport::Protocol,
        Transport::BodyTooLarge,
        Transport::Tls,
        Transport::Local,
        Transport::Connect,
        Transport::Other,
    ];

    #[cfg(test)]
    /// The class's name in `/status/detail` (serde's name, by the same rule).
    pub(crate) fn as_str(self) -> &'static str {
        self.into()
    }
}

/// Result of one virtual request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeResult {
    pub outcome: Result<(), ProbeFailure>,
    /// Time to the complete answer (or to the failure).
    pub latency: Duration,
    /// Time to the first token when the probe streamed (`probe_max_tokens` > 1); for the
    /// reference's 1-token request the answer is the first token, so `latency` is the TTFT.
    pub ttft: Option<Duration>,
    /// Time per output token after the first, when the probe streamed.
    pub tpot: Option<Duration>,
}

impl ProbeResult {
    /// A result of a non-streamed request.
    pub(crate) fn new(outcome: Result<(), ProbeFailure>, latency: Duration) -> ProbeResult {
        ProbeResult {
            outcome,
            latency,
            ttft: None,
            tpot: None,
        }
    }

    /// Time to first token of a successful probe.
    pub(crate) fn first_token(&self) -> Option<Duration> {
        self.outcome
            .is_ok()
            .then(|| self.ttft.unwrap_or(self.latency))
    }
}

/// How a probe changed the failure count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Accounting {
    /// Failed with the NPU idle (reference rule 1).
    Incremented,
    /// Failed with the NPU busy and the engine stalled for `stall_window` (stall detection).
    IncrementedStalled,
    /// Failed with AI Cube usage unavailable (reference rule 2).
    Unchanged,
    /// Failed with the NPU idle while requests wait for capacity, or that figure is unknown
    /// (V6 rule, `skip_when_capacity_waiting`).
    UnchangedCapacityWaiting,
    /// Failed while the engine's `/health` failed too: the `/health` grace decides (agent
    /// policy).
    UnchangedHealthFailing,
    /// Failed while the engine is asleep by `vllm:engine_sleep_state` (agent policy).
    UnchangedAsleep,
    /// Failed while the driver reports a fault at `RestartBusiness` or worse on one of the
    /// engine's NPUs: abnormal at once, the driver explains the failure (agent policy).
    DriverFault,
    /// Failed with the NPU busy while the engine showed no sign of life for
    /// `progress_window` with requests running: abnormal at once (agent policy, rule 11).
    NoSignOfLife,
    Reset,
    /// Warm-up requests are not counted; a failed warm-up is abnormal at once.
    WarmUp,
}

/// One probe, for `/status/detail`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProbeRecord {
    /// When it completed, on the monotonic clock (ages are computed from this). Not sent;
    /// a record read back from JSON has the time it was read.
    #[serde(skip, default = "tokio::time::Instant::now")]
    pub at: tokio::time::Instant,
    /// Unix time in milliseconds.
    pub at_unix_ms: u64,
    pub warmup: bool,
    pub latency_ms: f64,
    /// `success` or the failure.
    pub outcome: String,
    pub success: bool,
    /// Time to first token of a successful probe, milliseconds.
    pub ttft_ms: Option<f64>,
    /// Time per output token when the probe streamed more than one token, milliseconds.
    pub tpot_ms: Option<f64>,
    /// Window peak read after the probe (`null`: unavailable or warm-up).
    pub peak: Option<f64>,
    pub accounting: Accounting,
    pub failure_count: i64,
}

/// Upper bounds (seconds) of the probe latency histogram.
pub(crate) const LATENCY_BUCKETS: [f64; 12] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];
