//! `run`: wires the sampler, one monitor per engine and the listeners together, tells systemd
//! when it is ready, and runs until SIGTERM or SIGINT; SIGHUP re-reads the config
//! ([`reload`]).
//!
//! Each engine runs as a unit of its own (probe tasks, listener, cancellation), so a reload can
//! add, remove or restart one engine without touching the others' verdict state.

pub(crate) mod account;
mod handover;
mod holders;
mod launch;
mod lifecycle;
mod listeners;
pub mod preflight;
mod reload;
mod start;

use launch::{EngineRun, Prepared};
pub use lifecycle::{AfterHandover, Reloader, RunOptions, run};
use listeners::ListenerRun;
pub use reload::ReloadSummary;
pub use start::{Startup, start};

use crate::config::{AgentConfig, AgentSettings, ListenerLimits};
use crate::continuity::handover::Predecessor;
use crate::continuity::statefile::Persister;
use crate::continuity::{self, StateDir};
use crate::driver::fault_levels::{self, FaultTable, TableError};
use crate::integrations::Started;
use crate::monitor::Monitor;
use crate::pod_resources::{self, PodLabels};
use crate::sampler::{Sampler, SamplerConfig, Shared, StartError};
use std::sync::Arc;
use std::time::Duration;

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

/// The engines being monitored now, shared with the systemd status line and the
/// integrations' listeners.
pub(crate) type Roster = crate::integrations::Engines;

/// A started agent: listeners bound, tasks running.
pub struct Running {
    sampler: Sampler,
    shared: Arc<Shared>,
    cfg: AgentConfig,
    engines: Vec<EngineRun>,
    admin: Option<ListenerRun>,
    /// The integrations' own listeners (HAProxy's agent check), in the registry's order.
    integration_listeners: Vec<ListenerRun>,
    roster: Roster,
    liveness_cfg: Arc<LivenessCfg>,
    /// Connection limits of every listener, the cap sized at start ([`crate::server::conn::fd_budget`]).
    limits: ListenerLimits,
    /// What the integrations run for the whole agent (the Kubernetes API mode's client),
    /// fixed at start.
    started: Vec<Arc<dyn Started>>,
    /// Where the state file and the handover socket live (`None`: nothing survives).
    state_dir: Option<StateDir>,
    /// Writes the state file on every change.
    persister: Option<Persister>,
    /// The agent this one took over from, until this one serves.
    predecessor: Option<Predecessor>,
    /// Who holds each NPU (`[agent] pod_resources_socket`), and the poll that keeps it; `None`:
    /// no pod labels.
    pods: Option<PodsPoll>,
}

/// The pod labels in force and the task that polls the kubelet for them.
struct PodsPoll {
    labels: Arc<PodLabels>,
    task: tokio::task::JoinHandle<()>,
    cancel: tokio_util::sync::CancellationToken,
}

impl PodsPoll {
    /// Starts polling as `[agent]` says, over the NPUs of `sampler`; `None` when off.
    fn start(agent: &AgentSettings, sampler: &Sampler) -> Option<PodsPoll> {
        let settings = agent.pod_resources.as_ref()?;
        let npus = sampler
            .devices()
            .iter()
            .map(|d| (d.info.id, d.info.phy_id))
            .collect();
        let poll = pod_resources::task::Poll::new(settings, npus);
        tracing::info!(
            "pod labels from the kubelet's PodResources API at {} every {}",
            poll.socket.display(),
            humantime::format_duration(poll.period)
        );
        let labels = Arc::new(PodLabels::default());
        let cancel = tokio_util::sync::CancellationToken::new();
        let task = tokio::spawn(pod_resources::task::run(
            poll,
            labels.clone(),
            cancel.clone(),
        ));
        Some(PodsPoll {
            labels,
            task,
            cancel,
        })
    }

    async fn stop(self) {
        self.cancel.cancel();
        let _ = self.task.await;
    }
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

fn longest_window(cfg: &AgentConfig) -> Duration {
    cfg.engines
        .iter()
        .map(|e| e.timing.window)
        .max()
        .unwrap_or(Duration::from_secs(5))
}

impl Running {
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
    pub(crate) fn roster(&self) -> Roster {
        self.roster.clone()
    }

    /// State shared with the sampler threads.
    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// The one-line summary for systemd's `STATUS=`.
    pub(crate) fn summary(&self) -> String {
        summary(&self.roster, &self.shared)
    }

    fn publish_roster(&self) {
        let list: Vec<Arc<Monitor>> = self.engines.iter().map(|e| e.state.clone()).collect();
        *self.roster.write().unwrap_or_else(|p| p.into_inner()) = list;
    }

