//! MindCluster public faults end to end: the agent binary on the fake driver (two NPUs with
//! physical ids 5 and 7) and the fake engine as real processes, writing its ConfigMap to the
//! stand-in API server over real HTTP, read by the stand-in ClusterD (`support::clusterd`),
//! which applies ClusterD's own rules. And the stand-in's rules themselves, so that it can
//! fail: what ClusterD rejects, it rejects.
#![cfg(feature = "fake-driver")]

use crate::support::clusterd::{ClusterD, HOLD};
use crate::support::kube_api::{self, Failure, Route, StandIn};
use crate::support::stack::{Launch, Stack};
use std::time::{Duration, Instant};

/// The operator's `publicCustomization.json`, as docs/kubernetes.md gives it.
const CUSTOM: &str = r#"{
  "publicFaultCode": {
    "NotHandleFaultCodes": [],
    "SubHealthFaultCodes": ["010019001"],
    "SeparateNPUCodes": ["020019002"],
    "PreSeparateNPUCodes": []
  },
  "publicFaultResource": ["npu-health-agent"]
}"#;

/// A message of one fault: `occur` of `code` on `ids` of node `n1`, from `resource`.
fn one(id: &str, code: &str, assertion: &str, ids: &[i64], resource: &str) -> String {
    serde_json::json!({
        "id": format!("msg-{id}"), "timestamp": 1_796_600_000_000u64, "version": "1.0",
        "resource": resource,
        "faults": [{
            "faultId": id, "faultType": "NPU", "faultCode": code,
            "faultTime": 1_796_600_000_000u64, "assertion": assertion,
            "influence": [{"nodeName": "n1", "deviceIds": ids}],
            "description": "test"
        }]
    })
    .to_string()
}

// The stand-in takes what ClusterD takes and drops, silently, what it drops: more than 32
// device ids, an id over 31, a code its configuration does not list, an unknown sender,
// a 101st message in a second from one sender; a recover within 5 s of its occur waits.
#[test]
fn the_stand_in_clusterd_rejects_what_clusterd_rejects() {
    let mut c = ClusterD::new(CUSTOM);
    let t = Instant::now();
    let ok = "npu-health-agent";
    assert_eq!(
        c.receive(&one("fault-ok-1", "010019001", "occur", &[5, 7], ok), t),
        Ok(())
    );
    let held = c.faults("n1", t);
    assert_eq!((held.len(), held[0].level.as_str()), (1, "SubHealthFault"));
    let many: Vec<i64> = (0..33).collect();
    for bad in [
        one("fault-many", "010019001", "occur", &many, ok),
        one("fault-high", "010019001", "occur", &[32], ok),
        one("fault-twice", "010019001", "occur", &[3, 3], ok),
        one("fault-code", "010019999", "occur", &[5], ok),
        one("short", "010019001", "occur", &[5], ok),
    ] {
        assert_eq!(
            c.receive(&bad, t),
            Err("there is no valid fault".to_owned()),
            "{bad}"
        );
    }
    assert!(
        c.receive(&one("fault-who", "010019001", "occur", &[5], "someone"), t)
            .is_err()
    );
    assert_eq!(c.faults("n1", t).len(), 1, "nothing rejected was kept");
    // The recover 1 s after the occur: held until 5 s after it.
    c.receive(
        &one("fault-ok-1", "010019001", "recover", &[5, 7], ok),
        t + Duration::from_secs(1),
    )
    .unwrap();
    assert_eq!(c.faults("n1", t + Duration::from_secs(4)).len(), 1);
    assert_eq!(c.faults("n1", t + HOLD).len(), 0);
    // The limiter: 100 at once (one went above), then one a second.
    let t = t + Duration::from_secs(200);
    let sent: Vec<bool> = (0..101)
        .map(|i| {
            c.receive(
                &one(&format!("fault-rate-{i:03}"), "010019001", "once", &[1], ok),
                t,
            )
            .is_ok()
        })
        .collect();
    assert_eq!(sent.iter().filter(|a| **a).count(), 100);
    assert!(!sent[100]);
    assert!(c.log.last().unwrap().contains("exceeds the upper limit"));
    assert!(
        c.receive(
            &one("fault-rate-x", "010019001", "once", &[1], ok),
            t + Duration::from_secs(1)
        )
        .is_ok()
    );
}

