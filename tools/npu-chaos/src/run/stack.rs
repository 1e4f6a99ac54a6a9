//! The processes of one experiment: the engine (fake or real) behind the latency proxy, the
//! agent under its supervisor, and, in a router row, the router and the draft; started on
//! fresh ports, restarted where a port was taken, reached over loopback.

use super::config::agent_toml;
use super::options::{EngineKind, Policy, RunOptions};
use crate::agent::{self, Agent, Supervisor};
use crate::experiment::Fault;
use crate::proxy::Proxy;
use crate::real_engine::RealEngine;
use crate::timescale::{fake_engine_speed, scaled};
use npu_health_agent::monitor::Status;
use npu_health_agent::monitor::vi_state::Phase;
use npu_health_agent::probe::engine_metrics;
use npu_health_agent::server::wire::EngineDetail;
use serde_json::Value;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::process::{Child, Command};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Whether the engine's or the agent's log in an experiment's `dir` says a port was taken.
pub(super) fn port_was_taken(dir: &Path) -> bool {
    ["engine.log", "agent.log"].iter().any(|f| {
        std::fs::read_to_string(dir.join(f)).is_ok_and(|t| t.contains("Address already in use"))
    })
}

/// How often a stack is started afresh, on new ports, when a process of it could not bind
/// its port ("Address already in use": taken between the pick and the bind).
pub(super) const START_ATTEMPTS: usize = 3;

pub(super) fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// How the fake engine is started, kept to start it again (the kubelet's restarts).
#[derive(Debug, Clone)]
pub(super) struct FakeLaunch {
    pub(super) exe: PathBuf,
    pub(super) port: u16,
    pub(super) control_port: u16,
    pub(super) npu_files: Vec<PathBuf>,
    /// MindIE's own inference surface (`/health` is a JSON bool), for the peer.
    pub(super) mindie: bool,
    pub(super) s: f64,
}

impl FakeLaunch {
    pub(super) fn spawn(&self, stderr: std::process::Stdio) -> Result<Child, String> {
        let s = self.s;
        let mut cmd = Command::from(fake_engine::launch::command(
            &self.exe,
            self.port,
            self.control_port,
            "m",
            &self.npu_files,
        ));
        if self.mindie {
            cmd.args(["--profile", "mindie"]);
        }
        cmd.args(fake_engine_speed(s))
            .stderr(stderr)
            .kill_on_drop(true);
        cmd.spawn()
            .map_err(|e| format!("starting the fake engine: {e}"))
    }
}

/// The supervisor an experiment asks for the agent ([`wanted_supervisor`]).
#[derive(Debug, Clone, PartialEq)]
pub(super) struct WantedSupervisor {
    pub(super) supervisor: Supervisor,
    /// Asked for by `--agent-supervisor` (no fallback to direct).
    pub(super) required: bool,
    /// Why this one, when it is not what was asked.
    pub(super) note: Option<String>,
}

/// Who runs the agent in an experiment: what `--agent-supervisor` says (`choice`), else
/// systemd for an agent fault (the start falls back to direct, and says so, when no private
/// user manager can run here) and direct for everything else, as always. `agent_upgrade` is
/// Kubernetes' rolling update: two direct processes whatever was asked.
pub(super) fn wanted_supervisor(choice: Option<Supervisor>, fault: Fault) -> WantedSupervisor {
    let direct = |note: Option<String>| WantedSupervisor {
        supervisor: Supervisor::Direct,
        required: false,
        note,
    };
    match choice {
        _ if fault == Fault::AgentUpgrade => direct(
            (choice == Some(Supervisor::Systemd)).then(|| {
                "agent_upgrade runs two direct processes whatever --agent-supervisor says (Kubernetes has no systemd)".to_owned()
            }),
        ),
        Some(supervisor) => WantedSupervisor {
            supervisor,
            required: true,
            note: None,
        },
        None if fault.is_agent_fault() => WantedSupervisor {
            supervisor: Supervisor::Systemd,
            required: false,
            note: None,
        },
        None => direct(None),
    }
}

