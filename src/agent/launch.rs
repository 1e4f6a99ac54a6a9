//! One engine's unit: what it needs before it starts ([`Prepared`], built without side
//! effects so a reload can be rejected before anything changes), its tasks and listener
//! ([`EngineRun`]), and the agent's listeners started from them (an engine's mgmt listener,
//! the admin listener, HAProxy's agent check).

use super::listeners::{ListenerRun, Service};
use super::{AgentError, DRAIN, Running, longest_window};
use crate::integrations::{Integration, Listen};

use crate::config::EngineSpec;
use crate::monitor::saved::{Carry, EngineState};
use crate::monitor::{self, Monitor};
use crate::probe::http::EngineClient;
use crate::sampler::Sampler;
use crate::server::{self, AdminView, EngineView, metrics};
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// Everything an engine needs before it starts, built without side effects so a reload can
/// be rejected before anything changes.
pub(super) struct Prepared {
    pub(super) spec: EngineSpec,
    pub(super) devices: Vec<u16>,
    pub(super) client: EngineClient,
    pub(super) tls: Option<Arc<rustls::ServerConfig>>,
}

/// One monitored engine.
pub(super) struct EngineRun {
    pub(super) state: Arc<Monitor>,
    pub(super) listener: ListenerRun,
    pub(super) tasks: JoinSet<()>,
    pub(super) cancel: CancellationToken,
}

impl EngineRun {
    pub(super) async fn stop(mut self) {
        self.cancel.cancel();
        let name = self.state.spec().name.clone();
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

/// Ring indices of an engine's NPUs (all NPUs when none are named).
pub(super) fn engine_devices(spec: &EngineSpec, sampler: &Sampler) -> Result<Vec<u16>, AgentError> {
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

impl Running {
    pub(super) fn prepare(&self, spec: &EngineSpec) -> Result<Prepared, AgentError> {
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
    pub(super) fn launch(
        &self,
        p: Prepared,
        socket: std::net::TcpListener,
        restored: Option<(EngineState, Carry)>,
        resuming: bool,
    ) -> Result<EngineRun, AgentError> {
        let spec = &p.spec;
        let shared = &self.shared;
        let mut state = Monitor::new(spec.clone(), p.devices.clone());
        crate::integrations::kubernetes::brake::hold(&mut state, &self.cfg.agent);
        let state = Arc::new(state);
        crate::integrations::equip(&state);
        let cancel = CancellationToken::new();
        let tasks = self.spawn_engine_tasks(&p, &state, restored.as_ref(), resuming, &cancel);
        let scope = Arc::new(metrics::Exposition {
            shared: shared.clone(),
            engines: vec![state.clone()],
            devices: p.devices.clone(),
            window: spec.timing.window,
            npu_exporter_names: self.cfg.agent.npu_exporter_names,
            pods: self.pod_labels(),
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

    /// The engine's tasks, from `restored` when it applies: the monitor's own loops (one per
    /// source of evidence, [`monitor::evidence::SOURCES`]), the journal's observer, and each
    /// started integration's task.
    fn spawn_engine_tasks(
        &self,
        p: &Prepared,
        state: &Arc<Monitor>,
        restored: Option<&(EngineState, Carry)>,
        resuming: bool,
        cancel: &CancellationToken,
    ) -> JoinSet<()> {
        let mut saved_start = None;
        if let Some((saved, carry)) = restored {
            state.restore(saved, *carry);
            if resuming {
                tracing::info!(
                    engine = %p.spec.name,
                    "resuming from the saved state: {}",
                    resumed(state)
                );
            }
            // The saved state is this engine process's only if it did not restart while no
            // agent watched it: the identity source checks.
            saved_start = saved.engine_started_at.filter(|_| carry.health);
        }
        let with = monitor::evidence::Loops {
            client: &p.client,
            shared: &self.shared,
            saved_start,
        };
        let mut tasks = state.spawn_loops(&with, cancel);
        tasks.spawn(crate::integrations::observe::run(
            state.clone(),
            cancel.clone(),
        ));
        // The evidence bundles, when `[agent] evidence_dir` is set: after the verdict, never
        // in its way.
        if let Some(w) = crate::bundles::Writer::of(&self.cfg.agent, &self.shared) {
            tasks.spawn(crate::bundles::run(
                state.clone(),
                p.client.clone(),
                w,
                cancel.clone(),
            ));
        }
        // The engine's NPUs as the driver named them (its ring indices into the sampler's).
        let npus: Vec<crate::integrations::seam::EngineNpu> = p
            .devices
            .iter()
            .filter_map(|&i| self.shared.devices.get(usize::from(i)))
            .map(|d| crate::integrations::seam::EngineNpu {
                logic_id: d.info.id,
                phy_id: d.info.phy_id,
            })
            .collect();
        for started in &self.started {
            if let Some(task) = started.engine_task(state.clone(), &npus, cancel.clone()) {
                tasks.spawn(task);
            }
        }
        tasks
    }

    /// The admin server over the current engines, on `socket`.
    pub(super) fn launch_admin(
        &self,
        configured: SocketAddr,
        socket: std::net::TcpListener,
        engines: Vec<Arc<Monitor>>,
        access: Arc<server::auth::AdminAccess>,
    ) -> Result<ListenerRun, AgentError> {
        let scope = Arc::new(metrics::Exposition {
            shared: self.shared.clone(),
            engines,
            devices: (0..self.shared.devices.len() as u16).collect(),
            window: longest_window(&self.cfg),
            npu_exporter_names: self.cfg.agent.npu_exporter_names,
            pods: self.pod_labels(),
        });
        let tls = access.tls.clone();
        let router = server::admin_router(
            AdminView {
                metrics: scope,
                stuck_after: self.cfg.agent.sampler_stuck_after,
                hub: Arc::default(),
                node: crate::view::node_name(&self.cfg.agent).into(),
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

    /// The pod labels the metrics carry, when they are on.
    fn pod_labels(&self) -> Option<Arc<crate::pod_resources::PodLabels>> {
        self.pods.as_ref().map(|p| p.labels.clone())
    }

    /// `i`'s own listener (`listen`) over the engines of the moment, on `socket`.
    pub(super) fn launch_integration(
        &self,
        i: &'static dyn Integration,
        listen: &Listen,
        socket: std::net::TcpListener,
    ) -> Result<ListenerRun, AgentError> {
        let run = ListenerRun::start(
            listen.addr,
            socket,
            Service::Integration(i, self.roster.clone()),
            self.limits,
            listen.name.to_owned(),
        )
        .map_err(|e| AgentError::Runtime(format!("{}: {e}", listen.label)))?;
        tracing::info!("{} on {} ({})", listen.label, run.bound, listen.hint);
        Ok(run)
    }
}

/// One line on the state an engine resumes from, for the log: the one verdict
/// ([`Monitor::verdict`]) of the monitor as restored, before any loop runs.
fn resumed(m: &Monitor) -> String {
    format!(
        "{}, virtual inference {}{}, failure count {}, QoS level {}",
        m.verdict().status.as_str(),
        m.vi().phase().as_str(),
        if m.vi().warmup_done() {
            " (warmed up)"
        } else {
            ""
        },
        m.vi().failure_count(),
        m.qos().level().as_str()
    )
}
