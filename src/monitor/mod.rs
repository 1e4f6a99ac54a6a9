//! One monitored engine: what the agent knows of it, and the verdict `/status` serves.
//!
//! The verdict is computed from atomics, so `/status` never waits on the engine: a background
//! task probes `/health` every `health_period` (the reference probes inside every `/status`
//! request, so a `/health` that takes 30 s under load makes Node Manager's 5 s poll time out).
//! The first healthy `/status` starts virtual inference (one-shot, as the reference); so does
//! the first healthy `/readyz` or `/livez`, or the Kubernetes API mode's first look, where
//! the kubelet or the API mode polls the agent instead of Node Manager.
//!
//! Re-arm (not in the reference, which dies with its engine): after virtual inference went
//! `abnormal`, once `/health` cannot be reached at all (connection refused: the engine process
//! is gone) and then answers again — the engine restarted — virtual inference goes back to its
//! initial state and the next healthy `/status` starts a new warm-up. While the engine is down
//! `/status` stays `abnormal` (it answered before), so a crashed engine that never comes back
//! is still reported.
//!
//! QoS ([`crate::qos`]): a background task scrapes the engine's `/metrics` and evaluates the
//! score and level; `/status` is unchanged by it unless `qos.eviction` is on, in which case
//! a held `evict` level answers `abnormal` too.
//!
//! The parts: [`evidence`] (one file per source of evidence: its loop, its reading, its rules;
//! the one verdict and the loops the monitor spawns), [`account`] and [`verdict`] (the
//! accounting and the verdict's words, as plain functions), [`vi_state`] (virtual inference's
//! shared state), [`inputs`] (what the loops read besides the probe), [`gates`] (the
//! conditions for virtual inference to run), [`episodes`] (the restart-loop memory: the
//! `abnormal` episodes of the last day, and the escalation they make), [`shadow`] (the records
//! of the rules' modes and of the shadow policy), [`brake`] (the fleet brake's hold: which of
//! the two judgings answers).

pub(crate) mod account;
pub(crate) mod acted;
pub(crate) mod brake;
pub(crate) mod episodes;
pub mod evidence;
pub(crate) mod gates;
pub(crate) mod inputs;
pub(crate) mod journal;
pub(crate) mod saved;
pub(crate) mod shadow;
pub(crate) mod snapshot;
pub(crate) mod verdict;
pub(crate) mod vi_state;

use crate::config::EngineSpec;
use crate::qos::QosState;
use gates::Condition;

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use tokio::sync::Notify;
use verdict::HealthState;
pub(crate) use verdict::Status;
use vi_state::{Phase, ViState};

pub(crate) use npu_health_wire::HealthDetail;

/// `/health` as last seen: what `/status/detail` sends ([`HealthDetail`]), and beside it the
/// monotonic instants the agent policy's rules read, which the wire does not carry.
#[derive(Debug, Clone, Default)]
pub(crate) struct HealthSeen {
    pub detail: HealthDetail,
    /// Since when `/health` fails without a healthy answer (the agent policy's grace).
    pub failing_since: Option<tokio::time::Instant>,
    /// When `/health` last failed, excused or not (the agent policy does not count a probe
    /// failure that `/health` failed beside).
    pub last_failure_at: Option<tokio::time::Instant>,
}

/// Shared state of one engine.
#[derive(Debug)]
pub struct Monitor {
    spec: EngineSpec,
    /// Ring indices of the engine's NPUs.
    devices: Vec<u16>,
    /// [`HealthState`] as a `u8`, read by every `/status`.
    health: AtomicU8,
    /// The same as the shadow judges it (its rules 1 and 2 may differ); read by the observer.
    shadow_health: AtomicU8,
    health_detail: Mutex<HealthSeen>,
    /// The one-shot start latch of the reference's `/status`.
    started: AtomicBool,
    start: Notify,
    /// `/health` could not be reached after virtual inference went abnormal (restart detection).
    down_after_abnormal: AtomicBool,
    /// Bumped at every re-arm; a loop still running from before stops.
    rearm_tx: tokio::sync::watch::Sender<u64>,
    vi: ViState,
    qos: QosState,
    conditions: Mutex<Vec<Condition>>,
    rearms: AtomicU64,
    /// What the Kubernetes API mode did about the engine, and what each router was told.
    acted: acted::ActionMemory,
    /// Every action for every integration, and when ([`journal`]): `/status/detail`'s
    /// `actions`, and the operator views.
    journal: journal::Journal,
    /// The engine process's start time as its `/metrics` last showed it (Unix seconds): the
    /// identity a saved state is checked against ([`saved`]).
    engine_started_at: Mutex<Option<f64>>,
    /// The engine's process seen stopped at every sample since: its pid, its CPU ticks then,
    /// and when (the agent policy's stopped-process rule).
    stopped: Mutex<Option<(u32, u64, tokio::time::Instant)>>,
    /// The `abnormal` episodes of the last day: the restart-loop memory ([`episodes`]).
    episodes: episodes::Episodes,
    /// What the evidence bundles of the engine's verdicts came to (`crate::bundles` writes
    /// it; `/status/detail`'s `evidence`).
    evidence: Mutex<npu_health_wire::EvidenceRecord>,
    /// The rules' firings and the shadow's turns and disagreements ([`shadow`]).
    records: shadow::Records,
    /// The fleet brake's gate on the engine and its record ([`brake`]).
    hold: brake::Hold,
}

