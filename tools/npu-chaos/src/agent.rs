//! How the runner runs the agent, and the agent's own faults.
//!
//! Two supervisors (`--agent-supervisor`):
//! - **direct**: a child of the runner, `setsid nice -n -10 npu-health-agent --fake run …`
//!   ([`super::priority`]), as every experiment has always run it. Its faults are done by
//!   hand, as the supervisor it stands for would do them: a restart is SIGTERM, the exit, a
//!   new process at once; a crash is SIGKILL and a new process after the shipped unit's
//!   `RestartSec=`; an outage is SIGTERM and a new process after the outage. Every process
//!   logs into `agent.log`, appended, with a line of the runner's before each operation.
//! - **systemd**: the unit derived from the shipped one ([`agent_unit`]) in a private user
//!   manager ([`super::systemd::UserManager`]): a restart is `systemctl --user restart`, a
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

use super::experiment::Fault;
use super::priority;
use super::systemd::{self, UserManager};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;
use tokio::process::{Child, Command};
use tokio::time::Instant;

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
        let scaled = Duration::from_secs_f64(r.as_secs_f64() * s);
        u.set(
            "RestartSec",
            &format!("{}us", scaled.as_micros().max(1)),
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

/// Milliseconds from `t0` to `t` (negative before).
fn rel(t0: Instant, t: Instant) -> i64 {
    if t >= t0 {
        (t - t0).as_millis() as i64
    } else {
        -((t0 - t).as_millis() as i64)
    }
}

async fn act(a: &mut Agent, fault: Fault, s: f64, status_url: &str, t0: Instant) -> AgentOp {
    let started = Instant::now();
    let supervisor = if fault == Fault::AgentUpgrade {
        Supervisor::Direct
    } else {
        a.supervisor
    };
    let mut op = AgentOp {
        fault: fault.to_string(),
        supervisor,
        how: String::new(),
        started_ms: rel(t0, started),
        old_pid: a.pid(),
        old_exit: None,
        new_pid: None,
        new_running_ms: None,
        answered_ms: None,
        log: "agent.log".to_owned(),
        error: None,
    };
    let result = match (fault, a.supervisor) {
        (Fault::AgentUpgrade, _) => upgrade(a, &mut op).await,
        (_, Supervisor::Direct) => direct(a, fault, s, &mut op).await,
        (_, Supervisor::Systemd) => under_systemd(a, fault, s, &mut op).await,
    };
    let running = Instant::now();
    match result {
        Ok(()) => {
            op.new_running_ms = Some(rel(t0, running));
            op.new_pid = a.pid();
            match first_answer(status_url).await {
                Some(at) => op.answered_ms = Some(rel(t0, at)),
                None => {
                    op.error = Some(format!(
                        "{fault}: the new agent (pid {}) did not answer /status within {ANSWER_LIMIT:?}",
                        op.new_pid.map_or("?".to_owned(), |p| p.to_string())
                    ));
                }
            }
        }
        Err(e) => op.error = Some(format!("{fault}: {e}")),
    }
    op
}

/// A restart, crash or outage of a directly started agent.
async fn direct(a: &mut Agent, fault: Fault, s: f64, op: &mut AgentOp) -> Result<(), String> {
    let launch = a
        .launch
        .clone()
        .ok_or("this health service cannot be restarted")?;
    let Process::Direct(mut child) = std::mem::replace(&mut a.process, Process::Gone) else {
        return Err("no agent process to act on".to_owned());
    };
    let pid = child.id();
    let pid_text = pid.map_or("?".to_owned(), |p| p.to_string());
    let (how, after) = match fault {
        Fault::AgentRestart => (
            format!("SIGTERM to pid {pid_text}, its exit awaited, a new agent at once"),
            Duration::ZERO,
        ),
        Fault::AgentCrash => (
            format!(
                "SIGKILL to pid {pid_text}, a new agent after the unit's RestartSec= ({:?}, scaled)",
                a.restart_sec
            ),
            a.restart_sec,
        ),
        Fault::AgentOutage(d) => {
            let d = scaled(d, s);
            (
                format!(
                    "SIGTERM to pid {pid_text}, its exit awaited, no agent for {d:?}, a new agent"
                ),
                d,
            )
        }
        other => return Err(format!("{other} is not an agent restart")),
    };
    op.how = how.clone();
    a.note(&format!("{fault} (direct): {how}"));
    let status = if fault == Fault::AgentCrash {
        let _ = child.kill().await;
        child.wait().await
    } else {
        terminate(&mut child, a.stop_timeout).await
    };
    op.old_exit = Some(match status {
        Ok(st) => st.to_string(),
        Err(e) => format!("not awaited: {e}"),
    });
    tokio::time::sleep(after).await;
    let new = launch.spawn(&launch.log, true).await?;
    a.process = Process::Direct(new);
    Ok(())
}

/// SIGTERM, then the exit within `limit`, else SIGKILL.
async fn terminate(
    child: &mut Child,
    limit: Duration,
) -> std::io::Result<std::process::ExitStatus> {
    if let Some(pid) = child.id() {
        let _ = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .await;
    }
    match tokio::time::timeout(limit, child.wait()).await {
        Ok(st) => st,
        Err(_) => {
            let _ = child.kill().await;
            child.wait().await
        }
    }
}

/// The Kubernetes handover: a second agent beside the first; the first must exit by itself.
async fn upgrade(a: &mut Agent, op: &mut AgentOp) -> Result<(), String> {
    let launch = a
        .launch
        .clone()
        .ok_or("this health service cannot be upgraded")?;
    if a.supervisor == Supervisor::Systemd {
        return Err("agent_upgrade runs two direct processes".to_owned());
    }
    let log = a.dir.join("agent-upgrade.log");
    op.log = "agent-upgrade.log".to_owned();
    op.how = format!(
        "a second agent (same config, RUNTIME_DIRECTORY {}) beside pid {}; the first must exit by itself",
        launch.state_dir.display(),
        op.old_pid.map_or("?".to_owned(), |p| p.to_string())
    );
    a.note(&format!(
        "agent_upgrade (direct): {}; its log: agent-upgrade.log",
        op.how
    ));
    let mut second = launch.spawn(&log, false).await?;
    let Process::Direct(first) = &mut a.process else {
        return Err("no first agent".to_owned());
    };
    let end = Instant::now() + HANDOVER_LIMIT;
    loop {
        if let Ok(Some(st)) = first.try_wait() {
            op.old_exit = Some(st.to_string());
            a.note(&format!(
                "agent_upgrade: the first agent exited ({st}); the second (pid {}) is the agent now",
                second.id().map_or("?".to_owned(), |p| p.to_string())
            ));
            a.process = Process::Direct(second);
            return Ok(());
        }
        if let Ok(Some(st)) = second.try_wait() {
            let why = last_lines(&log, 3);
            a.note(&format!(
                "agent_upgrade: the second agent exited ({st}) without taking over"
            ));
            return Err(format!(
                "the second agent exited ({st}) without taking over; the first keeps running. agent-upgrade.log: {why}"
            ));
        }
        if Instant::now() >= end {
            let _ = terminate(&mut second, Duration::from_secs(5)).await;
            return Err(format!(
                "no handover within {HANDOVER_LIMIT:?}: the first agent did not exit; the second was stopped"
            ));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A restart, crash or outage of the agent's unit.
async fn under_systemd(
    a: &mut Agent,
    fault: Fault,
    s: f64,
    op: &mut AgentOp,
) -> Result<(), String> {
    let unit = match &a.process {
        Process::Systemd { unit, .. } => unit.clone(),
        _ => return Err("the agent's unit is gone".to_owned()),
    };
    let old = a.pid();
    let u = unit.as_str();
    match fault {
        Fault::AgentRestart => {
            op.how = format!("systemctl --user restart {u}");
            a.note(&format!("agent_restart (systemd): {}", op.how));
            a.systemctl(&["restart", u]).await?;
        }
        Fault::AgentCrash => {
            op.how = format!(
                "systemctl --user kill -s SIGKILL --kill-whom=main {u}; the manager restarts it (Restart=, RestartSec={:?})",
                a.restart_sec
            );
            a.note(&format!("agent_crash (systemd): {}", op.how));
            a.systemctl(&["kill", "-s", "SIGKILL", "--kill-whom=main", u])
                .await?;
            // The unit's new main process, once active.
            let end = Instant::now() + a.restart_sec + ANSWER_LIMIT;
            loop {
                let out = a
                    .systemctl(&["show", "-p", "MainPID", "-p", "ActiveState", u])
                    .await?;
                let pid = out
                    .lines()
                    .find_map(|l| l.strip_prefix("MainPID="))
                    .and_then(|v| v.trim().parse::<u32>().ok())
                    .filter(|p| *p != 0);
                if out.contains("ActiveState=active") && pid.is_some() && pid != old {
                    break;
                }
                if Instant::now() >= end {
                    return Err(format!(
                        "the manager did not restart {u} within {:?} ({})",
                        a.restart_sec + ANSWER_LIMIT,
                        out.trim().replace('\n', ", ")
                    ));
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        Fault::AgentOutage(d) => {
            let d = scaled(d, s);
            op.how = format!(
                "systemctl --user stop {u}; no agent for {d:?}; systemctl --user start {u}"
            );
            a.note(&format!("{fault} (systemd): {}", op.how));
            a.systemctl(&["stop", u]).await?;
            tokio::time::sleep(d).await;
            a.systemctl(&["start", u]).await?;
        }
        other => return Err(format!("{other} is not an agent restart")),
    }
    let pid = a.refresh_main_pid().await?;
    if pid.is_none() || pid == old {
        return Err(format!("{u} has no new main process (MainPID {pid:?})"));
    }
    priority::raise_group(pid).await;
    Ok(())
}

/// `systemctl --user <args>` of `m`, from async code (at most 60 s).
async fn run_systemctl(m: &UserManager, args: &[&str]) -> Result<String, String> {
    let mut cmd = Command::from(m.command());
    cmd.args(args).kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(60), cmd.output())
        .await
        .map_err(|_| format!("systemctl --user {}: no answer within 60 s", args.join(" ")))?
        .map_err(|e| format!("systemctl: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "systemctl --user {}: {}: {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// When `/status` first answers (any readable status), polling every 10 ms on fresh
/// connections (a pooled one could be the old process's).
async fn first_answer(url: &str) -> Option<Instant> {
    let client = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(2))
        .build()
        .ok()?;
    let end = Instant::now() + ANSWER_LIMIT;
    while Instant::now() < end {
        if let Ok(r) = client.get(url).send().await
            && let Ok(v) = r.json::<serde_json::Value>().await
            && v["status"].is_string()
        {
            return Some(Instant::now());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    None
}

/// Whether `pid` runs (not a zombie).
fn alive(pid: u32) -> bool {
    super::procfs::stat_field::<String>(pid, 3).is_some_and(|s| s != "Z")
}

fn scaled(d: Duration, s: f64) -> Duration {
    Duration::from_secs_f64(d.as_secs_f64() * s)
}

fn restart_sec(u: &systemd::UserUnit) -> Duration {
    u.service_value("RestartSec")
        .and_then(systemd::parse_timespan)
        .unwrap_or(DEFAULT_RESTART_SEC)
}

fn stop_timeout(u: &systemd::UserUnit) -> Duration {
    u.service_value("TimeoutStopSec")
        .or_else(|| u.service_value("TimeoutSec"))
        .and_then(systemd::parse_timespan)
        .unwrap_or(DEFAULT_STOP_TIMEOUT)
}

fn parent(p: &Path) -> PathBuf {
    p.parent()
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}

/// The last `n` non-empty lines of a file, on one line.
fn last_lines(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(n)..].join(" | ")
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
