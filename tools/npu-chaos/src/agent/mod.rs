//! How the runner runs the agent, and the agent's own faults.
//!
//! Two supervisors (`--agent-supervisor`):
//! - **direct**: a child of the runner, `setsid nice -n -10 npu-health-agent --fake run …`
//!   ([`crate::priority`]), as every experiment has always run it. Its faults are done by
//!   hand, as the supervisor it stands for would do them: a restart is SIGTERM, the exit, a
//!   new process at once; a crash is SIGKILL and a new process after the shipped unit's
//!   `RestartSec=`; an outage is SIGTERM and a new process after the outage. Every process
//!   logs into `agent.log`, appended, with a line of the runner's before each operation.
//! - **systemd**: the unit derived from the shipped one ([`agent_unit`]) in a private user
//!   manager ([`crate::systemd::UserManager`]): a restart is `systemctl --user restart`, a
//!   crash `systemctl --user kill -s SIGKILL --kill-whom=main` (the manager restarts it), an
//!   outage `stop`, the wait, `start`. The unit logs into `agent.log` (`append:`).
//!
//! `agent_upgrade` is Kubernetes' rolling update, so always two direct processes: a second
//! agent with the same config and state directory starts beside the first, takes over, and
//! the first exits by itself; the runner then tracks the second. The second logs into
//! `agent-upgrade.log` (both run at once).
//!
//! Each operation runs as a task of its own while the experiment goes on sampling, and
//! returns an [`AgentOp`]: the pids, when the new process ran, and when `/status` first
//! answered after the old process was gone.

use crate::experiment::Fault;
use crate::priority;
use crate::systemd::{self, UserManager};
use crate::timescale::{fmt_duration, scaled};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;
use tokio::process::Child;
use tokio::time::Instant;

mod ops;
use ops::{act, alive, parent, restart_sec, run_systemctl, stop_timeout};

/// Who runs the agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Supervisor {
    /// A child of the runner (`setsid nice -n -10`).
    Direct,
    /// A unit of a private systemd user manager, derived from the shipped unit.
    Systemd,
}

impl Supervisor {
    pub fn as_str(self) -> &'static str {
        match self {
            Supervisor::Direct => "direct",
            Supervisor::Systemd => "systemd",
        }
    }
}

/// How long a handover may take before the upgrade is called failed.
const HANDOVER_LIMIT: Duration = Duration::from_secs(30);
/// How long the runner waits for the new agent's first `/status` answer.
const ANSWER_LIMIT: Duration = Duration::from_secs(60);
/// systemd's default `TimeoutStopSec=` and `RestartSec=`, when the unit sets none.
const DEFAULT_STOP_TIMEOUT: Duration = Duration::from_secs(90);
const DEFAULT_RESTART_SEC: Duration = Duration::from_millis(100);

/// How one agent process is started directly.
#[derive(Debug, Clone)]
pub struct Launch {
    pub exe: PathBuf,
    pub config: PathBuf,
    pub scenario: PathBuf,
    /// `RUNTIME_DIRECTORY`: the agent's state directory when its config names none
    /// (`<experiment>/run`; under systemd the unit's `RuntimeDirectory=` provides it).
    pub state_dir: PathBuf,
    /// The experiment's `agent.log`.
    pub log: PathBuf,
}

impl Launch {
    /// Starts one agent logging into `log` (appended, or made afresh), at the health
    /// service's priority.
    async fn spawn(&self, log: &Path, append: bool) -> Result<Child, String> {
        // Always in append mode, also when made afresh: the runner's own lines go in between
        // (a file offset of the process's own would write over them).
        if !append {
            std::fs::File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
        }
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .map_err(|e| format!("{}: {e}", log.display()))?;
        let mut cmd = priority::command(&self.exe);
        cmd.args(["--fake", "run", "--config"])
            .arg(&self.config)
            .env("FAKE_NPU_SCENARIO", &self.scenario)
            .env("RUST_LOG", "info")
            .env("RUNTIME_DIRECTORY", &self.state_dir)
            .stdout(Stdio::null())
            .stderr(Stdio::from(file))
            .kill_on_drop(true);
        let child = cmd
            .spawn()
            .map_err(|e| format!("starting the agent (through `setsid` and `nice`): {e}"))?;
        priority::raise_group(child.id()).await;
        Ok(child)
    }
}

