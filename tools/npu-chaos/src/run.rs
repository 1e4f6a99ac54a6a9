//! One experiment, end to end, as real processes on loopback: the fake engine (the agent
//! binary's `fake-engine` command), a latency proxy in front of it, the agent release binary
//! on the fake `libdcmi.so` (real dlopen) reaching the engine through the proxy, the load
//! generator, and the Node Manager emulator polling the agent's `/status`. Every interval —
//! the agent's, the emulator's, the engine's speed, the fault's — is multiplied by
//! `time_scale`. Processes are killed and reaped when the experiment ends, however it ends
//! (they are `kill_on_drop`).
//!
//! Phases: start, warm-up (until virtual inference runs), baseline (10 s with load), the fault
//! for `duration` (guards evaluated at every sample), then observation: until detection or
//! `detect_within` for a fault, 30 s after the fault for a benign experiment, so that a late
//! kill is still seen.
//!
//! With `--engine vllm` the engine is a real vLLM ([`super::real_engine`]): the agent's and
//! Node Manager's intervals are still scaled, the engine runs at its own speed, and a fault
//! that cannot be injected into it ends as `not_applicable`, never as a pass.

use super::agent::{self, Agent, AgentOp, Supervisor};
use super::experiment::{Expect, Experiment, Fault, Guard};
use super::load::LoadGen;
use super::proxy::Proxy;
use super::real_engine::{self, RealEngine};
use super::stress::CpuStress;
use fake_engine::node_manager::{self, NmOptions, NmReport};
use npu_health_agent::monitor::Status;
use npu_health_agent::monitor::vi_state::Phase;
use npu_health_agent::probe::engine_metrics;
use npu_health_agent::server::wire::{EngineDetail, EngineQos};
use serde::Serialize;
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::process::{Child, Command};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Which detection policy the agent runs (`policy` in its `[agent]` table).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Policy {
    /// `policy = "reference"`: MindIE V5's virtual inference exactly (QoS only reported).
    Reference,
    /// `policy = "agent"`: the `/health` grace, fast confirmation, stall detection and QoS
    /// eviction (docs/policy.md).
    #[value(alias = "full")]
    Agent,
    /// Not the agent: MindIE's released engine server (PyMotor 3.0.0b2, unmodified) serves
    /// `/status` from its own virtual inference, on the same fake engine and NPUs. Its timing
    /// is fixed, so it runs only at `--time-scale 1`.
    #[value(name = "mindie-3.0.0b2")]
    #[serde(rename = "mindie-3.0.0b2")]
    Mindie,
}

impl Policy {
    /// Name in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Policy::Reference => "reference",
            Policy::Agent => "agent",
            Policy::Mindie => "mindie-3.0.0b2",
        }
    }

    /// Why this policy cannot run the experiment here, if it cannot.
    pub fn not_applicable(self, opts: &RunOptions, fault: Fault) -> Option<String> {
        if opts.row == Row::Kubelet {
            if self == Policy::Mindie {
                return Some("MindIE's engine server serves no /readyz or /livez: the kubelet has nothing of it to probe".to_owned());
            }
            if opts.engine != EngineKind::Fake {
                return Some("the kubelet emulator restarts the fake engine only (a real vLLM reloads its model for most of a minute per restart here)".to_owned());
            }
        }
        if self != Policy::Mindie {
            return None;
        }
        if opts.engine != EngineKind::Fake {
            return Some("MindIE's engine server requires its engine's /health body to be `true` (its own inference surface answers so); vLLM answers an empty body, which it reads as abnormal".to_owned());
        }
        if opts.time_scale != 1.0 {
            return Some("MindIE's engine server has fixed timing (5 s timeout, 6 npu-smi samples 0.5 s apart, 5 s sleep): it runs at --time-scale 1 only".to_owned());
        }
        if is_driver_fault(fault) {
            return Some("MindIE's engine server does not report the NPU's reads (it samples npu-smi and keeps no per-NPU state)".to_owned());
        }
        if fault.is_agent_fault() {
            return Some("the agent's faults act on npu-health-agent; under this policy MindIE's engine server serves /status instead".to_owned());
        }
        None
    }
}

/// A Node Manager cadence: its heartbeat interval, and with it the poll timeout of the
/// release that uses it (`--nm-heartbeat`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Cadence {
    /// The heartbeat interval in (unscaled) seconds.
    pub heartbeat_s: u64,
}

impl Cadence {
    /// MindIE PyMotor 3.0.0b2 (PyPI): a 1 s heartbeat, a 2 s poll timeout.
    pub const PYMOTOR: Cadence = Cadence { heartbeat_s: 1 };
    /// The reference (virtual-inference-reference §5): a 3 s heartbeat, a 5 s poll timeout.
    pub const REFERENCE: Cadence = Cadence { heartbeat_s: 3 };

    /// Parses `1s`, `3s`, … (whole seconds, 1..=60).
    pub fn parse(s: &str) -> Result<Cadence, String> {
        let d = humantime::parse_duration(s.trim())
            .map_err(|e| format!("{s:?} is not a duration like 1s: {e}"))?;
        if d.subsec_nanos() != 0 || !(1..=60).contains(&d.as_secs()) {
            return Err(format!(
                "{s:?}: a heartbeat is whole seconds, 1s..=60s (Node Manager's is an int)"
            ));
        }
        Ok(Cadence {
            heartbeat_s: d.as_secs(),
        })
    }

    /// The heartbeat interval, unscaled.
    pub fn heartbeat(self) -> Duration {
        Duration::from_secs(self.heartbeat_s)
    }

    /// `1s`, `3s`.
    pub fn label(self) -> String {
        format!("{}s", self.heartbeat_s)
    }

    /// The poll timeout: 2 s below a 3 s heartbeat (3.0.0b2's), 5 s from it (the
    /// reference's).
    pub fn poll_timeout(self) -> Duration {
        if self.heartbeat_s < Cadence::REFERENCE.heartbeat_s {
            Duration::from_secs(2)
        } else {
            Duration::from_secs(5)
        }
    }

    /// The emulator's settings at this cadence: polls every (scaled) second, a heartbeat
    /// every (scaled) interval, 5 consecutive abnormal heartbeats kill; the node is past its
    /// grace period. The poll timeout is *not* scaled: it bounds how long the agent takes to
    /// answer `/status`, which compressing the experiment does not shorten. (Scaled to
    /// 400 ms at 0.2, it made a real vLLM's run under 100 % CPU stress a "false kill" on
    /// slow polls that a real Node Manager, with its 2 s, would have waited out.)
    pub fn nm_options(self, status_urls: Vec<String>, s: f64) -> NmOptions {
        let mut nm = NmOptions::reference(status_urls, s);
        nm.heartbeat_interval = scaled(self.heartbeat(), s);
        nm.poll_timeout = self.poll_timeout();
        nm.grace_period = Duration::ZERO;
        nm
    }
}

/// Who acts on the agent's answers in a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Integration {
    /// Node Manager polls `/status` and kills after 5 abnormal heartbeats.
    NodeManager,
    /// The kubelet probes `/readyz` and `/livez` ([`super::kubelet`]): not ready takes the
    /// engine out of the load, a liveness failure restarts it.
    Kubelet,
}

/// A row of the summary: Node Manager at one cadence, the kubelet, or the load through a
/// router (with Node Manager at its 1 s cadence).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Row {
    NodeManager(Cadence),
    Kubelet,
    Router(super::router::RouterKind),
}

impl Row {
    /// `1s`, `3s`, `kubelet`, `haproxy`, `envoy`.
    pub fn label(self) -> String {
        match self {
            Row::NodeManager(c) => c.label(),
            Row::Kubelet => "kubelet".to_owned(),
            Row::Router(r) => r.as_str().to_owned(),
        }
    }

    /// Node Manager's cadence, where Node Manager acts.
    pub fn cadence(self) -> Option<Cadence> {
        match self {
            Row::NodeManager(c) => Some(c),
            Row::Kubelet => None,
            Row::Router(_) => Some(Cadence::PYMOTOR),
        }
    }

    /// The router the load goes through, in a router row.
    pub fn router(self) -> Option<super::router::RouterKind> {
        match self {
            Row::Router(r) => Some(r),
            _ => None,
        }
    }

    pub fn integration(self) -> Integration {
        match self {
            Row::NodeManager(_) | Row::Router(_) => Integration::NodeManager,
            Row::Kubelet => Integration::Kubelet,
        }
    }
}

/// Which engine the experiments run against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum EngineKind {
    /// The fake engine (the agent binary's `fake-engine`), faults through its control API.
    Fake,
    /// A real vLLM started by `scripts/real-vllm`, faults injected for real.
    Vllm,
}

/// How to run experiments.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// The agent binary built with `fake-driver` (it is also the fake engine).
    pub agent_exe: PathBuf,
    pub time_scale: f64,
    /// Where each experiment's files and logs go.
    pub out_dir: PathBuf,
    pub engine: EngineKind,
    /// `scripts/real-vllm` (for `EngineKind::Vllm`).
    pub real_vllm_script: PathBuf,
    /// The real engine, kept between experiments (`None` inside: not started, or killed).
    pub real: std::sync::Arc<tokio::sync::Mutex<Option<RealEngine>>>,
    /// Who acts in this run: Node Manager at its cadence, or the kubelet.
    pub row: Row,
    /// MindIE PyMotor 3.0.0b2's own `HeartbeatManager` instead of the emulator
    /// (`--node-manager pymotor`; real time only).
    pub pymotor_nm: Option<super::pymotor::Pymotor>,
    /// The PyMotor installation, for the `mindie-3.0.0b2` peer (found when it can run).
    pub pymotor: Option<super::pymotor::Pymotor>,
    /// `--agent-supervisor`; `None`: systemd for an agent fault when a private user manager
    /// can start, direct otherwise.
    pub agent_supervisor: Option<Supervisor>,
    /// The repository (where `scripts/routers` puts Envoy).
    pub repo: PathBuf,
}

/// Which Node Manager polls `/status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum NodeManagerKind {
    /// The emulator (the reference's rules, any cadence, any time scale).
    Emulator,
    /// MindIE PyMotor 3.0.0b2's `HeartbeatManager` from PyPI, unmodified, in real time.
    Pymotor,
}

impl RunOptions {
    /// The model the engine serves.
    fn model(&self) -> &'static str {
        match self.engine {
            EngineKind::Fake => "m",
            EngineKind::Vllm => "tiny",
        }
    }
}

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
}

/// The result of one experiment under one policy.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    pub experiment: String,
    pub target: super::experiment::Target,
    pub fault: String,
    pub policy: Policy,
    /// Who acted on the agent's answers.
    pub integration: Integration,
    /// Node Manager's cadence (`null` in a kubelet run).
    pub cadence: Option<Cadence>,
    /// The router the load went through (`null`: straight to the engine).
    pub router: Option<super::router::RouterKind>,
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
    /// Milliseconds from the scheduled injection to the first actual one (guards may hold it
    /// back); `null` when the fault was never injected.
    pub first_injected_ms: Option<i64>,
    /// How long the fault was actually injected.
    pub injected_ms: u64,
    pub guard_events: Vec<GuardEvent>,
    /// What the load generator saw: requests attempted, completed, failed, timed out, and
    /// the availability (completed over attempted).
    pub load: super::load::LoadSnapshot,
    /// The requests sent from the agent's first `abnormal` after the injection to the end
    /// of the experiment ([`AFTER_KILL_TAIL`] included), however they ended: what clients
    /// saw once the agent had said so. `null` when it never said `abnormal`.
    #[serde(default)]
    pub load_after_abnormal: Option<super::load::LoadSnapshot>,
    /// What the agent told the router, in a router row (from its action journal).
    #[serde(default)]
    pub router_actions: Vec<super::router::RouterAction>,
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
    pub polls: Vec<super::polls::PollFigures>,
    pub timeline: Vec<TimelinePoint>,
}

