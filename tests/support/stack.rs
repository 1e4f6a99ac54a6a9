//! A whole stack as real processes on loopback: the fake engine, the agent binary on the
//! fake driver (whose NPU figures the engine writes), both killed when the stack is dropped.

use npu_health_wire::{EngineDetail, EngineQos};
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// `N` distinct free TCP ports on 127.0.0.1 (bound and released; good enough for tests).
pub fn free_ports<const N: usize>() -> [u16; N] {
    npu_health_agent::fake::free_ports().expect("free ports")
}

/// Timing of the agent under test: the reference's constants divided by ten.
pub const FAST_TIMING: &str = r#"
[engine.timing]
warmup_timeout = "10s"
request_timeout = "500ms"
window = "500ms"
interval = "500ms"
high_load_interval = "2s"
health_period = "100ms"
"#;

/// How a stack is started, beyond the defaults.
#[derive(Debug, Default)]
pub struct Launch<'a> {
    /// `[engine.health_check_config]` lines after `enable_virtual_inference = true`.
    pub health_check: &'a str,
    /// Appended to the `[[engine]]`.
    pub engine_extra: &'a str,
    /// Keys added to each fake NPU of the scenario.
    pub device_extra: &'a str,
    /// Keys added to the first and to the second fake NPU (e.g. their `phy_id`).
    pub per_device: [&'a str; 2],
    /// Top-level scenario keys (e.g. `prerelease_layout = "4-byte"`).
    pub scenario_top: &'a str,
    /// Global agent flags before `run` (e.g. `--dcmi-lib <path>`).
    pub agent_args: Vec<std::ffi::OsString>,
    /// Lines appended to the `[agent]` table (e.g. `admin_listen = "127.0.0.1:9400"`).
    pub agent_extra: &'a str,
    /// `[agent] policy`; empty: `reference`, whose exact semantics these tests pin (the
    /// agent policy has its own tests and the chaos suite).
    pub policy: &'a str,
    /// `[agent] state_dir` in the stack's directory (`run/`): the agent's state survives
    /// its restarts, and a second agent takes over from the first.
    pub state_dir: bool,
    /// The engine's `engine_type`; empty: `vllm`.
    pub engine_type: &'a str,
    /// More arguments of the fake engine (e.g. `--profile sglang`).
    pub engine_args: &'a [&'a str],
}

/// Running processes and their addresses.
pub struct Stack {
    pub dir: tempfile::TempDir,
    pub engine: Option<Child>,
    pub agent: Child,
    /// The agent's global flags, to start it again.
    pub agent_args: Vec<std::ffi::OsString>,
    /// Agent processes started so far (the first logs to `agent.log`, the next to
    /// `agent-<N>.log`).
    pub agents: u32,
    pub engine_port: u16,
    pub control_port: u16,
    pub mgmt_port: u16,
    /// `health_check_config` lines used.
    pub health_check: String,
}

impl Stack {
    /// Starts the fake engine and the agent; `health_check` goes into
    /// `[engine.health_check_config]` after `enable_virtual_inference = true`.
    pub fn start(health_check: &str) -> Stack {
        Stack::start_ordered(health_check, true)
    }

    /// As [`Stack::start`]; with `engine_first` false the agent starts alone, `/status` must
    /// answer `initial`, and only then the engine starts.
    pub fn start_ordered(health_check: &str, engine_first: bool) -> Stack {
        Stack::launch(health_check, "", "", engine_first)
    }

    /// As [`Stack::start`], with `engine_extra` appended to the `[[engine]]` (e.g. an
    /// `[engine.qos]` table) and `device_extra` keys added to each fake NPU of the scenario
    /// (e.g. `hbm_used_mb = 60293`).
    pub fn start_with(health_check: &str, engine_extra: &str, device_extra: &str) -> Stack {
        Stack::launch(health_check, engine_extra, device_extra, true)
    }

    /// As [`Stack::start_with`], plus top-level scenario keys and global agent flags.
    pub fn start_launch(l: Launch<'_>) -> Stack {
        Stack::launch_with(l, true)
    }

    fn launch(
        health_check: &str,
        engine_extra: &str,
        device_extra: &str,
        engine_first: bool,
    ) -> Stack {
        Stack::launch_with(
            Launch {
                health_check,
                engine_extra,
                device_extra,
                ..Launch::default()
            },
            engine_first,
        )
    }

