//! The JSON shapes of `/status/detail` and `/qos` are pinned: every key path, as the agent
//! served them before they were built from typed structs (taken from a real-vLLM run's
//! detail), and the typed structs of the `npu-health-wire` crate read an answer back into
//! exactly the JSON that was sent, so the server, the chaos runner and these tests share one
//! definition. The answer read here is also the wire crate's fixture
//! (`crates/wire/tests/fixtures/status_detail.json`, which that crate reads without the agent):
//! its key paths must be this answer's, and `NPU_HEALTH_WIRE_FIXTURE=write` rewrites it.

use crate::support::stack::Stack;
use npu_health_wire::{EngineDetail, EngineQos, Engines};
use std::collections::BTreeSet;
use std::time::Duration;

/// Every key path of `/status/detail` (arrays as `[]`).
const DETAIL_PATHS: &[&str] = &[
    "actions",
    "actions[].action",
    "actions[].at_unix_ms",
    "actions[].from",
    "actions[].integration",
    "actions[].level",
    "actions[].reason",
    "actions[].to",
    "brake",
    "conditions",
    "conditions[].name",
    "conditions[].note",
    "conditions[].ok",
    "conditions[].value",
    "engine",
    "episodes",
    "episodes.escalate_after",
    "episodes.escalate_window_s",
    "episodes.escalated",
    "episodes.in_window",
    "episodes.last_day",
    "episodes.last_hour",
    "episodes.open",
    "episodes.starts_unix_ms",
    "evidence",
    "evidence.failed",
    "evidence.last_bytes",
    "evidence.last_error",
    "evidence.last_path",
    "evidence.skipped",
    "evidence.written",
    "health",
    "health.consecutive_failures",
    "health.excused_timeouts",
    "health.failing_for_ms",
    "health.has_connected",
    "health.last_error",
    "health.last_ok_unix_ms",
    "health.last_transport_error",
    "health.probes",
    "health.state",
    "inference",
    "kubernetes",
    "qos",
    "qos.admission_cap",
    "qos.components",
    "qos.components[].age_ms",
    "qos.components[].input",
    "qos.components[].name",
    "qos.components[].score",
    "qos.components[].series",
    "qos.components[].weight",
    "qos.consecutive_below_evict",
    "qos.device",
    "qos.device.ai_cube_mean",
    "qos.device.ai_cube_peak",
    "qos.device.hbm_ratio",
    "qos.device.hbm_total_mb",
    "qos.device.hbm_used_mb",
    "qos.device.scored",
    "qos.device.window_s",
    "qos.enabled",
    "qos.engine",
    "qos.evaluations",
    "qos.evicting",
    "qos.eviction_answers_abnormal",
    "qos.level",
    "qos.level_since_unix_ms",
    "qos.lowered_by",
    "qos.model",
    "qos.progress",
    "qos.score",
    "qos.scrape_failures",
    "qos.scrapes",
    "qos.stall_detection",
    "qos.stall_detection.enabled",
    "qos.stall_detection.skip_when_capacity_waiting",
    "qos.stall_detection.window_s",
    "qos.stalled_for_s",
    "qos.quiet_for_s",
    "policy",
    "policy_source",
    "reason",
    "role",
    "routers",
    "rules",
    "rules[].fired",
    "rules[].id",
    "rules[].mode",
    "rules[].name",
    "rules[].would_have",
    "shadow",
    "status",
    "virtual_inference",
    "virtual_inference.abnormal",
    "virtual_inference.abnormal_reason",
    "virtual_inference.failure_count",
    "virtual_inference.failure_limit",
    "virtual_inference.interval_s",
    "virtual_inference.last_probe",
    "virtual_inference.last_probe.accounting",
    "virtual_inference.last_probe.at_unix_ms",
    "virtual_inference.last_probe.failure_count",
    "virtual_inference.last_probe.latency_ms",
    "virtual_inference.last_probe.outcome",
    "virtual_inference.last_probe.peak",
    "virtual_inference.last_probe.success",
    "virtual_inference.last_probe.tpot_ms",
    "virtual_inference.last_probe.ttft_ms",
    "virtual_inference.last_probe.warmup",
    "virtual_inference.max_failure_count",
    "virtual_inference.npu_usage_threshold",
    "virtual_inference.phase",
    "virtual_inference.rearms",
    "virtual_inference.warmup_done",
    "window",
    "window.devices",
    "window.devices[].backend",
    "window.devices[].device_gone",
    "window.devices[].faults",
    "window.devices[].faults_age_ms",
    "window.devices[].faults_error",
    "window.devices[].hbm_total_mb",
    "window.devices[].hbm_used_mb",
    "window.devices[].health",
    "window.devices[].hung",
    "window.devices[].id",
    "window.devices[].invalid",
    "window.devices[].last_error",
    "window.devices[].mean",
    "window.devices[].method",
    "window.devices[].peak",
    "window.devices[].source",
    "window.devices[].source_note",
    "window.devices[].source_reason",
    "window.devices[].stale",
    "window.devices[].valid",
    "window.invalid",
    "window.peak",
    "window.seconds",
    "window.truncated",
    "window.valid",
];

