//! `demo` (fake-driver builds): the agent on its embedded default, end to end.
//!
//! Starts, as real processes on loopback, the agent (`--fake run`, so the fake `libdcmi.so`
//! is dlopen'd through the production path) and, once it answers `initial`, the fake engine
//! (whose load drives the fake NPU usage through small files); prints the URLs and shows
//! `/status` going `initial` → `normal`. Ctrl-C (or `--duration`, or a closed stdout, as
//! `demo | head -1` leaves it) stops both and removes the demo's files; the demo fails if the
//! agent dies or `/status` never goes `initial` → `normal`.
//!
//! The children run in process groups of their own, so a terminal's Ctrl-C (SIGINT to the
//! whole foreground group) reaches the demo alone, and the agent gets one stop request, the
//! demo's SIGTERM: a second one would make it exit at once, with a WARN, skipping its
//! graceful stop.

use super::CliError;
use anyhow::Context;
use fake_engine::engine::{EngineOptions, run as run_engine};
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
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
    /// The engine imitated: vLLM 0.8, 0.10, 0.18, 0.33, mindie (MindIE's engine server) or
    /// sglang (SGLang's server).
    #[arg(long, default_value = "0.33")]
    pub profile: fake_engine::profile::Profile,
    /// Data-parallel engines (one `engine` label value each in /metrics).
    #[arg(long, default_value_t = 1)]
    pub data_parallel: u32,
    /// Close a keep-alive connection idle this long (uvicorn's 5 s).
    #[arg(long, default_value = "5s", value_parser = super::parse_duration)]
    pub keep_alive: Duration,
    /// Profile sglang: how often its /health looks for an output (SGLang's 1 s).
    #[arg(long, default_value = "1s", value_parser = super::parse_duration)]
    pub health_poll: Duration,
    /// Profile sglang: how long its /health waits for one before 503 (SGLang's 20 s).
    #[arg(long, default_value = "20s", value_parser = super::parse_duration)]
    pub health_budget: Duration,
    /// Ping the engine core from /health with this timeout (vllm-ascend PR #14240's health
    /// ping; a missed ping marks the engine dead for good). Default: no ping.
    #[arg(long, value_parser = super::parse_duration)]
    pub health_ping_timeout: Option<Duration>,
}

/// Runs the fake engine until SIGTERM/SIGINT.
pub(super) async fn fake_engine(a: FakeEngineArgs) -> Result<(), CliError> {
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
        health_poll: a.health_poll,
        health_budget: a.health_budget,
        health_ping_timeout: a.health_ping_timeout,
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

/// Set once a write to stdout failed (its reader is gone: `demo | head -1`).
static STDOUT_GONE: AtomicBool = AtomicBool::new(false);

/// Prints one line to stdout. A failed write (EPIPE: Rust ignores SIGPIPE, so a closed pipe
/// is an error here, not a signal) is remembered: the watch then stops the demo as Ctrl-C
/// does, instead of a panic that leaves the children to their parent-death signal and the
/// files behind.
fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    if writeln!(out, "{line}").and_then(|()| out.flush()).is_err() {
        STDOUT_GONE.store(true, Ordering::SeqCst);
    }
}