/// Running processes and in-process parts of one experiment.
pub(super) struct Stack {
    pub(super) dir: PathBuf,
    pub(super) engine: Option<Child>,
    /// How the fake engine was started (`None` for a real one).
    pub(super) relaunch: Option<FakeLaunch>,
    /// Restarts of the engine so far (each logs to `engine-restart<N>.log`).
    pub(super) restarts: u32,
    /// The real engine (`--engine vllm`) and the follower writing its Worker's CPU use as
    /// the NPUs' AI Cube figure.
    pub(super) real: Option<(RealEngine, npu_fake::follow::CpuFollower)>,
    pub(super) real_slot: std::sync::Arc<tokio::sync::Mutex<Option<RealEngine>>>,
    /// Whatever serves `/status` (the agent, or MindIE's engine server), shared with the
    /// task of an agent fault.
    pub(super) agent: std::sync::Arc<tokio::sync::Mutex<Agent>>,
    /// Who runs the agent, and why not the one wanted, if so.
    pub(super) supervisor: Supervisor,
    pub(super) supervisor_note: Option<String>,
    pub(super) engine_port: u16,
    pub(super) control: String,
    pub(super) mgmt: String,
    pub(super) proxy: Proxy,
    /// Stops the proxy (a child of the experiment's token).
    pub(super) proxy_cancel: CancellationToken,
    pub(super) http: reqwest::Client,
    /// `/status` is served by MindIE's engine server, not the agent.
    pub(super) peer: bool,
    /// The agent's listener the router reads, in a router row.
    pub(super) router_port: Option<u16>,
    /// The router in front and the draft behind it, once started ([`Stack::start_router`]).
    pub(super) router: Option<crate::router::Router>,
}

/// A log file of the experiment's directory, as a child's output.
fn log_file(dir: &Path, name: &str) -> Result<std::process::Stdio, String> {
    std::fs::File::create(dir.join(name))
        .map(std::process::Stdio::from)
        .map_err(|e| e.to_string())
}

/// The files of one experiment's stack, in its directory.
struct StackFiles {
    dir: PathBuf,
    /// The agent's state directory (RUNTIME_DIRECTORY of a direct start).
    state_dir: PathBuf,
    /// The fake NPUs' AI Cube figures, one file each (what the engine or the follower writes).
    npu_files: Vec<PathBuf>,
    /// The fake driver's scenario, reading those files.
    scenario: PathBuf,
    /// The agent's config.
    toml: PathBuf,
}

impl StackFiles {
    /// Creates the directory, a fresh state directory (an earlier run's state must not be
    /// taken back), two fake NPUs at rest, and the fake driver's scenario of them.
    fn create(dir: &Path) -> Result<StackFiles, String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let state_dir = dir.join("run");
        let _ = std::fs::remove_dir_all(&state_dir);
        std::fs::create_dir_all(&state_dir).map_err(|e| format!("{}: {e}", state_dir.display()))?;
        let npu_files: Vec<PathBuf> = (0..2).map(|i| dir.join(format!("npu{i}"))).collect();
        for f in &npu_files {
            std::fs::write(f, "0\n").map_err(|e| format!("{}: {e}", f.display()))?;
        }
        let scenario = dir.join("scenario.toml");
        let mut text = "model = \"910B\"\ncards = 2\n".to_owned();
        for (i, f) in npu_files.iter().enumerate() {
            text.push_str(&format!(
                "[[device]]\nid = {i}\naicube = {{ file = {:?} }}\nhbm_total_mb = 65536\nhbm_used_mb = 58000\n",
                f.display().to_string()
            ));
        }
        std::fs::write(&scenario, text).map_err(|e| e.to_string())?;
        Ok(StackFiles {
            dir: dir.to_owned(),
            state_dir,
            npu_files,
            scenario,
            toml: dir.join("agent.toml"),
        })
    }
}

/// The real engine (the one kept from the last experiment while it lives), and the follower
/// writing its Worker's CPU use as the NPUs' AI Cube figure.
async fn start_real_engine(
    opts: &RunOptions,
    npu_files: &[PathBuf],
) -> Result<(RealEngine, npu_fake::follow::CpuFollower), String> {
    let mut slot = opts.real.lock().await;
    let reuse = slot.as_ref().filter(|r| r.alive()).cloned();
    let r = match reuse {
        Some(r) => r,
        None => {
            if let Some(old) = slot.take() {
                old.down().await;
            }
            eprintln!("npu-chaos:   starting a real vLLM (scripts/real-vllm up) ...");
            RealEngine::up(&opts.real_vllm_script).await?
        }
    };
    *slot = Some(r.clone());
    let follower = npu_fake::follow::CpuFollower::spawn(
        r.worker_pid_file(),
        npu_files.to_vec(),
        Duration::from_millis(100),
    );
    Ok((r, follower))
}