/// The unit the agent runs as under systemd: the shipped unit ([`systemd::user_unit`]) with
/// the direct start's command, environment and log, the health service's `Nice=` when the
/// shipped unit sets none, and `RestartSec=` scaled by `s`.
pub fn agent_unit(launch: &Launch, s: f64) -> Result<systemd::UserUnit, String> {
    let text = |p: &Path| p.display().to_string();
    let (exe, config) = (text(&launch.exe), text(&launch.config));
    let mut u = systemd::user_unit(
        systemd::SHIPPED_UNIT,
        &[&exe, "--fake", "run", "--config", &config],
    )?;
    u.add(
        "Environment",
        &systemd::environment_value("FAKE_NPU_SCENARIO", &text(&launch.scenario)),
        "the fake NPUs, as the direct start passes them",
    );
    u.add(
        "Environment",
        &systemd::environment_value("RUST_LOG", "info"),
        "as the direct start",
    );
    let log = format!("append:{}", text(&launch.log).replace('%', "%%"));
    u.set(
        "StandardOutput",
        &log,
        "the experiment's agent.log, appended across restarts",
    );
    u.set("StandardError", &log, "the same");
    if u.service_value("Nice").is_none() {
        u.set(
            "Nice",
            &priority::HEALTH_SERVICE_NICE.to_string(),
            "the health service's priority, as the direct start's `nice -n -10` (the shipped unit sets none)",
        );
    }
    if s != 1.0
        && let Some(r) = u
            .service_value("RestartSec")
            .and_then(systemd::parse_timespan)
    {
        u.set(
            "RestartSec",
            &fmt_duration(scaled(r, s)),
            "the shipped value scaled by --time-scale",
        );
    }
    Ok(u)
}

/// One operation on the agent, as the runner did it. Times are milliseconds on the run's
/// clock from the scheduled injection.
#[derive(Debug, Clone, Serialize)]
pub struct AgentOp {
    pub fault: String,
    pub supervisor: Supervisor,
    /// What was done.
    pub how: String,
    pub started_ms: i64,
    pub old_pid: Option<u32>,
    /// How the old process ended (direct only).
    pub old_exit: Option<String>,
    pub new_pid: Option<u32>,
    /// When the new process ran (direct: spawned; systemd: the unit active with a new
    /// main process; upgrade: the old one gone, the new one running).
    pub new_running_ms: Option<i64>,
    /// The first `/status` answer after the old process was gone, the new one running.
    pub answered_ms: Option<i64>,
    /// Where the new process logs.
    pub log: String,
    /// What went wrong (the experiment ends as an error with it).
    pub error: Option<String>,
}

impl AgentOp {
    /// An operation that did not report (its task failed or did not end).
    pub fn unfinished(fault: Fault, supervisor: Supervisor) -> AgentOp {
        AgentOp {
            fault: fault.to_string(),
            supervisor,
            how: String::new(),
            started_ms: 0,
            old_pid: None,
            old_exit: None,
            new_pid: None,
            new_running_ms: None,
            answered_ms: None,
            log: String::new(),
            error: None,
        }
    }
}

/// The process (or unit) serving `/status`.
enum Process {
    /// A child of the runner: the agent started directly, or MindIE's engine server.
    Direct(Child),
    /// A unit of a private user manager and its last known main process.
    Systemd {
        manager: Option<UserManager>,
        unit: String,
        pid: Option<u32>,
    },
    /// Nothing (between an outage's stop and start, or after a failed start).
    Gone,
}

/// The agent of a stack.
pub struct Agent {
    pub supervisor: Supervisor,
    process: Process,
    /// How to start another one (`None` for MindIE's engine server).
    launch: Option<Launch>,
    /// `RestartSec=` of the unit the agent runs as (scaled).
    restart_sec: Duration,
    /// `TimeoutStopSec=` of the shipped unit (unscaled: it bounds a real shutdown).
    stop_timeout: Duration,
    dir: PathBuf,
}

impl Agent {
    /// Wraps a process started elsewhere (MindIE's engine server), which no fault touches.
    pub fn other(child: Child, dir: &Path) -> Agent {
        Agent {
            supervisor: Supervisor::Direct,
            process: Process::Direct(child),
            launch: None,
            restart_sec: DEFAULT_RESTART_SEC,
            stop_timeout: DEFAULT_STOP_TIMEOUT,
            dir: dir.to_owned(),
        }
    }

