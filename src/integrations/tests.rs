//! What the integrations read of an engine (`ActionInputs`) and what the journal's observer
//! records of it. The rules' tables are beside each rule (`answers/tests.rs`, each folder's).

use super::answers::{Answers, liveness, readiness};
use super::facts::{AbnormalCause, ActionInputs};
use super::observe;
use crate::integrations::answers::config::NotReadyList;
use crate::monitor::Monitor;
use crate::monitor::journal::ActionRecord;
use crate::monitor::verdict::{HealthState, Status};
use crate::monitor::vi_state::Phase;
use crate::qos::score::Level;

/// The facts of an engine at `status` and `level`, every input present (the rules' tables).
pub(super) fn facts(status: Status, level: Level) -> ActionInputs {
    ActionInputs {
        status,
        cause: (status == Status::Abnormal).then_some(AbnormalCause::VirtualInference),
        reason: "why".to_owned(),
        health: match status {
            Status::Initial => HealthState::NeverAnswered,
            _ => HealthState::Healthy,
        },
        port_closed: false,
        phase: Phase::Running,
        level,
        score: Some(match level {
            Level::Normal => 0.9,
            Level::Throttle => 0.6,
            Level::Degrade => 0.4,
            Level::Evict => 0.1,
        }),
        inputs_complete: true,
        admission_cap: (level != Level::Normal).then_some(4),
    }
}

use Level::{Degrade, Evict};
use Status::{Abnormal, Initial};
const OK: Status = Status::Normal;
const NORMAL: Level = Level::Normal;

// ActionInputs from a live monitor: the cause of an abnormal verdict, the closed port, complete
// inputs only after an evaluation with every component.
#[tokio::test(start_paused = true)]
async fn facts_of_a_monitor() {
    use crate::probe::health::{HealthOutcome, Transport};
    let spec = crate::config::file::parse(
        "[agent]\npolicy = \"reference\"\n[[engine]]\nname = \"e\"\nhost = \"127.0.0.1\"\nport = 8000\nmgmt_port = 9000\nengine_type = \"vllm\"\nserved_model_name = \"m\"\n",
        std::path::Path::new("agent.toml"),
    )
    .unwrap()
    .engines
    .remove(0);
    let m = Monitor::new(spec, vec![0]);
    let f = ActionInputs::of(&m);
    assert_eq!(
        (f.status, f.cause, f.inputs_complete),
        (Initial, None, false)
    );
    m.record_health(&HealthOutcome::Healthy, true);
    assert_eq!(ActionInputs::of(&m).status, OK);
    m.record_health(
        &HealthOutcome::Unhealthy {
            reason: "connection refused".into(),
            unreachable: true,
            timed_out: false,
            transport: Some(Transport::Refused),
        },
        true,
    );
    let f = ActionInputs::of(&m);
    assert_eq!(f.cause, Some(AbnormalCause::Health));
    assert!(f.port_closed);
    assert!(liveness(&f).live, "{}", liveness(&f).reason);
    m.record_health(
        &HealthOutcome::Unhealthy {
            reason: "HTTP 500: upstream\nerror".into(),
            unreachable: false,
            timed_out: false,
            transport: None,
        },
        true,
    );
    let f = ActionInputs::of(&m);
    assert!(!f.port_closed);
    assert!(!liveness(&f).live);
    let r = readiness(&f, &NotReadyList::default());
    assert!(!r.ready);
    assert!(
        r.reason.contains("upstream error") && !r.reason.contains('\n'),
        "one line: {:?}",
        r.reason
    );
}

// The journal's observer: the first observation says where it starts; then one entry per
// thing that changed (verdict, level, readiness, liveness), none while nothing changes.
#[test]
fn the_journal_records_what_changed() {
    use observe::{ObservedState, changes};
    type I = &'static str;
    let cfgd = NotReadyList::default();
    let a0 = Answers::from_facts(facts(OK, NORMAL), &cfgd);
    let s0 = ObservedState::of(&a0);
    let words = |e: Vec<crate::monitor::journal::Entry>| -> Vec<ActionRecord> {
        e.iter().map(ActionRecord::from).collect()
    };
    // (who, what), from, to.
    let moves = |e: &[ActionRecord]| -> Vec<((String, String), String, String)> {
        e.iter()
            .map(|e| {
                let what = (e.integration.clone(), e.action.clone());
                (what, e.from.clone(), e.to.clone())
            })
            .collect()
    };
    let at = |who: I, what: &str, from: &str, to: &str| {
        (
            (who.to_owned(), what.to_owned()),
            from.to_owned(),
            to.to_owned(),
        )
    };
    let got = moves(&words(changes(None, &a0, 7)));
    assert_eq!(
        got,
        [
            at("node_manager", "status", "start", "normal"),
            at("kubelet", "readyz", "start", "ready")
        ]
    );
    assert!(changes(Some(&s0), &a0, 8).is_empty());
    // normal -> degrade: level and readiness change, liveness does not.
    let a1 = Answers::from_facts(facts(OK, Degrade), &cfgd);
    let s1 = ObservedState::of(&a1);
    let e = words(changes(Some(&s0), &a1, 9));
    let got = moves(&e);
    assert_eq!(
        got,
        [
            at("agent", "level", "normal", "degrade"),
            at("kubelet", "readyz", "ready", "not_ready")
        ]
    );
    assert_eq!(e[0].reason, "score 0.400");
    assert!(e.iter().all(|e| e.at_unix_ms == 9));
    // -> abnormal: the verdict and liveness change too, with the verdict's reason.
    let a2 = Answers::from_facts(facts(Abnormal, Evict), &cfgd);
    let got: Vec<((String, String), String, String)> = words(changes(Some(&s1), &a2, 10))
        .into_iter()
        .map(|e| ((e.integration, e.action), e.to, e.reason))
        .collect();
    assert!(
        changes(Some(&s1), &a2, 10).iter().all(|e| e.level == Evict),
        "each action carries the level"
    );
    assert_eq!(
        got[0],
        (
            ("node_manager".to_owned(), "status".to_owned()),
            "abnormal".to_owned(),
            "why".to_owned()
        )
    );
    assert_eq!(got[1].0, ("agent".to_owned(), "level".to_owned()));
    assert_eq!(got[2].0, ("kubelet".to_owned(), "livez".to_owned()));
    assert_eq!(got[2].1, "restart");
    assert_eq!(got.len(), 3, "readiness was already not ready: {got:?}");
}
