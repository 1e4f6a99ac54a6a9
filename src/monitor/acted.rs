//! What the agent did about an engine through the Kubernetes API (the readiness-gate
//! condition, evictions) and what it last told each router that polls it (HAProxy's agent
//! check), kept beside the verdict so `/status/detail` shows each attempt and its outcome.
//! Written by [`crate::k8s`]'s loop and the routers' listeners; nothing here feeds the
//! verdict.

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

/// What an [`Attempt`] did to the pod. Its name on the wire (JSON, the metrics' `action`
/// label, log lines) is the snake_case name, derived once for serde and for `as_str`.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    strum::EnumIter,
    strum::IntoStaticStr,
    strum::Display,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum PodAction {
    /// The readiness-gate condition changed.
    Condition,
    /// An Eviction (policy/v1).
    Eviction,
    /// MindCluster's fault annotation.
    MindclusterAnnotation,
}

/// How an [`Attempt`] ended (the same naming as [`PodAction`]).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    strum::EnumIter,
    strum::IntoStaticStr,
    strum::Display,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum Outcome {
    Done,
    /// A PodDisruptionBudget or the API server's rate limit: retried with back-off.
    Refused,
    /// Retried with back-off.
    Failed,
    /// The pod no longer exists.
    PodGone,
}

impl PodAction {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// Attempts kept per engine.
pub const KEPT_ATTEMPTS: usize = 20;

/// Milliseconds since the Unix epoch, now.
pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The readiness-gate condition as last set on the pod.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConditionSet {
    #[serde(rename = "type")]
    pub type_: String,
    /// `True` or `False`.
    pub status: String,
    pub reason: String,
    pub message: String,
    pub set_at_unix_ms: u64,
}

/// One API call that acts on the pod (an eviction, an annotation, a condition change).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Attempt {
    pub at_unix_ms: u64,
    pub action: PodAction,
    /// `namespace/name`.
    pub pod: String,
    pub outcome: Outcome,
    pub detail: String,
}

/// The Kubernetes API mode's record of one engine (`kubernetes` in `/status/detail`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct KubeRecord {
    /// The mode cannot act for this engine at all: why (no client, no node name).
    pub inactive: Option<String>,
    /// The engine's pod, `namespace/name`, as last found.
    pub pod: Option<String>,
    /// Why no pod is known (none found, several found, the lookup failed).
    pub pod_error: Option<String>,
    /// `api`, `mindcluster` or `off`.
    pub eviction: String,
    pub eviction_cooldown_s: f64,
    /// The condition as last set; `None` before the first success or with the gate off.
    pub condition: Option<ConditionSet>,
    /// When the next eviction may be tried, if one is held back (cooldown, back-off).
    pub eviction_blocked_until_unix_ms: Option<u64>,
    pub eviction_blocked_why: Option<String>,
    /// The last attempts, oldest first.
    pub attempts: VecDeque<Attempt>,
    /// Every attempt since the start, by `action` then `outcome` (for the metrics).
    pub totals: BTreeMap<PodAction, BTreeMap<Outcome, u64>>,
    /// API calls that failed, of any kind.
    pub api_errors: u64,
    pub last_api_error: Option<String>,
    pub last_api_error_unix_ms: Option<u64>,
}

/// The eviction gate's memory (`actions::eviction::EvictionGate`) in wall-clock time, so a
/// restarted agent keeps the cooldown after an eviction and the back-off after a refusal.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GateMemory {
    /// When the last eviction went through.
    pub done_at_unix_ms: Option<u64>,
    /// No attempt before this (back-off after a refused or failed one).
    pub retry_at_unix_ms: Option<u64>,
    /// The next back-off.
    pub backoff_ms: u64,
}

/// The states the agent tells each router that polls it, by router (the metric
/// `npu_health_agent_router_state` has one series per state).
pub const ROUTER_STATES: [(&str, &[&str]); 2] = [
    ("haproxy", &["ready", "queue", "drain", "maint", "down"]),
    ("envoy", &["healthy", "degraded", "unhealthy"]),
];

/// What a router that polls the agent was last told about an engine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RouterSeen {
    /// The state it was told (HAProxy: `ready`, `queue`, `drain`, `maint`, `down`).
    pub state: String,
    /// Since when it is told that state.
    pub since_unix_ms: u64,
    pub last_poll_unix_ms: u64,
    /// Polls answered since the agent started.
    pub polls: u64,
    /// Why, as the last answer said.
    pub reason: String,
}

