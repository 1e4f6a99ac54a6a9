//! `run`: wires the sampler, one monitor per engine and the listeners together, and runs
//! until SIGTERM or SIGINT.

use crate::config::{AgentConfig, EngineSpec};
use crate::engine::{self, EngineState, RingPeaks};
use crate::probe::http::EngineClient;
use crate::sampler::{Sampler, SamplerConfig, StartError};
use crate::server::{self, AdminView, EngineView, metrics};
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

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

/// A started agent: listeners bound, tasks running.
pub struct Running {
    /// The sampler (owns the driver threads).
    pub sampler: Sampler,
    /// Every engine's state.
    pub engines: Vec<Arc<EngineState>>,
    /// Addresses actually bound: engine mgmt listeners, then the admin listener if any.
    pub bound: Vec<std::net::SocketAddr>,
    tasks: JoinSet<()>,
    cancel: CancellationToken,
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

/// Starts everything inside the current tokio runtime.
pub async fn start(cfg: AgentConfig) -> Result<Running, AgentError> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let longest_window = cfg
        .engines
        .iter()
        .map(|e| e.timing.window)
        .max()
        .unwrap_or(Duration::from_secs(5));
    let sampler_cfg = SamplerConfig {
        period: cfg.agent.sample_period,
        retention: (longest_window + Duration::from_secs(5)).max(Duration::from_secs(30)),
        realtime: cfg.agent.sampler_realtime,
        call_deadline: cfg.agent.driver_call_deadline,
        ..SamplerConfig::default()
    };
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
    let shared = sampler.shared().clone();
    let cancel = CancellationToken::new();
    let mut tasks = JoinSet::new();
    let mut engines = Vec::new();
    let mut bound = Vec::new();
    let mut listeners = Vec::new();
    for spec in &cfg.engines {
        let devices = engine_devices(spec, &sampler)?;
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
        let listener = server::bind(spec.mgmt_listen)
            .await
            .map_err(|e| AgentError::Runtime(format!("engine {}: {e}", spec.name)))?;
        bound.push(listener.local_addr().unwrap_or(spec.mgmt_listen));
        let state = Arc::new(EngineState::new(spec.clone(), devices.clone()));
        engines.push(state.clone());
        listeners.push((state, client, devices, listener, tls));
    }
    for (state, client, devices, listener, tls) in listeners {
        let spec = &state.spec;
        let scope = Arc::new(metrics::Scope {
            shared: shared.clone(),
            engines: vec![state.clone()],
            devices: devices.clone(),
            window: spec.timing.window,
            period: cfg.agent.sample_period,
        });
        tasks.spawn(engine::health_task(
            state.clone(),
            client.health(),
            cancel.clone(),
        ));
        let peaks = RingPeaks {
            shared: shared.clone(),
            devices: devices.clone(),
        };
        let cube_shared = shared.clone();
        let cube_devices = devices.clone();
        let cube = move || {
            cube_devices
                .iter()
                .map(|&i| {
                    let d = &cube_shared.devices[usize::from(i)];
                    (d.info.id, d.source().backend())
                })
                .collect()
        };
        tasks.spawn(engine::virtual_inference_task(
            state.clone(),
            client.prober(spec),
            peaks,
            engine::Signals {
                state: state.clone(),
                metrics: client.metrics(),
            },
            cube,
            cancel.clone(),
        ));
        tasks.spawn(engine::qos_task(
            state.clone(),
            client.metrics(),
            cancel.clone(),
        ));
        let scheme = if tls.is_some() { "https" } else { "http" };
        tracing::info!(
            engine = %spec.name,
            "serving {scheme}://{}/status for the engine at {}",
            listener.local_addr().map_or_else(|_| spec.mgmt_listen.to_string(), |a| a.to_string()),
            client.base()
        );
        let router = server::engine_router(EngineView {
            engine: state.clone(),
            metrics: scope,
        });
        tasks.spawn(server::serve(listener, router, tls, cancel.clone()));
    }
    if let Some(addr) = cfg.agent.admin_listen {
        let listener = server::bind(addr)
            .await
            .map_err(|e| AgentError::Runtime(format!("admin listener: {e}")))?;
        bound.push(listener.local_addr().unwrap_or(addr));
        let scope = Arc::new(metrics::Scope {
            shared: shared.clone(),
            engines: engines.clone(),
            devices: (0..shared.devices.len() as u16).collect(),
            window: longest_window,
            period: cfg.agent.sample_period,
        });
        tracing::info!("admin listener on http://{addr} (/metrics, /status/detail, /healthz)");
        tasks.spawn(server::serve(
            listener,
            server::admin_router(AdminView { metrics: scope }),
            None,
            cancel.clone(),
        ));
    }
    Ok(Running {
        sampler,
        engines,
        bound,
        tasks,
        cancel,
    })
}

impl Running {
    /// Stops the listeners and tasks, then the sampler.
    pub async fn stop(mut self) {
        self.cancel.cancel();
        let drain = async { while self.tasks.join_next().await.is_some() {} };
        if tokio::time::timeout(Duration::from_secs(5), drain)
            .await
            .is_err()
        {
            tracing::warn!("some tasks did not stop within 5s");
            self.tasks.abort_all();
        }
        let sampler = self.sampler;
        let _ = tokio::task::spawn_blocking(move || sampler.shutdown()).await;
    }
}

/// Runs until SIGTERM or SIGINT.
pub async fn run(cfg: AgentConfig) -> Result<(), AgentError> {
    let running = start(cfg).await?;
    wait_for_signal().await;
    tracing::info!("shutting down");
    running.stop().await;
    Ok(())
}

async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::warn!("cannot install signal handlers; stop with SIGKILL");
        std::future::pending::<()>().await;
        return;
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("received SIGTERM"),
        _ = int.recv() => tracing::info!("received SIGINT"),
    }
}
