//! What one virtual request returned, and what the monitor keeps of it: shared by the probe
//! client ([`super::http`]), the virtual inference loop ([`crate::monitor`]) and QoS
//! ([`crate::qos`]), so none of them reaches into another for these types. The failure and
//! its class serve `/health` and `/metrics` too.

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

pub(crate) use npu_health_wire::{Accounting, ProbeRecord, Transport};

/// Every class that is not evidence the engine went away (all but `Refused`).
#[cfg(test)]
pub(crate) const NOT_DOWN: [Transport; 7] = [
    Transport::Reset,
    Transport::Protocol,
    Transport::BodyTooLarge,
    Transport::Tls,
    Transport::Local,
    Transport::Connect,
    Transport::Other,
];

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

/// One probe as the monitor keeps it: what `/status/detail` sends ([`ProbeRecord`]), and when
/// it completed on the monotonic clock (ages are computed from this), which the wire does not
/// carry. Reads as its record.
#[derive(Debug, Clone, PartialEq)]
pub struct Probed {
    pub record: ProbeRecord,
    pub at: tokio::time::Instant,
}

impl std::ops::Deref for Probed {
    type Target = ProbeRecord;

    fn deref(&self) -> &ProbeRecord {
        &self.record
    }
}

/// Upper bounds (seconds) of the probe latency histogram.
pub(crate) const LATENCY_BUCKETS: [f64; 12] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];
