//! What the agent did about an engine, and when, in one shape for every integration (the last
//! [`KEPT`]): what Node Manager was told (the verdict), what the kubelet was told (readiness,
//! liveness), the Kubernetes API calls, what HAProxy and Envoy were told, and the QoS level
//! behind them all. For `/status/detail` (`actions`) and the operator views (the admin page,
//! `top`). Filled by [`crate::integrations::observe`], the routers' answers and the Kubernetes
//! API mode's loop; nothing here feeds a decision.
//!
//! The journal names no integration: each one makes its own [`Told`] from its own typed
//! states (`From<HaproxyState> for Told` in its folder), under its own [`Id`]. The words are
//! made once, where the [`Told`] is made, and written only at the wire ([`ActionRecord`]).

use crate::qos::score::Level;
use std::collections::VecDeque;
use std::sync::Mutex;

/// Changes kept per engine.
pub(crate) const KEPT: usize = 50;

/// Who an action is for: an integration's name in the journal, `/status/detail` and the
/// metrics (`node_manager`, `kubelet`, …), given by the integration itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct Id(pub &'static str);

impl Id {
    /// The name, as the wire writes it.
    pub(crate) fn as_str(self) -> &'static str {
        self.0
    }
}

/// The agent's own grading: the QoS level (`action` `level`).
pub(crate) const AGENT: Id = Id("agent");

/// What one integration was told or asked, in its words: made by the integration from its own
/// typed state, compared by those words (one word per state).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Told {
    integration: Id,
    action: &'static str,
    word: &'static str,
    call: bool,
}

impl Told {
    /// `integration`'s `action` told the state `word` (`kubelet`, `readyz`, `not_ready`).
    pub(crate) const fn state(integration: Id, action: &'static str, word: &'static str) -> Told {
        Told {
            integration,
            action,
            word,
            call: false,
        }
    }

    /// A call `integration` made (`kubernetes_api`, `eviction`) and how it ended (`refused`):
    /// a call has no state before it.
    pub(crate) const fn call(integration: Id, action: &'static str, outcome: &'static str) -> Told {
        Told {
            integration,
            action,
            word: outcome,
            call: true,
        }
    }

    /// Who was told.
    pub(crate) fn integration(self) -> Id {
        self.integration
    }

    /// What acted or was told: `status`, `level`, `readyz`, `livez`, `agent_check`,
    /// `health_check`, or the API call.
    pub(crate) fn action(self) -> &'static str {
        self.action
    }

    /// The state told, in the integration's words (an API call: its outcome).
    pub(crate) fn word(self) -> &'static str {
        self.word
    }

    /// A call, not a state (nothing was told before it).
    pub(crate) fn is_call(self) -> bool {
        self.call
    }
}

/// The agent's own grading: the QoS level.
impl From<Level> for Told {
    fn from(l: Level) -> Told {
        Told::state(AGENT, "level", l.as_str())
    }
}

/// One action: what an integration was told or asked, what it was told before, the level
/// at that moment, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub at_unix_ms: u64,
    pub told: Told,
    /// The state before; `None` at the first one (and for an API call, which has none).
    pub before: Option<Told>,
    /// The QoS level at that moment.
    pub level: Level,
    /// Why, in one line (the verdict's reason, the score, the answer's reason).
    pub reason: String,
}

pub(crate) use npu_health_wire::ActionRecord;

impl From<&Entry> for ActionRecord {
    fn from(e: &Entry) -> ActionRecord {
        let from = match e.before {
            _ if e.told.is_call() => "",
            Some(b) => b.word(),
            None => "start",
        };
        ActionRecord {
            at_unix_ms: e.at_unix_ms,
            integration: e.told.integration().as_str().to_owned(),
            action: e.told.action().to_owned(),
            from: from.to_owned(),
            to: e.told.word().to_owned(),
            level: e.level,
            reason: e.reason.clone(),
        }
    }
}

/// The last changes of one engine, oldest first.
#[derive(Debug, Default)]
pub(crate) struct Journal(Mutex<VecDeque<Entry>>);

impl Journal {
    /// Adds a change, dropping the oldest beyond [`KEPT`].
    pub(crate) fn push(&self, e: Entry) {
        let mut g = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if g.len() == KEPT {
            g.pop_front();
        }
        g.push_back(e);
    }

    /// A copy, oldest first.
    pub(crate) fn entries(&self) -> Vec<Entry> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .cloned()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_last_changes_oldest_first() {
        let j = Journal::default();
        for i in 0..(KEPT as u64 + 5) {
            j.push(Entry {
                at_unix_ms: i,
                told: Told::from(Level::Throttle),
                before: Some(Told::from(Level::Normal)),
                level: Level::Throttle,
                reason: String::new(),
            });
        }
        let e = j.entries();
        assert_eq!(e.len(), KEPT);
        assert_eq!(
            (e[0].at_unix_ms, e[KEPT - 1].at_unix_ms),
            (5, KEPT as u64 + 4)
        );
    }

    // Every word on the wire comes from the Told an integration made: the first entry reads
    // from `start`, a call from nothing.
    #[test]
    fn the_words_are_made_at_the_wire() {
        const ROUTER: Id = Id("router");
        let e = |told, before| Entry {
            at_unix_ms: 1,
            told,
            before,
            level: Level::Normal,
            reason: "why".into(),
        };
        let words = |r: ActionRecord| (r.integration, r.action, r.from, r.to);
        let up = Told::state(ROUTER, "poll", "up");
        let down = Told::state(ROUTER, "poll", "down");
        assert_eq!(
            words(ActionRecord::from(&e(up, None))),
            ("router".into(), "poll".into(), "start".into(), "up".into())
        );
        assert_eq!(
            words(ActionRecord::from(&e(down, Some(up)))),
            ("router".into(), "poll".into(), "up".into(), "down".into())
        );
        let call = Told::call(ROUTER, "eviction", "refused");
        assert_eq!(
            words(ActionRecord::from(&e(call, Some(up)))),
            (
                "router".into(),
                "eviction".into(),
                String::new(),
                "refused".into()
            )
        );
        let level = Told::from(Level::Throttle);
        assert_eq!(
            (level.integration(), level.action(), level.word()),
            (AGENT, "level", "throttle")
        );
        assert_ne!(up, down, "compared by their words");
    }
}
