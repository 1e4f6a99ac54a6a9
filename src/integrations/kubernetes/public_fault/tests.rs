//! The plan's rules: one message per change, the minimum interval, the refresh, the
//! escalation's swap, and a restart's idempotence; the message's ids and limits.

use super::message::{self, check};
use super::*;

const PACE: Pace = Pace {
    min_interval_ms: 5_000,
    refresh_ms: 600_000,
};
/// 2026-12-07, in ms.
const T0: u64 = 1_796_600_000_000;
const KEY: &str = "0123456789abcdef";

fn fresh(kind: Kind, since: u64) -> FaultSent {
    FaultSent {
        fault_id: fault_id(KEY, kind, since),
        kind,
        code: match kind {
            Kind::Abnormal => "010019001",
            Kind::RestartLoop => "020019002",
        }
        .to_owned(),
        fault_time_unix_ms: since,
        device_ids: vec![5, 7],
        description: "npu-health-agent: engine e abnormal".to_owned(),
        sent_unix_ms: 0,
    }
}

fn abnormal(since: u64) -> Desired {
    Desired::Fault {
        kind: Kind::Abnormal,
        since_unix_ms: since,
    }
}

/// Plans at `now` and, when it writes, applies the write; returns what was written.
fn step(p: &mut Published, want: &Desired, now: u64) -> Vec<(String, Assertion)> {
    match plan(p, want, now, PACE, fresh) {
        Plan::Write(w) => {
            *p = after(p, &w, now);
            w.into_iter().map(|(f, a)| (f.fault_id, a)).collect()
        }
        Plan::Idle | Plan::Wait { .. } => Vec::new(),
    }
}

#[test]
fn an_episode_is_one_occur_and_one_recover_with_the_occurrence_time() {
    let mut p = Published::default();
    let id = fault_id(KEY, Kind::Abnormal, T0);
    assert_eq!(
        step(&mut p, &abnormal(T0), T0 + 10),
        [(id.clone(), Assertion::Occur)]
    );
    // Every tick of the same episode: nothing more.
    for s in 1..60 {
        assert!(step(&mut p, &abnormal(T0), T0 + 10 + s * 1000).is_empty());
    }
    assert!(step(&mut p, &Desired::Unknown, T0 + 70_000).is_empty());
    let Plan::Write(w) = plan(&p, &Desired::Clear, T0 + 80_000, PACE, fresh) else {
        panic!("a recover")
    };
    assert_eq!(w.len(), 1);
    assert_eq!(
        (w[0].0.fault_id.as_str(), w[0].1),
        (id.as_str(), Assertion::Recover)
    );
    assert_eq!(w[0].0.fault_time_unix_ms, T0, "faultTime is the occurrence");
    p = after(&p, &w, T0 + 80_000);
    assert!(p.open.is_none());
    assert!(step(&mut p, &Desired::Clear, T0 + 81_000).is_empty());
    assert_eq!(p.messages, 2);
}

#[test]
fn changes_within_the_minimum_interval_wait_and_coalesce() {
    let mut p = Published::default();
    step(&mut p, &abnormal(T0), T0);
    assert_eq!(
        plan(&p, &Desired::Clear, T0 + 1_000, PACE, fresh),
        Plan::Wait {
            until_unix_ms: T0 + 5_000
        }
    );
    // The next episode began before the recover could go: one message recovers the first
    // and raises the second.
    let w = step(&mut p, &abnormal(T0 + 3_000), T0 + 5_000);
    assert_eq!(
        w,
        [
            (fault_id(KEY, Kind::Abnormal, T0), Assertion::Recover),
            (fault_id(KEY, Kind::Abnormal, T0 + 3_000), Assertion::Occur)
        ]
    );
}

#[test]
fn escalation_recovers_the_abnormal_fault_and_raises_the_loop_code_in_one_message() {
    let mut p = Published::default();
    step(&mut p, &abnormal(T0), T0);
    let looping = Desired::Fault {
        kind: Kind::RestartLoop,
        since_unix_ms: T0,
    };
    let w = step(&mut p, &looping, T0 + 10_000);
    assert_eq!(
        w,
        [
            (fault_id(KEY, Kind::Abnormal, T0), Assertion::Recover),
            (fault_id(KEY, Kind::RestartLoop, T0), Assertion::Occur)
        ]
    );
    assert_eq!(p.open.as_ref().unwrap().code, "020019002");
}

