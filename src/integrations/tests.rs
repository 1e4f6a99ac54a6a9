//! The action rules as tables: which verdict and level open or close `/readyz` and `/livez`,
//! and when the Kubernetes API mode may evict.

use super::kubelet::config::NotReadyOn;
use super::kubelet::{Answers, liveness, readiness};
use super::kubernetes::eviction_ground;
use super::{AbnormalCause, ActionInputs, haproxy, observe};
use crate::config::actions::ActionsConfig;
use crate::monitor::Monitor;
use crate::monitor::journal::ActionRecord;
use crate::monitor::verdict::{HealthState, Status};
use crate::monitor::vi_state::Phase;
use crate::qos::score::Level;

fn facts(status: Status, level: Level) -> ActionInputs {
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

fn cfg(on: &[NotReadyOn]) -> ActionsConfig {
    ActionsConfig {
        not_ready_on: on.to_vec(),
        ..ActionsConfig::default()
    }
}

use Level::{Degrade, Evict, Throttle};
use NotReadyOn as On;
use Status::{Abnormal, Initial};
const OK: Status = Status::Normal;
const NORMAL: Level = Level::Normal;

#[test]
fn readiness_table() {
    let default = ActionsConfig::default();
    // (status, level, config, ready, degraded header)
    let rows: Vec<(Status, Level, ActionsConfig, bool, bool)> = vec![
        // The default: degrade, evict, abnormal.
        (OK, NORMAL, default.clone(), true, false),
        (OK, Throttle, default.clone(), true, false),
        (OK, Degrade, default.clone(), false, true),
        (OK, Evict, default.clone(), false, false),
        (Abnormal, NORMAL, default.clone(), false, false),
        (Abnormal, Degrade, default.clone(), false, true),
        // /health never answered: never ready, whatever the list.
        (Initial, NORMAL, default.clone(), false, false),
        (Initial, NORMAL, cfg(&[]), false, false),
        // throttle is opt-in, and a listed level covers the worse ones.
        (OK, Throttle, cfg(&[On::Throttle]), false, false),
        (OK, Degrade, cfg(&[On::Throttle]), false, true),
        (OK, Evict, cfg(&[On::Throttle]), false, false),
        (Abnormal, NORMAL, cfg(&[On::Throttle]), true, false),
        // Only evict.
        (OK, Degrade, cfg(&[On::Evict]), true, true),
        (OK, Evict, cfg(&[On::Evict]), false, false),
        // Nothing listed: ready once /health answered, even abnormal.
        (Abnormal, Evict, cfg(&[]), true, false),
        (OK, Degrade, cfg(&[]), true, true),
    ];
    for (status, level, c, ready, degraded) in rows {
        let r = readiness(&facts(status, level), &c);
        assert_eq!(
            (r.ready, r.degraded),
            (ready, degraded),
            "{status:?} {level:?} {:?}: {}",
            c.not_ready_on,
            r.reason
        );
        assert!(!r.reason.contains('\n'), "one line: {}", r.reason);
        assert!(
            r.reason
                .starts_with(if ready { "ready" } else { "not ready" })
        );
    }
}

#[test]
fn liveness_table() {
    let with = |status: Status, level: Level, f: &dyn Fn(&mut ActionInputs)| {
        let mut x = facts(status, level);
        f(&mut x);
        x
    };
    let none = |_: &mut ActionInputs| {};
    // (facts, live)
    let rows: Vec<(&str, ActionInputs, bool)> = vec![
        ("normal", with(OK, NORMAL, &none), true),
        ("throttle", with(OK, Throttle, &none), true),
        ("degrade", with(OK, Degrade, &none), true),
        // A held evict (the reference policy: /status stays normal) restarts.
        ("held evict", with(OK, Evict, &none), false),
        (
            "evict on a missing input",
            with(OK, Evict, &|f| f.inputs_complete = false),
            true,
        ),
        // What Node Manager would kill.
        (
            "virtual inference abnormal",
            with(Abnormal, NORMAL, &none),
            false,
        ),
        (
            "/health fails (HTTP 500, past the grace)",
            with(Abnormal, NORMAL, &|f| {
                f.cause = Some(AbnormalCause::Health);
                f.health = HealthState::Unhealthy;
            }),
            false,
        ),
        (
            "QoS eviction, every input present",
            with(Abnormal, Evict, &|f| {
                f.cause = Some(AbnormalCause::QosEviction)
            }),
            false,
        ),
        (
            "QoS eviction on a missing input",
            with(Abnormal, Evict, &|f| {
                f.cause = Some(AbnormalCause::QosEviction);
                f.inputs_complete = false;
            }),
            true,
        ),
        // The port is closed: dead (the kubelet restarts it without us) or starting.
        (
            "port closed",
            with(Abnormal, NORMAL, &|f| {
                f.cause = Some(AbnormalCause::Health);
                f.health = HealthState::Unhealthy;
                f.port_closed = true;
            }),
            true,
        ),
        // The agent's own start-up and the engine's.
        ("never answered", with(Initial, NORMAL, &none), true),
        (
            "warming up",
            with(OK, NORMAL, &|f| f.phase = Phase::WarmingUp),
            true,
        ),
        (
            "abnormal while warming up",
            with(Abnormal, NORMAL, &|f| {
                f.phase = Phase::WarmingUp;
                f.cause = Some(AbnormalCause::Health);
            }),
            true,
        ),
        // The agent lacking inputs: no score, no level change.
        (
            "no score yet",
            with(OK, NORMAL, &|f| {
                f.score = None;
                f.inputs_complete = false;
            }),
            true,
        ),
        // The failing-within-grace state is a normal verdict.
        (
            "/health failing within the grace",
            with(OK, NORMAL, &|f| f.health = HealthState::Failing),
            true,
        ),
    ];
    for (name, f, want) in rows {
        let l = liveness(&f);
        assert_eq!(l.live, want, "{name}: {}", l.reason);
        assert!(!l.reason.contains('\n'), "one line: {}", l.reason);
    }
}

#[test]
fn eviction_needs_a_held_evict_on_every_input() {
    assert!(eviction_ground(&facts(OK, Evict)).is_some());
    assert!(eviction_ground(&facts(Abnormal, Evict)).is_some());
    for level in [NORMAL, Throttle, Degrade] {
        assert_eq!(eviction_ground(&facts(OK, level)), None, "{level:?}");
    }
    let mut f = facts(OK, Evict);
    f.inputs_complete = false;
    assert_eq!(
        eviction_ground(&f),
        None,
        "a score resting on a missing input"
    );
    // An abnormal verdict alone is the kubelet's (a restart), not an eviction.
    assert_eq!(eviction_ground(&facts(Abnormal, NORMAL)), None);
}

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
    let r = readiness(&f, &ActionsConfig::default());
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
    use crate::monitor::journal::Integration as I;
    use observe::{ObservedState, changes};
    let cfgd = ActionsConfig::default();
    let a0 = Answers::from_facts(facts(OK, NORMAL), &cfgd);
    let s0 = ObservedState::of(&a0);
    let words = |e: Vec<crate::monitor::journal::Entry>| -> Vec<ActionRecord> {
        e.iter().map(ActionRecord::from).collect()
    };
    // (who, what), from, to.
    let moves = |e: &[ActionRecord]| -> Vec<((I, String), String, String)> {
        e.iter()
            .map(|e| {
                let what = (e.integration, e.action.clone());
                (what, e.from.clone(), e.to.clone())
            })
            .collect()
    };
    let at = |who: I, what: &str, from: &str, to: &str| {
        ((who, what.to_owned()), from.to_owned(), to.to_owned())
    };
    let got = moves(&words(changes(None, &a0, 7)));
    assert_eq!(
        got,
        [
            at(I::NodeManager, "status", "start", "normal"),
            at(I::Kubelet, "readyz", "start", "ready")
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
            at(I::Agent, "level", "normal", "degrade"),
            at(I::Kubelet, "readyz", "ready", "not_ready")
        ]
    );
    assert_eq!(e[0].reason, "score 0.400");
    assert!(e.iter().all(|e| e.at_unix_ms == 9));
    // -> abnormal: the verdict and liveness change too, with the verdict's reason.
    let a2 = Answers::from_facts(facts(Abnormal, Evict), &cfgd);
    let got: Vec<((I, String), String, String)> = words(changes(Some(&s1), &a2, 10))
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
            (I::NodeManager, "status".to_owned()),
            "abnormal".to_owned(),
            "why".to_owned()
        )
    );
    assert_eq!(got[1].0, (I::Agent, "level".to_owned()));
    assert_eq!(got[2].0, (I::Kubelet, "livez".to_owned()));
    assert_eq!(got[2].1, "restart");
    assert_eq!(got.len(), 3, "readiness was already not ready: {got:?}");
}