    /// Starts the agent directly, logging into a fresh `agent.log`.
    pub async fn start_direct(launch: Launch, s: f64) -> Result<Agent, String> {
        // Only read here (RestartSec=, TimeoutStopSec=): a unit that does not derive leaves
        // systemd's defaults, and the start as it always was.
        let unit = agent_unit(&launch, 1.0).ok();
        let child = launch.spawn(&launch.log.clone(), false).await?;
        Ok(Agent {
            supervisor: Supervisor::Direct,
            process: Process::Direct(child),
            restart_sec: scaled(unit.as_ref().map_or(DEFAULT_RESTART_SEC, restart_sec), s),
            stop_timeout: unit.as_ref().map_or(DEFAULT_STOP_TIMEOUT, stop_timeout),
            dir: parent(&launch.log),
            launch: Some(launch),
        })
    }

    /// Starts a private user manager, installs the agent's unit in it and starts the unit
    /// (which returns once the agent said READY=1).
    pub async fn start_systemd(launch: Launch, s: f64) -> Result<Agent, String> {
        let unit = agent_unit(&launch, s)?;
        let text = unit.text();
        let dir = parent(&launch.log);
        let _ = std::fs::write(dir.join("npu-health-agent.service"), &text);
        // A fresh agent.log, as the direct start makes.
        std::fs::write(&launch.log, "").map_err(|e| format!("{}: {e}", launch.log.display()))?;
        let manager = {
            let dir = dir.clone();
            tokio::task::spawn_blocking(move || {
                let mut m = UserManager::start(&dir)?;
                m.install_unit(systemd::AGENT_UNIT, &text)?;
                Ok::<_, String>(m)
            })
            .await
            .map_err(|e| e.to_string())??
        };
        let mut agent = Agent {
            supervisor: Supervisor::Systemd,
            process: Process::Systemd {
                manager: Some(manager),
                unit: systemd::AGENT_UNIT.to_owned(),
                pid: None,
            },
            restart_sec: restart_sec(&unit),
            stop_timeout: stop_timeout(&unit),
            dir,
            launch: Some(launch),
        };
        agent
            .systemctl(&["start", systemd::AGENT_UNIT])
            .await
            .map_err(|e| format!("{e}; see agent.log and systemd-manager.log"))?;
        let pid = agent.refresh_main_pid().await?;
        priority::raise_group(pid).await;
        Ok(agent)
    }

    /// The process serving now.
    pub fn pid(&self) -> Option<u32> {
        match &self.process {
            Process::Direct(c) => c.id(),
            Process::Systemd { pid, .. } => *pid,
            Process::Gone => None,
        }
    }

    /// Why the agent is not running, if it is not (during start-up).
    pub async fn exited(&mut self) -> Option<String> {
        match &mut self.process {
            Process::Direct(c) => match c.try_wait() {
                Ok(Some(st)) => Some(format!("the agent exited ({st})")),
                _ => None,
            },
            Process::Systemd { pid, unit, .. } => {
                if pid.is_some_and(alive) {
                    return None;
                }
                let unit = unit.clone();
                let state = self
                    .systemctl(&["show", "-p", "ActiveState", "-p", "Result", &unit])
                    .await
                    .unwrap_or_default();
                (!state.contains("ActiveState=active")).then(|| {
                    format!(
                        "the unit {unit} is not active ({})",
                        state.trim().replace('\n', ", ")
                    )
                })
            }
            Process::Gone => Some("no agent runs".to_owned()),
        }
    }

    /// Stops the agent at the end of an experiment: a child is killed; a unit is killed and
    /// its manager stopped with everything it started.
    pub async fn stop(&mut self) {
        match std::mem::replace(&mut self.process, Process::Gone) {
            Process::Direct(mut c) => {
                let _ = c.kill().await;
            }
            Process::Systemd {
                manager: Some(mut m),
                unit,
                ..
            } => {
                let _ = run_systemctl(&m, &["kill", "-s", "SIGKILL", &unit]).await;
                let _ = tokio::task::spawn_blocking(move || {
                    if let Err(e) = m.stop() {
                        eprintln!("npu-chaos:   stopping the private systemd user manager: {e}");
                    }
                })
                .await;
            }
            Process::Systemd { manager: None, .. } | Process::Gone => {}
        }
    }

