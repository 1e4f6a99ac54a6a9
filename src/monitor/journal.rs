//! What the agent did about an engine, and when, in one shape for every integration (the last
//! [`KEPT`]): what Node Manager was told (the verdict), what the kubelet was told (readiness,
//! liveness), the Kubernetes API calls, what HAProxy and Envoy were told, and the QoS level
//! behind them all. For `/status/detail` (`actions`) and the operator views (the admin page,
//! `top`). Filled by [`crate::actions::observe`], the routers' listeners and the Kubernetes
//! API mode's loop; nothing here feeds a decision.

use crate::qos::score::Level;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::sync::Mutex;

/// Changes kept per engine.
pub const KEPT: usize = 50;

/// Who an action is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
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

/// One action: what an integration was told or asked, the level at that moment, and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ActionRecord {
    pub at_unix_ms: u64,
    pub integration: Integration,
    /// What acted or was told (`status`, `readyz`, `livez`, `level`, `agent_check`,
    /// `health_check`, an API call).
    pub action: String,
    /// The state before (`start` at the first one); empty for an API call.
    pub from: String,
    /// The state after, or an API call's outcome.
    pub to: String,
    /// The QoS level at that moment.
    pub level: Level,
    /// Why, in one line (the verdict's reason, the score, the answer's reason).
    pub reason: String,
}

/// The last changes of one engine, oldest first.
#[derive(Debug, Default)]
pub struct Journal(Mutex<VecDeque<ActionRecord>>);

impl Journal {
    /// Adds a change, dropping the oldest beyond [`KEPT`].
    pub fn push(&self, e: ActionRecord) {
        let mut g = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if g.len() == KEPT {
            g.pop_front();
        }
        g.push_back(e);
    }

    /// A copy, oldest first.
    pub fn entries(&self) -> Vec<ActionRecord> {
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
            j.push(ActionRecord {
                at_unix_ms: i,
                integration: Integration::Agent,
                action: "level".into(),
                from: "normal".into(),
                to: "throttle".into(),
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
}
