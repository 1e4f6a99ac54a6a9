//! The fleet brake as one engine's `/status/detail` shows it (`brake`; docs/kubernetes.md,
//! "The fleet brake"): which side answers, whether the fleet's brake is engaged as last
//! seen, and why.

use serde::{Deserialize, Serialize};

/// Which judging of a braked engine `/status` answers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BrakeGate {
    /// The held judging (the agent's rules that make an engine abnormal in observe): the
    /// reference's answers.
    #[default]
    Held,
    /// The configured judging: an agent rule's verdict the brake let through.
    Acting,
}

/// The fleet brake for one engine (`/status/detail`'s `brake`; `null` with the brake off).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BrakeRecord {
    pub gate: BrakeGate,
    /// The fleet's brake was engaged at the last look (a consult or a refresh).
    pub engaged: bool,
    /// The last look in words: the fleet's figures, or why there was none.
    pub reason: String,
    /// Agent-rule verdicts held because the brake was engaged, or the API could not say.
    pub holds: u64,
    /// Agent-rule verdicts the brake let through.
    pub acted: u64,
    /// When the shared state was last read (Unix milliseconds); `null` until it is.
    pub last_seen_unix_ms: Option<u64>,
    /// The last failed look; `null` once one succeeds again.
    pub last_error: Option<String>,
}
