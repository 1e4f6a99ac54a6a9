//! Writes each engine's changes (what Node Manager, the kubelet are told; the QoS level) to
//! its record of actions ([`crate::monitor::journal`]), so `/status/detail` and a page
//! opened after the fact still show what was done. Reads only: the verdict is peeked, no
//! probe is started.

use super::answers::Answers;
use super::kubelet::told::{Live, Ready};
use super::node_manager;
use crate::clock::unix_ms;
use crate::monitor::Monitor;
use crate::monitor::journal::{Entry, Told};
use crate::monitor::verdict::Status;
use crate::qos::score::Level;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Time between observations: a change is stamped within this of when it happened.
pub(crate) const PERIOD: Duration = Duration::from_millis(250);

/// What one observation compares with the last.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ObservedState {
    pub status: Status,
    pub level: Level,
    pub ready: bool,
    pub live: bool,
}

impl ObservedState {
    /// What `a` says.
    pub(crate) fn of(a: &Answers) -> ObservedState {
        ObservedState {
            status: a.facts.status,
            level: a.facts.level,
            ready: a.readiness.ready,
            live: a.liveness.live,
        }
    }
}

/// The changes from `before` to what `a` says; at the first observation (`before` is
/// `None`), the verdict and readiness found.
pub(crate) fn changes(before: Option<&ObservedState>, a: &Answers, at_unix_ms: u64) -> Vec<Entry> {
    let now = ObservedState::of(a);
    let (f, r, l) = (&a.facts, &a.readiness, &a.liveness);
    let entry = |told: Told, before: Option<Told>, reason: &str| Entry {
        at_unix_ms,
        told,
        before,
        level: now.level,
        reason: reason.to_owned(),
    };
    let verdict = node_manager::told(now.status);
    let ready = Told::from(Ready::of(now.ready));
    let Some(b) = before else {
        // Where the record starts: the verdict and readiness found.
        return vec![
            entry(verdict, None, &f.reason),
            entry(ready, None, &r.reason),
        ];
    };
    let mut out = Vec::new();
    if b.status != now.status {
        let was = node_manager::told(b.status);
        out.push(entry(verdict, Some(was), &f.reason));
    }
    if b.level != now.level {
        let score = f
            .score
            .map_or_else(|| "no score".to_owned(), |s| format!("score {s:.3}"));
        let told = Told::from(now.level);
        out.push(entry(told, Some(Told::from(b.level)), &score));
    }
    if b.ready != now.ready {
        out.push(entry(
            ready,
            Some(Told::from(Ready::of(b.ready))),
            &r.reason,
        ));
    }
    if b.live != now.live {
        let (told, was) = (Live::of(now.live), Live::of(b.live));
        out.push(entry(Told::from(told), Some(Told::from(was)), &l.reason));
    }
    out
}

/// Observes `m` every [`PERIOD`] until `cancel`.
pub(crate) async fn run(m: Arc<Monitor>, cancel: CancellationToken) {
    let mut tick = tokio::time::interval(PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last: Option<ObservedState> = None;
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        // One verdict a beat, for the answers and for the rules' and the shadow's records.
        let verdict = m.verdict();
        let a = Answers::with(&m, &verdict);
        for e in changes(last.as_ref(), &a, unix_ms()) {
            m.journal().push(e);
        }
        last = Some(ObservedState::of(&a));
        m.observe_rules(&verdict);
    }
}
