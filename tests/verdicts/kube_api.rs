//! The Kubernetes API mode end to end: the agent binary on the fake driver and the fake
//! engine as real processes, talking real HTTP to the stand-in API server
//! (`support::kube_api`), which parses every body with the `k8s-openapi` types. Each call
//! the mode makes, and its failures: 403, 409, 429, 500, garbage, a slow server, a pod that
//! cannot be told apart, a pod MindCluster does not manage.
#![cfg(feature = "fake-driver")]

use crate::support;
use crate::support::kube_api::{self, Failure, Route, StandIn};
use crate::support::stack::{Launch, Stack};
use npu_health_agent::integrations::kubernetes::api::LIST_LIMIT;
use npu_health_wire::Level;
use npu_health_wire::{KubeRecord, PodAction};
use std::time::{Duration, Instant};

const GATE: &str = "npu-health-agent.io/qos-ready";

/// QoS evaluated every 500 ms from scrapes every 500 ms.
const FAST_QOS: &str = "[engine.qos]\nperiod = \"500ms\"\nmetrics_period = \"500ms\"\n";

/// A stack whose agent talks to `api` as node `n1`, with `kube_extra` lines in
/// `[agent.kubernetes]` and `engine_extra` after the engine.
fn start(api: &StandIn, kube_extra: &str, engine_extra: &str) -> (Stack, tempfile::TempDir) {
    start_with_token(api, kube_extra, engine_extra, kube_api::TOKEN)
}

/// [`start`] with `token_text` as the token file's content.
fn start_with_token(
    api: &StandIn,
    kube_extra: &str,
    engine_extra: &str,
    token_text: &str,
) -> (Stack, tempfile::TempDir) {
    let secrets = tempfile::tempdir().unwrap();
    let token = secrets.path().join("token");
    std::fs::write(&token, token_text).unwrap();
    let agent_extra = format!(
        "[agent.kubernetes]\nnode_name = \"n1\"\napi_server = \"{}\"\ntoken_file = \"{}\"\nresync_period = \"1s\"\nrequest_timeout = \"1s\"\n{kube_extra}",
        api.url,
        token.display()
    );
    let stack = Stack::start_launch(Launch {
        health_check: "max_failure_count = 3",
        engine_extra,
        agent_extra: &agent_extra,
        ..Launch::default()
    });
    (stack, secrets)
}

/// The engine's pod (host network, its port), a pod of another engine, and a pod with the
/// same port on another node (the field selector must leave it out).
fn pods(stack: &Stack) -> Vec<k8s_openapi::api::core::v1::Pod> {
    let port = stack.engine_port;
    vec![
        kube_api::pod("inference", "vllm-0", "n1", true, &[(port, None)]),
        kube_api::pod("inference", "other", "n1", true, &[(1, None)]),
        kube_api::pod("inference", "vllm-far", "n2", true, &[(port, None)]),
    ]
}

fn record(stack: &Stack) -> KubeRecord {
    stack.typed_detail().kubernetes.expect("the mode's record")
}

