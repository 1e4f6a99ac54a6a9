//! `run`: wires the sampler, one monitor per engine and the listeners together, tells systemd
//! when it is ready, and runs until SIGTERM or SIGINT; SIGHUP re-reads the config
//! ([`reload`]).
//!
//! Each engine runs as a unit of its own (probe tasks, listener, cancellation), so a reload can
//! add, remove or restart one engine without touching the others' verdict state.

mod handover;
pub mod preflight;
mod reload;

pub use reload::ReloadSummary;

use crate::config::{AgentConfig, AgentSettings, EngineSpec, ListenerLimits};
use crate::continuity::handover::Predecessor;
use crate::continuity::sockets::{Inherited, Origin};
use crate::continuity::statefile::{self, Persister};
use crate::continuity::{self, StateDir};
use crate::monitor::saved::{Carry, EngineState};
use crate::monitor::{self, Monitor};
use crate::probe::http::EngineClient;
use crate::sampler::{Sampler, SamplerConfig, Shared, StartError};
use crate::server::{self, AdminView, EngineView, metrics};
use crate::service::signals::{Signalled, Signals};
use crate::service::systemd::{Probe, Systemd};
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// Longest wait for an engine's tasks (in-flight requests included) to finish on stop.
const DRAIN: Duration = Duration::from_secs(5);

/// Why `run` stopped with an error, with the exit code it maps to.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// Bad configuration (exit 2).
    #[error("{0}")]
    Config(String),
    /// The sampler could not start (exit 3 when no backend, else 2).
    #[error(transparent)]
    Sampler(#[from] StartError),
    /// Anything else at run time (exit 1).
    #[error("{0}")]
    Runtime(String),
}

/// The engines being monitored now, shared with the systemd status line.
pub type Roster = Arc<RwLock<Vec<Arc<Monitor>>>>;

/// What a listener serves.
#[derive(Clone)]
enum Service {
    /// HTTP: an engine's mgmt listener or the admin listener (TLS when set).
    Http {
        router: axum::Router,
        tls: Option<Arc<rustls::ServerConfig>>,
    },
    /// HAProxy's agent check, over the engines of the moment.
    AgentCheck(Roster),
}

/// A listening socket and the server task on it.
struct ListenerRun {
    /// Address from the config (reused on reload when unchanged).
    configured: SocketAddr,
    /// Address actually bound.
    bound: SocketAddr,
    /// A duplicate of the socket, so a new server can take it over on reload, and a new
    /// agent on a handover.
    socket: std::net::TcpListener,
    /// What the server needs to start again on the same socket (a handover that failed).
    service: Service,
    limits: ListenerLimits,
    name: String,
    cancel: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl ListenerRun {
    fn start(
        configured: SocketAddr,
        socket: std::net::TcpListener,
        service: Service,
        limits: ListenerLimits,
        name: String,
    ) -> Result<ListenerRun, String> {
        let bound = socket.local_addr().unwrap_or(configured);
        let (cancel, task) = Self::serve(&socket, &service, limits, &name)?;
        Ok(ListenerRun {
            configured,
            bound,
            socket,
            service,
            limits,
            name,
            cancel,
            task,
        })
    }

    fn serve(
        socket: &std::net::TcpListener,
        service: &Service,
        limits: ListenerLimits,
        name: &str,
    ) -> Result<(CancellationToken, tokio::task::JoinHandle<()>), String> {
        let listener = server::listener_on(socket)?;
        let cancel = CancellationToken::new();
        let task = match service {
            Service::Http { router, tls } => tokio::spawn(server::serve(
                listener,
                router.clone(),
                tls.clone(),
                limits,
                name.to_owned(),
                cancel.clone(),
            )),
            Service::AgentCheck(roster) => tokio::spawn(server::agent_check::serve(
                listener,
                roster.clone(),
                limits.max_connections,
                name.to_owned(),
                cancel.clone(),
            )),
        };
        Ok((cancel, task))
    }

    /// Stops accepting at once; requests in flight finish in the background. Connections
    /// arriving now wait in the socket's backlog for whoever accepts next.
    fn pause(&self) {
        self.cancel.cancel();
    }

    /// Accepts again on the same socket (a handover that did not complete).
    fn resume(&mut self) -> Result<(), String> {
        let (cancel, task) = Self::serve(&self.socket, &self.service, self.limits, &self.name)?;
        self.cancel = cancel;
        // The paused server finishes its requests on its own.
        self.task = task;
        Ok(())
    }

    /// Stops accepting and lets in-flight requests finish, for at most [`DRAIN`].
    async fn stop(self) {
        self.cancel.cancel();
        let mut task = self.task;
        if tokio::time::timeout(DRAIN, &mut task).await.is_err() {
            task.abort();
        }
    }
}

/// Everything an engine needs before it starts, built without side effects so a reload can
/// be rejected before anything changes.
struct Prepared {
    spec: EngineSpec,
    devices: Vec<u16>,
    client: EngineClient,
    tls: Option<Arc<rustls::ServerConfig>>,
}

/// One monitored engine.
struct EngineRun {
    state: Arc<Monitor>,
    listener: ListenerRun,
    tasks: JoinSet<()>,
    cancel: CancellationToken,
}

impl EngineRun {
    async fn stop(mut self) {
        self.cancel.cancel();
        let name = self.state.spec.name.clone();
        let drain = async { while self.tasks.join_next().await.is_some() {} };
        let (listener, tasks) =
            tokio::join!(self.listener.stop(), tokio::time::timeout(DRAIN, drain));
        let () = listener;
        if tasks.is_err() {
            tracing::warn!(engine = %name, "some probe tasks did not stop within {DRAIN:?}");
            self.tasks.abort_all();
        }
    }
}

/// A started agent: listeners bound, tasks running.
pub struct Running {
    sampler: Sampler,
    shared: Arc<Shared>,
    cfg: AgentConfig,
    engines: Vec<EngineRun>,
    admin: Option<ListenerRun>,
    /// HAProxy's agent-check listener (`[agent] haproxy_agent_listen`).
    haproxy: Option<ListenerRun>,
    roster: Roster,
    liveness_cfg: Arc<LivenessCfg>,
    /// Connection limits of every listener, the cap sized at start ([`server::conn::fd_budget`]).
    limits: ListenerLimits,
    /// The Kubernetes API mode, when `[agent.kubernetes]` is set (fixed at start).
    kube: Option<Arc<crate::k8s::ApiMode>>,
    /// Where the state file and the handover socket live (`None`: nothing survives).
    state_dir: Option<StateDir>,
    /// Writes the state file on every change.
    persister: Option<Persister>,
    /// The agent this one took over from, until this one serves.
    predecessor: Option<Predecessor>,
}

/// What a start takes over from before it: the state directory, sockets systemd passed
/// back, and a running agent handing over.
pub struct Startup {
    pub state_dir: Option<StateDir>,
    pub inherited: Inherited,
    pub predecessor: Option<Predecessor>,
    /// How long to wait for a port another process holds.
    pub wait_for_ports: Duration,
}

/// What the agent does once it has handed over to a new one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum AfterHandover {
    /// Exit 0 (systemd, or by hand).
    #[default]
    Exit,
    /// Stop everything and wait for SIGTERM (Kubernetes: an exit would restart the
    /// container, which would then take over back).
    Wait,
}

