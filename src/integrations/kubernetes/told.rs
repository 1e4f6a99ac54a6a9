//! What the Kubernetes API mode did about an engine: the readiness-gate condition as last set,
//! each call that acted on the pod and how it ended (the wire crate's types, which
//! `/status/detail` sends as `kubernetes`), and the eviction gate's memory. Data only, kept in
//! the engine's monitor (`monitor::acted`) and its state file, so `/status/detail` shows every
//! attempt and a restarted agent keeps the cooldown; written by [`super::task`].

use serde::{Deserialize, Serialize};

pub(crate) use npu_health_wire::{Attempt, ConditionSet, KubeRecord, Outcome, PodAction};

/// The eviction gate's memory (`actions::eviction::EvictionGate`) in wall-clock time, so a
/// restarted agent keeps the cooldown after an eviction and the back-off after a refusal.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct GateMemory {
    /// When the last eviction went through.
    pub done_at_unix_ms: Option<u64>,
    /// No attempt before this (back-off after a refused or failed one).
    pub retry_at_unix_ms: Option<u64>,
    /// The next back-off.
    pub backoff_ms: u64,
}