/// The ports whatever serves `/status` uses: the engine's (through the proxy) and its own.
#[derive(Debug, Clone, Copy)]
struct AgentPorts {
    engine: u16,
    mgmt: u16,
}

/// Writes the agent's config; in a router row with the router's listener in the [agent]
/// table, on a port of its own (returned).
fn write_agent_config(
    opts: &RunOptions,
    policy: Policy,
    files: &StackFiles,
    ports: AgentPorts,
) -> Result<Option<u16>, String> {
    let router_port = match opts.row.router() {
        Some(_) => Some(
            fake_engine::launch::free_ports::<1>().map_err(|e| format!("no free port: {e}"))?[0],
        ),
        None => None,
    };
    let agent_extra = match (opts.row.router(), router_port) {
        (Some(r), Some(p)) => r.agent_line(p),
        _ => String::new(),
    };
    let text = agent_toml(
        ports.engine,
        ports.mgmt,
        files.npu_files.len(),
        policy,
        opts.time_scale,
        opts.engine,
        opts.model(),
    )
    .replacen("[agent]\n", &format!("[agent]\n{agent_extra}"), 1);
    std::fs::write(&files.toml, text).map_err(|e| e.to_string())?;
    Ok(router_port)
}

/// MindIE's engine server serving `/status` in the agent's place (the `mindie` policy).
async fn start_mindie_peer(
    p: &crate::pymotor::Pymotor,
    opts: &RunOptions,
    files: &StackFiles,
    ports: AgentPorts,
) -> Result<Agent, String> {
    let dir = &files.dir;
    // The fake npu-smi is the agent binary under that name.
    let npu_smi = dir.join("bin/npu-smi");
    std::fs::create_dir_all(dir.join("bin")).map_err(|e| e.to_string())?;
    let _ = std::fs::remove_file(&npu_smi);
    std::os::unix::fs::symlink(&opts.agent_exe, &npu_smi)
        .map_err(|e| format!("{}: {e}", npu_smi.display()))?;
    let args: Vec<String> = [
        "--engine-port",
        &ports.engine.to_string(),
        "--mgmt-port",
        &ports.mgmt.to_string(),
        "--model",
        opts.model(),
        "--device-id",
        "0",
        "--npu-smi",
    ]
    .iter()
    .map(|a| a.to_string())
    .chain([npu_smi.display().to_string()])
    .collect();
    let mut cmd = p.health_service_command(
        crate::pymotor::ENGINE_SERVER_PY,
        &args,
        &dir.join("agent.log"),
    )?;
    cmd.env("FAKE_NPU_SCENARIO", &files.scenario)
        .stdout(std::process::Stdio::null());
    let child = cmd.spawn().map_err(|e| {
        format!("starting MindIE's engine server (through `setsid` and `nice`): {e}")
    })?;
    // Whatever serves `/status` gets the CPU priority a node's health service has.
    crate::priority::raise_group(child.id()).await;
    Ok(Agent::other(child, dir))
}

/// The agent under the supervisor wanted, or directly when systemd was only preferred and
/// cannot run here; with the note on the supervisor (the wanted one's, or why not systemd).
/// Whatever serves `/status` gets the CPU priority a node's health service has (the
/// agent's start raises it).
async fn start_agent(
    opts: &RunOptions,
    want: &WantedSupervisor,
    files: &StackFiles,
) -> Result<(Agent, Option<String>), String> {
    let s = opts.time_scale;
    let launch = agent::Launch {
        exe: opts.agent_exe.clone(),
        config: files.toml.clone(),
        scenario: files.scenario.clone(),
        state_dir: files.state_dir.clone(),
        log: files.dir.join("agent.log"),
    };
    let mut note = want.note.clone();
    let agent = match want.supervisor {
        Supervisor::Direct => Agent::start_direct(launch, s).await,
        Supervisor::Systemd => match crate::systemd::preflight().err() {
            Some(why) if !want.required => {
                note = Some(format!(
                    "no private systemd user manager here ({why}): the agent runs directly"
                ));
                Agent::start_direct(launch, s).await
            }
            Some(why) => Err(format!("--agent-supervisor systemd: {why}")),
            None => Agent::start_systemd(launch, s).await,
        },
    }?;
    Ok((agent, note))
}

