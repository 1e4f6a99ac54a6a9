//! Virtual inference as `/status/detail` shows it: the conditions it runs under, and its
//! last probe with what that probe did to the failure count.

use serde::{Deserialize, Serialize};
use std::borrow::Cow;

/// One enabling condition of virtual inference (reference §1.2–§1.3).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Condition {
    pub name: Cow<'static, str>,
    /// The value the agent sees, with its source.
    pub value: String,
    /// Whether it lets virtual inference run (`None`: not known yet).
    pub ok: Option<bool>,
    /// Why, when it blocks (the reference's log text where there is one).
    pub note: String,
}

/// One probe, for `/status/detail`. The agent keeps beside it the monotonic instant it
/// completed (ages are computed from that); it is not sent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProbeRecord {
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
