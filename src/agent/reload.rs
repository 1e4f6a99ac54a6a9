//! SIGHUP: apply a new configuration to the running agent.
//!
//! Engines are matched by name. An engine whose settings are unchanged keeps running
//! untouched: its verdict, failure counts and QoS history survive. A new engine starts; a
//! removed one stops; a changed one restarts with its new settings and keeps its state
//! (a hung engine stays `abnormal`, a warm one is not warmed up again) but for what the
//! change makes meaningless (`monitor::saved::carry` says what). When a
//! new or changed engine keeps the mgmt address of an engine it replaces, the listening
//! socket itself is handed over, so Node Manager's polls are never refused.
//!
//! Everything that can fail (NPU lookup, clients, TLS, binding) is done before anything
//! changes; if any of it fails the reload is rejected and the old configuration keeps
//! running. Driver settings, worker threads and the sampler's scheduling are fixed at
//! start: a change is reported and takes effect at the next restart. The sampling period
//! and the log level apply at once.

use super::{AgentError, EngineRun, Prepared, Running};
use crate::config::{AgentConfig, AgentSettings, EngineSpec};
use crate::driver::fault_levels::{FaultTable, TableError};
use crate::integrations::kubernetes::config::KubernetesConfig;
use crate::integrations::{Integration, Listen, REGISTRY};
use crate::monitor::Monitor;
use crate::monitor::saved::{Carry, EngineState};
use crate::server;
use crate::server::auth::AdminAccess;
use std::collections::HashMap;
use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;

/// What a reload did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ReloadSummary {
    pub added: Vec<String>,
    pub removed: Vec<String>,
    pub changed: Vec<String>,
    pub unchanged: Vec<String>,
    /// `[agent]` keys whose new value waits for a restart.
    pub needs_restart: Vec<&'static str>,
    /// Engines (or `admin listener`) that could not start after the old ones stopped, with why.
    pub failed: Vec<String>,
}

impl fmt::Display for ReloadSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let list = |v: &[String]| {
            if v.is_empty() {
                "none".to_owned()
            } else {
                v.join(", ")
            }
        };
        write!(
            f,
            "added {}; removed {}; restarted {}; untouched {}",
            list(&self.added),
            list(&self.removed),
            list(&self.changed),
            list(&self.unchanged)
        )?;
        if !self.failed.is_empty() {
            write!(f, "; FAILED to start: {}", self.failed.join("; "))?;
        }
        if !self.needs_restart.is_empty() {
            write!(
                f,
                "; [agent] {} change(s) take effect at the next restart",
                self.needs_restart.join(", ")
            )?;
        }
        Ok(())
    }
}

/// `[agent]` keys that cannot change while running.
fn restart_only(old: &AgentSettings, new: &AgentSettings) -> Vec<&'static str> {
    let mut out = Vec::new();
    let mut check = |name, differs: bool| {
        if differs {
            out.push(name);
        }
    };
    check("dcmi_lib", old.dcmi_lib != new.dcmi_lib);
    check("npu_smi", old.npu_smi != new.npu_smi);
    check("backend", old.backend != new.backend);
    check(
        "dcmi_no_owner_check",
        old.dcmi_no_owner_check != new.dcmi_no_owner_check,
    );
    check("npu_smi_delay", old.npu_smi_delay != new.npu_smi_delay);
    check("worker_threads", old.worker_threads != new.worker_threads);
    check(
        "sampler_realtime",
        old.sampler_realtime != new.sampler_realtime,
    );
    check(
        "driver_call_deadline",
        old.driver_call_deadline != new.driver_call_deadline,
    );
    check("fault_period", old.fault_period != new.fault_period);
    check(
        "max_connections",
        old.listeners.max_connections != new.listeners.max_connections,
    );
    check(
        "header_read_timeout",
        old.listeners.header_read_timeout != new.listeners.header_read_timeout,
    );
    check(
        "idle_timeout",
        old.listeners.idle_timeout != new.listeners.idle_timeout,
    );
    check(
        "stall_timeout",
        old.listeners.stall_timeout != new.listeners.stall_timeout,
    );
    check(
        "kubernetes",
        KubernetesConfig::of(old) != KubernetesConfig::of(new),
    );
    check("state_dir", old.state_dir != new.state_dir);
    check(
        "npu_exporter_names",
        old.npu_exporter_names != new.npu_exporter_names,
    );
    check("pod_resources", old.pod_resources != new.pod_resources);
    out
}