impl Stack {
    pub(super) async fn start(
        opts: &RunOptions,
        dir: &Path,
        policy: Policy,
        want: &WantedSupervisor,
        cancel: &CancellationToken,
    ) -> Result<Stack, String> {
        let s = opts.time_scale;
        let files = StackFiles::create(dir)?;
        let [fake_port, control_port, mgmt_port] =
            fake_engine::launch::free_ports().map_err(|e| format!("no free port: {e}"))?;
        let (engine, relaunch, real, engine_port) = match opts.engine {
            EngineKind::Fake => {
                let launch = FakeLaunch {
                    exe: opts.agent_exe.clone(),
                    port: fake_port,
                    control_port,
                    npu_files: files.npu_files.clone(),
                    mindie: policy == Policy::Mindie,
                    s,
                };
                let engine = launch.spawn(log_file(dir, "engine.log")?)?;
                (Some(engine), Some(launch), None, fake_port)
            }
            EngineKind::Vllm => {
                let (r, follower) = start_real_engine(opts, &files.npu_files).await?;
                let port = r.port;
                (None, None, Some((r, follower)), port)
            }
        };
        // In process, so it binds port 0 and there is no pick-then-bind race.
        let proxy_cancel = cancel.child_token();
        let proxy = Proxy::start(loopback(0), loopback(engine_port), proxy_cancel.clone())
            .await
            .map_err(|e| format!("starting the proxy: {e}"))?;
        let ports = AgentPorts {
            engine: proxy.addr.port(),
            mgmt: mgmt_port,
        };
        let router_port = write_agent_config(opts, policy, &files, ports)?;
        let (agent, supervisor, supervisor_note) = match (policy, &opts.pymotor) {
            (Policy::Mindie, Some(p)) => {
                let peer = start_mindie_peer(p, opts, &files, ports).await?;
                (peer, Supervisor::Direct, want.note.clone())
            }
            (Policy::Mindie, None) => {
                return Err("the mindie-3.0.0b2 peer needs `scripts/pymotor install`".to_owned());
            }
            _ => match start_agent(opts, want, &files).await {
                Ok((agent, note)) => {
                    let supervisor = agent.supervisor;
                    (agent, supervisor, note)
                }
                Err(e) => {
                    proxy_cancel.cancel();
                    return Err(e);
                }
            },
        };
        // The emulator's poll timeout, scaled: one slow answer must not stall the sampling.
        let http = reqwest::Client::builder()
            .no_proxy()
            .timeout(scaled(Duration::from_secs(5), s).max(Duration::from_millis(100)))
            .build()
            .map_err(|e| e.to_string())?;
        Ok(Stack {
            dir: dir.to_owned(),
            engine,
            relaunch,
            restarts: 0,
            real,
            real_slot: opts.real.clone(),
            agent: std::sync::Arc::new(tokio::sync::Mutex::new(agent)),
            supervisor,
            supervisor_note,
            engine_port,
            control: format!("http://127.0.0.1:{control_port}"),
            mgmt: format!("http://127.0.0.1:{mgmt_port}"),
            proxy,
            proxy_cancel,
            http,
            peer: policy == Policy::Mindie,
            router_port,
            router: None,
        })
    }

    /// In a router row: starts the draft engine and the router in front of the proxy (what
    /// the load reached before), reading the agent's listener.
    pub(super) async fn start_router(&mut self, opts: &RunOptions) -> Result<(), String> {
        let (Some(kind), Some(agent_port)) = (opts.row.router(), self.router_port) else {
            return Ok(());
        };
        let r = crate::router::Router::start(
            kind,
            &self.dir,
            &crate::router::Placement {
                main: self.proxy.addr,
                agent_port,
                engine: "chaos",
                model: opts.model(),
                agent_exe: &opts.agent_exe,
                repo: &opts.repo,
                time_scale: opts.time_scale,
            },
        )
        .await?;
        eprintln!(
            "npu-chaos:   the load goes through {} on {} (the draft engine on port {})",
            kind.as_str(),
            r.front,
            r.draft_port
        );
        self.router = Some(r);
        Ok(())
    }