/// Waits until `done` holds; panics with `what`, the record and the agent log.
fn wait(stack: &Stack, what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let end = Instant::now() + limit;
    while !done() {
        assert!(
            Instant::now() < end,
            "not within {limit:?}: {what}\nrecord: {:#?}\nagent log:\n{}",
            stack.typed_detail().kubernetes,
            stack.agent_log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn gate(api: &StandIn, name: &str) -> Option<(String, String)> {
    api.api
        .condition("inference", name, GATE)
        .map(|c| (c.status, c.reason.unwrap_or_default()))
}

// The pod is found by the engine's port among this node's pods; the condition is set True,
// with a strategic merge patch of status.conditions that leaves the kubelet's `Ready` alone.
// The API failing (403, 500, garbage, slower than request_timeout) is counted and shown and
// retried; meanwhile the verdict goes on by itself, and once the API answers the condition
// follows it to False.
//
// Each change of the condition is an Event on the pod, and with `escalate_after = 1` the
// first hang is a restart loop, an Event of its own (kubectl describe's rendering printed).
#[test]
fn the_gate_follows_readiness_through_api_failures() {
    let api = StandIn::start(Vec::new());
    let (stack, _secrets) = start(&api, "", "[engine.agent_policy]\nescalate_after = 1\n");
    api.api.set_pods(pods(&stack));
    wait(&stack, "the gate True", Duration::from_secs(20), || {
        gate(&api, "vllm-0") == Some(("True".into(), "QosNormal".into()))
    });
    let list = &api.api.seen_where("GET", "/api/v1/pods")[0];
    assert!(
        list.query.contains("fieldSelector=spec.nodeName%3Dn1"),
        "{list:?}"
    );
    let patch = &api.api.seen_where("PATCH", "/vllm-0/status")[0];
    assert_eq!(patch.content_type, "application/strategic-merge-patch+json");
    assert!(
        patch.query.contains("fieldManager=npu-health-agent"),
        "{patch:?}"
    );
    assert_eq!(
        api.api
            .condition("inference", "vllm-0", "Ready")
            .unwrap()
            .status,
        "True",
        "the kubelet's condition is untouched"
    );
    assert!(gate(&api, "other").is_none() && gate(&api, "vllm-far").is_none());
    // The agent records the condition once the API has answered its patch: a moment after
    // the stand-in applied it (on a loaded machine, more than a moment).
    wait(
        &stack,
        "the agent's record of the gate",
        Duration::from_secs(10),
        || record(&stack).condition.is_some(),
    );
    let r = record(&stack);
    assert_eq!(r.pod.as_deref(), Some("inference/vllm-0"));
    assert_eq!(r.condition.as_ref().unwrap().status, "True");

    api.api.fail(
        Route::PatchStatus,
        &[
            Failure::Status(403, "Forbidden"),
            Failure::Status(500, "InternalError"),
            Failure::Garbage,
            Failure::Slow(Duration::from_secs(3)),
            Failure::Status(409, "Conflict"),
        ],
    );
    api.api
        .fail(Route::List, &[Failure::Status(500, "InternalError")]);
    stack.faults(r#"{"hang": true}"#);
    stack.wait_for_status("abnormal", Duration::from_secs(30));
    wait(&stack, "the gate False", Duration::from_secs(60), || {
        gate(&api, "vllm-0") == Some(("False".into(), "EngineAbnormal".into()))
    });
    wait(
        &stack,
        "the agent's record of the gate False",
        Duration::from_secs(10),
        || {
            record(&stack)
                .condition
                .is_some_and(|c| c.status == "False")
        },
    );
    let r = record(&stack);
    assert!(r.api_errors >= 5, "{r:#?}");
    let c = r.condition.clone().unwrap();
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "EngineAbnormal")
    );
    assert!(
        c.message.starts_with("not ready: abnormal"),
        "{}",
        c.message
    );
    assert!(
        r.attempts
            .iter()
            .any(|a| a.action == PodAction::Condition && a.detail.starts_with("False")),
        "{:#?}",
        r.attempts
    );
    assert!(
        r.last_api_error
            .as_deref()
            .is_some_and(|e| e.contains("409") || e.contains("500")),
        "{r:#?}"
    );
    let log = stack.agent_log();
    assert!(log.contains("403"), "the failure is logged:\n{log}");
    // Hardening round 3, oddity: only the agent's line, not kube's context-free copy.
    assert!(
        !log.contains("failed with status"),
        "a dependency's line without context:\n{log}"
    );
    assert!(
        log.matches("Kubernetes API: setting condition").count() <= 2,
        "the same failure is logged once a minute:\n{log}"
    );
    // The verdict is the engine's, not the API's.
    assert_eq!(
        stack.get(&stack.status_url()).unwrap().1,
        r#"{"status":"abnormal"}"#
    );
    wait(&stack, "three Events", Duration::from_secs(10), || {
        api.api.events().len() >= 3
    });
    let described = api.api.describe_events("inference", "vllm-0");
    eprintln!("{described}");
    let evs = api.api.events();
    let of = |reason: &str| {
        evs.iter()
            .find(|e| e.reason.as_deref() == Some(reason))
            .unwrap_or_else(|| panic!("no {reason} Event:\n{described}"))
    };
    let ready = of("EngineReady");
    assert_eq!(ready.type_.as_deref(), Some("Normal"));
    let not_ready = of("EngineNotReady");
    assert_eq!(not_ready.type_.as_deref(), Some("Warning"));
    assert!(
        not_ready
            .note
            .as_deref()
            .is_some_and(|n| n.contains(GATE) && n.contains("False (EngineAbnormal)")),
        "{not_ready:?}"
    );
    let lp = of("RestartLoop");
    assert!(
        lp.note
            .as_deref()
            .is_some_and(|n| n.contains("restart loop")),
        "{lp:?}"
    );
    let r = not_ready.regarding.as_ref().unwrap();
    assert_eq!(
        (r.kind.as_deref(), r.name.as_deref(), r.uid.as_deref()),
        (Some("Pod"), Some("vllm-0"), Some("uid-inference-vllm-0"))
    );
    assert_eq!(
        not_ready.reporting_instance.as_deref(),
        Some("npu-health-agent.io/agent-n1")
    );
    assert!(described.contains("Warning  RestartLoop"), "{described}");
}

// The stand-in refuses what the API server refuses of an events.k8s.io/v1 Event
// (pkg/apis/core/validation/events.go), so the agent's Events are checked against it: a
// note over 1024 bytes, a legacy field set, a series of count 1, a controller that is not a
// qualified name. The same Event within the limits is created.
#[test]
fn the_stand_in_refuses_an_event_the_api_server_would() {
    let api = StandIn::start(Vec::new());
    let url = format!(
        "{}/apis/events.k8s.io/v1/namespaces/inference/events",
        api.url
    );
    let auth = format!("Bearer {}", kube_api::TOKEN);
    let post = |e: &serde_json::Value| {
        support::stack::http_with(
            "POST",
            &url,
            Some(&e.to_string()),
            &[("Authorization", &auth)],
        )
        .unwrap()
    };
    let good = serde_json::json!({
        "apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"name": "vllm-0.1", "namespace": "inference"},
        "eventTime": "2026-12-07T06:00:00.000000Z",
        "type": "Warning", "reason": "EngineNotReady", "action": "SetCondition",
        "reportingController": "npu-health-agent.io/agent",
        "reportingInstance": "npu-health-agent.io/agent-n1",
        "regarding": {"apiVersion": "v1", "kind": "Pod", "namespace": "inference", "name": "vllm-0"},
        "note": "x",
    });
    let bad = |key: &str, v: serde_json::Value| {
        let mut e = good.clone();
        e[key] = v;
        e
    };
    for (what, e) in [
        ("note", bad("note", "é".repeat(513).into())),
        ("deprecatedCount", bad("deprecatedCount", 3.into())),
        (
            "series.count",
            bad(
                "series",
                serde_json::json!({"count": 1, "lastObservedTime": "2026-12-07T06:00:00.000000Z"}),
            ),
        ),
        (
            "reportingController",
            bad("reportingController", "npu health agent".into()),
        ),
        ("eventTime", bad("eventTime", serde_json::Value::Null)),
    ] {
        let (code, body) = post(&e);
        assert_eq!(code, 422, "{what}: {body}");
        assert!(body.contains(what), "{what}: {body}");
    }
    assert_eq!(post(&good).0, 201);
    assert_eq!(post(&good).0, 409, "the same name again");
    assert_eq!(api.api.events().len(), 1);
}

// Hardening round 2, case 3: `token_file` is read as `admin_token_file` is (surrounding
// whitespace dropped): a file written with `echo`, a final newline, works (the mode did not
// start); a token file that cannot serve is refused by check-config, naming the key.
#[test]
fn a_kubernetes_token_file_is_read_as_the_admin_token_file_is() {
    let api = StandIn::start(Vec::new());
    let (stack, secrets) = start_with_token(&api, "", "", &format!("{}\n", kube_api::TOKEN));
    api.api.set_pods(pods(&stack));
    wait(&stack, "the gate True", Duration::from_secs(20), || {
        gate(&api, "vllm-0") == Some(("True".into(), "QosNormal".into()))
    });
    // check-config binds the listeners: the agent's own are freed first.
    let config = secrets.path().join("agent.toml");
    std::fs::copy(stack.dir.path().join("agent.toml"), &config).unwrap();
    drop(stack);
    let check = |token: &str| {
        std::fs::write(secrets.path().join("token"), token).unwrap();
        let out = std::process::Command::new(support::agent())
            .args(["--fake", "check-config", "--config"])
            .arg(&config)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, err) = check(&format!("{}\n", kube_api::TOKEN));
    assert_eq!(code, Some(0), "{err}");
    let (code, err) = check("short\n");
    assert_ne!(code, Some(0), "{err}");
    assert!(
        err.contains("[agent.kubernetes] token_file") && err.contains("at least 16"),
        "{err}"
    );
}

/// The process's peak resident memory so far (`VmHWM`), in bytes.
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/<pid>/status");
    kb * 1024
}

/// The bodies the flood answers with: 50 MB each.
const FLOOD_BODY: usize = 50_000_000;

// Hardening round 2, case 1: an API server that answers 50 MB bodies to every call for a
// while (a 2xx list that is not JSON, a 5xx whose Status message is the 50 MB) costs the
// agent at most twice the 16 MiB list limit of memory (before the limit: +500 MiB, and the
// log grew by 150 MB); each failure is logged as one short line naming the call, the status
// and why; /status is untouched; the gate recovers after.
#[test]
fn a_huge_api_answer_is_read_to_a_limit_and_logged_short() {
    let api = StandIn::start(Vec::new());
    let (stack, _secrets) = start(&api, "", "");
    api.api.set_pods(pods(&stack));
    wait(&stack, "the gate True", Duration::from_secs(20), || {
        gate(&api, "vllm-0") == Some(("True".into(), "QosNormal".into()))
    });
    let pid = stack.agent.id();
    let rss_before = peak_rss(pid);
    let log_before = stack.agent_log().len();
    let lists_before = api.api.seen_where("GET", "/api/v1/pods").len();
    let patches_before = api.api.seen_where("PATCH", "/vllm-0/status").len();
    const FLOODED: usize = 8;
    api.api
        .fail(Route::List, &vec![Failure::Huge(200, FLOOD_BODY); FLOODED]);
    api.api.fail(
        Route::PatchStatus,
        &vec![Failure::Huge(500, FLOOD_BODY); FLOODED],
    );
    stack.faults(r#"{"hang": true}"#);
    wait(
        &stack,
        "every flooded answer asked for",
        Duration::from_secs(60),
        || {
            api.api.seen_where("GET", "/api/v1/pods").len() >= lists_before + FLOODED
                && api.api.seen_where("PATCH", "/vllm-0/status").len() >= patches_before + FLOODED
        },
    );
    let rss_after = peak_rss(pid);
    let log = stack.agent_log();
    let grown = &log[log_before..];
    eprintln!(
        "peak RSS {} -> {} MiB; log +{} bytes:\n{grown}",
        rss_before >> 20,
        rss_after >> 20,
        grown.len()
    );
    // The list limit, and as much again for the client's own buffers and the allocator.
    let bound = rss_before + 2 * LIST_LIMIT as u64;
    assert!(
        rss_after < bound,
        "peak RSS grew from {} to {} MiB",
        rss_before >> 20,
        rss_after >> 20
    );
    assert!(
        grown.len() < 16 << 10,
        "the log grew by {} bytes",
        grown.len()
    );
    assert!(
        log.lines().all(|l| l.len() < 2048),
        "a log line of {} bytes",
        log.lines().map(str::len).max().unwrap_or(0)
    );
    assert!(
        grown.contains(
            "listing the pods of node n1: HTTP 200: the answer's body is over 16777216 bytes"
        ),
        "the list's failure, named:\n{grown}"
    );
    assert!(
        grown.contains("setting condition npu-health-agent.io/qos-ready on pod inference/vllm-0: HTTP 500: the answer's body is over 65536 bytes"),
        "the patch's failure, named:\n{grown}"
    );
    let r = record(&stack);
    assert!(
        r.last_api_error.as_deref().is_some_and(|e| e.len() < 1024),
        "{r:#?}"
    );
    // The verdict went on by itself, and the gate follows it once the API answers again.
    stack.wait_for_status("abnormal", Duration::from_secs(30));
    wait(&stack, "the gate False", Duration::from_secs(60), || {
        gate(&api, "vllm-0") == Some(("False".into(), "EngineAbnormal".into()))
    });
}

// A 5xx whose Status message is 20 kB (under the error limit, so it is read): the error
// keeps the reason and the message, quoted and cut at 512 bytes.
#[test]
fn a_long_api_error_message_is_cut() {
    let api = StandIn::start(Vec::new());
    let (stack, _secrets) = start(&api, "", "");
    api.api.set_pods(pods(&stack));
    wait(&stack, "the gate True", Duration::from_secs(20), || {
        gate(&api, "vllm-0") == Some(("True".into(), "QosNormal".into()))
    });
    api.api
        .fail(Route::PatchStatus, &vec![Failure::Huge(500, 20_000); 3]);
    stack.faults(r#"{"hang": true}"#);
    wait(
        &stack,
        "the failure recorded",
        Duration::from_secs(60),
        || {
            record(&stack)
                .last_api_error
                .is_some_and(|e| e.contains("InternalError"))
        },
    );
    let e = record(&stack).last_api_error.unwrap();
    assert!(e.contains("HTTP 500 InternalError: \"xxxx"), "{e}");
    assert!(e.contains("more bytes)"), "{e}");
    assert!(e.len() < 1024, "{} bytes: {e}", e.len());
}

// Two pods serve the engine's port: the mode names both and does nothing; once one is gone
// it acts on the other. A pod named in the config that does not exist is said so.
//
// With `events = false` no Event is posted, though the condition is set.
#[test]
fn the_mode_never_guesses_the_pod() {
    let api = StandIn::start(Vec::new());
    let (stack, _secrets) = start(&api, "events = false\n", "");
    let mut two = pods(&stack);
    two.push(kube_api::pod(
        "inference",
        "vllm-1",
        "n1",
        false,
        &[(80, Some(stack.engine_port))],
    ));
    api.api.set_pods(two.clone());
    wait(
        &stack,
        "the two pods named",
        Duration::from_secs(20),
        || {
            record(&stack)
                .pod_error
                .is_some_and(|e| e.contains("inference/vllm-0") && e.contains("inference/vllm-1"))
        },
    );
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        api.api.seen_where("PATCH", "/status").is_empty(),
        "nothing was patched"
    );
    two.retain(|p| p.metadata.name.as_deref() != Some("vllm-0"));
    api.api.set_pods(two);
    wait(
        &stack,
        "the host-port pod's gate",
        Duration::from_secs(20),
        || gate(&api, "vllm-1").is_some(),
    );
    assert_eq!(record(&stack).pod_error, None);
    wait(&stack, "the gate recorded", Duration::from_secs(10), || {
        record(&stack).condition.is_some()
    });
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        api.api.seen_where("POST", "/events").is_empty(),
        "events = false"
    );

    let api = StandIn::start(Vec::new());
    let (stack, _secrets) = start(
        &api,
        "",
        "[engine.kubernetes]\npod = \"inference/missing\"\n",
    );
    wait(
        &stack,
        "the missing pod named",
        Duration::from_secs(20),
        || {
            record(&stack)
                .pod_error
                .is_some_and(|e| e.contains("inference/missing does not exist"))
        },
    );
    assert!(!api.api.seen_where("GET", "/pods/missing").is_empty());
}

/// Makes the engine busy but stuck with its KV cache nearly full: the score falls below 0.3
/// with progress stalled, so the level reaches a held `evict` (every input present).
fn wedge(stack: &Stack) -> Vec<std::net::TcpStream> {
    stack.faults(r#"{"npu_busy_stuck": true, "kv_cache_usage": 0.97}"#);
    let held = stack.hold_requests(4, r#"{"model": "m", "prompt": "stuck", "max_tokens": 100}"#);
    stack.wait_until_typed("level evict", Duration::from_secs(60), |d| {
        d.qos.state.level == Level::Evict
    });
    held
}

// A held evict: the first Eviction is refused by a PodDisruptionBudget (429) and tried
// again after the back-off; the second goes through. The body is a policy/v1 Eviction for
// the engine's pod; the record shows both attempts. The pod being deleted, no third one.
#[test]
fn a_held_evict_evicts_through_a_pdb_refusal() {
    let api = StandIn::start(Vec::new());
    // The first Event (the gate True) is refused: counted, not tried again, nothing else
    // changes.
    api.api
        .fail(Route::EventCreate, &[Failure::Status(500, "InternalError")]);
    let (stack, _secrets) = start(&api, "", FAST_QOS);
    api.api.set_pods(pods(&stack));
    wait(&stack, "the gate True", Duration::from_secs(20), || {
        gate(&api, "vllm-0").is_some()
    });
    api.api
        .fail(Route::Evict, &[Failure::Status(429, "TooManyRequests")]);
    let _held = wedge(&stack);
    wait(&stack, "two evictions", Duration::from_secs(40), || {
        api.api.seen_where("POST", "/vllm-0/eviction").len() >= 2
    });
    let evs = api.api.seen_where("POST", "/vllm-0/eviction");
    let body: k8s_openapi::api::policy::v1::Eviction = serde_json::from_str(&evs[1].body).unwrap();
    assert_eq!(body.metadata.name.as_deref(), Some("vllm-0"));
    assert!(
        evs[1].body.contains("\"apiVersion\":\"policy/v1\""),
        "{}",
        evs[1].body
    );
    wait(
        &stack,
        "the pod being deleted",
        Duration::from_secs(5),
        || {
            api.api
                .pod("inference", "vllm-0")
                .unwrap()
                .metadata
                .deletion_timestamp
                .is_some()
        },
    );
    // The agent records the eviction once the API has answered it.
    wait(
        &stack,
        "the agent's record of the eviction",
        Duration::from_secs(10),
        || {
            record(&stack)
                .attempts
                .iter()
                .any(|a| a.action == PodAction::Eviction && a.outcome.as_str() == "done")
        },
    );
    let r = record(&stack);
    let outcomes: Vec<(&str, &str)> = r
        .attempts
        .iter()
        .filter(|a| a.action == PodAction::Eviction)
        .map(|a| (a.outcome.as_str(), a.pod.as_str()))
        .collect();
    assert_eq!(
        outcomes,
        [
            ("refused", "inference/vllm-0"),
            ("done", "inference/vllm-0")
        ],
        "{r:#?}"
    );
    assert!(
        r.attempts.iter().any(|a| a.detail.contains("held")),
        "{r:#?}"
    );
    assert_eq!(gate(&api, "vllm-0").map(|g| g.1), Some("QosEvict".into()));
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        api.api.seen_where("POST", "/eviction").len(),
        2,
        "no third eviction"
    );
    assert!(
        stack.agent_log().contains("PodDisruptionBudget") || stack.agent_log().contains("refused")
    );
    // The counters by action and outcome, every pair present (zeros included).
    let metrics = stack.metrics();
    let count = |action: &str, outcome: &str| {
        metrics
            .lines()
            .find(|l| {
                l.starts_with("npu_health_agent_kubernetes_actions_total{")
                    && l.contains(&format!("action=\"{action}\""))
                    && l.contains(&format!("outcome=\"{outcome}\""))
            })
            .unwrap_or_else(|| panic!("no {action}/{outcome} series:\n{metrics}"))
            .rsplit(' ')
            .next()
            .unwrap()
            .parse::<f64>()
            .unwrap()
    };
    assert_eq!(count("eviction", "refused"), 1.0);
    assert_eq!(count("eviction", "done"), 1.0);
    assert_eq!(count("mindcluster_annotation", "pod_gone"), 0.0);
    assert!(count("condition", "done") >= 1.0);
    // The refusal and the eviction are Events on the pod; the refused gate-True Event is
    // counted failed.
    wait(
        &stack,
        "the eviction's Event",
        Duration::from_secs(10),
        || {
            api.api
                .events()
                .iter()
                .any(|e| e.reason.as_deref() == Some("EngineEvicted"))
        },
    );
    let described = api.api.describe_events("inference", "vllm-0");
    eprintln!("{described}");
    let reasons: Vec<String> = api
        .api
        .events()
        .iter()
        .filter_map(|e| e.reason.clone())
        .collect();
    assert!(!reasons.contains(&"EngineReady".to_owned()), "{described}");
    assert!(
        reasons.contains(&"EvictionRefused".to_owned()),
        "{described}"
    );
    let evicted = api
        .api
        .events()
        .into_iter()
        .find(|e| e.reason.as_deref() == Some("EngineEvicted"))
        .unwrap();
    assert!(
        evicted.note.as_deref().is_some_and(|n| n.contains("held")),
        "{evicted:?}"
    );
    let metrics = stack.metrics();
    assert!(
        metrics.contains("npu_health_agent_kubernetes_events_total{outcome=\"failed\"} 1"),
        "{metrics}"
    );
}

// eviction = "mindcluster": a pod infer-operator does not manage gets nothing (the attempt
// says why); one that carries its label gets huawei.com/pod-status = Unhealthy-….
#[test]
fn mindcluster_annotates_only_infer_operator_pods() {
    let api = StandIn::start(Vec::new());
    let (stack, _secrets) = start(
        &api,
        "eviction = \"mindcluster\"\neviction_cooldown = \"10s\"\n",
        FAST_QOS,
    );
    let mut ps = pods(&stack);
    api.api.set_pods(ps.clone());
    let _held = wedge(&stack);
    wait(
        &stack,
        "a refused annotation",
        Duration::from_secs(30),
        || {
            record(&stack).attempts.iter().any(|a| {
                a.action == PodAction::MindclusterAnnotation
                    && a.detail.contains("infer.huawei.com/ascend-infer-operator")
            })
        },
    );
    assert!(api.api.seen_where("PATCH", "/pods/vllm-0").is_empty());
    ps[0]
        .metadata
        .labels
        .get_or_insert_with(Default::default)
        .insert(
            "infer.huawei.com/ascend-infer-operator".into(),
            "true".into(),
        );
    api.api.set_pods(ps);
    wait(&stack, "the annotation", Duration::from_secs(30), || {
        api.api
            .pod("inference", "vllm-0")
            .and_then(|p| p.metadata.annotations)
            .and_then(|a| a.get("huawei.com/pod-status").cloned())
            .is_some_and(|v| v.starts_with("Unhealthy"))
    });
    assert!(
        api.api.seen_where("POST", "/eviction").is_empty(),
        "no Eviction in this mode"
    );
}

// Outside a cluster without api_server: the agent runs and serves, and the record says why
// the mode cannot act.
#[test]
fn without_a_cluster_the_mode_says_why_and_the_agent_runs() {
    let stack = Stack::start_launch(Launch {
        health_check: "max_failure_count = 3",
        agent_extra: "[agent.kubernetes]\nnode_name = \"n1\"\n",
        ..Launch::default()
    });
    let r = record(&stack);
    assert!(
        r.inactive
            .as_deref()
            .is_some_and(|w| w.contains("in-cluster")),
        "{r:#?}"
    );
    assert_eq!(
        stack.get(&stack.status_url()).unwrap().1,
        r#"{"status":"normal"}"#
    );
}

/// Bytes of the padded pods' annotation: lists near [`LIST_LIMIT`] take a few thousand.
const PAD: usize = 7_000;

// Hardening round 3, case 4: sixteen engines whose pod lists are just under the 16 MiB bound.
// Before, each engine's loop read its own list at every resync, all at the same instant
// (RSS 295 MB, peak 325 MB, over the 256 MiB of the unit and the DaemonSet); now one list per
// resync answers them all. Prints the figures (BENCHMARKS.md quotes them).
#[test]
fn sixteen_engines_share_one_pod_list_per_resync() {
    use std::fmt::Write as _;
    const ENGINES: usize = 16;
    let ports: [u16; 2 * ENGINES] = support::stack::free_ports();
    let (engine_ports, mgmt_ports) = ports.split_at(ENGINES);
    let mut pods: Vec<_> = engine_ports
        .iter()
        .enumerate()
        .map(|(i, &p)| kube_api::pod("inference", &format!("vllm-{i}"), "n1", true, &[(p, None)]))
        .collect();
    let size = |pods: &Vec<k8s_openapi::api::core::v1::Pod>| {
        serde_json::to_vec(&serde_json::json!({"kind": "PodList", "items": pods}))
            .unwrap()
            .len()
    };
    let mut pad = 0;
    loop {
        let mut p = kube_api::pod("batch", &format!("pad-{pad}"), "n1", false, &[(1, None)]);
        p.metadata.annotations = Some(std::collections::BTreeMap::from([(
            "pad".to_owned(),
            "x".repeat(PAD),
        )]));
        pods.push(p);
        pad += 1;
        if pad % 100 == 0 && size(&pods) + 100 * (PAD + 1_000) > LIST_LIMIT - (64 << 10) {
            break;
        }
    }
    let list_bytes = size(&pods);
    assert!(list_bytes < LIST_LIMIT, "{list_bytes}");
    let api = StandIn::start(pods);

    let dir = tempfile::tempdir().unwrap();
    let secrets = dir.path().join("token");
    std::fs::write(&secrets, kube_api::TOKEN).unwrap();
    let scenario = dir.path().join("scenario.toml");
    std::fs::write(&scenario, "model = \"910B\"\ncards = 16\n").unwrap();
    let mut toml = format!(
        "[agent]\nsample_period = \"20ms\"\n[agent.kubernetes]\nnode_name = \"n1\"\napi_server = \"{}\"\ntoken_file = \"{}\"\nresync_period = \"4s\"\nrequest_timeout = \"10s\"\n",
        api.url,
        secrets.display()
    );
    for i in 0..ENGINES {
        write!(
            toml,
            "\n[[engine]]\nname = \"e{i}\"\nengine_type = \"vllm\"\nserved_model_name = \"m\"\nhost = \"127.0.0.1\"\nport = {}\nmgmt_port = {}\ndevices = [{i}]\nengine_env = {{}}\n",
            engine_ports[i], mgmt_ports[i]
        )
        .unwrap();
    }
    let config = dir.path().join("agent.toml");
    std::fs::write(&config, toml).unwrap();
    let mut agent = support::spawn_agent_with(dir.path(), &config, &scenario, &[]);
    let log = || std::fs::read_to_string(dir.path().join("agent.log")).unwrap_or_default();
    let found = |i: usize| {
        support::stack::http(
            "GET",
            &format!("http://127.0.0.1:{}/status/detail", mgmt_ports[i]),
            None,
        )
        .is_some_and(|(_, d)| d.contains(&format!("\"pod\":\"inference/vllm-{i}\"")))
    };
    let end = Instant::now() + Duration::from_secs(120);
    while !(0..ENGINES).all(found) {
        assert!(
            Instant::now() < end,
            "not every engine found its pod:\n{}",
            log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // Four more resyncs.
    let lists = || api.api.seen_where("GET", "/api/v1/pods").len();
    let (lists_before, started) = (lists(), Instant::now());
    std::thread::sleep(Duration::from_secs(16));
    let (listed, resyncs) = (
        lists() - lists_before,
        started.elapsed().as_secs_f64() / 4.0,
    );
    let peak = peak_rss(agent.id());
    let _ = agent.kill();
    let _ = agent.wait();
    println!(
        "{ENGINES} engines, lists of {list_bytes} bytes ({} pods): {listed} list(s) in {resyncs:.1} resyncs; agent peak RSS {} MiB",
        ENGINES + pad,
        peak >> 20
    );
    assert!(
        (listed as f64) <= 2.0 * resyncs.ceil(),
        "{listed} lists in {resyncs:.1} resyncs: each engine asked for its own\n{}",
        log()
    );
    assert!(
        peak < 256 << 20,
        "peak RSS {} MiB, over the shipped 256 MiB",
        peak >> 20
    );
}
