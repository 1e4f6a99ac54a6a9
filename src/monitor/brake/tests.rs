use super::*;
use crate::monitor::Status;
use crate::monitor::account::Accounted;
use crate::monitor::evidence::tests::engine;
use crate::probe::health::HealthOutcome;
use crate::probe::outcome::Accounting;

/// The configured judging (the shadow slot of a braked engine) turns abnormal by `rule`.
fn configured_abnormal(m: &Monitor, rule: u8) {
    let a = Accounted {
        accounting: Accounting::Incremented,
        count: 2,
        abnormal: Some("2 consecutive failures confirmed".to_owned()),
        why: None,
        stalled: None,
    };
    m.vi.apply_shadow(&a, Some(rule), None);
}

fn braked(extra: &str) -> Monitor {
    let mut m = engine(extra);
    m.hold_under_brake().expect("held");
    m.record_health(&HealthOutcome::Healthy, true);
    m
}

// The held judging keeps only the rules that hold a verdict back; the configured one
// becomes the shadow. An engine with a shadow of its own, or nothing to hold, is not held.
#[test]
fn the_held_judging_keeps_only_the_rules_that_hold_a_verdict_back() {
    let m = braked("policy = \"agent\"\n");
    let j = m.spec.judging;
    assert_eq!(j.in_force.rules.ids().collect::<Vec<_>>(), [1, 3, 4]);
    assert_eq!(j.in_force.stall_window, None);
    assert_eq!(
        j.shadow.unwrap().rules.ids().collect::<Vec<_>>(),
        (1..=12).collect::<Vec<_>>()
    );
    assert_eq!(m.gate(), Gate::Held);
    let mut plain = engine("policy = \"reference\"\n");
    assert!(
        plain
            .hold_under_brake()
            .unwrap_err()
            .contains("nothing to hold")
    );
    assert_eq!(plain.gate(), Gate::Off);
    let mut observing =
        engine("policy = \"agent\"\n[engine.agent_policy]\nrules = { 11 = \"observe\" }\n");
    assert!(
        observing
            .hold_under_brake()
            .unwrap_err()
            .contains("shadow is taken")
    );
}

// A new agent-rule verdict is held: /status answers as the reference (normal), and the
// verdict is recorded as the shadow's; once the brake lets it through it is answered.
#[test]
fn a_new_agent_rule_verdict_is_held_until_the_gate_opens() {
    let m = braked("policy = \"agent\"\n");
    configured_abnormal(&m, 5);
    assert_eq!(m.peek_status(), Status::Normal, "held");
    let shadow = m.shadow_verdict().expect("the configured judging");
    assert_eq!(shadow.status, Status::Abnormal);
    assert_eq!(shadow.cause.and_then(|c| c.rule).map(|r| r.0), Some(5));
    m.observe_rules(&m.verdict());
    assert_eq!(m.observed(), (1, 5), "recorded as an observe firing");
    m.set_gate(Gate::Acting);
    let v = m.verdict();
    assert_eq!(v.status, Status::Abnormal);
    assert_eq!(v.cause.and_then(|c| c.rule).map(|r| r.0), Some(5));
    assert!(v.reason.contains("confirmed"), "{}", v.reason);
    assert!(m.shadow_verdict().is_none(), "acting: no shadow");
}

// The reference's own verdict is never held: virtual inference's own count in force turns
// /status abnormal with the gate held.
#[test]
fn a_reference_verdict_is_never_held() {
    let m = braked("policy = \"agent\"\n");
    m.vi.set_abnormal("6 consecutive virtual requests failed");
    assert_eq!(m.peek_status(), Status::Abnormal);
    assert_eq!(m.verdict().cause.and_then(|c| c.rule), None);
}

// An engine acting keeps its verdict whatever the fleet does (nothing but the loop's
// release moves the gate back, and only once the configured verdict is normal again); a
// restart re-arms it on either side.
#[test]
fn an_engine_acting_keeps_its_verdict_and_a_restart_rearms_it() {
    let m = braked("policy = \"agent\"\n");
    configured_abnormal(&m, 11);
    m.set_gate(Gate::Acting);
    assert_eq!(m.peek_status(), Status::Abnormal);
    assert!(m.vi_abnormal_in_force());
    m.vi.rearm();
    assert!(!m.vi_abnormal_in_force());
    assert_eq!(m.peek_status(), Status::Normal);
}
