//! What a run is asked for: the detection policy, Node Manager's cadence, the row (who acts
//! on the agent's answers: Node Manager, the kubelet, a router), the engine, and the options
//! every experiment of a run shares.

use crate::agent::Supervisor;
use crate::experiment::Fault;
use crate::peers::Peer;
use crate::real_engine::RealEngine;
use crate::timescale::scaled;
use fake_engine::node_manager::NmOptions;
use serde::Serialize;
use std::path::PathBuf;
use std::time::Duration;

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
    /// `policy = "agent"` as it was before issue 40's evidence: the stopped-process rule,
    /// rule 11 (no sign of life) and rule 12 (the learned probe timeout) off. The "before"
    /// column of a before/after table, in the same run (docs/chaos.md).
    #[value(name = "agent-before-40")]
    #[serde(rename = "agent-before-40")]
    AgentBefore40,
    /// Not the agent: MindIE's released engine server (PyMotor 3.0.0b2, unmodified) serves
    /// `/status` from its own virtual inference, on the same fake engine and NPUs. Its timing
    /// is fixed, so it runs only at `--time-scale 1`.
    #[value(name = "mindie-3.0.0b2")]
    #[serde(rename = "mindie-3.0.0b2")]
    Mindie,
    /// `policy = "agent"` with every rule in `observe` (`[engine.agent_policy] mode`):
    /// `/status` answers as `reference` does, the agent policy is the shadow (issue 50).
    #[value(name = "agent-observe")]
    #[serde(rename = "agent-observe")]
    AgentObserve,
    /// `policy = "reference"` with `shadow_policy = "agent"` (the agent's keys as `agent`
    /// writes them): the upgrade path's first week (docs/deploy.md).
    #[value(name = "reference-shadow")]
    #[serde(rename = "reference-shadow")]
    ReferenceShadow,
    /// A peer, not the agent: the kubelet's liveness probe with the API defaults (period
    /// 10 s, timeout 1 s, 3 failures) on the engine's `/health` kills (docs/chaos.md, "The
    /// peers"). The agent runs as under `reference`; nobody reads its `/status`.
    #[value(name = "k8s-liveness")]
    #[serde(rename = "k8s-liveness")]
    K8sLiveness,
    /// A peer: NVIDIA Dynamo's canary after 10 s idle, and the operator's liveness probe on
    /// its status.
    #[value(name = "dynamo-canary")]
    #[serde(rename = "dynamo-canary")]
    DynamoCanary,
    /// A peer: a liveness probe on SGLang's `/health_generate` (its 20 s budget).
    #[value(name = "sglang-health-generate")]
    #[serde(rename = "sglang-health-generate")]
    SglangHealthGenerate,
    /// A peer: gonka's step-counter heartbeat on `/metrics` (120 s grace, 3 in a row).
    #[value(name = "token-heartbeat")]
    #[serde(rename = "token-heartbeat")]
    TokenHeartbeat,
    /// A peer: vllm-ascend's 10 s health ping behind `/health`, probed with the API defaults.
    #[value(name = "engine-ping")]
    #[serde(rename = "engine-ping")]
    EnginePing,
}

impl Policy {
    /// The policies `npu-chaos compare` runs by default: every one that makes kill decisions
    /// of its own, the peers included (a policy that only shadows another, an older agent, and
    /// MindIE's own server, which runs only in real time, are not compared).
    pub fn compared() -> Vec<Policy> {
        vec![
            Policy::Reference,
            Policy::Agent,
            Policy::K8sLiveness,
            Policy::DynamoCanary,
            Policy::SglangHealthGenerate,
            Policy::TokenHeartbeat,
            Policy::EnginePing,
        ]
    }

