//! What changed for an engine, and when: the verdict, the QoS level, readiness and liveness
//! (the last [`KEPT`]), for the operator views (the admin page, `top`). Filled by
//! [`crate::actions::observe`]; nothing here feeds a decision.

use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::sync::Mutex;

/// Changes kept per engine.
pub const KEPT: usize = 50;

/// What changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Change {
    /// The verdict `/status` serves.
    Verdict,
    /// The QoS level.
    Level,
    /// What `/readyz` answers (`ready`, `not_ready`).
    Readiness,
    /// What `/livez` answers (`live`, `restart`).
    Liveness,
}

/// One change.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    pub at_unix_ms: u64,
    pub change: Change,
    pub from: String,
    pub to: String,
    /// Why, in one line (the verdict's reason, the score, the probe's reason).
    pub reason: String,
}

/// The last changes of one engine, oldest first.
#[derive(Debug, Default)]
pub struct Journal(Mutex<VecDeque<Entry>>);

impl Journal {
    /// Adds a change, dropping the oldest beyond [`KEPT`].
    pub fn push(&self, e: Entry) {
        let mut g = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if g.len() == KEPT {
            g.pop_front();
        }
        g.push_back(e);
    }

    /// A copy, oldest first.
    pub fn entries(&self) -> Vec<Entry> {
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
            j.push(Entry {
                at_unix_ms: i,
                change: Change::Level,
                from: "normal".into(),
                to: "throttle".into(),
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
