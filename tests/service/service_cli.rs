//! `run`, `check-config` and `doctor` through the binary: single-engine mode (MindIE's
//! user_config.json and engine-server flags), host mode with two engines, TLS on the mgmt
//! listener, and configuration errors.
#![cfg(feature = "fake-driver")]

use crate::support;
use crate::support::stack::{free_ports, http};
use npu_health_wire::EngineDetail;
use npu_health_wire::Phase;
use npu_health_wire::Role;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A fake engine process serving model `m` on a free port.
struct Engine {
    child: Child,
    port: u16,
    control: u16,
}

impl Engine {
    fn start() -> Engine {
        let [port, control] = free_ports();
        let child =
            npu_health_agent::fake::engine_command(support::agent(), port, control, "m", &[])
                .spawn()
                .unwrap();
        let e = Engine {
            child,
            port,
            control,
        };
        wait_until(Duration::from_secs(10), || {
            http("GET", &format!("http://127.0.0.1:{port}/health"), None).is_some()
        });
        e
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn wait_until(limit: Duration, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if f() {
            return;
        }
        std::thread::sleep(Duration::from_millis(30));
    }
    panic!("condition not met within {limit:?}");
}

/// The engine-server flags of single-engine mode, for commands that do not reach the engine.
/// MindIE's engine-server flags of single-engine mode: prefill role on 127.0.0.1, the
/// engine at `port`, `/status` on `mgmt`.
fn single_engine_flags(port: u16, mgmt: u16) -> [String; 8] {
    [
        "--role".to_owned(),
        "prefill".to_owned(),
        "--host".to_owned(),
        "127.0.0.1".to_owned(),
        "--port".to_owned(),
        port.to_string(),
        "--mgmt-port".to_owned(),
        mgmt.to_string(),
    ]
}

fn user_config(dir: &std::path::Path, extra_hc: &str) -> std::path::PathBuf {
    let p = dir.join("user_config.json");
    std::fs::write(
        &p,
        format!(
            r#"{{"version": "v2", "motor_engine_prefill_config": {{"engine_type": "vllm",
                 "engine_config": {{"served_model_name": "m"}},
                 "health_check_config": {{"enable_virtual_inference": true{extra_hc}}}}}}}"#
        ),
    )
    .unwrap();
    p
}

fn agent() -> Command {
    let mut c = Command::new(support::agent());
    c.env_remove("ASCEND_GLOBAL_LOG_LEVEL")
        .env_remove("FAKE_NPU_SCENARIO")
        .arg("--fake");
    c
}

struct Agent(Child);
impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn status(port: u16) -> Option<String> {
    http("GET", &format!("http://127.0.0.1:{port}/status"), None).map(|(_, b)| b)
}