    /// Where the load sends its requests: the router in a router row, else the proxy.
    pub(super) fn load_base(&self) -> String {
        match &self.router {
            Some(r) => format!("http://{}", r.front),
            None => format!("http://{}", self.proxy.addr),
        }
    }

    /// Sends `sig` to the engine's own process: the fake engine, or a real engine's API
    /// server (the process listening on its port).
    pub(super) async fn signal_engine(&self, sig: &str) -> Result<(), String> {
        let pid = match (&self.engine, &self.real) {
            (Some(e), _) => e.id(),
            (None, Some((r, _))) => Some(r.api_pid),
            (None, None) => None,
        };
        let pid = pid.ok_or_else(|| "the engine has no process".to_owned())?;
        let status = tokio::process::Command::new("kill")
            .args([format!("-{sig}"), pid.to_string()])
            .status()
            .await
            .map_err(|e| format!("kill -{sig} {pid}: {e}"))?;
        status
            .success()
            .then_some(())
            .ok_or_else(|| format!("kill -{sig} {pid}: {status}"))
    }

    /// Sends `sig` to the real engine's EngineCore.
    pub(super) async fn signal_real(&self, sig: &str) -> Result<(), String> {
        match &self.real {
            Some((r, _)) => r.signal_core(sig).await,
            None => Err("no real engine".to_owned()),
        }
    }

    /// `url`'s JSON as `T` (the agent's typed answers, `server::wire`); `None` when it does
    /// not answer or the answer is not a `T`.
    pub(super) async fn get_json<T: serde::de::DeserializeOwned>(&self, url: &str) -> Option<T> {
        self.http.get(url).send().await.ok()?.json().await.ok()
    }

    pub(super) async fn status(&self) -> String {
        match self.http.get(format!("{}/status", self.mgmt)).send().await {
            Ok(r) => match r.json::<Value>().await {
                Ok(v) => v["status"].as_str().unwrap_or("garbled").to_owned(),
                Err(_) => "garbled".to_owned(),
            },
            Err(_) => "down".to_owned(),
        }
    }

    /// Applies a fault patch on the fake engine's control surface.
    pub(super) async fn faults(&self, patch: Value) -> Result<(), String> {
        let r = self
            .http
            .post(format!("{}/fake/faults", self.control))
            .json(&patch)
            .send()
            .await
            .map_err(|e| format!("fault control: {e}"))?;
        if r.status().is_success() {
            Ok(())
        } else {
            Err(format!(
                "fault patch {patch} refused: {}",
                r.text().await.unwrap_or_default()
            ))
        }
    }

    pub(super) async fn queue_depth(&self) -> Option<f64> {
        let text = self
            .http
            .get(format!("http://127.0.0.1:{}/metrics", self.engine_port))
            .send()
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        engine_metrics::parse(&text).waiting
    }

    /// Kills the engine, as Node Manager's daemon does (a real one: every process of it).
    pub(super) async fn kill_engine(&mut self) {
        if let Some(mut e) = self.engine.take() {
            let _ = e.kill().await;
        }
        if let Some((r, _)) = self.real.take() {
            r.down().await;
            r.save_log(&self.dir.join("vllm.log"));
            *self.real_slot.lock().await = None;
        }
    }

    /// Whether the engine's process is gone (killed, or exited by itself).
    pub(super) fn engine_exited(&mut self) -> bool {
        match self.engine.as_mut() {
            None => true,
            Some(e) => matches!(e.try_wait(), Ok(Some(_))),
        }
    }

    /// Restarts the fake engine in place, as the kubelet restarts a container: the old
    /// process (if any) is killed and reaped, a new one starts on the same ports with fresh
    /// state (no fault).
    pub(super) async fn restart_engine(&mut self) -> Result<(), String> {
        let launch = self
            .relaunch
            .clone()
            .ok_or("only the fake engine can be restarted")?;
        if let Some(mut e) = self.engine.take() {
            let _ = e.kill().await;
        }
        self.restarts += 1;
        let log = std::fs::File::create(
            self.dir
                .join(format!("engine-restart{}.log", self.restarts)),
        )
        .map_err(|e| e.to_string())?;
        self.engine = Some(launch.spawn(std::process::Stdio::from(log))?);
        Ok(())
    }

