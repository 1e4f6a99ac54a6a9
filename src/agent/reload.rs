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
use crate::integrations::{Integration, Listen, REGISTRY};
use crate::server;
use std::fmt;
use std::net::SocketAddr;

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
    check("kubernetes", old.kubernetes != new.kubernetes);
    check("state_dir", old.state_dir != new.state_dir);
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
        kubernetes: running.kubernetes.clone(),
        state_dir: running.state_dir.clone(),
        ..new.clone()
    }
}

/// Whether two engine specs are the same settings, including what was read from the files
/// they name (`env.json`'s document).
fn same(a: &EngineSpec, b: &EngineSpec) -> bool {
    a == b
}

impl Running {
    /// Applies `new`; on error nothing changed.
    pub async fn reload(&mut self, new: AgentConfig) -> Result<ReloadSummary, String> {
        let mut summary = ReloadSummary {
            needs_restart: restart_only(&self.cfg.agent, &new.agent),
            ..ReloadSummary::default()
        };
        // The same checks as check-config and start, so a reload names the file and key.
        super::preflight::host(&new, super::npu_ids(&self.sampler).as_deref())
            .map_err(|e| e.to_string())?;
        if let Some(level) = &new.agent.log_level {
            crate::config::check_log_filter(level)
                .map_err(|e| format!("[agent] log_level: {e}"))?;
        }
        // Classify by name; the old index of each kept or replaced engine.
        let mut plan: Vec<(EngineSpec, Option<usize>, bool)> = Vec::new(); // (spec, old, restart)
        for spec in &new.engines {
            let old = self
                .engines
                .iter()
                .position(|e| e.state.spec.name == spec.name);
            let restart = old.is_none_or(|i| !same(&self.engines[i].state.spec, spec));
            plan.push((spec.clone(), old, restart));
        }
        let kept: Vec<usize> = plan
            .iter()
            .filter(|(_, old, restart)| !restart && old.is_some())
            .filter_map(|(_, old, _)| *old)
            .collect();
        // Prepare every new or changed engine and get its socket.
        let mut prepared: Vec<Option<(Prepared, std::net::TcpListener)>> = Vec::new();
        for (spec, _, restart) in &plan {
            if !restart {
                prepared.push(None);
                continue;
            }
            let p = self.prepare(spec).map_err(|e| match e {
                AgentError::Config(m) | AgentError::Runtime(m) => m,
                other => other.to_string(),
            })?;
            let socket = self.socket_for(spec.mgmt_listen, &kept, &spec.name)?;
            prepared.push(Some((p, socket)));
        }
        let admin_socket = match new.agent.admin_listen {
            None => None,
            Some(addr) => Some((
                addr,
                self.admin_socket_for(addr, &kept)?,
                // Re-read on every reload: a rotated token takes effect with SIGHUP.
                std::sync::Arc::new(crate::server::auth::AdminAccess::load(
                    &new.agent.admin_auth,
                )?),
            )),
        };
        // The integrations' own listeners read the engines of the moment: only a new address
        // restarts one.
        let own_changes = self.own_listener_changes(&new.agent)?;
        // Commit: nothing below fails for a configuration reason.
        let mut old_runs: Vec<Option<EngineRun>> = std::mem::take(&mut self.engines)
            .into_iter()
            .map(Some)
            .collect();
        let mut retired: Vec<EngineRun> = Vec::new();
        // The monitors of changed engines: their state carries over to the new settings.
        let mut replaced: std::collections::HashMap<
            String,
            std::sync::Arc<crate::monitor::Monitor>,
        > = std::collections::HashMap::new();
        let mut next: Vec<EngineRun> = Vec::new();
        let mut launches: Vec<(Prepared, std::net::TcpListener)> = Vec::new();
        for ((spec, old, restart), prep) in plan.into_iter().zip(prepared) {
            match (old, restart, prep) {
                (Some(o), false, _) => {
                    if let Some(run) = old_runs[o].take() {
                        next.push(run);
                        summary.unchanged.push(spec.name.clone());
                    }
                }
                (old, _, Some((p, socket))) => {
                    if let Some(o) = old
                        && let Some(run) = old_runs[o].take()
                    {
                        replaced.insert(spec.name.clone(), run.state.clone());
                        retired.push(run);
                        summary.changed.push(spec.name.clone());
                    } else {
                        summary.added.push(spec.name.clone());
                    }
                    launches.push((p, socket));
                }
                _ => {}
            }
        }
        for run in old_runs.into_iter().flatten() {
            summary.removed.push(run.state.spec.name.clone());
            retired.push(run);
        }
        // Stop what goes away first, so a restarted engine does not probe twice.
        let stops: Vec<_> = retired.into_iter().map(EngineRun::stop).collect();
        futures_util::future::join_all(stops).await;
        let old_admin = self.admin.take();
        // The start-only settings stay as they run.
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
        super::apply_fault_table(&new.agent, &self.shared, true);
        let mut by_name: std::collections::HashMap<String, EngineRun> = next
            .into_iter()
            .map(|r| (r.state.spec.name.clone(), r))
            .collect();
        for p in launches {
            let name = p.0.spec.name.clone();
            let carried = replaced.remove(&name).and_then(|old| {
                let (carry, reset) = crate::monitor::saved::carry(&old.spec, &p.0.spec);
                if carry.none() {
                    tracing::info!(engine = %name, "its state starts over: {} changed", reset.join(", "));
                    return None;
                }
                if reset.is_empty() {
                    tracing::info!(engine = %name, "its verdict, failure count, warm-up and QoS level carry over to the new settings");
                } else {
                    tracing::info!(engine = %name, "its state carries over to the new settings, but for what {} changed: {}", reset.join(", "), match (carry.virtual_inference, carry.qos) {
                        (false, false) => "virtual inference and the QoS level start over",
                        (false, true) => "virtual inference starts over",
                        _ => "the QoS level starts over",
                    });
                }
                Some((old.saved(), carry))
            });
            match self.launch(p.0, p.1, carried) {
                Ok(run) => {
                    by_name.insert(name, run);
                }
                Err(e) => {
                    tracing::error!(engine = %name, "cannot start the engine: {e}");
                    summary.failed.push(format!("{name} ({e})"));
                }
            }
        }
        // Config order.
        self.engines = new
            .engines
            .iter()
            .filter_map(|e| by_name.remove(&e.name))
            .collect();
        self.cfg.engines = self.engines.iter().map(|e| e.state.spec.clone()).collect();
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
        // The admin server lists the engines: restart it on the same socket (or a new one).
        if let Some(a) = old_admin {
            a.stop().await;
        }
        if let Some((addr, socket, access)) = admin_socket {
            let engines = self.engines.iter().map(|e| e.state.clone()).collect();
            match self.launch_admin(addr, socket, engines, access) {
                Ok(a) => self.admin = Some(a),
                Err(e) => {
                    tracing::error!("{e}");
                    summary.failed.push(format!("admin listener ({e})"));
                }
            }
        }
        for (i, to) in own_changes {
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
        if let Some(l) = crate::logging::global()
            && let Err(e) = l.apply_config_level(self.cfg.agent.log_level.as_deref(), "info")
        {
            tracing::warn!("{e}");
        }
        Ok(summary)
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
                        self.engines[i].state.spec.name
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
                self.engines[i].state.spec.name
            ));
        }
        server::bind(addr).map_err(|e| format!("admin listener: {e}"))
    }
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
            ..AgentSettings::default()
        };
        assert_eq!(
            restart_only(&a, &c).len(),
            13,
            "every start-only key differs"
        );
        let kept = keep_start_only(&a, &c);
        assert!(restart_only(&a, &kept).is_empty());
        assert_eq!(kept.sample_period, c.sample_period);
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
