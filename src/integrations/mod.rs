//! The systems that act on the agent's verdict and QoS level, one folder each, behind one
//! trait ([`Integration`]) and one registry ([`REGISTRY`]):
//!
//! - [`node_manager`]: MindIE's Node Manager polls `/status` (the monitor's verdict);
//! - [`kubelet`]: the kubelet polls `/readyz` and `/livez`;
//! - [`kubernetes`]: the Kubernetes API mode keeps a readiness-gate condition on the pod and
//!   evicts it at a held `evict`;
//! - [`haproxy`]: HAProxy polls its agent check on a listener of its own;
//! - [`envoy`]: Envoy's active health check polls `/readyz`.
//!
//! Each folder owns its configuration table (`config.rs`, read by [`crate::config`]), its
//! pure rule (what the facts, [`ActionInputs`], make it tell), its listener or task, and its
//! typed states (`told.rs`, the words it writes on the wire). The tables and the states
//! are data only: [`crate::config`] and [`crate::monitor`]'s journal may read them, they
//! read no runtime module. Every rule reads the facts of one instant; none waits on the
//! engine. [`observe`] writes what changed to each engine's journal. docs/architecture.md
//! shows what adding one takes.

pub mod envoy;
pub mod haproxy;
pub mod kubelet;
pub mod kubernetes;
pub mod node_manager;
pub mod observe;

use crate::config::{AgentSettings, EngineSpec, ListenerLimits};
use crate::monitor::Monitor;
use crate::monitor::journal::{self, Told};
use crate::monitor::verdict::{HealthState, Status};
use crate::monitor::vi_state::Phase;
use crate::probe::health::Transport;
use crate::qos::score::Level;
use axum::http::HeaderMap;
use axum::response::Response;
use serde::{Deserialize, Serialize};
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// The engines the agent watches now (the agent's roster: a reload changes it in place).
pub type Engines = Arc<RwLock<Vec<Arc<Monitor>>>>;

/// A listener's server, until its cancellation and its answers in progress are done.
pub type Serving = Pin<Box<dyn Future<Output = ()> + Send>>;

/// A listening port an integration asks the agent for (besides the engines' and the admin
/// one): the agent binds it (or takes it over), and serves it with [`Integration::serve`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listen {
    pub addr: SocketAddr,
    /// The key that sets it (`[agent] haproxy_agent_listen`).
    pub key: &'static str,
    /// What it is, in errors and log lines (`HAProxy agent-check listener`).
    pub label: &'static str,
    /// Its short name in log lines (`haproxy agent check`).
    pub name: &'static str,
    /// How a client uses it, for the log line saying it listens.
    pub hint: &'static str,
}

/// A route an integration answers on each engine's listener: `answer` of the engine and the
/// request's headers. Handlers only read shared state; none waits on the engine.
#[derive(Clone, Copy)]
pub struct Route {
    /// The path on the engine's listener (`/readyz`).
    pub path: &'static str,
    pub answer: fn(&Monitor, &HeaderMap) -> Response,
    /// Also open on the admin listener as `/engines/<name><path>` (the kubelet's probes carry
    /// no credentials, so these routes are open there).
    pub on_admin: bool,
}

/// What an integration runs for the whole agent once it started (the Kubernetes API mode's
/// client): it gives each engine its task.
pub trait Started: Send + Sync {
    /// The task that acts for the engine `m` until `cancel`; `None` when there is none (the
    /// record then says why).
    fn engine_task(&self, m: Arc<Monitor>, cancel: CancellationToken) -> Option<Serving>;
}

/// One system that acts on the verdict or the level.
pub trait Integration: Sync {
    /// Its name in the journal, `/status/detail` and the metrics.
    fn id(&self) -> journal::Integration;

    /// What it does for the engine `spec` under the agent's settings `agent`, in one line
    /// (`check-config`, `doctor`).
    fn describe(&self, spec: &EngineSpec, agent: &AgentSettings) -> String;

    /// The routes it answers on each engine's listener.
    fn routes(&self) -> &'static [Route] {
        &[]
    }

    /// A router that polls the agent: every state it can be told (one series each in
    /// `npu_health_agent_router_state`). Empty for the others.
    fn router_states(&self) -> Vec<Told> {
        Vec::new()
    }

    /// The files and settings it reads at start, read as it will read them, so
    /// `check-config` and the start give the same error: `Err((key, why))`.
    fn preflight(&self, _agent: &AgentSettings) -> Result<(), (String, String)> {
        Ok(())
    }

    /// Starts what it runs for the whole agent under `agent` (fixed until the agent
    /// restarts), if anything.
    fn start(&self, _agent: &AgentSettings) -> Option<Arc<dyn Started>> {
        None
    }

    /// The listener it needs of its own under `agent`, if any.
    fn listen(&self, _agent: &AgentSettings) -> Option<Listen> {
        None
    }

    /// Serves its listener (see [`Integration::listen`]) over `engines` until `cancel`,
    /// then lets the answers in progress finish.
    fn serve(
        &self,
        _listener: TcpListener,
        _engines: Engines,
        _limits: ListenerLimits,
        _name: String,
        _cancel: CancellationToken,
    ) -> Serving {
        Box::pin(async {})
    }
}

