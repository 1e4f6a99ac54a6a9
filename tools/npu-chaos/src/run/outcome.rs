//! What one experiment concluded: its verdict, the load's figures, the timeline of samples,
//! the guards' events and what the kubelet emulator did (the JSON and Markdown reports read
//! these).

use super::options::{Cadence, Integration, NodeManagerKind, Policy, Row};
use crate::agent::{AgentOp, Supervisor};
use serde::Serialize;

/// One sample of the timeline.
#[derive(Debug, Clone, Serialize)]
pub struct TimelinePoint {
    /// Milliseconds since the fault was (or would have been) injected; negative before.
    pub t_ms: i64,
    /// `/status` as the agent answers it (`down` when it does not answer).
    pub status: String,
    pub qos_score: Option<f64>,
    pub qos_level: Option<String>,
    pub ai_cube_peak: Option<f64>,
    pub fault_active: bool,
    /// The agent reports an NPU as failing (stale, hung or erroring reads).
    pub driver_flagged: bool,
    /// `vllm:num_requests_waiting` of the engine.
    pub queue_depth: Option<f64>,
}

/// A guard that tripped (or cleared).
#[derive(Debug, Clone, Serialize)]
pub struct GuardEvent {
    pub t_ms: i64,
    pub guard: String,
    /// `skipped` (injection held back), `resumed`, or `aborted` (injection stopped for good).
    pub action: &'static str,
    pub detail: String,
}

/// What an experiment concluded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Benign and no kill; or a fault detected in time (and, for a driver fault, no kill).
    Pass,
    /// A healthy engine was killed.
    FalseKill,
    /// A healthy engine was killed, as this policy is known to (the experiment's
    /// `known_false_kill`): measured and counted as a false kill, not a failure of the run.
    KnownFalseKill,
    /// The fault was not detected within `detect_within`.
    Missed,
    /// The policy cannot detect this fault by design (declared in the experiment file).
    NotDetectableByDesign,
    /// The experiment could not run (the stack did not come up).
    Error,
    /// A router row whose draft answered requests though the agent never told the router to
    /// take the main engine out (HAProxy `drain`, `maint` or `down`; Envoy `unhealthy` or
    /// `degraded`): the draft must serve only where the agent said so.
    DraftWithoutCause,
    /// The fault cannot be injected into this engine (the reason is in `error`); neither a
    /// pass nor a failure.
    NotApplicable,
    /// A benign experiment in which the agent escalated the engine as a restart loop
    /// (issue 50): no benign case may look like one.
    EscalatedBenign,
    /// A repeated fault (`repeat:`) whose episodes the agent did not escalate as a restart
    /// loop exactly from its `escalate_after`-th one on, or whose episode count was not one
    /// per hang (the reason names the hang).
    WrongEscalation,
}

/// One hang of a repeated fault (`repeat:`): when it was injected and killed, and what the
/// agent's `/status/detail` said of its episodes at Node Manager's kill decision.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Round {
    /// 1 for the first hang.
    pub hang: u32,
    /// Milliseconds from the first hang's injection to this one's (the run's clock).
    pub injected_at_ms: i64,
    /// Requests the load had completed when this hang was injected: it grows between two
    /// hangs when the restarted engine serves again.
    pub completed_before: u64,
    /// Milliseconds from this hang's injection to Node Manager's kill decision; `null`: not
    /// killed within `detect_within`.
    pub killed_after_ms: Option<u64>,
    /// `/status/detail`'s `episodes` at the kill decision (`null`: no detail answered).
    pub episodes: Option<npu_health_wire::AbnormalEpisodes>,
    /// `/status/detail`'s `reason` at the kill decision.
    pub reason: Option<String>,
}