/// What the kubelet emulator did in one experiment. Times are milliseconds from the first
/// injection, on the run's clock.
#[derive(Debug, Clone, Serialize)]
pub struct KubeletOutcome {
    pub expect: super::experiment::KubeletExpect,
    /// Every action, with its time from the scheduled injection (negative: before).
    pub actions: Vec<(i64, super::kubelet::Action)>,
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
const REAL_ENGINE_DIED: &str = "the real vLLM died by itself";

/// Whether the engine's or the agent's log in an experiment's `dir` says a port was taken.
fn port_was_taken(dir: &Path) -> bool {
    ["engine.log", "agent.log"].iter().any(|f| {
        std::fs::read_to_string(dir.join(f)).is_ok_and(|t| t.contains("Address already in use"))
    })
}

/// How often a stack is started afresh, on new ports, when a process of it could not bind
/// its port ("Address already in use": taken between the pick and the bind).
const START_ATTEMPTS: usize = 3;

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// The scaled duration.
fn scaled(d: Duration, s: f64) -> Duration {
    Duration::from_secs_f64(d.as_secs_f64() * s)
}

/// A duration as configs and flags take it, to the microsecond (at least 1 µs).
fn fmt_duration(d: Duration) -> String {
    format!("{}us", d.as_micros().max(1))
}

/// How long after a fault a late kill is still watched for: a busy probe cycle (20 s + 5 s),
/// three QoS evaluations (15 s) and Node Manager's five heartbeats (15 s).
const LATE_KILL_TAIL: Duration = Duration::from_secs(55);

/// How long the load goes on after Node Manager's kill of a faulty engine (scaled), in a
/// Node Manager row and a router row alike: what clients see once the engine is gone (with
/// a router, the draft answering; without, nothing), over the same time in both rows.
pub const AFTER_KILL_TAIL: Duration = Duration::from_secs(10);

/// The `/health` timeout of the agent in front of a real engine: the reference's 5 s,
/// unscaled. It bounds how long the real engine's API server takes to answer, which
/// compressing the experiment does not shorten (as Node Manager's poll timeout bounds the
/// agent's). Scaled to 1 s at 0.2, the reference's `/health` check, which is `abnormal` at
/// once, timed out 3 times in a row on a real vLLM serving 16 long streams on 2 cores (a
/// busy loop beside it) and decided a false kill. No detection depends on it: a hung
/// EngineCore leaves `/health` answering 200, and a crashed one refuses the connection.
const REAL_ENGINE_HEALTH_TIMEOUT: Duration = Duration::from_secs(5);

/// The agent's config for one experiment.
fn agent_toml(
    engine_port: u16,
    mgmt_port: u16,
    devices: usize,
    policy: Policy,
    s: f64,
    engine: EngineKind,
    model: &str,
) -> String {
    use npu_health_agent::config::validate::{engine_bounds as e, qos_bounds as q};
    // Scaled, and kept within the agent's bounds (a very small scale would leave them).
    let d = |secs: f64, within: npu_health_agent::config::validate::Within<Duration>| {
        fmt_duration(within.clamp(Duration::from_secs_f64(secs * s)))
    };
    let ids: Vec<String> = (0..devices).map(|i| i.to_string()).collect();
    // Under `agent` the preset turns stall detection and QoS eviction on; its durations are
    // written here only because they are scaled.
    let policy_keys = match policy {
        // (The peer does not run the agent: this config is written and not used.)
        Policy::Reference | Policy::Mindie => {
            "stall_detection = false\neviction = false\n".to_owned()
        }
        Policy::Agent => {
            use npu_health_agent::config::policy::{AGENT_STALL_WINDOW, AgentPolicy};
            use npu_health_agent::config::validate::policy_bounds as p;
            let a = AgentPolicy::default();
            format!(
                "stall_window = \"{}\"\n[engine.agent_policy]\nhealth_failure_grace = \"{}\"\nconfirm_interval = \"{}\"\nconfirm_timeout = \"{}\"\n",
                d(AGENT_STALL_WINDOW.as_secs_f64(), q::STALL_WINDOW),
                d(
                    a.health_failure_grace.as_secs_f64(),
                    p::HEALTH_FAILURE_GRACE
                ),
                d(a.confirm_interval.as_secs_f64(), p::CONFIRM_INTERVAL),
                d(a.confirm_timeout.as_secs_f64(), p::CONFIRM_TIMEOUT),
            )
        }
    };
    format!(
        r#"[agent]
sample_period = "{sample}"
driver_call_deadline = "{deadline}"
fault_period = "{faults}"
policy = "{policy}"

[[engine]]
name = "chaos"
engine_type = "vllm"
served_model_name = "{model}"
host = "127.0.0.1"
port = {engine_port}
mgmt_port = {mgmt_port}
devices = [{ids}]
engine_env = {{ ASCEND_GLOBAL_LOG_LEVEL = "3" }}
[engine.health_check_config]
enable_virtual_inference = true
[engine.timing]
warmup_timeout = "{warmup}"
request_timeout = "{request}"
window = "{window}"
interval = "{interval}"
high_load_interval = "{high}"
health_period = "{health}"
health_timeout = "{health_timeout}"
[engine.qos]
period = "{qos_period}"
metrics_period = "{qos_period}"
max_input_age = "{max_age}"
ttft_budget = "{ttft_budget}"
{policy_keys}"#,
        policy = match policy {
            Policy::Agent => "agent",
            Policy::Reference | Policy::Mindie => "reference",
        },
        sample = fmt_duration(scaled(Duration::from_millis(50), s).max(Duration::from_millis(10))),
        deadline = fmt_duration(scaled(Duration::from_secs(1), s).max(Duration::from_millis(20))),
        faults = fmt_duration(scaled(Duration::from_secs(1), s).max(Duration::from_millis(10))),
        ids = ids.join(", "),
        warmup = d(180.0, e::WARMUP_TIMEOUT),
        request = d(5.0, e::REQUEST_TIMEOUT),
        window = d(5.0, e::WINDOW),
        interval = d(5.0, e::INTERVAL),
        high = d(20.0, e::HIGH_LOAD_INTERVAL),
        health = d(1.0, e::HEALTH_PERIOD),
        health_timeout = match engine {
            EngineKind::Vllm => fmt_duration(REAL_ENGINE_HEALTH_TIMEOUT),
            EngineKind::Fake => d(5.0, e::HEALTH_TIMEOUT),
        },
        qos_period = d(5.0, q::PERIOD),
        max_age = d(60.0, q::MAX_INPUT_AGE),
        ttft_budget = d(2.0, q::TTFT_BUDGET),
    )
}

/// The fake engine's speed in a run, main and draft alike: 20 ms to the first token and
/// 5 ms a token (scaled), and vLLM's default `max_num_seqs` (long streams run instead of
/// queueing).
pub fn fake_engine_speed(s: f64) -> Vec<String> {
    vec![
        "--ttft".to_owned(),
        fmt_duration(scaled(Duration::from_millis(20), s)),
        "--tpot".to_owned(),
        fmt_duration(scaled(Duration::from_millis(5), s)),
        "--max-running".to_owned(),
        "256".to_owned(),
    ]
}

/// How the fake engine is started, kept to start it again (the kubelet's restarts).
#[derive(Debug, Clone)]
struct FakeLaunch {
    exe: PathBuf,
    port: u16,
    control_port: u16,
    npu_files: Vec<PathBuf>,
    /// MindIE's own inference surface (`/health` is a JSON bool), for the peer.
    mindie: bool,
    s: f64,
}

impl FakeLaunch {
    fn spawn(&self, stderr: std::process::Stdio) -> Result<Child, String> {
        let s = self.s;
        let mut cmd = Command::from(fake_engine::launch::command(
            &self.exe,
            self.port,
            self.control_port,
            "m",
            &self.npu_files,
        ));
        if self.mindie {
            cmd.args(["--profile", "mindie"]);
        }
        cmd.args(fake_engine_speed(s))
            .stderr(stderr)
            .kill_on_drop(true);
        cmd.spawn()
            .map_err(|e| format!("starting the fake engine: {e}"))
    }
}

/// The supervisor an experiment asks for the agent ([`wanted_supervisor`]).
#[derive(Debug, Clone, PartialEq)]
struct WantedSupervisor {
    supervisor: Supervisor,
    /// Asked for by `--agent-supervisor` (no fallback to direct).
    required: bool,
    /// Why this one, when it is not what was asked.
    note: Option<String>,
}

/// Who runs the agent in an experiment: what `--agent-supervisor` says (`choice`), else
/// systemd for an agent fault (the start falls back to direct, and says so, when no private
/// user manager can run here) and direct for everything else, as always. `agent_upgrade` is
/// Kubernetes' rolling update: two direct processes whatever was asked.
fn wanted_supervisor(choice: Option<Supervisor>, fault: Fault) -> WantedSupervisor {
    let direct = |note: Option<String>| WantedSupervisor {
        supervisor: Supervisor::Direct,
        required: false,
        note,
    };
    match choice {
        _ if fault == Fault::AgentUpgrade => direct(
            (choice == Some(Supervisor::Systemd)).then(|| {
                "agent_upgrade runs two direct processes whatever --agent-supervisor says (Kubernetes has no systemd)".to_owned()
            }),
        ),
        Some(supervisor) => WantedSupervisor {
            supervisor,
            required: true,
            note: None,
        },
        None if fault.is_agent_fault() => WantedSupervisor {
            supervisor: Supervisor::Systemd,
            required: false,
            note: None,
        },
        None => direct(None),
    }
}

/// Running processes and in-process parts of one experiment.
struct Stack {
    dir: PathBuf,
    engine: Option<Child>,
    /// How the fake engine was started (`None` for a real one).
    relaunch: Option<FakeLaunch>,
    /// Restarts of the engine so far (each logs to `engine-restart<N>.log`).
    restarts: u32,
    /// The real engine (`--engine vllm`) and the follower writing its Worker's CPU use as
    /// the NPUs' AI Cube figure.
    real: Option<(RealEngine, npu_fake::follow::CpuFollower)>,
    real_slot: std::sync::Arc<tokio::sync::Mutex<Option<RealEngine>>>,
    /// Whatever serves `/status` (the agent, or MindIE's engine server), shared with the
    /// task of an agent fault.
    agent: std::sync::Arc<tokio::sync::Mutex<Agent>>,
    /// Who runs the agent, and why not the one wanted, if so.
    supervisor: Supervisor,
    supervisor_note: Option<String>,
    engine_port: u16,
    control: String,
    mgmt: String,
    proxy: Proxy,
    /// Stops the proxy (a child of the experiment's token).
    proxy_cancel: CancellationToken,
    http: reqwest::Client,
    /// `/status` is served by MindIE's engine server, not the agent.
    peer: bool,
    /// The agent's listener the router reads, in a router row.
    router_port: Option<u16>,
    /// The router in front and the draft behind it, once started ([`Stack::start_router`]).
    router: Option<super::router::Router>,
}

impl Stack {
    async fn start(
        opts: &RunOptions,
        dir: &Path,
        policy: Policy,
        want: &WantedSupervisor,
        cancel: &CancellationToken,
    ) -> Result<Stack, String> {
        let s = opts.time_scale;
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        // The agent's state directory (RUNTIME_DIRECTORY of a direct start), fresh: an
        // earlier run's state must not be taken back.
        let state_dir = dir.join("run");
        let _ = std::fs::remove_dir_all(&state_dir);
        std::fs::create_dir_all(&state_dir).map_err(|e| format!("{}: {e}", state_dir.display()))?;
        let npu_files: Vec<PathBuf> = (0..2).map(|i| dir.join(format!("npu{i}"))).collect();
        for f in &npu_files {
            std::fs::write(f, "0\n").map_err(|e| format!("{}: {e}", f.display()))?;
        }
        let scenario = dir.join("scenario.toml");
        let mut text = "model = \"910B\"\ncards = 2\n".to_owned();
        for (i, f) in npu_files.iter().enumerate() {
            text.push_str(&format!(
                "[[device]]\nid = {i}\naicube = {{ file = {:?} }}\nhbm_total_mb = 65536\nhbm_used_mb = 58000\n",
                f.display().to_string()
            ));
        }
        std::fs::write(&scenario, text).map_err(|e| e.to_string())?;
        let [fake_port, control_port, mgmt_port] =
            fake_engine::launch::free_ports().map_err(|e| format!("no free port: {e}"))?;
        let log = |name: &str| -> Result<std::process::Stdio, String> {
            std::fs::File::create(dir.join(name))
                .map(std::process::Stdio::from)
                .map_err(|e| e.to_string())
        };
        let mut relaunch = None;
        let (engine, real, engine_port) = match opts.engine {
            EngineKind::Fake => {
                let launch = FakeLaunch {
                    exe: opts.agent_exe.clone(),
                    port: fake_port,
                    control_port,
                    npu_files: npu_files.clone(),
                    mindie: policy == Policy::Mindie,
                    s,
                };
                let engine = launch.spawn(log("engine.log")?)?;
                relaunch = Some(launch);
                (Some(engine), None, fake_port)
            }
            EngineKind::Vllm => {
                let mut slot = opts.real.lock().await;
                let reuse = slot.as_ref().filter(|r| r.alive()).cloned();
                let r = match reuse {
                    Some(r) => r,
                    None => {
                        if let Some(old) = slot.take() {
                            old.down().await;
                        }
                        eprintln!("npu-chaos:   starting a real vLLM (scripts/real-vllm up) ...");
                        RealEngine::up(&opts.real_vllm_script).await?
                    }
                };
                *slot = Some(r.clone());
                let follower = npu_fake::follow::CpuFollower::spawn(
                    r.worker_pid_file(),
                    npu_files.clone(),
                    Duration::from_millis(100),
                );
                let port = r.port;
                (None, Some((r, follower)), port)
            }
        };
        // In process, so it binds port 0 and there is no pick-then-bind race.
        let proxy_cancel = cancel.child_token();
        let proxy = Proxy::start(loopback(0), loopback(engine_port), proxy_cancel.clone())
            .await
            .map_err(|e| format!("starting the proxy: {e}"))?;
        let toml = dir.join("agent.toml");
        let router_port = match opts.row.router() {
            Some(_) => Some(
                fake_engine::launch::free_ports::<1>().map_err(|e| format!("no free port: {e}"))?
                    [0],
            ),
            None => None,
        };
        let agent_extra = match (opts.row.router(), router_port) {
            (Some(r), Some(p)) => r.agent_line(p),
            _ => String::new(),
        };
        // The router's listener goes in the [agent] table.
        let text = agent_toml(
            proxy.addr.port(),
            mgmt_port,
            npu_files.len(),
            policy,
            s,
            opts.engine,
            opts.model(),
        )
        .replacen("[agent]\n", &format!("[agent]\n{agent_extra}"), 1);
        std::fs::write(&toml, text).map_err(|e| e.to_string())?;
        let mut supervisor = Supervisor::Direct;
        let mut supervisor_note = want.note.clone();
        let agent = match (policy, &opts.pymotor) {
            (Policy::Mindie, Some(p)) => {
                // The fake npu-smi is the agent binary under that name.
                let npu_smi = dir.join("bin/npu-smi");
                std::fs::create_dir_all(dir.join("bin")).map_err(|e| e.to_string())?;
                let _ = std::fs::remove_file(&npu_smi);
                std::os::unix::fs::symlink(&opts.agent_exe, &npu_smi)
                    .map_err(|e| format!("{}: {e}", npu_smi.display()))?;
                let args: Vec<String> = [
                    "--engine-port",
                    &proxy.addr.port().to_string(),
                    "--mgmt-port",
                    &mgmt_port.to_string(),
                    "--model",
                    opts.model(),
                    "--device-id",
                    "0",
                    "--npu-smi",
                ]
                .iter()
                .map(|a| a.to_string())
                .chain([npu_smi.display().to_string()])
                .collect();
                let mut cmd = p.health_service_command(
                    super::pymotor::ENGINE_SERVER_PY,
                    &args,
                    &dir.join("agent.log"),
                )?;
                cmd.env("FAKE_NPU_SCENARIO", &scenario)
                    .stdout(std::process::Stdio::null());
                let child = cmd.spawn().map_err(|e| {
                    format!("starting MindIE's engine server (through `setsid` and `nice`): {e}")
                })?;
                // Whatever serves `/status` gets the CPU priority a node's health service has.
                super::priority::raise_group(child.id()).await;
                Agent::other(child, dir)
            }
            (Policy::Mindie, None) => {
                return Err("the mindie-3.0.0b2 peer needs `scripts/pymotor install`".to_owned());
            }
            _ => {
                let launch = agent::Launch {
                    exe: opts.agent_exe.clone(),
                    config: toml.clone(),
                    scenario: scenario.clone(),
                    state_dir,
                    log: dir.join("agent.log"),
                };
                let started = match want.supervisor {
                    Supervisor::Direct => Agent::start_direct(launch, s).await,
                    Supervisor::Systemd => {
                        let why_not = super::systemd::preflight().err();
                        match why_not {
                            Some(why) if !want.required => {
                                supervisor_note = Some(format!(
                                    "no private systemd user manager here ({why}): the agent runs directly"
                                ));
                                Agent::start_direct(launch, s).await
                            }
                            Some(why) => Err(format!("--agent-supervisor systemd: {why}")),
                            None => Agent::start_systemd(launch, s).await,
                        }
                    }
                };
                // Whatever serves `/status` gets the CPU priority a node's health service
                // has (the agent's start raises it).
                let started = match started {
                    Ok(a) => a,
                    Err(e) => {
                        proxy_cancel.cancel();
                        return Err(e);
                    }
                };
                supervisor = started.supervisor;
                started
            }
        };
        // The emulator's poll timeout, scaled: one slow answer must not stall the sampling.
        let http = reqwest::Client::builder()
            .no_proxy()
            .timeout(scaled(Duration::from_secs(5), s).max(Duration::from_millis(100)))
            .build()
            .map_err(|e| e.to_string())?;
        Ok(Stack {
            dir: dir.to_owned(),
            engine,
            relaunch,
            restarts: 0,
            real,
            real_slot: opts.real.clone(),
            agent: std::sync::Arc::new(tokio::sync::Mutex::new(agent)),
            supervisor,
            supervisor_note,
            engine_port,
            control: format!("http://127.0.0.1:{control_port}"),
            mgmt: format!("http://127.0.0.1:{mgmt_port}"),
            proxy,
            proxy_cancel,
            http,
            peer: policy == Policy::Mindie,
            router_port,
            router: None,
        })
    }

