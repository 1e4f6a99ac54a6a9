//! Issue 42: the pod labels of the NPU and engine series, from the kubelet's PodResources API.
//! The agent binary on the fake driver asks a stand-in kubelet (gRPC over HTTP/2 on a Unix
//! socket, tests/support/pod_resources.rs) which pod holds each NPU, by the physical ids the
//! Ascend device plugin names NPUs by; the stand-in's pods change under it, then it dies.
#![cfg(feature = "fake-driver")]

use crate::support::pod_resources::{PodResourcesServer, pod};
use crate::support::stack::{Launch, Stack};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// The labels of each series of `family` in a Prometheus text scrape.
fn series(text: &str, family: &str) -> Vec<BTreeMap<String, String>> {
    let mut out = Vec::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(family) else {
            continue;
        };
        let Some(body) = rest.strip_prefix('{').and_then(|r| r.split_once('}')) else {
            continue;
        };
        let mut labels = BTreeMap::new();
        let mut left = body.0;
        while let Some((key, after)) = left.split_once("=\"") {
            let end = after.find('"').expect("a closing quote");
            labels.insert(
                key.trim_start_matches(',').to_owned(),
                after[..end].to_owned(),
            );
            left = &after[end + 1..];
        }
        out.push(labels);
    }
    out
}

/// `namespace/pod/container` of the series of `family` whose `key` is `value`; panics
/// unless there is one such series, and `-` for a series without the labels.
fn holder(text: &str, family: &str, key: &str, value: &str) -> String {
    let found: Vec<_> = series(text, family)
        .into_iter()
        .filter(|l| l.get(key).map(String::as_str) == Some(value))
        .collect();
    assert_eq!(found.len(), 1, "{family}{{{key}={value:?}}} in\n{text}");
    let l = &found[0];
    match (l.get("namespace"), l.get("pod"), l.get("container")) {
        (Some(n), Some(p), Some(c)) => format!("{n}/{p}/{c}"),
        _ => "-".to_owned(),
    }
}

/// What `/metrics` says of each NPU (by logic id) and of the engine: the holder of NPU 0,
/// of NPU 1 (on two NPU families), and the engine's (on two engine families).
fn holders(text: &str) -> [String; 3] {
    let npu = |id: &str| {
        let a = holder(text, "npu_health_agent_chip_hbm_used_memory", "id", id);
        let b = holder(text, "npu_health_agent_device_stale", "id", id);
        assert_eq!(a, b, "NPU {id}: two families, two holders\n{text}");
        a
    };
    let engine = holder(text, "npu_health_agent_ready", "engine", "e2e");
    let status = holder(text, "npu_health_agent_status", "status", "normal");
    assert_eq!(
        engine, status,
        "the engine: two families, two holders\n{text}"
    );
    [npu("0"), npu("1"), engine]
}

/// Waits until the NPUs and the engine have the holders `want`.
fn wait_for(stack: &Stack, what: &str, want: [&str; 3]) {
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        let text = stack.metrics();
        let got = holders(&text);
        if got == want {
            return;
        }
        assert!(
            Instant::now() < end,
            "{what}: holders {got:?}, not {want:?}\n{text}\nagent log:\n{}",
            stack.agent_log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn npu_and_engine_series_carry_the_pod_holding_their_npus_and_lose_it_when_it_goes() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("kubelet.sock");
    let ascend = "huawei.com/Ascend910";
    // The NPUs' physical ids are 6 (logic id 0) and 7 (logic id 1): the device plugin
    // names them Ascend910-6 and Ascend910-7.
    let mut kubelet = PodResourcesServer::start(
        &socket,
        vec![
            pod("serving", "vllm-a", "engine", ascend, &["Ascend910-7"]),
            pod("serving", "vllm-b", "engine", ascend, &["Ascend910-6"]),
            pod("gpu", "other", "main", "nvidia.com/gpu", &["GPU-0"]),
            pod(
                "batch",
                "job",
                "main",
                ascend,
                &["Ascend910-3", "Ascend910-6-1"],
            ),
        ],
    );
    let agent_extra = format!(
        "pod_resources_socket = {:?}\npod_resources_period = \"200ms\"",
        socket.display().to_string()
    );
    let stack = Stack::start_launch(Launch {
        agent_extra: &agent_extra,
        per_device: ["phy_id = 6", "phy_id = 7"],
        ..Launch::default()
    });

    // Each NPU is its pod's; the engine's two NPUs are two pods', so it has none.
    wait_for(
        &stack,
        "two pods",
        ["serving/vllm-b/engine", "serving/vllm-a/engine", "//"],
    );
    let log = stack.agent_log();
    for note in [
        "batch/job container main: \"Ascend910-3\" names physical id 3, which no NPU of this agent has; skipped",
        "batch/job container main: \"Ascend910-6-1\" of huawei.com/Ascend910 is a part of an NPU",
    ] {
        assert!(log.contains(note), "{note}\nagent log:\n{log}");
    }

    // vllm-b is gone: its NPU has no holder.
    kubelet.set(vec![pod(
        "serving",
        "vllm-a",
        "engine",
        ascend,
        &["Ascend910-7"],
    )]);
    wait_for(&stack, "vllm-b gone", ["//", "serving/vllm-a/engine", "//"]);

    // vllm-a holds both: the engine is vllm-a's.
    kubelet.set(vec![pod(
        "serving",
        "vllm-a",
        "engine",
        ascend,
        &["Ascend910-6", "Ascend910-7"],
    )]);
    wait_for(
        &stack,
        "one pod",
        [
            "serving/vllm-a/engine",
            "serving/vllm-a/engine",
            "serving/vllm-a/engine",
        ],
    );
    assert!(kubelet.calls() >= 3, "{} calls", kubelet.calls());

    // The kubelet dies (its socket stays, nobody behind it): the labels go after the keep
    // time, the agent still answers.
    kubelet.stop();
    wait_for(&stack, "the kubelet dead", ["//", "//", "//"]);
    assert_eq!(
        stack.get(&stack.status_url()),
        Some((200, "{\"status\":\"normal\"}".to_owned()))
    );
    let log = stack.agent_log();
    assert!(
        log.contains(&format!(
            "pod labels: List on the kubelet's PodResources API at {} failed: cannot connect to",
            socket.display()
        )) && log.contains("pod labels: dropped, no answer from the kubelet's PodResources API"),
        "agent log:\n{log}"
    );
}

// Without the key the series carry no pod labels at all (off outside Kubernetes).
#[test]
fn without_the_socket_the_series_carry_no_pod_labels() {
    let stack = Stack::start_launch(Launch::default());
    assert_eq!(holders(&stack.metrics()), ["-", "-", "-"]);
}
