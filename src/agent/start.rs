//! `start`: the agent's start-up, in phases. Everything that can fail (the sampler's
//! settings, the devices, the clients, TLS, the sockets, the predecessor's hand-over) comes
//! before anything is spawned; then the engines start (from the state file when it has
//! them), then the listeners that list them.

use super::launch::Prepared;
use super::listeners::acquire;
use super::{
    AgentError, LivenessCfg, Roster, Running, apply_fault_table, driver_config, npu_ids, preflight,
    read_fault_table, sampler_config,
};
use crate::config::{AgentConfig, ListenerLimits};
use crate::continuity::StateDir;
use crate::continuity::handover::{HandoverError, Predecessor};
use crate::continuity::sockets::Inherited;
use crate::continuity::statefile;
use crate::integrations::{Integration, Listen, REGISTRY};

use crate::monitor::saved::Carry;
use crate::sampler::{Sampler, StartError};
use crate::server;
use crate::server::auth::AdminAccess;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// What a start takes over from before it: the state directory, sockets systemd passed
/// back, and a running agent handing over.
pub struct Startup {
    pub state_dir: Option<StateDir>,
    /// No other agent writes in the state directory once the predecessor (if any) has
    /// released it: what writes cut short left there may go.
    pub sole_writer: bool,
    pub inherited: Inherited,
    pub predecessor: Option<Predecessor>,
    /// How long to wait for a port another process holds.
    pub wait_for_ports: Duration,
}

