//! Writes each engine's changes (what Node Manager, the kubelet are told; the QoS level) to
//! its record of actions ([`crate::monitor::journal`]), so `/status/detail` and a page
//! opened after the fact still show what was done. Reads only: the verdict is peeked, no
//! probe is started.

use super::Answers;
use crate::monitor::Monitor;
use crate::monitor::acted::unix_ms;
use crate::monitor::journal::{ActionRecord, Integration};
use crate::monitor::verdict::Status;
use crate::qos::score::Level;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Time between observations: a change is stamped within this of when it happened.
pub const PERIOD: Duration = Duration::from_millis(250);

/// What one observation compares with the last.
#[derive(Debug, Clone, PartialEq)]
pub struct ObservedState {
    pub status: Status,
    pub level: Level,
    pub ready: bool,
    pub live: bool,
}

impl ObservedState {
    /// What `a` says.
    pub fn of(a: &Answers) -> ObservedState {
        ObservedState {
            status: a.facts.status,
            level: a.facts.level,
            ready: a.readiness.ready,
            live: a.liveness.live,
        }
    }
}

fn ready_word(ready: bool) -> &'static str {
    if ready { "ready" } else { "not_ready" }
}

fn live_word(live: bool) -> &'static str {
    if live { "live" } else { "restart" }
}

/// The changes from `before` to what `a` says; at the first observation (`before` is
/// `None`), the verdict and readiness found, from `start`.
pub fn changes(before: Option<&ObservedState>, a: &Answers, at_unix_ms: u64) -> Vec<ActionRecord> {
    let now = ObservedState::of(a);
    let (f, r, l) = (&a.facts, &a.readiness, &a.liveness);
    let entry = |(integration, action): (Integration, &str), from: &str, to: &str, reason: &str| {
        ActionRecord {
            at_unix_ms,
            integration,
            action: action.to_owned(),
            from: from.to_owned(),
            to: to.to_owned(),
            level: now.level,
            reason: reason.to_owned(),
        }
    };
    let verdict = (Integration::NodeManager, "status");
    let readyz = (Integration::Kubelet, "readyz");
    let Some(b) = before else {
        // Where the record starts: the verdict and readiness found.
        return vec![
            entry(verdict, "start", now.status.as_str(), &f.reason),
            entry(readyz, "start", ready_word(now.ready), &r.reason),
        ];
    };
    let mut out = Vec::new();
    if b.status != now.status {
        out.push(entry(
            verdict,
            b.status.as_str(),
            now.status.as_str(),
            &f.reason,
        ));
    }
    if b.level != now.level {
        let score = f
            .score
            .map_or_else(|| "no score".to_owned(), |s| format!("score {s:.3}"));
        out.push(entry(
            (Integration::Agent, "level"),
            b.level.as_str(),
            now.level.as_str(),
            &score,
        ));
    }
    if b.ready != now.ready {
        out.push(entry(
            readyz,
            ready_word(b.ready),
            ready_word(now.ready),
            &r.reason,
        ));
    }
    if b.live != now.live {
        out.push(entry(
            (Integration::Kubelet, "livez"),
            live_word(b.live),
            live_word(now.live),
            &l.reason,
        ));
    }
    out
}

/// Observes `m` every [`PERIOD`] until `cancel`.
pub async fn run(m: Arc<Monitor>, cancel: CancellationToken) {
    let mut tick = tokio::time::interval(PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last: Option<ObservedState> = None;
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        let a = Answers::of(&m);
        for e in changes(last.as_ref(), &a, unix_ms()) {
            m.journal.push(e);
        }
        last = Some(ObservedState::of(&a));
    }
}
