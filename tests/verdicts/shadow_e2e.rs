//! The shadow policy end to end (issue 50): the fake engine and the agent as real processes,
//! `policy = "reference"` in force and the agent policy as the shadow. The engine hangs; the
//! shadow says `abnormal` first (rule 5, fast confirmation), which `/status` never answers,
//! and the reference follows at its own count. Each step is in the records the operator
//! reads: `/status/detail`'s `shadow` and `rules`, the journal, the log ("would have"), the
//! metric, and an evidence bundle for the observe firing.

use crate::support::stack::{Launch, Stack};
use npu_health_wire::Status;
use std::time::Duration;

#[test]
fn a_hung_engine_is_abnormal_in_the_shadow_first_and_only_the_reference_answers() {
    let stack = Stack::start_launch(Launch {
        health_check: "max_failure_count = 4",
        agent_extra: "shadow_policy = \"agent\"\nevidence_dir = \"evidence\"\nevidence_min_free = 0",
        state_dir: true,
        ..Launch::default()
    });
    stack.wait_for_status("normal", Duration::from_secs(20));
    stack.faults(r#"{"hang": true}"#);
    stack.wait_for_status("abnormal", Duration::from_secs(30));
    let d = stack.wait_until_typed("the observe bundle", Duration::from_secs(20), |d| {
        d.evidence.written >= 2
    });
    let shadow = d.shadow.as_ref().expect("a shadow");
    let turn = |side: &str, status: Status| {
        shadow
            .turns
            .iter()
            .find(|t| t.side == side && t.status == status)
            .unwrap_or_else(|| panic!("{side} {status:?} in {shadow:?}"))
    };
    let (would, did) = (
        turn("shadow", Status::Abnormal),
        turn("in_force", Status::Abnormal),
    );
    assert_eq!(would.rule, Some(5), "{would:?}");
    assert_eq!(did.rule, None, "the reference's own count: {did:?}");
    assert!(would.at_unix_ms <= did.at_unix_ms, "{shadow:?}");
    let first = &shadow.disagreements[0];
    assert_eq!(
        (first.status, first.would_status, first.rule),
        (Status::Normal, Status::Abnormal, Some(5)),
        "{shadow:?}"
    );
    assert!(
        first.ended_unix_ms.is_some(),
        "closed when the reference agreed"
    );
    let five = d.rules.iter().find(|r| r.id == 5).unwrap();
    assert_eq!(
        (five.mode.as_str(), five.would_have, five.fired),
        ("observe", 1, 0)
    );
    assert!(
        d.actions.iter().any(|a| a.integration == "shadow"),
        "{:?}",
        d.actions
    );
    let log = stack.agent_log();
    assert!(log.contains("would have answered abnormal"), "{log}");
    let metrics = stack.metrics();
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("npu_health_agent_rule_fired_total{")
                && l.contains("rule=\"5\",mode=\"observe\"")
                && l.ends_with(" 1")),
        "{metrics}"
    );
    let bundles: Vec<String> = std::fs::read_dir(stack.path("evidence"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        bundles.iter().any(|b| b.ends_with("-observe-rule5")),
        "{bundles:?}"
    );
    // The same history from the state file, by the command an operator runs.
    let report = || {
        let out = std::process::Command::new(crate::support::agent())
            .args(["disagreements", "--state-dir"])
            .arg(stack.path("run"))
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    // The state file is written after the memory (every 100 ms on a change): wait for the
    // whole history, both turns and the disagreement, to reach it.
    let whole = |text: &str| {
        text.contains("/status normal, would have answered abnormal (rule 5 fast_confirmation)")
            && text.contains("shadow (agent)")
            && text.contains("in force (reference)")
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut text = report();
    while !whole(&text) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
        text = report();
    }
    assert!(whole(&text), "{text}");
}