    fn launch_with(l: Launch<'_>, engine_first: bool) -> Stack {
        let Launch {
            health_check,
            engine_extra,
            device_extra,
            per_device,
            scenario_top,
            agent_args,
            agent_extra,
            policy,
            state_dir,
            engine_type,
            engine_args,
        } = l;
        let engine_type = if engine_type.is_empty() {
            "vllm"
        } else {
            engine_type
        };
        let engine_args: Vec<String> = engine_args.iter().map(|a| (*a).to_owned()).collect();
        let policy = if policy.is_empty() {
            "reference"
        } else {
            policy
        };
        let dir = tempfile::tempdir().expect("temp dir");
        for f in ["npu0", "npu1"] {
            std::fs::write(dir.path().join(f), "0\n").unwrap();
        }
        let scenario = dir.path().join("scenario.toml");
        std::fs::write(
            &scenario,
            format!("model = \"910B\"\ncards = 2\n{scenario_top}\n[[device]]\nid = 0\naicube = {{ file = \"npu0\" }}\n{device_extra}\n{}\n[[device]]\nid = 1\naicube = {{ file = \"npu1\" }}\n{device_extra}\n{}\n", per_device[0], per_device[1]),
        )
        .unwrap();
        let [engine_port, control_port, mgmt_port] = free_ports();
        let agent_toml = dir.path().join("agent.toml");
        let state_line = if state_dir {
            format!(
                "state_dir = {:?}\n",
                dir.path().join("run").display().to_string()
            )
        } else {
            String::new()
        };
        let agent_extra = format!("{agent_extra}\n{state_line}");
        std::fs::write(
            &agent_toml,
            format!(
                "[agent]\nsample_period = \"20ms\"\npolicy = \"{policy}\"\n{agent_extra}\n\n[[engine]]\nname = \"e2e\"\nengine_type = \"{engine_type}\"\nserved_model_name = \"m\"\nhost = \"127.0.0.1\"\nport = {engine_port}\nmgmt_port = {mgmt_port}\ndevices = [0, 1]\nengine_env = {{ ASCEND_GLOBAL_LOG_LEVEL = \"3\" }}\n{FAST_TIMING}\n[engine.health_check_config]\nenable_virtual_inference = true\n{health_check}\n{engine_extra}\n"
            ),
        )
        .unwrap();
        let npu_files = [dir.path().join("npu0"), dir.path().join("npu1")];
        let engine_log = dir.path().join("engine.log");
        let spawn_engine = move || {
            Some(
                npu_health_agent::fake::engine_command(
                    super::agent(),
                    engine_port,
                    control_port,
                    "m",
                    &npu_files,
                )
                .args(&engine_args)
                .stderr(Stdio::from(std::fs::File::create(&engine_log).unwrap()))
                .spawn()
                .expect("start fake engine"),
            )
        };
        let engine = if engine_first { spawn_engine() } else { None };
        let agent = super::spawn_agent_with(dir.path(), &agent_toml, &scenario, &agent_args);
        let mut stack = Stack {
            dir,
            engine,
            agent,
            agent_args,
            agents: 1,
            engine_port,
            control_port,
            mgmt_port,
            health_check: health_check.to_owned(),
        };
        if !engine_first {
            stack.wait_for_status("initial", Duration::from_secs(30));
            stack.engine = spawn_engine();
        }
        stack.wait_for_status("normal", Duration::from_secs(30));
        // Faults are injected after the warm-up: a failed warm-up is abnormal at once.
        stack.wait_for_phase("running", Duration::from_secs(30));
        stack
    }

