//! What the integrations were told, in words: `/status/detail`'s `actions` and `routers`.

use crate::Level;
use serde::{Deserialize, Serialize};

/// One action in words, as `/status/detail`'s `actions` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ActionRecord {
    pub at_unix_ms: u64,
    /// Who: `agent`, `node_manager`, `kubelet`, `kubernetes_api`, `haproxy`, `envoy`.
    pub integration: String,
    /// What acted or was told .
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

/// What a router that polls the agent was last told, in words, as `/status/detail`'s `routers` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RouterSeen {
    /// The state it was told (HAProxy: `ready`, `queue`, `drain`, `maint`, `down`; Envoy:
    /// `healthy`, `degraded`, `unhealthy`).
    pub state: String,
    /// Since when it is told that state.
    pub since_unix_ms: u64,
    pub last_poll_unix_ms: u64,
    /// Polls answered since the agent started.
    pub polls: u64,
    /// Why, as the last answer said.
    pub reason: String,
}
