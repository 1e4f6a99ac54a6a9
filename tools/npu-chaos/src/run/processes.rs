//! How each process of an experiment's stack is started: the fake engine (and how to start it
//! again), a real one, MindIE's engine server as the peer, and the agent under the supervisor
//! wanted; each on fresh ports, its output in a log of the experiment's directory. The
//! [`Stack`](super::stack::Stack) holds them once started.

use super::config::agent_toml;
use super::options::{Policy, RunOptions};
use crate::agent::{self, Agent, Supervisor};
use crate::experiment::Fault;
use crate::real_engine::RealEngine;
use crate::timescale::fake_engine_speed;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::process::{Child, Command};

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
    /// Flags a peer needs of the engine (`Peer::engine_args`).
    pub(super) peer_args: Vec<String>,
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
            .args(&self.peer_args)
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

/// A log file of the experiment's directory, as a child's output.
pub(super) fn log_file(dir: &Path, name: &str) -> Result<std::process::Stdio, String> {
    std::fs::File::create(dir.join(name))
        .map(std::process::Stdio::from)
        .map_err(|e| e.to_string())
}

/// The files of one experiment's stack, in its directory.
pub(super) struct StackFiles {
    pub(super) dir: PathBuf,
    /// The agent's state directory (RUNTIME_DIRECTORY of a direct start).
    pub(super) state_dir: PathBuf,
    /// The fake NPUs' AI Cube figures, one file each (what the engine or the follower writes).
    pub(super) npu_files: Vec<PathBuf>,
    /// The fake driver's scenario, reading those files.
    pub(super) scenario: PathBuf,
    /// The agent's config.
    pub(super) toml: PathBuf,
}

impl StackFiles {
    /// Creates the directory, a fresh state directory (an earlier run's state must not be
    /// taken back), two fake NPUs at rest, and the fake driver's scenario of them.
    pub(super) fn create(dir: &Path) -> Result<StackFiles, String> {
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
pub(super) async fn start_real_engine(
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
pub(super) struct AgentPorts {
    pub(super) engine: u16,
    pub(super) mgmt: u16,
}

/// Writes the agent's config; in a router row with the router's listener in the [agent]
/// table, on a port of its own (returned).
pub(super) fn write_agent_config(
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
pub(super) async fn start_mindie_peer(
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
pub(super) async fn start_agent(
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
