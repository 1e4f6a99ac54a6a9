//! The live views' stream (`GET /events`, read by the admin page and `npu-health-agent
//! top`): its three frames, `hello` once, `samples` every frame interval and `engines` once
//! a second.

use crate::{Level, Status};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The `hello` frame.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hello {
    /// The node the agent runs on (`[agent.kubernetes] node_name`, else `$NODE_NAME`, else the host name): the views' title names it.
    #[serde(default)]
    pub node: String,
    pub version: String,
    /// The sampling period in force, milliseconds.
    pub period_ms: f64,
    pub frame_interval_ms: u64,
    /// Span of the history in the first `samples` frame, seconds.
    pub history_s: f64,
    pub npus: Vec<Npu>,
    pub engines: Vec<String>,
}

/// One NPU as the views name it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Npu {
    /// Index in the ring (the `i` of [`NpuSamples`]).
    pub index: u16,
    /// Logic id, as `npu-smi` and the metrics name it.
    pub id: u32,
    pub name: String,
    /// The engines it serves.
    pub engines: Vec<String>,
}

/// The `samples` frame: every sample since the previous frame.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Samples {
    /// Now, on the ring's clock (milliseconds since the agent started sampling).
    pub now_ms: f64,
    pub npus: Vec<NpuSamples>,
}

/// One NPU's samples, oldest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NpuSamples {
    pub i: u16,
    /// Times on the ring's clock, milliseconds.
    pub t: Vec<f64>,
    /// AI Cube percent; `null` for a failed or stale reading (never drawn as 0).
    pub v: Vec<Option<u8>>,
}

/// The `engines` frame.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EnginesFrame {
    pub at_unix_ms: u64,
    pub engines: Vec<EngineLine>,
    /// The last changes and Kubernetes API attempts over every engine, newest first.
    pub recent: Vec<Recent>,
    /// NPU figures that change slowly (HBM, health, backend, stale).
    pub npus: Vec<NpuState>,
}

/// One engine, as the views show it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EngineLine {
    pub name: String,
    pub status: Status,
    pub reason: String,
    pub policy: String,
    pub level: Level,
    pub score: Option<f64>,
    pub ready: bool,
    pub ready_reason: String,
    pub live: bool,
    pub live_reason: String,
    pub failure_count: i64,
    /// The reference's limit (`max_failure_count`): any counted failure reaches it.
    pub max_failure_count: i64,
    /// The policy's own limit (the limit of the policy in force): `confirm_failures` under `agent`.
    #[serde(default)]
    pub failure_limit: i64,
    pub last_probe: Option<ProbeLine>,
    /// What each router polling the agent was last told (`haproxy`: `drain`, …).
    #[serde(default)]
    pub routers: BTreeMap<String, String>,
    /// The driver's faults on the engine's NPUs, each with what it does to the engine:
    /// `NPU 0 reports 0x80E18402 (…), level SeparateNPU: one immediate confirming probe; …`.
    #[serde(default)]
    pub faults: Vec<String>,
}

/// The last virtual probe.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProbeLine {
    pub at_unix_ms: u64,
    pub success: bool,
    pub outcome: String,
    pub latency_ms: f64,
}

/// One recent action, for any integration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Recent {
    pub engine: String,
    pub at_unix_ms: u64,
    /// `<integration> <action>`: `node_manager status`, `agent level`, `kubelet readyz`,
    /// `kubelet livez`, `haproxy agent_check`, `envoy health_check`, `kubernetes_api
    /// eviction`, ….
    pub what: String,
    /// `from -> to`, or the API call's outcome.
    pub change: String,
    /// The QoS level at that moment.
    #[serde(default)]
    pub level: String,
    pub detail: String,
}

/// One NPU's slow figures.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NpuState {
    pub i: u16,
    pub backend: String,
    pub stale: bool,
    pub hung: bool,
    pub health: Option<u32>,
    pub hbm_used_mb: Option<u64>,
    pub hbm_total_mb: Option<u64>,
    /// The driver's current fault codes, with their levels (`NPU 0 reports 0x… (…), level …`).
    #[serde(default)]
    pub faults: Vec<String>,
}
