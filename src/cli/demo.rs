//! `demo` (fake-driver builds): the agent on its embedded default, end to end.
//!
//! Starts, as real processes on loopback, the agent (`--fake run`, so the fake `libdcmi.so`
//! is dlopen'd through the production path) and, once it answers `initial`, the fake engine
//! (whose load drives the fake NPU usage through small files); prints the URLs and shows
//! `/status` going `initial` → `normal`. Ctrl-C (or `--duration`) stops both; the demo fails
//! if the agent dies or `/status` never goes `initial` → `normal`.

use super::CliError;
use anyhow::Context;
use fake_engine::engine::{EngineOptions, run as run_engine};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tokio::process::{Child, Command};
use tokio_util::sync::CancellationToken;

/// `demo` flags.
#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// Stop after this long (default: run until Ctrl-C).
    #[arg(long, value_parser = super::parse_duration)]
    pub duration: Option<Duration>,
    /// Send this many concurrent streaming requests to the engine, to show AI Cube usage rise.
    #[arg(long, default_value_t = 0)]
    pub load: usize,
}

/// `fake-engine` flags.
#[derive(Debug, clap::Args)]
pub struct FakeEngineArgs {
    /// Inference address.
    #[arg(long, default_value = "127.0.0.1:8000")]
    pub listen: SocketAddr,
    /// Fault-control address.
    #[arg(long, default_value = "127.0.0.1:8100")]
    pub control: SocketAddr,
    /// Served model name.
    #[arg(long, default_value = "fake-model")]
    pub model: String,
    /// Another name requests may ask for (repeat for several; vLLM's further
    /// `--served-model-name` values): answers still carry `--model`.
    #[arg(long = "alias")]
    pub aliases: Vec<String>,
    /// File the AI Cube figure is written to (repeat for several NPUs).
    #[arg(long = "npu-file")]
    pub npu_files: Vec<PathBuf>,
    /// AI Cube usage with one request running.
    #[arg(long, default_value_t = 60)]
    pub busy_usage: u8,
    /// Time to first token.
    #[arg(long, default_value = "20ms", value_parser = super::parse_duration)]
    pub ttft: Duration,
    /// Time per output token.
    #[arg(long, default_value = "5ms", value_parser = super::parse_duration)]
    pub tpot: Duration,
    /// Requests decoded at once.
    #[arg(long, default_value_t = 64)]
    pub max_running: usize,
    /// The engine imitated: vLLM 0.8, 0.10, 0.18, 0.33, or mindie (MindIE's engine server).
    #[arg(long, default_value = "0.33")]
    pub profile: fake_engine::profile::Profile,
    /// Data-parallel engines (one `engine` label value each in /metrics).
    #[arg(long, default_value_t = 1)]
    pub data_parallel: u32,
    /// Close a keep-alive connection idle this long (uvicorn's 5 s).
    #[arg(long, default_value = "5s", value_parser = super::parse_duration)]
    pub keep_alive: Duration,
}

/// Runs the fake engine until SIGTERM/SIGINT.
pub async fn fake_engine(a: FakeEngineArgs) -> Result<(), CliError> {
    let cancel = CancellationToken::new();
    let c = cancel.clone();
    tokio::spawn(async move {
        use tokio::signal::unix::{SignalKind, signal};
        if let (Ok(mut t), Ok(mut i)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) {
            tokio::select! { _ = t.recv() => {}, _ = i.recv() => {} }
        }
        c.cancel();
    });
    let opts = EngineOptions {
        listen: a.listen,
        control: a.control,
        model: a.model,
        aliases: a.aliases,
        npu_files: a.npu_files,
        busy_usage: a.busy_usage,
        ttft: a.ttft,
        tpot: a.tpot,
        max_running: a.max_running,
        profile: a.profile,
        data_parallel: a.data_parallel,
        keep_alive: a.keep_alive,
    };
    run_engine(opts, cancel).await.context("fake engine")?;
    Ok(())
}

