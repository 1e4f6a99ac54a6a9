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

/// The agent's peak resident memory (`VmHWM` of /proc/<pid>/status), in KiB.
fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("VmHWM in /proc/<pid>/status")
}

/// Waits until the stand-in has been asked `n` more times than `from` (the agent polls
/// every 200 ms).
fn wait_asked(kubelet: &PodResourcesServer, from: u64, n: u64, stack: &Stack) {
    let end = Instant::now() + Duration::from_secs(30);
    while kubelet.asked() < from + n {
        assert!(
            Instant::now() < end,
            "{} polls in 30 s\nagent log:\n{}",
            kubelet.asked() - from,
            stack.agent_log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

// Issue 48, R3 and R4: a hostile PodResources socket. Its answers, under the 4 MiB a call
// reads, once built 971 MB from 230 KB, put a 1 MB pod name on every series of /metrics,
// and logged 920,000 lines; its 15 MB content-type was logged on every poll. Here, listed in
// another order on every call: the pod that holds NPU 1, a pod with a 1 MB name that holds
// NPU 0, one with a 10 KB name and 2,000 ids, one with 20,000 distinct ids no NPU has. The
// agent keeps the good pod's labels, drops the rest, logs each note once and little, stays
// small, and answers; then a 15 MB header on every answer is refused, and logged short.
#[test]
fn a_hostile_pod_resources_socket_costs_the_agent_bounded_memory_and_log() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("kubelet.sock");
    let ascend = "huawei.com/Ascend910";
    let ids = |n: usize, f: &dyn Fn(usize) -> String| -> Vec<String> { (0..n).map(f).collect() };
    let many = |ns: &str, name: &str, ids: Vec<String>| {
        let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
        pod(ns, name, "c", ascend, &ids)
    };
    let kubelet = PodResourcesServer::start(
        &socket,
        vec![
            pod("serving", "vllm-a", "engine", ascend, &["Ascend910-7"]),
            pod("n", &"q".repeat(1 << 20), "c", ascend, &["Ascend910-6"]),
            many(
                "n",
                &"p".repeat(10_000),
                ids(2_000, &|i| format!("Ascend910-{i}-x")),
            ),
            many("n", "flood", ids(20_000, &|i| format!("Ascend910-6-{i}"))),
        ],
    );
    kubelet.rotate();
    let agent_extra = format!(
        "pod_resources_socket = {:?}\npod_resources_period = \"200ms\"",
        socket.display().to_string()
    );
    let stack = Stack::start_launch(Launch {
        agent_extra: &agent_extra,
        per_device: ["phy_id = 6", "phy_id = 7"],
        ..Launch::default()
    });
    let pid = stack.agent.id();
    wait_asked(&kubelet, 0, 6, &stack);

    let metrics = stack.metrics();
    let log = stack.agent_log();
    let notes = log.lines().filter(|l| l.contains("pod labels:")).count();
    let peak = peak_rss_kib(pid);
    println!(
        "hostile answers: /metrics {} bytes, agent log {} bytes, {notes} pod-label lines, peak RSS {peak} KiB",
        metrics.len(),
        log.len()
    );
    assert!(
        !metrics.contains("qqqq"),
        "the 1 MB pod name reached /metrics"
    );
    assert!(metrics.len() < 64 << 10, "/metrics {} bytes", metrics.len());
    // One set of notes, however the pods are ordered: at most MAX_NOTES (16), the line that
    // counts the rest, and the decoder's skips.
    assert!(notes <= 24, "{notes} pod-label lines");
    assert!(log.len() < 64 << 10, "agent log {} bytes", log.len());
    assert!(
        log.contains(
            "the answer is over the agent's bounds: 2 pod(s) whose name is over 253 bytes"
        ) && log.contains("device id(s) past the first 256 of a container skipped"),
        "{log}"
    );
    assert!(peak < 128 << 10, "peak RSS {peak} KiB");
    wait_for(
        &stack,
        "the good pod",
        ["//", "serving/vllm-a/engine", "//"],
    );

    // A 15 MB content-type on every answer: refused by h2 before it is built, the line cut.
    kubelet.set_content_type("x".repeat(15 << 20));
    wait_asked(&kubelet, kubelet.asked(), 3, &stack);
    assert_eq!(
        stack.get(&stack.status_url()),
        Some((200, "{\"status\":\"normal\"}".to_owned()))
    );
    let log = stack.agent_log();
    let peak = peak_rss_kib(pid);
    println!(
        "a 15 MB header: agent log {} bytes, peak RSS {peak} KiB",
        log.len()
    );
    assert!(log.len() < 64 << 10, "agent log {} bytes", log.len());
    assert!(
        log.contains("pod labels: List on the kubelet's PodResources API at"),
        "the failure is logged:\n{log}"
    );
    assert!(peak < 128 << 10, "peak RSS {peak} KiB");
}
