//! What the agent did about an engine, and when, in one shape for every integration (the last
//! [`KEPT`]): what Node Manager was told (the verdict), what the kubelet was told (readiness,
//! liveness), the Kubernetes API calls, what HAProxy and Envoy were told, and the QoS level
//! behind them all. For `/status/detail` (`actions`) and the operator views (the admin page,
//! `top`). Filled by [`crate::integrations::observe`], the routers' listeners and the Kubernetes
//! API mode's loop; nothing here feeds a decision. What was told is typed ([`Told`], each
//! integration's own states); the words are made only for the wire ([`ActionRecord`]).

use super::verdict::Status;
use crate::integrations::envoy::told::EnvoyState;
use crate::integrations::haproxy::config::HaproxyState;
use crate::integrations::kubelet::told::{Live, Ready};
use crate::integrations::kubernetes::told::{Outcome, PodAction};
use crate::qos::score::Level;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::sync::Mutex;

/// Changes kept per engine.
pub const KEPT: usize = 50;

/// Who an action is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Integration {
    /// The agent's own grading: the QoS level (`action` `level`).
    Agent,
    /// MindIE's Node Manager: the verdict `/status` serves (`status`).
    NodeManager,
    /// The kubelet: what `/readyz` (`readyz`: `ready`, `not_ready`) and `/livez` (`livez`:
    /// `live`, `restart`) answer.
    Kubelet,
    /// The Kubernetes API mode's calls (`condition`, `eviction`, `mindcluster_annotation`;
    /// `to` is the outcome).
    KubernetesApi,
    /// HAProxy's agent check (`agent_check`: `ready`, `queue`, `drain`, `maint`, `down`).
    Haproxy,
    /// Envoy's health check (`health_check`: `healthy`, `degraded`, `unhealthy`).
    Envoy,
}

impl Integration {
    pub fn as_str(self) -> &'static str {
        match self {
            Integration::Agent => "agent",
            Integration::NodeManager => "node_manager",
            Integration::Kubelet => "kubelet",
            Integration::KubernetesApi => "kubernetes_api",
            Integration::Haproxy => "haproxy",
            Integration::Envoy => "envoy",
        }
    }
}

/// What one integration was told or asked, typed; its words on the wire are
/// [`Told::action`] and [`Told::word`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Told {
    /// Node Manager: the verdict `/status` serves.
    Verdict(Status),
    /// The agent's own grading: the QoS level.
    Level(Level),
    /// The kubelet: what `/readyz` answers.
    Ready(Ready),
    /// The kubelet: what `/livez` answers.
    Live(Live),
    /// HAProxy: the state its agent check was answered.
    Haproxy(HaproxyState),
    /// Envoy: the host state its health check read.
    Envoy(EnvoyState),
    /// The Kubernetes API mode: a call on the pod, and how it ended.
    Api(PodAction, Outcome),
}

impl Told {
    /// Who was told.
    pub fn integration(self) -> Integration {
        match self {
            Told::Verdict(_) => Integration::NodeManager,
            Told::Level(_) => Integration::Agent,
            Told::Ready(_) | Told::Live(_) => Integration::Kubelet,
            Told::Haproxy(_) => Integration::Haproxy,
            Told::Envoy(_) => Integration::Envoy,
            Told::Api(..) => Integration::KubernetesApi,
        }
    }

    /// What acted or was told: `status`, `level`, `readyz`, `livez`, `agent_check`,
    /// `health_check`, or the API call.
    pub fn action(self) -> &'static str {
        match self {
            Told::Verdict(_) => "status",
            Told::Level(_) => "level",
            Told::Ready(_) => "readyz",
            Told::Live(_) => "livez",
            Told::Haproxy(_) => "agent_check",
            Told::Envoy(_) => "health_check",
            Told::Api(call, _) => call.as_str(),
        }
    }

    /// The state told, in the integration's words (an API call: its outcome).
    pub fn word(self) -> &'static str {
        match self {
            Told::Verdict(s) => s.as_str(),
            Told::Level(l) => l.as_str(),
            Told::Ready(r) => r.as_str(),
            Told::Live(l) => l.as_str(),
            Told::Haproxy(h) => h.as_str(),
            Told::Envoy(e) => e.as_str(),
            Told::Api(_, outcome) => outcome.as_str(),
        }
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

/// One action in words, as `/status/detail`'s `actions` shows it (made from an [`Entry`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ActionRecord {
    pub at_unix_ms: u64,
    pub integration: Integration,
    /// What acted or was told ([`Told::action`]).
    pub action: String,
    /// The state before (`start` at the first one); empty for an API call.
    pub from: String,
    /// The state after, or an API call's outcome.
    pub to: String,
    /// The QoS level at that moment.
    pub level: Level,
    /// Why, in one line.
    pub reason: String,
}

impl From<&Entry> for ActionRecord {
    fn from(e: &Entry) -> ActionRecord {
        let from = match (e.before, e.told) {
            (_, Told::Api(..)) => "",
            (Some(b), _) => b.word(),
            (None, _) => "start",
        };
        ActionRecord {
            at_unix_ms: e.at_unix_ms,
            integration: e.told.integration(),
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
pub struct Journal(Mutex<VecDeque<Entry>>);

impl Journal {
    /// Adds a change, dropping the oldest beyond [`KEPT`].
    pub fn push(&self, e: Entry) {
        let mut g = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if g.len() == KEPT {
            g.pop_front();
        }
        g.push_back(e);
    }

    /// A copy, oldest first.
    pub fn entries(&self) -> Vec<Entry> {
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
                told: Told::Level(Level::Throttle),
                before: Some(Told::Level(Level::Normal)),
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

    // Every word on the wire comes from the typed states: the first entry reads from
    // `start`, an API call from nothing.
    #[test]
    fn the_words_are_made_at_the_wire() {
        let e = |told, before| Entry {
            at_unix_ms: 1,
            told,
            before,
            level: Level::Normal,
            reason: "why".into(),
        };
        let r = ActionRecord::from(&e(Told::Ready(Ready::NotReady), None));
        assert_eq!(
            (
                r.integration,
                r.action.as_str(),
                r.from.as_str(),
                r.to.as_str()
            ),
            (Integration::Kubelet, "readyz", "start", "not_ready")
        );
        let r = ActionRecord::from(&e(
            Told::Haproxy(HaproxyState::Drain),
            Some(Told::Haproxy(HaproxyState::Ready)),
        ));
        assert_eq!(
            (
                r.integration,
                r.action.as_str(),
                r.from.as_str(),
                r.to.as_str()
            ),
            (Integration::Haproxy, "agent_check", "ready", "drain")
        );
        let r = ActionRecord::from(&e(Told::Api(PodAction::Eviction, Outcome::Refused), None));
        assert_eq!(
            (
                r.integration,
                r.action.as_str(),
                r.from.as_str(),
                r.to.as_str()
            ),
            (Integration::KubernetesApi, "eviction", "", "refused")
        );
        assert_eq!(Told::Envoy(EnvoyState::Degraded).word(), "degraded");
        assert_eq!(Told::Live(Live::Restart).action(), "livez");
    }
}
