//! The shipped Envoy configs (deploy/envoy/) under a real Envoy 1.40: both pass `envoy
//! --mode validate`, and envoy.yaml, with the addresses of a test rig, routes by the agent's
//! `/engines/<name>/readyz`: the main engine (the fake engine, model `m`) while it is ready,
//! the draft (the fake engine answering as `draft`) while it is not, the main again once
//! it recovers.
//!
//! Runs where `scripts/routers install` put Envoy; prints the figures the closing note and
//! docs/degradation.md quote (`--nocapture`).

#![cfg(feature = "fake-driver")]

use crate::support::Figures;
use crate::support::routers::{self, Answer, Draft, Envoy, complete};
use crate::support::stack::{Launch, Stack, free_ports};
use std::path::Path;
use std::time::{Duration, Instant};

#[test]
fn the_shipped_envoy_configs_pass_envoys_own_validation() {
    let Some(bin) = routers::envoy("the_shipped_envoy_configs") else {
        return;
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for f in [
        "deploy/envoy/envoy.yaml",
        "deploy/envoy/envoy-degraded.yaml",
    ] {
        let (ok, out) = routers::envoy_validate(&bin, &root.join(f));
        assert!(ok, "{f}:\n{out}");
        assert!(out.contains("OK"), "{f}:\n{out}");
    }
    // The check can fail: a misspelt field.
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        routers::example(
            "deploy/envoy/envoy.yaml",
            &[(
                "http_health_check: { path: /engines/main/readyz }",
                "http_health_check: { paht: /engines/main/readyz }",
                1,
            )],
        ),
    )
    .unwrap();
    let (ok, out) = routers::envoy_validate(&bin, &bad);
    assert!(!ok, "envoy accepted a misspelt field:\n{out}");
}