    /// In a router row: starts the draft engine and the router in front of the proxy (what
    /// the load reached before), reading the agent's listener.
    async fn start_router(&mut self, opts: &RunOptions) -> Result<(), String> {
        let (Some(kind), Some(agent_port)) = (opts.row.router(), self.router_port) else {
            return Ok(());
        };
        let r = super::router::Router::start(
            kind,
            &self.dir,
            &super::router::Placement {
                main: self.proxy.addr,
                agent_port,
                engine: "chaos",
                model: opts.model(),
                agent_exe: &opts.agent_exe,
                repo: &opts.repo,
                time_scale: opts.time_scale,
            },
        )
        .await?;
        eprintln!(
            "npu-chaos:   the load goes through {} on {} (the draft engine on port {})",
            kind.as_str(),
            r.front,
            r.draft_port
        );
        self.router = Some(r);
        Ok(())
    }

    /// Where the load sends its requests: the router in a router row, else the proxy.
    fn load_base(&self) -> String {
        match &self.router {
            Some(r) => format!("http://{}", r.front),
            None => format!("http://{}", self.proxy.addr),
        }
    }

    /// Sends `sig` to the real engine's EngineCore.
    async fn signal_real(&self, sig: &str) -> Result<(), String> {
        match &self.real {
            Some((r, _)) => r.signal_core(sig).await,
            None => Err("no real engine".to_owned()),
        }
    }

    /// `url`'s JSON as `T` (the agent's typed answers, `server::wire`); `None` when it does
    /// not answer or the answer is not a `T`.
    async fn get_json<T: serde::de::DeserializeOwned>(&self, url: &str) -> Option<T> {
        self.http.get(url).send().await.ok()?.json().await.ok()
    }

    async fn status(&self) -> String {
        match self.http.get(format!("{}/status", self.mgmt)).send().await {
            Ok(r) => match r.json::<Value>().await {
                Ok(v) => v["status"].as_str().unwrap_or("garbled").to_owned(),
                Err(_) => "garbled".to_owned(),
            },
            Err(_) => "down".to_owned(),
        }
    }

    /// Applies a fault patch on the fake engine's control surface.
    async fn faults(&self, patch: Value) -> Result<(), String> {
        let r = self
            .http
            .post(format!("{}/fake/faults", self.control))
            .json(&patch)
            .send()
            .await
            .map_err(|e| format!("fault control: {e}"))?;
        if r.status().is_success() {
            Ok(())
        } else {
            Err(format!(
                "fault patch {patch} refused: {}",
                r.text().await.unwrap_or_default()
            ))
        }
    }

    async fn queue_depth(&self) -> Option<f64> {
        let text = self
            .http
            .get(format!("http://127.0.0.1:{}/metrics", self.engine_port))
            .send()
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        engine_metrics::parse(&text).waiting
    }

    /// Kills the engine, as Node Manager's daemon does (a real one: every process of it).
    async fn kill_engine(&mut self) {
        if let Some(mut e) = self.engine.take() {
            let _ = e.kill().await;
        }
        if let Some((r, _)) = self.real.take() {
            r.down().await;
            r.save_log(&self.dir.join("vllm.log"));
            *self.real_slot.lock().await = None;
        }
    }

    /// Whether the engine's process is gone (killed, or exited by itself).
    fn engine_exited(&mut self) -> bool {
        match self.engine.as_mut() {
            None => true,
            Some(e) => matches!(e.try_wait(), Ok(Some(_))),
        }
    }

    /// Restarts the fake engine in place, as the kubelet restarts a container: the old
    /// process (if any) is killed and reaped, a new one starts on the same ports with fresh
    /// state (no fault).
    async fn restart_engine(&mut self) -> Result<(), String> {
        let launch = self
            .relaunch
            .clone()
            .ok_or("only the fake engine can be restarted")?;
        if let Some(mut e) = self.engine.take() {
            let _ = e.kill().await;
        }
        self.restarts += 1;
        let log = std::fs::File::create(
            self.dir
                .join(format!("engine-restart{}.log", self.restarts)),
        )
        .map_err(|e| e.to_string())?;
        self.engine = Some(launch.spawn(std::process::Stdio::from(log))?);
        Ok(())
    }