fn paths(v: &serde_json::Value, at: &str, out: &mut BTreeSet<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, x) in m {
                let p = if at.is_empty() {
                    k.clone()
                } else {
                    format!("{at}.{k}")
                };
                out.insert(p.clone());
                paths(x, &p, out);
            }
        }
        serde_json::Value::Array(xs) => {
            for x in xs {
                paths(x, &format!("{at}[]"), out);
            }
        }
        _ => {}
    }
}

fn key_paths(v: &serde_json::Value) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    paths(v, "", &mut out);
    out
}

/// The wire crate's fixture: a `/status/detail` body this test captured from the agent.
fn wire_fixture() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("crates/wire/tests/fixtures/status_detail.json")
}

/// The wire crate's fixture has the key paths of `detail`, the agent's answer now (written
/// from it when `NPU_HEALTH_WIRE_FIXTURE=write`), so what that crate reads is what the agent
/// writes.
fn same_as_the_wire_fixture(detail: &serde_json::Value) {
    let path = wire_fixture();
    if std::env::var_os("NPU_HEALTH_WIRE_FIXTURE").is_some_and(|v| v == "write") {
        let text = serde_json::to_string_pretty(detail).unwrap() + "\n";
        std::fs::write(&path, text).unwrap();
    }
    let text = std::fs::read_to_string(&path).expect("the wire crate's fixture");
    let fixture: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        key_paths(&fixture),
        key_paths(detail),
        "{} is not the shape the agent sends: rewrite it with NPU_HEALTH_WIRE_FIXTURE=write",
        path.display()
    );
}

#[test]
fn detail_and_qos_keep_their_shape_and_read_back_into_the_typed_structs() {
    let stack = Stack::start("max_failure_count = 3");
    // A periodic probe has run, so `last_probe` and the QoS components are filled in.
    let detail = stack.wait_until("a periodic probe", Duration::from_secs(20), |d| {
        d["virtual_inference"]["last_probe"]["warmup"] == false
            && d["qos"]["evaluations"].as_u64().unwrap_or(0) > 0
    });
    let want: BTreeSet<String> = DETAIL_PATHS.iter().map(|p| p.to_string()).collect();
    let got = key_paths(&detail);
    assert_eq!(
        got.difference(&want).collect::<Vec<_>>(),
        Vec::<&String>::new(),
        "keys added"
    );
    assert_eq!(
        want.difference(&got).collect::<Vec<_>>(),
        Vec::<&String>::new(),
        "keys lost"
    );
    same_as_the_wire_fixture(&detail);
    // The typed structs read the answer and give back the same JSON.
    let typed: EngineDetail = serde_json::from_value(detail.clone()).expect("typed detail");
    assert_eq!(serde_json::to_value(&typed).unwrap(), detail);
    // What the admin listener answers is `{"engines": [...]}` of these: the envelope reads
    // back too, with a real engine in it (it was tested on an empty list).
    let envelope = serde_json::json!({ "engines": [detail.clone(), detail.clone()] });
    let typed: Engines<EngineDetail> = serde_json::from_value(envelope.clone()).unwrap();
    assert_eq!(typed.engines.len(), 2);
    assert_eq!(typed.engines[1].engine, "e2e");
    assert_eq!(serde_json::to_value(&typed).unwrap(), envelope);
    // `/qos` is the detail's `qos`.
    let url = stack.status_url().replace("/status", "/qos");
    let qos: serde_json::Value = serde_json::from_str(&stack.get(&url).unwrap().1).unwrap();
    let qos_paths: BTreeSet<String> = want
        .iter()
        .filter_map(|p| p.strip_prefix("qos.").map(str::to_owned))
        .collect();
    assert_eq!(key_paths(&qos), qos_paths);
    let typed: EngineQos = serde_json::from_value(qos.clone()).expect("typed qos");
    assert_eq!(serde_json::to_value(&typed).unwrap(), qos);
    assert_eq!(typed.engine, "e2e");
}