/// `new` with the start-only settings of `running` (those [`restart_only`] names).
fn keep_start_only(running: &AgentSettings, new: &AgentSettings) -> AgentSettings {
    AgentSettings {
        dcmi_lib: running.dcmi_lib.clone(),
        npu_smi: running.npu_smi.clone(),
        backend: running.backend,
        dcmi_no_owner_check: running.dcmi_no_owner_check,
        npu_smi_delay: running.npu_smi_delay,
        worker_threads: running.worker_threads,
        sampler_realtime: running.sampler_realtime,
        driver_call_deadline: running.driver_call_deadline,
        fault_period: running.fault_period,
        listeners: running.listeners,
        // The integrations' agent-wide tables (`[agent.kubernetes]`): start-only.
        tables: running.tables.clone(),
        state_dir: running.state_dir.clone(),
        npu_exporter_names: running.npu_exporter_names,
        pod_resources: running.pod_resources.clone(),
        ..new.clone()
    }
}

/// Whether two engine specs are the same settings, including what was read from the files
/// they name (`env.json`'s document).
fn same(a: &EngineSpec, b: &EngineSpec) -> bool {
    a == b
}

/// One engine of the new configuration, matched by name with the running ones.
#[derive(Debug, Clone, PartialEq)]
struct Step {
    spec: EngineSpec,
    /// Its index among the running engines, if one has its name.
    old: Option<usize>,
    /// It starts (new) or restarts (changed); else it keeps running untouched.
    restart: bool,
}

/// The reload's plan: each engine of `new`, matched by name with `running` (whose specs are
/// given in their order).
fn plan(running: &[&EngineSpec], new: &[EngineSpec]) -> Vec<Step> {
    new.iter()
        .map(|spec| {
            let old = running.iter().position(|r| r.name == spec.name);
            Step {
                spec: spec.clone(),
                old,
                restart: old.is_none_or(|i| !same(running[i], spec)),
            }
        })
        .collect()
}

/// The running engines a plan keeps untouched (their indices).
fn kept(plan: &[Step]) -> Vec<usize> {
    plan.iter()
        .filter(|s| !s.restart)
        .filter_map(|s| s.old)
        .collect()
}

/// What the prepare phase readied (everything that can fail); nothing of it runs yet.
struct Ready {
    /// For each step of the plan, in order: what a new or changed engine starts with.
    engines: Vec<Option<(Prepared, std::net::TcpListener)>>,
    admin: Option<(SocketAddr, std::net::TcpListener, Arc<AdminAccess>)>,
    own: OwnChanges,
}

/// The engines sorted by the plan, once committed: the ones kept running, the ones that
/// start (with the monitors of the changed ones, whose state carries over), the ones that stop.
#[derive(Default)]
struct Sorted {
    kept: Vec<EngineRun>,
    launches: Vec<(Prepared, std::net::TcpListener)>,
    replaced: HashMap<String, Arc<Monitor>>,
    retired: Vec<EngineRun>,
}