/// The stack: public faults on, the engine's two NPUs with physical ids 5 and 7, a restart
/// loop at the second episode.
fn start(api: &StandIn) -> (Stack, tempfile::TempDir) {
    let secrets = tempfile::tempdir().unwrap();
    let token = secrets.path().join("token");
    std::fs::write(&token, kube_api::TOKEN).unwrap();
    // Inline: the stack writes `state_dir` after these lines, into `[agent]`.
    let agent_extra = format!(
        "kubernetes = {{ node_name = \"n1\", api_server = \"{}\", token_file = \"{}\", request_timeout = \"1s\", readiness_gate = false, eviction = \"off\", public_faults = true, public_fault_namespace = \"npu-health-agent\", public_fault_min_interval = \"1s\" }}\n",
        api.url,
        token.display()
    );
    let stack = Stack::start_launch(Launch {
        health_check: "max_failure_count = 3",
        engine_extra: "[engine.agent_policy]\nescalate_after = 2\n",
        per_device: ["phy_id = 5", "phy_id = 7"],
        agent_extra: &agent_extra,
        state_dir: true,
        ..Launch::default()
    });
    (stack, secrets)
}

/// The faults ClusterD would hold for node `n1` now, from every write so far.
fn held(api: &StandIn) -> (ClusterD, Vec<(String, String, Vec<i64>)>) {
    let mut c = ClusterD::new(CUSTOM);
    c.read_writes(&api.api.configmap_writes());
    let f = c
        .faults("n1", Instant::now())
        .into_iter()
        .map(|h| (h.code, h.level, h.device_ids))
        .collect();
    (c, f)
}