fn write_files(
    dir: &Path,
    engine: u16,
    mgmt: u16,
    admin: u16,
) -> std::io::Result<(PathBuf, PathBuf)> {
    for f in ["npu0", "npu1"] {
        std::fs::write(dir.join(f), "0\n")?;
    }
    let scenario = dir.join("scenario.toml");
    std::fs::write(
        &scenario,
        "# Demo scenario: two 910B NPUs whose AI Cube figure the fake engine writes.\n\
         model = \"910B\"\ncards = 2\n\
         [[device]]\nid = 0\naicube = { file = \"npu0\" }\n\
         [[device]]\nid = 1\naicube = { file = \"npu1\" }\n",
    )?;
    let agent = dir.join("agent.toml");
    // The state directory: the demo's agent survives its own restart as a production one.
    let state = dir.join("run").display().to_string();
    std::fs::write(
        &agent,
        format!(
            "[agent]\nadmin_listen = \"127.0.0.1:{admin}\"\nstate_dir = {state:?}\n\n\
             [[engine]]\nname = \"demo\"\nengine_type = \"vllm\"\nserved_model_name = \"demo-model\"\n\
             host = \"127.0.0.1\"\nport = {engine}\nmgmt_port = {mgmt}\ndevices = [0, 1]\n\
             engine_env = {{ ASCEND_GLOBAL_LOG_LEVEL = \"3\" }}\n\
             [engine.health_check_config]\nenable_virtual_inference = true\n"
        ),
    )?;
    Ok((scenario, agent))
}

/// What an idle hang leads to under the engine's policy in force.
fn hang_hint(e: &crate::config::EngineSpec) -> String {
    let hc = &e.health_check_config;
    match e.agent_policy_in_force() {
        Some(a) => format!(
            "an idle hang, policy {}: abnormal after {} failed probes, each confirmed by a re-probe {:?} later (the NPU idle, no token)",
            e.policy.value.as_str(),
            a.confirm_failures,
            a.confirm_interval
        ),
        None => format!(
            "an idle hang, policy {}: abnormal after {} failed probes, {:?} apart",
            e.policy.value.as_str(),
            hc.max_failure_count,
            e.timing.interval
        ),
    }
}

/// The fake engine's fault keys (`POST /fake/faults`), and the hot reload's `pause_ms`.
fn fault_keys() -> Vec<String> {
    let mut keys: Vec<String> = match serde_json::to_value(fake_engine::engine::Faults::default()) {
        Ok(serde_json::Value::Object(m)) => m.keys().cloned().collect(),
        _ => Vec::new(),
    };
    keys.push("pause_ms".to_owned());
    keys
}

async fn stop(mut child: Child, name: &str) {
    if let Some(pid) = child
        .id()
        .and_then(|p| rustix::process::Pid::from_raw(p as i32))
    {
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
    }
    if tokio::time::timeout(Duration::from_secs(5), child.wait())
        .await
        .is_err()
    {
        eprintln!("demo: {name} did not stop within 5s; killing it");
        let _ = child.kill().await;
    }
}

/// The demo's binary, directory, ports and files.
struct Setup {
    exe: PathBuf,
    dir: PathBuf,
    /// This process's id: the children exit with it.
    me: String,
    engine_port: u16,
    control_port: u16,
    mgmt_port: u16,
    admin_port: u16,
    scenario: PathBuf,
    agent_toml: PathBuf,
}

impl Setup {
    /// Picks the ports and writes the files in a fresh directory.
    fn prepare() -> Result<Setup, CliError> {
        let exe = std::env::current_exe().context("locating this binary")?;
        let dir =
            std::env::temp_dir().join(format!("npu-health-agent-demo-{}", std::process::id()));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let [engine_port, control_port, mgmt_port, admin_port] = crate::fake::free_ports()?;
        let (scenario, agent_toml) =
            write_files(&dir, engine_port, mgmt_port, admin_port).context("writing demo files")?;
        Ok(Setup {
            exe,
            dir,
            me: std::process::id().to_string(),
            engine_port,
            control_port,
            mgmt_port,
            admin_port,
            scenario,
            agent_toml,
        })
    }

