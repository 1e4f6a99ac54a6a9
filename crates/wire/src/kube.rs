//! What the Kubernetes API mode did about an engine, as `/status/detail`'s `kubernetes`
//! shows it: the readiness-gate condition as last set, and each call that acted on the pod
//! and how it ended.

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};

/// What an [`Attempt`] did to the pod. Its name on the wire (JSON, the metrics' `action`
/// label, log lines) is the snake_case name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PodAction {
    /// The readiness-gate condition changed.
    Condition,
    /// An Eviction (policy/v1).
    Eviction,
    /// MindCluster's fault annotation.
    MindclusterAnnotation,
}

/// How an [`Attempt`] ended (the same naming as [`PodAction`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
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
    /// Every action (the metrics write one series per action and outcome).
    pub const ALL: [PodAction; 3] = [
        PodAction::Condition,
        PodAction::Eviction,
        PodAction::MindclusterAnnotation,
    ];

    /// Its name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            PodAction::Condition => "condition",
            PodAction::Eviction => "eviction",
            PodAction::MindclusterAnnotation => "mindcluster_annotation",
        }
    }
}

impl Outcome {
    /// Every outcome.
    pub const ALL: [Outcome; 4] = [
        Outcome::Done,
        Outcome::Refused,
        Outcome::Failed,
        Outcome::PodGone,
    ];

    /// Its name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Done => "done",
            Outcome::Refused => "refused",
            Outcome::Failed => "failed",
            Outcome::PodGone => "pod_gone",
        }
    }
}

impl std::fmt::Display for PodAction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Attempts kept per engine.
pub const KEPT_ATTEMPTS: usize = 20;

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

    /// Counts a failed API call, at `at_unix_ms`.
    pub fn api_error(&mut self, what: String, at_unix_ms: u64) {
        self.api_errors += 1;
        self.last_api_error = Some(what);
        self.last_api_error_unix_ms = Some(at_unix_ms);
    }
}