fn burst(front: &str, n: usize) -> Vec<Answer> {
    let threads: Vec<_> = (0..n)
        .map(|_| {
            let f = front.to_owned();
            std::thread::spawn(move || complete(&f, "m", 4))
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

fn count(answers: &[Answer], model: &str) -> usize {
    answers
        .iter()
        .filter(|a| a.model == model && a.code == 200)
        .count()
}

/// The main engine (the stack's, "e2e") and a draft both watched by the agent: the draft
/// is a second `[[engine]]` ("draft", virtual inference off: its `/status` follows
/// `/health`), so each has its own `/readyz` on its mgmt listener and on the admin listener.
struct Rig {
    stack: Stack,
    _draft: Draft,
    admin: u16,
    draft_port: u16,
    draft_mgmt: u16,
}

/// `health_check`: lines of the main engine's `[engine.health_check_config]`.
fn rig(main_actions: &str, health_check: &str) -> Rig {
    let [admin, draft_port, draft_control, draft_mgmt] = free_ports();
    let agent_extra = format!("admin_listen = \"127.0.0.1:{admin}\"");
    let engine_extra = format!(
        "[engine.qos]\nperiod = \"500ms\"\nmetrics_period = \"500ms\"\nttft_budget = \"1s\"\n{main_actions}\n\
         [[engine]]\nname = \"draft\"\nengine_type = \"vllm\"\nserved_model_name = \"m\"\nhost = \"127.0.0.1\"\n\
         port = {draft_port}\nmgmt_port = {draft_mgmt}\ndevices = [0, 1]\n[engine.health_check_config]\nenable_virtual_inference = false\n"
    );
    let dir = tempfile::tempdir().unwrap();
    let draft = Draft::start(draft_port, draft_control, dir.path());
    let stack = Stack::start_launch(Launch {
        health_check,
        engine_extra: &engine_extra,
        agent_extra: &agent_extra,
        ..Launch::default()
    });
    Rig {
        stack,
        _draft: draft,
        admin,
        draft_port,
        draft_mgmt,
    }
}

#[test]
fn envoy_sends_new_requests_to_the_draft_while_the_agent_calls_main_not_ready() {
    let fig =
        Figures::new("envoy_sends_new_requests_to_the_draft_while_the_agent_calls_main_not_ready");
    let Some(bin) = routers::envoy("envoy_sends_new_requests_to_the_draft") else {
        return;
    };
    let Rig {
        stack,
        _draft: _keep,
        admin,
        draft_port,
        ..
    } = rig("", "");
    let [front, envoy_admin] = free_ports();
    let (main, draft, admin_s, front_s) = (
        stack.engine_port.to_string(),
        draft_port.to_string(),
        admin.to_string(),
        front.to_string(),
    );
    // The shipped file with this rig's addresses; the main engine is "e2e" here.
    let config = routers::example(
        "deploy/envoy/envoy.yaml",
        &[
            (
                "address: 0.0.0.0, port_value: 8080",
                &format!("address: 127.0.0.1, port_value: {front_s}"),
                1,
            ),
            ("10.0.0.5", "127.0.0.1", 3),
            ("port_value: 8000", &format!("port_value: {main}"), 1),
            ("port_value: 8001", &format!("port_value: {draft}"), 1),
            ("port_value: 9400", &format!("port_value: {admin_s}"), 2),
            ("/engines/main/readyz", "/engines/e2e/readyz", 1),
        ],
    );
    let envoy = Envoy::start(&bin, stack.dir.path(), &config, front, envoy_admin);
    let wait = Duration::from_secs(30);

    // normal: ready, everything to main.
    envoy.wait_health("llm-main", stack.engine_port, wait, |h| h == "healthy");
    envoy.wait_health("llm-draft", draft_port, wait, |h| h == "healthy");
    let normal = burst(&envoy.front, 12);
    assert_eq!(count(&normal, "m"), 12, "{normal:?}");
    fig.line(format!(
        "normal: main {} draft {}",
        count(&normal, "m"),
        count(&normal, "draft")
    ));

    // throttle: /readyz stays 200 by default, so Envoy keeps sending to main (it has no
    // state between serving and not).
    stack.faults(r#"{"latency_ms": 700}"#);
    stack.wait_until("level throttle", wait, |d| d["qos"]["level"] == "throttle");
    let throttled = burst(&envoy.front, 6);
    assert_eq!(count(&throttled, "m"), 6, "{throttled:?}");
    assert_eq!(envoy.health("llm-main", stack.engine_port), "healthy");
    fig.line(format!(
        "throttle: main {} draft {} (/readyz stays 200: Envoy has no state between in and out)",
        count(&throttled, "m"),
        count(&throttled, "draft")
    ));
    stack.faults(r#"{"latency_ms": 0}"#);
    stack.wait_until("level normal", wait, |d| d["qos"]["level"] == "normal");

    // degrade: /readyz 503; Envoy marks main unhealthy at the next check and new requests go
    // to the draft; a stream already on main finishes there.
    let long = {
        let f = envoy.front.clone();
        std::thread::spawn(move || complete(&f, "m", 800))
    };
    std::thread::sleep(Duration::from_millis(300));
    stack.faults(r#"{"latency_ms": 1500, "kv_cache_usage": 0.97}"#);
    stack.wait_until("level degrade", wait, |d| d["qos"]["level"] == "degrade");
    let since = stack.qos()["level_since_unix_ms"].as_u64().unwrap();
    envoy.wait_health("llm-main", stack.engine_port, wait, |h| {
        h.contains("failed_active_hc")
    });
    let out_at = npu_health_agent::clock::unix_ms();
    let degraded = burst(&envoy.front, 8);
    assert_eq!(count(&degraded, "draft"), 8, "{degraded:?}");
    let a = long.join().unwrap();
    assert_eq!(
        (a.code, a.model.as_str()),
        (200, "m"),
        "the stream on main: {a:?}"
    );
    fig.line(format!(
        "degrade: Envoy marked main unhealthy {} ms after the level changed (checks every 1 s); burst of 8: main {} draft {}; the stream on main completed",
        out_at.saturating_sub(since),
        count(&degraded, "m"),
        count(&degraded, "draft")
    ));

    // Recovery: two passing checks, then main again.
    stack.faults(r#"{"latency_ms": 0, "kv_cache_usage": 0.1}"#);
    stack.wait_until("level normal", wait, |d| d["qos"]["level"] == "normal");
    let t = Instant::now();
    envoy.wait_health("llm-main", stack.engine_port, wait, |h| h == "healthy");
    let back = burst(&envoy.front, 8);
    assert_eq!(count(&back, "m"), 8, "{back:?}");
    fig.line(format!(
        "recovery: healthy again {} ms after the level (healthy_threshold 2); main {} draft {}",
        t.elapsed().as_millis(),
        count(&back, "m"),
        count(&back, "draft")
    ));

    // abnormal: the engine hangs; once the verdict is abnormal, main is out again.
    stack.faults(r#"{"hang": true}"#);
    stack.wait_for_status("abnormal", wait);
    envoy.wait_health("llm-main", stack.engine_port, wait, |h| {
        h.contains("failed_active_hc")
    });
    let out = burst(&envoy.front, 8);
    assert_eq!(count(&out, "draft"), 8, "{out:?}");
    fig.line(format!(
        "abnormal: main {} draft {}",
        count(&out, "m"),
        count(&out, "draft")
    ));
    let detail = stack.detail();
    assert_eq!(detail["routers"]["envoy"]["state"], "unhealthy", "{detail}");
}

// The x-envoy-degraded variant: at degrade the main's /readyz is 200 with the header, Envoy
// marks it degraded, and new requests go to the healthy draft. (With the draft out too,
// Envoy 1.40 did not reliably fall back to the degraded main: docs/degradation.md.)
#[test]
fn envoy_degraded_variant_marks_main_degraded_and_sends_new_requests_to_the_draft() {
    let fig = Figures::new(
        "envoy_degraded_variant_marks_main_degraded_and_sends_new_requests_to_the_draft",
    );
    let Some(bin) = routers::envoy("envoy_degraded_variant") else {
        return;
    };
    let Rig {
        stack,
        _draft: _keep,
        draft_port,
        draft_mgmt,
        ..
    } = rig(
        "[engine.actions]\nnot_ready_on = [\"evict\", \"abnormal\"]\n",
        // The degrade fault's 1.5 s first token outlasts the fast timing's 500 ms probe
        // timeout: six failed probes would make the verdict abnormal (the main unhealthy
        // too) in the middle of the test. This test is about degrade only.
        "max_failure_count = 1000",
    );
    let [front, envoy_admin] = free_ports();
    let config = routers::example(
        "deploy/envoy/envoy-degraded.yaml",
        &[
            (
                "address: 0.0.0.0, port_value: 8080",
                &format!("address: 127.0.0.1, port_value: {front}"),
                1,
            ),
            ("10.0.0.5", "127.0.0.1", 2),
            (
                "port_value: 8000",
                &format!("port_value: {}", stack.engine_port),
                1,
            ),
            ("port_value: 8001", &format!("port_value: {draft_port}"), 1),
            (
                "port_value: 9001",
                &format!("port_value: {}", stack.mgmt_port),
                1,
            ),
            ("port_value: 9002", &format!("port_value: {draft_mgmt}"), 1),
        ],
    );
    let envoy = Envoy::start(&bin, stack.dir.path(), &config, front, envoy_admin);
    let wait = Duration::from_secs(30);
    envoy.wait_health("llm", stack.engine_port, wait, |h| h == "healthy");
    envoy.wait_health("llm", draft_port, wait, |h| h == "healthy");
    let normal = burst(&envoy.front, 8);
    assert_eq!(count(&normal, "m"), 8, "{normal:?}");
    stack.faults(r#"{"latency_ms": 1500, "kv_cache_usage": 0.97}"#);
    stack.wait_until("level degrade", wait, |d| d["qos"]["level"] == "degrade");
    envoy.wait_health("llm", stack.engine_port, wait, |h| {
        h.contains("degraded_active_hc")
    });
    let degraded = burst(&envoy.front, 8);
    assert_eq!(count(&degraded, "draft"), 8, "{degraded:?}");
    let detail = stack.detail();
    assert_eq!(detail["routers"]["envoy"]["state"], "degraded", "{detail}");
    fig.line(format!(
        "degraded variant: at degrade main {} draft {}",
        count(&degraded, "m"),
        count(&degraded, "draft")
    ));
}
