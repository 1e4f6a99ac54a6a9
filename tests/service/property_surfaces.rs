//! Issue 11 §6: every entry point that reads bytes from outside is fed arbitrary input and
//! must neither panic nor fail without saying why. The config loaders (the agent TOML,
//! MindIE's `user_config.json` and `env.json`), the `npu-smi` and engine `/metrics` parsers
//! are called directly; the HTTP request surface is the real agent binary's mgmt and admin
//! listeners over TCP. (The watch and mapping parsers, the SSE stream parser and the metrics
//! parser also have in-module property tests.)

#![cfg(feature = "fake-driver")]

use crate::support;
use npu_health_agent::config::mindie::{EngineSection, HealthCheckConfig, env_json_lookup};
use npu_health_wire::Role;
use proptest::prelude::*;
use serde_json::Value;
use std::path::Path;

/// Any JSON document.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        ".{0,12}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 64, 8, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            proptest::collection::btree_map(
                prop_oneof![
                    Just("motor_engine_prefill_config".to_owned()),
                    Just("motor_engine_union_config".to_owned()),
                    Just("motor_common_env".to_owned()),
                    Just("engine_config".to_owned()),
                    Just("health_check_config".to_owned()),
                    Just("enable_virtual_inference".to_owned()),
                    Just("npu_usage_threshold".to_owned()),
                    Just("max_failure_count".to_owned()),
                    Just("engine_type".to_owned()),
                    Just("served_model_name".to_owned()),
                    Just("mgmt_tls_config".to_owned()),
                    Just("kv_transfer_config".to_owned()),
                    "[a-z_]{1,12}",
                ],
                inner,
                0..6
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// TOML-ish text built from the agent's real keys, so validation past the parser is reached.
fn agent_toml() -> impl Strategy<Value = String> {
    let key = prop_oneof![
        Just("sample_period"),
        Just("admin_listen"),
        Just("max_connections"),
        Just("header_read_timeout"),
        Just("idle_timeout"),
        Just("stall_timeout"),
        Just("worker_threads"),
        Just("npu_smi_delay"),
        Just("port"),
        Just("mgmt_port"),
        Just("host"),
        Just("name"),
        Just("devices"),
        Just("engine_type"),
        Just("served_model_name"),
        Just("interval"),
        Just("window"),
        Just("health_period"),
        Just("high_load_threshold"),
        Just("backend"),
        Just("role"),
    ];
    let value = prop_oneof![
        any::<i64>().prop_map(|n| n.to_string()),
        any::<f64>().prop_map(|f| format!("{f:?}")),
        Just("nan".to_owned()),
        Just("inf".to_owned()),
        "\"[0-9a-z. :]{0,10}\"",
        "\\[[-0-9, ]{0,12}\\]",
        Just("\"5s\"".to_owned()),
        Just("{}".to_owned()),
    ];
    let table = prop_oneof![
        Just("[agent]"),
        Just("[[engine]]"),
        Just("[engine.timing]"),
        Just("[engine.qos]"),
        Just("[engine.health_check_config]"),
    ];
    proptest::collection::vec((proptest::option::of(table), key, value), 0..16).prop_map(|lines| {
        lines
            .into_iter()
            .map(|(t, k, v)| match t {
                Some(t) => format!("{t}\n{k} = {v}\n"),
                None => format!("{k} = {v}\n"),
            })
            .collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn agent_toml_bytes_never_panic_and_errors_name_the_file(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
        let text = String::from_utf8_lossy(&bytes);
        if let Err(e) = npu_health_agent::config::file::parse(&text, Path::new("/x/agent.toml")) {
            prop_assert!(e.to_string().contains("/x/agent.toml"), "{e}");
            prop_assert!(!e.message.is_empty());
        }
    }

    #[test]
    fn agent_toml_from_real_keys_never_panics_and_errors_say_why(text in agent_toml()) {
        if let Err(e) = npu_health_agent::config::file::parse(&text, Path::new("/x/agent.toml")) {
            let s = e.to_string();
            prop_assert!(s.contains("/x/agent.toml") && !e.message.is_empty(), "{s}");
            prop_assert!(!s.contains("got None"), "{s}");
        }
    }

    #[test]
    fn user_config_json_never_panics(doc in json_value()) {
        for role in [Role::Prefill, Role::Decode, Role::Union, Role::Encode] {
            if let Err(e) = EngineSection::from_user_config(&doc, role, Path::new("/x")) {
                prop_assert!(!e.is_empty());
            }
            let _ = env_json_lookup(&doc, role, "ASCEND_RT_VISIBLE_DEVICES");
        }
        if let Err(e) = HealthCheckConfig::from_value(Some(&doc)) {
            prop_assert!(!e.is_empty());
        }
    }

    #[test]
    fn user_config_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("user_config.json");
        std::fs::write(&p, &bytes).unwrap();
        // Through the agent config that names it, as `run` and `check-config` read it.
        let toml = format!(
            "[[engine]]\nconfig_path = {:?}\nrole = \"prefill\"\nhost = \"127.0.0.1\"\nport = 8000\nmgmt_port = 9001\n",
            p.display().to_string()
        );
        if let Err(e) = npu_health_agent::config::file::parse(&toml, &dir.path().join("agent.toml")) {
            prop_assert!(e.to_string().contains("user_config.json"), "{e}");
        }
    }

    #[test]
    fn npu_smi_mapping_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        let text = String::from_utf8_lossy(&bytes);
        if let Err(e) = npu_health_agent::driver::npu_smi::parse::parse_mapping(&text) {
            prop_assert!(!e.0.is_empty());
        }
    }

    #[test]
    fn npu_smi_health_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        let text = String::from_utf8_lossy(&bytes);
        if let Err(e) = npu_health_agent::driver::npu_smi::parse::parse_health(&text) {
            prop_assert!(!e.0.is_empty());
        }
    }

    #[test]
    fn npu_smi_watch_bytes_never_panic(chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..200), 0..10)) {
        let mut p = npu_health_agent::driver::npu_smi::parse::WatchParser::new();
        for c in &chunks {
            p.push(c, |_| {});
        }
    }

    #[test]
    fn engine_metrics_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        let _ = npu_health_agent::probe::engine_metrics::parse(&String::from_utf8_lossy(&bytes));
    }
}

