//! SGLang as a whole kind, end to end: the agent binary against the fake engine at profile
//! `sglang` (its `/health` with its one-second poll, its `sglang:` series, the request id in
//! `rid`), under the `agent` policy. A healthy engine is `normal`, probed with SGLang's own
//! request and scored from SGLang's series; a hung one is `abnormal`.

use crate::support::stack::{Launch, Stack};
use std::time::Duration;

#[test]
fn an_sglang_engine_is_normal_when_healthy_and_abnormal_when_hung() {
    let stack = Stack::start_launch(Launch {
        policy: "agent",
        engine_type: "sglang",
        engine_args: &["--profile", "sglang"],
        ..Launch::default()
    });
    // Healthy: the warm-up and the periodic probes went out as SGLang takes them.
    let stats = stack.engine_stats();
    assert!(stats["virtual_completions"].as_u64() > Some(0), "{stats}");
    let id = stats["last_request_id"].as_str().unwrap_or_default();
    assert!(
        id.ends_with("_virtual"),
        "the id SGLang read (rid): {stats}"
    );
    assert_eq!(stats["last_body"]["rid"], id, "{stats}");
    let engine_type = stack.typed_detail().conditions;
    let gate = engine_type
        .iter()
        .find(|c| c.name == "engine_type")
        .expect("an engine_type condition");
    assert_eq!((gate.value.as_str(), gate.ok), ("sglang", Some(true)));
    // QoS reads SGLang's series (at its next scrape).
    let reads = |d: &serde_json::Value| {
        d["qos"]["components"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c["series"].as_array())
            .flatten()
            .any(|s| s == "sglang:token_usage")
    };
    stack.wait_until(
        "the QoS score reads sglang:token_usage",
        Duration::from_secs(30),
        reads,
    );

    // Hung: completions never answered, nothing comes out, the NPU idle.
    stack.faults(r#"{"hang": true}"#);
    stack.wait_for_status("abnormal", Duration::from_secs(30));
}