    /// Name in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Policy::Reference => "reference",
            Policy::Agent => "agent",
            Policy::AgentBefore40 => "agent-before-40",
            Policy::Mindie => "mindie-3.0.0b2",
            Policy::AgentObserve => "agent-observe",
            Policy::ReferenceShadow => "reference-shadow",
            Policy::K8sLiveness => "k8s-liveness",
            Policy::DynamoCanary => "dynamo-canary",
            Policy::SglangHealthGenerate => "sglang-health-generate",
            Policy::TokenHeartbeat => "token-heartbeat",
            Policy::EnginePing => "engine-ping",
        }
    }

    /// The peer health check this policy is, if it is one (then the agent runs as under
    /// `reference` and the peer decides the kill).
    pub(crate) fn peer(self) -> Option<Peer> {
        match self {
            Policy::K8sLiveness => Some(Peer::K8sLiveness),
            Policy::DynamoCanary => Some(Peer::DynamoCanary),
            Policy::SglangHealthGenerate => Some(Peer::SglangHealthGenerate),
            Policy::TokenHeartbeat => Some(Peer::TokenHeartbeat),
            Policy::EnginePing => Some(Peer::EnginePing),
            _ => None,
        }
    }

    /// The policy the agent runs in this row: a peer's row runs it as `reference`.
    pub fn agent_runs(self) -> Policy {
        if self.peer().is_some() {
            Policy::Reference
        } else {
            self
        }
    }

    /// The policy `/status` answers by: `reference` for the rows whose agent policy is only
    /// observed (their verdicts, expectations and known kills are the reference's).
    pub fn in_force(self) -> Policy {
        match self {
            Policy::AgentObserve | Policy::ReferenceShadow => Policy::Reference,
            p => p,
        }
    }

    /// Whether the agent runs the agent policy as a shadow beside the one in force.
    pub fn has_shadow(self) -> bool {
        matches!(self, Policy::AgentObserve | Policy::ReferenceShadow)
    }

    /// The agent policy, with or without issue 40's evidence.
    pub fn is_agent(self) -> bool {
        matches!(self, Policy::Agent | Policy::AgentBefore40)
    }

    /// Why this policy cannot run the experiment here, if it cannot.
    pub fn not_applicable(self, opts: &RunOptions, fault: Fault) -> Option<String> {
        if let Some(peer) = self.peer() {
            return peer_not_applicable(peer, opts, fault);
        }
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
        if fault.is_driver_fault() {
            return Some("MindIE's engine server does not report the NPU's reads (it samples npu-smi and keeps no per-NPU state)".to_owned());
        }
        if fault.is_agent_fault() {
            return Some("the agent's faults act on npu-health-agent; under this policy MindIE's engine server serves /status instead".to_owned());
        }
        None
    }
}

/// Why a peer cannot run the experiment here, if it cannot.
fn peer_not_applicable(peer: Peer, opts: &RunOptions, fault: Fault) -> Option<String> {
    let why = match opts.row {
        _ if opts.pymotor_nm.is_some() => {
            "a peer decides the kill itself: PyMotor's Node Manager has nothing of it to poll"
        }
        Row::Kubelet | Row::Router(_) => {
            "a peer decides the kill itself: it runs in the Node Manager rows (whose cadence changes nothing for it), not under the kubelet emulator or a router, which act on the agent's answers"
        }
        Row::NodeManager(_) if opts.engine == EngineKind::Vllm && peer.not_on_vllm().is_some() => {
            peer.not_on_vllm().unwrap_or_default()
        }
        Row::NodeManager(_) if fault.is_driver_fault() => {
            "a peer reads the engine only: an NPU's fault is reported in the agent's /status, which nobody reads in a peer's row"
        }
        Row::NodeManager(_) if fault.is_agent_fault() => {
            "the agent's faults act on npu-health-agent, which nobody reads in a peer's row"
        }
        Row::NodeManager(_) => return None,
    };
    Some(why.to_owned())
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
    /// The kubelet probes `/readyz` and `/livez` ([`crate::kubelet`]): not ready takes the
    /// engine out of the load, a liveness failure restarts it.
    Kubelet,
}