    /// Points the NPUs at `text` instead of the real Worker's CPU (`None`: follow it again).
    pub(super) fn npu_override(&self, text: Option<&str>) {
        if let Some((_, f)) = &self.real {
            f.set_override(text.map(str::to_owned));
        }
    }

    /// Starts a stack and waits until virtual inference runs (the warm-up succeeded), within
    /// `limit` per attempt. A stack whose engine or agent could not bind its port is started
    /// again on new ports, up to [`START_ATTEMPTS`] times; any other failure is final.
    pub(super) async fn start_ready(
        opts: &RunOptions,
        dir: &Path,
        policy: Policy,
        want: &WantedSupervisor,
        cancel: &CancellationToken,
        limit: Duration,
    ) -> Result<Stack, String> {
        let mut attempt = 1;
        loop {
            // Under systemd the start itself fails when the agent cannot bind (it never says
            // READY=1); directly, the wait below sees it exit.
            let (stack, err) = match Stack::start(opts, dir, policy, want, cancel).await {
                Ok(mut stack) => match stack.wait_ready(limit).await {
                    Ok(()) => return Ok(stack),
                    Err(e) => (Some(stack), e),
                },
                Err(e) => (None, e),
            };
            match stack {
                _ if attempt < START_ATTEMPTS && port_was_taken(dir) => {
                    eprintln!(
                        "npu-chaos:   a port was taken; starting again on new ports (attempt {} \
                         of {START_ATTEMPTS}; the failed one's logs are kept as attempt{attempt}-*.log)",
                        attempt + 1
                    );
                    if let Some(stack) = stack {
                        stack.stop().await;
                    }
                    // Kept for a look: the next attempt writes new logs.
                    for log in ["engine.log", "agent.log"] {
                        let _ = std::fs::rename(
                            dir.join(log),
                            dir.join(format!("attempt{attempt}-{log}")),
                        );
                    }
                    attempt += 1;
                }
                Some(stack) => {
                    stack.stop().await;
                    return Err(err);
                }
                None => return Err(err),
            }
        }
    }

    /// Kills and reaps the stack's processes and stops its proxy. A real engine that is
    /// still healthy is kept for the next experiment (only its stop signal is undone).
    pub(super) async fn stop(mut self) {
        if let Some((r, f)) = self.real.take() {
            drop(f);
            let _ = r.signal_core("CONT").await;
            r.save_log(&self.dir.join("vllm.log"));
        }
        self.kill_engine().await;
        self.agent.lock().await.stop().await;
        self.proxy_cancel.cancel();
    }

    /// Waits until virtual inference runs (the warm-up succeeded).
    pub(super) async fn wait_ready(&mut self, limit: Duration) -> Result<(), String> {
        let end = Instant::now() + limit;
        while Instant::now() < end {
            if let Some(why) = self.agent.lock().await.exited().await {
                return Err(format!(
                    "{why}; see {}",
                    self.dir.join("agent.log").display()
                ));
            }
            if let Some(Ok(Some(st))) = self.engine.as_mut().map(|e| e.try_wait()) {
                return Err(format!(
                    "the fake engine exited ({st}); see {}",
                    self.dir.join("engine.log").display()
                ));
            }
            if self.peer {
                // MindIE's engine server: its virtual inference starts at the first `/status`
                // that sees a healthy `/health`, which then answers `normal`.
                if self.status().await == "normal" {
                    return Ok(());
                }
            } else if let Some(d) = self
                .get_json::<EngineDetail>(&format!("{}/status/detail", self.mgmt))
                .await
                && d.status == Status::Normal
                && d.virtual_inference.phase == Phase::Running
            {
                return Ok(());
            }
            // The first healthy /status starts virtual inference (as Node Manager's would).
            let _ = self.status().await;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err(format!(
            "virtual inference did not start within {limit:?}; see {}",
            self.dir.join("agent.log").display()
        ))
    }
}
