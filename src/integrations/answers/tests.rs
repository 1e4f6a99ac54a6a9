//! The readiness and liveness rules as tables: which verdict and level open or close
//! `/readyz` and `/livez`.

use super::config::{NotReadyList, NotReadyOn};
use super::{liveness, readiness};
use crate::integrations::facts::{AbnormalCause, ActionInputs};
use crate::integrations::tests::facts;
use crate::monitor::verdict::{HealthState, Status};
use crate::monitor::vi_state::Phase;
use crate::qos::score::Level;

fn cfg(on: &[NotReadyOn]) -> NotReadyList {
    NotReadyList(on.to_vec())
}

use Level::{Degrade, Evict, Throttle};
use NotReadyOn as On;
use Status::{Abnormal, Initial};
const OK: Status = Status::Normal;
const NORMAL: Level = Level::Normal;
#[test]
fn readiness_table() {
    let default = NotReadyList::default();
    // (status, level, config, ready, degraded header)
    let rows: Vec<(Status, Level, NotReadyList, bool, bool)> = vec![
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
            c.0,
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