// HAProxy's agent check: each level and the verdict in the default map, the line HAProxy
// reads (all four words every time), and a map that names other states.
#[test]
fn agent_check_table() {
    use super::haproxy::config::{HaproxyMap, HaproxyState as H};
    use haproxy::agent_check;
    let map = HaproxyMap::default();
    // (status, level, state, line before the reason)
    let rows = [
        (OK, NORMAL, H::Ready, "up ready 100% maxconn:100000 #"),
        (OK, Throttle, H::Queue, "up ready 100% maxconn:4 #"),
        (OK, Degrade, H::Drain, "up drain 100% maxconn:100000 #"),
        (OK, Evict, H::Down, "down ready 100% maxconn:100000 #"),
        (
            Abnormal,
            NORMAL,
            H::Down,
            "down ready 100% maxconn:100000 #",
        ),
        (
            Abnormal,
            Throttle,
            H::Down,
            "down ready 100% maxconn:100000 #",
        ),
        (Initial, NORMAL, H::Down, "down ready 100% maxconn:100000 #"),
    ];
    for (status, level, state, head) in rows {
        let a = agent_check(&facts(status, level), &map);
        assert_eq!(a.state, state, "{status:?} {level:?}");
        let line = a.line();
        assert!(line.starts_with(head), "{status:?} {level:?}: {line:?}");
        assert!(
            line.ends_with('\n') && line.matches('\n').count() == 1,
            "{line:?}"
        );
    }
    let t = agent_check(&facts(OK, Throttle), &map);
    assert!(t.reason.contains("at most 4 running"), "{}", t.reason);
    let a = agent_check(&facts(Abnormal, NORMAL), &map);
    assert_eq!(a.reason, "abnormal: why");
    // No running count when it left normal: a cap of 1, said so.
    let mut f = facts(OK, Throttle);
    f.admission_cap = None;
    let t = agent_check(&f, &map);
    assert_eq!(t.maxconn, 1);
    assert!(
        t.line().starts_with("up ready 100% maxconn:1 #"),
        "{}",
        t.line()
    );
    assert!(t.reason.contains("no running count"), "{}", t.reason);
    // Another map: throttle drains, degrade and evict go to maintenance, abnormal stays down.
    let other = HaproxyMap {
        throttle: H::Drain,
        degrade: H::Maint,
        evict: H::Maint,
        abnormal: H::Down,
        maxconn: 64,
    };
    let states: Vec<H> = [NORMAL, Throttle, Degrade, Evict]
        .into_iter()
        .map(|l| agent_check(&facts(OK, l), &other).state)
        .collect();
    assert_eq!(states, [H::Ready, H::Drain, H::Maint, H::Maint]);
    assert!(
        agent_check(&facts(OK, Degrade), &other)
            .line()
            .starts_with("up maint 100% maxconn:64 #")
    );
    // A cap above the configured one is cut to it.
    let capped = HaproxyMap {
        maxconn: 2,
        ..HaproxyMap::default()
    };
    assert_eq!(agent_check(&facts(OK, Throttle), &capped).maxconn, 2);
}