impl Running {
    /// Applies `new`; on error nothing changed. Its phases: check and prepare (all that can
    /// fail), then sort the engines and stop those that go, apply the agent's settings, start
    /// the new and changed engines, and restart the listeners that list them.
    pub(crate) async fn reload(&mut self, new: AgentConfig) -> Result<ReloadSummary, String> {
        let mut summary = ReloadSummary {
            needs_restart: restart_only(&self.cfg.agent, &new.agent),
            ..ReloadSummary::default()
        };
        self.check(&new)?;
        // Read before anything changes, off the runtime's threads; a bad table does not
        // reject the reload, it keeps the one in force.
        let table = super::read_fault_table(&new.agent).await;
        let running: Vec<&EngineSpec> = self.engines.iter().map(|e| e.state.spec()).collect();
        let plan = plan(&running, &new.engines);
        let ready = self.prepare_reload(&plan, &new)?;
        // Commit: nothing below fails for a configuration reason.
        let sorted = self.sort(plan, ready.engines, &mut summary);
        // Stop what goes away first, so a restarted engine does not probe twice.
        let stops: Vec<_> = sorted.retired.into_iter().map(EngineRun::stop).collect();
        futures_util::future::join_all(stops).await;
        let old_admin = self.admin.take();
        self.apply_agent(&new, table);
        self.start_engines(
            &new,
            sorted.kept,
            sorted.launches,
            sorted.replaced,
            &mut summary,
        );
        // The admin server lists the engines: restart it on the same socket (or a new one).
        if let Some(a) = old_admin {
            a.stop().await;
        }
        if let Some((addr, socket, access)) = ready.admin {
            let engines = self.engines.iter().map(|e| e.state.clone()).collect();
            match self.launch_admin(addr, socket, engines, access) {
                Ok(a) => self.admin = Some(a),
                Err(e) => {
                    tracing::error!("{e}");
                    summary.failed.push(format!("admin listener ({e})"));
                }
            }
        }
        self.relisten(ready.own, &mut summary).await;
        if let Some(l) = crate::logging::global()
            && let Err(e) = l.apply_config_level(self.cfg.agent.log_level.as_deref(), "info")
        {
            tracing::warn!("{e}");
        }
        Ok(summary)
    }

    /// The same checks as check-config and start, so a reload names the file and key.
    fn check(&self, new: &AgentConfig) -> Result<(), String> {
        super::preflight::host(new, super::npu_ids(&self.sampler).as_deref())
            .map_err(|e| e.to_string())?;
        if let Some(level) = &new.agent.log_level {
            crate::config::check_log_filter(level)
                .map_err(|e| format!("[agent] log_level: {e}"))?;
        }
        Ok(())
    }

    /// Everything that can fail, before anything changes: each new or changed engine
    /// prepared with its socket, the admin socket and its access (a rotated token takes
    /// effect here), and the integrations' listeners that move.
    fn prepare_reload(&self, plan: &[Step], new: &AgentConfig) -> Result<Ready, String> {
        let kept = kept(plan);
        let mut engines = Vec::new();
        for step in plan {
            if !step.restart {
                engines.push(None);
                continue;
            }
            let p = self.prepare(&step.spec).map_err(|e| match e {
                AgentError::Config(m) | AgentError::Runtime(m) => m,
                other => other.to_string(),
            })?;
            let socket = self.socket_for(step.spec.mgmt_listen, &kept, &step.spec.name)?;
            engines.push(Some((p, socket)));
        }
        let admin = match new.agent.admin_listen {
            None => None,
            Some(addr) => {
                let socket = self.admin_socket_for(addr, &kept)?;
                let access = AdminAccess::load(&new.agent.admin_auth)?;
                Some((addr, socket, Arc::new(access)))
            }
        };
        // The integrations' own listeners read the engines of the moment: only a new address
        // restarts one.
        let own = self.own_listener_changes(&new.agent)?;
        Ok(Ready {
            engines,
            admin,
            own,
        })
    }