/// The record behind a lock (`None` while the mode is off), the eviction gate's memory, and
/// the routers' states.
#[derive(Debug, Default)]
pub struct ActionMemory {
    record: Mutex<Option<KubeRecord>>,
    gate: Mutex<Option<GateMemory>>,
    routers: Mutex<BTreeMap<String, RouterSeen>>,
}

impl ActionMemory {
    /// A copy of the record.
    pub fn kubernetes(&self) -> Option<KubeRecord> {
        self.record
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Changes the record (creating it).
    pub fn update(&self, f: impl FnOnce(&mut KubeRecord)) {
        let mut g = self.record.lock().unwrap_or_else(|p| p.into_inner());
        f(g.get_or_insert_with(KubeRecord::default));
    }

    /// The eviction gate's memory, as last written.
    pub fn gate(&self) -> Option<GateMemory> {
        *self.gate.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keeps the eviction gate's memory.
    pub fn set_gate(&self, g: GateMemory) {
        *self.gate.lock().unwrap_or_else(|p| p.into_inner()) = Some(g);
    }

    /// Notes an answer to `router`'s poll; the state before (`start` at the first poll) when
    /// it changed.
    pub fn router_saw(&self, router: &str, state: &str, reason: &str) -> Option<String> {
        let now = unix_ms();
        let mut g = self.routers.lock().unwrap_or_else(|p| p.into_inner());
        let seen = g.entry(router.to_owned()).or_insert_with(|| RouterSeen {
            state: String::new(),
            since_unix_ms: now,
            last_poll_unix_ms: now,
            polls: 0,
            reason: String::new(),
        });
        let changed = (seen.state != state).then(|| {
            let before = std::mem::replace(&mut seen.state, state.to_owned());
            seen.since_unix_ms = now;
            if before.is_empty() {
                "start".to_owned()
            } else {
                before
            }
        });
        seen.last_poll_unix_ms = now;
        seen.polls += 1;
        if seen.reason != reason {
            seen.reason = reason.to_owned();
        }
        changed
    }

    /// What each router was last told, by router.
    pub fn routers(&self) -> BTreeMap<String, RouterSeen> {
        self.routers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Takes back a saved record and gate memory (an agent restart).
    pub fn restore(&self, record: Option<KubeRecord>, gate: Option<GateMemory>) {
        *self.record.lock().unwrap_or_else(|p| p.into_inner()) = record;
        *self.gate.lock().unwrap_or_else(|p| p.into_inner()) = gate;
    }
}

impl KubeRecord {
    /// Adds an attempt, keeping the last [`KEPT_ATTEMPTS`].
    pub fn push(&mut self, a: Attempt) {
        *self
            .totals
            .entry(a.action)
            .or_default()
            .entry(a.outcome)
            .or_default() += 1;
        if self.attempts.len() == KEPT_ATTEMPTS {
            self.attempts.pop_front();
        }
        self.attempts.push_back(a);
    }

    /// Counts a failed API call.
    pub fn api_error(&mut self, what: String) {
        self.api_errors += 1;
        self.last_api_error = Some(what);
        self.last_api_error_unix_ms = Some(unix_ms());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_haproxy_states_are_the_configs() {
        use strum::IntoEnumIterator;
        let names: Vec<&str> = crate::config::actions::HaproxyState::iter()
            .map(|s| s.as_str())
            .collect();
        assert_eq!(ROUTER_STATES[0], ("haproxy", names.as_slice()));
    }

    #[test]
    fn a_router_state_change_is_noted_once() {
        let a = ActionMemory::default();
        assert_eq!(
            a.router_saw("haproxy", "ready", "normal").as_deref(),
            Some("start")
        );
        assert_eq!(a.router_saw("haproxy", "ready", "normal (score 0.9)"), None);
        assert_eq!(
            a.router_saw("haproxy", "drain", "degrade").as_deref(),
            Some("ready")
        );
        let r = a.routers();
        assert_eq!(r["haproxy"].polls, 3);
        assert_eq!(r["haproxy"].state, "drain");
        assert_eq!(r["haproxy"].reason, "degrade");
    }
}