/// The sockets the start acquired, with what each serves.
struct Sockets {
    engines: Vec<(Prepared, std::net::TcpListener)>,
    admin: Option<(SocketAddr, std::net::TcpListener, Arc<AdminAccess>)>,
    own: Vec<(&'static dyn Integration, Listen, std::net::TcpListener)>,
}

/// Starts everything inside the current tokio runtime, from what `startup` takes over.
pub async fn start(cfg: AgentConfig, mut startup: Startup) -> Result<Running, AgentError> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let sampler = start_sampler(&cfg).await?;
    // The checks check-config makes too, so both give the same error.
    preflight::host(&cfg, npu_ids(&sampler).as_deref())
        .map_err(|e| AgentError::Config(e.to_string()))?;
    apply_fault_table(read_fault_table(&cfg.agent).await, sampler.shared(), false);
    let own: Vec<(&'static dyn Integration, Listen)> = REGISTRY
        .iter()
        .filter_map(|i| Some((*i, i.listen(&cfg.agent)?)))
        .collect();
    let limits = listener_limits(&cfg, own.len());
    let mut running = Running {
        limits,
        shared: sampler.shared().clone(),
        sampler,
        cfg: cfg.clone(),
        engines: Vec::new(),
        admin: None,
        integration_listeners: Vec::new(),
        roster: Roster::default(),
        liveness_cfg: Arc::new(LivenessCfg(std::sync::Mutex::new(
            cfg.agent.sampler_stuck_after,
        ))),
        started: REGISTRY
            .iter()
            .filter_map(|i| i.start(&cfg.agent))
            .collect(),
        state_dir: startup.state_dir.clone(),
        persister: None,
        predecessor: None,
        pods: None,
    };
    let sockets = running.acquire_sockets(&cfg, own, &mut startup).await?;
    // The agent handing over stops accepting and writes its state now; connections that
    // arrive meanwhile wait in the sockets' backlog.
    if let Some(mut pred) = startup.predecessor.take() {
        pred.take().await.map_err(|e| taking_over(&pred, e))?;
        running.predecessor = Some(pred);
    }
    // Only now: the agent handing over writes through a temporary file until it released.
    if startup.sole_writer {
        running.remove_stale_writes();
    }
    let saved = match running.state_dir.as_ref().and_then(|d| d.state()) {
        Some(place) => statefile::load(place),
        None => statefile::Found::none(),
    };
    // Past its window the running agent accepts again: this one must not start to.
    if let Some(p) = &running.predecessor {
        p.in_time().map_err(|e| taking_over(p, e))?;
    }
    running.pods = super::PodsPoll::start(&cfg.agent, &running.sampler);
    running.launch_engines(sockets.engines, saved)?;
    running.serve_listeners(sockets.admin, sockets.own)?;
    running.start_persister();
    Ok(running)
}

fn taking_over(p: &Predecessor, e: HandoverError) -> AgentError {
    AgentError::Runtime(format!(
        "taking over from the running agent (pid {}): {e}",
        p.pid
    ))
}

/// The sampler for `cfg`. Without NPU figures the agent still serves `/status` from
/// `/health` (virtual inference is disabled by its AI Cube condition): a crash loop would
/// make Node Manager see refused polls, i.e. abnormal, and kill a healthy engine. Bad
/// settings are still fatal.
async fn start_sampler(cfg: &AgentConfig) -> Result<Sampler, AgentError> {
    let sampler_cfg = sampler_config(cfg);
    let driver = driver_config(&cfg.agent);
    let started = tokio::task::spawn_blocking(move || Sampler::start(&driver, &sampler_cfg))
        .await
        .map_err(|e| AgentError::Runtime(format!("sampler start-up panicked: {e}")))?;
    match started {
        Ok(s) => Ok(s),
        Err(e @ StartError::NoBackend { .. }) => Ok(Sampler::without_backend(&e.to_string())),
        Err(e) => Err(e.into()),
    }
}

/// Every listener's limits, the connection cap sized to the file descriptors
/// ([`server::conn::fd_budget`]) for the engines', the admin and `own` integration listeners.
fn listener_limits(cfg: &AgentConfig, own: usize) -> ListenerLimits {
    let listeners = cfg.engines.len() + usize::from(cfg.agent.admin_listen.is_some()) + own;
    let budget = server::conn::fd_budget(
        cfg.agent.listeners.max_connections,
        listeners,
        cfg.engines.len(),
    );
    if budget.lowered_from.is_some() {
        tracing::warn!("{budget}");
    } else {
        tracing::info!("{budget}");
    }
    ListenerLimits {
        max_connections: budget.max_connections,
        ..cfg.agent.listeners
    }
}

impl Running {
    /// Prepares every engine and acquires every socket (taken over, else bound), before
    /// anything is spawned; closes the inherited sockets nothing claims.
    async fn acquire_sockets(
        &self,
        cfg: &AgentConfig,
        own: Vec<(&'static dyn Integration, Listen)>,
        startup: &mut Startup,
    ) -> Result<Sockets, AgentError> {
        let wait = startup.wait_for_ports;
        let mut engines = Vec::new();
        for (i, spec) in cfg.engines.iter().enumerate() {
            let p = self.prepare(spec)?;
            // The file and the key, as check-config names them.
            let what = format!(
                "{}: {}engine {}'s /status",
                cfg.source,
                cfg.engine_error(i, "mgmt_port", "").place,
                spec.name
            );
            let socket = acquire(spec.mgmt_listen, &mut startup.inherited, wait, &what).await?;
            engines.push((p, socket));
        }
        let admin = match cfg.agent.admin_listen {
            Some(addr) => {
                let what = format!("{}: [agent] admin_listen: admin listener", cfg.source);
                let socket = acquire(addr, &mut startup.inherited, wait, &what).await?;
                let access =
                    AdminAccess::load(&cfg.agent.admin_auth).map_err(AgentError::Config)?;
                Some((addr, socket, Arc::new(access)))
            }
            None => None,
        };
        let mut own_sockets = Vec::new();
        for (i, listen) in own {
            let what = format!("{}: {}: {}", cfg.source, listen.key, listen.label);
            let socket = acquire(listen.addr, &mut startup.inherited, wait, &what).await?;
            own_sockets.push((i, listen, socket));
        }
        for (addr, origin) in startup.inherited.close_unclaimed() {
            tracing::info!(
                "closed the socket on {addr} from {}: no engine or listener is configured there now",
                origin.as_str()
            );
        }
        Ok(Sockets {
            engines,
            admin,
            own: own_sockets,
        })
    }

    /// Removes the temporary state files that crashes left in the state directory.
    fn remove_stale_writes(&self) {
        let Some(d) = &self.state_dir else { return };
        let Some(place) = d.state() else { return };
        match statefile::remove_stale(place) {
            Ok(r) if r.files == 0 => {}
            Ok(r) => tracing::info!(
                "removed {} temporary state file(s), {} bytes, left in {} by writes cut short",
                r.files,
                r.bytes,
                d.path().display()
            ),
            Err(e) => tracing::warn!("{e}: temporary state files a crash left stay"),
        }
    }

    /// Starts each engine on its socket, from its saved state when `found` (the state file)
    /// has it, and publishes the roster.
    fn launch_engines(
        &mut self,
        ready: Vec<(Prepared, std::net::TcpListener)>,
        mut found: statefile::Found,
    ) -> Result<(), AgentError> {
        for (p, socket) in ready {
            let restored = found.take(&p.spec.name, &p.spec.engine_url());
            let run = self.launch(p, socket, restored.map(|s| (s, Carry::ALL)), true)?;
            self.engines.push(run);
        }
        let left = found.left();
        if !left.is_empty() {
            tracing::info!(
                "the state file also holds {} (not configured now): not used",
                left.join(", ")
            );
        }
        self.publish_roster();
        Ok(())
    }

    /// Serves the admin listener over the engines started, and the integrations' own.
    fn serve_listeners(
        &mut self,
        admin: Option<(SocketAddr, std::net::TcpListener, Arc<AdminAccess>)>,
        own: Vec<(&'static dyn Integration, Listen, std::net::TcpListener)>,
    ) -> Result<(), AgentError> {
        if let Some((addr, socket, access)) = admin {
            let engines = self.engines.iter().map(|e| e.state.clone()).collect();
            let scheme = if access.tls.is_some() {
                "https"
            } else {
                "http"
            };
            let auth = access.describe();
            let admin = self.launch_admin(addr, socket, engines, access)?;
            tracing::info!(
                "admin listener on {scheme}://{} (/metrics, /status/detail, /qos: {auth}; /healthz: open)",
                admin.bound
            );
            self.admin = Some(admin);
        }
        for (i, listen, socket) in own {
            let run = self.launch_integration(i, &listen, socket)?;
            self.integration_listeners.push(run);
        }
        Ok(())
    }
}
