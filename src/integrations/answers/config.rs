//! The readiness rule's table: `[engine.actions] not_ready_on`, the states of the engine that
//! make `/readyz` fail (and the readiness gate `False`). Data only: the configuration
//! ([`crate::config::actions`]) reads it, the rule is [`super::readiness`].

use serde::{Deserialize, Serialize};

/// A state of the engine that makes `/readyz` fail (and the readiness gate `False`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NotReadyOn {
    /// QoS level `throttle` or worse. Opt-in: one load spike can bring every replica to
    /// `throttle` at once, and a pool that takes them all out serves nobody.
    Throttle,
    /// QoS level `degrade` or worse (the seed: move traffic to a smaller draft model).
    Degrade,
    /// QoS level `evict` (held).
    Evict,
    /// The verdict `/status` serves is `abnormal`.
    Abnormal,
}

impl NotReadyOn {
    /// As written in the file.
    pub fn as_str(self) -> &'static str {
        match self {
            NotReadyOn::Throttle => "throttle",
            NotReadyOn::Degrade => "degrade",
            NotReadyOn::Evict => "evict",
            NotReadyOn::Abnormal => "abnormal",
        }
    }
}
