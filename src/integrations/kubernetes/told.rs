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

/// Which of the agent's two codes a fault carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Kind {
    /// The engine is `abnormal` (`public_fault_code`).
    Abnormal,
    /// The engine is `abnormal` in a restart loop (`public_fault_loop_code`).
    RestartLoop,
}

impl Kind {
    /// The last part of its fault id (`1`, `2`): the two kinds of one episode differ.
    pub(crate) fn digit(self) -> char {
        match self {
            Kind::Abnormal => '1',
            Kind::RestartLoop => '2',
        }
    }

    /// In words, for the message's description and the log.
    pub(crate) fn words(self) -> &'static str {
        match self {
            Kind::Abnormal => "abnormal",
            Kind::RestartLoop => "abnormal in a restart loop",
        }
    }
}

/// One fault as the agent published it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct FaultSent {
    pub fault_id: String,
    pub kind: Kind,
    pub code: String,
    /// The occurrence: the episode's start (a `recover` carries it too, as ClusterD asks).
    pub fault_time_unix_ms: u64,
    /// The NPUs' physical ids, as the `occur` named them.
    pub device_ids: Vec<u32>,
    pub description: String,
    /// When its last message was written.
    pub sent_unix_ms: u64,
}

/// What the agent published for one engine; in the state file under `public_fault`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Published {
    /// The fault whose `occur` was written and whose `recover` was not yet.
    pub open: Option<FaultSent>,
    /// The last fault recovered, while its `recover` is written once more
    /// (`public_fault_refresh` later: ClusterD may have dropped the first).
    pub recovered: Option<FaultSent>,
    /// When the last message was written (the minimum interval).
    pub last_write_unix_ms: Option<u64>,
    /// Messages written.
    pub messages: u64,
}