/// `GET /metrics` with `accept` as `Accept-Encoding`: the answer's head (lower case) and body.
fn metrics_raw(port: u16, accept: Option<&str>) -> (String, Vec<u8>) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let enc = accept
        .map(|a| format!("Accept-Encoding: {a}\r\n"))
        .unwrap_or_default();
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: x\r\n{enc}Connection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let at = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    (
        String::from_utf8_lossy(&raw[..at]).to_ascii_lowercase(),
        raw[at + 4..].to_vec(),
    )
}

// Issue 42: `/metrics` is gzipped when the scraper asks (Prometheus always does), and is the
// same exposition once unzipped; plain otherwise, or when gzip is refused with q=0.
#[test]
fn metrics_are_gzipped_when_asked_and_plain_otherwise() {
    use std::io::Read;
    let stack = Stack::start("max_failure_count = 3");
    let (head, plain) = metrics_raw(stack.mgmt_port, None);
    assert!(!head.contains("content-encoding"), "{head}");
    assert!(head.contains("vary: accept-encoding"), "{head}");
    let (head, zipped) = metrics_raw(stack.mgmt_port, Some("gzip, deflate"));
    assert!(head.contains("content-encoding: gzip"), "{head}");
    assert!(
        zipped.len() * 4 < plain.len(),
        "{} of {}",
        zipped.len(),
        plain.len()
    );
    let mut text = String::new();
    flate2::read::GzDecoder::new(&zipped[..])
        .read_to_string(&mut text)
        .expect("a gzip stream");
    let names = |t: &str| -> BTreeSet<String> {
        t.lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.split(['{', ' ']).next().map(str::to_owned))
            .collect()
    };
    assert_eq!(names(&text), names(&String::from_utf8_lossy(&plain)));
    assert!(
        text.contains("npu_health_agent_chip_cube_utilization"),
        "{text}"
    );
    let (head, _) = metrics_raw(stack.mgmt_port, Some("gzip;q=0"));
    assert!(!head.contains("content-encoding"), "{head}");
}

// Issue 42: the chip families carry the agent's prefix only, so a node that also runs Huawei's
// npu-exporter never has one series twice; `npu_exporter_names` adds npu-exporter's names,
// with the same samples.
#[test]
fn npu_exporter_names_are_exported_only_when_asked() {
    let own = |t: &str| -> Vec<String> {
        t.lines()
            .filter(|l| l.starts_with("npu_health_agent_chip_"))
            .map(|l| l.replace("npu_health_agent_chip_", ""))
            .filter(|l| !l.starts_with("cube_utilization"))
            .collect()
    };
    let stack = Stack::start("max_failure_count = 3");
    let text = stack.metrics();
    assert!(
        text.contains("npu_health_agent_chip_cube_utilization{"),
        "{text}"
    );
    assert!(!text.contains("npu_chip_info_"), "{text}");
    drop(stack);
    let stack = Stack::start_launch(crate::support::stack::Launch {
        health_check: "max_failure_count = 3",
        agent_extra: "npu_exporter_names = true",
        ..Default::default()
    });
    let text = stack.metrics();
    let theirs: Vec<String> = text
        .lines()
        .filter(|l| l.starts_with("npu_chip_info_"))
        .map(|l| l.replace("npu_chip_info_", ""))
        .filter(|l| !l.starts_with("cube_utilization"))
        .collect();
    assert!(!theirs.is_empty(), "{text}");
    // The same series and values (AI Cube moves between lines; the rest holds still).
    assert_eq!(theirs, own(&text), "{text}");
    assert!(text.contains("npu_chip_info_cube_utilization{"), "{text}");
}
