//! An agent as the operator views see it: two fake engines (`a` on NPU 0, `b` on NPU 1), the
//! admin listener, and NPU 0 playing a burst (95 % for 100 ms every 2 s, 3 % otherwise) at
//! the default 50 ms sampling period. Optionally an admin token and the Kubernetes API mode
//! against the stand-in API server (so every family the dashboard reads is exported). The
//! HAProxy agent-check listener is open too, so a test can poll it as HAProxy would.
//! Optionally a state directory, so a second agent process takes over from the first.

use super::kube_api::{self, StandIn};
use super::stack::{free_ports, http, http_with};
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::Duration;

/// The admin token [`Views::start`] writes when asked for one.
pub const TOKEN: &str = "views-admin-token-0123456789abcdef";

pub struct Views {
    pub dir: tempfile::TempDir,
    pub agent: Child,
    pub engines: Vec<Child>,
    pub admin: u16,
    /// The HAProxy agent-check listener.
    pub haproxy: u16,
    /// Mgmt ports of `a` and `b`.
    pub mgmt: [u16; 2],
    /// Fault-control ports of `a`'s and `b`'s fake engines.
    pub control: [u16; 2],
    pub token: bool,
    pub api: Option<StandIn>,
    /// Agent processes started so far (each logs to its own file: `agent.log`,
    /// `agent-2.log`, …).
    pub agents: u32,
}