/// Every integration, in the order `check-config` lists them.
pub static REGISTRY: &[&dyn Integration] = &[
    &node_manager::NodeManager,
    &kubelet::Kubelet,
    &kubernetes::KubernetesApi,
    &haproxy::Haproxy,
    &envoy::Envoy,
];

/// Why the verdict is `abnormal`, as far as the actions care.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AbnormalCause {
    /// `/health` answered before and fails now (past the agent policy's grace).
    Health,
    /// Virtual inference went abnormal (warm-up failed, or the failure count reached its
    /// maximum).
    VirtualInference,
    /// A held QoS `evict` with `qos.eviction` on.
    QosEviction,
    /// One of the engine's processes stopped past `agent_policy.stopped_process_grace`.
    EngineStopped,
}

/// What the action rules read of one engine, taken at one instant.
#[derive(Debug, Clone, PartialEq)]
pub struct ActionInputs {
    /// The verdict `/status` serves under the policy in force.
    pub status: Status,
    /// Why it is abnormal; `None` unless `status` is `abnormal`.
    pub cause: Option<AbnormalCause>,
    /// The verdict's reason, in words.
    pub reason: String,
    /// `/health` as last judged.
    pub health: HealthState,
    /// The last `/health` failure was a refused connection: the engine's port is closed.
    pub port_closed: bool,
    /// Virtual inference's phase (warming up: the engine answers its first request).
    pub phase: Phase,
    pub level: Level,
    pub score: Option<f64>,
    /// Every QoS component had an input at the last evaluation: the score does not rest on
    /// missing inputs.
    pub inputs_complete: bool,
    /// Requests running when the level left `normal` (a router's cap while it is not).
    pub admission_cap: Option<u32>,
}

impl ActionInputs {
    /// The facts of `m` now.
    pub fn of(m: &Monitor) -> ActionInputs {
        use crate::monitor::evidence::Kind;
        // The monitor's one verdict: its status, cause and reason come from one walk.
        let verdict = m.verdict();
        let health = m.health_detail();
        let cause = verdict.cause.map(|c| match c.kind {
            Kind::Health => AbnormalCause::Health,
            Kind::EngineStopped => AbnormalCause::EngineStopped,
            Kind::VirtualInference => AbnormalCause::VirtualInference,
            Kind::QosEviction => AbnormalCause::QosEviction,
        });
        let components = m.qos.components();
        ActionInputs {
            status: verdict.status,
            cause,
            // One line, whatever the engine's error said.
            reason: verdict.reason.replace(['\n', '\r'], " "),
            port_closed: health.last_transport_error == Some(Transport::Refused),
            health: health.state,
            phase: m.vi.phase(),
            level: m.qos.level(),
            score: m.qos.score(),
            inputs_complete: !components.is_empty() && components.iter().all(|c| c.score.is_some()),
            admission_cap: m.qos.admission_cap(),
        }
    }

    fn level_words(&self) -> String {
        match self.score {
            Some(s) => format!("QoS level {} (score {s:.3})", self.level.as_str()),
            None => format!("QoS level {}", self.level.as_str()),
        }
    }

    /// A held `evict` whose score rests on no missing input.
    pub fn evict_held(&self) -> bool {
        self.level == Level::Evict && self.inputs_complete
    }
}

/// One integration's action for an engine, as `check-config` and `doctor` show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Active {
    /// `node_manager`, `kubelet`, `kubernetes_api`, `haproxy`, `envoy`, `routers`.
    pub integration: &'static str,
    /// What acts, and on what, in one line.
    pub action: String,
}

/// The actions in force for `spec` under the agent's settings `agent`: every integration's,
/// then what any other router may read.
pub fn active(spec: &EngineSpec, agent: &AgentSettings) -> Vec<Active> {
    let mut out: Vec<Active> = REGISTRY
        .iter()
        .map(|i| Active {
            integration: i.id().as_str(),
            action: i.describe(spec, agent),
        })
        .collect();
    out.push(Active {
        integration: "routers",
        action: "others: /qos (score, level), inference_node_health and npu_health_agent_qos_level in /metrics".to_owned(),
    });
    out
}

#[cfg(test)]
pub(crate) mod tests;