#[test]
fn an_open_occur_is_written_again_every_refresh_and_a_recover_once_more() {
    let mut p = Published::default();
    let id = fault_id(KEY, Kind::Abnormal, T0);
    step(&mut p, &abnormal(T0), T0);
    assert!(step(&mut p, &abnormal(T0), T0 + 599_999).is_empty());
    assert_eq!(
        step(&mut p, &abnormal(T0), T0 + 600_000),
        [(id.clone(), Assertion::Occur)]
    );
    step(&mut p, &Desired::Clear, T0 + 700_000);
    assert!(step(&mut p, &Desired::Clear, T0 + 1_000_000).is_empty());
    assert_eq!(
        step(&mut p, &Desired::Clear, T0 + 1_300_000),
        [(id, Assertion::Recover)]
    );
    assert!(
        step(&mut p, &Desired::Clear, T0 + 9_000_000).is_empty(),
        "once"
    );
}

// A restarted agent reads what the last one kept: the same episode's occur is not sent
// again, and a recover it owed is sent.
#[test]
fn what_was_published_survives_the_state_file_and_a_restart_sends_no_duplicate() {
    let mut p = Published::default();
    step(&mut p, &abnormal(T0), T0);
    let kept: Published = serde_json::from_str(&serde_json::to_string(&p).unwrap()).unwrap();
    let mut again = kept.clone();
    assert!(
        step(&mut again, &abnormal(T0), T0 + 30_000).is_empty(),
        "no duplicate occur"
    );
    assert!(step(&mut again, &Desired::Unknown, T0 + 30_000).is_empty());
    let mut again = kept;
    assert_eq!(
        step(&mut again, &Desired::Clear, T0 + 30_000),
        [(fault_id(KEY, Kind::Abnormal, T0), Assertion::Recover)],
        "the recover owed"
    );
}

#[test]
fn ids_names_and_messages_stay_within_clusterds_rules() {
    let key = engine_key("node-a.example", "Décode_0 (long name)");
    assert_eq!(key.len(), 16);
    assert_ne!(key, engine_key("node-a.example", "Décode_0 (long name)x"));
    let id = fault_id(&key, Kind::RestartLoop, T0);
    assert_eq!(id.len(), 36);
    let node = "n".repeat(253);
    let name = message::configmap_name("npu-health-agent-pf", &node, "Décode_0 (long name)", &key);
    assert!(name.len() <= 253, "{}", name.len());
    assert!(
        name.ends_with(&format!("-d-code-0--long-name-{}", &key[..8])),
        "{name}"
    );
    let f = fresh(Kind::Abnormal, T0);
    let m = message::message(
        &key,
        "node-a",
        "npu-health-agent",
        &[(f.clone(), Assertion::Occur)],
        T0,
    );
    assert_eq!(check(&m), Ok(()));
    let text = serde_json::to_value(&m).unwrap();
    assert_eq!(text["faults"][0]["faultId"], f.fault_id);
    assert_eq!(
        text["faults"][0]["influence"][0]["deviceIds"],
        serde_json::json!([5, 7])
    );
    assert_eq!(text["faults"][0]["assertion"], "occur");
    let mut bad = m.clone();
    bad.faults[0].influence[0].device_ids = (0..33).collect();
    assert!(check(&bad).is_err(), "33 devices");
    let mut bad = m.clone();
    bad.timestamp = 1_700_000_000_000;
    assert!(check(&bad).unwrap_err().contains("before 2025"));
    let mut bad = m;
    bad.faults[0].description = "two\nlines".to_owned();
    assert!(check(&bad).is_err());
    assert_eq!(message::description("a\tb\nc"), "a b c");
    let (ids, left) = message::device_ids(&[Some(7), None, Some(5), Some(40), Some(7)]);
    assert_eq!(ids, [5, 7]);
    assert_eq!(left.len(), 2);
}
