//! The rules of docs/policy.md as one engine applies them (`/status/detail`'s `rules`), and
//! the shadow beside the policy in force (`shadow`): when each said `abnormal`, and every
//! time they disagreed.

use crate::{Policy, Status};
use serde::{Deserialize, Serialize};

/// One rule of docs/policy.md on one engine: its mode and how often it fired.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuleRecord {
    /// Its number in docs/policy.md.
    pub id: u8,
    pub name: String,
    /// `enforce`, `observe` or `off` as configured (`[engine.agent_policy]`); under
    /// `reference` a rule is `off` unless `[engine.qos]` turns it on (7, 9).
    pub mode: String,
    /// Times it turned the verdict `abnormal` (since the agent started).
    pub fired: u64,
    /// Times it would have changed the verdict from the shadow (since the agent started).
    pub would_have: u64,
}

/// One turn of one side's verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Turn {
    pub at_unix_ms: u64,
    /// `in_force` or `shadow`.
    pub side: String,
    pub policy: Policy,
    pub status: Status,
    /// The docs/policy.md rule behind an `abnormal`; `null` for the reference's own rules.
    pub rule: Option<u8>,
    pub reason: String,
}

/// A time the shadow and the policy in force disagreed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Disagreement {
    pub began_unix_ms: u64,
    /// `null` while it lasts.
    pub ended_unix_ms: Option<u64>,
    /// What `/status` answered (the policy in force).
    pub status: Status,
    /// What it would have answered under the shadow.
    pub would_status: Status,
    /// The rule that makes the difference: the shadow's rule that fired, the one that held
    /// its verdict back, or the rule in force the shadow lacks.
    pub rule: Option<u8>,
    pub reason: String,
}

/// The shadow beside the policy in force (`/status/detail`'s `shadow`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShadowRecord {
    /// The shadow's policy (`agent` with the rules in `observe` enforced too, or
    /// `shadow_policy`).
    pub policy: Policy,
    /// What `/status` would answer under it now.
    pub status: Status,
    pub reason: String,
    pub rule: Option<u8>,
    /// When each side's verdict turned, oldest first (the last [`KEPT_TURNS`]).
    pub turns: Vec<Turn>,
    /// Every disagreement, oldest first (the last [`KEPT_TURNS`]).
    pub disagreements: Vec<Disagreement>,
}

/// The shadow's history as the state file keeps it: the turns and the disagreements.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShadowHistory {
    #[serde(default)]
    pub turns: Vec<Turn>,
    #[serde(default)]
    pub disagreements: Vec<Disagreement>,
}

impl ShadowHistory {
    /// Nothing recorded (the state file leaves the key out).
    pub fn is_empty(&self) -> bool {
        self.turns.is_empty() && self.disagreements.is_empty()
    }
}

/// Turns and disagreements kept per engine (in memory and in the state file).
pub const KEPT_TURNS: usize = 64;
