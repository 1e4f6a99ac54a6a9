//! Virtual inference's phase, as `/status/detail` and `/events` show it.

use serde::{Deserialize, Serialize};

/// What the loop is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Waiting for the first `/status` with a healthy engine.
    NotStarted,
    /// Disabled by a gate (see the conditions).
    Disabled,
    WarmingUp,
    Running,
    /// Stopped after `abnormal` (or shut down).
    Stopped,
}

impl Phase {
    /// As `/status/detail` shows it.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::NotStarted => "not_started",
            Phase::Disabled => "disabled",
            Phase::WarmingUp => "warming_up",
            Phase::Running => "running",
            Phase::Stopped => "stopped",
        }
    }
}