    /// Starts the agent on the fake driver.
    fn start_agent(&self) -> Result<Child, CliError> {
        // Both children get SIGTERM when the demo dies, even by SIGKILL (no handler of ours
        // runs then): `--exit-with-parent` sets Linux's parent-death signal in them.
        let agent = Command::new(&self.exe)
            .args(["--exit-with-parent", &self.me, "--fake", "run", "--config"])
            .arg(&self.agent_toml)
            .env("FAKE_NPU_SCENARIO", &self.scenario)
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".to_owned()),
            )
            .kill_on_drop(true)
            .spawn()
            .context("starting the agent")?;
        Ok(agent)
    }

    /// Where to look, and what to try.
    fn print_urls(&self) -> Result<(), CliError> {
        let (engine_port, control_port) = (self.engine_port, self.control_port);
        let (mgmt_port, admin_port) = (self.mgmt_port, self.admin_port);
        println!("demo: files in {}", self.dir.display());
        println!(
            "demo: fake engine   http://127.0.0.1:{engine_port}  (faults: http://127.0.0.1:{control_port}/fake/faults)"
        );
        println!("demo: /status       http://127.0.0.1:{mgmt_port}/status");
        println!("demo: detail        http://127.0.0.1:{mgmt_port}/status/detail");
        println!("demo: QoS           http://127.0.0.1:{mgmt_port}/qos");
        println!(
            "demo: metrics       http://127.0.0.1:{mgmt_port}/metrics  (all: http://127.0.0.1:{admin_port}/metrics)"
        );
        println!(
            "demo: kubelet       http://127.0.0.1:{mgmt_port}/readyz  http://127.0.0.1:{mgmt_port}/livez"
        );
        println!("demo: live page     http://127.0.0.1:{admin_port}/");
        let cfg =
            crate::config::file::load(&self.agent_toml).context("reading the demo's agent.toml")?;
        if let Some(e) = cfg.engines.first() {
            println!(
                "demo: try  curl -X POST -d '{{\"hang\":true}}' http://127.0.0.1:{control_port}/fake/faults  ({})",
                hang_hint(e)
            );
        }
        println!(
            "demo:      fault keys: {} (docs/fake-driver.md); POST /fake/reset clears them",
            fault_keys().join(", ")
        );
        Ok(())
    }

    /// Starts the fake engine, and `load` streams of requests to it.
    fn start_engine(
        &self,
        client: &reqwest::Client,
        load: usize,
        stop_load: &CancellationToken,
    ) -> Result<Child, CliError> {
        println!("demo: starting the fake engine");
        let npu_files = [self.dir.join("npu0"), self.dir.join("npu1")];
        let mut cmd = Command::from(crate::fake::engine_command(
            &self.exe,
            self.engine_port,
            self.control_port,
            "demo-model",
            &npu_files,
        ));
        let engine = cmd
            .args(["--exit-with-parent", &self.me])
            .kill_on_drop(true)
            .spawn()
            .context("starting the fake engine")?;
        for _ in 0..load {
            spawn_load(
                client.clone(),
                format!("http://127.0.0.1:{}/v1/completions", self.engine_port),
                stop_load.clone(),
            );
        }
        Ok(engine)
    }
}

/// Why the demo's watch ended.
enum Ended {
    /// A signal (no verdict expected then).
    Signalled,
    /// `--duration` passed.
    Deadline,
    /// The agent died: how to see why.
    AgentExited(String),
}

/// What the demo has seen of the agent, and the engine once started.
struct Watch {
    started: Instant,
    last_status: String,
    last_level: String,
    seen_initial: bool,
    seen_normal: bool,
    /// The engine comes up only once the agent answers `initial`, as after a model load.
    engine: Option<Child>,
}

impl Watch {
    /// Prints `/status` with the detail's reason when it changed.
    async fn status(&mut self, client: &reqwest::Client, mgmt_port: u16) {
        let status = match client
            .get(format!("http://127.0.0.1:{mgmt_port}/status"))
            .timeout(Duration::from_secs(5))
            .send()
            .await
        {
            Ok(r) => r.text().await.unwrap_or_default(),
            Err(_) => "(not listening yet)".to_owned(),
        };
        if status == self.last_status {
            return;
        }
        let detail: serde_json::Value = match client
            .get(format!("http://127.0.0.1:{mgmt_port}/status/detail"))
            .send()
            .await
        {
            Ok(r) => r.json().await.unwrap_or_default(),
            Err(_) => serde_json::Value::Null,
        };
        println!(
            "demo: {:>6.1}s  /status {status}  {}",
            self.started.elapsed().as_secs_f64(),
            detail["reason"].as_str().unwrap_or("")
        );
        self.seen_initial |= status == r#"{"status":"initial"}"#;
        self.seen_normal |= status == r#"{"status":"normal"}"#;
        self.last_status = status;
    }

    /// Prints the QoS level when it changed.
    async fn qos(&mut self, client: &reqwest::Client, mgmt_port: u16) {
        let Ok(r) = client
            .get(format!("http://127.0.0.1:{mgmt_port}/qos"))
            .send()
            .await
        else {
            return;
        };
        let q: serde_json::Value = r.json().await.unwrap_or_default();
        if let (Some(level), Some(score)) = (q["level"].as_str(), q["score"].as_f64())
            && level != self.last_level
        {
            println!(
                "demo: {:>6.1}s  QoS level {level} (score {score:.3})",
                self.started.elapsed().as_secs_f64()
            );
            self.last_level = level.to_owned();
        }
    }
}