    /// Polls `/status/detail` until `done` holds of it; panics after `limit` with `what`, the
    /// last detail and the agent log.
    pub fn wait_until(
        &self,
        what: &str,
        limit: Duration,
        mut done: impl FnMut(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let end = Instant::now() + limit;
        loop {
            let d = self.detail();
            if done(&d) {
                return d;
            }
            assert!(
                Instant::now() < end,
                "not within {limit:?}: {what}\nlast detail: {d}\nagent log:\n{}",
                self.agent_log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until virtual inference reaches `phase`.
    pub fn wait_for_phase(&self, phase: &str, limit: Duration) {
        let end = Instant::now() + limit;
        while Instant::now() < end {
            if self.detail()["virtual_inference"]["phase"] == phase {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!(
            "virtual inference never reached {phase}: {}\nagent log:\n{}",
            self.detail(),
            self.agent_log()
        );
    }

    /// `http://127.0.0.1:<mgmt>/status`.
    pub fn status_url(&self) -> String {
        format!("http://127.0.0.1:{}/status", self.mgmt_port)
    }

    /// The logs of every agent process so far, oldest first.
    pub fn agent_log(&self) -> String {
        (1..=self.agents)
            .map(|n| std::fs::read_to_string(self.path(&Self::log_name(n))).unwrap_or_default())
            .collect::<Vec<_>>()
            .join("--- next agent process ---\n")
    }

    /// The log of the newest agent process.
    pub fn last_agent_log(&self) -> String {
        std::fs::read_to_string(self.path(&Self::log_name(self.agents))).unwrap_or_default()
    }

    fn log_name(n: u32) -> String {
        if n == 1 {
            "agent.log".to_owned()
        } else {
            format!("agent-{n}.log")
        }
    }

    /// Starts one more agent process with the same config (logging to its own file) and
    /// returns it; with a state directory it takes over from a running one.
    pub fn spawn_agent(&mut self) -> Child {
        self.agents += 1;
        super::spawn_agent_logged(
            &self.path("agent.toml"),
            &self.path("scenario.toml"),
            &self.agent_args,
            &self.path(&Self::log_name(self.agents)),
        )
    }

    /// Stops the agent with `signal` (`TERM`, `KILL`), waits for it to exit, and starts a new
    /// one at once.
    pub fn restart_agent(&mut self, signal: &str) {
        self.stop_agent(signal);
        self.agent = self.spawn_agent();
    }

    /// Stops the agent with `signal` and waits for it to exit (a new one is the caller's:
    /// `self.agent = self.spawn_agent()`).
    pub fn stop_agent(&mut self, signal: &str) {
        let pid = self.agent.id().to_string();
        let ok = std::process::Command::new("kill")
            .args([format!("-{signal}"), pid])
            .status()
            .expect("kill")
            .success();
        assert!(ok, "kill -{signal} of the agent failed");
        let _ = self.agent.wait();
    }

    /// Blocking GET returning (status code, body).
    pub fn get(&self, url: &str) -> Option<(u16, String)> {
        http("GET", url, None)
    }

    /// Applies a fault patch to the fake engine.
    pub fn faults(&self, patch: &str) {
        let url = format!("http://127.0.0.1:{}/fake/faults", self.control_port);
        let (code, body) = http("POST", &url, Some(patch)).expect("control endpoint answers");
        assert_eq!(code, 200, "fault patch {patch} refused: {body}");
    }

    /// `/fake/stats` of the engine.
    pub fn engine_stats(&self) -> serde_json::Value {
        let url = format!("http://127.0.0.1:{}/fake/stats", self.control_port);
        serde_json::from_str(&http("GET", &url, None).expect("stats").1).expect("stats JSON")
    }

    /// `GET /qos` of the engine.
    pub fn qos(&self) -> serde_json::Value {
        let url = format!("http://127.0.0.1:{}/qos", self.mgmt_port);
        serde_json::from_str(&self.get(&url).expect("qos").1).expect("qos JSON")
    }

    /// The agent's `/metrics` text for the engine.
    pub fn metrics(&self) -> String {
        self.get(&format!("http://127.0.0.1:{}/metrics", self.mgmt_port))
            .expect("metrics")
            .1
    }

    /// Opens `n` completion requests on the engine and keeps them open (not read) until the
    /// returned sockets are dropped: requests running as long as the engine holds them.
    pub fn hold_requests(&self, n: usize, body: &str) -> Vec<std::net::TcpStream> {
        use std::io::Write;
        (0..n)
            .map(|_| {
                let mut s = std::net::TcpStream::connect(("127.0.0.1", self.engine_port))
                    .expect("connect to the engine");
                write!(
                    s,
                    "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                )
                .expect("send");
                s
            })
            .collect()
    }

    /// `/status/detail` of the engine.
    /// `/status/detail`, read into the agent's own type.
    pub fn typed_detail(&self) -> EngineDetail {
        serde_json::from_value(self.detail()).expect("/status/detail is an EngineDetail")
    }

    /// `/qos`, read into the agent's own type.
    pub fn typed_qos(&self) -> EngineQos {
        serde_json::from_value(self.qos()).expect("/qos is an EngineQos")
    }

    /// Polls the typed `/status/detail` until `done` holds of it.
    pub fn wait_until_typed(
        &self,
        what: &str,
        limit: Duration,
        mut done: impl FnMut(&EngineDetail) -> bool,
    ) -> EngineDetail {
        let d = self.wait_until(what, limit, |d| {
            done(&serde_json::from_value(d.clone()).expect("/status/detail is an EngineDetail"))
        });
        serde_json::from_value(d).expect("/status/detail is an EngineDetail")
    }

    pub fn detail(&self) -> serde_json::Value {
        let url = format!("http://127.0.0.1:{}/status/detail", self.mgmt_port);
        serde_json::from_str(&self.get(&url).expect("detail").1).expect("detail JSON")
    }

    /// Waits until `/status` says `want`; panics with the agent log otherwise.
    pub fn wait_for_status(&self, want: &str, limit: Duration) {
        let end = Instant::now() + limit;
        let mut last = None;
        while Instant::now() < end {
            last = self.get(&self.status_url());
            if last
                .as_ref()
                .is_some_and(|(_, b)| b == &format!("{{\"status\":\"{want}\"}}"))
            {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "/status never became {want} (last {last:?})\nagent log:\n{}\nengine log:\n{}",
            self.agent_log(),
            std::fs::read_to_string(self.path("engine.log")).unwrap_or_default()
        );
    }

    /// Starts the fake engine again (a new process on the same ports, fresh state).
    pub fn start_engine(&mut self) {
        assert!(self.engine.is_none(), "the engine still runs");
        let npu_files = [self.path("npu0"), self.path("npu1")];
        let log = std::fs::File::create(self.path("engine-again.log")).unwrap();
        self.engine = Some(
            npu_health_agent::fake::engine_command(
                super::agent(),
                self.engine_port,
                self.control_port,
                "m",
                &npu_files,
            )
            .stderr(Stdio::from(log))
            .spawn()
            .expect("start fake engine"),
        );
    }

    /// Kills the fake engine process (what Node Manager's daemon does on self-termination).
    pub fn kill_engine(&mut self) {
        if let Some(mut e) = self.engine.take() {
            let _ = e.kill();
            let _ = e.wait();
        }
    }

    /// Path of a file in the stack's directory.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        self.kill_engine();
        let _ = self.agent.kill();
        let _ = self.agent.wait();
    }
}

/// Minimal blocking HTTP/1.1 client over a real socket (keeps the tests free of an async
/// runtime where they do not need one).
pub fn http(method: &str, url: &str, body: Option<&str>) -> Option<(u16, String)> {
    http_with(method, url, body, &[])
}

/// [`http`] with extra request headers.
pub fn http_with(
    method: &str,
    url: &str,
    body: Option<&str>,
    headers: &[(&str, &str)],
) -> Option<(u16, String)> {
    http_full(method, url, body, headers).map(|(code, _, body)| (code, body))
}

/// [`http_with`], also returning the answer's head (status line and headers) as text.
pub fn http_full(
    method: &str,
    url: &str,
    body: Option<&str>,
    headers: &[(&str, &str)],
) -> Option<(u16, String, String)> {
    http_waiting(method, url, body, headers, Duration::from_secs(10))
}

/// [`http_full`] that waits up to `read` for each read (a whole non-streamed completion on a
/// slowed engine, or one held in a router's queue, can take longer than the usual 10 s).
pub fn http_waiting(
    method: &str,
    url: &str,
    body: Option<&str>,
    headers: &[(&str, &str)],
    read: Duration,
) -> Option<(u16, String, String)> {
    use std::io::{Read, Write};
    let rest = url.strip_prefix("http://")?;
    let (authority, path) = rest
        .split_once('/')
        .map_or((rest, "/".to_owned()), |(a, p)| (a, format!("/{p}")));
    let mut s = std::net::TcpStream::connect(authority).ok()?;
    s.set_read_timeout(Some(read)).ok()?;
    let body = body.unwrap_or("");
    let extra: String = headers
        .iter()
        .map(|(k, v)| format!("{k}: {v}\r\n"))
        .collect();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\nContent-Type: application/json\r\n{extra}Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .ok()?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).ok()?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, payload) = text.split_once("\r\n\r\n")?;
    let code = head.split_whitespace().nth(1)?.parse().ok()?;
    let payload = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(payload)
    } else {
        payload.to_owned()
    };
    Some((code, head.to_owned(), payload))
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}