/// A row of the summary: Node Manager at one cadence, the kubelet, or the load through a
/// router (with Node Manager at its 1 s cadence).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Row {
    NodeManager(Cadence),
    Kubelet,
    Router(crate::router::RouterKind),
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
    pub fn router(self) -> Option<crate::router::RouterKind> {
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
    pub pymotor_nm: Option<crate::pymotor::Pymotor>,
    /// The PyMotor installation, for the `mindie-3.0.0b2` peer (found when it can run).
    pub pymotor: Option<crate::pymotor::Pymotor>,
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
    pub(super) fn model(&self) -> &'static str {
        match self.engine {
            EngineKind::Fake => "m",
            EngineKind::Vllm => "tiny",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PEERS: [(Policy, &str); 5] = [
        (Policy::K8sLiveness, "k8s-liveness"),
        (Policy::DynamoCanary, "dynamo-canary"),
        (Policy::SglangHealthGenerate, "sglang-health-generate"),
        (Policy::TokenHeartbeat, "token-heartbeat"),
        (Policy::EnginePing, "engine-ping"),
    ];

    fn opts(row: Row, engine: EngineKind) -> RunOptions {
        RunOptions {
            agent_exe: PathBuf::new(),
            time_scale: 0.05,
            out_dir: PathBuf::new(),
            engine,
            real_vllm_script: PathBuf::new(),
            real: Default::default(),
            row,
            pymotor_nm: None,
            pymotor: None,
            agent_supervisor: None,
            repo: PathBuf::new(),
        }
    }

    // `--policy k8s-liveness` and the others: one name for clap, serde and the reports; a
    // peer's agent runs as `reference`, with the reference's config.
    #[test]
    fn the_peer_policies_have_one_name_and_run_the_agent_as_reference() {
        use clap::ValueEnum;
        for (p, name) in PEERS {
            assert_eq!(Policy::from_str(name, false), Ok(p), "{name}");
            assert_eq!(serde_json::to_value(p).unwrap(), name);
            assert_eq!(p.as_str(), name);
            assert!(p.peer().is_some() && !p.is_agent() && !p.has_shadow());
            assert_eq!(p.agent_runs(), Policy::Reference);
            assert_eq!(
                p.in_force(),
                p,
                "judged as itself, not as the agent's reference"
            );
            let toml =
                |p| super::super::config::agent_toml(8000, 8001, 2, p, 0.05, EngineKind::Fake, "m");
            assert_eq!(toml(p), toml(Policy::Reference), "{name}");
        }
        assert_eq!(Policy::Reference.peer(), None);
        assert_eq!(Policy::Agent.agent_runs(), Policy::Agent);
    }

    // A peer runs in the Node Manager rows, on every engine fault; not where the agent's
    // answers act (the kubelet, a router), not on a driver or agent fault, and the two that
    // need the fake engine not on vLLM.
    #[test]
    fn where_a_peer_runs_and_why_not_elsewhere() {
        let nm = opts(Row::NodeManager(Cadence::PYMOTOR), EngineKind::Fake);
        for (p, name) in PEERS {
            assert_eq!(p.not_applicable(&nm, Fault::EngineHang), None, "{name}");
            for f in [Fault::DriverError, Fault::AgentCrash] {
                assert!(p.not_applicable(&nm, f).is_some(), "{name} {f}");
            }
            for row in [
                Row::Kubelet,
                Row::Router(crate::router::RouterKind::Haproxy),
            ] {
                let why = p.not_applicable(&opts(row, EngineKind::Fake), Fault::EngineHang);
                assert!(why.unwrap().contains("decides the kill itself"), "{name}");
            }
            let vllm = opts(Row::NodeManager(Cadence::REFERENCE), EngineKind::Vllm);
            let why = p.not_applicable(&vllm, Fault::EngineHang);
            let fake_only = matches!(p, Policy::SglangHealthGenerate | Policy::EnginePing);
            assert_eq!(why.is_some(), fake_only, "{name}: {why:?}");
        }
    }
}