#[test]
fn single_engine_mode_mirrors_the_engine_server_flags() {
    let engine = Engine::start();
    let dir = tempfile::tempdir().unwrap();
    let uc = user_config(dir.path(), "");
    let [mgmt] = free_ports();
    let child = agent()
        .args(["run", "--config-path"])
        .arg(&uc)
        .args(single_engine_flags(engine.port, mgmt))
        .args(["--dp-rank", "0", "--devices", "0,1"])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let _agent = Agent(child);
    wait_until(Duration::from_secs(20), || {
        status(mgmt).as_deref() == Some(r#"{"status":"normal"}"#)
    });
    let (code, body) = http("GET", &format!("http://127.0.0.1:{mgmt}/status"), None).unwrap();
    assert_eq!(code, 200);
    assert_eq!(body, r#"{"status":"normal"}"#);
    let (_, detail) = http(
        "GET",
        &format!("http://127.0.0.1:{mgmt}/status/detail"),
        None,
    )
    .unwrap();
    let d: EngineDetail = serde_json::from_str(&detail).unwrap();
    assert_eq!(d.engine, "prefill-0");
    assert_eq!(d.role, Role::Prefill);
    let (_, metrics) = http("GET", &format!("http://127.0.0.1:{mgmt}/metrics"), None).unwrap();
    assert!(
        metrics.contains("npu_health_agent_chip_cube_utilization{id=\"0\""),
        "{metrics}"
    );
    assert!(
        metrics.contains("npu_health_agent_status{engine=\"prefill-0\",status=\"normal\"} 1"),
        "{metrics}"
    );
    let _ = engine.control;
}

// No driver backend at all: `run` keeps serving /status from /health, with virtual inference
// disabled by its AI Cube condition (a crash loop would read as abnormal to Node Manager).
#[test]
fn run_without_any_driver_backend_follows_health() {
    let engine = Engine::start();
    let dir = tempfile::tempdir().unwrap();
    let uc = user_config(dir.path(), "");
    let [mgmt] = free_ports();
    let child = Command::new(support::agent())
        .env_remove("ASCEND_GLOBAL_LOG_LEVEL")
        .args([
            "--dcmi-lib",
            "/nonexistent/libdcmi.so",
            "--npu-smi",
            "/nonexistent/npu-smi",
        ])
        .args(["run", "--config-path"])
        .arg(&uc)
        .args(single_engine_flags(engine.port, mgmt))
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let _agent = Agent(child);
    wait_until(Duration::from_secs(20), || {
        status(mgmt).as_deref() == Some(r#"{"status":"normal"}"#)
    });
    let get = || -> EngineDetail {
        serde_json::from_str(
            &http(
                "GET",
                &format!("http://127.0.0.1:{mgmt}/status/detail"),
                None,
            )
            .unwrap()
            .1,
        )
        .unwrap()
    };
    wait_until(Duration::from_secs(10), || {
        get().virtual_inference.phase == Phase::Disabled
    });
    let d = get();
    let cube = d
        .conditions
        .iter()
        .find(|c| c.name == "ai_cube")
        .expect("the ai_cube condition");
    assert_eq!(cube.ok, Some(false), "{d:?}");
    assert!(cube.value.contains("no driver backend"), "{d:?}");
}

#[test]
fn host_mode_serves_one_listener_per_engine() {
    let (e1, e2) = (Engine::start(), Engine::start());
    let dir = tempfile::tempdir().unwrap();
    let [m1, m2, admin] = free_ports();
    let toml = dir.path().join("agent.toml");
    std::fs::write(
        &toml,
        format!(
            "[agent]\nadmin_listen = \"127.0.0.1:{admin}\"\n\
             [[engine]]\nname = \"a\"\nengine_type = \"vllm\"\nserved_model_name = \"m\"\nhost = \"127.0.0.1\"\nport = {}\nmgmt_port = {m1}\ndevices = [0]\nengine_env = {{}}\n[engine.health_check_config]\nenable_virtual_inference = true\n\
             [[engine]]\nname = \"b\"\nengine_type = \"vllm\"\nserved_model_name = \"m\"\nhost = \"127.0.0.1\"\nport = {}\nmgmt_port = {m2}\ndevices = [1]\nengine_env = {{ ASCEND_GLOBAL_LOG_LEVEL = \"1\" }}\n[engine.health_check_config]\nenable_virtual_inference = true\n",
            e1.port, e2.port
        ),
    )
    .unwrap();
    let _agent = Agent(
        agent()
            .args(["run", "--config"])
            .arg(&toml)
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_until(Duration::from_secs(20), || {
        status(m1).as_deref() == Some(r#"{"status":"normal"}"#)
    });
    wait_until(Duration::from_secs(20), || {
        status(m2).as_deref() == Some(r#"{"status":"normal"}"#)
    });
    // Engine b's log level disables virtual inference (reference gate), a's runs.
    let get = |p: u16| -> EngineDetail {
        serde_json::from_str(
            &http("GET", &format!("http://127.0.0.1:{p}/status/detail"), None)
                .unwrap()
                .1,
        )
        .unwrap()
    };
    wait_until(Duration::from_secs(10), || {
        get(m2).virtual_inference.phase == Phase::Disabled
    });
    let b = get(m2);
    let lvl = b
        .conditions
        .iter()
        .find(|c| c.name == "ASCEND_GLOBAL_LOG_LEVEL")
        .expect("the log-level condition");
    assert_eq!(lvl.ok, Some(false));
    assert!(
        lvl.note
            .contains("requires ASCEND_GLOBAL_LOG_LEVEL=3 (ERROR); got '1'")
    );
    wait_until(Duration::from_secs(10), || {
        get(m1).virtual_inference.phase == Phase::Running
    });
    // Each engine's window covers its own NPU only.
    assert_eq!(get(m1).window.devices[0].id, 0);
    assert_eq!(get(m2).window.devices[0].id, 1);
    // The admin listener has everything.
    let (code, all) = http("GET", &format!("http://127.0.0.1:{admin}/metrics"), None).unwrap();
    assert_eq!(code, 200);
    assert!(
        all.contains("engine=\"a\"") && all.contains("engine=\"b\""),
        "{all}"
    );
    assert_eq!(
        http("GET", &format!("http://127.0.0.1:{admin}/healthz"), None)
            .unwrap()
            .0,
        200
    );
}

#[test]
fn mgmt_tls_serves_status_over_https() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let engine = Engine::start();
    let dir = tempfile::tempdir().unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    std::fs::write(dir.path().join("server.crt"), cert.pem()).unwrap();
    std::fs::write(dir.path().join("server.key"), key.serialize_pem()).unwrap();
    let [mgmt] = free_ports();
    let toml = dir.path().join("agent.toml");
    std::fs::write(
        &toml,
        format!(
            "[[engine]]\nengine_type = \"vllm\"\nserved_model_name = \"m\"\nhost = \"127.0.0.1\"\nport = {}\nmgmt_port = {mgmt}\nmgmt_tls_config = {{ enable_tls = true, cert_file = \"server.crt\", key_file = \"server.key\" }}\n[engine.health_check_config]\nenable_virtual_inference = false\n",
            engine.port
        ),
    )
    .unwrap();
    let _agent = Agent(
        agent()
            .args(["run", "--config"])
            .arg(&toml)
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert.der().clone()).unwrap();
    let tls = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let client = reqwest::Client::builder()
        .use_preconfigured_tls(tls)
        .no_proxy()
        .build()
        .unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let url = format!("https://localhost:{mgmt}/status");
    let body = rt.block_on(async {
        let end = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(r) = client.get(&url).send().await {
                let b = r.text().await.unwrap_or_default();
                if b == r#"{"status":"normal"}"# || Instant::now() > end {
                    return b;
                }
            } else if Instant::now() > end {
                return String::new();
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    assert_eq!(body, r#"{"status":"normal"}"#);
    // Plain HTTP on the TLS port does not get a status.
    assert!(status(mgmt).is_none_or(|b| !b.contains("status")));
}

#[test]
fn encrypted_mgmt_key_fails_at_start_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let k = rcgen::KeyPair::generate().unwrap();
    let c = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
        .unwrap()
        .self_signed(&k)
        .unwrap();
    std::fs::write(dir.path().join("server.crt"), c.pem()).unwrap();
    std::fs::write(
        dir.path().join("server.key"),
        "-----BEGIN ENCRYPTED PRIVATE KEY-----\nMIIB\n-----END ENCRYPTED PRIVATE KEY-----\n",
    )
    .unwrap();
    let toml = dir.path().join("agent.toml");
    std::fs::write(
        &toml,
        format!(
            "[[engine]]\nengine_type = \"vllm\"\nserved_model_name = \"m\"\nhost = \"127.0.0.1\"\nport = 1\nmgmt_port = {}\nmgmt_tls_config = {{ enable_tls = true, cert_file = \"server.crt\", key_file = \"server.key\", passwd_file = \"key_pwd.txt\" }}\n",
            free_ports::<1>()[0]
        ),
    )
    .unwrap();
    let out = agent()
        .args(["run", "--config"])
        .arg(&toml)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("mgmt_tls_config")
            && err.contains("encrypted")
            && err.contains("openssl pkey"),
        "{err}"
    );
}

#[test]
fn check_config_prints_defaults_and_rejects_bad_keys() {
    let dir = tempfile::tempdir().unwrap();
    let uc = user_config(dir.path(), ", \"max_failure_count\": 4");
    let out = agent()
        .args(["check-config", "--config-path"])
        .arg(&uc)
        .args(single_engine_flags(8000, 9001))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let e = &v["engines"][0];
    assert_eq!(e["health_check_config"]["max_failure_count"], 4);
    assert_eq!(e["health_check_config"]["health_collector_timeout"], 5);
    assert_eq!(
        e["health_check_config"]["health_collector_timeout_retry_attempts"],
        3
    );
    assert_eq!(e["health_check_config"]["npu_usage_threshold"], 3.0);
    assert_eq!(e["timing"]["warmup_timeout"], "3m");
    assert_eq!(e["timing"]["request_timeout"], "5s");
    assert_eq!(e["timing"]["high_load_interval"], "20s");
    assert_eq!(e["mgmt_listen"], "127.0.0.1:9001");
    // A V6-only key breaks the engine_server-era loader, as in the reference.
    let bad = user_config(dir.path(), ", \"virtual_inference_timeout\": 5.0");
    let out = agent()
        .args(["check-config", "--config-path"])
        .arg(&bad)
        .args(single_engine_flags(8000, 9001))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("user_config.json")
            && err.contains("motor_engine_prefill_config")
            && err.contains("virtual_inference_timeout"),
        "{err}"
    );
    // Missing flags of single-engine mode are named.
    let out = agent()
        .args(["check-config", "--config-path"])
        .arg(&uc)
        .args(["--role", "prefill"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--host") && err.contains("--port") && err.contains("--mgmt-port"),
        "{err}"
    );
    // Nothing to monitor.
    let out = agent().arg("check-config").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}

// Issue 48: check-config said "configuration is valid" of an engine whose virtual inference
// is off (MindIE's default in user_config.json, which single-engine mode keeps) and whose
// /status only loopback reaches; now a WARNING names the engine and MindIE's key, and a note
// the flag that moves /status, before the verdict. It still exits 0.
#[test]
fn check_config_warns_of_virtual_inference_off_and_notes_a_status_on_loopback() {
    let dir = tempfile::tempdir().unwrap();
    let uc = dir.path().join("user_config.json");
    std::fs::write(
        &uc,
        r#"{"motor_engine_prefill_config": {"engine_type": "vllm", "engine_config": {"served_model_name": "m"}}}"#,
    )
    .unwrap();
    let [port, mgmt] = free_ports();
    let out = agent()
        .args(["check-config", "--config-path"])
        .arg(&uc)
        .args(single_engine_flags(port, mgmt))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let lines: Vec<&str> = err.lines().collect();
    let n = lines.len();
    assert!(n >= 3, "{err}");
    let file = uc.display();
    assert_eq!(
        lines[n - 3],
        format!(
            "{file}: note: engine prefill-0's /status listens on 127.0.0.1:{mgmt}, a loopback address: a Node Manager on another host or in another pod cannot reach it; set --host to \"0.0.0.0\" or the node's address where it polls from elsewhere"
        )
    );
    assert_eq!(
        lines[n - 2],
        format!(
            "{file}: WARNING: engine prefill-0: virtual inference is off, so a hung engine (alive, /health 200, no token out) is never reported abnormal; set motor_engine_prefill_config.health_check_config.enable_virtual_inference to true in {file}"
        )
    );
    assert_eq!(
        lines[n - 1],
        format!("{file}: configuration is valid (1 engine(s))")
    );
}

// Single-engine mode: under the default policy (agent) stall detection and eviction are on,
// the V6 rule off; under `--policy reference` all three are off (V5 parity); the flags turn
// them on, and a bad value names its flag.
#[test]
fn single_engine_qos_flags() {
    let dir = tempfile::tempdir().unwrap();
    let uc = user_config(dir.path(), "");
    let run = |extra: &[&str]| {
        agent()
            .args(["check-config", "--config-path"])
            .arg(&uc)
            .args(single_engine_flags(8000, 9001))
            .args(extra)
            .output()
            .unwrap()
    };
    // The effective `qos` table printed by check-config.
    let qos = |extra: &[&str]| -> serde_json::Value {
        let out = run(extra);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["engines"][0]["qos"].clone()
    };
    let q = qos(&[]);
    assert_eq!(q["stall_detection"], true);
    assert_eq!(q["stall_window"], "30s");
    assert_eq!(q["skip_when_capacity_waiting"], false);
    assert_eq!(q["eviction"], true);
    let q = qos(&["--policy", "reference"]);
    assert_eq!(q["stall_detection"], false);
    assert_eq!(q["skip_when_capacity_waiting"], false);
    assert_eq!(q["eviction"], false);
    assert_eq!(q["probe_max_tokens"], 1);
    let q = qos(&[
        "--policy",
        "reference",
        "--stall-detection",
        "--stall-window",
        "30s",
        "--skip-when-capacity-waiting",
        "--qos-eviction",
        "--qos-probe-max-tokens",
        "4",
    ]);
    assert_eq!(q["stall_detection"], true);
    assert_eq!(q["stall_window"], "30s");
    assert_eq!(q["skip_when_capacity_waiting"], true);
    assert_eq!(q["eviction"], true);
    assert_eq!(q["probe_max_tokens"], 4);
    let out = run(&["--qos-probe-max-tokens", "0"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--qos-probe-max-tokens"), "{err}");
}

#[test]
fn doctor_reports_each_condition_and_the_verdict() {
    let engine = Engine::start();
    let dir = tempfile::tempdir().unwrap();
    let uc = user_config(dir.path(), "");
    let env_json = dir.path().join("env.json");
    std::fs::write(&env_json, r#"{"motor_common_env": {"ASCEND_GLOBAL_LOG_LEVEL": "3"}, "motor_engine_prefill_env": {"ASCEND_GLOBAL_LOG_LEVEL": "1"}}"#).unwrap();
    // doctor on the prefill engine whose inference port is `port`.
    let doctor_on = |c: &mut Command, port: u16| {
        c.args(["doctor", "--config-path"]).arg(&uc).args([
            "--role",
            "prefill",
            "--host",
            "127.0.0.1",
            "--port",
            &port.to_string(),
            "--mgmt-port",
            "9001",
        ]);
    };
    let base = |c: &mut Command| {
        doctor_on(c, engine.port);
    };
    let mut c = agent();
    base(&mut c);
    let out = c.arg("--json").output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let e = &v["engines"][0];
    assert_eq!(e["virtual_inference_will_run"], true, "{v}");
    // The actions in force, one per integration.
    let actions: Vec<(&str, &str)> = e["actions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["integration"].as_str().unwrap(),
                a["action"].as_str().unwrap(),
            )
        })
        .collect();
    let integrations: Vec<&str> = actions.iter().map(|a| a.0).collect();
    assert_eq!(
        integrations,
        [
            "node_manager",
            "kubelet",
            "kubernetes_api",
            "haproxy",
            "envoy",
            "routers"
        ],
        "{v}"
    );
    assert!(
        actions[1].1.contains("/readyz 503") && actions[1].1.contains("degrade, evict, abnormal"),
        "{v}"
    );
    assert!(actions[2].1.starts_with("off"), "{v}");
    assert!(actions[3].1.starts_with("off"), "{v}");
    let names: Vec<&str> = e["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    for want in [
        "engine_type",
        "enable_virtual_inference",
        "dp_rank",
        "headless",
        "ASCEND_GLOBAL_LOG_LEVEL",
        "npu_usage_threshold",
        "ai_cube",
        "health",
    ] {
        assert!(names.contains(&want), "{want} missing from {names:?}");
    }
    // With env.json saying "1" for the prefill engine, it will not run, the table says why,
    // and doctor exits 4 naming the engine (issue 48: it exited 0, so a canary could not tell).
    let mut c = agent();
    base(&mut c);
    let out = c.arg("--env-config-path").arg(&env_json).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{err}");
    assert!(
        err.trim_end().ends_with(
            "virtual inference will not run for engine prefill-0 (blocked by ASCEND_GLOBAL_LOG_LEVEL)"
        ),
        "{err}"
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("will NOT run: blocked by ASCEND_GLOBAL_LOG_LEVEL"),
        "{text}"
    );
    assert!(
        text.contains("actions:") && text.contains("/livez 503"),
        "{text}"
    );
    assert!(text.contains("motor_engine_prefill_env"), "{text}");
    assert!(
        text.contains("requires ASCEND_GLOBAL_LOG_LEVEL=3 (ERROR); got '1'"),
        "{text}"
    );
    // No engine listening: health is pending, so it will not run yet.
    drop(engine);
    let [closed] = free_ports::<1>();
    // Waiting for /health is no failure: it runs once the engine answers.
    let pending = |extra: &[&str]| {
        let mut c = agent();
        doctor_on(&mut c, closed);
        c.args(extra);
        let out = c.output().unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    };
    let v: serde_json::Value = serde_json::from_slice(&pending(&["--json"])).unwrap();
    assert_eq!(v["engines"][0]["virtual_inference_will_run"], false);
    assert_eq!(
        v["engines"][0]["virtual_inference_blocked_by"],
        serde_json::json!([]),
        "{v}"
    );
    assert_eq!(
        v["engines"][0]["virtual_inference_waits_for"],
        serde_json::json!(["health"]),
        "{v}"
    );
    // The same in text: it waits, it is not blocked; the policy line ends its sentence.
    let text = String::from_utf8_lossy(&pending(&[])).into_owned();
    assert!(
        text.contains("=> virtual inference waits for health (it runs once"),
        "{text}"
    );
    assert!(!text.contains("will NOT run"), "{text}");
    assert!(
        text.contains("restores MindIE V5's detection exactly (docs/policy.md)"),
        "{text}"
    );
}

#[test]
fn sigterm_stops_the_agent_promptly() {
    let engine = Engine::start();
    let dir = tempfile::tempdir().unwrap();
    let uc = user_config(dir.path(), "");
    let [mgmt] = free_ports();
    let mut child = agent()
        .args(["run", "--config-path"])
        .arg(&uc)
        .args(single_engine_flags(engine.port, mgmt))
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_until(Duration::from_secs(20), || status(mgmt).is_some());
    let pid = rustix::process::Pid::from_child(&child);
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    let end = Instant::now() + Duration::from_secs(10);
    let code = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s.code();
        }
        assert!(Instant::now() < end, "agent did not exit after SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(code, Some(0));
    assert!(status(mgmt).is_none(), "listener closed");
}

// The agent.toml shown in the README stays valid.
#[test]
fn readme_agent_toml_example_is_valid() {
    // The full host example the README links to (its own block is examples/minimal.toml).
    let example =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/agent.toml"))
            .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let uc = user_config(dir.path(), "");
    let text = example.replace("user_config.json", &uc.display().to_string());
    let toml = dir.path().join("agent.toml");
    std::fs::write(&toml, text).unwrap();
    // check-config checks the NPUs named (0-3 and 4-7) against the driver: an 8-NPU host.
    let scenario = dir.path().join("scenario.toml");
    std::fs::write(&scenario, "cards = 8\n").unwrap();
    let out = agent()
        .env("FAKE_NPU_SCENARIO", &scenario)
        .args(["check-config", "--config"])
        .arg(&toml)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["engines"].as_array().unwrap().len(), 2);
    assert_eq!(v["engines"][1]["dispatch_profile"], "trigger");
    assert_eq!(v["engines"][0]["policy"]["value"], "agent");
    assert_eq!(v["engines"][0]["policy"]["source"], "[agent] policy");
    assert_eq!(v["engines"][1]["agent_policy"]["confirm_failures"], 2);
    assert_eq!(
        v["engines"][1]["devices"]["value"],
        serde_json::json!([4, 5, 6, 7])
    );
}

// Issue 28: the driver and log flags are the program's, listed once in `--help`, not
// repeated in every command's help (`top` has no use for them); the commands that use the
// driver say where they go.
#[test]
fn driver_flags_are_listed_once_not_in_every_command() {
    let help = |args: &[&str]| {
        let out = Command::new(support::agent()).args(args).output().unwrap();
        assert!(out.status.success(), "{args:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let top = help(&["--help"]);
    for flag in ["--dcmi-lib", "--npu-smi", "--backend", "--log-format"] {
        assert!(top.contains(flag), "{flag} missing from --help:\n{top}");
    }
    assert!(!top.contains("--exit-with-parent"), "{top}");
    let t = help(&["top", "--help"]);
    assert!(
        !t.contains("--dcmi-lib") && !t.contains("--npu-smi-delay"),
        "{t}"
    );
    let r = help(&["run", "--help"]);
    assert!(!r.contains("--dcmi-lib <PATH>"), "{r}");
    assert!(
        r.contains("go before the command: npu-health-agent [FLAGS] <COMMAND>"),
        "{r}"
    );
}

// Issue 42: the driver flags work after the command too, as scripts and units written before
// they became the program's have them: the same answer either way.
#[test]
fn driver_flags_work_before_or_after_the_command() {
    let run = |args: &[&str]| {
        let out = Command::new(support::agent())
            .env_remove("FAKE_NPU_SCENARIO")
            .args(args)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
        v
    };
    // What the flags decide (the ages in the answer differ from run to run).
    let chosen = |v: serde_json::Value| -> Vec<(serde_json::Value, serde_json::Value)> {
        v["devices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| (d["id"].clone(), d["backend"].clone()))
            .collect()
    };
    let before = chosen(run(&["--fake", "--backend", "dcmi", "devices", "--json"]));
    let after = chosen(run(&["devices", "--json", "--fake", "--backend", "dcmi"]));
    assert_eq!(before, after);
    assert!(
        !before.is_empty() && before.iter().all(|(_, b)| b == "dcmi"),
        "{before:?}"
    );
}

// Issue 42: the shipped unit's command line, with driver flags after `run` as drop-ins and
// scripts written before the flags became the program's have them, is taken as it was (here
// through `check-config`, which reads the same flags, on a config of one fake engine).
#[test]
fn the_shipped_units_command_takes_driver_flags_after_run() {
    let unit = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/deploy/systemd/npu-health-agent.service"
    ))
    .unwrap();
    let exec = unit
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .expect("the unit's ExecStart");
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("agent.toml");
    let [port, mgmt] = support::stack::free_ports();
    std::fs::write(
        &config,
        format!("[[engine]]\nname = \"a\"\nengine_type = \"vllm\"\nserved_model_name = \"m\"\nhost = \"127.0.0.1\"\nport = {port}\nmgmt_port = {mgmt}\ndevices = [0]\n"),
    )
    .unwrap();
    let args: Vec<String> = exec
        .split_whitespace()
        .skip(1)
        .map(|a| match a {
            "run" => "check-config".to_owned(),
            "/etc/npu-health-agent/agent.toml" => config.display().to_string(),
            other => other.to_owned(),
        })
        .chain(["--dcmi-no-owner-check", "--npu-smi-delay", "2", "--fake"].map(str::to_owned))
        .collect();
    let out = Command::new(support::agent())
        .env_remove("FAKE_NPU_SCENARIO")
        .args(&args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["agent"]["npu_smi_delay"], 2, "{v}");
    assert_eq!(v["agent"]["dcmi_no_owner_check"], true, "{v}");
}