    /// Starts writing the state file on every change (with a state directory).
    fn start_persister(&mut self) {
        let Some(place) = self.state_dir.as_ref().and_then(|d| d.state()) else {
            return;
        };
        let roster = self.roster.clone();
        self.persister = Some(Persister::start(
            place.clone(),
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

    /// Every listener: the engines', the admin listener, the integrations' own.
    fn listeners(&self) -> impl Iterator<Item = &ListenerRun> {
        self.engines
            .iter()
            .map(|e| &e.listener)
            .chain(self.admin.iter())
            .chain(self.integration_listeners.iter())
    }

    /// Every listening socket, named as systemd's file-descriptor store keeps it.
    pub(crate) fn sockets(&self) -> Vec<(String, std::os::fd::BorrowedFd<'_>)> {
        use std::os::fd::AsFd;
        self.listeners()
            .map(|l| (continuity::sockets::fd_name(l.bound), l.socket.as_fd()))
            .collect()
    }

    /// Stops the listeners and probes (in-flight requests get [`DRAIN`]), writes the state
    /// file a last time, then stops the sampler (watch children killed and reaped).
    pub(crate) async fn stop(mut self) {
        let persister = self.persister.take();
        let Running {
            sampler,
            engines,
            admin,
            integration_listeners,
            pods,
            ..
        } = self;
        let mut stops: Vec<std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>> =
            engines
                .into_iter()
                .map(|e| Box::pin(e.stop()) as _)
                .collect();
        for l in admin.into_iter().chain(integration_listeners) {
            stops.push(Box::pin(l.stop()));
        }
        if let Some(p) = pods {
            stops.push(Box::pin(p.stop()));
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
    let path = p.path();
    match p.finish().await {
        Ok(()) => tracing::info!("state written to {}", path.display()),
        Err(e) => tracing::error!("{e}"),
    }
}

/// `2 engines: prefill-0 normal, decode-0 initial; 8 NPUs: 8 dcmi` (the systemd status line).
pub(crate) fn summary(roster: &Roster, shared: &Shared) -> String {
    let engines = roster.read().unwrap_or_else(|p| p.into_inner());
    let verdicts: Vec<String> = engines
        .iter()
        .map(|e| format!("{} {}", e.spec().name, e.peek_status().as_str()))
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

/// Where the driver pieces are and how far to trust them, as `[agent]` says.
pub(crate) fn driver_config(agent: &AgentSettings) -> crate::driver::DriverConfig {
    crate::driver::DriverConfig {
        dcmi_lib: agent.dcmi_lib.clone(),
        npu_smi: agent.npu_smi.clone(),
        backend: agent.backend,
        check_owner: !agent.dcmi_no_owner_check,
        watch_delay_s: agent.npu_smi_delay,
        ..crate::driver::DriverConfig::default()
    }
}

/// The sampler `run` starts for `cfg` (`check-config` starts the same to find the NPUs).
pub(crate) fn sampler_config(cfg: &AgentConfig) -> SamplerConfig {
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
pub(crate) fn npu_ids(sampler: &Sampler) -> Option<Vec<u32>> {
    let ids: Vec<u32> = sampler.devices().iter().map(|d| d.info.id).collect();
    (!ids.is_empty()).then_some(ids)
}

/// `[agent] fault_code_file`'s table (see [`FaultTable::configured`]), read on a blocking
/// thread: the read is bounded and never waits on a FIFO, but it is file I/O all the same,
/// and the runtime's threads serve the listeners and the signal loop.
pub(crate) async fn read_fault_table(agent: &AgentSettings) -> Result<FaultTable, TableError> {
    let file = agent.fault_code_file.clone();
    let named = file.clone();
    tokio::task::spawn_blocking(move || FaultTable::configured(file.as_deref()))
        .await
        .unwrap_or_else(|e| {
            Err(TableError::Read {
                path: named.unwrap_or_else(|| fault_levels::DEFAULT_PATH.into()),
                why: format!("the read did not finish: {e}"),
            })
        })
}

/// Puts the table [`read_fault_table`] read in force. A table that cannot be read never
/// stops the agent (check-config refuses it): at start the built-in table is used, on a
/// reload the table in force is kept; either way the log names the file and says why.
pub(crate) fn apply_fault_table(
    table: Result<FaultTable, TableError>,
    shared: &Shared,
    reload: bool,
) {
    match table {
        Ok(t) => {
            tracing::info!("fault-code levels from {}", t.describe());
            shared.fault_levels.set_table(t);
        }
        Err(e) if reload => tracing::warn!(
            "[agent] fault_code_file: {e}; the levels in force, read before from {}, are kept",
            shared.fault_levels.table().origin
        ),
        Err(e) => tracing::error!(
            "[agent] fault_code_file: {e}; using the {} table instead",
            shared.fault_levels.table().origin
        ),
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