    /// Points the NPUs at `text` instead of the real Worker's CPU (`None`: follow it again).
    fn npu_override(&self, text: Option<&str>) {
        if let Some((_, f)) = &self.real {
            f.set_override(text.map(str::to_owned));
        }
    }

    /// Starts a stack and waits until virtual inference runs (the warm-up succeeded), within
    /// `limit` per attempt. A stack whose engine or agent could not bind its port is started
    /// again on new ports, up to [`START_ATTEMPTS`] times; any other failure is final.
    async fn start_ready(
        opts: &RunOptions,
        dir: &Path,
        policy: Policy,
        want: &WantedSupervisor,
        cancel: &CancellationToken,
        limit: Duration,
    ) -> Result<Stack, String> {
        let mut attempt = 1;
        loop {
            // Under systemd the start itself fails when the agent cannot bind (it never says
            // READY=1); directly, the wait below sees it exit.
            let (stack, err) = match Stack::start(opts, dir, policy, want, cancel).await {
                Ok(mut stack) => match stack.wait_ready(limit).await {
                    Ok(()) => return Ok(stack),
                    Err(e) => (Some(stack), e),
                },
                Err(e) => (None, e),
            };
            match stack {
                _ if attempt < START_ATTEMPTS && port_was_taken(dir) => {
                    eprintln!(
                        "npu-chaos:   a port was taken; starting again on new ports (attempt {} \
                         of {START_ATTEMPTS}; the failed one's logs are kept as attempt{attempt}-*.log)",
                        attempt + 1
                    );
                    if let Some(stack) = stack {
                        stack.stop().await;
                    }
                    // Kept for a look: the next attempt writes new logs.
                    for log in ["engine.log", "agent.log"] {
                        let _ = std::fs::rename(
                            dir.join(log),
                            dir.join(format!("attempt{attempt}-{log}")),
                        );
                    }
                    attempt += 1;
                }
                Some(stack) => {
                    stack.stop().await;
                    return Err(err);
                }
                None => return Err(err),
            }
        }
    }

    /// Kills and reaps the stack's processes and stops its proxy. A real engine that is
    /// still healthy is kept for the next experiment (only its stop signal is undone).
    async fn stop(mut self) {
        if let Some((r, f)) = self.real.take() {
            drop(f);
            let _ = r.signal_core("CONT").await;
            r.save_log(&self.dir.join("vllm.log"));
        }
        self.kill_engine().await;
        self.agent.lock().await.stop().await;
        self.proxy_cancel.cancel();
    }