    /// Takes the running engines and sorts them by `plan`, noting each in `summary`.
    fn sort(
        &mut self,
        plan: Vec<Step>,
        ready: Vec<Option<(Prepared, std::net::TcpListener)>>,
        summary: &mut ReloadSummary,
    ) -> Sorted {
        let mut old: Vec<Option<EngineRun>> = std::mem::take(&mut self.engines)
            .into_iter()
            .map(Some)
            .collect();
        let mut out = Sorted::default();
        for (step, ready) in plan.into_iter().zip(ready) {
            let name = step.spec.name;
            match (step.old, ready) {
                (Some(o), None) => {
                    if let Some(run) = old[o].take() {
                        out.kept.push(run);
                        summary.unchanged.push(name);
                    }
                }
                (o, Some(launch)) => {
                    if let Some(run) = o.and_then(|o| old[o].take()) {
                        out.replaced.insert(name.clone(), run.state.clone());
                        out.retired.push(run);
                        summary.changed.push(name);
                    } else {
                        summary.added.push(name);
                    }
                    out.launches.push(launch);
                }
                (None, None) => {}
            }
        }
        for run in old.into_iter().flatten() {
            summary.removed.push(run.state.spec().name.clone());
            out.retired.push(run);
        }
        out
    }

    /// Puts the new `[agent]` settings in force, but for the start-only ones: the sampling
    /// period, the stuck threshold, the fault-code table (`table`, read from `new`'s file).
    fn apply_agent(&mut self, new: &AgentConfig, table: Result<FaultTable, TableError>) {
        self.cfg.agent = keep_start_only(&self.cfg.agent, &new.agent);
        self.cfg.source = new.source.clone();
        if new.agent.sample_period != self.sampler.period() {
            if let Err(e) = self.sampler.set_period(new.agent.sample_period) {
                tracing::warn!("sample_period not changed: {e}");
                self.cfg.agent.sample_period = self.sampler.period();
            } else {
                tracing::info!("sampling period is now {:?}", new.agent.sample_period);
            }
        }
        self.liveness_cfg.set(self.cfg.agent.sampler_stuck_after);
        super::apply_fault_table(table, &self.shared, true);
    }

    /// Starts the new and changed engines (a changed one with what carries over of its old
    /// state), then puts every engine in `new`'s order and publishes the roster.
    fn start_engines(
        &mut self,
        new: &AgentConfig,
        kept: Vec<EngineRun>,
        launches: Vec<(Prepared, std::net::TcpListener)>,
        mut replaced: HashMap<String, Arc<Monitor>>,
        summary: &mut ReloadSummary,
    ) {
        let mut by_name: HashMap<String, EngineRun> = kept
            .into_iter()
            .map(|r| (r.state.spec().name.clone(), r))
            .collect();
        for (p, socket) in launches {
            let name = p.spec.name.clone();
            let carried = replaced
                .remove(&name)
                .and_then(|old| carried_over(&old, &p.spec));
            match self.launch(p, socket, carried, false) {
                Ok(run) => {
                    by_name.insert(name, run);
                }
                Err(e) => {
                    tracing::error!(engine = %name, "cannot start the engine: {e}");
                    summary.failed.push(format!("{name} ({e})"));
                }
            }
        }
        self.engines = new
            .engines
            .iter()
            .filter_map(|e| by_name.remove(&e.name))
            .collect();
        self.cfg.engines = self
            .engines
            .iter()
            .map(|e| e.state.spec().clone())
            .collect();
        self.publish_roster();
        // The ring was sized at start: a longer window or a shorter period can outgrow it.
        let longest = super::longest_window(&self.cfg);
        if let Some(covers) = self.ring_covers()
            && longest + std::time::Duration::from_secs(5) > covers
        {
            tracing::warn!(
                "the ring now holds {covers:?} of history but the longest window is {longest:?}; windows are cut short until the agent restarts"
            );
        }
    }

    /// Stops and starts the integrations' own listeners that `own` changes.
    async fn relisten(&mut self, own: OwnChanges, summary: &mut ReloadSummary) {
        for (i, to) in own {
            if let Some(at) = self.own_listener(i) {
                self.integration_listeners.remove(at).stop().await;
            }
            if let Some((listen, socket)) = to {
                match self.launch_integration(i, &listen, socket) {
                    Ok(run) => self.integration_listeners.push(run),
                    Err(e) => {
                        tracing::error!("{e}");
                        summary.failed.push(format!("{} ({e})", listen.label));
                    }
                }
            }
        }
    }

