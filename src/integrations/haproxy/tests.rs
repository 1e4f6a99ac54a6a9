//! HAProxy's agent check as tables: the state and the line each level and the verdict give.

use super::agent_check;
use super::config::{HaproxyMap, HaproxyState as H};
use crate::integrations::facts::AbnormalCause;
use crate::integrations::tests::facts;
use crate::monitor::verdict::Status;
use crate::qos::score::Level;
use Level::{Degrade, Evict, Throttle};
use Status::{Abnormal, Initial};
const OK: Status = Status::Normal;
const NORMAL: Level = Level::Normal;

// HAProxy's agent check: each level and the verdict in the default map, the line HAProxy
// reads (all four words every time), and a map that names other states.
#[test]
fn agent_check_table() {
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

// What HAProxy's stats page shows is a fixed phrase: the level or the kind of fault, never
// the score or the verdict's reason (an engine's error text), which stay in the record.
#[test]
fn the_answer_shows_no_score_and_no_reason_text() {
    let map = HaproxyMap::default();
    let mut f = facts(Abnormal, NORMAL);
    f.reason = "engine said:\nboom at http://10.0.0.5:8000/v1".into();
    let a = agent_check(&f, &map);
    assert_eq!(
        a.line(),
        "down ready 100% maxconn:100000 #abnormal: virtual inference\n"
    );
    assert!(a.reason.contains("boom at http://10.0.0.5"), "{}", a.reason);
    let d = agent_check(&facts(OK, Degrade), &map);
    assert_eq!(
        d.line(),
        "up drain 100% maxconn:100000 #QoS level degrade\n"
    );
    assert!(d.reason.contains("score 0.400"), "{}", d.reason);
    let causes = [
        None,
        Some(AbnormalCause::Health),
        Some(AbnormalCause::VirtualInference),
        Some(AbnormalCause::QosEviction),
        Some(AbnormalCause::EngineStopped),
    ];
    for (status, level, cause) in [OK, Abnormal, Initial].into_iter().flat_map(|s| {
        [NORMAL, Throttle, Degrade, Evict]
            .into_iter()
            .flat_map(move |l| causes.map(move |c| (s, l, c)))
    }) {
        let mut f = facts(status, level);
        f.cause = cause;
        let a = agent_check(&f, &map);
        let line = a.line();
        let shown = line.split_once('#').unwrap().1.trim_end();
        assert!(shown.len() <= super::MAX_REASON, "{line:?}");
        assert!(
            !shown.contains("score") && !shown.contains("why"),
            "{line:?}"
        );
        assert_eq!(line.matches('\n').count(), 1, "{line:?}");
    }
}