// The HTTP request surface: arbitrary bytes (and arbitrary request lines and headers) to the
// real agent's mgmt and admin listeners. Every connection ends with an HTTP answer or a
// close, the agent never panics, and a fresh /status is answered after each case.
#[test]
fn http_request_bytes_never_panic_the_agent() {
    use crate::support::stack::{FAST_TIMING, free_ports, http};
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().unwrap();
    let scenario = support::one_npu_scenario(dir.path());
    let [engine_port, mgmt, admin] = free_ports();
    let toml = dir.path().join("agent.toml");
    std::fs::write(
        &toml,
        format!(
            "[agent]\nadmin_listen = \"127.0.0.1:{admin}\"\nheader_read_timeout = \"1s\"\n\n[[engine]]\nname = \"p\"\nengine_type = \"vllm\"\nserved_model_name = \"m\"\nhost = \"127.0.0.1\"\nport = {engine_port}\nmgmt_port = {mgmt}\ndevices = [0]\nengine_env = {{}}\n{FAST_TIMING}"
        ),
    )
    .unwrap();
    let agent = std::sync::Mutex::new(support::spawn_agent(dir.path(), &toml, &scenario));
    let log = dir.path().join("agent.log");
    let end = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while http("GET", &format!("http://127.0.0.1:{mgmt}/status"), None).is_none() {
        assert!(std::time::Instant::now() < end, "never listened");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let request = prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..512),
        (
            "(GET|POST|HEAD|PUT|DELETE|OPTIONS|PATCH|TRACE|CONNECT|[A-Z]{1,8})",
            "(/|/status|/status/detail|/qos|/metrics|/healthz|/[ -~]{0,40}|\\*|http://x/status)",
            "(HTTP/1.1|HTTP/1.0|HTTP/2.0|HTTP/9|[ -~]{0,8})",
            proptest::collection::vec(("[!-9;-~]{0,12}", "[ -~\t]{0,30}"), 0..6),
            proptest::collection::vec(any::<u8>(), 0..64),
        )
            .prop_map(|(m, p, v, hs, body)| {
                let mut r = format!("{m} {p} {v}\r\n").into_bytes();
                for (k, val) in hs {
                    r.extend(format!("{k}: {val}\r\n").into_bytes());
                }
                r.extend(b"\r\n");
                r.extend(body);
                r
            }),
    ];
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig::with_cases(200));
    let result = runner.run(&(request, any::<bool>()), |(bytes, to_admin)| {
        let port = if to_admin { admin } else { mgmt };
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        let _ = s.write_all(&bytes);
        let _ = s.shutdown(std::net::Shutdown::Write);
        let mut answer = Vec::new();
        let _ = s.read_to_end(&mut answer);
        prop_assert!(
            answer.is_empty() || answer.starts_with(b"HTTP/1."),
            "not HTTP: {:?}",
            String::from_utf8_lossy(&answer)
        );
        prop_assert!(
            agent.lock().unwrap().try_wait().unwrap().is_none(),
            "the agent exited"
        );
        prop_assert!(
            http("GET", &format!("http://127.0.0.1:{mgmt}/status"), None)
                .is_some_and(|(c, b)| c == 200 && b.starts_with("{\"status\":")),
            "/status after the case"
        );
        Ok(())
    });
    let mut agent = agent.into_inner().unwrap();
    let _ = agent.kill();
    let _ = agent.wait();
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    result.unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert!(!text.contains("panicked"), "{text}");
}
