//! The readiness rule's table: `[engine.actions] not_ready_on`, the states of the engine that
//! make `/readyz` fail (and the readiness gate `False`). Data only: the configuration reads
//! it through the seam ([`TABLE`]), the rule is [`super::readiness`].

use crate::config::tables::{ConfigTable, Table};
use crate::config::{EngineSpec, KeyError};
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::sync::LazyLock;

/// `[engine.actions] not_ready_on`, as the configuration reads it.
pub(crate) static TABLE: ConfigTable<NotReadyList> = ConfigTable::engine("actions.not_ready_on");

/// A state of the engine that makes `/readyz` fail (and the readiness gate `False`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum NotReadyOn {
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
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            NotReadyOn::Throttle => "throttle",
            NotReadyOn::Degrade => "degrade",
            NotReadyOn::Evict => "evict",
            NotReadyOn::Abnormal => "abnormal",
        }
    }
}

/// `[engine.actions] not_ready_on`: what makes `/readyz` answer 503 and the readiness gate
/// `False`. Default `degrade`, `evict` and `abnormal`; `throttle` is opt-in. A level listed
/// covers the worse ones (`throttle` also fails at `degrade` and `evict`). An engine whose
/// `/health` never answered is never ready, whatever the list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub(crate) struct NotReadyList(pub Vec<NotReadyOn>);

impl Default for NotReadyList {
    fn default() -> Self {
        NotReadyList(vec![
            NotReadyOn::Degrade,
            NotReadyOn::Evict,
            NotReadyOn::Abnormal,
        ])
    }
}

impl NotReadyList {
    /// Whether `on` is in the list.
    pub(crate) fn fails_on(&self, on: NotReadyOn) -> bool {
        self.0.contains(&on)
    }

    /// The list of the engine `spec`.
    pub(crate) fn of(spec: &EngineSpec) -> &NotReadyList {
        static DEFAULT: LazyLock<NotReadyList> = LazyLock::new(NotReadyList::default);
        spec.tables.get::<NotReadyList>().unwrap_or(&DEFAULT)
    }
}

impl Table for NotReadyList {
    fn check(&mut self, _base: &Path) -> Result<(), KeyError> {
        let mut seen = self.0.clone();
        seen.sort();
        if let Some(w) = seen.windows(2).find(|w| w[0] == w[1]) {
            return Err((
                String::new(),
                format!("`{}` is listed twice", w[0].as_str()),
            ));
        }
        Ok(())
    }
}