fn wait(stack: &Stack, what: &str, mut done: impl FnMut() -> bool) {
    let end = Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(
            Instant::now() < end,
            "not within 60 s: {what}\nagent log:\n{}",
            stack.agent_log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The assertions of every message ClusterD took, in order.
fn assertions(c: &ClusterD) -> Vec<String> {
    c.accepted
        .iter()
        .flat_map(|m| m["faults"].as_array().cloned().unwrap_or_default())
        .map(|f| {
            format!(
                "{} {}",
                f["assertion"].as_str().unwrap(),
                f["faultCode"].as_str().unwrap()
            )
        })
        .collect()
}

// An abnormal engine's occur is taken by ClusterD with its NPUs' physical ids and the level
// the operator mapped; an agent restart while it is abnormal sends no second occur; the
// engine restarted while no agent ran gets its recover from the next agent; the second
// episode is a restart loop, published with the severe code.
#[test]
fn an_abnormal_engine_is_a_public_fault_until_it_recovers_across_agent_restarts() {
    let api = StandIn::start(Vec::new());
    let (mut stack, _secrets) = start(&api);
    stack.wait_for_status("normal", Duration::from_secs(30));
    // The API server fails the first two writes: retried with back-off, counted, logged.
    api.api.fail(
        Route::ConfigMap,
        &[
            Failure::Status(500, "InternalError"),
            Failure::Status(503, "ServiceUnavailable"),
        ],
    );
    stack.faults(r#"{"hang": true}"#);
    stack.wait_for_status("abnormal", Duration::from_secs(30));
    wait(&stack, "the occur", || !held(&api).1.is_empty());
    let d = stack.typed_detail();
    assert!(
        d.kubernetes.unwrap().api_errors >= 2,
        "the failed writes are counted"
    );
    assert!(
        stack
            .agent_log()
            .contains("public faults: writing ConfigMap"),
        "logged"
    );
    // The journal's entry: the point where a publish succeeded.
    assert!(
        d.actions.iter().any(
            |a| (a.integration.as_str(), a.action.as_str(), a.to.as_str())
                == ("kubernetes_api", "public_fault", "occur")
        ),
        "{:#?}",
        d.actions
    );
    let (c, faults) = held(&api);
    assert_eq!(
        faults,
        [(
            "010019001".to_owned(),
            "SubHealthFault".to_owned(),
            vec![5, 7]
        )]
    );
    eprintln!("occur as ClusterD took it: {}", c.accepted[0]);
    let cm = api.api.configmap_writes()[0].1.clone();
    assert_eq!(cm.metadata.namespace.as_deref(), Some("npu-health-agent"));
    assert!(c.log.is_empty(), "{:?}", c.log);

    // Restarted while abnormal: the new agent restores the episode and sends nothing.
    stack.restart_agent("TERM");
    stack.wait_for_status("abnormal", Duration::from_secs(30));
    wait(&stack, "the new agent's loop", || {
        stack
            .last_agent_log()
            .contains("public faults: published in ConfigMap")
    });
    // Some ticks of the new agent's loop (a duplicate would be written at its first).
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        api.api.configmap_writes().len(),
        1,
        "no second occur:\n{}",
        stack.last_agent_log()
    );

    // The engine restarts while no agent runs: the next agent owes and sends the recover.
    stack.stop_agent("TERM");
    stack.kill_engine();
    stack.start_engine();
    stack.agent = stack.spawn_agent();
    stack.wait_for_status("normal", Duration::from_secs(30));
    wait(&stack, "the recover", || {
        api.api.configmap_writes().len() >= 2
    });
    let (c, _) = held(&api);
    assert_eq!(assertions(&c), ["occur 010019001", "recover 010019001"]);
    eprintln!("recover as ClusterD took it: {}", c.accepted[1]);
    assert_eq!(
        c.accepted[1]["faults"][0]["faultTime"],
        c.accepted[0]["faults"][0]["faultTime"]
    );
    assert_eq!(
        c.accepted[1]["faults"][0]["faultId"],
        c.accepted[0]["faults"][0]["faultId"]
    );
    wait(&stack, "the fault cleared after ClusterD's hold", || {
        held(&api).1.is_empty()
    });

    // The second episode within the window: the restart loop's code, SeparateNPU.
    stack.faults(r#"{"hang": true}"#);
    stack.wait_for_status("abnormal", Duration::from_secs(30));
    wait(&stack, "the restart loop's occur", || {
        !held(&api).1.is_empty()
    });
    let (c, faults) = held(&api);
    assert_eq!(
        faults,
        [("020019002".to_owned(), "SeparateNPU".to_owned(), vec![5, 7])]
    );
    assert_eq!(
        assertions(&c),
        ["occur 010019001", "recover 010019001", "occur 020019002"]
    );

    // The engine restarts while no agent runs, and the state file is lost (older than its
    // hour, say): the next agent reads its ConfigMap back and sends the recover it owes.
    stack.stop_agent("TERM");
    stack.kill_engine();
    stack.start_engine();
    std::fs::remove_file(stack.path("run/state.json")).unwrap();
    stack.agent = stack.spawn_agent();
    stack.wait_for_status("normal", Duration::from_secs(30));
    wait(&stack, "the loop's recover", || {
        api.api.configmap_writes().len() >= 4
    });
    let (c, _) = held(&api);
    assert_eq!(
        assertions(&c),
        [
            "occur 010019001",
            "recover 010019001",
            "occur 020019002",
            "recover 020019002"
        ]
    );
    assert_eq!(
        c.accepted[3]["faults"][0]["faultId"],
        c.accepted[2]["faults"][0]["faultId"]
    );
    assert!(c.log.is_empty(), "{:?}", c.log);
}
