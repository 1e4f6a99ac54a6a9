//! The wire crate reads what the agent writes, without linking the agent: a `/status/detail`
//! body captured from a running agent (`fixtures/status_detail.json`, written by the agent's
//! wire golden test, `tests/verdicts/wire_shapes.rs`, which also holds it to the agent's
//! current shape) reads into [`EngineDetail`] and writes back as the same JSON.

use npu_health_wire::{EngineDetail, Engines};

fn captured() -> serde_json::Value {
    let text = include_str!("fixtures/status_detail.json");
    serde_json::from_str(text).expect("the fixture is JSON")
}

#[test]
fn a_detail_the_agent_sent_reads_into_the_types_and_writes_back_the_same_json() {
    let sent = captured();
    let typed: EngineDetail = serde_json::from_value(sent.clone()).expect("reads as EngineDetail");
    assert_eq!(serde_json::to_value(&typed).unwrap(), sent);
    // The fields a reader relies on came through typed, not as leftovers.
    assert_eq!(typed.engine, sent["engine"]);
    assert_eq!(typed.status.as_str(), sent["status"]);
    assert_eq!(typed.qos.state.level.as_str(), sent["qos"]["level"]);
    assert_eq!(
        typed.window.devices.len(),
        sent["window"]["devices"].as_array().unwrap().len()
    );
}

#[test]
fn the_admin_listeners_list_of_details_reads_back_too() {
    let sent = serde_json::json!({ "engines": [captured(), captured()] });
    let typed: Engines<EngineDetail> = serde_json::from_value(sent.clone()).unwrap();
    assert_eq!(typed.engines.len(), 2);
    assert_eq!(serde_json::to_value(&typed).unwrap(), sent);
}
