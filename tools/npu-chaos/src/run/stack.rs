//! The processes of one experiment: the engine (fake or real) behind the latency proxy, the
//! agent under its supervisor, and, in a router row, the router and the draft; started on
//! fresh ports, restarted where a port was taken, reached over loopback.

use super::options::{EngineKind, Policy, RunOptions};
use super::processes::{
    AgentPorts, FakeLaunch, START_ATTEMPTS, StackFiles, WantedSupervisor, log_file, loopback,
    port_was_taken, start_agent, start_mindie_peer, start_real_engine, write_agent_config,
};
use crate::agent::{Agent, Supervisor};
use crate::proxy::Proxy;
use crate::real_engine::RealEngine;
use crate::timescale::scaled;
use npu_health_agent::probe::engine_metrics;
use npu_health_wire::EngineDetail;
use npu_health_wire::Phase;
use npu_health_wire::Status;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::process::Child;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

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
                    peer_args: policy.peer().map(|p| p.engine_args(s)).unwrap_or_default(),
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

    /// `url`'s JSON as `T` (the agent's typed answers, `npu_health_wire`); `None` when it does
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
