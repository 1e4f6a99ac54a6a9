//! What the agent sends on `/status`, `/status/detail`, `/qos` and `/events`, as plain types:
//! the agent writes them, and the chaos runner, `top` and the tests read them back, so a word
//! renamed breaks the build of every reader, not a dashboard. Depends on serde only, so the
//! readers need not link the agent to read its answers; no type here holds the agent's clocks.
//!
//! The agent sends objects with their keys sorted at every level (through
//! `serde_json::Value`), so the bytes on the wire do not depend on the order fields are
//! declared in here.

mod actions;
mod brake;
mod detail;
mod device;
mod events;
mod evidence;
mod health;
mod kube;
mod level;
mod phase;
mod probe;
mod qos;
mod rules;
mod settings;
mod status;

pub use actions::{ActionRecord, RouterSeen};
pub use brake::{BrakeGate, BrakeRecord};
pub use detail::{
    AbnormalEpisodes, DeviceFault, EngineDetail, Engines, Text, VirtualInference, Window,
    WindowDevice,
};
pub use device::{FaultEffect, FaultLevel, SourceReason};
pub use events::{
    EngineLine, EnginesFrame, Hello, Npu, NpuSamples, NpuState, ProbeLine, Recent, Samples,
};
pub use evidence::EvidenceRecord;
pub use health::{HealthDetail, HealthState, Transport};
pub use kube::{Attempt, ConditionSet, KEPT_ATTEMPTS, KubeRecord, Outcome, PodAction};
pub use level::Level;
pub use phase::Phase;
pub use probe::{Accounting, Condition, ProbeRecord};
pub use qos::{Component, EngineQos, Progress, QosDevice, QosReport, StallDetection, round3};
pub use rules::{Disagreement, KEPT_TURNS, RuleRecord, ShadowHistory, ShadowRecord, Turn};
pub use settings::{Policy, Role};
pub use status::Status;