/// Polls the agent every 100 ms, starting the engine once it answers `initial`, until a
/// signal, the deadline, or the agent's death. A failed engine start is returned as is.
async fn watch(
    s: &Setup,
    args: &DemoArgs,
    agent: &mut Child,
    signals: &mut crate::service::signals::Signals,
    w: &mut Watch,
    stop_load: &CancellationToken,
) -> Result<Ended, CliError> {
    let client = reqwest::Client::builder()
        .no_proxy()
        .build()
        .context("HTTP client")?;
    let deadline = args.duration.map(|d| w.started + d);
    loop {
        if let Ok(Some(status)) = agent.try_wait() {
            return Ok(Ended::AgentExited(format!(
                "the agent exited ({status}); run it alone to see why: RUST_LOG=info {} --fake run --config {}",
                s.exe.display(),
                s.agent_toml.display()
            )));
        }
        w.status(&client, s.mgmt_port).await;
        w.qos(&client, s.mgmt_port).await;
        if w.engine.is_none() && w.seen_initial {
            w.engine = Some(s.start_engine(&client, args.load, stop_load)?);
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Ok(Ended::Deadline);
        }
        tokio::select! {
            req = signals.next() => {
                println!("demo: {}; stopping the agent and the fake engine", match req {
                    crate::service::signals::Signalled::Stop(name) => name,
                    crate::service::signals::Signalled::Reload => "SIGHUP",
                });
                return Ok(Ended::Signalled);
            }
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
    }
}

/// Runs the demo.
pub async fn demo(args: DemoArgs) -> Result<(), CliError> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    // SIGTERM, SIGINT and SIGHUP all end the demo, and it stops what it started.
    let mut signals =
        crate::service::signals::Signals::install().context("installing signal handlers")?;
    let stopped_early = signals.early().is_some();
    let setup = Setup::prepare()?;
    let mut agent = setup.start_agent()?;
    setup.print_urls()?;
    let mut w = Watch {
        started: Instant::now(),
        last_status: String::new(),
        last_level: String::new(),
        seen_initial: false,
        seen_normal: false,
        engine: None,
    };
    let stop_load = CancellationToken::new();
    let ended = if stopped_early {
        Ended::Signalled
    } else {
        watch(&setup, &args, &mut agent, &mut signals, &mut w, &stop_load).await?
    };
    stop_load.cancel();
    stop(agent, "agent").await;
    if let Some(e) = w.engine.take() {
        stop(e, "fake engine").await;
    }
    let _ = std::fs::remove_dir_all(&setup.dir);
    match ended {
        Ended::Signalled => Ok(()),
        Ended::AgentExited(why) => Err(CliError::from(anyhow::anyhow!(why))),
        Ended::Deadline if !(w.seen_initial && w.seen_normal) => {
            Err(CliError::from(anyhow::anyhow!(
                "/status did not go initial → normal (initial seen: {}, normal seen: {})",
                w.seen_initial,
                w.seen_normal
            )))
        }
        Ended::Deadline => Ok(()),
    }
}

/// Streams completions to the engine until `stop`, to show the NPU figure rise.
fn spawn_load(client: reqwest::Client, url: String, stop: CancellationToken) {
    tokio::spawn(async move {
        while !stop.is_cancelled() {
            let body = serde_json::json!({"model": "demo-model", "prompt": "hello", "max_tokens": 200, "stream": true});
            match client.post(&url).json(&body).send().await {
                Ok(r) => {
                    let _ = r.bytes().await;
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    // The hint comes from the policy the demo's agent.toml puts in force: the agent policy's
    // confirmed failures by default, the reference's count when the file says so.
    #[test]
    fn the_hang_hint_follows_the_policy_in_force() {
        let dir = tempfile::tempdir().unwrap();
        let (_, toml) = write_files(dir.path(), 1, 2, 3).unwrap();
        let cfg = crate::config::file::load(&toml).unwrap();
        let hint = hang_hint(&cfg.engines[0]);
        assert!(
            hint.contains("policy agent") && hint.contains("after 2 failed probes"),
            "{hint}"
        );
        let text = std::fs::read_to_string(&toml).unwrap();
        std::fs::write(
            &toml,
            text.replacen("[agent]\n", "[agent]\npolicy = \"reference\"\n", 1),
        )
        .unwrap();
        let cfg = crate::config::file::load(&toml).unwrap();
        let hint = hang_hint(&cfg.engines[0]);
        assert!(
            hint.contains("policy reference") && hint.contains("after 6 failed probes, 5s apart"),
            "{hint}"
        );
    }

    #[test]
    fn fault_keys_are_the_engines_own() {
        let keys = fault_keys();
        for k in ["hang", "npu_busy_stuck", "driver_hang", "pause_ms"] {
            assert!(keys.iter().any(|x| x == k), "{k}: {keys:?}");
        }
    }
}