/// The result of one experiment under one policy.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    pub experiment: String,
    pub target: crate::experiment::Target,
    pub fault: String,
    pub policy: Policy,
    /// Who acted on the agent's answers.
    pub integration: Integration,
    /// Node Manager's cadence (`null` in a kubelet run).
    pub cadence: Option<Cadence>,
    /// The router the load went through (`null`: straight to the engine).
    pub router: Option<crate::router::RouterKind>,
    /// `emulator`, or `pymotor` (MindIE PyMotor 3.0.0b2's own heartbeat).
    pub node_manager: NodeManagerKind,
    pub expect: String,
    pub verdict: Verdict,
    /// Milliseconds from injection to detection.
    pub detected_after_ms: Option<u64>,
    /// Milliseconds from the first injection to the agent's own `abnormal` (the probe that
    /// decided it), whoever acts on it; `null` when it never said so.
    #[serde(default)]
    pub abnormal_after_ms: Option<u64>,
    /// Milliseconds from injection to the emulator's kill (negative: before the injection).
    pub killed_at_ms: Option<i64>,
    /// Milliseconds from the scheduled injection to the first sample whose `/status/detail`
    /// said the engine was escalated as a restart loop (negative: before); `null`: never. A
    /// benign experiment must leave it `null` ([`Verdict::EscalatedBenign`]).
    #[serde(default)]
    pub escalated_at_ms: Option<i64>,
    /// What the agent said about its rules and its shadow (`/status/detail`'s `rules` and
    /// `shadow`); `null` when no rule fired and there is no shadow (issue 50).
    #[serde(default)]
    pub shadow: Option<super::ShadowSeen>,
    /// Milliseconds from the scheduled injection to the first actual one (guards may hold it
    /// back); `null` when the fault was never injected.
    pub first_injected_ms: Option<i64>,
    /// How long the fault was actually injected.
    pub injected_ms: u64,
    pub guard_events: Vec<GuardEvent>,
    /// What the load generator saw: requests attempted, completed, failed, timed out, and
    /// the availability (completed over attempted).
    pub load: crate::load::LoadSnapshot,
    /// The requests sent from the agent's first `abnormal` after the injection to the end
    /// of the experiment ([`AFTER_KILL_TAIL`](super::observe::AFTER_KILL_TAIL) included), however they ended: what clients
    /// saw once the agent had said so. `null` when it never said `abnormal`.
    #[serde(default)]
    pub load_after_abnormal: Option<crate::load::LoadSnapshot>,
    /// What the agent told the router, in a router row (from its action journal).
    #[serde(default)]
    pub router_actions: Vec<crate::router::RouterAction>,
    pub error: Option<String>,
    /// Set when this is the second attempt: why the first did not count (a real vLLM that
    /// died by itself).
    pub ran_again_after: Option<String>,
    /// What the kubelet emulator did (kubelet runs only).
    pub kubelet: Option<KubeletOutcome>,
    /// Why Node Manager killed, when it did: the emulator's last polls before its decision
    /// (time before the kill, what it read, the error and the answer time) and the agent's
    /// last warnings. Printed with a false kill, so that a failed run explains itself.
    pub kill_evidence: Vec<String>,
    /// Who ran the agent: `direct` (a child of the runner) or `systemd` (a unit of a private
    /// user manager, derived from the shipped unit).
    pub agent_supervisor: Supervisor,
    /// Why the agent ran under another supervisor than asked or expected, if it did.
    pub agent_supervisor_note: Option<String>,
    /// What the runner did to the agent (its own faults): pids, when the new process ran and
    /// first answered `/status`.
    pub agent_ops: Vec<AgentOp>,
    /// What each poller of the agent saw in the fault window: Node Manager's polls (or
    /// PyMotor's heartbeats), or the kubelet's `/readyz` and `/livez` probes.
    pub polls: Vec<crate::polls::PollFigures>,
    pub timeline: Vec<TimelinePoint>,
    /// A repeated fault's hangs, in order (empty for any other experiment).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub rounds: Vec<Round>,
}

/// What the kubelet emulator did in one experiment. Times are milliseconds from the first
/// injection, on the run's clock.
#[derive(Debug, Clone, Serialize)]
pub struct KubeletOutcome {
    pub expect: crate::experiment::KubeletExpect,
    /// Every action, with its time from the scheduled injection (negative: before).
    pub actions: Vec<(i64, crate::kubelet::Action)>,
    /// Restarts on a failed liveness probe.
    pub liveness_restarts: u32,
    /// Restarts of a container that exited.
    pub exit_restarts: u32,
    /// The first not-ready after the first injection.
    pub not_ready_after_ms: Option<u64>,
    /// The first restart (either kind) after the first injection.
    pub restart_after_ms: Option<u64>,
    /// How long the engine was not ready in all.
    pub not_ready_ms: u64,
}

impl Outcome {
    /// The summary row this outcome belongs to.
    pub fn row(&self) -> Row {
        match (self.integration, self.cadence, self.router) {
            (_, _, Some(r)) => Row::Router(r),
            (Integration::NodeManager, Some(c), None) => Row::NodeManager(c),
            _ => Row::Kubelet,
        }
    }
    /// The error of an experiment whose real vLLM died by itself, if that is how it ended.
    pub fn real_engine_died(&self) -> Option<String> {
        self.error
            .clone()
            .filter(|e| self.verdict == Verdict::Error && e.starts_with(REAL_ENGINE_DIED))
    }
}

/// How the error of an experiment whose real vLLM died by itself begins.
pub(super) const REAL_ENGINE_DIED: &str = "the real vLLM died by itself";