/// How `run` treats the agent's own restarts.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    pub after_handover: AfterHandover,
    /// How long to wait for a port another process holds (an agent that cannot hand over,
    /// such as an older version, during the first rolling update): 0 fails at once.
    pub wait_for_ports: Duration,
}

/// The stuck threshold of the liveness test (changes on reload).
#[derive(Debug)]
struct LivenessCfg(std::sync::Mutex<Duration>);

impl LivenessCfg {
    fn set(&self, stuck_after: Duration) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = stuck_after;
    }

    fn get(&self) -> Duration {
        *self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Ring indices of an engine's NPUs (all NPUs when none are named).
fn engine_devices(spec: &EngineSpec, sampler: &Sampler) -> Result<Vec<u16>, AgentError> {
    if sampler.devices().is_empty() {
        return Ok(Vec::new());
    }
    let Some(ids) = &spec.devices.value else {
        return Ok((0..sampler.devices().len() as u16).collect());
    };
    let mut out = Vec::new();
    for id in ids {
        match sampler.index_of(*id) {
            Some(i) => out.push(i),
            None => {
                let found: Vec<u32> = sampler.devices().iter().map(|d| d.info.id).collect();
                return Err(AgentError::Config(format!(
                    "engine {}: NPU {id} ({}) not found; NPUs found: {found:?}",
                    spec.name, spec.devices.source
                )));
            }
        }
    }
    Ok(out)
}

fn longest_window(cfg: &AgentConfig) -> Duration {
    cfg.engines
        .iter()
        .map(|e| e.timing.window)
        .max()
        .unwrap_or(Duration::from_secs(5))
}

impl Running {
    fn prepare(&self, spec: &EngineSpec) -> Result<Prepared, AgentError> {
        let devices = engine_devices(spec, &self.sampler)?;
        let client = EngineClient::new(spec)
            .map_err(|e| AgentError::Config(format!("engine {}: {e}", spec.name)))?;
        let tls = if spec.mgmt_tls_config.enable_tls {
            Some(
                crate::tls::server_config(&spec.mgmt_tls_config)
                    .map_err(|e| AgentError::Config(format!("engine {}: {e}", spec.name)))?,
            )
        } else {
            None
        };
        Ok(Prepared {
            spec: spec.clone(),
            devices,
            client,
            tls,
        })
    }

    /// Starts an engine's probes and its server on `socket`, from `restored` when a saved
    /// state (or the state of the engine a reload replaces) applies.
    fn launch(
        &self,
        p: Prepared,
        socket: std::net::TcpListener,
        restored: Option<(EngineState, Carry)>,
    ) -> Result<EngineRun, AgentError> {
        let spec = &p.spec;
        let shared = &self.shared;
        let state = Arc::new(Monitor::new(spec.clone(), p.devices.clone()));
        let cancel = CancellationToken::new();
        let mut tasks = JoinSet::new();
        if let Some((saved, carry)) = &restored {
            state.restore(saved, *carry);
            if carry.health
                && let Some(at) = saved.engine_started_at
            {
                // The saved state is this engine process's only if it did not restart
                // while no agent watched it.
                tasks.spawn(monitor::tasks::identity_task(
                    state.clone(),
                    p.client.metrics(),
                    at,
                    cancel.clone(),
                ));
            }
        }
        tasks.spawn(monitor::tasks::health_task(
            state.clone(),
            p.client.health(),
            cancel.clone(),
        ));
        let peaks = monitor::inputs::RingPeaks {
            shared: shared.clone(),
            devices: p.devices.clone(),
        };
        let cube_shared = shared.clone();
        let cube_devices = p.devices.clone();
        let cube = move || {
            cube_devices
                .iter()
                .map(|&i| {
                    let d = &cube_shared.devices[usize::from(i)];
                    (d.info.id, d.source().backend())
                })
                .collect()
        };
        tasks.spawn(monitor::tasks::virtual_inference_task(
            state.clone(),
            p.client.prober(spec),
            peaks.clone(),
            monitor::inputs::ScrapeSignals {
                state: state.clone(),
                metrics: p.client.metrics(),
            },
            cube,
            cancel.clone(),
        ));
        tasks.spawn(monitor::tasks::qos_task(
            state.clone(),
            p.client.metrics(),
            peaks.clone(),
            cancel.clone(),
        ));
        tasks.spawn(crate::actions::observe::run(state.clone(), cancel.clone()));
        if let Some(mode) = &self.kube {
            match &mode.client {
                Ok(client) => {
                    tasks.spawn(crate::k8s::task::run(
                        client.clone(),
                        mode.cfg.clone(),
                        mode.node.clone(),
                        state.clone(),
                        cancel.clone(),
                    ));
                }
                Err(why) => crate::k8s::task::inactive(&state, &mode.cfg, why),
            }
        }
        let scope = Arc::new(metrics::Scope {
            shared: shared.clone(),
            engines: vec![state.clone()],
            devices: p.devices.clone(),
            window: spec.timing.window,
        });
        let router = server::engine_router(EngineView {
            engine: state.clone(),
            metrics: scope,
        });
        let scheme = if p.tls.is_some() { "https" } else { "http" };
        let listener = ListenerRun::start(
            spec.mgmt_listen,
            socket,
            Service::Http { router, tls: p.tls },
            self.limits,
            format!("engine {}", spec.name),
        )
        .map_err(|e| AgentError::Runtime(format!("engine {}: {e}", spec.name)))?;
        tracing::info!(
            engine = %spec.name,
            "serving {scheme}://{}/status for the engine at {}",
            listener.bound,
            p.client.base()
        );
        Ok(EngineRun {
            state,
            listener,
            tasks,
            cancel,
        })
    }

    /// The admin server over the current engines, on `socket`.
    fn launch_admin(
        &self,
        configured: SocketAddr,
        socket: std::net::TcpListener,
        engines: Vec<Arc<Monitor>>,
        access: Arc<server::auth::AdminAccess>,
    ) -> Result<ListenerRun, AgentError> {
        let scope = Arc::new(metrics::Scope {
            shared: self.shared.clone(),
            engines,
            devices: (0..self.shared.devices.len() as u16).collect(),
            window: longest_window(&self.cfg),
        });
        let tls = access.tls.clone();
        let router = server::admin_router(
            AdminView {
                metrics: scope,
                stuck_after: self.cfg.agent.sampler_stuck_after,
                hub: Arc::default(),
            },
            access,
        );
        ListenerRun::start(
            configured,
            socket,
            Service::Http { router, tls },
            self.limits,
            "admin".to_owned(),
        )
        .map_err(|e| AgentError::Runtime(format!("admin listener: {e}")))
    }

    /// HAProxy's agent-check listener over the engines of the moment, on `socket`.
    fn launch_haproxy(
        &self,
        configured: SocketAddr,
        socket: std::net::TcpListener,
    ) -> Result<ListenerRun, AgentError> {
        let run = ListenerRun::start(
            configured,
            socket,
            Service::AgentCheck(self.roster.clone()),
            self.limits,
            "haproxy agent check".to_owned(),
        )
        .map_err(|e| AgentError::Runtime(format!("HAProxy agent-check listener: {e}")))?;
        tracing::info!(
            "HAProxy agent-check listener on {} (agent-send \"<engine name>\\n\")",
            run.bound
        );
        Ok(run)
    }

    /// How much history the ring holds at the current period (its size is fixed at start);
    /// `None` without NPUs.
    fn ring_covers(&self) -> Option<Duration> {
        let devices = u32::try_from(self.shared.devices.len())
            .ok()
            .filter(|&d| d > 0)?;
        let slots = u32::try_from(self.shared.ring.capacity()).unwrap_or(u32::MAX);
        self.sampler.period().checked_mul(slots / devices)
    }

    /// The engines monitored now.
    pub fn roster(&self) -> Roster {
        self.roster.clone()
    }

    /// State shared with the sampler threads.
    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// The one-line summary for systemd's `STATUS=`.
    pub fn summary(&self) -> String {
        summary(&self.roster, &self.shared)
    }

    fn publish_roster(&self) {
        let list: Vec<Arc<Monitor>> = self.engines.iter().map(|e| e.state.clone()).collect();
        *self.roster.write().unwrap_or_else(|p| p.into_inner()) = list;
    }

    /// Starts writing the state file on every change (with a state directory).
    fn start_persister(&mut self) {
        let Some(dir) = &self.state_dir else { return };
        let roster = self.roster.clone();
        self.persister = Some(Persister::start(
            dir.state_file(),
            Box::new(move || {
                roster
                    .read()
                    .unwrap_or_else(|p| p.into_inner())
                    .iter()
                    .map(|m| m.saved())
                    .collect()
            }),
        ));
    }

    /// Stops writing the state file, after writing it one last time.
    async fn finish_persister(&mut self) {
        if let Some(p) = self.persister.take() {
            last_write(p).await;
        }
    }

    /// Every listener: the engines', the admin listener, HAProxy's agent check.
    fn listeners(&self) -> impl Iterator<Item = &ListenerRun> {
        self.engines
            .iter()
            .map(|e| &e.listener)
            .chain(self.admin.iter())
            .chain(self.haproxy.iter())
    }

    /// Every listening socket, named as systemd's file-descriptor store keeps it.
    pub fn sockets(&self) -> Vec<(String, std::os::fd::BorrowedFd<'_>)> {
        use std::os::fd::AsFd;
        self.listeners()
            .map(|l| (continuity::sockets::fd_name(l.bound), l.socket.as_fd()))
            .collect()
    }

    /// Stops the listeners and probes (in-flight requests get [`DRAIN`]), writes the state
    /// file a last time, then stops the sampler (watch children killed and reaped).
    pub async fn stop(mut self) {
        let persister = self.persister.take();
        let Running {
            sampler,
            engines,
            admin,
            haproxy,
            ..
        } = self;
        let mut stops: Vec<std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>> =
            engines
                .into_iter()
                .map(|e| Box::pin(e.stop()) as _)
                .collect();
        for l in admin.into_iter().chain(haproxy) {
            stops.push(Box::pin(l.stop()));
        }
        futures_util::future::join_all(stops).await;
        // After the engines stopped: nothing changes the state any more.
        if let Some(p) = persister {
            last_write(p).await;
        }
        let _ = tokio::task::spawn_blocking(move || sampler.shutdown()).await;
    }
}

/// Stops `p` after its last write, and says how that went.
async fn last_write(p: Persister) {
    let path = p.path().to_owned();
    match p.finish().await {
        Ok(()) => tracing::info!("state written to {}", path.display()),
        Err(e) => tracing::error!("{e}"),
    }
}

/// `2 engines: prefill-0 normal, decode-0 initial; 8 NPUs: 8 dcmi` (the systemd status line).
pub fn summary(roster: &Roster, shared: &Shared) -> String {
    let engines = roster.read().unwrap_or_else(|p| p.into_inner());
    let verdicts: Vec<String> = engines
        .iter()
        .map(|e| format!("{} {}", e.spec.name, e.peek_status().as_str()))
        .collect();
    let mut backends: Vec<(crate::driver::Backend, usize)> = Vec::new();
    for d in &shared.devices {
        let b = d.source().backend();
        match backends.iter_mut().find(|(n, _)| *n == b) {
            Some((_, c)) => *c += 1,
            None => backends.push((b, 1)),
        }
    }
    let npus = if shared.devices.is_empty() {
        "no NPU backend (/status follows /health)".to_owned()
    } else {
        let by: Vec<String> = backends.iter().map(|(b, c)| format!("{c} {b}")).collect();
        format!("{} NPUs: {}", shared.devices.len(), by.join(", "))
    };
    format!(
        "{} engine{}: {}; {npus}",
        engines.len(),
        if engines.len() == 1 { "" } else { "s" },
        if verdicts.is_empty() {
            "none".to_owned()
        } else {
            verdicts.join(", ")
        }
    )
}

/// The sampler `run` starts for `cfg` (`check-config` starts the same to find the NPUs).
pub fn sampler_config(cfg: &AgentConfig) -> SamplerConfig {
    // The live page charts the last 60 s (`view::HISTORY`): keep 5 s more.
    let retention = (longest_window(cfg) + Duration::from_secs(5))
        .max(crate::view::HISTORY + Duration::from_secs(5));
    SamplerConfig {
        period: cfg.agent.sample_period,
        retention,
        realtime: cfg.agent.sampler_realtime,
        call_deadline: cfg.agent.driver_call_deadline,
        fault_period: cfg.agent.fault_period,
        ..SamplerConfig::default()
    }
}

/// The logic ids of the NPUs a sampler monitors; `None` without a backend (nothing to check
/// an engine's NPUs against).
pub fn npu_ids(sampler: &Sampler) -> Option<Vec<u32>> {
    let ids: Vec<u32> = sampler.devices().iter().map(|d| d.info.id).collect();
    (!ids.is_empty()).then_some(ids)
}

/// A listening socket for `addr`: one taken over (systemd, a handing-over agent), else a new
/// one; a port held by another process is waited for up to `wait`.
async fn acquire(
    addr: SocketAddr,
    inherited: &mut Inherited,
    wait: Duration,
    what: &str,
) -> Result<std::net::TcpListener, AgentError> {
    if let Some((socket, origin)) = inherited.take(addr) {
        tracing::info!(
            "{what}: listening on {addr} with the socket from {}",
            origin.as_str()
        );
        return Ok(socket);
    }
    let deadline = tokio::time::Instant::now() + wait;
    let mut said = false;
    loop {
        match server::bind(addr) {
            Ok(s) => return Ok(s),
            Err(e) if e.contains("in use") && tokio::time::Instant::now() < deadline => {
                if !said {
                    tracing::warn!(
                        "{what}: {addr} is held by another process; waiting up to {wait:?} for it (--wait-for-ports)"
                    );
                    said = true;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => {
                let hint = if e.contains("in use") {
                    " (another agent? start this one with the same state directory to take over from it: docs/deploy.md, \"Upgrading and restarting the agent\")".to_owned()
                } else if e.contains("Cannot assign requested address") {
                    format!(" ({} is not an address of this host)", addr.ip())
                } else {
                    String::new()
                };
                return Err(AgentError::Runtime(format!("{what}: {e}{hint}")));
            }
        }
    }
}

/// Puts `[agent] fault_code_file`'s table in force. A table that cannot be read never stops
/// the agent (check-config refuses it): at start the built-in table is used, on a reload the
/// table in force is kept; either way the log says why.
pub(crate) fn apply_fault_table(agent: &AgentSettings, shared: &Shared, reload: bool) {
    match agent.fault_table() {
        Ok(t) => {
            tracing::info!("fault-code levels from {}", t.describe());
            shared.fault_levels.set_table(t);
        }
        Err(e) if reload => tracing::error!(
            "[agent] fault_code_file: {e}; the fault-code levels in force ({}) are kept",
            shared.fault_levels.table().origin
        ),
        Err(e) => tracing::error!(
            "[agent] fault_code_file: {e}; using the {} table instead",
            shared.fault_levels.table().origin
        ),
    }
}

/// Starts everything inside the current tokio runtime, from what `startup` takes over.
pub async fn start(cfg: AgentConfig, mut startup: Startup) -> Result<Running, AgentError> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let sampler_cfg = sampler_config(&cfg);
    let driver = cfg.agent.driver();
    let started = tokio::task::spawn_blocking(move || Sampler::start(&driver, &sampler_cfg))
        .await
        .map_err(|e| AgentError::Runtime(format!("sampler start-up panicked: {e}")))?;
    // Without NPU figures the agent still serves /status from /health (virtual inference is
    // disabled by its AI Cube condition): a crash loop would make Node Manager see refused
    // polls, i.e. abnormal, and kill a healthy engine. Bad settings are still fatal.
    let sampler = match started {
        Ok(s) => s,
        Err(e @ StartError::NoBackend { .. }) => Sampler::without_backend(&e.to_string()),
        Err(e) => return Err(e.into()),
    };
    // The checks check-config makes too, so both give the same error.
    preflight::host(&cfg, npu_ids(&sampler).as_deref())
        .map_err(|e| AgentError::Config(e.to_string()))?;
    apply_fault_table(&cfg.agent, sampler.shared(), false);
    let listeners = cfg.engines.len()
        + usize::from(cfg.agent.admin_listen.is_some())
        + usize::from(cfg.agent.haproxy_agent_listen.is_some());
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
    let limits = ListenerLimits {
        max_connections: budget.max_connections,
        ..cfg.agent.listeners
    };
    let mut running = Running {
        limits,
        shared: sampler.shared().clone(),
        sampler,
        cfg: cfg.clone(),
        engines: Vec::new(),
        admin: None,
        haproxy: None,
        roster: Roster::default(),
        liveness_cfg: Arc::new(LivenessCfg(std::sync::Mutex::new(
            cfg.agent.sampler_stuck_after,
        ))),
        kube: cfg
            .agent
            .kubernetes
            .as_ref()
            .map(crate::k8s::ApiMode::start),
        state_dir: startup.state_dir.clone(),
        persister: None,
        predecessor: None,
    };
    // Everything fallible (devices, clients, TLS, binding) before anything is spawned.
    let wait = startup.wait_for_ports;
    let mut ready = Vec::new();
    for (i, spec) in cfg.engines.iter().enumerate() {
        let p = running.prepare(spec)?;
        // The file and the key, as check-config names them.
        let what = format!(
            "{}: {}engine {}'s /status",
            cfg.source,
            cfg.engine_error(i, "mgmt_port", "").place,
            spec.name
        );
        let socket = acquire(spec.mgmt_listen, &mut startup.inherited, wait, &what).await?;
        ready.push((p, socket));
    }
    let admin_socket = match cfg.agent.admin_listen {
        Some(addr) => Some((
            addr,
            acquire(
                addr,
                &mut startup.inherited,
                wait,
                &format!("{}: [agent] admin_listen: admin listener", cfg.source),
            )
            .await?,
            Arc::new(
                server::auth::AdminAccess::load(&cfg.agent.admin_auth)
                    .map_err(AgentError::Config)?,
            ),
        )),
        None => None,
    };
    let haproxy_socket = match cfg.agent.haproxy_agent_listen {
        Some(addr) => Some((
            addr,
            acquire(
                addr,
                &mut startup.inherited,
                wait,
                &format!(
                    "{}: [agent] haproxy_agent_listen: HAProxy agent-check listener",
                    cfg.source
                ),
            )
            .await?,
        )),
        None => None,
    };
    for (addr, origin) in startup.inherited.close_unclaimed() {
        tracing::info!(
            "closed the socket on {addr} from {}: no engine or listener is configured there now",
            origin.as_str()
        );
    }
    // The agent handing over stops accepting and writes its state now; connections that
    // arrive meanwhile wait in the sockets' backlog.
    if let Some(pred) = startup.predecessor.take() {
        pred.take().await.map_err(|e| {
            AgentError::Runtime(format!(
                "taking over from the running agent (pid {}): {e}",
                pred.pid
            ))
        })?;
        running.predecessor = Some(pred);
    }
    let mut found = match &running.state_dir {
        Some(d) => statefile::load(&d.state_file()),
        None => statefile::Found::none(),
    };
    for (p, socket) in ready {
        let restored = found.take(&p.spec.name, &p.spec.engine_url());
        if let Some(s) = &restored {
            tracing::info!(
                engine = %p.spec.name,
                "resuming from the saved state: {}",
                describe(s, &p.spec)
            );
        }
        let run = running.launch(p, socket, restored.map(|s| (s, Carry::ALL)))?;
        running.engines.push(run);
    }
    let left = found.left();
    if !left.is_empty() {
        tracing::info!(
            "the state file also holds {} (not configured now): not used",
            left.join(", ")
        );
    }
    running.publish_roster();
    if let Some((addr, socket, access)) = admin_socket {
        let engines = running.engines.iter().map(|e| e.state.clone()).collect();
        let (scheme, auth) = (
            if access.tls.is_some() {
                "https"
            } else {
                "http"
            },
            access.describe(),
        );
        let admin = running.launch_admin(addr, socket, engines, access)?;
        tracing::info!(
            "admin listener on {scheme}://{} (/metrics, /status/detail, /qos: {auth}; /healthz: open)",
            admin.bound
        );
        running.admin = Some(admin);
    }
    if let Some((addr, socket)) = haproxy_socket {
        running.haproxy = Some(running.launch_haproxy(addr, socket)?);
    }
    running.start_persister();
    Ok(running)
}

/// One line on a saved state, for the log.
fn describe(s: &EngineState, spec: &EngineSpec) -> String {
    let evicts =
        spec.qos.enabled && spec.qos.eviction && s.qos.level == crate::qos::score::Level::Evict;
    let verdict = monitor::verdict::status(s.health.state, s.vi.abnormal, evicts).as_str();
    let phase = if s.vi.abnormal {
        monitor::vi_state::Phase::Stopped
    } else {
        s.vi.phase
    };
    format!(
        "{verdict}, virtual inference {}{}, failure count {}, QoS level {}",
        phase.as_str(),
        if s.vi.warmup_done { " (warmed up)" } else { "" },
        s.vi.failure_count,
        s.qos.level.as_str()
    )
}

/// Re-reads the configuration for a reload.
pub type Reloader = Box<dyn Fn() -> Result<AgentConfig, String> + Send + Sync>;

/// What `run` takes over at start: the state directory, systemd's sockets, and a running
/// agent (through the state directory's handover socket).
fn startup(cfg: &AgentConfig, opts: &RunOptions) -> Result<Startup, AgentError> {
    let configured = cfg.agent.state_dir.as_deref();
    let state_dir = StateDir::resolve(configured).and_then(|d| match d.create() {
        Ok(()) => Some(d),
        Err(e) => {
            tracing::warn!("{e}: the agent's state will not survive a restart, and no agent can take over from this one");
            None
        }
    });
    match &state_dir {
        Some(d) => tracing::info!(
            "state directory {} ({}): the state survives a restart; a new agent started with it takes over from this one",
            d.path().display(),
            d.from
        ),
        None if configured.is_none() => tracing::warn!(
            "no state directory ([agent] state_dir, or systemd's RuntimeDirectory=): a restart of the agent forgets what it saw, and no agent can take over from this one"
        ),
        None => {}
    }
    let mut inherited = Inherited::from_systemd();
    for r in &inherited.rejected {
        tracing::warn!("{r}: not used");
    }
    if !inherited.is_empty() {
        tracing::info!(
            "{} listening socket(s) passed back by systemd",
            inherited.len()
        );
    }
    let mut predecessor = None;
    if let Some(d) = &state_dir {
        match continuity::handover::connect(&d.handover_socket()) {
            Ok(None) => {}
            Ok(Some((p, sockets))) => {
                tracing::info!(
                    "taking over from the running agent (pid {}, {}): {} listening socket(s)",
                    p.pid,
                    p.agent,
                    sockets.len()
                );
                for (_, socket) in sockets {
                    inherited.add(socket, Origin::Handover);
                }
                predecessor = Some(p);
            }
            // Whatever listens there did not hand over: start as if nothing ran (a port it
            // still holds then fails to bind, with the reason).
            Err(e) => tracing::warn!("no handover: {e}"),
        }
    }
    Ok(Startup {
        state_dir,
        inherited,
        predecessor,
        wait_for_ports: opts.wait_for_ports,
    })
}

/// Runs until SIGTERM or SIGINT; SIGHUP applies `reload()`'s config. systemd is told when
/// the agent is ready, reloading and stopping, and its watchdog is pinged while the sampler
/// lives. A new agent started with the same state directory takes over ([`continuity`]).
pub async fn run(cfg: AgentConfig, reload: Reloader, opts: RunOptions) -> Result<(), AgentError> {
    // Handlers first: a SIGHUP during start-up must not kill the agent.
    let mut signals = Signals::install()
        .map_err(|e| AgentError::Runtime(format!("cannot install signal handlers: {e}")))?;
    let mut systemd = Systemd::from_env();
    // A stop during start-up stops at once; a reload is applied right after start. Signals
    // from before this point (caught since the first line of main) count the same.
    let mut reload_pending = false;
    match signals.early() {
        Some(Signalled::Stop(name)) => {
            tracing::info!("received {name} while starting; not starting");
            return Ok(());
        }
        Some(Signalled::Reload) => reload_pending = true,
        None => {}
    }
    let boot = startup(&cfg, &opts)?;
    let starting = start(cfg, boot);
    tokio::pin!(starting);
    let mut running = loop {
        tokio::select! {
            r = &mut starting => break r?,
            req = signals.next() => match req {
                Signalled::Stop(name) => {
                    tracing::info!("received {name} while starting; not starting");
                    return Ok(());
                }
                Signalled::Reload => reload_pending = true,
            },
        }
    };
    let mut handover = running.after_start().await;
    systemd.store_sockets(&running.sockets());
    let (roster, shared) = (running.roster(), running.shared().clone());
    let status = {
        let (roster, shared) = (roster.clone(), shared.clone());
        Box::new(move || summary(&roster, &shared))
    };
    let liveness = running.liveness_probe();
    systemd.ready(Probe {
        status,
        alive: liveness,
        runtime: tokio::runtime::Handle::current(),
    });
    tracing::info!("ready: {}", running.summary());
    let mut handed_over = false;
    loop {
        let req = if std::mem::take(&mut reload_pending) {
            Signalled::Reload
        } else {
            tokio::select! {
                req = signals.next() => req,
                conn = handover::accept(handover.as_ref()) => {
                    if running.hand_over(conn).await {
                        handed_over = true;
                        break;
                    }
                    continue;
                }
            }
        };
        match req {
            Signalled::Stop(name) => {
                tracing::info!("received {name}; shutting down");
                break;
            }
            Signalled::Reload => {
                tracing::info!("received SIGHUP; reloading the configuration");
                systemd.reloading();
                let before: Vec<String> = running.sockets().into_iter().map(|(n, _)| n).collect();
                let outcome = match reload() {
                    Err(e) => Err(e),
                    Ok(new) => running.reload(new).await,
                };
                // systemd keeps what the agent listens on now, and nothing it closed.
                let now = running.sockets();
                let gone: Vec<String> = before
                    .into_iter()
                    .filter(|n| now.iter().all(|(m, _)| m != n))
                    .collect();
                systemd.forget_sockets(&gone);
                systemd.store_sockets(&now);
                match outcome {
                    Ok(s) if s.failed.is_empty() => {
                        tracing::info!("configuration reloaded: {s}");
                        systemd.reloaded(&running.summary());
                    }
                    Ok(s) => {
                        tracing::error!("configuration reloaded in part: {s}");
                        systemd.reloaded(&format!(
                            "{} (last reload in part: {} did not start)",
                            running.summary(),
                            s.failed.join(", ")
                        ));
                    }
                    Err(e) => {
                        tracing::error!(
                            "configuration rejected, the previous one keeps running: {e}"
                        );
                        systemd.reloaded(&format!(
                            "{} (last reload rejected: {e})",
                            running.summary()
                        ));
                    }
                }
            }
        }
    }
    systemd.stopping();
    if !handed_over && let Some(h) = handover.take() {
        h.remove();
    }
    let stopping = running.stop();
    tokio::pin!(stopping);
    loop {
        tokio::select! {
            _ = &mut stopping => break,
            req = signals.next() => match req {
                // A second stop request: the operator wants out now.
                Signalled::Stop(name) => {
                    tracing::warn!("received {name} again while stopping; exiting now");
                    if let Some(l) = crate::logging::global() {
                        l.flush();
                    }
                    std::process::exit(0);
                }
                Signalled::Reload => tracing::info!("received SIGHUP while stopping; ignored"),
            },
        }
    }
    if handed_over && opts.after_handover == AfterHandover::Wait {
        tracing::info!(
            "handed over; idle until SIGTERM (--after-handover wait: an exit would restart this container)"
        );
        loop {
            match signals.next().await {
                Signalled::Stop(name) => {
                    tracing::info!("received {name}; exiting");
                    break;
                }
                Signalled::Reload => tracing::info!("received SIGHUP after handing over; ignored"),
            }
        }
    }
    tracing::info!("stopped");
    if let Some(l) = crate::logging::global() {
        l.flush();
    }
    Ok(())
}

impl Running {
    /// A liveness check that outlives `self` (for the systemd thread).
    fn liveness_probe(&self) -> Box<dyn Fn() -> Result<(), String> + Send> {
        let shared = self.shared.clone();
        let cfg = self.liveness_cfg.clone();
        Box::new(move || shared.liveness(cfg.get()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(windows: &[&str]) -> AgentConfig {
        let dir = tempfile::tempdir().unwrap();
        let mut text = String::from(
            "[agent]\nsample_period = \"20ms\"\ndriver_call_deadline = \"300ms\"\nfault_period = \"2s\"\n",
        );
        for (i, w) in windows.iter().enumerate() {
            text.push_str(&format!(
                "\n[[engine]]\nname = \"e{i}\"\nengine_type = \"vllm\"\nserved_model_name = \"m\"\nhost = \"127.0.0.1\"\nport = {}\nmgmt_port = {}\n[engine.timing]\nwindow = \"{w}\"\n",
                8000 + i,
                9000 + i
            ));
        }
        let path = dir.path().join("agent.toml");
        std::fs::write(&path, text).unwrap();
        crate::config::file::load(&path).unwrap()
    }

    // The ring keeps the longest engine window and 5 s, and never less than the live page's
    // 60 s chart and 5 s; the sampler's periods are the [agent] keys.
    #[test]
    fn the_sampler_keeps_what_the_longest_window_and_the_live_page_need() {
        let c = config(&["5s", "2m"]);
        assert_eq!(longest_window(&c), Duration::from_secs(120));
        let s = sampler_config(&c);
        assert_eq!(s.retention, Duration::from_secs(125));
        assert_eq!(
            (s.period, s.call_deadline, s.fault_period),
            (
                Duration::from_millis(20),
                Duration::from_millis(300),
                Duration::from_secs(2)
            )
        );
        let short = sampler_config(&config(&["5s"]));
        assert_eq!(
            short.retention,
            crate::view::HISTORY + Duration::from_secs(5)
        );
    }
}