impl Monitor {
    /// A fresh engine: `/health` never answered, virtual inference not started.
    pub(crate) fn new(spec: EngineSpec, devices: Vec<u16>) -> Monitor {
        let conditions = gates::static_conditions(&spec);
        let vi = ViState::new(spec.timing.interval);
        let qos = QosState::new(&spec.qos);
        Monitor {
            spec,
            devices,
            health: AtomicU8::new(HealthState::NeverAnswered.to_u8()),
            shadow_health: AtomicU8::new(HealthState::NeverAnswered.to_u8()),
            health_detail: Mutex::new(HealthSeen::default()),
            started: AtomicBool::new(false),
            start: Notify::new(),
            down_after_abnormal: AtomicBool::new(false),
            rearm_tx: tokio::sync::watch::Sender::new(0),
            vi,
            qos,
            conditions: Mutex::new(conditions),
            rearms: AtomicU64::new(0),
            acted: acted::ActionMemory::default(),
            journal: journal::Journal::default(),
            engine_started_at: Mutex::new(None),
            stopped: Mutex::new(None),
            episodes: episodes::Episodes::default(),
            evidence: Mutex::default(),
            records: shadow::Records::default(),
            hold: brake::Hold::default(),
        }
    }

    /// The engine's configuration.
    pub(crate) fn spec(&self) -> &EngineSpec {
        &self.spec
    }

    /// Ring indices of the engine's NPUs.
    pub(crate) fn devices(&self) -> &[u16] {
        &self.devices
    }

    /// Virtual inference's shared state (atomics: what `/status` reads on its hot path).
    pub(crate) fn vi(&self) -> &ViState {
        &self.vi
    }

    /// The QoS state (the level is an atomic: `/status` reads it without a lock).
    pub(crate) fn qos(&self) -> &QosState {
        &self.qos
    }

    /// What the Kubernetes API mode did about the engine, and what each router was told.
    pub(crate) fn acted(&self) -> &acted::ActionMemory {
        &self.acted
    }

    /// Every action for every integration: the record [`Monitor::note`] writes.
    pub(crate) fn journal(&self) -> &journal::Journal {
        &self.journal
    }

    /// What the evidence bundles came to, as `/status/detail` shows it.
    pub(crate) fn evidence(&self) -> npu_health_wire::EvidenceRecord {
        self.evidence
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Changes the evidence record under its lock (the bundle writer's outcome).
    pub(crate) fn note_evidence(&self, f: impl FnOnce(&mut npu_health_wire::EvidenceRecord)) {
        f(&mut self.evidence.lock().unwrap_or_else(|p| p.into_inner()));
    }

    /// The journal in words, oldest first: `/status/detail`'s `actions` and the views.
    pub(crate) fn actions(&self) -> Vec<journal::ActionRecord> {
        self.journal.entries().iter().map(Into::into).collect()
    }

    /// Adds what an integration was told (and what it was told before) to the record, with
    /// the level now.
    pub(crate) fn note(&self, told: journal::Told, before: Option<journal::Told>, reason: &str) {
        self.journal.push(journal::Entry {
            at_unix_ms: crate::clock::unix_ms(),
            told,
            before,
            level: self.qos.level(),
            reason: reason.to_owned(),
        });
    }

    /// Notes what a router polling the agent was told: in the router's state
    /// ([`acted::ActionMemory::router_saw`]), and in the record when it changed.
    pub(crate) fn told_router(&self, told: journal::Told, reason: &str) {
        if let Some(before) = self.acted.router_saw(told, reason) {
            tracing::info!(
                engine = %self.spec.name,
                "{} now reads {}: {reason}",
                told.integration().as_str(),
                told.word()
            );
            self.note(told, before, reason);
        }
    }

    /// The enabling conditions as last evaluated.
    pub(crate) fn conditions(&self) -> Vec<Condition> {
        self.conditions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// How many times virtual inference was re-armed after an engine restart.
    fn rearms(&self) -> u64 {
        self.rearms.load(Ordering::Relaxed)
    }

    fn set_condition(&self, c: Condition) {
        let mut all = self.conditions.lock().unwrap_or_else(|p| p.into_inner());
        match all.iter_mut().find(|x| x.name == c.name) {
            Some(slot) => *slot = c,
            None => all.push(c),
        }
    }

    /// Evaluates the start gates now (the configuration's and AI Cube readability of `cube`)
    /// and returns every condition; `doctor` reads them the same way.
    pub(crate) fn evaluate_gates(&self, cube: &[(u32, crate::driver::Backend)]) -> Vec<Condition> {
        // Evaluated now, as the reference does at start (the agent's own environment may
        // have changed since the configuration was read).
        for c in gates::static_conditions(&self.spec) {
            self.set_condition(c);
        }
        self.set_condition(gates::cube_condition(cube));
        self.conditions()
    }

    /// Evaluates the start gates when the first healthy `/status` arrives; true if virtual
    /// inference may run. `cube` lists (logic id, backend) of the engine's NPUs.
    pub(crate) fn decide_start(&self, cube: &[(u32, crate::driver::Backend)]) -> bool {
        let conditions = self.evaluate_gates(cube);
        let blocking: Vec<&Condition> = conditions
            .iter()
            .filter(|c| c.name != "health" && c.ok == Some(false))
            .collect();
        if let Some(first) = blocking.first() {
            tracing::warn!(engine = %self.spec.name, condition = first.name.as_ref(), "virtual inference does not run: {}", first.note);
            self.vi.set_phase(Phase::Disabled);
            return false;
        }
        true
    }
}

#[cfg(test)]
mod tests;
