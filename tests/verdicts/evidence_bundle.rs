//! Evidence kept at a verdict, end to end: the fake engine and the agent as real processes;
//! the engine hangs, the verdict turns `abnormal`, and one bundle holds every part (py-spy
//! absent here: its note; the fake `npu-smi info`), finished after the verdict was in force.

use crate::support::stack::{Launch, Stack};
use npu_health_wire::{EngineDetail, Status};
use std::path::PathBuf;
use std::time::Duration;

#[test]
fn a_hung_engine_leaves_one_bundle_with_every_part_written_after_the_verdict() {
    let stack = Stack::start_launch(Launch {
        health_check: "max_failure_count = 2",
        // Relative: the stack's own directory. No floor: a test machine's disk may be full.
        agent_extra: "evidence_dir = \"evidence\"\nevidence_min_free = 0",
        ..Launch::default()
    });
    stack.faults(r#"{"hang": true}"#);
    stack.wait_for_status("abnormal", Duration::from_secs(20));
    let detail = stack.wait_until_typed("a bundle written", Duration::from_secs(20), |d| {
        d.evidence.written >= 1
    });
    let r = &detail.evidence;
    assert_eq!((r.written, r.failed, r.skipped), (1, 0, 0), "{r:?}");
    let bundle = PathBuf::from(r.last_path.as_deref().expect("a bundle's path"));
    assert!(bundle.starts_with(stack.path("evidence")), "{bundle:?}");
    let read =
        |f: &str| std::fs::read_to_string(bundle.join(f)).unwrap_or_else(|e| panic!("{f}: {e}"));
    let summary: serde_json::Value = serde_json::from_str(&read("summary.json")).unwrap();
    assert_eq!(summary["status"], "abnormal", "{summary}");
    assert_eq!(summary["trigger"], "abnormal", "{summary}");
    assert_eq!(summary["cause"]["source"], "virtual_inference", "{summary}");
    let reason = summary["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("consecutive virtual requests failed"),
        "{summary}"
    );
    // What /status/detail said then: the last probe, with its timing, and the NPUs.
    let then: EngineDetail = serde_json::from_str(&read("detail.json")).unwrap();
    assert_eq!(then.status, Status::Abnormal);
    assert!(then.virtual_inference.last_probe.is_some(), "{then:?}");
    assert_eq!(then.window.devices.len(), 2, "{then:?}");
    assert!(
        read("metrics.txt").contains("vllm:"),
        "{}",
        read("metrics.txt")
    );
    let engine_pid = stack.engine.as_ref().expect("the engine").id();
    let procs = read("processes.txt");
    assert!(
        procs
            .lines()
            .any(|l| l.starts_with(&format!("{engine_pid}\t"))),
        "{procs}"
    );
    assert!(read("py-spy.txt").contains("py-spy is not on PATH"));
    assert!(
        read("npu-smi.txt").contains("npu-smi (fake)"),
        "{}",
        read("npu-smi.txt")
    );
    let journal: Vec<npu_health_wire::ActionRecord> =
        serde_json::from_str(&read("journal.json")).unwrap();
    assert!(!journal.is_empty());
    // The verdict was in force before the bundle was finished: the agent logs the verdict
    // before it sets it (what /status reads), and the bundle only after it saw it set. One
    // log, one writer: its order is the agent's, no clock compared, no timed assertion.
    let log = stack.agent_log();
    let line = |has: &dyn Fn(&str) -> bool| log.lines().position(has);
    let verdict = line(&|l| l.contains("verdict") && l.contains("abnormal"));
    let written = line(&|l| l.contains("evidence bundle written"));
    assert!(
        matches!((verdict, written), (Some(v), Some(w)) if v < w),
        "{verdict:?} {written:?}\n{log}"
    );
    assert!(
        stack.metrics().contains(
            "npu_health_agent_evidence_bundles_total{engine=\"e2e\",outcome=\"written\"} 1"
        ),
        "{}",
        stack.metrics()
    );
}
