//! `/status/detail` of one engine: the verdict and everything behind it, and `{"engines":
//! [...]}`, the admin listener's list of every engine's.

use crate::{
    ActionRecord, BrakeRecord, Condition, EngineQos, EvidenceRecord, FaultEffect, FaultLevel,
    HealthDetail, KubeRecord, Phase, Policy, ProbeRecord, Role, RouterSeen, RuleRecord,
    ShadowRecord, SourceReason, Status,
};
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::collections::BTreeMap;

/// A name the agent writes from a constant and a client reads into a `String`.
pub type Text = Cow<'static, str>;

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
    pub policy: Policy,
    pub policy_source: String,
    /// `host:port` of the engine's inference surface.
    pub inference: String,
    pub conditions: Vec<Condition>,
    pub health: HealthDetail,
    pub virtual_inference: VirtualInference,
    pub qos: EngineQos,
    pub window: Window,
    /// What the Kubernetes API mode did about the engine; `null` while the mode is off.
    pub kubernetes: Option<KubeRecord>,
    /// What each router that polls the agent was last told (`haproxy`), by router; empty
    /// until one polls.
    #[serde(default)]
    pub routers: BTreeMap<String, RouterSeen>,
    /// The last actions for every integration, oldest first.
    #[serde(default)]
    pub actions: Vec<ActionRecord>,
    /// The evidence bundles kept at its verdicts (`[agent] evidence_dir`).
    #[serde(default)]
    pub evidence: EvidenceRecord,
    /// The engine's `abnormal` episodes and whether they make a restart loop.
    #[serde(default)]
    pub episodes: AbnormalEpisodes,
    /// Every rule of docs/policy.md: its mode here and how often it fired.
    #[serde(default)]
    pub rules: Vec<RuleRecord>,
    /// The shadow beside the policy in force; `null` without one.
    #[serde(default)]
    pub shadow: Option<ShadowRecord>,
    /// The fleet brake's hold on the engine (docs/kubernetes.md, "The fleet brake"); `null`
    /// with the brake off.
    #[serde(default)]
    pub brake: Option<BrakeRecord>,
}

/// The engine's `abnormal` episodes (one begins when the verdict turns `abnormal`, and ends
/// when it is `normal` again) and the restart-loop escalation they make.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AbnormalEpisodes {
    /// Episodes begun in the last hour.
    pub last_hour: u32,
    /// Episodes begun in the last day.
    pub last_day: u32,
    /// Episodes begun within `escalate_window`.
    pub in_window: u32,
    /// An episode is under way.
    pub open: bool,
    /// `escalate_after` episodes within `escalate_window`, and no clean window since.
    pub escalated: bool,
    pub escalate_after: u32,
    pub escalate_window_s: f64,
    /// When each episode of the last day began (Unix milliseconds), oldest first.
    pub starts_unix_ms: Vec<u64>,
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
    /// The limit of the policy in force: under `agent`, `confirm_failures` (confirmed
    /// failures; an unconfirmed one still counts toward `max_failure_count`).
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
    /// The source's name (`dcmi-multi`, `dcmi-single`, `npu-smi`, …, `<backend>-<method>`
    /// for any other pair): the agent's sampler keeps it as a backend and a method.
    pub source: Text,
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
    pub level: FaultLevel,
    pub effect: FaultEffect,
    /// The effect in words.
    pub note: String,
}