    /// The socket for a new or changed engine at `addr`: the socket of a replaced or removed
    /// engine with the same address, else a new one.
    fn socket_for(
        &self,
        addr: SocketAddr,
        kept: &[usize],
        name: &str,
    ) -> Result<std::net::TcpListener, String> {
        if addr.port() != 0 {
            if let Some(i) = self
                .engines
                .iter()
                .position(|e| e.listener.configured == addr)
            {
                if kept.contains(&i) {
                    return Err(format!(
                        "engine {name}: mgmt address {addr} is still used by engine {}",
                        self.engines[i].state.spec().name
                    ));
                }
                return self.engines[i]
                    .listener
                    .socket
                    .try_clone()
                    .map_err(|e| format!("engine {name}: cannot reuse {addr}: {e}"));
            }
            if let Some(a) = &self.admin
                && a.configured == addr
            {
                return Err(format!(
                    "engine {name}: mgmt address {addr} is the admin listener's"
                ));
            }
        }
        server::bind(addr).map_err(|e| format!("engine {name}: {e}"))
    }

    /// Where `i`'s own listener is in the roster of listeners, if it runs.
    fn own_listener(&self, i: &'static dyn Integration) -> Option<usize> {
        self.integration_listeners
            .iter()
            .position(|l| l.integration().is_some_and(|x| x.id() == i.id()))
    }

    /// The integrations' own listeners that change under `agent`: a new socket for one that
    /// starts or moves, `None` for one that stops.
    fn own_listener_changes(
        &self,
        agent: &crate::config::AgentSettings,
    ) -> Result<OwnChanges, String> {
        let mut out = Vec::new();
        for &i in REGISTRY {
            let running = self
                .own_listener(i)
                .map(|at| &self.integration_listeners[at]);
            match (i.listen(agent), running) {
                (Some(l), Some(run)) if run.configured == l.addr && l.addr.port() != 0 => {}
                (Some(l), _) => {
                    let socket = server::bind(l.addr).map_err(|e| format!("{}: {e}", l.label))?;
                    out.push((i, Some((l, socket))));
                }
                (None, Some(_)) => out.push((i, None)),
                (None, None) => {}
            }
        }
        Ok(out)
    }

    /// The admin socket at `addr`: the current one when the address is unchanged.
    fn admin_socket_for(
        &self,
        addr: SocketAddr,
        kept: &[usize],
    ) -> Result<std::net::TcpListener, String> {
        if let Some(a) = &self.admin
            && a.configured == addr
            && addr.port() != 0
        {
            return a
                .socket
                .try_clone()
                .map_err(|e| format!("admin listener: cannot reuse {addr}: {e}"));
        }
        if let Some(i) = self
            .engines
            .iter()
            .position(|e| e.listener.configured == addr && addr.port() != 0)
            && kept.contains(&i)
        {
            return Err(format!(
                "admin_listen {addr} is engine {}'s mgmt address",
                self.engines[i].state.spec().name
            ));
        }
        server::bind(addr).map_err(|e| format!("admin listener: {e}"))
    }
}

/// What of a changed engine's state (`old`) carries over to its new settings `spec`, saying
/// so in the log; `None` when it starts over.
fn carried_over(old: &Monitor, spec: &EngineSpec) -> Option<(EngineState, Carry)> {
    let name = &spec.name;
    let (carry, reset) = crate::monitor::saved::carry(old.spec(), spec);
    if carry.none() {
        tracing::info!(engine = %name, "its state starts over: {} changed", reset.join(", "));
        return None;
    }
    if reset.is_empty() {
        tracing::info!(engine = %name, "its verdict, failure count, warm-up and QoS level carry over to the new settings");
    } else {
        let starts_over = match (carry.virtual_inference, carry.qos) {
            (false, false) => "virtual inference and the QoS level start over",
            (false, true) => "virtual inference starts over",
            _ => "the QoS level starts over",
        };
        tracing::info!(engine = %name, "its state carries over to the new settings, but for what {} changed: {starts_over}", reset.join(", "));
    }
    Some((old.saved(), carry))
}