    /// Waits until virtual inference runs (the warm-up succeeded).
    async fn wait_ready(&mut self, limit: Duration) -> Result<(), String> {
        let end = Instant::now() + limit;
        while Instant::now() < end {
            if let Some(why) = self.agent.lock().await.exited().await {
                return Err(format!(
                    "{why}; see {}",
                    self.dir.join("agent.log").display()
                ));
            }
            if let Some(Ok(Some(st))) = self.engine.as_mut().map(|e| e.try_wait()) {
                return Err(format!(
                    "the fake engine exited ({st}); see {}",
                    self.dir.join("engine.log").display()
                ));
            }
            if self.peer {
                // MindIE's engine server: its virtual inference starts at the first `/status`
                // that sees a healthy `/health`, which then answers `normal`.
                if self.status().await == "normal" {
                    return Ok(());
                }
            } else if let Some(d) = self
                .get_json::<EngineDetail>(&format!("{}/status/detail", self.mgmt))
                .await
                && d.status == Status::Normal
                && d.virtual_inference.phase == Phase::Running
            {
                return Ok(());
            }
            // The first healthy /status starts virtual inference (as Node Manager's would).
            let _ = self.status().await;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err(format!(
            "virtual inference did not start within {limit:?}; see {}",
            self.dir.join("agent.log").display()
        ))
    }
}

/// What applying a fault needs to undo it.
#[derive(Default)]
struct Injected {
    stress: Option<CpuStress>,
    long_streams: Option<CancellationToken>,
    /// An operation on the agent under way (aborted if the experiment ends first).
    agent_op: Option<agent::OpTask>,
}

/// How long the end of an experiment waits for an agent operation still under way.
const AGENT_OP_LIMIT: Duration = Duration::from_secs(180);

/// Records a finished agent operation and prints what it did.
fn record_op(out: &mut Outcome, op: Result<AgentOp, String>, s: f64) {
    let op = op.unwrap_or_else(|e| AgentOp {
        error: Some(e),
        ..AgentOp::unfinished(
            Fault::parse(&out.fault).unwrap_or(Fault::AgentRestart),
            out.agent_supervisor,
        )
    });
    let secs = |ms: Option<i64>| {
        ms.map_or_else(
            || "—".to_owned(),
            |ms| format!("{:.2} s", (ms - op.started_ms) as f64 / 1000.0 / s),
        )
    };
    eprintln!(
        "npu-chaos:   {} ({}): pid {} -> {}, running after {}, answered /status after {} (unscaled){}",
        op.fault,
        op.supervisor.as_str(),
        op.old_pid.map_or("?".to_owned(), |p| p.to_string()),
        op.new_pid.map_or("?".to_owned(), |p| p.to_string()),
        secs(op.new_running_ms),
        secs(op.answered_ms),
        op.error
            .as_deref()
            .map(|e| format!("; {e}"))
            .unwrap_or_default()
    );
    out.agent_ops.push(op);
}

/// Fault-API patches that set and clear a fault on the fake engine (`None`: not an engine
/// fault). Clearing sends the inverse patch, never a reset, so nothing else is touched.
fn engine_patches(fault: Fault, s: f64) -> Option<(Value, Value)> {
    // Tokio timers have millisecond granularity: a scaled time is at least 1 ms.
    let ms = |d: Duration| (scaled(d, s).as_millis() as u64).max(1);
    Some(match fault {
        Fault::MemoryPressure(p) => (
            json!({"kv_cache_pressure": f64::from(p) / 100.0}),
            json!({"kv_cache_pressure": 0.0}),
        ),
        Fault::HotReload(d) => (json!({"pause_ms": ms(d)}), json!({"pause_ms": 0})),
        Fault::BatchJitter(d) => (json!({"jitter_ms": ms(d)}), json!({"jitter_ms": 0})),
        Fault::SlowHealth(d) => (
            json!({"slow_health_ms": ms(d)}),
            json!({"slow_health_ms": 0}),
        ),
        Fault::EngineHang => (json!({"hang": true}), json!({"hang": false})),
        Fault::EngineSleep => (json!({"asleep": true}), json!({"asleep": false})),
        Fault::LongPrefill(d) => (json!({"long_prefill_ms": ms(d)}), json!({})),
        // The KV cache near full while the burst queues.
        Fault::Burst(_) => (
            json!({"kv_cache_usage": 0.95}),
            json!({"kv_cache_usage": null}),
        ),
        Fault::SlowHealthWithLatency(h, _) => (
            json!({"slow_health_ms": ms(h)}),
            json!({"slow_health_ms": 0}),
        ),
        Fault::EngineRestart(d) => (json!({"restart_ms": ms(d)}), json!({})),
        Fault::Degraded(d) => (
            json!({"latency_ms": ms(d), "kv_cache_usage": 0.97}),
            json!({"latency_ms": 0, "kv_cache_usage": null}),
        ),
        Fault::NpuHangIdle => (
            json!({"hang": true, "hbm_used_mb": 65536}),
            json!({"hang": false, "hbm_used_mb": null}),
        ),
        Fault::NpuBusyStuck => (
            json!({"npu_busy_stuck": true}),
            json!({"npu_busy_stuck": false}),
        ),
        Fault::DriverError => (
            json!({"driver_error": -8005}),
            json!({"driver_error": null}),
        ),
        Fault::DriverHang => (json!({"driver_hang": true}), json!({"driver_hang": false})),
        Fault::Http5xx => (json!({"http_5xx": true}), json!({"http_5xx": false})),
        // The codes themselves are the experiment's (`driver_codes`, [`codes_patch`]).
        Fault::NpuFaultCode => (json!({}), json!({})),
        Fault::NetworkLatency(_)
        | Fault::CpuStress(_)
        | Fault::LongStreams(_)
        | Fault::EngineCrash
        | Fault::AgentRestart
        | Fault::AgentCrash
        | Fault::AgentUpgrade
        | Fault::AgentOutage(_) => return None,
    })
}

async fn inject(
    stack: &mut Stack,
    load: &LoadGen,
    fault: Fault,
    s: f64,
    held: &mut Injected,
) -> Result<(), String> {
    match fault {
        Fault::NetworkLatency(d) => stack.proxy.set_latency(scaled(d, s)),
        Fault::CpuStress(p) => {
            let st = CpuStress::start();
            st.set(p);
            held.stress = Some(st);
        }
        Fault::LongStreams(n) => {
            held.long_streams = Some(load.long_streams(n, long_stream_tokens(stack)))
        }
        Fault::Burst(n) => {
            held.long_streams = Some(load.burst(n, scaled(Duration::from_secs(1), s)));
            if stack.real.is_none()
                && let Some((on, _)) = engine_patches(fault, s)
            {
                stack.faults(on).await?;
            }
        }
        Fault::SlowHealthWithLatency(_, latency) => {
            stack.proxy.set_latency(scaled(latency, s));
            if let Some((on, _)) = engine_patches(fault, s) {
                stack.faults(on).await?;
            }
        }
        Fault::EngineCrash if stack.real.is_some() => stack.signal_real("KILL").await?,
        Fault::EngineCrash => stack.kill_engine().await,
        other if stack.real.is_some() => inject_real(stack, other, s).await?,
        other => {
            if let Some((on, _)) = engine_patches(other, s) {
                stack.faults(on).await?;
            }
        }
    }
    load.set_under_fault(true);
    Ok(())
}

/// Tokens asked for by each `long_streams_<N>` stream: 4096, or what a real engine's
/// context (1024 tokens for the test model) leaves after the prompt.
fn long_stream_tokens(stack: &Stack) -> u32 {
    if stack.real.is_some() { 512 } else { 4096 }
}

/// The faults of a real engine: signals to its EngineCore, the fake NPUs' figure, the proxy.
async fn inject_real(stack: &mut Stack, fault: Fault, s: f64) -> Result<(), String> {
    match fault {
        Fault::EngineHang => stack.signal_real("STOP").await?,
        // The engine stopped, the NPU spinning on a stuck kernel.
        Fault::NpuBusyStuck => {
            stack.npu_override(Some("95"));
            stack.signal_real("STOP").await?;
        }
        // The engine stopped, the NPU idle with its memory full.
        Fault::NpuHangIdle => {
            stack.npu_override(Some("0 hbm_used_mb=65536"));
            stack.signal_real("STOP").await?;
        }
        Fault::DriverError => stack.npu_override(Some("error:-8005")),
        Fault::DriverHang => stack.npu_override(Some("hang")),
        Fault::BatchJitter(d) => stack.proxy.set_jitter(scaled(d, s)),
        other => {
            return Err(format!(
                "{other} cannot be injected into a real engine: {}",
                real_engine::not_applicable(other).unwrap_or("no injection defined")
            ));
        }
    }
    Ok(())
}

async fn remove(stack: &mut Stack, load: &LoadGen, fault: Fault, s: f64, held: &mut Injected) {
    load.set_under_fault(false);
    stack.proxy.set_latency(Duration::ZERO);
    stack.proxy.set_jitter(Duration::ZERO);
    if stack.real.is_some() {
        stack.npu_override(None);
        if matches!(
            fault,
            Fault::EngineHang | Fault::NpuBusyStuck | Fault::NpuHangIdle
        ) {
            let _ = stack.signal_real("CONT").await;
        }
    }
    if let Some(st) = held.stress.take() {
        tokio::task::spawn_blocking(move || st.stop()).await.ok();
    }
    if let Some(t) = held.long_streams.take() {
        t.cancel();
    }
    if let Some((_, off)) = engine_patches(fault, s) {
        // The engine may be gone (killed by Node Manager): nothing to clear then.
        let _ = stack.faults(off).await;
    }
}

/// Now, as unix milliseconds (the clock of the agent's probe records).
fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The fake engine's patch that makes the fake driver report `codes` on its NPUs (empty:
/// none).
fn codes_patch(codes: &[u32]) -> Value {
    json!({ "npu_fault_codes": codes })
}

/// Whether the agent reports one of the engine's NPUs as failing right now: a hung or stale
/// reading, or failed reads in the current window.
fn driver_flagged(detail: &EngineDetail) -> bool {
    detail
        .window
        .devices
        .iter()
        .any(|d| d.stale || d.hung || d.invalid > 0)
}

fn is_driver_fault(f: Fault) -> bool {
    matches!(f, Fault::DriverError | Fault::DriverHang)
}

/// Runs the Node Manager emulator on its own thread and runtime, at real-time priority when
/// permitted: it stands for a process on another machine, so it must not be starved by the
/// CPU stress of this one. Sends the kill time.
fn start_node_manager(
    nm: NmOptions,
    cancel: CancellationToken,
    kill_tx: tokio::sync::oneshot::Sender<Instant>,
) -> std::io::Result<std::thread::JoinHandle<NmReport>> {
    std::thread::Builder::new()
        .name("node-manager".to_owned())
        .spawn(move || {
            let _ = npu_health_agent::sampler::priority::make_current_thread_realtime();
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return NmReport::default();
            };
            rt.block_on(node_manager::run(nm, cancel, move || {
                let _ = kill_tx.send(Instant::now());
            }))
        })
}

/// Polls before the kill that [`kill_evidence`] quotes: the emulator's 5 heartbeats span at
/// most 5 polls at the 1 s cadence and 15 at 3 s.
const EVIDENCE_POLLS: usize = 16;
/// The agent's last warnings [`kill_evidence`] quotes.
const EVIDENCE_WARNINGS: usize = 6;

/// Why Node Manager killed: the emulator's last polls before its decision (seconds before
/// the kill on its clock, what it read, the error, the answer time), then the agent's last
/// WARN and ERROR lines from `agent_log` up to the kill (the emulator started at
/// `nm_started`; with no emulator report, the last ones). Empty pieces are left out; never
/// fails.
fn kill_evidence(
    nm: Option<&NmReport>,
    nm_started: std::time::SystemTime,
    agent_logs: &[PathBuf],
) -> Vec<String> {
    let mut lines = Vec::new();
    // What the agent logged after the kill is about a dead engine: left out (half a second
    // of slack for the two clocks).
    let until = nm
        .and_then(|r| r.killed_at_ms)
        .map(|k| nm_started + Duration::from_millis(k + 500));
    if let Some(r) = nm
        && let Some(kill) = r.killed_at_ms
    {
        let before: Vec<_> = r.polls.iter().filter(|p| p.at_ms <= kill).collect();
        let from = before.len().saturating_sub(EVIDENCE_POLLS);
        for p in &before[from..] {
            let read = serde_json::to_value(p.detected)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default();
            lines.push(format!(
                "poll {:+.2} s: {read}{} ({:.0} ms)",
                -((kill - p.at_ms) as f64) / 1000.0,
                p.error
                    .as_deref()
                    .map(|e| format!(", {e}"))
                    .unwrap_or_default(),
                p.latency_ms
            ));
        }
    }
    // Every agent's log (an upgrade's second agent logs apart), in time order.
    let text: Vec<String> = agent_logs
        .iter()
        .map(|p| std::fs::read_to_string(p).unwrap_or_default())
        .collect();
    let mut all: Vec<&str> = text.iter().flat_map(|t| t.lines()).collect();
    all.sort_by_cached_key(|l| {
        l.split_whitespace()
            .next()
            .and_then(|t| humantime::parse_rfc3339_weak(t).ok())
    });
    let warnings: Vec<String> = all
        .into_iter()
        .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
        .filter(|l| {
            let at = l
                .split_whitespace()
                .next()
                .and_then(|t| humantime::parse_rfc3339_weak(t).ok());
            match (until, at) {
                (Some(until), Some(at)) => at <= until,
                _ => true,
            }
        })
        .map(str::to_owned)
        .collect();
    let from = warnings.len().saturating_sub(EVIDENCE_WARNINGS);
    lines.extend(warnings[from..].iter().map(|w| format!("agent: {w}")));
    lines
}

/// The row's directory of the outputs: `1s`, `3s`, `1s-pymotor` or `kubelet`.
pub fn cadence_dir(opts: &RunOptions) -> String {
    match (opts.row, &opts.pymotor_nm) {
        (Row::NodeManager(c), Some(_)) => format!("{}-pymotor", c.label()),
        (row, _) => row.label(),
    }
}

/// Runs one experiment under one policy. Never panics on a broken stack: the outcome says
/// `error` with the reason.
pub async fn run(e: &Experiment, policy: Policy, opts: &RunOptions) -> Outcome {
    let not_by_design = (e.agent_policy_only && policy != Policy::Agent)
        || opts
            .row
            .cadence()
            .zip(e.max_nm_heartbeat_s)
            .is_some_and(|(c, h)| c.heartbeat_s > h);
    let mut out = Outcome {
        experiment: e.name.clone(),
        target: e.target,
        fault: e.fault.to_string(),
        policy,
        integration: opts.row.integration(),
        cadence: opts.row.cadence(),
        router: opts.row.router(),
        node_manager: if opts.pymotor_nm.is_some() {
            NodeManagerKind::Pymotor
        } else {
            NodeManagerKind::Emulator
        },
        expect: match e.expect {
            Expect::Healthy => "healthy".to_owned(),
            Expect::DetectWithin(d) => format!("detect_within {}", humantime::format_duration(d)),
        },
        verdict: Verdict::Error,
        detected_after_ms: None,
        abnormal_after_ms: None,
        killed_at_ms: None,
        first_injected_ms: None,
        injected_ms: 0,
        guard_events: Vec::new(),
        load: Default::default(),
        load_after_abnormal: None,
        router_actions: Vec::new(),
        error: None,
        ran_again_after: None,
        kubelet: None,
        kill_evidence: Vec::new(),
        agent_supervisor: Supervisor::Direct,
        agent_supervisor_note: None,
        agent_ops: Vec::new(),
        polls: Vec::new(),
        timeline: Vec::new(),
    };
    if opts.engine == EngineKind::Vllm
        && let Some(why) = real_engine::not_applicable(e.fault).or_else(|| {
            (!e.driver_codes.is_empty()).then_some(
                "the runner writes no fault codes into a real engine's NPU files (the fake engine does)",
            )
        })
    {
        out.verdict = Verdict::NotApplicable;
        out.error = Some(why.to_owned());
        return out;
    }
    if let Some(why) = policy.not_applicable(opts, e.fault) {
        out.verdict = Verdict::NotApplicable;
        out.error = Some(why);
        return out;
    }
    let cancel = CancellationToken::new();
    let dir = opts
        .out_dir
        .join(policy.as_str())
        .join(cadence_dir(opts))
        .join(&e.name);
    let want = wanted_supervisor(opts.agent_supervisor, e.fault);
    out.agent_supervisor = want.supervisor;
    out.agent_supervisor_note = want.note.clone();
    let result = run_inner(e, policy, opts, &dir, &want, &cancel, &mut out).await;
    cancel.cancel();
    // A kill before the fault was injected (or with no injection at all) is a false kill,
    // whatever the experiment expects.
    // A router row's Node Manager sees what the `1s` row's does: its known kills too.
    let nm_label = opts.row.cadence().map(|c| c.label());
    let known = e.known_false_kills.iter().any(|(p, row)| {
        p == policy.as_str()
            && (*row == opts.row.label()
                || (opts.row.router().is_some() && Some(row) == nm_label.as_ref()))
    });
    let killed_before_fault = out
        .killed_at_ms
        .is_some_and(|k| out.first_injected_ms.is_none_or(|f| k < f));
    let draft_without_cause = draft_without_cause(&out);
    out.verdict = match result {
        Err(err) => {
            out.error = Some(err);
            Verdict::Error
        }
        Ok(()) if draft_without_cause => {
            out.error = Some(format!(
                "the draft answered {} requests, but the agent never told {} to take the main engine out",
                out.load.by_draft,
                out.router.map_or("the router", |r| r.as_str()),
            ));
            Verdict::DraftWithoutCause
        }
        Ok(()) if opts.row == Row::Kubelet => kubelet_verdict(e, &out, known, not_by_design),
        Ok(()) => match e.expect {
            _ if killed_before_fault => Verdict::FalseKill,
            Expect::Healthy if out.killed_at_ms.is_some() && known => Verdict::KnownFalseKill,
            Expect::Healthy if out.killed_at_ms.is_some() => Verdict::FalseKill,
            Expect::Healthy => Verdict::Pass,
            // A driver fault must be reported without killing the (healthy) engine.
            Expect::DetectWithin(_) if is_driver_fault(e.fault) && out.killed_at_ms.is_some() => {
                Verdict::FalseKill
            }
            Expect::DetectWithin(_) if out.detected_after_ms.is_some() => Verdict::Pass,
            Expect::DetectWithin(_) if not_by_design => Verdict::NotDetectableByDesign,
            Expect::DetectWithin(_) => Verdict::Missed,
        },
    };
    out
}

/// Whether a router row's draft answered requests though the agent never told the router
/// to take the main engine out.
fn draft_without_cause(out: &Outcome) -> bool {
    out.router.is_some()
        && out.load.by_draft > 0
        && !out
            .router_actions
            .iter()
            .any(super::router::RouterAction::takes_main_out)
}

/// The verdict of a kubelet run: a liveness restart of a healthy engine is a false kill; a
/// fault must bring the action the experiment expects, in time.
fn kubelet_verdict(e: &Experiment, out: &Outcome, known: bool, not_by_design: bool) -> Verdict {
    use super::experiment::KubeletExpect;
    let Some(k) = &out.kubelet else {
        return Verdict::Error;
    };
    let restarted = k.liveness_restarts + k.exit_restarts > 0;
    let false_restart = match k.expect {
        KubeletExpect::Restart => k.restart_after_ms.is_none() && restarted,
        KubeletExpect::NotReady | KubeletExpect::NoRestart => k.liveness_restarts > 0,
    };
    if false_restart {
        return if known {
            Verdict::KnownFalseKill
        } else {
            Verdict::FalseKill
        };
    }
    match (k.expect, e.expect) {
        (KubeletExpect::NoRestart, Expect::Healthy) => Verdict::Pass,
        // A driver fault: the NPU flagged (the Node Manager rule), the engine not restarted.
        (KubeletExpect::NoRestart, Expect::DetectWithin(_)) if out.detected_after_ms.is_some() => {
            Verdict::Pass
        }
        (KubeletExpect::Restart | KubeletExpect::NotReady, _)
            if out.detected_after_ms.is_some() =>
        {
            Verdict::Pass
        }
        _ if not_by_design => Verdict::NotDetectableByDesign,
        _ => Verdict::Missed,
    }
}

async fn run_inner(
    e: &Experiment,
    policy: Policy,
    opts: &RunOptions,
    dir: &Path,
    want: &WantedSupervisor,
    cancel: &CancellationToken,
    out: &mut Outcome,
) -> Result<(), String> {
    let s = opts.time_scale;
    let sc = |d: Duration| scaled(d, s);
    // The warm-up timeout (180 s scaled) plus start-up.
    let limit = sc(Duration::from_secs(180)) + Duration::from_secs(10);
    let mut stack = Stack::start_ready(opts, dir, policy, want, cancel, limit).await?;
    out.agent_supervisor = stack.supervisor;
    out.agent_supervisor_note = stack.supervisor_note.clone();
    if stack.supervisor == Supervisor::Systemd {
        eprintln!(
            "npu-chaos:   the agent runs as {} in a private systemd user manager (derived from {}: {})",
            super::systemd::AGENT_UNIT,
            super::systemd::SHIPPED_UNIT_PATH,
            dir.join("npu-health-agent.service").display()
        );
    }
    if let Some(note) = &stack.supervisor_note {
        eprintln!("npu-chaos:   {note}");
    }
    let (kill_tx, mut kill_rx) = tokio::sync::oneshot::channel::<Instant>();
    // MindIE's own heartbeat: started now, the experiment begins after its 60 s grace.
    let mut real_nm = None;
    let mut kill_tx = Some(kill_tx);
    if let Some(p) = &opts.pymotor_nm {
        let tx = kill_tx.take();
        let mgmt_port = stack
            .mgmt
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .ok_or("no mgmt port")?;
        let mut nm =
            super::pymotor::NodeManager::start(p, mgmt_port, stack.engine_port, dir, move |at| {
                if let Some(tx) = tx {
                    let _ = tx.send(at);
                }
            })?;
        eprintln!(
            "npu-chaos:   PyMotor's Node Manager runs; waiting out its 60 s grace period ..."
        );
        nm.wait_grace(Duration::from_secs(120)).await?;
        real_nm = Some(nm);
    }
    stack.start_router(opts).await?;
    let load = LoadGen::start(
        &stack.load_base(),
        opts.model(),
        &fit_load(&e.load, opts.engine),
        s,
        cancel.child_token(),
    );
    if stack.router.is_some() {
        load.count_answers_of(super::router::DRAFT_MODEL);
    }
    // The node has been up past Node Manager's grace period.
    // Sampled every (scaled) second, as Node Manager polls.
    let sample_every = scaled(Duration::from_secs(1), s).max(Duration::from_millis(20));
    let nm_cancel = cancel.child_token();
    // The emulator's clock starts about now: its kill time on the agent log's clock, its
    // polls on the run's (within the few milliseconds its thread takes to start).
    let nm_started = std::time::SystemTime::now();
    let nm_t0 = Instant::now();
    let probes = super::kubelet::ProbeLog::default();
    let (nm_thread, mut kubelet) = match opts.row {
        Row::NodeManager(_) | Row::Router(_) => {
            let c = opts.row.cadence().unwrap_or(Cadence::PYMOTOR);
            let nm = c.nm_options(vec![format!("{}/status", stack.mgmt)], s);
            let thread = match kill_tx {
                Some(tx) => Some(
                    start_node_manager(nm, nm_cancel.clone(), tx)
                        .map_err(|e| format!("starting the Node Manager emulator: {e}"))?,
                ),
                None => None,
            };
            (thread, None)
        }
        Row::Kubelet => {
            let k = super::kubelet::Kubelet::manifest(
                s,
                format!("http://127.0.0.1:{}/health", stack.engine_port),
                &stack.mgmt,
            );
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            let (gen_tx, gen_rx) = tokio::sync::watch::channel(0u64);
            let ready_load = load.clone();
            tokio::spawn(super::kubelet::run(
                k.clone(),
                tx,
                gen_rx,
                move |r| ready_load.set_ready(r),
                probes.clone(),
                nm_cancel.clone(),
            ));
            (
                None,
                Some(KubeletLink {
                    actions: rx,
                    generation: gen_tx,
                    exit_backoff: k.exit_backoff,
                    expect: e.kubelet,
                    log: Vec::new(),
                    exited_at: None,
                    not_ready_since: None,
                    not_ready_total: Duration::ZERO,
                }),
            )
        }
    };
    // The scheduled injection, after a 10 s baseline.
    let t0 = Instant::now() + sc(Duration::from_secs(10));
    let result = observe(
        e,
        &mut stack,
        &load,
        &mut kill_rx,
        kubelet.as_mut(),
        sample_every,
        s,
        t0,
        out,
    )
    .await;
    if let Some((r, _)) = &stack.real {
        r.save_log(&dir.join("vllm.log"));
    }
    nm_cancel.cancel();
    let nm_report = match nm_thread {
        Some(t) => tokio::task::spawn_blocking(move || t.join().ok())
            .await
            .ok()
            .flatten(),
        None => None,
    };
    if let Some(r) = &nm_report {
        let path = dir.join("node-manager.json");
        if let Err(e) = std::fs::write(&path, serde_json::to_vec_pretty(r).unwrap_or_default()) {
            eprintln!("npu-chaos:   {}: {e}", path.display());
        }
    }
    if out.killed_at_ms.is_some() {
        out.kill_evidence = kill_evidence(
            nm_report.as_ref(),
            nm_started,
            &[dir.join("agent.log"), dir.join("agent-upgrade.log")],
        );
    }
    // What the pollers saw, from the first injection to the later of the fault's end and
    // the last agent operation's end.
    let from = out.first_injected_ms.unwrap_or(0);
    let to = out
        .agent_ops
        .iter()
        .filter_map(|o| o.answered_ms.or(o.new_running_ms))
        .fold(sc(e.duration).as_millis() as i64, i64::max)
        .max(from);
    let offset = nm_t0.saturating_duration_since(t0).as_millis() as i64
        - t0.saturating_duration_since(nm_t0).as_millis() as i64;
    let at = |i: Instant| {
        if i >= t0 {
            (i - t0).as_millis() as i64
        } else {
            -((t0 - i).as_millis() as i64)
        }
    };
    use super::polls::{Answer, figures};
    if let Some(r) = &nm_report {
        let answers: Vec<Answer> = r
            .polls
            .iter()
            .map(|p| Answer {
                at_ms: p.at_ms as i64 + offset,
                ok: p.error.is_none(),
            })
            .collect();
        out.polls.push(figures("node_manager", &answers, from, to));
    }
    if let Some(nm) = &real_nm {
        let answers: Vec<Answer> = nm
            .heartbeats()
            .into_iter()
            .map(|(i, ok)| Answer { at_ms: at(i), ok })
            .collect();
        out.polls
            .push(figures("pymotor_heartbeats", &answers, from, to));
    }
    if opts.row == Row::Kubelet {
        let records = probes.records();
        for (kind, name) in [
            (super::kubelet::ProbeKind::Readiness, "kubelet_readyz"),
            (super::kubelet::ProbeKind::Liveness, "kubelet_livez"),
        ] {
            let answers: Vec<Answer> = records
                .iter()
                .filter(|r| r.probe == kind)
                .map(|r| Answer {
                    at_ms: at(r.at),
                    ok: r.ok,
                })
                .collect();
            out.polls.push(figures(name, &answers, from, to));
        }
    }
    if let Some(nm) = real_nm {
        nm.stop().await;
    }
    out.load = load.stats.snapshot();
    // The fake engine is killed and reaped here: dropping the stack only sends SIGKILL, and
    // a run can end (and a test look for stray processes) before the engine is gone — a CI
    // run saw a kubelet-restarted engine still listed.
    if let Some(mut e) = stack.engine.take() {
        let _ = e.kill().await;
    }
    // A unit is stopped with its private manager here, not at the stack's drop.
    stack.agent.lock().await.stop().await;
    result
}

/// The experiment's load as the engine can take it: a real engine's test model has a
/// 1024-token context, so prompts are cut to 128 words ("tok ", up to 2 tokens each) and
/// answers to 512 tokens.
fn fit_load(load: &super::experiment::Load, engine: EngineKind) -> super::experiment::Load {
    let mut l = load.clone();
    if engine == EngineKind::Vllm {
        l.prompt_tokens = l.prompt_tokens.min(128);
        l.max_tokens = l.max_tokens.min(512);
    }
    l
}

/// The kubelet emulator's side of a run, as the runner sees it: the actions it decided, the
/// container generation the runner bumps at every restart, and what happened.
struct KubeletLink {
    actions: tokio::sync::mpsc::UnboundedReceiver<(super::kubelet::Action, Instant)>,
    generation: tokio::sync::watch::Sender<u64>,
    exit_backoff: Duration,
    expect: super::experiment::KubeletExpect,
    log: Vec<(Instant, super::kubelet::Action)>,
    /// When the container was found gone, awaiting its restart.
    exited_at: Option<Instant>,
    not_ready_since: Option<Instant>,
    not_ready_total: Duration,
}

impl KubeletLink {
    /// Takes the emulator's actions and restarts the engine for them, and restarts a
    /// container that exited once the back-off has passed.
    async fn act(&mut self, stack: &mut Stack, now: Instant) -> Result<(), String> {
        use super::kubelet::Action;
        while let Ok((a, at)) = self.actions.try_recv() {
            self.log.push((at, a));
            match a {
                Action::NotReady => self.not_ready_since = self.not_ready_since.or(Some(at)),
                Action::Ready => {
                    if let Some(t) = self.not_ready_since.take() {
                        self.not_ready_total += at.saturating_duration_since(t);
                    }
                }
                Action::RestartLiveness => {
                    stack.restart_engine().await?;
                    self.exited_at = None;
                    self.generation.send_modify(|g| *g += 1);
                }
                Action::RestartExited => {}
            }
        }
        if self.exited_at.is_none() && stack.engine_exited() {
            self.exited_at = Some(now);
        }
        if let Some(t) = self.exited_at
            && now >= t + self.exit_backoff
        {
            stack.restart_engine().await?;
            self.exited_at = None;
            self.log.push((now, Action::RestartExited));
            self.generation.send_modify(|g| *g += 1);
        }
        Ok(())
    }

