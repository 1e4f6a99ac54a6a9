//! What the agent did about an engine through the integrations that keep a memory: the
//! Kubernetes API mode's record (the readiness-gate condition, evictions; its shape is
//! [`crate::integrations::kubernetes::told`]) and what each router that polls the agent was
//! last told (typed, [`Told`]). Kept beside the verdict so `/status/detail` shows each
//! attempt and its outcome, and in the state file so a restart keeps it; nothing here feeds
//! the verdict.

use super::journal::{Integration, Told};
use crate::clock::unix_ms;
use crate::integrations::kubernetes::told::{GateMemory, KubeRecord};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Mutex;

/// What a router that polls the agent was last told about an engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seen {
    /// The state it was told.
    pub told: Told,
    /// Since when it is told that state.
    pub since_unix_ms: u64,
    pub last_poll_unix_ms: u64,
    /// Polls answered since the agent started.
    pub polls: u64,
}

/// [`Seen`] in words, as `/status/detail`'s `routers` shows it.
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

/// The record behind a lock (`None` while the mode is off), the eviction gate's memory, and
/// the routers' states (with the last answer's reason).
#[derive(Debug, Default)]
pub struct ActionMemory {
    record: Mutex<Option<KubeRecord>>,
    gate: Mutex<Option<GateMemory>>,
    routers: Mutex<BTreeMap<Integration, (Seen, String)>>,
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

    /// Notes an answer to a router's poll (`told` names the router); when the state changed,
    /// `Some` of the state before (`None` at the first poll).
    pub fn router_saw(&self, told: Told, reason: &str) -> Option<Option<Told>> {
        let now = unix_ms();
        let mut g = self.routers.lock().unwrap_or_else(|p| p.into_inner());
        let (seen, why) = g.entry(told.integration()).or_insert_with(|| {
            let first = Seen {
                told,
                since_unix_ms: now,
                last_poll_unix_ms: now,
                polls: 0,
            };
            (first, String::new())
        });
        let changed = if seen.polls == 0 {
            Some(None)
        } else if seen.told != told {
            Some(Some(std::mem::replace(&mut seen.told, told)))
        } else {
            None
        };
        if changed.is_some() {
            seen.since_unix_ms = now;
        }
        seen.last_poll_unix_ms = now;
        seen.polls += 1;
        if why != reason {
            reason.clone_into(why);
        }
        changed
    }

    /// What each router was last told, typed, by router.
    pub fn routers_told(&self) -> BTreeMap<Integration, Seen> {
        self.routers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(i, (s, _))| (*i, *s))
            .collect()
    }

    /// What each router was last told, in words, by router.
    pub fn routers(&self) -> BTreeMap<String, RouterSeen> {
        self.routers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(i, (s, why))| {
                let seen = RouterSeen {
                    state: s.told.word().to_owned(),
                    since_unix_ms: s.since_unix_ms,
                    last_poll_unix_ms: s.last_poll_unix_ms,
                    polls: s.polls,
                    reason: why.clone(),
                };
                (i.as_str().to_owned(), seen)
            })
            .collect()
    }

    /// Takes back a saved record and gate memory (an agent restart).
    pub fn restore(&self, record: Option<KubeRecord>, gate: Option<GateMemory>) {
        *self.record.lock().unwrap_or_else(|p| p.into_inner()) = record;
        *self.gate.lock().unwrap_or_else(|p| p.into_inner()) = gate;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::integrations::haproxy::config::HaproxyState;

    #[test]
    fn a_router_state_change_is_noted_once() {
        let a = ActionMemory::default();
        let told = |s| Told::Haproxy(s);
        assert_eq!(
            a.router_saw(told(HaproxyState::Ready), "normal"),
            Some(None)
        );
        assert_eq!(
            a.router_saw(told(HaproxyState::Ready), "normal (score 0.9)"),
            None
        );
        assert_eq!(
            a.router_saw(told(HaproxyState::Drain), "degrade"),
            Some(Some(told(HaproxyState::Ready)))
        );
        let r = a.routers();
        assert_eq!(r["haproxy"].polls, 3);
        assert_eq!(r["haproxy"].state, "drain");
        assert_eq!(r["haproxy"].reason, "degrade");
        assert_eq!(
            a.routers_told()[&Integration::Haproxy].told,
            told(HaproxyState::Drain)
        );
    }
}
