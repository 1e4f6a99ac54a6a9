//! `[engine.actions]`: what the degradation levels and the verdict do through the kubelet's
//! probes and the Kubernetes API (the rules are in [`crate::actions`]).

use super::kubernetes::PodSelector;
use serde::{Deserialize, Serialize};

/// An engine's action settings as read: `[engine.actions]` and `[engine.kubernetes]`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EngineActions {
    pub actions: ActionsConfig,
    pub pod: PodSelector,
}

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

/// `[engine.actions]`, a key left out keeps its default.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ActionsConfig {
    /// What makes `/readyz` answer 503 and the readiness gate `False`. Default `degrade`,
    /// `evict` and `abnormal`; `throttle` is opt-in. A level listed covers the worse ones
    /// (`throttle` also fails at `degrade` and `evict`). An engine whose `/health` never
    /// answered is never ready, whatever the list.
    pub not_ready_on: Vec<NotReadyOn>,
}

impl Default for ActionsConfig {
    fn default() -> Self {
        ActionsConfig {
            not_ready_on: vec![NotReadyOn::Degrade, NotReadyOn::Evict, NotReadyOn::Abnormal],
        }
    }
}

impl ActionsConfig {
    /// Checks the list; `Err((key, message))`.
    pub fn validate(&self) -> Result<(), (String, String)> {
        let mut seen = self.not_ready_on.clone();
        seen.sort();
        if let Some(w) = seen.windows(2).find(|w| w[0] == w[1]) {
            return Err((
                "not_ready_on".to_owned(),
                format!("`{}` is listed twice", w[0].as_str()),
            ));
        }
        Ok(())
    }

    /// Whether `on` is in the list.
    pub fn fails_on(&self, on: NotReadyOn) -> bool {
        self.not_ready_on.contains(&on)
    }
}