    /// The first action of a kind at or after `from`.
    fn first(&self, from: Instant, kinds: &[super::kubelet::Action]) -> Option<Instant> {
        self.log
            .iter()
            .find(|(at, a)| *at >= from && kinds.contains(a))
            .map(|(at, _)| *at)
    }

    fn outcome(
        &self,
        first: Option<Instant>,
        end: Instant,
        rel: impl Fn(Instant) -> i64,
    ) -> KubeletOutcome {
        use super::kubelet::Action;
        let count = |k: Action| self.log.iter().filter(|(_, a)| *a == k).count() as u32;
        let after = |kinds: &[Action]| {
            first.and_then(|f| self.first(f, kinds).map(|t| (t - f).as_millis() as u64))
        };
        KubeletOutcome {
            expect: self.expect,
            actions: self.log.iter().map(|(t, a)| (rel(*t), *a)).collect(),
            liveness_restarts: count(Action::RestartLiveness),
            exit_restarts: count(Action::RestartExited),
            not_ready_after_ms: after(&[Action::NotReady]),
            restart_after_ms: after(&[Action::RestartLiveness, Action::RestartExited]),
            not_ready_ms: (self.not_ready_total
                + self
                    .not_ready_since
                    .map_or(Duration::ZERO, |t| end.saturating_duration_since(t)))
            .as_millis() as u64,
        }
    }
}

/// The experiment's timeline: baseline, fault (with guards), observation.
#[allow(clippy::too_many_arguments)]
async fn observe(
    e: &Experiment,
    stack: &mut Stack,
    load: &LoadGen,
    kill_rx: &mut tokio::sync::oneshot::Receiver<Instant>,
    mut kubelet: Option<&mut KubeletLink>,
    sample_every: Duration,
    s: f64,
    t0: Instant,
    out: &mut Outcome,
) -> Result<(), String> {
    let sc = |d: Duration| scaled(d, s);
    let fault_end = t0 + sc(e.duration);
    let observe_end = match e.expect {
        // Detection counts within `detect_within` of the first injection (guards may delay
        // it); a driver fault is watched longer, since killing the healthy engine for it
        // would be a false kill.
        // (The loop stops earlier, at the deadline counted from the first injection.)
        Expect::DetectWithin(d) if !is_driver_fault(e.fault) => fault_end + sc(d),
        _ => fault_end + sc(LATE_KILL_TAIL),
    };
    let rel = |t: Instant| -> i64 {
        if t >= t0 {
            (t - t0).as_millis() as i64
        } else {
            -((t0 - t).as_millis() as i64)
        }
    };
    let mut held = Injected::default();
    let mut active = false;
    let mut aborted = false;
    let mut skipping = false;
    let mut first_injected: Option<Instant> = None;
    let mut injected_since: Option<Instant> = None;
    let mut injected = Duration::ZERO;
    let mut killed: Option<Instant> = None;
    // Unix time of the first injection: the agent's own probe times are unix times.
    let mut first_injected_unix_ms: Option<u64> = None;
    // The scheduled injection on the agent's clock (its journal's times are unix times).
    let t0_unix_ms = {
        let now = Instant::now();
        unix_ms() as i64 + t0.saturating_duration_since(now).as_millis() as i64
            - now.saturating_duration_since(t0).as_millis() as i64
    };
    let result = loop {
        let now = Instant::now();
        if now >= observe_end {
            break Ok(());
        }
        // A real engine that died by itself (not by a crash fault, not by Node Manager's
        // kill) ends the experiment as an error: whatever the agent concluded after that is
        // about a dead engine, so it is neither a false kill nor a detection. Checked before
        // a kill that arrived meanwhile is taken: at a short Node Manager cadence the death
        // and the kill can fall between two samples.
        let died_by_itself = |stack: &Stack| {
            stack.real.as_ref().is_some_and(|(r, _)| {
                let by_the_fault = e.fault == Fault::EngineCrash && first_injected.is_some();
                !(by_the_fault || r.alive())
            })
        };
        if killed.is_none()
            && !died_by_itself(stack)
            && let Ok(at) = kill_rx.try_recv()
        {
            killed = Some(at);
            out.killed_at_ms = Some(rel(at));
            // What Node Manager's daemon does: the engine process goes.
            stack.kill_engine().await;
        }
        if let Some((r, _)) = &stack.real
            && killed.is_none()
            && died_by_itself(stack)
        {
            r.save_log(&stack.dir.join("vllm.log"));
            break Err(format!(
                "{REAL_ENGINE_DIED} {:.1} s into the experiment (unscaled), not killed by the fault or Node Manager; its log: {}",
                rel(now) as f64 / 1000.0 / s,
                stack.dir.join("vllm.log").display()
            ));
        }
        if let Some(k) = kubelet.as_deref_mut()
            && let Err(err) = k.act(stack, now).await
        {
            break Err(err);
        }
        let in_window = now >= t0 && now < fault_end;
        let status = stack.status().await;
        let qos: Option<EngineQos> = stack.get_json(&format!("{}/qos", stack.mgmt)).await;
        let detail: Option<EngineDetail> = stack
            .get_json(&format!("{}/status/detail", stack.mgmt))
            .await;
        let depth = stack.queue_depth().await;
        let flagged = detail.as_ref().is_some_and(driver_flagged);
        // When the agent itself concluded `abnormal`: the probe that decided it (its
        // completion, on the agent's clock), else when this sample saw it.
        if let (None, Some(first), Some(d)) = (
            out.abnormal_after_ms,
            first_injected_unix_ms,
            detail.as_ref(),
        ) && d.status == npu_health_agent::monitor::Status::Abnormal
        {
            let at = d
                .virtual_inference
                .last_probe
                .as_ref()
                .filter(|_| d.virtual_inference.abnormal)
                .map_or_else(unix_ms, |p| p.at_unix_ms);
            out.abnormal_after_ms = Some(at.saturating_sub(first));
            load.mark();
        }
        if let Some(d) = &detail {
            super::router::note_actions(&mut out.router_actions, &d.actions, t0_unix_ms);
        }
        if flagged && first_injected.is_none() && is_driver_fault(e.fault) {
            break Err(
                "an NPU was already reported failing before the driver fault was injected"
                    .to_owned(),
            );
        }
        let score = qos.as_ref().and_then(|q| q.state.score);
        // Guards, evaluated at every sample.
        let mut want = in_window && !aborted;
        for g in &e.guards {
            let mut event = |action: &'static str, detail: String| {
                out.guard_events.push(GuardEvent {
                    t_ms: rel(now),
                    guard: g.to_string(),
                    action,
                    detail,
                })
            };
            match *g {
                Guard::SkipIfQueueDepth(n) => {
                    let deep = depth.is_some_and(|d| d > n as f64);
                    let d = depth.unwrap_or_default();
                    if deep && !skipping {
                        skipping = true;
                        event("skipped", format!("queue depth {d} > {n}"));
                    } else if !deep && skipping {
                        skipping = false;
                        event("resumed", format!("queue depth {d} <= {n}"));
                    }
                    if skipping {
                        want = false;
                    }
                }
                Guard::AbortIfHealth(x) if active && !aborted => {
                    if let Some(sc) = score.filter(|sc| *sc < x) {
                        aborted = true;
                        want = false;
                        event("aborted", format!("QoS score {sc:.3} < {x}"));
                    }
                }
                Guard::LimitAffectedTokens(n) if active && !aborted => {
                    let affected = load.stats.snapshot().tokens_under_fault;
                    if affected > n {
                        aborted = true;
                        want = false;
                        event(
                            "aborted",
                            format!("{affected} tokens produced under the fault > {n}"),
                        );
                    }
                }
                _ => {}
            }
        }
        if let Some(op) = held.agent_op.take_if(|t| t.is_finished()) {
            record_op(out, op.finish().await, s);
        }
        if want && !active && killed.is_none() {
            if e.fault.is_agent_fault() {
                // Once: an operation on the agent cannot be taken back, so a guard that
                // held it back and let it go again must not start a second one.
                if first_injected.is_none() {
                    held.agent_op = Some(agent::start_op(
                        stack.agent.clone(),
                        e.fault,
                        s,
                        format!("{}/status", stack.mgmt),
                        t0,
                    ));
                    load.set_under_fault(true);
                }
            } else if let Err(err) = inject(stack, load, e.fault, s, &mut held).await {
                break Err(err);
            }
            if !e.driver_codes.is_empty()
                && let Err(err) = stack.faults(codes_patch(&e.driver_codes)).await
            {
                break Err(err);
            }
            if first_injected.is_none() {
                first_injected_unix_ms = Some(unix_ms());
            }
            active = true;
            injected_since = Some(now);
            if first_injected.is_none() {
                first_injected = Some(now);
                out.first_injected_ms = Some(rel(now));
            }
        } else if !want && active {
            remove(stack, load, e.fault, s, &mut held).await;
            if !e.driver_codes.is_empty() {
                let _ = stack.faults(codes_patch(&[])).await;
            }
            active = false;
            injected += injected_since.take().map_or(Duration::ZERO, |t| now - t);
        }
        // Detection, within `detect_within` of the first injection (a benign experiment's
        // expected not-ready: while the fault lasts).
        if let (Some(first), None) = (first_injected, out.detected_after_ms) {
            use super::experiment::KubeletExpect;
            let deadline = match e.expect {
                Expect::DetectWithin(d) => first + sc(d),
                Expect::Healthy => fault_end,
            };
            let at = match (e.expect, kubelet.as_deref()) {
                (Expect::DetectWithin(_), _) if is_driver_fault(e.fault) => {
                    (flagged && active).then_some(now)
                }
                (Expect::DetectWithin(_), None) => killed.filter(|k| *k >= first),
                (_, Some(k)) => match k.expect {
                    KubeletExpect::Restart => k.first(
                        first,
                        &[
                            super::kubelet::Action::RestartLiveness,
                            super::kubelet::Action::RestartExited,
                        ],
                    ),
                    KubeletExpect::NotReady => k.first(first, &[super::kubelet::Action::NotReady]),
                    KubeletExpect::NoRestart => None,
                },
                (Expect::Healthy, None) => None,
            };
            if let Some(at) = at.filter(|at| *at <= deadline) {
                out.detected_after_ms = Some((at - first).as_millis() as u64);
            }
        }
        out.timeline.push(TimelinePoint {
            t_ms: rel(now),
            status,
            qos_score: score,
            qos_level: qos.as_ref().map(|q| q.state.level.as_str().to_owned()),
            ai_cube_peak: qos
                .as_ref()
                .and_then(|q| q.device.ai_cube_peak.map(f64::from)),
            fault_active: active,
            driver_flagged: flagged,
            queue_depth: depth,
        });
        // A detected engine fault ends the experiment; a driver fault is watched on, and so
        // is an engine taken out of the load (a restart would still be a false one).
        let watch_on = is_driver_fault(e.fault)
            || kubelet
                .as_deref()
                .is_some_and(|k| k.expect != super::experiment::KubeletExpect::Restart);
        if out.detected_after_ms.is_some() && !watch_on {
            break Ok(());
        }
        // An engine fault that can no longer be detected in time ends it too (a kubelet run
        // that expects the engine out of the load watches to the end for a restart).
        if let (Expect::DetectWithin(d), Some(first)) = (e.expect, first_injected)
            && !watch_on
            && now > first + sc(d)
        {
            break Ok(());
        }
        tokio::time::sleep(sample_every).await;
    };
    if active {
        let now = Instant::now();
        remove(stack, load, e.fault, s, &mut held).await;
        injected += injected_since.map_or(Duration::ZERO, |t| now - t);
    }
    // A fault Node Manager killed the engine for: the load goes on for the same time with
    // a router or without, so that both rows count what clients saw after the kill.
    if result.is_ok()
        && killed.is_some()
        && kubelet.is_none()
        && matches!(e.expect, Expect::DetectWithin(_))
        && !is_driver_fault(e.fault)
    {
        tokio::time::sleep(sc(AFTER_KILL_TAIL)).await;
        let detail: Option<EngineDetail> = stack
            .get_json(&format!("{}/status/detail", stack.mgmt))
            .await;
        if let Some(d) = &detail {
            super::router::note_actions(&mut out.router_actions, &d.actions, t0_unix_ms);
        }
    }
    out.load_after_abnormal = load.stats.after_mark();
    // An agent operation still under way is waited for (each of its steps is bounded).
    if let Some(op) = held.agent_op.take() {
        match tokio::time::timeout(AGENT_OP_LIMIT, op.finish()).await {
            Ok(done) => record_op(out, done, s),
            Err(_) => {
                out.agent_ops.push(AgentOp {
                    error: Some(format!(
                        "{}: the operation did not end within {AGENT_OP_LIMIT:?}",
                        e.fault
                    )),
                    ..AgentOp::unfinished(e.fault, stack.supervisor)
                });
            }
        }
    }
    // The experiment ran, but the fault did not happen as meant (an upgrade whose second
    // agent could not take over, an agent that did not come back): an error, with the
    // figures kept.
    let result = match (result, out.agent_ops.iter().find_map(|o| o.error.clone())) {
        (Ok(()), Some(err)) => Err(err),
        (r, _) => r,
    };
    out.injected_ms = injected.as_millis() as u64;
    if let Some(k) = kubelet {
        out.kubelet = Some(k.outcome(first_injected, Instant::now(), rel));
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    // `--nm-heartbeat`: whole seconds; 1 s carries 3.0.0b2's 2 s poll timeout, 3 s the
    // reference's 5 s; the emulator gets the intervals scaled and the timeout as it is.
    #[test]
    fn cadences_parse_and_carry_their_poll_timeout() {
        let one = Cadence::parse("1s").unwrap();
        assert_eq!(one, Cadence::PYMOTOR);
        assert_eq!(one.poll_timeout(), Duration::from_secs(2));
        assert_eq!(
            Cadence::parse(" 3s").unwrap().poll_timeout(),
            Duration::from_secs(5)
        );
        for bad in ["0s", "1500ms", "61s", "soon"] {
            assert!(Cadence::parse(bad).is_err(), "{bad}");
        }
        let nm = one.nm_options(vec!["u".into()], 0.1);
        assert_eq!(nm.heartbeat_interval, Duration::from_millis(100));
        assert_eq!(nm.poll_timeout, Duration::from_secs(2), "not scaled");
        assert_eq!((nm.threshold, nm.grace_period), (5, Duration::ZERO));
    }

    // A router row whose draft served is judged by what the agent told the router: only an
    // answer that takes the main engine out justifies the draft's answers.
    #[test]
    fn a_draft_serving_needs_the_agents_word() {
        use super::super::router::{RouterAction, RouterKind};
        let mut out = Outcome {
            router: Some(RouterKind::Haproxy),
            ..crate::report::tests::outcome("burst", "healthy", Verdict::Pass, None)
        };
        assert!(!draft_without_cause(&out), "the draft did not serve");
        out.load.by_draft = 3;
        assert!(draft_without_cause(&out));
        let told = |to: &str| RouterAction {
            t_ms: 100,
            router: "haproxy",
            from: "ready".into(),
            to: to.into(),
            level: "throttle".into(),
        };
        out.router_actions.push(told("queue"));
        assert!(
            draft_without_cause(&out),
            "queue keeps new requests on main"
        );
        out.router_actions.push(told("drain"));
        assert!(!draft_without_cause(&out));
        out.router = None;
        out.router_actions.clear();
        assert!(!draft_without_cause(&out), "no router, no draft");
    }

    // The agent's config per policy: `agent` names the policy and writes only the scaled
    // durations of its preset; `reference` turns the opt-in rules off.
    #[test]
    fn agent_configs_per_policy_parse() {
        for (policy, s) in [(Policy::Agent, 0.1), (Policy::Reference, 1.0)] {
            let text = agent_toml(8000, 8001, 2, policy, s, EngineKind::Fake, "m");
            let cfg = npu_health_agent::config::file::parse(&text, Path::new("agent.toml"))
                .unwrap_or_else(|e| panic!("{e}\n{text}"));
            let e = &cfg.engines[0];
            assert_eq!(e.policy.value.as_str(), policy.as_str());
            assert_eq!(e.qos.stall_detection, policy == Policy::Agent);
            assert_eq!(e.qos.eviction, policy == Policy::Agent);
            if policy == Policy::Agent {
                assert_eq!(e.qos.stall_window, Duration::from_secs(3));
                assert_eq!(
                    e.agent_policy.health_failure_grace,
                    Duration::from_millis(1500)
                );
            }
        }
    }

    // A kill explains itself: the emulator's polls up to its decision, and the agent's
    // warnings up to it (what it logged about the dead engine afterwards is left out).
    #[test]
    fn kill_evidence_quotes_the_polls_and_warnings_before_the_kill() {
        use fake_engine::node_manager::{NmStatus, Poll};
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("agent.log");
        let start = humantime::parse_rfc3339("2026-12-02T12:00:00Z").unwrap();
        std::fs::write(
            &log,
            "2026-12-02T12:00:01.000000Z  INFO fine engine=chaos\n\
             2026-12-02T12:00:02.000000Z  WARN /health fails: timed out engine=chaos\n\
             2026-12-02T12:00:09.000000Z  WARN after the kill engine=chaos\n",
        )
        .unwrap();
        let poll = |at_ms, detected, error: Option<&str>| Poll {
            at_ms,
            endpoint: 0,
            detected,
            kept: detected,
            error: error.map(str::to_owned),
            latency_ms: 2.0,
        };
        let mut polls: Vec<Poll> = (0..20)
            .map(|i| poll(i * 100, NmStatus::Normal, None))
            .collect();
        polls.push(poll(2_100, NmStatus::Abnormal, Some("timeout")));
        polls.push(poll(5_000, NmStatus::Abnormal, None));
        let report = NmReport {
            polls,
            killed_at_ms: Some(3_000),
            max_consecutive_abnormal: 5,
            heartbeats: 30,
        };
        let lines = kill_evidence(Some(&report), start, std::slice::from_ref(&log));
        let polls: Vec<&String> = lines.iter().filter(|l| l.starts_with("poll ")).collect();
        assert_eq!(polls.len(), EVIDENCE_POLLS, "{lines:#?}");
        assert_eq!(
            polls.last().unwrap().as_str(),
            "poll -0.90 s: abnormal, timeout (2 ms)"
        );
        let agent: Vec<&String> = lines.iter().filter(|l| l.starts_with("agent: ")).collect();
        assert_eq!(agent.len(), 1, "{lines:#?}");
        assert!(agent[0].contains("/health fails"), "{lines:#?}");
        // No report (PyMotor's Node Manager): the agent's last warnings, all of them here.
        let lines = kill_evidence(None, start, &[log.clone(), dir.path().join("none.log")]);
        assert_eq!(lines.len(), 2, "{lines:#?}");
    }

    // With a real engine the `/health` timeout bounds the engine's own answer time and is not
    // scaled; with the fake engine (scaled too) it is.
    #[test]
    fn the_health_timeout_is_scaled_with_the_fake_engine_only() {
        for (engine, want) in [
            (EngineKind::Fake, Duration::from_secs(1)),
            (EngineKind::Vllm, REAL_ENGINE_HEALTH_TIMEOUT),
        ] {
            let text = agent_toml(8000, 8001, 2, Policy::Reference, 0.2, engine, "m");
            let cfg = npu_health_agent::config::file::parse(&text, Path::new("agent.toml"))
                .unwrap_or_else(|e| panic!("{e}\n{text}"));
            let t = &cfg.engines[0].timing;
            assert_eq!(t.health_timeout, Some(want), "{engine:?}");
            // Everything else stays scaled either way.
            assert_eq!(t.request_timeout, Duration::from_secs(1), "{engine:?}");
        }
    }

    // The kubelet row's verdicts: a liveness restart of a healthy engine (or one that only
    // had to leave the load) is a false kill; a fault needs its action, in time.
    #[test]
    fn kubelet_verdicts() {
        use super::super::experiment::KubeletExpect as K;
        let exp = |expect: Expect, kubelet: K| Experiment {
            name: "x".into(),
            target: super::super::experiment::Target::Engine,
            fault: Fault::EngineHang,
            duration: Duration::from_secs(10),
            load: Default::default(),
            guards: Vec::new(),
            expect,
            agent_policy_only: false,
            max_nm_heartbeat_s: None,
            known_false_kills: Vec::new(),
            kubelet,
            driver_codes: Vec::new(),
        };
        let out =
            |k: K, live: u32, exit: u32, restart: Option<u64>, detected: Option<u64>| Outcome {
                experiment: "x".into(),
                target: super::super::experiment::Target::Engine,
                fault: "engine_hang".into(),
                policy: Policy::Agent,
                integration: Integration::Kubelet,
                cadence: None,
                router: None,
                node_manager: NodeManagerKind::Emulator,
                expect: String::new(),
                verdict: Verdict::Error,
                detected_after_ms: detected,
                abnormal_after_ms: None,
                killed_at_ms: None,
                first_injected_ms: Some(0),
                injected_ms: 0,
                guard_events: Vec::new(),
                load: Default::default(),
                load_after_abnormal: None,
                router_actions: Vec::new(),
                error: None,
                ran_again_after: None,
                kubelet: Some(KubeletOutcome {
                    expect: k,
                    actions: Vec::new(),
                    liveness_restarts: live,
                    exit_restarts: exit,
                    not_ready_after_ms: None,
                    restart_after_ms: restart,
                    not_ready_ms: 0,
                }),
                kill_evidence: Vec::new(),
                agent_supervisor: crate::agent::Supervisor::Direct,
                agent_supervisor_note: None,
                agent_ops: Vec::new(),
                polls: Vec::new(),
                timeline: Vec::new(),
            };
        let fault = Expect::DetectWithin(Duration::from_secs(60));
        let rows = [
            (
                "benign, no restart",
                exp(Expect::Healthy, K::NoRestart),
                out(K::NoRestart, 0, 0, None, None),
                false,
                Verdict::Pass,
            ),
            (
                "benign, restarted",
                exp(Expect::Healthy, K::NoRestart),
                out(K::NoRestart, 1, 0, Some(5), None),
                false,
                Verdict::FalseKill,
            ),
            (
                "benign, restarted, known",
                exp(Expect::Healthy, K::NoRestart),
                out(K::NoRestart, 1, 0, Some(5), None),
                true,
                Verdict::KnownFalseKill,
            ),
            (
                "hang restarted",
                exp(fault, K::Restart),
                out(K::Restart, 1, 0, Some(5), Some(5)),
                false,
                Verdict::Pass,
            ),
            (
                "crash restarted after exit",
                exp(fault, K::Restart),
                out(K::Restart, 0, 1, Some(5), Some(5)),
                false,
                Verdict::Pass,
            ),
            (
                "hang not restarted",
                exp(fault, K::Restart),
                out(K::Restart, 0, 0, None, None),
                false,
                Verdict::Missed,
            ),
            (
                "restarted before the fault",
                exp(fault, K::Restart),
                out(K::Restart, 1, 0, None, None),
                false,
                Verdict::FalseKill,
            ),
            (
                "own restart, taken out",
                exp(fault, K::NotReady),
                out(K::NotReady, 0, 0, None, Some(1)),
                false,
                Verdict::Pass,
            ),
            (
                "own restart, restarted too",
                exp(fault, K::NotReady),
                out(K::NotReady, 1, 0, Some(3), Some(1)),
                false,
                Verdict::FalseKill,
            ),
        ];
        for (name, e, o, known, want) in rows {
            assert_eq!(kubelet_verdict(&e, &o, known, false), want, "{name}");
        }
        let e = exp(fault, K::Restart);
        let o = out(K::Restart, 0, 0, None, None);
        assert_eq!(
            kubelet_verdict(&e, &o, false, true),
            Verdict::NotDetectableByDesign
        );
    }

    #[test]
    fn a_bind_failure_in_a_log_is_seen_as_a_taken_port() {
        let dir = tempfile::tempdir().unwrap();
        assert!(!port_was_taken(dir.path()), "no logs yet");
        std::fs::write(dir.path().join("agent.log"), "INFO started\n").unwrap();
        assert!(!port_was_taken(dir.path()));
        // The text a process prints for the real error (as `fake-engine` does).
        let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let err = std::net::TcpListener::bind(held.local_addr().unwrap()).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::AddrInUse);
        std::fs::write(
            dir.path().join("engine.log"),
            format!("npu-health-agent: fake engine: {err}\n"),
        )
        .unwrap();
        assert!(port_was_taken(dir.path()));
    }
}
