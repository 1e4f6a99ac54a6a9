//! The kubelet's probe endpoints end to end: the fake engine and the agent binary on the
//! fake driver as real processes, `/readyz` and `/livez` read over real sockets on the
//! engine's mgmt listener and on the admin listener (`/engines/<name>/…`), through a silent
//! hang, a closed port and a degraded engine. Timing is compressed as in `agent_e2e`.
#![cfg(feature = "fake-driver")]

use crate::support::stack::{Launch, Stack, free_ports, http_full};
use std::time::{Duration, Instant};

/// (code, head, body) of `GET url`.
fn get(url: &str) -> (u16, String, String) {
    http_full("GET", url, None, &[]).unwrap_or_else(|| panic!("no answer from {url}"))
}

/// The mgmt listener's and the admin listener's answer for `route` (`readyz` or `livez`);
/// both must agree on the code.
fn both(stack: &Stack, admin: u16, route: &str) -> (u16, String, String) {
    let mgmt = get(&format!("http://127.0.0.1:{}/{route}", stack.mgmt_port));
    let via_admin = get(&format!("http://127.0.0.1:{admin}/engines/e2e/{route}"));
    assert_eq!(
        mgmt.0, via_admin.0,
        "{route}: mgmt {mgmt:?} admin {via_admin:?}"
    );
    mgmt
}

/// Polls `route` until it answers `code`; panics after `limit` with the last answer.
fn wait_code(stack: &Stack, admin: u16, route: &str, code: u16, limit: Duration) -> String {
    let end = Instant::now() + limit;
    loop {
        let (c, _, body) = both(stack, admin, route);
        if c == code {
            return body;
        }
        assert!(
            Instant::now() < end,
            "/{route} never answered {code} within {limit:?}; last {c}: {body}\nagent log:\n{}",
            stack.agent_log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn start(engine_extra: &str) -> (Stack, u16) {
    let [admin] = free_ports();
    let agent_extra = format!("admin_listen = \"127.0.0.1:{admin}\"");
    let stack = Stack::start_launch(Launch {
        health_check: "max_failure_count = 3",
        engine_extra,
        agent_extra: &agent_extra,
        ..Launch::default()
    });
    (stack, admin)
}

// Ready and live while normal; a silent hang makes the verdict abnormal, and then both fail
// with the verdict's reason. With the engine's port closed (the process gone, or starting
// again) /livez is 200 again while /readyz stays 503; an unknown engine on the admin
// listener is a 404 naming the known ones.
#[test]
fn a_hang_fails_both_and_a_closed_port_only_readiness() {
    let (stack, admin) = start("");
    let (code, head, body) = both(&stack, admin, "readyz");
    assert_eq!(code, 200, "{body}");
    assert!(body.starts_with("ready"), "{body}");
    assert!(
        !head.to_ascii_lowercase().contains("x-envoy-degraded"),
        "{head}"
    );
    assert_eq!(both(&stack, admin, "livez").0, 200);
    stack.faults(r#"{"hang": true}"#);
    stack.wait_for_status("abnormal", Duration::from_secs(30));
    let ready = wait_code(&stack, admin, "readyz", 503, Duration::from_secs(5));
    assert!(ready.starts_with("not ready: abnormal"), "{ready}");
    let live = wait_code(&stack, admin, "livez", 503, Duration::from_secs(5));
    assert!(live.contains("virtual inference is abnormal"), "{live}");
    assert_eq!(ready.lines().count(), 1, "one line: {ready:?}");
    stack.faults(r#"{"listening": false}"#);
    let live = wait_code(&stack, admin, "livez", 200, Duration::from_secs(10));
    assert!(live.contains("port is closed"), "{live}");
    assert_eq!(both(&stack, admin, "readyz").0, 503);
    // The engine comes back (a restart): virtual inference is re-armed, and with nothing
    // polling /status, the kubelet's probes start it, as Node Manager's first poll would.
    stack.faults(r#"{"hang": false, "listening": true}"#);
    stack.wait_until("re-armed", Duration::from_secs(20), |d| {
        d["virtual_inference"]["rearms"] == 1
    });
    wait_code(&stack, admin, "readyz", 200, Duration::from_secs(10));
    stack.wait_until(
        "running again without /status",
        Duration::from_secs(20),
        |d| {
            let _ = both(&stack, admin, "livez");
            d["virtual_inference"]["phase"] == "running"
        },
    );
    let (code, _, body) = get(&format!("http://127.0.0.1:{admin}/engines/nope/livez"));
    assert_eq!(code, 404);
    // The route is open: the answer names no engine, not even the one asked for.
    assert_eq!(body, "no engine of that name here\n");
}

// A degraded engine (time to first token past its budget, the KV cache nearly full, nothing
// stalled): /readyz fails by default and carries `x-envoy-degraded: true`, /livez stays 200.
// With `not_ready_on` without degrade, /readyz is 200 and still carries the header (Envoy
// honours it only on a passing answer).
#[test]
fn degrade_fails_readiness_by_default_with_the_envoy_header_and_never_liveness() {
    for (actions, ready) in [
        ("", 503),
        (
            "[engine.actions]\nnot_ready_on = [\"evict\", \"abnormal\"]\n",
            200,
        ),
    ] {
        let (stack, admin) = start(&format!(
            "[engine.qos]\nperiod = \"500ms\"\nmetrics_period = \"500ms\"\nttft_budget = \"100ms\"\n{actions}"
        ));
        stack.faults(r#"{"latency_ms": 300, "kv_cache_usage": 0.97}"#);
        stack.wait_until_typed("level degrade", Duration::from_secs(30), |d| {
            d.qos.state.level == npu_health_wire::Level::Degrade
        });
        let body = wait_code(&stack, admin, "readyz", ready, Duration::from_secs(5));
        let (_, head, _) = both(&stack, admin, "readyz");
        assert!(
            head.to_ascii_lowercase().contains("x-envoy-degraded: true"),
            "{head}\n{body}"
        );
        assert!(body.contains("degrade"), "{body}");
        let (code, _, live) = both(&stack, admin, "livez");
        assert_eq!(code, 200, "{live}");
    }
}
