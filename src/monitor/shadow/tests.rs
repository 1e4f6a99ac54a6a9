use super::*;
use crate::monitor::account::Accounted;
use crate::monitor::evidence::tests::engine;
use crate::probe::health::HealthOutcome;
use crate::probe::outcome::Accounting;

fn shadow_abnormal(m: &Monitor, rule: u8) {
    let a = Accounted {
        accounting: Accounting::Incremented,
        count: 2,
        abnormal: Some("2 consecutive failures confirmed".to_owned()),
        why: None,
        stalled: None,
    };
    m.vi.apply_shadow(&a, Some(rule), None);
}

fn failing_503() -> HealthOutcome {
    HealthOutcome::Unhealthy {
        reason: "HTTP 503".into(),
        unreachable: false,
        timed_out: false,
        transport: None,
    }
}

// `policy = "reference"` with the agent as the shadow: the shadow's abnormal opens a
// disagreement (what /status would have answered, by which rule), counts an observe firing
// and asks for a bundle; the reference's own abnormal closes it and counts as enforced.
#[test]
fn a_shadow_abnormal_is_recorded_as_a_disagreement_until_the_policy_in_force_agrees() {
    let m = engine("policy = \"reference\"\nshadow_policy = \"agent\"\n");
    m.record_health(&HealthOutcome::Healthy, true);
    m.observe_rules(&m.verdict());
    assert_eq!(m.shadow_record().unwrap().disagreements, vec![]);
    assert_eq!(m.observed(), (0, 0));
    shadow_abnormal(&m, 5);
    m.observe_rules(&m.verdict());
    let s = m.shadow_record().unwrap();
    assert_eq!(
        (s.policy, s.status, s.rule),
        (Policy::Agent, Status::Abnormal, Some(5))
    );
    let d = &s.disagreements[0];
    assert_eq!(
        (d.status, d.would_status, d.rule, d.ended_unix_ms),
        (Status::Normal, Status::Abnormal, Some(5), None)
    );
    assert!(d.reason.contains("confirmed"), "{}", d.reason);
    assert_eq!(m.observed(), (1, 5), "a bundle is asked for");
    assert_eq!(m.peek_status(), Status::Normal, "never served");
    let would = m
        .actions()
        .into_iter()
        .find(|a| a.integration == "shadow")
        .expect("a journal entry");
    assert!(
        would.reason.starts_with("would have answered abnormal"),
        "{}",
        would.reason
    );
    let five = &m.rule_records()[4];
    assert_eq!(
        (five.mode.as_str(), five.fired, five.would_have),
        ("observe", 0, 1)
    );
    // Observing again changes nothing.
    m.observe_rules(&m.verdict());
    assert_eq!(
        m.shadow_record().unwrap().turns.len(),
        3,
        "{:?}",
        m.shadow_record()
    );
    m.vi.set_abnormal("6 consecutive virtual requests failed");
    m.observe_rules(&m.verdict());
    let s = m.shadow_record().unwrap();
    assert!(
        s.disagreements[0].ended_unix_ms.is_some(),
        "closed: both abnormal"
    );
    assert_eq!(s.disagreements.len(), 1);
    assert_eq!(
        m.reference_fired(),
        (1, 0),
        "the reference's own rule fired in force"
    );
    let sides: Vec<(&str, Status)> = s
        .turns
        .iter()
        .map(|t| (t.side.as_str(), t.status))
        .collect();
    assert_eq!(
        sides,
        [
            ("in_force", Status::Normal),
            ("shadow", Status::Normal),
            ("shadow", Status::Abnormal),
            ("in_force", Status::Abnormal)
        ]
    );
}

// A relaxing rule in `observe` (rule 1, the /health grace): /status is abnormal at the first
// failure, as the reference's; the shadow, with the grace, would have held it back.
#[test]
fn a_grace_in_observe_records_that_it_would_have_kept_the_engine_normal() {
    let m = engine(
        "policy = \"agent\"\n[engine.agent_policy]\nrules = { health_grace = \"observe\" }\n",
    );
    m.record_health(&HealthOutcome::Healthy, true);
    m.record_health(&failing_503(), true);
    assert_eq!(m.peek_status(), Status::Abnormal, "rule 1 is not in force");
    m.observe_rules(&m.verdict());
    let s = m.shadow_record().unwrap();
    assert_eq!(s.status, Status::Normal);
    let d = s.disagreements.last().unwrap();
    assert_eq!(
        (d.status, d.would_status, d.rule),
        (Status::Abnormal, Status::Normal, Some(1))
    );
    let one = &m.rule_records()[0];
    assert_eq!((one.mode.as_str(), one.would_have), ("observe", 1));
    assert_eq!(m.observed(), (0, 0), "no bundle for a verdict held back");
}

// The history outlives the agent: a restored monitor shows the same turns and
// disagreements, and its first observation repeats no turn.
#[test]
fn the_records_survive_a_restart_and_repeat_no_turn() {
    let m = engine("policy = \"reference\"\nshadow_policy = \"agent\"\n");
    m.record_health(&HealthOutcome::Healthy, true);
    m.observe_rules(&m.verdict());
    shadow_abnormal(&m, 11);
    m.observe_rules(&m.verdict());
    let saved = m.records_saved();
    assert!(!saved.is_empty());
    let text = serde_json::to_string(&saved).unwrap();
    let back: Saved = serde_json::from_str(&text).unwrap();
    let n = engine("policy = \"reference\"\nshadow_policy = \"agent\"\n");
    n.restore_records(&back);
    n.record_health(&HealthOutcome::Healthy, true);
    shadow_abnormal(&n, 11);
    n.observe_rules(&n.verdict());
    let s = n.shadow_record().unwrap();
    assert_eq!(s.turns, saved.turns, "no turn repeated");
    assert_eq!(s.disagreements, saved.disagreements, "the open one goes on");
}

// Without a shadow nothing is recorded but the rules in force; the metric's rows name each
// rule in force.
#[test]
fn without_a_shadow_only_the_rules_in_force_are_counted() {
    let m = engine("policy = \"agent\"\n");
    assert!(m.shadow_record().is_none());
    m.record_health(&HealthOutcome::Healthy, true);
    m.observe_rules(&m.verdict());
    m.vi.set_abnormal("x");
    m.vi.set_abnormal_rule(Some(11));
    m.observe_rules(&m.verdict());
    let r = m.rule_records();
    assert_eq!((r[10].mode.as_str(), r[10].fired), ("enforce", 1));
    assert!(r.iter().all(|r| r.would_have == 0));
}