// A reason with a newline (an engine's error text) or past the cap is one short line: the
// answer stays one line, cut on a character boundary.
#[test]
fn agent_check_reason_is_one_bounded_line() {
    let mut f = facts(Abnormal, NORMAL);
    f.reason = format!("engine said:\nboom\r{}", "é".repeat(300));
    let line = haproxy::agent_check(&f, &haproxy::config::HaproxyMap::default()).line();
    assert_eq!(line.matches('\n').count(), 1, "{line:?}");
    assert!(!line.contains('\r'));
    let reason = line.split_once('#').unwrap().1.trim_end();
    assert!(reason.len() <= haproxy::MAX_REASON, "{}", reason.len());
    assert!(
        reason.starts_with("abnormal: engine said: boom") && reason.ends_with("..."),
        "{reason}"
    );
    // Cut at a word: no half word, no dangling `(`.
    f.reason = "2 consecutive virtual requests failed and were counted, confirmed (last: the request timed out after 5 s)".into();
    let line = haproxy::agent_check(&f, &haproxy::config::HaproxyMap::default()).line();
    let reason = line.split_once('#').unwrap().1.trim_end();
    assert!(reason.len() <= haproxy::MAX_REASON, "{}", reason.len());
    assert_eq!(
        reason,
        "abnormal: 2 consecutive virtual requests failed and were counted, confirmed (last: the request timed out..."
    );
    let unknown = haproxy::AgentCheck::unknown("no engine named \"x\"".into()).line();
    assert_eq!(
        unknown,
        "down ready 100% maxconn:100000 #no engine named \"x\"\n"
    );
}