/// Integrations whose own listener starts, moves (its new socket) or stops (`None`).
type OwnChanges = Vec<(
    &'static dyn Integration,
    Option<(Listen, std::net::TcpListener)>,
)>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_only_keys_are_named() {
        let a = AgentSettings::default();
        let mut b = a.clone();
        b.backend = crate::driver::BackendChoice::NpuSmi;
        b.sample_period = std::time::Duration::from_millis(20);
        b.worker_threads = 4;
        assert_eq!(restart_only(&a, &b), vec!["backend", "worker_threads"]);
        // What is kept is exactly what restart_only names; the rest is taken.
        let c = AgentSettings {
            dcmi_lib: Some("/x/libdcmi.so".into()),
            npu_smi: "/x/npu-smi".into(),
            backend: crate::driver::BackendChoice::Dcmi,
            dcmi_no_owner_check: true,
            npu_smi_delay: 7,
            worker_threads: 9,
            sampler_realtime: false,
            driver_call_deadline: std::time::Duration::from_millis(300),
            sample_period: std::time::Duration::from_millis(20),
            listeners: crate::config::ListenerLimits {
                max_connections: 9,
                header_read_timeout: std::time::Duration::from_secs(3),
                idle_timeout: std::time::Duration::from_secs(4),
                stall_timeout: std::time::Duration::from_secs(5),
            },
            state_dir: Some("/run/x".into()),
            pod_resources: Some(crate::config::PodResourcesSettings {
                socket: "/run/k.sock".into(),
                period: std::time::Duration::from_secs(1),
            }),
            ..AgentSettings::default()
        };
        assert_eq!(
            restart_only(&a, &c).len(),
            14,
            "every start-only key differs"
        );
        let kept = keep_start_only(&a, &c);
        assert!(restart_only(&a, &kept).is_empty());
        assert_eq!(kept.sample_period, c.sample_period);
    }

    // Matched by name: an unchanged engine is kept, a changed or new one (re)starts.
    #[test]
    fn the_plan_matches_engines_by_name() {
        // One file, written twice: a spec also records where it was read.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.toml");
        let cfg = |names: &[(&str, u16)]| -> Vec<EngineSpec> {
            let mut text = String::new();
            for (i, (n, port)) in names.iter().enumerate() {
                text.push_str(&format!(
                    "[[engine]]\nname = \"{n}\"\nengine_type = \"vllm\"\nserved_model_name = \"m\"\nhost = \"127.0.0.1\"\nport = {port}\nmgmt_port = {}\n",
                    9000 + i
                ));
            }
            std::fs::write(&path, text).unwrap();
            crate::config::file::load(&path).unwrap().engines
        };
        let old = cfg(&[("a", 8000), ("b", 8001), ("c", 8002)]);
        let new = cfg(&[("a", 8000), ("c", 8012), ("d", 8003)]);
        let running: Vec<&EngineSpec> = old.iter().collect();
        let p = plan(&running, &new);
        let got: Vec<(&str, Option<usize>, bool)> = p
            .iter()
            .map(|s| (s.spec.name.as_str(), s.old, s.restart))
            .collect();
        // `c`'s mgmt port moved with its place in the file, and its engine port changed.
        assert_eq!(
            got,
            [
                ("a", Some(0), false),
                ("c", Some(2), true),
                ("d", None, true)
            ]
        );
        assert_eq!(kept(&p), vec![0]);
    }

    #[test]
    fn summary_line() {
        let s = ReloadSummary {
            added: vec!["b".into()],
            unchanged: vec!["a".into()],
            needs_restart: vec!["backend"],
            ..ReloadSummary::default()
        };
        assert_eq!(
            s.to_string(),
            "added b; removed none; restarted none; untouched a; [agent] backend change(s) take effect at the next restart"
        );
    }
}