    async fn systemctl(&self, args: &[&str]) -> Result<String, String> {
        match &self.process {
            Process::Systemd {
                manager: Some(m), ..
            } => run_systemctl(m, args).await,
            _ => Err("not under systemd".to_owned()),
        }
    }

    /// Reads the unit's main process into `pid`.
    async fn refresh_main_pid(&mut self) -> Result<Option<u32>, String> {
        let unit = match &self.process {
            Process::Systemd { unit, .. } => unit.clone(),
            _ => return Ok(self.pid()),
        };
        let out = self.systemctl(&["show", "-p", "MainPID", &unit]).await?;
        let got = out
            .trim()
            .strip_prefix("MainPID=")
            .and_then(|v| v.parse::<u32>().ok())
            .filter(|p| *p != 0);
        if let Process::Systemd { pid, .. } = &mut self.process {
            *pid = got;
        }
        Ok(got)
    }

    /// Appends the runner's line about an operation to `agent.log`.
    fn note(&self, text: &str) {
        use std::io::Write;
        let Some(l) = &self.launch else { return };
        if let Ok(mut f) = std::fs::OpenOptions::new().append(true).open(&l.log) {
            let _ = writeln!(
                f,
                "{} npu-chaos: {text}",
                humantime::format_rfc3339_micros(std::time::SystemTime::now())
            );
        }
    }
}

/// Aborts a task when dropped: an operation never outlives its experiment.
pub struct OpTask(pub tokio::task::JoinHandle<AgentOp>);

impl OpTask {
    pub fn is_finished(&self) -> bool {
        self.0.is_finished()
    }

    /// Its record, once it ends.
    pub async fn finish(mut self) -> Result<AgentOp, String> {
        (&mut self.0)
            .await
            .map_err(|e| format!("the agent operation failed: {e}"))
    }
}

impl Drop for OpTask {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Starts the operation `fault` on `agent` as a task; `status_url` is the agent's `/status`,
/// `t0` the scheduled injection, `s` the time scale.
pub fn start_op(
    agent: Arc<tokio::sync::Mutex<Agent>>,
    fault: Fault,
    s: f64,
    status_url: String,
    t0: Instant,
) -> OpTask {
    OpTask(tokio::spawn(async move {
        let mut a = agent.lock().await;
        act(&mut a, fault, s, &status_url, t0).await
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn launch() -> Launch {
        Launch {
            exe: "/t/npu-health-agent".into(),
            config: "/t/x/agent.toml".into(),
            scenario: "/t/x/scenario.toml".into(),
            state_dir: "/t/x/run".into(),
            log: "/t/x/agent%.log".into(),
        }
    }

    // The agent's unit: the shipped unit with the direct start's command, environment and
    // log; the health service's nice when the shipped unit has none; RestartSec= scaled.
    #[test]
    fn the_agents_unit_is_the_shipped_one_run_as_the_direct_start_runs_it() {
        let u = agent_unit(&launch(), 1.0).unwrap();
        assert_eq!(
            u.service_value("ExecStart"),
            Some(r#""/t/npu-health-agent" "--fake" "run" "--config" "/t/x/agent.toml""#)
        );
        let env: Vec<&str> = u
            .service_keys()
            .filter(|(k, _)| *k == "Environment")
            .map(|(_, v)| v)
            .collect();
        assert!(
            env.contains(&"\"FAKE_NPU_SCENARIO=/t/x/scenario.toml\""),
            "{env:?}"
        );
        assert!(env.contains(&"\"RUST_LOG=info\""), "{env:?}");
        assert_eq!(
            u.service_value("StandardError"),
            Some("append:/t/x/agent%%.log")
        );
        assert!(u.service_value("Nice").is_some());
        let shipped = systemd::user_unit(systemd::SHIPPED_UNIT, &["/x"]).unwrap();
        assert_eq!(
            u.service_value("RestartSec"),
            shipped.service_value("RestartSec"),
            "unscaled at 1"
        );
        let half = agent_unit(&launch(), 0.5).unwrap();
        if let Some(r) = shipped
            .service_value("RestartSec")
            .and_then(systemd::parse_timespan)
        {
            let want = format!("{}us", (r / 2).as_micros().max(1));
            assert_eq!(half.service_value("RestartSec"), Some(want.as_str()));
        }
    }
}