impl Drop for Views {
    fn drop(&mut self) {
        for c in std::iter::once(&mut self.agent).chain(self.engines.iter_mut()) {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The NPUs behind the engines.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Npus {
    /// NPU 0 plays a burst (a's); NPU 1 (b's) reads 20 % with one failed read every 2 s.
    Burst,
    /// NPU 0 is engine a's file (idle when a hangs; `driver_hang` on a hangs it); NPU 1
    /// reads 20 % with one failed read a minute; b also has NPU 2, the file `npu2` (write
    /// `hang` into it to hang its reads).
    Engines,
}

impl Views {
    /// Starts the engines and the agent and waits until both engines are `normal`.
    pub fn start(token: bool, kubernetes: bool) -> Views {
        Views::start_with(token, kubernetes, Npus::Burst)
    }

    /// [`Views::start`] with a choice of NPUs.
    pub fn start_with(token: bool, kubernetes: bool, npus: Npus) -> Views {
        Views::start_agent(token, kubernetes, npus, "")
    }

    /// [`Views::start_with`] with `agent_lines` added to the agent's `[agent]` table.
    pub fn start_agent(token: bool, kubernetes: bool, npus: Npus, agent_lines: &str) -> Views {
        Views::launch(token, kubernetes, npus, agent_lines, false)
    }

    /// [`Views::start`] with a state directory (`run/` in the test's directory): an agent
    /// started again with [`Views::spawn_agent`] takes over from the running one.
    pub fn start_with_state_dir() -> Views {
        Views::launch(false, false, Npus::Burst, "", true)
    }

    fn launch(
        token: bool,
        kubernetes: bool,
        npus: Npus,
        agent_lines: &str,
        state_dir: bool,
    ) -> Views {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        for f in ["npu0", "npu1", "npu2"] {
            std::fs::write(d.join(f), "0\n").unwrap();
        }
        // NPU 1: 20 %, and failed reads (NA), so the driver-error counter exists; and a
        // NotHandleFault code (link down, published only), so the fault series exist.
        let (npu0, npu1, b_devices, cards) = match npus {
            Npus::Burst => (
                "{ square = { high = 95, low = 3, width_ms = 100, period_ms = 2000, phase_ms = 0 } }",
                ("0,20\n1900,NA\n", 2000),
                "1",
                2,
            ),
            Npus::Engines => ("{ file = \"npu0\" }", ("0,NA\n100,20\n", 60_000), "1, 2", 3),
        };
        std::fs::write(d.join("npu1.csv"), npu1.0).unwrap();
        let mut scenario_text = format!(
            "model = \"910B\"\ncards = {cards}\n[[device]]\nid = 0\naicube = {npu0}\n[[device]]\nid = 1\naicube = {{ trace = {{ file = \"npu1.csv\", period_ms = {} }} }}\nerror_codes = [0x81078603]\n",
            npu1.1
        );
        if npus == Npus::Engines {
            scenario_text.push_str("[[device]]\nid = 2\naicube = { file = \"npu2\" }\n");
        }
        let scenario = d.join("scenario.toml");
        std::fs::write(&scenario, scenario_text).unwrap();
        let [e_a, c_a, e_b, c_b, m_a, m_b, admin, haproxy] = free_ports();
        let mut agent_extra = format!(
            "admin_listen = \"127.0.0.1:{admin}\"\nhaproxy_agent_listen = \"127.0.0.1:{haproxy}\"\n{agent_lines}"
        );
        if state_dir {
            agent_extra.push_str(&format!("state_dir = {:?}\n", d.join("run")));
        }
        if token {
            std::fs::write(d.join("admin.token"), format!("{TOKEN}\n")).unwrap();
            agent_extra.push_str(&format!(
                "admin_token_file = \"{}\"\n",
                d.join("admin.token").display()
            ));
        }
        let api = kubernetes.then(|| {
            let pods = vec![kube_api::pod("inference", "vllm-a", "n1", true, &[(e_a, None)])];
            let api = StandIn::start(pods);
            std::fs::write(d.join("kube.token"), kube_api::TOKEN).unwrap();
            agent_extra.push_str(&format!(
                "[agent.kubernetes]\nnode_name = \"n1\"\napi_server = \"{}\"\ntoken_file = \"{}\"\nresync_period = \"1s\"\nrequest_timeout = \"1s\"\n",
                api.url,
                d.join("kube.token").display()
            ));
            api
        });
        let engine = |name: &str, port: u16, mgmt: u16, npu: &str| {
            format!(
                "[[engine]]\nname = \"{name}\"\nengine_type = \"vllm\"\nserved_model_name = \"m\"\nhost = \"127.0.0.1\"\nport = {port}\nmgmt_port = {mgmt}\ndevices = [{npu}]\nengine_env = {{}}\n[engine.qos]\nperiod = \"1s\"\nmetrics_period = \"1s\"\n[engine.health_check_config]\nenable_virtual_inference = true\n"
            )
        };
        let toml = d.join("agent.toml");
        std::fs::write(
            &toml,
            format!(
                "[agent]\npolicy = \"agent\"\n{agent_extra}\n{}\n{}",
                engine("a", e_a, m_a, "0"),
                engine("b", e_b, m_b, b_devices)
            ),
        )
        .unwrap();
        let npu_files = [d.join("npu0"), d.join("npu1")];
        let engines = [(e_a, c_a), (e_b, c_b)]
            .into_iter()
            .enumerate()
            .map(|(k, (port, control))| {
                npu_health_agent::fake::engine_command(
                    super::agent(),
                    port,
                    control,
                    "m",
                    &npu_files[k..=k],
                )
                .stderr(Stdio::from(
                    std::fs::File::create(d.join(format!("engine{k}.log"))).unwrap(),
                ))
                .spawn()
                .expect("start a fake engine")
            })
            .collect();
        let agent = super::spawn_agent(d, &toml, &scenario);
        let v = Views {
            dir,
            agent,
            engines,
            admin,
            haproxy,
            mgmt: [m_a, m_b],
            control: [c_a, c_b],
            token,
            api,
            agents: 1,
        };
        for m in v.mgmt {
            v.wait(
                &format!("engine on {m} normal"),
                Duration::from_secs(30),
                || v.status(m).as_deref() == Some("normal"),
            );
        }
        v
    }

    /// `/status` of the engine whose mgmt port is `mgmt`.
    pub fn status(&self, mgmt: u16) -> Option<String> {
        let (_, body) = http("GET", &format!("http://127.0.0.1:{mgmt}/status"), None)?;
        let v: serde_json::Value = serde_json::from_str(&body).ok()?;
        v["status"].as_str().map(str::to_owned)
    }

    /// `GET path` on the admin listener, with the token when there is one.
    pub fn admin_get(&self, path: &str) -> Option<(u16, String)> {
        let auth = format!("Bearer {TOKEN}");
        let headers: Vec<(&str, &str)> = if self.token {
            vec![("Authorization", auth.as_str())]
        } else {
            Vec::new()
        };
        http_with(
            "GET",
            &format!("http://127.0.0.1:{}{path}", self.admin),
            None,
            &headers,
        )
    }

    /// Applies a fault patch to engine `k`'s fake engine (0: `a`, 1: `b`).
    pub fn fault(&self, k: usize, patch: &str) {
        let url = format!("http://127.0.0.1:{}/fake/faults", self.control[k]);
        let (code, body) = http("POST", &url, Some(patch)).expect("control endpoint answers");
        assert_eq!(code, 200, "fault patch {patch} refused: {body}");
    }

    pub fn admin_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.admin)
    }

    /// Every agent process's log, oldest first.
    pub fn log(&self) -> String {
        (1..=self.agents)
            .map(|n| std::fs::read_to_string(self.path().join(log_name(n))).unwrap_or_default())
            .collect::<Vec<_>>()
            .join("--- next agent process ---\n")
    }

    /// The log of agent process `n` (1: the first).
    pub fn log_of(&self, n: u32) -> String {
        std::fs::read_to_string(self.path().join(log_name(n))).unwrap_or_default()
    }

    /// Starts one more agent process with the same configuration, logging to its own file;
    /// with a state directory it takes over from a running one. The caller owns it (and
    /// may put it in `self.agent`).
    pub fn spawn_agent(&mut self) -> Child {
        self.agents += 1;
        let d = self.path();
        super::spawn_agent_logged(
            &d.join("agent.toml"),
            &d.join("scenario.toml"),
            &[],
            &d.join(log_name(self.agents)),
        )
    }

    /// Sends `signal` (`TERM`, `KILL`) to the agent process `child`.
    pub fn signal(child: &Child, signal: &str) {
        let ok = std::process::Command::new("kill")
            .args([format!("-{signal}"), child.id().to_string()])
            .status()
            .expect("kill")
            .success();
        assert!(ok, "kill -{signal} {}", child.id());
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Waits until `done`; panics with `what` and the agent's log.
    pub fn wait(&self, what: &str, limit: Duration, done: impl FnMut() -> bool) {
        super::wait_or_panic(what, limit, Duration::from_millis(100), || self.log(), done);
    }
}

/// The log file of agent process `n`.
fn log_name(n: u32) -> String {
    if n == 1 {
        "agent.log".to_owned()
    } else {
        format!("agent-{n}.log")
    }
}

/// The name an agent started by this test process gives its node when it has no Kubernetes
/// node name (`view::node_name`): `$NODE_NAME`, else the host name.
pub fn node_name() -> String {
    std::env::var("NODE_NAME")
        .ok()
        .filter(|n| !n.trim().is_empty())
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|n| n.trim().to_owned())
        .unwrap_or_default()
}
