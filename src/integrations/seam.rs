//! The seam every integration plugs into: one trait ([`Integration`]) and what it gives the
//! agent (routes on each engine's listener, a listener of its own, a task per engine, its
//! memory of an engine, the hook that hears each `/readyz` answer, its configuration tables).
//! The seam names no integration; the list ([`super::REGISTRY`]) names each once.

use super::answers::Readiness;
use crate::config::tables::TableReader;
use crate::config::{AgentSettings, EngineSpec, ListenerLimits};
use crate::monitor::Monitor;
use crate::monitor::acted::Memory;
use crate::monitor::journal::{Id, Told};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// The engines the agent watches now (the agent's roster: a reload changes it in place).
pub(crate) type Engines = Arc<RwLock<Vec<Arc<Monitor>>>>;

/// A listener's server, until its cancellation and its answers in progress are done.
pub(crate) type Serving = Pin<Box<dyn Future<Output = ()> + Send>>;

/// A listening port an integration asks the agent for (besides the engines' and the admin
/// one): the agent binds it (or takes it over), and serves it with [`Integration::serve`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Listen {
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
pub(crate) struct Route {
    /// The path on the engine's listener (`/readyz`).
    pub path: &'static str,
    pub answer: fn(&Monitor, &HeaderMap) -> Response,
    /// Also open on the admin listener as `/engines/<name><path>` (the kubelet's probes carry
    /// no credentials, so these routes are open there).
    pub on_admin: bool,
}

/// One NPU of an engine as the driver named it: its logic id, and its physical id when the
/// driver gave one (MindCluster names NPUs by physical id).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct EngineNpu {
    pub logic_id: u32,
    pub phy_id: Option<u32>,
}

/// What an integration runs for the whole agent once it started (the Kubernetes API mode's
/// client): it gives each engine its task.
pub(crate) trait Started: Send + Sync {
    /// The task that acts for the engine `m` (on the NPUs `npus`) until `cancel`; `None` when
    /// there is none (the record then says why).
    fn engine_task(
        &self,
        m: Arc<Monitor>,
        npus: &[EngineNpu],
        cancel: CancellationToken,
    ) -> Option<Serving>;
}

/// One system that acts on the verdict or the level.
pub(crate) trait Integration: Sync {
    /// Its name in the journal, `/status/detail` and the metrics.
    fn id(&self) -> Id;

    /// What it does for the engine `spec` under the agent's settings `agent`, in one line
    /// (`check-config`, `doctor`).
    fn describe(&self, spec: &EngineSpec, agent: &AgentSettings) -> String;

    /// Its configuration tables (`config::tables::ConfigTable`), which the configuration
    /// reads through the list (`[agent.kubernetes]`, `[engine.actions.haproxy]`). None by
    /// default.
    fn tables(&self) -> Vec<&'static dyn TableReader> {
        Vec::new()
    }

    /// The routes it answers on each engine's listener.
    fn routes(&self) -> &'static [Route] {
        &[]
    }

    /// A router that polls the agent: every state it can be told (one series each in
    /// `npu_health_agent_router_state`). Empty for the others.
    fn router_states(&self) -> Vec<Told> {
        Vec::new()
    }

    /// Hears every `/readyz` answer (`answer`), whoever asked: an integration that reads
    /// `/readyz` records what it was told when it is the one asking
    /// ([`Monitor::told_router`]), and may add its own headers to the answer (`extra`).
    /// Nothing by default.
    fn heard_readyz(&self, _answer: &Readyz<'_>, _extra: &mut HeaderMap) {}

    /// What it keeps of each engine beyond the journal, saved in the state file under its own
    /// keys: a fresh one, which the agent gives each engine it starts. None by default.
    fn memory(&self) -> Option<Box<dyn Memory>> {
        None
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

/// One `/readyz` answer, as every integration hears it ([`Integration::heard_readyz`]).
pub(crate) struct Readyz<'a> {
    /// The engine answered for.
    pub engine: &'a Monitor,
    /// The request's headers (who asked: `user-agent`).
    pub asked: &'a HeaderMap,
    /// What was answered.
    pub readiness: &'a Readiness,
}

/// The one shape of a probe route's answer: `code` and one line of text, never cached.
pub(crate) fn probe_answer(code: StatusCode, line: String) -> Response {
    (
        code,
        [
            (header::CONTENT_TYPE, "text/plain; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        format!("{line}\n"),
    )
        .into_response()
}