/// Whether stdout's reader is gone: a write failed, or stdout is a pipe whose read end
/// closed (poll says POLLERR before anything is written).
fn stdout_gone() -> bool {
    use rustix::event::{PollFd, PollFlags, Timespec, poll};
    if STDOUT_GONE.load(Ordering::SeqCst) {
        return true;
    }
    let out = std::io::stdout();
    let mut fds = [PollFd::new(&out, PollFlags::empty())];
    let now = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    poll(&mut fds, Some(&now)).is_ok_and(|_| fds[0].revents().contains(PollFlags::ERR))
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
            .stdin(Stdio::null())
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .context("starting the agent")?;
        Ok(agent)
    }

    /// Where to look, and what to try.
    fn print_urls(&self) -> Result<(), CliError> {
        let cfg =
            crate::config::file::load(&self.agent_toml).context("reading the demo's agent.toml")?;
        for line in self.guide(cfg.engines.first()) {
            say(&line);
        }
        Ok(())
    }

    /// The lines [`Setup::print_urls`] prints: the URLs, `top`, a fault to try, and how an
    /// `abnormal` clears (`engine`: the demo's engine as configured).
    fn guide(&self, engine: Option<&crate::config::EngineSpec>) -> Vec<String> {
        let (engine_port, control_port) = (self.engine_port, self.control_port);
        let (mgmt, admin) = (
            format!("http://127.0.0.1:{}", self.mgmt_port),
            format!("http://127.0.0.1:{}", self.admin_port),
        );
        let faults = format!("http://127.0.0.1:{control_port}/fake/faults");
        let mut lines = vec![
            format!("demo: files in {}", self.dir.display()),
            format!("demo: fake engine   http://127.0.0.1:{engine_port}  (faults: {faults})"),
            format!("demo: /status       {mgmt}/status"),
            format!("demo: detail        {mgmt}/status/detail"),
            format!("demo: QoS           {mgmt}/qos"),
            format!("demo: metrics       {mgmt}/metrics  (all: {admin}/metrics)"),
            format!("demo: kubelet       {mgmt}/readyz  {mgmt}/livez"),
            format!("demo: live page     {admin}/"),
            format!(
                "demo: top           {} top --admin {admin}",
                self.exe.display()
            ),
        ];
        if let Some(e) = engine {
            lines.push(format!(
                "demo: try  curl -X POST -d '{{\"hang\":true}}' {faults}  ({})",
                hang_hint(e)
            ));
        }
        lines.push(format!(
            "demo:      fault keys: {} (docs/fake-driver.md); POST /fake/reset clears them",
            fault_keys().join(", ")
        ));
        lines.push(
            "demo:      but an abnormal /status stays abnormal until the engine restarts (MindIE's rule: \
             clearing the fault, or restarting the agent, does not clear it)"
                .to_owned(),
        );
        lines.push(format!(
            "demo:      restart the fake engine (its listener closes for 3 s):  curl -X POST -d '{{\"hang\":false,\"restart_ms\":3000}}' {faults}"
        ));
        lines
    }

    /// Starts the fake engine, and `load` streams of requests to it.
    fn start_engine(
        &self,
        client: &reqwest::Client,
        load: usize,
        stop_load: &CancellationToken,
    ) -> Result<Child, CliError> {
        say("demo: starting the fake engine");
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
            .stdin(Stdio::null())
            .process_group(0)
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
    /// Nobody reads stdout any more.
    StdoutGone,
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
        say(&format!(
            "demo: {:>6.1}s  /status {status}  {}",
            self.started.elapsed().as_secs_f64(),
            detail["reason"].as_str().unwrap_or("")
        ));
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
            say(&format!(
                "demo: {:>6.1}s  QoS level {level} (score {score:.3})",
                self.started.elapsed().as_secs_f64()
            ));
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
        if stdout_gone() {
            return Ok(Ended::StdoutGone);
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
                say(&format!("demo: {}; stopping the agent and the fake engine", match req {
                    crate::service::signals::Signalled::Stop(name) => name,
                    crate::service::signals::Signalled::Reload => "SIGHUP",
                }));
                return Ok(Ended::Signalled);
            }
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
    }
}

/// Runs the demo.
pub(super) async fn demo(args: DemoArgs) -> Result<(), CliError> {
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
        Ended::StdoutGone => {
            eprintln!("demo: stdout closed; stopped the agent and the fake engine");
            Ok(())
        }
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

    fn setup(dir: &Path) -> Setup {
        let (scenario, agent_toml) = write_files(dir, 1, 2, 3).unwrap();
        Setup {
            exe: PathBuf::from("/opt/x/npu-health-agent"),
            dir: dir.to_owned(),
            me: "1".into(),
            engine_port: 1,
            control_port: 4,
            mgmt_port: 2,
            admin_port: 3,
            scenario,
            agent_toml,
        }
    }

    // Issue 48: the demo prints the `top` command for its own agent (one that parses, for
    // the admin listener's address), among the other URLs.
    #[test]
    fn the_guide_prints_top_against_the_demos_agent() {
        use clap::Parser;
        let dir = tempfile::tempdir().unwrap();
        let lines = setup(dir.path()).guide(None);
        let top = lines
            .iter()
            .find_map(|l| l.strip_prefix("demo: top"))
            .unwrap_or_else(|| panic!("no top line: {lines:#?}"));
        let argv: Vec<&str> = top.split_whitespace().collect();
        assert_eq!(argv[0], "/opt/x/npu-health-agent", "{top}");
        match super::super::Cli::try_parse_from(&argv).unwrap().command {
            super::super::Command::Top(t) => assert_eq!(t.admin, "http://127.0.0.1:3"),
            other => panic!("{other:?}"),
        }
    }

    // Issue 48: clearing the fault does not clear an abnormal; the guide says what does (an
    // engine restart), and how to restart the fake engine with a patch it takes.
    #[test]
    fn the_guide_says_how_an_abnormal_clears() {
        let dir = tempfile::tempdir().unwrap();
        let lines = setup(dir.path()).guide(None);
        let text = lines.join("\n");
        assert!(
            text.contains("an abnormal /status stays abnormal until the engine restarts"),
            "{text}"
        );
        let restart = lines
            .iter()
            .find(|l| l.contains("restart the fake engine"))
            .unwrap_or_else(|| panic!("{text}"));
        let body = restart.split('\'').nth(1).unwrap();
        let patch: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(patch["hang"], false, "{restart}");
        assert!(patch["restart_ms"].as_u64().is_some(), "{restart}");
        assert!(
            restart.ends_with("http://127.0.0.1:4/fake/faults"),
            "{restart}"
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
