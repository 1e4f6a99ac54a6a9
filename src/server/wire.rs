//! The JSON the agent serves on `/status/detail` and `/qos`, as typed structs. The server
//! builds them; the chaos runner and the tests read them back with `serde_json`, so a field
//! renamed or moved breaks the build and `tests/verdicts/wire_shapes.rs`, not a dashboard.
//!
//! Objects go out with their keys sorted, at every level (they pass through
//! `serde_json::Value`, as the hand-built JSON always did), so the bytes on the wire do not
//! depend on the order fields are declared in.

use crate::config::mindie::Role;
use crate::monitor::HealthDetail;
use crate::monitor::gates::Condition;
use crate::probe::outcome::ProbeRecord;
use crate::qos::QosReport;
use crate::sampler::source::{Source, SourceReason};
use npu_health_wire::Phase;
use npu_health_wire::Status;
use serde::{Deserialize, Serialize};
use std::borrow::Cow;

/// A name the agent writes from a constant and a client reads into a `String`.
pub(crate) type Text = Cow<'static, str>;

/// `{"engines": [...]}`: every engine, on the admin listener.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Engines<T> {
    pub engines: Vec<T>,
}

/// `/status/detail` of one engine: the verdict and everything behind it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EngineDetail {
    pub engine: String,
    pub status: Status,
    pub reason: String,
    pub role: Role,
    /// The detection policy in force (`reference` or `agent`) and where it came from.
    pub policy: crate::config::policy::Policy,
    pub policy_source: String,
    /// `host:port` of the engine's inference surface.
    pub inference: String,
    pub conditions: Vec<Condition>,
    pub health: HealthDetail,
    pub virtual_inference: VirtualInference,
    pub qos: EngineQos,
    pub window: Window,
    /// What the Kubernetes API mode did about the engine; `null` while the mode is off.
    pub kubernetes: Option<crate::integrations::kubernetes::told::KubeRecord>,
    /// What each router that polls the agent was last told (`haproxy`), by router; empty
    /// until one polls.
    #[serde(default)]
    pub routers: std::collections::BTreeMap<String, npu_health_wire::RouterSeen>,
    /// The last actions for every integration, oldest first (`monitor::journal`).
    #[serde(default)]
    pub actions: Vec<npu_health_wire::ActionRecord>,
}

/// The virtual inference loop, as `/status/detail` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VirtualInference {
    pub phase: Phase,
    pub abnormal: bool,
    pub abnormal_reason: Option<String>,
    pub warmup_done: bool,
    pub failure_count: i64,
    /// The reference's limit: counted failures that make the engine abnormal.
    pub max_failure_count: i64,
    /// The limit of the policy in force ([`crate::view::failure_limit`]): under `agent`,
    /// `confirm_failures` (confirmed failures; an unconfirmed one still counts toward
    /// `max_failure_count`).
    pub failure_limit: i64,
    pub npu_usage_threshold: f64,
    pub interval_s: f64,
    pub last_probe: Option<ProbeRecord>,
    pub rearms: u64,
}

/// The AI Cube window over the engine's NPUs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Window {
    pub seconds: f64,
    /// `null`: unavailable (no valid sample).
    pub peak: Option<u8>,
    pub valid: u32,
    pub invalid: u32,
    pub truncated: bool,
    pub devices: Vec<WindowDevice>,
}

/// One NPU of the window: its figures and where they come from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WindowDevice {
    pub id: u32,
    pub backend: Text,
    pub method: Text,
    pub source: Source,
    pub source_reason: SourceReason,
    pub source_note: String,
    pub device_gone: bool,
    pub peak: Option<u8>,
    pub mean: Option<f64>,
    pub valid: u32,
    pub invalid: u32,
    pub stale: bool,
    pub hung: bool,
    pub last_error: Option<i32>,
    pub hbm_used_mb: Option<u64>,
    pub hbm_total_mb: Option<u64>,
    pub health: Option<u32>,
    /// The driver's current fault codes on the NPU, each with its MindCluster level and
    /// what it does to this engine under its policy.
    #[serde(default)]
    pub faults: Vec<DeviceFault>,
    /// Age of the fault codes, milliseconds (`null`: never read).
    #[serde(default)]
    pub faults_age_ms: Option<u64>,
    /// Why the last fault read failed (the codes shown are the last read that succeeded).
    #[serde(default)]
    pub faults_error: Option<String>,
}

/// One fault code the driver reports on an NPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceFault {
    pub code: u32,
    /// `0x80E18402`.
    pub hex: String,
    pub text: Option<String>,
    pub level: crate::driver::fault_levels::FaultLevel,
    pub effect: crate::monitor::evidence::driver_faults::FaultEffect,
    /// The effect in words.
    pub note: String,
}

impl DeviceFault {
    /// `f` as an engine under the agent policy (`agent`) or the reference sees it.
    pub(crate) fn of(f: crate::sampler::faults::NpuFault, agent: bool) -> DeviceFault {
        let effect = crate::monitor::evidence::driver_faults::fault_effect(agent, f.level);
        DeviceFault {
            code: f.code,
            hex: f.hex,
            text: f.text,
            level: f.level,
            effect,
            note: effect.describe().to_owned(),
        }
    }
}

/// `/qos` of one engine, and `qos` in its detail: the score and level
/// ([`QosReport`], its fields at this level), with the engine's name and device signals.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EngineQos {
    pub engine: String,
    pub model: Option<String>,
    #[serde(flatten)]
    pub state: QosReport,
    /// A held `evict` makes `/status` answer `abnormal` right now.
    pub evicting: bool,
    pub stall_detection: StallDetection,
    pub device: QosDevice,
}

/// The stall-detection settings `/qos` shows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StallDetection {
    pub enabled: bool,
    pub window_s: f64,
    pub skip_when_capacity_waiting: bool,
}

/// The device signals `/qos` shows (not scored: see `docs/qos.md`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QosDevice {
    pub window_s: f64,
    pub ai_cube_peak: Option<u8>,
    pub ai_cube_mean: Option<f64>,
    pub hbm_used_mb: Option<u64>,
    pub hbm_total_mb: Option<u64>,
    pub hbm_ratio: Option<f64>,
    pub scored: bool,
}

/// `value` as the JSON the server sends: keys sorted at every level.
pub fn to_json<T: Serialize>(value: &T) -> serde_json::Value {
    serde_json::to_value(value).unwrap_or_else(|e| {
        // Only a map with non-string keys or a failing Serialize impl can fail here; none
        // of the types above has either.
        serde_json::json!({ "error": format!("cannot encode: {e}") })
    })
}
